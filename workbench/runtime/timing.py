"""Timing the model work of a step on a StepEngine: the bare verify forward (the latency surface's verify mode, the
decoder-step mode's reference and decoder_overhead's denominator) and the heads' proposal."""
from __future__ import annotations

import statistics
from typing import Callable

import torch

from workbench.runtime.engine import StepEngine
from workbench.runtime.forward import clock, head_proposer
from workbench.runtime.treemask import TreeBuffers


@torch.inference_mode()
def verify_times(engine: StepEngine, buf: TreeBuffers, heads=None, repeats: int = 10, warmup: int = 2,
                 generator: torch.Generator | None = None) -> list[float]:
    """Seconds of each repeat of the bare verify work of one step at the engine's current batch and context: the
    forward of B x N tree tokens (the tree mask per sequence) with logits for their rows and their argmax, plus
    (with heads, for trees) the heads' top-k for every sequence. No acceptance, compaction or host read of a path:
    what a step costs at the least."""
    model = engine.model
    vocab = model.get_input_embeddings().weight.shape[0]
    tokens = torch.randint(vocab, (engine.batch, buf.size), generator=generator).to(model.device)  # [B, N]
    propose = head_proposer(heads, model, buf.depth, buf.topk) if heads is not None and buf.depth else None
    if engine.compile:  # compilation (an untimed warm-up in the first call) is never inside a timed repeat
        engine.verify(tokens, buf)
    times = []
    for i in range(warmup + repeats):
        t0 = clock(model.device)
        hidden, logits = engine.verify(tokens, buf)
        logits.argmax(dim=-1)
        if propose is not None:
            propose(hidden[:, 0], [])
        t1 = clock(model.device)
        if i >= warmup:
            times.append(t1 - t0)
    return times


@torch.inference_mode()
def heads_times(model, heads, batch: int, depths, repeats: int = 30, warmup: int = 3, topk: int = 10) -> dict:
    """{depth: median seconds} of the heads' proposal a Medusa step makes for `batch` sequences when its tree is
    `depth` deep (head_proposer: the first `depth` heads' logits and their top-k), depths timed round-robin. A
    step's cost depends on its depth as well as its token count: each head is one more pass through a
    vocabulary-sized projection per sequence, so a chain costs more than a bushy tree of as many tokens (with
    SmolLM2 at batch 8, depth 3 is ~0.15 of a plain step more than depth 2)."""
    width = model.get_input_embeddings().weight.shape[1]
    hidden = torch.randn(batch, width, dtype=model.dtype, device=model.device)                # [B, H]
    depths = sorted({int(d) for d in depths if int(d) > 0})
    props = {d: head_proposer(heads, model, d, topk) for d in depths}
    times: dict[int, list[float]] = {d: [] for d in depths}
    for i in range(warmup + repeats):
        for d in depths:
            t0 = clock(model.device)
            props[d](hidden, [])
            t1 = clock(model.device)
            if i >= warmup:
                times[d].append(t1 - t0)
    return {d: statistics.median(v) for d, v in times.items()}


def forward_probe(engine: StepEngine, buf: TreeBuffers, heads=None) -> tuple[Callable[[object], None], list]:
    """(on_step, times): an on_step callback that times the bare verify work (`verify_times`, once) right after
    every step, at that step's batch and context, and the list it fills (seconds). Step and bare forward then
    alternate, so a load change on a shared machine hits both alike: decoder_overhead = median step / median of
    these."""
    times: list[float] = []

    def on_step(step) -> None:  # a decode/loop.Step; only its timing point matters
        times.append(verify_times(engine, buf, heads, repeats=1, warmup=0)[0])
    return on_step, times
