"""Faults lose nothing: calibrate, sweep and train-heads killed with SIGKILL at a random point and rerun end with
the output of an uninterrupted run, and a second run on the same folder refuses while the first lives.

Each test runs the real CLI (`python -m workbench.cli`) as a subprocess on a tiny random model, freezes it
(SIGSTOP) right after its N-th part is on disk, checks that a second run on the same folder refuses in
one line naming the owner's pid, kills the first with SIGKILL (leaving its lock file behind, with a dead pid) and
reruns to the end in-process. The rerun takes the stale lock over and must equal an uninterrupted run.
The seed of the random point is in every assertion message.
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

from workbench.cli import main
from workbench.core.io import LOCK_NAME, run_lock

from helpers import freeze_when

REPO = Path(__file__).resolve().parents[1]
PROMPTS = [f"Say something about the number {i}." for i in range(12)]


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    f = tmp_path_factory.mktemp("faults") / "prompts.jsonl"
    f.write_text("".join(json.dumps({"id": f"q{i}", "instruction": p}) + "\n" for i, p in enumerate(PROMPTS)))
    return f


def _start(argv: list[str], cwd: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return subprocess.Popen([sys.executable, "-m", "workbench.cli", *argv], cwd=cwd, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _freeze_when(proc: subprocess.Popen, ready, rng: random.Random, what: str) -> None:
    """Freeze the run (SIGSTOP) right after ready() holds (the N-th part is on disk)."""
    def alive() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"{what}: the run ended (status {proc.returncode}) before the kill point: "
                        f"{proc.stderr.read().decode()[-800:]}")
        return True
    freeze_when(proc.pid, ready, alive, rng, what)
    assert proc.poll() is None, f"{what}: finished before the kill point; lower N"


def _refused_then_killed(proc, argv, lock: Path, capsys, what: str) -> None:
    """While the frozen run holds the lock, the same command refuses in one line; then SIGKILL it."""
    assert lock.read_text().strip() == str(proc.pid), what
    assert main(argv) == 2, what
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert err[-1].startswith("error: ") and f"another run (pid {proc.pid})" in err[-1], (what, err)
    assert [line for line in err if line.startswith("error: ")] == [err[-1]], (what, err)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL, what
    assert lock.read_text().strip() == str(proc.pid), f"{what}: a killed run leaves its lock (pid dead)"


def _seed(request) -> tuple[random.Random, str]:
    seed = int(os.environ.get("WORKBENCH_FAULT_SEED", random.randrange(1 << 30)))
    return random.Random(seed), f"{request.node.name} seed {seed} (WORKBENCH_FAULT_SEED={seed} reproduces it)"


# ----------------------------------------------------------------------------------------------- calibrate

def _calibration(folder: Path) -> dict:
    """Everything a calibration folder holds, less run times and the folder's own path."""
    meta = json.loads((folder / "meta.json").read_text())
    for k in ("elapsed_seconds", "compute_seconds"):
        meta.pop(k)
    trees = {f.name: json.loads(f.read_text()) for f in sorted((folder / "trees").iterdir())}
    for t in list(meta["trees"]) + list(trees.values()):
        t.pop("calibration")
    frames = {f: pd.read_parquet(folder / f"{f}.parquet").to_json() for f in ("ranks", "continuations")}
    return dict(files=sorted(p.name for p in folder.rglob("*")), meta=meta, trees=trees, **frames,
                accuracies=(folder / "accuracies.csv").read_text())


@pytest.mark.soak
def test_calibrate_killed_at_a_random_point_resumes_to_the_same_folder(tiny_llama, prompts, tmp_path, capsys,
                                                                       request):
    rng, what = _seed(request)
    argv = lambda out: ["calibrate", "--model", str(tiny_llama.model_dir), "--heads", str(tiny_llama.heads_dirs["2"]),
                        "--prompts", str(prompts), "--max-new-tokens", "24", "--topk", "3", "--budgets", "3,5",
                        "--gen-batch", "1", "--device", "cpu", "--out", str(out)]
    out = tmp_path / "killed"
    proc = _start(argv(out), tmp_path)
    n = rng.randrange(1, 8)  # 12 batches of one prompt
    _freeze_when(proc, lambda: (out / "parts" / f"{n - 1:05d}.ranks.parquet").is_file(), rng, what)
    _refused_then_killed(proc, argv(out), out / LOCK_NAME, capsys, what)
    assert main(argv(out)) == 0, what
    assert main(argv(tmp_path / "whole")) == 0
    assert _calibration(out) == _calibration(tmp_path / "whole"), what


# ----------------------------------------------------------------------------------------------- sweep

DETERMINISTIC = ["run", "config", "tree", "kind", "nodes", "depth", "acceptance", "temperature", "tokens_per_step",
                 "exact_match", "mean_logprob", "distinct_2", "num_prompts", "new_tokens", "steps", "model", "prompts"]


@pytest.mark.soak
def test_sweep_killed_at_a_random_point_resumes_to_the_same_rows(tiny_llama, prompts, tmp_path, capsys, request):
    rng, what = _seed(request)
    trees = ["[[0]]", "[[1]]", "[[0],[1]]", "[[0],[0,0]]", "[[0],[0,0],[0,0,0]]", "[[0],[1],[2],[0,0]]",
             "[[0],[0,0],[1],[1,0]]", "[[2],[2,0]]"]
    argv = lambda out: ["sweep", "--model", str(tiny_llama.model_dir), "--heads", str(tiny_llama.heads_dirs["2"]),
                        "--trees", *trees, "--prompts", str(prompts), "--limit", "6", "--max-new-tokens", "24",
                        "--device", "cpu", "--quiet", "--out", str(out)]
    out = tmp_path / "killed.csv"
    proc = _start(argv(out), tmp_path)
    n = rng.randrange(1, 6)  # rows on disk (vanilla first) before the kill; 9 in all

    def rows() -> int:
        try:
            return len(out.read_text().splitlines()) - 1
        except FileNotFoundError:
            return 0
    _freeze_when(proc, lambda: rows() >= n, rng, what)
    _refused_then_killed(proc, argv(out), tmp_path / f".{out.name}.lock", capsys, what)
    assert main(argv(out)) == 0, what
    assert main(argv(tmp_path / "whole.csv")) == 0
    a, b = (pd.read_csv(f)[DETERMINISTIC] for f in (out, tmp_path / "whole.csv"))
    assert len(a) == 1 + len(trees), what
    pd.testing.assert_frame_equal(a, b, obj=what)
    assert sorted(p.name for p in tmp_path.iterdir() if "killed" in p.name) == ["killed.csv"], what


# ----------------------------------------------------------------------------------------------- train-heads

@pytest.mark.soak
def test_train_heads_killed_at_a_random_point_resumes_to_the_same_heads(tiny_llama, prompts, tmp_path, capsys,
                                                                        request):
    from safetensors.torch import load_file

    rng, what = _seed(request)
    argv = lambda name: ["train-heads", "--model", str(tiny_llama.model_dir), "--prompts", str(prompts),
                         "--tokens", "400", "--max-new-tokens", "24", "--gen-batch", "1", "--gen-dtype", "float32",
                         "--num-heads", "3", "--steps", "160", "--positions-per-step", "32", "--heads-lr", "0.01",
                         "--work", str(tmp_path / f"work-{name}"), "--out", str(tmp_path / f"heads-{name}")]
    work = tmp_path / "work-killed"
    proc = _start(argv("killed"), tmp_path)
    # during generation (after the N-th part) or during training (after a checkpoint: steps 50, 100, 150)
    if rng.random() < 0.5:
        n = rng.randrange(1, 8)
        ready = lambda: len(list((work / "parts").glob("part-*.pt"))) >= n
    else:
        ready = lambda: any(work.glob("checkpoint-*.pt"))
    _freeze_when(proc, ready, rng, what)
    _refused_then_killed(proc, argv("killed"), work / LOCK_NAME, capsys, what)
    assert main(argv("killed")) == 0, what
    assert main(argv("whole")) == 0
    capsys.readouterr()
    a, b = (load_file(str(tmp_path / f"heads-{n}" / "medusa_lm_head.safetensors")) for n in ("killed", "whole"))
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a), what
    parts = lambda name: sorted(p.name for p in (tmp_path / f"work-{name}" / "parts").iterdir())
    assert parts("killed") == parts("whole"), what  # no temp file of the killed run is left


# ----------------------------------------------------------------------------------------------- the lock itself

def test_a_live_lock_refuses_and_a_stale_one_is_taken_over(tmp_path):
    from workbench import WorkbenchError

    folder = tmp_path / "run"
    with run_lock(folder, "out") as lock:
        assert lock.read_text().strip() == str(os.getpid())
        with pytest.raises(WorkbenchError, match=rf"--out {folder}: another run \(pid {os.getpid()}\)"):
            with run_lock(folder, "out"):
                pass
    assert not lock.exists() and not folder.exists()  # released, and the folder it made (left empty) removed
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    folder.mkdir()
    (folder / LOCK_NAME).write_text(f"{dead.pid}\n")  # a killed owner's lock
    (folder / "part").write_text("kept")
    with run_lock(folder, "out") as lock:
        assert lock.read_text().strip() == str(os.getpid())
    assert sorted(p.name for p in folder.iterdir()) == ["part"]
