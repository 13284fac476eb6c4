"""workbench/viz/static_figures.py: each figure draws the numbers it is given (read back from the matplotlib artists),
the tree layout follows its rules, and `workbench tree show --png` writes the same drawing."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import LineCollection, PathCollection
from matplotlib.figure import Figure

from workbench.cli import main
from workbench.runtime.treemask import tree_buffers
from workbench.trees.accuracies import write_accuracies
from workbench.trees.optimize import acc_value_fn, optimal_tree
from workbench.trees.tree import load_tree, make_tree, reference_trees
from workbench.viz import static_figures, static_tradeoffs

pytestmark = pytest.mark.unit  # no model, no subprocess: the fast tier

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def acc():
    rng = np.random.default_rng(3)
    return rng.dirichlet(np.ones(8), size=4)[:, :6] * 0.9  # [4 heads, 6 ranks], rows sum < 1


# ----------------------------------------------------------------------------------------------- tree drawing

@pytest.mark.parametrize("name", sorted(reference_trees()))
def test_layout_rows_and_left_lean(name):
    tree = reference_trees()[name]
    pos = static_figures.tree_positions(tree)
    assert set(pos) == set(tree.paths) | {()}
    for p, (x, y) in pos.items():
        assert y == -len(p)  # one row per depth, root on top
    leaves = tree.leaves()
    assert len({pos[p][0] for p in leaves}) == len(leaves)  # leaves never overlap
    for p in tree.paths:  # a parent sits above its rank-smallest child
        kids = [c for c in tree.paths if c[:-1] == p]
        if kids:
            assert pos[p][0] == pos[min(kids, key=lambda c: c[-1])][0]
    chain = [p for p in tree.paths if set(p) == {0}]  # the all-top-1 chain runs down the left edge
    assert all(pos[p][0] == pos[()][0] == min(x for x, _ in pos.values()) for p in chain)


def test_draw_tree_labels_and_edge_widths(acc):
    tree = optimal_tree(acc, 12)
    fn = acc_value_fn(acc)
    probs = {p: fn(p) for p in tree.paths}
    fig = static_figures.draw_tree(tree, probs)
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.texts]
    assert sorted(texts) == sorted(["R"] + [str(p[-1]) for p in tree.paths])
    lines = [c for c in ax.collections if isinstance(c, LineCollection)][0]
    widths = np.asarray(lines.get_linewidths())
    vals = np.array([probs[child] for _, child in static_figures.to_networkx(tree).edges()])  # the drawing's edge order
    assert np.all(np.diff(widths[np.argsort(vals, kind="stable")]) >= 0)  # wider = more probable
    assert widths.max() > widths.min()
    labelled = static_figures.draw_tree(tree, None, {p: f"t{i}" for i, p in enumerate(tree.paths)} | {(): "root!"})
    assert {"root!", "t0", f"t{tree.nodes - 1}"} <= {t.get_text() for t in labelled.axes[0].texts}


def test_mask_heatmap_is_the_buffer():
    tree = reference_trees()["vicuna_7b_stage2"]
    fig = static_figures.mask_heatmap(tree, 10)
    img = fig.axes[0].images[0].get_array()
    assert np.array_equal(np.asarray(img), tree_buffers(tree, 10)["attn_mask"].numpy())


def test_tree_figure_has_tree_and_mask(tmp_path):
    tree = load_tree("[[0], [0, 0], [1], [0, 1]]")
    fig = static_figures.tree_figure(tree)
    assert isinstance(fig, Figure) and len(fig.axes) == 2 and fig.axes[1].images
    out = static_figures.save_png(fig, tmp_path / "sub" / "t.png")
    assert out.read_bytes()[:8] == PNG_MAGIC
    assert not list(out.parent.glob(".*tmp*"))  # atomic write left nothing behind


def test_cli_tree_show_png(tmp_path, acc, capsys):
    png = tmp_path / "tree.png"
    csv = write_accuracies(tmp_path / "acc.csv", acc)
    assert main(["tree", "show", "[[0], [0, 0], [1]]", "--accuracies", str(csv), "--png", str(png)]) == 0
    assert png.read_bytes()[:8] == PNG_MAGIC
    assert f"wrote {png}" in capsys.readouterr().err
    assert main(["tree", "show", "[[0], [0, 0, 1]]", "--png", str(tmp_path / "bad.png")]) == 2
    assert not (tmp_path / "bad.png").exists()


# ----------------------------------------------------------------------------------------------- trade-offs

@pytest.fixture
def sweep():
    rows = [dict(tree="vanilla", kind="vanilla", nodes=0, acceptance="greedy", tokens_per_step=1.0,
                 tokens_per_s=10.0, exact_match=1.0)]
    for n, a in ((4, 1.5), (8, 1.8), (16, 2.0)):
        rows += [dict(tree=f"opt{n}", kind="optimal", nodes=n, acceptance="greedy", tokens_per_step=a,
                      tokens_per_s=10 * a, predicted_independent=a + 0.1),
                 dict(tree=f"opt{n}b", kind="optimal", nodes=n, acceptance="greedy", tokens_per_step=a + 0.2,
                      tokens_per_s=10 * a),
                 dict(tree=f"dense{n}", kind="dense", nodes=n, acceptance="greedy", tokens_per_step=a - 0.3,
                      tokens_per_s=8 * a)]
    rows += [dict(tree="opt8", kind="optimal", nodes=8, acceptance="typical", temperature=t, epsilon=e,
                  tokens_per_step=2 + e + t, exact_match=1 - e) for t in (0.5, 1.0) for e in (0.05, 0.1, 0.3)]
    return pd.DataFrame(rows)


def test_tokens_vs_candidates(sweep):
    ax = static_tradeoffs.tokens_vs_candidates(sweep).axes[0]
    lines = {l.get_label(): l for l in ax.lines}
    assert set(lines) == {"dense", "optimal", "vanilla greedy"}
    assert list(lines["optimal"].get_xdata()) == [4, 8, 16]
    assert np.allclose(lines["optimal"].get_ydata(), [1.6, 1.9, 2.1])  # mean of the two optimal trees, greedy only
    assert np.allclose(lines["dense"].get_ydata(), [1.2, 1.5, 1.7])


def test_speed_vs_candidates(sweep):
    lines = {l.get_label(): l for l in static_tradeoffs.speed_vs_candidates(sweep).axes[0].lines}
    assert np.allclose(lines["dense"].get_ydata(), [12, 14.4, 16])
    assert np.allclose(lines["vanilla greedy"].get_ydata(), [10, 10])


def test_epsilon_plot(sweep):
    fig = static_tradeoffs.epsilon_plot(sweep)
    ax, ax2 = fig.axes[:2]
    assert len(ax.lines) == 2  # one per temperature
    assert list(ax.lines[0].get_xdata()) == [0.05, 0.1, 0.3]
    assert np.allclose(ax.lines[1].get_ydata(), [3.05, 3.1, 3.3])
    assert np.allclose(ax2.lines[0].get_ydata(), [0.95, 0.9, 0.7])


def test_predicted_vs_measured(sweep):
    ax = static_tradeoffs.predicted_vs_measured(sweep).axes[0]
    pts = [c for c in ax.collections if isinstance(c, PathCollection)]
    assert len(pts) == 1 and np.allclose(pts[0].get_offsets(), [[1.6, 1.5], [1.9, 1.8], [2.1, 2.0]])


def test_latency_curves():
    lat = pd.DataFrame([dict(model="m", device="cpu", dtype="float32", context=c, tokens=n, seconds=0.01 * n + c)
                        for c in (1, 2) for n in (1, 4, 16)])
    ax = static_tradeoffs.latency_curve(lat).axes[0]
    assert len(ax.lines) == 2 and np.allclose(ax.lines[0].get_ydata(), 1000 * (0.01 * np.array([1, 4, 16]) + 1))
    batched = pd.concat([lat.assign(batch=1), lat.assign(batch=4, seconds=lat["seconds"] * 2)])
    ax = static_tradeoffs.latency_curve(batched).axes[0]
    assert len(ax.lines) == 4  # one per batch size and context: batch sizes are not averaged together


# ----------------------------------------------------------------------------------------------- live decode

def test_accepted_lengths_and_throughput():
    ax = static_figures.accepted_lengths([1, 3, 2]).axes[0]
    assert [p.get_height() for p in ax.patches] == [1, 3, 2]
    ax = static_figures.throughput_bars({"Medusa": 30.0, "vanilla": 12.0}).axes[0]
    assert [p.get_height() for p in ax.patches] == [30.0, 12.0]


def test_big_tree_stays_drawable():
    tree = make_tree([(i,) for i in range(10)] + [(0, i) for i in range(10)] + [(0, 0, i) for i in range(10)] +
                     [(1, i) for i in range(10)] + [(0, 0, 0, i) for i in range(10)])
    fig = static_figures.tree_figure(tree)
    assert fig.get_figwidth() <= 24 + 4.5 + 1e-9
