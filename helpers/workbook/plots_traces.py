"""Figures of the trace report (``python -m helpers trace``): where each rank's step goes, as its profiler trace says.

Same conventions as :mod:`helpers.workbook.plots`: the function takes a DataFrame with documented columns and
returns a matplotlib figure; the phases notebook 01 times keep their colours
(:data:`helpers.workbook.plots.PHASE_COLORS`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING


from helpers.traces.model import DEVICE_PHASES, HOST_PHASES
from helpers.workbook.plots import PHASE_COLORS, subplots

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

#: One colour per phase of a trace: notebook 01's (data, h2d, compute) and the trace's own.
TRACE_PHASE_COLORS = {**PHASE_COLORS, "optimizer": "#e7298a", "comm_exposed": "#e6ab02", "idle": "#cccccc",
                      "rest": "#eeeeee"}
#: What each stacked segment is called in the legend.
_NAMES = {"data": "data (wait for batch)", "h2d": "h2d copy", "optimizer": "optimizer", "compute": "compute",
          "comm_exposed": "comm not overlapped", "idle": "device idle", "rest": "rest of step"}


def _num(v) -> float | None:
    return float(v) if v is not None and not (isinstance(v, float) and math.isnan(v)) else None


def rank_phases(medians: "pd.DataFrame", *, title: str = ""):
    """Stacked bars of each rank's median step: its host phases on one bar, its device phases on the next.

    Host and device phases overlap in time (the device computes while the host waits for the next batch), so each
    side has its own bar; each bar is filled to the median step with "rest of step" (time its phases do not
    account for; medians need not add up, so it is clipped at 0).

    Parameters
    ----------
    medians : pandas.DataFrame
        One row per rank (index = its label), columns ``step_s`` and any of :data:`helpers.traces.model.HOST_PHASES`
        and :data:`helpers.traces.model.DEVICE_PHASES`: median seconds per step; NaN or None where the trace does not
        measure the phase. A rank with no device phase gets no device bar.
    title : str

    Returns
    -------
    matplotlib.figure.Figure
    """
    bars: list[tuple[str, list[tuple[str, float]]]] = []
    for label, row in medians.iterrows():
        step_ms = (_num(row.get("step_s")) or 0.0) * 1e3
        for side, phases in (("host", HOST_PHASES), ("device", DEVICE_PHASES)):
            parts = [(p, _num(row.get(p)) * 1e3) for p in phases if _num(row.get(p)) is not None]
            if side == "device" and not parts:
                continue
            parts.append(("rest", max(0.0, step_ms - sum(w for _, w in parts))))
            bars.append((f"{label} · {side}", parts))
    fig, ax = subplots(figsize=(7.5, 1.6 + 0.42 * len(bars)), layout="constrained")
    seen: set[str] = set()
    for i, (_, parts) in enumerate(bars):
        left = 0.0
        total = sum(w for _, w in parts)
        for phase, w in parts:
            ax.barh(i, w, left=left, color=TRACE_PHASE_COLORS[phase], edgecolor="white", linewidth=0.5,
                    label=_NAMES[phase] if phase not in seen else None)
            seen.add(phase)
            if total > 0 and w / total > 0.12 and phase != "rest":
                ax.text(left + w / 2, i, f"{100 * w / total:.0f}%", ha="center", va="center", fontsize=7,
                        color="black" if phase in ("idle", "comm_exposed") else "white")
            left += w
    ax.set_yticks(range(len(bars)), [name for name, _ in bars], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("median time per step (ms)")
    handles, names = ax.get_legend_handles_labels()
    order = sorted(range(len(names)), key=lambda i: names[i] == _NAMES["rest"])  # "rest of step" last
    fig.legend([handles[i] for i in order], [names[i] for i in order], loc="outside lower center", fontsize=8,
               ncols=4, frameon=False)
    ax.set_title(title or "Where each rank's step goes (profiler trace)")
    return fig


def medians_frame(analysis) -> "pd.DataFrame":
    """The input of :func:`rank_phases` for a :class:`helpers.traces.analysis.TraceAnalysis`: one row per rank (index
    its label), a column per phase (``step_s`` and the phases of :mod:`helpers.traces.model`), median seconds per
    step, None where the trace does not measure it."""
    import pandas as pd

    return pd.DataFrame([r.medians() for r in analysis.ranks], index=[r.label for r in analysis.ranks])


def baseline_trace_figure(result):
    """Notebook 01's section 7: the median step per rank of the trace it read back (:func:`rank_phases`), or None
    without a trace (:class:`helpers.experiments.baseline.BaselineResult`)."""
    if result.trace is None:
        return None
    return rank_phases(medians_frame(result.trace), title="Median step per rank, from the trace")
