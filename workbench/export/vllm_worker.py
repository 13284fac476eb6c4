"""Run one vLLM engine for `workbench vllm-check`, inside vLLM's own environment (its own torch and transformers).

Standalone on purpose: run as `VLLM_PYTHON workbench/export/vllm_worker.py`, it imports vLLM and nothing of the workbench.
Protocol: one JSON request on stdin; JSON lines on stdout, {"event": "progress", "text"} while it runs and one
{"event": "result", ...} (or {"event": "error", "text"}) at the end. Request:
  {"model": DIR, "engines": [{...} | null, ...], "prompts": [[ids], ...], "batch_sizes": [1, 4],
   "max_new_tokens": N, "stop_token_ids": [...], "max_model_len": N}
One engine after another (each `engines` entry is a --speculative-config, null for plain decoding), one result
line each: {"event": "result", "engine": i, "vllm_version", "startup_s", "runs": [...]}, then {"event": "done"}.
Runs, per batch size B (the prompts generated B at a time, as the workbench decoder batches them):
  {"batch_size", "seconds", "new_tokens", "outputs": [[ids], ...], "num_drafts", "num_draft_tokens",
   "num_accepted_tokens", "accepted_per_pos": [...]}  (spec-decode counters: deltas of LLM.get_metrics())
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


def run_engine(req: dict, spec) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    t0 = time.perf_counter()
    say({"event": "progress", "text": f"starting vLLM ({'speculative ' + json.dumps(spec) if spec else 'plain'})"})
    llm = LLM(model=req["model"], tokenizer=req["model"], dtype="float32", max_model_len=req["max_model_len"],
              speculative_config=spec, enforce_eager=True, disable_log_stats=False, seed=0,
              max_num_seqs=max(req["batch_sizes"]), enable_prefix_caching=False,
              **({"per_request_spec_decode_metrics": "detailed"} if spec else {}))
    startup = time.perf_counter() - t0
    say({"event": "progress", "text": f"vLLM ready in {startup:.0f} s"})
    params = SamplingParams(temperature=0.0, max_tokens=req["max_new_tokens"],
                            stop_token_ids=req["stop_token_ids"], ignore_eos=False)
    prompts = [TokensPrompt(prompt_token_ids=p) for p in req["prompts"]]
    llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False)  # warm-up
    runs = []
    for b in req["batch_sizes"]:
        before = counters(llm)
        outputs, steps, seconds = [], [], 0.0
        for i in range(0, len(prompts), b):
            t = time.perf_counter()
            res = llm.generate(prompts[i:i + b], params, use_tqdm=False)
            seconds += time.perf_counter() - t
            outputs += [list(r.outputs[0].token_ids) for r in res]
            steps += [per_step(r.outputs[0]) for r in res]
        after = counters(llm)
        delta = {k: after[k] - before[k] for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")}
        pos_b = before["accepted_per_pos"] + [0] * (len(after["accepted_per_pos"]) - len(before["accepted_per_pos"]))
        delta["accepted_per_pos"] = [a - p for a, p in zip(after["accepted_per_pos"], pos_b)]
        runs.append(dict(batch_size=b, seconds=seconds, new_tokens=sum(map(len, outputs)), outputs=outputs,
                         steps=steps, **delta))
        say({"event": "progress", "text": f"batch {b}: {runs[-1]['new_tokens']} tokens in {seconds:.1f} s"})
    del llm
    gc.collect()
    return {"startup_s": startup, "runs": runs}


def main() -> int:
    req = json.loads(sys.stdin.read())
    import vllm

    for i, spec in enumerate(req["engines"]):
        say({"event": "result", "engine": i, "vllm_version": vllm.__version__} | run_engine(req, spec))
    say({"event": "done"})
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # the orchestrator turns this into one error line
        say({"event": "error", "text": f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"})
        sys.exit(1)
