"""The app as one instrument, in a real browser (see test_browser.py, whose server, browser and helpers it shares;
a file of its own so that the suite's two workers each drive one browser): a node click followed by page switches
keeps every shared input, a 63-node tree draws no node over another, and the committed data's answer at 1280 and
1920 px."""
from __future__ import annotations

import re

import pytest

from workbench import REPO_ROOT
from support.browser import alerts as _alerts, app_server, body as _body
from support.browser import chart_index as _chart_index, chart_point as _point, chart_points as _chart_points
from support.browser import choose as _choose, cut_tables, expand_all, metric as _metric, nav as _nav
from support.browser import open_page as _open, page_overflow, radio as _radio, range_input as _range
from support.browser import select as _select, settled as _settled
from support.browser import open_tab, tab_labels, wait as _wait
from test_browser import OPTIMIZER, _budget, _focus_value, _log_lines, _no_errors, _option_named, _shots, _timed
from test_browser import browser, downloads, server  # noqa: F401 - fixtures: this module's own server and browser

pytestmark = pytest.mark.browser


@pytest.mark.parametrize("width", [1280, 1920])
def test_node_click_then_page_switch_keeps_every_input(server, browser, width):
    """Issue 53: a tree-node click (the fragment's own run) followed by a page switch used to reset every page's
    settings. Set the shared inputs and the designer's own, click a node, visit the other pages (they show the same
    latency table and batch size) and come back: every input is as it was, the node still selected."""

    url, log = server
    lat = "... or a latency CSV found here"
    browser.set_window_size(width, 1000)
    try:
        _open(browser, f"{url}/tree", "Tree designer")
        _choose(browser, "Tree on display (drawn, masked, exported)", OPTIMIZER)
        short = _option_named(browser, lat, "latency-batched.csv")
        _choose(browser, lat, short)
        _choose(browser, "batch size", "4")
        _radio(browser, "empirical paths")
        _settled(browser)
        _budget(browser, 15)
        calibration = _select(browser, "Calibration").get_attribute("value")
        tree_chart = _chart_index(browser, "empirical_15: 15 nodes")
        before = len(_log_lines(log))
        _point(browser, tree_chart, 3, click=True)
        _wait(browser, lambda: _focus_value(browser) != "none", what="the node selected")
        _settled(browser)
        runs = _timed(log, f"node click at {width} px", before)
        assert runs and all("fragment tree view" in r for r in runs), runs  # the fragment's own run
        focus = _focus_value(browser)
        for title in ("Trade-offs", "Calibration", "Tree designer"):
            _nav(browser, title)
            _no_errors(browser)
            assert _select(browser, "Calibration").get_attribute("value") == calibration, title
            assert _select(browser, lat).get_attribute("value") == short, title
            assert _select(browser, "batch size").get_attribute("value") == "4", title
            if title == "Trade-offs":
                assert "at batch 4 and context 128" in _body(browser)
        assert _range(browser, "Budget (tree nodes)").get_attribute("value") == "15"
        assert "empirical_15: 15 nodes" in _body(browser) and _metric(browser, "nodes") == "15"
        assert _select(browser, "Tree on display (drawn, masked, exported)").get_attribute("value") == OPTIMIZER
        assert _focus_value(browser) == focus
        assert page_overflow(browser) <= 1
        _shots(browser, f"inputs-kept-{width}")
    finally:
        browser.set_window_size(1280, 1000)
        _choose(browser, lat, _option_named(browser, lat, "latency-cpu.csv"))


def _overlaps(boxes: list) -> list[tuple[int, int]]:
    """Pairs of boxes [left, top, right, bottom] that intersect by more than half a pixel each way."""
    return [(i, j) for i in range(len(boxes)) for j in range(i + 1, len(boxes))
            if min(boxes[i][2], boxes[j][2]) - max(boxes[i][0], boxes[j][0]) > 0.5
            and min(boxes[i][3], boxes[j][3]) - max(boxes[i][1], boxes[j][1]) > 0.5]


@pytest.mark.parametrize("width", [1280, 1920])
def test_a_63_node_tree_draws_no_node_over_another(server, browser, width):
    """Issue 53: a 63-node tree's nodes overlapped at depth 2-3 at 1280 px. As drawn in the browser, no node's
    marker meets another's, at 1280 and 1920 px, and the page is no wider than the window."""
    url, _ = server
    browser.set_window_size(width, 1000)
    try:
        _open(browser, f"{url}/tree", "Tree designer")
        _choose(browser, "Tree on display (drawn, masked, exported)", "reference: mc_sim_7b_63")
        idx = _chart_index(browser, "mc_sim_7b_63: 63 nodes")
        _wait(browser, lambda: len(_chart_points(browser, idx)) == 64, what="the 63-node tree's points")
        boxes = browser.execute_script("return arguments[0].map(e => { const r = e.getBoundingClientRect();"
                                       " return [r.left, r.top, r.right, r.bottom]; })", _chart_points(browser, idx))
        assert len(boxes) == 64 and all(b[2] - b[0] > 4 for b in boxes)  # drawn, at a readable size
        hit = _overlaps(boxes)
        assert not hit, f"{len(hit)} overlapping node pairs at {width} px, e.g. {hit[:3]}"
        assert page_overflow(browser) <= 1
        _shots(browser, f"tree-63-{width}")
    finally:
        browser.set_window_size(1280, 1000)
        _choose(browser, "Tree on display (drawn, masked, exported)", OPTIMIZER)


@pytest.fixture(scope="module")
def committed_server(tmp_path_factory):
    """The app on the committed data, as a fresh clone opens it (calibration/ and docs/results/)."""
    log_path = tmp_path_factory.mktemp("streamlit_committed") / "streamlit.log"
    env = {"WORKBENCH_CALIBRATION_ROOT": str(REPO_ROOT / "calibration"),
           "WORKBENCH_RESULTS_ROOT": str(REPO_ROOT / "docs" / "results")}
    try:
        with app_server(env, log_path) as (url, _):
            yield url
    except RuntimeError as e:
        pytest.fail(str(e))


@pytest.mark.parametrize("width", [1280, 1920])
def test_the_committed_answer_in_a_browser(committed_server, browser, width):
    """Issue 53's 'done when' on the committed data: the first view prices its answer on the 805-prompt calibration
    and names the latency table's setting; at batch 2 the odd plain step that carries the answer is flagged on the
    designer and on /tradeoffs, which show the same answer; the plan tab's tables are not cut."""
    url = committed_server
    browser.set_window_size(width, 1000)
    try:
        _open(browser, f"{url}/tree", "Tree designer")
        _no_errors(browser)
        shown = _select(browser, "Calibration").get_attribute("value")
        assert shown == "smollm2-135m-instruct-alpaca-eval (805 prompts)"  # the most prompts, preselected
        assert _metric(browser, "predicted speedup").endswith("x")
        assert "Evidence: latency latency-cpu.csv: cpu AMD EPYC (avx2), 2 threads" in _body(browser)
        _choose(browser, "batch size", "2")
        flagged = [a for a in _alerts(browser) if "off their trend" in a]
        assert flagged and "batch 2's plain step (1 token) 0.160 s is off its neighbours" in flagged[0]
        said = re.search(r"Recommendation: (use .*?)\.\n", _body(browser)).group(1)
        assert " at batch 2 and context " in said
        _nav(browser, "Trade-offs")
        _no_errors(browser)
        assert _select(browser, "batch size").get_attribute("value") == "2"
        assert f"Recommendation: {said}." in _body(browser)
        assert any("off their trend" in a for a in _alerts(browser))
        open_tab(browser, "Plan per batch size")
        _no_errors(browser)
        expand_all(browser)
        _settled(browser)
        assert not cut_tables(browser) and page_overflow(browser) <= 1
        _shots(browser, f"committed-plan-{width}")
    finally:
        browser.set_window_size(1280, 1000)


# The candidates table's sideways scroll: how far any box inside it scrolls (the grid's scroller, its wrappers) and
# how far it reaches past the window; None while no candidates table is drawn.
CANDIDATES_SCROLL = """
  for (const el of document.querySelectorAll('[data-testid="stDataFrame"]')) {
    const heads = Array.from(el.querySelectorAll('th, [role=columnheader]')).map(h => h.textContent.trim());
    const box = el.getBoundingClientRect();
    if (!heads.includes('candidate') || box.width === 0) continue;
    let hidden = 0;
    for (const c of [el, ...el.querySelectorAll('*')]) {
      const style = getComputedStyle(c).overflowX;
      if (c.clientWidth > 0 && (style === 'auto' || style === 'scroll' || c.classList.contains('dvn-scroller')))
        hidden = Math.max(hidden, c.scrollWidth - c.clientWidth);
    }
    return {hidden: hidden, outside: Math.max(0, box.right - document.documentElement.clientWidth),
            columns: heads.filter(h => h)};
  }
  return null;"""


@pytest.mark.parametrize("data", ["committed", "contradicted"])
def test_the_candidates_table_fits_1280_px_in_every_tab(committed_server, server, browser, data):
    """Issue 70: with its expander open, the Trade-offs page's candidates table scrolled 73 px sideways at 1280 px,
    in every tab. Its scroll width, measured in the browser, in every tab, as the page opens and at another batch size: on the committed
    data, and on data whose current sweep contradicts the prediction (every column, "disagrees" too)."""
    url = committed_server if data == "committed" else server[0]
    browser.set_window_size(1280, 900)
    try:
        _open(browser, f"{url}/tradeoffs", "Trade-offs")
        _no_errors(browser)
        seen = []
        # as it opens, then at a second batch size (the synthetic data's: on its batched latency table)
        for batch in (None, "2" if data == "committed" else "4"):
            if batch and data != "committed":
                lat = "... or a latency CSV found here"
                _choose(browser, lat, _option_named(browser, lat, "latency-batched.csv"))
            if batch:
                _choose(browser, "batch size", batch)
            for label in [None, *tab_labels(browser)[1:]]:
                if label:
                    open_tab(browser, label)
                expand_all(browser)
                _settled(browser)
                got = _wait(browser, lambda: browser.execute_script(CANDIDATES_SCROLL), what="the candidates table")
                seen.append(got["columns"])
                assert got["hidden"] <= 0 and got["outside"] <= 0, (batch, label, got)
            open_tab(browser, tab_labels(browser)[0])
        widest = max(seen, key=len)
        assert data == "committed" or "disagrees" in widest, widest  # the widest table was measured
        assert {"candidate", "tokens/step", "speedup", "measured", "in"} <= set(widest), widest
    finally:
        browser.set_window_size(1280, 1000)


# ----------------------------------------------------------------------------------------------- live
