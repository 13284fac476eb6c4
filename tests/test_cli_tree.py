"""`workbench tree / optimize / export` through cli.main: outputs, exit codes, one-line errors."""
import json

import numpy as np
import pytest

from workbench.cli import main
from workbench.trees.accuracies import read_accuracies, write_accuracies
from workbench.trees.optimize import best_dense_tree, expected_length, optimal_tree
from workbench.trees.tree import load_tree, reference_trees

pytestmark = pytest.mark.unit  # no model, no subprocess: the fast tier

SPEC_TREE = "[[0], [0, 0], [0, 1], [0, 2], [1], [1, 0], [1, 1], [1, 2]]"


@pytest.fixture
def acc_csv(tmp_path):
    rng = np.random.default_rng(7)
    acc = rng.dirichlet(np.ones(7), size=4)[:, :6] * 0.9
    return str(write_accuracies(tmp_path / "acc.csv", acc))


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_tree_show_reference(capsys):
    rc, out, err = run(capsys, "tree", "show", "mc_sim_7b_63")
    assert rc == 0 and err == ""
    assert "63 nodes, depth 4, 42 root-to-leaf paths" in out
    assert "nodes per depth: 10, 28, 23, 2" in out
    assert "\nroot\n" in out and out.count("── ") == 63


def test_tree_show_with_accuracies(capsys, acc_csv):
    rc, out, _ = run(capsys, "tree", "show", "[[0], [0, 0], [1]]", "--accuracies", acc_csv)
    want = expected_length(load_tree("[[0], [0, 0], [1]]"), read_accuracies(acc_csv))
    assert rc == 0 and f"expected acceptance length: {want:.4f}" in out


def test_tree_list(capsys):
    rc, out, _ = run(capsys, "tree", "list")
    assert rc == 0
    for name in reference_trees():
        assert name in out
    assert len(out.strip().splitlines()) == 10


def test_tree_buffers_spec_example(capsys):
    rc, out, err = run(capsys, "tree", "buffers", SPEC_TREE)
    assert rc == 0 and err == ""
    b = json.loads(out)
    assert set(b) == {"attn_mask", "tree_indices", "position_ids", "retrieve_indices"}
    assert b["tree_indices"] == [0, 1, 2, 11, 12, 13, 11, 12, 13]
    assert b["position_ids"] == [0, 1, 1, 2, 2, 2, 2, 2, 2]
    assert b["retrieve_indices"] == [[0, 2, 8], [0, 2, 7], [0, 2, 6], [0, 1, 5], [0, 1, 4], [0, 1, 3]]
    assert ["".join(map(str, r)) for r in b["attn_mask"]][3] == "110100000"
    rc, out, _ = run(capsys, "tree", "buffers", SPEC_TREE, "--topk", "3")
    assert rc == 0 and json.loads(out)["tree_indices"] == [0, 1, 2, 4, 5, 6, 4, 5, 6]


def test_optimize_stdout_and_file(capsys, acc_csv, tmp_path):
    rc, out, err = run(capsys, "optimize", "--accuracies", acc_csv, "--budget", "20")
    assert rc == 0
    obj = json.loads(out)
    acc = read_accuracies(acc_csv)
    assert obj["medusa_choices"] == optimal_tree(acc, 20).as_lists()
    assert obj["budget"] == 20 and obj["nodes"] == 20
    assert obj["expected_acceptance_length"] == pytest.approx(expected_length(load_tree(obj["medusa_choices"]), acc))
    assert len(err.strip().splitlines()) == 1 and "expected acceptance length" in err
    out_file = tmp_path / "tree.json"
    rc, out, _ = run(capsys, "optimize", "--accuracies", acc_csv, "--budget", "12", "--max-depth", "2",
                     "--max-rank", "3", "--out", str(out_file))
    assert rc == 0 and out == ""
    t = load_tree(str(out_file))  # the written JSON is a tree every command reads
    assert t.nodes == 12 and t.depth <= 2 and t.max_rank < 3
    rc, out, _ = run(capsys, "export", str(out_file), "--format", "json")
    assert rc == 0 and json.loads(out)["medusa_choices"] == t.as_lists()


def test_optimize_curve_and_dense(capsys, acc_csv):
    rc, out, _ = run(capsys, "optimize", "--accuracies", acc_csv, "--budget", "15", "--curve")
    lines = out.strip().splitlines()
    assert rc == 0 and lines[0].split() == ["budget", "expected_length", "gain"] and len(lines) == 16
    acc = read_accuracies(acc_csv)
    last = lines[-1].split()
    assert last[0] == "15" and float(last[1]) == pytest.approx(expected_length(optimal_tree(acc, 15), acc), abs=1e-4)
    rc, out, _ = run(capsys, "optimize", "--accuracies", acc_csv, "--dense", "3,2")
    obj = json.loads(out)
    assert rc == 0 and obj["nodes"] == 9 and obj["method"] == "dense"


def test_export_formats(capsys):
    for fmt in ("medusa", "json", "trtllm", "vllm", "eagle"):
        rc, out, err = run(capsys, "export", "mc_sim_7b_63", "--format", fmt, "--num-heads", "4")
        assert rc == 0 and out.strip()
        assert all(line.startswith(("warning: ", "note: ", "wrote ")) for line in err.strip().splitlines())
    rc, out, err = run(capsys, "export", "[[0], [0, 0], [11]]", "--format", "medusa", "--name", "x")
    assert rc == 0 and out.splitlines()[-1] == "x = [[0], [0, 0], [11]]" and "warning: path [11] has rank 11" in err


def test_export_engine_safe_reports_the_cost(capsys, acc_csv):
    rc, out, err = run(capsys, "export", "[[0], [2], [0, 0]]", "--format", "trtllm", "--num-heads", "2")
    assert rc == 0 and err.count("\n") == 1 and err.startswith("warning: first level lacks rank(s) 1")
    rc, out, err = run(capsys, "export", "[[0], [2], [0, 0]]", "--format", "trtllm", "--num-heads", "2",
                       "--engine-safe", "--accuracies", acc_csv)
    fixed = json.loads(out.splitlines()[-1].split("=", 1)[1].strip('"'))
    assert rc == 0 and [0] in fixed and [1] in fixed and len(fixed) <= 3
    assert err.count("\n") == 1 and err.startswith("note: engine-safe for trtllm") and "tokens/step" in err
    rc, out, err = run(capsys, "export", "[[0], [2], [0, 0]]", "--format", "trtllm", "--engine-safe", "--num-heads", "2")
    assert rc == 0 and "cost unknown" in err and "warning" not in err


def test_export_engine_safe_trtllm_repairs_the_cpp_runtime_limits(capsys):
    """A rank >= 16 and a depth > 8 warn without --engine-safe; with it the nodes are dropped, in one note line,
    and the export warns about nothing."""
    tree = str([[0] * d for d in range(1, 11)] + [[1], [1, 16], [17]])
    rc, out, err = run(capsys, "export", tree, "--format", "trtllm", "--num-heads", "10")
    assert rc == 0 and "ranks < 16" in err and "at most 8 levels" in err
    rc, out, err = run(capsys, "export", tree, "--format", "trtllm", "--num-heads", "10", "--engine-safe")
    fixed = json.loads(out.splitlines()[-1].split("=", 1)[1].strip('"'))
    assert rc == 0 and err.count("\n") == 1 and err.startswith("note: engine-safe for trtllm: 13 -> ")
    assert "4 of them past TensorRT-LLM's C++ runtime limits" in err and "warning" not in err
    assert max(map(len, fixed)) == 8 and max(max(p) for p in fixed) < 16 and [1] in fixed


def test_optimize_engine_safe(capsys, acc_csv):
    acc = read_accuracies(acc_csv)
    rc, out, err = run(capsys, "optimize", "--accuracies", acc_csv, "--budget", "12", "--engine-safe", "trtllm")
    obj = json.loads(out)
    want = optimal_tree(acc, 12, contiguous_first_level=True)
    assert rc == 0 and obj["engine_safe"] == "trtllm" and obj["medusa_choices"] == want.as_lists()
    free = expected_length(optimal_tree(acc, 12), acc)
    assert f"vs {free:.4f} unconstrained" in err
    rc, out, err = run(capsys, "optimize", "--accuracies", acc_csv, "--budget", "12", "--engine-safe", "vllm")
    obj = json.loads(out)
    assert rc == 0 and obj["medusa_choices"] == best_dense_tree(acc, 12).as_lists()


BAD = [
    (["tree", "show", "[[0], [0, 0"], "not a JSON or Python list literal"),
    (["tree", "show", "[[0], [1, 0]]"], "parent [1] is missing"),
    (["tree", "buffers", "[[0], [0], [1]]"], "duplicate path"),
    (["tree", "buffers", "[[0], [7]]", "--topk", "5"], "rank 7 out of range"),
    (["tree", "buffers", "[[0]]", "--topk", "0"], "argument --topk: 0 is outside 1.."),
    (["tree", "show", "mc_sim_7b_63", "--num-heads", "2"], "exceeds the 2 Medusa heads"),
    (["export", "mc_sim_7b_63", "--format", "trtllm", "--num-heads", "3"], "exceeds the 3 Medusa heads"),
    (["tree", "show", "mc_sim_7b_63", "--heads", "4"], "--num-heads 4"),  # the flag's old name says the new one
    (["export", "mc_sim_7b_63", "--format", "json", "--heads", "4"], "--num-heads 4"),
    (["tree", "show", "no_such_tree.json"], "no such file or reference tree"),
    (["optimize", "--accuracies", "{d}/missing.csv", "--budget", "5"], "no such file"),
    (["optimize", "--accuracies", "{d}/empty.csv", "--budget", "5"], "is empty"),
    (["optimize", "--accuracies", "{d}/over.csv", "--budget", "5"], "not a number in [0, 1]"),
    (["optimize", "--accuracies", "{d}/nan.csv", "--budget", "5"], "not a number in [0, 1]"),
    (["optimize", "--accuracies", "{d}/garbage.pt", "--budget", "5"], "not a readable torch file"),
    (["optimize", "--accuracies", "{acc}", "--budget", "0"], "argument --budget: 0 is outside 1.."),
    (["optimize", "--accuracies", "{acc}"], "--budget N is required"),
    (["optimize", "--accuracies", "{acc}", "--budget", "5", "--max-depth", "9"], "exceeds the 4 heads"),
    (["optimize", "--accuracies", "{acc}", "--dense", "2,x"], "expected sizes per depth"),
    (["optimize", "--accuracies", "{acc}", "--dense", "2,2,2,2,2"], "exceeds the 4 Medusa heads"),
    (["optimize", "--accuracies", "{acc}", "--budget", "5", "--engine-safe", "trtllm", "--curve"], "drop --latency"),
    (["export", "[[0], [1], [2]]", "--format", "eagle"], "EAGLE-1 cannot take a depth-1 tree"),
    (["export", "[[0], [2]]", "--format", "vllm", "--engine-safe"], "needs --accuracies FILE or --calibration"),
    (["export", "[[0], [2]]", "--format", "eagle", "--engine-safe"], "--engine-safe supports trtllm and vllm"),
    (["export", "[[0], [2]]", "--format", "trtllm", "--accuracies", "{acc}"], "only price an --engine-safe repair"),
]


@pytest.mark.parametrize("argv,msg", BAD)
def test_bad_input_exit_2_one_line(capsys, tmp_path, acc_csv, argv, msg):
    (tmp_path / "empty.csv").write_text("")
    (tmp_path / "over.csv").write_text("head,rank,accuracy\n1,1,1.2\n")
    (tmp_path / "nan.csv").write_text("head,rank,accuracy\n1,1,NaN\n")
    (tmp_path / "garbage.pt").write_bytes(b"\x00garbage")
    argv = [a.format(d=tmp_path, acc=acc_csv) for a in argv]
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and msg in lines[0], err
