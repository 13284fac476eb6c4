"""The live decoder: lossless greedy Medusa on tiny random Llama and Qwen2 models, multi-token acceptance and
cache compaction (with a proposer fed the true greedy continuation), typical / nucleus acceptance, limits, CLI."""
import json
import warnings

import pytest
import torch
from helpers import Oracle, checked_steps

from workbench import WorkbenchError
from workbench.cli import main
from workbench.decode.loop import Acceptance, first_proposal, medusa_generate, uniforms, vanilla_generate
from workbench.decode.acceptance import ENTROPY_FORMS, accept_greedy, accept_nucleus, accept_typical, entropy, sample_nucleus, typical_decisions
from workbench.runtime.engine import TreeBuffers
from workbench.runtime.generation import prepare_prompt
from workbench.runtime.models import load_model_and_heads
from support.tiny import random_heads, tiny_model, tiny_tokenizer
from workbench.runtime.treemask import tree_buffers
from workbench.trees.tree import load_tree

PROMPTS = ["Hello world", "Write a short poem about the sea.", "2+2="]
TREES = {
    "chain": [[0], [0, 0]],
    "cartesian": [[i] for i in range(3)] + [[i, j] for i in range(3) for j in range(3)],
    "mc_sim_7b_63": "mc_sim_7b_63",
    "deep": [[1, 0, 2, 0, 1][:d] for d in range(1, 6)],  # one node per level, all 5 heads
}
NEW = 24


def _generate(model, ids, n, **kw):
    out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n, **kw)
    return out[0, len(ids):].tolist()


def _greedy_no_cache(model, ids, n):
    """Reference continuation recomputed from scratch each token: independent of any cache or mask."""
    seq = list(ids)
    with torch.inference_mode():
        for _ in range(n):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(ids):]


def _ids(tok, prompt):
    return prepare_prompt(tok, prompt)


# ----------------------------------------------------------------------------------------------- greedy: lossless

@pytest.mark.parametrize("fmt", ["1", "2", "3"])
@pytest.mark.parametrize("tree_name", list(TREES))
def test_greedy_medusa_equals_generate(tiny, tree_name, fmt):
    model_dir = tiny.heads_dirs["3"] if fmt == "3" else tiny.model_dir
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, tok, heads = load_model_and_heads(str(model_dir), None if fmt == "3" else str(tiny.heads_dirs[fmt]), "cpu")
    for prompt in PROMPTS:
        ids = _ids(tok, prompt)
        on_step, seen = checked_steps(len(ids))
        res = medusa_generate(model, heads, tok, ids, TREES[tree_name], NEW, on_step=on_step)
        ref = _generate(tiny.model, ids, NEW)
        assert res.token_ids == ref, prompt
        assert seen == res.steps and sum(res.accepted_lengths) == len(ref)
        assert res.text == tok.decode(ref, skip_special_tokens=True)
        assert res.stop_reason == ("eos" if ref[-1] == 2 else "max_new_tokens")


def test_vanilla_equals_generate(tiny):
    for prompt in PROMPTS:
        ids = _ids(tiny.tokenizer, prompt)
        on_step, _ = checked_steps(len(ids))
        res = vanilla_generate(tiny.model, tiny.tokenizer, ids, NEW, on_step=on_step)
        assert res.token_ids == _generate(tiny.model, ids, NEW)
        assert set(res.accepted_lengths) == {1} and res.tokens_per_step == 1.0


@pytest.mark.parametrize("tree_name", ["cartesian", "mc_sim_7b_63", "deep"])
def test_multi_token_acceptance_with_known_continuation(tiny, tree_name):
    """The proposer offers the true continuation at varied ranks: every step must accept exactly the longest
    offered path present in the tree, compact the cache to it, and the output must still be plain greedy."""
    tree = load_tree(TREES[tree_name])
    for i, prompt in enumerate(PROMPTS):
        ids = _ids(tiny.tokenizer, prompt)
        truth = ids + _greedy_no_cache(tiny.model, ids, 40 + 6)
        oracle = Oracle(truth, tree, seed=i)
        on_step, _ = checked_steps(len(ids))
        res = medusa_generate(tiny.model, None, tiny.tokenizer, ids, tree, 40, eos_token_id=[],
                              propose=oracle, on_step=on_step)
        assert res.token_ids == truth[len(ids):len(ids) + 40]
        n = len(ids) + 1
        for step in res.steps[:-1]:  # the last step may be cut at max_new_tokens
            assert len(step.tokens) == oracle.best_length(n, tree)
            assert step.path == () or step.path in tree.paths
            n += len(step.tokens)
        assert res.tokens_per_step > 1.5  # the proposer hits often: multi-token steps really happen
        if tree_name != "chain":
            assert any(any(r != 0 for r in s.path) for s in res.steps)  # off-rank-0 nodes moved in the cache


def test_eager_attention_is_exact_too():
    model = tiny_model("llama", seed=3, attn_implementation="eager")
    assert model.config._attn_implementation == "eager"
    tok, heads = tiny_tokenizer(), random_heads(64, 128, 5, seed=4)
    ids = _ids(tok, PROMPTS[1])
    assert medusa_generate(model, heads, tok, ids, "mc_sim_7b_63", NEW).token_ids == _generate(model, ids, NEW)
    tree = load_tree("mc_sim_7b_63")
    truth = ids + _greedy_no_cache(model, ids, 36)
    res = medusa_generate(model, None, tok, ids, tree, 30, eos_token_id=[], propose=Oracle(truth, tree))
    assert res.token_ids == truth[len(ids):len(ids) + 30] and res.tokens_per_step > 1.5


# ----------------------------------------------------------------------------------------------- stopping, limits

def test_stops_at_eos_inside_a_multi_token_step(tiny_llama):
    tok = tiny_llama.tokenizer
    ids = _ids(tok, PROMPTS[0])
    truth = ids + _greedy_no_cache(tiny_llama.model, ids, 40)
    cont = truth[len(ids):]
    stop = cont[15]
    j = cont.index(stop)
    tree = load_tree("mc_sim_7b_63")
    on_step, _ = checked_steps(len(ids))
    res = medusa_generate(tiny_llama.model, None, tok, ids, tree, 40, eos_token_id=stop,
                          propose=Oracle(truth, tree, miss=0.0), on_step=on_step)
    assert res.token_ids == cont[: j + 1] and res.stop_reason == "eos"
    assert res.token_ids == _generate(tiny_llama.model, ids, 40, eos_token_id=stop)
    assert vanilla_generate(tiny_llama.model, tok, ids, 40, eos_token_id=stop).token_ids == cont[: j + 1]


def test_max_new_tokens_is_exact_with_multi_token_steps(tiny_llama):
    ids = _ids(tiny_llama.tokenizer, PROMPTS[2])
    truth = ids + _greedy_no_cache(tiny_llama.model, ids, 20)
    tree = load_tree("mc_sim_7b_63")
    for n in (1, 2, 7, 11):
        on_step, _ = checked_steps(len(ids))
        res = medusa_generate(tiny_llama.model, None, None, ids, tree, n, eos_token_id=[],
                              propose=Oracle(truth, tree, miss=0.0), on_step=on_step)
        assert res.token_ids == truth[len(ids):len(ids) + n] and res.stop_reason == "max_new_tokens"
        assert res.text is None


def test_context_limit():
    model, tok = tiny_model("llama", seed=5, max_positions=32), tiny_tokenizer()
    heads = random_heads(64, 128, 5, seed=6)
    with pytest.raises(WorkbenchError, match="prompt is 40 tokens but the model's context is 32"):
        medusa_generate(model, heads, tok, list(range(5, 45)), [[0]], 4)
    with pytest.raises(WorkbenchError, match="context is 32"):
        vanilla_generate(model, tok, list(range(5, 37)), 4)
    ids = list(range(5, 25))
    res = medusa_generate(model, heads, tok, ids, [[0], [0, 0]], 50, eos_token_id=[])
    assert len(res.token_ids) == 12 and res.stop_reason == "context"
    assert res.token_ids == vanilla_generate(model, tok, ids, 50, eos_token_id=[]).token_ids


def test_bad_inputs_are_one_line_errors(tiny_llama):
    m, tok, h = tiny_llama.model, tiny_llama.tokenizer, tiny_llama.heads["2"]
    cases = [
        (lambda: medusa_generate(m, h, tok, [1, 2], [[0]] * 1 + [[0] * d for d in range(2, 7)], 4), "exceeds the 5 Medusa heads"),
        (lambda: medusa_generate(m, h, tok, [], [[0]], 4), "empty"),
        (lambda: medusa_generate(m, h, tok, [1, 500], [[0]], 4), "[0, 128)"),
        (lambda: medusa_generate(m, h, tok, [[1, 2], [[3, 4], [5, 6]]], [[0]], 4), "one sequence of token ids"),
        (lambda: medusa_generate(m, h, tok, [[1, 2], []], [[0]], 4), "empty"),
        (lambda: medusa_generate(m, h, tok, [1, 2], [[0]], 0), "--max-new-tokens 0"),
        (lambda: medusa_generate(m, random_heads(32, 128, 2, tied=True), tok, [1, 2], [[0]], 4), "hidden size 32"),
        (lambda: Acceptance("beam"), "unknown"),
        (lambda: Acceptance("typical", temperature=-1), "--temperature"),
        (lambda: Acceptance("nucleus", top_p=0), "--top-p"),
    ]
    for fn, msg in cases:
        with pytest.raises(WorkbenchError) as e:
            fn()
        assert msg in str(e.value) and "\n" not in str(e.value)


def test_prepare_prompt_uses_the_chat_template_unless_raw(tiny_llama):
    tok = tiny_llama.tokenizer
    ids = prepare_prompt(tok, "hi")
    assert tok.decode(ids) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(prepare_prompt(tok, "hi", raw=True)) == "hi"
    with pytest.raises(WorkbenchError, match="no chat template.*--raw"):
        prepare_prompt(tiny_tokenizer(chat_template=False), "hi")


# ----------------------------------------------------------------------------------------------- typical, nucleus

def test_typical_at_temperature_zero_equals_greedy(tiny):
    tree = load_tree("mc_sim_7b_63")
    for i, prompt in enumerate(PROMPTS):
        ids = _ids(tiny.tokenizer, prompt)
        truth = ids + _greedy_no_cache(tiny.model, ids, 36)
        for acc in (Acceptance("typical", 0.0), Acceptance("nucleus", 0.0), Acceptance("nucleus", 1.0, top_p=1e-9)):
            res = medusa_generate(tiny.model, None, None, ids, tree, 30, acceptance=acc, eos_token_id=[],
                                  propose=Oracle(truth, tree, seed=i))
            assert res.token_ids == truth[len(ids):len(ids) + 30], acc
            assert res.tokens_per_step > 1.5
        res = medusa_generate(tiny.model, tiny.heads["1"], None, ids, tree, 20, acceptance=Acceptance("typical", 0.0))
        assert res.token_ids == _generate(tiny.model, ids, 20)


def _tiny_tree_buffers():
    """Tree [[0], [1], [0, 0]]: node 1 = (0,), node 2 = (1,), node 3 = (0, 0); node paths [0], [0,1], [0,2],
    [0,1,3]."""
    tree = load_tree([[0], [1], [0, 0]])
    b = tree_buffers(tree, 2)
    buf = TreeBuffers(tree, 2, 2, b["tree_indices"], b["position_ids"], b["parents"].clamp(min=0),
                      b["attn_mask"] != 0, [()] + tree.sorted_paths)
    assert buf.ancestors.tolist() == [[0, 0, 0], [0, 1, 1], [0, 2, 2], [0, 1, 3]]
    return buf


def _one(rule, logits, tokens, *args):
    """A rule applied to one sequence (batch of 1): (deepest accepted node, length, next token) as ints."""
    return tuple(int(x[0]) for x in rule(logits[None], tokens[None], *args))


def _logits(probs: dict, vocab=16):
    """Logits whose softmax puts the given probabilities on the given tokens and spreads the rest evenly."""
    rest = (1 - sum(probs.values())) / (vocab - len(probs))
    p = torch.full((vocab,), rest)
    for t, v in probs.items():
        p[t] = v
    return p.log()


@pytest.mark.unit
def test_typical_rule_longest_path_then_likelihood():
    buf = _tiny_tree_buffers()
    tokens = torch.tensor([5, 7, 8, 9])  # root, node (0,), node (1,), node (0, 0)
    root = _logits({7: 0.40, 8: 0.45})   # H ~ 1.45: threshold min(0.09, 0.3 e^-H ~ 0.07): 7 and 8 pass
    peaked = _logits({10: 0.97})         # H small: threshold 0.09; token 9 (p = 0.002) fails
    flat = torch.zeros(16)               # uniform: H = ln 16, threshold 0.3/16 = 0.019 < 1/16: token 9 passes
    leaf = _logits({3: 0.9})
    # longest accepted path wins even through the less likely first token
    row, length, nxt = _one(accept_typical, torch.stack([root, flat, leaf, leaf]), tokens, buf, 1.0, 0.09, 0.3)
    assert (row, length, nxt) == (3, 3, 3)
    # equal lengths: the likelier path (token 8, p .45 > .40); the next token is greedy at that node
    row, length, nxt = _one(accept_typical, torch.stack([root, peaked, _logits({11: 0.5}), leaf]), tokens, buf, 1.0, 0.09, 0.3)
    assert (row, length, nxt) == (2, 2, 11)
    # epsilon caps the threshold: with epsilon 0.5 neither 0.40 nor 0.45 passes; only the root is kept
    row, length, nxt = _one(accept_typical, torch.stack([root, flat, leaf, leaf]), tokens, buf, 1.0, 0.5, 100.0)
    assert length == 1 and nxt == 8
    # a higher temperature flattens p, lowering the threshold below token 9's probability in `peaked`
    row, length, _ = _one(accept_typical, torch.stack([root, peaked, leaf, leaf]), tokens, buf, 50.0, 0.09, 0.3)
    assert length == 3


@pytest.mark.unit
def test_medusa_entropy_form_differs_only_between_its_two_thresholds():
    """Medusa's code's entropy -sum p log(p + 1e-5) is a little lower than the exact one, so its threshold
    delta * exp(-H) is a little higher: a token whose probability lies between the two is accepted under the exact
    form and rejected under Medusa's, and the decision flips nowhere else."""
    buf = _tiny_tree_buffers()
    tokens = torch.tensor([5, 7, 8, 9])
    root = _logits({7: 0.40, 8: 0.45}, vocab=4096).double()
    p = torch.softmax(root, dim=-1)
    h_exact, h_medusa = entropy(p, "exact"), entropy(p, "medusa")
    assert h_medusa < h_exact < h_medusa + 0.05
    between = float(torch.exp(-(h_exact + h_medusa) / 2))   # p(7) = delta * this: between the two thresholds
    leaf, nine = _logits({3: 0.9}, vocab=4096).double(), _logits({9: 0.9}, vocab=4096).double()
    logits = torch.stack([root, nine, leaf, leaf])[None]                     # node (0,) -> token 9 likely
    delta = 0.40 / between                                                   # epsilon 0.5 caps no node here
    ok = {f: typical_decisions(logits, tokens[None], buf, 1.0, 0.5, delta, f)[0][0].tolist() for f in ENTROPY_FORMS}
    assert ok == {"exact": [True, True, True, True], "medusa": [True, False, True, True]}
    # away from the band both forms agree
    for d in (delta * 0.95, delta * 1.05):
        assert torch.equal(*[typical_decisions(logits, tokens[None], buf, 1.0, 0.5, d, f)[0] for f in ENTROPY_FORMS])
    # and acceptance follows the decisions: exact keeps 7 -> 9 (3 tokens), Medusa's form only 8 (2 tokens)
    assert _one(accept_typical, logits[0], tokens, buf, 1.0, 0.5, delta, "exact") == (3, 3, 3)
    assert _one(accept_typical, logits[0], tokens, buf, 1.0, 0.5, delta, "medusa") == (2, 2, 3)


@pytest.mark.unit
def test_greedy_and_nucleus_rules():
    buf = _tiny_tree_buffers()
    tokens = torch.tensor([5, 7, 8, 9])
    logits = torch.stack([_logits({8: 0.6}), _logits({9: 0.6}), _logits({4: 0.6}), _logits({1: 0.6})])
    assert _one(accept_greedy, logits, tokens, buf) == (2, 2, 4)
    other = logits.clone()
    other[0] = _logits({7: 0.6})
    assert _one(accept_greedy, other, tokens, buf) == (3, 3, 1)
    # nucleus with top_p tiny keeps only the argmax: same as greedy, whatever the uniforms
    for u in (0.0, 0.5, 1 - 2 ** -24):
        assert _one(accept_nucleus, other, tokens, buf, 1.0, 1e-9, torch.full((1, 4), u)) == (3, 3, 1)
    # a batch: each sequence its own path and next token, in one call
    row, length, nxt = accept_greedy(torch.stack([logits, other]), torch.stack([tokens, tokens]), buf)
    assert (row.tolist(), length.tolist(), nxt.tolist()) == ([2, 3], [2, 3], [4, 1])


@pytest.mark.unit
def test_nucleus_samples_only_inside_the_nucleus():
    logits = _logits({3: 0.5, 6: 0.3, 9: 0.1}).expand(4000, 16)
    g = torch.Generator().manual_seed(1)
    drawn = sample_nucleus(logits, 1.0, 0.75, torch.rand(4000, generator=g))
    assert set(drawn.tolist()) == {3, 6}  # 0.5 + 0.3 reaches 0.75; 9 and the tail are outside
    share = (drawn == 3).float().mean().item()
    assert 0.58 < share < 0.67  # renormalised 0.5 / 0.8 = 0.625
    assert set(sample_nucleus(logits[:50], 1.0, 1.0, torch.rand(50, generator=g)).tolist()) > {3, 6}  # top_p 1: all
    # the step's counter-based uniforms: a fixed function of (seed, step), spread evenly, other per step
    u = uniforms(torch.tensor(7), torch.tensor(1), (4000,), "cpu")
    assert torch.equal(u, uniforms(torch.tensor(7), torch.tensor(1), (4000,), "cpu")) and 0 <= u.min() and u.max() < 1
    assert abs(u.mean().item() - 0.5) < 0.02 and abs((u < 0.1).float().mean().item() - 0.1) < 0.02
    assert not torch.equal(u, uniforms(torch.tensor(7), torch.tensor(2), (4000,), "cpu"))
    share = (sample_nucleus(logits, 1.0, 0.75, u) == 3).float().mean().item()
    assert 0.58 < share < 0.67


def test_sampling_runs_keep_the_cache_invariant_and_are_seeded(tiny_llama):
    ids = _ids(tiny_llama.tokenizer, PROMPTS[1])
    h = tiny_llama.heads["2"]
    for acc in (Acceptance("typical", 0.7), Acceptance("nucleus", 0.9, top_p=0.9, seed=3)):
        on_step, _ = checked_steps(len(ids))
        a = medusa_generate(tiny_llama.model, h, None, ids, "mc_sim_7b_63", 30, acceptance=acc, on_step=on_step)
        b = medusa_generate(tiny_llama.model, h, None, ids, "mc_sim_7b_63", 30, acceptance=acc)
        assert a.token_ids == b.token_ids and 0 < len(a.token_ids) <= 30


# ----------------------------------------------------------------------------------------------- first proposal

@pytest.mark.parametrize("fmt", ["1", "2"])
def test_first_proposal_is_the_base_and_heads_top_k_at_the_prompt_end(tiny_llama, fmt):
    model, heads = tiny_llama.model, tiny_llama.heads[fmt]  # untied (own lm_head) and tied heads
    ids = _ids(tiny_llama.tokenizer, PROMPTS[1])
    got = first_proposal(model, heads, ids, 7)
    with torch.inference_mode():  # independently: HF's own forward, and the heads' module on the last hidden row
        base = torch.softmax(model(torch.tensor([ids])).logits[0, -1].float(), dim=-1).topk(7)
        hidden = model.get_decoder()(input_ids=torch.tensor([ids])).last_hidden_state[0, -1]
        per_head = torch.softmax(heads(hidden, model.get_output_embeddings()).float(), dim=-1).topk(7)  # [K, 7]
    assert got["base"]["ids"] == base.indices.tolist()
    assert torch.allclose(torch.tensor(got["base"]["probs"]), base.values, atol=1e-5)
    assert [h["ids"] for h in got["heads"]] == per_head.indices.tolist()
    assert torch.allclose(torch.tensor([h["probs"] for h in got["heads"]]), per_head.values, atol=1e-5)
    assert len(got["heads"]) == heads.num_heads and all(len(h["ids"]) == 7 for h in got["heads"])


def test_first_proposal_bad_input_is_one_line(tiny_llama):
    model, heads = tiny_llama.model, tiny_llama.heads["2"]
    for topk in (0, 129):
        with pytest.raises(WorkbenchError, match="top-k"):
            first_proposal(model, heads, [1, 2, 3], topk)
    with pytest.raises(WorkbenchError, match="empty"):
        first_proposal(model, heads, [], 3)
    with pytest.raises(WorkbenchError, match="vocabulary 100"):
        first_proposal(model, random_heads(64, 100, 2, tied=False), [1, 2, 3], 3)


# ----------------------------------------------------------------------------------------------- CLI

def _cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_json_compare(capsys, tiny_llama):
    code, out, err = _cli(capsys, "decode", "--model", str(tiny_llama.model_dir), "--heads",
                          str(tiny_llama.heads_dirs["1"]), "--tree", "mc_sim_7b_63", "--prompt", PROMPTS[1],
                          "--max-new-tokens", "16", "--compare", "--json", "--device", "cpu")
    assert code == 0, err
    obj = json.loads(out)
    ids = prepare_prompt(tiny_llama.tokenizer, PROMPTS[1])
    assert obj["token_ids"] == _generate(tiny_llama.model, ids, 16)
    assert obj["matches_greedy"] is True and obj["steps"] == len(obj["accepted_lengths"])
    for k in ("text", "tokens_per_step", "tokens_per_s", "vanilla_tokens_per_s", "speedup", "overhead"):
        assert isinstance(obj[k], (str, float, int)), k


def test_cli_text_output_and_prompt_ids(capsys, tiny_qwen2):
    code, out, err = _cli(capsys, "decode", "--model", str(tiny_qwen2.heads_dirs["3"]), "--tree", "[[0],[1],[0,0]]",
                          "--prompt-ids", "5,6,7,8", "--max-new-tokens", "10", "--compare")
    assert code == 0, err
    text, summary = out.rstrip("\n").rsplit("\n", 1)
    ref = _generate(tiny_qwen2.model, [5, 6, 7, 8], 10)
    assert text == tiny_qwen2.tokenizer.decode(ref, skip_special_tokens=True)
    assert "tokens/step" in summary and "matches greedy: yes" in summary


def test_cli_errors_are_one_line(capsys, tiny_llama, tmp_path):
    plain = tmp_path / "plain"
    tiny_llama.model.save_pretrained(plain)
    tiny_tokenizer(chat_template=False).save_pretrained(plain)
    h = str(tiny_llama.heads_dirs["2"])
    base = ["decode", "--model", str(plain), "--heads", h, "--tree", "[[0]]"]
    for argv, msg in [
        (base + ["--prompt", "hi"], "no chat template"),
        (base + ["--prompt-ids", "1,x"], "--prompt-ids"),
        (base + ["--prompt", "hi", "--raw", "--acceptance", "greedy", "--temperature", "0.5"], "greedy"),
        (["decode", "--model", str(plain), "--tree", "[[0]]", "--prompt", "hi"], "--heads"),
        (base[:-1] + ["[[0,0,0,0,0,0]]", "--prompt", "hi", "--raw"], "parent [0, 0, 0, 0, 0] is missing"),
        (base[:-1] + ["[[0],[0,0],[0,0,0],[0,0,0,0],[0,0,0,0,0],[0,0,0,0,0,0]]", "--prompt", "hi", "--raw"],
         "exceeds"),
        (base + ["--prompt-ids", "1,2", "--batch-sizes", "0"], "argument --batch-sizes: 0 is outside 1.."),
        (base + ["--prompt-ids", "1,2", "--batch-sizes", "2"], "--batch-sizes 2 but 1 prompt(s) given"),
        (base + ["--prompt-ids", "1,2", "--batch", "2"], "--batch: this flag is now --batch-sizes B"),
        (base + ["--prompts", str(tmp_path / "missing.json"), "--raw"], "missing.json"),
    ]:
        code, out, err = _cli(capsys, *argv)
        last = err.rstrip("\n").rsplit("\n", 1)[-1]  # (transformers may draw a loading bar before it)
        assert code == 2 and last.startswith("error: ") and msg in last and "Traceback" not in err, (argv, err)
    code, out, _ = _cli(capsys, *base, "--prompt", "hi", "--raw", "--max-new-tokens", "3", "--json")
    assert code == 0 and len(json.loads(out)["token_ids"]) <= 3


def test_cli_several_prompts_print_a_json_list_in_prompt_order(capsys, tiny_llama, make_prompt_file):
    """decode --prompts FILE --batch-sizes B: one JSON object per prompt, in prompt order, each shaped like the
    single-prompt object and equal to decoding that prompt alone (the last batch holds the remainder)."""
    texts = ["Hello world", "Write a short poem about the sea.", "2+2=", "Name three colours.", "Why?"]
    path = make_prompt_file(texts)
    base = ["decode", "--model", str(tiny_llama.model_dir), "--heads", str(tiny_llama.heads_dirs["2"]),
            "--tree", "mc_sim_7b_63", "--prompts", str(path), "--max-new-tokens", "12", "--device", "cpu"]
    code, out, err = _cli(capsys, *base, "--batch-sizes", "2", "--json", "--compare")
    assert code == 0, err
    objs = json.loads(out)
    assert isinstance(objs, list) and len(objs) == len(texts)
    for text, obj, batch in zip(texts, objs, [2, 2, 2, 2, 1]):
        ids = prepare_prompt(tiny_llama.tokenizer, text)
        assert obj["token_ids"] == _generate(tiny_llama.model, ids, 12)[: len(obj["token_ids"])]
        assert obj["matches_greedy"] is True and obj["divergences"] == [] and obj["batch_size"] == batch
        assert {"text", "steps", "tokens_per_step", "tokens_per_s", "speedup", "overhead"} <= set(obj)
    code, out, err = _cli(capsys, *base, "--batch-sizes", "3", "--limit", "4")
    assert code == 0, err
    assert out.count("tokens/step") == 4  # text mode: each prompt's text and its summary line


# ----------------------------------------------------------------------------------------------- the real demo model

@pytest.mark.slow
def test_demo_model_medusa_is_exact_with_random_heads():
    from workbench.runtime.models import load_base

    model, tok = load_base(None, "cpu")  # the demo model is installed with the package: a load error fails
    heads = random_heads(model.config.hidden_size, model.config.vocab_size, 4, tied=True, std=0.02)
    ids = prepare_prompt(tok, "Write a haiku about autumn.")
    ref = _generate(model, ids, 24)
    for tree in ("mc_sim_7b_63", [[0], [0, 0], [1]]):
        assert medusa_generate(model, heads, tok, ids, tree, 24).token_ids == ref
    # batched: three prompts of different lengths together, each its solo greedy decode
    prompts = [ids] + [prepare_prompt(tok, t) for t in ("Explain KV caching in one paragraph.", "Hi")]
    solo = [_generate(model, p, 24) for p in prompts]
    for tree in ("mc_sim_7b_63", [[0], [0, 0], [1]]):
        assert [r.token_ids for r in medusa_generate(model, heads, tok, prompts, tree, 24)] == solo


@pytest.mark.slow
def test_cli_demo_defaults_when_the_demo_heads_exist(capsys):
    code, out, err = _cli(capsys, "decode", "--tree", "[[0],[0,0],[1]]", "--prompt", "Name three colours.",
                          "--max-new-tokens", "24", "--compare", "--json", "--device", "cpu")
    assert code == 0, err
    obj = json.loads(out)
    assert obj["matches_greedy"] is True and obj["tokens_per_step"] >= 1.0


# ----------------------------------------------------------------------------------------------- the step engine

def test_one_engine_and_prebuilt_buffers_serve_many_prompts_and_trees(tiny):
    """One StepEngine (its static cache reused, reallocated when a longer generation needs it) and TreeBuffers
    built once: Medusa on every tree and vanilla, interleaved over prompts of different lengths, all stay plain
    greedy, and the cache holds exactly prompt + emitted after every step."""
    from workbench.runtime.engine import StepEngine
    from workbench.runtime.treemask import tree_setup

    heads = random_heads(64, 128, 5, tied=True, seed=3)
    engine = StepEngine(tiny.model, compile=False)
    bufs = [tree_setup(TREES[name], tiny.model) for name in ("chain", "mc_sim_7b_63", "deep")]
    for prompt in PROMPTS[::-1]:  # shortest prompt first: the long one must grow the cache
        ids = _ids(tiny.tokenizer, prompt)
        ref = _generate(tiny.model, ids, NEW)
        for buf in bufs:
            on_step, _ = checked_steps(len(ids))
            res = medusa_generate(tiny.model, heads, tiny.tokenizer, ids, buf, NEW, on_step=on_step, engine=engine)
            assert res.token_ids == ref
            assert vanilla_generate(tiny.model, tiny.tokenizer, ids, NEW, engine=engine).token_ids == ref
    assert engine.capacity >= max(len(_ids(tiny.tokenizer, p)) for p in PROMPTS) + NEW


def test_compile_that_cannot_work_is_one_error_line(tiny, monkeypatch, capsys):
    """A step that fails to compile (no C++ toolchain, a graph break under fullgraph, ...) is an error naming the
    fix, never a silent eager run (a benchmark would time something else than it says); the CLI prints one
    `error:` line and exits 2."""
    from workbench.runtime.engine import StepEngine

    def broken(fn, **kw):
        def compiled(*a, **k):
            raise RuntimeError("InvalidCxxCompiler: no working C++ compiler found\ndetails on a second line")
        return compiled
    monkeypatch.setattr(torch, "compile", broken)
    engine = StepEngine(tiny.model, compile=True)
    heads = random_heads(64, 128, 5, tied=True, seed=3)
    ids = _ids(tiny.tokenizer, PROMPTS[1])
    with pytest.raises(WorkbenchError, match="--compile: cannot compile the decoding step .*InvalidCxxCompiler.*"
                                             "--no-compile") as e:
        medusa_generate(tiny.model, heads, tiny.tokenizer, ids, "mc_sim_7b_63", NEW, engine=engine)
    assert "\n" not in str(e.value) and engine.compile
    code, out, err = _cli(capsys, "decode", "--model", str(tiny.model_dir), "--heads", str(tiny.heads_dirs["2"]),
                          "--tree", "[[0]]", "--prompt", "hi", "--max-new-tokens", "4", "--device", "cpu",
                          "--compile")
    lines = [x for x in err.splitlines() if x.strip() and not x.startswith("Loading weights")]  # (a progress bar)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: --compile: cannot compile"), err


def test_verify_times_keeps_the_context_fixed(tiny):
    """Timing a bare verify forward writes rows past the pointer but leaves the cache where it was: the next
    generation step sees the same prefix."""
    from workbench.runtime.engine import StepEngine
    from workbench.runtime.timing import verify_times
    from workbench.runtime.treemask import root_setup, tree_setup

    engine = StepEngine(tiny.model, compile=False)
    with torch.inference_mode():
        engine.prefill([torch.arange(1, 30), torch.arange(1, 20)], 80)
    before = [layer.keys[:, :, :29].clone() for layer in engine.cache.layers]
    for buf in (root_setup(tiny.model), tree_setup("mc_sim_7b_63", tiny.model)):
        assert min(verify_times(engine, buf, random_heads(64, 128, 5, tied=True), repeats=3, warmup=1)) > 0
        assert engine.host_lengths == [29, 19] and engine.lengths.tolist() == [29, 19] and engine.start == 29
        assert all(torch.equal(b, layer.keys[:, :, :29]) for b, layer in zip(before, engine.cache.layers))
