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
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from workbench import WorkbenchError  # noqa: E402
from workbench.cli.shared import ScriptParser, run_script  # noqa: E402
from workbench.core.io import atomic_write_json  # noqa: E402
from workbench.core.provenance import dtype_name, load_average  # noqa: E402
from workbench.measure.latency import measured_setting  # noqa: E402
from workbench.core.speed import (acceptance_per_position, decoder_overhead, goodput, mean_step_s, measured_speedup,  # noqa: E402
                                  overhead, step_times, tokens_per_step)
from workbench.decode.divergence import divergence_counts, divergences  # noqa: E402
from workbench.decode.loop import Acceptance, medusa_generate, vanilla_generate  # noqa: E402
from workbench.runtime.compiled import compile_mode  # noqa: E402
from workbench.runtime.engine import StepEngine
from workbench.runtime.timing import forward_probe
from workbench.runtime.treemask import root_setup, tree_setup  # noqa: E402
from workbench.runtime.generation import eos_ids, prepare_prompt  # noqa: E402
from workbench.runtime.heads import DEMO_HEADS  # noqa: E402
from workbench.runtime.models import load_model_and_heads, model_label  # noqa: E402
from workbench.trees.tree import load_tree  # noqa: E402

FALLBACK_PROMPTS = ["Explain how a rainbow forms.", "Write a haiku about autumn.",
                    "List three uses of a paperclip.", "What is 17 times 23?"]


def tiny_setup():
    from tests.support.tiny import random_heads, tiny_model, tiny_tokenizer

    model = tiny_model("llama", seed=0, hidden_size=256, layers=4)
    return model, tiny_tokenizer(), random_heads(256, 128, 5, tied=True, seed=1), "tiny-random-llama"


def prompts_for(spec: str | None, limit: int) -> list[str]:
    if spec is None:
        try:
            from workbench.core.data import load_prompts
            return load_prompts("mt-bench", limit)
        except (WorkbenchError, ImportError):
            return FALLBACK_PROMPTS[:limit]
    from workbench.core.data import load_prompts
    return load_prompts(spec, limit)


def timed_generate(model, prompts: list[list[int]], n: int, cache: str | None, compile: bool, eos: set[int],
                   max_cache_len: int | None = None) -> tuple[list[list[int]], float]:
    """HF generate, greedy, on a batch of prompts (left-padded, as generate wants); cache "static" preallocates (and,
    with compile, compiles the forward as transformers does on CUDA by default; on CPU only when asked). Each output
    is cut after its first EOS, as our decoder stops there. `max_cache_len`: one static cache size for every call
    (transformers >= 5.24), so the compiled forward is compiled once per batch size, not per prompt length."""
    from transformers import CompileConfig, GenerationConfig

    width = max(map(len, prompts))
    pad = next(iter(eos), 0)
    x = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=model.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device)
    kw = {}
    if cache == "static":
        kw["cache_implementation"] = "static"
        if max_cache_len is not None and hasattr(GenerationConfig(), "max_cache_len"):
            kw["max_cache_len"] = max_cache_len
        if compile:
            cfg = CompileConfig(mode=compile_mode(model.device))
            cfg._compile_all_devices = model.device.type != "cuda"
            kw["compile_config"] = cfg
        else:
            kw["disable_compile"] = True
    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    out = model.generate(x, attention_mask=mask, do_sample=False, max_new_tokens=n, pad_token_id=pad, **kw)
    sync()
    seconds = time.perf_counter() - t0
    cut = []
    for row in out[:, width:].tolist():
        end = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        cut.append(row[:end])
    return cut, seconds


def main(argv=None) -> int:
    ap = ScriptParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model")
    ap.add_argument("--heads")
    ap.add_argument("--tiny", action="store_true", help="tiny random model and heads (no download, no demo)")
    ap.add_argument("--tree", nargs="+", default=["mc_sim_7b_63"], help="one or more trees")
    ap.add_argument("--prompts", help="prompt set or file (default: mt-bench, else a few built-in prompts)")
    ap.add_argument("--limit", type=int, default=4)
    ap.add_argument("--batch-sizes", default="1", help="comma-separated batch sizes (prompts decoded together)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--raw", action="store_true", help="no chat template")
    ap.add_argument("--device")
    ap.add_argument("--dtype")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                    help="torch.compile the step (and HF generate's static-cache forward); default: on for CUDA")
    ap.add_argument("--no-hf", action="store_true", help="skip HF generate (saves time on a slow machine)")
    ap.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "decode.json"))
    return run_script(ap, run, argv)


def _setup(args):
    if args.tiny or (args.model is None and args.heads is None and not DEMO_HEADS.is_dir()):
        if not args.tiny:
            print(f"no demo heads at {DEMO_HEADS}: benchmarking a tiny random model instead", file=sys.stderr)
        from workbench.runtime.models import pick_device, pick_dtype

        model, tok, heads, label = tiny_setup()
        dev = pick_device(args.device)
        model = model.to(device=dev, dtype=pick_dtype(args.dtype, dev))
        return model, tok, heads.to(device=model.device, dtype=model.dtype), label
    model, tok, heads = load_model_and_heads(args.model, args.heads, args.device, args.dtype)
    return model, tok, heads, model_label(args.model)


def run(args) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    batch_sizes = sorted({int(b) for b in str(args.batch_sizes).split(",") if b.strip()})
    if not batch_sizes or batch_sizes[0] < 1:
        raise WorkbenchError(f"--batch-sizes {args.batch_sizes}: give positive integers like 1,2,4")
    model, tok, heads, label = _setup(args)
    trees = [load_tree(t, num_heads=heads.num_heads) for t in args.tree]
    names = [t.name or str(t.as_lists()) for t in trees]
    bufs = [tree_setup(t, model) for t in trees]
    root = root_setup(model)
    prompts = prompts_for(args.prompts, args.limit)
    encoded = [prepare_prompt(tok, p, args.raw) for p in prompts]
    if batch_sizes[-1] > len(encoded):
        raise WorkbenchError(f"--batch-sizes: batch {batch_sizes[-1]} but {len(encoded)} prompts: raise --limit")
    n = args.max_new_tokens
    greedy = Acceptance()
    engine = StepEngine(model, compile=args.compile)
    hf_cache = engine.size_for(encoded, n, [root, *bufs])  # one capacity for the run: each (B, N) compiles once
    compiled = engine.compile
    eos = eos_ids(model, tok)
    rows = []
    for bsz in batch_sizes:
        chunks = [encoded[i:i + bsz] for i in range(0, len(encoded), bsz)]
        # warm-up (and compilation) of every shape that is timed later
        vanilla_generate(model, tok, chunks[0], 4, engine=engine)
        for b in bufs:
            medusa_generate(model, heads, tok, chunks[0], b, 4, greedy, engine=engine)
        for cache in (() if args.no_hf else (None, "static")):
            timed_generate(model, chunks[0], 4, cache, compiled, eos, hf_cache)
        for i, chunk in enumerate(chunks):
            base = dict(batch_size=bsz, chunk=i, prompts=len(chunk))
            probe, fwd = forward_probe(engine, root)
            van = vanilla_generate(model, tok, chunk, n, engine=engine, on_step=probe, record=True)
            rows.append(base | _row("vanilla", None, van, fwd, [True] * len(chunk)))
            for cache in (() if args.no_hf else (None, "static")):
                hf, hf_s = timed_generate(model, chunk, n, cache, compiled, eos, hf_cache)
                # generate reports no steps: one result per sequence with its tokens and the call's wall time
                results = [SimpleNamespace(token_ids=h, steps=[], total_s=hf_s, decode_s=hf_s) for h in hf]
                rows.append(base | dict(method=f"hf_generate_{cache or 'dynamic'}", tree=None, results=results,
                                        forward_times=[], matches=[h == v.token_ids for h, v in zip(hf, van)]))
            for name, b in zip(names, bufs):
                probe, fwd = forward_probe(engine, b, heads)
                med = medusa_generate(model, heads, tok, chunk, b, n, greedy, engine=engine, on_step=probe,
                                      record=True)
                rows.append(base | _row("medusa", name, med, fwd, [m.token_ids == v.token_ids for m, v in zip(med, van)])
                            | dict(divergences=[d for m, v in zip(med, van) for d in divergences(m, v, model.dtype)]))
            print(f"batch {bsz}: {i + 1}/{len(chunks)} done", file=sys.stderr)

    summary = summarise(rows, max((b.depth for b in bufs), default=0))
    atomic_write_json(args.out, dict(
        model=label, device=str(model.device), dtype=dtype_name(model.dtype),
        setting=measured_setting(model, engine, "decoder-step"),
        threads=torch.get_num_threads(), machine=platform.machine(), torch=torch.__version__,
        load_average=load_average(),
        compiled=bool(engine.compile), compile_s=engine.compile_s, recompiled=engine.resized, max_new_tokens=n, prompts=prompts, batch_sizes=batch_sizes,
        trees={name: t.as_lists() for name, t in zip(names, trees)}, summary=summary,
        runs=[{k: v for k, v in r.items() if k not in ("results", "forward_times")} for r in rows]))
    print(table(summary, label, model, compiled))
    print(f"wrote {args.out}", file=sys.stderr)
    if model.dtype == torch.float32:
        return 0 if all(all(r["matches"]) for r in rows) else 1
    return 0 if not any(s.get("mismatches") for s in summary) else 1


def _row(method: str, tree, results, forward_times: list[float], matches: list[bool]) -> dict:
    """One batch of one method: its results (every speed below is speed.py's over them) and the bare forwards."""
    return dict(method=method, tree=tree, results=results, forward_times=forward_times, matches=matches)


def summarise(rows: list[dict], depth: int = 0) -> list[dict]:
    """One line per (batch size, method, tree), each quantity from speed.py: goodput over all prompts, speedup
    against vanilla at the same batch size (and the median of the per-batch ratios, which cancels load changes
    between batches), tokens per step per sequence, acceptance per position (Medusa), median step and bare
    forward, decoder_overhead and overhead (mean step over vanilla's)."""
    out = []
    for key in dict.fromkeys((r["batch_size"], r["method"], r["tree"]) for r in rows):
        rs = [r for r in rows if (r["batch_size"], r["method"], r["tree"]) == key]
        van = {r["chunk"]: r for r in rows if r["batch_size"] == key[0] and r["method"] == "vanilla"}
        calls = [r["results"] for r in rs]
        van_calls = [van[r["chunk"]]["results"] for r in rs]
        stepped = key[1] in ("medusa", "vanilla")  # HF generate reports no steps: 1 token per step
        steps, fwd = step_times(calls) if stepped else [], [t for r in rs for t in r["forward_times"]]
        line = dict(batch_size=key[0], method=key[1], tree=key[2], prompts=sum(r["prompts"] for r in rs),
                    tokens=sum(len(x.token_ids) for c in calls for x in c), tokens_per_s=goodput(calls),
                    tokens_per_step=tokens_per_step(calls) if stepped else 1.0,
                    speedup=measured_speedup(calls, van_calls),
                    speedup_median=statistics.median(measured_speedup([r["results"]], [van[r["chunk"]]["results"]])
                                                     for r in rs),
                    matches_greedy=sum(sum(r["matches"]) for r in rs),
                    step_ms=1e3 * statistics.median(steps) if steps else None,
                    forward_ms=1e3 * statistics.median(fwd) if fwd else None,
                    decoder_overhead=decoder_overhead(steps, fwd) if steps and fwd else None,
                    mean_step_ms=1e3 * mean_step_s(calls) if steps else None,
                    overhead=overhead(calls, van_calls) if steps else None)
        if key[1] == "medusa":
            line["acceptance_per_position"] = acceptance_per_position(calls, depth)
            line.update(divergence_counts([d for r in rs for d in r["divergences"]]))
        out.append(line)
    return out


def table(summary: list[dict], label: str, model, compiled: bool) -> str:
    head = (f"{'B':>3} {'method':<20} {'tree':<28} {'tok/s':>7} {'tok/step':>8} {'step ms':>8} {'fwd ms':>7} "
            f"{'overhead':>8} {'speedup':>8} {'median':>7} {'exact':>6} {'ties':>5} {'mism':>5}")
    now = load_average()
    load = "" if now is None else f", load average {now:.2f}"
    lines = [f"{label} on {model.device} ({dtype_name(model.dtype)}, {torch.get_num_threads()} threads, "
             f"{'compiled' if compiled else 'eager'}{load})", head, "-" * len(head)]
    fmt = lambda v, spec, unit="": f"{'-':>{int(spec.split('.')[0]) + len(unit)}}" if v is None else f"{v:{spec}}{unit}"  # noqa: E731
    for s in summary:
        lines.append(f"{s['batch_size']:>3} {s['method']:<20} {(s['tree'] or '-')[:28]:<28} {s['tokens_per_s']:>7.1f} "
                     f"{s['tokens_per_step']:>8.2f} {fmt(s['step_ms'], '8.1f')} {fmt(s['forward_ms'], '7.1f')} "
                     f"{fmt(s['decoder_overhead'], '7.2f', 'x')} {s['speedup']:>7.2f}x {s['speedup_median']:>6.2f}x "
                     f"{s['matches_greedy']:>3}/{s['prompts']} {s.get('near_tie_divergences', '-'):>5} "
                     f"{s.get('mismatches', '-'):>5}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
