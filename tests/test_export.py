"""Export formats parse back to the same tree, and each engine's known restrictions produce warnings."""
import ast
import json

import pytest

from workbench import WorkbenchError
from workbench.export import FORMATS, export_tree, vllm_uniform
from workbench.optimize import dense_tree
from workbench.tree import load_tree, make_tree

TREE = make_tree([[0], [0, 0], [1], [0, 1], [2], [0, 0, 0]], name="small")


def _rhs(text: str, name: str):
    lhs, rhs = text.strip().split(" = ", 1)
    assert lhs == name
    return ast.literal_eval(rhs)


@pytest.mark.parametrize("fmt", ["medusa", "eagle"])
def test_python_list_formats(fmt, tmp_path):
    text, warns = export_tree(TREE, fmt, name="my-tree 1")
    assert warns == []
    assert _rhs(text, "my_tree_1") == TREE.as_lists()  # list of lists, user order kept
    (tmp_path / "t.py").write_text(text)
    assert load_tree(str(tmp_path / "t.py")).paths == TREE.paths  # Medusa-style file reads back
    text, _ = export_tree(TREE, fmt)
    assert text.startswith("small = ")


@pytest.mark.parametrize("fmt", ["medusa", "eagle"])
def test_rank_10_warns_for_top10_buffers(fmt):
    _, warns = export_tree(make_tree([[0], [10], [0, 3]]), fmt)
    assert len(warns) == 1 and "path [10] has rank 10" in warns[0] and "top-10" in warns[0]


def test_json(tmp_path):
    text, warns = export_tree(TREE, "json")
    obj = json.loads(text)
    assert obj == {"name": "small", "medusa_choices": TREE.as_lists()} and warns == []
    (tmp_path / "t.json").write_text(text)
    assert load_tree(str(tmp_path / "t.json")).paths == TREE.paths


def test_trtllm():
    text, warns = export_tree(TREE, "trtllm", heads=3)
    assert text.startswith('--medusa_choices="') and text.rstrip().endswith('"')
    assert ast.literal_eval(text.strip()[len('--medusa_choices="'):-1]) == TREE.as_lists()
    assert warns == []
    _, warns = export_tree(TREE, "trtllm", heads=3, max_draft_len=5)
    assert len(warns) == 1 and "6 nodes" in warns[0] and "max_draft_len=5" in warns[0]
    _, warns = export_tree(load_tree("mc_sim_7b_63"), "trtllm", heads=4)
    assert warns == []  # TensorRT-LLM's own example tree, 63 = its default max_draft_len
    _, warns = export_tree(TREE, "trtllm")
    assert any("num_medusa_heads >= tree depth 3" in w for w in warns)
    with pytest.raises(WorkbenchError, match="depth 3 exceeds the 2 Medusa heads"):
        export_tree(TREE, "trtllm", heads=2)


def test_vllm_breadth_first_tuples():
    text, warns = export_tree(TREE, "vllm")
    cfg = json.loads(text)
    tree = ast.literal_eval(cfg["speculative_token_tree"])
    assert cfg["num_speculative_tokens"] == TREE.nodes == len(tree)
    assert all(isinstance(p, tuple) for p in tree)
    assert tree == sorted(tree, key=lambda t: (len(t), t))  # vLLM re-sorts this way: already normalised
    assert set(tree) == set(TREE.paths)
    assert len(warns) == 1 and "same number of children" in warns[0]  # irregular Medusa tree


def test_vllm_uniform_trees_do_not_warn():
    for sizes in ([1], [3], [2, 2], [3, 1, 2]):
        d = dense_tree(sizes)
        assert vllm_uniform(d)
        assert export_tree(d, "vllm")[1] == []
    chain = make_tree([[0], [0, 0], [0, 0, 0]])
    assert vllm_uniform(chain)
    for bad in ([[0], [1], [0, 0]], [[1]], [[0], [0, 1]], [[0], [1], [0, 0], [1, 1]]):
        assert not vllm_uniform(make_tree(bad))


def test_unknown_format():
    assert set(FORMATS) == {"medusa", "json", "trtllm", "vllm", "eagle"}
    with pytest.raises(WorkbenchError, match="unknown export format 'onnx'"):
        export_tree(TREE, "onnx")
