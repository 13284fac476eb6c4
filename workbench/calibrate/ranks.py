"""What a ranks frame says (the table calibrate/run.py measures and folder.py stores as ranks.parquet: prompt_id,
position, head_1..head_K, the 0-based rank of the true token in head k's top-k, -1 when absent, null past the end):
each head's accuracy a_k^(i), the joint path frequencies, and a greedy decoder replayed over the answers, alone or
B side by side. Torch-free; folder.Calibration asks these questions of its splits.
"""
from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

from workbench import WorkbenchError
from workbench.trees import dynamic
from workbench.trees.dynamic import DynamicPolicy

NULL = -2  # in-memory marker for "target past the end of the continuation" (null in ranks.parquet)


def ranks_frame(prompt_ids: list[str], ranks: list[np.ndarray], num_heads: int) -> pd.DataFrame:
    """Long table: prompt_id, position, head_1..head_K (nullable Int16: rank, -1, or <NA> past the end)."""
    cols = {"prompt_id": pd.array([pid for pid, r in zip(prompt_ids, ranks) for _ in range(len(r))], dtype="string"),
            "position": pd.array(np.concatenate([np.arange(len(r)) for r in ranks]) if ranks else [], dtype="Int32")}
    mat = np.concatenate(ranks) if ranks else np.zeros((0, num_heads), dtype=np.int16)
    for k in range(num_heads):
        cols[f"head_{k + 1}"] = pd.array(mat[:, k], dtype="Int16", copy=True)
        cols[f"head_{k + 1}"][mat[:, k] == NULL] = pd.NA
    return pd.DataFrame(cols)


def head_columns(ranks: pd.DataFrame) -> list[str]:
    cols = [c for c in ranks.columns if re.fullmatch(r"head_\d+", c)]
    return sorted(cols, key=lambda c: int(c[5:]))


def rank_matrix(ranks: pd.DataFrame) -> np.ndarray:
    """[positions, K] int64 with -1 for a miss and NULL for past the end."""
    return ranks[head_columns(ranks)].fillna(NULL).to_numpy(dtype=np.int64)


def head_accuracies(ranks: pd.DataFrame, topk: int) -> tuple[np.ndarray, np.ndarray]:
    """a_k^(i): share of head k's positions (those with a target) where its rank-i guess is the true token.

    Returns (acc [K, topk], counts [K] = positions with a target per head), the canonical CSV's columns.
    """
    mat = rank_matrix(ranks)
    K = mat.shape[1]
    counts = (mat != NULL).sum(0)
    hits = np.stack([np.bincount(mat[:, k][mat[:, k] >= 0], minlength=topk)[:topk] for k in range(K)])
    return hits / np.maximum(counts, 1)[:, None], counts


def path_probabilities(ranks: pd.DataFrame) -> dict[tuple[int, ...], float]:
    """P(path [i1..id] is accepted) = share of ALL positions whose rank sequence starts with it (no independence
    assumption). Past-the-end counts as a miss: the decoder cannot accept tokens the answer does not have."""
    mat = rank_matrix(ranks)
    M = len(mat)
    if M == 0:
        return {}
    probs = {}
    alive = np.ones(M, dtype=bool)
    for d in range(mat.shape[1]):
        alive &= mat[:, d] >= 0
        if not alive.any():
            break
        keys, counts = np.unique(mat[alive, :d + 1], axis=0, return_counts=True)
        probs.update({tuple(int(x) for x in key): n / M for key, n in zip(keys, counts)})
    return probs


def measured_acceptance(tree, ranks: pd.DataFrame) -> float:
    """Mean over positions of 1 + number of tree nodes accepted there (= longest accepted prefix)."""
    mat = rank_matrix(ranks)
    if len(mat) == 0:
        raise WorkbenchError("no positions to measure on (empty calibration data)")
    return int((1 + accepted_depths(tree, mat)).sum()) / len(mat)


def decoder_walk(tree, ranks: pd.DataFrame) -> float:
    """Tokens per step a live greedy decoder with this tree would measure on these answers: per prompt, start at
    position 0, accept the longest tree prefix of the rank sequence, jump past it; total tokens / total steps.
    Differs from measured_acceptance (the mean over ALL positions) only by which positions get visited."""
    return walk_answers(tree, answer_rows(ranks))


def answer_rows(ranks: pd.DataFrame, logp: np.ndarray | None = None) -> tuple:
    """Every prompt's rank rows, prompt after prompt, as one matrix [positions, K], and each prompt's position count
    (the grouping is most of a walk's cost: a Calibration keeps it); with `logp` (the heads' top-k log-probs of
    the same rows, [rows, K, k]), those too, in the same order: what a per-step tree's walk reads."""
    codes, _ = pd.factorize(ranks["prompt_id"])  # prompts in order of first appearance (no key: dropped)
    keep = np.flatnonzero(codes >= 0)
    order = keep[np.argsort(codes[keep], kind="stable")]  # each prompt's rows together, in their own order
    out = (rank_matrix(ranks)[order], np.bincount(codes[keep]).tolist())
    return out if logp is None else out + (logp[order],)


def accepted_depths(tree, mat: np.ndarray) -> np.ndarray:
    """[positions]: how many tree nodes a greedy step starting at each position accepts, the longest path of the tree
    that the rank row starts with. All positions at once: the tree as a table child[node, rank] -> node."""
    order = [()] + tree.sorted_paths
    ids = {p: i for i, p in enumerate(order)}
    rank_cap = max((p[-1] for p in tree.paths), default=0) + 1
    child = np.full((len(order), rank_cap), -1, dtype=np.int64)
    for p in tree.paths:
        child[ids[p[:-1]], p[-1]] = ids[p]
    node = np.zeros(len(mat), dtype=np.int64)  # the accepted node so far at each position (0: the root)
    depth = np.zeros(len(mat), dtype=np.int64)
    alive = np.ones(len(mat), dtype=bool)
    for d in range(min(tree.depth, mat.shape[1])):
        r = mat[:, d]
        ok = alive & (r >= 0) & (r < rank_cap)
        nxt = np.where(ok, child[node, np.where(ok, r, 0)], -1)
        alive = nxt >= 0
        node = np.where(alive, nxt, 0)
        depth += alive
    return depth


def walk_steps(tree, answers: tuple) -> list[int]:
    """Per prompt of answer_rows, the steps a greedy decoder with this tree (or per-step policy) takes over its
    answer: start at its first position, accept accepted_depths there, jump past the accepted run."""
    mat, lengths = answers[:2]
    if isinstance(tree, DynamicPolicy):
        if len(answers) < 3:
            raise WorkbenchError("a per-step tree is replayed on the heads' log-probs (topk.parquet): none given")
        depth = dynamic.accepted_depths(tree, answers[2], mat).tolist()
    else:
        depth = accepted_depths(tree, mat).tolist()
    out, start = [], 0
    for n in lengths:
        t, end, steps = start, start + n, 0
        while t < end:
            t += 1 + depth[t]
            steps += 1
        out.append(steps)
        start = end
    return out


def walk_answers(tree, answers: tuple[np.ndarray, list[int]], steps: list[int] | None = None) -> float:
    """decoder_walk over answer_rows: total tokens / total steps (walk_steps, or `steps` when already walked)."""
    steps = sum(walk_steps(tree, answers) if steps is None else steps)
    if steps == 0:
        raise WorkbenchError("no positions to measure on (empty calibration data)")
    return sum(answers[1]) / steps


def expected_max(values, batch: int) -> float:
    """E[max] of `batch` values drawn without replacement from `values` (exact: the k-th smallest is the maximum
    of C(k-1, batch-1) of the C(n, batch) draws); the whole maximum when batch >= n."""
    v = sorted(float(x) for x in values)
    n = len(v)
    if n == 0:
        raise WorkbenchError("no answers to take a batch from")
    if batch >= n:
        return v[-1]
    total = math.comb(n, batch)
    return math.fsum(x * (math.comb(k, batch - 1) / total) for k, x in enumerate(v) if k >= batch - 1)


def expected_cost(values, batch: int, cost=None) -> float:
    """E[sum over the batch's steps of cost(active)] for `batch` of `values` (steps per sequence) drawn without
    replacement, `active` being how many are still decoding at that step (hypergeometric at each step): a serving
    engine that drops a finished sequence pays its smaller batch's step for the tail. cost None (every step a full
    step's) gives expected_max."""
    if cost is None:
        return expected_max(values, batch)
    v = np.asarray(values, dtype=np.int64)
    n = len(v)
    if n == 0:
        raise WorkbenchError("no answers to take a batch from")
    b = min(batch, n)
    weights = [0.0] + [float(cost(a)) for a in range(1, b + 1)]
    left = np.bincount(v, minlength=int(v.max()) + 2)[::-1].cumsum()[::-1]  # left[j]: values >= j
    total, draws = 0.0, math.comb(n, b)
    for j in range(1, int(v.max()) + 1):
        m = int(left[j])
        total += math.fsum(weights[a] * math.comb(m, a) * math.comb(n - m, b - a)
                           for a in range(max(1, b - (n - m)), min(b, m) + 1)) / draws
    return total


def batch_walk(tree, answers: tuple[np.ndarray, list[int]], batch: int, steps: list[int] | None = None,
               cost=None) -> float:
    """Tokens per step of a batch of `batch` answers decoded side by side, as its goodput sees it: the batch steps
    until its slowest sequence is done and plain decoding until its longest answer is, so over random batches
    E[max answer length] / E[max steps] (walk_steps, or `steps` when already walked); batch 1 is walk_answers.
    `cost(active, tokens)`: a step's cost with `active` sequences left, over the full batch's at the same tokens
    per sequence (1 + nodes; plain 1), for an engine whose batch shrinks as sequences finish (expected_cost): then
    the ratio of plain's and the tree's full-step equivalents, the speedup over t(B, n) / t(B, 1)."""
    steps = walk_steps(tree, answers) if steps is None else steps
    if sum(steps) == 0:
        raise WorkbenchError("no positions to measure on (empty calibration data)")
    if cost is None:
        return expected_max(answers[1], batch) / expected_max(steps, batch)
    n = getattr(tree, "nodes", 0) + 1
    return expected_cost(answers[1], batch, lambda a: cost(a, 1)) / expected_cost(steps, batch, lambda a: cost(a, n))
