"""End to end in a real browser: `streamlit run app.py` on a free localhost port, driven in headless Chromium
(Debian's /usr/bin/chromium + chromedriver, via Selenium) as a user would, at 1280 x 1000: every page by its URL
(/ opens the designer at /tree), the recommendation with its evidence on both pages (old sweeps named old, a
current sweep that contradicts the prediction warned about at the top), the budget kept from a longer latency table,
the designer's interactions (reference tree with the optimizer's sliders disabled, node added, comparison drawn as
one tree, engine repair, node and mask clicks with the selection following the node, downloads, a malformed pasted
tree, an upload and settings kept across pages) and a live decode with its progress messages, prediction, and an
error that clears the last result. No exception box; no page wider than the window at 1280 px.

Screenshots at 1600 and 1280 px wide go to tests/output/browser/ (gitignored). The server's own time for node
and mask clicks and downloads (`[workbench-app]` lines, $WORKBENCH_APP_TIMINGS) is printed and written to
tests/output/browser/timings.txt; nothing asserts a time (the machine is shared)."""
from __future__ import annotations

import json
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
from helpers import make_current_sweep, make_walk_files

from workbench import REPO_ROOT

CHROMIUM = Path("/usr/bin/chromium")
OUT = REPO_ROOT / "tests" / "output" / "browser"
WIDTHS = (1600, 1280)
PAGES = [("", "Tree designer"), ("tree", "Tree designer"), ("calibration", "Calibration"),
         ("tradeoffs", "Trade-offs"), ("live", "Live decode")]
OPTIMIZER = "the optimizer's (sidebar settings)"

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
    """The app under `streamlit run`, reading a synthetic calibration folder (a long latency table in it, a short
    batched one with spread beside it, two old sweeps and a current one); yields (base URL, log path)."""
    root = tmp_path_factory.mktemp("browser_calibration")
    make_current_sweep(root, make_walk_files(root, "synthetic"))
    port = _free_port()
    env = dict(os.environ, WORKBENCH_CALIBRATION_ROOT=str(root), WORKBENCH_RESULTS_ROOT=str(root),
               WORKBENCH_APP_TIMINGS="1", STREAMLIT_BROWSER_GATHER_USAGE_STATS="false")
    log_path = tmp_path_factory.mktemp("streamlit_log") / "streamlit.log"
    log = open(log_path, "w+")
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
        yield url, log_path
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture(scope="module")
def downloads(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("downloads")


@pytest.fixture(scope="module")
def browser(tmp_path_factory, downloads):
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
                "--window-size=1280,1000", f"--user-data-dir={tmp_path_factory.mktemp('chromium_profile')}"):
        opts.add_argument(arg)
    opts.add_experimental_option("prefs", {"download.default_directory": str(downloads),
                                           "download.prompt_for_download": False})
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SE_OFFLINE", "true")  # never let Selenium Manager try to download a driver or browser
        driver = webdriver.Chrome(options=opts, service=Service(driver_path))
    driver.execute_cdp_cmd("Page.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


# ----------------------------------------------------------------------------------------------- helpers

def _wait(driver, predicate, timeout: float = 90, what: str = "", every: float = 0.5):
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


def _settled(driver, timeout: float = 120) -> None:
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


def _alerts(driver, kind: str = "Warning") -> list[str]:
    from selenium.webdriver.common.by import By

    out = []
    for e in driver.find_elements(By.CSS_SELECTOR, f'[data-testid="stAlertContent{kind}"]'):
        text = e.find_elements(By.CSS_SELECTOR, '[data-testid="stMarkdownContainer"]')  # without the icon
        out.append(text[0].text if text else e.text)
    return out


def _open(driver, url: str, heading: str) -> None:
    from selenium.webdriver.common.by import By

    driver.get(url)
    _wait(driver, lambda: any(h.text.strip() == heading for h in driver.find_elements(By.TAG_NAME, "h1")),
          what=f"heading {heading!r}")
    _settled(driver)


def _nav(driver, title: str) -> None:
    """In-app navigation (the sidebar's page links): session state stays."""
    from selenium.webdriver.common.by import By

    next(a for a in driver.find_elements(By.CSS_SELECTOR, '[data-testid="stSidebarNav"] a') if a.text == title).click()
    heading = "Tree designer" if title == "Tree designer" else title
    _wait(driver, lambda: any(h.text.strip() == heading for h in driver.find_elements(By.TAG_NAME, "h1")),
          what=f"the page {title}")
    _settled(driver)


def _select(driver, label: str):
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, f'input[role="combobox"][aria-label="{label}"]')


def _choose(driver, label: str, option: str) -> None:
    """Pick `option` in the selectbox labelled `label`."""
    from selenium.webdriver.common.by import By

    box = _select(driver, label)
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", box)
    box.click()
    _wait(driver, lambda: [o for o in driver.find_elements(By.CSS_SELECTOR, '[role="option"]') if o.text == option],
          what=f"option {option!r}", timeout=20)[0].click()
    _wait(driver, lambda: _select(driver, label).get_attribute("value") == option, what=f"{label} = {option}",
          timeout=30)
    _settled(driver)


def _type(driver, label: str, text: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    box = driver.find_element(By.CSS_SELECTOR, f'input[aria-label="{label}"]')
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", box)
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(Keys.BACKSPACE)
    box.send_keys(text + Keys.ENTER)
    _wait(driver, lambda: box.get_attribute("value") == text, what=f"{label} to take {text!r}")
    _settled(driver)


def _button(driver, text: str):
    from selenium.webdriver.common.by import By

    return next(b for b in driver.find_elements(By.TAG_NAME, "button") if b.text == text)


def _radio(driver, text: str) -> None:
    """Click the radio option labelled `text`."""
    from selenium.webdriver.common.by import By

    next(o for o in driver.find_elements(By.CSS_SELECTOR, '[data-testid="stRadioOption"]') if o.text == text).click()


def _click_button(driver, text: str) -> None:
    b = _button(driver, text)
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", b)
    b.click()
    _settled(driver)


def _expand(driver, starts: str) -> None:
    from selenium.webdriver.common.by import By

    summary = next(e for e in driver.find_elements(By.CSS_SELECTOR, '[data-testid="stExpander"] summary')
                   if starts in e.text)  # the text may begin with the arrow icon's name
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", summary)
    summary.click()
    time.sleep(0.5)


def _metric(driver, label: str) -> str:
    from selenium.webdriver.common.by import By

    for m in driver.find_elements(By.CSS_SELECTOR, '[data-testid="stMetric"]'):
        if m.find_element(By.CSS_SELECTOR, '[data-testid="stMetricLabel"]').text.strip() == label:
            return m.find_element(By.CSS_SELECTOR, '[data-testid="stMetricValue"]').text.strip()
    raise AssertionError(f"no metric {label!r}")


def _range(driver, label: str):
    """The slider's range input (value, min, max, disabled)."""
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, f'input[type="range"][aria-label="{label}"]')


def _slide(driver, label: str, *keys) -> None:
    """Focus a slider and press keys (Home, End, arrows), as a keyboard user would."""
    from selenium.webdriver.common.action_chains import ActionChains

    box = _range(driver, label)
    thumb = box.find_element("xpath", "../..")
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", thumb)
    ActionChains(driver).click(thumb).send_keys(*keys).perform()


def _shots(driver, name: str) -> list[Path]:
    """Full-page screenshots at 1600 and 1280 px wide; the window goes back to 1280 x 1000. At 1280 the page must
    not be wider than the window (nothing cut off at the side)."""
    OUT.mkdir(parents=True, exist_ok=True)
    paths = []
    for width in WIDTHS:
        driver.set_window_size(width, 1000)
        time.sleep(1.0)
        height = driver.execute_script(
            "const m = document.querySelector('[data-testid=\"stMain\"]');"
            "return Math.max(document.body.scrollHeight, m ? m.scrollHeight : 0)")
        driver.set_window_size(width, min(int(height) + 120, 9000))
        time.sleep(2.0)
        if width == 1280:
            over = driver.execute_script("return document.documentElement.scrollWidth - window.innerWidth")
            assert over <= 1, f"{name}: the page is {over} px wider than a 1280 px window"
        paths.append(OUT / f"{name}-{width}.png")
        driver.save_screenshot(str(paths[-1]))
    driver.set_window_size(1280, 1000)
    time.sleep(1.0)
    return paths


def _log_lines(log: Path) -> list[str]:
    return [line.strip() for line in log.read_text().splitlines() if line.startswith("[workbench-app]")]


def _timed(log: Path, what: str, before: int) -> list[str]:
    """The server's `[workbench-app]` lines since `before`, printed and appended to timings.txt."""
    new = _log_lines(log)[before:]
    line = f"{what}: " + ("; ".join(n.replace("[workbench-app] ", "") for n in new) or "no server run")
    print(line)
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / "timings.txt", "a") as f:
        f.write(line + "\n")
    return new


def _chart_points(driver, index: int):
    """The selectable points (SVG paths) of the index-th plotly chart on the page."""
    from selenium.webdriver.common.by import By

    charts = _wait(driver, lambda: driver.find_elements(By.CSS_SELECTOR, '[data-testid="stPlotlyChart"]')[index:],
                   what=f"plotly chart {index}")
    return charts[0].find_elements(By.CSS_SELECTOR, ".scatterlayer .trace .points path.point")


def _chart_index(driver, title_part: str) -> int:
    """Which plotly chart on the page is the one whose title (written above it) has this text."""
    return driver.execute_script(
        "const charts = Array.from(document.querySelectorAll('[data-testid=\"stPlotlyChart\"]'));"
        "return charts.findIndex(c => { let e = c; while (e && !e.previousElementSibling) e = e.parentElement;"
        "  for (let p = e && e.previousElementSibling, n = 0; p && n < 3; p = p.previousElementSibling, n++)"
        "    if (p.textContent.includes(arguments[0])) return true; return false; });", title_part)


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


def _focus_value(driver) -> str:
    return _select(driver, "Selected node (= mask row)").get_attribute("value")


# ----------------------------------------------------------------------------------------------- every page

@pytest.mark.parametrize("path,heading", PAGES)
def test_page_renders_in_chromium(server, browser, path, heading):
    from selenium.webdriver.common.by import By

    url, _ = server
    _open(browser, f"{url}/{path}", heading)
    assert "Page not found" not in _body(browser)
    if heading == "Tree designer":  # / opens the designer at its own address
        assert browser.current_url.rstrip("/").endswith("/tree")
    if path != "live":  # every other page draws interactive figures from the synthetic calibration
        _wait(browser, lambda: browser.find_elements(By.CSS_SELECTOR, '[data-testid="stPlotlyChart"]'),
              what="a figure")
    _shots(browser, f"page-{path or 'root'}")
    boxes = browser.find_elements(By.CSS_SELECTOR, '[data-testid="stException"]')
    assert not boxes, boxes[0].text[:2000]
    errors = _alerts(browser, "Error")
    assert not errors, errors[0][:2000]


# ----------------------------------------------------------------------------------------------- the answer

def test_recommendation_with_its_evidence(server, browser):
    """/tradeoffs opens with the warning (a current sweep contradicts the prediction), then the one sentence; old
    sweeps are named old; the candidates are ranked; the designer gives the same sentence and shows the pick."""
    url, _ = server
    _open(browser, f"{url}/tradeoffs", "Trade-offs")
    warnings = _alerts(browser)
    assert warnings[0].startswith("Measurements disagree with the prediction by more than their noise: ")
    assert "c-current.csv, decoder static-cache-1, 20 prompts" in warnings[0]
    assert any("made by the decoder before the static-cache step (old)" in w for w in warnings)
    body = _body(browser)
    said = re.search(r"Recommendation: (use .*?)\.\n", body).group(1)
    # the current sweep measured the plan's pick slower than plain decoding: the answer is no speculation, with
    # the figure, the calibration and latency table it rests on, and what the plan predicted
    assert re.match(r"use no speculation at batch 1 and context 128 \(calibration \S+, predicted_replay; latency "
                    r"latency-cpu\.csv\): the best measured option, tree \S+ \(\d+ nodes\), ran at [\d.]+x of plain "
                    r"decoding \([\d.]+x \+- [\d.]+ on this machine \(c-current\.csv", said), said
    assert "the plan predicted tree" in said
    _expand(browser, "candidates, ranked by workbench plan")
    _settled(browser)
    _shots(browser, "tradeoffs-recommendation")
    _nav(browser, "Tree designer")
    body = _body(browser)
    assert f"Recommendation: {said}." in body
    assert "show this tree" not in body  # no speculation: no tree to show
    _no_errors(browser)


def test_budget_kept_from_a_longer_latency_table(server, browser):
    """The crash of the issue: the budget at 255 on the long table, then the table that stops at 16 tokens."""
    from selenium.webdriver.common.keys import Keys

    url, _ = server
    _open(browser, f"{url}/tradeoffs", "Trade-offs")
    _slide(browser, "budget (max tree nodes)", Keys.END)
    _wait(browser, lambda: _range(browser, "budget (max tree nodes)").get_attribute("value") == "255",
          what="budget 255")
    _settled(browser)
    short = _option_named(browser, "... or a latency CSV found here", "latency-batched.csv")
    _choose(browser, "... or a latency CSV found here", short)
    _no_errors(browser)
    assert _range(browser, "budget (max tree nodes)").get_attribute("value") == "15"
    assert "x from the latency quartiles)" in _body(browser)  # the batched table has a spread
    _choose(browser, "batch size", "4")
    assert "at batch 4 and context 128" in _body(browser)
    _no_errors(browser)
    _shots(browser, "tradeoffs-short-batched-latency")


def _option_named(driver, label: str, ending: str) -> str:
    """The shown text of the option of a selectbox that ends with `ending` (opens and closes the list)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    box = _select(driver, label)
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", box)
    box.click()
    found = _wait(driver, lambda: [o.text for o in driver.find_elements(By.CSS_SELECTOR, '[role="option"]')
                                   if o.text.endswith(ending)], what=f"an option ending {ending}", timeout=20)[0]
    box.send_keys(Keys.ESCAPE)
    time.sleep(0.5)
    return found


# ----------------------------------------------------------------------------------------------- the designer

def test_reference_tree_edited_repaired_and_compared(server, browser):
    """Show a reference tree (the optimizer's sliders disabled, saying why), add a node (a bad one refused in one
    line), compare it with the optimizer's tree as one drawing; repair a pasted tree for TensorRT-LLM with a
    button; a malformed paste puts the selector back on what is drawn."""
    from selenium.webdriver.common.by import By

    url, _ = server
    _open(browser, f"{url}/tree", "Tree designer")
    _choose(browser, "Tree on display (drawn, masked, exported)", "reference: mc_sim_7b_63")
    assert _metric(browser, "nodes") == "63" and "mc_sim_7b_63: 63 nodes, depth 4" in _body(browser)
    assert _range(browser, "Budget (tree nodes)").get_attribute("disabled")
    assert "applies to the optimizer's tree only; the tree on display is mc_sim_7b_63" in _body(browser)
    _expand(browser, "Edit mc_sim_7b_63")
    _type(browser, "Add node (0-based ranks, e.g. 0,1)", "1,9")
    _click_button(browser, "add node")
    _wait(browser, lambda: _metric(browser, "nodes") == "64", what="the added node")
    assert "mc_sim_7b_63_edited: 64 nodes" in _body(browser)
    assert "edited from mc_sim_7b_63: added [[1, 9]], removed none" in _body(browser)
    _no_errors(browser)
    _type(browser, "Add node (0-based ranks, e.g. 0,1)", "1,8,0")
    _click_button(browser, "add node")
    err = _wait(browser, lambda: _alerts(browser, "Error"), what="the refusal")
    assert err[0].strip() == "path [1, 8, 0]: parent [1, 8] is missing (every prefix must be a node)"
    _shots(browser, "tree-edited")
    _choose(browser, "Compare with", OPTIMIZER)
    _wait(browser, lambda: "A = mc_sim_7b_63_edited vs B = optimal_63" in _body(browser), what="the comparison")
    body = _body(browser)
    assert "only in A" in body and "only in B" in body and "shared nodes" in body
    diff = browser.find_elements(By.CSS_SELECTOR, '[data-testid="stPlotlyChart"]')[_chart_index(browser, "as one tree")]
    legend = diff.get_attribute("innerHTML")
    assert "shared" in legend and "only in A" in legend and "only in B" in legend  # one tree, coloured
    compare = next(h for h in browser.find_elements(By.TAG_NAME, "h3") if h.text.startswith("A = "))
    browser.execute_script("arguments[0].scrollIntoView()", compare)
    _shots(browser, "tree-compare")
    _choose(browser, "Compare with", "(nothing)")

    # a pasted tree with a gap in its first level: TensorRT-LLM's runtime would not build it as written
    _expand(browser, "Your own tree")
    _type(browser, "... or a path, reference name, or literal like [[0], [0, 0], [1]]", "[[0], [2], [0, 0], [2, 0]]")
    _choose(browser, "Tree on display (drawn, masked, exported)", "yours: your tree")
    assert any("first level lacks rank(s) 1" in w for w in _alerts(browser))
    _click_button(browser, "repair for trtllm")
    _wait(browser, lambda: re.search("engine-safe for trtllm: 4 (->|→) ", _body(browser)), what="the repair")
    assert not any("first level lacks" in w for w in _alerts(browser))
    assert "your tree_trtllm_safe" in _body(browser)
    _shots(browser, "tree-repaired")
    _type(browser, "... or a path, reference name, or literal like [[0], [0, 0], [1]]", "[[0], [2], [0, 0], [2, 0")
    _wait(browser, lambda: _select(browser, "Tree on display (drawn, masked, exported)").get_attribute("value")
          == OPTIMIZER, what="the selector back on the optimizer's tree")
    assert any(e.startswith("your tree: ") for e in _alerts(browser, "Error"))
    assert "your tree is no longer available: showing the optimizer's tree" in _body(browser)
    _shots(browser, "tree-malformed-paste")
    _type(browser, "... or a path, reference name, or literal like [[0], [0, 0], [1]]", "")


def test_tree_node_and_mask_row_are_linked(server, browser):
    """Hover a node: its tooltip names its mask row; click it: the row lights up (the fragment alone reruns); click
    a mask cell: its row's node is selected; after an edit the selection follows the node, and the remove box
    forgets a removed node. Server time of each click is printed."""
    url, log = server
    _open(browser, f"{url}/tree", "Tree designer")
    _choose(browser, "Tree on display (drawn, masked, exported)", OPTIMIZER)
    tree_chart = _chart_index(browser, "optimal_63: 63 nodes")
    _wait(browser, lambda: len(_chart_points(browser, tree_chart)) == 64, what="the 63-node tree's points")
    _point(browser, tree_chart, 5, click=False)
    hover = _wait(browser, lambda: _hover_text(browser), what="a tooltip", timeout=10)
    row = int(hover.split("mask row ")[1].split("P(")[0].strip())
    before = len(_log_lines(log))
    _point(browser, tree_chart, 5, click=True)
    _wait(browser, lambda: f"row {row} selected" in browser.page_source, what="the mask row to light up")
    _settled(browser)
    runs = _timed(log, "node click", before)
    assert runs and all("fragment tree view" in r for r in runs), runs  # the tree and mask only, not the page
    assert _focus_value(browser).startswith(f"row {row}:")
    node = _focus_value(browser).split(": ", 1)[1]
    _shots(browser, "tree-node-selected")
    mask_chart = _chart_index(browser, "tree-attention mask")
    before = len(_log_lines(log))
    _point(browser, mask_chart, -1, click=True)  # the mask's allowed cells; the last one is on the last row's diagonal
    _wait(browser, lambda: "row 63 selected" in browser.page_source, what="the clicked mask row")
    _settled(browser)
    _timed(log, "mask click", before)
    assert _focus_value(browser).startswith("row 63:")
    _no_errors(browser)
    _shots(browser, "mask-row-selected")
    # the selection follows its node through an edit that renumbers the rows
    _point(browser, tree_chart, 5, click=True)
    _wait(browser, lambda: _focus_value(browser).startswith(f"row {row}:"), what="node selected again")
    _settled(browser)
    _expand(browser, "Edit optimal_63")
    _type(browser, "Add node (0-based ranks, e.g. 0,1)", "0,0,0,9" if row > 40 else "9")
    _click_button(browser, "add node")
    _no_errors(browser)
    assert _focus_value(browser).endswith(f": {node}")  # same node, whatever its row now
    _choose(browser, "Remove node (and its descendants)", node)
    _click_button(browser, "remove node")
    _no_errors(browser)
    assert _focus_value(browser) == "none"
    assert _select(browser, "Remove node (and its descendants)").get_attribute("value") in ("", "pick a node")
    _click_button(browser, "reset edits")


def test_downloads_do_not_rerun_and_carry_no_server_path(server, browser, downloads):
    url, log = server
    _open(browser, f"{url}/tree", "Tree designer")
    _choose(browser, "Tree on display (drawn, masked, exported)", OPTIMIZER)
    for fmt, name in (("json", "optimal_63.json"), ("medusa", "optimal_63.py")):
        before = len(_log_lines(log))
        b = next(b for b in reversed(browser.find_elements("css selector", '[data-testid="stDownloadButton"] button'))
                 if b.text == fmt)  # the export section's (the recommendation's come first)
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", b)
        b.click()
        _wait(browser, lambda: (downloads / name).is_file(), what=f"{name} downloaded", timeout=60)
        time.sleep(1.5)
        assert not _timed(log, f"download {fmt}", before)  # a download reruns nothing on the server
    record = json.loads((downloads / "optimal_63.json").read_text())
    assert record["name"] == "optimal_63" and len(record["medusa_choices"]) == 63
    assert record["accuracies"] == "synthetic"
    assert all(not str(v).startswith("/") for k, v in record.items())  # relative or chosen paths only


def test_settings_and_upload_kept_across_pages(server, browser, tmp_path):
    """Budget 16 and the empirical model survive a trip to the calibration page and back; so does an uploaded
    accuracy table."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    url, _ = server
    _open(browser, f"{url}/tree", "Tree designer")
    _choose(browser, "Tree on display (drawn, masked, exported)", OPTIMIZER)
    _radio(browser, "empirical paths")
    _settled(browser)
    _slide(browser, "Budget (tree nodes)", Keys.HOME)
    _settled(browser)
    _slide(browser, "Budget (tree nodes)", *[Keys.ARROW_RIGHT] * 15)
    _wait(browser, lambda: _metric(browser, "nodes") == "16", what="a 16-node tree")
    _settled(browser)
    _nav(browser, "Calibration")
    _nav(browser, "Tree designer")
    assert _metric(browser, "nodes") == "16"
    assert "empirical_16: 16 nodes" in _body(browser)
    _no_errors(browser)
    _shots(browser, "tree-settings-kept")

    table = tmp_path / "mine.csv"
    table.write_text("head,rank,accuracy\n1,1,0.6\n1,2,0.2\n2,1,0.3\n2,2,0.1\n")
    _radio(browser, "independence")
    _settled(browser)
    _radio(browser, "accuracy file or pasted CSV")
    _settled(browser)
    uploader = next(u for u in browser.find_elements(By.CSS_SELECTOR, '[data-testid="stFileUploader"]')
                    if "accuracy CSV" in u.text)
    uploader.find_element(By.CSS_SELECTOR, 'input[type="file"]').send_keys(str(table))
    _wait(browser, lambda: _metric(browser, "depth") == "2", what="the uploaded table's tree")
    _settled(browser)
    _nav(browser, "Calibration")
    _nav(browser, "Tree designer")
    assert _metric(browser, "depth") == "2"
    assert "using the uploaded mine.csv (kept from before)" in _body(browser)
    _shots(browser, "tree-upload-kept")
    _click_button(browser, "forget mine.csv")
    _radio(browser, "calibration folder")
    _settled(browser)


# ----------------------------------------------------------------------------------------------- live

def test_live_decode_in_chromium(server, browser, tiny_llama):
    """Type a (tiny random) model and heads into the live page, press the button: progress messages for the model
    load and the warm-up, the coloured answer, the prediction beside the measurement; then an error clears it."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    url, _ = server
    browser.get(f"{url}/live")
    _wait(browser, lambda: any(h.text.strip() == "Live decode" for h in browser.find_elements(By.TAG_NAME, "h1")),
          what="the live page")
    for label, value in (("Model (blank: the demo SmolLM2-135M-Instruct)", tiny_llama.model_dir),
                         ("Heads (blank: the demo heads)", tiny_llama.heads_dirs["2"])):
        box = _wait(browser, lambda: browser.find_elements(By.CSS_SELECTOR, f'input[aria-label="{label}"]'),
                    what=label)[0]
        box.send_keys(str(value) + Keys.ENTER)
        _wait(browser, lambda: box.get_attribute("value") == str(value), what=f"{label} to take the value")
        time.sleep(1.0)
    _settled(browser)
    _choose(browser, "Tree", "other: a path or literal")
    _type(browser, "Tree file or literal", "[[0], [1], [0, 0], [0, 0, 0]]")
    _button(browser, "Load model and generate").click()
    _wait(browser, lambda: "Loading the model and heads" in _body(browser) or "Model ready" in _body(browser),
          what="the loading message", timeout=60, every=0.2)
    _wait(browser, lambda: browser.find_elements(By.CSS_SELECTOR, 'span[title="step 1"]'), timeout=120,
          what="the coloured answer")
    _settled(browser)
    _no_errors(browser)
    body = _body(browser)
    assert re.search(r"Model ready \([\d.]+ s\), warmed up \([\d.]+ s\)", body), body
    assert "Output equals vanilla greedy" in body
    assert re.search(r"Medusa: \d+/64 tokens in \d+ steps \(\d\.\d\d tokens/step\), [\d.]+ tokens/s", body), body
    assert re.search(r"vanilla greedy: (\d+)/64 tokens in \1 steps \(1\.00 tokens/step\)", body), body
    assert "One prompt is a noisy measurement" in body
    assert re.fullmatch(r"\d\.\d\d", _metric(browser, "predicted tokens/step"))
    _shots(browser, "live-decoded")
    _type(browser, "Tree file or literal",
          "[[0], [0, 0], [0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]]")
    _click_button(browser, "Load model and generate")
    assert any("exceeds the 5 Medusa heads" in e for e in _alerts(browser, "Error"))
    assert not browser.find_elements(By.CSS_SELECTOR, 'span[title="step 1"]')  # no stale answer under the error
    assert "Output equals vanilla greedy" not in _body(browser)
    _shots(browser, "live-error")
