"""`workbench train-heads` end to end on a tiny random model: self-distil, cache, train, save; resume; bad input."""
import json

import pytest
import torch

from workbench import WorkbenchError
from workbench.cli import main
from workbench.runtime.heads import DEMO_HEADS, load_heads
from support.tiny import tiny_tokenizer
from workbench.train.distill import interleaved_prompts, load_dataset_tensors
from workbench.train.medusa1 import TrainConfig, default_folders, train_heads


@pytest.fixture
def prompt_file(tmp_path):
    rows = [{"instruction": f"Say something about the number {i}.", "input": "", "output": "x"} for i in range(12)]
    rows[3]["input"] = "with context"
    f = tmp_path / "train_alpaca.json"
    f.write_text(json.dumps(rows))
    return f


def _cfg(prompts, **kw):
    base = dict(tokens=120, max_new_tokens=12, gen_batch=4, gen_dtype="float32", steps=40, batch_size=64, lr=1e-2,
                warmup=2, num_heads=3)
    base.update(kw)
    return TrainConfig(prompts=prompts, **base)


@pytest.mark.parametrize("active_steps", [0, 30])
def test_train_heads_learns_and_saves(tiny_llama, prompt_file, tmp_path, active_steps):
    prompts = interleaved_prompts([str(prompt_file)])
    assert len(prompts) == 12 and any("with context" in p for p in prompts)
    out = tmp_path / "heads"
    summary = train_heads(tmp_path / "work", _cfg(prompts, active_steps=active_steps), str(tiny_llama.model_dir), out,
                          log_every=5)
    if active_steps:  # the first 30 steps ran on the emitted tokens only, the last 10 on all 128
        assert 1 < summary["active_vocab"] < 128
    heads, cfg = load_heads(out)
    assert heads.num_heads == 3 and heads.tied and cfg["medusa_format"] == 2
    assert cfg["training"]["answer_tokens"] >= 120
    losses = [h["loss"] for h in summary["history"]]
    assert losses[-1] < losses[0]
    # heads learn the model's own continuations: head 1 beats chance (1/128) by far on held-out parts
    assert summary["validation"]["head_1"]["top5"] > 0.2


def test_init_starts_from_given_heads_and_refuses_other_shapes(tiny_llama, prompt_file, tmp_path):
    prompts = interleaved_prompts([str(prompt_file)])
    first = tmp_path / "first"
    a = train_heads(tmp_path / "work", _cfg(prompts), str(tiny_llama.model_dir), first, log_every=5)
    # one step at a vanishing learning rate from `first` keeps its weights (and its accuracy) ...
    again = tmp_path / "again"
    b = train_heads(tmp_path / "work", _cfg(prompts, steps=1, lr=1e-12, warmup=1, init=str(first)),
                    str(tiny_llama.model_dir), again)
    for (k, x), (_, y) in zip(load_heads(first)[0].state_dict().items(), load_heads(again)[0].state_dict().items()):
        assert torch.equal(x, y), k
    assert b["validation"] == a["validation"] and b["init"] == str(first)
    # ... where training from zero for that step does not
    c = train_heads(tmp_path / "work", _cfg(prompts, steps=1, lr=1e-12, warmup=1), str(tiny_llama.model_dir),
                    tmp_path / "zero")
    assert c["validation"] != a["validation"]
    with pytest.raises(WorkbenchError, match="--init .*3 heads x 1 layers.*match --num-heads"):
        train_heads(tmp_path / "fresh", _cfg(prompts, num_heads=2, init=str(first)), str(tiny_llama.model_dir),
                    tmp_path / "bad")
    assert not (tmp_path / "fresh").exists()  # refused before writing or generating anything


@pytest.mark.unit
def test_targets_are_t_plus_k_plus_1_within_a_sequence(tmp_path):
    ids = torch.tensor([10, 11, 12, 13, 20, 21, 22])
    seq = torch.tensor([0, 0, 0, 0, 1, 1, 1], dtype=torch.int32)
    torch.save({"ids": ids, "hidden": torch.zeros(7, 4, dtype=torch.bfloat16), "seq": seq}, tmp_path / "p.pt")
    _, tgt = load_dataset_tensors([tmp_path / "p.pt"], 2)
    # hidden[0] chose ids[0] (the base's guess); head 1 -> ids[1], head 2 -> ids[2]; never across sequences
    assert tgt.tolist() == [[11, 12], [12, 13], [13, -100], [-100, -100], [21, 22], [22, -100], [-100, -100]]


def test_resume_continues_without_regenerating(tiny_llama, prompt_file, tmp_path):
    prompts = interleaved_prompts([str(prompt_file)])
    work, out = tmp_path / "work", tmp_path / "heads"
    train_heads(work, _cfg(prompts, steps=10), str(tiny_llama.model_dir), out, log_every=5)
    parts = sorted((work / "parts").glob("part-*.pt"))
    stamps = [p.stat().st_mtime_ns for p in parts]
    summary = train_heads(work, _cfg(prompts, steps=20), str(tiny_llama.model_dir), out, log_every=5)
    assert [p.stat().st_mtime_ns for p in sorted((work / "parts").glob("part-*.pt"))] == stamps
    (ckpt,) = work.glob("checkpoint-*.pt")  # the same settings resumed the same checkpoint
    history = json.loads(torch.load(ckpt, weights_only=True)["history"])
    assert [h["step"] for h in history] == [5, 10, 15, 20] and summary["steps"] == 20


def test_parts_hold_the_answers_generate_gives_and_reruns_only_add_new_prompts(tiny_llama, prompt_file, tmp_path):
    from workbench.runtime.generation import prepare_prompt
    from workbench.train.distill import build_data, prompt_key

    prompts = interleaved_prompts([str(prompt_file)])
    work = tmp_path / "work"
    build_data(work, _cfg(prompts[:8], tokens=10_000), str(tiny_llama.model_dir), None)
    first = sorted((work / "parts").glob("part-*.pt"))
    assert len(first) == 2  # 8 prompts, batches of 4; ran out of prompts before 10k tokens
    d = torch.load(first[0], weights_only=True)
    tok = tiny_llama.tokenizer
    for b in range(4):  # each stored answer is exactly what plain greedy generate() says
        enc = torch.tensor([prepare_prompt(tok, prompts[b])])
        ref = tiny_llama.model.generate(enc, max_new_tokens=12, do_sample=False)[0, enc.shape[1]:].tolist()
        got = d["ids"][d["seq"] == b].tolist()
        assert ref[:len(got)] == got
    # hidden[t] is the state whose base logits chose ids[t]
    logits = tiny_llama.model.get_output_embeddings()(d["hidden"].float())
    assert (logits.argmax(-1) == d["ids"].long()).float().mean() > 0.95  # bf16-stored states
    stamps = [p.stat().st_mtime_ns for p in first]
    build_data(work, _cfg(prompts, tokens=10_000), str(tiny_llama.model_dir), None)  # 4 more prompts: one part
    parts = sorted((work / "parts").glob("part-*.pt"))
    assert len(parts) == 3 and [p.stat().st_mtime_ns for p in parts[:2]] == stamps
    keys = [k for p in parts for k in json.loads(p.with_suffix(".json").read_text())["prompt_keys"]]
    assert sorted(keys) == sorted(prompt_key(t) for t in prompts)


def test_more_answers_per_prompt_fork_at_the_first_token(tiny_llama, prompt_file, tmp_path):
    from workbench.runtime.generation import eos_ids, prepare_prompt
    from workbench.train.distill import build_data, prompt_key

    prompts = interleaved_prompts([str(prompt_file)])[:4]
    work = tmp_path / "work"
    build_data(work, _cfg(prompts, tokens=10_000, answers_per_prompt=3), str(tiny_llama.model_dir), None)
    parts = sorted((work / "parts").glob("part-*.pt"))
    keys = [json.loads(p.with_suffix(".json").read_text())["prompt_keys"] for p in parts]
    assert keys == [[prompt_key(t, j) for t in prompts] for j in range(3)]  # one answer rank per part
    model, tok = tiny_llama.model, tiny_llama.tokenizer
    stop = eos_ids(model, tok)
    for j, part in enumerate(parts[1:], start=1):
        d = torch.load(part, weights_only=True)
        for b, text in enumerate(prompts):
            enc = torch.tensor([prepare_prompt(tok, text)])
            first = model(enc).logits[0, -1].float()
            first[sorted(stop)] = float("-inf")
            forced = first.argsort(descending=True)[j].item()  # the j-th runner-up opens the answer ...
            forked = torch.cat([enc, torch.tensor([[forced]])], 1)
            ref = model.generate(forked, max_new_tokens=12, do_sample=False)[0, forked.shape[1]:].tolist()
            got = d["ids"][d["seq"] == b].tolist()
            assert got and ref[:len(got)] == got  # ... and greedy goes on from it; the forced token is not stored
    # a rerun asking for fewer answers adds nothing
    stamps = [p.stat().st_mtime_ns for p in parts]
    build_data(work, _cfg(prompts, tokens=10_000, answers_per_prompt=2), str(tiny_llama.model_dir), None)
    assert [p.stat().st_mtime_ns for p in sorted((work / "parts").glob("part-*.pt"))] == stamps


def test_cli_train_heads(tiny_llama, prompt_file, tmp_path, capsys):
    out = tmp_path / "cli_heads"
    rc = main(["train-heads", "--model", str(tiny_llama.model_dir), "--prompts", str(prompt_file), "--tokens", "40",
               "--max-new-tokens", "8", "--gen-batch", "4", "--gen-dtype", "float32", "--steps", "3",
               "--num-heads", "2", "--work", str(tmp_path / "w"), "--out", str(out)])
    assert rc == 0
    assert load_heads(out)[0].num_heads == 2
    assert json.loads(capsys.readouterr().out)["steps"] == 3


@pytest.mark.unit
def test_default_folders_cache_the_work_and_name_the_heads_after_the_model(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_CACHE", str(tmp_path))
    assert default_folders(None) == (tmp_path / "train-heads" / "SmolLM2-135M-Instruct", DEMO_HEADS)
    work, out = default_folders("org/Model-1B")
    assert work == tmp_path / "train-heads" / "org--Model-1B" and str(out) == "org--Model-1B-medusa-heads"
    assert default_folders("m.gguf")[1].name == "m-medusa-heads"


@pytest.mark.unit
@pytest.mark.parametrize("name", ["alpaca_eval.json", "mt_bench_questions.jsonl"])
def test_held_out_sets_are_refused(tmp_path, name):
    f = tmp_path / name
    f.write_text(json.dumps([{"instruction": "hi"}]))
    with pytest.raises(WorkbenchError, match="held out"):
        interleaved_prompts([str(f)])


def test_bad_inputs_are_one_line_errors_and_write_nothing(tiny_llama, tmp_path, capsys):
    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    broken = tmp_path / "broken.json"
    broken.write_text("[{\"instruction\": ")
    good = tmp_path / "good.json"
    good.write_text(json.dumps([{"instruction": "hi"}]))
    for f, extra in ((empty, []), (broken, []), (good, ["--init", str(tmp_path / "no_heads")])):
        out = tmp_path / f"out_{f.stem}"
        rc = main(["train-heads", "--model", str(tiny_llama.model_dir), "--prompts", str(f), "--out", str(out),
                   "--work", str(tmp_path / f"w_{f.stem}")] + extra)
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and err[-1].startswith("error: ") and not out.exists()
        assert not extra or "--init" in err[-1]


def test_base_without_chat_template_is_refused(tiny_llama, prompt_file, tmp_path):
    folder = tmp_path / "plain"
    tiny_llama.model.save_pretrained(folder)
    tiny_tokenizer(chat_template=False).save_pretrained(folder)
    with pytest.raises(WorkbenchError, match="chat template"):
        train_heads(tmp_path / "w", _cfg(interleaved_prompts([str(prompt_file)])), str(folder), tmp_path / "o")
    assert not (tmp_path / "o").exists()


def test_a_time_budget_stops_generation_and_training_in_time_and_writes_the_heads(tiny_llama, prompt_file, tmp_path):
    import time

    budget = 20
    cfg = _cfg(interleaved_prompts([str(prompt_file)]), tokens=10**7, steps=10**6, answers_per_prompt=40,
               time_budget=budget)
    t0 = time.time()
    summary = train_heads(tmp_path / "work", cfg, str(tiny_llama.model_dir), tmp_path / "heads", log_every=20)
    took = time.time() - t0
    assert took < budget, took  # validation and saving included
    assert 0 < summary["answer_tokens"] < 10**7 and 0 < summary["steps"] < 10**6  # both phases cut short
    heads, config = load_heads(tmp_path / "heads")
    assert heads.num_heads == 3 and config["training"]["time_budget"] == budget
    # the schedule ran on the time there was: after the warm-up, the cosine down to (almost) nothing at the end
    lrs = [h["lr"] for h in summary["history"]]
    assert lrs[-1] < 0.02 * cfg.lr and lrs == sorted(lrs, reverse=True)


def test_time_budget_flags_are_checked(tiny_llama, prompt_file, tmp_path, capsys):
    for flag, value in (("--time-budget", "0"), ("--gen-share", "1")):
        rc = main(["train-heads", "--model", str(tiny_llama.model_dir), "--prompts", str(prompt_file), flag, value,
                   "--work", str(tmp_path / "w"), "--out", str(tmp_path / "o")])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and err[-1].startswith(f"error: {flag} {value}:"), err
    assert not (tmp_path / "w").exists() and not (tmp_path / "o").exists()


@pytest.mark.unit
def test_default_training_files_come_from_the_data_dir_only(tmp_path, monkeypatch, capsys):
    """The demo heads' training sets are read from $WORKBENCH_DATA_DIR (a GPU machine gets them carried there) and
    nowhere else: on a fresh clone without it, train-heads without --prompts is one error line naming both ways."""
    from workbench.cli import main
    from workbench.train.distill import DEFAULT_TRAIN_FILES, default_prompt_files

    monkeypatch.setenv("WORKBENCH_DATA_DIR", str(tmp_path))
    (tmp_path / DEFAULT_TRAIN_FILES[1]).write_text("[]")
    assert default_prompt_files() == [str(tmp_path / DEFAULT_TRAIN_FILES[1])]
    monkeypatch.delenv("WORKBENCH_DATA_DIR")
    assert default_prompt_files() == []
    assert main(["train-heads", "--work", str(tmp_path / "w"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: no training prompts: pass --prompts FILE") and \
        "WORKBENCH_DATA_DIR" in err[0], err
    assert not (tmp_path / "w").exists() and not (tmp_path / "o").exists()


