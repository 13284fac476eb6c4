"""The captured step (CUDA's default): the decoder layers compiled once (compiled.Layers: one graph for every layer,
inductor's default mode, automatic-dynamic sizes: seconds of compiling, not a cold graph per step shape), then the
whole step (propose, verify, accept, compact, pack) captured once per (batch, tree size, plan) as a
torch.cuda.CUDAGraph, all of an engine's graphs in one shared memory pool, and replayed in the engine's calls.

A graph reads fixed addresses, so every input that can change between calls (the tree's tensors, host proposals,
a bare forward's tokens) has the graph's own buffer, copied into before each replay: two trees of one size run
through one graph, each with its own nodes. The engine's own tensors (step state, cache, columns) are allocated
once per cache and are the graph's inputs as they are (a new cache drops every graph). Outputs are copied out after
each replay: the next graph in the pool may reuse their memory. Before a graph is trusted, one replay is checked
against one run of the same step launched op by op (the compiled layers, not replayed), token for token.

On CPU the same code runs without CUDA graphs: the "replay" is the compiled-layers step called on the graph's own
buffers, so the buffers, the copy-in and the check are tested where no GPU is (tests/test_captured.py)."""
from __future__ import annotations

import dataclasses
import time
from typing import Callable

import torch

from workbench import WorkbenchError
from workbench.core.notes import FieldError


def swap(x, owned: set, new: Callable[[torch.Tensor], torch.Tensor]):
    """`x` (nested tuples, named tuples, dataclasses) with every tensor not in `owned` (ids) replaced by new(t), in
    a fixed order; objects without such tensors are returned as they are."""
    if isinstance(x, torch.Tensor):
        return x if id(x) in owned else new(x)
    if isinstance(x, tuple):
        got = [swap(v, owned, new) for v in x]
        if all(a is b for a, b in zip(got, x)):
            return x
        return type(x)(*got) if hasattr(x, "_fields") else tuple(got)
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        got = {f.name: swap(getattr(x, f.name), owned, new) for f in dataclasses.fields(x)}
        return x if all(v is getattr(x, k) for k, v in got.items()) else dataclasses.replace(x, **got)
    return x


def _outputs(out) -> tuple:
    return out if isinstance(out, tuple) else (out,)


def same_tokens(a, b) -> bool:
    """Two runs' outputs say the same tokens: integer tensors equal, float ones the same argmax per row."""
    return all(x.shape == y.shape and (torch.equal(x, y) if not x.is_floating_point()
                                       else torch.equal(x.argmax(-1), y.argmax(-1)))
               for x, y in zip(_outputs(a), _outputs(b)))


class Graph:
    """One step shape captured: its own copy of every changing input, and (CUDA) the graph and its outputs."""

    def __init__(self, fn: Callable, args: tuple, owned: set, layers, pool, restore: Callable[[], None]):
        self.fn, self.owned, self.layers, self.buffers = fn, owned, layers, []

        def own(t: torch.Tensor) -> torch.Tensor:
            self.buffers.append(t.clone())
            return self.buffers[-1]
        self.args = swap(args, owned, own)
        self.graph = self.out = None
        if pool is not None:
            dev = self.buffers[0].device if self.buffers else torch.device("cuda")
            side = torch.cuda.Stream(dev)  # warm on a side stream first (lazy library state is set up outside)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side), layers.on():
                fn(*self.args)
            torch.cuda.current_stream(dev).wait_stream(side)
            restore()
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, pool=pool), layers.on():
                self.out = fn(*self.args)

    def load(self, args: tuple) -> None:
        """Copy this call's changing inputs into the graph's own buffers (in `swap`'s order)."""
        sources: list[torch.Tensor] = []
        swap(args, self.owned, lambda t: sources.append(t) or t)
        if len(sources) != len(self.buffers):
            raise WorkbenchError(f"a captured step got {len(sources)} changing inputs, its graph has "
                                 f"{len(self.buffers)}: a bug (the step's arguments changed shape)")
        for buf, src in zip(self.buffers, sources):
            buf.copy_(src)

    def __call__(self, args: tuple):
        self.load(args)
        if self.graph is None:
            with self.layers.on():
                out = self.fn(*self.args)
        else:
            self.graph.replay()
            out = self.out
        return tuple(t.clone() for t in out) if isinstance(out, tuple) else out.clone()


class Captures:
    """An engine's captured steps, one per step key, in one memory pool (CUDA); `shapes` says per key what the
    capture and its check cost."""

    def __init__(self, device: torch.device, layers):
        self.device, self.layers = device, layers
        self.pool = torch.cuda.graph_pool_handle() if device.type == "cuda" else None
        self.graphs: dict[tuple, Graph] = {}
        self.capture_s: dict[tuple, float] = {}

    def clear(self) -> None:
        """A new cache: every graph read the old one's addresses."""
        self.graphs = {}

    def capture(self, fn: Callable, key: tuple, args: tuple, owned: set, restore: Callable[[], None],
                probe: Callable[[], tuple]) -> float:
        """Capture `fn(*args)` for `key` and check one replay against one op-by-op run (the compiled layers), token
        for token: the packed read and `probe()` (what the step leaves for the next: lengths, roots). `restore`
        puts the step state back between runs. Seconds spent; a capture that fails is one error line."""
        t0 = time.perf_counter()
        try:
            restore()
            graph = Graph(fn, args, owned, self.layers, self.pool, restore)
            restore()
            with self.layers.on():
                want = fn(*args)
            want = (want, probe())
            restore()
            got = (graph(args), probe())
        except WorkbenchError:
            raise
        except Exception as e:  # noqa: BLE001 - capture and compile raise many kinds: the user gets one line
            why = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
            raise FieldError("compile", "no_capture", f"cannot capture the decoding step at batch {key[0]}, tree size "
                             f"{key[1]} as a {'CUDA graph' if self.pool is not None else 'graph'} ({why}): run with "
                             "{field} (the whole step compiled) or {also}", also="no_compile") from None
        finally:
            restore()
        if not (same_tokens(got[0], want[0]) and same_tokens(got[1], want[1])):
            raise FieldError("compile", "capture_differs", f"the captured step at batch {key[0]}, tree size {key[1]} "
                             "gave other tokens than the same step run op by op: a capture bug; run with {field} or "
                             "{also}", also="no_compile")
        self.graphs[key] = graph
        self.capture_s[key] = time.perf_counter() - t0
        return self.capture_s[key]

    def run(self, key: tuple, args: tuple):
        return self.graphs[key](args)
