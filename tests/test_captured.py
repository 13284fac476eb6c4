"""The captured step (runtime/captured.py, CUDA's default), run on CPU where the "replay" is the compiled-layers step
called on the graph's own buffers: tokens and steps equal the eager engine's; every changing input is copied into
the graph's buffers before each call (two trees of one size and plan through one graph decode each their own
nodes); the warm-up's check catches a graph that disagrees with the op-by-op step; a failure is one error line.
Compiled with a backend that wraps aot_eager (dynamo's graphs are inductor's)."""
import pytest
import torch

from workbench import WorkbenchError
from workbench.decode import loop
from workbench.decode.loop import Acceptance, medusa_generate, vanilla_generate
from workbench.runtime import captured
from workbench.runtime.engine import StepEngine
from workbench.runtime.treemask import root_setup, tree_setup
from support.tiny import CountingBackend, random_heads, tiny_model

NEW = 10


def _setup():
    torch._dynamo.reset()
    model = tiny_model("llama", seed=7, layers=3, max_positions=1024)
    heads = random_heads(64, 128, 5, tied=True, seed=3)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 128, (n,), generator=g).tolist() for n in (17, 90, 41, 23)]
    return model, heads, prompts


def _runs(out):
    out = out if isinstance(out, list) else [out]
    return [(o.token_ids, [len(s.tokens) for s in o.steps], [s.path for s in o.steps]) for o in out]


@pytest.mark.parametrize("rule", [Acceptance(), Acceptance("typical", 0.7, seed=3)], ids=["greedy", "typical"])
def test_the_captured_step_decodes_as_eager(rule):
    model, heads, prompts = _setup()
    counter = CountingBackend()
    engine = StepEngine(model, compile="captured", backend=counter)
    eager = StepEngine(model, compile=False)
    assert engine.compiled_as == "captured" and not engine.compile and engine.layers is not None
    bufs = [tree_setup(t, model) for t in ([[0], [0, 0]], "mc_sim_7b_63")]
    engine.size_for(prompts, NEW, [root_setup(model), *bufs])
    for chunk in (prompts[:1], prompts[1:4]):
        got = vanilla_generate(model, None, chunk, NEW, eos_token_id=[], engine=engine)
        assert _runs(got) == _runs(vanilla_generate(model, None, chunk, NEW, eos_token_id=[], engine=eager))
        for buf in bufs:
            med = medusa_generate(model, heads, None, chunk, buf, NEW, eos_token_id=[], engine=engine,
                                  acceptance=rule)
            assert _runs(med) == _runs(medusa_generate(model, heads, None, chunk, buf, NEW, eos_token_id=[],
                                                       engine=eager, acceptance=rule))
            if rule.kind == "greedy":
                assert [m.token_ids for m in med] == [v.token_ids for v in got]
    # a shape per (batch, tree size), captured once; a new batch size is a new cache, whose graphs replace the old
    assert [(s["batch"], s["size"]) for s in engine.shapes] == [(b, n) for b in (1, 3) for n in (1, 3, 64)]
    assert {k[:2] for k in engine.captures.graphs} == {(3, n) for n in (1, 3, 64)}
    assert engine.compile_s > 0 and all(s["capture_s"] > 0 for s in engine.shapes)
    assert 0 < counter.graphs <= 2 * 6  # the layers' graphs (layer 0 apart), none for the step itself
    first = counter.graphs
    again = medusa_generate(model, heads, None, prompts[1:4], bufs[1], NEW, eos_token_id=[], engine=engine,
                            acceptance=rule)
    assert again[0].compile_s == 0 and counter.graphs == first and len(engine.shapes) == 6  # replayed, nothing new


def _oracle(truth: list[int], vocab: int):
    """A proposer whose rank-0 token at every depth is the true continuation and rank 1 a wrong one."""
    def propose(hidden, tokens):
        at = len(tokens)
        right = [truth[at + d] if at + d < len(truth) else 0 for d in range(2)]
        return torch.tensor([[r, (r + 1) % vocab] for r in right])                     # [depth 2, topk 2]
    return propose


def test_two_trees_of_one_size_share_a_graph_and_decode_each_their_own_nodes():
    """Trees A and B: 3 nodes, depth 2, top-2 (one plan key, one graph). With an oracle proposer A accepts 3 tokens a
    step and B 2. B decoded after A through the captured engine takes B's steps, as eager does: the graph read B's
    nodes, copied into its own buffers, never A's tensors (nor B's: the next tree of that size may be another)."""
    model, heads, prompts = _setup()
    prompt = prompts[0]
    truth = prompt + vanilla_generate(model, None, prompt, NEW + 8, eos_token_id=[]).token_ids
    propose = _oracle(truth, 128)
    a, b = tree_setup([[0], [0, 0], [1]], model), tree_setup([[1], [1, 0], [0]], model)
    assert a.size == b.size and (a.depth, a.topk) == (b.depth, b.topk)
    engine = StepEngine(model, compile="captured", backend=CountingBackend())
    engine.size_for([prompt], NEW, [a, b])
    eager = StepEngine(model, compile=False)
    runs = {}
    for name, buf in (("a", a), ("b", b)):
        got = medusa_generate(model, None, None, prompt, buf, NEW, eos_token_id=[], propose=propose, engine=engine)
        want = medusa_generate(model, None, None, prompt, buf, NEW, eos_token_id=[], propose=propose, engine=eager)
        assert _runs(got) == _runs(want)
        runs[name] = _runs(got)[0]
    assert runs["a"][0] == runs["b"][0] == truth[len(prompt):len(prompt) + NEW]
    assert set(runs["a"][1][:-1]) == {3} and set(runs["b"][1][:-1]) == {2}  # each tree's own acceptance
    (key, graph), = engine.captures.graphs.items()  # one graph for both trees
    mine = {t.data_ptr() for t in graph.buffers}
    assert not mine & {t.data_ptr() for buf in (a, b) for t in buf.tensors()}
    assert torch.equal(graph.args[4].tree_indices, b.tree_indices)  # B's nodes were the last copied in


def test_the_warm_up_check_catches_a_graph_that_disagrees(monkeypatch):
    model, heads, prompts = _setup()
    real = captured.Graph.__call__

    def wrong(self, args):
        out = real(self, args)
        return out + 1  # another token than the op-by-op step
    monkeypatch.setattr(captured.Graph, "__call__", wrong)
    engine = StepEngine(model, compile="captured", backend=CountingBackend())
    with pytest.raises(WorkbenchError, match="gave other tokens than the same step run op by op") as e:
        vanilla_generate(model, None, prompts[:1], NEW, eos_token_id=[], engine=engine)
    assert "\n" not in str(e.value)


def test_a_step_that_cannot_be_captured_is_one_error_line():
    model, heads, prompts = _setup()
    engine = StepEngine(model, compile="captured", backend=CountingBackend(fail=True))
    with pytest.raises(WorkbenchError, match="cannot compile the decoding step") as e:
        vanilla_generate(model, None, prompts[:1], NEW, eos_token_id=[], engine=engine)
    assert "\n" not in str(e.value) and engine.compiled_as == "captured"  # no silent eager run


def test_after_the_warm_up_a_step_never_compiles_or_captures():
    """A step key marked warm without its capture fails in one line (on CUDA a replay runs no Python, so nothing
    can compile inside it; on CPU the layers run under set_stance("fail_on_recompile") as in the layers mode)."""
    model, heads, prompts = _setup()
    engine = StepEngine(model, compile="captured", backend=CountingBackend())
    small, big = tree_setup([[0], [0, 0]], model), tree_setup("mc_sim_7b_63", model)
    engine.size_for(prompts[:1], NEW, [small, big])
    medusa_generate(model, heads, None, prompts[0], small, NEW, eos_token_id=[], engine=engine)
    engine._warm.add((1, big.size) + loop.Plan(Acceptance(), big.depth, big.topk).key)  # as if warmed
    with pytest.raises(WorkbenchError, match=f"no graph for batch 1, tree size {big.size}"):
        medusa_generate(model, heads, None, prompts[0], big, NEW, eos_token_id=[], engine=engine)
