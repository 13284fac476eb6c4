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
    (base [B], tensors: the compiled step does not specialise on them) with visible [N, N] inside it. A tree step
    puts every block at one column P; a 1-token step writes each token at its own L_b."""
    n = visible.shape[0]
    rel = columns[None] - base[:, None]                                                    # [B, C]
    block = visible[:, rel.clamp(0, n - 1)] & ((rel >= 0) & (rel < n))[None]               # [N, B, C]
    seen = (columns[None] < lengths[:, None])[:, None] | block.transpose(0, 1)             # [B, N, C]
    return additive_mask(seen, dtype)[:, None]


def tree_candidates(root: torch.Tensor, head_tokens: torch.Tensor, tree_indices: torch.Tensor) -> torch.Tensor:
    """root [B], head_tokens [B, depth, topk], tree_indices [N] -> tree tokens [B, N] (node 0 = root)."""
    flat = torch.cat([root[:, None], head_tokens.flatten(1)], dim=1)  # [B, 1 + depth*topk]
    return flat[:, tree_indices]
