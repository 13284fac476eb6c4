"""The app's one answer (workbench/plan/recommend.py): candidates ranked by predicted speedup, the pick, the range from
the latency spread, and the sweep measurements of the same tree shapes, other settings shown apart."""
from __future__ import annotations

import pandas as pd
import pytest

from workbench import WorkbenchError
from workbench.calibrate.folder import Calibration
from workbench.measure.sweep_file import SWEEP_COLUMNS, SWEEP_VERSION
from workbench.plan import recommend as R
from workbench.ui import answer as W
from workbench.trees.tree import make_tree, tree_key

from helpers import make_calibration

pytestmark = pytest.mark.unit  # no model, no subprocess: the fast tier

SIZES = (1, 2, 3, 4, 8, 16, 32)


@pytest.fixture(scope="module")
def cal(tmp_path_factory) -> Calibration:
    return Calibration(make_calibration(tmp_path_factory.mktemp("rec") / "synthetic"))


def latency(cost, contexts=(128,), batches=None, spread: float | None = None) -> pd.DataFrame:
    """A latency frame: seconds = cost(tokens) (x batch), optional quartile columns +- spread."""
    rows = []
    for b in batches or [None]:
        for c in contexts:
            for n in SIZES:
                s = cost(n) * (b or 1)
                row = dict(model="m", device="cpu", dtype="float32", context=c, tokens=n, seconds=s)
                if b is not None:
                    row["batch"] = b
                if spread is not None:
                    row |= dict(seconds_min=s * (1 - spread), seconds_q1=s * (1 - spread),
                                seconds_q3=s * (1 + spread), seconds_max=s * (1 + spread))
                rows.append(row)
    return pd.DataFrame(rows)


CHEAP = lambda n: 0.02 * (1 + 0.01 * n)  # noqa: E731 - a GPU-like curve: trees pay
SLOW = lambda n: 0.01 * n  # noqa: E731 - every token costs a full step: nothing pays


def sweep(rows: list[dict]) -> pd.DataFrame:
    """A sweep frame as read_sweep gives it: every column, batch size 1 and this version where the rows say nothing."""
    return pd.DataFrame(rows).reindex(columns=SWEEP_COLUMNS).fillna({"batch_size": 1, "version": SWEEP_VERSION})


def swept(tree, speedup: float, baselines=(50.0, 50.0)) -> list[dict]:
    """A vanilla row and a greedy row for `tree` as `workbench sweep` writes them (config = name:hash|...)."""
    rows = [dict(run="r1", config="vanilla", tree="vanilla", kind="vanilla", nodes=0, acceptance="greedy",
                 tokens_per_step=1.0, speedup=1.0, vanilla_tokens_per_s=baselines[0], num_prompts=12)]
    rows.append(dict(run="r1", config=f"{tree_key(tree)}|greedy|T=0", tree=tree.name, kind="given", nodes=tree.nodes,
                     acceptance="greedy", temperature=0.0, tokens_per_step=1.5, speedup=speedup,
                     vanilla_tokens_per_s=baselines[1], num_prompts=12))
    return rows


def test_pick_is_the_best_predicted_speedup_with_its_numbers(cal):
    rec = R.recommend(cal, latency(CHEAP))
    rows = rec["candidates"]
    assert rec["pick"] is rows[0] and rows[0]["kind"] == "tree"
    assert [r["speedup"] for r in rows] == sorted((r["speedup"] for r in rows), reverse=True)
    assert {r["kind"] for r in rows} == {"tree", "chain", "none"}
    assert sorted(r["label"] for r in rows if r["kind"] == "chain") == [f"chain {k}" for k in (1, 2, 3, 4)]
    pick = rec["pick"]
    # predicted tokens/step: the calibration's replay over held-out answers; speedup: over the relative step cost
    assert rec["prediction"] == "predicted_replay"
    assert pick["tokens_per_step"] == pytest.approx(cal.predict(pick["tree"])["predicted_replay"])
    assert pick["speedup"] == pytest.approx(pick["tokens_per_step"] / pick["relative_latency"])
    none = next(r for r in rows if r["kind"] == "none")
    assert none["speedup"] == 1.0 and none["tokens_per_step"] == 1.0
    assert pick["range"] is None and "(no spread measured)" in W.sentence(rec)
    assert W.sentence(rec).startswith(f"use {pick['label']} at batch 1 and context 128 (calibration synthetic, "
                                      "predicted_replay; the latency table): predicted ")


def test_the_answer_is_plans_choice_with_plans_numbers(cal, tmp_path):
    """One ranker: the app's pick, its tokens/step and speedup are `workbench plan`'s for the same inputs."""
    from workbench.plan.rank import make_plan
    from workbench.plan.source import plan_source

    f = tmp_path / "lat.csv"
    latency(CHEAP, batches=(1, 2), spread=0.05).to_csv(f, index=False)
    from workbench.measure.latency_file import read_latency
    plan = make_plan(plan_source(calibration=cal.folder), f, [1, 2])
    for row in plan["plans"]:
        rec = R.recommend(cal, read_latency(f), batch=row["batch_size"], latency_name=f.name)
        assert rec["pick"]["kind"] == row["kind"] and rec["pick"]["nodes"] == row["nodes"]
        assert rec["pick"]["speedup"] == pytest.approx(row["predicted_speedup"])
        assert rec["pick"]["tokens_per_step"] == pytest.approx(row["predicted_tokens_per_step"])
        assert f"latency {f.name})" in W.sentence(rec)


def test_measured_slower_than_plain_answers_no_speculation(cal):
    pick = R.recommend(cal, latency(CHEAP))["pick"]
    rec = R.recommend(cal, latency(CHEAP), sweeps={"s.csv": sweep(swept(pick["tree"], 0.8))})
    assert rec["answer"]["kind"] == "measured-none" and rec["pick"]["kind"] == "tree"
    text = W.sentence(rec)
    assert text.startswith("use no speculation at batch 1") and f"{pick['label']}, ran at 0.80x" in text


def test_nothing_pays_recommends_no_speculation(cal):
    rec = R.recommend(cal, latency(SLOW))
    assert rec["pick"]["kind"] == "none"
    assert W.sentence(rec).startswith("use no speculation at batch 1 and context 128")
    assert "no tree or chain is predicted faster than plain decoding" in W.sentence(rec)


def test_budget_and_latency_bound_the_candidates(cal):
    rec = R.recommend(cal, latency(CHEAP), max_budget=3)
    assert max(r["nodes"] for r in rec["candidates"]) <= 3
    rec = R.recommend(cal, latency(CHEAP))
    assert max(r["nodes"] for r in rec["candidates"]) <= max(SIZES) - 1  # no extrapolated latency


def test_spread_gives_a_range(cal):
    rec = R.recommend(cal, latency(CHEAP, spread=0.1))
    pick = rec["pick"]
    lo, hi = pick["range"]
    rel = pick["relative_latency"]
    # plan's range: the tree step over its interquartile range, the plain step at its median
    assert lo == pytest.approx(pick["tokens_per_step"] / (rel * 1.1))
    assert hi == pytest.approx(pick["tokens_per_step"] / (rel * 0.9))
    assert "x from the latency quartiles)" in W.sentence(rec)


def test_context_and_batch_are_picked_from_the_table(cal):
    df = latency(CHEAP, contexts=(128, 1024), batches=(1, 4))
    assert R.recommend(cal, df, target=900)["context"] == 1024
    rec = R.recommend(cal, df, context=128, batch=4)
    assert rec["batch"] == 4 and "at batch 4 and context 128" in W.sentence(rec)
    with pytest.raises(WorkbenchError, match="no rows for batch size\\(s\\) 2 \\(measured: 1, 4\\)"):
        R.recommend(cal, df, context=128, batch=2)
    with pytest.raises(WorkbenchError, match="no rows for batch size\\(s\\) 2 \\(measured: 1\\)"):
        R.recommend(cal, latency(CHEAP), batch=2)


def test_current_sweeps_are_evidence_and_disagreement_is_named(cal):
    pick = R.recommend(cal, latency(CHEAP))["pick"]
    tree, predicted = pick["tree"], pick["speedup"]
    agree = R.recommend(cal, latency(CHEAP), sweeps={"new.csv": sweep(swept(tree, predicted * 1.02, (50, 51)))})
    m = agree["pick"]["current"]
    assert m["speedup"] == pytest.approx(predicted * 1.02) and m["sweeps"] == ["new.csv"]
    # noise: the vanilla baseline's spread in that run (50 vs 51 tokens/s), sqrt(2) for the ratio
    import statistics
    assert m["noise"] == pytest.approx(2 ** 0.5 * statistics.stdev([50, 51]) / 50.5 * predicted * 1.02)
    assert not agree["disagree"]
    assert f"measured {predicted * 1.02:.2f}x +- {m['noise']:.2f} in the latency table's setting (new.csv, 12 prompts)" \
        in W.sentence(agree)
    far = R.recommend(cal, latency(CHEAP), sweeps={"new.csv": sweep(swept(tree, predicted / 2, (50, 51)))})
    assert far["disagree"] and far["disagree"][0]["tree"].paths == tree.paths
    assert W.disagreement_text(far).startswith("Measurements disagree with the prediction by more than their noise")


def test_named_trees_are_evidence_not_candidates(cal):
    mine = make_tree([[0], [1], [0, 2]], name="mine")
    rec = R.recommend(cal, latency(CHEAP), trees=[mine], sweeps={"s.csv": sweep(swept(mine, 1.1))})
    assert all(r["tree"] is None or r["tree"].paths != mine.paths for r in rec["candidates"])
    row = next(r for r in rec["measured_trees"] if r["tree"].paths == mine.paths)
    assert row["current"]["speedup"] == pytest.approx(1.1)
    assert row["tokens_per_step"] == pytest.approx(cal.predict(mine)["predicted_replay"])


def test_accuracy_table_only_uses_independence(cal):
    rec = R.recommend(cal.accuracies("fit"), latency(CHEAP))
    assert rec["prediction"] == "predicted_independent"
    from workbench.trees.optimize import expected_length
    pick = rec["pick"]
    assert pick["tokens_per_step"] == pytest.approx(expected_length(pick["tree"], cal.accuracies("fit")))


def test_a_latency_table_that_is_not_monotone_is_named(cal):
    df = latency(CHEAP)
    df.loc[df["tokens"] == 4, "seconds"] = (CHEAP(2) + CHEAP(3)) / 2  # as on this CPU: 4 tokens cheaper than 3
    rec = R.recommend(cal, df)
    assert rec["cheaper"] == [(3, 4)]
    assert W.latency_note(rec).startswith("the latency table is not monotone (4 tokens cheaper than 3)")
    assert R.recommend(cal, latency(CHEAP))["cheaper"] == [] and W.latency_note(R.recommend(cal, latency(CHEAP))) \
        is None


def test_measurements_from_another_setting_are_named(cal):
    from workbench.core.provenance import setting, setting_cell

    here = setting("cpu", "float32", 2, False)
    df = latency(CHEAP)
    df["setting"] = setting_cell(here)
    pick = R.recommend(cal, df)["pick"]
    rows = swept(pick["tree"], pick["speedup"])
    for r in rows:
        r["setting"] = setting_cell(dict(here, threads=1))
    rec = R.recommend(cal, df, sweeps={"s.csv": sweep(rows)})
    assert "threads 2 vs 1" in W.setting_text(rec) and W.provenance_note(rec) is None
    # older files: the setting is unknown, said in words, not as a difference
    old = R.recommend(cal, latency(CHEAP), sweeps={"s.csv": sweep(swept(pick["tree"], 1.0))})
    assert W.setting_text(old) is None and "does not record the setting" in W.provenance_note(old)


def test_only_measurements_in_the_latency_tables_setting_are_weighed(cal):
    """A sweep at another thread count (or one that does not record its setting, beside a table that does) is shown,
    never weighed: half the prediction measured at 1 thread is no disagreement with a 2-thread table, and the answer
    does not turn into "no speculation" on it. The same sweep in the table's setting is weighed."""
    from workbench.core.provenance import setting, setting_cell

    here = setting("cpu", "float32", 2, False)
    df = latency(CHEAP)
    df["setting"] = setting_cell(here)
    pick = R.recommend(cal, df)["pick"]

    def at(where: dict | None) -> dict:
        rows = swept(pick["tree"], pick["speedup"] / 2)
        for r in rows:
            r["setting"] = None if where is None else setting_cell(where)
        return R.recommend(cal, df, sweeps={"s.csv": sweep(rows)})

    for where, why in ((dict(here, threads=1), "threads 2 vs 1"), (None, "provenance unknown")):
        rec = at(where)
        row = rec["pick"]
        assert row["current"] is None and not rec["disagree"] and rec["elsewhere"] == [row]
        assert rec["answer"]["kind"] == "plan" and row["measured"][0]["elsewhere"][0].startswith(why)
        assert f"not measured in this latency table's setting ({pick['speedup'] / 2:.2f}x in s.csv, {why}" \
            in W.sentence(rec)
    same = at(dict(here, load_average=1.7))  # the load is recorded, not compared
    assert same["pick"]["current"]["speedup"] == pytest.approx(pick["speedup"] / 2) and same["disagree"]
    assert same["answer"]["kind"] == "measured-none" and not same["elsewhere"]
