"""vLLM's measured speed in `workbench vllm-check`, beside a plan's prediction: per (K, batch size) the speedup of
each K over plain vLLM with its spread over repeated passes, and per batch size the plan's choice predicted vs
measured, with vLLM's measured best K.

The measured speedup is the decoding phase's (each pass's plain decode seconds over its speculative ones: the steps
with no prefill in them, what the plan's speedup predicts, as sweep_file.checked_speedup takes ours; a steady run,
B kept in flight, its busy steps' tokens per second: vllm_worker.serve_steady); the end-to-end tokens/s ratio
(prefill included) is kept beside it. Noise: pass i of K against pass i of plain, the spread over
passes (core.speed.spread); two rows are within noise when their interquartile ranges overlap.
"""
from __future__ import annotations

from workbench.core.notes import FieldError
from workbench.core.speed import prediction_error, spread, within_noise
from workbench.export.vllm import served_ks
from workbench.plan.plan_file import plan_engine


def surface_prompts(plan: dict | None) -> list[str]:
    """The prompt ids the plan's latency surface was served on (a vLLM surface records them in its setting)."""
    where = ((plan or {}).get("latency") or {}).get("setting") or {}
    ids = where.get("prompt_ids") if isinstance(where, dict) else None
    return [str(i) for i in ids] if isinstance(ids, list) else []


def priced_on(plan: dict) -> dict:
    """What the plan was priced on: engine, version, latency file and its mode."""
    engine, version = plan_engine(plan)
    lat = plan.get("latency") or {}
    return dict(engine=engine, engine_version=version, file=lat.get("file"), mode=lat.get("mode"))


def plan_predictions(plan: dict | None) -> dict[int, dict[int, dict]]:
    """{batch size: {K: the plan's chain row (k, predicted_speedup, speedup_range, ...)}} from its alternatives'
    chains (K = 0: none, 1x); a plan without them (older) gives its choice's row only, when that is a chain or none."""
    out: dict[int, dict[int, dict]] = {}
    for row, alt in zip((plan or {}).get("plans") or [], (plan or {}).get("alternatives") or []):
        chains = alt.get("chains") if isinstance(alt, dict) else None
        if chains:
            out[row["batch_size"]] = {int(c["k"]): c for c in chains}
        elif row["kind"] != "tree":
            out[row["batch_size"]] = {row["nodes"]: dict(k=row["nodes"], predicted_speedup=row["predicted_speedup"],
                                                         speedup_range=None)}
    return out


def _pass_speedups(spec: dict, plain: dict) -> list[float]:
    """Decoding-phase speedup of each pass (pass i of K against pass i of plain); [] for a run without passes.
    A steady run (vllm_worker.serve_steady) divides the tokens of its busy steps by their seconds: goodput at B in
    flight, what a plan's speedup predicts; a run served B at a time to the end, every answer's tokens."""
    pairs = zip(spec.get("passes") or [], plain.get("passes") or [])

    def rate(run: dict, p: dict) -> float | None:
        tokens = p.get("decode_tokens") if run.get("steady") else run["new_tokens"]
        return tokens / p["decode_seconds"] if tokens and p.get("decode_seconds") else None
    rates = [(rate(spec, s), rate(plain, p)) for s, p in pairs]
    return [a / b for a, b in rates if a and b]


def speed_rows(k: int, batch_sizes, runs: dict, plain: dict, plan_k: dict, plan: dict | None) -> list[dict]:
    """One row per batch size for the engine of K: tokens/s, the end-to-end speedup (pass 0), the decoding
    phase's median and quartiles over passes, and the plan's prediction for this K at this batch size."""
    predicted = plan_predictions(plan)
    out = []
    for b in batch_sizes:
        s, p = runs[b], plain[b]
        rate, base = (r.get("served_tokens", r["new_tokens"]) / r["seconds"] for r in (s, p))
        ratios = _pass_speedups(s, p)
        sp = spread(ratios) if ratios else None
        out.append(dict(k=k, batch_size=b, plan_k=plan_k.get(b), tokens_per_s=rate, plain_tokens_per_s=base,
                        speedup=rate / base, decode_speedup=sp and sp["median"],
                        decode_speedup_q1=sp and sp["q1"], decode_speedup_q3=sp and sp["q3"],
                        passes=len(ratios), **_predicted(predicted, b, k)))
    return out


def _predicted(predicted: dict, b: int, k: int) -> dict:
    """A speed row's predicted columns from plan_predictions: the plan's speedup for K at batch b and its range."""
    pred = (predicted.get(b) or {}).get(k)
    return dict(predicted_speedup=pred and pred["predicted_speedup"],
                predicted_range=pred and pred.get("speedup_range"))


def _measured(rows: list[dict], b: int, k: int) -> tuple[float, tuple[float, float]] | None:
    """(median, (q1, q3)) of vLLM's decoding-phase speedup of K at batch b; K = 0 is plain vLLM itself: 1."""
    if k == 0:
        return 1.0, (1.0, 1.0)
    r = next((r for r in rows if r["batch_size"] == b and r["k"] == k and r.get("decode_speedup")), None)
    return None if r is None else (r["decode_speedup"], (r["decode_speedup_q1"], r["decode_speedup_q3"]))


def plan_rows(plan: dict, plan_k: dict, rows: list[dict]) -> list[dict]:
    """Per batch size: the plan's K and predicted speedup beside vLLM's measured one (error = predicted / measured
    - 1), vLLM's measured best K and whether the plan's choice is within that row's noise of it."""
    predicted = plan_predictions(plan)
    out = []
    for b, k in sorted(plan_k.items()):
        got, pred = _measured(rows, b, k), (predicted.get(b) or {}).get(k)
        ks = [0] + sorted({r["k"] for r in rows if r["batch_size"] == b})
        measured = {kk: m for kk in ks if (m := _measured(rows, b, kk)) is not None}
        best = max(measured, key=lambda kk: (measured[kk][0], -kk))
        p = pred["predicted_speedup"] if pred else (1.0 if k == 0 else None)
        out.append(dict(batch_size=b, plan_k=k, predicted_speedup=p, measured_speedup=got and got[0],
                        measured_range=got and list(got[1]),
                        error=None if p is None or got is None else prediction_error(p, got[0]),
                        best_k=best, best_speedup=measured[best][0],
                        choice_is_best_or_within_noise=best == k or bool(got and within_noise(got[1],
                                                                                                measured[best][1]))))
    return out


def repriced(res: dict, plan: dict) -> dict:
    """A finished check against another plan's predictions (a surface measured again): vLLM's speeds do not depend
    on the plan, so its predicted columns, the plan's K per batch size (vllm.served_ks, as the check chose them) and
    the plan rows are what change. Refused when the plan's surface was served on one of the check's prompts or asks
    for a K the check did not run."""
    overlap = sorted(set(map(str, res.get("prompt_ids") or [])) & set(surface_prompts(plan)))
    if overlap:
        raise FieldError("plan", "surface_prompts", f"the plan's surface was served on prompt(s) {', '.join(overlap)} "
                         "the check measured: run vllm-check {field} again so that its prompts are other ones")
    plan_k = served_ks(plan, sorted({s["batch_size"] for s in res["speed"]}))
    ran = {(s["batch_size"], s["k"]) for s in res["speed"]}
    missing = [f"K = {k} at batch {b}" for b, k in sorted(plan_k.items()) if k and (b, k) not in ran]
    if missing:
        raise FieldError("plan", "not_run", f"the check did not run {', '.join(missing)}: run vllm-check {{field}} "
                         "with that plan")
    predicted = plan_predictions(plan)
    speed = [dict(s, plan_k=plan_k.get(s["batch_size"]), **_predicted(predicted, s["batch_size"], s["k"]))
             for s in res["speed"]]
    return dict(res, plan=plan_k, speed=speed, plan_check=plan_rows(plan, plan_k, speed), priced_on=priced_on(plan))


def _x(v) -> str:
    return "-" if v is None else f"{v:.3f}"


def speed_table(res: dict, extra: tuple[list[str], dict] | None = None) -> list[str]:
    """The markdown lines of a check's speeds (older results: the columns they lack are '-'); `extra`: (headers,
    {(batch, K): cells}) columns appended to both tables (a served check's miss split), '-' where a row has none."""
    heads, cells = extra or ([], {})

    def more(b: int, k: int) -> str:
        return "".join(f" {c} |" for c in cells.get((b, k), ["-"] * len(heads)))
    add, rule = "".join(f" {h} |" for h in heads), "---|" * len(heads)
    lines = ["| K | batch | vLLM tokens/s | plain vLLM tokens/s | speedup (end to end) | decoding speedup, median "
             "(q1..q3) | predicted | plan's K |" + add, "|---|---|---|---|---|---|---|---|" + rule]
    for s in res["speed"]:
        dec = s.get("decode_speedup")
        rng = f" ({s['decode_speedup_q1']:.3f}..{s['decode_speedup_q3']:.3f}, {s['passes']} passes)" if dec else ""
        lines.append(f"| {s['k']} | {s['batch_size']} | {s['tokens_per_s']:.1f} | {s['plain_tokens_per_s']:.1f} | "
                     f"{s['speedup']:.3f} | {_x(dec)}{rng} | {_x(s.get('predicted_speedup'))} | "
                     f"{'' if s['plan_k'] is None else s['plan_k']} |" + more(s["batch_size"], s["k"]))
    if res.get("plan_check"):
        on = res.get("priced_on") or {}
        lines += ["", f"The plan (priced on {on.get('engine')} {on.get('engine_version') or ''} steps, "
                      f"{on.get('file')}) against vLLM's decoding-phase speedup, on prompts other than the surface's "
                      f"({res.get('surface_prompts_left_out', 0)} left out):", "",
                  "| batch | plan's K | predicted | measured (q1..q3) | predicted vs measured | vLLM's best K "
                  "(measured) | plan's K best or within noise |" + add, "|---|---|---|---|---|---|---|" + rule]
        for r in res["plan_check"]:
            rng = r["measured_range"]
            lines.append(f"| {r['batch_size']} | {r['plan_k']} | {_x(r['predicted_speedup'])} | "
                         f"{_x(r['measured_speedup'])}" + (f" ({rng[0]:.3f}..{rng[1]:.3f})" if rng else "") + " | "
                         + ("-" if r["error"] is None else f"{100 * r['error']:+.1f}%")
                         + f" | {r['best_k']} ({r['best_speedup']:.3f}) | "
                         f"{'yes' if r['choice_is_best_or_within_noise'] else 'no'} |"
                         + more(r["batch_size"], r["plan_k"]))
    return lines
