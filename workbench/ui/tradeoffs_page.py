"""Page 3, the trade-offs (/tradeoffs): sweep results (paper Fig. 4 and 5), latency, and the predicted speedup.

Reads the sweep and latency CSVs found in the calibration and results folders (or given): tokens per step and
speed vs tree size, the typical-acceptance epsilon trade-off, predicted vs measured, and the hardware-aware
speedup curve from a latency curve and the accuracies.
"""
from __future__ import annotations

from pathlib import Path

import streamlit as st

from workbench import WorkbenchError
from workbench import plots
from workbench.ui.widgets import (accuracy_source, clean_error, drop_stale, figure, file_input, file_stamp,
                                  found_csvs, latency_picker, read_latency_file, read_sweep_file,
                                  read_sweep_or_error)


def tradeoffs_page() -> None:
    from workbench.latency import hardware_aware
    from workbench.sweep import has_typical

    st.title("Trade-offs")
    sweeps = found_csvs("sweep")
    typical = [f for f in sweeps if _readable_typical(f)]
    with st.sidebar:
        st.subheader("Sweep (Fig. 4, predicted vs measured)")
        sweep_path = file_input("sweep CSV", "to_sweep", ["csv"], sweeps)
        st.subheader("Typical-acceptance sweep (Fig. 5)")
        typ_path = file_input("typical sweep CSV", "to_typ", ["csv"], sweeps, default=typical[0] if typical else None)
        st.subheader("Latency")
        lat_path = file_input("latency CSV", "to_lat", ["csv"], found_csvs("latency"))
    sweep, typ, lat = read_sweep_or_error(sweep_path), read_sweep_or_error(typ_path), None
    if sweep_path is None:
        st.info("No sweep CSV found: run `workbench sweep --out FILE.csv` (for example into the calibration folder), "
                "or give one in the sidebar.")
    if lat_path is not None:
        try:
            lat = read_latency_file(str(lat_path), file_stamp(lat_path))
        except WorkbenchError as e:
            st.error(clean_error(e))
    else:
        st.info("No latency CSV found: run `workbench latency`, or give one in the sidebar.")

    if sweep is not None:
        st.caption(f"sweep {sweep_path.name}: {len(sweep)} rows")
        c1, c2 = st.columns(2)
        with c1:
            figure(plots.tokens_vs_candidates(sweep), "Paper Fig. 4a: sparse (optimal) vs dense trees.")
        with c2:
            figure(plots.speed_vs_candidates(sweep), "Paper Fig. 4b.")
    c1, c2 = st.columns(2)
    with c1:
        if typ is not None and has_typical(typ):
            rows = typ.dropna(subset=["epsilon"])
            sizes = sorted(int(n) for n in rows["nodes"].dropna().unique())
            quality = st.selectbox("quality measure", [c for c in ("exact_match", "mean_logprob", "distinct_2")
                                                       if c in typ.columns] or ["acceleration_rate"], key="to_quality")
            drop_stale("to_nodes", sizes)
            nodes = st.selectbox("tree size (nodes)", sizes, key="to_nodes") if len(sizes) > 1 else None
            rows = rows if nodes is None else rows[rows["nodes"] == nodes]
            eps_values = sorted(float(e) for e in rows["epsilon"].unique())
            drop_stale("to_eps", eps_values)
            eps = st.select_slider("epsilon (posterior threshold)", eps_values, key="to_eps",
                                   value=min(eps_values, key=lambda e: abs(e - 0.09))) \
                if len(eps_values) > 1 else eps_values[0]
            at = rows[rows["epsilon"] == eps]
            figure(plots.epsilon_plot(typ, quality, mark=eps, nodes=nodes),
                   f"Paper Fig. 5 ({typ_path.name}): typical acceptance. At epsilon {eps:g}: "
                   f"{at['acceleration_rate'].mean():.2f} tokens/step, {quality} {at[quality].mean():.3f} "
                   "(mean over temperatures).")
        else:
            st.info("No typical-acceptance rows (epsilon) in the sweeps found: run the sweep with --temperature > 0 "
                    "and several --epsilon values for Fig. 5.")
    with c2:
        if sweep is not None and any(c in sweep.columns for c in plots.PREDICTED_COLUMNS):
            figure(plots.predicted_vs_measured(sweep), "Calibration's prediction vs the live decoder; each point "
                                                       "labelled by its tree (once, at its first prediction).")
    if sweep is not None:
        with st.expander("Sweep rows"):
            st.dataframe(sweep, hide_index=True)

    if lat is not None:
        c1, c2 = st.columns(2)
        with c1:
            figure(plots.latency_curve(lat), f"latency {lat_path.name}")
        with c2:
            src = accuracy_source("to")
            if src is None:
                st.info("The predicted-speedup curve needs accuracies (a calibration folder or table).")
                return
            try:
                table, ctx = latency_picker(lat, "to", lat_path.name,
                                            src.calib.typical_context() if src.calib else None)
                top = max(int(n) for n in table) - 1
                budget = st.slider("budget (max tree nodes)", 1, max(top, 2), top, key="to_budget") if top > 1 else 1
                K, R = src.acc.shape
                values = {"independence": src.acc}
                if src.calib:
                    values["empirical paths"] = src.calib.joint_value("fit")
                res = {name: hardware_aware(v, table, K, min(R, 10), max_budget=budget) for name, v in values.items()}
            except WorkbenchError as e:
                st.error(clean_error(e))
                return
            measured = {f"measured (sweep {sweep_path.name})": plots.measured_speedups(sweep)} \
                if sweep is not None and len(plots.measured_speedups(sweep)[0]) else None
            figure(plots.speedup_curve({n: ([row["budget"] for row in r["rows"]], [row["speedup"] for row in r["rows"]])
                                        for n, r in res.items()},
                                       {n: (r["best"]["budget"], r["best"]["speedup"]) for n, r in res.items()},
                                       measured),
                   f"Predicted speedup = expected tokens per step / (t(n+1)/t(1)) at context {ctx}; best: " +
                   "; ".join(f"{n} {r['best']['budget']} nodes, {r['best']['speedup']:.2f}x" for n, r in res.items()))
            if max(r["best"]["speedup"] for r in res.values()) < 1:
                st.warning(f"Speculation does not pay on this hardware at context {ctx}: no tree is predicted to "
                           "beat vanilla greedy decoding.")


def _readable_typical(path: Path) -> bool:
    from workbench.sweep import has_typical

    try:
        return has_typical(read_sweep_file(str(path), file_stamp(path)))
    except WorkbenchError:
        return False
