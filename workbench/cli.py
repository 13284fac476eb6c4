"""`workbench` command line: a thin argparse layer over the package. Bad input -> `error: ...`, exit status 2."""
from __future__ import annotations

import argparse
import json
import sys
import warnings

from workbench import WorkbenchError, __version__


def _emit(obj, out: str | None) -> None:
    """JSON to --out (atomically) or stdout."""
    text = json.dumps(obj, indent=2) + "\n"
    if out:
        from workbench.io import atomic_write_text
        atomic_write_text(out, text)
    else:
        sys.stdout.write(text)


# ==== tree / optimize / export commands (issue: tree core) ====================================================

# ==== decode (issue: live decoder) ============================================================================

# ==== train-heads (issue: demo heads) =========================================================================

# ==== calibrate (issue: calibration) ==========================================================================

# ==== latency / sweep (issue: trade-offs) =====================================================================


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="workbench", description="Design, calibrate and validate Medusa decoding trees.")
    p.add_argument("--version", action="version", version=f"workbench {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # ---- subcommand registrations (one block per command group) ----
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    warnings.simplefilter("default")
    try:
        return int(args.func(args) or 0)
    except WorkbenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
