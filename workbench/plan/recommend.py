"""One answer with its evidence: plan's ranking at one batch size and context, joined to what sweeps measured.

This module does not rank: the candidates, their predicted tokens/step (plan.calibration_source: the replay over
held-out answers cut to the generation length when the calibration holds prompts out) and their speedups and
ranges (speed.py) are `workbench plan`'s own (plan.candidates, plan.rank), so the app, the CLI and the exports show
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
from workbench.core.provenance import describe, differences, machine_differences, read_setting
from workbench.core.speed import priced
from workbench.measure.latency_file import latency_engine, latency_surface
from workbench.measure.latency_checks import deciding, off_trend, outlier_words
from workbench.measure.sweep_file import checked_speedup
from workbench.plan.rank import at_batch, batch_tokens, candidates as plan_candidates, choose, served, tail_surface
from workbench.plan.source import accuracy_source, calibration_source
from workbench.trees.tree import Tree, tree_key


# ----------------------------------------------------------------------------------------------- latency

def latency_tables(df: pd.DataFrame, context: int | None = None, batch: int = 1, target: float | None = None,
                   what: str = "latency") -> dict:
    """The latency table at one batch size and context, as plan reads it (latency.latency_surface): {"seconds":
    {tokens: s}, "quartiles": {tokens: (q1, q3)} or None, "measured": {tokens: s} as in the file, "spread": its
    name or None, "head_cost" (latency_file.read_head_cost or None), "context", "batch", "engine" (whose steps it
    timed: what can be served on it, rank.served), "tail" (what a batch's last rounds are priced on there,
    rank.tail_surface)}."""
    surface, ctx = latency_surface(df, [batch], context, target, what)
    quartiles = surface[batch]["spread"]
    return dict(seconds=surface[batch]["seconds"], quartiles=quartiles, measured=surface[batch]["measured"],
                head_cost=surface[batch]["head_cost"], spread="latency quartiles" if quartiles else None, context=ctx,
                batch=batch, engine=latency_engine(df)[0], tail=tail_surface(df, ctx))


def tree_speedup(tokens_per_step: float, tree: Tree | None, tables: dict,
                 batch_tokens_per_step: float | None = None) -> dict:
    """A tree's (None: no speculation) predicted speedup on a latency table (latency_tables), as plan.rank scores
    it (of the batch's tokens/step when given, plan.at_batch): {nodes, tokens_per_step, batch_tokens_per_step,
    speedup, relative_latency, range}."""
    nodes = 0 if tree is None else tree.nodes
    batched = float(tokens_per_step if batch_tokens_per_step is None else batch_tokens_per_step)
    fast, rng = priced(tables["seconds"], tables["quartiles"], tables.get("head_cost"), batched, nodes,
                       None if tree is None else tree.depth)
    return dict(nodes=nodes, tokens_per_step=float(tokens_per_step), batch_tokens_per_step=batched, speedup=fast,
                relative_latency=batched / fast, range=rng)


def designed_speedup(calibration, tree: Tree, tables: dict, max_new_tokens: int | None = None) -> dict:
    """tree_speedup of any tree (the designer's own) from the source and batch size `recommend` ranks with."""
    src = _source(calibration, max_new_tokens)
    return tree_speedup(src["tokens_per_step"](tree), tree, tables,
                        batch_tokens(src["batch_tokens_per_step"], tree, tables["batch"], tables.get("tail")))


def prediction_name(calibration) -> str:
    """Which predicted tokens/step the answer uses: the replay over held-out answers (what a live greedy decoder
    measures) when the calibration holds prompts out, else the joint paths; independence for an accuracy table."""
    if not isinstance(calibration, Calibration):
        return "predicted_independent"
    return "predicted_replay" if len(calibration.ranks("holdout")) else "predicted_joint"


# ----------------------------------------------------------------------------------------------- sweep evidence

def shape(tree: Tree) -> str:
    """A tree's shape hash, as the sweep CSV's config column carries it (sweep.tree_key)."""
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


def _source(calibration, max_new_tokens: int | None) -> dict:
    """plan's source of a Calibration (replay when it holds prompts out, else joint) or an accuracy table."""
    if isinstance(calibration, Calibration):
        return calibration_source(calibration, prediction_name(calibration).removeprefix("predicted_"),
                                  max_new_tokens=max_new_tokens)
    return accuracy_source(calibration, "accuracy table")


def _row(c: dict, tables: dict, found: dict) -> dict:
    t = c["tree"]
    evidence = found.get(shape(t), []) if t is not None else []
    row = dict(kind=c["kind"], label=_label(c["kind"], t), tree=t,
               **tree_speedup(c["tokens_per_step"], t, tables, c.get("batch_tokens_per_step")), measured=evidence,
               current=summary(evidence))
    row["disagree"] = disagrees(row)
    return row


def recommend(calibration, latency: pd.DataFrame, context: int | None = None, batch: int = 1,
              sweeps: dict[str, pd.DataFrame] | None = None, value=None, max_depth: int | None = None,
              max_rank: int | None = None, max_budget: int | None = None, trees: list[Tree] | None = None,
              target: float | None = None, max_new_tokens: int | None = None,
              latency_name: str | None = None) -> dict:
    """plan's ranking at one batch size and context, joined to the measurements of every candidate.

    calibration: a Calibration or an accuracy table acc[K, R]; its predictions are plan's (plan.calibration_source
    for answers of `max_new_tokens` tokens). latency: a latency CSV's frame; its context `context`, else the one
    nearest `target` (default: the calibration's typical context), else its only one. trees: named trees that are
    not plan candidates but whose measurements are evidence (`measured_trees`, scored the same way, never ranked).
    sweeps: {name: sweep frame}. Returns {"pick" (plan's choice),
    "candidates" (plan's ranking, best first), "measured_trees", "answer" (what to do, measured where it can be),
    "context", "batch", "spread", "prediction", "regime", "calibration", "latency", "setting", "disagree",
    "elsewhere" (rows measured only in another setting than the latency table's: shown, not weighed)}.
    """
    src = _source(calibration, max_new_tokens)
    tables = latency_tables(latency, context, batch, src["typical_context"] if target is None else target)
    top = max(tables["seconds"]) - 1
    top = top if max_budget is None else min(top, max_budget)
    depth = min(max_depth or src["max_depth"], src["max_depth"])
    ranks = min(max_rank or src["max_rank"], src["max_rank"])
    cands = served(plan_candidates(src["tokens_per_step"], src["chain_acceptance"], top, value or src["value"], depth,
                                   ranks), latency_engine(latency)[0], tables["measured"])  # what the engine runs
    found = measurements(sweeps or {}, batch, read_setting(latency))
    chosen = choose(at_batch(cands, src["batch_tokens_per_step"], batch, tables["tail"]), tables["seconds"],
                    tables["quartiles"], tables["head_cost"])
    rows = [_row(c, tables, found) for c in chosen["ranked"]]
    planned = {c["tree"].paths for c in cands if c["tree"] is not None}
    extra = [_row(dict(kind="tree", tree=t, tokens_per_step=src["tokens_per_step"](t),
                       batch_tokens_per_step=batch_tokens(src["batch_tokens_per_step"], t, batch, tables["tail"])),
                  tables, found)
             for t in trees or [] if t.depth <= depth and t.max_rank < ranks and t.nodes <= top
             and t.paths not in planned and shape(t) in found]
    every = rows + extra
    rec = dict(pick=rows[0], candidates=rows, measured_trees=extra, context=tables["context"], batch=batch,
               spread=tables["spread"], prediction=src["info"]["prediction"], regime=src["info"].get("regime"),
               calibration=str(getattr(calibration, "folder", "accuracy table")), latency=latency_name,
               setting=read_setting(latency), disagree=[r for r in every if r["disagree"]],
               elsewhere=[r for r in every if r["current"] is None and r["measured"]],
               cheaper=cheaper_larger(tables["measured"]), engine=tables["engine"])
    rec["answer"] = answer(rec)
    rec["outliers"] = deciding(off_trend(latency, tables["context"]), batch, rec["pick"]["nodes"] + 1,
                               tables["measured"])  # the points off their trend the pick's price reads
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


def noise_text(rec: dict) -> str | None:
    """Words for within_noise_of_none, or None."""
    none = within_noise_of_none(rec)
    if none is None:
        return None
    lo, hi = rec["pick"]["range"]
    nlo, nhi = none["range"] or (none["speedup"], none["speedup"])
    return (f"the choice is within the noise: {rec['pick']['label']} is predicted at {lo:.2f}x-{hi:.2f}x and no "
            f"speculation at {nlo:.2f}x-{nhi:.2f}x at batch {rec['batch']} (the latency spread): this table cannot "
            "tell them apart; a sweep at this batch size can")


def table_text(rec: dict, this: dict | None = None) -> str:
    """The latency table's setting in words and whether it was measured on this machine (provenance.here, or
    `this`): 'latency X: cpu AMD EPYC (avx2), 2 threads, ..., engine workbench; measured on another machine: ...'."""
    where = machine_differences(rec["setting"], this)
    said = (f"latency {rec['latency'] or 'table'}: {describe(rec['setting'])}, engine {rec.get('engine') or '?'}; "
            + ("this machine's CPU" if where == [] else
               "whether it is this machine is unknown" if where is None else
               "measured on another machine than this one (" + "; ".join(where) + "): its step costs are not this "
               "machine's, re-measure with `workbench latency` to price trees here"))
    return said


def outlier_text(rec: dict) -> str | None:
    """Words for the latency points off their trend that the answer's price reads (latency_checks), or None."""
    found = rec.get("outliers") or []
    if not found:
        return None
    return (f"The answer at batch {rec['batch']} rests on latency measurements off their trend: "
            + "; ".join(outlier_words(f) for f in found[:3]) + f". Re-measure {rec['latency'] or 'the latency table'}"
            " at this batch size (`workbench latency --batch-sizes ...`) before trusting the answer.")


def measured_text(row: dict) -> str:
    """'measured 0.68x +- 0.05 in the latency table's setting (sweep X, N prompts)', or what is known instead (a
    sweep counts when its recorded setting matches the table's, which need not be the server's own)."""
    now = row["current"]
    if now is not None:
        noise = f" +- {now['noise']:.2f}" if now["noise"] is not None else " (noise not measured)"
        return (f"measured {now['speedup']:.2f}x{noise} in the latency table's setting "
                f"({', '.join(now['sweeps'])}, "
                f"{now['num_prompts']} prompts)")
    if row["kind"] == "none":
        return "1.00x by definition"
    if row["measured"]:
        m = row["measured"][0]
        return (f"not measured in this latency table's setting ({m['speedup']:.2f}x in {m['sweep']}, "
                f"{'; '.join(m['elsewhere'][:2])})")
    return "not measured by any sweep found"


def latency_note(rec: dict) -> str | None:
    """Words for cheaper_larger, or None when the table is monotone."""
    pairs = rec["cheaper"]
    if not pairs:
        return None
    said = ", ".join(f"{m} tokens cheaper than {n}" for n, m in pairs[:3]) + (" ..." if len(pairs) > 3 else "")
    return (f"the latency table is not monotone ({said}): its medians differ by less than their noise there; "
            "predictions read it made non-decreasing (those sizes pooled)" + ("" if rec["spread"] else
                                                                               "; re-measure with a spread "
                                                                               "(quartiles) to see how much"))


def _inputs(rec: dict) -> str:
    from pathlib import Path

    lat = f"latency {rec['latency']}" if rec.get("latency") else "the latency table"
    return f"(calibration {Path(rec['calibration']).name}, {rec['prediction']}; {lat})"


def sentence(rec: dict) -> str:
    """The answer in one sentence, naming the calibration and latency table it rests on: use X at batch B and
    context C: predicted P tokens/step and S x (range), measured M x +- s (where from); or no speculation, with the
    best measured figure when every measured option was slower than plain decoding."""
    pick, ans = rec["pick"], rec["answer"]
    where = f"at batch {rec['batch']} and context {rec['context']} {_inputs(rec)}"
    if ans["kind"] == "measured-none":
        best = ans["row"]
        return (f"use no speculation {where}: the best measured option, {best['label']}, ran at "
                f"{best['current']['speedup']:.2f}x of plain decoding ({measured_text(best).removeprefix('measured ')}"
                f"); the plan predicted {pick['label']} at {pick['speedup']:.2f}x")
    if pick["kind"] == "none":
        best = next((r for r in rec["candidates"] if r["kind"] != "none"), None)
        why = (f" (the best speculation, {best['label']}, is predicted at {best['speedup']:.2f}x, "
               f"{measured_text(best)})") if best else ""
        return f"use no speculation {where}: no tree or chain is predicted faster than plain decoding{why}"
    spread = (f" ({pick['range'][0]:.2f}x-{pick['range'][1]:.2f}x from the {rec['spread']})" if pick["range"]
              else " (no spread measured)")
    return (f"use {pick['label']} {where}: predicted {pick['tokens_per_step']:.2f} tokens/step and "
            f"{pick['speedup']:.2f}x{spread}, {measured_text(pick)}")


def setting_text(rec: dict) -> str | None:
    """The loud note when a measurement shown beside a prediction was made in another setting than the latency table
    (both recorded, provenance.differences), or None."""
    known = [m["setting"] for r in rec["candidates"] + rec["measured_trees"] for m in r["measured"]
             if m["setting"] is not None]
    diffs = sorted({d for m in known for d in differences(rec["setting"], m)}) if rec["setting"] else []
    if not diffs:
        return None
    return ("The measurements were made in another setting than the latency table the predictions use ("
            + "; ".join(diffs[:4]) + "): prediction and measurement are not comparable until latency is re-measured "
            "where the sweeps ran (`workbench latency`).")


def provenance_note(rec: dict) -> str | None:
    """Words for measurements or a latency table whose setting was not recorded (older files), or None."""
    unknown_sweeps = any(m["setting"] is None for r in rec["candidates"] + rec["measured_trees"]
                         for m in r["measured"])
    if rec["setting"] is None:
        return ("the latency table does not record the setting it was measured in (machine, vector units, threads, "
                "load) nor whether it timed the decoder's whole step: re-measure it with `workbench latency`")
    if unknown_sweeps:
        return ("some measurements do not record their setting (older sweeps): whether they match the latency table "
                "is unknown")
    return None


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
