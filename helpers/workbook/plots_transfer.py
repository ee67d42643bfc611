"""Figures of notebooks 04 (pinned memory) and 05 (stream overlap), in the style of :mod:`helpers.workbook.plots`.

Each function takes the tables that :mod:`helpers.experiments.pinning` and
:mod:`helpers.pipeline.prefetch` return and gives back a matplotlib figure;
save it with :func:`helpers.workbook.plots.save_figure`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from matplotlib.patches import Rectangle

from helpers.units import format_bytes
from helpers.workbook.plots import PHASE_COLORS, subplots

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from helpers.diagnose.pcie import LinkInfo

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


def bandwidth_vs_size(sweep: "pd.DataFrame", *, link: "LinkInfo | None" = None, title: str = ""):
    """Bandwidth (GB/s) against transfer size, one line per method, with the link's limit.

    Parameters
    ----------
    sweep : pandas.DataFrame
        :func:`helpers.experiments.pinning.bandwidth_sweep` or
        :func:`~helpers.experiments.pinning.host_copy_sweep` rows (``method``,
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
    fig, ax = subplots(figsize=(7.5, 4.0), layout="constrained")
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
        ax.set_xticks(shown, [format_bytes(t) for t in shown], rotation=30, fontsize=8)
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
    fig, ax = subplots(figsize=(7, 1.2 + 0.45 * len(rows)), layout="constrained")
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


#: Narrowest span drawn, as a fraction of the time axis (about 2-3 pixels on a 9-inch figure), so that a copy
#: of a fraction of a millisecond stays visible beside steps of hundreds of milliseconds.
MIN_SPAN_FRACTION = 0.003


def _gantt(ax, spans: "pd.DataFrame", *, xlim: tuple[float, float], min_width_ms: float) -> None:
    rows = sorted({r for r in spans["row"] if r.endswith("prep")},
                  key=lambda r: (r.startswith("main"), int(r.split()[1]) if r.split()[1].isdigit() else 0))
    rows += [r for r in ("copy", "data wait", "compute") if r in set(spans["row"])]
    for y, row in enumerate(rows):
        part = spans[spans["row"] == row]
        kind = part["kind"].iloc[0]
        bars = [(s * 1e3, max(d * 1e3, min_width_ms)) for s, d in zip(part["start_s"], part["duration_s"])]
        # no edge: a white edge would hide narrow spans
        ax.broken_barh(bars, (y - 0.38, 0.76), color=SPAN_COLORS.get(kind, "#999999"), alpha=0.9, linewidth=0)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(*xlim)
    ax.grid(True, axis="x", alpha=0.3)


def _window_ms(spans: "pd.DataFrame") -> tuple[float, float]:
    """Time window of one panel, ms: its spans, with at most a third of the measured window of lead-in."""
    if not len(spans):
        return 0.0, 1.0
    end = float((spans["start_s"] + spans["duration_s"]).max()) * 1e3
    # show some lead-in (batches prepared during warm-up), at most a third of the measured window
    start = max(min(0.0, float(spans["start_s"].min()) * 1e3), -end / 3)
    return start, end


def overlap_timeline(panels: Sequence[tuple[str, "pd.DataFrame"]], *, title: str = ""):
    """Gantt-style timelines, one panel per variant: worker preparation, copy, data wait, compute.

    Parameters
    ----------
    panels : sequence of (str, pandas.DataFrame)
        ``(title, spans)`` per variant; spans from
        :func:`helpers.experiments.overlap.timeline_frame` (``row``, ``kind``,
        ``start_s``, ``duration_s``; seconds since the variant's first
        measured step).
    title : str

    Returns
    -------
    matplotlib.figure.Figure
        One row of bars per lane; x in milliseconds, the same axis for every
        panel so that their steps can be compared by eye. Preparation that
        started before the first measured step (prefetched during warm-up)
        appears at negative times. Spans narrower than
        :data:`MIN_SPAN_FRACTION` of the axis (typically the copies) are
        drawn that wide, and the legend says so.
    """
    windows = [_window_ms(s) for _, s in panels]
    start = min(w[0] for w in windows) if windows else 0.0
    end = max(w[1] for w in windows) if windows else 1.0
    xlim = (start, start + (end - start) * 1.01)
    min_width = MIN_SPAN_FRACTION * (xlim[1] - xlim[0])
    heights = [1 + 0.42 * len(set(s["row"])) for _, s in panels]
    fig, axes = subplots(len(panels), 1, figsize=(9, sum(heights) + 0.6), squeeze=False, sharex=True,
                         gridspec_kw={"height_ratios": heights}, layout="constrained")
    for ax, (name, spans) in zip(axes[:, 0], panels):
        _gantt(ax, spans, xlim=xlim, min_width_ms=min_width)
        ax.set_title(name, fontsize=10, loc="left")
    for ax in axes[:-1, 0]:
        ax.tick_params(labelbottom=True)  # sharex hides them; each panel keeps its own labels
    axes[-1, 0].set_xlabel("time since the first measured step (ms)")
    handles = [Rectangle((0, 0), 1, 1, color=c) for c in SPAN_COLORS.values()]
    fig.legend(handles, ["batch preparation", "copy to device", "loop waits for data", "compute"],
               loc="outside lower center", ncols=4, fontsize=8, frameon=False,
               title=f"spans shorter than {min_width:.2g} ms (e.g. copies) are drawn {min_width:.2g} ms wide",
               title_fontsize=7)
    if title:
        fig.suptitle(title)
    return fig


def exposed_vs_hidden(stats: Sequence[tuple[str, object]], *, title: str = ""):
    """Per variant, two bars: what a step is made of, and what the input work became.

    Parameters
    ----------
    stats : sequence of (str, OverlapStats)
        ``(label, helpers.experiments.overlap.OverlapStats)`` per variant.
    title : str

    Returns
    -------
    matplotlib.figure.Figure
        Milliseconds per step, each the **median over the measured steps**
        (the same figures as the notebook's table). Upper bar of a variant:
        median compute plus median exposed input (the loop waiting),
        annotated with the median step and the exposed share of it. Lower
        bar: the median input work (preparation + copy), split into the part
        the loop waited for and the part hidden behind compute, annotated
        with the hidden share (``1 - exposed / work``, from the same medians).
        When the loop waited longer than the work itself, the whole work is
        drawn as exposed and the annotation says so.
    """
    fig, ax = subplots(figsize=(7.5, 1.2 + 0.9 * len(stats)), layout="constrained")
    labels, y = [], 0
    seen: set[str] = set()
    widest = max([(s.median_compute_s + s.median_exposed_s) * 1e3 for _, s in stats]
                 + [max(s.median_input_work_s, s.median_exposed_s) * 1e3 for _, s in stats] + [1e-9])

    def bar(row, left, value, color, name, **kw):
        if value <= 0:
            return left
        ax.barh(row, value, left=left, color=color, label=None if name in seen else name, **kw)
        seen.add(name)
        if value >= 0.06 * widest:  # a number only where it fits inside its bar
            ax.text(left + value / 2, row, f"{value:.1f}" if value < 10 else f"{value:.0f}", ha="center",
                    va="center", fontsize=7, color="black")
        return left + value

    right = 0.0
    for label, s in stats:
        compute = s.median_compute_s * 1e3
        exposed = s.median_exposed_s * 1e3
        work = s.median_input_work_s * 1e3
        left = bar(y, 0.0, compute, SPAN_COLORS["compute"], "compute")
        left = bar(y, left, exposed, SPAN_COLORS["data"], "loop waits for input (exposed)")
        ax.text(left, y, f"  step {s.median_step_s * 1e3:.1f} ms (compute {compute:.1f}): "
                f"{s.exposed_fraction:.0%} exposed", va="center", fontsize=7)
        right = max(right, left)
        left = bar(y + 1, 0.0, min(exposed, work), SPAN_COLORS["data"], "loop waits for input (exposed)")
        left = bar(y + 1, left, max(0.0, work - exposed), SPAN_COLORS["prep"],
                   "input work hidden behind compute", hatch="//", alpha=0.7)
        note = (f"  work {work:.1f} ms, exposed {exposed:.1f} ms: "
                + (f"{s.hidden_fraction:.0%} hidden" if exposed <= work
                   else f"0% hidden (waited {exposed / work:.2f}x the work)" if work > 0 else "no input work"))
        ax.text(left, y + 1, note, va="center", fontsize=7)
        right = max(right, left)
        labels += [f"{label}: step", f"{label}: input work"]
        y += 2
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, right * 1.6 if right > 0 else 1.0)  # room for the annotations
    ax.set_xlabel("ms per step (median over the measured steps)")
    fig.legend(loc="outside lower center", ncols=3, fontsize=8, frameon=False)
    ax.set_title(title or "Input work: exposed vs hidden behind compute (medians)")
    return fig


def pinning_sweep_figure(result):
    """Notebook 04's bandwidth against size (:func:`bandwidth_vs_size`) of a
    :class:`helpers.experiments.pinning.PinningResult`: the link's limit only where pinning applies, and the
    title says what was measured (only the host memcpy without an accelerator)."""
    app = result.applicability.applicable
    title = (f"Host-to-device bandwidth on {result.device}" if app
             else "No accelerator: only the host memcpy that pinning would cost")
    return bandwidth_vs_size(result.table, link=result.link if app else None, title=title)


def pinning_batch_figure(result):
    """Notebook 04's per-batch copy rates (:func:`batch_copy_rates`) of a
    :class:`helpers.experiments.pinning.PinningResult`, or None where no batch was copied (no device)."""
    rows = result.batch_rows
    if not len(rows):
        return None
    return batch_copy_rates(rows, link=result.link,
                            title=f"One batch ({result.size_text(result.batch_bytes)}) to {result.device.split()[0]}, "
                                  "per method")


def overlap_timeline_figure(result, *, max_steps: int = 6):
    """Notebook 05's timelines (:func:`overlap_timeline`) of a
    :class:`helpers.experiments.overlap.StreamOverlapResult`: *before* above *after*, the first ``max_steps``
    measured steps of each."""
    panels = [(f"{v.label}: input exposed for {v.stats.exposed_fraction:.0%} of the step", v.timeline(max_steps=max_steps))
              for v in (result.overlap.before, result.overlap.after)]
    return overlap_timeline(panels, title=f"Input vs compute on {result.device}, first measured steps")


def overlap_stats_figure(result):
    """Notebook 05's exposed and hidden input per variant (:func:`exposed_vs_hidden`) of a
    :class:`helpers.experiments.overlap.StreamOverlapResult`."""
    return exposed_vs_hidden([(v.label, v.stats) for v in result.overlap.variants],
                             title=f"Where the input work went, {result.settings['num_workers']} worker(s), on "
                                   f"{result.device}")
