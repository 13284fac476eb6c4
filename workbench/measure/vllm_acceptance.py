"""`workbench calibrate --engine vllm`: a drafter's acceptance as vLLM serves it (calibrate/served.py's folder),
measured by running vLLM with that drafter at the largest K on a prompt set, in vLLM's own environment.

How (vllm_worker.py, mode "generate", one engine, one pass): the prompts served B at a time, greedy, to EOS or
max_new_tokens, with per-request spec-decode metrics ("detailed"); the worker sums them into vLLM's counters
(num_drafts, num_draft_tokens, num_accepted_tokens, accepted per position: its `counted`, the counts
vllm:spec_decode_* would show). Greedy acceptance does not depend on the batch size (a lossless engine emits the
same tokens), so one batch size is served. The decoding steps, drafted or not, are every new token less the
accepted ones and each request's first token (its prefill's): an n-gram drafter drafts only where an n-gram of the
context matches, and a plan prices every step.
"""
from __future__ import annotations

import math

from workbench import note
from workbench.core.notes import FieldError
from workbench.calibrate.served import MAX_K, ServedCounts, checked_counts
from workbench.measure.vllm_latency import vllm_setting
from workbench.measure.vllm_runner import run_worker


def served_acceptance(py: str, model_dir: str, drafter: dict, k: int, prompts: list[list[int]],
                      prompt_ids: list[str], stop_ids, batch: int = 8, max_new_tokens: int = 128,
                      progress=note, eager: bool = True) -> tuple[ServedCounts, dict]:
    """(vLLM's counts serving `prompts` (token ids) with `drafter` (a --speculative-config without K) at K = k,
    the setting: provenance.setting of the worker plus engine, version and drafter)."""
    if not 1 <= k <= MAX_K:
        raise FieldError("k", "range", f"{{field}} {k}: give 1..{MAX_K} (the largest K a plan will weigh)")
    if not prompts:
        raise FieldError("prompts", "none", "no prompts to serve: give a prompt set ({field})")
    spec = dict(drafter, num_speculative_tokens=k)
    longest = max(map(len, prompts)) + max_new_tokens + k + 8
    request = dict(mode="generate", model=model_dir, engines=[spec], prompts=prompts, batch_sizes=[batch],
                   max_new_tokens=max_new_tokens, max_model_len=int(math.ceil(longest / 64) * 64), repeats=1,
                   stop_token_ids=list(stop_ids), eager=eager)
    progress(f"vLLM: serving {len(prompts)} prompts with {drafter['method']} at K={k}, {batch} at a time")
    result = run_worker(py, request, progress)[0]["engines"][0]
    run = result["run"]
    if not run["num_drafts"]:  # checked_counts' words are for two scrapes; a run of ours says what to change
        raise FieldError("limit", "drafted_nothing", f"vLLM serving {drafter['method']} at K={k} drafted nothing "
                         f"on {len(prompts)} prompts ({run['new_tokens']} new tokens; n-gram drafts only where the "
                         "context repeats itself): serve more prompts or longer answers ({field}, {also})",
                         also="max_new_tokens")
    per_pos = list(run["accepted_per_pos"])[:k]
    per_pos += [0] * (k - len(per_pos))
    steps = run["new_tokens"] - run["num_accepted_tokens"] - len(prompts)
    counts = checked_counts(k, run["num_drafts"], run["num_draft_tokens"], run["num_accepted_tokens"], per_pos,
                            f"vLLM serving {drafter['method']}", steps)
    worker = (result.get("worker") or {}) | dict(vllm_version=result["vllm_version"])
    return counts, vllm_setting(worker, prompt_ids, drafter["method"])
