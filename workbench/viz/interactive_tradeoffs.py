"""The app's trade-off charts (plotly): sweeps (paper Fig. 4 and 5, predictions against measurements), latency with
its spread, predicted speedup against what sweeps measured, and the plan per batch size. Tree, mask, calibration and
live-decode views, and the shared layout, are interactive_figures.py's.
"""
from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.colors import qualitative

from workbench.calibrate.folder import PREDICTED_COLUMNS
from workbench.measure.sweep_file import tree_rows, vanilla_value
from workbench.viz.interactive_figures import FOCUS, layout


def speedup_chart(curves: dict[str, tuple], picks: dict[str, tuple] | None = None,
                  measured: list[dict] | None = None, title: str = "predicted speedup") -> go.Figure:
    """Predicted speedup against tree nodes {name: (x, y[, low, high])} (a band where a latency spread gives a
    range), marked picks {label: (nodes, speedup)}, and sweep measurements [{nodes, speedup, noise, tree, sweep,
    elsewhere}] as points with error bars: this setting's black, another's (or an unknown one) hollow grey."""
    fig = go.Figure()
    for name, xs in curves.items():
        x, y = list(xs[0]), list(xs[1])
        if len(xs) == 4:
            fig.add_trace(go.Scatter(x=x + x[::-1], y=list(xs[3]) + list(xs[2])[::-1], fill="toself", mode="lines",
                                     line=dict(width=0), fillcolor="rgba(46,134,171,0.15)", hoverinfo="skip",
                                     name=f"{name}: latency spread"))
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name=name,
                                 hovertemplate=f"{name}: %{{x}} nodes, %{{y:.3f}}x<extra></extra>"))
    for label, (x, y) in (picks or {}).items():
        fig.add_trace(go.Scatter(x=[x], y=[y], mode="markers", name=label, marker=dict(symbol="star", size=16),
                                 hovertemplate=f"{label}: %{{x}} nodes, %{{y:.3f}}x<extra></extra>"))
    for old in (False, True):  # old: measured in another setting than the latency table's
        ms = [m for m in measured or [] if bool(m.get("elsewhere")) == old]
        if not ms:
            continue
        fig.add_trace(go.Scatter(
            x=[m["nodes"] for m in ms], y=[m["speedup"] for m in ms], mode="markers",
            name="measured elsewhere" if old else "measured (this setting)",
            error_y=dict(type="data", array=[m["noise"] or 0 for m in ms], visible=True),
            marker=dict(symbol="diamond-open" if old else "diamond", size=9, color="grey" if old else "black"),
            customdata=[[m["tree"], m["sweep"]] for m in ms],
            hovertemplate="%{customdata[0]}: %{x} nodes, measured %{y:.3f}x<br>%{customdata[1]}<extra></extra>"))
    fig.add_hline(y=1.0, line=dict(color="grey", dash="dash", width=1))
    fig.update_xaxes(title="tree nodes")
    fig.update_yaxes(title="speedup over plain decoding")
    return layout(fig, title)


def latency_chart(latency) -> go.Figure:
    """ms per verify forward against tokens per forward, one line per setup and context (and batch), with the
    spread of the repeats as error bars when the CSV has it (quartiles, else min/max)."""
    keys = [c for c in ("model", "device", "dtype", "batch", "context") if c in latency.columns]
    keys = [c for c in keys if latency[c].nunique() > 1] or keys[-1:]  # name the lines by what differs
    spread = next(((lo, hi) for lo, hi in (("seconds_q1", "seconds_q3"), ("seconds_min", "seconds_max"))
                   if lo in latency.columns and hi in latency.columns), None)
    fig = go.Figure()
    for key, part in (latency.groupby(keys, sort=True) if keys else [((), latency)]):
        part = part.sort_values("tokens")
        label = ", ".join(f"{k} {v}" for k, v in zip(keys, key if isinstance(key, tuple) else (key,)))
        err = {} if spread is None else dict(error_y=dict(
            type="data", symmetric=False, array=1000 * (part[spread[1]] - part["seconds"]),
            arrayminus=1000 * (part["seconds"] - part[spread[0]])))
        fig.add_trace(go.Scatter(x=part["tokens"], y=1000 * part["seconds"], mode="lines+markers", name=label, **err,
                                 hovertemplate=f"{label}<br>%{{x}} tokens: %{{y:.2f}} ms<extra></extra>"))
    fig.update_xaxes(title="tokens per forward (tree nodes + root)", type="log")
    fig.update_yaxes(title="ms per forward")
    return layout(fig, "latency curve" + ("" if spread else " (medians; no spread measured)"))


def sweep_chart(sweep, y: str, ytitle: str, title: str) -> go.Figure:
    """Paper Fig. 4: a measured column of the greedy rows against tree nodes, one line per tree family (the mean
    where a size appears twice; hover names the trees), vanilla greedy as a dashed line."""
    df = tree_rows(sweep).dropna(subset=[y])
    fig = go.Figure()
    for kind, part in df.groupby("kind", sort=True):
        part = part.groupby("nodes", as_index=False).agg(value=(y, "mean"), trees=("tree", lambda t: ", ".join(
            dict.fromkeys(map(str, t))))).sort_values("nodes")
        fig.add_trace(go.Scatter(x=part["nodes"], y=part["value"], mode="lines+markers", name=kind,
                                 marker=dict(symbol="square" if kind == "dense" else "circle"),
                                 customdata=part["trees"], hovertemplate="%{customdata}<br>%{x} nodes: %{y:.3f}"
                                                                         "<extra></extra>"))
    base = vanilla_value(sweep, y)
    if base is not None:
        fig.add_hline(y=base, line=dict(color="grey", dash="dash", width=1), annotation_text="vanilla greedy",
                      annotation_position="bottom right")
    fig.update_xaxes(title="candidate tokens (tree nodes)")
    fig.update_yaxes(title=ytitle)
    return layout(fig, title)


def epsilon_chart(sweep, quality: str = "exact_match", mark: float | None = None,
                  nodes: int | None = None) -> go.Figure:
    """Paper Fig. 5: tokens per step (solid, left) and a quality measure (dashed, right) against epsilon, one colour
    per temperature; the chosen epsilon marked."""
    df = tree_rows(sweep, acceptance=None).dropna(subset=["epsilon"])
    if nodes is not None:
        df = df[df["nodes"] == nodes]
    fig = go.Figure()
    temps = df.groupby("temperature", sort=True) if "temperature" in df.columns else [(None, df)]
    for j, (temp, part) in enumerate(temps):
        part = part.groupby("epsilon", as_index=False)[["tokens_per_step", quality]].mean()
        colour, tag = qualitative.Plotly[j % 10], (f"T={temp:g}" if temp is not None else "")
        fig.add_trace(go.Scatter(x=part["epsilon"], y=part["tokens_per_step"], mode="lines+markers",
                                 name=f"tokens/step {tag}", line=dict(color=colour),
                                 hovertemplate=f"{tag} eps %{{x:g}}: %{{y:.3f}} tokens/step<extra></extra>"))
        fig.add_trace(go.Scatter(x=part["epsilon"], y=part[quality], mode="lines+markers", yaxis="y2",
                                 name=f"{quality} {tag}", line=dict(color=colour, dash="dash"),
                                 marker=dict(symbol="square"),
                                 hovertemplate=f"{tag} eps %{{x:g}}: {quality} %{{y:.3f}}<extra></extra>"))
    base = vanilla_value(sweep, quality)
    if base is not None:
        fig.add_trace(go.Scatter(x=[df["epsilon"].min(), df["epsilon"].max()], y=[base, base], yaxis="y2",
                                 mode="lines", name=f"{quality} vanilla", line=dict(color="grey", dash="dot")))
    if mark is not None:
        fig.add_vline(x=mark, line=dict(color=FOCUS, dash="dashdot", width=1))
    fig.update_xaxes(title="epsilon (posterior threshold)")
    fig.update_layout(yaxis=dict(title="tokens per step (solid)"),
                      yaxis2=dict(title=f"{quality.replace('_', ' ')} (dashed)", overlaying="y", side="right",
                                  showgrid=False))
    return layout(fig, "tokens per step and quality vs epsilon", right=72)  # the second y axis


def predicted_chart(sweep) -> go.Figure:
    """Each prediction of the calibration (calibration.PREDICTED_COLUMNS) against the live decoder's measured tokens per
    step, one point per greedy sweep row (hover names the tree); on the diagonal = exact."""
    df = tree_rows(sweep).dropna(subset=["tokens_per_step"])
    fig = go.Figure()
    lo, hi = np.inf, -np.inf
    for col in PREDICTED_COLUMNS:
        part = df.dropna(subset=[col]) if col in df.columns else df.iloc[:0]
        if not len(part):
            continue
        fig.add_trace(go.Scatter(x=part[col], y=part["tokens_per_step"], mode="markers", name=col,
                                 customdata=part["tree"].astype(str),
                                 hovertemplate="%{customdata}<br>" + col + " %{x:.3f}<br>measured %{y:.3f}"
                                               "<extra></extra>"))
        lo = min(lo, part[col].min(), part["tokens_per_step"].min())
        hi = max(hi, part[col].max(), part["tokens_per_step"].max())
    if np.isfinite(lo):
        fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="y = x", hoverinfo="skip",
                                 line=dict(color="grey", dash="dash", width=1)))
    fig.update_xaxes(title="predicted tokens per step")
    fig.update_yaxes(title="measured tokens per step")
    return layout(fig, "predicted vs measured tokens per step")


def plan_chart(by_kind, measured=None, title: str = "predicted speedup per batch size") -> go.Figure:
    """Predicted speedup against batch size, one line per kind (tree, chain, none; plan_file.speedups_by_kind), the
    plan's choice at each batch size starred, and the live decoder's measurements (plan_file.plan_check) as diamonds."""
    fig = go.Figure()
    for kind, rows in by_kind.groupby("kind", sort=False):
        fig.add_trace(go.Scatter(x=rows["batch_size"], y=rows["predicted_speedup"], mode="lines+markers", name=kind,
                                 customdata=rows[["nodes"]].to_numpy(),
                                 hovertemplate=f"{kind}: batch %{{x}}, %{{customdata[0]}} nodes, "
                                               "%{y:.3f}x<extra></extra>"))
    chosen = by_kind[by_kind["chosen"]]
    fig.add_trace(go.Scatter(x=chosen["batch_size"], y=chosen["predicted_speedup"], mode="markers", name="the plan",
                             marker=dict(symbol="star", size=15), customdata=chosen[["kind", "nodes"]].to_numpy(),
                             hovertemplate="plan at batch %{x}: %{customdata[0]} (%{customdata[1]} nodes), "
                                           "%{y:.3f}x<extra></extra>"))
    if measured is not None and len(measured):
        fig.add_trace(go.Scatter(x=measured["batch_size"], y=measured["measured_speedup"], mode="markers",
                                 name="measured (workbench sweep --plan)", marker=dict(symbol="diamond", size=9, color="black"),
                                 customdata=measured[["kind", "nodes", "predicted_speedup"]].to_numpy(),
                                 hovertemplate="measured at batch %{x}: %{customdata[0]} (%{customdata[1]} nodes), "
                                               "%{y:.3f}x, predicted %{customdata[2]:.3f}x<extra></extra>"))
    fig.add_hline(y=1.0, line=dict(color="grey", dash="dash", width=1))
    fig.update_xaxes(title="batch size", type="log")
    fig.update_yaxes(title="speedup over plain decoding")
    return layout(fig, title)


def surface_chart(latency, context: int, outliers: list[dict] | None = None) -> go.Figure:
    """The step-cost surface at one context: t(B, n) / t(B, 1) against tokens n, one line per batch size B, with the
    spread of the repeats over the same plain step (q1 / t(B, 1) .. q3 / t(B, 1)) as error bars, and the points
    off their trend (measure.latency_checks) marked: what a tree of n - 1 nodes costs relative to plain decoding."""
    rows = latency[latency["context"].astype(int) == int(context)]
    if "batch" not in rows.columns:
        rows = rows.assign(batch=1)
    spread = {"seconds_q1", "seconds_q3"} <= set(rows.columns)
    fig = go.Figure()
    for b, part in rows.groupby("batch", sort=True):
        part = part.groupby("tokens", as_index=False).median(numeric_only=True).sort_values("tokens")
        plain = float(part.loc[part["tokens"] == 1, "seconds"].iloc[0]) if (part["tokens"] == 1).any() else None
        if plain is None:
            continue
        rel = part["seconds"] / plain
        err = {} if not spread else dict(error_y=dict(type="data", symmetric=False,
                                                      array=part["seconds_q3"] / plain - rel,
                                                      arrayminus=rel - part["seconds_q1"] / plain))
        fig.add_trace(go.Scatter(x=part["tokens"], y=rel, mode="lines+markers", name=f"batch {b}", **err,
                                 hovertemplate=f"batch {b}<br>%{{x}} tokens: %{{y:.3f}} x the plain step"
                                               "<extra></extra>"))
    odd = [o for o in outliers or [] if (rows["batch"] == o["batch"]).any()]
    if odd:
        plain = {b: float(g.loc[g["tokens"] == 1, "seconds"].median()) for b, g in rows.groupby("batch")}
        fig.add_trace(go.Scatter(
            x=[o["tokens"] for o in odd], y=[o["seconds"] / plain[o["batch"]] for o in odd], mode="markers",
            name="off its trend", marker=dict(symbol="x-open", size=14, color=FOCUS, line=dict(width=2)),
            customdata=[[o["batch"], o["seconds"], o["expected"]] for o in odd],
            hovertemplate="batch %{customdata[0]}, %{x} tokens: %{customdata[1]:.3f} s, about %{customdata[2]:.3f} s "
                          "expected<extra></extra>"))
    fig.add_hline(y=1.0, line=dict(color="grey", dash="dash", width=1))
    fig.update_xaxes(title="tokens per step n (tree nodes + 1)", type="log")
    fig.update_yaxes(title="t(B, n) / t(B, 1)")
    return layout(fig, f"step-cost surface at context {context}" + ("" if spread else " (no spread measured)"))
