"""`workbench train-heads`: Medusa-1 heads on a frozen base, trained on self-distilled data (paper §2.2.1).

Three resumable phases, each writing atomically into a work folder so a killed run picks up where it stopped:
  1. generate, 2. cache — the self-distilled answers and the hidden states that chose them (distill.py);
  3. train    — heads only (the base never runs again): loss = sum_k 0.8^k * CE(head k, token t+k+1) (common.py).
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from workbench import warn
from workbench.core.notes import FieldError, Note
from workbench.core.io import atomic_write_json, cache_dir, run_lock
from workbench.runtime.heads import DEMO_HEADS, MedusaHeads, check_heads_fit, load_heads, save_heads
from workbench.runtime.kvcache import undecodable_warning
from workbench.runtime.models import load_base, model_label
from workbench.runtime.parallel import Launch, Shard, current_launch
from workbench.train.common import (CHECKPOINT_SECONDS, Budget, head_losses, heads_loss, load_checkpoint, run_key,
                                    save_checkpoint, warmup_cosine)
from workbench.train.distill import DistillConfig, build_data, load_dataset_tensors, part_infos


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

    def data(self) -> DistillConfig:
        return DistillConfig(self.prompts, self.tokens, self.max_new_tokens, self.gen_batch, self.gen_dtype,
                             self.answers_per_prompt)


def default_folders(model: str | None) -> tuple[Path, Path]:
    """(work folder in the user cache, heads folder) for a base model: the demo model retrains the demo heads in
    place; another model writes ORG--NAME-medusa-heads in the current folder (train-heads without --work/--out)."""
    slug = model_label(model).replace("/", "--").replace(".gguf", "")
    return cache_dir() / "train-heads" / slug, DEMO_HEADS if model is None else Path(f"{slug}-medusa-heads")


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
    m = targets != -100                                                          # [B, K]
    hits = (logits.argmax(-1).T == targets) & m                                  # [B, K]
    acc = hits.sum(0) / m.sum(0)  # nan when no target
    return heads_loss(head_losses(logits, targets), decay), acc.detach()


def train_heads(work: Path, cfg: TrainConfig, model_name: str | None, out: Path, device: str | None = None,
                log_every: int = 50, device_map: str | None = None) -> dict:
    """Run all three phases; returns the training summary written beside the heads. Holds the work folder's lock
    (two runs on one folder would interleave their parts), shared by the processes of a data-parallel launch:
    each generates its share of the data, the last to finish trains (the others return {"trained": False})."""
    t0 = time.time()
    launch = current_launch()
    with run_lock(work, "work", launch=launch):
        return _train_heads(work, cfg, model_name, out, device, log_every, launch, t0, device_map)


def _train_heads(work: Path, cfg: TrainConfig, model_name: str | None, out: Path, device: str | None,
                 log_every: int, launch: Launch, t0: float, device_map: str | None) -> dict:
    budget = cfg.time_budget
    deadline = t0 + budget if budget else None
    start = load_heads(cfg.init)[0] if cfg.init else None  # checked before hours of generation, not after
    if start is not None and (start.num_heads, start.num_layers, start.tied) != (cfg.num_heads, cfg.num_layers, cfg.tied):
        raise FieldError("init", "other_shape", f"{{field}} {cfg.init}: {start.num_heads} heads x {start.num_layers} "
                         f"layers ({'tied' if start.tied else 'untied'}), but this run asks for {cfg.num_heads} x "
                         f"{cfg.num_layers} ({'tied' if cfg.tied else 'untied'}): match {{also}}, {{also2}} and "
                         "{also3} to them", also=("num_heads", "num_layers", "untied"))
    work.mkdir(parents=True, exist_ok=True)
    atomic_write_json(work / "config.json", {**asdict(cfg), "prompts": len(cfg.prompts), "model": model_label(model_name)})
    with Shard(work, launch, work, "work") as shard:
        parts = build_data(work, cfg.data(), model_name, device, launch,
                           t0 + cfg.gen_share * budget if budget else None, device_map)
        last = shard.finish()
    if not last:
        return dict(trained=False, rank=launch.rank, num_processes=launch.world,
                    answer_tokens=sum(i["answer_tokens"] for _, i in part_infos(work / "parts")))
    if not parts:
        raise FieldError("time_budget", "no_data", "no training data was generated (empty prompt set, or a {field} "
                         "too short for one batch)")
    # validation: every 20th part (spread over the prompt files), or the last one of a few
    val_parts = parts[19::20] if len(parts) >= 20 else parts[-1:] if len(parts) > 2 else []
    train_parts = [p for p in parts if p not in val_parts]
    hidden, targets = load_dataset_tensors(train_parts, cfg.num_heads)
    base, _ = load_base(model_name, launch.device(device, device_map), "float32", device_map=device_map)
    undecodable = undecodable_warning(base, "the heads train correctly")
    if undecodable:  # heads learn from greedy answers and hidden states, right on any causal LM; decoding is not
        warn(undecodable.removeprefix("warning: "))
    full_head = base.get_output_embeddings()
    dev = full_head.weight.device  # the heads train where the lm_head is
    if dev.type == "meta":
        raise FieldError("device_map", "offloaded", "{field} auto left the lm_head off every device (offloaded): "
                         "free a GPU or train without {field}")
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
    state = load_checkpoint(ckpt)
    if state is not None:
        heads.load_state_dict(state["heads"])
        opt.load_state_dict(state["opt"])
        step, history, progress = int(state["step"]), json.loads(state["history"]), float(state["progress"])
        g.set_state(state["rng"])  # the sampler's state: a resumed run draws the batches an unbroken one would
    # --time-budget: training ends with time for validation and saving left; the schedule (warm-up, emitted-token
    # phase, cosine) runs on the progress made, by steps or by time, whichever is further
    at = Budget(cfg.steps, deadline - max(5.0, 0.05 * budget) if deadline else None, progress).at

    N = hidden.shape[0]
    bar = tqdm(total=cfg.steps, initial=step, desc="train heads", unit="step", dynamic_ncols=True)
    autocast = torch.autocast(device_type=dev.type, dtype=torch.bfloat16)
    saved_at, s = None, at(step)
    while s < cfg.steps:
        idx = torch.randint(0, N, (cfg.batch_size,), generator=g).to(hidden.device)
        active = small_head is not None and s < cfg.active_steps
        lm_head = small_head if active else full_head
        h, y = hidden[idx].to(dev).float(), (small_targets if active else targets)[idx].to(dev)
        lr = cfg.lr * warmup_cosine(s, cfg.warmup, cfg.steps)
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
                save_checkpoint(ckpt, state)
                saved_at = time.time()
    bar.close()
    if step == 0 and start is None and not ckpt.is_file():
        warn(Note("untrained", "{field} left no time to train: the heads written are untrained", field="time_budget"))
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
