"""topk.parquet, the one checked reader (and the fingerprint of the heads a calibration measured).

A per-step tree is replayed on these log-probabilities: a float where a list is stored, a NaN, an ascending list or
a row given twice would replay silently wrong (or end in a traceback), so each is refused in one line, before any
replay, naming the column and the fix (record it again).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from workbench import WorkbenchError

RECORD = "record it again (`workbench calibrate --record-topk`)"


def calibration_heads_sha256(meta: dict) -> str | None:
    """The fingerprint of the heads a calibration measured: meta.json's args.heads_sha256 (calibrate/run.py writes it
    there, with the run's other arguments), or None for a folder that predates it."""
    args = meta.get("args")
    want = args.get("heads_sha256") if isinstance(args, dict) else None
    return want if isinstance(want, str) and want else None


def _stacked(col: pd.Series, what: str, name: str, topk: int, kind: str) -> np.ndarray:
    """[rows, topk] of a list column: every cell a list of `topk` numbers of `kind` ('f' float, 'i' integer)."""
    cells = col.to_numpy()
    if not all(isinstance(c, (np.ndarray, list, tuple)) for c in cells):
        bad = next(c for c in cells if not isinstance(c, (np.ndarray, list, tuple)))
        raise WorkbenchError(f"{what}: {name} should hold a list of {topk} per row, found {type(bad).__name__} "
                             f"{str(bad)[:30]!r}: {RECORD}")
    if not all(len(c) == topk for c in cells):
        raise WorkbenchError(f"{what}: {name} does not hold {topk} values per row (the calibration's top-k): {RECORD}")
    try:
        arr = np.stack([np.asarray(c) for c in cells]) if len(cells) else np.zeros((0, topk))
    except ValueError:
        raise WorkbenchError(f"{what}: {name} holds ragged lists: {RECORD}") from None
    if len(cells) and (arr.dtype.kind not in ("fi" if kind == "f" else "iu")):
        raise WorkbenchError(f"{what}: {name} should hold {'numbers' if kind == 'f' else 'integer token ids'}, found "
                             f"{arr.dtype}: {RECORD}")
    return arr


def read_topk(f: Path, what: str, num_heads: int, topk: int) -> pd.DataFrame:
    """topk.parquet, checked: prompt_id (text), position (integers >= 0), one row per (prompt_id, position), and per
    head k logp_k (topk finite log-probabilities <= 0, descending) and ids_k (topk token ids >= 0)."""
    try:
        df = pd.read_parquet(f)
    except Exception as e:  # pyarrow raises many types for a damaged file
        raise WorkbenchError(f"{what}: {f.name} is not a readable parquet file ({type(e).__name__})") from None
    need = ["prompt_id", "position"] + [f"{c}_{k + 1}" for k in range(num_heads) for c in ("logp", "ids")]
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise WorkbenchError(f"{what}: {f.name} lacks column(s) {', '.join(missing)}: {RECORD}")
    if not pd.api.types.is_integer_dtype(df["position"]) or not df["position"].between(0, (1 << 31) - 1).all():
        raise WorkbenchError(f"{what}: {f.name}'s position should hold integers >= 0, found {df['position'].dtype}: "
                             f"{RECORD}")
    if df["prompt_id"].isna().any() or not all(isinstance(p, str) for p in df["prompt_id"]):
        raise WorkbenchError(f"{what}: {f.name}'s prompt_id should hold text ids (those of ranks.parquet): {RECORD}")
    dup = df.duplicated(["prompt_id", "position"])
    if dup.any():
        r = df[dup].iloc[0]
        raise WorkbenchError(f"{what}: {f.name} holds {int(dup.sum())} duplicated row(s) (prompt {r['prompt_id']!r} "
                             f"position {int(r['position'])}): one row per held-out position; {RECORD}")
    for k in range(1, num_heads + 1):
        lp = _stacked(df[f"logp_{k}"], what, f"{f.name}'s logp_{k}", topk, "f")
        if not np.isfinite(lp).all() or (lp > 1e-4).any():
            raise WorkbenchError(f"{what}: {f.name}'s logp_{k} holds NaN, infinite or positive values (log-"
                                 f"probabilities are finite and <= 0): {RECORD}")
        if (np.diff(lp, axis=1) > 1e-6).any():
            raise WorkbenchError(f"{what}: {f.name}'s logp_{k} is not in descending order (rank 0 first) in every "
                                 f"row: {RECORD}")
        ids = _stacked(df[f"ids_{k}"], what, f"{f.name}'s ids_{k}", topk, "i")
        if (ids < 0).any():
            raise WorkbenchError(f"{what}: {f.name}'s ids_{k} holds negative token ids: {RECORD}")
    df["prompt_id"] = df["prompt_id"].astype("string")
    return df
