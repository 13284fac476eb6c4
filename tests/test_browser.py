"""End to end in a real browser: `streamlit run app.py` on a free localhost port, driven in headless Chromium
(Debian's /usr/bin/chromium + chromedriver, via Selenium) as a user would, at 1280 x 1000: every page by its URL
(/ opens the designer at /tree), the recommendation with its evidence on both pages (old sweeps named old, a
current sweep that contradicts the prediction warned about at the top), the budget kept from a longer latency table,
the designer's interactions (reference tree with the optimizer's sliders disabled, node added, comparison drawn as
one tree, engine repair, node and mask clicks with the selection following the node, downloads, a malformed pasted
tree, an upload and settings kept across pages) and a live decode with its progress messages, prediction, and an
error that clears the last result. No exception box; no page wider than the window at 1280 px.

With WORKBENCH_SCREENSHOTS=1, screenshots at 1600 and 1280 px wide go to tests/output/browser/ (gitignored). The
server's own time for node and mask clicks and downloads (`[workbench-app]` lines, $WORKBENCH_APP_TIMINGS) is printed
and written to tests/output/browser/timings.txt; nothing asserts a time (the machine is shared)."""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
from helpers import make_current_sweep, make_walk_files

from workbench import REPO_ROOT
from support.browser import alerts as _alerts, app_server, body as _body, button as _button
from support.browser import chart_index as _chart_index, chart_point as _point, chart_points as _chart_points
from support.browser import choose as _choose, chromium, click_button as _click_button, cut_tables, errors
from support.browser import expand as _expand, expand_all, metric as _metric, missing_browser, nav as _nav
from support.browser import open_page as _open, page_overflow, radio as _radio, range_input as _range
from support.browser import select as _select, settled as _settled, slide as _slide, type_text as _type
from support.browser import open_tab, tab_labels, wait as _wait

OUT = REPO_ROOT / "tests" / "output" / "browser"
WIDTHS = (1600, 1280)
PAGES = [("", "Tree designer"), ("tree", "Tree designer"), ("calibration", "Calibration"),
         ("tradeoffs", "Trade-offs"), ("live", "Live decode")]
OPTIMIZER = "the optimizer's (sidebar settings)"

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The app under `streamlit run`, reading a synthetic calibration folder (a long latency table in it, a short
    batched one with spread beside it, two old sweeps and a current one); yields (base URL, log path)."""
    root = tmp_path_factory.mktemp("browser_calibration")
    make_current_sweep(root, make_walk_files(root, "synthetic"))
    env = dict(WORKBENCH_CALIBRATION_ROOT=str(root), WORKBENCH_RESULTS_ROOT=str(root), WORKBENCH_APP_TIMINGS="1")
    log_path = tmp_path_factory.mktemp("streamlit_log") / "streamlit.log"
    try:
        with app_server(env, log_path) as (url, _):
            yield url, log_path
    except RuntimeError as e:
        pytest.fail(str(e))


@pytest.fixture(scope="module")
def downloads(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("downloads")


@pytest.fixture(scope="module")
def browser(tmp_path_factory, downloads):
    why = missing_browser()
    if why:
        pytest.skip(why)
    driver = chromium(tmp_path_factory.mktemp("chromium_profile"), downloads)
    yield driver
    driver.quit()


# ----------------------------------------------------------------------------------------------- helpers

def _no_errors(driver) -> None:
    found = errors(driver)
    assert not found, found[0][:2000]


def _shots(driver, name: str) -> list[Path]:
    """At 1280 px the page must not be wider than the window (nothing cut off at the side). With
    WORKBENCH_SCREENSHOTS=1, full-page screenshots at 1600 and 1280 px wide too (each resize waits for the page
    to reflow: ~9 s a call, so off by default). The window is 1280 x 1000 afterwards."""
    if driver.get_window_size()["width"] != 1280:
        driver.set_window_size(1280, 1000)
        time.sleep(1.0)
    over = driver.execute_script("return document.documentElement.scrollWidth - window.innerWidth")
    assert over <= 1, f"{name}: the page is {over} px wider than a 1280 px window"
    if os.environ.get("WORKBENCH_SCREENSHOTS") != "1":
        return []
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


# ----------------------------------------------------------------------------------------------- 1280 px

NARROW = (1280, 900)


def _no_cut_columns(driver, where: str) -> None:
    """At 1280 x 900, with every expander open: no table has columns scrolled out of sight or past the window, and
    the page is no wider than the window."""
    expand_all(driver)
    _settled(driver)
    cut = cut_tables(driver)
    assert not cut, f"{where}: tables with cut columns at {NARROW[0]} px: {cut}"
    assert page_overflow(driver) <= 1, f"{where}: the page is {page_overflow(driver)} px wider than the window"


@pytest.mark.parametrize("path,heading,compare", [("tree", "Tree designer", False),
                                                  ("tree", "Tree designer", True),
                                                  ("calibration", "Calibration", False),
                                                  ("tradeoffs", "Trade-offs", False),
                                                  ("live", "Live decode", False)])
def test_no_cut_columns_at_1280_px(server, browser, path, heading, compare):
    """Every table of every page (the designer also while comparing two trees, which adds two tables) shows all its
    columns in a 1280 x 900 window. (The live page's per-step table is checked after a decode, in the live test.)"""
    url, _ = server
    browser.set_window_size(*NARROW)
    try:
        _open(browser, f"{url}/{path}", heading)
        if compare:
            _choose(browser, "Tree on display (drawn, masked, exported)", OPTIMIZER)
            _choose(browser, "Compare with", "reference: mc_sim_7b_63")
            _wait(browser, lambda: "A = optimal_63 vs B = mc_sim_7b_63" in _body(browser), what="the comparison")
        _no_errors(browser)
        _no_cut_columns(browser, f"/{path}" + (" comparing" if compare else ""))
        for label in tab_labels(browser)[1:]:  # a tab is drawn only while open (the trade-offs page): each in turn
            open_tab(browser, label)
            _no_errors(browser)
            _no_cut_columns(browser, f"/{path}, tab {label}")
        if compare:
            _choose(browser, "Compare with", "(nothing)")
    finally:
        browser.set_window_size(1280, 1000)


def test_cut_column_check_sees_a_cut_column(tmp_path):
    """The check above is not blind: on a page with one table too wide for the window (twenty long-named columns)
    and one that fits, it reports exactly the wide one."""
    why = missing_browser()
    if why:
        pytest.skip(why)
    script = tmp_path / "wide.py"
    script.write_text("import pandas as pd\nimport streamlit as st\n"
                      "st.dataframe(pd.DataFrame({'a': [1.5], 'b': [2]}))\n"
                      "st.dataframe(pd.DataFrame({f'a rather long column name {i}': [i * 1.5] for i in range(20)}))\n")
    driver = None
    with app_server({}, tmp_path / "streamlit.log", script=script) as (url, _):
        try:
            driver = chromium(tmp_path / "profile", width=NARROW[0], height=NARROW[1])
            driver.get(url)
            cut = _wait(driver, lambda: cut_tables(driver) if len(driver.find_elements(
                "css selector", '[data-testid="stDataFrame"]')) == 2 else None, what="the wide table", timeout=60)
            _settled(driver)
            cut = cut_tables(driver)
            assert len(cut) == 1 and cut[0]["hidden_px"] > 100, cut
        finally:
            if driver is not None:
                driver.quit()


# ----------------------------------------------------------------------------------------------- the answer

def test_recommendation_with_its_evidence(server, browser):
    """/tradeoffs opens with the warning (a current sweep contradicts the prediction), then the one sentence; the
    candidates are ranked; the designer gives the same sentence and shows the pick."""
    url, _ = server
    _open(browser, f"{url}/tradeoffs", "Trade-offs")
    warnings = _alerts(browser)
    assert warnings[0].startswith("Measurements disagree with the prediction by more than their noise: ")
    assert "c-current.csv, 20 prompts" in warnings[0]
    body = _body(browser)
    said = re.search(r"Recommendation: (use .*?)\.\n", body).group(1)
    # the current sweep measured the plan's pick slower than plain decoding: the answer is no speculation, with
    # the figure, the calibration and latency table it rests on, and what the plan predicted
    assert re.match(r"use no speculation at batch 1 and context 128 \(calibration \S+, predicted_replay; latency "
                    r"latency-cpu\.csv\): the best measured option, tree \S+ \(\d+ nodes\), ran at [\d.]+x of plain "
                    r"decoding \([\d.]+x \+- [\d.]+ in the latency table's setting \(c-current\.csv", said), said
    assert "the plan predicted tree" in said
    open_tab(browser, "Sweep (Fig. 4)")  # a sweep's comparability rests on its recorded setting alone (no decoder marks)
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
    open_tab(browser, "Latency and speedup")
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


def _budget(driver, nodes: int) -> None:
    """The optimizer's budget slider moved to `nodes` from its lowest end, and the tree of that many drawn."""
    from selenium.webdriver.common.keys import Keys

    _slide(driver, "Budget (tree nodes)", Keys.HOME)
    _settled(driver)
    _slide(driver, "Budget (tree nodes)", *[Keys.ARROW_RIGHT] * (nodes - 1))
    _wait(driver, lambda: _metric(driver, "nodes") == str(nodes), what=f"a {nodes}-node tree")
    _settled(driver)


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

    url, _ = server
    _open(browser, f"{url}/tree", "Tree designer")
    _choose(browser, "Tree on display (drawn, masked, exported)", OPTIMIZER)
    _radio(browser, "empirical paths")
    _settled(browser)
    _budget(browser, 16)
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
    browser.set_window_size(*NARROW)
    try:
        _no_cut_columns(browser, "/live after a decode")
    finally:
        browser.set_window_size(1280, 1000)
    _shots(browser, "live-decoded")
    _type(browser, "Tree file or literal",
          "[[0], [0, 0], [0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]]")
    _click_button(browser, "Load model and generate")
    assert any("exceeds the 5 Medusa heads" in e for e in _alerts(browser, "Error"))
    assert not browser.find_elements(By.CSS_SELECTOR, 'span[title="step 1"]')  # no stale answer under the error
    assert "Output equals vanilla greedy" not in _body(browser)
    _shots(browser, "live-error")
