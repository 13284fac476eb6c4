"""How far rounding moves a top-2 logit margin between Medusa's tree forward and vanilla's 1-token forward: the
measurement behind `workbench.decode.divergence.ROUNDING_UNITS` (the near-tie bound of divergence reports).

    python bench/rounding.py --dtype bfloat16 --limit 8       # demo model + heads, Alpaca-eval prompts
    python bench/rounding.py --tiny --dtype float32           # tiny random Llama, random heads

For every position both runs share (up to the first divergence) where both rank the same top 2 tokens, it takes
|margin in the Medusa run - margin in the vanilla run| in units of u * max|logit| (u = the dtype's unit roundoff)
and prints the median, 99th percentile and maximum beside the bound in use. Writes JSON (--out, default
bench/results/rounding-{demo,tiny}-DTYPE-cpu.json).
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from workbench.core.io import atomic_write_json  # noqa: E402
from workbench.cli.shared import ScriptParser, run_script  # noqa: E402
from workbench.core.provenance import dtype_name  # noqa: E402
from workbench.decode.divergence import ROUNDING_UNITS, divergences, unit_roundoff  # noqa: E402
from workbench.decode.loop import medusa_generate, vanilla_generate  # noqa: E402
from workbench.runtime.generation import prepare_prompt  # noqa: E402


def drift_units(med, van, dtype) -> list[float]:
    """|margin_medusa - margin_vanilla| / (u max|logit|) at every shared position with the same top 2."""
    found = divergences(med, van, dtype)
    shared = found[0]["position"] + 1 if found else min(len(med.token_ids), len(van.token_ids))
    out = []
    for k in range(shared):
        cm, cv = med.choice(k), van.choice(k)
        if cm["ids"][:2] == cv["ids"][:2]:
            moved = abs((cm["top"][0] - cm["top"][1]) - (cv["top"][0] - cv["top"][1]))
            out.append(moved / (unit_roundoff(dtype) * max(cm["max_abs"], cv["max_abs"])))
    return out


def main(argv=None) -> int:
    ap = ScriptParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="tiny random Llama with random heads")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--tree", default="mc_sim_7b_63")
    ap.add_argument("--limit", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--out", help="default: bench/results/rounding-{demo,tiny}-DTYPE-cpu.json")
    return run_script(ap, _run, argv)


def _run(args) -> int:
    torch.set_num_threads(1)
    if args.tiny:
        from workbench.runtime.models import pick_dtype
        from tests.support.tiny import random_heads, tiny_model

        dtype = pick_dtype(args.dtype, torch.device("cpu"))
        model, heads, tok = tiny_model("llama", seed=10, max_positions=1024).to(dtype), \
            random_heads(64, 128, 5, seed=1).to(dtype), None
        prompts = [list(range(5 + i, 20 + i)) for i in range(args.limit)]
    else:
        from workbench.core.data import load_prompts
        from workbench.runtime.models import load_model_and_heads

        model, tok, heads = load_model_and_heads(None, None, "cpu", args.dtype)
        dtype = model.dtype
        prompts = [prepare_prompt(tok, p) for p in load_prompts("alpaca-eval", args.limit)]
    units, first = [], []
    for i, ids in enumerate(prompts):
        van = vanilla_generate(model, tok, ids, args.max_new_tokens, eos_token_id=[] if args.tiny else None)
        med = medusa_generate(model, heads, tok, ids, args.tree, args.max_new_tokens,
                              eos_token_id=[] if args.tiny else None)
        units += drift_units(med, van, dtype)
        first += divergences(med, van, dtype)
        print(f"prompt {i + 1}/{len(prompts)} done", file=sys.stderr)
    units.sort()
    stats = dict(positions=len(units), median=statistics.median(units), p99=units[int(0.99 * (len(units) - 1))],
                 max=units[-1], bound=ROUNDING_UNITS.get(dtype))
    name = dtype_name(dtype)
    print(f"{'tiny random llama' if args.tiny else 'demo model'} {name}, {args.tree}, {len(prompts)} prompts x "
          f"{args.max_new_tokens}: margin drift in units of u*max|logit| over {stats['positions']} positions: "
          f"median {stats['median']:.2f}, p99 {stats['p99']:.2f}, max {stats['max']:.2f} (bound {stats['bound']})")
    print(f"first divergences: {[(d['position'], d['kind']) for d in first]}")
    label = "tiny" if args.tiny else "demo"
    out = args.out or Path(__file__).resolve().parent / "results" / f"rounding-{label}-{name}-cpu.json"
    atomic_write_json(out, dict(model=label, dtype=name, tree=args.tree,
                                     prompts=len(prompts), max_new_tokens=args.max_new_tokens, torch=torch.__version__,
                                     drift_units=stats, divergences=first))
    return 0


if __name__ == "__main__":
    sys.exit(main())
