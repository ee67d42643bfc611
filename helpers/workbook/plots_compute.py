"""Figures of the compute notebooks (06 mixed precision, 07 channels_last and fusion).

Same conventions as :mod:`helpers.workbook.plots`: each function takes plain
sequences, returns a matplotlib figure, and the notebook saves it with
``plots.save_figure(fig, ctx, name)``.
"""

from __future__ import annotations

from typing import Sequence

from matplotlib.ticker import MaxNLocator

from helpers.workbook.plots import subplots

FP32_COLOR = "#7570b3"
MIXED_COLOR = "#1b9e77"
SKIP_COLOR = "#d95f02"


def loss_curves(fp32: Sequence[float], mixed: Sequence[float], *, mixed_label: str, title: str = "",
                ylabel: str = "loss"):
    """Overlay the per-step training loss of fp32 and mixed precision.

    Parameters
    ----------
    fp32, mixed : sequence of float
        Loss after each training step (same seed and data), equal lengths.
    mixed_label : str
        Legend entry of the mixed-precision run, e.g. "bf16 autocast".
    title : str
    ylabel : str
        The loss's name, e.g. "value loss".
    """
    fig, (ax, ax2) = subplots(2, 1, figsize=(6.5, 4.2), sharex=True,
                              gridspec_kw={"height_ratios": [2, 1]})
    steps = range(1, len(fp32) + 1)
    ax.plot(steps, list(fp32), color=FP32_COLOR, label="fp32", linewidth=1.8)
    ax.plot(steps, list(mixed), color=MIXED_COLOR, label=mixed_label, linewidth=1.2, linestyle="--")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    ax.set_title(title)
    ax2.plot(steps, [m - f for f, m in zip(fp32, mixed)], color=SKIP_COLOR)
    ax2.axhline(0.0, color="black", linewidth=0.6)
    ax2.set_ylabel("mixed - fp32")
    ax2.set_xlabel("training step")
    ax2.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax2.set_xlim(1, max(len(fp32), 2))  # every step, also those after a loss stopped being finite (not drawn)
    fig.tight_layout()
    return fig


def loss_scale_trajectory(scales: Sequence[float], overflow: Sequence[bool], *, title: str = ""):
    """Loss scale after each optimizer update, with the skipped (overflow) updates marked.

    Parameters
    ----------
    scales : sequence of float
        ``GradScaler.get_scale()`` after each update.
    overflow : sequence of bool
        True where the update's gradients were not finite (step skipped); same length.
    title : str
    """
    fig, ax = subplots(figsize=(6.5, 2.8))
    x = list(range(1, len(scales) + 1))
    ax.step(x, list(scales), where="post", color=MIXED_COLOR, label="loss scale")
    bad = [(i, s) for i, s, o in zip(x, scales, overflow) if o]
    if bad:
        ax.scatter([i for i, _ in bad], [s for _, s in bad], color=SKIP_COLOR, zorder=3,
                   label=f"skipped update ({len(bad)})")
    ax.set_yscale("log", base=2)
    ax.set_xlabel("optimizer update")
    ax.set_ylabel("scale")
    ax.legend(fontsize=8)
    ax.set_title(title)
    fig.tight_layout()
    return fig


def step_time_bars(names: Sequence[str], medians_ms: Sequence[float], p25_ms: Sequence[float],
                   p75_ms: Sequence[float], *, title: str = ""):
    """Horizontal bars of median step time per variant with the interquartile range.

    Parameters
    ----------
    names : sequence of str
        Variant names.
    medians_ms, p25_ms, p75_ms : sequence of float
        Median, 25th and 75th percentile step time per variant, milliseconds.
    title : str
    """
    fig, ax = subplots(figsize=(6.5, 0.6 + 0.5 * len(names)))
    y = list(range(len(names)))
    err = [[m - lo for m, lo in zip(medians_ms, p25_ms)], [hi - m for m, hi in zip(medians_ms, p75_ms)]]
    ax.barh(y, list(medians_ms), xerr=err, color=[FP32_COLOR, MIXED_COLOR, SKIP_COLOR][: len(names)] or None,
            capsize=3)
    ax.set_yticks(y, list(names))
    ax.set_xlabel("step time, ms (median, IQR)")
    ax.set_title(title)
    fig.tight_layout()
    return fig


def precision_scaler_demo_figure(result):
    """Notebook 06, section 4: the demonstration's loss scale with its injected overflows (``result.demo`` of a
    :class:`helpers.experiments.precision.PrecisionChecks` or :class:`~helpers.experiments.precision.PrecisionResult`)."""
    from helpers.experiments.precision import DEMO_GROWTH_INTERVAL

    return loss_scale_trajectory(result.demo.scales, result.demo.overflow,
                                 title=f"Loss scale with injected overflows (growth_interval {DEMO_GROWTH_INTERVAL} "
                                       "for the demo)")


def precision_loss_figure(result):
    """Notebook 06, section 5: the gated loss of fp32 and mixed precision per step, and their difference."""
    c = result.curves
    if c.no_nan:
        how = f" {c.rel_diff:.2%} apart at the end, on its scale"
    else:  # where each run's loss first became NaN or infinite (those points are not drawn)
        how = "\ndiverged: " + "; ".join(f"{stat} {value:g} at step {step} in {name}"
                                         for name, (step, stat, value) in
                                         ((n, f) for n, f in c.divergence.first.items() if f is not None))
    return loss_curves(c.fp32, c.mixed, mixed_label=f"{c.dtype_name} autocast", ylabel=c.loss_name,
                       title=f"{c.loss_name.capitalize()}, same seed and batches:{how}")


def precision_loss_scale_figure(result):
    """Notebook 06, section 5: the fp16 run's loss scale, or None where no scaler ran (bf16, a user's job)."""
    s = result.curves.scaler
    return None if s is None else loss_scale_trajectory(s.scales, s.overflow, title="Loss scale of the fp16 run")


def precision_step_time_figure(result):
    """Notebook 06, section 6: the median step time of fp32 and mixed precision with their IQR."""
    a, b = result.cmp.a, result.cmp.b
    who = "PPO" if result.builtin else "Your"
    return step_time_bars([a.name, b.name], [a.median_s * 1e3, b.median_s * 1e3], [a.p25_s * 1e3, b.p25_s * 1e3],
                          [a.p75_s * 1e3, b.p75_s * 1e3],
                          title=f"{who} step on {result.caps.kind}: fp32 vs {result.dtype_name} autocast")


# --------------------------------------------------------------------------- notebook 07 (engineer C)


def speedup_intervals(names: Sequence[str], ratios: Sequence[float], ci_low: Sequence[float],
                      ci_high: Sequence[float], *, title: str = ""):
    """Speedup of each candidate over its baseline, with its confidence interval.

    One horizontal point-and-whisker per comparison; a vertical line at 1
    (no difference). Intervals that lie entirely above 1 are drawn in the
    "mixed" colour, entirely below 1 in the "skip" colour, others in grey.

    Parameters
    ----------
    names : sequence of str
        Comparison labels, e.g. "channels_last vs NCHW (fp32)".
    ratios : sequence of float
        ``Comparison.ratio`` (median baseline time / median candidate time; > 1: faster), "x".
    ci_low, ci_high : sequence of float
        Bounds of the ratio's bootstrap interval, same length as ``names``.
    title : str
    """
    fig, ax = subplots(figsize=(6.5, 0.5 + 0.45 * max(1, len(names))))
    for i, (r, lo, hi) in enumerate(zip(ratios, ci_low, ci_high)):
        color = MIXED_COLOR if lo > 1.0 else SKIP_COLOR if hi < 1.0 else "#999999"
        ax.errorbar([r], [i], xerr=[[r - lo], [hi - r]], fmt="o", color=color, capsize=4)
    ax.axvline(1.0, color="black", linewidth=0.6)
    ax.set_yticks(range(len(names)), list(names))
    ax.invert_yaxis()
    ax.set_xlabel("speedup (x, > 1 is faster)")
    ax.set_title(title)
    fig.tight_layout()
    return fig


def channels_last_speedups(result):
    """Notebook 07's figure: every speedup it measured with its interval (:func:`speedup_intervals`).

    Parameters
    ----------
    result : helpers.experiments.memory_format.ChannelsLastResult
        Its ``speedups()`` (channels_last per precision, SDPA, torch.compile) and ``speedups_title()``.
    """
    shown = result.speedups()
    return speedup_intervals(list(shown), [c.ratio for c in shown.values()], [c.ci_low for c in shown.values()],
                             [c.ci_high for c in shown.values()], title=result.speedups_title())
