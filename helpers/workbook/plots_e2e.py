"""Figures of notebook 10 (end to end): learning curves of both jobs, the ablation, the projection.

Same conventions as :mod:`helpers.workbook.plots`: each function takes plain
data with documented units and returns a matplotlib figure; the notebook saves
it with :func:`helpers.workbook.plots.save_figure`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from helpers.workbook.plots import subplots


if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

BASELINE_COLOR = "#d95f02"   # the phase color of "data": the baseline is input-bound
OPTIMIZED_COLOR = "#1b9e77"  # the phase color of "compute"
NEUTRAL_COLOR = "#7570b3"


def _smooth(values: Sequence[float], window: int) -> list[float]:
    """Trailing moving average over up to ``window`` values (shorter at the start)."""
    out, vals = [], [float(v) for v in values]
    for k in range(len(vals)):
        chunk = vals[max(0, k - window + 1): k + 1]
        out.append(sum(chunk) / len(chunk))
    return out


def learning_curves(baseline: Sequence[float], optimized: Sequence[float], *, tail: int, ylabel: str = "value loss",
                    title: str = "", smooth: int | None = None):
    """Overlay the per-step loss of the baseline and the optimized job, shading the compared tail.

    Parameters
    ----------
    baseline, optimized : sequence of float
        Loss after each training step (same seed, same batches), equal lengths.
    tail : int
        Final steps whose means are compared (shaded).
    ylabel, title : str
    smooth : int, optional
        Window (steps) of a trailing moving average drawn over the raw curves;
        default ``max(3, len // 6)``; 0 or 1 draws none.
    """
    fig, ax = subplots(figsize=(6.5, 3.2), layout="constrained")
    n = len(baseline)
    steps = range(1, n + 1)
    window = max(3, n // 6) if smooth is None else int(smooth)
    raw_alpha = 0.45 if window > 1 else 1.0
    ax.plot(steps, list(baseline), color=BASELINE_COLOR, label="baseline (per step)", linewidth=1.2,
            alpha=raw_alpha)
    ax.plot(steps, list(optimized), color=OPTIMIZED_COLOR, label="optimized (per step)", linewidth=1.0,
            linestyle="--", alpha=raw_alpha)
    if window > 1:
        ax.plot(steps, _smooth(baseline, window), color=BASELINE_COLOR, linewidth=2.2,
                label=f"baseline, {window}-step mean")
        ax.plot(steps, _smooth(optimized, window), color=OPTIMIZED_COLOR, linewidth=2.0, linestyle="--",
                label=f"optimized, {window}-step mean")
    ax.axvspan(n - tail + 0.5, n + 0.5, color="#cccccc", alpha=0.5, label=f"last {tail} steps (compared)")
    ax.set_xlabel("training step (identical batches in both jobs)")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7, ncol=2)
    ax.set_title(title or "Same seed, same batches: do both jobs compute the same?")
    return fig


def ablation_bars(frame: "pd.DataFrame", *, title: str = ""):
    """Horizontal bars of the speedup over the baseline of each variant, with its interval.

    Parameters
    ----------
    frame : pandas.DataFrame
        :func:`helpers.experiments.e2e_checks.ablation_frame`: index = variant
        ("all", "without <name>", ...), columns ``speedup``, ``ci_low``, ``ci_high`` (x).
    title : str
    """
    fig, ax = subplots(figsize=(6.5, 1.4 + 0.45 * len(frame)), layout="constrained")
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
                    before_range_s: tuple[float, float] | None = None, unit: tuple[str, float] = ("hours", 3600.0),
                    title: str = ""):
    """Two bars: projected duration of ``steps`` steps before and after, in one unit, with their ranges.

    Parameters
    ----------
    before_s, after_s : float
        Projected seconds at the median step times.
    after_range_s : (float, float)
        Interval of the after-duration, seconds (the speedup's interval).
    steps : int
        Steps projected (for the title).
    before_range_s : (float, float), optional
        Range of the before-duration, seconds (the baseline's step-time quartiles).
    unit : (str, float)
        Unit name and seconds per unit, e.g. ``("hours", 3600.0)``
        (:func:`helpers.experiments.e2e_checks.duration_unit`); used for every number.
    title : str
    """
    name, div = unit
    fig, ax = subplots(figsize=(6.5, 2.0), layout="constrained")
    vals = [before_s / div, after_s / div]
    ranges = [before_range_s, after_range_s]
    err_lo, err_hi = [], []
    for v, r in zip(vals, ranges):
        if r is None:
            err_lo.append(0.0)
            err_hi.append(0.0)
            continue
        lo, hi = r
        err_lo.append(max(0.0, v - lo / div))
        err_hi.append(max(0.0, hi / div - v) if hi != float("inf") else 0.0)
    ax.barh(["before", "after"], vals, xerr=[err_lo, err_hi], capsize=3, color=[BASELINE_COLOR, OPTIMIZED_COLOR])
    right = max(v + e for v, e in zip(vals, err_hi))
    pad = 0.02 * right
    for i, (v, e) in enumerate(zip(vals, err_hi)):  # beyond the error bar's end
        ax.text(v + e + pad, i, f"{v:.1f} {name}", va="center", ha="left", fontsize=8)
    ax.set_xlim(0, right * 1.25)
    ax.invert_yaxis()
    ax.set_xlabel(f"projected wall time ({name}); bars: before = step-time quartiles, after = 95% interval")
    ax.set_title(title or f"{steps:,} training steps, before and after")
    return fig
