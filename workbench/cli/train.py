"""`workbench train-heads` (Medusa-1 and Medusa-2 recipes) and `workbench eval-heads`."""
from __future__ import annotations

import argparse
import json
import sys

from workbench import WorkbenchError
from workbench.cli.shared import bounded, finite, model_args, renamed
from workbench.core.io import check_output


RECIPE_DEFAULTS = {  # flags whose default (never whose unit) depends on --recipe
    "medusa-1": dict(tokens=200_000, max_new_tokens=256, gen_batch=64, steps=3000, gen_share=0.5),
    "medusa-2": dict(tokens=50_000, max_new_tokens=128, gen_batch=32, steps=2000, gen_share=0.3),
}
RECIPE_FLAGS = {  # flags of one recipe only, each in one unit: (dest, flag, default)
    "medusa-1": [("positions_per_step", "--positions-per-step", 256)],
    "medusa-2": [("sequences_per_step", "--sequences-per-step", 4), ("adapter_lr", "--adapter-lr", 1e-4)],
}


def _recipe_flags(args) -> None:
    """Fill the recipe's own flags' defaults; the other recipe's flags are one error line."""
    other = "medusa-2" if args.recipe == "medusa-1" else "medusa-1"
    given = [flag for dest, flag, _ in RECIPE_FLAGS[other] if getattr(args, dest) is not None]
    if given:
        raise WorkbenchError(f"{', '.join(given)}: {other} only; --recipe {args.recipe} takes "
                             f"{', '.join(flag for _, flag, _ in RECIPE_FLAGS[args.recipe])}")
    for dest, _, default in RECIPE_FLAGS[args.recipe]:
        if getattr(args, dest) is None:
            setattr(args, dest, default)


def _default_training_files() -> list[str]:
    """Without --prompts: the demo heads' three training sets from $WORKBENCH_DATA_DIR. They do not ship (7.7 MB,
    one of them research-only) and the packaged sets are held out for calibration, so none is one error line."""
    from workbench.train.distill import DEFAULT_TRAIN_FILES, default_prompt_files

    files = default_prompt_files()
    if not files:
        raise WorkbenchError("no training prompts: pass --prompts FILE [FILE ...] (Alpaca-format JSON/JSONL/CSV), or "
                             f"set WORKBENCH_DATA_DIR to a folder holding {', '.join(DEFAULT_TRAIN_FILES)} (the demo "
                             "heads' sets; alpaca-eval and mt-bench are held out for calibration)")
    return files


def cmd_train_heads(args) -> int:
    from pathlib import Path

    for k, v in RECIPE_DEFAULTS[args.recipe].items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    _recipe_flags(args)
    if args.recipe == "medusa-2":
        return _cmd_train_medusa2(args)

    from workbench.runtime.parallel import one_process_warning
    from workbench.train.distill import interleaved_prompts
    from workbench.train.medusa1 import TrainConfig, default_folders, train_heads

    if one_process_warning():
        print(one_process_warning(), file=sys.stderr)
    files = args.prompts or _default_training_files()
    cfg = TrainConfig(prompts=interleaved_prompts(files, args.seed), num_heads=args.num_heads,
                      num_layers=args.num_layers, tied=not args.untied, tokens=args.tokens,
                      max_new_tokens=args.max_new_tokens, gen_batch=args.gen_batch, gen_dtype=args.gen_dtype,
                      steps=args.steps, batch_size=args.positions_per_step, lr=args.heads_lr or TrainConfig.lr, seed=args.seed,
                      active_steps=args.active_steps, answers_per_prompt=args.answers_per_prompt,
                      init=str(Path(args.init).resolve()) if args.init else None,
                      time_budget=args.time_budget, gen_share=args.gen_share)
    if args.time_budget is not None and not args.time_budget > 0:
        raise WorkbenchError(f"--time-budget {args.time_budget:g}: give the seconds the run may take, e.g. 540")
    if not 0 < args.gen_share < 1:
        raise WorkbenchError(f"--gen-share {args.gen_share:g}: a share of --time-budget in (0, 1), e.g. 0.5")
    if min(args.num_heads, args.num_layers, args.steps, args.tokens, args.answers_per_prompt) < 1:
        raise WorkbenchError("--num-heads, --num-layers, --steps, --tokens and --answers-per-prompt must be positive")
    if args.init and not Path(args.init).exists():
        raise WorkbenchError(f"--init {args.init}: no such heads folder or file")
    if not 0 <= args.active_steps <= args.steps:
        raise WorkbenchError(f"--active-steps {args.active_steps}: must be between 0 and --steps ({args.steps})")
    work, out = default_folders(args.model)
    work, out = Path(args.work or work), Path(args.out or out)
    check_output(work, "work", "folder")
    check_output(out, "out", "folder")
    summary = train_heads(work, cfg, args.model, out, args.device, device_map=args.device_map)
    if not summary["trained"]:  # a process of a data-parallel launch that did not finish last
        print(f"process {summary['rank']} of {summary['num_processes']}: its share of the data is in {work}/parts "
              f"({summary['answer_tokens']} answer tokens there so far); the last process to finish trains",
              file=sys.stderr)
        return 0
    print(json.dumps({k: summary[k] for k in ("answer_tokens", "steps", "validation")}, indent=2))
    print(f"heads written to {out}", file=sys.stderr)
    return 0


def _cmd_train_medusa2(args) -> int:
    from pathlib import Path

    from workbench.runtime.heads import DEMO_HEADS
    from workbench.train.medusa2 import Medusa2Config, train_medusa2
    from workbench.train.distill import interleaved_prompts
    from workbench.train.medusa1 import default_folders

    if args.untied or args.active_steps or args.answers_per_prompt != 1 or args.device_map:
        raise WorkbenchError("--untied, --active-steps, --answers-per-prompt and --device-map are medusa-1 "
                             "options: drop them with --recipe medusa-2")
    init = args.init or (str(DEMO_HEADS) if args.model is None and args.warmup == "two-stage" else None)
    if init and not Path(init).exists():
        raise WorkbenchError(f"--init {init}: no such heads folder or file")
    cfg = Medusa2Config(prompts=[], num_heads=args.num_heads, num_layers=args.num_layers, tokens=args.tokens,
                        max_new_tokens=args.max_new_tokens, max_prompt_tokens=args.max_prompt_tokens,
                        gen_batch=args.gen_batch, gen_dtype=args.gen_dtype, steps=args.steps,
                        batch_size=args.sequences_per_step, lr=args.adapter_lr, heads_lr=args.heads_lr,
                        warmup_steps=args.warmup_steps,
                        lambda0=args.lambda0, decay=args.decay, warmup=args.warmup, ramp_steps=args.ramp_steps,
                        lora_r=args.lora_r, lora_alpha=args.lora_alpha, lora_dropout=args.lora_dropout,
                        init=str(Path(init).resolve()) if init else None, amp=args.amp, seed=args.seed,
                        time_budget=args.time_budget, gen_share=args.gen_share)  # checks every setting
    cfg.prompts = interleaved_prompts(args.prompts or _default_training_files(), args.seed)
    work, _ = default_folders(args.model)
    work = Path(args.work) if args.work else work.with_name(work.name + "-medusa2")
    out = Path(args.out) if args.out else Path(f"{work.name}-out")
    check_output(work, "work", "folder")
    check_output(out, "out", "folder")
    summary = train_medusa2(work, cfg, args.model, out, args.device)
    if not summary["trained"]:
        print(f"process {summary.get('rank', 0)}: done ({summary['steps']} steps); the main process writes {out}",
              file=sys.stderr)
        return 0
    print(json.dumps({k: summary[k] for k in ("answer_tokens", "steps", "validation")}, indent=2))
    print(f"Medusa-2 written to {out}: adapter/, heads/, merged/ (--model {out}/merged --heads {out}/merged), "
          "medusa/", file=sys.stderr)
    return 0


def add_train_heads(sub) -> None:
    p = sub.add_parser("train-heads", help="train Medusa-1 heads on the model's own (self-distilled) answers",
                       description="Train Medusa-1 heads on a frozen base model with self-distilled data. "
                                   "Resumable: rerun the same command to continue.",
                       # no --heads (it writes heads: --out, --init); no --dtype (--gen-dtype for generating,
                       # training loads the base in fp32)
                       parents=[model_args("--model", "--device", "--device-map")])
    p.add_argument("--prompts", nargs="+", metavar="FILE",
                   help="Alpaca-format prompt files (default: the demo heads' three training sets in "
                        "$WORKBENCH_DATA_DIR; without them, give files)")
    p.add_argument("--num-heads", type=bounded("depth"), default=4)
    p.add_argument("--num-layers", type=bounded("depth"), default=1, help="ResBlocks per head")
    p.add_argument("--untied", action="store_true", help="give each head its own lm_head (format 1, large files)")
    p.add_argument("--tokens", type=bounded("data"), help="self-distilled answer tokens to generate (default 200000; medusa-2 50000)")
    p.add_argument("--answers-per-prompt", type=bounded("rank"), default=1, metavar="N",
                   help="answers per prompt: answer j > 0 opens with the model's (j+1)-th likeliest first token, "
                        "then goes on greedily (more on-policy data once the prompts run out)")
    p.add_argument("--max-new-tokens", type=bounded("tokens"), help="answer length (default 256; medusa-2 128)")
    p.add_argument("--gen-batch", type=bounded("batch"), help="prompts answered together (default 64; medusa-2 32)")
    p.add_argument("--gen-dtype", default="bfloat16", choices=["bfloat16", "float16", "float32", "bf16", "fp16", "fp32"], help="dtype for generating the data (bf16 is ~3x faster on CPU)")
    p.add_argument("--steps", type=bounded("count"), help="optimizer steps (default 3000; medusa-2 2000)")
    p.add_argument("--positions-per-step", type=bounded("batch"), metavar="N",
                   help="medusa-1: answer positions per optimizer step (default 256)")
    p.add_argument("--heads-lr", type=finite(0, 1e3, open_low=True), metavar="LR",
                   help="the heads' learning rate (default 1e-3; medusa-2: 4x --adapter-lr)")
    renamed(p, "--batch-size", "--positions-per-step N (medusa-1) or --sequences-per-step N (medusa-2): the "
                               "training batch's unit depends on the recipe")
    renamed(p, "--lr", "--heads-lr LR (the heads', either recipe) or --adapter-lr LR (medusa-2's backbone adapter)")
    p.add_argument("--active-steps", type=bounded("count", 0), default=0, metavar="N",
                   help="the first N steps use a softmax over only the tokens the data emits (~6x faster on CPU; "
                        "the remaining steps use the full vocabulary)")
    p.add_argument("--init", metavar="HEADS",
                   help="start from these heads instead of from zero (e.g. the same heads, once the data has grown)")
    p.add_argument("--time-budget", type=finite(), metavar="SECONDS",
                   help="stop in time: generation, training, validation and saving end within SECONDS (the heads "
                        "are written before it ends; the schedule is compressed to the time there is)")
    p.add_argument("--gen-share", type=finite(0, 1, open_low=True), metavar="F",
                   help="with --time-budget: the share of it generation may use (default 0.5; medusa-2 0.3)")
    p.add_argument("--seed", type=bounded("seed", 0), default=0)
    p.add_argument("--work", help="work folder for data and checkpoints (default: the user cache)")
    p.add_argument("--out", help="output heads folder (default: the demo heads folder for the demo model); "
                   "medusa-2: the output folder (adapter/, heads/, merged/, medusa/)")
    m2 = p.add_argument_group("--recipe medusa-2 (heads trained with a LoRA-adapted backbone: docs/medusa2.md)")
    m2.add_argument("--recipe", choices=["medusa-1", "medusa-2"], default="medusa-1",
                    help="medusa-1: heads on a frozen base (default); medusa-2: heads + LoRA backbone, "
                         "loss KL(original || adapted) + lambda0 * sum_k decay^k CE_k")
    m2.add_argument("--lambda0", type=finite(0, 1e3), default=0.01, help="weight of the heads' loss (default 0.01, "
                    "the recipe's for self-distillation; 0.2 for training on the model's SFT data)")
    m2.add_argument("--decay", type=finite(0, 1, open_low=True), default=0.8, help="lambda_k = decay^k (default 0.8)")
    m2.add_argument("--sequences-per-step", type=bounded("batch"), metavar="N",
                    help="sequences (prompt + answer) per optimizer step (default 4)")
    m2.add_argument("--adapter-lr", type=finite(0, 1e3, open_low=True), metavar="LR",
                    help="the LoRA adapter's learning rate (default 1e-4)")
    m2.add_argument("--warmup", choices=["two-stage", "sine"], default="two-stage",
                    help="heads warm-up: two-stage starts from Medusa-1 heads (--init; the demo heads for the demo "
                         "model), sine raises lambda0 from 0 over --ramp-steps (default)")
    m2.add_argument("--ramp-steps", type=bounded("count", 0), default=0, help="sine: steps for lambda0 to rise (0 = --steps / 4)")
    m2.add_argument("--warmup-steps", type=bounded("count", 0), default=20, help="learning-rate warm-up steps, then cosine")
    m2.add_argument("--lora-r", type=bounded("rank"), default=32)
    m2.add_argument("--lora-alpha", type=bounded("count"), default=16)
    m2.add_argument("--lora-dropout", type=finite(0, 1), default=0.05)
    m2.add_argument("--max-prompt-tokens", type=bounded("tokens"), default=384, help="skip longer prompts (default 384)")
    m2.add_argument("--amp", action=argparse.BooleanOptionalAction, default=None,
                    help="bf16 autocast for the forwards (default: on CUDA only; a CPU without bf16 units is ~7x "
                         "slower with it)")
    p.set_defaults(func=cmd_train_heads)
    add_eval_heads(sub)

# ==== eval-heads ==============================================================================================

def cmd_eval_heads(args) -> int:
    from pathlib import Path

    from workbench.core.io import atomic_write_json, atomic_write_text, run_lock
    from workbench.core.work import remove_work
    from workbench.train.evaluate import eval_table, evaluate_medusa2

    if not Path(args.medusa2).is_dir():
        raise WorkbenchError(f"--medusa2 {args.medusa2}: no such folder (give the merged/ folder that "
                             "`train-heads --recipe medusa-2` wrote)")
    if not 0 < args.holdout < 1:
        raise WorkbenchError(f"--holdout {args.holdout:g}: the held-out share in (0, 1) that calibrate used, e.g. 0.2")
    from workbench.trees.tree import load_tree

    load_tree(args.tree)  # a malformed tree fails before two models load (its depth is checked against the heads)
    for field, path in (("out", args.out), ("table", args.table)):
        check_output(path, field)
    anchor = args.out or args.table  # the finished phases wait beside it (a rerun resumes from them)
    with run_lock(anchor, "out" if args.out else "table", kind="file"):
        r = evaluate_medusa2(args.medusa2, args.model, args.heads, args.prompts, args.holdout, args.limit,
                             args.max_new_tokens, args.topk, args.tree, args.live, args.device, args.batch_size,
                             work=anchor)
        table = eval_table(r)
        if args.out:
            atomic_write_json(args.out, r, "out")
        if args.table:
            atomic_write_text(args.table, table, "table")
        remove_work(anchor)
    print(table)
    return 0


def add_eval_heads(sub) -> None:
    p = sub.add_parser("eval-heads", help="Medusa-1 vs Medusa-2 on held-out prompts: head accuracy, backbone "
                       "drift, live tokens/step",
                       description="Evaluate a Medusa-2 model (the merged/ folder of `train-heads --recipe medusa-2`) "
                                   "against the base model with Medusa-1 heads, on the held-out split of a prompt "
                                   "set (as calibrate splits it): per-head top-1..top-k, backbone drift from the "
                                   "original (top-1 agreement, KL, perplexity of its own answers, greedy identity) "
                                   "and live tokens/step and speedup with one tree. Resumable with --out (or "
                                   "--table): rerun the same command to continue (finished phases wait in OUT.work/).",
                       parents=[model_args("--model", "--heads", "--device")])
    p.add_argument("--medusa2", required=True, help="the Medusa-2 model folder (OUT/merged)")
    p.add_argument("--prompts", default="alpaca-eval", help="prompt set name or file (default alpaca-eval)")
    p.add_argument("--holdout", type=finite(0, 1, open_low=True), default=0.2, help="held-out share, as calibrate (default 0.2)")
    p.add_argument("--limit", type=bounded("count"), default=32, help="held-out prompts used (default 32)")
    p.add_argument("--max-new-tokens", type=bounded("tokens"), default=64)
    p.add_argument("--topk", type=bounded("rank"), default=5)
    p.add_argument("--tree", default="mc_sim_7b_63", help="tree for the live decoding (default mc_sim_7b_63)")
    p.add_argument("--live", type=bounded("count", 0), metavar="N", help="live decoding on the first N of the prompts (default all; "
                   "0: none, accuracy and drift only)")
    p.add_argument("--gen-batch", dest="batch_size", type=bounded("batch"), default=8,
                   help="prompts answered together (default 8)")
    renamed(p, "--batch-size", "--gen-batch N")
    p.add_argument("--out", help="JSON file")
    p.add_argument("--table", help="Markdown table file")
    p.set_defaults(func=cmd_eval_heads)
