"""Medusa vs vanilla greedy vs HF `generate` on the same prompts: tokens/s, acceleration, overhead, exactness.

    python bench/decode.py                      # demo model + shipped heads (a tiny random model if none)
    python bench/decode.py --model M --heads H --tree mc_sim_7b_63 --prompts mt-bench --limit 8
    python bench/decode.py --tiny               # tiny random Llama with random heads: checks the plumbing only

Prints a table and writes JSON (bench/results/decode.json unless --out). Each prompt is run once per method
after one untimed warm-up; timings are wall clock, synchronised on CUDA. Where Medusa's output differs from vanilla
greedy (bf16/fp16 rounding), each prompt's first divergence is in the JSON (`divergence`: position, both tokens,
both runs' top-2 logit margins, "near-tie" or "mismatch") and counted in the table; the exit status is 1 on any
"mismatch" (a bug), or on any difference at all in fp32.
"""
from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from workbench import WorkbenchError  # noqa: E402
from workbench.decode import (Acceptance, divergence_counts, divergences, medusa_generate, prepare_prompt,  # noqa: E402
                              vanilla_generate)
from workbench.io import atomic_write_json  # noqa: E402
from workbench.models import DEMO_HEADS, load_model_and_heads, model_label  # noqa: E402
from workbench.tree import load_tree  # noqa: E402

FALLBACK_PROMPTS = ["Explain how a rainbow forms.", "Write a haiku about autumn.",
                    "List three uses of a paperclip.", "What is 17 times 23?"]


def tiny_setup():
    from workbench.models import random_heads, tiny_model, tiny_tokenizer

    model = tiny_model("llama", seed=0, hidden_size=256, layers=4)
    return model, tiny_tokenizer(), random_heads(256, 128, 5, tied=True, seed=1), "tiny-random-llama"


def prompts_for(spec: str | None, limit: int) -> list[str]:
    if spec is None:
        try:
            from workbench.data import load_prompts
            return load_prompts("mt-bench", limit)
        except (WorkbenchError, ImportError):
            return FALLBACK_PROMPTS[:limit]
    from workbench.data import load_prompts
    return load_prompts(spec, limit)


def timed_generate(model, ids: list[int], n: int) -> tuple[list[int], float]:
    x = torch.tensor([ids], device=model.device)
    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n)
    sync()
    return out[0, len(ids):].tolist(), time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model")
    ap.add_argument("--heads")
    ap.add_argument("--tiny", action="store_true", help="tiny random model and heads (no download, no demo)")
    ap.add_argument("--tree", nargs="+", default=["mc_sim_7b_63"], help="one or more trees")
    ap.add_argument("--prompts", help="prompt set or file (default: mt-bench, else a few built-in prompts)")
    ap.add_argument("--limit", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--raw", action="store_true", help="no chat template")
    ap.add_argument("--device")
    ap.add_argument("--dtype")
    ap.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "decode.json"))
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        return run(args)
    except WorkbenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def run(args) -> int:
    if args.tiny or (args.model is None and args.heads is None and not DEMO_HEADS.is_dir()):
        if not args.tiny:
            print(f"no demo heads at {DEMO_HEADS}: benchmarking a tiny random model instead", file=sys.stderr)
        from workbench.models import pick_device, pick_dtype

        model, tok, heads, label = tiny_setup()
        dev = pick_device(args.device)
        model = model.to(device=dev, dtype=pick_dtype(args.dtype, dev))
        heads = heads.to(device=model.device, dtype=model.dtype)
    else:
        model, tok, heads = load_model_and_heads(args.model, args.heads, args.device, args.dtype)
        label = model_label(args.model)
    trees = [load_tree(t, num_heads=heads.num_heads) for t in args.tree]
    prompts = prompts_for(args.prompts, args.limit)
    encoded = [prepare_prompt(tok, p, args.raw) for p in prompts]
    n = args.max_new_tokens
    greedy = Acceptance()

    vanilla_generate(model, tok, encoded[0], 4)  # warm-up: kernels, allocator, lazy inits
    medusa_generate(model, heads, tok, encoded[0], trees[0], 4, greedy)
    timed_generate(model, encoded[0], 4)

    rows = []
    for i, ids in enumerate(encoded):
        van = vanilla_generate(model, tok, ids, n)
        rows.append(dict(prompt=i, method="vanilla", tree=None, tokens=len(van.token_ids), steps=len(van.steps),
                         tokens_per_s=van.tokens_per_s, acceleration_rate=1.0, mean_step_ms=1e3 * van.mean_step_s,
                         matches_greedy=True))
        hf_ids, hf_s = timed_generate(model, ids, n)
        rows.append(dict(prompt=i, method="hf_generate", tree=None, tokens=len(hf_ids), steps=len(hf_ids),
                         tokens_per_s=len(hf_ids) / hf_s, acceleration_rate=1.0, mean_step_ms=None,
                         matches_greedy=hf_ids == van.token_ids))
        for tree in trees:
            med = medusa_generate(model, heads, tok, ids, tree, n, greedy)
            rows.append(dict(prompt=i, method="medusa", tree=tree.name or str(tree.as_lists()), tokens=len(med.token_ids),
                             steps=len(med.steps), tokens_per_s=med.tokens_per_s,
                             acceleration_rate=med.acceleration_rate, mean_step_ms=1e3 * med.mean_step_s,
                             overhead=med.mean_step_s / van.mean_step_s, speedup=med.tokens_per_s / van.tokens_per_s,
                             matches_greedy=med.token_ids == van.token_ids,
                             divergence=next(iter(divergences(med, van, model.dtype)), None)))
        print(f"prompt {i + 1}/{len(encoded)} done", file=sys.stderr)

    summary = summarise(rows)
    print(table(summary, label, model))
    atomic_write_json(args.out, dict(
        model=label, device=str(model.device), dtype=str(model.dtype).replace("torch.", ""),
        threads=torch.get_num_threads(), machine=platform.machine(), torch=torch.__version__,
        max_new_tokens=n, prompts=prompts, trees={t.name or str(i): t.as_lists() for i, t in enumerate(trees)},
        summary=summary, runs=rows))
    print(f"wrote {args.out}", file=sys.stderr)
    if model.dtype == torch.float32:
        return 0 if all(r["matches_greedy"] for r in rows) else 1
    return 0 if not any(s.get("mismatches") for s in summary) else 1


def summarise(rows: list[dict]) -> list[dict]:
    """One line per (method, tree): tokens/s over all prompts (total tokens / total time), means of the rest."""
    out = []
    for key in dict.fromkeys((r["method"], r["tree"]) for r in rows):
        rs = [r for r in rows if (r["method"], r["tree"]) == key]
        secs = sum(r["tokens"] / r["tokens_per_s"] for r in rs if r["tokens_per_s"])
        toks = sum(r["tokens"] for r in rs)
        line = dict(method=key[0], tree=key[1], prompts=len(rs), tokens=toks, tokens_per_s=toks / secs if secs else 0.0,
                    acceleration_rate=toks / sum(r["steps"] for r in rs),
                    matches_greedy=sum(r["matches_greedy"] for r in rs))
        steps = [r["mean_step_ms"] for r in rs if r["mean_step_ms"] is not None]
        line["mean_step_ms"] = statistics.fmean(steps) if steps else None
        if key[0] == "medusa":
            line["overhead"] = statistics.fmean(r["overhead"] for r in rs)
            line.update(divergence_counts([r["divergence"] for r in rs if r["divergence"]]))
        out.append(line)
    base = next(s["tokens_per_s"] for s in out if s["method"] == "vanilla")
    for s in out:
        s["speedup"] = s["tokens_per_s"] / base if base else None
    return out


def table(summary: list[dict], label: str, model) -> str:
    head = (f"{'method':<12} {'tree':<16} {'tok/s':>9} {'tok/step':>9} {'step ms':>9} {'overhead':>9} {'speedup':>8} "
            f"{'exact':>6} {'ties':>5} {'mism':>5}")
    lines = [f"{label} on {model.device} ({str(model.dtype).replace('torch.', '')}, {torch.get_num_threads()} threads)",
             head, "-" * len(head)]
    for s in summary:
        step = f"{s['mean_step_ms']:.2f}" if s["mean_step_ms"] is not None else "-"
        over = f"{s['overhead']:.2f}x" if "overhead" in s else "-"
        lines.append(f"{s['method']:<12} {(s['tree'] or '-')[:16]:<16} {s['tokens_per_s']:>9.1f} "
                     f"{s['acceleration_rate']:>9.2f} {step:>9} {over:>9} {s['speedup']:>7.2f}x "
                     f"{s['matches_greedy']:>3}/{s['prompts']} {s.get('near_tie_divergences', '-'):>5} "
                     f"{s.get('mismatches', '-'):>5}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
