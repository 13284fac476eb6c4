"""Trade-off commands: `latency` (verify cost per tree size), `sweep` (live decoder grid) and `sweep-report`."""
from __future__ import annotations

import sys

from workbench import WorkbenchError
from workbench.cli.shared import model_args, parse_delta, parse_floats, parse_ints, write_output
from workbench.io import atomic_write_text, check_output, run_lock


def cmd_latency(args) -> int:
    from pathlib import Path

    from workbench.calibration import default_latency_path, latency_path, read_meta
    from workbench.latency import DEFAULT_CONTEXTS, DEFAULT_SIZES, device_name, measure_latency
    from workbench.models import random_model

    sizes = parse_ints(args.sizes, "--sizes") if args.sizes else list(DEFAULT_SIZES)
    contexts = parse_ints(args.context, "--context") if args.context else list(DEFAULT_CONTEXTS)
    if args.calibration:
        read_meta(args.calibration)  # a finished calibration folder, or one line
    check_output(args.out, "--out")
    check_output(None if args.out else args.calibration, "--calibration", "folder")
    heads = None
    if args.random_config:
        if args.model or args.heads or args.device_map:
            raise WorkbenchError("--random-config builds its own model on --device: drop --model/--heads/--device-map")
        model, label = random_model(args.random_config, args.device, args.dtype, args.attn), f"random:{args.random_config}"
    else:
        from workbench.models import load_base, load_model_and_heads, model_label

        label = model_label(args.model)
        if args.heads:
            model, _, heads = load_model_and_heads(args.model, args.heads, args.device, args.dtype, args.attn,
                                                   device_map=args.device_map)
        else:
            model, _ = load_base(args.model, args.device, args.dtype, args.attn, need_tokenizer=False,
                                 device_map=args.device_map)
    dev = device_name(model.device)
    out = Path(args.out) if args.out else (latency_path(args.calibration, dev) if args.calibration
                                           else default_latency_path(label, dev))
    from workbench.engine import StepEngine

    df = measure_latency(model, sizes, contexts, args.repeats, args.warmup, heads, label,
                         engine=StepEngine(model, compile=args.compile))
    atomic_write_text(out, df.to_csv(index=False), "--out")
    print(f"{dev} {df['dtype'].iloc[0]}, median of {args.repeats}:", file=sys.stderr)
    print(f"{'context':>8}{'tokens':>8}{'ms':>10}{'t(n)/t(1)':>11}", file=sys.stderr)
    for r in df.itertuples(index=False):
        print(f"{r.context:>8}{r.tokens:>8}{1000 * r.seconds:>10.3f}{r.relative:>11.3f}", file=sys.stderr)
    print(f"wrote {out}", file=sys.stderr)
    return 0


def cmd_sweep(args) -> int:
    from workbench import sweep as S
    from workbench.calibration import Calibration, default_calibration
    from workbench.data import load_prompt_records
    from workbench.tree import load_tree

    temps = parse_floats(args.temperature, "--temperature")
    eps = parse_floats(args.epsilon, "--epsilon", high=1.0)
    if eps[0] <= 0:
        raise WorkbenchError(f"--epsilon {args.epsilon}: every epsilon must be in (0, 1]")
    delta = parse_delta(args.delta)
    if args.max_new_tokens < 1:
        raise WorkbenchError(f"--max-new-tokens {args.max_new_tokens}: must be >= 1")
    budgets = parse_ints(args.budgets, "--budgets") if args.budgets else (None if args.trees else list(S.DEFAULT_BUDGETS))
    calibration = args.calibration
    if calibration is None and (budgets or args.prompts == "holdout"):
        calibration = default_calibration()
    cal = Calibration(calibration) if calibration is not None else None
    for spec in args.trees or []:  # a malformed tree fails before the model loads (depth is checked after)
        load_tree(spec)
    check_output(args.out, "--out")
    S.read_sweep_rows(args.out)  # a foreign --out file, too
    if args.prompts == "holdout":
        records = cal.holdout_prompts(args.limit)
    else:
        records = load_prompt_records(args.prompts, args.limit)
    from workbench.calibrate import heads_fingerprint
    from workbench.generation import prepare_prompt
    from workbench.models import load_model_and_heads, model_label

    from workbench.engine import StepEngine

    with run_lock(args.out, "--out", kind="file"):  # a second sweep into this file refuses
        model, tok, heads = load_model_and_heads(args.model, args.heads, args.device, args.dtype, args.attn,
                                                 device_map=args.device_map)
        trees = S.sweep_trees(budgets, args.trees, args.dense, cal, args.joint, heads.num_heads,
                              replay=args.max_new_tokens if args.replay else None)
        configs = S.sweep_configs(trees, temps, eps, delta)
        prompts = [prepare_prompt(tok, text, args.raw) for _, text in records]
        info = dict(model=model_label(args.model), heads=str(args.heads or "demo"), prompts=args.prompts,
                    limit=args.limit, calibration=str(calibration or ""),
                    heads_sha256=heads_fingerprint(heads))  # retrained heads in the same folder are a new run
        ids = [pid for pid, _ in records] if args.prompts == "holdout" else None  # the calibration's own prompts
        predict = S.calibration_predictions(cal, args.max_new_tokens, ids) if cal else None
        print(f"sweep: {len(configs)} configurations x {len(prompts)} prompts (+ vanilla) -> {args.out}",
              file=sys.stderr)
        engine = StepEngine(model, compile=args.compile)
        if engine.compile:
            info["compiled"] = True  # compiled timings are another run than eager ones
        df = S.run_sweep(model, heads, tok, prompts, configs, args.out, args.max_new_tokens, info, predict,
                         progress=not args.quiet, engine=engine)
    df = df[df["run"] == df["run"].iloc[-1]]
    print(f"{'tree':<22}{'nodes':>6}{'T':>5}{'eps':>6}{'tok/step':>9}{'speedup':>9}{'exact':>7}", file=sys.stderr)
    for r in df.itertuples(index=False):
        e = "" if r.epsilon != r.epsilon else f"{r.epsilon:g}"  # NaN for greedy rows
        print(f"{str(r.tree)[:21]:<22}{r.nodes:>6}{r.temperature:>5g}{e:>6}{r.acceleration_rate:>9.3f}"
              f"{r.speedup:>9.3f}{r.exact_match:>7.2f}", file=sys.stderr)
    return 0


def cmd_sweep_report(args) -> int:
    from pathlib import Path

    from workbench.latency import read_latency
    from workbench.report import summarize
    from workbench.sweep import read_sweep

    check_output(args.out, "--out")
    check_output(args.figures, "--figures", "folder")
    sweep, latency = read_sweep(args.sweep), read_latency(args.latency) if args.latency else None  # before writing
    write_output(summarize(args.sweep, args.latency, args.context), args.out, "the report")
    if args.figures:
        from workbench.plots import report_figures

        for f in report_figures(sweep, latency, args.figures, Path(args.sweep).stem):
            print(f"figure written to {f}", file=sys.stderr)
    return 0


def add_tradeoffs(sub) -> None:
    p = sub.add_parser("latency", help="time one verify forward per tree size and context (for optimize --latency)",
                       description="Median wall time of a verify forward over n tree tokens (4-D tree mask, position "
                                   "ids, lm_head) on a cache of fixed length, next to the single-token step.",
                       parents=[model_args("--model", "--device", "--device-map", "--dtype", "--attn", "--compile")])
    # its own --heads: optional here (no heads = time the verify forward alone), so the shared help would mislead
    p.add_argument("--heads", help="also time the heads' top-k in every tree step (a Medusa step's full cost)")
    p.add_argument("--random-config", metavar="SPEC",
                   help="instead: random weights of a given shape, a preset (llama-1b, llama-3b, llama-8b, vicuna-7b, "
                        "smollm2-135m, tiny) or key=value pairs hidden=2048,layers=16,heads=32,kv_heads=8,"
                        "vocab=128256,intermediate=8192[,arch=llama]")
    p.add_argument("--sizes", metavar="N1,N2,..", help="verify tokens per step (tree nodes + root; default "
                                                      "1,2,4,...,256; 1 is always measured)")
    p.add_argument("--context", metavar="C1,C2,..", help="cache lengths (default 128,1024)")
    p.add_argument("--repeats", type=int, default=10, help="timed calls per point (median; default 10)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls before each point (default 3)")
    p.add_argument("--calibration", metavar="DIR", help="write latency-<device>.csv into this calibration folder")
    p.add_argument("--out", metavar="FILE", help="CSV path (default: calibration/<name>/latency-<device>.csv)")
    p.set_defaults(func=cmd_latency)

    s = sub.add_parser("sweep", help="live decoder over trees x temperatures x epsilons vs vanilla greedy -> CSV",
                       description="Run the live Medusa decoder for every configuration on the same prompts and "
                                   "vanilla greedy on them in the same run; one CSV row per configuration. "
                                   "Resumable: rerun the same command to continue.",
                       parents=[model_args("--model", "--heads", "--device", "--device-map", "--dtype", "--attn",
                                           "--compile")])
    s.add_argument("--trees", nargs="+", metavar="TREE", help="tree files, reference names or literals")
    s.add_argument("--budgets", metavar="B1,B2,..", help="optimal trees with these node budgets from --calibration "
                                                        "(default 4,8,16,32,64,128,256 unless --trees)")
    s.add_argument("--joint", action="store_true", help="build budget trees from measured joint path probabilities")
    s.add_argument("--dense", action="store_true", help="add Cartesian trees [s], [s,s], ... of comparable sizes")
    s.add_argument("--calibration", metavar="DIR", help="calibration folder (default: the first under calibration/ or "
                   "$WORKBENCH_CALIBRATION_ROOT)")
    s.add_argument("--epsilon", default="0.09", help="typical-acceptance epsilons: list or START:STOP:STEP (default 0.09)")
    s.add_argument("--delta", default="sqrt", help="'sqrt' (delta = sqrt(epsilon), default) or a fixed number")
    s.add_argument("--temperature", default="0", help="temperatures, e.g. 0,0.7 (0 = greedy acceptance; default 0)")
    s.add_argument("--prompts", default="alpaca-eval",
                   help="alpaca-eval, mt-bench, a prompt file, or 'holdout' (the calibration's held-out prompts)")
    s.add_argument("--limit", type=int, default=20, help="first N prompts (default 20)")
    s.add_argument("--raw", action="store_true", help="use prompts as-is, without the chat template")
    s.add_argument("--max-new-tokens", type=int, default=128)
    s.add_argument("--out", required=True, metavar="FILE.csv", help="sweep CSV (rows already there are skipped)")
    s.add_argument("--replay", action="store_true",
                   help="budget trees: keep the optimum or a dense tree within the budget, whichever a greedy "
                        "decoder replayed over the calibration's fit answers (cut to --max-new-tokens) prefers")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=cmd_sweep)

    r = sub.add_parser("sweep-report", help="markdown tables from a sweep CSV (+ latency CSV) for docs/tradeoffs.md")
    r.add_argument("sweep", metavar="SWEEP_CSV")
    r.add_argument("--latency", metavar="FILE", help="latency CSV: adds the hardware-aware choice")
    r.add_argument("--context", type=int, help="latency rows at this context (default: closest to the sweep's)")
    r.add_argument("--out", metavar="FILE.md", help="write here instead of stdout")
    r.add_argument("--figures", metavar="DIR", help="also write the figures (Fig. 4a/4b, predicted vs measured, "
                                                    "Fig. 5, latency) as PNGs here")
    r.set_defaults(func=cmd_sweep_report)
