"""Generic batched generation helpers on any HF causal LM: prompt tokens, stop tokens, greedy answers, hidden states.

Low level on purpose (imports nothing else from the workbench but the error type): decoding, calibration and
head training all need the same prompt tokens, stop tokens and greedy answers, and none of them should have to
import another to get them.
"""
from __future__ import annotations

import torch
from transformers import GenerationConfig

from workbench import WorkbenchError
from workbench.core.notes import FieldError


# ----------------------------------------------------------------------------------------------- model facts

def text_config(model):
    """The language model's config (multimodal models nest it; plain ones are their own)."""
    return model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config


def context_length(model) -> int | None:
    return getattr(text_config(model), "max_position_embeddings", None)


# ----------------------------------------------------------------------------------------------- prompts, stops

def prepare_prompt(tokenizer, text: str, raw: bool = False) -> list[int]:
    """Token ids for a user message: through the chat template (what instruction-tuned heads were trained on)
    unless raw."""
    if raw:
        ids = tokenizer(text).input_ids
    else:
        if not getattr(tokenizer, "chat_template", None):
            raise FieldError("raw", "no_template", "the tokenizer has no chat template: pass {field} to use the "
                             "prompt text as-is")
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                 tokenize=False)
        ids = tokenizer(rendered, add_special_tokens=False).input_ids
    if not ids:
        raise WorkbenchError("the prompt is empty after tokenisation: give some text")
    return list(ids)


def eos_ids(model, tokenizer=None, eos_token_id=None) -> set[int]:
    """Stop tokens: explicit, else the generation config's (what `generate` stops at), else the tokenizer's."""
    eos = eos_token_id
    if eos is None:
        eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None and tokenizer is not None:
        eos = tokenizer.eos_token_id
    if eos is None:
        return set()
    return {int(e) for e in (eos if isinstance(eos, (list, tuple, set)) else [eos])}


# ----------------------------------------------------------------------------------------------- batched answers

def greedy_continuations(model, prompts: list[list[int]], max_new_tokens: int, stop_ids: list[int],
                         pad_id: int, return_hidden: bool = False):
    """The base model's greedy answers, batched with left padding; each ends at its first stop token (kept).

    With return_hidden, also each answer's last hidden states [N, H], position t being the state whose base
    logits chose c[t]: captured from the very forwards that generated the tokens (a hook on the decoder), so no
    second pass over the sequences is needed.
    """
    B, P = len(prompts), max(map(len, prompts))
    ids = torch.full((B, P), pad_id, dtype=torch.long)
    mask = torch.zeros((B, P), dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, P - len(p):] = torch.tensor(p)
        mask[b, P - len(p):] = 1
    cfg = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                           eos_token_id=stop_ids or None, pad_token_id=pad_id)
    steps = []  # [B, H] per generation step
    hook = model.base_model.register_forward_hook(
        lambda mod, args, out: steps.append(out.last_hidden_state[:, -1].clone())) if return_hidden else None
    try:
        with torch.no_grad():
            out = model.generate(input_ids=ids.to(model.device), attention_mask=mask.to(model.device),
                                 generation_config=cfg)
    finally:
        if hook is not None:
            hook.remove()
    conts = []
    stops = set(stop_ids)
    for row in out[:, P:].tolist():
        end = next((i + 1 for i, tok in enumerate(row) if tok in stops), len(row))
        conts.append(row[:end])
    if not return_hidden:
        return conts
    hidden = torch.stack(steps[:max(map(len, conts))], dim=1)  # [B, T, H]
    return conts, [hidden[b, :len(c)] for b, c in enumerate(conts)]


def right_padded(seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """ids and attention mask [B, L] with the pads at the end: causal attention never lets a real token see them,
    so positions need no adjusting (left padding, as generate uses, does)."""
    L = max(map(len, seqs))
    ids = torch.zeros((len(seqs), L), dtype=torch.long)
    mask = torch.zeros((len(seqs), L), dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, :len(s)], mask[b, :len(s)] = torch.tensor(s), 1
    return ids, mask


def teacher_forced_hidden(model, prompts, conts) -> torch.Tensor:
    """Last hidden state [M, H] at every position t of every continuation (flat, prompt by prompt): the state
    just before c[t], whose base logits predict c[t]. One forward over prompt + continuation, right-padded."""
    dev = model.device
    ids, mask = right_padded([p + c for p, c in zip(prompts, conts)])
    hidden = model.base_model(input_ids=ids.to(dev), attention_mask=mask.to(dev)).last_hidden_state  # [B, L, H]
    rows = [b for b, c in enumerate(conts) for _ in c]
    cols = [len(p) - 1 + t for p, c in zip(prompts, conts) for t in range(len(c))]
    at = hidden.device  # the last layer's, which is not the input's for a model spread across devices
    return hidden[torch.tensor(rows, device=at), torch.tensor(cols, device=at)]  # [M, H]
