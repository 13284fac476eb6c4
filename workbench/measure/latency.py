"""Measuring the latency surface t(B, n) on this machine (torch): the decoder's own step, or its bare verify forward.

Two modes, one CSV format (latency_file.py owns it; every row carries the setting it was measured in, provenance.py):
  decoder-step  (default) the wall time of a whole decoding step as `decode` runs it: heads, tree tokens, the
                verify forward, acceptance, cache bookkeeping and the host read, on real prompts decoded for
                `max_new_tokens`, so the context grows as in decoding. tokens = 1 is vanilla's step, tokens = n a
                Medusa step with an (n - 1)-node tree. Every step is followed at once by a bare 1-token forward,
                the reference: a step's cost relative to vanilla is the ratio of step / reference between the two,
                so the machine's speed, which drifts within seconds on a shared VM, cancels step by step
                (measure_decoder_steps). `forward_seconds` keeps the bare verify forward of the same tree timed
                after every step (timing.forward_probe), so the decoder's overhead over the model work is shown
                beside it (seconds / forward_seconds).
  verify        the bare verify forward at fixed contexts (random tokens): the model work alone, cheaper to measure
                at many contexts and sizes; what the decoder adds on top is not in it.
Resumable: a point (a batch size in decoder-step, a batch size x context in verify: the unit its sizes are timed
round-robin in) is kept in the run's work.WorkState beside the CSV as soon as it is measured; a killed run rerun the
same measures only the points it had not finished and keeps the others' rows exactly. Each point's rows carry the
setting (and load) it was measured in. The engine timed is the one the priced run uses (`latency --run-steps`:
eager by default, a long run's compiled layers when asked; compiled.py says why).
"""
from __future__ import annotations

import math
import statistics

import pandas as pd
import torch
from tqdm.auto import tqdm

from workbench import __version__
from workbench.core.notes import FieldError
from workbench.measure.request import DECODER_BATCHES, DECODER_SIZES
from workbench.core.work import WorkState
from workbench.core.data import prompts_fingerprint
from workbench.core.provenance import dtype_name, setting, setting_cell, without_load
from workbench.core.speed import relative_latency
from workbench.decode.loop import medusa_generate, vanilla_generate
from workbench.measure.latency_file import (DEFAULT_BATCHES, DEFAULT_CONTEXTS, DEFAULT_SIZES, HEADS_COLUMNS,
                                            LATENCY_COLUMNS, LATENCY_VERSION, spread_row, stamp)
from workbench.runtime import gemv
from workbench.runtime.engine import StepEngine
from workbench.runtime.timing import forward_probe, heads_times, verify_times
from workbench.runtime.treemask import root_setup, tree_setup
from workbench.runtime.generation import context_length
from workbench.runtime.heads import heads_fingerprint
from workbench.trees.dynamic import DynamicPolicy
from workbench.trees.optimize import optimal_tree_from
from workbench.trees.tree import MEDUSA_TOPK, Tree


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def measured_setting(model, engine, mode: str, processes: int = 1) -> dict:
    """provenance.setting of a measurement with this model and engine in this process; on CPU with how its few-row
    linears chose their kernels (gemv.setting_of: measured, fixed by WORKBENCH_CPU_LINEAR, or a short run's plain
    call)."""
    dev = model.device
    s = setting(dev.type, str(model.dtype), torch.get_num_threads(), getattr(engine, "compiled_as", False),
                gpu=device_name(dev) if dev.type == "cuda" else None, processes=processes, mode=mode)
    return s | {"cpu_linear": gemv.setting_of(model)} if dev.type == "cpu" else s


TIMED_DEPTH = 5  # the timed trees' depth, or the heads' count when fewer (timed_depth)


def timed_depth(heads) -> int:
    """How deep the latency grid's trees go with these heads (None: a bare verify forward, no heads)."""
    return TIMED_DEPTH if heads is None else min(TIMED_DEPTH, heads.num_heads)


def latency_tree(nodes: int, depth: int = TIMED_DEPTH, topk: int = MEDUSA_TOPK) -> Tree:
    """An n-node tree shaped like optimal trees (wide near the root, narrowing with depth): node value
    prod_d 0.7 * 0.45^rank, best-first. For dense-mask kernels only the token count of the verify matters; the
    shape makes the 4-D mask and position ids the decoder's own, so a kernel that exploits structure is timed as
    used. Its depth (deep for few nodes: 3 nodes are a chain) sets how many heads the step runs, recorded per row
    with their cost (heads_cost) so trees of other depths are priced with their own heads."""
    tree = optimal_tree_from(lambda p: math.prod(0.7 * 0.45 ** r for r in p), nodes, depth, topk,
                             name=f"latency_{nodes}")
    if tree.nodes < nodes:
        raise FieldError("sizes", "past_tree", f"a tree of depth {depth} with top-{topk} per head has at most "
                         f"{tree.nodes} nodes, not {nodes}: use smaller {{field}} (or heads with more heads)")
    return tree


def heads_cost(model, heads, batch: int, bufs: dict) -> dict[int, dict]:
    """{tokens: {"depth", "heads_seconds"}} of the rows of one batch size whose trees (TreeBuffers or Trees: only
    their depth is read; none for the 1-token row) are bufs[tokens]: the depth each timed step ran heads to (0 for
    vanilla's single token) and those heads' proposal cost at this batch (timing.heads_times), so a tree of another
    depth is priced right (speed.at_depth). Nothing without heads (a bare verify forward: no heads ran, the table
    has no such columns)."""
    if heads is None:
        return {n: {} for n in bufs}
    times = heads_times(model, heads, batch, range(1, heads.num_heads + 1)) | {0: 0.0}
    return {n: dict(depth=buf.depth if n != 1 else 0, heads_seconds=times[buf.depth if n != 1 else 0])
            for n, buf in bufs.items()}


def work_state(work, model, heads, engine, mode: str, **settings) -> WorkState:
    """The WorkState of a measurement written to `work` (its CSV): its points depend on the model, the heads, the
    flags (`settings`) and the setting they are timed in (less the load, which each point records)."""
    where = without_load(measured_setting(model, engine, mode))
    return WorkState(work, dict(command="latency", mode=mode, setting=where, **settings,
                                heads=heads_fingerprint(heads) if heads is not None else None))


def _relative(df: pd.DataFrame) -> pd.DataFrame:
    """The table as written: its `version`, its steps' policy (static where not dynamic), and the `relative`
    column, t(B, n) / t(B, 1) as measured (speed.relative_latency of each batch, context and policy)."""
    df["version"] = LATENCY_VERSION
    df["policy"] = df["policy"].astype(object).where(df["policy"].notna(), "static")
    plain = {k: g.loc[g["tokens"] == 1, "seconds"] for k, g in df.groupby(["batch", "context"])}
    tables = {k: dict(zip(g["tokens"].astype(int), g["seconds"])) | {1: float(plain[k[:2]].iloc[0])}
              for k, g in df.groupby(["batch", "context", "policy"])}
    df["relative"] = [relative_latency(tables[(b, c, p)], int(n) - 1)
                      for b, c, p, n in zip(df["batch"], df["context"], df["policy"], df["tokens"])]
    return stamp(df, "workbench", __version__)


def _checked(sizes, batches, repeats: int, warmup: int) -> tuple[list[int], list[int]]:
    sizes = sorted({1, *(int(s) for s in sizes)})
    batches = sorted({int(b) for b in batches})
    if repeats < 1 or warmup < 0:
        raise FieldError("repeats", "range", f"{{field}} {repeats} / {{also}} {warmup}: need repeats >= 1 and warmup "
                         ">= 0", also="warmup")
    if sizes[0] < 1:
        raise FieldError("sizes", "not_positive", "{field} must be positive integers")
    if not batches or batches[0] < 1:
        raise FieldError("batch_sizes", "not_positive", "{field} must be positive integers (sequences per step)")
    return sizes, batches


@torch.inference_mode()
def measure_latency(model, sizes=DEFAULT_SIZES, contexts=DEFAULT_CONTEXTS, repeats: int = 10, warmup: int = 3,
                    heads=None, label: str = "", progress: bool = True, engine=None,
                    batches=DEFAULT_BATCHES, work=None) -> pd.DataFrame:
    """The verify mode: wall time of one step's model work per (batch, context, tokens) (`timing.verify_times`:
    static cache, 4-D tree mask repeated per sequence, compiled when the engine is): tokens = 1 is the vanilla
    step, tokens = n > 1 a verify forward of an (n-1)-node tree for each of the B sequences; both include the
    lm_head over their rows (and, with `heads`, the heads' top-k a Medusa step needs). The caches are prefilled
    once per (batch, context) with random tokens and a verify leaves the lengths where they were, so the context
    stays fixed. Sizes are timed round-robin, `repeats` rounds, so a load change hits every size alike.
    `work`: the CSV path, whose WorkState keeps each finished (batch, context) point (None: nothing kept)."""
    sizes, batches = _checked(sizes, batches, repeats, warmup)
    contexts = sorted({int(c) for c in contexts})
    if not contexts or contexts[0] < 1:
        raise FieldError("context", "not_positive", "{field} must be positive integers")
    limit = context_length(model)
    if limit is not None and contexts[-1] + sizes[-1] > limit:
        raise FieldError("context", "past_positions", f"context {contexts[-1]} + {sizes[-1]} tokens exceeds the "
                         f"model's {limit} positions: use smaller {{field}}/{{also}}", also="sizes")
    dev = model.device
    vocab = model.get_input_embeddings().weight.shape[0]
    depth = timed_depth(heads)
    bufs = {n: tree_setup(latency_tree(n - 1, depth), model) if n > 1 else root_setup(model) for n in sizes}
    engine = engine or StepEngine(model)
    if engine.compiled_as:  # one capacity for every context, the decode's rule (size_for: one for the run): each
        engine.size_for([[0] * contexts[-1]], 0, [bufs[sizes[-1]]])  # (batch, size) compiles once; eager: per context
    state = work_state(work, model, heads, engine, "verify", model_label=label, sizes=sizes, contexts=contexts,
                       batches=batches, repeats=repeats, warmup=warmup, heads_cost=heads is not None)
    dev_name, dtype = device_name(dev), dtype_name(model.dtype)
    rows = []
    bar = tqdm(total=len(batches) * len(contexts) * (warmup + repeats), desc="latency", unit="round",
               disable=not progress, dynamic_ncols=True)

    def point(b: int, ctx: int) -> list[dict]:
        g = torch.Generator().manual_seed(b * (1 << 25) + ctx)  # the point's own tokens, whatever ran before it
        cell = setting_cell(measured_setting(model, engine, "verify"))
        engine.prefill(torch.randint(vocab, (b, ctx), generator=g).to(dev), sizes[-1])
        times: dict[int, list[float]] = {n: [] for n in sizes}
        for i in range(warmup + repeats):
            for n in sizes:
                t = verify_times(engine, bufs[n], heads, repeats=1, warmup=0, generator=g)
                if i >= warmup:
                    times[n] += t
            bar.update(1)
        cost = heads_cost(model, heads, b, bufs)
        return [dict(model=label, device=dev_name, dtype=dtype, batch=b, context=ctx, tokens=n,
                     **spread_row(times[n]), setting=cell, **cost[n]) for n in sizes]
    for b in batches:
        for ctx in contexts:
            name = f"verify-b{b}-c{ctx}"
            if state.get(name) is not None:  # measured by a run that was killed later
                bar.update(warmup + repeats)
            rows += state.piece(name, lambda: point(b, ctx))
    bar.close()
    bare = [c for c in LATENCY_COLUMNS if heads is not None or c not in HEADS_COLUMNS]  # no heads ran: no columns
    return _relative(pd.DataFrame(rows, columns=bare))


@torch.inference_mode()
def measure_decoder_steps(model, heads, tokenizer, prompts: list[list[int]], sizes=DECODER_SIZES,
                          batches=DECODER_BATCHES, repeats: int = 4, warmup: int = 1, max_new_tokens: int = 64,
                          label: str = "", progress: bool = True, engine=None, work=None,
                          envelope: Tree | None = None) -> pd.DataFrame:
    """The decoder-step mode: per (batch B, tokens n) the wall time of the decoder's step (decode/loop.Step.time_s, the
    step `medusa_generate` / `vanilla_generate` run), from `repeats` rounds of generate calls of B prompts each
    (prompts taken in turn, cycling; one round: vanilla, 2, 3, ..., vanilla on the same prompts). Right after every
    step a bare 1-token forward at that step's batch and context is timed: the reference. t(B, 1) is the median
    vanilla step; t(B, n) is t(B, 1) times the median over rounds of [median over the size-n call's steps of step /
    reference] / [the same for the round's vanilla calls], its spread those ratios' times t(B, 1). Why: on a
    shared VM the machine's speed moves by 10-20 % within seconds, so whole calls timed one after another differ
    by that much (measured: a 3-token step's ratio over the vanilla calls beside it ranged 1.48-1.75 over 10
    rounds, step / reference 1.55-1.59); a step and its reference, 0.1 s apart, see the same speed.
    The context is each step's own (prompt + tokens so far): the CSV's `context` is their mean over the whole
    measurement, one value per file (what the planner reads it at). `forward_seconds` is the median bare verify
    of the same tree timed after every step (timing.forward_probe; not for trees on a whole-step compiled engine,
    where each would be one more compiled graph). `work`: the CSV path, whose WorkState keeps
    each finished batch size (its rows and its steps' contexts; None: nothing kept). With an `envelope` tree each
    round also times, after the static sizes, the per-step tree of n - 1 nodes chosen from it (DynamicPolicy) at
    every size it holds: rows of policy "dynamic", priced the same way; their selection runs inside the timed
    step, so its cost is measured, not assumed."""
    sizes, batches = _checked(sizes, batches, repeats, warmup)
    if not prompts:
        raise FieldError("prompts", "none", "no prompts to decode: give a prompt set ({field})")
    if max_new_tokens < 2:
        raise FieldError("max_new_tokens", "below_two", f"{{field}} {max_new_tokens}: need >= 2 (a step after the first "
                         "token)")
    depth = timed_depth(heads)
    bufs = {n: tree_setup(latency_tree(n - 1, depth), model) if n > 1 else root_setup(model) for n in sizes}
    if envelope is not None and envelope.depth > heads.num_heads:
        raise FieldError("envelope", "past_heads", f"{{field}} {envelope.name}: {envelope.depth} deep, but there "
                         f"are {heads.num_heads} heads")
    dynamic = {} if envelope is None else {n: DynamicPolicy(n - 1, envelope) for n in sizes[1:]
                                           if n - 1 <= envelope.nodes}
    engine = engine or StepEngine(model)
    engine.size_for(prompts, max_new_tokens, list(bufs.values()))  # one capacity: each (batch, size) compiles once
    state = work_state(work, model, heads, engine, "decoder-step", model_label=label, sizes=sizes, batches=batches,
                       repeats=repeats, warmup=warmup, max_new_tokens=max_new_tokens, rounds="step-reference",
                       heads_cost=True, envelope=None if envelope is None else envelope.as_lists(),
                       prompts=prompts_fingerprint(prompts))
    dev_name, dtype = device_name(model.device), dtype_name(model.dtype)
    calls = len(sizes) + len(dynamic) + 1  # a round: vanilla, each size, each per-step size, vanilla
    bar = tqdm(total=len(batches) * (warmup + repeats) * calls, desc="decoder steps", unit="call",
               disable=not progress, dynamic_ncols=True)

    def call(n, chunk: list, keep: bool, forwards: dict, contexts: list) -> tuple[float, float] | None:
        """One generate call of size n (("dynamic", n): the per-step tree of n - 1 nodes) on `chunk`: (median step
        seconds, median of step / reference); None: no step."""
        tree = dynamic[n[1]] if isinstance(n, tuple) else None
        n = n[1] if isinstance(n, tuple) else n
        reference, refs = forward_probe(engine, bufs[1])
        probe, fwd = forward_probe(engine, bufs[n], heads) if n > 1 else (None, refs)
        if n > 1 and engine.compile:  # forward_seconds, a side figure, is not worth a whole compiled graph
            probe, fwd = None, []
        times: list[float] = []

        def on_step(step) -> None:
            s = next(x for x in step if x is not None) if isinstance(step, list) else step
            times.append(s.time_s)
            reference(step)  # first: nothing runs between the step and its reference
            if probe is not None:
                probe(step)
        if n == 1:
            out = vanilla_generate(model, tokenizer, chunk, max_new_tokens, eos_token_id=[], engine=engine,
                                   on_step=on_step)
        else:
            out = medusa_generate(model, heads, tokenizer, chunk, tree or bufs[n], max_new_tokens, eos_token_id=[],
                                  engine=engine, on_step=on_step)
        out = out if isinstance(out, list) else [out]
        bar.update(1)
        if not times:
            return None
        if keep and tree is None:
            forwards[n] += fwd
            contexts += [s.cache_len for r in out for s in r.steps]
        return statistics.median(times), statistics.median(t / r for t, r in zip(times, refs))

    def point(b: int, turn: int) -> dict:
        """Batch size b: its rows (all but the context) and the sum and count of its timed steps' cache lengths."""
        cell = setting_cell(measured_setting(model, engine, "decoder-step"))
        vanilla: list[float] = []                     # per round: the median of its vanilla calls' median steps
        ratios = {n: [] for n in [*sizes[1:], *(("dynamic", n) for n in dynamic)]}  # per round: step / reference
        # of size n (("dynamic", n): the per-step tree) over vanilla's
        forwards = {n: [] for n in sizes}             # every bare forward after a step
        contexts: list[int] = []
        for i in range(warmup + repeats):
            chunk = [prompts[(turn + j) % len(prompts)] for j in range(b)]
            turn += b
            keep = i >= warmup
            first = call(1, chunk, keep, forwards, contexts)
            sized = {n: call(n, chunk, keep, forwards, contexts) for n in ratios}  # in order, as timed
            plain = [c for c in (first, call(1, chunk, keep, forwards, contexts)) if c is not None]
            if not keep or not plain:
                continue
            vanilla.append(statistics.median(t for t, _ in plain))
            base = statistics.fmean(r for _, r in plain)  # vanilla's step / reference this round
            for n, got in sized.items():
                if got is not None:
                    ratios[n].append(got[1] / base)
        if not vanilla:
            raise FieldError("max_new_tokens", "no_step", "no decoding step was timed: raise {field}")
        t1 = spread_row(vanilla)["seconds"]
        cost = heads_cost(model, heads, b, bufs | ({"envelope": envelope} if dynamic else {}))
        rows = [dict(model=label, device=dev_name, dtype=dtype, batch=b, tokens=1, **spread_row(vanilla),
                     forward_seconds=float(pd.Series(forwards[1]).median()) if forwards[1] else None, setting=cell,
                     **cost[1])]
        rows += [dict(model=label, device=dev_name, dtype=dtype, batch=b, tokens=n,
                      **{k: (v * t1 if k.startswith("seconds") else v) for k, v in spread_row(ratios[n]).items()},
                      forward_seconds=float(pd.Series(forwards[n]).median()) if forwards[n] else None, setting=cell,
                      **cost[n])
                 for n in sizes[1:]]
        rows += [dict(model=label, device=dev_name, dtype=dtype, batch=b, tokens=n, policy="dynamic",
                      envelope=envelope.nodes, setting=cell, **cost["envelope"],
                      forward_seconds=float(pd.Series(forwards[n]).median()) if forwards[n] else None,
                      **{k: (v * t1 if k.startswith("seconds") else v)
                         for k, v in spread_row(ratios[("dynamic", n)]).items()})
                 for n in dynamic]
        return dict(rows=rows, context_sum=sum(contexts), context_steps=len(contexts))

    points = []
    for k, b in enumerate(batches):
        if state.get(f"decoder-step-b{b}") is not None:  # measured by a run that was killed later
            bar.update((warmup + repeats) * calls)
        # prompts taken in turn across the batch sizes: batch b starts where the ones before it left off
        points.append(state.piece(f"decoder-step-b{b}", lambda: point(b, (warmup + repeats) * sum(batches[:k]))))
    bar.close()
    ctx = int(round(sum(p["context_sum"] for p in points) / sum(p["context_steps"] for p in points)))
    rows = [dict(r, context=ctx) for p in points for r in p["rows"]]
    return _relative(pd.DataFrame(rows, columns=LATENCY_COLUMNS + ["forward_seconds"]))
