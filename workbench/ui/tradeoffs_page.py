"""Page 3, the trade-offs (/tradeoffs): the recommendation with its evidence, then the sweep results (paper Fig. 4
and 5), latency with its spread, and the predicted speedup against what sweeps measured.

Reads the sweep and latency CSVs found in the calibration and results folders (or given).
"""
from __future__ import annotations

import json
from pathlib import Path

import streamlit as st

from workbench import WorkbenchError
from workbench.calibrate.folder import PREDICTED_COLUMNS
from workbench.core.notes import worded
from workbench.export.engines import PLAN_FORMATS, SUFFIXES, export_plan
from workbench.measure.latency_checks import deciding, off_trend, outlier_words
from workbench.measure.sweep_file import has_typical
from workbench.plan.rank import make_plan
from workbench.plan.plan_file import check_plan, plan_check, plan_json, speedups_by_kind
from workbench.plan.source import calibration_source
from workbench.ui.recommendation import (candidate_curves, measured_beside, panel, provenance_of, ranked,
                                         readable_sweeps)
from workbench.ui.tree_page import RECOMMENDED, tree_page
from workbench.ui.tree_export import EXPORT_FIXES
from workbench.ui.inputs import fragment, shared_inputs
from workbench.ui.per_step_view import per_step_section
from workbench.ui.widgets import (app_names, chart, clean_error, drop_stale, file_input, file_stamp, found_csvs,
                                  fastest_for, read_sweep_file, read_sweep_or_error, relative_paths, results_root,
                                  slider, timed)
from workbench.viz import interactive_tradeoffs

# a plan export's errors and notes name the batch size by this page's control (core.notes; the CLI: --batch-sizes)
EXPORT_LABELS = {"batch_sizes": "batch size to export"}

# The sweep's rows as a table that fits a 1280 px page (the CSV has some 40 columns: all of them download beside it).
SWEEP_SHOWN = {
    "tree": st.column_config.TextColumn(help="the tree (vanilla: plain decoding, the baseline)"),
    "nodes": st.column_config.NumberColumn(width="small"),
    "batch_size": st.column_config.NumberColumn("batch", width="small"),
    "acceptance": st.column_config.TextColumn("accept", help="greedy, typical or nucleus acceptance"),
    "temperature": st.column_config.NumberColumn("T", format="%.2g", width="small"),
    "epsilon": st.column_config.NumberColumn("eps", format="%.3g", width="small",
                                             help="typical acceptance's posterior threshold"),
    "tokens_per_step": st.column_config.NumberColumn("tokens/step", format="%.3f", width="small"),
    "speedup": st.column_config.NumberColumn(format="%.3fx", width="small",
                                             help="tokens/s over the vanilla baseline measured just before it"),
    "tokens_per_s": st.column_config.NumberColumn("tokens/s", format="%.1f", width="small"),
    "predicted_replay": st.column_config.NumberColumn("replay", format="%.3f", width="small",
                                                      help="predicted tokens/step: the calibration's replay"),
    "exact_match": st.column_config.NumberColumn("exact", format="%.2f", width="small",
                                                 help="share of answers equal to plain greedy decoding's"),
    "num_prompts": st.column_config.NumberColumn("prompts", width="small"),
}
# the first opens by default: a constant default keeps the open tab when the data change (a default that follows
# the data would reset it); the latency and speedup curves exist for every latency table, a plan only for several
# batch sizes
TABS = ("Latency and speedup", "Plan per batch size", "Static vs per-step", "Sweep (Fig. 4)",
        "Typical acceptance (Fig. 5)", "vLLM check")
SWEEP_CONSTANT = ("batch_size", "acceptance", "temperature", "epsilon", "num_prompts")  # a caption


def _show_in_designer(tree) -> None:
    """The recommended tree on display in the designer (/tree)."""
    st.session_state["tree_show"] = RECOMMENDED + tree.name
    st.session_state.pop("tree_edit", None)
    st.session_state["to_goto_designer"] = True


def _vllm_check_panel(path) -> None:
    """Read-only: a `workbench vllm-check` result, vLLM's measured tokens/step beside our decoder's and the
    prediction (vllm_check.check_table's first table)."""
    import pandas as pd

    try:
        res = json.loads(Path(path).read_text())
        rows = [{"K": r["k"], "vLLM tokens/step": r["vllm_mean_accepted_length"],
                 "our decoder": r["ours_mean_accepted_length"], "predicted": r[r["prediction"]],
                 "prediction vs vLLM": f"{100 * r['prediction_error']:+.1f}%",
                 "vLLM lossless": all(c["identical"] == c["prompts"] for c in r["vllm_spec_vs_vllm_plain"].values())}
                for r in res["acceptance"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        st.error(f"{Path(path).name}: not a readable `workbench vllm-check` JSON ({type(e).__name__})")
        return
    st.subheader(f"Confirmed in vLLM {res.get('vllm_version', '?')}")
    st.caption(f"{len(res.get('prompt_ids', []))} {res.get('prompts')} prompts, greedy fp32; {res.get('note', '')}")
    st.dataframe(pd.DataFrame(rows), hide_index=True)
    if res.get("plan_check"):  # the plan's speed beside vLLM's, on prompts other than its surface's
        on = res.get("priced_on") or {}
        st.subheader("The plan's speedup in vLLM")
        st.caption(f"Priced on {on.get('engine')} {on.get('engine_version') or ''} step costs ({on.get('file')}); "
                   "measured: vLLM's decoding phase, median (q1..q3) over repeated passes, "
                   f"{res.get('surface_prompts_left_out', 0)} of the surface's prompts left out."
                   + ("" if on.get("engine") == "vllm" else " Not priced on vLLM: `workbench latency --engine vllm` "
                                                             "measures its surface."))
        st.dataframe(pd.DataFrame([{
            "batch": r["batch_size"], "plan's K": r["plan_k"], "predicted": r["predicted_speedup"],
            "measured": r["measured_speedup"], "q1..q3": "-" if not r["measured_range"] else
            f"{r['measured_range'][0]:.3f}..{r['measured_range'][1]:.3f}",
            "predicted vs measured": "-" if r["error"] is None else f"{100 * r['error']:+.1f}%",
            "vLLM's best K": r["best_k"], "best or within noise": r["choice_is_best_or_within_noise"]}
            for r in res["plan_check"]]), hide_index=True)
    if res.get("plain_step"):  # the engines' plain steps, timed side by side
        st.subheader("Plain decoding: vLLM and our decoder")
        st.caption(f"Milliseconds per token while decoding, vLLM ({res.get('vllm_compilation') or '?'}) and our "
                   "decoder (eager), each of our passes right after vLLM's on the same prompts; ours / vLLM: median "
                   "(q1..q3) over passes.")
        st.dataframe(pd.DataFrame([{
            "batch": r["batch_size"], "vLLM ms": r["vllm_ms"], "ours ms": r["ours_ms"], "ours / vLLM": r["ratio"],
            "q1..q3": f"{r['ratio_q1']:.3f}..{r['ratio_q3']:.3f}"} for r in res["plain_step"]]), hide_index=True)


def tradeoffs_page() -> None:
    with timed("page /tradeoffs"):
        _tradeoffs_page()


def _tradeoffs_page() -> None:
    if st.session_state.pop("to_goto_designer", False):  # set by the button's callback (no switch in callbacks)
        _goto_designer()
    st.title("Trade-offs")
    sweeps = found_csvs("sweep")
    typical = [f for f in sweeps if _readable_typical(f)]
    shared = shared_inputs()
    src, hw = shared.src, shared.lat
    lat_path, lat, tables, surface = (hw["path"], hw["frame"], hw["tables"], hw["surface"]) if hw else (None,) * 4
    with st.sidebar:
        st.subheader("Sweep (Fig. 4, predicted vs measured)")
        sweep_path = file_input("sweep CSV", "to_sweep", ["csv"], sweeps)
        st.subheader("Typical-acceptance sweep (Fig. 5)")
        typ_path = file_input("typical sweep CSV", "to_typ", ["csv"], sweeps, default=typical[0] if typical else None)
        st.subheader("vLLM check")
        vllm_path = file_input("vllm-check JSON", "to_vllm", ["json"], sorted(results_root().glob("vllm-check*.json")))
    sweep, typ = read_sweep_or_error(sweep_path), read_sweep_or_error(typ_path)
    notes = st.container()  # a fixed place for what comes and goes: the figures keep theirs (recommendation.panel)
    if hw is None:
        notes.info("No latency table: run `workbench latency`, or give one in the sidebar (Hardware).")
    if sweep_path is None:
        notes.info("No sweep CSV found: run `workbench sweep --out FILE.csv` (for example into the calibration "
                   "folder), or give one in the sidebar.")

    # the answer first: the same recommendation as the designer's, every readable sweep as its evidence
    rec = None
    evidence = readable_sweeps([p for p, df in ((sweep_path, sweep), (typ_path, typ)) if df is not None])
    with st.container():  # the answer's place, whatever it draws
        if tables is not None and src is not None:
            rec = ranked(src, lat_path, tables, evidence, max_new_tokens=shared.max_new_tokens)
            if rec is not None:
                panel(rec, "to", src.acc.shape[0],
                      provenance_of(src) | dict(method="recommended", latency=lat_path.name),
                      show=_show_in_designer, show_label="open in the designer")
        elif src is None:
            st.info("The recommendation and the predicted-speedup curve need accuracies (a calibration folder or "
                    "table).")
    sections(src, lat, lat_path, tables, surface, rec, evidence, sweep, sweep_path, typ, typ_path, vllm_path,
             shared.max_new_tokens)


@fragment
def sections(src, lat, lat_path, tables, surface, rec, evidence, sweep, sweep_path, typ, typ_path, vllm_path,
             max_new_tokens) -> None:
    """One section at a time, in a fragment: a tab switch (or a pick inside a tab) reruns and redraws the open tab
    alone, not the answer above it. With several batch sizes the page opens on its plan per batch size (its answer,
    and one figure, not three); the default is fixed at the first view: a changed default would be a new widget,
    dropping the open tab."""
    with timed("fragment tradeoffs tabs"):
        several = lat is not None and "batch" in lat.columns and lat["batch"].nunique() > 1
        first = st.session_state.setdefault("to_tab_first", "Plan per batch size" if several else TABS[0])
        tabs = dict(zip(TABS, st.tabs(TABS, key="to_tab", on_change="rerun", default=first)))
        with tabs["Latency and speedup"]:
            if tabs["Latency and speedup"].open:
                _speedup_section(src, lat, lat_path, tables, surface, rec, evidence)
        with tabs["Plan per batch size"]:
            if tabs["Plan per batch size"].open:
                _plan_section(src, lat, lat_path, sweep, sweep_path, max_new_tokens)
        with tabs["Static vs per-step"]:
            if tabs["Static vs per-step"].open:
                per_step_section(src, lat_path, tables, sweep, sweep_path, max_new_tokens)
        with tabs["Sweep (Fig. 4)"]:
            if tabs["Sweep (Fig. 4)"].open:
                _sweep_section(sweep, sweep_path)
        with tabs["Typical acceptance (Fig. 5)"]:
            if tabs["Typical acceptance (Fig. 5)"].open:
                _typical_section(typ, typ_path)
        with tabs["vLLM check"]:
            if tabs["vLLM check"].open:
                if vllm_path is not None:
                    _vllm_check_panel(vllm_path)
                else:
                    st.info("No `workbench vllm-check` result found (vllm-check*.json in the results folder).")


def _sweep_section(sweep, sweep_path) -> None:
    """Paper Fig. 4 from the chosen sweep, predicted against measured tokens/step, and its rows."""
    if sweep is None:
        st.info("No sweep to draw: pick or give a sweep CSV in the sidebar.")
        return
    st.subheader(f"Sweep {sweep_path.name}")
    st.caption(f"{len(sweep)} rows")
    c1, c2 = st.columns(2)
    speed = "tokens_per_s" if "tokens_per_s" in sweep.columns and sweep["tokens_per_s"].notna().any() else "speedup"
    with c1:
        chart(interactive_tradeoffs.sweep_chart(sweep, "tokens_per_step", "tokens per step",
                                              "tokens per step vs candidates"),
              "Paper Fig. 4a: sparse (optimal) vs dense trees; hover a point for its trees.", key="to_fig4a_chart")
    with c2:
        chart(interactive_tradeoffs.sweep_chart(sweep, speed, "tokens / s" if speed == "tokens_per_s" else "speedup",
                                              "speed vs candidates"),
              "Paper Fig. 4b.", key="to_fig4b_chart")
    if any(c in sweep.columns for c in PREDICTED_COLUMNS):
        chart(interactive_tradeoffs.predicted_chart(sweep),
              "Calibration's predictions vs the live decoder's tokens per step (hover a point for its tree).",
              key="to_predicted_chart")
    with st.expander("Sweep rows"):
        have = [c for c in SWEEP_SHOWN if c in sweep.columns and sweep[c].notna().any()]
        same = {c: sweep[c].dropna().iloc[0] for c in have
                if c in SWEEP_CONSTANT and sweep[c].nunique(dropna=False) == 1}
        shown = [c for c in have if c not in same]
        st.dataframe(sweep[shown], hide_index=True, column_config={c: SWEEP_SHOWN[c] for c in shown})
        if same:
            st.caption("On every row: " + ", ".join(f"{SWEEP_SHOWN[c].get('label') or c} {v}"
                                                    for c, v in same.items()) + ".")
        st.download_button(f"{sweep_path.name}: all {len(sweep.columns)} columns", sweep.to_csv(index=False),
                           file_name=sweep_path.name, key="to_sweep_download", on_click="ignore",
                           help="every column the sweep wrote (docs/formats.md names them)")


def _typical_section(typ, typ_path) -> None:
    """Paper Fig. 5: tokens/step and a quality measure against typical acceptance's epsilon."""
    if typ is None or not has_typical(typ):
        st.info("No typical-acceptance rows (epsilon) in the sweeps found: run the sweep with --temperature > 0 "
                "and several --epsilon values for Fig. 5.")
        return
    rows = typ.dropna(subset=["epsilon"])
    sizes = sorted(int(n) for n in rows["nodes"].dropna().unique())
    qualities = [c for c in ("exact_match", "mean_logprob", "distinct_2") if c in typ.columns] or ["tokens_per_step"]
    c1, c2, c3 = st.columns(3)
    drop_stale("to_quality", qualities)
    quality = c1.selectbox("quality measure", qualities, key="to_quality")
    drop_stale("to_nodes", sizes)
    nodes = c2.selectbox("tree size (nodes)", sizes, key="to_nodes") if len(sizes) > 1 else None
    rows = rows if nodes is None else rows[rows["nodes"] == nodes]
    eps_values = sorted(float(e) for e in rows["epsilon"].unique())
    drop_stale("to_eps", eps_values)
    eps = c3.select_slider("epsilon (posterior threshold)", eps_values, key="to_eps",
                           value=min(eps_values, key=lambda e: abs(e - 0.09))) \
        if len(eps_values) > 1 else eps_values[0]
    at = rows[rows["epsilon"] == eps]
    chart(interactive_tradeoffs.epsilon_chart(typ, quality, mark=eps, nodes=nodes),
          f"Paper Fig. 5 ({typ_path.name}): typical acceptance. At epsilon {eps:g}: "
          f"{at['tokens_per_step'].mean():.2f} tokens/step, {quality} {at[quality].mean():.3f} "
          "(mean over temperatures).", key="to_fig5_chart")


def _speedup_section(src, lat, lat_path, tables, surface, rec, evidence) -> None:
    """The latency table with its spread, and the predicted speedup of the optimizer's trees at every budget beside
    the recommendation's candidates and the sweeps' measurements."""
    if lat is None:
        st.info("No latency table: pick or give one in the sidebar.")
        return
    c1, c2 = st.columns(2)
    with c1:
        chart(interactive_tradeoffs.latency_chart(lat),
              f"latency {lat_path.name}: ms per verify forward; error bars: the spread of the repeats where the CSV "
              "has it.", key="to_latency_chart")
        if tables is not None:
            ctx = tables.context
            chart(interactive_tradeoffs.surface_chart(lat, ctx, off_trend(lat, ctx)),
                  "What a step of n tokens costs relative to the plain step at the same batch size (a tree of n - 1 "
                  "nodes pays this for its extra tokens); error bars: the repeats' quartiles; x: a point off its "
                  "neighbours by more than their spread.", key="to_surface_chart")
    with c2:
        if src is None or tables is None:
            return
        top = max(tables.seconds) - 1
        budget = slider("budget (max tree nodes)", 1, max(top, 1), top, key="to_budget", where=st,
                        help="the largest tree the optimizer's curves below try (the recommendation above ranks "
                             "every size the latency table covers)")
        K, R = src.acc.shape
        values = {"independence": src.acc}
        if src.calib:
            values["empirical paths"] = src.calib.joint_value("fit")
        try:
            res = {name: fastest_for(src.key, name, v, surface, tables, K, min(R, 10), budget) for name, v in values.items()}
        except WorkbenchError as e:
            st.error(clean_error(e))
            return
        found = measured_beside(evidence, tables.batch, lat)
        curves = candidate_curves(rec) if rec else {}
        curves |= {f"objective ({n})": ([c.nodes for c in r["curve"]], [c.speedup for c in r["curve"]])
                   for n, r in res.items()}
        picks = {f"best ({n})": (r["best"].nodes, r["best"].speedup) for n, r in res.items()}
        if rec:
            picks["recommended"] = (rec["pick"]["nodes"], rec["pick"]["speedup"])
        measured = [m for ms in found.values() for m in ms]
        chart(interactive_tradeoffs.speedup_chart(curves, picks, measured,
                                                title=f"predicted speedup, batch {tables.batch}, context "
                                                      f"{tables.context}"),
              (f"optimal trees and chains: the recommendation's numbers ({rec['prediction']}; recommended: "
               f"{rec['pick']['label']}). " if rec else "")
              + f"objective: the optimizer's expected tokens per step / (t(n+1)/t(1)) at context {tables.context}; "
              "best: " + "; ".join(f"{n} {_plan_label(vars(r['best']))}, {r['best'].speedup:.2f}x" for n, r in res.items())
              + " (plan's ranking of these trees, the chains and no speculation)"
              + ". Diamonds: sweep measurements (hollow grey: another setting, or one not recorded).",
              key="to_speedup_chart")


def _plan_section(src, lat, lat_path: Path, sweep, sweep_path, max_new_tokens: int | None) -> None:
    """The plan per batch size (tree, chain or none) on a latency table with several batch sizes: predicted
    speedup of each kind against batch size, the live check where the chosen sweep is a `sweep --plan`, and the plan
    with each engine's output to download."""
    if lat is None or "batch" not in lat.columns or lat["batch"].nunique() < 2 or src is None or src.calib is None:
        st.info("A plan per batch size needs a calibration folder and a latency table measured at several batch "
                "sizes (`workbench latency --batch-sizes 1,2,4,8`).")
        return
    batches = sorted(int(b) for b in lat["batch"].unique())
    try:
        text = _cached_plan(str(src.calib.folder), src.stamp, src.calib, str(lat_path), file_stamp(lat_path),
                            tuple(batches), max_new_tokens)
    except WorkbenchError as e:
        st.error(clean_error(e))
        return
    plan = check_plan(json.loads(text))  # as `workbench export` reads it: each row with its tree
    rows = plan["plans"]
    ctx = plan["latency"]["context"]
    found = off_trend(lat, ctx)
    sizes = {b: lat.loc[(lat["batch"] == b) & (lat["context"] == ctx), "tokens"] for b in batches}
    odd = {r["batch_size"]: deciding(found, r["batch_size"], r["nodes"] + 1, sizes[r["batch_size"]]) for r in rows}
    st.markdown("; ".join(f"batch {r['batch_size']}: **{_plan_label(r)}** {r['predicted_speedup']:.2f}x"
                          + (" (on an odd latency point)" if odd[r["batch_size"]] else "") for r in rows))
    odd_notes = st.container()
    for b, f in odd.items():
        if f:
            odd_notes.warning(f"Batch {b}'s row rests on latency measurements off their trend: "
                              + "; ".join(outlier_words(x) for x in f) + f". Re-measure {lat_path.name} at batch {b}.",
                              icon=":material/warning:")
    measured = plan_check(plan, sweep) if sweep is not None and "batch_size" in sweep.columns else None
    live = measured is not None and len(measured) > 0
    chart(interactive_tradeoffs.plan_chart(speedups_by_kind(plan), measured),
          f"latency {lat_path.name} at context {ctx}; tokens/step "
          f"{plan['source']['prediction']}. Lines: the best the plan weighed of each kind; stars: its choice"
          + (f"; diamonds: {sweep_path.name}, decoded live at each batch size." if live
             else "; run `workbench sweep --plan PLAN.json` for the live check."), key="to_plan_chart")
    _plan_exports(plan, text, f"plan-{lat_path.stem}", [r["batch_size"] for r in rows])


def _plan_exports(plan: dict, text: str, name: str, batches: list[int]) -> None:
    """The plan file and each engine's output, for the batch size picked (vllm's schedule covers them all); every
    warning and note below, in an expander, readable at any width. Paths relative to the repository."""
    c1, c2 = st.columns([1, 3])
    drop_stale("to_plan_batch", batches)
    b = c1.selectbox("batch size to export", batches, key="to_plan_batch",
                     help="the static formats (vllm-tree, trtllm, medusa, eagle, json) serve one tree: this row's; "
                          "vllm's file holds the plan's schedule over every batch size")
    c2.caption(f"Downloads: the plan, vLLM's schedule (every batch size) and batch {b}'s tree in each static format.")
    cols = st.columns(len(PLAN_FORMATS) + 1)
    cols[0].download_button("plan", text, file_name=f"{name}.json", key="to_plan_download", on_click="ignore",
                            help="the plan file (`workbench export PLAN --format ...` reads it)")
    said = []
    for col, fmt in zip(cols[1:], PLAN_FORMATS):
        try:
            out, warns, notes = export_plan(plan, fmt, batch_size=None if fmt == "vllm" else b)
        except WorkbenchError as e:
            why = clean_error(e, EXPORT_LABELS)
            col.button(fmt, key=f"to_plan_{fmt}_off_btn", disabled=True, help=why)
            said.append(f"**{fmt}**: not exported: {why}")
            continue
        col.download_button(fmt, relative_paths(out), key=f"to_plan_{fmt}_download", on_click="ignore",
                            file_name=f"{name}{'' if fmt == 'vllm' else f'-b{b}'}{SUFFIXES.get(fmt, '.txt')}",
                            help=f"the plan for {fmt}" + ("" if fmt == "vllm" else f", batch {b}'s row"))
        said += [f"**{fmt}**: {w.words(EXPORT_FIXES)}" for w in warns] + \
            [f"**{fmt}**: {worded(n, app_names(EXPORT_LABELS))}" for n in notes]
    with st.expander(f"Export notes and warnings ({len(said)})"):
        st.markdown("\n".join(f"- {relative_paths(n)}" for n in said) or "none")


@st.cache_data(show_spinner="planning per batch size ...")
def _cached_plan(folder: str, folder_stamp: tuple, _calibration, latency: str, latency_stamp: tuple, batches: tuple,
                 max_new_tokens: int | None = None) -> str:
    """The plan file's text for this calibration and latency table (paths by name only), once per version of both.
    `_calibration`: the page's open folder (named by `folder` and its stamp), whose replays the designer has already
    walked: opening it again cost a fresh server's first trade-offs visit ~0.2 s."""
    plan = make_plan(calibration_source(_calibration, max_new_tokens=max_new_tokens), latency, batches)
    plan["latency"]["file"] = Path(latency).name  # no server path in a downloaded plan
    plan["source"]["path"] = Path(folder).name
    return plan_json(plan)


def _plan_label(row: dict) -> str:
    return {"none": "no speculation", "chain": f"chain K={row['nodes']}"}.get(row["kind"], f"tree of {row['nodes']}")

def _goto_designer() -> None:
    st.switch_page(st.Page(tree_page, title="Tree designer", url_path="tree"))


def _readable_typical(path: Path) -> bool:
    try:
        return has_typical(read_sweep_file(str(path), file_stamp(path)))
    except WorkbenchError:
        return False
