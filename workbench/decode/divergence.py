"""Medusa against vanilla greedy on the same prompt: speed ratios, and where the outputs differ and why.

In fp32 greedy Medusa must equal vanilla greedy token for token. In bf16/fp16 the wider tree forward rounds
differently from the 1-token step, so two nearly tied tokens can swap: `divergences` tells such a near-tie
(within `rounding_bound`) from a mismatch (a bug), from the logits each run recorded while it decoded.
"""
from __future__ import annotations

import torch

from workbench import WorkbenchError
from workbench.decode.loop import DecodeResult
from workbench.core.speed import measured_speedup, overhead

def compare(medusa: DecodeResult, vanilla: DecodeResult) -> dict:
    """speedup, overhead (speed.measured_speedup / speed.overhead) and exactness against greedy, of one prompt."""
    return dict(vanilla_tokens_per_s=vanilla.tokens_per_s, speedup=measured_speedup([medusa], [vanilla]),
                overhead=overhead([medusa], [vanilla]), matches_greedy=medusa.token_ids == vanilla.token_ids)


# Rounding bound on a top-2 logit margin, in units of u * max|logit| (u = the dtype's unit roundoff, half of
# torch.finfo(dtype).eps: 2^-8 bf16, 2^-11 fp16, 2^-24 fp32), per dtype. Why that scale: a 1-token and an
# N-token (tree) forward of the same position round differently (other matmul blocking, attention kernels and
# masks); the drift in the hidden state reaches the logits through the lm_head, i.e. in proportion to the row's
# logit scale max|logit|, and each logit is finally rounded to the dtype (<= u|l| each, 2u max|l| on a margin).
# Why these constants: `bench/rounding.py` measures |margin in the tree run - margin in the 1-token run| at
# every position both runs share (CPU, mc_sim_7b_63; bench/results/rounding-*.json). In bf16/fp16, sums
# accumulate in fp32 and the one rounding of each op's output to the dtype dominates: at most 4.4 units in bf16
# (demo SmolLM2-135M, 4-8 Alpaca-eval prompts x 128), 3.1 in fp16 (demo, 3 prompts), 2.8 on tiny models: bound 16.
# In fp32 nothing masks the reduction-order differences of the fp32 sums themselves (~sqrt(n) u per length-n dot
# product, every layer), and they grow along a generation: at most 18.7 units on the demo (3 prompts x 128), 91
# on a tiny Llama (4 prompts x 512): bound 512 (still ~1e-3 of a logit at most: a real preference is no tie).
ROUNDING_UNITS = {torch.bfloat16: 16.0, torch.float16: 16.0, torch.float32: 512.0}


def unit_roundoff(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps / 2


def rounding_bound(dtype: torch.dtype, max_abs_logit: float) -> float:
    """How far rounding in `dtype` can move a top-2 logit margin between two computations of the same position."""
    return ROUNDING_UNITS.get(dtype, ROUNDING_UNITS[torch.float32]) * unit_roundoff(dtype) * max_abs_logit


def divergences(medusa: DecodeResult, vanilla: DecodeResult, dtype: torch.dtype) -> list[dict]:
    """Where Medusa's output first differs from vanilla greedy's, classified; [] when they are identical.

    Only the FIRST divergence of a prompt is reported: after it the two runs continue different texts, so later
    differences say nothing about the decoder. The logits are the ones each run really computed (`record`): at the
    divergence both runs saw the same prefix, so a teacher-forced recomputation would give both the same logits
    and could not tell a rounding flip from a bug. margin_* is each run's top-2 logit margin there; gap_* is how
    far that run ranked its own token above the other run's. "near-tie": each run emitted its own argmax, and
    gap_medusa + gap_vanilla <= `rounding_bound` -- the pair's logit difference went from +gap_vanilla to
    -gap_medusa, a move rounding alone can make (the wider tree forward computes attention and matmuls over other
    shapes than the 1-token step, and bf16/fp16 round those differently). Anything else is "mismatch": a bug (a
    token that was not its run's argmax, or a flip wider than rounding can explain; also, conservatively, a tie
    of more than step.RECORDED_TOPK tokens). One output ending early (an EOS the other did not emit at that
    point) is a divergence at its length. Returns [{position, medusa_token, vanilla_token, margin_medusa, margin_vanilla,
    gap_medusa, gap_vanilla, bound, kind}] (0 or 1 items).
    """
    a, b = medusa.token_ids, vanilla.token_ids
    if a == b:
        return []
    if not (medusa.chosen_by and vanilla.chosen_by):
        raise WorkbenchError("divergences need the logits each run chose its tokens from: decode with record=True")
    pos = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    tok_m, tok_v = (a[pos] if pos < len(a) else None), (b[pos] if pos < len(b) else None)
    cm, cv = medusa.choice(pos), vanilla.choice(pos)

    def gap(c, own, other):  # own token's logit above the other's, if own was this run's argmax and both are known
        if c is None or own not in c["ids"] or other not in c["ids"]:
            return None
        mine = c["top"][c["ids"].index(own)]
        return mine - c["top"][c["ids"].index(other)] if mine == c["top"][0] else None

    gm, gv = gap(cm, tok_m, tok_v), gap(cv, tok_v, tok_m)
    known = [c for c in (cm, cv) if c]
    bound = rounding_bound(dtype, max(c["max_abs"] for c in known)) if known else None
    tie = gm is not None and gv is not None and gm + gv <= bound
    margin = lambda c: c["top"][0] - c["top"][1] if c else None  # noqa: E731
    return [dict(position=pos, medusa_token=tok_m, vanilla_token=tok_v, margin_medusa=margin(cm),
                 margin_vanilla=margin(cv), gap_medusa=gm, gap_vanilla=gv, bound=bound,
                 kind="near-tie" if tie else "mismatch")]


def divergence_counts(found: list[dict]) -> dict:
    """{near_tie_divergences, mismatches} over the divergences of several prompts."""
    return dict(near_tie_divergences=sum(d["kind"] == "near-tie" for d in found),
                mismatches=sum(d["kind"] == "mismatch" for d in found))

