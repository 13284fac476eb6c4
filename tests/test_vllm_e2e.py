"""The demo heads and plan in a real vLLM (0.32, CPU build), end to end through `workbench vllm-check`: a few
held-out prompts, K = 1..4, batch 1 and 4. Needs vLLM's own environment: $WORKBENCH_VLLM_PYTHON (.ci/run builds
it); skipped with its reason otherwise. Minutes: five vLLM engines start one after another."""
import json
import os
from pathlib import Path

import pytest

from workbench.cli import main

ROOT = Path(__file__).resolve().parents[1]
CALIBRATION = ROOT / "calibration" / "smollm2-135m-instruct-alpaca-eval"
PY = os.environ.get("WORKBENCH_VLLM_PYTHON")

pytestmark = [pytest.mark.slow,  # the demo model
              pytest.mark.skipif(not PY or not Path(PY).is_file(),
                                 reason="no vLLM interpreter: set WORKBENCH_VLLM_PYTHON (.ci/run builds one; "
                                        "docs/vllm.md has the one-line setup)")]


def test_demo_heads_in_vllm_match_plain_vllm_and_our_decoder(tmp_path, capsys):
    out = tmp_path / "check.json"
    rc = main(["vllm-check", "--calibration", str(CALIBRATION), "--k", "1,2,3,4", "--batch-sizes", "1,4",
               "--limit", "4", "--max-new-tokens", "16", "--out", str(out)])
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
