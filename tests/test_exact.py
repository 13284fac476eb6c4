"""The exact-match contract: in fp32, greedy Medusa emits exactly vanilla greedy's tokens, and both exactly HF
`generate(do_sample=False)`'s, for every kind of tree (1 node, chain, dense, 63+ node sparse, an optimizer tree),
on tiny random models of seven architectures, over 512 tokens (EOS off), with the heads proposing (random heads:
mostly rejected) and with a proposer fed the true continuation with corruptions (long accepted paths, nodes off
rank 0 moved in the cache). The same tests run on CUDA when there is one.

The tiny models have no near-ties (init std 0.2; asserted below on every position), so the equality is a real
assertion and not luck at a tie: a wrong mask, position id, cache compaction or acceptance shows as a different
token within a few hundred steps.
"""
import copy
import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from helpers import TIE, Oracle, checked_steps, rounding_in_tree, tie_model, within_rounding

from workbench import WorkbenchError
from workbench.cli import main
from workbench.decode import acceptance, loop as decode, step
from workbench.decode.divergence import ROUNDING_UNITS, divergence_counts, divergences, rounding_bound, unit_roundoff
from workbench.decode.loop import DecodeResult, Step, medusa_generate, vanilla_generate
from workbench.measure.sweep import run_sweep, sweep_configs
from workbench.runtime.engine import StepEngine
from workbench.runtime.forward import logits_of
from workbench.runtime.generation import prepare_prompt
from workbench.runtime.heads import save_heads
from workbench.trees.optimize import dense_tree
from support.tiny import random_heads, tiny_model, tiny_tokenizer
from workbench.trees.tree import load_tree, make_tree

NEW = 512
# arch -> tiny_model options. Gemma and Gemma 2 tie the lm_head to the embedding, as their real models do. Seeds are
# picked so that every top-2 margin of the 512-token reference is >= CLEAR x fp32's rounding bound (itself ~5x the
# largest drift measured): with a vocab of 128, about half of all seeds have a margin near 1e-5 somewhere in 512
# tokens, where exactness would be luck.
ARCHS = {
    "llama": dict(seed=10), "qwen2": dict(seed=12), "mistral": dict(seed=4), "gemma": dict(seed=0, tied=True),
    "gemma2": dict(seed=1, tied=True), "phi3": dict(seed=13), "gpt_neox": dict(seed=2),
}
CLEAR = 2
NEAR_TIE_IDS = list(range(5, 20))  # the prompt of the near-tie runs below
OPTIMIZER_TREE = Path(__file__).resolve().parent.parent / "trees" / "smollm2-135m-instruct-alpaca-eval-joint-64.json"
TREES = {
    "one_node": [[0]],
    "chain": [[0] * d for d in range(1, 5)],
    "dense": dense_tree([3, 2, 2]),                                        # 21 nodes, all 3 x 2 x 2 rank paths
    "mc_sim_7b_63": "mc_sim_7b_63",                                        # 63 nodes, sparse, depth 4
    "optimizer": make_tree(json.loads(OPTIMIZER_TREE.read_text())["medusa_choices"], "joint-64"),  # 64 nodes
}
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                            reason="no CUDA device here (docs/running.md)"))]


class Reference:
    """One arch on one device: the model, random heads, a prompt, and HF generate's 512 + 5 greedy tokens."""

    def __init__(self, arch: str, device: str):
        self.model = tiny_model(arch, max_positions=1024, **ARCHS[arch]).to(device)
        self.heads = random_heads(64, 128, 5, seed=ARCHS[arch]["seed"] + 100).to(device)
        self.ids = prepare_prompt(tiny_tokenizer(), f"Tell me about {arch}.")
        out = self.model.generate(torch.tensor([self.ids], device=device), do_sample=False,
                                  max_new_tokens=NEW + 5, eos_token_id=None)  # no early stop: all 512 compared
        self.truth = out[0].tolist()                                        # prompt + NEW + 5 tokens
        self.vanilla = vanilla_generate(self.model, None, self.ids, NEW, eos_token_id=[], record=True)


@pytest.fixture(scope="module")
def reference():
    cache = {}

    def get(arch: str, device: str) -> Reference:
        if (arch, device) not in cache:
            cache[(arch, device)] = Reference(arch, device)
        return cache[(arch, device)]
    return get


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arch", list(ARCHS))
def test_vanilla_equals_generate_with_no_near_ties(reference, arch, device):
    ref = reference(arch, device)
    assert ref.vanilla.token_ids == ref.truth[len(ref.ids):len(ref.ids) + NEW]
    rows = [ref.vanilla.choice(k) for k in range(NEW)]
    clear = [c["top"][0] - c["top"][1] > CLEAR * rounding_bound(torch.float32, c["max_abs"]) for c in rows]
    assert all(clear)  # exactness below is not luck at a tie
    assert ref.vanilla.choice(NEW) is not None  # the row after the last token was recorded too


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("proposer", ["heads", "oracle"])
@pytest.mark.parametrize("tree_name", list(TREES))
@pytest.mark.parametrize("arch", list(ARCHS))
def test_greedy_medusa_equals_vanilla_and_generate(reference, arch, tree_name, proposer, device):
    ref = reference(arch, device)
    tree = load_tree(TREES[tree_name])
    oracle = Oracle(ref.truth, tree, seed=len(tree_name)) if proposer == "oracle" else None
    on_step, _ = checked_steps(len(ref.ids))  # the cache holds exactly prompt + emitted after every step
    res = medusa_generate(ref.model, ref.heads, None, ref.ids, tree, NEW, eos_token_id=[], propose=oracle,
                          on_step=on_step, record=True)
    assert res.token_ids == ref.truth[len(ref.ids):len(ref.ids) + NEW]
    assert divergences(res, ref.vanilla, ref.model.dtype) == []
    if oracle is not None and tree.nodes > 1:  # long accepted paths really happened, each the longest offered
        n = len(ref.ids) + 1
        for step in res.steps[:-1]:
            assert len(step.tokens) == oracle.best_length(n, tree)
            n += len(step.tokens)
        assert res.tokens_per_step > 1.5 and max(map(len, (s.tokens for s in res.steps))) >= 4
        if tree_name != "chain":
            assert any(any(r != 0 for r in s.path) for s in res.steps)  # nodes moved in the cache


def test_soft_capped_logits_are_the_models_own(reference):
    """Gemma 2 caps its logits (cap * tanh(l / cap)): the decoder's logits must be the model's, or typical
    acceptance would read other probabilities (greedy would not notice: tanh keeps the argmax)."""
    model = reference("gemma2", "cpu").model
    assert model.config.final_logit_softcapping
    x = torch.tensor([NEAR_TIE_IDS])
    with torch.inference_mode():
        hidden = model.get_decoder()(input_ids=x).last_hidden_state[0]
        assert torch.allclose(logits_of(model, hidden), model(x).logits[0], atol=1e-5)


def test_sliding_window_limits_medusa():
    """Medusa's tree mask is full attention: exact within a sliding window, refused beyond it (one line)."""
    model = tiny_model("mistral", seed=4)
    model.config.sliding_window = 40
    heads = random_heads(64, 128, 5, seed=1)
    ids = list(range(5, 20))
    ref = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=25, eos_token_id=None)[0, 15:]
    assert medusa_generate(model, heads, None, ids, "mc_sim_7b_63", 25, eos_token_id=[]).token_ids == ref.tolist()
    with pytest.raises(WorkbenchError, match="41 tokens exceeds the model's sliding window of 40") as e:
        medusa_generate(model, heads, None, ids, "mc_sim_7b_63", 26, eos_token_id=[])
    assert "\n" not in str(e.value)


# ----------------------------------------------------------------------------------------------- divergence reports

def _run(tokens: list[int], rows: list[list[float]]) -> DecodeResult:
    """A finished run whose token k was chosen from logits rows[k] (what medusa/vanilla_generate record)."""
    res = DecodeResult("test", 1, 0.0, steps=[Step(tokens, (), 1, 0.0, 1 + len(tokens))])
    res.record(torch.tensor(rows))
    return res


@pytest.mark.unit
def test_classifier_rules():
    u, bf16 = unit_roundoff(torch.bfloat16), torch.bfloat16
    assert u == 2 ** -8 and unit_roundoff(torch.float16) == 2 ** -11 and unit_roundoff(torch.float32) == 2 ** -24
    bound = rounding_bound(bf16, 20.0)
    assert bound == ROUNDING_UNITS[bf16] * u * 20.0
    agree = [10.0, 0.0, 0.0, 0.0]
    tie_v, tie_m = [10.0, 20.0, 20.0 - 0.6 * bound, -1.0], [10.0, 20.0 - 0.4 * bound, 20.0, -1.0]
    assert divergences(_run([0, 1], [agree, tie_m]), _run([0, 1], [agree, tie_v]), bf16) == []
    found = divergences(_run([0, 2], [agree, tie_m]), _run([0, 1], [agree, tie_v]), bf16)
    assert found == [dict(position=1, medusa_token=2, vanilla_token=1, margin_medusa=pytest.approx(0.4 * bound),
                          margin_vanilla=pytest.approx(0.6 * bound), gap_medusa=pytest.approx(0.4 * bound),
                          gap_vanilla=pytest.approx(0.6 * bound), bound=bound, kind="near-tie")]
    # three near-equal logits: the runs' top 2 differ, yet the pair moved by only gap_medusa + gap_vanilla
    three_v, three_m = [10.0, 20.0, 20.0 - 0.1 * bound, 20.0 - 0.2 * bound], [10.0, 20.0 - 0.3 * bound, 19.99, 20.0]
    (d,) = divergences(_run([0, 3], [agree, three_m]), _run([0, 1], [agree, three_v]), bf16)
    assert d["kind"] == "near-tie" and d["gap_medusa"] + d["gap_vanilla"] == pytest.approx(0.5 * bound)
    assert d["margin_vanilla"] == pytest.approx(0.1 * bound)
    # the pair's difference moved by gap_medusa + gap_vanilla: just over the bound, or in fp32 (whose bound is
    # ~2000x tighter), that is more than rounding explains: a bug
    wide = [10.0, 20.0, 20.0 - 0.62 * bound, -1.0]
    assert divergences(_run([0, 2], [agree, tie_m]), _run([0, 1], [agree, wide]), bf16)[0]["kind"] == "mismatch"
    fp32 = divergences(_run([0, 2], [agree, tie_m]), _run([0, 1], [agree, tie_v]), torch.float32)
    assert fp32[0]["kind"] == "mismatch"
    # a token that was not its own run's argmax (token 3 at -1): a bug, whatever the margins
    assert divergences(_run([0, 3], [agree, tie_m]), _run([0, 1], [agree, tie_v]), bf16)[0]["kind"] == "mismatch"
    # only the first divergence counts; one output ending early diverges at its length
    found = divergences(_run([0, 2, 3], [agree, tie_m, agree]), _run([0, 1, 0], [agree, tie_v, agree]), bf16)
    assert [d["position"] for d in found] == [1]
    short = divergences(_run([0], [agree, tie_m]), _run([0, 1], [agree, tie_v]), bf16)
    assert short[0]["medusa_token"] is None and short[0]["kind"] == "mismatch"
    assert divergence_counts([found[0], short[0]]) == dict(near_tie_divergences=1, mismatches=1)


# A near-tie flipped by rounding, constructed so that it happens on any CPU: `tie_model`'s top two tokens, 41 then
# 40, are a quarter of bf16's rounding bound apart at every position (and no kernel can swap them), and
# `rounding_in_tree` moves the pair in the tree forward only, as the tree's other rounding could.
MC_SIM = load_tree("mc_sim_7b_63")
TREE_ROWS = MC_SIM.nodes + 1  # tokens in one verify forward of mc_sim_7b_63


def _tie_runs(dtype, lead: float | None) -> tuple[DecodeResult, DecodeResult]:
    """(medusa, vanilla) on `tie_model` in `dtype`; the tree forwards moved by `lead` (None: left alone)."""
    model, heads = tie_model(dtype), random_heads(64, 128, 5, tied=True, seed=1).to(dtype)
    van = vanilla_generate(model, None, NEAR_TIE_IDS, 64, eos_token_id=[], record=True)
    with rounding_in_tree({TREE_ROWS: lead} if lead is not None else {}):
        med = medusa_generate(model, heads, None, NEAR_TIE_IDS, MC_SIM, 64, eos_token_id=[], record=True)
    return med, van


def test_rounding_flip_in_bf16_is_a_near_tie_and_fp32_is_exact():
    med, van = _tie_runs(torch.bfloat16, None)
    assert med.token_ids == van.token_ids and med.tokens_per_step > 2  # nothing flips by itself, on any CPU
    # the tree forward moves the pair by half of bf16's rounding bound (from its third step): 41 and 40 swap
    med, van = _tie_runs(torch.bfloat16, within_rounding(torch.bfloat16))
    (d,) = divergences(med, van, torch.bfloat16)
    assert d["kind"] == "near-tie" and (d["vanilla_token"], d["medusa_token"]) == TIE[::-1]
    assert d["position"] >= 3 and med.token_ids[:d["position"]] == van.token_ids[:d["position"]]
    # what each run recorded is what it computed: its own token ahead by the constructed lead, 1/4 of the bound
    assert d["gap_vanilla"] == pytest.approx(d["bound"] / 4, rel=0.3)  # (bf16 rounds logit 41 by <= 1/4 lead)
    assert d["gap_medusa"] == pytest.approx(d["bound"] / 4, rel=0.3)
    assert d["gap_medusa"] + d["gap_vanilla"] <= d["bound"]
    # the same move relative to fp32's bound (2048x tighter) leaves a lead of 1/64 of a logit in place: exact
    med, van = _tie_runs(torch.float32, within_rounding(torch.float32))
    assert divergences(med, van, torch.float32) == [] and med.token_ids == van.token_ids


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_flip_wider_than_rounding_is_a_mismatch(dtype):
    """The pair moved by 9 leads (2.25x bf16's bound, thousands of fp32's): more than rounding explains."""
    med, van = _tie_runs(dtype, -8.0)
    (d,) = divergences(med, van, dtype)
    assert d["kind"] == "mismatch" and (d["vanilla_token"], d["medusa_token"]) == TIE[::-1]
    assert d["gap_medusa"] + d["gap_vanilla"] > d["bound"]


def _accept_unverified(logits, tokens, tree):
    """A deliberately broken greedy acceptance: takes the first child of the root without checking it."""
    batch = logits.shape[0]
    last = torch.ones(batch, dtype=torch.long, device=logits.device)
    return last, torch.full_like(last, 2), logits[:, 1].argmax(dim=-1)


def _keep_without_moving(cache, state, path, count):
    """A deliberately broken cache compaction: the prefixes grow by the accepted nodes (the step does that) but
    off-path nodes are never moved next to them."""


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bug", ["acceptance", "compaction"])
def test_a_decoder_bug_is_a_mismatch(tiny_llama, monkeypatch, dtype, bug):
    model = copy.deepcopy(tiny_llama.model).to(dtype)  # (the shared fixture stays fp32)
    ids = prepare_prompt(tiny_llama.tokenizer, "Write a short poem about the sea.")
    tree = load_tree("mc_sim_7b_63")
    van = vanilla_generate(model, None, ids, 48, eos_token_id=[], record=True)
    truth = ids + van.token_ids + [0] * tree.depth
    good = medusa_generate(model, None, None, ids, tree, 48, eos_token_id=[], propose=Oracle(truth, tree, miss=0.5),
                           record=True)
    kinds = [d["kind"] for d in divergences(good, van, dtype)]  # long paths, many off rank 0
    assert kinds == [] if dtype == torch.float32 else set(kinds) <= {"near-tie"}  # (bf16 ties may flip: CPU's call)
    if bug == "acceptance":
        monkeypatch.setattr(acceptance, "accept_greedy", _accept_unverified)
    else:
        monkeypatch.setattr(step, "keep", _keep_without_moving)
    bad = medusa_generate(model, None, None, ids, tree, 48, eos_token_id=[], propose=Oracle(truth, tree, miss=0.5),
                          record=True)
    # against the same run without the bug: both compute the same bits until the bug acts, so no rounding flip of
    # a bf16 near-tie can come first, on any CPU
    assert [d["kind"] for d in divergences(bad, good, dtype)] == ["mismatch"]


def _tie_folder(tmp_path) -> tuple[Path, Path]:
    """`tie_model` (saved in fp32, loaded in bf16 by --dtype) with its tokenizer, and tied random heads."""
    model_dir, heads_dir = tmp_path / "model", tmp_path / "heads"
    tie_model(torch.float32).save_pretrained(model_dir)
    tiny_tokenizer().save_pretrained(model_dir)
    save_heads(random_heads(64, 128, 5, tied=True, seed=1), heads_dir, str(model_dir))
    return model_dir, heads_dir


def test_decode_compare_reports_divergences(tmp_path, capsys):
    model_dir, heads_dir = _tie_folder(tmp_path)
    argv = ["decode", "--model", str(model_dir), "--heads", str(heads_dir), "--tree", "mc_sim_7b_63", "--prompt-ids",
            ",".join(map(str, NEAR_TIE_IDS)), "--max-new-tokens", "64", "--compare", "--device", "cpu"]
    with rounding_in_tree({TREE_ROWS: within_rounding(torch.bfloat16)}):
        assert main(argv + ["--json", "--dtype", "bfloat16"]) == 0
        obj = json.loads(capsys.readouterr().out)
        assert obj["matches_greedy"] is False
        (d,) = obj["divergences"]
        assert d["kind"] == "near-tie" and (d["vanilla_token"], d["medusa_token"]) == TIE[::-1]
        assert obj["token_ids"][d["position"]] == d["medusa_token"]
        assert d["gap_medusa"] + d["gap_vanilla"] <= d["bound"]
        assert main(argv + ["--dtype", "bfloat16"]) == 0
        last = capsys.readouterr().out.rstrip("\n").rsplit("\n", 1)[-1]
        assert last.startswith(f"near-tie at token {d['position']}: medusa {d['medusa_token']} ") and "margin" in last
        assert main(argv + ["--json", "--dtype", "bfloat16", "--acceptance", "typical", "--temperature", "0.7"]) == 0
        assert json.loads(capsys.readouterr().out)["divergences"] is None  # sampling is not meant to be greedy's
    with rounding_in_tree({TREE_ROWS: within_rounding(torch.float32)}):
        assert main(argv + ["--json", "--dtype", "float32"]) == 0
        obj = json.loads(capsys.readouterr().out)
        assert obj["matches_greedy"] is True and obj["divergences"] == []
    with rounding_in_tree({TREE_ROWS: -8.0}):
        assert main(argv + ["--dtype", "bfloat16"]) == 0  # reported, not an error: the user reads the line
        assert capsys.readouterr().out.rstrip("\n").rsplit("\n", 1)[-1].startswith("mismatch at token ")


def test_sweep_counts_near_ties_and_mismatches(tmp_path):
    """mc_sim_7b_63's forwards moved within rounding, the 2-node chain's far beyond: every greedy prompt of the
    first is a near-tie, of the second a mismatch; typical rows count nothing (sampling is not greedy's)."""
    model, heads = tie_model(torch.bfloat16), random_heads(64, 128, 5, tied=True, seed=1).to(torch.bfloat16)
    prompts = [list(range(5 + i, 20 + i)) for i in range(4)]
    chain = load_tree([[0], [0, 0]])
    out = tmp_path / "sweep.csv"
    with rounding_in_tree({TREE_ROWS: within_rounding(torch.bfloat16), chain.nodes + 1: -8.0}, skip=0):
        run_sweep(model, heads, None, prompts, sweep_configs([(MC_SIM, "given"), (chain, "given")], [0.0, 0.7]), out,
                  max_new_tokens=32, progress=False)
    df = pd.read_csv(out)
    greedy = df[(df["acceptance"] == "greedy") & (df["kind"] != "vanilla")].set_index("nodes")
    assert (greedy["exact_match"] == 0).all() and (greedy["num_prompts"] == 4).all()
    assert greedy.loc[MC_SIM.nodes, ["near_tie_divergences", "mismatches"]].tolist() == [4, 0]
    assert greedy.loc[chain.nodes, ["near_tie_divergences", "mismatches"]].tolist() == [0, 4]
    typical = df[df["acceptance"] == "typical"]
    assert len(typical) == 2 and typical[["near_tie_divergences", "mismatches"]].isna().all().all()


def test_bench_decode_reports_each_prompts_divergence(tmp_path, capsys):
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "bench" / "decode.py"
    spec = importlib.util.spec_from_file_location("bench_decode", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "decode.json"
    code = bench.main(["--tiny", "--dtype", "bfloat16", "--device", "cpu", "--limit", "3", "--max-new-tokens", "48",
                       "--batch-sizes", "1,2", "--tree", "mc_sim_7b_63", "[[0], [0, 0]]", "--out", str(out)])
    report = json.loads(out.read_text())
    medusa = [r for r in report["runs"] if r["method"] == "medusa"]
    assert len(medusa) == 2 * 3 + 2 * 2  # batch 1: 3 batches per tree; batch 2: 2 (the last holds one prompt)
    for r in medusa:
        assert len(r["divergences"]) == len(r["matches"]) - sum(r["matches"])  # one per prompt that differs
        assert all(d["kind"] in ("near-tie", "mismatch") for d in r["divergences"])
    for s in (s for s in report["summary"] if s["method"] == "medusa"):
        assert s["near_tie_divergences"] + s["mismatches"] == s["prompts"] - s["matches_greedy"]
        assert s["mismatches"] == 0
    assert report["batch_sizes"] == [1, 2]
    assert code == 0  # near-ties are expected in bf16; only a mismatch fails the run
    assert " ties  mism" in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------- batched decoding
# Every sequence of a batch must be exactly what greedy decoding gives that prompt alone: prompts of different
# lengths (ragged prefixes, one common tree block), sequences that accept different path lengths every step and
# stop at different steps (each at its own first EOS), trees of 1 to 64 nodes, several architectures.

BATCH_ARCHS = ["llama", "qwen2", "mistral", "phi3", "gpt_neox"]  # (tiny Gemma 2 repeats one token: no ragged stops)
BATCH_NEW = 96


PROMPT_CUTS = (0, 5, 90, 17, 40)  # five prompts: the reference prompt + that many of its greedy tokens


def _batch_prompts(ref: Reference) -> tuple[list[list[int]], list[list[int]]]:
    """Five prompts of different lengths and their greedy continuations alone: prefixes of the reference run, whose
    every top-2 margin is clear of rounding (test_vanilla_equals_generate_with_no_near_ties), so the continuation
    of truth[:L] is truth[L:] and exactness below is not luck at a tie."""
    cuts = [len(ref.ids) + k for k in PROMPT_CUTS]
    return [ref.truth[:c] for c in cuts], [ref.truth[c:c + BATCH_NEW] for c in cuts]


def _cut_at(toks: list[int], eos: set[int]) -> list[int]:
    return toks[: next((i + 1 for i, t in enumerate(toks) if t in eos), len(toks))]


def _ragged_eos(full: list[list[int]]) -> set[int]:
    """An EOS token, taken from the continuations, at which the sequences stop at >= 3 different steps while the
    first runs to the budget (greedy decoding does not depend on the EOS: cutting the full run is the truth)."""
    for v in dict.fromkeys(t for f in full for t in f):
        lengths = [len(_cut_at(f, {v})) for f in full]
        if len(set(lengths)) >= 3 and lengths[0] == len(full[0]):
            return {v}
    raise AssertionError("no EOS token gives ragged stops: pick other prompts")


@pytest.mark.parametrize("arch", BATCH_ARCHS)
def test_batched_greedy_equals_each_prompt_alone(reference, arch):
    ref = reference(arch, "cpu")
    prompts, full = _batch_prompts(ref)
    eos = _ragged_eos(full)  # some continuations end early, at different steps; others run to the budget
    truths = [_cut_at(f, eos) for f in full]
    for batch in (1, 2, 3, 5):
        group, want = prompts[:batch], truths[:batch]
        van = vanilla_generate(ref.model, None, group, BATCH_NEW, eos_token_id=list(eos))
        assert [r.token_ids for r in van] == want, batch
        for tree_name, spec in TREES.items():
            tree = load_tree(spec)
            oracles = [Oracle(p + f + [0] * 8, tree, seed=b) for b, (p, f) in enumerate(zip(group, full))]
            for propose in (None, oracles):
                res = medusa_generate(ref.model, ref.heads, None, group, tree, BATCH_NEW, eos_token_id=list(eos),
                                      propose=propose)
                assert [r.token_ids for r in res] == want, (batch, tree_name, propose is None)
                assert all(r.batch_size == batch for r in res)
                if propose is not None and tree.nodes > 1:  # long, ragged accepted paths really happened
                    lengths = [[len(s.tokens) for s in r.steps] for r in res if len(r.token_ids) >= 20]
                    assert lengths and max(map(max, lengths)) >= 3, (tree_name, batch, lengths)
                    ragged = any(len({x[i] for x in lengths}) > 1 for i in range(min(map(len, lengths))))
                    assert batch < 3 or ragged, (tree_name, batch, lengths)  # same step, other accepted lengths


def test_batched_steps_report_each_sequence_and_stop_it_alone(tiny_llama):
    """on_step sees one Step per sequence (None once it finished); a sequence's cache length is its prompt plus
    what it emitted; a finished sequence emits nothing more while the others go on."""
    model, heads = tiny_llama.model, tiny_llama.heads["2"]
    prompts = [[5, 6, 7], list(range(10, 40)), [9] * 12]
    seen = []
    res = medusa_generate(model, heads, None, prompts, "mc_sim_7b_63", 20, eos_token_id=[], on_step=seen.append)
    budgets = [20, 20, 20]
    res_short = medusa_generate(model, heads, None, prompts, "mc_sim_7b_63", 20,
                                eos_token_id=[res[1].token_ids[4]])
    assert len(seen) == max(len(r.steps) for r in res)
    for b, r in enumerate(res):
        mine = [s[b] for s in seen]
        assert [s for s in mine if s is not None] == r.steps and None not in mine[: len(r.steps)]
        assert r.steps[-1].cache_len == len(prompts[b]) + budgets[b] == len(prompts[b]) + len(r.token_ids)
    assert res_short[1].token_ids == res[1].token_ids[:5] and res_short[1].stop_reason == "eos"
    assert [r.token_ids for r in res_short[::2]] == [r.token_ids[: len(s.token_ids)] for r, s in
                                                     zip(res[::2], res_short[::2])]


def test_one_host_read_per_step(tiny_llama, monkeypatch):
    """The decode loop reads the device once per step (the accepted rows, lengths, tokens and next roots of every
    sequence): `.tolist()` / `.item()` / `int()` / `float()` / `bool()` of a tensor are counted during the steps."""
    model, heads = tiny_llama.model, tiny_llama.heads["2"]
    engine = StepEngine(model, compile=False)
    counts = {"reads": 0, "steps": 0}
    real = {name: getattr(torch.Tensor, name) for name in ("tolist", "item", "__int__", "__float__", "__bool__",
                                                          "__index__")}

    def counted(name):
        def read(self, *a, **k):
            counts["reads"] += 1
            return real[name](self, *a, **k)
        return read

    def on_step(steps):
        counts["steps"] += 1
        counts["at"].append(counts["reads"])
    for tree, batch in (("mc_sim_7b_63", 3), ([[0], [0, 0], [1]], 1), (None, 2)):
        prompts = [[5, 6, 7, 8], list(range(10, 30)), [9] * 7][:batch]
        counts.update(reads=0, steps=0, at=[])
        for name in real:
            monkeypatch.setattr(torch.Tensor, name, counted(name))
        try:
            if tree is None:
                res = vanilla_generate(model, None, prompts, 30, eos_token_id=[], engine=engine, on_step=on_step)
            else:
                res = medusa_generate(model, heads, None, prompts, tree, 30, eos_token_id=[], engine=engine,
                                      on_step=on_step)
        finally:
            for name, fn in real.items():
                monkeypatch.setattr(torch.Tensor, name, fn)
        steps = max(len(r.steps) for r in (res if isinstance(res, list) else [res]))
        per_step = [b - a for a, b in zip(counts["at"], counts["at"][1:])]  # reads between two steps' ends
        assert counts["steps"] == steps > 5 and set(per_step) == {1}, (tree, per_step)


@pytest.mark.parametrize("rule", [decode.Acceptance(), decode.Acceptance("typical", 0.7),
                                  decode.Acceptance("nucleus", 0.9, top_p=0.9, seed=5)],
                         ids=["greedy", "typical", "nucleus"])
def test_compiled_step_is_exact(tiny_llama, rule):
    """The whole step under torch.compile (aot_eager on CPU: the same traced graph as inductor, in seconds; the
    default mode on CUDA when present) emits exactly the eager decoder's tokens at batch 1 and 3, for greedy and
    for the sampling rules with the same seed (counter-based uniforms: no generator state to diverge); greedy is
    HF generate's output."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = copy.deepcopy(tiny_llama.model).to(device)
    heads = copy.deepcopy(tiny_llama.heads["2"]).to(device)
    engine = StepEngine(model, compile=True, backend=None if device == "cuda" else "aot_eager")
    prompts = [[5, 6, 7, 8], list(range(10, 40)), [9] * 12]
    for tree in ("mc_sim_7b_63", [[0], [0, 0]]):
        for group in (prompts[1:2], prompts):
            eager = medusa_generate(model, heads, None, group, tree, 40, eos_token_id=[], acceptance=rule)
            compiled = medusa_generate(model, heads, None, group, tree, 40, eos_token_id=[], engine=engine,
                                       acceptance=rule)
            assert engine.compile and engine.compile_s > 0  # it really ran compiled
            assert [r.token_ids for r in compiled] == [r.token_ids for r in eager], (tree, len(group))
            if rule.kind == "greedy":
                for p, r in zip(group, compiled):
                    truth = model.generate(torch.tensor([p], device=device), do_sample=False, max_new_tokens=40,
                                           eos_token_id=None)[0, len(p):].tolist()
                    assert r.token_ids == truth
    for group in (prompts[1:2], prompts):
        solo = vanilla_generate(model, None, group, 40, eos_token_id=[], engine=engine)
        assert [r.token_ids for r in solo] == [r.token_ids for r in vanilla_generate(model, None, group, 40,
                                                                                      eos_token_id=[])]


def test_batch_bad_inputs_are_one_line_errors(tiny_llama, monkeypatch):
    from workbench.runtime import kvcache as E

    model, heads = tiny_llama.model, tiny_llama.heads["2"]
    monkeypatch.setattr(E, "free_bytes", lambda device: 1 << 20)  # 1 MiB free: no batch of 512 x 4096 fits
    with pytest.raises(WorkbenchError, match="batch 512 x .* positions needs a .* KV cache") as e:
        StepEngine(model).reserve(512, 4096)
    assert "\n" not in str(e.value)
    hybrid = copy.deepcopy(model)
    hybrid.config.layer_types = ["full_attention", "linear_attention"]
    with pytest.raises(WorkbenchError, match="linear_attention layers, whose cache cannot hold a token tree"):
        medusa_generate(hybrid, heads, None, [[1, 2], [3]], "mc_sim_7b_63", 4)
    with pytest.raises(WorkbenchError, match="--batch-sizes 0"):
        StepEngine(model).reserve(0, 16)
