"""Medusa tree workbench: calibrate heads, optimise `medusa_choices` trees, verify them with a live decoder."""
import contextlib
import os
import warnings
from pathlib import Path

__version__ = "0.1.0"

REPO_ROOT = Path(__file__).resolve().parent.parent
# the demo's heads (loaded by heads.py); named here so that exports and the app name them without importing torch
DEMO_HEADS = Path(__file__).resolve().parent / "heads" / "smollm2-135m-instruct"
# acceptance.py's rules, named here so that the CLI's parser lists them without importing torch (seconds per run)
ACCEPTANCE_KINDS = ("greedy", "typical", "nucleus")

# The 1-minute load average when this process began (before its own work): within a minute a measurement's own
# threads raise the load to about their count, so only this says whether anything else was running.
LOAD_AT_START = os.getloadavg()[0] if hasattr(os, "getloadavg") else None


class WorkbenchError(ValueError):
    """A problem with the user's input. The CLI prints it as one line `error: ...` and exits with status 2."""


class WorkbenchWarning(UserWarning):
    """Something the user should know that does not stop the run; the CLI shows it as one line `warning: ...`."""


class WorkbenchNote(UserWarning):
    """A fact about the run that is no problem (resuming from kept pieces, a progress line); the CLI shows it as
    written, on stderr."""


def warn(message) -> None:
    """Warn the user (WorkbenchWarning): the front end decides how it is shown (the CLI: cli.shared.cli_warnings).
    `message`: a text, or a core.notes.Note naming a request's field, which each front end words (the warning
    carries it as `.note`: the CLI names the field by its flag)."""
    warnings.warn(_carrying(message, WorkbenchWarning), stacklevel=2)


def note(message) -> None:
    """Tell the user a fact about the run (WorkbenchNote), through the same channel as `warn`: the library never
    prints; the front end words and shows it (the CLI: cli.shared.cli_warnings, each line as written). `message`:
    a text or a core.notes.Note, as for `warn`."""
    warnings.warn(_carrying(message, WorkbenchNote), stacklevel=2)


def _carrying(message, category: type) -> UserWarning:
    if isinstance(message, str):
        return category(message)
    w = category(message.words())  # the CLI's wording by default (core.notes.flag)
    w.note = message
    return w


@contextlib.contextmanager
def warnings_held():
    """Read an input with its warnings held: shown once the reader accepts it (each text once, however often the
    input was read), or folded into the error that refuses it (one `error:` line, not a warning about a file that
    is refused anyway). Nested holds are the outermost's."""
    if _HOLDING:
        yield
        return
    _HOLDING.append(True)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", WorkbenchWarning)
            try:
                yield
            except WorkbenchError as e:
                held = [" ".join(str(w.message).split()) for w in caught if issubclass(w.category, WorkbenchWarning)]
                if not held:
                    raise
                also = f" (also: {'; '.join(dict.fromkeys(held))})"
                if hasattr(e, "words"):  # a core.notes.FieldError: still worded by each front end
                    raise type(e)(e.field, e.code, e.text + also, e.also) from None
                raise WorkbenchError(f"{e}{also}") from None
    finally:
        _HOLDING.clear()
    seen = set()
    for w in caught:
        if (str(w.message), w.category) not in seen:
            seen.add((str(w.message), w.category))
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


_HOLDING: list = []
