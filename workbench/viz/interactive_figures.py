"""The app's interactive views: plotly figures of a tree and its attention mask, and the step-coloured answer.

Zoomable, hover for details, click to select. Matplotlib figures for files are in `workbench/viz/static_figures.py`; the trade-off charts in
`interactive_tradeoffs.py`.

Nodes and mask rows share one index, the buffer index of Medusa's generate_medusa_buffers (0 = root, node i =
tree.sorted_paths[i - 1]); every selectable point carries it as customdata[0], so a click on a tree node or on a
mask row names the same node (`picked_index`) and both figures can highlight it (`focus`).
Ranks are shown 0-based everywhere, as in medusa_choices (rank 0 = a head's top-1 guess).
"""
from __future__ import annotations

import html

import numpy as np
import plotly.graph_objects as go
from plotly.colors import sample_colorscale

from workbench.trees.tree import RankPath, Tree, tree_arrays, tree_diff
from workbench.viz.static_figures import STEP_COLOURS, tree_positions

FOCUS = "crimson"
STATUS_COLOURS = {"shared": "#9aa5b1", "only in A": "#e4572e", "only in B": "#2e86ab"}
EDGE_BINS = 6
# margins fixed up front: plotly's automatic margins draw a figure twice (measure, grow the margin, redraw), and the
# designer redraws its tree and mask on every click
PINNED = dict(t=50, b=10, autoexpand=False)


def node_names(tree: Tree) -> list[RankPath]:
    """Path of every buffer index: [(), sorted_paths...]."""
    return [()] + tree.sorted_paths


def short_label(text: str, width: int) -> str:
    """A token label that fits its node: at most `width` characters, '…' when cut (the hover shows it whole)."""
    return text if len(text) <= width else text[: max(width - 1, 1)] + "…"


def _sizes(leaves: int) -> tuple[int, int, int]:
    """(marker px, font px, label chars) by tree width: a leaf gets one x slot, and the narrowest the tree is drawn
    (a 1280 px window: about 600 px of plot) must fit a marker per slot, or neighbours overlap (a 63-node tree
    with 42 leaves had 18 px markers 17 px apart). Wide trees get small nodes: zoom in to read them."""
    marker = max(7, min(26, 600 // max(leaves, 1)))
    return marker, max(7, min(12, round(marker * 0.6))), 4 if marker >= 24 else 3 if marker >= 16 else 2


def tree_chart(tree: Tree, probs: dict[RankPath, float] | None = None, labels: dict[RankPath, str] | None = None,
               focus: int | None = None, status: dict[RankPath, str] | None = None, title: str | None = None) -> go.Figure:
    """The tree, root on top, one row per head: node text = rank (or labels[path], e.g. the real token), node
    colour = path probability (or `status`, e.g. only in A / only in B / shared, for a diff), edge width = the
    child's path probability. `focus` (a buffer index) is drawn in red with its path from the root."""
    pos = tree_positions(tree)
    names = node_names(tree)
    index = {p: i for i, p in enumerate(names)}
    marker, font, chars = _sizes(len(tree.leaves()))
    fig = go.Figure()
    # edges, binned by probability (a line trace has one width): [n_edges] segments with None breaks
    probs = probs or {}
    top = max([probs.get(p, 0.0) for p in tree.paths] + [1e-9])
    bins: dict[int, tuple[list, list]] = {}
    for p in tree.sorted_paths:
        b = min(int(EDGE_BINS * probs.get(p, 0.0) / top), EDGE_BINS - 1) if probs else 0
        xs, ys = bins.setdefault(b, ([], []))
        (x0, y0), (x1, y1) = pos[p[:-1]], pos[p]
        xs += [x0, x1, None]
        ys += [y0, y1, None]
    for b, (xs, ys) in sorted(bins.items()):
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", hoverinfo="skip", showlegend=False,
                                 line=dict(width=1 + 4 * b / EDGE_BINS, color="#b8bec6" if not probs else
                                           sample_colorscale("Viridis", [b / max(EDGE_BINS - 1, 1)])[0])))
    if focus is not None and 0 < focus < len(names):
        chain = [names[focus][:d] for d in range(len(names[focus]) + 1)]
        fig.add_trace(go.Scatter(x=[pos[p][0] for p in chain], y=[pos[p][1] for p in chain], mode="lines",
                                 line=dict(width=4, color=FOCUS), hoverinfo="skip", showlegend=False))

    def text(p: RankPath) -> str:
        if labels and p in labels:
            return short_label(labels[p], chars)
        return "R" if not p else str(p[-1])

    def hover(p: RankPath) -> str:
        head = "root (the base model's own token)" if not p else \
            f"node {list(p)}: head {len(p)}'s rank-{p[-1]} guess (0 = top-1)"
        extra = [f"mask row {index[p]}"]
        if p in probs:
            extra.append(f"P(accepted) {probs[p]:.4f}")
        if labels and p in labels:
            extra.append(f"token {labels[p]!r}")
        if status and p in status:
            extra.append(status[p])
        return "<br>".join([head] + extra)

    groups = {"nodes": names} if not status else \
        {s: [p for p in names if status.get(p, "shared") == s] for s in dict.fromkeys(["shared", *status.values()])}
    for gname, members in groups.items():
        if not members:
            continue
        if status:
            colour: object = STATUS_COLOURS.get(gname, "#cccccc")
            extra = {}
        else:
            colour = [probs.get(p, 1.0 if not p else 0.0) for p in members]
            extra = dict(colorscale="Viridis", cmin=0.0, cmax=top, showscale=bool(probs),
                         colorbar=dict(title=dict(text="P(path<br>accepted)", side="right"), thickness=12, len=0.8))
        ink = ["black" if status or probs.get(p, 1.0 if not p else 0.0) > 0.55 * top else "white" for p in members]
        line_w = [3 if index[p] == focus else 1 for p in members]
        line_c = [FOCUS if index[p] == focus else "#333333" for p in members]
        fig.add_trace(go.Scatter(
            x=[pos[p][0] for p in members], y=[pos[p][1] for p in members], mode="markers+text",
            text=[text(p) for p in members], textfont=dict(size=font, color=ink), name=gname,
            showlegend=bool(status), customdata=[[index[p], str(list(p))] for p in members],
            hovertext=[hover(p) for p in members], hovertemplate="%{hovertext}<extra></extra>",
            marker=dict(size=[marker * (1.5 if index[p] == focus else 1) for p in members], color=colour,
                        line=dict(width=line_w, color=line_c), opacity=0.9, **extra)))
    fig.update_layout(
        title=title or f"{tree.name or 'tree'}: {tree.nodes} nodes, depth {tree.depth}",
        height=170 + 95 * tree.depth,
        margin=PINNED | dict(l=55, r=115 if probs and not status else 10, b=40 if status else 10),  # colour bar, legend
        plot_bgcolor="white", dragmode="zoom", hovermode="closest",
        legend=dict(orientation="h", yanchor="top", y=0.0, xanchor="left", x=0.0))  # below: clear of the title
    fig.update_xaxes(visible=False)
    fig.update_yaxes(tickvals=[-d for d in range(tree.depth + 1)], zeroline=False, showgrid=False,
                     ticktext=["root"] + [f"head {d}" for d in range(1, tree.depth + 1)],
                     range=[-tree.depth - 0.5, 0.5])
    return fig


def integer_ticks(n: int) -> list[int]:
    """Tick positions 0..n-1 on a mask axis: every index when small, a round step otherwise (never fractional)."""
    step = 1 if n <= 24 else 5 if n <= 70 else 10 if n <= 160 else 20
    return list(range(0, n, step))


def mask_chart(tree: Tree, focus: int | None = None, topk: int | None = None) -> go.Figure:
    """The tree-attention mask (row = query node, column = key node it may attend to, both in buffer order);
    hover a cell for the two nodes' paths; click a cell to select its row's node. The `focus` row is red."""
    mask = tree_arrays(tree, topk or max(tree.max_rank + 1, 1))["attn_mask"]  # [n+1, n+1]
    n = mask.shape[0]
    names = [str(list(p)) if p else "root" for p in node_names(tree)]
    z = mask.astype(np.int8)  # 0 masked, 1 may attend; the focus row: 2 masked, 3 may attend (an array: validated
    # at once, where nested lists are validated cell by cell)
    if focus is not None and 0 <= focus < n:
        z[focus] += 2
    steps = ["white", "#56606b", "#f8d3da", FOCUS]
    scale = [[edge, c] for i, c in enumerate(steps) for edge in (i / 4, (i + 1) / 4)]
    fig = go.Figure(go.Heatmap(z=z, zmin=-0.5, zmax=3.5, showscale=False, hoverinfo="skip", colorscale=scale,
                               xgap=0.5 if n <= 70 else 0, ygap=0.5 if n <= 70 else 0))
    rows, cols = np.nonzero(mask)  # selectable points on every allowed cell: a click anywhere on a row picks it
    fig.add_trace(go.Scatter(
        x=cols, y=rows, mode="markers", showlegend=False, customdata=[[int(r), names[r]] for r in rows],
        marker=dict(size=max(6, min(28, 520 // n)), color="rgba(0,0,0,0)", symbol="square"),
        hovertext=[f"row {r}: {names[r]}<br>attends to column {c}: {names[c]}" for r, c in zip(rows, cols)],
        hovertemplate="%{hovertext}<extra></extra>"))
    ticks = integer_ticks(n)
    fig.update_layout(title=f"tree-attention mask ({n}x{n}; row {focus} selected)" if focus is not None
                      else f"tree-attention mask ({n}x{n})", height=560, margin=PINNED | dict(l=55, r=10, b=50),
                      plot_bgcolor="white", dragmode="zoom", hovermode="closest")
    fig.update_xaxes(title="key node (buffer index, 0 = root)", tickmode="array", tickvals=ticks,
                     range=[-0.5, n - 0.5], constrain="domain", showgrid=False)
    fig.update_yaxes(title="query node (buffer index)", tickmode="array", tickvals=ticks, range=[n - 0.5, -0.5],
                     scaleanchor="x", showgrid=False)
    return fig


def picked_index(selection) -> int | None:
    """The buffer index of the first selected point of a tree_chart / mask_chart selection (None if nothing)."""
    for point in (selection or {}).get("points", []) or []:
        data = point.get("customdata")
        if data:
            return int(data[0])
    return None


# ----------------------------------------------------------------------------------------------- live decode

def token_pieces(tokenizer, ids: list[int]) -> list[str]:
    """Each token's text as it appears in the decoded answer (prefix differences, so multi-token characters and
    leading-space markers come out right), for colouring the answer token by token."""
    pieces, prev = [], ""
    for i in range(1, len(ids) + 1):
        text = tokenizer.decode(ids[:i], skip_special_tokens=True)
        pieces.append(text[len(prev):] if text.startswith(prev) else text)
        prev = text
    return pieces


def coloured_tokens_html(pieces: list[str], steps: list[int]) -> str:
    """The answer as HTML, each token's background the colour of the decoding step that accepted it."""
    spans = []
    for text, step in zip(pieces, steps):
        colour = STEP_COLOURS[step % len(STEP_COLOURS)]
        spans.append(f'<span title="step {step + 1}" style="background:{colour};border-radius:3px;'
                     f'padding:0 1px">{html.escape(text)}</span>')
    return '<div style="line-height:1.9;white-space:pre-wrap;font-family:monospace">' + "".join(spans) + "</div>"


# ----------------------------------------------------------------------------------------------- comparison

def comparison_chart(a: Tree, b: Tree, title: str | None = None) -> go.Figure:
    """Two trees drawn as one (their union): each node coloured shared / only in A / only in B, so a 63-node diff
    reads at a glance and nothing overlaps."""
    d = tree_diff(a, b)
    union = Tree(tuple(d["shared"] + d["only_a"] + d["only_b"]), "union")
    status = {p: "shared" for p in d["shared"]} | {p: "only in A" for p in d["only_a"]} | \
        {p: "only in B" for p in d["only_b"]}
    return tree_chart(union, status=status, title=title or f"A = {a.name} vs B = {b.name}")


# ----------------------------------------------------------------------------------------------- values to read

def layout(fig: go.Figure, title: str, height: int = 380, right: int = 10, **kw) -> go.Figure:
    """Short title on the left (the app writes it above the chart instead), legend in two columns at the bottom of
    the figure, below the axis title in a margin sized for it: never over the data, the axis or the toolbar. The left
    margin, and `right` where a colour bar or second axis sits, already fit an axis title and short tick labels, so
    plotly's automatic margins (the app turns them on) rarely grow them: growing one draws the figure twice."""
    names = [t.name for t in fig.data if t.showlegend is not False and t.name]
    columns = 2 if all(len(n) <= 26 for n in names) else 1  # a long name gets the whole width
    rows = -(-len(names) // columns)
    fig.update_layout(title=dict(text=title, x=0.0, xanchor="left", font=dict(size=14)), height=height + 22 * rows,
                      margin=dict(l=72, r=right, t=40, b=64 + 22 * rows), plot_bgcolor="white", hovermode="closest",
                      legend=dict(orientation="h", yref="container", yanchor="bottom", y=0.0, xanchor="left", x=0.0,
                                  entrywidthmode="fraction", entrywidth=1.0 / columns), **kw)
    fig.update_xaxes(showgrid=True, gridcolor="#eeeeee", zeroline=False)
    fig.update_yaxes(showgrid=True, gridcolor="#eeeeee", zeroline=False)
    return fig


def accuracy_chart(acc: np.ndarray) -> go.Figure:
    """a_k^(i) as a heat map, heads as rows, ranks as columns; values written in the cells while they fit, always
    in the hover."""
    acc = np.asarray(acc, dtype=float)
    k, r = acc.shape
    fig = go.Figure(go.Heatmap(
        z=acc, x=[str(i) for i in range(r)], y=[f"head {i + 1}" for i in range(k)], colorscale="Viridis", zmin=0.0,
        zmax=max(float(acc.max()), 1e-9), text=np.round(acc, 3), texttemplate="%{z:.2f}" if r <= 12 else None,
        hovertemplate="%{y}, rank %{x}: a = %{z:.4f}<extra></extra>", colorbar=dict(title="a_k^(i)", thickness=12)))
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(title="rank i (0 = top-1)", type="category")
    return layout(fig, "per-head accuracy at each rank", height=140 + 45 * k, right=90)  # the colour bar


def topk_chart(acc: np.ndarray) -> go.Figure:
    """Top-k accuracy of each head: the running sum of a_k^(i) over ranks."""
    acc = np.asarray(acc, dtype=float)
    fig = go.Figure()
    for h, row in enumerate(acc):
        fig.add_trace(go.Scatter(x=np.arange(1, acc.shape[1] + 1), y=np.cumsum(row), mode="lines+markers",
                                 name=f"head {h + 1}",
                                 hovertemplate=f"head {h + 1}, top-%{{x}}: %{{y:.4f}}<extra></extra>"))
    fig.update_xaxes(title="k (top-k = ranks 0..k-1)", dtick=1)
    fig.update_yaxes(title="top-k accuracy", range=[0, 1.02])
    return layout(fig, "top-k accuracy")


def paths_chart(paths: list, independent, measured) -> go.Figure:
    """Measured joint path probability against the independence product, one point per path (hover names it), on
    log axes, with the diagonal: above it independence under-estimates a path."""
    ind, mea = np.asarray(independent, dtype=float), np.asarray(measured, dtype=float)
    ok = (ind > 0) & (mea > 0)
    depth = np.array([len(p) for p in paths])
    fig = go.Figure()
    for d in sorted(set(depth[ok].tolist())):
        sel = ok & (depth == d)
        fig.add_trace(go.Scatter(
            x=ind[sel], y=mea[sel], mode="markers", name=f"depth {d}", marker=dict(size=7, opacity=0.8),
            customdata=[str(list(p)) for p, s in zip(paths, sel) if s],
            hovertemplate="path %{customdata}<br>independence %{x:.4f}<br>measured %{y:.4f}<extra></extra>"))
    if ok.any():
        lo, hi = float(min(ind[ok].min(), mea[ok].min())), float(max(ind[ok].max(), mea[ok].max()))
        fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="independent heads",
                                 line=dict(color="grey", dash="dash"), hoverinfo="skip"))
    fig.update_xaxes(type="log", title="independence product of a_k^(i)")
    fig.update_yaxes(type="log", title="measured joint frequency")
    return layout(fig, "measured vs independence, per path", height=440)


def curves_chart(curves: dict[str, tuple], points: dict[str, tuple[float, float]] | None = None,
                 current: tuple[float, float] | None = None, title: str = "expected tokens per step",
                 ytitle: str = "expected tokens per step") -> go.Figure:
    """Lines {name: (x, y)} against tree nodes, named trees as grey points (hover names them), this tree a star."""
    fig = go.Figure()
    for name, (x, y) in curves.items():
        fig.add_trace(go.Scatter(x=list(x), y=list(y), mode="lines", name=name,
                                 hovertemplate=f"{name}: %{{x}} nodes, %{{y:.3f}}<extra></extra>"))
    if points:
        names = list(points)
        fig.add_trace(go.Scatter(x=[points[n][0] for n in names], y=[points[n][1] for n in names], mode="markers",
                                 name=f"named trees ({len(names)})", marker=dict(color="dimgrey", size=7),
                                 customdata=names, hovertemplate="%{customdata}: %{x} nodes, %{y:.3f}<extra></extra>"))
    if current is not None:
        fig.add_trace(go.Scatter(x=[current[0]], y=[current[1]], mode="markers", name="this tree",
                                 marker=dict(symbol="star", size=16, color=FOCUS),
                                 hovertemplate="this tree: %{x} nodes, %{y:.3f}<extra></extra>"))
    fig.update_xaxes(title="tree nodes (budget)")
    fig.update_yaxes(title=ytitle)
    return layout(fig, title)


def acceptance_chart(series: dict[str, list[float]]) -> go.Figure:
    """Per-position acceptance of the top-1 chain, one group of bars per draft position k (the share of steps whose
    first k drafted tokens were all accepted: vLLM's per-position counters count the same), one bar per source."""
    fig = go.Figure()
    for name, rates in series.items():
        fig.add_trace(go.Bar(x=list(range(1, len(rates) + 1)), y=list(rates), name=name,
                             hovertemplate=f"{name}<br>position %{{x}}: %{{y:.3f}}<extra></extra>"))
    fig.update_layout(barmode="group")
    fig.update_xaxes(title="draft position k (head k)", dtick=1)
    fig.update_yaxes(title="P(first k drafted tokens accepted)", range=[0, 1.02])
    return layout(fig, "acceptance per position (top-1 chain)")
