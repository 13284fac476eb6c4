"""The trade-offs page's "Static vs per-step" tab: at every budget the latency table timed per-step trees at, the
optimal static tree and the per-step tree of as many nodes, side by side at the sidebar's batch size, as the plan
prices them (plan.rank.equal_budgets: the one weighing's prices), with what a sweep that decoded both (`sweep --envelope`)
measured beside each. Answers "static or per-step at budget N on this machine?" where both were timed."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from workbench import WorkbenchError
from workbench.core.speed import within_noise
from workbench.plan.rank import equal_budgets
from workbench.plan.source import plan_source
from workbench.ui.widgets import clean_error, file_stamp

COLUMNS = {
    "nodes": st.column_config.NumberColumn(width="small"),
    "kind": st.column_config.TextColumn(help="static: the optimal tree of N nodes, every step; per-step: the N nodes "
                                             "of best path score chosen each step from the envelope"),
    "tokens/step": st.column_config.NumberColumn(format="%.3f", help="predicted: the calibration's replay"),
    "step cost": st.column_config.NumberColumn(format="%.2fx", help="the step's cost over a plain step, from the "
                                                                   "latency table's rows of this kind"),
    "speedup": st.column_config.NumberColumn(format="%.3fx", help="predicted decoding speedup over plain"),
    "range": st.column_config.TextColumn(help="the speedup over the latency table's quartiles"),
    "measured tokens/step": st.column_config.NumberColumn(format="%.3f", help="the sweep's, decoded live"),
    "measured speedup": st.column_config.NumberColumn(format="%.3fx", help="the sweep's decoding-phase speedup"),
}


@st.cache_data(show_spinner="pricing static and per-step trees ...")
def _priced(folder: str, folder_stamp: tuple, latency: str, latency_stamp: tuple, batch: int, context: int | None,
            max_new_tokens: int | None) -> tuple[list[dict], dict | None]:
    return equal_budgets(plan_source(calibration=folder, max_new_tokens=max_new_tokens), latency, [batch], context)


def measured(sweep: pd.DataFrame | None, batch: int) -> dict[tuple[str, int], dict]:
    """{(kind, nodes): the first greedy sweep row at this batch size} for static trees and per-step ones."""
    if sweep is None or "kind" not in sweep.columns or "batch_size" not in sweep.columns:
        return {}
    rows = sweep[(sweep["batch_size"] == batch) & (sweep["acceptance"] == "greedy") & (sweep["kind"] != "vanilla")]
    out = {}
    for r in rows.to_dict("records"):
        key = ("per-step" if r["kind"] == "dynamic" else "static", int(r["nodes"]))
        out.setdefault(key, r)
    return out


def frame(rows: list[dict], found: dict) -> pd.DataFrame:
    """One row per (budget, kind): the prediction, and the sweep's measurement where it decoded that kind and size."""
    out = []
    for r in rows:
        m = found.get((r["kind"], r["nodes"]), {})
        speed = m.get("decode_speedup")
        speed = m.get("speedup") if speed is None or speed != speed else speed  # NaN: a sweep without the split
        out.append({"nodes": r["nodes"], "kind": r["kind"], "tokens/step": r["tokens_per_step"],
                    "step cost": r["step_ratio"], "speedup": r["speedup"],
                    "range": f"{r['range'][0]:.2f}..{r['range'][1]:.2f}" if r["range"] else "",
                    "measured tokens/step": m.get("tokens_per_step"), "measured speedup": speed})
    return pd.DataFrame(out, columns=list(COLUMNS))


def verdict(rows: list[dict]) -> str:
    """Per budget, which kind the plan prices faster (a tie where the two ranges overlap)."""
    said = []
    for n in sorted({r["nodes"] for r in rows}):
        at = {r["kind"]: r for r in rows if r["nodes"] == n}
        if len(at) < 2:
            continue
        s, d = at["static"], at["per-step"]
        tie = within_noise(s["range"], d["range"])
        best = "per-step" if d["speedup"] > s["speedup"] else "static"
        said.append(f"{n}: **{best}**" + (" (within noise)" if tie else ""))
    return ", ".join(said)


def per_step_section(src, lat_path, tables, sweep, sweep_path, max_new_tokens: int | None) -> None:
    """The tab at the sidebar's batch size and context (`tables`, the surface.At inputs.latency_picker picked)."""
    if src is not None and src.served is not None:
        st.info(f"Per-step trees choose among a Medusa tree's nodes each step: the served calibration {src.label}'s "
                "drafter drafts one chain of K tokens (its K per batch size: the plan tab).")
        return
    if src is None or src.calib is None or lat_path is None or tables is None:
        st.info("Static vs per-step trees need a calibration folder and a latency table (sidebar).")
        return
    try:
        batch = int(tables.batch)
        rows, info = _priced(str(src.calib.folder), src.stamp, str(lat_path), file_stamp(lat_path), batch,
                             int(tables.context), max_new_tokens)
    except WorkbenchError as e:
        st.error(clean_error(e))
        return
    if info is None:
        st.info(f"{lat_path.name} timed no per-step trees: `workbench latency --envelope TREE` times them beside "
                "the static trees of as many tokens.")
        return
    if not rows:
        st.info(f"Per-step trees not priced: {clean_error(info.get('why', ''))}")
        return
    st.markdown(f"Static or per-step at batch {batch}, by budget (the faster as the plan prices it): "
                f"{verdict(rows)}.")
    found = measured(sweep, batch)
    st.dataframe(frame(rows, found), hide_index=True, column_config=COLUMNS)
    st.caption(f"Per-step trees chosen each step from the calibration's best {info['envelope']} nodes; both kinds "
               f"priced on their own rows of {lat_path.name}. "
               + (f"Measured: {sweep_path.name}." if found else
                  "Run `workbench sweep --envelope TREE` to measure both live (the sweep in the sidebar has neither)."))
