"""The tree type: Medusa's `medusa_choices`, its validation, tree-attention buffers and stats.

A tree is a list of paths of 0-based top-k ranks, one path per node, with the root (the base model's own
token) implicit: `[1, 0]` is "the 2nd guess of head 1, then the 1st guess of head 2". Buffers follow Medusa's
`generate_medusa_buffers` exactly, so a tree tuned here drops into any Medusa-style decoder unchanged.
"""
from __future__ import annotations

import ast
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
import numpy as np

from workbench import WorkbenchError
from workbench.core.io import atomic_write_text

RankPath = tuple[int, ...]
REFERENCE_DIR = Path(__file__).resolve().parent.parent / "reference_trees"  # package data: works from a wheel too
MEDUSA_TOPK = 10  # Medusa's and EAGLE-1's buffer code take each head's top-10: the default top-k everywhere
MAX_RANK = 1 << 20  # above any vocabulary: a larger rank is a typo (and would overflow the int64 buffers)
MAX_NODES = 1 << 12  # the verify mask is nodes^2 per sequence; engines verify a few hundred nodes at most
MAX_DEPTH = 64  # one Medusa head per level; no engine drafts deeper (vLLM, TensorRT-LLM: tens of tokens)
TREE_VERSION = 1  # the "version" of the tree records this workbench writes (tree_record)


@dataclass(frozen=True)
class Tree:
    """Validated `medusa_choices`. `paths` keeps the user's order (it often encodes greedy build order)."""

    paths: tuple[RankPath, ...]
    name: str = ""

    @property
    def sorted_paths(self) -> list[RankPath]:
        """Medusa's node order: by depth, then lexicographically. Node i+1 of every buffer is sorted_paths[i]."""
        return sorted(self.paths, key=lambda p: (len(p), p))

    @property
    def nodes(self) -> int:
        return len(self.paths)

    @property
    def depth(self) -> int:
        return max(len(p) for p in self.paths)

    @property
    def max_rank(self) -> int:
        return max(max(p) for p in self.paths)

    def leaves(self) -> list[RankPath]:
        inner = {p[:-1] for p in self.paths}
        return [p for p in self.paths if p not in inner]

    def as_lists(self) -> list[list[int]]:
        return [list(p) for p in self.paths]

    def __len__(self) -> int:
        return len(self.paths)


# ----------------------------------------------------------------------------------------------- reading

def reference_trees() -> dict[str, Tree]:
    """The nine named trees of the Medusa project, shipped inside the package (workbench/reference_trees/)."""
    out = {}
    for f in sorted(REFERENCE_DIR.glob("*.json")):
        data = json.loads(f.read_text())
        out[data["name"]] = make_tree(data["medusa_choices"], name=data["name"])
    return out


def _literal(text: str, what: str):
    """Parse a JSON or Python literal (never eval); also `name = [...]` as Medusa's choices files write it."""
    text = text.strip()
    # literal_eval raises TypeError on e.g. {[1]: 2}; both parsers can hit the recursion limit on deep nesting.
    bad = (ValueError, TypeError, SyntaxError, MemoryError, RecursionError)
    try:
        return json.loads(text)
    except bad:
        pass
    try:
        return ast.literal_eval(text)
    except bad:
        pass
    try:
        module = ast.parse(text)
    except SyntaxError as e:
        raise WorkbenchError(f"{what}: not a JSON or Python list literal ({e.msg}, line {e.lineno})") from None
    except (MemoryError, RecursionError):
        raise WorkbenchError(f"{what}: not a JSON or Python list literal (nested too deeply)") from None
    for stmt in reversed(module.body):
        if isinstance(stmt, ast.Assign):
            try:
                return ast.literal_eval(stmt.value)
            except bad:
                continue
    raise WorkbenchError(f"{what}: not a JSON or Python list literal like [[0], [0, 0], [1]]")


def _choices_from(obj, what: str):
    if isinstance(obj, dict):
        if obj.get("version", TREE_VERSION) != TREE_VERSION:  # Medusa's own files carry none
            raise WorkbenchError(f"{what}: tree record version {str(obj['version'])[:20]!r}, but this workbench reads "
                                 f"version {TREE_VERSION}: write it again with `workbench optimize --out`")
        if "medusa_choices" not in obj:
            raise WorkbenchError(f"{what}: JSON object has no 'medusa_choices' key (keys: {', '.join(map(str, obj))})")
        obj = obj["medusa_choices"]
    return obj


def load_tree(spec, topk: int | None = None, num_heads: int | None = None) -> Tree:
    """Read a tree from a list, a JSON/Python file, a literal string, or a reference name; then validate it."""
    if isinstance(spec, Tree):
        validate(spec.paths, topk, num_heads)
        return spec
    if not isinstance(spec, str):
        return make_tree(spec, topk=topk, num_heads=num_heads)
    refs = {f.stem for f in REFERENCE_DIR.glob("*.json")}
    if spec in refs:
        data = json.loads((REFERENCE_DIR / f"{spec}.json").read_text())
        return make_tree(data["medusa_choices"], name=spec, topk=topk, num_heads=num_heads)
    file = Path(spec)
    looks_like_literal = spec.lstrip()[:1] in ("[", "(", "{")
    if not looks_like_literal:
        if not file.is_file():
            raise WorkbenchError(
                f"tree '{spec}': no such file or reference tree (reference names: {', '.join(sorted(refs))}; "
                "or give a literal like '[[0], [0, 0], [1]]')")
        try:
            text = file.read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise WorkbenchError(f"tree file {spec}: cannot read it ({e})") from None
        if not text.strip():
            raise WorkbenchError(f"tree file {spec} is empty: it should hold a list of paths or {{\"medusa_choices\": [...]}}")
        obj = _choices_from(_literal(text, f"tree file {spec}"), f"tree file {spec}")
        return make_tree(obj, name=file.stem, topk=topk, num_heads=num_heads)
    return make_tree(_choices_from(_literal(spec, "tree literal"), "tree literal"), topk=topk, num_heads=num_heads)


def make_tree(choices, name: str = "", topk: int | None = None, num_heads: int | None = None) -> Tree:
    if not isinstance(choices, (list, tuple)):
        raise WorkbenchError(f"tree must be a list of paths like [[0], [0, 0], [1]], got {type(choices).__name__}")
    paths = []
    for p in choices:
        if not isinstance(p, (list, tuple)) or not all(isinstance(r, int) and not isinstance(r, bool) for r in p):
            raise WorkbenchError(f"path {p!r}: a path must be a list of integer ranks like [0, 1]")
        paths.append(tuple(p))
    validate(paths, topk, num_heads)
    return Tree(tuple(paths), name)


def validate(paths, topk: int | None = None, num_heads: int | None = None) -> None:
    """Raise WorkbenchError naming the first offending path and the rule it breaks."""
    if len(paths) == 0:
        raise WorkbenchError("tree is empty: give at least one path, e.g. [[0]]")
    if len(paths) > MAX_NODES:
        raise WorkbenchError(f"tree has {len(paths)} nodes; at most {MAX_NODES} (the verify step's attention mask "
                             "grows as nodes^2): use a smaller tree")
    seen = set()
    for p in paths:
        if len(p) == 0:
            raise WorkbenchError("path []: the root is implicit, every path needs at least one rank")
        if len(p) > MAX_DEPTH:
            raise WorkbenchError(f"path of depth {len(p)}: at most {MAX_DEPTH} levels (one Medusa head each)")
        if p in seen:
            raise WorkbenchError(f"path {list(p)}: duplicate path (each node must appear once)")
        seen.add(p)
        for r in p:
            if r < 0 or r >= (topk if topk is not None else MAX_RANK):
                bound = f"[0, {topk})" if topk is not None else f"[0, topk), topk <= {MAX_RANK}"
                raise WorkbenchError(f"path {list(p)}: rank {r} out of range {bound}")
        if num_heads is not None and len(p) > num_heads:
            raise WorkbenchError(f"path {list(p)}: depth {len(p)} exceeds the {num_heads} Medusa heads "
                                 f"(head k guesses depth k; use a shallower tree or more heads)")
    for p in paths:
        if len(p) > 1 and p[:-1] not in seen:
            raise WorkbenchError(f"path {list(p)}: parent {list(p[:-1])} is missing (every prefix must be a node)")


# ----------------------------------------------------------------------------------------------- editing, diffing, records

def parse_path(text: str) -> RankPath:
    """A node typed by a user: `0,1`, `0 1` or `[0, 1]` (0-based ranks, 0 = top-1) -> (0, 1)."""
    parts = text.replace("[", " ").replace("]", " ").replace("(", " ").replace(")", " ").replace(",", " ").split()
    try:
        path = tuple(int(x) for x in parts)
    except ValueError:
        path = ()
    if not path or min(path) < 0:
        raise WorkbenchError(f"node '{text.strip()}': give 0-based ranks like 0,1 (the 2nd guess of head 2 under "
                             "head 1's top guess)")
    return path


def add_path(tree: Tree, path: RankPath, num_heads: int | None = None, topk: int | None = None) -> Tree:
    """The tree with one more node; a duplicate or a node without its parent is a WorkbenchError."""
    paths = tree.paths + (tuple(path),)
    validate(paths, topk, num_heads)
    return Tree(paths, tree.name)


def remove_path(tree: Tree, path: RankPath) -> Tree:
    """The tree without `path` and its descendants (a child cannot outlive its parent)."""
    path = tuple(path)
    if path not in tree.paths:
        raise WorkbenchError(f"node {list(path)} is not in the tree")
    keep = tuple(p for p in tree.paths if p[:len(path)] != path)
    validate(keep)
    return Tree(keep, tree.name)


def tree_diff(a: Tree, b: Tree) -> dict[str, list[RankPath]]:
    """Nodes only in a, only in b and in both, each in Medusa's node order."""
    order = lambda ps: sorted(ps, key=lambda p: (len(p), p))  # noqa: E731
    sa, sb = set(a.paths), set(b.paths)
    return {"only_a": order(sa - sb), "only_b": order(sb - sa), "shared": order(sa & sb)}


def tree_record(tree: Tree, **provenance) -> dict:
    """A tree file's content: name, version (TREE_VERSION), medusa_choices, then where it came from
    (expected_acceptance_length, budget, method, accuracies, ...), as `workbench optimize --out` writes it; nodes and
    depth are filled in. Readers take Medusa's own files (a list, or an object with medusa_choices) too."""
    return {"name": tree.name, "version": TREE_VERSION, "medusa_choices": tree.as_lists(), **provenance,
            "nodes": provenance.get("nodes", tree.nodes), "depth": provenance.get("depth", tree.depth)}


def record_json(record: dict) -> str:
    """One key per line, lists kept on one line: a 256-node medusa_choices stays readable."""
    return "{\n" + ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in record.items()) + "\n}\n"


def save_tree(tree: Tree, path, **provenance) -> Path:
    """Write a tree file atomically: the one writer of tree records (optimize --out, calibrate's tuned trees)."""
    return atomic_write_text(path, record_json(tree_record(tree, **provenance)))


# ----------------------------------------------------------------------------------------------- buffers

def tree_arrays(tree: Tree, topk: int = MEDUSA_TOPK) -> dict[str, np.ndarray]:
    """Medusa's `generate_medusa_buffers`, node for node, as arrays (the decoder makes tensors of them:
    runtime.treemask.tree_buffers; the CLI and the app show them without torch).

    attn_mask [n+1, n+1] float32 (1 = may attend: self, ancestors, root); tree_indices [n+1] into
    [root token] + head_1 top-k + head_2 top-k + ...; position_ids [n+1] = depth; retrieve_indices
    [leaves, depth+1], one root-to-leaf path per row (longest-first as Medusa emits them), padded with -1.
    Also parents [n+1] (-1 for the root), handy for acceptance.
    """
    validate(tree.paths, topk)
    order = tree.sorted_paths
    index = {p: i + 1 for i, p in enumerate(order)}  # buffer index of each node; the root is 0
    n = len(order) + 1
    mask = np.eye(n, dtype=np.float32)
    mask[:, 0] = 1
    tree_indices = np.zeros(n, dtype=np.int64)
    position_ids = np.zeros(n, dtype=np.int64)
    parents = np.full((n,), -1, dtype=np.int64)
    for p, i in index.items():
        for d in range(1, len(p)):
            mask[i, index[p[:d]]] = 1
        tree_indices[i] = p[-1] + topk * (len(p) - 1) + 1
        position_ids[i] = len(p)
        parents[i] = index.get(p[:-1], 0)
    # Retrieve rows: walk nodes from the last (deepest, largest) backwards; a node already on a row is skipped.
    rows, covered = [], set()
    for p in reversed(order):
        if p in covered:
            continue
        rows.append([0] + [index[p[:d]] for d in range(1, len(p) + 1)])
        covered.update(p[:d] for d in range(1, len(p) + 1))
    width = max(len(r) for r in rows)
    retrieve = np.array([r + [-1] * (width - len(r)) for r in rows], dtype=np.int64)
    return dict(attn_mask=mask, tree_indices=tree_indices, position_ids=position_ids,
                retrieve_indices=retrieve, parents=parents)


MEDUSA_BUFFERS = ("attn_mask", "tree_indices", "position_ids", "retrieve_indices")  # Medusa's own (parents is ours)


def buffers_record(tree: Tree, topk: int = MEDUSA_TOPK) -> dict[str, list]:
    """Medusa's four buffers as integer lists: the JSON `workbench tree buffers` writes, to diff against Medusa's."""
    buf = tree_arrays(tree, topk)
    return {k: buf[k].astype(np.int64).tolist() for k in MEDUSA_BUFFERS}


# ----------------------------------------------------------------------------------------------- stats, views

def tree_stats(tree: Tree) -> dict:
    per_depth = [0] * tree.depth
    for p in tree.paths:
        per_depth[len(p) - 1] += 1
    return dict(name=tree.name, nodes=tree.nodes, depth=tree.depth, nodes_per_depth=per_depth,
                leaves=len(tree.leaves()), max_rank=tree.max_rank, min_topk=tree.max_rank + 1)


def ascii_tree(tree: Tree, labels: dict | None = None) -> str:
    """Box-drawing view, children by rank; `labels` maps a path to extra text (e.g. a probability)."""
    children: dict[RankPath, list[RankPath]] = {}
    for p in tree.sorted_paths:
        children.setdefault(p[:-1], []).append(p)
    lines = ["root"]

    def walk(node: RankPath, prefix: str) -> None:
        kids = sorted(children.get(node, []), key=lambda c: c[-1])
        for j, c in enumerate(kids):
            last = j == len(kids) - 1
            extra = f"  {labels[c]}" if labels and c in labels else ""
            lines.append(f"{prefix}{'└── ' if last else '├── '}{c[-1]}{extra}")
            walk(c, prefix + ("    " if last else "│   "))

    walk((), "")
    return "\n".join(lines)


def chain_tree(k: int) -> Tree:
    """The top-1 chain of length k, [[0], [0, 0], ..., [0] * k]: what a chain drafter (vLLM's Medusa) runs."""
    return make_tree([[0] * d for d in range(1, k + 1)], name=f"chain_{k}")


def is_chain(tree: Tree) -> bool:
    return tree.nodes == tree.depth and all(r == 0 for p in tree.paths for r in p)


def tree_key(tree) -> str:
    """name:shape-hash, the sweep CSV's identity of a tree (the hash of its sorted paths names its shape); a
    per-step tree (trees.dynamic.DynamicPolicy: it has an envelope) is its name / its envelope's key."""
    if hasattr(tree, "envelope"):
        return f"{tree.name}/{tree_key(tree.envelope)}"
    return f"{tree.name}:{hashlib.sha1(json.dumps(tree.sorted_paths).encode()).hexdigest()[:10]}"
