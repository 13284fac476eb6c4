"""Optimal Medusa trees under the independent-heads acceptance model.

Model: head k's i-th guess is right with probability a_k^(i) (top-i minus top-(i-1) accuracy), independently
across heads, so node (i_1, ..., i_d) is accepted with probability prod_j a_j^(i_j) and a tree yields
1 + sum over its nodes of that product tokens per step (the 1 is the base model's own token).

Because a child's value never exceeds its parent's, the n best nodes always form a tree: best-first growth from
the root (a heap over ALL children of chosen nodes, not only next-sibling / first-child as in Medusa's script)
is optimal for every budget at once. The core takes any monotone `value(path)`, so empirical joint path
probabilities (calibration) plug in unchanged.

Accuracy tables: acc[K, R] float, row k-1 = head k, column i = 0-based rank i (read, written and checked by
accuracies.py).
"""
from __future__ import annotations

import heapq
import math
from itertools import product
from typing import Callable, Mapping

import numpy as np

from workbench import WorkbenchError
from workbench.trees.accuracies import check_accuracies
from workbench.trees.tree import RankPath, Tree, make_tree

ValueFn = Callable[[RankPath], float]


# ----------------------------------------------------------------------------------------------- the model

def acc_value_fn(acc) -> ValueFn:
    """value(path) = prod_j acc[j, i_j]: the acceptance probability of a node under independent heads."""
    rows = check_accuracies(acc).tolist()  # python floats: ~10x faster than numpy scalars in the heap loop

    def value(path: RankPath) -> float:
        v = 1.0
        for d, r in enumerate(path):
            v *= rows[d][r]
        return v

    return value


def empirical_value_fn(probs: Mapping) -> ValueFn:
    """value(path) from measured joint path probabilities {path: p}; paths never seen are worth 0."""
    table = {tuple(p): float(v) for p, v in probs.items()}
    return lambda path: table.get(tuple(path), 0.0)


def chain_value_fn(rates) -> ValueFn:
    """The path values of a per-position acceptance vector: rates[k - 1] for the top-1 chain's path of k, 0 off it
    (a chain drafter proposes nothing else)."""
    return lambda path: rates[len(path) - 1] if len(path) <= len(rates) and not any(path) else 0.0


def chain_values(fn: ValueFn, depth: int) -> list[float]:
    """Per-position acceptance of the top-1 chain (the value of [0] * k), up to the last positive one."""
    out = []
    for k in range(1, depth + 1):
        v = float(fn((0,) * k))
        if v <= 0:
            break
        out.append(min(v, 1.0))
    return out


def expected_length(tree, value) -> float:
    """Expected tokens per step: 1 + sum of node values. `value` is acc[K, R] or a value function."""
    fn = value if callable(value) else acc_value_fn(value)
    paths = tree.paths if isinstance(tree, Tree) else [tuple(p) for p in tree]
    return 1.0 + math.fsum(fn(p) for p in paths)


# ----------------------------------------------------------------------------------------------- optimizer

def best_first(value_fn: ValueFn, budget: int, max_depth: int, max_rank: int,
               first_level: int | None = None) -> list[tuple[RankPath, float]]:
    """The `budget` most valuable nodes in best-first order, each with its value; prefix n = optimal n-node tree.

    Ties go to the shallower, then lexicographically smaller path, so results are deterministic. Stops early
    when no remaining node has positive value (adding it costs verify time and gains nothing). With
    first_level=k the first level is exactly ranks 0..k-1 (emitted first, counted in the budget, kept even at
    value 0) and growth continues below them only: the greedy argument still holds below a fixed first level.
    """
    for name, v in (("budget", budget), ("max_depth", max_depth), ("max_rank", max_rank)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
            raise WorkbenchError(f"{name} must be a positive integer, got {v!r}")
    frontier: list[tuple[float, int, RankPath]] = []

    def value(path: RankPath, parent_value: float) -> float:
        v = float(value_fn(path))
        if not (v >= 0.0) or v > parent_value * (1 + 1e-9) + 1e-12:  # also catches NaN
            raise WorkbenchError(
                f"path value function is not monotone at {list(path)}: value {v!r} vs parent {parent_value!r} "
                "(needs 0 <= child <= parent, e.g. joint acceptance probabilities)")
        return v

    def push_children(path: RankPath, v: float) -> None:
        if len(path) < max_depth:
            for r in range(max_rank):
                heapq.heappush(frontier, (-value(path + (r,), v), len(path) + 1, path + (r,)))

    out: list[tuple[RankPath, float]] = []
    if first_level is None:
        push_children((), 1.0)
    else:
        for r in range(min(first_level, max_rank, budget)):
            out.append(((r,), value((r,), 1.0)))
            push_children(*out[-1])
    while frontier and len(out) < budget:
        neg, _, path = heapq.heappop(frontier)
        if neg >= 0.0:  # best remaining value is 0
            break
        out.append((path, -neg))
        push_children(path, -neg)
    return out


def optimal_tree_from(value_fn: ValueFn, budget: int, max_depth: int, max_rank: int, name: str = "",
                      contiguous_first_level: bool = False) -> Tree:
    """Max-value tree with at most `budget` nodes, depth <= max_depth and ranks < max_rank, in greedy order.

    contiguous_first_level: the best tree whose first level is exactly ranks 0..k-1 for some k, the shape
    TensorRT-LLM's Python runtime assumes; exact, as the best over k of (first level 0..k-1 + greedy below).
    """
    if contiguous_first_level:
        best, best_value = None, -1.0
        for k in range(1, min(budget, max_rank) + 1):  # ties keep the smaller first level
            nodes = best_first(value_fn, budget, max_depth, max_rank, first_level=k)
            total = math.fsum(v for _, v in nodes)
            if total > best_value * (1 + 1e-12) + 1e-15:
                best, best_value = nodes, total
        nodes = best if best_value > 0 else []
    else:
        nodes = best_first(value_fn, budget, max_depth, max_rank)
    if not nodes:
        raise WorkbenchError("no node has a positive acceptance probability: nothing to build a tree from "
                             "(are the accuracies all zero?)")
    return make_tree([p for p, _ in nodes], name=name)


def _limits(acc: np.ndarray, max_depth: int | None, max_rank: int | None) -> tuple[int, int]:
    k, r = acc.shape
    if max_depth is not None and max_depth > k:
        raise WorkbenchError(f"max depth {max_depth} exceeds the {k} heads in the accuracy table "
                             "(head k guesses depth k)")
    if max_rank is not None and max_rank > r:
        raise WorkbenchError(f"max rank {max_rank} exceeds the {r} ranks in the accuracy table")
    return (k if max_depth is None else max_depth), (r if max_rank is None else max_rank)


def value_and_limits(value, max_depth: int | None = None, max_rank: int | None = None, what: str = "the optimizer",
                     fallback: tuple[int, int] | None = None) -> tuple[ValueFn, int, int]:
    """What the optimizer takes, from either kind of objective: (value function, max depth, max rank). `value` is
    acc[K, R] (limits default to its shape and may not exceed it) or a monotone path-value function such as
    Calibration.joint_value (limits required, or taken from `fallback`)."""
    if callable(value):
        max_depth, max_rank = (max_depth or (fallback or (None, None))[0]), (max_rank or (fallback or (None, None))[1])
        if max_depth is None or max_rank is None:
            raise WorkbenchError(f"{what} with a value function needs max_depth and max_rank")
        return value, max_depth, max_rank
    a = check_accuracies(value)
    return (acc_value_fn(a), *_limits(a, max_depth, max_rank))


def optimal_tree(value, budget: int, max_depth: int | None = None, max_rank: int | None = None,
                 name: str = "", contiguous_first_level: bool = False) -> Tree:
    """Optimal tree for accuracies acc[K, R] (max_depth defaults to K, max_rank, ranks < it, to R) or for a
    path-value function (both limits required)."""
    fn, d, r = value_and_limits(value, max_depth, max_rank, "optimal_tree")
    return optimal_tree_from(fn, budget, d, r, name=name, contiguous_first_level=contiguous_first_level)


def dense_tree(sizes) -> Tree:
    """Cartesian tree (Medusa paper sec. 2.1.2): every path whose rank at depth d is < sizes[d-1]."""
    sizes = list(sizes)
    if not sizes or not all(isinstance(s, (int, np.integer)) and not isinstance(s, bool) and s >= 1 for s in sizes):
        raise WorkbenchError(f"dense tree sizes must be positive integers like 4,3,2, got {sizes!r}")
    paths = [p for d in range(1, len(sizes) + 1) for p in product(*(range(s) for s in sizes[:d]))]
    return make_tree(paths, name="dense_" + "x".join(map(str, sizes)))


def dense_nodes(s: int, depth: int) -> int:
    """Node count of the Cartesian tree [s] * depth: s + s^2 + ... + s^depth."""
    return sum(s ** j for j in range(1, depth + 1))


def best_dense_tree(value, budget: int, max_depth: int | None = None, max_rank: int | None = None) -> Tree:
    """The best dense tree (sizes c_1, c_2, ... per level, any mix) with at most `budget` nodes: the only shape in
    which every node of a level has the same children, ranks 0..c-1, as vLLM's tree drafter drafts them.

    `value` is acc[K, R] (limits default to its shape) or a value function (then both limits are required).
    Exact: every size vector within the budget is tried, each level's value summed once per prefix of sizes.
    Ties keep fewer nodes.
    """
    fn, d, r = value_and_limits(value, max_depth, max_rank, "best_dense_tree")
    best: list = [(-1.0, 0), None]  # (value, -nodes), sizes

    def walk(sizes: list[int], level: list[RankPath], nodes: int, total: float) -> None:
        if sizes and (total, -nodes) > best[0]:
            best[:] = [(total, -nodes), list(sizes)]
        if len(sizes) == d:
            return
        for c in range(1, r + 1):
            if nodes + len(level) * c > budget:
                break
            nxt = [p + (i,) for p in level for i in range(c)]
            walk(sizes + [c], nxt, nodes + len(nxt), total + math.fsum(fn(p) for p in nxt))

    walk([], [()], 0, 0.0)
    if best[1] is None or best[0][0] <= 0:
        raise WorkbenchError("no dense tree has a positive acceptance probability within the budget")
    return dense_tree(best[1])


def best_by(score, tree: Tree, budget: int, max_depth: int, max_rank: int) -> Tree:
    """`tree` or a dense tree of at most `budget` nodes, whichever `score` (e.g. a greedy decoder replayed over
    calibration answers) rates higher; ties keep `tree`. The exact optimum maximises the paper's mean over every
    position, while a decoder only visits the positions a step starts at: near-equal candidates can swap order."""
    best, best_score = tree, score(tree)
    for d in range(1, max_depth + 1):
        for s in range(1, max_rank + 1):
            if dense_nodes(s, d) <= budget:
                t = dense_tree([s] * d)
                v = score(t)
                if v > best_score:
                    best, best_score = t, v
    return best if best is tree else Tree(best.paths, tree.name)


def expected_curve(value, max_budget: int, max_depth: int | None = None,
                   max_rank: int | None = None) -> np.ndarray:
    """curve[n] = expected length of the optimal n-node tree, n = 0..max_budget (one greedy run gives all).

    `value` is acc[K, R] (depth/rank limits default to its shape) or a value function (then both limits are
    required). Past the last positive-value node the curve stays flat.
    """
    fn, d, r = value_and_limits(value, max_depth, max_rank, "expected_curve")
    gains = [v for _, v in best_first(fn, max_budget, d, r)]
    curve = np.ones(max_budget + 1)
    curve[1:len(gains) + 1] += np.cumsum(gains)
    curve[len(gains) + 1:] = curve[len(gains)]
    return curve
