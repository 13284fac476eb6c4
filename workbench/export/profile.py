"""A calibration's per-position acceptance as a `speculation_profile.json`, the file NVIDIA ModelOpt proposes to
ship beside exported drafters so that deployment tools (Dynamo's simulator, vLLM's synthetic rejection sampler)
stop assuming one vector for every drafter.

The schema is not released: it is that of ModelOpt pull requests #2247/#2313/#2315 (open when read), field names
taken from their review threads: num_speculative_tokens, conditional_accept_rates (P(draft i+1 accepted | the
first i accepted)), marginal_accept_rates (P(the first i+1 all accepted), vLLM's synthetic_acceptance_rates),
mean_accept_length (1 + accepted tokens per draft, the bonus token counted), acceptance_length_histogram
({acceptance length: drafts}) and measurement_conditions (dataset, osl, num_samples, validation); method names
the drafter. Its version field and `accept_length_model` could not be confirmed and are not written. The counts
behind every rate and the workbench's provenance ride along under `counts` and `provenance`. The profile describes
the largest K; a served calibration that served each smaller K in a run of its own (calibrate/served.py) adds them
under `per_num_speculative_tokens` ({K: that K's rates, mean acceptance length, histogram, counts and draft tokens
per decoding step}): a K-token drafter's rates are not a longer one's first K.

From either calibration: a served one (calibrate/served.py: the engine's counters, as counted) or ours (Medusa
heads: the top-1 chain of all heads over every position of the calibration's greedy answers, the joint
statistic: a live decoder starts its drafts only after accepted runs, which are harder on average).
"""
from __future__ import annotations

import json
from pathlib import Path

from workbench.core.notes import FieldError
from workbench.calibrate.folder import Calibration
from workbench.calibrate.served import Served, ServedCounts, checked_counts, is_served

PROFILE_SCHEMA = "NVIDIA ModelOpt speculation_profile.json as proposed in PRs #2247/#2313 (unreleased)"


def chain_counts(cal: Calibration) -> ServedCounts:
    """Our calibration's top-1 chain of all K heads as draft counts: every answer position is a draft of K tokens,
    position k accepted where heads 1..k all ranked the true token first (a head past the answer's end accepts
    nothing)."""
    ranks = cal.ranks("all")
    heads = [c for c in ranks.columns if c.startswith("head_")]
    drafts = int(ranks[heads[0]].notna().sum())
    ok = ranks[heads[0]].eq(0)
    per_pos = []
    for h in heads:
        ok = ok & ranks[h].eq(0)
        per_pos.append(int(ok.sum()))
    tokens = int(ranks[heads].notna().sum().sum())
    return checked_counts(len(heads), drafts, tokens, sum(per_pos), per_pos, cal.folder,
                          field="calibration")


def speculation_profile(folder) -> dict:
    """The profile of a calibration folder, served or ours."""
    if is_served(folder):
        served = Served(folder, "calibration")
        counts, m, per_k = served.counts, served.meta, served.per_k
        method, dataset, osl, samples = m.get("method"), m.get("prompts"), m.get("max_new_tokens"), m.get(
            "num_prompts")
        validation = (f"served: {m.get('engine')} {m.get('engine_version') or ''} spec-decode counters "
                      f"({m.get('source')})")
        prov = dict(kind="served", **{k: m.get(k) for k in ("engine", "engine_version", "model", "draft_model",
                                                            "source", "decode_steps", "draft_share",
                                                            "draft_tokens_per_step")})
    else:
        cal = Calibration(folder)
        counts, m, per_k = chain_counts(cal), cal.meta, {}
        method, dataset, osl, samples = "medusa", m.get("prompts"), m.get("max_new_tokens"), m.get("num_prompts")
        validation = ("offline: the top-1 chain of the heads' ranks at every position of the base model's greedy "
                      "answers (workbench calibrate)")
        prov = dict(kind="calibration", model=m.get("model"), heads=m.get("heads"),
                    heads_sha256=(m.get("args") or {}).get("heads_sha256"))
    out = {"method": method, **_rates(counts),
           "measurement_conditions": {"dataset": dataset, "osl": osl, "num_samples": samples, "validation": validation},
           "counts": _counts(counts), "provenance": dict(prov, calibration=str(Path(folder).resolve()),
                                                         schema=PROFILE_SCHEMA)}
    if len(per_k) > 1:  # each K served in a run of its own
        out["per_num_speculative_tokens"] = {str(k): dict(_rates(c), counts=_counts(c), draft_tokens_per_step=c.totals(
        )["draft_tokens_per_step"]) for k, c in per_k.items()}
    return out


def _rates(counts: ServedCounts) -> dict:
    """The profile's rate fields of one K's counts."""
    table = counts.table()
    reached = [counts.drafts, *counts.per_pos]
    hist = {str(j + 1): reached[j] - (reached[j + 1] if j < counts.k else 0) for j in range(counts.k + 1)}
    return {"num_speculative_tokens": counts.k,
            "conditional_accept_rates": [round(float(x), 6) if x == x else None for x in table["conditional"]],
            "marginal_accept_rates": [round(float(x), 6) for x in table["marginal"]],
            "mean_accept_length": round(1 + counts.accepted / counts.drafts, 6),
            "acceptance_length_histogram": hist}


def _counts(counts: ServedCounts) -> dict:
    return {"drafts": counts.drafts, "draft_tokens": counts.draft_tokens, "accepted_tokens": counts.accepted,
            "accepted_per_position": list(counts.per_pos)}


def write_profile(folder) -> str:
    if folder is None:
        raise FieldError("format", "needs_calibration", "{field} speculation-profile describes a calibration: give "
                         "{also} DIR (ours or a served one)", also="calibration")
    return json.dumps(speculation_profile(folder), indent=1) + "\n"
