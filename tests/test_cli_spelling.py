"""One spelling per CLI concept: --batch-sizes for serving batch sizes, --gen-batch for generation chunking, --table
only for an output, train-heads' flags in one unit whatever the recipe; the old spellings refused with one line
naming the new one (exit 2), before any file or model is read."""
import argparse

import pytest

from workbench.cli import OUTPUTS, build_parser, main

pytestmark = pytest.mark.unit

OLD = [  # (argv, the line it gets)
    (["latency", "--batch", "1,2"], "--batch: this flag is now --batch-sizes B1,B2,.."),
    (["latency", "--table", "lat.csv"], "--table: this flag is now --out FILE"),
    (["decode", "--tree", "mc_sim_7b_63", "--prompt", "hi", "--batch", "2"], "--batch: this flag is now --batch-sizes B"),
    (["optimize", "--accuracies", "a.csv", "--batch-size", "2"], "--batch-size: this flag is now --batch-sizes B"),
    (["export", "plan.json", "--format", "vllm", "--batch-size", "2"], "--batch-size: this flag is now --batch-sizes B"),
    (["calibrate", "--batch-size", "4"], "--batch-size: this flag is now --gen-batch N"),
    (["eval-heads", "--medusa2", "m", "--batch-size", "4"], "--batch-size: this flag is now --gen-batch N"),
    (["train-heads", "--batch-size", "4"], "--batch-size: this flag is now --positions-per-step N (medusa-1) or "
                                           "--sequences-per-step N (medusa-2)"),
    (["train-heads", "--recipe", "medusa-2", "--lr", "1e-4"], "--lr: this flag is now --heads-lr LR"),
    (["train-heads", "--recipe", "medusa-2", "--positions-per-step", "8"],
     "--positions-per-step: medusa-1 only; --recipe medusa-2 takes --sequences-per-step, --adapter-lr"),
    (["train-heads", "--sequences-per-step", "8"], "--sequences-per-step: medusa-2 only; --recipe medusa-1 takes "
                                                   "--positions-per-step"),
    (["train-heads", "--adapter-lr", "1e-4"], "--adapter-lr: medusa-2 only"),
]


@pytest.mark.parametrize("argv,line", OLD, ids=[" ".join(a[:1] + a[-2:-1]) for a, _ in OLD])
def test_an_old_spelling_is_one_line_naming_the_new_one(argv, line, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing the argv names exists: the refusal comes before any read
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: " + line), err


def _flags():
    """(command, flag, help) of every visible flag of every command and subcommand."""
    def walk(parser, name):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, p in action.choices.items():
                    yield from walk(p, f"{name} {sub}".strip())
            elif action.help != argparse.SUPPRESS:
                for flag in action.option_strings:
                    yield name, flag, action
    return list(walk(build_parser(), ""))


def test_every_command_spells_each_concept_one_way():
    flags = _flags()
    assert not [(c, f) for c, f, _ in flags if f in ("--batch", "--batch-size", "--lr")]
    batches = {c for c, f, _ in flags if f == "--batch-sizes"}
    assert {"latency", "plan", "sweep", "decode", "optimize", "export", "vllm-check"} <= batches
    assert {c for c, f, _ in flags if f == "--gen-batch"} >= {"calibrate", "train-heads", "eval-heads"}
    tables = [(c, a.dest) for c, f, a in flags if f == "--table"]
    assert tables and all(dest in OUTPUTS for _, dest in tables)  # --table names what a command writes
    training = {f for c, f, _ in flags if c == "train-heads"}  # a training batch in each recipe's own unit
    assert {"--positions-per-step", "--sequences-per-step", "--heads-lr", "--adapter-lr"} <= training
