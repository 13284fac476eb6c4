"""The whole decoding step as one function of tensors, compiled by the engine once per (batch, tree size, plan):
propose with the heads (their vocabulary projection and top-k), tree candidates, the verify forward, acceptance,
the hidden-state gather, KV compaction and packing. Its only output is the packed tensor the host reads once per
step; everything the next step needs stays on the device (engine.StepState). No host sync and no data-dependent
shape inside: acceptance is masks, argmaxes and gathers, compaction one index copy over all layers, sampling
counter-based uniforms, so the step is one graph and, on CUDA, one CUDA graph.

The tree comes in as tensors (TreeBuffers.tensors(): [N], [N, N], [N, D+1]), not as constants baked into the
graph, so any tree of N nodes and depth <= D runs through the same graph: one chosen per step on the device too.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from workbench.decode.acceptance import Acceptance, accept, uniforms
from workbench.runtime.engine import StepState, verify_block
from workbench.runtime.forward import head_logits, lm_logits
from workbench.runtime.kvcache import move_rows
from workbench.runtime.treemask import TreeTensors, batched, select_tree, tree_candidates

RECORDED_TOPK = 8  # logits kept per emitted token for divergence reports (a near-tie may involve 3+ tokens)


@dataclass(frozen=True)
class Plan:
    """What a step's graph specialises on besides (B, N): the rule, how the tree's tokens are proposed and whether
    the rows that chose each token are kept (divergence reports)."""

    rule: Acceptance
    depth: int                   # heads run (the tree's depth bound D)
    topk: int                    # top-k taken from each head
    given: bool = False          # proposals come from the host (a caller's proposer), not the heads
    record: bool = False
    select: int = 0              # a per-step tree of this many nodes chosen from the tree given (0: that tree)

    @property
    def key(self) -> tuple:
        """What changes the step's graph, and only that: the rule's kind and its own settings (greedy has none: two
        greedy plans that differ in an unused typical threshold share one graph), the heads run, their top-k, where
        proposals come from, whether the chosen rows are returned (`record` adds outputs) and a per-step size."""
        r = self.rule
        own = {"greedy": (), "typical": (r.temperature, r.epsilon, r.delta, r.entropy),
               "nucleus": (r.temperature, r.top_p)}[r.kind]
        return (r.kind, *own, self.depth, self.topk, self.given, self.record, self.select)


def unpack(row: list[int], depth: int) -> tuple[int, int, list[int], int]:
    """One sequence's row of the packed read -> (last node, of the tree given: the envelope's for a per-step tree;
    tokens accepted incl. the root; the path's tokens [D+1] (root first, the last one repeated past the path); the
    next root)."""
    return row[0], row[1], row[2:depth + 3], row[depth + 3]


def keep(cache, state: StepState, path: torch.Tensor, count: torch.Tensor) -> None:
    """Move the accepted path of each sequence (nodes path [B, D+1], root first; count_b of them) from the tree
    block at P = max L to right after its prefix. One copy per stacked cache (all layers at once)."""
    take = torch.arange(path.shape[1], device=path.device)[None].minimum(count[:, None] - 1)  # [B, D+1]
    src = path.gather(1, take) + state.write[:, None]                                      # [B, D+1]
    move_rows(cache, src, state.lengths[:, None] + take)


def decode_step(model, cache, state: StepState, columns: torch.Tensor, tree: TreeTensors, heads, proposal, plan: Plan):
    """One step for B sequences: state (roots, last hidden states, lengths) -> the packed read [B, D+4]: last
    node, count, the path's D+1 tokens, the next root (and, recording, the top-k logits of the path's rows).
    tree: TreeBuffers.tensors(); proposal [B, D, topk] when `plan.given`, else the heads propose. With
    `plan.select` the tree given is an envelope and each sequence verifies its own tree of that many nodes, the
    best path scores of its heads' log-probabilities (treemask.select_tree); `last` is then the envelope's node."""
    batch = state.root.shape[0]
    rows = torch.arange(batch, device=state.root.device)
    picked = None  # a per-step tree's nodes in the envelope [B, n+1]
    if plan.depth == 0:
        head_tokens = state.root.new_zeros(batch, 0, 1)                                    # [B, 0, 1]
    elif plan.given:
        head_tokens = proposal                                                             # [B, D, topk]
    elif plan.select:
        logp, head_tokens = torch.log_softmax(head_logits(heads, model, state.hidden, plan.depth).float(),
                                              dim=-1).topk(plan.topk, dim=-1)              # [B, D, topk] x 2
        tree, picked = select_tree(tree, logp, plan.select)                                # [B, n+1, ...]
    else:
        head_tokens = head_logits(heads, model, state.hidden, plan.depth).topk(plan.topk, dim=-1).indices
    tree = batched(tree, batch)
    n = tree.tree_indices.shape[1]
    tokens = tree_candidates(state.root, head_tokens, tree.tree_indices)                  # [B, N]
    hidden = verify_block(model, cache, tokens, state.lengths, state.write, columns, tree.visible, tree.depths,
                          n == 1)
    logits = lm_logits(model, hidden)                                                      # [B, N, V] model dtype
    uniform = None
    if plan.rule.kind == "nucleus":
        state.counter.add_(1)
        uniform = uniforms(state.seed, state.counter, (batch, n), tokens.device)           # [B, N]
    last, count, nxt = accept(logits, tokens, tree, plan.rule, uniform)                    # [B] x 3
    state.hidden.copy_(hidden[rows, last])                                                 # [B, H]
    nodes = tree.ancestors[rows, last]                                                     # [B, D+1]
    if n > 1:  # a plain step wrote each token at its own L_b already
        keep(cache, state, nodes, count)
    state.lengths.add_(count * state.alive)
    state.root.copy_(nxt)
    named = last if picked is None else picked[rows, last]                                 # [B] node of the tree given
    packed = torch.cat([named[:, None], count[:, None], tokens.gather(1, nodes), nxt[:, None]], dim=1)
    if not plan.record:
        return packed                                                                      # [B, D+4]
    chosen = logits.gather(1, nodes[..., None].expand(-1, -1, logits.shape[-1])).float()   # [B, D+1, V]
    top = chosen.topk(min(RECORDED_TOPK, chosen.shape[-1]), dim=-1)
    return packed, top.values, top.indices, chosen.abs().amax(dim=-1)

