"""What one live measurement of a "try it" panel returns: a value with its spread, a label and a sentence.

A notebook's "try it" panel (helpers/workbook/panel.py) calls one of the experiment layer's ``try_*``
functions with the knobs a learner set, and draws and records each :class:`LivePoint` it gets back. The
functions time with the same code as the notebook (helpers.timing, the training loop's phase timing:
device-synchronized, warm-up excluded, repeated), so a live point and the notebook's own result compare
like with like. This module is the foundation both layers share; it imports nothing of the workbook.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

#: What a ``try_*`` function may call to report progress: ``progress(done, total)``, both counts of the
#: function's own units (steps, sizes, settings). The panel turns it into a progress bar.
Progress = Callable[[int, int], None]


def no_progress(done: int, total: int) -> None:
    """The progress callback of a headless run: does nothing."""


@dataclass(frozen=True)
class LivePoint:
    """One live measurement.

    Attributes
    ----------
    label : str
        The knob values it was measured at, short enough for a chart's axis, e.g. ``"num_workers=2, pf=2"``.
    value : float
        The metric's value (median), in ``unit``.
    unit : str
        E.g. ``"samples/s"``, ``"x"``, ``"GB/s"``, ``"fraction"``, ``"MiB"``.
    metric : str
        The record's metric name, in the field's terms (``"throughput"``, ``"speedup"``,
        ``"exposed_input_fraction"``, ``"bus_bandwidth"``, ``"peak_memory"``).
    low, high : float or None
        The spread around ``value`` in the same unit: an interquartile range or a bootstrap interval (the
        sentence says which); None when the measurement has none (a single reading, e.g. a peak).
    sentence : str
        One line for a learner: what was measured and what it means (a verdict label where one applies).
    extra : dict
        More fields for the record (knob values are added by the panel).
    repeats : int or None
        Timed repetitions (steps, calls) behind ``value``; None when not a repeated timing.
    interval : str
        What ``low``/``high`` are: ``"iqr"`` (the interquartile range of the repeats, the default) or ``"ci"``
        (a 95% bootstrap interval of a ratio, :meth:`from_comparison`). The record's spread is keyed as the
        workbook's other records are (``p25``/``p75``, ``ci_low``/``ci_high``/``confidence``), so the report
        shows it as an interval.
    """

    label: str
    value: float
    unit: str
    metric: str
    low: float | None = None
    high: float | None = None
    sentence: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)
    repeats: int | None = None
    interval: str = "iqr"

    def spread(self) -> dict[str, float] | None:
        """The record's spread: ``{"p25", "p75"}`` (IQR) or ``{"ci_low", "ci_high", "confidence"}`` (CI); None
        without one."""
        if self.low is None or self.high is None:
            return None
        if self.interval == "ci":
            return {"ci_low": float(self.low), "ci_high": float(self.high), "confidence": 0.95}
        return {"p25": float(self.low), "p75": float(self.high)}

    @classmethod
    def from_rate(cls, label: str, m: Any, *, unit: str, metric: str = "throughput", sentence: str = "",
                  **extra: Any) -> "LivePoint":
        """A throughput point from a :class:`helpers.timing.Measurement` with ``items_per_call``: its median
        rate and the rates at the quartiles of its times (IQR).

        Raises
        ------
        ValueError
            If the measurement has no rate (``items_per_call`` is None).
        """
        if m.rate is None:
            raise ValueError(f"{m.name}: a rate needs items_per_call; this measurement has none")
        low, high = sorted((m.rate_p25, m.rate_p75))
        return cls(label=label, value=float(m.rate), unit=unit, metric=metric, low=low, high=high,
                   sentence=sentence or f"{label}: {m.rate:,.0f} {unit} (IQR {low:,.0f}-{high:,.0f}, {m.repeats} repeats)",
                   extra=dict(extra), repeats=m.repeats)

    @classmethod
    def from_comparison(cls, label: str, c: Any, *, metric: str = "speedup", sentence: str = "",
                        **extra: Any) -> "LivePoint":
        """A speedup point from a :class:`helpers.timing.Comparison`: its ratio and bootstrap interval, in x."""
        return cls(label=label, value=float(c.ratio), unit="x", metric=metric, low=float(c.ci_low),
                   high=float(c.ci_high),
                   sentence=sentence or f"{label}: {c.ratio:.2f}x (95% CI {c.ci_low:.2f}-{c.ci_high:.2f})",
                   extra=dict(extra), repeats=min(c.a.repeats, c.b.repeats), interval="ci")


@dataclass(frozen=True)
class Knob:
    """A dropdown knob of a "try it" panel, as plain data: its options, its initial value and its label.

    The experiment layer declares its panel's knobs with these (and with ``ipywidgets.interact``'s plain
    abbreviations: ``(min, max, step)``, a list of options, a value), never with widgets; the panel
    (helpers/workbook/panel.py) makes the widget.

    Attributes
    ----------
    options : tuple of (label, value)
        The choices, in order.
    value : object
        The initial choice (one of the options' values).
    description : str
        The label beside the dropdown (empty: the knob's name).
    """

    options: tuple[tuple[str, Any], ...]
    value: Any
    description: str = ""

    def __post_init__(self) -> None:
        if not self.options or self.value not in [v for _, v in self.options]:
            raise ValueError(f"Knob: value {self.value!r} is not one of the options' values "
                             f"{[v for _, v in self.options]!r}")


@dataclass(frozen=True)
class TrySpec:
    """What a notebook's "try it" panel measures, declared by the experiment's result (``result.try_it(...)``).

    Attributes
    ----------
    title : str
        The panel's title, e.g. ``"host-to-device copy at another size and method"``.
    measure : callable
        ``measure(progress=callback, **knob_values)`` returning a :class:`LivePoint` or yielding several.
    knobs : mapping
        Knob name -> :class:`Knob` or an ``ipywidgets.interact`` abbreviation.
    reference : LivePoint or None
        The notebook's own result at its parameters, drawn beside the live points.
    unavailable : str
        Non-empty: why this machine cannot measure it (the panel shows the knobs disabled with the reason).
    """

    title: str
    measure: Callable[..., Any]
    knobs: Mapping[str, Any]
    reference: LivePoint | None = None
    unavailable: str = ""
