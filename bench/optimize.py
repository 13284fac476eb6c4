"""Benchmark: optimal-tree construction time for 5 heads x top-10, every budget 1..256 (target < 50 ms at 256).

    python bench/optimize.py [--max-budget 256] [--repeats 5] [--out bench/results/optimize.json]

Accuracies: Vicuna-7B's heads (tests/data/medusa_vicuna7b_head_acc.csv, top-1/top-5 spread over ranks
the same way as the tests) when present, else a fixed random table. Prints a table, writes every row as JSON.
"""
from __future__ import annotations

import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from workbench import REPO_ROOT  # noqa: E402
from workbench.cli.shared import ScriptParser, run_script  # noqa: E402
from workbench.core.io import atomic_write_json  # noqa: E402
from workbench.trees.optimize import expected_curve, expected_length, optimal_tree  # noqa: E402

VICUNA_CSV = REPO_ROOT / "tests" / "data" / "medusa_vicuna7b_head_acc.csv"  # Medusa's assets/medusa_acc.csv


def accuracies() -> tuple[np.ndarray, str]:
    import pandas as pd

    df = pd.read_csv(VICUNA_CSV)
    rows = [np.concatenate([[t1], (t5 - t1) * np.array([0.4, 0.3, 0.2, 0.1]),
                            min(0.1, 1 - t5) * np.array([0.35, 0.25, 0.18, 0.12, 0.10])])
            for t1, t5 in zip(df["top1"], df["top5"])]
    return np.array(rows), "vicuna-7b top1/top5 spread over 10 ranks"


def main(argv=None) -> int:
    ap = ScriptParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-budget", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per budget (median reported)")
    ap.add_argument("--out", default="bench/results/optimize.json")
    return run_script(ap, _run, argv)


def _run(args) -> int:
    acc, source = accuracies()
    optimal_tree(acc, args.max_budget)  # warm-up (imports, caches)
    rows = []
    for n in range(1, args.max_budget + 1):
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            tree = optimal_tree(acc, n)
            times.append((time.perf_counter() - t0) * 1e3)
        rows.append(dict(budget=n, nodes=tree.nodes, depth=tree.depth, expected_length=expected_length(tree, acc),
                         ms=statistics.median(times), ms_min=min(times)))
    t0 = time.perf_counter()
    curve = expected_curve(acc, args.max_budget)
    curve_ms = (time.perf_counter() - t0) * 1e3
    assert np.allclose(curve[1:], [r["expected_length"] for r in rows])

    show = sorted({1, 2, 4, 8, 16, 32, 63, 64, 128, args.max_budget} & set(range(1, args.max_budget + 1)))
    print(f"accuracies: {source}; {acc.shape[0]} heads x top-{acc.shape[1]}; median of {args.repeats} runs")
    print(f"{'budget':>6} {'depth':>5} {'expected_length':>15} {'ms':>8}")
    for r in rows:
        if r["budget"] in show:
            print(f"{r['budget']:>6} {r['depth']:>5} {r['expected_length']:>15.4f} {r['ms']:>8.2f}")
    last = rows[-1]
    print(f"budget {last['budget']}: {last['ms']:.2f} ms per optimal tree (target < 50 ms); "
          f"whole curve 1..{args.max_budget} in one run: {curve_ms:.2f} ms")
    atomic_write_json(args.out, dict(
        benchmark="optimize", accuracies=source, heads=int(acc.shape[0]), ranks=int(acc.shape[1]),
        repeats=args.repeats, python=platform.python_version(), machine=platform.machine(),
        curve_ms=curve_ms, target_ms_at_max_budget=50.0, rows=rows))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
