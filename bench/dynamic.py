"""Static or per-step tree at budget N, live: for each budget and batch size, the static optimal N-node tree (joint
paths, fit prompts) and the per-step tree of N nodes chosen from the envelope (the 64-node joint tree) inside the
step, decoded on held-out prompts beside vanilla greedy, the three back to back on the same batch.

    python bench/dynamic.py --limit 4 --max-new-tokens 16 --budgets 4,16 --batch-sizes 1    # quick check
    python bench/dynamic.py --threads 2      # the committed table: budgets 4..64 at batch 1, 2, 4 (idle machine)

Per (batch, budget, kind): tokens/step replayed over exactly these prompts' answers (the calibration's walk; the
per-step tree's on the heads' recorded log-probs, topk.parquet) and measured, the batch's tokens/step, the step's
cost over vanilla's (a per-step tree's selection included: it is measured, not assumed) and the decoding speedup,
each with its spread over repeats, all from speed.py. A lossless greedy decoder must measure the replay up to the
heads' rounding between calibration and decoding (a near-tie of path scores can pick another node). Writes JSON
(bench/results/dynamic-cpu.json unless --out) with the setting; a killed run resumes per batch size.
"""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from prediction import measure_specs, repeats_at  # noqa: E402  (bench/prediction.py: the same measurement)
from workbench import WorkbenchError  # noqa: E402
from workbench.calibrate.folder import Calibration, default_calibration  # noqa: E402
from workbench.calibrate.ranks import answer_rows, batch_walk, walk_answers, walk_steps  # noqa: E402
from workbench.cli.shared import parse_ints, ScriptParser, run_script  # noqa: E402
from workbench.core.io import atomic_write_json  # noqa: E402
from workbench.core.provenance import describe, load_average, loaded, without_load  # noqa: E402
from workbench.measure.latency import measured_setting  # noqa: E402
from workbench.core.speed import prediction_error, spread  # noqa: E402
from workbench.core.work import WorkState, remove_work  # noqa: E402
from workbench.trees.dynamic import DynamicPolicy  # noqa: E402
from workbench.trees.optimize import optimal_tree_from  # noqa: E402
from workbench.trees.tree import Tree, load_tree  # noqa: E402

ENVELOPE = HERE.parent / "trees" / "smollm2-135m-instruct-alpaca-eval-joint-64.json"


def candidates(cal: Calibration, envelope: Tree, budgets: list[int]) -> dict:
    """{name: tree or policy}: per budget the static optimal tree of joint paths (fit prompts) and the per-step
    tree of as many nodes from the envelope."""
    K, R = cal.accuracies("fit").shape
    out = {}
    for n in budgets:
        out[f"static_{n}"] = optimal_tree_from(cal.joint_value("fit"), n, K, R, name=f"static_{n}")
        out[f"dynamic_{n}"] = DynamicPolicy(n, envelope)
    return out


def replayed(cal: Calibration, tree, prompt_ids: list[str], max_new_tokens: int, batch: int) -> tuple[float, float]:
    """(tokens/step of each sequence, of a batch of `batch`) replayed over these prompts' answers."""
    answers = cal.answers("all", max_new_tokens)
    these = answers[answers["prompt_id"].isin(prompt_ids)]
    rows = answer_rows(these, cal.head_logprobs(these)) if isinstance(tree, DynamicPolicy) else answer_rows(these)
    steps = walk_steps(tree, rows)
    return walk_answers(tree, rows, steps), batch_walk(tree, rows, batch, steps)


def rows_of(cal, trees: dict, measured: dict, prompt_ids: list[str], max_new_tokens: int) -> list[dict]:
    rows = []
    for b, at in measured.items():
        for name, m in at.items():
            tree = trees[name]
            tps, bt = spread(m["tokens_per_step"]), spread(m["batch_tokens_per_step"])
            sp, ratio = spread(m["speedup"]), spread(m["step_ratio"])
            these, batch_these = replayed(cal, tree, prompt_ids, max_new_tokens, int(b))
            rows.append(dict(batch_size=int(b), kind=name.split("_")[0], nodes=tree.nodes, name=name,
                             replay_these=these, measured_tokens_per_step=tps["median"],
                             tokens_per_step_q1=tps["q1"], tokens_per_step_q3=tps["q3"],
                             tokens_per_step_err_pct=100 * prediction_error(these, tps["median"]),
                             replay_batch_these=batch_these, measured_batch_tokens_per_step=bt["median"],
                             step_ratio=ratio["median"], step_ratio_q1=ratio["q1"], step_ratio_q3=ratio["q3"],
                             measured_speedup=sp["median"], speedup_q1=sp["q1"], speedup_q3=sp["q3"],
                             repeats=sp["repeats"]))
    return sorted(rows, key=lambda r: (r["batch_size"], r["nodes"], r["kind"] != "static"))


def table(rows: list[dict]) -> str:
    head = (f"{'B':>2} {'nodes':>5} {'kind':<8} {'tok/step replay':>15} {'measured':>9} {'err':>6}  "
            f"{'batch replay/meas':>17}  {'step ratio (q1..q3)':>21}  {'speedup (q1..q3)':>20}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['batch_size']:>2} {r['nodes']:>5} {r['kind']:<8} {r['replay_these']:>15.3f} "
                     f"{r['measured_tokens_per_step']:>9.3f} {r['tokens_per_step_err_pct']:>+5.1f}%  "
                     f"{r['replay_batch_these']:>8.3f}/{r['measured_batch_tokens_per_step']:<8.3f}  "
                     f"{r['step_ratio']:>6.3f} ({r['step_ratio_q1']:.3f}..{r['step_ratio_q3']:.3f})  "
                     f"{r['measured_speedup']:>6.3f}x ({r['speedup_q1']:.2f}..{r['speedup_q3']:.2f})")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = ScriptParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calibration", help="calibration folder with topk.parquet (default: the demo's)")
    ap.add_argument("--envelope", default=str(ENVELOPE), help="the per-step trees' envelope (default: the 64-node "
                                                             "joint tree)")
    ap.add_argument("--budgets", default="4,8,16,32,64")
    ap.add_argument("--batch-sizes", default="1,2,4")
    ap.add_argument("--limit", type=int, default=16, help="held-out prompts decoded (default 16)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", default="2", help="passes over the prompts, or one count per batch size")
    ap.add_argument("--threads", type=int, help="torch CPU threads")
    ap.add_argument("--compile", action="store_true", help="compile the steps (inductor; default: the decoder's "
                                                          "default for the device)")
    ap.add_argument("--out", default=str(HERE / "results" / "dynamic-cpu.json"))
    return run_script(ap, run, argv)


def run(args) -> int:
    import torch

    from workbench.runtime.engine import StepEngine
    from workbench.runtime.generation import prepare_prompt
    from workbench.runtime.models import load_model_and_heads
    from workbench.runtime.treemask import tree_setup

    if args.threads:
        torch.set_num_threads(args.threads)
    budgets = parse_ints(args.budgets, "--budgets", "nodes")
    batch_sizes = parse_ints(args.batch_sizes, "--batch-sizes", "batch")
    repeats = repeats_at(args.repeats, batch_sizes)
    cal = Calibration(args.calibration or default_calibration())
    envelope = load_tree(args.envelope)
    if max(budgets) > envelope.nodes:
        raise WorkbenchError(f"--budgets {max(budgets)}: the envelope has {envelope.nodes} nodes; give a larger "
                             "--envelope or smaller budgets")
    records = cal.holdout_prompts(args.limit)
    if batch_sizes[-1] > len(records):
        raise WorkbenchError(f"--batch-sizes: batch {batch_sizes[-1]} but {len(records)} held-out prompts: raise "
                             "--limit")
    trees = candidates(cal, envelope, budgets)
    ids = [pid for pid, _ in records]
    replayed(cal, trees[f"dynamic_{budgets[0]}"], ids, args.max_new_tokens, 1)  # no topk.parquet: stop before loading
    heads_dir = None if cal.meta.get("heads") in (None, "demo") else cal.meta["heads"]
    model, tok, heads = load_model_and_heads(None if heads_dir is None else cal.meta.get("model"), heads_dir, None)
    prompts = [prepare_prompt(tok, text, False) for _, text in records]
    engine = StepEngine(model, compile=True if args.compile else None)
    here = measured_setting(model, engine, "decoder-step")
    state = WorkState(args.out, dict(command="bench/dynamic.py", calibration=str(cal.folder), prompts=ids,
                                     budgets=budgets, envelope=envelope.as_lists(), max_new_tokens=args.max_new_tokens,
                                     repeats=repeats, setting=without_load(here)))
    measured = {}
    for b in batch_sizes:
        specs = {k: t if isinstance(t, DynamicPolicy) else tree_setup(t, model) for k, t in trees.items()}
        one = lambda b=b, specs=specs: measure_specs(model, heads, tok, prompts, b, specs,  # noqa: E731
                                                     args.max_new_tokens, repeats[b], engine,
                                                     lambda s: print(s, file=sys.stderr))
        measured[b] = state.piece(f"batch-{b}", one)
    rows = rows_of(cal, trees, measured, ids, args.max_new_tokens)
    here["load_average_end"] = load_average()
    atomic_write_json(args.out, dict(calibration=str(cal.folder), envelope=envelope.name or args.envelope,
                                     setting=here, prompts=len(prompts), max_new_tokens=args.max_new_tokens,
                                     repeats=repeats, rows=rows))
    print(f"{cal.folder.name}: {len(prompts)} held-out prompts, {args.max_new_tokens} new tokens, envelope "
          f"{envelope.nodes} nodes\nthis run: {describe(here)}")
    print(table(rows))
    if loaded(here):
        print("WARNING: busy machine (load average above half the cores): the measured speeds are not this "
              "machine's", file=sys.stderr)
    remove_work(args.out)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
