"""Speculation plans per batch size: for each batch size, the fastest of the optimal tree at every budget, the
top-1 chain of every length, and no speculation, by predicted speedup on a measured latency surface t(B, n).

The plan is priced on the engine its latency table timed (latency_file.latency_engine): on our decoder's steps the
candidates are below; on vLLM's served rounds (`workbench latency --engine vllm`) only what vLLM runs, a top-1 chain
of each K it timed, or none; there a batch's tail, once its first sequences are done, is priced on the smaller
batch's rounds (vLLM drops a finished request; our decoder steps all B rows to the end: speed.shrinking_cost).

Batch size changes the answer: at batch 1 a verify of n tokens costs little more than one token (the weights are
read once either way); at batch B the same n tokens per sequence are B * n tokens of work, and speculation can lose
to vanilla decoding while acceptance stays the same. The candidates:
  tree   the optimal tree at every budget the surface covers (each prefix of one optimize.best_first run is the
         optimal tree of that size);
  chain  the top-1 chain [[0], [0, 0], ...] of every length up to the number of heads whose last position is
         ever accepted: what vLLM's Medusa drafter runs (vllm/v1/spec_decode/medusa.py takes each head's argmax);
  none   no speculation, speedup 1 by definition;
  dynamic  where the table timed per-step trees (`latency --envelope`: rows of policy dynamic) and the source replays
         them (a calibration with topk.parquet), the per-step tree of N nodes chosen from an envelope of the size
         the table timed (the source's optimal tree of that size: the selection's cost grows with its nodes), at
         every N the table timed, priced on its own rows. Only our decoder runs it (`decode --dynamic N --tree
         ENVELOPE`); engine exports refuse it.
Tokens per step have one producer per source: Calibration.predict (a calibration folder), optimize.expected_length
(an accuracy table), 1 + the sum of the first K entries of a per-position acceptance vector (chains only); a
calibration predicts for answers of the generation length (`max_new_tokens`: acceptance rises along an answer) and the
plan says which statistic and answers it assumes (source.regime; docs/prediction.md). Each candidate's speedup is
speed.speedup_at, ranked by `rank` (the one ranking: the app's recommendation is this one); the choice is exact over the candidates, ties going to the simpler kind
(none, then chain, then tree) and then to fewer nodes.
"""
from __future__ import annotations

from datetime import datetime, timezone

from workbench import WorkbenchError, __version__
from workbench.core.provenance import read_setting
from workbench.core.speed import max_tokens, priced, shrinking_cost, within_noise
from workbench.measure.latency_file import every_batch, latency_engine, latency_surface, read_latency
from workbench.plan.plan_file import PLAN_VERSION
from workbench.plan.source import chain_tree, is_chain
from workbench.trees.dynamic import DynamicPolicy
from workbench.trees.optimize import best_first, value_and_limits
from workbench.trees.tree import make_tree

SIMPLER = {"none": 2, "chain": 1, "tree": 0, "dynamic": -1}  # tie-break: the simpler setting wins an exact tie


# ----------------------------------------------------------------------------------------------- the planner

def candidates(tokens_per_step, chain_acceptance: list[float], max_nodes: int, value=None,
               max_depth: int | None = None, max_rank: int | None = None) -> list[dict]:
    """Every choice weighed, each {"kind", "tree", "nodes", "tokens_per_step"}: no speculation, the top-1 chain of
    every length with a positive last position (at most max_nodes), and with `value` the optimal tree at every
    budget 1..max_nodes (distinct shapes; a tree that is a chain counts as the chain)."""
    out = [dict(kind="none", tree=None, nodes=0, tokens_per_step=1.0)]
    seen = set()
    for k in range(1, min(len(chain_acceptance), max_nodes) + 1):
        t = chain_tree(k)
        seen.add(t.paths)
        out.append(dict(kind="chain", tree=t, nodes=k, tokens_per_step=float(tokens_per_step(t))))
    if value is not None and max_nodes >= 1:
        fn, depth, rank = value_and_limits(value, max_depth, max_rank, "the planner")
        order = [p for p, _ in best_first(fn, max_nodes, depth, rank)]
        for n in range(1, len(order) + 1):
            t = make_tree(order[:n], name=f"optimal_{n}")
            if t.paths in seen:
                continue
            seen.add(t.paths)
            kind = "chain" if is_chain(t) else "tree"
            out.append(dict(kind=kind, tree=t, nodes=n, tokens_per_step=float(tokens_per_step(t))))
    return out


def served(cands: list[dict], engine: str, timed) -> list[dict]:
    """The candidates the engine a latency table timed can run: all of them on our decoder ("workbench"); on vLLM a
    top-1 chain of each K it timed (tokens K + 1 in `timed`) or none: it drafts no trees and its round at a K not
    timed is not known."""
    if engine == "workbench":
        return cands
    return [c for c in cands if c["kind"] == "none" or (c["kind"] == "chain" and c["nodes"] + 1 in timed)]


def _rank(c: dict) -> tuple:
    return c["speedup"], SIMPLER[c["kind"]], -c["nodes"]


def at_batch(cands: list[dict], batch_tokens_per_step, batch: int, tail: dict | None = None) -> list[dict]:
    """The candidates at one batch size, each with its "batch_tokens_per_step" (batch_tokens)."""
    return [dict(c, batch_tokens_per_step=batch_tokens(batch_tokens_per_step, c["tree"], batch, tail)) for c in cands]


def batch_tokens(batch_tokens_per_step, tree, batch: int, tail: dict | None = None) -> float:
    """A tree's tokens/step for `batch` sequences side by side (the source's batch_tokens_per_step); 1 for no
    speculation (None), whose batch also waits for its longest answer. `tail` (tail_surface): the engine drops
    finished sequences, so the batch's last rounds cost a smaller batch's."""
    return 1.0 if tree is None else float(batch_tokens_per_step(tree, batch, batch_cost(tail, batch)))


def tail_surface(df, context: int) -> dict | None:
    """What a batch's tail is priced on in a latency table: where its engine drops finished sequences (vLLM), every
    batch size's rounds at `context` (latency_file.every_batch); None on our decoder, which steps all B rows to the
    end."""
    return None if latency_engine(df)[0] == "workbench" else every_batch(df, context)


def batch_cost(tail: dict | None, batch: int):
    """The source's `cost` at one batch size from a tail_surface (speed.shrinking_cost), None without one."""
    return None if tail is None else shrinking_cost(tail, batch)


def rank(cands: list[dict], latency: dict, spread=None, head_cost: dict | None = None) -> list[dict]:
    """The candidates a latency table covers ({tokens: seconds} of one batch size), each with its "speedup" and
    "range" (speed.priced: the batch's tokens/step, `at_batch`, else the mean's, over the step cost of its token
    count and, where the table measured the heads' cost (`head_cost`, latency_file.read_head_cost), its own depth;
    the range over the interquartile range of t, None without a spread), best first: the one ranking every answer (CLI, app,
    exports) comes from."""
    top = max_tokens(latency)
    scored = []
    for c in cands:
        if c["nodes"] + 1 <= top:
            tps = c.get("batch_tokens_per_step", c["tokens_per_step"])
            fast, rng = priced(latency, spread, head_cost, tps, c["nodes"], _depth(c["tree"]))
            scored.append(dict(c, speedup=fast, range=rng))
    return sorted(scored, key=_rank, reverse=True)


def _depth(tree) -> int | None:
    return None if tree is None else tree.depth


def choose(cands: list[dict], latency: dict, spread=None, head_cost: dict | None = None,
           dynamic: tuple | None = None) -> dict:
    """The best candidate at one batch size (`rank`): {"best", "runner_up" (best of another kind, or None),
    "within_noise", "best_chain" (best chain or none), "ranked" (every candidate, best first)}. `dynamic`: (per-step
    candidates, their latency, spread, head_cost), priced on their own rows and ranked with the others."""
    scored = rank(cands, latency, spread, head_cost)
    if dynamic is not None:
        scored = sorted(scored + rank(*dynamic), key=_rank, reverse=True)
    best = scored[0]
    others = [c for c in scored if c["kind"] != best["kind"]]
    runner = max(others, key=_rank) if others else None
    noise = within_noise(best["range"], runner["range"]) if runner else None
    return dict(best=best, runner_up=runner, within_noise=noise, ranked=scored,
                best_chain=max((c for c in scored if c["kind"] in ("chain", "none")), key=_rank))


def _choices(c: dict) -> list:
    """medusa_choices of a candidate: its tree's, a per-step tree's envelope's (the nodes it chooses from)."""
    tree = c["tree"].envelope if isinstance(c["tree"], DynamicPolicy) else c["tree"]
    return tree.as_lists() if tree is not None else []


def _brief(c: dict | None) -> dict | None:
    if c is None:
        return None
    return dict(kind=c["kind"], nodes=c["nodes"], medusa_choices=_choices(c),
                predicted_tokens_per_step=c["tokens_per_step"], predicted_speedup=c["speedup"],
                predicted_batch_tokens_per_step=c.get("batch_tokens_per_step", c["tokens_per_step"]))


def make_plan(source: dict, latency_path, batch_sizes, context: int | None = None) -> dict:
    """The plan file's dict for these batch sizes on the latency CSV at one context (`context`, else the one
    nearest the calibration's typical context, else the only one)."""
    batch_sizes = sorted({int(b) for b in batch_sizes})
    if not batch_sizes or batch_sizes[0] < 1:
        raise WorkbenchError("--batch-sizes: give positive integers like 1,2,4,8,16")
    df = read_latency(latency_path)
    surface, ctx = latency_surface(df, batch_sizes, context, source["typical_context"], f"--latency {latency_path}")
    top = max(max_tokens(s["seconds"]) for s in surface.values()) - 1
    engine, version = latency_engine(df)
    cands = served(candidates(source["tokens_per_step"], source["chain_acceptance"], top, source["value"],
                              source["max_depth"], source["max_rank"]),
                   engine, set.intersection(*(set(s["measured"]) for s in surface.values())))
    dyn, dyn_info = dynamic_candidates(source, latency_path, batch_sizes, ctx)
    plans, alternatives, tail = [], [], tail_surface(df, ctx)
    for b in batch_sizes:
        at = at_batch(cands, source["batch_tokens_per_step"], b, tail)
        pick = choose(at, surface[b]["seconds"], surface[b]["spread"], surface[b]["head_cost"],
                      per_step_at(dyn, source["batch_tokens_per_step"], b))
        best, chain = pick["best"], pick["best_chain"]
        plans.append(dict(batch_size=b, kind=best["kind"], medusa_choices=_choices(best), nodes=best["nodes"],
                          predicted_tokens_per_step=best["tokens_per_step"], predicted_speedup=best["speedup"],
                          predicted_batch_tokens_per_step=best["batch_tokens_per_step"]))
        alternatives.append(dict(batch_size=b, speedup_range=list(best["range"]) if best["range"] else None,
                                 runner_up=_brief(pick["runner_up"]), runner_up_within_noise=pick["within_noise"],
                                 best_chain=dict(k=chain["nodes"], predicted_tokens_per_step=chain["tokens_per_step"],
                                                 predicted_speedup=chain["speedup"]),
                                 chains=chain_rows(pick["ranked"])))
    setup = {c: str(df[c].iloc[0]) for c in ("model", "device", "dtype") if c in df.columns}
    where = read_setting(df)
    return dict(version=PLAN_VERSION, plans=plans, alternatives=alternatives, chain_acceptance=source["chain_acceptance"],
                source=source["info"],
                latency=dict(file=str(latency_path), context=ctx, spread=surface[batch_sizes[0]]["spread"] is not None,
                             head_cost=surface[batch_sizes[0]]["head_cost"] is not None, **setup, setting=where,
                             mode=(where or {}).get("mode", "unknown (the table does not record its setting)"),
                             engine=engine, engine_version=version, batch_shrinks=tail is not None, dynamic=dyn_info),
                workbench_version=__version__, created=datetime.now(timezone.utc).isoformat(timespec="seconds"))


def dynamic_candidates(source: dict, latency_path, batch_sizes, context: int) -> tuple[tuple | None, dict | None]:
    """((per-step candidates, their surface at `context`) or None, what the plan records of them: the envelope's
    nodes and medusa_choices, or why none was weighed), for a table with per-step rows (`latency --envelope`)."""
    df = read_latency(latency_path, policy="dynamic")
    if df is None:
        return None, None
    m = int(df["envelope"].dropna().iloc[0])
    try:
        surface, _ = latency_surface(df, batch_sizes, context, what=f"--latency {latency_path} (per-step trees)")
        if source["info"].get("prediction") != "predicted_replay":
            raise WorkbenchError("a per-step tree is predicted only by a calibration's replay (its heads' recorded "
                                 "log-probs), not by an accuracy table, an acceptance vector or --prediction joint")
        fn, depth, rank_ = value_and_limits(source["value"], source["max_depth"], source["max_rank"], "the planner")
        envelope = make_tree([p for p, _ in best_first(fn, m, depth, rank_)], name=f"envelope_{m}")
        sizes = sorted(set.intersection(*(set(s["measured"]) for s in surface.values())) - {1})
        cands = [dict(kind="dynamic", tree=DynamicPolicy(n - 1, envelope), nodes=n - 1) for n in sizes
                 if n - 1 <= envelope.nodes]
        for c in cands:
            c["tokens_per_step"] = float(source["tokens_per_step"](c["tree"]))
    except WorkbenchError as e:  # e.g. a calibration without topk.parquet: static candidates only, and why
        return None, dict(envelope=m, weighed=False, why=str(e))
    return (cands, surface), dict(envelope=m, weighed=True, medusa_choices=envelope.as_lists())


def per_step_at(dyn: tuple | None, batch_tokens_per_step, b: int) -> tuple | None:
    """`dynamic_candidates`' per-step trees at batch b with their own surface, as `rank(*...)` and `choose` take them:
    (candidates, seconds, spread, head_cost); None without per-step trees."""
    if dyn is None:
        return None
    return (at_batch(dyn[0], batch_tokens_per_step, b), *(dyn[1][b][k] for k in ("seconds", "spread", "head_cost")))


def equal_budgets(source: dict, latency_path, batch_sizes, context: int | None = None) -> tuple[list[dict], dict | None]:
    """Static or per-step at budget N, as the plan prices them: per batch size and every N the table timed per-step
    trees at, the optimal static tree of N nodes and the per-step tree of N nodes, each with its tokens/step (and
    the batch's), its step's cost over plain's and its speedup and range, priced on its own rows; and what
    `dynamic_candidates` says of them (None: the table has no per-step rows; "weighed" false: why not)."""
    batch_sizes = sorted({int(b) for b in batch_sizes})
    df = read_latency(latency_path)
    surface, ctx = latency_surface(df, batch_sizes, context, source["typical_context"], f"--latency {latency_path}")
    dyn, info = dynamic_candidates(source, latency_path, batch_sizes, ctx)
    if dyn is None:
        return [], info
    top = max(c["nodes"] for c in dyn[0])
    static = candidates(source["tokens_per_step"], [], top, source["value"], source["max_depth"], source["max_rank"])
    rows = []
    for b in batch_sizes:
        per_step = rank(*per_step_at(dyn, source["batch_tokens_per_step"], b))
        fixed = {c["nodes"]: c for c in rank(at_batch(static, source["batch_tokens_per_step"], b),
                                             surface[b]["seconds"], surface[b]["spread"], surface[b]["head_cost"])
                 if c["kind"] != "none"}
        for d in sorted(per_step, key=lambda c: c["nodes"]):
            for kind, c in (("static", fixed.get(d["nodes"])), ("per-step", d)):
                if c is not None:
                    rows.append(dict(batch_size=b, nodes=d["nodes"], kind=kind, tree=c["tree"].name,
                                     tokens_per_step=c["tokens_per_step"],
                                     batch_tokens_per_step=c["batch_tokens_per_step"],
                                     step_ratio=c["batch_tokens_per_step"] / c["speedup"], speedup=c["speedup"],
                                     range=list(c["range"]) if c["range"] else None))
    return rows, info


def chain_rows(ranked: list[dict]) -> list[dict]:
    """Every chain (and none, k = 0) weighed at one batch size, by K: what an engine that drafts chains can be
    asked for, each with the plan's prediction (what `vllm-check --plan` measures beside it)."""
    rows = [dict(k=c["nodes"], predicted_tokens_per_step=c["tokens_per_step"],
                 predicted_batch_tokens_per_step=c.get("batch_tokens_per_step", c["tokens_per_step"]),
                 predicted_speedup=c["speedup"], speedup_range=list(c["range"]) if c["range"] else None)
            for c in ranked if c["kind"] in ("chain", "none")]
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
