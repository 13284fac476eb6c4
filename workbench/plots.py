"""Every figure of the workbench, as matplotlib `Figure`s built without pyplot (no global state, thread-safe).

The Streamlit app shows them with `st.pyplot(fig)`; the CLI writes them with `save_png(fig, path)`. Functions
take plain data (a Tree, numpy arrays, pandas frames) and compute nothing beyond what the drawing needs, so a
figure always shows numbers that some `workbench` module computed.
"""
from __future__ import annotations

import html
from pathlib import Path as FilePath

import numpy as np
from matplotlib import colormaps
from matplotlib.colors import Normalize
from matplotlib.figure import Figure

from workbench.tree import Tree, to_networkx, tree_buffers

PathT = tuple[int, ...]
CMAP = "viridis"
STEP_COLOURS = ["#cfe8ff", "#ffe2b8", "#d6f5d6", "#f7d6e6", "#e6dcff", "#fff3b0", "#d9f2f2", "#f2d9c7"]


def save_png(fig: Figure, path: str | FilePath, dpi: int = 150) -> FilePath:
    """Write a figure as PNG (atomically: an interrupted write never leaves half an image)."""
    import os

    path = FilePath(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}.png")
    fig.savefig(tmp, dpi=dpi, bbox_inches="tight")
    os.replace(tmp, path)
    return path


# ----------------------------------------------------------------------------------------------- trees

def tree_positions(tree: Tree) -> dict[PathT, tuple[float, float]]:
    """Root at the top, one row per depth, leaning left like Fig. 6 of the Medusa paper.

    Leaves take consecutive x slots in depth-first order with children sorted by rank; a parent sits above its
    rank-smallest child, so the all-top-1 chain runs straight down the left edge.
    """
    children: dict[PathT, list[PathT]] = {}
    for p in tree.sorted_paths:
        children.setdefault(p[:-1], []).append(p)
    pos: dict[PathT, tuple[float, float]] = {}
    slot = 0

    def place(node: PathT) -> float:
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


def draw_tree(tree: Tree, probs: dict[PathT, float] | None = None, labels: dict[PathT, str] | None = None,
              ax=None, title: str | None = None):
    """The tree as a graph: node label = rank (or `labels[path]`, e.g. the real token), edge colour and width =
    path probability of the child (`probs`, independence or measured). Returns the Figure (new if ax is None)."""
    import networkx as nx

    fig = None
    if ax is None:
        fig = Figure(figsize=(max(6.0, 0.28 * len(tree.leaves()) + 2), 1.2 * tree.depth + 1.6), layout="constrained")
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
        ax.figure.colorbar(sm, ax=ax, shrink=0.7, pad=0.01, label="path probability")
    else:
        colours, widths = "#888888", 1.0
    nx.draw_networkx_edges(g, pos, edgelist=edges, ax=ax, edge_color=colours, width=widths, arrows=False)
    node_labels = {(): "root"}
    for p in tree.paths:
        node_labels[p] = labels[p] if labels and p in labels else str(p[-1])
    small = len(tree.leaves()) > 30
    nx.draw_networkx_nodes(g, pos, ax=ax, node_size=150 if small else 320, node_color="white",
                           edgecolors="#333333", linewidths=0.8)
    nx.draw_networkx_labels(g, pos, labels=node_labels, ax=ax, font_size=6 if small else 8)
    ax.set_yticks([-d for d in range(tree.depth + 1)])
    ax.set_yticklabels(["root"] + [f"head {d}" for d in range(1, tree.depth + 1)])
    ax.tick_params(left=False, bottom=False, labelbottom=False)
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
    mask = tree_buffers(tree, topk or max(tree.max_rank + 1, 1))["attn_mask"].numpy()
    ax.imshow(mask, cmap="Greys", vmin=0, vmax=1, interpolation="nearest")
    ax.set_title(f"tree-attention mask ({mask.shape[0]}x{mask.shape[1]})")
    ax.set_xlabel("key (0 = root)")
    ax.set_ylabel("query (buffer order)")
    return fig if fig is not None else ax.figure


def tree_figure(tree: Tree, probs: dict[PathT, float] | None = None, labels: dict[PathT, str] | None = None,
                topk: int | None = None, title: str | None = None):
    """Tree and its attention mask side by side: what `workbench tree show --png` writes."""
    width = max(6.0, 0.28 * len(tree.leaves()) + 2)
    fig = Figure(figsize=(width + 4.5, max(3.6, 1.2 * tree.depth + 1.6)), layout="constrained")
    tree_ax, mask_ax = fig.subplots(1, 2, width_ratios=[width, 4.0])
    draw_tree(tree, probs, labels, ax=tree_ax, title=title)
    mask_heatmap(tree, topk, ax=mask_ax)
    return fig


def expected_curve_plot(curves: dict[str, tuple], points: dict[str, tuple[float, float]] | None = None,
                        current: tuple[float, float] | None = None, ylabel: str = "expected tokens per step"):
    """Expected tokens per step versus budget (node count): one line per curve {name: (budgets, values)}, named
    trees as points {name: (nodes, value)}, the tree on screen as a star."""
    fig = Figure(figsize=(6.4, 4.0), layout="constrained")
    ax = fig.add_subplot()
    for name, (x, y) in curves.items():
        ax.plot(x, y, marker="." if len(x) < 40 else None, label=name)
    for name, (x, y) in (points or {}).items():
        ax.scatter([x], [y], s=28, zorder=3, label=name)
    if current is not None:
        ax.scatter([current[0]], [current[1]], marker="*", s=180, color="crimson", zorder=4, label="this tree")
    ax.set_xlabel("budget (tree nodes = candidate tokens)")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if curves or points or current:
        ax.legend(fontsize=7, ncol=2)
    return fig


# ----------------------------------------------------------------------------------------------- calibration

def accuracy_heatmap(acc: np.ndarray, max_ranks: int | None = None):
    """a_k^(i): probability that head k's rank-i guess is the right token; heads are rows, ranks columns."""
    acc = np.asarray(acc, dtype=float)
    if max_ranks:
        acc = acc[:, :max_ranks]
    k, r = acc.shape
    fig = Figure(figsize=(min(1.0 + 0.55 * r, 14), 0.9 + 0.55 * k), layout="constrained")
    ax = fig.add_subplot()
    im = ax.imshow(acc, cmap=CMAP, aspect="auto", vmin=0.0, vmax=max(float(acc.max()), 1e-9))
    ax.set_xticks(range(r), [str(i) for i in range(r)])
    ax.set_yticks(range(k), [f"head {i + 1}" for i in range(k)])
    ax.set_xlabel("rank i (0 = top-1)")
    if r <= 20:
        for (i, j), v in np.ndenumerate(acc):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7,
                    color="white" if v < 0.6 * acc.max() else "black")
    fig.colorbar(im, ax=ax, label="a_k^(i)")
    ax.set_title("per-head accuracy at each rank")
    return fig


def cumulative_topk(acc: np.ndarray):
    """Top-k accuracy of each head: the running sum of a_k^(i) over ranks."""
    acc = np.asarray(acc, dtype=float)
    fig = Figure(figsize=(6.4, 4.0), layout="constrained")
    ax = fig.add_subplot()
    ks = np.arange(1, acc.shape[1] + 1)
    for h, row in enumerate(acc):
        ax.plot(ks, np.cumsum(row), marker=".", label=f"head {h + 1}")
    ax.set_xlabel("k")
    ax.set_ylabel("top-k accuracy")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("cumulative top-k accuracy per head")
    return fig


def independence_vs_measured(paths: list[PathT], independent, measured, annotate: int = 8):
    """Each path's probability under the independence assumption (product of a_k^(i)) against the measured
    joint frequency; above the diagonal the assumption under-estimates, below it over-estimates."""
    ind, mea = np.asarray(independent, dtype=float), np.asarray(measured, dtype=float)
    fig = Figure(figsize=(5.6, 5.0), layout="constrained")
    ax = fig.add_subplot()
    depth = np.array([len(p) for p in paths])
    sc = ax.scatter(ind, mea, c=depth, cmap="plasma", s=22, zorder=3)
    hi = max(float(ind.max(initial=0)), float(mea.max(initial=0)), 1e-3) * 1.05
    ax.plot([0, hi], [0, hi], color="grey", lw=1, ls="--", label="independence exact")
    for j in np.argsort(-np.abs(mea - ind))[:annotate]:
        ax.annotate(str(list(paths[j])), (ind[j], mea[j]), fontsize=6, xytext=(3, 3), textcoords="offset points")
    ax.set_xlim(0, hi)
    ax.set_ylim(0, hi)
    ax.set_xlabel("independence: product of a_k^(i)")
    ax.set_ylabel("measured path probability")
    if len(paths):
        fig.colorbar(sc, ax=ax, label="path depth")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    ax.set_title("independence vs measured, top paths")
    return fig


# ----------------------------------------------------------------------------------------------- trade-offs

def _kind(df):
    """'dense' or 'sparse' per sweep row: a `kind` column if the sweep has one, else from the tree name."""
    if "kind" in df.columns:
        return df["kind"].astype(str)
    return df["tree"].astype(str).map(lambda t: "dense" if "dense" in t.lower() else "sparse")


def _by_kind_vs_nodes(sweep, y: str, ylabel: str, title: str):
    fig = Figure(figsize=(6.4, 4.0), layout="constrained")
    ax = fig.add_subplot()
    df = sweep.assign(_kind=_kind(sweep))
    for kind, part in df.groupby("_kind", sort=True):
        part = part.groupby("nodes", as_index=False)[y].mean().sort_values("nodes")
        ax.plot(part["nodes"], part[y], marker="o" if kind == "sparse" else "s", label=kind)
    ax.set_xlabel("candidate tokens (tree nodes)")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(title)
    return fig


def tokens_vs_candidates(sweep):
    """Paper Fig. 4a: tokens per step (acceleration rate) against candidate tokens, sparse and dense trees."""
    return _by_kind_vs_nodes(sweep, "acceleration_rate", "tokens per step", "tokens per step vs candidates")


def speed_vs_candidates(sweep):
    """Paper Fig. 4b: measured speed against candidate tokens (tokens/s if the sweep has it, else speedup)."""
    y = "tokens_per_s" if "tokens_per_s" in sweep.columns and sweep["tokens_per_s"].notna().any() else "speedup"
    return _by_kind_vs_nodes(sweep, y, y.replace("_", " "), "speed vs candidates")


def epsilon_plot(sweep, quality: str = "exact_match"):
    """Paper Fig. 5: tokens per step and quality against the typical-acceptance threshold epsilon."""
    fig = Figure(figsize=(6.4, 4.0), layout="constrained")
    ax = fig.add_subplot()
    df = sweep.dropna(subset=["epsilon"]).groupby("epsilon", as_index=False)[["acceleration_rate", quality]].mean()
    ax.plot(df["epsilon"], df["acceleration_rate"], marker="o", color="tab:blue", label="tokens per step")
    ax.set_xlabel("epsilon (posterior threshold)")
    ax.set_ylabel("tokens per step", color="tab:blue")
    ax2 = ax.twinx()
    ax2.plot(df["epsilon"], df[quality], marker="s", color="tab:red", label=quality)
    ax2.set_ylabel(quality.replace("_", " "), color="tab:red")
    ax.grid(alpha=0.3)
    ax.set_title("tokens per step and quality vs epsilon")
    return fig


def predicted_vs_measured(sweep):
    """Predicted tokens per step (from calibration) against measured acceleration, one point per sweep row."""
    fig = Figure(figsize=(5.4, 4.8), layout="constrained")
    ax = fig.add_subplot()
    df = sweep.dropna(subset=["predicted", "acceleration_rate"]).assign(_kind=_kind(sweep))
    for kind, part in df.groupby("_kind", sort=True):
        ax.scatter(part["predicted"], part["acceleration_rate"], s=24, label=kind)
    if len(df):
        lo = min(df["predicted"].min(), df["acceleration_rate"].min()) * 0.95
        hi = max(df["predicted"].max(), df["acceleration_rate"].max()) * 1.05
        ax.plot([lo, hi], [lo, hi], color="grey", ls="--", lw=1, label="y = x")
        ax.legend(fontsize=8)
    ax.set_xlabel("predicted tokens per step")
    ax.set_ylabel("measured tokens per step")
    ax.grid(alpha=0.3)
    ax.set_title("predicted vs measured")
    return fig


def latency_curve(latency):
    """Forward-pass time against tokens per forward, one line per (device, dtype, context)."""
    fig = Figure(figsize=(6.4, 4.0), layout="constrained")
    ax = fig.add_subplot()
    keys = [c for c in ("device", "dtype", "context") if c in latency.columns]
    groups = latency.groupby(keys, sort=True) if keys else [((), latency)]
    for key, part in groups:
        part = part.groupby("tokens", as_index=False)["seconds"].mean().sort_values("tokens")
        label = " / ".join(str(k) for k in (key if isinstance(key, tuple) else (key,)))
        ax.plot(part["tokens"], 1000 * part["seconds"], marker=".", label=label or None)
    ax.set_xlabel("tokens per forward pass")
    ax.set_ylabel("ms per forward")
    ax.grid(alpha=0.3)
    if keys:
        ax.legend(fontsize=7, title=" / ".join(keys), title_fontsize=7)
    ax.set_title("latency curve")
    return fig


def speedup_curve(curves: dict[str, tuple], best: dict[str, tuple[float, float]] | None = None):
    """Predicted speedup against budget, {name: (budgets, speedups)}; the best budget of each marked."""
    fig = Figure(figsize=(6.4, 4.0), layout="constrained")
    ax = fig.add_subplot()
    for name, (x, y) in curves.items():
        ax.plot(x, y, label=name)
    for name, (x, y) in (best or {}).items():
        ax.scatter([x], [y], marker="*", s=150, zorder=3, label=f"best {name}: {int(x)} nodes, {y:.2f}x")
    ax.axhline(1.0, color="grey", lw=1, ls="--")
    ax.set_xlabel("budget (tree nodes)")
    ax.set_ylabel("predicted speedup over greedy")
    ax.grid(alpha=0.3)
    if curves:
        ax.legend(fontsize=7)
    ax.set_title("predicted speedup")
    return fig


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
        ax.legend(fontsize=8)
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


def coloured_tokens_html(pieces: list[str], steps: list[int]) -> str:
    """The answer as HTML, each token's background the colour of the decoding step that accepted it."""
    spans = []
    for text, step in zip(pieces, steps):
        colour = STEP_COLOURS[step % len(STEP_COLOURS)]
        spans.append(f'<span title="step {step + 1}" style="background:{colour};border-radius:3px;'
                     f'padding:0 1px">{html.escape(text)}</span>')
    return '<div style="line-height:1.9;white-space:pre-wrap;font-family:monospace">' + "".join(spans) + "</div>"


def _scalar_mappable(norm):
    from matplotlib.cm import ScalarMappable

    sm = ScalarMappable(norm=norm, cmap=CMAP)
    sm.set_array([])
    return sm
