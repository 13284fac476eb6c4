"""The layout as checked contracts: stages import only downward, the torch-free stages never reach torch (import-linter,
configured in pyproject.toml), and a function-level workbench import outside the front ends says why it is deferred."""
from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "workbench"
FRONT_ENDS = ("cli", "ui")

def lint_imports(config: Path, cwd: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    return subprocess.run([exe, "--config", str(config), "--no-cache"], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_import_contracts_hold():
    res = lint_imports(REPO / "pyproject.toml", REPO)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "2 kept, 0 broken" in res.stdout


def test_contracts_catch_an_upward_and_a_torch_import(tmp_path):
    """The same contracts on a copy of the package with one upward import (core -> plan) and one torch import in a
    torch-free stage (trees): both are reported, so the passing run above means something."""
    copy = tmp_path / "workbench"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__", "heads", "prompts"))
    (copy / "core" / "bad.py").write_text("from workbench.plan import rank\n")
    (copy / "trees" / "bad.py").write_text("import torch\n")
    cfg = tmp_path / "pyproject.toml"
    shutil.copy(REPO / "pyproject.toml", cfg)
    res = lint_imports(cfg, tmp_path)
    assert res.returncode != 0
    assert "workbench.core.bad -> workbench.plan.rank" in res.stdout
    assert "workbench.trees.bad -> torch" in res.stdout


def deferred_imports_without_reason(root: Path) -> list[str]:
    """`path:line` of each function-level `workbench` import outside cli/ and ui/ with no comment on its line or
    on the lines just above its group of imports."""
    bad = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] in FRONT_ENDS:
            continue
        lines = path.read_text().splitlines()
        for fn in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("workbench")):
                    i = node.lineno - 1
                    while i > 0 and lines[i - 1].strip().startswith(("from ", "import ")):
                        i -= 1  # the top of this group of imports
                    said = "#" in lines[node.lineno - 1] or (i > 0 and lines[i - 1].strip().startswith("#"))
                    if not said:
                        bad.append(f"{rel}:{node.lineno}")
    return bad


@pytest.mark.unit
def test_function_level_imports_say_why():
    assert deferred_imports_without_reason(PACKAGE) == []


@pytest.mark.unit
def test_the_deferred_import_check_finds_one(tmp_path):
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "m.py").write_text(textwrap.dedent("""\
        def f():
            from workbench.plan import rank
            return rank

        def g():
            # deferred: torch
            from workbench.runtime import heads
            return heads
        """))
    assert deferred_imports_without_reason(tmp_path) == ["core/m.py:2"]



MAX_LINES = 400  # issue 50: a module that outgrows this holds more than one job


def long_modules(root: Path) -> list[str]:
    return sorted(f"{p.relative_to(root)}: {n} lines" for p in root.rglob("*.py")
                  if (n := len(p.read_text().splitlines())) > MAX_LINES)


@pytest.mark.unit
def test_no_module_over_400_lines(tmp_path):
    assert long_modules(PACKAGE) == []
    (tmp_path / "big.py").write_text("x = 1\n" * (MAX_LINES + 1))
    assert long_modules(tmp_path) == [f"big.py: {MAX_LINES + 1} lines"]
