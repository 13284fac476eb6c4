"""`workbench train-heads --recipe medusa-2`: heads trained together with a LoRA-adapted backbone (paper §2.2.2).

Loss  L = L_LM + λ0 · Σ_k 0.8^k · CE(head k, token t+k+1)  on the base model's own greedy answers, where
L_LM = KL(original ‖ adapted) of the next-token distribution: the teacher is the same model with the adapter
switched off (peft's `disable_adapter()`), so the backbone learns to serve the heads without drifting from what it
said before, and no second copy of the model sits in memory. Medusa-1 can cache hidden states; here the backbone
changes, so every step runs it on tokens.

Outputs (`--out`): adapter/ (peft LoRA), heads/ (our format, pairs with the adapter), merged/ (the adapted
backbone merged, `save_pretrained`, with the heads in our format beside it: a model folder every command takes
as --model and --heads), medusa/ (Medusa's own layout: one model whose weights also hold `medusa_head.*`),
training.json and loss.jsonl (one line per logged step).
"""
from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from workbench import warn
from workbench.core.notes import FieldError
from workbench.core.io import run_lock
from workbench.runtime.generation import text_config
from workbench.runtime.heads import MedusaHeads, check_heads_fit, load_heads
from workbench.runtime.kvcache import undecodable_warning
from workbench.runtime.models import empty_model, load_base, model_label
from workbench.runtime.parallel import Shard, current_launch
from workbench.train.adapter import LORA_TARGETS, Medusa2, adapter_state, add_lora, lora_targets, medusa2_loss, write_outputs
from workbench.train.common import Budget, load_checkpoint, run_key, save_checkpoint, warmup_cosine
from workbench.train.distill import DistillConfig, batch_tensors, build_data, load_examples, part_infos
from workbench.train.evaluate import validate

WARMUPS = ("two-stage", "sine")


@dataclass
class Medusa2Config:
    prompts: list[str]
    num_heads: int = 4
    num_layers: int = 1
    tokens: int = 50_000            # self-distilled answer tokens to generate
    max_new_tokens: int = 128
    max_prompt_tokens: int = 384    # longer prompts are skipped (memory; the answers are what is trained)
    gen_batch: int = 32
    gen_dtype: str = "bfloat16"
    steps: int = 2000
    batch_size: int = 4             # sequences (prompt + answer) per step
    lr: float = 1e-4                # the adapter's learning rate (self-distillation: the paper's 1e-4)
    heads_lr: float | None = None   # default 4x lr
    weight_decay: float = 0.0
    warmup_steps: int = 20          # linear learning-rate warm-up, then cosine to 0
    lambda0: float = 0.01           # weight of the heads' loss (paper: ≈0.01 with self-distillation; 0.2 on SFT data)
    decay: float = 0.8              # λ_k = decay^k
    warmup: str = "two-stage"       # heads warm-up: start from Medusa-1 heads (--init), or a sine ramp of λ0
    ramp_steps: int = 0             # sine: steps over which λ0 rises (0 = a quarter of --steps)
    lora_r: int = 32
    lora_alpha: int = 16
    lora_dropout: float = 0.05
    lora_targets: tuple = LORA_TARGETS
    init: str | None = None         # Medusa-1 heads to start from (two-stage: required, the demo heads by default)
    amp: bool | None = None         # bf16 autocast for the forwards (teacher and student alike); None: on CUDA
                                    # only (a CPU without bf16 units runs it ~7x slower than fp32)
    seed: int = 0
    time_budget: float | None = None
    gen_share: float = 0.3          # with a time budget: generation stops starting batches after this share
    save_dtype: str = "float16"     # adapter and heads files (the merged backbone keeps the model's dtype)
    checkpoint_seconds: float = 60.0

    def __post_init__(self):
        """Every setting checked before any model loads: one line naming the flag."""
        if self.warmup not in WARMUPS:
            raise FieldError("warmup", "unknown", f"{{field}} {self.warmup}: use one of {', '.join(WARMUPS)}")
        for field in ("steps", "batch_size", "tokens", "max_new_tokens", "gen_batch", "num_heads", "num_layers",
                      "lora_r"):
            if getattr(self, field) < 1:
                raise FieldError(field, "below_one", f"{{field}} {getattr(self, field)}: must be at least 1")
        if not (self.lr > 0 and (self.heads_lr is None or self.heads_lr > 0)):
            raise FieldError("lr", "not_positive", f"{{field}} {self.lr:g} / {{also}} {self.heads_lr}: learning "
                             "rates must be > 0, e.g. 1e-4 and 4e-4", also="heads_lr")
        if not self.lambda0 >= 0 or not 0 < self.decay <= 1:
            raise FieldError("lambda0", "range", f"{{field}} {self.lambda0:g} / {{also}} {self.decay:g}: λ0 >= 0 "
                             "(e.g. 0.2) and λ_k = decay^k with decay in (0, 1] (e.g. 0.8)", also="decay")
        if not 0 <= self.lora_dropout < 1 or self.lora_alpha <= 0:
            raise FieldError("lora_dropout", "range", f"{{field}} {self.lora_dropout:g} / {{also}} "
                             f"{self.lora_alpha}: dropout in [0, 1) and alpha > 0 (e.g. 0.05 and 16)",
                             also="lora_alpha")
        if self.time_budget is not None and not self.time_budget > 0:
            raise FieldError("time_budget", "not_positive", f"{{field}} {self.time_budget:g}: give the seconds the "
                             "run may take, e.g. 3000")
        if not 0 < self.gen_share < 1:
            raise FieldError("gen_share", "range", f"{{field}} {self.gen_share:g}: a share of {{also}} in (0, 1), "
                             "e.g. 0.3", also="time_budget")
        if self.warmup_steps < 0 or self.ramp_steps < 0:
            raise FieldError("warmup_steps", "negative", "{field} and {also} must be >= 0", also="ramp_steps")

    @property
    def heads_learning_rate(self) -> float:
        return self.heads_lr if self.heads_lr is not None else 4 * self.lr


def lambda0_at(s: int, cfg: Medusa2Config) -> float:
    """two-stage: λ0 throughout (the heads were trained first, as Medusa-1); sine: λ0·sin(π/2 · s/ramp), so
    untrained heads do not pull the backbone around while they are still noise."""
    if cfg.warmup == "two-stage":
        return cfg.lambda0
    ramp = cfg.ramp_steps or max(1, cfg.steps // 4)
    return cfg.lambda0 * math.sin(0.5 * math.pi * min(1.0, s / ramp))


# ----------------------------------------------------------------------------------------------- train

def train_medusa2(work: Path, cfg: Medusa2Config, model_name: str | None, out: Path, device: str | None = None,
                  log_every: int = 10, stop_after: int | None = None) -> dict:
    """Generate (or reuse) the self-distilled answers in `work`, train, write `out`. Resumable: the checkpoint
    in `work` holds adapter, heads, optimizer, step and every random state, so a killed run picks up exactly
    where its last checkpoint stood. `stop_after`: end (with a checkpoint) after this many steps of this run."""
    t0 = time.time()
    launch = current_launch()
    with run_lock(work, "work", launch=launch):
        return _train(work, cfg, model_name, out, device, log_every, stop_after, launch, t0)


def _train(work, cfg, model_name, out, device, log_every, stop_after, launch, t0) -> dict:
    from accelerate import Accelerator

    deadline = t0 + cfg.time_budget if cfg.time_budget else None
    start = load_heads(cfg.init)[0] if cfg.init else None
    if start is not None and (start.num_heads, start.num_layers, start.tied) != (cfg.num_heads, cfg.num_layers, True):
        raise FieldError("init", "other_shape", f"{{field}} {cfg.init}: {start.num_heads} heads x "
                         f"{start.num_layers} layers{'' if start.tied else ' (untied)'}, but this run trains "
                         f"{cfg.num_heads} x {cfg.num_layers} tied heads: match {{also}} and {{also2}} to them",
                         also=("num_heads", "num_layers"))
    if cfg.warmup == "two-stage" and start is None:
        raise FieldError("warmup", "needs_init", "{field} two-stage starts from Medusa-1 heads: pass {also} HEADS "
                         "(train them first with {also2} medusa-1), or use {field} sine to train the heads from zero",
                         also=("init", "recipe"))
    skeleton = empty_model(model_name)  # what the model is made of, before any answer is generated
    lora_targets(skeleton, cfg)
    undecodable = undecodable_warning(skeleton, "the Medusa-2 model trains correctly")
    if undecodable and launch.rank == 0:  # as Medusa-1's heads: right on any causal LM; decoding it is not
        warn(undecodable.removeprefix("warning: "))
    work.mkdir(parents=True, exist_ok=True)
    data_cfg = DistillConfig(prompts=cfg.prompts, tokens=cfg.tokens, max_new_tokens=cfg.max_new_tokens,
                             gen_batch=cfg.gen_batch, gen_dtype=cfg.gen_dtype)
    with Shard(work, launch, work, "work") as shard:
        parts = build_data(work, data_cfg, model_name, device, launch,
                           t0 + cfg.gen_share * cfg.time_budget if cfg.time_budget else None)
        shard.finish()
    acc = Accelerator(cpu=device == "cpu")
    acc.wait_for_everyone()  # every process trains on every part
    parts = [p for p, _ in part_infos(work / "parts")]
    base, tok = load_base(model_name, str(acc.device), "float32")
    examples = load_examples(work / "parts", cfg.prompts, tok, cfg.max_prompt_tokens)
    if not examples:
        raise FieldError("time_budget", "no_data", "no training data: no answers were generated (a {field} too "
                         "short for one batch?) or every prompt is longer than {also}", also="max_prompt_tokens")
    # validation: every 20th example (never trained on), at most 64
    val = examples[19::20][:64]
    train = [e for i, e in enumerate(examples) if not (i % 20 == 19 and i // 20 < 64)]
    H, V = text_config(base).hidden_size, base.get_output_embeddings().weight.shape[0]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        heads = MedusaHeads(H, V, cfg.num_heads, cfg.num_layers, tied=True)
    if start is not None:
        start.vocab_size = start.vocab_size or V
        check_heads_fit(start, base)
        heads.load_state_dict(start.float().state_dict())
    model = Medusa2(add_lora(base, cfg), heads.to(acc.device))
    opt = torch.optim.AdamW([{"params": [p for p in model.peft.parameters() if p.requires_grad], "lr": cfg.lr},
                             {"params": list(model.heads.parameters()), "lr": cfg.heads_learning_rate}],
                            lr=cfg.lr, weight_decay=cfg.weight_decay)
    base_lrs = [cfg.lr, cfg.heads_learning_rate]
    # one checkpoint per (settings, data): a rerun resumes, other settings train afresh
    not_in_key = ("prompts", "tokens", "steps", "time_budget", "gen_share", "save_dtype", "checkpoint_seconds",
                  "gen_batch", "gen_dtype")
    ckpt = work / f"medusa2-{run_key(cfg, not_in_key, start, parts=[p.name for p in parts], world=launch.world)}.pt"
    log_path = ckpt.with_suffix(".loss.jsonl")
    step, progress = 0, 0.0
    g = torch.Generator().manual_seed(cfg.seed * 1000 + launch.rank)  # each process its own batches
    torch.manual_seed(cfg.seed + launch.rank)  # LoRA dropout
    state = load_checkpoint(ckpt)
    if state is not None:
        model.peft.load_state_dict(state["adapter"], strict=False)
        model.heads.load_state_dict(state["heads"])
        opt.load_state_dict(state["opt"])
        step, progress = int(state["step"]), float(state["progress"])
        g.set_state(state["rng"])
        torch.set_rng_state(state["torch_rng"])
    model, opt = acc.prepare(model, opt)
    inner: Medusa2 = acc.unwrap_model(model)
    # merging and saving left after training; the schedule runs on the progress made, by steps or by time
    schedule_step = Budget(cfg.steps, deadline - max(60.0, 0.08 * cfg.time_budget) if deadline else None, progress).at

    def save(s: int):
        state = {"adapter": adapter_state(inner.peft), "heads": inner.heads.state_dict(), "opt": opt.state_dict(),
                 "step": step, "progress": min(1.0, s / cfg.steps), "rng": g.get_state(),
                 "torch_rng": torch.get_rng_state()}
        if acc.is_main_process:
            save_checkpoint(ckpt, state)

    dev = acc.device
    amp = torch.autocast(device_type=dev.type, dtype=torch.bfloat16,
                         enabled=cfg.amp if cfg.amp is not None else dev.type == "cuda")
    bar = tqdm(total=cfg.steps, initial=step, desc="medusa-2", unit="step", dynamic_ncols=True,
               disable=not acc.is_main_process)
    s, saved_at, ran = schedule_step(step), time.time(), 0
    model.train()
    while s < cfg.steps and (stop_after is None or ran < stop_after):
        idx = torch.randint(0, len(train), (cfg.batch_size,), generator=g).tolist()
        ids, mask, rows, cols, targets = (t.to(dev) for t in batch_tensors([train[i] for i in idx], cfg.num_heads))
        f, lam = warmup_cosine(s, cfg.warmup_steps, cfg.steps), lambda0_at(s, cfg)  # both learning rates follow f
        for group, lr in zip(opt.param_groups, base_lrs):
            group["lr"] = lr * f
        with amp:
            teacher = inner.teacher_logits(ids, mask, rows, cols)
            logits, head_logits = model(ids, mask, rows, cols)
        loss, parts_ = medusa2_loss(logits, head_logits, teacher, targets, lam, cfg.decay)
        opt.zero_grad(set_to_none=True)
        acc.backward(loss)
        acc.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
        opt.step()
        step, ran = step + 1, ran + 1
        bar.update(1)
        s = schedule_step(step)
        end = s >= cfg.steps or (stop_after is not None and ran >= stop_after)
        if step % log_every == 0 or end:
            rec = {"step": step, "loss": round(loss.item(), 5), "kl": round(parts_["kl"].item(), 5),
                   "ce": [round(c, 4) for c in parts_["ce"].tolist()], "lambda0": round(lam, 5),
                   "lr": float(f"{cfg.lr * f:.3g}"), "seconds": round(time.time() - t0, 1)}
            bar.set_postfix(loss=f"{rec['loss']:.3f}", kl=f"{rec['kl']:.4f}", ce1=f"{rec['ce'][0]:.2f}")
            if acc.is_main_process:
                with open(log_path, "a") as fh:
                    fh.write(json.dumps(rec) + "\n")
        if end or time.time() - saved_at >= cfg.checkpoint_seconds:
            save(s)
            saved_at = time.time()
    bar.close()
    model.eval()
    if stop_after is not None and s < cfg.steps:
        return dict(trained=False, steps=step)
    if not acc.is_main_process:
        return dict(trained=False, steps=step, rank=launch.rank)
    summary = dict(recipe="medusa-2", model=model_label(model_name), steps=step, examples=len(train),
                   answer_tokens=sum(i["answer_tokens"] for _, i in part_infos(work / "parts")),
                   validation=validate(inner, val, cfg, dev) if val else {}, device=str(dev),
                   seconds_this_run=round(time.time() - t0, 1),
                   settings={k: v for k, v in asdict(cfg).items() if k != "prompts"} | {"prompts": len(cfg.prompts)},
                   loss_log=str(log_path))
    write_outputs(inner, tok, out, model_label(model_name), summary, getattr(torch, cfg.save_dtype))
    shutil.copyfile(log_path, out / "loss.jsonl") if log_path.is_file() else None
    return dict(summary, trained=True)
