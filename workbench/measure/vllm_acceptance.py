"""`workbench calibrate --engine vllm`: a drafter's acceptance as vLLM serves it (calibrate/served.py's folder),
measured by running vLLM with that drafter at each K = 1..the largest on a prompt set, in vLLM's own environment.

How (vllm_worker.py, mode "generate", one engine per K, one pass each; vllm_runner.engine_results, which gives an
n-gram engine a worker process of its own): the prompts served B at a time, greedy, to EOS or max_new_tokens, with
per-request spec-decode metrics ("detailed"); the worker sums them into vLLM's counters (num_drafts,
num_draft_tokens, num_accepted_tokens, accepted per position: its `counted`, the counts vllm:spec_decode_* would
show). Why each K: a K-token drafter's acceptance is not a longer one's first K positions (calibrate/served.py).
Greedy acceptance does not depend on the batch size (a lossless engine emits the same tokens), so one batch size is
served. The decoding steps, drafted or not, are every new token less the accepted ones and each request's first
token (its prefill's): an n-gram drafter drafts only where an n-gram of the context matches, and a plan prices every
step.
"""
from __future__ import annotations

import math

from workbench import note
from workbench.core.notes import FieldError
from workbench.calibrate.served import MAX_K, ServedCounts, checked_counts
from workbench.measure.vllm_latency import vllm_setting
from workbench.core.work import WorkState
from workbench.measure.vllm_runner import engine_results


def served_acceptance(py: str, model_dir: str, drafter: dict, k: int, prompts: list[list[int]],
                      prompt_ids: list[str], stop_ids, batch: int = 8, max_new_tokens: int = 128,
                      progress=note, eager: bool = True) -> tuple[list[ServedCounts], dict]:
    """([vLLM's counts serving `prompts` (token ids) with `drafter` (a --speculative-config without K) at K, for
    K = 1..k], the setting: provenance.setting of the worker plus engine, version and drafter)."""
    if not 1 <= k <= MAX_K:
        raise FieldError("k", "range", f"{{field}} {k}: give 1..{MAX_K} (the largest K a plan will weigh)")
    if not prompts:
        raise FieldError("prompts", "none", "no prompts to serve: give a prompt set ({field})")
    ks = list(range(1, k + 1))
    longest = max(map(len, prompts)) + max_new_tokens + k + 8
    request = dict(mode="generate", model=model_dir, engines=[dict(drafter, num_speculative_tokens=j) for j in ks],
                   prompts=prompts, batch_sizes=[batch], max_new_tokens=max_new_tokens,
                   max_model_len=int(math.ceil(longest / 64) * 64), repeats=1, stop_token_ids=list(stop_ids),
                   eager=eager)
    progress(f"vLLM: serving {len(prompts)} prompts with {drafter['method']} at K = {', '.join(map(str, ks))} "
             f"(an engine each), {batch} at a time")
    results = engine_results(py, request, WorkState(None, request), progress)
    out = [run_counts(j, res["runs"][0], len(prompts), drafter["method"]) for j, res in zip(ks, results)]
    worker = (results[-1].get("worker") or {}) | dict(vllm_version=results[-1]["vllm_version"])
    return out, vllm_setting(worker, prompt_ids, drafter["method"])


def run_counts(k: int, run: dict, prompts: int, method: str) -> ServedCounts:
    """ServedCounts of one engine's generate run at K = k (`run`: vllm_worker's, over `prompts` prompts)."""
    if not run["num_drafts"]:  # checked_counts' words are for two scrapes; a run of ours says what to change
        raise FieldError("limit", "drafted_nothing", f"vLLM serving {method} at K={k} drafted nothing on {prompts} "
                         f"prompts ({run['new_tokens']} new tokens; n-gram drafts only where the context repeats "
                         "itself): serve more prompts or longer answers ({field}, {also})", also="max_new_tokens")
    per_pos = list(run["accepted_per_pos"])[:k]
    per_pos += [0] * (k - len(per_pos))
    steps = run["new_tokens"] - run["num_accepted_tokens"] - prompts
    return checked_counts(k, run["num_drafts"], run["num_draft_tokens"], run["num_accepted_tokens"], per_pos,
                          f"vLLM serving {method}", steps)
