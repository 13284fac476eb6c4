"""`workbench train-heads`: Medusa-1 heads on a frozen base, trained on self-distilled data (paper §2.2.1).

Three resumable phases, each writing atomically into a work folder so a killed run picks up where it stopped:
  1. generate — the base model's own greedy answers to training prompts (batched; bf16 on CPU is ~3x fp32).
  2. cache    — one teacher-forced forward per batch stores the last hidden state [T, H] of every answer position.
  3. train    — heads only (the base never runs again): loss = sum_k 0.8^k * CE(head k, token t+k+1).
Self-distillation matters: heads learn what *this* model will say, which is what greedy verification accepts.
"""
from __future__ import annotations

import hashlib
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from workbench import WorkbenchError
from workbench.core.data import data_dirs, load_prompts
from workbench.core.io import atomic_write, atomic_write_json, read_json, run_lock
from workbench.runtime.generation import eos_ids, greedy_continuations, prepare_prompt, right_padded
from workbench.runtime.heads import DEMO_HEADS, MedusaHeads, check_heads_fit, heads_fingerprint, load_heads, save_heads
from workbench.runtime.kvcache import undecodable_warning
from workbench.runtime.models import cache_dir, load_base, model_label
from workbench.runtime.parallel import Launch, Shard, current_launch

DEFAULT_TRAIN_FILES = ["alpaca_en_demo_1k.json", "gpteacher_roleplay_alpaca.json", "gsm8k_train_alpaca.json"]
HELD_OUT = ("alpaca_eval", "mt_bench")  # calibration sets: never train on them


@dataclass
class TrainConfig:
    prompts: list[str]
    num_heads: int = 4
    num_layers: int = 1
    tied: bool = True
    tokens: int = 200_000          # self-distilled answer tokens to generate
    max_new_tokens: int = 256
    gen_batch: int = 64
    gen_dtype: str = "bfloat16"
    steps: int = 3000
    batch_size: int = 256           # positions per step (each trains all K heads)
    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup: int = 50
    decay: float = 0.8
    seed: int = 0
    save_dtype: str = "float16"     # heads file dtype (released Medusa heads are fp16; half the size)
    active_steps: int = 0           # the first N steps use a softmax over only the tokens the data emits (~6x faster)
    answers_per_prompt: int = 1     # answer j > 0 opens with the base's (j+1)-th likeliest first token, then greedy
    init: str | None = None         # start from these heads (more data for heads trained before) instead of zero
    time_budget: float | None = None  # seconds for the whole run: generation, training, validation, saving
    gen_share: float = 0.5          # with a time budget: generation stops starting batches after this share of it


def run_key(cfg, leave_out: tuple[str, ...], start: MedusaHeads | None, **extra) -> str:
    """The digest a training checkpoint is named by: the run's settings but `leave_out` (what may change on a resume),
    `extra` (its data parts, ...) and the starting heads by their weights, not where they lie."""
    key = {k: v for k, v in asdict(cfg).items() if k not in leave_out} | extra
    key["init"] = heads_fingerprint(start) if start is not None else None
    return hashlib.sha1(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:12]


def default_prompt_files() -> list[str]:
    """The default training files, each from the first data folder holding it ($WORKBENCH_DATA_DIR first, as for
    the named prompt sets: a GPU machine gets them carried there)."""
    return [next(str(d / f) for d in data_dirs() if (d / f).is_file())
            for f in DEFAULT_TRAIN_FILES if any((d / f).is_file() for d in data_dirs())]


def default_folders(model: str | None) -> tuple[Path, Path]:
    """(work folder in the user cache, heads folder) for a base model: the demo model retrains the demo heads in
    place; another model writes ORG--NAME-medusa-heads in the current folder (train-heads without --work/--out)."""
    slug = model_label(model).replace("/", "--").replace(".gguf", "")
    return cache_dir() / "train-heads" / slug, DEMO_HEADS if model is None else Path(f"{slug}-medusa-heads")


def interleaved_prompts(files: list[str], seed: int = 0) -> list[str]:
    """Shuffle each file, then interleave them so any prefix of the stream mixes every source."""
    if not files:
        raise WorkbenchError("no training prompt files: pass --prompts FILE [FILE ...] (Alpaca-format JSON/JSONL/CSV)")
    for f in files:
        if any(h in Path(f).name.replace("-", "_").lower() for h in HELD_OUT):
            raise WorkbenchError(f"--prompts {f}: Alpaca-eval and MT-Bench are held out for calibration; "
                                 "train on other prompts")
    streams = []
    for i, f in enumerate(files):
        ps = load_prompts(f)
        random.Random(seed + i).shuffle(ps)
        streams.append(ps)
    out = []
    for j in range(max(len(s) for s in streams)):
        out.extend(s[j] for s in streams if j < len(s))
    return out


# ----------------------------------------------------------------------------------------------- 1+2. data

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


def build_data(work: Path, cfg: TrainConfig, model_name: str | None, device: str | None,
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
            raise WorkbenchError(f"--work {work}: {p.name} holds answers of {i['model']}, not of {label} (a work "
                                 "folder of another run): use another --work for this model")
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
        tqdm.write(f"{who}stopped generating after {have + produced} tokens (asked for {cfg.tokens}): "
                   + ("--time-budget" if out_of_time else "ran out of prompts; add --prompts files or raise "
                      "--answers-per-prompt"))
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


# ----------------------------------------------------------------------------------------------- 3. train

def restrict_vocab(lm_head, targets: torch.Tensor):
    """A frozen lm_head over only the tokens that occur as targets, and targets renumbered into it.

    The tied heads' cost is the [H, V] projection; self-distilled answers use a fraction of V, so a softmax over
    that subset trains ~V/V_active times faster. Alone it costs 1-3 points of top-1 (tokens never seen as targets
    are never pushed down and win at inference), so training ends with full-vocabulary steps (--active-steps).
    """
    active = torch.unique(targets[targets != -100])                              # [Va]
    remap = torch.full((lm_head.weight.shape[0],), -100, dtype=torch.long)
    remap[active] = torch.arange(active.numel())
    small = torch.nn.Linear(lm_head.weight.shape[1], active.numel(), bias=False)
    small.weight.data = lm_head.weight.data[active].clone()
    small.requires_grad_(False)
    new = targets.clone()
    new[targets != -100] = remap[targets[targets != -100]]
    return small.to(lm_head.weight.device), new

def head_loss(heads: MedusaHeads, lm_head, hidden: torch.Tensor, targets: torch.Tensor, decay: float):
    """hidden [B, H], targets [B, K] -> (weighted loss, per-head top-1 accuracy [K], a tensor: read it only when
    logging, since on a GPU every read waits for the step)."""
    logits = heads(hidden, lm_head)                                              # [K, B, V]
    loss, acc = 0.0, []
    for k in range(heads.num_heads):
        ce = F.cross_entropy(logits[k].float(), targets[:, k], ignore_index=-100)
        loss = loss + decay ** (k + 1) * ce
        m = targets[:, k] != -100
        hit = (logits[k].argmax(-1) == targets[:, k]) & m
        acc.append(hit.sum() / m.sum())  # nan when no target
    return loss, torch.stack(acc).detach()


def lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    p = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * 0.5 * (1 + math.cos(math.pi * min(1.0, p)))


CHECKPOINT_SECONDS = 30  # a fast device checkpoints at most this often (the state is written whole each time)


def train_heads(work: Path, cfg: TrainConfig, model_name: str | None, out: Path, device: str | None = None,
                log_every: int = 50, device_map: str | None = None) -> dict:
    """Run all three phases; returns the training summary written beside the heads. Holds the work folder's lock
    (two runs on one folder would interleave their parts), shared by the processes of a data-parallel launch:
    each generates its share of the data, the last to finish trains (the others return {"trained": False})."""
    t0 = time.time()
    launch = current_launch()
    with run_lock(work, "--work", launch=launch):
        return _train_heads(work, cfg, model_name, out, device, log_every, launch, t0, device_map)


def _train_heads(work: Path, cfg: TrainConfig, model_name: str | None, out: Path, device: str | None,
                 log_every: int, launch: Launch, t0: float, device_map: str | None) -> dict:
    budget = cfg.time_budget
    deadline = t0 + budget if budget else None
    start = load_heads(cfg.init)[0] if cfg.init else None  # checked before hours of generation, not after
    if start is not None and (start.num_heads, start.num_layers, start.tied) != (cfg.num_heads, cfg.num_layers, cfg.tied):
        raise WorkbenchError(f"--init {cfg.init}: {start.num_heads} heads x {start.num_layers} layers "
                             f"({'tied' if start.tied else 'untied'}), but this run asks for {cfg.num_heads} x "
                             f"{cfg.num_layers} ({'tied' if cfg.tied else 'untied'}): match --num-heads, "
                             "--num-layers and --untied to them")
    work.mkdir(parents=True, exist_ok=True)
    atomic_write_json(work / "config.json", {**asdict(cfg), "prompts": len(cfg.prompts), "model": model_label(model_name)})
    with Shard(work, launch, f"--work {work}") as shard:
        parts = build_data(work, cfg, model_name, device, launch,
                           t0 + cfg.gen_share * budget if budget else None, device_map)
        last = shard.finish()
    if not last:
        return dict(trained=False, rank=launch.rank, num_processes=launch.world,
                    answer_tokens=sum(i["answer_tokens"] for _, i in part_infos(work / "parts")))
    if not parts:
        raise WorkbenchError("no training data was generated (empty prompt set, or a --time-budget too short for "
                             "one batch)")
    # validation: every 20th part (spread over the prompt files), or the last one of a few
    val_parts = parts[19::20] if len(parts) >= 20 else parts[-1:] if len(parts) > 2 else []
    train_parts = [p for p in parts if p not in val_parts]
    hidden, targets = load_dataset_tensors(train_parts, cfg.num_heads)
    base, _ = load_base(model_name, launch.device(device, device_map), "float32", device_map=device_map)
    undecodable = undecodable_warning(base, "the heads train correctly")
    if undecodable:  # heads learn from greedy answers and hidden states, right on any causal LM; decoding is not
        print(undecodable, file=sys.stderr)
    full_head = base.get_output_embeddings()
    dev = full_head.weight.device  # the heads train where the lm_head is
    if dev.type == "meta":
        raise WorkbenchError("--device-map auto left the lm_head off every device (offloaded): free a GPU or "
                             "train without --device-map")
    # active-vocabulary phase, then the full softmax: tokens the data never emits must learn to lose, too
    small_head, small_targets = restrict_vocab(full_head, targets) if cfg.active_steps and cfg.tied else (None, None)
    with torch.random.fork_rng(devices=[]):  # the biases' init from --seed: a rerun trains the same heads
        torch.manual_seed(cfg.seed)
        heads = MedusaHeads(hidden.shape[1], full_head.weight.shape[0], cfg.num_heads, cfg.num_layers, cfg.tied)
    if start is not None:
        check_heads_fit(start, base)
        heads.load_state_dict(start.float().state_dict())
    elif not cfg.tied:  # untied heads start from the base lm_head, as Medusa does
        for h in heads:
            h[-1].weight.data.copy_(full_head.weight.data.cpu())
    check_heads_fit(heads, base)
    heads.to(dev)
    if dev.type == "cuda":  # the whole data set on the GPU (bf16 states): no host copy per step
        hidden, targets = hidden.to(dev), targets.to(dev)
        small_targets = small_targets.to(dev) if small_targets is not None else None
    params = [p for p in heads.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    # one checkpoint per (settings, data): a rerun resumes (more --steps stretch the schedule); other settings or
    # more data train afresh
    not_in_key = ("prompts", "tokens", "steps", "max_new_tokens", "gen_batch", "gen_dtype", "save_dtype",
                  "answers_per_prompt", "time_budget", "gen_share")
    ckpt = work / f"checkpoint-{run_key(cfg, not_in_key, start, parts=[p.name for p in parts])}.pt"
    step, history, progress = 0, [], 0.0
    g = torch.Generator().manual_seed(cfg.seed)
    if ckpt.is_file():
        state = torch.load(ckpt, weights_only=True)
        heads.load_state_dict(state["heads"])
        opt.load_state_dict(state["opt"])
        step, history = int(state["step"]), json.loads(state["history"])
        progress = float(state.get("progress", step / cfg.steps))
        if "rng" in state:  # the sampler's state: a resumed run draws the batches an unbroken one would
            g.set_state(state["rng"])
        else:  # a checkpoint from before the state was saved
            g.manual_seed(cfg.seed + step)
    # --time-budget: training ends with time for validation and saving left; the schedule (warm-up, emitted-token
    # phase, cosine) runs on the progress made, by steps or by time, whichever is further
    train_stop = deadline - max(5.0, 0.05 * budget) if deadline else None
    clock0, progress0 = time.time(), progress

    def at(step: int) -> int:
        """The schedule's step: `step` itself, or with a time budget the step the time spent stands for."""
        if train_stop is None:
            return step
        spent = (time.time() - clock0) / max(train_stop - clock0, 1e-9)
        return max(step, math.ceil(cfg.steps * min(1.0, max(step / cfg.steps, progress0 + (1 - progress0) * spent))))

    N = hidden.shape[0]
    bar = tqdm(total=cfg.steps, initial=step, desc="train heads", unit="step", dynamic_ncols=True)
    autocast = torch.autocast(device_type=dev.type, dtype=torch.bfloat16)
    saved_at, s = None, at(step)
    while s < cfg.steps:
        idx = torch.randint(0, N, (cfg.batch_size,), generator=g).to(hidden.device)
        active = small_head is not None and s < cfg.active_steps
        lm_head = small_head if active else full_head
        h, y = hidden[idx].to(dev).float(), (small_targets if active else targets)[idx].to(dev)
        lr = lr_at(s, cfg)
        for group in opt.param_groups:
            group["lr"] = lr
        with autocast:
            loss, acc = head_loss(heads, lm_head, h, y, cfg.decay)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        bar.update(1)
        s = at(step)
        end = s >= cfg.steps
        if step % log_every == 0 or end:
            top1 = acc.tolist()
            bar.set_postfix(loss=f"{loss.item():.3f}", top1=" ".join(f"{a:.2f}" for a in top1))
            history.append({"step": step, "loss": round(loss.item(), 4), "top1": [round(a, 4) for a in top1],
                            "lr": float(f"{lr:.3g}")})
            if end or saved_at is None or time.time() - saved_at >= CHECKPOINT_SECONDS:
                state = {"heads": heads.state_dict(), "opt": opt.state_dict(), "step": step, "rng": g.get_state(),
                         "history": json.dumps(history), "progress": min(1.0, s / cfg.steps)}
                atomic_write(ckpt, lambda tmp: torch.save(state, tmp))
                saved_at = time.time()
    bar.close()
    if step == 0 and start is None and not ckpt.is_file():
        print("warning: --time-budget left no time to train: the heads written are untrained", file=sys.stderr)
    val = evaluate(heads, full_head, *load_dataset_tensors(val_parts, cfg.num_heads), dev,
                   stop_at=deadline - 1.0 if deadline else None) if val_parts else {}
    tokens = sum(i["answer_tokens"] for _, i in part_infos(work / "parts"))
    summary = dict(model=model_label(model_name), num_heads=cfg.num_heads, num_layers=cfg.num_layers, tied=cfg.tied,
                   answer_tokens=tokens, train_positions=int(N), steps=step, batch_size=cfg.batch_size,
                   lr=cfg.lr, active_steps=cfg.active_steps, init=cfg.init,
                   active_vocab=int(small_head.weight.shape[0]) if small_head is not None else None,
                   device=str(dev), seconds_this_run=round(time.time() - t0, 1), validation=val,
                   validation_parts=[p.name for p in val_parts], history=history[-5:],
                   **({"time_budget": budget} if budget else {}))
    save_heads(heads.cpu(), out, model_label(model_name), extra={"training": summary},
               dtype=getattr(torch, cfg.save_dtype))
    return dict(summary, trained=True)


@torch.no_grad()
def evaluate(heads: MedusaHeads, lm_head, hidden, targets, device, batch: int = 512,
             stop_at: float | None = None) -> dict:
    """Per-head top-1/top-5 on held-out self-distilled positions (teacher-forced); with `stop_at` (time.time()
    seconds) on the positions reached by then (`positions` says how many)."""
    hits1 = torch.zeros(heads.num_heads, device=device)
    hits5 = torch.zeros(heads.num_heads, device=device)
    count = torch.zeros(heads.num_heads, device=device)
    seen = 0
    for i in range(0, hidden.shape[0], batch):
        if stop_at is not None and i and time.time() > stop_at:
            break
        h, y = hidden[i:i + batch].to(device).float(), targets[i:i + batch].to(device)
        logits = heads(h, lm_head)                                               # [K, b, V]
        top5 = logits.topk(5, dim=-1).indices                                    # [K, b, 5]
        for k in range(heads.num_heads):
            m = y[:, k] != -100
            hits1[k] += (top5[k, m, 0] == y[m, k]).sum()
            hits5[k] += (top5[k, m] == y[m, k, None]).any(-1).sum()
            count[k] += m.sum()
        seen += h.shape[0]
    hits1, hits5, count = hits1.cpu(), hits5.cpu(), count.cpu()
    out = {f"head_{k + 1}": {"top1": round(float(hits1[k] / count[k]), 4), "top5": round(float(hits5[k] / count[k]), 4)}
           for k in range(heads.num_heads) if count[k] > 0}
    return dict(out, positions=seen) if seen < hidden.shape[0] else out
