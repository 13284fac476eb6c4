"""FasterDecoding/Medusa's tree file: `name = [[0], [0, 0], ...]` as in medusa/model/medusa_choices.py. Its
generate_medusa_buffers hard-codes TOPK=10, so a rank >= 10 would index the next head's guesses."""
from __future__ import annotations

from workbench.export.common import Warn, header, py_list
from workbench.trees.tree import MEDUSA_TOPK, Tree

SUFFIX = ".py"
TARGET = ("FasterDecoding/Medusa as released (pip medusa-llm 0.1, 2023-09) and its main branch: "
          "medusa/model/medusa_choices.py, generate_medusa_buffers with TOPK=10")
DEFAULT_CHOICES = "mc_sim_7b_63"  # the tree both Medusa and EAGLE-1 use unless told otherwise


def identifier(name: str) -> str:
    ident = "".join(c if c.isalnum() or c == "_" else "_" for c in name) or "medusa_choices"
    return ident if not ident[0].isdigit() else "tree_" + ident


def rank_warnings(tree: Tree, builder: str) -> list[Warn]:
    """Buffers built from each head's top-10 (Medusa's and EAGLE-1's) cannot take a rank >= 10."""
    if tree.max_rank < MEDUSA_TOPK:
        return []
    bad = next(p for p in tree.paths if max(p) >= MEDUSA_TOPK)
    return [Warn("rank_topk", f"path {list(bad)} has rank {max(bad)}: {builder} builds its buffers from each head's "
                 f"top-{MEDUSA_TOPK}, so ranks must be < {MEDUSA_TOPK} (raise TOPK there, {{fix}})", "max_rank")]


def write_tree(tree: Tree, name: str, **_) -> tuple[str, list[Warn]]:
    note = ("# add it to medusa/model/medusa_choices.py and pass medusa_choices=" + identifier(name)
            + f" to medusa_generate (its default is {DEFAULT_CHOICES})\n")
    return (header(TARGET, "Medusa") + note + f"{identifier(name)} = {py_list(tree)}\n",
            rank_warnings(tree, "Medusa's generate_medusa_buffers"))
