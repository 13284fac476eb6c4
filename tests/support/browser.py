"""The app in a real browser: `streamlit run app.py` on a free localhost port, driven in headless Chromium (Debian's
/usr/bin/chromium + chromedriver, via Selenium) as a user would, for the browser tests (tests/test_browser.py) and
the click bench (bench/app_clicks.py).

Besides the user's moves (open, navigate, pick, type, click), two measurements: `timed_click` (from the action until
the script run it started has finished and the browser painted the result, read from Streamlit's own run state) and
`cut_tables` (every table whose columns do not fit its width or the window). Selenium is a dev dependency, imported
only when a browser is driven.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from workbench import REPO_ROOT

CHROMIUM = Path("/usr/bin/chromium")
APP = REPO_ROOT / "app.py"


# ----------------------------------------------------------------------------------------------- server and browser

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def driver_path() -> str | None:
    """chromedriver, where Debian (or PATH) has it; None when absent."""
    for p in ("/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver", shutil.which("chromedriver") or ""):
        if p and Path(p).is_file():
            return p
    return None


def missing_browser() -> str | None:
    """Why no browser can be driven here (for a skip: Chromium is a system package, outside the project; .ci/run and
    docs/running.md say so), or None. Selenium is a dev dependency: without it the browser tests fail."""
    if not CHROMIUM.is_file():
        return f"{CHROMIUM} is absent (apt-get install -y chromium chromium-driver, as .ci/run does)"
    if driver_path() is None:
        return "chromedriver is absent (apt-get install -y chromium-driver, as .ci/run does)"
    return None


def healthy(url: str, proc, timeout: float) -> bool:
    """Whether the streamlit server at `url` answers its health check within `timeout` s (False as soon as its
    process `proc` has ended)."""
    deadline = time.time() + timeout
    while True:
        try:
            if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).status == 200:
                return True
        except OSError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            return False
        time.sleep(0.5)


def stop(proc, grace: float = 10) -> None:
    """End a server: SIGTERM, and SIGKILL if it is still there after `grace` s."""
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def app_server(env: dict, log_path: Path, timeout: float = 60, script: Path = APP):
    """`streamlit run app.py` (or another script) with these extra environment variables, its output in log_path;
    yields (base URL, the process). RuntimeError with the log's tail when it does not answer its health check in
    `timeout` s."""
    port = free_port()
    env = dict(os.environ, STREAMLIT_BROWSER_GATHER_USAGE_STATS="false", **env)
    log = open(log_path, "w+")
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(script), "--server.headless", "true",
                             "--server.port", str(port), "--server.address", "127.0.0.1",
                             "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"],
                            cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        if not healthy(url, proc, timeout):
            log.seek(0)
            raise RuntimeError(f"streamlit did not start:\n{log.read()[-3000:]}")
        yield url, proc
    finally:
        stop(proc)
        log.close()


def chromium(profile: Path, downloads: Path | None = None, width: int = 1280, height: int = 1000):
    """Headless Chromium under Selenium, offline (Selenium Manager never downloads anything), downloads into
    `downloads`."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-quic",
                "--no-first-run", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                f"--window-size={width},{height}", f"--user-data-dir={profile}"):
        opts.add_argument(arg)
    if downloads is not None:
        opts.add_experimental_option("prefs", {"download.default_directory": str(downloads),
                                               "download.prompt_for_download": False})
    old = os.environ.get("SE_OFFLINE")
    os.environ["SE_OFFLINE"] = "true"  # never let Selenium Manager try to download a driver or browser
    try:
        driver = webdriver.Chrome(options=opts, service=Service(driver_path()))
    finally:
        if old is None:
            os.environ.pop("SE_OFFLINE", None)
        else:
            os.environ["SE_OFFLINE"] = old
    if downloads is not None:
        driver.execute_cdp_cmd("Page.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
    driver.set_page_load_timeout(60)
    return driver


# ----------------------------------------------------------------------------------------------- waiting and reading

def wait(driver, predicate, timeout: float = 90, what: str = "", every: float = 0.5):
    """predicate() once truthy; an element that a rerun redrew under it (stale) or has not drawn yet counts as not
    yet."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            value = predicate()
        except (StaleElementReferenceException, NoSuchElementException, AssertionError, StopIteration):
            value = None
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def settled(driver, timeout: float = 120) -> None:
    """Wait until the script run has finished (no "Running... / Stop" status) and the page stopped changing."""
    from selenium.webdriver.common.by import By

    seen: dict = {}

    def done():
        status = " ".join(e.text for e in driver.find_elements(By.CSS_SELECTOR, '[data-testid="stStatusWidget"]'))
        snapshot = driver.find_element(By.TAG_NAME, "body").text
        idle = "Running" not in status and "Stop" not in status
        if idle and snapshot == seen.get("text"):
            return True
        seen["text"] = snapshot
        return False

    wait(driver, done, timeout, what="the script run to finish", every=1.5)


def body(driver) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.TAG_NAME, "body").text


def alerts(driver, kind: str = "Warning") -> list[str]:
    """The text of every alert box of this kind (Warning, Error, Info) on the page."""
    from selenium.webdriver.common.by import By

    out = []
    for e in driver.find_elements(By.CSS_SELECTOR, f'[data-testid="stAlertContent{kind}"]'):
        text = e.find_elements(By.CSS_SELECTOR, '[data-testid="stMarkdownContainer"]')  # without the icon
        out.append(text[0].text if text else e.text)
    return out


def errors(driver) -> list[str]:
    """Exception boxes and st.error texts on the page."""
    from selenium.webdriver.common.by import By

    return [e.text for e in driver.find_elements(By.CSS_SELECTOR, '[data-testid="stException"]')] + \
        alerts(driver, "Error")


# ----------------------------------------------------------------------------------------------- the user's moves

def heading_is(driver, heading: str) -> bool:
    from selenium.webdriver.common.by import By

    return any(h.text.strip() == heading for h in driver.find_elements(By.TAG_NAME, "h1"))


def open_page(driver, url: str, heading: str) -> None:
    driver.get(url)
    wait(driver, lambda: heading_is(driver, heading), what=f"heading {heading!r}")
    settled(driver)


def nav_link(driver, title: str):
    """The sidebar's link to a page (in-app navigation keeps the session state)."""
    from selenium.webdriver.common.by import By

    return next(a for a in driver.find_elements(By.CSS_SELECTOR, '[data-testid="stSidebarNav"] a') if a.text == title)


def nav(driver, title: str) -> None:
    nav_link(driver, title).click()
    wait(driver, lambda: heading_is(driver, title), what=f"the page {title}")
    settled(driver)


def select(driver, label: str):
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, f'input[role="combobox"][aria-label="{label}"]')


def pick_option(driver, label: str, option: str) -> None:
    """Open the selectbox labelled `label` and click `option` (no waiting for the run it starts). A rerun that
    redraws the box while it opens closes its list: then it is opened again (seen on a loaded 2-core runner)."""
    from selenium.webdriver.common.by import By

    def open_box() -> None:
        box = select(driver, label)
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", box)
        box.click()

    def found():
        hits = [o for o in driver.find_elements(By.CSS_SELECTOR, '[role="option"]') if o.text == option]
        if not hits and not driver.find_elements(By.CSS_SELECTOR, '[role="listbox"]'):
            open_box()
        return hits

    open_box()
    wait(driver, found, what=f"option {option!r}", timeout=60, every=0.1)[0].click()


def choose(driver, label: str, option: str) -> None:
    """Pick `option` in the selectbox labelled `label` and wait for the page."""
    pick_option(driver, label, option)
    wait(driver, lambda: select(driver, label).get_attribute("value") == option, what=f"{label} = {option}",
         timeout=30)
    settled(driver)


def options(driver, label: str) -> list[str]:
    """The options of a selectbox as shown (opens and closes its list)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    box = select(driver, label)
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", box)
    box.click()
    found = wait(driver, lambda: [o.text for o in driver.find_elements(By.CSS_SELECTOR, '[role="option"]')],
                 what=f"the options of {label}", timeout=20)
    box.send_keys(Keys.ESCAPE)
    time.sleep(0.5)
    return found


def type_text(driver, label: str, text: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    box = driver.find_element(By.CSS_SELECTOR, f'input[aria-label="{label}"]')
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", box)
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(Keys.BACKSPACE)
    box.send_keys(text + Keys.ENTER)
    wait(driver, lambda: box.get_attribute("value") == text, what=f"{label} to take {text!r}")
    settled(driver)


def button(driver, text: str):
    from selenium.webdriver.common.by import By

    return next(b for b in driver.find_elements(By.TAG_NAME, "button") if b.text == text)


def radio(driver, text: str) -> None:
    """Click the radio option labelled `text`."""
    from selenium.webdriver.common.by import By

    next(o for o in driver.find_elements(By.CSS_SELECTOR, '[data-testid="stRadioOption"]') if o.text == text).click()


def click_button(driver, text: str) -> None:
    b = button(driver, text)
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", b)
    b.click()
    settled(driver)


def expand(driver, starts: str) -> None:
    from selenium.webdriver.common.by import By

    summary = next(e for e in driver.find_elements(By.CSS_SELECTOR, '[data-testid="stExpander"] summary')
                   if starts in e.text)  # the text may begin with the arrow icon's name
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", summary)
    summary.click()
    time.sleep(0.5)


def expand_all(driver) -> int:
    """Open every closed expander on the page (no rerun: an expander is drawn in the browser); how many were."""
    n = driver.execute_script(
        "const closed = Array.from(document.querySelectorAll('[data-testid=\"stExpander\"] details:not([open])'));"
        "closed.forEach(d => d.querySelector('summary').click()); return closed.length;")
    time.sleep(1.0 if n else 0)
    return int(n)


def tab_labels(driver) -> list[str]:
    """The labels of the page's tabs, in order ([] on a page without tabs)."""
    from selenium.webdriver.common.by import By

    return [t.text.strip() for t in driver.find_elements(By.CSS_SELECTOR, '[data-testid="stTab"]')]


def open_tab(driver, label: str) -> None:
    """Click the tab with this label and wait for the run it sets off (a tab that reruns draws only when open)."""
    from selenium.webdriver.common.by import By

    tab = next(t for t in driver.find_elements(By.CSS_SELECTOR, '[data-testid="stTab"]') if t.text.strip() == label)
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", tab)
    tab.click()
    wait(driver, lambda: tab.get_attribute("aria-selected") == "true", timeout=30, what=f"tab {label} selected",
         every=0.1)
    settled(driver)


def metric(driver, label: str) -> str:
    from selenium.webdriver.common.by import By

    for m in driver.find_elements(By.CSS_SELECTOR, '[data-testid="stMetric"]'):
        if m.find_element(By.CSS_SELECTOR, '[data-testid="stMetricLabel"]').text.strip() == label:
            return m.find_element(By.CSS_SELECTOR, '[data-testid="stMetricValue"]').text.strip()
    raise AssertionError(f"no metric {label!r}")


def range_input(driver, label: str):
    """The slider's range input (value, min, max, disabled)."""
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, f'input[type="range"][aria-label="{label}"]')


def slide(driver, label: str, *keys) -> None:
    """Focus a slider and press keys (Home, End, arrows), as a keyboard user would."""
    from selenium.webdriver.common.action_chains import ActionChains

    box = range_input(driver, label)
    thumb = box.find_element("xpath", "../..")
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", thumb)
    ActionChains(driver).click(thumb).send_keys(*keys).perform()


def chart_points(driver, index: int):
    """The selectable points (SVG paths) of the index-th plotly chart on the page."""
    from selenium.webdriver.common.by import By

    charts = wait(driver, lambda: driver.find_elements(By.CSS_SELECTOR, '[data-testid="stPlotlyChart"]')[index:],
                  what=f"plotly chart {index}")
    return charts[0].find_elements(By.CSS_SELECTOR, ".scatterlayer .trace .points path.point")


def chart_index(driver, title_part: str) -> int:
    """Which plotly chart on the page is the one whose title (written above it) has this text."""
    return driver.execute_script(
        "const charts = Array.from(document.querySelectorAll('[data-testid=\"stPlotlyChart\"]'));"
        "return charts.findIndex(c => { let e = c; while (e && !e.previousElementSibling) e = e.parentElement;"
        "  for (let p = e && e.previousElementSibling, n = 0; p && n < 3; p = p.previousElementSibling, n++)"
        "    if (p.textContent.includes(arguments[0])) return true; return false; });", title_part)


def chart_point(driver, chart: int, i: int, click: bool) -> None:
    """Hover (and click) point i of a plotly chart, finding it again if a rerun redrew the chart meanwhile."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.action_chains import ActionChains

    for attempt in range(5):
        try:
            el = chart_points(driver, chart)[i]
            driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", el)
            chain = ActionChains(driver).move_to_element(el)
            (chain.click() if click else chain).perform()
            return
        except StaleElementReferenceException:
            time.sleep(1.0)
    raise AssertionError(f"point {i} of chart {chart} kept going stale")


# ----------------------------------------------------------------------------------------------- measurements

# Every change of Streamlit's run state (the app root's data-test-script-state: running, notRunning, ...) with its
# time, and two animation frames after each end of a run (the browser has painted what the run sent); and the time
# of the first press (mouse, pointer or key) since the last reset: where the user's click begins.
_WATCH = """
if (!window.__runs) {
  window.__runs = [];
  window.__press = null;
  for (const kind of ['pointerdown', 'mousedown', 'keydown'])
    document.addEventListener(kind, () => { if (window.__press === null) window.__press = performance.now(); }, true);
  const app = document.querySelector('[data-testid="stApp"]');
  const note = () => {
    const state = app.getAttribute('data-test-script-state');
    window.__runs.push({state: state, t: performance.now()});
    if (state === 'notRunning')
      requestAnimationFrame(() => requestAnimationFrame(() =>
        window.__runs.push({state: 'painted', t: performance.now()})));
  };
  new MutationObserver(note).observe(app, {attributes: true, attributeFilter: ['data-test-script-state']});
}
return performance.now();
"""


def timed_click(driver, action, quiet: float = 0.6, timeout: float = 180) -> dict:
    """Run `action()` (a click, a pick, keys) and time it as the user sees it: from the action's first press (mouse
    or key; Selenium's finding and scrolling to the element before it is not the user's time; just before the
    action when it presses nothing) until the last script run it set off has finished and the browser painted it,
    with no new run for `quiet` s after. {"seconds" (None when no run started), "runs" (script runs seen: a
    fragment rerun counts as one)}."""
    driver.execute_script(_WATCH)
    driver.execute_script("window.__runs.length = 0; window.__press = null;")
    start = driver.execute_script("return performance.now();")
    action()
    start = driver.execute_script("return window.__press;") or start
    deadline = time.time() + timeout
    while time.time() < deadline:
        runs = driver.execute_script("return window.__runs;")
        started = [r for r in runs if r["state"] == "running"]
        ends = [r for r in runs if r["state"] == "painted"]
        now = driver.execute_script("return performance.now();")
        if not started and now - start > 3000:
            return dict(seconds=None, runs=0)  # this action reruns nothing (an expander, a download)
        if started and ends and ends[-1]["t"] > started[-1]["t"] and now - ends[-1]["t"] > quiet * 1000:
            return dict(seconds=(ends[-1]["t"] - start) / 1000, runs=len(started))
        time.sleep(0.02)
    raise AssertionError(f"the script run did not finish within {timeout} s")


def run_state(driver) -> str | None:
    """Streamlit's run state in the browser: initial, running, notRunning, rerunRequested, ..."""
    return driver.execute_script("const a = document.querySelector('[data-testid=\"stApp\"]');"
                                 "return a && a.getAttribute('data-test-script-state');")


def timed_open(driver, url: str, heading: str, timeout: float = 180) -> dict:
    """Open a page by its address and time it: from the request until its first script run has finished and the
    browser painted it. {"seconds", "runs": 1}."""
    start = time.perf_counter()
    driver.get(url)
    deadline = time.time() + timeout
    while time.time() < deadline:
        if run_state(driver) == "notRunning" and heading_is(driver, heading):
            driver.execute_async_script("const done = arguments[0];"
                                        "requestAnimationFrame(() => requestAnimationFrame(() => done()));")
            return dict(seconds=time.perf_counter() - start, runs=1)
        time.sleep(0.02)
    raise AssertionError(f"{url} did not finish its first run within {timeout} s")


def cut_tables(driver) -> list[dict]:
    """Every table on the page (st.dataframe, st.table) drawn in the window whose columns are cut: wider than the
    table (a horizontal scroll bar hides some) or reaching past the window's right edge. Each {"table" (its
    first column names), "hidden_px" (width scrolled out of sight), "outside_px" (past the window)}. Tables in
    closed expanders are not drawn: open them first (expand_all)."""
    return driver.execute_script("""
      const out = [];
      const width = document.documentElement.clientWidth;
      for (const el of document.querySelectorAll('[data-testid="stDataFrame"], [data-testid="stTable"]')) {
        const box = el.getBoundingClientRect();
        if (box.width === 0 || box.height === 0) continue;  // not drawn (a closed expander)
        const scroller = el.querySelector('.dvn-scroller') || el.querySelector('table')?.parentElement || el;
        const hidden = scroller.scrollWidth - scroller.clientWidth;
        const outside = box.right - width;
        if (hidden > 1 || outside > 1) {
          const heads = Array.from(el.querySelectorAll('th')).map(h => h.textContent.trim()).filter(t => t);
          out.push({table: heads.slice(0, 8).join(' | '), hidden_px: Math.round(hidden),
                    outside_px: Math.round(Math.max(outside, 0))});
        }
      }
      return out;""")


def page_overflow(driver) -> int:
    """How many px the page is wider than the window (0: nothing cut off at the side)."""
    return int(driver.execute_script("return document.documentElement.scrollWidth - window.innerWidth"))
