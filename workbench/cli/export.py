"""`workbench export`: a tree or a plan written for one engine (workbench/export/engines.py), or a heads folder
vLLM loads; the export's warnings worded with this command's flags."""
from __future__ import annotations

import sys

from workbench import WorkbenchError
from workbench.cli.shared import bounded, flag_of, renamed, warn_line, write_output
from workbench.cli.trees import TREE_HELP, objective
from workbench.core.io import check_output
from workbench.core.notes import worded
from workbench.export.engines import PLAN_FORMATS, engine_safe, export_plan, export_tree
from workbench.export.trtllm import TRTLLM_CPP_MAX_DEPTH, TRTLLM_CPP_RANK_LIMIT, TRTLLM_MAX_DRAFT_LEN
from workbench.export.vllm import VLLM_METHODS
from workbench.plan.plan_file import looks_like_plan, read_plan
from workbench.trees.tree import MEDUSA_TOPK, load_tree

# How the CLI words the fix an export warning points to (core.notes.Note.fix): with its own flags.
EXPORT_FIXES = {
    "max_rank": f"or use --max-rank {MEDUSA_TOPK}",
    "engine_safe": "use --engine-safe",
    "budget": "or use a smaller --budget",
    "num_heads": "pass --num-heads to check it here",
    "trtllm_rank": f"use --engine-safe, or design with --max-rank {TRTLLM_CPP_RANK_LIMIT}",
    "trtllm_depth": f"use --engine-safe, or design with --max-depth {TRTLLM_CPP_MAX_DEPTH}",
    "dense": "use a dense tree (optimize --dense, --engine-safe vllm, or the app's dense option)",
}


def _cmd_export(args) -> int:
    if args.format == "vllm-heads":
        return _export_vllm_heads(args)
    if args.format == "speculation-profile":
        return _export_profile(args)
    if args.tree is None:
        raise WorkbenchError("give a TREE or PLAN to export (only --format vllm-heads takes none)")
    if args.model is not None or args.method or args.draft_model or args.vllm_version:
        if not looks_like_plan(args.tree) or args.model is not None:
            raise WorkbenchError("--model is for --format vllm-heads; --method, --draft-model and --vllm-version "
                                 "for a plan with --format vllm, vllm-token-schedule or trtllm-schedule")
    check_output(args.out, "out")
    if looks_like_plan(args.tree):
        return _export_plan(args)
    if args.format in ("trtllm-schedule", "vllm-token-schedule"):
        raise WorkbenchError(f"--format {args.format} writes a K per batch size from a plan (workbench plan --out "
                             "PLAN.json); for a tree use --format trtllm or vllm-tree")
    if args.heads_dir is not None:
        if args.heads_dir.strip().isdigit():  # the old --heads K of tree export
            raise WorkbenchError(f"--heads {args.heads_dir}: this command counts heads with --num-heads "
                                 f"{args.heads_dir.strip()} (--heads names a heads folder, for plan files)")
        raise WorkbenchError("--heads DIR checks a plan file against its heads: give a plan (workbench plan --out), "
                             "or --num-heads K for a tree")
    if args.synthetic or args.batch_sizes is not None:
        raise WorkbenchError("--synthetic and --batch-sizes read a plan file (workbench plan --out): this is a tree")
    fmt = "vllm" if args.format == "vllm-tree" else args.format
    tree = load_tree(args.tree, num_heads=args.heads)
    if args.engine_safe:  # accuracies price the repair; without them it is structural and its cost unknown
        value = objective(args)[1] if (args.accuracies or args.calibration) else None
        tree, note = engine_safe(tree, fmt, value, max_nodes=args.max_draft_len, heads=args.heads)
        if note.endswith("cost unknown"):
            note += " (give --accuracies or --calibration to minimise it)"
        print(f"note: {note}", file=sys.stderr)
    elif args.accuracies or args.calibration:
        raise WorkbenchError("--accuracies / --calibration only price an --engine-safe repair: add --engine-safe")
    text, warns = export_tree(tree, fmt, name=args.name, heads=args.heads, max_draft_len=args.max_draft_len,
                              strict=True)
    for w in warns:
        warn_line(w.words(EXPORT_FIXES))
    if fmt == "vllm":
        print("note: a --speculative-config fragment; vLLM requires num_speculative_tokens == number of tree "
              "nodes, and drafts trees with EAGLE-style proposers (add method eagle/eagle3 and model)",
              file=sys.stderr)
    write_output(text, args.out, f"{fmt} tree")
    return 0


def _export_plan(args) -> int:
    """`workbench export PLAN.json --format F`: one engine's settings from a plan (workbench/export/engines.py)."""

    if args.engine_safe or args.accuracies or args.calibration or args.heads is not None:
        raise WorkbenchError("a plan file takes --heads DIR, --synthetic and --batch-sizes; --engine-safe, "
                             "--accuracies, --calibration and --num-heads are for trees")
    plan = read_plan(args.tree)
    text, warns, notes = export_plan(plan, args.format, args.heads_dir, args.synthetic, args.batch_sizes, args.name,
                                     args.max_draft_len, args.method, args.draft_model, args.vllm_version)
    for n in notes:
        print(f"note: {worded(n, flag_of)}", file=sys.stderr)
    for w in warns:
        warn_line(w.words(EXPORT_FIXES))
    write_output(text, args.out, f"{args.format} settings")
    return 0


def _export_profile(args) -> int:
    """`workbench export --format speculation-profile --calibration DIR`: a calibration's per-position acceptance
    as a speculation_profile.json (workbench/export/profile.py)."""
    from workbench.core.outputs import check_not_inputs
    from workbench.export.profile import write_profile

    if args.tree is not None or args.accuracies or args.engine_safe:
        raise WorkbenchError("--format speculation-profile describes a calibration: give only --calibration DIR")
    check_output(args.out, "out")
    if args.out and args.calibration:
        check_not_inputs({"--out": (args.out, "file")}, {"--calibration": args.calibration})
    write_output(write_profile(args.calibration), args.out, "speculation profile")
    return 0


def _export_vllm_heads(args) -> int:
    """`workbench export [HEADS] --format vllm-heads --out DIR`: a heads folder vLLM's Medusa drafter loads."""
    from workbench.export.vllm_heads import export_vllm_heads

    if not args.out:
        raise WorkbenchError("--format vllm-heads writes a folder: give --out DIR")
    if args.tree is not None and args.heads_dir is not None:
        raise WorkbenchError("give the heads once: HEADS or --heads DIR")
    check_output(args.out, "out", "folder")
    _, notes = export_vllm_heads(args.tree or args.heads_dir, args.model, args.out)
    for n in notes:
        print(f"note: {worded(n, flag_of)}", file=sys.stderr)
    print(f"wrote vLLM Medusa heads to {args.out}", file=sys.stderr)
    return 0


def add_export(sub) -> None:
    """Register `export`."""
    e = sub.add_parser("export", help="write a tree or a plan for Medusa, TensorRT-LLM, vLLM or EAGLE",
                       description="A tree: written for one engine. A plan (`workbench plan --out`): vllm writes a "
                                   "--speculative-config with a K per batch-size range; the static formats write the "
                                   "tree of one row (--batch-sizes B, default 1).")
    e.add_argument("tree", metavar="TREE|PLAN|HEADS", nargs="?", help=TREE_HELP + "; or a plan JSON file; with "
                   "--format vllm-heads a heads folder (default: the demo heads)")
    e.add_argument("--format", required=True, choices=PLAN_FORMATS + ("vllm-heads", "speculation-profile"),
                   help="vllm-tree: vLLM with tree attention (speculative_token_tree; for a tree, the same as vllm); "
                        "vllm-token-schedule (a plan): vLLM's proposed speculative_token_schedule (give "
                        "--vllm-version of a release that has it); trtllm-schedule (a plan): TensorRT-LLM's "
                        "draft_len_schedule; vllm-heads: a heads folder vLLM's Medusa drafter loads (--out DIR, "
                        "--model BASE); speculation-profile: a calibration's (ours or served) per-position "
                        "acceptance as a speculation_profile.json (--calibration DIR)")
    e.add_argument("--name", help="variable / tree name (default: the tree's own)")
    e.add_argument("--num-heads", dest="heads", type=bounded("depth"), metavar="K", help="number of Medusa heads: a deeper tree "
                                                                          "is an error")
    e.add_argument("--heads", dest="heads_dir", metavar="DIR", help="with a plan: the heads to serve; another "
                   "model's heads (not the calibration's) are an error")
    e.add_argument("--synthetic", action="store_true", help="with a plan and --format vllm: vLLM's synthetic "
                   "rejection sampling at the plan's top-1 chain acceptance (for benchmarking the cost side)")
    e.add_argument("--batch-sizes", type=bounded("batch"), metavar="B", help="with a plan: the row for this one batch size (static "
                   "formats default to 1; for vllm, one K instead of the schedule)")
    renamed(e, "--batch-size", "--batch-sizes B")
    e.add_argument("--model", help="with --format vllm-heads: the base model whose output embedding the tied heads "
                   "share (default: the embedded demo model)")
    e.add_argument("--method", choices=VLLM_METHODS, help="with a plan and --format vllm (or a schedule format): "
                   "the drafter vLLM runs (default: a served calibration's drafter, else medusa with the plan's "
                   "heads; an --acceptance plan needs one, e.g. eagle3)")
    e.add_argument("--draft-model", metavar="DIR", help="with --method: the drafter's weights (written absolute)")
    e.add_argument("--vllm-version", metavar="X.Y.Z", help="with --format vllm: the vLLM release to target "
                   "(default 0.32.0 for Medusa, the newest checked otherwise); its version windows are checked")
    e.add_argument("--max-draft-len", type=bounded("nodes"), default=TRTLLM_MAX_DRAFT_LEN, metavar="N",
                   help="TensorRT-LLM engine's max_draft_len (default 63)")
    e.add_argument("--engine-safe", action="store_true", help="repair the tree so the engine builds it exactly as "
                   "written (trtllm: drop the nodes past its C++ runtime's ranks < 16 and 8 levels, make the first "
                   "level ranks 0..k-1; vllm: the best dense tree) and report the cost in expected acceptance length")
    e.add_argument("--accuracies", metavar="FILE", help="with --engine-safe: accuracies that price the repair")
    e.add_argument("--calibration", metavar="DIR", help="with --engine-safe: instead, a `workbench calibrate` folder; "
                   "with --format speculation-profile: the calibration (ours or served) to describe")
    e.add_argument("--out", metavar="FILE", help="write here instead of stdout")
    e.set_defaults(func=_cmd_export)
