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
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import streamlit as st

from workbench import REPO_ROOT, WorkbenchError
from workbench import plots

UPLOAD_DIR = Path(tempfile.gettempdir()) / "workbench-app"
EXAMPLE_CSV = "head,rank,accuracy\n1,1,0.55\n1,2,0.12\n1,3,0.05\n2,1,0.30\n2,2,0.10\n2,3,0.05\n"


# ----------------------------------------------------------------------------------------------- inputs, cached reads

def calibration_root() -> Path:
    return Path(os.environ.get("WORKBENCH_CALIBRATION_ROOT") or REPO_ROOT / "calibration")


def results_root() -> Path:
    """Where sweep CSVs are looked for: $WORKBENCH_RESULTS_ROOT (default: docs/results/ in this checkout)."""
    return Path(os.environ.get("WORKBENCH_RESULTS_ROOT") or REPO_ROOT / "docs" / "results")


def calibration_folders() -> list[Path]:
    return [m.parent for m in sorted(calibration_root().glob("*/meta.json"))]


def _stamp(path) -> float:
    """Modification time (0 if missing): part of every cache key, so an edited file is read again."""
    p = Path(path)
    return max((f.stat().st_mtime for f in ([p] + (list(p.iterdir()) if p.is_dir() else []))), default=0.0) \
        if p.exists() else 0.0


def _clean(err: Exception) -> str:
    """An error message without the temporary folder an upload was written to."""
    return str(err).replace(str(UPLOAD_DIR) + os.sep, "upload ")


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
def load_calibration_bundle(folder: str, stamp: float) -> dict:
    """Everything the pages read from a calibration folder; cache_resource: big and read-only, never copied."""
    from workbench.calibrate import load_calibration, path_probabilities

    out = {"folder": folder, "meta": json.loads((Path(folder) / "meta.json").read_text())
           if (Path(folder) / "meta.json").is_file() else {}}
    for split in ("all", "fit", "holdout"):
        out[f"acc_{split}"], out[split] = load_calibration(folder, split)
    out["probs_fit"] = path_probabilities(out["fit"])
    return out


@st.cache_resource(max_entries=8)
def split_path_probabilities(folder: str, stamp: float, split: str) -> dict:
    from workbench.calibrate import path_probabilities

    return path_probabilities(load_calibration_bundle(folder, stamp)[split])


@st.cache_data(max_entries=16)
def read_accuracy_file(path: str, stamp: float):
    from workbench.optimize import read_accuracies

    return read_accuracies(path, return_counts=True)


@st.cache_data(max_entries=256)
def holdout_decoder(folder: str, stamp: float, paths: tuple) -> float | None:
    """What a live greedy decoder with this tree measures on the holdout prompts (their calibrated answers)."""
    from workbench.calibrate import decoder_walk
    from workbench.tree import Tree

    held = load_calibration_bundle(folder, stamp)["holdout"]
    return decoder_walk(Tree(paths), held) if len(held) else None


@st.cache_data(max_entries=8)
def read_latency_file(path: str, stamp: float) -> pd.DataFrame:
    from workbench.tradeoffs import read_latency

    return read_latency(path)


@st.cache_data(max_entries=8)
def read_sweep_file(path: str, stamp: float) -> pd.DataFrame:
    from workbench.tradeoffs import read_sweep

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
    """Accuracies a page works on: acc[K, R] and, for a calibration folder, its cached bundle."""

    acc: object
    label: str
    calib: dict | None = None
    folder: str | None = None
    stamp: float = 0.0


def file_input(label: str, key: str, types: list[str], found: list[Path] | None = None,
               paste: bool = False) -> Path | None:
    """A file from an upload, a path typed in (default: the first `found`), or pasted text."""
    up = st.file_uploader(f"Upload {label}", type=types, key=f"{key}_upload")
    if up is not None:
        return _upload_path(up)
    default = str(found[0]) if found else ""
    typed = st.text_input(f"... or a {label} path", value=default, key=f"{key}_path")
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
                bundle = load_calibration_bundle(folder.strip(), stamp)
            except WorkbenchError as e:
                st.error(_clean(e))
                return None
            return Source(bundle["acc_fit"], Path(folder).name, bundle, folder.strip(), stamp)
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


# ----------------------------------------------------------------------------------------------- page 1: tree designer

def head_token_table(prompt: str, topk: int, model: str = "", heads_path: str = "") -> dict:
    """The model's next token and every head's top-k tokens at the end of `prompt` (node labels); blank model
    and heads = the demo."""
    import torch

    from workbench.decode import head_proposer, logits_of, new_cache, prefill, prepare_prompt

    base, tok, heads = load_model(model, heads_path, "auto")
    ids = prepare_prompt(tok, prompt)
    with torch.inference_mode():
        hidden = prefill(base, torch.tensor([ids], device=base.device), new_cache(base))
        root = int(logits_of(base, hidden).argmax())
        table = head_proposer(heads, base, heads.num_heads, topk)(hidden, ids + [root])  # [K, topk]
    show = lambda i: tok.decode([int(i)]).replace("\n", "\\n").strip() or repr(tok.decode([int(i)]))  # noqa: E731
    return {"prompt": prompt, "root": show(root), "table": [[show(i) for i in row] for row in table.tolist()]}


def tree_page() -> None:
    from workbench.export import FORMATS, export_tree
    from workbench.optimize import (acc_value_fn, empirical_value_fn, expected_curve, expected_length, optimal_tree,
                                    optimal_tree_from)
    from workbench.tree import reference_trees, tree_buffers

    st.title("Tree designer")
    src = accuracy_source("tree")
    if src is None:
        st.info("Pick a calibration folder or an accuracy table in the sidebar to design a tree.")
        return
    K, R = src.acc.shape
    models = ["independence", "empirical paths", "hardware-aware"]
    model = st.sidebar.radio("Acceptance model", models, key="tree_model",
                             help="independence: product of per-head a_k^(i); empirical: measured joint path "
                                  "frequencies (calibration folder); hardware-aware: best predicted speedup "
                                  "under a latency curve, up to the budget")
    budget = st.sidebar.slider("Budget (tree nodes)", 1, 256, 63, key="tree_budget")
    max_depth = int_slider("Max depth (heads used)", K, K, "tree_depth")
    max_rank = int_slider("Max rank (top-k per head)", R, min(R, 10), "tree_rank")

    indep = acc_value_fn(src.acc)
    empirical = empirical_value_fn(src.calib["probs_fit"]) if src.calib else None
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
            tree = speedup["tree"]
        elif model == "empirical paths":
            tree = optimal_tree_from(empirical, budget, max_depth, max_rank, name=f"empirical_{budget}")
        else:
            tree = optimal_tree(src.acc, budget, max_depth, max_rank, name=f"optimal_{budget}")
    except WorkbenchError as e:
        st.error(_clean(e))
        return
    st.session_state["designed_tree"] = {"name": tree.name, "paths": tree.as_lists(), "source": src.label}

    # numbers
    cols = st.columns(6)
    cols[0].metric("nodes", tree.nodes)
    cols[1].metric("depth", tree.depth)
    cols[2].metric("tokens/step (independence)", f"{expected_length(tree, indep):.3f}")
    if empirical is not None:
        cols[3].metric("tokens/step (empirical)", f"{expected_length(tree, empirical):.3f}")
        held = holdout_decoder(src.folder, src.stamp, tuple(tree.paths))
        if held is not None:
            cols[4].metric("live decoder, holdout", f"{held:.3f}",
                           help="a greedy decoder replayed over the held-out prompts' answers: what decode measures")
    if speedup is not None:
        cols[5].metric("predicted speedup", f"{speedup['best']['speedup']:.2f}x")
    if tree.nodes < budget and model != "hardware-aware":
        st.caption(f"only {tree.nodes} nodes have a positive acceptance probability")

    # the tree and its mask, optional real tokens as labels
    labels = None
    tokens = st.session_state.get("head_tokens")
    if tokens and st.session_state.get("tree_show_tokens", True):
        table = tokens["table"]
        if tree.depth <= len(table) and tree.max_rank < len(table[0]):
            labels = {p: table[len(p) - 1][p[-1]] for p in tree.paths} | {(): tokens["root"]}
    probs = {p: base_value(p) for p in tree.paths}
    figure(plots.tree_figure(tree, probs, labels, title=f"{tree.name}: {tree.nodes} nodes, depth {tree.depth} "
                             f"({model}, {src.label})"),
           f"drawn tree: {tree.nodes} nodes, depth {tree.depth}. Edge colour and width: path probability "
           f"({'empirical' if base_value is empirical else 'independence'}); node label: "
           f"{'the token of its head for the prompt' if labels else 'rank (0 = top-1)'}.")
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

    # expected tokens per step vs budget, reference trees
    left, right = st.columns(2)
    top = 256
    curves = {"optimal (independence)": expected_curve(src.acc, top, max_depth, max_rank)}
    if empirical is not None:
        curves["optimal (empirical)"] = expected_curve(empirical, top, max_depth, max_rank)
    rows, points = [], {}
    user_trees = list(reference_trees().values()) + user_tree_input(K)
    for t in user_trees:
        row = {"tree": t.name, "nodes": t.nodes, "depth": t.depth}
        if t.depth > K or t.max_rank >= R:
            row["note"] = f"needs {t.depth} heads / top-{t.max_rank + 1}"
            rows.append(row)
            continue
        row["independence"] = expected_length(t, indep)
        if empirical is not None:
            row["empirical"] = expected_length(t, empirical)
            row["live decoder, holdout"] = holdout_decoder(src.folder, src.stamp, tuple(t.paths))
        row["optimal at same size"] = float(curves["optimal (independence)"][min(t.nodes, top)])
        rows.append(row)
        points[t.name] = (t.nodes, expected_length(t, base_value))
    with left:
        figure(plots.expected_curve_plot({k: (range(len(v)), v) for k, v in curves.items()}, points,
                                         (tree.nodes, expected_length(tree, base_value))),
               "Expected tokens per step of the optimal tree at each budget; points: reference trees.")
    with right:
        st.subheader("Reference trees")
        st.dataframe(pd.DataFrame(rows), hide_index=True)
    if speedup is not None:
        figure(plots.speedup_curve({"predicted": ([r["budget"] for r in speedup["rows"]],
                                                  [r["speedup"] for r in speedup["rows"]])},
                                   {"predicted": (speedup["best"]["budget"], speedup["best"]["speedup"])}))

    # buffers and exports
    with st.expander("Tree buffers (Medusa's generate_medusa_buffers)"):
        buf = tree_buffers(tree, max(tree.max_rank + 1, 10))
        c1, c2 = st.columns(2)
        c1.dataframe(pd.DataFrame({"tree_indices": buf["tree_indices"].tolist(),
                                   "position_ids": buf["position_ids"].tolist(),
                                   "parent": buf["parents"].tolist()}))
        c2.dataframe(pd.DataFrame(buf["retrieve_indices"].tolist()).add_prefix("d"))
    st.subheader("Export")
    cols = st.columns(len(FORMATS))
    suffix = {"medusa": ".py", "json": ".json", "trtllm": ".trtllm.txt", "vllm": ".vllm.json", "eagle": ".eagle.py"}
    notes = []
    for col, fmt in zip(cols, FORMATS):
        text, warns = export_tree(tree, fmt, heads=K)
        col.download_button(fmt, text, file_name=f"{tree.name}{suffix[fmt]}", key=f"export_{fmt}",
                            help=f"{tree.name} in the {fmt} format")
        notes += [f"**{fmt}**: {w}" for w in warns]
    for note in notes:
        st.warning(note)


def hardware_choice(src: Source, value, budget: int, max_depth: int, max_rank: int) -> dict | None:
    """The hardware-aware tree: latency CSV from the calibration folder (or given), context nearest typical use."""
    from workbench.tradeoffs import hardware_aware, typical_context

    found = sorted(Path(src.folder).glob("latency-*.csv")) if src.folder else []
    with st.sidebar:
        path = file_input("latency CSV", "tree_lat", ["csv"], found + found_csvs("latency"))
    if path is None:
        st.error("hardware-aware needs a latency CSV (columns context,tokens,seconds): run `workbench latency` "
                 "or give one in the sidebar")
        return None
    try:
        df = read_latency_file(str(path), _stamp(path))
        with st.sidebar:
            table, ctx = latency_picker(df, "tree", path.name, typical_context(src.folder) if src.folder else None)
        res = hardware_aware(value, table, max_depth, max_rank, max_budget=budget, name=f"hardware_{budget}")
    except WorkbenchError as e:
        st.error(_clean(e))
        return None
    st.sidebar.caption(f"latency {path.name}, context {ctx}: best of budgets 1..{res['rows'][-1]['budget']}")
    return res


def latency_picker(df: pd.DataFrame, key: str, name: str, target: float | None) -> tuple[dict, int]:
    """{tokens: seconds} of one setup (model/device/dtype) at one context, picked with selectboxes when the file
    has several; the context defaults to the one nearest the calibration's typical cache length."""
    from workbench.tradeoffs import latency_table

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

    with st.sidebar.expander("Compare your own tree"):
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
    from workbench.optimize import acc_value_fn, accuracy_frame

    st.title("Calibration")
    src = accuracy_source("cal")
    if src is None:
        st.info("Pick a calibration folder or an accuracy table in the sidebar.")
        return
    acc = src.acc
    if src.calib:
        split = st.sidebar.radio("Prompts", ["fit", "holdout", "all"], key="cal_split",
                                 help="fit: what calibrate's trees are built from; holdout: the prompts kept aside")
        acc = src.calib[f"acc_{split}"]
        meta = src.calib["meta"]
        cols = st.columns(5)
        cols[0].metric("heads", acc.shape[0])
        cols[1].metric("top-k", acc.shape[1])
        cols[2].metric("positions", len(src.calib[split]))
        cols[3].metric("prompts", src.calib[split]["prompt_id"].nunique())
        cols[4].metric("model", str(meta.get("model") or "demo"))
        if not len(src.calib[split]):
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
    measured = split_path_probabilities(src.folder, src.stamp, split)
    value = acc_value_fn(acc)
    top = sorted(measured, key=lambda p: (-measured[p], len(p), p))[:n]
    ind, mea = [value(p) for p in top], [measured[p] for p in top]
    left, right = st.columns(2)
    with left:
        figure(plots.independence_vs_measured(top, ind, mea),
               "Above the diagonal the independence assumption under-estimates a path; below it over-estimates.")
    df = pd.DataFrame({"path": [str(list(p)) for p in top], "depth": [len(p) for p in top], "measured": mea,
                       "independence": ind})
    df["measured / independence"] = df["measured"] / df["independence"].where(df["independence"] > 0)
    right.dataframe(df, hide_index=True)


# ----------------------------------------------------------------------------------------------- page 3: trade-offs

def tradeoffs_page() -> None:
    from workbench.optimize import empirical_value_fn
    from workbench.tradeoffs import hardware_aware, typical_context

    st.title("Trade-offs")
    with st.sidebar:
        st.subheader("Sweep")
        sweep_path = file_input("sweep CSV", "to_sweep", ["csv"], found_csvs("sweep"))
        st.subheader("Latency")
        lat_path = file_input("latency CSV", "to_lat", ["csv"], found_csvs("latency"))
    sweep = lat = None
    if sweep_path is None:
        st.info("No sweep CSV found: run `workbench sweep --out FILE.csv` (for example into the calibration folder), "
                "or give one in the sidebar.")
    else:
        try:
            sweep = read_sweep_file(str(sweep_path), _stamp(sweep_path))
        except WorkbenchError as e:
            st.error(_clean(e))
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
            if "epsilon" in sweep.columns and sweep["epsilon"].notna().any():
                quality = st.selectbox("quality measure", [c for c in ("exact_match", "mean_logprob", "distinct_2")
                                                           if c in sweep.columns] or ["acceleration_rate"],
                                       key="to_quality")
                figure(plots.epsilon_plot(sweep, quality), "Paper Fig. 5: typical acceptance.")
            else:
                st.info("No typical-acceptance rows (epsilon) in this sweep: run the sweep with --temperature > 0 "
                        "and several --epsilon values for Fig. 5.")
        with c2:
            if any(c in sweep.columns for c in plots.PREDICTED_COLUMNS):
                figure(plots.predicted_vs_measured(sweep), "Calibration's prediction vs the live decoder.")
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
                                            typical_context(src.folder) if src.folder else None)
                K, R = src.acc.shape
                values = {"independence": src.acc}
                if src.calib:
                    values["empirical paths"] = empirical_value_fn(src.calib["probs_fit"])
                res = {name: hardware_aware(v, table, K, min(R, 10)) for name, v in values.items()}
            except WorkbenchError as e:
                st.error(_clean(e))
                return
            figure(plots.speedup_curve({n: ([row["budget"] for row in r["rows"]], [row["speedup"] for row in r["rows"]])
                                        for n, r in res.items()},
                                       {n: (r["best"]["budget"], r["best"]["speedup"]) for n, r in res.items()}),
                   f"Predicted speedup = expected tokens per step / (t(n+1)/t(1)) at context {ctx}; best: " +
                   "; ".join(f"{n} {r['best']['budget']} nodes, {r['best']['speedup']:.2f}x" for n, r in res.items()))


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


def live_page() -> None:
    from workbench.decode import ACCEPTANCE_KINDS, Acceptance, compare, medusa_generate, prepare_prompt, \
        vanilla_generate
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
        vanilla = st.checkbox("also run vanilla greedy", value=True, key="live_vanilla")
    prompt = st.text_area("Prompt", "Give three tips for staying healthy.", key="live_prompt")
    if st.button("Load model and generate", type="primary", key="live_go"):
        try:
            if not spec:
                raise WorkbenchError("no tree: pick one or type a literal like [[0], [0, 0], [1]]")
            tree = load_tree(spec)
            acc = Acceptance(kind, temperature, epsilon, delta, top_p)
            base, tok, hd = load_model(model, heads, device)
            ids = prepare_prompt(tok, prompt)
            with st.spinner("Decoding..."):
                medusa_generate(base, hd, tok, ids, tree, 2, acc)  # warm-up: lazy inits are not timed
                if vanilla:
                    vanilla_generate(base, tok, ids, 2)
                med = medusa_generate(base, hd, tok, ids, tree, int(max_new), acc)
                van = vanilla_generate(base, tok, ids, int(max_new)) if vanilla else None
            steps = [i for i, s in enumerate(med.steps) for _ in s.tokens]
            st.session_state["live_result"] = dict(
                medusa=med.to_dict(), vanilla=van.to_dict() if van else None,
                compare=compare(med, van) if van else None, pieces=plots.token_pieces(tok, med.token_ids),
                steps=steps, tree=tree.name or f"{tree.nodes}-node tree", model=model or "demo")
        except (WorkbenchError, OSError, RuntimeError) as e:
            st.error(_clean(e))
    res = st.session_state.get("live_result")
    if not res:
        st.info("Press the button to load the model (once; it stays cached) and decode the prompt.")
        return
    med, van, cmp = res["medusa"], res["vanilla"], res["compare"]
    cols = st.columns(5)
    cols[0].metric("tokens/step", f"{med['acceleration_rate']:.2f}")
    cols[1].metric("new tokens", med["new_tokens"])
    cols[2].metric("Medusa tokens/s", f"{med['tokens_per_s']:.1f}")
    if cmp:
        cols[3].metric("vanilla tokens/s", f"{cmp['vanilla_tokens_per_s']:.1f}")
        cols[4].metric("speedup", f"{cmp['speedup']:.2f}x")
    st.caption(f"{res['model']}, tree {res['tree']}; each colour is one decoding step (hover for its number)."
               + ("" if not cmp else " Output equals vanilla greedy." if cmp["matches_greedy"] else
                  " Output differs from vanilla greedy (expected with typical/nucleus acceptance)."))
    st.markdown(plots.coloured_tokens_html(res["pieces"], res["steps"]), unsafe_allow_html=True)
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
    nav.run()


if __name__ == "__main__":
    main()
