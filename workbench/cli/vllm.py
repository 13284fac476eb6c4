"""`workbench vllm-check`: the plan confirmed in vLLM (workbench/export/vllm_check.py), JSON + a markdown table."""
from __future__ import annotations

import json
import sys

from workbench import WorkbenchError
from workbench.cli.shared import bounded, model_args, parse_ints, write_output
from workbench.core.io import atomic_write_text, check_output, run_lock
from workbench.core.work import remove_work


def cmd_vllm_check(args) -> int:
    from workbench.plan.rank import read_plan
    from workbench.export.vllm_check import check_table, vllm_check, vllm_python

    vllm_python(args.vllm_python)  # one line saying how to make one, before any model loads
    check_output(args.out, "--out")
    if args.table:
        check_output(args.table, "--table")
    if args.max_new_tokens < 1 or (args.limit is not None and args.limit < 1):
        raise WorkbenchError("--max-new-tokens and --limit must be positive")
    anchor = args.out or args.table  # finished engines and decoder parts wait beside it (a rerun resumes)
    with run_lock(anchor, "--out" if args.out else "--table", kind="file"):
        res = vllm_check(args.calibration, read_plan(args.plan) if args.plan else None, args.model, args.heads,
                         parse_ints(args.k, "--k", "depth"), parse_ints(args.batch_sizes, "--batch-sizes", "batch"),
                         args.prompts, args.limit, args.max_new_tokens, args.vllm_python, args.raw, work=anchor)
        table = check_table(res)
        if args.table:
            atomic_write_text(args.table, table, "--table")
        write_output(json.dumps(res, indent=1) + "\n", args.out, "vllm-check JSON")
        remove_work(anchor)
    print(table, file=sys.stderr if not args.out else sys.stdout)
    return 0


def add_vllm_check(sub) -> None:
    p = sub.add_parser("vllm-check", help="run the heads (and a plan) in vLLM beside our prediction and decoder",
                       description="On the same prompts, in one run: vLLM's own per-position acceptance counters "
                                   "and mean accepted length per K beside our live decoder's and the calibration's "
                                   "prediction; greedy outputs compared (vLLM speculative vs plain vLLM vs our plain "
                                   "greedy); vLLM tokens/s with and without speculation per batch size. vLLM runs in "
                                   "its own environment (--vllm-python). Resumable with --out (or --table): rerun "
                                   "the same command to continue (finished engines wait in OUT.work/).",
                       parents=[model_args("--model", "--heads")])
    p.add_argument("--vllm-python", help="python of vLLM's environment (default: $WORKBENCH_VLLM_PYTHON)")
    p.add_argument("--calibration", metavar="DIR", help="calibration folder: the prediction and the held-out "
                   "prompts (default: the first under calibration/)")
    p.add_argument("--plan", metavar="PLAN.json", help="also run the plan's own config at each batch size")
    p.add_argument("--k", default="1,2,3,4", help="chain lengths K to run (default 1,2,3,4)")
    p.add_argument("--batch-sizes", default="1,2,4,8", help="vLLM batch sizes (default 1,2,4,8)")
    p.add_argument("--prompts", default="holdout", help="'holdout' (the calibration's held-out prompts, default), "
                   "alpaca-eval, mt-bench or a prompt file")
    p.add_argument("--limit", type=bounded("count"), default=16, help="first N prompts (default 16)")
    p.add_argument("--raw", action="store_true", help="prompts as-is, without the chat template")
    p.add_argument("--max-new-tokens", type=bounded("tokens"), default=64)
    p.add_argument("--table", metavar="FILE.md", help="also write the markdown table here")
    p.add_argument("--out", metavar="FILE.json", help="the result JSON (default: stdout)")
    p.set_defaults(func=cmd_vllm_check)
