"""Medusa-2 (heads + LoRA backbone): the loss against a hand computation, the adapter-off teacher, resuming, the
outputs every command reads, and the CLI's errors. Tiny tied model (the demo's lm_head is tied, too)."""
import copy
import json
import math
import warnings

import pytest
import torch


from workbench.cli import main  # noqa: E402
from workbench.runtime.heads import load_heads, save_heads  # noqa: E402
from workbench.runtime.models import load_model_and_heads  # noqa: E402
from workbench.train.adapter import Medusa2, add_lora, medusa2_loss, merged_model  # noqa: E402
from workbench.train.distill import batch_tensors  # noqa: E402
from workbench.train.medusa2 import Medusa2Config, train_medusa2  # noqa: E402
from support.tiny import random_heads, tiny_model, tiny_tokenizer  # noqa: E402

K = 3


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    """A tiny tied model folder (with tokenizer), Medusa-1 heads for it and a prompt file."""
    root = tmp_path_factory.mktemp("m2")
    model, tok = tiny_model("llama", tied=True), tiny_tokenizer()
    model.save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    save_heads(random_heads(64, 128, K, tied=True, std=0.02), root / "heads1", str(root / "model"))
    rows = [{"instruction": f"Tell me about {i} apples.", "input": "", "output": "x"} for i in range(24)]
    (root / "train_alpaca.json").write_text(json.dumps(rows))
    return root


def _perturbed(cfg: Medusa2Config, seed: int = 1):
    """A tiny tied model with LoRA whose B matrices are non-zero (as after training), and random heads."""
    peft_model = add_lora(tiny_model("llama", tied=True), cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return Medusa2(peft_model, random_heads(64, 128, K, tied=True, seed=seed)).eval()


def _examples():
    return [([1, 3, 40, 41, 42], [50, 51, 52, 53, 2]), ([1, 3, 60], [70, 71, 2])]


def test_adapter_off_reproduces_the_original_logits_exactly():
    original = tiny_model("llama", tied=True)
    ids = torch.tensor([[1, 3, 40, 41, 42, 50, 51]])
    want = original(input_ids=ids).logits
    m = _perturbed(Medusa2Config(prompts=[], lora_r=4, lora_dropout=0.0))
    with torch.no_grad():
        adapted = m.peft(input_ids=ids).logits
        with m.peft.disable_adapter():
            off = m.peft(input_ids=ids).logits
    assert not torch.allclose(adapted, want, atol=1e-3)  # the adapter does change the model
    assert torch.equal(off, want)
    # and the loss's teacher is exactly that model
    ex = _examples()
    ids, mask, rows, cols, _ = batch_tensors(ex, K)
    teacher = m.teacher_logits(ids, mask, rows, cols)
    full = original(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(teacher, full[rows, cols])


def test_loss_equals_a_hand_computation():
    cfg = Medusa2Config(prompts=[], lora_r=4, lora_dropout=0.0, lambda0=0.3, decay=0.8)
    m = _perturbed(cfg)
    original = tiny_model("llama", tied=True)
    ex = _examples()
    ids, mask, rows, cols, targets = batch_tensors(ex, K)
    with torch.no_grad():
        logits, head_logits = m(ids, mask, rows, cols)
        loss, parts = medusa2_loss(logits, head_logits, m.teacher_logits(ids, mask, rows, cols), targets,
                                   cfg.lambda0, cfg.decay)
        # by hand, one answer token at a time, in float64
        kl, ce = [], [[] for _ in range(K)]
        for p, c in ex:
            seq = torch.tensor([p + c])
            t_logits = original(input_ids=seq).logits[0].double()
            lm = m.peft.get_base_model()
            hidden = lm.model(input_ids=seq).last_hidden_state[0]
            s_logits = m.peft(input_ids=seq).logits[0].double()
            for t in range(len(c)):
                pos = len(p) - 1 + t  # the state that predicts c[t]
                pt, ps = t_logits[pos].softmax(-1), s_logits[pos].softmax(-1)
                kl.append(float((pt * (pt.log() - ps.log())).sum()))
                for k in range(1, K + 1):
                    if t + k < len(c):  # head k guesses the answer token k further on
                        hk = lm.lm_head(m.heads[k - 1](hidden[pos])).double()
                        ce[k - 1].append(float(-hk.log_softmax(-1)[c[t + k]]))
    want_kl = sum(kl) / len(kl)
    want_ce = [sum(x) / len(x) for x in ce]
    want = want_kl + 0.3 * sum(0.8 ** (k + 1) * want_ce[k] for k in range(K))
    assert want_kl > 1e-3  # the adapted model does differ from its teacher
    assert math.isclose(float(parts["kl"]), want_kl, rel_tol=1e-4)
    assert [float(x) for x in parts["ce"]] == pytest.approx(want_ce, rel=1e-4)
    assert math.isclose(float(loss), want, rel_tol=1e-4)


def test_merging_keeps_the_tied_embedding_and_gives_the_adapted_logits():
    m = _perturbed(Medusa2Config(prompts=[], lora_r=4, lora_dropout=0.0))
    embed = m.peft.get_base_model().get_input_embeddings().weight.detach().clone()
    ids = torch.tensor([[1, 3, 40, 41, 42, 50]])
    with torch.no_grad():
        adapted = m.peft(input_ids=ids).logits
        merged = merged_model(m.peft)
        assert torch.equal(merged.get_input_embeddings().weight, embed)  # the lm_head's delta did not leak in
        assert not merged.config.tie_word_embeddings
        torch.testing.assert_close(merged(input_ids=ids).logits, adapted, atol=1e-4, rtol=1e-4)


def _cfg(tied, **kw):
    base = dict(prompts=[f"Tell me about {i} apples." for i in range(24)], num_heads=K, tokens=400,
                max_new_tokens=10, gen_batch=8, gen_dtype="float32", steps=6, batch_size=3, lora_r=4,
                warmup_steps=2, init=str(tied / "heads1"), amp=False, checkpoint_seconds=1e9)
    return Medusa2Config(**base | kw)


def test_a_stopped_run_resumes_to_the_same_state(tied, tmp_path):
    """Stopped after 2 of 6 steps, then rerun: bitwise the adapter, heads and optimizer of an unbroken run."""
    cfg = _cfg(tied)
    whole = train_medusa2(tmp_path / "a", cfg, str(tied / "model"), tmp_path / "out_a", device="cpu")
    assert whole["trained"] and whole["steps"] == 6
    (tmp_path / "b").mkdir()
    import shutil
    shutil.copytree(tmp_path / "a" / "parts", tmp_path / "b" / "parts")  # the same data (skip regenerating)
    first = train_medusa2(tmp_path / "b", cfg, str(tied / "model"), tmp_path / "out_b", device="cpu", stop_after=2)
    assert not first["trained"] and first["steps"] == 2 and not (tmp_path / "out_b").exists()
    rest = train_medusa2(tmp_path / "b", cfg, str(tied / "model"), tmp_path / "out_b", device="cpu")
    assert rest["trained"] and rest["steps"] == 6
    (a,), (b,) = (list((tmp_path / w).glob("medusa2-*.pt")) for w in ("a", "b"))
    sa, sb = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    for part in ("adapter", "heads"):
        assert sa[part].keys() == sb[part].keys()
        assert all(torch.equal(sa[part][k], sb[part][k]) for k in sa[part])
    assert all(torch.equal(x["exp_avg"], y["exp_avg"]) for x, y in zip(sa["opt"]["state"].values(),
                                                                         sb["opt"]["state"].values()))
    start = load_heads(tied / "heads1")[0]
    assert not torch.equal(sa["heads"]["0.0.linear.weight"], start.state_dict()["0.0.linear.weight"])  # it trained
    log = [json.loads(line) for line in (tmp_path / "out_a" / "loss.jsonl").read_text().splitlines()]
    assert log[-1]["step"] == 6 and {"loss", "kl", "ce", "lambda0", "lr"} <= log[-1].keys()


def test_the_same_heads_elsewhere_resume_and_other_heads_start_afresh(tied, tmp_path):
    """The checkpoint names its starting heads by their weights: a copy in another folder (another checkout)
    resumes the stopped run; heads with other weights train from their own start."""
    import shutil
    moved = tmp_path / "elsewhere" / "heads1"
    shutil.copytree(tied / "heads1", moved)
    first = train_medusa2(tmp_path / "w", _cfg(tied), str(tied / "model"), tmp_path / "o1", device="cpu",
                          stop_after=2)
    assert first["steps"] == 2
    again = train_medusa2(tmp_path / "w", _cfg(tied, init=str(moved)), str(tied / "model"), tmp_path / "o1",
                          device="cpu", stop_after=1)
    assert again["steps"] == 3 and len(list((tmp_path / "w").glob("medusa2-*.pt"))) == 1  # step 2, then one more
    heads = load_heads(moved)[0]
    with torch.no_grad():
        next(heads.parameters()).add_(0.01)
    other = tmp_path / "other" / "heads1"
    save_heads(heads, other, base_model="tiny")
    fresh = train_medusa2(tmp_path / "w", _cfg(tied, init=str(other)), str(tied / "model"), tmp_path / "o2",
                          device="cpu", stop_after=1)
    assert fresh["steps"] == 1 and len(list((tmp_path / "w").glob("medusa2-*.pt"))) == 2


def test_outputs_load_as_any_model_and_heads(tied, tmp_path):
    cfg = _cfg(tied, steps=3)
    out = tmp_path / "out"
    train_medusa2(tmp_path / "w", cfg, str(tied / "model"), out, device="cpu")
    heads = load_heads(out / "heads")[0]
    base, tok, h = load_model_and_heads(str(out / "merged"), str(out / "merged"), device="cpu")
    assert h.num_heads == K and h.tied and tok is not None
    assert all(torch.equal(a, b.float()) for a, b in zip(h.state_dict().values(), heads.state_dict().values()))
    _, _, hm = load_model_and_heads(str(out / "medusa"), None, device="cpu")  # Medusa's layout: heads in the weights
    assert hm.num_heads == K and not hm.tied
    torch.testing.assert_close(hm[0][-1].weight, base.get_output_embeddings().weight)
    # the adapter on the original model gives the merged model's logits
    from peft import PeftModel
    original = load_model_and_heads(str(tied / "model"), str(tied / "heads1"), device="cpu")[0]
    with warnings.catch_warnings():  # peft 0.21 reads transformers' deprecated `is_gradient_checkpointing` itself
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        adapted = PeftModel.from_pretrained(copy.deepcopy(original), str(out / "adapter")).eval()
    ids = torch.tensor([[1, 3, 40, 41, 42, 50]])
    with torch.no_grad():
        torch.testing.assert_close(adapted(input_ids=ids).logits, base(input_ids=ids).logits, atol=2e-3, rtol=2e-3)
        assert torch.equal(original.get_input_embeddings().weight, base.get_input_embeddings().weight)


@pytest.mark.parametrize("flags, says", [
    (["--lambda0", "-1"], "--lambda0"),
    (["--warmup", "sine", "--lora-r", "0"], "--lora-r"),
    (["--lora-dropout", "1.5"], "--lora-dropout"),
    (["--steps", "0"], "--steps"),
    (["--untied"], "--untied"),
    (["--init", "/no/such/heads"], "--init"),
])
def test_bad_options_are_one_error_line_and_exit_2(tied, tmp_path, capsys, flags, says):
    out = tmp_path / "out"
    rc = main(["train-heads", "--recipe", "medusa-2", "--model", str(tied / "model"), "--prompts",
               str(tied / "train_alpaca.json"), "--work", str(tmp_path / "w"), "--out", str(out)] + flags)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: ") and says in err[0]
    assert not out.exists()


def test_two_stage_needs_heads_to_start_from(tied, tmp_path, capsys):
    rc = main(["train-heads", "--recipe", "medusa-2", "--model", str(tied / "model"), "--prompts",
               str(tied / "train_alpaca.json"), "--work", str(tmp_path / "w"), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err[-1].startswith("error: --warmup two-stage")


@pytest.mark.unit
def test_eval_heads_bad_folder_is_one_error_line(tmp_path, capsys):
    rc = main(["eval-heads", "--medusa2", str(tmp_path / "missing")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: --medusa2")


def test_cli_trains_from_zero_with_the_sine_warmup(tied, tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["train-heads", "--recipe", "medusa-2", "--model", str(tied / "model"), "--prompts",
               str(tied / "train_alpaca.json"), "--tokens", "100", "--max-new-tokens", "8", "--gen-batch", "8",
               "--gen-dtype", "float32", "--steps", "3", "--sequences-per-step", "2", "--num-heads", "2", "--lora-r", "4",
               "--warmup", "sine", "--no-amp", "--work", str(tmp_path / "w"), "--out", str(out)])
    assert rc == 0 and json.loads(capsys.readouterr().out)["steps"] == 3
    assert load_heads(out / "merged")[0].num_heads == 2
    log = [json.loads(line) for line in (out / "loss.jsonl").read_text().splitlines()]
    assert 0 < log[-1]["lambda0"] <= 0.2  # sine: λ0 rises from 0 to --lambda0
