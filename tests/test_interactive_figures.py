"""The app's interactive figures (plotly): node and mask row share the buffer index, the selected node lights up in
both, mask ticks are integers, token labels are cut to fit their node; the answer coloured by decoding step."""
from __future__ import annotations

import numpy as np
import pytest

from workbench.runtime.treemask import tree_buffers
from workbench.trees.tree import load_tree, make_tree
from workbench.viz import interactive_figures, interactive_tradeoffs

pytestmark = pytest.mark.unit  # no model, no subprocess: the fast tier

SPEC = make_tree([[0], [0, 0], [0, 1], [1], [1, 0], [2]], name="spec")


def node_trace(fig):
    return [t for t in fig.data if t.mode == "markers+text"]


def test_tree_nodes_carry_their_mask_row():
    fig = interactive_figures.tree_chart(SPEC, {p: 0.5 ** len(p) for p in SPEC.paths})
    (nodes,) = node_trace(fig)
    names = interactive_figures.node_names(SPEC)
    assert [int(c[0]) for c in nodes.customdata] == list(range(SPEC.nodes + 1))
    assert [c[1] for c in nodes.customdata] == [str(list(p)) for p in names]
    assert list(nodes.text) == ["R"] + [str(p[-1]) for p in names[1:]]  # ranks, 0-based
    assert all(f"mask row {i}" in h for i, h in enumerate(nodes.hovertext))
    mask = tree_buffers(SPEC)["attn_mask"]
    for i, p in enumerate(names):  # the row a node names is the one its ancestors light up in the mask
        assert [j for j in range(len(names)) if mask[i, j]] == sorted(names.index(p[:d]) for d in range(len(p) + 1))


def test_focus_lights_the_node_and_its_row():
    fig = interactive_figures.tree_chart(SPEC, focus=4)
    (nodes,) = node_trace(fig)
    assert [w for w in nodes.marker.line.width] == [3 if i == 4 else 1 for i in range(SPEC.nodes + 1)]
    red = [t for t in fig.data if t.mode == "lines" and t.line.color == interactive_figures.FOCUS]
    assert len(red) == 1 and len(red[0].y) == 3  # root -> [0] -> [0, 0]: node 4 in Medusa's order
    z = np.asarray(interactive_figures.mask_chart(SPEC, focus=4).data[0].z)
    assert (z[4] >= 2).all() and (np.delete(z, 4, axis=0) < 2).all()
    assert np.array_equal(z % 2, tree_buffers(SPEC)["attn_mask"].numpy())  # the mask itself is unchanged


def test_mask_ticks_are_integers_and_cells_selectable():
    small = interactive_figures.mask_chart(SPEC)
    assert list(small.layout.xaxis.tickvals) == list(range(SPEC.nodes + 1))
    big = load_tree("mc_sim_7b_63")
    assert interactive_figures.integer_ticks(64) == list(range(0, 64, 5))
    assert interactive_figures.integer_ticks(129)[:3] == [0, 10, 20]
    cells = interactive_figures.mask_chart(big).data[1]
    assert len(cells.x) == int(tree_buffers(big)["attn_mask"].sum())
    sel = {"points": [{"customdata": [int(cells.customdata[7][0]), "x"]}]}
    assert interactive_figures.picked_index(sel) == int(cells.y[7])
    assert interactive_figures.picked_index({"points": []}) is None


def test_token_labels_fit_and_diff_groups():
    labels = {(): "Paris", (0,): "Hello", (0, 0): "a", (0, 1): "abcdefgh", (1,): "x", (1, 0): "y", (2,): "z"}
    (nodes,) = node_trace(interactive_figures.tree_chart(SPEC, labels=labels))
    assert "abc…" in nodes.text and all(len(t) <= 4 for t in nodes.text)  # cut to fit, whole in the hover
    assert any("'abcdefgh'" in h for h in nodes.hovertext)
    status = {p: "only in A" for p in [(2,)]}
    groups = {t.name: len(t.x) for t in node_trace(interactive_figures.tree_chart(SPEC, status=status))}
    assert groups == {"shared": SPEC.nodes, "only in A": 1}  # the root counts as shared


def test_coloured_tokens_html_escapes():
    out = interactive_figures.coloured_tokens_html(["<b>", " a&b"], [0, 1])
    assert "&lt;b&gt;" in out and " a&amp;b" in out and "<b>" not in out
    assert 'title="step 1"' in out and 'title="step 2"' in out


def test_token_pieces_join_to_the_text():
    from support.tiny import tiny_tokenizer

    tok = tiny_tokenizer()
    ids = tok("hello world, ok").input_ids
    pieces = interactive_figures.token_pieces(tok, ids)
    assert len(pieces) == len(ids)
    assert "".join(pieces) == tok.decode(ids, skip_special_tokens=True)


def test_comparison_is_one_tree_coloured_by_side():
    a = make_tree([[0], [1], [0, 0]], name="a")
    b = make_tree([[0], [2], [0, 1]], name="b")
    fig = interactive_figures.comparison_chart(a, b)
    groups = {t.name: sorted(c[1] for c in t.customdata) for t in node_trace(fig)}
    assert groups == {"shared": ["[0]", "[]"], "only in A": ["[0, 0]", "[1]"], "only in B": ["[0, 1]", "[2]"]}
    assert {t.name: t.marker.color for t in node_trace(fig)} == dict(interactive_figures.STATUS_COLOURS)


def test_values_to_read_are_in_the_hover():
    acc = np.array([[0.5, 0.2], [0.3, 0.1]])
    heat = interactive_figures.accuracy_chart(acc).data[0]
    assert np.array_equal(np.asarray(heat.z), acc) and "%{z:.4f}" in heat.hovertemplate
    paths = interactive_figures.paths_chart([(0,), (0, 0)], [0.5, 0.15], [0.45, 0.2])
    points = [t for t in paths.data if t.mode == "markers"]
    assert [list(t.customdata) for t in points] == [["[0]"], ["[0, 0]"]]  # hover names the path


def test_speedup_chart_marks_measurements_from_elsewhere_and_the_spread():
    measured = [dict(nodes=3, speedup=0.9, noise=0.05, tree="t", sweep="new.csv", elsewhere=[]),
                dict(nodes=4, speedup=0.6, noise=None, tree="u", sweep="old.csv",
                     elsewhere=["provenance unknown (the setting was not recorded)"]),
                dict(nodes=5, speedup=0.5, noise=None, tree="v", sweep="1-thread.csv", elsewhere=["threads 2 vs 1"])]
    fig = interactive_tradeoffs.speedup_chart({"optimal trees": ([1, 3], [1.1, 1.2], [1.0, 1.1], [1.2, 1.3])},
                                            {"recommended": (3, 1.2)}, measured)
    names = [t.name for t in fig.data]
    assert names == ["optimal trees: latency spread", "optimal trees", "recommended",
                     "measured (this setting)", "measured elsewhere"]
    assert list(fig.data[3].error_y.array) == [0.05] and fig.data[4].marker.symbol == "diamond-open"
    assert list(fig.data[4].x) == [4, 5]  # another setting, or an unknown one, is drawn as not comparable


def test_latency_chart_names_lines_by_what_differs_and_draws_the_spread():
    import pandas as pd

    df = pd.DataFrame([dict(model="m", device="cpu", batch=b, context=128, tokens=n, seconds=0.01 * n * b,
                            seconds_q1=0.009 * n * b, seconds_q3=0.012 * n * b) for b in (1, 4) for n in (1, 2)])
    fig = interactive_tradeoffs.latency_chart(df)
    assert [t.name for t in fig.data] == ["batch 1", "batch 4"]
    assert np.allclose(fig.data[0].error_y.array, [2.0, 4.0])  # q3 - median, in ms
    assert np.allclose(fig.data[0].error_y.arrayminus, [1.0, 2.0])  # median - q1
    assert "no spread" not in fig.layout.title.text
    medians = interactive_tradeoffs.latency_chart(df.drop(columns=["seconds_q1", "seconds_q3"]))
    assert "no spread measured" in medians.layout.title.text


def test_tree_and_mask_pin_their_margins():
    """The designer redraws its tree and mask on every click: with their margins fixed up front (room for the axis
    labels, the colour bar, a diff's legend) plotly draws each once, where automatic margins draw it twice."""
    figs = [interactive_figures.tree_chart(SPEC, {p: 0.5 ** len(p) for p in SPEC.paths}),
            interactive_figures.tree_chart(SPEC, status={(2,): "only in A"}), interactive_figures.mask_chart(SPEC)]
    for fig in figs:
        assert fig.layout.margin.autoexpand is False and fig.layout.margin.l >= 50
        assert not fig.layout.xaxis.automargin and not fig.layout.yaxis.automargin
    assert figs[0].layout.margin.r > 100 and figs[1].layout.margin.b >= 40  # the colour bar; the legend below
