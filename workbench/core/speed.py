"""Speed: the one owner of every predicted and measured speed quantity, each computed in exactly one function.

Torch-free (plain numbers and duck-typed decode results), so the planner, the app and the CLI's tree commands never
load torch. tests/test_speed.py pins that no other module in the tree computes these.

Predicted (a latency table {verify tokens: seconds} at one batch size and context; `nodes` tree nodes verify
n = nodes + 1 tokens, the root included; `at_depth` first swaps the heads the timed trees ran for the depth of the
tree priced, where the table measured the heads' cost):
  relative_latency   t(nodes + 1) / t(1): what one step of the tree costs relative to a plain step;
  speedup            the decoding phase's goodput ratio: tokens_per_step / relative_latency (B sequences cancel:
                     both methods run B; at B > 1 pass the batch's tokens/step, calibration.batch_walk);
  speedup_range      the speedup with t(n) moved over its interquartile range (t(1) at its median);
  shrinking_cost     t(a, n) / t(B, n) for a < B sequences left: the tail of a batch on an engine that drops
                     finished sequences (vLLM), linear in a between measured batch sizes (calibration.batch_walk).
  prediction_error   predicted / measured - 1; miss_parts splits a speedup's miss into acceptance and round cost.
Ranking trees by it is plan/weigh.py's alone.
Measured (`batches`: the results of each generate call, a list per call; sequences of one call ran side by side,
calls one after another; a result has token_ids, steps (each with tokens and time_s), decode_s, total_s):
  tokens_per_step (each sequence's), batch_tokens_per_step (whole batches'), acceptance_per_position, step_times /
  mean_step_s, goodput, measured_speedup (prefill included), decode_speedup (the decoding phase: what `speedup`
  predicts), prefill_share, overhead, decoder_overhead, spread (the median and quartiles of repeated
  measurements of one quantity), and served_tokens_per_step with served_tokens_interval (an engine's counts; the
  bootstrap interval of a sample of prompts').
"""
from __future__ import annotations

import math
import statistics
from bisect import bisect_left
from typing import Mapping

import numpy as np

from workbench import WorkbenchError


# ----------------------------------------------------------------------------------------------- latency tables

def _points(latency) -> tuple[list[int], list[float]]:
    items = latency.items() if isinstance(latency, Mapping) else latency
    try:
        pts = sorted((int(n), float(t)) for n, t in items)
    except (TypeError, ValueError):
        raise WorkbenchError("latency must map a number of verify tokens to seconds, e.g. {1: 0.021, 64: 0.024}") \
            from None
    if not pts:
        raise WorkbenchError("latency table is empty")
    sizes, secs = [n for n, _ in pts], [t for _, t in pts]
    if len(set(sizes)) != len(sizes):
        raise WorkbenchError("latency table lists a number of verify tokens twice")
    if sizes[0] < 1 or not all(math.isfinite(t) and t > 0 for t in secs):
        raise WorkbenchError("latency table needs token counts >= 1 and positive, finite seconds")
    return sizes, secs


def latency_at(latency, n: int) -> float:
    """Seconds for a step over n verify tokens: the measured point at n, else the next measured size up. That is an
    upper bound (tables are read non-decreasing), where a line between two points would assume the surface smooth,
    and it is not: on a GPU the step jumps at the first extra token and is nearly flat after it, so a 9-token step
    read between t(1) and t(16) was priced 1.09x a plain one and cost 1.27x (docs/gpu.md). No extrapolation."""
    sizes, secs = _points(latency)
    if not sizes[0] <= n <= sizes[-1]:
        raise WorkbenchError(f"no latency for {n} verify tokens: measured range is {sizes[0]}..{sizes[-1]} "
                             "(measure that size too)")
    return secs[bisect_left(sizes, n)]


def max_tokens(latency) -> int:
    """The largest verify token count a latency table covers (a tree of up to that minus one nodes)."""
    return _points(latency)[0][-1]


def at_depth(latency, head_cost: dict | None, depth: int | None) -> dict[int, float]:
    """The table for a tree `depth` heads deep: each Medusa row t(n) (n >= 2) with the heads its timed tree ran
    swapped for `depth` heads, t(n) - h(d_n) + h(depth); vanilla's t(1) as it is. `head_cost` (latency_file.read_head_cost):
    {"depth": {tokens: d_n, the depth of the tree timed}, "seconds": {depth: the heads' proposal seconds}}, measured
    beside the table. Why: each head is one vocabulary-sized projection per sequence, so at a large batch a chain
    (depth = nodes) costs visibly more than a bushy tree of as many tokens, and a table timed on one shape would
    misprice the other. A depth between or beyond the measured ones is read linearly (clamped at the ends); the
    table as it is when `head_cost` or `depth` is None (a table without the heads' cost)."""
    table = dict(zip(*_points(latency)))
    if head_cost is None or depth is None:
        return table
    known = sorted(head_cost["seconds"].items())
    if not known:
        return table

    ds, ts = zip(*known)

    def h(d: float) -> float:
        return float(np.interp(d, ds, ts))  # linear, clamped at the ends

    out = {}
    for n, t in table.items():
        d_n = head_cost["depth"].get(n)
        out[n] = t if n < 2 or d_n is None else max(t - h(d_n) + h(depth), t * 1e-3)
    return out


# ----------------------------------------------------------------------------------------------- predicted

def relative_latency(latency, nodes: int, base=None) -> float:
    """t(nodes + 1) / t(1): the step cost of a `nodes`-node tree relative to a plain step (t(1) from `base`, a
    table of the same batch and context, when given: the range keeps t(1) at its median)."""
    return latency_at(latency, nodes + 1) / latency_at(latency if base is None else base, 1)


def speedup(tokens_per_step: float, relative: float) -> float:
    """Predicted speedup of the decoding phase = goodput B * tokens_per_step / t(B, n) over vanilla's B / t(B, 1) =
    tokens_per_step / relative_latency: the one formula behind every predicted speedup (decode_speedup measures it).
    At batch B the tokens/step is the batch's (its slowest sequence sets its steps), not each sequence's mean."""
    return tokens_per_step / relative


def speedup_at(latency, tokens_per_step: float, nodes: int) -> float:
    """speedup() of a tree of `nodes` nodes on a {tokens: seconds} table."""
    return speedup(tokens_per_step, relative_latency(latency, nodes))


def speedup_range(latency, spread, tokens_per_step: float, nodes: int) -> tuple[float, float] | None:
    """The speedup when t(nodes + 1) moves over its interquartile range and t(1) stays at its median (every
    candidate's shared denominator): (low, high). For no speculation (nodes = 0) that brackets 1. None without a
    spread ({tokens: (q1, q3)}; an older CSV has none)."""
    if spread is None:
        return None
    q1 = {n: v[0] for n, v in spread.items()}
    q3 = {n: v[1] for n, v in spread.items()}
    return (speedup(tokens_per_step, relative_latency(q3, nodes, latency)),
            speedup(tokens_per_step, relative_latency(q1, nodes, latency)))


def priced(latency, spread, head_cost: dict | None, tokens_per_step: float, nodes: int,
           depth: int | None = None) -> tuple[float, tuple[float, float] | None, float]:
    """(speedup, range, relative_latency) of a `nodes`-node tree `depth` heads deep (None: priced as the table timed
    it) on one batch size's table, its spread and its heads' cost (at_depth): the one pricing behind plan's ranking
    and every tree the app scores."""
    table = at_depth(latency, head_cost, depth)
    if spread is not None:
        q1 = at_depth({n: v[0] for n, v in spread.items()}, head_cost, depth)
        q3 = at_depth({n: v[1] for n, v in spread.items()}, head_cost, depth)
        spread = {n: (q1[n], q3[n]) for n in spread}
    relative = relative_latency(table, nodes)
    return speedup(tokens_per_step, relative), speedup_range(table, spread, tokens_per_step, nodes), relative


def shrinking_cost(seconds: Mapping[int, Mapping[int, float]], batch: int):
    """cost(active, tokens) = t(active, tokens) / t(batch, tokens) on a surface {batch size: {tokens: seconds}}, t
    linear in the batch size between the measured ones (the smallest measured one below them): what a round costs
    once only `active` of `batch` sequences are left. Tokens a batch size did not time cost a full round there."""
    sizes = sorted(b for b in seconds if b <= batch)

    def t(a: int, n: int) -> float | None:
        by_batch = [(b, seconds[b][n]) for b in sizes if n in seconds[b]]  # t(., n) over batch sizes
        # linear in B, unlike latency_at in tokens: a batch's rows are alike, and the tail model was measured so
        return float(np.interp(a, *zip(*by_batch))) if by_batch else None

    def cost(active: int, n: int) -> float:
        full, part = t(batch, n), t(active, n)
        return 1.0 if full is None or part is None or active >= batch else part / full
    return cost


def prediction_error(predicted: float, measured: float) -> float:
    """How far a prediction lies from its measurement, as a share of the measurement (+0.05: predicted 5% high).
    One convention for every predicted-vs-measured column, so "within 10%" means the same everywhere."""
    try:
        return predicted / measured - 1                                   # floats, or columns of them
    except ZeroDivisionError:
        return math.nan


def miss_parts(predicted_speedup: float, measured_speedup: float, predicted_tokens: float,
               measured_tokens: float) -> tuple[float, float]:
    """A predicted speedup's miss split along speedup = tokens/step / relative round cost: (acceptance part, round-cost
    part), 1 + miss = (1 + acceptance part) * (1 + round-cost part). Acceptance: predicted / measured tokens/step - 1
    (the measured prompts accept more or less than the calibration's did: a sample's, not the pricing's, error); round
    cost: the rest, which is the relative round cost the measurement implies (its tokens/step over its speedup) over
    the priced one, less 1 (+: the round was priced cheaper than it ran, so the speedup was predicted high)."""
    acceptance = prediction_error(predicted_tokens, measured_tokens)
    return acceptance, prediction_error(1 + prediction_error(predicted_speedup, measured_speedup), 1 + acceptance)


def within_noise(a: tuple[float, float] | None, b: tuple[float, float] | None) -> bool | None:
    """Whether two ranges overlap: an order resting on a difference inside the noise. None when either is unknown."""
    if a is None or b is None:
        return None
    return a[0] <= b[1] and b[0] <= a[1]


# ----------------------------------------------------------------------------------------------- measured

def _calls(batches) -> list[list]:
    return [b if isinstance(b, list) else [b] for b in batches]


def tokens_per_step(batches) -> float:
    """Measured tokens per step per sequence: tokens emitted / steps taken, over every sequence of every call."""
    calls = _calls(batches)
    steps = sum(len(r.steps) for c in calls for r in c)
    return sum(len(r.token_ids) for c in calls for r in c) / steps if steps else float("nan")


def served_tokens_per_step(new_tokens: int, prompts: int, accepted: int) -> float:
    """Tokens per decoding step of an engine's run from its counts (vLLM's for any drafter): every token after each
    request's first (its prefill's) over the steps that emitted them, drafted or not (tokens less accepted drafts)."""
    decoded = new_tokens - prompts
    steps = decoded - accepted
    return decoded / steps if steps > 0 else math.nan


def served_tokens_interval(prompts, level: float = 0.90, resamples: int = 2000,
                           seed: int = 0) -> tuple[float, float] | None:
    """Percentile-bootstrap interval of served_tokens_per_step over a sample of prompts, from each prompt's (tokens,
    accepted): `resamples` draws of as many prompts with replacement (fixed seed: a report regenerated reads the same),
    the central `level` of their tokens/step. How far the sample's own tokens/step could move had other prompts of
    its kind been drawn (n-gram acceptance varies severalfold per prompt), so a prediction inside it is not refuted
    by that sample. Draws without a decoding step are skipped; None when no draw has one (or no prompts)."""
    counts = np.asarray(list(prompts), dtype=float).reshape(-1, 2)
    if not (np.isfinite(counts).all() and (counts[:, 0] >= 1).all() and (counts[:, 1] >= 0).all()
            and (counts[:, 1] <= counts[:, 0] - 1).all()):
        raise WorkbenchError("per-prompt counts need tokens >= 1 and 0 <= accepted < tokens (a check's per_prompt)")
    if not 0 < level < 1:
        raise WorkbenchError(f"level {level}: a share in (0, 1), e.g. 0.9")
    if not len(counts):
        return None
    draws = np.random.default_rng(seed).integers(0, len(counts), size=(resamples, len(counts)))
    sums = counts[draws].sum(axis=1)                                      # (tokens, accepted) of each draw
    rates = np.array([served_tokens_per_step(t, len(counts), a) for t, a in sums])
    rates = rates[np.isfinite(rates)]
    if not len(rates):
        return None
    low, high = np.percentile(rates, [50 * (1 - level), 50 * (1 + level)])
    return float(low), float(high)


def draft_tokens_per_step(draft_tokens: int, decode_steps: int | None) -> float | None:
    """A drafter's drafting rate: tokens drafted per decoding step, drafted or not (None: the steps are unknown);
    what a round verifies on average, where an n-gram drafter drafts at some steps only."""
    return draft_tokens / decode_steps if decode_steps else None


def acceptance_per_position(batches, depth: int) -> list[float]:
    """[p_1..p_depth]: the share of steps whose first k drafted tokens were all accepted (unconditional, vLLM's
    convention); a step emits 1 + accepted tokens (fewer where EOS or the budget cut it)."""
    counts = [len(s.tokens) - 1 for c in _calls(batches) for r in c for s in r.steps]
    return [sum(n >= k for n in counts) / len(counts) if counts else float("nan") for k in range(1, depth + 1)]


def batch_tokens_per_step(batches) -> float:
    """Measured tokens per step of whole batches: each call's longest answer over its steps (its slowest sequence's),
    summed over calls: what a batch's goodput divides by (calibration.batch_walk predicts it; tokens_per_step is
    each sequence's own)."""
    calls = _calls(batches)
    steps = sum(max(len(r.steps) for r in c) for c in calls)
    return sum(max(len(r.token_ids) for r in c) for c in calls) / steps if steps else float("nan")


def step_times(batches) -> list[float]:
    """The wall time of every step each call took (a step of a batch is the whole batch's: its longest sequence's
    steps), in order."""
    return [s.time_s for c in _calls(batches) for s in max(c, key=lambda r: len(r.steps)).steps]


def mean_step_s(batches) -> float:
    """Seconds per decoding step: each call's decode time (its slowest sequence's) over its steps (its longest)."""
    calls = _calls(batches)
    steps = sum(max(len(r.steps) for r in c) for c in calls)
    return sum(max(r.decode_s for r in c) for c in calls) / steps if steps else float("nan")


def goodput(batches) -> float:
    """Tokens per second over all sequences: tokens emitted / wall time, each call's wall time being its slowest
    sequence's (prefill + its steps)."""
    calls = _calls(batches)
    wall = sum(max(r.total_s for r in c) for c in calls)
    return sum(len(r.token_ids) for c in calls for r in c) / wall if wall > 0 else float("nan")


def measured_speedup(medusa, vanilla) -> float:
    """Measured speedup: Medusa's goodput over vanilla greedy's on the same prompts (and batch size), prefill
    included (what a user's whole request sees)."""
    base = goodput(vanilla)
    return goodput(medusa) / base if base > 0 else float("nan")


def median_decode_speedup(medusa, vanilla) -> float:
    """`decode_speedup` with the decoder-step surface's statistic: Medusa's tokens per step times vanilla's median
    step over Medusa's median step (a plan priced on medians is compared with medians, not with total times)."""
    step = statistics.median(step_times(medusa))
    return tokens_per_step(medusa) * statistics.median(step_times(vanilla)) / step if step > 0 else float("nan")


def decode_speedup(medusa, vanilla) -> float:
    """Measured speedup of the decoding phase alone: vanilla's decode time over Medusa's on the same prompts (each
    call's slowest sequence's; both emit the same tokens). What `speedup` predicts: the prefill is the same work for
    both methods and its share depends on the prompt and answer lengths, not on the tree."""
    def decode_time(batches):
        return sum(max(r.decode_s for r in c) for c in _calls(batches))
    med = decode_time(medusa)
    return decode_time(vanilla) / med if med > 0 else float("nan")


def prefill_share(batches) -> float:
    """The share of the wall time spent in prefill (each call's slowest sequence's): how far the prefill pulls an
    end-to-end speedup (measured_speedup) towards 1 away from the decoding phase's (decode_speedup)."""
    calls = _calls(batches)
    wall = sum(max(r.total_s for r in c) for c in calls)
    return sum(max(r.prefill_s for r in c) for c in calls) / wall if wall > 0 else float("nan")


def overhead(medusa, vanilla) -> float:
    """The overhead of a Medusa step: its mean step time over vanilla's (mean_step_s) on the same prompts."""
    base = mean_step_s(vanilla)
    return mean_step_s(medusa) / base if base > 0 else float("nan")


def decoder_overhead(step_times: list[float], forward_times: list[float]) -> float:
    """What a step costs beyond its model work: median step time over the median bare verify forward of the same
    tree at the same batch and contexts (`timing.forward_probe`)."""
    return statistics.median(step_times) / statistics.median(forward_times)


def spread(values) -> dict:
    """Median and quartiles of repeated measurements of one quantity (e.g. a speedup per repeat): {median, q1, q3,
    min, max, repeats}; q1 = q3 = median for one repeat."""
    v = sorted(float(x) for x in values)
    if not v:
        raise WorkbenchError("no measurements to summarise")
    if len(v) == 1:
        q1 = med = q3 = v[0]
    else:
        q1, med, q3 = statistics.quantiles(v, n=4, method="inclusive")
    return dict(median=med, q1=q1, q3=q3, min=v[0], max=v[-1], repeats=len(v))
