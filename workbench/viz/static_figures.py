"""Every figure of the workbench, as matplotlib `Figure`s built without pyplot (no global state, thread-safe).

The Streamlit app shows them with `st.pyplot(fig)`; the CLI writes them with `save_png(fig, path)`. Functions
take plain data (a Tree, numpy arrays, pandas frames) and compute nothing beyond what the drawing needs, so a
figure always shows numbers that some `workbench` module computed. The trade-off figures are static_tradeoffs.py's.
"""
from __future__ import annotations

from pathlib import Path

import networkx as nx
import numpy as np
from matplotlib import colormaps
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from workbench.core.io import atomic_write
from workbench.trees.tree import RankPath, Tree, tree_arrays

CMAP = "viridis"
STEP_COLOURS = ["#cfe8ff", "#ffe2b8", "#d6f5d6", "#f7d6e6", "#e6dcff", "#fff3b0", "#d9f2f2", "#f2d9c7"]


def legend_outside(ax, handles=None, labels=None, **kw) -> None:
    """A legend to the right of the axes, never over the data."""
    args = (handles, labels) if handles is not None else ()
    ax.legend(*args, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize=7, **kw)


def save_png(fig: Figure, path: str | Path, dpi: int = 150) -> Path:
    """Write a figure as PNG (atomically: an interrupted write never leaves half an image)."""
    return atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=dpi, bbox_inches="tight", format="png"))


# ----------------------------------------------------------------------------------------------- trees

def to_networkx(tree: Tree) -> nx.DiGraph:
    """DiGraph over paths (root = ()), edges parent -> child, node attributes rank and depth."""
    g = nx.DiGraph()
    g.add_node((), rank=None, depth=0)
    for p in tree.sorted_paths:
        g.add_node(p, rank=p[-1], depth=len(p))
        g.add_edge(p[:-1], p)
    return g


def tree_positions(tree: Tree) -> dict[RankPath, tuple[float, float]]:
    """Root at the top, one row per depth, leaning left like Fig. 6 of the Medusa paper.

    Leaves take consecutive x slots in depth-first order with children sorted by rank; a parent sits above its
    rank-smallest child, so the all-top-1 chain runs straight down the left edge.
    """
    children: dict[RankPath, list[RankPath]] = {}
    for p in tree.sorted_paths:
        children.setdefault(p[:-1], []).append(p)
    pos: dict[RankPath, tuple[float, float]] = {}
    slot = 0

    def place(node: RankPath) -> float:
        nonlocal slot
        kids = sorted(children.get(node, []), key=lambda c: c[-1])
        if not kids:
            x = float(slot)
            slot += 1
        else:
            x = [place(c) for c in kids][0]
        pos[node] = (x, -float(len(node)))
        return x

    place(())
    return pos


def _tree_width(tree: Tree) -> float:
    return min(max(6.0, 0.28 * len(tree.leaves()) + 2), 24.0)


def _scalar_mappable(norm):
    """The colour bar's source for edge colours computed by hand (the edge collection carries no colormap)."""
    sm = ScalarMappable(norm=norm, cmap=CMAP)
    sm.set_array([])
    return sm


def draw_tree(tree: Tree, probs: dict[RankPath, float] | None = None, labels: dict[RankPath, str] | None = None,
              ax=None, title: str | None = None):
    """The tree as a graph: node label = rank (or `labels[path]`, e.g. the real token), edge colour and width =
    path probability of the child (`probs`, independence or measured). Returns the Figure (new if ax is None)."""
    fig = None
    if ax is None:
        fig = Figure(figsize=(_tree_width(tree), 1.2 * tree.depth + 1.6), layout="constrained")
        ax = fig.add_subplot()
    g = to_networkx(tree)
    pos = tree_positions(tree)
    edges = list(g.edges())
    if probs:
        vals = np.array([float(probs.get(v, 0.0)) for _, v in edges])
        norm = Normalize(vmin=0.0, vmax=max(float(vals.max()), 1e-9))
        cmap = colormaps[CMAP]
        colours = [cmap(norm(x)) for x in vals]
        widths = 0.6 + 4.0 * norm(vals)
        sm = _scalar_mappable(norm)
        ax.figure.colorbar(sm, ax=ax, location="bottom", shrink=0.5, pad=0.02, aspect=40, label="path probability")
    else:
        colours, widths = "#888888", 1.0
    nx.draw_networkx_edges(g, pos, edgelist=edges, ax=ax, edge_color=colours, width=widths, arrows=False)
    node_labels = {(): labels.get((), "R") if labels else "R"}
    for p in tree.paths:
        node_labels[p] = labels[p] if labels and p in labels else str(p[-1])
    leaves = len(tree.leaves())
    size, font = (320, 8) if leaves <= 30 else (150, 6) if leaves <= 80 else (60, 4)
    nx.draw_networkx_nodes(g, pos, ax=ax, node_size=size, node_color="white", edgecolors="#333333", linewidths=0.8)
    nx.draw_networkx_labels(g, pos, labels=node_labels, ax=ax, font_size=font)
    ax.set_yticks([-d for d in range(tree.depth + 1)])
    ax.set_yticklabels(["root"] + [f"head {d}" for d in range(1, tree.depth + 1)])
    ax.tick_params(left=False, labelleft=True, bottom=False, labelbottom=False)
    for s in ax.spines.values():
        s.set_visible(False)
    ax.set_title(title or f"{tree.name or 'tree'}: {tree.nodes} nodes, depth {tree.depth}")
    return fig if fig is not None else ax.figure


def mask_heatmap(tree: Tree, topk: int | None = None, ax=None):
    """The tree-attention mask (Medusa's buffer: row i may attend to column j), root first, nodes in buffer order."""
    fig = None
    if ax is None:
        fig = Figure(figsize=(4.5, 4.2), layout="constrained")
        ax = fig.add_subplot()
    mask = tree_arrays(tree, topk or max(tree.max_rank + 1, 1))["attn_mask"]
    ax.imshow(mask, cmap="Greys", vmin=0, vmax=1, interpolation="nearest")
    ax.set_title(f"tree-attention mask ({mask.shape[0]}x{mask.shape[1]})")
    ax.set_xlabel("key (0 = root)")
    ax.set_ylabel("query (buffer order)")
    return fig if fig is not None else ax.figure


def tree_figure(tree: Tree, probs: dict[RankPath, float] | None = None, labels: dict[RankPath, str] | None = None,
                topk: int | None = None, title: str | None = None):
    """Tree and its attention mask side by side: what `workbench tree show --png` writes."""
    width = _tree_width(tree)
    fig = Figure(figsize=(width + 4.5, max(3.6, 1.2 * tree.depth + 1.6)), layout="constrained")
    tree_ax, mask_ax = fig.subplots(1, 2, width_ratios=[width, 4.0])
    draw_tree(tree, probs, labels, ax=tree_ax, title=title)
    mask_heatmap(tree, topk, ax=mask_ax)
    return fig


# ----------------------------------------------------------------------------------------------- calibration

# ----------------------------------------------------------------------------------------------- live decode

def accepted_lengths(lengths):
    """Tokens accepted at each decoding step (1 = only the base model's own token)."""
    lengths = np.asarray(lengths)
    fig = Figure(figsize=(6.4, 3.0), layout="constrained")
    ax = fig.add_subplot()
    ax.bar(np.arange(1, len(lengths) + 1), lengths, color=[STEP_COLOURS[i % len(STEP_COLOURS)] for i in
                                                           range(len(lengths))], edgecolor="#555555", lw=0.5)
    if len(lengths):
        ax.axhline(float(lengths.mean()), color="crimson", lw=1, ls="--", label=f"mean {lengths.mean():.2f}")
        legend_outside(ax)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("decoding step")
    ax.set_ylabel("tokens accepted")
    ax.set_title("accepted tokens per step")
    return fig


def throughput_bars(rates: dict[str, float]):
    """Tokens/s side by side (e.g. Medusa vs vanilla greedy)."""
    fig = Figure(figsize=(4.2, 3.0), layout="constrained")
    ax = fig.add_subplot()
    names = list(rates)
    ax.bar(names, [rates[n] for n in names], color=["tab:green", "tab:grey", "tab:blue"][: len(names)])
    for i, n in enumerate(names):
        ax.text(i, rates[n], f"{rates[n]:.1f}", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("tokens / s")
    ax.set_title("throughput")
    return fig
