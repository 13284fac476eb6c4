"""Streamlit face of the workbench: `streamlit run app.py` (offline; reads the committed calibration).

Four pages, each with its own URL: /tree (designer), /calibration, /tradeoffs, /live (the only page that loads
a model, and only on a button press). This file is layout and widgets only: numbers come from `workbench/`
modules, figures from `workbench/plots.py`. Bad input (a missing folder, a malformed upload, a tree that does
not fit the heads) is an `st.error` with the reason, never a crash.

Calibration folders are looked up under $WORKBENCH_CALIBRATION_ROOT (default: calibration/ in this checkout),
sweep and latency CSVs also under $WORKBENCH_RESULTS_ROOT (default: docs/results/).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import streamlit as st

from workbench import REPO_ROOT, WorkbenchError
from workbench import figures, plots

UPLOAD_DIR = Path(tempfile.gettempdir()) / "workbench-app"
EXAMPLE_CSV = "head,rank,accuracy\n1,1,0.55\n1,2,0.12\n1,3,0.05\n2,1,0.30\n2,2,0.10\n2,3,0.05\n"


# ----------------------------------------------------------------------------------------------- inputs, cached reads

def calibration_root() -> Path:
    from workbench.calibration import calibration_root

    return calibration_root(REPO_ROOT / "calibration")


def results_root() -> Path:
    """Where sweep CSVs are looked for: $WORKBENCH_RESULTS_ROOT (default: docs/results/ in this checkout)."""
    return Path(os.environ.get("WORKBENCH_RESULTS_ROOT") or REPO_ROOT / "docs" / "results")


def calibration_folders() -> list[Path]:
    from workbench.calibration import list_calibrations

    return list_calibrations(calibration_root())


def _stamp(path) -> float:
    """Modification time (0 if missing): part of every cache key, so an edited file is read again."""
    p = Path(path)
    return max((f.stat().st_mtime for f in ([p] + (list(p.iterdir()) if p.is_dir() else []))), default=0.0) \
        if p.exists() else 0.0


def _clean(err: Exception) -> str:
    """An error message naming an upload by its file name, not by the hash folder it was written to."""
    return re.sub(re.escape(str(UPLOAD_DIR) + os.sep) + r"[0-9a-f]+" + re.escape(os.sep), "", str(err))


def _upload_path(upload) -> Path:
    """An uploaded file on disk (the workbench readers take paths), in a folder named by its content hash."""
    data = upload.getvalue()
    folder = UPLOAD_DIR / hashlib.sha1(data).hexdigest()[:16]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / Path(upload.name).name
    if not path.is_file():
        path.write_bytes(data)
    return path


def _text_path(text: str, name: str) -> Path:
    """Pasted text as a file, like an upload."""
    data = text.encode()
    folder = UPLOAD_DIR / hashlib.sha1(data).hexdigest()[:16]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    if not path.is_file():
        path.write_bytes(data)
    return path


@st.cache_resource(show_spinner="Reading the calibration...", max_entries=4)
def open_calibration(folder: str, stamp: float):
    """The calibration folder, opened once per version (it keeps what it reads); cache_resource: never copied."""
    from workbench.calibration import Calibration

    cal = Calibration(folder)
    cal.path_probabilities("fit")  # read and checked here, under the spinner, not halfway through a page
    return cal


@st.cache_data(max_entries=16)
def read_accuracy_file(path: str, stamp: float):
    from workbench.accuracies import read_accuracies

    return read_accuracies(path, return_counts=True)


@st.cache_data(max_entries=8)
def read_latency_file(path: str, stamp: float) -> pd.DataFrame:
    from workbench.latency import read_latency

    return read_latency(path)


@st.cache_data(max_entries=8)
def read_sweep_file(path: str, stamp: float) -> pd.DataFrame:
    from workbench.sweep import read_sweep

    return read_sweep(path)


@st.cache_resource(show_spinner="Loading the model and heads...", max_entries=1)
def load_model(model: str, heads: str, device: str):
    """(base, tokenizer, heads); one at a time, so switching models frees the last one."""
    from workbench.models import load_model_and_heads

    return load_model_and_heads(model or None, heads or None, None if device == "auto" else device)


def found_csvs(kind: str) -> list[Path]:
    """Sweep or latency CSVs in the calibration folders and the results folder, recognised by their header."""
    want = {"sweep": ("acceleration_rate", "nodes"), "latency": ("tokens", "seconds")}[kind]
    out = []
    for root in (calibration_root(), results_root()):
        for f in sorted(root.rglob("*.csv")) if root.is_dir() else []:
            try:
                with f.open() as fh:
                    header = fh.readline().strip().split(",")
            except (OSError, UnicodeDecodeError):
                continue
            if all(c in header for c in want):
                out.append(f)
    return out


@dataclass
class Source:
    """Accuracies a page works on: acc[K, R] (a calibration's fit prompts) and, for a calibration folder, the
    opened workbench.calibration.Calibration."""

    acc: object
    label: str
    calib: object = None
    folder: str | None = None
    stamp: float = 0.0


OTHER_FILE = "other: type a path"


def file_input(label: str, key: str, types: list[str], found: list[Path] | None = None,
               paste: bool = False, default: Path | None = None) -> Path | None:
    """A file from an upload, one of the `found` files (a selectbox; `default` or the first preselected), a path
    typed in, or pasted text."""
    up = st.file_uploader(f"Upload {label}", type=types, key=f"{key}_upload")
    if up is not None:
        return _upload_path(up)
    typed = ""
    if found:
        names = list(dict.fromkeys(str(f) for f in found)) + [OTHER_FILE]
        pick = st.selectbox(f"... or a {label} found here", names, key=f"{key}_pick",
                            index=names.index(str(default)) if default is not None and str(default) in names else 0,
                            format_func=lambda f: f if f == OTHER_FILE else f"{Path(f).parent.name}/{Path(f).name}")
        if pick != OTHER_FILE:
            typed = pick
        else:
            typed = st.text_input(f"{label} path", key=f"{key}_path")
    else:
        typed = st.text_input(f"... or a {label} path", key=f"{key}_path")
    if paste:
        text = st.text_area(f"... or paste {label} text", key=f"{key}_paste", placeholder=EXAMPLE_CSV, height=110)
        if text.strip():
            return _text_path(text, "pasted.csv")
    return Path(typed.strip()) if typed.strip() else None


def accuracy_source(key: str) -> Source | None:
    """Sidebar choice of the accuracies: a calibration folder, an accuracy file (CSV / heads_accuracy.pt), or
    pasted CSV. Errors are shown here; None means there is nothing usable (the page says what to do)."""
    found = calibration_folders()
    kind = st.sidebar.radio("Accuracies from", ["calibration folder", "accuracy file or pasted CSV"], key=f"{key}_src")
    with st.sidebar:
        if kind == "calibration folder":
            folder = st.text_input("Calibration folder", value=str(found[0]) if found else "", key=f"{key}_dir",
                                   help=f"made by `workbench calibrate`; found under {calibration_root()}: "
                                        f"{', '.join(f.name for f in found) or 'none'}")
            if not folder.strip():
                st.info(f"No calibration folder under {calibration_root()}: run `workbench calibrate`, type a "
                        "folder above, or switch to an accuracy file.")
                return None
            stamp = _stamp(folder)
            try:
                cal = open_calibration(folder.strip(), stamp)
            except WorkbenchError as e:
                st.error(_clean(e))
                return None
            return Source(cal.accuracies("fit"), Path(folder).name, cal, folder.strip(), stamp)
        path = file_input("accuracy CSV or Medusa heads_accuracy.pt", f"{key}_acc", ["csv", "pt", "pth"], paste=True)
        if path is None:
            st.info("Give an accuracy table: CSV `head,rank,accuracy[,count]` (1-based) or Medusa's "
                    "heads_accuracy.pt.")
            return None
        try:
            acc, _ = read_accuracy_file(str(path), _stamp(path))
        except WorkbenchError as e:
            st.error(_clean(e))
            return None
        return Source(acc, path.name)


def int_slider(label: str, high: int, default: int, key: str) -> int:
    """A 1..high sidebar slider; a one-value range (one head, one rank) is a caption, as sliders need two."""
    if high <= 1:
        st.sidebar.caption(f"{label}: 1")
        return 1
    return st.sidebar.slider(label, 1, high, default, key=key)


def figure(fig, caption: str | None = None) -> None:
    st.pyplot(fig)
    if caption:
        st.caption(caption)


# Widget keys whose values are kept across page changes (Streamlit drops a widget's state once a run does not
# draw it; reassigning the key on every run keeps it). Buttons, uploads, downloads and charts hold no settable
# value, so they are left out.
KEPT_PREFIXES = ("tree_", "cal_", "to_", "live_")
NOT_KEPT = re.compile(r".*(_btn|_go|_upload|_up|_chart|_download)$")


def drop_stale(key: str, options) -> None:
    """Forget a kept choice that is no longer among a widget's options (e.g. a removed node), before drawing it."""
    if key in st.session_state and st.session_state[key] not in options:
        del st.session_state[key]


def keep_settings() -> None:
    """Keep every page's settings when the user switches pages and back (called on every run, before the page)."""
    for key in list(st.session_state.keys()):
        if isinstance(key, str) and key.startswith(KEPT_PREFIXES) and not NOT_KEPT.match(key):
            st.session_state[key] = st.session_state[key]


# ----------------------------------------------------------------------------------------------- page 1: tree designer

def head_token_table(prompt: str, topk: int, model: str = "", heads_path: str = "") -> dict:
    """The model's next token and every head's top-k tokens at the end of `prompt` (node labels); blank model
    and heads = the demo."""
    from workbench.decode import first_proposal
    from workbench.generation import prepare_prompt

    base, tok, heads = load_model(model, heads_path, "auto")
    found = first_proposal(base, heads, prepare_prompt(tok, prompt), topk)
    show = lambda i: tok.decode([int(i)]).replace("\n", "\\n").strip() or repr(tok.decode([int(i)]))  # noqa: E731
    return {"prompt": prompt, "root": show(found["base"]["ids"][0]),
            "table": [[show(i) for i in head["ids"]] for head in found["heads"]]}


OPTIMIZER = "the optimizer's (sidebar settings)"
TREE_HELP = {  # the three predictions of workbench/calibration.py, by the names they have everywhere
    "predicted_independent": "expected tokens per decoding step under independent heads: 1 + the sum over nodes of "
                             "the product of per-head accuracies a_k^(i) (fit prompts); the 1 is the base model's "
                             "own token",
    "predicted_joint": "expected tokens per step from measured joint path frequencies (fit prompts): no "
                       "independence assumption",
    "predicted_replay": "tokens per step a greedy decoder with this tree gets when replayed over the held-out "
                        "prompts' answers: what `workbench decode` measures",
    "optimal at same size": "the independence-optimal tree with as many nodes: the headroom of this shape",
}
TABLE_COLUMNS = {k: st.column_config.NumberColumn(help=v, format="%.3f") for k, v in TREE_HELP.items()}


def tree_options(designed, user: list) -> dict[str, object]:
    """Every tree the designer can show, compare or export: {label: Tree or file path}; files load on pick."""
    from workbench.tree import reference_trees

    out: dict[str, object] = {OPTIMIZER: designed}
    out |= {f"reference: {name}": t for name, t in reference_trees().items()}
    out |= {f"file: {f.name}": f for f in sorted((REPO_ROOT / "trees").glob("*.json"))}
    out |= {f"yours: {t.name}": t for t in user}
    return out


def pick_tree(label: str, options: dict, num_heads: int, topk: int):
    """The tree behind an option label, checked against the heads and ranks of the accuracies (st.error if not)."""
    from workbench.tree import load_tree

    spec = options[label]
    try:
        return load_tree(str(spec) if isinstance(spec, Path) else spec, topk=topk, num_heads=num_heads)
    except WorkbenchError as e:
        st.error(f"{label}: {_clean(e)}")
        return None


def _edit_tree(action: str, tree, sig: str, num_heads: int, topk: int) -> None:
    """Button callback: add or remove a node of the tree on display (kept per source tree), or reset it."""
    from workbench.tree import add_path, parse_path, remove_path

    st.session_state["tree_edit_error"] = None
    try:
        if action == "add":
            new = add_path(tree, parse_path(st.session_state.get("tree_add", "")), num_heads, topk)
        elif action == "remove":
            new = remove_path(tree, parse_path(st.session_state.get("tree_remove", "")))
        else:
            st.session_state.pop("tree_edit", None)
            return
        st.session_state["tree_edit"] = {"sig": sig, "paths": new.as_lists()}
    except WorkbenchError as e:
        st.session_state["tree_edit_error"] = str(e)


def _focus_from(chart_key: str) -> None:
    """Chart callback: a clicked tree node or mask cell selects that node (the focus selectbox follows)."""
    state = st.session_state.get(chart_key)
    idx = figures.picked_index(state.get("selection") if state else None)
    if idx is not None:
        st.session_state["tree_focus_pick"] = idx


def tree_page() -> None:
    from workbench.export import FORMATS, export_tree
    from workbench.calibration import tree_table
    from workbench.optimize import (acc_value_fn, best_dense_tree, expected_curve, expected_length, optimal_tree,
                                    optimal_tree_from)
    from workbench.tree import Tree, record_json, tree_buffers, tree_diff, tree_record

    st.title("Tree designer")
    src = accuracy_source("tree")
    if src is None:
        st.info("Pick a calibration folder or an accuracy table in the sidebar to design a tree.")
        return
    K, R = src.acc.shape
    models = ["independence", "empirical paths", "dense per level (vLLM)", "hardware-aware"]
    model = st.sidebar.radio("Acceptance model", models, key="tree_model",
                             help="independence: product of per-head a_k^(i); empirical: measured joint path "
                                  "frequencies (calibration folder); dense per level: the best tree whose levels "
                                  "give every node the same top-c children, the only shape vLLM drafts as written; "
                                  "hardware-aware: best predicted speedup under a latency curve, up to the budget")
    budget = st.sidebar.slider("Budget (tree nodes)", 1, 256, 63, key="tree_budget")
    max_depth = int_slider("Max depth (heads used)", K, K, "tree_depth")
    max_rank = int_slider("Max rank (top-k per head)", R, min(R, 10), "tree_rank")

    indep = acc_value_fn(src.acc)
    empirical = src.calib.joint_value("fit") if src.calib else None
    if model == "empirical paths" and empirical is None:
        st.error("empirical paths need a calibration folder (its ranks.parquet): an accuracy table has only the "
                 "per-head marginals, so use the independence or hardware-aware model")
        return
    base_value, speedup = (empirical if model == "empirical paths" else indep), None
    try:
        if model == "hardware-aware":
            base_value = empirical if (empirical is not None and st.sidebar.checkbox(
                "use empirical paths", value=False, key="tree_hw_joint")) else indep
            speedup = hardware_choice(src, base_value, budget, max_depth, max_rank)
            if speedup is None:
                return
            designed = speedup["tree"]
        elif model == "empirical paths":
            designed = optimal_tree_from(empirical, budget, max_depth, max_rank, name=f"empirical_{budget}")
        elif model.startswith("dense"):
            designed = best_dense_tree(src.acc, budget, max_depth, max_rank)
        else:
            designed = optimal_tree(src.acc, budget, max_depth, max_rank, name=f"optimal_{budget}")
    except WorkbenchError as e:
        st.error(_clean(e))
        return
    if speedup is not None and speedup["best"]["speedup"] < 1:
        st.warning(f"Speculation does not pay on this hardware at context {speedup['context']}: the best tree "
                   f"({speedup['best']['budget']} nodes) is predicted at {speedup['best']['speedup']:.2f}x, slower "
                   "than vanilla greedy decoding, because a tree forward costs more than its extra tokens bring. "
                   "Decode without Medusa here, or measure latency on faster hardware (a GPU).")
    if designed.nodes < budget and model != "hardware-aware":
        st.caption(f"only {designed.nodes} nodes have a positive acceptance probability")

    # which tree: the optimizer's, a reference, a file under trees/, or the user's own; then edits on top
    options = tree_options(designed, user_tree_input(K))
    labels_list = list(options)
    c1, c2 = st.columns(2)
    drop_stale("tree_show", labels_list)
    shown = c1.selectbox("Tree on display (drawn, masked, exported)", labels_list, key="tree_show",
                         help="the optimizer's tree follows the sidebar settings; any other tree is shown as it "
                              "is, scored on the current calibration")
    if shown not in options:
        shown = labels_list[0]
    drop_stale("tree_compare", ["(nothing)"] + [o for o in labels_list if o != shown])
    against = c2.selectbox("Compare with", ["(nothing)"] + [o for o in labels_list if o != shown],
                           key="tree_compare", help="diff two trees side by side: nodes only in A, only in B, "
                                                    "shared, and their expected tokens per step")
    base = pick_tree(shown, options, K, R) or designed
    sig = f"{shown}|{hash(base.paths)}"
    edit = st.session_state.get("tree_edit")
    tree = Tree(tuple(map(tuple, edit["paths"])), f"{base.name or 'tree'}_edited") \
        if edit and edit["sig"] == sig else base
    st.session_state["designed_tree"] = {"name": tree.name, "paths": tree.as_lists(), "source": src.label}
    with st.expander(f"Edit {tree.name or 'this tree'} (add or remove nodes)", expanded=tree is not base):
        c1, c2, c3 = st.columns([2, 2, 1])
        c1.text_input("Add node (0-based ranks, e.g. 0,1)", key="tree_add",
                      help="a path of ranks, one per head: 0,1 = head 2's second guess under head 1's top guess; "
                           "its parent must be in the tree")
        c1.button("add node", key="tree_add_btn", on_click=_edit_tree, args=("add", tree, sig, K, R))
        drop_stale("tree_remove", [str(list(p)) for p in tree.sorted_paths])
        c2.selectbox("Remove node (and its descendants)", [str(list(p)) for p in tree.sorted_paths],
                     key="tree_remove")
        c2.button("remove node", key="tree_remove_btn", on_click=_edit_tree, args=("remove", tree, sig, K, R))
        c3.button("reset edits", key="tree_reset_btn", on_click=_edit_tree, args=("reset", tree, sig, K, R),
                  disabled=tree is base)
        if st.session_state.get("tree_edit_error"):
            st.error(st.session_state["tree_edit_error"])
        if tree is not base:
            d = tree_diff(base, tree)
            st.caption(f"edited from {base.name}: added {[list(p) for p in d['only_b']] or 'none'}, removed "
                       f"{[list(p) for p in d['only_a']] or 'none'}")

    # numbers: full labels, each explained
    cols = st.columns(3)
    cols[0].metric("nodes", tree.nodes)
    cols[1].metric("depth", tree.depth)
    if speedup is not None:
        cols[2].metric("predicted speedup (optimizer's tree)", f"{speedup['best']['speedup']:.2f}x",
                       help=f"expected tokens per step / relative step cost t(n+1)/t(1) at context {speedup['context']}")
    cols = st.columns(3)
    shown_row = tree_table([tree], src.acc, src.calib)[0]
    for col, key in zip(cols, ("predicted_independent", "predicted_joint", "predicted_replay")):
        if shown_row.get(key) is not None:
            col.metric(f"{key} (tokens/step)", f"{shown_row[key]:.3f}", help=TREE_HELP[key])

    # the tree and its mask, linked by the selected node; optional real tokens as labels
    labels = None
    tokens = st.session_state.get("head_tokens")
    if tokens and st.session_state.get("tree_show_tokens", True):
        table = tokens["table"]
        if tree.depth <= len(table) and tree.max_rank < len(table[0]):
            labels = {p: table[len(p) - 1][p[-1]] for p in tree.paths} | {(): tokens["root"]}
    probs = {p: base_value(p) for p in tree.paths}
    names = figures.node_names(tree)
    if st.session_state.get("tree_focus_pick", -1) >= len(names):
        st.session_state["tree_focus_pick"] = -1
    focus = st.session_state.get("tree_focus_pick", -1)
    focus = None if focus < 0 else focus
    st.plotly_chart(figures.tree_chart(tree, probs, labels, focus, title=f"{tree.name}: {tree.nodes} nodes, depth "
                                       f"{tree.depth} ({model}, {src.label})"),
                    key="tree_chart", on_select=lambda: _focus_from("tree_chart"), selection_mode="points")
    st.caption(f"drawn tree: {tree.nodes} nodes, depth {tree.depth}. Node colour and edge width: path probability "
               f"({'empirical' if base_value is empirical else 'independence'}); node label: "
               f"{'the token of its head for the prompt' if labels else 'rank (0 = top-1)'}. Drag to zoom, "
               "double-click to reset; click a node to select its mask row.")
    left, right = st.columns([3, 2])
    with left:
        st.plotly_chart(figures.mask_chart(tree, focus), key="mask_chart", on_select=lambda: _focus_from("mask_chart"),
                        selection_mode="points")
    with right:
        st.selectbox("Selected node (= mask row)", [-1] + list(range(len(names))), key="tree_focus_pick",
                     format_func=lambda i: "none" if i < 0 else f"row {i}: {list(names[i]) if i else 'root'}",
                     help="click a tree node or a mask cell to select it here")
        if focus is not None:
            p = names[focus]
            st.markdown(f"**row {focus}**: " + (f"node `{list(p)}`, head {len(p)}'s rank-{p[-1]} guess (0 = top-1)"
                                                 if p else "the root (the base model's own token)"))
            st.markdown(f"attends to rows {[names.index(p[:d]) for d in range(len(p) + 1)]} (root, ancestors, "
                        f"itself); P(accepted) {probs.get(p, 1.0):.4f}"
                        + (f"; token `{labels[p]}`" if labels and p in labels else ""))
        st.caption("Mask: row = query node, column = key node, in buffer order (node i = the i-th path sorted by "
                   "depth then ranks, 0 = root); dark = may attend.")
    with st.expander("Label nodes with real tokens for a prompt (loads the demo model)"):
        prompt = st.text_input("Prompt", "What is the capital of France?", key="tree_prompt")
        c1, c2 = st.columns(2)
        tok_model = c1.text_input("Model (blank: the demo)", key="tree_tok_model").strip()
        tok_heads = c2.text_input("Heads (blank: the demo heads)", key="tree_tok_heads").strip()
        st.checkbox("show tokens", value=True, key="tree_show_tokens")
        if st.button("Load the model and label the tree", key="tree_tokens_btn"):
            try:
                st.session_state["head_tokens"] = head_token_table(prompt, max(R, 10), tok_model, tok_heads)
                st.rerun()
            except (WorkbenchError, OSError, RuntimeError) as e:
                st.error(_clean(e))
        if tokens:
            st.caption(f"tokens for: {tokens['prompt']!r}; the base model's next token is {tokens['root']!r}"
                       + ("" if labels or not st.session_state.get("tree_show_tokens", True) else
                          f"; this tree needs more heads or ranks than the {len(tokens['table'])} heads x "
                          f"top-{len(tokens['table'][0])} labelled"))

    if against != "(nothing)":
        other = pick_tree(against, options, K, R)
        if other is not None:
            compare_trees(tree, other, indep, empirical, src)

    # expected tokens per step vs budget, named trees
    left, right = st.columns(2)
    top = 256
    curves = {"optimal (independence)": expected_curve(src.acc, top, max_depth, max_rank)}
    if empirical is not None:
        curves["optimal (empirical)"] = expected_curve(empirical, top, max_depth, max_rank)
    named = [(label, pick_quiet(spec)) for label, spec in options.items() if label != OPTIMIZER]
    named = [t if t.name else Tree(t.paths, label) for label, t in named if t is not None]
    rows = tree_table(named, src.acc, src.calib, curves["optimal (independence)"])
    points = {t.name: (t.nodes, expected_length(t, base_value)) for t in named if t.depth <= K and t.max_rank < R}
    with left:
        figure(plots.expected_curve_plot({k: (range(len(v)), v) for k, v in curves.items()}, points,
                                         (tree.nodes, expected_length(tree, base_value))),
               "Expected tokens per step of the optimal tree at each budget; points: named trees.")
    if speedup is not None:
        with right:
            figure(plots.speedup_curve({"predicted": ([r["budget"] for r in speedup["rows"]],
                                                      [r["speedup"] for r in speedup["rows"]])},
                                       {"predicted": (speedup["best"]["budget"], speedup["best"]["speedup"])},
                                       speedup.get("measured")),
                   f"Predicted speedup at context {speedup['context']} ({speedup['latency']})"
                   + (f"; black diamonds: speedups measured by the sweep {speedup['sweep']} (labelled by tree)"
                      if speedup.get("measured") else "; no sweep CSV found to draw measured speedups"))
    else:
        right.markdown("**Reading the tokens/step numbers** (tokens emitted per decoding step, the base model's "
                       "own token included):\n\n" + "\n".join(f"- **{k}**: {v}" for k, v in TREE_HELP.items()))
    st.subheader("Named trees: tokens per step")
    st.dataframe(pd.DataFrame(rows), hide_index=True, column_config=TABLE_COLUMNS)

    # buffers and exports
    with st.expander("Tree buffers (Medusa's generate_medusa_buffers)"):
        buf = tree_buffers(tree, max(tree.max_rank + 1, 10))
        c1, c2 = st.columns(2)
        c1.dataframe(pd.DataFrame({"tree_indices": buf["tree_indices"].tolist(),
                                   "position_ids": buf["position_ids"].tolist(),
                                   "parent": buf["parents"].tolist()}))
        c2.dataframe(pd.DataFrame(buf["retrieve_indices"].tolist()).add_prefix("d"))
    st.subheader("Export")
    provenance = dict(expected_acceptance_length=expected_length(tree, base_value),
                      budget=budget if tree is designed else tree.nodes,
                      method=(model if tree is designed else "edited" if tree is not base else shown.split(":")[0]),
                      acceptance_model="empirical paths" if base_value is empirical else "independence",
                      max_depth=max_depth, max_rank=max_rank, heads=K, ranks=R, accuracies=src.folder or src.label)
    if tree is not base:
        provenance["edited_from"] = base.name
    if speedup is not None and tree is designed:
        provenance |= dict(predicted_speedup=speedup["best"]["speedup"],
                           relative_latency=speedup["best"]["relative_latency"], latency=speedup["latency"],
                           context=speedup["context"])
    tree_file = record_json(tree_record(Tree(tree.paths, tree.name or "tree"), **provenance))
    cols = st.columns(len(FORMATS))
    suffix = {"medusa": ".py", "json": ".json", "trtllm": ".trtllm.txt", "vllm": ".vllm.json", "eagle": ".eagle.py"}
    notes = []
    for col, fmt in zip(cols, FORMATS):
        text, warns = export_tree(tree, fmt, heads=K)
        if fmt == "json":  # a tree file like `workbench optimize --out` writes: with its provenance
            text = tree_file
        col.download_button(fmt, text, file_name=f"{tree.name}{suffix[fmt]}", key=f"export_{fmt}",
                            help=f"{tree.name} in the {fmt} format")
        notes += [f"**{fmt}**: {w}" for w in warns]
    for note in notes:
        st.warning(note)
    with st.expander("The JSON tree file (what the json button downloads)"):
        st.code(tree_file, language="json")


def pick_quiet(spec):
    """A named tree for the table (None if a file there cannot be read: the selectbox reports it when picked)."""
    from workbench.tree import load_tree

    try:
        return load_tree(str(spec) if isinstance(spec, Path) else spec)
    except WorkbenchError:
        return None


def compare_trees(a, b, indep, empirical, src: Source) -> None:
    """Two trees side by side: nodes only in A, only in B, shared, and what each brings on this calibration."""
    from workbench.calibration import tree_table
    from workbench.tree import Tree, tree_diff

    d = tree_diff(a, b)
    st.subheader(f"A = {a.name} vs B = {b.name}")
    value = empirical or indep
    rows = tree_table([Tree(a.paths, f"A: {a.name}"), Tree(b.paths, f"B: {b.name}")], src.acc, src.calib)
    st.dataframe(pd.DataFrame(rows), hide_index=True, column_config=TABLE_COLUMNS)
    st.caption(f"{len(d['shared'])} shared nodes, {len(d['only_a'])} only in A, {len(d['only_b'])} only in B; "
               "predicted tokens per step in the table (names as on the rest of the page)")
    status_a = {p: "shared" for p in d["shared"]} | {p: "only in A" for p in d["only_a"]}
    status_b = {p: "shared" for p in d["shared"]} | {p: "only in B" for p in d["only_b"]}
    c1, c2 = st.columns(2)
    c1.plotly_chart(figures.tree_chart(a, status=status_a, title=f"A: {a.name} ({a.nodes} nodes)"), key="diff_a")
    c2.plotly_chart(figures.tree_chart(b, status=status_b, title=f"B: {b.name} ({b.nodes} nodes)"), key="diff_b")
    diff = [{"node": str(list(p)), "in": side, "P(accepted)": value(p)}
            for side, ps in (("only A", d["only_a"]), ("only B", d["only_b"])) for p in ps]
    if diff:
        st.dataframe(pd.DataFrame(diff), hide_index=True, column_config={"P(accepted)": st.column_config.NumberColumn(
            help=f"the node's path probability ({'empirical' if empirical else 'independence'}): what it adds "
                 "to the expected tokens per step", format="%.4f")})


def hardware_choice(src: Source, value, budget: int, max_depth: int, max_rank: int) -> dict | None:
    """The hardware-aware tree: latency CSV from the calibration folder (or given), context nearest typical use;
    measured speedups from a sweep CSV (when one is found) to draw on the predicted curve."""
    from workbench.latency import hardware_aware

    found = src.calib.latency_files() if src.calib else []
    with st.sidebar:
        path = file_input("latency CSV", "tree_lat", ["csv"], found + found_csvs("latency"))
    if path is None:
        st.error("hardware-aware needs a latency CSV (columns context,tokens,seconds): run `workbench latency` "
                 "or give one in the sidebar")
        return None
    try:
        df = read_latency_file(str(path), _stamp(path))
        with st.sidebar:
            table, ctx = latency_picker(df, "tree", path.name, src.calib.typical_context() if src.calib else None)
        res = hardware_aware(value, table, max_depth, max_rank, max_budget=budget, name=f"hardware_{budget}")
    except WorkbenchError as e:
        st.error(_clean(e))
        return None
    st.sidebar.caption(f"latency {path.name}, context {ctx}: best of budgets 1..{res['rows'][-1]['budget']}")
    res |= {"context": ctx, "latency": path.name}
    sweeps = found_csvs("sweep")
    if sweeps:
        pick = st.sidebar.selectbox("measured speedups from", [str(f) for f in sweeps] + ["(none)"],
                                    key="tree_hw_sweep", format_func=lambda f: Path(f).name)
        if pick != "(none)":
            try:
                res |= {"measured": {"measured (sweep)": plots.measured_speedups(read_sweep_file(pick, _stamp(pick)))},
                        "sweep": Path(pick).name}
            except WorkbenchError as e:
                st.error(_clean(e))
    return res


def latency_picker(df: pd.DataFrame, key: str, name: str, target: float | None) -> tuple[dict, int]:
    """{tokens: seconds} of one setup (model/device/dtype) at one context, picked with selectboxes when the file
    has several; the context defaults to the one nearest the calibration's typical cache length."""
    from workbench.latency import latency_table

    keys = [c for c in ("model", "device", "dtype") if c in df.columns]
    if keys:
        labels = df[keys].astype(str).agg(" / ".join, axis=1)
        setups = list(dict.fromkeys(labels))
        if len(setups) > 1:
            df = df[labels == st.selectbox("latency setup", setups, key=f"{key}_setup")]
    contexts = sorted(int(c) for c in df["context"].unique())
    near = min(range(len(contexts)), key=lambda i: abs(contexts[i] - target)) if target else 0
    ctx = st.selectbox("latency context (cache length)", contexts, index=near, key=f"{key}_ctx") \
        if len(contexts) > 1 else contexts[0]
    return latency_table(df, ctx, what=f"latency {name}")


def user_tree_input(num_heads: int) -> list:
    """An extra tree to compare: uploaded file, path, reference name or literal. A bad one is an st.error."""
    from workbench.tree import Tree, load_tree

    with st.sidebar.expander("Your own tree (to show, edit, compare)"):
        up = st.file_uploader("Tree file (JSON or Medusa choices .py)", type=["json", "py", "txt"], key="tree_user_up")
        spec = str(_upload_path(up)) if up is not None else st.text_input(
            "... or a path, reference name, or literal like [[0], [0, 0], [1]]", key="tree_user_spec").strip()
    if not spec:
        return []
    try:
        t = load_tree(spec, num_heads=num_heads)
    except WorkbenchError as e:
        st.error(f"your tree: {_clean(e)}")
        return []
    return [t if t.name else Tree(t.paths, "your tree")]


# ----------------------------------------------------------------------------------------------- page 2: calibration

def calibration_page() -> None:
    from workbench.accuracies import accuracy_frame
    from workbench.optimize import acc_value_fn

    st.title("Calibration")
    src = accuracy_source("cal")
    if src is None:
        st.info("Pick a calibration folder or an accuracy table in the sidebar.")
        return
    acc = src.acc
    if src.calib:
        split = st.sidebar.radio("Prompts", ["fit", "holdout", "all"], key="cal_split",
                                 help="fit: what calibrate's trees are built from; holdout: the prompts kept aside")
        acc, ranks = src.calib.accuracies(split), src.calib.ranks(split)
        cols = st.columns(5)
        cols[0].metric("heads", acc.shape[0])
        cols[1].metric("top-k", acc.shape[1])
        cols[2].metric("positions", len(ranks))
        cols[3].metric("prompts", ranks["prompt_id"].nunique())
        cols[4].metric("model", str(src.calib.meta.get("model") or "demo"))
        if not len(ranks):
            st.info(f"the {split} split of this calibration is empty")
            return
    left, right = st.columns(2)
    with left:
        figure(plots.accuracy_heatmap(acc), "a_k^(i): share of positions where head k's rank-i guess is the token.")
    with right:
        figure(plots.cumulative_topk(acc), "Top-k accuracy: the running sum over ranks.")
    st.download_button("accuracies.csv", accuracy_frame(acc).to_csv(index=False), file_name="accuracies.csv",
                       key="cal_download")
    st.subheader("Independence vs measured path probability")
    if not src.calib:
        st.info("Measured path probabilities need the ranks of a calibration folder; an accuracy table has only "
                "the per-head marginals.")
        return
    n = st.slider("top paths (by measured probability)", 5, 200, 40, key="cal_top")
    measured = src.calib.path_probabilities(split)
    value = acc_value_fn(acc)
    top = sorted(measured, key=lambda p: (-measured[p], len(p), p))[:n]
    ind, mea = [value(p) for p in top], [measured[p] for p in top]
    left, right = st.columns(2)
    with left:
        figure(plots.independence_vs_measured(top, ind, mea),
               "Above the diagonal the independence assumption under-estimates a path; below it over-estimates.")
    df = pd.DataFrame({"path": [str(list(p)) for p in top], "measured": mea, "independence": ind})
    df.insert(1, "measured / independence", df["measured"] / df["independence"].where(df["independence"] > 0))
    df["depth"] = [len(p) for p in top]
    right.dataframe(df, hide_index=True, column_config={
        "path": st.column_config.TextColumn(help="0-based ranks, one per head (0 = top-1)"),
        "measured": st.column_config.NumberColumn(
            help="share of ALL positions whose heads' ranks start with this path (past the answer's end counts as "
                 "a miss: the decoder cannot accept tokens the answer does not have)", format="%.4f"),
        "independence": st.column_config.NumberColumn(
            help="product of a_k^(i); each a_k^(i) is a share of only the positions where head k HAS a target "
                 "(it excludes the last k positions of each answer)", format="%.4f"),
        "measured / independence": st.column_config.NumberColumn(
            help="1 = heads independent. The two use different denominators, so even a one-head path [i] reads "
                 "below 1 (about positions with a head-k target / all positions): that part is the answer's end, "
                 "not head correlation", format="%.3f")})
    right.caption("measured / independence < 1 for one-head paths is the denominators, not an error: measured counts "
                  "over all positions, a_k^(i) over the positions where head k has a target.")


# ----------------------------------------------------------------------------------------------- page 3: trade-offs

def has_typical(sweep: pd.DataFrame) -> bool:
    return "epsilon" in sweep.columns and bool(sweep["epsilon"].notna().any())


def read_sweep_or_error(path: Path | None) -> pd.DataFrame | None:
    if path is None:
        return None
    try:
        return read_sweep_file(str(path), _stamp(path))
    except WorkbenchError as e:
        st.error(_clean(e))
        return None


def tradeoffs_page() -> None:
    from workbench.latency import hardware_aware

    st.title("Trade-offs")
    sweeps = found_csvs("sweep")
    typical = [f for f in sweeps if _readable_typical(f)]
    with st.sidebar:
        st.subheader("Sweep (Fig. 4, predicted vs measured)")
        sweep_path = file_input("sweep CSV", "to_sweep", ["csv"], sweeps)
        st.subheader("Typical-acceptance sweep (Fig. 5)")
        typ_path = file_input("typical sweep CSV", "to_typ", ["csv"], sweeps, default=typical[0] if typical else None)
        st.subheader("Latency")
        lat_path = file_input("latency CSV", "to_lat", ["csv"], found_csvs("latency"))
    sweep, typ, lat = read_sweep_or_error(sweep_path), read_sweep_or_error(typ_path), None
    if sweep_path is None:
        st.info("No sweep CSV found: run `workbench sweep --out FILE.csv` (for example into the calibration folder), "
                "or give one in the sidebar.")
    if lat_path is not None:
        try:
            lat = read_latency_file(str(lat_path), _stamp(lat_path))
        except WorkbenchError as e:
            st.error(_clean(e))
    else:
        st.info("No latency CSV found: run `workbench latency`, or give one in the sidebar.")

    if sweep is not None:
        st.caption(f"sweep {sweep_path.name}: {len(sweep)} rows")
        c1, c2 = st.columns(2)
        with c1:
            figure(plots.tokens_vs_candidates(sweep), "Paper Fig. 4a: sparse (optimal) vs dense trees.")
        with c2:
            figure(plots.speed_vs_candidates(sweep), "Paper Fig. 4b.")
    c1, c2 = st.columns(2)
    with c1:
        if typ is not None and has_typical(typ):
            rows = typ.dropna(subset=["epsilon"])
            sizes = sorted(int(n) for n in rows["nodes"].dropna().unique())
            quality = st.selectbox("quality measure", [c for c in ("exact_match", "mean_logprob", "distinct_2")
                                                       if c in typ.columns] or ["acceleration_rate"], key="to_quality")
            drop_stale("to_nodes", sizes)
            nodes = st.selectbox("tree size (nodes)", sizes, key="to_nodes") if len(sizes) > 1 else None
            rows = rows if nodes is None else rows[rows["nodes"] == nodes]
            eps_values = sorted(float(e) for e in rows["epsilon"].unique())
            drop_stale("to_eps", eps_values)
            eps = st.select_slider("epsilon (posterior threshold)", eps_values, key="to_eps",
                                   value=min(eps_values, key=lambda e: abs(e - 0.09))) \
                if len(eps_values) > 1 else eps_values[0]
            at = rows[rows["epsilon"] == eps]
            figure(plots.epsilon_plot(typ, quality, mark=eps, nodes=nodes),
                   f"Paper Fig. 5 ({typ_path.name}): typical acceptance. At epsilon {eps:g}: "
                   f"{at['acceleration_rate'].mean():.2f} tokens/step, {quality} {at[quality].mean():.3f} "
                   "(mean over temperatures).")
        else:
            st.info("No typical-acceptance rows (epsilon) in the sweeps found: run the sweep with --temperature > 0 "
                    "and several --epsilon values for Fig. 5.")
    with c2:
        if sweep is not None and any(c in sweep.columns for c in plots.PREDICTED_COLUMNS):
            figure(plots.predicted_vs_measured(sweep), "Calibration's prediction vs the live decoder; each point "
                                                       "labelled by its tree (once, at its first prediction).")
    if sweep is not None:
        with st.expander("Sweep rows"):
            st.dataframe(sweep, hide_index=True)

    if lat is not None:
        c1, c2 = st.columns(2)
        with c1:
            figure(plots.latency_curve(lat), f"latency {lat_path.name}")
        with c2:
            src = accuracy_source("to")
            if src is None:
                st.info("The predicted-speedup curve needs accuracies (a calibration folder or table).")
                return
            try:
                table, ctx = latency_picker(lat, "to", lat_path.name,
                                            src.calib.typical_context() if src.calib else None)
                top = max(int(n) for n in table) - 1
                budget = st.slider("budget (max tree nodes)", 1, max(top, 2), top, key="to_budget") if top > 1 else 1
                K, R = src.acc.shape
                values = {"independence": src.acc}
                if src.calib:
                    values["empirical paths"] = src.calib.joint_value("fit")
                res = {name: hardware_aware(v, table, K, min(R, 10), max_budget=budget) for name, v in values.items()}
            except WorkbenchError as e:
                st.error(_clean(e))
                return
            measured = {f"measured (sweep {sweep_path.name})": plots.measured_speedups(sweep)} \
                if sweep is not None and len(plots.measured_speedups(sweep)[0]) else None
            figure(plots.speedup_curve({n: ([row["budget"] for row in r["rows"]], [row["speedup"] for row in r["rows"]])
                                        for n, r in res.items()},
                                       {n: (r["best"]["budget"], r["best"]["speedup"]) for n, r in res.items()},
                                       measured),
                   f"Predicted speedup = expected tokens per step / (t(n+1)/t(1)) at context {ctx}; best: " +
                   "; ".join(f"{n} {r['best']['budget']} nodes, {r['best']['speedup']:.2f}x" for n, r in res.items()))
            if max(r["best"]["speedup"] for r in res.values()) < 1:
                st.warning(f"Speculation does not pay on this hardware at context {ctx}: no tree is predicted to "
                           "beat vanilla greedy decoding.")


def _readable_typical(path: Path) -> bool:
    try:
        return has_typical(read_sweep_file(str(path), _stamp(path)))
    except WorkbenchError:
        return False


# ----------------------------------------------------------------------------------------------- page 4: live decode

def tree_choice() -> str | None:
    """A tree spec for the live decoder: the designer's tree, a reference, a calibrated tree file, or typed in."""
    from workbench.tree import REFERENCE_DIR

    options = []
    designed = st.session_state.get("designed_tree")
    if designed:
        options.append(f"designed: {designed['name']} ({len(designed['paths'])} nodes)")
    files = sorted(f for f in (REPO_ROOT / "trees").glob("*.json"))
    options += [f.stem for f in sorted(REFERENCE_DIR.glob("*.json"))] + [f"file: {f.name}" for f in files]
    options.append("other: a path or literal")
    pick = st.selectbox("Tree", options, key="live_tree")
    if pick.startswith("designed: "):
        return json.dumps(designed["paths"])
    if pick.startswith("file: "):
        return str(REPO_ROOT / "trees" / pick[len("file: "):])
    if pick.startswith("other"):
        return st.text_input("Tree file or literal", "[[0], [0, 0], [1], [0, 1], [0, 0, 0]]",
                             key="live_tree_spec").strip() or None
    return pick


def progress_line(label: str, done: int, total: int, steps: int, elapsed: float, stop: str | None = None) -> str:
    """`Medusa: 24/64 tokens in 10 steps (2.40 tokens/step), 3.1 tokens/s, ETA 13 s` (`stop`: why it ended)."""
    rate = done / elapsed if elapsed > 0 else 0.0
    eta = f"stopped ({stop})" if stop else f"ETA {(total - done) / rate:.0f} s" if rate > 0 else "ETA ?"
    return (f"{label}: {done}/{total} tokens in {steps} steps ({done / max(steps, 1):.2f} tokens/step), "
            f"{rate:.1f} tokens/s, {eta}")


def progress_view(label: str, total: int, tokenizer):
    """(on_step, finish): an `on_step` callback for medusa_generate / vanilla_generate drawing a progress bar
    (tokens so far, steps, tokens/s, ETA) and the answer so far, and `finish(result)` for its last state (a
    decode may stop early, at EOS)."""
    bar, text = st.progress(0.0, text=f"{label}: starting..."), st.empty()
    seen: list[int] = []
    start, steps = time.perf_counter(), [0]

    def on_step(step) -> None:
        seen.extend(step.tokens)
        steps[0] += 1
        bar.progress(min(len(seen) / total, 1.0),
                     text=progress_line(label, len(seen), total, steps[0], time.perf_counter() - start))
        text.caption(f"{label} so far: " + tokenizer.decode(seen, skip_special_tokens=True)[-600:])

    def finish(result) -> None:
        bar.progress(1.0, text=progress_line(label, len(seen), total, steps[0], time.perf_counter() - start,
                                             result.stop_reason or "done"))
        text.empty()
    return on_step, finish


def live_page() -> None:
    import torch

    from workbench.decode import ACCEPTANCE_KINDS, Acceptance, medusa_generate, vanilla_generate
    from workbench.divergence import compare
    from workbench.generation import prepare_prompt
    from workbench.tree import load_tree

    st.title("Live decode")
    with st.sidebar:
        spec = tree_choice()
        kind = st.selectbox("Acceptance", ACCEPTANCE_KINDS, key="live_kind",
                            help="greedy: lossless; typical: Medusa's posterior threshold; nucleus: exact sampling")
        temperature = st.number_input("temperature", 0.0, 5.0, 0.0 if kind == "greedy" else 0.7, 0.1,
                                      key=f"live_temp_{kind}")
        epsilon = st.number_input("epsilon", 0.001, 1.0, 0.09, 0.01, key="live_eps", disabled=kind != "typical")
        delta = st.number_input("delta", 0.0, 5.0, 0.3, 0.05, key="live_delta", disabled=kind != "typical")
        top_p = st.number_input("top_p", 0.01, 1.0, 0.8, 0.05, key="live_top_p", disabled=kind != "nucleus")
        max_new = st.number_input("max new tokens", 1, 2048, 64, key="live_max_new")
        model = st.text_input("Model (blank: the demo SmolLM2-135M-Instruct)", key="live_model").strip()
        heads = st.text_input("Heads (blank: the demo heads)", key="live_heads").strip()
        device = st.selectbox("device", ["auto", "cpu", "cuda"], key="live_device")
        threads = st.number_input("torch CPU threads", 1, max(os.cpu_count() or 1, torch.get_num_threads()),
                                  torch.get_num_threads(), key="live_threads",
                                  help="torch.set_num_threads for this decode (process-wide; default: the current "
                                       "setting); more threads than free cores slow small models down")
        vanilla = st.checkbox("also run vanilla greedy", value=True, key="live_vanilla")
    prompt = st.text_area("Prompt", "Give three tips for staying healthy.", key="live_prompt")
    if st.button("Load model and generate", type="primary", key="live_go"):
        try:
            if not spec:
                raise WorkbenchError("no tree: pick one or type a literal like [[0], [0, 0], [1]]")
            tree = load_tree(spec)
            acc = Acceptance(kind, temperature, epsilon, delta, top_p)
            torch.set_num_threads(int(threads))
            base, tok, hd = load_model(model, heads, device)
            ids = prepare_prompt(tok, prompt)
            with st.spinner("Warming up (lazy initialisation is not timed)..."):
                medusa_generate(base, hd, tok, ids, tree, 2, acc)
                if vanilla:
                    vanilla_generate(base, tok, ids, 2)
            on_step, finish = progress_view("Medusa", int(max_new), tok)
            med = medusa_generate(base, hd, tok, ids, tree, int(max_new), acc, on_step=on_step)
            finish(med)
            van = None
            if vanilla:
                on_step, finish = progress_view("vanilla greedy", int(max_new), tok)
                van = vanilla_generate(base, tok, ids, int(max_new), on_step=on_step)
                finish(van)
            steps = [i for i, s in enumerate(med.steps) for _ in s.tokens]
            st.session_state["live_result"] = dict(
                medusa=med.to_dict(), vanilla=van.to_dict() if van else None,
                compare=compare(med, van) if van else None, pieces=figures.token_pieces(tok, med.token_ids),
                steps=steps, tree=tree.name or f"{tree.nodes}-node tree", model=model or "demo")
        except (WorkbenchError, OSError, RuntimeError) as e:
            st.error(_clean(e))
    res = st.session_state.get("live_result")
    if not res:
        st.info("Press the button to load the model (once; it stays cached) and decode the prompt.")
        return
    med, van, cmp = res["medusa"], res["vanilla"], res["compare"]
    cols = st.columns(5)
    cols[0].metric("tokens/step", f"{med['acceleration_rate']:.2f}",
                   help="tokens emitted per Medusa step (1 + accepted tree tokens), averaged over this answer")
    cols[1].metric("new tokens", med["new_tokens"])
    cols[2].metric("Medusa tokens/s", f"{med['tokens_per_s']:.1f}", help="new tokens / (prefill + decode time)")
    if cmp:
        cols[3].metric("vanilla tokens/s", f"{cmp['vanilla_tokens_per_s']:.1f}")
        cols[4].metric("speedup (one prompt)", f"{cmp['speedup']:.2f}x",
                       help="Medusa tokens/s over vanilla tokens/s on this one prompt")
        st.caption("One prompt is a noisy measurement: timings of a single short answer vary by tens of percent "
                   "between runs (other processes, CPU frequency, the answer's own predictability). For a speedup "
                   "to rely on, run `workbench sweep` over many prompts and read it on the Trade-offs page.")
    st.caption(f"{res['model']}, tree {res['tree']}; each colour is one decoding step (hover for its number)."
               + ("" if not cmp else " Output equals vanilla greedy." if cmp["matches_greedy"] else
                  " Output differs from vanilla greedy (expected with typical/nucleus acceptance)."))
    st.markdown(figures.coloured_tokens_html(res["pieces"], res["steps"]), unsafe_allow_html=True)
    c1, c2 = st.columns([2, 1])
    with c1:
        figure(plots.accepted_lengths(med["accepted_lengths"]))
    with c2:
        rates = {"Medusa": med["tokens_per_s"]} | ({"vanilla": van["tokens_per_s"]} if van else {})
        figure(plots.throughput_bars(rates))
    with st.expander("Per step"):
        st.dataframe(pd.DataFrame(med["per_step"]), hide_index=True)


# ----------------------------------------------------------------------------------------------- navigation

PAGES = [(tree_page, "Tree designer", "tree"), (calibration_page, "Calibration", "calibration"),
         (tradeoffs_page, "Trade-offs", "tradeoffs"), (live_page, "Live decode", "live")]


def main() -> None:
    st.set_page_config(page_title="Medusa tree workbench", layout="wide")
    nav = st.navigation([st.Page(fn, title=title, url_path=url, default=i == 0)
                         for i, (fn, title, url) in enumerate(PAGES)])
    keep_settings()
    nav.run()


if __name__ == "__main__":
    main()
