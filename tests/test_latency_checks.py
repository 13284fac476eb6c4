"""The evidence rules behind an answer: latency points off their trend (workbench/measure/latency_checks.py), a
choice within the noise of no speculation and the table's machine against this one (workbench/plan/recommend.py,
workbench/core/provenance.py)."""
from __future__ import annotations

import pandas as pd
import pytest

from workbench import REPO_ROOT
from workbench.calibrate.folder import Calibration
from workbench.core.provenance import machine_differences
from workbench.measure.latency_checks import deciding, off_trend, outlier_words
from workbench.measure.latency_file import read_latency
from workbench.plan import recommend as R
from workbench.ui import answer as W

pytestmark = pytest.mark.unit

COMMITTED = REPO_ROOT / "calibration" / "smollm2-135m-instruct-alpaca-eval"


def surface(bump: dict | None = None, spread: float = 0.002, quartiles: bool = True) -> pd.DataFrame:
    """A smooth t(B, n) = 0.05 + 0.01 B + 0.004 n B with +-spread quartiles; bump: {(B, n): extra seconds}."""
    rows = []
    for b in (1, 2, 4, 8):
        for n in (1, 2, 4, 8, 16):
            s = 0.05 + 0.01 * b + 0.004 * n * b + (bump or {}).get((b, n), 0.0)
            row = dict(batch=b, context=128, tokens=n, seconds=s)
            if quartiles:
                row |= dict(seconds_min=s - 2 * spread, seconds_q1=s - spread, seconds_q3=s + spread,
                            seconds_max=s + 2 * spread)
            rows.append(row)
    return pd.DataFrame(rows)


def test_a_smooth_surface_has_no_outlier_and_a_bump_beyond_its_spread_is_the_only_one():
    assert off_trend(surface(), 128) == []
    assert off_trend(surface({(2, 1): 0.003}), 128) == []  # within the spread (q3 - q1 = 0.004)
    found = off_trend(surface({(2, 1): 0.03}), 128)
    assert [(f["batch"], f["tokens"], f["axis"]) for f in found] == [(2, 1, "batch")]
    assert found[0]["expected"] == pytest.approx(0.05 + 0.02 + 0.008)  # the line through batch 1 and 4
    assert "batch 2's plain step (1 token)" in outlier_words(found[0])
    found = off_trend(surface({(4, 8): 0.05}), 128)  # a tree step: off along both axes
    assert {(f["batch"], f["tokens"], f["axis"]) for f in found} == {(4, 8, "batch"), (4, 8, "tokens")}
    assert off_trend(surface({(2, 1): 0.03}, quartiles=False), 128) == []  # no spread: the noise is unknown


def test_the_committed_tables_batch_2_plain_step_is_flagged_where_it_decides_the_answer():
    """Issue 53: batch 2's plain step 0.160 s against 0.094 s at batch 1 and 0.152 s at batch 4 carries the only
    answer where speculation 'pays'; batch 4's, on the trend, is not flagged."""
    df = read_latency(COMMITTED / "latency-cpu.csv")
    found = off_trend(df, 79)
    plain = [f for f in found if f["tokens"] == 1]
    assert [f["batch"] for f in plain] == [2]
    assert plain[0]["seconds"] == pytest.approx(0.160, abs=5e-4) and plain[0]["expected"] < 0.12
    sizes = sorted(df["tokens"].unique())
    assert [f["tokens"] for f in deciding(found, 2, 4, sizes)] == [1]  # 4 tokens: the plain step alone is off
    assert deciding(found, 1, 4, sizes) == []
    rec = R.recommend(Calibration(COMMITTED), df, None, 2, latency_name="latency-cpu.csv")
    assert rec["pick"]["kind"] != "none" and rec["outliers"]
    assert W.outlier_text(rec).startswith("The answer at batch 2 rests on latency measurements off their trend: "
                                          "batch 2's plain step (1 token) 0.160 s is off its neighbours")
    # its range reaches into no speculation's: the choice is within the noise, and said so
    none = R.within_noise_of_none(rec)
    assert none is not None and none["kind"] == "none" and rec["pick"]["range"][0] <= none["range"][1]
    assert W.noise_text(rec).startswith("the choice is within the noise: ")
    rec1 = R.recommend(Calibration(COMMITTED), df, None, 1, latency_name="latency-cpu.csv")
    assert rec1["outliers"] == [] and W.outlier_text(rec1) is None and W.noise_text(rec1) is None


def test_the_tables_machine_is_named_and_held_against_this_one():
    df = read_latency(COMMITTED / "latency-cpu.csv")
    setting = R.read_setting(df)
    same = dict(device="cpu", cpu=setting["cpu"], vector=setting["vector"], cores=2)
    assert machine_differences(setting, same) == []
    other = dict(device="cpu", cpu="Intel Xeon", vector="avx512f", cores=1)
    said = machine_differences(setting, other)
    assert said == ["cpu AMD EPYC (here Intel Xeon)", "vector avx2 (here avx512f)", "threads 2 (here 1 cores)"]
    assert machine_differences(None, other) is None and machine_differences(dict(device="cuda"), other) is None
    rec = R.recommend(Calibration(COMMITTED), df, None, 1, latency_name="latency-cpu.csv")
    text = W.table_text(rec, other)
    assert text.startswith("latency latency-cpu.csv: cpu AMD EPYC (avx2), 2 threads, ") and "engine workbench" in text
    assert "measured on another machine than this one (cpu AMD EPYC (here Intel Xeon)" in text
    assert W.table_text(rec, same).endswith("this machine's CPU")
    assert "on this machine" not in W.sentence(rec)  # a table's setting is not the server's


def test_the_answer_and_its_candidates_as_files():
    """The download of the recommendation: every candidate as a CSV row, best first, with its tree; the JSON holds the
    sentence, the pick, the table's setting and the warnings the page shows, and parses as strict JSON."""
    import json

    from workbench.ui.answer import answer_json, candidate_rows

    df = read_latency(COMMITTED / "latency-cpu.csv")
    rec = R.recommend(Calibration(COMMITTED), df, None, 2, latency_name="latency-cpu.csv")
    rows = candidate_rows(rec)
    assert len(rows) == len(rec["candidates"]) + len(rec["measured_trees"])
    assert list(rows["label"][:len(rec["candidates"])]) == [r["label"] for r in rec["candidates"]]
    assert json.loads(rows["medusa_choices"][0]) == rec["pick"]["tree"].as_lists()
    said = json.loads(answer_json(rec, dict(device="cpu", cpu="AMD EPYC", vector="avx2", cores=2)))
    assert said["answer"] == W.sentence(rec) and said["batch"] == 2 and said["latency"] == "latency-cpu.csv"
    assert said["pick"]["medusa_choices"] == rec["pick"]["tree"].as_lists()
    assert said["latency_setting"]["cpu"] == "AMD EPYC" and said["latency_evidence"].endswith("this machine's CPU")
    assert said["warnings"] == [W.outlier_text(rec), W.noise_text(rec)]
    assert len(said["candidates"]) == len(rows) and said["candidates"][0]["measured_speedup"] is None
    # a measurement in another setting keeps its sweep and why in the CSV (the page shows its speedup only)
    from workbench.measure.sweep_file import read_sweep

    sweeps = {f.name: read_sweep(f) for f in sorted((REPO_ROOT / "docs" / "results").glob("sweep*.csv"))}
    rows = candidate_rows(R.recommend(Calibration(COMMITTED), df, None, 2, sweeps, latency_name="latency-cpu.csv"))
    other = rows[rows["other_setting_sweep"] != ""]
    assert len(other) and other["other_setting_speedup"].notna().all() and (other["other_setting"] != "").all()


def test_the_step_cost_surface_figure():
    """One line per batch size: t(B, n) / t(B, 1) with the quartiles as error bars, the odd points marked."""
    from workbench.viz.interactive_tradeoffs import surface_chart

    df = surface({(2, 1): 0.03})
    fig = surface_chart(df, 128, off_trend(df, 128))
    lines = {t.name: t for t in fig.data}
    assert set(lines) == {"batch 1", "batch 2", "batch 4", "batch 8", "off its trend"}
    b4 = lines["batch 4"]
    plain = 0.05 + 0.04 + 0.016
    assert list(b4.x) == [1, 2, 4, 8, 16] and b4.y[0] == pytest.approx(1.0)
    assert b4.y[-1] == pytest.approx((0.05 + 0.04 + 0.004 * 16 * 4) / plain)
    assert b4.error_y.array[0] == pytest.approx(0.002 / plain)  # q3 - median over the plain step
    assert list(lines["off its trend"].x) == [1] and lines["off its trend"].customdata[0][0] == 2
