"""Live Medusa decoding on any HF Llama-family model, and the vanilla greedy baseline on the same cache path.

One Medusa step (batch 1):
  1. the root token (from the base logits at the last accepted position) is already known;
  2. the heads, run on that position's hidden state only, give each head's top-k; `tree_indices` turns
     [root] + top-k's into the tree's N tokens;
  3. ONE forward of the N tokens with a 4-D mask (every cached position + the node's ancestors) and
     position_ids = cached length + depth; logits only for those N rows;
  4. acceptance picks the longest path the base model agrees with, and the token that follows it;
  5. the cache keeps only the accepted nodes (moved next to the prefix), the write pointer moves after them.
The cache is preallocated (StepEngine: static layers, a 4-D mask over all of it, fixed shapes per tree, so the
step can run under torch.compile); vanilla greedy runs through the same step as a root-only tree.
No modelling code is copied: the model's own attention reads the 4-D mask (eager and sdpa).
"""
from __future__ import annotations

import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, StaticLayer

from workbench import WorkbenchError
from workbench.generation import context_length, eos_ids, text_config
from workbench.tree import Tree, load_tree, tree_buffers

ACCEPTANCE_KINDS = ("greedy", "typical", "nucleus")
RECORDED_TOPK = 8  # logits kept per emitted token for divergence reports (a near-tie may involve 3+ tokens)

# propose(hidden [H], tokens so far incl. the root: list[int]) -> LongTensor [depth, topk]
Proposer = Callable[[torch.Tensor, list], torch.Tensor]


# ----------------------------------------------------------------------------------------------- settings, results

@dataclass
class Acceptance:
    """How a tree node is accepted. greedy: token == argmax (lossless). typical (Medusa paper §2.3.1): p(x) >
    min(epsilon, delta * exp(-H(p))) at `temperature`, root greedy, longest path, ties by likelihood. nucleus:
    one sample per node from the top_p nucleus, a child is accepted when it equals its parent's sample (so the
    output is distributed exactly as vanilla nucleus sampling)."""

    kind: str = "greedy"
    temperature: float = 0.0
    epsilon: float = 0.09
    delta: float = 0.3
    top_p: float = 0.8
    seed: int | None = None

    def __post_init__(self):
        if self.kind not in ACCEPTANCE_KINDS:
            raise WorkbenchError(f"acceptance '{self.kind}': unknown (use {', '.join(ACCEPTANCE_KINDS)})")
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise WorkbenchError(f"--temperature {self.temperature}: must be a finite number >= 0")
        if not 0 < self.epsilon <= 1:
            raise WorkbenchError(f"--epsilon {self.epsilon}: must be in (0, 1]")
        if not (self.delta >= 0 and math.isfinite(self.delta)):
            raise WorkbenchError(f"--delta {self.delta}: must be a finite number >= 0")
        if not 0 < self.top_p <= 1:
            raise WorkbenchError(f"--top-p {self.top_p}: must be in (0, 1]")


@dataclass
class Step:
    tokens: list[int]           # emitted this step: root + accepted tree tokens (cut at EOS / max_new_tokens)
    path: tuple[int, ...]       # top-k ranks of the deepest accepted node; () = only the root
    tree_size: int              # tokens in this step's forward (tree nodes + root; 1 for vanilla)
    time_s: float               # wall time of the whole step (synchronised on CUDA)
    cache_len: int              # cache length after the step (= prompt + tokens emitted so far)


@dataclass
class DecodeResult:
    method: str                 # "medusa" | "vanilla"
    prompt_len: int
    prefill_s: float
    steps: list[Step] = field(default_factory=list)
    stop_reason: str = ""       # "eos" | "max_new_tokens" | "context"
    text: str | None = None
    tree: str | None = None
    chosen_by: list = field(default_factory=list, repr=False)  # record(): what each emitted token was chosen from

    def record(self, logits: torch.Tensor) -> None:
        """logits [rows, V]: the rows that chose the next emitted tokens, in order (row k of the whole run chose
        token k). Keeps the top RECORDED_TOPK values and ids and max|logit| per row, on the device (no sync):
        `divergences` reads the logits this run really computed, not a recomputation."""
        top = logits.topk(min(RECORDED_TOPK, logits.shape[-1]), dim=-1)
        self.chosen_by.append((top.values, top.indices, logits.abs().amax(dim=-1)))  # [rows, K], [rows, K], [rows]

    def choice(self, k: int) -> dict | None:
        """The logits row that chose token k: top-K values and ids (descending) and max|logit|; None if not recorded."""
        for values, ids, max_abs in self.chosen_by:
            if k < values.shape[0]:
                return dict(top=values[k].tolist(), ids=ids[k].tolist(), max_abs=float(max_abs[k]))
            k -= values.shape[0]
        return None

    @property
    def token_ids(self) -> list[int]:
        return [t for s in self.steps for t in s.tokens]

    @property
    def accepted_lengths(self) -> list[int]:
        """Tokens emitted per step (1 + accepted tree tokens): colour the text by step with these."""
        return [len(s.tokens) for s in self.steps]

    @property
    def decode_s(self) -> float:
        return sum(s.time_s for s in self.steps)

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_s

    @property
    def acceleration_rate(self) -> float:
        return len(self.token_ids) / max(len(self.steps), 1)

    @property
    def mean_step_s(self) -> float:
        return self.decode_s / max(len(self.steps), 1)

    @property
    def tokens_per_s(self) -> float:
        return len(self.token_ids) / self.total_s if self.total_s > 0 else 0.0

    def to_dict(self) -> dict:
        return dict(method=self.method, tree=self.tree, token_ids=self.token_ids, text=self.text,
                    prompt_len=self.prompt_len, new_tokens=len(self.token_ids), steps=len(self.steps),
                    acceleration_rate=self.acceleration_rate, tokens_per_s=self.tokens_per_s,
                    prefill_s=self.prefill_s, decode_s=self.decode_s, mean_step_s=self.mean_step_s,
                    stop_reason=self.stop_reason, accepted_lengths=self.accepted_lengths,
                    per_step=[asdict(s) | {"path": list(s.path)} for s in self.steps])


def compare(medusa: DecodeResult, vanilla: DecodeResult) -> dict:
    """speedup (tokens/s ratio), overhead (mean Medusa step / mean vanilla step) and exactness vs greedy."""
    return dict(vanilla_tokens_per_s=vanilla.tokens_per_s,
                speedup=medusa.tokens_per_s / vanilla.tokens_per_s if vanilla.tokens_per_s else float("nan"),
                overhead=medusa.mean_step_s / vanilla.mean_step_s if vanilla.mean_step_s else float("nan"),
                matches_greedy=medusa.token_ids == vanilla.token_ids)


# ----------------------------------------------------------------------------------------------- divergences

# Rounding bound on a top-2 logit margin, in units of u * max|logit| (u = the dtype's unit roundoff, half of
# torch.finfo(dtype).eps: 2^-8 bf16, 2^-11 fp16, 2^-24 fp32), per dtype. Why that scale: a 1-token and an
# N-token (tree) forward of the same position round differently (other matmul blocking, attention kernels and
# masks); the drift in the hidden state reaches the logits through the lm_head, i.e. in proportion to the row's
# logit scale max|logit|, and each logit is finally rounded to the dtype (<= u|l| each, 2u max|l| on a margin).
# Why these constants: `bench/rounding.py` measures |margin in the tree run - margin in the 1-token run| at
# every position both runs share (CPU, mc_sim_7b_63; bench/results/rounding-*.json). In bf16/fp16, sums
# accumulate in fp32 and the one rounding of each op's output to the dtype dominates: at most 4.4 units in bf16
# (demo SmolLM2-135M, 4-8 Alpaca-eval prompts x 128), 3.1 in fp16 (demo, 3 prompts), 2.8 on tiny models: bound 16.
# In fp32 nothing masks the reduction-order differences of the fp32 sums themselves (~sqrt(n) u per length-n dot
# product, every layer), and they grow along a generation: at most 18.7 units on the demo (3 prompts x 128), 91
# on a tiny Llama (4 prompts x 512): bound 512 (still ~1e-3 of a logit at most: a real preference is no tie).
ROUNDING_UNITS = {torch.bfloat16: 16.0, torch.float16: 16.0, torch.float32: 512.0}


def unit_roundoff(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps / 2


def rounding_bound(dtype: torch.dtype, max_abs_logit: float) -> float:
    """How far rounding in `dtype` can move a top-2 logit margin between two computations of the same position."""
    return ROUNDING_UNITS.get(dtype, ROUNDING_UNITS[torch.float32]) * unit_roundoff(dtype) * max_abs_logit


def divergences(medusa: DecodeResult, vanilla: DecodeResult, dtype: torch.dtype) -> list[dict]:
    """Where Medusa's output first differs from vanilla greedy's, classified; [] when they are identical.

    Only the FIRST divergence of a prompt is reported: after it the two runs continue different texts, so later
    differences say nothing about the decoder. The logits are the ones each run really computed (`record`): at the
    divergence both runs saw the same prefix, so a teacher-forced recomputation would give both the same logits
    and could not tell a rounding flip from a bug. margin_* is each run's top-2 logit margin there; gap_* is how
    far that run ranked its own token above the other run's. "near-tie": each run emitted its own argmax, and
    gap_medusa + gap_vanilla <= `rounding_bound` -- the pair's logit difference went from +gap_vanilla to
    -gap_medusa, a move rounding alone can make (the wider tree forward computes attention and matmuls over other
    shapes than the 1-token step, and bf16/fp16 round those differently). Anything else is "mismatch": a bug (a
    token that was not its run's argmax, or a flip wider than rounding can explain; also, conservatively, a tie
    of more than RECORDED_TOPK tokens). One output ending early (an EOS the other did not emit at that point) is a
    divergence at its length. Returns [{position, medusa_token, vanilla_token, margin_medusa, margin_vanilla,
    gap_medusa, gap_vanilla, bound, kind}] (0 or 1 items).
    """
    a, b = medusa.token_ids, vanilla.token_ids
    if a == b:
        return []
    pos = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    tok_m, tok_v = (a[pos] if pos < len(a) else None), (b[pos] if pos < len(b) else None)
    cm, cv = medusa.choice(pos), vanilla.choice(pos)

    def gap(c, own, other):  # own token's logit above the other's, if own was this run's argmax and both are known
        if c is None or own not in c["ids"] or other not in c["ids"]:
            return None
        mine = c["top"][c["ids"].index(own)]
        return mine - c["top"][c["ids"].index(other)] if mine == c["top"][0] else None

    gm, gv = gap(cm, tok_m, tok_v), gap(cv, tok_v, tok_m)
    known = [c for c in (cm, cv) if c]
    bound = rounding_bound(dtype, max(c["max_abs"] for c in known)) if known else None
    tie = gm is not None and gv is not None and gm + gv <= bound
    margin = lambda c: c["top"][0] - c["top"][1] if c else None  # noqa: E731
    return [dict(position=pos, medusa_token=tok_m, vanilla_token=tok_v, margin_medusa=margin(cm),
                 margin_vanilla=margin(cv), gap_medusa=gm, gap_vanilla=gv, bound=bound,
                 kind="near-tie" if tie else "mismatch")]


def divergence_counts(found: list[dict]) -> dict:
    """{near_tie_divergences, mismatches} over the divergences of several prompts."""
    return dict(near_tie_divergences=sum(d["kind"] == "near-tie" for d in found),
                mismatches=sum(d["kind"] == "mismatch" for d in found))


# ----------------------------------------------------------------------------------------------- prompts, limits

def _input_ids(input_ids, model) -> torch.Tensor:
    """list / [T] / [1, T] -> LongTensor [1, T] on the model's device, checked against the context."""
    ids = torch.as_tensor(input_ids, dtype=torch.long)
    if ids.ndim == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.ndim != 1:
        raise WorkbenchError(f"input_ids must be one sequence (batch 1), got shape {list(ids.shape)}")
    if ids.numel() == 0:
        raise WorkbenchError("the prompt is empty: give at least one token")
    vocab = model.get_input_embeddings().weight.shape[0]
    if int(ids.min()) < 0 or int(ids.max()) >= vocab:
        raise WorkbenchError(f"prompt token ids must be in [0, {vocab}) for this model, got {int(ids.min())}..{int(ids.max())}")
    ctx = context_length(model)
    if ctx is not None and ids.numel() >= ctx:
        raise WorkbenchError(f"the prompt is {ids.numel()} tokens but the model's context is {ctx}: shorten it")
    return ids.to(model.device)[None]


def _budget(model, prompt_len: int, max_new_tokens: int) -> tuple[int, str]:
    """New tokens allowed, and the stop reason when that many are emitted."""
    if max_new_tokens < 1:
        raise WorkbenchError(f"--max-new-tokens {max_new_tokens}: must be >= 1")
    ctx = context_length(model)
    if ctx is not None and prompt_len + max_new_tokens > ctx:
        return ctx - prompt_len, "context"
    return max_new_tokens, "max_new_tokens"


def _clock(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


# ----------------------------------------------------------------------------------------------- model calls

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


def head_proposer(heads, model, depth: int, topk: int) -> Proposer:
    """The heads' top-k at one position: only the `depth` heads the tree uses, on one hidden row."""
    lm_head = model.get_output_embeddings()

    def propose(hidden: torch.Tensor, tokens: list) -> torch.Tensor:
        if heads.tied:  # the heads' `depth` rows through the base lm_head: the fast few-rows path of logits_of
            logits = logits_of(model, heads.features(hidden, depth))  # [depth, V]
        else:
            logits = heads(hidden, lm_head, n=depth)  # [depth, V]
        return logits.topk(topk, dim=-1).indices  # [depth, topk]
    return propose


def tree_candidates(root: torch.Tensor, head_tokens: torch.Tensor, buf: TreeBuffers) -> torch.Tensor:
    """root [], head_tokens [depth, topk] -> tree tokens [N] (node 0 = root)."""
    flat = torch.cat([root.view(1), head_tokens.reshape(-1)])  # [1 + depth*topk]
    return flat[buf.tree_indices]


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
        t0 = _clock(model.device)
        hidden, logits = engine.verify(tokens, buf)
        logits.argmax(dim=-1)
        if propose is not None:
            propose(hidden[0], [])
        t1 = _clock(model.device)
        engine.rewind(at)
        if i >= warmup:
            times.append(t1 - t0)
    return statistics.median(times)


def forward_probe(engine: StepEngine, buf: TreeBuffers, heads=None) -> tuple[Callable[[Step], None], list]:
    """(on_step, times): an on_step callback that times the bare verify work (`time_verify`, once) right after
    every step, at that step's context, and the list it fills (seconds). Step and bare forward then alternate,
    so a load change on a shared machine hits both alike: decoder_overhead = median step / median of these."""
    times: list[float] = []

    def on_step(step: Step) -> None:
        times.append(time_verify(engine, buf, heads, repeats=1, warmup=0))
    return on_step, times


# ----------------------------------------------------------------------------------------------- acceptance

def best_path(ok: torch.Tensor, score: torch.Tensor, buf: TreeBuffers) -> tuple[int, int]:
    """ok [N] (node accepted given its parent; ok[0] = root), score [N] -> (retrieve row, nodes accepted incl.
    root). Longest accepted prefix over all root-to-leaf rows; ties by the summed score (log-likelihood)."""
    idx = buf.retrieve.clamp(min=0)                                     # [R, D+1]
    run = (ok[idx] & (buf.retrieve >= 0)).long().cumprod(dim=1)         # [R, D+1] 1 while accepted
    length = run.sum(dim=1)                                             # [R]
    total = (run * score[idx]).sum(dim=1)                               # [R]
    total = torch.where(length == length.max(), total, torch.full_like(total, -math.inf))
    row = total.argmax()
    row, count = torch.stack([row, length[row]]).tolist()  # the one read of the path per step
    return row, count


def _parent_tokens_ok(tokens: torch.Tensor, target: torch.Tensor, buf: TreeBuffers) -> torch.Tensor:
    """tokens [N], target [N] (what each node's logits emit) -> ok [N]: node i's token == its parent's target."""
    ok = tokens == target[buf.parents.clamp(min=0)]
    ok[0] = True
    return ok


def accept_greedy(logits: torch.Tensor, tokens: torch.Tensor, buf: TreeBuffers):
    """logits [N, V], tokens [N] -> (row, length, next token []). Lossless: the output is plain greedy's."""
    target = logits.argmax(dim=-1)  # [N]
    row, length = best_path(_parent_tokens_ok(tokens, target, buf), torch.zeros_like(logits[:, 0]), buf)
    return row, length, target[buf.retrieve[row, length - 1]]


def _probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """[M, V] -> probabilities at temperature; temperature 0 is the one-hot argmax (the greedy limit)."""
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.shape[-1]).to(logits.dtype)
    return torch.softmax(logits / temperature, dim=-1)


def accept_typical(logits: torch.Tensor, tokens: torch.Tensor, buf: TreeBuffers, temperature: float,
                   epsilon: float, delta: float):
    """Medusa §2.3.1: accept x if p(x) > min(epsilon, delta * exp(-H(p))); the next token is greedy."""
    p = _probs(logits, temperature)                                      # [N, V]
    entropy = -torch.special.xlogy(p, p).sum(dim=-1)                     # [N]
    threshold = torch.clamp(delta * torch.exp(-entropy), max=epsilon)    # [N]
    parent = buf.parents.clamp(min=0)                                    # [N]
    p_tok = p[parent, tokens]                                            # [N] p_parent(node token)
    ok = p_tok > threshold[parent]
    ok[0] = True
    score = torch.log(p_tok.clamp(min=1e-30))
    score[0] = 0
    row, length = best_path(ok, score, buf)
    return row, length, logits[buf.retrieve[row, length - 1]].argmax()


def sample_nucleus(logits: torch.Tensor, temperature: float, top_p: float, generator=None) -> torch.Tensor:
    """logits [M, V] -> one token per row from the top_p nucleus at temperature (argmax at temperature 0)."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    p = torch.softmax(logits / temperature, dim=-1)
    sp, order = p.sort(dim=-1, descending=True)                          # [M, V]
    drop = (sp.cumsum(dim=-1) - sp) >= top_p                             # keep the smallest prefix reaching top_p
    sp = sp.masked_fill(drop, 0)
    pick = torch.multinomial(sp, 1, generator=generator)                 # [M, 1]
    return order.gather(-1, pick)[:, 0]


def accept_nucleus(logits: torch.Tensor, tokens: torch.Tensor, buf: TreeBuffers, temperature: float,
                   top_p: float, generator=None):
    """One nucleus sample per node; a child is accepted iff it equals its parent's sample, and the sample at the
    last accepted node is the next token: every emitted token is a nucleus sample given its prefix."""
    target = sample_nucleus(logits, temperature, top_p, generator)      # [N]
    row, length = best_path(_parent_tokens_ok(tokens, target, buf), torch.zeros_like(logits[:, 0]), buf)
    return row, length, target[buf.retrieve[row, length - 1]]


def accept(logits: torch.Tensor, tokens: torch.Tensor, buf: TreeBuffers, acc: Acceptance, generator=None):
    if acc.kind == "greedy":
        return accept_greedy(logits, tokens, buf)
    if acc.kind == "typical":
        return accept_typical(logits, tokens, buf, acc.temperature, acc.epsilon, acc.delta)
    return accept_nucleus(logits, tokens, buf, acc.temperature, acc.top_p, generator)


def first_token(logits: torch.Tensor, acc: Acceptance, generator=None) -> torch.Tensor:
    """logits [V] -> the root of the first step: greedy (greedy, typical) or a nucleus sample."""
    if acc.kind == "nucleus":
        return sample_nucleus(logits[None], acc.temperature, acc.top_p, generator)[0]
    return logits.argmax()


def _generator(acc: Acceptance, device: torch.device):
    if acc.kind != "nucleus" or acc.temperature == 0:
        return None
    g = torch.Generator(device=device)
    if acc.seed is not None:
        g.manual_seed(acc.seed)
    else:
        g.seed()
    return g


# ----------------------------------------------------------------------------------------------- generation loops

def _cut(new: list[int], emitted: int, limit: int, eos: set[int]) -> tuple[list[int], bool]:
    """Trim a step's tokens at the budget and just after the first EOS; True when that EOS ends the run."""
    new = new[: limit - emitted]
    for i, t in enumerate(new):
        if t in eos:
            return new[: i + 1], True
    return new, False


def _decode_text(tokenizer, ids: list[int]) -> str | None:
    return tokenizer.decode(ids, skip_special_tokens=True) if tokenizer is not None else None


@torch.inference_mode()
def medusa_generate(model, heads, tokenizer, input_ids, tree, max_new_tokens: int = 256,
                    acceptance: Acceptance | None = None, eos_token_id=None, propose: Proposer | None = None,
                    on_step: Callable[[Step], None] | None = None, engine: StepEngine | None = None) -> DecodeResult:
    """Medusa decoding of one prompt (batch 1). `tree`: prebuilt TreeBuffers (`tree_setup`, reused across
    prompts), a Tree or any spec `load_tree` reads; `eos_token_id`: int or list (default: the generation
    config's, as `generate`; [] never stops early); `propose` replaces the heads (tests feed known
    continuations); `on_step` sees each Step as it is made (live views); `engine`: a StepEngine to reuse (its
    cache and compiled step) across generations, else a fresh eager one."""
    acc = acceptance or Acceptance()
    ids = _input_ids(input_ids, model)                                   # [1, T]
    prompt_len = ids.shape[1]
    limit, limit_reason = _budget(model, prompt_len, max_new_tokens)
    check_window(model, prompt_len + limit)
    if heads is not None:
        from workbench.models import check_heads_fit
        check_heads_fit(heads, model)
    buf = tree_setup(tree, model, heads.num_heads if heads is not None else None)
    if heads is not None and buf.depth > heads.num_heads:
        raise WorkbenchError(f"the tree is {buf.depth} deep but there are only {heads.num_heads} heads")
    if propose is None:
        if heads is None:
            raise WorkbenchError("medusa_generate needs heads (or a propose function)")
        propose = head_proposer(heads, model, buf.depth, buf.topk)
    eos, gen = eos_ids(model, tokenizer, eos_token_id), _generator(acc, model.device)
    engine = engine or StepEngine(model, compile=False)

    t0 = _clock(model.device)
    hidden = engine.prefill(ids, limit + buf.size)                       # [H]
    first = logits_of(model, hidden)                                     # [V]
    root = first_token(first, acc, gen)                                  # []
    result = DecodeResult("medusa", prompt_len, _clock(model.device) - t0, tree=buf.tree.name or None)
    result.record(first[None])
    seq = ids[0].tolist() + [int(root)]                                  # prompt + emitted + the next root
    while True:
        t0 = _clock(model.device)
        head_tokens = propose(hidden, seq)                               # [depth, topk]
        tokens = tree_candidates(root, head_tokens.to(root.device), buf)  # [N]
        tree_hidden, logits = engine.verify(tokens, buf)                 # [N, H], [N, V]
        row, length, root = accept(logits, tokens, buf, acc, gen)
        nodes = buf.retrieve[row, :length]                               # [m] accepted nodes, root first
        result.record(logits[nodes])                                     # they chose the m tokens after the root
        engine.keep(buf, row, length)
        hidden = tree_hidden[nodes[-1]]                                  # [H] the last accepted position
        *path, nxt = torch.cat([tokens[nodes], root.view(1)]).tolist()  # this step's tokens, the next root
        new, hit_eos = _cut(seq[-1:] + path[1:], len(seq) - 1 - prompt_len, limit, eos)
        if len(new) < length:
            engine.rewind(engine.length - (length - len(new)))
        seq[-1:] = new + [nxt]
        step = Step(new, buf.paths[buf.rows[row][length - 1]], buf.size, _clock(model.device) - t0, engine.length)
        result.steps.append(step)
        if on_step is not None:
            on_step(step)
        if hit_eos or len(seq) - 1 - prompt_len >= limit:
            result.stop_reason = "eos" if hit_eos else limit_reason
            break
    result.text = _decode_text(tokenizer, result.token_ids)
    return result


@torch.inference_mode()
def vanilla_generate(model, tokenizer, input_ids, max_new_tokens: int = 256, eos_token_id=None,
                     on_step: Callable[[Step], None] | None = None, engine: StepEngine | None = None) -> DecodeResult:
    """Plain greedy decoding, one token per forward, on the same engine (static cache, 4-D mask, compiled step
    when asked), prefill and lm_head path as Medusa: a 1-node "tree" of the root alone."""
    ids = _input_ids(input_ids, model)
    prompt_len = ids.shape[1]
    limit, limit_reason = _budget(model, prompt_len, max_new_tokens)
    check_window(model, prompt_len + limit)  # the engine's 4-D mask is full attention, for vanilla too
    eos = eos_ids(model, tokenizer, eos_token_id)
    engine = engine or StepEngine(model, compile=False)
    buf = root_setup(model)
    t0 = _clock(model.device)
    first = logits_of(model, engine.prefill(ids, limit + 1))            # [V]
    token = first.argmax()                                               # []
    result = DecodeResult("vanilla", prompt_len, _clock(model.device) - t0)
    result.record(first[None])
    emitted, nxt = 0, int(token)
    while True:
        t0 = _clock(model.device)
        new, hit_eos = _cut([nxt], emitted, limit, eos)
        _, logits = engine.verify(token.view(1), buf)                   # [1, V]
        engine.keep(buf, 0, 1)
        token = logits[0].argmax()
        result.record(logits)
        nxt = int(token)
        emitted += 1
        step = Step(new, (), 1, _clock(model.device) - t0, engine.length)
        result.steps.append(step)
        if on_step is not None:
            on_step(step)
        if hit_eos or emitted >= limit:
            result.stop_reason = "eos" if hit_eos else limit_reason
            break
    result.text = _decode_text(tokenizer, result.token_ids)
    return result
