"""`workbench vllm-check --calibration SERVED`: a plan for a drafter vLLM serves (n-gram, draft model, ...) confirmed
in vLLM, on prompts the served calibration held out and the plan's latency surface was not served on.

No decoder of ours runs such a drafter, so plain vLLM is the referee: per K, vLLM's tokens/step (its own counters,
per decoding step as the served calibration's rates are) beside the calibration's prediction (1 + K's own run's
per-step rates, or the largest K's first K where K had no run: source.served_source); per (batch, K), vLLM's decoding-phase speedup over plain vLLM beside the plan's (vllm_speed.py),
served as a server under steady load serves (vllm_worker.serve_steady: B requests kept in flight, the steps where
all B decode timed), the state the plan prices: one served to its end B at a time runs under-full in a ragged tail,
as a prompt-dependent drafter lets requests finish rounds apart (copy-edit at batch 8, K = 4: a round there
cost 1.50x plain where the surface's steady rounds cost 1.18x);
greedy outputs of every speculative engine compared token for token with plain vLLM's. An n-gram engine runs in a
worker process of its own beside a plain engine of its own (vllm_runner.engine_groups): each K is timed and compared
against that one. Resumable as vllm_check.py is: each process's finished batch sizes are kept beside --out.
The report (served_table) splits each row's miss in the held-out prompts' acceptance and the round's pricing
(miss_split) and brackets the held-out tokens/step by resampling its prompts (held_out_interval): a miss the held-out
sample explains is not the plan's. Both from the stored result, so a report written again gets them.
"""
from __future__ import annotations

import math
import os
import time
from pathlib import Path

from workbench import WorkbenchError, note
from workbench.core.notes import FieldError
from workbench.calibrate.served import Served
from workbench.core.data import load_prompt_records, prompts_fingerprint
from workbench.core.provenance import cpu_mark, load_average, others, quiet
from workbench.core.speed import miss_parts, prediction_error, served_tokens_interval, served_tokens_per_step
from workbench.core.work import WorkState
from workbench.export.vllm import served_ks
from workbench.export.vllm_check import check_vllm_model, compare_outputs, load_note, vllm_inputs
from workbench.export.vllm_speed import plan_rows, priced_on, speed_rows, speed_table, surface_prompts
from workbench.measure.vllm_runner import draft_folder, engine_results, vllm_python
from workbench.plan.source import plan_source
from workbench.runtime.models import model_label
from workbench.trees.tree import chain_tree


def served_records(served: Served, prompts: str, limit: int | None, surface) -> tuple[list, int]:
    """The check's prompts: the calibration's held-out ones ('holdout') or a set's, less every prompt the calibration
    served or the plan's surface was served on (a check on them would not be a check); and how many were left out."""
    records = served.holdout_prompts() if prompts == "holdout" else load_prompt_records(prompts, None)
    used = set(served.served_prompt_ids()) | set(map(str, surface))
    kept = [r for r in records if r[0] not in used]
    if not kept:
        raise FieldError("prompts", "served_prompts", f"every {prompts} prompt is one the calibration or the plan's "
                         "surface was served on: check on others ({field}), or hold some out (`calibrate --engine "
                         "vllm --holdout`)")
    return kept[:limit], len(records) - len(kept)


def drafter_of(served: Served) -> dict:
    """The --speculative-config the calibration served, less its K."""
    spec = served.meta.get("speculative_config")
    spec = dict(spec) if isinstance(spec, dict) else {"method": served.meta.get("method")}
    if served.meta.get("draft_model") and "model" not in spec:
        spec["model"] = served.meta["draft_model"]
    spec.pop("num_speculative_tokens", None)
    return spec


def per_prompt(records, run: dict) -> list[dict]:
    """Each prompt's answer in a run: tokens, and its drafts and accepted tokens (vLLM's per-request records): how
    far acceptance varies from prompt to prompt, which sets how ragged a batch served to its end runs."""
    out = []
    for (pid, _), tokens, steps in zip(records, run["outputs"], run.get("steps") or []):
        steps = steps or {"drafted": [], "accepted": []}
        out.append(dict(prompt_id=pid, tokens=len(tokens), drafts=sum(d > 0 for d in steps["drafted"]),
                        accepted=sum(steps["accepted"])))
    return out


def served_check(calibration, plan=None, model=None, ks=(1, 2, 3, 4), batch_sizes=(1, 2, 4, 8),
                 prompts: str = "holdout", limit: int | None = 16, max_new_tokens: int = 64,
                 python: str | None = None, raw: bool = False, progress=None, work=None, repeats: int = 3,
                 eager: bool = False) -> dict:
    """The whole check (module docstring) as one JSON-ready dict; `work`: the output file (None: nothing kept)."""
    progress = progress or note  # the front end shows it (the CLI: on stderr, as written)
    py = vllm_python(python)
    check_vllm_model(model)
    served = Served(calibration, "calibration")
    method = served.meta.get("method")
    if method == "medusa":
        raise FieldError("calibration", "served_medusa", f"{{field}} {calibration}: vLLM served our Medusa heads; "
                         "check heads with our own calibration of them (`vllm-check --calibration DIR` of `workbench "
                         "calibrate`)")
    surface = surface_prompts(plan)
    records, excluded = served_records(served, prompts, limit, surface)
    plan_k = served_ks(plan, batch_sizes) if plan is not None else {}
    all_ks = sorted(set(ks) | {k for k in plan_k.values() if k})
    if max(all_ks) > served.counts.k:
        raise WorkbenchError(f"K {max(all_ks)}: the calibration served {method} at K={served.counts.k}, so acceptance "
                             f"past position {served.counts.k} was never counted; ask for K <= {served.counts.k}")
    source = plan_source(acceptance=calibration)  # the planner's own tokens/step of a chain of K
    predicted = {k: source.predict(chain_tree(k)) for k in all_ks}
    drafter = drafter_of(served)
    named = f"{calibration}: its drafter's weights"
    if "model" in drafter:  # the folder vLLM loaded when it was calibrated, still there (checked before any model)
        draft_folder(drafter["model"], method, field="calibration", named=named)
    t0 = time.time()
    given = vllm_inputs(model, None, records, raw, heads=False)
    ids = given["ids"]
    if "model" in drafter:
        drafter["model"] = draft_folder(drafter["model"], method, given["model_dir"], "calibration", named)
    engines = [None] + [dict(drafter, num_speculative_tokens=k) for k in all_ks]
    longest = max(map(len, ids)) + max_new_tokens + max(all_ks) + 8
    request = dict(mode="generate", model=given["model_dir"], engines=engines, prompts=ids, steady=True,
                   batch_sizes=list(batch_sizes), repeats=repeats, max_new_tokens=max_new_tokens,
                   stop_token_ids=given["eos"], max_model_len=int(math.ceil(longest / 64) * 64), eager=eager)
    progress(f"{len(ids)} prompts, {method} K = {', '.join(map(str, all_ks))}, batch sizes "
             f"{', '.join(map(str, batch_sizes))}")
    state = WorkState(work, dict(request, command="vllm-check", python=str(Path(py).resolve()),
                                 prompts=prompts_fingerprint(ids), model_label=model_label(model)))
    load_before, mark = load_average(every=True), cpu_mark()
    results = engine_results(py, request, state, progress)
    plain = {r["batch_size"]: r for r in results[0]["runs"]}
    rows, speed = [], []
    for k, res in zip(all_ks, results[1:]):
        runs = {r["batch_size"]: r for r in res["runs"]}
        beside = {r["batch_size"]: r for r in res["plain"]}
        first = runs[batch_sizes[0]]
        measured = served_tokens_per_step(first["new_tokens"], len(ids), first["num_accepted_tokens"])
        rows.append(dict(k=k, vllm_drafts=first["num_drafts"], vllm_accepted_per_pos=first["accepted_per_pos"][:k],
                         vllm_tokens_per_step=measured, predicted=predicted[k], per_prompt=per_prompt(records, first),
                         prediction_error=prediction_error(predicted[k], measured) if measured == measured else None,
                         vllm_spec_vs_vllm_plain={b: compare_outputs(runs[b]["outputs"], beside[b]["outputs"])
                                                  for b in runs},
                         plain_vs_first_plain={b: compare_outputs(beside[b]["outputs"], plain[b]["outputs"])
                                               for b in runs}))
        speed += speed_rows(k, batch_sizes, runs, beside, plan_k, plan)
    used = others(mark, cpu_mark())
    return dict(
        vllm_version=results[0]["vllm_version"], model=model_label(model), vllm_model=given["model_dir"],
        drafter=drafter, calibration=str(served.folder), calibration_prompts=served.meta.get("prompts"),
        prompts=prompts, prompt_ids=[r[0] for r in records], max_new_tokens=max_new_tokens, dtype="float32",
        plan=plan_k or None, acceptance=rows, speed=speed, repeats=repeats,
        plan_check=plan_rows(plan, plan_k, speed) if plan is not None else None,
        surface_prompts_left_out=excluded, priced_on=priced_on(plan) if plan is not None else None,
        vllm_compilation=(results[0].get("worker") or {}).get("compilation"),
        vllm_startup_s=[r["startup_s"] for r in results], seconds=time.time() - t0,
        load_average=dict(before=load_before, after=load_average(every=True), cpus=os.cpu_count(), others=used,
                          idle=quiet(used)), note=load_note(used))


HELD_OUT_LEVEL = 0.90  # the held-out tokens/step's bootstrap interval (served_tokens_interval's resamples, seed 0)


def held_out_interval(row: dict) -> tuple[float, float] | None:
    """A K row's bootstrap interval of the held-out tokens/step over its prompts (core.speed.served_tokens_interval);
    None for a result without per-prompt records (older ones)."""
    prompts = row.get("per_prompt")
    return served_tokens_interval([(p["tokens"], p["accepted"]) for p in prompts], HELD_OUT_LEVEL) if prompts else None


def miss_split(res: dict) -> dict[tuple[int, int], tuple[float, float]]:
    """{(batch, K): (acceptance part, round-cost part)} (core.speed.miss_parts) of each speed and plan row with a
    prediction and a measurement, from the K row's tokens/step predicted and measured (K = 0, no drafter: 1 and 1):
    computed when a report is written, so a stored result gets it without measuring again."""
    tps = {0: (1.0, 1.0)} | {r["k"]: (r["predicted"], r["vllm_tokens_per_step"]) for r in res["acceptance"]}
    rows = [(s["batch_size"], s["k"], s.get("predicted_speedup"), s.get("decode_speedup")) for s in res["speed"]]
    rows += [(r["batch_size"], r["plan_k"], r["predicted_speedup"], r["measured_speedup"])
             for r in res.get("plan_check") or []]
    return {(b, k): miss_parts(pred, got, *tps[k]) for b, k, pred, got in rows
            if pred and got and k in tps and tps[k][1] and math.isfinite(tps[k][1])}


def _pct(v: float) -> str:
    return f"{100 * v:+.1f}%"


def served_table(res: dict) -> str:
    """Markdown tables of a served_check result."""
    lines = [f"vLLM {res['vllm_version']} serving {res['drafter'].get('method')} on {res['model']} (fp32, greedy), "
             f"{len(res['prompt_ids'])} {res['prompts']} prompts of {res.get('calibration_prompts')}, "
             f"{res['max_new_tokens']} new tokens; load average {res['load_average']}: {res['note']}.", "",
             "| K | vLLM tokens/step | predicted (1 + per-step rates) | prediction vs vLLM | vLLM accepted per "
             f"position / drafts | vLLM spec = vLLM plain | plain = first process's plain | held-out "
             f"{100 * HELD_OUT_LEVEL:.0f}% interval | prediction inside |", "|---|---|---|---|---|---|---|---|---|"]
    sampled = set()  # the Ks whose prediction lies inside the held-out sample's interval
    for r in res["acceptance"]:
        same = ", ".join(f"B{b}: {c['identical']}/{c['prompts']}" for b, c in r["vllm_spec_vs_vllm_plain"].items())
        plain = ", ".join(f"B{b}: {c['identical']}/{c['prompts']}" for b, c in r["plain_vs_first_plain"].items())
        err = "-" if r["prediction_error"] is None else _pct(r["prediction_error"])
        counts = " ".join(f"{a}/{r['vllm_drafts']}" for a in r["vllm_accepted_per_pos"])
        held = held_out_interval(r)
        inside = held is not None and held[0] <= r["predicted"] <= held[1]
        sampled |= {r["k"]} if inside else set()
        lines.append(f"| {r['k']} | {r['vllm_tokens_per_step']:.3f} | {r['predicted']:.3f} | {err} | {counts} | "
                     f"{same} | {plain} | " + ("- | - |" if held is None else
                                               f"{held[0]:.3f}..{held[1]:.3f} | {'yes' if inside else 'no'} |"))
    parts = {bk: [_pct(a) + (" (sampling)" if bk[1] in sampled else ""), _pct(c)]
             for bk, (a, c) in miss_split(res).items()}
    lines += ["", f"Held-out interval: the {100 * HELD_OUT_LEVEL:.0f}% percentile-bootstrap interval of vLLM's "
              "tokens/step over the held-out prompts (resampled with replacement, fixed seed; '-': a result without "
              "per-prompt records). Each speed row's miss, predicted / measured - 1, in two parts, 1 + miss = (1 + "
              "acceptance part) x (1 + round-cost part): the acceptance part is the K row's prediction vs vLLM "
              "(the held-out prompts accept more or less than the calibration's did; 'sampling': the prediction lies "
              "inside the held-out interval, a miss the held-out sample explains); the round-cost part is the rest, "
              "the relative round cost vLLM's measurement implies over the surface's price (+: priced cheaper than "
              "it ran), the pricing's own error."]
    extra = (["acceptance part", "round-cost part"], parts)
    return "\n".join(lines + [""] + speed_table(res, extra)) + "\n"
