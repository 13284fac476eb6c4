"""Flags, flag parsers and output helpers shared by every `workbench` command (one declaration, one help text)."""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import warnings

from workbench import WorkbenchError, WorkbenchNote, WorkbenchWarning
from workbench.core.io import atomic_write_text
from workbench.trees.tree import MAX_DEPTH, MAX_NODES, MAX_RANK

MAX_VALUES = 1000  # values in one --epsilon / --temperature list or range


# a request field's flag where it is not `--` + the field with dashes (core.notes.flag): the CLI's names for the
# fields the library's errors name (core.notes.FieldError)
FLAGS = {"prompt_set": "--prompts FILE|NAME"}


def flag_of(field: str) -> str:
    from workbench.core.notes import flag

    return FLAGS.get(field) or flag(field)


def write_output(text: str, out: str | None, what: str = "") -> None:
    """Text to --out (atomically, with a note on stderr) or stdout: every command writes results this way."""
    if out:
        atomic_write_text(out, text, "out")
        if what:
            print(f"wrote {what} to {out}", file=sys.stderr)
    else:
        sys.stdout.write(text)


def warn_line(message) -> None:
    """The CLI's one way to show a warning: one line `warning: ...` on stderr, whatever the message holds."""
    print("warning: " + " ".join(str(message).split()), file=sys.stderr)


def report_written(df, out) -> None:
    """The end of a latency measurement's report: its setting, a warning when the machine was busy, the file."""
    from workbench.core.provenance import describe, loaded, read_setting  # torch-free; the parser needs none of it

    where = read_setting(df)
    print(f"setting: {describe(where)}", file=sys.stderr)
    if loaded(where):
        warn_line("the machine was busy while measuring (load average above half its cores): these times are not "
                  "this machine's; re-measure when it is idle")
    print(f"wrote {out}", file=sys.stderr)


@contextlib.contextmanager
def cli_warnings():
    """How a command's warnings reach the user: the workbench's own (workbench.warn) one line each (warn_line), its
    notes (workbench.note) as written;
    other libraries' (deprecations, torch.load's pickle-protocol note) not at all, as nothing in them is the
    user's to act on, unless asked for with `python -W ...` or PYTHONWARNINGS (then one line each too)."""
    with warnings.catch_warnings():
        if not sys.warnoptions:
            warnings.simplefilter("ignore")
        warnings.simplefilter("default", WorkbenchWarning)
        warnings.simplefilter("always", WorkbenchNote)  # progress lines repeat: each is shown
        warnings.showwarning = _show
        yield


def _show(message, category, *_a, **_k) -> None:
    if getattr(message, "note", None) is not None:  # a core.notes.Note: its field named by the CLI's flag
        message = message.note.words(flag_of)
    if category is WorkbenchNote:
        print(str(message), file=sys.stderr, flush=True)
    else:
        warn_line(message if category is WorkbenchWarning else f"{category.__name__}: {message}")


def write_json(obj, out: str | None) -> None:
    """JSON to --out or stdout."""
    write_output(json.dumps(obj, indent=2) + "\n", out)


class ScriptParser(argparse.ArgumentParser):
    """A bench script's parser: a usage error is the CLI's one `error:` line (run_script), not argparse's two."""

    def error(self, message):
        raise WorkbenchError(f"{self.prog}: {message} (see `{self.prog} --help`)")


# a bench script's flags checked by name (run_script): the counts (1 or more), the thread count, the dtype
SCRIPT_COUNTS = {"limit", "max_new_tokens", "topk", "batch_size", "rounds", "repeats", "top", "live", "tokens",
                 "sequences_per_step", "passes", "surface_limit", "check_limit", "surface_repeats", "max_budget",
                 "random_heads", "threads"}
SCRIPT_DTYPES = ("auto", "float32", "fp32", "bfloat16", "bf16", "float16", "fp16")
SCRIPT_OUTPUTS = {"out": "file", "table": "file", "work": "folder", "out_dir": "folder"}


def check_script_args(args) -> None:
    """A bench script's flags, by name, as the CLI checks its own: counts >= 1 (a negative --threads reached torch),
    a dtype the loaders know, finite numbers; its outputs writable and never an input, the model cache or the
    heads in use (core.outputs.check_not_inputs, the CLI's rule). Before anything loads."""
    from workbench.core.io import check_output
    from workbench.core.outputs import check_not_inputs, protected_folders

    for dest, v in vars(args).items():
        flag = "--" + dest.replace("_", "-")
        if dest in SCRIPT_COUNTS and isinstance(v, int) and not isinstance(v, bool) and v < 1:
            raise WorkbenchError(f"{flag} {v}: give 1 or more")
        if isinstance(v, float) and not math.isfinite(v):
            raise WorkbenchError(f"{flag} {v}: not a finite number")
        if dest == "dtype" and v is not None and v not in SCRIPT_DTYPES:
            raise WorkbenchError(f"{flag} {v}: unknown dtype (use auto, float32, bfloat16 or float16)")
    outputs = {f"--{d.replace('_', '-')}": (getattr(args, d), kind) for d, kind in SCRIPT_OUTPUTS.items()
               if getattr(args, d, None)}
    for dest, kind in SCRIPT_OUTPUTS.items():
        check_output(getattr(args, dest, None), dest, kind)
    inputs = {f"--{d.replace('_', '-')}": v for d, v in vars(args).items()
              if d not in SCRIPT_OUTPUTS and isinstance(v, str) and v and os.path.lexists(v)}
    check_not_inputs(outputs, inputs, protected_folders(getattr(args, "model", None), getattr(args, "heads", None)))


def _made(paths) -> list:
    """For each output, the outermost of its folders that does not exist yet (what a failed run must remove)."""
    from pathlib import Path

    made = []
    for p, kind in paths:
        folder = Path(p) if kind == "folder" else Path(p).parent
        top = None
        while not folder.exists() and folder != folder.parent:
            top, folder = folder, folder.parent
        if top is not None:
            made.append(top)
    return made


def _tidy(made) -> None:
    """Remove the folders a failed run created for its outputs, where it left them empty."""
    for top in made:
        for folder in sorted((f for f in [top, *top.rglob("*")] if f.is_dir()), key=lambda f: -len(f.parts)):
            try:
                folder.rmdir()  # only an empty one goes
            except OSError:
                pass


def run_script(parser: argparse.ArgumentParser, run, argv=None) -> int:
    """A bench script's entry point: parse argv (a ScriptParser's usage errors included), check the flags
    (check_script_args), run(args); a WorkbenchError as one `error:` line and exit 2 (the CLI's rule, for the
    scripts outside it), with no output folder of its own left behind."""
    made = []
    try:
        args = parser.parse_args(argv)
        check_script_args(args)
        made = _made([(getattr(args, d), kind) for d, kind in SCRIPT_OUTPUTS.items() if getattr(args, d, None)])
        with cli_warnings():  # the library's warnings and notes worded as the CLI words them
            return run(args)
    except WorkbenchError as e:
        _tidy(made)
        from workbench.core.notes import worded

        print("error: " + " ".join(worded(e, flag_of).splitlines()), file=sys.stderr)
        return 2
    except BaseException:
        _tidy(made)
        raise


# flag values: lists and ranges of numbers, one clear error line when malformed

# Upper limits of the integer flags, each with the reason it applies: a larger value is a typo, and refusing it
# at parse time (before any model loads or any array is allocated) beats a MemoryError or an hour-long loop.
LIMITS = {
    "nodes": (MAX_NODES, "tree nodes (the verify step's mask is nodes^2; engines verify a few hundred at most)"),
    "depth": (MAX_DEPTH, "tree levels (one Medusa head per level)"),
    "rank": (MAX_RANK, "ranks per head (above any vocabulary)"),
    "tokens": (1 << 20, "new tokens per answer (beyond any model's context)"),
    "batch": (1 << 16, "sequences per step"),
    "context": (1 << 24, "cache positions"),
    "repeats": (10_000, "timed repeats per point"),
    "count": (1 << 31, "(a 32-bit count)"),
    "seed": ((1 << 32) - 1, "(numpy and torch both take seeds in 0..2^32-1)"),
    "data": (1 << 40, "(more than any run can use)"),
}


def bounded(limit: str, low: int = 1):
    """An argparse `type` for an integer flag in [low, LIMITS[limit]]: anything else is the parser's one error
    line, naming the value, the range and why."""
    high, why = LIMITS[limit]

    def parse(text: str) -> int:
        try:
            v = int(str(text).strip().replace("_", ""))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer (give a whole number in {low}..{high})") \
                from None
        if not low <= v <= high:
            raise argparse.ArgumentTypeError(f"{v} is outside {low}..{high} {why}")
        return v
    parse.__name__ = "integer"
    return parse


def finite(low: float = -math.inf, high: float = math.inf, open_low: bool = False):
    """An argparse `type` for a finite float in [low, high] ((low, high] with open_low): NaN and inf refused."""
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"{text} is not a finite number")
        if v < low or v > high or (open_low and v == low):
            raise argparse.ArgumentTypeError(f"{text} is outside {'(' if open_low else '['}{low:g}, {high:g}]")
        return v
    parse.__name__ = "number"
    return parse


def parse_ints(text, what: str, limit: str = "count") -> list[int]:
    """'1,2,4' -> [1, 2, 4]: positive, sorted, unique, each at most LIMITS[limit]."""
    try:
        vals = sorted({int(x) for x in str(text).replace(" ", "").split(",") if x})
    except ValueError:
        raise WorkbenchError(f"{what} {text!r}: give comma-separated positive integers like 4,8,16") from None
    if not vals or vals[0] < 1:
        raise WorkbenchError(f"{what} {text!r}: give comma-separated positive integers like 4,8,16")
    high, why = LIMITS[limit]
    if vals[-1] > high:
        raise WorkbenchError(f"{what} {text!r}: {vals[-1]} is above {high} {why}")
    return vals


def parse_floats(text, what: str, low: float = 0.0, high: float = math.inf) -> list[float]:
    """'0,0.7' -> [0.0, 0.7] (each in [low, high]), or a range START:STOP:STEP with STOP included when hit."""
    text = str(text).replace(" ", "")
    try:
        parts = [float(x) for x in text.split(":")] if ":" in text else [float(x) for x in text.split(",") if x]
    except ValueError:
        raise WorkbenchError(f"{what} {text!r}: give numbers like 0.05,0.09 or a range like 0.01:0.25:0.04") from None
    if ":" in text:
        if len(parts) != 3 or not all(map(math.isfinite, parts)) or not (parts[2] > 0 and parts[0] <= parts[1]):
            raise WorkbenchError(f"{what} {text!r}: a range is START:STOP:STEP with START <= STOP and STEP > 0, "
                                 "e.g. 0.01:0.25:0.04")
        start, stop, step = parts
        if (stop - start) / step > MAX_VALUES:  # each value is a full configuration of a sweep
            raise WorkbenchError(f"{what} {text!r}: {int((stop - start) / step) + 1} values; at most {MAX_VALUES} "
                                 "(each one is a configuration run over every prompt): use a larger STEP")
        vals = [round(start + i * step, 10) for i in range(int(math.floor((stop - start) / step + 1e-9)) + 1)]
    else:
        vals = parts
    if not vals:
        raise WorkbenchError(f"{what} is empty: give numbers like 0.05,0.09 or a range like 0.01:0.25:0.04")
    if len(vals) > MAX_VALUES:
        raise WorkbenchError(f"{what}: {len(vals)} values; at most {MAX_VALUES}")
    for v in vals:
        if not (low <= v <= high and math.isfinite(v)):
            raise WorkbenchError(f"{what} {text!r}: value {v:g} is outside [{low:g}, {high:g}]")
    return sorted(set(vals))


def parse_delta(text) -> str | float:
    """'sqrt' (delta = sqrt(epsilon), Medusa's posterior_alpha convention) or a fixed number >= 0."""
    if str(text).strip().lower() == "sqrt":
        return "sqrt"
    try:
        d = float(text)
    except (TypeError, ValueError):
        raise WorkbenchError(f"--delta {text!r}: unknown; use 'sqrt' (delta = sqrt(epsilon)) or a number >= 0") \
            from None
    if not (d >= 0 and math.isfinite(d)):
        raise WorkbenchError(f"--delta {text!r}: must be 'sqrt' or a finite number >= 0")
    return d

def renamed(parser, old: str, new: str) -> None:
    """Refuse a flag's old spelling with one line naming the new one (one spelling per concept: --batch-sizes for
    serving batch sizes, --gen-batch for generation chunking, --table only for an output). Registered exactly, so
    argparse does not read `--batch` as an abbreviation of `--batch-sizes` either."""
    class Renamed(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            raise WorkbenchError(f"{option_string}: this flag is now {new}")

    parser.add_argument(old, action=Renamed, nargs="?", help=argparse.SUPPRESS)


# ==== flags shared by the model-loading commands (decode, calibrate, train-heads, latency, sweep) =============

COMPILE_HELP = ("torch.compile the whole decoding step, once per (batch, tree size) (CUDA graphs on CUDA); a failure is "
                "an error. Default: on CUDA the decoder layers compiled once and the whole step captured per shape as "
                "a CUDA graph (docs/gpu.md); on CPU the decoder layers alone are compiled (seconds per shape; models "
                "under 128 MB stay eager), where the whole step takes minutes per shape the first time: "
                "docs/measurements.md. --no-compile: eager")

SHARED_FLAGS = {  # one declaration and help text per flag, whichever command takes it
    "--model": dict(help="base model: hub id, folder or .gguf (default: the embedded SmolLM2-135M-Instruct)"),
    "--heads": dict(help="Medusa heads folder or file (default: the demo heads; a Medusa-2 --model holds its own)"),
    "--device": dict(help="auto (default), cpu, cuda or cuda:N"),
    "--dtype": dict(help="auto (default: bf16, or fp16 where bf16 is unsupported, on CUDA; fp32 on CPU), float32, "
                         "bfloat16, float16"),
    "--device-map": dict(choices=["auto"], help="auto: load one model across the visible GPUs (then CPU memory) "
                         "with accelerate's big-model loading, for a model larger than one device; the heads go "
                         "where its last hidden state comes out (instead of --device)"),
    "--attn": dict(choices=["sdpa", "eager"], help="attention implementation (default: the model's)"),
    "--compile": dict(action=argparse.BooleanOptionalAction, default=None, help=COMPILE_HELP),
}


def model_args(*flags: str) -> argparse.ArgumentParser:
    """A parent parser (`parents=[...]`) with these shared flags, so their help cannot drift between commands."""
    p = argparse.ArgumentParser(add_help=False)
    for flag in flags:
        p.add_argument(flag, **SHARED_FLAGS[flag])
    return p
