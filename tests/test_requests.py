"""The long commands' requests (decode, latency, sweep, vllm-check): each checks itself and fills its defaults, and
its errors name a field that the CLI words as its flag and the app as its control; the library's notes and warnings
reach the user through one channel (workbench.warn / workbench.note), never a print of its own."""
from __future__ import annotations

import ast
import warnings
from pathlib import Path

import pytest

from workbench import REPO_ROOT, WorkbenchError, WorkbenchNote, WorkbenchWarning, note, warn
from workbench.core.notes import FieldError, Note, worded
from workbench.decode.request import DecodeRequest
from workbench.export.vllm_check_request import VllmCheckRequest
from workbench.measure.request import DECODER_SIZES, DEFAULT_BUDGETS, LatencyRequest, SweepRequest

pytestmark = pytest.mark.unit


def cli(err: Exception) -> str:
    from workbench.cli.shared import flag_of

    return worded(err, flag_of)


def test_a_field_error_is_worded_by_each_front_end():
    e = FieldError("max_new_tokens", "below_one", "{field} 0: must be >= 1; see {also}", also="batch_sizes")
    assert isinstance(e, WorkbenchError) and e.code == "below_one" and e.field == "max_new_tokens"
    assert str(e) == cli(e) == "--max-new-tokens 0: must be >= 1; see --batch-sizes"
    import pickle

    back = pickle.loads(pickle.dumps(e))  # a worker's error keeps its field and code
    assert (back.field, back.code, str(back)) == (e.field, e.code, str(e))
    assert e.words({"max_new_tokens": "max new tokens"}) == "max new tokens 0: must be >= 1; see --batch-sizes"
    assert worded(ValueError("as it is"), {"x": "y"}) == "as it is"
    assert cli(FieldError("prompt_set", "c", "give {field}")) == "give --prompts FILE|NAME"  # the CLI's exceptions
    n = Note("code", "lower {fix} for {field}", fix="max_new_tokens", field="batch_sizes")
    assert n.words() == "lower --max-new-tokens for --batch-sizes"
    assert n.words({"max_new_tokens": "the length"}) == "lower the length for --batch-sizes"


def test_the_export_warning_is_the_core_note():
    from workbench.export.common import Warn

    assert Warn is Note and Warn("c", "use {fix}", "k").words({"k": "--k N"}) == "use --k N"


def test_the_decode_request_applies_the_acceptance_defaults():
    assert DecodeRequest().rule().kind == "greedy"
    typical = DecodeRequest(temperature=0.5).rule()
    assert (typical.kind, typical.temperature, typical.epsilon) == ("typical", 0.5, 0.09)
    nucleus = DecodeRequest(acceptance="nucleus").rule()
    assert (nucleus.kind, nucleus.temperature, nucleus.top_p) == ("nucleus", 0.7, 0.8)
    assert DecodeRequest(temperature=1.0, top_p=0.5).rule().kind == "nucleus"
    for req, field, code in [(DecodeRequest(acceptance="greedy", temperature=0.5), "temperature", "greedy_temperature"),
                             (DecodeRequest(acceptance="typical", top_p=0.5), "top_p", "unused"),
                             (DecodeRequest(max_new_tokens=0), "max_new_tokens", "below_one"),
                             (DecodeRequest(epsilon=1.5, acceptance="typical"), "epsilon", "out_of_range"),
                             (DecodeRequest(limit=3), "limit", "without_prompt_set"),
                             (DecodeRequest(acceptance="beam"), "acceptance", "unknown")]:
        with pytest.raises(FieldError) as e:
            req.rule()
        assert (e.value.field, e.value.code) == (field, code), e.value
    with pytest.raises(FieldError) as e:
        DecodeRequest(limit=3).rule()
    assert cli(e.value) == "--limit picks the first N of a prompt set: give --prompts FILE|NAME, or drop --limit"
    with pytest.raises(FieldError, match=r"^--top-p, --seed have no effect with acceptance greedy"):
        DecodeRequest(acceptance="greedy", top_p=0.5, seed=1).rule()


def test_the_latency_request_holds_the_mode_defaults_and_rules():
    step = LatencyRequest().resolved()
    assert (step.mode, step.sizes, step.batch_sizes, step.repeats, step.warmup) == \
        ("decoder-step", DECODER_SIZES, (1, 2, 4, 8), 4, 1)
    assert step.step and step.resolved() == step and LatencyRequest().step  # resolving twice changes nothing
    verify = LatencyRequest(context=(64,)).resolved()
    assert not verify.step and verify.resolved() == verify
    assert (verify.mode, verify.sizes[-1], verify.batch_sizes, verify.repeats, verify.warmup) == \
        ("verify", 256, (1,), 10, 3)
    assert LatencyRequest(random_config="tiny", repeats=2).resolved().repeats == 2
    for req, field in [(LatencyRequest(mode="decoder-step", context=(64,)), "mode"),
                       (LatencyRequest(mode="verify", envelope="t.json"), "envelope"),
                       (LatencyRequest(prompts="holdout"), "prompts"),
                       (LatencyRequest(random_config="tiny", own_model=True), "random_config")]:
        with pytest.raises(FieldError) as e:
            req.resolved()
        assert e.value.field == field and str(e.value).startswith("--" + field.replace("_", "-")), e.value
    with pytest.raises(FieldError, match="--prompts holdout needs --calibration DIR"):
        LatencyRequest(prompts="holdout").resolved()


def test_the_sweep_request_holds_its_defaults_and_rules():
    assert SweepRequest().resolved().budgets == DEFAULT_BUDGETS
    assert SweepRequest(trees=("[[0]]",)).resolved().budgets is None
    planned = SweepRequest(plan="p.json", temperature=(0.7,)).resolved([{"batch_size": 1}, {"batch_size": 4}])
    assert (planned.batch_sizes, planned.temperature, planned.budgets) == ((1, 4), (0.0,), None)
    for req, field in [(SweepRequest(plan="p.json", batch_sizes=(2,)), "plan"),
                       (SweepRequest(plan="p.json", envelope="t.json"), "plan"),
                       (SweepRequest(trees=("[[0]]",), joint=True), "joint"),
                       (SweepRequest(trees=("[[0]]",), replay=True), "replay"),
                       (SweepRequest(epsilon=(0.0,)), "epsilon")]:
        with pytest.raises(FieldError) as e:
            req.resolved([])
        assert e.value.field == field, e.value
    with pytest.raises(FieldError) as e:
        SweepRequest(batch_sizes=(1, 8)).check_prompts(4)
    assert cli(e.value) == ("--batch-sizes 1,8: batch 8 but 4 prompts: lower the batch size or give more prompts "
                            "(--limit)")
    with pytest.raises(FieldError, match=r"^--epsilon 0: every epsilon"):
        SweepRequest(epsilon=(0.0,)).resolved()


def test_the_vllm_check_request_checks_itself():
    assert VllmCheckRequest().checked().k == (1, 2, 3, 4)
    with pytest.raises(FieldError, match="^--max-new-tokens 0: must be positive"):
        VllmCheckRequest(max_new_tokens=0).checked()
    with pytest.raises(FieldError, match="^--limit 0: must be positive"):
        VllmCheckRequest(limit=0).checked()


def test_notes_and_warnings_go_through_the_one_channel(capsys):
    from workbench.cli.shared import cli_warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        note("resuming: 1 piece")
        warn("the machine was busy")
    assert [(w.category, str(w.message)) for w in caught] == [(WorkbenchNote, "resuming: 1 piece"),
                                                               (WorkbenchWarning, "the machine was busy")]
    assert capsys.readouterr().err == ""  # nothing printed by the library itself
    with cli_warnings():
        note("resuming: 1 piece")
        note("resuming: 1 piece")  # progress lines repeat: each shown
        warn("the machine was busy")
    assert capsys.readouterr().err.splitlines() == ["resuming: 1 piece", "resuming: 1 piece",
                                                    "warning: the machine was busy"]


def test_no_library_module_prints_to_stderr():
    """The front ends (cli/, ui/) word what the library says; the library says it through workbench.warn/note."""
    found = []
    for f in sorted((REPO_ROOT / "workbench").rglob("*.py")):
        if {"cli", "ui"} & set(f.relative_to(REPO_ROOT / "workbench").parts[:1]):
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "stderr" and \
                    isinstance(node.value, ast.Name) and node.value.id == "sys":
                found.append(f"{Path(f).relative_to(REPO_ROOT)}:{node.lineno}")
    assert not found, found
