"""The work state a long run keeps beside its output file (WorkState): its finished pieces, so a rerun after a kill
redoes only the rest. Atomic writes and the checked reader are io.py's.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from workbench import WorkbenchError, note
from workbench.core.notes import FieldError
from workbench.core.io import atomic_write_json, read_json, work_folder


def piece_files(folder: Path) -> list[Path]:
    """The finished pieces in a WorkState folder, sorted: neither its settings nor a piece being written (a dot
    file that a kill inside an atomic write leaves behind)."""
    return sorted(p for p in folder.glob("*.json") if p.name != "settings.json" and not p.name.startswith("."))


class WorkState:
    """The finished pieces of a long run whose result is one file (latency's points, eval-heads' phases,
    vllm-check's engines), kept in work_folder(out) until that file is written (then remove_work): the same
    command rerun after a kill redoes only what was not finished, and its file equals an unbroken run's.

    A piece is any JSON value under a name, one file each, written atomically (a piece on disk is whole).
    `settings` (JSON) is everything the pieces depend on (flags, model, heads, prompts, the measuring setting less
    its load); a folder holding other settings is started over, with one note on stderr, so pieces of two runs
    never mix. Nothing is written before the first piece (a run refused early leaves nothing). Without a file
    (`out` None) the pieces live in memory only. The caller holds the output's run_lock."""

    def __init__(self, out: str | Path | None, settings: dict, field: str = "out"):
        """`field`: the request field that named `out` (its errors name it: core.notes.FieldError)."""
        self.folder, self.field, self.memory = work_folder(out), field, {}
        self.settings = json.loads(json.dumps(settings))  # as it reads back
        self.stale = False  # the folder holds another run's pieces: cleared at the first put
        if self.folder is None or not self.folder.exists():
            return
        if not self.folder.is_dir():
            raise FieldError(field, "work_is_file", f"{{field}} {out}: {self.folder} is a file, not the run's work "
                             "folder; remove it or give another {field}")
        f = self.folder / "settings.json"
        if not f.is_file():
            if any(not p.name.startswith(".") for p in self.folder.iterdir()):
                raise FieldError(field, "foreign_work", f"{{field}} {out}: {self.folder} holds files but no "
                                 "settings.json (not this command's work folder); remove it or give another {field}")
            return
        try:
            recorded = read_json(f, str(self.folder)).get("settings")
        except WorkbenchError:
            recorded = None
        if recorded != self.settings:
            old = recorded if isinstance(recorded, dict) else {}
            diff = [k for k in sorted(set(old) | set(self.settings)) if old.get(k) != self.settings.get(k)]
            shown = ", ".join(f"{k}: {str(old.get(k))[:40]} -> {str(self.settings.get(k))[:40]}" for k in diff[:3])
            note(f"note: {self.folder} holds the finished part of a run with other settings ({shown}): starting "
                 "over")
            self.stale = True
            return
        done = len(piece_files(self.folder))
        if done:
            note(f"resuming: {done} finished piece(s) kept in {self.folder}")

    def _path(self, name: str) -> Path:
        return self.folder / f"{name}.json"

    def get(self, name: str):
        """The piece `name`, or None when it is not finished yet."""
        if name in self.memory:
            return self.memory[name]
        if self.folder is None or self.stale or not self._path(name).is_file():
            return None
        try:
            value = read_json(self._path(name), str(self.folder))["value"]
        except (WorkbenchError, KeyError):
            raise WorkbenchError(f"{self._path(name)}: not a piece this command wrote (damaged?); remove "
                                 f"{self.folder} to start over") from None
        self.memory[name] = value
        return value

    def put(self, name: str, value) -> None:
        """Keep a finished piece (on disk before this returns)."""
        self.memory[name] = json.loads(json.dumps(value))  # as a resumed run reads it: lists, string keys
        if self.folder is None:
            return
        if self.stale:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.stale = False
        if not (self.folder / "settings.json").is_file():
            atomic_write_json(self.folder / "settings.json", {"settings": self.settings}, self.field)
        atomic_write_json(self._path(name), {"value": value}, self.field)

    def piece(self, name: str, compute):
        """The piece `name` if finished, else compute() kept as it."""
        value = self.get(name)
        if value is None:
            self.put(name, compute())
            value = self.memory[name]  # as it reads back, so an unbroken run goes on with what a resumed one reads
        return value


def remove_work(out: str | Path | None) -> None:
    """Drop a run's work folder once its file is written."""
    folder = work_folder(out)
    if folder is not None and (folder / "settings.json").is_file():
        shutil.rmtree(folder, ignore_errors=True)
