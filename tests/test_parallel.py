"""Data-parallel runs and models across devices: N processes of one launch each compute a contiguous share and the
last to finish merges, into exactly the folder one process writes; a killed process costs only its missing share;
`--device-map auto` loads a model through accelerate's big-model loading.

The launch tests run the real launcher, `accelerate launch --multi_gpu --num_processes 2 ... --device cpu` (on a
machine without GPUs accelerate's multi-GPU launcher is torchrun: it starts the N processes and sets RANK and
WORLD_SIZE; `accelerate launch --cpu` starts several processes only through MPI). The other tests play the
processes of a launch one after the other in this process, by setting RANK and WORLD_SIZE as a launcher does.
"""
from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from workbench import WorkbenchError
from workbench.calibrate.run import CalibrateConfig, calibrate
from workbench.cli import main
from workbench.core.io import LOCK_NAME, run_lock
from workbench.runtime.parallel import Launch, current_launch, one_process_warning

from helpers import freeze_when

REPO = Path(__file__).resolve().parents[1]
PROMPTS = [f"Say something about the number {i}." for i in range(12)]
ARGS = dict(max_new_tokens=24, topk=3, budgets=(3, 5), batch_size=1, device="cpu", holdout=0.25)


def _argv(tiny, prompts: Path, out: Path, **over) -> list[str]:
    a = dict(ARGS, **over)
    return ["calibrate", "--model", str(tiny.model_dir), "--heads", str(tiny.heads_dirs["2"]), "--prompts",
            str(prompts), "--max-new-tokens", str(a["max_new_tokens"]), "--topk", str(a["topk"]), "--budgets",
            ",".join(map(str, a["budgets"])), "--gen-batch", str(a["batch_size"]), "--device", a["device"],
            "--holdout", str(a["holdout"]), "--out", str(out)]


def _cal(tiny, prompts: Path, out: Path, on_batch=None, **over) -> dict:
    cfg = CalibrateConfig(model=str(tiny.model_dir), heads=str(tiny.heads_dirs["2"]), prompts=str(prompts), out=out,
                          **dict(ARGS, **over))
    return calibrate(cfg, on_batch=on_batch, progress=False)


def _folder(folder: Path) -> dict:
    """Everything a calibration folder holds, less run times, the folder's own path and the process count."""
    meta = json.loads((folder / "meta.json").read_text())
    for k in ("elapsed_seconds", "compute_seconds", "num_processes"):
        meta.pop(k)
    trees = {f.name: json.loads(f.read_text()) for f in sorted((folder / "trees").iterdir())}
    for t in list(meta["trees"]) + list(trees.values()):
        t.pop("calibration")
    frames = {f: pd.read_parquet(folder / f"{f}.parquet").to_json() for f in ("ranks", "continuations")}
    return dict(files=sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")), meta=meta, trees=trees,
                accuracies=(folder / "accuracies.csv").read_text(), **frames)


@pytest.fixture(scope="module")
def prompts(make_prompt_file) -> Path:
    return make_prompt_file(PROMPTS)


@pytest.fixture(scope="module")
def single(tiny_llama, prompts, tmp_path_factory) -> Path:
    """The reference: one process, the same prompts and arguments."""
    out = tmp_path_factory.mktemp("single") / "cal"
    meta = _cal(tiny_llama, prompts, out)
    assert meta["num_processes"] == 1 and json.loads((out / "meta.json").read_text())["num_processes"] == 1
    return out


def as_process(monkeypatch, rank: int, world: int) -> None:
    """Be process `rank` of `world`, as torchrun/accelerate tell a process (this test process is the launcher's
    child for every rank played here: they are one launch)."""
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))


# ----------------------------------------------------------------------------------------------- the launch

@pytest.mark.unit
def test_share_is_accelerates_split_between_processes():
    from accelerate import PartialState

    for n in range(0, 12):
        for world in range(1, 6):
            shares = [Launch(rank=r, world=world).share(n) for r in range(world)]
            for r, share in enumerate(shares):  # accelerate's own function on a state of `world` processes
                with PartialState.split_between_processes(SimpleNamespace(num_processes=world, process_index=r),
                                                          list(range(n))) as theirs:
                    assert list(share) == list(theirs), (n, world, r)
            assert [i for s in shares for i in s] == list(range(n))  # contiguous, in order, every item once


@pytest.mark.unit
def test_the_launchers_variables_say_the_rank(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "PMI_RANK", "PMI_SIZE",
                "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "ACCELERATE_USE_CPU", "MASTER_ADDR",
                "WORKBENCH_LAUNCH_ID"):
        monkeypatch.delenv(var, raising=False)
    alone = current_launch()
    assert (alone.rank, alone.world, alone.launcher) == (0, 1, os.getpid())
    assert current_launch().id != alone.id  # two plain runs in one process are two launches
    monkeypatch.setenv("PMI_RANK", "2")  # MPI (accelerate launch --cpu --mpirun_hostfile)
    monkeypatch.setenv("PMI_SIZE", "3")
    mpi = current_launch()
    assert (mpi.rank, mpi.world, mpi.local_rank, mpi.launcher) == (2, 3, 2, os.getppid())
    as_process(monkeypatch, 1, 4)  # torchrun's variables come first
    monkeypatch.setenv("LOCAL_RANK", "0")
    a, b = current_launch(), current_launch()
    assert (a.rank, a.world, a.local_rank) == (1, 4, 0) and a.id == b.id  # one launch: the same id every time
    assert a.device("cpu") == "cpu" and a.device(None, "auto") is None  # one process here: a map may take all GPUs
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(WorkbenchError, match="--device-map auto with 2 processes on this machine"):
        current_launch().device(None, "auto")
    monkeypatch.setenv("WORKBENCH_LAUNCH_ID", "job-17")  # processes on several machines: one launch by name
    assert current_launch().id == "job-17"
    monkeypatch.setenv("RANK", "4")
    with pytest.raises(WorkbenchError, match=r"RANK=4 with WORLD_SIZE=4: .*\[0, 4\)"):
        current_launch()
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(WorkbenchError, match="must be integers"):
        current_launch()


@pytest.mark.unit
def test_accelerate_launch_cpu_starting_one_process_is_said(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("ACCELERATE_USE_CPU", "True")  # what `accelerate launch --cpu --num_processes 2` sets ...
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")    # ... for the one process it starts without MPI
    assert "started one process" in one_process_warning() and "--multi_gpu" in one_process_warning()
    as_process(monkeypatch, 0, 2)
    assert one_process_warning() is None


@pytest.mark.unit
def test_the_processes_of_a_launch_share_the_run_lock_and_nobody_else_does(tmp_path):
    folder = tmp_path / "run"
    a0, a1 = Launch(0, 2, launcher=111, id="111@5"), Launch(1, 2, launcher=111, id="111@5")
    other = Launch(0, 2, launcher=222, id="222@9")
    with run_lock(folder, "out", launch=a0) as lock:
        assert lock.read_text().split() == ["111", "111@5"]
        with run_lock(folder, "out", launch=a1):  # the same launch joins
            for who in (None, other):  # a plain run, another launch: refused, naming the launcher
                with pytest.raises(WorkbenchError, match=rf"--out {folder}: another run \(pid 111\)"):
                    with run_lock(folder, "out", launch=who):
                        pass
        assert lock.exists()  # one process left: still held
        with pytest.raises(WorkbenchError, match=r"another run \(pid 111\)"):
            with run_lock(folder, "out"):
                pass
    assert not folder.exists()  # the last one out removed the lock and the folder it made
    folder.mkdir()
    (folder / LOCK_NAME).write_text("111 111@5\n")  # a launch whose processes all died
    with run_lock(folder, "out") as lock:
        assert lock.read_text().strip() == str(os.getpid())


# ----------------------------------------------------------------------------------------------- calibrate

def test_processes_of_a_launch_merge_into_the_one_process_folder(tiny_llama, prompts, single, tmp_path, monkeypatch):
    out = tmp_path / "dp"
    seen = []
    as_process(monkeypatch, 1, 3)  # the last share first: nothing to merge yet
    r = _cal(tiny_llama, prompts, out, on_batch=seen.append)
    assert r == dict(folder=str(out), merged=False, rank=1, num_processes=3, batches=4, computed=4)
    assert seen == [4, 5, 6, 7] and not (out / "ranks.parquet").exists()
    as_process(monkeypatch, 0, 3)
    assert not _cal(tiny_llama, prompts, out, on_batch=seen.append)["merged"]  # process 2 has not started
    as_process(monkeypatch, 2, 3)
    meta = _cal(tiny_llama, prompts, out, on_batch=seen.append)
    assert meta["merged"] and meta["num_processes"] == 3 and sorted(seen) == list(range(12))
    assert json.loads((out / "meta.json").read_text())["num_processes"] == 3
    assert _folder(out) == _folder(single)  # parts, shard locks and the run lock are gone; the rest is equal


def test_a_process_that_died_without_its_parts_is_one_error_line_and_a_relaunch_does_only_its_rest(
        tiny_llama, prompts, single, tmp_path, monkeypatch, capsys):
    out = tmp_path / "dp"

    def die_after_two(i):
        if i == 7:
            raise KeyboardInterrupt  # what a kill between batches looks like to the process itself

    as_process(monkeypatch, 1, 2)
    with pytest.raises(KeyboardInterrupt):
        _cal(tiny_llama, prompts, out, on_batch=die_after_two)
    as_process(monkeypatch, 0, 2)
    assert main(_argv(tiny_llama, prompts, out)) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(err) == 1 and "process 1 of 2 (pid" in err[0] and "ended without finishing its share" in err[0]
    parts = sorted(p.name for p in (out / "parts").glob("*.ranks.parquet"))
    assert parts == [f"{i:05d}.ranks.parquet" for i in range(8)]  # nothing lost: 0-5 and the dead one's 6, 7
    seen = []
    as_process(monkeypatch, 1, 2)  # the relaunch: process 1 does only its missing batches, then merges
    assert _cal(tiny_llama, prompts, out, on_batch=seen.append)["merged"]
    assert seen == [8, 9, 10, 11]
    assert _folder(out) == _folder(single)


def test_a_plain_rerun_finishes_what_a_launch_left(tiny_llama, prompts, single, tmp_path, monkeypatch):
    out = tmp_path / "dp"
    as_process(monkeypatch, 0, 4)
    _cal(tiny_llama, prompts, out)
    for var in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var)
    seen = []
    meta = _cal(tiny_llama, prompts, out, on_batch=seen.append)
    assert seen == list(range(3, 12)) and meta["num_processes"] == 1
    assert _folder(out) == _folder(single)


def test_bad_launches_are_one_line_errors_and_lose_nothing(tiny_llama, prompts, tmp_path, monkeypatch, capsys):
    def error(argv) -> str:
        assert main(argv) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert lines[-1].startswith("error: ") and sum(line.startswith("error: ") for line in lines) == 1, lines
        return lines[-1]

    out = tmp_path / "c"
    as_process(monkeypatch, 0, 13)
    assert "13 processes for 12 prompts in 12 batch(es) of --gen-batch 1" in error(_argv(tiny_llama, prompts, out))
    as_process(monkeypatch, 0, 5)
    assert "launch at most 3" in error(_argv(tiny_llama, prompts, out, batch_size=4))
    assert not out.exists()  # refused before anything was written

    # a folder holding another run's shards: other arguments, parts without their args.json, a foreign part
    as_process(monkeypatch, 1, 2)
    _cal(tiny_llama, prompts, out)
    as_process(monkeypatch, 0, 2)
    assert "other arguments (max_new_tokens: 24 -> 20)" in error(_argv(tiny_llama, prompts, out, max_new_tokens=20))
    (out / "parts" / "args.json").unlink()
    assert "parts holds part files but no args.json" in error(_argv(tiny_llama, prompts, out))
    keep = sorted(p.name for p in (out / "parts").iterdir())
    assert len([k for k in keep if k.endswith(".ranks.parquet")]) == 6  # nothing lost
    for_force = _argv(tiny_llama, prompts, out) + ["--force"]
    as_process(monkeypatch, 1, 2)
    assert main(for_force) == 0  # --force: starts over, computes process 1's share again
    capsys.readouterr()
    parts = out / "parts"
    (parts / "00011.prompts.parquet").write_bytes((parts / "00010.prompts.parquet").read_bytes())
    as_process(monkeypatch, 0, 2)
    assert "00011.prompts.parquet: holds prompts ['q10']" in error(_argv(tiny_llama, prompts, out))


# ----------------------------------------------------------------------------------------------- accelerate launch

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(argv: list[str], cwd: Path, log: Path) -> subprocess.Popen:
    """`accelerate launch --multi_gpu --num_processes 2 -m workbench.cli ARGV` (stderr of all processes -> log)."""
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(var, None)
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", str(_free_port()), "-m", "workbench.cli", *argv]
    with log.open("w") as err:  # the processes write to their own copy of the file descriptor
        return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=err)


def _wait(proc: subprocess.Popen, log: Path, timeout: float = 300) -> int:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"the launch did not end in {timeout} s: {log.read_text()[-1500:]}")


def test_accelerate_launch_of_two_processes_equals_one_process(tiny_llama, prompts, single, tmp_path):
    out, log = tmp_path / "dp", tmp_path / "log"
    assert _wait(_launch(_argv(tiny_llama, prompts, out), tmp_path, log), log) == 0, log.read_text()[-1500:]
    text = log.read_text()
    assert "process 0 of 2" in text and "process 1 of 2" in text and text.count("merged every process's parts") == 1
    assert "Traceback" not in text
    assert json.loads((out / "meta.json").read_text())["num_processes"] == 2
    assert _folder(out) == _folder(single)


@pytest.mark.soak
def test_a_killed_process_costs_only_its_missing_share(tiny_llama, prompts, single, tmp_path, capsys):
    seed = int(os.environ.get("WORKBENCH_FAULT_SEED", random.randrange(1 << 30)))
    rng, what = random.Random(seed), f"seed {seed} (WORKBENCH_FAULT_SEED={seed} reproduces it)"
    out, log = tmp_path / "dp", tmp_path / "log1"
    launcher = _launch(_argv(tiny_llama, prompts, out), tmp_path, log)
    n = rng.randrange(1, 4)  # process 1 (batches 6-11) is frozen once n of its parts are on disk
    lock, t0 = out / "parts" / ".rank-1.lock", time.time()
    while len(state := (lock.read_text().split() if lock.is_file() else [])) < 2:  # LAUNCH_ID PID running
        assert launcher.poll() is None, f"{what}: the launch ended early: {log.read_text()[-1500:]}"
        assert time.time() - t0 < 300, what
        time.sleep(0.005)
    pid = int(state[1])
    freeze_when(pid, lambda: (out / "parts" / f"{5 + n:05d}.ranks.parquet").is_file(),
                lambda: launcher.poll() is None, rng, what)
    # while it lives, a plain run on the folder refuses in one line naming the launcher
    assert main(_argv(tiny_llama, prompts, out)) == 2, what
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(err) == 1 and f"another run (pid {launcher.pid})" in err[0], (what, err)
    os.kill(pid, signal.SIGKILL)  # the launcher then stops the other process (if still at work) and fails
    assert _wait(launcher, log) != 0, what
    have = {int(p.name[:5]) for p in (out / "parts").glob("*.ranks.parquet")}
    assert {6, 7, 8, 9, 10, 11} - have, f"{what}: process 1 finished before the kill"
    log2 = tmp_path / "log2"
    assert _wait(_launch(_argv(tiny_llama, prompts, out), tmp_path, log2), log2) == 0, log2.read_text()[-1500:]
    text = log2.read_text()
    for r, share in ((0, range(0, 6)), (1, range(6, 12))):
        missing = len(set(share) - have)
        assert f"process {r} of 2: computed {missing} of its 6 batch(es)" in text, (what, r, missing, text[-1500:])
    assert _folder(out) == _folder(single), what


# ----------------------------------------------------------------------------------------------- --device-map

def test_device_map_auto_loads_through_accelerate_and_calibrates_the_same(tiny_llama, prompts, single, tmp_path,
                                                                          monkeypatch, capsys):
    meta = _cal(tiny_llama, prompts, tmp_path / "mapped", device=None, device_map="auto")
    assert meta["args"]["device"] == "cpu"
    assert _folder(tmp_path / "mapped") == _folder(single)
    assert main(_argv(tiny_llama, prompts, tmp_path / "x") + ["--device-map", "auto"]) == 2
    assert "--device cpu with --device-map auto: the device map places the model itself" in capsys.readouterr().err


def test_a_model_spread_over_devices_gives_the_same_ranks(tiny_llama, tmp_path):
    """Layer 1 offloaded to disk (accelerate's hooks bring it in per forward; the weights stay off the device):
    the code must not assume one device for the model, the last hidden state and the heads."""
    from transformers import AutoModelForCausalLM

    from workbench.calibrate.topk import head_ranks
    from workbench.runtime.generation import greedy_continuations
    from workbench.runtime.models import hidden_device

    spread = AutoModelForCausalLM.from_pretrained(
        tiny_llama.model_dir, offload_folder=tmp_path / "offload",
        device_map={"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu",
                    "model.layers.1": "disk", "model.norm": "cpu", "lm_head": "cpu"})
    assert spread.model.layers[1].self_attn.q_proj.weight.device.type == "meta"
    assert hidden_device(spread).type == "cpu"
    heads = tiny_llama.heads["2"]
    prompts = [[3, 40, 50, 60], [3, 41, 42]]
    got = greedy_continuations(spread, prompts, 10, [2], 0, return_hidden=True)
    want = greedy_continuations(tiny_llama.model, prompts, 10, [2], 0, return_hidden=True)
    assert got[0] == want[0]
    for teacher_forced in (False, True):  # captured states, and a teacher-forced forward through the hooks
        a = head_ranks(spread, heads, prompts, got[0], 4, hidden=None if teacher_forced else got[1])[0]
        b = head_ranks(tiny_llama.model, heads, prompts, want[0], 4, hidden=None if teacher_forced else want[1])[0]
        assert all((x == y).all() for x, y in zip(a, b))


# ----------------------------------------------------------------------------------------------- train-heads

def test_train_heads_data_is_sharded_like_calibrate_and_the_last_process_trains(tiny_llama, tmp_path, monkeypatch):
    from workbench.runtime.heads import load_heads
    from workbench.train.distill import build_data, part_infos
    from workbench.train.medusa1 import TrainConfig, train_heads

    cfg = dict(prompts=PROMPTS, max_new_tokens=12, gen_batch=2, gen_dtype="float32", steps=20, batch_size=32,
               lr=1e-2, warmup=2, num_heads=3)
    model, work, out = str(tiny_llama.model_dir), tmp_path / "work", tmp_path / "heads"
    as_process(monkeypatch, 1, 2)  # the plan: 6 batches of 2 prompts; process 1 takes batches 3-5 ...
    first = train_heads(work, TrainConfig(tokens=60, **cfg), model, out, log_every=5)
    assert first == dict(trained=False, rank=1, num_processes=2, answer_tokens=first["answer_tokens"])
    assert not out.exists()
    ones = part_infos(work / "parts")
    assert {p.name for p, _ in ones} <= {f"part-{i:05d}.pt" for i in (3, 4, 5)}
    assert first["answer_tokens"] >= 30  # ... until it has its half of the 60 tokens asked for
    as_process(monkeypatch, 0, 2)
    summary = train_heads(work, TrainConfig(tokens=60, **cfg), model, out, log_every=5)
    assert summary["trained"] and summary["answer_tokens"] >= 60 and load_heads(out)[0].num_heads == 3
    infos = part_infos(work / "parts")
    assert {p.name for p, _ in infos} - {p.name for p, _ in ones} <= {f"part-{i:05d}.pt" for i in (0, 1, 2)}
    keys = [k for _, i in infos for k in i["prompt_keys"]]
    assert len(keys) == len(set(keys))  # no prompt answered twice
    # every part holds what one process generating the whole plan writes for that batch
    for var in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var)
    build_data(tmp_path / "ref", TrainConfig(tokens=10**6, **cfg), model, None)
    for p, _ in infos:
        got, ref = (torch.load(f, weights_only=True) for f in (p, tmp_path / "ref" / "parts" / p.name))
        assert all(torch.equal(got[k], ref[k]) for k in ("ids", "hidden", "seq")), p.name


def test_train_heads_refuses_a_work_folder_of_another_model(tiny_llama, tiny_qwen2, tmp_path):
    from workbench.train.distill import build_data
    from workbench.train.medusa1 import TrainConfig

    cfg = TrainConfig(prompts=PROMPTS[:4], tokens=10, max_new_tokens=6, gen_batch=4, gen_dtype="float32")
    build_data(tmp_path / "work", cfg, str(tiny_llama.model_dir), None)
    with pytest.raises(WorkbenchError, match=r"part-00000.pt holds answers of .*tiny_llama.*use another --work"):
        build_data(tmp_path / "work", replace(cfg, tokens=10**6), str(tiny_qwen2.model_dir), None)
