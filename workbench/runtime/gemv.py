"""Few-row linears on CPU through the kernel this machine runs fastest, measured on the model's own weights.

A decoding step multiplies every weight by 1..B·N rows: memory-bound products whose speed is the library path
the CPU takes, not arithmetic. MKL's x @ W^T for one row is a matrix-vector product that on some CPUs streams
the weights at a third of the speed of its 2-column GEMM W @ X^T (AMD EPYC: 8.6 against 28 GB/s over the demo's
538 MB); for 8-32 rows oneDNN's GEMM is the fastest there; for 2..16 rows x @ W^T was MKL's slowest GEMM on every
CPU measured; elsewhere the plain call wins. So the kernel of each (row count, weight shape) is timed on the
model's own linears, in the order a forward reads them (each weight streamed from memory, as there), once per
machine, the first time that row count is seen: the engine runs each step shape once untimed before timing it, so
no timed step chooses (a short prefill may, once). Another kernel than the plain call is taken only when clearly
faster (MARGIN), and the choice is kept on disk, the first process's for all later ones: the kernels round
differently, and a run resumed in another process must compute what the unbroken run did. Weights that fit in
a cache (under MIN_BYTES in all) are not streamed: their kernels differ by noise, they keep the plain call.
A short run (`Kernels.plain`, set by the engine for a run that says it ends before compiled.PAYBACK_STEPS steps per
shape) takes the plain call for every row count: timing one costs about a second per new row count on a 2-core CPU
and a sweep meets dozens, which a short run never earns back. It reads no kept choice either and keeps none: the
rule depends on the run's declared length alone, which a resumed run knows too, so it computes what the unbroken
run did even where a long run kept a choice in between.
`WORKBENCH_CPU_LINEAR=<kernel>` fixes the kernel instead (tests run each), short run or not."""
from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from workbench import WorkbenchError
from workbench.core.io import cache_dir
from workbench.core.provenance import setting

MAX_ROWS = 64    # above this the products are GEMMs proper: the plain call
REPEATS = 3      # timed passes over all linears per kernel and row count (after one to warm up)
MARGIN = 1.25    # another kernel only when its median beats the plain call's by this factor
MIN_BYTES = 128 << 20  # linears smaller in all than this are read from cache, not memory: the plain call


def transposed(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [R, in] -> x @ W^T [R, out] computed as (W @ x^T)^T; one row goes in as two (the second zero) so that
    BLAS takes its GEMM path, not its matrix-vector one."""
    rows = x.shape[0]
    if rows == 1:
        x = torch.cat([x, torch.zeros_like(x)])                                            # [2, in]
    return (weight @ x.T)[:, :rows].T                                                      # [R, out]


@torch.library.custom_op("workbench::onednn_linear", mutates_args=())
def _onednn_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return onednn(x, weight)  # run outside any trace: the eager call


@_onednn_linear.register_fake
def _(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], weight.shape[0])


def onednn(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [R, in] -> x @ W^T [R, out] by oneDNN on the weight as it is stored (no packed copy: no memory added).
    Compiled, an opaque op: inductor lowers oneDNN's linear only on the packed weights of its own freezing."""
    if torch.compiler.is_compiling():
        return _onednn_linear(x, weight)
    return torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], "")            # [R, out]


@torch.compiler.assume_constant_result
def _threads() -> int:
    """The intra-op threads, a constant of a compiled graph (the kept choices are per thread count too)."""
    return torch.get_num_threads()


def split(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [R, in] -> x @ W^T [R, out] with W's output rows in one chunk per thread, as one batched product: BLAS runs
    the chunks side by side, where its few-row product of the whole weight streams it with about one thread's
    bandwidth (AMD EPYC with AVX2: 14 against 9.5 GB/s over the demo's layers at one row). Chunks are equal: as
    many as the threads and the output size have in common."""
    out, rows = weight.shape[0], x.shape[0]
    parts = math.gcd(_threads(), out)
    chunks = weight.view(parts, out // parts, weight.shape[1])                            # [T, out/T, in]
    return torch.bmm(chunks, x.T.expand(parts, -1, -1)).view(out, rows).T                 # [R, out]


KERNELS = {"linear": lambda x, w: F.linear(x, w), "transposed": transposed, "onednn": onednn, "split": split}


def forced() -> str | None:
    """The kernel WORKBENCH_CPU_LINEAR fixes, or None (measured)."""
    kind = os.environ.get("WORKBENCH_CPU_LINEAR", "").strip()
    if kind and kind not in KERNELS:
        raise WorkbenchError(f"WORKBENCH_CPU_LINEAR={kind}: unknown kernel (use {', '.join(KERNELS)}, or unset it "
                             "to measure)")
    return kind or None


def usable(kind: str, weight: torch.Tensor) -> bool:
    """Whether this torch build runs `kind` on such a weight and gets the plain call's product (oneDNN is optional
    in a build and its op internal: checked, not assumed)."""
    if kind != "onednn":
        return True
    try:
        x = torch.randn(3, weight.shape[1], dtype=weight.dtype)
        return torch.allclose(onednn(x, weight), F.linear(x, weight), rtol=1e-3, atol=1e-3)
    except (RuntimeError, AttributeError):
        return False


@dataclass(eq=False)
class Kernels:
    """One model's linears and the kernel chosen for each row count seen so far."""

    linears: list = field(default_factory=list, repr=False)
    rows: dict = field(default_factory=dict)  # (rows, out_features, in_features) -> kernel
    plain: bool = False  # a short run's: the plain call for every row count, nothing timed, read or kept (`mark_short`)


class RowLinear(nn.Linear):
    """nn.Linear whose few-row products run the kernel chosen for their row count (`kernels`, shared by every
    linear of one model), compiled too: inductor fuses the small operations around it and calls the kernel (its own
    fp32 few-row products are the plain call's). A compiled shape takes the kernels chosen while the engine ran it
    once eagerly; a row count never seen eagerly gets inductor's own."""

    kernels: Kernels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if rows > MAX_ROWS or self.kernels.plain:
            return F.linear(x, self.weight, self.bias)
        kind = self.kernels.rows.get((rows, self.out_features, self.in_features))
        if kind is None:
            if torch.compiler.is_compiling():  # nothing chosen in an eager warm-up: inductor's own kernel
                return F.linear(x, self.weight, self.bias)
            kind = _choose(self.kernels, rows)[self.out_features, self.in_features]
        if kind == "linear":
            return F.linear(x, self.weight, self.bias)
        y = KERNELS[kind](x.reshape(rows, self.in_features), self.weight).reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias


def adopt(*modules: nn.Module) -> Kernels | None:
    """Run the plain nn.Linear layers of these modules that sit on the CPU as RowLinear (the class only: the
    parameters, state dict and products are the same), sharing one kernel table; idempotent. Returns the table,
    which fills as row counts are first seen (None: no linear on the CPU)."""
    linears = [m for mod in modules for m in mod.modules()
               if type(m) in (nn.Linear, RowLinear) and m.weight.device.type == "cpu"]
    table = next((m.kernels for m in linears if type(m) is RowLinear), None) or Kernels()
    for m in linears:
        if getattr(m, "kernels", None) is not table:
            m.__class__, m.kernels = RowLinear, table
            table.linears.append(m)
    return table if linears else None


def mark_short(module: nn.Module, short: bool) -> None:
    """Mark the table of `module`'s linears as a `short` run's (the plain call for every row count, see the
    module's docstring) or a long one's; WORKBENCH_CPU_LINEAR's kernel runs either way."""
    m = next((m for m in module.modules() if type(m) is RowLinear), None)
    if m is not None:
        m.kernels.plain = short and forced() is None


def setting_of(module: nn.Module | None) -> str:
    """How a measurement's few-row linears chose their kernel: WORKBENCH_CPU_LINEAR's, "linear" (a short run's plain
    call), or "measured" (this machine's kept or timed choice)."""
    m = next((m for m in module.modules() if type(m) is RowLinear), None) if module is not None else None
    return forced() or ("linear" if m is not None and m.kernels.plain else "measured")


def chosen(module: nn.Module) -> dict[tuple, str]:
    """The kernels chosen so far: {(rows, out_features, in_features): kernel}; {} off the CPU."""
    m = next((m for m in module.modules() if type(m) is RowLinear), None)
    return dict(sorted(m.kernels.rows.items())) if m else {}


@torch.inference_mode()
def timings(linears: list, rows: int, kinds) -> dict[tuple, list[float]]:
    """{(kernel, (out, in)): seconds of each of REPEATS passes}: every linear at `rows` rows, in the order given
    (a forward's), passes of the kernels alternating, each call timed and summed per weight shape."""
    shapes = {(m.out_features, m.in_features) for m in linears}
    xs = {}
    for m in linears:
        if m.in_features not in xs:
            xs[m.in_features] = torch.randn(rows, m.in_features, dtype=m.weight.dtype)
    times = {(k, s): [] for k in kinds for s in shapes}
    for i in range(REPEATS + 1):
        for k in kinds:
            spent, run = dict.fromkeys(shapes, 0.0), KERNELS[k]
            for m in linears:
                t0 = time.perf_counter()
                run(xs[m.in_features], m.weight)
                spent[m.out_features, m.in_features] += time.perf_counter() - t0
            if i:  # the first pass warms up
                for s, t in spent.items():
                    times[k, s].append(t)
    return times


def decide(times: dict[tuple, list[float]]) -> dict[tuple, str]:
    """`timings` -> {(out, in): kernel}: per weight shape the plain call, unless the fastest other kernel's median
    is MARGIN times faster."""
    pick = {}
    for s in {s for _, s in times}:
        median = {k: statistics.median(t) for (k, s2), t in times.items() if s2 == s}
        best = min(median, key=median.get)
        pick[s] = best if median["linear"] > MARGIN * median[best] else "linear"
    return pick


def _stored(machine: dict, rows: int, shape: tuple) -> Path:
    """The file that keeps the choice for (rows, shape) on this `machine` (`_machine`)."""
    key = machine | dict(rows=rows, shape=list(shape), margin=MARGIN, kernels=sorted(KERNELS))
    return cache_dir() / "cpu-linear" / (hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
                                         + ".json")


def _machine(weight: torch.Tensor) -> dict:
    """What a kept choice depends on besides the shape: CPU, vector unit, threads, dtype, torch version."""
    where = setting("cpu", str(weight.dtype), torch.get_num_threads(), False)
    return {k: where[k] for k in ("cpu", "vector", "threads", "dtype", "torch")}


def _kept(path: Path) -> str | None:
    """The kernel kept in `path`, or None (none kept, or unreadable)."""
    try:
        kind = json.loads(path.read_text()).get("kernel")
    except (OSError, ValueError, AttributeError):
        return None
    return kind if kind in KERNELS else None


def _keep(path: Path, kind: str) -> str:
    """The kernel kept in `path`: `kind` if this process writes it first (exclusive create), else the one there."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps({"kernel": kind}))
        return kind
    except FileExistsError:
        return _kept(path) or kind
    except OSError:  # a read-only cache: this process's own choice
        return kind


def _choose(table: Kernels, rows: int) -> dict[tuple, str]:
    """The kernel of each weight shape of the table at `rows` rows, kept: WORKBENCH_CPU_LINEAR's; the plain call
    for weights under MIN_BYTES; else this machine's kept choice, or `decide` on `timings` now (then kept)."""
    shapes = {(m.out_features, m.in_features) for m in table.linears}
    weight = table.linears[0].weight
    kind = forced()
    if kind is not None and not usable(kind, weight):
        raise WorkbenchError(f"WORKBENCH_CPU_LINEAR={kind}: this torch build cannot run it on {weight.dtype} weights "
                             "(unset it to measure, or pick another kernel)")
    if kind is None and sum(m.weight.numel() * m.weight.element_size() for m in table.linears) < MIN_BYTES:
        kind = "linear"
    if kind is not None:
        pick = dict.fromkeys(shapes, kind)
    else:
        machine = _machine(weight)
        files = {s: _stored(machine, rows, s) for s in shapes}
        pick = {s: k for s, k in ((s, _kept(f)) for s, f in files.items()) if k is not None}
        if len(pick) < len(shapes):
            measured = decide(timings(table.linears, rows, [k for k in KERNELS if usable(k, weight)]))
            pick |= {s: _keep(files[s], measured[s]) for s in shapes if s not in pick}
    for s, k in pick.items():
        table.rows[(rows,) + s] = k
    return pick
