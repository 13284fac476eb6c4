"""Few-row linears on CPU through the kernel this machine runs fastest, measured on the model's own weights.

A decoding step multiplies every weight by 1..B·N rows: memory-bound products whose speed is the BLAS path the
CPU takes, not arithmetic. MKL's x @ W^T for one row is a matrix-vector product that on some CPUs streams the
weights at a third of the speed of its 2-column GEMM W @ X^T (AMD EPYC: 8.6 against 28 GB/s over the demo's
538 MB), and for 2..16 rows x @ W^T was its slowest GEMM on every CPU measured; elsewhere the plain call wins.
So the kernel of each (row count, weight shape) is timed on the model's own linears, in the order a forward reads
them (each weight streamed from memory, as there), once per model and process, the first time that row count is
seen: the engine runs each step shape once untimed before timing it, so no timed step chooses (a short prefill
may, once). The other kernel is taken only when clearly faster (MARGIN), so that timing noise cannot flip the
choice, and with it the rounding, between runs. Both compute the same products in another summation order.
`WORKBENCH_CPU_LINEAR=linear|transposed` fixes the kernel instead (tests run both)."""
from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from workbench import WorkbenchError

KERNELS = ("linear", "transposed")
MAX_ROWS = 64    # above this the products are GEMMs proper: the plain call
REPEATS = 5      # timed passes over all linears per kernel and row count
MARGIN = 1.25    # the transposed kernel only when its median beats the plain call's by this factor


def forced() -> str | None:
    """The kernel WORKBENCH_CPU_LINEAR fixes, or None (measured)."""
    kind = os.environ.get("WORKBENCH_CPU_LINEAR", "").strip()
    if kind and kind not in KERNELS:
        raise WorkbenchError(f"WORKBENCH_CPU_LINEAR={kind}: unknown kernel (use {' or '.join(KERNELS)}, or unset it "
                             "to measure)")
    return kind or None


def transposed(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [R, in] -> x @ W^T [R, out] computed as (W @ x^T)^T; one row goes in as two (the second zero) so that
    BLAS takes its GEMM path, not its matrix-vector one."""
    rows = x.shape[0]
    if rows == 1:
        x = torch.cat([x, torch.zeros_like(x)])                                            # [2, in]
    return (weight @ x.T)[:, :rows].T                                                      # [R, out]


@dataclass(eq=False)
class Kernels:
    """One model's linears and the kernel chosen for each row count seen so far."""

    linears: list = field(default_factory=list, repr=False)
    rows: dict = field(default_factory=dict)  # (rows, out_features, in_features) -> kernel


class RowLinear(nn.Linear):
    """nn.Linear whose few-row products run the kernel chosen for their row count (`kernels`, shared by every
    linear of one model). Compiled, it is the plain linear: inductor picks its own kernels."""

    kernels: Kernels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if rows > MAX_ROWS or torch.compiler.is_compiling():
            return F.linear(x, self.weight, self.bias)
        kind = self.kernels.rows.get((rows, self.out_features, self.in_features))
        if kind is None:
            kind = _choose(self.kernels, rows)[self.out_features, self.in_features]
        if kind == "linear":
            return F.linear(x, self.weight, self.bias)
        y = transposed(x.reshape(rows, self.in_features), self.weight).reshape(*x.shape[:-1], self.out_features)
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


def chosen(module: nn.Module) -> dict[tuple, str]:
    """The kernels chosen so far: {(rows, out_features, in_features): kernel}; {} off the CPU."""
    m = next((m for m in module.modules() if type(m) is RowLinear), None)
    return dict(sorted(m.kernels.rows.items())) if m else {}


@torch.inference_mode()
def _choose(table: Kernels, rows: int) -> dict[tuple, str]:
    """Time both kernels at `rows` rows on every linear of the table, passes alternating, each call timed and summed
    per weight shape; keep per shape the plain call unless the other's median is MARGIN times faster. Returns
    {(out, in): kernel} for this row count."""
    kind = forced()
    shapes = {(m.out_features, m.in_features) for m in table.linears}
    if kind is None:
        xs = {}
        for m in table.linears:
            if m.in_features not in xs:
                xs[m.in_features] = torch.randn(rows, m.in_features, dtype=m.weight.dtype)
        run = {"linear": lambda m: F.linear(xs[m.in_features], m.weight),
               "transposed": lambda m: transposed(xs[m.in_features], m.weight)}
        times = {(k, s): [] for k in KERNELS for s in shapes}
        for i in range(REPEATS + 1):
            for k in KERNELS:
                spent = dict.fromkeys(shapes, 0.0)
                for m in table.linears:
                    t0 = time.perf_counter()
                    run[k](m)
                    spent[m.out_features, m.in_features] += time.perf_counter() - t0
                if i:  # the first pass warms up
                    for s, t in spent.items():
                        times[k, s].append(t)
        pick = {s: "transposed" if statistics.median(times["linear", s]) > MARGIN * statistics.median(
            times["transposed", s]) else "linear" for s in shapes}
    else:
        pick = dict.fromkeys(shapes, kind)
    for s, k in pick.items():
        table.rows[(rows,) + s] = k
    return pick
