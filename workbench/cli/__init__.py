"""`workbench` command line: the parser and the entry point; bad input -> `error: ...`, exit status 2.

A thin argparse layer over the package, one module per command group: trees.py (tree, optimize, export),
heads.py (calibrate, decode, train-heads), tradeoffs.py (latency, sweep, sweep-report); shared.py holds the
flags, flag parsers and output helpers they share.
"""
from __future__ import annotations

import argparse
import sys
import warnings

from workbench import WorkbenchError, __version__
from workbench.cli.heads import add_calibrate, add_decode, add_train_heads
from workbench.cli.tradeoffs import add_tradeoffs
from workbench.cli.trees import add_tree
from workbench.cli.vllm import add_vllm_check


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="workbench", description="Design, calibrate and validate Medusa decoding trees.")
    p.add_argument("--version", action="version", version=f"workbench {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # in the order a user meets them: trees, calibration, live decoding, trade-offs, training new heads
    add_tree(sub)  # tree / optimize / export
    add_calibrate(sub)
    add_decode(sub)
    add_tradeoffs(sub)  # latency / sweep / sweep-report
    add_train_heads(sub)
    add_vllm_check(sub)  # the plan confirmed in vLLM
    return p


def main(argv: list[str] | None = None) -> int:
    warnings.simplefilter("default")
    try:
        args = build_parser().parse_args(argv)  # inside: a renamed flag is a WorkbenchError too
        return int(args.func(args) or 0)
    except WorkbenchError as e:
        print("error: " + " ".join(str(e).splitlines()), file=sys.stderr)  # one line, whatever a library said
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `workbench ... | head`
        sys.stderr.close()
        return 0
