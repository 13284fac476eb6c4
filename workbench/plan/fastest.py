"""The fastest tree at one batch size, by plan's weighing: what `optimize --latency`, the designer's hardware-aware
model and the trade-offs page's "best" picks show.

There is one weighing (weigh.weigh); this module only asks it about one batch size and a node cap, from a plan
source (source.plan_source, or `value_source` for path values the app optimizes for). So for the same source and
latency rows `optimize --latency` names the tree `workbench plan` weighs at that batch size: its choice when that is
a tree or chain, else (no speculation wins) its best speculating runner-up.
"""
from __future__ import annotations

from workbench import WorkbenchError
from workbench.core.speed import max_tokens
from workbench.plan.source import Source, ValueSource
from workbench.plan.surface import At, Surface
from workbench.plan.weigh import Choice, weigh


def value_source(value, max_depth: int | None = None, max_rank: int | None = None) -> Source:
    """A Source of path values: acc[K, R] (independent heads) or a monotone path-value function such as
    Calibration.joint_value (then both limits)."""
    return ValueSource(value, max_depth, max_rank)


def fastest(source: Source, surface: Surface, at: At, max_nodes: int | None = None, curve: bool = False) -> dict:
    """plan's weighing at `at`'s batch size and context, over candidates of at most `max_nodes` nodes (default: all
    the table covers): {"choice": weigh's Choice, "best": its best candidate, "tree": the best tree or chain (the
    choice, or the runner-up when no speculation wins), "curve": with `curve`, the optimal tree at every budget
    weighed the same way, by node count (on an engine that drafts chains only, its chains)}."""
    top = max_tokens(at.seconds) - 1
    if max_nodes is not None:
        top = min(top, max_nodes)
    if top < 1:
        raise WorkbenchError("the latency table covers no tree: measure at least 2 tokens (1 node + the root)")
    pick: Choice = weigh(source, surface, at.batch, at.context, top)
    if pick.tree is None:
        raise WorkbenchError("no tree has a positive acceptance probability: every head's first guess is never right")
    out = dict(choice=pick, best=pick.best, tree=pick.tree)
    if curve:  # on our decoder no chains first (each optimal prefix is weighed as itself); on vLLM its chains
        drawn = weigh(source, surface, at.batch, at.context, top, chains=not at.serving.trees)
        out["curve"] = sorted((c for c in drawn.ranked if c.tree is not None), key=lambda c: c.nodes)
    return out
