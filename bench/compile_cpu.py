"""Eager vs compiled decoding steps on CPU, per batch size, with the compile time beside: the table the CPU default
is chosen from (runtime/compiled.py: the whole step, the decoder layers, or neither).

    python bench/compile_cpu.py                  # demo model + heads, its 16-node plan tree, batch 1, 2, 4, 8
    python bench/compile_cpu.py --backend inductor,eager   # inductor and dynamo's capture alone, side by side
    python bench/compile_cpu.py --backend layers           # the CPU default: the decoder layers compiled
    python bench/compile_cpu.py --tiny --batches 1,2 --max-new-tokens 16    # plumbing only (minutes)

Run it on an idle machine (`uptime` load near 0): each compiled engine (one per `--backend`; `eager` is dynamo's
one-graph capture run op by op, without a compiler; `layers` compiles the decoder layers alone, the CPU default)
compiles each (batch, tree size) once in an untimed warm-up (`compile_s`, a one-off cost per shape and process),
then eager and compiled generations of the same prompts
alternate, `--rounds` times, so a load change hits every mode alike. Per (batch, tree, backend): the median step of
each mode, the speedup, the compile time and the steps after which compiling has paid for itself. Greedy fp32
outputs of every mode must be identical (exit 1 otherwise). Writes JSON (bench/results/compile-cpu.json unless
--out) with the setting (threads, CPU, versions, load) of the measurement.
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

from decode import _setup, prompts_for  # noqa: E402  (bench/decode.py: the same model and prompt setup)
from workbench import WorkbenchError  # noqa: E402
from workbench.cli.shared import parse_ints, ScriptParser, run_script  # noqa: E402
from workbench.core.io import atomic_write_json  # noqa: E402
from workbench.core.provenance import load_average  # noqa: E402
from workbench.core.speed import tokens_per_step  # noqa: E402
from workbench.decode.loop import medusa_generate, vanilla_generate  # noqa: E402
from workbench.measure.latency import measured_setting  # noqa: E402
from workbench.runtime import compiled  # noqa: E402
from workbench.runtime.compiled import compile_options, default_compile  # noqa: E402
from workbench.runtime.engine import StepEngine  # noqa: E402
from workbench.runtime.treemask import root_setup, tree_setup  # noqa: E402
from workbench.runtime.generation import prepare_prompt  # noqa: E402
from workbench.trees.tree import load_tree  # noqa: E402

DEMO_TREE = HERE.parent / "trees" / "smollm2-135m-instruct-alpaca-eval-joint-16.json"
LAYERS = "layers"  # --backend name of the CPU default: every decoder layer compiled by inductor, the step eager
PAYS = 1000  # a default compiles: faster at every (batch, tree) and paid back within this many steps of each


def main(argv=None) -> int:
    ap = ScriptParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model")
    ap.add_argument("--heads")
    ap.add_argument("--tiny", action="store_true", help="tiny random model and heads (plumbing only)")
    ap.add_argument("--tree", help=f"the Medusa tree timed beside the plain step (default: {DEMO_TREE.name}, "
                                   "mc_sim_7b_63 with --tiny)")
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--prompts", help="prompt set or file (default: mt-bench)")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3, help="eager/compiled alternations per (batch, tree)")
    ap.add_argument("--backend", default="inductor", help="torch.compile backend(s), comma-separated: inductor, eager "
                                                           "(dynamo's capture without a compiler), aot_eager (tests)")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--dtype")
    ap.add_argument("--out", default=str(HERE / "results" / "compile-cpu.json"))
    return run_script(ap, run, argv)


def run(args) -> int:
    batches = parse_ints(args.batches, "--batches", "batch")
    if args.rounds < 1 or args.max_new_tokens < 2 or (args.threads is not None and args.threads < 1):
        raise WorkbenchError("--rounds >= 1; --max-new-tokens >= 2; --threads >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    backends = list(dict.fromkeys(b.strip() for b in args.backend.split(",") if b.strip()))
    known = torch._dynamo.list_backends(exclude_tags=()) + [LAYERS]
    if not backends or set(backends) - set(known):
        raise WorkbenchError(f"--backend {args.backend!r}: comma-separated torch.compile backends, e.g. "
                             f"inductor,eager (the names torch._dynamo.list_backends() gives), or {LAYERS}")
    args.device, args.raw = "cpu", False
    model, tok, heads, label = _setup(args)
    tree = load_tree(args.tree or ("mc_sim_7b_63" if args.tiny else str(DEMO_TREE)), num_heads=heads.num_heads)
    bufs = {"plain": root_setup(model), tree.name or "tree": tree_setup(tree, model)}
    encoded = [prepare_prompt(tok, p) for p in prompts_for(args.prompts, max(batches))]
    encoded = [encoded[i % len(encoded)] for i in range(max(batches))]
    n = args.max_new_tokens
    engines = {None: StepEngine(model, compile=False),  # None: not compiled (a backend may be called "eager")
               **{b: StepEngine(model, compile=LAYERS) if b == LAYERS else StepEngine(model, compile=True, backend=b)
                  for b in backends}}
    for e in engines.values():
        e.size_for(encoded, n, list(bufs.values()))
    rows, exact = [], True
    for b in batches:
        chunk = encoded[:b]
        for name, buf in bufs.items():
            def gen(engine):
                if buf.depth == 0:
                    return vanilla_generate(model, tok, chunk, n, eos_token_id=[], engine=engine)
                return medusa_generate(model, heads, tok, chunk, buf, n, eos_token_id=[], engine=engine)
            compile_s = {}
            for backend in backends:
                t0 = time.perf_counter()
                first = gen(engines[backend])  # compiles (untimed inside: compile_s) then decodes
                compile_s[backend] = first[0].compile_s
                print(f"batch {b}, {name}, {backend}: compiled in {compile_s[backend]:.1f} s "
                      f"({time.perf_counter() - t0:.1f} s with the first generation)", file=sys.stderr)
            steps = {m: [] for m in engines}
            calls = {m: [] for m in engines}
            for _ in range(args.rounds):
                for mode, engine in engines.items():
                    out = gen(engine)
                    steps[mode] += [s.time_s for s in out[0].steps]
                    calls[mode].append(out)
            same = all([r.token_ids for r in c] == [r.token_ids for r in calls[None][0]]
                       for m in engines for c in calls[m])
            exact &= same or model.dtype != torch.float32
            eager_s = statistics.median(steps[None])
            for backend in backends:
                comp_s = statistics.median(steps[backend])
                gain = eager_s - comp_s
                rows.append(dict(batch=b, tree=name, tree_size=buf.size, backend=backend, eager_ms=1e3 * eager_s,
                                 compiled_ms=1e3 * comp_s, speedup=eager_s / comp_s, compile_s=compile_s[backend],
                                 pays_after_steps=compile_s[backend] / gain if gain > 0 else None,
                                 tokens_per_step=tokens_per_step(calls[None][0]), identical=same,
                                 steps=len(steps[None])))
                print(line(rows[-1]), file=sys.stderr)
    pays = {b: all(r["pays_after_steps"] is not None and r["pays_after_steps"] <= PAYS for r in rows
                   if r["backend"] == b) for b in backends}
    report = dict(model=label, backend=",".join(backends),
                  compile_options={b: compile_options(model.device, b) for b in backends},
                  setting=measured_setting(model, engines[backends[0]], "compile-cpu"),
                  load_average=load_average(),
                  max_new_tokens=n, rounds=args.rounds, rows=rows, compiled_pays=pays,
                  default_compile=default_compile(model.device), default_layers=compiled.default_on(model))
    atomic_write_json(args.out, report)
    print(table(rows, report))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0 if exact else 1


def line(r: dict) -> str:
    pay = f"{r['pays_after_steps']:>9.0f}" if r["pays_after_steps"] is not None else f"{'never':>9}"
    return (f"{r['batch']:>3} {r['tree'][:24]:<24} {r['tree_size']:>3} {r['backend'][:9]:<9} {r['eager_ms']:>9.1f} "
            f"{r['compiled_ms']:>9.1f} {r['speedup']:>7.2f}x {r['compile_s']:>9.1f} {pay} "
            f"{'yes' if r['identical'] else 'NO':>5}")


def table(rows: list[dict], report: dict) -> str:
    s = report["setting"]
    head = (f"{'B':>3} {'tree':<24} {'N':>3} {'backend':<9} {'eager ms':>9} {'comp. ms':>9} {'speedup':>8} "
            f"{'compile s':>9} {'pays after':>9} {'same':>5}")
    verdict = [f"{b}: faster than eager at every batch and tree, each shape's compiling paid back within {PAYS} steps: "
               "fit for a default" if ok else f"{b}: slower somewhere, or paid back only after more than {PAYS} steps "
               "of a shape: not a default" for b, ok in report["compiled_pays"].items()]
    return "\n".join([f"{report['model']} on cpu ({s.get('dtype')}, {s.get('threads')} threads, backend "
                      f"{report['backend']}, load {report['load_average']})", head, "-" * len(head),
                      *map(line, rows), *verdict,
                      "current CPU default: " + ("the whole step compiled" if report["default_compile"] else
                                                 "the decoder layers compiled" if report["default_layers"] else "eager")])


if __name__ == "__main__":
    sys.exit(main())
