"""The accuracy table acc[K, R] (row k-1 = head k, column i = 0-based rank i): its checks and its file formats.

acc[k-1, i] is the rate at which head k's rank-i guess is the true token (exact rank, not cumulative top-k). One
canonical CSV (`head,rank,accuracy[,count]`, 1-based) is written; read are that CSV, Medusa's cumulative
`head,top1,top5,...` table and Medusa's `*_heads_accuracy.pt` hit tensors.
"""
from __future__ import annotations

import re
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd

from workbench import WorkbenchError
from workbench.core.io import atomic_write_text
from workbench.trees.tree import MAX_RANK

SUM_SLACK = 1e-6  # a head's exact-rank accuracies may sum to at most 1 + this (float noise in CSVs)
MAX_HEADS, MAX_RANKS = 1 << 10, MAX_RANK  # what a table may name, checked before a [heads, ranks] grid is built
MAX_CELLS = 1 << 24  # heads x ranks (128 MB of float64): a larger grid is a damaged file, and costs minutes to plan


def check_table_size(heads: int, ranks: int, what: str) -> None:
    """Refuse a table of heads x ranks past the limits above, before anything of that size is built or read."""
    if heads > MAX_HEADS or ranks > MAX_RANKS or heads * ranks > MAX_CELLS:
        raise WorkbenchError(f"{what}: {heads} heads x {ranks} ranks; at most {MAX_HEADS} heads, {MAX_RANKS} ranks "
                             f"and {MAX_CELLS} cells (more than any model's heads measure: a damaged file)")


def check_accuracies(acc, what: str = "accuracies") -> np.ndarray:
    """acc[K, R] as float64, or a WorkbenchError naming the first bad entry."""
    try:
        a = np.asarray(acc, dtype=np.float64)
    except (TypeError, ValueError):
        raise WorkbenchError(f"{what}: not a numeric table [heads, ranks]") from None
    if a.ndim != 2 or a.shape[0] == 0 or a.shape[1] == 0:
        raise WorkbenchError(f"{what}: expected a non-empty table [heads, ranks], got shape {list(a.shape)}")
    bad = ~np.isfinite(a) | (a < 0) | (a > 1)
    if bad.any():
        k, i = map(int, np.argwhere(bad)[0])
        raise WorkbenchError(f"{what}: head {k + 1} rank {i + 1} has accuracy {a[k, i]}, outside [0, 1] "
                             "(each value is a probability)")
    sums = a.sum(axis=1)
    if (sums > 1 + SUM_SLACK).any():
        k = int(np.argmax(sums > 1 + SUM_SLACK))
        raise WorkbenchError(f"{what}: head {k + 1} accuracies sum to {sums[k]:.6f} > 1; values must be "
                             "exact-rank hit rates (top-i minus top-(i-1)), not cumulative top-i accuracies")
    return a


def accuracies_from_hits(hits) -> tuple[np.ndarray, np.ndarray]:
    """Medusa's per-head exact-rank hit tensors [positions, topk] -> (acc[K, R], positions per head [K]).

    Each head is normalised by its own row count (head k has k fewer positions per prompt than head 0), not
    by a hard-coded prompts*steps as in Medusa's script.
    """
    import torch  # deferred: a CSV table is read without torch (the planner and the app never load it)

    if not isinstance(hits, (list, tuple)) or not hits:
        raise WorkbenchError("heads accuracy data: expected a non-empty list of per-head tensors [positions, topk]")
    rows, counts = [], []
    for k, h in enumerate(hits):
        if not isinstance(h, torch.Tensor) or h.ndim != 2 or h.shape[0] == 0 or h.shape[1] == 0:
            shape = list(h.shape) if isinstance(h, torch.Tensor) else type(h).__name__
            raise WorkbenchError(f"heads accuracy data: head {k + 1} is {shape}, expected a non-empty "
                                 "bool tensor [positions, topk]")
        if h.shape[1] != hits[0].shape[1]:
            raise WorkbenchError(f"heads accuracy data: head {k + 1} has top-{h.shape[1]} columns but head 1 "
                                 f"has {hits[0].shape[1]}")
    check_table_size(len(hits), hits[0].shape[1], "heads accuracy data")
    for h in hits:  # summed per column: no float copy of [positions, topk]
        rows.append((h.sum(dim=0, dtype=torch.float64) / h.shape[0]).numpy())
        counts.append(h.shape[0])
    acc = check_accuracies(np.stack(rows), "heads accuracy data")
    return acc, np.asarray(counts, dtype=np.int64)


def read_accuracies(path, return_counts: bool = False):
    """acc[K, R] from the canonical CSV (`head,rank,accuracy[,count]`, 1-based) or Medusa's `*_heads_accuracy.pt`.

    `count` (optional) is the number of positions measured for that head, so accuracy * count = hits.
    With return_counts, returns (acc, counts[K] or None).
    """
    f = Path(path)
    if not f.is_file():
        raise WorkbenchError(f"accuracy file {path}: no such file (give a CSV head,rank,accuracy or a "
                             "Medusa *_heads_accuracy.pt)")
    if f.stat().st_size == 0:
        raise WorkbenchError(f"accuracy file {path} is empty")
    acc, counts = _read_pt(f) if f.suffix in (".pt", ".pth") else _read_csv(f)
    return (acc, counts) if return_counts else acc


def _read_pt(f: Path):
    import torch  # deferred (see accuracies_from_hits)

    try:  # memory-mapped (zip format): shapes are checked before the hits are read; torch's notes on pickle
        with warnings.catch_warnings():  # protocols say nothing a user can act on
            warnings.simplefilter("ignore")
            hits = torch.load(f, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(f))
    except Exception:  # the unpickler raises anything on a damaged file (KeyError, struct.error, ...): one line
        raise WorkbenchError(f"accuracy file {f}: not a readable torch file of plain tensors (expected Medusa's "
                             "heads_accuracy.py output: a list of bool tensors [positions, topk])") from None
    return accuracies_from_hits(hits)


def _read_csv(f: Path):
    what = f"accuracy file {f}"
    try:
        df = pd.read_csv(f)
    except pd.errors.EmptyDataError:
        raise WorkbenchError(f"{what} is empty") from None
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as e:
        raise WorkbenchError(f"{what}: not a readable CSV ({str(e).splitlines()[0][:120]})") from None
    df.columns = [str(c).strip().lower() for c in df.columns]
    if "head" in df.columns and "rank" not in df.columns and _topk_columns(df):
        return check_accuracies(_from_topk(df, what), what), None
    missing = [c for c in ("head", "rank", "accuracy") if c not in df.columns]
    if missing:
        raise WorkbenchError(f"{what}: missing column(s) {', '.join(missing)}; expected head,rank,accuracy[,count] "
                             f"with 1-based head and rank (found: {', '.join(df.columns)})")
    if df.empty:
        raise WorkbenchError(f"{what} has a header but no rows")
    cols = ["head", "rank", "accuracy"] + (["count"] if "count" in df.columns else [])
    num = df[cols].apply(pd.to_numeric, errors="coerce")
    for c, most in (("head", MAX_HEADS), ("rank", MAX_RANKS)):
        bad = num[c].isna() | (num[c] < 1) | (num[c] % 1 != 0) | (num[c] > most)
        if bad.any():
            i = int(np.argmax(bad.to_numpy()))
            raise WorkbenchError(f"{what}: row {i + 2}: {c} '{df[c].iloc[i]}' is not a positive integer (1-based, "
                                 f"at most {most})")
    bad = num["accuracy"].isna() | (num["accuracy"] < 0) | (num["accuracy"] > 1)
    if bad.any():
        i = int(np.argmax(bad.to_numpy()))
        raise WorkbenchError(f"{what}: row {i + 2}: accuracy '{df['accuracy'].iloc[i]}' is not a number in [0, 1]")
    num[["head", "rank"]] = num[["head", "rank"]].astype(int)
    dup = num.duplicated(["head", "rank"])
    if dup.any():
        i = int(np.argmax(dup.to_numpy()))
        raise WorkbenchError(f"{what}: head {num['head'].iloc[i]} rank {num['rank'].iloc[i]} appears twice")
    k, r = int(num["head"].max()), int(num["rank"].max())
    check_table_size(k, r, what)
    if len(num) != k * r:  # a gap, named before a K x R grid is built (R may be 2^20): among the first len + 1
        have = set(zip(num["head"], num["rank"]))
        h, i = next((h, i) for h in range(1, k + 1) for i in range(1, r + 1) if (h, i) not in have)
        raise WorkbenchError(f"{what}: head {h} rank {i} is missing (need every rank 1..{r} of every head 1..{k})")
    grid = num.pivot(index="head", columns="rank", values="accuracy").reindex(index=range(1, k + 1),
                                                                               columns=range(1, r + 1))
    acc = check_accuracies(grid.to_numpy(), what)
    counts = None
    if "count" in num.columns:
        c = num.groupby("head")["count"].first().reindex(range(1, k + 1))
        if c.isna().any() or (c < 0).any() or (c >= 1 << 62).any():
            raise WorkbenchError(f"{what}: count must be a non-negative number of positions for every head")
        counts = c.to_numpy().astype(np.int64)
    return acc, counts


def _topk_columns(df) -> dict[int, str]:
    """{k: column} of cumulative top-k accuracy columns `top1`, `top5`, `top_10`, `top-3` ..."""
    out = {}
    for c in df.columns:
        m = re.fullmatch(r"top[_-]?(\d+)", c)
        if m and int(m.group(1)) >= 1:
            out[int(m.group(1))] = c
    return dict(sorted(out.items()))


def _from_topk(df, what: str) -> np.ndarray:
    """Medusa's own `head,top1,top5[,...]` table (cumulative top-k accuracy per head; head 0-based as Medusa
    numbers its heads, or 1-based) as acc[K, max k]. Between two known k the gain is spread evenly over
    the ranks in between: top1=0.6, top5=0.8 gives rank 1 0.6 and ranks 2..5 0.05 each, so every top-k that the
    file states is kept exactly. The largest k is checked before any row is made: a `top1000000000` column is a
    damaged file, not a billion rows."""
    cols = _topk_columns(df)
    num = df[["head", *cols.values()]].apply(pd.to_numeric, errors="coerce")
    if num.isna().any().any():
        i, j = np.argwhere(num.isna().to_numpy())[0]
        raise WorkbenchError(f"{what}: row {i + 2}: {num.columns[j]} '{df[num.columns[j]].iloc[i]}' is not a number")
    check_table_size(len(num), max(cols), what)
    shift = 1 if num["head"].min() == 0 else 0  # Medusa counts heads from 0
    ks = np.array([0, *cols])
    top = num[list(cols.values())].to_numpy(dtype=np.float64)  # [rows, columns] cumulative
    prev = np.concatenate([np.zeros((len(top), 1)), top[:, :-1]], axis=1)
    bad = ~((top >= 0) & (top <= 1)) | (top < prev - 1e-9)
    if bad.any():
        i, j = map(int, np.argwhere(bad)[0])
        raise WorkbenchError(f"{what}: row {i + 2}: {list(cols.values())[j]} {top[i, j]} must be in [0, 1] and not "
                             "below the smaller top-k columns (cumulative top-k accuracy)")
    heads = num["head"].to_numpy() + shift
    if sorted(heads) != list(range(1, len(heads) + 1)):
        raise WorkbenchError(f"{what}: heads {', '.join(f'{h - shift:g}' for h in heads[:8])}: number them 0..K-1 "
                             "(Medusa's way) or 1..K, each once")
    widths = np.diff(ks)  # ranks each column's gain is spread over
    return np.repeat((top - prev) / widths, widths, axis=1)[np.argsort(heads)]  # [K, max k]


def accuracy_frame(acc, counts=None):
    """The canonical long table: one row per (head, rank), 1-based, as a pandas DataFrame."""
    a = check_accuracies(acc)
    k, r = a.shape
    df = pd.DataFrame({"head": np.repeat(np.arange(1, k + 1), r), "rank": np.tile(np.arange(1, r + 1), k),
                       "accuracy": a.reshape(-1)})
    if counts is not None:
        df["count"] = np.repeat(np.asarray(counts, dtype=np.int64), r)
    return df


def write_accuracies(path, acc, counts=None) -> Path:
    """Write the canonical CSV (atomically); read_accuracies reads it back exactly."""
    return atomic_write_text(path, accuracy_frame(acc, counts).to_csv(index=False))
