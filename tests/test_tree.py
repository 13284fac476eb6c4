"""Tree reading, validation, Medusa buffers (spec example + hypothesis invariants), stats and views."""
import json

import networkx as nx
import pytest
import torch
from hypothesis import given, settings, strategies as st

from workbench import REPO_ROOT, WorkbenchError
from workbench.runtime.treemask import tree_buffers
from workbench.trees.tree import (REFERENCE_DIR, TREE_VERSION, Tree, add_path, ascii_tree, buffers_record, load_tree, make_tree, parse_path,
                                  record_json, reference_trees, remove_path, tree_diff, tree_record,
                                  tree_stats, validate)
from workbench.viz.static_figures import to_networkx

pytestmark = pytest.mark.unit  # no model, no subprocess: the fast tier

SPEC_TREE = [[0], [0, 0], [0, 1], [0, 2], [1], [1, 0], [1, 1], [1, 2]]
MEDUSA_TREES = REPO_ROOT / "tests" / "data" / "medusa_trees.json"  # Medusa's medusa_choices.py @ e2a5d20


# ----------------------------------------------------------------------------------------------- spec example

def test_spec_example_buffers():
    b = tree_buffers(make_tree(SPEC_TREE))
    assert b["tree_indices"].tolist() == [0, 1, 2, 11, 12, 13, 11, 12, 13]
    assert b["position_ids"].tolist() == [0, 1, 1, 2, 2, 2, 2, 2, 2]
    assert b["retrieve_indices"].tolist() == [[0, 2, 8], [0, 2, 7], [0, 2, 6], [0, 1, 5], [0, 1, 4], [0, 1, 3]]
    rows = ["100000000", "110000000", "101000000", "110100000", "110010000", "110001000", "101000100",
            "101000010", "101000001"]
    assert ["".join(str(int(v)) for v in r) for r in b["attn_mask"].tolist()] == rows
    assert b["attn_mask"].dtype.is_floating_point


def test_topk_changes_tree_indices_only():
    t = make_tree(SPEC_TREE)
    b10, b4 = tree_buffers(t), tree_buffers(t, topk=4)
    assert b4["tree_indices"].tolist() == [0, 1, 2, 5, 6, 7, 5, 6, 7]
    for k in ("attn_mask", "position_ids", "retrieve_indices"):
        assert torch.equal(b10[k], b4[k])
    with pytest.raises(WorkbenchError, match=r"rank 2 out of range \[0, 2\)"):
        tree_buffers(t, topk=2)


def test_buffers_record_is_medusas_four_buffers_as_int_lists():
    t = make_tree(SPEC_TREE)
    rec, b = buffers_record(t, topk=4), tree_buffers(t, topk=4)
    assert list(rec) == ["attn_mask", "tree_indices", "position_ids", "retrieve_indices"]  # no `parents`
    assert rec["attn_mask"][3] == [1, 1, 0, 1, 0, 0, 0, 0, 0] and isinstance(rec["attn_mask"][3][0], int)
    assert all(rec[k] == b[k].long().tolist() for k in rec)
    assert json.loads(json.dumps(rec)) == rec


# ----------------------------------------------------------------------------------------------- reading

def test_reference_trees_are_the_nine_medusa_trees():
    refs = reference_trees()
    assert len(refs) == 9 and len(list(REFERENCE_DIR.glob("*.json"))) == 9
    for name, t in refs.items():
        assert t.nodes == 63 and t.name == name
        assert load_tree(name).paths == t.paths
    medusa = json.loads(MEDUSA_TREES.read_text())["trees"]
    assert {n: [list(p) for p in t.paths] for n, t in refs.items()} == medusa


def test_read_json_list_object_literal_and_medusa_file(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(SPEC_TREE))
    (tmp_path / "b.json").write_text(json.dumps({"medusa_choices": SPEC_TREE, "other": 1}))
    (tmp_path / "c.py").write_text("# from medusa_choices.py\nmy_tree = " + str(SPEC_TREE) + "\n")
    want = tuple(tuple(p) for p in SPEC_TREE)
    for spec in (tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.py"):
        t = load_tree(str(spec))
        assert t.paths == want and t.name == spec.stem
    assert load_tree(str(SPEC_TREE)).paths == want
    assert load_tree(str(tuple(tuple(p) for p in SPEC_TREE))).paths == want  # tuples
    assert load_tree(json.dumps({"medusa_choices": SPEC_TREE})).paths == want
    assert load_tree(SPEC_TREE).paths == want
    assert load_tree(make_tree(SPEC_TREE)).paths == want


def test_user_order_kept_and_sorted_paths_medusa_order():
    t = make_tree([[1], [0, 0], [0]])
    assert t.paths == ((1,), (0, 0), (0,))
    assert t.sorted_paths == [(0,), (1,), (0, 0)]


BAD_TREES = [
    ("[[0], [0, 0]", "not a JSON or Python list literal"),
    ("[[0], [1, 0]]", r"path \[1, 0\]: parent \[1\] is missing"),
    ("[[0], [0]]", r"path \[0\]: duplicate path"),
    ("[[0], [-1]]", r"path \[-1\]: rank -1 out of range"),
    ("[]", "tree is empty"),
    ("[[0], []]", r"path \[\]: the root is implicit"),
    ("[[0], ['a']]", "must be a list of integer ranks"),
    ("[[0], [0.0]]", "must be a list of integer ranks"),
    ("[[True]]", "must be a list of integer ranks"),
    ("[0, 1]", "must be a list of integer ranks"),
    ("{'choices': [[0]]}", "no 'medusa_choices' key"),
    ("{[1]: 2}", "not a JSON or Python list literal"),
    ("[" * 50000, "not a JSON or Python list literal"),
    ("__import__('os').system('true')", "no such file or reference tree"),
]


@pytest.mark.parametrize("spec,msg", BAD_TREES)
def test_bad_tree_one_line_error(spec, msg):
    with pytest.raises(WorkbenchError, match=msg) as e:
        load_tree(spec)
    assert "\n" not in str(e.value)


def test_rank_and_depth_limits():
    with pytest.raises(WorkbenchError, match=r"path \[0, 3\]: rank 3 out of range \[0, 3\)"):
        load_tree("[[0], [0, 3]]", topk=3)
    with pytest.raises(WorkbenchError, match=r"path \[0, 0, 0\]: depth 3 exceeds the 2 Medusa heads"):
        load_tree("[[0], [0, 0], [0, 0, 0]]", num_heads=2)
    assert load_tree("[[0], [0, 0]]", topk=1, num_heads=2).nodes == 2
    with pytest.raises(WorkbenchError, match="depth 4 exceeds the 3"):
        load_tree("mc_sim_7b_63", num_heads=3)


def test_bad_files(tmp_path):
    with pytest.raises(WorkbenchError, match="no such file or reference tree"):
        load_tree(str(tmp_path / "missing.json"))
    (tmp_path / "empty.json").write_text("  \n")
    with pytest.raises(WorkbenchError, match="is empty"):
        load_tree(str(tmp_path / "empty.json"))
    (tmp_path / "bin.json").write_bytes(bytes(range(128, 256)))
    with pytest.raises(WorkbenchError, match="cannot read it"):
        load_tree(str(tmp_path / "bin.json"))
    (tmp_path / "dup.json").write_text("[[0], [1], [1]]")
    with pytest.raises(WorkbenchError, match=r"path \[1\]: duplicate"):
        load_tree(str(tmp_path / "dup.json"))


# ----------------------------------------------------------------------------------------------- stats, views

def test_stats_networkx_ascii():
    t = make_tree(SPEC_TREE, name="spec")
    st_ = tree_stats(t)
    assert (st_["nodes"], st_["depth"], st_["nodes_per_depth"], st_["leaves"]) == (8, 2, [2, 6], 6)
    assert st_["max_rank"] == 2 and st_["min_topk"] == 3
    g = to_networkx(t)
    assert nx.is_arborescence(g) and g.number_of_nodes() == 9 and g.in_degree(()) == 0
    assert g.nodes[(1, 2)]["rank"] == 2 and g.nodes[(1, 2)]["depth"] == 2
    leaves = [n for n in g if g.out_degree(n) == 0]
    assert sorted(leaves) == sorted(t.leaves())
    art = ascii_tree(t, labels={(1,): "p=0.3"})
    assert art.splitlines()[0] == "root" and len(art.splitlines()) == 9 and "1  p=0.3" in art


# ----------------------------------------------------------------------------------------------- properties

@st.composite
def random_trees(draw, max_depth=5, max_rank=6, max_nodes=40):
    """A random parent-closed set of paths, in random order: grow from random existing nodes."""
    steps = draw(st.lists(st.tuples(st.integers(0, 10 ** 6), st.integers(0, max_rank - 1)),
                          min_size=1, max_size=max_nodes))
    nodes, seen = [()], set()
    for pick, r in steps:
        child = nodes[pick % len(nodes)] + (r,)
        if len(child) <= max_depth and child not in seen:
            seen.add(child)
            nodes.append(child)
    return make_tree(draw(st.permutations(nodes[1:])))


@settings(max_examples=60, deadline=None)
@given(tree=random_trees(), topk=st.integers(6, 12))
def test_buffer_invariants(tree: Tree, topk: int):
    b = tree_buffers(tree, topk=topk)
    order = tree.sorted_paths
    index = {p: i + 1 for i, p in enumerate(order)}
    n = len(order) + 1
    mask = b["attn_mask"]
    assert mask.shape == (n, n)
    assert mask[0].nonzero().flatten().tolist() == [0]
    for p, i in index.items():
        # mask row = node + its ancestors + root
        want = {0, i} | {index[p[:d]] for d in range(1, len(p))}
        assert set(mask[i].nonzero().flatten().tolist()) == want
        assert b["position_ids"][i] == len(p)  # position id = depth
        assert b["tree_indices"][i] == p[-1] + topk * (len(p) - 1) + 1
        assert b["parents"][i] == index.get(p[:-1], 0)
    assert b["position_ids"][0] == 0 and b["tree_indices"][0] == 0
    # retrieve rows are root-to-leaf paths, one per leaf, covering every node
    ret = b["retrieve_indices"]
    assert ret.shape == (len(tree.leaves()), tree.depth + 1)
    covered, ends = set(), set()
    for row in ret.tolist():
        body = [x for x in row if x != -1]
        assert row == body + [-1] * (len(row) - len(body))
        assert body[0] == 0
        path = order[body[-1] - 1]
        assert body == [0] + [index[path[:d]] for d in range(1, len(path) + 1)]
        covered.update(body[1:])
        ends.add(path)
    assert covered == set(range(1, n))
    assert ends == set(tree.leaves())


@settings(max_examples=30, deadline=None)
@given(tree=random_trees(), data=st.data())
def test_buffers_ignore_input_order(tree: Tree, data):
    shuffled = make_tree(data.draw(st.permutations(tree.paths)))
    a, b = tree_buffers(tree), tree_buffers(shuffled)
    assert all(torch.equal(a[k], b[k]) for k in a)


@settings(max_examples=30, deadline=None)
@given(tree=random_trees())
def test_validate_rejects_any_removed_inner_node(tree: Tree):
    inner = [p for p in tree.paths if p not in set(tree.leaves())]
    validate(tree.paths)
    for p in inner[:3]:
        with pytest.raises(WorkbenchError, match="is missing"):
            validate([q for q in tree.paths if q != p])


# ----------------------------------------------------------------------------------------------- editing, records

def test_parse_path_forms():
    assert parse_path("0,1") == parse_path("[0, 1]") == parse_path(" 0 1 ") == (0, 1)
    for bad in ("", "a,b", "-1", "[]"):
        with pytest.raises(WorkbenchError, match="0-based ranks like 0,1"):
            parse_path(bad)


def test_add_and_remove_nodes():
    tree = make_tree(SPEC_TREE, name="spec")
    bigger = add_path(tree, (1, 3))
    assert bigger.nodes == tree.nodes + 1 and (1, 3) in bigger.paths and bigger.name == "spec"
    with pytest.raises(WorkbenchError, match="parent \\[2\\] is missing"):
        add_path(tree, (2, 0))
    with pytest.raises(WorkbenchError, match="duplicate path"):
        add_path(tree, (0, 1))
    with pytest.raises(WorkbenchError, match="exceeds the 2 Medusa heads"):
        add_path(tree, (0, 0, 0), num_heads=2)
    smaller = remove_path(tree, (1,))  # its children [1, 0..2] go with it
    assert sorted(smaller.paths) == [(0,), (0, 0), (0, 1), (0, 2)]
    with pytest.raises(WorkbenchError, match="not in the tree"):
        remove_path(tree, (5,))
    with pytest.raises(WorkbenchError, match="tree is empty"):
        remove_path(make_tree([[0], [0, 0]]), (0,))


def test_tree_diff():
    a, b = make_tree([[0], [1], [0, 0]]), make_tree([[0], [0, 0], [0, 1], [2]])
    d = tree_diff(a, b)
    assert d == {"only_a": [(1,)], "only_b": [(2,), (0, 1)], "shared": [(0,), (0, 0)]}
    assert tree_diff(a, a)["only_a"] == tree_diff(a, a)["only_b"] == []


def test_tree_record_reads_back():
    tree = load_tree("mc_sim_7b_63")
    rec = tree_record(tree, expected_acceptance_length=2.5, budget=63, method="reference")
    assert list(rec)[:3] == ["name", "version", "medusa_choices"] and rec["nodes"] == 63 and rec["depth"] == 4
    text = record_json(rec)
    assert json.loads(text) == rec and text.count("\n") == len(rec) + 2  # braces + one key per line
    assert load_tree(text).paths == tree.paths
    assert load_tree(json.dumps({"medusa_choices": rec["medusa_choices"]})).paths == tree.paths  # Medusa's own: none
    with pytest.raises(WorkbenchError, match=f"tree record version '{TREE_VERSION + 1}', but this workbench reads "
                                             f"version {TREE_VERSION}"):
        load_tree(json.dumps(dict(rec, version=TREE_VERSION + 1)))
