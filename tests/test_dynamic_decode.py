"""Per-step trees in the live decoder (issue 51): the step picks each sequence's N nodes of best path score on the
device, the same nodes as the reference rule (trees/dynamic.py) with ties included, builds that tree's tensors by
gathers, and decodes it losslessly at every batch size, eager and compiled (one graph per shape)."""
import types

import numpy as np
import pytest
import torch

from workbench import WorkbenchError
from workbench.decode import step as step_module
from workbench.decode.loop import Acceptance, medusa_generate, vanilla_generate
from workbench.runtime.engine import StepEngine
from workbench.runtime.treemask import select_tree, tree_setup
from workbench.trees.dynamic import DynamicPolicy, select
from workbench.trees.tree import Tree, load_tree
from support.tiny import random_heads, tiny_model

CPU = types.SimpleNamespace(device=torch.device("cpu"))  # all tree_setup reads of a model
NEW = 24


@pytest.mark.unit
@pytest.mark.parametrize("n", [1, 5, 16, 63])
def test_the_device_picks_the_reference_nodes_and_builds_their_tree(n):
    """select_tree against trees.dynamic.select on log-probs with many exact ties (scores on a 0.5 grid), and each
    row's tensors against tree_setup of the tree those nodes form: tokens, depths, parents, mask, paths."""
    env = load_tree("mc_sim_7b_63")
    policy, buf = DynamicPolicy(n, env), tree_setup(env, CPU)
    rng = np.random.default_rng(n)
    logp = -np.sort(rng.integers(0, 6, size=(40, policy.depth, policy.topk)), axis=2) * 0.5  # top-k: descending
    tree, nodes = select_tree(buf.tensors(), torch.tensor(logp, dtype=torch.float32), n)
    want = np.sort(select(policy, logp.astype(np.float32)), axis=1) + 1
    assert np.array_equal(nodes[:, 1:].numpy(), want) and (nodes[:, 0] == 0).all()
    for b in range(0, 40, 7):
        paths = tuple(env.sorted_paths[i - 1] for i in want[b])
        expect = tree_setup(Tree(paths), CPU).tensors()  # the same nodes as a static tree (its own top-k and depth)
        got = [t[b] for t in tree]
        assert got[0].tolist() == [0] + [1 + (len(p) - 1) * buf.topk + p[-1] for p in paths]  # at the envelope's top-k
        assert torch.equal(got[1], expect.depths) and torch.equal(got[2], expect.parents)
        assert torch.equal(got[3], expect.visible)
        d = expect.ancestors.shape[1]
        assert torch.equal(got[4][:, :d], expect.ancestors)
        assert torch.equal(got[4][:, d:], got[4][:, d - 1:d].expand(-1, got[4].shape[1] - d))  # then i repeated


def _oracle(engine, truth: list[list[int]], vocab: int, seed: int = 0, miss: float = 0.25):
    """head_logits stand-in: head k of sequence b ranks the true token at L_b + k among its first three (or
    misses it), so per-step trees accept several tokens; everything else random. Reads the engine's lengths."""
    g = torch.Generator().manual_seed(seed)

    def head_logits(heads, model, hidden, depth):
        out = torch.randn(hidden.shape[0], depth, vocab, generator=g)
        for b, length in enumerate(engine.state.lengths.tolist()):
            for k in range(depth):
                at = length + k + 1
                if at < len(truth[b]) and torch.rand((), generator=g) > miss:  # confident top-1, or 2nd / 3rd
                    r = int(torch.randint(0, 4, (), generator=g))
                    top = out[b, k].sort(descending=True).values
                    out[b, k, truth[b][at]] = top[0] + 3 if r < 2 else top[r - 1] + 1e-3
        return out
    return head_logits


def _setup(batch: int):
    model = tiny_model("llama", seed=7)
    heads = random_heads(64, 128, 5, tied=True, seed=4)
    g = torch.Generator().manual_seed(batch)
    prompts = [torch.randint(3, 128, (n,), generator=g).tolist() for n in (9, 17, 5)[:batch]]
    ref = vanilla_generate(model, None, prompts, NEW, eos_token_id=[])
    truth = [p + r.token_ids for p, r in zip(prompts, ref)]
    return model, heads, prompts, ref, truth


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("n", [1, 4, 16])
def test_per_step_trees_decode_plain_greedy_at_batch_1_and_3(batch, n, monkeypatch):
    model, heads, prompts, ref, truth = _setup(batch)
    engine = StepEngine(model, compile=False)
    monkeypatch.setattr(step_module, "head_logits", _oracle(engine, truth, 128))
    res = medusa_generate(model, heads, None, prompts, DynamicPolicy(n, load_tree("mc_sim_7b_63")), NEW,
                          eos_token_id=[], engine=engine)
    assert [r.token_ids for r in res] == [r.token_ids for r in ref]
    steps = [s for r in res for s in r.steps]
    assert {s.tree_size for s in steps} == {n + 1} and res[0].tree == f"dynamic_{n}_of_63"
    assert max(len(s.tokens) for s in steps) >= min(n + 1, 3)  # the oracle's guesses accepted through the trees
    envelope = set(load_tree("mc_sim_7b_63").paths) | {()}
    assert all(s.path in envelope and len(s.path) <= n for s in steps)  # a node of the envelope, within N nodes


def test_all_nodes_of_the_envelope_is_the_static_envelope_step_for_step(monkeypatch):
    """N = M: every step's tree is the envelope itself, so every step accepts what the static tree accepts."""
    model, heads, prompts, ref, truth = _setup(3)
    env = load_tree([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0], [2]])
    engine = StepEngine(model, compile=False)
    monkeypatch.setattr(step_module, "head_logits", _oracle(engine, truth, 128, seed=1))
    dyn = medusa_generate(model, heads, None, prompts, DynamicPolicy(env.nodes, env), NEW, eos_token_id=[],
                          engine=engine)
    monkeypatch.setattr(step_module, "head_logits", _oracle(engine, truth, 128, seed=1))
    static = medusa_generate(model, heads, None, prompts, env, NEW, eos_token_id=[], engine=engine)
    assert [[(s.tokens, s.path) for s in r.steps] for r in dyn] == [[(s.tokens, s.path) for s in r.steps]
                                                                   for r in static]


def test_typical_acceptance_at_temperature_zero_and_nucleus_run_on_per_step_trees(monkeypatch):
    model, heads, prompts, ref, truth = _setup(3)
    engine = StepEngine(model, compile=False)
    monkeypatch.setattr(step_module, "head_logits", _oracle(engine, truth, 128, seed=2))
    policy = DynamicPolicy(8, load_tree("mc_sim_7b_63"))
    typical = medusa_generate(model, heads, None, prompts, policy, NEW, Acceptance("typical", temperature=0.0),
                              eos_token_id=[], engine=engine)
    assert [r.token_ids for r in typical] == [r.token_ids for r in ref]
    nucleus = medusa_generate(model, heads, None, prompts, policy, NEW, Acceptance("nucleus", temperature=0.7,
                                                                                  seed=3), eos_token_id=[],
                              engine=engine)
    assert all(len(r.token_ids) == NEW for r in nucleus)


def test_compiled_per_step_trees_are_one_graph_per_shape_and_equal_eager(monkeypatch):
    from test_compile_once import CountingBackend

    torch._dynamo.reset()
    model, heads, prompts, ref, truth = _setup(3)
    counter = CountingBackend()
    engine = StepEngine(model, compile=True, backend=counter)
    policy = DynamicPolicy(6, load_tree("mc_sim_7b_63"))
    engine.size_for(prompts, NEW, [tree_setup(policy.envelope, model)])
    first = medusa_generate(model, heads, None, prompts, policy, NEW, eos_token_id=[], engine=engine)
    again = medusa_generate(model, heads, None, prompts[::-1], policy, NEW, eos_token_id=[], engine=engine)
    assert [r.token_ids for r in first] == [r.token_ids for r in ref]
    assert [r.token_ids for r in again] == [r.token_ids for r in ref[::-1]]
    assert counter.graphs == 1 and again[0].compile_s == 0  # one graph for (batch 3, 6 of 63), warm afterwards


def test_a_per_step_tree_needs_heads_not_a_proposer():
    model = tiny_model("llama", seed=7)
    policy = DynamicPolicy(4, load_tree("mc_sim_7b_63"))
    with pytest.raises(WorkbenchError, match="per-step tree .* takes heads, not a propose function"):
        medusa_generate(model, None, None, [5, 6, 7], policy, 4, propose=lambda h, t: torch.zeros(5, 10))


def test_cli_decode_dynamic(capsys, tiny_llama):
    from workbench.cli import main

    base = ["decode", "--model", str(tiny_llama.model_dir), "--heads", str(tiny_llama.heads_dirs["2"]), "--tree",
            "mc_sim_7b_63", "--prompt", "Hello world", "--max-new-tokens", "12", "--device", "cpu"]
    assert main(base + ["--dynamic", "4", "--compare", "--json"]) == 0
    out = __import__("json").loads(capsys.readouterr().out)
    assert out["tree"] == "dynamic_4_of_63" and out["matches_greedy"] and out["divergences"] == []
    assert main(base + ["--dynamic", "64"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: a dynamic tree of 64 nodes needs an envelope of at least as many nodes")
