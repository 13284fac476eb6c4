"""Page 1, the tree designer (/tree): design a tree on a calibration, draw it with its mask, edit, compare, export.

The optimizer's tree follows the sidebar (acceptance model, budget, depth, ranks); any reference, file or pasted
tree can be shown, edited node by node, scored on the same calibration, diffed against another, and downloaded in
every export format. Node labels can be the real tokens of a prompt (the only model load on this page).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from workbench import REPO_ROOT, WorkbenchError
from workbench import figures, plots
from workbench.ui.widgets import (Source, accuracy_source, clean_error, drop_stale, figure, file_input, file_stamp,
                                  found_csvs, int_slider, latency_picker, load_model, read_latency_file,
                                  read_sweep_file, upload_path)


def head_token_table(prompt: str, topk: int, model: str = "", heads_path: str = "") -> dict:
    """The model's next token and every head's top-k tokens at the end of `prompt` (node labels); blank model
    and heads = the demo."""
    from workbench.decode import first_proposal
    from workbench.generation import prepare_prompt

    base, tok, heads = load_model(model, heads_path, "auto")
    found = first_proposal(base, heads, prepare_prompt(tok, prompt), topk)
    show = lambda i: tok.decode([int(i)]).replace("\n", "\\n").strip() or repr(tok.decode([int(i)]))  # noqa: E731
    return {"prompt": prompt, "root": show(found["base"]["ids"][0]),
            "table": [[show(i) for i in head["ids"]] for head in found["heads"]]}


OPTIMIZER = "the optimizer's (sidebar settings)"
TREE_HELP = {  # the three predictions of workbench/calibration.py, by the names they have everywhere
    "predicted_independent": "expected tokens per decoding step under independent heads: 1 + the sum over nodes of "
                             "the product of per-head accuracies a_k^(i) (fit prompts); the 1 is the base model's "
                             "own token",
    "predicted_joint": "expected tokens per step from measured joint path frequencies (fit prompts): no "
                       "independence assumption",
    "predicted_replay": "tokens per step a greedy decoder with this tree gets when replayed over the held-out "
                        "prompts' answers: what `workbench decode` measures",
    "optimal at same size": "the independence-optimal tree with as many nodes: the headroom of this shape",
}
TABLE_COLUMNS = {k: st.column_config.NumberColumn(help=v, format="%.3f") for k, v in TREE_HELP.items()}


def tree_options(designed, user: list) -> dict[str, object]:
    """Every tree the designer can show, compare or export: {label: Tree or file path}; files load on pick."""
    from workbench.tree import reference_trees

    out: dict[str, object] = {OPTIMIZER: designed}
    out |= {f"reference: {name}": t for name, t in reference_trees().items()}
    out |= {f"file: {f.name}": f for f in sorted((REPO_ROOT / "trees").glob("*.json"))}
    out |= {f"yours: {t.name}": t for t in user}
    return out


def pick_tree(label: str, options: dict, num_heads: int, topk: int):
    """The tree behind an option label, checked against the heads and ranks of the accuracies (st.error if not)."""
    from workbench.tree import load_tree

    spec = options[label]
    try:
        return load_tree(str(spec) if isinstance(spec, Path) else spec, topk=topk, num_heads=num_heads)
    except WorkbenchError as e:
        st.error(f"{label}: {clean_error(e)}")
        return None


def _edit_tree(action: str, tree, sig: str, num_heads: int, topk: int) -> None:
    """Button callback: add or remove a node of the tree on display (kept per source tree), or reset it."""
    from workbench.tree import add_path, parse_path, remove_path

    st.session_state["tree_edit_error"] = None
    try:
        if action == "add":
            new = add_path(tree, parse_path(st.session_state.get("tree_add", "")), num_heads, topk)
        elif action == "remove":
            new = remove_path(tree, parse_path(st.session_state.get("tree_remove", "")))
        else:
            st.session_state.pop("tree_edit", None)
            return
        st.session_state["tree_edit"] = {"sig": sig, "paths": new.as_lists()}
    except WorkbenchError as e:
        st.session_state["tree_edit_error"] = str(e)


def _focus_from(chart_key: str) -> None:
    """Chart callback: a clicked tree node or mask cell selects that node (the focus selectbox follows)."""
    state = st.session_state.get(chart_key)
    idx = figures.picked_index(state.get("selection") if state else None)
    if idx is not None:
        st.session_state["tree_focus_pick"] = idx


def tree_page() -> None:
    from workbench.export import FORMATS, SUFFIXES, export_tree
    from workbench.calibration import tree_table
    from workbench.optimize import (acc_value_fn, best_dense_tree, expected_curve, expected_length, optimal_tree,
                                    optimal_tree_from)
    from workbench.tree import Tree, record_json, tree_buffers, tree_diff, tree_record

    st.title("Tree designer")
    src = accuracy_source("tree")
    if src is None:
        st.info("Pick a calibration folder or an accuracy table in the sidebar to design a tree.")
        return
    K, R = src.acc.shape
    models = ["independence", "empirical paths", "dense per level (vLLM)", "hardware-aware"]
    model = st.sidebar.radio("Acceptance model", models, key="tree_model",
                             help="independence: product of per-head a_k^(i); empirical: measured joint path "
                                  "frequencies (calibration folder); dense per level: the best tree whose levels "
                                  "give every node the same top-c children, the only shape vLLM drafts as written; "
                                  "hardware-aware: best predicted speedup under a latency curve, up to the budget")
    budget = st.sidebar.slider("Budget (tree nodes)", 1, 256, 63, key="tree_budget")
    max_depth = int_slider("Max depth (heads used)", K, K, "tree_depth")
    max_rank = int_slider("Max rank (top-k per head)", R, min(R, 10), "tree_rank")

    indep = acc_value_fn(src.acc)
    empirical = src.calib.joint_value("fit") if src.calib else None
    if model == "empirical paths" and empirical is None:
        st.error("empirical paths need a calibration folder (its ranks.parquet): an accuracy table has only the "
                 "per-head marginals, so use the independence or hardware-aware model")
        return
    base_value, speedup = (empirical if model == "empirical paths" else indep), None
    try:
        if model == "hardware-aware":
            base_value = empirical if (empirical is not None and st.sidebar.checkbox(
                "use empirical paths", value=False, key="tree_hw_joint")) else indep
            speedup = hardware_choice(src, base_value, budget, max_depth, max_rank)
            if speedup is None:
                return
            designed = speedup["tree"]
        elif model == "empirical paths":
            designed = optimal_tree_from(empirical, budget, max_depth, max_rank, name=f"empirical_{budget}")
        elif model.startswith("dense"):
            designed = best_dense_tree(src.acc, budget, max_depth, max_rank)
        else:
            designed = optimal_tree(src.acc, budget, max_depth, max_rank, name=f"optimal_{budget}")
    except WorkbenchError as e:
        st.error(clean_error(e))
        return
    if speedup is not None and speedup["best"]["speedup"] < 1:
        st.warning(f"Speculation does not pay on this hardware at context {speedup['context']}: the best tree "
                   f"({speedup['best']['budget']} nodes) is predicted at {speedup['best']['speedup']:.2f}x, slower "
                   "than vanilla greedy decoding, because a tree forward costs more than its extra tokens bring. "
                   "Decode without Medusa here, or measure latency on faster hardware (a GPU).")
    if designed.nodes < budget and model != "hardware-aware":
        st.caption(f"only {designed.nodes} nodes have a positive acceptance probability")

    # which tree: the optimizer's, a reference, a file under trees/, or the user's own; then edits on top
    options = tree_options(designed, user_tree_input(K))
    labels_list = list(options)
    c1, c2 = st.columns(2)
    drop_stale("tree_show", labels_list)
    shown = c1.selectbox("Tree on display (drawn, masked, exported)", labels_list, key="tree_show",
                         help="the optimizer's tree follows the sidebar settings; any other tree is shown as it "
                              "is, scored on the current calibration")
    if shown not in options:
        shown = labels_list[0]
    drop_stale("tree_compare", ["(nothing)"] + [o for o in labels_list if o != shown])
    against = c2.selectbox("Compare with", ["(nothing)"] + [o for o in labels_list if o != shown],
                           key="tree_compare", help="diff two trees side by side: nodes only in A, only in B, "
                                                    "shared, and their expected tokens per step")
    base = pick_tree(shown, options, K, R) or designed
    sig = f"{shown}|{hash(base.paths)}"
    edit = st.session_state.get("tree_edit")
    tree = Tree(tuple(map(tuple, edit["paths"])), f"{base.name or 'tree'}_edited") \
        if edit and edit["sig"] == sig else base
    st.session_state["designed_tree"] = {"name": tree.name, "paths": tree.as_lists(), "source": src.label}
    with st.expander(f"Edit {tree.name or 'this tree'} (add or remove nodes)", expanded=tree is not base):
        c1, c2, c3 = st.columns([2, 2, 1])
        c1.text_input("Add node (0-based ranks, e.g. 0,1)", key="tree_add",
                      help="a path of ranks, one per head: 0,1 = head 2's second guess under head 1's top guess; "
                           "its parent must be in the tree")
        c1.button("add node", key="tree_add_btn", on_click=_edit_tree, args=("add", tree, sig, K, R))
        drop_stale("tree_remove", [str(list(p)) for p in tree.sorted_paths])
        c2.selectbox("Remove node (and its descendants)", [str(list(p)) for p in tree.sorted_paths],
                     key="tree_remove")
        c2.button("remove node", key="tree_remove_btn", on_click=_edit_tree, args=("remove", tree, sig, K, R))
        c3.button("reset edits", key="tree_reset_btn", on_click=_edit_tree, args=("reset", tree, sig, K, R),
                  disabled=tree is base)
        if st.session_state.get("tree_edit_error"):
            st.error(st.session_state["tree_edit_error"])
        if tree is not base:
            d = tree_diff(base, tree)
            st.caption(f"edited from {base.name}: added {[list(p) for p in d['only_b']] or 'none'}, removed "
                       f"{[list(p) for p in d['only_a']] or 'none'}")

    # numbers: full labels, each explained
    cols = st.columns(3)
    cols[0].metric("nodes", tree.nodes)
    cols[1].metric("depth", tree.depth)
    if speedup is not None:
        cols[2].metric("predicted speedup (optimizer's tree)", f"{speedup['best']['speedup']:.2f}x",
                       help=f"expected tokens per step / relative step cost t(n+1)/t(1) at context {speedup['context']}")
    cols = st.columns(3)
    shown_row = tree_table([tree], src.acc, src.calib)[0]
    for col, key in zip(cols, ("predicted_independent", "predicted_joint", "predicted_replay")):
        if shown_row.get(key) is not None:
            col.metric(f"{key} (tokens/step)", f"{shown_row[key]:.3f}", help=TREE_HELP[key])

    # the tree and its mask, linked by the selected node; optional real tokens as labels
    labels = None
    tokens = st.session_state.get("head_tokens")
    if tokens and st.session_state.get("tree_show_tokens", True):
        table = tokens["table"]
        if tree.depth <= len(table) and tree.max_rank < len(table[0]):
            labels = {p: table[len(p) - 1][p[-1]] for p in tree.paths} | {(): tokens["root"]}
    probs = {p: base_value(p) for p in tree.paths}
    names = figures.node_names(tree)
    if st.session_state.get("tree_focus_pick", -1) >= len(names):
        st.session_state["tree_focus_pick"] = -1
    focus = st.session_state.get("tree_focus_pick", -1)
    focus = None if focus < 0 else focus
    st.plotly_chart(figures.tree_chart(tree, probs, labels, focus, title=f"{tree.name}: {tree.nodes} nodes, depth "
                                       f"{tree.depth} ({model}, {src.label})"),
                    key="tree_chart", on_select=lambda: _focus_from("tree_chart"), selection_mode="points")
    st.caption(f"drawn tree: {tree.nodes} nodes, depth {tree.depth}. Node colour and edge width: path probability "
               f"({'empirical' if base_value is empirical else 'independence'}); node label: "
               f"{'the token of its head for the prompt' if labels else 'rank (0 = top-1)'}. Drag to zoom, "
               "double-click to reset; click a node to select its mask row.")
    left, right = st.columns([3, 2])
    with left:
        st.plotly_chart(figures.mask_chart(tree, focus), key="mask_chart", on_select=lambda: _focus_from("mask_chart"),
                        selection_mode="points")
    with right:
        st.selectbox("Selected node (= mask row)", [-1] + list(range(len(names))), key="tree_focus_pick",
                     format_func=lambda i: "none" if i < 0 else f"row {i}: {list(names[i]) if i else 'root'}",
                     help="click a tree node or a mask cell to select it here")
        if focus is not None:
            p = names[focus]
            st.markdown(f"**row {focus}**: " + (f"node `{list(p)}`, head {len(p)}'s rank-{p[-1]} guess (0 = top-1)"
                                                 if p else "the root (the base model's own token)"))
            st.markdown(f"attends to rows {[names.index(p[:d]) for d in range(len(p) + 1)]} (root, ancestors, "
                        f"itself); P(accepted) {probs.get(p, 1.0):.4f}"
                        + (f"; token `{labels[p]}`" if labels and p in labels else ""))
        st.caption("Mask: row = query node, column = key node, in buffer order (node i = the i-th path sorted by "
                   "depth then ranks, 0 = root); dark = may attend.")
    with st.expander("Label nodes with real tokens for a prompt (loads the demo model)"):
        prompt = st.text_input("Prompt", "What is the capital of France?", key="tree_prompt")
        c1, c2 = st.columns(2)
        tok_model = c1.text_input("Model (blank: the demo)", key="tree_tok_model").strip()
        tok_heads = c2.text_input("Heads (blank: the demo heads)", key="tree_tok_heads").strip()
        st.checkbox("show tokens", value=True, key="tree_show_tokens")
        if st.button("Load the model and label the tree", key="tree_tokens_btn"):
            try:
                st.session_state["head_tokens"] = head_token_table(prompt, max(R, 10), tok_model, tok_heads)
                st.rerun()
            except (WorkbenchError, OSError, RuntimeError) as e:
                st.error(clean_error(e))
        if tokens:
            st.caption(f"tokens for: {tokens['prompt']!r}; the base model's next token is {tokens['root']!r}"
                       + ("" if labels or not st.session_state.get("tree_show_tokens", True) else
                          f"; this tree needs more heads or ranks than the {len(tokens['table'])} heads x "
                          f"top-{len(tokens['table'][0])} labelled"))

    if against != "(nothing)":
        other = pick_tree(against, options, K, R)
        if other is not None:
            compare_trees(tree, other, indep, empirical, src)

    # expected tokens per step vs budget, named trees
    left, right = st.columns(2)
    top = 256
    curves = {"optimal (independence)": expected_curve(src.acc, top, max_depth, max_rank)}
    if empirical is not None:
        curves["optimal (empirical)"] = expected_curve(empirical, top, max_depth, max_rank)
    named = [(label, pick_quiet(spec)) for label, spec in options.items() if label != OPTIMIZER]
    named = [t if t.name else Tree(t.paths, label) for label, t in named if t is not None]
    rows = tree_table(named, src.acc, src.calib, curves["optimal (independence)"])
    points = {t.name: (t.nodes, expected_length(t, base_value)) for t in named if t.depth <= K and t.max_rank < R}
    with left:
        figure(plots.expected_curve_plot({k: (range(len(v)), v) for k, v in curves.items()}, points,
                                         (tree.nodes, expected_length(tree, base_value))),
               "Expected tokens per step of the optimal tree at each budget; points: named trees.")
    if speedup is not None:
        with right:
            figure(plots.speedup_curve({"predicted": ([r["budget"] for r in speedup["rows"]],
                                                      [r["speedup"] for r in speedup["rows"]])},
                                       {"predicted": (speedup["best"]["budget"], speedup["best"]["speedup"])},
                                       speedup.get("measured")),
                   f"Predicted speedup at context {speedup['context']} ({speedup['latency']})"
                   + (f"; black diamonds: speedups measured by the sweep {speedup['sweep']} (labelled by tree)"
                      if speedup.get("measured") else "; no sweep CSV found to draw measured speedups"))
    else:
        right.markdown("**Reading the tokens/step numbers** (tokens emitted per decoding step, the base model's "
                       "own token included):\n\n" + "\n".join(f"- **{k}**: {v}" for k, v in TREE_HELP.items()))
    st.subheader("Named trees: tokens per step")
    st.dataframe(pd.DataFrame(rows), hide_index=True, column_config=TABLE_COLUMNS)

    # buffers and exports
    with st.expander("Tree buffers (Medusa's generate_medusa_buffers)"):
        buf = tree_buffers(tree, max(tree.max_rank + 1, 10))
        c1, c2 = st.columns(2)
        c1.dataframe(pd.DataFrame({"tree_indices": buf["tree_indices"].tolist(),
                                   "position_ids": buf["position_ids"].tolist(),
                                   "parent": buf["parents"].tolist()}))
        c2.dataframe(pd.DataFrame(buf["retrieve_indices"].tolist()).add_prefix("d"))
    st.subheader("Export")
    provenance = dict(expected_acceptance_length=expected_length(tree, base_value),
                      budget=budget if tree is designed else tree.nodes,
                      method=(model if tree is designed else "edited" if tree is not base else shown.split(":")[0]),
                      acceptance_model="empirical paths" if base_value is empirical else "independence",
                      max_depth=max_depth, max_rank=max_rank, heads=K, ranks=R, accuracies=src.folder or src.label)
    if tree is not base:
        provenance["edited_from"] = base.name
    if speedup is not None and tree is designed:
        provenance |= dict(predicted_speedup=speedup["best"]["speedup"],
                           relative_latency=speedup["best"]["relative_latency"], latency=speedup["latency"],
                           context=speedup["context"])
    tree_file = record_json(tree_record(Tree(tree.paths, tree.name or "tree"), **provenance))
    cols = st.columns(len(FORMATS))
    notes = []
    for col, fmt in zip(cols, FORMATS):
        text, warns = export_tree(tree, fmt, heads=K)
        if fmt == "json":  # a tree file like `workbench optimize --out` writes: with its provenance
            text = tree_file
        col.download_button(fmt, text, file_name=f"{tree.name}{SUFFIXES[fmt]}", key=f"export_{fmt}",
                            help=f"{tree.name} in the {fmt} format")
        notes += [f"**{fmt}**: {w}" for w in warns]
    for note in notes:
        st.warning(note)
    with st.expander("The JSON tree file (what the json button downloads)"):
        st.code(tree_file, language="json")


def pick_quiet(spec):
    """A named tree for the table (None if a file there cannot be read: the selectbox reports it when picked)."""
    from workbench.tree import load_tree

    try:
        return load_tree(str(spec) if isinstance(spec, Path) else spec)
    except WorkbenchError:
        return None


def compare_trees(a, b, indep, empirical, src: Source) -> None:
    """Two trees side by side: nodes only in A, only in B, shared, and what each brings on this calibration."""
    from workbench.calibration import tree_table
    from workbench.tree import Tree, tree_diff

    d = tree_diff(a, b)
    st.subheader(f"A = {a.name} vs B = {b.name}")
    value = empirical or indep
    rows = tree_table([Tree(a.paths, f"A: {a.name}"), Tree(b.paths, f"B: {b.name}")], src.acc, src.calib)
    st.dataframe(pd.DataFrame(rows), hide_index=True, column_config=TABLE_COLUMNS)
    st.caption(f"{len(d['shared'])} shared nodes, {len(d['only_a'])} only in A, {len(d['only_b'])} only in B; "
               "predicted tokens per step in the table (names as on the rest of the page)")
    status_a = {p: "shared" for p in d["shared"]} | {p: "only in A" for p in d["only_a"]}
    status_b = {p: "shared" for p in d["shared"]} | {p: "only in B" for p in d["only_b"]}
    c1, c2 = st.columns(2)
    c1.plotly_chart(figures.tree_chart(a, status=status_a, title=f"A: {a.name} ({a.nodes} nodes)"), key="diff_a")
    c2.plotly_chart(figures.tree_chart(b, status=status_b, title=f"B: {b.name} ({b.nodes} nodes)"), key="diff_b")
    diff = [{"node": str(list(p)), "in": side, "P(accepted)": value(p)}
            for side, ps in (("only A", d["only_a"]), ("only B", d["only_b"])) for p in ps]
    if diff:
        st.dataframe(pd.DataFrame(diff), hide_index=True, column_config={"P(accepted)": st.column_config.NumberColumn(
            help=f"the node's path probability ({'empirical' if empirical else 'independence'}): what it adds "
                 "to the expected tokens per step", format="%.4f")})


def hardware_choice(src: Source, value, budget: int, max_depth: int, max_rank: int) -> dict | None:
    """The hardware-aware tree: latency CSV from the calibration folder (or given), context nearest typical use;
    measured speedups from a sweep CSV (when one is found) to draw on the predicted curve."""
    from workbench.latency import hardware_aware

    found = src.calib.latency_files() if src.calib else []
    with st.sidebar:
        path = file_input("latency CSV", "tree_lat", ["csv"], found + found_csvs("latency"))
    if path is None:
        st.error("hardware-aware needs a latency CSV (columns context,tokens,seconds): run `workbench latency` "
                 "or give one in the sidebar")
        return None
    try:
        df = read_latency_file(str(path), file_stamp(path))
        with st.sidebar:
            table, ctx = latency_picker(df, "tree", path.name, src.calib.typical_context() if src.calib else None)
        res = hardware_aware(value, table, max_depth, max_rank, max_budget=budget, name=f"hardware_{budget}")
    except WorkbenchError as e:
        st.error(clean_error(e))
        return None
    st.sidebar.caption(f"latency {path.name}, context {ctx}: best of budgets 1..{res['rows'][-1]['budget']}")
    res |= {"context": ctx, "latency": path.name}
    sweeps = found_csvs("sweep")
    if sweeps:
        pick = st.sidebar.selectbox("measured speedups from", [str(f) for f in sweeps] + ["(none)"],
                                    key="tree_hw_sweep", format_func=lambda f: Path(f).name)
        if pick != "(none)":
            try:
                sweep = read_sweep_file(pick, file_stamp(pick))
                res |= {"measured": {"measured (sweep)": plots.measured_speedups(sweep)}, "sweep": Path(pick).name}
            except WorkbenchError as e:
                st.error(clean_error(e))
    return res


def user_tree_input(num_heads: int) -> list:
    """An extra tree to compare: uploaded file, path, reference name or literal. A bad one is an st.error."""
    from workbench.tree import Tree, load_tree

    with st.sidebar.expander("Your own tree (to show, edit, compare)"):
        up = st.file_uploader("Tree file (JSON or Medusa choices .py)", type=["json", "py", "txt"], key="tree_user_up")
        spec = str(upload_path(up)) if up is not None else st.text_input(
            "... or a path, reference name, or literal like [[0], [0, 0], [1]]", key="tree_user_spec").strip()
    if not spec:
        return []
    try:
        t = load_tree(spec, num_heads=num_heads)
    except WorkbenchError as e:
        st.error(f"your tree: {clean_error(e)}")
        return []
    return [t if t.name else Tree(t.paths, "your tree")]
