"""`workbench vllm-check`: the plan confirmed in vLLM, beside our prediction and our own live decoder, on the same
prompts in one run.

vLLM runs in its own environment (it pins its own torch and transformers): vllm_worker.py, run by that
interpreter (--vllm-python or $WORKBENCH_VLLM_PYTHON), speaks JSON lines on stdin/stdout. The heads go to vLLM as
export.vllm_heads.write_vllm_heads writes them; the base model as an HF folder (the demo GGUF's de-quantised fp32 folder).
Per K: vLLM's own spec-decode counters (LLM.get_metrics(): vllm:spec_decode_num_drafts,
vllm:spec_decode_num_accepted_tokens_per_pos) beside our decoder's steps (also counted as vLLM counts them:
vllm_steps) and the calibration's prediction; per batch size: vLLM's tokens/s with and without speculation;
greedy outputs compared token for token (vLLM with speculation vs plain vLLM vs our plain greedy).
Resumable: each vLLM engine's result is kept as it arrives, and each part of our decoder's run (plain greedy, each
K) as it ends, in the work.WorkState beside --out; a killed check rerun the same starts only the engines that had not
finished and decodes only the missing parts.
"""
from __future__ import annotations

import math
import os
import statistics
import time
from pathlib import Path

from workbench import note
from workbench.core.notes import FieldError
from workbench.calibrate.folder import Calibration, default_calibration
from workbench.core.data import load_prompt_records, prompts_fingerprint
from workbench.core.provenance import COMPILED, cpu_mark, load_average, others, quiet
from workbench.core.speed import prediction_error, spread
from workbench.core.work import WorkState
from workbench.decode.loop import medusa_generate, vanilla_generate
from workbench.export.vllm import served_ks
from workbench.export.vllm_heads import write_vllm_heads
from workbench.export.vllm_speed import plan_rows, priced_on, speed_rows, speed_table, surface_prompts
from workbench.measure.vllm_runner import between_results, engine_results, vllm_python
from workbench.trees.tree import chain_tree
from workbench.runtime.engine import StepEngine
from workbench.runtime.treemask import tree_setup
from workbench.runtime.generation import eos_ids, prepare_prompt
from workbench.runtime.heads import heads_fingerprint
from workbench.calibrate.topk_file import calibration_heads_sha256
from workbench.core.io import cache_dir
from workbench.core.outputs import writable_cache
from workbench.runtime.models import demo_model_dir, load_base, load_model_and_heads, model_label

PREDICTIONS = ("predicted_replay", "predicted_joint", "predicted_independent")


def per_position(accepted: list[int], depth: int) -> list[int]:
    """accepted[i]: drafts accepted per step -> counts per position (steps with at least k+1 accepted), as vLLM's
    vllm:spec_decode_num_accepted_tokens_per_pos counts them."""
    return [sum(a > k for a in accepted) for k in range(depth)]


def vllm_steps(accepted: list[int], length: int) -> list[int]:
    """One sequence of our decoder -> the verify steps vLLM records for it (accepted drafts per step, in order).

    accepted: our drafts accepted per step, before the cut at EOS / max_new_tokens; length: the output's tokens.
    Our step emits its root (the token the previous verify, or the prefill, chose) and then its accepted drafts;
    vLLM emits that same token at the end of the verify that chose it (the prefill's as output token 1) and counts
    a step before the stop check. Both therefore stop in the same step, except when the output's last token (EOS or
    the max_tokens-th) is a root: our last step then emits that root alone, and vLLM, already finished, never
    schedules it. The same drafts are verified in every other step, so the counts are then the same."""
    if not accepted:
        return []
    last = length - sum(1 + a for a in accepted[:-1])  # tokens our last step emitted (the earlier ones are uncut)
    if not 1 <= last <= 1 + accepted[-1]:
        raise ValueError(f"an output of {length} tokens cannot come from steps accepting {accepted}")
    return list(accepted[:-1] if last == 1 else accepted)


def counted_like_vllm(per_sequence: list[list[int]], lengths: list[int], k: int) -> dict:
    """Our decoder's steps counted as vLLM counts them (vllm_steps on each sequence): steps (= vLLM's drafts) and
    accepted drafts per position."""
    steps = [a for accepted, n in zip(per_sequence, lengths, strict=True) for a in vllm_steps(accepted, n)]
    return dict(steps=len(steps), accepted_per_pos=per_position(steps, k))


def sequences_step_for_step(per_sequence: dict, k: int) -> dict | None:
    """Sequences whose vLLM record (K drafted in each step, the accepted counts in order) equals ours by
    vllm_steps; None without vLLM's per-request record."""
    theirs = per_sequence.get("vllm")
    if not theirs or any(v is None for v in theirs):
        return None
    same = [v["accepted"] == vllm_steps(o, n) and all(d == k for d in v["drafted"])
            for o, n, v in zip(per_sequence["ours"], per_sequence["lengths"], theirs, strict=True)]
    return dict(equal=sum(same), sequences=len(same), differ=[i for i, s in enumerate(same) if not s])


def ours(model, heads, tok, prompts, ks, batch: int, max_new_tokens: int, eos, progress,
         state: WorkState | None = None, engine: StepEngine | None = None) -> dict:
    """Our live decoder on the same prompts: plain greedy, and Medusa with the top-1 chain of each K; each part
    kept in `state` when it ends, and taken from it when an earlier run finished it. `engine`: the check's own
    (its cache reused), else a fresh eager one."""
    state = state or WorkState(None, {})
    engine = engine or StepEngine(model, compile=False)
    chunks = [prompts[i:i + batch] for i in range(0, len(prompts), batch)]

    def plain() -> list[list[int]]:
        return [r.token_ids for c in chunks for r in vanilla_generate(model, tok, c, max_new_tokens, eos, engine=engine)]

    def chain(k: int) -> dict:
        buf = tree_setup(chain_tree(k), model, heads.num_heads)
        res = [r for c in chunks for r in medusa_generate(model, heads, tok, c, buf, max_new_tokens,
                                                            eos_token_id=eos, engine=engine)]
        accepted = [len(s.path) for r in res for s in r.steps]  # drafts accepted per step, before any cut
        return dict(outputs=[r.token_ids for r in res], steps=len(accepted),
                    per_sequence=[[len(s.path) for s in r.steps] for r in res],
                    accepted_per_pos=per_position(accepted, k),
                    mean_accepted_length=1 + sum(accepted) / max(len(accepted), 1))

    out = {"plain": state.piece("ours-plain", plain)}
    progress("ours: plain greedy done")
    for k in ks:
        out[k] = state.piece(f"ours-k{k}", lambda: chain(k))
        progress(f"ours: K={k} done ({out[k]['mean_accepted_length']:.3f} tokens/step)")
    return out


def plain_pass(model, tok, prompts, batch: int, max_new_tokens: int, eos, engine: StepEngine) -> dict:
    """One pass of our plain greedy over every prompt, `batch` at a time, as vLLM's passes serve them: its decoding
    phase (every step after the prefill; a batch's step is its slowest sequence's) and the tokens those steps
    emitted."""
    seconds = tokens = 0.0
    for i in range(0, len(prompts), batch):
        res = vanilla_generate(model, tok, prompts[i:i + batch], max_new_tokens, eos, engine=engine)
        seconds += max(r.decode_s for r in res)
        tokens += sum(len(r.token_ids) for r in res)
    return dict(decode_seconds=seconds, decode_tokens=int(tokens))


def plain_steps(plain: dict, ours: dict[int, list]) -> list[dict]:
    """Per batch size: vLLM's plain decoding step and ours (seconds per token emitted while decoding, each pass of
    ours run right after vLLM's same pass), and ours / vLLM pass by pass (median, quartiles)."""
    out = []
    for b, mine in sorted(ours.items()):
        theirs = [p for p in plain[b].get("passes") or [] if p.get("decode_tokens")]
        pairs = [(o["decode_seconds"] / o["decode_tokens"], t["decode_seconds"] / t["decode_tokens"])
                 for o, t in zip(mine, theirs) if o.get("decode_tokens")]
        if not pairs:
            continue
        sp = spread([o / t for o, t in pairs])
        out.append(dict(batch_size=b, ours_ms=1000 * statistics.median(o for o, _ in pairs),
                        vllm_ms=1000 * statistics.median(t for _, t in pairs), ratio=sp["median"],
                        ratio_q1=sp["q1"], ratio_q3=sp["q3"], passes=len(pairs)))
    return out


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first token where two outputs differ (a length difference counts), None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_outputs(a: list[list[int]], b: list[list[int]]) -> dict:
    diffs = [first_difference(x, y) for x, y in zip(a, b)]
    return {"identical": sum(d is None for d in diffs), "prompts": len(diffs),
            "first_difference": [d for d in diffs]}


def check_vllm_model(model) -> None:
    """vLLM loads an HF model folder: a GGUF file or a hub id is one error line (the demo model, None, is written as
    a folder)."""
    if model is not None and (str(model).endswith(".gguf") or not Path(model).is_dir()):
        raise FieldError("model", "not_hf_folder", f"{{field}} {model}: vLLM needs an HF model folder (config.json + "
                         "safetensors); the demo model is written as one automatically")


def vllm_inputs(model, heads_dir, records, raw: bool, heads: bool = True, want: str | None = None) -> dict:
    """What vLLM is given, made on our side: the base model as an HF folder (the demo GGUF's de-quantised fp32
    one), the prompts as token ids (our chat template), the stop ids and, with `heads`, the heads written as a vLLM
    Medusa folder (vllm_heads.write_vllm_heads, in the cache under their fingerprint). Also the loaded base,
    tokenizer and heads, for our own decoder. `want`: the fingerprint the heads must have (a calibration's), checked
    before anything is written, as `export --heads` checks a plan's."""
    check_vllm_model(model)
    if heads:
        writable_cache("vLLM's copy of the heads")
        base, tok, hd = load_model_and_heads(model, heads_dir, "cpu", "float32")
        if want and heads_fingerprint(hd) != want:
            raise FieldError("heads", "not_calibrated", f"{{field}} {heads_dir or 'demo'}: not the heads the "
                             f"calibration measured (its meta.json args.heads_sha256 {want[:16]}...): its predictions "
                             "are of other heads; give the calibration's own heads, or calibrate these (`workbench "
                             "calibrate --heads DIR`)")
    else:
        (base, tok), hd = load_base(model, "cpu", "float32"), None
    out = dict(base=base, tok=tok, heads=hd, ids=[prepare_prompt(tok, text, raw) for _, text in records],
               eos=sorted(eos_ids(base, tok)), model_dir=str(demo_model_dir() if model is None else
                                                           Path(model).resolve()), heads_folder=None)
    if hd is not None:
        folder = cache_dir() / "vllm-heads" / heads_fingerprint(hd)
        write_vllm_heads(hd, base, folder, model_label(model))
        out["heads_folder"] = str(folder)
    return out


def check_records(cal: Calibration, prompts: str, limit: int | None, exclude) -> tuple[list, int]:
    """The check's prompts and how many were left out for being among `exclude` (the ids a plan's vLLM surface
    was measured on: a check on them would not be a check)."""
    records = cal.holdout_prompts() if prompts == "holdout" else load_prompt_records(prompts, None)
    kept = [r for r in records if r[0] not in set(exclude)]
    if not kept:
        raise FieldError("prompts", "surface_prompts", f"every {prompts} prompt is one the plan's vLLM surface was "
                         "measured on: check on others ({field} mt-bench) or measure the surface on others (latency "
                         "{field})")
    return kept[:limit], len(records) - len(kept)


def vllm_check(calibration=None, plan=None, model=None, heads_dir=None, ks=(1, 2, 3, 4), batch_sizes=(1, 2, 4, 8),
               prompts: str = "holdout", limit: int = 16, max_new_tokens: int = 64, python: str | None = None,
               raw: bool = False, progress=None, work=None, repeats: int = 3, eager: bool = False,
               compile: bool | None = None) -> dict:
    """The whole check (see the module docstring) as one JSON-ready dict. `work`: the output file, beside which
    finished batch sizes (every engine's) and decoder parts are kept (None: nothing kept). Timing fields, which a resumed run's result
    may hold from either run: speed, vllm_startup_s, the runs' seconds, seconds, load_average, note."""
    progress = progress or note  # the front end shows it (the CLI: on stderr, as written)
    py = vllm_python(python)  # before anything loads: a missing interpreter fails in a second
    check_vllm_model(model)
    cal = Calibration(calibration or default_calibration())
    # what can be refused without the model comes first: the prompts, the plan's K, the calibration's predictions
    surface = surface_prompts(plan)
    records, excluded = check_records(cal, prompts, limit, surface)
    plan_k = served_ks(plan, batch_sizes) if plan is not None else {}  # what a user of the plan serves
    all_ks = sorted(set(ks) | {k for k in plan_k.values() if k})
    predicted = {k: {p: v for p, v in cal.predict(chain_tree(k), max_new_tokens).items() if p in PREDICTIONS}
                 for k in all_ks}
    if max(all_ks) > cal.meta["num_heads"]:  # before anything loads: a K past the heads is no config to serve
        raise FieldError("k" if max(ks) == max(all_ks) else "plan", "past_heads", f"K {max(all_ks)} ({{field}}): the "
                         f"calibration's heads draft at most {cal.meta['num_heads']} tokens; ask for K <= "
                         f"{cal.meta['num_heads']}")
    t0 = time.time()
    given = vllm_inputs(model, heads_dir, records, raw, want=calibration_heads_sha256(cal.meta))
    base, tok, heads, ids, eos, vllm_model = (given[k] for k in ("base", "tok", "heads", "ids", "eos", "model_dir"))
    if max(all_ks) > heads.num_heads:
        raise FieldError("k", "past_heads", f"{{field}} {max(all_ks)}: the heads draft at most {heads.num_heads} "
                         "tokens")
    folder = given["heads_folder"]
    engines = [None] + [{"method": "medusa", "model": folder, "num_speculative_tokens": k} for k in all_ks]
    longest = max(map(len, ids)) + max_new_tokens + max(all_ks) + 8
    request = dict(mode="generate", model=vllm_model, engines=engines, prompts=ids, batch_sizes=list(batch_sizes),
                   repeats=repeats, max_new_tokens=max_new_tokens, stop_token_ids=eos,
                   max_model_len=int(math.ceil(longest / 64) * 64), eager=eager)
    progress(f"{len(ids)} prompts, K = {', '.join(map(str, all_ks))}, batch sizes {', '.join(map(str, batch_sizes))}: "
             f"{len(engines)} vLLM engines, then our decoder")
    engine = StepEngine(base, compile=compile)  # None: the default (CPU: its decoder layers compiled)
    # everything the kept pieces depend on: the request (the prompts by hash), vLLM's environment, the heads
    state = WorkState(work, dict(request, command="vllm-check", python=str(Path(py).resolve()),
                                 prompts=prompts_fingerprint(ids),
                                 heads=heads_fingerprint(heads), model_label=model_label(model),
                                 ours_compiled=engine.compiled_as))
    load_before, mark = load_average(every=True), cpu_mark()
    if engine.compiled_as:  # sized for the whole run: each (batch, K) compiles once
        engine.size_for(ids, max_new_tokens, [tree_setup(chain_tree(k), base, heads.num_heads) for k in all_ks])

    def beside(b: int, i: int) -> dict:  # our plain pass right after vLLM's pass i at batch b: side by side
        done = plain_pass(base, tok, ids, b, max_new_tokens, eos, engine)
        progress(f"ours: plain pass {i + 1} at batch {b}: {1000 * done['decode_seconds'] / done['decode_tokens']:.1f}"
                 " ms a token")
        return done

    results = engine_results(py, request, state, progress, beside)
    mine = ours(base, heads, tok, ids, all_ks, 1, max_new_tokens, eos, progress, state, engine)
    plain = {r["batch_size"]: r for r in results[0]["runs"]}
    rows, speed = [], []
    for k, res in zip(all_ks, results[1:]):
        runs = {r["batch_size"]: r for r in res["runs"]}
        first = runs[batch_sizes[0]]  # beside our decoder (batch 1): the same prompts, decoded once
        # per sequence, in prompt order: accepted drafts per step (ours), vLLM's drafted/accepted per step
        per_seq = dict(ours=mine[k]["per_sequence"], vllm=first.get("steps"),
                       lengths=[len(o) for o in mine[k]["outputs"]])
        drafts, pos = first["num_drafts"], first["accepted_per_pos"][:k]
        pred = predicted[k]
        measured = 1 + sum(pos) / max(drafts, 1)
        key = next(p for p in PREDICTIONS if p in pred)
        rows.append(dict(
            k=k, vllm_drafts=drafts, vllm_accepted_per_pos=pos,
            vllm_acceptance_per_pos=[p / max(drafts, 1) for p in pos], vllm_mean_accepted_length=measured,
            ours_steps=mine[k]["steps"], ours_accepted_per_pos=mine[k]["accepted_per_pos"],
            ours_acceptance_per_pos=[p / max(mine[k]["steps"], 1) for p in mine[k]["accepted_per_pos"]],
            ours_mean_accepted_length=mine[k]["mean_accepted_length"],
            vllm_by_batch_size={b: dict(drafts=r["num_drafts"], accepted_per_pos=r["accepted_per_pos"][:k])
                                for b, r in runs.items()},
            vllm_batch_size=batch_sizes[0], **pred, prediction=key,
            prediction_error=prediction_error(pred[key], measured),
            vllm_spec_vs_vllm_plain={b: compare_outputs(runs[b]["outputs"], plain[b]["outputs"]) for b in runs},
            ours_medusa_vs_ours_plain=compare_outputs(mine[k]["outputs"], mine["plain"]),
            per_sequence=per_seq, ours_counted_like_vllm=counted_like_vllm(per_seq["ours"], per_seq["lengths"], k),
            sequences_step_for_step=sequences_step_for_step(per_seq, k)))
        speed += speed_rows(k, batch_sizes, runs, plain, plan_k, plan)
    load_after, used = load_average(every=True), others(mark, cpu_mark())
    return dict(
        vllm_version=results[0]["vllm_version"], model=model_label(model), vllm_model=vllm_model,
        vllm_heads=str(folder), heads=str(heads_dir or "demo"), calibration=str(cal.folder),
        prompts=prompts, prompt_ids=[r[0] for r in records], max_new_tokens=max_new_tokens, dtype="float32",
        plan=plan_k or None, acceptance=rows, speed=speed, repeats=repeats,
        plan_check=plan_rows(plan, plan_k, speed) if plan is not None else None,
        surface_prompts_left_out=excluded, priced_on=priced_on(plan) if plan is not None else None,
        vllm_plain_vs_ours_plain={b: compare_outputs(plain[b]["outputs"], mine["plain"]) for b in plain},
        plain_step=plain_steps(plain, between_results(state, batch_sizes)),
        vllm_compilation=(results[0].get("worker") or {}).get("compilation"), ours_compiled=engine.compiled_as,
        vllm_startup_s=[r["startup_s"] for r in results], seconds=time.time() - t0,
        load_average=dict(before=load_before, after=load_after, cpus=os.cpu_count(), others=used, idle=quiet(used)),
        note=load_note(used))


def load_note(used: dict | None) -> str:
    """What the CPU other processes used during the check (provenance.others) says of its tokens/s."""
    if used is None:
        return "what else ran during the check was not measured (no /proc/stat): tokens/s not known to be idle figures"
    return (f"other processes used {used['cores']:.3f} cores during the check: "
            + ("idle figures" if quiet(used) else "tokens/s were measured on a loaded machine: not idle figures"))


def _counts(accepted: list[int], steps: int) -> str:
    return " ".join(f"{a}/{steps}" for a in accepted)


def check_table(res: dict) -> str:
    """Markdown tables of a vllm_check result (also of a saved one: ours counted as vLLM counts is recomputed
    from the per-sequence steps, '-' where the JSON has none)."""
    lines = [f"vLLM {res['vllm_version']} vs the workbench on {res['model']} (fp32, greedy), {len(res['prompt_ids'])} "
             f"{res['prompts']} prompts, {res['max_new_tokens']} new tokens; load average {res['load_average']}: "
             f"{res['note']}.", "",
             "| K | vLLM tokens/step | ours | predicted | prediction vs vLLM | vLLM accepted per position / drafts "
             "| ours / steps | ours counted as vLLM counts | sequences equal step for step "
             "| vLLM spec = vLLM plain | ours Medusa = ours plain |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["acceptance"]:
        same = ", ".join(f"B{b}: {c['identical']}/{c['prompts']}" for b, c in r["vllm_spec_vs_vllm_plain"].items())
        seq = r.get("per_sequence")
        like = counted_like_vllm(seq["ours"], seq["lengths"], r["k"]) if seq else None
        step = sequences_step_for_step(seq, r["k"]) if seq else None
        step = f"{step['equal']}/{step['sequences']}" if step else "-"
        lines.append(
            f"| {r['k']} | {r['vllm_mean_accepted_length']:.3f} | {r['ours_mean_accepted_length']:.3f} | "
            f"{r[r['prediction']]:.3f} ({r['prediction'].removeprefix('predicted_')}) | "
            f"{100 * r['prediction_error']:+.1f}% | "
            f"{_counts(r['vllm_accepted_per_pos'], r['vllm_drafts'])} | "
            f"{_counts(r['ours_accepted_per_pos'], r['ours_steps'])} | "
            f"{_counts(like['accepted_per_pos'], like['steps']) if like else '-'} | "
            f"{step} | {same} | "
            f"{r['ours_medusa_vs_ours_plain']['identical']}/{r['ours_medusa_vs_ours_plain']['prompts']} |")
    lines += ["", "Ours counted as vLLM counts: each sequence's last step left out when it emitted only its root (the "
              "output ended on the token the step before had chosen, where vLLM had already stopped); see "
              "`vllm_steps`."]
    same = ", ".join(f"B{b}: {c['identical']}/{c['prompts']}" for b, c in res["vllm_plain_vs_ours_plain"].items())
    lines += ["", f"vLLM plain greedy = our plain greedy: {same} prompts identical.", ""] + speed_table(res)
    if res.get("plain_step"):
        ours = COMPILED.get(res.get("ours_compiled"), "compiled")
        lines += ["", f"Plain decoding, vLLM ({res.get('vllm_compilation') or '?'}) and our decoder ({ours}), each of "
                      "our passes right after vLLM's on the same prompts: milliseconds per token emitted while "
                      "decoding.", "", "| batch | vLLM ms | ours ms | ours / vLLM, median (q1..q3) |",
                  "|---|---|---|---|"]
        lines += [f"| {r['batch_size']} | {r['vllm_ms']:.1f} | {r['ours_ms']:.1f} | {r['ratio']:.3f} "
                  f"({r['ratio_q1']:.3f}..{r['ratio_q3']:.3f}, {r['passes']} passes) |" for r in res["plain_step"]]
    return "\n".join(lines) + "\n"
