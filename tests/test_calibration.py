"""The calibration folder as one object (workbench/calibrate/folder.py), read on the committed demo calibration: its
splits, its three predictions (equal to what `workbench calibrate` wrote into its tree files), where folders are
found, file names, and one-line errors for folders that are not calibrations."""
import json
import shutil

import numpy as np
import pandas as pd
import pytest

from workbench import REPO_ROOT, WorkbenchError
from workbench.calibrate.folder import (PREDICTIONS, Calibration, calibration_root, default_calibration,
                                        default_latency_path, latency_path, list_calibrations, slug, tree_table)
from workbench.calibrate.ranks import decoder_walk, head_accuracies, measured_acceptance
from workbench.trees.optimize import expected_curve, expected_length
from workbench.trees.tree import load_tree, make_tree

CAL = REPO_ROOT / "calibration" / "smollm2-135m-instruct-alpaca-eval"
NAME = CAL.name


@pytest.fixture(scope="module")
def cal():
    return Calibration(CAL)


@pytest.mark.unit
def test_splits_partition_the_prompts(cal):
    every, fit, held = cal.ranks("all"), cal.ranks("fit"), cal.ranks("holdout")
    assert set(held["prompt_id"]) == set(cal.meta["holdout_ids"]) == cal.holdout_ids
    assert not set(fit["prompt_id"]) & set(held["prompt_id"])
    assert set(fit["prompt_id"]) | set(held["prompt_id"]) == set(every["prompt_id"])
    assert (len(fit), len(held)) == (cal.meta["fit_positions"], cal.meta["holdout_positions"])
    assert len(every) == cal.meta["num_positions"] == len(fit) + len(held)
    assert cal.ranks("fit") is fit and cal.accuracies("fit") is cal.accuracies("fit")  # read once, then kept
    with pytest.raises(WorkbenchError, match="split 'train': use all, fit or holdout"):
        cal.ranks("train")


@pytest.mark.unit
def test_accuracies_are_the_committed_csv(cal):
    from workbench.trees.accuracies import read_accuracies

    np.testing.assert_allclose(cal.accuracies("fit"), read_accuracies(CAL / "accuracies.csv"), atol=1e-9)
    np.testing.assert_allclose(cal.accuracies("holdout"), head_accuracies(cal.ranks("holdout"), 10)[0])


@pytest.mark.unit
@pytest.mark.parametrize("kind,budget", [("indep", 16), ("joint", 64)])
def test_predict_equals_what_calibrate_wrote(cal, kind, budget):
    """The tree files' numbers were computed by `workbench calibrate` when the calibration was made."""
    f = REPO_ROOT / "trees" / f"{NAME}-{kind}-{budget}.json"
    written, tree = json.loads(f.read_text()), load_tree(str(f))
    pred = cal.predict(tree)
    assert set(pred) == set(PREDICTIONS)
    assert pred == {k: pytest.approx(written[k], rel=1e-12) for k in PREDICTIONS}
    assert cal.report(tree)["predicted_replay_fit"] == pytest.approx(written["predicted_replay_fit"], rel=1e-12)
    assert cal.report(tree)["holdout_acceptance_length"] == pytest.approx(written["holdout_acceptance_length"])


@pytest.mark.unit
def test_predict_by_definition(cal):
    tree = load_tree("mc_sim_7b_63")
    held = cal.ranks("holdout")
    cut = held[held["position"] < 32]
    assert cal.predict(tree) == {
        "predicted_independent": pytest.approx(expected_length(tree, head_accuracies(cal.ranks("fit"), 10)[0])),
        "predicted_joint": pytest.approx(measured_acceptance(tree, cal.ranks("fit"))),
        "predicted_replay": pytest.approx(decoder_walk(tree, held))}
    assert cal.predict(tree, max_new_tokens=32)["predicted_replay"] == pytest.approx(decoder_walk(tree, cut))
    with pytest.raises(WorkbenchError, match="needs depth 5 and top-1 but the calibration has 4 heads and top-10"):
        cal.predict(make_tree([[0], [0, 0], [0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0, 0]]))


def _walk_by_definition(tree, prompts: list[np.ndarray]) -> tuple[float, float]:
    """(decoder walk, mean over all positions) the slow way: per position, the longest tree path the rank row starts
    with (a miss, -1, or past the end, NULL, stops it)."""
    nodes, tokens, steps, total, positions = set(tree.paths), 0, 0, 0, 0

    def depth(row):
        d = 0
        while d < len(row) and row[d] >= 0 and tuple(row[:d + 1]) in nodes:
            d += 1
        return d

    for mat in prompts:
        rows = mat.tolist()
        total += sum(1 + depth(r) for r in rows)
        positions += len(rows)
        t = 0
        while t < len(rows):
            t += 1 + depth(rows[t])
            steps += 1
        tokens += len(rows)
    return tokens / steps, total / positions


@pytest.mark.unit
@pytest.mark.parametrize("seed", range(5))
def test_walk_equals_its_definition(seed):
    """The replay and the all-positions mean (computed for every position at once) equal the per-position walk on
    random answers with misses and ends, for trees wider, narrower, deeper and shallower than the heads."""
    from workbench.calibrate.ranks import NULL, ranks_frame
    from workbench.trees.optimize import optimal_tree

    rng = np.random.default_rng(seed)
    K = int(rng.integers(2, 6))
    prompts = []
    for _ in range(int(rng.integers(3, 9))):
        n = int(rng.integers(1, 60))
        mat = np.minimum(rng.geometric(0.45, size=(n, K)) - 1, 12).astype(np.int16)
        mat[rng.random((n, K)) < 0.15] = -1  # misses: the token is not in the head's top-k
        for k in range(K):
            mat[max(n - k - 1, 0):, k] = NULL  # past the answer's end: head k+1 has no target in the last k+1
        prompts.append(mat)
    ranks = ranks_frame([f"p{i}" for i in range(len(prompts))], prompts, K)
    acc = rng.dirichlet(np.ones(8), size=K + 1)[:, :6] * 0.9
    for tree in (optimal_tree(acc, int(rng.integers(1, 40))), optimal_tree(acc[:2], 5), make_tree([[0]]),
                 make_tree([[0], [1], [0, 0], [0, 3], [0, 0, 0]])):
        walk, mean = _walk_by_definition(tree, prompts)
        assert decoder_walk(tree, ranks) == walk
        assert measured_acceptance(tree, ranks) == mean
        # the prompts' rows interleaved (each prompt's own rows still in order): the same walk
        assert decoder_walk(tree, ranks.iloc[np.argsort(ranks.groupby("prompt_id").cumcount().to_numpy(),
                                                        kind="stable")]) == walk


def _steps_by_definition(tree, mat: np.ndarray) -> int:
    nodes, rows, t, steps = set(tree.paths), mat.tolist(), 0, 0
    while t < len(rows):
        row, d = rows[t], 0
        while d < len(row) and row[d] >= 0 and tuple(row[:d + 1]) in nodes:
            d += 1
        t, steps = t + 1 + d, steps + 1
    return steps


@pytest.mark.unit
@pytest.mark.parametrize("seed", range(3))
def test_batch_walk_is_the_goodput_over_every_batch(seed):
    """A batch of B answers steps until its slowest is done and plain decoding until its longest is: over every
    B-subset of the answers, sum of max lengths / sum of max steps, which batch_walk gives exactly; batch 1 is the
    replay."""
    import itertools

    from workbench.calibrate.ranks import NULL, answer_rows, batch_walk, expected_max, ranks_frame

    rng = np.random.default_rng(seed)
    K = 3
    prompts = []
    for _ in range(7):
        n = int(rng.integers(1, 40))
        mat = np.minimum(rng.geometric(0.5, size=(n, K)) - 1, 9).astype(np.int16)
        for k in range(K):
            mat[max(n - k - 1, 0):, k] = NULL
        prompts.append(mat)
    rows = answer_rows(ranks_frame([f"p{i}" for i in range(len(prompts))], prompts, K))
    tree = make_tree([[0], [1], [0, 0], [0, 0, 0]])
    steps = [_steps_by_definition(tree, m) for m in prompts]
    lengths = [len(m) for m in prompts]
    assert batch_walk(tree, rows, 1) == pytest.approx(sum(lengths) / sum(steps)) == \
        pytest.approx(decoder_walk(tree, ranks_frame([f"p{i}" for i in range(len(prompts))], prompts, K)))
    for b in (2, 3, 5, 7, 9):
        combos = list(itertools.combinations(range(len(prompts)), min(b, len(prompts))))
        want = sum(max(lengths[i] for i in c) for c in combos) / sum(max(steps[i] for i in c) for c in combos)
        assert batch_walk(tree, rows, b) == pytest.approx(want)
        assert expected_max(steps, b) == pytest.approx(sum(max(steps[i] for i in c) for c in combos) / len(combos))
    with pytest.raises(WorkbenchError, match="no answers"):
        expected_max([], 2)


@pytest.mark.unit
def test_a_shrinking_batch_prices_its_tail_steps_by_who_is_left():
    """On an engine that drops finished sequences (vLLM) a step with `a` of B sequences left costs cost(a): over
    every B-subset, the sum over steps of cost(how many are still decoding), which expected_cost gives exactly;
    cost 1 is expected_max, and batch_walk with a cost is plain's priced steps over the tree's."""
    import itertools

    from workbench.calibrate.ranks import answer_rows, batch_walk, expected_cost, expected_max, ranks_frame, walk_steps
    from workbench.core.speed import shrinking_cost

    steps = [3, 5, 5, 8, 2, 9, 9, 1]
    cost = lambda a: 0.3 + 0.1 * a * a  # noqa: E731 - any cost, not monotone in general
    for b in (1, 2, 3, 5, 8, 11):
        combos = list(itertools.combinations(steps, min(b, len(steps))))
        want = sum(sum(cost(sum(s >= j for s in c)) for j in range(1, max(c) + 1)) for c in combos) / len(combos)
        assert expected_cost(steps, b, cost) == pytest.approx(want)
        assert expected_cost(steps, b, lambda a: 1.0) == pytest.approx(expected_max(steps, b))
        assert expected_cost(steps, b) == expected_max(steps, b)
    rng = np.random.default_rng(0)
    prompts = [np.minimum(rng.geometric(0.4, size=(int(n), 2)) - 1, 9).astype(np.int16) for n in (12, 30, 7, 22)]
    rows = answer_rows(ranks_frame([f"p{i}" for i in range(4)], prompts, 2))
    tree = make_tree([[0], [0, 0]])
    walked, lengths = walk_steps(tree, rows), rows[1]
    shrink = lambda a, n: a / 2 if n == 3 else 1.0  # noqa: E731 - only the tree's tail costs less: 3 tokens a row
    got = batch_walk(tree, rows, 2, cost=shrink)
    assert got == pytest.approx(expected_max(lengths, 2) / expected_cost(walked, 2, lambda a: a / 2))
    assert got > batch_walk(tree, rows, 2) and batch_walk(tree, rows, 2, cost=lambda a, n: 1.0) == \
        pytest.approx(batch_walk(tree, rows, 2))
    alone = shrinking_cost({1: {1: 1.0, 3: 1.5}, 2: {1: 1.1, 3: 2.5}}, 1)  # batch 1 has no tail
    assert batch_walk(tree, rows, 1, cost=alone) == pytest.approx(batch_walk(tree, rows, 1))


@pytest.mark.unit
def test_batch_replay_of_the_demo_falls_with_batch_size(cal):
    """On the demo's held-out answers a batch's tokens/step falls below each sequence's as the batch grows (the
    slowest sequence sets the steps): what the planner divides by at batch B."""
    tree = make_tree([[0], [1], [0, 0]])
    per_seq = cal.replay(tree, "holdout", 48)
    got = [cal.batch_replay(tree, b, "holdout", 48) for b in (1, 2, 4, 8)]
    assert got[0] == pytest.approx(per_seq) and got[0] > got[1] > got[2] > got[3] > 1
    assert got[3] / per_seq < 0.97


@pytest.mark.unit
def test_a_tree_is_walked_once_for_its_replay_and_every_batch_size(cal, monkeypatch):
    """A plan weighs each tree at every batch size: the replay and each batch's tokens/step read one walk of the
    held-out answers per tree and length, the numbers those of a fresh walk."""
    import workbench.calibrate.folder as calibration

    walks, real = [], calibration.walk_steps
    monkeypatch.setattr(calibration, "walk_steps", lambda tree, answers: walks.append(tree.paths) or real(tree, answers))
    fresh = Calibration(cal.folder)
    tree = make_tree([[0], [1], [0, 0]])
    got = [fresh.replay(tree, "holdout", 48)] + [fresh.batch_replay(tree, b, "holdout", 48) for b in (1, 2, 4, 8)]
    assert walks == [tree.paths]
    rows = calibration.answer_rows(fresh.answers("holdout", 48))
    assert got[0] == calibration.walk_answers(tree, rows) and got[3] == calibration.batch_walk(tree, rows, 4)
    walks.clear()
    fresh.replay(tree, "holdout", 32)  # another length: its own walk
    fresh.batch_replay(tree, 2, "holdout", 32)
    assert walks == [tree.paths]


@pytest.mark.unit
def test_tree_table(cal):
    trees = [load_tree("mc_sim_7b_63"), make_tree([[0], [0, 0], [0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0, 0]], "deep")]
    acc = cal.accuracies("fit")
    curve = expected_curve(acc, 64, 4, 10)
    rows = tree_table(trees, acc, cal, curve)
    assert rows[0] == {"tree": "mc_sim_7b_63", "nodes": 63, "depth": 4, **cal.predict(trees[0]),
                       "optimal at same size": pytest.approx(curve[63])}
    assert rows[0]["optimal at same size"] >= rows[0]["predicted_independent"]  # the optimum is optimal
    assert rows[1] == {"tree": "deep", "nodes": 5, "depth": 5, "note": "needs 5 heads / top-1"}
    only_acc = tree_table(trees[:1], acc)  # an accuracy table alone: the independence model only
    assert only_acc == [{"tree": "mc_sim_7b_63", "nodes": 63, "depth": 4,
                         "predicted_independent": pytest.approx(rows[0]["predicted_independent"])}]


@pytest.mark.unit
def test_path_comparison_measured_vs_independence(cal):
    """The calibration page's table: the most frequent measured paths, each against the product of its a_k^(i)."""
    table = cal.path_comparison("holdout", 12)
    measured, acc = cal.path_probabilities("holdout"), cal.accuracies("holdout")
    assert list(table.columns) == ["path", "measured / independence", "measured", "independence", "depth"]
    assert len(table) == 12 and table["measured"].is_monotonic_decreasing
    assert table["measured"][0] == max(measured.values())
    for _, row in table.iterrows():
        assert row["measured"] == measured[row["path"]] and row["depth"] == len(row["path"])
        assert row["independence"] == pytest.approx(np.prod([acc[k, r] for k, r in enumerate(row["path"])]))
        assert row["measured / independence"] == pytest.approx(row["measured"] / row["independence"])
    assert len(cal.path_comparison("fit", 10 ** 6)) == len(cal.path_probabilities("fit"))


@pytest.mark.unit
def test_holdout_prompts_typical_context_and_files(cal):
    from workbench.core.data import load_prompt_records

    records = cal.holdout_prompts()
    assert [pid for pid, _ in records] == [pid for pid, _ in load_prompt_records("alpaca-eval")
                                           if pid in cal.holdout_ids]
    assert cal.holdout_prompts(3) == records[:3]
    info = pd.read_parquet(CAL / "continuations.parquet")
    assert cal.typical_context() == pytest.approx((info["prompt_tokens"] + info["continuation"].map(len) / 2).mean())
    assert len(cal.continuations()) == cal.meta["num_prompts"]
    assert cal.latency_files() == [CAL / "latency-cpu.csv", CAL / "latency-forward-cpu.csv"]


@pytest.mark.unit
def test_finding_folders_and_file_names(tmp_path, monkeypatch):
    assert CAL in list_calibrations(REPO_ROOT / "calibration")
    monkeypatch.setenv("WORKBENCH_CALIBRATION_ROOT", str(tmp_path))
    assert calibration_root() == tmp_path == calibration_root("elsewhere")  # the variable wins over the default
    with pytest.raises(WorkbenchError, match=f"no calibration folder under {tmp_path}/"):
        default_calibration()
    shutil.copytree(CAL, tmp_path / "b-copy", ignore=shutil.ignore_patterns("*.parquet"))
    (tmp_path / "a-unfinished").mkdir()  # no meta.json: not listed
    assert list_calibrations() == [tmp_path / "b-copy"] and default_calibration() == tmp_path / "b-copy"
    # the default is the folder with the most prompts, not the first name: a quick run beside the full one
    shutil.copytree(CAL, tmp_path / "a-quick", ignore=shutil.ignore_patterns("*.parquet"))
    meta = json.loads((tmp_path / "a-quick" / "meta.json").read_text())
    (tmp_path / "a-quick" / "meta.json").write_text(json.dumps(meta | {"num_prompts": 32}))
    assert list_calibrations()[0] == tmp_path / "a-quick" and default_calibration() == tmp_path / "b-copy"
    (tmp_path / "a-quick" / "meta.json").write_text(json.dumps(meta | {"num_prompts": 806}))
    assert default_calibration() == tmp_path / "a-quick"
    shutil.rmtree(tmp_path / "a-quick")
    # one slug for both callers: calibrate's folder names (file stems) and latency's device names
    assert slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3" and slug("") == "model"
    assert slug("data/my.prompts.json", file_stem=True) == "my-prompts"
    assert latency_path(tmp_path, "cpu") == tmp_path / "latency-cpu.csv"
    meta = json.loads((CAL / "meta.json").read_text())
    assert default_latency_path(meta["model"], "cuda") == tmp_path / "b-copy" / "latency-cuda.csv"
    assert default_latency_path("org/Other", "cpu") == tmp_path / "org-other" / "latency-cpu.csv"


@pytest.mark.unit
def test_calibrate_default_name_is_unchanged():
    from workbench.calibrate.run import default_name

    assert default_name(None, "alpaca-eval") == NAME
    assert default_name("HuggingFaceTB/SmolLM2-135M-Instruct", "data/my.prompts.json") == \
        "smollm2-135m-instruct-my-prompts"


@pytest.mark.parametrize("damage,match", [
    (lambda d: (d / "ranks.parquet").unlink(), "not a finished calibration folder"),
    (lambda d: (d / "meta.json").unlink(), "no meta.json"),
    (lambda d: (d / "meta.json").write_text("{"), "meta.json"),
    (lambda d: (d / "meta.json").write_text('{"topk": "ten"}'), "topk should be an integer in 1..32768"),
    (lambda d: (d / "meta.json").write_text('{"topk": 40000}'), "16-bit ranks"),  # past what ranks.parquet holds
    (lambda d: (d / "meta.json").write_text('{"topk": 10, "holdout_ids": [1]}'), "holdout_ids should be a list"),
    (lambda d: (d / "meta.json").write_text('{"version": 3, "topk": 10, "holdout_ids": []}'),
     "meta.json version '3', but this workbench reads calibrations of version 2"),
])
@pytest.mark.unit
def test_bad_folders_fail_in_one_line_on_opening(tmp_path, damage, match):
    folder = tmp_path / "c"
    shutil.copytree(CAL, folder, ignore=shutil.ignore_patterns("continuations.parquet", "*.csv"))
    damage(folder)
    with pytest.raises(WorkbenchError, match=match) as e:
        Calibration(folder)
    assert "\n" not in str(e.value) and str(folder) in str(e.value)
    assert e.value.field == "calibration" and str(e.value).startswith(f"--calibration {folder}")  # a FieldError


@pytest.mark.parametrize("name,content,match,ask", [
    ("ranks.parquet", b"PAR1 truncated", "ranks.parquet is not a readable parquet file", "ranks"),
    ("ranks.parquet", None, "should have columns prompt_id, position, head_1..head_K", "ranks"),
    ("continuations.parquet", b"garbage", "continuations.parquet is not a readable continuations file",
     "typical_context"),
])
@pytest.mark.unit
def test_bad_files_fail_in_one_line_on_first_use(tmp_path, name, content, match, ask):
    folder = tmp_path / "c"
    shutil.copytree(CAL, folder, ignore=shutil.ignore_patterns("*.csv"))
    if content is None:
        pd.DataFrame({"prompt_id": ["a"], "rank": [0]}).to_parquet(folder / name)
    else:
        (folder / name).write_bytes(content)
    cal = Calibration(folder)
    with pytest.raises(WorkbenchError, match=match) as e:
        getattr(cal, ask)()
    assert "\n" not in str(e.value)
    assert e.value.field == "calibration" and e.value.words({"calibration": "'Calibration'"}).startswith(
        f"'Calibration' {folder}: ")  # the app names its control, the CLI the flag


@pytest.mark.unit
def test_meta_of_version_1_reads_through_its_upgrade(tmp_path):
    """meta.json without a version (every folder before it was kept) opens as version 2 through upgrade_meta alone;
    the committed demo calibration was rewritten through it."""
    from workbench.calibrate.folder import META_VERSION, read_meta, upgrade_meta

    committed = json.loads((CAL / "meta.json").read_text())
    assert committed["version"] == META_VERSION
    folder = tmp_path / "c"
    shutil.copytree(CAL, folder, ignore=shutil.ignore_patterns("continuations.parquet", "*.csv"))
    old = {k: v for k, v in committed.items() if k != "version"}
    (folder / "meta.json").write_text(json.dumps(old))
    assert read_meta(folder) == upgrade_meta(old) == committed
    assert Calibration(folder).accuracies("fit").tolist() == Calibration(CAL).accuracies("fit").tolist()
