"""speed.py: one owner per speed quantity (pinned by an AST scan of the tree), its measured quantities on real
decodes, provenance of measurements, and the decoder-step latency surface."""
from __future__ import annotations

import ast
import math
import subprocess
import sys

import pandas as pd
import pytest

from workbench import REPO_ROOT, WorkbenchError
from workbench.core.provenance import differences, mismatch_warning, read_setting, setting, setting_cell
from workbench.core.speed import (acceptance_per_position, batch_tokens_per_step, decode_speedup, goodput, mean_step_s,
                                  measured_speedup, prediction_error, prefill_share, spread, step_times,
                                  tokens_per_step)

OWNER = "workbench/core/speed.py"
# Not measured speed: calibrate/ranks.py's replay is the *prediction* of tokens/step (its one owner); DecodeResult's
# mean_step_s and tokens_per_step properties are names that call speed.mean_step_s and speed.tokens_per_step.
ALLOWED = {("workbench/calibrate/ranks.py", "tokens / steps"),
           ("workbench/decode/loop.py", "def mean_step_s"), ("workbench/decode/loop.py", "def tokens_per_step")}
# Each quantity's formula as an expression shape; anywhere but speed.py it is a second owner.
SOURCES = [p for d in ("workbench", "bench", "app.py") for p in
           ((REPO_ROOT / d).rglob("*.py") if (REPO_ROOT / d).is_dir() else [REPO_ROOT / d])]


def _names(node) -> set[str]:
    return {n.attr if isinstance(n, ast.Attribute) else n.id for n in ast.walk(node)
            if isinstance(n, (ast.Attribute, ast.Name))}


def _second_owners(tree: ast.AST) -> list[str]:
    """Divisions that compute a speed quantity: tokens / steps (tokens per step), a goodput / another goodput or
    tokens_per_s / tokens_per_s (measured speedup), tokens_per_step / relative or t_verify / t_vanilla (predicted
    speedup), step / forward (decoder overhead), a / b - 1 (a prediction's error), and definitions of the speed
    functions."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name in (
                "speedup", "speedup_at", "speedup_range", "relative_latency", "goodput", "measured_speedup",
                "overhead", "decoder_overhead", "mean_step_s", "tokens_per_step", "acceptance_per_position",
                "prediction_error"):
            found.append(f"def {node.name} (line {node.lineno})")
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            left, right = " ".join(sorted(_names(node.left))).lower(), " ".join(sorted(_names(node.right))).lower()
            pairs = [("token", "step"), ("tokens_per_s", "tokens_per_s"), ("goodput", "goodput"),
                     ("step_times", "forward"), ("seconds", "tokens_per_s")]
            if any(a in left and b in right for a, b in pairs) and "prompt" not in right:
                found.append(f"{ast.unparse(node)[:60]} (line {node.lineno})")
        if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub) and isinstance(node.left, ast.BinOp)
                and isinstance(node.left.op, ast.Div) and isinstance(node.right, ast.Constant) and node.right.value == 1):
            found.append(f"{ast.unparse(node)[:60]} (line {node.lineno})")  # a / b - 1: a prediction's error
    return found


@pytest.mark.unit
def test_speed_quantities_have_one_owner():
    """No module but speed.py defines or computes a speed quantity (bench/ and the app included)."""
    offenders = {}
    for f in SOURCES:
        rel = f.relative_to(REPO_ROOT).as_posix()
        if rel == OWNER:
            continue
        hits = [h for h in _second_owners(ast.parse(f.read_text())) if (rel, h.split(" (line")[0]) not in ALLOWED]
        if hits:
            offenders[rel] = hits
    assert not offenders, f"speed quantities computed outside {OWNER}: {offenders}"


@pytest.mark.unit
def test_the_scan_finds_a_second_owner():
    """The scan is not blind: a copy of the tokens/step and speedup formulas is caught."""
    copy = "def f(r, v):\n    a = r.tokens / r.steps\n    return r.tokens_per_s / v.tokens_per_s\n"
    assert len(_second_owners(ast.parse(copy))) == 2
    assert len(_second_owners(ast.parse("err = 100 * (measured / predicted - 1)"))) == 1


@pytest.mark.unit
def test_prediction_error_is_relative_to_the_measurement():
    """One convention for every predicted-vs-measured column: +10% is a prediction 10% above what was measured,
    on floats and on columns alike; a zero measurement has no error."""
    assert prediction_error(1.1, 1.0) == pytest.approx(0.1) and prediction_error(0.9, 1.0) == pytest.approx(-0.1)
    assert prediction_error(1.032, 0.935) == pytest.approx(0.10374, abs=1e-5)   # not measured / predicted - 1
    assert list(prediction_error(pd.Series([2.0, 1.0]), pd.Series([1.0, 2.0]))) == [1.0, -0.5]
    assert math.isnan(prediction_error(1.0, 0.0))


def test_planner_and_latency_do_not_import_torch():
    code = "import sys, workbench.plan.rank, workbench.measure.latency_file, workbench.plan.recommend, workbench.core.speed; " \
           "print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_measured_quantities_on_a_real_decode(tiny_llama):
    from workbench.decode.loop import medusa_generate, vanilla_generate

    t = tiny_llama
    prompts = [[1, 5, 9, 3], [2, 7, 4, 4, 8]]
    med = medusa_generate(t.model, t.heads["2"], t.tokenizer, prompts, [[0], [0, 0], [1]], 12, eos_token_id=[])
    van = vanilla_generate(t.model, t.tokenizer, prompts, 12, eos_token_id=[])
    steps = sum(len(r.steps) for r in med)
    assert tokens_per_step([med]) == pytest.approx(24 / steps)
    assert tokens_per_step([van]) == 1.0
    p = acceptance_per_position([med], 2)
    accepted = [len(s.tokens) - 1 for r in med for s in r.steps]
    assert p == [sum(a >= 1 for a in accepted) / steps, sum(a >= 2 for a in accepted) / steps] and p[0] >= p[1]
    assert step_times([med]) == [s.time_s for s in max(med, key=lambda r: len(r.steps)).steps]
    assert mean_step_s([med]) == pytest.approx(max(r.decode_s for r in med) / max(len(r.steps) for r in med))
    assert measured_speedup([med], [van]) == pytest.approx(goodput([med]) / goodput([van]))
    # the decoding phase alone: the same tokens over each call's slowest decode; the whole batch's tokens/step
    assert decode_speedup([med], [van]) == pytest.approx(max(r.decode_s for r in van) / max(r.decode_s for r in med))
    assert batch_tokens_per_step([med]) == pytest.approx(12 / max(len(r.steps) for r in med))
    assert prefill_share([van]) == pytest.approx(max(r.prefill_s for r in van) / max(r.total_s for r in van))


@pytest.mark.unit
def test_spread_of_repeats():
    s = spread([3.0, 1.0, 2.0, 4.0])
    assert (s["min"], s["median"], s["max"], s["repeats"]) == (1.0, 2.5, 4.0, 4) and s["q1"] <= s["median"] <= s["q3"]
    assert spread([2.0])["q1"] == spread([2.0])["q3"] == 2.0


@pytest.mark.unit
def test_provenance_round_trip_and_mismatch():
    import pandas as pd

    a = setting("cpu", "torch.float32", 2, False)
    assert a["dtype"] == "float32" and a["threads"] == 2 and a["torch"] and "load_average" in a
    df = pd.DataFrame(dict(tokens=[1, 2], setting=[setting_cell(a)] * 2))
    assert read_setting(df) == a and read_setting(pd.DataFrame(dict(tokens=[1]))) is None
    b = dict(a, threads=1, load_average=9.0)
    assert differences(a, dict(a, load_average=9.0)) == []  # the load is recorded, not a different setting
    assert differences(a, b) == ["threads 2 vs 1"]
    assert "threads 2 vs 1" in mismatch_warning(a, b, "plan") and mismatch_warning(a, a, "plan") is None
    assert "unknown" in differences(None, a)[0]


def test_decoder_step_surface(tiny_llama):
    """The decoder's own step, timed on real decodes at batch sizes 1 and 2: every (batch, tokens) with its spread,
    the bare forward beside it, the context the steps saw, and the setting."""
    from workbench.measure.latency_file import LATENCY_COLUMNS, latency_surface
    from workbench.measure.latency import latency_tree, measure_decoder_steps, timed_depth

    t = tiny_llama
    prompts = [[1, 5, 9, 3], [2, 7, 4, 4, 8], [3, 3, 1]]
    df = measure_decoder_steps(t.model, t.heads["2"], t.tokenizer, prompts, sizes=[3], batches=[1, 2], repeats=2,
                               warmup=0, max_new_tokens=6, label="tiny", progress=False)
    assert list(df.columns[:len(LATENCY_COLUMNS)]) == LATENCY_COLUMNS
    assert sorted(zip(df["batch"], df["tokens"])) == [(1, 1), (1, 3), (2, 1), (2, 3)]
    assert (df["repeats"] == 2).all() and (df["forward_seconds"] > 0).all()
    assert df["context"].nunique() == 1 and 3 <= df["context"].iloc[0] <= 5 + 6
    assert read_setting(df)["mode"] == "decoder-step"
    # the heads each step ran and their cost at that batch size: vanilla none, the 2-node tree its depth
    depth = latency_tree(2, timed_depth(t.heads["2"])).depth
    assert dict(zip(df["tokens"], df["depth"])) == {1: 0, 3: depth}
    assert (df.loc[df["tokens"] == 1, "heads_seconds"] == 0).all() and (df.loc[df["tokens"] == 3, "heads_seconds"] > 0).all()
    surface, ctx = latency_surface(df, [1, 2])
    assert set(surface) == {1, 2} and surface[2]["spread"] is not None
    assert surface[2]["head_cost"]["depth"] == {1: 0, 3: depth} and set(surface[2]["head_cost"]["seconds"]) == {0, depth}


def test_decoder_step_surface_times_per_step_trees_beside_static_ones(tiny_llama, tmp_path):
    """With an envelope each round also times the per-step tree of every size the envelope holds: rows of policy
    dynamic, relative to the same vanilla step, with the envelope's heads; the static table reads as before and
    the dynamic one as a table of its own (read_latency's policy)."""
    from workbench.measure.latency import measure_decoder_steps
    from workbench.measure.latency_file import latency_surface, read_latency
    from workbench.trees.tree import make_tree

    t = tiny_llama
    envelope = make_tree([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]], name="env6")
    df = measure_decoder_steps(t.model, t.heads["2"], t.tokenizer, [[1, 5, 9, 3], [2, 7, 4, 4, 8]], sizes=[3, 8],
                               batches=[1, 2], repeats=2, warmup=0, max_new_tokens=6, label="tiny", progress=False,
                               envelope=envelope)
    dyn = df[df["policy"] == "dynamic"]
    assert sorted(zip(dyn["batch"], dyn["tokens"])) == [(1, 3), (2, 3)]  # 7 nodes: more than the envelope holds
    assert (dyn["envelope"] == 6).all() and (dyn["depth"] == envelope.depth).all() and (dyn["heads_seconds"] > 0).all()
    assert sorted(zip(*df[df["policy"] == "static"][["batch", "tokens"]].to_numpy().T)) == \
        [(1, 1), (1, 3), (1, 8), (2, 1), (2, 3), (2, 8)]
    plain = dict(zip(df.loc[df["tokens"] == 1, "batch"], df.loc[df["tokens"] == 1, "seconds"]))
    for r in dyn.to_dict("records"):
        assert r["relative"] == pytest.approx(r["seconds"] / plain[r["batch"]]) and r["seconds_q1"] <= r["seconds"]
    f = tmp_path / "lat.csv"
    df.to_csv(f, index=False)
    static, dynamic = read_latency(f), read_latency(f, policy="dynamic")
    assert set(static["policy"]) == {"static"} and sorted(dynamic["tokens"]) == [1, 1, 3, 3]
    surface, _ = latency_surface(dynamic, [1, 2])
    assert surface[2]["seconds"][3] == pytest.approx(float(dyn.loc[dyn["batch"] == 2, "seconds"].iloc[0]))
    assert surface[1]["head_cost"]["depth"] == {1: 0, 3: envelope.depth}
    assert latency_surface(static, [1, 2])[0][1]["seconds"].keys() == {1, 3, 8}
    df[df["policy"] == "static"].to_csv(f, index=False)
    assert read_latency(f, policy="dynamic") is None


@pytest.mark.unit
def test_latency_policy_columns_are_checked_and_version_3_is_upgraded(tmp_path):
    """Version 3 (before the policy columns) reads as static steps; a dynamic row needs an envelope of at least
    its nodes, one per file; an unknown policy is one error line."""
    from workbench.measure.latency_file import LATENCY_VERSION, read_latency

    rows = [dict(batch=1, context=64, tokens=n, seconds=0.01 * n, engine="workbench", version=3) for n in (1, 2, 4)]
    f = tmp_path / "v3.csv"
    pd.DataFrame(rows).to_csv(f, index=False)
    df = read_latency(f)
    assert list(df["policy"]) == ["static"] * 3 and df["envelope"].isna().all() and (df["version"] == LATENCY_VERSION).all()
    assert read_latency(f, policy="dynamic") is None
    v4 = [dict(r, version=LATENCY_VERSION, policy="static", envelope=None) for r in rows]
    dyn = [dict(v4[1], policy="dynamic", envelope=8), dict(v4[2], policy="dynamic", envelope=8, seconds=0.05)]
    pd.DataFrame(v4 + dyn).to_csv(f, index=False)
    assert list(read_latency(f, policy="dynamic")["seconds"]) == [0.01, 0.02, 0.05]
    for bad in ([dict(dyn[0], envelope=None)], [dict(dyn[1], envelope=2)], [dyn[0], dict(dyn[1], envelope=16)],
                [dict(dyn[0], policy="greedy")], [dict(v4[0], policy="dynamic", envelope=8)]):
        pd.DataFrame(v4 + bad).to_csv(f, index=False)
        with pytest.raises(WorkbenchError, match="policy must be static or dynamic on every row"):
            read_latency(f)


@pytest.mark.unit
def test_latency_has_no_migration_mode(capsys):
    """`latency --mode heads` (it only completed tables written before the heads' cost was kept) is gone: refused
    by the parser in one line, as is its --table input."""
    from workbench.cli import main

    for argv in (["latency", "--mode", "heads"], ["latency", "--table", "x.csv"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:"), err


def test_decoder_step_costs_are_measured_against_a_reference_after_every_step(tiny_llama, monkeypatch):
    """The machine's speed jumps at random between steps (x0.5..x2) while a Medusa step of n tokens truly costs
    n/2 + 1 vanilla steps and a vanilla step 1.05 bare 1-token forwards: timing every step against the bare forward
    run right after it gives each size its true cost whatever the drift (whole calls timed one after another
    would carry it); t(1) is the median over rounds of each round's vanilla calls' median step."""
    import random
    import statistics
    import types

    import workbench.measure.latency as engine  # the names it calls, replaced where it looks them up
    from workbench.measure.latency import measure_decoder_steps

    decode = engine

    rng, speed = random.Random(0), [1.0]
    calls, size_of, real_setup = [], {}, engine.tree_setup

    def setup(tree, model):
        buf = real_setup(tree, model)
        size_of[id(buf)] = tree.nodes + 1
        return buf

    def generate(n, chunk, on_step):
        times, results = [], [types.SimpleNamespace(steps=[]) for _ in chunk]
        for _ in range(4):
            speed[0] = rng.uniform(0.5, 2.0)
            step = types.SimpleNamespace(time_s=0.01 * speed[0] * 1.05 * (1 if n == 1 else n / 2 + 1), cache_len=5)
            times.append(step.time_s)
            for r in results:
                r.steps.append(step)
            on_step([step] * len(chunk) if len(chunk) > 1 else step)
        calls.append((n, times))
        return results if len(chunk) > 1 else results[0]

    def probe(eng, buf, heads=None):  # the reference (no heads) or the tree's bare forward, at the current speed
        times = []
        return (lambda step: times.append(0.01 * speed[0] * (1 if heads is None else 0.9 * size_of[id(buf)]))), times

    monkeypatch.setattr(engine, "tree_setup", setup)
    monkeypatch.setattr(engine, "forward_probe", probe)
    monkeypatch.setattr(decode, "vanilla_generate", lambda model, tok, chunk, *a, on_step=None, **k:
                        generate(1, chunk, on_step))
    monkeypatch.setattr(decode, "medusa_generate", lambda m, h, tok, chunk, buf, *a, on_step=None, **k:
                        generate(size_of[id(buf)], chunk, on_step))
    t = tiny_llama
    df = measure_decoder_steps(t.model, t.heads["2"], t.tokenizer, [[1, 2, 3], [4, 5, 6]], sizes=[2, 3, 5],
                               batches=[1, 2], repeats=3, warmup=0, max_new_tokens=4, label="tiny", progress=False)
    assert [n for n, _ in calls[:5]] == [1, 2, 3, 5, 1] and len(calls) == 2 * 3 * 5
    for b, part in df.groupby("batch"):
        rel = dict(zip(part["tokens"], part["relative"]))
        for n in (2, 3, 5):
            assert rel[n] == pytest.approx(n / 2 + 1, rel=1e-9)
        first = 0 if b == 1 else 15
        rounds = [statistics.median([statistics.median(calls[first + 5 * r + k][1]) for k in (0, 4)])
                  for r in range(3)]
        assert part[part["tokens"] == 1]["seconds"].iloc[0] == pytest.approx(statistics.median(rounds), rel=1e-9)
    assert (df["repeats"] == 3).all() and df["context"].iloc[0] == 5 and (df["forward_seconds"] > 0).all()


def test_latency_cli_times_the_decoder_step_by_default(tiny_llama, make_prompt_file, tmp_path, capsys):
    from workbench.cli import main
    from workbench.measure.latency_file import read_latency

    out = tmp_path / "step.csv"
    prompts = make_prompt_file(["Tell me a story.", "What is 2+2?"])
    assert main(["latency", "--model", str(tiny_llama.model_dir), "--heads", str(tiny_llama.heads_dirs["2"]),
                 "--prompts", str(prompts), "--limit", "2", "--sizes", "2", "--batch-sizes", "1,2", "--repeats", "1",
                 "--warmup", "0", "--max-new-tokens", "3", "--device", "cpu", "--out", str(out)]) == 0
    df = read_latency(out)
    assert sorted(zip(df["batch"], df["tokens"])) == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert read_setting(df)["mode"] == "decoder-step"
    err = capsys.readouterr().err
    assert "decoder-step" in err and "bare fwd ms" in err and "setting: cpu" in err
    assert main(["latency", "--random-config", "tiny", "--mode", "decoder-step", "--out", str(out)]) == 2
    capsys.readouterr()
    assert main(["latency", "--model", str(tiny_llama.model_dir), "--heads", str(tiny_llama.heads_dirs["2"]),
                 "--prompts", str(prompts), "--limit", "2", "--sizes", "2,3", "--batch-sizes", "1", "--repeats", "1",
                 "--warmup", "0", "--max-new-tokens", "3", "--device", "cpu", "--envelope", "[[0], [1], [0, 0]]",
                 "--out", str(out)]) == 0
    assert sorted(read_latency(out, policy="dynamic")["tokens"]) == [1, 2, 3] and len(read_latency(out)) == 3
    assert "per-step trees chosen from the 3-node envelope" in capsys.readouterr().err
    assert main(["latency", "--random-config", "tiny", "--mode", "verify", "--envelope", "[[0]]", "--out",
                 str(out)]) == 2
    assert capsys.readouterr().err.startswith("error: --envelope times per-step trees inside the decoder's step")

