"""bench/first_run.py: a new user's first run of each command beside its plain twin (plain linears, nothing compiled).

The committed results (bench/results/first-run*.json) measured on a quiet machine hold every command within 1.1x of
its plain twin at both loads; a file measured on a busy machine says so in its setting and its name (*-loaded.json:
its times are not the machine's, and the bar is not applied to them). The bench's plumbing runs here on two
torch-free commands."""
from __future__ import annotations

import importlib.util
import json
import statistics
import subprocess
import sys

import pytest

from workbench import REPO_ROOT
from workbench.core.provenance import loaded

RESULTS = sorted((REPO_ROOT / "bench" / "results").glob("first-run*.json"))
BAR = 1.10
QUIET = 0.5  # cores other processes may have kept busy on average during the idle part (the busy loop aside)


def quiet(report: dict) -> bool:
    """What else ran while each load was timed (`other_cores_during`, measured from /proc/stat): nothing at idle,
    the busy loop's one core and nothing more at one-core-busy. The load average before a piece (the setting's) is
    what ran in the minute before it, not during: it decides only where that measurement is missing."""
    s = report["setting"]
    during = s.get("other_cores_during") or {}
    if "idle" not in during:
        return not loaded(s)
    busy = during.get("one-core-busy")
    return during["idle"]["cores"] < QUIET and (busy is None or busy["cores"] < 1 + QUIET)


def reports() -> list[tuple[str, dict]]:
    return [(f.name, json.loads(f.read_text())) for f in RESULTS]


@pytest.mark.unit
def test_committed_results_say_their_setting_and_a_busy_one_is_named_so():
    for name, report in reports():
        assert report["bench"] == "first-run" and report["complete"] and report["rows"], name
        keys = {"cpu", "vector", "cores", "torch", "load_average", "flags", "other_cores_during"}
        assert keys <= set(report["setting"]), name
        if not quiet(report):
            assert "loaded" in name, f"{name}: measured on a busy machine (its setting says so); name it *-loaded.json"


@pytest.mark.unit
def test_every_command_by_default_is_within_1_1x_of_its_plain_twin():
    """Medians recomputed from the runs; both loads of every command the bench knows; every quiet result file."""
    quiet_ones = [(name, report) for name, report in reports() if quiet(report)]
    if not quiet_ones:
        pytest.skip("no first-run result from a quiet machine is committed: run `python bench/first_run.py` on an idle "
                    "machine and commit bench/results/first-run.json")
    spec = importlib.util.spec_from_file_location("bench_first_run", REPO_ROOT / "bench" / "first_run.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.BAR == BAR
    for name, report in quiet_ones:
        slower = []
        for row in report["rows"]:
            d, p = statistics.median(row["default_s"]), statistics.median(row["plain_s"])
            if d > BAR * p:
                slower.append(f"{row['command']} ({row['load']}): {d:.1f} s against {p:.1f} s plain = {d / p:.2f}x")
        assert not slower, f"{name}: default more than {BAR}x its plain twin: {slower}"
        assert {(r["command"], r["load"]) for r in report["rows"]} == {(c, x) for c in bench.COMMANDS
                                                                       for x in bench.LOADS}, name


def test_the_bench_runs_pairs_at_both_loads_and_refuses_bad_flags_in_one_line(tmp_path):
    """Two torch-free commands (seconds; export reads the tour's plan, made first): a pair of each at both loads,
    the setting, the table; then bad flags."""
    out = tmp_path / "first-run.json"
    bench = [sys.executable, str(REPO_ROOT / "bench" / "first_run.py")]
    run = subprocess.run([*bench, "--quick", "--commands", "tree-show,export-vllm", "--out", str(out)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(out.read_text())
    assert [(r["command"], r["load"]) for r in report["rows"]] == [
        ("tree-show", "idle"), ("export-vllm", "idle"),
        ("tree-show", "one-core-busy"), ("export-vllm", "one-core-busy")]
    for r in report["rows"]:
        assert len(r["default_s"]) == len(r["plain_s"]) == 1 and min(r["default_s"] + r["plain_s"]) > 0
        median = statistics.median
        assert r["ratio"] == pytest.approx(median(r["default_s"]) / median(r["plain_s"]), abs=2e-3)
    s = report["setting"]
    assert s["cpu"] and s["cores"] and s["flags"][:3] == ["--quick", "--commands", "tree-show,export-vllm"]
    assert set(s["other_cores_during"]) == {"idle", "one-core-busy"}
    assert s["other_cores_during"]["one-core-busy"]["cores"] > 0.5  # the pinned busy loop ran
    assert report["complete"] is True
    assert "| tree-show | one-core-busy |" in run.stdout
    for flags, what in ((["--commands", "calibrate,nope"], "--commands"), (["--loads", "busy"], "--loads"),
                        (["--rounds", "0"], "--rounds")):
        bad = subprocess.run([*bench, *flags, "--out", str(tmp_path / "x.json")], capture_output=True, text=True,
                             timeout=120)
        errors = [line for line in bad.stderr.splitlines() if "error:" in line]
        assert bad.returncode == 2 and len(errors) == 1 and what in errors[0] and "Traceback" not in bad.stderr, \
            bad.stderr
        assert not (tmp_path / "x.json").exists()


def test_the_bench_finishes_in_pieces_with_resume(tmp_path):
    """The idle half, then the one-core-busy half into the same file (--resume): the first piece's pairs are kept,
    not measured again, and the file is complete once every command has both loads; a file measured with other
    flags is refused in one line and left as it was."""
    out = tmp_path / "first-run.json"
    bench = [sys.executable, str(REPO_ROOT / "bench" / "first_run.py"), "--quick", "--commands", "tree-show"]
    run = subprocess.run([*bench, "--loads", "idle", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    half = json.loads(out.read_text())
    assert half["complete"] is False and [(r["command"], r["load"]) for r in half["rows"]] == [("tree-show", "idle")]
    run = subprocess.run([*bench, "--loads", "idle,one-core-busy", "--resume", "--out", str(out)], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    whole = json.loads(out.read_text())
    assert whole["complete"] is True and whole["rows"][0] == half["rows"][0]  # kept, not measured again
    assert [(r["command"], r["load"]) for r in whole["rows"]] == [("tree-show", "idle"), ("tree-show", "one-core-busy")]
    s = whole["setting"]
    assert [p["loads"] for p in s["pieces"]] == [["idle"], ["idle", "one-core-busy"]]
    assert set(s["other_cores_during"]) == {"idle", "one-core-busy"}
    bad = subprocess.run([*bench[:2], "--commands", "tree-show", "--resume", "--out", str(out)], capture_output=True,
                         text=True, timeout=120)
    errors = [line for line in bad.stderr.splitlines() if "error:" in line]
    assert bad.returncode == 2 and len(errors) == 1 and "--rounds" in errors[0] and "Traceback" not in bad.stderr
    assert json.loads(out.read_text()) == whole
