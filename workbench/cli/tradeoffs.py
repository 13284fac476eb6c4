"""Trade-off commands: `latency` (verify cost per batch and tree size), `plan` (tree, chain or nothing per batch
size), `sweep` (live decoder grid) and `sweep-report`."""
from __future__ import annotations

import sys
from pathlib import Path

from workbench import WorkbenchError
from workbench.cli.shared import (bounded, model_args, parse_delta, parse_floats,
                                  parse_ints, renamed, report_written, warn_line, write_output)
from workbench.cli.vllm import add_vllm_latency_args
from workbench.core.io import atomic_write_text, check_output, run_lock
from workbench.core.work import remove_work


def latency_request(args):
    """The flags as the library's request (measure.request: the mode's defaults and rules live there)."""
    from workbench.measure.request import LatencyRequest

    def ints(flag, limit):
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        return tuple(parse_ints(value, flag, limit)) if value else None
    return LatencyRequest(args.mode, args.random_config, ints("--sizes", "nodes"), ints("--context", "context"),
                          ints("--batch-sizes", "batch"), args.repeats, args.warmup, args.envelope, args.prompts,
                          args.calibration, own_model=bool(args.model or args.heads or args.device_map))


def cmd_latency(args) -> int:
    if args.engine == "vllm" or any((args.k, args.method, args.draft_model, args.vllm_python, args.vllm_eager)):
        # vLLM's own rounds
        from workbench.cli.vllm import cmd_latency_vllm

        return cmd_latency_vllm(args)
    check_output(args.out, "out")  # before the imports (torch, transformers): a bad output fails in a second
    check_output(None if args.out else args.calibration, "calibration", "folder")
    from workbench.calibrate.folder import Calibration, default_latency_path, latency_path, read_meta
    from workbench.measure.latency import device_name, measure_decoder_steps, measure_latency
    from workbench.measure.request import latency_fits, random_config_fits
    from workbench.runtime.models import random_model

    req = latency_request(args).resolved()  # the mode's defaults and rules live in the request
    mode, step, sizes, batches = req.mode, req.step, list(req.sizes), list(req.batch_sizes)
    contexts = list(req.context or ())  # verify's cache lengths (decoder-step's grow as it decodes)
    repeats, warmup = req.repeats, req.warmup
    if args.calibration:
        read_meta(args.calibration)  # a finished calibration folder, or one line
    heads = tok = None
    if args.random_config:
        from workbench.runtime.models import pick_device

        random_config_fits(args.random_config, pick_device(args.device))
        model, label = random_model(args.random_config, args.device, args.dtype, args.attn), f"random:{args.random_config}"
    else:
        from workbench.runtime.models import load_base, load_model_and_heads, model_label

        label = model_label(args.model)
        if args.heads or step:
            model, tok, heads = load_model_and_heads(args.model, args.heads, args.device, args.dtype, args.attn,
                                                     device_map=args.device_map)
        else:
            model, _ = load_base(args.model, args.device, args.dtype, args.attn, need_tokenizer=False,
                                 device_map=args.device_map)
    latency_fits(model, req)
    dev = device_name(model.device)
    out = Path(args.out) if args.out else (latency_path(args.calibration, dev) if args.calibration
                                           else default_latency_path(label, dev))
    from workbench.runtime.engine import StepEngine

    engine = StepEngine(model, compile=args.compile, steps=args.run_steps or 0)  # default: a short run's engine
    if step:
        from workbench.core.data import load_prompt_records
        from workbench.runtime.generation import prepare_prompt

        records = Calibration(args.calibration).holdout_prompts(args.limit) if args.prompts == "holdout" else \
            load_prompt_records(args.prompts, args.limit)
        prompts = [prepare_prompt(tok, text, args.raw) for _, text in records]
    envelope = None
    if args.envelope:
        from workbench.trees.tree import load_tree

        envelope = load_tree(args.envelope)
    with run_lock(out, "out", kind="file"):  # finished points wait in OUT.work/ (a rerun resumes from them)
        if step:
            df = measure_decoder_steps(model, heads, tok, prompts, sizes, batches, repeats, warmup,
                                       args.max_new_tokens, label, engine=engine, work=out, envelope=envelope)
        else:
            df = measure_latency(model, sizes, contexts, repeats, warmup, heads, label, engine=engine,
                                 batches=batches, work=out)
        atomic_write_text(out, df.to_csv(index=False), "out")
        remove_work(out)
    print(f"{dev} {df['dtype'].iloc[0]}, {mode}, median and interquartile range of {repeats}:", file=sys.stderr)
    extra = f"{'bare fwd ms':>12}" if step else ""
    print(f"{'batch':>6}{'context':>8}{'tokens':>8}{'ms':>10}{'q1..q3 ms':>18}{'t(n)/t(1)':>11}{extra}", file=sys.stderr)
    for r in df.to_dict("records"):
        if r["policy"] == "dynamic" and r["tokens"] == min(df.loc[df["policy"] == "dynamic", "tokens"]):
            print(f"per-step trees chosen from the {int(r['envelope'])}-node envelope ({args.envelope}):", file=sys.stderr)
        iqr = f"{1000 * r['seconds_q1']:.3f}..{1000 * r['seconds_q3']:.3f}"
        fwd = f"{1000 * r['forward_seconds']:>12.3f}" if step and r.get("forward_seconds") == r.get("forward_seconds") \
            and r.get("forward_seconds") is not None else ""
        print(f"{r['batch']:>6}{r['context']:>8}{r['tokens']:>8}{1000 * r['seconds']:>10.3f}{iqr:>18}"
              f"{r['relative']:>11.3f}{fwd}", file=sys.stderr)
    report_written(df, out)
    return 0


def cmd_plan(args) -> int:
    from workbench.plan.rank import make_plan, plan_table
    from workbench.plan.plan_file import plan_json
    from workbench.plan.source import plan_source

    batch_sizes = parse_ints(args.batch_sizes, "--batch-sizes", "batch")
    check_output(args.out, "out")
    from workbench.core.provenance import describe, loaded

    if args.max_new_tokens is not None and not args.calibration:
        raise WorkbenchError("--max-new-tokens applies to --calibration predictions (the replayed answers' length)")
    source = plan_source(args.calibration, args.accuracies, args.acceptance, args.prediction,
                         max_new_tokens=args.max_new_tokens)
    plan = make_plan(source, args.latency, batch_sizes, args.context, args.within_noise)
    write_output(plan_json(plan), args.out, "the plan")
    lat, src = plan["latency"], plan["source"]
    print(f"plan: {src['kind']} {src['path']} ({src['prediction']}), latency {lat['file']} at context "
          f"{lat['context']} ({' '.join(str(lat[k]) for k in ('model', 'device', 'dtype') if k in lat)})",
          file=sys.stderr)
    if src.get("regime"):
        print(f"prediction assumes: {src['regime']}", file=sys.stderr)
    print(f"latency setting: {describe(lat['setting'])}", file=sys.stderr)
    print(f"priced on: {lat.get('engine', 'workbench')} {lat.get('engine_version') or ''}".rstrip(), file=sys.stderr)
    print("step cost: " + ("vLLM's served round at each K it timed (drafter included): only those chains and none "
                           "were weighed" if lat.get("engine") == "vllm" else
                           "each candidate at its own depth (the table measured the heads' cost)"
                           if lat.get("head_cost") else
                           "as the table timed it, whatever a candidate's depth (no heads' cost in the table: "
                           "`workbench latency --heads DIR` times it)"), file=sys.stderr)
    if lat["setting"] is None or lat["setting"].get("mode") not in ("decoder-step", "vllm-round"):
        warn_line("the latency table times the bare verify forward (or does not say what it timed): the "
                  "decoder's step also runs the heads, the selection and the cache bookkeeping, so speedups are "
                  "over-predicted; measure with `workbench latency` (decoder-step)")
    if loaded(lat["setting"]):
        warn_line("the latency table was measured on a busy machine (load average above half its cores)")
    print(plan_table(plan), file=sys.stderr)
    if src["kind"] == "acceptance":
        print("note: an acceptance vector describes a chain drafter: only chains (and no speculation) were weighed",
              file=sys.stderr)
    if not lat["spread"]:
        print("note: the latency CSV has no spread (not measured): whether a runner-up is "
              "within the noise is unknown; re-measure with `workbench latency`", file=sys.stderr)
    for row, alt in zip(plan["plans"], plan["alternatives"]):
        aside = alt.get("set_aside")
        if aside:
            print(f"note: batch {row['batch_size']}: {aside['kind']} of {aside['nodes']} predicted "
                  f"{aside['predicted_speedup']:.3f}x lies within the latency noise of no speculation: no "
                  "speculation (--within-noise none)", file=sys.stderr)
    return 0


def cmd_sweep(args) -> int:
    from workbench.measure import sweep as S
    from workbench.calibrate.folder import Calibration, default_calibration
    from workbench.core.data import load_prompt_records
    from workbench.measure.request import SweepRequest
    from workbench.measure.sweep_file import read_sweep_rows
    from workbench.trees.tree import load_tree

    req = SweepRequest(tuple(parse_floats(args.temperature, "--temperature")),
                       tuple(parse_floats(args.epsilon, "--epsilon", high=1.0)),
                       tuple(parse_ints(args.batch_sizes, "--batch-sizes", "batch")),
                       tuple(parse_ints(args.budgets, "--budgets", "nodes")) if args.budgets else None,
                       tuple(args.trees or ()), args.plan, args.joint, args.replay, args.envelope, args.prompts,
                       args.calibration, args.limit, args.max_new_tokens)
    delta = parse_delta(args.delta)
    plan = None
    if args.plan:  # the live check of a plan: its choice and runner-up at each of its batch sizes, greedy
        from workbench.plan.plan_file import read_plan

        req.resolved([])  # its rules first: the plan file is read only when it applies
        plan = read_plan(args.plan)
    req = req.resolved(plan["plans"] if plan else None)  # the defaults and rules live in the request
    batch_sizes = list(req.batch_sizes)
    budgets = list(req.budgets) if req.budgets else None
    calibration = args.calibration
    if calibration is None and (budgets or args.prompts == "holdout"):
        calibration = default_calibration()
    cal = Calibration(calibration) if calibration is not None else None
    for spec in args.trees or []:  # a malformed tree fails before the model loads (depth is checked after)
        load_tree(spec)
    envelope = load_tree(args.envelope) if args.envelope else None
    check_output(args.out, "out")
    if Path(args.out).exists() and not Path(args.out).is_file():
        raise WorkbenchError(f"--out {args.out}: not a regular file; a sweep resumes from its own CSV: give a file")
    read_sweep_rows(args.out)  # a foreign --out file, too
    if args.prompts == "holdout":
        records = cal.holdout_prompts(args.limit)
    else:
        records = load_prompt_records(args.prompts, args.limit)
    req.check_prompts(len(records))
    from workbench.runtime.heads import heads_fingerprint
    from workbench.runtime.generation import prepare_prompt
    from workbench.runtime.models import load_model_and_heads, model_label

    from workbench.runtime.engine import StepEngine
    from workbench.decode.request import check_positions

    with run_lock(args.out, "out", kind="file"):  # a second sweep into this file refuses
        model, tok, heads = load_model_and_heads(args.model, args.heads, args.device, args.dtype, args.attn,
                                                 device_map=args.device_map)
        planned = None
        if plan is not None:
            from workbench.plan.plan_file import plan_trees

            planned = [(t, b) for t, b, _ in plan_trees(plan)]
        configs = S.request_configs(req, delta, heads.num_heads, cal, planned, envelope, args.dense)
        prompts = [prepare_prompt(tok, text, args.raw) for _, text in records]
        check_positions(model, max(map(len, prompts)), args.max_new_tokens,
                        max([c["tree"].nodes for c in configs if c.get("tree") is not None] or [0]))
        info = dict(model=model_label(args.model), heads=str(args.heads or "demo"), prompts=args.prompts,
                    limit=args.limit, calibration=str(calibration or ""),
                    heads_sha256=heads_fingerprint(heads))  # retrained heads in the same folder are a new run
        ids = [pid for pid, _ in records] if args.prompts == "holdout" else None  # the calibration's own prompts
        predict = S.calibration_predictions(cal, args.max_new_tokens, ids) if cal else None
        print(f"sweep: {len(configs)} configurations x {len(prompts)} prompts (+ vanilla) -> {args.out}", file=sys.stderr)
        engine = StepEngine(model, args.compile, steps=S.steps_per_shape(configs, len(prompts), batch_sizes,
                                                                         args.max_new_tokens))  # short: eager
        if engine.compiled_as:
            info["compiled"] = engine.compiled_as  # compiled timings are another run than eager ones
        df = S.run_sweep(model, heads, tok, prompts, configs, args.out, args.max_new_tokens, info, predict,
                         progress=not args.quiet, engine=engine, batch_sizes=batch_sizes)
    df = df[df["run"] == df["run"].iloc[-1]]
    print(f"{'tree':<22}{'nodes':>6}{'B':>4}{'T':>5}{'eps':>6}{'tok/step':>9}{'speedup':>9}{'exact':>7}",
          file=sys.stderr)
    for r in df.itertuples(index=False):
        e = "" if r.epsilon != r.epsilon else f"{r.epsilon:g}"  # NaN for greedy rows
        print(f"{str(r.tree)[:21]:<22}{r.nodes:>6}{int(r.batch_size):>4}{r.temperature:>5g}{e:>6}"
              f"{r.tokens_per_step:>9.3f}{r.speedup:>9.3f}{r.exact_match:>7.2f}", file=sys.stderr)
    return 0


def cmd_sweep_report(args) -> int:
    check_output(args.out, "out")  # before the imports: reading a sweep imports torch (sweep.py runs them too)
    check_output(args.figures, "figures", "folder")
    from workbench.plan.plan_file import read_plan
    from workbench.plan.report import report_inputs, summarize

    sweep, latency = report_inputs(args.sweep, args.latency)  # before writing: each file read once
    plan = read_plan(args.plan) if args.plan else None
    write_output(summarize(args.sweep, args.latency, args.context, plan, (sweep, latency)), args.out, "the report")
    if args.figures:
        from workbench.viz.static_tradeoffs import report_figures

        for f in report_figures(sweep, latency, args.figures, Path(args.sweep).stem):
            print(f"figure written to {f}", file=sys.stderr)
    return 0


def add_tradeoffs(sub) -> None:
    p = sub.add_parser("latency", help="time the decoder's step per batch size and tree size (for optimize "
                                       "--latency and plan)",
                       description="Wall time (median and spread over repeats) of one decoding step of B sequences x "
                                   "n tree tokens. decoder-step (default): the decoder's whole step (heads, tree "
                                   "tokens, verify, acceptance, cache bookkeeping) while decoding real prompts, the "
                                   "context growing as in decoding, with the bare verify forward beside it. verify: "
                                   "the bare verify forward (4-D tree mask, position ids, lm_head) on caches of fixed "
                                   "length. Every row records the setting (CPU and vector extension or GPU, threads, "
                                   "dtype, compiled, versions, load). Resumable: rerun the same command to "
                                   "continue (finished points wait in OUT.work/).",
                       parents=[model_args("--model", "--device", "--device-map", "--dtype", "--attn", "--compile")])
    # its own --heads: optional here (no heads = time the verify forward alone), so the shared help would mislead
    p.add_argument("--heads", help="also time the heads' top-k in every tree step (a Medusa step's full cost)")
    p.add_argument("--random-config", metavar="SPEC",
                   help="instead: random weights of a given shape, a preset (llama-1b, llama-3b, llama-8b, vicuna-7b, "
                        "smollm2-135m, tiny) or key=value pairs hidden=2048,layers=16,heads=32,kv_heads=8,"
                        "vocab=128256,intermediate=8192[,arch=llama]")
    p.add_argument("--mode", choices=["decoder-step", "verify"],
                   help="decoder-step: the decoder's whole step on real prompts (default); verify: the bare verify "
                        "forward at fixed --context (default with --random-config or --context)")
    renamed(p, "--table", "--out FILE (--table only names an output)")
    p.add_argument("--sizes", metavar="N1,N2,..", help="tokens per step (tree nodes + root; default 1,2,3,4,5,8,16,"
                   "32,64 for decoder-step, 1,2,4,...,256 for verify; 1 is always measured)")
    p.add_argument("--context", metavar="C1,C2,..", help="verify: cache lengths (default 128,1024)")
    p.add_argument("--batch-sizes", metavar="B1,B2,..", help="serving batch sizes: sequences per step (default "
                                                             "1,2,4,8 for decoder-step, 1 for verify)")
    renamed(p, "--batch", "--batch-sizes B1,B2,..")
    p.add_argument("--repeats", type=bounded("repeats"),
                   help="timed repeats per point (median, quartiles, min, max kept): decoder-step, rounds of generate "
                        "calls (vanilla, each size, vanilla on the same prompts; every step timed against a bare "
                        "1-token forward right after it; default 4); verify, calls (default 10)")
    p.add_argument("--warmup", type=bounded("repeats", 0), help="untimed repeats first (default 1 / 3)")
    p.add_argument("--prompts", default="alpaca-eval", help="decoder-step: the prompts decoded (alpaca-eval, "
                   "mt-bench, a file, or 'holdout': the calibration's held-out prompts; default alpaca-eval)")
    p.add_argument("--limit", type=bounded("count"), default=40, help="decoder-step: first N prompts, used in turn (default 40)")
    p.add_argument("--max-new-tokens", type=bounded("tokens"), default=64, help="decoder-step: tokens decoded per call (default 64)")
    p.add_argument("--envelope", metavar="TREE", help="decoder-step: also time the per-step tree of each size (n - 1 "
                   "nodes chosen each step from TREE, as `decode --dynamic N --tree TREE` runs it; rows of policy "
                   "dynamic, the selection's cost measured) at every size TREE holds")
    p.add_argument("--raw", action="store_true", help="decoder-step: prompts as-is, without the chat template")
    p.add_argument("--run-steps", type=bounded("count"), metavar="N", help="time the engine a decode or sweep of N "
                   "steps per shape runs (on CPU from 1000: layers compiled, few-row kernels timed; cold: minutes); "
                   "default: a shorter run's (eager, plain linears), as the README's decode and sweep")
    p.add_argument("--calibration", metavar="DIR", help="write latency-<device>.csv into this calibration folder")
    p.add_argument("--out", metavar="FILE", help="CSV path (default: calibration/<name>/latency-<device>.csv)")
    add_vllm_latency_args(p)
    p.set_defaults(func=cmd_latency)

    pl = sub.add_parser("plan", help="per batch size: the fastest tree, chain or no speculation on a latency CSV",
                        description="For every batch size, the candidate with the best predicted speedup (goodput "
                                    "B x tokens/step / t(B, n) over vanilla's B / t(B, 1)) among the optimal tree at "
                                    "every budget the latency CSV covers, the top-1 chain of every length, and no "
                                    "speculation. Prints a table and writes the plan JSON (workbench export PLAN "
                                    "--format F turns it into each engine's settings).")
    src = pl.add_mutually_exclusive_group(required=True)
    src.add_argument("--calibration", metavar="DIR", help="a `workbench calibrate` folder (its predictions)")
    src.add_argument("--accuracies", metavar="FILE", help="instead: an accuracy table (CSV or Medusa .pt)")
    src.add_argument("--acceptance", metavar="FILE", help="instead: a per-position acceptance vector (CSV "
                     "position,acceptance or a JSON list, e.g. vLLM's synthetic_acceptance_rates); chains only")
    pl.add_argument("--latency", required=True, metavar="CSV", help="`workbench latency --batch-sizes ...` CSV")
    pl.add_argument("--batch-sizes", default="1,2,4,8,16", metavar="B1,B2,..",
                    help="batch sizes to plan for (default 1,2,4,8,16; each must be in the latency CSV)")
    pl.add_argument("--context", type=bounded("context", 0), metavar="N", help="latency rows at this context (default: the measured "
                                                           "one nearest the calibration's typical context)")
    pl.add_argument("--prediction", choices=["independent", "joint", "replay"], default="replay",
                    help="with --calibration: which predicted tokens/step (default replay: a greedy decoder replayed "
                         "over the held-out answers); trees are optimal for the joint paths unless independent")
    pl.add_argument("--max-new-tokens", type=bounded("tokens"), metavar="N",
                    help="with --calibration: the generation length you decode (default: the calibration's); "
                         "acceptance rises along an answer, so tokens/step is predicted over its first N tokens")
    pl.add_argument("--within-noise", default="fastest", metavar="fastest|none",
                    help="where the fastest candidate's predicted range overlaps no speculation's (the latency "
                         "CSV's quartiles): keep it, flagged (default), or answer no speculation")
    pl.add_argument("--out", metavar="FILE", help="write the plan JSON here instead of stdout")
    pl.set_defaults(func=cmd_plan)

    s = sub.add_parser("sweep", help="live decoder over trees x temperatures x epsilons vs vanilla greedy -> CSV",
                       description="Run the live Medusa decoder for every configuration on the same prompts and "
                                   "vanilla greedy on them in the same run; one CSV row per configuration. "
                                   "Resumable: rerun the same command to continue.",
                       parents=[model_args("--model", "--heads", "--device", "--device-map", "--dtype", "--attn",
                                           "--compile")])
    s.add_argument("--trees", nargs="+", metavar="TREE", help="tree files, reference names or literals")
    s.add_argument("--plan", metavar="PLAN.json", help="the live check of a plan (`workbench plan`): its choice and "
                   "runner-up at each of its batch sizes, greedy, against vanilla at that batch size; "
                   "`sweep-report --plan` then puts predicted beside measured")
    s.add_argument("--budgets", metavar="B1,B2,..", help="optimal trees with these node budgets from --calibration "
                                                        "(default 4,8,16,32,64,128,256 unless --trees)")
    s.add_argument("--joint", action="store_true", help="build budget trees from measured joint path probabilities")
    s.add_argument("--dense", action="store_true", help="add Cartesian trees [s], [s,s], ... of comparable sizes")
    s.add_argument("--envelope", metavar="TREE", help="also every swept size as a per-step tree (that many nodes "
                   "chosen each step from TREE, as `decode --dynamic N --tree TREE`): static and per-step at equal "
                   "budgets side by side")
    s.add_argument("--calibration", metavar="DIR", help="calibration folder (default: the one with the most prompts "
                   "under calibration/ or $WORKBENCH_CALIBRATION_ROOT)")
    s.add_argument("--epsilon", default="0.09", help="typical-acceptance epsilons: list or START:STOP:STEP (default 0.09)")
    s.add_argument("--batch-sizes", default="1", help="comma-separated batch sizes: at B, the prompts are decoded B "
                   "at a time (one forward of B x tree tokens per step), against vanilla greedy at the same B "
                   "(default 1)")
    s.add_argument("--delta", default="sqrt", help="'sqrt' (delta = sqrt(epsilon), default) or a fixed number")
    s.add_argument("--temperature", default="0", help="temperatures, e.g. 0,0.7 (0 = greedy acceptance; default 0)")
    s.add_argument("--prompts", default="alpaca-eval",
                   help="alpaca-eval, mt-bench, a prompt file, or 'holdout' (the calibration's held-out prompts)")
    s.add_argument("--limit", type=bounded("count"), default=20, help="first N prompts (default 20)")
    s.add_argument("--raw", action="store_true", help="use prompts as-is, without the chat template")
    s.add_argument("--max-new-tokens", type=bounded("tokens"), default=128)
    s.add_argument("--out", required=True, metavar="FILE.csv", help="sweep CSV (rows already there are skipped)")
    s.add_argument("--replay", action="store_true",
                   help="budget trees: keep the optimum or a dense tree within the budget, whichever a greedy "
                        "decoder replayed over the calibration's fit answers (cut to --max-new-tokens) prefers")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=cmd_sweep)

    r = sub.add_parser("sweep-report", help="markdown tables from a sweep CSV (+ latency CSV) for docs/tradeoffs.md")
    r.add_argument("sweep", metavar="SWEEP_CSV")
    r.add_argument("--latency", metavar="FILE", help="latency CSV: adds the hardware-aware choice")
    r.add_argument("--plan", metavar="PLAN.json", help="a plan swept with `sweep --plan`: its predicted speedups "
                   "beside the measured ones, per batch size")
    r.add_argument("--context", type=bounded("context", 0), help="latency rows at this context (default: closest to the sweep's)")
    r.add_argument("--out", metavar="FILE.md", help="write here instead of stdout")
    r.add_argument("--figures", metavar="DIR", help="also write the figures (Fig. 4a/4b, predicted vs measured, "
                                                    "Fig. 5, latency) as PNGs here")
    r.set_defaults(func=cmd_sweep_report)
