"""Speed versus acceptance: what a verify step costs on this hardware, which tree is fastest, and a live sweep.

A tree with more nodes accepts more tokens per step but each step costs more (Medusa paper Fig. 4, App. G):
  latency    t(n): wall time of one verify forward over n tokens (n - 1 tree nodes + the root) on a cache of
             fixed length, next to the single-token step t(1);
  choice     predicted speedup(tree) = expected tokens per step / (t(nodes + 1) / t(1)), best over all budgets;
  sweep      the live decoder for every configuration (tree x temperature x epsilon) and vanilla greedy on the
             same prompts in the same run: measured tokens per step, speedup, and quality proxies;
  summarize  the sweep (+ latency) as markdown tables for docs/tradeoffs.md.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import re
import statistics
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from workbench import WorkbenchError
from workbench.io import atomic_write_text, read_json
from workbench.tree import Tree, load_tree

LATENCY_COLUMNS = ["model", "device", "dtype", "context", "tokens", "seconds"]
DEFAULT_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DEFAULT_CONTEXTS = (128, 1024)
DEFAULT_BUDGETS = (4, 8, 16, 32, 64, 128, 256)
MEDUSA_TOPK = 10  # Medusa's buffers take each head's top-10: trees built here stay within it

# Random-weight models of realistic shape: timing needs the shapes, not the weights (nothing to download).
PRESETS = {
    "llama-1b": dict(hidden=2048, layers=16, heads=32, kv_heads=8, intermediate=8192, vocab=128256),
    "llama-3b": dict(hidden=3072, layers=28, heads=24, kv_heads=8, intermediate=8192, vocab=128256),
    "llama-8b": dict(hidden=4096, layers=32, heads=32, kv_heads=8, intermediate=14336, vocab=128256),
    "vicuna-7b": dict(hidden=4096, layers=32, heads=32, kv_heads=32, intermediate=11008, vocab=32000),
    "smollm2-135m": dict(hidden=576, layers=30, heads=9, kv_heads=3, intermediate=1536, vocab=49152),
    "tiny": dict(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=128),
}
CONFIG_KEYS = {"hidden": "hidden_size", "layers": "num_hidden_layers", "heads": "num_attention_heads",
               "kv_heads": "num_key_value_heads", "intermediate": "intermediate_size", "vocab": "vocab_size",
               "max_positions": "max_position_embeddings"}


# ----------------------------------------------------------------------------------------------- small parsers

def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-") or "model"


def parse_ints(text, what: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4]: positive, sorted, unique."""
    try:
        vals = sorted({int(x) for x in str(text).replace(" ", "").split(",") if x})
    except ValueError:
        raise WorkbenchError(f"{what} {text!r}: give comma-separated positive integers like 4,8,16") from None
    if not vals or vals[0] < 1:
        raise WorkbenchError(f"{what} {text!r}: give comma-separated positive integers like 4,8,16")
    return vals


def parse_floats(text, what: str, low: float = 0.0, high: float = math.inf) -> list[float]:
    """'0,0.7' -> [0.0, 0.7] (each in [low, high]), or a range START:STOP:STEP with STOP included when hit."""
    text = str(text).replace(" ", "")
    try:
        parts = [float(x) for x in text.split(":")] if ":" in text else [float(x) for x in text.split(",") if x]
    except ValueError:
        raise WorkbenchError(f"{what} {text!r}: give numbers like 0.05,0.09 or a range like 0.01:0.25:0.04") from None
    if ":" in text:
        if len(parts) != 3 or not all(map(math.isfinite, parts)) or not (parts[2] > 0 and parts[0] <= parts[1]):
            raise WorkbenchError(f"{what} {text!r}: a range is START:STOP:STEP with START <= STOP and STEP > 0, "
                                 "e.g. 0.01:0.25:0.04")
        start, stop, step = parts
        vals = [round(start + i * step, 10) for i in range(int(math.floor((stop - start) / step + 1e-9)) + 1)]
    else:
        vals = parts
    if not vals:
        raise WorkbenchError(f"{what} is empty: give numbers like 0.05,0.09 or a range like 0.01:0.25:0.04")
    for v in vals:
        if not (low <= v <= high and math.isfinite(v)):
            raise WorkbenchError(f"{what} {text!r}: value {v:g} is outside [{low:g}, {high:g}]")
    return sorted(set(vals))


def parse_delta(text) -> str | float:
    """'sqrt' (delta = sqrt(epsilon), Medusa's posterior_alpha convention) or a fixed number >= 0."""
    if str(text).strip().lower() == "sqrt":
        return "sqrt"
    try:
        d = float(text)
    except (TypeError, ValueError):
        raise WorkbenchError(f"--delta {text!r}: unknown; use 'sqrt' (delta = sqrt(epsilon)) or a number >= 0") \
            from None
    if not (d >= 0 and math.isfinite(d)):
        raise WorkbenchError(f"--delta {text!r}: must be 'sqrt' or a finite number >= 0")
    return d


def delta_for(delta: str | float, epsilon: float) -> float:
    return math.sqrt(epsilon) if delta == "sqrt" else float(delta)


# ----------------------------------------------------------------------------------------------- models for timing

def parse_random_config(spec: str) -> tuple[str, dict]:
    """'llama-1b', 'llama-1b,layers=4' or 'hidden=2048,layers=16,heads=32,kv_heads=8,vocab=128256,intermediate=8192'
    (+ arch=qwen2, or any HF config key) -> (architecture, HF config kwargs)."""
    parts = [p for p in str(spec).replace(" ", "").split(",") if p]
    if not parts:
        raise WorkbenchError("--random-config is empty: give a preset (" + ", ".join(PRESETS) + ") or key=value pairs")
    kw: dict = {}
    arch = "llama"
    for p in parts:
        if "=" not in p:
            if p not in PRESETS:
                raise WorkbenchError(f"--random-config {p!r}: unknown preset (use {', '.join(PRESETS)} or "
                                     "key=value pairs like hidden=2048,layers=16)")
            kw.update({CONFIG_KEYS[k]: v for k, v in PRESETS[p].items()})
            continue
        k, v = p.split("=", 1)
        if k == "arch":
            arch = v
            continue
        try:
            kw[CONFIG_KEYS.get(k, k)] = int(v)
        except ValueError:
            raise WorkbenchError(f"--random-config {k}={v}: expected an integer") from None
    need = ["hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"]
    missing = [k for k, v in CONFIG_KEYS.items() if v in need and v not in kw]
    if missing:
        raise WorkbenchError(f"--random-config {spec!r}: missing {', '.join(missing)} (or start from a preset)")
    kw.setdefault("num_key_value_heads", kw["num_attention_heads"])
    kw.setdefault("intermediate_size", 4 * kw["hidden_size"])
    kw.setdefault("max_position_embeddings", 32768)
    if kw["hidden_size"] % kw["num_attention_heads"] or kw["num_attention_heads"] % kw["num_key_value_heads"]:
        raise WorkbenchError(f"--random-config {spec!r}: hidden must be a multiple of heads, heads of kv_heads")
    return arch, kw


def random_model(spec: str, device: str | None = None, dtype: str | None = None,
                 attn_implementation: str | None = None):
    """A random-weight decoder of a given shape, built directly on the device (no download, no checkpoint)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from workbench.models import pick_device, pick_dtype

    arch, kw = parse_random_config(spec)
    dev = pick_device(device)
    dt = pick_dtype(dtype, dev)
    try:
        cfg = AutoConfig.for_model(arch, **kw)
    except (ValueError, KeyError) as e:
        raise WorkbenchError(f"--random-config arch={arch}: not a transformers architecture ({str(e)[:80]})") from None
    if hasattr(cfg, "sliding_window"):
        cfg.sliding_window = None
    extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
    with torch.random.fork_rng(devices=[]), torch.device(dev):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg, dtype=dt, **extra)
    return model.to(dev).eval().requires_grad_(False)


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
    (`decode.time_verify`: static cache, 4-D mask, compiled when the engine is): tokens = 1 is the vanilla step,
    tokens = n > 1 a verify forward of an (n-1)-node tree with its mask and position ids. Both include the
    lm_head over their rows (and, with `heads`, the heads' top-k that a Medusa step needs). The cache is
    prefilled once per context and the pointer put back after every call, so the context stays fixed. Sizes are
    timed round-robin, `repeats` rounds, so that a load change on a shared machine hits every size alike."""
    from tqdm.auto import tqdm

    from workbench.decode import StepEngine, context_length, root_setup, time_verify, tree_setup

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


def default_latency_path(model_label: str, device: str, calibration_root: str | Path = "calibration") -> Path:
    """calibration/<name>/latency-<device>.csv: the first calibration folder made for this model, else one named
    after the model."""
    root = Path(calibration_root)
    for meta in sorted(root.glob("*/meta.json")):
        try:
            if read_json(meta, str(meta.parent)).get("model") == model_label:
                return meta.parent / f"latency-{_slug(device)}.csv"
        except WorkbenchError:  # not ours to judge here: a damaged folder is skipped
            continue
    return root / _slug(model_label) / f"latency-{_slug(device)}.csv"


def _read_csv(path, what: str, columns: tuple[str, ...], maker: str) -> pd.DataFrame:
    """A results CSV with at least one row and these columns, or one line naming what is wrong and who writes it."""
    if not Path(path).is_file():
        raise WorkbenchError(f"{what} {path}: no such file (make one with `{maker}`)")
    try:
        df = pd.read_csv(path)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError, ValueError, OSError) as e:
        msg = str(e).splitlines()[0][:100] if str(e).strip() else type(e).__name__
        raise WorkbenchError(f"{what} {path}: not a readable CSV ({msg})") from None
    missing = [c for c in columns if c not in df.columns]
    if missing or df.empty:
        raise WorkbenchError(f"{what} {path}: needs rows with columns {','.join(columns)} "
                             f"({'missing column(s) ' + ', '.join(missing) if missing else 'no rows'}; `{maker}` writes it)")
    return df


SWEEP_TEXT = ("run", "config", "tree", "kind", "acceptance", "model", "prompts", "device", "dtype", "calibration")


def read_sweep(path, what: str = "sweep CSV") -> pd.DataFrame:
    """A sweep CSV (`workbench sweep`), checked for the columns every plot needs: numeric columns hold finite
    numbers (or nothing), nodes and acceleration_rate on every row."""
    df = _read_csv(path, what, ("tree", "nodes", "acceleration_rate"), "workbench sweep --out FILE.csv")
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
    return df


def read_latency(path) -> pd.DataFrame:
    """A latency CSV, checked: LATENCY_COLUMNS present, positive token counts and seconds."""
    df = _read_csv(path, "--latency", ("context", "tokens", "seconds"), "workbench latency")
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


def typical_context(calibration) -> float | None:
    """Mean cache length a decoding step sees on the calibration's prompts: prompt + half the answer."""
    f = Path(calibration) / "continuations.parquet"
    if not f.is_file():
        return None
    try:
        info = pd.read_parquet(f, columns=["prompt_tokens", "continuation"])
        if not all(isinstance(c, (list, np.ndarray)) for c in info["continuation"]):
            raise TypeError("continuation cells are not token lists")
        return float((info["prompt_tokens"] + info["continuation"].map(len) / 2).mean()) if len(info) else None
    except Exception as e:  # truncated file, wrong columns or types
        raise WorkbenchError(f"--calibration {calibration}: {f.name} is not a readable continuations file "
                             f"(prompt_tokens, continuation token lists; {type(e).__name__})") from None


# ----------------------------------------------------------------------------------------------- hardware-aware choice

def hardware_aware(value, latency: dict, max_depth: int | None = None, max_rank: int | None = None,
                   max_budget: int | None = None, name: str = "") -> dict:
    """The optimal tree for every budget the latency table covers, its predicted speedup (tokens per step over
    relative step cost), and the tree with the best one. `value` is acc[K, R] or a monotone path-value
    function (then max_depth and max_rank are required). Returns {"rows", "best", "tree"}."""
    from workbench.optimize import (acc_value_fn, check_accuracies, expected_curve, optimal_tree_from,
                                    predicted_speedup)

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


# ----------------------------------------------------------------------------------------------- sweep: trees

def dense_near(budget: int, max_depth: int, max_rank: int = MEDUSA_TOPK, slack: float = 1.5) -> list[Tree]:
    """Cartesian trees [s], [s, s], [s, s, s], ... (paper §2.1.2) whose node count is the one closest to
    `budget` for that depth, kept when within a factor `slack` of it."""
    from workbench.optimize import dense_nodes, dense_tree

    out = []
    for d in range(1, max_depth + 1):
        s = min(range(1, max_rank + 1), key=lambda s: (abs(dense_nodes(s, d) - budget), s))
        if budget / slack <= dense_nodes(s, d) <= budget * slack:
            out.append(dense_tree([s] * d))
    return out


def sweep_trees(budgets=None, trees=None, dense: bool = False, calibration=None, joint: bool = False,
                num_heads: int | None = None, max_rank: int = MEDUSA_TOPK,
                replay: int | None = None) -> list[tuple[Tree, str]]:
    """[(tree, kind)] with kind optimal | dense | given, deduplicated by shape. Budgets build optimal trees from
    the calibration's fit prompts (independent heads, or empirical joint paths; with `replay` = N tokens, a dense
    tree within the budget replaces the optimum when a greedy decoder replayed over the first N tokens of the fit
    answers accepts more with it); --dense adds Cartesian trees near every budget (or the given trees' sizes)."""
    from workbench.optimize import best_by, empirical_value_fn, optimal_tree, optimal_tree_from

    out: list[tuple[Tree, str]] = []
    for i, spec in enumerate(trees or []):
        t = load_tree(spec, num_heads=num_heads)
        out.append((Tree(t.paths, t.name or f"tree{i + 1}"), "given"))
    if budgets:
        if calibration is None:
            raise WorkbenchError("--budgets needs a calibration folder (--calibration DIR) to build optimal trees")
        from workbench.calibrate import decoder_walk, load_calibration, path_probabilities

        acc, fit = load_calibration(calibration, "fit")
        depth = min(acc.shape[0], num_heads or acc.shape[0])
        rank = min(acc.shape[1], max_rank)
        fn = empirical_value_fn(path_probabilities(fit)) if joint else None
        answers = fit[fit["position"] < replay] if replay else None
        for b in budgets:
            name = f"opt-{'joint' if joint else 'indep'}-{b}"
            t = optimal_tree_from(fn, b, depth, rank, name=name) if joint else optimal_tree(acc, b, depth, rank, name)
            if replay:  # what a live decoder measures decides between near-equal candidates
                t = best_by(lambda c: decoder_walk(c, answers), t, b, depth, rank)
            out.append((t, "optimal"))
    if dense:
        sizes = list(budgets or []) or [t.nodes for t, _ in out]
        for b in sizes:
            out += [(t, "dense") for t in dense_near(b, num_heads or 5, max_rank)]
    seen, unique = set(), []
    for t, kind in out:
        key = tuple(t.sorted_paths)
        if key not in seen:
            seen.add(key)
            unique.append((t, kind))
    if not unique:
        raise WorkbenchError("no trees to sweep: give --budgets or --trees")
    return unique


def default_calibration(root: str | Path = "calibration") -> Path:
    """The first finished calibration folder under calibration/ (sorted by name)."""
    found = sorted(Path(root).glob("*/meta.json"))
    if not found:
        raise WorkbenchError(f"no calibration folder under {root}/: run `workbench calibrate`, or pass "
                             "--calibration DIR, or give --trees instead of --budgets")
    return found[0].parent


def holdout_records(calibration, limit: int | None = None) -> list[tuple[str, str]]:
    """The calibration's held-out prompts (never used to fit its trees): the honest test set for predictions."""
    from workbench.data import load_prompt_records

    from workbench.calibrate import read_meta

    meta = read_meta(calibration)
    held = set(meta.get("holdout_ids", []))
    limit_ = meta.get("limit")
    if not isinstance(meta.get("prompts"), str) or not (limit_ is None or isinstance(limit_, int)):
        raise WorkbenchError(f"--calibration {calibration}: meta.json does not say which prompts it used "
                             "(prompts, limit)")
    records = [r for r in load_prompt_records(meta["prompts"], limit_) if r[0] in held]
    if not records:
        raise WorkbenchError(f"--prompts holdout: calibration {calibration} has no held-out prompts "
                             "(calibrate with --holdout 0.2, or name a prompt set)")
    if limit is not None and limit <= 0:
        raise WorkbenchError(f"--limit {limit}: must be a positive number of prompts")
    return records[:limit] if limit else records


def tree_key(tree: Tree) -> str:
    return f"{tree.name}:{hashlib.sha1(json.dumps(tree.sorted_paths).encode()).hexdigest()[:10]}"


def sweep_configs(trees: list[tuple[Tree, str]], temperatures=(0.0,), epsilons=(0.09,), delta="sqrt") -> list[dict]:
    """One config per tree at temperature 0 (greedy: epsilon/delta play no part), and per (tree, temperature,
    epsilon) for every temperature > 0 (typical acceptance)."""
    out = []
    for tree, kind in trees:
        for temp in temperatures:
            if temp == 0:
                out.append(dict(tree=tree, kind=kind, acceptance="greedy", temperature=0.0, epsilon=None, delta=None))
                continue
            for eps in epsilons:
                out.append(dict(tree=tree, kind=kind, acceptance="typical", temperature=float(temp),
                                epsilon=float(eps), delta=delta_for(delta, eps)))
    for c in out:
        c["config"] = (f"{tree_key(c['tree'])}|{c['acceptance']}|T={c['temperature']:g}" +
                       (f"|eps={c['epsilon']:g}|delta={c['delta']:g}" if c["epsilon"] is not None else ""))
    return out


# ----------------------------------------------------------------------------------------------- sweep: quality

@torch.inference_mode()
def mean_logprob(model, prompts: list[list[int]], outputs: list[list[int]]) -> float:
    """Mean log-probability of the generated tokens under the base model at temperature 1 (one teacher-forced
    forward per prompt; logits only at the generated positions)."""
    from workbench.decode import logits_of

    total, count = 0.0, 0
    for p, o in zip(prompts, outputs):
        if not o:
            continue
        ids = torch.tensor([p + o], device=model.device)
        hidden = model.get_decoder()(input_ids=ids).last_hidden_state[0, len(p) - 1:-1]  # [G, H]
        logp = torch.log_softmax(logits_of(model, hidden), dim=-1)                      # [G, V]
        total += float(logp.gather(1, torch.tensor(o, device=model.device)[:, None]).sum())
        count += len(o)
    return total / count if count else float("nan")


def distinct_2(outputs: list[list[int]]) -> float:
    """Distinct bigrams over all bigrams, pooled over the generations (lower = more repetitive)."""
    grams = [tuple(o[i:i + 2]) for o in outputs for i in range(len(o) - 1)]
    return len(set(grams)) / len(grams) if grams else float("nan")


# ----------------------------------------------------------------------------------------------- sweep: run

SWEEP_COLUMNS = ["run", "config", "tree", "kind", "nodes", "depth", "acceptance", "temperature", "epsilon", "delta",
                 "acceleration_rate", "overhead", "speedup", "tokens_per_s", "vanilla_tokens_per_s", "mean_step_s",
                 "step_ms", "forward_ms", "decoder_overhead",
                 "predicted_tokens_per_step", "predicted_joint", "predicted_walk", "calibration_holdout", "replay",
                 "exact_match", "near_tie_divergences", "mismatches",
                 "mean_logprob", "distinct_2", "num_prompts", "mean_prompt_tokens", "new_tokens", "steps",
                 "model", "prompts", "max_new_tokens", "device", "dtype", "calibration"]


def _fmt(v) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float):
        return repr(v)
    return str(v)


def read_sweep_rows(path) -> list[dict]:
    """The rows of a sweep CSV as strings (kept verbatim on rewrite), or [] when it does not exist yet."""
    f = Path(path)
    if not f.is_file() or f.stat().st_size == 0:
        return []
    try:
        with f.open(newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            same = reader.fieldnames == SWEEP_COLUMNS
            rows = list(reader) if same else []
    except (UnicodeDecodeError, csv.Error) as e:
        raise WorkbenchError(f"--out {path}: exists but is not a readable CSV ({str(e)[:100]}); use another --out") from None
    if not same:
        raise WorkbenchError(f"--out {path}: exists but is not a sweep CSV of this version (columns differ); "
                             "use another --out")
    if rows:
        read_sweep(path, "--out")  # every row well-formed, or one line before hours of decoding
    return rows


def _write_rows(path, rows: list[dict]) -> None:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=SWEEP_COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    atomic_write_text(path, buf.getvalue())


def calibration_predictions(calibration, max_new_tokens: int | None = None, prompt_ids=None):
    """tree -> calibration predictions for a sweep row. From the fit prompts: predicted_tokens_per_step (independent
    heads) and predicted_joint (empirical paths), both the paper's mean over every position, and predicted_walk,
    a greedy decoder replayed over the fit answers (it visits only the positions a step starts at, which are harder
    than average: the all-position mean runs 6-12% high on the demo). calibration_holdout: the decoder replayed over
    every held-out answer (a larger sample than a live sweep can afford). replay: the same over the calibration's
    own answers to *these* prompts, which a lossless greedy decoder must match exactly. Answers are cut to
    max_new_tokens, as the sweep cuts them."""
    from workbench.calibrate import decoder_walk, load_calibration, path_probabilities
    from workbench.optimize import empirical_value_fn, expected_length

    acc, fit = load_calibration(calibration, "fit")
    _, every = load_calibration(calibration, "all")
    held = every[~every["prompt_id"].isin(set(fit["prompt_id"]))]
    joint = empirical_value_fn(path_probabilities(fit))
    cut = (lambda r: r[r["position"] < max_new_tokens]) if max_new_tokens else (lambda r: r)
    fit_cut, held_cut = cut(fit), cut(held)
    ours = cut(every[every["prompt_id"].isin([str(i) for i in prompt_ids])]) if prompt_ids is not None else None

    def predict(tree: Tree) -> dict:
        if tree.depth > acc.shape[0] or tree.max_rank >= acc.shape[1]:
            return {}
        out = dict(predicted_tokens_per_step=expected_length(tree, acc), predicted_joint=expected_length(tree, joint),
                   predicted_walk=decoder_walk(tree, fit_cut))
        if len(held):
            out["calibration_holdout"] = decoder_walk(tree, held_cut)
        if ours is not None and ours["prompt_id"].nunique() == len(set(map(str, prompt_ids))):
            out["replay"] = decoder_walk(tree, ours)
        return out
    return predict


def _aggregate(results) -> dict:
    tokens = sum(len(r.token_ids) for r in results)
    steps = sum(len(r.steps) for r in results)
    total_s = sum(r.total_s for r in results)
    decode_s = sum(r.decode_s for r in results)
    return dict(tokens=tokens, steps=steps, acceleration_rate=tokens / max(steps, 1),
                tokens_per_s=tokens / total_s if total_s > 0 else float("nan"),
                mean_step_s=decode_s / max(steps, 1),
                step_ms=1e3 * statistics.median(s.time_s for r in results for s in r.steps))


@torch.inference_mode()
def run_sweep(model, heads, tokenizer, prompts: list[list[int]], configs: list[dict], out,
              max_new_tokens: int = 128, run_info: dict | None = None, predict=None, progress: bool = True,
              on_row=None, engine=None) -> pd.DataFrame:
    """Run every configuration not yet in `out` on all prompts, and vanilla greedy on the same prompts first.

    One CSV row per configuration (plus a `vanilla` row), the whole file rewritten atomically after each, so a
    killed run loses at most the configuration in flight; a rerun skips rows whose (run, config) exist. `run`
    hashes run_info (model, prompts, max_new_tokens, device, ...): other settings never count as done.
    `predict(tree) -> dict` adds calibration predictions; `on_row(row)` is called after each row is on disk.
    Timing: each configuration's speedup and overhead are against vanilla run right before it on every prompt;
    step_ms is the median step, forward_ms the median bare verify work of that tree timed right after every step at
    its context (`decode.forward_probe`), decoder_overhead = step_ms / forward_ms. `engine`: a StepEngine to run on (e.g.
    compiled); default a fresh one (compiled on CUDA).
    """
    from tqdm.auto import tqdm

    from workbench.decode import (Acceptance, StepEngine, divergence_counts, divergences, forward_probe,
                                  medusa_generate, root_setup, tree_setup, vanilla_generate)

    if not prompts:
        raise WorkbenchError("the prompt set is empty: give prompts to sweep on")
    if max_new_tokens < 1:
        raise WorkbenchError(f"--max-new-tokens {max_new_tokens}: must be >= 1")
    info = dict(run_info or {}, max_new_tokens=max_new_tokens, num_prompts=len(prompts),
                prompts_sha=hashlib.sha1(json.dumps(prompts).encode()).hexdigest()[:10])
    run = hashlib.sha1(json.dumps(info, sort_keys=True, default=str).encode()).hexdigest()[:10]
    rows = read_sweep_rows(out)
    done = {(r["run"], r["config"]) for r in rows}
    todo = [c for c in configs if (run, c["config"]) not in done]
    if not todo and (run, "vanilla") in done:
        return pd.read_csv(out)
    common = dict(run=run, model=info.get("model", ""), prompts=info.get("prompts", ""),
                  max_new_tokens=max_new_tokens, device=str(model.device.type),
                  dtype=str(model.dtype).replace("torch.", ""), calibration=info.get("calibration", ""),
                  num_prompts=len(prompts), mean_prompt_tokens=sum(map(len, prompts)) / len(prompts))

    # one engine (static cache, compiled step when asked) and one set of tree buffers for the whole sweep
    engine = engine or StepEngine(model)
    bufs = {tree_key(c["tree"]): tree_setup(c["tree"], model, heads.num_heads) for c in todo}
    root = root_setup(model)
    engine.reserve(max(map(len, prompts)) + max_new_tokens + max([b.size for b in bufs.values()], default=1))

    bar = tqdm(total=(2 * len(todo) + 1) * len(prompts), desc="sweep", unit="gen", disable=not progress,
               dynamic_ncols=True)
    # warm-up (and compilation): every step shape is run before anything is timed
    vanilla_generate(model, tokenizer, prompts[0], 2, engine=engine)
    for buf in bufs.values():
        medusa_generate(model, heads, tokenizer, prompts[0], buf, 2, engine=engine)
    vanilla, (probe, van_forward) = [], forward_probe(engine, root)
    for p in prompts:
        vanilla.append(vanilla_generate(model, tokenizer, p, max_new_tokens, engine=engine, on_step=probe))
        bar.update(1)
    van = _aggregate(vanilla)
    van_outputs = [r.token_ids for r in vanilla]

    def emit(row: dict) -> None:
        row = {**common, **row}
        rows.append({k: _fmt(row.get(k)) for k in SWEEP_COLUMNS})
        _write_rows(out, rows)
        if on_row is not None:
            on_row(row)

    if (run, "vanilla") not in done:
        fwd = 1e3 * statistics.median(van_forward)
        emit(dict(config="vanilla", tree="vanilla", kind="vanilla", nodes=0, depth=0, acceptance="greedy",
                  temperature=0.0, acceleration_rate=1.0, overhead=1.0, speedup=1.0,
                  tokens_per_s=van["tokens_per_s"], vanilla_tokens_per_s=van["tokens_per_s"],
                  mean_step_s=van["mean_step_s"], step_ms=van["step_ms"], forward_ms=fwd,
                  decoder_overhead=van["step_ms"] / fwd, exact_match=1.0, near_tie_divergences=0, mismatches=0,
                  mean_logprob=mean_logprob(model, prompts, van_outputs), distinct_2=distinct_2(van_outputs),
                  new_tokens=van["tokens"], steps=van["steps"]))
    for c in todo:
        tree, buf = c["tree"], bufs[tree_key(c["tree"])]
        acc = Acceptance(c["acceptance"], c["temperature"]) if c["epsilon"] is None else \
            Acceptance(c["acceptance"], c["temperature"], c["epsilon"], c["delta"])
        bar.set_postfix_str(c["config"].split("|", 1)[1])
        results, baseline, (probe, forwards) = [], [], forward_probe(engine, buf, heads)
        for p in prompts:  # vanilla right before Medusa on every prompt: a load change hits both alike
            baseline.append(vanilla_generate(model, tokenizer, p, max_new_tokens, engine=engine))
            bar.update(1)
            results.append(medusa_generate(model, heads, tokenizer, p, buf, max_new_tokens, acc, engine=engine,
                                           on_step=probe))
            bar.update(1)
        agg, base = _aggregate(results), _aggregate(baseline)
        outputs = [r.token_ids for r in results]
        # greedy output must be vanilla's: each prompt's first divergence is a near-tie (rounding) or a bug
        found = None if acc.temperature else \
            [d for r, v in zip(results, baseline) for d in divergences(r, v, model.dtype)]
        fwd = 1e3 * statistics.median(forwards)
        row = dict(config=c["config"], tree=tree.name, kind=c["kind"], nodes=tree.nodes, depth=tree.depth,
                   acceptance=c["acceptance"], temperature=c["temperature"], epsilon=c["epsilon"], delta=c["delta"],
                   acceleration_rate=agg["acceleration_rate"], tokens_per_s=agg["tokens_per_s"],
                   overhead=agg["step_ms"] / base["step_ms"],
                   speedup=agg["tokens_per_s"] / base["tokens_per_s"], vanilla_tokens_per_s=base["tokens_per_s"],
                   mean_step_s=agg["mean_step_s"], step_ms=agg["step_ms"], forward_ms=fwd,
                   decoder_overhead=agg["step_ms"] / fwd,
                   exact_match=sum(o == v for o, v in zip(outputs, van_outputs)) / len(prompts),
                   **(divergence_counts(found) if found is not None else {}),
                   mean_logprob=mean_logprob(model, prompts, outputs), distinct_2=distinct_2(outputs),
                   new_tokens=agg["tokens"], steps=agg["steps"], **(predict(tree) if predict else {}))
        emit(row)
    bar.close()
    return pd.read_csv(out)


# ----------------------------------------------------------------------------------------------- summary

def markdown_table(df: pd.DataFrame, digits: int = 3) -> str:
    """A pipe table (no tabulate dependency); floats to `digits` places, NaN as an empty cell."""
    def cell(v):
        if isinstance(v, (float, np.floating)):
            return "" if math.isnan(v) else f"{v:.{digits}f}"
        return str(v)
    head = "| " + " | ".join(map(str, df.columns)) + " |"
    sep = "|" + "|".join("---:" if pd.api.types.is_numeric_dtype(df[c]) else "---" for c in df.columns) + "|"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, sep, *body])


def _relative_cost(latency: dict, nodes: int) -> float:
    from workbench.optimize import interpolate_latency

    try:
        return interpolate_latency(latency, nodes + 1) / interpolate_latency(latency, 1)
    except WorkbenchError:
        return float("nan")


def summarize(sweep_csv, latency_csv=None, context: int | None = None) -> str:
    """Markdown tables for docs/tradeoffs.md from a sweep CSV (and a latency CSV): predicted vs measured tokens
    per step, optimized vs dense (Fig. 4a/4b), the hardware-aware choice vs the best measured speedup, and
    typical acceptance vs epsilon and temperature (Fig. 5)."""
    f = Path(sweep_csv)
    df = read_sweep(f)
    if list(df.columns) != SWEEP_COLUMNS or df.empty:
        raise WorkbenchError(f"sweep CSV {sweep_csv}: not a sweep CSV with rows (columns differ or it is empty)")
    def values(col):
        return ", ".join(map(str, df[col].dropna().unique()))
    parts = [f"Sweep `{f.name}`: model {values('model')}, {values('num_prompts')} prompts ({values('prompts')}), "
             f"max {values('max_new_tokens')} new tokens, device {values('device')} {values('dtype')}."]
    greedy = df[(df["acceptance"] == "greedy") & (df["kind"] != "vanilla")].sort_values(["nodes", "kind"])

    pred = greedy.dropna(subset=["predicted_tokens_per_step"])
    if len(pred):
        t = pred[["tree", "kind", "nodes", "predicted_tokens_per_step", "predicted_joint", "predicted_walk",
                  "replay", "calibration_holdout", "acceleration_rate"]].copy()
        for col, name in (("predicted_tokens_per_step", "indep"), ("predicted_joint", "joint"),
                          ("predicted_walk", "walk"), ("replay", "replay")):
            t[f"{name}_err_%"] = 100 * (t[col] / t["acceleration_rate"] - 1)
        t = t.rename(columns={"predicted_tokens_per_step": "predicted (indep)", "predicted_joint": "predicted (joint)",
                              "predicted_walk": "predicted (walk)", "calibration_holdout": "replay (all held out)",
                              "acceleration_rate": "measured"})
        t = t.dropna(axis=1, how="all")
        parts.append("## Predicted vs measured tokens per step (greedy)\n\n"
                     "indep / joint: the paper's mean over every calibration position (independent heads / empirical "
                     "paths); walk: a greedy decoder replayed over the calibration's fit answers; replay: the same "
                     "over the calibration's answers to these very prompts (a lossless decoder matches it exactly); "
                     "replay (all held out): the same over every held-out answer, a larger sample than this sweep."
                     "\n\n" + markdown_table(t))

    if len(greedy):
        t = greedy[["tree", "kind", "nodes", "depth", "acceleration_rate", "overhead", "speedup", "tokens_per_s",
                    "exact_match", "near_tie_divergences", "mismatches"]]
        parts.append("## Optimized vs dense trees: tokens per step and speed vs node count (Fig. 4a/4b)\n\n" +
                     markdown_table(t))
        bug = greedy[greedy["mismatches"] > 0]
        if len(bug):
            parts.append(f"**Bug**: greedy output differs from vanilla greedy beyond rounding (mismatch) for "
                         f"{', '.join(bug['tree'])}.")
        elif (greedy["exact_match"] < 1).any():
            ties = greedy[greedy["exact_match"] < 1]["tree"].tolist()
            parts.append(f"Greedy output differs from vanilla greedy for {', '.join(ties)} at near-ties only "
                         f"(top-2 logits within the dtype's rounding).")

    if latency_csv is not None and len(greedy):
        lat = read_latency(latency_csv)
        van_ctx = float((df["mean_prompt_tokens"] + df["new_tokens"] / df["num_prompts"] / 2).mean())
        table, ctx = latency_table(lat, context, None if context is not None else van_ctx, f"--latency {latency_csv}")
        t = greedy[["tree", "kind", "nodes", "predicted_tokens_per_step", "acceleration_rate", "speedup"]].copy()
        t["relative_cost"] = [_relative_cost(table, n) for n in t["nodes"]]
        t["predicted_speedup"] = t["predicted_tokens_per_step"] / t["relative_cost"]
        t["latency_model_speedup"] = t["acceleration_rate"] / t["relative_cost"]
        parts.append(f"## Hardware-aware choice (latency `{Path(latency_csv).name}`, context {ctx})\n\n"
                     "predicted_speedup = predicted tokens/step / (t(nodes+1)/t(1)); latency_model_speedup uses the "
                     "measured tokens/step instead (its gap to the measured speedup is the decoder's own overhead)."
                     "\n\n" + markdown_table(t))
        best = t.loc[t["speedup"].idxmax()]
        line = f"Best measured speedup: **{best['tree']}** ({int(best['nodes'])} nodes) at {best['speedup']:.3f}x."
        cand = t.dropna(subset=["predicted_speedup"])
        if len(cand):
            pick = cand.loc[cand["predicted_speedup"].idxmax()]
            line = (f"Hardware-aware pick: **{pick['tree']}** ({int(pick['nodes'])} nodes), predicted "
                    f"{pick['predicted_speedup']:.3f}x, measured {pick['speedup']:.3f}x = "
                    f"{100 * pick['speedup'] / best['speedup']:.1f}% of the best measured. " + line)
        parts.append(line)

    typical = df[df["acceptance"] == "typical"]
    if len(typical):
        t = typical[["tree", "nodes", "temperature", "epsilon", "delta", "acceleration_rate", "speedup",
                     "mean_logprob", "distinct_2", "exact_match"]]
        t = t.sort_values(["nodes", "tree", "temperature", "epsilon"])
        parts.append("## Typical acceptance vs epsilon and temperature (Fig. 5)\n\n"
                     "exact_match = share of prompts whose output equals vanilla greedy; mean_logprob = mean "
                     "log-probability of the generated tokens under the base model (temperature 1).\n\n" +
                     markdown_table(t))
        base = df[df["kind"] == "vanilla"]
        if len(base):
            parts.append(f"Vanilla greedy reference: mean_logprob {base['mean_logprob'].iloc[-1]:.3f}, "
                         f"distinct_2 {base['distinct_2'].iloc[-1]:.3f}.")
    return "\n\n".join(parts) + "\n"
