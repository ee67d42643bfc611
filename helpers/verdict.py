"""The Verdict type: what a notebook decides, as fields that the report and notebook 10 read.

Every verdict function of the workbook returns a :class:`Verdict`; the
notebook records it with :meth:`helpers.results.ResultsStore.add_verdict`.
The decision itself is in :attr:`Verdict.action` (which setting to apply and
its value), so nothing downstream has to parse the reason's wording.

Part of the foundation: imports only :mod:`helpers.errors`.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from helpers.errors import ParameterError

__all__ = ["Action", "RECOMMENDATIONS", "Verdict"]

#: The recommendations a verdict may make. "enable" / "leave off" decide a setting; "not applicable" says the
#: machine cannot do it; notebook 01 calls the job "host-bound", "balanced", "device-bound"
#: or "communication-bound" (helpers.bottleneck.LABELS); "inconclusive" replaces any of them when the machine was too busy while
#: measuring for the figures to be trusted (helpers.machine).
RECOMMENDATIONS: tuple[str, ...] = ("enable", "leave off", "not applicable", "host-bound", "balanced",
                                    "device-bound", "communication-bound", "inconclusive")


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
        """``"ENABLE: <reason>"``: the line a notebook prints under its verdict."""
        return f"{self.recommendation.upper()}: {self.reason}"

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
