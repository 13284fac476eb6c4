"""The per-step tree's rule (trees/dynamic.py): the N best path scores of the envelope form a tree, equal a brute-force
ranking, and the replay's accepted depths agree with the static replay where the choice cannot vary."""
import itertools

import numpy as np
import pandas as pd
import pytest

from workbench import WorkbenchError
from workbench.calibrate.ranks import accepted_depths as static_depths
from workbench.trees.dynamic import DynamicPolicy, accepted_depths, path_scores, select
from workbench.trees.tree import load_tree, make_tree


def full_grid(depth: int, k: int):
    return make_tree([list(p) for d in range(1, depth + 1) for p in itertools.product(range(k), repeat=d)], "grid")


def random_logp(rng, P, K, k, ties: bool):
    logp = np.log(rng.dirichlet(np.ones(20), size=(P, K))[:, :, :k]).astype(np.float32)
    if ties:  # coarse values: many exact ties, and log-probs of 0 (a head certain of its guess)
        logp = np.round(logp * 2) / 2
        logp[rng.random((P, K, k)) < 0.1] = 0.0
    return np.sort(logp, axis=-1)[:, :, ::-1].copy()  # top-k order: rank 0 most likely


@pytest.mark.unit
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("nodes", [1, 4, 9, 20])
def test_selection_is_a_tree_and_the_brute_force_top_n(ties, nodes):
    rng = np.random.default_rng(nodes + 100 * ties)
    policy = DynamicPolicy(nodes, full_grid(3, 3))  # 39 candidate nodes
    logp = random_logp(rng, 50, 4, 5, ties)
    order = policy.envelope.sorted_paths
    sel = select(policy, logp)
    assert sel.shape == (50, nodes)
    for p in range(50):
        chosen = [order[i] for i in sel[p]]
        assert all(c[:-1] in chosen[:j] for j, c in enumerate(chosen) if len(c) > 1)  # parents first: a tree
        score = {q: float(sum(logp[p, d, r] for d, r in enumerate(q))) for q in order}
        brute = sorted(order, key=lambda q: (-score[q], order.index(q)))[:nodes]
        assert chosen == brute or [score[q] for q in chosen] == pytest.approx([score[q] for q in brute], abs=1e-6)


@pytest.mark.unit
def test_scores_add_along_the_path():
    policy = DynamicPolicy(3, make_tree([[0], [1], [0, 0], [0, 1], [0, 0, 2]]))
    logp = np.log(np.array([[[0.5, 0.3, 0.1], [0.7, 0.2, 0.1], [0.2, 0.1, 0.05]]], dtype=np.float32))
    s = path_scores(policy, logp)[0]
    order = policy.envelope.sorted_paths  # [0], [1], [0,0], [0,1], [0,0,2]
    want = [np.log(0.5), np.log(0.3), np.log(0.5) + np.log(0.7), np.log(0.5) + np.log(0.2),
            np.log(0.5) + np.log(0.7) + np.log(0.05)]
    assert order[4] == (0, 0, 2) and s == pytest.approx(want, rel=1e-6)
    assert [order[i] for i in select(policy, logp)[0]] == [(0,), (0, 0), (1,)]


@pytest.mark.unit
def test_the_whole_envelope_replays_as_the_static_tree():
    """N = M keeps every node whatever the scores: the replay's depths are the static tree's."""
    rng = np.random.default_rng(0)
    tree = load_tree("mc_sim_7b_63")
    policy = DynamicPolicy(tree.nodes, tree)
    ranks = rng.integers(-1, 10, size=(400, 4))
    ranks[rng.random((400, 4)) < 0.3] = 0
    logp = random_logp(rng, 400, 4, 10, ties=False)
    assert np.array_equal(accepted_depths(policy, logp, ranks), static_depths(tree, ranks))


@pytest.mark.unit
def test_accepted_depth_is_the_longest_chosen_prefix():
    rng = np.random.default_rng(1)
    policy = DynamicPolicy(6, full_grid(3, 3))
    logp = random_logp(rng, 200, 3, 3, ties=True)
    ranks = rng.integers(-1, 3, size=(200, 3))
    got = accepted_depths(policy, logp, ranks)
    order = policy.envelope.sorted_paths
    for p in range(200):
        chosen = {order[i] for i in select(policy, logp)[p]}
        want = 0
        for d in range(1, 4):
            if ranks[p, d - 1] < 0 or tuple(ranks[p, :d]) not in chosen:
                break
            want = d
        assert got[p] == want


@pytest.mark.unit
def test_budget_beyond_the_envelope_is_refused():
    with pytest.raises(WorkbenchError, match="envelope"):
        DynamicPolicy(5, make_tree([[0], [1]]))


def test_recorded_topk_agrees_with_the_calibration_ranks(tiny_llama, make_prompt_file, tmp_path):
    """`calibrate` records topk.parquet in its one pass over the answers, and it holds what the separate pass
    (`record_topk`, kept for folders written before) writes: the same rows and token ids, the same log-probs up to
    fp32 rounding (the pass runs on generate's hidden states, the separate one on a teacher-forced forward). At
    every held-out position each head's top-k is as the calibration ranked it: the rank of the answer's own token in
    the recorded ids is the rank in ranks.parquet (its log-probs descending)."""
    from workbench.calibrate.folder import Calibration
    from workbench.calibrate.run import CalibrateConfig, calibrate
    from workbench.calibrate.topk import record_topk
    from workbench.runtime.models import load_model_and_heads

    prompts = make_prompt_file(["Tell me a story.", "What is 2+2?", "Name three colours.", "Why is the sky blue?",
                                "Write a haiku about rain.", "How do magnets work?"])
    out = tmp_path / "cal"
    calibrate(CalibrateConfig(model=str(tiny_llama.model_dir), heads=str(tiny_llama.heads_dirs["2"]),
                              prompts=str(prompts), name="tiny", out=out, limit=None, holdout=0.5, max_new_tokens=10,
                              topk=4, budgets=(3,), batch_size=4, device="cpu"), progress=False)
    assert not (out / "parts").exists()
    df = pd.read_parquet(out / "topk.parquet")  # the one pass's
    model, tok, heads = load_model_and_heads(str(tiny_llama.model_dir), str(tiny_llama.heads_dirs["2"]), "cpu")
    separate = record_topk(out, model, tok, heads, batch=2)
    assert df[["prompt_id", "position"]].astype(str).equals(separate[["prompt_id", "position"]].astype(str))
    for k in range(1, heads.num_heads + 1):
        assert (np.stack(df[f"ids_{k}"]) == np.stack(separate[f"ids_{k}"])).all()
        np.testing.assert_allclose(np.stack(df[f"logp_{k}"]), np.stack(separate[f"logp_{k}"]), atol=1e-5, rtol=0)
    ranks = Calibration(out).ranks("holdout")
    assert len(df) == len(ranks) > 0
    merged = ranks.merge(df, on=["prompt_id", "position"], validate="one_to_one")
    conts = Calibration(out).continuations()
    for _, row in merged.iterrows():
        answer = conts[row["prompt_id"]]
        for k in range(1, heads.num_heads + 1):
            logp, ids = np.asarray(row[f"logp_{k}"]), np.asarray(row[f"ids_{k}"])
            assert (np.diff(logp) <= 0).all()
            t = row["position"] + k
            if t >= len(answer):
                assert pd.isna(row[f"head_{k}"])  # past the answer's end (ranks.parquet: null)
                continue
            hit = np.flatnonzero(ids == answer[t])
            assert row[f"head_{k}"] == (hit[0] if len(hit) else -1)


@pytest.mark.unit
def test_committed_calibration_replays_a_per_step_tree(capsys):
    """On the demo calibration's recorded log-probs: keeping the whole envelope every step replays exactly as the
    envelope itself, a smaller per-step tree accepts less than its envelope but more than one node's worth, and
    `tree eval --dynamic` prints it beside the static tree of the same size."""
    from workbench.calibrate.folder import Calibration
    from workbench.cli import main

    cal = Calibration("calibration/smollm2-135m-instruct-alpaca-eval")
    env = load_tree("mc_sim_7b_63")
    whole = cal.predict(DynamicPolicy(env.nodes, env), 64)["predicted_replay"]
    assert whole == pytest.approx(cal.replay(env, "holdout", 64), abs=1e-12)
    small = cal.predict(DynamicPolicy(8, env), 64)["predicted_replay"]
    assert cal.replay(load_tree([[0]]), "holdout", 64) < small < whole
    assert cal.batch_replay(DynamicPolicy(8, env), 4, "holdout", 64) < small  # a batch waits for its slowest
    assert main(["tree", "eval", "mc_sim_7b_63", "--calibration", str(cal.folder), "--dynamic", "8",
                 "--max-new-tokens", "64"]) == 0
    out = capsys.readouterr().out
    assert f"{small:.4f}" in out and "static" in out
