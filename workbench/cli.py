"""`workbench` command line: a thin argparse layer over the package. Bad input -> `error: ...`, exit status 2."""
from __future__ import annotations

import argparse
import json
import math
import sys
import warnings

from workbench import WorkbenchError, __version__
from workbench.io import atomic_write_text, check_output, run_lock
from workbench.tree import MEDUSA_TOPK


def _output(text: str, out: str | None, what: str = "") -> None:
    """Text to --out (atomically, with a note on stderr) or stdout: every command writes results this way."""
    if out:
        atomic_write_text(out, text, "--out")
        if what:
            print(f"wrote {what} to {out}", file=sys.stderr)
    else:
        sys.stdout.write(text)


def _emit(obj, out: str | None) -> None:
    """JSON to --out or stdout."""
    _output(json.dumps(obj, indent=2) + "\n", out)


# flag values: lists and ranges of numbers, one clear error line when malformed

def parse_ints(text, what: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4]: positive, sorted, unique."""
    try:
        vals = sorted({int(x) for x in str(text).replace(" ", "").split(",") if x})
    except ValueError:
        raise WorkbenchError(f"{what} {text!r}: give comma-separated positive integers like 4,8,16") from None
    if not vals or vals[0] < 1:
        raise WorkbenchError(f"{what} {text!r}: give comma-separated positive integers like 4,8,16")
    return vals


def parse_floats(text, what: str, low: float = 0.0, high: float = math.inf) -> list[float]:
    """'0,0.7' -> [0.0, 0.7] (each in [low, high]), or a range START:STOP:STEP with STOP included when hit."""
    text = str(text).replace(" ", "")
    try:
        parts = [float(x) for x in text.split(":")] if ":" in text else [float(x) for x in text.split(",") if x]
    except ValueError:
        raise WorkbenchError(f"{what} {text!r}: give numbers like 0.05,0.09 or a range like 0.01:0.25:0.04") from None
    if ":" in text:
        if len(parts) != 3 or not all(map(math.isfinite, parts)) or not (parts[2] > 0 and parts[0] <= parts[1]):
            raise WorkbenchError(f"{what} {text!r}: a range is START:STOP:STEP with START <= STOP and STEP > 0, "
                                 "e.g. 0.01:0.25:0.04")
        start, stop, step = parts
        vals = [round(start + i * step, 10) for i in range(int(math.floor((stop - start) / step + 1e-9)) + 1)]
    else:
        vals = parts
    if not vals:
        raise WorkbenchError(f"{what} is empty: give numbers like 0.05,0.09 or a range like 0.01:0.25:0.04")
    for v in vals:
        if not (low <= v <= high and math.isfinite(v)):
            raise WorkbenchError(f"{what} {text!r}: value {v:g} is outside [{low:g}, {high:g}]")
    return sorted(set(vals))


def parse_delta(text) -> str | float:
    """'sqrt' (delta = sqrt(epsilon), Medusa's posterior_alpha convention) or a fixed number >= 0."""
    if str(text).strip().lower() == "sqrt":
        return "sqrt"
    try:
        d = float(text)
    except (TypeError, ValueError):
        raise WorkbenchError(f"--delta {text!r}: unknown; use 'sqrt' (delta = sqrt(epsilon)) or a number >= 0") \
            from None
    if not (d >= 0 and math.isfinite(d)):
        raise WorkbenchError(f"--delta {text!r}: must be 'sqrt' or a finite number >= 0")
    return d


# ==== flags shared by the model-loading commands (decode, calibrate, train-heads, latency, sweep) =============

COMPILE_HELP = ("torch.compile the decoding step (fixed shapes per tree; default: on for CUDA, off for CPU, where "
                "inductor needs minutes per tree size and a C++ compiler); falls back to eager with one warning line")

_SHARED_FLAGS = {  # one declaration and help text per flag, whichever command takes it
    "--model": dict(help="base model: hub id, folder or .gguf (default: the embedded SmolLM2-135M-Instruct)"),
    "--heads": dict(help="Medusa heads folder or file (default: the demo heads; a Medusa-2 --model holds its own)"),
    "--device": dict(help="auto (default), cpu, cuda or cuda:N"),
    "--dtype": dict(help="auto (default: bf16, or fp16 where bf16 is unsupported, on CUDA; fp32 on CPU), float32, "
                         "bfloat16, float16"),
    "--attn": dict(choices=["sdpa", "eager"], help="attention implementation (default: the model's)"),
    "--compile": dict(action=argparse.BooleanOptionalAction, default=None, help=COMPILE_HELP),
}


def _model_args(*flags: str) -> argparse.ArgumentParser:
    """A parent parser (`parents=[...]`) with these shared flags, so their help cannot drift between commands."""
    p = argparse.ArgumentParser(add_help=False)
    for flag in flags:
        p.add_argument(flag, **_SHARED_FLAGS[flag])
    return p


# ==== tree / optimize / export ================================================================================

def _cmd_tree_show(args) -> int:
    from workbench.tree import ascii_tree, load_tree, tree_stats

    check_output(args.png, "--png")
    tree = load_tree(args.tree, num_heads=args.heads)
    st = tree_stats(tree)
    labels = None
    print(f"tree {st['name'] or '(literal)'}: {st['nodes']} nodes, depth {st['depth']}, "
          f"{st['leaves']} root-to-leaf paths, ranks 0..{st['max_rank']} (needs top-{st['min_topk']})")
    print(f"nodes per depth: {', '.join(map(str, st['nodes_per_depth']))}")
    if args.accuracies:
        from workbench.accuracies import read_accuracies
        from workbench.optimize import acc_value_fn, expected_length

        acc = read_accuracies(args.accuracies)
        tree = load_tree(tree, topk=acc.shape[1], num_heads=acc.shape[0])
        fn = acc_value_fn(acc)
        labels = {p: f"{fn(p):.4f}" for p in tree.paths}
        print(f"expected acceptance length: {expected_length(tree, fn):.4f} tokens/step ({args.accuracies})")
    print(ascii_tree(tree, labels))
    if args.png:  # the app's tree drawing + attention mask (workbench/plots.py); edges by probability if known
        from workbench.plots import save_png, tree_figure

        probs = {p: float(v) for p, v in labels.items()} if labels else None
        print(f"wrote {save_png(tree_figure(tree, probs), args.png)}", file=sys.stderr)
    return 0


def _cmd_tree_list(args) -> int:
    from workbench.tree import reference_trees, tree_stats

    print(f"{'name':<28}{'nodes':>6}{'depth':>6}{'leaves':>7}{'max rank':>9}  nodes per depth")
    for name, tree in reference_trees().items():
        st = tree_stats(tree)
        print(f"{name:<28}{st['nodes']:>6}{st['depth']:>6}{st['leaves']:>7}{st['max_rank']:>9}  "
              f"{', '.join(map(str, st['nodes_per_depth']))}")
    return 0


def _cmd_tree_buffers(args) -> int:
    from workbench.tree import load_tree, tree_buffers

    if args.topk < 1:
        raise WorkbenchError(f"--topk must be >= 1, got {args.topk}")
    check_output(args.out, "--out")
    tree = load_tree(args.tree, topk=args.topk)
    buf = tree_buffers(tree, topk=args.topk)
    keys = ("attn_mask", "tree_indices", "position_ids", "retrieve_indices")
    _emit({k: buf[k].long().tolist() for k in keys}, args.out)
    return 0


def _objective(args):
    """(acc [K, R], value: acc or a path-probability fn) from --accuracies FILE or --calibration DIR [--joint]."""
    from workbench.accuracies import read_accuracies

    if args.calibration or getattr(args, "joint", False):  # a calibration folder: its fit prompts
        from workbench.calibration import Calibration

        if args.calibration is None:
            raise WorkbenchError("--joint needs --calibration DIR (joint path probabilities come from its ranks)")
        if args.accuracies:
            raise WorkbenchError("give either --accuracies FILE or --calibration DIR, not both")
        cal = Calibration(args.calibration)
        acc = cal.accuracies("fit")
        return acc, (cal.joint_value("fit") if getattr(args, "joint", False) else acc)
    if args.accuracies:
        acc = read_accuracies(args.accuracies)
        return acc, acc
    raise WorkbenchError("give --accuracies FILE or --calibration DIR")


def _cmd_optimize(args) -> int:
    from workbench.optimize import (acc_value_fn, best_dense_tree, dense_tree, expected_curve, expected_length,
                                    optimal_tree, optimal_tree_from)
    from workbench.tree import Tree, load_tree, record_json, tree_record

    check_output(args.out, "--out")
    check_output(args.curve_out, "--curve-out")
    acc, value = _objective(args)
    if args.engine_safe and (args.latency or args.curve):
        raise WorkbenchError("--engine-safe gives one tree for --budget N; drop --latency / --curve")
    if args.latency:  # hardware-aware choice over all budgets (latency / sweep section)
        return _optimize_for_latency(args, acc, value)
    heads, ranks = acc.shape
    if args.dense and args.curve:
        raise WorkbenchError("--curve describes optimal trees; drop --dense")
    if args.dense:
        try:
            sizes = [int(x) for x in args.dense.split(",")]
        except ValueError:
            raise WorkbenchError(f"--dense {args.dense!r}: expected sizes per depth like 4,3,2") from None
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
        tree = optimal_tree(acc, args.budget, args.max_depth, args.max_rank) if value is acc else \
            optimal_tree_from(value, args.budget, depth, rank)
        method = "optimal"
        if args.engine_safe:  # the best tree under the engine's constraint, and what the constraint costs
            free = expected_length(tree, value)
            tree = best_dense_tree(value, args.budget, depth, rank) if args.engine_safe == "vllm" else \
                optimal_tree_from(value if callable(value) else acc_value_fn(value), args.budget, depth, rank,
                                  contiguous_first_level=True)
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
        _output(record_json(tree_record(Tree(tree.paths, name), **prov)), args.out)
    if tree.max_rank >= 10:
        print(f"warning: the tree uses rank {tree.max_rank}; Medusa's buffers take each head's top-10 only "
              "(use --max-rank 10 for Medusa/EAGLE-1 decoders)", file=sys.stderr)
    short = "" if method != "optimal" or tree.nodes == args.budget or args.engine_safe else \
        f"; only {tree.nodes} nodes have positive acceptance probability"
    print(f"{method} tree: {tree.nodes} nodes, depth {tree.depth}, expected acceptance length {length:.4f} "
          f"tokens/step{short}" + (f" -> {args.out}" if args.out else ""), file=sys.stderr)
    return 0


def _cmd_export(args) -> int:
    from workbench.export import engine_safe, export_tree
    from workbench.tree import load_tree

    check_output(args.out, "--out")
    tree = load_tree(args.tree, num_heads=args.heads)
    if args.engine_safe:  # accuracies price the repair; without them it is structural and its cost unknown
        value = _objective(args)[1] if (args.accuracies or args.calibration) else None
        tree, note = engine_safe(tree, args.format, value, max_nodes=args.max_draft_len, heads=args.heads)
        print(f"note: {note}", file=sys.stderr)
    elif args.accuracies or args.calibration:
        raise WorkbenchError("--accuracies / --calibration only price an --engine-safe repair: add --engine-safe")
    text, warns = export_tree(tree, args.format, name=args.name, heads=args.heads, max_draft_len=args.max_draft_len,
                              strict=True)
    for w in warns:
        print(f"warning: {w}", file=sys.stderr)
    if args.format == "vllm":
        print("note: a --speculative-config fragment; vLLM requires num_speculative_tokens == number of tree "
              "nodes, and drafts trees with EAGLE-style proposers (add method eagle/eagle3 and model)",
              file=sys.stderr)
    _output(text, args.out, f"{args.format} tree")
    return 0


class _RenamedHeads(argparse.Action):
    """`--heads K` of tree show / export was renamed: elsewhere --heads names a heads folder, so say which is which."""

    def __call__(self, parser, namespace, values, option_string=None):
        raise WorkbenchError(f"--heads {values}: this command counts heads with --num-heads {values} "
                             "(--heads names a heads folder in decode, calibrate, sweep and latency)")


def _num_heads_arg(p, help_text: str) -> None:
    p.add_argument("--num-heads", dest="heads", type=int, metavar="K", help=help_text)
    p.add_argument("--heads", action=_RenamedHeads, help=argparse.SUPPRESS)


def _register_tree(sub) -> None:
    from workbench.export import FORMATS

    tree_help = "a tree: JSON file, Python literal like '[[0], [0, 0], [1]]', or a reference name (tree list)"
    t = sub.add_parser("tree", help="inspect trees: show, list, buffers")
    tsub = t.add_subparsers(dest="tree_command", required=True, metavar="SUBCOMMAND")
    s = tsub.add_parser("show", help="stats and an ASCII drawing of a tree")
    s.add_argument("tree", metavar="TREE", help=tree_help)
    _num_heads_arg(s, "check the depth against this many Medusa heads")
    s.add_argument("--accuracies", metavar="FILE", help="also show node probabilities and expected length")
    s.add_argument("--png", metavar="FILE", help="also draw the tree and its attention mask to a PNG file")
    s.set_defaults(func=_cmd_tree_show)
    ls = tsub.add_parser("list", help="the reference trees with their stats")
    ls.set_defaults(func=_cmd_tree_list)
    b = tsub.add_parser("buffers", help="Medusa tree-attention buffers as JSON")
    b.add_argument("tree", metavar="TREE", help=tree_help)
    b.add_argument("--topk", type=int, default=MEDUSA_TOPK, help="top-k per head in the candidate layout (Medusa: 10)")
    b.add_argument("--out", metavar="FILE", help="write the JSON here instead of stdout")
    b.set_defaults(func=_cmd_tree_buffers)
    ev = tsub.add_parser("eval", help="a tree's predicted tokens per step on a calibration folder")
    ev.add_argument("tree", metavar="TREE", help=tree_help)
    ev.add_argument("--calibration", required=True, metavar="DIR", help="a `workbench calibrate` output folder")
    ev.set_defaults(func=_cmd_tree_eval)  # defined in the calibrate section

    o = sub.add_parser("optimize", help="the tree with the highest expected acceptance length for a node budget")
    o.add_argument("--accuracies", metavar="FILE",
                   help="CSV head,rank,accuracy[,count] (1-based) or Medusa *_heads_accuracy.pt")
    o.add_argument("--calibration", metavar="DIR", help="instead: a `workbench calibrate` folder (its fit prompts)")
    o.add_argument("--joint", action="store_true",
                   help="with --calibration: measured joint path probabilities instead of independent heads")
    o.add_argument("--budget", type=int, metavar="N", help="number of tree nodes (root not counted)")
    o.add_argument("--max-depth", type=int, metavar="D", help="deepest level (default: number of heads)")
    o.add_argument("--max-rank", type=int, metavar="R", help="use only each head's top-R guesses")
    o.add_argument("--dense", metavar="S1,S2,..", help="instead: the dense Cartesian tree with these sizes per depth")
    o.add_argument("--curve", action="store_true",
                   help="print expected length for every budget 1..N on stdout (tree JSON only with --out)")
    o.add_argument("--name", help="tree name stored in the JSON")
    o.add_argument("--out", metavar="FILE", help="write the tree JSON here instead of stdout")
    o.add_argument("--latency", metavar="FILE", help="`workbench latency` CSV: pick the budget with the best "
                                                   "predicted speedup (--budget caps it)")
    o.add_argument("--context", type=int, metavar="N", help="with --latency: use rows at this context "
                                                          "(default: closest to the calibration's typical one)")
    o.add_argument("--curve-out", metavar="FILE", help="with --latency: the speedup curve as CSV (else on stderr)")
    o.add_argument("--engine-safe", choices=["trtllm", "vllm"], help="the best tree the engine builds exactly as "
                   "written: trtllm = first level ranks 0..k-1, vllm = dense per level; reports the cost")
    o.set_defaults(func=_cmd_optimize)

    e = sub.add_parser("export", help="write a tree for Medusa, TensorRT-LLM, vLLM or EAGLE")
    e.add_argument("tree", metavar="TREE", help=tree_help)
    e.add_argument("--format", required=True, choices=FORMATS)
    e.add_argument("--name", help="variable / tree name (default: the tree's own)")
    _num_heads_arg(e, "number of Medusa heads: a deeper tree is an error")
    e.add_argument("--max-draft-len", type=int, default=63, metavar="N",
                   help="TensorRT-LLM engine's max_draft_len (default 63)")
    e.add_argument("--engine-safe", action="store_true", help="repair the tree so the engine builds it exactly as "
                   "written (trtllm, vllm) and report the cost in expected acceptance length")
    e.add_argument("--accuracies", metavar="FILE", help="with --engine-safe: accuracies that price the repair")
    e.add_argument("--calibration", metavar="DIR", help="with --engine-safe: instead, a `workbench calibrate` folder")
    e.add_argument("--out", metavar="FILE", help="write here instead of stdout")
    e.set_defaults(func=_cmd_export)


# ==== decode ==================================================================================================

def _prompt_ids(text: str) -> list[int]:
    try:
        ids = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise WorkbenchError(f"--prompt-ids {text!r}: give comma-separated integer token ids like 1,2,3") from None
    if not ids:
        raise WorkbenchError("--prompt-ids is empty: give comma-separated token ids like 1,2,3")
    if not all(0 <= i < 1 << 31 for i in ids):
        raise WorkbenchError(f"--prompt-ids {text[:60]!r}: token ids are integers >= 0 (below the vocabulary size)")
    return ids


def _acceptance(args):
    """--acceptance auto: greedy at temperature 0, nucleus when --top-p is given, else typical (at 0.7 unless
    --temperature says otherwise)."""
    from workbench.decode import Acceptance

    kind = args.acceptance
    if kind == "auto":
        kind = "greedy" if not args.temperature else "nucleus" if args.top_p is not None else "typical"
    temperature = args.temperature if args.temperature is not None else (0.0 if kind == "greedy" else 0.7)
    if kind == "greedy" and temperature:
        raise WorkbenchError("--acceptance greedy takes no --temperature (use typical or nucleus to sample)")
    return Acceptance(kind, temperature, args.epsilon, args.delta, args.top_p if args.top_p is not None else 0.8,
                      args.seed)


def _divergence_line(d: dict, tok) -> str:
    def show(t):
        return "end" if t is None else f"{t} {tok.decode([t])!r}" if tok is not None else str(t)
    def num(x):
        return "-" if x is None else f"{x:.4g}"
    return (f"{d['kind']} at token {d['position']}: medusa {show(d['medusa_token'])}, vanilla "
            f"{show(d['vanilla_token'])}; top-2 logit margin {num(d['margin_medusa'])} (medusa), "
            f"{num(d['margin_vanilla'])} (vanilla); each run's token above the other's by {num(d['gap_medusa'])} + "
            f"{num(d['gap_vanilla'])}, rounding bound {num(d['bound'])}")


def cmd_decode(args) -> int:
    from workbench.decode import medusa_generate, vanilla_generate
    from workbench.divergence import compare, divergences
    from workbench.engine import StepEngine, tree_setup
    from workbench.generation import prepare_prompt
    from workbench.models import load_model_and_heads
    from workbench.tree import load_tree

    acc = _acceptance(args)
    prompt_ids = _prompt_ids(args.prompt_ids) if args.prompt_ids is not None else None
    try:
        (args.prompt or "").encode("utf-8")
    except UnicodeEncodeError:  # bytes that are not UTF-8 on the command line
        raise WorkbenchError("--prompt: not valid UTF-8 text") from None
    model, tok, heads = load_model_and_heads(args.model, args.heads, args.device, args.dtype, args.attn,
                                             need_tokenizer=prompt_ids is None)
    tree = load_tree(args.tree, num_heads=heads.num_heads)
    ids = prompt_ids if prompt_ids is not None else prepare_prompt(tok, args.prompt, args.raw)
    if tok is None:
        print("note: the model folder has no tokenizer: the output is token ids", file=sys.stderr)
    engine, buf = StepEngine(model, compile=args.compile), tree_setup(tree, model)
    if args.compare or engine.compile:  # warm-up (and compilation) of both step shapes, outside the timed runs
        vanilla_generate(model, tok, ids, 2, engine=engine)
        medusa_generate(model, heads, tok, ids, buf, 2, acc, engine=engine)
    res = medusa_generate(model, heads, tok, ids, buf, args.max_new_tokens, acc, engine=engine)
    out = res.to_dict()
    out["acceptance"] = vars(acc)
    if args.compare:
        van = vanilla_generate(model, tok, ids, args.max_new_tokens, engine=engine)
        out.update(compare(res, van))
        # greedy (temperature 0) must reproduce vanilla: a difference is a near-tie flipped by rounding, or a bug
        out["divergences"] = None if acc.temperature else divergences(res, van, model.dtype)
    if args.json:
        print(json.dumps(out))
        return 0
    print(res.text if res.text is not None else ",".join(map(str, res.token_ids)))
    line = (f"[{res.stop_reason}] {len(res.token_ids)} tokens in {res.total_s:.2f} s, {len(res.steps)} steps: "
            f"{res.acceleration_rate:.2f} tokens/step, {res.tokens_per_s:.1f} tokens/s")
    if args.compare:
        line += (f"; vanilla {out['vanilla_tokens_per_s']:.1f} tokens/s, speedup {out['speedup']:.2f}x, "
                 f"overhead {out['overhead']:.2f}x, matches greedy: {'yes' if out['matches_greedy'] else 'no'}")
    print(line)
    for d in out.get("divergences") or []:
        print(_divergence_line(d, tok))
    return 0


def add_decode(sub) -> None:
    p = sub.add_parser("decode", help="generate with Medusa heads and a tree; --compare against vanilla greedy",
                       description="Medusa decoding of one prompt with a given tree. Greedy acceptance is lossless: "
                                   "--compare checks it token for token against plain greedy decoding.",
                       parents=[_model_args("--model", "--heads", "--device", "--dtype", "--attn", "--compile")])
    p.add_argument("--tree", required=True, help="reference tree name, tree file, or literal like '[[0],[0,0],[1]]'")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="user message (wrapped in the chat template unless --raw)")
    src.add_argument("--prompt-ids", help="comma-separated prompt token ids, used as-is")
    p.add_argument("--raw", action="store_true", help="use --prompt as-is, without the chat template")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--acceptance", choices=["auto", "greedy", "typical", "nucleus"], default="auto",
                   help="auto: greedy at temperature 0, nucleus with --top-p, else typical")
    p.add_argument("--temperature", type=float, help="sampling temperature (default 0 = greedy; 0.7 for typical/nucleus)")
    p.add_argument("--epsilon", type=float, default=0.09, help="typical acceptance hard threshold")
    p.add_argument("--delta", type=float, default=0.3, help="typical acceptance entropy-scaled threshold")
    p.add_argument("--top-p", type=float, help="nucleus acceptance (default 0.8 when --acceptance nucleus)")
    p.add_argument("--seed", type=int, help="seed for nucleus sampling")
    p.add_argument("--compare", action="store_true", help="also run vanilla greedy: speedup, overhead, exactness "
                   "(a greedy difference is reported as a near-tie within the dtype's rounding, or a mismatch)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text + summary")
    p.set_defaults(func=cmd_decode)

# ==== train-heads =============================================================================================

def cmd_train_heads(args) -> int:
    from pathlib import Path

    from workbench.heads import DEMO_HEADS
    from workbench.models import cache_dir, model_label
    from workbench.train import TrainConfig, default_prompt_files, interleaved_prompts, train_heads

    files = args.prompts or default_prompt_files()
    cfg = TrainConfig(prompts=interleaved_prompts(files, args.seed), num_heads=args.num_heads,
                      num_layers=args.num_layers, tied=not args.untied, tokens=args.tokens,
                      max_new_tokens=args.max_new_tokens, gen_batch=args.gen_batch, gen_dtype=args.gen_dtype,
                      steps=args.steps, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                      active_steps=args.active_steps, answers_per_prompt=args.answers_per_prompt,
                      init=str(Path(args.init).resolve()) if args.init else None)
    if min(args.num_heads, args.num_layers, args.steps, args.tokens, args.answers_per_prompt) < 1:
        raise WorkbenchError("--num-heads, --num-layers, --steps, --tokens and --answers-per-prompt must be positive")
    if args.init and not Path(args.init).exists():
        raise WorkbenchError(f"--init {args.init}: no such heads folder or file")
    if not 0 <= args.active_steps <= args.steps:
        raise WorkbenchError(f"--active-steps {args.active_steps}: must be between 0 and --steps ({args.steps})")
    slug = model_label(args.model).replace("/", "--").replace(".gguf", "")
    work = Path(args.work) if args.work else cache_dir() / "train-heads" / slug
    out = Path(args.out) if args.out else (DEMO_HEADS if args.model is None else Path(f"{slug}-medusa-heads"))
    check_output(work, "--work", "folder")
    check_output(out, "--out", "folder")
    summary = train_heads(work, cfg, args.model, out, args.device)
    print(json.dumps({k: summary[k] for k in ("answer_tokens", "steps", "validation")}, indent=2))
    print(f"heads written to {out}", file=sys.stderr)
    return 0


def add_train_heads(sub) -> None:
    p = sub.add_parser("train-heads", help="train Medusa-1 heads on the model's own (self-distilled) answers",
                       description="Train Medusa-1 heads on a frozen base model with self-distilled data. "
                                   "Resumable: rerun the same command to continue.",
                       # no --heads (it writes heads: --out, --init); no --dtype (--gen-dtype for generating,
                       # training loads the base in fp32)
                       parents=[_model_args("--model", "--device")])
    p.add_argument("--prompts", nargs="+", metavar="FILE",
                   help="Alpaca-format prompt files (default: the training sets in shared/data)")
    p.add_argument("--num-heads", type=int, default=4)
    p.add_argument("--num-layers", type=int, default=1, help="ResBlocks per head")
    p.add_argument("--untied", action="store_true", help="give each head its own lm_head (format 1, large files)")
    p.add_argument("--tokens", type=int, default=200_000, help="self-distilled answer tokens to generate")
    p.add_argument("--answers-per-prompt", type=int, default=1, metavar="N",
                   help="answers per prompt: answer j > 0 opens with the model's (j+1)-th likeliest first token, "
                        "then goes on greedily (more on-policy data once the prompts run out)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--gen-batch", type=int, default=64)
    p.add_argument("--gen-dtype", default="bfloat16", help="dtype for generating the data (bf16 is ~3x faster on CPU)")
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--batch-size", type=int, default=256, help="positions per optimizer step")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--active-steps", type=int, default=0, metavar="N",
                   help="the first N steps use a softmax over only the tokens the data emits (~6x faster on CPU; "
                        "the remaining steps use the full vocabulary)")
    p.add_argument("--init", metavar="HEADS",
                   help="start from these heads instead of from zero (e.g. the same heads, once the data has grown)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", help="work folder for data and checkpoints (default: the user cache)")
    p.add_argument("--out", help="output heads folder (default: the demo heads folder for the demo model)")
    p.set_defaults(func=cmd_train_heads)

# ==== calibrate (and tree eval) ===============================================================================

def _budgets(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise WorkbenchError(f"--budgets {text!r}: expected node counts like 16,32,64") from None
    if not out or min(out) < 1:
        raise WorkbenchError(f"--budgets {text!r}: expected positive node counts like 16,32,64")
    return out


def _cmd_calibrate(args) -> int:
    from workbench.calibrate import CalibrateConfig, calibrate

    if args.out:
        check_output(args.out, "--out", "folder")
    elif args.name:
        from workbench.calibration import calibration_root

        check_output(calibration_root() / args.name, "--name", "folder")
    check_output(args.trees_dir, "--trees-dir", "folder")
    meta = calibrate(CalibrateConfig(
        model=args.model, heads=args.heads, prompts=args.prompts, limit=args.limit, holdout=args.holdout,
        max_new_tokens=args.max_new_tokens, topk=args.topk, budgets=tuple(_budgets(args.budgets)), name=args.name,
        out=args.out, device=args.device, dtype=args.dtype, batch_size=args.batch_size, force=args.force,
        continuations=args.continuations, trees_dir=args.trees_dir))
    print(f"{meta['num_prompts']} prompts, {meta['num_positions']} positions, {meta['num_heads']} heads, "
          f"top-{meta['topk']}; holdout {len(meta['holdout_ids'])} prompts")
    held = bool(meta["holdout_ids"])
    # tokens/step (names as in calibration.py): the tree's own model's mean over every fit position, a greedy
    # decoder replayed over the fit answers, and on the holdout prompts the joint mean and the replay
    print(f"{'tree':<44}{'nodes':>6}{'expected':>11}{'replay_fit':>11}"
          + (f"{'joint_holdout':>14}{'replay':>9}" if held else ""))
    for t in meta["trees"]:
        print(f"{t['name']:<44}{t['nodes']:>6}{t['expected_acceptance_length']:>11.4f}"
              f"{t['predicted_replay_fit']:>11.4f}"
              + (f"{t['holdout_acceptance_length']:>14.4f}{t['predicted_replay']:>9.4f}" if held else ""))
    for s in meta["trees_skipped"]:
        print(f"warning: no tree {s}", file=sys.stderr)
    print(f"calibration written to {meta['folder']}", file=sys.stderr)
    return 0


def _cmd_tree_eval(args) -> int:
    """`workbench tree eval TREE --calibration DIR` (registered in the tree section)."""
    from workbench.calibration import Calibration
    from workbench.tree import load_tree

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


def add_calibrate(sub) -> None:
    p = sub.add_parser("calibrate", help="measure head accuracies on the model's own greedy answers; build trees",
                       description="Record, at every position of the base model's greedy answers, the rank of the "
                                   "true token in each head's top-k; write ranks, accuracies and optimal trees "
                                   "(independent heads and measured joint path probabilities). Resumable: rerun the "
                                   "same command to continue.",
                       parents=[_model_args("--model", "--heads", "--device", "--dtype")])
    p.add_argument("--prompts", default="alpaca-eval", help="alpaca-eval, mt-bench (first turns) or a JSON/JSONL/CSV/"
                   "parquet file with an instruction/prompt/question/turns column (default: alpaca-eval)")
    p.add_argument("--limit", type=int, metavar="N", help="use the first N prompts")
    p.add_argument("--holdout", type=float, default=0.2, help="share of prompts kept out of the fit (default 0.2)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--topk", type=int, default=MEDUSA_TOPK, help="ranks recorded per head (Medusa's buffers use 10)")
    p.add_argument("--budgets", default="16,32,64", help="tree sizes to build (default 16,32,64)")
    p.add_argument("--name", help="calibration name (default: MODEL-PROMPTS)")
    p.add_argument("--out", help="output folder (default: calibration/NAME)")
    p.add_argument("--batch-size", type=int, default=32, help="prompts per generate batch (and per part file)")
    p.add_argument("--force", action="store_true", help="start over when the folder holds a run with other arguments")
    p.add_argument("--continuations", metavar="DIR", help="reuse the greedy answers of a finished calibration of the "
                   "same model and prompts (new heads: skips generation)")
    p.add_argument("--trees-dir", help="where tree files go (default trees/, or OUT/trees with --out)")
    p.set_defaults(func=_cmd_calibrate)


# ==== latency / sweep / sweep-report ==========================================================================

def cmd_latency(args) -> int:
    from pathlib import Path

    from workbench.calibration import default_latency_path, latency_path, read_meta
    from workbench.latency import DEFAULT_CONTEXTS, DEFAULT_SIZES, device_name, measure_latency
    from workbench.models import random_model

    sizes = parse_ints(args.sizes, "--sizes") if args.sizes else list(DEFAULT_SIZES)
    contexts = parse_ints(args.context, "--context") if args.context else list(DEFAULT_CONTEXTS)
    if args.calibration:
        read_meta(args.calibration)  # a finished calibration folder, or one line
    check_output(args.out, "--out")
    check_output(None if args.out else args.calibration, "--calibration", "folder")
    heads = None
    if args.random_config:
        if args.model or args.heads:
            raise WorkbenchError("--random-config builds its own model: drop --model/--heads")
        model, label = random_model(args.random_config, args.device, args.dtype, args.attn), f"random:{args.random_config}"
    else:
        from workbench.models import load_base, load_model_and_heads, model_label

        label = model_label(args.model)
        if args.heads:
            model, _, heads = load_model_and_heads(args.model, args.heads, args.device, args.dtype, args.attn)
        else:
            model, _ = load_base(args.model, args.device, args.dtype, args.attn, need_tokenizer=False)
    dev = device_name(model.device)
    out = Path(args.out) if args.out else (latency_path(args.calibration, dev) if args.calibration
                                           else default_latency_path(label, dev))
    from workbench.engine import StepEngine

    df = measure_latency(model, sizes, contexts, args.repeats, args.warmup, heads, label,
                         engine=StepEngine(model, compile=args.compile))
    atomic_write_text(out, df.to_csv(index=False), "--out")
    print(f"{dev} {df['dtype'].iloc[0]}, median of {args.repeats}:", file=sys.stderr)
    print(f"{'context':>8}{'tokens':>8}{'ms':>10}{'t(n)/t(1)':>11}", file=sys.stderr)
    for r in df.itertuples(index=False):
        print(f"{r.context:>8}{r.tokens:>8}{1000 * r.seconds:>10.3f}{r.relative:>11.3f}", file=sys.stderr)
    print(f"wrote {out}", file=sys.stderr)
    return 0


def _optimize_for_latency(args, acc, value) -> int:
    """`optimize --latency FILE`: the optimal tree for every budget, its predicted speedup on the measured
    hardware, and the tree with the best one (called from _cmd_optimize)."""
    from workbench.optimize import expected_length
    from workbench.tree import Tree, record_json, tree_record
    from workbench.calibration import Calibration
    from workbench.latency import hardware_aware, latency_table, read_latency

    if args.dense:
        raise WorkbenchError("--latency picks the fastest optimal tree; drop --dense")
    target = Calibration(args.calibration).typical_context() if args.calibration else None
    table, ctx = latency_table(read_latency(args.latency), args.context, target, f"--latency {args.latency}")
    heads, ranks = acc.shape
    res = hardware_aware(value, table, args.max_depth or heads, args.max_rank or ranks, args.budget)
    cols = ("budget", "verify_tokens", "expected_length", "relative_latency", "speedup")
    if args.curve_out:
        import pandas as pd

        curve = pd.DataFrame(res["rows"], columns=cols).to_csv(index=False)
        atomic_write_text(args.curve_out, curve, "--curve-out")
    else:
        print(f"{'budget':>6}{'tokens/step':>13}{'t(n+1)/t(1)':>13}{'speedup':>9}", file=sys.stderr)
        for r in res["rows"]:
            print(f"{r['budget']:>6}{r['expected_length']:>13.4f}{r['relative_latency']:>13.3f}{r['speedup']:>9.3f}",
                  file=sys.stderr)
    best, tree = res["best"], res["tree"]
    name = args.name or f"hardware_{tree.nodes}"
    prov = dict(expected_acceptance_length=expected_length(tree, value), predicted_speedup=best["speedup"],
                relative_latency=best["relative_latency"], budget=best["budget"], method="hardware-aware",
                latency=str(args.latency), context=ctx, joint=bool(args.joint),
                accuracies=str(args.accuracies or args.calibration))
    _output(record_json(tree_record(Tree(tree.paths, name), **prov)), args.out)
    if best["speedup"] <= 1:
        print("warning: no tree is predicted to beat vanilla decoding on this hardware", file=sys.stderr)
    print(f"hardware-aware tree: {tree.nodes} nodes, depth {tree.depth}, {best['expected_length']:.4f} tokens/step at "
          f"{best['relative_latency']:.3f}x step cost = predicted speedup {best['speedup']:.3f}x (context {ctx})"
          + (f" -> {args.out}" if args.out else ""), file=sys.stderr)
    return 0


def cmd_sweep(args) -> int:
    from workbench import sweep as S
    from workbench.calibration import Calibration, default_calibration
    from workbench.data import load_prompt_records
    from workbench.tree import load_tree

    temps = parse_floats(args.temperature, "--temperature")
    eps = parse_floats(args.epsilon, "--epsilon", high=1.0)
    if eps[0] <= 0:
        raise WorkbenchError(f"--epsilon {args.epsilon}: every epsilon must be in (0, 1]")
    delta = parse_delta(args.delta)
    if args.max_new_tokens < 1:
        raise WorkbenchError(f"--max-new-tokens {args.max_new_tokens}: must be >= 1")
    budgets = parse_ints(args.budgets, "--budgets") if args.budgets else (None if args.trees else list(S.DEFAULT_BUDGETS))
    calibration = args.calibration
    if calibration is None and (budgets or args.prompts == "holdout"):
        calibration = default_calibration()
    cal = Calibration(calibration) if calibration is not None else None
    for spec in args.trees or []:  # a malformed tree fails before the model loads (depth is checked after)
        load_tree(spec)
    check_output(args.out, "--out")
    S.read_sweep_rows(args.out)  # a foreign --out file, too
    if args.prompts == "holdout":
        records = cal.holdout_prompts(args.limit)
    else:
        records = load_prompt_records(args.prompts, args.limit)
    from workbench.calibrate import heads_fingerprint
    from workbench.generation import prepare_prompt
    from workbench.models import load_model_and_heads, model_label

    from workbench.engine import StepEngine

    with run_lock(args.out, "--out", kind="file"):  # a second sweep into this file refuses
        model, tok, heads = load_model_and_heads(args.model, args.heads, args.device, args.dtype, args.attn)
        trees = S.sweep_trees(budgets, args.trees, args.dense, cal, args.joint, heads.num_heads,
                              replay=args.max_new_tokens if args.replay else None)
        configs = S.sweep_configs(trees, temps, eps, delta)
        prompts = [prepare_prompt(tok, text, args.raw) for _, text in records]
        info = dict(model=model_label(args.model), heads=str(args.heads or "demo"), prompts=args.prompts,
                    limit=args.limit, calibration=str(calibration or ""),
                    heads_sha256=heads_fingerprint(heads))  # retrained heads in the same folder are a new run
        ids = [pid for pid, _ in records] if args.prompts == "holdout" else None  # the calibration's own prompts
        predict = S.calibration_predictions(cal, args.max_new_tokens, ids) if cal else None
        print(f"sweep: {len(configs)} configurations x {len(prompts)} prompts (+ vanilla) -> {args.out}",
              file=sys.stderr)
        engine = StepEngine(model, compile=args.compile)
        if engine.compile:
            info["compiled"] = True  # compiled timings are another run than eager ones
        df = S.run_sweep(model, heads, tok, prompts, configs, args.out, args.max_new_tokens, info, predict,
                         progress=not args.quiet, engine=engine)
    df = df[df["run"] == df["run"].iloc[-1]]
    print(f"{'tree':<22}{'nodes':>6}{'T':>5}{'eps':>6}{'tok/step':>9}{'speedup':>9}{'exact':>7}", file=sys.stderr)
    for r in df.itertuples(index=False):
        e = "" if r.epsilon != r.epsilon else f"{r.epsilon:g}"  # NaN for greedy rows
        print(f"{str(r.tree)[:21]:<22}{r.nodes:>6}{r.temperature:>5g}{e:>6}{r.acceleration_rate:>9.3f}"
              f"{r.speedup:>9.3f}{r.exact_match:>7.2f}", file=sys.stderr)
    return 0


def cmd_sweep_report(args) -> int:
    from pathlib import Path

    from workbench.latency import read_latency
    from workbench.report import summarize
    from workbench.sweep import read_sweep

    check_output(args.out, "--out")
    check_output(args.figures, "--figures", "folder")
    sweep, latency = read_sweep(args.sweep), read_latency(args.latency) if args.latency else None  # before writing
    _output(summarize(args.sweep, args.latency, args.context), args.out, "the report")
    if args.figures:
        from workbench.plots import report_figures

        for f in report_figures(sweep, latency, args.figures, Path(args.sweep).stem):
            print(f"figure written to {f}", file=sys.stderr)
    return 0


def add_tradeoffs(sub) -> None:
    p = sub.add_parser("latency", help="time one verify forward per tree size and context (for optimize --latency)",
                       description="Median wall time of a verify forward over n tree tokens (4-D tree mask, position "
                                   "ids, lm_head) on a cache of fixed length, next to the single-token step.",
                       parents=[_model_args("--model", "--device", "--dtype", "--attn", "--compile")])
    # its own --heads: optional here (no heads = time the verify forward alone), so the shared help would mislead
    p.add_argument("--heads", help="also time the heads' top-k in every tree step (a Medusa step's full cost)")
    p.add_argument("--random-config", metavar="SPEC",
                   help="instead: random weights of a given shape, a preset (llama-1b, llama-3b, llama-8b, vicuna-7b, "
                        "smollm2-135m, tiny) or key=value pairs hidden=2048,layers=16,heads=32,kv_heads=8,"
                        "vocab=128256,intermediate=8192[,arch=llama]")
    p.add_argument("--sizes", metavar="N1,N2,..", help="verify tokens per step (tree nodes + root; default "
                                                      "1,2,4,...,256; 1 is always measured)")
    p.add_argument("--context", metavar="C1,C2,..", help="cache lengths (default 128,1024)")
    p.add_argument("--repeats", type=int, default=10, help="timed calls per point (median; default 10)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls before each point (default 3)")
    p.add_argument("--calibration", metavar="DIR", help="write latency-<device>.csv into this calibration folder")
    p.add_argument("--out", metavar="FILE", help="CSV path (default: calibration/<name>/latency-<device>.csv)")
    p.set_defaults(func=cmd_latency)

    s = sub.add_parser("sweep", help="live decoder over trees x temperatures x epsilons vs vanilla greedy -> CSV",
                       description="Run the live Medusa decoder for every configuration on the same prompts and "
                                   "vanilla greedy on them in the same run; one CSV row per configuration. "
                                   "Resumable: rerun the same command to continue.",
                       parents=[_model_args("--model", "--heads", "--device", "--dtype", "--attn", "--compile")])
    s.add_argument("--trees", nargs="+", metavar="TREE", help="tree files, reference names or literals")
    s.add_argument("--budgets", metavar="B1,B2,..", help="optimal trees with these node budgets from --calibration "
                                                        "(default 4,8,16,32,64,128,256 unless --trees)")
    s.add_argument("--joint", action="store_true", help="build budget trees from measured joint path probabilities")
    s.add_argument("--dense", action="store_true", help="add Cartesian trees [s], [s,s], ... of comparable sizes")
    s.add_argument("--calibration", metavar="DIR", help="calibration folder (default: the first under calibration/ or "
                   "$WORKBENCH_CALIBRATION_ROOT)")
    s.add_argument("--epsilon", default="0.09", help="typical-acceptance epsilons: list or START:STOP:STEP (default 0.09)")
    s.add_argument("--delta", default="sqrt", help="'sqrt' (delta = sqrt(epsilon), default) or a fixed number")
    s.add_argument("--temperature", default="0", help="temperatures, e.g. 0,0.7 (0 = greedy acceptance; default 0)")
    s.add_argument("--prompts", default="alpaca-eval",
                   help="alpaca-eval, mt-bench, a prompt file, or 'holdout' (the calibration's held-out prompts)")
    s.add_argument("--limit", type=int, default=20, help="first N prompts (default 20)")
    s.add_argument("--raw", action="store_true", help="use prompts as-is, without the chat template")
    s.add_argument("--max-new-tokens", type=int, default=128)
    s.add_argument("--out", required=True, metavar="FILE.csv", help="sweep CSV (rows already there are skipped)")
    s.add_argument("--replay", action="store_true",
                   help="budget trees: keep the optimum or a dense tree within the budget, whichever a greedy "
                        "decoder replayed over the calibration's fit answers (cut to --max-new-tokens) prefers")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=cmd_sweep)

    r = sub.add_parser("sweep-report", help="markdown tables from a sweep CSV (+ latency CSV) for docs/tradeoffs.md")
    r.add_argument("sweep", metavar="SWEEP_CSV")
    r.add_argument("--latency", metavar="FILE", help="latency CSV: adds the hardware-aware choice")
    r.add_argument("--context", type=int, help="latency rows at this context (default: closest to the sweep's)")
    r.add_argument("--out", metavar="FILE.md", help="write here instead of stdout")
    r.add_argument("--figures", metavar="DIR", help="also write the figures (Fig. 4a/4b, predicted vs measured, "
                                                    "Fig. 5, latency) as PNGs here")
    r.set_defaults(func=cmd_sweep_report)



def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="workbench", description="Design, calibrate and validate Medusa decoding trees.")
    p.add_argument("--version", action="version", version=f"workbench {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # in the order a user meets them: trees, calibration, live decoding, trade-offs, training new heads
    _register_tree(sub)  # tree / optimize / export
    add_calibrate(sub)
    add_decode(sub)
    add_tradeoffs(sub)  # latency / sweep / sweep-report
    add_train_heads(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    warnings.simplefilter("default")
    try:
        args = build_parser().parse_args(argv)  # inside: a renamed flag is a WorkbenchError too
        return int(args.func(args) or 0)
    except WorkbenchError as e:
        print("error: " + " ".join(str(e).splitlines()), file=sys.stderr)  # one line, whatever a library said
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `workbench ... | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
