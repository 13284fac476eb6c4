"""Medusa vs vanilla greedy vs HF `generate` on the same prompts: tokens/s, acceleration, measured overhead, exactness.

    python bench/decode.py --threads 1          # demo model + shipped heads (a tiny random model if none)
    python bench/decode.py --model M --heads H --tree mc_sim_7b_63 --prompts mt-bench --limit 8
    python bench/decode.py --tiny               # tiny random Llama with random heads: checks the plumbing only
    python bench/decode.py --compile            # the step under torch.compile (default on CUDA)

Prints a table and writes JSON (bench/results/decode.json unless --out). Everything runs on one StepEngine (static
KV cache, compiled when asked) after an untimed warm-up of every tree (compilation happens there). Per prompt the
methods run back to back (vanilla, HF generate with a dynamic and a static cache, every tree), so a load change on
a shared machine hits them alike. After every step the bare verify work of the same tree (the 1-token step for
vanilla) is timed once at that step's context (`forward_probe`, outside the step's own timing):
decoder_overhead = median step / median bare forward, what a step costs beyond its model work. Wall clock,
synchronised on CUDA.

Where Medusa's output differs from vanilla greedy (bf16/fp16 rounding), each prompt's first divergence is in the
JSON (`divergence`: position, both tokens, both runs' top-2 logit margins, "near-tie" or "mismatch") and counted in
the table; the exit status is 1 on any "mismatch" (a bug), or on any difference at all in fp32.
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
from workbench.decode import Acceptance, medusa_generate, vanilla_generate  # noqa: E402
from workbench.divergence import divergence_counts, divergences  # noqa: E402
from workbench.engine import StepEngine, compile_mode, forward_probe, root_setup, tree_setup  # noqa: E402
from workbench.generation import prepare_prompt  # noqa: E402
from workbench.heads import DEMO_HEADS  # noqa: E402
from workbench.io import atomic_write_json  # noqa: E402
from workbench.models import load_model_and_heads, model_label  # noqa: E402
from workbench.tree import load_tree  # noqa: E402

FALLBACK_PROMPTS = ["Explain how a rainbow forms.", "Write a haiku about autumn.",
                    "List three uses of a paperclip.", "What is 17 times 23?"]


def tiny_setup():
    from workbench.testing import random_heads, tiny_model, tiny_tokenizer

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


def timed_generate(model, ids: list[int], n: int, cache: str | None, compile: bool) -> tuple[list[int], float]:
    """HF generate, greedy; cache "static" preallocates (and, with compile, compiles the forward as transformers
    does on CUDA by default; on CPU only when asked)."""
    from transformers import CompileConfig

    x = torch.tensor([ids], device=model.device)
    kw = {}
    if cache == "static":
        kw["cache_implementation"] = "static"
        if compile:
            cfg = CompileConfig(mode=compile_mode(model.device))
            cfg._compile_all_devices = model.device.type != "cuda"
            kw["compile_config"] = cfg
        else:
            kw["disable_compile"] = True
    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n, **kw)
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
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                    help="torch.compile the step (and HF generate's static-cache forward); default: on for CUDA")
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
    names = [t.name or str(t.as_lists()) for t in trees]
    bufs = [tree_setup(t, model) for t in trees]
    root = root_setup(model)
    prompts = prompts_for(args.prompts, args.limit)
    encoded = [prepare_prompt(tok, p, args.raw) for p in prompts]
    n = args.max_new_tokens
    greedy = Acceptance()
    engine = StepEngine(model, compile=args.compile)
    engine.reserve(max(map(len, encoded)) + n + max(b.size for b in bufs))
    compiled = args.compile if args.compile is not None else engine.compile

    # warm-up (and compilation) of every shape that is timed later
    vanilla_generate(model, tok, encoded[0], 4, engine=engine)
    for b in bufs:
        medusa_generate(model, heads, tok, encoded[0], b, 4, greedy, engine=engine)
    for cache in (None, "static"):
        timed_generate(model, encoded[0], 4, cache, compiled)
    rows = []
    for i, ids in enumerate(encoded):
        probe, fwd = forward_probe(engine, root)
        van = vanilla_generate(model, tok, ids, n, engine=engine, on_step=probe)
        rows.append(dict(prompt=i, method="vanilla", tree=None, tokens=len(van.token_ids), steps=len(van.steps),
                         seconds=van.total_s, acceleration_rate=1.0,
                         step_ms=1e3 * statistics.median(s.time_s for s in van.steps),
                         forward_ms=1e3 * statistics.median(fwd), matches_greedy=True))
        for cache in (None, "static"):
            hf_ids, hf_s = timed_generate(model, ids, n, cache, compiled)
            rows.append(dict(prompt=i, method=f"hf_generate_{cache or 'dynamic'}", tree=None, tokens=len(hf_ids),
                             steps=len(hf_ids), seconds=hf_s, acceleration_rate=1.0, step_ms=None,
                             matches_greedy=hf_ids == van.token_ids))
        for name, b in zip(names, bufs):
            probe, fwd = forward_probe(engine, b, heads)
            med = medusa_generate(model, heads, tok, ids, b, n, greedy, engine=engine, on_step=probe)
            rows.append(dict(prompt=i, method="medusa", tree=name, tokens=len(med.token_ids), steps=len(med.steps),
                             seconds=med.total_s, acceleration_rate=med.acceleration_rate,
                             step_ms=1e3 * statistics.median(s.time_s for s in med.steps),
                             forward_ms=1e3 * statistics.median(fwd),
                             matches_greedy=med.token_ids == van.token_ids,
                             divergence=next(iter(divergences(med, van, model.dtype)), None)))
        print(f"prompt {i + 1}/{len(encoded)} done", file=sys.stderr)

    summary = summarise(rows)
    atomic_write_json(args.out, dict(
        model=label, device=str(model.device), dtype=str(model.dtype).replace("torch.", ""),
        threads=torch.get_num_threads(), machine=platform.machine(), torch=torch.__version__,
        compiled=bool(engine.compile), max_new_tokens=n, prompts=prompts,
        trees={name: t.as_lists() for name, t in zip(names, trees)}, summary=summary, runs=rows))
    print(table(summary, label, model, compiled))
    print(f"wrote {args.out}", file=sys.stderr)
    if model.dtype == torch.float32:
        return 0 if all(r["matches_greedy"] for r in rows) else 1
    return 0 if not any(s.get("mismatches") for s in summary) else 1


def summarise(rows: list[dict]) -> list[dict]:
    """One line per (method, tree): tokens/s over all prompts (total tokens / total time), speedup against vanilla
    (and the median of the per-prompt ratios, which cancels load changes between prompts), median step and bare
    forward times, decoder_overhead = step_ms / forward_ms."""
    out = []
    vanilla = {r["prompt"]: r for r in rows if r["method"] == "vanilla"}
    for key in dict.fromkeys((r["method"], r["tree"]) for r in rows):
        rs = [r for r in rows if (r["method"], r["tree"]) == key]
        toks, secs = sum(r["tokens"] for r in rs), sum(r["seconds"] for r in rs)
        line = dict(method=key[0], tree=key[1], prompts=len(rs), tokens=toks, tokens_per_s=toks / secs,
                    acceleration_rate=toks / sum(r["steps"] for r in rs),
                    speedup_median=statistics.median(
                        (r["tokens"] / r["seconds"]) / (vanilla[r["prompt"]]["tokens"] / vanilla[r["prompt"]]["seconds"])
                        for r in rs),
                    matches_greedy=sum(r["matches_greedy"] for r in rs))
        steps = [r["step_ms"] for r in rs if r["step_ms"] is not None]
        fwd = [r["forward_ms"] for r in rs if r.get("forward_ms") is not None]
        line["step_ms"] = statistics.median(steps) if steps else None
        line["forward_ms"] = statistics.median(fwd) if fwd else None
        line["decoder_overhead"] = line["step_ms"] / line["forward_ms"] if steps and fwd else None
        if key[0] == "medusa":
            line.update(divergence_counts([r["divergence"] for r in rs if r["divergence"]]))
        out.append(line)
    base = next(s["tokens_per_s"] for s in out if s["method"] == "vanilla")
    for s in out:
        s["speedup"] = s["tokens_per_s"] / base if base else None
    return out


def table(summary: list[dict], label: str, model, compiled: bool) -> str:
    head = (f"{'method':<20} {'tree':<28} {'tok/s':>7} {'tok/step':>8} {'step ms':>8} {'fwd ms':>7} "
            f"{'overhead':>8} {'speedup':>8} {'median':>7} {'exact':>6} {'ties':>5} {'mism':>5}")
    lines = [f"{label} on {model.device} ({str(model.dtype).replace('torch.', '')}, {torch.get_num_threads()} threads, "
             f"{'compiled' if compiled else 'eager'})", head, "-" * len(head)]
    fmt = lambda v, spec, unit="": f"{'-':>{int(spec.split('.')[0]) + len(unit)}}" if v is None else f"{v:{spec}}{unit}"  # noqa: E731
    for s in summary:
        lines.append(f"{s['method']:<20} {(s['tree'] or '-')[:28]:<28} {s['tokens_per_s']:>7.1f} "
                     f"{s['acceleration_rate']:>8.2f} {fmt(s['step_ms'], '8.1f')} {fmt(s['forward_ms'], '7.1f')} "
                     f"{fmt(s['decoder_overhead'], '7.2f', 'x')} {s['speedup']:>7.2f}x {s['speedup_median']:>6.2f}x "
                     f"{s['matches_greedy']:>3}/{s['prompts']} {s.get('near_tie_divergences', '-'):>5} "
                     f"{s.get('mismatches', '-'):>5}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
