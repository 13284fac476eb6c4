"""Speculation plans per batch size: for each batch size, the fastest of the optimal tree at every budget, the
top-1 chain of every length, and no speculation (and per-step trees where the table timed them), by predicted speedup
on a measured latency surface t(B, n): `weigh`'s choice at each batch size (weigh.py lists the candidates).

The plan is priced on the engine its latency table timed (surface.Surface: on vLLM's served rounds only what vLLM
runs, a top-1 chain of each K it timed at every batch size asked, or none; there a batch's tail is priced on the
smaller batch's rounds).

Batch size changes the answer: at batch 1 a verify of n tokens costs little more than one token (the weights are
read once either way); at batch B the same n tokens per sequence are B * n tokens of work, and speculation can lose
to vanilla decoding while acceptance stays the same. Tokens per step have one producer per source (source.Source);
a calibration predicts for answers of the generation length and the plan says which statistic and answers it
assumes (source.regime; docs/prediction.md).
"""
from __future__ import annotations

from datetime import datetime, timezone

from workbench import __version__
from workbench.core.notes import FieldError
from workbench.plan.plan_file import PLAN_VERSION
from workbench.plan.source import Source
from workbench.plan.surface import Surface
from workbench.plan.weigh import Candidate, ruled, weigh


def _brief(c: Candidate | None) -> dict | None:
    if c is None:
        return None
    return dict(kind=c.kind, nodes=c.nodes, medusa_choices=c.medusa_choices, predicted_tokens_per_step=c.tokens_per_step,
                predicted_speedup=c.speedup, predicted_batch_tokens_per_step=c.batch_tokens_per_step)


def surface_of(latency) -> Surface:
    """A Surface, or the latency CSV at a path read into one."""
    return latency if isinstance(latency, Surface) else Surface.read(latency)


def make_plan(source: Source, latency, batch_sizes, context: int | None = None, noise: str = "fastest") -> dict:
    """The plan file's dict for these batch sizes on a latency table (a Surface or a CSV's path) at one context
    (`context`, else the one nearest the calibration's typical context, else the only one); `noise`: weigh's rule
    for a choice within the latency noise of no speculation (weigh.NOISE_RULES)."""
    batch_sizes = sorted({int(b) for b in batch_sizes})
    if not batch_sizes or batch_sizes[0] < 1:
        raise FieldError("batch_sizes", "not_positive", "{field}: give positive integers like 1,2,4,8,16")
    ruled([], noise)  # an unknown rule: one error line before the table is read
    surface = surface_of(latency)
    ctx = surface.context(batch_sizes, context, source.typical_context)
    plans, alternatives, dyn_info = [], [], None
    for b in batch_sizes:
        pick = weigh(source, surface, b, ctx, dynamic=True, among=batch_sizes, noise=noise)
        best, chain, dyn_info = pick.best, pick.best_chain, pick.dynamic
        plans.append(dict(batch_size=b, kind=best.kind, medusa_choices=best.medusa_choices, nodes=best.nodes,
                          predicted_tokens_per_step=best.tokens_per_step, predicted_speedup=best.speedup,
                          predicted_batch_tokens_per_step=best.batch_tokens_per_step))
        alternatives.append(dict(batch_size=b, speedup_range=list(best.range) if best.range else None,
                                 runner_up=_brief(pick.runner_up), runner_up_within_noise=pick.within_noise,
                                 best_chain=dict(k=chain.nodes, predicted_tokens_per_step=chain.tokens_per_step,
                                                 predicted_speedup=chain.speedup),
                                 chains=chain_rows(pick.ranked),
                                 **({"set_aside": _brief(pick.set_aside)} if noise != "fastest" else {})))
    df, first = surface.frame, surface.at(batch_sizes[0], ctx)
    setup = {c: str(df[c].iloc[0]) for c in ("model", "device", "dtype") if c in df.columns}
    where = surface.setting
    return dict(version=PLAN_VERSION, plans=plans, alternatives=alternatives, chain_acceptance=source.chain_acceptance,
                source=source.info,
                latency=dict(file=str(surface.path), context=ctx, spread=first.spread is not None,
                             head_cost=first.head_cost is not None, **setup, setting=where,
                             mode=(where or {}).get("mode", "unknown (the table does not record its setting)"),
                             engine=surface.engine, engine_version=surface.engine_version,
                             batch_shrinks=surface.serving.drops_finished, dynamic=dyn_info),
                **({"within_noise": noise} if noise != "fastest" else {}),
                workbench_version=__version__, created=datetime.now(timezone.utc).isoformat(timespec="seconds"))


def equal_budgets(source: Source, latency, batch_sizes, context: int | None = None) -> tuple[list[dict], dict | None]:
    """Static or per-step at budget N, as the plan prices them: per batch size and every N the table timed per-step
    trees at, the optimal static tree of N nodes and the per-step tree of N nodes, each with its tokens/step (and
    the batch's), its step's cost over plain's and its speedup and range, priced on its own rows; and what `weigh`
    says of the per-step trees (None: the table has no per-step rows; "weighed" false: why not)."""
    batch_sizes = sorted({int(b) for b in batch_sizes})
    surface = surface_of(latency)
    ctx = surface.context(batch_sizes, context, source.typical_context)
    if surface.dynamic is None:
        return [], None
    top = int(surface.dynamic["tokens"].max()) - 1  # no static tree beyond the largest per-step one is compared
    rows, info = [], None
    for b in batch_sizes:
        pick = weigh(source, surface, b, ctx, max_nodes=top, chains=False, dynamic=True, among=batch_sizes)
        info = pick.dynamic
        if not info["weighed"]:
            return [], info
        fixed = {c.nodes: c for c in pick.ranked if c.kind not in ("none", "dynamic")}
        for d in sorted((c for c in pick.ranked if c.kind == "dynamic"), key=lambda c: c.nodes):
            for kind, c in (("static", fixed.get(d.nodes)), ("per-step", d)):
                if c is not None:
                    rows.append(dict(batch_size=b, nodes=d.nodes, kind=kind, tree=c.tree.name,
                                     tokens_per_step=c.tokens_per_step, batch_tokens_per_step=c.batch_tokens_per_step,
                                     step_ratio=c.relative_latency, speedup=c.speedup,
                                     range=list(c.range) if c.range else None))
    return rows, info


def chain_rows(ranked: list[Candidate]) -> list[dict]:
    """Every chain (and none, k = 0) weighed at one batch size, by K: what an engine that drafts chains can be
    asked for, each with the plan's prediction (what `vllm-check --plan` measures beside it)."""
    rows = [dict(k=c.nodes, predicted_tokens_per_step=c.tokens_per_step,
                 predicted_batch_tokens_per_step=c.batch_tokens_per_step, predicted_speedup=c.speedup,
                 speedup_range=list(c.range) if c.range else None)
            for c in ranked if c.kind in ("chain", "none")]
    return sorted(rows, key=lambda r: r["k"])


def plan_table(plan: dict) -> str:
    """The plan as a text table: batch size, choice, nodes, tokens/step, predicted speedup, runner-up and whether
    it is within the latency noise."""
    lines = [f"{'batch':>5}  {'choice':<10}{'nodes':>6}{'tok/step':>10}{'speedup':>9}  {'runner-up':<24}"
             f"{'within noise':>13}"]
    for row, alt in zip(plan["plans"], plan["alternatives"]):
        choice = f"chain K={row['nodes']}" if row["kind"] == "chain" else row["kind"]
        choice = f"dynamic {row['nodes']}/{len(row['medusa_choices'])}" if row["kind"] == "dynamic" else choice
        r = alt["runner_up"]
        runner = "-" if r is None else \
            f"{'chain K=' + str(r['nodes']) if r['kind'] == 'chain' else r['kind']}" + \
            (f" {r['nodes']}" if r["kind"] in ("tree", "dynamic") else "") + f" {r['predicted_speedup']:.3f}x"
        noise = {True: "yes", False: "no", None: "n/a"}[alt["runner_up_within_noise"]]
        lines.append(f"{row['batch_size']:>5}  {choice:<10}{row['nodes']:>6}{row['predicted_tokens_per_step']:>10.3f}"
                     f"{row['predicted_speedup']:>8.3f}x  {runner:<24}{noise:>13}")
    return "\n".join(lines)
