"""Page 1, the tree designer (/tree): the recommendation, then design a tree on a calibration, draw it with its mask,
edit, compare, repair for an engine and export.

The page opens with the one recommendation (workbench/plan/recommend.py) when a latency table is found. The optimizer's
tree follows the sidebar (acceptance model, budget, depth, ranks); any reference, file, pasted or recommended tree
can be shown instead (the optimizer's sliders are then disabled, saying why), edited node by node, scored on the
same calibration, diffed against another, repaired for an engine and downloaded in every export format. The tree
and its mask are one fragment: a click on a node or a mask cell redraws those two figures only. Node labels can be
the real tokens of a prompt (the only model load on this page).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from workbench import REPO_ROOT, WorkbenchError
from workbench.calibrate.folder import tree_table
from workbench.export.engines import (FORMATS, SAFE_ENGINES, SUFFIXES, TRTLLM_MAX_DRAFT_LEN, best_engine_safe, engine_safe,
                                      export_tree, first_level_gaps, vllm_uniform)
from workbench.plan.recommend import comparable, designed_speedup, shape
from workbench.trees.optimize import (acc_value_fn, best_dense_tree, expected_curve, expected_length, optimal_tree,
                                      optimal_tree_from)
from workbench.trees.tree import (Tree, add_path, load_tree, parse_path, record_json, reference_trees, remove_path,
                                  tree_arrays, tree_diff, tree_record)
from workbench.ui.recommendation import (candidate_curves, measured_beside, panel, provenance_of, ranked,
                                         readable_sweeps)
from workbench.ui.widgets import (Source, accuracy_source, chart, clean_error, drop_stale, file_input, file_stamp,
                                  fastest_for, int_slider, kept_upload, latency_files, latency_picker,
                                  load_model, read_latency_file, timed)
from workbench.viz import interactive_figures, interactive_tradeoffs


def head_token_table(prompt: str, topk: int, model: str = "", heads_path: str = "") -> dict:
    """The model's next token and every head's top-k tokens at the end of `prompt` (node labels); blank model
    and heads = the demo."""
    from workbench.decode.loop import first_proposal  # torch: loaded when a model is, not when the page opens
    from workbench.runtime.generation import prepare_prompt

    base, tok, heads = load_model(model, heads_path, "auto")
    found = first_proposal(base, heads, prepare_prompt(tok, prompt), topk)
    show = lambda i: tok.decode([int(i)]).replace("\n", "\\n").strip() or repr(tok.decode([int(i)]))  # noqa: E731
    return {"prompt": prompt, "root": show(found["base"]["ids"][0]),
            "table": [[show(i) for i in head["ids"]] for head in found["heads"]]}


OPTIMIZER = "the optimizer's (sidebar settings)"
RECOMMENDED = "recommended: "
TREE_HELP = {  # the three predictions of workbench/calibrate/folder.py, by the names they have everywhere
    "predicted_independent": "expected tokens per decoding step under independent heads: 1 + the sum over nodes of "
                             "the product of per-head accuracies a_k^(i) (fit prompts); the 1 is the base model's "
                             "own token",
    "predicted_joint": "expected tokens per step from measured joint path frequencies (fit prompts): no "
                       "independence assumption",
    "predicted_replay": "tokens per step a greedy decoder with this tree gets when replayed over the held-out "
                        "prompts' answers: what `workbench decode` measures",
    "optimal at same size": "the independence-optimal tree with as many nodes: the headroom of this shape",
}
TABLE_COLUMNS = {k: st.column_config.NumberColumn(k.replace("predicted_", "").replace(" at same size", ""), help=v,
                                                 format="%.3f", width="small") for k, v in TREE_HELP.items()} | \
    {"nodes": st.column_config.NumberColumn(width="small"), "depth": st.column_config.NumberColumn(width="small")}


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

def _edit_tree(action: str, tree, sig: str, num_heads: int, topk: int) -> None:
    """Button callback: add or remove a node of the tree on display (kept per source tree), or reset it. After a
    removal the remove box shows no node (the removed one is gone from its options)."""
    st.session_state["tree_edit_error"] = None
    try:
        if action == "add":
            new = add_path(tree, parse_path(st.session_state.get("tree_add", "")), num_heads, topk)
        elif action == "remove":
            picked = st.session_state.get("tree_remove")
            if not picked:
                raise WorkbenchError("pick a node to remove first")
            new = remove_path(tree, parse_path(picked.strip("[]")))
            st.session_state["tree_remove"] = None
        else:
            st.session_state.pop("tree_edit", None)
            return
        st.session_state["tree_edit"] = {"sig": sig, "paths": new.as_lists(), "method": "edited",
                                         "suffix": "edited", "note": None}
    except WorkbenchError as e:
        st.session_state["tree_edit_error"] = str(e)


def _repair(tree, sig: str, engine: str, value, num_heads: int, best: bool, budget: int, depth: int,
            rank: int) -> None:
    """Button callback: the shown tree repaired for an engine (export.engine_safe), or the best tree that engine
    builds as written within the same node count (export.best_engine_safe); shown as an edit of the tree."""
    st.session_state["tree_edit_error"] = None
    try:
        if best:
            new = best_engine_safe(value, engine, budget, depth, rank)
            note = (f"best {engine}-safe tree within {budget} nodes: {new.nodes} nodes, expected "
                    f"{expected_length(new, value):.4f} tokens/step (this tree: {expected_length(tree, value):.4f})")
        else:
            new, note = engine_safe(tree, engine, value, max_nodes=TRTLLM_MAX_DRAFT_LEN if engine == "trtllm" else None,
                                    heads=num_heads)
        st.session_state["tree_edit"] = {"sig": sig, "paths": new.as_lists(), "note": note,
                                         "method": f"{'best' if best else 'repaired'} {engine}-safe",
                                         "suffix": f"{engine}_safe"}
    except WorkbenchError as e:
        st.session_state["tree_edit_error"] = str(e)


def _show(tree) -> None:
    """'show it in the designer': the recommended tree on display, without edits."""
    st.session_state["tree_show"] = RECOMMENDED + tree.name
    st.session_state.pop("tree_edit", None)


def _focus_from_chart(chart_key: str, names: list) -> None:
    """Chart callback: a clicked tree node or mask cell selects that node (by its path, so the selection follows
    the node when an edit renumbers the rows)."""
    state = st.session_state.get(chart_key)
    idx = interactive_figures.picked_index(state.get("selection") if state else None)
    if idx is not None and idx < len(names):
        st.session_state["tree_focus_node"] = names[idx] if idx else None


def _focus_from_pick(names: list) -> None:
    pick = st.session_state.get("tree_focus_pick", -1)
    st.session_state["tree_focus_node"] = names[pick] if pick is not None and 0 < pick < len(names) else None


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

TABS = ("Export", "Tokens/step and speedup", "Named trees")  # below the tree; Export (cheapest to draw) opens first

def tree_page() -> None:
    with timed("page /tree"):
        _tree_page()


def _tree_page() -> None:
    st.title("Tree designer")
    src = accuracy_source("tree")
    if src is None:
        st.info("Pick a calibration folder or an accuracy table in the sidebar to design a tree.")
        return
    K, R = src.acc.shape
    key = src.key
    models = ["independence", "empirical paths", "dense per level (vLLM)", "hardware-aware"]
    model = st.sidebar.radio("Acceptance model", models, key="tree_model",
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
    base_value = empirical if model == "empirical paths" else indep
    if model == "hardware-aware" and empirical is not None and st.sidebar.checkbox(
            "use empirical paths", value=False, key="tree_hw_joint"):
        base_value = empirical

    # the hardware: a latency table (every speedup on the page) and the sweeps that measured trees on it
    lat = hardware_input(src)
    measured = measured_beside(readable_sweeps(), lat["tables"]["batch"] if lat else 1, lat["frame"] if lat else None)
    user = user_tree_input(K)

    # the answer first: which tree (or chain, or none) to use, with its evidence
    named = named_trees(user)
    rec = None
    if lat is not None:
        rec = ranked(src, lat["path"], lat["tables"])
        if rec is not None:
            panel(rec, "tree", K, provenance_of(src) | dict(method="recommended", latency=lat["path"].name),
                  show=_show, show_label="show this tree")
    else:
        st.info("No latency CSV found, so no recommendation: measure one with `workbench latency --calibration DIR` "
                "or give one in the sidebar (Hardware).")
    pick = rec["pick"]["tree"] if rec is not None else None

    # the optimizer's settings apply to its tree only: disabled, saying why, while another tree is on display
    shown_label = st.session_state.get("tree_show", OPTIMIZER)
    if shown_label not in tree_options(None, user, pick):
        shown_label = OPTIMIZER  # gone (a tree that stopped parsing): the selector below falls back to it too
    off = None if shown_label == OPTIMIZER else \
        f"applies to the optimizer's tree only; the tree on display is {shown_label.split(': ', 1)[-1]} (pick " \
        "\"the optimizer's\" above the drawing to use these settings)"
    with settings:
        budget = st.slider("Budget (tree nodes)", 1, 256, 63, key="tree_budget", disabled=off is not None,
                           help=off or "most nodes the optimizer's tree may have (hardware-aware: the largest budget "
                                       "it tries)")
        max_depth = int_slider("Max depth (heads used)", K, K, "tree_depth", disabled=off is not None, help=off,
                               where=st)
        max_rank = int_slider("Max rank (top-k per head)", R, min(R, 10), "tree_rank", disabled=off is not None,
                              help=off, where=st)
        if off:
            st.caption(f"Budget, depth and rank: {off}.")

    try:
        if model == "hardware-aware":
            if lat is None:
                st.error("hardware-aware needs a latency CSV (columns context,tokens,seconds): run `workbench latency` "
                         "or give one in the sidebar")
                return
            designed = fastest_for(key, "empirical paths" if base_value is empirical else "independence",
                                   base_value, lat["tables"], max_depth, max_rank, budget)["tree"]["tree"]
            designed = Tree(designed.paths, f"hardware_{designed.nodes}")  # named by what it is: its node count
        else:
            designed = _designed(key, src, model, budget, max_depth, max_rank)
    except WorkbenchError as e:
        st.error(clean_error(e))
        return
    if designed.nodes < budget and model != "hardware-aware" and off is None:
        st.caption(f"only {designed.nodes} nodes have a positive acceptance probability")

    # which tree: the optimizer's, the recommended, a reference, a file under trees/, or the user's own; edits on top
    pick = rec["pick"]["tree"] if rec is not None else None
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
    edited = edit is not None and edit["sig"] == sig
    tree = Tree(tuple(map(tuple, edit["paths"])), f"{base.name or 'tree'}_{edit['suffix']}") if edited else base
    st.session_state["designed_tree"] = {"name": tree.name, "paths": tree.as_lists(), "source": src.label,
                                         "folder": src.folder}
    edit_box(tree, base, sig, K, R)

    # numbers: full labels, each explained; the speedup from the same prediction as the recommendation
    shown_row = tree_table([tree], src.acc, src.calib)[0]
    cols = st.columns(4)
    cols[0].metric("nodes", tree.nodes)
    cols[1].metric("depth", tree.depth)
    guess, top = None, max(lat["tables"]["seconds"]) if lat is not None else 0
    if rec is not None and shown_row.get(rec["prediction"]) is not None and tree.nodes + 1 > top:
        cols[2].metric("predicted speedup", "n/a", help=f"{lat['path'].name} stops at {top} tokens per step: a "
                                                        f"{tree.nodes}-node tree needs {tree.nodes + 1}")
    elif rec is not None and shown_row.get(rec["prediction"]) is not None:
        guess = designed_speedup(src.calib if src.calib is not None else src.acc, tree, lat["tables"]) | \
            {"prediction": rec["prediction"]}
        rng = f" (range {guess['range'][0]:.2f}x-{guess['range'][1]:.2f}x)" if guess["range"] else ""
        cols[2].metric("predicted speedup", f"{guess['speedup']:.2f}x",
                       help=f"{rec['prediction']} (of the batch: it waits for its slowest sequence) / relative step "
                            f"cost t(n+1)/t(1) at batch {rec['batch']}, context "
                            f"{rec['context']} ({lat['path'].name}){rng}; the recommendation's formula")
        found = measured.get(shape(tree), [])
        now = [m for m in found if comparable(m)]
        other = [m for m in found if m["elsewhere"]]
        if now:
            cols[3].metric("measured speedup", f"{now[0]['speedup']:.2f}x", help=f"this tree in {now[0]['sweep']}")
        elif other:
            cols[3].metric("measured speedup", f"{other[0]['speedup']:.2f}x (other setting)",
                           help=f"sweep {other[0]['sweep']}: {'; '.join(other[0]['elsewhere'])}: not comparable "
                                f"with {lat['path'].name}")
    cols = st.columns(3)
    for col, k in zip(cols, ("predicted_independent", "predicted_joint", "predicted_replay")):
        if shown_row.get(k) is not None:
            col.metric(f"{k} (tokens/step)", f"{shown_row[k]:.3f}", help=TREE_HELP[k])

    # the tree and its mask, linked by the selected node (one fragment); optional real tokens as labels
    labels = None
    tokens = st.session_state.get("head_tokens")
    if tokens and st.session_state.get("tree_show_tokens", True):
        table = tokens["table"]
        if tree.depth <= len(table) and tree.max_rank < len(table[0]):
            labels = {p: table[len(p) - 1][p[-1]] for p in tree.paths} | {(): tokens["root"]}
    probs = {p: base_value(p) for p in tree.paths}
    tree_view(tree, probs, labels, f"{tree.name}: {tree.nodes} nodes, depth {tree.depth}",
              f"drawn tree: {tree.nodes} nodes, depth {tree.depth} ({model}, {src.label}). Node colour and edge "
              f"width: path probability ({'empirical' if base_value is empirical else 'independence'}); node label: "
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
            export_view(tree, base, designed, edit if edited else None, shown, model, budget, max_depth, max_rank, K,
                        base_value, empirical, src, guess, lat, sig)
    with tabs["Tokens/step and speedup"]:
        if tabs["Tokens/step and speedup"].open:
            left, right = st.columns(2)
            curves, named_rows = _named_table(key, src, named, max_depth, max_rank)
            points = {r["tree"]: (r["nodes"], r["predicted_independent"]) for r in named_rows
                      if "predicted_independent" in r}
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
                                "model's own token included):\n\n" + "\n".join(f"- **{k}**: {v}"
                                                                               for k, v in TREE_HELP.items()))
    with tabs["Named trees"]:
        if tabs["Named trees"].open:
            st.dataframe(pd.DataFrame(_named_table(key, src, named, max_depth, max_rank)[1]), hide_index=True,
                         column_config=TABLE_COLUMNS)
            st.caption("Named trees (references, files under trees/, yours): predicted tokens per step.")


def hardware_input(src: Source) -> dict | None:
    """Sidebar: the latency CSV (from the calibration folder, the results folder, or given) and its setup, batch
    size and context. {"path", "tables", "frame"} or None (nothing found or unreadable: said on the page)."""
    with st.sidebar.expander("Hardware: latency table", expanded=True):
        path = file_input("latency CSV", "tree_lat", ["csv"], latency_files(src))
        if path is None:
            return None
        try:
            df = read_latency_file(str(path), file_stamp(path))
            tables = latency_picker(df, "tree", path.name, src.calib.typical_context() if src.calib else None,
                                    where=st)
        except WorkbenchError as e:
            st.error(clean_error(e))
            return None
        st.caption(f"{path.name}: batch {tables['batch']}, context {tables['context']}, "
                   f"{len(tables['seconds'])} token counts" + ("" if tables["spread"] else "; no spread measured")
                   + ("; each tree priced at its own depth (the heads' cost is measured)" if tables.get("head_cost") else
                      "; no heads' cost: trees priced at the depth the table timed (`workbench latency --heads DIR` "
                      "times it)"))
    return {"path": path, "tables": tables, "frame": df}


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


def edit_box(tree, base, sig: str, K: int, R: int) -> None:
    """Add / remove / reset, the engine repair's note, and what the edits changed."""
    edit = st.session_state.get("tree_edit")
    with st.expander(f"Edit {tree.name or 'this tree'} (add or remove nodes)", expanded=tree is not base):
        c1, c2, c3 = st.columns([2, 2, 1])
        c1.text_input("Add node (0-based ranks, e.g. 0,1)", key="tree_add",
                      help="a path of ranks, one per head: 0,1 = head 2's second guess under head 1's top guess; "
                           "its parent must be in the tree")
        c1.button("add node", key="tree_add_btn", on_click=_edit_tree, args=("add", tree, sig, K, R))
        nodes = [str(list(p)) for p in tree.sorted_paths]
        drop_stale("tree_remove", nodes + [None], None)
        c2.selectbox("Remove node (and its descendants)", nodes, key="tree_remove", index=None,
                     placeholder="pick a node")
        c2.button("remove node", key="tree_remove_btn", on_click=_edit_tree, args=("remove", tree, sig, K, R))
        c3.button("reset edits", key="tree_reset_btn", on_click=_edit_tree, args=("reset", tree, sig, K, R),
                  disabled=tree is base)
        if st.session_state.get("tree_edit_error"):
            st.error(st.session_state["tree_edit_error"])
        if tree is not base:
            d = tree_diff(base, tree)
            if edit and edit.get("note"):
                st.caption(edit["note"])
            st.caption(f"edited from {base.name}: added {[list(p) for p in d['only_b']] or 'none'}, removed "
                       f"{[list(p) for p in d['only_a']] or 'none'}")


@st.fragment
def tree_view(tree, probs: dict, labels, title: str, caption: str) -> None:
    """The tree and its mask, linked by the selected node: a click on either redraws this fragment only."""
    with timed("fragment tree view"):
        names = interactive_figures.node_names(tree)
        node = st.session_state.get("tree_focus_node")
        node = tuple(node) if node is not None else None
        focus = names.index(node) if node in names else None
        if node is not None and focus is None:
            st.session_state["tree_focus_node"] = None  # the selected node was removed
        st.session_state["tree_focus_pick"] = -1 if focus is None else focus
        chart(interactive_figures.tree_chart(tree, probs, labels, focus, title=title), caption, key="tree_chart",
              on_select=lambda: _focus_from_chart("tree_chart", names))
        left, right = st.columns([3, 2])
        with left:
            chart(interactive_figures.mask_chart(tree, focus), key="mask_chart",
                  on_select=lambda: _focus_from_chart("mask_chart", names))
        with right:
            st.selectbox("Selected node (= mask row)", [-1] + list(range(len(names))), key="tree_focus_pick",
                         format_func=lambda i: "none" if i < 0 else f"row {i}: {list(names[i]) if i else 'root'}",
                         help="click a tree node or a mask cell to select it here; the selection follows the node "
                              "through edits", on_change=_focus_from_pick, args=(names,))
            if focus is not None:
                p = names[focus]
                st.markdown(f"**row {focus}**: " + (f"node `{list(p)}`, head {len(p)}'s rank-{p[-1]} guess (0 = "
                                                     "top-1)" if p else "the root (the base model's own token)"))
                st.markdown(f"attends to rows {[names.index(p[:d]) for d in range(len(p) + 1)]} (root, ancestors, "
                            f"itself); P(accepted) {probs.get(p, 1.0):.4f}"
                            + (f"; token `{labels[p]}`" if labels and p in labels else ""))
            st.caption("Mask: row = query node, column = key node, in buffer order (node i = the i-th path sorted "
                       "by depth then ranks, 0 = root); dark = may attend.")


def token_labels(R: int, tokens, labels) -> None:
    with st.expander("Label nodes with real tokens for a prompt (loads the demo model)"):
        prompt = st.text_input("Prompt", "What is the capital of France?", key="tree_prompt")
        c1, c2 = st.columns(2)
        tok_model = c1.text_input("Model (blank: the demo)", key="tree_tok_model").strip()
        tok_heads = c2.text_input("Heads (blank: the demo heads)", key="tree_tok_heads").strip()
        st.checkbox("show tokens", value=True, key="tree_show_tokens")
        if st.button("Load the model and label the tree", key="tree_tokens_btn"):
            try:
                with st.status("Loading the model and heads (the first time reads the weights: up to a minute "
                               "on a CPU)...", expanded=False) as status:
                    st.session_state["head_tokens"] = head_token_table(prompt, max(R, 10), tok_model, tok_heads)
                    status.update(label="Loaded; labelling the tree.", state="complete")
                st.rerun()
            except (WorkbenchError, OSError, RuntimeError) as e:
                st.error(clean_error(e))
        if tokens:
            st.caption(f"tokens for: {tokens['prompt']!r}; the base model's next token is {tokens['root']!r}"
                       + ("" if labels or not st.session_state.get("tree_show_tokens", True) else
                          f"; this tree needs more heads or ranks than the {len(tokens['table'])} heads x "
                          f"top-{len(tokens['table'][0])} labelled"))


def speedup_view(rec: dict, lat: dict, tree, guess: dict | None) -> None:
    """Predicted speedup of the optimal trees and chains at the recommendation's batch and context, the pick and
    this tree marked, and every sweep measurement (other settings hollow)."""
    picks = {"recommended": (rec["pick"]["nodes"], rec["pick"]["speedup"])}
    if guess is not None:
        picks["this tree"] = (tree.nodes, guess["speedup"])
    measured = [m for r in rec["candidates"] for m in r["measured"]]
    chart(interactive_tradeoffs.speedup_chart(candidate_curves(rec), picks, measured,
                                            title=f"predicted speedup, batch {rec['batch']}, context {rec['context']}"),
          f"Predicted from {rec['prediction']} and {lat['path'].name} (recommended: {rec['pick']['label']}); "
          "diamonds: sweep measurements of the same tree shapes (hollow grey: another setting, or one not recorded, "
          "not comparable).",
          key="tree_speedup_chart")


def export_view(tree, base, designed, edit, shown: str, model: str, budget: int, max_depth: int, max_rank: int,
                K: int, value, empirical, src: Source, guess: dict | None, lat, sig: str) -> None:
    """Tree buffers, downloads in every format (no rerun on click), and each export warning with the in-app repair
    beside it."""
    with st.expander("Tree buffers (Medusa's generate_medusa_buffers)"):
        buf = tree_arrays(tree, max(tree.max_rank + 1, 10))
        c1, c2 = st.columns(2)
        c1.dataframe(pd.DataFrame({"tree_indices": buf["tree_indices"].tolist(),
                                   "position_ids": buf["position_ids"].tolist(),
                                   "parent": buf["parents"].tolist()}))
        c2.dataframe(pd.DataFrame(buf["retrieve_indices"].tolist()).add_prefix("d"))
    st.subheader("Export")
    provenance = dict(expected_acceptance_length=expected_length(tree, value),
                      budget=budget if tree is designed else tree.nodes,
                      method=(model if tree is designed else edit["method"] if edit else shown.split(":")[0]),
                      acceptance_model="empirical paths" if value is empirical else "independence",
                      max_depth=max_depth, max_rank=max_rank, heads=K, ranks=src.acc.shape[1]) | provenance_of(src)
    if tree is not base:
        provenance["edited_from"] = base.name
    if guess is not None:  # the same numbers as the page's metric and the recommendation
        provenance |= dict(predicted_tokens_per_step=guess["tokens_per_step"], prediction=guess["prediction"],
                           predicted_speedup=guess["speedup"], relative_latency=guess["relative_latency"],
                           latency=lat["path"].name, context=lat["tables"]["context"], batch=lat["tables"]["batch"])
    tree_file = record_json(tree_record(Tree(tree.paths, tree.name or "tree"), **provenance))
    cols = st.columns(len(FORMATS))
    warns = {}
    for col, fmt in zip(cols, FORMATS):
        text, warns[fmt] = export_tree(tree, fmt, heads=K, front="app")
        if fmt == "json":  # a tree file like `workbench optimize --out` writes: with its provenance
            text = tree_file
        col.download_button(fmt, text, file_name=f"{tree.name}{SUFFIXES[fmt]}", key=f"export_{fmt}",
                            on_click="ignore", help=f"{tree.name} in the {fmt} format")
    if edit and edit.get("note"):  # what the last repair changed, where its button was
        st.info(edit["note"])
    needs = {"trtllm": bool(first_level_gaps(tree)) or tree.nodes > 63, "vllm": not vllm_uniform(tree)}
    for fmt in FORMATS:
        for w in warns[fmt]:
            st.warning(f"**{fmt}**: {w}")
        if fmt in SAFE_ENGINES and needs[fmt]:
            c1, c2, c3 = st.columns([1, 1, 2])
            c1.button(f"repair for {fmt}", key=f"tree_repair_{fmt}_btn", on_click=_repair,
                      args=(tree, sig, fmt, value, K, False, tree.nodes, max_depth, max_rank),
                      help=f"export.engine_safe: the closest tree {fmt} builds exactly as written (what the CLI's "
                           f"--engine-safe {fmt} does), shown here as an edit")
            c2.button(f"best {fmt}-safe tree", key=f"tree_best_{fmt}_btn", on_click=_repair,
                      args=(tree, sig, fmt, value, K, True, tree.nodes, max_depth, max_rank),
                      help=f"export.best_engine_safe: the most valuable tree of at most {tree.nodes} nodes that "
                           f"{fmt} builds as written")
            c3.caption(f"The buttons replace the tree on display by one {fmt} builds as written; `reset edits` "
                       "goes back.")
    with st.expander("The JSON tree file (what the json button downloads)"):
        st.code(tree_file, language="json")


def pick_quiet(spec):
    """A named tree for the table (None if a file there cannot be read: the selectbox reports it when picked)."""
    try:
        return load_tree(str(spec) if isinstance(spec, Path) else spec)
    except WorkbenchError:
        return None


def compare_trees(a, b, indep, empirical, src: Source) -> None:
    """Two trees as one drawing (their union, coloured shared / only in A / only in B) and what each brings."""
    d = tree_diff(a, b)
    st.subheader(f"A = {a.name} vs B = {b.name}")
    value = empirical or indep
    rows = tree_table([Tree(a.paths, f"A: {a.name}"), Tree(b.paths, f"B: {b.name}")], src.acc, src.calib)
    st.dataframe(pd.DataFrame(rows), hide_index=True, column_config=TABLE_COLUMNS)
    st.caption(f"{len(d['shared'])} shared nodes, {len(d['only_a'])} only in A, {len(d['only_b'])} only in B; "
               "predicted tokens per step in the table (names as on the rest of the page)")
    chart(interactive_figures.comparison_chart(a, b, title=f"A ({a.nodes} nodes) and B ({b.nodes} nodes) as one tree"),
          key="diff_chart")
    diff = [{"node": str(list(p)), "in": side, "P(accepted)": value(p)}
            for side, ps in (("only A", d["only_a"]), ("only B", d["only_b"])) for p in ps]
    if diff:
        st.dataframe(pd.DataFrame(diff), hide_index=True, column_config={"P(accepted)": st.column_config.NumberColumn(
            help=f"the node's path probability ({'empirical' if empirical else 'independence'}): what it adds "
                 "to the expected tokens per step", format="%.4f")})


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
