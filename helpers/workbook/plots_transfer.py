"""Figures of notebooks 04 (pinned memory) and 05 (stream overlap), in the style of :mod:`helpers.workbook.plots`.

Each function takes the tables that :mod:`helpers.pipeline.transfer` and
:mod:`helpers.pipeline.prefetch` return and gives back a matplotlib figure;
save it with :func:`helpers.workbook.plots.save_figure`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import matplotlib.pyplot as plt

from helpers.workbook.plots import PHASE_COLORS

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from helpers.pipeline.transfer import LinkInfo

#: One colour per copy method (ColorBrewer Dark2, as plots.PHASE_COLORS).
METHOD_COLORS = {
    "pageable": "#d95f02",
    "pin_per_batch": "#e7298a",
    "loader_pin_thread": "#66a61e",
    "pinned_buffer": "#1b9e77",
    "pinned_copy_only": "#7570b3",
    "host_memcpy": "#666666",
}

#: Colours of the timeline's span kinds.
SPAN_COLORS = {
    "prep": "#e6ab02",
    "copy": PHASE_COLORS["h2d"],
    "data": PHASE_COLORS["data"],
    "compute": PHASE_COLORS["compute"],
}


def _size_label(nbytes: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes:g} B"


def bandwidth_vs_size(sweep: "pd.DataFrame", *, link: "LinkInfo | None" = None, title: str = ""):
    """Bandwidth (GB/s) against transfer size, one line per method, with the link's limit.

    Parameters
    ----------
    sweep : pandas.DataFrame
        :func:`helpers.pipeline.transfer.bandwidth_sweep` or
        :func:`~helpers.pipeline.transfer.host_copy_sweep` rows (``method``,
        ``label``, ``size_bytes``, ``gbps``, ``gbps_p25``, ``gbps_p75``);
        rows with NaN rates are skipped.
    link : LinkInfo, optional
        When it has a limit, drawn as a horizontal line, and a right axis
        shows the bandwidth as a percentage of it.
    title : str

    Returns
    -------
    matplotlib.figure.Figure
    """
    fig, ax = plt.subplots(figsize=(7.5, 4.0), layout="constrained")
    data = sweep.dropna(subset=["gbps"])
    for method in dict.fromkeys(data["method"]):
        part = data[data["method"] == method].sort_values("size_bytes")
        color = METHOD_COLORS.get(method)
        label = str(part["label"].iloc[0]) if "label" in part else method
        ax.plot(part["size_bytes"], part["gbps"], marker="o", ms=3, color=color, label=label,
                linestyle="--" if method == "pinned_copy_only" else "-")
        ax.fill_between(part["size_bytes"], part["gbps_p25"], part["gbps_p75"], color=color, alpha=0.15, lw=0)
    ax.set_xscale("log", base=2)
    ticks = sorted(set(data["size_bytes"]))
    if ticks:
        shown = ticks[:: max(1, len(ticks) // 8)]
        ax.set_xticks(shown, [_size_label(t) for t in shown], rotation=30, fontsize=8)
    ax.set_xlabel("transfer size")
    ax.set_ylabel("bandwidth (GB/s, 1e9 bytes/s)")
    ax.set_ylim(bottom=0)
    if link is not None and link.limit_gbps:
        ax.axhline(link.limit_gbps, color="black", lw=1, linestyle=":", label=link.label())
        top = max(link.limit_gbps * 1.08, float(data["gbps_p75"].max()) * 1.05 if len(data) else 0)
        ax.set_ylim(0, top)
        pct = ax.secondary_yaxis("right", functions=(lambda g: 100 * g / link.limit_gbps,
                                                     lambda p: p * link.limit_gbps / 100))
        pct.set_ylabel("% of the link's limit")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title(title or "Host-to-device bandwidth vs transfer size (median, band: IQR)")
    return fig


def batch_copy_rates(rows: "pd.DataFrame", *, link: "LinkInfo | None" = None, title: str = ""):
    """Horizontal bars: copy rate of one batch per method, with the interquartile range.

    Parameters
    ----------
    rows : pandas.DataFrame
        One row per method: ``label``, ``method``, ``gbps``, ``gbps_p25``, ``gbps_p75``.
    link : LinkInfo, optional
        Its limit is drawn as a vertical line.
    title : str

    Returns
    -------
    matplotlib.figure.Figure
    """
    fig, ax = plt.subplots(figsize=(7, 1.2 + 0.45 * len(rows)), layout="constrained")
    labels = list(rows["label"])
    values = list(rows["gbps"])
    lo = [v - p for v, p in zip(values, rows["gbps_p25"])]
    hi = [p - v for v, p in zip(values, rows["gbps_p75"])]
    colors = [METHOD_COLORS.get(m, "#999999") for m in rows["method"]]
    ax.barh(labels, values, xerr=[lo, hi], color=colors, capsize=3)
    for i, v in enumerate(values):
        ax.text(v, i, f" {v:.2f}", va="center", fontsize=8)
    if link is not None and link.limit_gbps:
        ax.axvline(link.limit_gbps, color="black", lw=1, linestyle=":", label=link.label())
        ax.legend(fontsize=8, loc="lower right")
    ax.invert_yaxis()
    ax.set_xlabel("copy rate of one batch (GB/s, median; whiskers: IQR)")
    ax.set_title(title or "One batch to the device, per method")
    return fig


def _gantt(ax, spans: "pd.DataFrame", *, xlim: tuple[float, float] | None = None) -> None:
    rows = sorted({r for r in spans["row"] if r.endswith("prep")},
                  key=lambda r: (r.startswith("main"), int(r.split()[1]) if r.split()[1].isdigit() else 0))
    rows += [r for r in ("copy", "data wait", "compute") if r in set(spans["row"])]
    for y, row in enumerate(rows):
        part = spans[spans["row"] == row]
        kind = part["kind"].iloc[0]
        bars = [(s * 1e3, max(d * 1e3, 0.05)) for s, d in zip(part["start_s"], part["duration_s"])]
        # no edge: a white edge would hide spans narrower than a pixel (short copies)
        ax.broken_barh(bars, (y - 0.38, 0.76), color=SPAN_COLORS.get(kind, "#999999"), alpha=0.9, linewidth=0)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.invert_yaxis()
    if xlim is not None:
        ax.set_xlim(*xlim)
    ax.grid(True, axis="x", alpha=0.3)


def overlap_timeline(panels: Sequence[tuple[str, "pd.DataFrame"]], *, title: str = ""):
    """Gantt-style timelines, one panel per variant: worker preparation, copy, data wait, compute.

    Parameters
    ----------
    panels : sequence of (str, pandas.DataFrame)
        ``(title, spans)`` per variant; spans from
        :func:`helpers.pipeline.prefetch.timeline_frame` (``row``, ``kind``,
        ``start_s``, ``duration_s``; seconds since the variant's first
        measured step).
    title : str

    Returns
    -------
    matplotlib.figure.Figure
        One row of bars per lane; x in milliseconds. Preparation that
        started before the first measured step (prefetched during warm-up)
        appears at negative times.
    """
    heights = [1 + 0.42 * len(set(s["row"])) for _, s in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, sum(heights) + 0.6), squeeze=False,
                             gridspec_kw={"height_ratios": heights}, layout="constrained")
    for ax, (name, spans) in zip(axes[:, 0], panels):
        end = float((spans["start_s"] + spans["duration_s"]).max()) * 1e3 if len(spans) else 1.0
        # show some lead-in (batches prepared during warm-up), at most a third of the measured window
        start = max(min(0.0, float(spans["start_s"].min()) * 1e3), -end / 3) if len(spans) else 0.0
        _gantt(ax, spans, xlim=(start, end * 1.01))
        ax.set_title(name, fontsize=10, loc="left")
    axes[-1, 0].set_xlabel("time since the first measured step (ms)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in SPAN_COLORS.values()]
    fig.legend(handles, ["batch preparation", "copy to device", "loop waits for data", "compute"],
               loc="outside lower center", ncols=4, fontsize=8, frameon=False)
    if title:
        fig.suptitle(title)
    return fig


def exposed_vs_hidden(stats: Sequence[tuple[str, object]], *, title: str = ""):
    """Per variant, two bars: what a step is made of, and what the input work became.

    Parameters
    ----------
    stats : sequence of (str, OverlapStats)
        ``(label, helpers.pipeline.prefetch.OverlapStats)`` per variant.
    title : str

    Returns
    -------
    matplotlib.figure.Figure
        Milliseconds per step (mean: totals / steps). Upper bar of a variant: the
        step, compute plus exposed input (the loop waiting). Lower bar: the
        input work (preparation + copy), split into the part the loop waited
        for and the part hidden behind compute; when the loop waited longer
        than the work itself, the excess is shown separately.
    """
    fig, ax = plt.subplots(figsize=(7.5, 1.2 + 0.9 * len(stats)), layout="constrained")
    labels, y = [], 0
    seen: set[str] = set()

    def bar(row, left, value, color, name, **kw):
        if value <= 0:
            return left
        ax.barh(row, value, left=left, color=color, label=None if name in seen else name, **kw)
        seen.add(name)
        if value > 0:
            ax.text(left + value / 2, row, f"{value:.0f}", ha="center", va="center", fontsize=7, color="black")
        return left + value

    for label, s in stats:
        n = max(1, s.steps)
        compute = s.compute_s / n * 1e3
        exposed = s.exposed_input_s / n * 1e3
        work = s.input_work_s / n * 1e3
        left = bar(y, 0.0, compute, SPAN_COLORS["compute"], "compute")
        bar(y, left, exposed, SPAN_COLORS["data"], "loop waits for input (exposed)")
        left = bar(y + 1, 0.0, min(exposed, work), SPAN_COLORS["data"], "loop waits for input (exposed)")
        left = bar(y + 1, left, max(0.0, work - exposed), SPAN_COLORS["prep"],
                   "input work hidden behind compute", hatch="//", alpha=0.7)
        labels += [f"{label}: step", f"{label}: input work"]
        y += 2
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms per step (mean over the measured steps)")
    fig.legend(loc="outside lower center", ncols=3, fontsize=8, frameon=False)
    ax.set_title(title or "Input work: exposed vs hidden behind compute")
    return fig
