"""Shared widgets of the app's pages: file and accuracy inputs, sliders, cached readers, error text.

Every page reads its inputs through these, so an upload, a found file and a typed path behave alike on each page,
and each file is read once per version (its modification time is part of every cache key). Bad input is an
`st.error` naming the problem, never a crash.
"""
from __future__ import annotations

import hashlib
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import streamlit as st

from workbench import REPO_ROOT, WorkbenchError

UPLOAD_DIR = Path(tempfile.gettempdir()) / "workbench-app"
EXAMPLE_CSV = "head,rank,accuracy\n1,1,0.55\n1,2,0.12\n1,3,0.05\n2,1,0.30\n2,2,0.10\n2,3,0.05\n"

def calibration_root() -> Path:
    from workbench.calibration import calibration_root

    return calibration_root(REPO_ROOT / "calibration")


def results_root() -> Path:
    """Where sweep CSVs are looked for: $WORKBENCH_RESULTS_ROOT (default: docs/results/ in this checkout)."""
    return Path(os.environ.get("WORKBENCH_RESULTS_ROOT") or REPO_ROOT / "docs" / "results")


def calibration_folders() -> list[Path]:
    from workbench.calibration import list_calibrations

    return list_calibrations(calibration_root())


def file_stamp(path) -> float:
    """Modification time (0 if missing): part of every cache key, so an edited file is read again."""
    p = Path(path)
    return max((f.stat().st_mtime for f in ([p] + (list(p.iterdir()) if p.is_dir() else []))), default=0.0) \
        if p.exists() else 0.0


def clean_error(err: Exception) -> str:
    """An error message naming an upload by its file name, not by the hash folder it was written to."""
    return re.sub(re.escape(str(UPLOAD_DIR) + os.sep) + r"[0-9a-f]+" + re.escape(os.sep), "", str(err))


def _stored(data: bytes, name: str) -> Path:
    """Bytes as a file on disk (the workbench readers take paths), in a folder named by their content hash."""
    folder = UPLOAD_DIR / hashlib.sha1(data).hexdigest()[:16]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    if not path.is_file():
        path.write_bytes(data)
    return path


def upload_path(upload) -> Path:
    """An uploaded file on disk, under its own file name."""
    return _stored(upload.getvalue(), Path(upload.name).name)


def _text_path(text: str, name: str) -> Path:
    """Pasted text as a file, like an upload."""
    return _stored(text.encode(), name)


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
    from workbench.io import find_csvs
    from workbench.latency import LATENCY_REQUIRED
    from workbench.sweep import SWEEP_REQUIRED

    return find_csvs((calibration_root(), results_root()), {"sweep": SWEEP_REQUIRED, "latency": LATENCY_REQUIRED}[kind])


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
        return upload_path(up)
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
            stamp = file_stamp(folder)
            try:
                cal = open_calibration(folder.strip(), stamp)
            except WorkbenchError as e:
                st.error(clean_error(e))
                return None
            return Source(cal.accuracies("fit"), Path(folder).name, cal, folder.strip(), stamp)
        path = file_input("accuracy CSV or Medusa heads_accuracy.pt", f"{key}_acc", ["csv", "pt", "pth"], paste=True)
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


def drop_stale(key: str, options) -> None:
    """Forget a kept choice that is no longer among a widget's options (e.g. a removed node), before drawing it."""
    if key in st.session_state and st.session_state[key] not in options:
        del st.session_state[key]


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


def read_sweep_or_error(path: Path | None) -> pd.DataFrame | None:
    if path is None:
        return None
    try:
        return read_sweep_file(str(path), file_stamp(path))
    except WorkbenchError as e:
        st.error(clean_error(e))
        return None
