"""Plans per batch size: the latency surface with its spread, the planner exact against brute force over every
tree, acceptance vectors, the plan file, and each engine's settings from a plan (vLLM's schedule checked with a
re-implementation of vLLM's own validator and lookup). Bad input: one `error:` line, exit 2."""
import ast
import json
from itertools import product

import numpy as np
import pandas as pd
import pytest

from workbench import WorkbenchError
from workbench.calibrate.folder import Calibration
from workbench.calibrate.run import CalibrateConfig, calibrate
from workbench.cli import main
from workbench.core.speed import relative_latency, speedup, speedup_at, speedup_range, within_noise
from workbench.export.engines import PLAN_FORMATS, export_plan
from workbench.measure.latency_file import latency_surface, non_decreasing, read_latency
from workbench.plan.rank import make_plan
from workbench.plan.plan_file import PLAN_ROW, plan_json, read_plan
from workbench.plan.source import check_acceptance, plan_source, read_acceptance
from workbench.trees.accuracies import write_accuracies
from workbench.trees.optimize import expected_length
from workbench.trees.tree import chain_tree, load_tree, make_tree

PROMPTS = ["Tell me a story.", "What is 2+2?", "Name three colours.", "hi", "Why is the sky blue?",
           "Write a haiku about rain.", "List some fruits", "How do magnets work?"]


def _error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("Loading weights")]
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def surface(batches=(1, 2, 4, 8), sizes=(1, 2, 3, 4, 6, 8, 12, 15), per_token=0.03, per_batch_token=0.02,
            bump=None, context=128, spread=0.02) -> pd.DataFrame:
    """t(B, n) = 10 ms * (1 + per_token * n + per_batch_token * B * n) (+ a bump at one n, to make it non-monotone),
    with a symmetric interquartile range of +-spread."""
    rows = []
    for b in batches:
        for n in sizes:
            t = 0.01 * (1 + per_token * (n - 1) + per_batch_token * b * (n - 1) + (bump or {}).get(n, 0.0))
            rows.append(dict(model="synthetic", device="test", dtype="float32", batch=b, context=context, tokens=n,
                             seconds=t, seconds_min=t * (1 - 2 * spread), seconds_q1=t * (1 - spread),
                             seconds_q3=t * (1 + spread), seconds_max=t * (1 + 2 * spread), repeats=10))
    return pd.DataFrame(rows)


def _acc(seed: int, k: int = 3, r: int = 2) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.sort(rng.dirichlet(np.ones(r + 1), size=k)[:, :r] * rng.uniform(0.6, 1, (k, 1)), axis=1)[:, ::-1]


def every_tree(depth: int, ranks: int):
    """Every non-empty prefix-closed set of paths with depth <= `depth` and ranks < `ranks` (676 for 3 x 2)."""
    def below(prefix):  # every closed subtree hanging under `prefix` (as a list of node sets)
        if len(prefix) == depth:
            return [[]]
        per_child = [[[]] + [[prefix + (r,)] + sub for sub in below(prefix + (r,))] for r in range(ranks)]
        return [sum(choice, []) for choice in product(*per_child)]
    return [make_tree([list(p) for p in nodes]) for nodes in below(()) if nodes]


def brute_force(acc, table: dict) -> float:
    """The best predicted speedup over every tree (and no speculation), each priced independently: expected length
    and t read at the next measured size up (numpy's searchsorted)."""
    sizes, secs = np.array(sorted(table)), np.array([table[n] for n in sorted(table)])
    best = 1.0
    for t in every_tree(*acc.shape):
        if t.nodes + 1 <= sizes.max():
            best = max(best, expected_length(t, acc) / (secs[np.searchsorted(sizes, t.nodes + 1)] / secs[0]))
    return best


# ----------------------------------------------------------------------------------------------- the surface

@pytest.mark.unit
def test_version_1_latency_csvs_are_upgraded_to_batch_1(tmp_path):
    """A latency CSV of version 1 without a batch column (the committed bare-forward table as it was, before it was
    rewritten through upgrade_latency) reads as batch 1, as the rewritten one does; another version is one line."""
    from workbench import REPO_ROOT
    from workbench.measure.latency_file import LATENCY_VERSION

    committed = REPO_ROOT / "calibration" / "smollm2-135m-instruct-alpaca-eval" / "latency-forward-cpu.csv"
    assert (pd.read_csv(committed)["version"] == LATENCY_VERSION).all()
    raw = pd.read_csv(committed).drop(columns=["batch", "version"])
    f = tmp_path / "v1.csv"
    raw.to_csv(f, index=False)
    assert "seconds_q1" not in raw.columns
    df = read_latency(f)
    assert set(df["batch"]) == {1} and (df["version"] == LATENCY_VERSION).all()
    pd.testing.assert_frame_equal(df, read_latency(committed))
    raw.assign(version=LATENCY_VERSION + 1).to_csv(tmp_path / "newer.csv", index=False)
    with pytest.raises(WorkbenchError, match=f"version '{LATENCY_VERSION + 1}', but this workbench reads latency CSVs"):
        read_latency(tmp_path / "newer.csv")
    surf, ctx = latency_surface(df, [1], context=128)
    want = raw[raw["context"] == 128]
    assert ctx == 128 and surf[1]["measured"] == dict(zip(want["tokens"], want["seconds"]))
    assert surf[1]["seconds"] == non_decreasing(surf[1]["measured"])
    assert surf[1]["spread"] is None  # unknown, not zero
    with pytest.raises(WorkbenchError, match=r"no rows for batch size\(s\) 2, 4 \(measured: 1\)"):
        latency_surface(df, [1, 2, 4], context=128)


@pytest.mark.unit
def test_surface_names_every_missing_batch_size_and_context():
    df = pd.concat([surface(batches=(1, 2), context=128), surface(batches=(1,), context=512)])
    surf, ctx = latency_surface(df, [1, 2], target=400)  # 512 is nearer, but only 128 has both batch sizes
    assert ctx == 128 and set(surf) == {1, 2}
    with pytest.raises(WorkbenchError, match=r"batch size\(s\) 4, 16 "):
        latency_surface(df, [1, 4, 16])
    with pytest.raises(WorkbenchError, match=r"no rows at context 512 for batch size\(s\) 2 "):
        latency_surface(df, [1, 2], context=512)
    with pytest.raises(WorkbenchError, match="pick one with --context"):
        latency_surface(df, [1])


@pytest.mark.unit
def test_spread_columns_are_checked(tmp_path):
    df = surface()
    df.to_csv(tmp_path / "ok.csv", index=False)
    assert read_latency(tmp_path / "ok.csv")["seconds_q3"].gt(read_latency(tmp_path / "ok.csv")["seconds"]).all()
    bad = df.assign(seconds_q1=df["seconds"] * 1.5)  # q1 above the median
    bad.to_csv(tmp_path / "bad.csv", index=False)
    df.drop(columns="seconds_max").to_csv(tmp_path / "part.csv", index=False)
    for f in ("bad.csv", "part.csv"):
        with pytest.raises(WorkbenchError, match="min <= q1 <= seconds <= q3 <= max"):
            read_latency(tmp_path / f)


@pytest.mark.unit
def test_one_speedup_formula_and_the_noise_test():
    table, spread = {1: 0.02, 5: 0.03}, {1: (0.019, 0.021), 5: (0.028, 0.033)}
    assert relative_latency(table, 4) == pytest.approx(0.03 / 0.02)
    assert speedup(1.8, relative_latency(table, 4)) == pytest.approx(1.8 * 0.02 / 0.03)
    assert speedup_at(table, 1.8, 4) == speedup(1.8, 0.03 / 0.02)
    lo, hi = speedup_range(table, spread, 1.8, 4)
    assert lo == pytest.approx(1.8 * 0.02 / 0.033) and hi == pytest.approx(1.8 * 0.02 / 0.028)
    none = speedup_range(table, spread, 1.0, 0)
    assert none[0] < 1 < none[1]  # vanilla against itself: 1 inside its own spread
    assert within_noise((1.0, 1.2), (1.1, 1.3)) is True and within_noise((1.0, 1.1), (1.2, 1.3)) is False
    assert within_noise(None, (1.0, 1.1)) is None and speedup_range(table, None, 1.8, 4) is None


# ----------------------------------------------------------------------------------------------- the planner

def _plan(acc, df, tmp_path, batches):
    write_accuracies(tmp_path / "acc.csv", acc)
    df.to_csv(tmp_path / "lat.csv", index=False)
    return make_plan(plan_source(accuracies=tmp_path / "acc.csv"), tmp_path / "lat.csv", batches)


@pytest.mark.unit
def test_a_table_is_read_non_decreasing():
    """Pool-adjacent-violators on the Medusa steps: the least-squares non-decreasing fit (a dip pooled with what
    it undercuts), t(1) untouched, an ordered pair of columns stays ordered, the surface keeps the file's values."""
    assert non_decreasing({1: 1.0, 2: 1.68, 3: 1.74, 4: 1.75, 5: 1.50, 6: 1.34, 8: 1.80, 10: 1.77, 16: 1.90}) == \
        pytest.approx({1: 1.0, 2: 1.602, 3: 1.602, 4: 1.602, 5: 1.602, 6: 1.602, 8: 1.785, 10: 1.785, 16: 1.90})
    assert non_decreasing({1: 5.0, 2: 1.0, 3: 2.0}) == {1: 5.0, 2: 1.0, 3: 2.0}  # t(1) is not pooled
    rng = np.random.default_rng(0)
    for _ in range(50):
        low = rng.random(8)
        high = low + rng.random(8)
        a, b = non_decreasing(dict(enumerate(low, 1))), non_decreasing(dict(enumerate(high, 1)))
        assert all(a[n] <= b[n] + 1e-12 for n in a) and all(a[n] <= a[n + 1] + 1e-12 for n in range(2, 8))
        assert sum(list(a.values())[1:]) == pytest.approx(sum(low[1:]))  # pooling keeps the sum
    df = surface(per_token=0.02, per_batch_token=0.05, bump={3: 0.4})
    s, _ = latency_surface(df, [1])
    raw = dict(zip(df[df["batch"] == 1]["tokens"], df[df["batch"] == 1]["seconds"]))
    assert s[1]["measured"] == raw and s[1]["seconds"] == non_decreasing(raw) != raw


@pytest.mark.unit
def test_a_step_is_priced_at_its_own_depth(tmp_path):
    """Each head is one more vocabulary projection per sequence, so a table that times deep trees misprices bushy
    ones of as many tokens: with the heads' cost beside the table (depth, heads_seconds) a tree is priced at its own
    depth, t(n) - h(depth timed) + h(its depth), the same in plan's ranking and for any tree the app scores; a
    table without those columns is priced as timed; half-filled columns are one error."""
    from workbench.plan.recommend import latency_tables
    from workbench.plan.source import accuracy_source
    from workbench.plan.surface import Surface
    from workbench.plan.weigh import price, weigh
    from workbench.core.speed import at_depth, priced

    h = {0: 0.0, 1: 0.002, 2: 0.004, 3: 0.008}
    df = surface(batches=(8,), sizes=(1, 2, 3, 4))
    df["depth"] = df["tokens"].map({1: 0, 2: 1, 3: 2, 4: 3})  # the timed trees: chains
    df["heads_seconds"] = df["depth"].map(h)
    df.to_csv(tmp_path / "lat.csv", index=False)
    s, _ = latency_surface(read_latency(tmp_path / "lat.csv"), [8])
    table, heads = s[8]["seconds"], s[8]["head_cost"]
    assert heads == dict(depth={1: 0, 2: 1, 3: 2, 4: 3}, seconds=h)
    assert at_depth(table, heads, 1) == pytest.approx({1: table[1], 2: table[2], 3: table[3] - 0.002,
                                                        4: table[4] - 0.006})
    assert at_depth(table, heads, 3) == pytest.approx({1: table[1], 2: table[2] + 0.006, 3: table[3] + 0.004,
                                                        4: table[4]})
    assert at_depth(table, None, 1) == table and at_depth(table, heads, None) == table
    bushy, chain = make_tree([[0], [1], [2]]), chain_tree(3)
    fast, rng, rel = priced(table, s[8]["spread"], heads, 1.5, 3, bushy.depth)
    assert fast == pytest.approx(1.5 * table[1] / (table[4] - 0.006)) and rng[0] < fast < rng[1]
    assert rel == pytest.approx((table[4] - 0.006) / table[1])
    assert priced(table, None, heads, 1.5, 3, chain.depth)[0] == pytest.approx(speedup_at(table, 1.5, 3))
    # plan's weighing and the app's pricing of a tree agree, and both use the depth
    src = accuracy_source(np.array([[0.6, 0.2, 0.1], [0.4, 0.1, 0.05], [0.3, 0.05, 0.02]]), "acc")
    tables = latency_tables(read_latency(tmp_path / "lat.csv"), batch=8)
    for t, rel in ((bushy, (table[4] - 0.006) / table[1]), (chain, table[4] / table[1])):
        got, tps = price(src, tables, t), src.predict(t)
        assert got.relative_latency == pytest.approx(rel) and got.speedup == pytest.approx(tps / rel)
        assert got.speedup == pytest.approx(priced(table, s[8]["spread"], heads, tps, 3, t.depth)[0])
    ranked = weigh(src, Surface(read_latency(tmp_path / "lat.csv")), 8, tables.context).ranked
    assert next(c for c in ranked if c.kind == "chain" and c.nodes == 3).speedup == \
        pytest.approx(price(src, tables, chain).speedup)
    no_heads = latency_tables(read_latency(tmp_path / "lat.csv").drop(columns=["depth", "heads_seconds"]), batch=8)
    assert price(src, no_heads, bushy).speedup == pytest.approx(speedup_at(table, src.predict(bushy), 3))
    # the plan file says whether the heads' cost was known
    write_accuracies(tmp_path / "acc.csv", np.array([[0.6, 0.2], [0.4, 0.1], [0.3, 0.05]]))
    plan = make_plan(plan_source(accuracies=tmp_path / "acc.csv"), tmp_path / "lat.csv", [8])
    assert plan["latency"]["head_cost"] is True
    # reading: empty columns (a bare verify table) are no heads' cost; half-filled ones are an error
    df.assign(depth=None, heads_seconds=None).to_csv(tmp_path / "empty.csv", index=False)
    assert "depth" not in read_latency(tmp_path / "empty.csv").columns
    df.assign(heads_seconds=df["heads_seconds"].where(df["tokens"] < 4)).to_csv(tmp_path / "half.csv", index=False)
    df.assign(depth=df["depth"].where(df["tokens"] > 1, 1)).to_csv(tmp_path / "root.csv", index=False)
    for bad in ("half.csv", "root.csv"):
        with pytest.raises(WorkbenchError, match="depth, heads_seconds"):
            read_latency(tmp_path / bad)


@pytest.mark.unit
def test_every_tree_counted():
    assert len(every_tree(3, 2)) == 676 - 1 and len(every_tree(2, 2)) == 24


@pytest.mark.unit
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("shape", ["flat", "steep", "bump"])
def test_plan_is_the_best_of_every_tree_per_batch_size(seed, shape, tmp_path):
    """Per batch size the plan's predicted speedup equals the best over all 675 trees of depth <= 3 and ranks < 2
    (and no speculation), each priced on its own on the table read non-decreasing (the bump is pooled away); the
    chosen row's tree gives exactly that speedup."""
    acc = _acc(seed)
    df = {"flat": surface(per_token=0.005, per_batch_token=0.004),
          "steep": surface(per_token=0.2, per_batch_token=0.15),
          "bump": surface(per_token=0.02, per_batch_token=0.05, bump={3: 0.4, 2: 0.1})}[shape]
    plan = _plan(acc, df, tmp_path, [1, 2, 4, 8])
    for row in plan["plans"]:
        table = non_decreasing(dict(zip(*[df[df["batch"] == row["batch_size"]][c] for c in ("tokens", "seconds")])))
        assert row["predicted_speedup"] == pytest.approx(brute_force(acc, table), rel=1e-12)
        if row["kind"] == "none":
            assert row["medusa_choices"] == [] and row["predicted_speedup"] == 1.0
        else:
            tree = load_tree(row["medusa_choices"])
            assert row["predicted_tokens_per_step"] == pytest.approx(expected_length(tree, acc), rel=1e-12)
            assert row["predicted_speedup"] == pytest.approx(speedup_at(table, expected_length(tree, acc),
                                                                        tree.nodes), rel=1e-12)
            assert (row["kind"] == "chain") == (tree.paths == chain_tree(tree.nodes).paths)


@pytest.mark.unit
def test_plan_kinds_move_with_batch_size(tmp_path):
    """With verify cost growing in B x n: a big tree at batch 1, smaller ones, a chain, then no speculation."""
    acc = np.array([[0.5, 0.1], [0.4, 0.05], [0.3, 0.02]])
    plan = _plan(acc, surface(batches=(1, 2, 4, 8, 16, 32), per_token=0.0, per_batch_token=0.02), tmp_path,
                 [1, 2, 4, 8, 16, 32])
    kinds = [r["kind"] for r in plan["plans"]]
    nodes = [r["nodes"] for r in plan["plans"]]
    assert kinds[0] == "tree" and kinds[-1] == "none" and "chain" in kinds, kinds
    assert nodes == sorted(nodes, reverse=True)  # the cost of a token grows with B: never more nodes
    assert [r["batch_size"] for r in plan["plans"]] == [1, 2, 4, 8, 16, 32]
    assert all(list(r) == list(PLAN_ROW) + ["predicted_batch_tokens_per_step"] for r in plan["plans"])
    # an accuracy table has no answers: a batch's tokens/step is the mean's
    assert all(r["predicted_batch_tokens_per_step"] == r["predicted_tokens_per_step"] for r in plan["plans"])


@pytest.mark.unit
def test_runner_up_and_noise(tmp_path):
    """The runner-up is the best of another kind; it is within noise when the speedup ranges over the IQR of t
    overlap, and unknown without a spread."""
    acc = np.array([[0.5, 0.01], [0.3, 0.01], [0.1, 0.01]])
    wide, narrow = (_plan(acc, surface(per_token=0.01, per_batch_token=0.0, spread=s), tmp_path, [1])
                    for s in (0.3, 0.001))
    w, n = wide["alternatives"][0], narrow["alternatives"][0]
    assert wide["plans"][0]["kind"] != w["runner_up"]["kind"]
    assert w["runner_up_within_noise"] is True and n["runner_up_within_noise"] is False
    lo, hi = w["speedup_range"]
    assert lo < wide["plans"][0]["predicted_speedup"] < hi
    old = _plan(acc, surface(per_token=0.01, per_batch_token=0.0).drop(columns=["seconds_q1", "seconds_q3",
                                                                                  "seconds_min", "seconds_max"]),
                tmp_path, [1])
    assert old["alternatives"][0]["runner_up_within_noise"] is None and old["latency"]["spread"] is False


@pytest.mark.unit
def test_the_none_rule_answers_no_speculation_where_the_gain_is_inside_the_latency_noise(tmp_path, capsys):
    """weigh's noise rule: with "none", a speculating choice whose predicted range overlaps no speculation's (the
    table's quartiles cannot tell them apart) becomes no speculation, the fastest set aside and named; outside the
    noise, without quartiles, and under the default "fastest" the ranking stands (the Medusa plans as they are)."""
    from workbench.plan.surface import Surface
    from workbench.plan.weigh import weigh

    acc = np.array([[0.08, 0.01], [0.02, 0.01], [0.01, 0.01]])  # a few % above plain: a small gain
    write_accuracies(tmp_path / "acc.csv", acc)
    src = plan_source(accuracies=tmp_path / "acc.csv")
    for spread, inside in ((0.05, True), (0.001, False)):
        df = surface(per_token=0.01, per_batch_token=0.0, spread=spread)
        df.to_csv(tmp_path / "lat.csv", index=False)
        fastest = weigh(src, Surface.read(tmp_path / "lat.csv"), 1, 128)
        ruled = weigh(src, Surface.read(tmp_path / "lat.csv"), 1, 128, noise="none")
        assert fastest.best.kind != "none" and fastest.set_aside is None and fastest.best.speedup > 1
        none = next(c for c in fastest.ranked if c.kind == "none")
        assert within_noise(fastest.best.range, none.range) is inside
        if inside:
            assert ruled.best.kind == "none" and ruled.set_aside == fastest.best and ruled.runner_up == fastest.best
            assert ruled.within_noise is True and ruled.ranked[1:] == [c for c in fastest.ranked if c.kind != "none"]
        else:
            assert ruled.ranked == fastest.ranked and ruled.set_aside is None
        plan = make_plan(src, tmp_path / "lat.csv", [1], noise="none")
        assert plan["within_noise"] == "none" and (plan["plans"][0]["kind"] == "none") is inside
        assert (plan["alternatives"][0]["set_aside"] is None) is not inside
        assert "within_noise" not in make_plan(src, tmp_path / "lat.csv", [1])  # the default: as before
    bare = surface(per_token=0.01, per_batch_token=0.0, spread=0.05).drop(
        columns=["seconds_q1", "seconds_q3", "seconds_min", "seconds_max"])
    bare.to_csv(tmp_path / "bare.csv", index=False)
    assert weigh(src, Surface.read(tmp_path / "bare.csv"), 1, 128, noise="none").best.kind != "none"  # noise unknown
    # the CLI: the rule's answer worded, an unknown rule one error line and nothing written
    surface(per_token=0.01, per_batch_token=0.0, spread=0.05).to_csv(tmp_path / "lat.csv", index=False)
    out = tmp_path / "plan.json"
    assert main(["plan", "--accuracies", str(tmp_path / "acc.csv"), "--latency", str(tmp_path / "lat.csv"),
                 "--batch-sizes", "1", "--within-noise", "none", "--out", str(out)]) == 0
    assert read_plan(out)["plans"][0]["kind"] == "none"
    assert "lies within the latency noise of no speculation: no speculation" in capsys.readouterr().err
    assert main(["plan", "--accuracies", str(tmp_path / "acc.csv"), "--latency", str(tmp_path / "lat.csv"),
                 "--batch-sizes", "1", "--within-noise", "maybe", "--out", str(tmp_path / "p2.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "--within-noise 'maybe': use fastest or none" in err
    assert not (tmp_path / "p2.json").exists()


# ----------------------------------------------------------------------------------------------- acceptance vectors

@pytest.mark.unit
def test_acceptance_vectors(tmp_path):
    (tmp_path / "a.csv").write_text("position,acceptance\n2,0.4\n1,0.7\n3,0.2\n")
    (tmp_path / "a.json").write_text("[0.7, 0.4, 0.2]")
    (tmp_path / "cfg.json").write_text(json.dumps({"method": "eagle3", "synthetic_acceptance_rates": [0.7, 0.4, 0.2]}))
    (tmp_path / "zero.csv").write_text("position,acceptance\n0,0.7\n1,0.4\n2,0.2\n")
    for f in ("a.csv", "a.json", "cfg.json", "zero.csv"):
        assert read_acceptance(tmp_path / f) == [0.7, 0.4, 0.2]
    for bad, needle in [([0.5, 0.6], "rises from 0.5 at position 1 to 0.6 at position 2"), ([0.5, 0.0], "(0, 1]"),
                        ([1.2], "(0, 1]"), ([], "non-empty"), (["x"], "(0, 1]"), ([0.5, float("nan")], "(0, 1]")]:
        with pytest.raises(WorkbenchError, match=needle.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
            check_acceptance(bad)


@pytest.mark.unit
def test_plan_from_an_acceptance_vector_weighs_chains_only(tmp_path, capsys):
    (tmp_path / "a.json").write_text("[0.8, 0.6, 0.45, 0.3]")
    surface(per_token=0.01, per_batch_token=0.03).to_csv(tmp_path / "lat.csv", index=False)
    assert main(["plan", "--acceptance", str(tmp_path / "a.json"), "--latency", str(tmp_path / "lat.csv"),
                 "--batch-sizes", "1,2,4,8", "--out", str(tmp_path / "plan.json")]) == 0
    err = capsys.readouterr().err
    assert "only chains" in err
    plan = read_plan(tmp_path / "plan.json")
    rates = [0.8, 0.6, 0.45, 0.3]
    for row in plan["plans"]:
        assert row["kind"] in ("chain", "none")
        df = surface(per_token=0.01, per_batch_token=0.03)
        table = dict(zip(*[df[df["batch"] == row["batch_size"]][c] for c in ("tokens", "seconds")]))
        best = max([1.0] + [speedup_at(table, 1 + sum(rates[:k]), k) for k in range(1, 5)])
        assert row["predicted_speedup"] == pytest.approx(best, rel=1e-12)
        assert row["predicted_tokens_per_step"] == pytest.approx(1 + sum(rates[:row["nodes"]]))
    assert plan["chain_acceptance"] == rates and plan["source"]["kind"] == "acceptance"


# ----------------------------------------------------------------------------------------------- a calibration

@pytest.fixture(scope="module")
def calib(tiny_llama, make_prompt_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("cal") / "tiny"
    calibrate(CalibrateConfig(model=str(tiny_llama.model_dir), heads=str(tiny_llama.heads_dirs["2"]),
                              prompts=str(make_prompt_file(PROMPTS)), name="tiny", out=out, holdout=0.25,
                              max_new_tokens=12, topk=4, budgets=(3,), batch_size=8, device="cpu"), progress=False)
    return out


@pytest.fixture(scope="module")
def flat_latency(tmp_path_factory):
    """Verify tokens nearly free at small batch sizes (the tiny random heads' ~1.5% acceptance pays), dear at large
    ones (0.6% of a step per token per sequence: beyond what any of their predictions accepts at batch 16)."""
    f = tmp_path_factory.mktemp("lat") / "lat.csv"
    surface(batches=(1, 2, 4, 8, 16), sizes=(1, 2, 3, 4, 5, 8, 16), per_token=0.0, per_batch_token=0.006,
            spread=0.01).to_csv(f, index=False)
    return f


@pytest.mark.parametrize("prediction", ["replay", "joint", "independent"])
def test_plan_cli_with_a_calibration(calib, flat_latency, tmp_path, capsys, prediction):
    out = tmp_path / "plan.json"
    assert main(["plan", "--calibration", str(calib), "--latency", str(flat_latency), "--batch-sizes", "1,2,4,8,16",
                 "--prediction", prediction, "--out", str(out)]) == 0
    err = capsys.readouterr().err
    table = [line.split() for line in err.splitlines() if line[:5].strip().isdigit()]
    plan = read_plan(out)
    assert [int(r[0]) for r in table] == [1, 2, 4, 8, 16] == [r["batch_size"] for r in plan["plans"]]
    assert "within noise" in err and "runner-up" in err
    cal = Calibration(calib)
    key = f"predicted_{prediction}"
    surface, _ = latency_surface(read_latency(flat_latency), [1, 2, 4, 8, 16], 128)
    for row in plan["plans"]:
        if row["kind"] != "none":  # the one producer of predictions
            assert row["predicted_tokens_per_step"] == cal.predict(row["tree"])[key]
            # the speedup divides the batch's tokens/step: the replay's batch walk, the mean's for the others
            b = row["batch_size"]
            batch = cal.batch_replay(row["tree"], b) if prediction == "replay" else row["predicted_tokens_per_step"]
            assert row["predicted_batch_tokens_per_step"] == pytest.approx(batch)
            assert row["predicted_speedup"] == pytest.approx(speedup_at(surface[b]["seconds"], batch, row["nodes"]))
    meta = json.loads((calib / "meta.json").read_text())
    regime = plan["source"].pop("regime")
    assert plan["source"] == dict(kind="calibration", path=str(calib), prediction=key, model=meta["model"],
                                  heads=meta["heads"], heads_sha256=meta["args"]["heads_sha256"],
                                  num_heads=meta["num_heads"], max_new_tokens=meta["max_new_tokens"])
    # the plan says which statistic and answers its predictions assume
    assert (f"the first {meta['max_new_tokens']} tokens" in regime) and \
        ("replayed" in regime) == (prediction == "replay")
    # a latency file without a setting column: provenance unknown, said loudly
    assert plan["latency"] == dict(file=str(flat_latency), context=128, spread=True, head_cost=False,
                                   model="synthetic", device="test", dtype="float32", setting=None,
                                   mode="unknown (the table does not record its setting)",
                                   engine="workbench", engine_version=None,  # a version 2 table: our decoder's
                                   batch_shrinks=False,  # it steps all B rows to the end
                                   dynamic=None)  # and no per-step tree timed
    assert "warning: the latency table times the bare verify forward (or does not say what it timed)" in err
    assert "step cost: as the table timed it" in err and "`workbench latency --heads DIR` times it" in err
    assert plan["workbench_version"] and plan["created"].startswith("20")
    assert plan["plans"][-1]["kind"] == "none" and plan["plans"][0]["kind"] != "none"


# ----------------------------------------------------------------------------------------------- engine outputs

def vllm_lookup(schedule, max_batch: int, k_max: int) -> list[int]:
    """vLLM's checks and dense lookup of num_speculative_tokens_per_batch_size, re-implemented from
    vllm/v1/spec_decode/dynamic/utils.py (validate_and_normalize_dynamic_sd_schedule,
    build_dynamic_sd_schedule_lookup, 3-item form): index b = K at batch size b."""
    assert isinstance(schedule, list) and schedule
    assert all(isinstance(e, list) and len(e) == 3 and all(isinstance(x, int) for x in e) for e in schedule)
    assert all(lo > 0 and hi > 0 and lo <= hi and k >= 0 for lo, hi, k in schedule)
    ranges = sorted((lo, hi) for lo, hi, _ in schedule)
    prev = 0
    for lo, hi in ranges:
        assert lo > prev, "Batch-size ranges must be non-overlapping and sorted."
        prev = hi
    assert ranges[0][0] == 1, "The first batch-size range must start at 1"
    dense, next_bs, last_k = [0] * (max_batch + 1), 1, None
    for lo, hi, k in sorted(schedule):
        if lo > next_bs and last_k is not None:
            for b in range(next_bs, min(lo, max_batch + 1)):
                dense[b] = min(k_max, last_k)
        for b in range(max(lo, next_bs), min(hi, max_batch) + 1):
            dense[b] = min(k_max, k)
        next_bs, last_k = max(next_bs, hi + 1), k
    for b in range(next_bs, max_batch + 1):
        dense[b] = min(k_max, last_k)
    return dense


@pytest.fixture(scope="module")
def plan_file(calib, flat_latency, tmp_path_factory):
    out = tmp_path_factory.mktemp("plan") / "plan.json"
    assert main(["plan", "--calibration", str(calib), "--latency", str(flat_latency), "--batch-sizes", "1,2,4,8,16",
                 "--prediction", "joint", "--out", str(out)]) == 0
    return out


def _k_of(plan, row) -> int:
    if row["kind"] == "tree":
        return next(a for a in plan["alternatives"] if a["batch_size"] == row["batch_size"])["best_chain"]["k"]
    return row["nodes"]


def test_vllm_schedule_covers_every_batch_size(plan_file, tiny_llama, tmp_path, capsys):
    plan = read_plan(plan_file)
    rows = plan["plans"]
    ks = [_k_of(plan, row) for row in rows]
    # another drafter: one Dynamic SD schedule, looked up as vLLM does
    assert main(["export", str(plan_file), "--format", "vllm", "--method", "eagle3", "--draft-model", str(tmp_path),
                 "--synthetic", "--out", str(tmp_path / "e.json")]) == 0
    err = capsys.readouterr().err
    cfg = json.loads((tmp_path / "e.json").read_text())
    assert cfg["method"] == "eagle3" and cfg["model"] == str(tmp_path.resolve())
    k_max = cfg["num_speculative_tokens"]
    assert k_max == max(ks) > 0
    if len(set(ks)) > 1:
        sched = cfg["num_speculative_tokens_per_batch_size"]
        covered = [b for lo, hi, _ in sched for b in range(lo, hi + 1)]
        assert covered == list(range(1, 17))  # every batch size 1..16 exactly once: no gap, no overlap
        dense = vllm_lookup(sched, 40, k_max)
        for b in range(1, 41):
            row = [r for r in rows if r["batch_size"] <= b][-1]
            assert dense[b] == _k_of(plan, row), b
        assert "0.24.0" in err
    rates = cfg["synthetic_acceptance_rates"]
    assert cfg["rejection_sample_method"] == "synthetic" and len(rates) == k_max
    assert all(0 < r <= 1 for r in rates) and rates == sorted(rates, reverse=True)
    assert rates == plan["chain_acceptance"][:k_max]
    if any(r["kind"] == "tree" for r in rows):
        assert "vLLM drafts no trees" in err and "costs" in err
    # Medusa: never a schedule (its proposer asserts K == num_speculative_tokens): one constant K per range
    assert main(["export", str(plan_file), "--format", "vllm", "--heads", str(tiny_llama.heads_dirs["2"]),
                 "--out", str(tmp_path / "m.json")]) == 0
    err = capsys.readouterr().err
    out = json.loads((tmp_path / "m.json").read_text())
    entries = out if isinstance(out, list) else [{"batch_sizes": [1, 16], "speculative_config": out}]
    assert len(set(ks)) == len({(e["speculative_config"] or {}).get("num_speculative_tokens", 0) for e in entries})
    for e in entries:
        cfg = e["speculative_config"]
        lo, hi = e["batch_sizes"]
        if cfg is not None:
            assert "num_speculative_tokens_per_batch_size" not in cfg
            assert cfg["method"] == "medusa" and cfg["model"] == str(tiny_llama.heads_dirs["2"].resolve())
        for b in range(lo, hi + 1):
            row = [r for r in rows if r["batch_size"] <= b][-1]
            assert (cfg or {}).get("num_speculative_tokens", 0) == _k_of(plan, row)
    if isinstance(out, list):
        assert "AssertionError" in err and "one constant-K config per batch-size range" in err


def test_vllm_one_k_and_static_formats_from_a_plan(plan_file, capsys, tmp_path):
    plan = read_plan(plan_file)
    first = plan["plans"][0]
    assert main(["export", str(plan_file), "--format", "vllm", "--batch-sizes", "3"]) == 0
    cfg = json.loads(capsys.readouterr().out)
    assert cfg["method"] == "medusa"  # the calibration's own heads
    assert cfg["num_speculative_tokens"] == _k_of(plan, plan["plans"][1]) and \
        "num_speculative_tokens_per_batch_size" not in cfg
    for fmt in ("medusa", "eagle", "trtllm", "vllm-tree", "json"):
        rc = main(["export", str(plan_file), "--format", fmt])
        out, err = capsys.readouterr()
        if fmt == "eagle" and first["tree"].depth < 2:
            assert rc == 2
            continue
        assert rc == 0, err
        assert "batch-size 1 row" in err
        if fmt in ("medusa", "eagle"):
            rhs = ast.literal_eval([line for line in out.splitlines() if " = " in line][0].split(" = ", 1)[1])
        elif fmt == "trtllm":
            rhs = ast.literal_eval(out.splitlines()[1][len('--medusa_choices="'):-1])
        elif fmt == "vllm-tree":
            rhs = ast.literal_eval(json.loads(out)["speculative_token_tree"])
        else:
            rhs = json.loads(out)["medusa_choices"]
        assert set(map(tuple, rhs)) == set(first["tree"].paths)


def test_plan_outputs_refuse_what_engines_cannot_take(plan_file, tiny_llama, tmp_path, capsys):
    plan = json.loads(plan_file.read_text())
    none_everywhere = dict(plan, plans=[dict(r, kind="none", medusa_choices=[], nodes=0, predicted_speedup=1.0,
                                             predicted_tokens_per_step=1.0) for r in plan["plans"]])
    (tmp_path / "none.json").write_text(plan_json(none_everywhere))
    bad_kind = dict(plan, plans=[dict(plan["plans"][0], kind="chain", medusa_choices=[[0], [1]], nodes=2)])
    (tmp_path / "kind.json").write_text(json.dumps(bad_kind))
    unsorted = dict(plan, plans=plan["plans"][::-1], alternatives=plan["alternatives"][::-1])
    (tmp_path / "order.json").write_text(json.dumps(unsorted))
    rising = dict(plan, chain_acceptance=[0.2, 0.3])
    (tmp_path / "rising.json").write_text(json.dumps(rising))
    P = str(plan_file)
    for argv, needle in [
        (["export", P, "--format", "trtllm-current"], "invalid choice"),  # an error-only format: gone
        (["export", P, "--format", "vllm", "--heads", str(tiny_llama.heads_dirs["1"])], "not the heads this plan"),
        (["export", str(tmp_path / "none.json"), "--format", "vllm"], "never speculates"),
        (["export", str(tmp_path / "none.json"), "--format", "medusa"], "no speculation at batch size 1"),
        (["export", str(tmp_path / "kind.json"), "--format", "vllm"], "does not match its medusa_choices"),
        (["export", str(tmp_path / "order.json"), "--format", "vllm"], "ascending and unique"),
        (["export", str(tmp_path / "rising.json"), "--format", "vllm"], "rises from 0.2"),
        (["export", P, "--format", "medusa", "--synthetic"], "only with --format vllm"),
        (["export", "[[0], [0, 0]]", "--format", "vllm", "--synthetic"], "this is a tree"),
        (["export", "[[0], [0, 0]]", "--format", "vllm", "--heads", str(tiny_llama.heads_dirs["2"])], "plan"),
    ]:
        assert main(argv) == 2, argv
        assert needle in _error_line(capsys), argv


def test_plan_bad_input_is_one_error_line(calib, flat_latency, tmp_path, capsys):
    (tmp_path / "up.csv").write_text("position,acceptance\n1,0.5\n2,0.6\n")
    (tmp_path / "zero.json").write_text("[0.5, 0]")
    (tmp_path / "gap.csv").write_text("position,acceptance\n1,0.5\n3,0.4\n")
    lat = str(flat_latency)
    base = ["plan", "--calibration", str(calib), "--latency", lat]
    for argv, needle in [
        (base + ["--batch-sizes", "1,2,32,64"], "batch size(s) 32, 64"),
        (base + ["--batch-sizes", "0,1"], "--batch-sizes"),
        (base + ["--context", "512"], "no rows at context 512 for batch size(s) 1, 2, 4, 8, 16"),
        (["plan", "--acceptance", str(tmp_path / "up.csv"), "--latency", lat], "rises from 0.5"),
        (["plan", "--acceptance", str(tmp_path / "zero.json"), "--latency", lat], "(0, 1]"),
        (["plan", "--acceptance", str(tmp_path / "gap.csv"), "--latency", lat], "positions must be 1..K"),
    ]:
        assert main(argv) == 2, argv
        assert needle in _error_line(capsys), argv


@pytest.mark.unit
def test_plan_formats_cover_the_tree_formats():
    from workbench.export.engines import FORMATS

    assert set(FORMATS) < set(PLAN_FORMATS) and "vllm-tree" in set(PLAN_FORMATS)
    with pytest.raises(WorkbenchError, match="unknown export format"):
        export_plan({"plans": []}, "onnx")


@pytest.mark.unit
def test_plan_files_carry_a_version_and_version_1_reads_through_its_upgrade(tmp_path):
    """The committed plans were rewritten through upgrade_plan; a plan without a version reads as they do, another
    version is one line."""
    from workbench import REPO_ROOT
    from workbench.plan.plan_file import PLAN_VERSION, read_plan, upgrade_plan

    f = REPO_ROOT / "docs" / "results" / "plan-cpu.json"
    raw = json.loads(f.read_text())
    assert raw["version"] == PLAN_VERSION and list(raw)[0] == "version"
    old = {k: v for k, v in raw.items() if k != "version"}
    (tmp_path / "v1.json").write_text(json.dumps(old))
    assert upgrade_plan(old) == raw and read_plan(tmp_path / "v1.json") == read_plan(f)
    between = dict(old, latency=dict(old["latency"], heads_cost=True))  # v1 files of the last days named it so
    assert upgrade_plan(between)["latency"]["head_cost"] is True and "heads_cost" not in upgrade_plan(between)["latency"]
    (tmp_path / "v3.json").write_text(json.dumps(dict(raw, version=PLAN_VERSION + 1)))
    with pytest.raises(WorkbenchError, match=f"version '{PLAN_VERSION + 1}', but this workbench reads plans of version"):
        read_plan(tmp_path / "v3.json")


@pytest.mark.unit
def test_speedups_by_kind_list_each_kind_once_per_batch_size_and_mark_the_choice():
    """What the app draws against batch size: per batch size, none at 1, the choice and the runner-up of another
    kind and the best chain at their predicted speedups, the plan's own choice marked (the committed demo plan)."""
    from workbench import REPO_ROOT
    from workbench.plan.plan_file import read_plan, speedups_by_kind

    plan = read_plan(REPO_ROOT / "docs" / "results" / "plan-cpu.json")
    df = speedups_by_kind(plan)
    assert not df.duplicated(["batch_size", "kind"]).any()
    for row in plan["plans"]:
        at = df[df["batch_size"] == row["batch_size"]].set_index("kind")
        assert at.loc["none", "predicted_speedup"] == 1.0 and at["chosen"].sum() == 1
        assert at.loc[row["kind"], "chosen"] and at.loc[row["kind"], "predicted_speedup"] == row["predicted_speedup"]


def test_plan_predicts_for_the_generation_length(calib, flat_latency, tmp_path, capsys):
    """Acceptance rises along an answer, so a plan for 6-token answers replays only their first 6 tokens; a length
    the calibration never measured is one error line."""
    out = tmp_path / "plan.json"
    assert main(["plan", "--calibration", str(calib), "--latency", str(flat_latency), "--batch-sizes", "1",
                 "--max-new-tokens", "6", "--out", str(out)]) == 0
    plan, cal = read_plan(out), Calibration(calib)
    assert plan["source"]["max_new_tokens"] == 6 and "the first 6 tokens" in plan["source"]["regime"]
    for row in plan["plans"]:
        if row["kind"] != "none":
            assert row["predicted_tokens_per_step"] == cal.predict(row["tree"], 6)["predicted_replay"]
    assert main(["plan", "--calibration", str(calib), "--latency", str(flat_latency), "--max-new-tokens", "999"]) == 2
    assert "never measured" in capsys.readouterr().err


def _prediction_bench():
    import importlib.util

    from workbench import REPO_ROOT

    spec = importlib.util.spec_from_file_location("bench_prediction", REPO_ROOT / "bench" / "prediction.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_prediction_bench_resumes_after_a_kill(calib, flat_latency, tmp_path, monkeypatch):
    """A run killed at batch size 2 keeps batch size 1 beside --out; the rerun measures batch size 2 only, reports
    the kept batch 1 as measured, and removes the work folder."""
    bench = _prediction_bench()
    out = tmp_path / "p.json"
    argv = ["--calibration", str(calib), "--latency", str(flat_latency), "--batch-sizes", "1,2", "--top", "1",
            "--limit", "2", "--max-new-tokens", "4", "--repeats", "1", "--device", "cpu", "--out", str(out)]
    real, calls = bench.measure_batch, []

    def killed_at_2(*a, **k):
        calls.append(a[4])
        if a[4] == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(bench, "measure_batch", killed_at_2)
    with pytest.raises(KeyboardInterrupt):
        bench.main(argv)
    assert calls == [1, 2] and not out.exists()
    kept = json.loads((tmp_path / "p.json.work" / "batch-1.json").read_text())["value"]
    calls.clear()
    monkeypatch.setattr(bench, "measure_batch", lambda *a, **k: (calls.append(a[4]), real(*a, **k))[1])
    assert bench.main(argv) == 0 and calls == [2]
    rows = [r for r in json.loads(out.read_text())["rows"] if r["batch_size"] == 1]
    assert rows and all(r["measured_speedup"] == kept[r["candidate"]]["speedup"][0] for r in rows)
    assert not (tmp_path / "p.json.work").exists()


def test_prediction_bench_runs_on_the_tiny_model(calib, flat_latency, tmp_path, capsys):
    """bench/prediction.py end to end: plan's top candidates at two batch sizes, predicted beside measured with
    spreads, the setting of the run; a greedy decoder measures exactly the replay over the answers of the prompts
    it decoded (`replay_these`), which the calibration recorded in fp32."""
    bench = _prediction_bench()
    out = tmp_path / "prediction.json"
    assert bench.main(["--calibration", str(calib), "--latency", str(flat_latency), "--batch-sizes", "1,2",
                       "--top", "2", "--limit", "2", "--max-new-tokens", "6", "--repeats", "2,3", "--device", "cpu",
                       "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["repeats"] == {"1": 2, "2": 3}
    assert [(r["batch_size"]) for r in res["rows"]] == [1, 1, 2, 2] and res["prompts"] == 2
    assert res["setting"]["threads"] >= 1 and "load_average" in res["setting"] and res["latency_setting"] is None
    assert "provenance unknown" in res["setting_warning"]
    from workbench.calibrate.ranks import answer_rows, batch_walk

    cal = Calibration(calib)
    answers = cal.answers("all", 6)
    these = answer_rows(answers[answers["prompt_id"].isin([pid for pid, _ in cal.holdout_prompts(2)])])
    for r in res["rows"]:
        assert r["repeats"] == r["batch_size"] + 1 and r["speedup_q1"] <= r["measured_speedup"] <= r["speedup_q3"]
        assert r["measured_tokens_per_step"] == pytest.approx(r["replay_these"])
        # the two prompts form the one batch of 2: its tokens/step is the batch walk over their answers, exactly
        tree = make_tree(r["medusa_choices"])
        assert r["measured_batch_tokens_per_step"] == pytest.approx(batch_walk(tree, these, r["batch_size"]))
        assert r["predicted_batch_tokens_per_step"] == pytest.approx(cal.batch_replay(tree, r["batch_size"],
                                                                                      "holdout", 6))
        assert r["predicted_step_ratio"] == pytest.approx(r["predicted_batch_tokens_per_step"] /
                                                          r["predicted_speedup"])
        assert r["measured_step_ratio"] > 0 and 0 < r["prefill_share"] < 1 and r["end_to_end_speedup"] > 0
        assert r["speedup_err_pct"] == pytest.approx(100 * (r["predicted_speedup"] / r["measured_speedup"] - 1))
    printed = capsys.readouterr()
    assert "speedup pred (range)" in printed.out and "2/3 repeats at batch 1/2" in printed.out
    assert "WARNING" in printed.err
    for bad in ("2,2,2", "0", "two"):  # one count, or one per batch size, each positive: else one error line
        assert bench.main(["--calibration", str(calib), "--batch-sizes", "1,2", "--repeats", bad, "--out",
                           str(tmp_path / "bad.json")]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: --repeats") and "one per batch size" in err and "Traceback" not in err
    for bad in ("x", ""):  # the batch sizes are read first, as every command reads them
        assert bench.main(["--calibration", str(calib), "--batch-sizes", bad, "--out", str(tmp_path / "bad.json")]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: --batch-sizes") and "positive integers" in err and "Traceback" not in err
    assert not (tmp_path / "bad.json").exists()


def test_prediction_bench_measures_per_step_trees_beside_static_ones(calib, flat_latency, tiny_llama, tmp_path,
                                                                     capsys):
    """With a table that timed per-step trees (made cheap at batch 1, dear at batch 2), bench/prediction.py measures
    plan's best per-step trees beside its static ones, marks plan's choice (a per-step tree at batch 1 only), and a
    greedy decoder measures the per-step replay over these prompts' recorded log-probs exactly."""
    import shutil

    from workbench.calibrate.topk import record_topk
    from workbench.runtime.models import load_model_and_heads

    bench = _prediction_bench()
    calib = shutil.copytree(calib, tmp_path / "cal")  # with the heads' top-k recorded: what per-step trees replay
    record_topk(calib, *load_model_and_heads(str(tiny_llama.model_dir), str(tiny_llama.heads_dirs["2"]), "cpu"),
                batch=2)
    lat, out = tmp_path / "dyn.csv", tmp_path / "prediction.json"
    _with_dynamic(pd.read_csv(flat_latency), 7, lambda b, n: 0.5 if b == 1 else 3.0).to_csv(lat, index=False)
    assert bench.main(["--calibration", str(calib), "--latency", str(lat), "--batch-sizes", "1,2", "--top", "1",
                       "--dynamic-top", "2", "--limit", "2", "--max-new-tokens", "6", "--repeats", "1",
                       "--device", "cpu", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    kinds = {b: sorted(r["kind"] for r in res["rows"] if r["batch_size"] == b) for b in (1, 2)}
    assert all(k.count("dynamic") == 2 and len(k) == 3 for k in kinds.values())
    chosen = {r["batch_size"]: r["kind"] for r in res["rows"] if r["chosen"]}
    assert chosen.get(1) == "dynamic" and chosen.get(2) != "dynamic"
    assert res["source"]["chosen"]["1"].startswith("dynamic_") and res["source"]["dynamic"]["weighed"]
    for r in res["rows"]:
        assert r["measured_tokens_per_step"] == pytest.approx(r["replay_these"])
        if r["kind"] == "dynamic":
            assert r["medusa_choices"] == res["source"]["dynamic"]["medusa_choices"]  # the envelope
    assert [v["batch_size"] for v in res["per_step"]] == [1, 2] and res["per_step"][0]["plan_picks_per_step"]
    assert "plan picks a per-step tree only where it measures faster" in capsys.readouterr().out


def test_per_step_verdicts():
    """Plan picks a per-step tree exactly where one measures faster than everything else (no speculation at 1x
    included); overlapping interquartile ranges are a tie either way."""
    bench = _prediction_bench()

    def row(kind, speedup, chosen=False, q=0.01):
        return dict(batch_size=1, candidate=f"{kind}_{speedup}", kind=kind, measured_speedup=speedup,
                    speedup_q1=speedup - q, speedup_q3=speedup + q, chosen=chosen, speedup_err_pct=-3.0)

    def verdict(*rows):
        return bench.per_step_verdicts(list(rows), {1: "x"})[0]

    assert verdict(row("dynamic", 1.3, True), row("tree", 1.1))["ok"]  # faster and picked
    assert not verdict(row("dynamic", 1.3), row("tree", 1.1, True))["ok"]  # faster, not picked
    assert not verdict(row("dynamic", 1.1, True), row("tree", 1.3))["ok"]  # slower, picked
    v = verdict(row("dynamic", 0.9, True), row("tree", 0.8))  # beaten by no speculation (1x)
    assert not v["ok"] and v["fastest_other"] == "none" and v["per_step_max_abs_err_pct"] == 3.0
    assert verdict(row("dynamic", 1.12, True, 0.05), row("tree", 1.1, q=0.05))["within_noise"]
    assert bench.per_step_verdicts([row("tree", 1.1)], {1: "x"}) == []


def _with_dynamic(df: pd.DataFrame, envelope: int, cost) -> pd.DataFrame:
    """`df` (static rows, version 4 columns) plus per-step rows at every size n <= envelope + 1 it has, each
    `cost(b, n)` times the static step of n tokens."""
    df = df.assign(policy="static", envelope=None, version=4, engine="workbench")
    dyn = df[(df["tokens"] > 1) & (df["tokens"] <= envelope + 1)].copy()
    factor = np.array([cost(b, n) for b, n in zip(dyn["batch"], dyn["tokens"])])
    for c in ("seconds", "seconds_min", "seconds_q1", "seconds_q3", "seconds_max"):
        dyn[c] = dyn[c] * factor
    return pd.concat([df, dyn.assign(policy="dynamic", envelope=envelope)], ignore_index=True)


def test_plan_weighs_per_step_trees_on_their_own_step_costs(tmp_path, capsys):
    """A table with per-step rows (`latency --envelope`) and a calibration that replays them (topk.parquet): the
    plan weighs the per-step tree of every size the table timed, priced on its own rows, tokens/step from the
    replay; it picks one only where its predicted speedup is the best (a selection made free at batch 1, dear at
    batch 2 here). Engines' static formats refuse that row, vLLM's takes the best chain; plan_trees decodes it as the
    per-step tree it is; an accuracy table weighs none and says why."""
    from workbench import REPO_ROOT
    from workbench.plan.plan_file import plan_trees
    from workbench.plan.source import calibration_source
    from workbench.trees.dynamic import DynamicPolicy
    from workbench.trees.optimize import best_first, value_and_limits

    cal = Calibration(REPO_ROOT / "calibration" / "smollm2-135m-instruct-alpaca-eval")
    lat = tmp_path / "lat.csv"
    _with_dynamic(surface(batches=(1, 2), sizes=(1, 2, 3, 4, 6, 8, 12, 16)), 15,
                  lambda b, n: 0.8 if b == 1 else 1.6).to_csv(lat, index=False)
    source = calibration_source(cal, max_new_tokens=48)
    plan = make_plan(source, lat, [1, 2])
    info = plan["latency"]["dynamic"]
    assert info["weighed"] and info["envelope"] == 15 and len(info["medusa_choices"]) == 15
    fn, depth, rank = value_and_limits(source.value, source.max_depth, source.max_rank, "test")
    envelope = make_tree([p for p, _ in best_first(fn, 15, depth, rank)])
    assert envelope.as_lists() == info["medusa_choices"]
    one, two = plan["plans"]
    assert one["kind"] == "dynamic" and one["medusa_choices"] == info["medusa_choices"] and two["kind"] != "dynamic"
    n = one["nodes"]
    policy = DynamicPolicy(n, envelope)
    assert one["predicted_tokens_per_step"] == pytest.approx(cal.predict(policy, 48)["predicted_replay"])
    table = {k: 0.8 * v if k > 1 else v for k, v in latency_surface(read_latency(lat), [1])[0][1]["seconds"].items()}
    assert one["predicted_speedup"] == pytest.approx(
        speedup(one["predicted_batch_tokens_per_step"], relative_latency(non_decreasing(table), n)), rel=1e-9)
    # no static candidate beats it at batch 1; at batch 2 the dear selection loses to a static choice
    ranked_static = make_plan(source, _static_only(lat, tmp_path), [1, 2])
    assert ranked_static["plans"][0]["predicted_speedup"] <= one["predicted_speedup"]
    assert two["predicted_speedup"] == pytest.approx(ranked_static["plans"][1]["predicted_speedup"])
    f = tmp_path / "plan.json"
    f.write_text(plan_json(plan))
    again = read_plan(f)
    (tree, b, entry), *_ = plan_trees(again)
    assert isinstance(tree, DynamicPolicy) and (tree.nodes, b) == (n, 1) and tree.envelope.as_lists() == info["medusa_choices"]
    assert main(["export", str(f), "--format", "json", "--batch-sizes", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: the plan's choice at batch size 1 is a per-step tree ({n} of its 15-node") and \
        f"workbench decode --dynamic {n} --tree" in err and len(err.strip().splitlines()) == 1
    assert main(["export", str(f), "--format", "vllm", "--batch-sizes", "1"]) == 0
    out = capsys.readouterr()
    k = json.loads(out.out)["num_speculative_tokens"]
    assert k == again["alternatives"][0]["best_chain"]["k"] and f"per-step tree of {n} nodes" in out.err
    # an accuracy table does not replay per-step trees: none weighed, and the plan says why
    write_accuracies(tmp_path / "acc.csv", cal.accuracies("fit"))
    acc_plan = make_plan(plan_source(accuracies=tmp_path / "acc.csv"), lat, [1, 2])
    assert not acc_plan["latency"]["dynamic"]["weighed"] and "replay" in acc_plan["latency"]["dynamic"]["why"]
    assert {r["kind"] for r in acc_plan["plans"]} <= {"tree", "chain", "none"}


def test_equal_budgets_price_static_and_per_step_side_by_side(tmp_path):
    """equal_budgets: at every budget the table timed per-step trees at, the plan's optimal static tree of N nodes
    and the per-step tree of N nodes, each priced on its own rows (the selection made 0.8x the static step at batch
    1, 1.6x at batch 2 here): the same prices the plan ranks; a table without per-step rows or an accuracy table
    gives none, and says why."""
    from workbench import REPO_ROOT
    from workbench.plan.rank import equal_budgets
    from workbench.plan.source import calibration_source

    cal = Calibration(REPO_ROOT / "calibration" / "smollm2-135m-instruct-alpaca-eval")
    lat = tmp_path / "lat.csv"
    _with_dynamic(surface(batches=(1, 2), sizes=(1, 2, 3, 4, 6, 8, 12, 16)), 15,
                  lambda b, n: 0.8 if b == 1 else 1.6).to_csv(lat, index=False)
    source = calibration_source(cal, max_new_tokens=48)
    rows, info = equal_budgets(source, lat, [1, 2])
    assert info["weighed"] and info["envelope"] == 15
    for b, factor in ((1, 0.8), (2, 1.6)):
        at = [r for r in rows if r["batch_size"] == b]
        assert [(r["nodes"], r["kind"]) for r in at] == [(n, k) for n in (1, 2, 3, 5, 7, 11, 15)
                                                         for k in ("static", "per-step")]
        plain = latency_surface(read_latency(lat), [b])[0][b]["seconds"]
        scaled = {k: factor * v if k > 1 else v for k, v in plain.items()}
        for static, per_step in zip(at[::2], at[1::2]):
            n = static["nodes"]
            assert static["tree"] == f"optimal_{n}" and per_step["tree"].startswith("dynamic_")
            assert static["step_ratio"] == pytest.approx(relative_latency(non_decreasing(plain), n), rel=1e-9)
            assert per_step["step_ratio"] == pytest.approx(relative_latency(non_decreasing(scaled), n), rel=1e-9)
            assert static["speedup"] == pytest.approx(static["batch_tokens_per_step"] / static["step_ratio"])
    plan = make_plan(source, lat, [1, 2])  # the plan's choice at batch 1 is priced as here
    best = max((r for r in rows if r["batch_size"] == 1), key=lambda r: r["speedup"])
    assert plan["plans"][0]["kind"] == "dynamic" and best["kind"] == "per-step"
    assert plan["plans"][0]["predicted_speedup"] == pytest.approx(best["speedup"])
    assert equal_budgets(source, _static_only(lat, tmp_path), [1]) == ([], None)
    write_accuracies(tmp_path / "acc.csv", cal.accuracies("fit"))
    none, why = equal_budgets(plan_source(accuracies=tmp_path / "acc.csv"), lat, [1])
    assert none == [] and not why["weighed"] and "replay" in why["why"]


def _static_only(lat, tmp_path):
    df = pd.read_csv(lat)
    out = tmp_path / "static.csv"
    df[df["policy"] == "static"].to_csv(out, index=False)
    return out


def test_each_planning_command_reads_its_latency_file_once(tmp_path, monkeypatch):
    """`plan` (static and per-step rows), `optimize --latency` and the recommendation read the latency CSV once each:
    one Surface (plan/surface.py) holds every batch size and policy, and each question asks it."""
    from workbench import REPO_ROOT
    from workbench.measure import latency_file
    from workbench.plan.recommend import recommend

    cal = REPO_ROOT / "calibration" / "smollm2-135m-instruct-alpaca-eval"
    lat = tmp_path / "lat.csv"
    _with_dynamic(surface(batches=(1, 2), sizes=(1, 2, 3, 4, 6, 8)), 7, lambda b, n: 0.9).to_csv(lat, index=False)
    reads, real = [], latency_file.read_csv
    monkeypatch.setattr(latency_file, "read_csv", lambda path, *a, **k: reads.append(str(path)) or real(path, *a, **k))
    assert main(["plan", "--calibration", str(cal), "--latency", str(lat), "--batch-sizes", "1,2",
                 "--out", str(tmp_path / "plan.json")]) == 0
    assert reads == [str(lat)] and json.loads((tmp_path / "plan.json").read_text())["latency"]["dynamic"]["weighed"]
    reads.clear()
    assert main(["optimize", "--calibration", str(cal), "--latency", str(lat), "--batch-sizes", "2",
                 "--out", str(tmp_path / "tree.json")]) == 0
    assert reads == [str(lat)]
    reads.clear()
    recommend(Calibration(cal), read_latency(lat), batch=2)
    assert reads == [str(lat)]


@pytest.mark.unit
def test_the_planner_weighs_in_one_place():
    """The planner's nouns are types and one function weighs: plan/source.py has no lambda (a Source's tokens/step are
    its methods), speed.priced is called by surface.At.price alone, At.price by weigh.py alone, and no module outside
    weigh.py builds candidates (optimize.best_first) in the planner or its front ends."""
    from workbench import REPO_ROOT

    src = REPO_ROOT / "workbench"
    assert not [n for n in ast.walk(ast.parse((src / "plan" / "source.py").read_text())) if isinstance(n, ast.Lambda)]
    files = [*src.rglob("*.py"), *(REPO_ROOT / "bench").glob("*.py"), REPO_ROOT / "app.py"]
    callers: dict[str, set] = {"priced": set(), "price": set(), "best_first": set()}
    for f in files:
        for n in ast.walk(ast.parse(f.read_text())):
            if isinstance(n, ast.Call):
                name = n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", None)
                if name in callers and not (name == "price" and not isinstance(n.func, ast.Attribute)):
                    callers[name].add(f.relative_to(REPO_ROOT).as_posix())
    assert callers["priced"] == {"workbench/plan/surface.py"}
    assert callers["price"] == {"workbench/plan/weigh.py"}  # At.price
    assert {f for f in callers["best_first"] if not f.startswith("workbench/trees/")} == {"workbench/plan/weigh.py"}
