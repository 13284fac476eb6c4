"""The library names a request's field, never a CLI flag, in its errors (issue 70 item 3): a `WorkbenchError(...)`
or FieldError raised outside workbench/cli and workbench/ui whose text spells `--some-flag` would reach the app as
the CLI's wording; it raises core.notes.FieldError with the field instead (the CLI words it as the flag, the app as
its control). A flag inside a backticked command (`workbench calibrate --engine vllm`) is a command to run, the same
in both front ends, and allowed, as is another program's flag (FOREIGN, each with its reason). Static: the string
constants of every such call, f-strings' literal parts included."""
from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "workbench"
FRONT_ENDS = ("cli", "ui")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9_-]*")
COMMAND = re.compile(r"`[^`]*`")

# flags that are not the workbench's (no request field, no control: another program's), each with why it is named
FOREIGN = {
    "--num_processes": "accelerate launch's process count: how a multi-process run is started, outside the workbench",
    "--speculative-config": "vLLM serve's flag: how the server being scraped or served was started",
    "--per-request-spec-decode-metrics": "vLLM serve's flag: what the server must record for a served calibration",
    "--max-num-seqs": "vLLM serve's flag: the batch sizes a served schedule must cover",
}


def _texts(call: ast.Call) -> str:
    """The literal text of a call's arguments: string constants and the literal parts of f-strings."""
    parts = []
    for arg in [*call.args, *(k.value for k in call.keywords)]:
        for node in ast.walk(arg):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                parts.append(node.value)
    return "\n".join(parts)  # apart: a part ending in a letter must not hide a flag that starts the next


def flags_in_errors(root: Path) -> list[str]:
    """`file:line: --flag` for every WorkbenchError or FieldError call of a library module whose text names a
    CLI flag."""
    bad = []
    for f in sorted(root.rglob("*.py")):
        rel = f.relative_to(root)
        if rel.parts[0] in FRONT_ENDS:
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) \
                    in ("WorkbenchError", "FieldError"):
                found = [x for x in FLAG.findall(COMMAND.sub("", _texts(node))) if x not in FOREIGN]
                if found:
                    bad.append(f"{rel}:{node.lineno}: {', '.join(dict.fromkeys(found))}")
    return bad


@pytest.mark.unit
def test_library_errors_name_fields_not_flags():
    assert flags_in_errors(PACKAGE) == []


@pytest.mark.unit
def test_the_flag_scan_finds_one(tmp_path):
    (tmp_path / "core").mkdir()
    (tmp_path / "cli").mkdir()
    (tmp_path / "core" / "m.py").write_text(textwrap.dedent("""\
        from workbench import WorkbenchError
        from workbench.core.notes import FieldError

        def f(n):
            if n < 0:
                raise WorkbenchError(f"--max-new-tokens {n}: "
                                     "give 1 or more")
            if n > 9:
                raise WorkbenchError(f"too long: run `workbench decode --max-new-tokens 9`")
            if n == 5:
                raise FieldError("max_new_tokens", "five", "{field} 5: not with --tree [[0]]")
            if n == 6:
                raise WorkbenchError("--dtype is empty: give one (" + ", ".join("ab") + ") or auto")
            raise FieldError("max_new_tokens", "low", f"{{field}} {n}: give 1 or more")
        """))
    (tmp_path / "cli" / "c.py").write_text('raise WorkbenchError("--tree: give a tree")\n')
    assert flags_in_errors(tmp_path) == ["core/m.py:6: --max-new-tokens", "core/m.py:11: --tree",
                                         "core/m.py:13: --dtype"]


@pytest.mark.unit
def test_a_field_error_names_several_fields_in_each_front_ends_words():
    """`also` as a tuple: "{also}", "{also2}", ... each worded by the front end (a field it has no name for keeps
    its flag); pickled with them (a worker's error)."""
    import pickle

    from workbench.core.notes import FieldError

    e = FieldError("repeats", "range", "{field} >= 1, {also} >= 0, {also2} positive and {also3} 0..64, please",
                   also=("warmup", "batch", "k"))
    assert str(e) == "--repeats >= 1, --warmup >= 0, --batch positive and --k 0..64, please"
    assert e.words({"repeats": "'repeats'", "k": "'K'"}) == \
        "'repeats' >= 1, --warmup >= 0, --batch positive and 'K' 0..64, please"
    again = pickle.loads(pickle.dumps(e))
    assert (again.field, again.code, again.also, str(again)) == ("repeats", "range", e.also, str(e))
