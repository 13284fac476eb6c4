"""How the engine compiles a step. `--compile`: the whole step, one graph per (batch, tree size) (CUDA's
default: CUDA graphs). The CPU default, `Layers`: every decoder layer compiled by inductor, one graph shared by all
layers (the layer index stays a symbolic int: the stacked cache indexes its keys by it), so the step keeps the
engine's eager loop but loses most of the Python and small operations of an eager HF layer, for seconds of
compiling per step shape where the whole step takes minutes on CPU (docs/measurements.md). Layers run compiled
only inside the engine's steps and timed forwards (the prefill, whose length changes with every prompt, stays
eager); a layer that does not compile as one graph leaves the engine eager, with one warning line.
`WORKBENCH_CPU_LAYERS=1`/`0` forces it on or off; by default it is on for CPU models of MIN_BYTES and more (for
smaller ones compiling costs more than it saves), except in a `short` run.
`latency` times the engine of the run its table prices (`--run-steps`), by default a short run's: eager. Why not a
long run's always: its cold compiling made the README's small latency 1.76x its plain twin on a fresh cache, and a
table that says "layers" is compared with nothing the short decode and sweep that check it measure (the setting's
`compiled` differs). Why not one compile with the row dimension dynamic: one cold layer graph costs about what a
static shape's does (seconds to tens of seconds, more than the 10 % a first run may lose), and RowLinear picks its
kernel per row count, which a dynamic graph would have to give up (docs/results/first-run-idle-xeon-avx512.md)."""
from __future__ import annotations

import os
from contextlib import contextmanager

import torch

from workbench import WorkbenchError
from workbench.runtime.gemv import MIN_BYTES


def compile_mode(device: torch.device) -> str:
    """CUDA: CUDA graphs (eager transformers is launch-bound there). CPU: inductor's default."""
    return "reduce-overhead" if device.type == "cuda" else "default"


def compile_options(device: torch.device, backend: str | None = None) -> dict:
    """torch.compile keywords for the step. CUDA: CUDA graphs. CPU: inductor's defaults, its weights left as they
    are: the step's few-row linears run the kernels gemv.py chose (freezing would pack copies for inductor's own
    GEMMs, which the step does not call). `backend` other than inductor (tests: "aot_eager", which traces the same
    graph in seconds) takes no inductor options."""
    if backend not in (None, "inductor"):
        return dict(backend=backend)
    if device.type == "cuda":
        return dict(mode=compile_mode(device))
    return {}


def default_compile(device: torch.device) -> bool:
    """The one default for compiling the whole step: on CUDA (launch-bound without CUDA graphs); off on CPU, where
    the idle bench/compile_cpu.py table has inductor clearly faster only for plain steps at batch 1-2, for minutes
    per shape the first time (docs/measurements.md); the CPU default compiles the layers instead (`default_on`)."""
    return device.type == "cuda"


LIMIT = 64  # graphs dynamo keeps per code: a step per (B, N, rule), or 2 per layer shape (layer 0 is specialised)


def forced() -> bool | None:
    """WORKBENCH_CPU_LAYERS as True/False, or None (the default rule)."""
    value = os.environ.get("WORKBENCH_CPU_LAYERS", "").strip()
    if value not in ("", "0", "1"):
        raise WorkbenchError(f"WORKBENCH_CPU_LAYERS={value}: use 1 (compile the decoder layers), 0 (eager), or unset it")
    return None if value == "" else value == "1"


def blocks(model) -> list | None:
    """The decoder's repeated layers, when the engine can compile them alone: one device, one stacked cache."""
    layers = getattr(model.get_decoder(), "layers", None)
    if not layers or getattr(model, "hf_device_map", None) and len(set(model.hf_device_map.values())) > 1:
        return None
    return list(layers)


PAYBACK_STEPS = 1000  # a run of fewer steps per step shape never earns its layers' compiling back (2-21 s a shape
# on a 2-core CPU, paid back after 37-819 steps: bench/results/compile-cpu-layers-*.json), least of all on a fresh cache


def short(steps: int | None) -> bool:
    """A run that says it takes fewer than PAYBACK_STEPS steps per shape (`steps`: decode, sweep, latency): it would
    finish before a first run's costs are paid back (the layers' compiling, the few-row kernels' timing, gemv.py);
    None: a run of unknown length (long)."""
    return steps is not None and steps < PAYBACK_STEPS


def default_on(model, steps: int | None = None) -> bool:
    """Whether an engine left to its default (no --compile / --no-compile) compiles `model`'s layers: not for a
    `short` run (`steps` per shape), which stays eager."""
    want = forced()
    if want is None:
        want = sum(p.numel() * p.element_size() for p in model.parameters()) >= MIN_BYTES and not short(steps)
    return bool(want) and model.device.type == "cpu" and blocks(model) is not None


class Layers:
    """The compiled call of each decoder layer, put in place only while `on()` is entered (engines that share the
    model may run it eagerly or as one compiled step in between). `backend`: inductor unless given (tests)."""

    def __init__(self, model, backend=None):
        self.blocks = blocks(model)
        self.calls = [torch.compile(b._call_impl, fullgraph=True, **({"backend": backend} if backend else {}))
                      for b in self.blocks]

    @contextmanager
    def on(self):
        kept = [b._compiled_call_impl for b in self.blocks]
        with torch._dynamo.config.patch(allow_unspec_int_on_nn_module=True):  # layer_idx: one graph for all layers
            for b, call in zip(self.blocks, self.calls):
                b._compiled_call_impl = call
            try:
                yield
            finally:
                for b, call in zip(self.blocks, kept):
                    b._compiled_call_impl = call
