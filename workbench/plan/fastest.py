"""The fastest tree at one batch size, by plan's ranking: what `optimize --latency`, the designer's hardware-aware
model and the trade-offs page's "best" picks show.

There is one ranker (rank.py: `candidates`, `at_batch`, `choose`); this module only asks it about one batch size
and a node cap, from a plan source (rank.plan_source, or `value_source` for path values the app optimizes for). So
for the same source and latency rows `optimize --latency` names the tree `workbench plan` weighs at that batch
size: its choice when that is a tree or chain, else (no speculation wins) its best speculating runner-up.
"""
from __future__ import annotations

from workbench import WorkbenchError
from workbench.core.speed import max_tokens
from workbench.plan.rank import at_batch, candidates, choose, rank, served
from workbench.plan.source import chain_values
from workbench.trees.optimize import expected_length, value_and_limits


def value_source(value, max_depth: int | None = None, max_rank: int | None = None) -> dict:
    """A plan source (rank.plan_source's keys the ranking reads) of path values: acc[K, R] (independent heads) or a
    monotone path-value function such as Calibration.joint_value (then both limits). Tokens/step:
    optimize.expected_length; no answers, so a batch's tokens/step is the mean's."""
    fn, depth, ranks = value_and_limits(value, max_depth, max_rank, "the ranking")
    return dict(tokens_per_step=lambda t: expected_length(t, fn),
                batch_tokens_per_step=lambda t, b, cost=None: expected_length(t, fn),
                value=fn, max_depth=depth, max_rank=ranks, chain_acceptance=chain_values(fn, depth))


def limited(source: dict, max_depth: int | None = None, max_rank: int | None = None) -> dict:
    """The source with tighter depth / rank limits (a chain deeper than max_depth is no candidate either)."""
    depth = min(source["max_depth"], max_depth or source["max_depth"])
    return source | dict(max_depth=depth, max_rank=min(source["max_rank"], max_rank or source["max_rank"]),
                         chain_acceptance=source["chain_acceptance"][:depth])


def fastest(source: dict, latency: dict, spread=None, head_cost: dict | None = None, batch: int = 1,
            max_nodes: int | None = None, curve: bool = False, engine: str = "workbench",
            tail: dict | None = None) -> dict:
    """plan's ranking at one batch size ({tokens: seconds}, its quartiles `spread` and the heads' cost `head_cost`, as
    latency_file.latency_surface gives them), over candidates of at most `max_nodes` nodes (default: all the table
    covers): {"choice": rank.choose's dict, "best": its best candidate, "tree": the best tree or chain (the choice,
    or the runner-up when no speculation wins), "curve": with `curve`, the optimal tree at every budget ranked the
    same way, by node count}. Each candidate has "relative_latency" (its step cost over t(B, 1)). `engine` is whose
    steps the table timed (latency_file.latency_engine): on vLLM's rounds only what vLLM serves is a candidate
    (rank.served: a top-1 chain of each K it timed, or none), and the curve is its chains; `tail` prices a batch's
    last rounds there (rank.tail_surface)."""
    top = max_tokens(latency) - 1
    if max_nodes is not None:
        top = min(top, max_nodes)
    if top < 1:
        raise WorkbenchError("the latency table covers no tree: measure at least 2 tokens (1 node + the root)")

    def weighed(chains):
        cands = candidates(source["tokens_per_step"], chains, top, source["value"], source["max_depth"],
                           source["max_rank"])
        return at_batch(served(cands, engine, latency), source["batch_tokens_per_step"], batch, tail)

    pick = choose(weighed(source["chain_acceptance"]), latency, spread, head_cost)
    for c in pick["ranked"]:
        c["relative_latency"] = c["batch_tokens_per_step"] / c["speedup"]
    tree = next((c for c in pick["ranked"] if c["tree"] is not None), None)
    if tree is None:
        raise WorkbenchError("no tree has a positive acceptance probability: every head's first guess is never right")
    out = dict(choice=pick, best=pick["best"], tree=tree)
    if curve:  # on our decoder no chains first (each optimal prefix is weighed as itself); on vLLM its chains
        drawn = weighed([] if engine == "workbench" else source["chain_acceptance"])
        out["curve"] = sorted(({**c, "relative_latency": c["batch_tokens_per_step"] / c["speedup"]}
                               for c in rank(drawn, latency, spread, head_cost) if c["tree"] is not None),
                              key=lambda c: c["nodes"])
    return out
