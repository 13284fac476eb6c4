"""Predicted beside measured: for the top candidates of `workbench plan` at each batch size, the plan's predicted
speedup and tokens/step next to what the live decoder measures on held-out prompts, with spreads, in one run.

    python bench/prediction.py --limit 4 --max-new-tokens 16                    # quick check on the demo
    python bench/prediction.py --latency calibration/X/latency-cpu.csv --limit 64 --repeats 3 --threads 2
    python bench/prediction.py --batch-sizes 1,2,4,8 --repeats 3,3,3,6   # more passes where steps are noisier
    python bench/prediction.py --latency docs/results/latency-dynamic-cpu.csv --batch-sizes 1,2,4 --top 2 \
        --dynamic-top 2 --limit 16 --max-new-tokens 48 --out bench/results/prediction-dynamic-cpu.json
                                        # a table with per-step rows (latency --envelope): per-step trees too

Where the latency table timed per-step trees (`workbench latency --envelope`), plan's best --dynamic-top per-step
trees are measured beside its static candidates (decoded as `decode --dynamic N --tree ENVELOPE` runs them, their
replay over the heads' recorded log-probs), plan's choice is starred, and per batch size the table says whether plan
picks a per-step tree exactly where one measures faster than everything else (issue 51).

Prediction: `plan` itself (source.calibration_source + weigh.weigh: the calibration's replay over its held-out answers cut
to --max-new-tokens, and speedup = tokens/step / (t(n+1)/t(1)) from the latency table, with its range over the
latency quartiles). `replay_these` is the replay over the answers of exactly the prompts decoded here: a lossless
greedy decoder must measure it (it separates the prompt sample from the model). Measurement: at every batch size the
held-out prompts are decoded B at a time, vanilla greedy and then every candidate on the same batch back to back
(a load change hits them alike; one vanilla pass serves all candidates); one repeat = one pass over the prompts;
every quantity from speed.py, its spread over repeats.
The speedup compared is the decoding phase's (speed.decode_speedup: what plan predicts; the prefill is the same
work for both methods); the end-to-end one (prefill included) and the prefill's share stand beside it, with the
two parts of every prediction: the batch's tokens/step (it waits for its slowest sequence) and the step's cost over
vanilla's (t(n+1)/t(1) of the latency table, measured: speed.overhead), each predicted and measured.
Writes a table (stdout) and JSON (--out) with the setting of this run and of the latency table, and says loudly
when they differ.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workbench import WorkbenchError  # noqa: E402
from workbench.calibrate.folder import Calibration, default_calibration, list_calibrations  # noqa: E402
from workbench.calibrate.ranks import answer_rows, decoder_walk, walk_answers  # noqa: E402
from workbench.cli.shared import parse_ints, ScriptParser, run_script  # noqa: E402
from workbench.core.io import atomic_write_json  # noqa: E402
from workbench.core.provenance import describe, load_average, loaded, mismatch_warning, without_load  # noqa: E402
from workbench.measure.latency import measured_setting  # noqa: E402
from workbench.core.speed import (batch_tokens_per_step, decode_speedup, measured_speedup, overhead,  # noqa: E402
                                  prediction_error, prefill_share, spread, tokens_per_step, within_noise)
from workbench.core.work import WorkState, remove_work  # noqa: E402
from workbench.plan.source import calibration_source  # noqa: E402
from workbench.plan.surface import Surface  # noqa: E402
from workbench.plan.weigh import weigh  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "prediction.json"
MEASURED = {"speedup": decode_speedup, "end_to_end_speedup": measured_speedup,
            "tokens_per_step": lambda m, v: tokens_per_step(m),
            "batch_tokens_per_step": lambda m, v: batch_tokens_per_step(m),
            "step_ratio": overhead, "prefill_share": lambda m, v: prefill_share(v)}


def plan_top(cal: Calibration, surface: Surface, batch_sizes, top: int, max_new_tokens: int | None,
             dynamic_top: int = 3) -> tuple[dict, dict]:
    """({batch: what is measured there: plan's `top` best static trees and chains and, where the table timed per-step
    trees (`latency --envelope`), its `dynamic_top` best of those, each marked "chosen" if it is plan's choice},
    the source's info with plan's choice per batch size)."""
    src = calibration_source(cal, "replay", max_new_tokens=max_new_tokens)
    ctx = surface.context(batch_sizes, None, src.typical_context)
    out, chosen, dyn_info = {}, {}, None
    for b in batch_sizes:
        pick = weigh(src, surface, b, ctx, dynamic=True, among=batch_sizes)
        best, dyn_info = pick.best, pick.dynamic
        chosen[b] = "none" if best.kind == "none" else best.tree.name
        spec = [c for c in pick.ranked if c.kind not in ("none", "dynamic")][:top]
        spec += [c for c in pick.ranked if c.kind == "dynamic"][:dynamic_top]
        out[b] = [dict(vars(c), chosen=c is best) for c in spec]
    return out, dict(src.info, context=ctx, dynamic=dyn_info, chosen=chosen)


def measure(model, heads, tok, prompts, picks: dict, max_new_tokens: int, repeats: dict, engine,
            progress=print, state=None) -> dict:
    """{batch: {tree name: {quantity: [per repeat]}}}, every number speed.py's: the decoding phase's speedup (what
    plan predicts), the end-to-end one (prefill included), each sequence's and the whole batch's tokens/step, the
    step's cost over vanilla's (overhead) and vanilla's prefill share; `repeats` is {batch: passes}. `state`
    (work.WorkState): each finished batch size is kept, so a killed run rerun measures only the batch sizes it had
    not finished."""
    out = {}
    for b, top in picks.items():
        if state is not None and state.get(f"batch-{b}") is not None:
            progress(f"batch {b}: kept from the killed run")
        measure_one = lambda: measure_batch(model, heads, tok, prompts, b, top, max_new_tokens,  # noqa: E731
                                            repeats[b], engine, progress)
        out[b] = measure_one() if state is None else state.piece(f"batch-{b}", measure_one)
    return out


def measure_batch(model, heads, tok, prompts, b: int, top: list[dict], max_new_tokens: int, repeats: int, engine,
                  progress=print) -> dict:
    """{tree name: {quantity: [per repeat]}} at batch size b for plan's candidates `top` (measure_specs)."""
    from workbench.runtime.treemask import tree_setup

    specs = {c["tree"].name: c["tree"] if c["kind"] == "dynamic" else tree_setup(c["tree"], model) for c in top}
    return measure_specs(model, heads, tok, prompts, b, specs, max_new_tokens, repeats, engine, progress)


def measure_specs(model, heads, tok, prompts, b: int, specs: dict, max_new_tokens: int, repeats: int, engine,
                  progress=print) -> dict:
    """{name: {quantity: [per repeat]}} at batch size b for `specs` ({name: TreeBuffers or a per-step
    DynamicPolicy}): the prompts decoded b at a time (full batches only), vanilla and then every spec on the same
    batch back to back (a load change hits them alike); every shape warmed up first."""
    import torch

    from workbench.decode.loop import medusa_generate, vanilla_generate

    with torch.inference_mode():
        chunks = [prompts[i:i + b] for i in range(0, len(prompts) - b + 1, b)]
        vanilla_generate(model, tok, chunks[0], 2, engine=engine)  # warm-up of every shape
        for spec in specs.values():
            medusa_generate(model, heads, tok, chunks[0], spec, 2, engine=engine)
        got = {name: {q: [] for q in MEASURED} for name in specs}
        for r in range(repeats):
            van, med = [], {name: [] for name in specs}
            for chunk in chunks:
                van.append(vanilla_generate(model, tok, chunk, max_new_tokens, engine=engine))
                for name, spec in specs.items():
                    med[name].append(medusa_generate(model, heads, tok, chunk, spec, max_new_tokens, engine=engine))
            for name in specs:
                for q, fn in MEASURED.items():
                    got[name][q].append(fn(med[name], van))
            progress(f"batch {b}: repeat {r + 1}/{repeats} done")
    return got


def rows_of(picks: dict, measured: dict, cal: Calibration, prompt_ids, max_new_tokens: int) -> list[dict]:
    answers = cal.answers("all", max_new_tokens)
    these = answers[answers["prompt_id"].isin([str(i) for i in prompt_ids])]
    per_step = None  # the heads' recorded log-probs of these positions, read once if a per-step tree is measured
    rows = []
    for b, top in picks.items():
        for c in top:
            m = measured[b][c["tree"].name]
            if c["kind"] == "dynamic":
                per_step = per_step or answer_rows(these, cal.head_logprobs(these))
                replay = walk_answers(c["tree"], per_step)
            else:
                replay = decoder_walk(c["tree"], these)
            sp, tps, e2e = spread(m["speedup"]), spread(m["tokens_per_step"]), spread(m["end_to_end_speedup"])
            bt, ratio = spread(m["batch_tokens_per_step"]), spread(m["step_ratio"])
            tree = c["tree"].envelope if c["kind"] == "dynamic" else c["tree"]  # a per-step tree: its envelope's
            rows.append(dict(batch_size=b, candidate=c["tree"].name, kind=c["kind"], nodes=c["nodes"],
                             medusa_choices=tree.as_lists(), chosen=c["chosen"],
                             predicted_tokens_per_step=c["tokens_per_step"], replay_these=replay,
                             measured_tokens_per_step=tps["median"], tokens_per_step_q1=tps["q1"],
                             tokens_per_step_q3=tps["q3"], predicted_speedup=c["speedup"],
                             predicted_range=list(c["range"]) if c["range"] else None,
                             measured_speedup=sp["median"], speedup_q1=sp["q1"], speedup_q3=sp["q3"],
                             repeats=sp["repeats"], end_to_end_speedup=e2e["median"],
                             prefill_share=spread(m["prefill_share"])["median"],
                             predicted_batch_tokens_per_step=c["batch_tokens_per_step"],
                             measured_batch_tokens_per_step=bt["median"],
                             predicted_step_ratio=c["relative_latency"],
                             measured_step_ratio=ratio["median"],
                             speedup_err_pct=100 * prediction_error(c["speedup"], sp["median"]),
                             tokens_per_step_err_pct=100 * prediction_error(c["tokens_per_step"], tps["median"])))
    return rows


def short(r: dict) -> str:
    """A row's candidate in 13 characters, `*` before plan's choice: dynamic_8_of_64 as dyn 8/64."""
    name = r["candidate"].replace("dynamic_", "dyn ").replace("_of_", "/")
    return ("*" if r.get("chosen") else "") + name[:13]


def table(rows: list[dict]) -> str:
    head = (f"{'B':>2} {'candidate':<14}{'nodes':>6} {'tok/step pred':>13} {'these':>6} {'measured (q1..q3)':>22} "
            f"{'err':>6}  {'speedup pred (range)':>22} {'decode (q1..q3)':>22} {'err':>6}  {'batch t/s':>11} "
            f"{'step ratio':>11} {'e2e':>6} {'prefill':>7}")
    lines = [head, "-" * len(head)]
    for r in rows:
        rng = f"({r['predicted_range'][0]:.2f}..{r['predicted_range'][1]:.2f})" if r["predicted_range"] else ""
        lines.append(
            f"{r['batch_size']:>2} {short(r):<14}{r['nodes']:>6} {r['predicted_tokens_per_step']:>13.3f} "
            f"{r['replay_these']:>6.3f} {r['measured_tokens_per_step']:>7.3f} "
            f"({r['tokens_per_step_q1']:.3f}..{r['tokens_per_step_q3']:.3f}) {r['tokens_per_step_err_pct']:>+5.1f}%  "
            f"{r['predicted_speedup']:>8.3f}x {rng:>12} {r['measured_speedup']:>7.3f}x "
            f"({r['speedup_q1']:.2f}..{r['speedup_q3']:.2f}) {r['speedup_err_pct']:>+5.1f}%  "
            f"{r['predicted_batch_tokens_per_step']:>5.3f}/{r['measured_batch_tokens_per_step']:<5.3f} "
            f"{r['predicted_step_ratio']:>5.2f}/{r['measured_step_ratio']:<5.2f} {r['end_to_end_speedup']:>5.3f}x "
            f"{100 * r['prefill_share']:>6.1f}%")
    return "\n".join(lines)


def per_step_verdicts(rows: list[dict], chosen: dict) -> list[dict]:
    """Per batch size where per-step trees were measured: plan's choice, the fastest measured per-step tree and the
    fastest of everything else (static trees, chains, no speculation at 1x), and whether plan picked a per-step
    tree exactly where one measures faster (issue 51), overlapping interquartile ranges counting as a tie either
    way; and the largest |speedup error| of a per-step row."""
    out = []
    none = dict(candidate="none", measured_speedup=1.0, speedup_q1=1.0, speedup_q3=1.0)
    for b in sorted({r["batch_size"] for r in rows}):
        at = [r for r in rows if r["batch_size"] == b]
        dyn = [r for r in at if r["kind"] == "dynamic"]
        if not dyn:
            continue
        d = max(dyn, key=lambda r: r["measured_speedup"])
        s = max([r for r in at if r["kind"] != "dynamic"] + [none], key=lambda r: r["measured_speedup"])
        tie = within_noise((d["speedup_q1"], d["speedup_q3"]), (s["speedup_q1"], s["speedup_q3"]))
        picked = any(r["chosen"] and r["kind"] == "dynamic" for r in at)
        faster = d["measured_speedup"] > s["measured_speedup"]
        out.append(dict(batch_size=b, plan=chosen.get(b, chosen.get(str(b))), fastest_other=s["candidate"],
                        fastest_other_speedup=s["measured_speedup"], fastest_per_step=d["candidate"],
                        fastest_per_step_speedup=d["measured_speedup"], plan_picks_per_step=picked,
                        per_step_measures_faster=faster, within_noise=tie, ok=tie or picked == faster,
                        per_step_max_abs_err_pct=max(abs(r["speedup_err_pct"]) for r in dyn)))
    return out


def main(argv=None) -> int:
    ap = ScriptParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calibration", help="calibration folder (default: the first under calibration/ with a latency "
                                          "CSV, else the first)")
    ap.add_argument("--latency", help="latency CSV (default: the calibration's only latency-*.csv)")
    ap.add_argument("--model", help="default: the calibration's model")
    ap.add_argument("--heads", help="default: the calibration's heads")
    ap.add_argument("--batch-sizes", default="1,2,4,8")
    ap.add_argument("--top", type=int, default=5, help="candidates of plan per batch size (default 5)")
    ap.add_argument("--dynamic-top", type=int, default=3, help="also plan's best per-step trees per batch size where "
                    "the latency table timed them (`latency --envelope`; default 3)")
    ap.add_argument("--limit", type=int, default=64, help="held-out prompts decoded (default 64)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", default="3", help="passes over the prompts (the spread; default 3), or one count per "
                    "batch size, smallest first (3,3,3,6: more where a step's time is noisier)")
    ap.add_argument("--threads", type=int, help="torch CPU threads")
    ap.add_argument("--device")
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    return run_script(ap, run, argv)


def repeats_at(text: str, batch_sizes: list[int]) -> dict:
    """{batch: passes} from --repeats: one count for every batch size, or one per batch size, smallest first."""
    try:
        counts = [int(n) for n in str(text).split(",")]
    except ValueError:
        counts = []
    counts = counts * len(batch_sizes) if len(counts) == 1 else counts
    if len(counts) != len(batch_sizes) or min(counts, default=0) < 1:
        raise WorkbenchError(f"--repeats {text}: give one positive count, or one per batch size "
                             f"({len(batch_sizes)}: {','.join(map(str, batch_sizes))})")
    return dict(zip(batch_sizes, counts))


def run(args) -> int:
    import torch

    from workbench.runtime.generation import prepare_prompt
    from workbench.runtime.models import load_model_and_heads

    if args.threads:
        torch.set_num_threads(args.threads)
    batch_sizes = parse_ints(args.batch_sizes, "--batch-sizes", "batch")
    repeats = repeats_at(args.repeats, batch_sizes)
    if args.top < 1 or args.max_new_tokens < 1:
        raise WorkbenchError("--top and --max-new-tokens must be positive")
    cal = Calibration(args.calibration or next((c for c in list_calibrations() if Calibration(c).latency_files()),
                                               None) or default_calibration())
    lat = args.latency or next(iter(cal.latency_files()), None)
    if lat is None:
        raise WorkbenchError(f"no latency CSV in {cal.folder}: measure one (`workbench latency --calibration "
                             f"{cal.folder}`) or pass --latency")
    surface = Surface.read(lat)
    if surface.engine != "workbench":
        raise WorkbenchError(f"--latency {lat}: times {surface.engine}'s rounds; this bench checks our "
                             "decoder (give a `workbench latency` CSV); a vLLM surface is checked by "
                             "bench/vllm_plan.py")
    records = cal.holdout_prompts(args.limit)
    if batch_sizes[-1] > len(records):
        raise WorkbenchError(f"--batch-sizes: batch {batch_sizes[-1]} but {len(records)} held-out prompts: raise "
                             "--limit")
    picks, info = plan_top(cal, surface, batch_sizes, args.top, args.max_new_tokens, args.dynamic_top)
    heads = args.heads or (None if cal.meta.get("heads") in (None, "demo") else cal.meta["heads"])
    model_name = args.model or (None if heads is None else cal.meta.get("model"))
    model, tok, hd = load_model_and_heads(model_name, heads, args.device)
    prompts = [prepare_prompt(tok, text, False) for _, text in records]
    from workbench.runtime.engine import StepEngine

    engine = StepEngine(model)  # compiled on CUDA (the GPU decoder), eager on CPU
    here = measured_setting(model, engine, "decoder-step")
    # every finished batch size is kept beside --out until the JSON is written: a killed run resumes
    state = WorkState(args.out, dict(command="bench/prediction.py", calibration=str(cal.folder), latency=str(lat),
                                     prompts=[pid for pid, _ in records], max_new_tokens=args.max_new_tokens,
                                     repeats=repeats, model=model_name, heads=heads, setting=without_load(here),
                                     picks={b: [c["tree"].name if c["kind"] == "dynamic" else c["tree"].as_lists()
                                                for c in top] for b, top in picks.items()}))
    measured = measure(model, hd, tok, prompts, picks, args.max_new_tokens, repeats, engine,
                       lambda s: print(s, file=sys.stderr), state)
    rows = rows_of(picks, measured, cal, [pid for pid, _ in records], args.max_new_tokens)
    lat_setting = surface.setting
    here["load_average_end"] = load_average()
    warning = mismatch_warning(lat_setting, here, "bench/prediction.py")
    verdicts = per_step_verdicts(rows, info["chosen"])
    atomic_write_json(args.out, dict(calibration=str(cal.folder), latency=str(lat), source=info, setting=here,
                                     latency_setting=lat_setting, setting_warning=warning, prompts=len(prompts),
                                     max_new_tokens=args.max_new_tokens, repeats=repeats, rows=rows,
                                     per_step=verdicts))
    print(f"{cal.folder.name}: {len(prompts)} held-out prompts, {args.max_new_tokens} new tokens, "
          f"{'/'.join(map(str, repeats.values()))} repeats at batch {'/'.join(map(str, repeats))}; latency "
          f"{Path(lat).name} at context {info['context']}\nthis run: {describe(here)}\n"
          f"latency:  {describe(lat_setting)}")
    print(table(rows))
    for v in verdicts:
        print(f"batch {v['batch_size']}: plan {v['plan']}; fastest measured other {v['fastest_other']} "
              f"{v['fastest_other_speedup']:.3f}x, per-step {v['fastest_per_step']} "
              f"{v['fastest_per_step_speedup']:.3f}x{' (within noise)' if v['within_noise'] else ''}: plan picks a "
              f"per-step tree only where it measures faster: {'yes' if v['ok'] else 'NO'}; per-step |speedup "
              f"error| <= {v['per_step_max_abs_err_pct']:.1f}%")
    for note in ([warning] if warning else []) + (["WARNING: busy machine (load average above half the cores): the "
                                                   "measured speeds are not this machine's"] if loaded(here) else []):
        print(note, file=sys.stderr)
    remove_work(args.out)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
