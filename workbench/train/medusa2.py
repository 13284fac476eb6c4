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

import hashlib
import json
import math
import shutil
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from tqdm.auto import tqdm

from workbench import WorkbenchError
from workbench.calibrate.folder import head_accuracies, ranks_frame
from workbench.calibrate.run import head_ranks, holdout_split
from workbench.core.data import load_prompt_records
from workbench.core.io import WorkState, atomic_write, atomic_write_json, atomic_write_text, run_lock
from workbench.core.speed import measured_speedup, tokens_per_step
from workbench.decode.loop import medusa_generate, vanilla_generate
from workbench.runtime.engine import StepEngine, tree_setup
from workbench.runtime.generation import eos_ids, greedy_continuations, prepare_prompt, right_padded, text_config
from workbench.runtime.heads import MedusaHeads, check_heads_fit, heads_fingerprint, load_heads, save_heads
from workbench.runtime.kvcache import undecodable_warning
from workbench.runtime.models import empty_model, load_base, load_model_and_heads, model_label
from workbench.runtime.parallel import Shard, current_launch
from workbench.train.medusa1 import TrainConfig, build_data, part_infos, prompt_key, run_key

WARMUPS = ("two-stage", "sine")
# every linear layer of a Llama-style decoder, and the output projection (Medusa-2 adapts lm_head too)
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")


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
            raise WorkbenchError(f"--warmup {self.warmup}: use one of {', '.join(WARMUPS)}")
        for flag, v in (("--steps", self.steps), ("--batch-size", self.batch_size), ("--tokens", self.tokens),
                        ("--max-new-tokens", self.max_new_tokens), ("--gen-batch", self.gen_batch),
                        ("--num-heads", self.num_heads), ("--num-layers", self.num_layers), ("--lora-r", self.lora_r)):
            if v < 1:
                raise WorkbenchError(f"{flag} {v}: must be at least 1")
        if not (self.lr > 0 and (self.heads_lr is None or self.heads_lr > 0)):
            raise WorkbenchError(f"--lr {self.lr:g} / --heads-lr {self.heads_lr}: learning rates must be > 0, "
                                 "e.g. 1e-4 and 4e-4")
        if not self.lambda0 >= 0 or not 0 < self.decay <= 1:
            raise WorkbenchError(f"--lambda0 {self.lambda0:g} / --decay {self.decay:g}: λ0 >= 0 (e.g. 0.2) and "
                                 "λ_k = decay^k with decay in (0, 1] (e.g. 0.8)")
        if not 0 <= self.lora_dropout < 1 or self.lora_alpha <= 0:
            raise WorkbenchError(f"--lora-dropout {self.lora_dropout:g} / --lora-alpha {self.lora_alpha}: dropout "
                                 "in [0, 1) and alpha > 0 (e.g. 0.05 and 16)")
        if self.time_budget is not None and not self.time_budget > 0:
            raise WorkbenchError(f"--time-budget {self.time_budget:g}: give the seconds the run may take, e.g. 3000")
        if not 0 < self.gen_share < 1:
            raise WorkbenchError(f"--gen-share {self.gen_share:g}: a share of --time-budget in (0, 1), e.g. 0.3")
        if self.warmup_steps < 0 or self.ramp_steps < 0:
            raise WorkbenchError("--warmup-steps and --ramp-steps must be >= 0")

    @property
    def heads_learning_rate(self) -> float:
        return self.heads_lr if self.heads_lr is not None else 4 * self.lr


# ----------------------------------------------------------------------------------------------- data

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


# ----------------------------------------------------------------------------------------------- model, loss

class Medusa2(nn.Module):
    """The adapted backbone and the heads as one module, so a data-parallel wrapper sees every trained
    parameter in one forward. `peft` wraps the causal LM (LoRA layers injected in place)."""
    def __init__(self, peft_model, heads: MedusaHeads):
        super().__init__()
        self.peft, self.heads = peft_model, heads

    @property
    def causal(self):
        return self.peft.get_base_model()  # the HF causal LM, LoRA layers inside

    def forward(self, ids, mask, rows, cols):
        """-> (next-token logits [M, V], head logits [K, M, V]) at the answer positions."""
        lm = self.causal
        hidden = lm.base_model(input_ids=ids, attention_mask=mask).last_hidden_state[rows, cols]  # [M, H]
        lm_head = lm.get_output_embeddings()
        return lm_head(hidden), self.heads(hidden, lm_head)

    @torch.no_grad()
    def teacher_logits(self, ids, mask, rows, cols):
        """The original model's logits [M, V]: the same weights with the adapter switched off."""
        with self.peft.disable_adapter():
            lm = self.causal
            hidden = lm.base_model(input_ids=ids, attention_mask=mask).last_hidden_state[rows, cols]
            return lm.get_output_embeddings()(hidden)


def medusa2_loss(logits, head_logits, teacher, targets, lambda0: float, decay: float):
    """logits [M, V], head_logits [K, M, V], teacher [M, V], targets [M, K] ->
    (L = KL(teacher ‖ student) + λ0 Σ_k decay^k CE_k, dict of the parts as tensors).

    KL is the mean over positions of Σ_v p_T (log p_T − log p_S); CE_k the mean over positions where head k has a
    target (k = 1..K)."""
    log_s = F.log_softmax(logits.float(), -1)
    log_t = F.log_softmax(teacher.float(), -1)
    kl = (log_t.exp() * (log_t - log_s)).sum(-1).mean()
    ces = torch.stack([F.cross_entropy(head_logits[k].float(), targets[:, k], ignore_index=-100)
                       if (targets[:, k] != -100).any() else head_logits.new_zeros(()).float()
                       for k in range(head_logits.shape[0])])                        # [K]
    weights = torch.tensor([decay ** (k + 1) for k in range(len(ces))], device=ces.device)
    heads_loss = (weights * ces).sum()
    return kl + lambda0 * heads_loss, dict(kl=kl.detach(), ce=ces.detach(), heads=heads_loss.detach())


def lr_factor(s: int, cfg: Medusa2Config) -> float:
    """Linear warm-up, then cosine to 0 at --steps (both learning rates follow it)."""
    if s < cfg.warmup_steps:
        return (s + 1) / cfg.warmup_steps
    p = (s - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return 0.5 * (1 + math.cos(math.pi * min(1.0, p)))


def lambda0_at(s: int, cfg: Medusa2Config) -> float:
    """two-stage: λ0 throughout (the heads were trained first, as Medusa-1); sine: λ0·sin(π/2 · s/ramp), so
    untrained heads do not pull the backbone around while they are still noise."""
    if cfg.warmup == "two-stage":
        return cfg.lambda0
    ramp = cfg.ramp_steps or max(1, cfg.steps // 4)
    return cfg.lambda0 * math.sin(0.5 * math.pi * min(1.0, s / ramp))


def lora_targets(model, cfg: Medusa2Config) -> list[str]:
    """The targeted linear layers `model` has (a loaded or an empty_model). A model with none of the decoder's
    projections (Mamba: in_proj, x_proj, ...) is refused: LoRA on the output projection alone leaves the backbone
    as it was, which is not Medusa-2."""
    names = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    targets = sorted(set(cfg.lora_targets) & names)
    decoder = [t for t in cfg.lora_targets if t != "lm_head"]
    if not set(targets) & set(decoder):
        own = sorted(names - {"lm_head"})
        raise WorkbenchError(f"--recipe medusa-2: {type(model).__name__} has none of the decoder projections LoRA "
                             f"adapts ({', '.join(decoder)}; it has {', '.join(own[:8]) or 'no linear layers'}), so "
                             "its backbone would stay as it is: train heads only, with --recipe medusa-1")
    return targets


def add_lora(model, cfg: Medusa2Config):
    """peft LoRA on every targeted linear layer present (the output projection included). The model's own
    lm_head may be tied to its input embedding: LoRA adds its delta beside the frozen shared weight, so the
    embedding is untouched while training; merging unties them first (`merged_model`)."""
    from peft import LoraConfig, get_peft_model

    targets = lora_targets(model, cfg)
    with torch.random.fork_rng(devices=[]):  # LoRA A's random init from --seed: a rerun trains the same adapter
        torch.manual_seed(cfg.seed)
        lora = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                          target_modules=targets, bias="none", task_type="CAUSAL_LM")
        with warnings.catch_warnings():  # the tied-lm_head warning: handled by merged_model; peft 0.21 reads
            # transformers' deprecated `is_gradient_checkpointing` itself (not a call of ours to change)
            warnings.filterwarnings("ignore", message=".*tie_word_embeddings.*")
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            return get_peft_model(model, lora)


def adapter_state(peft_model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in peft_model.named_parameters() if p.requires_grad}


def merged_model(peft_model):
    """The adapted backbone as a plain HF model (LoRA merged into the weights). A tied lm_head is untied first
    (its own copy of the weight, tie_word_embeddings off), else merging the output projection's delta would also
    change the input embedding it shares."""
    lm = peft_model.get_base_model()
    out = lm.get_output_embeddings()
    base_layer = getattr(out, "base_layer", out)
    if base_layer.weight is lm.get_input_embeddings().weight:
        base_layer.weight = nn.Parameter(base_layer.weight.detach().clone(), requires_grad=False)
        for c in {id(lm.config): lm.config, id(text_config(lm)): text_config(lm)}.values():
            c.tie_word_embeddings = False
    return peft_model.merge_and_unload()


# ----------------------------------------------------------------------------------------------- outputs

def _atomic_folder(folder: Path, write) -> Path:
    """write(tmp) fills a fresh folder that then replaces `folder` (a kill leaves the old one whole)."""
    tmp = folder.with_name(f".{folder.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write(tmp)
    old = folder.with_name(f".{folder.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if folder.exists():
        folder.rename(old)
    tmp.rename(folder)
    shutil.rmtree(old, ignore_errors=True)
    return folder


def write_outputs(model: Medusa2, tok, out: Path, label: str, summary: dict, save_dtype: torch.dtype) -> None:
    """adapter/, heads/, merged/ (HF model + our heads), medusa/ (Medusa's layout), training.json."""
    out.mkdir(parents=True, exist_ok=True)
    heads = model.heads.cpu().float()

    def adapter(tmp):
        # the frozen (tied) output projection is the base model's own: only the LoRA tensors go in the adapter
        model.peft.save_pretrained(str(tmp), save_embedding_layers=False)
        from safetensors.torch import load_file, save_file  # the fp16 copy: half the size, as the heads
        f = tmp / "adapter_model.safetensors"
        save_file({k: v.to(save_dtype) for k, v in load_file(str(f)).items()}, str(f), metadata={"format": "pt"})
    _atomic_folder(out / "adapter", adapter)
    _atomic_folder(out / "heads", lambda tmp: save_heads(heads, tmp, label, extra={"training": summary,
                                                                                  "adapter": "../adapter"},
                                                         dtype=save_dtype))
    merged = merged_model(model.peft).cpu()
    medusa_cfg = dict(medusa_num_heads=heads.num_heads, medusa_num_layers=heads.num_layers)

    def ours(tmp):
        save_heads(heads, tmp, str(out / "merged"), dtype=save_dtype)  # medusa_lm_head.safetensors (+ config)
        for k, v in medusa_cfg.items():  # the HF config.json replaces the heads' one: it carries their keys
            setattr(merged.config, k, v)
        merged.config.medusa_format = 2
        merged.save_pretrained(str(tmp))
        if tok is not None:
            tok.save_pretrained(str(tmp))
    _atomic_folder(out / "merged", ours)

    def medusa(tmp):
        from safetensors.torch import load_file, save_file
        merged.save_pretrained(str(tmp))
        if tok is not None:
            tok.save_pretrained(str(tmp))
        f = tmp / "model.safetensors"
        if not f.is_file():
            raise WorkbenchError(f"{tmp}: save_pretrained wrote sharded weights; Medusa's layout is written for a "
                                 "single model.safetensors only")
        sd = load_file(str(f))
        lm_w = merged.get_output_embeddings().weight.detach().cpu()
        # Medusa's heads carry their own lm_head ([V, H] each, = the merged output projection)
        for k, v in heads.state_dict().items():
            sd[f"medusa_head.{k}"] = v.to(lm_w.dtype).contiguous()
        for h in range(heads.num_heads):
            sd[f"medusa_head.{h}.{heads.num_layers}.weight"] = lm_w.clone()
        save_file(sd, str(f), metadata={"format": "pt"})
    _atomic_folder(out / "medusa", medusa)
    atomic_write_json(out / "training.json", summary, "--out")


# ----------------------------------------------------------------------------------------------- train

def train_medusa2(work: Path, cfg: Medusa2Config, model_name: str | None, out: Path, device: str | None = None,
                  log_every: int = 10, stop_after: int | None = None) -> dict:
    """Generate (or reuse) the self-distilled answers in `work`, train, write `out`. Resumable: the checkpoint
    in `work` holds adapter, heads, optimizer, step and every random state, so a killed run picks up exactly
    where its last checkpoint stood. `stop_after`: end (with a checkpoint) after this many steps of this run."""
    t0 = time.time()
    launch = current_launch()
    with run_lock(work, "--work", launch=launch):
        return _train(work, cfg, model_name, out, device, log_every, stop_after, launch, t0)


def _train(work, cfg, model_name, out, device, log_every, stop_after, launch, t0) -> dict:
    from accelerate import Accelerator

    deadline = t0 + cfg.time_budget if cfg.time_budget else None
    start = load_heads(cfg.init)[0] if cfg.init else None
    if start is not None and (start.num_heads, start.num_layers, start.tied) != (cfg.num_heads, cfg.num_layers, True):
        raise WorkbenchError(f"--init {cfg.init}: {start.num_heads} heads x {start.num_layers} layers"
                             f"{'' if start.tied else ' (untied)'}, but this run trains {cfg.num_heads} x "
                             f"{cfg.num_layers} tied heads: match --num-heads and --num-layers to them")
    if cfg.warmup == "two-stage" and start is None:
        raise WorkbenchError("--warmup two-stage starts from Medusa-1 heads: pass --init HEADS (train them first "
                             "with --recipe medusa-1), or use --warmup sine to train the heads from zero")
    skeleton = empty_model(model_name)  # what the model is made of, before any answer is generated
    lora_targets(skeleton, cfg)
    undecodable = undecodable_warning(skeleton, "the Medusa-2 model trains correctly")
    if undecodable and launch.rank == 0:  # as Medusa-1's heads: right on any causal LM; decoding it is not
        print(undecodable, file=sys.stderr)
    work.mkdir(parents=True, exist_ok=True)
    data_cfg = TrainConfig(prompts=cfg.prompts, tokens=cfg.tokens, max_new_tokens=cfg.max_new_tokens,
                           gen_batch=cfg.gen_batch, gen_dtype=cfg.gen_dtype)
    with Shard(work, launch, f"--work {work}") as shard:
        parts = build_data(work, data_cfg, model_name, device, launch,
                           t0 + cfg.gen_share * cfg.time_budget if cfg.time_budget else None)
        shard.finish()
    acc = Accelerator(cpu=device == "cpu")
    acc.wait_for_everyone()  # every process trains on every part
    parts = [p for p, _ in part_infos(work / "parts")]
    base, tok = load_base(model_name, str(acc.device), "float32")
    examples = load_examples(work / "parts", cfg.prompts, tok, cfg.max_prompt_tokens)
    if not examples:
        raise WorkbenchError("no training data: no answers were generated (a --time-budget too short for one "
                             "batch?) or every prompt is longer than --max-prompt-tokens")
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
    if ckpt.is_file():
        state = torch.load(ckpt, weights_only=True)
        model.peft.load_state_dict(state["adapter"], strict=False)
        model.heads.load_state_dict(state["heads"])
        opt.load_state_dict(state["opt"])
        step, progress = int(state["step"]), float(state["progress"])
        g.set_state(state["rng"])
        torch.set_rng_state(state["torch_rng"])
    model, opt = acc.prepare(model, opt)
    inner: Medusa2 = acc.unwrap_model(model)
    train_stop = deadline - max(60.0, 0.08 * cfg.time_budget) if deadline else None  # merging + saving left
    clock0, progress0 = time.time(), progress

    def schedule_step(step: int) -> int:
        """`step`, or with a time budget the step the time spent stands for (the schedule compressed to it)."""
        if train_stop is None:
            return step
        spent = (time.time() - clock0) / max(train_stop - clock0, 1e-9)
        return max(step, math.ceil(cfg.steps * min(1.0, max(step / cfg.steps, progress0 + (1 - progress0) * spent))))

    def save(s: int):
        state = {"adapter": adapter_state(inner.peft), "heads": inner.heads.state_dict(), "opt": opt.state_dict(),
                 "step": step, "progress": min(1.0, s / cfg.steps), "rng": g.get_state(),
                 "torch_rng": torch.get_rng_state()}
        if acc.is_main_process:
            atomic_write(ckpt, lambda tmp: torch.save(state, tmp))

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
        f, lam = lr_factor(s, cfg), lambda0_at(s, cfg)
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


@torch.no_grad()
def validate(model: Medusa2, examples, cfg: Medusa2Config, dev) -> dict:
    """Held-out self-distilled answers (teacher-forced): KL to the original, top-1 agreement with it, and each
    head's top-1 (quick figures for the training log; `workbench eval-heads` is the evaluation)."""
    kl, agree, n, hits, counts = 0.0, 0, 0, torch.zeros(cfg.num_heads), torch.zeros(cfg.num_heads)
    for i in range(0, len(examples), 8):
        ids, mask, rows, cols, targets = (t.to(dev) for t in batch_tensors(examples[i:i + 8], cfg.num_heads))
        teacher = model.teacher_logits(ids, mask, rows, cols).float()
        logits, head_logits = model(ids, mask, rows, cols)
        log_s, log_t = F.log_softmax(logits.float(), -1), F.log_softmax(teacher, -1)
        kl += float((log_t.exp() * (log_t - log_s)).sum())
        agree += int((logits.argmax(-1) == teacher.argmax(-1)).sum())
        n += logits.shape[0]
        for k in range(cfg.num_heads):
            m = targets[:, k] != -100
            hits[k] += int((head_logits[k].argmax(-1)[m] == targets[m, k]).sum())
            counts[k] += int(m.sum())
    return dict(positions=n, kl=round(kl / n, 5), top1_agreement=round(agree / n, 4),
                **{f"head_{k + 1}_top1": round(float(hits[k] / counts[k]), 4) for k in range(cfg.num_heads)
                   if counts[k]})


# ----------------------------------------------------------------------------------------------- evaluate

def heldout_records(prompts: str, holdout: float, limit: int | None) -> list[tuple[str, str]]:
    """The held-out prompts of a set, as `workbench calibrate` splits it (never fitted on, never trained on)."""
    records = load_prompt_records(prompts)
    held = holdout_split([pid for pid, _ in records], holdout)
    return [r for r in records if r[0] in held][:limit]


def topk_accuracies(model, heads, prompts, conts, topk: int) -> list[list[float]]:
    """[K][topk]: head k's top-1..top-topk accuracy on teacher-forced answers (the calibration's own measure)."""
    ranks, _ = head_ranks(model, heads, prompts, conts, topk)
    acc, _ = head_accuracies(ranks_frame([str(i) for i in range(len(ranks))], ranks, heads.num_heads), topk)
    return [[round(float(x), 4) for x in row] for row in acc.cumsum(1)]


@torch.no_grad()
def backbone_drift(original, adapted, prompts, conts, batch: int = 8) -> dict:
    """Teacher-forced on the original's own greedy answers: share of positions where the adapted model's top-1
    equals the original's, mean KL(original ‖ adapted), and the perplexity of those answers under each model."""
    agree = kl = nll_o = nll_a = n = 0.0
    for i in range(0, len(prompts), batch):
        ex = list(zip(prompts[i:i + batch], conts[i:i + batch]))
        ids, mask, rows, cols, _ = batch_tensors(ex, 1)
        tgt = torch.tensor([t for _, c in ex for t in c])
        lo = original(input_ids=ids.to(original.device), attention_mask=mask.to(original.device)).logits[rows, cols]
        la = adapted(input_ids=ids.to(adapted.device), attention_mask=mask.to(adapted.device)).logits[rows, cols]
        lo, la = F.log_softmax(lo.float().cpu(), -1), F.log_softmax(la.float().cpu(), -1)   # [M, V]
        agree += float((lo.argmax(-1) == la.argmax(-1)).sum())
        kl += float((lo.exp() * (lo - la)).sum())
        nll_o -= float(lo.gather(1, tgt[:, None]).sum())
        nll_a -= float(la.gather(1, tgt[:, None]).sum())
        n += len(tgt)
    ppl_o, ppl_a = math.exp(nll_o / n), math.exp(nll_a / n)
    return dict(positions=int(n), top1_agreement=round(agree / n, 4), mean_kl=round(kl / n, 5),
                perplexity_original=round(ppl_o, 4), perplexity_adapted=round(ppl_a, 4),
                perplexity_ratio=round(ppl_a / ppl_o, 4))


def live_decode(model, heads, tok, prompts, tree, max_new_tokens: int) -> dict:
    """Medusa and plain greedy decoding of each prompt (batch 1, one engine): tokens/step, speedup, and whether
    Medusa's output equals greedy's (greedy acceptance is lossless)."""
    engine, buf = StepEngine(model), tree_setup(tree, model, heads.num_heads)
    vanilla_generate(model, tok, prompts[0], 2, engine=engine)  # warm-up, outside the timed runs
    med = [medusa_generate(model, heads, tok, p, buf, max_new_tokens, engine=engine) for p in prompts]
    van = [vanilla_generate(model, tok, p, max_new_tokens, engine=engine) for p in prompts]
    return dict(tokens_per_step=round(tokens_per_step(med), 4),
                speedup=round(measured_speedup(med, van), 4),
                identical_to_greedy=round(sum(m.token_ids == v.token_ids for m, v in zip(med, van)) / len(med), 4))


def evaluate_medusa2(medusa2: str, model: str | None = None, heads: str | None = None, prompts: str = "alpaca-eval",
                     holdout: float = 0.2, limit: int | None = 32, max_new_tokens: int = 64, topk: int = 5,
                     tree: str = "mc_sim_7b_63", live: int | None = None, device: str | None = None, batch: int = 8,
                     work=None) -> dict:
    """Medusa-1 (`model` + `heads`) against Medusa-2 (the merged folder `medusa2`, heads inside) on held-out
    prompts: per-head top-1..top-k (each head set on its own backbone's greedy answers: what its decoder
    verifies), the backbone's drift from the original, greedy-output identity, and live tokens/step and speedup
    with the same tree on the first `live` prompts (None: all, 0: none).

    Resumable: each phase (each backbone's greedy answers, each head set's accuracies, the drift, each live
    decoding) is kept in the io.WorkState beside `work` (the output file) when it ends; a killed run rerun the
    same redoes only the unfinished phases. Only the timing fields differ from an unbroken run's result:
    live_medusa1.speedup and live_medusa2.speedup (measured; the rest is computed from greedy fp32 decoding)."""
    records = heldout_records(prompts, holdout, limit)
    if not records:
        raise WorkbenchError(f"--prompts {prompts}: no held-out prompts (raise --holdout or --limit)")
    orig, tok, h1 = load_model_and_heads(model, heads, device, "float32")
    m2, tok2, h2 = load_model_and_heads(medusa2, medusa2, device, "float32")
    undecodable = undecodable_warning(orig, "head accuracy and backbone drift are measured correctly (live "
                                            "decoding skipped)")
    if undecodable:  # as calibrate: the measurements hold on any causal LM; decoding does not
        print(undecodable, file=sys.stderr)
        live = 0
    if tok2 is None or tok2.get_vocab() != tok.get_vocab():
        raise WorkbenchError(f"--medusa2 {medusa2}: its tokenizer differs from the base model's (a Medusa-2 folder "
                             "of another model?)")
    encoded = [prepare_prompt(tok, text) for _, text in records]
    stop = sorted(eos_ids(orig, tok))
    state = WorkState(work, dict(command="eval-heads", model=model_label(model), heads=heads_fingerprint(h1),
                                 medusa2=str(Path(medusa2).resolve()), medusa2_heads=heads_fingerprint(h2),
                                 prompts=hashlib.sha256(json.dumps(encoded).encode()).hexdigest(), topk=topk,
                                 tree=tree, live=live, max_new_tokens=max_new_tokens, batch=batch,
                                 device=str(orig.device)))

    def answers(m):
        out = []
        for i in range(0, len(encoded), batch):
            out += greedy_continuations(m, encoded[i:i + batch], max_new_tokens, stop, tok.pad_token_id)
        return out
    conts_o = state.piece("answers-original", lambda: answers(orig))
    conts_m = state.piece("answers-medusa2", lambda: answers(m2))
    result = dict(prompts=prompts, holdout=holdout, num_prompts=len(records), max_new_tokens=max_new_tokens,
                  model=model_label(model), medusa1_heads=str(heads or "demo heads"), medusa2=str(medusa2),
                  medusa1_topk=state.piece("medusa1-topk", lambda: topk_accuracies(orig, h1, encoded, conts_o, topk)),
                  medusa2_topk=state.piece("medusa2-topk", lambda: topk_accuracies(m2, h2, encoded, conts_m, topk)),
                  drift=state.piece("drift", lambda: backbone_drift(orig, m2, encoded, conts_o, batch)),
                  greedy_identity=round(sum(a == b for a, b in zip(conts_o, conts_m)) / len(records), 4))
    if live is None or live > 0:
        result["tree"], result["live_prompts"] = tree, len(encoded[:live])
        result["live_medusa1"] = state.piece("live-medusa1", lambda: live_decode(orig, h1, tok, encoded[:live], tree,
                                                                                 max_new_tokens))
        result["live_medusa2"] = state.piece("live-medusa2", lambda: live_decode(m2, h2, tok, encoded[:live], tree,
                                                                                 max_new_tokens))
        result["tokens_per_step_ratio"] = round(result["live_medusa2"]["tokens_per_step"]
                                                / result["live_medusa1"]["tokens_per_step"], 4)
    return result


def eval_table(r: dict) -> str:
    """The evaluation as Markdown: per-head top-k side by side, then drift and live decoding."""
    K, topk = len(r["medusa1_topk"]), len(r["medusa1_topk"][0])
    lines = ["| head | " + " | ".join(f"M-1 top-{j + 1} | M-2 top-{j + 1}" for j in range(topk)) + " |",
             "|---|" + "---|---|" * topk]
    for k in range(K):
        lines.append(f"| {k + 1} | " + " | ".join(f"{r['medusa1_topk'][k][j]:.3f} | {r['medusa2_topk'][k][j]:.3f}"
                                                  for j in range(topk)) + " |")
    d = r["drift"]
    lines += ["", "| backbone drift (teacher-forced on the original's greedy answers) | |", "|---|---|",
              f"| positions | {d['positions']} |", f"| top-1 agreement with the original | {d['top1_agreement']:.4f} |",
              f"| mean KL(original ‖ Medusa-2) | {d['mean_kl']:.5f} |",
              f"| perplexity of the original's answers: original / Medusa-2 | {d['perplexity_original']:.4f} / "
              f"{d['perplexity_adapted']:.4f} (x{d['perplexity_ratio']:.4f}) |",
              f"| greedy output identical at {r['max_new_tokens']} tokens | {r['greedy_identity']:.3f} |"]
    if "live_medusa1" in r:
        a, b = r["live_medusa1"], r["live_medusa2"]
        lines += ["", f"| live, tree `{r['tree']}`, batch 1, {r['live_prompts']} prompts | Medusa-1 | Medusa-2 |", "|---|---|---|",
                  f"| tokens/step | {a['tokens_per_step']:.3f} | {b['tokens_per_step']:.3f} (x{r['tokens_per_step_ratio']:.3f}) |",
                  f"| speedup over its own greedy | {a['speedup']:.3f} | {b['speedup']:.3f} |",
                  f"| Medusa output = greedy | {a['identical_to_greedy']:.3f} | {b['identical_to_greedy']:.3f} |"]
    return "\n".join(lines) + "\n"
