"""The Medusa decoding loop: propose with the heads, verify the tree, accept a path; vanilla greedy beside it.

One Medusa step (batch 1):
  1. the root token (from the base logits at the last accepted position) is already known;
  2. the heads, run on that position's hidden state only, give each head's top-k; `tree_indices` turns
     [root] + top-k's into the tree's N tokens;
  3. ONE forward of the N tokens with a 4-D mask (every cached position + the node's ancestors) and
     position_ids = cached length + depth; logits only for those N rows;
  4. acceptance picks the longest path the base model agrees with, and the token that follows it;
  5. the cache keeps only the accepted nodes (moved next to the prefix), the write pointer moves after them.
Steps 3 and 5 are the model work of engine.py (StepEngine: static cache, 4-D mask, torch.compile); this module
chooses the tokens. The acceptance rules live here, so a new rule touches this file and the CLI/app option lists.
Vanilla greedy runs through the same step as a root-only tree.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch

from workbench import WorkbenchError
from workbench.engine import (Proposer, StepEngine, TreeBuffers, check_window, clock, head_logits, head_proposer,
                              logits_of, new_cache, prefill, root_setup, tree_setup)
from workbench.generation import context_length, eos_ids
from workbench.heads import check_heads_fit

ACCEPTANCE_KINDS = ("greedy", "typical", "nucleus")
RECORDED_TOPK = 8  # logits kept per emitted token for divergence reports (a near-tie may involve 3+ tokens)


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


# ------------------------------------------------------------------------------------- prompts, limits, tree tokens

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


def tree_candidates(root: torch.Tensor, head_tokens: torch.Tensor, buf: TreeBuffers) -> torch.Tensor:
    """root [], head_tokens [depth, topk] -> tree tokens [N] (node 0 = root)."""
    flat = torch.cat([root.view(1), head_tokens.reshape(-1)])  # [1 + depth*topk]
    return flat[buf.tree_indices]


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

    t0 = clock(model.device)
    hidden = engine.prefill(ids, limit + buf.size)                       # [H]
    first = logits_of(model, hidden)                                     # [V]
    root = first_token(first, acc, gen)                                  # []
    result = DecodeResult("medusa", prompt_len, clock(model.device) - t0, tree=buf.tree.name or None)
    result.record(first[None])
    seq = ids[0].tolist() + [int(root)]                                  # prompt + emitted + the next root
    while True:
        t0 = clock(model.device)
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
        step = Step(new, buf.paths[buf.rows[row][length - 1]], buf.size, clock(model.device) - t0, engine.length)
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
    t0 = clock(model.device)
    first = logits_of(model, engine.prefill(ids, limit + 1))            # [V]
    token = first.argmax()                                               # []
    result = DecodeResult("vanilla", prompt_len, clock(model.device) - t0)
    result.record(first[None])
    emitted, nxt = 0, int(token)
    while True:
        t0 = clock(model.device)
        new, hit_eos = _cut([nxt], emitted, limit, eos)
        _, logits = engine.verify(token.view(1), buf)                   # [1, V]
        engine.keep(buf, 0, 1)
        token = logits[0].argmax()
        result.record(logits)
        nxt = int(token)
        emitted += 1
        step = Step(new, (), 1, clock(model.device) - t0, engine.length)
        result.steps.append(step)
        if on_step is not None:
            on_step(step)
        if hit_eos or emitted >= limit:
            result.stop_reason = "eos" if hit_eos else limit_reason
            break
    result.text = _decode_text(tokenizer, result.token_ids)
    return result


@torch.inference_mode()
def first_proposal(model, heads, input_ids, topk: int) -> dict:
    """What the first Medusa step of a prompt is built from, to show it (the app labels tree nodes with it): the
    base model's top-k next tokens and each head's top-k at the last prompt position, with probabilities (fp32
    softmax). Plain lists: {"base": {"ids": [topk], "probs": [topk]}, "heads": [{"ids", "probs"}] * K}, ranks
    in order (base ids[0] is the root, heads[k]["ids"][i] is the token of node rank i at depth k + 1)."""
    ids = _input_ids(input_ids, model)                                   # [1, T]
    check_heads_fit(heads, model)
    vocab = model.get_output_embeddings().weight.shape[0]
    if not 1 <= topk <= vocab:
        raise WorkbenchError(f"top-k {topk}: must be in [1, {vocab}] (the vocabulary)")
    hidden = prefill(model, ids, new_cache(model))                       # [H]
    base = torch.softmax(logits_of(model, hidden), dim=-1).topk(topk)    # [topk]
    per_head = torch.softmax(head_logits(heads, model, hidden, heads.num_heads).float(), dim=-1).topk(topk)  # [K, topk]
    return dict(base=dict(ids=base.indices.tolist(), probs=base.values.tolist()),
                heads=[dict(ids=i, probs=p) for i, p in zip(per_head.indices.tolist(), per_head.values.tolist())])
