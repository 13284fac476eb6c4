"""The demo heads and plan in a real vLLM (0.32, CPU build), end to end through `workbench vllm-check`: a few
held-out prompts, K = 1..4, batch 1 and 4. Needs vLLM's own environment: $WORKBENCH_VLLM_PYTHON (.ci/run builds
it); skipped with its reason otherwise. Minutes: five vLLM engines held at once (eager: they start in seconds),
then six for the plan priced on vLLM's own rounds (latency --engine vllm -> plan -> vllm-check --plan), compiled
as vLLM serves by default."""
import json
import os
from pathlib import Path

import pytest

from workbench.cli import main

ROOT = Path(__file__).resolve().parents[1]
CALIBRATION = ROOT / "calibration" / "smollm2-135m-instruct-alpaca-eval"
PY = os.environ.get("WORKBENCH_VLLM_PYTHON")

pytestmark = [pytest.mark.slow,  # the demo model
              pytest.mark.vllm,
              pytest.mark.skipif(not PY or not Path(PY).is_file(),
                                 reason="no vLLM interpreter: set WORKBENCH_VLLM_PYTHON (.ci/run builds one; "
                                        "docs/vllm.md has the one-line setup)")]


def test_demo_heads_in_vllm_match_plain_vllm_and_our_decoder(tmp_path, capsys):
    out = tmp_path / "check.json"
    rc = main(["vllm-check", "--calibration", str(CALIBRATION), "--k", "1,2,3,4", "--batch-sizes", "1,4",
               "--limit", "4", "--max-new-tokens", "16", "--repeats", "1", "--vllm-eager", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 0, err[-2000:]
    res = json.loads(out.read_text())
    assert res["vllm_version"] == "0.32.0"
    assert [r["k"] for r in res["acceptance"]] == [1, 2, 3, 4]
    for r in res["acceptance"]:
        # lossless in the engine: vLLM with our heads emits exactly what vLLM emits without them, at every batch
        for b, c in r["vllm_spec_vs_vllm_plain"].items():
            assert c["identical"] == c["prompts"] == 4, (r["k"], b, c)
        assert r["ours_medusa_vs_ours_plain"]["identical"] == 4
        # the right weights: heads that load wrongly (biases or lm_head dropped) accept nothing
        assert r["vllm_drafts"] > 0 and r["vllm_accepted_per_pos"][0] > 0
        # vLLM's counters equal our decoder's steps counted as vLLM counts them (vllm_steps: our last step left
        # out where it emitted only its root), per position and in drafts, and sequence by sequence, step by step
        like = r["ours_counted_like_vllm"]
        assert (like["steps"], like["accepted_per_pos"]) == (r["vllm_drafts"], r["vllm_accepted_per_pos"]), r["k"]
        assert r["sequences_step_for_step"]["equal"] == 4, (r["k"], r["per_sequence"])
        for b, c in r["vllm_by_batch_size"].items():  # the same counts at every batch size
            assert (c["drafts"], c["accepted_per_pos"]) == (r["vllm_drafts"], r["vllm_accepted_per_pos"]), (r["k"], b)
        assert len(r["vllm_by_batch_size"]) == 2
    # the same greedy text as our plain decoder (fp32 on both sides)
    for b, c in res["vllm_plain_vs_ours_plain"].items():
        assert c["identical"] == c["prompts"], (b, c)
    assert {s["batch_size"] for s in res["speed"]} == {1, 4} and all(s["tokens_per_s"] > 0 for s in res["speed"])
    assert res["load_average"]["cpus"] >= 1
    assert res["vllm_compilation"] == "NONE"  # --vllm-eager: five engines start in seconds


def test_a_plan_priced_on_vllms_rounds_is_checked_in_vllm(tmp_path, capsys):
    """latency --engine vllm (batch 1 and 2, K 0..2, 3 prompts) -> plan on that surface -> vllm-check --plan on other
    held-out prompts, with the heads given as the folder `export --format vllm-heads` wrote (issue 52)."""
    from workbench.measure.latency_file import latency_engine, read_latency
    from workbench.plan.plan_file import read_plan

    lat, plan, check, vh = (tmp_path / n for n in ("vllm.csv", "plan.json", "check.json", "vh"))
    assert main(["latency", "--engine", "vllm", "--calibration", str(CALIBRATION), "--prompts", "alpaca-eval",
                 "--limit", "3", "--batch-sizes", "1,2", "--k", "0,1,2", "--repeats", "2", "--max-new-tokens", "16",
                 "--out", str(lat)]) == 0, capsys.readouterr().err[-2000:]
    df = read_latency(lat)
    assert latency_engine(df) == ("vllm", "0.32.0")
    assert sorted(zip(df["batch"], df["tokens"])) == [(b, k + 1) for b in (1, 2) for k in (0, 1, 2)]
    assert (df["seconds"] > 0).all() and (df["repeats"] == 2).all()
    assert (df["context_min"] <= df["context"]).all() and (df["context"] <= df["context_max"]).all()
    served = dict(zip(zip(df["batch"], df["tokens"]), df["served_tokens_per_step"]))
    assert served[(1, 1)] == 1 and served[(1, 2)] > 1  # plain emits one token a round; the heads get accepted
    assert main(["plan", "--calibration", str(CALIBRATION), "--latency", str(lat), "--batch-sizes", "1,2",
                 "--max-new-tokens", "16", "--out", str(plan)]) == 0
    p = read_plan(plan)
    assert p["latency"]["engine"] == "vllm" and {r["kind"] for r in p["plans"]} <= {"chain", "none"}
    assert main(["export", "--format", "vllm-heads", "--out", str(vh)]) == 0
    capsys.readouterr()
    rc = main(["vllm-check", "--calibration", str(CALIBRATION), "--plan", str(plan), "--heads", str(vh), "--k", "1,2",
               "--batch-sizes", "1,2", "--limit", "3", "--max-new-tokens", "16", "--repeats", "2", "--out", str(check)])
    err = capsys.readouterr().err
    if rc == 2 and "no local" in err:
        pytest.skip("the held-out prompts' data set is not on this machine: " + err.strip()[:200])
    assert rc == 0, err[-2000:]
    assert "priced on" not in err  # priced on vLLM: no warning
    res = json.loads(check.read_text())
    assert not set(res["prompt_ids"]) & set(json.loads(df["setting"].iloc[0])["prompt_ids"])
    assert res["priced_on"]["engine"] == "vllm" and [r["batch_size"] for r in res["plan_check"]] == [1, 2]
    for r in res["plan_check"]:
        assert r["predicted_speedup"] > 0 and r["measured_speedup"] > 0 and r["best_k"] in (0, 1, 2)
    for s in res["speed"]:  # every K beside the plan's prediction for it, with the spread of 2 passes
        assert s["passes"] == 2 and s["decode_speedup_q1"] <= s["decode_speedup"] <= s["decode_speedup_q3"]
        assert s["predicted_speedup"] > 0
    for r in res["acceptance"]:
        for b, c in r["vllm_spec_vs_vllm_plain"].items():
            assert c["identical"] == c["prompts"], (r["k"], b, c)
    # vLLM as it serves by default: its model compiled, in the surface and the check
    assert res["vllm_compilation"] != "NONE" and json.loads(df["setting"].iloc[0])["compiled"] is True
    # our plain step beside vLLM's, pass by pass, at each batch size
    assert [r["batch_size"] for r in res["plain_step"]] == [1, 2]
    for r in res["plain_step"]:
        assert r["passes"] == 2 and r["ours_ms"] > 0 and r["vllm_ms"] > 0 and r["ratio_q1"] <= r["ratio"] <= r["ratio_q3"]
