"""The generated reference (docs/cli.md, the generated blocks of docs/formats.md) matches the code: regenerated
and compared, so a new flag or column cannot leave the docs stale."""
import importlib.util
import subprocess
import sys

import pytest

from workbench import REPO_ROOT

GENERATOR = REPO_ROOT / "docs" / "generate.py"


def _generator():
    spec = importlib.util.spec_from_file_location("docs_generate", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.unit
def test_generated_docs_are_up_to_date():
    gen = _generator()
    stale = [str(path.relative_to(REPO_ROOT)) for path, text in gen.outputs().items()
             if not path.is_file() or path.read_text(encoding="utf-8") != text]
    assert not stale, f"stale: {stale}; run `python docs/generate.py` and commit the result"


@pytest.mark.unit
def test_cli_reference_names_every_command_and_flag():
    """Every subcommand and every option string of the real parser appears in docs/cli.md (but the hidden old
    spellings, which only say the new one: shared.renamed)."""
    import argparse

    from workbench.cli import build_parser

    text = (REPO_ROOT / "docs" / "cli.md").read_text(encoding="utf-8")

    def walk(parser, name):
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                for sub_name, sub in a.choices.items():
                    assert f"## `{name} {sub_name}`" in text
                    walk(sub, f"{name} {sub_name}")
            for flag in a.option_strings if a.help != argparse.SUPPRESS else ():
                if flag not in ("-h", "--help"):
                    assert f"`{flag}`" in text, (name, flag)

    walk(build_parser(), "workbench")


def test_check_mode_reports_a_stale_file(tmp_path):
    """--check fails (exit 1, naming the file) when a generated block was edited by hand."""
    docs = tmp_path / "docs"
    docs.mkdir()
    gen_copy = docs / "generate.py"
    gen_copy.write_text(GENERATOR.read_text().replace(
        "sys.path.insert(0, str(DOCS.parent))", f"sys.path.insert(0, {str(REPO_ROOT)!r})"))
    formats = (REPO_ROOT / "docs" / "formats.md").read_text()
    (docs / "formats.md").write_text(formats.replace("`mc_sim_7b_63` | 63", "`mc_sim_7b_63` | 64", 1))
    (docs / "cli.md").write_text((REPO_ROOT / "docs" / "cli.md").read_text())
    out = subprocess.run([sys.executable, str(gen_copy), "--check"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 1 and "stale: docs/formats.md" in out.stderr and "cli.md" not in out.stderr, out.stderr
