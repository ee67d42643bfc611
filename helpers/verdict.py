"""The Verdict type: what a notebook decides, as fields that the report and notebook 10 read.

Every verdict function of the workbook returns a :class:`Verdict`; the
notebook records it with :meth:`helpers.results.ResultsStore.add_verdict`.
The decision itself is in :attr:`Verdict.action` (which setting to apply and
its value), so nothing downstream has to parse the reason's wording.

Part of the foundation: imports only :mod:`helpers.errors` and :mod:`helpers.units`.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from helpers.errors import ParameterError
from helpers.units import format_interval, format_value

__all__ = ["Action", "HEADLINE_CHARS", "RECOMMENDATIONS", "Verdict", "detail_lines", "reason_clauses",
           "split_outside_brackets"]

#: The recommendations a verdict may make. "enable" / "leave off" decide a setting; "not applicable" says the
#: machine cannot do it; notebook 01 calls the job "host-bound", "balanced", "device-bound"
#: or "communication-bound" (helpers.bottleneck.LABELS); "inconclusive" replaces any of them when the machine was too busy while
#: measuring for the figures to be trusted (helpers.machine).
RECOMMENDATIONS: tuple[str, ...] = ("enable", "leave off", "not applicable", "host-bound", "balanced",
                                    "device-bound", "communication-bound", "inconclusive")


#: The longest first line of a printed verdict: what to do, the number and its interval. A reader scans the first
#: line of each verdict, as a compiler's diagnostic or HTA's summary leads with one; the evidence follows below.
HEADLINE_CHARS = 120

#: What to do, for a label that decides no setting itself (notebook 01's and a trace's).
_LABEL_ADVICE = {
    "host-bound": "speed up the input first",
    "balanced": "speed up the compute first, then the host side",
    "device-bound": "speed up the compute first",
    "communication-bound": "overlap or shrink the communication first",
}


def split_outside_brackets(text: str, sep: str) -> list[str]:
    """Split ``text`` at ``sep`` (one or more characters) where it is outside parentheses and brackets."""
    parts, depth, cur, i = [], 0, [], 0
    while i < len(text):
        ch = text[i]
        depth += ch in "(["
        depth = max(0, depth - (ch in ")]"))
        if depth == 0 and text.startswith(sep, i):
            parts.append("".join(cur))
            cur, i = [], i + len(sep)
            continue
        cur.append(ch)
        i += 1
    parts.append("".join(cur))
    return parts


def reason_clauses(reason: str) -> list[str]:
    """A verdict's reason split into its clauses: at ``"; "`` outside brackets, whitespace collapsed, empties dropped;
    each clause but the last keeps its ``";"``, so that joining them with spaces gives the reason back.

    Parameters
    ----------
    reason : str

    Returns
    -------
    list of str
    """
    parts = [p.strip() for p in split_outside_brackets(" ".join(str(reason).split()), "; ") if p.strip()]
    return [p + ";" for p in parts[:-1]] + parts[-1:]  # lossless: "; ".join gives the reason back


def detail_lines(reason: str) -> list[str]:
    """A verdict's reason as the lines under its headline: ``"  - clause"`` per :func:`reason_clauses` clause,
    each whole on its line (a notebook, a terminal and a browser wrap it; a search finds it)."""
    return [f"  - {part}" for part in reason_clauses(reason)]


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, bool)) or (
        isinstance(value, numbers.Real) and math.isfinite(float(value)))


@dataclass(frozen=True)
class Action:
    """The setting a verdict decides and the value it recommends.

    Attributes
    ----------
    setting : str
        The knob in the field's own terms, e.g. ``"num_workers"``, ``"autocast_dtype"``,
        ``"pin_memory"``, ``"memory_format"``, ``"comm_hook"``, ``"batch_size"``,
        ``"batched_decode"``, ``"prefetcher"``.
    value : str, int, float, bool or None
        The recommended value (e.g. ``2``, ``"bfloat16"``, ``True``, ``"channels_last"``); None
        when the verdict recommends no change.
    text : str
        The action as the report's first screen shows it, e.g. ``"bf16 autocast: enable"`` or
        ``"batch size 32 → 80"``: built from the numbers by the verdict function, never parsed back.
    current : str, int, float, bool or None
        The value in use when the verdict was measured (e.g. the current batch size), if any.

    Raises
    ------
    ParameterError
        If ``setting`` or ``text`` is empty or a value is not a JSON scalar.
    """

    setting: str
    value: Any
    text: str
    current: Any = None

    def __post_init__(self) -> None:
        for name in ("setting", "text"):
            v = getattr(self, name)
            if not isinstance(v, str) or not v.strip():
                raise ParameterError(f"Action.{name}: expected a non-empty str, got {v!r}")
        for name in ("value", "current"):
            if not _scalar(getattr(self, name)):
                raise ParameterError(f"Action.{name}: expected a str, bool, finite number or None, "
                                     f"got {getattr(self, name)!r}")

    def to_dict(self) -> dict[str, Any]:
        """The action as a dict of JSON types (stored in a verdict record's ``extra["action"]``)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> "Action | None":
        """Rebuild an action from :meth:`to_dict`'s output; None for None or a malformed mapping."""
        if not isinstance(data, Mapping):
            return None
        try:
            return cls(setting=data["setting"], value=data.get("value"), text=data["text"],
                       current=data.get("current"))
        except (KeyError, ParameterError):
            return None


@dataclass(frozen=True)
class Verdict:
    """A notebook's computed decision, with the number it rests on.

    Attributes
    ----------
    notebook : str
        Notebook id, e.g. ``"04_pinned_memory"``.
    metric : str
        The quantity, e.g. ``"speedup"``, ``"exposed_input_fraction"``.
    value : float or None
        Its value (None when there is no number, e.g. not applicable).
    unit : str
        Unit of ``value`` (``"x"``, ``"fraction"``, ``"GB/s"``...).
    recommendation : str
        One of :data:`RECOMMENDATIONS`.
    reason : str
        One or two sentences for the reader, computed from the figures.
    spread : dict or None
        Interval of ``value`` in its unit, e.g. ``{"ci_low", "ci_high", "confidence"}`` or ``{"p25", "p75"}``.
    repeats : int or None
        Repeats behind ``value``.
    action : Action or None
        The setting decided and its value (None for a verdict that decides no setting).
    context : str or None
        What was measured, in one sentence (workload, settings, device).
    extra : dict
        Further figures for the report and later notebooks (JSON types).

    Raises
    ------
    ParameterError
        If the recommendation is unknown, the reason is empty or ``value`` is not finite.
    """

    notebook: str
    metric: str
    value: float | None
    unit: str
    recommendation: str
    reason: str
    spread: Mapping[str, float] | None = None
    repeats: int | None = None
    action: Action | None = None
    context: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.recommendation not in RECOMMENDATIONS:
            raise ParameterError(f"verdict: recommendation {self.recommendation!r} is not one of "
                                 f"{', '.join(repr(r) for r in RECOMMENDATIONS)}")
        if not isinstance(self.reason, str) or not self.reason.strip():
            raise ParameterError(f"verdict: reason must be a non-empty sentence saying why, got {self.reason!r}")
        if self.value is not None and (isinstance(self.value, bool) or not isinstance(self.value, numbers.Real)
                                       or not math.isfinite(float(self.value))):
            raise ParameterError(f"verdict {self.notebook}/{self.metric}: value {self.value!r} is not a finite "
                                 "number; record None with a reason instead")
        if self.action is not None and not isinstance(self.action, Action):
            raise ParameterError(f"verdict: action must be an Action or None, got {self.action!r}")

    def sentence(self) -> str:
        """``"ENABLE: <reason>"``: the whole verdict on one line (logs, records); notebooks print :meth:`text`."""
        return f"{self.recommendation.upper()}: {self.reason}"

    def figure(self, *, short: bool = False) -> str:
        """The number and its interval, e.g. ``"speedup 1.27x (95% CI 1.13–1.30)"``; "" without a number.

        A unit that already names the quantity (``invalid_env_settings`` counted in "invalid settings") is said
        once; ``short`` drops a parenthetical from the unit ("samples or more (no limit found ...)").
        """
        if self.value is None:
            return ""
        name = self.metric.replace("_", " ")
        unit = self.unit.split(" (")[0] if short else self.unit
        interval = format_interval(dict(self.spread) if self.spread else None, self.unit)
        words = set(name.split())
        said = format_value(self.value, unit)
        head = said if unit not in ("x", "fraction", "") and set(unit.split()) <= words else f"{name} {said}"
        return head + (f" ({interval})" if interval else "")

    def advice(self) -> str:
        """What to do, in a few words, led by the recommendation: ``"ENABLE: pinned memory: enable"`` is written
        ``"ENABLE pinned memory"``; a label says which side to speed up and the notebooks to open next; an
        inconclusive verdict says why (a busy machine, a diverged loss, ``extra["inconclusive_why"]``, else an
        interval that cannot decide) and what was measured (``extra["measured_recommendation"]``). A verdict that
        decides no single setting words it itself (``extra["advice"]``), or names the optimizations it measured
        together (``extra["optimizations"]``, notebook 10's)."""
        rec = self.recommendation
        extra = dict(self.extra or {})
        if rec != "inconclusive" and isinstance(extra.get("advice"), str) and extra["advice"].strip():
            return extra["advice"].strip()  # the verdict function's own words, for a verdict that decides no setting
        if rec == "inconclusive":
            if isinstance(extra.get("divergence"), Mapping):
                return "INCONCLUSIVE: the loss diverged, fix the job before timing it"
            measured = extra.get("measured_recommendation")
            measured = None if measured == "inconclusive" else measured
            machine = extra.get("machine") if isinstance(extra.get("machine"), Mapping) else {}
            why = ("machine busy, rerun when it is quiet" if machine.get("busy") else
                   str(extra.get("inconclusive_why") or "the interval cannot decide, rerun with more repeats"))
            return f"INCONCLUSIVE ({measured} as measured): {why}" if measured else f"INCONCLUSIVE: {why}"
        if rec == "not applicable":
            why = reason_clauses(self.reason)[0].rstrip(";") if self.reason else ""
            return f"NOT APPLICABLE here: {why}" if why else "NOT APPLICABLE here"
        if rec in _LABEL_ADVICE:
            nxt = (extra.get("bottleneck") or {}).get("next_notebooks") if isinstance(extra.get("bottleneck"),
                                                                                      Mapping) else None
            where = f" (notebook {', '.join(str(n) for n in nxt)})" if nxt else ""
            return f"{rec.upper()}: {_LABEL_ADVICE[rec]}{where}"
        optimizations = extra.get("optimizations")
        if self.action is None and isinstance(optimizations, list) and optimizations:
            return f"{rec.upper()} {' + '.join(str(o) for o in optimizations)} together"
        if self.action is not None:
            text = self.action.text
            tail = f": {rec}"
            subject = text[: -len(tail)] if text.endswith(tail) else text
            return f"{rec.upper()} {subject}" if text.endswith(tail) else f"{rec.upper()}: {text}"
        return rec.upper()

    def headline(self) -> str:
        """The verdict's first line, at most :data:`HEADLINE_CHARS` characters: what to do, the number, its interval.

        E.g. ``"ENABLE bf16 autocast: speedup 1.27x (95% CI 1.13–1.30)"`` or ``"HOST-BOUND: speed up the input
        first (notebook 03, 02): exposed input fraction 62% (IQR 55%–70%)"``. Where both do not fit, the unit's
        parenthetical goes first, then the advice is cut (with "…"); the number and its interval stay. A verdict
        whose metric is not what its advice stands on (a trace's device-bound label, whose shares the advice gives)
        sets ``extra["headline_figure"] = False``: the advice alone.
        """
        advice = self.advice()
        fig = self.figure() if (self.extra or {}).get("headline_figure", True) else ""
        if fig and len(advice) + len(fig) + 2 > HEADLINE_CHARS:
            fig = self.figure(short=True)
        if not fig:
            line = advice
        else:
            room = HEADLINE_CHARS - len(fig) - 2
            if len(advice) > room:
                advice = advice[: max(room - 1, 8)].rstrip() + "…"
            line = f"{advice}: {fig}"
        return line if len(line) <= HEADLINE_CHARS else line[: HEADLINE_CHARS - 1] + "…"

    def text(self) -> str:
        """What a notebook prints: :meth:`headline`, then the reason, a clause per line (:func:`detail_lines`)."""
        return "\n".join([self.headline(), *detail_lines(self.reason)])

    def store_fields(self) -> dict[str, Any]:
        """Keyword arguments of :meth:`helpers.results.ResultsStore.verdict` for this verdict."""
        extra = dict(self.extra)
        if self.context:
            extra["context"] = self.context
        return dict(metric=self.metric, value=self.value, unit=self.unit, recommendation=self.recommendation,
                    reason=self.reason, repeats=self.repeats, spread=dict(self.spread) if self.spread else None,
                    action=self.action, **extra)

    @classmethod
    def from_record(cls, row: Mapping[str, Any]) -> "Verdict":
        """Rebuild a verdict from a verdict record (a row of :func:`helpers.results.verdicts` or a dict).

        Raises
        ------
        ParameterError
            If the record is not a valid verdict (no recommendation or reason).
        """
        extra = dict(row.get("extra") or {}) if isinstance(row.get("extra"), Mapping) else {}
        action = Action.from_dict(extra.pop("action", None))
        context = extra.pop("context", None)
        value = row.get("value")
        if value is not None and isinstance(value, float) and math.isnan(value):
            value = None
        spread = row.get("spread") if isinstance(row.get("spread"), Mapping) else None
        repeats = row.get("repeats")
        repeats = None if repeats is None or (isinstance(repeats, float) and math.isnan(repeats)) else int(repeats)
        return cls(notebook=str(row.get("notebook")), metric=str(row.get("metric")), value=value,
                   unit=str(row.get("unit") or ""), recommendation=row.get("recommendation"),
                   reason=row.get("reason"), spread=spread, repeats=repeats, action=action,
                   context=context if isinstance(context, str) else None, extra=extra)
