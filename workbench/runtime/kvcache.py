"""The static KV cache of the step engine: every layer's keys and values are slices of one stacked tensor per
device ([L, B, kv, C, d]), written by `PointerLayer`s at one shared per-sequence column; its size in bytes and the
memory free for it; moving accepted rows next to each prefix (compaction: one copy over all layers at once)."""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, StaticLayer

from workbench import WorkbenchError
from workbench.core.notes import FieldError
from workbench.runtime.generation import text_config


class Stacks:
    """The storage of every layer: per device one key and one value stack [L, B, kv, C, d], allocated at the first
    write (the prefill's keys give kv heads, head size and dtype: a config's `num_key_value_heads` is not always
    what the attention uses) and marked as static addresses, so that CUDA graphs may write them in place."""

    def __init__(self, devices: list[torch.device], batch: int, capacity: int):
        self.devices, self.batch, self.capacity = devices, batch, capacity
        self.pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.slot: list[tuple[int, int]] = []  # layer -> (pair, index in it)

    def allocate(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        groups = list(dict.fromkeys(self.devices))
        self.slot = [(groups.index(d), self.devices[:i].count(d)) for i, d in enumerate(self.devices)]
        for dev in groups:
            count = self.devices.count(dev)
            pair = tuple(torch.zeros(count, self.batch, x.shape[1], self.capacity, x.shape[-1], dtype=x.dtype,
                                     device=dev) for x in (key_states, value_states))   # [L, B, kv, C, d] x 2
            for t in pair:
                torch._dynamo.mark_static_address(t)
            self.pairs.append(pair)


class PointerLayer(StaticLayer):
    """One layer of the stacked cache: keys and values are slot `index` of the stacks [L, B, kv, C, d] (views, so
    the compiled step's inputs are the stacks alone, and compaction is one copy for all layers). A forward of n
    rows per sequence writes sequence b's rows at columns [write_b, write_b + n), `write` [B] shared by all
    layers: the engine sets it once per step (a tree block at one column P, a plain step at each L_b). Rows may be
    overwritten (rejected tree rows, the next step's block)."""

    def __init__(self, stacks: Stacks, index: int, write: torch.Tensor, host: list):
        # (no StaticLayer.__init__: keys and values are views of the stacks, never reassigned)
        self.stacks, self.index = stacks, index
        self.write = write      # [B] long, shared by all layers
        self.host = host        # [P]: the block's column on the host, shared by all layers
        self.max_cache_len = stacks.capacity
        self.device = stacks.devices[index]
        self.is_initialized = True

    @property
    def keys(self) -> torch.Tensor:
        pair, j = self.stacks.slot[self.index]
        return self.stacks.pairs[pair][0][j]                                                # [B, kv, C, d]

    @property
    def values(self) -> torch.Tensor:
        pair, j = self.stacks.slot[self.index]
        return self.stacks.pairs[pair][1][j]                                                # [B, kv, C, d]

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.stacks.pairs:
            self.stacks.allocate(key_states, value_states)
        return write_rows(self.keys, self.values, key_states, value_states, self.write.to(self.device), self.index)

    def get_seq_length(self) -> int:
        """The block's column as a host int (a device tensor here would make its readers wait for the device). The
        step passes position ids and a 4-D mask, so the model itself never asks."""
        return self.host[0]


def write_rows(keys, values, key_states, value_states, write, index) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer `index`'s keys, values [B, kv, C, d] with each sequence b's n new rows [B, kv, n, d] written at columns
    [write_b, write_b + n)."""
    if key_states.shape[1] != keys.shape[1] or key_states.shape[-1] != keys.shape[-1]:
        raise WorkbenchError(f"layer {index} gives keys of shape {list(key_states.shape)} but layer 0 gave "
                             f"{list(keys.shape)}: layers of other attention shapes are not supported")
    n = key_states.shape[-2]
    at = write[:, None] + torch.arange(n, device=keys.device)                                # [B, n]
    at = at[:, None, :, None].expand(-1, key_states.shape[1], -1, key_states.shape[-1])      # [B, kv, n, d]
    keys.scatter_(2, at, key_states)
    values.scatter_(2, at, value_states)
    return keys, values


class StackedCache(Cache):
    """The engine's cache: on one device its update indexes the stacks by the layer index itself, not through a
    Python list of layers, so that a compiled layer may keep the index symbolic: one graph for every layer
    (layers.py). Layers spread over devices (--device-map) go through their PointerLayer."""

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        pairs = self.stacks.pairs
        if len(pairs) != 1:
            return super().update(key_states, value_states, layer_idx, *args, **kwargs)
        keys, values = pairs[0][0][layer_idx], pairs[0][1][layer_idx]                      # [B, kv, C, d] x 2
        return write_rows(keys, values, key_states, value_states, self.layers[0].write, layer_idx)


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


def _layer_devices(model, layers: int) -> list[torch.device]:
    """The device of each decoder layer (one unless --device-map spread them)."""
    blocks = getattr(model.get_decoder(), "layers", None)
    if getattr(model, "hf_device_map", None) and blocks is not None and len(blocks) == layers:
        return [next(b.parameters()).device for b in blocks]
    return [model.device] * layers


def allocate(model, batch: int, capacity: int, write: torch.Tensor, host: list) -> Cache:
    """A cache for `batch` sequences of `capacity` positions, refused in one line when the device lacks the memory:
    a PointerLayer per layer over one `Stacks` (`cache.stacks`)."""
    need, free = cache_bytes(model, batch, capacity), free_bytes(model.device)
    if free is not None and need > free:
        raise FieldError("batch_sizes", "cache_too_big", f"batch {batch} x {capacity} positions needs a "
                         f"{need / 2**30:.1f} GiB KV cache but {free / 2**30:.1f} GiB is free on {model.device}: "
                         "lower {field} or {also}", also="max_new_tokens")
    layers = text_config(model).num_hidden_layers
    stacks = Stacks(_layer_devices(model, layers), batch, capacity)
    cache = StackedCache(layers=[PointerLayer(stacks, i, write, host) for i in range(layers)])
    cache.stacks = stacks
    return cache


def move_rows(cache: Cache, src: torch.Tensor, dst: torch.Tensor) -> None:
    """src, dst [B, K] cache columns per sequence: copy every layer's keys and values from src to dst, one gather
    and one scatter per stack (padding columns may repeat the last pair: the same value, written twice)."""
    for keys, values in cache.stacks.pairs:
        seq = torch.arange(src.shape[0], device=keys.device)[:, None]                     # [B, 1]
        s_, d_ = src.to(keys.device), dst.to(keys.device)
        for t in (keys, values):                                                          # [L, B, kv, C, d]
            t[:, seq, :, d_] = t[:, seq, :, s_]                                           # [B, K, L, kv, d]
