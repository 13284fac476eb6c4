"""Figures: matplotlib PNGs for the CLI and docs, plotly views for the app. No torch."""
