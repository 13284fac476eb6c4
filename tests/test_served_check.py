"""`vllm-check --calibration SERVED --plan`: a plan for vLLM's n-gram drafter checked against vLLM, without vLLM: a
stand-in worker in mode "generate" serves each K at a known cost beside a plain engine of its own (one process per
n-gram K: vllm_runner.engine_groups), so the plan's predicted speedup, the measured one, vLLM's best K, the outputs'
comparison and the held-out prompts can be checked by hand. The real run is the `vllm`-marked test at the end."""
import json
import os
import sys
from pathlib import Path

import pandas as pd
import pytest

from workbench.calibrate.served import ServedCounts, write_served
from workbench.cli import main
from workbench.core.data import load_prompt_records
from workbench.core.speed import served_tokens_per_step
from workbench.export.engines import export_plan
from workbench.export.vllm_served_check import served_records
from workbench.calibrate.served import Served
from workbench import WorkbenchError
from workbench.core.notes import FieldError
from workbench.measure.latency_file import LATENCY_VERSION
from workbench.measure.vllm_runner import draft_folder
from workbench.plan.plan_file import read_plan

HELD = ["rewrite-03", "extract-05", "summarise-02", "summarise-07", "code-04", "code-08"]
SURFACE_IDS = ["rewrite-01", "summarise-02"]  # one held out: the check must leave it out too
DECODE = {0: 1.0, 1: 0.7, 2: 0.9}  # seconds of a pass's decoding steps by K (batch 1); batch B: K > 0 x (1 + B / 4)

STANDIN = '''#!{python}
"""vLLM's worker in mode "generate": per engine and batch size, `repeats` passes whose decoding takes DECODE[K] s
(x (1 + B / 4) for K > 0; the whole process x STANDIN_SLOW_K<K> where its largest K is K); outputs are the prompts
echoed, but K = 2 changes the last token of the last prompt at batch 2; STANDIN_NO_DRAFTS: nothing drafted. Asked
to serve "steady" (B kept in flight), a K > 0 engine's busy steps emit 10 tokens a prompt where plain's emit 8. Logs
each request's K per engine (STANDIN_LOG) and, with STANDIN_SPECS, its --speculative-configs."""
import json, os, sys
if sys.argv[1:2] == ["-c"]:
    print("vllm")
    sys.exit(0)
DECODE = {decode}
req = json.loads(sys.stdin.read())
assert req["mode"] == "generate"
ks = [e["num_speculative_tokens"] if e else 0 for e in req["engines"]]
with open(os.environ["STANDIN_LOG"], "a") as f:
    f.write(json.dumps(ks) + "\\n")
if os.environ.get("STANDIN_SPECS"):
    with open(os.environ["STANDIN_SPECS"], "a") as f:
        f.write(json.dumps(req["engines"]) + "\\n")
slow = float(os.environ.get("STANDIN_SLOW_K%d" % max(ks), 1))
n, steady = len(req["prompts"]), bool(req.get("steady"))
for b in req["batch_sizes"]:
    engines = []
    for k in ks:
        dec = DECODE[str(k)] * ((1 + b / 4) if k else 1) * slow
        busy = (10 if k and steady else 8) * n
        passes = [dict(seconds=dec + 0.5, decode_seconds=dec * (1 + 0.02 * p), decode_tokens=busy)
                  for p in range(req["repeats"])]
        outputs = [list(p[-3:]) for p in req["prompts"]]
        if k == 2 and b == 2:
            outputs[-1][-1] += 1
        run = dict(batch_size=b, seconds=dec + 0.5, decode_seconds=dec, passes=passes, new_tokens=9 * n,
                   outputs=outputs, steps=[None] * n, num_drafts=3 * n if k else 0, num_draft_tokens=3 * n * k,
                   num_accepted_tokens=2 * n if k else 0, accepted_per_pos=[[], [2 * n], [n, n]][k])
        if steady:
            run.update(steady=True, served_tokens=9 * n)
        if os.environ.get("STANDIN_NO_DRAFTS"):
            run.update(num_drafts=0, num_draft_tokens=0, num_accepted_tokens=0, accepted_per_pos=[])
        engines.append(dict(vllm_version="0.32.0", startup_s=1.0, run=run,
                            worker=dict(threads=2, compilation="NONE" if req["eager"] else "DYNAMO_TRACE_ONCE")))
    print(json.dumps(dict(event="batch", batch_size=b, engines=engines)), flush=True)
print(json.dumps(dict(event="done")), flush=True)
'''


@pytest.fixture
def served(tmp_path):
    """A served n-gram calibration of copy-edit at K = 3 that held HELD out and served the rest."""
    ids = [r[0] for r in load_prompt_records("copy-edit")]
    counts = ServedCounts(3, 100, 300, 150, (70, 50, 30), 400)
    return write_served(tmp_path / "served", counts, dict(
        engine="vllm", engine_version="0.32.0", method="ngram", model="m", prompts="copy-edit", limit=None,
        holdout_ids=HELD, source="calibrate", speculative_config=dict(method="ngram", num_speculative_tokens=3),
        setting=dict(prompt_ids=[i for i in ids if i not in HELD])))


def _surface(tmp_path) -> Path:
    """vLLM rounds whose relative cost by K makes K = 2 best at batch 1 and K = 1 at batch 2."""
    cost = {1: {0: 1.0, 1: 1.05, 2: 1.1}, 2: {0: 1.0, 1: 1.2, 2: 1.5}}
    rows = [dict(model="m", device="cpu", dtype="float32", batch=b, context=30, tokens=k + 1, seconds=0.01 * c,
                 seconds_min=0.0098 * c, seconds_q1=0.0099 * c, seconds_q3=0.0101 * c, seconds_max=0.0102 * c,
                 repeats=3, setting=json.dumps(dict(mode="vllm-round", prompt_ids=SURFACE_IDS)), engine="vllm",
                 engine_version="0.32.0", context_min=20, context_max=40, version=LATENCY_VERSION)
            for b, ks in cost.items() for k, c in ks.items()]
    pd.DataFrame(rows).to_csv(tmp_path / "lat.csv", index=False)
    return tmp_path / "lat.csv"


@pytest.mark.unit
def test_the_check_serves_only_prompts_neither_the_calibration_nor_the_surface_served(served):
    s = Served(served)
    records, left_out = served_records(s, "holdout", None, SURFACE_IDS)
    assert [r[0] for r in records] == [i for i in HELD if i not in SURFACE_IDS] and left_out == 1
    records, left_out = served_records(s, "copy-edit", 2, [])  # a named set: the calibration's own prompts left out
    assert [r[0] for r in records] == HELD[:2] and left_out == 128 - len(HELD)
    with pytest.raises(Exception, match="every holdout prompt"):
        served_records(s, "holdout", None, HELD)
    assert served_tokens_per_step(50, 5, 10) == pytest.approx(45 / 35)


class _Engine:
    """Stands in for vLLM's LLMEngine step loop: a request's first step emits 1 token (its prefill), each later one
    as many as its prompt's first id says (a drafter's accepted run), up to LENGTH; finished requests leave."""
    LENGTH = 8

    def __init__(self):
        self.live, self.most = {}, 0

    def add_request(self, rid, prompt, params):
        self.live[rid] = (prompt["prompt_token_ids"], [])

    def has_unfinished_requests(self):
        return bool(self.live)

    def step(self):
        from types import SimpleNamespace

        self.most, outs = max(self.most, len(self.live)), []
        for rid, (p, toks) in list(self.live.items()):
            toks += [p[0]] * min(1 if not toks else p[0], self.LENGTH - len(toks))
            done = len(toks) == self.LENGTH
            outs.append(SimpleNamespace(request_id=rid, outputs=[SimpleNamespace(token_ids=list(toks))], finished=done))
            if done:
                del self.live[rid]
        return outs


@pytest.mark.unit
def test_a_steady_pass_keeps_b_in_flight_and_times_only_the_steps_where_all_b_decode(monkeypatch):
    """vllm_worker.serve_steady, on a stand-in engine (prompts drafting 1, 2 and 4 tokens a step, 8 tokens each):
    max(3, 2 x 2) = 4 sequences, never more than 2 in flight, a finished one replaced at once; the busy steps (2 in
    flight, both past their prefill) are counted by hand below; the newcomer's prefill step and the lone tail are
    not; outputs are each prompt's first sequence's, in order."""
    import types
    from types import SimpleNamespace

    from workbench.measure import vllm_worker as W

    fake = types.ModuleType("vllm.inputs")
    fake.TokensPrompt = dict
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    monkeypatch.setitem(sys.modules, "vllm.inputs", fake)
    engine = _Engine()
    steps, outs = W.serve_steady(SimpleNamespace(llm_engine=engine), [[1], [2], [4]], 2, 4, None)
    # seq 0 (1/step) and seq 1 (2/step): prefill, then busy 1+2 x3, 1+1 (seq 1 done at 8); seq 2 (4/step) joins:
    # its prefill (not busy), busy 1+4, 1+3 (both done); seq 3 (prompt 0) alone for 8 steps (not busy)
    assert [s["tokens"] for s in steps if s["busy"]] == [3, 3, 3, 2, 5, 4]
    assert sum(s["tokens"] for s in steps) == 32 and len(steps) == 16 and engine.most == 2
    assert [list(o.token_ids) for o in outs] == [[1] * 8, [2] * 8, [4] * 8]
    done = W.generate_pass(SimpleNamespace(llm_engine=_Engine()), [[1], [2], [4]], 2, None, True, steady=True)
    assert (done["decode_tokens"], done["served_tokens"], len(done["outputs"])) == (20, 32, 3)
    run = W.generate_run(done, [done], 2, steady=True)
    assert run["steady"] and run["new_tokens"] == 24 and run["served_tokens"] == 32


def test_a_served_calibration_holds_prompts_out_as_ours_does(tiny_llama, tmp_path, monkeypatch, capsys):
    """calibrate --engine vllm --holdout: the held-out share (ours: the smallest sha256 ids) is never served and is
    named in meta.json; a read of counts already made (--metrics) has no prompts to hold out: one error line."""
    py = tmp_path / "python"
    py.write_text(STANDIN.format(python=sys.executable, decode={str(k): v for k, v in DECODE.items()}))
    py.chmod(0o755)
    monkeypatch.setenv("STANDIN_LOG", str(tmp_path / "asked.jsonl"))
    out = tmp_path / "cal"
    assert main(["calibrate", "--engine", "vllm", "--method", "ngram", "--k", "2", "--vllm-python", str(py),
                 "--model", str(tiny_llama.model_dir), "--prompts", "copy-edit", "--limit", "8", "--holdout", "0.5",
                 "--max-new-tokens", "8", "--out", str(out)]) == 0, capsys.readouterr().err
    s = Served(out)
    asked = [json.loads(line) for line in (tmp_path / "asked.jsonl").read_text().splitlines()]
    assert asked == [[1], [2]]  # each K served in its own run, an n-gram engine alone in its process
    # each K's own counts (the stand-in's, over the 4 served prompts), K = 1 beside the largest
    assert {k: (c.drafts, c.draft_tokens, c.accepted, c.per_pos, c.decode_steps) for k, c in s.per_k.items()} == {
        1: (12, 12, 8, (8,), 36 - 8 - 4), 2: (12, 24, 8, (4, 4), 36 - 8 - 4)}
    held, served_ids = s.meta["holdout_ids"], s.served_prompt_ids()
    first8 = [r[0] for r in load_prompt_records("copy-edit", 8)]
    assert len(held) == 4 and sorted(held + served_ids) == sorted(first8) and s.meta["num_prompts"] == 4
    assert [r[0] for r in s.holdout_prompts()] == [i for i in first8 if i in held]
    monkeypatch.setenv("STANDIN_NO_DRAFTS", "1")  # prompts on which the n-gram drafter found nothing to propose
    capsys.readouterr()
    assert main(["calibrate", "--engine", "vllm", "--method", "ngram", "--k", "2", "--vllm-python", str(py),
                 "--model", str(tiny_llama.model_dir), "--prompts", "copy-edit", "--limit", "3",
                 "--max-new-tokens", "8", "--out", str(tmp_path / "none")]) == 2  # 3 prompts, 1 held out
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the model's loading bar
    assert err.startswith("error: vLLM serving ngram at K=1 drafted nothing on 2 prompts") and "--max-new-tokens" in err
    assert not (tmp_path / "none").exists()
    assert main(["calibrate", "--metrics", str(Path(__file__).parent / "data" / "served" / "ngram-after.prom"),
                 "--method", "ngram", "--holdout", "0.3", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --holdout: for our heads' calibration") and len(err.strip().splitlines()) == 1


def test_vllm_check_of_a_served_ngram_plan(tiny_llama, served, tmp_path, monkeypatch, capsys):
    py = tmp_path / "python"
    py.write_text(STANDIN.format(python=sys.executable, decode={str(k): v for k, v in DECODE.items()}))
    py.chmod(0o755)
    monkeypatch.setenv("STANDIN_LOG", str(tmp_path / "asked.jsonl"))
    monkeypatch.setenv("STANDIN_SLOW_K2", "1.5")  # K = 2's process runs slower throughout: priced on its own plain
    plan = tmp_path / "plan.json"
    assert main(["plan", "--calibration", str(served), "--latency", str(_surface(tmp_path)), "--batch-sizes", "1,2",
                 "--out", str(plan)]) == 0
    p = read_plan(plan)
    predicted = {r["batch_size"]: {c["k"]: c["predicted_speedup"] for c in a["chains"]}
                 for r, a in zip(p["plans"], p["alternatives"])}
    out = tmp_path / "check.json"
    capsys.readouterr()
    assert main(["vllm-check", "--calibration", str(served), "--plan", str(plan), "--vllm-python", str(py),
                 "--model", str(tiny_llama.model_dir), "--raw", "--k", "1,2", "--batch-sizes", "1,2",
                 "--max-new-tokens", "8", "--repeats", "3", "--out", str(out)]) == 0, capsys.readouterr().err
    asked = [json.loads(line) for line in (tmp_path / "asked.jsonl").read_text().splitlines()]
    assert asked == [[0, 1], [0, 2]]  # one process per n-gram K, each with its own plain engine
    res = json.loads(out.read_text())
    assert res["prompt_ids"] == [i for i in HELD if i not in SURFACE_IDS] and res["surface_prompts_left_out"] == 1
    assert res["drafter"] == {"method": "ngram"} and res["priced_on"]["engine"] == "vllm"
    n = len(res["prompt_ids"])
    rates = [70 / 400, 50 / 400, 30 / 400]  # per decoding step
    for r in res["acceptance"]:
        assert r["predicted"] == pytest.approx(1 + sum(rates[:r["k"]]))
        assert r["vllm_tokens_per_step"] == pytest.approx(8 * n / (6 * n))
        assert all(c["identical"] == n for c in r["plain_vs_first_plain"].values())
    same = {r["k"]: {int(b): c["identical"] for b, c in r["vllm_spec_vs_vllm_plain"].items()} for r in res["acceptance"]}
    assert same == {1: {1: n, 2: n}, 2: {1: n, 2: n - 1}}  # the one changed token is caught
    assert [[p["tokens"] for p in r["per_prompt"]] for r in res["acceptance"]] == [[3] * n] * 2
    for s in res["speed"]:  # each K against its own process's plain engine: the slow process cancels; served steady,
        b, k = s["batch_size"], s["k"]  # the busy steps' tokens per second
        by_hand = DECODE[0] / (DECODE[k] * (1 + b / 4)) * 10 / 8
        assert s["decode_speedup"] == pytest.approx(by_hand, rel=1e-9) and s["passes"] == 3
        assert s["predicted_speedup"] == pytest.approx(predicted[b][k])
    for r in res["plan_check"]:
        b, k = r["batch_size"], r["plan_k"]
        measured = {kk: DECODE[0] / (DECODE[kk] * (1 + b / 4)) * 10 / 8 for kk in (1, 2)} | {0: 1.0}
        assert k == max(predicted[b], key=predicted[b].get)
        assert r["predicted_speedup"] == pytest.approx(predicted[b][k])
        assert r["error"] == pytest.approx(predicted[b][k] / measured[k] - 1)
        assert r["best_k"] == max(measured, key=measured.get)
    table = capsys.readouterr().out
    assert "| batch | plan's K | predicted |" in table and "B2: 2/3" not in table
    # the Medusa decoder's flags are refused for a served calibration, in one line
    assert main(["vllm-check", "--calibration", str(served), "--vllm-python", str(py), "--heads", "x",
                 "--out", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --heads: our Medusa decoder's") and len(err.strip().splitlines()) == 1
    # K past what the calibration counted
    assert main(["vllm-check", "--calibration", str(served), "--vllm-python", str(py), "--k", "4",
                 "--model", str(tiny_llama.model_dir), "--out", str(tmp_path / "x.json")]) == 2
    assert "K 4: the calibration served ngram at K=3" in capsys.readouterr().err


@pytest.mark.unit
def test_a_draft_models_folder_is_checked_before_vllm_loads_it(tmp_path):
    """draft_folder: a model folder with a readable config.json, its vocabulary the target's for draft_model (vLLM
    0.32 refuses another only once its engine starts); EAGLE heads keep their own; the path written absolute."""
    target, draft = tmp_path / "target", tmp_path / "draft"
    for folder, cfg in ((target, {"vocab_size": 49152}), (draft, {"text_config": {"vocab_size": 49152}})):
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(cfg))
    assert draft_folder(draft, "draft_model", target) == str(draft.resolve())
    cases = {"missing": (tmp_path / "none", "no_draft_model", "--draft-model {}: no such folder: draft_model drafts "
                                                                "with a model folder"),
             "empty": (tmp_path / "empty", "no_draft_model", "--draft-model {}: no config.json in it")}
    (tmp_path / "empty").mkdir()
    for name, (folder, code, text) in cases.items():
        with pytest.raises(FieldError) as e:
            draft_folder(folder, "draft_model", target)
        assert e.value.code == code and str(e.value).startswith(text.format(folder)), name
    (draft / "config.json").write_text('{"vocab_size": 32000}')
    with pytest.raises(FieldError, match="a vocabulary of 32000 tokens, the model's has 49152") as e:
        draft_folder(draft, "draft_model", target)
    assert e.value.code == "draft_vocab"
    assert draft_folder(draft, "eagle3", target) == str(draft.resolve())  # EAGLE heads map their own vocabulary
    assert draft_folder(draft, "draft_model") == str(draft.resolve())  # the target not known yet: the folder only
    with pytest.raises(FieldError, match=r"^--calibration c: its drafter's weights .*: a vocabulary of 32000"):
        draft_folder(draft, "draft_model", target, "calibration", "c: its drafter's weights")
    (draft / "config.json").write_text("{not json")
    with pytest.raises(WorkbenchError, match="config.json is not readable JSON"):
        draft_folder(draft, "draft_model", target)


def test_a_draft_model_calibration_names_its_drafter_and_bad_ones_are_one_line(tiny_llama, tmp_path, monkeypatch,
                                                                               capsys):
    """calibrate --engine vllm --method draft_model: vLLM is asked for the drafter's folder, absolute, and the
    calibration records it (vllm-check serves it again from there, and says so where it is gone); a missing folder
    or another vocabulary is one error line before vLLM starts; latency's --draft-model without --method too."""
    py = tmp_path / "python"
    py.write_text(STANDIN.format(python=sys.executable, decode={str(k): v for k, v in DECODE.items()}))
    py.chmod(0o755)
    log, specs = tmp_path / "asked.jsonl", tmp_path / "specs.jsonl"
    monkeypatch.setenv("STANDIN_LOG", str(log))
    monkeypatch.setenv("STANDIN_SPECS", str(specs))
    base = ["calibrate", "--engine", "vllm", "--method", "draft_model", "--k", "2", "--vllm-python", str(py),
            "--model", str(tiny_llama.model_dir), "--prompts", "copy-edit", "--limit", "4", "--max-new-tokens", "8"]
    draft = tmp_path / "draft"  # the stand-in loads nothing: the model's config.json makes it a draft of its size
    draft.mkdir()
    (draft / "config.json").write_text((tiny_llama.model_dir / "config.json").read_text())
    assert main([*base, "--draft-model", str(draft), "--out", str(tmp_path / "cal")]) == 0, capsys.readouterr().err
    drafter = {"method": "draft_model", "model": str(draft.resolve())}
    # each K = 1..2 served (a draft model's engines share one process: only n-gram needs one each)
    assert json.loads(specs.read_text()) == [dict(drafter, num_speculative_tokens=k) for k in (1, 2)]
    s = Served(tmp_path / "cal")
    assert s.meta["draft_model"] == drafter["model"] and s.meta["speculative_config"]["model"] == drafter["model"]
    (draft / "config.json").unlink()
    draft.rmdir()  # vllm-check serves the calibration's drafter again: gone, it says so before vLLM starts
    capsys.readouterr()
    assert main(["vllm-check", "--calibration", str(tmp_path / "cal"), "--vllm-python", str(py), "--k", "1,2",
                 "--model", str(tiny_llama.model_dir), "--out", str(tmp_path / "check.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: --calibration {tmp_path / 'cal'}: its drafter's weights {draft.resolve()}: no such "
                   "folder: draft_model drafts with a model folder vLLM loads (config.json and weights, e.g. a "
                   "smaller model of the target's family)"]
    vocab = json.loads((tiny_llama.model_dir / "config.json").read_text())["vocab_size"]
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"vocab_size": vocab + 1}))
    for folder, want in ((tmp_path / "gone", "no such folder"),
                         (other, f"a vocabulary of {vocab + 1} tokens, the model's has {vocab}")):
        capsys.readouterr()
        assert main([*base, "--draft-model", str(folder), "--out", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]  # after the model's loading bar
        assert err.startswith(f"error: --draft-model {folder}: ") and want in err, err
        assert not (tmp_path / "o").exists()
    assert main(["latency", "--engine", "vllm", "--draft-model", str(tiny_llama.model_dir), "--vllm-python",
                 str(py), "--out", str(tmp_path / "o.csv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: --draft-model names a drafter's weights: give --method too (its drafter: draft_model, "
                   "eagle3, ...)"]
    assert len(log.read_text().splitlines()) == 1  # vLLM was asked once: for the good folder


# ----------------------------------------------------------------------------------------------- in vLLM itself

VLLM_PY = os.environ.get("WORKBENCH_VLLM_PYTHON")


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.skipif(not VLLM_PY, reason="no vLLM environment: set WORKBENCH_VLLM_PYTHON")
def test_served_ngram_calibration_surface_plan_and_check_in_vllm(tmp_path, capsys):
    """calibrate --engine vllm --method ngram (holding prompts out) -> latency --engine vllm --method ngram at two
    K (one process each) -> plan at batch 1, 2 -> vllm-check --plan on held-out prompts: lossless, and the plan's
    prediction beside vLLM's measurement (sizes too small for the speeds to mean anything)."""
    cal, lat, plan, check = (tmp_path / n for n in ("cal", "lat.csv", "plan.json", "check.json"))
    assert main(["calibrate", "--engine", "vllm", "--method", "ngram", "--k", "2", "--prompts", "copy-edit",
                 "--limit", "8", "--holdout", "0.5", "--max-new-tokens", "24", "--out", str(cal)]) == 0
    s = Served(cal)
    assert len(s.meta["holdout_ids"]) == 4 and not set(s.meta["holdout_ids"]) & set(s.served_prompt_ids())
    assert main(["latency", "--engine", "vllm", "--method", "ngram", "--k", "1,2", "--batch-sizes", "1,2",
                 "--prompts", "copy-edit", "--limit", "2", "--repeats", "1", "--warmup", "0",
                 "--max-new-tokens", "16", "--vllm-eager", "--out", str(lat)]) == 0, capsys.readouterr().err[-2000:]
    assert main(["plan", "--calibration", str(cal), "--latency", str(lat), "--batch-sizes", "1,2",
                 "--out", str(plan)]) == 0
    rc = main(["vllm-check", "--calibration", str(cal), "--plan", str(plan), "--k", "1,2", "--batch-sizes", "1,2",
               "--limit", "2", "--max-new-tokens", "16", "--repeats", "1", "--vllm-eager", "--out", str(check)])
    assert rc == 0, capsys.readouterr().err[-2000:]
    res = json.loads(check.read_text())
    assert set(res["prompt_ids"]) <= set(s.meta["holdout_ids"]) and res["vllm_version"] == "0.32.0"
    for r in res["acceptance"]:  # lossless: every K's greedy text is plain vLLM's, at every batch size
        for c in list(r["vllm_spec_vs_vllm_plain"].values()) + list(r["plain_vs_first_plain"].values()):
            assert c["identical"] == c["prompts"], r
    assert [r["batch_size"] for r in res["plan_check"]] == [1, 2]
    for r in res["plan_check"]:
        assert r["predicted_speedup"] > 0 and r["measured_speedup"] > 0 and r["best_k"] in (0, 1, 2)


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.skipif(not VLLM_PY, reason="no vLLM environment: set WORKBENCH_VLLM_PYTHON")
def test_served_draft_model_calibration_plan_and_check_in_vllm(tmp_path, capsys):
    """calibrate --engine vllm --method draft_model with the demo model as its own draft (same tokenizer: vLLM takes
    it; fp32 greedy: it proposes what the target emits) -> plan on a surface -> vllm-check --plan on held-out prompts:
    vLLM's counters written with their counts and acceptance near 1, the plan's K served in vLLM, greedy outputs
    equal to plain vLLM's (sizes too small for the speeds to mean anything)."""
    from workbench.runtime.models import demo_model_dir

    draft = str(demo_model_dir())
    cal, plan, check = tmp_path / "cal", tmp_path / "plan.json", tmp_path / "check.json"
    assert main(["calibrate", "--engine", "vllm", "--method", "draft_model", "--draft-model", draft, "--k", "2",
                 "--prompts", "copy-edit", "--limit", "6", "--holdout", "0.5", "--max-new-tokens", "16",
                 "--out", str(cal)]) == 0, capsys.readouterr().err[-2000:]
    s = Served(cal)
    assert s.meta["method"] == "draft_model" and s.meta["draft_model"] == draft and s.counts.k == 2
    table = pd.read_csv(cal / "acceptance.csv")
    assert table["drafts"].tolist() == [s.counts.drafts, s.counts.per_pos[0]] and s.counts.drafts >= 3
    assert s.counts.accepted >= 0.9 * s.counts.draft_tokens  # its own draft: near-total acceptance
    surface = pd.DataFrame([dict(model="m", device="cpu", dtype="float32", batch=b, context=60, tokens=k + 1,
                                 seconds=t, seconds_min=t * 0.96, seconds_q1=t * 0.98, seconds_q3=t * 1.02,
                                 seconds_max=t * 1.04, repeats=3)
                            for b in (1, 2) for k in (0, 1, 2) for t in [0.01 * (1 + 0.3 * k)]])
    surface.to_csv(tmp_path / "lat.csv", index=False)
    assert main(["plan", "--calibration", str(cal), "--latency", str(tmp_path / "lat.csv"), "--batch-sizes", "1,2",
                 "--out", str(plan)]) == 0
    cfg = json.loads(export_plan(read_plan(plan), "vllm")[0])
    assert cfg["method"] == "draft_model" and cfg["model"] == draft and cfg["num_speculative_tokens"] in (1, 2)
    rc = main(["vllm-check", "--calibration", str(cal), "--plan", str(plan), "--k", "1,2", "--batch-sizes", "1,2",
               "--limit", "2", "--max-new-tokens", "16", "--repeats", "1", "--vllm-eager", "--out", str(check)])
    assert rc == 0, capsys.readouterr().err[-2000:]
    res = json.loads(check.read_text())
    assert set(res["prompt_ids"]) <= set(s.meta["holdout_ids"]) and res["drafter"] == {"method": "draft_model",
                                                                                       "model": draft}
    for r in res["acceptance"]:  # lossless: every K's greedy text is plain vLLM's, at every batch size
        assert r["vllm_drafts"] > 0 and r["vllm_tokens_per_step"] > 1.5, r
        for c in list(r["vllm_spec_vs_vllm_plain"].values()) + list(r["plain_vs_first_plain"].values()):
            assert c["identical"] == c["prompts"], r
    assert [r["batch_size"] for r in res["plan_check"]] == [1, 2] and all(r["plan_k"] in (1, 2)
                                                                         for r in res["plan_check"])
