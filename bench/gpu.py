"""The GPU evidence in one command and one lease: per batch size the latency surface of the decode's own graphs and
the decode (vanilla, HF generate, Medusa with the plan's choice, predicted beside measured), then the compiled
step's exactness, static vs per-step trees, and the captured step against the whole-step graph.

    python bench/gpu.py                          # on a CUDA machine: < 8 minutes with the demo model (docs/gpu.md)
    python bench/gpu.py --quick --device cpu     # the same plumbing in seconds (tiny sizes; run by the test suite)

Parts run in order, each only if the time budget (--budget-s) leaves room for it; a skipped one says so in the
JSON, and the report is written after every part and every batch size, so a run cut short keeps what it
measured. Written: bench/results/gpu-DEVICE.json (--out) with every figure, the latency surfaces as CSVs beside it
(`workbench latency` format: `workbench plan --latency` reads them), a markdown summary (.md) that the docs
quote, and inductor's cache artifacts (compile-cache/KEY.bin, KEY = GPU, torch, Triton), which --compile-cache
loads in the next run. Exit status 1 if fp32 is not exact, bf16 has a mismatch or a CUDA graph was skipped (a
bug), 2 on a bad flag, else 0.

  env        device, torch/transformers, the step's kind (--step: captured, CUDA's default, or the whole step as one
             graph), the model's weight bytes, the device's copy bandwidth; the compile cache's hit or miss
  eager      t(B, n) eager for batch 1..32 and tree tokens 1..128, with spread (a side figure: --skip eager)
  per batch  (--batch-sizes, in order while the budget allows) the decoder's whole step at that batch (decoder-step
             mode, tokens 1, 16, 64: the surface the plan reads, on the graphs the decode runs), then the decode,
             warmed up on exactly the graphs it times: our vanilla greedy, HF generate (static cache,
             CompileConfig), Medusa with the plan's choice, planned on the surface so far; the decoding speedup
             predicted beside measured, the end-to-end one beside it; decoder_overhead; bandwidth per vanilla step
  exact      on engines of the decode's kind: tiny random models of three architectures, trees of 1 to 63 nodes,
             batch 3 and 1, plus the demo model: fp32 equal to HF generate token for token; bf16 divergences
             classified (near-tie or mismatch, `workbench/decode/divergence.py`)
  dynamic    static against per-step trees at 2-3 budgets, batch 1
  ab         batch 1 on the captured step and on the whole-step graph
  shapes     per step shape: compile and capture seconds, graphs compiled, CUDA-graph skips (0 expected)
"""
from __future__ import annotations

import importlib.util
import logging
import os
import platform
import re
import statistics
import sys
import time
from types import SimpleNamespace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pandas as pd  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from workbench import WorkbenchError  # noqa: E402
from workbench.calibrate.folder import Calibration, default_calibration  # noqa: E402
from workbench.cli import _Parser  # noqa: E402  (the CLI's parser: a bad flag is one `error:` line)
from workbench.cli.shared import finite, parse_ints, run_script  # noqa: E402
from workbench.core.io import atomic_write_json, atomic_write_text  # noqa: E402
from workbench.core.provenance import dtype_name, load_average  # noqa: E402
from workbench.core.speed import (decode_speedup, decoder_overhead, goodput, mean_step_s, measured_speedup,  # noqa: E402
                                  median_decode_speedup, step_times, tokens_per_step)
from workbench.decode.divergence import divergence_counts, divergences  # noqa: E402
from workbench.decode.loop import medusa_generate, vanilla_generate  # noqa: E402
from workbench.measure.latency import (device_name, latency_tree, measure_decoder_steps, measure_latency,  # noqa: E402
                                       timed_depth)
from workbench.plan.rank import make_plan
from workbench.plan.source import plan_source
from workbench.plan.plan_file import plan_trees  # noqa: E402
from workbench.runtime.compiled import compile_mode  # noqa: E402
from workbench.runtime.engine import StepEngine
from workbench.runtime.timing import forward_probe
from workbench.runtime.treemask import root_setup, tree_setup  # noqa: E402
from workbench.runtime.generation import eos_ids, prepare_prompt  # noqa: E402
from workbench.runtime.models import load_model_and_heads, pick_device  # noqa: E402
from workbench.trees.dynamic import DynamicPolicy  # noqa: E402
from workbench.trees.optimize import optimal_tree_from  # noqa: E402
from tests.support.tiny import random_heads, tiny_model  # noqa: E402

HERE = Path(__file__).resolve().parent
FALLBACK_ACCURACIES = HERE.parent / "calibration" / "smollm2-135m-instruct-alpaca-eval" / "accuracies.csv"
FULL = dict(archs=("llama", "qwen2", "gpt_neox"), exact_new=256, batches=(1, 2, 4, 8, 16, 32),
            sizes=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128), step_sizes=(1, 16, 64), step_new=48,
            contexts=(256,), repeats=10, decode_batches=(1, 4, 16), prompts=16, new_tokens=128, demo_prompts=4,
            dyn_budgets=(8, 16, 32), dyn_prompts=8, dyn_new=64, exact_trees=("one_node", "chain", "mc_sim_7b_63"))
QUICK = dict(archs=("llama",), exact_new=8, batches=(1, 2), sizes=(1, 2), step_sizes=(1, 2), step_new=4,
             contexts=(16,), repeats=2, decode_batches=(1, 2), prompts=2, new_tokens=6, demo_prompts=1,
             dyn_budgets=(2,), dyn_prompts=1, dyn_new=4, exact_trees=("one_node", "chain"))
EXACT_TREES = {"one_node": [[0]], "chain": [[0], [0, 0], [0, 0, 0]], "mc_sim_7b_63": "mc_sim_7b_63"}
STEPS = {"captured": "captured", "whole": True}  # --step: the decoder layers compiled, the step captured per shape
# (CUDA's default); or the whole step compiled as one graph with CUDA graphs (mode="reduce-overhead")
SECTIONS = ("exact", "eager", "dynamic", "ab")  # what --skip may leave out


def _load_bench_decode():
    """bench/decode.py's HF-generate timing (one owner of how HF generate is run and timed)."""
    spec = importlib.util.spec_from_file_location("bench_decode", HERE / "decode.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def copy_bandwidth(device: torch.device, mib: int = 512) -> float:
    """Bytes per second of a large device-to-device copy (read + write): the practical ceiling of a step that
    streams the weights once."""
    x = torch.empty(mib << 18, dtype=torch.float32, device=device)  # mib MiB
    y = torch.empty_like(x)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    y.copy_(x)
    sync()
    t0 = time.perf_counter()
    for _ in range(5):
        y.copy_(x)
    sync()
    return 5 * 2 * x.numel() * x.element_size() / (time.perf_counter() - t0)


def weight_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


class Budget:
    """Seconds left of the command's budget; a section runs only if its estimate fits."""

    def __init__(self, seconds: float):
        self.end = time.perf_counter() + seconds

    def left(self) -> float:
        return self.end - time.perf_counter()


# ----------------------------------------------------------------------------------------------- sections

def section_exact(device, cfg, demo, make_engine) -> dict:
    """On engines of the decode's kind (`make_engine(model)`: compiled and captured as the decode runs): fp32
    identical to HF generate (tiny models, trees of 1-63 nodes, batch 1 and 3; the demo model); bf16 classified."""
    out = dict(cases=0, fp32_identical=0, bf16_sequences=0, near_tie_divergences=0, mismatches=0)
    prompts = [[5, 6, 7, 8, 9], list(range(10, 31)), [3, 4, 5]]
    for arch in cfg["archs"]:
        base = tiny_model(arch, seed=10, max_positions=1024).to(device)
        heads = random_heads(64, 128, 5, seed=1).to(device)
        for dtype in (torch.float32, torch.bfloat16):
            model, h = base.to(dtype), heads.to(dtype)
            engine = make_engine(model)
            bufs = [tree_setup(EXACT_TREES[t], model) for t in cfg["exact_trees"]]
            engine.size_for(prompts, cfg["exact_new"], bufs)
            truth = [model.generate(torch.tensor([p], device=device), do_sample=False, max_new_tokens=cfg["exact_new"],
                                    eos_token_id=None)[0, len(p):].tolist() for p in prompts]
            out.setdefault("engine", engine.compiled_as)
            for group in (prompts, prompts[:1]):  # batch 3, then 1: one cache (and its graphs) per batch size
                van = vanilla_generate(model, None, group, cfg["exact_new"], eos_token_id=[], record=True,
                                       engine=engine)
                for buf in bufs:
                    res = medusa_generate(model, h, None, group, buf, cfg["exact_new"], eos_token_id=[],
                                          record=True, engine=engine)
                    for r, v, t in zip(res, van, truth):
                        out["cases"] += 1
                        if dtype == torch.float32:
                            out["fp32_identical"] += r.token_ids == t == v.token_ids
                        else:
                            out["bf16_sequences"] += 1
                            for k, n in divergence_counts(divergences(r, v, dtype)).items():
                                out[k] += n
    if demo is not None:
        model, tok, heads = demo
        engine = make_engine(model)
        ids = [prepare_prompt(tok, q) for q in ("Explain KV caching.", "Write a haiku about GPUs.",
                                                "List three prime numbers.", "What is speculative decoding?")]
        ids = ids[: cfg["demo_prompts"]]
        buf = tree_setup("mc_sim_7b_63", model)
        engine.size_for(ids, cfg["exact_new"], [buf])
        van = vanilla_generate(model, tok, ids, cfg["exact_new"], record=True, engine=engine)
        med = medusa_generate(model, heads, tok, ids, buf, cfg["exact_new"], record=True, engine=engine)
        found = [d for m, v in zip(med, van) for d in divergences(m, v, model.dtype)]
        out["demo"] = dict(dtype=dtype_name(model.dtype), prompts=len(ids),
                           identical=sum(m.token_ids == v.token_ids for m, v in zip(med, van)),
                           **divergence_counts(found))
        if model.dtype != torch.bfloat16:
            out["mismatches"] += out["demo"]["mismatches"]
    out["fp32_cases"] = out["cases"] - out["bf16_sequences"]
    out["fp32_exact"] = out["fp32_identical"] == out["fp32_cases"]
    return out


def section_latency(model, heads, cfg, out_dir: Path, tag: str, name: str, eng, batches, res: dict,
                    budget: "Budget | None" = None, steps: tuple | None = None) -> dict:
    """One latency grid for `batches`, with spread, added to `res[name]` and written as a latency CSV (every batch
    so far). `steps` = (tokenizer, prompts): the decoder's whole step while it decodes them (decoder-step mode, on
    the engine the decode section then runs on, whose graphs it compiles: the plan is priced on the step the
    decoder runs, heads, acceptance and compaction included); None: the bare verify forward at fixed contexts on
    a fresh eager engine (the eager reference grid). With a budget the grid goes batch by batch while one more
    batch fits."""
    t0, c0, got = time.perf_counter(), eng.compile_s, res.get(name)
    frames = [pd.DataFrame(got["rows"])] if got else []
    skipped = list(got["skipped_batches"]) if got else []
    for i, b in enumerate(batches):
        if budget is not None and i and budget.left() < 1.5 * (time.perf_counter() - t0) / i:
            skipped.append(b)
            continue
        if steps is None:
            frames.append(measure_latency(model, cfg["sizes"], cfg["contexts"], cfg["repeats"], 2, heads, "bench-gpu",
                                          progress=False, engine=eng, batches=(b,)))
        else:
            frames.append(measure_decoder_steps(model, heads, steps[0], steps[1], cfg["step_sizes"], (b,),
                                                repeats=cfg["repeats"] // 2, warmup=1, max_new_tokens=cfg["step_new"],
                                                label="bench-gpu", progress=False, engine=eng))
    df = pd.concat(frames, ignore_index=True)
    path = out_dir / f"latency-{tag}-{name}.csv"
    atomic_write_text(path, df.to_csv(index=False))
    res[name] = dict(file=str(path), compiled=eng.compiled_as, mode="verify" if steps is None else "decoder-step",
                     capacity=eng.capacity, skipped_batches=skipped,
                     compile_s=(got["compile_s"] if got else 0.0) + eng.compile_s - c0,
                     seconds=(got["seconds"] if got else 0.0) + time.perf_counter() - t0, rows=df.to_dict("records"))
    return res[name]


def surface_provenance(model, latency: dict, mode: str) -> dict:
    """Which latency surface a plan read, and what measured it: the mode the decoder runs in."""
    return dict(file=latency[mode]["file"], mode=mode, device_name=device_name(model.device),
                dtype=dtype_name(model.dtype), compiled=latency[mode]["compiled"],
                threads=torch.get_num_threads(), torch=torch.__version__, transformers=transformers.__version__)


def section_decode(model, tok, heads, cfg, prompts, latency: dict, calibration, bench_decode, engine, batches,
                   dec: dict) -> dict:
    """For `batches`, added to `dec`: our vanilla (on the engine: compiled where the device compiles), HF generate
    at its fastest (static cache sized once, compiled, warmed up untimed), Medusa with the plan's choice (planned on
    the surface of the engine's own mode, as measured so far); decoder_overhead, bandwidth, every bf16 divergence
    classified. The timed calls run the graphs the grid timed and the warm-up compiled (no `record`: it adds
    outputs, so another graph); a chunk whose Medusa tokens differ from vanilla's is decoded again afterwards,
    untimed, with the chosen rows recorded, to classify each divergence."""
    mode = "compiled" if engine.compiled_as and "compiled" in latency else "eager"
    # a calibration predicts the demo's trees; a tiny random model borrows the committed accuracy table (plumbing)
    source = plan_source(calibration) if calibration is not None else plan_source(accuracies=FALLBACK_ACCURACIES)
    plan = make_plan(source, latency[mode]["file"], batches)
    if "plan" in dec:  # one plan file for the run: this call's batch sizes added to the earlier ones'
        for k in ("plans", "alternatives"):
            plan[k] = dec["plan"][k] + plan[k]
    eos = eos_ids(model, tok)
    n, rows = cfg["new_tokens"], dec.setdefault("batches", [])
    planned = {b: (t, e) for t, b, e in plan_trees(plan) if t.name.split("_")[2] == "choice"}
    wbytes = weight_bytes(model)
    hf_cache = dict(max_cache_len=engine.capacity)  # one static cache size for every HF call: compiled once per B
    hf_compile = model.device.type == "cuda"  # as users run it: compiled on CUDA (CPU inductor: minutes per shape)
    t_start = time.perf_counter()
    for b in batches:
        chunks = [prompts[i:i + b] for i in range(0, len(prompts) - b + 1, b)]
        trees = {"plan": planned[b][0]} if b in planned else {}
        bufs = {k: tree_setup(t, model) for k, t in trees.items()}
        # warm-up: every graph the timed calls run (steps and the probes' bare forwards), compiled and captured
        c0, t0, shapes0 = engine.compile_s, time.perf_counter(), len(engine.shapes)
        vanilla_generate(model, tok, chunks[0], 4, engine=engine, on_step=forward_probe(engine, root_setup(model))[0])
        for buf in bufs.values():
            medusa_generate(model, heads, tok, chunks[0], buf, 4, engine=engine,
                            on_step=forward_probe(engine, buf, heads)[0])
        warm_s, warm_shapes = time.perf_counter() - t0, len(engine.shapes)
        t0 = time.perf_counter()
        for _ in range(2):
            bench_decode.timed_generate(model, chunks[0], 4, "static", hf_compile, eos, **hf_cache)
        hf_compile_s = time.perf_counter() - t0
        van, hf_calls, med, probes = [], [], {k: [] for k in bufs}, {k: [] for k in ["vanilla", *bufs]}
        for chunk in chunks:
            probe, times = forward_probe(engine, root_setup(model))
            van.append(vanilla_generate(model, tok, chunk, n, engine=engine, on_step=probe))
            probes["vanilla"] += times
            hf, s = bench_decode.timed_generate(model, chunk, n, "static", hf_compile, eos, **hf_cache)
            # generate reports no steps: one result per sequence with its tokens and the call's wall time
            hf_calls.append([SimpleNamespace(token_ids=h, steps=[], total_s=s, decode_s=s) for h in hf])
            for k, buf in bufs.items():
                probe, times = forward_probe(engine, buf, heads)
                med[k].append(medusa_generate(model, heads, tok, chunk, buf, n, engine=engine, on_step=probe))
                probes[k] += times
        step = mean_step_s(van)
        row = dict(batch_size=b, vanilla_tokens_per_s=goodput(van), vanilla_step_ms=1e3 * step,
                   vanilla_forward_ms=1e3 * statistics.median(probes["vanilla"]),
                   vanilla_decoder_overhead=decoder_overhead(step_times(van),
                                                             probes["vanilla"]),
                   bandwidth_per_step=wbytes / step, hf_generate_tokens_per_s=goodput(hf_calls),
                   compile_s=engine.compile_s - c0, warmup_s=warm_s, hf_compiled=hf_compile, hf_warmup_s=hf_compile_s,
                   shapes=engine.shapes[shapes0:], unwarmed_shapes=len(engine.shapes) - warm_shapes)
        for k, calls in med.items():
            rate = goodput(calls)
            found = []
            for chunk, c, vc in zip(chunks, calls, van):  # untimed: the rows that chose each token, where they differ
                if any(r.token_ids != v.token_ids for r, v in zip(c, vc)):
                    rv = vanilla_generate(model, tok, chunk, n, engine=engine, record=True)
                    rm = medusa_generate(model, heads, tok, chunk, bufs[k], n, engine=engine, record=True)
                    found += [d for r, v in zip(rm, rv) for d in divergences(r, v, model.dtype)]
            row[k] = dict(tree=trees[k].as_lists(), nodes=trees[k].nodes, tokens_per_s=rate,
                          tokens_per_step=tokens_per_step(calls),
                          speedup_vs_vanilla=measured_speedup(calls, van), decode_speedup=decode_speedup(calls, van),
                          decode_speedup_median=median_decode_speedup(calls, van),  # the plan's statistic
                          speedup_vs_hf=measured_speedup(calls, hf_calls),
                          decoder_overhead=decoder_overhead(step_times(calls), probes[k]),
                          forward_ms=1e3 * statistics.median(probes[k]),
                          predicted_tokens_per_step=planned[b][1]["predicted_tokens_per_step"],
                          predicted_speedup=planned[b][1]["predicted_speedup"],
                          exact=all(r.token_ids == v.token_ids for c, vc in zip(calls, van) for r, v in zip(c, vc)),
                          **divergence_counts(found))
        rows.append(row)
    dec.update(plan=plan, plan_surface=surface_provenance(model, latency, mode), weight_bytes=wbytes,
               capacity=engine.capacity, resized=engine.resized,
               seconds=dec.get("seconds", 0.0) + time.perf_counter() - t_start)
    return dec


def decode_prompts(tok, cfg) -> list[list[int]]:
    """Held-out Alpaca-eval prompts (late rows: not the calibration's), token ids; tiny models get fixed ids."""
    from workbench.core.data import load_prompts

    try:
        texts = load_prompts("alpaca-eval", cfg["prompts"] * 4)[-cfg["prompts"]:]
    except WorkbenchError:
        texts = [f"Write a short note about topic {i}." for i in range(cfg["prompts"])]
    return [prepare_prompt(tok, t) for t in texts] if tok is not None else [[5 + i, 6, 7, 8] for i in range(len(texts))]


def markdown(report: dict) -> str:
    env, lines = report["env"], []
    lines.append(f"# bench/gpu.py on {env['device_name']} ({env['dtype']}, torch {env['torch']}, transformers "
                 f"{env['transformers']})\n")
    ex = report.get("exact") or {}
    if ex:
        lines.append(f"Exactness: fp32 {ex['fp32_identical']}/{ex['fp32_cases']} identical to HF generate; bf16 "
                     f"{ex['bf16_sequences']} sequences, {ex['near_tie_divergences']} near-ties, {ex['mismatches']} "
                     f"mismatches.\n")
    dec = report.get("decode") or {}
    if dec:
        src = dec["plan_surface"]
        lines.append(f"Plans read the {src['mode']} surface ({src['device_name']}, {src['dtype']}); one KV cache "
                     f"capacity of {dec['capacity']} positions for the run (grown {dec['resized']} times).\n")
        lines.append("| batch | vanilla tok/s | HF generate tok/s | step ms (forward) | bandwidth GB/s (copy "
                     f"{env['copy_bandwidth'] / 1e9:.0f}) | plan choice | tokens/step pred. / meas. | decoding speedup "
                     "pred. / meas. medians (totals) | end-to-end | vs HF | decoder_overhead | near-ties / mismatches | compile s |")
        lines.append("|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
        for r in dec["batches"]:
            p = r.get("plan") or {}
            tps = f"{p['predicted_tokens_per_step']:.2f} / {p['tokens_per_step']:.2f}" if p else "1 / 1"
            lines.append(f"| {r['batch_size']} | {r['vanilla_tokens_per_s']:.1f} | {r['hf_generate_tokens_per_s']:.1f} "
                         f"| {r['vanilla_step_ms']:.2f} ({r['vanilla_forward_ms']:.2f}) | "
                         f"{r['bandwidth_per_step'] / 1e9:.0f} | {p.get('nodes', 'none')} | {tps} | "
                         f"{p.get('predicted_speedup', 1.0):.2f}x / {p.get('decode_speedup_median', 1.0):.2f}x "
                         f"({p.get('decode_speedup', 1.0):.2f}x) | "
                         f"{p.get('speedup_vs_vanilla', 1.0):.2f}x | "
                         f"{p.get('speedup_vs_hf', float('nan')):.2f}x | "
                         f"{p.get('decoder_overhead', r['vanilla_decoder_overhead']):.2f} | "
                         f"{p.get('near_tie_divergences', 0)} / {p.get('mismatches', 0)} | {r['compile_s']:.1f} |")
    shapes = report.get("shapes") or []
    if shapes:
        lines.append(f"\nCompiled and captured shapes ({report['env']['step']}): " + "; ".join(
            f"B{x['batch']} N{x['size']}{' forward' if x['key'] == ['verify'] else ''} {x['compile_s']:.1f} + "
            f"{x['capture_s']:.2f} s, {x['graphs']} graphs, "
            f"{x['cudagraph_skips']} skips" for x in shapes) +
            f". Total {sum(x['compile_s'] + x['capture_s'] for x in shapes):.0f} s, "
            f"{sum(x['cudagraph_skips'] for x in shapes)} CUDA-graph skips; compile cache: {report['cache']['status']}.")
    for name, title in (("dynamic", "Static vs per-step trees (batch 1, decoding speedup)"),
                        ("ab", "Captured vs whole-step graph (batch 1)")):
        part = report.get(name) or {}
        if part.get("rows"):
            lines.append(f"\n{title}: " + "; ".join(
                ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items())
                for r in part["rows"]) + ".")
    secs = {k: report[k]["seconds"] for k in ("exact", "decode", "dynamic", "ab") if k in report}
    secs.update({f"latency {k}": v["seconds"] for k, v in (report.get("latency") or {}).items()})
    lines.append("\nSeconds: " + ", ".join(f"{k} {v:.0f}" for k, v in secs.items()) +
                 f"; total {report.get('total_s', 0):.0f} (budget {report['budget_s']:.0f}).")
    for name, why in report["skipped"].items():
        lines.append(f"\nSkipped {name}: {why}")
    return "\n".join(lines) + "\n"


def section_dynamic(model, tok, heads, cfg, prompts, calibration, engine) -> dict:
    """Static against per-step trees at equal budgets, batch 1, on an engine of the decode's kind: per budget the static tree of
    n nodes (the calibration's joint paths; a tiny model: the latency grid's tree shape) and the per-step tree of n
    nodes chosen inside the step from a 64-node envelope, decoded beside vanilla on the same prompts, every shape
    warmed up first. Decoding speedup (what a plan predicts) and end to end."""
    t0, depth = time.perf_counter(), timed_depth(heads)
    budgets, n, chosen = cfg["dyn_budgets"], cfg["dyn_new"], prompts[: cfg["dyn_prompts"]]
    if calibration is not None:
        cal = Calibration(calibration)
        K, R = cal.accuracies("fit").shape
        static = {b: optimal_tree_from(cal.joint_value("fit"), b, K, R, name=f"static_{b}") for b in budgets}
        envelope = optimal_tree_from(cal.joint_value("fit"), 64, K, R, name="envelope_64")
    else:
        static = {b: latency_tree(b, depth) for b in budgets}
        envelope = latency_tree(2 * max(budgets), depth)
    specs = {f"static_{b}": tree_setup(static[b], model) for b in budgets}
    specs |= {f"dynamic_{b}": DynamicPolicy(b, envelope) for b in budgets}
    engine.size_for(chosen, n, [tree_setup(envelope, model), *(v for v in specs.values() if hasattr(v, "size"))])
    vanilla_generate(model, tok, chosen[:1], 2, engine=engine)  # warm-up of every shape, untimed
    for spec in specs.values():
        medusa_generate(model, heads, tok, chosen[:1], spec, 2, engine=engine)
    van = [vanilla_generate(model, tok, [p], n, engine=engine) for p in chosen]
    med = {k: [medusa_generate(model, heads, tok, [p], spec, n, engine=engine) for p in chosen]
           for k, spec in specs.items()}
    rows = [dict(budget=b, **{f"{kind}_{q}": f(med[f"{kind}_{b}"], van) for kind in ("static", "dynamic")
                              for q, f in (("tokens_per_step", lambda m, v: tokens_per_step(m)),
                                           ("decode_speedup", decode_speedup), ("end_to_end", measured_speedup))})
            for b in budgets]
    return dict(rows=rows, batch_size=1, prompts=len(chosen), new_tokens=n, seconds=time.perf_counter() - t0)


def section_ab(model, tok, heads, cfg, prompts, tree, engines: dict) -> dict:
    """Batch 1, the captured step against the whole-step graph (`engines`: {kind: a fresh engine}, sized alike):
    vanilla and the plan's tree on each, warmed up first; tokens/s, step ms and compile + capture seconds."""
    t0, n, rows = time.perf_counter(), cfg["new_tokens"], []
    buf = tree_setup(tree, model) if tree is not None else None
    for kind, eng in engines.items():
        c0 = eng.compile_s
        eng.size_for(prompts, n, [buf] if buf is not None else [root_setup(model)])
        vanilla_generate(model, tok, prompts[:1], 4, engine=eng)
        if buf is not None:
            medusa_generate(model, heads, tok, prompts[:1], buf, 4, engine=eng)
        van = [vanilla_generate(model, tok, [p], n, engine=eng) for p in prompts]
        row = dict(step=kind, vanilla_tokens_per_s=goodput(van), vanilla_step_ms=1e3 * mean_step_s(van))
        if buf is not None:
            med = [medusa_generate(model, heads, tok, [p], buf, n, engine=eng) for p in prompts]
            row |= dict(medusa_tokens_per_s=goodput(med), medusa_step_ms=1e3 * mean_step_s(med),
                        decode_speedup=decode_speedup(med, van),
                        exact=all(m[0].token_ids == v[0].token_ids for m, v in zip(med, van)))
        rows.append(row | dict(compile_s=eng.compile_s - c0))
    return dict(rows=rows, nodes=buf.size - 1 if buf is not None else 0, seconds=time.perf_counter() - t0,
                shapes={kind: eng.shapes for kind, eng in engines.items()})


# ----------------------------------------------------------------------------------------------- compile cache

def cache_key(device) -> str:
    """What inductor's artifacts are valid for: the device, torch and Triton (a file name)."""
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = "none"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", f"{device_name(device)}-torch{torch.__version__}-triton{triton_version}")


def load_cache(folder: Path | None, key: str) -> dict:
    """Load inductor's artifacts saved by an earlier run (`--compile-cache`) when their key matches this machine's;
    hit or miss, said in the report. A file that does not load is a miss with a warning line, never a failure."""
    path = folder / f"{key}.bin" if folder is not None else None
    if path is None or not path.is_file():
        have = sorted(p.stem for p in folder.glob("*.bin")) if folder is not None else []
        return dict(key=key, status="miss", why=f"no artifacts for this key (have: {have or 'none'})")
    quiet = logging.getLogger("torch.compiler._cache")  # torch logs a bad file's traceback: ours is one line
    level, quiet.level = quiet.level, logging.CRITICAL
    try:
        info, why = torch.compiler.load_cache_artifacts(path.read_bytes()), "artifacts that do not load"
    except Exception as e:  # noqa: BLE001 - a cache is an optimisation: a bad one is a miss
        info, why = None, type(e).__name__
    finally:
        quiet.level = level
    if info is None:
        print(f"warning: {path} does not load ({why}): compiling cold", file=sys.stderr)
        return dict(key=key, status="miss", why=f"unreadable: {why}")
    return dict(key=key, status="hit", file=str(path), bytes=path.stat().st_size)


def save_cache(folder: Path, key: str, cache: dict) -> None:
    """Write inductor's artifacts of this process so far as folder/KEY.bin (replacing the last save)."""
    got = torch.compiler.save_cache_artifacts()
    if got is None:
        cache["saved"] = None
        return
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{key}.bin.tmp"
    tmp.write_bytes(got[0])
    os.replace(tmp, folder / f"{key}.bin")
    cache["saved"] = dict(file=str(folder / f"{key}.bin"), bytes=len(got[0]))


def main(argv=None) -> int:
    ap = _Parser(prog="bench/gpu.py", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes: the plumbing in seconds (CPU test suite)")
    ap.add_argument("--device", help="cuda (default when present) or cpu")
    ap.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "float16"),
                    help="model dtype for latency and decode (default: bf16 on CUDA, fp32 on CPU)")
    ap.add_argument("--model", help="base model (default: the demo SmolLM2-135M-Instruct)")
    ap.add_argument("--heads", help="Medusa heads (default: the demo heads)")
    ap.add_argument("--calibration", help="calibration folder for the plan's predictions (default: the committed one)")
    ap.add_argument("--tiny", action="store_true", help="a tiny random model instead of the demo (no model files)")
    ap.add_argument("--budget-s", type=finite(0.0, 86400.0, open_low=True), default=480.0,
                    help="stop starting parts after this many seconds (default 480: 8 minutes)")
    ap.add_argument("--out", help="JSON report (default bench/results/gpu-DEVICE.json)")
    ap.add_argument("--batch-sizes", help="batch sizes of the compiled grid and the decode, in order while the budget "
                    "allows (default 1,4,16; --quick 1,2)")
    ap.add_argument("--step", choices=tuple(STEPS), default="captured",
                    help="how the step runs on CUDA (and at --quick on CPU): captured (the decoder layers compiled "
                    "once, the whole step captured per shape; the default) or whole (the whole step one compiled "
                    "graph, mode reduce-overhead)")
    ap.add_argument("--compile-cache", help="folder of inductor artifacts an earlier run saved (its OUT/compile-cache): "
                    "loaded when their key (GPU, torch, Triton) matches; this run saves its own beside --out")
    ap.add_argument("--skip", default="", help=f"comma-separated parts to leave out, of: {', '.join(SECTIONS)} (a short "
                    "lease spends its minutes on what is new)")
    return run_script(ap, run, argv)


def run(args) -> int:
    t_start = time.perf_counter()
    cfg = QUICK if args.quick else FULL
    batches = parse_ints(args.batch_sizes, "--batch-sizes", "batch") if args.batch_sizes else cfg["decode_batches"]
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    if skip - set(SECTIONS):
        raise WorkbenchError(f"--skip {args.skip!r}: the parts that can be skipped are {', '.join(SECTIONS)}")
    cache_in = Path(args.compile_cache) if args.compile_cache else None
    if cache_in is not None and not cache_in.is_dir():
        raise WorkbenchError(f"--compile-cache {args.compile_cache}: not a folder (give the compile-cache folder an "
                             "earlier run wrote beside its --out)")
    bench_decode = _load_bench_decode()
    budget = Budget(args.budget_s)
    device = pick_device(args.device)
    tag = "cpu" if device.type == "cpu" else device_name(device).replace(" ", "-").lower()
    out = Path(args.out) if args.out else HERE / "results" / f"gpu-{tag}.json"
    key = cache_key(device)
    cache = load_cache(cache_in, key)  # before anything compiles
    if args.tiny:
        model = tiny_model("llama", seed=0, hidden_size=256, layers=4).to(device)
        heads, tok, calibration = random_heads(256, 128, 5, tied=True, seed=1).to(device), None, None
    else:
        model, tok, heads = load_model_and_heads(args.model, args.heads, str(device), args.dtype)
        calibration = args.calibration or default_calibration()
        Calibration(calibration)  # one line if it is not a calibration folder
    if args.tiny and args.dtype:
        model, heads = model.to(getattr(torch, args.dtype)), heads.to(getattr(torch, args.dtype))
    # The decode's engine: on CUDA the --step kind; on CPU at --quick the same kind with aot_eager (the same graphs
    # in seconds: the GPU's path in the test suite, the capture itself replaced by calls on the graph's buffers);
    # otherwise on CPU the CPU default (the decoder layers compiled).
    quick_cpu = args.quick and device.type == "cpu"

    def make_engine(m, kind: str = args.step) -> StepEngine:
        if device.type == "cuda" or quick_cpu:
            return StepEngine(m, compile=STEPS[kind], backend="aot_eager" if quick_cpu else None)
        return StepEngine(m)
    env = dict(device_name=device_name(device), device=str(device), dtype=dtype_name(model.dtype),
               torch=torch.__version__, transformers=transformers.__version__, machine=platform.machine(),
               compile_mode=compile_mode(device), cuda_graphs=device.type == "cuda", step=args.step,
               weight_bytes=weight_bytes(model), copy_bandwidth=copy_bandwidth(device, 64 if args.quick else 1024),
               load_average=load_average())
    report = dict(env=env, quick=args.quick, skipped={}, budget_s=args.budget_s, cache=cache)
    engine = make_engine(model)
    env["engine"] = engine.compiled_as

    def save() -> None:  # after every part: a run cut short leaves what it measured
        report["total_s"] = time.perf_counter() - t_start
        report["shapes"] = engine.shapes
        save_cache(out.parent / "compile-cache", key, cache)
        atomic_write_json(out, report)
        atomic_write_text(out.with_suffix(".md"), markdown(report))

    def fits(name: str, need: float) -> bool:
        if name in skip:
            report["skipped"][name] = f"--skip {name}"
        elif budget.left() < need:
            report["skipped"][name] = f"out of budget ({budget.left():.0f} s left, ~{need:.0f} s needed)"
        else:
            return True
        return False
    prompts = decode_prompts(tok, cfg)
    bound = tree_setup(latency_tree(max(cfg["sizes"]) - 1, timed_depth(heads)), model)  # the largest tree
    engine.size_for([[0] * max(cfg["contexts"])], 0, [bound])
    engine.size_for(prompts, cfg["new_tokens"], [bound])  # one capacity for the grid and the decode
    res = report["latency"] = {}
    if engine.compiled_as and fits("eager", 0):  # the eager grid beside the compiled one
        section_latency(model, heads, cfg, out.parent, tag, "eager", StepEngine(model, compile=False),
                        cfg["batches"], res, budget)
        save()
    # 1. batch by batch: the grid of the engine's own graphs at that batch and its decode (the plan reads the
    # surface so far), the report written after each, so a run cut short keeps every batch it finished
    dec, done_s, skipped = {}, [], []
    for b in batches:
        need = 1.3 * max(done_s) if done_s else 5 if args.quick else 120
        if budget.left() < need:
            skipped.append(b)
            report["skipped"]["batches"] = f"{skipped}: out of budget"
            continue
        t0 = time.perf_counter()
        section_latency(model, heads, cfg, out.parent, tag, "compiled" if engine.compiled_as else "eager", engine,
                        (b,), res, steps=(tok, prompts))
        report["decode"] = section_decode(model, tok, heads, cfg, prompts, res, calibration, bench_decode, engine,
                                          [b], dec)
        done_s.append(time.perf_counter() - t0)
        save()
        print(f"batch {b}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    # 2. fp32 exactness on engines of the decode's kind (compiled and captured as it runs)
    if fits("exact", 5 if args.quick else 60):
        t0 = time.perf_counter()
        report["exact"] = section_exact(device, cfg, None if args.tiny else (model, tok, heads), make_engine)
        report["exact"]["seconds"] = time.perf_counter() - t0
        print(f"exact: {report['exact']}", file=sys.stderr)
        save()
    # 3. static vs per-step trees at 2-3 budgets
    if fits("dynamic", 5 if args.quick else 60):
        report["dynamic"] = section_dynamic(model, tok, heads, cfg, prompts, calibration, make_engine(model))
        save()
    # 4. the captured step against the whole-step graph at batch 1 (the other kind compiles from scratch: last)
    if fits("ab", 5 if args.quick else 120):
        plans = (report.get("decode") or {}).get("plan") or {}
        tree = next((t for t, b, _ in plan_trees(plans) if b == 1 and t.name.split("_")[2] == "choice"), None) \
            if plans else None
        report["ab"] = section_ab(model, tok, heads, cfg, prompts[:cfg["demo_prompts"]], tree,
                                  {k: make_engine(model, k) for k in STEPS})
        save()
    report["compile_times"] = torch._dynamo.utils.compile_times(repr="str", aggregate=True)
    print(report["compile_times"], file=sys.stderr)
    save()
    print(markdown(report))
    print(f"wrote {out}", file=sys.stderr)
    skips = sum(x["cudagraph_skips"] for x in engine.shapes)
    if skips:  # "the step is one CUDA graph" does not hold: say so (and exit 1)
        print(f"warning: inductor skipped {skips} CUDA graph(s) (report: shapes[].cudagraph_skips; "
              "TORCH_LOGS=perf_hints says why)", file=sys.stderr)
    ex = report.get("exact", dict(fp32_exact=True, mismatches=0))
    decode_mismatches = sum(r.get("plan", {}).get("mismatches", 0) for r in report.get("decode", {}).get("batches", []))
    fp32_decode = model.dtype != torch.float32 or all(r.get("plan", {}).get("exact", True)
                                                      for r in report.get("decode", {}).get("batches", []))
    return 0 if ex["fp32_exact"] and ex["mismatches"] == 0 and decode_mismatches == 0 and fp32_decode and not skips \
        else 1


if __name__ == "__main__":
    sys.exit(main())
