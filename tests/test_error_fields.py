"""The library names a request's field, never a CLI flag, in its errors (issue 70 item 3): a `WorkbenchError(...)`
or FieldError raised outside workbench/cli and workbench/ui whose text spells `--some-flag` would reach the app as
the CLI's wording; it raises core.notes.FieldError with the field instead (the CLI words it as the flag, the app as
its control). A flag inside a backticked command (`workbench calibrate --engine vllm`) is a command to run, the same
in both front ends, and allowed, as is another program's flag (FOREIGN, each with its reason). Static: the string
constants of every such call, f-strings' literal parts included. The same holds for every other text of the
library (flags_in_library): a reader's label, a warning's or a note's text names a field too."""
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
    "--mpirun_hostfile": "accelerate launch's MPI host file: how several CPU processes are started, outside it",
    "--speculative-config": "vLLM serve's flag: how the server being scraped or served was started",
    "--per-request-spec-decode-metrics": "vLLM serve's flag: what the server must record for a served calibration",
    "--max-num-seqs": "vLLM serve's flag: the batch sizes a served schedule must cover",
    "--medusa_choices": "TensorRT-LLM's examples/run.py flag: what an export for that engine is run with",
}
# literal texts that name a flag and are no message, each with why
KEPT = {
    "latency --engine vllm": "measure/vllm_latency.py's WorkState `command` setting: the resume key earlier runs wrote",
}
# library modules whose flags are their callers' labels, each with why
LABELLED_BY_CALLER = {
    "core/outputs.py": "the output guard (no output on an input or a protected folder) words the labels its callers "
                       "give, the CLI's and the bench scripts' own flags and positionals; the app writes no file",
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


# ----------------------------------------------------------------------------------------------- every library text

def _subcommands() -> list[str]:
    from workbench.cli import build_parser

    sub = next(a for a in build_parser()._actions if getattr(a, "choices", None) and "latency" in a.choices)
    return sorted(sub.choices, key=len, reverse=True)


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}


def flags_in_library(root: Path) -> list[str]:
    """`file:line: --flag` for every text of a library module (outside cli/ and ui/) that names a CLI flag: an
    error's, a warning's or a note's (workbench.warn/note, core.notes.Note), a reader's label (a default like
    `flag="--latency"`, an argument like `read_csv(path, "--acceptance", ...)`, an f-string `f"--work {work}"`), a
    label assigned for later (`flag = "--out" if out else "--name"`): each string constant or f-string, or a sum
    of them, whole. A docstring explains; a command to run (in backticks, or a `workbench COMMAND ...` line such as
    a reader's `maker`) reads the same in both front ends; FOREIGN, KEPT and LABELLED_BY_CALLER say why theirs are
    allowed."""
    line = re.compile(r"\bworkbench (?:" + "|".join(map(re.escape, _subcommands())) + r")\b[^,;:()`\n]*")
    bad = []
    for f in sorted(root.rglob("*.py")):
        rel = f.relative_to(root)
        if rel.parts[0] in FRONT_ENDS or rel.as_posix() in LABELLED_BY_CALLER:
            continue
        tree = ast.parse(f.read_text())
        skip = _docstrings(tree)
        for node in ast.walk(tree):  # outermost first: a sum or an f-string is read whole, once
            if id(node) in skip or not isinstance(node, (ast.Constant, ast.JoinedStr, ast.BinOp)):
                continue
            parts = [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
            skip.update(id(n) for n in ast.walk(node))
            text = "\n".join(parts)
            if text in KEPT:
                continue
            found = [x for x in FLAG.findall(line.sub("", COMMAND.sub("", text))) if x not in FOREIGN]
            if found:
                bad.append((str(rel), node.lineno, node.col_offset, ", ".join(dict.fromkeys(found))))
    return [f"{rel}:{n}: {flags}" for rel, n, _, flags in sorted(bad)]


@pytest.mark.unit
def test_library_texts_name_fields_not_flags():
    """Issue 70's remnant: readers take the request's field (read_latency(path, field="latency"), Surface.read,
    check_acceptance, read_csv, WorkState, read_sweep, atomic_write, run_lock, Shard), warnings and notes carry a
    core.notes.Note; no library text spells a flag the app would show as it is."""
    assert flags_in_library(PACKAGE) == []


@pytest.mark.unit
def test_the_library_scan_finds_labels_defaults_and_warnings(tmp_path):
    for d in ("core", "cli"):
        (tmp_path / d).mkdir()
    (tmp_path / "core" / "m.py").write_text(textwrap.dedent('''\
        """A reader; --latency in a docstring explains, and is allowed."""
        from workbench import note, warn
        from workbench.core.io import read_csv
        from workbench.core.notes import Note


        def read(path, flag: str = "--latency"):
            """`flag`: --latency by default."""
            return read_csv(path, "--acceptance", ("a",), "workbench sweep --out FILE.csv")


        def run(work, out, late):
            label = f"--work {work}"
            flag = "--out" if out else "--name"
            if late:
                warn("--time-budget" + " left no time to train")
            note(Note("x", "add {field} files or raise --answers-per-prompt", field="prompts"))
            warn(f"serve with --max-num-seqs {out}: run `workbench latency --batch-sizes 8` first")
            return label, flag, dict(command="latency --engine vllm")
        '''))
    (tmp_path / "core" / "outputs.py").write_text('out = {"the HF cache of --model": 1}\n')
    (tmp_path / "cli" / "c.py").write_text('check_output(out, "--out")\n')
    assert flags_in_library(tmp_path) == ["core/m.py:7: --latency", "core/m.py:9: --acceptance",
                                          "core/m.py:13: --work", "core/m.py:14: --out", "core/m.py:14: --name",
                                          "core/m.py:16: --time-budget", "core/m.py:17: --answers-per-prompt"]


@pytest.mark.unit
def test_a_warning_names_its_field_as_each_front_end_does(capsys):
    """workbench.warn/note take a core.notes.Note: the CLI names its field by the flag (cli_warnings), the warning
    carries the note for any other front end; a reader's error held with its warnings (warnings_held) stays a
    FieldError, so the app still names its control."""
    import warnings

    from workbench import warn, warnings_held
    from workbench.cli.shared import cli_warnings
    from workbench.core.notes import FieldError, Note
    from workbench.ui.widgets import app_names

    capsys.readouterr()  # streamlit's import-time log lines
    said = Note("untrained", "{field} left no time to train: the heads written are untrained", field="time_budget")
    with cli_warnings():
        warn(said)
    assert capsys.readouterr().err == "warning: --time-budget left no time to train: the heads written are untrained\n"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn(said)
    assert caught[0].message.note.words(app_names({"time_budget": "time budget"})) == \
        "'time budget' left no time to train: the heads written are untrained"
    with pytest.raises(FieldError) as e:
        with warnings_held():
            warn("config says 3 heads")
            raise FieldError("heads", "other_model", "{field} h: heads of another model")
    assert e.value.code == "other_model" and str(e.value) == "--heads h: heads of another model (also: config says 3 heads)"
    assert e.value.words(app_names({"heads": "Medusa heads"})) == \
        "'Medusa heads' h: heads of another model (also: config says 3 heads)"
