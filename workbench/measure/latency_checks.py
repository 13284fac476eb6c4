"""Which points of a latency surface t(B, n) are off their trend: the one owner of that rule (torch-free).

A step's cost grows smoothly with the batch size B and, past the plain step, with the tokens n verified; a point
that sits off the line through its neighbours by more than the spread of the repeats (q1..q3, of it or of either
neighbour) was measured in another condition (a busy moment, a frequency change) and is no evidence of the
hardware. The plain step (n = 1) is checked along B only: it runs no tree, so the jump to n = 2 is structural, not
noise. Without quartiles nothing is flagged: the noise is unknown.
"""
from __future__ import annotations

import pandas as pd

from workbench.measure.latency_file import SPREAD_COLUMNS


def _off(points: list[tuple[int, float, float]]) -> list[dict]:
    """Interior points (x, seconds, spread) off the straight line through their neighbours by more than the
    largest spread of the three. One odd point also bends its neighbours' lines: of adjacent flags only the one
    furthest off (in spreads) is kept."""
    found = [None] * len(points)
    for i in range(1, len(points) - 1):
        (x0, t0, s0), (x, t, s), (x1, t1, s1) = points[i - 1], points[i], points[i + 1]
        expected = t0 + (x - x0) / (x1 - x0) * (t1 - t0)
        tol = max(s0, s, s1)
        off = abs(t - expected) / tol if tol > 0 else 0.0
        if off > 1:
            found[i] = dict(at=x, seconds=t, expected=expected, spread=tol, neighbours=((x0, t0), (x1, t1)), off=off)
    worst = lambda j: found[j]["off"] if 0 <= j < len(found) and found[j] else 0.0  # noqa: E731
    return [f for i, f in enumerate(found) if f and f["off"] >= max(worst(i - 1), worst(i + 1))]


def off_trend(df: pd.DataFrame, context: int) -> list[dict]:
    """The points of the surface at `context` off their neighbours by more than their spread: [{"batch", "tokens",
    "seconds", "expected", "spread", "off" (in spreads), "axis" ("batch" or "tokens"), "neighbours": ((x,
    seconds), (x, seconds))}],
    along the batch axis for every token count and along the token axis (n >= 2) for every batch size."""
    if not set(SPREAD_COLUMNS) <= set(df.columns):
        return []
    rows = df[df["context"].astype(int) == int(context)]
    if "batch" not in rows.columns:
        rows = rows.assign(batch=1)
    rows = rows.groupby(["batch", "tokens"], as_index=False)[["seconds", "seconds_q1", "seconds_q3"]].median()
    found = []
    for n, g in rows.groupby("tokens"):
        g = g.sort_values("batch")
        pts = [(int(b), float(s), float(q3 - q1)) for b, s, q1, q3 in
               zip(g["batch"], g["seconds"], g["seconds_q1"], g["seconds_q3"])]
        found += [dict(f, batch=f.pop("at"), tokens=int(n), axis="batch") for f in _off(pts)]
    for b, g in rows[rows["tokens"] >= 2].groupby("batch"):
        g = g.sort_values("tokens")
        pts = [(int(n), float(s), float(q3 - q1)) for n, s, q1, q3 in
               zip(g["tokens"], g["seconds"], g["seconds_q1"], g["seconds_q3"])]
        found += [dict(f, tokens=f.pop("at"), batch=int(b), axis="tokens") for f in _off(pts)]
    return found


def deciding(found: list[dict], batch: int, tokens: int, measured) -> list[dict]:
    """Those of `found` a speedup at `batch` for a step of `tokens` tokens rests on: the plain step, and the measured
    token counts either side of `tokens` (a price between them is read off both)."""
    sizes = sorted(int(n) for n in measured)
    below = max((n for n in sizes if n <= tokens), default=None)
    above = min((n for n in sizes if n >= tokens), default=None)
    used = {1, below, above} - {None}
    return [f for f in found if f["batch"] == batch and f["tokens"] in used]


def outlier_words(f: dict) -> str:
    """'batch 2's plain step (1 token) 0.160 s is off its neighbours (batch 1 0.094 s, batch 4 0.152 s: about
    0.113 s expected) by more than their spread (0.018 s)'."""
    step = "plain step (1 token)" if f["tokens"] == 1 else f"{f['tokens']}-token step"
    (x0, t0), (x1, t1) = f["neighbours"]
    unit = "batch" if f["axis"] == "batch" else "tokens"
    near = (f"batch {x0} {t0:.3f} s, batch {x1} {t1:.3f} s" if unit == "batch"
            else f"{x0} tokens {t0:.3f} s, {x1} tokens {t1:.3f} s")
    return (f"batch {f['batch']}'s {step} {f['seconds']:.3f} s is off its neighbours ({near}: about "
            f"{f['expected']:.3f} s expected) by more than their spread ({f['spread']:.3f} s)")
