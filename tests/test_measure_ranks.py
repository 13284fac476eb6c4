"""`workbench calibrate` on tiny random models: alignment with what the live decoder sees, the statistics,
resumable writing, and one-line errors."""
import json
from itertools import product

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench import WorkbenchError
from workbench.calibrate.finish import holdout_split
from workbench.calibrate.folder import Calibration
from workbench.calibrate.ranks import (NULL, decoder_walk, head_accuracies, measured_acceptance, path_probabilities,
                                       ranks_frame)
from workbench.calibrate.run import CalibrateConfig, calibrate
from workbench.calibrate.topk import head_ranks
from workbench.decode.loop import medusa_generate
from workbench.runtime.generation import eos_ids, greedy_continuations, prepare_prompt
from workbench.trees.accuracies import read_accuracies
from workbench.trees.optimize import expected_length
from workbench.trees.tree import load_tree, make_tree

PROMPTS = ["Tell me a story.", "What is 2+2?", "Name three colours.", "hi", "Why is the sky blue?",
           "Write a haiku about rain.", "List some fruits", "How do magnets work?", "Say something nice.",
           "Explain gravity briefly."]
ARGS = dict(limit=None, holdout=0.3, max_new_tokens=12, topk=4, budgets=(3, 6), batch_size=4, device="cpu")


def cal(model=None, heads=None, prompts="alpaca-eval", on_batch=None, **kw) -> dict:
    """`calibrate` as the CLI calls it: a CalibrateConfig by keyword, no progress bar."""
    return calibrate(CalibrateConfig(model=model, heads=heads, prompts=prompts, **kw), on_batch=on_batch,
                     progress=False)


@pytest.fixture(scope="module")
def prompt_file(make_prompt_file):
    return make_prompt_file(PROMPTS)


@pytest.fixture(scope="module")
def run(tiny_llama, prompt_file, tmp_path_factory):
    """One uninterrupted calibration of the tiny Llama with tied heads: (folder, meta)."""
    out = tmp_path_factory.mktemp("cal") / "full"
    meta = cal(str(tiny_llama.model_dir), str(tiny_llama.heads_dirs["2"]), str(prompt_file), name="tiny",
               out=out, **ARGS)
    return out, meta


def _naive_greedy(model, prompt, n, stops):
    """Greedy decoding by full recomputation (no cache, no padding): the ground truth for continuations."""
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            tok = int(model(torch.tensor([seq])).logits[0, -1].argmax())
            seq.append(tok)
            if tok in stops:
                break
    return seq[len(prompt):]


def _naive_ranks(model, heads, prompt, cont, topk):
    """The definition, position by position: heads on the hidden state just before c[t] guess c[t+k]."""
    K, N = heads.num_heads, len(cont)
    out = np.full((N, K), NULL)
    with torch.no_grad():
        for t in range(N):
            h = model.base_model(input_ids=torch.tensor([prompt + cont[:t]])).last_hidden_state[0, -1]
            assert int(model.get_output_embeddings()(h).argmax()) == cont[t]
            top = heads(h, model.get_output_embeddings()).topk(topk, dim=-1).indices  # [K, topk]
            for k in range(1, K + 1):
                if t + k < N:
                    hit = (top[k - 1] == cont[t + k]).nonzero()
                    out[t, k - 1] = int(hit[0, 0]) if len(hit) else -1
    return out


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_batched_ranks_equal_the_position_by_position_definition(arch, request):
    tiny = request.getfixturevalue(f"tiny_{arch}")
    model, tok, heads = tiny.model, tiny.tokenizer, tiny.heads["1"]
    prompts = [prepare_prompt(tok, p) for p in PROMPTS[:4]]  # different lengths: left padding is exercised
    stops = sorted(eos_ids(model, tok))
    conts, hidden = greedy_continuations(model, prompts, 10, stops, tok.pad_token_id, return_hidden=True)
    assert conts == [_naive_greedy(model, p, 10, set(stops)) for p in prompts]
    naive = [_naive_ranks(model, heads, p, c, 6) for p, c in zip(prompts, conts)]
    assert [len(h) for h in hidden] == [len(c) for c in conts]
    for states in (None, hidden):  # one teacher-forced forward, or the states captured during generation
        ranks, mismatches = head_ranks(model, heads, prompts, conts, topk=6, hidden=states, chunk=7)
        assert mismatches == ([0] * 4 if states is None else None)
        for r, n in zip(ranks, naive):
            np.testing.assert_array_equal(r, n)


def test_ranks_predict_every_step_of_the_live_decoder(run, tiny_llama, prompt_file):
    """Walking the rank matrix from position 0 (accept the longest tree prefix, jump past it) must give exactly
    the live greedy Medusa decoder's tokens per step, for the calibrated trees and a hand-made one."""
    folder, meta = run
    ranks = Calibration(folder).ranks("all")
    conts = pd.read_parquet(folder / "continuations.parquet").set_index("prompt_id")
    from workbench.core.data import load_prompt_records
    texts = dict(load_prompt_records(str(prompt_file)))
    heads = tiny_llama.heads["2"]
    trees = [load_tree(str(folder / "trees" / f"tiny-{kind}-6.json")) for kind in ("joint", "indep")]
    trees.append(make_tree([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0], [2]]))
    multi, steps = 0, {}
    for tree in trees:
        paths = set(tree.paths)
        for pid, group in ranks.groupby("prompt_id", sort=False):
            mat = group[[f"head_{k}" for k in range(1, heads.num_heads + 1)]].fillna(NULL).to_numpy(dtype=int)
            expected, t = [], 0
            while t < len(mat):
                d = 0
                while d < mat.shape[1] and mat[t, d] >= 0 and tuple(mat[t, :d + 1]) in paths:
                    d += 1
                expected.append(1 + d)
                t += 1 + d
            res = medusa_generate(tiny_llama.model, heads, tiny_llama.tokenizer,
                                  prepare_prompt(tiny_llama.tokenizer, texts[pid]), tree, ARGS["max_new_tokens"])
            assert res.token_ids == list(conts.loc[pid, "continuation"])
            assert res.accepted_lengths == expected, (tree.name, pid)
            steps[tree] = steps.get(tree, 0) + len(res.steps)
            multi += sum(n > 1 for n in expected)
        assert decoder_walk(tree, ranks) == pytest.approx(len(ranks) / steps[tree])  # the live decoder's tokens/step
    assert multi > 0  # the heads do get tokens accepted, so the check above is not vacuous


def test_output_files(run, prompt_file):
    folder, meta = run
    ranks = pd.read_parquet(folder / "ranks.parquet")
    conts = pd.read_parquet(folder / "continuations.parquet")
    K = 5
    assert list(ranks.columns) == ["prompt_id", "position"] + [f"head_{k}" for k in range(1, K + 1)]
    assert all(str(ranks[f"head_{k}"].dtype) == "Int16" for k in range(1, K + 1))
    assert meta["num_prompts"] == len(PROMPTS) and meta["num_positions"] == len(ranks)
    for _, row in conts.iterrows():  # one row per continuation token; head k is null on the last k positions
        g = ranks[ranks["prompt_id"] == row["prompt_id"]]
        n = len(row["continuation"])
        assert list(g["position"]) == list(range(n))
        for k in range(1, K + 1):
            assert g[f"head_{k}"].isna().tolist() == [t + k >= n for t in range(n)]
        assert row["stopped"] == ("eos" if row["continuation"][-1] == 2 else "length")
    vals = ranks[[f"head_{k}" for k in range(1, K + 1)]].to_numpy(dtype=float, na_value=np.nan)
    vals = vals[~np.isnan(vals)]
    assert vals.min() >= -1 and vals.max() < ARGS["topk"]

    # accuracies.csv: the canonical format, fitted on the non-holdout prompts only
    held = set(meta["holdout_ids"])
    assert held == holdout_split([f"q{i}" for i in range(len(PROMPTS))], ARGS["holdout"]) and len(held) == 3
    acc, counts = read_accuracies(folder / "accuracies.csv", return_counts=True)
    fit = ranks[~ranks["prompt_id"].isin(held)]
    exp_acc, exp_counts = head_accuracies(fit, ARGS["topk"])
    np.testing.assert_allclose(acc, exp_acc)
    np.testing.assert_array_equal(counts, exp_counts)
    assert counts[0] == len(fit) - (len(PROMPTS) - len(held))  # the last position of each prompt has no head-1 target

    for b, kind in product(ARGS["budgets"], ["indep", "joint"]):
        data = json.loads((folder / "trees" / f"tiny-{kind}-{b}.json").read_text())
        tree = load_tree(data["medusa_choices"], topk=ARGS["topk"], num_heads=K)
        assert tree.nodes <= b
        probs = path_probabilities(fit)
        assert data["expected_acceptance_length"] == pytest.approx(
            expected_length(tree, acc) if kind == "indep" else 1 + sum(probs.get(p, 0) for p in tree.paths))
        test = ranks[ranks["prompt_id"].isin(held)]
        assert data["holdout_acceptance_length"] == pytest.approx(measured_acceptance(tree, test))
        assert data["predicted_replay"] == pytest.approx(decoder_walk(tree, test))
        assert data["predicted_replay_fit"] == pytest.approx(decoder_walk(tree, fit))
        assert {k: data[k] for k in ("predicted_independent", "predicted_joint", "predicted_replay")} == \
            pytest.approx(Calibration(folder).predict(tree))  # the tree file's numbers are the Calibration's
    # the joint tree is optimal for the joint objective it was built from
    for b in ARGS["budgets"]:
        joint, indep = (json.loads((folder / "trees" / f"tiny-{k}-{b}.json").read_text()) for k in ("joint", "indep"))
        assert joint["predicted_joint"] >= indep["predicted_joint"] - 1e-12

    for key in ("model", "heads", "prompts", "topk", "max_new_tokens", "device", "dtype", "elapsed_seconds",
                "workbench_version", "holdout_ids"):
        assert key in meta
    assert dict(json.loads((folder / "meta.json").read_text()), folder=str(folder)) == json.loads(json.dumps(meta))
    assert meta["trees_skipped"] == []
    assert not (folder / "parts").exists()


def _same_outputs(a, b):
    pd.testing.assert_frame_equal(pd.read_parquet(a / "ranks.parquet"), pd.read_parquet(b / "ranks.parquet"))
    pd.testing.assert_frame_equal(pd.read_parquet(a / "continuations.parquet"),
                                  pd.read_parquet(b / "continuations.parquet"))
    assert (a / "accuracies.csv").read_bytes() == (b / "accuracies.csv").read_bytes()
    names = sorted(f.name for f in (a / "trees").iterdir())
    assert names == sorted(f.name for f in (b / "trees").iterdir())
    for n in names:
        ta, tb = (json.loads((d / "trees" / n).read_text()) for d in (a, b))
        ta.pop("calibration"), tb.pop("calibration")
        assert ta == tb
    ma, mb = (json.loads((d / "meta.json").read_text()) for d in (a, b))
    for m in (ma, mb):
        m.pop("elapsed_seconds"), m.pop("compute_seconds")
        for t in m["trees"]:
            t.pop("calibration")
    assert ma == mb
    assert sorted(p.name for p in a.iterdir()) == sorted(p.name for p in b.iterdir())


def test_interrupted_run_resumes_to_identical_files(run, tiny_llama, prompt_file, tmp_path):
    full, _ = run
    out = tmp_path / "resumed"
    seen = []

    def kill_after_first(i):
        seen.append(i)
        raise KeyboardInterrupt  # what Ctrl-C / a kill between batches looks like

    model, heads = str(tiny_llama.model_dir), str(tiny_llama.heads_dirs["2"])
    with pytest.raises(KeyboardInterrupt):
        cal(model, heads, str(prompt_file), name="tiny", out=out, on_batch=kill_after_first, **ARGS)
    assert seen == [0] and (out / "parts" / "00000.ranks.parquet").is_file() and not (out / "ranks.parquet").exists()
    cal(model, heads, str(prompt_file), name="tiny", out=out, on_batch=seen.append, **ARGS)
    assert seen == [0, 1, 2]  # batch 0 was not recomputed; 10 prompts / 4 per batch = 3 batches
    _same_outputs(full, out)

    # a finished folder with the same run arguments: nothing recomputed; new budgets/holdout only redo the trees
    cal(model, heads, str(prompt_file), name="tiny", out=out, on_batch=seen.append, **dict(ARGS, budgets=(5,)))
    assert seen == [0, 1, 2]
    assert sorted(f.name for f in (out / "trees").iterdir()) == ["tiny-indep-5.json", "tiny-joint-5.json"]


def _interrupt(i):
    raise KeyboardInterrupt


def test_other_arguments_on_an_existing_folder_are_refused_unless_forced(run, tiny_llama, prompt_file, tmp_path):
    full, _ = run
    out = tmp_path / "c"
    model, heads = str(tiny_llama.model_dir), str(tiny_llama.heads_dirs["2"])
    with pytest.raises(KeyboardInterrupt):
        cal(model, heads, str(prompt_file), name="tiny", out=out, on_batch=_interrupt, **ARGS)
    with pytest.raises(WorkbenchError, match=r"other arguments \(max_new_tokens: 12 -> 8\).*--force"):
        cal(model, heads, str(prompt_file), name="tiny", out=out, **dict(ARGS, max_new_tokens=8))
    cal(model, heads, str(prompt_file), name="tiny", out=out, force=True, **ARGS)
    _same_outputs(full, out)  # --force started over: batch 0 of the refused run is not mixed in


@pytest.mark.unit
def test_statistics_on_a_known_matrix():
    # 3 positions, 2 heads. Position 0: ranks (0, 1); 1: (0, -1); 2: (1, null)
    ranks = ranks_frame(["a"], [np.array([[0, 1], [0, -1], [1, NULL]], dtype=np.int16)], 2)
    acc, counts = head_accuracies(ranks, 3)
    np.testing.assert_allclose(acc, [[2 / 3, 1 / 3, 0], [0, 1 / 2, 0]])
    np.testing.assert_array_equal(counts, [3, 2])
    assert path_probabilities(ranks) == pytest.approx({(0,): 2 / 3, (1,): 1 / 3, (0, 1): 1 / 3})
    tree = make_tree([[0], [0, 1], [0, 0]])
    assert measured_acceptance(tree, ranks) == pytest.approx((3 + 2 + 1) / 3)


@pytest.mark.unit
@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(-2, 3), min_size=3, max_size=3), min_size=1, max_size=40),
       st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=3), min_size=1, max_size=12))
def test_path_probabilities_match_brute_force_and_measured_acceptance(rows, paths):
    mat = np.array(rows, dtype=np.int16)
    ranks = ranks_frame(["p"], [mat], 3)
    probs = path_probabilities(ranks)
    for p, v in probs.items():  # brute force: share of rows whose first len(p) ranks are p
        assert v == pytest.approx(np.mean([list(r[:len(p)]) == list(p) for r in rows]))
        assert len(p) == 1 or v <= probs[p[:-1]] + 1e-12
    closed = {tuple(p[:d]) for p in paths for d in range(1, len(p) + 1)}
    tree = make_tree(sorted(closed))
    assert measured_acceptance(tree, ranks) == pytest.approx(1 + sum(probs.get(p, 0.0) for p in tree.paths))


@pytest.mark.unit
def test_holdout_split_is_deterministic_and_order_free():
    ids = [str(i) for i in range(50)]
    a = holdout_split(ids, 0.2)
    assert len(a) == 10 and a == holdout_split(list(reversed(ids)), 0.2)
    assert holdout_split(ids[:2], 0.01) and len(holdout_split(ids[:1], 0.5)) == 0  # >= 1 held, >= 1 fitted
    assert holdout_split(ids, 0) == set()
    with pytest.raises(WorkbenchError, match="--holdout"):
        holdout_split(ids, 1.0)


def test_calibration_splits_and_predictions(run):
    """Calibration answers from the folder: the splits partition the prompts (holdout = meta's ids), and the three
    predictions are the independence model and the joint paths of the fit prompts and the replay on the holdout."""
    folder, meta = run
    cal = Calibration(folder)
    every, fit, held = cal.ranks("all"), cal.ranks("fit"), cal.ranks("holdout")
    assert set(held["prompt_id"]) == set(meta["holdout_ids"]) == cal.holdout_ids
    assert not set(held["prompt_id"]) & set(fit["prompt_id"]) and len(held) + len(fit) == len(every)
    assert set(held["prompt_id"]) | set(fit["prompt_id"]) == set(every["prompt_id"])
    np.testing.assert_allclose(cal.accuracies("fit"), head_accuracies(fit, meta["topk"])[0])
    assert cal.path_probabilities("holdout") == path_probabilities(held)
    tree = make_tree([[0], [1], [0, 0]])
    pred = cal.predict(tree)
    assert pred == {"predicted_independent": pytest.approx(expected_length(tree, cal.accuracies("fit"))),
                    "predicted_joint": pytest.approx(measured_acceptance(tree, fit)),
                    "predicted_replay": pytest.approx(decoder_walk(tree, held))}
    rep = cal.report(tree)
    assert {k: rep[k] for k in pred} == pred and rep["positions"] == len(every)
    assert rep["holdout_acceptance_length"] == pytest.approx(measured_acceptance(tree, held))
    assert rep["predicted_replay_fit"] == pytest.approx(decoder_walk(tree, fit))
    assert cal.ranks("fit") is fit  # read once, kept
    with pytest.raises(WorkbenchError, match="needs depth 6"):
        cal.predict(make_tree([[0], [0, 0], [0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]]))
    with pytest.raises(WorkbenchError, match="split 'test'"):
        cal.ranks("test")
    with pytest.raises(WorkbenchError, match="not a finished calibration"):
        Calibration(folder / "trees")


def test_one_line_errors(tiny_llama, prompt_file, tmp_path):
    model, heads = str(tiny_llama.model_dir), str(tiny_llama.heads_dirs["2"])
    long = tmp_path / "long.json"
    long.write_text(json.dumps([{"instruction": "x" * 600}]))
    cases = [
        (dict(prompts=str(long)), "exceed the model's context of 512"),
        (dict(prompts=str(tmp_path / "none.json")), "no such file"),
        (dict(heads=str(tiny_llama.heads_dirs["2"]) + "x"), "no such file or folder"),
        (dict(topk=0), "--topk"),
        (dict(holdout=1.5), "--holdout"),
        (dict(budgets=(0,)), "--budgets"),
    ]
    for over, match in cases:
        kw = dict(ARGS, model=model, heads=heads, prompts=str(prompt_file), out=tmp_path / "e")
        kw.update(over)
        with pytest.raises(WorkbenchError, match=match) as e:
            cal(**kw)
        assert "\n" not in str(e.value)
    assert not (tmp_path / "e").exists()  # nothing written before the input was checked


def test_heads_for_another_model_are_refused(tiny_llama, prompt_file, tmp_path):
    from workbench.runtime.heads import save_heads
    from support.tiny import random_heads

    other = save_heads(random_heads(32, 128, 2, tied=True), tmp_path / "h", "other")
    with pytest.raises(WorkbenchError, match="hidden size 32"):
        cal(str(tiny_llama.model_dir), str(other), str(prompt_file), out=tmp_path / "o", **ARGS)


def test_cli_calibrate_optimize_and_tree_eval(run, tiny_llama, prompt_file, tmp_path, capsys):
    from workbench.cli import main
    from workbench.trees.optimize import empirical_value_fn

    out = tmp_path / "cli"
    argv = ["calibrate", "--model", str(tiny_llama.model_dir), "--heads", str(tiny_llama.heads_dirs["2"]),
            "--prompts", str(prompt_file), "--limit", "4", "--max-new-tokens", "8", "--topk", "4", "--budgets", "2,3",
            "--gen-batch", "2", "--device", "cpu", "--out", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    meta = json.loads((out / "meta.json").read_text())
    for t in meta["trees"]:  # the printed table
        assert f"{t['name']:<44}{t['nodes']:>6}{t['expected_acceptance_length']:>11.4f}" in text
    names = [f"model-p-{k}-{b}" for k in ("indep", "joint") for b in (2, 3)]  # default name: MODEL-PROMPTS
    made = [t["name"] for t in meta["trees"]] + [s.split(":")[0] for s in meta["trees_skipped"]]
    assert sorted(made) == sorted(names)
    assert main(argv[:-4] + ["--topk", "5", "--out", str(out)]) == 2  # other arguments: refused
    assert "--force" in capsys.readouterr().err

    folder, _ = run
    acc, fit = Calibration(folder).accuracies("fit"), Calibration(folder).ranks("fit")
    for joint in (False, True):
        assert main(["optimize", "--calibration", str(folder), "--budget", "4"] + ["--joint"] * joint) == 0
        obj = json.loads(capsys.readouterr().out)
        value = empirical_value_fn(path_probabilities(fit)) if joint else acc
        tree = make_tree(obj["medusa_choices"])
        assert obj["expected_acceptance_length"] == pytest.approx(expected_length(tree, value))
        ours = json.loads((folder / "trees" / f"tiny-{'joint' if joint else 'indep'}-3.json").read_text())
        assert obj["medusa_choices"][:3] == ours["medusa_choices"]  # greedy order: budget 3 is a prefix of 4
    assert main(["optimize", "--joint", "--budget", "4"]) == 2
    assert "--joint needs --calibration" in capsys.readouterr().err

    assert main(["tree", "eval", "[[0], [1], [0, 0]]", "--calibration", str(folder)]) == 0
    text = capsys.readouterr().out
    rep = Calibration(folder).report(make_tree([[0], [1], [0, 0]]))
    for key in ("predicted_independent", "predicted_joint", "predicted_replay", "predicted_replay_fit",
                "holdout_acceptance_length"):
        assert f"{key:<26} {rep[key]:.4f}" in text


@pytest.mark.unit
def test_no_tree_when_no_guess_was_ever_right(tmp_path):
    from workbench.calibrate.finish import build_trees

    ranks = ranks_frame(["a"], [np.array([[-1, -1], [0, NULL], [-1, NULL]], dtype=np.int16)], 2)
    fit = ranks.iloc[[0, 2]]  # head 1 never right on the fit rows
    acc, _ = head_accuracies(fit, 3)
    summary, skipped = build_trees("n", fit, ranks, acc, [4], tmp_path, "")
    assert summary == [] and len(skipped) == 2 and not list(tmp_path.iterdir())
    summary, skipped = build_trees("n", ranks, ranks, head_accuracies(ranks, 3)[0], [4], tmp_path, "")
    assert [t["nodes"] for t in summary] == [1, 1] and skipped == []
    assert summary[0]["holdout_acceptance_length"] == pytest.approx(4 / 3)


def test_new_heads_reuse_the_answers_of_an_earlier_calibration(run, tiny_llama, prompt_file, tmp_path):
    """Heads change, the base does not: ranks from reused answers (teacher-forced) equal a fresh run's."""
    folder, _ = run
    other = str(tiny_llama.heads_dirs["1"])
    fresh = cal(str(tiny_llama.model_dir), other, str(prompt_file), name="fresh", out=tmp_path / "fresh", **ARGS)
    reused = cal(str(tiny_llama.model_dir), other, str(prompt_file), name="reused", out=tmp_path / "reused",
                 continuations=folder, **ARGS)
    a = pd.read_parquet(tmp_path / "fresh" / "ranks.parquet")
    b = pd.read_parquet(tmp_path / "reused" / "ranks.parquet")
    pd.testing.assert_frame_equal(a, b)
    assert reused["continuations_from"] == str(folder.resolve()) and "continuations_from" not in fresh
    assert fresh["trees"][0]["expected_acceptance_length"] == reused["trees"][0]["expected_acceptance_length"]
    with pytest.raises(WorkbenchError, match="max_new_tokens"):
        cal(str(tiny_llama.model_dir), other, str(prompt_file), name="bad", out=tmp_path / "bad",
                  continuations=folder, **dict(ARGS, max_new_tokens=5))


def test_retrained_heads_in_the_same_folder_are_a_different_calibration(run, tiny_llama, prompt_file, tmp_path):
    """The heads' weights are part of a run's identity, not only their path."""
    import shutil

    from workbench.runtime.heads import save_heads

    heads_dir = tmp_path / "heads"
    shutil.copytree(tiny_llama.heads_dirs["2"], heads_dir)
    out = tmp_path / "cal"
    cal(str(tiny_llama.model_dir), str(heads_dir), str(prompt_file), name="h", out=out, **ARGS)
    retrained = tiny_llama.heads["2"]
    save_heads(type(retrained)(retrained.hidden_size, retrained.vocab_size, retrained.num_heads), heads_dir, "tiny")
    with pytest.raises(WorkbenchError, match="heads_sha256"):
        cal(str(tiny_llama.model_dir), str(heads_dir), str(prompt_file), name="h", out=out, **ARGS)
