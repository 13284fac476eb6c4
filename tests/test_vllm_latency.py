"""vLLM's own round costs without vLLM: `latency --engine vllm` through a stand-in worker that serves rounds at
known costs (the CSV's rows, spread, context range, engine and resume), the plan priced on that surface (only what
vLLM runs, the best K by hand), the export's warning for a plan priced on our decoder, the latency format's engine
columns, and vllm-check's plan-vs-measured rows. The real run is test_vllm_e2e.py."""
import json
import sys

import pandas as pd
import pytest

from workbench import WorkbenchError
from workbench.cli import main
from workbench.export.engines import export_plan
from workbench.export.vllm_speed import plan_rows, speed_rows
from workbench.measure.latency_file import LATENCY_VERSION, latency_engine, read_latency
from workbench.plan.plan_file import read_plan

ROUNDS = 6  # full rounds per pass the stand-in serves
COST = {0: 0.010, 1: 0.013, 2: 0.018}  # seconds of a round at batch 1 by K; batch B costs B times more at K >= 1

STANDIN = '''#!{python}
"""Stands in for vLLM's worker in mode "rounds": per pass one prefill step, a step that emits nothing (async
scheduling's), then {rounds} full rounds at COST[K] * (B if K else 1) seconds; with STANDIN_DIE_AT=B it dies at batch
size B; with STANDIN_SLOW_K<K>=F a process whose largest K is K runs F times slower (each of its engines); every
request's batch sizes and engines are logged to STANDIN_LOG."""
import json, os, sys
if sys.argv[1:2] == ["-c"]:  # the interpreter check's question: is vLLM there?
    print("vllm")
    sys.exit(0)
COST = {cost}
req = json.loads(sys.stdin.read())
with open(os.environ["STANDIN_LOG"], "a") as f:
    f.write(json.dumps([req["batch_sizes"], req["engines"], req["eager"]]) + "\\n")
assert req["mode"] == "rounds"
slow = float(os.environ.get("STANDIN_SLOW_K%d" % max(e["num_speculative_tokens"] if e else 0 for e in req["engines"]), 1))
for b in req["batch_sizes"]:
    if str(b) == os.environ.get("STANDIN_DIE_AT"):
        sys.exit(1)
    engines = []
    for spec in req["engines"]:
        k = spec["num_speculative_tokens"] if spec else 0
        passes = []
        for p in range(req["warmup"] + req["repeats"]):
            cost = COST[str(k)] * (b if k else 1) * (1 + 0.01 * p) * slow
            steps = [dict(seconds=0.002 * slow, full=False, tokens=0, context_sum=20 * b, context_min=20, context_max=20)]
            steps += [dict(seconds=cost, full=True, tokens=b * (1 + k), context_sum=(21 + r) * b,
                           context_min=21 + r, context_max=21 + r) for r in range({rounds})]
            passes.append(dict(timed=p >= req["warmup"], rounds=steps))
        engines.append(dict(vllm_version="0.32.0", startup_s=1.0, run=dict(batch_size=b, passes=passes),
                            worker=dict(threads=2, torch="2.13.0", transformers="4.57.0",
                                        compilation="NONE" if req["eager"] else "DYNAMO_TRACE_ONCE")))
    print(json.dumps(dict(event="batch", batch_size=b, engines=engines)), flush=True)
print(json.dumps(dict(event="done")), flush=True)
'''


@pytest.fixture
def standin(tmp_path, monkeypatch):
    py = tmp_path / "python"
    py.write_text(STANDIN.format(python=sys.executable, rounds=ROUNDS, cost={str(k): v for k, v in COST.items()}))
    py.chmod(0o755)
    monkeypatch.setenv("STANDIN_LOG", str(tmp_path / "asked.jsonl"))
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path / "cache"))  # the vLLM heads folder is written there
    return py


def _latency(tiny_llama, py, out, *extra):
    return main(["latency", "--engine", "vllm", "--vllm-python", str(py), "--model", str(tiny_llama.model_dir),
                 "--heads", str(tiny_llama.heads_dirs["2"]), "--prompts", "alpaca-eval", "--raw", "--limit", "3",
                 "--batch-sizes", "1,2",
                 "--k", "0,1,2", "--repeats", "3", "--warmup", "1", "--max-new-tokens", "8", "--out", str(out),
                 *extra])


def _by_hand(b: int, k: int, p: int) -> float:
    """The stand-in's pass p cost of one round: every decoding step's seconds over its full rounds."""
    return (0.002 + ROUNDS * COST[k] * (b if k else 1) * (1 + 0.01 * p)) / ROUNDS


def test_latency_engine_vllm_writes_vllms_rounds_as_a_latency_csv(tiny_llama, standin, tmp_path, monkeypatch, capsys):
    out = tmp_path / "vllm.csv"
    monkeypatch.setenv("STANDIN_DIE_AT", "2")  # killed while timing batch 2: batch 1 (every K) is kept
    assert _latency(tiny_llama, standin, out) == 2
    assert "vLLM failed" in capsys.readouterr().err and not out.exists()
    monkeypatch.delenv("STANDIN_DIE_AT")
    assert _latency(tiny_llama, standin, out) == 0
    asked = [json.loads(line) for line in (tmp_path / "asked.jsonl").read_text().splitlines()]
    assert [a[0] for a in asked] == [[1, 2], [2]] and asked[0][1] == asked[1][1]  # resumed at batch 2, every K
    engines = asked[0][1]
    assert engines[0] is None and [e["num_speculative_tokens"] for e in engines[1:]] == [1, 2]
    assert engines[1]["method"] == "medusa" and engines[1]["model"].startswith(str(tmp_path / "cache"))
    df = read_latency(out)
    assert latency_engine(df) == ("vllm", "0.32.0") and (df["version"] == LATENCY_VERSION).all()
    assert sorted(zip(df["batch"], df["tokens"])) == [(b, k + 1) for b in (1, 2) for k in (0, 1, 2)]
    for r in df.to_dict("records"):
        k, b = r["tokens"] - 1, r["batch"]
        plain = [_by_hand(b, 0, p) for p in (1, 2, 3)]  # pass 0 is the warm-up
        # K > 0: each pass priced against plain's same pass, at plain's median (the drift of 1 % a pass cancels)
        passes = sorted(plain[1] * _by_hand(b, k, p) / plain[p - 1] for p in (1, 2, 3)) if k else plain
        assert r["seconds"] == pytest.approx(passes[1]) and r["seconds_min"] == pytest.approx(passes[0])
        assert r["seconds_max"] == pytest.approx(passes[2]) and r["repeats"] == 3
        width = (r["seconds_max"] - r["seconds_min"]) / r["seconds"]
        assert width < 0.002 if k else width > 0.015
        assert r["served_tokens_per_step"] == pytest.approx(1 + k)
    assert (df["context_min"] == 21).all() and (df["context_max"] == 20 + ROUNDS).all()
    assert (df["context"] == round(21 + (ROUNDS - 1) / 2)).all()
    where = json.loads(df["setting"].iloc[0])
    assert where["mode"] == "vllm-round" and where["vllm"] == "0.32.0" and where["threads"] == 2
    assert len(where["prompt_ids"]) == 3  # the check serves other prompts
    # vLLM as it serves by default (its CPU build compiles the model) unless asked for enforce_eager
    assert asked[0][2] is False and where["compiled"] is True and where["vllm_compilation"] == "DYNAMO_TRACE_ONCE"
    assert _latency(tiny_llama, standin, tmp_path / "eager.csv", "--vllm-eager") == 0
    assert json.loads((tmp_path / "asked.jsonl").read_text().splitlines()[-1])[2] is True
    where = json.loads(read_latency(tmp_path / "eager.csv")["setting"].iloc[0])
    assert where["compiled"] is False and where["vllm_compilation"] == "NONE"


def test_each_ngram_k_runs_in_its_own_process_beside_its_own_plain_engine(tiny_llama, standin, tmp_path,
                                                                         monkeypatch):
    """vLLM 0.32's CPU build starts one n-gram engine a process (vllm_runner.engine_groups): one worker per K, each
    with a plain engine of its own, each K priced against that one (a process running 1.5x slower throughout
    prices its K as the others: t(K)/t(0) is its ratio to its own plain engine); a kill keeps the finished batch
    sizes of each process, and the rerun runs only the rest."""
    out = tmp_path / "ngram.csv"
    args = ["latency", "--engine", "vllm", "--vllm-python", str(standin), "--model", str(tiny_llama.model_dir),
            "--method", "ngram", "--prompts", "alpaca-eval", "--raw", "--limit", "3", "--batch-sizes", "1,2",
            "--k", "1,2", "--repeats", "3", "--warmup", "1", "--max-new-tokens", "8", "--out", str(out)]
    monkeypatch.setenv("STANDIN_SLOW_K2", "1.5")
    monkeypatch.setenv("STANDIN_DIE_AT", "2")
    assert main(args) == 2 and not out.exists()
    monkeypatch.delenv("STANDIN_DIE_AT")
    assert main(args) == 0
    asked = [json.loads(line) for line in (tmp_path / "asked.jsonl").read_text().splitlines()]
    # first run: K = 1's process dies at batch 2 (batch 1 kept); the rerun: its batch 2, then K = 2's process
    assert [(a[0], [e and e["num_speculative_tokens"] for e in a[1]]) for a in asked] == [
        ([1, 2], [None, 1]), ([2], [None, 1]), ([1, 2], [None, 2])]
    assert all(a[1][1]["method"] == "ngram" for a in asked)
    df = read_latency(out)
    assert sorted(zip(df["batch"], df["tokens"])) == [(b, k + 1) for b in (1, 2) for k in (0, 1, 2)]
    for r in df.to_dict("records"):
        k, b = r["tokens"] - 1, r["batch"]
        ratio = sorted(_by_hand(b, k, p) / _by_hand(b, 0, p) for p in (1, 2, 3))[1]  # its own plain's, pass by pass
        assert r["relative"] == pytest.approx(ratio, rel=1e-9), (b, k)
    assert json.loads(df["setting"].iloc[0])["drafter"] == "ngram"


def test_latency_engine_vllm_refuses_our_decoders_flags(tiny_llama, standin, tmp_path, capsys):
    assert _latency(tiny_llama, standin, tmp_path / "x.csv", "--context", "64") == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --context: our decoder's") and len(err.strip().splitlines()) == 1
    assert _latency(tiny_llama, standin, tmp_path / "x.csv", "--method", "eagle3") == 2
    assert "--heads (Medusa heads) or --method" in capsys.readouterr().err
    assert main(["latency", "--k", "1,2", "--out", str(tmp_path / "x.csv")]) == 2  # our decoder has no K
    assert capsys.readouterr().err.startswith("error: --k, --method, --draft-model, --vllm-python and --vllm-eager "
                                              "time vLLM's")
    assert not (tmp_path / "x.csv").exists()


def _surface(tmp_path, engine="vllm") -> str:
    """A surface like the stand-in's, written directly (batch 1, 2; K 0..2)."""
    rows = []
    for b in (1, 2):
        for k in (0, 1, 2):
            t = COST[k] * (b if k else 1)
            rows.append(dict(model="m", device="cpu", dtype="float32", batch=b, context=30, tokens=k + 1, seconds=t,
                             seconds_min=t * 0.98, seconds_q1=t * 0.99, seconds_q3=t * 1.01, seconds_max=t * 1.02,
                             repeats=3, setting=json.dumps(dict(mode="vllm-round" if engine == "vllm" else "decoder-step",
                                                          prompt_ids=["a", "b"])),
                             engine=engine, engine_version="0.32.0", context_min=20, context_max=40,
                             version=LATENCY_VERSION))
    f = tmp_path / f"{engine}.csv"
    pd.DataFrame(rows).to_csv(f, index=False)
    return str(f)


def test_a_plan_priced_on_vllm_weighs_only_what_vllm_runs(tmp_path, capsys):
    acc = tmp_path / "acc.json"
    acc.write_text(json.dumps([0.6, 0.4, 0.2]))
    out = tmp_path / "plan.json"
    assert main(["plan", "--acceptance", str(acc), "--latency", _surface(tmp_path), "--batch-sizes", "1,2",
                 "--out", str(out)]) == 0
    assert "priced on: vllm 0.32.0" in capsys.readouterr().err
    plan = read_plan(out)
    assert plan["latency"]["engine"] == "vllm" and plan["latency"]["engine_version"] == "0.32.0"
    tps = {0: 1.0, 1: 1.6, 2: 2.0}  # 1 + the first K rates
    for row, alt in zip(plan["plans"], plan["alternatives"]):
        b = row["batch_size"]
        by_hand = {k: tps[k] / (COST[k] * (b if k else 1) / COST[0]) for k in tps}
        assert [c["k"] for c in alt["chains"]] == [0, 1, 2]  # K = 3 was not timed: not weighed
        assert {c["k"]: c["predicted_speedup"] for c in alt["chains"]} == pytest.approx(by_hand)
        assert row["nodes"] == max(by_hand, key=by_hand.get) and row["kind"] in ("chain", "none")
    # batch 1: K = 1 (1.6 / 1.3 = 1.23x) over K = 2 (2.0 / 1.8 = 1.11x); batch 2: every K loses (0.62x, 0.56x)
    assert [r["nodes"] for r in plan["plans"]] == [1, 0]


@pytest.mark.unit
def test_shrinking_cost_reads_the_smaller_batch_rounds():
    """A round with `a` of B sequences left costs t(a, n) / t(B, n): linear in a between measured batch sizes, the
    smallest measured one below them, a full round where a size did not time those tokens."""
    from workbench.core.speed import shrinking_cost

    t = {1: {1: 1.0, 2: 1.2}, 2: {1: 1.2, 2: 1.6}, 4: {1: 1.4, 2: 2.0}, 8: {1: 1.4, 2: 4.0, 3: 5.0}}
    cost = shrinking_cost(t, 8)
    assert [cost(a, 2) for a in range(1, 9)] == pytest.approx([0.3, 0.4, 0.45, 0.5, 0.625, 0.75, 0.875, 1.0])
    assert cost(3, 1) == pytest.approx(1.3 / 1.4) and cost(8, 1) == cost(9, 1) == 1.0
    assert cost(2, 3) == 1.0  # no smaller batch timed 3 tokens: nothing to price the tail on
    assert shrinking_cost({2: {1: 1.0}, 4: {1: 2.0}}, 4)(1, 1) == pytest.approx(0.5)  # below 2: batch 2's round


def test_a_plan_priced_on_vllm_prices_a_batchs_tail_on_smaller_batches(tmp_path):
    """vLLM drops a finished request, so once the first answers of a batch are done its rounds cost a smaller
    batch's: the plan's batch tokens/step on vLLM's surface is batch_walk with that cost, and the app's answer
    (recommend) and optimize --latency's ranking say the same; on our decoder's table (all B rows step to the end)
    it is the plain batch replay."""
    from pathlib import Path

    from workbench.calibrate.folder import Calibration
    from workbench.core.speed import shrinking_cost
    from workbench.plan.recommend import recommend
    from workbench.plan.source import generation_length
    from workbench.trees.tree import chain_tree

    calib = Path(__file__).resolve().parents[1] / "calibration" / "smollm2-135m-instruct-alpaca-eval"
    cal = Calibration(calib)
    length = generation_length(cal, None)
    got = {}
    for engine in ("vllm", "workbench"):
        out = tmp_path / f"{engine}.json"
        assert main(["plan", "--calibration", str(calib), "--latency", _surface(tmp_path, engine), "--batch-sizes",
                     "1,2", "--out", str(out)]) == 0
        plan = read_plan(out)
        assert plan["latency"]["batch_shrinks"] == (engine == "vllm")
        got[engine] = {c["k"]: c["predicted_batch_tokens_per_step"] for c in plan["alternatives"][1]["chains"]}
        rec = recommend(cal, read_latency(_surface(tmp_path, engine)), batch=2)
        chains = {c["nodes"]: c["batch_tokens_per_step"] for c in rec["candidates"] if c["kind"] != "tree"}
        assert chains == pytest.approx(got[engine])
    seconds = {b: {k + 1: COST[k] * (b if k else 1) for k in COST} for b in (1, 2)}
    for k in (1, 2):
        assert got["workbench"][k] == pytest.approx(cal.batch_replay(chain_tree(k), 2, "holdout", length))
        assert got["vllm"][k] == pytest.approx(cal.batch_replay(chain_tree(k), 2, "holdout", length,
                                                                shrinking_cost(seconds, 2)))
        assert got["vllm"][k] > got["workbench"][k]  # a K round at batch 1 costs half batch 2's here


def test_a_calibration_plan_on_vllm_has_no_trees(tmp_path):
    from pathlib import Path

    calib = Path(__file__).resolve().parents[1] / "calibration" / "smollm2-135m-instruct-alpaca-eval"
    out = tmp_path / "plan.json"
    assert main(["plan", "--calibration", str(calib), "--latency", _surface(tmp_path), "--batch-sizes", "1,2",
                 "--out", str(out)]) == 0
    plan = read_plan(out)
    kinds = {r["kind"] for r in plan["plans"]} | {(a["runner_up"] or {}).get("kind") for a in plan["alternatives"]}
    assert "tree" not in kinds
    from workbench.calibrate.folder import Calibration
    from workbench.plan.recommend import recommend

    rec = recommend(Calibration(calib), read_latency(_surface(tmp_path)), batch=1)  # the app's answer: the same
    assert {c["kind"] for c in rec["candidates"]} == {"none", "chain"} and rec["pick"]["nodes"] == \
        plan["plans"][0]["nodes"]


def test_optimize_latency_and_the_designer_on_a_vllm_surface_name_what_plan_names(tmp_path, capsys):
    """plan.fastest (optimize --latency, the designer's hardware-aware model) weighs what plan weighs on vLLM's
    rounds: chains of the K vLLM timed, no trees, and the same pick as the plan at that batch size."""
    from pathlib import Path

    from workbench.calibrate.folder import Calibration
    from workbench.plan.fastest import fastest, value_source
    from workbench.plan.surface import Surface

    calib = Path(__file__).resolve().parents[1] / "calibration" / "smollm2-135m-instruct-alpaca-eval"
    surface, plan_out, tree_out = _surface(tmp_path), tmp_path / "plan.json", tmp_path / "tree.json"
    assert main(["plan", "--calibration", str(calib), "--latency", surface, "--batch-sizes", "2",
                 "--out", str(plan_out)]) == 0
    assert main(["optimize", "--calibration", str(calib), "--latency", surface, "--batch-sizes", "2",
                 "--out", str(tree_out)]) == 0
    err = capsys.readouterr().err
    assert "vLLM rounds" in err and "hardware-aware chain K=" in err, err
    row, alt = read_plan(plan_out)["plans"][0], read_plan(plan_out)["alternatives"][0]
    written = json.loads(tree_out.read_text())
    best = row if row["kind"] == "chain" else alt["runner_up"]  # none wins: optimize writes the best speculating one
    assert written["medusa_choices"] == best["medusa_choices"] and written["engine"] == "vllm"
    theirs = Surface.read(surface)
    at = theirs.at(2, theirs.context([2]))
    res = fastest(value_source(Calibration(calib).accuracies("fit")), theirs, at, curve=True)
    assert {c.kind for c in res["choice"].ranked} <= {"chain", "none"}
    assert [c.nodes for c in res["curve"]] == [1, 2]  # the chains vLLM timed (K = 1, 2), nothing else
    ours = Surface(read_latency(surface).assign(engine="workbench"))  # the same table read as our decoder's: trees
    ours_res = fastest(value_source(Calibration(calib).accuracies("fit")), ours, ours.at(2, at.context), curve=True)
    assert any(c.kind == "tree" for c in ours_res["choice"].ranked)


def test_exporting_a_plan_priced_on_our_decoder_for_vllm_warns_once(tmp_path, capsys):
    acc = tmp_path / "acc.json"
    acc.write_text(json.dumps([0.6, 0.4, 0.2]))
    ours, theirs = tmp_path / "ours.json", tmp_path / "theirs.json"
    for path, engine in ((ours, "workbench"), (theirs, "vllm")):
        assert main(["plan", "--acceptance", str(acc), "--latency", _surface(tmp_path, engine), "--batch-sizes",
                     "1,2", "--out", str(path)]) == 0
    capsys.readouterr()
    assert main(["export", str(ours), "--format", "vllm", "--method", "eagle3", "--draft-model", str(tmp_path),
                 "--batch-sizes", "1"]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if "priced on" in line]
    assert len(warned) == 1 and warned[0].startswith("warning: the plan was priced on our decoder's step costs")
    assert "`workbench latency --engine vllm" in warned[0] and f"--acceptance {acc}" in warned[0]
    _, warns, _ = export_plan(read_plan(theirs), "vllm", method="eagle3", draft_model=tmp_path, batch_size=1)
    assert not [w for w in warns if w.code == "plan_priced_elsewhere"]


def test_latency_format_engine_columns_are_checked(tmp_path):
    f = _surface(tmp_path)
    df = pd.read_csv(f)
    for change, match in ((dict(version=LATENCY_VERSION + 1), "reads latency CSVs of version"),
                          (dict(engine="trt"), "engine must"), (dict(context_min=35), "context_min <= context")):
        bad = df.copy()
        for col, v in change.items():
            bad.loc[0, col] = v
        bad.to_csv(tmp_path / "bad.csv", index=False)
        with pytest.raises(WorkbenchError, match=match):
            read_latency(tmp_path / "bad.csv")
    # version 2 (before the engine columns): every such table timed our decoder, its context range not recorded
    old = df.drop(columns=["engine", "engine_version", "context_min", "context_max"]).assign(
        version=2, setting=json.dumps(dict(mode="decoder-step")))  # (a vllm-round setting would contradict it)
    old.to_csv(tmp_path / "old.csv", index=False)
    up = read_latency(tmp_path / "old.csv")
    assert latency_engine(up) == ("workbench", None) and (up["version"] == LATENCY_VERSION).all()
    assert up["context_min"].isna().all() and up["seconds"].tolist() == df["seconds"].tolist()


def test_vllm_check_puts_the_plans_prediction_beside_vllms_speedup():
    """speed_rows / plan_rows on made-up runs: the decoding-phase speedup per pass and its spread, the plan's
    prediction for every K, vLLM's best K and whether the plan's K is within noise of it."""
    def run(decode, tokens=100):
        return dict(new_tokens=tokens, seconds=decode[0] + 0.5, passes=[dict(seconds=d + 0.5, decode_seconds=d)
                                                                         for d in decode])
    plain = {1: run([1.0, 1.0, 1.0])}
    plan = dict(plans=[dict(batch_size=1, kind="chain", nodes=1, predicted_speedup=1.2)],
                alternatives=[dict(batch_size=1, chains=[dict(k=0, predicted_speedup=1.0),
                                                         dict(k=1, predicted_speedup=1.2),
                                                         dict(k=2, predicted_speedup=1.1)])])
    rows = speed_rows(1, [1], {1: run([0.8, 0.85, 0.9])}, plain, {1: 1}, plan) + \
        speed_rows(2, [1], {1: run([0.78, 0.84, 0.95])}, plain, {1: 1}, plan)
    assert rows[0]["decode_speedup"] == pytest.approx(1 / 0.85) and rows[0]["passes"] == 3
    assert rows[0]["decode_speedup_q1"] < rows[0]["decode_speedup"] < rows[0]["decode_speedup_q3"]
    assert [r["predicted_speedup"] for r in rows] == [1.2, 1.1]
    (check,) = plan_rows(plan, {1: 1}, rows)
    assert check["error"] == pytest.approx(1.2 * 0.85 - 1) and check["best_k"] == 2
    assert check["choice_is_best_or_within_noise"]  # K = 1 (1.176x) and K = 2 (1.190x) overlap


def test_a_kept_check_is_priced_again_on_a_new_plan():
    """vllm_speed.repriced: a finished check's measured speeds against another plan's predictions (the surface
    measured again): the predicted columns, the plan's K (a tree's best chain, as the check serves it) and the plan
    rows change, the measurements do not; a plan served on the check's prompts or asking for a K the check did not
    run is refused."""
    from workbench.export.vllm_speed import repriced

    def plan(pred: dict, k: int, ids=("s1",)) -> dict:
        return dict(plans=[dict(batch_size=1, kind="chain" if k else "none", nodes=k)],
                    alternatives=[dict(batch_size=1, chains=[dict(k=kk, predicted_speedup=v) for kk, v in pred.items()])],
                    latency=dict(setting=dict(prompt_ids=list(ids)), engine="vllm", file="new.csv"))
    run = dict(new_tokens=100, seconds=1.5, passes=[dict(seconds=1.5, decode_seconds=1.0)] * 3)
    fast = dict(new_tokens=100, seconds=1.3, passes=[dict(seconds=1.3, decode_seconds=0.8)] * 3)
    old = plan({0: 1.0, 1: 1.4}, 1)
    rows = speed_rows(1, [1], {1: fast}, {1: run}, {1: 1}, old)
    res = dict(prompt_ids=["h1", "h2"], speed=rows, plan={1: 1}, plan_check=plan_rows(old, {1: 1}, rows))
    assert res["plan_check"][0]["error"] == pytest.approx(1.4 / 1.25 - 1)
    new = repriced(res, plan({0: 1.0, 1: 1.2}, 1))
    assert new["speed"][0]["decode_speedup"] == rows[0]["decode_speedup"] == pytest.approx(1.25)
    assert new["speed"][0]["predicted_speedup"] == 1.2 and new["plan_check"][0]["error"] == pytest.approx(1.2 / 1.25 - 1)
    assert new["priced_on"]["file"] == "new.csv" and res["speed"][0]["predicted_speedup"] == 1.4  # not changed in place
    none = repriced(res, plan({0: 1.0, 1: 0.9}, 0))
    assert none["plan"] == {1: 0} and none["plan_check"][0]["plan_k"] == 0 and none["plan_check"][0]["best_k"] == 1
    tree = plan({0: 1.0, 1: 1.1}, 1)  # a plan priced on our decoder: vLLM serves its best chain (vllm.served_ks)
    tree["plans"][0].update(kind="tree", nodes=5, predicted_tokens_per_step=1.5, predicted_speedup=1.3)
    tree["alternatives"][0]["best_chain"] = dict(k=1, predicted_tokens_per_step=1.2, predicted_speedup=1.1)
    assert repriced(res, tree)["plan"] == {1: 1}
    with pytest.raises(WorkbenchError, match="prompt"):
        repriced(res, plan({0: 1.0, 1: 1.2}, 1, ids=("h2",)))
    with pytest.raises(WorkbenchError, match="K = 2 at batch 1"):
        repriced(res, plan({0: 1.0, 2: 1.2}, 2))


@pytest.mark.unit
def test_a_run_is_idle_only_when_nothing_else_ran_during_it():
    """Idle is the CPU other processes used during a measurement (the machine's busy time less ours:
    provenance.others), the one rule of bench/vllm_plan.py and vllm-check: the load average after a step is the
    step's own, and the one before it says what ran the minute before."""
    import importlib.util
    from pathlib import Path

    from workbench.core.provenance import cpu_mark, others, quiet
    from workbench.export.vllm_check import load_note

    spec = importlib.util.spec_from_file_location("vllm_plan", Path(__file__).parents[1] / "bench" / "vllm_plan.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    # 10 s: the machine busy 12 CPU s (3 of them niced), this process and its children 11 s -> others 0.1 cores
    assert others((0, 100, 50, 5), (10, 112, 53, 16)) == dict(cores=0.1, niced_cores=0.3, seconds=10)
    calm = dict(before=[2.0, 1, 1], after=[2.0, 1, 1], others=dict(cores=0.02, niced_cores=0, seconds=60))
    assert bench.idle(dict(start=[1.2, 0.2, 0.3], surface=calm, check=calm))  # loads before/after: not the rule
    assert not bench.idle(dict(start=[0.1, 0.2, 0.3], surface=dict(calm, others=dict(cores=0.9, niced_cores=0.9))))
    assert not bench.idle(dict(start=[0.1, 0.2, 0.3], surface=dict(calm, others=None)))  # not measured: not idle
    assert not bench.idle(dict(start=[0.1, 0.2, 0.3]))
    assert quiet(None) is None and quiet(dict(cores=0.099)) and not quiet(dict(cores=0.1))
    assert load_note(dict(cores=0.005)).endswith("idle figures") and "not idle" in load_note(dict(cores=0.4))
    assert "not measured" in load_note(None)
    mark = cpu_mark()
    assert mark is None or (len(mark) == 4 and mark[1] >= mark[2] >= 0)


@pytest.mark.unit
def test_the_workers_folder_shadows_no_package():
    """vLLM's worker runs as a script, its folder first on sys.path: a sibling named like a package vLLM imports hid
    it (measure/requests.py and `requests`: every vLLM run failed). The worker drops its folder, and no sibling is
    named like a package installed here."""
    import importlib.util
    import subprocess
    from pathlib import Path

    from workbench.measure.vllm_runner import WORKER

    taken = [p.stem for p in WORKER.parent.glob("*.py")
             if p.stem != "__init__" and importlib.util.find_spec(p.stem) is not None]
    assert not taken, f"modules of workbench/measure named like installed packages: {taken}"
    probe = ("import runpy, sys; sys.path.insert(0, sys.argv[1]); "
             "g = runpy.run_path(sys.argv[2], run_name='probe'); print(sys.argv[1] in g['sys'].path)")
    out = subprocess.run([sys.executable, "-c", probe, str(WORKER.parent), str(WORKER)], capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out == "False"
    assert importlib.util.find_spec("requests") is not None  # the check can fail: `requests` is installed here
