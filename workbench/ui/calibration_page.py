"""Page 2, the calibration (/calibration): per-head accuracies and measured vs independence path probabilities.

What `workbench calibrate` measured, split by fit / holdout prompts: the a_k^(i) heatmap, top-k curves, and how
far measured joint path frequencies are from the independence product the optimizer assumes.
"""
from __future__ import annotations

import json

import streamlit as st

from workbench import WorkbenchError
from workbench.calibrate.served import Served
from workbench.trees.optimize import chain_values
from workbench.trees.accuracies import accuracy_frame
from workbench.trees.optimize import acc_value_fn
from workbench.ui.inputs import shared_inputs
from workbench.ui.served_view import served_facts
from workbench.ui.widgets import chart, results_root, served_folders, timed
from workbench.viz import interactive_figures


def calibration_page() -> None:
    with timed("page /calibration"):
        _calibration_page()


def _calibration_page() -> None:
    st.title("Calibration")
    src = shared_inputs().src
    if src is None:
        st.info("Pick a calibration folder or an accuracy table in the sidebar.")
        return
    if src.served is not None:
        _served_view(src)
        return
    acc = src.acc
    if src.calib:
        split = st.sidebar.radio("Prompts", ["fit", "holdout", "all"], key="cal_split",
                                 help="fit: what calibrate's trees are built from; holdout: the prompts kept aside")
        acc, ranks = src.calib.accuracies(split), src.calib.ranks(split)
        meta = src.calib.meta
        st.markdown(f"**model** `{meta.get('model') or 'demo'}` &nbsp; **heads** `{meta.get('heads') or '?'}` "
                    f"&nbsp; **prompts** `{meta.get('prompts') or '?'}`")
        cols = st.columns(4)
        cols[0].metric("heads", acc.shape[0])
        cols[1].metric("top-k", acc.shape[1])
        cols[2].metric("positions", len(ranks))
        cols[3].metric("prompts", ranks["prompt_id"].nunique())
        if not len(ranks):
            st.info(f"the {split} split of this calibration is empty")
            return
    left, right = st.columns(2)
    with left:
        chart(interactive_figures.accuracy_chart(acc),
              "a_k^(i): share of positions where head k's rank-i guess is the token (hover a cell for its value).",
              key="cal_acc_chart")
    with right:
        chart(interactive_figures.topk_chart(acc), "Top-k accuracy: the running sum over ranks.", key="cal_topk_chart")
    st.download_button("accuracies.csv", accuracy_frame(acc).to_csv(index=False), file_name="accuracies.csv",
                       key="cal_download", on_click="ignore")
    _acceptance_view(src, acc, split if src.calib else None)
    st.subheader("Independence vs measured path probability")
    if not src.calib:
        st.info("Measured path probabilities need the ranks of a calibration folder; an accuracy table has only "
                "the per-head marginals.")
        return
    n = st.slider("top paths (by measured probability)", 5, 200, 40, key="cal_top")
    df = src.calib.path_comparison(split, n)
    left, right = st.columns(2)
    with left:
        chart(interactive_figures.paths_chart(list(df["path"]), df["independence"], df["measured"]),
              "Above the diagonal the independence assumption under-estimates a path; below it over-estimates. "
              "Hover a point for its path; drag to zoom.", key="cal_paths_chart")
    df["path"] = [str(list(p)) for p in df["path"]]
    right.dataframe(df, hide_index=True, column_config={
        "path": st.column_config.TextColumn(help="0-based ranks, one per head (0 = top-1)", width="small"),
        "depth": st.column_config.NumberColumn(width="small"),
        "measured": st.column_config.NumberColumn(
            format="%.4f",
            help="share of ALL positions whose heads' ranks start with this path (past the answer's end counts as a "
                 "miss: the decoder cannot accept tokens the answer does not have)"),
        "independence": st.column_config.NumberColumn(
            "indep.", format="%.4f",
            help="product of a_k^(i); each a_k^(i) is a share of only the positions where head k HAS a target (it "
                 "excludes the last k positions of each answer)"),
        "measured / independence": st.column_config.NumberColumn(
            "ratio", format="%.3f",
            help="measured / independence; 1 = heads independent. The two use different denominators, so even a "
                 "one-head path [i] reads below 1 (about positions with a head-k target / all positions): that part "
                 "is the answer's end, not head correlation")})
    right.caption("measured / independence < 1 for one-head paths is the denominators, not an error: measured counts "
                  "over all positions, a_k^(i) over the positions where head k has a target.")


def _vllm_counters() -> tuple[str, dict] | None:
    """The longest chain a `workbench vllm-check` result measured (vllm-check*.json in the results folder, the first
    by name): (its file name, its acceptance row), or None when there is none or it does not read."""
    for path in sorted(results_root().glob("vllm-check*.json")):
        try:
            res = json.loads(path.read_text())
            row = max(res["acceptance"], key=lambda r: r["k"])
            return f"{path.name}, vLLM {res.get('vllm_version', '?')}", row
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


MAX_SERVED = 4  # served calibrations set beside ours on the acceptance chart (the first by name)


def _served_rates() -> dict[str, list[float]]:
    """{label: per-decoding-step acceptance per position (Served.rates, what a plan reads)} of the served
    calibrations (`calibrate --engine vllm` or `--metrics`: vLLM's own counters, any drafter) under the calibration
    root and the results folder's served/; one that does not read is left out."""
    out = {}
    for folder in served_folders()[:MAX_SERVED]:
        try:
            served = Served(folder)
            m = served.meta
            out[f"vLLM served {m.get('method')}, K={served.counts.k} ({folder.name}, {m.get('prompts') or '?'})"] = \
                served.rates()
        except WorkbenchError:
            continue
    return out


def _served_view(src) -> None:
    """A served calibration: what the engine counted per position (conditional and per draft) and the per-step
    rates a plan reads, beside the other served calibrations found."""
    served, c = src.served, src.served.counts
    st.caption(f"Served calibration {src.label}: {served_facts(src)}.")
    cols = st.columns(4)
    cols[0].metric("drafter", served.meta.get("method") or "?")
    cols[1].metric("K", c.k)
    cols[2].metric("drafts", f"{c.drafts:,}")
    cols[3].metric("mean acceptance length", f"{c.totals()['mean_acceptance_length']:.3f}",
                   help="1 + accepted / drafts: tokens per step that drafted (a step without a draft is not counted)")
    st.dataframe(c.table(), hide_index=True, column_config={
        "drafts": st.column_config.NumberColumn(help="drafts that reached the position (all of them at 1)"),
        "conditional": st.column_config.NumberColumn(format="%.3f", help="accepted / drafts that reached it"),
        "marginal": st.column_config.NumberColumn(format="%.3f", help="accepted / all drafts (vLLM's per-position "
                                                                     "acceptance rate)")})
    series = {f"{src.label} (as a plan reads it)": served.rates()}
    series |= {k: v for k, v in _served_rates().items() if f"({src.label}," not in k}
    chart(interactive_figures.acceptance_chart(series),
          "The share of decoding steps whose first k drafted tokens were all accepted"
          + (", drafted or not (the steps were counted)" if c.decode_steps else " (per draft: the steps were not "
             "counted)") + "; the other served calibrations found beside it. Heads' accuracies and path "
          "probabilities are our calibrations' (Medusa heads): a served drafter has neither.",
          key="cal_acceptance_chart")


def _acceptance_view(src, acc, split: str | None) -> None:
    """Acceptance per draft position over the calibration (measured joint paths and the independence product),
    beside vLLM's counters and our decoder's when a vllm-check result exists."""
    depth = acc.shape[0]
    series = {}
    if split is not None:
        series[f"calibration, measured ({split})"] = chain_values(src.calib.joint_value(split), depth)
    series["independence (a_k^(0) products)"] = chain_values(acc_value_fn(acc), depth)
    found = _vllm_counters()
    if found is not None:
        name, row = found
        series[f"vLLM, K={row['k']} ({name})"] = row["vllm_acceptance_per_pos"]
        series[f"our decoder, K={row['k']} (same prompts)"] = row["ours_acceptance_per_pos"]
    served = _served_rates()
    series.update(served)
    chart(interactive_figures.acceptance_chart(series),
          "The share of steps whose first k top-1 drafts were all accepted (a position past the last positive one is "
          "left out)" + ("; vLLM's and our decoder's counters are from `workbench vllm-check`, on its prompts."
                         if found else "; no `workbench vllm-check` result found to set beside it.")
          + (" Served calibrations (vLLM's own counters for any drafter it ran, on their own prompts) are per "
             "decoding step, drafted or not, as a plan reads them." if served else ""),
          key="cal_acceptance_chart")
