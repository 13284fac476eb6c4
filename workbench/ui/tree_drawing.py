"""The designer's drawing of a tree: the tree and its attention mask linked by the selected node (one fragment, so
a click redraws these two only), node labels from a prompt's real tokens, node edits, and two trees as one."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from workbench import WorkbenchError
from workbench.calibrate.folder import tree_table
from workbench.trees.tree import Tree, add_path, parse_path, remove_path, tree_diff
from workbench.ui.inputs import fragment
from workbench.ui.widgets import Source, chart, clean_error, drop_stale, load_model, timed
from workbench.viz import interactive_figures

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

@fragment
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
