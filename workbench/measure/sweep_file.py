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
from workbench.core.notes import FieldError, named, refused
from workbench.core.io import atomic_write_text, read_csv

SWEEP_VERSION = 2  # the format's version, on every row (`version`); 1: files without that column (upgrade_sweep)
SWEEP_COLUMNS = ["run", "config", "tree", "kind", "nodes", "depth", "batch_size", "acceptance", "temperature", "epsilon", "delta",
                 "tokens_per_step", "overhead", "speedup", "decode_speedup",
                 "tokens_per_s", "vanilla_tokens_per_s", "mean_step_s",
                 "step_ms", "forward_ms", "decoder_overhead",
                 "predicted_independent", "predicted_joint", "predicted_replay", "predicted_replay_fit", "replay_swept",
                 "exact_match", "near_tie_divergences", "mismatches",
                 "mean_logprob", "distinct_2", "num_prompts", "mean_prompt_tokens", "new_tokens", "steps",
                 "model", "prompts", "max_new_tokens", "device", "dtype", "calibration", "setting", "version"]
SWEEP_REQUIRED = ("tree", "nodes", "tokens_per_step")  # the header of every sweep (find_csvs finds sweeps by it)
SWEEP_FILLED = ("kind", "nodes", "batch_size", "acceptance", "tokens_per_step", "speedup")  # a cell on every row
SWEEP_TEXT = ("run", "config", "tree", "kind", "acceptance", "model", "prompts", "device", "dtype", "calibration",
              "setting")


def _cell(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float):
        return repr(v)
    return str(v)


def upgrade_sweep(df: pd.DataFrame) -> pd.DataFrame:
    """A sweep of version 1 (no `version` column) as this version, its cells unchanged (strings stay strings):
    the earlier names of the predictions and of tokens/step renamed, the decoder's version dropped (the `setting`
    says where a row was measured), and the columns version 1 files may lack added: batch_size 1 (files before
    batched decoding), empty decode_speedup, step timing and setting (not measured then). The only place the
    earlier shapes live; read_sweep and a resumed sweep call it."""
    renamed = {"predicted_tokens_per_step": "predicted_independent", "calibration_holdout": "predicted_replay",
               "predicted_walk": "predicted_replay_fit", "replay": "replay_swept", "acceleration_rate": "tokens_per_step"}
    df = df.rename(columns={old: new for old, new in renamed.items() if new not in df.columns})
    df = df.drop(columns=["decoder_version"], errors="ignore")
    if "batch_size" not in df.columns:
        df["batch_size"] = 1
    for c in ("decode_speedup", "step_ms", "forward_ms", "decoder_overhead", "setting"):
        if c not in df.columns:
            df[c] = np.nan
    df["version"] = SWEEP_VERSION
    return df


def _versioned(df: pd.DataFrame, what: str) -> pd.DataFrame:
    """`df` at this version (upgraded from version 1), or one line naming a newer version or the columns it lacks."""
    if "version" not in df.columns:
        df = upgrade_sweep(df)
    other = pd.to_numeric(df["version"], errors="coerce") != SWEEP_VERSION
    if other.any():
        i = int(np.argmax(other.to_numpy()))
        raise WorkbenchError(f"{what}: row {i + 2}: version {str(df['version'].iloc[i])[:20]!r}, but this workbench "
                             f"reads sweep CSVs of version {SWEEP_VERSION}: write it again with `workbench sweep`")
    lacking = [c for c in SWEEP_REQUIRED if c not in df.columns]
    if lacking:
        raise WorkbenchError(f"{what}: not a sweep CSV (no {', '.join(lacking)} column; `workbench sweep --out "
                             "FILE.csv` writes one)")
    missing = [c for c in SWEEP_COLUMNS if c not in df.columns]
    if missing:
        raise WorkbenchError(f"{what}: missing column(s) {', '.join(missing[:6])}"
                             f"{f' and {len(missing) - 6} more' if len(missing) > 6 else ''}: a sweep CSV has every "
                             "column `workbench sweep --out FILE.csv` writes")
    return df


def read_sweep(path, field: str | None = None) -> pd.DataFrame:
    """A sweep CSV (`workbench sweep`) at this version (upgrade_sweep), checked: every column there, numeric
    columns hold finite numbers (or nothing), SWEEP_FILLED on every row: every figure and table of the report and
    the app can be drawn from it. Its errors name it `sweep CSV PATH`, or by the request's `field` that gave it
    (core.notes.FieldError: a sweep's --out)."""
    what = named(field, path) if field else f"sweep CSV {path}"
    df = read_csv(path, field, ("tree", "nodes"), "workbench sweep --out FILE.csv", None if field else what)
    try:
        df = _versioned(df, what)
    except WorkbenchError as e:  # _versioned's, worded with `what`
        raise refused(field, "version", str(e)) from None
    for c in df.columns:
        if c in SWEEP_TEXT or c not in SWEEP_COLUMNS:
            continue
        num = pd.to_numeric(df[c], errors="coerce")
        required = c in SWEEP_FILLED
        bad = (num.isna() & (df[c].notna() | required)) | np.isinf(num)
        if bad.any():
            i = int(np.argmax(bad.to_numpy()))
            if pd.isna(df[c].iloc[i]):
                raise refused(field, "empty_cell", f"{what}: row {i + 2}: column {c} is empty (`workbench sweep` fills it)")
            raise refused(field, "not_a_number", f"{what}: row {i + 2}: column {c} holds {str(df[c].iloc[i])[:40]!r}, "
                          f"not a finite number")
        df[c] = num
    for c in SWEEP_TEXT:
        if c in SWEEP_FILLED and (df[c].isna() | (df[c].astype(str).str.strip() == "")).any():
            i = int(np.argmax((df[c].isna() | (df[c].astype(str).str.strip() == "")).to_numpy()))
            raise refused(field, "empty_cell", f"{what}: row {i + 2}: column {c} is empty (`workbench sweep` fills it)")
    rules = {"nodes": (0, 1 << 12, True), "depth": (0, 64, True), "batch_size": (1, 1 << 16, True),
             "tokens_per_step": (1 - 1e-9, 1e4, False)}  # every step emits at least one token
    for c, (low, high, integer) in rules.items():
        v = df[c]
        bad = v.notna() & (~v.between(low, high) | ((v % 1 != 0) if integer else False))
        if bad.any():
            i = int(np.argmax(bad.to_numpy()))
            raise refused(field, "out_of_range", f"{what}: row {i + 2}: {c} {v.iloc[i]:g} is not "
                          f"{'an integer' if integer else 'a number'} in [{low:g}, {high:g}]"
                          f"{' (every step emits at least one token)' if c == 'tokens_per_step' else ''}")
    return df


def has_typical(sweep: pd.DataFrame) -> bool:
    """Whether a sweep holds typical-acceptance rows (an epsilon on some row): the rows of the paper's Fig. 5."""
    return bool(sweep["epsilon"].notna().any())


def checked_speedup(row) -> tuple[float, str]:
    """(speedup, phase) of a sweep row as a prediction is checked against it: the decoding phase's (decode_speedup,
    what plans predict), or on a row without one (version 1 files did not time it) the end-to-end one, said so (its
    prefill pulls it towards 1)."""
    value = row.get("decode_speedup") if hasattr(row, "get") else None
    try:
        if value is not None and math.isfinite(float(value)):
            return float(value), "decoding phase"
    except (TypeError, ValueError):
        pass
    return float(row["speedup"]), "end to end (prefill included: the row has no decode_speedup)"


def read_sweep_rows(path) -> list[dict]:
    """The rows of a sweep CSV as strings (kept verbatim on rewrite; a version 1 file's upgraded, upgrade_sweep),
    or [] when it does not exist yet."""
    f = Path(path)
    if not f.is_file() or f.stat().st_size == 0:
        return []
    try:
        cells = pd.read_csv(f, dtype=str, keep_default_na=False)
    except (UnicodeDecodeError, ValueError, pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        raise FieldError("out", "unreadable", f"{{field}} {path}: exists but is not a readable CSV "
                         f"({str(e).splitlines()[0][:100]}); use another {{field}}") from None
    try:
        cells = _versioned(cells, f"{{field}} {path}")
    except WorkbenchError as e:
        raise FieldError("out", "old_version", f"{e}; or use another {{field}}") from None
    if set(cells.columns) != set(SWEEP_COLUMNS):
        raise FieldError("out", "not_a_sweep", f"{{field}} {path}: exists but is not a sweep CSV (columns "
                         f"{', '.join(sorted(set(cells.columns) - set(SWEEP_COLUMNS)))[:80]} are not a sweep's); "
                         "use another {field}")
    rows = [row_cells(r) for r in cells.to_dict("records")]
    if rows:
        read_sweep(path, "out")  # every row well-formed, or one line before hours of decoding
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


def tree_rows(sweep, acceptance: str | None = "greedy"):
    """Sweep rows of real trees (not the vanilla baseline row), of one acceptance rule (None: all)."""
    df = sweep[sweep["kind"] != "vanilla"]
    return df[df["acceptance"] == acceptance] if acceptance else df


def vanilla_value(sweep, column: str) -> float | None:
    """The vanilla greedy baseline's value of `column` in a sweep (its last vanilla row), None when it has none."""
    v = sweep.loc[sweep["kind"] == "vanilla", column].dropna()
    return float(v.iloc[-1]) if len(v) else None
