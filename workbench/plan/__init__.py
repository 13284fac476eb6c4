"""Deciding: the one ranker (tree, chain or nothing per batch size), the app's recommendation, report tables. No torch."""
