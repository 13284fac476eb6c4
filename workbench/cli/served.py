"""`workbench calibrate --engine vllm` and `calibrate --metrics / --requests`: a served calibration
(workbench/calibrate/served.py) from vLLM's own counters, for any drafter it serves."""
from __future__ import annotations

import sys
from pathlib import Path

from workbench import WorkbenchError
from workbench.core.io import check_output, run_lock
from workbench.core.outputs import check_not_inputs

SERVED_FLAGS = ("method", "k", "draft_model", "vllm_python", "metrics", "requests", "vllm_version")
WORKBENCH_ONLY = ("continuations", "record_topk", "trees_dir", "holdout_changed", "topk_changed")  # our calibration's flags, not a served one


def served_wanted(args) -> bool:
    return args.engine == "vllm" or bool(args.metrics or args.requests)


def cmd_served(args) -> int:
    from workbench.calibrate.folder import calibration_root, slug
    from workbench.calibrate.served import check_method, cut, write_served
    from workbench.calibrate.served_read import metrics_counts, request_counts

    from workbench.trees.tree import MEDUSA_TOPK

    args.topk_changed, args.holdout_changed = args.topk != MEDUSA_TOPK, args.holdout != 0.2
    read = bool(args.metrics or args.requests)
    given = [f"--{f.replace('_changed', '').replace('_', '-')}" for f in WORKBENCH_ONLY if getattr(args, f, None)
             and not (f == "holdout_changed" and not read)]  # a run holds prompts out as ours does; a read has none
    if given:
        raise WorkbenchError(f"{', '.join(given)}: for our heads' calibration; a served one counts vLLM's drafts")
    if args.metrics and args.requests:
        raise WorkbenchError("give --metrics BEFORE [AFTER] or --requests FILE, not both")
    if args.metrics and len(args.metrics) > 2:
        raise WorkbenchError(f"--metrics takes one or two scrapes (before, after), got {len(args.metrics)}")
    method = check_method(args.method if args.method is not None else ("medusa" if args.heads else None))
    if read and (args.heads or args.draft_model or args.vllm_python or args.limit):
        raise WorkbenchError("--metrics / --requests read counts already made: --heads, --draft-model, --limit "
                             "and --vllm-python are for a run (calibrate --engine vllm)")
    folder = Path(args.out) if args.out else calibration_root() / (
        args.name or f"served-{method}-" + slug("metrics" if read else args.prompts, file_stem=True))
    check_output(folder, "out" if args.out else "name", "folder")
    inputs = {f"--metrics {m}": m for m in args.metrics or []} | ({"--requests": args.requests} if args.requests
                                                                  else {})
    check_not_inputs({"--out": (folder, "folder")}, inputs)
    if read:
        for what, path in inputs.items():
            if not Path(path).is_file():
                raise WorkbenchError(f"{what}: no such file")
        if args.metrics:
            texts = [(f"--metrics {m}", Path(m).read_text(encoding="utf-8", errors="replace")) for m in args.metrics]
            counts, facts = metrics_counts(texts)
        else:
            counts, facts = request_counts(args.requests, f"--requests {args.requests}"), {}
        counts = cut(counts, args.k)
        setting = dict(engine="vllm", engine_version=args.vllm_version, method=method, model=facts.get(
            "model_name") or args.model, prompts=args.prompts if args.prompts != "alpaca-eval" else None,
                       source="metrics" if args.metrics else "requests",
                       inputs=[str(Path(p).resolve()) for p in inputs.values()], engines=facts.get("engines"))
        runs = [counts]
    else:
        runs, setting = _run(args, method)
        counts = runs[-1]
    with run_lock(folder, "out"):
        write_served(folder, counts, setting, runs[:-1])
    for c in runs:
        t = c.totals()
        print(f"vLLM {setting.get('engine_version') or ''} {method} at K={c.k}: {c.drafts} drafts, {c.accepted} of "
              f"{c.draft_tokens} draft tokens accepted, mean acceptance length {t['mean_acceptance_length']:.3f}"
              + (f", drafts on {t['draft_share']:.0%} of {c.decode_steps} decoding steps, tokens/step "
                 f"{1 + sum(c.per_step()):.3f}" if c.decode_steps else ""))
    print(counts.table().to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    print(f"served calibration written to {folder}", file=sys.stderr)
    return 0


def _run(args, method: str):
    """Serve the prompts in vLLM with the drafter at each K = 1..--k (default 4), each in a run of its own (why:
    calibrate/served.py): ([counts per K, ascending], setting)."""
    from workbench.calibrate.finish import holdout_split
    from workbench.core.data import load_prompt_records
    from workbench.export.vllm_check import vllm_inputs
    from workbench.measure.vllm_acceptance import served_acceptance
    from workbench.measure.vllm_runner import draft_folder, vllm_python
    from workbench.runtime.models import model_label

    py = vllm_python(args.vllm_python)  # one line saying how to make one, before any model loads
    if (args.device or "cpu") != "cpu" or (args.dtype or "float32") != "float32":
        raise WorkbenchError("--device/--dtype: --engine vllm serves vLLM's CPU build in fp32: drop them")
    if method == "medusa" and args.draft_model:
        raise WorkbenchError("--method medusa drafts with our heads: give them as --heads DIR, not --draft-model")
    if method != "medusa" and args.heads:
        raise WorkbenchError(f"--heads are Medusa heads: with --method {method} give --draft-model DIR if it "
                             "needs weights")
    if method in ("eagle", "eagle3", "draft_model", "mlp_speculator", "dflash", "dspark") and not args.draft_model:
        raise WorkbenchError(f"--method {method} needs --draft-model DIR (the drafter's weights)")
    if args.draft_model:
        draft_folder(args.draft_model, method)  # before any model loads; its vocabulary once the model's is known
    records = load_prompt_records(args.prompts, args.limit)
    held = holdout_split([r[0] for r in records], args.holdout)  # never served: `vllm-check` checks a plan on them
    records = [r for r in records if r[0] not in held]
    inputs = vllm_inputs(args.model, args.heads, records, False, heads=method == "medusa")
    k = args.k or 4
    if method == "medusa" and k > inputs["heads"].num_heads:
        raise WorkbenchError(f"--k {k}: the heads draft at most {inputs['heads'].num_heads} tokens (one per head)")
    drafter = {"method": "medusa", "model": inputs["heads_folder"]} if method == "medusa" else \
        {"method": method} | ({"model": draft_folder(args.draft_model, method, inputs["model_dir"])}
                              if args.draft_model else {})
    runs, where = served_acceptance(py, inputs["model_dir"], drafter, k, inputs["ids"], [r[0] for r in records],
                                    inputs["eos"], min(8, len(records)), args.max_new_tokens)
    return runs, dict(engine="vllm", engine_version=where.get("vllm"), method=method,
                        draft_model=drafter.get("model"), model=model_label(args.model), prompts=args.prompts,
                        limit=args.limit, holdout_ids=sorted(held), max_new_tokens=args.max_new_tokens,
                        source="calibrate",
                        num_prompts=len(records), speculative_config=dict(drafter, num_speculative_tokens=k),
                        setting=where)


def add_served_args(p) -> None:
    """calibrate's flags for a served calibration."""
    from workbench.calibrate.served import VLLM_DRAFTERS
    from workbench.cli.shared import bounded

    p.add_argument("--engine", choices=["workbench", "vllm"], default="workbench",
                   help="workbench: our heads' ranks (default); vllm: serve the prompts in vLLM with --method at "
                        "each K = 1..--k (a run each) and write a served calibration from vLLM's own spec-decode "
                        "counters")
    p.add_argument("--method", metavar="M", help="--engine vllm: vLLM's drafter (" + ", ".join(VLLM_DRAFTERS)
                   + "; default medusa with --heads)")
    p.add_argument("--k", type=bounded("depth"), metavar="K", help="--engine vllm: num_speculative_tokens, the largest K a plan "
                   "weighs (default 4): vLLM serves the prompts at each K = 1..K in a run of its own; with "
                   "--metrics/--requests: keep the first K positions")
    p.add_argument("--draft-model", metavar="DIR", help="--engine vllm: the drafter's weights for --method")
    p.add_argument("--vllm-python", help="--engine vllm: python of vLLM's environment (default: "
                                         "$WORKBENCH_VLLM_PYTHON)")
    p.add_argument("--metrics", nargs="+", metavar="SCRAPE", help="a served calibration from a running vLLM "
                   "server's /metrics text: BEFORE AFTER (the counters' difference) or one scrape (since it "
                   "started); with --method, the drafter it serves")
    p.add_argument("--requests", metavar="FILE", help="a served calibration from vLLM's per-request statistics "
                   "(JSON or JSON lines of responses or their metrics.speculative_decoding); with --method")
    p.add_argument("--vllm-version", metavar="X.Y.Z", help="with --metrics/--requests: the server's vLLM release, "
                   "for the record")
