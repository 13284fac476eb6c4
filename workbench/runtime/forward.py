"""Calls into any HF decoder-only model: its inner decoder on a KV cache, the fp32 lm_head path and the heads'
top-k. No modelling code is copied: the model's own attention reads the 4-D masks built in treemask.py."""
from __future__ import annotations

import inspect
import time
from typing import Callable

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache

from workbench import WorkbenchError
from workbench.core.notes import FieldError
from workbench.runtime.generation import text_config

# propose(hidden [B, H], each sequence's tokens so far incl. its root: list of B lists) -> LongTensor [B, depth, topk]
Proposer = Callable[[torch.Tensor, list], torch.Tensor]


def clock(device: torch.device) -> float:
    """Seconds now, after the device's queued work (CUDA runs asynchronously: a step is timed when it is done)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _decoder(model):
    """The inner transformer (hidden states, no lm_head): logits are then computed only for rows we use."""
    dec = model.get_decoder() if hasattr(model, "get_decoder") else None
    if dec is None or dec is model:
        raise WorkbenchError(f"{type(model).__name__}: cannot find its inner decoder (get_decoder); "
                             "only decoder-only causal LMs with an lm_head are supported")
    return dec


_CACHE_KW: dict[type, str] = {}  # decoder class -> the name of its cache argument


def cache_kwarg(model) -> str:
    """The decoder's keyword for the KV cache: transformers 5.x renamed `past_key_values` to `cache` (the old name
    warns and goes in 5.40); a release that only knows the old name gets it. Looked up once per class, outside
    any compiled region (the step reads the dict)."""
    dec = type(_decoder(model))
    if dec not in _CACHE_KW:
        _CACHE_KW[dec] = "cache" if "cache" in inspect.signature(dec.forward).parameters else "past_key_values"
    return _CACHE_KW[dec]


def forward(model, input_ids: torch.Tensor, mask: torch.Tensor | None, position_ids: torch.Tensor | None,
            cache: Cache) -> torch.Tensor:
    """The inner decoder on `cache` -> hidden [B, T, H] (no lm_head: logits only for the rows we use)."""
    dec = _decoder(model)
    return dec(input_ids=input_ids, attention_mask=mask, position_ids=position_ids, use_cache=True,
               **{_CACHE_KW[type(dec)]: cache}).last_hidden_state


def new_cache(model) -> DynamicCache:
    """A cache of plain full-attention layers (no sliding window), which compaction can edit in place."""
    return DynamicCache()


def prefill(model, input_ids: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
    """input_ids [1, T] -> hidden [H] of the last position; the cache then holds T positions."""
    cache_kwarg(model)
    return forward(model, input_ids, None, None, cache)[0, -1]  # [H]


def lm_logits(model, hidden: torch.Tensor) -> torch.Tensor:
    """hidden [..., H] -> logits [..., V] in the model's dtype, soft-capped there as the model's own forward does
    (Gemma 2: cap * tanh(logits / cap)): what greedy takes its argmax of, with no fp32 copy of [B, N, V]. On CPU
    a few rows run the kernel measured fastest for them (gemv.py: the lm_head is the largest single weight)."""
    logits = model.get_output_embeddings()(hidden)
    cap = getattr(text_config(model), "final_logit_softcapping", None)
    return torch.tanh(logits / cap) * cap if cap else logits


def logits_of(model, hidden: torch.Tensor) -> torch.Tensor:
    """hidden [..., H] -> `lm_logits` in fp32, for the rules that compare probabilities."""
    return lm_logits(model, hidden).float()


def check_window(model, total: int) -> None:
    """The tree's 4-D mask lets every node see the whole cache, which equals the model's own attention only while
    the sequence fits its sliding window (Mistral, Gemma 2/3 sliding layers): refuse longer generations."""
    cfg = text_config(model)
    window = getattr(cfg, "sliding_window", None)
    types = getattr(cfg, "layer_types", None)
    sliding = window and ("sliding_attention" in types if types else getattr(cfg, "use_sliding_window", True))
    if sliding and total > window:
        raise FieldError("max_new_tokens", "past_window", f"prompt + {{field}} = {total} tokens exceeds the model's "
                         f"sliding window of {window}: the Medusa tree mask is exact only within it (lower {{field}})")


def head_logits(heads, model, hidden: torch.Tensor, depth: int) -> torch.Tensor:
    """hidden [B, H] -> logits [B, depth, V] of the first `depth` heads at those positions."""
    if heads.tied:  # the heads' rows through the base lm_head: the fast few-rows path of logits_of
        return logits_of(model, heads.features(hidden, depth)).transpose(0, 1)  # [B, depth, V]
    return heads(hidden, model.get_output_embeddings(), n=depth).transpose(0, 1)  # [B, depth, V]


def head_proposer(heads, model, depth: int, topk: int) -> Proposer:
    """The heads' top-k at each sequence's last accepted position: only the `depth` heads the tree uses."""
    def propose(hidden: torch.Tensor, seqs: list) -> torch.Tensor:
        return head_logits(heads, model, hidden, depth).topk(topk, dim=-1).indices  # [B, depth, topk]
    return propose

