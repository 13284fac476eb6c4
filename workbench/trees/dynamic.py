"""A per-step tree: each step keeps the N nodes of highest path score, the sum of the heads' log-probabilities along
the path, out of a bounded candidate grid (the envelope, a static tree of M >= N nodes). This module is the rule's
reference (numpy): the calibration's replay predicts a dynamic policy's tokens/step with it, and the decoder's
on-device selection must pick the same nodes (tests compare them).

Why the top N are a tree: a child's score is its parent's plus a log-probability <= 0, so it never beats its parent;
ties are broken by the envelope's node order (Medusa's: by depth, then rank path), parents first, with a stable
sort. Scores are accumulated depth by depth (score[child] = score[parent] + logp) so that any implementation
adds the same float32 numbers in the same order.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workbench import WorkbenchError
from workbench.trees.tree import Tree


@dataclass(frozen=True)
class DynamicPolicy:
    """N nodes per step chosen from `envelope` (prefix-closed, its nodes in Medusa's order)."""

    nodes: int
    envelope: Tree

    def __post_init__(self):
        if not 1 <= self.nodes <= self.envelope.nodes:
            raise WorkbenchError(f"a dynamic tree of {self.nodes} nodes needs an envelope of at least as many "
                                 f"nodes, this one has {self.envelope.nodes}: pass a larger envelope")

    @property
    def name(self) -> str:
        return f"dynamic_{self.nodes}_of_{self.envelope.nodes}"

    @property
    def depth(self) -> int:
        return self.envelope.depth

    @property
    def topk(self) -> int:
        return self.envelope.max_rank + 1

    def grid(self) -> dict[str, np.ndarray]:
        """The envelope as arrays, node i = sorted_paths[i]: parent [M] (-1 for depth 1), depth [M] (1-based), rank
        [M], child [M + 1, topk] (node index + 1 of each child, 0 = none; row 0 is the root)."""
        order = self.envelope.sorted_paths
        index = {p: i for i, p in enumerate(order)}
        parent = np.array([index.get(p[:-1], -1) for p in order], dtype=np.int64)
        depth = np.array([len(p) for p in order], dtype=np.int64)
        rank = np.array([p[-1] for p in order], dtype=np.int64)
        child = np.zeros((len(order) + 1, self.topk), dtype=np.int64)
        child[parent + 1, rank] = np.arange(1, len(order) + 1)
        return dict(parent=parent, depth=depth, rank=rank, child=child)


def path_scores(policy: DynamicPolicy, logp: np.ndarray) -> np.ndarray:
    """[P, M] float32 path score of every envelope node at each of P positions, from the heads' top-k log-probs
    logp [P, K, k] (k >= the envelope's top-k, K >= its depth)."""
    g = policy.grid()
    P, K, k = logp.shape
    if K < policy.depth or k < policy.topk:
        raise WorkbenchError(f"the heads' log-probs cover {K} heads x top-{k}; the envelope needs {policy.depth} x "
                             f"top-{policy.topk}")
    own = logp[:, g["depth"] - 1, g["rank"]].astype(np.float32)  # [P, M]
    score = np.zeros_like(own)
    for d in range(1, policy.depth + 1):  # parents first: score[child] = score[parent] + logp(child)
        at = g["depth"] == d
        base = score[:, g["parent"][at]] if d > 1 else np.zeros((P, int(at.sum())), np.float32)
        score[:, at] = base + own[:, at]
    return score


def select(policy: DynamicPolicy, logp: np.ndarray) -> np.ndarray:
    """[P, N] envelope node indices of each position's tree, best first (parents before children)."""
    order = np.argsort(-path_scores(policy, logp), axis=1, kind="stable")
    return order[:, :policy.nodes]


def accepted_depths(policy: DynamicPolicy, logp: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    """[P] nodes a greedy step accepts at each position: the longest prefix of the true tokens' rank path (ranks
    [P, K], -1 = not in a head's top-k) that the position's own tree holds."""
    g = policy.grid()
    P = len(ranks)
    chosen = np.zeros((P, policy.envelope.nodes + 1), dtype=bool)  # [P, M+1], column 0 = the root
    np.put_along_axis(chosen, select(policy, logp) + 1, True, axis=1)
    node = np.zeros(P, dtype=np.int64)
    depth = np.zeros(P, dtype=np.int64)
    alive = np.ones(P, dtype=bool)
    for d in range(min(policy.depth, ranks.shape[1])):
        r = ranks[:, d]
        ok = alive & (r >= 0) & (r < policy.topk)
        nxt = np.where(ok, g["child"][node, np.where(ok, r, 0)], 0)
        alive = (nxt > 0) & chosen[np.arange(P), nxt]
        node = np.where(alive, nxt, 0)
        depth += alive
    return depth
