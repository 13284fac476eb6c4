"""The trade-off figures (paper Fig. 4 and 5, predictions against measurements, latency and speedup), as matplotlib
`Figure`s built without pyplot, from sweep and latency CSVs: `workbench sweep-report --figures` writes them
(report_figures). Trees, calibration and live-decode figures, and the helpers, are static_figures.py's.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from workbench.calibrate.folder import PREDICTED_COLUMNS
from workbench.measure.sweep_file import tree_rows, vanilla_value
from workbench.viz.static_figures import legend_outside, save_png


def _by_kind_vs_nodes(sweep, y: str, ylabel: str, title: str, baseline: float | None = None):
    fig = Figure(figsize=(6.4, 4.0), layout="constrained")
    ax = fig.add_subplot()
    df = tree_rows(sweep).dropna(subset=[y])
    for kind, part in df.groupby("kind", sort=True):
        part = part.groupby("nodes", as_index=False)[y].mean().sort_values("nodes")
        ax.plot(part["nodes"], part[y], marker="s" if kind == "dense" else "o", label=kind)
    if baseline is not None:
        ax.axhline(baseline, color="grey", ls="--", lw=1, label="vanilla greedy")
    ax.set_xlabel("candidate tokens (tree nodes)")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if len(df) or baseline is not None:
        legend_outside(ax)
    ax.set_title(title)
    return fig


def tokens_vs_candidates(sweep):
    """Paper Fig. 4a: tokens per step (acceleration rate) against candidate tokens, sparse and dense trees
    (greedy rows; the mean where a size appears twice)."""
    return _by_kind_vs_nodes(sweep, "tokens_per_step", "tokens per step", "tokens per step vs candidates",
                             vanilla_value(sweep, "tokens_per_step"))


def speed_vs_candidates(sweep):
    """Paper Fig. 4b: measured speed against candidate tokens (tokens/s if the sweep has it, else speedup)."""
    y = "tokens_per_s" if "tokens_per_s" in sweep.columns and sweep["tokens_per_s"].notna().any() else "speedup"
    return _by_kind_vs_nodes(sweep, y, "tokens / s" if y == "tokens_per_s" else "speedup over greedy",
                             "speed vs candidates", vanilla_value(sweep, y))


def epsilon_plot(sweep, quality: str = "exact_match", mark: float | None = None, nodes: int | None = None):
    """Paper Fig. 5: tokens per step (solid) and a quality measure (dashed, right axis) against the typical-
    acceptance threshold epsilon, one colour per temperature; vanilla greedy's quality as a grey line."""
    fig = Figure(figsize=(6.4, 4.0), layout="constrained")
    ax = fig.add_subplot()
    ax2 = ax.twinx()
    df = tree_rows(sweep, acceptance=None).dropna(subset=["epsilon"])
    if nodes is not None:  # one tree size (a sweep may hold typical rows of several trees)
        df = df[df["nodes"] == nodes]
    temps = df.groupby("temperature", sort=True) if "temperature" in df.columns else [(None, df)]
    for j, (temp, part) in enumerate(temps):
        part = part.groupby("epsilon", as_index=False)[["tokens_per_step", quality]].mean()
        colour = f"C{j}"
        tag = f"T={temp:g}" if temp is not None else ""
        ax.plot(part["epsilon"], part["tokens_per_step"], marker="o", color=colour, label=f"tokens/step {tag}")
        ax2.plot(part["epsilon"], part[quality], marker="s", ls="--", color=colour, label=f"{quality} {tag}")
    base = vanilla_value(sweep, quality)
    if base is not None:
        ax2.axhline(base, color="grey", lw=1, ls=":", label=f"{quality} vanilla")
    if mark is not None:
        ax.axvline(mark, color="crimson", lw=1, ls="-.", label=f"epsilon = {mark:g}")
    ax.set_xlabel("epsilon (posterior threshold)")
    ax.set_ylabel("tokens per step (solid)")
    ax2.set_ylabel(f"{quality.replace('_', ' ')} (dashed)")
    ax.grid(alpha=0.3)
    lines = ax.get_legend_handles_labels(), ax2.get_legend_handles_labels()
    if lines[0][0] or lines[1][0]:
        legend_outside(ax2, lines[0][0] + lines[1][0], lines[0][1] + lines[1][1])
        ax2.get_legend().set_bbox_to_anchor((1.15, 1.0))  # past the right axis' tick labels
    ax.set_title("tokens per step and quality vs epsilon")
    return fig


# the calibration's predictions (names and meaning in calibrate/folder.py), each its own series


def predicted_vs_measured(sweep):
    """Predicted tokens per step (the calibration's PREDICTED_COLUMNS) against the
    measured acceleration of the live decoder, one point per greedy sweep row; on the diagonal = exact."""
    fig = Figure(figsize=(5.4, 4.8), layout="constrained")
    ax = fig.add_subplot()
    df = tree_rows(sweep).dropna(subset=["tokens_per_step"])
    lo, hi = np.inf, -np.inf
    named = False
    for col in PREDICTED_COLUMNS:
        if col not in df.columns:
            continue
        part = df.dropna(subset=[col])
        if not len(part):
            continue
        ax.scatter(part[col], part["tokens_per_step"], s=24, label=col)
        if not named:  # each tree named once, at its first prediction: the other series sit on the same row
            for x, y, t in zip(part[col], part["tokens_per_step"], part["tree"].astype(str)):
                ax.annotate(t, (x, y), fontsize=6, xytext=(3, -8), textcoords="offset points")
            named = True
        lo = min(lo, part[col].min(), part["tokens_per_step"].min())
        hi = max(hi, part[col].max(), part["tokens_per_step"].max())
    if np.isfinite(lo):
        ax.plot([lo * 0.95, hi * 1.05], [lo * 0.95, hi * 1.05], color="grey", ls="--", lw=1, label="y = x")
        legend_outside(ax, title="predicted by", title_fontsize=7)
    ax.set_xlabel("predicted tokens per step")
    ax.set_ylabel("measured tokens per step")
    ax.grid(alpha=0.3)
    ax.set_title("predicted vs measured")
    return fig


def latency_curve(latency):
    """Forward-pass time against tokens per forward, one line per (device, dtype, batch size, context)."""
    fig = Figure(figsize=(6.4, 4.0), layout="constrained")
    ax = fig.add_subplot()
    keys = [c for c in ("model", "device", "dtype", "batch", "context") if c in latency.columns]
    groups = latency.groupby(keys, sort=True) if keys else [((), latency)]
    for key, part in groups:
        part = part.groupby("tokens", as_index=False)["seconds"].mean().sort_values("tokens")
        label = " / ".join(str(k) for k in (key if isinstance(key, tuple) else (key,)))
        ax.plot(part["tokens"], 1000 * part["seconds"], marker=".", label=label or None)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens per forward pass (tree nodes + root)")
    ax.set_ylabel("ms per forward")
    ax.grid(alpha=0.3)
    if keys:
        legend_outside(ax, title=" / ".join(keys), title_fontsize=7)
    ax.set_title("latency curve")
    return fig


def report_figures(sweep, latency=None, folder: str | Path = ".", stem: str = "sweep") -> list[Path]:
    """The sweep report's figures as PNGs (for docs): Fig. 4a/4b and predicted-vs-measured from greedy rows,
    Fig. 5 from typical rows (quality = mean log-probability), and the latency curve when given."""
    folder = Path(folder)
    figs = {}
    if len(tree_rows(sweep)):
        figs.update({"fig4a-tokens-per-step": tokens_vs_candidates(sweep), "fig4b-speed": speed_vs_candidates(sweep),
                     "predicted-vs-measured": predicted_vs_measured(sweep)})
    if len(tree_rows(sweep, acceptance=None).dropna(subset=["epsilon"])):
        figs["fig5-typical"] = epsilon_plot(sweep, "mean_logprob")
    if latency is not None:
        figs["latency"] = latency_curve(latency)
    return [save_png(fig, folder / f"{stem}-{name}.png") for name, fig in figs.items()]
