"""The designer (/tree) for a served calibration (calibrate/served.py: vLLM's own counters for any drafter it runs:
n-gram, draft model, EAGLE, ...). Such a drafter drafts one chain of K tokens, so there is no tree to design: the page
answers K at the sidebar's batch size with the recommendation every page opens with (plan's weighing, as `workbench
plan --calibration SERVED` weighs it) and prices every K. The tree controls (acceptance model, budget, depth, ranks,
your own tree, the mask, the tree exports) are Medusa heads' and are not drawn; the sidebar says so.
"""
from __future__ import annotations

import pandas as pd
import streamlit as st

from workbench.ui.recommendation import candidate_curves, panel, provenance_of, ranked
from workbench.ui.widgets import Source, chart
from workbench.viz import interactive_tradeoffs


def served_facts(src: Source) -> str:
    """What the served calibration counted, in words: engine, drafter, K, prompts, drafts over decoding steps."""
    m, c = src.served.meta, src.served.counts
    steps = f" over {c.decode_steps:,} decoding steps" if c.decode_steps else ""
    return (f"{m.get('engine') or '?'} {m.get('engine_version') or ''} served the {m.get('method') or '?'} drafter "
            f"at K={c.k} on {m.get('model') or '?'} ({m.get('prompts') or 'a scrape'}, {m.get('num_prompts') or '?'} "
            f"prompts): {c.drafts:,} drafts{steps}, {c.accepted:,} of {c.draft_tokens:,} drafted tokens accepted")


def served_designer(src: Source, lat: dict | None) -> None:
    """The served drafter's K at the sidebar's batch size, with every K's predicted speedup."""
    method = src.served.meta.get("method") or "served"
    st.sidebar.caption(f"Tree design (acceptance model, budget, depth, ranks, your own tree) is for Medusa heads' "
                       f"calibrations: the {method} drafter of {src.label} drafts a chain of K tokens, so this page "
                       "answers K.")
    st.caption(f"Served calibration {src.label}: {served_facts(src)}.")
    if lat is None:
        st.info(f"No latency CSV found, so no K: measure vLLM's rounds with the {method} drafter (`workbench latency "
                f"--engine vllm --method {method}`) or give one in the sidebar (Hardware).")
        return
    rec = ranked(src, lat["path"], lat["tables"])
    if rec is None:
        return
    panel(rec, "tree", src.acc.shape[0], provenance_of(src) | dict(method="recommended", latency=lat["path"].name))
    chains = sorted((r for r in rec["candidates"] if r["kind"] in ("chain", "none")), key=lambda r: r["nodes"])
    left, right = st.columns(2)
    with left:
        chart(interactive_tradeoffs.speedup_chart(candidate_curves(rec), {"recommended": (rec["pick"]["nodes"],
                                                                                          rec["pick"]["speedup"])},
                                                  title=f"predicted speedup by K, batch {rec['batch']}, context "
                                                        f"{rec['context']}"),
              f"Each K the latency table prices ({lat['path'].name}: {rec.get('engine') or '?'} rounds); x: K, the "
              "chain's draft tokens.", key="tree_speedup_chart")
    with right:
        st.dataframe(pd.DataFrame([{
            "K": r["nodes"], "tokens/step": r["tokens_per_step"], "speedup": r["speedup"],
            "range": f"{r['range'][0]:.2f}-{r['range'][1]:.2f}x" if r["range"] else ""} for r in chains]),
            hide_index=True, column_config={
                "K": st.column_config.NumberColumn(help="num_speculative_tokens (0: no speculation)"),
                "tokens/step": st.column_config.NumberColumn(format="%.3f", help=f"predicted: {rec['prediction']}"),
                "speedup": st.column_config.NumberColumn(format="%.3fx", help="predicted, of the decoding phase"),
                "range": st.column_config.TextColumn(help="over the latency table's quartiles")})
        st.caption(f"Every K weighed at batch {rec['batch']}"
                   + (": a K the table did not time is not priced (vLLM's round at an untimed K is not known)"
                      if rec.get("engine") == "vllm" else "") + ". The plan per batch size is on the trade-offs page.")
