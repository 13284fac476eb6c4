"""The trade-offs page's "Plan per batch size" tab: `workbench plan` (plan.rank.make_plan, the one weighing) on the
sidebar's calibration and a latency table with several batch sizes: the choice at each batch size, its predicted
speedup by kind against batch size, the live check where the chosen sweep is a `sweep --plan`, and the plan with each
engine's file to download. A served calibration (vLLM's counters for any drafter) plans a chain's K per batch size,
as `workbench plan --calibration SERVED` does; it goes out as the engines' per-batch-size schedules only.
"""
from __future__ import annotations

import json
from pathlib import Path

import streamlit as st

from workbench import WorkbenchError
from workbench.calibrate.served import Served
from workbench.core.notes import worded
from workbench.export.engines import PLAN_FORMATS, SCHEDULE_FORMATS, SUFFIXES, export_plan
from workbench.measure.latency_checks import deciding, off_trend, outlier_words
from workbench.plan.plan_file import check_plan, plan_check, plan_json, speedups_by_kind
from workbench.plan.rank import make_plan
from workbench.plan.source import calibration_source, served_source
from workbench.ui.tree_export import EXPORT_FIXES
from workbench.ui.widgets import app_names, chart, clean_error, drop_stale, file_stamp, relative_paths
from workbench.viz import interactive_tradeoffs

# a plan export's error names the batch size by this page's control (core.notes.FieldError; the CLI: --batch-sizes)
EXPORT_LABELS = {"batch_sizes": "batch size to export"}


def plan_label(row: dict) -> str:
    return {"none": "no speculation", "chain": f"chain K={row['nodes']}"}.get(row["kind"], f"tree of {row['nodes']}")


def plan_section(src, lat, lat_path: Path, sweep, sweep_path, max_new_tokens: int | None) -> None:
    """The plan per batch size (tree, chain or none) on a latency table with several batch sizes: predicted
    speedup of each kind against batch size, the live check where the chosen sweep is a `sweep --plan`, and the plan
    with each engine's output to download."""
    opened = None if src is None else src.served if src.served is not None else src.calib
    if lat is None or "batch" not in lat.columns or lat["batch"].nunique() < 2 or opened is None:
        st.info("A plan per batch size needs a calibration folder (ours or a served one) and a latency table measured "
                "at several batch sizes (`workbench latency --batch-sizes 1,2,4,8`).")
        return
    served = src.served is not None
    batches = sorted(int(b) for b in lat["batch"].unique())
    try:
        text = _cached_plan(str(src.folder), src.stamp, opened, str(lat_path), file_stamp(lat_path), tuple(batches),
                            None if served else max_new_tokens)
    except WorkbenchError as e:
        st.error(clean_error(e))
        return
    plan = check_plan(json.loads(text))  # as `workbench export` reads it: each row with its tree
    rows = plan["plans"]
    ctx = plan["latency"]["context"]
    found = off_trend(lat, ctx)
    sizes = {b: lat.loc[(lat["batch"] == b) & (lat["context"] == ctx), "tokens"] for b in batches}
    odd = {r["batch_size"]: deciding(found, r["batch_size"], r["nodes"] + 1, sizes[r["batch_size"]]) for r in rows}
    st.markdown("; ".join(f"batch {r['batch_size']}: **{plan_label(r)}** {r['predicted_speedup']:.2f}x"
                          + (" (on an odd latency point)" if odd[r["batch_size"]] else "") for r in rows))
    odd_notes = st.container()
    for b, f in odd.items():
        if f:
            odd_notes.warning(f"Batch {b}'s row rests on latency measurements off their trend: "
                              + "; ".join(outlier_words(x) for x in f) + f". Re-measure {lat_path.name} at batch {b}.",
                              icon=":material/warning:")
    # a sweep decodes Medusa heads: no evidence about a served drafter (`vllm-check --plan` measures that one)
    measured = plan_check(plan, sweep) if not served and sweep is not None and "batch_size" in sweep.columns else None
    live = measured is not None and len(measured) > 0
    check = ("; `workbench vllm-check --calibration DIR --plan PLAN.json` measures it in vLLM (the vLLM check tab "
             "shows a result)" if served else "; run `workbench sweep --plan PLAN.json` for the live check")
    chart(interactive_tradeoffs.plan_chart(speedups_by_kind(plan), measured),
          f"latency {lat_path.name} at context {ctx}; tokens/step "
          f"{plan['source']['prediction']}. Lines: the best the plan weighed of each kind; stars: its choice"
          + (f"; diamonds: {sweep_path.name}, decoded live at each batch size." if live else check + "."),
          key="to_plan_chart")
    _plan_exports(plan, text, f"plan-{lat_path.stem}", [r["batch_size"] for r in rows],
                  (src.served.meta.get("method") or "served") if served else None)


def _plan_exports(plan: dict, text: str, name: str, batches: list[int], served: str | None) -> None:
    """The plan file and each engine's output, for the batch size picked (the schedules cover them all); every
    warning and note below, in an expander, readable at any width. Paths relative to the repository. A served
    drafter's plan (`served`: its vLLM method) goes out as the schedules alone: the tree formats hold Medusa trees."""
    formats = SCHEDULE_FORMATS if served else PLAN_FORMATS
    c1, c2 = st.columns([1, 3])
    b = batches[0]
    if served:
        c2.caption(f"Downloads: the plan and the {served} drafter's K per batch size for each engine. The tree "
                   f"formats ({', '.join(f for f in PLAN_FORMATS if f not in SCHEDULE_FORMATS)}) hold Medusa heads' "
                   "trees: not for this drafter.")
    else:
        drop_stale("to_plan_batch", batches)
        b = c1.selectbox("batch size to export", batches, key="to_plan_batch",
                         help="the static formats (vllm-tree, trtllm, medusa, eagle, json) serve one tree: this row's; "
                              "the schedules (" + ", ".join(SCHEDULE_FORMATS) + ") hold the plan's K at every batch "
                              "size")
        c2.caption(f"Downloads: the plan, the schedules (every batch size) and batch {b}'s tree in each static "
                   "format.")
    cols = st.columns(len(formats) + 1)
    cols[0].download_button("plan", text, file_name=f"{name}.json", key="to_plan_download", on_click="ignore",
                            help="the plan file (`workbench export PLAN --format ...` reads it)")
    said = []
    for col, fmt in zip(cols[1:], formats):
        every = fmt in SCHEDULE_FORMATS
        try:
            out, warns, notes = export_plan(plan, fmt, batch_size=None if every else b)
        except WorkbenchError as e:
            why = clean_error(e, EXPORT_LABELS)
            col.button(fmt, key=f"to_plan_{fmt}_off_btn", disabled=True, help=why)
            said.append(f"**{fmt}**: not exported: {why}")
            continue
        col.download_button(fmt, relative_paths(out), key=f"to_plan_{fmt}_download", on_click="ignore",
                            file_name=f"{name}{'' if every else f'-b{b}'}{SUFFIXES.get(fmt, '.txt')}",
                            help=f"the plan for {fmt}" + (", every batch size" if every else f", batch {b}'s row"))
        said += [f"**{fmt}**: {w.words(EXPORT_FIXES)}" for w in warns] + \
            [f"**{fmt}**: {worded(n, app_names(EXPORT_LABELS))}" for n in notes]
    with st.expander(f"Export notes and warnings ({len(said)})"):
        st.markdown("\n".join(f"- {relative_paths(n)}" for n in said) or "none")


@st.cache_data(show_spinner="planning per batch size ...")
def _cached_plan(folder: str, folder_stamp: tuple, _opened, latency: str, latency_stamp: tuple, batches: tuple,
                 max_new_tokens: int | None = None) -> str:
    """The plan file's text for this calibration and latency table (paths by name only), once per version of both.
    `_opened`: the page's open folder (named by `folder` and its stamp), a Calibration whose replays the designer has
    already walked (opening it again cost a fresh server's first trade-offs visit ~0.2 s) or a Served one, whose
    source is `workbench plan --calibration SERVED`'s (source.served_source)."""
    source = served_source(_opened) if isinstance(_opened, Served) else \
        calibration_source(_opened, max_new_tokens=max_new_tokens)
    plan = make_plan(source, latency, batches)
    plan["latency"]["file"] = Path(latency).name  # no server path in a downloaded plan
    plan["source"]["path"] = Path(folder).name
    return plan_json(plan)
