"""`workbench vllm-check`: the plan confirmed in vLLM (workbench/export/vllm_check.py), JSON + a markdown table;
`workbench latency --engine vllm`: vLLM's own round costs (workbench/measure/vllm_latency.py), a latency CSV."""
from __future__ import annotations

import json
import sys

from workbench import WorkbenchError
from workbench.cli.shared import bounded, model_args, parse_ints, report_written, write_output
from workbench.core.io import atomic_write_text, check_output, run_lock
from workbench.core.work import remove_work


VLLM_EAGER = ("vLLM without its compiled model (enforce_eager): each engine starts in seconds instead of ~20 s (~80 s "
              "the first time), but runs slower than vLLM serves by default (its CPU build compiles with inductor)")


def cmd_vllm_check(args) -> int:
    from workbench.calibrate.served import is_served
    from workbench.export.vllm_check import check_table
    from workbench.export.vllm_check_request import VllmCheckRequest
    from workbench.measure.vllm_runner import vllm_python

    req = VllmCheckRequest(args.calibration, args.plan, args.model, args.heads, tuple(parse_ints(args.k, "--k", "depth")),
                           tuple(parse_ints(args.batch_sizes, "--batch-sizes", "batch")), args.prompts, args.limit,
                           args.max_new_tokens, args.raw, args.repeats, args.vllm_eager, args.compile).checked()
    vllm_python(args.vllm_python)  # one line saying how to make one, before any model loads
    check_output(args.out, "out")
    if args.table:
        check_output(args.table, "table")
    anchor = args.out or args.table  # finished batch sizes and decoder parts wait beside it (a rerun resumes)
    if args.calibration and is_served(args.calibration):  # a drafter vLLM serves: plain vLLM is the referee
        return _served_check(args, anchor)
    return _checked(args, anchor, lambda: req.run(args.vllm_python, work=anchor), check_table)


def _checked(args, anchor, run, table_of) -> int:
    """Run a check under the output's lock; write its table and JSON, then drop the finished parts kept for resume."""
    with run_lock(anchor, "out" if args.out else "table", kind="file"):
        res = run()
        table = table_of(res)
        if args.table:
            atomic_write_text(args.table, table, "table")
        write_output(json.dumps(res, indent=1) + "\n", args.out, "vllm-check JSON")
        remove_work(anchor)
    print(table, file=sys.stderr if not args.out else sys.stdout)
    return 0


def _served_check(args, anchor) -> int:
    """vllm-check of a served calibration's drafter (export/vllm_served_check.py)."""
    from workbench.export.vllm_served_check import served_check, served_table
    from workbench.plan.plan_file import read_plan

    given = [f for f, on in (("--heads", args.heads), ("--compile/--no-compile", args.compile is not None)) if on]
    if given:
        raise WorkbenchError(f"{', '.join(given)}: our Medusa decoder's; a served calibration's drafter is checked "
                             "in vLLM alone (plain vLLM is the referee): drop them")
    plan = read_plan(args.plan) if args.plan else None
    ks, batches = parse_ints(args.k, "--k", "depth"), parse_ints(args.batch_sizes, "--batch-sizes", "batch")
    return _checked(args, anchor, lambda: served_check(
        args.calibration, plan, args.model, ks, batches, args.prompts, args.limit, args.max_new_tokens,
        args.vllm_python, args.raw, work=anchor, repeats=args.repeats, eager=args.vllm_eager), served_table)


def add_vllm_check(sub) -> None:
    p = sub.add_parser("vllm-check", help="run the heads (and a plan) in vLLM beside our prediction and decoder",
                       description="On the same prompts, in one run: vLLM's own per-position acceptance counters "
                                   "and mean accepted length per K beside our live decoder's and the calibration's "
                                   "prediction; greedy outputs compared (vLLM speculative vs plain vLLM vs our plain "
                                   "greedy); vLLM tokens/s with and without speculation per batch size. vLLM runs in "
                                   "its own environment (--vllm-python). Resumable with --out (or --table): rerun "
                                   "the same command to continue (finished batch sizes wait in OUT.work/).",
                       parents=[model_args("--model", "--heads", "--compile")])  # --compile: ours as vLLM serves
    p.add_argument("--vllm-python", help="python of vLLM's environment (default: $WORKBENCH_VLLM_PYTHON)")
    p.add_argument("--calibration", metavar="DIR", help="calibration folder: the prediction and the held-out "
                   "prompts (default: the one with the most prompts under calibration/); a served one (`calibrate "
                   "--engine vllm`) checks its drafter in vLLM against plain vLLM")
    p.add_argument("--plan", metavar="PLAN.json", help="also run the plan's own config at each batch size")
    p.add_argument("--k", default="1,2,3,4", help="chain lengths K to run (default 1,2,3,4)")
    p.add_argument("--batch-sizes", default="1,2,4,8", help="vLLM batch sizes (default 1,2,4,8)")
    p.add_argument("--prompts", default="holdout", help="'holdout' (the calibration's held-out prompts, default), "
                   "alpaca-eval, mt-bench or a prompt file")
    p.add_argument("--limit", type=bounded("count"), default=16, help="first N prompts (default 16)")
    p.add_argument("--raw", action="store_true", help="prompts as-is, without the chat template")
    p.add_argument("--max-new-tokens", type=bounded("tokens"), default=64)
    p.add_argument("--repeats", type=bounded("repeats"), default=3, help="timed passes over the prompts per engine and "
                   "batch size: the speedups' spread (default 3)")
    p.add_argument("--vllm-eager", action="store_true", help=VLLM_EAGER)
    p.add_argument("--table", metavar="FILE.md", help="also write the markdown table here")
    p.add_argument("--out", metavar="FILE.json", help="the result JSON (default: stdout)")
    p.set_defaults(func=cmd_vllm_check)


# ---------------------------------------------------------------------------------------- latency --engine vllm

DECODER_ONLY = ("mode", "random_config", "context", "sizes", "device_map", "envelope")  # our decoder's flags


def parse_ks(text: str | None, default) -> list[int]:
    """--k '0,1,2' -> [1, 2] (K = 0, plain vLLM, is always measured)."""
    if text is None:
        return list(default)
    rest = ",".join(x for x in str(text).replace(" ", "").split(",") if x not in ("0", ""))
    return parse_ints(rest, "--k", "depth") if rest else []


def cmd_latency_vllm(args) -> int:
    """`workbench latency --engine vllm`: vLLM's served rounds per (batch, K) as a latency CSV."""
    from pathlib import Path

    from workbench.measure.vllm_runner import draft_folder, vllm_python

    if args.engine != "vllm":
        raise WorkbenchError("--k, --method, --draft-model, --vllm-python and --vllm-eager time vLLM's rounds: add "
                             "--engine vllm")
    from workbench.export.vllm import VLLM_METHODS
    from workbench.measure.request import VllmLatencyRequest

    given = [k for k in DECODER_ONLY if getattr(args, k, None)]
    if not given and (args.compile or (args.device or "cpu") != "cpu" or (args.dtype or "float32") != "float32"):
        given = ["device/--dtype/--compile"]  # worded as one: --device/--dtype/--compile
    k = None if args.k is None else tuple(parse_ks(args.k, ()))
    req = VllmLatencyRequest(args.method, args.draft_model, args.heads, k,
                             tuple(parse_ints(args.batch_sizes, "--batch-sizes", "batch")) if args.batch_sizes else None,
                             args.repeats, args.warmup, args.prompts, args.calibration,
                             tuple(given)).resolved(VLLM_METHODS)  # the rules and defaults live in the request
    py = vllm_python(args.vllm_python)  # one line saying how to make one, before any model loads
    if args.draft_model:
        draft_folder(args.draft_model, args.method)  # before any model loads; its vocabulary once the model's is known
    check_output(args.out, "out")
    check_output(None if args.out else args.calibration, "calibration", "folder")
    from workbench.calibrate.folder import Calibration, default_latency_path, latency_path, read_meta
    from workbench.core.data import load_prompt_records
    from workbench.export.vllm_check import vllm_inputs
    from workbench.measure.vllm_latency import DEFAULT_KS, measure_vllm_rounds
    from workbench.runtime.heads import heads_fingerprint
    from workbench.runtime.models import model_label

    medusa, batches = req.medusa, list(req.batch_sizes)
    if args.calibration:
        read_meta(args.calibration)
    records = Calibration(args.calibration).holdout_prompts(args.limit) if args.prompts == "holdout" else \
        load_prompt_records(args.prompts, args.limit)
    inputs = vllm_inputs(args.model, args.heads, records, args.raw, heads=medusa)
    heads = inputs["heads"]
    ks = req.ks(heads.num_heads if medusa else None, DEFAULT_KS)
    drafter = {"method": "medusa", "model": inputs["heads_folder"]} if medusa else \
        {"method": args.method} | ({"model": draft_folder(args.draft_model, args.method, inputs["model_dir"])}
                                   if args.draft_model else {})
    label = model_label(args.model)
    out = Path(args.out) if args.out else (latency_path(args.calibration, "vllm-cpu") if args.calibration
                                           else default_latency_path(label, "vllm-cpu"))
    with run_lock(out, "out", kind="file"):  # finished batch sizes wait in OUT.work/ (a rerun resumes from them)
        df = measure_vllm_rounds(py, inputs["model_dir"], drafter, ks, inputs["ids"], [r[0] for r in records],
                                 batches, req.repeats, req.warmup,
                                 args.max_new_tokens, label,
                                 work=out,
                                 settings=dict(model=label, drafter=heads_fingerprint(heads) if medusa else drafter),
                                 eager=args.vllm_eager)
        atomic_write_text(out, df.to_csv(index=False), "out")
        remove_work(out)
    r0 = df.iloc[0]
    print(f"vLLM {r0['engine_version']} served rounds ({drafter['method']}), context {r0['context']} (range "
          f"{r0['context_min']}..{r0['context_max']}), median and interquartile range of {int(r0['repeats'])} passes:",
          file=sys.stderr)
    print(f"{'batch':>6}{'K':>4}{'ms':>10}{'q1..q3 ms':>18}{'t/t(K=0)':>10}{'tok/round':>11}", file=sys.stderr)
    for r in df.to_dict("records"):
        iqr = f"{1000 * r['seconds_q1']:.2f}..{1000 * r['seconds_q3']:.2f}"
        print(f"{r['batch']:>6}{r['tokens'] - 1:>4}{1000 * r['seconds']:>10.2f}{iqr:>18}{r['relative']:>10.3f}"
              f"{r['served_tokens_per_step']:>11.3f}", file=sys.stderr)
    report_written(df, out)
    return 0


def add_vllm_latency_args(p) -> None:
    """`latency`'s flags for --engine vllm (the parser is cli/tradeoffs.py's)."""
    p.add_argument("--engine", choices=["workbench", "vllm"], default="workbench",
                   help="whose step to time: workbench (our decoder, default) or vllm (vLLM's own round per batch "
                        "size and K, served on real prompts in vLLM's environment: K = 0 and --k, drafted by --heads "
                        "or --method/--draft-model; --repeats passes, default 4; --out default "
                        "latency-vllm-cpu.csv); `plan --latency` then prices what vLLM runs")
    p.add_argument("--vllm-python", help="--engine vllm: python of vLLM's environment (default: "
                                         "$WORKBENCH_VLLM_PYTHON)")
    p.add_argument("--k", metavar="K1,K2,..", help="--engine vllm: draft lengths K to time besides K = 0 (default: "
                                                  "1 to the heads' count, or 1,2,3,4 with --method)")
    p.add_argument("--method", help="--engine vllm: vLLM's drafter (default medusa, our --heads); eagle, eagle3, "
                                    "mtp, draft_model, ngram for plans from acceptance vectors")
    p.add_argument("--draft-model", metavar="DIR", help="--engine vllm: the drafter's weights for --method")
    p.add_argument("--vllm-eager", action="store_true", help="--engine vllm: " + VLLM_EAGER)
