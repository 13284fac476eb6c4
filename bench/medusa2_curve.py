"""The Medusa-2 trade-off curve: what each (λ0, steps) buys in head accuracy and costs in backbone drift.

One `workbench train-heads --recipe medusa-2` per point (all points share one work folder, so the self-distilled
data is generated once; each λ0 keeps its own checkpoint there, named by its settings but not its steps, so a longer
point extends a shorter one), then `workbench eval-heads` on the held-out split. Every point is resumable
(train-heads resumes from its checkpoint; a point whose evaluation exists is skipped), so the whole curve survives
a kill and can run in the background for hours:

    nohup python bench/medusa2_curve.py --lambda0 0.01,0.2,1 --steps 100,300 --work runs/m2curve &

Writes a table (stdout, --table) and JSON (--out) with one row per point: heads' top-1 (Medusa-1 beside),
backbone top-1 agreement, perplexity ratio of the original's answers, greedy identity and live tokens/step.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workbench.core.io import atomic_write_json, atomic_write_text  # noqa: E402
from workbench.cli.shared import ScriptParser, parse_floats, parse_ints, run_script  # noqa: E402
from workbench.core.provenance import load_average  # noqa: E402

TRAINING_SETS = ("alpaca_en_demo_1k.json", "gpteacher_roleplay_alpaca.json", "gsm8k_train_alpaca.json")


def workbench(*args: str) -> None:
    cmd = [sys.executable, "-m", "workbench.cli", *args]
    print("+ workbench " + " ".join(args), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True)


def point(work: Path, data: Path, lambda0: float, steps: int, a) -> dict:
    """Train (or resume) and evaluate one point; its evaluation JSON is the proof it finished."""
    out = work / f"lambda{lambda0:g}-steps{steps}"
    ev = out / "eval.json"
    if not ev.is_file():
        if not (out / "merged").is_dir():
            workbench("train-heads", "--recipe", "medusa-2", "--prompts", *[str(data / f) for f in TRAINING_SETS],
                      "--tokens", str(a.tokens), "--max-new-tokens", "128",
                      "--sequences-per-step", str(a.sequences_per_step),
                      "--steps", str(steps), "--lambda0", f"{lambda0:g}", "--no-amp", "--work", str(work / "train"),
                      "--out", str(out))
        workbench("eval-heads", "--medusa2", str(out / "merged"), "--limit", str(a.limit), "--max-new-tokens",
                  str(a.max_new_tokens), "--live", str(a.live), "--out", str(ev))
    r = json.loads(ev.read_text())  # eval-heads' JSON (evaluate.evaluate_medusa2)
    return dict(lambda0=lambda0, steps=steps,
                head1_top1=(r["medusa1_topk"][0][0], r["medusa2_topk"][0][0]),
                head2_top1=(r["medusa1_topk"][1][0], r["medusa2_topk"][1][0]),
                top1_agreement=r["drift"]["top1_agreement"], perplexity_ratio=r["drift"]["perplexity_ratio"],
                greedy_identity=r["greedy_identity"], tokens_per_step_ratio=r.get("tokens_per_step_ratio"))


def table(rows: list[dict]) -> str:
    lines = ["| λ0 | steps | head-1 top-1 (M-1 → M-2) | head-2 top-1 | top-1 agreement | perplexity ratio | "
             "greedy identical | tokens/step ratio |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        tps = f"{r['tokens_per_step_ratio']:.3f}" if r["tokens_per_step_ratio"] else "–"
        lines.append(f"| {r['lambda0']:g} | {r['steps']} | {r['head1_top1'][0]:.3f} → {r['head1_top1'][1]:.3f} | "
                     f"{r['head2_top1'][0]:.3f} → {r['head2_top1'][1]:.3f} | {r['top1_agreement']:.4f} | "
                     f"{r['perplexity_ratio']:.4f} | {r['greedy_identity']:.3f} | {tps} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = ScriptParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lambda0", default="0.01,0.2,1", help="comma-separated λ0 values (default 0.01,0.2,1)")
    ap.add_argument("--steps", default="100,300", help="comma-separated step counts (default 100,300)")
    ap.add_argument("--tokens", type=int, default=20000, help="self-distilled answer tokens (default 20000)")
    ap.add_argument("--sequences-per-step", type=int, default=4, help="sequences per optimizer step (default 4)")
    ap.add_argument("--limit", type=int, default=32, help="held-out prompts evaluated (default 32)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--live", type=int, default=4, help="prompts decoded live per point (default 4)")
    ap.add_argument("--data", default=os.environ.get("WORKBENCH_DATA_DIR", ""),
                    help="folder with the three Alpaca-format training sets (default: $WORKBENCH_DATA_DIR)")
    ap.add_argument("--work", default="runs/medusa2-curve")
    ap.add_argument("--out", help="JSON (default WORK/curve.json)")
    ap.add_argument("--table", help="Markdown table (default WORK/curve.md)")
    return run_script(ap, _run, argv)


def _run(a) -> int:
    lambdas = parse_floats(a.lambda0, "--lambda0")  # finite numbers >= 0, or one error line
    steps = parse_ints(a.steps, "--steps")
    data, work = Path(a.data), Path(a.work)
    missing = [f for f in TRAINING_SETS if not (data / f).is_file()]
    if missing:
        print(f"error: --data {data} lacks {', '.join(missing)}: point --data (or WORKBENCH_DATA_DIR) at the folder "
              "holding the training sets", file=sys.stderr)
        return 2
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for s in steps:
        for lam in lambdas:
            rows.append(point(work, data, lam, s, a))
            atomic_write_json(a.out or work / "curve.json", dict(points=rows, load_average=load_average(every=True)))
            atomic_write_text(a.table or work / "curve.md", table(rows) + "\n")
            print(table(rows), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
