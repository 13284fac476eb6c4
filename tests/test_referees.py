"""The referee tiers never miss a run silently (tests/support/referees.py): pytest run on a small generated test file
with the plugin as its conftest prints one line per skipped tier with the reason, and one line naming the referee
command when a -m leaves tiers out, under pytest-xdist (the README's default) as without it. And the README's test
command leaves the tiers out by their markers while a -m on the command line replaces that selection."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from workbench import REPO_ROOT
from support.referees import COMMAND

TESTS = '''
import pytest

@pytest.mark.vllm
@pytest.mark.soak
@pytest.mark.skipif(True, reason="no vLLM interpreter: set WORKBENCH_VLLM_PYTHON")
def test_vllm_soak(): pass

@pytest.mark.vllm
@pytest.mark.skipif(True, reason="no vLLM interpreter: set WORKBENCH_VLLM_PYTHON")
def test_vllm(): pass

@pytest.fixture
def browser():
    pytest.skip("/usr/bin/chromium is absent")

@pytest.mark.browser
def test_page(browser): pass

@pytest.mark.soak
def test_killed(): pass

def test_plain(): pass
'''


def run(folder: Path, *args: str) -> str:
    (folder / "pytest.ini").write_text("[pytest]\nmarkers =\n    vllm\n    browser\n    soak\n")
    (folder / "conftest.py").write_text("from support.referees import (pytest_configure, pytest_deselected, "
                                        "pytest_sessionfinish, pytest_terminal_summary, pytest_testnodedown)\n")
    (folder / "test_tiers.py").write_text(TESTS)
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT / "tests"))
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=folder,
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


def test_skipped_referees_say_why_one_line_per_tier(tmp_path):
    text = run(tmp_path, "-n", "0")
    lines = [line for line in text.splitlines() if "skipped:" in line or "did not run" in line]
    assert lines == [
        "2 vLLM tests skipped: no vLLM interpreter: set WORKBENCH_VLLM_PYTHON; see the README's referee command",
        "1 browser tests skipped: /usr/bin/chromium is absent; see the README's referee command"], text
    assert re.search(r"^2 passed, 3 skipped", text, re.M), text


@pytest.mark.parametrize("workers", ["0", "2"])
def test_referees_left_out_by_a_mark_expression_name_the_command_that_runs_them(tmp_path, workers):
    text = run(tmp_path, "-n", workers, "-m", "not vllm and not browser and not soak")
    lines = [line for line in text.splitlines() if "skipped:" in line or "did not run" in line]
    assert lines == ["4 referee tests did not run (2 vLLM, 1 browser, 1 kill-and-resume: left out by "
                     f"-m 'not vllm and not browser and not soak'); {COMMAND} runs them (README)"], text


def test_the_referee_command_prints_no_left_out_line(tmp_path):
    text = run(tmp_path, "-n", "0", "-m", "vllm or browser or soak")
    assert "did not run" not in text and "2 vLLM tests skipped" in text, text
    assert re.search(r"^1 passed, 3 skipped, 1 deselected", text, re.M), text


COLLECT = """
import sys, pytest
class Count:
    def pytest_collection_finish(self, session):
        print("collected", len(session.items))
for m in sys.argv[2:]:
    pytest.main(["-q", "-p", "no:cacheprovider", "--collect-only", "-n", "0", *sys.argv[1].split(","),
                 *(["-m", m] if m != "default" else [])], plugins=[Count()])
"""


def test_the_default_leaves_out_the_referees_by_marker_and_a_command_line_m_replaces_it():
    """Three collections (no test runs, one process) of three files holding all three tiers and other tests, with
    pyproject's addopts: the default, the referee command's -m, and -m '' (everything)."""
    files = "tests/test_soak.py,tests/test_vllm_e2e.py,tests/test_browser_inputs.py"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", COLLECT, files, "default", "vllm or browser or soak", ""],
                         cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    counts = [int(n) for n in re.findall(r"^collected (\d+)$", out.stdout, re.M)]
    assert len(counts) == 3, out.stdout[-2000:] + out.stderr[-2000:]
    default, referees, everything = counts
    assert 0 < default < everything and 0 < referees < everything and default + referees == everything
    # the default's summary line counts these files' referees: vLLM 2 + the vLLM soak, browser 8, the other soaks 7
    assert re.search(r"^18 referee tests did not run \(3 vLLM, 8 browser, 7 kill-and-resume: left out by "
                     r"-m 'not vllm and not browser and not soak'\)", out.stdout, re.M), out.stdout[-2000:]
