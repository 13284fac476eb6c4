"""EAGLE-1's tree: `mc_sim_7b_63` in eagle/model/choices.py. The draft model (cnets.py init_tree) and the verifier
(ea_model.py eagenerate's tree_choices default) both read that global, so the export replaces it. The draft buffer
builder (utils_c.py generate_tree_buffers) indexes its per-level lists by the nodes that have children: a depth-1
tree has none and it fails, so depth-1 trees are refused."""
from __future__ import annotations

from workbench import WorkbenchError
from workbench.export.common import Warn, header, py_list
from workbench.export.medusa import DEFAULT_CHOICES, rank_warnings
from workbench.trees.tree import RankPath, Tree

SUFFIX = ".eagle.py"
TARGET = ("EAGLE-1 (SafeAILab/EAGLE before EAGLE-2; pip eagle-llm 1.x, last 1.2.1 of 2024-04): "
          "eagle/model/choices.py")


def eagle1_misdrafted(tree: Tree) -> list[RankPath]:
    """The nodes EAGLE-1's draft builder expands from the wrong parent. Its generate_tree_buffers
    (SafeAILab/EAGLE eagle/model/utils_c.py) feeds, level by level, only the nodes that have children, and finds a
    node's parent row in the previous level's top-k by counting parent changes among the nodes with children of
    its own level: a parent whose children are all leaves is not counted, so every later parent's row is off by
    one. E.g. [[0], [1], [0, 0], [1, 0], [1, 0, 0]]: [1, 0] is drafted from [0]'s row, so [1, 0, 0] continues
    [0, 0]'s text. Our decoder (and Medusa's buffers) read every node as written."""
    inner = sorted({p[:-1] for p in tree.paths if len(p) > 1}, key=lambda p: (len(p), p))  # nodes with children
    wrong = []
    for d in range(1, tree.depth):
        parents = [p for p in inner if len(p) == d]  # rows of level d's top-k, in EAGLE-1's order
        row, last = -1, None
        for n in (p for p in inner if len(p) == d + 1):
            if n[:-1] != last:
                row, last = row + 1, n[:-1]
            if parents.index(n[:-1]) != row:
                wrong.append(n)
    return wrong


def misdrafted_warnings(tree: Tree) -> list[Warn]:
    wrong = eagle1_misdrafted(tree)
    if not wrong:
        return []
    return [Warn("eagle_misdrafted", f"EAGLE-1's draft builder (utils_c.py generate_tree_buffers) expands {len(wrong)} "
                 f"node(s) from another parent's draft, e.g. {list(wrong[0])} (a node whose children are all leaves "
                 "precedes one with grandchildren at that level): those subtrees hold other tokens than written and "
                 "accept less; give each earlier node with children a grandchild too, or drop the deeper branch")]


def write_tree(tree: Tree, name: str, strict: bool = False, **_) -> tuple[str, list[Warn]]:
    """A depth-1 tree is refused: a WorkbenchError with strict (the CLI), else (the app, which renders every
    format at once) the refusal is the only warning and the text a comment saying why."""
    if tree.depth < 2:
        why = (f"EAGLE-1 cannot take a depth-1 tree ({tree.nodes} nodes): its draft-buffer builder indexes the "
               "nodes that have children and fails when there are none; use a tree of depth >= 2")
        if strict:
            raise WorkbenchError(why)
        return f"# not exported: {why}\n", [Warn("eagle_depth1", why)]
    note = (f"# replaces the {DEFAULT_CHOICES} line of eagle/model/choices.py: both the draft model (cnets.py "
            f"init_tree) and the verifier (ea_model.py eagenerate) read that global; tree {name}, {tree.nodes} nodes\n")
    return (header(TARGET, "EAGLE-1") + note + f"{DEFAULT_CHOICES} = {py_list(tree)}\n",
            rank_warnings(tree, "EAGLE-1's generate_tree_buffers") + misdrafted_warnings(tree))
