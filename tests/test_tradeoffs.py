"""Speed/acceptance trade-offs on tiny random models: latency CSVs, the hardware-aware choice, the resumable
sweep, the markdown summary, and one-line errors. No timing asserts: only shapes, choices and exactness."""
import json
import math
import re

import numpy as np
import pandas as pd
import pytest

from workbench import REPO_ROOT, WorkbenchError
from workbench.calibrate.folder import Calibration
from workbench.calibrate.run import CalibrateConfig, calibrate
from workbench.cli import main
from workbench.cli.shared import parse_delta, parse_floats
from workbench.measure.latency import measure_latency
from workbench.measure.latency_file import HEADS_COLUMNS, LATENCY_COLUMNS, latency_table, read_latency
from workbench.measure.sweep import dense_near, run_sweep, sweep_configs, sweep_trees
from workbench.measure.sweep_file import SWEEP_COLUMNS, SWEEP_VERSION, read_sweep
from workbench.plan.fastest import value_source
from workbench.plan.report import summarize
from workbench.runtime.generation import prepare_prompt
from workbench.runtime.models import random_model
from workbench.trees.accuracies import write_accuracies
from workbench.trees.optimize import dense_tree, expected_length, optimal_tree
from workbench.trees.tree import load_tree

V1_SWEEP = REPO_ROOT / "tests" / "data" / "sweep-greedy-v1.csv"  # a sweep of decoder version 1, as written
PROMPTS = ["Tell me a story.", "What is 2+2?", "Name three colours.", "hi", "Why is the sky blue?",
           "Write a haiku about rain.", "List some fruits", "How do magnets work?"]


@pytest.fixture(scope="module")
def prompt_file(make_prompt_file):
    return make_prompt_file(PROMPTS)


@pytest.fixture(scope="module")
def calib(tiny_llama, prompt_file, tmp_path_factory):
    """A real (tiny) calibration folder: tied heads, top-4, 8 prompts with a 25% holdout."""
    out = tmp_path_factory.mktemp("cal") / "tiny"
    calibrate(CalibrateConfig(model=str(tiny_llama.model_dir), heads=str(tiny_llama.heads_dirs["2"]),
                              prompts=str(prompt_file), name="tiny", out=out, holdout=0.25, max_new_tokens=12, topk=4,
                              budgets=(3,), batch_size=8, device="cpu"), progress=False)
    return out


def _error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.strip().splitlines()
           if not line.startswith("Loading weights")]  # transformers' own progress bar
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def synthetic_latency(sizes, scale=24.0, context=128) -> pd.DataFrame:
    """t(n) grows quadratically past a flat region: an interior optimum, like a saturated GPU."""
    return pd.DataFrame(dict(model="synthetic", device="test", dtype="float32", context=context, tokens=sizes,
                             seconds=[0.01 * (1 + (n / scale) ** 2) for n in sizes]))


# ----------------------------------------------------------------------------------------------- latency

def test_measure_latency_rows_and_columns(tiny_llama):
    df = measure_latency(tiny_llama.model, sizes=[2, 8, 4], contexts=[16, 40], repeats=2, warmup=1,
                         heads=tiny_llama.heads["2"], label="tiny", progress=False)
    assert list(df.columns[:len(LATENCY_COLUMNS)]) == LATENCY_COLUMNS
    assert len(df) == 2 * 4  # 1 is always measured next to the requested sizes
    for ctx, rows in df.groupby("context"):
        assert rows["tokens"].tolist() == [1, 2, 4, 8]
        assert rows.loc[rows["tokens"] == 1, "relative"].item() == 1.0
    assert (df["seconds"] > 0).all() and set(df["context"]) == {16, 40}
    assert set(df["device"]) == {"cpu"} and set(df["dtype"]) == {"float32"}
    # the spread of the 2 rounds, not one number: ordered, and the median is `seconds`
    assert set(df["batch"]) == {1} and (df["repeats"] == 2).all()
    order = df[["seconds_min", "seconds_q1", "seconds", "seconds_q3", "seconds_max"]].to_numpy()
    assert (np.diff(order, axis=1) >= 0).all()
    assert np.allclose(df["seconds"], (df["seconds_min"] + df["seconds_max"]) / 2)  # the median of two

from helpers import fastest_on


def test_measure_latency_per_batch_size(tiny_llama):
    """Every (batch, context, tokens) is timed; t(B, n) relative to t(B, 1) of the same batch size and context."""
    df = measure_latency(tiny_llama.model, sizes=[2, 4], contexts=[16], repeats=2, warmup=1,
                         heads=tiny_llama.heads["2"], label="tiny", progress=False, batches=[1, 3])
    assert sorted(zip(df["batch"], df["tokens"])) == [(b, n) for b in (1, 3) for n in (1, 2, 4)]
    for _, rows in df.groupby(["batch", "context"]):
        assert rows.loc[rows["tokens"] == 1, "relative"].item() == 1.0
        assert np.allclose(rows["relative"], rows["seconds"] / rows.loc[rows["tokens"] == 1, "seconds"].item())
    assert (df["repeats"] == 2).all() and (df["seconds_q1"] <= df["seconds_q3"]).all()


def test_latency_cli_batch_flag(tmp_path, capsys):
    """`latency --batch` writes the batch and spread columns for every batch size asked."""
    out = tmp_path / "l.csv"
    argv = ["latency", "--random-config", "tiny", "--sizes", "2", "--context", "8", "--repeats", "3", "--warmup", "0",
            "--device", "cpu", "--out", str(out)]
    assert main(argv + ["--batch-sizes", "1"]) == 0
    df = read_latency(out)
    bare = [c for c in LATENCY_COLUMNS if c not in HEADS_COLUMNS]  # no --heads: the bare forward, no heads' cost
    assert list(df.columns[:len(bare)]) == bare and set(df["batch"]) == {1}
    assert (df["repeats"] == 3).all() and "q1..q3" in capsys.readouterr().err
    assert main(argv + ["--batch-sizes", "0,2"]) == 2
    assert "--batch-sizes" in _error_line(capsys)
    assert main(argv + ["--batch", "1,2"]) == 2  # the old spelling: one line naming the new one
    assert _error_line(capsys) == "error: --batch: this flag is now --batch-sizes B1,B2,.."
    assert main(argv + ["--batch-sizes", "1,2"]) == 0
    df = read_latency(out)
    assert sorted(zip(df["batch"], df["tokens"])) == [(1, 1), (1, 2), (2, 1), (2, 2)]


def test_latency_cli_default_path_in_calibration_folder(tmp_path, monkeypatch, capsys):
    """Without --out the CSV lands in the calibration folder made for that model."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "calibration" / "a-other").mkdir(parents=True)
    (tmp_path / "calibration" / "a-other" / "meta.json").write_text(json.dumps({"model": "someone-else"}))
    (tmp_path / "calibration" / "mine").mkdir()
    (tmp_path / "calibration" / "mine" / "meta.json").write_text(json.dumps({"model": "random:tiny"}))
    assert main(["latency", "--random-config", "tiny", "--sizes", "2,3", "--context", "8", "--repeats", "1",
                 "--warmup", "0", "--device", "cpu"]) == 0
    df = read_latency(tmp_path / "calibration" / "mine" / "latency-cpu.csv")
    assert df["tokens"].tolist() == [1, 2, 3] and set(df["model"]) == {"random:tiny"}


def test_random_config_shapes():
    m = random_model("tiny,layers=1,vocab=200", device="cpu")
    assert m.config.num_hidden_layers == 1 and m.get_input_embeddings().weight.shape == (200, 64)
    assert m.config.num_key_value_heads == 2


# ----------------------------------------------------------------------------------------------- hardware-aware

def _acc(seed=0, k=4, r=5):
    rng = np.random.default_rng(seed)
    return np.sort(rng.dirichlet(np.ones(r + 1), size=k)[:, :r] * rng.uniform(0.5, 1, (k, 1)), axis=1)[:, ::-1]


def _brute_force_best(acc, df):
    """Argmax over budgets of expected length / relative cost, every tree built and priced independently (t at the
    next measured size up)."""
    sizes, secs = df["tokens"].to_numpy(), df["seconds"].to_numpy()
    best = None
    for b in range(1, sizes.max()):
        length = expected_length(optimal_tree(acc, b), acc)
        s = length / (secs[np.searchsorted(sizes, b + 1)] / secs[np.searchsorted(sizes, 1)])
        if best is None or s > best[1] + 1e-12:
            best = (b, s)
    return best


@pytest.mark.unit
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_fastest_tree_is_the_argmax_of_predicted_speedup(seed):
    """plan/fastest.py (plan's ranking at one batch size) picks what a brute force over every budget picks."""
    acc = _acc(seed)
    df = synthetic_latency([1, 2, 4, 8, 16, 32, 64], scale=12 + 8 * seed)
    table, _ = latency_table(df)
    res = fastest_on(value_source(acc), table, curve=True)
    b, s = _brute_force_best(acc, df)
    assert s > 1 and res["best"] is res["tree"]  # speculation wins here, so the choice is the tree
    assert res["tree"].nodes == b and math.isclose(res["tree"].speedup, s, rel_tol=1e-9)
    assert set(res["tree"].tree.paths) == set(optimal_tree(acc, b).paths)
    assert [c.nodes for c in res["curve"]] == list(range(1, 64))
    assert 1 < b < 63  # the synthetic cost curve puts the optimum inside, so the test can fail


@pytest.mark.unit
def test_optimize_latency_cli(tmp_path, capsys):
    acc = _acc(3)
    write_accuracies(tmp_path / "acc.csv", acc)
    lat = pd.concat([synthetic_latency([1, 2, 4, 8, 16, 32, 64], 16, 128),
                     synthetic_latency([1, 2, 4, 8, 16, 32, 64], 60, 1024)])
    lat.to_csv(tmp_path / "lat.csv", index=False)
    argv = ["optimize", "--accuracies", str(tmp_path / "acc.csv"), "--latency", str(tmp_path / "lat.csv")]
    assert main(argv) == 2  # two contexts and no calibration to choose by
    assert "--context" in _error_line(capsys)
    for ctx in (128, 1024):
        assert main(argv + ["--context", str(ctx), "--out", str(tmp_path / "t.json"),
                            "--curve-out", str(tmp_path / "c.csv")]) == 0
        tree = json.loads((tmp_path / "t.json").read_text())
        b, s = _brute_force_best(acc, lat[lat["context"] == ctx])
        assert tree["budget"] == b and tree["context"] == ctx and math.isclose(tree["predicted_speedup"], s)
        assert len(load_tree(tree["medusa_choices"]).paths) == b
        curve = pd.read_csv(tmp_path / "c.csv")
        assert curve["budget"].tolist() == list(range(1, 64))
        assert np.allclose(curve["speedup"], curve["batch_tokens_per_step"] / curve["relative_latency"])
        assert curve["speedup"].idxmax() == b - 1


@pytest.mark.unit
def test_optimize_latency_at_one_batch_size(tmp_path, capsys):
    """--batch-sizes B reads that batch size's rows of a batched CSV: a steeper cost per token, a smaller tree."""
    acc = _acc(3)
    write_accuracies(tmp_path / "acc.csv", acc)
    sizes = [1, 2, 4, 8, 16, 32, 64]
    lat = pd.concat([synthetic_latency(sizes, 24).assign(batch=1), synthetic_latency(sizes, 6).assign(batch=8)])
    lat.to_csv(tmp_path / "lat.csv", index=False)
    argv = ["optimize", "--accuracies", str(tmp_path / "acc.csv"), "--latency", str(tmp_path / "lat.csv"),
            "--out", str(tmp_path / "t.json")]
    budgets = {}
    for b in (1, 8):
        assert main(argv + ["--batch-sizes", str(b)]) == 0
        capsys.readouterr()
        tree = json.loads((tmp_path / "t.json").read_text())
        assert tree["batch_size"] == b and tree["budget"] == _brute_force_best(acc, lat[lat["batch"] == b])[0]
        budgets[b] = tree["budget"]
    assert budgets[8] < budgets[1]
    assert main(argv + ["--batch-sizes", "4"]) == 2
    assert "no rows for batch size(s) 4 (measured: 1, 8)" in _error_line(capsys)
    assert main(["optimize", "--accuracies", str(tmp_path / "acc.csv"), "--budget", "4", "--batch-sizes", "2"]) == 2
    assert "--latency" in _error_line(capsys)
    assert main(argv + ["--batch-size", "8"]) == 2  # the old spelling: one line naming the new one
    assert _error_line(capsys) == "error: --batch-size: this flag is now --batch-sizes B"


def test_optimize_latency_picks_context_of_calibration(calib, tmp_path, capsys):
    """The calibration's prompts are ~40 tokens: rows at context 32 are used, not those at 4096."""
    lat = pd.concat([synthetic_latency([1, 2, 4, 8, 16], 4, 32), synthetic_latency([1, 2, 4, 8, 16], 1000, 4096)])
    lat.to_csv(tmp_path / "lat.csv", index=False)
    assert main(["optimize", "--calibration", str(calib), "--prediction", "joint", "--latency", str(tmp_path / "lat.csv"),
                 "--out", str(tmp_path / "t.json")]) == 0
    assert json.loads((tmp_path / "t.json").read_text())["context"] == 32


@pytest.mark.unit
def test_latency_table_checks():
    df = synthetic_latency([1, 4, 16])
    assert latency_table(df, target=1e6)[1] == 128
    with pytest.raises(WorkbenchError, match="no rows for context 5"):
        latency_table(df, context=5)
    with pytest.raises(WorkbenchError, match="1-token row"):
        latency_table(synthetic_latency([2, 4]))
    with pytest.raises(WorkbenchError, match="several setups"):
        latency_table(pd.concat([df, df.assign(device="other")]))


# ----------------------------------------------------------------------------------------------- sweep

@pytest.mark.unit
def test_parsers():
    assert parse_floats("0.01:0.25:0.04", "--epsilon") == [0.01, 0.05, 0.09, 0.13, 0.17, 0.21, 0.25]
    assert parse_floats("0.7,0", "--temperature") == [0.0, 0.7]
    assert parse_delta("sqrt") == "sqrt" and parse_delta("0.3") == 0.3
    for bad in ("0.25:0.01:0.04", "0.1:0.2:0", "0.1:0.2", "a,b", ""):
        with pytest.raises(WorkbenchError):
            parse_floats(bad, "--epsilon")
    with pytest.raises(WorkbenchError, match="unknown"):
        parse_delta("cube")


@pytest.mark.unit
def test_dense_near_sizes():
    """Budget 64, depths 1..5, s <= 10: per depth the count sum_j s^j nearest 64 is 10, 56 (s=7), 84 (s=4),
    30 (s=2) and 62 (s=2); only those within a factor 1.5 (42.7..96) are kept."""
    trees = dense_near(64, 5)
    assert [(t.depth, t.nodes) for t in trees] == [(2, 56), (3, 84), (5, 62)]
    for t in trees:
        assert t.paths == dense_tree([t.max_rank + 1] * t.depth).paths
    assert [t.nodes for t in dense_near(3, 1)] == [3]


@pytest.mark.unit
def test_sweep_configs_greedy_once_per_tree():
    trees = [(load_tree("[[0], [1]]"), "given"), (load_tree("[[0], [0, 0]]"), "given")]
    cfg = sweep_configs(trees, [0.0, 0.7], [0.05, 0.09, 0.13], "sqrt")
    assert len(cfg) == 2 * (1 + 3)
    assert len({c["config"] for c in cfg}) == len(cfg)
    typ = [c for c in cfg if c["acceptance"] == "typical"]
    assert all(math.isclose(c["delta"], math.sqrt(c["epsilon"])) for c in typ)


def test_sweep_batch_sizes_give_one_row_per_configuration_and_batch(tiny_llama, prompt_file, tmp_path, capsys):
    """--batch-sizes 1,3: every configuration (and vanilla) at each batch size, speeds against vanilla at the same
    batch size, greedy exact at both; the format's version is on every row; a batch larger than the prompts is one line."""
    out = tmp_path / "batched.csv"
    base = ["sweep", "--model", str(tiny_llama.model_dir), "--heads", str(tiny_llama.heads_dirs["2"]),
            "--trees", "[[0],[0,0]]", "mc_sim_7b_63", "--prompts", str(prompt_file), "--limit", "5",
            "--max-new-tokens", "8", "--device", "cpu", "--quiet", "--out", str(out)]
    assert main(base + ["--batch-sizes", "1,3"]) == 0
    df = pd.read_csv(out)
    assert sorted(df["batch_size"].unique()) == [1, 3] and len(df) == 2 * (1 + 2)
    assert (df.groupby("batch_size")["kind"].apply(lambda k: (k == "vanilla").sum()) == 1).all()
    assert (df["exact_match"] == 1.0).all() and (df["version"] == SWEEP_VERSION).all()
    assert (df.loc[df["kind"] == "vanilla", "speedup"] == 1.0).all() and (df["decoder_overhead"] > 0).all()
    for b, rows in df.groupby("batch_size"):  # tokens per step per sequence: the same accepted paths at any batch
        assert rows.set_index("tree")["tokens_per_step"].to_dict() == \
            df[df["batch_size"] == 1].set_index("tree")["tokens_per_step"].to_dict()
    assert main(base[:-1] + [str(tmp_path / "other.csv"), "--batch-sizes", "9"]) == 2
    assert "batch 9 but 5 prompts" in capsys.readouterr().err and not (tmp_path / "other.csv").exists()


def test_sweep_cli(tiny_llama, calib, prompt_file, tmp_path, capsys):
    out = tmp_path / "sweep.csv"
    argv = ["sweep", "--model", str(tiny_llama.model_dir), "--heads", str(tiny_llama.heads_dirs["2"]),
            "--calibration", str(calib), "--budgets", "2,4", "--dense", "--temperature", "0,0.7",
            "--epsilon", "0.05:0.13:0.08", "--prompts", "holdout", "--max-new-tokens", "8", "--device", "cpu",
            "--quiet", "--out", str(out)]
    assert main(argv) == 0
    df = pd.read_csv(out)
    assert list(df.columns) == SWEEP_COLUMNS
    trees = sweep_trees([2, 4], None, True, Calibration(calib), False, tiny_llama.heads["2"].num_heads)
    assert {k for _, k in trees} == {"optimal", "dense"}
    assert len(df) == 1 + len(trees) * (1 + 2)  # vanilla + per tree: greedy once, typical per epsilon
    assert df["config"].is_unique and (df["kind"] == "vanilla").sum() == 1
    greedy = df[df["acceptance"] == "greedy"]
    assert (greedy["exact_match"] == 1.0).all()
    assert (greedy["near_tie_divergences"] == 0).all() and (greedy["mismatches"] == 0).all()  # fp32: none at all
    assert greedy["epsilon"].isna().all()
    typ = df[df["acceptance"] == "typical"]
    assert typ["near_tie_divergences"].isna().all() and typ["mismatches"].isna().all()  # sampling: not greedy's
    assert sorted(typ["epsilon"].unique()) == [0.05, 0.13]
    assert np.allclose(typ["delta"], np.sqrt(typ["epsilon"]))
    assert (df["num_prompts"] == 2).all()  # the 25% holdout of 8 prompts
    assert (df["tokens_per_step"] >= 1).all() and (df["mean_logprob"] < 0).all()
    assert df["distinct_2"].between(0, 1).all()
    opt = df[df["kind"] == "optimal"]
    predictions = ["predicted_independent", "predicted_joint", "predicted_replay", "predicted_replay_fit"]
    assert opt[predictions].notna().all().all()
    # replaying the decoder over the calibration's own answers to these prompts is what the live decoder measured
    replayed = greedy.dropna(subset=["replay_swept"])
    assert len(replayed) >= len(opt[opt["acceptance"] == "greedy"])
    assert np.allclose(replayed["replay_swept"], replayed["tokens_per_step"], rtol=1e-12)
    assert main(argv) == 0  # everything done: nothing rerun, file unchanged
    assert pd.read_csv(out).equals(df)

    # the markdown summary, with a latency table covering every tree
    nodes = int(df["nodes"].max()) + 1
    synthetic_latency(list(range(1, nodes + 1)), 3).to_csv(tmp_path / "lat.csv", index=False)
    md = summarize(out, tmp_path / "lat.csv")
    for heading in ("Predicted vs measured", "Optimized vs dense", "Hardware-aware choice", "Typical acceptance"):
        assert f"## {heading}" in md
    g = greedy[greedy["kind"] != "vanilla"].dropna(subset=["predicted_independent"])
    speedup = g["predicted_independent"] * (1 + (1 / 3) ** 2) / (1 + ((g["nodes"] + 1) / 3) ** 2)
    best = set(g.loc[np.isclose(speedup, speedup.max(), rtol=1e-12, atol=0), "tree"])
    assert re.search(r"Hardware-aware pick: \*\*(.+?)\*\*", md).group(1) in best
    assert main(["sweep-report", str(out), "--latency", str(tmp_path / "lat.csv"),
                 "--out", str(tmp_path / "r.md"), "--figures", str(tmp_path / "fig")]) == 0
    assert (tmp_path / "r.md").read_text() == md
    pngs = sorted(p.name for p in (tmp_path / "fig").glob("*.png"))
    assert pngs == [f"sweep-{n}.png" for n in ("fig4a-tokens-per-step", "fig4b-speed", "fig5-typical", "latency",
                                                "predicted-vs-measured")]
    assert all((tmp_path / "fig" / n).read_bytes()[:4] == b"\x89PNG" for n in pngs)


def test_replay_of_calibration_answers_is_what_the_live_decoder_measures(tiny_llama, prompt_file, tmp_path):
    """With heads that actually accept tokens, the calibration's decoder replay on its held-out answers equals the
    live greedy decoder's tokens per step on those prompts, tree by tree (the sweep's `replay_swept` column)."""
    from workbench.decode.loop import medusa_generate
    from workbench.runtime.heads import load_heads
    from workbench.measure.sweep import calibration_predictions
    from workbench.train.distill import interleaved_prompts
    from workbench.train.medusa1 import TrainConfig, train_heads

    heads_dir = tmp_path / "heads"
    train_heads(tmp_path / "work", TrainConfig(prompts=interleaved_prompts([str(prompt_file)]) * 4, tokens=400,
                                               max_new_tokens=16, gen_batch=8, gen_dtype="float32", steps=60,
                                               batch_size=64, lr=1e-2, warmup=2, num_heads=3),
                str(tiny_llama.model_dir), heads_dir)
    cal = tmp_path / "cal"
    calibrate(CalibrateConfig(model=str(tiny_llama.model_dir), heads=str(heads_dir), prompts=str(prompt_file), name="t",
                              out=cal, holdout=0.5, max_new_tokens=16, topk=4, budgets=(3,), batch_size=8,
                              device="cpu"), progress=False)
    records = Calibration(cal).holdout_prompts()
    predict = calibration_predictions(Calibration(cal), 12, [pid for pid, _ in records])
    heads = load_heads(heads_dir)[0]
    rates = []
    for spec in ("[[0]]", "[[0], [1], [0, 0], [0, 1], [0, 0, 0]]", "[[0], [1], [2], [3], [0, 0], [1, 0]]"):
        tree = load_tree(spec)
        runs = [medusa_generate(tiny_llama.model, heads, tiny_llama.tokenizer, prepare_prompt(tiny_llama.tokenizer, t),
                                tree, max_new_tokens=12) for _, t in records]
        live = sum(len(r.token_ids) for r in runs) / sum(len(r.steps) for r in runs)
        assert predict(tree)["replay_swept"] == pytest.approx(live, rel=1e-12)
        rates.append(live)
    assert max(rates) > 1.2, rates  # the heads do get tokens accepted, so the equality is not 1 == 1


def test_sweep_reruns_when_the_heads_in_the_same_folder_change(tiny_llama, prompt_file, tmp_path):
    import torch

    from workbench.runtime.heads import save_heads

    heads = tiny_llama.heads["2"]
    folder = save_heads(heads, tmp_path / "heads", str(tiny_llama.model_dir), fmt=2)
    out = tmp_path / "sweep.csv"
    argv = ["sweep", "--model", str(tiny_llama.model_dir), "--heads", str(folder), "--trees", "[[0], [1]]",
            "--prompts", str(prompt_file), "--limit", "1", "--max-new-tokens", "4", "--quiet", "--out", str(out)]
    assert main(argv) == 0 and len(pd.read_csv(out)) == 2  # vanilla + one tree
    assert main(argv) == 0 and len(pd.read_csv(out)) == 2  # same heads: nothing to do
    retrained = type(heads)(heads.hidden_size, heads.vocab_size, heads.num_heads, heads.num_layers, heads.tied)
    retrained.load_state_dict({k: v + 0.01 * torch.randn_like(v) for k, v in heads.state_dict().items()})
    save_heads(retrained, folder, str(tiny_llama.model_dir), fmt=2)
    assert main(argv) == 0
    assert pd.read_csv(out)["run"].nunique() == 2  # new weights at the same path are a new run, not "done"


class Killed(Exception):
    pass


def test_sweep_resume_skips_done_rows(tiny_llama, tmp_path):
    tok, model, heads = tiny_llama.tokenizer, tiny_llama.model, tiny_llama.heads["2"]
    prompts = [prepare_prompt(tok, p) for p in PROMPTS[:2]]
    trees = [(load_tree("[[0], [1], [0, 0]]"), "given"), (load_tree("[[0], [0, 0], [0, 0, 0]]"), "given")]
    configs = sweep_configs(trees, [0.0, 0.7], [0.09], "sqrt")
    kw = dict(max_new_tokens=6, run_info=dict(model="tiny"), progress=False)

    def kill_after(n):
        seen = []

        def on_row(row):
            seen.append(row["config"])
            if len(seen) == n:
                raise Killed
        return on_row

    out = tmp_path / "s.csv"
    with pytest.raises(Killed):
        run_sweep(model, heads, tok, prompts, configs, out, on_row=kill_after(2), **kw)
    partial = out.read_text().splitlines()
    assert len(partial) == 1 + 2  # header, vanilla, first config
    resumed = []
    run_sweep(model, heads, tok, prompts, configs, out, on_row=lambda r: resumed.append(r["config"]), **kw)
    assert resumed == [c["config"] for c in configs[1:]]  # neither vanilla nor the done config ran again
    final = out.read_text().splitlines()
    assert final[:3] == partial  # done rows kept verbatim
    run_sweep(model, heads, tok, prompts, configs, out, on_row=kill_after(1), **kw)  # all done: no row runs
    assert out.read_text().splitlines() == final

    full = tmp_path / "full.csv"
    run_sweep(model, heads, tok, prompts, configs, full, **kw)
    a, b = pd.read_csv(out), pd.read_csv(full)
    assert a["config"].tolist() == b["config"].tolist() and a["run"].tolist() == b["run"].tolist()
    for col in ("tokens_per_step", "exact_match", "new_tokens", "steps", "distinct_2", "nodes"):
        assert a[col].tolist() == b[col].tolist(), col
    assert np.allclose(a["mean_logprob"], b["mean_logprob"])
    assert (a.loc[a["acceptance"] == "greedy", "exact_match"] == 1.0).all()

    # a version 1 sweep (before decode_speedup and the version column) resumes: upgraded, its cells kept verbatim
    older = tmp_path / "older.csv"
    v1 = pd.read_csv(out, dtype=str, keep_default_na=False).drop(columns=["decode_speedup", "version"]).iloc[:2]
    v1.rename(columns={"tokens_per_step": "acceleration_rate"}).to_csv(older, index=False)
    run_sweep(model, heads, tok, prompts, configs, older, **kw)
    d = pd.read_csv(older, dtype=str, keep_default_na=False)
    assert list(d.columns) == SWEEP_COLUMNS and len(d) == len(a) and (d["version"] == str(SWEEP_VERSION)).all()
    assert (d.iloc[:2][v1.columns] == v1).all().all()  # every cell as it was, tokens/step under its new name
    assert (d["decode_speedup"].iloc[:2] == "").all() and (d["decode_speedup"].iloc[2:] != "").all()

    # other settings are another run: nothing counts as done, old rows stay
    run_sweep(model, heads, tok, prompts, configs[:1], out, **dict(kw, max_new_tokens=4))
    c = pd.read_csv(out)
    assert len(c) == len(a) + 2 and c["run"].nunique() == 2


# ----------------------------------------------------------------------------------------------- errors

def test_bad_inputs_are_one_line_errors(tiny_llama, calib, prompt_file, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # no calibration/ here
    base = ["sweep", "--model", str(tiny_llama.model_dir), "--heads", str(tiny_llama.heads_dirs["2"]),
            "--device", "cpu", "--out", str(tmp_path / "o.csv"), "--prompts", str(prompt_file)]
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    blank = tmp_path / "blank.jsonl"
    blank.write_text(json.dumps({"instruction": "  "}) + "\n")
    cases = [
        (["--trees", "[[0]]", "--temperature", "0.7", "--epsilon", "0.25:0.01:0.04"], "--epsilon"),
        (["--trees", "[[0]]", "--epsilon", "0:0.2:0.1"], "--epsilon"),
        (["--trees", "[[0]]", "--delta", "cube"], "--delta"),
        (["--trees", "[[0]]", "--temperature", "-1"], "--temperature"),
        (["--budgets", "4"], "no calibration folder"),
        (["--budgets", "4,x", "--calibration", str(calib)], "--budgets"),
        (["--budgets", "4", "--calibration", str(tmp_path / "nope")], "--calibration"),
        (["--trees", "[[0]]", "--prompts", str(empty)], "empty"),
        (["--trees", "[[0]]", "--prompts", str(blank)], "no non-empty prompts"),
        (["--trees", "[[0]]", "--limit", "0"], "--limit"),
        (["--trees", str([[0] * d for d in range(1, 7)])], "exceeds the 5 Medusa heads"),
        (["--trees", "[[0], [0, 0], [1, 0, 0]]"], "parent [1, 0] is missing"),
    ]
    for extra, needle in cases:
        assert main(base + extra) == 2, extra
        assert needle in _error_line(capsys), extra
    (tmp_path / "o.csv").write_text("a,b\n1,2\n")
    assert main(base + ["--trees", "[[0]]", "--limit", "1", "--max-new-tokens", "2"]) == 2
    assert "not a sweep CSV" in _error_line(capsys)

    for argv, needle in [
        (["latency", "--random-config", "huge-model"], "unknown preset"),
        (["latency", "--random-config", "hidden=10,layers=1,heads=3,vocab=50"], "multiple"),
        (["latency", "--random-config", "tiny", "--sizes", "0,4"], "--sizes"),
        (["latency", "--random-config", "tiny,max_positions=512", "--context", "600", "--sizes", "2", "--device", "cpu",
          "--out", str(tmp_path / "l.csv")], "exceeds"),
        (["optimize", "--calibration", str(calib), "--latency", str(tmp_path / "missing.csv")], "no such file"),
        (["optimize", "--calibration", str(calib), "--latency", str(empty)], "--latency"),
        (["sweep-report", str(tmp_path / "missing.csv")], "no such file"),
        (["sweep-report", str(tmp_path / "o.csv"), "--figures", str(empty)], "--figures"),
    ]:
        assert main(argv) == 2, argv
        assert needle in _error_line(capsys), argv


def test_sweep_trees_replay_picks_what_the_decoder_replay_prefers(calib):
    from workbench.calibrate.ranks import decoder_walk

    fit = Calibration(calib).ranks("fit")
    answers = fit[fit["position"] < 6]
    for t, kind in sweep_trees([1, 2, 3, 6], None, False, Calibration(calib), False, 3, max_rank=4, replay=6):
        b = int(t.name.rsplit("-", 1)[1])
        assert kind == "optimal" and t.nodes <= b
        rivals = [dense_tree([s] * d) for d in (1, 2, 3) for s in (1, 2, 3, 4)
                  if sum(s ** j for j in range(1, d + 1)) <= b]
        assert all(decoder_walk(t, answers) >= decoder_walk(r, answers) for r in rivals)


@pytest.mark.unit
def test_sweep_csvs_of_version_1_are_upgraded_by_one_function(tmp_path):
    """A sweep of version 1 (tests/data: before batch sizes, step timing, the version column; tokens/step named
    acceleration_rate) and one with the earliest prediction names read through upgrade_sweep alone: today's
    columns, the same values, the same report; a newer version, or a file lacking columns, is one line."""
    from workbench.calibrate.folder import PREDICTIONS
    from workbench.measure.sweep_file import read_sweep, upgrade_sweep

    raw = pd.read_csv(V1_SWEEP)
    assert "version" not in raw.columns and "acceleration_rate" in raw.columns and "batch_size" not in raw.columns
    df = read_sweep(V1_SWEEP)
    assert list(upgrade_sweep(raw).columns) != SWEEP_COLUMNS and set(upgrade_sweep(raw).columns) == set(SWEEP_COLUMNS)
    assert set(SWEEP_COLUMNS) <= set(df.columns) and (df["batch_size"] == 1).all() and (df["version"] == SWEEP_VERSION).all()
    assert df["tokens_per_step"].tolist() == raw["acceleration_rate"].tolist() and df["decode_speedup"].isna().all()
    earliest = {"predicted_independent": "predicted_tokens_per_step", "predicted_replay": "calibration_holdout",
                "predicted_replay_fit": "predicted_walk", "replay_swept": "replay"}
    raw.rename(columns=earliest).to_csv(tmp_path / "old.csv", index=False)
    pd.testing.assert_frame_equal(read_sweep(tmp_path / "old.csv"), df, check_like=True)
    assert set(PREDICTIONS) <= set(df.columns)
    md = summarize(tmp_path / "old.csv")
    assert md == summarize(V1_SWEEP).replace(V1_SWEEP.name, "old.csv")
    assert "| predicted_independent | predicted_joint | predicted_replay |" in md
    newer = df.assign(version=SWEEP_VERSION + 1)
    newer.to_csv(tmp_path / "newer.csv", index=False)
    with pytest.raises(WorkbenchError, match=f"version .{SWEEP_VERSION + 1}., but this workbench reads sweep CSVs of "
                                             f"version {SWEEP_VERSION}"):
        read_sweep(tmp_path / "newer.csv")
    df.drop(columns=["speedup"]).to_csv(tmp_path / "short.csv", index=False)
    with pytest.raises(WorkbenchError, match="missing column.s. speedup"):
        read_sweep(tmp_path / "short.csv")


@pytest.mark.unit
def test_has_typical_means_rows_with_an_epsilon(tmp_path):
    """Fig. 5 needs typical-acceptance rows: the committed typical sweep has them, the greedy one has none."""
    from workbench import REPO_ROOT
    from workbench.measure.sweep_file import has_typical, read_sweep

    typical, greedy = (read_sweep(REPO_ROOT / "docs" / "results" / f"sweep-{k}-cpu.csv") for k in ("typical", "greedy"))
    assert has_typical(typical) and not has_typical(greedy)


@pytest.mark.unit
def test_find_csvs_by_the_columns_their_reader_needs(tmp_path):
    """The app's file pickers list the committed sweeps and the calibration's latency CSV, each by its reader's
    required columns, and skip other CSVs and unreadable files."""
    from workbench import REPO_ROOT
    from workbench.core.io import find_csvs
    from workbench.measure.latency_file import LATENCY_REQUIRED
    from workbench.measure.sweep_file import SWEEP_REQUIRED, read_sweep

    results, cal = REPO_ROOT / "docs" / "results", REPO_ROOT / "calibration"
    sweeps = find_csvs([results, cal, tmp_path / "missing"], SWEEP_REQUIRED)
    assert sweeps == sorted(results.glob("sweep-*.csv")) and all(len(read_sweep(f)) for f in sweeps)
    committed = set(results.glob("latency-*.csv")) | set(results.rglob("*-latency.csv"))  # (vLLM's surfaces too)
    assert find_csvs([results, cal], LATENCY_REQUIRED) == sorted(committed) + sorted(cal.glob("*/latency-*.csv"))
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "lat.csv").write_text("context,tokens,seconds\n128,1,0.1\n")
    (tmp_path / "acc.csv").write_text("head,rank,accuracy\n1,1,0.5\n")
    (tmp_path / "binary.csv").write_bytes(b"\xff\xfe\x00tokens")
    assert find_csvs([tmp_path], LATENCY_REQUIRED) == [tmp_path / "sub" / "lat.csv"]
    assert find_csvs([tmp_path], SWEEP_REQUIRED) == []


def test_a_plan_is_checked_live_per_batch_size(tiny_llama, calib, prompt_file, tmp_path, capsys):
    """plan -> sweep --plan -> sweep-report --plan: the plan's choice and runner-up are decoded at their own batch
    size against vanilla at that size, and the report puts each predicted speedup beside the measured one."""
    sizes = list(range(1, 9))
    lat = pd.concat([pd.DataFrame(dict(model="synthetic", device="test", dtype="float32", batch=b, context=16,
                                       tokens=sizes, seconds=[0.01 * (1 + slope * (n - 1)) for n in sizes]))
                     for b, slope in ((1, 0.01), (2, 2.0))])  # batch 1: trees nearly free; batch 2: dear
    lat.to_csv(tmp_path / "lat.csv", index=False)
    plan_file, sweep_csv = tmp_path / "plan.json", tmp_path / "plan-sweep.csv"
    assert main(["plan", "--calibration", str(calib), "--latency", str(tmp_path / "lat.csv"), "--batch-sizes", "1,2",
                 "--out", str(plan_file)]) == 0
    plan = json.loads(plan_file.read_text())
    assert [r["kind"] for r in plan["plans"]][1] == "none" and plan["plans"][0]["kind"] != "none"
    assert main(["sweep", "--model", str(tiny_llama.model_dir), "--heads", str(tiny_llama.heads_dirs["2"]),
                 "--plan", str(plan_file), "--prompts", str(prompt_file), "--limit", "4", "--max-new-tokens", "8",
                 "--device", "cpu", "--quiet", "--out", str(sweep_csv)]) == 0
    df = pd.read_csv(sweep_csv)
    assert set(df.loc[df["kind"] == "plan", "batch_size"]) == {1, 2}  # each plan tree at its own batch size only
    assert df.loc[df["kind"] == "plan", "tree"].str.match(r"plan_b\d_(choice|runner_up)_").all()
    capsys.readouterr()
    assert main(["sweep-report", str(sweep_csv), "--plan", str(plan_file)]) == 0
    md = capsys.readouterr().out
    assert "## Plan per batch size: predicted vs measured" in md and "## Goodput per batch size" in md
    from workbench.plan.plan_file import plan_check
    check = plan_check(plan, read_sweep(sweep_csv))
    choice = check[check["role"] == "choice"].set_index("batch_size")
    assert list(choice.index) == [1, 2] and choice.loc[2, "measured_speedup"] == 1.0  # none is vanilla itself
    assert np.isclose(choice.loc[1, "speedup_err_pct"],
                      100 * (choice.loc[1, "predicted_speedup"] / choice.loc[1, "measured_speedup"] - 1))
    assert (check["exact_match"] == 1.0).all()
    # the prediction is checked against the decoding phase's speedup; a sweep of before that column, end to end
    row = df[(df["kind"] == "plan") & (df["batch_size"] == 1) & df["tree"].str.contains("_choice_")].iloc[0]
    assert choice.loc[1, "measured_speedup"] == row["decode_speedup"] != row["speedup"]
    assert choice.loc[1, "measured_phase"] == "decoding phase"
    old = read_sweep(sweep_csv).drop(columns=["decode_speedup"])
    again = plan_check(plan, old).set_index(["batch_size", "role"])
    assert again.loc[(1, "choice"), "measured_speedup"] == row["speedup"]
    assert again.loc[(1, "choice"), "measured_phase"].startswith("end to end")
    assert main(["sweep", "--plan", str(plan_file), "--trees", "[[0]]", "--out", str(tmp_path / "x.csv")]) == 2


def test_a_plans_per_step_tree_is_checked_live(tiny_llama, calib, prompt_file, tmp_path, capsys):
    """A table whose per-step trees cost less than static ones at batch 1 and a calibration that replays them
    (topk.parquet recorded): the plan picks a per-step tree there; `sweep --plan` decodes it as one (chosen inside
    the step from the plan's envelope), greedy output identical to vanilla's, its live tokens/step the replay of
    these prompts' answers, and plan_check puts its prediction beside the measurement."""
    import shutil

    from workbench.calibrate.topk import record_topk
    from workbench.measure.sweep_file import read_sweep
    from workbench.plan.plan_file import plan_check
    from workbench.runtime.models import load_model_and_heads

    cal = tmp_path / "cal"
    shutil.copytree(calib, cal)
    record_topk(cal, *load_model_and_heads(str(tiny_llama.model_dir), str(tiny_llama.heads_dirs["2"]), "cpu"),
                batch=4)
    sizes, rows = list(range(1, 9)), []
    for b, slope in ((1, 0.2), (2, 2.0)):
        for policy, factor in (("static", 1.0), ("dynamic", 0.3)):
            rows += [dict(model="synthetic", device="test", dtype="float32", batch=b, context=16, tokens=n,
                          seconds=0.01 * (1 + slope * (n - 1) * factor), policy=policy,
                          envelope=7 if policy == "dynamic" else None, engine="workbench", version=4)
                     for n in sizes if policy == "static" or n > 1]
    pd.DataFrame(rows).to_csv(tmp_path / "lat.csv", index=False)
    plan_file, sweep_csv = tmp_path / "plan.json", tmp_path / "plan-sweep.csv"
    assert main(["plan", "--calibration", str(cal), "--latency", str(tmp_path / "lat.csv"), "--batch-sizes", "1,2",
                 "--out", str(plan_file)]) == 0
    plan = json.loads(plan_file.read_text())
    one = plan["plans"][0]
    env = plan["latency"]["dynamic"]["medusa_choices"]  # the calibration's best paths, up to the 7 timed
    assert one["kind"] == "dynamic" and one["medusa_choices"] == env and one["nodes"] <= len(env) <= 7, plan["plans"]
    assert main(["sweep", "--model", str(tiny_llama.model_dir), "--heads", str(tiny_llama.heads_dirs["2"]),
                 "--plan", str(plan_file), "--calibration", str(cal), "--prompts", "holdout", "--max-new-tokens",
                 "12", "--device", "cpu", "--quiet", "--out", str(sweep_csv)]) == 0
    df = read_sweep(sweep_csv)
    row = df[(df["batch_size"] == 1) & df["tree"].str.startswith(f"dynamic_{one['nodes']}_of_{len(env)}_plan_b1_choice")]
    assert len(row) == 1 and row["exact_match"].iloc[0] == 1.0 and row["nodes"].iloc[0] == one["nodes"]
    assert row["tokens_per_step"].iloc[0] == pytest.approx(row["replay_swept"].iloc[0])  # lossless: the replay
    check = plan_check(plan, df)
    got = check[(check["batch_size"] == 1) & (check["role"] == "choice")].iloc[0]
    assert got["kind"] == "dynamic" and got["measured_tokens_per_step"] == row["tokens_per_step"].iloc[0]
    assert got["predicted_speedup"] == one["predicted_speedup"] and got["measured_speedup"] > 0


def test_sweep_puts_per_step_trees_beside_static_ones_at_equal_budgets(tiny_llama, calib, prompt_file, tmp_path):
    """sweep --envelope: each swept size the envelope holds also as a per-step tree (kind dynamic, as many nodes),
    decoded on the same prompts against the same vanilla, greedy output identical; a calibration without
    topk.parquet (one calibrated before calibrate recorded it) gives those rows no prediction rather than an error."""
    import shutil

    calib = shutil.copytree(calib, tmp_path / "cal")
    (calib / "topk.parquet").unlink()
    out = tmp_path / "sweep.csv"
    assert main(["sweep", "--model", str(tiny_llama.model_dir), "--heads", str(tiny_llama.heads_dirs["2"]),
                 "--trees", "[[0], [1]]", "[[0], [0, 0], [1]]", "--envelope", "[[0], [1], [0, 0], [0, 1]]",
                 "--calibration", str(calib), "--prompts", str(prompt_file), "--limit", "3", "--max-new-tokens", "8",
                 "--batch-sizes", "1,2", "--device", "cpu", "--quiet", "--out", str(out)]) == 0
    df = pd.read_csv(out)
    dyn = df[df["kind"] == "dynamic"]
    assert sorted(zip(dyn["nodes"], dyn["batch_size"])) == [(2, 1), (2, 2), (3, 1), (3, 2)]
    assert dyn["tree"].str.match(r"dynamic_[23]_of_4_").all() and (df["exact_match"] == 1.0).all()
    static = df[df["kind"] == "given"]
    assert sorted(static["nodes"]) == [2, 2, 3, 3] and dyn["predicted_replay"].isna().all()
    assert main(["sweep", "--trees", "[[0], [1], [2]]", "--envelope", "[[0], [1]]", "--prompts", str(prompt_file),
                 "--model", str(tiny_llama.model_dir), "--heads", str(tiny_llama.heads_dirs["2"]),
                 "--out", str(tmp_path / "x.csv")]) == 2
