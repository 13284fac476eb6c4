"""README.md as written: at most 10,000 characters, every link resolves, and every command in its shell blocks runs.

The install lines and the test command are those of `.ci/run` (which runs them: pip needs the network, and the
suite cannot run itself). The other commands run here, as written, each block as one bash script in a scratch
folder holding a copy of `calibration/` (so outputs never land in the checkout): the quick ones in one test, the
ones that load the demo model (SLOW) in a slow test, `streamlit run` until the server answers.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest

from workbench import REPO_ROOT
from support.browser import free_port, healthy, stop

README = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
CI = (REPO_ROOT / ".ci" / "run").read_text(encoding="utf-8")
CHECKED_BY_CI = ("pip install", "python -m pytest")
REFEREE_SETUP = ("sudo apt-get install", "python -m venv", "export WORKBENCH_VLLM_PYTHON")  # .ci/run runs them too
SLOW = ("workbench calibrate", "workbench decode", "workbench latency", "workbench sweep ", "workbench train-heads")
SERVER = "streamlit run"


def shell_blocks(text: str) -> list[list[str]]:
    """The commands of each ```bash block, continuation lines joined."""
    blocks = []
    for body in re.findall(r"```(?:bash|sh|shell)\n(.*?)```", text, re.S):
        blocks.append([c.strip() for c in body.replace("\\\n", " ").splitlines() if c.strip()])
    return blocks


def kind(command: str) -> str:
    for prefixes, name in ((CHECKED_BY_CI + REFEREE_SETUP, "ci"), ((SERVER,), "server"), (SLOW, "slow")):
        if command.startswith(prefixes):
            return name
    return "quick"


BLOCKS = shell_blocks(README)


@pytest.mark.unit
def test_readme_is_at_most_10000_characters():
    assert len(README) <= 10_000, f"README.md has {len(README)} characters: move reference text to docs/"


@pytest.mark.unit
def test_readme_has_the_two_commands_and_its_install_and_test_lines_are_what_ci_runs():
    ci_lines = [re.sub(r"^pip install -q ", "pip install ", line.strip()) for line in CI.splitlines()]
    ci_commands = [c for c in ci_lines if c.startswith(CHECKED_BY_CI)]
    installs = [c for b in BLOCKS for c in b if c.startswith("pip install")]
    assert installs, "README has no install commands"
    ci_installs = [c for c in ci_commands if c.startswith("pip install")]
    for block in BLOCKS:
        if any(c.startswith("pip install") for c in block):  # each install block: exactly CI's install, in order
            assert [c for c in block if c.startswith("pip install")] == ci_installs
    tests = [c for b in BLOCKS for c in b if c.startswith("python -m pytest")]
    assert tests and all(t in ci_commands for t in tests)
    assert any("workbench calibrate" in c for b in BLOCKS for c in b if b[0].startswith("pip install")), \
        "the main job's block (install + calibrate)"


@pytest.mark.unit
def test_readme_runs_the_referees_after_their_setup_as_ci_does():
    """The second test command selects the three referee tiers; its block sets up Chromium and vLLM's environment
    with commands .ci/run runs (sudo aside), and .ci/run runs both test commands with `set -e`: both must pass."""
    block = next(b for b in BLOCKS if any(c.startswith("python -m pytest -q -m") for c in b))
    assert block[-1] == 'python -m pytest -q -m "vllm or browser or soak"'
    setup = [c for c in block if c.startswith(REFEREE_SETUP)]
    assert [c.split()[:2] for c in setup] == [["sudo", "apt-get"], ["python", "-m"],
                                              ["export", "WORKBENCH_VLLM_PYTHON=$V/bin/python"]]
    variables = dict(c.split("=", 1) for c in block if re.match(r"[A-Z_]+=\S+$", c))
    assert variables["V"].replace("~", "$HOME") in CI  # the same folder (.ci/run: unless $WORKBENCH_VLLM_VENV)
    ci_lines = [line.strip() for line in CI.splitlines()]
    for command in setup:
        assert any(command.removeprefix("sudo ") in line for line in ci_lines), command
    assert "set -euo pipefail" in CI
    tests = [line for line in ci_lines if line.startswith("python -m pytest")]
    assert tests == ["python -m pytest -q", block[-1]]


@pytest.mark.unit
def test_every_relative_link_in_readme_and_docs_resolves():
    docs = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
    missing = []
    for doc in docs:
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            if not (doc.parent / target.split("#")[0]).exists():
                missing.append(f"{doc.relative_to(REPO_ROOT)}: {target}")
    assert not missing, missing


@pytest.fixture
def scratch(tmp_path) -> tuple[Path, dict]:
    """A folder to run README commands in: a copy of calibration/, docs/ and app.py linked (read only)."""
    assert shutil.which("workbench"), "no `workbench` command on PATH (install the package: pip install -e .)"
    shutil.copytree(REPO_ROOT / "calibration", tmp_path / "calibration")
    for name in ("docs", "app.py"):
        (tmp_path / name).symlink_to(REPO_ROOT / name)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    env.pop("WORKBENCH_CALIBRATION_ROOT", None)
    return tmp_path, env


def run_blocks(scratch, kinds: set[str]) -> int:
    """Each block as one bash script of its commands of these kinds (and its variable assignments); returns how many
    commands ran."""
    folder, env = scratch
    ran = 0
    for block in BLOCKS:
        lines = [c for c in block if re.match(r"[A-Z_]+=\S+(\s*#.*)?$", c) or kind(c) in kinds]
        commands = [c for c in lines if not re.match(r"[A-Z_]+=", c)]
        if not commands:
            continue
        out = subprocess.run(["bash", "-euo", "pipefail", "-c", "\n".join(lines)], cwd=folder, env=env,
                             capture_output=True, text=True, timeout=1800)
        assert out.returncode == 0, f"{commands}\n{out.stderr[-3000:]}"
        assert not re.search(r"^error:", out.stderr, re.M), out.stderr[-3000:]
        ran += len(commands)
    return ran


def test_quick_readme_commands_run_as_written(scratch):
    assert run_blocks(scratch, {"quick"}) >= 5


@pytest.mark.slow
def test_every_readme_command_runs_as_written(scratch):
    """The main job (calibrate --limit 32) and the live decode included: minutes on a CPU."""
    ran = run_blocks(scratch, {"quick", "slow"})
    assert ran == sum(kind(c) in ("quick", "slow") for b in BLOCKS for c in b if not re.match(r"[A-Z_]+=", c))
    assert (scratch[0] / "calibration" / "quick" / "meta.json").is_file()


def test_streamlit_command_serves_the_app(scratch):
    commands = [c for b in BLOCKS for c in b if kind(c) == "server"]
    assert commands, f"README runs no `{SERVER}`"
    assert shutil.which("streamlit"), "no `streamlit` command on PATH (a dependency: pip install -e .)"
    folder, env = scratch
    port = free_port()
    env = dict(env, STREAMLIT_SERVER_PORT=str(port), STREAMLIT_SERVER_HEADLESS="true",
               STREAMLIT_BROWSER_GATHER_USAGE_STATS="false")
    for command in commands:
        proc = subprocess.Popen(["bash", "-c", "exec " + command], cwd=folder, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            url = f"http://127.0.0.1:{port}"
            assert healthy(url, proc, 120), f"{command}: no answer on port {port} (exit {proc.poll()})"
            assert urllib.request.urlopen(f"{url}/", timeout=10).status == 200
        finally:
            stop(proc, grace=20)


@pytest.mark.unit
def test_the_tours_optimize_latency_and_plan_name_the_same_tree_at_batch_1(tmp_path, capsys):
    """One ranker: the tour's `optimize --latency` writes the tree `plan` weighs at batch 1 with the same predicted
    speedup (plan's choice, or its runner-up when no speculation wins), on the committed calibration and latency."""
    import json
    import shlex

    from workbench.cli import main

    tour = next(b for b in BLOCKS if any(c.startswith("CAL=") for c in b))
    cal = next(c for c in tour if c.startswith("CAL=")).split()[0].split("=", 1)[1]

    def argv(prefix: str) -> list[str]:
        command = next(c for c in tour if c.startswith(prefix)).split("#")[0].replace("$CAL", str(REPO_ROOT / cal))
        words = shlex.split(command)[1:]
        words[words.index("--out") + 1] = str(tmp_path / words[words.index("--out") + 1])
        return words

    fastest, plan = argv("workbench optimize --calibration $CAL --latency"), argv("workbench plan")
    assert main(fastest) == 0 and main(plan) == 0
    capsys.readouterr()
    tree = json.loads(Path(fastest[fastest.index("--out") + 1]).read_text())
    planned = json.loads(Path(plan[plan.index("--out") + 1]).read_text())
    row, alt = planned["plans"][0], planned["alternatives"][0]
    assert row["batch_size"] == 1 and tree["batch_size"] == 1
    named = row if row["kind"] != "none" else alt["runner_up"]  # the fastest speculating candidate
    assert tree["medusa_choices"] == named["medusa_choices"] and tree["kind"] == named["kind"]
    assert tree["predicted_speedup"] == pytest.approx(named["predicted_speedup"], rel=1e-12)
    assert (tree["predicted_speedup"] > 1) == (row["kind"] != "none")
