"""Served calibrations (workbench/calibrate/served.py): vLLM's own spec-decode counters read from a real `/metrics`
scrape (tests/data/served/, recorded by record_metrics.sh from vLLM 0.32.0 serving the n-gram drafter) or from its
per-request statistics, written as a calibration of kind "served", planned from and exported (schedules for vLLM
and TensorRT-LLM, a speculation profile); bad input one error line each. A vLLM run (`calibrate --engine vllm`) and
vLLM's own SpeculativeConfig reading the exports are in the `vllm`-marked tests at the end."""
import json
import os
import re
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from workbench import WorkbenchError
from workbench.calibrate.served import Served
from workbench.calibrate.served_read import request_counts
from workbench.cli import main
from workbench.core.data import load_prompt_records
from workbench.export.engines import export_plan
from workbench.export.profile import speculation_profile
from workbench.plan.plan_file import read_plan
from workbench.plan.source import plan_source
from workbench.trees.tree import chain_tree

DATA = Path(__file__).parent / "data" / "served"
BEFORE, AFTER = DATA / "ngram-before.prom", DATA / "ngram-after.prom"
SPEC = re.compile(r'^vllm:spec_decode_(\w+)_total\{[^}]*?(?:position="(\d+)")?\}\s+(\S+)$')


def counters(path: Path) -> dict:
    """The scrape's spec-decode counters read independently of the reader under test (a plain regex)."""
    out = {}
    for line in path.read_text().splitlines():
        m = SPEC.match(line)
        if m:
            out[(m[1], m[2])] = float(m[3])
    return out


def surface(batches=(1, 2, 4, 8), sizes=(1, 2, 3, 4, 5), per_token=0.02, per_batch_token=0.04) -> pd.DataFrame:
    rows = []
    for b in batches:
        for n in sizes:
            t = 0.01 * (1 + per_token * (n - 1) + per_batch_token * b * (n - 1))
            rows.append(dict(model="synthetic", device="test", dtype="float32", batch=b, context=128, tokens=n,
                             seconds=t, seconds_min=t * 0.96, seconds_q1=t * 0.98, seconds_q3=t * 1.02,
                             seconds_max=t * 1.04, repeats=10))
    return pd.DataFrame(rows)


@pytest.fixture
def served(tmp_path):
    out = tmp_path / "served"
    assert main(["calibrate", "--metrics", str(BEFORE), str(AFTER), "--method", "ngram", "--vllm-version", "0.32.0",
                 "--prompts", "copy-edit", "--out", str(out)]) == 0
    return out


@pytest.mark.unit
def test_a_recorded_scrape_becomes_a_served_calibration(served):
    a, b = counters(AFTER), counters(BEFORE)
    d = {key: a[key] - b.get(key, 0.0) for key in a}
    drafts = d[("num_drafts", None)]
    per_pos = [d[("num_accepted_tokens_per_pos", str(i))] for i in range(4)]
    assert drafts > 0 and sum(per_pos) == d[("num_accepted_tokens", None)]
    meta = json.loads((served / "meta.json").read_text())
    assert meta["kind"] == "served" and meta["engine"] == "vllm" and meta["method"] == "ngram"
    assert meta["num_speculative_tokens"] == 4 and meta["model"] == "smollm2-135m-instruct"
    assert meta["num_drafts"] == drafts and meta["num_draft_tokens"] == d[("num_draft_tokens", None)]
    table = pd.read_csv(served / "acceptance.csv")
    assert table["accepted"].tolist() == per_pos
    assert table["drafts"].tolist() == [drafts] + per_pos[:-1]
    assert table["marginal"].tolist() == pytest.approx([p / drafts for p in per_pos])
    assert table["conditional"].tolist() == pytest.approx([p / r for p, r in zip(per_pos, [drafts] + per_pos)])
    # the decoding steps (no request in flight at either scrape): generation tokens - accepted - finished requests
    gen = [float(re.search(r'^vllm:generation_tokens_total\{.*\} (\S+)$', p.read_text(), re.M)[1])
           for p in (BEFORE, AFTER)]
    assert meta["decode_steps"] < gen[1] - gen[0] and meta["decode_steps"] >= drafts
    assert Served(served).rates() == pytest.approx([p / meta["decode_steps"] for p in per_pos])


@pytest.mark.unit
def test_plan_and_exports_from_a_served_calibration(served, tmp_path):
    surface().to_csv(tmp_path / "lat.csv", index=False)
    for flag in ("--acceptance", "--calibration"):  # the folder is taken wherever ours or a vector is
        out = tmp_path / f"plan{flag}.json"
        assert main(["plan", flag, str(served), "--latency", str(tmp_path / "lat.csv"), "--batch-sizes", "1,2,4,8",
                     "--out", str(out)]) == 0
        plan = read_plan(out)
        rates = Served(served).rates()
        assert plan["chain_acceptance"] == pytest.approx(rates)
        assert plan["source"]["method"] == "ngram" and plan["source"]["served"] is True
        for row in plan["plans"]:
            assert row["kind"] in ("chain", "none")
            if row["kind"] == "chain":
                assert row["predicted_tokens_per_step"] == pytest.approx(1 + sum(rates[:row["nodes"]]))
    plan = read_plan(tmp_path / "plan--acceptance.json")
    ks = [r["nodes"] for r in plan["plans"]]
    assert ks[0] > ks[-1]  # the synthetic surface makes verify tokens dear at batch 8: K falls with the batch size
    text, _, _ = export_plan(plan, "vllm")  # the drafter comes from the served calibration: no --method needed
    cfg = json.loads(text)
    assert cfg["method"] == "ngram" and cfg["num_speculative_tokens"] == ks[0]
    assert [e[2] for e in cfg["num_speculative_tokens_per_batch_size"]] == sorted(set(ks), reverse=True)
    text, warns, _ = export_plan(plan, "trtllm-schedule")
    trt = json.loads(text)["speculative_config"]
    assert trt["decoding_type"] == "NGram" and trt["max_draft_len"] == ks[0]
    assert {int(b): k for b, k in trt["draft_len_schedule"].items()} == {
        hi: k for _, hi, k in cfg["num_speculative_tokens_per_batch_size"]}
    with pytest.raises(WorkbenchError, match="no speculative_token_schedule"):
        export_plan(plan, "vllm-token-schedule", vllm_version="0.32.0")
    text, warns, _ = export_plan(plan, "vllm-token-schedule", vllm_version="0.34.0")
    assert json.loads(text)["speculative_token_schedule"] == cfg["num_speculative_tokens_per_batch_size"]
    assert any(w.code == "vllm_unreleased_key" for w in warns)


@pytest.mark.unit
def test_the_apps_answer_weighs_a_served_calibration_as_plan_does(served, tmp_path):
    """The answer the app opens with (recommend.recommend on the opened folder) names plan's K and speedup at every
    batch size: one source (source.served_source) and one weighing; the app finds the folder (list_served) and
    takes its rates as a chain's accuracies whose running products are the rates again."""
    import numpy as np

    from workbench.calibrate.served import list_served
    from workbench.measure.latency_file import read_latency
    from workbench.plan.recommend import recommend
    from workbench.plan.source import chain_accuracies

    surface().to_csv(tmp_path / "lat.csv", index=False)
    assert main(["plan", "--calibration", str(served), "--latency", str(tmp_path / "lat.csv"), "--batch-sizes",
                 "1,2,4,8", "--out", str(tmp_path / "plan.json")]) == 0
    plan, s = read_plan(tmp_path / "plan.json"), Served(served)
    assert len({r["nodes"] for r in plan["plans"]}) > 1  # K changes with the batch size: the check can tell
    for row in plan["plans"]:
        rec = recommend(s, read_latency(tmp_path / "lat.csv"), batch=row["batch_size"])
        pick = rec["pick"]
        assert (pick["kind"], pick["nodes"], pick["speedup"]) == (row["kind"], row["nodes"], row["predicted_speedup"])
        assert rec["source"]["served"] is True and rec["source"]["method"] == "ngram"
        assert {r["kind"] for r in rec["candidates"]} <= {"chain", "none"}
    assert list_served([tmp_path, tmp_path / "missing"]) == [served]
    acc = chain_accuracies(s.rates())
    assert acc.shape == (len(s.rates()), 1) and np.cumprod(acc[:, 0]) == pytest.approx(s.rates())


@pytest.mark.unit
def test_a_served_draft_model_plan_exports_its_weights_to_every_engine(tmp_path):
    """A draft model's served calibration names its weights: vLLM's config and TensorRT-LLM's schedule carry them
    (TensorRT-LLM's Draft_Target config refuses to start without speculative_model), as does the profile; a plan
    that names no weights says to add them."""
    from workbench.calibrate.served import ServedCounts, write_served

    weights = str((tmp_path / "draft").resolve())
    cal = write_served(tmp_path / "cal", ServedCounts(3, 100, 300, 270, (98, 92, 80), 100), dict(
        engine="vllm", engine_version="0.32.0", method="draft_model", draft_model=weights, model="m",
        prompts="copy-edit", source="calibrate",
        speculative_config=dict(method="draft_model", model=weights, num_speculative_tokens=3)))
    surface().to_csv(tmp_path / "lat.csv", index=False)
    assert main(["plan", "--calibration", str(cal), "--latency", str(tmp_path / "lat.csv"), "--batch-sizes",
                 "1,2,4,8", "--out", str(tmp_path / "plan.json")]) == 0
    plan = read_plan(tmp_path / "plan.json")
    k = plan["plans"][0]["nodes"]
    assert plan["source"]["draft_model"] == weights and k >= 1
    cfg = json.loads(export_plan(plan, "vllm")[0])
    assert cfg["method"] == "draft_model" and cfg["model"] == weights and cfg["num_speculative_tokens"] == k
    trt = json.loads(export_plan(plan, "trtllm-schedule")[0])["speculative_config"]
    assert trt["decoding_type"] == "Draft_Target" and trt["speculative_model"] == weights
    assert trt["max_draft_len"] == k and trt["draft_len_schedule"][str(min(map(int, trt["draft_len_schedule"])))] == k
    assert speculation_profile(cal)["provenance"]["draft_model"] == weights
    vector = tmp_path / "rates.json"  # an acceptance vector names no weights: the export says what to add
    vector.write_text(json.dumps(Served(cal).rates()))
    assert main(["plan", "--acceptance", str(vector), "--latency", str(tmp_path / "lat.csv"), "--batch-sizes",
                 "1,2,4,8", "--out", str(tmp_path / "p2.json")]) == 0
    text, _, notes = export_plan(read_plan(tmp_path / "p2.json"), "trtllm-schedule", method="draft_model")
    assert "speculative_model" not in text and any("add the drafter's weights as speculative_model" in n
                                                   for n in notes)
    text, _, _ = export_plan(read_plan(tmp_path / "p2.json"), "trtllm-schedule", method="draft_model",
                             draft_model=tmp_path / "draft")
    assert json.loads(text)["speculative_config"]["speculative_model"] == weights


@pytest.mark.unit
def test_speculation_profile_of_a_served_calibration(served, tmp_path):
    prof = speculation_profile(served)
    table = pd.read_csv(served / "acceptance.csv")
    assert prof["method"] == "ngram" and prof["num_speculative_tokens"] == 4
    assert prof["marginal_accept_rates"] == pytest.approx(table["marginal"].tolist(), abs=1e-6)
    assert prof["conditional_accept_rates"] == pytest.approx(table["conditional"].tolist(), abs=1e-6)
    hist = {int(k): v for k, v in prof["acceptance_length_histogram"].items()}
    assert sum(hist.values()) == prof["counts"]["drafts"]
    # mean acceptance length = 1 + sum of the marginals = the histogram's mean (ModelOpt's identity)
    assert prof["mean_accept_length"] == pytest.approx(1 + sum(prof["marginal_accept_rates"]), abs=1e-5)
    assert prof["mean_accept_length"] == pytest.approx(sum(k * v for k, v in hist.items()) / sum(hist.values()))
    out = tmp_path / "speculation_profile.json"
    assert main(["export", "--format", "speculation-profile", "--calibration", str(served), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["counts"] == prof["counts"]


# K = 1..4 each served in a run of its own, as `calibrate --engine vllm --k 4` recorded them (vLLM 0.32.0 CPU, eager,
# n-gram, demo model, the 24 calibrated prompts of copy-edit --limit 32 --holdout 0.25, 48 tokens): (drafts, draft
# tokens, accepted, accepted per position, decoding steps). A smaller K drafts at more steps: 1 + K = 4's first
# per-step rate is 1.175, the K = 1 run's tokens/step 1.298
PER_K = {1: (266, 266, 237, (237,), 794), 2: (191, 382, 320, (170, 150), 711),
         3: (150, 450, 360, (133, 119, 108), 671), 4: (128, 512, 390, (112, 101, 93, 84), 641)}


def per_k_folder(path: Path, ks=(1, 2, 3, 4)) -> Path:
    from workbench.calibrate.served import ServedCounts, write_served

    runs = [ServedCounts(k, *PER_K[k]) for k in ks]
    return write_served(path, runs[-1], dict(engine="vllm", engine_version="0.32.0", method="ngram",
                                              model="smollm2-135m-instruct", prompts="copy-edit", source="calibrate"),
                        runs[:-1])


@pytest.mark.unit
def test_each_k_served_in_its_own_run_is_read_and_planned_on_its_own_rates(tmp_path):
    """A calibration that served K = 1..4 each in a run of its own: every K's counts are kept beside the largest's
    (acceptance_per_k.csv, meta per_k with the drafting rate) and a plan prices K's chain on K's own per-step rates
    (1 + K's accepted tokens / K's decoding steps), not on the K = 4 run's first K positions; the speculation
    profile describes K = 4 and carries the others."""
    folder = per_k_folder(tmp_path / "served")
    s = Served(folder)
    assert list(s.per_k) == [1, 2, 3, 4] and s.counts.k == 4
    for k, (drafts, tokens, accepted, per_pos, steps) in PER_K.items():
        c = s.per_k[k]
        assert (c.drafts, c.draft_tokens, c.accepted, c.per_pos, c.decode_steps) == (drafts, tokens, accepted,
                                                                                      per_pos, steps)
        assert s.rates(k) == pytest.approx([p / steps for p in per_pos])
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["version"] == 2 and [r["num_speculative_tokens"] for r in meta["per_k"]] == [1, 2, 3]
    assert [r["draft_tokens_per_step"] for r in meta["per_k"]] == pytest.approx([t / st for _, t, _, _, st in
                                                                                 list(PER_K.values())[:3]])
    assert meta["draft_tokens_per_step"] == pytest.approx(512 / 641)
    table = pd.read_csv(folder / "acceptance_per_k.csv")
    assert table.groupby("num_speculative_tokens")["accepted"].apply(list).to_dict() == {
        k: list(PER_K[k][3]) for k in (1, 2, 3)}
    surface().to_csv(tmp_path / "lat.csv", index=False)
    assert main(["plan", "--calibration", str(folder), "--latency", str(tmp_path / "lat.csv"), "--batch-sizes",
                 "1,8", "--out", str(tmp_path / "plan.json")]) == 0
    plan = read_plan(tmp_path / "plan.json")
    chains = {c["k"]: c["predicted_tokens_per_step"] for c in plan["alternatives"][0]["chains"] if c["k"]}
    own = {k: 1 + PER_K[k][2] / PER_K[k][4] for k in PER_K}
    assert chains == pytest.approx(own)
    k4 = s.rates()
    assert chains[1] == pytest.approx(1 + 237 / 794) and 1 + k4[0] == pytest.approx(1 + 112 / 641)  # 1.298 vs 1.175
    assert plan["chain_acceptance"] == pytest.approx(k4) and plan["source"]["per_k_runs"] == [1, 2, 3, 4]
    prof = speculation_profile(folder)
    assert prof["num_speculative_tokens"] == 4 and prof["counts"]["accepted_per_position"] == [112, 101, 93, 84]
    per = prof["per_num_speculative_tokens"]
    assert list(per) == ["1", "2", "3", "4"] and per["1"]["counts"]["accepted_per_position"] == [237]
    assert per["2"]["marginal_accept_rates"] == pytest.approx([170 / 191, 150 / 191], abs=1e-6)
    assert per["3"]["draft_tokens_per_step"] == pytest.approx(450 / 671)


@pytest.mark.unit
def test_a_calibration_of_the_largest_k_only_keeps_the_current_reading(served, tmp_path):
    """A scrape (one K) and a version-1 folder (written before each K had its own run; read through
    served.upgrade_served) price K < the largest on the largest K's first K positions, as before."""
    surface().to_csv(tmp_path / "lat.csv", index=False)
    old = tmp_path / "v1"
    old.mkdir()
    (old / "acceptance.csv").write_text((served / "acceptance.csv").read_text())
    meta = json.loads((served / "meta.json").read_text())
    meta = {k: v for k, v in meta.items() if k not in ("per_k", "draft_tokens_per_step")} | dict(version=1)
    (old / "meta.json").write_text(json.dumps(meta))
    for folder in (served, old):
        s = Served(folder)
        assert list(s.per_k) == [4] and s.meta["per_k"] == []
        assert main(["plan", "--calibration", str(folder), "--latency", str(tmp_path / "lat.csv"), "--batch-sizes",
                     "1", "--out", str(tmp_path / f"{folder.name}.json")]) == 0
        chains = read_plan(tmp_path / f"{folder.name}.json")["alternatives"][0]["chains"]
        assert [c["predicted_tokens_per_step"] for c in chains if c["k"]] == pytest.approx(
            [1 + sum(s.rates()[:k]) for k in range(1, 5)])
        assert "per_num_speculative_tokens" not in speculation_profile(folder)
    assert Served(old).meta["draft_tokens_per_step"] == pytest.approx(meta["num_draft_tokens"] / meta["decode_steps"])


@pytest.mark.unit
def test_bad_per_k_records_are_one_error_line(tmp_path, capsys):
    surface().to_csv(tmp_path / "lat.csv", index=False)
    for name, edit in {"dup": lambda m, t: (dict(m, per_k=m["per_k"] + m["per_k"][:1]), t),
                       "past": lambda m, t: (dict(m, per_k=[dict(m["per_k"][0], num_speculative_tokens=4)]), t),
                       "rows": lambda m, t: (m, t[t["num_speculative_tokens"] != 2]),
                       "mixed": lambda m, t: (m, t.assign(accepted=t["accepted"] + 500))}.items():
        folder = per_k_folder(tmp_path / name)
        meta, table = edit(json.loads((folder / "meta.json").read_text()), pd.read_csv(folder / "acceptance_per_k.csv"))
        (folder / "meta.json").write_text(json.dumps(meta))
        table.to_csv(folder / "acceptance_per_k.csv", index=False)
        err = _err(["plan", "--calibration", str(folder), "--latency", str(tmp_path / "lat.csv"), "--out",
                    str(tmp_path / "p.json")], capsys)
        assert str(folder) in err and ("write it again" in err or "counts disagree" in err), (name, err)


@pytest.mark.unit
def test_calibrating_each_k_puts_each_ngram_engine_in_a_process_of_its_own():
    from workbench.measure.vllm_runner import engine_groups

    ngram = [{"method": "ngram", "num_speculative_tokens": k} for k in (1, 2, 3)]
    medusa = [{"method": "medusa", "num_speculative_tokens": k} for k in (1, 2)]
    assert engine_groups(ngram) == [[0], [1], [2]]  # a calibration: no plain engine to run beside
    assert engine_groups([None, *ngram]) == [[0, 1], [0, 2], [0, 3]]  # a check: each beside a plain one of its own
    assert engine_groups(medusa) == [[0, 1]] and engine_groups([None, *medusa]) == [[0, 1, 2]]


@pytest.mark.unit
def test_per_request_statistics(tmp_path):
    rows = [{"metrics": {"speculative_decoding": {"acceptance_histogram": [2, 1, 0, 3], "num_draft_tokens": 18,
                                                  "num_spec_tokens": 3, "mean_acceptance_length": 2.83}}},
            {"acceptance_histogram": [1, 0, 1, 0], "num_draft_tokens": 6}]
    (tmp_path / "req.jsonl").write_text("\n".join(map(json.dumps, rows)))
    c = request_counts(tmp_path / "req.jsonl", "--requests")
    # drafts 8: accepted lengths 0,0,0,1,2,3,3,3 -> position 1: 5, position 2: 4, position 3: 3
    assert (c.k, c.drafts, c.draft_tokens, c.accepted, c.per_pos) == (3, 8, 24, 12, (5, 4, 3))


def _err(argv, capsys) -> str:
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), lines
    return lines[0]


@pytest.mark.unit
def test_bad_served_input_is_one_error_line(tmp_path, capsys):
    after = AFTER.read_text()
    cases = {
        "plain.prom": ("\n".join(line for line in after.splitlines() if "spec_decode" not in line),
                       "no speculative-decoding counters"),
        "pasted.prom": (after + "\n" + after, "appears twice"),
        "other.prom": (after.replace('model_name="smollm2-135m-instruct"', 'model_name="other"'),
                       "different servers"),
        "engine.prom": (after.replace('engine="0"', 'engine="1"'), "different servers"),
        "down.prom": (re.sub(r'(spec_decode_num_drafts_total\{[^}]*\}) \S+', r'\1 1.0', after), "went down"),
        "k3.prom": ("\n".join(line for line in after.splitlines() if 'position="3"' not in line),
                    "draft positions"),
        "garbage.prom": ("this is not prometheus text at all {\n", "not Prometheus text"),
        "nan.prom": (re.sub(r'(spec_decode_num_draft_tokens_total\{[^}]*\}) \S+', r'\1 NaN', after), "finite count"),
    }
    for name, (text, want) in cases.items():
        (tmp_path / name).write_text(text)
        before = str(BEFORE) if name != "down.prom" else str(AFTER)
        second = tmp_path / name
        argv = ["calibrate", "--metrics", before, str(second), "--method", "ngram", "--out", str(tmp_path / "o")]
        if name == "plain.prom":
            argv[2:4] = [str(second)]
        assert want in _err(argv, capsys), name
        assert not (tmp_path / "o").exists()
    assert "no such drafter" in _err(["calibrate", "--metrics", str(AFTER), "--method", "lookahead",
                                      "--out", str(tmp_path / "o")], capsys)
    assert "proposed at most 4" in _err(["calibrate", "--metrics", str(BEFORE), str(AFTER), "--method", "ngram",
                                         "--k", "6", "--out", str(tmp_path / "o")], capsys)
    assert "--engine vllm" in _err(["calibrate", "--method", "ngram", "--out", str(tmp_path / "o")], capsys)
    (tmp_path / "mixed.jsonl").write_text('{"acceptance_histogram": [1, 2], "num_draft_tokens": 3}\n'
                                          '{"acceptance_histogram": [1, 2, 3], "num_draft_tokens": 12}\n')
    assert "mixed" in _err(["calibrate", "--requests", str(tmp_path / "mixed.jsonl"), "--method", "eagle3",
                            "--out", str(tmp_path / "o")], capsys)
    assert not (tmp_path / "o").exists()


@pytest.mark.unit
def test_schedules_an_engine_does_not_take(served, tmp_path):
    surface(per_batch_token=0.0).to_csv(tmp_path / "lat.csv", index=False)
    plan_file = tmp_path / "p.json"
    assert main(["plan", "--acceptance", str(served), "--latency", str(tmp_path / "lat.csv"), "--batch-sizes",
                 "1,8", "--out", str(plan_file)]) == 0
    plan = read_plan(plan_file)
    rising = dict(plan, plans=[dict(plan["plans"][0], nodes=1, kind="chain"), dict(plan["plans"][1], nodes=3,
                                                                                     kind="chain")])
    with pytest.raises(WorkbenchError, match="TensorRT-LLM takes no such draft_len_schedule"):
        export_plan(rising, "trtllm-schedule")
    with pytest.raises(WorkbenchError, match="no num_speculative_tokens_per_batch_size"):
        export_plan(rising, "vllm", vllm_version="0.20.0")


@pytest.mark.unit
def test_copy_edit_prompts_are_packaged_and_copy_from_their_input():
    records = load_prompt_records("copy-edit")
    assert len(records) == 128 and len({r[0] for r in records}) == 128
    cats = [r[0].rsplit("-", 1)[0] for r in records]
    assert {c: cats.count(c) for c in cats} == {"rewrite": 32, "extract": 32, "summarise": 32, "code": 32}
    assert all(len(set(cats[i:i + 32])) == 4 and cats[i:i + 32].count("code") == 8 for i in range(0, 128, 32))
    notice = (Path(__file__).parents[1] / "workbench" / "prompts" / "NOTICE").read_text()
    assert "copy-edit.jsonl" in notice and "Apache License 2.0" in notice


# ----------------------------------------------------------------------------------------------- in vLLM itself

VLLM_PY = os.environ.get("WORKBENCH_VLLM_PYTHON")
needs_vllm = pytest.mark.skipif(not VLLM_PY, reason="no vLLM environment: set WORKBENCH_VLLM_PYTHON")


@pytest.mark.vllm
@needs_vllm
def test_calibrate_in_vllm_and_plan_and_export_for_its_config_class(tmp_path):
    out = tmp_path / "served"
    assert main(["calibrate", "--engine", "vllm", "--method", "ngram", "--k", "3", "--prompts", "copy-edit",
                 "--limit", "4", "--max-new-tokens", "48", "--out", str(out)]) == 0
    s = Served(out)
    assert s.meta["source"] == "calibrate" and s.meta["engine_version"] and s.counts.k == 3
    assert s.counts.drafts > 0 and s.counts.decode_steps >= s.counts.drafts
    # each K = 1..3 served in a run of its own (an n-gram engine a process): its own counts, on the same prompts
    assert list(s.per_k) == [1, 2, 3] and [r["num_speculative_tokens"] for r in s.meta["per_k"]] == [1, 2]
    for k, c in s.per_k.items():
        assert c.k == k and c.drafts > 0 and c.decode_steps >= c.drafts and c.draft_tokens <= k * c.drafts
        assert len(c.per_pos) == k and sum(c.per_pos) == c.accepted
    src = plan_source(acceptance=out)
    assert src.chain_acceptance == pytest.approx(s.rates()) and src.info["method"] == "ngram"
    for k, c in s.per_k.items():  # K's chain priced on K's own run
        assert src.predict(chain_tree(k)) == pytest.approx(1 + c.accepted / c.decode_steps)
    surface().to_csv(tmp_path / "lat.csv", index=False)
    assert main(["plan", "--calibration", str(out), "--latency", str(tmp_path / "lat.csv"), "--batch-sizes",
                 "1,2,4,8", "--out", str(tmp_path / "plan.json")]) == 0
    plan = read_plan(tmp_path / "plan.json")
    own = json.loads(export_plan(plan, "vllm", vllm_version="0.32.0")[0])
    # and the recorded scrape's plan, whose K falls with the batch size: a real schedule
    assert main(["calibrate", "--metrics", str(BEFORE), str(AFTER), "--method", "ngram", "--out",
                 str(tmp_path / "scrape")]) == 0
    assert main(["plan", "--acceptance", str(tmp_path / "scrape"), "--latency", str(tmp_path / "lat.csv"),
                 "--batch-sizes", "1,2,4,8", "--out", str(tmp_path / "p2.json")]) == 0
    scrape_plan = read_plan(tmp_path / "p2.json")
    sched = json.loads(export_plan(scrape_plan, "vllm", vllm_version="0.32.0")[0])
    assert "num_speculative_tokens_per_batch_size" in sched
    proposed = json.loads(export_plan(scrape_plan, "vllm-token-schedule", vllm_version="0.34.0")[0])
    # vLLM's own config class reads them (its pydantic checks and post-init for an n-gram drafter); 0.32.0 has no
    # speculative_token_schedule, as the export's window says
    code = ("import json, sys\nfrom vllm.config import SpeculativeConfig\nout = []\n"
            "for cfg in json.loads(sys.argv[1]):\n"
            "    try:\n"
            "        c = SpeculativeConfig(**cfg)\n"
            "        out.append([c.method, c.num_speculative_tokens, c.num_speculative_tokens_per_batch_size])\n"
            "    except Exception as e:\n"
            "        out.append(type(e).__name__)\n"
            "print(json.dumps(out))")
    res = subprocess.run([VLLM_PY, "-c", code, json.dumps([own, sched, proposed])], capture_output=True, text=True,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    got_own, got_sched, got_proposed = json.loads(res.stdout.strip().splitlines()[-1])
    assert got_own[:2] == ["ngram", own["num_speculative_tokens"]]
    assert got_sched[:2] == ["ngram", sched["num_speculative_tokens"]]
    assert [list(e) for e in got_sched[2]] == sched["num_speculative_tokens_per_batch_size"]
    assert isinstance(got_proposed, str)  # refused: the key is not in 0.32.0


@pytest.mark.unit
def test_optimize_takes_a_served_calibration_and_the_tree_tools_refuse_it(served, tmp_path, capsys):
    from workbench.calibrate.folder import Calibration, list_calibrations

    s = Served(served)
    assert main(["optimize", "--calibration", str(served), "--budget", "3", "--out", str(tmp_path / "t.json")]) == 0
    tree = json.loads((tmp_path / "t.json").read_text())
    assert tree["medusa_choices"] == [[0], [0, 0], [0, 0, 0]]  # a chain drafter: ranks 0 only
    assert tree["expected_acceptance_length"] == pytest.approx(1 + sum(s.rates()[:3]))
    with pytest.raises(WorkbenchError, match="served calibration"):
        Calibration(served)
    assert list_calibrations(served.parent) == []
    capsys.readouterr()
    assert "served calibration" in _err(["tree", "eval", "mc_sim_7b_63", "--calibration", str(served)], capsys)


@pytest.mark.unit
def test_speculation_profile_of_our_calibration(tmp_path):
    from helpers import make_calibration

    folder = make_calibration(tmp_path / "cal")
    ranks = pd.read_parquet(folder / "ranks.parquet")
    heads = [f"head_{k}" for k in range(1, 5)]
    drafts = int(ranks["head_1"].notna().sum())  # every answer position with a next token to draft
    chain = [int((ranks[heads[:k]].fillna(-1) == 0).all(axis=1).sum()) for k in range(1, 5)]
    prof = speculation_profile(folder)
    assert prof["method"] == "medusa" and prof["num_speculative_tokens"] == 4
    assert prof["counts"]["accepted_per_position"] == chain and prof["counts"]["drafts"] == drafts
    assert prof["marginal_accept_rates"] == pytest.approx([c / drafts for c in chain], abs=1e-6)
    assert prof["conditional_accept_rates"] == pytest.approx(
        [c / p for c, p in zip(chain, [drafts] + chain[:-1])], abs=1e-6)
    assert prof["provenance"]["kind"] == "calibration"


@pytest.mark.unit
def test_export_formats_refuse_what_they_do_not_describe(served, tmp_path, capsys):
    assert "from a plan" in _err(["export", "mc_sim_7b_63", "--format", "trtllm-schedule"], capsys)
    assert "from a plan" in _err(["export", "mc_sim_7b_63", "--format", "vllm-token-schedule"], capsys)
    assert "give --calibration" in _err(["export", "--format", "speculation-profile"], capsys)
    assert "give only --calibration" in _err(["export", "mc_sim_7b_63", "--format", "speculation-profile",
                                              "--calibration", str(served)], capsys)
    assert "input" in _err(["export", "--format", "speculation-profile", "--calibration", str(served),
                            "--out", str(served / "meta.json")], capsys)
    assert json.loads((served / "meta.json").read_text())["kind"] == "served"  # the input untouched


@pytest.mark.unit
def test_a_served_folders_errors_name_the_field_that_named_it(tmp_path):
    """Served(folder, field): every error of opening the folder is a FieldError of that field, the CLI's words
    (`--acceptance DIR: ...`, `--calibration DIR: ...`) unchanged, the app's with its own name for the field."""
    with pytest.raises(WorkbenchError) as e:
        Served(tmp_path)
    assert e.value.field == "acceptance" and str(e.value) == (
        f"--acceptance {tmp_path}: not a served calibration (no meta.json; write one with `workbench calibrate "
        "--engine vllm` or `--metrics`)")
    (tmp_path / "meta.json").write_text("{not json")
    with pytest.raises(WorkbenchError) as e:
        Served(tmp_path, "calibration")
    assert e.value.field == "calibration" and str(e.value).startswith(f"--calibration {tmp_path}: meta.json is not "
                                                                      "readable JSON")
    assert e.value.words({"calibration": "'Calibration'"}).startswith(f"'Calibration' {tmp_path}: meta.json")
