"""A plan for vLLM priced on vLLM's own rounds, then confirmed in vLLM on other prompts, in one command:

    python bench/vllm_plan.py                               # issue 48's measurement (idle machine: ~1 hour)
    python bench/vllm_plan.py --batch-sizes 1,2 --k 1 --surface-limit 2 --check-limit 2 --max-new-tokens 12 \
        --surface-repeats 2 --repeats 2 --name vllm-plan-smoke --out-dir /tmp     # a smoke run (minutes)

1. `workbench latency --engine vllm`: vLLM's served round per (batch size, K = 0..max(--k)) on the first
   --surface-limit prompts of --surface-prompts (alpaca-eval), the demo heads drafting;
2. `workbench plan --calibration DIR --latency` that CSV: the K per batch size priced on it;
3. `workbench vllm-check --plan`: every K and the plan's choice in vLLM, on the calibration's held-out prompts less
   the surface's, --repeats passes each (the surface: --surface-repeats).
Writes OUT_DIR/NAME-latency.csv, NAME-plan.json, NAME-check.json (each resumable: a rerun continues a killed step and
skips a finished one; a kept check is priced again on the plan there, vllm_speed.repriced: delete the surface and
the plan to measure the surface again without the check) and NAME.md + NAME.json: per (batch size, K) the predicted speedup beside vLLM's measured
decoding-phase one with its spread, per batch size the plan's K beside vLLM's best, issue 48's verdicts (|predicted
- measured| <= 10% of measured at every row; the choice vLLM's best or within that row's noise) and the load average
before and after each step. Needs vLLM's environment ($WORKBENCH_VLLM_PYTHON or --vllm-python).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workbench import WorkbenchError  # noqa: E402
from workbench.calibrate.folder import default_calibration  # noqa: E402
from workbench.cli import main as workbench  # noqa: E402
from workbench.cli.shared import ScriptParser, parse_ints, run_script  # noqa: E402
from workbench.core.io import atomic_write_json, atomic_write_text  # noqa: E402
from workbench.core.provenance import cpu_mark, load_average, others, quiet  # noqa: E402

TOLERANCE = 0.10  # issue 48: |predicted - measured| <= 10% of vLLM's measured speedup
PLAIN_STEP = 1.2  # issue 49: our plain step at batch 1 within 1.2x of vLLM's, side by side in one run


def step(name: str, argv: list[str], out: Path, loads: dict) -> None:
    """Run one workbench command unless its output is there (a finished step); the load before and after it and
    what other processes used meanwhile."""
    if out.exists():
        print(f"{name}: {out} exists, kept", file=sys.stderr)
        return
    loads[name] = {"before": load_average(every=True)}
    mark = cpu_mark()
    print(f"{name}: workbench {' '.join(argv)}", file=sys.stderr, flush=True)
    if workbench(argv) != 0:
        raise WorkbenchError(f"{name} failed (above); rerun this command to continue where it stopped")
    loads[name]["after"] = load_average(every=True)
    loads[name]["others"] = others(mark, cpu_mark())


def idle(loads: dict) -> bool:
    """No step shared the machine (provenance.quiet over the CPU others used during it; the load average before a
    step says what ran the minute before, the one after is the step's own)."""
    steps = [v for v in loads.values() if isinstance(v, dict)]
    return bool(steps) and all(quiet(v.get("others")) for v in steps)


def verdicts(check: dict) -> dict:
    """Issue 48's two conditions over a vllm-check result: every (batch, K) row within TOLERANCE, and every plan
    row's choice vLLM's best or within noise of it."""
    rows = [s for s in check["speed"] if s.get("predicted_speedup") and s.get("decode_speedup")]
    errors = [abs(s["predicted_speedup"] - s["decode_speedup"]) / s["decode_speedup"] for s in rows]
    return dict(rows=len(rows), worst_error=max(errors) if errors else None,
                all_within_tolerance=bool(errors) and max(errors) <= TOLERANCE,
                choice_best_or_within_noise=all(r["choice_is_best_or_within_noise"] for r in check["plan_check"]))


def run(args) -> int:
    from workbench.export.vllm_check import check_table, load_note
    from workbench.export.vllm_speed import repriced

    out_dir, name = Path(args.out_dir), args.name
    top_k = parse_ints(args.k, "--k", "depth")[-1]  # before the folder is made: '1,a' is one error line
    parse_ints(args.batch_sizes, "--batch-sizes", "batch")
    out_dir.mkdir(parents=True, exist_ok=True)
    cal = args.calibration or str(default_calibration())
    lat, plan, check = (out_dir / f"{name}-{s}" for s in ("latency.csv", "plan.json", "check.json"))
    py = (["--vllm-python", args.vllm_python] if args.vllm_python else []) + (["--vllm-eager"] if args.vllm_eager
                                                                                else [])
    ks = ",".join(str(k) for k in range(1, top_k + 1))
    loads_file = out_dir / f"{name}-loads.json"
    loads = json.loads(loads_file.read_text()) if loads_file.exists() else {}
    loads.setdefault("start", load_average(every=True))
    try:
        step("surface", ["latency", "--engine", "vllm", *py, "--calibration", cal, "--prompts", args.surface_prompts,
                         "--limit", str(args.surface_limit), "--batch-sizes", args.batch_sizes, "--k", ks, "--repeats",
                         str(args.surface_repeats), "--max-new-tokens", str(args.max_new_tokens), "--out", str(lat)],
             lat, loads)
        step("plan", ["plan", "--calibration", cal, "--latency", str(lat), "--batch-sizes", args.batch_sizes,
                      "--max-new-tokens", str(args.max_new_tokens), "--out", str(plan)], plan, loads)
        step("check", ["vllm-check", *py, "--calibration", cal, "--plan", str(plan), "--k", ks, "--batch-sizes",
                       args.batch_sizes, "--limit", str(args.check_limit), "--max-new-tokens",
                       str(args.max_new_tokens), "--repeats", str(args.repeats), "--out", str(check)], check, loads)
    finally:
        atomic_write_json(loads_file, loads, "out_dir")
    res = repriced(json.loads(check.read_text()), json.loads(plan.read_text()))  # a kept check, a new surface
    atomic_write_json(check, res, "out_dir")
    if "others" not in res["load_average"] and (loads.get("check") or {}).get("others"):  # a check from before it
        used = loads["check"]["others"]  # measured what else ran itself: this bench's measure of the same step
        res["load_average"].update(others=used, idle=quiet(used))
        res["note"] = load_note(used) + " (measured by bench/vllm_plan.py around the check)"
    verdict = verdicts(res)
    one = next((r for r in res.get("plain_step") or [] if r["batch_size"] == 1), None)
    verdict["plain_step_batch1"] = one and dict(ratio=one["ratio"], within=one["ratio"] <= PLAIN_STEP)
    summary = dict(calibration=cal, latency=str(lat), plan=str(plan), check=str(check), load_average=loads,
                   cpus=os.cpu_count(), verdicts=verdict, plan_check=res["plan_check"], speed=res["speed"],
                   plain_step=res.get("plain_step"), vllm_compilation=res.get("vllm_compilation"),
                   vllm_version=res["vllm_version"], idle=idle(loads))
    head = [f"# vLLM plan priced on vLLM's rounds ({name})", "",
            f"Load average (1, 5, 15 min) at the start and per step, and the CPU cores other processes used during each "
            f"step: {json.dumps(loads)} on {os.cpu_count()} CPUs: "
            + ("idle (nothing else ran)." if summary["idle"] else "NOT idle: these speeds are not this machine's."),
            "", f"Verdicts (issue 48): {verdict['rows']} rows, worst |predicted - measured| / measured "
            + (f"{100 * verdict['worst_error']:.1f}%" if verdict["worst_error"] is not None else "-")
            + f" (<= {100 * TOLERANCE:.0f}%: {'yes' if verdict['all_within_tolerance'] else 'no'}); the plan's K vLLM's "
            f"best or within noise at every batch size: {'yes' if verdict['choice_best_or_within_noise'] else 'no'}.",
            "", "Verdict (issue 49): our plain step at batch 1 / vLLM's ("
            f"{res.get('vllm_compilation') or '?'}), side by side: "
            + (f"{one['ratio']:.3f} (q1..q3 {one['ratio_q1']:.3f}..{one['ratio_q3']:.3f}; <= {PLAIN_STEP}: "
               f"{'yes' if one['ratio'] <= PLAIN_STEP else 'no'})." if one else "not measured (batch 1 not run)."),
            "", "The check:", ""]
    atomic_write_text(out_dir / f"{name}.md", "\n".join(head) + "\n" + check_table(res), "out_dir")
    atomic_write_json(out_dir / f"{name}.json", summary, "out_dir")
    print("\n".join(head[2:7]), file=sys.stderr)
    print(f"wrote {out_dir / name}.md and .json", file=sys.stderr)
    return 0


def parser() -> argparse.ArgumentParser:
    ap = ScriptParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calibration", help="calibration folder (default: the first under calibration/)")
    ap.add_argument("--vllm-python", help="python of vLLM's environment (default: $WORKBENCH_VLLM_PYTHON)")
    ap.add_argument("--batch-sizes", default="1,2,4,8")
    ap.add_argument("--k", default="1,2,3,4", help="K up to the largest of these (default 1,2,3,4; 0 always)")
    ap.add_argument("--surface-prompts", default="alpaca-eval", help="prompts the surface is served on")
    ap.add_argument("--surface-limit", type=int, default=16)
    ap.add_argument("--check-limit", type=int, default=16, help="held-out prompts checked (the surface's left out)")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--surface-repeats", type=int, default=4,
                    help="the surface's passes per engine and batch size (each serves as many prompts as the largest "
                         "batch size)")
    ap.add_argument("--repeats", type=int, default=4, help="the check's passes per engine and batch size")
    ap.add_argument("--out-dir", default=str(Path(__file__).resolve().parent.parent / "docs" / "results"))
    ap.add_argument("--name", default="vllm-plan-cpu")
    ap.add_argument("--vllm-eager", action="store_true", help="vLLM's enforce_eager (default: vLLM compiles its "
                    "model, as it serves)")
    return ap


def main(argv=None) -> int:
    return run_script(parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
