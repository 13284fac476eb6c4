"""Streamlit face of the workbench: `streamlit run app.py` (offline; reads the committed calibration).

Four pages, each with its own URL: /tree (designer), /calibration, /tradeoffs, /live (the only page that loads
a model, and only on a button press); / opens the designer at /tree. This file is the entry point only (page
config, navigation, settings kept across pages); each page is a module of workbench/ui/, their shared inputs and
cached readers are in workbench/ui/widgets.py, numbers come from `workbench/` modules, figures from
`workbench/viz/static_figures.py` and `workbench/viz/interactive_figures.py`. Bad input (a missing folder, a malformed
upload, a tree that does not fit the heads) is an `st.error` with the reason, never a crash.

Calibration folders are looked up under $WORKBENCH_CALIBRATION_ROOT (default: calibration/ in this checkout),
sweep and latency CSVs also under $WORKBENCH_RESULTS_ROOT (default: docs/results/).
"""
from __future__ import annotations

import re

import streamlit as st

from workbench.ui.calibration_page import calibration_page
from workbench.ui.live_page import live_page
from workbench.ui.tradeoffs_page import tradeoffs_page
from workbench.ui.tree_page import tree_page

# Widget keys whose values are kept across page changes (Streamlit drops a widget's state once a run does not
# draw it; reassigning the key on every run keeps it). Buttons, uploads, downloads and charts hold no settable
# value, so they are left out.
KEPT_PREFIXES = ("tree_", "cal_", "to_", "live_")
NOT_KEPT = re.compile(r".*(_btn|_go|_upload|_up|_chart|_download)$")


def keep_settings() -> None:
    """Keep every page's settings when the user switches pages and back (called on every run, before the page)."""
    for key in list(st.session_state.keys()):
        if isinstance(key, str) and key.startswith(KEPT_PREFIXES) and not NOT_KEPT.match(key):
            st.session_state[key] = st.session_state[key]


PAGES = [(tree_page, "Tree designer", "tree"), (calibration_page, "Calibration", "calibration"),
         (tradeoffs_page, "Trade-offs", "tradeoffs"), (live_page, "Live decode", "live")]


def home() -> None:
    """The address without a page (/): the designer, at its own URL /tree (a default page has no URL of its own)."""
    st.switch_page(st.Page(tree_page, title="Tree designer", url_path="tree"))


def main() -> None:
    st.set_page_config(page_title="Medusa tree workbench", layout="wide")
    nav = st.navigation([st.Page(home, title="Home", url_path="home", default=True, visibility="hidden")]
                        + [st.Page(fn, title=title, url_path=url) for fn, title, url in PAGES])
    keep_settings()
    nav.run()


if __name__ == "__main__":
    main()
