"""`workbench calibrate`: the heads' accuracies, path statistics and tuned trees of a model over a prompt set."""
from __future__ import annotations

import sys
from dataclasses import fields

from workbench import WorkbenchError
from workbench.cli.served import SERVED_FLAGS, add_served_args, cmd_served, served_wanted
from workbench.cli.shared import bounded, finite, model_args, parse_ints, renamed, warn_line
from workbench.core.io import check_output
from workbench.core.outputs import check_not_protected, protected_folders
from workbench.trees.tree import MEDUSA_TOPK

PROMPTS, BUDGETS, HOLDOUT, GEN_BATCH = "alpaca-eval", "16,32,64", 0.2, 32  # defaults --record-topk checks against


def _record_topk(args) -> int:
    """`calibrate --record-topk --name NAME`: topk.parquet for a calibration finished before `calibrate` recorded
    it with the ranks (per-step trees' replay)."""
    from workbench.calibrate.folder import TOPK, Calibration, calibration_root
    from workbench.calibrate.topk import record_topk
    from workbench.runtime.models import load_model_and_heads

    ignored = [flag for flag, given in (("--prompts", args.prompts != PROMPTS), ("--limit", args.limit is not None),
                                        ("--budgets", args.budgets != BUDGETS), ("--holdout", args.holdout != HOLDOUT),
                                        ("--topk", args.topk != MEDUSA_TOPK), ("--continuations", args.continuations),
                                        ("--trees-dir", args.trees_dir), ("--force", args.force),
                                        ("--gen-batch", args.batch_size != GEN_BATCH)) if given]
    if ignored:  # the folder's own prompts, split, top-k and answers are what gets recorded
        raise WorkbenchError(f"{', '.join(ignored)}: not used by --record-topk, which records the finished "
                             "calibration's own held-out answers: drop them (only --name/--out, --model, --heads, "
                             "--device, --dtype and --max-new-tokens apply)")
    folder = args.out or (calibration_root() / args.name if args.name else None)
    if folder is None:
        raise WorkbenchError("--record-topk works on a finished calibration: name it with --name NAME or --out DIR")
    cal = Calibration(folder, "record_topk")
    check_output(cal.folder / TOPK, "record_topk")  # before the model loads
    model, tok, heads = load_model_and_heads(args.model, args.heads, args.device, args.dtype)
    df = record_topk(cal.folder, model, tok, heads, max_new_tokens=args.max_new_tokens)
    print(f"{cal.folder / 'topk.parquet'}: {len(df)} held-out positions x {heads.num_heads} heads x top-"
          f"{cal.meta['topk']}")
    return 0


def _cmd_calibrate(args) -> int:
    from workbench.calibrate.run import CalibrateConfig, calibrate
    from workbench.runtime.parallel import one_process_warning

    if served_wanted(args):
        return cmd_served(args)
    if any(getattr(args, f) for f in SERVED_FLAGS):
        raise WorkbenchError("--method, --k, --draft-model, --vllm-python and --vllm-version calibrate a drafter "
                             "vLLM serves: add --engine vllm")
    if args.record_topk:
        return _record_topk(args)

    if one_process_warning():
        print(one_process_warning(), file=sys.stderr)
    if args.out:
        check_output(args.out, "out", "folder")
    elif args.name:
        from workbench.calibrate.folder import calibration_root

        check_output(calibration_root() / args.name, "name", "folder")
        check_not_protected({"--name": (calibration_root() / args.name, "folder")},
                            protected_folders(args.model, args.heads))
    check_output(args.trees_dir, "trees_dir", "folder")
    settings = {f.name: getattr(args, f.name) for f in fields(CalibrateConfig)}  # the flags are the fields
    meta = calibrate(CalibrateConfig(**settings | dict(budgets=parse_ints(args.budgets, "--budgets", "nodes"))))
    if "merged" in meta:  # a process of a data-parallel launch
        print(f"process {meta['rank']} of {meta['num_processes']}: computed {meta['computed']} of its "
              f"{meta['batches']} batch(es) (the others were on disk); "
              + ("merged every process's parts" if meta["merged"] else
                 f"its parts are in {meta['folder']}/parts, the last process to finish merges them"), file=sys.stderr)
        if not meta["merged"]:
            return 0
    print(f"{meta['num_prompts']} prompts, {meta['num_positions']} positions, {meta['num_heads']} heads, "
          f"top-{meta['topk']}; holdout {len(meta['holdout_ids'])} prompts")
    held = bool(meta["holdout_ids"])
    # tokens/step (names as in calibrate/folder.py): the tree's own model's mean over every fit position, a greedy
    # decoder replayed over the fit answers, and on the holdout prompts the joint mean and the replay
    print(f"{'tree':<44}{'nodes':>6}{'expected':>11}{'replay_fit':>11}"
          + (f"{'joint_holdout':>14}{'replay':>9}" if held else ""))
    for t in meta["trees"]:
        print(f"{t['name']:<44}{t['nodes']:>6}{t['expected_acceptance_length']:>11.4f}"
              f"{t['predicted_replay_fit']:>11.4f}"
              + (f"{t['holdout_acceptance_length']:>14.4f}{t['predicted_replay']:>9.4f}" if held else ""))
    for s in meta["trees_skipped"]:
        warn_line(f"no tree {s}")
    print(f"calibration written to {meta['folder']}", file=sys.stderr)
    return 0


def add_calibrate(sub) -> None:
    p = sub.add_parser("calibrate", help="measure head accuracies on the model's own greedy answers; build trees",
                       description="Record, at every position of the base model's greedy answers, the rank of the "
                                   "true token in each head's top-k; write ranks, accuracies and optimal trees "
                                   "(independent heads and measured joint path probabilities). Resumable: rerun the "
                                   "same command to continue.",
                       parents=[model_args("--model", "--heads", "--device", "--device-map", "--dtype")])
    p.add_argument("--prompts", default=PROMPTS, help="alpaca-eval, mt-bench (first turns), copy-edit (answers that copy from the prompt) or a JSON/JSONL/CSV/"
                   "parquet file with an instruction/prompt/question/turns column (default: alpaca-eval)")
    p.add_argument("--limit", type=bounded("count"), metavar="N", help="use the first N prompts")
    p.add_argument("--holdout", type=finite(0, 1), default=HOLDOUT, help="share of prompts kept out of the fit (default 0.2); "
                   "--engine vllm: never served, and `vllm-check` checks a plan on them")
    p.add_argument("--max-new-tokens", type=bounded("tokens"), default=128)
    p.add_argument("--topk", type=bounded("rank"), default=MEDUSA_TOPK, help="ranks recorded per head (Medusa's buffers use 10)")
    p.add_argument("--budgets", default=BUDGETS, help="tree sizes to build (default 16,32,64)")
    p.add_argument("--name", help="calibration name (default: MODEL-PROMPTS)")
    p.add_argument("--out", help="output folder (default: calibration/NAME)")
    p.add_argument("--gen-batch", dest="batch_size", type=bounded("batch"), default=GEN_BATCH,
                   help="prompts answered together (one generate batch, one part file; default 32)")
    renamed(p, "--batch-size", "--gen-batch N")
    p.add_argument("--force", action="store_true", help="start over when the folder holds a run with other arguments")
    p.add_argument("--record-topk", action="store_true",
                   help="on a folder calibrated before calibrate recorded them (--name/--out): record each "
                        "head's top-k ids and log-probs at its held-out positions (topk.parquet), which per-step "
                        "trees are replayed on; --model/--heads must be the calibration's own")
    p.add_argument("--continuations", metavar="DIR", help="reuse the greedy answers of a finished calibration of the "
                   "same model and prompts (new heads: skips generation)")
    p.add_argument("--trees-dir", help="where tree files go (default trees/, or OUT/trees with --out)")
    add_served_args(p)
    p.set_defaults(func=_cmd_calibrate)
