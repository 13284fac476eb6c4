"""The model work of a decoding step: a tree of N tokens through any HF decoder in one forward, on a KV cache.

StepEngine owns the preallocated cache (static layers), the 4-D mask over all of it (every cached position +
each node's ancestors) and the step compiled per tree size; `keep` moves accepted rows next to the prefix. The
decoder (decode.py) only chooses tokens: what the model computes, and how fast, is decided here. Also the few
forward helpers on a plain DynamicCache (prefill, decode_one), the fp32 lm_head path (logits_of) and the heads'
top-k (head_proposer). No modelling code is copied: the model's own attention reads the 4-D mask (eager, sdpa).
"""
from __future__ import annotations

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

# propose(hidden [H], tokens so far incl. the root: list[int]) -> LongTensor [depth, topk]
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


def new_cache(model) -> DynamicCache:
    """A cache of plain full-attention layers (no sliding window), which compaction can edit in place."""
    return DynamicCache()


def prefill(model, input_ids: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
    """input_ids [1, T] -> hidden [H] of the last position; the cache then holds T positions."""
    out = _decoder(model)(input_ids=input_ids, past_key_values=cache, use_cache=True)
    return out.last_hidden_state[0, -1]  # [H]


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
    out = _decoder(model)(input_ids=token.view(1, 1), past_key_values=cache, use_cache=True)
    return out.last_hidden_state[0, -1]


# ----------------------------------------------------------------------------------------------- tree buffers, heads

@dataclass
class TreeBuffers:
    """A tree's index tensors on the model's device, built once per tree and reused across prompts and runs."""

    tree: Tree | None           # None for the root-only step of vanilla decoding
    topk: int                   # top-k taken from each head (max rank + 1)
    depth: int                  # heads used
    tree_indices: torch.Tensor  # [N] into [root] + head_1 top-k + ... + head_depth top-k
    depths: torch.Tensor        # [N] 0 for the root
    parents: torch.Tensor       # [N] parent node, -1 for the root
    retrieve: torch.Tensor      # [R, depth+1] root-to-leaf node rows, -1 padded
    mask_bias: torch.Tensor     # [N, N] 0 where a node sees a node (itself, its ancestors), dtype-min elsewhere
    paths: list                 # [N] the top-k rank path of each node, () for the root
    rows: list = field(default_factory=list)  # retrieve on the host: a step reads its path without a device sync

    def __post_init__(self):
        if not self.rows:
            self.rows = self.retrieve.tolist()

    @property
    def size(self) -> int:
        """Tokens in one verify forward (tree nodes + the root)."""
        return self.tree_indices.shape[0]


def tree_setup(tree, model, num_heads: int | None = None) -> TreeBuffers:
    if isinstance(tree, TreeBuffers):
        return tree
    t = load_tree(tree, num_heads=num_heads)
    topk = t.max_rank + 1
    b = tree_buffers(t, topk, device=model.device)
    blocked = torch.finfo(model.dtype).min
    mask = torch.zeros(b["attn_mask"].shape, dtype=model.dtype, device=model.device)
    mask.masked_fill_(b["attn_mask"] == 0, blocked)
    return TreeBuffers(tree=t, topk=topk, depth=t.depth, tree_indices=b["tree_indices"], depths=b["position_ids"],
                       parents=b["parents"], retrieve=b["retrieve_indices"], mask_bias=mask,
                       paths=[()] + t.sorted_paths)


def root_setup(model) -> TreeBuffers:
    """The 1-token step of vanilla greedy as a tree of the root alone: it runs through the same verify path."""
    zero = torch.zeros(1, dtype=torch.long, device=model.device)
    return TreeBuffers(tree=None, topk=1, depth=0, tree_indices=zero, depths=zero, parents=zero - 1,
                       retrieve=zero[None], mask_bias=torch.zeros(1, 1, dtype=model.dtype, device=model.device),
                       paths=[()])


def head_logits(heads, model, hidden: torch.Tensor, depth: int) -> torch.Tensor:
    """hidden [H] -> logits [depth, V] of the first `depth` heads at that position."""
    if heads.tied:  # the heads' `depth` rows through the base lm_head: the fast few-rows path of logits_of
        return logits_of(model, heads.features(hidden, depth))  # [depth, V]
    return heads(hidden, model.get_output_embeddings(), n=depth)  # [depth, V]


def head_proposer(heads, model, depth: int, topk: int) -> Proposer:
    """The heads' top-k at one position: only the `depth` heads the tree uses, on one hidden row."""
    def propose(hidden: torch.Tensor, tokens: list) -> torch.Tensor:
        return head_logits(heads, model, hidden, depth).topk(topk, dim=-1).indices  # [depth, topk]
    return propose


# ----------------------------------------------------------------------------------------------- the step engine

def _verify(model, cache, input_ids, mask, position_ids):
    """The step's model work, compiled as one graph when asked: input_ids [1, N], mask [1, 1, N, C],
    position_ids [1, N] -> (hidden [N, H], logits [N, V] fp32). The cache writes its N rows in place."""
    hidden = _decoder(model)(input_ids=input_ids, attention_mask=mask, position_ids=position_ids,
                             past_key_values=cache, use_cache=True).last_hidden_state[0]
    return hidden, logits_of(model, hidden)


def compile_mode(device: torch.device) -> str:
    """CUDA: CUDA graphs (eager transformers is launch-bound there). CPU: inductor's own small-M GEMM kernels
    (max-autotune), the only mode that beats MKL at 2..16 rows; it needs a C++ compiler and minutes per tree size."""
    return "reduce-overhead" if device.type == "cuda" else "max-autotune-no-cudagraphs"


def compile_options(device: torch.device) -> dict:
    """torch.compile keywords for the step. On CPU the weights are frozen (constants) so that inductor packs them
    once for its GEMM micro-kernels: measured on the demo model, the 1-token step 76 -> 41 ms (CPU time, loaded
    2-core machine), after ~10 minutes of compilation per tree size."""
    if device.type == "cuda":
        return dict(mode=compile_mode(device))
    return dict(options=dict(freezing=True, max_autotune=True, max_autotune_gemm_backends="CPP,ATEN"))


class StepEngine:
    """One model's decoding step on a preallocated KV cache, shared by Medusa and vanilla greedy (same path).

    The cache (transformers StaticLayer per layer) is allocated once for the longest generation asked for and
    reused by later ones; `length` is the write pointer. A verify step writes its N rows at [length, length + N)
    through the model's own cache update and attends through a 4-D mask over [N, capacity] (0 = visible: the
    prefix and the node's ancestors); `keep` moves the accepted rows next to the prefix and the pointer after
    them. Rejected rows stay in memory, masked, until the next step overwrites them: nothing is concatenated
    or cropped per step, and every shape is fixed per tree size, so `compile=True` compiles each tree once
    (on by default on CUDA; where compilation fails, one warning and eager from then on).
    """

    def __init__(self, model, compile: bool | None = None):
        self.model = model
        self.cache: Cache | None = None
        self.capacity = 0
        self.length = 0
        self._masks: dict[int, list] = {}   # N -> [mask [1, 1, N, capacity], pointer it was built for]
        self.compile = model.device.type == "cuda" if compile is None else bool(compile)
        self._step = _verify
        if self.compile:
            if model.device.type == "cpu" and torch.backends.mkldnn.is_available() is False:
                self._fail("no oneDNN/MKL build")
            else:
                torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
                self._step = torch.compile(_verify, dynamic=False, **compile_options(model.device))

    def _fail(self, why: str) -> None:
        print(f"warning: --compile: cannot compile the step on {self.model.device.type} ({why}); running eager",
              file=sys.stderr)
        self.compile, self._step = False, _verify

    def reserve(self, capacity: int) -> None:
        """A cache of at least `capacity` positions. Compiled, rounded up to 256 so that new prompts rarely change
        shapes; eager, exact: attention (and, for N > 1 rows under a mask, transformers' repeat of grouped KV
        heads) runs over every cached position, masked or not."""
        if capacity <= self.capacity:
            return
        if self.compile:
            capacity = -(-capacity // 256) * 256
        cfg = text_config(self.model)  # sliding windows: check_window, per generation
        self.cache = Cache(layers=[StaticLayer(max_cache_len=capacity) for _ in range(cfg.num_hidden_layers)])
        self.capacity, self.length, self._masks = capacity, 0, {}

    def _point(self, length: int) -> None:
        """Move the write pointer: the next rows the model writes go to `length`."""
        self.length = length
        for layer in self.cache.layers:
            layer.cumulative_length.fill_(length)

    def prefill(self, ids: torch.Tensor, extra: int) -> torch.Tensor:
        """ids [1, T] -> hidden [H] of the last position; room is kept for `extra` more rows (steps + a tree)."""
        self.reserve(ids.shape[1] + extra)
        self._point(0)
        out = _decoder(self.model)(input_ids=ids, past_key_values=self.cache, use_cache=True)
        self.length = ids.shape[1]
        return out.last_hidden_state[0, -1]  # [H]

    def _mask(self, buf: TreeBuffers) -> torch.Tensor:
        """[1, 1, N, capacity]: columns < length visible, the tree's own block at [length, length + N), the rest
        blocked. Updated in place: only the columns the pointer moved over and the tree block are rewritten."""
        n, at = buf.size, self.length
        entry = self._masks.get(n)
        if entry is None or entry[1] > at:
            mask = torch.full((1, 1, n, self.capacity), torch.finfo(self.model.dtype).min, dtype=self.model.dtype,
                              device=self.model.device)
            entry = self._masks[n] = [mask, 0]
        mask, built = entry
        mask[..., built:at] = 0
        mask[0, 0, :, at:at + n] = buf.mask_bias
        entry[1] = at
        return mask

    def verify(self, tokens: torch.Tensor, buf: TreeBuffers) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens [N] -> (hidden [N, H], logits [N, V]): one forward of the tree at the pointer (it stays put)."""
        if self.length + buf.size > self.capacity:
            raise WorkbenchError(f"the KV cache holds {self.capacity} positions, the step needs "
                                 f"{self.length + buf.size}: reserve more")
        mask = self._mask(buf)
        position_ids = (buf.depths + self.length)[None]  # [1, N]
        try:
            return self._step(self.model, self.cache, tokens[None], mask, position_ids)
        except Exception as e:  # noqa: BLE001 - inductor/dynamo raise many kinds; eager is always right
            if not self.compile:
                raise
            self._fail(f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}")
            self._point(self.length)
            return self._step(self.model, self.cache, tokens[None], mask, position_ids)

    def keep(self, buf: TreeBuffers, row: int, length: int) -> None:
        """Keep the first `length` nodes of retrieve row `row` (root first) right after the prefix."""
        at = self.length
        if buf.rows[row][:length] != list(range(length)):  # a chain-like path is already in place
            src = buf.retrieve[row, :length] + at  # [m] (host ints index the device tensor: no sync)
            for layer in self.cache.layers:
                layer.keys[:, :, at:at + length] = layer.keys[:, :, src]      # [B, kv_heads, m, d]
                layer.values[:, :, at:at + length] = layer.values[:, :, src]
        self._point(at + length)

    def rewind(self, length: int) -> None:
        """Put the pointer back (timing at a fixed context: rows past it are dropped)."""
        self._point(length)


# ----------------------------------------------------------------------------------------------- timing

@torch.inference_mode()
def time_verify(engine: StepEngine, buf: TreeBuffers, heads=None, repeats: int = 10, warmup: int = 2,
                generator: torch.Generator | None = None) -> float:
    """Median seconds of the bare verify work of one step at the engine's current context: the forward of the
    tree's N tokens with logits for its rows and their argmax, plus (with heads, for trees) the heads' top-k on
    one row. No acceptance, compaction or host sync of a path: what a step costs at the least."""
    model = engine.model
    vocab = model.get_input_embeddings().weight.shape[0]
    tokens = torch.randint(vocab, (buf.size,), generator=generator).to(model.device)
    propose = head_proposer(heads, model, buf.depth, buf.topk) if heads is not None and buf.depth else None
    at, times = engine.length, []
    for i in range(warmup + repeats):
        t0 = clock(model.device)
        hidden, logits = engine.verify(tokens, buf)
        logits.argmax(dim=-1)
        if propose is not None:
            propose(hidden[0], [])
        t1 = clock(model.device)
        engine.rewind(at)
        if i >= warmup:
            times.append(t1 - t0)
    return statistics.median(times)


def forward_probe(engine: StepEngine, buf: TreeBuffers, heads=None) -> tuple[Callable[[object], None], list]:
    """(on_step, times): an on_step callback that times the bare verify work (`time_verify`, once) right after
    every step, at that step's context, and the list it fills (seconds). Step and bare forward then alternate,
    so a load change on a shared machine hits both alike: decoder_overhead = median step / median of these."""
    times: list[float] = []

    def on_step(step) -> None:  # a decode.Step; only its timing point matters
        times.append(time_verify(engine, buf, heads, repeats=1, warmup=0))
    return on_step, times

