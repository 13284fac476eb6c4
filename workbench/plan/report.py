"""Report: a sweep CSV (+ a latency CSV) as the markdown tables of docs/tradeoffs.md."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from workbench import WorkbenchError
from workbench.core.speed import prediction_error, relative_latency, speedup_at
from workbench.measure.latency_file import latency_table, read_latency
from workbench.measure.sweep_file import SWEEP_COLUMNS, read_sweep
from workbench.plan.plan_file import plan_check


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


def _speedup(latency: dict, tokens_per_step: float, nodes: int) -> float:
    """speed.speedup_at, NaN where the table does not cover the tree (the report shows an empty cell)."""
    try:
        return speedup_at(latency, tokens_per_step, int(nodes))
    except WorkbenchError:
        return float("nan")


def _relative_cost(latency: dict, nodes: int) -> float:
    """speed.relative_latency, NaN where the table does not cover the tree."""
    try:
        return relative_latency(latency, int(nodes))
    except WorkbenchError:
        return float("nan")


def report_inputs(sweep_csv, latency_csv=None) -> tuple:
    """(sweep, latency) for `summarize` and the figures, each file read once; a sweep measures our decoder, so a
    vLLM latency table is refused."""
    return read_sweep(sweep_csv), (read_latency(latency_csv, engine="workbench") if latency_csv else None)


def summarize(sweep_csv, latency_csv=None, context: int | None = None, plan: dict | None = None,
              frames: tuple | None = None) -> str:
    """Markdown tables for docs/tradeoffs.md from a sweep CSV (and a latency CSV, and a plan): predicted vs
    measured tokens per step, optimized vs dense (Fig. 4a/4b), the hardware-aware choice vs the best measured
    speedup and typical acceptance vs epsilon and temperature (Fig. 5), all at the sweep's smallest batch size;
    goodput per batch size when it has several; the plan's predictions beside the live decoder's per batch size.
    `frames`: (sweep, latency) as the caller already read them (each file is read once per command)."""
    f = Path(sweep_csv)
    full = read_sweep(f) if frames is None else frames[0].copy()
    if not set(full.columns) <= set(SWEEP_COLUMNS) or full.empty:
        raise WorkbenchError(f"sweep CSV {sweep_csv}: not a sweep CSV with rows (columns differ or it is empty)")
    full["batch_size"] = full["batch_size"].astype(int)
    df = full[full["batch_size"] == full["batch_size"].min()]
    def values(col):
        return ", ".join(map(str, df[col].dropna().unique()))
    parts = [f"Sweep `{f.name}`: model {values('model')}, {values('num_prompts')} prompts ({values('prompts')}), "
             f"max {values('max_new_tokens')} new tokens, device {values('device')} {values('dtype')}."]
    greedy = df[(df["acceptance"] == "greedy") & (df["kind"] != "vanilla")].sort_values(["nodes", "kind"])

    pred = greedy.dropna(subset=["predicted_independent"])
    if len(pred):
        preds = ["predicted_independent", "predicted_joint", "predicted_replay", "predicted_replay_fit", "replay_swept"]
        t = pred[["tree", "kind", "nodes", *preds, "tokens_per_step"]].copy()
        for col in preds:
            t[f"{col.removeprefix('predicted_')}_err_%"] = 100 * prediction_error(t[col], t["tokens_per_step"])
        t = t.rename(columns={"tokens_per_step": "measured"}).dropna(axis=1, how="all")
        parts.append("## Predicted vs measured tokens per step (greedy)\n\n"
                     "predicted_independent / predicted_joint: the paper's mean over every position of the "
                     "calibration's fit prompts (independent heads / measured joint paths); predicted_replay: a "
                     "greedy decoder replayed over every held-out answer (a larger sample than this sweep); "
                     "predicted_replay_fit: the same over the fit answers; replay_swept: the same over the "
                     "calibration's answers to these very prompts (a lossless decoder matches it exactly)."
                     "\n\n" + markdown_table(t))

    if len(greedy):
        t = greedy[["tree", "kind", "nodes", "depth", "tokens_per_step", "overhead", "speedup", "tokens_per_s",
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
        lat = read_latency(latency_csv) if frames is None or frames[1] is None else frames[1]
        van_ctx = float((df["mean_prompt_tokens"] + df["new_tokens"] / df["num_prompts"] / 2).mean())
        table, ctx = latency_table(lat, context, None if context is not None else van_ctx, str(latency_csv),
                                   field="latency")
        t = greedy[["tree", "kind", "nodes", "predicted_independent", "tokens_per_step", "speedup"]].copy()
        t["relative_cost"] = [_relative_cost(table, n) for n in t["nodes"]]
        t["predicted_speedup"] = [_speedup(table, x, n) for x, n in zip(t["predicted_independent"], t["nodes"])]
        t["latency_model_speedup"] = [_speedup(table, x, n) for x, n in zip(t["tokens_per_step"], t["nodes"])]
        parts.append(f"## Hardware-aware choice (latency `{Path(latency_csv).name}`, context {ctx})\n\n"
                     "predicted_speedup = predicted_independent / (t(nodes+1)/t(1)); latency_model_speedup uses the "
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

    if full["batch_size"].nunique() > 1:
        g = full[full["acceptance"] == "greedy"].sort_values(["nodes", "tree", "batch_size"])
        t = g[["tree", "kind", "nodes", "batch_size", "tokens_per_step", "tokens_per_s", "speedup", "overhead",
               "step_ms", "forward_ms", "decoder_overhead", "exact_match"]]
        parts.append("## Goodput per batch size\n\ntokens_per_s is goodput (all sequences of a batch); speedup and "
                     "overhead are against vanilla greedy at the same batch size; tokens_per_step is tokens per "
                     "step per sequence.\n\n" + markdown_table(t))
    if plan is not None:
        t = plan_check(plan, full)
        if len(t):
            t["within_10pct"] = t["speedup_err_pct"].abs() <= 10
            parts.append("## Plan per batch size: predicted vs measured\n\nThe plan's choice and runner-up at each "
                         "batch size, decoded live (`workbench sweep --plan`), greedy, against vanilla greedy at the "
                         "same batch size; err = predicted / measured speedup - 1.\n\n" + markdown_table(t))

    typical = df[df["acceptance"] == "typical"]
    if len(typical):
        t = typical[["tree", "nodes", "temperature", "epsilon", "delta", "tokens_per_step", "speedup",
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
