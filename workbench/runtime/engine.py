"""The model work of a decoding step for B sequences: StepEngine owns the static KV cache (kvcache.py), moves its
pointer and lengths, runs the verify forward (compiled once per (batch, tree size): the cache capacity is fixed for a
run by `size_for`, and compilation happens in an untimed warm-up) and keeps accepted rows. The decoder (decode/loop.py)
only chooses tokens. Also the bare-step timing the latency surface and decoder_overhead use.

Re-exported for callers: the model calls (forward.py), tree buffers (treemask.py) and cache helpers (kvcache.py).
"""
from __future__ import annotations

import statistics
import sys
from typing import Callable

import torch
from torch._dynamo.utils import counters
from transformers.cache_utils import Cache

from workbench import WorkbenchError
from workbench.runtime.forward import (Proposer, cache_kwarg, check_window, clock, decode_one, forward,  # noqa: F401
                                       head_logits, head_proposer, logits_of, new_cache, prefill)
from workbench.runtime.kvcache import PointerLayer, allocate, cache_bytes, check_cacheable, free_bytes, move_rows  # noqa: F401
from workbench.runtime.treemask import (TreeBuffers, additive_mask, prefill_mask, root_setup, step_mask,  # noqa: F401
                                        tree_candidates, tree_setup)


# ----------------------------------------------------------------------------------------------- the compiled step

def _verify(model, cache, tokens, lengths, pointer, columns, visible, depths):
    """The step's model work, compiled as one graph when asked: tokens [B, N] of each sequence's tree at the block
    [P, P + N) (P = pointer []), lengths [B] L_b, columns [C] 0..C-1, visible [N, N], depths [N] -> (hidden [B, N, H],
    logits [B, N, V] fp32). The mask and position ids are built here, inside the graph: every input is a tensor
    whose shape depends on (B, N) and the fixed capacity C only. The cache writes its B x N rows in place."""
    mask = step_mask(lengths, pointer, columns, visible, model.dtype)                     # [B, 1, N, C]
    position_ids = lengths[:, None] + depths[None]                                         # [B, N]
    hidden = forward(model, tokens, mask, position_ids, cache)                             # [B, N, H]
    return hidden, logits_of(model, hidden)


def compile_mode(device: torch.device) -> str:
    """CUDA: CUDA graphs (eager transformers is launch-bound there). CPU: inductor's own small-M GEMM kernels
    (max-autotune), the only mode that beats MKL at 2..16 rows; it needs a C++ compiler and minutes per tree size."""
    return "reduce-overhead" if device.type == "cuda" else "max-autotune-no-cudagraphs"


def compile_options(device: torch.device, backend: str | None = None) -> dict:
    """torch.compile keywords for the step. On CPU the weights are frozen (constants) so that inductor packs them
    once for its GEMM micro-kernels: measured on the demo model, the 1-token step 76 -> 41 ms (CPU time, loaded
    2-core machine), after ~10 minutes of compilation per tree size. `backend` other than inductor (tests:
    "aot_eager", which traces the same graph in seconds) takes no inductor options."""
    if backend not in (None, "inductor"):
        return dict(backend=backend)
    if device.type == "cuda":
        return dict(mode=compile_mode(device))
    return dict(options=dict(freezing=True, max_autotune=True, max_autotune_gemm_backends="CPP,ATEN"))


def default_compile(device: torch.device) -> bool:
    """The one default for compiling the step: on CUDA (launch-bound without CUDA graphs), off elsewhere (CPU
    compilation takes minutes per tree size)."""
    return device.type == "cuda"


# ----------------------------------------------------------------------------------------------- the engine

class StepEngine:
    """One model's decoding step for B sequences on a preallocated KV cache, shared by Medusa and vanilla greedy.

    Layout (per-sequence pointers with a mask, not left padding): sequence b's prefix is cache rows [0, L_b) of
    its own batch row; every step writes all B trees at one common block [P, P + N), P = max_b L_b, with position
    ids L_b + depth, and a 4-D mask [B, 1, N, C] that shows each node its own prefix and its ancestors. Sequences
    behind P simply do not see the gap [L_b, P). `keep` then moves each sequence's accepted rows to
    [L_b, L_b + m_b). Why not left padding: with ragged acceptance the prefixes drift apart every step anyway, and
    left padding would need a growing pad column per step or a shift of whole caches; a length per sequence and a
    mask cost nothing, and position ids stay each sequence's own (RoPE sees no pads).

    The cache is a `PointerLayer` per layer (transformers' StaticLayer, written at one shared pointer): one pointer
    update per step for all layers. Rejected rows stay in memory, masked, until overwritten: nothing is
    concatenated or cropped, every shape is fixed per (B, N), so `compile=True` compiles each (B, N) once
    (default `default_compile`: on CUDA; where compilation fails, one warning and eager from then on).
    """

    def __init__(self, model, compile: bool | None = None, backend: str | None = None, capacity: int = 0):
        self.model = model
        check_cacheable(model)
        cache_kwarg(model)
        self.cache: Cache | None = None
        self.batch = 0
        self.capacity = int(capacity)               # C: cache positions, fixed for the run once set (size_for)
        self.compile_s = 0.0                        # seconds spent compiling / capturing the step (untimed warm-ups)
        self.resized = 0                            # capacity grown after compiling: each one compiles the step again
        self._warm: set[tuple[int, int]] = set()    # (B, N) run through the compiled step on the current cache
        self.graphs: set[tuple[int, int, int]] = set()  # (B, N, C) the compiled step has been warmed up for
        self.unplanned = 0                          # compilations that happened inside a step (a bug: warned)
        self.start = 0                              # P: where the next block is written (host)
        with torch.inference_mode():  # every tensor the compiled step sees is an inference tensor (same guards)
            self.lengths = torch.zeros(0, dtype=torch.long, device=model.device)  # [B] L_b (device)
            self.alive = torch.zeros(0, dtype=torch.long, device=model.device)    # [B] 1 while a sequence emits
            self.pointer = torch.zeros((), dtype=torch.long, device=model.device)
        self.host_lengths: list[int] = []          # [B] L_b (host), moved from the one read per step
        self.host_alive: list[bool] = []           # [B] False once a sequence finished
        self._host = [0]                            # the pointer on the host, for PointerLayer.get_seq_length
        self.compile = default_compile(model.device) if compile is None else bool(compile)
        self._step = _verify
        if self.compile:
            inductor = backend in (None, "inductor")
            if model.device.type == "cpu" and inductor and not torch.backends.mkldnn.is_available():
                self._fail("no oneDNN/MKL build")
            else:
                torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
                self._step = torch.compile(_verify, dynamic=False, **compile_options(model.device, backend))

    def _fail(self, why: str) -> None:
        print(f"warning: --compile: cannot compile the step on {self.model.device.type} ({why}); running eager",
              file=sys.stderr)
        self.compile, self._step = False, _verify

    def size_for(self, prompts, max_new_tokens: int, trees) -> int:
        """Fix the cache capacity for a whole run before its first step: its longest prompt + `max_new_tokens` + the
        largest tree's block (nodes + depth + 1: a step may accept past its budget). The compiled step's shapes are
        then (B, N) only, so each (batch, tree size) compiles once; a later generation that needs more grows the
        cache and, compiled, says so on stderr and compiles again (untimed, counted in `compile_s`)."""
        width = max(int(p.shape[-1]) if isinstance(p, torch.Tensor) else len(p) for p in prompts)
        need = width + max_new_tokens + max(b.size + b.depth for b in trees) + 1
        self.capacity = max(self.capacity, need)
        return self.capacity

    @torch.inference_mode()
    def reserve(self, batch: int, capacity: int) -> None:
        """A cache for `batch` sequences of the run's capacity (`size_for`), or of `capacity` positions if more.
        Attention runs over every cached position, masked or not: the capacity is part of the compiled shapes."""
        if batch < 1:
            raise WorkbenchError(f"--batch-sizes {batch}: must be >= 1")
        if self.cache is not None and batch == self.batch and capacity <= self.capacity:
            return
        if capacity > self.capacity and self.compile and self.graphs:
            self.resized += 1
            print(f"warning: a generation needs {capacity} KV cache positions but the engine was sized for "
                  f"{self.capacity}: the compiled step compiles again for the new size (untimed; size the engine "
                  "for the run's longest prompt first: StepEngine.size_for)", file=sys.stderr)
        capacity = max(capacity, self.capacity)
        self.cache = None  # free the old one before allocating (sliding windows: check_window, per generation)
        self.cache = allocate(self.model, batch, capacity, self.pointer, self._host)
        self.batch, self.capacity = batch, capacity
        self._warm = set()  # new cache tensors: CUDA graphs record again (dynamo reuses a graph of equal shapes)
        self._columns = torch.arange(capacity, device=self.model.device)  # [C]

    def _point(self, at: int) -> None:
        """Move the write pointer: the next rows any layer writes go to column `at` (one fill for all layers)."""
        self.start = self._host[0] = at
        self.pointer.fill_(at)

    @torch.inference_mode()
    def prefill(self, prompts, extra: int) -> torch.Tensor:
        """prompts: LongTensor [B, T] or a list of B 1-D prompts (any lengths) -> hidden [B, H] of each prompt's last
        position. Prompts sit at [0, T_b) of their rows (right-padded, the pad masked); room is kept for `extra`
        more rows. All sequences start alive."""
        if isinstance(prompts, torch.Tensor) and prompts.ndim == 2:
            prompts = list(prompts)
        lens = [int(p.shape[-1]) for p in prompts]
        batch, width = len(prompts), max(lens)
        self.reserve(batch, width + extra)
        dev = self.model.device
        ids = torch.zeros(batch, width, dtype=torch.long, device=dev)
        for b, p in enumerate(prompts):
            ids[b, : lens[b]] = p.to(dev)
        self.lengths = torch.tensor(lens, device=dev)                                         # [B]
        mask = prefill_mask(self.lengths, width, self._columns, self.model.dtype)             # [B, 1, T, C]
        rows = torch.arange(width, device=dev)                                                # [T]
        self._point(0)
        out = forward(self.model, ids, mask, rows[None].expand(batch, -1), self.cache)         # [B, T, H]
        self.host_lengths, self.host_alive = lens, [True] * batch
        self.alive = torch.ones(batch, dtype=torch.long, device=dev)
        self._point(width)
        return out[torch.arange(batch, device=dev), self.lengths - 1]                        # [B, H]

    @torch.inference_mode()
    def verify(self, tokens: torch.Tensor, buf: TreeBuffers) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens [B, N] -> (hidden [B, N, H], logits [B, N, V]): one forward of every sequence's tree at the block
        [P, P + N) (the lengths stay put). Compiled, a (B, N) not yet run is warmed up first (`warm`)."""
        if self.start + buf.size > self.capacity:
            raise WorkbenchError(f"the KV cache holds {self.capacity} positions, the step needs "
                                 f"{self.start + buf.size}: reserve more")
        if self.compile and (self.batch, buf.size) not in self._warm:
            self.warm(buf)
        if not self.compile:
            return self._run(tokens, buf)
        graphs = counters["stats"]["unique_graphs"]
        out = self._run(tokens if tokens.is_inference() else tokens.clone(), buf)
        if counters["stats"]["unique_graphs"] != graphs:  # dynamo compiled inside this step: never silently
            self.unplanned += 1
            print(f"warning: the compiled step compiled again inside a step at batch {self.batch}, tree size "
                  f"{buf.size} (TORCH_LOGS=recompiles says why): that step's time includes the compilation",
                  file=sys.stderr)
        return out

    def _run(self, tokens: torch.Tensor, buf: TreeBuffers) -> tuple[torch.Tensor, torch.Tensor]:
        args = (self.model, self.cache, tokens, self.lengths, self.pointer, self._columns, buf.visible, buf.depths)
        try:  # (the pointer is at the block already: only _point moves it, and the model's writes do not)
            return self._step(*args)
        except Exception as e:  # noqa: BLE001 - inductor/dynamo raise many kinds; eager is always right
            if not self.compile:
                raise
            self._fail(f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}")
            return self._step(*args)

    @torch.inference_mode()
    def warm(self, buf: TreeBuffers) -> float:
        """Compile (and on CUDA capture as a CUDA graph) the step for this batch and tree before any step is timed:
        the first call compiles, CUDA graphs record on a later one. It runs on the block past every prefix, which
        the next step overwrites: nothing the decoder reads changes. Returns the seconds it took (also added to
        `compile_s`); 0 when eager or already warm."""
        if not self.compile or (self.batch, buf.size) in self._warm:
            return 0.0
        dev = self.model.device
        t0 = clock(dev)
        tokens = torch.zeros(self.batch, buf.size, dtype=torch.long, device=dev)               # [B, N]
        for _ in range(3 if dev.type == "cuda" else 1):
            self._run(tokens, buf)
        seconds = clock(dev) - t0
        self._warm.add((self.batch, buf.size))
        self.graphs.add((self.batch, buf.size, self.capacity))
        self.compile_s += seconds
        return seconds

    @torch.inference_mode()
    def keep(self, buf: TreeBuffers, row: torch.Tensor, count: torch.Tensor) -> None:
        """row [B], count [B] (device): move the first count_b nodes of retrieve row row_b (root first) right after
        each alive sequence's prefix, and grow its length. Device work only (no read); `advance` follows on the host."""
        take = torch.minimum(buf.steps[None], count[:, None] - 1)                              # [B, D+1]
        src = buf.gather[row].gather(1, take) + self.start                                     # [B, D+1]
        dst = self.lengths[:, None] + take                                                     # [B, D+1]
        move_rows(self.cache, src, dst)
        self.lengths += count * self.alive

    @torch.inference_mode()
    def advance(self, counts: list[int]) -> None:
        """The host side of `keep`, from the step's one read: lengths, and the next block after the longest prefix."""
        self.host_lengths = [n + c * a for n, c, a in zip(self.host_lengths, counts, self.host_alive)]
        self._point(max(self.host_lengths))

    @torch.inference_mode()
    def finish(self, b: int, length: int) -> None:
        """Sequence b emits nothing more: its prefix is cut to `length` (a step may accept past its budget) and
        frozen; its slot keeps computing until the batch ends."""
        self.host_alive[b] = False
        self.host_lengths[b] = length
        self.alive[b] = 0
        self.lengths[b] = length

    @torch.inference_mode()
    def rewind(self, lengths: list[int]) -> None:
        """Put every sequence's length back (timing at a fixed context: rows past it are dropped)."""
        self.host_lengths = list(lengths)
        self.lengths.copy_(torch.tensor(lengths, device=self.lengths.device))
        self._point(max(lengths))


# ----------------------------------------------------------------------------------------------- timing

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
    engine.warm(buf)  # compiled: compilation is never inside a timed repeat
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


def time_verify(engine: StepEngine, buf: TreeBuffers, heads=None, repeats: int = 10, warmup: int = 2,
                generator: torch.Generator | None = None) -> float:
    """Median of `verify_times`."""
    return statistics.median(verify_times(engine, buf, heads, repeats, warmup, generator))


def forward_probe(engine: StepEngine, buf: TreeBuffers, heads=None) -> tuple[Callable[[object], None], list]:
    """(on_step, times): an on_step callback that times the bare verify work (`verify_times`, once) right after
    every step, at that step's batch and context, and the list it fills (seconds). Step and bare forward then
    alternate, so a load change on a shared machine hits both alike: decoder_overhead = median step / median of
    these."""
    times: list[float] = []

    def on_step(step) -> None:  # a decode.Step; only its timing point matters
        times.append(verify_times(engine, buf, heads, repeats=1, warmup=0)[0])
    return on_step, times
