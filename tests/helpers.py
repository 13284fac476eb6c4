"""Helpers shared by several test files (import them from here, never from another test file).

    Oracle, checked_steps            a proposer that knows the true continuation; the cache-length invariant
    tie_model, rounding_in_tree      a constructed bf16 near-tie and a stand-in for the tree forward's rounding
    make_calibration, make_latency, make_sweep   synthetic files in the formats the app reads
    freeze_when                      stop a running process right after it reaches a point (fault injection)
    TESTED_TRANSFORMERS              the transformers versions the whole suite has passed with
"""
from __future__ import annotations

import json
import math
import os
import random
import signal
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from transformers import LlamaModel

from workbench.calibrate.finish import holdout_split
from workbench.calibrate.ranks import head_accuracies, ranks_frame
from workbench.decode.divergence import rounding_bound
from workbench.measure.sweep_file import SWEEP_COLUMNS, SWEEP_VERSION
from workbench.trees.accuracies import write_accuracies
from support.tiny import tiny_model

# The transformers minor versions the suite passed with: the oldest and newest pyproject.toml allows
# (">=OLDEST,<NEWEST+1"). README names the same list; test_models.py warns when the installed one is not here.
TESTED_TRANSFORMERS = ("5.23", "5.24")


# ----------------------------------------------------------------------------------------------- decoding

def checked_steps(prompt_len):
    """on_step callback asserting the cache holds exactly prompt + emitted tokens after every step."""
    seen = []

    def on_step(step):
        seen.append(step)
        assert step.cache_len == prompt_len + sum(len(s.tokens) for s in seen)
    return on_step, seen


class Oracle:
    """A proposer that knows the true greedy continuation: head k puts the right token at a rank the tree has
    below the path offered so far (sometimes at another random rank) or, with probability `miss`, nowhere.
    Records the rank path it offered at each position."""

    def __init__(self, truth: list[int], tree, vocab: int = 128, miss: float = 0.2, seed: int = 0):
        self.truth, self.tree, self.vocab, self.miss, self.seed = truth, tree, vocab, miss, seed
        self.depth, self.topk = tree.depth, tree.max_rank + 1
        self.offered = {}  # sequence length -> [rank or None per head]

    def __call__(self, hidden, tokens):
        n = len(tokens)
        rows, ranks = [], []
        for k in range(self.depth):
            want = self.truth[n + k] if n + k < len(self.truth) else 0
            g = random.Random(f"{self.seed}-{n}-{k}")
            row = [t for t in g.sample(range(self.vocab), self.topk + 1) if t != want][: self.topk]
            kids = sorted({p[k] for p in self.tree.paths if len(p) > k and list(p[:k]) == ranks})
            rank = None if g.random() < self.miss else g.choice(kids) if kids and g.random() < 0.9 \
                else g.randrange(self.topk)
            if rank is not None:
                row[rank] = want
            rows.append(row)
            ranks.append(rank)
        self.offered[n] = ranks
        return torch.tensor(rows)

    def best_length(self, n: int, tree) -> int:
        """1 + the deepest node of the tree on the offered path of right tokens (what greedy must accept)."""
        ranks, paths, d = self.offered[n], set(tree.paths), 0
        while d < len(ranks) and ranks[d] is not None and tuple(ranks[: d + 1]) in paths:
            d += 1
        return 1 + d


# ----------------------------------------------------------------------------------------------- a constructed near-tie

TIE = (40, 41)      # the constructed pair: 41 leads 40 by LEAD x logit 40 at every position
LEAD = 2 ** -6      # 1/4 of bf16's rounding bound (1/16 of max|logit|), 512x fp32's
_LEAD_DIM, _SCALE_DIM = 63, 62  # residual dimensions no layer writes: constant, so their normed value is too


def tie_model(dtype=torch.bfloat16):
    """A tiny Llama whose top two tokens are 41 then 40 at every position, 41 ahead by LEAD x logit 40.

    Both logits read only two residual dimensions that the embedding sets to the same constant and no layer
    writes: logit 40 = B h_s, logit 41 = B h_s + LEAD B h_l, with h_s = h_l > 0 the final norm's value of that
    constant. Whatever rounding does to the rest of the model moves both by the same factor, so no kernel on any
    CPU can swap them: only `rounding_in_tree` does. The other tokens stay ~5x below (logit 41 is max|logit|).
    The context still matters (other tokens, the heads' inputs), so Medusa accepts several tokens per step."""
    model = tiny_model("llama", seed=0)
    dims, (b40, b41) = [_LEAD_DIM, _SCALE_DIM], TIE
    with torch.no_grad():
        model.get_input_embeddings().weight[:, dims] = 4.0
        for layer in model.get_decoder().layers:
            layer.self_attn.o_proj.weight[dims] = 0
            layer.mlp.down_proj.weight[dims] = 0
        model.get_decoder().norm.weight[dims] = 1.0
        w = model.get_output_embeddings().weight  # [V, H]
        w[:, dims] = 0
        w[b40] = w[b41] = 0
        w[b40, _SCALE_DIM] = w[b41, _SCALE_DIM] = 32.0     # powers of 2: exact in bf16
        w[b41, _LEAD_DIM] = 32.0 * LEAD
    return model.to(dtype)


def lead_after(move: float) -> float:
    """The factor on 41's lead once the tree forward moved the pair by `move` x max|logit| toward 40."""
    return 1 - move / LEAD


@contextmanager
def rounding_in_tree(leads: dict[int, float], skip: int = 2):
    """Stand-in for how a tree forward rounds differently from a 1-token step. While active, every decoder forward
    of N tokens per sequence with N in `leads` (a tree of N nodes with its root; vanilla's steps have 1 token, a
    prefill the prompt's length), except the first `skip` after each prefill, multiplies 41's lead over 40 by
    leads[N]: `lead_after(move)` moves the pair by `move` x max|logit|. A global module hook on the decoder, so it
    reaches a model the CLI loads from a folder too; it changes the final hidden state only, never the KV cache."""
    seen = [0]

    def hook(module, args, out):
        if not isinstance(module, LlamaModel):
            return
        n = out.last_hidden_state.shape[-2]  # [B, N, H]
        if n not in leads:
            seen[0] = 0 if n > 1 else seen[0]  # a prefill starts a new generation
            return
        seen[0] += 1
        if seen[0] > skip:
            out.last_hidden_state[..., _LEAD_DIM] *= leads[n]
    handle = torch.nn.modules.module.register_module_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def within_rounding(dtype) -> float:
    """A move of half the dtype's rounding bound, as `lead_after` takes it: flips the pair in bf16, not in fp32."""
    return lead_after(0.5 * rounding_bound(dtype, 1.0))


# ----------------------------------------------------------------------------------------------- synthetic app data

def make_calibration(folder: Path, num_heads: int = 4, topk: int = 10, prompts: int = 12, positions: int = 40,
                     seed: int = 0) -> Path:
    """A calibration folder in the format `workbench calibrate` writes: head k's rank is geometric, and a miss at
    head k makes head k+1 likelier to miss (so measured paths differ from the independence product)."""
    rng = np.random.default_rng(seed)
    ids, mats = [f"p{i}" for i in range(prompts)], []
    for _ in ids:
        mat = np.zeros((positions, num_heads), dtype=np.int64)
        for t in range(positions):
            missed = False
            for k in range(num_heads):
                p_hit = (0.75 - 0.12 * k) * (0.5 if missed else 1.0)
                r = int(rng.geometric(0.55)) - 1 if rng.random() < p_hit else -1
                mat[t, k] = r if r < topk else -1
                missed = mat[t, k] != 0
            for k in range(num_heads):  # past the end of the answer: null (NULL in memory)
                if t + k + 1 >= positions:
                    mat[t, k] = -2
        mats.append(mat)
    ranks = ranks_frame(ids, mats, num_heads)
    folder.mkdir(parents=True, exist_ok=True)
    ranks.to_parquet(folder / "ranks.parquet", index=False)
    held = holdout_split(ids, 0.25)
    fit = ranks[~ranks["prompt_id"].isin(held)]
    acc, counts = head_accuracies(fit, topk)
    write_accuracies(folder / "accuracies.csv", acc, counts)
    meta = dict(model="synthetic", heads="synthetic", prompts="synthetic", num_prompts=prompts,
                num_positions=len(ranks), num_heads=num_heads, topk=topk, holdout=0.25, holdout_ids=sorted(held))
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


def make_latency(path: Path) -> Path:
    rows = [dict(model="synthetic", device="cpu", dtype="float32", context=c, tokens=n,
                 seconds=0.02 * (1 + 0.004 * n) * (1 + c / 4096)) for c in (128, 1024) for n in (1, 2, 4, 8, 16, 32,
                                                                                                   64, 128, 256)]
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def make_sweep(path: Path) -> Path:
    """Rows shaped like `workbench sweep` output: vanilla, optimal and dense greedy trees, typical epsilons."""
    rows = [dict(config="vanilla", tree="vanilla", kind="vanilla", nodes=0, depth=0, acceptance="greedy",
                 temperature=0.0, tokens_per_step=1.0, speedup=1.0, tokens_per_s=50.0, exact_match=1.0,
                 mean_logprob=-1.0, distinct_2=0.9)]
    for n in (4, 8, 16, 32, 64):
        rate = 1 + 1.2 * math.log2(n) / 3
        rows.append(dict(config=f"opt{n}", tree=f"opt-indep-{n}", kind="optimal", nodes=n, depth=4,
                         acceptance="greedy", temperature=0.0, tokens_per_step=rate, speedup=rate / 1.1,
                         tokens_per_s=50 * rate / 1.1, exact_match=1.0, predicted_independent=rate * 1.05,
                         predicted_joint=rate * 0.98))
        rows.append(dict(config=f"dense{n}", tree=f"dense_{n}", kind="dense", nodes=n, depth=2, acceptance="greedy",
                         temperature=0.0, tokens_per_step=rate * 0.8, speedup=rate * 0.8 / 1.1,
                         tokens_per_s=40 * rate / 1.1, exact_match=1.0))
    for eps in (0.01, 0.05, 0.09, 0.2):
        rows.append(dict(config=f"typ{eps}", tree="opt-indep-32", kind="optimal", nodes=32, depth=4,
                         acceptance="typical", temperature=0.7, epsilon=eps, delta=eps ** 0.5,
                         tokens_per_step=2.5 - eps, speedup=2.0, tokens_per_s=100.0, exact_match=0.2 + eps,
                         mean_logprob=-1.2, distinct_2=0.8))
    pd.DataFrame(rows).reindex(columns=SWEEP_COLUMNS).fillna({"batch_size": 1, "version": SWEEP_VERSION}).to_csv(
        path, index=False)
    return path


def make_short_latency(path: Path) -> Path:
    """A latency CSV as the batched `workbench latency` writes it: batch sizes 1 and 4, spread columns, and only up
    to 16 tokens (so a budget kept from a longer table is out of range)."""
    rows = []
    for b in (1, 4):
        for n in (1, 2, 4, 8, 16):
            s = 0.02 * b ** 0.5 * (1 + 0.02 * n * b)
            rows.append(dict(model="synthetic", device="cpu", dtype="float32", batch=b, context=128, tokens=n,
                             seconds=s, seconds_min=0.9 * s, seconds_q1=0.97 * s, seconds_q3=1.03 * s,
                             seconds_max=1.2 * s))
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def make_walk_files(root: Path, cal_name: str = "cal") -> Path:
    """The app's test folder: a calibration (root/cal_name) with a long latency table, a short batched one with
    spread beside it, and two old sweeps (greedy-only, typical). Returns the calibration folder."""
    from workbench.measure.sweep_file import read_sweep

    cal = make_calibration(root / cal_name)
    make_latency(cal / "latency-cpu.csv")
    make_short_latency(root / "latency-batched.csv")
    full = read_sweep(make_sweep(root / "all.csv"))
    full[full["acceptance"] == "greedy"].to_csv(root / "a-greedy.csv", index=False)
    full[full["acceptance"] != "greedy"].to_csv(root / "b-typical.csv", index=False)
    (root / "all.csv").unlink()
    return cal


def fastest_on(source, table: dict, **kw) -> dict:
    """plan.fastest on a plain {tokens: seconds} table (one batch size at one context)."""
    from workbench.plan.fastest import fastest
    from workbench.plan.surface import Surface

    surface = Surface(pd.DataFrame(dict(context=0, tokens=list(table), seconds=list(table.values()))))
    return fastest(source, surface, surface.at(1, 0), **kw)


def make_current_sweep(root: Path, cal: Path) -> Path:
    """A sweep that measured the recommended tree at a third of its predicted speedup: the pages must say so at the
    top."""
    from workbench.calibrate.folder import Calibration
    from workbench.measure.latency_file import read_latency
    from workbench.plan.recommend import recommend
    from workbench.trees.tree import tree_key

    pick = recommend(Calibration(cal), read_latency(cal / "latency-cpu.csv"), target=128)["pick"]
    rows = [dict(run="r", config="vanilla", tree="vanilla", kind="vanilla", nodes=0, acceptance="greedy",
                 tokens_per_step=1.0, speedup=1.0, vanilla_tokens_per_s=50.0, num_prompts=20),
            dict(run="r", config=f"{tree_key(pick['tree'])}|greedy|T=0", tree=pick["tree"].name, kind="given",
                 nodes=pick["nodes"], acceptance="greedy", tokens_per_step=1.2, speedup=pick["speedup"] / 3,
                 vanilla_tokens_per_s=51.0, num_prompts=20)]
    df = pd.DataFrame(rows).reindex(columns=SWEEP_COLUMNS)
    df["version"], df["batch_size"] = SWEEP_VERSION, 1
    df.to_csv(root / "c-current.csv", index=False)
    return root / "c-current.csv"


# ----------------------------------------------------------------------------------------------- fault injection

def freeze_when(pid: int, ready, alive, rng: random.Random, what: str, timeout: float = 300) -> None:
    """SIGSTOP process `pid` right after ready() first holds (its N-th part is on disk). The process runs in slices
    of a millisecond or two, stopped between them while ready() is checked, so it is frozen within a slice of the
    point however fast the machine is (free running, a fast machine finished the whole run before a signal landed);
    where in its work the last slice ends is random. `alive()` False (the run ended) fails the test; it may
    fail it itself, with the run's output."""
    t0 = time.time()
    os.kill(pid, signal.SIGSTOP)
    while not ready():
        assert alive(), f"{what}: the run ended before the kill point"
        assert time.time() - t0 < timeout, f"{what}: no progress in {timeout} s"
        try:
            os.kill(pid, signal.SIGCONT)
            time.sleep(rng.uniform(0.0005, 0.002))
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            raise AssertionError(f"{what}: process {pid} ended before the kill point") from None


def plotly_values(v) -> np.ndarray:
    """An array of a figure spec as sent to the browser: plotly encodes numpy arrays as typed arrays
    ({"dtype", "bdata" (base64), "shape"}), which plotly.io.from_json leaves encoded."""
    import base64

    if isinstance(v, dict) and "bdata" in v:
        shape = [int(n) for n in str(v.get("shape", "-1")).split(",")]
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"])).reshape(shape)
    return np.asarray(v)
