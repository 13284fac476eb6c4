"""Write a tree in the formats other decoders import, with a warning wherever the target engine would not take it
as is. Formats checked against each project's own code/docs:

- medusa: `name = [[0], [0, 0], ...]` as in Medusa's medusa_choices.py; its generate_medusa_buffers hard-codes
  TOPK=10, so a rank >= 10 would index the next head's guesses.
- json: `{"name", "medusa_choices"}`, readable by every workbench command.
- trtllm: the `--medusa_choices="[[0], ...]"` argument of TensorRT-LLM's examples/run.py (same list for
  MedusaDecodingConfig(medusa_choices=...)); the engine is built for at most max_draft_len draft tokens (63 in
  its examples) and the tree may not be deeper than the engine's Medusa heads.
- vllm: vLLM's SpeculativeConfig `speculative_token_tree`, a string of a list of tuples sorted breadth-first;
  vLLM requires num_speculative_tokens == number of nodes. vLLM drafts trees with EAGLE-style proposers that,
  per level, take the top-c children of EVERY node (c = nodes at the level / nodes at the level above), so only
  trees of that shape are drafted as written.
- eagle: EAGLE-1 `choices` (eagle/model/choices.py, e.g. mc_sim_7b_63); its buffers use top-k 10.
"""
from __future__ import annotations

import json

from workbench import WorkbenchError
from workbench.tree import Tree, load_tree

FORMATS = ("medusa", "json", "trtllm", "vllm", "eagle")
TOPK_MEDUSA = 10  # Medusa's and EAGLE-1's buffer code hard-code top-10
TRTLLM_MAX_DRAFT_LEN = 63


def _py_list(tree: Tree) -> str:
    return "[" + ", ".join("[" + ", ".join(map(str, p)) + "]" for p in tree.paths) + "]"


def _identifier(name: str) -> str:
    ident = "".join(c if c.isalnum() or c == "_" else "_" for c in name) or "medusa_choices"
    return ident if not ident[0].isdigit() else "tree_" + ident


def _rank_warning(tree: Tree, engine: str) -> list[str]:
    if tree.max_rank >= TOPK_MEDUSA:
        bad = next(p for p in tree.paths if max(p) >= TOPK_MEDUSA)
        return [f"path {list(bad)} has rank {max(bad)}: {engine} builds its buffers from each head's top-"
                f"{TOPK_MEDUSA}, so ranks must be < {TOPK_MEDUSA} (raise TOPK there, or use --max-rank {TOPK_MEDUSA})"]
    return []


def vllm_uniform(tree: Tree) -> bool:
    """True when every node at depth d-1 has children exactly ranks 0..c_d-1 (the only shape vLLM drafts)."""
    per_depth = [0] * tree.depth
    for p in tree.paths:
        per_depth[len(p) - 1] += 1
    shape = {p for p in tree.paths}
    level = [()]
    for d in range(tree.depth):
        c = per_depth[d] // len(level)
        nxt = [q + (r,) for q in level for r in range(c)]
        if c * len(level) != per_depth[d] or not all(q in shape for q in nxt):
            return False
        level = nxt
    return True


def export_tree(tree: Tree, fmt: str, name: str | None = None, heads: int | None = None,
                max_draft_len: int = TRTLLM_MAX_DRAFT_LEN) -> tuple[str, list[str]]:
    """(text to write, warnings). `heads` (when known) bounds the depth: a deeper tree is a WorkbenchError."""
    if fmt not in FORMATS:
        raise WorkbenchError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
    tree = load_tree(tree, num_heads=heads)
    name = name or tree.name or "medusa_choices"
    warns: list[str] = []
    if fmt == "medusa":
        warns += _rank_warning(tree, "Medusa's generate_medusa_buffers")
        return f"{_identifier(name)} = {_py_list(tree)}\n", warns
    if fmt == "json":
        return json.dumps({"name": name, "medusa_choices": tree.as_lists()}) + "\n", warns
    if fmt == "trtllm":
        if tree.nodes > max_draft_len:
            warns.append(f"tree has {tree.nodes} nodes but a TensorRT-LLM Medusa engine takes at most max_draft_len="
                         f"{max_draft_len} draft tokens: rebuild the engine with max_draft_len >= {tree.nodes} "
                         "or use a smaller --budget")
        if heads is None:
            warns.append(f"TensorRT-LLM needs num_medusa_heads >= tree depth {tree.depth} "
                         "(pass --heads to check it here)")
        return f'--medusa_choices="{_py_list(tree)}"\n', warns
    if fmt == "vllm":
        bfs = sorted(tree.paths, key=lambda p: (len(p), p))
        if not vllm_uniform(tree):
            warns.append("vLLM's tree drafter gives every node of a level the same number of children (its top-c), "
                         "so it will not draft this irregular tree as written; use a dense tree "
                         "(workbench optimize --dense ...) for vLLM")
        # vLLM requires num_speculative_tokens == number of nodes, so the fragment carries both.
        cfg = {"num_speculative_tokens": tree.nodes, "speculative_token_tree": str(bfs)}
        return json.dumps(cfg) + "\n", warns
    # eagle
    warns += _rank_warning(tree, "EAGLE-1's generate_tree_buffers")
    return f"{_identifier(name)} = {_py_list(tree)}\n", warns
