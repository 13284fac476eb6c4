"""The static KV cache of the step engine: one `PointerLayer` per model layer, all written at one shared pointer;
its size in bytes and the memory free for it; moving accepted rows next to each prefix (compaction)."""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, StaticLayer

from workbench import WorkbenchError
from workbench.runtime.generation import text_config


class PointerLayer(StaticLayer):
    """A static cache layer [B, kv_heads, capacity, d] that writes the rows of a forward at the engine's one shared
    pointer, not at its own running count: every layer (and every sequence) then moves with ONE pointer update per
    step, and rows may be overwritten (rejected tree rows, the next step's block)."""

    def __init__(self, max_cache_len: int, pointer: torch.Tensor, host: list):
        super().__init__(max_cache_len=max_cache_len)
        self.pointer = pointer  # [] long, shared by all layers
        self.host = host        # [P]: the same pointer on the host, shared by all layers

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        at = (self.pointer + torch.arange(key_states.shape[-2], device=self.pointer.device)).to(self.keys.device)  # [n]
        self.keys.index_copy_(2, at, key_states)
        self.values.index_copy_(2, at, value_states)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        """The write pointer as a host int (a device tensor here would make its readers wait for the device). The
        step passes position ids and a 4-D mask, so the model itself never asks."""
        return self.host[0]


def uncacheable_layers(model) -> str | None:
    """Why the decoder cannot decode `model` (None when it can): only attention layers can hold a tree; recurrent or
    linear-attention layers (Mamba, RWKV-style, gated delta nets) keep one state per sequence that a rejected branch
    would corrupt. Commands that only generate greedily and read hidden states (calibrate, train-heads) still work
    on such models, so they warn with this where decoding commands refuse."""
    types = getattr(text_config(model), "layer_types", None) or []
    other = sorted({t for t in types if t not in ("full_attention", "sliding_attention")})
    if other:
        return (f"{type(model).__name__} has {', '.join(other)} layers, whose cache cannot hold a token tree or be "
                "batched by this decoder: only attention-only models are supported")
    return None


def undecodable_warning(model, what: str) -> str | None:
    """The one warning line of a command whose result is right on `model` (greedy answers and hidden states) but
    that the decoding commands cannot use there; `what` says what is right. None for a model the decoder takes."""
    why = uncacheable_layers(model)
    return why and (f"warning: {what}, but `workbench decode`, `sweep` and `latency` cannot decode this model: "
                    f"{why}")


def check_cacheable(model) -> None:
    """uncacheable_layers as one error line, not a shape error deep in a step."""
    why = uncacheable_layers(model)
    if why:
        raise WorkbenchError(why)


def cache_bytes(model, batch: int, capacity: int) -> int:
    """Bytes of a static KV cache for `batch` sequences of `capacity` positions (keys and values, every layer)."""
    cfg = text_config(model)
    kv = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return 2 * cfg.num_hidden_layers * batch * kv * capacity * head_dim * model.dtype.itemsize


def free_bytes(device: torch.device) -> int | None:
    """Memory free for new tensors on the device (CUDA: the driver's figure; CPU: MemAvailable), None if unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return None


def allocate(model, batch: int, capacity: int, pointer: torch.Tensor, host: list) -> Cache:
    """A cache for `batch` sequences of `capacity` positions, refused in one line when the device lacks the memory."""
    need, free = cache_bytes(model, batch, capacity), free_bytes(model.device)
    if free is not None and need > free:
        raise WorkbenchError(f"batch {batch} x {capacity} positions needs a {need / 2**30:.1f} GiB KV cache but "
                             f"{free / 2**30:.1f} GiB is free on {model.device}: lower --batch-sizes or --max-new-tokens")
    return Cache(layers=[PointerLayer(capacity, pointer, host) for _ in range(text_config(model).num_hidden_layers)])


def move_rows(cache: Cache, src: torch.Tensor, dst: torch.Tensor) -> None:
    """src, dst [B, K] cache columns per sequence: copy every layer's keys and values from src to dst (padding
    columns may repeat the last pair: the same value, written twice)."""
    seq = torch.arange(src.shape[0], device=src.device)[:, None]                           # [B, 1]
    on = {src.device: (seq, dst, src)}  # the indices per device (--device-map spreads layers over several)
    for layer in cache.layers:
        s_, d_, r_ = on.get(layer.keys.device) or on.setdefault(layer.keys.device, tuple(
            t.to(layer.keys.device) for t in (seq, dst, src)))
        layer.keys[s_, :, d_] = layer.keys[s_, :, r_]                                          # [B, K, kv, d]
        layer.values[s_, :, d_] = layer.values[s_, :, r_]
