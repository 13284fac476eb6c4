"""Benchmark: `workbench calibrate` (batched generate + one teacher-forced forward) against the reference procedure.

    python bench/calibrate.py [--heads DIR | --random-heads K] [--limit 32] [--max-new-tokens 128]
                              [--gen-batch 16] [--threads N] [--out bench/results/calibrate.json]

Reference (what Medusa's heads_accuracy.py does): per prompt, prefill, then single-token greedy steps on a KV
cache, running every head's top-k at every step; ranks follow once the answer is known. Both run in this process
on the same model, prompts and dtype. Targets: the same a_k^(i) within 0.005, the same continuation for >= 99% of
prompts, and >= 5x less wall time. The runner's time includes its own model loading and file writing; the
reference's does not (it gets a loaded model), so the ratio is conservative. Prints a table, writes JSON.
"""
from __future__ import annotations

import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from workbench import __version__  # noqa: E402
from workbench.cli.shared import ScriptParser, run_script  # noqa: E402
from workbench.calibrate.folder import Calibration  # noqa: E402
from workbench.calibrate.ranks import NULL, head_accuracies, path_probabilities, ranks_frame  # noqa: E402
from workbench.calibrate.run import CalibrateConfig, calibrate  # noqa: E402
from workbench.core.data import load_prompt_records  # noqa: E402
from workbench.core.io import atomic_write_json  # noqa: E402
from workbench.core.provenance import dtype_name  # noqa: E402
from workbench.runtime.forward import forward, logits_of, new_cache, prefill  # noqa: E402
from workbench.runtime.generation import eos_ids, prepare_prompt  # noqa: E402
from workbench.runtime.heads import save_heads  # noqa: E402
from workbench.runtime.models import load_base, load_model_and_heads  # noqa: E402
from tests.support.tiny import random_heads  # noqa: E402


@torch.inference_mode()
def reference_ranks(model, heads, prompt: list[int], max_new_tokens: int, topk: int, stops: set[int]):
    """Step by step: at each step the root is the base's argmax and each head's top-k is recorded."""
    lm_head = model.get_output_embeddings()
    cache = new_cache(model)
    hidden = prefill(model, torch.tensor([prompt], device=model.device), cache)  # [H]
    cont, tops = [], []
    while True:
        token = logits_of(model, hidden).argmax()
        tops.append(heads(hidden, lm_head).topk(topk, dim=-1).indices.cpu())  # [K, topk] guesses for c[t+k]
        cont.append(int(token))
        if cont[-1] in stops or len(cont) >= max_new_tokens:
            break
        hidden = forward(model, token.view(1, 1), None, None, cache)[0, -1]  # that token's, appended to the cache
    K, N = heads.num_heads, len(cont)
    ranks = np.full((N, K), NULL, dtype=np.int16)
    for t in range(N):
        for k in range(1, K + 1):
            if t + k < N:
                hit = (tops[t][k - 1] == cont[t + k]).nonzero()
                ranks[t, k - 1] = int(hit[0, 0]) if len(hit) else -1
    return cont, ranks


def main(argv=None) -> int:
    ap = ScriptParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="base model (default: the demo SmolLM2-135M-Instruct)")
    ap.add_argument("--heads", help="Medusa heads folder (default: the demo heads)")
    ap.add_argument("--random-heads", type=int, metavar="K",
                    help="instead: K random non-zero tied heads (saved to a temporary folder)")
    ap.add_argument("--prompts", default="alpaca-eval")
    ap.add_argument("--limit", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--topk", type=int, default=10)
    ap.add_argument("--gen-batch", dest="batch_size", type=int, default=16, help="prompts answered together")
    ap.add_argument("--device")
    ap.add_argument("--dtype")
    ap.add_argument("--threads", type=int, help="torch CPU threads for both (1 avoids oversubscription on a shared "
                    "machine, where batched matmuls can get 100x slower)")
    ap.add_argument("--out", default="bench/results/calibrate.json")
    return run_script(ap, _run, argv)


def _run(args) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)

    tmp = Path(tempfile.mkdtemp(prefix="bench-calibrate-"))
    heads_dir = args.heads
    if args.random_heads:
        base, _ = load_base(args.model, args.device, args.dtype)
        hidden, vocab = base.config.hidden_size, base.get_output_embeddings().weight.shape[0]
        heads_dir = str(save_heads(random_heads(hidden, vocab, args.random_heads, tied=True, seed=0, std=0.02),
                                   tmp / "heads", args.model or "demo"))
        del base

    # ---- the runner (end to end: load, generate, rank, write files)
    t0 = time.perf_counter()
    meta = calibrate(CalibrateConfig(model=args.model, heads=heads_dir, prompts=args.prompts, limit=args.limit,
                                     holdout=0.0, max_new_tokens=args.max_new_tokens, topk=args.topk, budgets=(16,),
                                     name="bench", out=tmp / "cal", device=args.device, dtype=args.dtype,
                                     batch_size=args.batch_size))
    runner_s = time.perf_counter() - t0
    ours = Calibration(tmp / "cal").ranks("all")
    import pandas as pd
    ours_conts = pd.read_parquet(tmp / "cal" / "continuations.parquet").set_index("prompt_id")["continuation"]

    # ---- the reference (model loaded outside the timer)
    model, tok, heads = load_model_and_heads(args.model, heads_dir, args.device, args.dtype)
    records = load_prompt_records(args.prompts, args.limit)
    stops = eos_ids(model, tok)
    ref_conts, ref_ranks = {}, []
    t0 = time.perf_counter()
    for pid, text in records:
        cont, ranks = reference_ranks(model, heads, prepare_prompt(tok, text), args.max_new_tokens, args.topk, stops)
        ref_conts[pid] = cont
        ref_ranks.append(ranks)
    reference_s = time.perf_counter() - t0
    ref = ranks_frame([pid for pid, _ in records], ref_ranks, heads.num_heads)

    acc_ours, _ = head_accuracies(ours, args.topk)
    acc_ref, _ = head_accuracies(ref, args.topk)
    same = [list(ours_conts[pid]) == ref_conts[pid] for pid, _ in records]
    first_diff = [next((i for i, (a, b) in enumerate(zip(ours_conts[pid], ref_conts[pid])) if a != b),
                       min(len(ours_conts[pid]), len(ref_conts[pid])))
                  for (pid, _), s in zip(records, same) if not s]
    pp_ours, pp_ref = path_probabilities(ours), path_probabilities(ref)
    pp_diff = max((abs(pp_ours.get(p, 0) - pp_ref.get(p, 0)) for p in set(pp_ours) | set(pp_ref)), default=0.0)
    acc_diff = float(np.abs(acc_ours - acc_ref).max())
    # like for like: both without model loading (the runner's own clock covers its batches: generate, rank, write)
    runner_compute_s = float(meta["compute_seconds"])
    speedup = reference_s / runner_compute_s

    print(f"{len(records)} prompts of {args.prompts}, {heads.num_heads} heads, top-{args.topk}, "
          f"max {args.max_new_tokens} new tokens, {model.device.type} {dtype_name(model.dtype)}")
    print(f"{'head':>4}  {'top-1 runner':>12}  {'top-1 ref':>10}  {'top-5 runner':>12}  {'top-5 ref':>10}  "
          f"{'max |diff| over ranks':>21}")
    for k in range(heads.num_heads):
        print(f"{k + 1:>4}  {acc_ours[k, 0]:>12.4f}  {acc_ref[k, 0]:>10.4f}  {acc_ours[k, :5].sum():>12.4f}  "
              f"{acc_ref[k, :5].sum():>10.4f}  {np.abs(acc_ours[k] - acc_ref[k]).max():>21.5f}")
    rows = [("wall time, runner end to end incl. load (s)", f"{runner_s:.2f}"),
            ("wall time, runner without load (s)", f"{runner_compute_s:.2f}"),
            ("wall time, reference without load (s)", f"{reference_s:.2f}"),
            ("speedup (target >= 5x)", f"{speedup:.2f}x"),
            ("max |a_k^(i) diff| (target <= 0.005)", f"{acc_diff:.5f}"),
            ("max |path probability diff|", f"{pp_diff:.5f}"),
            ("identical continuations (target >= 99%)", f"{sum(same)}/{len(same)}"),
            ("positions runner / reference", f"{len(ours)} / {len(ref)}")]
    for name, val in rows:
        print(f"{name:<44}{val:>12}")

    result = dict(version=__version__, machine=platform.machine(), python=platform.python_version(),
                  torch=torch.__version__, device=model.device.type, dtype=dtype_name(model.dtype),
                  threads=torch.get_num_threads(), model=meta["model"], heads=args.heads or
                  (f"random tied x{args.random_heads}" if args.random_heads else "demo"), prompts=args.prompts,
                  num_prompts=len(records), max_new_tokens=args.max_new_tokens, topk=args.topk,
                  batch_size=args.batch_size, runner_s=runner_s, runner_compute_s=runner_compute_s,
                  reference_s=reference_s, speedup=speedup, speedup_end_to_end=reference_s / runner_s,
                  max_acc_diff=acc_diff, max_path_prob_diff=pp_diff, identical_continuations=sum(same),
                  first_divergence=first_diff, positions_runner=len(ours), positions_reference=len(ref),
                  acc_runner=acc_ours.tolist(), acc_reference=acc_ref.tolist(),
                  passed=dict(acc=acc_diff <= 0.005, continuations=sum(same) >= 0.99 * len(same), speed=speedup >= 5))
    atomic_write_json(args.out, result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
