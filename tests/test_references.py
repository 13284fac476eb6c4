"""Cross-references in the docstrings and comments of workbench/, bench/ and app.py name real objects:
`speed.relative_latency`, `plan/rank.make_plan`, `workbench.calibrate.folder`, `decode/loop.Step.time_s` each
resolve, statically, to a module of workbench/ and a name it defines (a function, class, constant, or a class's
method or field), so a function that moved leaves no reference to where it was. A reference is a dotted name whose
head is a workbench module, given by its last path components (`io`, `core/io`, `workbench.core.io`); `tree.nodes`,
where the head is an instance of the class of that name (Tree), resolves to the class's members. File names
(`speed.py`, `meta.json`) are not references."""
from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "workbench"
FILES = ("py", "parquet", "csv", "json", "jsonl", "md", "safetensors", "bin", "txt", "png", "toml", "pt", "html")
REF = re.compile(r"(?<![\w./-])((?:[a-z_]\w*/)*[a-z_]\w*)((?:\.[A-Za-z_]\w*)+)")


class Index:
    """Every module of a package (dotted name -> its top-level names, each class with its members)."""

    def __init__(self, root: Path):
        self.modules: dict[str, dict[str, set[str] | None]] = {}
        self.classes: dict[str, set[str]] = {}  # lower-case class name -> members (of every class of that name)
        for f in sorted(root.rglob("*.py")):
            parts = list(f.relative_to(root.parent).with_suffix("").parts)
            self.modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = self._names(f.read_text())
        self.tails: dict[str, set[str]] = {}  # "io", "core/io", "core.io", "workbench.core.io" -> the module
        for m in self.modules:
            parts = m.split(".")
            for i in range(len(parts)):
                for sep in "/.":
                    self.tails.setdefault(sep.join(parts[i:]), set()).add(m)

    def _names(self, text: str) -> dict[str, set[str] | None]:
        out: dict[str, set[str] | None] = {}
        for node in ast.parse(text).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out[node.name] = None
            elif isinstance(node, ast.ClassDef):
                out[node.name] = members = _members(node)
                self.classes.setdefault(node.name.lower(), set()).update(members)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    out.update({n.id: None for n in ast.walk(target) if isinstance(n, ast.Name)})
        return out

    def resolves(self, head: str, attrs: list[str]) -> bool:
        """Whether `head.attrs[0].attrs[1]...` names a submodule, a top-level name or a class member."""
        for module in self.tails.get(head, ()):
            rest = list(attrs)
            while rest and f"{module}.{rest[0]}" in self.modules:  # a package's submodule
                module = f"{module}.{rest.pop(0)}"
            names = self.modules[module]
            if not rest:
                return True
            if rest[0] in names and (len(rest) == 1 or (names[rest[0]] is not None and len(rest) == 2
                                                         and rest[1] in names[rest[0]])):
                return True
        return len(attrs) == 1 and attrs[0] in self.classes.get(head, ())  # `tree.nodes`: an instance's member

    def is_reference(self, head: str, attrs: list[str]) -> bool:
        return head in self.tails and attrs[0] not in FILES


def _members(cls: ast.ClassDef) -> set[str]:
    """A class's methods, nested classes, class-level and annotated fields and `self.x =` attributes."""
    out = set()
    for node in ast.walk(cls):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node is not cls:
            out.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and \
                isinstance(node.value, ast.Name) and node.value.id == "self":
            out.add(node.attr)
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.add(node.target.id)
        elif isinstance(node, ast.Assign):
            out.update(n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return out


def texts(source: str) -> list[tuple[int, str]]:
    """(line, text) of every docstring and comment of a module."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                out.append((node.body[0].lineno, doc))
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out.append((tok.start[0], tok.string))
    return out


def references(index: Index, files: dict[str, str]) -> list[tuple[str, bool]]:
    """(`path:line: reference`, whether it resolves) of each reference in `files` (name -> source)."""
    out = []
    for name, source in files.items():
        for line, text in texts(source):
            for m in REF.finditer(text):
                head, attrs = m.group(1), m.group(2)[1:].split(".")
                if index.is_reference(head, attrs):
                    out.append((f"{name}:{line}: {m.group(0)}", index.resolves(head, attrs)))
    return out


def stale_references(index: Index, files: dict[str, str]) -> list[str]:
    return [where for where, ok in references(index, files) if not ok]


@pytest.fixture(scope="module")
def index() -> Index:
    return Index(PACKAGE)


@pytest.mark.unit
def test_docstring_and_comment_references_name_real_objects(index):
    paths = sorted(PACKAGE.rglob("*.py")) + sorted((REPO / "bench").glob("*.py")) + [REPO / "app.py"]
    files = {p.relative_to(REPO).as_posix(): p.read_text() for p in paths}
    found = references(index, files)
    bad = [where for where, ok in found if not ok]
    assert not bad, "references to nothing (moved or renamed?):\n" + "\n".join(bad)
    assert len(found) > 100  # the scan sees the package's references (137 today), not none


@pytest.mark.unit
def test_the_reference_check_finds_stale_ones(index):
    """Not blind: a moved function, a moved class, a missing method and a missing submodule are each reported, and the
    same text naming where they live now is not (nor are file names, plain words or an instance's members)."""
    stale = ('"""Moved: io.WorkState, decode.Step, speed.nothing_here, calibrate/run.head_ranks and '
             'workbench.calibrate.nowhere.thing."""\n')
    live = ('"""Where they are: work.WorkState, decode/loop.Step.time_s, core/speed.relative_latency, '
            'workbench.calibrate.folder, speed.py, meta.json, e.g. i.e. tree.nodes."""\n# and io.read_json\n')
    assert stale_references(index, {"stale.py": stale}) == [
        "stale.py:1: io.WorkState", "stale.py:1: decode.Step", "stale.py:1: speed.nothing_here",
        "stale.py:1: calibrate/run.head_ranks", "stale.py:1: workbench.calibrate.nowhere.thing"]
    assert stale_references(index, {"live.py": live}) == []
