"""Latency: what one decoding step costs on this hardware per batch size and token count, and the speedup model.

A tree with more nodes accepts more tokens per step but each step costs more (Medusa paper Fig. 4, App. G), and
at batch size B every sequence of the batch pays for that step:
  latency   t(B, n): wall time of one verify forward of B sequences x n tokens (n - 1 tree nodes + the root) on
            caches of fixed length, next to the single-token step t(B, 1). The CSV keeps the spread of the
            repeats (min, quartiles, max) beside the median: on a shared CPU t is not even monotone in n, and a
            choice that rests on a difference inside that spread must say so;
  speedup   goodput B * tokens_per_step / t(B, n) relative to vanilla's B / t(B, 1) (`speedup`: the one formula
            every predicted speedup in the workbench goes through; B cancels);
  noise     a candidate's speedup over the interquartile range of its t (`speedup_range`); two candidates whose
            ranges overlap are within noise (`within_noise`).
This module owns the latency CSV (LATENCY_COLUMNS, written by `workbench latency`); where it lives in a calibration
folder, and the typical context it is read at, are calibration.py's.
"""
from __future__ import annotations

import math
from bisect import bisect_left
from typing import Mapping

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from workbench import WorkbenchError
from workbench.io import read_csv
from workbench.optimize import expected_curve, optimal_tree, optimal_tree_from, value_and_limits
from workbench.tree import MEDUSA_TOPK, Tree

SPREAD_COLUMNS = ["seconds_min", "seconds_q1", "seconds_q3", "seconds_max"]
LATENCY_COLUMNS = ["model", "device", "dtype", "batch", "context", "tokens", "seconds", *SPREAD_COLUMNS, "repeats"]
LATENCY_REQUIRED = ("context", "tokens", "seconds")  # what every reader needs; the rest name the setup or the spread
DEFAULT_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
MIN_SECONDS, MAX_SECONDS = 1e-9, 1e5  # a step faster than a nanosecond or slower than a day is not a timing
DEFAULT_CONTEXTS = (128, 1024)
DEFAULT_BATCHES = (1,)


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def latency_tree(nodes: int, depth: int = 5, topk: int = MEDUSA_TOPK) -> Tree:
    """An n-node tree shaped like optimal trees (wide near the root, narrowing with depth): node value
    prod_d 0.7 * 0.45^rank, best-first. For dense-mask kernels only the token count matters; the shape makes
    the 4-D mask and position ids the decoder's own, so a kernel that exploits structure is timed as used."""
    tree = optimal_tree_from(lambda p: math.prod(0.7 * 0.45 ** r for r in p), nodes, depth, topk,
                             name=f"latency_{nodes}")
    if tree.nodes < nodes:
        raise WorkbenchError(f"a tree of depth {depth} with top-{topk} per head has at most {tree.nodes} nodes, "
                             f"not {nodes}: use smaller --sizes (or heads with more heads)")
    return tree


# ----------------------------------------------------------------------------------------------- latency

def spread_row(times: list[float]) -> dict:
    """The CSV's timing columns of one point from its repeats: median as `seconds`, min, quartiles, max."""
    q1, med, q3 = np.quantile(times, [0.25, 0.5, 0.75])
    return dict(seconds=float(med), seconds_min=float(min(times)), seconds_q1=float(q1), seconds_q3=float(q3),
                seconds_max=float(max(times)), repeats=len(times))


@torch.inference_mode()
def measure_latency(model, sizes=DEFAULT_SIZES, contexts=DEFAULT_CONTEXTS, repeats: int = 10, warmup: int = 3,
                    heads=None, label: str = "", progress: bool = True, engine=None,
                    batches=DEFAULT_BATCHES) -> pd.DataFrame:
    """Wall time of one decoding step's model work per (batch, context, tokens), on the decoder's own step
    (`engine.verify_times`: static cache, 4-D tree mask repeated per sequence, compiled when the engine is):
    tokens = 1 is the vanilla step, tokens = n > 1 a verify forward of an (n-1)-node tree for each of the B
    sequences. Both include the lm_head over their rows (and, with `heads`, the heads' top-k of every sequence
    that a Medusa step needs). The caches are prefilled once per (batch, context) with random tokens and a verify
    leaves the lengths where they were, so the context stays fixed. Sizes are timed round-robin, `repeats` rounds, so that a load change
    on a shared machine hits every size alike; each point keeps the spread of its rounds."""
    # deferred: these load transformers, which the CLI's tree commands (importing this module) never need
    from workbench.engine import StepEngine, root_setup, tree_setup, verify_times
    from workbench.generation import context_length

    sizes = sorted({1, *(int(s) for s in sizes)})
    contexts = sorted({int(c) for c in contexts})
    batches = sorted({int(b) for b in batches})
    if repeats < 1 or warmup < 0:
        raise WorkbenchError(f"--repeats {repeats} / --warmup {warmup}: need repeats >= 1 and warmup >= 0")
    if sizes[0] < 1 or not contexts or contexts[0] < 1:
        raise WorkbenchError("--sizes and --context must be positive integers")
    if not batches or batches[0] < 1:
        raise WorkbenchError("--batch must be positive integers (sequences per step)")
    limit = context_length(model)
    if limit is not None and contexts[-1] + sizes[-1] > limit:
        raise WorkbenchError(f"context {contexts[-1]} + {sizes[-1]} tokens exceeds the model's {limit} positions: "
                             "use smaller --context/--sizes")
    dev = model.device
    vocab = model.get_input_embeddings().weight.shape[0]
    depth = min(5, heads.num_heads) if heads is not None else 5
    bufs = {n: tree_setup(latency_tree(n - 1, depth), model) if n > 1 else root_setup(model) for n in sizes}
    engine = engine or StepEngine(model)
    g = torch.Generator().manual_seed(0)
    dev_name, dtype = device_name(dev), str(model.dtype).replace("torch.", "")
    rows = []
    bar = tqdm(total=len(batches) * len(contexts) * (warmup + repeats), desc="latency", unit="round",
               disable=not progress, dynamic_ncols=True)
    for b in batches:
        for ctx in contexts:
            engine.prefill(torch.randint(vocab, (b, ctx), generator=g).to(dev), sizes[-1])
            times: dict[int, list[float]] = {n: [] for n in sizes}
            for i in range(warmup + repeats):
                for n in sizes:
                    t = verify_times(engine, bufs[n], heads, repeats=1, warmup=0, generator=g)
                    if i >= warmup:
                        times[n] += t
                bar.update(1)
            rows += [dict(model=label, device=dev_name, dtype=dtype, batch=b, context=ctx, tokens=n,
                          **spread_row(times[n])) for n in sizes]
    bar.close()
    df = pd.DataFrame(rows, columns=LATENCY_COLUMNS)
    t1 = df[df["tokens"] == 1].set_index(["batch", "context"])["seconds"]
    at = pd.MultiIndex.from_frame(df[["batch", "context"]])
    df["relative"] = df["seconds"].to_numpy() / t1.reindex(at).to_numpy()  # t(B, n) / t(B, 1)
    return df


def read_latency(path) -> pd.DataFrame:
    """A latency CSV, checked: LATENCY_REQUIRED present, positive integer batch sizes, contexts and token counts,
    seconds finite and > 0. A file without a `batch` column (written before batch sizes were measured) reads as
    batch 1; one with the spread columns has them on every row, ordered min <= q1 <= median <= q3 <= max."""
    df = read_csv(path, "--latency", LATENCY_REQUIRED, "workbench latency")
    if "batch" not in df.columns:
        df.insert(int(df.columns.get_loc("context")), "batch", 1)
    cols = ["batch", "context", "tokens", "seconds"]
    num = df[cols].apply(pd.to_numeric, errors="coerce")
    ints = num[["batch", "context", "tokens"]]
    if num.isna().any().any() or (ints % 1 != 0).any().any() or (num["context"] > 1 << 24).any() or \
            not num["tokens"].between(1, 1 << 16).all() or (num["context"] < 0).any() or \
            not num["batch"].between(1, 1 << 20).all() or \
            not num["seconds"].between(MIN_SECONDS, MAX_SECONDS).all():
        raise WorkbenchError(f"--latency {path}: batch/context/tokens must be integers (batch >= 1, tokens "
                             f"1..{1 << 16}) and seconds numbers in [{MIN_SECONDS:g}, {MAX_SECONDS:g}] on every row "
                             "(outside: a unit slip, or a ratio that under- or overflows); `workbench latency` "
                             "writes it")
    df[cols] = num
    df[["batch", "context", "tokens"]] = df[["batch", "context", "tokens"]].astype(int)
    present = [c for c in SPREAD_COLUMNS if c in df.columns]
    if present:
        spread = df[present].apply(pd.to_numeric, errors="coerce")
        order = pd.concat([spread[["seconds_min", "seconds_q1"]], num["seconds"],
                           spread[["seconds_q3", "seconds_max"]]], axis=1) if len(present) == 4 else None
        if order is None or spread.isna().any().any() or np.isinf(spread).any().any() or \
                not (spread > 0).all().all() or \
                (order.diff(axis=1).iloc[:, 1:] < -1e-12 * order.iloc[:, 1:]).any().any():
            raise WorkbenchError(f"--latency {path}: the spread columns {', '.join(SPREAD_COLUMNS)} must all be there, "
                                 "finite and > 0 on every row, with min <= q1 <= seconds <= q3 <= max")
        df[SPREAD_COLUMNS] = spread
    return df


def _setup_check(df: pd.DataFrame, what: str) -> None:
    keys = [c for c in ("model", "device", "dtype") if c in df.columns]
    if keys and len(df[keys].drop_duplicates()) > 1:
        groups = "; ".join(" ".join(str(v) for v in r) for r in df[keys].drop_duplicates().itertuples(index=False))
        raise WorkbenchError(f"{what}: rows from several setups ({groups}): keep one model/device/dtype per file")


def _batches(df: pd.DataFrame) -> list[int]:
    return sorted(int(b) for b in df["batch"].unique()) if "batch" in df.columns else [1]


def _join(values) -> str:
    return ", ".join(map(str, values))


def _pick_context(contexts: list[int], context: int | None, target: float | None, what: str) -> int:
    """`context` (already checked to be measured), else the measured one closest to `target`, else the only one."""
    if context is not None:
        return context
    if target is not None:
        return min(contexts, key=lambda c: (abs(c - target), c))
    if len(contexts) == 1:
        return contexts[0]
    raise WorkbenchError(f"{what}: measured at contexts {_join(contexts)}; pick one with --context")


def latency_table(df: pd.DataFrame, context: int | None = None, target: float | None = None,
                  what: str = "latency", batch: int | None = None,
                  column: str = "seconds") -> tuple[dict[int, float], int]:
    """{tokens: seconds} of one batch size at one context: `context` exactly, else the measured one closest to
    `target`, else the only one. `batch` defaults to 1 (the only one a file without a batch column has).
    `column` picks another timing column (seconds_q1, ...). One (model, device, dtype) per file: mixing hardware
    in one table would be meaningless."""
    _setup_check(df, what)
    have = _batches(df)
    b = 1 if batch is None and 1 in have else batch
    if b is None:
        raise WorkbenchError(f"{what}: measured at batch sizes {_join(have)}; pick one")
    if b not in have:
        raise WorkbenchError(f"{what}: no rows for batch size {b} (measured: {_join(have)}): time it with "
                             f"`workbench latency --batch {b}`")
    df = df[df["batch"] == b] if "batch" in df.columns else df
    contexts = sorted(df["context"].unique().tolist())
    if context is not None and context not in contexts:
        raise WorkbenchError(f"{what}: no rows for context {context} (measured: {_join(contexts)})")
    ctx = _pick_context(contexts, context, target, what)
    rows = df[df["context"] == ctx]
    if rows["tokens"].duplicated().any():
        raise WorkbenchError(f"{what}: batch {b} context {ctx} lists a token count twice")
    if column not in rows.columns or rows[column].isna().any():
        raise WorkbenchError(f"{what}: no {column} column (a file written before the spread was kept)")
    table = dict(zip(rows["tokens"].astype(int).tolist(), rows[column].astype(float).tolist()))
    if 1 not in table:
        raise WorkbenchError(f"{what}: batch {b} context {ctx} has no 1-token row (the vanilla step every cost is "
                             "relative to)")
    return table, int(ctx)


def latency_surface(df: pd.DataFrame, batches, context: int | None = None, target: float | None = None,
                    what: str = "latency") -> tuple[dict[int, dict], int]:
    """The surface t(B, n) at one context for every asked batch size: ({B: {"seconds": {tokens: s},
    "spread": {tokens: (q1, q3)} or None}}, context). The context is `context`, else the one measured at every
    asked batch size closest to `target`, else the only one. Batch sizes or a context the file lacks are one
    error naming all of them."""
    _setup_check(df, what)
    batches = sorted({int(b) for b in batches})
    have = _batches(df)
    missing = [b for b in batches if b not in have]
    if missing:
        raise WorkbenchError(f"{what}: no rows for batch size(s) {_join(missing)} (measured: {_join(have)}): time "
                             f"them with `workbench latency --batch {','.join(map(str, batches))}`")
    per = {b: set(df.loc[df["batch"] == b, "context"].astype(int)) if "batch" in df.columns else
           set(df["context"].astype(int)) for b in batches}
    if context is not None:
        lack = [b for b in batches if context not in per[b]]
        if lack:
            measured = sorted(set().union(*per.values()))
            raise WorkbenchError(f"{what}: no rows at context {context} for batch size(s) {_join(lack)} (measured "
                                 f"contexts: {_join(measured)})")
        ctx = context
    else:
        common = sorted(set.intersection(*per.values()))
        if not common:
            raise WorkbenchError(f"{what}: no context is measured at every batch size {_join(batches)}: measure "
                                 "them at one --context")
        ctx = _pick_context(common, None, target, what)
    out = {}
    for b in batches:
        table, _ = latency_table(df, ctx, what=what, batch=b)
        spread = None
        if set(SPREAD_COLUMNS) <= set(df.columns):
            q1, _ = latency_table(df, ctx, what=what, batch=b, column="seconds_q1")
            q3, _ = latency_table(df, ctx, what=what, batch=b, column="seconds_q3")
            spread = {n: (q1[n], q3[n]) for n in table}
        out[b] = dict(seconds=table, spread=spread)
    return out, int(ctx)


# ----------------------------------------------------------------------------------------------- the speedup model

def _points(latency) -> tuple[list[int], list[float]]:
    items = latency.items() if isinstance(latency, Mapping) else latency
    try:
        pts = sorted((int(n), float(t)) for n, t in items)
    except (TypeError, ValueError):
        raise WorkbenchError("latency must map a number of verify tokens to seconds, e.g. {1: 0.021, 64: 0.024}") \
            from None
    if not pts:
        raise WorkbenchError("latency table is empty")
    sizes, secs = [n for n, _ in pts], [t for _, t in pts]
    if len(set(sizes)) != len(sizes):
        raise WorkbenchError("latency table lists a number of verify tokens twice")
    if sizes[0] < 1 or not all(math.isfinite(t) and t > 0 for t in secs):
        raise WorkbenchError("latency table needs token counts >= 1 and positive, finite seconds")
    return sizes, secs


def interpolate_latency(latency, n: int) -> float:
    """Seconds for a forward pass over n verify tokens, linear between measured sizes; no extrapolation."""
    sizes, secs = _points(latency)
    if not sizes[0] <= n <= sizes[-1]:
        raise WorkbenchError(f"no latency for {n} verify tokens: measured range is {sizes[0]}..{sizes[-1]} "
                             "(measure that size too)")
    j = bisect_left(sizes, n)
    if sizes[j] == n:
        return secs[j]
    w = (n - sizes[j - 1]) / (sizes[j] - sizes[j - 1])
    return secs[j - 1] + w * (secs[j] - secs[j - 1])


def max_tokens(latency) -> int:
    """The largest verify token count a latency table covers (a tree of up to that minus one nodes)."""
    return _points(latency)[0][-1]


def speedup(tokens_per_step: float, t_verify: float, t_vanilla: float) -> float:
    """Predicted speedup = goodput B * tokens_per_step / t(B, n) over vanilla's B / t(B, 1), at one batch size B
    (B cancels): the one formula behind every predicted speedup."""
    return (tokens_per_step / t_verify) / (1.0 / t_vanilla)


def speedup_at(latency, tokens_per_step: float, nodes: int) -> float:
    """speedup() of a tree of `nodes` nodes (n = nodes + 1 verify tokens) on a {tokens: seconds} table."""
    return speedup(tokens_per_step, interpolate_latency(latency, nodes + 1), interpolate_latency(latency, 1))


def speedup_range(latency, spread, tokens_per_step: float, nodes: int) -> tuple[float, float] | None:
    """The speedup when t(n) moves over its interquartile range (t(1) at its median: it is every candidate's
    shared denominator): (tokens_per_step * t1 / q3(n), tokens_per_step * t1 / q1(n)). For no speculation
    (nodes = 0) that brackets 1. None without a spread (an older CSV)."""
    if spread is None:
        return None
    q1 = interpolate_latency({n: v[0] for n, v in spread.items()}, nodes + 1)
    q3 = interpolate_latency({n: v[1] for n, v in spread.items()}, nodes + 1)
    t1 = interpolate_latency(latency, 1)
    return speedup(tokens_per_step, q3, t1), speedup(tokens_per_step, q1, t1)


def within_noise(a: tuple[float, float] | None, b: tuple[float, float] | None) -> bool | None:
    """Whether two candidates' speedup ranges overlap: their order rests on a difference inside the latency
    spread. None when either range is unknown."""
    if a is None or b is None:
        return None
    return a[0] <= b[1] and b[0] <= a[1]


def predicted_speedup(curve, latency, budgets=None) -> dict:
    """speedup(n) of the optimal n-node tree for every budget: curve[n] (its expected tokens per step,
    optimize.expected_curve) through `speedup` with t(n + 1) and t(1) of `latency` ({verify tokens: seconds}).
    Budgets default to every n of the curve whose n+1 tokens were measured; an explicitly requested budget
    outside the measured range is an error. Returns {"rows": [...], "best": row}."""
    curve = np.asarray(curve, dtype=np.float64)
    top = max_tokens(latency)
    t1 = interpolate_latency(latency, 1)
    if budgets is None:
        budgets = [n for n in range(len(curve)) if n + 1 <= top]
    rows = []
    for n in budgets:
        if not 0 <= n < len(curve):
            raise WorkbenchError(f"budget {n} is outside the expected-length curve (0..{len(curve) - 1})")
        t = interpolate_latency(latency, n + 1)
        rows.append(dict(budget=int(n), verify_tokens=int(n + 1), expected_length=float(curve[n]),
                         latency_s=t, relative_latency=t / t1, speedup=speedup(float(curve[n]), t, t1)))
    if not rows:
        raise WorkbenchError("no budget to evaluate: the latency table and the curve do not overlap")
    best = max(rows, key=lambda row: (row["speedup"], -row["budget"]))
    return dict(rows=rows, best=best)


# ----------------------------------------------------------------------------------------------- hardware-aware choice

def hardware_aware(value, latency: dict, max_depth: int | None = None, max_rank: int | None = None,
                   max_budget: int | None = None, name: str = "") -> dict:
    """The optimal tree for every budget the latency table covers, its predicted speedup, and the tree with the
    best one. `value` is acc[K, R] or a monotone path-value function (then max_depth and max_rank are
    required). Returns {"rows", "best", "tree"}."""
    fn, max_depth, max_rank = value_and_limits(value, max_depth, max_rank, "hardware_aware")
    top = max_tokens(latency) - 1
    if max_budget is not None:
        top = min(top, max_budget)
    if top < 1:
        raise WorkbenchError("the latency table covers no tree: measure at least 2 tokens (1 node + the root)")
    curve = expected_curve(fn, top, max_depth, max_rank)
    res = predicted_speedup(curve, latency, budgets=range(1, top + 1))
    best = res["best"]
    tree = optimal_tree(fn, best["budget"], max_depth, max_rank, name=name or f"hardware_{best['budget']}")
    return dict(rows=res["rows"], best=best, tree=tree)
