"""Each engine's self-contained tree-building logic, re-implemented here from its documented behaviour, run on the
optimizer's outputs: an engine-safe tree is built exactly as written, and a tree the export warns about really is
built differently (warning <=> mis-built, for every format and many random accuracy tables x budgets)."""
import ast

import numpy as np
import pytest

from workbench import WorkbenchError
from workbench.export.engines import best_engine_safe, engine_safe
from workbench.runtime.treemask import tree_buffers
from workbench.trees.optimize import best_dense_tree, dense_tree, expected_length, optimal_tree
from workbench.trees.tree import load_tree, make_tree, reference_trees

from support.words import export_tree  # warnings worded as the CLI shows them

pytestmark = pytest.mark.unit  # no model, no subprocess: the fast tier

TOPK = 10  # Medusa's and EAGLE-1's buffers index each head's (or draft block's) top-10


def _bfs(choices) -> list[tuple]:
    return sorted(map(tuple, choices), key=lambda p: (len(p), p))


# ----------------------------------------------------------------------------------------------- engine models

def trtllm_build(choices) -> tuple[int, set | None]:
    """TensorRT-LLM's Python runtime (runtime/medusa_utils.py, run by ModelRunner): (tree ids, tree it builds).

    Tree ids: the first level gets one per rank 0..(largest first-level rank); each deeper level one per node, in
    lexicographic order. Each leaf becomes a row of tree-id indices: at depth 1 the rank itself, below it (number
    of nodes written at the levels above) + the node's position in its level. The runtime sizes its draft
    buffers by the number of paths written. None: a row points at an id of another depth or past the end.
    """
    paths = sorted(set(map(tuple, choices)))
    depth = max(map(len, paths))
    per_level = [sum(1 for p in paths if len(p) == d) for d in range(1, depth + 1)]
    ids = [(1, r) for r in range(max(p[0] for p in paths) + 1)]  # (depth, rank) of each tree id
    leaves = [p for p in paths if not any(len(q) > len(p) and q[:len(p)] == p for q in paths)]
    rows = {leaf: [leaf[0]] for leaf in leaves}
    for d in range(1, depth):
        level = sorted({leaf[:d + 1] for leaf in leaves if len(leaf) > d})
        ids += [(d + 1, node[-1]) for node in level]
        for leaf in leaves:
            if len(leaf) > d:
                rows[leaf].append(sum(per_level[:d]) + level.index(leaf[:d + 1]))
    built = set()
    for row in rows.values():
        ranks = ()
        for d, i in enumerate(row):
            if i >= len(ids) or ids[i][0] != d + 1:
                return len(ids), None
            ranks += (ids[i][1],)
            built.add(ranks)
    return len(ids), built


def trtllm_as_written(tree) -> bool:
    n_ids, built = trtllm_build(tree.paths)
    return n_ids == tree.nodes and built == set(tree.paths)


def trtllm_cpp_key(path, n) -> int | None:
    """MedusaModule::computePrefix(path, n) of TensorRT-LLM's C++ runtime (cpp/tensorrt_llm/runtime/medusaModule.cpp)
    as C++ computes it: each rank, an int32, shifted 4 bits per level below it, wrapped to 32 bits and sign-extended
    into the uint64 key. None where it throws (TLLM_CHECK: depth > 16, a rank > 16) or its shift is undefined
    (an int32 shifted by 32 bits or more)."""
    if n > 16:
        return None
    key = 0
    for ci in range(n):
        shift = 4 * (n - 1 - ci)
        if path[ci] > 16 or shift >= 32:
            return None
        v = (path[ci] << shift) & 0xFFFFFFFF
        key |= (v - (1 << 32) if v >= 1 << 31 else v) & 0xFFFFFFFFFFFFFFFF
    return key


def trtllm_cpp_build(choices, max_draft_tokens=63) -> list[tuple] | None:
    """MedusaModule::initMedusaTensorsFromChoices: nodes sorted by (depth, key), each node's parent looked up by its
    parent's key among the previous level's (a missing key reads the root, as std::unordered_map's operator[]
    does); the path each node is really built at, or None where the runtime throws, is undefined, or two nodes of
    a level share a key (std::sort leaves their order, so which one is the parent, unspecified)."""
    paths = [tuple(p) for p in choices]
    keys = [trtllm_cpp_key(p, len(p)) for p in paths]
    if len(paths) > max_draft_tokens or None in keys:
        return None
    if len({(len(p), k) for p, k in zip(paths, keys)}) < len(paths):
        return None
    prev, cur, depth, built = {0: ()}, {}, 1, []
    for i in sorted(range(len(paths)), key=lambda i: (len(paths[i]), keys[i])):
        p = paths[i]
        if len(p) != depth:
            if len(p) != depth + 1:  # TLLM_CHECK(depth + 1 == curDepth)
                return None
            prev, cur, depth = cur, {}, depth + 1
        node = prev.get(trtllm_cpp_key(p, len(p) - 1), ()) + (p[-1],)
        cur[keys[i]] = node
        built.append(node)
    return built


def trtllm_cpp_as_written(tree) -> bool:
    built = trtllm_cpp_build(tree.paths)
    return built is not None and sorted(built) == sorted(tree.paths)


def eagle1_draft_blocks(choices) -> list[tuple]:
    """EAGLE-1's draft side (cnets.py init_tree -> utils_c.py generate_tree_buffers): the draft model emits one
    top-10 block for the root, then one per node that has children, level by level in sorted order. The builder
    keeps per-level lists of those nodes (levels 1..depth-1) and indexes the first list: a depth-1 tree has
    none, and it fails."""
    paths = _bfs(choices)
    inner = [p for p in paths if any(q[:-1] == p for q in paths)]
    levels = [[p for p in inner if len(p) == d] for d in range(1, max(map(len, paths)))]
    if not levels:
        raise IndexError("EAGLE-1 draft buffers: no level has a node with children")
    return [()] + [p for level in levels for p in level]


def eagle1_build(draft_choices, verify_choices) -> list[tuple]:
    """EAGLE-1's verifier (utils.py generate_tree_buffers): node = rank + 10 * (index of its parent among the
    distinct parents, in sorted order) into the draft's blocks. What each written node really verifies."""
    blocks = eagle1_draft_blocks(draft_choices)
    parents, built = [], []
    for p in _bfs(verify_choices):
        if not parents or parents[-1] != p[:-1]:
            parents.append(p[:-1])
        block, rank = divmod(p[-1] + TOPK * (len(parents) - 1), TOPK)
        built.append(blocks[block] + (rank,) if block < len(blocks) else None)
    return built


def eagle1_as_written(tree, draft=None) -> bool:
    return eagle1_build(draft or tree.paths, tree.paths) == _bfs(tree.paths)


def medusa_tree_indices(choices) -> list[int]:
    """Medusa's generate_medusa_buffers: node (sorted order) -> rank + TOPK * (depth - 1) + 1 into
    [base token] + head 1's top-10 + head 2's top-10 + ...; the root is 0."""
    return [0] + [p[-1] + TOPK * (len(p) - 1) + 1 for p in _bfs(choices)]


def medusa_as_written(tree) -> bool:
    """Read each node back from its tree index (which head, which rank) and its ancestors: the written path?"""
    order = _bfs(tree.paths)
    read = [divmod(t - 1, TOPK) for t in medusa_tree_indices(order)[1:]]  # (head - 1, rank)
    got = {p: read[i] for i, p in enumerate(order)}
    return all(got[p[:d]] == (d - 1, p[d - 1]) for p in order for d in range(1, len(p) + 1))


def vllm_drafted(choices) -> list[tuple]:
    """vLLM's tree drafter (EAGLE proposer with speculative_token_tree): the tree is sorted breadth-first;
    level l has n_l nodes and every draft of level l-1 gets its top-c children, c = n_l // n_(l-1), drafted level
    by level, parent by parent; draft token i is verified as node i of the sorted tree."""
    counts = [1] + np.bincount([len(p) for p in choices])[1:].tolist()  # written nodes per level, root = 1
    level, out = [()], []
    for above, n in zip(counts, counts[1:]):
        level = [p + (r,) for p in level for r in range(n // above)]
        out += level
    return out


def vllm_as_written(tree) -> bool:
    return vllm_drafted(tree.paths) == _bfs(tree.paths)


# ----------------------------------------------------------------------------------------------- models vs known facts

def test_trtllm_model_gap_gives_wrong_number_of_tree_ids():
    n_ids, built = trtllm_build([[0], [2], [0, 0]])  # the example
    assert n_ids == 4 and built is None  # 4 tree ids for 3 written nodes; [0, 0]'s row points at a depth-1 id
    assert trtllm_as_written(load_tree("mc_sim_7b_63"))  # TensorRT-LLM's own example tree builds as written
    assert trtllm_as_written(make_tree([[0], [1], [1, 0], [1, 1], [1, 1, 0]]))
    assert trtllm_build([[1], [1, 0]]) == (3, None)  # ids for ranks 0 and 1, and [1, 0] reads id 1 (depth 1)
    assert trtllm_build([[0], [2]]) == (3, {(0,), (2,)})  # right nodes, but 3 tree ids for 2 draft tokens


def test_trtllm_cpp_model_keys_as_cpp_does():
    assert trtllm_cpp_as_written(load_tree("mc_sim_7b_63"))
    assert trtllm_cpp_key((0, 16), 2) == trtllm_cpp_key((1, 0), 2) == 16  # a rank of 16 carries into the parent
    assert trtllm_cpp_build([[0], [1], [0, 16], [1, 0], [1, 0, 0]]) is None  # ... so [1, 0, 0]'s parent is ambiguous
    assert trtllm_cpp_build([[17]]) is None  # TLLM_CHECK: rank <= 16
    chain = [[0] * d for d in range(1, 9)]
    top15 = [[15] + [0] * d for d in range(8)]  # 8 levels, rank 15 on top: a negative int32 key, still unique
    assert trtllm_cpp_as_written(make_tree(chain + top15))
    assert trtllm_cpp_build(chain + [[0] * 9]) is None  # 9 levels: an int32 shifted by 32 bits, undefined in C++
    assert trtllm_cpp_build([[0]] * 64) is None  # more than max_draft_len nodes


def test_eagle1_model():
    mc = load_tree("mc_sim_7b_63")
    assert eagle1_as_written(mc)
    other = make_tree([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]])
    assert eagle1_as_written(other)
    assert not eagle1_as_written(other, draft=mc.paths)  # drafted with the global, verified with another tree
    for depth1 in ([[0]], [[0], [1], [2]]):
        with pytest.raises(IndexError):
            eagle1_draft_blocks(depth1)
    assert not eagle1_as_written(make_tree([[0], [0, 0], [0, 10]]))  # rank 10 reads the next block


def test_medusa_model_matches_tree_buffers():
    for tree in reference_trees().values():
        assert medusa_tree_indices(tree.paths) == tree_buffers(tree).get("tree_indices").tolist()
        assert medusa_as_written(tree)
    assert not medusa_as_written(make_tree([[0], [10]]))  # rank 10 of head 1 is read as rank 0 of head 2


def test_vllm_model():
    for sizes in ([1], [4], [2, 3], [3, 1, 2]):
        assert vllm_as_written(dense_tree(sizes))
    for irregular in ([[0], [1], [0, 0]], [[1]], [[0], [0, 1]], [[0], [1], [0, 0], [1, 1]]):
        assert not vllm_as_written(make_tree(irregular))


# ----------------------------------------------------------------------------------------------- the optimizer's trees

def _acc(rng, k, r):
    """Random exact-rank accuracies in any order (so first-level gaps happen), total per head <= 1."""
    return rng.dirichlet(np.ones(r + 1), size=k)[:, :r] * rng.uniform(0.3, 1.0, size=(k, 1))


def _trees(n_tables=14, budgets=(1, 2, 3, 5, 8, 13, 21, 34)):
    rng = np.random.default_rng(16)
    for i in range(n_tables):
        k, r = int(rng.integers(2, 5)), int(rng.integers(3, 13))  # up to 12 ranks: some trees use rank >= 10
        acc = _acc(rng, k, r)
        for b in budgets:
            yield acc, b, optimal_tree(acc, b, name="t")


def test_trtllm_warning_iff_misbuilt_and_engine_safe_builds():
    warned = 0
    for acc, b, tree in _trees():
        _, warns = export_tree(tree, "trtllm", heads=acc.shape[0])
        gap = any("first level lacks" in w for w in warns)
        assert gap == (not trtllm_as_written(tree)), tree.paths
        warned += gap
        best = optimal_tree(acc, b, contiguous_first_level=True)
        fixed, note = engine_safe(tree, "trtllm", acc)
        for t in (best, fixed):
            assert trtllm_as_written(t) and t.nodes <= b
            assert export_tree(t, "trtllm", heads=acc.shape[0])[1] == []
        # the constrained optimum is the best first-level-contiguous tree; the repair keeps to the tree's nodes
        assert expected_length(fixed, acc) <= expected_length(best, acc) + 1e-12
        assert expected_length(best, acc) <= expected_length(tree, acc) + 1e-12
        assert ("already builds as written" in note) == (fixed == tree) == (not gap)
    assert 0 < warned < 14 * 8  # both cases occur


def _cpp_breakers() -> dict:
    """A tree past each of TensorRT-LLM's C++ runtime limits (and one past all), each with a first-level gap too."""
    chain = [(0,) * d for d in range(1, 12)]  # 11 levels
    return {"rank 16": make_tree([[0], [1], [3], [0, 16], [1, 0], [1, 0, 0], [16], [16, 0]]),
            "rank 40": make_tree([[0], [2], [40], [0, 20], [0, 1], [40, 3]]),
            "depth 11": make_tree(chain + [(2,), (2, 0), (0, 5)]),
            "depth 20": make_tree([(0,) * d for d in range(1, 21)] + [(2,)]),
            "all": make_tree(chain + [(16,), (0, 17), (1,), (1, 3), (3,)] + [(1,) * d for d in range(2, 10)])}


def _naive_repairs(tree) -> list:
    """Two valid repairs by hand: drop the nodes past the C++ limits, then promote the missing first-level ranks
    (when that fits the tree's node count) or drop the first-level branches from the first gap on."""
    kept = [p for p in tree.paths if len(p) <= 8 and max(p) < 16]
    first = {p[0] for p in kept}
    gaps = [r for r in range(max(first) + 1) if r not in first]
    promote = kept + [(r,) for r in gaps]
    drop = [p for p in kept if p[0] < min(gaps + [99])]
    return [make_tree(t) for t in (promote, drop) if len(t) <= tree.nodes]


def test_trtllm_cpp_limits_repaired_to_a_tree_both_runtimes_build():
    rng = np.random.default_rng(5)
    for name, tree in _cpp_breakers().items():
        assert not trtllm_cpp_as_written(tree) and not trtllm_as_written(tree), name
        _, warns = export_tree(tree, "trtllm", heads=tree.depth)
        assert any("C++ runtime" in w and "--engine-safe" in w for w in warns), name
        acc = rng.dirichlet(np.ones(tree.max_rank + 2), size=tree.depth)[:, :tree.max_rank + 1]
        for value in (None, acc):  # a structural repair, and one priced by accuracies
            fixed, note = engine_safe(tree, "trtllm", value)
            assert trtllm_cpp_as_written(fixed) and trtllm_as_written(fixed), (name, fixed.paths)
            assert fixed.nodes <= tree.nodes
            assert set(fixed.paths) - set(tree.paths) <= {(r,) for r in range(16)}  # only promoted first-level ranks
            assert export_tree(fixed, "trtllm", heads=fixed.depth)[1] == [], name
            assert len(note.splitlines()) == 1 and "past TensorRT-LLM's C++ runtime limits" in note, note
            if value is not None:  # the repair keeps the most valuable of what may stay
                for naive in _naive_repairs(tree):
                    assert expected_length(fixed, acc) >= expected_length(naive, acc) - 1e-12, (name, naive.paths)
    acc = np.full((12, 20), 0.002)
    acc[:, 0], acc[0, 17] = 0.9, 0.05  # the unconstrained optimum goes 12 deep and takes rank 17
    free, safe = optimal_tree(acc, 40), best_engine_safe(acc, "trtllm", 40, 12, 20)  # optimize --engine-safe trtllm
    assert free.depth == 12 and (17,) in free.paths
    assert trtllm_cpp_as_written(safe) and trtllm_as_written(safe) and safe.depth == 8


def test_vllm_warning_iff_misdrafted_and_best_dense_tree_drafts_as_written():
    warned = 0
    for acc, b, tree in _trees():
        _, warns = export_tree(tree, "vllm")
        assert "0.10.1 to 0.20.2" in warns[0]  # every vLLM export names the versions that take the key
        irregular = any("same number of children" in w for w in warns)
        assert irregular == (not vllm_as_written(tree))
        warned += irregular
        dense = best_dense_tree(acc, b)
        assert vllm_as_written(dense) and dense.nodes <= b
        assert len(export_tree(dense, "vllm")[1]) == 1
        safe = best_dense_tree(acc, tree.nodes)  # engine_safe keeps the tree's node count
        assert engine_safe(tree, "vllm", acc)[0].paths == (tree.paths if not irregular else safe.paths)
    assert 0 < warned < 14 * 8


def test_eagle1_and_medusa_rank_warning_iff_misbuilt_depth1_refused():
    warned = refused = 0
    for acc, b, tree in _trees():
        medusa_warns = export_tree(tree, "medusa")[1]
        assert bool(medusa_warns) == (not medusa_as_written(tree))
        if tree.depth == 1:
            refused += 1
            with pytest.raises(IndexError):
                eagle1_draft_blocks(tree.paths)
            with pytest.raises(WorkbenchError, match="depth-1"):
                export_tree(tree, "eagle", strict=True)
            continue
        text, warns = export_tree(tree, "eagle")
        lhs, rhs = text.splitlines()[-1].split(" = ")
        assert lhs == "mc_sim_7b_63"  # the one global both the draft model and the verifier read
        exported = make_tree(ast.literal_eval(rhs))
        verifier = [w for w in warns if "draft builder" not in w]  # the draft side's own warning: test_hostile.py
        assert bool(verifier) == (not eagle1_as_written(exported))
        warned += bool(verifier)
    assert refused and warned
