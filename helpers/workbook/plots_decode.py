"""Figures of notebook 02 (batched decode), in the style of :mod:`helpers.workbook.plots`.

Each function takes plain numbers or a DataFrame with documented columns and
returns a matplotlib Figure; save it with :func:`helpers.workbook.plots.save_figure`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from helpers.experiments.decode import BASELINE_LABEL, BATCHED_DEVICE_LABEL, BATCHED_HOST_LABEL, RAW_DECODE_LABEL
from helpers.workbook.plots import subplots

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

#: Colours of the variants (colour-blind-safe Dark2, as plots.PHASE_COLORS).
VARIANT_COLORS = {
    BASELINE_LABEL: "#d95f02",
    BATCHED_DEVICE_LABEL: "#1b9e77",
    BATCHED_HOST_LABEL: "#66a61e",
    RAW_DECODE_LABEL: "#7570b3",
}

#: PSNR shown for identical images (infinite PSNR) in histograms, dB.
IDENTICAL_DB = 60.0


def throughput_bars(frame: "pd.DataFrame", *, title: str = ""):
    """Horizontal bars of images/s per variant, with the interquartile range, one panel per comparison.

    Rates are only comparable within one interleaved comparison, so each
    comparison gets its own panel (titled with what its ratio means); the
    panels share the x axis.

    Parameters
    ----------
    frame : pandas.DataFrame
        One row per variant: ``variant`` (str), ``rate`` (images/s at the
        median time), ``rate_p25`` and ``rate_p75`` (images/s at the 75th and
        25th percentile times); optionally ``comparison`` (str, the panel
        title; rows with the same value share a panel, in order of first
        appearance). Without it, one panel.
    title : str

    Returns
    -------
    matplotlib.figure.Figure
    """
    groups = list(dict.fromkeys(frame["comparison"])) if "comparison" in frame else [None]
    heights = [max(1, int((frame["comparison"] == g).sum()) if g is not None else len(frame)) for g in groups]
    fig, axes = subplots(len(groups), 1, sharex=True, squeeze=False, height_ratios=heights,
                         figsize=(6.5, 0.9 + 0.55 * len(frame) + 0.45 * len(groups)), layout="constrained")
    all_high = np.asarray(frame["rate_p75"], dtype=float)
    xmax = max(float(np.nanmax(np.asarray(frame["rate"], dtype=float))), float(np.nanmax(all_high))) * 1.2
    for ax, g in zip(axes[:, 0], groups):
        part = frame if g is None else frame[frame["comparison"] == g]
        labels = [str(v) for v in part["variant"]]
        rates = np.asarray(part["rate"], dtype=float)
        low = rates - np.asarray(part["rate_p25"], dtype=float)
        high = np.asarray(part["rate_p75"], dtype=float) - rates
        colors = [VARIANT_COLORS.get(v, "#666666") for v in labels]
        ax.barh(labels, rates, xerr=np.vstack([low, high]), color=colors, capsize=4)
        for i, (r, h) in enumerate(zip(rates, high)):
            ax.text(r + h, i, f"  {r:,.0f}", va="center", ha="left", fontsize=8)
        ax.invert_yaxis()
        if g is not None:
            ax.set_title(str(g), fontsize=9, loc="left")
    axes[0, 0].set_xlim(0, xmax)
    axes[-1, 0].set_xlabel("images per second (median; bars: interquartile range)")
    fig.suptitle(title or "Preprocessing throughput")
    return fig


def psnr_distribution(values_db: Sequence[float], threshold_db: float, *, title: str = ""):
    """Histogram of per-image PSNR against the reference, with the pass threshold.

    Parameters
    ----------
    values_db : sequence of float
        PSNR per image, dB; ``inf`` (identical pixels) is drawn at
        :data:`IDENTICAL_DB`.
    threshold_db : float
        Least PSNR counted as "the same picture".
    title : str

    Returns
    -------
    matplotlib.figure.Figure
    """
    v = np.asarray([IDENTICAL_DB if math.isinf(x) else min(x, IDENTICAL_DB) for x in values_db], dtype=float)
    fig, ax = subplots(figsize=(6, 2.8), layout="constrained")
    ax.hist(v, bins=min(30, max(5, len(v) // 3)), color="#1b9e77", alpha=0.85)
    ax.axvline(threshold_db, color="black", linestyle="--", label=f"threshold {threshold_db:g} dB")
    n_low = int((v < threshold_db).sum())
    ax.set_xlabel(f"PSNR vs the reference decode (dB; identical drawn at {IDENTICAL_DB:g})")
    ax.set_ylabel("images")
    ax.legend(fontsize=8, title=f"{n_low} of {len(v)} below", title_fontsize=8)
    ax.set_title(title or "Batched pixels vs the per-image reference")
    return fig


def time_split(frame: "pd.DataFrame", *, title: str = ""):
    """Stacked bars: a batch's preprocessing time split into tokenization and the rest.

    Parameters
    ----------
    frame : pandas.DataFrame
        One row per variant (index = label), columns ``tokenize`` and
        ``images`` (seconds per batch: tokenization, and everything else).
    title : str

    Returns
    -------
    matplotlib.figure.Figure
    """
    fig, ax = subplots(figsize=(6.5, 1.2 + 0.55 * len(frame)), layout="constrained")
    labels = [str(i) for i in frame.index]
    left = np.zeros(len(frame))
    for col, color in (("images", "#999999"), ("tokenize", "#e7298a")):
        ms = np.asarray(frame[col], dtype=float) * 1e3
        ax.barh(labels, ms, left=left, color=color, label="everything but tokenization" if col == "images" else col)
        for i, (l0, w) in enumerate(zip(left, ms)):
            total = float(frame.iloc[i][["images", "tokenize"]].sum()) * 1e3
            if col == "tokenize":
                ax.text(l0 + w, i, f"  tokenize {100 * w / total:.1f}%", va="center", ha="left", fontsize=8)
        left = left + ms
    ax.set_xlim(0, left.max() * 1.35)
    ax.invert_yaxis()
    ax.set_xlabel("median time per batch (ms)")
    fig.legend(loc="outside lower center", fontsize=8, ncols=2, frameon=False)
    ax.set_title(title or "Where a batch's preprocessing time goes")
    return fig


def dct_scales(counts: Mapping[int, int], *, title: str = ""):
    """Bars of how many images were decoded at each DCT scale (1, 1/2, 1/4, 1/8).

    Parameters
    ----------
    counts : mapping of int to int
        Denominator d (1, 2, 4, 8) -> number of images decoded at 1/d size.
    title : str

    Returns
    -------
    matplotlib.figure.Figure
    """
    ds = [1, 2, 4, 8]
    values = [int(counts.get(d, 0)) for d in ds]
    fig, ax = subplots(figsize=(5, 2.6), layout="constrained")
    ax.bar([("full size" if d == 1 else f"1/{d}") for d in ds], values, color="#7570b3")
    for i, v in enumerate(values):
        ax.text(i, v, str(v), ha="center", va="bottom", fontsize=8)
    ax.set_ylim(0, max(1, max(values)) * 1.18)  # room above the tallest bar for its count label
    ax.set_ylabel("images")
    ax.set_xlabel("decoded at (DCT-domain scale)")
    ax.set_title(title or "How much of each JPEG was decoded")
    return fig


def throughput_comparisons(result, *, title: str = ""):
    """Notebook 02's two interleaved comparisons as :func:`throughput_bars` panels: speedup and decode efficiency.

    Parameters
    ----------
    result : helpers.experiments.decode.DecodeResult
        Its ``pre`` (per-image baseline vs batched + device normalize) and ``eff`` (raw decode only vs batched
        (host)) comparisons; rates in images/s.
    title : str

    Returns
    -------
    matplotlib.figure.Figure
    """
    pre, eff = result.pre, result.eff
    panels = {f"speedup {pre.ratio:.2f}x (95% CI {pre.ci_low:.2f}-{pre.ci_high:.2f})\n{pre.b.name} over {pre.a.name}":
              (pre.a, pre.b),
              f"decode efficiency {eff.ratio:.0%} (95% CI {eff.ci_low:.0%}-{eff.ci_high:.0%})\n{eff.b.name} over "
              f"{eff.a.name}, same decoder and threads": (eff.b, eff.a)}
    import pandas as pd

    rows = [{"comparison": t, "variant": m.name, "rate": m.rate, "rate_p25": m.rate_p25, "rate_p75": m.rate_p75}
            for t, ms in panels.items() for m in ms]
    return throughput_bars(pd.DataFrame(rows), title=title)
