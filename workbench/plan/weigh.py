"""The one weighing behind every answer: a source's candidates, those the engine serves, their tokens/step at one batch
size, priced on the latency surface there and ranked: `weigh(source, surface, batch, context) -> Choice`.

`workbench plan` (rank.make_plan), `optimize --latency` and the designer (fastest.fastest), the recommendation
(recommend.recommend), the trade-offs page and the static-vs-per-step comparison (rank.equal_budgets) all ask it,
so for the same source and table they name the same candidate with the same speedup. The candidates:
  none     no speculation, speedup 1 by definition;
  chain    the top-1 chain [[0], [0, 0], ...] of every length up to the number of heads whose last position is ever
           accepted: what vLLM's Medusa drafter runs;
  tree     the optimal tree at every budget the surface covers (each prefix of one optimize.best_first run is the
           optimal tree of that size; a tree that is a chain counts as the chain);
  dynamic  where the table timed per-step trees (`latency --envelope`) and the source replays them (a calibration
           with topk.parquet), the per-step tree of N nodes chosen from an envelope of the size the table timed (the
           source's optimal tree of that size), at every N timed, priced on its own rows. Only our decoder runs it.
Each candidate's speedup is speed.priced's; the ranking is exact, ties going to the simpler kind (none, then chain,
then tree) and then to fewer nodes. Where the fastest speculating candidate's predicted range overlaps no
speculation's (the surface's own spread cannot tell them apart), the `noise` rule (NOISE_RULES) decides: "fastest"
keeps the ranking (the choice is flagged within noise), "none" answers no speculation, the fastest set aside: a gain
the surface cannot resolve is no reason to speculate (n-gram on Alpaca-eval: every K within +-2% of plain in vLLM).
"""
from __future__ import annotations

from dataclasses import dataclass

from workbench import WorkbenchError
from workbench.core.notes import FieldError
from workbench.core.speed import max_tokens, within_noise
from workbench.plan.source import Source
from workbench.plan.surface import At, Surface
from workbench.trees.dynamic import DynamicPolicy
from workbench.trees.optimize import best_first, value_and_limits
from workbench.trees.tree import Tree, chain_tree, is_chain, make_tree

SIMPLER = {"none": 2, "chain": 1, "tree": 0, "dynamic": -1}  # tie-break: the simpler setting wins an exact tie
NOISE_RULES = ("fastest", "none")  # a choice within the latency noise of no speculation: keep it, or answer none


@dataclass(frozen=True)
class Candidate:
    """One setting weighed at one batch size: its kind (SIMPLER's keys), tree (None for no speculation; a
    DynamicPolicy for a per-step tree), nodes, each sequence's and the batch's tokens/step, and its price: speedup,
    range (over the latency quartiles, None without them) and relative_latency (its step over a plain one)."""

    kind: str
    tree: Tree | DynamicPolicy | None
    nodes: int
    tokens_per_step: float
    batch_tokens_per_step: float
    speedup: float
    range: tuple[float, float] | None
    relative_latency: float

    @property
    def medusa_choices(self) -> list:
        """Its tree's medusa_choices; a per-step tree's envelope's (the nodes it chooses from); [] for none."""
        tree = self.tree.envelope if isinstance(self.tree, DynamicPolicy) else self.tree
        return tree.as_lists() if tree is not None else []


@dataclass(frozen=True)
class Choice:
    """`weigh`'s answer at one batch size and context: every candidate ranked, best first; the best; the runner-up
    (the best of another kind, or None) and whether the two are within the latency noise; the best chain (or none);
    and what was weighed of per-step trees (None: the table timed none; "weighed" false: why not)."""

    batch: int
    context: int
    ranked: list[Candidate]
    dynamic: dict | None
    set_aside: Candidate | None = None  # the fastest, where the "none" noise rule answered no speculation instead

    @property
    def best(self) -> Candidate:
        return self.ranked[0]

    @property
    def runner_up(self) -> Candidate | None:
        return next((c for c in self.ranked if c.kind != self.best.kind), None)

    @property
    def within_noise(self) -> bool | None:
        runner = self.runner_up
        return within_noise(self.best.range, runner.range) if runner else None

    @property
    def best_chain(self) -> Candidate:
        return next(c for c in self.ranked if c.kind in ("chain", "none"))

    @property
    def tree(self) -> Candidate | None:
        """The best candidate that speculates (the choice, or its best speculating runner-up), None if none can."""
        return next((c for c in self.ranked if c.tree is not None), None)


def _key(c: Candidate) -> tuple:
    return c.speedup, SIMPLER[c.kind], -c.nodes


def noise_none(ranked: list[Candidate]) -> bool:
    """Whether the fastest candidate speculates and its predicted speedup range overlaps no speculation's: the
    latency's spread cannot tell the two apart. False where either range is unknown (a table without quartiles)."""
    none = next((c for c in ranked if c.kind == "none"), None)
    return bool(ranked and none is not None and ranked[0].kind != "none" and within_noise(ranked[0].range, none.range))


def ruled(ranked: list[Candidate], noise: str) -> tuple[list[Candidate], Candidate | None]:
    """The ranking under the noise rule (NOISE_RULES) and the candidate it set aside (None: the ranking stands)."""
    if noise not in NOISE_RULES:
        raise FieldError("within_noise", "unknown", f"{{field}} {noise!r}: use {' or '.join(NOISE_RULES)}")
    if noise == "none" and noise_none(ranked):
        return [c for c in ranked if c.kind == "none"] + [c for c in ranked if c.kind != "none"], ranked[0]
    return ranked, None


def price(source: Source, at: At, tree, kind: str | None = None) -> Candidate:
    """One tree (None: no speculation) priced at `at` from `source`: the batch's tokens/step over its step's cost
    at its own depth."""
    if tree is None:
        fast, rng, rel = at.price(1.0, 0, None)
        return Candidate("none", None, 0, 1.0, 1.0, fast, rng, rel)
    kind = kind or ("dynamic" if isinstance(tree, DynamicPolicy) else "chain" if is_chain(tree) else "tree")
    nodes = tree.nodes
    batched = float(source.predict_batch(tree, at.batch, at.cost()))
    fast, rng, rel = at.price(batched, nodes, tree.depth)
    return Candidate(kind, tree, nodes, source.predict(tree), batched, fast, rng, rel)


def _static(source: Source, top: int, chains: bool) -> list[tuple[str, Tree | None]]:
    """(kind, tree) of no speculation, the top-1 chains (with `chains`) and the optimal tree at every budget up to
    `top` nodes, distinct shapes (a tree that is a chain counts as the chain)."""
    out: list = [("none", None)]
    seen = set()
    for k in range(1, min(len(source.chain_acceptance) if chains else 0, top) + 1):
        t = chain_tree(k)
        seen.add(t.paths)
        out.append(("chain", t))
    if source.value is not None and top >= 1:
        fn, depth, rank = value_and_limits(source.value, source.max_depth, source.max_rank, "the planner")
        order = [p for p, _ in best_first(fn, top, depth, rank)]
        for n in range(1, len(order) + 1):
            t = make_tree(order[:n], name=f"optimal_{n}")
            if t.paths not in seen:
                seen.add(t.paths)
                out.append(("chain" if is_chain(t) else "tree", t))
    return out


def _per_step(source: Source, surface: Surface, batch: int, context: int, among) -> tuple[list, dict | None]:
    """The per-step candidates at `batch` priced on their own rows, and what a plan records of them (the envelope's
    nodes and medusa_choices, or why none was weighed); ([], None) for a table without per-step rows."""
    if surface.dynamic is None:
        return [], None
    m = surface.envelope
    try:
        rows = surface.per_step(among, context)
        if source.info.get("prediction") != "predicted_replay":
            raise FieldError("prediction", "per_step_replay", "a per-step tree is predicted only by a "
                             "calibration's replay (its heads' recorded log-probs), not by an accuracy table, an "
                             "acceptance vector or {field} joint")
        fn, depth, rank = value_and_limits(source.value, source.max_depth, source.max_rank, "the planner")
        envelope = make_tree([p for p, _ in best_first(fn, m, depth, rank)], name=f"envelope_{m}")
        sizes = sorted(set.intersection(*(set(s.measured) for s in rows.values())) - {1})
        trees = [DynamicPolicy(n - 1, envelope) for n in sizes if n - 1 <= envelope.nodes]
        for t in trees:
            source.predict(t)
    except WorkbenchError as e:  # e.g. a calibration without topk.parquet: static candidates only, and why
        return [], dict(envelope=m, weighed=False, why=str(e))
    return [price(source, rows[batch], t) for t in trees], dict(envelope=m, weighed=True, medusa_choices=envelope.as_lists())


def weigh(source: Source, surface: Surface, batch: int, context: int, max_nodes: int | None = None,
          chains: bool = True, dynamic: bool = False, among=None, noise: str = "fastest") -> Choice:
    """Every candidate of `source` that the surface's engine serves at `batch` sequences and `context`, priced and
    ranked: the one weighing. `max_nodes` caps the static trees (default: all the table covers); `chains` False
    leaves the chains out (each optimal prefix is weighed as itself); `dynamic` adds the per-step trees the table
    timed. `among`: the batch sizes asked together (default this one): a token count the engine cannot price
    untimed, and a per-step size, must be timed at each of them, so a plan names the same drafts at every one.
    `noise`: what a choice within the latency noise of no speculation becomes (NOISE_RULES, module docstring)."""
    among = sorted({int(b) for b in (among or [batch])})
    at = surface.at(batch, context)
    top = max_tokens(at.seconds) - 1
    top = top if max_nodes is None else min(top, max_nodes)
    timed = set.intersection(*(set(surface.at(b, context).measured) for b in among))
    ranked = [price(source, at, t, kind) for kind, t in _static(source, top, chains)
              if at.serving.serves(kind, 0 if t is None else t.nodes, timed)]
    info = None
    if dynamic:
        per_step, info = _per_step(source, surface, batch, context, among)
        ranked += per_step
    ranked, aside = ruled(sorted(ranked, key=_key, reverse=True), noise)
    return Choice(batch, context, ranked, info, aside)
