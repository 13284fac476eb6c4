"""One answer with its evidence: decode with which tree, chain or nothing, how fast it should be, how sure we are.

`recommend` ranks the candidates a deployment can choose from at one batch size and context by predicted speedup:
  tree     the optimal tree at every budget the latency table measured, the hardware-aware optimum (which may sit
           between measured sizes), and any named tree the caller passes (e.g. the trees a sweep measured);
  chain K  the top-1 chain of K heads ([0], [0, 0], ...): what a chain drafter (vLLM's Medusa) runs;
  none     plain decoding, 1 token per step at speedup 1.
Predicted tokens per step are `Calibration.predict`'s (the replay over held-out answers when the calibration holds
prompts out: what a live greedy decoder measures), the speedup is the one formula of `latency.speedup` (through `latency.predicted_speedup`),
and its range comes from the latency spread columns (quartiles, else min/max) when the table has them. Evidence:
every greedy sweep row that measured the same tree shape, with the sweep's name, decoder version and prompt count;
a sweep written without a `decoder_version` column was made by the decoder before the static-cache step and is
marked old (never weighed against the prediction). A later planner (per batch size) can replace `candidates`
without changing what the app shows.
"""
from __future__ import annotations

import math
import statistics

import numpy as np
import pandas as pd

from workbench.calibration import Calibration, tree_table
from workbench.latency import hardware_aware, latency_table
from workbench.speed import speedup_curve
from workbench.optimize import acc_value_fn, best_first
from workbench.plan import chain_tree
from workbench.sweep import tree_key
from workbench.tree import Tree, make_tree

OLD_DECODER = "before the static-cache step"  # what made a sweep CSV that has no decoder_version column
SPREADS = (("seconds_q1", "seconds_q3", "latency quartiles"), ("seconds_min", "seconds_max", "latency min-max"))


# ----------------------------------------------------------------------------------------------- latency

def latency_tables(df: pd.DataFrame, context: int | None = None, batch: int = 1, target: float | None = None,
                   what: str = "latency") -> dict:
    """The latency table at one batch size and context: {"seconds": {tokens: s}, "low"/"high": the same from the
    spread columns (None without), "spread": their name, "context", "batch"}. A CSV without a `batch` column is
    batch 1 only."""
    seconds, ctx = latency_table(df, context, target, what, batch=batch)  # (one error for a batch it lacks)
    out = dict(seconds=seconds, low=None, high=None, spread=None, context=ctx, batch=batch)
    for lo, hi, name in SPREADS:
        if lo in df.columns and hi in df.columns:
            out |= dict(low=latency_table(df, ctx, what=what, batch=batch, column=lo)[0],
                        high=latency_table(df, ctx, what=what, batch=batch, column=hi)[0], spread=name)
            break
    return out


def speedup(tokens_per_step: float, nodes: int, seconds: dict) -> dict:
    """latency.predicted_speedup for one tree of `nodes` nodes whose predicted tokens per step are given (the
    curve it takes is tokens per step by node count); its row: relative_latency, speedup, latency_s."""
    curve = np.full(nodes + 1, float(tokens_per_step))
    return speedup_curve(curve, seconds, budgets=[nodes])["best"]


def speedup_range(tokens_per_step: float, nodes: int, tables: dict) -> tuple[float, float] | None:
    """(lowest, highest) speedup the latency spread allows: the tree step at its slow end over the plain step at its
    fast end, and the other way round. None when the table has no spread columns."""
    if tables["low"] is None or nodes == 0:
        return None
    lo, hi = tables["low"], tables["high"]
    slow = {n: (lo[n] if n == 1 else hi[n]) for n in hi}
    fast = {n: (hi[n] if n == 1 else lo[n]) for n in lo}
    return speedup(tokens_per_step, nodes, slow)["speedup"], speedup(tokens_per_step, nodes, fast)["speedup"]


def tree_speedup(tokens_per_step: float, tree: Tree | None, tables: dict) -> dict:
    """A tree's (None: no speculation) predicted speedup on a latency table (latency_tables): {nodes,
    tokens_per_step, speedup, relative_latency, range}; every speedup the app shows comes from here."""
    nodes = 0 if tree is None else tree.nodes
    fast = speedup(tokens_per_step, nodes, tables["seconds"]) if nodes else dict(speedup=1.0, relative_latency=1.0)
    return dict(nodes=nodes, tokens_per_step=float(tokens_per_step), speedup=fast["speedup"],
                relative_latency=fast["relative_latency"], range=speedup_range(tokens_per_step, nodes, tables))


def prediction_name(calibration) -> str:
    """Which predicted tokens/step the answer uses: the replay over held-out answers (what a live greedy decoder
    measures) when the calibration holds prompts out, else the joint paths; independence for an accuracy table."""
    if not isinstance(calibration, Calibration):
        return "predicted_independent"
    return "predicted_replay" if len(calibration.ranks("holdout")) else "predicted_joint"


# ----------------------------------------------------------------------------------------------- candidates

def candidates(value, seconds: dict, max_depth: int, max_rank: int, max_budget: int | None = None,
               trees: list[Tree] | None = None) -> list[tuple[str, Tree | None]]:
    """[(kind, tree)]: none, the chains 1..max_depth, the optimal tree (under `value`, a path-value function) at
    every measured size, the hardware-aware optimum (latency.hardware_aware: best predicted speedup over every
    budget, measured or interpolated), and `trees`; deduplicated by shape (first kept). Only trees the latency
    table covers (nodes + 1 <= its largest token count) with at most `max_budget` nodes."""
    top = max(seconds) - 1
    if max_budget is not None:
        top = min(top, max_budget)
    out: list[tuple[str, Tree | None]] = [("none", None)]
    if top >= 1:
        out += [("chain", chain_tree(k)) for k in range(1, min(max_depth, top) + 1)]
        best = hardware_aware(value, seconds, max_depth, max_rank, max_budget=top)["tree"]
        out.append(("tree", Tree(best.paths, f"hardware_{best.nodes}")))  # named by what it is: its node count
        order = [p for p, _ in best_first(value, top, max_depth, max_rank)]  # prefix n = the optimal n-node tree
        out += [("tree", make_tree(order[:n - 1], name=f"optimal_{n - 1}")) for n in sorted(seconds)
                if 1 <= n - 1 <= len(order)]
    out += [("tree", t) for t in trees or [] if t.nodes <= top]
    seen, unique = set(), []
    for kind, t in out:
        key = None if t is None else tuple(t.sorted_paths)
        if key not in seen:
            seen.add(key)
            unique.append((kind, t))
    return unique


# ----------------------------------------------------------------------------------------------- sweep evidence

def shape(tree: Tree) -> str:
    """A tree's shape hash, as the sweep CSV's config column carries it (sweep.tree_key)."""
    return tree_key(tree).rsplit(":", 1)[1]


def decoder_version(sweep: pd.DataFrame) -> pd.Series:
    """The decoder version of every row of a sweep: its decoder_version cell, else OLD_DECODER."""
    if "decoder_version" not in sweep.columns:
        return pd.Series(OLD_DECODER, index=sweep.index)
    return sweep["decoder_version"].where(sweep["decoder_version"].notna() & (sweep["decoder_version"].astype(str)
                                                                             .str.strip() != ""), OLD_DECODER)


def timing_noise(sweep: pd.DataFrame, run) -> float | None:
    """Relative run-to-run noise of one speedup measured in `run`: the spread (coefficient of variation) of the
    vanilla baseline, which the sweep re-measures before every configuration, times sqrt(2) (a speedup is a ratio
    of two such measurements). None with fewer than two baselines."""
    if "vanilla_tokens_per_s" not in sweep.columns:
        return None
    base = sweep.loc[(sweep["run"] == run) if "run" in sweep.columns else sweep.index, "vanilla_tokens_per_s"]
    base = base.dropna()
    if len(base) < 2 or base.mean() <= 0:
        return None
    return math.sqrt(2) * statistics.stdev(base) / base.mean()


def measurements(sweeps: dict[str, pd.DataFrame], batch: int = 1, decoder: str | None = None) -> dict[str, list]:
    """{tree shape hash (as in the sweep's config): [measurement, ...]} over the greedy rows of every sweep at this
    batch size (a sweep without batch_size is batch 1). A measurement: sweep, tree, nodes, speedup, noise (absolute,
    None if unknown), tokens_per_step, num_prompts, decoder_version, old (an older decoder measured it: OLD_DECODER,
    or another version than `decoder` when given)."""
    out: dict[str, list] = {}
    for name, df in (sweeps or {}).items():
        if "config" not in df.columns or "speedup" not in df.columns:
            continue
        versions = decoder_version(df)
        greedy = df["acceptance"].eq("greedy") if "acceptance" in df.columns else pd.Series(True, index=df.index)
        at = df["batch_size"].fillna(1).eq(batch) if "batch_size" in df.columns else \
            pd.Series(batch == 1, index=df.index)
        rows = df[greedy & at & (df["nodes"] > 0) & df["speedup"].notna()]
        for i, r in rows.iterrows():
            head = str(r["config"]).split("|", 1)[0]
            if ":" not in head:
                continue
            noise = timing_noise(df, r["run"]) if "run" in df.columns else None
            version = str(versions[i])
            prompts = r["num_prompts"] if "num_prompts" in df.columns else None
            out.setdefault(head.rsplit(":", 1)[1], []).append(dict(
                sweep=name, tree=str(r["tree"]), nodes=int(r["nodes"]), speedup=float(r["speedup"]),
                noise=None if noise is None else noise * float(r["speedup"]),
                tokens_per_step=float(r["acceleration_rate"]),
                num_prompts=int(prompts) if prompts is not None and pd.notna(prompts) else None,
                decoder_version=version, old=version == OLD_DECODER or (decoder is not None and version != decoder)))
    return out


def summary(found: list[dict]) -> dict | None:
    """Mean measured speedup of the current-decoder measurements of one tree and its noise: the larger of the spread
    between them and their own timing noise (None when none is current)."""
    now = [m for m in found if not m["old"]]
    if not now:
        return None
    mean = statistics.fmean(m["speedup"] for m in now)
    noises = [m["noise"] for m in now if m["noise"] is not None]
    spread = statistics.stdev(m["speedup"] for m in now) if len(now) > 1 else 0.0
    noise = max([spread] + noises) if noises or len(now) > 1 else None
    return dict(speedup=mean, noise=noise, count=len(now), num_prompts=sum(m["num_prompts"] or 0 for m in now),
                sweeps=sorted({m["sweep"] for m in now}), decoder_versions=sorted({m["decoder_version"] for m in now}))


# ----------------------------------------------------------------------------------------------- the answer

def _label(kind: str, tree: Tree | None) -> str:
    if kind == "none":
        return "no speculation"
    if kind == "chain":
        return f"chain {tree.nodes}"
    return f"tree {tree.name} ({tree.nodes} nodes)"


def recommend(calibration, latency: pd.DataFrame, context: int | None = None, batch: int = 1,
              sweeps: dict[str, pd.DataFrame] | None = None, value=None, max_depth: int | None = None,
              max_rank: int | None = None, max_budget: int | None = None, trees: list[Tree] | None = None,
              target: float | None = None, decoder: str | None = None) -> dict:
    """The ranked candidates, the pick and its evidence at one batch size and context.

    calibration: a Calibration (predictions: Calibration.predict) or an accuracy table acc[K, R] (independence
    only). latency: a latency CSV's frame (latency.read_latency); its context `context`, else the one nearest
    `target` (e.g. Calibration.typical_context), else its only one. value: the optimizer's path-value function
    (default: independence). trees: named trees to rank too (swept trees find their measurements this way).
    sweeps: {name: sweep frame} whose greedy rows are the measured evidence; `decoder`: the current decoder version.
    Returns {"pick", "candidates" (ranked by predicted speedup, ties: fewer nodes), "context", "batch", "spread",
    "prediction" (which predicted tokens/step), "disagree" (current measurements outside the predicted range by
    more than their noise), "old" (candidates with only older-decoder measurements)}.
    """
    acc = calibration.accuracies("fit") if isinstance(calibration, Calibration) else np.asarray(calibration)
    K, R = acc.shape
    max_depth, max_rank = min(max_depth or K, K), min(max_rank or R, R)
    cal = calibration if isinstance(calibration, Calibration) else None
    tables = latency_tables(latency, context, batch, target)
    seconds = tables["seconds"]
    fits = [t for t in trees or [] if t.depth <= max_depth and t.max_rank < max_rank]
    cands = candidates(value or acc_value_fn(acc), seconds, max_depth, max_rank, max_budget, fits)
    predicted = iter(tree_table([t for _, t in cands if t is not None], acc, cal))
    found = measurements(sweeps or {}, batch, decoder)
    prediction = prediction_name(calibration)
    rows = []
    for kind, t in cands:
        guess = tree_speedup(next(predicted)[prediction] if t is not None else 1.0, t, tables)
        evidence = found.get(shape(t), []) if t is not None else []
        rows.append(dict(kind=kind, label=_label(kind, t), tree=t, **guess, measured=evidence,
                         current=summary(evidence)))
    rows.sort(key=lambda r: (-r["speedup"], r["nodes"], r["kind"] != "chain"))
    for r in rows:
        r["disagree"] = disagrees(r)
    return dict(pick=rows[0], candidates=rows, context=tables["context"], batch=batch, spread=tables["spread"],
                prediction=prediction, disagree=[r for r in rows if r["disagree"]],
                old=[r for r in rows if r["measured"] and r["current"] is None], cheaper=cheaper_larger(seconds))


def cheaper_larger(seconds: dict) -> list[tuple[int, int]]:
    """[(n, m)]: m > n tokens measured cheaper than n (a verify step over more tokens cannot really cost less): the
    table's noise is at least that large, and a choice between those sizes rests on it."""
    sizes = sorted(seconds)
    return [(n, m) for i, n in enumerate(sizes) for m in sizes[i + 1:] if seconds[m] < seconds[n]]


def disagrees(row: dict) -> bool:
    """Whether current measurements of a candidate fall outside its predicted speedup (its range, when the latency
    has a spread) by more than their own noise (zero when unknown)."""
    now = row["current"]
    if now is None:
        return False
    lo, hi = row["range"] or (row["speedup"], row["speedup"])
    noise = now["noise"] or 0.0
    return now["speedup"] + noise < lo or now["speedup"] - noise > hi


def runner_up_close(rec: dict) -> dict | None:
    """The runner-up when its predicted speedup range overlaps the pick's (the choice rests on a difference inside
    the latency noise), else None. Without spread columns nothing is known to overlap."""
    rows = rec["candidates"]
    if len(rows) < 2 or rows[0]["range"] is None:
        return None
    pick, second = rows[0], rows[1]
    lo = pick["range"][0]
    hi = (second["range"] or (second["speedup"], second["speedup"]))[1]
    return second if hi >= lo else None


def measured_text(row: dict) -> str:
    """'measured 0.68x +- 0.05 on this machine (sweep X, decoder V, N prompts)', or what is known instead."""
    now = row["current"]
    if now is not None:
        noise = f" +- {now['noise']:.2f}" if now["noise"] is not None else " (noise not measured)"
        return (f"measured {now['speedup']:.2f}x{noise} on this machine ({', '.join(now['sweeps'])}, decoder "
                f"{', '.join(now['decoder_versions'])}, {now['num_prompts']} prompts)")
    if row["kind"] == "none":
        return "1.00x by definition"
    old = [m for m in row["measured"] if m["old"]]
    if old:
        m = old[0]
        return (f"not measured with the current decoder (old: {m['speedup']:.2f}x by the decoder {m['decoder_version']}"
                f", {m['sweep']}, {m['num_prompts']} prompts)")
    return "not measured by any sweep found"


def latency_note(rec: dict) -> str | None:
    """Words for cheaper_larger, or None when the table is monotone."""
    pairs = rec["cheaper"]
    if not pairs:
        return None
    said = ", ".join(f"{m} tokens cheaper than {n}" for n, m in pairs[:3]) + (" ..." if len(pairs) > 3 else "")
    return (f"the latency table is not monotone ({said}): its medians differ by less than their noise there, so a "
            "choice between those sizes rests on that noise" + ("" if rec["spread"] else "; re-measure with a spread "
                                                                "(quartiles) to see how much"))


def sentence(rec: dict) -> str:
    """The recommendation in one sentence: use X at batch B and context C: predicted P tokens/step and S x (range),
    measured M x +- s (where from)."""
    pick = rec["pick"]
    where = f"at batch {rec['batch']} and context {rec['context']}"
    if pick["kind"] == "none":
        best = next((r for r in rec["candidates"] if r["kind"] != "none"), None)
        why = f" (the best speculation, {best['label']}, is predicted at {best['speedup']:.2f}x)" if best else ""
        return f"use no speculation {where}: no tree or chain is predicted faster than plain decoding{why}"
    spread = (f" ({pick['range'][0]:.2f}x-{pick['range'][1]:.2f}x from the {rec['spread']})" if pick["range"]
              else " (no spread measured)")
    return (f"use {pick['label']} {where}: predicted {pick['tokens_per_step']:.2f} tokens/step and "
            f"{pick['speedup']:.2f}x{spread}, {measured_text(pick)}")


def disagreement_text(rec: dict) -> str | None:
    """One paragraph naming the candidates whose current measurements contradict their prediction, or None."""
    if not rec["disagree"]:
        return None
    parts = [f"{r['label']}: predicted {r['speedup']:.2f}x, {measured_text(r)}" for r in rec["disagree"][:4]]
    more = len(rec["disagree"]) - len(parts)
    return ("Measurements disagree with the prediction by more than their noise: " + "; ".join(parts)
            + (f"; and {more} more" if more > 0 else "") + ". The latency table, the calibration or the decoder "
            "does not describe this machine as measured: re-measure latency (`workbench latency`) before trusting "
            "the pick.")
