"""Notebook 07's verdict: does channels_last (NHWC) speed up the job's conv encoder here?

The measurements are the notebook's (the conv encoder's forward and backward
in NCHW and channels_last at each precision, interleaved, with
:mod:`helpers.compute.memory_format` and :mod:`helpers.compute.fusion`);
:func:`verdict` decides from them and returns the notebook's
:class:`helpers.verdict.Verdict`.
"""

from __future__ import annotations

from typing import Any

from helpers.errors import ParameterError
from helpers.verdict import Action, Verdict

__all__ = ["NOTEBOOK", "channels_last_decision", "verdict"]

#: Notebook whose verdict :func:`verdict` gives.
NOTEBOOK = "07_channels_last"


def channels_last_decision(comparisons: dict[str, Any], *, applicable: bool = True, why_not: str = "",
                          threshold: float = 1.05, what: str = "the conv encoder's forward+backward") -> dict[str, Any]:
    """Turn the channels_last comparisons into the notebook's verdict.

    The best variant is the one with the largest ratio (NCHW time / channels_last
    time at the same precision). "enable" when its bootstrap interval lies
    above 1 and the ratio is at least ``threshold``
    (:meth:`helpers.timing.Comparison.outcome` is ``"b_faster"``), else "leave off".

    Parameters
    ----------
    comparisons : dict of str to helpers.timing.Comparison
        Label (e.g. ``"fp32"``, ``"bfloat16 autocast"``) to the comparison of
        channels_last (B) against NCHW (A) at that precision. Must be non-empty when
        ``applicable``.
    applicable : bool, default True
        False where the device does not support channels_last (NPU).
    why_not : str
        The reason when not applicable.
    threshold : float, default 1.05
        Least speedup worth enabling (5 %: below that a layout change is not worth its risk).
    what : str
        What was timed, for the reason (the built-in job's conv encoder; a user's job's whole step).

    Returns
    -------
    dict
        ``value`` (float or None, "x"), ``recommendation`` ("enable", "leave off"
        or "not applicable"), ``reason`` (sentence), ``spread`` (interval or
        None), ``best`` (label or None), ``action`` (:class:`helpers.verdict.Action` on
        ``memory_format``).

    Raises
    ------
    ParameterError
        If applicable and ``comparisons`` is empty.
    """
    if not applicable:
        return {"value": None, "recommendation": "not applicable", "spread": None, "best": None,
                "reason": f"channels_last was not measured: {why_not or 'not supported on this device'}",
                "action": Action("memory_format", None, "channels_last: not applicable",
                                 current="contiguous_format")}
    if not comparisons:
        raise ParameterError("channels_last_decision: no comparison given; measure at least the fp32 one.")
    best = max(comparisons, key=lambda k: comparisons[k].ratio)
    c = comparisons[best]
    parts = [f"{label}: {cmp.ratio:.2f}x [{cmp.ci_low:.2f}, {cmp.ci_high:.2f}]" for label, cmp in comparisons.items()]
    outcome = c.outcome(threshold)
    rec = "enable" if outcome == "b_faster" else "leave off"
    if rec == "enable":
        head = f"channels_last made {what} {c.ratio:.2f}x faster ({best})"
    elif outcome == "a_faster":
        head = f"channels_last was slower than NCHW at every precision (best {best}: {c.ratio:.2f}x)"
    else:
        head = (f"channels_last gave no speedup of at least {threshold:.2f}x with a {c.confidence:.0%} interval "
                f"above 1 (best {best}: {c.ratio:.2f}x)")
    return {"value": c.ratio, "recommendation": rec, "best": best,
            "spread": {"ci_low": c.ci_low, "ci_high": c.ci_high, "confidence": c.confidence},
            "reason": f"{head}; speedup over NCHW by precision: {'; '.join(parts)}",
            "action": Action("memory_format", "channels_last" if rec == "enable" else "contiguous_format",
                             f"channels_last: {rec}", current="contiguous_format")}


def verdict(comparisons: dict[str, Any], *, applicable: bool, why_not: str, fusion: str, context: str,
            what: str = "the conv encoder's forward+backward") -> Verdict:
    """Notebook 07's verdict: :func:`channels_last_decision`'s decision, with the fusion figures in its reason.

    Parameters
    ----------
    comparisons, applicable, why_not
        As :func:`channels_last_decision`.
    fusion : str
        The SDPA and torch.compile results in one sentence (informative; they decide nothing here).
    context : str
        What was measured, in one sentence.
    what : str
        What was timed (see :func:`channels_last_decision`).

    Returns
    -------
    helpers.verdict.Verdict
        metric ``speedup`` (x, NCHW time over channels_last time) of the best precision; action on
        ``memory_format``; ``extra["best"]``: that precision's label.
    """
    v = channels_last_decision(comparisons, applicable=applicable, why_not=why_not, what=what)
    return Verdict(notebook=NOTEBOOK, metric="speedup", value=v["value"], unit="x",
                   recommendation=v["recommendation"], reason=f"{v['reason']}. Fusion: {fusion}", context=context,
                   action=v["action"], spread=v["spread"], extra={"best": v["best"]})
