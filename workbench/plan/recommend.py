"""One answer with its evidence, as facts: plan's weighing at one batch size and context, joined to what sweeps
measured (the front ends word it: ui/answer.py).

This module does not rank: the candidates, their predicted tokens/step (source.calibration_source: the replay over
held-out answers cut to the generation length when the calibration holds prompts out) and their speedups and
ranges (speed.py) are `workbench plan`'s own (weigh.weigh), so the app, the CLI and the exports show
the same number for the same candidate. What it adds is the evidence: every greedy sweep row at the same batch
size that measured the same tree shape, with the sweep's name and prompt count, its noise from the repeats at
that batch size (never pooled across batch sizes) and the setting it ran in. The answer is measured where it can
be: when the best current measurement at this batch size is slower than plain decoding, it is "no
speculation", with that figure.
"""
from __future__ import annotations

import math
import statistics

import pandas as pd

from workbench.calibrate.folder import Calibration
from workbench.calibrate.served import Served
from workbench.core.provenance import differences, read_setting
from workbench.measure.latency_checks import deciding, off_trend
from workbench.measure.sweep_file import checked_speedup
from workbench.plan.source import Source, accuracy_source, calibration_source, served_source
from workbench.plan.surface import At, Surface
from workbench.plan.weigh import Candidate, price, weigh
from workbench.trees.tree import Tree, tree_key


# ----------------------------------------------------------------------------------------------- latency

def latency_tables(latency, context: int | None = None, batch: int = 1, target: float | None = None) -> At:
    """The surface at one batch size and context, as the recommendation reads it: `context`, else the one nearest
    `target`, else the only one (Surface.context). `latency`: a Surface or a latency CSV's checked frame."""
    surface = latency if isinstance(latency, Surface) else Surface(latency)
    return surface.at(batch, surface.context([batch], context, target))


def _facts(c: Candidate) -> dict:
    return dict(nodes=c.nodes, tokens_per_step=c.tokens_per_step, batch_tokens_per_step=c.batch_tokens_per_step,
                speedup=c.speedup, relative_latency=c.relative_latency, range=c.range)


def designed_speedup(calibration, tree: Tree, at: At, max_new_tokens: int | None = None) -> dict:
    """Any tree's (the designer's own) predicted speedup at `at`, from the source `recommend` weighs with (weigh.price):
    {nodes, tokens_per_step, batch_tokens_per_step, speedup, relative_latency, range}."""
    return _facts(price(_source(calibration, max_new_tokens), at, tree))


def prediction_name(calibration) -> str:
    """Which predicted tokens/step the answer uses: the replay over held-out answers (what a live greedy decoder
    measures) when the calibration holds prompts out, else the joint paths; independence for an accuracy table."""
    if not isinstance(calibration, Calibration):
        return "predicted_independent"
    return "predicted_replay" if len(calibration.ranks("holdout")) else "predicted_joint"


# ----------------------------------------------------------------------------------------------- sweep evidence

def shape(tree: Tree) -> str:
    """A tree's shape hash, as the sweep CSV's config column carries it (tree.tree_key)."""
    return tree_key(tree).rsplit(":", 1)[1]


def timing_noise(sweep: pd.DataFrame, run, batch: int = 1) -> float | None:
    """Relative run-to-run noise of one speedup measured in `run` at batch size `batch`: the spread (coefficient of
    variation) of the vanilla baseline, which the sweep re-measures before every configuration at that batch size
    (never pooled across batch sizes: their speeds differ), times sqrt(2) (a speedup is a ratio of two such
    measurements). None with fewer than two baselines."""
    at = (sweep["run"] == run) & sweep["batch_size"].eq(batch)
    base = sweep.loc[at, "vanilla_tokens_per_s"].dropna()  # the baseline of each row at this batch size
    if len(base) < 2 or base.mean() <= 0:
        return None
    return math.sqrt(2) * statistics.stdev(base) / base.mean()


def measurements(sweeps: dict[str, pd.DataFrame], batch: int = 1, table: dict | None = None) -> dict[str, list]:
    """{tree shape hash (as in the sweep's config): [measurement, ...]} over the greedy rows of every sweep at this
    batch size (sweep frames: sweep_file.read_sweep). A measurement: sweep, tree, nodes, speedup (the decoding
    phase's, as predicted; phase says when a row only has the end-to-end one), phase, noise (absolute,
    None if unknown), tokens_per_step, num_prompts, setting, elsewhere (elsewhere(): how its setting differs from
    `table`'s, the setting of the latency table predictions use)."""
    out: dict[str, list] = {}
    seen: dict = {}  # setting cell -> setting (a sweep repeats one cell on every row)
    for name, df in (sweeps or {}).items():
        rows = df[df["acceptance"].eq("greedy") & df["batch_size"].eq(batch) & (df["nodes"] > 0) & df["speedup"].notna()]
        noises = {run: timing_noise(df, run, batch) for run in rows["run"].unique()}  # one per run, not per row
        for r in rows.to_dict("records"):
            speedup, phase = checked_speedup(r)
            head = str(r["config"]).split("|", 1)[0]
            if ":" not in head:
                continue
            noise = noises[r["run"]] if r["run"] in noises else timing_noise(df, r["run"], batch)  # NaN run
            prompts, cell = r["num_prompts"], r.get("setting") if isinstance(r.get("setting"), str) else None
            setting = seen[cell] if cell in seen else seen.setdefault(cell, read_setting(cell))  # parsed once
            out.setdefault(head.rsplit(":", 1)[1], []).append(dict(
                sweep=name, tree=str(r["tree"]), nodes=int(r["nodes"]), speedup=speedup, phase=phase,
                noise=None if noise is None else noise * speedup,
                tokens_per_step=float(r["tokens_per_step"]), num_prompts=int(prompts) if pd.notna(prompts) else None,
                setting=setting, elsewhere=elsewhere(table, setting)))
    return out


def elsewhere(table: dict | None, measured: dict | None) -> list[str]:
    """How a measurement's setting differs from the latency table's in what changes a step's cost (threads, CPU,
    ...): [] when they match, or when neither was recorded (two older files: nothing tells them apart, so they are
    compared). A measurement from elsewhere is shown, never weighed against the prediction: verify cost depends on
    the threads alone by half again (t(64)/t(1) 3.1 with 2 threads, 4.6 with 1)."""
    return [] if table is None and measured is None else differences(table, measured)


def comparable(m: dict) -> bool:
    """A measurement that is evidence about the prediction: made in the latency table's setting."""
    return not m.get("elsewhere")


def summary(found: list[dict]) -> dict | None:
    """Mean measured speedup of the comparable measurements of one tree (the latency table's setting) and its noise: the larger of the spread between them and their own timing noise (None when none is)."""
    now = [m for m in found if comparable(m)]
    if not now:
        return None
    mean = statistics.fmean(m["speedup"] for m in now)
    noises = [m["noise"] for m in now if m["noise"] is not None]
    spread = statistics.stdev(m["speedup"] for m in now) if len(now) > 1 else 0.0
    noise = max([spread] + noises) if noises or len(now) > 1 else None
    return dict(speedup=mean, noise=noise, count=len(now), num_prompts=sum(m["num_prompts"] or 0 for m in now),
                sweeps=sorted({m["sweep"] for m in now}))


# ----------------------------------------------------------------------------------------------- the answer

def _label(kind: str, tree: Tree | None) -> str:
    if kind == "none":
        return "no speculation"
    if kind == "chain":
        return f"chain {tree.nodes}"
    return f"tree {tree.name} ({tree.nodes} nodes)"


def _source(calibration, max_new_tokens: int | None) -> Source:
    """plan's source of a Calibration (replay when it holds prompts out, else joint), a served calibration (a chain
    drafter's acceptance, as `plan --calibration` reads it) or an accuracy table."""
    if isinstance(calibration, Served):
        return served_source(calibration)
    if isinstance(calibration, Calibration):
        return calibration_source(calibration, prediction_name(calibration).removeprefix("predicted_"),
                                  max_new_tokens=max_new_tokens)
    return accuracy_source(calibration, "accuracy table")


def _row(c: Candidate, found: dict) -> dict:
    evidence = found.get(shape(c.tree), []) if c.tree is not None else []
    row = dict(kind=c.kind, label=_label(c.kind, c.tree), tree=c.tree, **_facts(c), measured=evidence,
               current=summary(evidence))
    row["disagree"] = disagrees(row)
    return row


def recommend(calibration, latency, context: int | None = None, batch: int = 1,
              sweeps: dict[str, pd.DataFrame] | None = None, value=None, max_depth: int | None = None,
              max_rank: int | None = None, max_budget: int | None = None, trees: list[Tree] | None = None,
              target: float | None = None, max_new_tokens: int | None = None,
              latency_name: str | None = None) -> dict:
    """plan's weighing at one batch size and context, joined to the measurements of every candidate.

    calibration: a Calibration, a served calibration (calibrate/served.Served: chains only) or an accuracy table
    acc[K, R]; its predictions are plan's (source.calibration_source for answers of `max_new_tokens` tokens). latency: a Surface or a latency CSV's frame; its context `context`, else
    the one nearest `target` (default: the calibration's typical context), else its only one. value / max_depth /
    max_rank: the path values and limits of the trees weighed (Source.limited). trees: named trees that are not plan
    candidates but whose measurements are evidence (`measured_trees`, priced the same way, never ranked).
    sweeps: {name: sweep frame}. Returns {"pick" (plan's choice), "candidates" (plan's ranking, best first),
    "measured_trees", "answer" (what to do, measured where it can be), "context", "batch", "spread", "prediction",
    "regime", "calibration", "latency", "setting", "disagree", "elsewhere" (rows measured only in another setting
    than the latency table's: shown, not weighed), "cheaper", "engine", "outliers", "source" (the source's info:
    "served" and its drafter for a served calibration)}.
    """
    surface = latency if isinstance(latency, Surface) else Surface(latency)
    src = _source(calibration, max_new_tokens).limited(max_depth, max_rank, value)
    ctx = surface.context([batch], context, src.typical_context if target is None else target)
    at = surface.at(batch, ctx)
    top = max(at.seconds) - 1
    top = top if max_budget is None else min(top, max_budget)
    chosen = weigh(src, surface, batch, ctx, top)
    found = measurements(sweeps or {}, batch, surface.setting)
    rows = [_row(c, found) for c in chosen.ranked]
    planned = {c.tree.paths for c in chosen.ranked if c.tree is not None}
    extra = [_row(price(src, at, t, "tree"), found) for t in trees or []
             if t.depth <= src.max_depth and t.max_rank < src.max_rank and t.nodes <= top
             and t.paths not in planned and shape(t) in found]
    every = rows + extra
    rec = dict(pick=rows[0], candidates=rows, measured_trees=extra, context=ctx, batch=batch,
               spread="latency quartiles" if at.spread else None, prediction=src.info["prediction"],
               regime=src.info.get("regime"), calibration=str(getattr(calibration, "folder", "accuracy table")),
               latency=latency_name, setting=surface.setting, disagree=[r for r in every if r["disagree"]],
               elsewhere=[r for r in every if r["current"] is None and r["measured"]],
               cheaper=cheaper_larger(at.measured), engine=surface.engine, source=src.info)
    rec["answer"] = answer(rec)
    rec["outliers"] = deciding(off_trend(surface.frame, ctx), batch, rec["pick"]["nodes"] + 1,
                               at.measured)  # the points off their trend the pick's price reads
    return rec


def answer(rec: dict) -> dict:
    """What to do: plan's pick, unless the best current measurement at this batch size (over plan's candidates and
    the measured trees) is slower than plain decoding: then no speculation, with that figure. {"kind": "plan" |
    "measured-none", "row": the pick or the best measured row}."""
    measured = [r for r in rec["candidates"] + rec["measured_trees"] if r["current"] is not None]
    best = max(measured, key=lambda r: r["current"]["speedup"], default=None)
    if best is not None and best["current"]["speedup"] < 1 and rec["pick"]["kind"] != "none":
        return dict(kind="measured-none", row=best)
    return dict(kind="plan", row=rec["pick"])


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
    """The runner-up of plan's ranking when its predicted speedup range overlaps the pick's (the choice rests on a
    difference inside the latency noise), else None. Without spread columns nothing is known to overlap."""
    rows = rec["candidates"]
    if len(rows) < 2 or rows[0]["range"] is None:
        return None
    pick, second = rows[0], rows[1]
    lo = pick["range"][0]
    hi = (second["range"] or (second["speedup"], second["speedup"]))[1]
    return second if hi >= lo else None


def within_noise_of_none(rec: dict) -> dict | None:
    """The 'no speculation' row when the pick's predicted range reaches into its range (speculating or not cannot be
    told apart on this table), else None. Without spread columns nothing is known to overlap."""
    pick = rec["pick"]
    none = next((r for r in rec["candidates"] if r["kind"] == "none"), None)
    if pick["kind"] == "none" or not pick["range"] or none is None:
        return None
    return none if pick["range"][0] <= (none["range"] or (none["speedup"], none["speedup"]))[1] else None
