"""OpenMP's threads bound one to a core by the CLI (workbench/core/launch.py), before torch loads: unless the user set
the binding, or the process is one of several launched together; vLLM's worker binds its own."""
import os
import subprocess
import sys

import pytest

from workbench.core import launch
from workbench.measure.vllm_runner import worker_env

SHOW = "import workbench.cli, os, sys; print(os.environ.get('OMP_PROC_BIND'), os.environ.get('OMP_PLACES'))"


def _bound(**env) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in launch.BIND and k not in {v[1] for v in launch.RANK_VARS}}
    return subprocess.run([sys.executable, "-c", SHOW], env=clean | env, capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.mark.parametrize("env, want", [({}, "close cores"), ({"WORLD_SIZE": "1"}, "close cores"),
                                       ({"WORLD_SIZE": "2"}, "None None"), ({"OMPI_COMM_WORLD_SIZE": "4"}, "None None"),
                                       ({"OMP_PROC_BIND": "false"}, "false cores")])
def test_the_cli_binds_threads_unless_told_otherwise(env, want):
    assert _bound(**env) == want


@pytest.mark.unit
def test_vllms_worker_gets_no_binding_of_ours(monkeypatch):
    monkeypatch.setattr(launch, "BOUND", {"OMP_PROC_BIND": "close"})
    monkeypatch.setattr("workbench.measure.vllm_runner.BOUND", launch.BOUND)
    monkeypatch.setenv("OMP_PROC_BIND", "close")
    monkeypatch.setenv("OMP_PLACES", "cores")
    env = worker_env(sys.executable)
    assert "OMP_PROC_BIND" not in env and env["OMP_PLACES"] == "cores"  # the user's own (not ours) stays
