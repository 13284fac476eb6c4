"""Where each token of a step sits and what it sees: a tree's constants on the device (built once per tree) and the
4-D additive masks of the prefill and of a verify step over the whole static cache."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from workbench.trees.tree import MEDUSA_TOPK, Tree, load_tree, tree_arrays


def tree_buffers(tree: Tree, topk: int = MEDUSA_TOPK, device=None) -> dict[str, torch.Tensor]:
    """tree.tree_arrays as tensors (on `device` when given)."""
    return {k: torch.as_tensor(v, device=device) for k, v in tree_arrays(tree, topk).items()}


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


@torch.inference_mode()  # inference tensors, as everything the compiled step reads
def tree_setup(tree, model, num_heads: int | None = None) -> TreeBuffers:
    if isinstance(tree, TreeBuffers):
        return tree
    t = load_tree(tree, num_heads=num_heads)
    topk = t.max_rank + 1
    b = tree_buffers(t, topk, device=model.device)
    return TreeBuffers(tree=t, topk=topk, depth=t.depth, tree_indices=b["tree_indices"], depths=b["position_ids"],
                       parents=b["parents"].clamp(min=0), retrieve=b["retrieve_indices"],
                       visible=b["attn_mask"] != 0, paths=[()] + t.sorted_paths)


@torch.inference_mode()
def root_setup(model) -> TreeBuffers:
    """The 1-token step of vanilla greedy as a tree of the root alone: it runs through the same verify path."""
    zero = torch.zeros(1, dtype=torch.long, device=model.device)
    return TreeBuffers(tree=None, topk=1, depth=0, tree_indices=zero, depths=zero, parents=zero,
                       retrieve=zero[None], visible=torch.ones(1, 1, dtype=torch.bool, device=model.device),
                       paths=[()])



def additive_mask(seen: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bool visibility -> additive mask in the model's dtype (0 visible, dtype-min blocked: no NaN rows)."""
    return torch.where(seen, torch.zeros((), dtype=dtype, device=seen.device), torch.finfo(dtype).min)


def prefill_mask(lengths: torch.Tensor, width: int, columns: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """lengths [B] of right-padded prompts -> [B, 1, T, C]: row t sees columns <= t of its own prompt."""
    rows = torch.arange(width, device=columns.device)                                      # [T]
    seen = (columns[None, None] <= rows[None, :, None]) & (columns[None, None] < lengths[:, None, None])
    return additive_mask(seen, dtype)[:, None]


def step_mask(lengths: torch.Tensor, pointer: torch.Tensor, columns: torch.Tensor, visible: torch.Tensor,
              dtype: torch.dtype) -> torch.Tensor:
    """[B, 1, N, C]: each sequence's prefix columns < L_b (lengths [B]), the tree's own block at [P, P + N)
    (P = pointer [], a tensor: the compiled step does not specialise on it) with visible [N, N] inside it."""
    n = visible.shape[0]
    rel = columns - pointer                                                                # [C]
    block = visible[:, rel.clamp(0, n - 1)] & ((rel >= 0) & (rel < n))[None]               # [N, C]
    seen = (columns[None] < lengths[:, None])[:, None] | block[None]                       # [B, N, C]
    return additive_mask(seen, dtype)[:, None]


def tree_candidates(root: torch.Tensor, head_tokens: torch.Tensor, buf: TreeBuffers) -> torch.Tensor:
    """root [B], head_tokens [B, depth, topk] -> tree tokens [B, N] (node 0 = root)."""
    flat = torch.cat([root[:, None], head_tokens.flatten(1)], dim=1)  # [B, 1 + depth*topk]
    return flat[:, buf.tree_indices]
