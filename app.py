"""Streamlit face of the workbench: `streamlit run app.py` (offline; reads the committed calibration).

Four pages, each with its own URL: /tree (designer), /calibration, /tradeoffs, /live (the only page that loads
a model, and only on a button press); / opens the designer at /tree. This file is the entry point only (page
config, navigation); each page is a module of workbench/ui/, the inputs every page shares and the settings kept
across pages in workbench/ui/inputs.py, cached readers in workbench/ui/widgets.py; numbers come from `workbench/`
modules, figures from `workbench/viz/static_figures.py` and `workbench/viz/interactive_figures.py`. Bad input (a missing folder, a malformed
upload, a tree that does not fit the heads) is an `st.error` with the reason, never a crash.

Calibration folders are looked up under $WORKBENCH_CALIBRATION_ROOT (default: calibration/ in this checkout),
sweep and latency CSVs also under $WORKBENCH_RESULTS_ROOT (default: docs/results/).
"""
from __future__ import annotations

import streamlit as st

from workbench.ui.calibration_page import calibration_page
from workbench.ui.inputs import keep_settings
from workbench.ui.live_page import live_page
from workbench.ui.tradeoffs_page import tradeoffs_page
from workbench.ui.tree_page import tree_page

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
