"""Bad input never reaches the user as a traceback.

Every command that reads a file is fed damaged versions of a real one (truncated, random bytes, binary given as
text, unicode, empty, NaN/inf, huge numbers, wrong types, wrong shapes) and unwritable output locations. Each
must end with exit status 2 and exactly one `error: ...` line on stderr (the last line), raise nothing, leave
no output file behind and leave its input untouched. A fixed corpus (CORPUS, >= 100 cases, every one a real
error) runs on every test run; Hypothesis then generates more garbage per input slot. Tiny random models only:
the CLI runs in-process (workbench.cli.main), and most cases are refused before a model loads. For a deeper
search: WORKBENCH_FUZZ_EXAMPLES=2000 python -m pytest tests/test_fuzz.py -k generated.
"""
from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from hostile_cases import verdict, with_flag
from workbench.calibrate.run import CalibrateConfig, calibrate
from workbench.cli import main
from workbench.measure.sweep_file import SWEEP_COLUMNS, SWEEP_VERSION
from workbench.trees.accuracies import write_accuracies

PROMPTS = ["Tell me a story.", "What is 2+2?", "Name three colours.", "hi", "Why is the sky blue?", "List fruits."]
CAL_ARGS = ["--max-new-tokens", "6", "--topk", "40", "--budgets", "2", "--gen-batch", "6", "--device", "cpu"]


@pytest.fixture(scope="module")
def env(tiny_llama, tmp_path_factory) -> dict:
    """Real, valid inputs for every slot (damaged copies of these are the garbage) and the tiny model."""
    root = tmp_path_factory.mktemp("fuzz")
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"q{i}", "instruction": p}) + "\n" for i, p in enumerate(PROMPTS)))
    (root / "prompts.json").write_text(json.dumps([{"instruction": p, "input": ""} for p in PROMPTS]))
    pd.DataFrame({"instruction": PROMPTS}).to_csv(root / "prompts.csv", index=False)
    pd.DataFrame({"instruction": PROMPTS}).to_parquet(root / "prompts.parquet")
    model, heads = str(tiny_llama.model_dir), str(tiny_llama.heads_dirs["2"])
    cal = root / "cal"
    calibrate(CalibrateConfig(model=model, heads=heads, prompts=str(prompts), name="fz", out=cal, holdout=0.34,
                              max_new_tokens=6, topk=40, budgets=(2,), batch_size=6, device="cpu"), progress=False)  # top-40 of 128: random heads hit now and then
    write_accuracies(root / "acc.csv", np.random.default_rng(0).dirichlet(np.ones(5), size=3)[:, :4])
    (root / "tree.json").write_text(json.dumps({"name": "t", "medusa_choices": [[0], [0, 0], [1]]}))
    g = torch.Generator().manual_seed(0)  # Medusa's layout: per head [positions, topk], one hit per row at most
    torch.save([torch.eye(4, dtype=torch.bool)[torch.randint(0, 4, (30,), generator=g), :3] for _ in range(3)],
               root / "acc.pt")
    pd.DataFrame(dict(model="m", device="cpu", dtype="float32", context=16, tokens=range(1, 9),
                      seconds=[0.01 * (1 + n / 4) for n in range(1, 9)])).to_csv(root / "lat.csv", index=False)
    pd.DataFrame([dict(model="m", device="cpu", dtype="float32", batch=b, context=16, tokens=n, seconds=t,
                       seconds_min=t * 0.98, seconds_q1=t * 0.99, seconds_q3=t * 1.01, seconds_max=t * 1.02, repeats=5)
                  for b in (1, 2) for n in range(1, 9) for t in [0.01 * (1 + 0.001 * b * (n - 1))]]
                 ).to_csv(root / "lat_b.csv", index=False)  # batched, with its spread, cheap enough to speculate
    (root / "acc_vec.csv").write_text("position,acceptance\n1,0.6\n2,0.35\n3,0.2\n")
    (root / "acc_vec.json").write_text("[0.6, 0.35, 0.2]")
    assert main(["plan", "--accuracies", str(root / "acc.csv"), "--latency", str(root / "lat_b.csv"),
                 "--batch-sizes", "1,2", "--out", str(root / "plan.json")]) == 0
    row = {c: "" for c in SWEEP_COLUMNS}
    row.update(run="r1", config="vanilla", tree="vanilla", kind="vanilla", nodes=0, depth=0, acceptance="greedy",
               temperature=0.0, tokens_per_step=1.0, speedup=1.0, exact_match=1.0, num_prompts=2,
               mean_prompt_tokens=9.0, new_tokens=8, model="m", prompts="p", max_new_tokens=4, batch_size=1,
               version=SWEEP_VERSION)
    tree_row = dict(row, config="t:abc|greedy|T=0", tree="t", kind="given", nodes=3, depth=2,
                    tokens_per_step=1.5, speedup=1.2, predicted_independent=1.6)
    pd.DataFrame([row, tree_row], columns=SWEEP_COLUMNS).to_csv(root / "sweep.csv", index=False)
    return dict(root=root, model=model, heads=heads,
                heads_file=str(tiny_llama.heads_dirs["1"] / "medusa_lm_head.safetensors"),
                heads_pt=str(tiny_llama.heads_dirs["1pt"] / "medusa_lm_head.pt"), prompts=str(prompts),
                cal=str(cal), tree=str(root / "tree.json"), acc_csv=str(root / "acc.csv"),
                acc_pt=str(root / "acc.pt"), lat=str(root / "lat.csv"), sweep=str(root / "sweep.csv"),
                lat_b=str(root / "lat_b.csv"), acc_vec_csv=str(root / "acc_vec.csv"),
                acc_vec_json=str(root / "acc_vec.json"), plan=str(root / "plan.json"))


# ----------------------------------------------------------------------------------------------- input slots

@dataclass(frozen=True)
class Slot:
    """One file a command reads: `real` names the valid file in env (or `inside` a copied folder), `argv` builds
    the command line from env, the damaged file P and a fresh output folder O."""
    name: str
    real: str
    argv: object
    inside: str | None = None


def _decode(e, P, O):
    model = P if Path(P, "config.json").is_file() else e["model"]  # a damaged copy of the model folder
    return ["decode", "--model", model, "--heads", e["heads"], "--tree", "[[0],[0,0],[1]]",
            "--prompt-ids", "5,6,7", "--max-new-tokens", "3", "--device", "cpu"]


def _sweep(e, P, O):
    return ["sweep", "--model", e["model"], "--heads", e["heads"], "--trees", "[[0]]", "--prompts", e["prompts"],
            "--limit", "2", "--max-new-tokens", "3", "--device", "cpu", "--quiet", "--out", f"{O}/s.csv"]


def _calibrate(e, P, O):
    return ["calibrate", "--model", e["model"], "--heads", e["heads"], "--prompts", e["prompts"],
            "--out", f"{O}/cal", *CAL_ARGS]


def _train(e, P, O):
    return ["train-heads", "--model", e["model"], "--prompts", P, "--tokens", "8", "--max-new-tokens", "3",
            "--gen-dtype", "float32", "--steps", "1", "--positions-per-step", "4", "--work", f"{O}/w", "--out", f"{O}/h"]


SLOTS = [
    Slot("tree show", "tree", lambda e, P, O: ["tree", "show", P, "--png", f"{O}/t.png"]),
    Slot("tree buffers", "tree", lambda e, P, O: ["tree", "buffers", P, "--out", f"{O}/b.json"]),
    Slot("export", "tree", lambda e, P, O: ["export", P, "--format", "trtllm", "--out", f"{O}/e.txt"]),
    Slot("tree eval TREE", "tree", lambda e, P, O: ["tree", "eval", P, "--calibration", e["cal"]]),
    Slot("decode --tree", "tree", lambda e, P, O: with_flag(_decode(e, P, O), "--tree", P)),
    Slot("sweep --trees", "tree", lambda e, P, O: with_flag(_sweep(e, P, O), "--trees", P)),
    Slot("tree show --accuracies", "acc_csv", lambda e, P, O: ["tree", "show", "[[0],[0,0],[1]]", "--accuracies", P]),
    Slot("optimize --accuracies csv", "acc_csv",
         lambda e, P, O: ["optimize", "--accuracies", P, "--budget", "3", "--out", f"{O}/t.json"]),
    Slot("export --engine-safe --accuracies", "acc_csv",
         lambda e, P, O: ["export", "[[0],[0,0],[1]]", "--format", "trtllm", "--engine-safe", "--accuracies", P,
                          "--out", f"{O}/e.txt"]),
    Slot("optimize --accuracies pt", "acc_pt",
         lambda e, P, O: ["optimize", "--accuracies", P, "--budget", "3", "--out", f"{O}/t.json"]),
    Slot("optimize --latency", "lat", lambda e, P, O: ["optimize", "--accuracies", e["acc_csv"], "--latency", P,
                                                       "--out", f"{O}/t.json", "--curve-out", f"{O}/c.csv"]),
    Slot("sweep-report --latency", "lat", lambda e, P, O: ["sweep-report", e["sweep"], "--latency", P,
                                                           "--out", f"{O}/r.md", "--figures", f"{O}/figs"]),
    Slot("plan --latency", "lat_b", lambda e, P, O: ["plan", "--accuracies", e["acc_csv"], "--latency", P,
                                                     "--batch-sizes", "1,2", "--out", f"{O}/p.json"]),
    Slot("plan --accuracies", "acc_csv", lambda e, P, O: ["plan", "--accuracies", P, "--latency", e["lat_b"],
                                                          "--batch-sizes", "1,2", "--out", f"{O}/p.json"]),
    Slot("plan --acceptance csv", "acc_vec_csv", lambda e, P, O: ["plan", "--acceptance", P, "--latency", e["lat_b"],
                                                                  "--batch-sizes", "1,2", "--out", f"{O}/p.json"]),
    Slot("plan --acceptance json", "acc_vec_json", lambda e, P, O: ["plan", "--acceptance", P, "--latency",
                                                                    e["lat_b"], "--batch-sizes", "1", "--out",
                                                                    f"{O}/p.json"]),
    Slot("plan --calibration ranks", "cal",
         lambda e, P, O: ["plan", "--calibration", P, "--latency", e["lat_b"], "--batch-sizes", "1,2",
                          "--prediction", "joint", "--out", f"{O}/p.json"], inside="ranks.parquet"),
    Slot("export plan", "plan", lambda e, P, O: ["export", P, "--format", "vllm", "--method", "ngram", "--synthetic",
                                                 "--out", f"{O}/v.json"]),
    Slot("sweep-report", "sweep", lambda e, P, O: ["sweep-report", P, "--out", f"{O}/r.md", "--figures", f"{O}/figs"]),
    Slot("sweep --out (existing)", "sweep", lambda e, P, O: with_flag(_sweep(e, P, O), "--out", P)),
    Slot("tree eval --calibration meta", "cal", lambda e, P, O: ["tree", "eval", "[[0]]", "--calibration", P],
         inside="meta.json"),
    Slot("optimize --calibration ranks", "cal",
         lambda e, P, O: ["optimize", "--calibration", P, "--budget", "2", "--out", f"{O}/t.json"],
         inside="ranks.parquet"),
    Slot("optimize --calibration --latency continuations", "cal",
         lambda e, P, O: ["optimize", "--calibration", P, "--latency", e["lat"], "--out", f"{O}/t.json"],
         inside="continuations.parquet"),
    Slot("calibrate --continuations", "cal", lambda e, P, O: _calibrate(e, P, O) + ["--continuations", P],
         inside="continuations.parquet"),
    Slot("sweep --calibration meta", "cal",
         lambda e, P, O: with_flag(with_flag(_sweep(e, P, O), "--calibration", P), "--prompts", "holdout"), inside="meta.json"),
    Slot("decode --heads safetensors", "heads_file", lambda e, P, O: with_flag(_decode(e, P, O), "--heads", P)),
    Slot("calibrate --heads safetensors", "heads_file", lambda e, P, O: with_flag(_calibrate(e, P, O), "--heads", P)),
    Slot("latency --heads pt", "heads_pt", lambda e, P, O: ["latency", "--model", e["model"], "--heads", P,
                                                            "--sizes", "2", "--context", "8", "--repeats", "1",
                                                            "--warmup", "0", "--out", f"{O}/l.csv"]),
    Slot("train-heads --init pt", "heads_pt",  # the untied 5-head checkpoint
         lambda e, P, O: _train(e, e["prompts"], O) + ["--init", P, "--num-heads", "5", "--untied"]),
    Slot("decode --model config", "model", _decode, inside="config.json"),
    Slot("decode --model weights", "model", _decode, inside="model.safetensors"),
    Slot("sweep --heads config", "heads", lambda e, P, O: with_flag(_sweep(e, P, O), "--heads", P), inside="config.json"),
    Slot("calibrate --prompts json", "root", lambda e, P, O: with_flag(_calibrate(e, P, O), "--prompts", P),
         inside="prompts.json"),
    Slot("sweep --prompts jsonl", "root", lambda e, P, O: with_flag(_sweep(e, P, O), "--prompts", P),
         inside="prompts.jsonl"),
    Slot("train-heads --prompts csv", "root", _train, inside="prompts.csv"),
    Slot("calibrate --prompts parquet", "root", lambda e, P, O: with_flag(_calibrate(e, P, O), "--prompts", P),
         inside="prompts.parquet"),
]
BY_NAME = {s.name: s for s in SLOTS}


def _real_bytes(env, slot: Slot) -> bytes:
    return (Path(env[slot.real]) / slot.inside if slot.inside else Path(env[slot.real])).read_bytes()


def _place(env, slot: Slot, data: bytes, where: Path) -> str:
    """Write the damaged content where the command will read it; returns P (a file, or a copied folder)."""
    where.mkdir(parents=True, exist_ok=True)
    if slot.inside is None:
        f = where / f"input{Path(env[slot.real]).suffix}"
        f.write_bytes(data)
        return str(f)
    folder = where / "input"
    if slot.real == "root":  # a loose prompt file: only that file
        folder.mkdir()
    else:
        shutil.copytree(env[slot.real], folder)
    (folder / slot.inside).write_bytes(data)
    return str(folder / slot.inside) if slot.real == "root" else str(folder)


def _snapshot(path: Path) -> dict:
    return {p: p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()} if path.exists() else {}


def _run(capsys, argv, out: Path, inputs: Path):
    """(exit status, stderr lines) of one in-process run; any exception escaping main is a test failure."""
    before = _snapshot(inputs)
    rc = main([str(a) for a in argv])
    _, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    if rc == 2:
        assert verdict("refuse", rc, err, False, False) == "", (argv, err)  # one `error:` line, the last
        assert _snapshot(out) == {}, f"{argv}: a refused run left {list(_snapshot(out))}"
        assert _snapshot(inputs) == before, f"{argv}: a refused run changed its input"
    return rc, lines


# ----------------------------------------------------------------------------------------------- the fixed corpus

def _csv(header: str, *rows: str) -> bytes:
    return ("\n".join([header, *rows]) + "\n").encode()


GENERIC = {  # damage that breaks any of the files above
    "empty": lambda real: b"",
    "truncated": lambda real: real[: len(real) // 2],
    "one-byte": lambda real: real[:1],
    "random-bytes": lambda real: random.Random(len(real)).randbytes(300),
    "binary-png": lambda real: b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 2,
    "unicode": lambda real: "\u2603 \u202e\U0001d518\U0001d52b \u00e9\u0301 \ufeff\u0000 caf\u00e9".encode(),
}
SPECIFIC = {  # per kind of file: NaN/inf, huge numbers, wrong types and shapes, unterminated quotes
    "tree": {
        "nan-inf": b"[[NaN], [Infinity]]",
        "huge-rank": b"[[0], [1e400]]",
        "huge-int-rank": b'{"medusa_choices": [[123456789012345678901234567890123]]}',
        "wrong-type": b'{"medusa_choices": "[[0]]"}',
        "bool-ranks": b"[[true], [false]]",
        "wrong-shape": b"[0, 1, 2]",
        "deep": b"[" * 5000 + b"]" * 5000,
        "unterminated": b'["abc',
        "no-choices-key": b'{"choices": [[0]]}',
        "missing-parent": b"[[0], [1, 0]]",
        "negative": b"[[-1]]",
    },
    "acc_csv": {
        "unterminated-quote": _csv("head,rank,accuracy", '1,1,"0.5', "1,2,0.1"),
        "nan": _csv("head,rank,accuracy", "1,1,nan", "1,2,0.1"),
        "inf": _csv("head,rank,accuracy", "1,1,inf", "1,2,0.1"),
        "huge-head": _csv("head,rank,accuracy", "1e300,1,0.5"),
        "huge-rank": _csv("head,rank,accuracy", "1,99999999999,0.5"),
        "huge-count": _csv("head,rank,accuracy,count", "1,1,0.5,1e300"),
        "text-values": _csv("head,rank,accuracy", "one,first,half"),
        "wrong-columns": _csv("a,b,c", "1,2,3"),
        "cumulative": _csv("head,rank,accuracy", "1,1,0.6", "1,2,0.9"),
        "header-only": _csv("head,rank,accuracy"),
        "duplicate": _csv("head,rank,accuracy", "1,1,0.5", "1,1,0.4"),
        "rank-past-limit": _csv("head,rank,accuracy", "1,1,0.5", "1,2097153,0.1"),  # sizes (issue 52)
        "heads-past-limit": _csv("head,rank,accuracy", "1,1,0.5", "1025,1,0.1"),
        "topk-column-past-limit": _csv("head,top1,top123456789", "0,0.3,0.6"),
        "topk-cells-past-limit": _csv("head,top1,top-400000", *[f"{h},0.3,0.6" for h in range(50)]),
    },
    "acc_pt": {
        "pickled-dict": None,  # built below: a dict where a list of tensors belongs
        "wrong-shape": None,
        "nan": None,
        "not-weights-only": None,
        "topk-past-limit": None,
    },
    "lat": {
        "unterminated-quote": _csv("context,tokens,seconds", '16,1,"0.01', "16,2,0.02"),
        "nan": _csv("context,tokens,seconds", "16,1,nan", "16,2,0.02"),
        "inf": _csv("context,tokens,seconds", "16,1,0.01", "16,2,inf"),
        "huge": _csv("context,tokens,seconds", "16,1,0.01", "16,1e300,0.02"),
        "fractional": _csv("context,tokens,seconds", "16,1,0.01", "16,2.5,0.02"),
        "negative": _csv("context,tokens,seconds", "16,1,-0.01", "16,2,0.02"),
        "text": _csv("context,tokens,seconds", "a,b,c"),
        "no-one-token-row": _csv("context,tokens,seconds", "16,2,0.02", "16,3,0.03"),
    },
    "lat_b": {
        "batch-zero": _csv("batch,context,tokens,seconds", "0,16,1,0.01", "0,16,2,0.02"),
        "batch-text": _csv("batch,context,tokens,seconds", "one,16,1,0.01", "one,16,2,0.02"),
        "batch-fraction": _csv("batch,context,tokens,seconds", "1.5,16,1,0.01", "1.5,16,2,0.02"),
        "missing-batch-2": _csv("batch,context,tokens,seconds", "1,16,1,0.01", "1,16,2,0.02"),
        "missing-one-token-row": _csv("batch,context,tokens,seconds", "1,16,2,0.02", "2,16,1,0.01", "2,16,2,0.02"),
        "spread-unordered": _csv("batch,context,tokens,seconds,seconds_min,seconds_q1,seconds_q3,seconds_max",
                                 "1,16,1,0.01,0.02,0.01,0.01,0.01", "2,16,1,0.01,0.01,0.01,0.01,0.01"),
        "spread-partial": _csv("batch,context,tokens,seconds,seconds_q1", "1,16,1,0.01,0.009", "2,16,1,0.01,0.009"),
        "spread-nan": _csv("batch,context,tokens,seconds,seconds_min,seconds_q1,seconds_q3,seconds_max",
                           "1,16,1,0.01,nan,0.01,0.01,0.01", "2,16,1,0.01,0.01,0.01,0.01,0.01"),
        "two-setups": _csv("device,batch,context,tokens,seconds", "cpu,1,16,1,0.01", "gpu,2,16,1,0.01"),
        "two-contexts": _csv("batch,context,tokens,seconds", "1,16,1,0.01", "2,32,1,0.01"),
    },
    "acc_vec_csv": {
        "increasing": _csv("position,acceptance", "1,0.3", "2,0.5"),
        "zero": _csv("position,acceptance", "1,0.3", "2,0"),
        "above-one": _csv("position,acceptance", "1,1.5"),
        "negative": _csv("position,acceptance", "1,-0.2"),
        "gap": _csv("position,acceptance", "1,0.5", "3,0.2"),
        "duplicate": _csv("position,acceptance", "1,0.5", "1,0.4"),
        "nan": _csv("position,acceptance", "1,nan"),
        "text": _csv("position,acceptance", "first,high"),
        "header-only": _csv("position,acceptance"),
        "wrong-columns": _csv("k,rate", "1,0.5"),
        "unterminated-quote": _csv("position,acceptance", '1,"0.5'),
        "huge-position": _csv("position,acceptance", "1e300,0.5"),
        "too-many": _csv("position,acceptance", *[f"{i},0.5" for i in range(1, 100)]),
    },
    "acc_vec_json": {
        "increasing": b"[0.3, 0.5]",
        "zero": b"[0.5, 0.0]",
        "above-one": b"[1.5]",
        "nan": b"[NaN]",
        "bool": b"[true, false]",
        "strings": b'["0.5", "0.3"]',
        "nested": b"[[0.5], [0.3]]",
        "empty-list": b"[]",
        "object-without-rates": b'{"method": "eagle3", "num_speculative_tokens": 3}',
        "rates-not-a-list": b'{"synthetic_acceptance_rates": 0.5}',
        "number": b"0.5",
        "huge": b"[1e400]",
    },
    "plan": {
        "kind-mismatch": b'{"plans": [{"batch_size": 1, "kind": "none", "medusa_choices": [[0]], "nodes": 1, '
                         b'"predicted_tokens_per_step": 1.5, "predicted_speedup": 1.2}]}',
        "chain-not-a-chain": b'{"plans": [{"batch_size": 1, "kind": "chain", "medusa_choices": [[0], [1]], '
                             b'"nodes": 2, "predicted_tokens_per_step": 1.5, "predicted_speedup": 1.2}]}',
        "unsorted": b'{"plans": [{"batch_size": 2, "kind": "none", "medusa_choices": [], "nodes": 0, '
                    b'"predicted_tokens_per_step": 1, "predicted_speedup": 1}, {"batch_size": 1, "kind": "none", '
                    b'"medusa_choices": [], "nodes": 0, "predicted_tokens_per_step": 1, "predicted_speedup": 1}]}',
        "batch-zero": b'{"plans": [{"batch_size": 0, "kind": "none", "medusa_choices": [], "nodes": 0, '
                      b'"predicted_tokens_per_step": 1, "predicted_speedup": 1}]}',
        "nan-speedup": b'{"plans": [{"batch_size": 1, "kind": "chain", "medusa_choices": [[0]], "nodes": 1, '
                       b'"predicted_tokens_per_step": 1.5, "predicted_speedup": NaN}]}',
        "missing-key": b'{"plans": [{"batch_size": 1, "kind": "chain", "medusa_choices": [[0]]}]}',
        "empty-plans": b'{"plans": []}',
        "plans-not-list": b'{"plans": {"1": "none"}}',
        "all-none": b'{"plans": [{"batch_size": 1, "kind": "none", "medusa_choices": [], "nodes": 0, '
                    b'"predicted_tokens_per_step": 1, "predicted_speedup": 1}]}',
        "rising-acceptance": b'{"plans": [{"batch_size": 1, "kind": "chain", "medusa_choices": [[0]], "nodes": 1, '
                             b'"predicted_tokens_per_step": 1.5, "predicted_speedup": 1.2}], '
                             b'"chain_acceptance": [0.2, 0.5]}',
        "tree-without-alternatives": b'{"plans": [{"batch_size": 1, "kind": "tree", "medusa_choices": [[0], [1]], '
                                     b'"nodes": 2, "predicted_tokens_per_step": 1.5, "predicted_speedup": 1.2}]}',
        "bad-choices": b'{"plans": [{"batch_size": 1, "kind": "tree", "medusa_choices": [[0], [2, 0]], "nodes": 2, '
                       b'"predicted_tokens_per_step": 1.5, "predicted_speedup": 1.2}]}',
    },
    "sweep": {
        "unterminated-quote": None,  # built below from the real header
        "text-in-numbers": None,
        "inf": None,
        "nul-bytes": None,
        "other-header": _csv("tree,nodes,tokens_per_step,x", "t,1,1.5,2"),
    },
    "meta.json": {
        "list": b"[1, 2, 3]",
        "topk-text": b'{"topk": "ten", "holdout_ids": []}',
        "topk-huge": b'{"topk": 1e400, "holdout_ids": []}',
        "holdout-not-list": b'{"topk": 3, "holdout_ids": 5}',
        "unterminated": b'{"topk": 3, "holdout_ids": ["q1',
        "topk-past-16-bit": b'{"topk": 65537, "holdout_ids": []}',  # sizes (issue 52)
        "topk-2^20": b'{"topk": 1048576, "holdout_ids": []}',
    },
    "parquet": {
        "wrong-columns": None,  # built below
        "text-ranks": None,
        "negative-ranks": None,
    },
    "heads": {
        "wrong-shape": None,  # built below: valid containers with wrong content
        "nan": None,
        "int-dtype": None,
        "extra-tensor": None,
        "no-tensors": None,
        "far-head-index": None,  # sizes (issue 52): what the names and shapes imply, never allocated
        "vast-hidden": None,
        "many-layers": None,
        "vast-vocab": None,
        "lying-header": None,
    },
    "model": {
        "list": b"[]",
        "unknown-architecture": b'{"model_type": "no-such-model", "hidden_size": 64}',
        "wrong-type": b'{"model_type": 5}',
    },
    "config.json": {
        "list": b"[]",
        "text-vocab": b'{"vocab_size": "many"}',
        "huge-heads": b'{"medusa_num_heads": 1e400}',
        "negative-layers": b'{"medusa_num_layers": -1}',
        "heads-past-limit": b'{"medusa_num_heads": 65}',
        "vocab-past-limit": b'{"vocab_size": 1048577}',
    },
    "prompts": {
        "no-prompt-column": None,  # built below per format
        "only-blank": None,
        "wrong-top-level": None,
        "lone-surrogate": None,
    },
}


def _to_bytes(write) -> bytes:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "x"
        write(f)
        return f.read_bytes()


def _specific(env, slot: Slot) -> dict[str, bytes]:
    """The damage that fits this slot's kind of file."""
    kind = _kind(slot)
    out = {k: v for k, v in SPECIFIC[kind].items() if v is not None}
    real = _real_bytes(env, slot)
    if kind == "acc_pt":
        out["pickled-dict"] = _to_bytes(lambda f: torch.save({"a": torch.zeros(2, 2)}, f))
        out["wrong-shape"] = _to_bytes(lambda f: torch.save([torch.zeros(3), torch.zeros(2, 2)], f))
        out["nan"] = _to_bytes(lambda f: torch.save([torch.full((4, 3), float("nan"))], f))
        out["not-weights-only"] = _to_bytes(lambda f: torch.save([Slot("x", "y", None)], f))
        out["topk-past-limit"] = _to_bytes(lambda f: torch.save([torch.zeros(2, 1_100_000, dtype=torch.bool)], f))
    elif kind == "sweep":
        header, first = real.decode().splitlines()[:2]
        out["unterminated-quote"] = _csv(header, first.replace("vanilla", '"vanilla', 1))
        cells = first.split(",")
        cells[SWEEP_COLUMNS.index("tokens_per_step")] = "fast"
        out["text-in-numbers"] = _csv(header, ",".join(cells))
        cells[SWEEP_COLUMNS.index("tokens_per_step")] = "inf"
        out["inf"] = _csv(header, ",".join(cells))
        out["nul-bytes"] = _csv(header, first) + b"\x00\x00\x00,\x00\n"
        # issue 52: a file a reader could take but not draw every output from
        names, values = header.split(","), first.split(",")
        keep = [i for i, c in enumerate(names) if c in ("tree", "nodes", "tokens_per_step")]
        out["required-columns-only"] = _csv(",".join(names[i] for i in keep), ",".join(values[i] for i in keep))
        drop = names.index("speedup")
        out["no-speedup-column"] = _csv(",".join(names[:drop] + names[drop + 1:]),
                                        ",".join(values[:drop] + values[drop + 1:]))
        out["blank-speedup"] = _csv(header, ",".join(values[:drop] + [""] + values[drop + 1:]))
    elif kind == "parquet":
        frame = pd.read_parquet(Path(env[slot.real]) / slot.inside)
        out["wrong-columns"] = _to_bytes(lambda f: frame.rename(columns=lambda c: c.upper()).to_parquet(f))
        text = frame.copy()
        for c in text.columns[1:]:
            text[c] = "x"
        out["text-ranks"] = _to_bytes(lambda f: text.to_parquet(f))
        neg = frame.copy()
        if "head_1" in neg:
            neg["head_1"] = -7
        else:  # continuations: answers that are not token lists
            neg["continuation"] = "abc"
            neg["prompt_id"] = None
        out["negative-ranks"] = _to_bytes(lambda f: neg.to_parquet(f))
    elif kind == "heads":
        sd = {"0.0.linear.weight": torch.zeros(64, 64), "0.0.linear.bias": torch.zeros(64)}
        save = (lambda d: (lambda f: save_file(d, str(f)))) if (slot.inside or env[slot.real]).endswith(".safetensors") \
            else (lambda d: (lambda f: torch.save(d, f)))
        out["wrong-shape"] = _to_bytes(save({**sd, "0.0.linear.weight": torch.zeros(64, 3)}))
        out["nan"] = _to_bytes(save({**sd, "0.0.linear.bias": torch.full((64,), float("nan"))}))
        out["int-dtype"] = _to_bytes(save({k: v.long() for k, v in sd.items()}))
        out["extra-tensor"] = _to_bytes(save({**sd, "lm_head.weight": torch.zeros(2, 2)}))
        out["no-tensors"] = _to_bytes(save({}))
        z = torch.zeros
        out["far-head-index"] = _to_bytes(save({**sd, "777.0.linear.weight": z(64, 64), "777.0.linear.bias": z(64)}))
        out["vast-hidden"] = _to_bytes(save({"0.0.linear.weight": z(2, 70000, dtype=torch.float16),
                                             "0.0.linear.bias": z(70000, dtype=torch.float16)}))
        out["many-layers"] = _to_bytes(save({**sd, "0.99.linear.weight": z(64, 64), "0.99.linear.bias": z(64)}))
        out["vast-vocab"] = _to_bytes(save({"0.0.linear.weight": z(1, 1), "0.0.linear.bias": z(1),
                                            "0.1.weight": z(1_500_000, 1, dtype=torch.float8_e4m3fn)}))
        if (slot.inside or env[slot.real]).endswith(".safetensors"):  # a header claiming [4096, 4096], no data
            header = json.dumps({"0.0.linear.weight": {"dtype": "F32", "shape": [4096, 4096],
                                                       "data_offsets": [0, 4096 * 4096 * 4]}}).encode()
            out["lying-header"] = len(header).to_bytes(8, "little") + header
        else:
            out["lying-header"] = _to_bytes(save({"0.0.linear.weight": z(64, 64)}))[:-200]
    elif kind == "prompts":
        suffix = Path(slot.inside).suffix
        rows_bad, rows_blank = [{"text": p} for p in PROMPTS], [{"instruction": "   "}] * 3
        writers = {".json": lambda rows: json.dumps(rows).encode(),
                   ".jsonl": lambda rows: "".join(json.dumps(r) + "\n" for r in rows).encode(),
                   ".csv": lambda rows: pd.DataFrame(rows).to_csv(index=False).encode(),
                   ".parquet": lambda rows: _to_bytes(lambda f: pd.DataFrame(rows).to_parquet(f))}
        out["no-prompt-column"] = writers[suffix](rows_bad)
        out["only-blank"] = writers[suffix](rows_blank)
        out["wrong-top-level"] = b'"just a string"' if suffix != ".parquet" else b"PAR1" + b"\x00" * 20 + b"PAR1"
        # "\ud800" escaped in JSON (a string no tokenizer takes); elsewhere its bytes, which are not UTF-8
        surrogate = "hi \ud800 there"
        out["lone-surrogate"] = writers[suffix]([{"instruction": surrogate}]) if suffix in (".json", ".jsonl") else \
            f"instruction\n{surrogate}\n".encode("utf-8", "surrogatepass") if suffix == ".csv" else \
            _to_bytes(lambda f: pq.write_table(pa.table({"instruction": pa.array(
                [surrogate.encode("utf-8", "surrogatepass")], pa.binary()).view(pa.string())}), f))
    return out


# a few generic kinds are valid for some files: half a CSV of complete rows, or a prompt file cut at a line end
VALID_BY_ACCIDENT = {("sweep-report --latency", "truncated"), ("optimize --latency", "truncated"),
                     ("sweep --prompts jsonl", "truncated"), ("train-heads --prompts csv", "truncated"),
                     ("sweep --out (existing)", "empty")}  # an empty --out: a sweep not started yet
# unwritable output locations, per command and flag (a folder where a file goes, a file where a folder goes...)
OUTPUTS = [
    ("tree buffers", "--out", "file"), ("optimize --accuracies csv", "--out", "file"),
    ("optimize --latency", "--curve-out", "file"), ("export", "--out", "file"), ("tree show", "--png", "file"),
    ("sweep-report", "--out", "file"), ("sweep-report", "--figures", "folder"), ("calibrate --heads safetensors",
                                                                                  "--out", "folder"),
    ("calibrate --heads safetensors", "--trees-dir", "folder"), ("train-heads --prompts csv", "--out", "folder"),
    ("train-heads --prompts csv", "--work", "folder"), ("sweep --trees", "--out", "file"),
    ("latency --heads pt", "--out", "file"), ("plan --latency", "--out", "file"), ("export plan", "--out", "file"),
]


def _corpus() -> list:
    cases = [pytest.param(s.name, kind, id=f"{s.name}|{kind}") for s in SLOTS for kind in GENERIC
             if (s.name, kind) not in VALID_BY_ACCIDENT]
    cases += [pytest.param(s.name, f"specific:{k}", id=f"{s.name}|{k}") for s in SLOTS for k in SPECIFIC[_kind(s)]]
    cases += [pytest.param(name, f"output:{flag}:{kind}:{how}", id=f"{name}|{flag} {how}")
              for name, flag, kind in OUTPUTS for how in ("collides", "under-a-file", "unwritable")]
    return cases


def _kind(slot: Slot) -> str:
    if slot.real == "model":
        return "model" if slot.inside == "config.json" else "heads"
    if slot.inside in ("meta.json", "config.json"):
        return slot.inside
    if slot.inside in ("ranks.parquet", "continuations.parquet"):
        return "parquet"
    return {"heads_file": "heads", "heads_pt": "heads", "root": "prompts"}.get(slot.real, slot.real)


CORPUS = _corpus()


@pytest.mark.unit
def test_the_corpus_is_large_and_distinct():
    assert len(CORPUS) >= 100 and len({c.id for c in CORPUS}) == len(CORPUS)


@pytest.mark.parametrize("slot", [s.name for s in SLOTS])
def test_every_slot_accepts_its_real_input(slot, env, tmp_path, capsys):
    """The undamaged file passes, so every refusal in the corpus is the damage's doing."""
    s = BY_NAME[slot]
    P = _place(env, s, _real_bytes(env, s), tmp_path / "in")
    rc, lines = _run(capsys, s.argv(env, P, tmp_path / "out"), tmp_path / "out", tmp_path / "in")
    assert rc == 0, lines


@pytest.mark.parametrize("slot,damage", CORPUS)
def test_malformed_input_is_one_error_line(slot, damage, env, tmp_path, capsys):
    s = BY_NAME[slot]
    out = tmp_path / "out"
    if damage.startswith("output:"):  # the slot's real input, an impossible output location
        _, flag, kind, how = damage.split(":")
        blocker = tmp_path / "blocker"
        blocker.write_text("a file")
        P = _place(env, s, _real_bytes(env, s), tmp_path / "in")
        target = {"collides": (tmp_path / "in") if kind == "file" else blocker,
                  "under-a-file": blocker / "sub" / "x.out",
                  "unwritable": Path("/proc/workbench-test/x.out")}[how]
        argv = with_flag(s.argv(env, P, out), flag, str(target))
    else:
        data = GENERIC[damage](_real_bytes(env, s)) if not damage.startswith("specific:") else \
            _specific(env, s)[damage.split(":", 1)[1]]
        P = _place(env, s, data, tmp_path / "in")
        argv = s.argv(env, P, out)
    rc, lines = _run(capsys, argv, out, tmp_path / "in")
    assert rc == 2, (argv, lines)
    if damage.startswith("output:"):
        assert flag in lines[-1], lines[-1]


# ----------------------------------------------------------------------------------------------- Hypothesis

JSON = st.recursive(st.none() | st.booleans() | st.integers(-(2 ** 70), 2 ** 70) |
                    st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c, max_size=3),
                    max_leaves=10)
CELL = st.sampled_from(["", "nan", "inf", "-inf", "1e400", "-1", "0", "1", "2", "0.5", "1e-300", '"', "x", "\u2603",
                        "99999999999999999999"]) | st.text(max_size=4)


@st.composite
def damaged(draw, real: bytes) -> bytes:
    """Garbage derived from a real file: truncated, a byte changed, random bytes, random text, random JSON (with
    NaN/inf and huge numbers), or a CSV with the real header and random cells."""
    kind = draw(st.sampled_from(["truncate", "flip", "bytes", "text", "json", "csv"]))
    if kind == "truncate":
        return real[:draw(st.integers(0, len(real) - 1))]
    if kind == "flip":
        i = draw(st.integers(0, len(real) - 1))
        return real[:i] + bytes([draw(st.integers(0, 255))]) + real[i + 1:]
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "text":
        return draw(st.text(max_size=80)).encode("utf-8", "surrogatepass")
    if kind == "json":
        value = draw(JSON)
        if draw(st.booleans()):
            value = {"medusa_choices": value} if draw(st.booleans()) else [{"instruction": value}]
        return json.dumps(value).encode()
    header = real.split(b"\n", 1)[0] if real.isascii() else b"head,rank,accuracy"
    width = header.count(b",") + 1
    rows = draw(st.lists(st.lists(CELL, min_size=width, max_size=width), max_size=4))
    return b"\n".join([header] + [",".join(r).encode("utf-8", "surrogatepass") for r in rows]) + b"\n"


@settings(max_examples=int(os.environ.get("WORKBENCH_FUZZ_EXAMPLES", 80)), deadline=None,
          suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_generated_garbage_never_ends_in_a_traceback(data, env, tmp_path_factory, capsys):
    s = data.draw(st.sampled_from(SLOTS))
    where = tmp_path_factory.mktemp("gen")
    P = _place(env, s, data.draw(damaged(_real_bytes(env, s))), where / "in")
    rc, lines = _run(capsys, s.argv(env, P, where / "out"), where / "out", where / "in")
    assert rc in (0, 2), lines  # 0: the garbage happened to be a valid file


# ----------------------------------------------------------------------------------------------- implied sizes

@st.composite
def heads_indexes(draw) -> dict:
    """The names and shapes of a heads file (what runtime.heads reads before loading anything): a valid layout,
    then up to two changes with far indexes, vast dimensions or a dropped tensor."""
    from workbench.runtime.heads import HeadsLayout

    K, L, H = draw(st.integers(1, 3)), draw(st.integers(1, 2)), draw(st.integers(1, 4))
    tied = draw(st.booleans())
    index = dict(HeadsLayout(K, L, H, 0 if tied else draw(st.integers(1, 6)), tied).shapes())
    big = st.one_of(st.integers(0, 5), st.integers(60, 70), st.integers(1 << 15, 1 << 40))
    for _ in range(draw(st.integers(0, 2))):
        how = draw(st.sampled_from(["add", "reshape", "drop"]))
        if how == "add":
            index[f"{draw(big)}.{draw(big)}.{draw(st.sampled_from(['linear.weight', 'linear.bias', 'weight']))}"] = \
                tuple(draw(st.lists(big, min_size=1, max_size=2)))
        elif how == "reshape":
            k = draw(st.sampled_from(sorted(index)))
            index[k] = tuple(draw(st.lists(big, min_size=1, max_size=3)))
        elif len(index) > 1:
            index.pop(draw(st.sampled_from(sorted(index))))
    return index


@pytest.mark.unit
@settings(max_examples=300, deadline=None)
@given(heads_indexes())
def test_a_heads_file_implies_only_what_it_holds_or_is_refused(index):
    """Whatever the names and shapes claim, the heads built from them are exactly the file's tensors, within the
    limits: nothing is allocated past what the file holds (issue 52)."""
    from workbench import WorkbenchError
    from workbench.runtime.heads import MAX_HEADS, MAX_HIDDEN, MAX_LAYERS, MAX_VOCAB, heads_layout

    try:
        layout = heads_layout({k: (v, True) for k, v in index.items()}, "f")
    except WorkbenchError as e:
        assert "\n" not in str(e)
        return
    assert layout.shapes() == index
    assert layout.num_heads <= MAX_HEADS and layout.num_layers <= MAX_LAYERS
    assert layout.hidden_size <= MAX_HIDDEN and layout.vocab_size <= MAX_VOCAB


@pytest.mark.unit
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(ks=st.lists(st.one_of(st.integers(1, 40), st.integers((1 << 20) - 3, 10 ** 12)), min_size=1, max_size=3,
                   unique=True),
       heads=st.integers(1, 40))
def test_a_topk_table_is_refused_before_its_grid_when_the_grid_is_too_large(ks, heads, tmp_path_factory):
    """Medusa's cumulative top-k table names its largest k in a column header: a grid past the limits is refused
    from the header, and one within them is built (issue 52: a `top1000000000` column made a billion rows)."""
    from workbench import WorkbenchError
    from workbench.trees.accuracies import MAX_CELLS, MAX_RANKS, read_accuracies

    ks = sorted(ks)
    f = tmp_path_factory.mktemp("topk") / "t.csv"
    rates = [0.3 + 0.1 * i / len(ks) for i in range(len(ks))]
    f.write_text("head," + ",".join(f"top{k}" for k in ks) + "\n" +
                 "".join(f"{h}," + ",".join(map(str, rates)) + "\n" for h in range(heads)))
    try:
        acc = read_accuracies(f)
    except WorkbenchError as e:
        assert "\n" not in str(e) and (ks[-1] > MAX_RANKS or heads * ks[-1] > MAX_CELLS), str(e)
        return
    assert acc.shape == (heads, ks[-1]) and ks[-1] <= MAX_RANKS and heads * ks[-1] <= MAX_CELLS


# ----------------------------------------------------------------------------------------------- no tokenizer

def test_decode_prompt_ids_need_no_tokenizer(tiny_llama, tmp_path, capsys):
    from workbench.decode.loop import vanilla_generate

    bare = tmp_path / "bare"
    tiny_llama.model.save_pretrained(bare)  # weights and config only
    argv = ["decode", "--model", str(bare), "--heads", str(tiny_llama.heads_dirs["2"]), "--tree", "[[0],[0,0],[1]]",
            "--max-new-tokens", "12", "--device", "cpu"]
    assert main(argv + ["--prompt-ids", "5,6,7", "--compare"]) == 0
    out, err = capsys.readouterr()
    ids, summary = out.strip().splitlines()
    assert [int(i) for i in ids.split(",")] == vanilla_generate(tiny_llama.model, None, [5, 6, 7], 12).token_ids
    assert "matches greedy: yes" in summary and "no tokenizer" in err
    rc, lines = _run(capsys, argv + ["--prompt", "hi"], tmp_path / "out", tmp_path / "bare")
    assert rc == 2 and "--prompt-ids" in lines[-1] and str(bare) in lines[-1]


# ----------------------------------------------------------------------------------------------- the atomic writer

def test_the_atomic_writer_reports_its_own_failures_in_one_line(tmp_path):
    from workbench import WorkbenchError
    from workbench.core.io import atomic_write_text

    (tmp_path / "a-file").write_text("x")
    (tmp_path / "a-folder").mkdir()
    for target, reason in [(tmp_path / "a-folder", "is a folder"), (tmp_path / "a-file" / "x.json", "is a file"),
                           (Path("/proc/workbench-test.json"), "cannot write"),
                           (tmp_path / ("n" * 300 + ".json"), "cannot write")]:
        with pytest.raises(WorkbenchError, match=reason) as e:
            atomic_write_text(target, "{}", "out")
        assert str(e.value).startswith(f"--out {target}") and "\n" not in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "a-folder"]  # no temp file left
    # a temp file of a killed writer (dead pid) goes with the next write of the same file; a live one stays
    import subprocess
    import sys

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / f".t.json.{dead.pid}.tmp.json").write_text("half")
    (tmp_path / f".t.json.{os.getppid()}.tmp.json").write_text("someone else's, in flight")
    atomic_write_text(tmp_path / "t.json", "{}")
    assert sorted(p.name for p in tmp_path.glob("*t.json*")) == [f".t.json.{os.getppid()}.tmp.json", "t.json"]
