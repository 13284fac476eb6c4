"""The sweep CSV (`workbench sweep --out`): its columns, its reader and writer. Torch-free, so the app and the
report read sweeps without loading torch (running a sweep: sweep.py)."""
from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import numpy as np
import pandas as pd

from workbench import WorkbenchError
from workbench.core.io import atomic_write_text, read_csv

SWEEP_COLUMNS = ["run", "config", "tree", "kind", "nodes", "depth", "batch_size", "acceptance", "temperature", "epsilon", "delta",
                 "acceleration_rate", "overhead", "speedup", "decode_speedup",
                 "tokens_per_s", "vanilla_tokens_per_s", "mean_step_s",
                 "step_ms", "forward_ms", "decoder_overhead",
                 "predicted_independent", "predicted_joint", "predicted_replay", "predicted_replay_fit", "replay_swept",
                 "exact_match", "near_tie_divergences", "mismatches",
                 "mean_logprob", "distinct_2", "num_prompts", "mean_prompt_tokens", "new_tokens", "steps",
                 "model", "prompts", "max_new_tokens", "device", "dtype", "calibration", "decoder_version", "setting"]
# Headers of earlier versions, still resumable (their rows are kept and rewritten with the new cells empty): before
# `decode_speedup` (the decoding phase's speedup, what plans predict), and before `setting` (provenance.py) too.
EARLIER_COLUMNS = ([c for c in SWEEP_COLUMNS if c != "decode_speedup"],
                   [c for c in SWEEP_COLUMNS if c not in ("decode_speedup", "setting")])
# Column names of sweep CSVs written before the predictions got one set of names (calibrate/folder.py): read_sweep
# renames them, so older files still open in the app and the report. The only place the old names live.
OLD_COLUMNS = {"predicted_tokens_per_step": "predicted_independent", "calibration_holdout": "predicted_replay",
               "predicted_walk": "predicted_replay_fit", "replay": "replay_swept"}
SWEEP_REQUIRED = ("tree", "nodes", "acceleration_rate")  # on every row of every sweep (read_sweep)
SWEEP_TEXT = ("run", "config", "tree", "kind", "acceptance", "model", "prompts", "device", "dtype", "calibration",
              "decoder_version", "setting")


def _cell(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float):
        return repr(v)
    return str(v)


def read_sweep(path, what: str = "sweep CSV") -> pd.DataFrame:
    """A sweep CSV (`workbench sweep`), checked for the columns every plot needs: numeric columns hold finite
    numbers (or nothing), nodes and acceleration_rate on every row."""
    df = read_csv(path, what, SWEEP_REQUIRED, "workbench sweep --out FILE.csv")
    df = df.rename(columns={old: new for old, new in OLD_COLUMNS.items() if new not in df.columns})
    for c in df.columns:
        if c in SWEEP_TEXT or c not in SWEEP_COLUMNS:
            continue
        num = pd.to_numeric(df[c], errors="coerce")
        required = c in ("nodes", "acceleration_rate")
        bad = (num.isna() & (df[c].notna() | required)) | np.isinf(num)
        if bad.any():
            i = int(np.argmax(bad.to_numpy()))
            raise WorkbenchError(f"{what} {path}: row {i + 2}: column {c} holds {str(df[c].iloc[i])[:40]!r}, "
                                 f"not a finite number")
        df[c] = num
    if "batch_size" not in df.columns:  # sweeps before batched decoding ran one prompt at a time
        df["batch_size"] = 1
    rules = {"nodes": (0, 1 << 12, True), "depth": (0, 64, True), "batch_size": (1, 1 << 16, True),
             "acceleration_rate": (1 - 1e-9, 1e4, False)}  # every step emits at least one token
    for c, (low, high, integer) in rules.items():
        if c not in df.columns:
            continue
        v = df[c]
        bad = v.notna() & (~v.between(low, high) | ((v % 1 != 0) if integer else False))
        if bad.any():
            i = int(np.argmax(bad.to_numpy()))
            raise WorkbenchError(f"{what} {path}: row {i + 2}: {c} {v.iloc[i]:g} is not "
                                 f"{'an integer' if integer else 'a number'} in [{low:g}, {high:g}]"
                                 f"{' (tokens per step: every step emits at least one)' if c == 'acceleration_rate' else ''}")
    return df


def has_typical(sweep: pd.DataFrame) -> bool:
    """Whether a sweep holds typical-acceptance rows (an epsilon on some row): the rows of the paper's Fig. 5."""
    return "epsilon" in sweep.columns and bool(sweep["epsilon"].notna().any())


def checked_speedup(row) -> tuple[float, str]:
    """(speedup, phase) of a sweep row as a prediction is checked against it: the decoding phase's (decode_speedup,
    what plans predict), or in a sweep written before that column the end-to-end one, said so (its prefill pulls it
    towards 1)."""
    value = row.get("decode_speedup") if hasattr(row, "get") else None
    try:
        if value is not None and math.isfinite(float(value)):
            return float(value), "decoding phase"
    except (TypeError, ValueError):
        pass
    return float(row["speedup"]), "end to end (an older sweep: prefill included)"


def read_sweep_rows(path) -> list[dict]:
    """The rows of a sweep CSV as strings (kept verbatim on rewrite), or [] when it does not exist yet."""
    f = Path(path)
    if not f.is_file() or f.stat().st_size == 0:
        return []
    try:
        with f.open(newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            same = reader.fieldnames in (SWEEP_COLUMNS, *EARLIER_COLUMNS)
            rows = list(reader) if same else []
    except (UnicodeDecodeError, csv.Error) as e:
        raise WorkbenchError(f"--out {path}: exists but is not a readable CSV ({str(e)[:100]}); use another --out") from None
    if not same:
        raise WorkbenchError(f"--out {path}: exists but is not a sweep CSV of this version (columns differ); "
                             "use another --out")
    if rows:
        read_sweep(path, "--out")  # every row well-formed, or one line before hours of decoding
    return rows


def row_cells(row: dict) -> dict:
    """A sweep row as the CSV's cells: every column, missing or NaN as empty, floats as repr (they read back
    bit-identical)."""
    return {k: _cell(row.get(k)) for k in SWEEP_COLUMNS}


def write_rows(path, rows: list[dict]) -> None:
    """Rewrite the whole CSV atomically (rows of cells, as row_cells or read_sweep_rows give them)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=SWEEP_COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    atomic_write_text(path, buf.getvalue())


def _kind(df):
    """Tree family per sweep row: the sweep's `kind` column (optimal / dense / given), else from the tree name."""
    if "kind" in df.columns:
        return df["kind"].fillna("").astype(str)
    return df["tree"].astype(str).map(lambda t: "dense" if "dense" in t.lower() else "sparse")


def tree_rows(sweep, acceptance: str | None = "greedy"):
    """Sweep rows of real trees (not the vanilla baseline row), with one acceptance rule when the CSV says."""
    df = sweep.assign(_kind=_kind(sweep))
    df = df[df["_kind"] != "vanilla"]
    if acceptance and "acceptance" in df.columns:
        df = df[df["acceptance"] == acceptance]
    return df


def vanilla_value(sweep, column: str) -> float | None:
    """The vanilla greedy baseline's value of `column` in a sweep (its last vanilla row), None when absent."""
    if "kind" not in sweep.columns or column not in sweep.columns:
        return None
    v = sweep.loc[sweep["kind"] == "vanilla", column].dropna()
    return float(v.iloc[-1]) if len(v) else None
