"""A served check's miss split in its two parts (core.speed.miss_parts: the held-out prompts' acceptance, the round
cost's pricing) and the held-out sample's own spread (core.speed.served_tokens_interval), on hand-made numbers whose
answers are known by hand and on the committed check results, whose reports get both when written again."""
import importlib.util
import json
import math
import shutil
from pathlib import Path

import pytest

from workbench import REPO_ROOT, WorkbenchError
from workbench.core.speed import miss_parts, prediction_error, served_tokens_interval, served_tokens_per_step
from workbench.export.vllm_served_check import held_out_interval, miss_split, served_table

SERVED = REPO_ROOT / "docs" / "results" / "served"
COPY_EDIT = SERVED / "ngram-plan-cpu-copy-edit-check.json"
ALPACA = SERVED / "ngram-plan-cpu-alpaca-eval-check.json"


def _rate(prompts) -> float:
    """The whole sample's tokens/step, as the check computes vllm_tokens_per_step."""
    return served_tokens_per_step(sum(t for t, _ in prompts), len(prompts), sum(a for _, a in prompts))


@pytest.mark.unit
def test_a_miss_splits_into_an_acceptance_and_a_round_cost_part_by_hand():
    # +10% predicted tokens/step and +10% predicted speedup: the round was priced right
    acc, cost = miss_parts(1.1, 1.0, 1.21, 1.1)
    assert acc == pytest.approx(0.1) and cost == pytest.approx(0.0, abs=1e-12)
    # tokens/step right, speedup 10% high: all of it is the round's price
    assert miss_parts(1.1, 1.0, 1.5, 1.5) == pytest.approx((0.0, 0.1))
    # copy-edit's shape: held-out prompts accept more (1.5 vs 1.2 predicted) while the speedup is right: the round
    # ran 1.5 / 1.0 = 1.5x plain where it was priced 1.2 / 1.0 = 1.2x, 25% dearer than priced
    acc, cost = miss_parts(1.0, 1.0, 1.2, 1.5)
    assert acc == pytest.approx(-0.2) and cost == pytest.approx(1.5 / 1.2 - 1)
    for pred, got, tp, tm in [(1.66, 1.83, 1.61, 1.87), (1.36, 1.25, 1.61, 1.87), (0.99, 1.03, 1.0, 1.01)]:
        acc, cost = miss_parts(pred, got, tp, tm)   # the parts multiply back to the whole miss
        assert (1 + acc) * (1 + cost) == pytest.approx(1 + prediction_error(pred, got), rel=1e-12)
        assert acc == prediction_error(tp, tm)      # one convention: predicted / measured - 1
    assert math.isnan(miss_parts(1.1, 0.0, 1.2, 1.5)[1])  # nothing measured: no split


@pytest.mark.unit
def test_the_held_out_interval_brackets_its_sample_and_is_fixed_by_its_seed():
    prompts = [(48, 0), (48, 2), (48, 30), (48, 5), (40, 12), (48, 0), (33, 20), (48, 1), (48, 9), (20, 0)]
    low, high = served_tokens_interval(prompts)
    whole = _rate(prompts)
    singles = [_rate([p]) for p in prompts]
    assert min(singles) <= low < whole < high <= max(singles)  # a ratio of sums lies between its parts' ratios
    assert served_tokens_interval(prompts) == (low, high)        # fixed seed: a report written again reads the same
    assert served_tokens_interval(prompts, seed=1) != (low, high)
    narrow = served_tokens_interval(prompts, level=0.5)
    assert low <= narrow[0] <= narrow[1] <= high
    # one prompt, or prompts all alike: nothing to resample, the interval is the sample's own tokens/step
    assert served_tokens_interval([(48, 12)]) == pytest.approx((47 / 35, 47 / 35))  # 47 decoded in 35 steps
    assert served_tokens_interval([(10, 3)] * 5) == pytest.approx((9 / 6, 9 / 6))
    # a prompt without a decoding step (its one token was the prefill's) adds no step; draws of only it are skipped
    assert served_tokens_interval([(1, 0)] * 3) is None and served_tokens_interval([]) is None
    low1, high1 = served_tokens_interval([(1, 0), (10, 3)])
    assert low1 == high1 == pytest.approx(9 / 6)
    for bad in ([(10, 10)], [(0, 0)], [(5, -1)], [(float("nan"), 0)]):
        with pytest.raises(WorkbenchError, match="tokens >= 1 and 0 <= accepted < tokens"):
            served_tokens_interval(bad)
    with pytest.raises(WorkbenchError, match="level 1.5"):
        served_tokens_interval(prompts, level=1.5)


def _rows(table: str, header: str) -> list[dict]:
    """The rows of the markdown table under `header`'s line, as {column: cell}."""
    lines = table.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    names = [c.strip() for c in lines[start].strip("|").split("|")]
    out = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        out.append(dict(zip(names, (c.strip() for c in line.strip("|").split("|")))))
    return out


@pytest.mark.unit
def test_a_committed_checks_report_shows_each_rows_miss_in_two_parts_that_multiply_back():
    res = json.loads(COPY_EDIT.read_text())
    table = served_table(res)
    parts = miss_split(res)
    speed = _rows(table, "| K | batch |")
    assert len(speed) == len(res["speed"]) and parts
    ks = {r["k"]: r for r in res["acceptance"]}
    for s, row in zip(res["speed"], speed):
        b, k = s["batch_size"], s["k"]
        acc, cost = parts[(b, k)]
        assert acc == pytest.approx(prediction_error(ks[k]["predicted"], ks[k]["vllm_tokens_per_step"]))
        assert (1 + acc) * (1 + cost) == pytest.approx(s["predicted_speedup"] / s["decode_speedup"], rel=1e-12)
        assert row["acceptance part"].split()[0] == f"{100 * acc:+.1f}%"
        assert row["round-cost part"] == f"{100 * cost:+.1f}%"
        # read back from the table: the rounded parts still multiply to the shown predicted / measured
        shown = (1 + float(row["acceptance part"].split()[0].rstrip("%")) / 100) * (
            1 + float(row["round-cost part"].rstrip("%")) / 100)
        measured = float(row["decoding speedup, median (q1..q3)"].split()[0])
        assert shown == pytest.approx(float(row["predicted"]) / measured, abs=3e-3)
    for r, row in zip(res["plan_check"], _rows(table, "| batch | plan's K |")):
        acc, cost = parts[(r["batch_size"], r["plan_k"])]
        assert (1 + acc) * (1 + cost) == pytest.approx(1 + r["error"], rel=1e-12)
        assert row["round-cost part"] == f"{100 * cost:+.1f}%"
    assert "Verdict" not in table  # the verdicts are the bench's, worded there


@pytest.mark.unit
def test_the_held_out_interval_is_shown_per_k_and_marks_misses_the_sample_explains():
    res = json.loads(ALPACA.read_text())
    table = served_table(res)
    ks = _rows(table, "| K | vLLM tokens/step |")
    speed = _rows(table, "| K | batch |")
    assert len(ks) == len(res["acceptance"])
    for r, row in zip(res["acceptance"], ks):
        pp = [(p["tokens"], p["accepted"]) for p in r["per_prompt"]]
        assert r["vllm_tokens_per_step"] == pytest.approx(_rate(pp))  # the interval's statistic is the K row's
        low, high = held_out_interval(r)
        assert (low, high) == served_tokens_interval(pp, 0.9) and low <= r["vllm_tokens_per_step"] <= high
        inside = low <= r["predicted"] <= high
        assert row["held-out 90% interval"] == f"{low:.3f}..{high:.3f}"
        assert row["prediction inside"] == ("yes" if inside else "no")
        marked = {x["acceptance part"].endswith("(sampling)") for x in speed if int(x["K"]) == r["k"]}
        assert marked == {inside}
    older = dict(res, acceptance=[{k: v for k, v in r.items() if k != "per_prompt"} for r in res["acceptance"]])
    for row in _rows(served_table(older), "| K | vLLM tokens/step |"):  # a result from before per-prompt records
        assert row["held-out 90% interval"] == row["prediction inside"] == "-"
    assert not any(x["acceptance part"].endswith("(sampling)") for x in _rows(served_table(older), "| K | batch |"))


@pytest.mark.unit
def test_the_bench_report_written_again_from_a_committed_check_names_the_worst_round_cost_part(tmp_path, capsys):
    """bench/served_plan.py keeps every finished step: with a set's outputs in place it only writes the report, from
    check.json as it is, with the verdict line as before and the round-cost line under it."""
    name = "again"
    (tmp_path / f"{name}-copy-edit-calibration").mkdir()
    for part in ("surface-prompts.jsonl", "latency.csv", "plan.json"):
        (tmp_path / f"{name}-copy-edit-{part}").write_text("kept: not read when the check is there\n")
    shutil.copy(COPY_EDIT, tmp_path / f"{name}-copy-edit-check.json")
    spec = importlib.util.spec_from_file_location("bench_served_plan", REPO_ROOT / "bench" / "served_plan.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--sets", "copy-edit", "--out-dir", str(tmp_path), "--name", name]) == 0, capsys.readouterr()
    report = (tmp_path / f"{name}.md").read_text().splitlines()
    res = json.loads(COPY_EDIT.read_text())
    (b, k), (_, worst) = max(miss_split(res).items(), key=lambda kv: abs(kv[1][1]))
    verdict = next(i for i, line in enumerate(report) if line.startswith("Verdicts (issue 69)"))
    assert report[verdict + 2] == ("Round-cost part of the misses (the pricing's own error, the held-out prompts' "
                                   f"acceptance set apart): worst {100 * worst:+.1f}% (batch {b}, K = {k}).")
    assert served_table(res).rstrip("\n") in "\n".join(report)
