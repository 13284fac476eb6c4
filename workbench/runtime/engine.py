"""The model side of a decoding step for B sequences: StepEngine owns the static KV cache (kvcache.py) and the
step's device state (lengths, the last hidden state, the next roots), and runs a step function (decode/step.py:
propose, verify, accept, compact, pack) compiled once per (batch, tree size, rule) in an untimed warm-up (by
default only its decoder layers, compiled.py: on CUDA the step is then captured per shape, captured.py), its
shapes fixed by the cache capacity `size_for` sets for a run. Also the bare verify forward (timing.py times it
for the latency surface and decoder_overhead).

Re-exported for callers: the model calls (forward.py), tree buffers (treemask.py) and cache helpers (kvcache.py).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch
from transformers.cache_utils import Cache

from workbench import WorkbenchError, warn
from workbench.core.notes import FieldError
from workbench.runtime import compiled, gemv
from workbench.runtime.captured import Captures
from workbench.runtime.compiled import compile_options, default_compile
from workbench.runtime.forward import cache_kwarg, clock, forward, lm_logits
from workbench.runtime.generation import text_config
from workbench.runtime.kvcache import allocate, check_cacheable
from workbench.runtime.treemask import TreeBuffers, prefill_mask, step_mask


# ----------------------------------------------------------------------------------------------- the verify block

def verify_block(model, cache, tokens, lengths, write, columns, visible, depths, plain: bool) -> torch.Tensor:
    """tokens [B, N] of each sequence's tree, lengths [B] L_b, write [B] (set here), columns [C] 0..C-1, visible
    [N, N], depths [N] (or each sequence's own tree: [B, N, N], [B, N]) -> hidden [B, N, H]. A tree block goes to
    [P, P + N) with P = max_b L_b for every sequence; `plain` (N = 1) writes each token at its own L_b, in place: no
    compaction follows. The mask and position ids are built here, in the graph, from shapes of (B, N, C) only."""
    write.copy_(lengths if plain else lengths.amax().expand_as(write))                     # [B]
    mask = step_mask(lengths, write, columns, visible, model.dtype)                       # [B, 1, N, C]
    position_ids = lengths[:, None] + (depths if depths.dim() == 2 else depths[None])      # [B, N]
    return forward(model, tokens, mask, position_ids, cache)                               # [B, N, H]


def _verify(model, cache, tokens, lengths, write, columns, visible, depths):
    """The bare model work of a step (timing): the forward at the block past every prefix and its lm_head logits;
    the lengths stay put."""
    hidden = verify_block(model, cache, tokens, lengths, write, columns, visible, depths, False)
    return hidden, lm_logits(model, hidden)                                                # [B, N, H], [B, N, V]


# ----------------------------------------------------------------------------------------------- the engine

@dataclass
class StepState:
    """The step's device state for B sequences, allocated with the cache and at fixed addresses (CUDA graphs write
    them in place): what one step leaves for the next, so nothing crosses to the host but the packed read."""

    lengths: torch.Tensor   # [B] L_b: cached prefix of each sequence
    alive: torch.Tensor     # [B] 1 while a sequence emits
    write: torch.Tensor     # [B] the column each sequence's block is written at (set by every forward)
    hidden: torch.Tensor    # [B, H] hidden state of each sequence's last accepted token (the heads read it)
    root: torch.Tensor      # [B] the next step's root token
    seed: torch.Tensor      # [] sampling seed of the generation
    counter: torch.Tensor   # [] steps drawn so far (counter-based random numbers: no generator state)


class StepEngine:
    """One model's decoding step for B sequences on a preallocated KV cache, shared by Medusa and vanilla decoding.

    Layout (per-sequence lengths with a mask, not left padding): sequence b's prefix is cache rows [0, L_b) of
    its own batch row; a tree step writes all B trees at one common block [P, P + N), P = max_b L_b, with position
    ids L_b + depth, and a 4-D mask [B, 1, N, C] that shows each node its own prefix and its ancestors; the step
    then moves each sequence's accepted rows to [L_b, L_b + m_b) (one copy over all layers). A plain step (N = 1)
    writes each token at its own L_b and moves nothing. Why not left padding: with ragged acceptance the prefixes
    drift apart every step anyway, and left padding would need a growing pad column per step or a shift of whole
    caches; a length per sequence and a mask cost nothing, and position ids stay each sequence's own.

    Rejected rows stay in memory, masked, until overwritten: nothing is concatenated or cropped, every shape is
    fixed per (B, N), so `compile=True` compiles each (B, N) (and rule) once, in `warm`; a recompilation inside a
    step is an error (torch.compiler.set_stance("fail_on_recompile")), and so is a compilation that fails (one
    `error:` line, never a silent eager run). `compile="layers"` compiles the decoder layers alone, "captured" the
    layers with the whole step captured per shape (captured.py), and None is the default: "captured" on CUDA (the
    whole step, `default_compile`, where the layers cannot be compiled alone), the layers on CPU
    (`compiled.default_on`: not for a run that says, by `steps` per step shape, that it ends before the compiling
    pays back; such a run's few-row linears take the plain call too, gemv.py). True: the whole step compiled (on
    CUDA as CUDA graphs), False: eager.
    """

    def __init__(self, model, compile: bool | str | None = None, backend: str | None = None, capacity: int = 0,
                 steps: int | None = None):
        self.model = model
        check_cacheable(model)
        cache_kwarg(model)
        gemv.adopt(model)  # few-row linears on CPU: the kernel measured fastest here, chosen in untimed warm-ups
        gemv.mark_short(model, compiled.short(steps))  # a short run: the plain call (nothing timed or kept)
        self.cache: Cache | None = None
        self.state: StepState | None = None
        self.batch = 0
        self.capacity = int(capacity)               # C: cache positions, fixed for the run once set (size_for)
        self.compile_s = 0.0                        # seconds spent compiling / capturing steps (untimed warm-ups)
        self.resized = 0                            # capacity grown after compiling: each one compiles the step again
        self._warm: set = set()                     # step keys run once untimed (compiled: on the current cache)
        self.graphs: set = set()                    # (B, N, C, ...) the compiled step has been warmed up for
        self.start = 0                              # P: the next tree block's column (host)
        self.host_lengths: list[int] = []           # [B] L_b (host), moved from the one read per step
        self.host_alive: list[bool] = []            # [B] False once a sequence finished
        self._host = [0]                            # P on the host, for PointerLayer.get_seq_length
        if compile is None and model.device.type == "cuda" and compiled.blocks(model):
            compile = "captured"
        apart = compile in ("layers", "captured")
        self.compile = default_compile(model.device) if compile is None else not apart and bool(compile)
        layers = compiled.default_on(model, steps) if compile is None else apart and compiled.blocks(model)
        self.backend = backend
        self._compiled: dict[Callable, Callable] = {}
        if self.compile and model.device.type == "cpu" and backend in (None, "inductor") \
                and not torch.backends.mkldnn.is_available():
            raise FieldError("compile", "no_onednn", "{field}: this torch build has no oneDNN/MKL, which inductor "
                             "needs on CPU: run without {field}")
        self.layers = compiled.Layers(model, backend) if layers and not self.compile else None
        if compile == "captured" and self.layers is None:
            raise FieldError("compile", "layers_apart", f"{type(model).__name__}: its decoder layers cannot be "
                             "compiled alone (spread over devices, or no `layers`): the step cannot be captured; run "
                             "with {field}")
        self.captures = Captures(model.device, self.layers) if compile == "captured" else None
        self.shapes: list[dict] = []                # per step key warmed: seconds compiling and capturing, graphs
        if self.compile or self.layers:
            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, compiled.LIMIT)

    @property
    def compiled_as(self) -> bool | str:
        """What a measurement's setting records: True (the whole step), "captured", "layers" or False (eager)."""
        return True if self.compile else "captured" if self.captures else "layers" if self.layers else False

    @property
    def lengths(self) -> torch.Tensor:
        return self.state.lengths

    @property
    def alive(self) -> torch.Tensor:
        return self.state.alive

    def _fn(self, fn: Callable) -> Callable:
        """`fn` as the engine runs it: compiled once per engine (one graph, no break inside), or itself."""
        if not self.compile:
            return fn
        if fn not in self._compiled:
            self._compiled[fn] = torch.compile(fn, dynamic=False, fullgraph=True,
                                               **compile_options(self.model.device, self.backend))
        return self._compiled[fn]

    @staticmethod
    def room(max_new_tokens: int, trees) -> int:
        """Cache positions a sequence needs past its prompt: `max_new_tokens` + the largest tree's block (nodes +
        depth + 1: a step may accept past its budget). The one rule of KV capacity (size_for, decode's prefill)."""
        return max_new_tokens + max(b.size + b.depth for b in trees) + 1

    def size_for(self, prompts, max_new_tokens: int, trees) -> int:
        """Fix the cache capacity for a whole run before its first step: its longest prompt + `max_new_tokens` + the
        largest tree's block (nodes + depth + 1: a step may accept past its budget). The compiled step's shapes are
        then (B, N) only, so each (batch, tree size) compiles once; a later generation that needs more grows the
        cache and, compiled, says so on stderr and compiles again (untimed, counted in `compile_s`)."""
        width = max(int(p.shape[-1]) if isinstance(p, torch.Tensor) else len(p) for p in prompts)
        need = width + self.room(max_new_tokens, trees)
        if need > self.capacity and self.cache is not None:
            self.cache = None  # the next prefill allocates the grown cache (and warms its step shapes again)
        self.capacity = max(self.capacity, need)
        return self.capacity

    @torch.inference_mode()
    def reserve(self, batch: int, capacity: int) -> None:
        """A cache and step state for `batch` sequences of the run's capacity (`size_for`), or of `capacity`
        positions if more. Attention runs over every cached position, masked or not: the capacity is part of the
        compiled shapes."""
        if batch < 1:
            raise FieldError("batch_sizes", "below_one", f"{{field}} {batch}: must be >= 1")
        if self.cache is not None and batch == self.batch and capacity <= self.capacity:
            return
        if capacity > self.capacity and self.graphs:
            self.resized += 1
            warn(f"a generation needs {capacity} KV cache positions but the engine was sized for {self.capacity}: "
                 "the compiled step compiles again for the new size (untimed; size the engine for the run's longest "
                 "prompt first: StepEngine.size_for)")
        capacity = max(capacity, self.capacity)
        self.cache = self.state = None  # free the old ones before allocating
        dev, width = self.model.device, text_config(self.model).hidden_size
        zeros = dict(dtype=torch.long, device=dev)
        self.state = StepState(lengths=torch.zeros(batch, **zeros), alive=torch.zeros(batch, **zeros),
                               write=torch.zeros(batch, **zeros),
                               hidden=torch.zeros(batch, width, dtype=self.model.dtype, device=dev),
                               root=torch.zeros(batch, **zeros), seed=torch.zeros((), **zeros),
                               counter=torch.zeros((), **zeros))
        for t in vars(self.state).values():
            torch._dynamo.mark_static_address(t)
        self.cache = allocate(self.model, batch, capacity, self.state.write, self._host)
        self.batch, self.capacity = batch, capacity
        if self.compile or self.layers:  # new cache tensors: CUDA graphs record again (dynamo reuses equal shapes)
            self._warm = set()
        if self.captures is not None:
            self.captures.clear()
        self._columns = torch.arange(capacity, device=dev)                                   # [C]

    def _point(self, at: int) -> None:
        """The host's copy of the next tree block's column (the device computes its own from the lengths)."""
        self.start = self._host[0] = at

    @torch.inference_mode()
    def prefill(self, prompts, extra: int) -> torch.Tensor:
        """prompts: LongTensor [B, T] or a list of B 1-D prompts (any lengths) -> hidden [B, H] of each prompt's last
        position (also the state's `hidden`). Prompts sit at [0, T_b) of their rows (right-padded, the pad
        masked); room is kept for `extra` more rows. All sequences start alive."""
        if isinstance(prompts, torch.Tensor) and prompts.ndim == 2:
            prompts = list(prompts)
        lens = [int(p.shape[-1]) for p in prompts]
        batch, width = len(prompts), max(lens)
        self.reserve(batch, width + extra)
        dev, st = self.model.device, self.state
        ids = torch.zeros(batch, width, dtype=torch.long, device=dev)
        for b, p in enumerate(prompts):
            ids[b, : lens[b]] = p.to(dev)
        st.lengths.copy_(torch.tensor(lens))                                                  # [B]
        st.write.zero_()
        st.alive.fill_(1)
        mask = prefill_mask(st.lengths, width, self._columns, self.model.dtype)              # [B, 1, T, C]
        rows = torch.arange(width, device=dev)                                                # [T]
        self._point(0)
        out = forward(self.model, ids, mask, rows[None].expand(batch, -1), self.cache)         # [B, T, H]
        self.host_lengths, self.host_alive = lens, [True] * batch
        self._point(width)
        st.hidden.copy_(out[torch.arange(batch, device=dev), st.lengths - 1])
        return st.hidden.clone()                                                              # [B, H]

    def _room(self, buf: TreeBuffers) -> None:
        if self.start + buf.size > self.capacity:
            raise WorkbenchError(f"the KV cache holds {self.capacity} positions, the step needs "
                                 f"{self.start + buf.size}: reserve more")

    def _call(self, fn: Callable, key: tuple, args: tuple):
        """fn(*args) as the engine runs it; a key not yet warmed is warmed (untimed) first, and, compiled, a
        recompilation inside the call is an error."""
        if key not in self._warm:
            self.warm(fn, key, args)
        if self.captures is not None and key not in self.captures.graphs:
            raise WorkbenchError(f"the captured step has no graph for batch {self.batch}, tree size {key[1]}: a step "
                                 "shape marked warm without its capture (a bug)")
        if not self.compile and self.layers is None:
            return fn(*args)
        try:
            # every shape was warmed: the layers' guards (~0.3 ms a layer on CPU) run only where graphs differ
            with torch.compiler.set_stance("fail_on_recompile", skip_guard_eval_unsafe=self.layers is not None), \
                    self._layers():
                return self.captures.run(key, args) if self.captures is not None else self._fn(fn)(*args)
        except RuntimeError as e:
            if "fail_on_recompile" not in str(e) and "skip_guard_eval_unsafe" not in str(e):
                raise
            raise WorkbenchError(f"the compiled step needed a recompilation inside a timed step at batch {self.batch}, "
                                 f"tree size {key[1]} (TORCH_LOGS=recompiles says why): a bug, or a step shape that "
                                 "was not warmed up") from None

    def _layers(self):
        """The compiled decoder layers in place (the CPU default), or nothing."""
        return self.layers.on() if self.layers is not None else contextlib.nullcontext()

    def _step_call(self, buf: TreeBuffers, key: tuple, args: tuple) -> tuple[tuple, tuple]:
        return (self.batch, buf.size) + key, (self.model, self.cache, self.state, self._columns, buf.tensors()) + args

    @torch.inference_mode()
    def step(self, fn: Callable, buf: TreeBuffers, key: tuple, args: tuple):
        """One decoding step: fn(model, cache, state, columns, tree tensors, *args) (decode/step.py: the whole
        step, its only output the packed tensor the host reads), compiled once per (B, N) + `key` (the step's
        static settings: rule, proposer, recording)."""
        self._room(buf)
        return self._call(fn, *self._step_call(buf, key, args))

    def prepare(self, fn: Callable, buf: TreeBuffers, key: tuple, args: tuple) -> float:
        """`warm` the step `step` would run with these arguments (untimed); seconds spent, 0 when eager or warm."""
        return self.warm(fn, *self._step_call(buf, key, args))

    @torch.inference_mode()
    def verify(self, tokens: torch.Tensor, buf: TreeBuffers) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens [B, N] -> (hidden [B, N, H], logits [B, N, V] in the model's dtype): the bare forward of every
        sequence's tree at the block [P, P + N) (the lengths stay put), for timing the model work alone."""
        self._room(buf)
        st = self.state
        return self._call(_verify, (self.batch, buf.size, "verify"),
                          (self.model, self.cache, tokens, st.lengths, st.write, self._columns, buf.visible,
                           buf.depths))

    @torch.inference_mode()
    def warm(self, fn: Callable, key: tuple, args: tuple) -> float:
        """Run `fn` once for this key before any step of it is timed: compiled, the first call compiles (CUDA graphs
        record on a later one; captured, the step is then captured and checked: captured.py); eager (and on CPU
        before compiling), it chooses the few-row linears' kernels for the step's row counts (gemv.py). The step's
        small state is put back afterwards and its cache writes land past every prefix, which the next step
        overwrites: nothing the decoder reads changes. A compilation that fails is one error line. Returns the
        seconds spent compiling and capturing (added to `compile_s`, per key in `shapes`; 0 when eager or warm)."""
        if key in self._warm:
            return 0.0
        dev, st = self.model.device, self.state
        saved = {k: v.clone() for k, v in vars(st).items()}

        def restore() -> None:
            for k, v in saved.items():
                getattr(st, k).copy_(v)
        counts = _counts()
        t0 = clock(dev)
        # (callable, with the compiled layers in place)
        runs = [(self._fn(fn), True)] * (3 if self.compile and dev.type == "cuda" else 1)
        if (self.compile or self.layers) and dev.type == "cpu":  # the few-row kernels are chosen in an eager run
            runs.insert(0, (fn, False))
        capture_s = 0.0
        try:
            for run, layers in runs:
                with self._layers() if layers else contextlib.nullcontext():
                    run(*args)
            compile_s = clock(dev) - t0
            if self.captures is not None:
                owned = {id(t) for t in vars(st).values()} | {id(self._columns)}
                capture_s = self.captures.capture(fn, key, args, owned, restore,
                                                  lambda: (st.lengths.clone(), st.root.clone()))
        except WorkbenchError:
            raise
        except Exception as e:  # noqa: BLE001 - inductor/dynamo raise many kinds: the user gets one line
            if not self.compile and self.layers is None:
                raise
            why = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
            if not self.compile and self.captures is None:  # the CPU default's layers: eager from here on
                self.layers = None
                warn(f"cannot compile the decoder layers ({why}): decoding eagerly")
                return 0.0
            raise FieldError("compile", "failed", f"{{field}}: cannot compile the decoding step on {dev.type} "
                             f"({why}): run with {{also}}", also="no_compile") from None
        finally:
            restore()
        seconds = clock(dev) - t0
        self._warm.add(key)
        if not self.compile and self.layers is None:
            return 0.0
        if self.compile or self.captures is not None:
            self.graphs.add(key + (self.capacity,))
        after = _counts()
        self.shapes.append(dict(batch=key[0], size=key[1], key=[str(k) for k in key[2:]], capacity=self.capacity,
                                compile_s=compile_s, capture_s=capture_s, graphs=after[0] - counts[0],
                                cudagraph_skips=after[1] - counts[1]))
        self.compile_s += seconds
        return seconds

    @torch.inference_mode()
    def begin(self, root: torch.Tensor, seed: int) -> None:
        """The first step's roots [B] and the generation's sampling seed (its counter from 0)."""
        self.state.root.copy_(root)
        self.state.seed.fill_(seed)
        self.state.counter.zero_()

    @torch.inference_mode()
    def advance(self, counts: list[int]) -> None:
        """The host side of a step, from its one read: lengths, and the next block after the longest prefix."""
        self.host_lengths = [n + c * a for n, c, a in zip(self.host_lengths, counts, self.host_alive)]
        self._point(max(self.host_lengths))

    @torch.inference_mode()
    def finish(self, b: int, length: int) -> None:
        """Sequence b emits nothing more: its prefix is cut to `length` (a step may accept past its budget) and
        frozen; its slot keeps computing until the batch ends."""
        self.host_alive[b] = False
        self.host_lengths[b] = length
        self.state.alive[b] = 0
        self.state.lengths[b] = length
        self._point(max(self.host_lengths))


def _counts() -> tuple[int, int]:
    """(graphs dynamo compiled, CUDA graphs inductor skipped) so far in this process."""
    from torch._dynamo.utils import counters
    return counters["stats"]["unique_graphs"], counters["inductor"]["cudagraph_skips"]
