"""Page 4, live decode (/live): Medusa vs vanilla greedy on one prompt, with streamed progress and per-step colours.

The only page that loads a model for decoding, and only on a button press (cached; one model at a time). The
tree comes from the designer, a reference, a tree file or a literal; acceptance is greedy, typical or nucleus.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pandas as pd
import streamlit as st

from workbench import ACCEPTANCE_KINDS, REPO_ROOT, WorkbenchError
from workbench.core.speed import goodput, tokens_per_step
from workbench.trees.tree import REFERENCE_DIR, load_tree
from workbench.ui.inputs import shared_inputs
from workbench.ui.widgets import (clean_error, figure, file_stamp, load_model, open_calibration,
                                  timed)
from workbench.viz import interactive_figures, static_figures


# the live decode's request fields (decode.request.DecodeRequest) as this page's controls name them: its errors
# name the control to change
LABELS = {"max_new_tokens": "max new tokens", "acceptance": "Acceptance", "temperature": "temperature",
          "epsilon": "epsilon", "delta": "delta", "top_p": "top_p", "batch_sizes": "batch size", "model": "Model",
          "heads": "Heads", "device": "device"}


def tree_choice() -> str | None:
    """A tree spec for the live decoder: the designer's tree, a reference, a calibrated tree file, or typed in."""
    options = []
    designed = st.session_state.get("designed_tree")
    if designed:
        options.append(f"designed: {designed['name']} ({len(designed['paths'])} nodes)")
    files = sorted(f for f in (REPO_ROOT / "trees").glob("*.json"))
    options += [f.stem for f in sorted(REFERENCE_DIR.glob("*.json"))] + [f"file: {f.name}" for f in files]
    options.append("other: a path or literal")
    pick = st.selectbox("Tree", options, key="live_tree")
    if pick.startswith("designed: "):
        return json.dumps(designed["paths"])
    if pick.startswith("file: "):
        return str(REPO_ROOT / "trees" / pick[len("file: "):])
    if pick.startswith("other"):
        return st.text_input("Tree file or literal", "[[0], [0, 0], [1], [0, 1], [0, 0, 0]]",
                             key="live_tree_spec").strip() or None
    return pick


def measured(result) -> dict:
    """The measured quantities of one decode, from speed.py (the one owner): tokens/step and goodput."""
    return dict(tokens_per_step=tokens_per_step([result]), goodput=goodput([result]))


def progress_line(label: str, done: int, total: int, steps: int, elapsed: float, stop: str | None = None) -> str:
    """`Medusa: 24/64 tokens in 10 steps (2.40 tokens/step), 3.1 tokens/s, ETA 13 s` (`stop`: why it ended)."""
    rate = done / elapsed if elapsed > 0 else 0.0
    eta = f"stopped ({stop})" if stop else f"ETA {(total - done) / rate:.0f} s" if rate > 0 else "ETA ?"
    return (f"{label}: {done}/{total} tokens in {steps} steps ({done / max(steps, 1):.2f} tokens/step), "
            f"{rate:.1f} tokens/s, {eta}")


def progress_view(label: str, total: int, tokenizer):
    """(on_step, finish): an `on_step` callback for medusa_generate / vanilla_generate drawing a progress bar
    (tokens so far, steps, tokens/s, ETA) and the answer so far, and `finish(result)` for its last state (a
    decode may stop early, at EOS)."""
    bar, text = st.progress(0.0, text=f"{label}: starting..."), st.empty()
    seen: list[int] = []
    start, steps = time.perf_counter(), [0]

    def on_step(step) -> None:
        seen.extend(step.tokens)
        steps[0] += 1
        bar.progress(min(len(seen) / total, 1.0),
                     text=progress_line(label, len(seen), total, steps[0], time.perf_counter() - start))
        text.caption(f"{label} so far: " + tokenizer.decode(seen, skip_special_tokens=True)[-600:])

    def finish(result) -> None:
        bar.progress(1.0, text=progress_line(label, len(seen), total, steps[0], time.perf_counter() - start,
                                             result.stop_reason or "done"))
        text.empty()
    return on_step, finish


def live_page() -> None:
    with timed("page /live"):
        _live_page()


def predicted_for(folder: str | None, spec: str | None, max_new: int) -> dict | None:
    """What the calibration predicts for this tree (Calibration.predict, answers cut at max_new tokens, as the decode
    cuts them), beside the measured tokens/step: {"folder", "model", "heads", **predictions} or {"error": ...}."""
    if not folder or not spec:
        return None
    try:
        cal = open_calibration(folder, file_stamp(folder))
        return dict(folder=Path(folder).name, model=cal.meta.get("model") or "demo", heads=cal.meta.get("heads"),
                    **cal.predict(load_tree(spec), max_new))
    except WorkbenchError as e:
        return {"error": clean_error(e)}


def _live_page() -> None:
    st.title("Live decode")
    shared = shared_inputs()
    with st.sidebar:
        spec = tree_choice()
        kind = st.selectbox("Acceptance", ACCEPTANCE_KINDS, key="live_kind",
                            help="greedy: lossless; typical: Medusa's posterior threshold; nucleus: exact sampling")
        temperature = st.number_input("temperature", 0.0, 5.0, 0.0 if kind == "greedy" else 0.7, 0.1,
                                      key=f"live_temp_{kind}", disabled=kind == "greedy",
                                      help="greedy takes the argmax: temperature does not apply" if kind == "greedy"
                                      else "softmax temperature of the sampled acceptance")
        epsilon = st.number_input("epsilon", 0.001, 1.0, 0.09, 0.01, key="live_eps", disabled=kind != "typical",
                                  help="typical acceptance's posterior threshold" + (
                                      "; applies to typical acceptance only" if kind != "typical" else ""))
        delta = st.number_input("delta", 0.0, 5.0, None, 0.05, key="live_delta", disabled=kind != "typical",
                                placeholder="sqrt(epsilon)",
                                help="typical acceptance's entropy scale; empty: sqrt(epsilon), Medusa's rule and "
                                     "the default everywhere" + (
                                    "; applies to typical acceptance only" if kind != "typical" else ""))
        top_p = st.number_input("top_p", 0.01, 1.0, 0.8, 0.05, key="live_top_p", disabled=kind != "nucleus",
                                help="nucleus mass" + ("; applies to nucleus acceptance only" if kind != "nucleus"
                                                       else ""))
        max_new = st.number_input("max new tokens", 1, 2048, shared.max_new_tokens or 64, key="live_max_new",
                                  help="this decode's length (default: the sidebar's generation length)")
        model = st.text_input("Model (blank: the demo SmolLM2-135M-Instruct)", key="live_model").strip()
        heads = st.text_input("Heads (blank: the demo heads)", key="live_heads").strip()
        device = st.selectbox("device", ["auto", "cpu", "cuda"], key="live_device")
        threads = st.number_input("torch CPU threads", 1, os.cpu_count() or 1, None, key="live_threads",
                                  placeholder="torch's current setting",
                                  help="torch.set_num_threads for this decode (process-wide; empty: torch's current "
                                       "setting); more threads than free cores slow small models down")
        vanilla = st.checkbox("also run vanilla greedy", value=True, key="live_vanilla")
    cal = shared.src.folder if shared.src is not None and shared.src.calib is not None else None  # the prediction's
    prompt = st.text_area("Prompt", "Give three tips for staying healthy.", key="live_prompt")
    if st.button("Load model and generate", type="primary", key="live_go"):
        st.session_state.pop("live_result", None)  # a failed run must not leave the last result under its error
        # torch and the decoder (transformers, torch's compiler) load on the first press, not on the page's first draw
        import torch

        from workbench.decode.loop import medusa_generate, vanilla_generate
        from workbench.decode.request import DecodeRequest
        from workbench.decode.divergence import compare
        from workbench.runtime.generation import prepare_prompt

        try:
            if not spec:
                raise WorkbenchError("no tree: pick one or type a literal like [[0], [0, 0], [1]]")
            tree = load_tree(spec)
            req = DecodeRequest(int(max_new), acceptance=kind, temperature=temperature,  # disabled controls: unset
                                epsilon=epsilon if kind == "typical" else None,
                                delta=delta if kind == "typical" else None,
                                top_p=top_p if kind == "nucleus" else None)
            rule = req.rule()
            if threads is not None:
                torch.set_num_threads(int(threads))
            status = st.status(f"Loading {model or 'the demo model'} and its heads...", expanded=True)
            try:
                start = time.perf_counter()
                status.write("Loading the model and heads: the first use reads the weights from disk (up to a "
                             "minute on a CPU); later runs reuse the loaded model.")
                base, tok, hd = load_model(model, heads, device)
                loaded = time.perf_counter() - start
                tree = load_tree(tree, num_heads=hd.num_heads)  # a tree deeper than the heads: say so before decoding
                status.write(f"Model ready ({loaded:.1f} s). Warming up: the first steps initialise kernels and "
                             "caches (not timed)...")
                status.update(label="Warming up (not timed)...")
                ids = prepare_prompt(tok, prompt)
                req.check_prompts([ids], base, tree.nodes)  # the answer fits the model's positions
                start = time.perf_counter()
                medusa_generate(base, hd, tok, ids, tree, 2, rule)
                if vanilla:
                    vanilla_generate(base, tok, ids, 2)
                status.update(label=f"Model ready ({loaded:.1f} s), warmed up ({time.perf_counter() - start:.1f} s)",
                              state="complete", expanded=False)
            except (WorkbenchError, OSError, RuntimeError):
                status.update(label="Stopped: see the error below", state="error", expanded=False)
                raise
            on_step, finish = progress_view("Medusa", int(max_new), tok)
            med = medusa_generate(base, hd, tok, ids, tree, int(max_new), rule, on_step=on_step)
            finish(med)
            van = None
            if vanilla:
                on_step, finish = progress_view("vanilla greedy", int(max_new), tok)
                van = vanilla_generate(base, tok, ids, int(max_new), on_step=on_step)
                finish(van)
            steps = [i for i, s in enumerate(med.steps) for _ in s.tokens]
            st.session_state["live_result"] = dict(
                medusa=med.to_dict() | measured(med), vanilla=van.to_dict() | measured(van) if van else None,
                compare=compare(med, van) if van else None, pieces=interactive_figures.token_pieces(tok, med.token_ids),
                steps=steps, tree=tree.name or f"{tree.nodes}-node tree", model=model or "demo",
                predicted=predicted_for(cal, spec, int(max_new)))
        except (WorkbenchError, OSError, RuntimeError) as e:
            st.error(clean_error(e, LABELS))
    res = st.session_state.get("live_result")
    if not res:
        st.info("Press the button to load the model (once; it stays cached) and decode the prompt.")
        return
    med, van, cmp = res["medusa"], res["vanilla"], res["compare"]
    pred = res.get("predicted")
    cols = st.columns(3)  # measured beside predicted, then the speeds
    cols[0].metric("tokens/step", f"{med['tokens_per_step']:.2f}",
                   help="tokens emitted per Medusa step (1 + accepted tree tokens), averaged over this answer")
    if pred and "error" not in pred:
        key = "predicted_replay" if "predicted_replay" in pred else "predicted_joint"
        cols[1].metric("predicted tokens/step", f"{pred[key]:.2f}",
                       help=f"{key} of calibration {pred['folder']} (model {pred['model']}, heads {pred['heads']}), "
                            "answers cut at max new tokens; one prompt scatters around it")
    cols[2].metric("new tokens", med["new_tokens"])
    cols = st.columns(3)
    cols[0].metric("Medusa tokens/s", f"{med['goodput']:.1f}", help="new tokens / (prefill + decode time)")
    if cmp:
        cols[1].metric("vanilla tokens/s", f"{van['goodput']:.1f}")
        cols[2].metric("speedup (one prompt)", f"{cmp['speedup']:.2f}x",
                       help="Medusa tokens/s over vanilla tokens/s on this one prompt")
        st.caption("One prompt is a noisy measurement: timings of a single short answer vary by tens of percent "
                   "between runs (other processes, CPU frequency, the answer's own predictability). For a speedup "
                   "to rely on, run `workbench sweep` over many prompts and read it on the Trade-offs page.")
    if pred and "error" in pred:
        st.caption(f"No prediction: {pred['error']}")
    elif pred:
        st.caption(f"Predicted {pred.get('predicted_replay', pred['predicted_joint']):.2f} tokens/step by calibration "
                   f"{pred['folder']}, made for model {pred['model']}"
                   + ("" if res["model"] in ("demo", pred["model"]) else f": this decode used {res['model']}, so "
                      "the prediction describes another model") + ".")
    st.caption(f"{res['model']}, tree {res['tree']}; each colour is one decoding step (hover for its number)."
               + ("" if not cmp else " Output equals vanilla greedy." if cmp["matches_greedy"] else
                  " Output differs from vanilla greedy (expected with typical/nucleus acceptance)."))
    st.markdown(interactive_figures.coloured_tokens_html(res["pieces"], res["steps"]), unsafe_allow_html=True)
    c1, c2 = st.columns([2, 1])
    with c1:
        figure(static_figures.accepted_lengths(med["accepted_lengths"]))
    with c2:
        rates = {"Medusa": med["goodput"]} | ({"vanilla": van["goodput"]} if van else {})
        figure(static_figures.throughput_bars(rates))
    with st.expander("Per step"):
        st.dataframe(pd.DataFrame(med["per_step"]), hide_index=True)
