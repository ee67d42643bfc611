"""Figures of the workbook (matplotlib), saved where the report finds them.

Every figure a notebook draws is saved as ``<out_dir>/figures/<notebook>__<name>.png``;
the report embeds the figures of each notebook in its section, in the order the notebook saves them.
In a notebook the same PNG is shown with alternative text (:func:`show_png`), which the executed notebook's web
page carries (:func:`helpers.workbook.nbexec.export_html`).
Plot functions take DataFrames with documented columns and return the figure.
"""

from __future__ import annotations

import io
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib.pyplot as plt

from helpers.fsutil import write_atomic

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

PHASE_COLORS = {
    "data": "#d95f02",      # waiting for the input pipeline
    "h2d": "#7570b3",       # host-to-device copy
    "compute": "#1b9e77",   # forward, backward, optimizer on the device
    "other": "#999999",
}


def subplots(nrows: int = 1, ncols: int = 1, *, figsize: "tuple[float, float] | None" = None,
             layout: str | None = None, **kwargs):
    """A figure and its axes, as :func:`matplotlib.pyplot.subplots` makes them, but a figure pyplot does not hold.

    Every figure of the workbook is made here. In JupyterLab 4.4 and later a widget's comm messages go to a kernel
    subshell (the ``commsOverSubshells`` setting, "perCommTarget" by default), a thread of its own in ipykernel 7;
    ``comm`` fires IPython's ``post_execute`` event after each such message, and matplotlib-inline's
    ``flush_figures`` then renders every figure pyplot holds and closes them all, in that thread. A pyplot figure
    drawn by the main thread (a cell, or a "try it" panel's Measure handler) while the subshell handled another
    widget message was rendered from two threads at once: a Try it chart came out holding only its title, or white
    (issue 42; 3 of 12 browser runs beside two busy loops). A figure made with :class:`matplotlib.figure.Figure` is
    never in pyplot's list, so no other thread draws or closes it.

    Parameters
    ----------
    nrows, ncols : int
        The grid of axes.
    figsize : (float, float), optional
        Width and height in inches; None: matplotlib's ``figure.figsize``.
    layout : str, optional
        As :class:`matplotlib.figure.Figure` takes it ("constrained", "tight"); None: none.
    **kwargs
        As :meth:`matplotlib.figure.Figure.subplots` takes them (``sharex``, ``squeeze``, ``height_ratios``, ...).

    Returns
    -------
    (matplotlib.figure.Figure, Axes or numpy.ndarray of Axes)
        As :func:`matplotlib.pyplot.subplots` returns them.
    """
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout=layout)
    return fig, fig.subplots(nrows, ncols, **kwargs)


def figure_path(out_dir: Path, notebook: str, name: str) -> Path:
    """Return the file a figure of ``notebook`` called ``name`` is saved to."""
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in name)
    return Path(out_dir) / "figures" / f"{notebook}__{safe}.png"


def save_figure(fig, ctx, name: str, *, dpi: int = 100, alt: str | None = None) -> Path:
    """Save ``fig`` as PNG for the report and remember it in ``ctx.figures``; in a notebook, also show it.

    In a Jupyter kernel the saved PNG is displayed with alternative text (:func:`show_png`), and a figure pyplot
    holds (one made with ``plt.subplots``, not :func:`subplots`) is closed, so that the inline backend does not draw
    it a second time, without that text. Elsewhere (a script, a test) nothing is displayed and the figure stays
    open.

    Parameters
    ----------
    fig : matplotlib.figure.Figure
    ctx : helpers.workbook.nbsetup.NotebookContext
    name : str
        Short name, unique within the notebook (e.g. "phase_breakdown").
    dpi : int
        Resolution; modest by default to keep notebooks and reports small.
    alt : str or None
        Alternative text for the displayed figure; None: :func:`figure_alt` (its titles and axis labels).

    Returns
    -------
    pathlib.Path
        The PNG written.
    """
    path = figure_path(ctx.out_dir, ctx.notebook, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    png, renders = render_png(fig, dpi=dpi)
    if blank_png(png):
        import warnings

        warnings.warn(f"the figure {name!r} came out blank {renders} times; its numbers are in the cell's text and "
                      "in results.jsonl", RuntimeWarning, stacklevel=2)
    write_atomic(path, png)  # a full disk leaves the previous figure, never a truncated PNG
    ctx.figures.append(path)
    if _in_kernel():
        show_png(png, alt or figure_alt(fig, fallback=name.replace("_", " ")))
        plt.close(fig)
    return path


#: Renders of a figure tried before a blank one is kept (and said). A white PNG of the figure's own size, nothing
#: drawn, came out of a "try it" chart's render in JupyterLab on a busy 2-core machine (issue 42); the next render
#: of the same chart was right. Its cause, another thread rendering the same pyplot figure, is gone (:func:`subplots`);
#: the check stays, so that a blank figure is never shown silently.
RENDERS = 3


def render_png(fig, *, dpi: int = 100) -> tuple[bytes, int]:
    """``fig`` as PNG bytes (tight bounding box), rendered again while a render comes out blank (:func:`blank_png`).

    Parameters
    ----------
    fig : matplotlib.figure.Figure
    dpi : int
        Resolution, dots per inch.

    Returns
    -------
    (bytes, int)
        The PNG (the last render, blank only if all :data:`RENDERS` were) and the number of renders it took.
    """
    for renders in range(1, RENDERS + 1):
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
        if not blank_png(buf.getvalue()):
            break
    return buf.getvalue(), renders


def _in_kernel() -> bool:
    """True inside a Jupyter kernel (a notebook run by JupyterLab, papermill or nbval)."""
    import sys

    if "IPython" not in sys.modules:  # nothing imported IPython: no kernel (and no cost to find that out)
        return False
    from IPython import get_ipython

    return getattr(get_ipython(), "kernel", None) is not None


def figure_alt(fig, *, fallback: str = "") -> str:
    """Alternative text for ``fig``, in words: its title, then each plot's title and axis labels.

    Parameters
    ----------
    fig : matplotlib.figure.Figure
    fallback : str
        What the figure shows, used when it has no title and no axis label.

    Returns
    -------
    str
        E.g. "Chart: Baseline step on cpu: median per phase (x axis: median time per step (ms))".
    """
    panels = []
    for ax in fig.axes:
        title = " ".join(t for t in (ax.get_title("left"), ax.get_title(), ax.get_title("right")) if t)
        axes = "; ".join(f"{which} axis: {label}" for which, label in (("x", ax.get_xlabel()),
                                                                       ("y", ax.get_ylabel())) if label)
        if title or axes:
            panels.append(f"{title} ({axes})" if title and axes else title or axes)
    words = [fig.get_suptitle()] + panels
    text = "; ".join(" ".join(w.split()) for w in words if w and w.strip())
    return f"Chart: {text or fallback or 'a figure of this notebook'}"


def show_png(png: bytes, alt: str) -> None:
    """Display a PNG in the notebook with alternative text ``alt``.

    The text goes in the output's metadata (``{"image/png": {"alt": alt}}``), where nbconvert's templates read it
    (its ``classic`` template directly, the ``lab`` one through :func:`helpers.workbook.nbexec.export_html`).
    """
    from IPython.display import Image, display

    display(Image(data=png, format="png", metadata={"alt": alt}))


def blank_png(png: bytes) -> bool:
    """Whether a PNG's pixels are all one colour (a chart that drew nothing: no axes, no text, no bars).

    Parameters
    ----------
    png : bytes
        A PNG file's bytes (any mode Pillow reads).

    Raises
    ------
    PIL.UnidentifiedImageError
        If ``png`` is not an image.
    """
    from PIL import Image

    with Image.open(io.BytesIO(png)) as im:
        return all(low == high for low, high in im.convert("RGBA").getextrema())


def phase_breakdown(totals: "pd.DataFrame", phases=("data", "h2d", "compute"), *, title: str = ""):
    """Stacked bar of where a step's time goes, one bar per variant.

    Parameters
    ----------
    totals : pandas.DataFrame
        One row per variant (index = variant label), one column per phase,
        values = median seconds per step.
    phases : sequence of str
        Columns to stack, bottom to top.

    Returns
    -------
    matplotlib.figure.Figure
    """
    fig, ax = subplots(figsize=(6.5, 1.5 + 0.6 * len(totals)), layout="constrained")
    left = [0.0] * len(totals)
    labels = [str(i) for i in totals.index]
    for phase in phases:
        if phase not in totals:
            continue
        ms = (totals[phase] * 1e3).tolist()
        ax.barh(labels, ms, left=left, color=PHASE_COLORS.get(phase, None), label=phase)
        for i, (l0, w) in enumerate(zip(left, ms)):
            total = sum(totals.iloc[i][p] for p in phases if p in totals) * 1e3
            if total > 0 and w / total > 0.08:
                ax.text(l0 + w / 2, i, f"{phase}\n{100 * w / total:.0f}%", ha="center", va="center",
                        fontsize=8, color="white")
        left = [a + b for a, b in zip(left, ms)]
    ax.set_xlabel("median time per step (ms)")
    fig.legend(loc="outside lower center", fontsize=8, ncols=len(phases), frameon=False)
    ax.invert_yaxis()
    ax.set_title(title or "Where a training step's time goes")
    return fig


def step_timeline(frame: "pd.DataFrame", *, max_steps: int = 12, title: str = ""):
    """Gantt-style timeline of phases per step.

    Parameters
    ----------
    frame : pandas.DataFrame
        Columns ``step`` (int), ``phase`` (str), ``start_s`` and ``duration_s``
        (seconds), as returned by :meth:`helpers.timing.PhaseTimer.frame`.
    max_steps : int
        Show at most the first ``max_steps`` steps present in ``frame``.

    Returns
    -------
    matplotlib.figure.Figure
    """
    steps = sorted(frame["step"].unique())[:max_steps]
    sub = frame[frame["step"].isin(steps)]
    t0 = float(sub["start_s"].min()) if len(sub) else 0.0
    phases = [p for p in PHASE_COLORS if p in set(sub["phase"])] + \
        sorted(set(sub["phase"]) - set(PHASE_COLORS))
    fig, ax = subplots(figsize=(8, 0.5 + 0.45 * len(phases)))
    for row, phase in enumerate(phases):
        part = sub[sub["phase"] == phase]
        spans = [((s - t0) * 1e3, d * 1e3) for s, d in zip(part["start_s"], part["duration_s"])]
        ax.broken_barh(spans, (row - 0.4, 0.8), color=PHASE_COLORS.get(phase, "#666666"))
    ax.set_yticks(range(len(phases)), phases)
    ax.invert_yaxis()
    ax.set_xlabel("time since the first measured step (ms)")
    ax.set_title(title or f"Per-step timeline ({len(steps)} steps)")
    fig.tight_layout()
    return fig


def distribution(values_ms, *, xlabel: str, title: str = ""):
    """Histogram of per-item times with the median marked.

    Parameters
    ----------
    values_ms : sequence of float
        Times in milliseconds.
    """
    import numpy as np

    v = np.asarray(values_ms, dtype=float)
    fig, ax = subplots(figsize=(6, 2.8))
    ax.hist(v, bins=min(30, max(5, len(v) // 3)), color="#d95f02", alpha=0.8)
    med = float(np.median(v))
    ax.axvline(med, color="black", linestyle="--", label=f"median {med:.1f} ms")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("count")
    ax.legend(fontsize=8)
    ax.set_title(title)
    fig.tight_layout()
    return fig


#: Live points a "try it" chart draws at most (the latest ones).
LIVE_POINTS_SHOWN = 12


def live_points(reference, points, *, title: str = ""):
    """Bar chart of a "try it" panel: the notebook's own result, then each live point, with their spreads.

    Parameters
    ----------
    reference : helpers.live.LivePoint or None
        The notebook's result, drawn first in grey and as a dashed line across the chart.
    points : sequence of (helpers.live.LivePoint, bool)
        Live points in the order measured, each with whether the machine was busy over it (drawn hatched); the
        last :data:`LIVE_POINTS_SHOWN` are drawn (all stay in the panel's log and the results).
    title : str

    Returns
    -------
    matplotlib.figure.Figure
        Empty of bars (with a hint) when there is nothing to draw yet.
    """
    points = list(points)
    if len(points) > LIVE_POINTS_SHOWN:
        title = f"{title} (latest {LIVE_POINTS_SHOWN} of {len(points)} points; all are in the log)"
        points = points[-LIVE_POINTS_SHOWN:]
    bars = ([(reference, False, True)] if reference is not None else []) + [(p, busy, False) for p, busy in points]
    fig, ax = subplots(figsize=(max(5.0, 1.0 + 0.9 * len(bars)), 3.2))
    if not bars:
        ax.text(0.5, 0.5, "press Measure", ha="center", va="center", transform=ax.transAxes, color="#666666")
        ax.set_axis_off()
        return fig
    unit = bars[0][0].unit
    for i, (p, busy, is_ref) in enumerate(bars):
        yerr = None
        if p.low is not None and p.high is not None:
            yerr = [[max(p.value - p.low, 0.0)], [max(p.high - p.value, 0.0)]]
        ax.bar(i, p.value, color="#bbbbbb" if is_ref else "#1b9e77", hatch="//" if busy else None,
               edgecolor="#444444", yerr=yerr, capsize=4)
    if reference is not None:
        ax.axhline(reference.value, color="#666666", linestyle="--", linewidth=1)
    labels = [textwrap.fill(("notebook: " if is_ref else "") + p.label, 16) for p, _, is_ref in bars]
    ax.set_xticks(range(len(bars)), labels, fontsize=7 if len(bars) > 6 else 8)
    name = bars[0][0].metric.replace("_", " ")
    ax.set_ylabel(name if unit == "fraction" else f"{name} ({unit})")
    ax.set_title(title)
    fig.tight_layout()
    return fig


# -- notebook 01's figures, from its result (helpers.experiments.baseline.BaselineResult) -------------------

def baseline_per_image_figure(result):
    """Notebook 01's per-image preprocessing times (:func:`distribution`), or None for a user's job (its dataset
    is timed only as the data phase)."""
    if result.per_image is None:
        return None
    return distribution(result.per_image_ms(), xlabel="baseline preprocessing time per image (ms)",
                        title="Per-image cost: decode + crop + resize + normalize + tokenize")


def baseline_phase_figure(result):
    """Notebook 01's median step split into its phases (:func:`phase_breakdown`)."""
    return phase_breakdown(result.phase_totals(), title=f"Baseline step on {result.device_kind}: median per phase")


def baseline_timeline_figure(result, *, max_steps: int = 8):
    """Notebook 01's first ``max_steps`` measured steps, phase by phase (:func:`step_timeline`)."""
    return step_timeline(result.run.phases, max_steps=max_steps,
                         title=f"Baseline: input exposed for {result.run.exposed_fraction:.0%} of each step")
