"""Page 1, the tree designer (/tree): the recommendation, then design a tree on a calibration, draw it with its mask,
edit, compare, repair for an engine and export.

The page opens with the one recommendation (workbench/plan/recommend.py) when a latency table is found. The optimizer's
tree follows the sidebar (acceptance model, budget, depth, ranks); any reference, file, pasted or recommended tree
can be shown instead (the optimizer's sliders are then disabled, saying why), edited node by node, scored on the
same calibration, diffed against another, repaired for an engine and downloaded in every export format. The tree
and its mask are one fragment: a click on a node or a mask cell redraws those two figures only. Node labels can be
the real tokens of a prompt (the only model load on this page). A served calibration's drafter drafts chains: the
page answers its K instead (ui/served_view.py).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from workbench import REPO_ROOT, WorkbenchError
from workbench.calibrate.folder import tree_table
from workbench.plan.recommend import comparable, designed_speedup, shape
from workbench.trees.optimize import acc_value_fn, best_dense_tree, expected_curve, optimal_tree, optimal_tree_from
from workbench.trees.tree import Tree, load_tree, reference_trees
from workbench.ui.recommendation import measured_beside, panel, provenance_of, ranked, readable_sweeps, speedup_view
from workbench.ui.served_view import served_designer
from workbench.ui.tree_drawing import TABLE_COLUMNS, TREE_HELP, compare_trees, edit_box, token_labels, tree_view
from workbench.ui.tree_export import export_view
from workbench.ui.inputs import shared_inputs
from workbench.ui.widgets import Source, chart, clean_error, drop_stale, fastest_for, int_slider, kept_upload, timed
from workbench.viz import interactive_figures

OPTIMIZER = "the optimizer's (sidebar settings)"
RECOMMENDED = "recommended: "


def tree_options(designed, user: list, recommended=None) -> dict[str, object]:
    """Every tree the designer can show, compare or export: {label: Tree or file path}; files load on pick."""
    out: dict[str, object] = {OPTIMIZER: designed}
    if recommended is not None:
        out[RECOMMENDED + recommended.name] = recommended
    out |= {f"reference: {name}": t for name, t in reference_trees().items()}
    out |= {f"file: {f.name}": f for f in sorted((REPO_ROOT / "trees").glob("*.json"))}
    out |= {f"yours: {t.name}": t for t in user}
    return out


def pick_tree(label: str, options: dict, num_heads: int, topk: int):
    """The tree behind an option label, checked against the heads and ranks of the accuracies (st.error if not)."""
    spec = options[label]
    try:
        return load_tree(str(spec) if isinstance(spec, Path) else spec, topk=topk, num_heads=num_heads)
    except WorkbenchError as e:
        st.error(f"{label}: {clean_error(e)}")
        return None


# ----------------------------------------------------------------------------------------------- callbacks


def _nearest(budget: int) -> None:
    """'price the nearest tree': the optimizer's tree at the largest budget the latency table prices."""
    st.session_state["tree_show"] = OPTIMIZER
    st.session_state["tree_budget"] = budget
    st.session_state.pop("tree_edit", None)


def _show(tree) -> None:
    """'show it in the designer': the recommended tree on display, without edits."""
    st.session_state["tree_show"] = RECOMMENDED + tree.name
    st.session_state.pop("tree_edit", None)


# ----------------------------------------------------------------------------------------------- cached work

@st.cache_data(max_entries=32, show_spinner=False)
def _designed(source_key: tuple, _src: Source, model: str, budget: int, depth: int, rank: int):
    """The optimizer's tree for the sidebar settings (not hardware-aware), once per setting."""
    if model == "empirical paths":
        return optimal_tree_from(_src.calib.joint_value("fit"), budget, depth, rank, name=f"empirical_{budget}")
    if model.startswith("dense"):
        return best_dense_tree(_src.acc, budget, depth, rank)
    return optimal_tree(_src.acc, budget, depth, rank, name=f"optimal_{budget}")


@st.cache_data(max_entries=32, show_spinner=False)
def _curves(source_key: tuple, _src: Source, depth: int, rank: int, top: int = 256) -> dict:
    curves = {"optimal (independence)": expected_curve(_src.acc, top, depth, rank)}
    if _src.calib is not None:
        curves["optimal (empirical)"] = expected_curve(_src.calib.joint_value("fit"), top, depth, rank)
    return curves


def _named_table(source_key: tuple, src: Source, named: list, depth: int, rank: int) -> tuple[dict, list]:
    """(the optimal curves, the named trees' rows with their headroom at the same size): both tabs' numbers."""
    curves = _curves(source_key, src, depth, rank)
    return curves, tree_table(named, src.acc, src.calib, curves["optimal (independence)"])


# ----------------------------------------------------------------------------------------------- the page

MODELS = ("independence", "empirical paths", "dense per level (vLLM)", "hardware-aware")
TABS = ("Export", "Tokens/step and speedup", "Named trees")  # below the tree; Export (cheapest to draw) opens first

def tree_page() -> None:
    with timed("page /tree"):
        _tree_page()


def _tree_page() -> None:
    st.title("Tree designer")
    shared = shared_inputs()
    src = shared.src
    if src is None:
        st.info("Pick a calibration folder or an accuracy table in the sidebar to design a tree.")
        return
    if src.served is not None:  # a chain drafter vLLM ran: K, not a tree
        served_designer(src, shared.lat)
        return
    K, R = src.acc.shape
    model = st.sidebar.radio("Acceptance model", MODELS, key="tree_model",
                             help="independence: product of per-head a_k^(i); empirical: measured joint path "
                                  "frequencies (calibration folder); dense per level: the best tree whose levels "
                                  "give every node the same top-c children, the only shape vLLM drafts as written; "
                                  "hardware-aware: best predicted speedup under a latency curve, up to the budget. "
                                  "It also colours any tree on display by its path probabilities.")
    settings = st.sidebar.container()  # the optimizer's sliders go here, drawn once we know what is on display
    indep = acc_value_fn(src.acc)
    empirical = src.calib.joint_value("fit") if src.calib else None
    if model == "empirical paths" and empirical is None:
        st.error("empirical paths need a calibration folder (its ranks.parquet): an accuracy table has only the "
                 "per-head marginals, so use the independence or hardware-aware model")
        return
    value = empirical if model == "empirical paths" else indep
    if model == "hardware-aware" and empirical is not None and st.sidebar.checkbox(
            "use empirical paths", value=False, key="tree_hw_joint"):
        value = empirical

    # the hardware: a latency table (every speedup on the page) and the sweeps that measured trees on it
    lat = shared.lat
    measured = measured_beside(readable_sweeps(), lat["tables"].batch if lat else 1, lat["frame"] if lat else None)
    user = user_tree_input(K)
    rec = _recommendation(src, lat, K, shared.max_new_tokens)
    pick = rec["pick"]["tree"] if rec is not None else None
    top = max(lat["tables"].seconds) - 1 if lat is not None else 256  # the largest tree the table prices
    budget, max_depth, max_rank, off = _optimizer_settings(settings, user, pick, K, R, min(63, max(top, 1)))
    designed = _designed_tree(src, model, value, empirical, lat, budget, max_depth, max_rank)
    if designed is None:
        return
    note = st.container()  # a fixed place, drawn or not: the tree and its mask below keep theirs (panel's docstring)
    if designed.nodes < budget and model != "hardware-aware" and off is None:
        note.caption(f"only {designed.nodes} nodes have a positive acceptance probability")

    shown = _on_display(src, designed, user, pick, K, R)
    if shown is None:
        return
    tree, base, edit, sig, label, options, against = shown
    shown_row, guess = _numbers(src, tree, rec, lat, measured, shared.max_new_tokens)

    # the tree and its mask, linked by the selected node (one fragment); optional real tokens as labels
    labels = None
    tokens = st.session_state.get("head_tokens")
    if tokens and st.session_state.get("tree_show_tokens", True):
        table = tokens["table"]
        if tree.depth <= len(table) and tree.max_rank < len(table[0]):
            labels = {p: table[len(p) - 1][p[-1]] for p in tree.paths} | {(): tokens["root"]}
    probs = {p: value(p) for p in tree.paths}
    tree_view(tree, probs, labels, f"{tree.name}: {tree.nodes} nodes, depth {tree.depth}",
              f"drawn tree: {tree.nodes} nodes, depth {tree.depth} ({model}, {src.label}). Node colour and edge "
              f"width: path probability ({'empirical' if value is empirical else 'independence'}); node label: "
              f"{'the token of its head for the prompt' if labels else 'rank (0 = top-1)'}. Drag to zoom, "
              "double-click to reset; click a node to select its mask row.")
    token_labels(R, tokens, labels)
    if against != "(nothing)":
        other = pick_tree(against, options, K, R)
        if other is not None:
            compare_trees(tree, other, indep, empirical, src)

    # below the tree, one section at a time (tabs that rerun when switched): a click redraws the open one only
    tabs = dict(zip(TABS, st.tabs(TABS, key="tree_tab", on_change="rerun")))
    with tabs["Export"]:
        if tabs["Export"].open:
            export_view(tree, base, designed, edit, label, model, budget, max_depth, max_rank, K, value, empirical,
                        src, guess, lat, sig)
    with tabs["Tokens/step and speedup"]:
        if tabs["Tokens/step and speedup"].open:
            _curves_view(src, named_trees(user), tree, shown_row, rec, lat, guess, max_depth, max_rank)
    with tabs["Named trees"]:
        if tabs["Named trees"].open:
            st.dataframe(pd.DataFrame(_named_table(src.key, src, named_trees(user), max_depth, max_rank)[1]),
                         hide_index=True, column_config=TABLE_COLUMNS)
            st.caption("Named trees (references, files under trees/, yours): predicted tokens per step.")


def _recommendation(src: Source, lat: dict | None, num_heads: int, max_new_tokens: int | None) -> dict | None:
    """The answer first: which tree (or chain, or none) to use, with its evidence (None without a latency table)."""
    if lat is None:
        st.info("No latency CSV found, so no recommendation: measure one with `workbench latency --calibration DIR` "
                "or give one in the sidebar (Hardware).")
        return None
    rec = ranked(src, lat["path"], lat["tables"], max_new_tokens=max_new_tokens)
    if rec is not None:
        panel(rec, "tree", num_heads, provenance_of(src) | dict(method="recommended", latency=lat["path"].name),
              show=_show, show_label="show this tree")
    return rec


def _optimizer_settings(settings, user: list, pick, K: int, R: int,
                        default: int) -> tuple[int, int, int, str | None]:
    """(budget, max depth, max rank, why they are off): the optimizer's settings apply to its tree only, so they
    are disabled, saying why, while another tree is on display. The budget starts at `default`: within the latency
    table, so the first tree drawn is one it can price."""
    shown_label = st.session_state.get("tree_show", OPTIMIZER)
    if shown_label not in tree_options(None, user, pick):
        shown_label = OPTIMIZER  # gone (a tree that stopped parsing): the selector below falls back to it too
    off = None if shown_label == OPTIMIZER else \
        f"applies to the optimizer's tree only; the tree on display is {shown_label.split(': ', 1)[-1]} (pick " \
        "\"the optimizer's\" above the drawing to use these settings)"
    with settings:
        budget = st.slider("Budget (tree nodes)", 1, 256, default, key="tree_budget", disabled=off is not None,
                           help=off or "most nodes the optimizer's tree may have (hardware-aware: the largest budget "
                                       "it tries)")
        max_depth = int_slider("Max depth (heads used)", K, K, "tree_depth", disabled=off is not None, help=off,
                               where=st)
        max_rank = int_slider("Max rank (top-k per head)", R, min(R, 10), "tree_rank", disabled=off is not None,
                              help=off, where=st)
        if off:
            st.caption(f"Budget, depth and rank: {off}.")
    return budget, max_depth, max_rank, off


def _designed_tree(src: Source, model: str, value, empirical, lat, budget: int, max_depth: int, max_rank: int):
    """The optimizer's tree for the sidebar's model and limits (hardware-aware: plan.fastest's); None on an error
    (said on the page)."""
    try:
        if model != "hardware-aware":
            return _designed(src.key, src, model, budget, max_depth, max_rank)
        if lat is None:
            st.error("hardware-aware needs a latency CSV (columns context,tokens,seconds): run `workbench latency` "
                     "or give one in the sidebar")
            return None
        designed = fastest_for(src.key, "empirical paths" if value is empirical else "independence", value,
                               lat["surface"], lat["tables"], max_depth, max_rank, budget)["tree"].tree
        return Tree(designed.paths, f"hardware_{designed.nodes}")  # named by what it is: its node count
    except WorkbenchError as e:
        st.error(clean_error(e))
        return None


def _on_display(src: Source, designed, user: list, pick, K: int, R: int):
    """Which tree: the optimizer's, the recommended, a reference, a file under trees/, or the user's own, with the
    edits on top. (tree, the tree before edits, the edit or None, its signature, its label, the options, the tree
    to compare with)."""
    options = tree_options(designed, user, pick)
    labels_list = list(options)
    c1, c2 = st.columns(2)
    gone = st.session_state.get("tree_show", OPTIMIZER)
    if drop_stale("tree_show", labels_list, OPTIMIZER):
        st.info(f"{gone.split(': ', 1)[-1]} is no longer available: showing the optimizer's tree.")
    shown = c1.selectbox("Tree on display (drawn, masked, exported)", labels_list, key="tree_show",
                         help="the optimizer's tree follows the sidebar settings; any other tree is shown as it "
                              "is, scored on the current calibration")
    others = ["(nothing)"] + [o for o in labels_list if o != shown]
    drop_stale("tree_compare", others, "(nothing)")
    against = c2.selectbox("Compare with", others, key="tree_compare",
                           help="diff two trees as one drawing: nodes only in A, only in B, shared, and their "
                                "expected tokens per step")
    base = pick_tree(shown, options, K, R)
    if base is None:
        st.info("Showing the optimizer's tree instead.")
        base = designed
    sig = f"{shown}|{hash(base.paths)}"
    edit = st.session_state.get("tree_edit")
    edit = edit if edit is not None and edit["sig"] == sig else None
    tree = Tree(tuple(map(tuple, edit["paths"])), f"{base.name or 'tree'}_{edit['suffix']}") if edit else base
    st.session_state["designed_tree"] = {"name": tree.name, "paths": tree.as_lists(), "source": src.label,
                                         "folder": src.folder}
    edit_box(tree, base, sig, K, R)
    return tree, base, edit, sig, shown, options, against


def _numbers(src: Source, tree, rec, lat, measured, max_new_tokens: int | None) -> tuple[dict, dict | None]:
    """The tree's metrics, each explained; the speedup from the same prediction as the recommendation, and a sweep's
    measurement of the same shape beside it. (its tree_table row, the predicted speedup or None)."""
    shown_row = tree_table([tree], src.acc, src.calib)[0]
    cols = st.columns(4)
    cols[0].metric("nodes", tree.nodes)
    cols[1].metric("depth", tree.depth)
    guess, top = None, max(lat["tables"].seconds) if lat is not None else 0
    unpriced = rec is not None and shown_row.get(rec["prediction"]) is not None and tree.nodes + 1 > top
    if unpriced:
        why = (f"{lat['path'].name} stops at {top} tokens per verify step at batch {rec['batch']}: a "
               f"{tree.nodes}-node tree needs {tree.nodes + 1}")
        cols[2].metric("predicted speedup", "n/a", help=why)
    elif rec is not None and shown_row.get(rec["prediction"]) is not None:
        guess = designed_speedup(src.calib if src.calib is not None else src.acc, tree, lat["tables"],
                                 max_new_tokens) | {"prediction": rec["prediction"]}
        rng = f" (range {guess['range'][0]:.2f}x-{guess['range'][1]:.2f}x)" if guess["range"] else ""
        cols[2].metric("predicted speedup", f"{guess['speedup']:.2f}x",
                       help=f"{rec['prediction']} (of the batch: it waits for its slowest sequence) / relative step "
                            f"cost t(n+1)/t(1) at batch {rec['batch']}, context "
                            f"{rec['context']} ({lat['path'].name}){rng}; the recommendation's formula")
    found = measured.get(shape(tree), []) if lat is not None else []  # shown even where the table cannot price it
    now = [m for m in found if comparable(m)]
    other = [m for m in found if m["elsewhere"]]
    if now:
        cols[3].metric("measured speedup", f"{now[0]['speedup']:.2f}x", help=f"this tree in {now[0]['sweep']}")
    elif other:
        cols[3].metric("measured speedup", f"{other[0]['speedup']:.2f}x (other setting)",
                       help=f"sweep {other[0]['sweep']}: {'; '.join(other[0]['elsewhere'])}: not comparable "
                            f"with {lat['path'].name}")
    if unpriced:
        c1, c2 = st.columns([3, 1])
        c1.caption(f"No predicted speedup: {why}. The nearest tree it prices has {top - 1} nodes.")
        c2.button(f"price the optimizer's {top - 1}-node tree", key="tree_nearest_btn", on_click=_nearest,
                  args=(top - 1,), help="the optimizer's tree (sidebar settings) at the largest budget the latency "
                                        "table prices")
    cols = st.columns(3)
    for col, k in zip(cols, ("predicted_independent", "predicted_joint", "predicted_replay")):
        if shown_row.get(k) is not None:
            col.metric(f"{k} (tokens/step)", f"{shown_row[k]:.3f}", help=TREE_HELP[k])
    return shown_row, guess


def _curves_view(src: Source, named: list, tree, shown_row: dict, rec, lat, guess, max_depth: int,
                 max_rank: int) -> None:
    """Expected tokens/step of the optimal trees at every budget with the named trees and this one, beside the
    recommendation's predicted speedups (or what the tokens/step numbers mean, without a latency table)."""
    left, right = st.columns(2)
    curves, named_rows = _named_table(src.key, src, named, max_depth, max_rank)
    points = {r["tree"]: (r["nodes"], r["predicted_independent"]) for r in named_rows if "predicted_independent" in r}
    with left:
        chart(interactive_figures.curves_chart({k: (range(len(v)), v) for k, v in curves.items()}, points,
                                               (tree.nodes, shown_row["predicted_independent"])),
              "Expected tokens per step (independence and empirical objectives) of the optimal tree at each "
              "budget; grey points: named trees (hover for names); star: this tree.", key="tree_curves_chart")
    with right:
        if rec is not None:
            speedup_view(rec, lat, tree, guess)
        else:
            st.markdown("**Reading the tokens/step numbers** (tokens emitted per decoding step, the base "
                        "model's own token included):\n\n" + "\n".join(f"- **{k}**: {v}" for k, v in TREE_HELP.items()))


def named_trees(user: list) -> list:
    """The named trees of the table and the curve: references, files under trees/, the user's."""
    out = []
    for label, spec in tree_options(None, user).items():
        if label == OPTIMIZER:
            continue
        t = pick_quiet(spec)
        if t is not None:
            out.append(t if t.name else Tree(t.paths, label))
    return out


def pick_quiet(spec):
    """A named tree for the table (None if a file there cannot be read: the selectbox reports it when picked)."""
    try:
        return load_tree(str(spec) if isinstance(spec, Path) else spec)
    except WorkbenchError:
        return None


def user_tree_input(num_heads: int) -> list:
    """An extra tree to compare: uploaded file, path, reference name or literal. A bad one is an st.error (and the
    tree on display says what it shows instead)."""
    with st.sidebar.expander("Your own tree (to show, edit, compare)"):
        up = kept_upload("Tree file (JSON or Medusa choices .py)", "tree_user_up", ["json", "py", "txt"])
        spec = str(up) if up is not None else st.text_input(
            "... or a path, reference name, or literal like [[0], [0, 0], [1]]", key="tree_user_spec").strip()
    if not spec:
        return []
    try:
        t = load_tree(spec, num_heads=num_heads)
    except WorkbenchError as e:
        st.error(f"your tree: {clean_error(e)}")
        return []
    return [t if t.name else Tree(t.paths, "your tree")]
