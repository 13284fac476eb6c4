"""Latency: what one decoding step costs on this hardware per token count, and which tree is fastest given it.

A tree with more nodes accepts more tokens per step but each step costs more (Medusa paper Fig. 4, App. G):
  latency    t(n): wall time of one verify forward over n tokens (n - 1 tree nodes + the root) on a cache of
             fixed length, next to the single-token step t(1);
  choice     predicted speedup(tree) = expected tokens per step / (t(nodes + 1) / t(1)), best over all budgets.
This module owns the latency CSV (LATENCY_COLUMNS, written by `workbench latency`); where it lives in a calibration
folder, and the typical context it is read at, are calibration.py's.
"""
from __future__ import annotations

import math
import statistics

import numpy as np
import pandas as pd
import torch

from workbench import WorkbenchError
from workbench.io import read_csv
from workbench.tree import MEDUSA_TOPK, Tree

LATENCY_COLUMNS = ["model", "device", "dtype", "context", "tokens", "seconds"]
LATENCY_REQUIRED = ("context", "tokens", "seconds")  # what every reader needs; the rest name the setup
DEFAULT_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DEFAULT_CONTEXTS = (128, 1024)


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def latency_tree(nodes: int, depth: int = 5, topk: int = MEDUSA_TOPK) -> Tree:
    """An n-node tree shaped like optimal trees (wide near the root, narrowing with depth): node value
    prod_d 0.7 * 0.45^rank, best-first. For dense-mask kernels only the token count matters; the shape makes
    the 4-D mask and position ids the decoder's own, so a kernel that exploits structure is timed as used."""
    from workbench.optimize import optimal_tree_from

    tree = optimal_tree_from(lambda p: math.prod(0.7 * 0.45 ** r for r in p), nodes, depth, topk,
                             name=f"latency_{nodes}")
    if tree.nodes < nodes:
        raise WorkbenchError(f"a tree of depth {depth} with top-{topk} per head has at most {tree.nodes} nodes, "
                             f"not {nodes}: use smaller --sizes (or heads with more heads)")
    return tree


# ----------------------------------------------------------------------------------------------- latency

@torch.inference_mode()
def measure_latency(model, sizes=DEFAULT_SIZES, contexts=DEFAULT_CONTEXTS, repeats: int = 10, warmup: int = 3,
                    heads=None, label: str = "", progress: bool = True, engine=None) -> pd.DataFrame:
    """Median wall time of one decoding step's model work per (context, tokens), on the decoder's own step
    (`engine.time_verify`: static cache, 4-D mask, compiled when the engine is): tokens = 1 is the vanilla step,
    tokens = n > 1 a verify forward of an (n-1)-node tree with its mask and position ids. Both include the
    lm_head over their rows (and, with `heads`, the heads' top-k that a Medusa step needs). The cache is
    prefilled once per context and the pointer put back after every call, so the context stays fixed. Sizes are
    timed round-robin, `repeats` rounds, so that a load change on a shared machine hits every size alike."""
    from tqdm.auto import tqdm

    from workbench.engine import StepEngine, root_setup, time_verify, tree_setup
    from workbench.generation import context_length

    sizes = sorted({1, *(int(s) for s in sizes)})
    contexts = sorted({int(c) for c in contexts})
    if repeats < 1 or warmup < 0:
        raise WorkbenchError(f"--repeats {repeats} / --warmup {warmup}: need repeats >= 1 and warmup >= 0")
    if sizes[0] < 1 or not contexts or contexts[0] < 1:
        raise WorkbenchError("--sizes and --context must be positive integers")
    limit = context_length(model)
    if limit is not None and contexts[-1] + sizes[-1] > limit:
        raise WorkbenchError(f"context {contexts[-1]} + {sizes[-1]} tokens exceeds the model's {limit} positions: "
                             "use smaller --context/--sizes")
    dev = model.device
    vocab = model.get_input_embeddings().weight.shape[0]
    depth = min(5, heads.num_heads) if heads is not None else 5
    bufs = {n: tree_setup(latency_tree(n - 1, depth), model) if n > 1 else root_setup(model) for n in sizes}
    engine = engine or StepEngine(model, compile=False)
    g = torch.Generator().manual_seed(0)
    dev_name, dtype = device_name(dev), str(model.dtype).replace("torch.", "")
    rows = []
    bar = tqdm(total=len(contexts) * (warmup + repeats), desc="latency", unit="round", disable=not progress,
               dynamic_ncols=True)
    for ctx in contexts:
        engine.prefill(torch.randint(vocab, (1, ctx), generator=g).to(dev), sizes[-1])
        times: dict[int, list[float]] = {n: [] for n in sizes}
        for i in range(warmup + repeats):
            for n in sizes:
                t = time_verify(engine, bufs[n], heads, repeats=1, warmup=0, generator=g)
                if i >= warmup:
                    times[n].append(t)
            bar.update(1)
        rows += [dict(model=label, device=dev_name, dtype=dtype, context=ctx, tokens=n,
                      seconds=statistics.median(times[n])) for n in sizes]
    bar.close()
    df = pd.DataFrame(rows, columns=LATENCY_COLUMNS)
    t1 = df[df["tokens"] == 1].set_index("context")["seconds"]
    df["relative"] = df["seconds"] / df["context"].map(t1)
    return df


def read_latency(path) -> pd.DataFrame:
    """A latency CSV, checked: LATENCY_COLUMNS present, positive token counts and seconds."""
    df = read_csv(path, "--latency", LATENCY_REQUIRED, "workbench latency")
    num = df[["context", "tokens", "seconds"]].apply(pd.to_numeric, errors="coerce")
    ints = num[["context", "tokens"]]
    if num.isna().any().any() or (ints % 1 != 0).any().any() or (num["context"] > 1 << 24).any() or \
            not num["tokens"].between(1, 1 << 16).all() or (num["context"] < 0).any() or \
            not (num["seconds"] > 0).all() or np.isinf(num["seconds"]).any():
        raise WorkbenchError(f"--latency {path}: context/tokens must be integers (tokens 1..{1 << 16}) and seconds "
                             "finite numbers > 0 on every row")
    df[["context", "tokens", "seconds"]] = num
    df[["context", "tokens"]] = df[["context", "tokens"]].astype(int)
    return df


def latency_table(df: pd.DataFrame, context: int | None = None, target: float | None = None,
                  what: str = "latency") -> tuple[dict[int, float], int]:
    """{tokens: seconds} at one context: `context` exactly, else the measured one closest to `target`, else the
    only one. One (model, device, dtype) per file: mixing hardware in one table would be meaningless."""
    keys = [c for c in ("model", "device", "dtype") if c in df.columns]
    if keys and len(df[keys].drop_duplicates()) > 1:
        groups = "; ".join(" ".join(str(v) for v in r) for r in df[keys].drop_duplicates().itertuples(index=False))
        raise WorkbenchError(f"{what}: rows from several setups ({groups}): keep one model/device/dtype per file")
    contexts = sorted(df["context"].unique().tolist())
    if context is not None:
        if context not in contexts:
            raise WorkbenchError(f"{what}: no rows for context {context} (measured: {', '.join(map(str, contexts))})")
        ctx = context
    elif target is not None:
        ctx = min(contexts, key=lambda c: (abs(c - target), c))
    elif len(contexts) == 1:
        ctx = contexts[0]
    else:
        raise WorkbenchError(f"{what}: measured at contexts {', '.join(map(str, contexts))}; pick one with --context")
    rows = df[df["context"] == ctx]
    if rows["tokens"].duplicated().any():
        raise WorkbenchError(f"{what}: context {ctx} lists a token count twice")
    table = dict(zip(rows["tokens"].astype(int).tolist(), rows["seconds"].astype(float).tolist()))
    if 1 not in table:
        raise WorkbenchError(f"{what}: context {ctx} has no 1-token row (the vanilla step every cost is relative to)")
    return table, int(ctx)


# ----------------------------------------------------------------------------------------------- hardware-aware choice

def hardware_aware(value, latency: dict, max_depth: int | None = None, max_rank: int | None = None,
                   max_budget: int | None = None, name: str = "") -> dict:
    """The optimal tree for every budget the latency table covers, its predicted speedup (tokens per step over
    relative step cost), and the tree with the best one. `value` is acc[K, R] or a monotone path-value
    function (then max_depth and max_rank are required). Returns {"rows", "best", "tree"}."""
    from workbench.accuracies import check_accuracies
    from workbench.optimize import acc_value_fn, expected_curve, optimal_tree_from, predicted_speedup

    if callable(value):
        if max_depth is None or max_rank is None:
            raise WorkbenchError("hardware_aware with a value function needs max_depth and max_rank")
        fn = value
    else:
        acc = check_accuracies(value)
        fn = acc_value_fn(acc)
        max_depth, max_rank = max_depth or acc.shape[0], max_rank or acc.shape[1]
    top = max(int(n) for n in latency) - 1
    if max_budget is not None:
        top = min(top, max_budget)
    if top < 1:
        raise WorkbenchError("the latency table covers no tree: measure at least 2 tokens (1 node + the root)")
    curve = expected_curve(fn, top, max_depth, max_rank)
    res = predicted_speedup(curve, latency, budgets=range(1, top + 1))
    best = res["best"]
    tree = optimal_tree_from(fn, best["budget"], max_depth, max_rank, name=name or f"hardware_{best['budget']}")
    return dict(rows=res["rows"], best=best, tree=tree)
