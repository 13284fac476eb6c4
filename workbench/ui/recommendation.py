"""The recommendation panel the designer and /tradeoffs both open with: one sentence (workbench/ui/answer.py),
a warning in words when current measurements contradict the prediction, one-click exports of the pick in every
engine format, and the ranked candidates with their evidence.

The ranking, the sweeps' measurements and the swept named trees are computed once per input version (st.cache_data
keyed by the files' modification times and sizes), so a click elsewhere on the page does not redo them.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from workbench import REPO_ROOT, WorkbenchError
from workbench.calibrate.folder import Calibration
from workbench.core.provenance import read_setting, setting_cell
from workbench.export.engines import FORMATS, SUFFIXES, export_tree
from workbench.plan.recommend import comparable, measurements, recommend, runner_up_close, shape
from workbench.ui.answer import (answer_json, candidate_rows, disagreement_text, latency_note, noise_text,
                                 outlier_text, provenance_note, sentence, setting_text, table_text)
from workbench.trees.tree import Tree, load_tree, record_json, reference_trees, tree_record
from workbench.ui.widgets import (Source, chart, clean_error, file_stamp, found_csvs, portable_path, read_latency_file,
                                  read_sweep_file, stamped)
from workbench.viz import interactive_tradeoffs


@st.cache_data(max_entries=16, show_spinner="Planning: trees, chains and no speculation on this latency table...")
def _ranked(source_key: tuple, _source, latency: str, latency_stamp: tuple, context: int, batch: int,
            sweeps: tuple, joint: bool, max_depth: int, max_rank: int, max_budget: int | None,
            tree_files: tuple, max_new_tokens: int | None = None) -> dict:
    """recommend.recommend (plan's ranking joined to the sweeps) on files named by path and stamp (the cache key:
    small, since hashing the named trees' paths on every rerun cost a click ~50 ms); `_source` (a Calibration or
    acc table) is identified by `source_key`. The swept named trees come from `sweeps` and `tree_files`."""
    value = _source.joint_value("fit") if joint and isinstance(_source, Calibration) else None
    frames = {Path(p).name: read_sweep_file(p, stamp) for p, stamp in sweeps}
    return recommend(_source, read_latency_file(latency, latency_stamp), context, batch, frames, value, max_depth,
                     max_rank, max_budget, _swept_trees(sweeps, tree_files),
                     latency_name=Path(latency).name, max_new_tokens=max_new_tokens)


@st.cache_data(max_entries=16, show_spinner=False)
def _readable(sweeps: tuple) -> list[str]:
    """The sweep files among ((path, stamp), ...) that read, once per version of them."""
    out = []
    for p, stamp in sweeps:
        try:
            read_sweep_file(p, stamp)
        except WorkbenchError:
            continue  # a broken sweep is reported where it is picked (the trade-offs page)
        out.append(p)
    return out


def readable_sweeps(extra=()) -> list[Path]:
    """Every sweep CSV found (and `extra` given ones) that reads: the evidence of the recommendation."""
    found = list(dict.fromkeys(list(found_csvs("sweep")) + [Path(p) for p in extra if p is not None]))
    return [Path(p) for p in _readable(stamped(found))]


@st.cache_data(max_entries=16, show_spinner=False)
def sweep_measurements(sweeps: tuple, batch: int = 1, table: str | None = None) -> dict:
    """recommend.measurements of the sweep files ((path, stamp), ...) at one batch size, once per version of them
    (it walks every row of every sweep); `table`: the setting cell of the latency table predictions use."""
    return measurements({Path(p).name: read_sweep_file(p, stamp) for p, stamp in sweeps}, batch,
                        table=read_setting(table))


def measured_beside(sweeps: list[Path], batch: int, latency: pd.DataFrame | None) -> dict:
    """The sweeps' measurements at one batch size, each marked comparable or not with the latency table's setting
    (`latency`: its frame; None = no table, nothing to compare with)."""
    where = read_setting(latency) if latency is not None else None
    return sweep_measurements(stamped(sweeps), batch, None if where is None else setting_cell(where))


@st.cache_data(max_entries=8, show_spinner=False)
def _swept_trees(sweeps: tuple, files: tuple) -> list:
    """The reference trees and the files under trees/ whose shape some sweep measured: ranked beside the optimizer's
    candidates, so that their measurements stand next to their predictions."""
    found = sweep_measurements(sweeps)
    trees = list(reference_trees().values())
    for f, _ in files:
        try:
            trees.append(load_tree(f))
        except WorkbenchError:
            continue
    return [t for t in trees if shape(t) in found]


def tree_files() -> tuple:
    """((path, stamp), ...) of the files under trees/: with the sweeps, what names the swept trees."""
    return stamped(sorted((REPO_ROOT / "trees").glob("*.json")))


def ranked(src: Source, latency: Path, tables, extra_sweeps=(),
           max_new_tokens: int | None = None) -> dict | None:
    """The recommendation for this source and latency table (tables: the picker's context and batch), with every
    readable sweep found (and `extra_sweeps`) as evidence and the swept named trees as candidates: the designer and
    the trade-offs page ask the same question the same way. A served calibration's drafter is no sweep's (they
    decode Medusa heads): its chains stand without that evidence. None with an st.error when an input is unusable."""
    served = src.served is not None
    sweeps = [] if served else readable_sweeps(extra_sweeps)
    max_depth, max_rank, max_budget, joint = None, None, None, False
    try:
        return _ranked(src.key, src.served if served else src.calib if src.calib is not None else src.acc,
                       str(latency), file_stamp(latency), tables.context, tables.batch, stamped(sweeps), joint,
                       max_depth or src.acc.shape[0], max_rank or src.acc.shape[1], max_budget,
                       () if served else tree_files(), max_new_tokens)
    except WorkbenchError as e:
        st.error(f"recommendation: {clean_error(e)}")
        return None


def _stem(name: str) -> str:
    return name.removesuffix(".csv")


def candidates_frame(rec: dict) -> pd.DataFrame:
    """The ranked candidates as a table that fits a 1280 px page: prediction, range, and what sweeps measured
    (this setting and others apart, the sweeps named without .csv); a column nothing fills is left out."""
    rows = []
    for r in rec["candidates"] + rec["measured_trees"]:
        now = r["current"]
        other = [m for m in r["measured"] if m["elsewhere"]]
        rows.append({
            "candidate": r["label"] + ("" if any(r is c for c in rec["candidates"]) else " *"),
            "tokens/step": r["tokens_per_step"], "speedup": r["speedup"],
            "range": f"{r['range'][0]:.2f}-{r['range'][1]:.2f}x" if r["range"] else "",
            "measured": (f"{now['speedup']:.2f}x" + (f" ± {now['noise']:.2f}" if now["noise"] is not None else "")
                         + ("" if all(m["phase"] == "decoding phase" for m in r["measured"] if comparable(m))
                            else " (end to end)"))
            if now else "",
            "in": ", ".join(_stem(s) for s in now["sweeps"]) if now else "",
            "other setting": f"{other[0]['speedup']:.2f}x" if other else "",  # its sweep: in the CSV (1280 px)
            "disagrees": "yes" if r["disagree"] else ""})
    df = pd.DataFrame(rows)
    return df[[c for c in df.columns if c in ("candidate", "tokens/step", "speedup") or (df[c] != "").any()]]


# Each column's width in px: all eight together (a disagreement adds the last) fit the expander at a 1280 px window
# with the sidebar open (about 764 px inside it); sized to fit its contents, the table scrolled sideways.
WIDTHS = {"candidate": 172, "tokens/step": 84, "speedup": 70, "range": 84, "measured": 96, "in": 112,
          "other setting": 66, "disagrees": 66}

COLUMNS = {
    "candidate": st.column_config.TextColumn(
        width=WIDTHS["candidate"],
        help="tree (its name and node count), chain K (the top-1 chain of K heads) or no speculation; * a named tree "
             "a sweep measured, not one of plan's candidates (scored the same way, never the pick)"),
    "tokens/step": st.column_config.NumberColumn(
        format="%.3f", width=WIDTHS["tokens/step"],
        help="predicted tokens per step (Calibration.predict: the replay of a greedy decoder over held-out answers "
             "when the calibration holds prompts out)"),
    "speedup": st.column_config.NumberColumn(
        format="%.3fx", width=WIDTHS["speedup"],
        help="predicted, of the decoding phase: the batch's tokens/step (it waits for its slowest sequence) / "
             "relative step cost t(nodes + 1) / t(1) at this batch and context"),
    "range": st.column_config.TextColumn(
        width=WIDTHS["range"], help="the predicted speedup with the latency spread: slow tree step over fast plain step, and the other way "
             "round"),
    "measured": st.column_config.TextColumn(
        width=WIDTHS["measured"], help="sweeps in the latency table's setting: the decoding phase's speedup (as predicted; '(end to end)': a "
             "sweep row without it, prefill included) +- run-to-run noise (the spread of the sweep's vanilla "
             "baseline, re-measured before every configuration, or between repeats)"),
    "in": st.column_config.TextColumn(help="the sweep(s) that measured it (CSV files)", width=WIDTHS["in"]),
    "other setting": st.column_config.TextColumn(
        width=WIDTHS["other setting"], help="measured in another setting than the latency table's (other threads, CPU, "
             "...; or a sweep that does not record its setting): shown, not weighed against the prediction; which "
             "sweep: the candidates CSV below"),
    "disagrees": st.column_config.TextColumn(
        width=WIDTHS["disagrees"], help="the current measurement is outside the prediction by more than its noise"),
}


def panel(rec: dict, key: str, heads: int, provenance: dict, show=None, show_label: str = "show it") -> None:
    """Draw the recommendation: the warning first (when measurements contradict the prediction), the sentence, the
    pick's exports in every format, notes on closeness and other settings, and the ranked candidates. All in one
    container: Streamlit places an element by its index among its siblings, so a warning more or less would move
    every later element of the page and the browser would draw its figures anew (a fresh server's first other
    latency table: 1.34 s, 0.47 s of it on the server)."""
    with st.container():
        _panel(rec, key, heads, provenance, show, show_label)


def _panel(rec: dict, key: str, heads: int, provenance: dict, show, show_label: str) -> None:
    for text in (disagreement_text(rec), setting_text(rec), outlier_text(rec)):
        if text:
            st.warning(text, icon=":material/warning:")
    pick = rec["pick"] if rec["answer"]["kind"] == "plan" else dict(rec["pick"], kind="none", tree=None)
    served = served_drafter(rec)
    drafter = f"the {served} drafter" if served else "Medusa"
    if rec["answer"]["kind"] == "measured-none":
        best = rec["answer"]["row"]
        st.warning(f"Speculation was measured slower than plain decoding at batch {rec['batch']}: the best measured "
                   f"option, {best['label']}, ran at {best['current']['speedup']:.2f}x. Decode without {drafter} here.")
    elif pick["kind"] == "none":
        st.warning(f"Speculation does not pay on this hardware at batch {rec['batch']} and context {rec['context']}: "
                   f"no {'chain' if served else 'tree or chain'} is predicted faster than plain decoding, because a "
                   f"verify step costs more than its extra tokens bring. Decode without {drafter} here, or measure "
                   "latency on faster hardware (a GPU).")
    box = st.container(border=True)
    box.markdown(f"**Recommendation:** {sentence(rec)}.")
    box.caption(f"Evidence: {table_text(rec)}.")
    close = runner_up_close(rec)
    notes = [n for n in (noise_text(rec), latency_note(rec), provenance_note(rec)) if n]
    if close is not None:
        notes.append(f"the runner-up, {close['label']} at {close['speedup']:.2f}x, is within the latency spread of "
                     "the pick: on this table the two cannot be told apart")
    if rec["elsewhere"]:
        notes.append(f"{len(rec['elsewhere'])} candidate(s) were measured only in another setting than the latency "
                     "table's (\"other setting\" below): not weighed against the prediction; measure them in this "
                     "setting with `workbench sweep`")
    if notes:
        said = "; ".join(notes)
        box.caption(said[:1].upper() + said[1:] + ".")  # capitalize() would lower "AMD EPYC"
    if pick["tree"] is not None and served:
        box.caption(f"Serve it as vLLM's {served} drafter with num_speculative_tokens {pick['nodes']} (the drafter "
                    "drafts a chain: no tree to export); the trade-offs page's plan per batch size writes the K of "
                    "every batch size for vLLM and TensorRT-LLM.")
    elif pick["tree"] is not None:
        tree: Tree = pick["tree"]
        cols = box.columns([1.6] + [1] * len(FORMATS))
        if show is not None:
            cols[0].button(show_label, key=f"{key}_show_btn", on_click=show, args=(tree,),
                           help="draw the pick in the designer, with its mask, edits and exports")
        for col, fmt in zip(cols[1:], FORMATS):
            data, _ = export_tree(tree, fmt, heads=heads)
            if fmt == "json":
                data = record_json(tree_record(tree, **provenance, predicted_tokens_per_step=pick["tokens_per_step"],
                                               predicted_speedup=pick["speedup"], context=rec["context"],
                                               batch=rec["batch"]))
            col.download_button(fmt, data, file_name=f"{tree.name}{SUFFIXES[fmt]}", key=f"{key}_rec_{fmt}_download",
                                on_click="ignore", help=f"the recommended {tree.name} in the {fmt} format")
    else:
        box.caption(f"Nothing to export: decode without {drafter} on this hardware at this batch size.")
    with st.expander(f"All {len(rec['candidates'])} candidates, ranked by `workbench plan` (and their evidence)"):
        st.dataframe(candidates_frame(rec), hide_index=True, column_config=COLUMNS)
        name = f"recommendation-b{rec['batch']}-c{rec['context']}"
        c1, c2, _ = st.columns([1, 1, 4])
        c1.download_button("candidates CSV", candidate_rows(rec).to_csv(index=False), file_name=f"{name}.csv",
                           key=f"{key}_cands_download", on_click="ignore", help="every candidate, unformatted")
        c2.download_button("answer JSON", answer_json(rec), file_name=f"{name}.json", key=f"{key}_answer_download",
                           on_click="ignore", help="the answer, its evidence and warnings, and every candidate")
        st.caption(f"Predicted tokens/step: {rec['prediction']} ({rec['regime']}); speedup at batch "
                   f"{rec['batch']} and context {rec['context']}"
                   + (f", range from the {rec['spread']}" if rec["spread"] else "; no spread measured (the latency "
                      "CSV has only medians)") + (f". Measured: no sweep decodes the {served} drafter; "
                                                  "`workbench vllm-check --plan` measures it in vLLM." if served else
                                                  ". Measured: greedy sweep rows of the same tree shape.")
                   + (" *: a named tree a sweep measured, not a plan candidate." if rec["measured_trees"] else ""))


def served_drafter(rec: dict) -> str | None:
    """The drafter of a served calibration's answer (vLLM's method, e.g. ngram), None for ours."""
    src = rec.get("source") or {}
    return (src.get("method") or "served") if src.get("served") else None


def candidate_curves(rec: dict) -> dict:
    """{name: (nodes, speedups[, low, high])} of the recommendation's optimal trees and chains, for speedup_chart."""
    curves = {}
    def family(r: dict) -> str | None:
        if r["kind"] == "chain":
            return "chains"
        return "optimal trees" if r["tree"] is not None and r["tree"].name.startswith("optimal_") else None

    for name in ("optimal trees", "chains"):
        part = sorted((r for r in rec["candidates"] if family(r) == name), key=lambda r: r["nodes"])
        if part:
            curves[name] = ([r["nodes"] for r in part], [r["speedup"] for r in part])
            if all(r["range"] for r in part):
                curves[name] += ([r["range"][0] for r in part], [r["range"][1] for r in part])
    return curves


def provenance_of(src: Source) -> dict:
    return dict(accuracies=portable_path(src.folder) if src.folder else src.label)


def speedup_view(rec: dict, lat: dict, tree, guess: dict | None) -> None:
    """Predicted speedup of the optimal trees and chains at the recommendation's batch and context, the pick and
    this tree marked, and every sweep measurement (other settings hollow)."""
    picks = {"recommended": (rec["pick"]["nodes"], rec["pick"]["speedup"])}
    if guess is not None:
        picks["this tree"] = (tree.nodes, guess["speedup"])
    measured = [m for r in rec["candidates"] for m in r["measured"]]
    chart(interactive_tradeoffs.speedup_chart(candidate_curves(rec), picks, measured,
                                            title=f"predicted speedup, batch {rec['batch']}, context {rec['context']}"),
          f"Predicted from {rec['prediction']} and {lat['path'].name} (recommended: {rec['pick']['label']}); "
          "diamonds: sweep measurements of the same tree shapes (hollow grey: another setting, or one not recorded, "
          "not comparable).",
          key="tree_speedup_chart")
