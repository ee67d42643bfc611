"""Figures of notebook 09 (memory and batch size).

Same conventions as :mod:`helpers.workbook.plots`: each function takes plain
data (frames from :mod:`helpers.compute.memory` and :mod:`helpers.experiments.memory`), returns a matplotlib figure,
and the notebook saves it with ``plots.save_figure(fig, ctx, name)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from matplotlib.ticker import FuncFormatter, MaxNLocator

from helpers.workbook.plots import subplots

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

ALLOC_COLOR = "#1b9e77"
RESERVED_COLOR = "#7570b3"
PEAK_COLOR = "#d95f02"
BUDGET_COLOR = "#e7298a"
STATUS_MARKERS = {"fits": "o", "over margin": "s", "over budget": "X", "oom": "X", "skipped": "x"}


def memory_per_step(frame: "pd.DataFrame", *, title: str = ""):
    """Memory after each training step (and the step's peak).

    Parameters
    ----------
    frame : pandas.DataFrame
        From :func:`helpers.compute.memory.trace_memory`. With ``source ==
        "device"``: allocated, reserved and peak (MiB) on the left axis,
        fragmentation on the right. With ``source == "process"`` (CPU): RSS,
        USS and the sampled peak RSS (MiB).
    title : str
    """
    fig, ax = subplots(figsize=(6.5, 3.4))
    steps = frame["step"].to_numpy()
    device = bool((frame["source"] == "device").all())
    if device:
        ax.plot(steps, frame["allocated_mib"], color=ALLOC_COLOR, marker=".", label="allocated")
        ax.plot(steps, frame["reserved_mib"], color=RESERVED_COLOR, marker=".", label="reserved")
        ax.plot(steps, frame["peak_mib"], color=PEAK_COLOR, linestyle="--", label="peak in step")
        ax2 = ax.twinx()
        ax2.plot(steps, frame["fragmentation"], color="grey", linewidth=0.8, label="fragmentation")
        ax2.set_ylim(0, 1)
        ax2.set_ylabel("fragmentation (1 - alloc/reserved)", fontsize=8)
    else:
        ax.plot(steps, frame["rss_mib"], color=RESERVED_COLOR, marker=".", label="process RSS")
        ax.plot(steps, frame["uss_mib"], color=ALLOC_COLOR, marker=".", label="process USS")
        ax.plot(steps, frame["peak_mib"], color=PEAK_COLOR, linestyle="--", label="peak RSS seen in step")
    ax.set_xlabel("training step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers: no 1.25, 1.5 ticks
    ax.set_ylabel("MiB")
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(title or ("device allocator memory per step" if device else "process memory per step (CPU)"))
    fig.tight_layout()
    return fig


def finder_curve(frame: "pd.DataFrame", *, budget_mib: float, limit_mib: float, chosen: int | None,
                 current: int | None = None, best: int | None = None, reached_max: bool = False,
                 title: str = "", memory_label: str = "peak memory"):
    """Throughput and peak memory against batch size, with the budget, the chosen, current and best sizes.

    The peak-memory axis is zoomed to the measured peaks: when the budget is
    far above them (more than 1.5x the largest), its lines would flatten the
    curve, so the budget is written in the panel instead of drawn. Legends sit
    to the right of the axes, off the data; the vertical lines are labelled
    there.

    Parameters
    ----------
    frame : pandas.DataFrame
        ``FinderResult.frame`` (columns batch, status, peak_mib, throughput,
        throughput_p25, throughput_p75).
    budget_mib, limit_mib : float
        The budget and the most a fitting size may use (budget minus margin), MiB.
    chosen : int or None
        The largest size that fitted (marked), if any.
    current : int or None
        The batch size in use now (marked), if any.
    best : int or None
        The size with the highest measured throughput (marked), if any.
    reached_max : bool, default False
        True when ``chosen`` is the search cap (every size fitted), so the
        label says "no limit found" instead of "largest that fits".
    title : str
    memory_label : str, default "peak memory"
        What ``peak_mib`` measures, for the axis and legend: on a CPU the
        finder records the process's sampled RSS growth, so pass "RSS growth".
    """
    f = frame.sort_values("batch")
    fig, (ax, ax2) = subplots(2, 1, figsize=(8.0, 5.4), sharex=True, layout="constrained")
    ran = f[f["throughput"].notna()]
    ax.plot(ran["batch"], ran["throughput"], color=ALLOC_COLOR, linewidth=1.2)
    for status, part in ran.groupby("status"):
        err = [part["throughput"] - part["throughput_p25"], part["throughput_p75"] - part["throughput"]]
        ax.errorbar(part["batch"], part["throughput"], yerr=err, fmt=STATUS_MARKERS.get(status, "o"),
                    color=ALLOC_COLOR if status == "fits" else PEAK_COLOR, label=status, capsize=3)
    ax.set_ylabel("samples/s\n(median, IQR)")
    ax.set_ylim(bottom=0)

    ax2.plot(ran["batch"], ran["peak_mib"], color=RESERVED_COLOR, linewidth=1.2)
    for status, part in ran.groupby("status"):
        ax2.plot(part["batch"], part["peak_mib"], linestyle="none", marker=STATUS_MARKERS.get(status, "o"),
                 color=RESERVED_COLOR if status == "fits" else PEAK_COLOR, label=f"{memory_label} ({status})")
    peaks = ran["peak_mib"].dropna()
    top = float(peaks.max()) if len(peaks) else 0.0
    if top > 0 and budget_mib > 1.5 * top:
        ax2.set_ylim(0, 1.2 * top)
        ax2.text(0.02, 0.95, f"budget {budget_mib:,.0f} MiB (fits below {limit_mib:,.0f} MiB) is off the scale: "
                 f"{budget_mib / top:.0f}x the largest {memory_label}", transform=ax2.transAxes, va="top", fontsize=8,
                 color=BUDGET_COLOR)
    else:
        ax2.axhline(budget_mib, color=BUDGET_COLOR, linestyle="-", label=f"budget {budget_mib:,.0f} MiB")
        ax2.axhline(limit_mib, color=BUDGET_COLOR, linestyle=":", label=f"budget - margin {limit_mib:,.0f} MiB")
        ax2.set_ylim(0, 1.1 * max(top, budget_mib))
    for b in f[f["status"].isin(["oom", "skipped"])]["batch"]:
        ax2.axvline(b, color=PEAK_COLOR, linewidth=0.8, linestyle="--")
    ax2.set_ylabel(f"{memory_label}, MiB")
    ax2.set_xlabel("batch size (samples)")
    ax2.set_xscale("log", base=2)
    ax2.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))

    marks = []
    if chosen is not None:
        lab = (f"largest tried {chosen} (no limit found)" if reached_max else f"largest that fits {chosen}")
        marks.append((chosen, dict(color="black", linewidth=1.0), lab))
    if current is not None:
        marks.append((current, dict(color="grey", linewidth=1.2, linestyle="-."), f"current {current}"))
    if best is not None:
        marks.append((best, dict(color=ALLOC_COLOR, linewidth=1.2, linestyle=":"), f"best throughput {best}"))
    for a in (ax, ax2):
        for b, style, lab in marks:
            a.axvline(b, label=lab if a is ax else None, **style)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    ax2.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    ax.set_title(title or f"batch-size finder: throughput and {memory_label} per size tried", fontsize=10)
    return fig


def trace_figure(result):
    """Notebook 09's memory per step (:func:`memory_per_step`) of a :class:`helpers.experiments.memory.MemoryResult`."""
    return memory_per_step(result.trace)


def finder_figure(result):
    """Notebook 09's batch-size finder (:func:`finder_curve`) of a :class:`helpers.experiments.memory.MemoryResult`:
    its sizes against the budget, with the chosen, current and throughput-best sizes."""
    found = result.found
    return finder_curve(found.frame, budget_mib=result.budget_bytes / 2**20, limit_mib=found.limit_bytes / 2**20,
                        chosen=found.chosen, current=result.batch_size, best=result.best,
                        reached_max=found.reached_max,
                        memory_label="RSS growth" if result.is_cpu else "peak memory")
