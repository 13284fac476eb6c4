"""Where each token of a step sits and what it sees: a tree's constants on the device (built once per tree) and the
4-D additive masks of the prefill and of a verify step over the whole static cache."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from workbench.trees.tree import MEDUSA_TOPK, Tree, load_tree, tree_arrays


def tree_buffers(tree: Tree, topk: int = MEDUSA_TOPK, device=None) -> dict[str, torch.Tensor]:
    """tree.tree_arrays as tensors (on `device` when given)."""
    return {k: torch.as_tensor(v, device=device) for k, v in tree_arrays(tree, topk).items()}


class TreeTensors(NamedTuple):
    """What a step reads of a tree: shapes depend on the node count N and the depth bound D only."""

    tree_indices: torch.Tensor  # [N] into [root] + head_1 top-k + ... + head_D top-k
    depths: torch.Tensor        # [N] 0 for the root
    parents: torch.Tensor       # [N] parent node, 0 for the root
    visible: torch.Tensor       # [N, N] bool: node i sees node j (itself, its ancestors)
    ancestors: torch.Tensor     # [N, D+1] node i's path by depth, then i repeated


@dataclass
class TreeBuffers:
    """A tree's constants on the model's device, built once per tree and reused across prompts, batches and runs:
    nothing about the tree is recomputed inside a step.

    The step reads only `tensors()`: five tensors whose shapes depend on the node count N and the depth bound D
    alone, so any tree of N nodes and depth <= D (one chosen per step on the device, too) runs through the same
    compiled graph. Acceptance scores every node's own root-to-node path (`ancestors`), not a leaf list, whose
    length would depend on the tree's shape."""

    tree: Tree | None           # None for the root-only step of vanilla decoding
    topk: int                   # top-k taken from each head (max rank + 1)
    depth: int                  # heads used (D)
    tree_indices: torch.Tensor  # [N] into [root] + head_1 top-k + ... + head_depth top-k
    depths: torch.Tensor        # [N] 0 for the root
    parents: torch.Tensor       # [N] parent node, 0 for the root (its own parent: never read)
    visible: torch.Tensor       # [N, N] bool: node i sees node j (itself, its ancestors)
    paths: list                 # [N] the top-k rank path of each node, () for the root
    ancestors: torch.Tensor | None = None  # [N, D+1] node i's path: its node at depth j, then i itself repeated
    rows: list = field(default_factory=list)  # ancestors on the host: a step names its path without a device read

    def __post_init__(self):
        if self.ancestors is None:
            self.ancestors = path_nodes(self.parents, self.depths, self.depth)
        if not self.rows:
            self.rows = [r[: d + 1] for r, d in zip(self.ancestors.tolist(), self.depths.tolist())]

    @property
    def size(self) -> int:
        """Tokens in one verify forward of one sequence (tree nodes + the root)."""
        return self.tree_indices.shape[0]

    def tensors(self) -> TreeTensors:
        """The step's tree inputs."""
        return TreeTensors(self.tree_indices, self.depths, self.parents, self.visible, self.ancestors)


def batched(tree, batch: int) -> TreeTensors:
    """A step's tree inputs with a leading batch dimension: a static tree's expanded (views, no copy), a per-step
    tree's (select_tree: one tree per sequence) as they are. `tree`: TreeTensors or TreeBuffers."""
    tree = tree.tensors() if isinstance(tree, TreeBuffers) else tree
    if tree.depths.dim() == 2:
        return tree
    return TreeTensors(*(t.expand(batch, *t.shape) for t in tree))


def select_tree(envelope: TreeTensors, logp: torch.Tensor, n: int) -> tuple[TreeTensors, torch.Tensor]:
    """A per-step tree for each sequence (trees/dynamic.py's rule, on the device with fixed shapes): the n nodes of
    the envelope (M nodes + the root, Medusa's order) with the highest path score, the sum of the heads'
    log-probabilities logp [B, D, k] along the path, accumulated depth by depth in float32 as the reference does,
    ties to the earlier envelope node (a stable sort). -> (that tree's TreeTensors, [B, n+1, ...], in envelope order
    so parents come first; its nodes' envelope indices [B, n+1], the root first)."""
    batch, m = logp.shape[0], envelope.tree_indices.shape[0]
    flat = torch.cat([logp.new_zeros(batch, 1), logp.flatten(1).float()], dim=1)          # [B, 1 + D*k]
    own = flat[:, envelope.tree_indices]                                                   # [B, M+1] root: 0
    score = torch.zeros_like(own)                                                          # [B, M+1]
    for d in range(1, envelope.ancestors.shape[1]):  # parents first: score[child] = score[parent] + logp(child)
        score = score + torch.where(envelope.depths >= d, own[:, envelope.ancestors[:, d]], 0.0)
    best = torch.sort(score[:, 1:], dim=1, descending=True, stable=True).indices[:, :n]   # [B, n]
    nodes = torch.cat([best.new_zeros(batch, 1), best.sort(dim=1).values + 1], dim=1)     # [B, n+1]
    where = torch.zeros(batch, m, dtype=torch.long, device=logp.device)                    # [B, M+1]
    where.scatter_(1, nodes, torch.arange(n + 1, device=logp.device).expand(batch, -1))  # envelope -> own index
    anc = envelope.ancestors[nodes]                                                        # [B, n+1, D+1]
    tree = TreeTensors(tree_indices=envelope.tree_indices[nodes], depths=envelope.depths[nodes],
                       parents=where.gather(1, envelope.parents[nodes]),
                       visible=envelope.visible[nodes[:, :, None], nodes[:, None, :]],
                       ancestors=where.gather(1, anc.flatten(1)).view(anc.shape))
    return tree, nodes


def path_nodes(parents: torch.Tensor, depths: torch.Tensor, depth: int) -> torch.Tensor:
    """parents [N], depths [N] -> [N, D+1]: row i holds the nodes of i's root-to-i path by depth, then i repeated
    (a copy of the last pair: compaction writes the same row twice, acceptance reads the same decision twice)."""
    par, dep = parents.tolist(), depths.tolist()
    rows = []
    for i in range(len(par)):
        chain = [i]
        while chain[-1] != 0:
            chain.append(par[chain[-1]])
        chain = chain[::-1]
        assert len(chain) == dep[i] + 1, "parents and depths disagree"
        rows.append(chain + [i] * (depth + 1 - len(chain)))
    return torch.tensor(rows, dtype=torch.long, device=parents.device)


@torch.inference_mode()  # inference tensors, as everything the compiled step reads
def tree_setup(tree, model, num_heads: int | None = None) -> TreeBuffers:
    if isinstance(tree, TreeBuffers):
        return tree
    t = load_tree(tree, num_heads=num_heads)
    topk = t.max_rank + 1
    b = tree_buffers(t, topk, device=model.device)
    return TreeBuffers(tree=t, topk=topk, depth=t.depth, tree_indices=b["tree_indices"], depths=b["position_ids"],
                       parents=b["parents"].clamp(min=0), visible=b["attn_mask"] != 0, paths=[()] + t.sorted_paths)


@torch.inference_mode()
def root_setup(model) -> TreeBuffers:
    """The 1-token step of vanilla greedy as a tree of the root alone: it runs through the same step."""
    zero = torch.zeros(1, dtype=torch.long, device=model.device)
    return TreeBuffers(tree=None, topk=1, depth=0, tree_indices=zero, depths=zero, parents=zero,
                       visible=torch.ones(1, 1, dtype=torch.bool, device=model.device), paths=[()])


def additive_mask(seen: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool visibility -> additive mask in the model's dtype (0 visible, dtype-min blocked: no NaN rows)."""
    return torch.where(seen, torch.zeros((), dtype=dtype, device=seen.device), torch.finfo(dtype).min)


def prefill_mask(lengths: torch.Tensor, width: int, columns: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """lengths [B] of right-padded prompts -> [B, 1, T, C]: row t sees columns <= t of its own prompt."""
    rows = torch.arange(width, device=columns.device)                                      # [T]
    seen = (columns[None, None] <= rows[None, :, None]) & (columns[None, None] < lengths[:, None, None])
    return additive_mask(seen, dtype)[:, None]


def step_mask(lengths: torch.Tensor, base: torch.Tensor, columns: torch.Tensor, visible: torch.Tensor,
              dtype: torch.dtype) -> torch.Tensor:
    """[B, 1, N, C]: each sequence's prefix columns < L_b (lengths [B]) and its own block at [base_b, base_b + N)
    (base [B], tensors: the compiled step does not specialise on them) with visible [N, N] (or its own tree's
    [B, N, N]) inside it. A tree step
    puts every block at one column P; a 1-token step writes each token at its own L_b."""
    n = visible.shape[-1]
    vis = visible if visible.dim() == 3 else visible.expand(base.shape[0], n, n)          # [B, N, N]
    rel = columns[None] - base[:, None]                                                    # [B, C]
    block = vis.gather(2, rel.clamp(0, n - 1)[:, None].expand(-1, n, -1))                 # [B, N, C]
    seen = (columns[None] < lengths[:, None])[:, None] | (block & ((rel >= 0) & (rel < n))[:, None])  # [B, N, C]
    return additive_mask(seen, dtype)[:, None]


def tree_candidates(root: torch.Tensor, head_tokens: torch.Tensor, tree_indices: torch.Tensor) -> torch.Tensor:
    """root [B], head_tokens [B, depth, topk], tree_indices [N] (or each sequence's [B, N]) -> tree tokens [B, N]
    (node 0 = root)."""
    flat = torch.cat([root[:, None], head_tokens.flatten(1)], dim=1)  # [B, 1 + depth*topk]
    if tree_indices.dim() == 2:
        return flat.gather(1, tree_indices)
    return flat[:, tree_indices]
