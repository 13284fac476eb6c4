"""The app's shared inputs, and the one owner of their state: the accuracies (a calibration folder or a table), the
latency table with its setup, batch size and context, and the generation length. Every page draws them in its
sidebar under the same keys (`in_*`), so every page reads the same values and gives the same answer; a cross-page
button carries nothing but what it shows.

Why settings survive a page switch and a fragment's run: Streamlit drops a widget's value at the end of a run that
does not draw it (its page was left). `keep_settings` copies every kept value onto its user key at the start of a
run, where that cleanup does not reach. A fragment's run (a tree-node click) runs the fragment alone: without the
copy it left the values stored only under the widgets' ids, and the next page switch dropped them all (issue 53).
So every fragment is made with `fragment` below, which copies first.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import streamlit as st
from streamlit.runtime.scriptrunner import get_script_run_ctx

from workbench import WorkbenchError
from workbench.calibrate.folder import default_calibration, read_meta
from workbench.calibrate.served import is_served
from workbench.core.io import read_json
from workbench.plan.source import chain_accuracies
from workbench.plan.surface import Surface
from workbench.ui.widgets import (Source, calibration_folders, calibration_root, clean_error, drop_stale, file_input,
                                  file_stamp, latency_files, open_calibration, open_served, read_accuracy_file,
                                  read_latency_file, resolved, results_root, served_folders, shown_path)

# Keys kept across pages and fragment runs. Buttons, uploads, downloads and charts hold no settable value.
KEPT_PREFIXES = ("in_", "tree_", "cal_", "to_", "live_")
NOT_KEPT = re.compile(r".*(_btn|_go|_upload|_up|_chart|_download)$")
OTHER_FOLDER = "other: type a folder"


def keep_settings() -> None:
    """Copy every kept widget value onto its user key (at the start of every run, full or fragment)."""
    for key in list(st.session_state.keys()):
        if isinstance(key, str) and key.startswith(KEPT_PREFIXES) and not NOT_KEPT.match(key):
            st.session_state[key] = st.session_state[key]


def fragment(fn):
    """st.fragment that keeps the settings first when it runs alone (see the module's docstring: a bare fragment
    loses them); within a full run the page has kept them already, and its widgets are drawn."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        ctx = get_script_run_ctx()
        if ctx is not None and ctx.fragment_ids_this_run:
            keep_settings()
        return fn(*args, **kwargs)

    return st.fragment(run)


@dataclass
class Inputs:
    """What every page reads: the accuracies, the latency table ({"path", "tables", "frame", "surface"} or None) and the
    generation length (None: the calibration's own)."""

    src: Source | None
    lat: dict | None
    max_new_tokens: int | None


def shared_inputs(latency: bool = True) -> Inputs:
    """The sidebar's shared inputs, drawn on every page in the same order under the same keys."""
    src = accuracy_source()
    gen = generation_length(src)
    lat = hardware(src) if latency else None
    return Inputs(src, lat, gen)


def _prompts(folder: Path) -> int:
    try:
        return int(read_meta(folder).get("num_prompts") or 0)
    except (WorkbenchError, ValueError, TypeError):
        return 0


def _served_label(folder: Path) -> str:
    """'NAME (served ngram, K=4, 24 prompts)' (a scrape's: 'from metrics'): a served calibration in the sidebar."""
    try:
        m = read_json(folder / "meta.json", str(folder))
        counted = f"{m['num_prompts']} prompts" if m.get("num_prompts") else f"from {m.get('source') or '?'}"
        return f"{folder.name} (served {m.get('method') or '?'}, K={m.get('num_speculative_tokens') or '?'}, {counted})"
    except (WorkbenchError, AttributeError):
        return f"{folder.name} (served)"


def _new_calibration() -> None:
    """Another calibration picked: the latency pick goes back to its default, the new calibration's own surface
    first (a served drafter's: the engine's rounds it was calibrated for), not the last one's."""
    st.session_state.pop("in_lat_pick", None)


def accuracy_source() -> Source | None:
    """Sidebar: a calibration folder (preselected: the one with the most prompts; ours, then the served ones: vLLM's
    counters for any drafter) or an accuracy file / pasted CSV. Errors are shown here; None means there is nothing
    usable (the page says what to do)."""
    found = calibration_folders()
    served = served_folders()
    kind = st.sidebar.radio("Accuracies from", ["calibration folder", "accuracy file or pasted CSV"], key="in_src")
    with st.sidebar:
        if kind == "calibration folder":
            names = list(dict.fromkeys([str(f) for f in found + served])) + [OTHER_FOLDER]
            first = str(default_calibration(calibration_root())) if found else names[0]
            drop_stale("in_cal", names)
            labels = {str(f): f"{f.name} ({_prompts(f) or '?'} prompts)" for f in found} | \
                {str(f): _served_label(f) for f in served}
            pick = st.selectbox("Calibration", names, index=names.index(first), key="in_cal",
                                format_func=lambda f: labels.get(f, f), on_change=_new_calibration,
                                help=f"made by `workbench calibrate`, found under {shown_path(calibration_root())}; "
                                     "served ones (`calibrate --engine vllm` or `--metrics`: vLLM's counters for any "
                                     f"drafter) also under {shown_path(results_root() / 'served')}; preselected: "
                                     "ours with the most prompts")
            folder = st.text_input("Calibration folder", key="in_dir", on_change=_new_calibration).strip() \
                if pick == OTHER_FOLDER else pick
            if not folder:
                st.info(f"No calibration folder under {shown_path(calibration_root())}: run `workbench calibrate`, "
                        "type a folder above, or switch to an accuracy file.")
                return None
            folder = str(resolved(folder))
            stamp = file_stamp(folder)
            try:
                if is_served(folder):
                    s = open_served(folder, stamp)
                    return Source(chain_accuracies(s.rates()), Path(folder).name, None, folder, stamp, s)
                cal = open_calibration(folder, stamp)
            except WorkbenchError as e:  # named by the control it came from
                st.error(clean_error(e, {"calibration": "Calibration folder"} if pick == OTHER_FOLDER else None))
                return None
            return Source(cal.accuracies("fit"), Path(folder).name, cal, folder, stamp)
        path = file_input("accuracy CSV or Medusa heads_accuracy.pt", "in_acc", ["csv", "pt", "pth"], paste=True)
        if path is None:
            st.info("Give an accuracy table: CSV `head,rank,accuracy[,count]` (1-based) or Medusa's "
                    "heads_accuracy.pt.")
            return None
        try:
            acc, _ = read_accuracy_file(str(path), file_stamp(path))
        except WorkbenchError as e:
            st.error(clean_error(e))
            return None
        return Source(acc, path.name)


def generation_length(src: Source | None) -> int | None:
    """Sidebar: how many tokens an answer has (the predictions replay answers cut to it); up to the calibration's
    own length, the longest it measured. None without a calibration folder."""
    if src is None or src.calib is None or not src.calib.meta.get("max_new_tokens"):
        return None
    top = int(src.calib.meta["max_new_tokens"])
    kept = st.session_state.get("in_gen")
    if isinstance(kept, int) and not 1 <= kept <= top:
        st.session_state["in_gen"] = min(max(kept, 1), top)
    return int(st.sidebar.number_input(
        "Generation length (tokens)", 1, top, top, key="in_gen",
        help=f"tokens per answer: every prediction replays the held-out answers cut to this length (the calibration "
             f"measured {top}); acceptance rises along an answer, so short answers predict fewer tokens/step"))


def latency_picker(df: pd.DataFrame, name: str, target: float | None, where=None) -> tuple[Surface, object]:
    """(the Surface of one setup, the surface at the picked batch size and context: surface.At) of a latency table's
    frame: one setup
    (model/device/dtype), batch size and context, picked with selectboxes where the file has several; the context
    defaults to the one nearest the calibration's typical cache length, the batch to 1."""
    where = where or st.sidebar
    keys = [c for c in ("model", "device", "dtype") if c in df.columns]
    if keys:
        labels = df[keys].astype(str).agg(" / ".join, axis=1)
        setups = list(dict.fromkeys(labels))
        if len(setups) > 1:
            drop_stale("in_setup", setups)
            df = df[labels == where.selectbox("latency setup", setups, key="in_setup")]
    batch = 1
    if "batch" in df.columns:
        batches = sorted(int(b) for b in df["batch"].unique())
        drop_stale("in_batch", batches)
        batch = where.selectbox("batch size", batches, key="in_batch",
                                index=batches.index(1) if 1 in batches else 0,
                                help="sequences decoded together; the latency table and the sweeps are read at it") \
            if len(batches) > 1 else batches[0]
    at = df[df["batch"] == batch] if "batch" in df.columns else df  # the whole frame prices a batch's tail (vLLM)
    contexts = sorted(int(c) for c in at["context"].unique())
    near = min(range(len(contexts)), key=lambda i: abs(contexts[i] - target)) if target else 0
    drop_stale("in_ctx", contexts)
    ctx = where.selectbox("latency context (cache length)", contexts, index=near, key="in_ctx",
                          help="the cache length the step costs are read at (default: nearest the calibration's "
                               "typical prompt + half answer)") if len(contexts) > 1 else contexts[0]
    surface = Surface(df, what=name, field="latency")  # its errors name the sidebar's 'latency CSV' (SIDEBAR)
    return surface, surface.at(batch, surface.context([batch], ctx))


def hardware(src: Source | None) -> dict | None:
    """Sidebar: the latency CSV (the calibration folder's own first, then the results folder's, or given) and its
    setup, batch size and context. {"path", "tables" (surface.At), "frame", "surface"} or None (nothing found or unreadable: said here)."""
    with st.sidebar.expander("Hardware: latency table", expanded=True):
        path = file_input("latency CSV", "in_lat", ["csv"], latency_files(src))
        if path is None:
            return None
        try:
            df = read_latency_file(str(path), file_stamp(path))
            surface, tables = latency_picker(df, path.name, src.calib.typical_context() if src and src.calib else None,
                                    where=st)
        except WorkbenchError as e:
            st.error(clean_error(e))
            return None
        st.caption(f"{path.name}: batch {tables.batch}, context {tables.context}, "
                   f"{len(tables.seconds)} token counts (up to {max(tables.seconds)})"
                   + ("" if tables.spread else "; no spread measured")
                   + ("; each tree priced at its own depth (the heads' cost is measured)" if tables.head_cost
                      else "; no heads' cost: trees priced at the depth the table timed (`workbench latency --heads "
                           "DIR` times it)"))
    return {"path": path, "tables": tables, "frame": df, "surface": surface}
