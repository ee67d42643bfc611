"""Figures of notebook 08 (collectives), in the style of :mod:`helpers.workbook.plots`.

Each function takes the tables that :mod:`helpers.comm.allreduce` and
:mod:`helpers.comm.ddp` return and gives back a matplotlib figure; save it
with :func:`helpers.workbook.plots.save_figure`.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from helpers.units import format_bytes
from helpers.workbook.plots import subplots

#: ColorBrewer Dark2, as plots.PHASE_COLORS.
COLORS = {"busbw": "#1b9e77", "algbw": "#d95f02", "regime": "#7570b3", "bar": "#66a61e"}


def allreduce_bandwidth(rows: Sequence[Mapping[str, Any]], regimes: Mapping[str, Any], *, title: str = "",
                        flagged: Sequence[int] = ()):
    """Log-log bus and algorithm bandwidth (GB/s) against message size, with the two regimes marked.

    Parameters
    ----------
    rows : sequence of dict
        :func:`helpers.comm.allreduce.summarize` rows (``bytes``, ``busbw_gbps``,
        ``algbw_gbps``, ``time_s``, ``time_p25_s``, ``time_p75_s``).
    regimes : dict
        :func:`helpers.comm.allreduce.regimes` of the same rows: the median
        small-message time, the plateau and the crossover size are drawn from it.
    flagged : sequence of int
        Sizes in bytes to mark as suspect (red rings), e.g. from
        :func:`helpers.comm.allreduce.flag_outliers`.

    Returns
    -------
    matplotlib.figure.Figure
    """
    rows = sorted(rows, key=lambda r: r["bytes"])
    x = [r["bytes"] for r in rows]
    fig, (ax, axt) = subplots(1, 2, figsize=(10, 3.8), layout="constrained")
    ax.loglog(x, [r["busbw_gbps"] for r in rows], "o-", color=COLORS["busbw"], label="busbw")
    ax.loglog(x, [r["algbw_gbps"] for r in rows], "s--", color=COLORS["algbw"], label="algbw", alpha=0.7)
    cross = regimes["crossover_bytes"]
    ax.axvline(cross, color=COLORS["regime"], lw=1, ls=":")
    ax.text(cross, ax.get_ylim()[0] * 1.5, f"  >= half of plateau\n  from {format_bytes(cross)}", fontsize=8,
            color=COLORS["regime"])
    ax.axhline(regimes["plateau_busbw_gbps"], color="#999999", lw=0.8, ls=":",
               label=f"plateau {regimes['plateau_busbw_gbps']:.2f} GB/s")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bandwidth (GB/s)")
    ax.set_title("bandwidth: latency-bound left, bandwidth-bound right", fontsize=9)
    ax.legend(fontsize=8)
    t = [r["time_s"] * 1e6 for r in rows]
    axt.loglog(x, t, "o-", color=COLORS["busbw"])
    axt.fill_between(x, [r["time_p25_s"] * 1e6 for r in rows], [r["time_p75_s"] * 1e6 for r in rows],
                     color=COLORS["busbw"], alpha=0.2, label="25th-75th percentile")
    bad = [r for r in rows if r["bytes"] in set(flagged)]
    if bad:
        for a, key, scale in ((ax, "busbw_gbps", 1.0), (axt, "time_s", 1e6)):
            a.plot([r["bytes"] for r in bad], [r[key] * scale for r in bad], "o", ms=11, mfc="none", mec="#e7298a",
                   mew=1.5, label=f"flagged ({len(bad)})" if a is axt else None, zorder=5)
    axt.axhline(regimes["small_time_s"] * 1e6, color=COLORS["regime"], lw=1, ls=":",
                label=f"median small-message time {regimes['small_time_s'] * 1e6:.0f} us")
    axt.set_xlabel("message size (bytes)")
    axt.set_ylabel("time per allreduce (us)")
    axt.set_title("time per allreduce", fontsize=9)
    axt.legend(fontsize=8)
    fig.suptitle(title or "Allreduce")
    return fig


def ddp_variants(buckets: Sequence[Mapping[str, Any]], hooks: Sequence[Mapping[str, Any]], *, title: str = ""):
    """Step time per bucket cap (with the number of buckets DDP made) and per compression hook.

    Parameters
    ----------
    buckets : sequence of dict
        :func:`helpers.experiments.collectives.run_ddp`'s ``buckets`` rows (``cap_mb``, ``n_buckets``, ``time_s``,
        ``time_p25_s``, ``time_p75_s``).
    hooks : sequence of dict
        :func:`helpers.experiments.collectives.run_ddp`'s ``hooks`` rows (``hook``, ``time_s``, quartiles).

    Returns
    -------
    matplotlib.figure.Figure
    """
    fig, (a, b) = subplots(1, 2, figsize=(10, 3.2), layout="constrained")

    def bars(ax, labels, rows):
        ms = [r["time_s"] * 1e3 for r in rows]
        err = [[(r["time_s"] - r["time_p25_s"]) * 1e3 for r in rows],
               [(r["time_p75_s"] - r["time_s"]) * 1e3 for r in rows]]
        ax.bar(labels, ms, yerr=err, color=COLORS["bar"], capsize=3)
        ax.set_ylabel("median step time (ms)")

    bars(a, [f"{r['cap_mb']:g} MB\n{r['n_buckets']} bucket(s)" for r in buckets], buckets)
    a.set_title("bucket_cap_mb (buckets DDP made)", fontsize=9)
    bars(b, [r["hook"] for r in hooks], hooks)
    b.set_title("gradient compression hook", fontsize=9)
    fig.suptitle(title or "DDP step time on the PPO workload (bars: 25th-75th percentile)")
    return fig


def allreduce_figure(result):
    """Notebook 08's allreduce curve (:func:`allreduce_bandwidth`) of a
    :class:`helpers.experiments.collectives.CollectivesResult`, its noisy sizes ringed; None without a sweep."""
    bench = result.bench
    if bench is None:
        return None
    plan = result.plan
    return allreduce_bandwidth(bench["sizes"], result.regimes,
                               title=f"Allreduce, {plan.backend}, {plan.world_size} ranks on {bench['device']} "
                                     "(rings: flagged sizes)",
                               flagged=[f["bytes"] for f in result.flags])


def ddp_figure(result):
    """Notebook 08's DDP step time per bucket cap and per hook (:func:`ddp_variants`) of a
    :class:`helpers.experiments.collectives.CollectivesResult`; None without DDP."""
    return None if result.ddp is None else ddp_variants(result.ddp["buckets"], result.ddp["hooks"])
