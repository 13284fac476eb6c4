"""The self-distilled training data both recipes learn from (paper §2.2.1, phases 1 and 2 of `workbench
train-heads`), and the format of its `parts/` folder (this module owns it).

  1. generate — the base model's own greedy answers to training prompts (batched; bf16 on CPU is ~3x fp32).
  2. cache    — with each answer token, the last hidden state [H] that chose it (Medusa-1 trains on these alone).
parts/part-NNNNN.pt holds ids [N] (answer tokens, flat), hidden [N, H] bf16 and seq [N] (the answer each token
belongs to); part-NNNNN.json beside it holds answer_tokens, prompts, prompt_keys (prompt_key of every answer),
model and launch. Every part is written atomically, the JSON first, so a killed run loses at most one batch.
Self-distillation matters: heads learn what *this* model will say, which is what greedy verification accepts.
"""
from __future__ import annotations

import hashlib
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from workbench import WorkbenchError, note
from workbench.core.notes import FieldError, Note
from workbench.core.data import data_dirs, load_prompts
from workbench.core.io import atomic_write, atomic_write_json, read_json
from workbench.runtime.generation import eos_ids, greedy_continuations, prepare_prompt, right_padded
from workbench.runtime.models import load_base, model_label
from workbench.runtime.parallel import Launch, current_launch

DEFAULT_TRAIN_FILES = ["alpaca_en_demo_1k.json", "gpteacher_roleplay_alpaca.json", "gsm8k_train_alpaca.json"]
HELD_OUT = ("alpaca_eval", "mt_bench")  # calibration sets: never train on them


@dataclass
class DistillConfig:
    """What the data depends on (each recipe's config carries these fields, `data()` gives them)."""
    prompts: list[str]
    tokens: int = 200_000           # self-distilled answer tokens to generate
    max_new_tokens: int = 256
    gen_batch: int = 64
    gen_dtype: str = "bfloat16"
    answers_per_prompt: int = 1     # answer j > 0 opens with the base's (j+1)-th likeliest first token, then greedy


def default_prompt_files() -> list[str]:
    """The default training files, each from the first data folder holding it ($WORKBENCH_DATA_DIR first, as for
    the named prompt sets: a GPU machine gets them carried there)."""
    return [next(str(d / f) for d in data_dirs() if (d / f).is_file())
            for f in DEFAULT_TRAIN_FILES if any((d / f).is_file() for d in data_dirs())]


def interleaved_prompts(files: list[str], seed: int = 0) -> list[str]:
    """Shuffle each file, then interleave them so any prefix of the stream mixes every source."""
    if not files:
        raise FieldError("prompts", "none", "no training prompt files: pass {field} FILE [FILE ...] (Alpaca-format "
                         "JSON/JSONL/CSV)")
    for f in files:
        if any(h in Path(f).name.replace("-", "_").lower() for h in HELD_OUT):
            raise FieldError("prompts", "held_out", f"{{field}} {f}: Alpaca-eval and MT-Bench are held out for "
                             "calibration; train on other prompts")
    streams = []
    for i, f in enumerate(files):
        ps = load_prompts(f)
        random.Random(seed + i).shuffle(ps)
        streams.append(ps)
    out = []
    for j in range(max(len(s) for s in streams)):
        out.extend(s[j] for s in streams if j < len(s))
    return out


# ----------------------------------------------------------------------------------------------- parts

def prompt_key(text: str, answer: int = 0) -> str:
    """Parts remember which prompts (and which of their answers) they hold, so a rerun with other or more prompt
    files, or more --answers-per-prompt, only adds new ones."""
    key = hashlib.sha1(text.encode()).hexdigest()[:16]
    return key if answer == 0 else f"{key}/{answer}"


@torch.no_grad()
def nth_first_tokens(model, tok, prompts: list[list[int]], n: int, stop: list[int]) -> list[int]:
    """Each prompt's n-th likeliest first answer token (n = 0: the greedy one), skipping stop tokens and byte
    pieces of a character (forced alone, those send a small model into loops of garbage).

    One forward over the right-padded batch."""
    ids, mask = right_padded(prompts)
    logits = model(input_ids=ids.to(model.device), attention_mask=mask.to(model.device)).logits
    last = logits[torch.arange(len(prompts)), torch.tensor([len(p) - 1 for p in prompts])].float()  # [B, V]
    last[:, stop] = float("-inf")
    out = []
    for cands in last.topk(min(n + 32, last.shape[-1]), dim=-1).indices.tolist():
        whole = [t for t in cands if "\ufffd" not in tok.decode([t])]
        out.append(whole[min(n, len(whole) - 1)] if whole else cands[n])
    return out


def generate_part(model, tok, texts: list[str], max_new_tokens: int, answer: int = 0) -> dict:
    """The base model's greedy answers to a batch of prompts, with the hidden state that chose each answer token.

    Returns ids [N] (answer tokens, flat over sequences, each answer ending at its first stop token so heads learn
    to predict the stop too), hidden [N, H] bf16 (hidden[t]'s base logits chose ids[t]) and seq [N].
    answer > 0 forks: the answer opens with the base's (answer+1)-th likeliest first token and continues greedily
    (fresh greedy text from the same prompts once they run out); that forced token is not stored, since no hidden
    state chose it.
    """
    encoded = [prepare_prompt(tok, t) for t in texts]  # the chat template, as the live decoder and calibrate use
    stop = sorted(eos_ids(model, tok))
    if answer:
        encoded = [p + [t] for p, t in zip(encoded, nth_first_tokens(model, tok, encoded, answer, stop))]
    conts, hidden = greedy_continuations(model, encoded, max_new_tokens, stop, tok.pad_token_id, return_hidden=True)
    return dict(ids=torch.tensor([t for c in conts for t in c], dtype=torch.int32),
                hidden=torch.cat(hidden).to(torch.bfloat16).cpu(),
                seq=torch.cat([torch.full((len(c),), b, dtype=torch.int32) for b, c in enumerate(conts)]),
                answer_tokens=sum(map(len, conts)))


def part_infos(parts_dir: Path) -> list[tuple[Path, dict]]:
    return [(p, read_json(p.with_suffix(".json"), str(parts_dir))) for p in sorted(parts_dir.glob("part-*.pt"))]


def generation_plan(todo: list[tuple[str, int]], gen_batch: int) -> list[list[tuple[str, int]]]:
    """The batches, in order, that generate the (prompt, answer rank) pairs of `todo`: up to gen_batch pairs of
    one answer rank each. Every process of a launch computes the same plan and takes its share of it."""
    plan = []
    while todo:
        j = todo[0][1]
        batch = [x for x in todo[:gen_batch] if x[1] == j]
        plan.append(batch)
        todo = todo[len(batch):]
    return plan


def build_data(work: Path, cfg: DistillConfig, model_name: str | None, device: str | None,
               launch: Launch | None = None, stop_at: float | None = None, device_map: str | None = None) -> list[Path]:
    """Phase 1+2: add parts/part-NNNNN.pt until the folder holds cfg.tokens answer tokens; returns every part.

    Resumes from the parts on disk and skips prompts they already answer, so a rerun with a larger --tokens or
    other --prompts files extends the data set; training uses every part in the folder. Under a launch of N
    processes each generates a contiguous share of the same plan, up to 1/N of the missing tokens (parts of the
    launch's own processes do not change its plan: every process reads the same earlier parts). `stop_at`
    (time.time() seconds): no batch starts that the last one's duration says would end after it.
    """
    launch = launch or current_launch()
    parts_dir = work / "parts"
    parts_dir.mkdir(parents=True, exist_ok=True)
    label = model_label(model_name)
    infos = part_infos(parts_dir)
    for p, i in infos:
        if i.get("model", label) != label:
            raise FieldError("work", "other_model", f"{{field}} {work}: {p.name} holds answers of {i['model']}, not "
                             f"of {label} (a work folder of another run): use another {{field}} for this model")
    earlier = [(p, i) for p, i in infos if i.get("launch") != launch.id]
    have = sum(i["answer_tokens"] for _, i in earlier)
    if have >= cfg.tokens:
        return [p for p, _ in infos]
    done = {k for _, i in earlier for k in i.get("prompt_keys", [])}
    todo = [(t, j) for j in range(cfg.answers_per_prompt) for t in cfg.prompts if prompt_key(t, j) not in done]
    plan = generation_plan(todo, cfg.gen_batch)
    first = max((int(p.stem.split("-")[1]) for p, _ in earlier), default=-1) + 1  # part index of plan[0]
    quota = -(-(cfg.tokens - have) // launch.world)
    share = launch.share(len(plan))
    model = tok = None
    produced, last_seconds, out_of_time = 0, 0.0, False
    bar = tqdm(total=quota, unit="tok", desc="self-distil", dynamic_ncols=True, disable=launch.rank != 0)
    for k in share:
        if produced >= quota:
            break
        if stop_at is not None and time.time() + last_seconds > stop_at:
            out_of_time = True
            break
        if model is None:
            model, tok = load_base(model_name, launch.device(device, device_map), cfg.gen_dtype, device_map=device_map)
            if not tok.chat_template:
                raise WorkbenchError("the base model's tokenizer has no chat template: heads must learn the answers "
                                     "the model gives in chat, so pass a chat model (or a tokenizer with a template)")
        t0 = time.time()
        batch, j = [t for t, _ in plan[k]], plan[k][0][1]  # one answer rank per batch
        part = generate_part(model, tok, batch, cfg.max_new_tokens, j)  # greedy_continuations runs without grad
        path = parts_dir / f"part-{first + k:05d}.pt"
        # the JSON first: a part counts as done once its .pt is there, so a kill between the two loses nothing
        atomic_write_json(path.with_suffix(".json"), {"answer_tokens": part["answer_tokens"], "prompts": len(batch),
                                                      "prompt_keys": [prompt_key(t, j) for t in batch],
                                                      "model": label, "launch": launch.id})
        atomic_write(path, lambda tmp: torch.save({k: v for k, v in part.items() if k != "answer_tokens"}, tmp))
        produced += part["answer_tokens"]
        bar.update(part["answer_tokens"])
        last_seconds = time.time() - t0
    bar.close()
    if produced < quota:
        who = f"process {launch.rank} of {launch.world}: " if launch.world > 1 else ""
        said = f"{who}stopped generating after {have + produced} tokens (asked for {cfg.tokens}): "
        note(Note("generation_out_of_time", said + "{field}", field="time_budget") if out_of_time else
             Note("out_of_prompts", said + "ran out of prompts; add {field} files or raise {fix}",
                  fix="answers_per_prompt", field="prompts"))
    del model
    return [p for p, _ in part_infos(parts_dir)]


def load_dataset_tensors(parts: list[Path], num_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden [N, H] bf16 and targets [N, K]: head k guesses ids[t+k] (the base chose ids[t] from hidden[t]);
    -100 where that runs past the answer's end."""
    hs, ts = [], []
    for p in parts:
        d = torch.load(p, weights_only=True)
        ids, seq = d["ids"].long(), d["seq"]
        N = ids.shape[0]
        tgt = torch.full((N, num_heads), -100, dtype=torch.long)
        for k in range(1, num_heads + 1):
            j = torch.arange(N) + k
            ok = j < N
            same = torch.zeros(N, dtype=torch.bool)
            same[ok] = seq[j[ok]] == seq[ok]
            tgt[same, k - 1] = ids[j[same]]
        hs.append(d["hidden"])
        ts.append(tgt)
    return torch.cat(hs), torch.cat(ts)


# ----------------------------------------------------------------------------------------------- as token sequences (Medusa-2)

def load_examples(parts_dir: Path, prompts: list[str], tok, max_prompt_tokens: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, answer ids) of every first answer in the parts `build_data` wrote: the answers are stored as
    tokens, the prompts as keys, re-encoded here with the chat template they were answered in. Forked answers
    (rank > 0) are left out: their forced first token is not stored."""
    by_key = {prompt_key(t): t for t in prompts}
    out = []
    for p, info in part_infos(parts_dir):
        d = torch.load(p, weights_only=True)
        answers: dict[int, list[int]] = {}
        for t, b in zip(d["ids"].tolist(), d["seq"].tolist()):
            answers.setdefault(b, []).append(t)
        for b, key in enumerate(info["prompt_keys"]):
            if "/" in key or key not in by_key or b not in answers:
                continue
            prompt = prepare_prompt(tok, by_key[key])
            if len(prompt) <= max_prompt_tokens:
                out.append((prompt, answers[b]))
    return out


def batch_tensors(examples: list[tuple[list[int], list[int]]], num_heads: int):
    """Right-padded ids/mask [B, L]; (rows, cols) [M] of the answer positions (flat, example by example): the
    hidden state at (rows[m], cols[m]) predicts answer token m; targets [M, K]: head k (1-based) guesses the answer
    token k further on, -100 past the answer's end."""
    ids, mask = right_padded([p + c for p, c in examples])
    rows = [b for b, (_, c) in enumerate(examples) for _ in c]
    cols = [len(p) - 1 + t for p, c in examples for t in range(len(c))]
    tgt = []
    for _, c in examples:
        for t in range(len(c)):
            tgt.append([c[t + k] if t + k < len(c) else -100 for k in range(1, num_heads + 1)])
    return ids, mask, torch.tensor(rows), torch.tensor(cols), torch.tensor(tgt, dtype=torch.long).view(-1, num_heads)
