"""Tree design commands: `tree show|list|buffers|eval` and `optimize` (also --latency)."""
from __future__ import annotations

import argparse
import math
import sys

from workbench import WorkbenchError

from workbench.calibrate.folder import Calibration
from workbench.calibrate.served import Served, is_served
from workbench.cli.shared import bounded, renamed, warn_line, write_json, write_output
from workbench.core.io import atomic_write_text, check_output
from workbench.export.engines import SAFE_ENGINES, best_engine_safe
from workbench.plan.fastest import fastest
from workbench.plan.source import chain_accuracies, plan_source
from workbench.plan.surface import Surface
from workbench.trees.accuracies import read_accuracies
from workbench.trees.dynamic import DynamicPolicy
from workbench.trees.optimize import acc_value_fn, dense_tree, expected_curve, expected_length, optimal_tree
from workbench.trees.tree import (MAX_DEPTH, MAX_NODES, MEDUSA_TOPK, Tree, ascii_tree, buffers_record, load_tree, record_json, reference_trees,
                                  tree_record, tree_stats)


def _cmd_tree_show(args) -> int:
    check_output(args.png, "png")
    tree = load_tree(args.tree, num_heads=args.heads)
    st = tree_stats(tree)
    labels = None
    print(f"tree {st['name'] or '(literal)'}: {st['nodes']} nodes, depth {st['depth']}, "
          f"{st['leaves']} root-to-leaf paths, ranks 0..{st['max_rank']} (needs top-{st['min_topk']})")
    print(f"nodes per depth: {', '.join(map(str, st['nodes_per_depth']))}")
    if args.accuracies:

        acc = read_accuracies(args.accuracies)
        tree = load_tree(tree, topk=acc.shape[1], num_heads=acc.shape[0])
        fn = acc_value_fn(acc)
        labels = {p: f"{fn(p):.4f}" for p in tree.paths}
        print(f"expected acceptance length: {expected_length(tree, fn):.4f} tokens/step ({args.accuracies})")
    print(ascii_tree(tree, labels))
    if args.png:  # the app's tree drawing + attention mask (workbench/viz/static_figures.py); edges by probability if known
        from workbench.viz.static_figures import save_png, tree_figure  # deferred: matplotlib costs ~1 s, only --png draws

        probs = {p: float(v) for p, v in labels.items()} if labels else None
        print(f"wrote {save_png(tree_figure(tree, probs), args.png)}", file=sys.stderr)
    return 0


def _cmd_tree_list(args) -> int:
    print(f"{'name':<28}{'nodes':>6}{'depth':>6}{'leaves':>7}{'max rank':>9}  nodes per depth")
    for name, tree in reference_trees().items():
        st = tree_stats(tree)
        print(f"{name:<28}{st['nodes']:>6}{st['depth']:>6}{st['leaves']:>7}{st['max_rank']:>9}  "
              f"{', '.join(map(str, st['nodes_per_depth']))}")
    return 0


def _cmd_tree_buffers(args) -> int:
    if args.topk < 1:
        raise WorkbenchError(f"--topk must be >= 1, got {args.topk}")
    check_output(args.out, "out")
    write_json(buffers_record(load_tree(args.tree, topk=args.topk), args.topk), args.out)
    return 0


def _cmd_tree_eval(args) -> int:
    """`workbench tree eval TREE --calibration DIR [--dynamic N]`."""
    if args.dynamic:
        return _eval_dynamic(args)
    if args.max_new_tokens is not None:
        raise WorkbenchError("--max-new-tokens cuts the answers a per-step tree is replayed on: add --dynamic N, or "
                             "drop it (a static tree's predictions are over the whole answers)")

    rep = Calibration(args.calibration).report(load_tree(args.tree))
    print(f"tree {rep['tree'] or '(literal)'}: {rep['nodes']} nodes; calibration {rep['calibration']} "
          f"({rep['positions']} positions)")
    for key, what in (("predicted_independent", "independent heads, fit prompts"),
                      ("predicted_joint", "joint paths, fit prompts"),
                      ("predicted_replay", "a greedy decoder replayed over the holdout answers"),
                      ("predicted_replay_fit", "the same replay over the fit answers"),
                      ("holdout_acceptance_length", "joint paths, holdout prompts")):
        if rep.get(key) is not None:
            print(f"{key:<26} {rep[key]:.4f}  ({what})")
    return 0


def _eval_dynamic(args) -> int:
    """A per-step tree of N nodes chosen from TREE (the envelope) beside the static optimal N-node tree, both
    replayed over the held-out answers: static or dynamic at this budget."""
    cal = Calibration(args.calibration)
    policy = DynamicPolicy(args.dynamic, load_tree(args.tree))
    static = optimal_tree(cal.joint_value("fit"), args.dynamic, *cal.accuracies("fit").shape, name="joint")
    cut = args.max_new_tokens
    dynamic = cal.predict(policy, cut)["predicted_replay"]  # first: a missing topk.parquet stops before any output
    print(f"budget {args.dynamic} nodes, held-out answers{f' cut to {cut} tokens' if cut else ''}: tokens/step "
          "replayed (batch 1)")
    print(f"  static  {static.nodes}-node optimal tree (joint paths, fit prompts)  "
          f"{cal.replay(static, 'holdout', cut):.4f}")
    print(f"  dynamic {policy.name} (best path scores per step)  {dynamic:.4f}")
    return 0


def objective(args):
    """(acc [K, R], value: acc or a path-probability fn) from --accuracies FILE or --calibration DIR [--joint]."""

    if args.calibration or getattr(args, "joint", False):  # a calibration folder: its fit prompts

        if args.calibration is None:
            raise WorkbenchError("--joint needs --calibration DIR (joint path probabilities come from its ranks)")
        if args.accuracies:
            raise WorkbenchError("give either --accuracies FILE or --calibration DIR, not both")
        if is_served(args.calibration):  # the engine's counters: a chain drafter, acc [K, 1] of conditional rates
            if getattr(args, "joint", False):
                raise WorkbenchError("--joint needs our calibration's ranks; a served one holds a chain's acceptance")
            acc = chain_accuracies(Served(args.calibration, "calibration").rates())
            return acc, acc
        cal = Calibration(args.calibration)
        acc = cal.accuracies("fit")
        return acc, (cal.joint_value("fit") if getattr(args, "joint", False) else acc)
    if args.accuracies:
        acc = read_accuracies(args.accuracies)
        return acc, acc
    raise WorkbenchError("give --accuracies FILE or --calibration DIR")


def _cmd_optimize(args) -> int:
    check_output(args.out, "out")
    check_output(args.curve_out, "curve_out")
    if not args.latency:
        used = [f for f, v in (("--batch-sizes", args.batch_sizes), ("--prediction", args.prediction),
                               ("--max-new-tokens", args.max_new_tokens), ("--context", args.context)) if v is not None]
        if used:
            raise WorkbenchError(f"{', '.join(used)} price trees on a latency table: add --latency FILE")
    if args.engine_safe and (args.latency or args.curve):
        raise WorkbenchError("--engine-safe gives one tree for --budget N; drop --latency / --curve")
    if args.latency:  # plan's ranking at one batch size
        return _optimize_for_latency(args)
    acc, value = objective(args)
    heads, ranks = acc.shape
    if args.dense and args.curve:
        raise WorkbenchError("--curve describes optimal trees; drop --dense")
    if args.dense:
        try:
            sizes = [int(x) for x in args.dense.split(",")]
        except ValueError:
            raise WorkbenchError(f"--dense {args.dense!r}: expected sizes per depth like 4,3,2") from None
        if not sizes or min(sizes) < 1 or len(sizes) > MAX_DEPTH or \
                sum(math.prod(sizes[:d + 1]) for d in range(len(sizes))) > MAX_NODES:
            raise WorkbenchError(f"--dense {args.dense!r}: sizes per depth must be >= 1, at most {MAX_DEPTH} levels "
                                 f"and {MAX_NODES} nodes in all (the product of the sizes per level, summed)")
        tree = load_tree(dense_tree(sizes), topk=ranks, num_heads=heads)
        method = "dense"
    else:
        if args.budget is None:
            raise WorkbenchError("--budget N is required (the number of tree nodes), or give --dense 4,3,2")
        if args.curve:
            curve = expected_curve(value, args.budget, args.max_depth or heads, args.max_rank or ranks)
            print(f"{'budget':>6}  {'expected_length':>15}  {'gain':>8}")
            for n in range(1, len(curve)):
                print(f"{n:>6}  {curve[n]:>15.4f}  {curve[n] - curve[n - 1]:>8.5f}")
        depth, rank = args.max_depth or heads, args.max_rank or ranks
        tree = optimal_tree(value, args.budget, depth, rank)
        method = "optimal"
        if args.engine_safe:  # the best tree under the engine's constraint, and what the constraint costs
            free = expected_length(tree, value)
            tree = best_engine_safe(value, args.engine_safe, args.budget, depth, rank)
            print(f"note: engine-safe for {args.engine_safe}: expected acceptance {expected_length(tree, value):.4f} "
                  f"tokens/step vs {free:.4f} unconstrained (cost {free - expected_length(tree, value):.4f})",
                  file=sys.stderr)
    safe = f"{args.engine_safe}_" if args.engine_safe and method == "optimal" else ""
    name = args.name or (f"optimal_{safe}{tree.nodes}" if method == "optimal" else tree.name)
    length = expected_length(tree, value)
    prov = dict(expected_acceptance_length=length, budget=args.budget if method == "optimal" else tree.nodes,
                method=method, max_depth=args.max_depth or heads, max_rank=args.max_rank or ranks, heads=heads,
                ranks=ranks, accuracies=str(args.accuracies or args.calibration))
    if args.engine_safe:
        prov["engine_safe"] = args.engine_safe
    if not (args.curve and not args.out):
        write_output(record_json(tree_record(Tree(tree.paths, name), **prov)), args.out)
    if tree.max_rank >= MEDUSA_TOPK:
        warn_line(f"the tree uses rank {tree.max_rank}; Medusa's buffers take each head's top-{MEDUSA_TOPK} only "
                  f"(use --max-rank {MEDUSA_TOPK} for Medusa/EAGLE-1 decoders)")
    short = "" if method != "optimal" or tree.nodes == args.budget or args.engine_safe else \
        f"; only {tree.nodes} nodes have positive acceptance probability"
    print(f"{method} tree: {tree.nodes} nodes, depth {tree.depth}, expected acceptance length {length:.4f} "
          f"tokens/step{short}" + (f" -> {args.out}" if args.out else ""), file=sys.stderr)
    return 0


def _latency_source(args):
    """What `optimize --latency` weighs with: plan's Source (source.plan_source) for --calibration (--prediction,
    --max-new-tokens) or --accuracies, within --max-depth / --max-rank."""
    if args.joint:
        raise WorkbenchError("--joint: with --latency the statistic is --prediction, as in `workbench plan` (default "
                             "replay; --prediction joint for the joint paths)")
    if bool(args.calibration) == bool(args.accuracies):
        raise WorkbenchError("give --accuracies FILE or --calibration DIR")
    source = plan_source(args.calibration, args.accuracies, None, args.prediction or "replay",
                         max_new_tokens=args.max_new_tokens)
    return source.limited(args.max_depth, args.max_rank)


def _optimize_for_latency(args) -> int:
    """`optimize --latency FILE`: plan's ranking at one batch size (plan/fastest.py): every candidate `workbench
    plan` weighs, its predicted speedup on the measured hardware, and the fastest tree (called from _cmd_optimize)."""
    if args.dense:
        raise WorkbenchError("--latency picks the fastest optimal tree; drop --dense")
    source = _latency_source(args)
    b = args.batch_sizes or 1
    surface = Surface.read(args.latency)
    ctx = surface.context([b], args.context, source.typical_context)
    engine = surface.engine
    res = fastest(source, surface, surface.at(b, ctx), args.budget, curve=True)
    rows = [dict(budget=c.nodes, verify_tokens=c.nodes + 1, expected_length=c.tokens_per_step,
                 batch_tokens_per_step=c.batch_tokens_per_step, relative_latency=c.relative_latency,
                 speedup=c.speedup) for c in res["curve"]]
    if args.curve_out:
        import pandas as pd

        atomic_write_text(args.curve_out, pd.DataFrame(rows).to_csv(index=False), "curve_out")
    else:
        print(f"{'budget':>6}{'tokens/step':>13}{'t(n+1)/t(1)':>13}{'speedup':>9}", file=sys.stderr)
        for r in rows:
            print(f"{r['budget']:>6}{r['expected_length']:>13.4f}{r['relative_latency']:>13.3f}{r['speedup']:>9.3f}",
                  file=sys.stderr)
    best, tree = res["best"], res["tree"]
    name = args.name or f"hardware_{tree.nodes}"
    prov = dict(expected_acceptance_length=tree.tokens_per_step, predicted_speedup=tree.speedup,
                relative_latency=tree.relative_latency, budget=tree.nodes, kind=tree.kind,
                method="hardware-aware", prediction=source.info["prediction"], latency=str(args.latency),
                context=ctx, batch_size=b, accuracies=str(args.accuracies or args.calibration), engine=engine)
    write_output(record_json(tree_record(Tree(tree.tree.paths, name), **prov)), args.out)
    what = f"chain K={tree.nodes}" if tree.kind == "chain" else f"tree: {tree.nodes} nodes"
    if best.kind == "none":
        warn_line(f"no tree is predicted to beat vanilla decoding at batch {b} on this hardware (`workbench "
                  "plan` chooses no speculation there); written: the fastest tree")
    tps = f"{tree.batch_tokens_per_step:.4f} tokens/step for the batch ({tree.tokens_per_step:.4f} per " \
        "sequence)" if tree.batch_tokens_per_step != tree.tokens_per_step else \
        f"{tree.tokens_per_step:.4f} tokens/step"
    print(f"hardware-aware {what}, depth {tree.tree.depth}, {tps} ({source.info['prediction']}) at "
          f"{tree.relative_latency:.3f}x step cost = predicted speedup "
          f"{tree.speedup:.3f}x (batch {b}, context {ctx}, {'vLLM rounds' if engine == 'vllm' else 'our decoder'})"
          + (f" -> {args.out}" if args.out else ""),
          file=sys.stderr)
    return 0


class _RenamedHeads(argparse.Action):
    """`--heads K` of tree show / export was renamed: elsewhere --heads names a heads folder, so say which is which."""

    def __call__(self, parser, namespace, values, option_string=None):
        raise WorkbenchError(f"--heads {values}: this command counts heads with --num-heads {values} "
                             "(--heads names a heads folder in decode, calibrate, sweep and latency)")


TREE_HELP = "a tree: JSON file, Python literal like '[[0], [0, 0], [1]]', or a reference name (tree list)"


def _num_heads_arg(p, help_text: str) -> None:
    p.add_argument("--num-heads", dest="heads", type=bounded("depth"), metavar="K", help=help_text)
    p.add_argument("--heads", action=_RenamedHeads, help=argparse.SUPPRESS)


def add_tree(sub) -> None:
    """Register `tree` (show, list, buffers, eval) and `optimize`."""

    t = sub.add_parser("tree", help="inspect trees: show, list, buffers")
    tsub = t.add_subparsers(dest="tree_command", required=True, metavar="SUBCOMMAND")
    s = tsub.add_parser("show", help="stats and an ASCII drawing of a tree")
    s.add_argument("tree", metavar="TREE", help=TREE_HELP)
    _num_heads_arg(s, "check the depth against this many Medusa heads")
    s.add_argument("--accuracies", metavar="FILE", help="also show node probabilities and expected length")
    s.add_argument("--png", metavar="FILE", help="also draw the tree and its attention mask to a PNG file")
    s.set_defaults(func=_cmd_tree_show)
    ls = tsub.add_parser("list", help="the reference trees with their stats")
    ls.set_defaults(func=_cmd_tree_list)
    b = tsub.add_parser("buffers", help="Medusa tree-attention buffers as JSON")
    b.add_argument("tree", metavar="TREE", help=TREE_HELP)
    b.add_argument("--topk", type=bounded("rank"), default=MEDUSA_TOPK, help="top-k per head in the candidate layout (Medusa: 10)")
    b.add_argument("--out", metavar="FILE", help="write the JSON here instead of stdout")
    b.set_defaults(func=_cmd_tree_buffers)
    ev = tsub.add_parser("eval", help="a tree's predicted tokens per step on a calibration folder")
    ev.add_argument("tree", metavar="TREE", help=TREE_HELP)
    ev.add_argument("--calibration", required=True, metavar="DIR", help="a `workbench calibrate` output folder")
    ev.add_argument("--dynamic", type=bounded("nodes"), metavar="N",
                    help="a per-step tree instead: the N nodes of best path score chosen from TREE at each step, "
                         "replayed on the calibration's topk.parquet, beside the static optimal N-node tree")
    ev.add_argument("--max-new-tokens", type=bounded("tokens"), help="with --dynamic: cut the answers to N tokens")
    ev.set_defaults(func=_cmd_tree_eval)

    o = sub.add_parser("optimize", help="the tree with the highest expected acceptance length for a node budget")
    o.add_argument("--accuracies", metavar="FILE",
                   help="CSV head,rank,accuracy[,count] (1-based) or Medusa *_heads_accuracy.pt")
    o.add_argument("--calibration", metavar="DIR", help="instead: a `workbench calibrate` folder (its fit prompts)")
    o.add_argument("--joint", action="store_true",
                   help="with --calibration: measured joint path probabilities instead of independent heads")
    o.add_argument("--budget", type=bounded("nodes"), metavar="N", help="number of tree nodes (root not counted)")
    o.add_argument("--max-depth", type=bounded("depth"), metavar="D", help="deepest level (default: number of heads)")
    o.add_argument("--max-rank", type=bounded("rank"), metavar="R", help="use only each head's top-R guesses")
    o.add_argument("--dense", metavar="S1,S2,..", help="instead: the dense Cartesian tree with these sizes per depth")
    o.add_argument("--curve", action="store_true",
                   help="print expected length for every budget 1..N on stdout (tree JSON only with --out)")
    o.add_argument("--name", help="tree name stored in the JSON")
    o.add_argument("--out", metavar="FILE", help="write the tree JSON here instead of stdout")
    o.add_argument("--latency", metavar="FILE", help="`workbench latency` CSV: pick the budget with the best "
                                                   "predicted speedup (--budget caps it)")
    o.add_argument("--context", type=bounded("context", 0), metavar="N", help="with --latency: use rows at this context "
                                                          "(default: closest to the calibration's typical one)")
    o.add_argument("--batch-sizes", type=bounded("batch"), metavar="B", help="with --latency: the one serving batch "
                   "size whose rows price the trees (default 1; `workbench plan` ranks several)")
    o.add_argument("--prediction", choices=["independent", "joint", "replay"], help="with --latency and "
                   "--calibration: the predicted tokens/step, as in `workbench plan` (default replay)")
    o.add_argument("--max-new-tokens", type=bounded("tokens"), metavar="N", help="with --latency and --calibration: "
                   "the generation length predicted for, as in `workbench plan` (default: the calibration's)")
    renamed(o, "--batch-size", "--batch-sizes B")
    o.add_argument("--curve-out", metavar="FILE", help="with --latency: the speedup curve as CSV (else on stderr)")
    o.add_argument("--engine-safe", choices=SAFE_ENGINES, help="the best tree the engine builds exactly as "
                   "written: trtllm = first level ranks 0..k-1, ranks < 16 and at most 8 levels (its C++ runtime), vllm = "
                   "dense per level; reports the cost")
    o.set_defaults(func=_cmd_optimize)
