"""Soak: the long resumable commands (calibrate, train-heads, sweep) killed with SIGKILL at several random points
in a row, each time resumed, end with the same files as one uninterrupted run: byte for byte where the output
holds no timings (calibrate's folder, train-heads' heads file), row for row on the deterministic columns of a
sweep. (`latency` keeps no partial state: a killed run leaves nothing, its atomic CSV is written at the end.)

Each kill point is random (a seed in every message, WORKBENCH_FAULT_SEED reproduces it); test_faults.py covers
one kill with the lock refusal, this file several kills in one run's life.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from helpers import freeze_when
from workbench.cli import main

REPO = Path(__file__).resolve().parents[1]
PROMPTS = [f"Tell me about the number {i}." for i in range(10)]
KILLS = 3


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    f = tmp_path_factory.mktemp("soak") / "prompts.jsonl"
    f.write_text("".join(json.dumps({"id": f"q{i}", "instruction": p}) + "\n" for i, p in enumerate(PROMPTS)))
    return f


def _seed(request):
    seed = int(os.environ.get("WORKBENCH_FAULT_SEED", random.randrange(1 << 30)))
    return random.Random(seed), f"{request.node.name} seed {seed} (WORKBENCH_FAULT_SEED={seed} reproduces it)"


def _kill_and_resume(argv, progress, rng, what, capsys) -> None:
    """Start, freeze after progress() grows by a random step, SIGKILL; KILLS times; then finish in-process."""
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    for k in range(KILLS):
        start = progress()
        proc = subprocess.Popen([sys.executable, "-m", "workbench.cli", *argv], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
        step = rng.randrange(1, 3)

        def alive() -> bool:
            if proc.poll() is not None:  # finished before this kill point: the rest of the soak is moot
                return False
            return True
        try:
            freeze_when(proc.pid, lambda: progress() >= start + step, alive, rng, f"{what} kill {k + 1}")
        except AssertionError:
            proc.wait()
            proc.stderr.close()
            assert proc.returncode == 0, f"{what}: kill {k + 1}: the run failed ({proc.returncode})"
            break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stderr.close()
    assert main(argv) == 0, what
    capsys.readouterr()


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_calibrate_killed_again_and_again_ends_byte_for_byte(tiny_llama, prompts, tmp_path, capsys, request):
    rng, what = _seed(request)

    def argv(out):
        return ["calibrate", "--model", str(tiny_llama.model_dir), "--heads", str(tiny_llama.heads_dirs["2"]),
                "--prompts", str(prompts), "--max-new-tokens", "16", "--topk", "3", "--budgets", "3", "--batch-size",
                "1", "--device", "cpu", "--out", str(out), "--trees-dir", str(out / "trees")]
    out = tmp_path / "killed"
    _kill_and_resume(argv(out), lambda: len(list((out / "parts").glob("*.ranks.parquet")))
                     if (out / "parts").is_dir() else 0, rng, what, capsys)
    assert main(argv(tmp_path / "whole")) == 0
    a, b = _files(out), _files(tmp_path / "whole")
    meta = "meta.json"
    strip = lambda m: {k: v for k, v in json.loads(m).items() if k not in ("elapsed_seconds", "compute_seconds",  # noqa: E731
                                                                             "folder", "trees", "args")}
    assert strip(a.pop(meta)) == strip(b.pop(meta)), what
    tree_text = lambda d: {k: json.dumps({x: y for x, y in json.loads(v).items() if x != "calibration"})  # noqa: E731
                           for k, v in d.items() if k.startswith("trees/")}
    assert tree_text(a) == tree_text(b), what
    a = {k: v for k, v in a.items() if not k.startswith("trees/")}
    b = {k: v for k, v in b.items() if not k.startswith("trees/")}
    assert a.keys() == b.keys() and all(a[k] == b[k] for k in a), (what, [k for k in a if a.get(k) != b.get(k)])


@pytest.mark.slow
def test_train_heads_killed_again_and_again_ends_byte_for_byte(tiny_llama, prompts, tmp_path, capsys, request):
    rng, what = _seed(request)

    def argv(name):
        return ["train-heads", "--model", str(tiny_llama.model_dir), "--prompts", str(prompts), "--tokens", "300",
                "--max-new-tokens", "16", "--gen-batch", "1", "--gen-dtype", "float32", "--num-heads", "2", "--steps",
                "60", "--batch-size", "16", "--lr", "0.01", "--work", str(tmp_path / f"work-{name}"), "--out",
                str(tmp_path / f"heads-{name}")]
    work = tmp_path / "work-killed"
    _kill_and_resume(argv("killed"), lambda: len(list((work / "parts").glob("part-*.pt")))
                     if (work / "parts").is_dir() else 0, rng, what, capsys)
    assert main(argv("whole")) == 0
    capsys.readouterr()
    f = "medusa_lm_head.safetensors"
    assert (tmp_path / "heads-killed" / f).read_bytes() == (tmp_path / "heads-whole" / f).read_bytes(), what


@pytest.mark.slow
def test_sweep_killed_again_and_again_ends_with_the_same_rows(tiny_llama, prompts, tmp_path, capsys, request):
    rng, what = _seed(request)
    trees = ["[[0]]", "[[1]]", "[[0],[1]]", "[[0],[0,0]]", "[[0],[0,0],[0,0,0]]", "[[0],[1],[0,0]]"]

    def argv(out):
        return ["sweep", "--model", str(tiny_llama.model_dir), "--heads", str(tiny_llama.heads_dirs["2"]), "--trees",
                *trees, "--prompts", str(prompts), "--limit", "4", "--max-new-tokens", "16", "--device", "cpu",
                "--quiet", "--out", str(out)]
    out = tmp_path / "killed.csv"

    def rows() -> int:
        try:
            return len(out.read_text().splitlines()) - 1
        except FileNotFoundError:
            return 0
    _kill_and_resume(argv(out), rows, rng, what, capsys)
    assert main(argv(tmp_path / "whole.csv")) == 0
    capsys.readouterr()
    cols = ["config", "tree", "kind", "nodes", "depth", "acceptance", "temperature", "acceleration_rate",
            "exact_match", "num_prompts", "new_tokens", "steps"]
    a, b = (pd.read_csv(f)[cols] for f in (out, tmp_path / "whole.csv"))
    pd.testing.assert_frame_equal(a, b, obj=what)
