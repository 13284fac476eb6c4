"""The Medusa-2 model medusa2.py trains: the backbone with a LoRA adapter and the heads as one module, its loss, the
adapter added and merged back, and the run's outputs written: adapter/ (peft LoRA), heads/ (our format, pairs with the adapter), merged/ (the adapted backbone
merged, `save_pretrained`, with the heads in our format beside it: a model folder every command takes as --model
and --heads), medusa/ (Medusa's own layout: one model whose weights also hold `medusa_head.*`), training.json.
"""
from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from workbench import WorkbenchError
from workbench.core.notes import FieldError
from workbench.core.io import atomic_write_json
from workbench.runtime.generation import text_config
from workbench.runtime.heads import MedusaHeads, save_heads
from workbench.train.common import head_losses, heads_loss

# ----------------------------------------------------------------------------------------------- model, loss

# every linear layer of a Llama-style decoder, and the output projection (Medusa-2 adapts lm_head too)
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")


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


def kl_terms(log_t, log_s):
    """KL(teacher ‖ student) at each position of next-token log-probs [..., V]: Σ_v p_T (log p_T − log p_S)."""
    return (log_t.exp() * (log_t - log_s)).sum(-1)


def medusa2_loss(logits, head_logits, teacher, targets, lambda0: float, decay: float):
    """logits [M, V], head_logits [K, M, V], teacher [M, V], targets [M, K] ->
    (L = KL(teacher ‖ student) + λ0 Σ_k decay^k CE_k, dict of the parts as tensors).

    KL is the mean over positions of Σ_v p_T (log p_T − log p_S); CE_k the mean over positions where head k has a
    target (k = 1..K)."""
    log_s = F.log_softmax(logits.float(), -1)
    log_t = F.log_softmax(teacher.float(), -1)
    kl = kl_terms(log_t, log_s).mean()
    ces = head_losses(head_logits, targets)                                      # [K]
    heads = heads_loss(ces, decay)
    return kl + lambda0 * heads, dict(kl=kl.detach(), ce=ces.detach(), heads=heads.detach())


def lora_targets(model, cfg) -> list[str]:
    """The targeted linear layers `model` has (a loaded or an empty_model). A model with none of the decoder's
    projections (Mamba: in_proj, x_proj, ...) is refused: LoRA on the output projection alone leaves the backbone
    as it was, which is not Medusa-2."""
    names = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    targets = sorted(set(cfg.lora_targets) & names)
    decoder = [t for t in cfg.lora_targets if t != "lm_head"]
    if not set(targets) & set(decoder):
        own = sorted(names - {"lm_head"})
        raise FieldError("recipe", "no_lora_layers", f"{{field}} medusa-2: {type(model).__name__} has none of the "
                         f"decoder projections LoRA adapts ({', '.join(decoder)}; it has "
                         f"{', '.join(own[:8]) or 'no linear layers'}), so its backbone would stay as it is: train "
                         "heads only, with {field} medusa-1")
    return targets


def add_lora(model, cfg):
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


def write_outputs(model, tok, out: Path, label: str, summary: dict, save_dtype: torch.dtype) -> None:
    """adapter/, heads/, merged/ (HF model + our heads), medusa/ (Medusa's layout), training.json of a trained
    `Medusa2` `model`."""
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
    atomic_write_json(out / "training.json", summary, "out")
