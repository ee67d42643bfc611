"""Figures of notebook 03 (DataLoader tuning), in the style of :mod:`helpers.workbook.plots`.

Each function takes the DataFrame a helper of :mod:`helpers.experiments.loader_sweep`,
:mod:`helpers.pipeline.randomness` or :mod:`helpers.pipeline.worker_memory` returns
(columns documented there) and returns a matplotlib figure; save it with
:func:`helpers.workbook.plots.save_figure`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import matplotlib.ticker
import numpy as np

from helpers.workbook.plots import subplots

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = ["throughput_vs_workers", "probe_repeats", "worker_memory"]

_BEFORE, _AFTER = "#d95f02", "#1b9e77"


def _series_label(prefetch: float, persistent: bool) -> str:
    return f"prefetch_factor={int(prefetch)}" + (", persistent" if persistent else "")


def throughput_vs_workers(summary: "pd.DataFrame", *, cores: int | None = None, title: str = ""):
    """Throughput and first-batch latency against ``num_workers``, one line per prefetch/persistent setting.

    Parameters
    ----------
    summary : pandas.DataFrame
        :meth:`helpers.experiments.loader_sweep.SweepResult.summary`: ``num_workers``,
        ``prefetch_factor`` (None for 0 workers), ``persistent_workers``,
        ``images_per_s`` with ``images_per_s_p25``/``_p75`` (images/s),
        ``first_batch_s`` (seconds).
    cores : int, optional
        Usable CPU cores, drawn as a vertical line.
    title : str

    Returns
    -------
    matplotlib.figure.Figure
        Left: images/s (median, bars from the 25th to the 75th percentile);
        the ``num_workers=0`` reference is a dashed horizontal line. Right:
        first-batch latency (ms, log scale): worker start-up, with the
        ``num_workers=0`` line labelled on the panel.
    """
    fig, (ax, ax2) = subplots(1, 2, figsize=(10, 3.6), layout="constrained")
    zero = summary[summary["num_workers"] == 0]
    multi = summary[summary["num_workers"] > 0]
    if not zero.empty:
        ref = float(zero["images_per_s"].iloc[0])
        ax.axhline(ref, color="black", linestyle="--", linewidth=1, label=f"num_workers=0 ({ref:.0f} images/s)")
        ref_ms = float(zero["first_batch_s"].iloc[0]) * 1e3
        ax2.axhline(ref_ms, color="black", linestyle="--", linewidth=1, label="num_workers=0")
        ax2.text(0.02, ref_ms, f"num_workers=0 ({ref_ms:.3g} ms)", transform=ax2.get_yaxis_transform(),
                 ha="left", va="bottom", fontsize=8)
    groups = multi.groupby(["prefetch_factor", "persistent_workers"], sort=True)
    markers = "osD^v<>"
    for k, ((prefetch, persistent), g) in enumerate(groups):
        g = g.sort_values("num_workers")
        x = g["num_workers"].to_numpy()
        y = g["images_per_s"].to_numpy(dtype=float)
        lo = y - g["images_per_s_p25"].to_numpy(dtype=float)
        hi = g["images_per_s_p75"].to_numpy(dtype=float) - y
        label = _series_label(prefetch, persistent)
        style = "-" if persistent else ":"
        ax.errorbar(x + 0.04 * (k - len(groups) / 2), y, yerr=np.vstack([lo, hi]), marker=markers[k % len(markers)],
                    linestyle=style, capsize=3, label=label)
        ax2.plot(x, g["first_batch_s"].to_numpy(dtype=float) * 1e3, marker=markers[k % len(markers)],
                 linestyle=style, label=label)
    ticks = sorted(set(int(w) for w in summary["num_workers"]))
    for a in (ax, ax2):
        if cores:
            a.axvline(cores, color="#999999", linewidth=1, linestyle="-.", zorder=0)
            a.text(cores, 0.98, f" {cores} cores", transform=a.get_xaxis_transform(), va="top", fontsize=8,
                   color="#666666")
        a.set_xticks(ticks)
        a.set_xlim(min(ticks) - 0.4, max(ticks + [cores or 0]) + 0.6)
        a.set_xlabel("num_workers")
    ax.set_ylabel("images/s (median, IQR)")
    ax.set_ylim(bottom=0)
    ax.set_title(title or "Loader throughput vs workers")
    ax2.set_ylabel("first batch (ms, log scale)")
    ax2.set_yscale("log")
    ax2.yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax2.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax2.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax2.set_title("First batch: worker start-up")
    ax.legend(fontsize=7, loc="lower right")
    return fig


def probe_repeats(summary: "pd.DataFrame", *, title: str = ""):
    """Share of repeated random draws per source, before and after the worker_init_fn.

    Parameters
    ----------
    summary : pandas.DataFrame
        :func:`helpers.pipeline.randomness.duplicate_summary`: ``variant``,
        ``source``, ``repeated_share`` (0..1).
    title : str

    Returns
    -------
    matplotlib.figure.Figure
    """
    sources = list(dict.fromkeys(summary["source"]))
    variants = list(dict.fromkeys(summary["variant"]))
    fig, ax = subplots(figsize=(7, 0.6 + 0.55 * len(sources)), layout="constrained")
    y = np.arange(len(sources))
    h = 0.8 / max(1, len(variants))
    for k, (variant, color) in enumerate(zip(variants, (_BEFORE, _AFTER, "#7570b3"))):
        sub = summary[summary["variant"] == variant].set_index("source").reindex(sources)
        share = sub["repeated_share"].to_numpy(dtype=float) * 100
        bars = ax.barh(y + (k - (len(variants) - 1) / 2) * h, share, height=h, color=color, label=variant)
        for bar, v in zip(bars, share):
            ax.text(bar.get_width() + 1, bar.get_y() + bar.get_height() / 2, f"{v:.0f}%", va="center", fontsize=8)
    ax.set_yticks(y, sources)
    ax.invert_yaxis()
    ax.set_xlim(0, 110)
    ax.set_xlabel("repeated draws (% of all draws of that source)")
    ax.set_title(title or "Do augmentation draws repeat across workers, epochs and ranks?")
    ax.legend(fontsize=8, loc="lower right")
    return fig


def worker_memory(frame: "pd.DataFrame", *, column: str = "uss_mib", title: str = ""):
    """Memory of the main process and each worker at the start and the end of an epoch.

    Parameters
    ----------
    frame : pandas.DataFrame
        :func:`helpers.pipeline.worker_memory.measure_epoch_memory` output (several
        loaders concatenated): ``loader``, ``moment``, ``role`` and ``column``.
    column : str, default "uss_mib"
        ``"uss_mib"``, ``"pss_mib"`` or ``"rss_mib"`` (MiB).
    title : str

    Returns
    -------
    matplotlib.figure.Figure
        One panel per loader, bars per process: start (light) and end (dark).
    """
    loaders = list(dict.fromkeys(frame["loader"]))
    fig, axes = subplots(1, len(loaders), figsize=(4.2 * len(loaders), 3.2), layout="constrained",
                         sharey=True, squeeze=False)
    for ax, name in zip(axes[0], loaders):
        sub = frame[frame["loader"] == name]
        roles = list(dict.fromkeys(sub["role"]))
        x = np.arange(len(roles))
        for k, (moment, color) in enumerate((("start", "#a6cee3"), ("end", "#1f78b4"))):
            vals = sub[sub["moment"] == moment].set_index("role").reindex(roles)[column].to_numpy(dtype=float)
            bars = ax.bar(x + (k - 0.5) * 0.4, vals, width=0.4, color=color, label=f"{moment} of epoch")
            for bar, v in zip(bars, vals):
                if np.isfinite(v):
                    ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height(), f"{v:.0f}", ha="center",
                            va="bottom", fontsize=7)
        ax.set_xticks(x, roles, fontsize=8)
        ax.set_title(name, fontsize=9)
    axes[0][0].set_ylabel(f"{column.split('_')[0].upper()} (MiB)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title or "Worker memory over an epoch")
    return fig
