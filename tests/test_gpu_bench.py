"""bench/gpu.py, the one GPU command, runs its whole plumbing on CPU at --quick size (the captured step with aot_eager,
its "replay" a call on the graph's own buffers): the latency surfaces (eager and the decode's own, with spread,
readable by `workbench plan`), the decode comparison per batch size with the plan's choice, exactness on the
decode's kind of engine, static vs per-step trees, the captured/whole-step A/B, the per-shape proof of the graphs,
the compile cache, and the JSON + markdown it leaves for the docs; bad flags are one error line."""
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from workbench.measure.latency_file import read_latency
from workbench.plan.rank import make_plan
from workbench.plan.source import plan_source

BENCH = Path(__file__).resolve().parent.parent / "bench" / "gpu.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_gpu", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_gpu_bench_quick_on_cpu(tmp_path, capsys):
    bench = _bench()
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
    assert report["env"]["engine"] == report["latency"]["compiled"]["compiled"] == "captured"  # (aot_eager on CPU)
    # one engine and one capacity for the compiled grid and the decode section: never grown, nothing compiled in a
    # step; compilation timed apart; the plan read the surface of the mode the decoder ran in, with its provenance
    dec = report["decode"]
    assert dec["resized"] == 0 and dec["capacity"] == report["latency"]["compiled"]["capacity"]
    assert report["latency"]["compiled"]["compile_s"] > 0 and all(r["compile_s"] >= 0 for r in dec["batches"])
    # the warm-up compiled and captured every graph the timed calls ran; every shape reported, none skipped
    assert all(r["unwarmed_shapes"] == 0 for r in dec["batches"])
    shapes = report["shapes"]
    assert {(x["batch"], x["size"]) for x in shapes} >= {(b, n) for b in bench.QUICK["decode_batches"]
                                                         for n in bench.QUICK["step_sizes"]}
    assert all(x["capture_s"] > 0 and x["cudagraph_skips"] == 0 for x in shapes)
    assert report["cache"]["status"] == "miss" and "compile_times" in report
    assert ex["engine"] == "captured"
    assert [r["budget"] for r in report["dynamic"]["rows"]] == list(bench.QUICK["dyn_budgets"])
    assert all(r["static_tokens_per_step"] >= 1 and r["dynamic_tokens_per_step"] >= 1
               for r in report["dynamic"]["rows"])
    assert [r["step"] for r in report["ab"]["rows"]] == ["captured", "whole"]
    assert all(r["vanilla_tokens_per_s"] > 0 for r in report["ab"]["rows"])
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
            assert min(r["plan"][k] for k in ("decode_speedup_median", "decode_speedup", "speedup_vs_vanilla")) > 0
            assert r["plan"]["mismatches"] == 0 and "near_tie_divergences" in r["plan"]  # divergences classified
    # the surface it wrote is a latency CSV the planner reads
    assert make_plan(plan_source(accuracies=bench.FALLBACK_ACCURACIES), report["latency"]["eager"]["file"], [1, 2])
    assert "| batch |" in out.with_suffix(".md").read_text() and "Exactness: fp32" in capsys.readouterr().out


@pytest.mark.parametrize("flags, says", [(["--step", "graph"], "--step: invalid choice"),
                                         (["--budget-s", "-5"], "--budget-s"),
                                         (["--skip", "decode"], "--skip 'decode'"),
                                         (["--compile-cache", "/nonexistent/cache"], "--compile-cache")])
def test_bad_flags_are_one_error_line(flags, says, capsys):
    assert _bench().main(["--quick", "--device", "cpu", "--tiny", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and says in err[0], err


def test_the_compile_cache_is_saved_and_loaded_by_key(tmp_path, capsys):
    """Inductor's artifacts of this process, saved as KEY.bin, load in a later run of the same key (hit); another
    key, or a file that does not load, is a miss (the latter with one warning line), never a failure."""
    bench = _bench()
    key = bench.cache_key(torch.device("cpu"))
    assert key.startswith("cpu-torch") and "/" not in key
    torch._dynamo.reset()
    f = torch.compile(lambda x: x * 3 + 1)
    assert torch.equal(f(torch.arange(4.0)), torch.arange(4.0) * 3 + 1)
    saved = {}
    bench.save_cache(tmp_path / "cache", key, saved)
    assert saved["saved"]["bytes"] > 0 and (tmp_path / "cache" / f"{key}.bin").is_file()
    assert bench.load_cache(tmp_path / "cache", key)["status"] == "hit"
    miss = bench.load_cache(tmp_path / "cache", "another-key")
    assert miss["status"] == "miss" and key in miss["why"]
    (tmp_path / "cache" / f"{key}.bin").write_bytes(b"not artifacts")
    assert bench.load_cache(tmp_path / "cache", key)["status"] == "miss"
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning:") and "compiling cold" in err[0]
