"""Soak: the long resumable commands (calibrate, train-heads, sweep, latency in both modes, eval-heads,
vllm-check) killed with SIGKILL at several random points in a row, each time resumed, end with the same files as
one uninterrupted run: byte for byte where the output holds no timings (calibrate's folder, train-heads' heads
file), field for field on everything deterministic where it does (a sweep's deterministic columns; latency's
model/device/dtype/batch/context/tokens/repeats and setting less its load; eval-heads' JSON and table less
live_medusa1.speedup and live_medusa2.speedup; vllm-check's JSON less its timing fields). For the commands that
keep their finished pieces in an work.WorkState (latency's points, eval-heads' phases, vllm-check's engines and
decoder parts), the pieces on disk at the last kill end in the output unchanged, timings included.

Each kill point is random (a seed in every message, WORKBENCH_FAULT_SEED reproduces it); test_faults.py covers
one kill with the lock refusal, this file several kills in one run's life. The kill takes the run's whole process
group (vllm-check's vLLM worker with it). The state handling itself (what is kept, what a rerun skips, other
settings starting over) is tested here without any kill, and for vllm-check without vLLM.
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
from workbench.core.io import work_folder
from workbench.core.provenance import without_load
from workbench.core.work import piece_files

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


def _start(argv) -> subprocess.Popen:
    """The real CLI in a process group of its own (a kill takes any worker it started along)."""
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return subprocess.Popen([sys.executable, "-m", "workbench.cli", *argv], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)


def _kill_and_resume(argv, progress, rng, what, capsys, before_resume=None) -> None:
    """Start, freeze after progress() grows by a random step, SIGKILL its process group; KILLS times; then
    before_resume() and finish in-process."""
    for k in range(KILLS):
        start = progress()
        proc = _start(argv)
        step = rng.randrange(1, 3)

        def alive() -> bool:
            if proc.poll() is not None:  # finished before this kill point: the rest of the soak is moot
                return False
            return True
        try:
            freeze_when(proc.pid, lambda: progress() >= start + step, alive, rng, f"{what} kill {k + 1}")
        except AssertionError:
            if proc.poll() is None:  # no progress in time (frozen, not finished)
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise
            err = proc.stderr.read().decode(errors="replace")[-1500:]
            proc.wait()
            proc.stderr.close()
            assert proc.returncode == 0, f"{what}: kill {k + 1}: the run failed ({proc.returncode}): {err}"
            break
        os.killpg(proc.pid, signal.SIGKILL)  # a worker it started dies with it
        proc.wait()
        proc.stderr.close()
    if before_resume is not None:
        before_resume()
    assert main(argv) == 0, what
    capsys.readouterr()


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.soak
def test_calibrate_killed_again_and_again_ends_byte_for_byte(tiny_llama, prompts, tmp_path, capsys, request):
    rng, what = _seed(request)

    def argv(out):
        return ["calibrate", "--model", str(tiny_llama.model_dir), "--heads", str(tiny_llama.heads_dirs["2"]),
                "--prompts", str(prompts), "--max-new-tokens", "16", "--topk", "3", "--budgets", "3", "--gen-batch",
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


@pytest.mark.soak
def test_train_heads_killed_again_and_again_ends_byte_for_byte(tiny_llama, prompts, tmp_path, capsys, request):
    rng, what = _seed(request)

    def argv(name):
        return ["train-heads", "--model", str(tiny_llama.model_dir), "--prompts", str(prompts), "--tokens", "300",
                "--max-new-tokens", "16", "--gen-batch", "1", "--gen-dtype", "float32", "--num-heads", "2", "--steps",
                "60", "--positions-per-step", "16", "--heads-lr", "0.01", "--work", str(tmp_path / f"work-{name}"), "--out",
                str(tmp_path / f"heads-{name}")]
    work = tmp_path / "work-killed"
    _kill_and_resume(argv("killed"), lambda: len(list((work / "parts").glob("part-*.pt")))
                     if (work / "parts").is_dir() else 0, rng, what, capsys)
    assert main(argv("whole")) == 0
    capsys.readouterr()
    f = "medusa_lm_head.safetensors"
    assert (tmp_path / "heads-killed" / f).read_bytes() == (tmp_path / "heads-whole" / f).read_bytes(), what


@pytest.mark.soak
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
    cols = ["config", "tree", "kind", "nodes", "depth", "acceptance", "temperature", "tokens_per_step",
            "exact_match", "num_prompts", "new_tokens", "steps"]
    a, b = (pd.read_csv(f)[cols] for f in (out, tmp_path / "whole.csv"))
    pd.testing.assert_frame_equal(a, b, obj=what)


# ----------------------------------------------------------------------------------------------- work state

def _pieces(out: Path) -> dict[str, bytes]:
    """The finished pieces a run keeps beside `out` (work.WorkState), by name; not a piece being written (a dot
    file) nor the settings."""
    folder = work_folder(out)
    return {p.stem: p.read_bytes() for p in piece_files(folder)} if folder.is_dir() else {}


def _piece_value(data: bytes):
    return json.loads(data)["value"]


def _soak_with_pieces(killed: list[str], whole: list[str], out: Path, rng, what, capsys) -> dict[str, bytes]:
    """A command keeping work.WorkState pieces beside `out`: `killed` killed at random pieces and resumed to its end,
    then `whole` run unbroken; returns the pieces kept at the last kill (measured before it, never redone)."""
    kept = {}
    _kill_and_resume(killed, lambda: len(_pieces(out)), rng, what, capsys,
                     before_resume=lambda: kept.update(_pieces(out)))
    assert main(whole) == 0, what
    capsys.readouterr()
    assert not work_folder(out).exists(), f"{what}: the work folder outlived the run"
    assert kept, f"{what}: nothing was kept at the last kill"
    return kept


@pytest.mark.soak
@pytest.mark.parametrize("mode", ["decoder-step", "verify"])
def test_latency_killed_again_and_again_keeps_its_points(tiny_llama, prompts, tmp_path, capsys, request, mode):
    rng, what = _seed(request)
    flags = ["--heads", str(tiny_llama.heads_dirs["2"]), "--prompts", str(prompts), "--limit", "4", "--sizes",
             "1,2,3", "--batch-sizes", "1,2,3,4,5,6,7", "--max-new-tokens", "8"] if mode == "decoder-step" else \
        ["--sizes", "1,2,4", "--context", "8,16,32,64", "--batch-sizes", "1,2"]

    def argv(out):
        return ["latency", "--model", str(tiny_llama.model_dir), "--mode", mode, *flags, "--repeats", "2",
                "--warmup", "1", "--device", "cpu", "--out", str(out)]
    out = tmp_path / "killed.csv"
    kept = _soak_with_pieces(argv(out), argv(tmp_path / "whole.csv"), out, rng, what, capsys)
    assert not (tmp_path / "whole.csv.work").exists(), what
    a, b = (pd.read_csv(f) for f in (out, tmp_path / "whole.csv"))
    assert list(a.columns) == list(b.columns), what
    cols = ["model", "device", "dtype", "batch", "context", "tokens", "repeats"]
    pd.testing.assert_frame_equal(a[cols], b[cols], obj=what)
    no_load = lambda cells: [without_load(json.loads(c)) for c in cells]  # noqa: E731
    assert no_load(a["setting"]) == no_load(b["setting"]), what
    assert (a["seconds"] > 0).all() and a["relative"].notna().all(), what
    # every point measured before the last kill is in the CSV as it was measured, timings and setting included
    for name, data in kept.items():
        point = _piece_value(data)
        rows = point["rows"] if mode == "decoder-step" else point
        for r in rows:
            got = a[(a["batch"] == r["batch"]) & (a["tokens"] == r["tokens"])]
            if mode == "verify":
                got = got[got["context"] == r["context"]]
            assert len(got) == 1, (what, name, r)
            got = got.iloc[0]
            for k, v in r.items():
                assert got[k] == v or (v is None and pd.isna(got[k])), (what, name, k, got[k], v)


@pytest.mark.soak
def test_latency_rerun_with_other_settings_starts_over(tiny_llama, tmp_path, capsys, request):
    """Points kept by a killed run never mix with a rerun's of other flags: one note line, then a fresh CSV."""
    rng, what = _seed(request)
    out = tmp_path / "l.csv"

    def argv(repeats):
        return ["latency", "--model", str(tiny_llama.model_dir), "--mode", "verify", "--sizes", "1,2", "--context",
                "8,16,32", "--repeats", repeats, "--warmup", "0", "--device", "cpu", "--out", str(out)]
    proc = _start(argv("2"))
    freeze_when(proc.pid, lambda: len(_pieces(out)) >= 1, lambda: proc.poll() is None, rng, what)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stderr.close()
    assert _pieces(out), what
    folder = out.with_name("l.csv.work")
    kept = sorted(p.name for p in folder.iterdir())
    assert main(argv("3")) == 0
    err = capsys.readouterr().err
    assert "note: " in err and "repeats: 2 -> 3" in err and "starting over" in err and "error:" not in err, \
        f"{what}; work folder before the rerun: {kept}; stderr: {err[-600:]}"
    df = pd.read_csv(out)
    assert len(df) == 6 and (df["repeats"] == 3).all() and not _pieces(out), what


@pytest.mark.soak
def test_eval_heads_killed_again_and_again_ends_with_the_same_result(tiny_llama, tmp_path, capsys, request):
    """Medusa-1: the tiny model with its format-2 heads; 'Medusa-2': the Medusa-layout folder of the same backbone
    with other heads (a folder eval-heads reads as any). Timing fields: live_medusa1.speedup, live_medusa2.speedup
    (and the table's speedup line)."""
    rng, what = _seed(request)
    f = tmp_path / "prompts.jsonl"
    f.write_text("".join(json.dumps({"id": f"q{i}", "instruction": f"Name a colour, number {i}."}) + "\n"
                         for i in range(24)))

    def argv(name):
        return ["eval-heads", "--model", str(tiny_llama.model_dir), "--heads", str(tiny_llama.heads_dirs["2"]),
                "--medusa2", str(tiny_llama.heads_dirs["3"]), "--prompts", str(f), "--holdout", "0.5", "--limit",
                "5", "--max-new-tokens", "12", "--topk", "3", "--tree", "[[0],[1],[0,0],[0,0,0]]", "--gen-batch",
                "2", "--device", "cpu", "--out", str(tmp_path / f"{name}.json"), "--table", str(tmp_path / f"{name}.md")]
    kept = _soak_with_pieces(argv("killed"), argv("whole"), tmp_path / "killed.json", rng, what, capsys)
    a, b = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("killed", "whole"))
    for phase, field in {"medusa1-topk": "medusa1_topk", "medusa2-topk": "medusa2_topk", "drift": "drift",
                         "live-medusa1": "live_medusa1", "live-medusa2": "live_medusa2"}.items():
        if phase in kept:  # finished before the last kill: kept as it was, its speedup included
            assert a[field] == _piece_value(kept[phase]), (what, phase)

    def timeless(r):
        return {k: ({x: y for x, y in v.items() if x != "speedup"} if k.startswith("live_medusa") else v)
                for k, v in r.items()}
    assert timeless(a) == timeless(b), what
    assert a["live_medusa1"]["identical_to_greedy"] == 1.0 and a["drift"]["top1_agreement"] == 1.0, what
    table = lambda n: [line for line in (tmp_path / f"{n}.md").read_text().splitlines()  # noqa: E731
                       if not line.startswith("| speedup")]
    assert table("killed") == table("whole"), what


VLLM_PY = os.environ.get("WORKBENCH_VLLM_PYTHON")


@pytest.mark.soak
@pytest.mark.vllm
@pytest.mark.slow  # the demo model; six minutes of real vLLM restarts
@pytest.mark.skipif(not VLLM_PY or not Path(VLLM_PY).is_file(),
                    reason="no vLLM interpreter: set WORKBENCH_VLLM_PYTHON (.ci/run builds one; "
                           "docs/vllm.md has the one-line setup)")
def test_vllm_check_killed_again_and_again_ends_with_the_same_result(tmp_path, capsys, request):
    """The demo model and heads, four prompts, K = 1, 2, batch 1 to 4: three vLLM engines side by side, a part kept
    per batch size, and three parts of our decoder: seven pieces, more than three kills of up to two pieces each
    can use up (a run that finishes between kills keeps nothing to check)."""
    rng, what = _seed(request)
    calibration = REPO / "calibration" / "smollm2-135m-instruct-alpaca-eval"
    f = tmp_path / "prompts.jsonl"
    f.write_text("".join(json.dumps({"id": f"q{i}", "instruction": p}) + "\n" for i, p in enumerate(PROMPTS[:4])))

    def argv(name):
        return ["vllm-check", "--vllm-python", VLLM_PY, "--calibration", str(calibration), "--prompts", str(f),
                "--k", "1,2", "--batch-sizes", "1,2,3,4", "--max-new-tokens", "8", "--repeats", "1",
                "--vllm-eager", "--no-compile", "--out", str(tmp_path / f"{name}.json")]  # both eager: each restart
    # starts in seconds (compiling would be paid again in every restarted process)
    kept = _soak_with_pieces(argv("killed"), argv("whole"), tmp_path / "killed.json", rng, what, capsys)
    a, b = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("killed", "whole"))
    timing = ("vllm_startup_s", "seconds", "load_average", "note", "speed", "plain_step")
    assert {k: v for k, v in a.items() if k not in timing} == {k: v for k, v in b.items() if k not in timing}, what
    assert [(s["k"], s["batch_size"]) for s in a["speed"]] == [(s["k"], s["batch_size"]) for s in b["speed"]], what
    if "vllm-batch-1" in kept:  # a batch size finished before the last kill is the one kept
        assert a["vllm_startup_s"] == [e["startup_s"] for e in _piece_value(kept["vllm-batch-1"])["engines"]], what


@pytest.fixture
def cli_channel():
    """The library's notes shown as the CLI shows them (workbench.note -> cli.shared.cli_warnings -> stderr)."""
    from workbench.cli.shared import cli_warnings

    with cli_warnings():
        yield


@pytest.mark.unit
def test_work_state_keeps_pieces_and_starts_over_on_other_settings(tmp_path, capsys, cli_channel):
    from workbench.core.work import WorkState, remove_work

    out = tmp_path / "sub" / "result.csv"
    s = WorkState(out, {"sizes": [1, 2]})
    assert s.get("a") is None and not (tmp_path / "sub").exists()  # nothing written before the first piece
    calls = []
    assert s.piece("a", lambda: calls.append(1) or {"t": 0.1 + 0.2, 3: (1, 2)}) == {"t": 0.1 + 0.2, "3": [1, 2]}
    assert (tmp_path / "sub" / "result.csv.work" / "a.json").is_file()
    again = WorkState(out, {"sizes": [1, 2]})  # the same command rerun
    assert "resuming: 1 finished piece(s)" in capsys.readouterr().err
    assert again.piece("a", lambda: calls.append(2)) == {"t": 0.1 + 0.2, "3": [1, 2]} and calls == [1]
    other = WorkState(out, {"sizes": [1, 3]})  # other settings: nothing kept counts, the folder starts over
    assert "sizes: [1, 2] -> [1, 3]" in capsys.readouterr().err and other.get("a") is None
    other.put("b", 1)
    assert sorted(p.name for p in (tmp_path / "sub" / "result.csv.work").iterdir()) == ["b.json", "settings.json"]
    remove_work(out)
    assert not (tmp_path / "sub" / "result.csv.work").exists()
    memory = WorkState(None, {})  # results on stdout: pieces in memory only
    memory.put("a", 1)
    assert memory.get("a") == 1 and WorkState("/dev/null", {}).folder is None


@pytest.mark.unit
def test_work_state_ignores_a_file_killed_while_being_written(tmp_path, capsys, cli_channel):
    """A kill inside an atomic write leaves a dot file: never a piece, never counted, never a reason to refuse."""
    from workbench.core.work import WorkState

    out = tmp_path / "r.csv"
    folder = tmp_path / "r.csv.work"
    folder.mkdir()
    (folder / ".settings.json.123.tmp.json").write_text('{"sett')  # killed during the first write
    s = WorkState(out, {"k": 1})
    assert capsys.readouterr().err == "" and s.get("a") is None
    s.put("a", 1)
    (folder / ".b.json.124.tmp.json").write_text('{"val')  # killed while writing the second piece
    again = WorkState(out, {"k": 1})
    assert "resuming: 1 finished piece(s)" in capsys.readouterr().err
    assert again.get("a") == 1 and again.get("b") is None


@pytest.mark.unit
def test_work_state_refuses_a_folder_it_did_not_write(tmp_path):
    from workbench import WorkbenchError
    from workbench.core.work import WorkState

    (tmp_path / "r.json.work").mkdir()
    (tmp_path / "r.json.work" / "mine.txt").write_text("a user's file")
    with pytest.raises(WorkbenchError, match="no settings.json"):
        WorkState(tmp_path / "r.json", {})
    assert (tmp_path / "r.json.work" / "mine.txt").read_text() == "a user's file"


STANDIN = '''#!{python}
"""Stands in for vLLM's worker (the protocol of workbench/measure/vllm_worker.py): logs the batch sizes it was asked
for and answers each with every engine's run naming the engine and the batch size; with STANDIN_DIE_AT=B it dies
while running batch size B."""
import json, os, sys
if sys.argv[1:2] == ["-c"]:  # the interpreter check's question: is vLLM there?
    print("vllm")
    sys.exit(0)
req = json.loads(sys.stdin.read())
with open(os.environ["STANDIN_LOG"], "a") as f:
    f.write(json.dumps(req["batch_sizes"]) + "\\n")
for b in req["batch_sizes"]:
    if str(b) == os.environ.get("STANDIN_DIE_AT"):
        sys.exit(1)
    print("vLLM's own log line", flush=True)
    print(json.dumps({{"event": "batch", "batch_size": b, "engines": [
        {{"vllm_version": "stand-in", "startup_s": 1.0, "run": {{"batch_size": b, "spec": spec}}}}
        for spec in req["engines"]]}}), flush=True)
print(json.dumps({{"event": "done"}}), flush=True)
'''


def test_vllm_check_keeps_finished_batch_sizes_and_runs_only_the_rest(tmp_path, monkeypatch):
    """Without vLLM: a worker killed during its third batch size leaves the first two kept; the rerun asks the
    worker for the other two only and returns every engine's runs at all four in order; other settings start over."""
    from workbench import WorkbenchError
    from workbench.core.work import WorkState
    from workbench.measure.vllm_runner import engine_results

    py = tmp_path / "python"
    py.write_text(STANDIN.format(python=sys.executable))
    py.chmod(0o755)
    log = tmp_path / "asked.jsonl"
    monkeypatch.setenv("STANDIN_LOG", str(log))
    engines = [None] + [{"method": "medusa", "num_speculative_tokens": k} for k in (1, 2)]
    request = {"engines": engines, "prompts": [[1, 2]], "batch_sizes": [1, 2, 4, 8]}
    out, settings = tmp_path / "check.json", {"model": "m", "k": [1, 2]}
    monkeypatch.setenv("STANDIN_DIE_AT", "4")
    with pytest.raises(WorkbenchError, match="vLLM failed"):
        engine_results(str(py), request, WorkState(out, settings), lambda text: None)
    assert sorted(_pieces(out)) == ["vllm-batch-1", "vllm-batch-2"]
    monkeypatch.delenv("STANDIN_DIE_AT")
    said = []
    res = engine_results(str(py), request, WorkState(out, settings), said.append)
    asked = [json.loads(line) for line in log.read_text().splitlines()]
    assert asked == [[1, 2, 4, 8], [4, 8]] and "2 of 4 batch sizes finished earlier" in said[0]
    assert [r["engine"] for r in res] == [0, 1, 2] and [r["vllm_version"] for r in res] == ["stand-in"] * 3
    assert [[(run["batch_size"], run["spec"]) for run in r["runs"]] for r in res] == \
        [[(b, spec) for b in (1, 2, 4, 8)] for spec in engines]
    engine_results(str(py), request, WorkState(out, dict(settings, k=[1])), lambda text: None)
    assert json.loads(log.read_text().splitlines()[-1]) == [1, 2, 4, 8]


def test_our_decoder_parts_are_taken_from_the_state(tiny_llama, tmp_path):
    """vllm-check's own decoding: every part is kept; a rerun takes a kept part instead of decoding it again
    (a part changed on disk comes back as changed) and decodes the missing ones as before."""
    from workbench.core.work import WorkState
    from workbench.runtime.generation import prepare_prompt
    from workbench.export.vllm_check import ours

    tok, heads = tiny_llama.tokenizer, tiny_llama.heads["2"]
    ids = [prepare_prompt(tok, f"Count to {i}.") for i in range(3)]
    out = tmp_path / "check.json"

    def run():
        return ours(tiny_llama.model, heads, tok, ids, [1, 2], 1, 8, [2], lambda text: None, WorkState(out, {}))
    first = run()
    assert sorted(_pieces(out)) == ["ours-k1", "ours-k2", "ours-plain"]
    assert first[1]["outputs"] == first["plain"] == first[2]["outputs"]  # greedy Medusa is lossless
    WorkState(out, {}).put("ours-k1", dict(first[1], steps=-1))
    (out.with_name("check.json.work") / "ours-k2.json").unlink()
    second = run()
    assert second[1]["steps"] == -1 and second[2] == first[2] and second["plain"] == first["plain"]


BETWEEN = '''#!{python}
"""Stands in for vLLM's worker in mode "generate" with "between": after each pass of every engine it says
{{"event": "pass"}} and waits for a line before its next pass; logs each pass to STANDIN_LOG; with STANDIN_DIE_AT=B
it dies before batch size B."""
import json, os, sys
req = json.loads(sys.stdin.readline())
assert req["between"] is True
log = open(os.environ["STANDIN_LOG"], "a")
for b in req["batch_sizes"]:
    if str(b) == os.environ.get("STANDIN_DIE_AT"):
        sys.exit(1)
    for i in range(req["repeats"]):
        log.write(f"vllm {{b}} {{i}}\\n"); log.flush()
        print(json.dumps({{"event": "pass", "batch_size": b, "pass": i}}), flush=True)
        assert sys.stdin.readline() == "\\n"  # the orchestrator's own pass ran
    print(json.dumps({{"event": "batch", "batch_size": b, "engines": [
        {{"vllm_version": "stand-in", "startup_s": 1.0, "run": {{"batch_size": b}}}} for _ in req["engines"]]}}),
        flush=True)
print(json.dumps({{"event": "done"}}), flush=True)
'''


def test_our_passes_run_between_vllms_and_are_kept_with_their_batch_size(tmp_path, monkeypatch):
    """vllm-check's side-by-side passes: the worker waits after each of its passes while ours runs, so the two
    alternate; ours are kept with their batch size, and a rerun after a kill runs ours only where vLLM runs again."""
    from workbench import WorkbenchError
    from workbench.core.work import WorkState
    from workbench.measure.vllm_runner import between_results, engine_results

    py = tmp_path / "python"
    py.write_text(BETWEEN.format(python=sys.executable))
    py.chmod(0o755)
    log = tmp_path / "order.txt"
    monkeypatch.setenv("STANDIN_LOG", str(log))
    request = {"mode": "generate", "engines": [None, {"num_speculative_tokens": 1}], "prompts": [[1]],
               "batch_sizes": [1, 2], "repeats": 2}
    out, settings = tmp_path / "check.json", {"model": "m"}

    def ours(b: int, i: int) -> dict:
        with log.open("a") as f:
            f.write(f"ours {b} {i}\n")
        return {"batch": b, "pass": i}

    monkeypatch.setenv("STANDIN_DIE_AT", "2")
    with pytest.raises(WorkbenchError, match="vLLM failed"):
        engine_results(str(py), request, WorkState(out, settings), lambda text: None, ours)
    assert log.read_text().split("\n")[:-1] == ["vllm 1 0", "ours 1 0", "vllm 1 1", "ours 1 1"]
    monkeypatch.delenv("STANDIN_DIE_AT")
    log.write_text("")
    engine_results(str(py), request, WorkState(out, settings), lambda text: None, ours)
    assert log.read_text().split("\n")[:-1] == ["vllm 2 0", "ours 2 0", "vllm 2 1", "ours 2 1"]
    assert between_results(WorkState(out, settings), [1, 2]) == {
        b: [{"batch": b, "pass": i} for i in (0, 1)] for b in (1, 2)}
