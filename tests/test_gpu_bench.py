"""bench/gpu.py, the one GPU command, runs its whole plumbing on CPU at --quick size: exactness cases, the latency
surfaces (eager and compiled, with spread, readable by `workbench plan`), the decode comparison per batch size with
the plan's choice, and the JSON + markdown it leaves for the docs."""
import importlib.util
import json
from pathlib import Path

from workbench.measure.latency_file import read_latency
from workbench.plan.rank import make_plan
from workbench.plan.source import plan_source

BENCH = Path(__file__).resolve().parent.parent / "bench" / "gpu.py"


def test_gpu_bench_quick_on_cpu(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("bench_gpu", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "gpu-cpu.json"
    # the budget is the GPU's (9 minutes); a loaded CPU runner may need longer for the same plumbing
    assert bench.main(["--quick", "--device", "cpu", "--tiny", "--budget-s", "3600", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["env"]["device"] == "cpu" and report["env"]["copy_bandwidth"] > 0 and not report["skipped"]
    ex = report["exact"]
    assert ex["fp32_exact"] and ex["fp32_cases"] > 0 and ex["mismatches"] == 0
    assert ex["bf16_sequences"] == ex["fp32_cases"]
    eager = read_latency(report["latency"]["eager"]["file"])
    assert sorted(eager["batch"].unique()) == list(bench.QUICK["batches"]) and (eager["seconds_max"] >= eager["seconds_min"]).all()
    assert report["latency"]["compiled"]["compiled"]  # really compiled (aot_eager on CPU at --quick)
    # one engine and one capacity for the compiled grid and the decode section: never grown, nothing compiled in a
    # step; compilation timed apart; the plan read the surface of the mode the decoder ran in, with its provenance
    dec = report["decode"]
    assert dec["resized"] == 0 and dec["capacity"] == report["latency"]["compiled"]["capacity"]
    assert report["latency"]["compiled"]["compile_s"] > 0 and all(r["compile_s"] >= 0 for r in dec["batches"])
    src = dec["plan_surface"]
    assert src["mode"] == "compiled" and src["file"] == report["latency"]["compiled"]["file"] and src["compiled"]
    assert {"device_name", "dtype", "threads", "torch", "transformers"} <= set(src)
    assert dec["plan"]["latency"]["file"] == src["file"] and report["total_s"] > 0
    rows = report["decode"]["batches"]
    assert [r["batch_size"] for r in rows] == list(bench.QUICK["decode_batches"])
    plan = {p["batch_size"]: p for p in report["decode"]["plan"]["plans"]}
    for r in rows:
        assert r["vanilla_tokens_per_s"] > 0 and r["hf_generate_tokens_per_s"] > 0 and r["bandwidth_per_step"] > 0
        if plan[r["batch_size"]]["kind"] != "none":
            assert r["plan"]["exact"] and r["plan"]["nodes"] == plan[r["batch_size"]]["nodes"]
            assert r["plan"]["predicted_speedup"] == plan[r["batch_size"]]["predicted_speedup"]
            assert r["plan"]["mismatches"] == 0 and "near_tie_divergences" in r["plan"]  # divergences classified
    # the surface it wrote is a latency CSV the planner reads
    assert make_plan(plan_source(accuracies=bench.FALLBACK_ACCURACIES), report["latency"]["eager"]["file"], [1, 2])
    assert "| batch |" in out.with_suffix(".md").read_text() and "Exactness: fp32" in capsys.readouterr().out
