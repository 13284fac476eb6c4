"""Run vLLM engines for `workbench vllm-check` and `workbench latency --engine vllm`, inside vLLM's own environment
(its own torch and transformers).

Standalone on purpose: run as `VLLM_PYTHON workbench/measure/vllm_worker.py`, it imports vLLM and nothing of the
workbench. Protocol: one JSON request on stdin; JSON lines on stdout, {"event": "progress", "text"} while it runs,
one {"event": "result", "engine": i, "vllm_version", "startup_s", "worker": {threads, torch, transformers}, "runs"}
per engine (each `engines` entry is a --speculative-config, null for plain decoding), then {"event": "done"}; or
{"event": "error", "text"}. Request:
  {"mode": "generate" | "rounds", "model": DIR, "engines": [...], "prompts": [[ids], ...], "batch_sizes": [1, 4],
   "max_new_tokens": N, "max_model_len": N, "repeats": R, "warmup": W, "stop_token_ids": [...] (generate)}
Every request is served through the engine's own step loop (LLMEngine.add_request / step), so each step's wall
time is what a served round costs. Runs, per batch size B:
  generate (vllm-check; the prompts served B at a time, as the workbench decoder batches them, stopping at EOS,
  `repeats` passes over all of them): {"batch_size", "seconds" (pass 0), "decode_seconds" (pass 0, the steps
  without a prefill in them), "passes": [{"seconds", "decode_seconds"}, ...], "new_tokens", "outputs",
  "steps" (per-request drafts per step), "num_drafts", "num_draft_tokens", "num_accepted_tokens",
  "accepted_per_pos"} (spec-decode counters of pass 0: deltas of LLM.get_metrics());
  rounds (latency --engine vllm; `warmup + repeats` passes, each serving the next B prompts to max_new_tokens with
  EOS ignored): {"batch_size", "passes": [{"timed", "rounds": [{"seconds", "full", "tokens", "context_sum",
  "context_min", "context_max"}, ...]}]}: every step in which all B requests were decoding (none finished), `full`
  where each of them emitted a token (a round).
"""
import gc
import json
import sys
import time


def say(obj) -> None:
    print(json.dumps(obj), flush=True)


def counters(llm) -> dict:
    """vLLM's own spec-decode counters (vllm:spec_decode_*), summed over label sets."""
    out = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "accepted_per_pos": []}
    for m in llm.get_metrics():
        key = m.name.replace("vllm:spec_decode_", "").removesuffix("_total")
        if key == "num_accepted_tokens_per_pos" and hasattr(m, "values"):
            pos = out["accepted_per_pos"]
            pos += [0] * (len(m.values) - len(pos))
            for i, v in enumerate(m.values):
                pos[i] += int(v)
        elif key in out and hasattr(m, "value"):
            out[key] += int(m.value)
    return out


def per_step(output) -> dict | None:
    """One sequence's verify steps as vLLM's scheduler saw them (per-request metrics, 'detailed'): drafts
    proposed and accepted per step, in order; None for plain decoding."""
    m = getattr(output, "spec_decode_metrics", None)
    if m is None:
        return None
    return {"drafted": list(m.per_step_drafted), "accepted": list(m.per_step_accepted)}


_ids = iter(range(1 << 62))


def serve(llm, chunk: list, params) -> tuple[list[dict], list]:
    """Serve `chunk` (token-id prompts) at once through the engine's step loop: (every step: seconds, whether a
    request was still in prefill, whether all were decoding before it (none finished), whether it was a full round
    (decoding, and each emitted a token), tokens out, the contexts it saw), the final outputs in prompt order.
    With async scheduling (vLLM's default where the drafter allows it) a step's tokens may come out of the next
    call: a pass's round cost is therefore every decoding step's seconds over its full rounds."""
    from vllm.inputs import TokensPrompt

    engine = llm.llm_engine
    ids = [f"wb-{next(_ids)}" for _ in chunk]
    for rid, p in zip(ids, chunk):
        engine.add_request(rid, TokensPrompt(prompt_token_ids=p), params)
    emitted, finished, last, steps = dict.fromkeys(ids, 0), set(), {}, []
    while engine.has_unfinished_requests():
        before = dict(emitted)
        decoding = not finished and all(n >= 1 for n in before.values())
        t = time.perf_counter()
        outs = engine.step()
        seconds = time.perf_counter() - t
        for r in outs:
            if r.request_id in emitted:
                emitted[r.request_id] = len(r.outputs[0].token_ids)
                last[r.request_id] = r
                if r.finished:
                    finished.add(r.request_id)
        ctx = [len(p) + before[rid] for rid, p in zip(ids, chunk)]
        steps.append(dict(seconds=seconds, prefill=not all(n >= 1 for n in before.values()), decoding=decoding,
                          full=decoding and all(emitted[r] > before[r] for r in ids),
                          tokens=sum(emitted[r] - before[r] for r in ids), context_sum=sum(ctx),
                          context_min=min(ctx), context_max=max(ctx)))
    return steps, [last[rid].outputs[0] for rid in ids]


def start(req: dict, spec):
    from vllm import LLM

    t0 = time.perf_counter()
    say({"event": "progress", "text": f"starting vLLM ({'speculative ' + json.dumps(spec) if spec else 'plain'})"})
    llm = LLM(model=req["model"], tokenizer=req["model"], dtype="float32", max_model_len=req["max_model_len"],
              speculative_config=spec, enforce_eager=True, disable_log_stats=False, seed=0,
              max_num_seqs=max(req["batch_sizes"]), enable_prefix_caching=False,
              **({"per_request_spec_decode_metrics": "detailed"} if spec else {}))
    startup = time.perf_counter() - t0
    say({"event": "progress", "text": f"vLLM ready in {startup:.0f} s"})
    return llm, startup


def generate_runs(llm, req: dict) -> list[dict]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=req["max_new_tokens"],
                            stop_token_ids=req["stop_token_ids"], ignore_eos=False)
    prompts = req["prompts"]
    runs = []
    for b in req["batch_sizes"]:
        before = counters(llm)
        passes, outputs, steps = [], [], []
        for i in range(max(1, req.get("repeats", 1))):
            seconds = decode = 0.0
            for j in range(0, len(prompts), b):
                t = time.perf_counter()
                timed, outs = serve(llm, prompts[j:j + b], params)
                seconds += time.perf_counter() - t
                decode += sum(s["seconds"] for s in timed if not s["prefill"])
                if i == 0:
                    outputs += [list(o.token_ids) for o in outs]
                    steps += [per_step(o) for o in outs]
            passes.append(dict(seconds=seconds, decode_seconds=decode))
            if i == 0:
                after = counters(llm)
        delta = {k: after[k] - before[k] for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")}
        pos_b = before["accepted_per_pos"] + [0] * (len(after["accepted_per_pos"]) - len(before["accepted_per_pos"]))
        delta["accepted_per_pos"] = [a - p for a, p in zip(after["accepted_per_pos"], pos_b)]
        runs.append(dict(batch_size=b, seconds=passes[0]["seconds"], decode_seconds=passes[0]["decode_seconds"],
                         passes=passes, new_tokens=sum(map(len, outputs)), outputs=outputs, steps=steps, **delta))
        say({"event": "progress", "text": f"batch {b}: {runs[-1]['new_tokens']} tokens in "
                                          f"{', '.join('%.1f' % p['seconds'] for p in passes)} s"})
    return runs


def round_runs(llm, req: dict) -> list[dict]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=req["max_new_tokens"], ignore_eos=True)
    prompts, turn, runs = req["prompts"], 0, []
    for b in req["batch_sizes"]:
        passes = []
        for i in range(req["warmup"] + req["repeats"]):
            chunk = [prompts[(turn + j) % len(prompts)] for j in range(b)]  # taken in turn across batch sizes
            turn += b
            steps, _ = serve(llm, chunk, params)
            passes.append(dict(timed=i >= req["warmup"], rounds=[{k: v for k, v in s.items() if k not in
                                                                   ("prefill", "decoding")}
                                                                  for s in steps if s["decoding"]]))
        rounds = [r for p in passes if p["timed"] for r in p["rounds"]]
        ms = 1000 * sum(r["seconds"] for r in rounds) / max(sum(r["full"] for r in rounds), 1)
        say({"event": "progress", "text": f"batch {b}: {len(rounds)} rounds, {ms:.1f} ms each"})
        runs.append(dict(batch_size=b, passes=passes))
    return runs


def versions() -> dict:
    import torch
    from importlib import metadata

    return {"threads": torch.get_num_threads(), "torch": torch.__version__.split("+")[0],
            "transformers": metadata.version("transformers")}


def async_scheduling(llm) -> bool | None:
    try:
        return bool(llm.llm_engine.vllm_config.scheduler_config.async_scheduling)
    except AttributeError:
        return None


def main() -> int:
    req = json.loads(sys.stdin.read())
    import vllm
    from vllm import SamplingParams

    for i, spec in enumerate(req["engines"]):
        llm, startup = start(req, spec)
        llm.generate([{"prompt_token_ids": req["prompts"][0]}], SamplingParams(temperature=0.0, max_tokens=2),
                     use_tqdm=False)  # warm-up
        runs = round_runs(llm, req) if req.get("mode") == "rounds" else generate_runs(llm, req)
        say({"event": "result", "engine": i, "vllm_version": vllm.__version__, "startup_s": startup,
             "worker": versions() | {"async_scheduling": async_scheduling(llm)}, "runs": runs})
        del llm
        gc.collect()
    say({"event": "done"})
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # the orchestrator turns this into one error line
        say({"event": "error", "text": f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"})
        sys.exit(1)
