"""The designer's export panel: Medusa's tree buffers, a download in every engine format, and each export warning
worded for the app (its fix names the app's controls) with the engine repair beside it."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from workbench import WorkbenchError
from workbench.export.engines import (FORMATS, SAFE_ENGINES, SUFFIXES, TRTLLM_MAX_DRAFT_LEN, best_engine_safe, engine_safe,
                                      export_tree)
from workbench.export.trtllm import TRTLLM_CPP_MAX_DEPTH, TRTLLM_CPP_RANK_LIMIT, first_level_gaps
from workbench.export.vllm import vllm_uniform
from workbench.trees.optimize import expected_length
from workbench.trees.tree import MEDUSA_TOPK, Tree, record_json, tree_arrays, tree_record
from workbench.ui.recommendation import provenance_of
from workbench.ui.widgets import Source


# How the app words the fix an export warning points to (core.notes.Note.fix): with its own controls (the
# designer's repair buttons sit under the warnings), never the CLI's flags.
EXPORT_FIXES = {
    "max_rank": f"or design with ranks below {MEDUSA_TOPK} (the optimizer's max rank)",
    "engine_safe": "use the repair buttons below",
    "budget": "or a smaller budget",
    "num_heads": "the designer checks it against the loaded heads",
    "trtllm_rank": f"use the repair buttons below, or design with ranks below {TRTLLM_CPP_RANK_LIMIT} (the "
                   "optimizer's max rank)",
    "trtllm_depth": f"use the repair buttons below, or design with at most {TRTLLM_CPP_MAX_DEPTH} levels",
    "dense": "use the designer's dense-per-level model or the vllm repair button below",
}


def _repair(tree, sig: str, engine: str, value, num_heads: int, best: bool, budget: int, depth: int,
            rank: int) -> None:
    """Button callback: the shown tree repaired for an engine (engines.engine_safe), or the best tree that engine
    builds as written within the same node count (engines.best_engine_safe); shown as an edit of the tree."""
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
                           latency=lat["path"].name, context=lat["tables"].context, batch=lat["tables"].batch)
    tree_file = record_json(tree_record(Tree(tree.paths, tree.name or "tree"), **provenance))
    cols = st.columns(len(FORMATS))
    warns = {}
    for col, fmt in zip(cols, FORMATS):
        text, warns[fmt] = export_tree(tree, fmt, heads=K)
        if fmt == "json":  # a tree file like `workbench optimize --out` writes: with its provenance
            text = tree_file
        col.download_button(fmt, text, file_name=f"{tree.name}{SUFFIXES[fmt]}", key=f"export_{fmt}",
                            on_click="ignore", help=f"{tree.name} in the {fmt} format")
    if edit and edit.get("note"):  # what the last repair changed, where its button was
        st.info(edit["note"])
    needs = {"trtllm": bool(first_level_gaps(tree)) or tree.nodes > 63, "vllm": not vllm_uniform(tree)}
    for fmt in FORMATS:
        for w in warns[fmt]:
            st.warning(f"**{fmt}**: {w.words(EXPORT_FIXES)}")
        if fmt in SAFE_ENGINES and needs[fmt]:
            c1, c2, c3 = st.columns([1, 1, 2])
            c1.button(f"repair for {fmt}", key=f"tree_repair_{fmt}_btn", on_click=_repair,
                      args=(tree, sig, fmt, value, K, False, tree.nodes, max_depth, max_rank),
                      help=f"export.engine_safe: the closest tree {fmt} builds exactly as written (what the CLI's "
                           f"--engine-safe {fmt} does), shown here as an edit")
            c2.button(f"best {fmt}-safe tree", key=f"tree_best_{fmt}_btn", on_click=_repair,
                      args=(tree, sig, fmt, value, K, True, tree.nodes, max_depth, max_rank),
                      help=f"engines.best_engine_safe: the most valuable tree of at most {tree.nodes} nodes that "
                           f"{fmt} builds as written")
            c3.caption(f"The buttons replace the tree on display by one {fmt} builds as written; `reset edits` "
                       "goes back.")
    with st.expander("The JSON tree file (what the json button downloads)"):
        st.code(tree_file, language="json")
