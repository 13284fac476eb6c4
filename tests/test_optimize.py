"""Optimizer: brute-force optimality on small instances, the reference script beaten, curves, speedup, files."""
from functools import lru_cache
from itertools import product

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings, strategies as st

from workbench import REPO_ROOT, WorkbenchError
from workbench.core.speed import latency_at, relative_latency
from workbench.plan.fastest import value_source
from workbench.trees.accuracies import accuracies_from_hits, check_accuracies, read_accuracies, write_accuracies
from workbench.trees.optimize import (acc_value_fn, best_dense_tree, best_first, dense_tree, empirical_value_fn,
                                      expected_curve, expected_length, optimal_tree, optimal_tree_from)
from workbench.trees.tree import load_tree, reference_trees

from helpers import fastest_on

pytestmark = pytest.mark.unit  # no model, no subprocess: the fast tier

VICUNA_CSV = REPO_ROOT / "tests" / "data" / "medusa_vicuna7b_head_acc.csv"  # Medusa's assets/medusa_acc.csv


def vicuna_acc() -> np.ndarray:
    """a_k^(i) for Vicuna-7B's 5 heads from top-1/top-5 only: (top5-top1) spread 4:3:2:1 over ranks 2..5, and a
    decreasing tail over ranks 6..10 (a test fixture, not a measurement)."""
    df = pd.read_csv(VICUNA_CSV)
    rows = []
    for t1, t5 in zip(df["top1"], df["top5"]):
        mid = (t5 - t1) * np.array([0.4, 0.3, 0.2, 0.1])
        tail = min(0.1, 1 - t5) * np.array([0.35, 0.25, 0.18, 0.12, 0.10])
        rows.append(np.concatenate([[t1], mid, tail]))
    return np.array(rows)


def random_acc(rng, k, r) -> np.ndarray:
    """Per head: a random split of a random total <= 1 over r ranks (any order, not necessarily decreasing)."""
    return rng.dirichlet(np.ones(r + 1), size=k)[:, :r] * rng.uniform(0.3, 1.0, size=(k, 1))


# ----------------------------------------------------------------------------------------------- brute force

@lru_cache(maxsize=None)
def all_subtrees(k: int, r: int) -> tuple[list, np.ndarray]:
    """Every parent-closed node set of the complete tree (depth k, r children each): candidates, incidence[S, N]."""
    cands = [p for d in range(1, k + 1) for p in product(range(r), repeat=d)]
    col = {p: j for j, p in enumerate(cands)}

    def grow(node):  # all subtrees hanging below `node`, as lists of paths (node itself excluded)
        if len(node) == k:
            return [[]]
        out = [[]]
        for c in range(r):
            child = node + (c,)
            options = [[]] + [[child] + rest for rest in grow(child)]
            out = [a + b for a in out for b in options]
        return out

    subsets = grow(())
    inc = np.zeros((len(subsets), len(cands)))
    for i, s in enumerate(subsets):
        inc[i, [col[p] for p in s]] = 1
    return cands, inc


def brute_best(value, k, r, budget, max_depth=None, max_rank=None) -> float:
    cands, inc = all_subtrees(k, r)
    ok = np.array([(max_depth is None or len(p) <= max_depth) and (max_rank is None or max(p) < max_rank)
                   for p in cands])
    vals = np.array([value(p) for p in cands])
    feasible = (inc[:, ~ok].sum(1) == 0) & (inc.sum(1) <= budget)
    return float((inc[feasible] @ vals).max())


@pytest.mark.parametrize("k,r", [(3, 2), (2, 3)])
def test_optimal_matches_brute_force_every_budget(k, r):
    rng = np.random.default_rng(k * 10 + r)
    cands, _ = all_subtrees(k, r)
    for trial in range(4):
        acc = random_acc(rng, k, r)
        fn = acc_value_fn(acc)
        for max_depth, max_rank in [(None, None), (k - 1, None), (None, r - 1), (1, 1)]:
            n_ok = sum(1 for p in cands if len(p) <= (max_depth or k) and max(p) < (max_rank or r))
            for budget in range(1, len(cands) + 1):
                t = optimal_tree(acc, budget, max_depth, max_rank)
                assert t.nodes == min(budget, n_ok)
                assert t.depth <= (max_depth or k) and t.max_rank < (max_rank or r)
                best = brute_best(fn, k, r, budget, max_depth, max_rank)
                assert expected_length(t, acc) - 1 == pytest.approx(best, abs=1e-12)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), ties=st.booleans())
def test_generic_value_function_matches_brute_force(seed, ties):
    """Any monotone value (not a product of per-head terms), e.g. empirical joint path probabilities."""
    k, r = 3, 2
    rng = np.random.default_rng(seed)
    cands, _ = all_subtrees(k, r)
    probs = {}
    for p in cands:  # cands are sorted by depth, so the parent is set first
        parent = probs.get(p[:-1], 1.0)
        v = parent * rng.uniform(0, 1)
        probs[p] = np.floor(v * 4) / 4 if ties else v  # coarse values create ties; floor keeps monotonicity
    fn = empirical_value_fn(probs)
    curve = expected_curve(fn, len(cands), max_depth=k, max_rank=r)
    for budget in range(1, len(cands) + 1):
        best = brute_best(fn, k, r, budget)
        assert curve[budget] - 1 == pytest.approx(best, abs=1e-12)
        if best > 0:
            t = optimal_tree_from(fn, budget, k, r)
            assert expected_length(t, fn) - 1 == pytest.approx(best, abs=1e-12)
            assert all(fn(p) > 0 for p in t.paths)


def brute_best_where(value, k, r, budget, keep) -> float:
    """Best total value over every tree of at most `budget` nodes for which keep(set of paths) holds."""
    cands, inc = all_subtrees(k, r)
    vals = np.array([value(p) for p in cands])
    best = 0.0
    for row in inc:
        paths = {cands[j] for j in np.flatnonzero(row)}
        if paths and len(paths) <= budget and keep(paths):
            best = max(best, float(row @ vals))
    return best


def contiguous(paths) -> bool:
    first = {p[0] for p in paths if len(p) == 1}
    return first == set(range(len(first)))


def dense(paths) -> bool:
    """Every node of a level has children exactly ranks 0..c-1, the same c for the whole level."""
    level = [()]
    for d in range(1, max(map(len, paths)) + 1):
        kids = [sorted(p[-1] for p in paths if p[:-1] == q) for q in level]
        if any(ks != list(range(len(kids[0]))) for ks in kids):
            return False
        level = [q + (c,) for q in level for c in range(len(kids[0]))]
    return True


@pytest.mark.parametrize("k,r", [(3, 2), (2, 3)])
def test_engine_constrained_optima_match_brute_force(k, r):
    """contiguous_first_level (TensorRT-LLM) and best_dense_tree (vLLM) are exact under their constraints."""
    rng = np.random.default_rng(100 + k * 10 + r)
    cands, _ = all_subtrees(k, r)
    for trial in range(3):
        acc = random_acc(rng, k, r)
        fn = acc_value_fn(acc)
        for budget in range(1, len(cands) + 1):
            t = optimal_tree(acc, budget, contiguous_first_level=True)
            assert contiguous(set(t.paths)) and t.nodes <= budget
            want = brute_best_where(fn, k, r, budget, contiguous)
            assert expected_length(t, acc) - 1 == pytest.approx(want, abs=1e-12)
            d = best_dense_tree(acc, budget)
            assert dense(set(d.paths)) and d.nodes <= budget
            assert expected_length(d, acc) - 1 == pytest.approx(brute_best_where(fn, k, r, budget, dense), abs=1e-12)


def test_contiguous_first_level_with_a_value_function_and_gaps():
    acc = np.array([[0.1, 0.5, 0.3], [0.7, 0.2, 0.1]])  # ranks 1, 2 of head 1 beat rank 0: free optima have gaps
    free = optimal_tree(acc, 2)
    assert free.paths == ((1,), (1, 0))  # no rank 0 on the first level
    safe = optimal_tree_from(acc_value_fn(acc), 2, 2, 3, contiguous_first_level=True)
    assert safe.paths == ((0,), (1,))
    assert optimal_tree(acc, 3, contiguous_first_level=True).paths == ((0,), (1,), (1, 0))  # 0.95 > 0.9
    assert optimal_tree(acc, 4, contiguous_first_level=True).paths == ((0,), (1,), (2,), (1, 0))  # 1.25
    with pytest.raises(WorkbenchError, match="no node has a positive"):
        optimal_tree(np.zeros((2, 3)), 3, contiguous_first_level=True)
    with pytest.raises(WorkbenchError, match="no dense tree has a positive"):
        best_dense_tree(np.zeros((2, 3)), 3)


def test_empirical_dict_unknown_paths_are_worth_zero():
    fn = empirical_value_fn({(0,): 0.5, (0, 1): 0.2, (1,): 0.1})
    t = optimal_tree_from(fn, budget=10, max_depth=3, max_rank=4)
    assert t.paths == ((0,), (0, 1), (1,))  # stops once only zero-value nodes remain
    assert fn((2, 2)) == 0.0


def test_non_monotone_value_function_is_rejected():
    fn = empirical_value_fn({(0,): 0.2, (0, 0): 0.5})
    with pytest.raises(WorkbenchError, match=r"not monotone at \[0, 0\]"):
        optimal_tree_from(fn, 5, 2, 1)
    with pytest.raises(WorkbenchError, match="not monotone"):
        optimal_tree_from(lambda p: float("nan"), 5, 2, 1)


def test_nested_greedy_order_and_deterministic_ties():
    rng = np.random.default_rng(1)
    acc = random_acc(rng, 4, 6)
    big = optimal_tree(acc, 80)
    for n in (1, 7, 33, 80):
        assert optimal_tree(acc, n).paths == big.paths[:n]
    order = best_first(acc_value_fn(acc), 80, 4, 6)
    assert [p for p, _ in order] == list(big.paths)
    assert all(v == pytest.approx(acc_value_fn(acc)(p)) for p, v in order)
    assert all(a[1] >= b[1] for a, b in zip(order, order[1:]))  # best-first: values never increase
    flat = np.full((2, 3), 0.25)  # every depth-1 node ties, every depth-2 node ties
    assert optimal_tree(flat, 5).paths == ((0,), (1,), (2,), (0, 0), (0, 1))


def test_curve_matches_trees_and_is_concave():
    acc = vicuna_acc()
    curve = expected_curve(acc, 100)
    assert curve[0] == 1.0 and len(curve) == 101
    for n in (1, 10, 63, 100):
        assert curve[n] == pytest.approx(expected_length(optimal_tree(acc, n), acc), rel=1e-12)
    gains = np.diff(curve)
    assert (gains >= 0).all() and (np.diff(gains) <= 1e-15).all()
    short = expected_curve(np.array([[0.5, 0.0], [0.5, 0.0]]), 10)  # only 2 positive nodes: flat after
    assert short.tolist() == [1.0, 1.5, 1.75] + [1.75] * 8


def test_zero_accuracies():
    acc = np.array([[0.6, 0.0, 0.2], [0.0, 0.0, 0.0]])
    t = optimal_tree(acc, 10)
    assert sorted(t.paths) == [(0,), (2,)]
    with pytest.raises(WorkbenchError, match="no node has a positive"):
        optimal_tree(np.zeros((2, 3)), 5)


def test_expected_length_formula():
    acc = np.array([[0.5, 0.2], [0.4, 0.1]])
    paths = [[0], [1], [0, 0], [0, 1], [1, 1]]
    want = 1 + sum(np.prod([acc[d, r] for d, r in enumerate(p)]) for p in paths)
    assert expected_length(paths, acc) == pytest.approx(want)
    assert expected_length(load_tree(paths), acc_value_fn(acc)) == pytest.approx(want)


# ----------------------------------------------------------------------------------------------- reference

def reference_script_tree(acc, budget):
    """Medusa's tree script as its README describes it: from (0,), add the best next-sibling or first-child."""
    fn, (k, r) = acc_value_fn(acc), acc.shape
    tree = [(0,)]
    while len(tree) < budget:
        have = set(tree)
        moves = set()
        for p in tree:
            if p[-1] + 1 < r and p[:-1] + (p[-1] + 1,) not in have:
                moves.add(p[:-1] + (p[-1] + 1,))
            if len(p) < k and p + (0,) not in have:
                moves.add(p + (0,))
        tree.append(max(sorted(moves), key=fn))
    return tree


def test_optimal_beats_or_equals_medusa_trees_on_vicuna():
    acc = vicuna_acc()
    best63 = expected_length(optimal_tree(acc, 63), acc)
    ref = reference_trees()
    assert best63 >= expected_length(ref["mc_sim_7b_63"], acc)
    for t in ref.values():  # optimal over all 63-node trees, so above every shipped tree
        assert best63 >= expected_length(t, acc) - 1e-12
    curve = expected_curve(acc, 63)
    for n in range(1, 64):
        assert curve[n] >= expected_length(reference_script_tree(acc, n), acc) - 1e-12


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), sizes=st.lists(st.integers(1, 4), min_size=1, max_size=3))
def test_optimal_beats_dense_trees(seed, sizes):
    acc = random_acc(np.random.default_rng(seed), 3, 4)
    d = dense_tree(sizes)
    assert d.nodes == sum(np.prod(sizes[:i + 1]) for i in range(len(sizes)))
    assert all(p[i] < sizes[i] for p in d.paths for i in range(len(p)))
    assert expected_curve(acc, d.nodes)[d.nodes] >= expected_length(d, acc) - 1e-12


def test_dense_tree_rejects_bad_sizes():
    for bad in ([], [2, 0], [1.5]):
        with pytest.raises(WorkbenchError, match="positive integers"):
            dense_tree(bad)


def test_limits_validated():
    acc = np.full((2, 3), 0.1)
    with pytest.raises(WorkbenchError, match="max depth 3 exceeds the 2 heads"):
        optimal_tree(acc, 4, max_depth=3)
    with pytest.raises(WorkbenchError, match="max rank 4 exceeds the 3 ranks"):
        optimal_tree(acc, 4, max_rank=4)
    with pytest.raises(WorkbenchError, match="budget must be a positive integer"):
        optimal_tree(acc, 0)
    with pytest.raises(WorkbenchError, match="needs max_depth and max_rank"):
        expected_curve(acc_value_fn(acc), 4)


# ----------------------------------------------------------------------------------------------- hardware

def test_interpolation_and_speedup():
    lat = {1: 0.020, 8: 0.020, 32: 0.024, 128: 0.040}
    assert latency_at(lat, 8) == 0.020
    assert latency_at(lat, 9) == latency_at(lat, 20) == latency_at(lat, 32) == 0.024  # the next measured size up
    assert latency_at(lat, 80) == 0.040
    with pytest.raises(WorkbenchError, match="measured range is 1..128"):
        latency_at(lat, 129)
    acc = vicuna_acc()
    curve = expected_curve(acc, 200)
    res = fastest_on(value_source(acc), lat, curve=True)  # plan's ranking of the optimal trees
    assert [c.nodes for c in res["curve"]] == list(range(1, 128))  # n + 1 verify tokens must be measured
    for c in res["curve"]:
        t = latency_at(lat, c.nodes + 1)
        assert c.speedup == pytest.approx(curve[c.nodes] / (t / 0.020))
    assert res["best"].speedup == max(c.speedup for c in res["choice"].ranked)
    assert res["best"].speedup >= max(c.speedup for c in res["curve"])
    assert relative_latency(lat, 0) == pytest.approx(1.0)  # no tree: one token per (unit) step
    with pytest.raises(WorkbenchError, match="no latency for 201 verify tokens"):
        relative_latency(lat, 200)
    with pytest.raises(WorkbenchError, match="no latency for 1 verify tokens"):
        relative_latency({4: 0.02, 64: 0.03}, 3)
    with pytest.raises(WorkbenchError, match="positive, finite seconds"):
        relative_latency({1: 0.02, 64: -1}, 3)


# ----------------------------------------------------------------------------------------------- files

def test_csv_round_trip_with_counts(tmp_path):
    acc = random_acc(np.random.default_rng(3), 5, 10)
    write_accuracies(tmp_path / "a.csv", acc, counts=[805, 804, 803, 802, 801])
    back, counts = read_accuracies(tmp_path / "a.csv", return_counts=True)
    assert np.array_equal(back, acc) and counts.tolist() == [805, 804, 803, 802, 801]
    df = pd.read_csv(tmp_path / "a.csv")
    assert list(df.columns) == ["head", "rank", "accuracy", "count"]
    assert df["head"].min() == 1 and df["rank"].min() == 1  # 1-based
    write_accuracies(tmp_path / "b.csv", acc)
    assert read_accuracies(tmp_path / "b.csv", return_counts=True)[1] is None


def test_csv_any_row_order(tmp_path):
    acc = np.array([[0.5, 0.1], [0.3, 0.2]])
    (tmp_path / "a.csv").write_text("rank,accuracy,head\n2,0.2,2\n1,0.5,1\n2,0.1,1\n1,0.3,2\n")
    assert np.array_equal(read_accuracies(tmp_path / "a.csv"), acc)


def test_medusa_topk_csv(tmp_path):
    """Medusa's own table: cumulative top-k per head (heads from 0); the gain between two stated k is spread
    evenly over the ranks in between, so every stated top-k is kept exactly."""
    (tmp_path / "m.csv").write_text("head,top1,top5\n0,0.6,0.8\n1,0.3,0.5\n")
    acc = read_accuracies(tmp_path / "m.csv")
    assert np.allclose(acc, [[0.6, 0.05, 0.05, 0.05, 0.05], [0.3, 0.05, 0.05, 0.05, 0.05]])
    assert np.allclose(acc.cumsum(1)[:, [0, 4]], [[0.6, 0.8], [0.3, 0.5]])
    (tmp_path / "one.csv").write_text("Head,Top1,Top2,Top3\n1,0.5,0.7,0.75\n2,0.2,0.3,0.3\n")  # 1-based heads
    assert np.allclose(read_accuracies(tmp_path / "one.csv"), [[0.5, 0.2, 0.05], [0.2, 0.1, 0.0]])


def test_medusa_pt_normalised_per_head(tmp_path):
    gen = torch.Generator().manual_seed(0)
    hits = []
    for k, n in enumerate([300, 299, 298]):  # later heads have fewer positions
        rank = torch.randint(0, 30, (n,), generator=gen)  # >= 20: no top-20 hit
        h = torch.zeros(n, 20, dtype=torch.bool)
        hit = rank < 20
        h[hit.nonzero().flatten(), rank[hit]] = True
        hits.append(h)
    torch.save(hits, tmp_path / "vicuna_heads_accuracy.pt")
    acc, counts = read_accuracies(tmp_path / "vicuna_heads_accuracy.pt", return_counts=True)
    assert acc.shape == (3, 20) and counts.tolist() == [300, 299, 298]
    for k in range(3):
        assert np.allclose(acc[k], hits[k].sum(0).numpy() / hits[k].shape[0])
    assert np.array_equal(accuracies_from_hits(hits)[0], acc)


BAD_CSVS = [
    ("head,rank,accuracy\n1,1,0.5\n1,2,1.5\n", "accuracy '1.5' is not a number in"),
    ("head,rank,accuracy\n1,1,-0.1\n", "accuracy '-0.1' is not a number in"),
    ("head,rank,accuracy\n1,1,nan\n", "accuracy 'nan' is not a number"),
    ("head,rank,accuracy\n1,1,\n", "is not a number"),
    ("head,rank,accuracy\n1,1,0.5\n3,1,0.1\n", "head 2 rank 1 is missing"),
    ("head,rank,accuracy\n1,1,0.5\n1,3,0.1\n", "head 1 rank 2 is missing"),
    ("head,rank,accuracy\n1,1,0.7\n1,2,0.4\n", "head 1 accuracies sum to 1.100000 > 1"),
    ("head,rank,accuracy\n1,1,0.5\n1,1,0.4\n", "head 1 rank 1 appears twice"),
    ("head,rank,accuracy\n0,1,0.5\n", "head '0' is not a positive integer"),
    ("head,rank,accuracy\n1,x,0.5\n", "rank 'x' is not a positive integer"),
    ("head,top1,top5\n0,0.56,0.48\n", "top5 0.48 must be in \\[0, 1\\] and not below"),
    ("head,top1,top5\n0,0.56,x\n", "top5 'x' is not a number"),
    ("head,top_1\n1,1.3\n", "top_1 1.3 must be in"),
    ("head,acc\n1,0.5\n", "missing column"),
    ("head,rank,accuracy\n", "header but no rows"),
    ("", "is empty"),
    ("\n\n", "is empty"),
]


@pytest.mark.parametrize("text,msg", BAD_CSVS)
def test_bad_csv_one_line_error(tmp_path, text, msg):
    f = tmp_path / "acc.csv"
    f.write_text(text)
    with pytest.raises(WorkbenchError, match=msg) as e:
        read_accuracies(f)
    assert "\n" not in str(e.value)


def test_bad_files(tmp_path):
    with pytest.raises(WorkbenchError, match="no such file"):
        read_accuracies(tmp_path / "nope.csv")
    (tmp_path / "bin.csv").write_bytes(bytes(range(128, 256)) * 3)
    with pytest.raises(WorkbenchError, match="not a readable CSV"):
        read_accuracies(tmp_path / "bin.csv")
    (tmp_path / "bad.pt").write_bytes(b"not a torch file")
    with pytest.raises(WorkbenchError, match="not a readable torch file"):
        read_accuracies(tmp_path / "bad.pt")
    torch.save({"head0": torch.zeros(3, 4, dtype=torch.bool)}, tmp_path / "dict.pt")
    with pytest.raises(WorkbenchError, match="expected a non-empty list"):
        read_accuracies(tmp_path / "dict.pt")
    torch.save([torch.zeros(3, 4, dtype=torch.bool), torch.zeros(3, 5, dtype=torch.bool)], tmp_path / "k.pt")
    with pytest.raises(WorkbenchError, match="head 2 has top-5 columns"):
        read_accuracies(tmp_path / "k.pt")
    torch.save([torch.ones(3, 4, dtype=torch.bool)], tmp_path / "sum.pt")  # 4 hits per position: not exact-rank
    with pytest.raises(WorkbenchError, match="sum to 4"):
        read_accuracies(tmp_path / "sum.pt")
    torch.save([torch.zeros(0, 4, dtype=torch.bool)], tmp_path / "rows.pt")
    with pytest.raises(WorkbenchError, match="head 1 is"):
        read_accuracies(tmp_path / "rows.pt")


def test_check_accuracies():
    assert check_accuracies([[0.5, 0.5]]).dtype == np.float64
    for bad, msg in [([[0.5, np.nan]], "head 1 rank 2"), ([[0.1], [1.2]], "head 2 rank 1"), ([], "shape"),
                     ([[0.6, 0.6]], "sum to"), ("x", "numeric")]:
        with pytest.raises(WorkbenchError, match=msg):
            check_accuracies(bad)


def test_best_by_keeps_the_optimum_unless_a_dense_tree_within_budget_scores_higher():
    from workbench.trees.optimize import best_by

    opt = load_tree("[[0], [0, 0], [1]]")
    opt = type(opt)(opt.paths, "opt-3")
    flat3, flat4 = dense_tree([3]).paths, dense_tree([4]).paths
    prefers = lambda paths: (lambda t: 2.0 if t.paths == paths else 1.0)  # noqa: E731
    picked = best_by(prefers(flat3), opt, 3, 2, 10)
    assert picked.paths == flat3 and picked.name == "opt-3"
    assert best_by(prefers(flat4), opt, 3, 2, 10) is opt           # [4] has 4 nodes: over the budget
    assert best_by(lambda t: 1.0, opt, 3, 2, 10) is opt             # ties keep the optimum
    seen = []
    best_by(lambda t: seen.append(t.paths) or 0.0, opt, 6, 2, 2)    # every dense tree within 6 nodes, depth 2, s <= 2
    assert sorted(map(tuple, seen[1:])) == sorted(tuple(dense_tree(s).paths) for s in ([1], [2], [1, 1], [2, 2]))
