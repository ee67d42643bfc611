"""Validation of the compute layer's configurations (PolicyConfig, PPOConfig, ...)."""

from __future__ import annotations

from helpers.errors import ParameterError


def bad_field(field: str, value: object, allowed: str) -> ParameterError:
    """Build the ParameterError for a bad configuration field: name, value seen, what is allowed."""
    return ParameterError(
        f"{field}={value!r} is not allowed; allowed: {allowed}. "
        f"Pass a valid {field.split('.')[-1]} (see the class docstring)."
    )


def is_int(value: object) -> bool:
    """True for an ``int`` that is not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_positive_int(field: str, value: object) -> None:
    """Raise ParameterError unless ``value`` is an integer >= 1."""
    if not is_int(value) or value < 1:  # type: ignore[operator]
        raise bad_field(field, value, "an integer >= 1")


def check_real(field: str, value: object, lo: float, hi: float, *, lo_open: bool = False,
               hi_open: bool = False) -> None:
    """Raise ParameterError unless ``value`` is a real number (not a tensor) in the given interval."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok:
        v = float(value)  # a Python number, not a tensor: no host sync
        ok = (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
    if not ok:
        left = "(" if lo_open else "["
        right = ")" if hi_open else "]"
        raise bad_field(field, value, f"a number in {left}{lo}, {hi}{right}")
