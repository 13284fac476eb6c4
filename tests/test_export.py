"""Export formats parse back to the same tree, name the engine versions they target, and each engine's known
restrictions produce one-line warnings (or a one-line error where the engine cannot take the tree at all)."""
import ast
import json

import numpy as np
import pytest

from workbench import WorkbenchError
from workbench.export.engines import FORMATS, SUFFIXES, TARGETS, best_engine_safe, engine_safe
from workbench.export.trtllm import first_level_gaps
from workbench.export.vllm import vllm_uniform
from workbench.trees.optimize import acc_value_fn, best_dense_tree, dense_tree, expected_length, optimal_tree
from workbench.trees.tree import load_tree, make_tree

from support.words import export_plan, export_tree  # warnings worded as the CLI (or the app) shows them

pytestmark = pytest.mark.unit  # no model, no subprocess: the fast tier

TREE = make_tree([[0], [0, 0], [1], [0, 1], [2], [0, 0, 0]], name="small")


def _rhs(text: str, name: str):
    code = [line for line in text.splitlines() if not line.startswith("#")]
    assert len(code) == 1
    lhs, rhs = code[0].split(" = ", 1)
    assert lhs == name
    return ast.literal_eval(rhs)


def test_medusa_named_list_reads_back(tmp_path):
    text, warns = export_tree(TREE, "medusa", name="my-tree 1")
    assert warns == []
    assert text.startswith(f"# workbench export for Medusa (targets {TARGETS['medusa']})\n")
    assert _rhs(text, "my_tree_1") == TREE.as_lists()  # list of lists, user order kept
    (tmp_path / "t.py").write_text(text)
    assert load_tree(str(tmp_path / "t.py")).paths == TREE.paths  # Medusa-style file with comments reads back
    assert _rhs(export_tree(TREE, "medusa")[0], "small")


def test_eagle_replaces_mc_sim_7b_63(tmp_path):
    text, warns = export_tree(TREE, "eagle", name="my-tree 1")
    assert warns == []
    assert _rhs(text, "mc_sim_7b_63") == TREE.as_lists()  # whatever the name: the global EAGLE-1 reads
    assert "EAGLE-1" in text.splitlines()[0] and "eagle-llm 1.x" in text.splitlines()[0]
    assert "draft model" in text and "verifier" in text and "my-tree 1" in text
    (tmp_path / "choices.py").write_text(text)
    assert load_tree(str(tmp_path / "choices.py")).paths == TREE.paths


@pytest.mark.parametrize("depth1", [[[0]], [[0], [1], [2]]])
def test_eagle_refuses_depth_1(depth1):
    with pytest.raises(WorkbenchError, match="EAGLE-1 cannot take a depth-1 tree") as e:
        export_tree(make_tree(depth1), "eagle", strict=True)
    assert "\n" not in str(e.value)
    text, warns = export_tree(make_tree(depth1), "eagle")  # the app: the refusal as a warning, no tree in the text
    assert warns == [str(e.value)] and text == f"# not exported: {e.value}\n"


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


def _trtllm_list(text: str):
    lines = text.strip().splitlines()
    assert lines[0].startswith("# workbench export for TensorRT-LLM") and "runtime/medusa_utils.py" in lines[0]
    assert len(lines) == 2 and lines[1].startswith('--medusa_choices="') and lines[1].endswith('"')
    return ast.literal_eval(lines[1][len('--medusa_choices="'):-1])


def test_trtllm():
    text, warns = export_tree(TREE, "trtllm", heads=3)
    assert _trtllm_list(text) == TREE.as_lists() and warns == []
    _, warns = export_tree(TREE, "trtllm", heads=3, max_draft_len=5)
    assert len(warns) == 1 and "6 nodes" in warns[0] and "max_draft_len=5" in warns[0]
    _, warns = export_tree(load_tree("mc_sim_7b_63"), "trtllm", heads=4)
    assert warns == []  # TensorRT-LLM's own example tree, 63 = its default max_draft_len
    _, warns = export_tree(TREE, "trtllm")
    assert any("num_medusa_heads >= tree depth 3" in w for w in warns)
    with pytest.raises(WorkbenchError, match="depth 3 exceeds the 2 Medusa heads"):
        export_tree(TREE, "trtllm", heads=2)


def test_trtllm_first_level_gap_warns():
    gap = make_tree([[0], [2], [0, 0]])
    assert first_level_gaps(gap) == [1] and first_level_gaps(TREE) == []
    assert first_level_gaps(make_tree([[3], [1]])) == [0, 2]
    _, warns = export_tree(gap, "trtllm", heads=2)
    assert len(warns) == 1 and "first level lacks rank(s) 1" in warns[0] and "--engine-safe" in warns[0]


def test_vllm_breadth_first_tuples():
    text, warns = export_tree(TREE, "vllm")
    cfg = json.loads(text)  # still a valid --speculative-config fragment: no extra keys
    assert set(cfg) == {"num_speculative_tokens", "speculative_token_tree"}
    tree = ast.literal_eval(cfg["speculative_token_tree"])
    assert cfg["num_speculative_tokens"] == TREE.nodes == len(tree)
    assert all(isinstance(p, tuple) for p in tree)
    assert tree == sorted(tree, key=lambda t: (len(t), t))  # vLLM re-sorts this way: already normalised
    assert set(tree) == set(TREE.paths)
    assert len(warns) == 2
    assert "0.10.1 to 0.20.2" in warns[0] and "0.10.0 ignores it" in warns[0] and "0.21.0 and later reject" in warns[0]
    assert "same number of children" in warns[1] and "the app's dense option" in warns[1]  # irregular Medusa tree


def test_vllm_uniform_trees_only_get_the_version_warning():
    for sizes in ([1], [3], [2, 2], [3, 1, 2]):
        d = dense_tree(sizes)
        assert vllm_uniform(d)
        warns = export_tree(d, "vllm")[1]
        assert len(warns) == 1 and "speculative_token_tree is used only" in warns[0]
    chain = make_tree([[0], [0, 0], [0, 0, 0]])
    assert vllm_uniform(chain)
    for bad in ([[0], [1], [0, 0]], [[1]], [[0], [0, 1]], [[0], [1], [0, 0], [1, 1]]):
        assert not vllm_uniform(make_tree(bad))


def test_every_warning_is_one_line():
    trees = [TREE, make_tree([[0], [2], [0, 0]]), make_tree([[0], [10], [0, 11]]), load_tree("mc_sim_7b_63")]
    for t in trees:
        for fmt in FORMATS:
            assert all("\n" not in w for w in export_tree(t, fmt, max_draft_len=2)[1])


def test_engine_safe_trtllm_promotes_or_drops_whichever_costs_less():
    acc = np.array([[0.5, 0.2, 0.1], [0.4, 0.1, 0.05]])
    gap = make_tree([[0], [2], [0, 0]])
    fixed, note = engine_safe(gap, "trtllm", acc)  # [2] (0.1) out, [1] (0.2) in: better, not worse
    assert fixed.paths == ((0,), (1,), (0, 0)) and "a gain of 0.1000" in note
    heavy = make_tree([[0], [2], [0, 0], [2, 0]])
    acc2 = np.array([[0.5, 0.05, 0.3], [0.4, 0.1, 0.05]])
    fixed, note = engine_safe(heavy, "trtllm", acc2)  # promoting [1] (0.05) beats losing [2]'s branch
    assert set(fixed.paths) == {(0,), (1,), (2,), (0, 0)}
    before, after = expected_length(heavy, acc2), expected_length(fixed, acc2)
    assert f"{before:.4f} -> {after:.4f}" in note and f"cost {before - after:.4f}" in note
    fixed, note = engine_safe(gap, "trtllm")  # no accuracies: a structural repair, cost unknown
    assert not first_level_gaps(fixed) and fixed.nodes == 3 and "cost unknown" in note
    big = load_tree("mc_sim_7b_63")
    fixed, _ = engine_safe(big, "trtllm", max_nodes=20)  # also fits the engine's max_draft_len
    assert fixed.nodes == 20 and not first_level_gaps(fixed) and set(fixed.paths) <= set(big.paths)
    same, note = engine_safe(TREE, "trtllm")
    assert same is TREE and "already" in note


def test_engine_safe_vllm_and_unsupported():
    acc = np.array([[0.5, 0.2, 0.1], [0.4, 0.1, 0.05]])
    acc3 = np.array([[0.5, 0.2, 0.1], [0.4, 0.1, 0.05], [0.3, 0.1, 0.05]])
    fixed, note = engine_safe(TREE, "vllm", acc3)
    assert vllm_uniform(fixed) and fixed.nodes <= TREE.nodes and "expected acceptance" in note
    with pytest.raises(WorkbenchError, match="needs --accuracies FILE or --calibration DIR"):
        engine_safe(TREE, "vllm")
    for fmt in ("medusa", "eagle", "json"):
        with pytest.raises(WorkbenchError, match="--engine-safe supports trtllm and vllm"):
            engine_safe(TREE, fmt, acc)
    with pytest.raises(WorkbenchError, match="tree needs depth 3 and top-3 but the accuracies have 2 heads"):
        engine_safe(TREE, "trtllm", acc)


def test_best_engine_safe_designs_the_best_tree_each_engine_builds_as_written():
    acc = np.array([[0.5, 0.3, 0.1], [0.4, 0.1, 0.05], [0.3, 0.1, 0.05]])
    free = optimal_tree(acc, 6)
    trt = best_engine_safe(acc, "trtllm", 6, 3, 3)
    assert not first_level_gaps(trt) and trt.nodes <= 6
    assert trt.paths == optimal_tree(acc, 6, contiguous_first_level=True).paths
    assert best_engine_safe(acc_value_fn(acc), "trtllm", 6, 3, 3).paths == trt.paths  # a value function too
    vllm = best_engine_safe(acc, "vllm", 6, 3, 3)
    assert vllm_uniform(vllm) and vllm.paths == best_dense_tree(acc, 6).paths
    assert expected_length(vllm, acc) <= expected_length(trt, acc) <= expected_length(free, acc)
    with pytest.raises(WorkbenchError, match="--engine-safe supports trtllm and vllm"):
        best_engine_safe(acc, "eagle", 6, 3, 3)


def test_unknown_format():
    assert set(FORMATS) == {"medusa", "json", "trtllm", "vllm", "eagle"}
    with pytest.raises(WorkbenchError, match="unknown export format 'onnx'"):
        export_tree(TREE, "onnx")


def test_each_format_has_a_file_suffix_its_text_parses_as():
    """The app names each download by SUFFIXES: a .json file holds JSON, a .py file Python."""
    assert list(SUFFIXES) == list(FORMATS) and len(set(SUFFIXES.values())) == len(FORMATS)
    for fmt in FORMATS:
        text, _ = export_tree(TREE, fmt)
        if SUFFIXES[fmt].endswith(".json"):
            assert json.loads(text)
        elif SUFFIXES[fmt].endswith(".py"):
            assert "[[0], [0, 0], [1]" in text and ast.parse(text).body


def test_trtllm_target_names_the_tensorrt_backend_and_its_removal():
    for pr in ("#11723", "#15763", "#15767", "#15907", "#15918"):
        assert pr in TARGETS["trtllm"]
    assert "runtime/medusa_utils.py" in TARGETS["trtllm"]


def _plan_file(tmp_path, rows, chains):
    """A plan file: rows (batch, kind, nodes, tokens/step, speedup), each row's best chain (k, tokens/step, speedup)."""
    from workbench.trees.tree import chain_tree
    from workbench.plan.plan_file import plan_json

    plans, alts = [], []
    for (b, kind, n, tps, s), (k, ctps, cs) in zip(rows, chains):
        choices = [] if kind == "none" else chain_tree(n).as_lists() if kind == "chain" else \
            optimal_tree(np.array([[0.6, 0.3], [0.5, 0.2]]), n).as_lists()
        plans.append(dict(batch_size=b, kind=kind, medusa_choices=choices, nodes=n, predicted_tokens_per_step=tps,
                          predicted_speedup=s))
        alts.append(dict(batch_size=b, speedup_range=None, runner_up=None, runner_up_within_noise=None,
                         best_chain=dict(k=k, predicted_tokens_per_step=ctps, predicted_speedup=cs)))
    f = tmp_path / "plan.json"
    f.write_text(plan_json(dict(plans=plans, alternatives=alts, chain_acceptance=[0.6, 0.3],
                                source=dict(kind="accuracies", path="acc.csv"))))
    return f


def test_vllm_schedule_from_a_plan(tmp_path):
    """Row i covers its batch size up to the next row's minus one; equal neighbours merge; a tree row becomes the
    plan's best chain with its cost noted; batch sizes below the first row take the first row."""
    from workbench.export.vllm import vllm_schedule
    from workbench.plan.plan_file import read_plan

    f = _plan_file(tmp_path, [(2, "tree", 4, 1.9, 1.5), (4, "chain", 2, 1.8, 1.4), (8, "chain", 2, 1.8, 1.2),
                              (32, "none", 0, 1.0, 1.0)],
                   [(2, 1.8, 1.45), (2, 1.8, 1.4), (2, 1.8, 1.2), (0, 1.0, 1.0)])
    plan, notes = read_plan(f), []
    assert vllm_schedule(plan, notes) == [[1, 31, 2], [32, 32, 0]]
    assert any("4-node tree" in n and "chain K=2" in n and "costs 0.100 tokens/step" in n for n in notes)
    assert any("below 2 were not planned" in n for n in notes) and any("above 32 keep K=0" in n for n in notes)
    with pytest.raises(WorkbenchError, match="names no drafter") as e:  # an accuracy table names no heads
        export_plan(plan, "vllm")
    assert "accuracy table acc.csv" in str(e.value) and "acceptance vector" not in str(e.value)  # its own source
    text, warns, notes = export_plan(plan, "vllm", method="eagle3", draft_model=tmp_path)
    cfg = json.loads(text)
    assert cfg["method"] == "eagle3" and cfg["model"] == str(tmp_path.resolve())
    assert cfg["num_speculative_tokens"] == 2 and cfg["num_speculative_tokens_per_batch_size"] == [[1, 31, 2],
                                                                                                  [32, 32, 0]]
    text, _, _ = export_plan(plan, "vllm", batch_size=5, method="ngram")
    assert json.loads(text) == {"method": "ngram", "num_speculative_tokens": 2}
    with pytest.raises(WorkbenchError, match="no speculation at batch size 32"):
        export_plan(plan, "vllm", batch_size=40, method="ngram")
    text, _, notes = export_plan(plan, "trtllm", batch_size=3)  # the row of batch 2: its tree
    assert _trtllm_list(text) == plan["plans"][0]["medusa_choices"]
    assert any("not in the plan" in n for n in notes)


def test_app_warnings_name_the_apps_controls_not_cli_flags():
    """The same warnings for both front ends, each fix worded for the one that shows it: the CLI's flags, the
    app's controls (its repair buttons sit under the warnings)."""
    bad = load_tree([[1], [1, 12], [1, 0], [1, 1], [1, 0, 0]])  # rank 12, a first-level gap, irregular levels
    for fmt in ("medusa", "trtllm", "vllm", "eagle"):
        _, cli = export_tree(bad, fmt)
        _, app = export_tree(bad, fmt, front="app")
        assert len(cli) == len(app) and cli
        assert not any("--" in w for w in app), (fmt, app)
    assert any("--engine-safe" in w for w in export_tree(bad, "trtllm")[1])
    assert any("repair buttons" in w for w in export_tree(bad, "trtllm", front="app")[1])


def test_warnings_are_codes_with_a_fix_each_front_end_words_itself():
    """The export returns what is wrong as a code and the fix's key; the CLI and the app each word every fix, the
    CLI with flags, the app with its controls (so the text a user reads names what they can act on)."""
    from workbench.export import engines
    from support.words import CLI_FIXES, app_fixes

    bad = load_tree([[1], [1, 12], [1, 0], [1, 1], [1, 0, 0]])
    codes = {fmt: [(w.code, w.fix) for w in engines.export_tree(bad, fmt)[1]] for fmt in FORMATS}
    assert codes == {"medusa": [("rank_topk", "max_rank")], "eagle": [("rank_topk", "max_rank")], "json": [],
                     "trtllm": [("trtllm_first_level", "engine_safe"), ("trtllm_heads_unchecked", "num_heads")],
                     "vllm": [("vllm_tree_versions", None), ("vllm_irregular", "dense")]}
    deep = load_tree([[0] * d for d in range(1, 10)] + [[0, 16]])
    assert [w.code for w in engines.export_tree(deep, "trtllm", heads=9, max_draft_len=5)[1]] == \
        ["trtllm_draft_len", "trtllm_cpp_rank", "trtllm_cpp_depth"]
    assert set(CLI_FIXES) == set(app_fixes())  # every fix worded by both front ends
    for w in engines.export_tree(deep, "trtllm", heads=9, max_draft_len=5)[1]:
        assert "{fix}" in w.text and "{fix}" not in w.words(CLI_FIXES) and "{fix}" not in w.words(app_fixes())


def test_trtllm_cpp_runtime_limits_warn_beyond_and_not_within():
    """TensorRT-LLM's C++ runtime keys nodes 4 bits per rank, each rank an int32 shifted by 4 per level below it
    (medusaModule.cpp computePrefix): ranks < 16 and at most 8 levels (test_engines.py models it)."""
    within = make_tree([[15], [0], [0, 15]] + [[0] * d for d in range(2, 9)])  # rank 15, depth 8: both fit
    _, warns = export_tree(within, "trtllm", heads=8)
    assert not any("C++ runtime" in w for w in warns)
    rank16 = make_tree([[0], [1], [0, 16]])  # [0, 16] packs like [1, 0]: the limit is < 16, not <= 16
    _, warns = export_tree(rank16, "trtllm", heads=2)
    assert len(warns) == 1 and "path [0, 16] has rank 16" in warns[0] and "ranks < 16" in warns[0]
    assert "--max-rank 16" in warns[0] and "--engine-safe" in warns[0]
    deep = make_tree([[0] * d for d in range(1, 10)])
    _, warns = export_tree(deep, "trtllm", heads=9)
    assert len(warns) == 1 and "depth 9" in warns[0] and "at most 8 levels" in warns[0]
    assert "--max-depth 8" in export_tree(deep, "trtllm", heads=9)[1][0]
    assert "at most 8 levels" in export_tree(deep, "trtllm", heads=9, front="app")[1][0]
    for fmt in ("medusa", "vllm", "json"):  # other engines: no TensorRT-LLM warning
        assert not any("TensorRT-LLM" in w for w in export_tree(rank16, fmt)[1])
