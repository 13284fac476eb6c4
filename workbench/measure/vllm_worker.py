"""Run vLLM engines for `workbench vllm-check` and `workbench latency --engine vllm`, inside vLLM's own environment
(its own torch and transformers).

Standalone on purpose: run as `VLLM_PYTHON workbench/measure/vllm_worker.py`, it imports vLLM and nothing of the
workbench. Protocol: one JSON request on stdin; JSON lines on stdout, {"event": "progress", "text"} while it runs,
one {"event": "batch", "batch_size": B, "engines": [{"vllm_version", "startup_s", "worker": {threads, torch,
transformers, async_scheduling}, "run"}, ...]} per batch size (each `engines` entry of the request is a
--speculative-config, null for plain decoding), then {"event": "done"}; or {"event": "error", "text"}. Request:
  {"mode": "generate" | "rounds", "model": DIR, "engines": [...], "prompts": [[ids], ...], "batch_sizes": [1, 4],
   "max_new_tokens": N, "max_model_len": N, "repeats": R, "warmup": W, "stop_token_ids": [...] (generate),
   "sequences": S (rounds), "eager": false (true: vLLM's enforce_eager; by default vLLM serves its compiled model)}
Every engine is held at once and their passes interleave (`interleaved`): what is compared is measured side by
side. Every request is served through the engine's own step loop (LLMEngine.add_request / step), so each step's
wall time is what a served round costs. A run, per engine at batch size B:
  generate (vllm-check; the prompts served B at a time, as the workbench decoder batches them, stopping at EOS,
  `repeats` passes over all of them; with "between": true, after each pass of every engine an {"event": "pass",
  "batch_size", "pass"} line, then it waits for a line on stdin; with "steady": true, as a server under steady
  load instead: max(prompts, 2B) sequences, the prompts taken in turn, B kept in flight (`serve_steady`), the
  decoding measured over the steps in which all B were decoding): {"batch_size", "seconds" (pass 0),
  "decode_seconds" (pass 0, the steps without a prefill in them; steady: the busy steps), "passes": [{"seconds",
  "decode_seconds", "decode_tokens"}, ...], "steady", "served_tokens" (every sequence's), "new_tokens", "outputs",
  "steps" (per-request drafts per step), "num_drafts", "num_draft_tokens", "num_accepted_tokens",
  "accepted_per_pos"} (vLLM's spec-decode counters over pass 0, from its per-request records: `counted`; outputs,
  steps and counts: each prompt's first sequence);
  rounds (latency --engine vllm; `warmup` passes of one chunk of B prompts, then `repeats` passes of
  ceil(`sequences` / B) chunks (default one), each chunk served to max_new_tokens with EOS ignored, the prompts
  taken in turn, the same ones for every engine; a timed pass serves about as many sequences at every batch size,
  so a batch-1 pass is not one prompt's few seconds): {"batch_size", "passes": [{"timed", "rounds": [{"seconds",
  "full", "tokens", "context_sum", "context_min", "context_max"}, ...]}]}: every step in which all B requests of a
  chunk were decoding (none finished), `full` where each of them emitted a token (a round).
"""
import json
import os
import sys
import time

# Run as a script, this folder is first on sys.path: a sibling module would shadow a package vLLM imports (a
# measure/requests.py once hid `requests`). The worker imports nothing of ours, so the folder goes.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]


def say(obj) -> None:
    print(json.dumps(obj), flush=True)


def counted(steps: list) -> dict:
    """vLLM's spec-decode counters (vllm:spec_decode_*: drafts, draft tokens, accepted tokens, accepted per
    position) summed from its per-request records (`per_step`), which feed the same counts: LLM.get_metrics() reads
    one process-wide registry that only the engine made last reports to, and every engine here is alive at once."""
    out = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "accepted_per_pos": []}
    for seq in filter(None, steps):
        for drafted, accepted in zip(seq["drafted"], seq["accepted"]):
            if drafted:
                out["num_drafts"] += 1
                out["num_draft_tokens"] += drafted
                out["num_accepted_tokens"] += accepted
                pos = out["accepted_per_pos"]
                pos += [0] * (drafted - len(pos))
                for i in range(accepted):
                    pos[i] += 1
    return out


def per_step(output) -> dict | None:
    """One sequence's verify steps as vLLM's scheduler saw them (per-request metrics, 'detailed'): drafts
    proposed and accepted per step, in order; None for plain decoding."""
    m = getattr(output, "spec_decode_metrics", None)
    if m is None:
        return None
    return {"drafted": list(m.per_step_drafted), "accepted": list(m.per_step_accepted)}


_ids = iter(range(1 << 62))


def timed_step(engine, emitted: dict) -> tuple[float, list]:
    """One engine step, timed: its seconds and the outputs of the requests in `emitted` (ours; another engine in the
    process may share the loop), whose tokens-so-far it updates."""
    t = time.perf_counter()
    outs = engine.step()
    seconds = time.perf_counter() - t
    ours = [r for r in outs if r.request_id in emitted]
    for r in ours:
        emitted[r.request_id] = len(r.outputs[0].token_ids)
    return seconds, ours


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
        seconds, outs = timed_step(engine, emitted)
        for r in outs:
            last[r.request_id] = r
            if r.finished:
                finished.add(r.request_id)
        ctx = [len(p) + before[rid] for rid, p in zip(ids, chunk)]
        steps.append(dict(seconds=seconds, prefill=not all(n >= 1 for n in before.values()), decoding=decoding,
                          full=decoding and all(emitted[r] > before[r] for r in ids),
                          tokens=sum(emitted[r] - before[r] for r in ids), context_sum=sum(ctx),
                          context_min=min(ctx), context_max=max(ctx)))
    return steps, [last[rid].outputs[0] for rid in ids]


def serve_steady(llm, prompts: list, b: int, n: int, params) -> tuple[list[dict], list]:
    """Serve `n` sequences (prompt j % len(prompts) for sequence j) keeping `b` in flight, as a server under steady
    load at batch b: one that finishes is replaced by the next before the following step. Every step: its seconds,
    tokens out and whether it was `busy` (b requests in flight before it, each past its prefill): the steady state
    a plan prices (the surface's rounds: every slot decoding), not a newcomer's prefill nor the ragged tail once
    the queue is empty, where a drafter that lets requests finish at different steps runs under-full. The outputs
    of sequences 0..len(prompts)-1 (each prompt once), in prompt order."""
    from vllm.inputs import TokensPrompt

    engine = llm.llm_engine
    queue, active, emitted, done, steps = list(range(n)), {}, {}, {}, []
    while queue or engine.has_unfinished_requests():
        while queue and len(active) < b:
            j = queue.pop(0)
            rid = f"wb-{next(_ids)}"
            engine.add_request(rid, TokensPrompt(prompt_token_ids=prompts[j % len(prompts)]), params)
            active[rid], emitted[rid] = j, 0
        before = {r: emitted[r] for r in active}
        busy = len(active) == b and all(v >= 1 for v in before.values())
        seconds, outs = timed_step(engine, emitted)
        for r in outs:
            if r.finished and r.request_id in active:
                done[active.pop(r.request_id)] = r.outputs[0]
        steps.append(dict(seconds=seconds, busy=busy, tokens=sum(emitted[r] - v for r, v in before.items())))
    return steps, [done[j] for j in range(min(n, len(prompts)))]


def start(req: dict, spec, engines: int = 1):
    """One engine (startup seconds beside it). Several share one GPU: each gets its part of the memory."""
    import torch
    from vllm import LLM

    t0 = time.perf_counter()
    say({"event": "progress", "text": f"starting vLLM ({'speculative ' + json.dumps(spec) if spec else 'plain'})"})
    llm = LLM(model=req["model"], tokenizer=req["model"], dtype="float32", max_model_len=req["max_model_len"],
              speculative_config=spec, enforce_eager=bool(req.get("eager")), disable_log_stats=False, seed=0,
              max_num_seqs=max(req["batch_sizes"]), enable_prefix_caching=False,
              **({"per_request_spec_decode_metrics": "detailed"} if spec else {}),
              **({"gpu_memory_utilization": 0.85 / engines} if torch.cuda.is_available() else {}))
    startup = time.perf_counter() - t0
    say({"event": "progress", "text": f"vLLM ready in {startup:.0f} s"})
    return llm, startup


def generate_pass(llm, prompts: list, b: int, params, first: bool, steady: bool = False) -> dict:
    """One pass over every prompt, B at a time (`steady`: B kept in flight, serve_steady): its seconds and
    decoding-phase seconds and tokens; the first pass also keeps the outputs, per-request steps and the spec-decode
    counters they add up to."""
    if steady:
        t = time.perf_counter()
        timed, outs = serve_steady(llm, prompts, b, max(len(prompts), 2 * b), params)
        seconds = time.perf_counter() - t
        busy = [s for s in timed if s["busy"]]
        done = dict(seconds=seconds, decode_seconds=sum(s["seconds"] for s in busy),
                    decode_tokens=sum(s["tokens"] for s in busy), served_tokens=sum(s["tokens"] for s in timed))
        outputs, steps = [list(o.token_ids) for o in outs], [per_step(o) for o in outs]
        return done | (dict(outputs=outputs, steps=steps, **counted(steps)) if first else {})
    seconds = decode = 0.0
    outputs, steps, tokens = [], [], 0
    for j in range(0, len(prompts), b):
        t = time.perf_counter()
        timed, outs = serve(llm, prompts[j:j + b], params)
        seconds += time.perf_counter() - t
        decode += sum(s["seconds"] for s in timed if not s["prefill"])
        tokens += sum(s["tokens"] for s in timed if not s["prefill"])
        outputs += [list(o.token_ids) for o in outs]
        steps += [per_step(o) for o in outs]
    done = dict(seconds=seconds, decode_seconds=decode, decode_tokens=tokens)
    return done | (dict(outputs=outputs, steps=steps, **counted(steps)) if first else {})


def generate_run(first: dict, passes: list[dict], b: int, steady: bool = False) -> dict:
    return dict(batch_size=b, seconds=first["seconds"], decode_seconds=first["decode_seconds"],
                passes=[{k: p[k] for k in ("seconds", "decode_seconds", "decode_tokens")} for p in passes],
                new_tokens=sum(map(len, first["outputs"])), outputs=first["outputs"], steps=first["steps"],
                **({"steady": True, "served_tokens": first["served_tokens"]} if steady else {}),
                **{k: first[k] for k in ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "accepted_per_pos")})


def round_pass(llm, chunks: list, params, timed: bool) -> dict:
    """One pass: each chunk (B prompts) served to the end in turn, the decoding steps of all of them."""
    rounds = []
    for chunk in chunks:
        steps, _ = serve(llm, chunk, params)
        rounds += [{k: v for k, v in s.items() if k not in ("prefill", "decoding")} for s in steps if s["decoding"]]
    return dict(timed=timed, rounds=rounds)


def interleaved(llms: list, req: dict, b: int) -> list[dict]:
    """Every engine's run at batch size B, pass by pass: pass i of every engine before pass i + 1 of any, in an
    order that turns each pass (0, 1, .. then .., 1, 0), so a drift of the machine's speed over minutes lands on
    every K alike and each pass's ratio to plain is measured side by side (engine after engine, a drift of ~20%
    over a few minutes on a shared 2-core VM priced K = 1 at 1.8x plain where side by side it was 1.2x)."""
    from vllm import SamplingParams

    n = len(llms)
    if req.get("mode") == "rounds":
        params = SamplingParams(temperature=0.0, max_tokens=req["max_new_tokens"], ignore_eos=True)
        prompts, passes, served = req["prompts"], [[] for _ in llms], 0
        for i in range(req["warmup"] + req["repeats"]):
            timed = i >= req["warmup"]
            count = -(-req.get("sequences", b) // b) if timed else 1  # chunks: as many sequences at every B
            chunks = [[prompts[(served + c * b + j) % len(prompts)] for j in range(b)] for c in range(count)]
            served += count * b  # the same prompts for every K, the next ones for the next pass
            for e in (range(n) if i % 2 == 0 else reversed(range(n))):
                passes[e].append(round_pass(llms[e], chunks, params, timed))
        for e in range(n):
            say_rounds(b, passes[e])
        return [dict(batch_size=b, passes=p) for p in passes]
    params = SamplingParams(temperature=0.0, max_tokens=req["max_new_tokens"],
                            stop_token_ids=req["stop_token_ids"], ignore_eos=False)
    passes, steady = [[] for _ in llms], bool(req.get("steady"))
    for i in range(max(1, req.get("repeats", 1))):
        for e in (range(n) if i % 2 == 0 else reversed(range(n))):
            passes[e].append(generate_pass(llms[e], req["prompts"], b, params, i == 0, steady))
        if req.get("between"):  # the orchestrator runs its own pass now (our decoder, side by side), then a line
            say({"event": "pass", "batch_size": b, "pass": i})
            sys.stdin.readline()
    runs = [generate_run(p[0], p, b, steady) for p in passes]
    for r in runs:
        say({"event": "progress", "text": f"batch {b}: {r['new_tokens']} tokens in "
                                          f"{', '.join('%.1f' % p['seconds'] for p in r['passes'])} s"})
    return runs


def say_rounds(b: int, passes: list[dict]) -> None:
    rounds = [r for p in passes if p["timed"] for r in p["rounds"]]
    ms = 1000 * sum(r["seconds"] for r in rounds) / max(sum(r["full"] for r in rounds), 1)
    say({"event": "progress", "text": f"batch {b}: {len(rounds)} rounds, {ms:.1f} ms each"})


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


def compilation(llm) -> str | None:
    """vLLM's compilation mode as it serves (NONE under enforce_eager; on CPU by default DYNAMO_TRACE_ONCE, inductor)."""
    try:
        return llm.llm_engine.vllm_config.compilation_config.mode.name
    except AttributeError:
        return None


def main() -> int:
    req = json.loads(sys.stdin.readline())  # one line; with "between", a line after each pass says go on
    import vllm

    from vllm import SamplingParams
    engines = []  # every engine at once: passes interleave across them (interleaved)
    for spec in req["engines"]:
        llm, startup = start(req, spec, len(req["engines"]))
        llm.generate([{"prompt_token_ids": req["prompts"][0]}], SamplingParams(temperature=0.0, max_tokens=2),
                     use_tqdm=False)  # warm-up
        engines.append(dict(llm=llm, vllm_version=vllm.__version__, startup_s=startup,
                            worker=versions() | {"async_scheduling": async_scheduling(llm),
                                                     "compilation": compilation(llm)}))
    for b in req["batch_sizes"]:
        runs = interleaved([e["llm"] for e in engines], req, b)
        say({"event": "batch", "batch_size": b, "engines": [
            {k: v for k, v in e.items() if k != "llm"} | {"run": r} for e, r in zip(engines, runs)]})
    say({"event": "done"})
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # the orchestrator turns this into one error line
        say({"event": "error", "text": f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"})
        sys.exit(1)
