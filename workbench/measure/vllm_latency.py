"""`workbench latency --engine vllm`: vLLM's own cost of one decoding round per (batch size B, K), timed as vLLM
serves it, written as a latency CSV (latency_file owns the format) that `workbench plan` prices vLLM's choices on.

Why not our decoder's table: vLLM's round (scheduler, drafter, verify, rejection sampler, output processing) is
another program with other costs (on one 2-core EPYC its plain step was ~21 ms where ours was ~40 ms), and a plan
priced on one engine's surface picks the wrong K on the other. Why not a bare forward: a timed forward misses
everything else a served round does (priced vLLM's chain round at batch 64 about 3x too cheap elsewhere).

How (vllm_worker.py, mode "rounds", in vLLM's own environment): one engine per K (K = 0: no speculation), all held
at once, and per batch size B, `warmup + repeats` passes, each timed pass serving as many real prompts at every
batch size (the largest batch size's count, B at a time: a batch-1 pass of one prompt was a few seconds, and its
ratio to plain scattered by 10 %), the same ones on every engine, one engine after the other within the pass (side by side: the machine's drift over minutes lands on
every K alike), through the engine's own step loop (LLMEngine.add_request / step) to `max_new_tokens`, the context growing as in serving, EOS ignored so
the batch stays full. A round is one engine step in which all B requests were decoding (no prefill in it, none
finished before it) and each emitted tokens. A pass's value is the wall time of its engine steps while all B were
decoding over its rounds (tokens out per wall time of the engine's steps, per round); the CSV keeps
the median and spread over passes at tokens = K + 1 per sequence, a K > 0 engine's passes each priced against
plain's same pass (`paired`). The context is the mean over every timed round
(one value per file, as decoder-step writes it), its range in context_min/max.
Resumable: each batch size's results are kept as they arrive (vllm_runner.engine_results).
"""
from __future__ import annotations

import math
import os
import statistics

import pandas as pd

from workbench import note
from workbench.core.notes import FieldError
from workbench.core.data import prompts_fingerprint
from workbench.core.provenance import setting, setting_cell
from workbench.core.speed import relative_latency
from workbench.core.work import WorkState
from workbench.measure.latency_file import HEADS_COLUMNS, LATENCY_COLUMNS, LATENCY_VERSION, spread_row, stamp
from workbench.measure.vllm_runner import engine_results

MODE = "vllm-round"  # the setting's mode: a round as vLLM serves it
DEFAULT_KS = (1, 2, 3, 4)
COLUMNS = [c for c in LATENCY_COLUMNS if c not in HEADS_COLUMNS] + ["served_tokens_per_step"]
# served_tokens_per_step: tokens out per sequence per timed round (vLLM's acceptance on these prompts; not priced)


def round_value(steps: list[dict]) -> float | None:
    """A pass's cost of one round: the wall time of its decoding steps over its full rounds (None: no full round;
    with async scheduling a round's tokens can come out of the next step call, so no step is left out)."""
    full = sum(bool(s["full"]) for s in steps)
    return math.fsum(s["seconds"] for s in steps) / full if full else None


def paired(values: list[float | None], plain: list[float | None], base: float | None = None) -> list[float]:
    """A K engine's passes priced pass by pass against plain's (the same prompts, run next to each other):
    `base` (default median(plain)) x its round over plain's in each pass. The plan reads t(K)/t(0) = the median of
    those ratios, so the machine's drift between passes (20-30 % over minutes on a shared VM) and each pass's own
    prompts cancel instead of widening both medians. `base`: the plain row's median where K ran beside a plain
    engine of its own (vllm_runner.engine_groups), so its ratio to its own plain engine is what the CSV keeps."""
    base = statistics.median(v for v in plain if v is not None) if base is None else base
    return [base * v / p for v, p in zip(values, plain, strict=True) if v is not None and p is not None]


def rows_of(results: list[dict], ks: list[int], label: str, cell: str) -> tuple[list[dict], list[tuple[int, int]]]:
    """CSV rows (all but the context) of the worker's results, engine i running K = ks[i] (ks[0] = 0, plain; every
    other K priced pass by pass against the plain engine it ran beside, its result's "plain", at the plain row's
    median: `paired`), and every timed round's (context sum, sequences) for the file's context."""
    def values_of(run: dict) -> list[float | None]:
        return [round_value(p["rounds"]) for p in run["passes"] if p.get("timed")]

    rows, contexts = [], []
    plain = {run["batch_size"]: values_of(run) for run in results[0]["runs"]}
    for k, res in zip(ks, results, strict=True):
        beside = {run["batch_size"]: values_of(run) for run in res.get("plain") or results[0]["runs"]}
        for run in res["runs"]:
            b, passes = run["batch_size"], [p for p in run["passes"] if p.get("timed")]
            values = values_of(run)
            base = statistics.median(v for v in plain[b] if v is not None) if k and any(
                v is not None for v in plain[b]) else None
            values = [v for v in (paired(values, beside[b], base) if k else values) if v is not None]
            if not values:
                raise FieldError("max_new_tokens", "no_round", f"vLLM: no full round at batch {b}, K={k} (every request "
                                 "finished or was still in prefill): raise {field}")
            rounds = [r for p in passes for r in p["rounds"]]
            contexts += [(r["context_min"], r["context_max"], r["context_sum"], b) for r in rounds if r["full"]]
            served = math.fsum(r["tokens"] for r in rounds) / (b * sum(bool(r["full"]) for r in rounds))
            rows.append(dict(model=label, device="cpu", dtype="float32", batch=b, tokens=k + 1, **spread_row(values),
                             setting=cell, served_tokens_per_step=served))
    return rows, contexts


def vllm_setting(worker: dict, prompt_ids: list[str], drafter: str | None) -> dict:
    """provenance.setting of a vLLM measurement: its threads and versions (torch, transformers, vLLM) are the
    worker's, the mode MODE; the prompts it served (ids) so a check can serve others."""
    compiled = worker.get("compilation") not in (None, "NONE")  # vLLM's default; NONE under --vllm-eager
    where = setting("cpu", "float32", worker.get("threads") or os.cpu_count() or 1, compiled=compiled, mode=MODE)
    return where | dict(torch=worker.get("torch"), transformers=worker.get("transformers"), engine="vllm",
                        vllm=worker.get("vllm_version"), vllm_compilation=worker.get("compilation"), drafter=drafter,
                        prompt_ids=list(prompt_ids))


def measure_vllm_rounds(py: str, model_dir: str, drafter: dict | None, ks, prompts: list[list[int]],
                        prompt_ids: list[str], batches, repeats: int = 4, warmup: int = 1, max_new_tokens: int = 64,
                        label: str = "", progress=note, work=None, settings: dict | None = None,
                        eager: bool = False) -> pd.DataFrame:
    """The latency rows of vLLM's served rounds (module docstring): K = 0 and every K in `ks` (drafted by `drafter`,
    a --speculative-config without num_speculative_tokens), per batch size. `prompts`: token ids (`prompt_ids`
    name them); `work`: the CSV, beside which finished batch sizes are kept; `settings`: what else the kept results
    depend on (model, heads); `eager`: vLLM's enforce_eager (by default it serves its compiled model)."""
    ks = sorted({0, *(int(k) for k in ks)})
    batches = sorted({int(b) for b in batches})
    if repeats < 1 or warmup < 0 or not batches or batches[0] < 1 or ks[-1] > 64:
        raise FieldError("repeats", "range", "{field} >= 1, {also} >= 0, {also2} positive and {also3} 0..64, please",
                         also=("warmup", "batch", "k"))
    if len(ks) > 1 and drafter is None:
        raise FieldError("heads", "no_drafter", "K > 0 needs a drafter: {field} DIR (Medusa heads), or {also} and "
                         "{also2}", also=("method", "draft_model"))
    if max_new_tokens < 4:
        raise FieldError("max_new_tokens", "below_four", f"{{field}} {max_new_tokens}: need >= 4 (rounds after the "
                         "prefill to time)")
    if not prompts:
        raise FieldError("prompts", "none", "no prompts to serve: give a prompt set ({field})")
    engines = [None] + [dict(drafter, num_speculative_tokens=k) for k in ks[1:]]
    longest = max(map(len, prompts)) + max_new_tokens + ks[-1] + 8
    request = dict(mode="rounds", model=model_dir, engines=engines, prompts=prompts, batch_sizes=batches,
                   repeats=repeats, warmup=warmup, max_new_tokens=max_new_tokens, sequences=batches[-1],
                   max_model_len=int(math.ceil(longest / 64) * 64), eager=eager)
    state = WorkState(work, dict(request, command="latency --engine vllm", python=py, **(settings or {}),
                                 prompts=prompts_fingerprint(prompts)))
    progress(f"vLLM rounds: {len(prompts)} prompts, K = {', '.join(map(str, ks))}, batch sizes "
             f"{', '.join(map(str, batches))}, {warmup} + {repeats} passes each: {len(engines)} engines")
    results = engine_results(py, request, state, progress)
    worker = results[0].get("worker") or {}
    where = vllm_setting(worker | dict(vllm_version=results[0]["vllm_version"]), prompt_ids,
                         drafter and drafter.get("method"))
    rows, contexts = rows_of(results, ks, label, setting_cell(where))
    ctx = round(math.fsum(c[2] for c in contexts) / sum(c[3] for c in contexts))
    df = pd.DataFrame([dict(r, context=ctx) for r in rows], columns=COLUMNS)
    df = stamp(df, "vllm", results[0]["vllm_version"], (min(c[0] for c in contexts), max(c[1] for c in contexts)))
    df["policy"], df["version"] = "static", LATENCY_VERSION  # vLLM drafts one chain per K
    tables = {b: dict(zip(g["tokens"].astype(int), g["seconds"])) for b, g in df.groupby("batch")}
    df["relative"] = [relative_latency(tables[b], int(n) - 1) for b, n in zip(df["batch"], df["tokens"])]
    return df

