"""The Medusa decoding loop for B prompts at once: propose with the heads, verify the trees, accept a path per
sequence; vanilla greedy is the same loop with a root-only tree.

One step (B sequences, each at its own length L_b):
  1. each sequence's root token (from the base logits at its last accepted position) is already known;
  2. the heads, run on those B hidden states only, give each head's top-k; `tree_indices` turns
     [root] + top-k's into each sequence's N tree tokens;
  3. ONE forward of B x N tokens with a 4-D mask (each sequence's own prefix + the node's ancestors) and
     position_ids = L_b + depth; logits only for those rows;
  4. acceptance picks, per sequence, the longest path the base model agrees with and the token after it;
  5. each sequence keeps only its accepted nodes (moved next to its own prefix): lengths are ragged;
  6. ONE host read per step (accepted node, length, tokens and next root of every sequence) tells the host what
     was emitted; a sequence that hit EOS or its budget stops emitting, its slot computes on until the batch ends.
Steps 2-5 and the packing are one function (step.py: decode_step), which the engine (runtime/engine.py: static
cache, device state, torch.compile) runs compiled once per (batch, tree size, rule); this module runs the loop
and owns its results.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch

from workbench import WorkbenchError
from workbench.core.notes import FieldError
from workbench.core import speed
from workbench.decode.acceptance import Acceptance, first_token, seed_for, uniforms
from workbench.decode.step import RECORDED_TOPK, Plan, decode_step, unpack
from workbench.runtime.engine import StepEngine
from workbench.runtime.forward import (Proposer, check_window, clock, head_logits, logits_of, new_cache,
                                       prefill)
from workbench.runtime.generation import context_length, eos_ids
from workbench.runtime.heads import check_heads_fit
from workbench.runtime.treemask import TreeBuffers, root_setup, tree_setup
from workbench.trees.dynamic import DynamicPolicy

# ----------------------------------------------------------------------------------------------- results


@dataclass
class Step:
    tokens: list[int]           # emitted this step: root + accepted tree tokens (cut at EOS / max_new_tokens)
    path: tuple[int, ...]       # top-k ranks of the deepest accepted node; () = only the root
    tree_size: int              # tokens in this step's forward (tree nodes + root; 1 for vanilla)
    time_s: float               # wall time of the whole batched step, up to its host read (which waits for the device)
    cache_len: int              # this sequence's cache length after the step (= prompt + tokens emitted so far)


@dataclass
class DecodeResult:
    method: str                 # "medusa" | "vanilla"
    prompt_len: int
    prefill_s: float
    steps: list[Step] = field(default_factory=list)
    stop_reason: str = ""       # "eos" | "max_new_tokens" | "context"
    text: str | None = None
    tree: str | None = None
    batch_size: int = 1         # sequences decoded side by side (the steps' times are the batch's)
    compile_s: float = 0.0      # compiling / capturing the step for this batch and tree, before any step (untimed)
    chosen_by: list = field(default_factory=list, repr=False)  # record(): what each emitted token was chosen from

    def record(self, logits: torch.Tensor) -> None:
        """logits [rows, V]: the rows that chose the next emitted tokens, in order (row k of the whole run chose
        token k). Keeps the top RECORDED_TOPK values and ids and max|logit| per row, on the device (no sync):
        `divergences` reads the logits this run really computed, not a recomputation."""
        top = logits.topk(min(RECORDED_TOPK, logits.shape[-1]), dim=-1)
        self.chosen_by.append((top.values, top.indices, logits.abs().amax(dim=-1)))  # [rows, K], [rows, K], [rows]

    def record_top(self, values: torch.Tensor, ids: torch.Tensor, max_abs: torch.Tensor) -> None:
        """`record` of rows whose top-K the step kept already: values, ids [rows, K], max_abs [rows] (device)."""
        self.chosen_by.append((values, ids, max_abs))

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
    def tokens_per_step(self) -> float:
        return speed.tokens_per_step([self]) if self.steps else 1.0  # a stepless result: its first token only

    @property
    def mean_step_s(self) -> float:
        return speed.mean_step_s([self]) if self.steps else 0.0

    @property
    def tokens_per_s(self) -> float:
        return speed.goodput([self]) if self.total_s > 0 else 0.0

    def to_dict(self) -> dict:
        return dict(method=self.method, tree=self.tree, token_ids=self.token_ids, text=self.text,
                    prompt_len=self.prompt_len, batch_size=self.batch_size, new_tokens=len(self.token_ids),
                    steps=len(self.steps),
                    tokens_per_step=self.tokens_per_step, tokens_per_s=self.tokens_per_s,
                    prefill_s=self.prefill_s, decode_s=self.decode_s, mean_step_s=self.mean_step_s,
                    compile_s=self.compile_s,
                    stop_reason=self.stop_reason, accepted_lengths=self.accepted_lengths,
                    per_step=[asdict(s) | {"path": list(s.path)} for s in self.steps])


# ------------------------------------------------------------------------------------- prompts, limits, tree tokens

def _one_prompt(ids, model) -> torch.Tensor:
    """list / [T] / [1, T] -> LongTensor [T] on the model's device, checked against the vocabulary and context."""
    ids = torch.as_tensor(ids, dtype=torch.long)
    if ids.ndim == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.ndim != 1:
        raise WorkbenchError(f"a prompt must be one sequence of token ids, got shape {list(ids.shape)}")
    if ids.numel() == 0:
        raise WorkbenchError("the prompt is empty: give at least one token")
    vocab = model.get_input_embeddings().weight.shape[0]
    if int(ids.min()) < 0 or int(ids.max()) >= vocab:
        raise WorkbenchError(f"prompt token ids must be in [0, {vocab}) for this model, got {int(ids.min())}..{int(ids.max())}")
    ctx = context_length(model)
    if ctx is not None and ids.numel() >= ctx:
        raise WorkbenchError(f"the prompt is {ids.numel()} tokens but the model's context is {ctx}: shorten it")
    return ids.to(model.device)


def _prompts(input_ids, model) -> tuple[list[torch.Tensor], bool]:
    """One prompt (ids list, [T] or [1, T]) or several (a list of id lists / 1-D tensors, or [B, T] with B > 1)
    -> ([T_b] tensors, whether several were given: the result is then a list in prompt order)."""
    if isinstance(input_ids, torch.Tensor):
        batched = input_ids.ndim == 2 and input_ids.shape[0] > 1
        items = list(input_ids) if batched else [input_ids]
    else:
        batched = len(input_ids) > 0 and isinstance(input_ids[0], (list, tuple, torch.Tensor))
        items = list(input_ids) if batched else [input_ids]
    if not items:
        raise WorkbenchError("no prompts given: give at least one")
    return [_one_prompt(p, model) for p in items], batched


def _budget(model, prompt_len: int, max_new_tokens: int) -> tuple[int, str]:
    """New tokens allowed, and the stop reason when that many are emitted."""
    if max_new_tokens < 1:
        raise FieldError("max_new_tokens", "below_one", f"{{field}} {max_new_tokens}: must be >= 1")
    ctx = context_length(model)
    if ctx is not None and prompt_len + max_new_tokens > ctx:
        return ctx - prompt_len, "context"
    return max_new_tokens, "max_new_tokens"



# ----------------------------------------------------------------------------------------------- the loop

def _cut(new: list[int], emitted: int, limit: int, eos: set[int]) -> tuple[list[int], bool]:
    """Trim a step's tokens at the budget and just after the first EOS; True when that EOS ends the run."""
    new = new[: limit - emitted]
    for i, t in enumerate(new):
        if t in eos:
            return new[: i + 1], True
    return new, False


def _decode_text(tokenizer, ids: list[int]) -> str | None:
    return tokenizer.decode(ids, skip_special_tokens=True) if tokenizer is not None else None


def _per_sequence(propose, batch: int) -> Proposer:
    """A caller's proposer of one sequence (hidden [H], tokens -> [depth, topk]; tests feed known continuations),
    or a list of them, one per prompt -> a batched Proposer."""
    fns = list(propose) if isinstance(propose, (list, tuple)) else [propose] * batch
    if len(fns) != batch:
        raise WorkbenchError(f"{len(fns)} proposers for {batch} prompts: give one, or one per prompt")
    return lambda hidden, seqs: torch.stack([torch.as_tensor(f(hidden[b], seqs[b])) for b, f in enumerate(fns)])



@dataclass
class Request:
    """One call of the decoding loop: what to decode and how (the method's tree, proposer and rule)."""

    method: str                          # "medusa" | "vanilla"
    input_ids: object                    # one prompt or several (`_prompts`)
    buf: TreeBuffers                     # the tree (the root alone for vanilla)
    max_new_tokens: int
    rule: Acceptance = field(default_factory=Acceptance)
    propose: Proposer | None = None      # batched proposer (None: vanilla)
    custom: bool = False                 # `propose` is a caller's per-sequence function (reads tokens on the host)
    eos_token_id: object = None
    on_step: Callable | None = None
    record: bool = False                 # keep the logits that chose each token
    select: int = 0                      # a per-step tree of this many nodes from `buf` (its envelope); 0: buf itself


@torch.inference_mode()
def _generate(model, tokenizer, req: Request, engine: StepEngine | None, heads=None):
    """The decoding loop of both methods (vanilla: `req.buf` is the root alone, nothing proposed)."""
    buf, rule = req.buf, req.rule
    prompts, batched = _prompts(req.input_ids, model)
    batch, dev = len(prompts), model.device
    budgets = [_budget(model, len(p), req.max_new_tokens) for p in prompts]
    check_window(model, max(len(p) + lim for p, (lim, _) in zip(prompts, budgets)))
    eos, seed = eos_ids(model, tokenizer, req.eos_token_id), seed_for(rule)
    propose = _per_sequence(req.propose, batch) if req.custom else None
    engine = engine or StepEngine(model, compile=False)
    name = buf.tree.name or None if buf.tree is not None else None
    if req.select:
        name = DynamicPolicy(req.select, buf.tree).name
    plan = Plan(rule, buf.depth, buf.topk, given=propose is not None, record=req.record, select=req.select)
    size = req.select + 1 if req.select else buf.size  # tokens one sequence verifies per step

    t0 = clock(dev)
    hidden = engine.prefill(prompts, engine.room(max(lim for lim, _ in budgets), [buf]))       # [B, H]
    first = logits_of(model, hidden)                                                           # [B, V]
    draw = uniforms(torch.tensor(seed), torch.tensor(0), (batch,), "cpu").to(dev) if rule.kind == "nucleus" else None
    root = first_token(first, rule, draw)                                                      # [B]
    engine.begin(root, seed)
    prefill_s = clock(dev) - t0
    given = torch.zeros(batch, buf.depth, buf.topk, dtype=torch.long, device=dev) if propose else None
    # compiled: the step's compilation / CUDA graph capture happens here, untimed
    compile_s = engine.prepare(decode_step, buf, plan.key, (heads, given, plan))
    results = [DecodeResult(req.method, len(p), prefill_s, tree=name, batch_size=batch, compile_s=compile_s)
               for p in prompts]
    if req.record:
        for b, r in enumerate(results):
            r.record(first[b:b + 1])
    seqs = [p.tolist() for p in prompts]
    if propose is not None:  # a caller's proposer reads the tokens on the host (tests): one more read, before the loop
        for s, t in zip(seqs, root.tolist()):
            s.append(t)
    emitted = [0] * batch
    while any(engine.host_alive):
        t0 = time.perf_counter()  # the device is idle here: the previous step ended in its read
        if propose is not None:
            given = propose(engine.state.hidden, seqs).to(dev, torch.long)                   # [B, depth, topk]
        out = engine.step(decode_step, buf, plan.key, (heads, given, plan))
        packed = out[0] if req.record else out                                                # [B, D+4]
        read = packed.tolist()                                                                # THE host read
        step_s = time.perf_counter() - t0
        engine.advance([r[1] for r in read])
        steps = [None] * batch
        for b, row in enumerate(read):
            if not engine.host_alive[b]:
                continue
            last, m, path, nxt = unpack(row, buf.depth)
            limit, reason = budgets[b]
            new, hit_eos = _cut(path[:m], emitted[b], limit, eos)
            if req.record:  # the rows that chose the m tokens after this step's root (slices: no read)
                results[b].record_top(*(t[b, :m].clone() for t in out[1:]))
            emitted[b] += len(new)
            seqs[b][-1:] = new + [nxt]  # the root was already there; the next root stands last
            if hit_eos or emitted[b] >= limit:
                results[b].stop_reason = "eos" if hit_eos else reason
                engine.finish(b, len(prompts[b]) + emitted[b])
            steps[b] = Step(new, buf.paths[last], size, step_s, len(prompts[b]) + emitted[b])
            results[b].steps.append(steps[b])
        if req.on_step is not None:
            req.on_step(steps if batched else steps[0])
    for r in results:
        r.text = _decode_text(tokenizer, r.token_ids)
    return results if batched else results[0]


def medusa_generate(model, heads, tokenizer, input_ids, tree, max_new_tokens: int = 256,
                    acceptance: Acceptance | None = None, eos_token_id=None, propose=None,
                    on_step: Callable | None = None, engine: StepEngine | None = None, record: bool = False):
    """Medusa decoding of one prompt (-> DecodeResult) or several at once (a list of prompts -> a list of
    DecodeResult in prompt order; ONE forward of B x N tree tokens per step). `tree`: prebuilt TreeBuffers
    (`tree_setup`, reused across prompts), a Tree or any spec `load_tree` reads; `eos_token_id`: int or list
    (default: the generation config's, as `generate`; [] never stops early); `propose` replaces the heads: a
    function of one sequence (hidden [H], tokens -> [depth, topk]) or one per prompt (tests feed known
    continuations); `on_step` sees each Step as it is made (a list of B Steps, None for finished sequences,
    when several prompts were given); `engine`: a StepEngine to reuse (its cache and compiled step) across
    generations, else a fresh eager one; `record`: keep the logits that chose each token (divergence reports).
    A `trees.dynamic.DynamicPolicy` as `tree`: each step, each sequence verifies the N nodes of its envelope with
    the best path scores of its own heads' log-probabilities, chosen inside the step (decode/step.py)."""
    if heads is not None:
        check_heads_fit(heads, model)
    select = 0
    if isinstance(tree, DynamicPolicy):
        if propose is not None:
            raise WorkbenchError("a per-step tree is chosen from the heads' log-probabilities: it takes heads, not a "
                                 "propose function")
        select, tree = tree.nodes, tree.envelope
    buf = tree_setup(tree, model, heads.num_heads if heads is not None else None)
    if heads is not None and buf.depth > heads.num_heads:
        raise WorkbenchError(f"the tree is {buf.depth} deep but there are only {heads.num_heads} heads")
    if propose is None and heads is None:
        raise WorkbenchError("medusa_generate needs heads (or a propose function)")
    return _generate(model, tokenizer, Request("medusa", input_ids, buf, max_new_tokens, acceptance or Acceptance(),
                                               propose, propose is not None, eos_token_id, on_step, record, select),
                     engine, None if propose is not None else heads)


def vanilla_generate(model, tokenizer, input_ids, max_new_tokens: int = 256, eos_token_id=None,
                     on_step: Callable | None = None, engine: StepEngine | None = None, record: bool = False):
    """Plain greedy decoding of one prompt or several, one token per sequence per forward: the same loop, engine
    (static cache, 4-D mask, compiled step when asked), prefill and lm_head path as Medusa, with a tree of the
    root alone."""
    return _generate(model, tokenizer, Request("vanilla", input_ids, root_setup(model), max_new_tokens,
                                               eos_token_id=eos_token_id, on_step=on_step, record=record), engine)


@torch.inference_mode()
def first_proposal(model, heads, input_ids, topk: int) -> dict:
    """What the first Medusa step of a prompt is built from, to show it (the app labels tree nodes with it): the
    base model's top-k next tokens and each head's top-k at the last prompt position, with probabilities (fp32
    softmax). Plain lists: {"base": {"ids": [topk], "probs": [topk]}, "heads": [{"ids", "probs"}] * K}, ranks
    in order (base ids[0] is the root, heads[k]["ids"][i] is the token of node rank i at depth k + 1)."""
    ids = _one_prompt(input_ids, model)[None]                            # [1, T]
    check_heads_fit(heads, model)
    vocab = model.get_output_embeddings().weight.shape[0]
    if not 1 <= topk <= vocab:
        raise WorkbenchError(f"top-k {topk}: must be in [1, {vocab}] (the vocabulary)")
    hidden = prefill(model, ids, new_cache(model))                       # [H]
    base = torch.softmax(logits_of(model, hidden), dim=-1).topk(topk)    # [topk]
    per_head = torch.softmax(head_logits(heads, model, hidden[None], heads.num_heads)[0].float(), dim=-1).topk(topk)  # [K, topk]
    return dict(base=dict(ids=base.indices.tolist(), probs=base.values.tolist()),
                heads=[dict(ids=i, probs=p) for i, p in zip(per_head.indices.tolist(), per_head.values.tolist())])
