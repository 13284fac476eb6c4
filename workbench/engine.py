"""The model work of a decoding step: a tree of N tokens through any HF decoder in one forward, on a KV cache.

StepEngine owns the preallocated cache (static layers), the 4-D mask over all of it (every cached position +
each node's ancestors) and the step compiled per tree size; `keep` moves accepted rows next to the prefix. The
decoder (decode.py) only chooses tokens: what the model computes, and how fast, is decided here. Also the few
forward helpers on a plain DynamicCache (prefill, decode_one), the fp32 lm_head path (logits_of) and the heads'
top-k (head_proposer). No modelling code is copied: the model's own attention reads the 4-D mask (eager, sdpa).
"""
from __future__ import annotations

import inspect
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, StaticLayer

from workbench import WorkbenchError
from workbench.generation import text_config
from workbench.tree import Tree, load_tree, tree_buffers

# propose(hidden [B, H], each sequence's tokens so far incl. its root: list of B lists) -> LongTensor [B, depth, topk]
Proposer = Callable[[torch.Tensor, list], torch.Tensor]


# ----------------------------------------------------------------------------------------------- model calls

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


def logits_of(model, hidden: torch.Tensor) -> torch.Tensor:
    """hidden [..., H] -> logits [..., V] in fp32 (acceptance compares probabilities), soft-capped where the model's
    own forward caps them (Gemma 2: cap * tanh(logits / cap); argmax unchanged, probabilities not).

    A few rows on CPU go through W @ h^T instead of h @ W^T: MKL's fp32 GEMM for 2..16 rows against a
    [V, H] weight is 2-4x slower than its matrix-vector path (measured on the demo's 49152 x 576 lm_head: 1 row
    10 ms, 2 rows 26 ms, 3 rows 42 ms), while W @ h^T streams the weight once (2 rows 6-14 ms): a large part of
    why a 2-token verify cost 1.64x a 1-token step (docs/tradeoffs.md). Same product, other summation kernel."""
    head = model.get_output_embeddings()
    rows = hidden.reshape(-1, hidden.shape[-1])
    if (hidden.device.type == "cpu" and 1 < rows.shape[0] <= 16 and type(head) is torch.nn.Linear
            and head.bias is None):
        logits = (head.weight @ rows.T).T.reshape(*hidden.shape[:-1], -1).float()
    else:
        logits = head(hidden).float()
    cap = getattr(text_config(model), "final_logit_softcapping", None)
    return torch.tanh(logits / cap) * cap if cap else logits


def check_window(model, total: int) -> None:
    """The tree's 4-D mask lets every node see the whole cache, which equals the model's own attention only while
    the sequence fits its sliding window (Mistral, Gemma 2/3 sliding layers): refuse longer generations."""
    cfg = text_config(model)
    window = getattr(cfg, "sliding_window", None)
    types = getattr(cfg, "layer_types", None)
    sliding = window and ("sliding_attention" in types if types else getattr(cfg, "use_sliding_window", True))
    if sliding and total > window:
        raise WorkbenchError(f"prompt + --max-new-tokens = {total} tokens exceeds the model's sliding window of "
                             f"{window}: the Medusa tree mask is exact only within it (lower --max-new-tokens)")


def decode_one(model, token: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
    """token [] -> hidden [H] of that token, appended to the cache (a plain step on a DynamicCache)."""
    cache_kwarg(model)
    return forward(model, token.view(1, 1), None, None, cache)[0, -1]


# ----------------------------------------------------------------------------------------------- tree buffers, heads

@dataclass
class TreeBuffers:
    """A tree's constants on the model's device, built once per tree and reused across prompts, batches and runs:
    nothing about the tree is recomputed inside a step."""

    tree: Tree | None           # None for the root-only step of vanilla decoding
    topk: int                   # top-k taken from each head (max rank + 1)
    depth: int                  # heads used
    tree_indices: torch.Tensor  # [N] into [root] + head_1 top-k + ... + head_depth top-k
    depths: torch.Tensor        # [N] 0 for the root
    parents: torch.Tensor       # [N] parent node, 0 for the root (its own parent: never read)
    retrieve: torch.Tensor      # [R, depth+1] root-to-leaf node rows, -1 padded
    visible: torch.Tensor       # [N, N] bool: node i sees node j (itself, its ancestors)
    paths: list                 # [N] the top-k rank path of each node, () for the root
    rows: list = field(default_factory=list)  # retrieve on the host: a step names its path without a device read

    def __post_init__(self):
        if not self.rows:
            self.rows = self.retrieve.tolist()
        self.gather = self.retrieve.clamp(min=0)          # [R, D+1] node rows, padding -> the root
        self.real = self.retrieve >= 0                    # [R, D+1]
        self.steps = torch.arange(self.depth + 1, device=self.retrieve.device)  # [D+1] 0..depth

    @property
    def size(self) -> int:
        """Tokens in one verify forward of one sequence (tree nodes + the root)."""
        return self.tree_indices.shape[0]


def tree_setup(tree, model, num_heads: int | None = None) -> TreeBuffers:
    if isinstance(tree, TreeBuffers):
        return tree
    t = load_tree(tree, num_heads=num_heads)
    topk = t.max_rank + 1
    b = tree_buffers(t, topk, device=model.device)
    return TreeBuffers(tree=t, topk=topk, depth=t.depth, tree_indices=b["tree_indices"], depths=b["position_ids"],
                       parents=b["parents"].clamp(min=0), retrieve=b["retrieve_indices"],
                       visible=b["attn_mask"] != 0, paths=[()] + t.sorted_paths)


def root_setup(model) -> TreeBuffers:
    """The 1-token step of vanilla greedy as a tree of the root alone: it runs through the same verify path."""
    zero = torch.zeros(1, dtype=torch.long, device=model.device)
    return TreeBuffers(tree=None, topk=1, depth=0, tree_indices=zero, depths=zero, parents=zero,
                       retrieve=zero[None], visible=torch.ones(1, 1, dtype=torch.bool, device=model.device),
                       paths=[()])


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


# ----------------------------------------------------------------------------------------------- the step engine

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


def _verify(model, cache, tokens, lengths, pointer, columns, visible, depths):
    """The step's model work, compiled as one graph when asked: tokens [B, N] of each sequence's tree at the block
    [P, P + N) (P = pointer []), lengths [B] L_b, columns [C] 0..C-1, visible [N, N], depths [N] -> (hidden [B, N, H],
    logits [B, N, V] fp32). The mask and position ids are built here, inside the graph: every input is a tensor
    whose shape depends on (B, N) and the fixed capacity C only. The cache writes its B x N rows in place."""
    n = tokens.shape[1]
    rel = columns - pointer                                                                # [C]
    block = visible[:, rel.clamp(0, n - 1)] & ((rel >= 0) & (rel < n))[None]               # [N, C]
    seen = (columns[None] < lengths[:, None])[:, None] | block[None]                       # [B, N, C]
    mask = additive_mask(seen, model.dtype)[:, None]                                       # [B, 1, N, C]
    position_ids = lengths[:, None] + depths[None]                                         # [B, N]
    hidden = forward(model, tokens, mask, position_ids, cache)                             # [B, N, H]
    return hidden, logits_of(model, hidden)


def additive_mask(seen: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool visibility -> additive mask in the model's dtype (0 visible, dtype-min blocked: no NaN rows)."""
    return torch.where(seen, torch.zeros((), dtype=dtype, device=seen.device), torch.finfo(dtype).min)


def compile_mode(device: torch.device) -> str:
    """CUDA: CUDA graphs (eager transformers is launch-bound there). CPU: inductor's own small-M GEMM kernels
    (max-autotune), the only mode that beats MKL at 2..16 rows; it needs a C++ compiler and minutes per tree size."""
    return "reduce-overhead" if device.type == "cuda" else "max-autotune-no-cudagraphs"


def compile_options(device: torch.device, backend: str | None = None) -> dict:
    """torch.compile keywords for the step. On CPU the weights are frozen (constants) so that inductor packs them
    once for its GEMM micro-kernels: measured on the demo model, the 1-token step 76 -> 41 ms (CPU time, loaded
    2-core machine), after ~10 minutes of compilation per tree size. `backend` other than inductor (tests:
    "aot_eager", which traces the same graph in seconds) takes no inductor options."""
    if backend not in (None, "inductor"):
        return dict(backend=backend)
    if device.type == "cuda":
        return dict(mode=compile_mode(device))
    return dict(options=dict(freezing=True, max_autotune=True, max_autotune_gemm_backends="CPP,ATEN"))


def default_compile(device: torch.device) -> bool:
    """The one default for compiling the step: on CUDA (launch-bound without CUDA graphs), off elsewhere (CPU
    compilation takes minutes per tree size)."""
    return device.type == "cuda"


def check_cacheable(model) -> None:
    """Only attention layers can hold a tree: recurrent or linear-attention layers (Mamba, RWKV-style, gated
    delta nets) keep one state per sequence that a rejected branch would corrupt. One line, not a shape error."""
    types = getattr(text_config(model), "layer_types", None) or []
    other = sorted({t for t in types if t not in ("full_attention", "sliding_attention")})
    if other:
        raise WorkbenchError(f"{type(model).__name__} has {', '.join(other)} layers, whose cache cannot hold a "
                             "token tree or be batched by this decoder: only attention-only models are supported")


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


class StepEngine:
    """One model's decoding step for B sequences on a preallocated KV cache, shared by Medusa and vanilla greedy.

    Layout (per-sequence pointers with a mask, not left padding): sequence b's prefix is cache rows [0, L_b) of
    its own batch row; every step writes all B trees at one common block [P, P + N), P = max_b L_b, with position
    ids L_b + depth, and a 4-D mask [B, 1, N, C] that shows each node its own prefix and its ancestors. Sequences
    behind P simply do not see the gap [L_b, P). `keep` then moves each sequence's accepted rows to
    [L_b, L_b + m_b). Why not left padding: with ragged acceptance the prefixes drift apart every step anyway, and
    left padding would need a growing pad column per step or a shift of whole caches; a length per sequence and a
    mask cost nothing, and position ids stay each sequence's own (RoPE sees no pads).

    The cache is a `PointerLayer` per layer (transformers' StaticLayer, written at one shared pointer): one pointer
    update per step for all layers. Rejected rows stay in memory, masked, until overwritten: nothing is
    concatenated or cropped, every shape is fixed per (B, N), so `compile=True` compiles each (B, N) once
    (default `default_compile`: on CUDA; where compilation fails, one warning and eager from then on).
    """

    def __init__(self, model, compile: bool | None = None, backend: str | None = None, capacity: int = 0):
        self.model = model
        check_cacheable(model)
        cache_kwarg(model)
        self.cache: Cache | None = None
        self.batch = 0
        self.capacity = int(capacity)               # C: cache positions, fixed for the run once set (size_for)
        self.compile_s = 0.0                        # seconds spent compiling / capturing the step (untimed warm-ups)
        self.resized = 0                            # capacity grown after compiling: each one compiles the step again
        self._warm: set[tuple[int, int]] = set()    # (B, N) run through the compiled step on the current cache
        self.graphs: set[tuple[int, int, int]] = set()  # (B, N, C) the compiled step has been warmed up for
        self.start = 0                              # P: where the next block is written (host)
        self.lengths = torch.zeros(0, dtype=torch.long, device=model.device)  # [B] L_b (device)
        self.host_lengths: list[int] = []          # [B] L_b (host), moved from the one read per step
        self.host_alive: list[bool] = []           # [B] False once a sequence finished
        self.alive = torch.zeros(0, dtype=torch.long, device=model.device)    # [B] 1 while a sequence emits
        self.pointer = torch.zeros((), dtype=torch.long, device=model.device)
        self._host = [0]                            # the pointer on the host, for PointerLayer.get_seq_length
        self.compile = default_compile(model.device) if compile is None else bool(compile)
        self._step = _verify
        if self.compile:
            inductor = backend in (None, "inductor")
            if model.device.type == "cpu" and inductor and not torch.backends.mkldnn.is_available():
                self._fail("no oneDNN/MKL build")
            else:
                torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
                self._step = torch.compile(_verify, dynamic=False, **compile_options(model.device, backend))

    def _fail(self, why: str) -> None:
        print(f"warning: --compile: cannot compile the step on {self.model.device.type} ({why}); running eager",
              file=sys.stderr)
        self.compile, self._step = False, _verify

    def size_for(self, prompts, max_new_tokens: int, trees) -> int:
        """Fix the cache capacity for a whole run before its first step: its longest prompt + `max_new_tokens` + the
        largest tree's block (nodes + depth + 1: a step may accept past its budget). The compiled step's shapes are
        then (B, N) only, so each (batch, tree size) compiles once; a later generation that needs more grows the
        cache and, compiled, says so on stderr and compiles again (untimed, counted in `compile_s`)."""
        width = max(int(p.shape[-1]) if isinstance(p, torch.Tensor) else len(p) for p in prompts)
        need = width + max_new_tokens + max(b.size + b.depth for b in trees) + 1
        self.capacity = max(self.capacity, need)
        return self.capacity

    def reserve(self, batch: int, capacity: int) -> None:
        """A cache for `batch` sequences of the run's capacity (`size_for`), or of `capacity` positions if more.
        Attention runs over every cached position, masked or not: the capacity is part of the compiled shapes."""
        if batch < 1:
            raise WorkbenchError(f"--batch {batch}: must be >= 1")
        if self.cache is not None and batch == self.batch and capacity <= self.capacity:
            return
        if capacity > self.capacity and self.compile and self.graphs:
            self.resized += 1
            print(f"warning: a generation needs {capacity} KV cache positions but the engine was sized for "
                  f"{self.capacity}: the compiled step compiles again for the new size (untimed; size the engine "
                  "for the run's longest prompt first: StepEngine.size_for)", file=sys.stderr)
        capacity = max(capacity, self.capacity)
        need, free = cache_bytes(self.model, batch, capacity), free_bytes(self.model.device)
        if free is not None and need > free:
            raise WorkbenchError(f"batch {batch} x {capacity} positions needs a {need / 2**30:.1f} GiB KV cache but "
                                 f"{free / 2**30:.1f} GiB is free on {self.model.device}: lower --batch or "
                                 "--max-new-tokens")
        self.cache = None  # free the old one before allocating
        cfg = text_config(self.model)  # sliding windows: check_window, per generation
        self.cache = Cache(layers=[PointerLayer(capacity, self.pointer, self._host) for _ in range(cfg.num_hidden_layers)])
        self.batch, self.capacity = batch, capacity
        self._warm = set()  # new cache tensors: CUDA graphs record again (dynamo reuses a graph of equal shapes)
        self._columns = torch.arange(capacity, device=self.model.device)  # [C]

    def _point(self, at: int) -> None:
        """Move the write pointer: the next rows any layer writes go to column `at` (one fill for all layers)."""
        self.start = self._host[0] = at
        self.pointer.fill_(at)

    def prefill(self, prompts, extra: int) -> torch.Tensor:
        """prompts: LongTensor [B, T] or a list of B 1-D prompts (any lengths) -> hidden [B, H] of each prompt's last
        position. Prompts sit at [0, T_b) of their rows (right-padded, the pad masked); room is kept for `extra`
        more rows. All sequences start alive."""
        if isinstance(prompts, torch.Tensor) and prompts.ndim == 2:
            prompts = list(prompts)
        lens = [int(p.shape[-1]) for p in prompts]
        batch, width = len(prompts), max(lens)
        self.reserve(batch, width + extra)
        dev = self.model.device
        ids = torch.zeros(batch, width, dtype=torch.long, device=dev)
        for b, p in enumerate(prompts):
            ids[b, : lens[b]] = p.to(dev)
        self.lengths = torch.tensor(lens, device=dev)                                         # [B]
        cols = self._columns                                                                  # [C]
        rows = torch.arange(width, device=dev)                                                # [T]
        seen = (cols[None, None] <= rows[None, :, None]) & (cols[None, None] < self.lengths[:, None, None])
        mask = additive_mask(seen, self.model.dtype)[:, None]                                 # [B, 1, T, C]
        self._point(0)
        out = forward(self.model, ids, mask, rows[None].expand(batch, -1), self.cache)         # [B, T, H]
        self.host_lengths, self.host_alive = lens, [True] * batch
        self.alive = torch.ones(batch, dtype=torch.long, device=dev)
        self._point(width)
        return out[torch.arange(batch, device=dev), self.lengths - 1]                        # [B, H]

    def verify(self, tokens: torch.Tensor, buf: TreeBuffers) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens [B, N] -> (hidden [B, N, H], logits [B, N, V]): one forward of every sequence's tree at the block
        [P, P + N) (the lengths stay put). Compiled, a (B, N) not yet run is warmed up first (`warm`)."""
        if self.start + buf.size > self.capacity:
            raise WorkbenchError(f"the KV cache holds {self.capacity} positions, the step needs "
                                 f"{self.start + buf.size}: reserve more")
        if self.compile and (self.batch, buf.size) not in self._warm:
            self.warm(buf)
        return self._run(tokens, buf)

    def _run(self, tokens: torch.Tensor, buf: TreeBuffers) -> tuple[torch.Tensor, torch.Tensor]:
        args = (self.model, self.cache, tokens, self.lengths, self.pointer, self._columns, buf.visible, buf.depths)
        try:  # (the pointer is at the block already: only _point moves it, and the model's writes do not)
            return self._step(*args)
        except Exception as e:  # noqa: BLE001 - inductor/dynamo raise many kinds; eager is always right
            if not self.compile:
                raise
            self._fail(f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}")
            return self._step(*args)

    def warm(self, buf: TreeBuffers) -> float:
        """Compile (and on CUDA capture as a CUDA graph) the step for this batch and tree before any step is timed:
        the first call compiles, CUDA graphs record on a later one. It runs on the block past every prefix, which
        the next step overwrites: nothing the decoder reads changes. Returns the seconds it took (also added to
        `compile_s`); 0 when eager or already warm."""
        if not self.compile or (self.batch, buf.size) in self._warm:
            return 0.0
        dev = self.model.device
        t0 = clock(dev)
        tokens = torch.zeros(self.batch, buf.size, dtype=torch.long, device=dev)               # [B, N]
        for _ in range(3 if dev.type == "cuda" else 1):
            self._run(tokens, buf)
        seconds = clock(dev) - t0
        self._warm.add((self.batch, buf.size))
        self.graphs.add((self.batch, buf.size, self.capacity))
        self.compile_s += seconds
        return seconds

    def keep(self, buf: TreeBuffers, row: torch.Tensor, count: torch.Tensor) -> None:
        """row [B], count [B] (device): move the first count_b nodes of retrieve row row_b (root first) right after
        each alive sequence's prefix, and grow its length. Device work only (no read); `advance` follows on the host."""
        take = torch.minimum(buf.steps[None], count[:, None] - 1)                              # [B, D+1]
        src = buf.gather[row].gather(1, take) + self.start                                     # [B, D+1]
        dst = self.lengths[:, None] + take                                                     # [B, D+1]
        seq = torch.arange(self.batch, device=src.device)[:, None]                             # [B, 1]
        on = {src.device: (seq, dst, src)}  # the indices per device (--device-map spreads layers over several)
        for layer in self.cache.layers:  # padding columns repeat the last pair: same value, written twice
            s_, d_, r_ = on.get(layer.keys.device) or on.setdefault(layer.keys.device, tuple(
                t.to(layer.keys.device) for t in (seq, dst, src)))
            layer.keys[s_, :, d_] = layer.keys[s_, :, r_]                                      # [B, D+1, kv, d]
            layer.values[s_, :, d_] = layer.values[s_, :, r_]
        self.lengths += count * self.alive

    def advance(self, counts: list[int]) -> None:
        """The host side of `keep`, from the step's one read: lengths, and the next block after the longest prefix."""
        self.host_lengths = [n + c * a for n, c, a in zip(self.host_lengths, counts, self.host_alive)]
        self._point(max(self.host_lengths))

    def finish(self, b: int, length: int) -> None:
        """Sequence b emits nothing more: its prefix is cut to `length` (a step may accept past its budget) and
        frozen; its slot keeps computing until the batch ends."""
        self.host_alive[b] = False
        self.host_lengths[b] = length
        self.alive[b] = 0
        self.lengths[b] = length

    def rewind(self, lengths: list[int]) -> None:
        """Put every sequence's length back (timing at a fixed context: rows past it are dropped)."""
        self.host_lengths = list(lengths)
        self.lengths.copy_(torch.tensor(lengths, device=self.lengths.device))
        self._point(max(lengths))


# ----------------------------------------------------------------------------------------------- timing

@torch.inference_mode()
def verify_times(engine: StepEngine, buf: TreeBuffers, heads=None, repeats: int = 10, warmup: int = 2,
                 generator: torch.Generator | None = None) -> list[float]:
    """Seconds of each repeat of the bare verify work of one step at the engine's current batch and context: the
    forward of B x N tree tokens (the tree mask per sequence) with logits for their rows and their argmax, plus
    (with heads, for trees) the heads' top-k for every sequence. No acceptance, compaction or host read of a path:
    what a step costs at the least."""
    model = engine.model
    vocab = model.get_input_embeddings().weight.shape[0]
    tokens = torch.randint(vocab, (engine.batch, buf.size), generator=generator).to(model.device)  # [B, N]
    propose = head_proposer(heads, model, buf.depth, buf.topk) if heads is not None and buf.depth else None
    times = []
    for i in range(warmup + repeats):
        t0 = clock(model.device)
        hidden, logits = engine.verify(tokens, buf)
        logits.argmax(dim=-1)
        if propose is not None:
            propose(hidden[:, 0], [])
        t1 = clock(model.device)
        if i >= warmup:
            times.append(t1 - t0)
    return times


def time_verify(engine: StepEngine, buf: TreeBuffers, heads=None, repeats: int = 10, warmup: int = 2,
                generator: torch.Generator | None = None) -> float:
    """Median of `verify_times`."""
    return statistics.median(verify_times(engine, buf, heads, repeats, warmup, generator))


def forward_probe(engine: StepEngine, buf: TreeBuffers, heads=None) -> tuple[Callable[[object], None], list]:
    """(on_step, times): an on_step callback that times the bare verify work (`verify_times`, once) right after
    every step, at that step's batch and context, and the list it fills (seconds). Step and bare forward then
    alternate, so a load change on a shared machine hits both alike: decoder_overhead = median step / median of
    these. Asks for step timing (the decoder times steps only when someone reads them)."""
    times: list[float] = []

    def on_step(step) -> None:  # a decode.Step; only its timing point matters
        times.append(verify_times(engine, buf, heads, repeats=1, warmup=0)[0])
    on_step.needs_timing = True
    return on_step, times
