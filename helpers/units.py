"""Numbers for a reader: significant digits, percents and a value in its own unit.

One formatter for every sentence and table that shows a recorded value: the run report
(:mod:`helpers.workbook.report.format`) and the experiments that quote an earlier notebook's verdict in their
own sentences (notebook 10's selection and ablation lines) print the same value the same way.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["NO_VALUE", "format_bytes", "format_interval", "format_number", "format_percent", "format_value",
           "is_number"]

#: What a missing number reads as.
NO_VALUE = "—"


def is_number(value: Any) -> bool:
    """Whether ``value`` is a finite int or float (a bool is not a number here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def format_number(value: Any, digits: int = 3) -> str:
    """A number for a reader: ``digits`` significant digits, thousands separators, :data:`NO_VALUE` for none.

    Parameters
    ----------
    value : int, float, None or object
        An int is shown whole (with separators from 10,000 up); a float with ``digits`` significant digits
        (whole from 1,000 up; 3 significant digits below 0.01); None or NaN as :data:`NO_VALUE`; anything
        else that is no number as ``str(value)``.
    digits : int
        Significant digits between 0.01 and 1,000.

    Returns
    -------
    str
    """
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return NO_VALUE
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}" if abs(value) >= 10000 else str(value)
    try:
        v = float(value)
    except (TypeError, ValueError):
        return str(value)
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) < 0.01:
        return f"{v:.3g}"
    return f"{v:.{digits}g}"


def format_percent(fraction: float) -> str:
    """A fraction as percent, with the digits a small value needs: 77%, 2.5%, 0.1%, 0.05%, <0.001%.

    Whole percents from 10% up; two significant digits below, so that a value a notebook reported as
    "0.1%" is not shown as "0%".
    """
    p = 100 * float(fraction)
    if p == 0:
        return "0%"
    if abs(p) >= 9.95:
        return f"{p:.0f}%"
    if abs(p) < 0.001:
        return ("-" if p < 0 else "") + "<0.001%"
    return f"{p:.2g}%"


def format_value(value: Any, unit: str | None) -> str:
    """A value with its unit: fractions as percent, ratios as ``1.23x``, booleans as yes/no.

    Parameters
    ----------
    value : float or None
    unit : str or None
        ``"fraction"`` -> :func:`format_percent`; ``"x"`` -> ``"1.72x"``; ``"bool"`` -> ``"yes"``/``"no"``;
        otherwise ``"<format_number(value)> <unit>"``.

    Returns
    -------
    str
        :data:`NO_VALUE` when ``value`` is not a finite number (:func:`is_number`).
    """
    unit = unit or ""
    if not is_number(value):
        return NO_VALUE
    if unit == "fraction":
        return format_percent(value)
    if unit == "x":
        return f"{value:.2f}x"
    if unit == "bool":
        return "yes" if value else "no"
    return f"{format_number(value)} {unit}".strip()


def format_interval(spread: Any, unit: str | None = None) -> str:
    """The interval of a spread dict: ``"95% CI 1.10–1.30"`` or ``"IQR 64%–70%"``; "" when it holds none.

    Parameters
    ----------
    spread : dict or None
        ``{"ci_low", "ci_high"[, "confidence"]}`` (a bootstrap interval, confidence 0..1, default 0.95) or
        ``{"p25", "p75"}`` (the interquartile range), in ``unit``.
    unit : str, optional
        ``"fraction"``: the bounds as percent (:func:`format_percent`), each clipped to 0-100% (a share cannot
        leave it); ``"x"``: two decimals; otherwise :func:`format_number`.

    Returns
    -------
    str
    """
    if not isinstance(spread, dict):
        return ""

    def v(x: float) -> str:
        if unit == "fraction":
            return format_percent(min(1.0, max(0.0, float(x))))
        if unit == "x":
            return f"{x:.2f}"
        return format_number(x)

    if is_number(spread.get("ci_low")) and is_number(spread.get("ci_high")):
        conf = spread.get("confidence", 0.95)
        conf = conf if is_number(conf) else 0.95
        return f"{int(round(100 * conf))}% CI {v(spread['ci_low'])}–{v(spread['ci_high'])}"
    if is_number(spread.get("p25")) and is_number(spread.get("p75")):
        return f"IQR {v(spread['p25'])}–{v(spread['p75'])}"
    return ""


def format_bytes(nbytes: float) -> str:
    """A size in binary units as sentences, tables and axis ticks write it: ``"1 GiB"``, ``"4 MiB"``, ``"64 KiB"``,
    ``"8 B"`` (the largest unit it is at least one of, ``%g`` digits)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes:g} B"
