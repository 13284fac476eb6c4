"""The Streamlit app's pages and shared widgets: the only part of the workbench that imports streamlit.

`app.py` (the `streamlit run` entry point) navigates between the four pages, one module each: tree_page,
calibration_page, tradeoffs_page, live_page; widgets holds the inputs and cached readers they share. Numbers come
from the library modules, figures from workbench/viz/static_figures.py and workbench/viz/interactive_figures.py.
"""
