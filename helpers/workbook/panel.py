"""The "try it" panels: a notebook's mechanism re-measured live, with the knobs a learner turns.

``try_it(ctx, "DataLoader", measure, reference=point, num_workers=[0, 1, 2], ...)`` shows, in JupyterLab:

- the knobs (ipywidgets controls or their abbreviations, as ``ipywidgets.interact`` takes them) and a
  **Measure** button (``ipywidgets.interactive`` in manual mode: the button is disabled while it measures);
- a progress bar fed by the measurement's own ``progress(done, total)`` calls (steps, sizes, settings);
- a chart (an ``ipywidgets.HTML`` holding the PNG inline, redrawn by setting its value) that grows by one bar
  per point as points arrive, beside the notebook's own result (``reference``);
- under it, one line per point with the machine's state over that point (quiet or busy: a point measured while
  other processes took more than ``busy_cpu_share`` of the cores is drawn hatched and says so).

``measure(**knobs)`` is one of the experiment layer's ``try_*`` functions: it times with the notebook's own
code and returns a :class:`helpers.live.LivePoint`, or yields several (a sweep). Every point is appended to the
run's results as an ``experiment="try it"`` record with the knob values, the machine state, the torch
threads it ran with and ``interactive=True``, so nothing measured live is lost. Kernel > Interrupt stops a
measurement: the points that finished are kept (drawn and recorded), the panel says how many.

Headless (the runner, CI, or ``WORKBOOK_HEADLESS=1``: :func:`helpers.params.headless`) the panel measures once at the
knobs' initial values (those ``ipywidgets.interact`` would start at, see :func:`helpers.workbook.widgets._initial`),
prints the point, records it with ``interactive=False`` and shows the chart as a static figure, so its code path
runs in every test of the notebook and no widget state is left in the executed notebook.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from helpers import machine
from helpers.conditions import ran_with
from helpers.errors import ParameterError
from helpers.live import Knob, LivePoint, TrySpec, no_progress
from helpers.params import headless
from helpers.workbook.output import expected_warnings
from helpers.workbook.widgets import _initial

#: The record's experiment name for every live point.
EXPERIMENT = "try it"


@dataclass
class PanelPoint:
    """A live point as the panel keeps it: the point, the knob values and the machine check over it."""

    point: LivePoint
    knobs: dict
    check: Any  # helpers.machine.BusyCheck
    seconds: float
    torch_threads: int | None = None  # torch's intra-op threads when the measurement started

    def line(self) -> str:
        """``"<sentence> [quiet|busy: ...] (N s)"``, one line of the panel's log."""
        state = "machine busy, treat as noise" if self.check.busy else "machine quiet"
        return f"{self.point.sentence or self.point.label} [{state}; {self.seconds:.1f} s]"


@dataclass
class TryIt:
    """A "try it" panel (see the module docstring); build it with :func:`try_it`.

    Attributes
    ----------
    name : str
        The panel's title, e.g. "DataLoader settings".
    points : list of PanelPoint
        Every point measured so far, in order (headless: the one at the initial values).
    reference : LivePoint or None
        The notebook's own result, drawn first.
    unavailable : str
        Why the panel cannot measure on this machine ("" when it can).
    """

    ctx: Any
    name: str
    measure: Callable[..., Any]
    knobs: dict
    reference: LivePoint | None = None
    unavailable: str = ""
    points: list = field(default_factory=list)
    _widgets: dict = field(default_factory=dict, repr=False)

    # -- measuring ---------------------------------------------------------------------------------------------
    def _threshold(self) -> float:
        return float(self.ctx.params.get("busy_cpu_share") or machine.MAX_OTHER_CPU_SHARE)

    def _points(self, values: dict, progress) -> Iterable[LivePoint]:
        kwargs = dict(values)
        if "progress" in inspect.signature(self.measure).parameters:
            kwargs["progress"] = progress
        out = self.measure(**kwargs)
        if isinstance(out, LivePoint):
            return [out]
        if out is None:
            raise ParameterError(f"try it ({self.name}): the measurement returned nothing; a try_* function "
                                 "returns a LivePoint or yields LivePoints")
        return out

    def run(self, values: dict, *, progress=no_progress, on_point: Callable[[PanelPoint], None] | None = None
            ) -> list[PanelPoint]:
        """Measure at ``values``, record each point as it arrives, and return the new points.

        A KeyboardInterrupt (Kernel > Interrupt) propagates after the points that finished have been recorded.

        Raises
        ------
        helpers.errors.ParameterError
            If the panel is unavailable here, or the measurement returned nothing.
        """
        if self.unavailable:
            raise ParameterError(f"try it ({self.name}) cannot measure here: {self.unavailable}")
        new: list[PanelPoint] = []
        threads = ran_with(None)["torch_threads"]  # the reference ran at the notebook's; the record says this one's
        before, t0 = machine.snapshot(), time.perf_counter()
        for point in self._points(values, progress):
            after, t1 = machine.snapshot(), time.perf_counter()
            check = machine.check(before, after, max_other_cpu_share=self._threshold())
            pp = PanelPoint(point=point, knobs=dict(values), check=check, seconds=t1 - t0, torch_threads=threads)
            self._record(pp)
            self.points.append(pp)
            new.append(pp)
            if on_point is not None:
                on_point(pp)
            before, t0 = after, t1
        return new

    def _record(self, pp: PanelPoint) -> None:
        p = pp.point
        extra = dict(p.extra)
        extra_repeats = extra.pop("repeats", None)  # some points carry it in extra; the record has a field
        repeats = p.repeats if p.repeats is not None else extra_repeats
        self.ctx.store.add(EXPERIMENT, p.label, p.metric, p.value, p.unit, repeats=repeats, spread=p.spread(),
                           panel=self.name, knobs={k: v for k, v in pp.knobs.items()}, interactive=not headless(),
                           busy=pp.check.busy, other_cpu_share=pp.check.other_cpu_share, sentence=p.sentence,
                           **{"torch_threads": pp.torch_threads, **extra})  # a point that says its own wins

    # -- drawing -----------------------------------------------------------------------------------------------
    def figure(self):
        """The chart: the notebook's own result and every live point, with their spreads (matplotlib Figure)."""
        from helpers.workbook.plots import live_points

        return live_points(self.reference, [(pp.point, pp.check.busy) for pp in self.points],
                           title=f"Try it: {self.name}")

    def _render(self) -> tuple[bytes, str, int]:
        """The chart as PNG bytes, its alternative text and the renders it took (more than one where a render came
        out blank: :func:`helpers.workbook.plots.render_png`)."""
        from helpers.workbook.plots import figure_alt, render_png

        fig = self.figure()  # pyplot does not hold it (plots.subplots): nothing to close, no other thread draws it
        png, renders = render_png(fig)  # rendered here, not by the inline backend's formatter: the same PNG everywhere
        return png, figure_alt(fig, fallback=f"Try it: {self.name}"), renders

    def _draw(self) -> None:
        from helpers.workbook.plots import RENDERS, blank_png, show_png

        png, alt, renders = self._render()
        blank = blank_png(png)
        chart = self._widgets.get("chart")
        if chart is None:
            show_png(png, alt)
        else:
            # The chart is an HTML widget's value, an <img> with the PNG inline: widget state set in one message,
            # nothing routed through an Output widget, saved with the notebook as a string. Drawing into an Output
            # (clear_output(wait=True), then display) from inside the log's own Output context left the chart
            # blank in 3 of 6 presses on a busy machine: the two widgets' output captures raced. An Image widget
            # (binary state) drew, but did not restore from a saved notebook.
            chart.value = chart_html(png, alt)
        if blank or renders > 1:  # said, never shown silently: a white chart under a right log line misleads
            import matplotlib

            note = (f"the chart came out blank {RENDERS} times (matplotlib {matplotlib.__version__}, backend "
                    f"{matplotlib.get_backend()}); every point is in the log above and in results.jsonl" if blank
                    else f"the chart came out blank and was drawn again ({renders} renders)")
            log = self._widgets.get("log")
            if log is None:
                print(f"try it ({self.name}): {note}")
            else:
                with log:
                    print(note)

    # -- showing -----------------------------------------------------------------------------------------------
    def show(self) -> "TryIt":
        """Headless: measure once at the initial values, print, record and draw. Interactive: display the panel."""
        if headless():
            if self.unavailable:
                print(f"try it ({self.name}): not available here: {self.unavailable}")
                return self
            values = {k: _initial(v) for k, v in self.knobs.items()}
            for pp in self.run(values):
                print(f"try it: {pp.line()}")
            self._draw()
            return self
        self._display()
        return self

    def _display(self) -> None:
        import ipywidgets as w
        from IPython.display import display

        progress = w.IntProgress(value=0, min=0, max=1, description="", bar_style="info",
                                 layout=w.Layout(width="320px", visibility="hidden"))
        status = w.HTML(value=(f"<i>not available here: {self.unavailable}</i>" if self.unavailable else
                               "Set the knobs and press <b>Measure</b>; Kernel &gt; Interrupt stops it and keeps "
                               "what finished."))
        chart = w.HTML(value="")
        log = w.Output()
        self._widgets.update(progress=progress, status=status, chart=chart, log=log)

        def report(done: int, total: int) -> None:
            progress.max = max(int(total), 1)
            progress.value = min(int(done), progress.max)

        def on_point(pp: PanelPoint) -> None:
            with log:
                print(pp.line())
            self._draw()

        def measure(**values):
            progress.layout.visibility = "visible"
            progress.value, progress.bar_style = 0, "info"
            status.value = "measuring ..."
            n0 = len(self.points)
            try:
                # a warning the chosen knobs cause (more workers than cores, few repeats) goes to the panel's log
                # beside its point, not into a red box above the panel that outlives the next measurement
                with log, expected_warnings("raised while measuring at these settings"):
                    self.run(values, progress=report, on_point=on_point)
                status.value = f"done: {len(self.points) - n0} new point(s), {len(self.points)} in all, recorded"
                progress.bar_style = "success"
            except KeyboardInterrupt:
                status.value = (f"interrupted: kept the {len(self.points) - n0} point(s) that finished "
                                f"({len(self.points)} in all, recorded)")
                progress.bar_style = "warning"
            except Exception as exc:  # a knob combination the mechanism refuses: say so, keep the earlier points
                status.value = f"<b>could not measure:</b> {type(exc).__name__}: {exc}"
                progress.bar_style = "danger"

        knobs = {k: (w.Dropdown(options=list(v.options), value=v.value, description=v.description or k)
                     if isinstance(v, Knob) else v) for k, v in self.knobs.items()}
        inter = w.interactive(measure, {"manual": True, "manual_name": "Measure"}, **knobs)
        for c in inter.kwargs_widgets:  # the knob's whole name beside it, not "num_work..."
            if hasattr(c, "style") and hasattr(c.style, "description_width"):
                c.style.description_width = "initial"
        if self.unavailable:
            inter.manual_button.disabled = True
            for c in inter.kwargs_widgets:
                c.disabled = True
            inter.manual_button.on_click(lambda *_: None)
        self._widgets["interactive"] = inter
        for widget, css in ((status, "status"), (chart, "chart"), (log, "log")):
            widget.add_class(f"workbook-try-it-{css}")  # stable hooks for the browser test and for styling
        box = w.VBox([w.HTML(f"<b>Try it: {self.name}</b>"), inter, w.HBox([progress, status]), chart, log])
        box.add_class("workbook-try-it")
        display(box)
        self._draw()


def chart_html(png: bytes, alt: str) -> str:
    """``<img>`` markup showing ``png`` inline (a data URI) at its own size, never wider than the panel.

    Parameters
    ----------
    png : bytes
        A PNG file's bytes.
    alt : str
        Alternative text (escaped here).
    """
    import base64
    import html
    import struct

    width = struct.unpack(">I", png[16:20])[0] if png[12:16] == b"IHDR" else None  # the PNG header's width, px
    size = f' width="{width}"' if width else ""
    data = base64.b64encode(png).decode("ascii")
    return (f'<img src="data:image/png;base64,{data}" alt="{html.escape(alt)}" title="{html.escape(alt)}"{size} '
            'style="max-width: 100%; height: auto">')


def try_it(ctx: Any, name: "str | TrySpec", measure: Callable[..., Any] | None = None, *,
           reference: LivePoint | None = None, unavailable: str = "", **knobs: Any) -> TryIt:
    """Show a "try it" panel (module docstring) and return it.

    ``try_it(ctx, spec)`` with a :class:`helpers.live.TrySpec` (what an experiment's ``result.try_it(...)``
    returns) is the same as passing its fields.

    Parameters
    ----------
    ctx : helpers.workbook.nbsetup.NotebookContext
        The notebook's context: its results store and parameters (``busy_cpu_share``).
    name : str or helpers.live.TrySpec
        Title of the panel, or the whole panel.
    measure : callable
        ``measure(**knob_values[, progress=callback])`` returning a LivePoint or yielding LivePoints.
    reference : LivePoint, optional
        The notebook's own result at its parameters, drawn beside the live points.
    unavailable : str
        Non-empty: why this machine cannot measure it (e.g. pinned memory on a CPU); the panel shows the knobs
        disabled with the reason, and headless it prints the reason and measures nothing.
    **knobs
        ipywidgets controls or abbreviations (``(min, max, step)``, a list of options, a value).

    Returns
    -------
    TryIt
        Headless, with ``points`` holding the one measurement at the initial values.

    Raises
    ------
    helpers.errors.ParameterError
        For no knobs, or (headless) a slider abbreviation ipywidgets would reject.
    """
    if isinstance(name, TrySpec):
        if measure is not None or knobs or reference is not None or unavailable:
            raise ParameterError("try_it(ctx, spec): the spec holds the measure, knobs, reference and "
                                 "unavailable reason; pass nothing else")
        spec = name
        name, measure, knobs = spec.title, spec.measure, dict(spec.knobs)
        reference, unavailable = spec.reference, spec.unavailable
    if measure is None:
        raise ParameterError(f"try it ({name}): no measure function")
    if not knobs:
        raise ParameterError(f"try it ({name}): a panel needs at least one knob")
    return TryIt(ctx=ctx, name=name, measure=measure, knobs=dict(knobs), reference=reference,
                 unavailable=unavailable).show()
