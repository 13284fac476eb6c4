"""End to end in a real browser: `streamlit run app.py` on a free localhost port, driven in headless Chromium
(Debian's /usr/bin/chromium + chromedriver, via Selenium) as a user would: each page opened by its URL, then the
tree designer's interactions (a reference tree picked, a node added, two trees compared, a tree node and a mask
cell clicked, settings kept across a page change) and a live decode with its streamed progress. No exception box;
screenshots under tests/output/browser/."""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from helpers import make_calibration, make_latency, make_sweep

from workbench import REPO_ROOT

CHROMIUM = Path("/usr/bin/chromium")
OUT = REPO_ROOT / "tests" / "output" / "browser"
PAGES = [("", "Tree designer"), ("calibration", "Calibration"), ("tradeoffs", "Trade-offs"),
         ("live", "Live decode")]

pytestmark = pytest.mark.browser


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _driver_path() -> str | None:
    for p in ("/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver", shutil.which("chromedriver") or ""):
        if p and Path(p).is_file():
            return p
    return None


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The app under `streamlit run`, reading a synthetic calibration folder; yields its base URL."""
    root = tmp_path_factory.mktemp("browser_calibration")
    cal = make_calibration(root / "synthetic")
    make_latency(cal / "latency-cpu.csv")
    make_sweep(cal / "sweep.csv")
    port = _free_port()
    env = dict(os.environ, WORKBENCH_CALIBRATION_ROOT=str(root), STREAMLIT_BROWSER_GATHER_USAGE_STATS="false")
    log = open(tmp_path_factory.mktemp("streamlit_log") / "streamlit.log", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(REPO_ROOT / "app.py"),
                             "--server.headless", "true", "--server.port", str(port), "--server.address", "127.0.0.1",
                             "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"],
                            cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            try:
                if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).status == 200:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                log.seek(0)
                pytest.fail(f"streamlit did not start:\n{log.read()[-3000:]}")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if not CHROMIUM.is_file():
        pytest.skip("/usr/bin/chromium is absent (apt-get install -y chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    driver_path = _driver_path()
    if driver_path is None:
        pytest.skip("chromedriver is absent (apt-get install -y chromium-driver)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-quic",
                "--no-first-run", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                "--window-size=1400,2200", f"--user-data-dir={tmp_path_factory.mktemp('chromium_profile')}"):
        opts.add_argument(arg)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SE_OFFLINE", "true")  # never let Selenium Manager try to download a driver or browser
        driver = webdriver.Chrome(options=opts, service=Service(driver_path))
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def _wait(driver, predicate, timeout: float = 90, what: str = "", every: float = 0.5):
    """predicate() once truthy; an element that a rerun redrew under it (stale) counts as not yet."""
    from selenium.common.exceptions import StaleElementReferenceException

    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            value = predicate()
        except StaleElementReferenceException:
            value = None
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def _settled(driver, timeout: float = 90) -> None:
    """Wait until the script run has finished (no "Running... / Stop" status) and the page stopped changing."""
    from selenium.webdriver.common.by import By

    seen: dict = {}

    def settled():
        status = " ".join(e.text for e in driver.find_elements(By.CSS_SELECTOR, '[data-testid="stStatusWidget"]'))
        snapshot = driver.find_element(By.TAG_NAME, "body").text
        idle = "Running" not in status and "Stop" not in status
        if idle and snapshot == seen.get("text"):
            return True
        seen["text"] = snapshot
        return False

    _wait(driver, settled, timeout, what="the script run to finish", every=1.5)


def _body(driver) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.TAG_NAME, "body").text


def _no_errors(driver) -> None:
    from selenium.webdriver.common.by import By

    boxes = driver.find_elements(By.CSS_SELECTOR, '[data-testid="stException"], [data-testid="stAlertContentError"]')
    assert not boxes, boxes[0].text[:2000]


def _open(driver, url: str, heading: str) -> None:
    from selenium.webdriver.common.by import By

    driver.get(url)
    _wait(driver, lambda: any(h.text.strip() == heading for h in driver.find_elements(By.TAG_NAME, "h1")),
          what=f"heading {heading!r}")
    _settled(driver)


def _choose(driver, label: str, option: str) -> None:
    """Pick `option` in the selectbox labelled `label`."""
    from selenium.webdriver.common.by import By

    driver.find_element(By.CSS_SELECTOR, f'input[role="combobox"][aria-label="{label}"]').click()
    _wait(driver, lambda: [o for o in driver.find_elements(By.CSS_SELECTOR, '[role="option"]') if o.text == option],
          what=f"option {option!r}", timeout=20)[0].click()
    _wait(driver, lambda: driver.find_element(By.CSS_SELECTOR, f'input[role="combobox"][aria-label="{label}"]')
          .get_attribute("value") == option, what=f"{label} = {option}", timeout=20)
    _settled(driver)


def _type(driver, label: str, text: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    box = driver.find_element(By.CSS_SELECTOR, f'input[aria-label="{label}"]')
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(text + Keys.ENTER)
    _wait(driver, lambda: box.get_attribute("value") == text, what=f"{label} to take {text!r}")
    _settled(driver)


def _click_button(driver, text: str) -> None:
    from selenium.webdriver.common.by import By

    next(b for b in driver.find_elements(By.TAG_NAME, "button") if b.text == text).click()
    _settled(driver)


def _metric(driver, label: str) -> str:
    from selenium.webdriver.common.by import By

    for m in driver.find_elements(By.CSS_SELECTOR, '[data-testid="stMetric"]'):
        if m.find_element(By.CSS_SELECTOR, '[data-testid="stMetricLabel"]').text.strip() == label:
            return m.find_element(By.CSS_SELECTOR, '[data-testid="stMetricValue"]').text.strip()
    raise AssertionError(f"no metric {label!r}")


def _shot(driver, name: str) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{name}.png"
    driver.save_screenshot(str(path))
    return path


def _chart_points(driver, index: int):
    """The selectable points (SVG paths) of the index-th plotly chart on the page."""
    from selenium.webdriver.common.by import By

    charts = _wait(driver, lambda: driver.find_elements(By.CSS_SELECTOR, '[data-testid="stPlotlyChart"]')[index:],
                   what=f"plotly chart {index}")
    return charts[0].find_elements(By.CSS_SELECTOR, ".scatterlayer .trace .points path.point")


def _point(driver, chart: int, i: int, click: bool) -> None:
    """Hover (and click) point i of a plotly chart, finding it again if a rerun redrew the chart meanwhile."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.action_chains import ActionChains

    for attempt in range(5):
        try:
            el = _chart_points(driver, chart)[i]
            driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", el)
            chain = ActionChains(driver).move_to_element(el)
            (chain.click() if click else chain).perform()
            return
        except StaleElementReferenceException:
            time.sleep(1.0)
    raise AssertionError(f"point {i} of chart {chart} kept going stale")


def _hover_text(driver) -> str:
    return driver.execute_script("return Array.from(document.querySelectorAll('.hoverlayer'))"
                                 ".map(e => e.textContent).join(' ')")


@pytest.mark.parametrize("path,heading", PAGES)
def test_page_renders_in_chromium(server, browser, path, heading):
    from selenium.webdriver.common.by import By

    name = path or "tree"  # the designer is the default page: it lives at /
    _open(browser, f"{server}/{path}", heading)
    if path != "live":  # every other page draws figures from the synthetic calibration
        _wait(browser, lambda: browser.find_elements(By.CSS_SELECTOR, '[data-testid="stImage"] img'),
              what="a figure")
    OUT.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(OUT / f"{name}.png"))
    assert "Page not found" not in browser.find_element(By.TAG_NAME, "body").text
    boxes = browser.find_elements(By.CSS_SELECTOR, '[data-testid="stException"]')
    assert not boxes, boxes[0].text[:2000]
    errors = browser.find_elements(By.CSS_SELECTOR, '[data-testid="stAlertContentError"]')
    assert not errors, errors[0].text[:2000]


def test_live_decode_in_chromium(server, browser, tiny_llama):
    """Type a (tiny random) model and heads into the live page, press the button, see the coloured answer."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    browser.get(f"{server}/live")
    _wait(browser, lambda: any(h.text.strip() == "Live decode" for h in browser.find_elements(By.TAG_NAME, "h1")),
          what="the live page")
    for label, value in (("Model (blank: the demo SmolLM2-135M-Instruct)", tiny_llama.model_dir),
                         ("Heads (blank: the demo heads)", tiny_llama.heads_dirs["2"])):
        box = _wait(browser, lambda: browser.find_elements(By.CSS_SELECTOR, f'input[aria-label="{label}"]'),
                    what=label)[0]
        box.send_keys(str(value) + Keys.ENTER)
        _wait(browser, lambda: box.get_attribute("value") == str(value), what=f"{label} to take the value")
        time.sleep(1.0)
    button = next(b for b in browser.find_elements(By.TAG_NAME, "button") if b.text == "Load model and generate")
    button.click()
    _wait(browser, lambda: browser.find_elements(By.CSS_SELECTOR, 'span[title="step 1"]'), timeout=120,
          what="the coloured answer")
    _wait(browser, lambda: browser.find_elements(By.CSS_SELECTOR, '[data-testid="stImage"] img'), what="figures")
    time.sleep(1.5)
    OUT.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(OUT / "live-decoded.png"))
    assert not browser.find_elements(By.CSS_SELECTOR, '[data-testid="stException"]')
    assert not browser.find_elements(By.CSS_SELECTOR, '[data-testid="stAlertContentError"]')
    body = browser.find_element(By.TAG_NAME, "body").text
    assert "Output equals vanilla greedy" in body
    # the streamed progress, left at its last step: tokens so far / max, steps, tokens per step, tokens/s, ETA
    assert re.search(r"Medusa: \d+/64 tokens in \d+ steps \(\d\.\d\d tokens/step\), [\d.]+ tokens/s", body), body
    assert re.search(r"vanilla greedy: (\d+)/64 tokens in \1 steps \(1\.00 tokens/step\)", body), body
    assert "One prompt is a noisy measurement" in body


def test_reference_tree_edited_and_compared(server, browser):
    """Pick a reference tree for display, add a node (and see a bad one refused in one line), compare it with the
    optimizer's tree."""
    from selenium.webdriver.common.by import By

    _open(browser, server, "Tree designer")
    _choose(browser, "Tree on display (drawn, masked, exported)", "reference: mc_sim_7b_63")
    assert _metric(browser, "nodes") == "63" and "mc_sim_7b_63: 63 nodes, depth 4" in _body(browser)
    next(e for e in browser.find_elements(By.CSS_SELECTOR, '[data-testid="stExpander"] summary')
         if "Edit mc_sim_7b_63" in e.text).click()
    _type(browser, "Add node (0-based ranks, e.g. 0,1)", "1,9")
    _click_button(browser, "add node")
    _wait(browser, lambda: _metric(browser, "nodes") == "64", what="the added node")
    assert "mc_sim_7b_63_edited: 64 nodes" in _body(browser)
    assert "edited from mc_sim_7b_63: added [[1, 9]], removed none" in _body(browser)
    _no_errors(browser)
    _type(browser, "Add node (0-based ranks, e.g. 0,1)", "1,8,0")
    _click_button(browser, "add node")
    err = _wait(browser, lambda: browser.find_elements(By.CSS_SELECTOR, '[data-testid="stAlertContentError"]'),
                what="the refusal")
    assert err[0].text.strip() == "path [1, 8, 0]: parent [1, 8] is missing (every prefix must be a node)"
    _shot(browser, "tree-edited")
    _choose(browser, "Compare with", "the optimizer's (sidebar settings)")
    _wait(browser, lambda: "A = mc_sim_7b_63_edited vs B = optimal_63" in _body(browser), what="the comparison")
    body = _body(browser)
    assert "only in A" in body and "only in B" in body and "shared nodes" in body
    compare = next(h for h in browser.find_elements(By.TAG_NAME, "h3") if h.text.startswith("A = "))
    browser.execute_script("arguments[0].scrollIntoView()", compare)
    _shot(browser, "tree-compare")


def test_tree_node_and_mask_row_are_linked(server, browser):
    """Hover a node: its tooltip names its mask row; click it: the row lights up; click a mask cell: its row's
    node is selected."""
    _open(browser, server, "Tree designer")
    _wait(browser, lambda: len(_chart_points(browser, 0)) == 64, what="the 63-node tree's points")
    _point(browser, 0, 5, click=False)
    hover = _wait(browser, lambda: _hover_text(browser), what="a tooltip", timeout=10)
    row = int(hover.split("mask row ")[1].split("P(")[0].strip())
    _point(browser, 0, 5, click=True)
    _wait(browser, lambda: f"row {row} selected" in browser.page_source, what="the mask row to light up")
    _settled(browser)
    assert f"row {row}:" in browser.find_element("css selector", 'input[aria-label="Selected node (= mask row)"]') \
        .get_attribute("value")
    _shot(browser, "tree-node-selected")
    _point(browser, 1, -1, click=True)  # the mask's allowed cells; the last one is on the last row's diagonal
    _wait(browser, lambda: "row 63 selected" in browser.page_source, what="the clicked mask row")
    _settled(browser)
    assert browser.find_element("css selector", 'input[aria-label="Selected node (= mask row)"]') \
        .get_attribute("value").startswith("row 63:")
    _no_errors(browser)
    _shot(browser, "mask-row-selected")


def test_settings_kept_across_pages(server, browser):
    """Budget 16 and the empirical model survive a trip to the calibration page and back (in-app navigation)."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    _open(browser, server, "Tree designer")
    next(o for o in browser.find_elements(By.CSS_SELECTOR, '[data-testid="stRadioOption"]')
         if o.text == "empirical paths").click()
    _settled(browser)
    thumb = browser.find_element(By.CSS_SELECTOR, '[data-testid="stSlider"] [data-testid="stSliderThumbValue"]')
    ActionChains(browser).click(thumb).send_keys(Keys.HOME).perform()
    _settled(browser)
    ActionChains(browser).send_keys(*[Keys.ARROW_RIGHT] * 15).perform()
    _wait(browser, lambda: _metric(browser, "nodes") == "16", what="a 16-node tree")
    _settled(browser)
    next(a for a in browser.find_elements(By.CSS_SELECTOR, '[data-testid="stSidebarNav"] a')
         if a.text == "Calibration").click()
    _wait(browser, lambda: any(h.text.strip() == "Calibration" for h in browser.find_elements(By.TAG_NAME, "h1")),
          what="the calibration page")
    _settled(browser)
    next(a for a in browser.find_elements(By.CSS_SELECTOR, '[data-testid="stSidebarNav"] a')
         if a.text == "Tree designer").click()
    _wait(browser, lambda: any(h.text.strip() == "Tree designer" for h in browser.find_elements(By.TAG_NAME, "h1")),
          what="the designer again")
    _settled(browser)
    assert _metric(browser, "nodes") == "16"
    assert browser.find_element(By.CSS_SELECTOR, 'input[type="range"][aria-label="Budget (tree nodes)"]') \
        .get_attribute("value") == "16"
    assert "empirical_16: 16 nodes" in _body(browser)
    _no_errors(browser)
    _shot(browser, "tree-settings-kept")
