"""Hostile inputs (issue 36): for every subcommand and every kind (absurd sizes, hostile outputs, silent garbage,
odd types), exit 2 with one `error:` line, or a correct exit 0; nothing escapes main; no input's bytes change.

The corpus is tests/hostile_cases.py (also runnable as subprocesses against any checkout, for the before/after
table). Here every case runs in-process through workbench.cli.main; a case over 30 s counts as a hang. Property
tests (Hypothesis) cover the flag parsers and the format readers with generated values.
"""
from __future__ import annotations

import argparse
import io
import math
import sys
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hostile_cases as H  # noqa: E402

from workbench import WorkbenchError  # noqa: E402
from workbench.cli import main  # noqa: E402
from workbench.cli.shared import LIMITS, bounded, finite  # noqa: E402


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    e = H.build_env(root)
    import shutil

    shutil.copytree(e["in"], root / "pristine", symlinks=True)
    return e


def _restore(e):
    import shutil

    shutil.rmtree(e["in"])
    shutil.copytree(Path(e["root"]) / "pristine", e["in"], symlinks=True)


# the slower cases (a tiny model decodes, calibrates or trains to the end) run under -m slow only in a dev loop;
# CI runs them all
SLOW = ("calibrate|", "train-heads|", "sweep|", "decode|", "latency|", "eval-heads|")


def _params():
    out = []
    for c in H.CASES:
        slow = c[4] != "refuse" and c[2].startswith(SLOW)
        out.append(pytest.param(c, id=c[2], marks=[pytest.mark.slow] if slow else []))
    return out


@pytest.mark.parametrize("case", _params())
def test_hostile_case(case, env, tmp_path):
    r = H.run_case_inprocess(env, tmp_path / "out", case, limit=30.0)
    if r is None:
        pytest.skip("needs what this machine lacks (a device node to copy, an architecture)")
    if r["changed"]:
        _restore(env)
    assert r["wrong"] == "", (r["wrong"], r["argv"], r["last"])
    most = H.CPU_LIMITS.get(case[2])  # sizes refused before work proportional to them: seconds, not minutes
    assert most is None or r["cpu_seconds"] <= most, (r["cpu_seconds"], most, r["argv"])
    if r["rc"] == 2 and case[1] == "outputs" and "stdout" not in case[2]:
        left = [p for p in (tmp_path / "out").rglob("*") if p.is_file() and not p.is_symlink()]
        assert not left, f"a refused run wrote {left}"


@pytest.mark.unit
def test_the_corpus_covers_every_subcommand_and_kind():
    subs = {c[0] for c in H.CASES}
    assert subs >= {"tree show", "tree list", "tree buffers", "tree eval", "optimize", "export", "calibrate",
                    "decode", "latency", "plan", "sweep", "sweep-report", "train-heads"}
    kinds = {(c[0], c[1]) for c in H.CASES}
    for sub in subs - {"tree list", "tree eval"}:
        assert {k for s, k in kinds if s == sub} >= {"sizes", "outputs"} or sub in ("tree show",), sub
    assert len({c[2] for c in H.CASES}) == len(H.CASES) >= 300


# ----------------------------------------------------------------------------------------------- properties

@pytest.mark.unit
@settings(max_examples=200, deadline=None)
@given(limit=st.sampled_from(sorted(LIMITS)), value=st.one_of(
    st.integers(-(2 ** 70), 2 ** 70), st.sampled_from(["", "x", "1e3", "3.5", " 7 ", "1_000", "-0", "nan", "inf"])))
def test_an_integer_flag_is_in_range_or_one_clear_refusal(limit, value):
    parse = bounded(limit)
    high = LIMITS[limit][0]
    try:
        v = parse(str(value))
    except argparse.ArgumentTypeError as e:
        assert "\n" not in str(e) and f"1..{high}" in str(e)  # the message names the range
        return
    assert 1 <= v <= high


@pytest.mark.unit
@settings(max_examples=200, deadline=None)
@given(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6)))
def test_a_float_flag_is_finite_or_refused(value):
    try:
        v = finite(0, 1, open_low=True)(str(value))
    except argparse.ArgumentTypeError:
        return
    assert math.isfinite(v) and 0 < v <= 1


@pytest.mark.unit
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 10 ** 12),
                          st.sampled_from(["", "x", "1e400", "-1e400", "5e-324"])), min_size=3, max_size=3))
def test_a_latency_file_reads_to_finite_positive_seconds_or_is_refused(tmp_path_factory, cells):
    from workbench.measure.latency_file import latency_table, read_latency

    f = tmp_path_factory.mktemp("lat") / "l.csv"
    f.write_text("context,tokens,seconds\n16,1,0.01\n" + f"{cells[0]},{cells[1]},{cells[2]}\n")
    try:
        df = read_latency(f)
        table, _ = latency_table(df)
    except WorkbenchError as e:
        assert "\n" not in str(e)
        return
    ratios = [t / table[1] for t in table.values()]
    assert all(math.isfinite(r) and r > 0 for r in ratios)


@pytest.mark.unit
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(nodes=st.one_of(st.integers(-3, 2 ** 63), st.floats(allow_nan=True)),
       rate=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-2, 10)),
       batch=st.integers(-2, 2 ** 63))
def test_a_sweep_file_holds_counts_and_rates_or_is_refused(tmp_path_factory, nodes, rate, batch):
    from workbench.measure.sweep_file import SWEEP_COLUMNS, read_sweep

    row = {c: "" for c in SWEEP_COLUMNS}
    row.update(run="r", config="c", tree="t", kind="given", nodes=nodes, depth=1, batch_size=batch,
               tokens_per_step=rate, acceptance="greedy", temperature=0.0)
    f = tmp_path_factory.mktemp("sweep") / "s.csv"
    pd.DataFrame([row], columns=SWEEP_COLUMNS).to_csv(f, index=False)
    try:
        df = read_sweep(f)
    except WorkbenchError as e:
        assert "\n" not in str(e)
        return
    r = df.iloc[0]
    assert r["nodes"] >= 0 and r["nodes"] % 1 == 0 and r["batch_size"] >= 1 and r["tokens_per_step"] >= 1 - 1e-9


# ----------------------------------------------------------------------------------------------- EAGLE-1's reading

def _eagle1_rows(paths):
    """SafeAILab/EAGLE utils_c.py generate_tree_buffers' draft rows, re-enacted: per level, the nodes with
    children in (len, path) order; a node's row is value + TOPK * bias with bias counting parent changes among
    them. Returns {node with children: (row EAGLE-1 reads, row of its true parent)}."""
    order = sorted(paths, key=lambda x: (len(x), x))
    has_kids = {p[:-1] for p in paths}
    wc = [p for p in order if p in has_kids]
    out = {}
    for depth in range(2, max(map(len, paths))):
        level = [p for p in wc if len(p) == depth]
        prev = [p for p in wc if len(p) == depth - 1]
        bias, parent = 0, None
        for j, n in enumerate(level):
            if j and n[:-1] != parent:
                bias += 1
            parent = n[:-1]
            out[n] = (bias, prev.index(n[:-1]))
    return out


@st.composite
def trees(draw):
    paths = {(draw(st.integers(0, 3)),)}
    for _ in range(draw(st.integers(0, 14))):
        parent = draw(st.sampled_from(sorted(paths)))
        if len(parent) < 4:
            paths.add(parent + (draw(st.integers(0, 3)),))
    return sorted(paths)


@pytest.mark.unit
@settings(max_examples=200, deadline=None)
@given(trees())
def test_the_eagle1_warning_names_exactly_the_nodes_drafted_from_another_row(paths):
    from workbench.export.eagle import eagle1_misdrafted
    from workbench.trees.tree import load_tree

    rows = _eagle1_rows(paths)
    assert set(eagle1_misdrafted(load_tree([list(p) for p in paths]))) == {n for n, (a, b) in rows.items() if a != b}


@pytest.mark.unit
def test_the_issue_example_and_eagles_own_default_tree(capsys):
    assert main(["export", "[[0],[1],[0,0],[1,0],[1,0,0]]", "--format", "eagle"]) == 0
    err = capsys.readouterr().err
    assert "EAGLE-1's draft builder" in err and "[1, 0]" in err
    assert main(["export", "mc_sim_7b_63", "--format", "eagle"]) == 0  # the tree EAGLE-1 ships with reads right
    assert "draft builder" not in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------- stdout

@pytest.mark.unit
@pytest.mark.parametrize("stream", ["closed", "full", "broken-pipe"])
def test_results_that_cannot_reach_stdout_are_one_error_line(stream, capsys, monkeypatch):
    class Broken(io.StringIO):
        def write(self, s):
            raise BrokenPipeError(32, "Broken pipe")

    out = {"closed": None, "full": open("/dev/full", "w"), "broken-pipe": Broken()}[stream]
    capsys.readouterr()
    monkeypatch.setattr(sys, "stdout", out)
    rc = main(["tree", "buffers", "[[0], [1]]"])
    monkeypatch.undo()
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: cannot write the results to standard output"), err


# ----------------------------------------------------------------------------------------------- refusals come first

HEAVY = ("torch", "transformers", "matplotlib")


@pytest.mark.parametrize("argv, spared", [
    (["tree", "show", "[[0], [1]]", "--png", "/dev/full"], "matplotlib"),  # rendered, then failed to write
    (["sweep-report", "missing.csv", "--out", "/dev/full"], "torch"),  # reading a sweep imports torch
    (["latency", "--random-config", "tiny", "--out", "/dev/full"], "torch"),
])
def test_an_output_that_refuses_writes_is_refused_before_the_heavy_imports(argv, spared, tmp_path):
    """A refusal on the command line or its outputs costs the CLI's own start, not a library's import (seconds
    each on a busy machine): checked in a fresh interpreter by what it has imported when the error comes."""
    import json
    import os
    import stat
    import subprocess

    if not (os.path.exists("/dev/full") and stat.S_ISCHR(os.stat("/dev/full").st_mode)):
        pytest.skip("no /dev/full on this machine")
    code = ("import json, sys; from workbench.cli import main; rc = main(sys.argv[1:]); "
            f"print(json.dumps([rc, [m for m in {HEAVY!r} if m in sys.modules]]))")
    p = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                       env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1])))
    rc, imported = json.loads(p.stdout.splitlines()[-1])
    err = p.stderr.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: ") and "No space left" in err[0], p.stderr
    assert spared not in imported, imported


# ----------------------------------------------------------------------------------------------- warnings

def test_the_cli_shows_its_own_warnings_in_one_line_and_hides_other_libraries(capsys, monkeypatch):
    """Issue 52: one `warning: ...` line per workbench warning, however many lines its text has; another
    library's warning (torch.load's pickle-protocol note, deprecations) not at all, unless asked for with -W."""
    import warnings

    from workbench import warn
    from workbench.cli.shared import cli_warnings

    monkeypatch.setattr(sys, "warnoptions", [])
    with cli_warnings():
        warn("config says 7 heads\n  but the weights hold 3")
        warnings.warn("Detected pickle protocol 4 in the checkpoint", UserWarning)
        warnings.warn("old API", DeprecationWarning)
    assert capsys.readouterr().err.splitlines() == ["warning: config says 7 heads but the weights hold 3"]
    monkeypatch.setattr(sys, "warnoptions", ["default"])
    with cli_warnings():
        warnings.warn("Detected pickle protocol 4\nin the checkpoint", UserWarning)
    assert capsys.readouterr().err.splitlines() == ["warning: UserWarning: Detected pickle protocol 4 in the checkpoint"]


def test_a_refusal_after_a_warning_is_one_error_line_holding_the_warning(env, tmp_path, capsys):
    """The issue's case: a heads folder whose config names other head counts (a warning) and whose weight is 3-D
    (the refusal): issue 71 folds the warning into the error (runtime.heads reads under workbench.warnings_held),
    one `error:` line, no `warning:` line about a file that is refused anyway."""
    rc = main(["decode", "--model", env["model"], "--heads", env["h_3d_cfg"], "--tree", "[[0]]", "--prompt-ids", "5",
               "--max-new-tokens", "2", "--device", "cpu"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith("error: ") and "config says 7 heads" in err[0] and "(also: " in err[0], err
