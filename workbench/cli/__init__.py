"""`workbench` command line: the parser and the entry point; bad input -> `error: ...`, exit status 2.

A thin argparse layer over the package, one module per command or group: trees.py (tree, optimize), export.py,
calibrate.py, decode.py, train.py (train-heads, eval-heads), tradeoffs.py (latency, plan, sweep, sweep-report),
vllm.py (vllm-check); shared.py holds the flags, flag parsers and output helpers they share.
"""
from __future__ import annotations

import argparse
import errno
import os
import sys

from workbench import WorkbenchError, __version__
from workbench.cli.calibrate import add_calibrate
from workbench.cli.decode import add_decode
from workbench.cli.export import add_export
from workbench.cli.shared import cli_warnings, flag_of
from workbench.cli.tradeoffs import add_tradeoffs
from workbench.cli.train import add_train_heads
from workbench.cli.trees import add_tree
from workbench.cli.vllm import add_vllm_check
from workbench.core.notes import worded
from workbench.core.outputs import check_not_inputs, protected_folders


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are the CLI's one `error:` line too (its subparsers are of this class)."""

    def error(self, message):
        raise WorkbenchError(f"{self.prog}: {message} (see `{self.prog} --help`)")


# the flags (argparse dests) that name what a command writes: a file, or a folder it fills
OUTPUTS = {"out": "file", "png": "file", "curve_out": "file", "table": "file", "figures": "folder", "work": "folder",
           "trees_dir": "folder"}
FOLDER_OUT = {"calibrate", "train-heads"}  # commands whose --out is a folder


def _check_outputs(args) -> None:
    """No output flag may name (or, through a link, reach) a file or folder the command reads."""
    inputs = {}
    for dest, value in vars(args).items():
        if dest in OUTPUTS or dest in ("func", "command", "tree_command") or \
                (dest == "calibration" and args.command == "latency"):  # latency writes into its calibration
            continue
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, str) and v and os.path.lexists(v):
                inputs[f"--{dest.replace('_', '-')}" if dest not in ("tree", "sweep") else dest.upper()] = v
    folder_out = args.command in FOLDER_OUT or getattr(args, "format", None) == "vllm-heads"
    outputs = {f"--{d.replace('_', '-')}": (getattr(args, d), "folder" if d == "out" and folder_out else kind)
               for d, kind in OUTPUTS.items() if getattr(args, d, None)}
    heads = getattr(args, "heads_dir", None) or getattr(args, "heads", None)
    if args.command == "export" and args.format == "vllm-heads":
        heads = args.tree or heads
    protected = protected_folders(getattr(args, "model", None), heads if isinstance(heads, str) else None)
    if args.command == "train-heads":  # it makes heads: the demo heads are its default --out for the demo model
        protected = {k: v for k, v in protected.items() if not k.startswith("the demo heads")}
    check_not_inputs(outputs, inputs, protected)


class _Stdout:
    """sys.stdout for the run: a write that fails (closed, full, broken pipe) is one error line, not a traceback
    or a silent exit 0; results go to stdout only when the command has no --out."""

    def __init__(self, stream):
        self.stream = stream

    def _fail(self, e: OSError | None):
        why = "it is closed" if e is None else "the reader closed the pipe" if isinstance(e, BrokenPipeError) else \
            (e.strerror or type(e).__name__)
        raise WorkbenchError(f"cannot write the results to standard output ({why}): give --out FILE, or redirect "
                             "stdout to a file or pipe that takes them") from None

    def write(self, text):
        if self.stream is None or getattr(self.stream, "closed", False):
            self._fail(None)
        try:
            return self.stream.write(text)
        except OSError as e:
            self._fail(e)

    def flush(self):
        if self.stream is not None and not getattr(self.stream, "closed", False):
            try:
                self.stream.flush()
            except OSError as e:
                self._fail(e)

    def __getattr__(self, name):
        return getattr(self.stream, name)


def _silence_stdout(stream) -> None:
    """After a failed write, point fd 1 at /dev/null so that the interpreter's own flush at exit finds nothing
    to fail on (else: "Exception ignored ... BrokenPipeError")."""
    try:
        fd = stream.fileno()
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)
        os.close(null)
    except (AttributeError, OSError, ValueError):
        pass


def _close_progress_bars() -> None:
    """A run that fails mid-way leaves its progress bar open; closed here, its last redraw lands before the error
    line instead of after it (the error stays the last line)."""
    tqdm = sys.modules.get("tqdm")
    for bar in list(getattr(getattr(tqdm, "tqdm", None), "_instances", None) or []):
        try:
            bar.close()
        except Exception:  # noqa: BLE001 - a bar that cannot draw any more: nothing to tidy
            pass


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="workbench", description="Design, calibrate and validate Medusa decoding trees.")
    p.add_argument("--version", action="version", version=f"workbench {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # in the order a user meets them: trees, calibration, live decoding, trade-offs, training new heads
    add_tree(sub)  # tree / optimize
    add_export(sub)
    add_calibrate(sub)
    add_decode(sub)
    add_tradeoffs(sub)  # latency / sweep / sweep-report
    add_train_heads(sub)
    add_vllm_check(sub)  # the plan confirmed in vLLM
    return p


def main(argv: list[str] | None = None) -> int:
    with cli_warnings():
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    real = sys.stdout
    sys.stdout = _Stdout(real)
    try:
        args = build_parser().parse_args(argv)  # inside: a renamed flag is a WorkbenchError too
        _check_outputs(args)
        rc = int(args.func(args) or 0)
        sys.stdout.flush()
        return rc
    except WorkbenchError as e:
        if sys.stderr is None:
            return 2
        if "standard output" in str(e):
            _silence_stdout(real)
        _close_progress_bars()
        # one line, whatever a library said; a request's field named by its flag
        print("error: " + " ".join(worded(e, flag_of).splitlines()), file=sys.stderr)
        return 2
    except MemoryError:
        print("error: out of memory: the sizes asked for do not fit this machine's memory; ask for smaller ones "
              "(see the command's --help for each limit)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO):  # a write deep in a library
            print(f"error: cannot write {e.filename or 'an output'} ({e.strerror}): free space or write elsewhere",
                  file=sys.stderr)
            return 2
        raise
    finally:
        sys.stdout = real
