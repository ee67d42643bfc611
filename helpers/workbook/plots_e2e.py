"""Figures of notebook 10 (end to end): learning curves of both jobs, the ablation, the projection.

Same conventions as :mod:`helpers.workbook.plots`: each function takes plain
data with documented units and returns a matplotlib figure; the notebook saves
it with :func:`helpers.workbook.plots.save_figure`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import matplotlib.pyplot as plt

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

BASELINE_COLOR = "#d95f02"   # the phase color of "data": the baseline is input-bound
OPTIMIZED_COLOR = "#1b9e77"  # the phase color of "compute"
NEUTRAL_COLOR = "#7570b3"


def learning_curves(baseline: Sequence[float], optimized: Sequence[float], *, tail: int, ylabel: str = "value loss",
                    title: str = ""):
    """Overlay the per-step loss of the baseline and the optimized job, shading the compared tail.

    Parameters
    ----------
    baseline, optimized : sequence of float
        Loss after each training step (same seed, same batches), equal lengths.
    tail : int
        Final steps whose means are compared (shaded).
    ylabel, title : str
    """
    fig, ax = plt.subplots(figsize=(6.5, 3.2), layout="constrained")
    steps = range(1, len(baseline) + 1)
    ax.plot(steps, list(baseline), color=BASELINE_COLOR, label="baseline", linewidth=1.8)
    ax.plot(steps, list(optimized), color=OPTIMIZED_COLOR, label="optimized", linewidth=1.4, linestyle="--")
    n = len(baseline)
    ax.axvspan(n - tail + 0.5, n + 0.5, color="#cccccc", alpha=0.5, label=f"last {tail} steps (compared)")
    ax.set_xlabel("training step")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    ax.set_title(title or "Same seed, same batches: does the optimized job learn the same?")
    return fig


def ablation_bars(frame: "pd.DataFrame", *, title: str = ""):
    """Horizontal bars of the speedup over the baseline of each variant, with its interval.

    Parameters
    ----------
    frame : pandas.DataFrame
        :func:`helpers.workbook.endtoend.ablation_frame`: index = variant
        ("all", "without <name>", ...), columns ``speedup``, ``ci_low``, ``ci_high`` (x).
    title : str
    """
    fig, ax = plt.subplots(figsize=(6.5, 1.4 + 0.45 * len(frame)), layout="constrained")
    labels = [str(i) for i in frame.index]
    values = frame["speedup"].tolist()
    low = [max(0.0, v - lo) for v, lo in zip(values, frame["ci_low"])]
    high = [max(0.0, hi - v) if hi != float("inf") else 0.0 for v, hi in zip(values, frame["ci_high"])]
    colors = [OPTIMIZED_COLOR if lab == "all" else NEUTRAL_COLOR for lab in labels]
    ax.barh(labels, values, xerr=[low, high], color=colors, capsize=3)
    for i, v in enumerate(values):  # inside the bar, clear of the whiskers
        ax.text(0.04 * max(values + [1.0]), i, f"{v:.2f}x", va="center", ha="left", fontsize=8, color="white",
                fontweight="bold")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.invert_yaxis()
    ax.set_xlabel("throughput vs baseline (x), 95% bootstrap interval")
    ax.set_title(title or "Ablation: each optimization removed in turn")
    return fig


def projection_bars(before_s: float, after_s: float, after_range_s: tuple[float, float], *, steps: int,
                    title: str = ""):
    """Two bars: projected duration of ``steps`` steps before and after, in hours, with the after-interval.

    Parameters
    ----------
    before_s, after_s : float
        Projected seconds at the median step times.
    after_range_s : (float, float)
        Interval of the after-duration, seconds.
    steps : int
        Steps projected (for the title).
    title : str
    """
    fig, ax = plt.subplots(figsize=(6.5, 2.0), layout="constrained")
    hours = [before_s / 3600, after_s / 3600]
    lo, hi = after_range_s
    err_lo = max(0.0, hours[1] - lo / 3600)
    err_hi = max(0.0, hi / 3600 - hours[1]) if hi != float("inf") else 0.0
    ax.barh(["before", "after"], hours, xerr=[[0.0, err_lo], [0.0, err_hi]], capsize=3,
            color=[BASELINE_COLOR, OPTIMIZED_COLOR])
    for i, h in enumerate(hours):
        ax.text(h, i, f" {h:.1f} h", va="center", ha="left", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("projected wall time (hours)")
    ax.set_title(title or f"{steps:,} training steps, before and after")
    return fig
