"""`workbench decode`: live Medusa decoding of prompts, beside plain greedy with --compare."""
from __future__ import annotations

import json
import sys

from workbench import ACCEPTANCE_KINDS, WorkbenchError
from workbench.cli.shared import bounded, finite, model_args, parse_delta, renamed


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


def request(args):
    """The flags as the library's request (decode.request: its rules and defaults live there)."""
    from workbench.decode.request import DecodeRequest

    return DecodeRequest(args.max_new_tokens, args.batch_sizes, args.acceptance, args.temperature, args.epsilon,
                         parse_delta(args.delta), args.top_p, args.seed, args.medusa_entropy, args.limit,
                         prompt_set=args.prompts is not None)


def _divergence_line(d: dict, tok) -> str:
    def show(t):
        return "end" if t is None else f"{t} {tok.decode([t])!r}" if tok is not None else str(t)
    def num(x):
        return "-" if x is None else f"{x:.4g}"
    return (f"{d['kind']} at token {d['position']}: medusa {show(d['medusa_token'])}, vanilla "
            f"{show(d['vanilla_token'])}; top-2 logit margin {num(d['margin_medusa'])} (medusa), "
            f"{num(d['margin_vanilla'])} (vanilla); each run's token above the other's by {num(d['gap_medusa'])} + "
            f"{num(d['gap_vanilla'])}, rounding bound {num(d['bound'])}")


def _decode_prompts(args, tok) -> list[list[int]]:
    """The prompts of `decode`: one (--prompt, --prompt-ids) or a set (--prompts FILE|NAME, --limit)."""
    from workbench.core.data import load_prompt_records
    from workbench.runtime.generation import prepare_prompt

    if args.prompt_ids is not None:
        return [_prompt_ids(args.prompt_ids)]
    if args.prompts is not None:
        return [prepare_prompt(tok, text, args.raw) for _, text in load_prompt_records(args.prompts, args.limit)]
    try:
        args.prompt.encode("utf-8")
    except UnicodeEncodeError:  # bytes that are not UTF-8 on the command line
        raise WorkbenchError("--prompt: not valid UTF-8 text") from None
    return [prepare_prompt(tok, args.prompt, args.raw)]


def cmd_decode(args) -> int:
    from workbench.decode.loop import medusa_generate, vanilla_generate
    from workbench.decode.divergence import compare, divergences
    from workbench.runtime.engine import StepEngine
    from workbench.runtime.treemask import tree_setup
    from workbench.runtime.models import load_model_and_heads
    from workbench.trees.dynamic import DynamicPolicy
    from workbench.trees.tree import load_tree

    req = request(args)
    rule = req.rule()
    if args.prompt_ids is not None:
        _prompt_ids(args.prompt_ids)  # malformed ids fail before the model loads
    load_tree(args.tree)  # a malformed tree, too (its depth is checked against the heads once they are loaded)
    model, tok, heads = load_model_and_heads(args.model, args.heads, args.device, args.dtype, args.attn,
                                             need_tokenizer=args.prompt_ids is None, device_map=args.device_map)
    tree = load_tree(args.tree, num_heads=heads.num_heads)
    policy = DynamicPolicy(args.dynamic, tree) if args.dynamic else None  # --tree is its envelope
    prompts = _decode_prompts(args, tok)
    req.check_prompts(prompts, model, tree.nodes)
    if tok is None:
        print("note: the model folder has no tokenizer: the output is token ids", file=sys.stderr)
    steps = -(-len(prompts) // args.batch_sizes) * args.max_new_tokens  # per step shape, at most
    engine, buf = StepEngine(model, compile=args.compile, steps=steps), tree_setup(tree, model)
    engine.size_for(prompts, args.max_new_tokens, [buf])  # one capacity for every chunk: compiled once
    buf = policy or buf
    several = args.prompts is not None
    chunks = [prompts[i:i + args.batch_sizes] for i in range(0, len(prompts), args.batch_sizes)]
    if args.compare or engine.compile:  # warm-up (and compilation) of both step shapes, outside the timed runs
        vanilla_generate(model, tok, chunks[0], 2, engine=engine)
        medusa_generate(model, heads, tok, chunks[0], buf, 2, rule, engine=engine)
    outs = []
    for chunk in chunks:
        res = medusa_generate(model, heads, tok, chunk, buf, args.max_new_tokens, rule, engine=engine,
                              record=args.compare)
        van = vanilla_generate(model, tok, chunk, args.max_new_tokens, engine=engine, record=True) \
            if args.compare else [None] * len(chunk)
        for r, v in zip(res, van):
            out = r.to_dict() | dict(acceptance=vars(rule))
            if v is not None:
                out.update(compare(r, v))
                # greedy must reproduce vanilla: a difference is a near-tie flipped by rounding, or a bug
                out["divergences"] = None if rule.temperature else divergences(r, v, model.dtype)
            outs.append(out)
    if args.json:
        print(json.dumps(outs if several else outs[0]))
        return 0
    for out in outs:
        print(out["text"] if out["text"] is not None else ",".join(map(str, out["token_ids"])))
        line = (f"[{out['stop_reason']}] {out['new_tokens']} tokens in {out['prefill_s'] + out['decode_s']:.2f} s, "
                f"{out['steps']} steps: {out['tokens_per_step']:.2f} tokens/step, {out['tokens_per_s']:.1f} tokens/s")
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
                       parents=[model_args("--model", "--heads", "--device", "--device-map", "--dtype", "--attn",
                                           "--compile")])
    p.add_argument("--tree", required=True, help="reference tree name, tree file, or literal like '[[0],[0,0],[1]]'")
    p.add_argument("--dynamic", type=bounded("nodes"), metavar="N", help="a per-step tree instead: each step, each "
                   "sequence verifies the N nodes of --tree (the envelope) with the best path scores of its heads' "
                   "log-probabilities, chosen inside the step")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="user message (wrapped in the chat template unless --raw)")
    src.add_argument("--prompt-ids", help="comma-separated prompt token ids, used as-is")
    src.add_argument("--prompts", help="several prompts: a prompt file (JSON/JSONL/CSV/text) or a set name "
                     "(alpaca-eval, mt-bench); --json then prints a list, one object per prompt in order")
    p.add_argument("--limit", type=bounded("count"), help="with --prompts: the first N prompts")
    p.add_argument("--batch-sizes", type=bounded("batch"), default=1, metavar="B", help="the serving batch size: "
                   "prompts decoded together, one forward of B x tree tokens per step (one B; default 1)")
    renamed(p, "--batch", "--batch-sizes B")
    p.add_argument("--raw", action="store_true", help="use --prompt as-is, without the chat template")
    p.add_argument("--max-new-tokens", type=bounded("tokens"), default=256)
    p.add_argument("--acceptance", choices=["auto", *ACCEPTANCE_KINDS], default="auto",
                   help="auto: greedy at temperature 0, nucleus with --top-p, else typical")
    p.add_argument("--temperature", type=finite(0), help="sampling temperature (default 0 = greedy; 0.7 for typical/nucleus)")
    p.add_argument("--epsilon", type=finite(0, 1, open_low=True), default=0.09, help="typical acceptance hard threshold")
    p.add_argument("--delta", default="sqrt", help="typical acceptance entropy-scaled threshold: "
                   "'sqrt' (delta = sqrt(epsilon), Medusa's rule: 0.3 at epsilon 0.09; default) or a number")
    p.add_argument("--medusa-entropy", action="store_true", help="typical acceptance with Medusa's code's entropy "
                   "-sum p log(p + 1e-5) instead of the exact -sum p log p")
    p.add_argument("--top-p", type=finite(0, 1, open_low=True), help="nucleus acceptance (default 0.8 when --acceptance nucleus)")
    p.add_argument("--seed", type=bounded("seed", 0), help="seed for nucleus sampling")
    p.add_argument("--compare", action="store_true", help="also run vanilla greedy: speedup, overhead, exactness "
                   "(a greedy difference is reported as a near-tie within the dtype's rounding, or a mismatch)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text + summary")
    p.set_defaults(func=cmd_decode)
