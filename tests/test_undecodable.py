"""A model the live decoder cannot decode (Mamba: one recurrent state per sequence, no tree in its cache).

calibrate and train-heads only generate greedily (HF generate, left-padded batches) and read hidden states, which
is right for any causal LM: checked here on a tiny Mamba (batched answers == one-by-one answers; ranks from the
generation's hidden states == ranks from a teacher-forced forward). So both run, each with one `warning:` line
saying the decoder cannot use the result, while decode refuses in one `error:` line.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from workbench.calibrate.topk import head_ranks
from workbench.cli import main
from workbench.runtime.generation import greedy_continuations
from workbench.runtime.heads import save_heads
from support.tiny import random_heads, tiny_tokenizer

PROMPTS = ["Tell me a story.", "What is 2+2?", "hi", "Why is the sky blue?"]


def _mamba():
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model("mamba", hidden_size=64, num_hidden_layers=2, vocab_size=128, state_size=4,
                               initializer_range=0.2, eos_token_id=2, pad_token_id=0, bos_token_id=1)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(cfg).eval().requires_grad_(False)


@pytest.fixture(scope="module")
def mamba_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("mamba")
    _mamba().save_pretrained(d / "model")
    tiny_tokenizer().save_pretrained(d / "model")
    save_heads(random_heads(64, 128, 3, tied=True, seed=1), d / "heads", str(d / "model"), fmt=2)
    (d / "prompts.jsonl").write_text("".join(json.dumps({"id": f"q{i}", "instruction": p}) + "\n"
                                             for i, p in enumerate(PROMPTS)))
    return d


def test_mamba_greedy_answers_and_head_ranks_are_what_calibrate_assumes():
    model, heads = _mamba(), random_heads(64, 128, 3, tied=True, seed=1)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(5, 128, (n,), generator=g).tolist() for n in (3, 9, 5, 12)]  # unequal: left padding
    conts, hidden = greedy_continuations(model, prompts, 10, [], 0, return_hidden=True)
    assert conts == [greedy_continuations(model, [p], 10, [], 0)[0] for p in prompts]  # padding changes nothing
    from_generation, _ = head_ranks(model, heads, prompts, conts, 10, hidden=hidden)
    teacher_forced, mismatches = head_ranks(model, heads, prompts, conts, 10)
    assert mismatches == [0] * len(prompts)  # the teacher-forced base picks the same tokens
    assert all(np.array_equal(a, b) for a, b in zip(from_generation, teacher_forced))


def _warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("warning: ")]


def test_calibrate_and_train_heads_warn_once_and_decode_refuses(mamba_dir, tmp_path, capsys):
    m, h, p = str(mamba_dir / "model"), str(mamba_dir / "heads"), str(mamba_dir / "prompts.jsonl")
    rc = main(["calibrate", "--model", m, "--heads", h, "--prompts", p, "--max-new-tokens", "3", "--topk", "4",
               "--budgets", "2", "--gen-batch", "4", "--device", "cpu", "--out", str(tmp_path / "cal")])
    warns = _warnings(capsys.readouterr().err)
    assert rc == 0 and (tmp_path / "cal" / "accuracies.csv").exists()
    assert len(warns) == 1 and "MambaForCausalLM has linear_attention layers" in warns[0], warns
    assert "`workbench decode`" in warns[0]

    rc = main(["train-heads", "--model", m, "--prompts", p, "--tokens", "8", "--max-new-tokens", "3",
               "--gen-dtype", "float32", "--steps", "1", "--positions-per-step", "4", "--num-heads", "2",
               "--work", str(tmp_path / "w"), "--out", str(tmp_path / "h")])
    warns = _warnings(capsys.readouterr().err)
    assert rc == 0 and len(warns) == 1 and "linear_attention" in warns[0] and "heads train correctly" in warns[0]

    rc = main(["decode", "--model", m, "--heads", h, "--tree", "[[0]]", "--prompt-ids", "5,6,7",
               "--max-new-tokens", "3", "--device", "cpu"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err[-1].startswith("error: ") and "linear_attention" in err[-1]


def test_an_attention_model_gets_no_such_warning(tmp_path, capsys):
    from support.tiny import tiny_model

    d = tmp_path / "llama"
    tiny_model("llama", seed=0).save_pretrained(d)
    tiny_tokenizer().save_pretrained(d)
    save_heads(random_heads(64, 128, 3, tied=True, seed=1), tmp_path / "heads", str(d), fmt=2)
    (tmp_path / "p.jsonl").write_text(json.dumps({"id": "q0", "instruction": "hi"}) + "\n")
    rc = main(["calibrate", "--model", str(d), "--heads", str(tmp_path / "heads"), "--prompts",
               str(tmp_path / "p.jsonl"), "--max-new-tokens", "3", "--topk", "4", "--budgets", "2", "--device", "cpu",
               "--holdout", "0", "--out", str(tmp_path / "cal")])
    assert rc == 0 and not any("linear_attention" in w for w in _warnings(capsys.readouterr().err))


# ----------------------------------------------------------------------------------------------- Medusa-2 (train-heads --recipe medusa-2, eval-heads)

def test_medusa2_refuses_a_mamba_before_generating(mamba_dir, tmp_path, capsys):
    """Medusa-2's LoRA adapts the decoder's attention and MLP projections; a Mamba has none (in_proj, x_proj, ...),
    so the recipe cannot apply: one error line from the model's config alone, before any answer is generated
    (Medusa-1 heads, which need no projection, train with the warning above)."""
    rc = main(["train-heads", "--recipe", "medusa-2", "--model", str(mamba_dir / "model"), "--prompts",
               str(mamba_dir / "prompts.jsonl"), "--tokens", "8", "--max-new-tokens", "3", "--gen-dtype", "float32",
               "--steps", "1", "--sequences-per-step", "2", "--num-heads", "2", "--warmup", "sine", "--no-amp",
               "--work", str(tmp_path / "w"), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: --recipe medusa-2: MambaForCausalLM"), err
    assert "none of the decoder projections LoRA adapts" in err[0] and "in_proj" in err[0]
    assert "--recipe medusa-1" in err[0]
    assert not (tmp_path / "w" / "parts").exists() and not (tmp_path / "o").exists()


def test_medusa2_on_a_hybrid_model_warns_as_medusa1_does(tmp_path):
    """A hybrid (attention + Mamba layers, Jamba) has the projections: Medusa-2 trains it, with Medusa-1's warning
    that the decoder cannot decode the result; both decided from the config before anything is generated."""
    from transformers import AutoConfig

    from workbench.runtime.kvcache import undecodable_warning
    from workbench.train.adapter import lora_targets
    from workbench.train.medusa2 import Medusa2Config
    from workbench.runtime.models import empty_model

    cfg = AutoConfig.for_model("jamba", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, intermediate_size=64, vocab_size=128, attn_layer_period=2,
                               attn_layer_offset=1, num_experts=1, use_mamba_kernels=False)
    cfg.save_pretrained(tmp_path / "jamba")
    skeleton = empty_model(str(tmp_path / "jamba"))
    assert {"q_proj", "o_proj"} <= set(lora_targets(skeleton, Medusa2Config(prompts=[])))
    warn = undecodable_warning(skeleton, "the Medusa-2 model trains correctly")
    assert warn.startswith("warning: the Medusa-2 model trains correctly") and "linear_attention" in warn


def test_eval_heads_on_a_mamba_measures_and_skips_live_decoding(mamba_dir, tmp_path, capsys):
    """eval-heads measures head accuracy and backbone drift (right on any causal LM, as calibrate's ranks) and
    would then decode live: on a Mamba it warns once, as calibrate does, and leaves live decoding out."""
    m2 = tmp_path / "merged"  # laid out as train-heads --recipe medusa-2 writes merged/: heads beside the model
    save_heads(random_heads(64, 128, 3, tied=True, seed=2), m2, str(m2))
    model = _mamba()
    model.config.medusa_num_heads, model.config.medusa_num_layers, model.config.medusa_format = 3, 1, 2
    model.save_pretrained(m2)
    tiny_tokenizer().save_pretrained(m2)
    rc = main(["eval-heads", "--medusa2", str(m2), "--model", str(mamba_dir / "model"), "--heads",
               str(mamba_dir / "heads"), "--prompts", str(mamba_dir / "prompts.jsonl"), "--holdout", "0.5",
               "--max-new-tokens", "3", "--topk", "2", "--device", "cpu", "--out", str(tmp_path / "r.json")])
    warns = _warnings(capsys.readouterr().err)
    assert rc == 0 and len(warns) == 1, warns
    assert "live decoding skipped" in warns[0] and "MambaForCausalLM has linear_attention layers" in warns[0]
    r = json.loads((tmp_path / "r.json").read_text())
    assert "live_medusa1" not in r and len(r["medusa2_topk"]) == 3 and r["drift"]["positions"] > 0
