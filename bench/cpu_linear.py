"""The few-row linear kernels on this CPU (workbench/runtime/gemv.py): every linear of the model at 1..64 rows,
each kernel's pass over all of them (weights streamed from memory, as in a forward), and the kernel the decoder
chooses per weight shape.

    python bench/cpu_linear.py                        # the demo model, rows 1,2,3,4,8,16,32,64
    python bench/cpu_linear.py --random-config llama-1b --rows 1,4,16

Run it idle (`uptime` load near 0). Prints ms per pass and GB/s per kernel and row count, the plain call's time
over the fastest's, and the choice; writes JSON (bench/results/cpu-linear.json unless --out) with the setting.
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import torch  # noqa: E402

from workbench.cli.shared import parse_ints, ScriptParser, run_script  # noqa: E402
from workbench.core.io import atomic_write_json  # noqa: E402
from workbench.measure.latency import measured_setting  # noqa: E402
from workbench.runtime import gemv  # noqa: E402
from workbench.runtime.models import load_base, random_model  # noqa: E402


def main(argv=None) -> int:
    ap = ScriptParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="base model (default: the embedded demo)")
    ap.add_argument("--random-config", help="a random-weight model of this shape instead (workbench latency's)")
    ap.add_argument("--rows", default="1,2,3,4,8,16,32,64")
    ap.add_argument("--dtype")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--out", default=str(HERE / "results" / "cpu-linear.json"))
    return run_script(ap, run, argv)


def run(args) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    gemv.forced()  # a bad WORKBENCH_CPU_LINEAR (which the setting records) before anything is measured
    rows = parse_ints(args.rows, "--rows")
    model = (random_model(args.random_config, "cpu", args.dtype) if args.random_config
             else load_base(args.model, "cpu", args.dtype, need_tokenizer=False)[0])
    table = gemv.adopt(model)
    linears = table.linears
    mb = sum(m.weight.numel() * m.weight.element_size() for m in linears) / 1e6
    kinds = [k for k in gemv.KERNELS if gemv.usable(k, linears[0].weight)]
    print(f"{len(linears)} linears, {mb:.0f} MB; kernels: {', '.join(kinds)}; {gemv.REPEATS} passes each")
    print(f"{'rows':>4} " + " ".join(f"{k + ' ms':>14}" for k in kinds) + "  plain/fastest  chosen")
    out = []
    for r in rows:
        times = gemv.timings(linears, r, kinds)
        shapes = sorted({s for _, s in times})
        total = {k: statistics.median([sum(times[k, s][i] for s in shapes) for i in range(gemv.REPEATS)])
                 for k in kinds}
        pick = gemv.decide(times) if r <= gemv.MAX_ROWS else dict.fromkeys(shapes, "linear")
        fastest = min(total.values())
        print(f"{r:>4} " + " ".join(f"{total[k] * 1e3:8.1f} ({mb / total[k] / 1e3:4.1f})" for k in kinds)
              + f"  {total['linear'] / fastest:13.2f}  " + ", ".join(f"{o}x{i}: {pick[o, i]}" for o, i in shapes))
        out.append(dict(rows=r, ms={k: round(v * 1e3, 2) for k, v in total.items()},
                        gb_per_s={k: round(mb / v / 1e3, 2) for k, v in total.items()},
                        by_shape={f"{o}x{i}": {k: round(statistics.median(times[k, (o, i)]) * 1e3, 3) for k in kinds}
                                  for o, i in shapes},
                        chosen={f"{o}x{i}": pick[o, i] for o, i in shapes}))
    report = dict(model=args.random_config or args.model or "demo", megabytes=round(mb, 1), repeats=gemv.REPEATS,
                  margin=gemv.MARGIN, rows=out, setting=measured_setting(model, None, "cpu-linear"))
    atomic_write_json(args.out, report)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
