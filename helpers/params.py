"""Validation of notebook parameters before any work is done.

Papermill passes parameters in ways that are easy to get wrong (facts checked
with papermill 2.7.0: ``_resolve_type`` in ``papermill/cli.py``, the
"Passed unknown parameter" warning in ``papermill/execute.py``, and
nteract/papermill#586 for tuples):

* ``-p name value`` guesses the type: ``True``/``False``/``None``, then int,
  then float, else str. So ``-p batch_size 32`` is an int but
  ``-p sizes "01 02"`` is the string ``"01 02"``.
* ``-r name value`` passes the raw string: ``-r flag False`` gives ``"False"``,
  which is *truthy* in Python.
* Tuples arrive as strings (``(4, 5)`` becomes ``"(4, 5)"``).
* Unknown or misspelled parameters only log a warning and the default is used.

:func:`validate` therefore coerces each value by a declared :class:`Param`
(so ``"32"`` becomes 32 and ``"false"`` becomes False), checks choices and
ranges, rejects unknown names with a suggestion, and reports *every* problem
in one :class:`~helpers.errors.ParameterError`, one line per problem, before
the notebook does any work.
"""

from __future__ import annotations

import ast
import difflib
import json
import logging
import math
import numbers
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from helpers.errors import ParameterError

__all__ = ["Param", "coerce", "validate", "describe"]

logger = logging.getLogger(__name__)

_KINDS = (int, float, bool, str, list)
_ITEM_KINDS = (int, float, bool, str)
_TRUE = ("true", "yes", "1")
_FALSE = ("false", "no", "0")
_NONE_STRINGS = ("none", "null")
_INT_RE = re.compile(r"[+-]?\d+")


class _Problem(Exception):
    """One problem with one value (internal; becomes a line of a ParameterError)."""


# --------------------------------------------------------------------------- Param


def _num(x: float) -> str:
    """Format a bound: 1 rather than 1.0, 0.001 rather than 1e-03."""
    return f"{x:g}" if isinstance(x, float) else str(x)


@dataclass(frozen=True)
class Param:
    """The declaration of one notebook parameter.

    Parameters
    ----------
    name : str
        Parameter name, a Python identifier (as in the notebook's parameters cell).
    kind : type
        One of ``int``, ``float``, ``bool``, ``str``, ``list``.
    default : Any
        Value used when the parameter is not given; it must itself be valid.
    help : str
        One line for the reader: what it is, with its unit.
    choices : tuple or None
        Allowed values. For ``str`` they match case-insensitively and the
        canonical spelling (as written here) is returned. For ``list`` they
        apply to each item.
    minimum, maximum : float or None
        Inclusive bounds for ``int``/``float`` (or each item of a list of numbers).
    item_kind : type or None
        For ``list``: the kind of each item (int, float, bool or str); None
        keeps items as given.
    nullable : bool, default False
        Whether None (or the strings ``"None"``/``"null"``) is allowed.
    hints : mapping or None
        Common wrong values and what to suggest instead, e.g. ``{"gpu": "cuda"}``;
        used only in error messages (nothing is silently rewritten).

    Raises
    ------
    ParameterError
        If the declaration itself is inconsistent (unknown kind, bounds on a
        ``str``, minimum > maximum, or an invalid default).
    """

    name: str
    kind: type
    default: Any
    help: str
    choices: tuple | None = None
    minimum: float | None = None
    maximum: float | None = None
    item_kind: type | None = None
    nullable: bool = False
    hints: Mapping[str, str] | None = field(default=None, hash=False)

    def __post_init__(self) -> None:
        where = f"Param {self.name!r}"
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ParameterError(f"{where}: name must be a Python identifier")
        if self.kind not in _KINDS:
            raise ParameterError(
                f"{where}: kind must be one of int, float, bool, str, list; got {self.kind!r}"
            )
        if self.item_kind is not None and (self.kind is not list or self.item_kind not in _ITEM_KINDS):
            raise ParameterError(
                f"{where}: item_kind (int, float, bool or str) is only for kind=list; "
                f"got kind={self.kind.__name__}, item_kind={self.item_kind!r}"
            )
        if not isinstance(self.help, str):
            raise ParameterError(f"{where}: help must be a str")
        if self.choices is not None:
            if isinstance(self.choices, (str, bytes)) or not isinstance(self.choices, Sequence) \
                    or not self.choices:
                raise ParameterError(f"{where}: choices must be a non-empty tuple, got {self.choices!r}")
            object.__setattr__(self, "choices", tuple(self.choices))
        numeric = self._scalar_kind in (int, float)
        for bound in ("minimum", "maximum"):
            b = getattr(self, bound)
            if b is not None and (not numeric or isinstance(b, bool) or not isinstance(b, numbers.Real)):
                raise ParameterError(
                    f"{where}: {bound} needs an int or float parameter (or a list of them) and a "
                    f"number; got {bound}={b!r} for kind {self._type_text}"
                )
        if self.minimum is not None and self.maximum is not None and self.minimum > self.maximum:
            raise ParameterError(f"{where}: minimum {self.minimum} > maximum {self.maximum}")
        if self.hints is not None:
            object.__setattr__(
                self, "hints", {str(k).casefold(): str(v) for k, v in dict(self.hints).items()}
            )
        try:
            _coerce(self, self.default)
        except _Problem as exc:
            raise ParameterError(f"{where}: the default is invalid: {exc}") from None

    @property
    def _scalar_kind(self) -> type | None:
        return self.item_kind if self.kind is list else self.kind

    @property
    def _type_text(self) -> str:
        if self.kind is list:
            return f"list[{self.item_kind.__name__}]" if self.item_kind else "list"
        return self.kind.__name__

    def _range_text(self) -> str:
        lo, hi = self.minimum, self.maximum
        if lo is not None and hi is not None:
            return f"between {_num(lo)} and {_num(hi)}"
        if lo is not None:
            return f">= {_num(lo)}"
        if hi is not None:
            return f"<= {_num(hi)}"
        return ""

    def expected(self) -> str:
        """What this parameter accepts, in words, e.g. ``"an int >= 1"``."""
        names = {int: "an int", float: "a finite float", bool: "a bool (true/false)", str: "a str"}
        rng = self._range_text()
        if self.kind is list:
            text = "a list"
            if self.item_kind is not None:
                text += f" of {self.item_kind.__name__}"
            if rng:
                text += f", each {rng}"
            if self.choices is not None:
                text += f", each one of {_choices_text(self.choices)}"
        else:
            text = names[self.kind]
            if rng:
                text += f" {rng}"
            if self.choices is not None:
                text += f", one of {_choices_text(self.choices)}"
        if self.nullable:
            text += ", or None"
        return text


def _choices_text(choices: tuple) -> str:
    return ", ".join(str(c) for c in choices)


# --------------------------------------------------------------------------- coercion


def _got(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def _scalar(kind: type, value: Any, *, from_text: bool) -> Any:
    """Coerce one scalar to ``kind``; raise _Problem('') on failure (caller words it).

    ``from_text``: the value came out of a string (a JSON or split list), so an
    int is also accepted for a str item (the digits were written explicitly).
    """
    if kind is int:
        if isinstance(value, bool):
            raise _Problem
        if isinstance(value, numbers.Integral):
            return int(value)
        if isinstance(value, str) and _INT_RE.fullmatch(value.strip()):
            return int(value.strip())
        raise _Problem
    if kind is float:
        if isinstance(value, bool):
            raise _Problem
        if isinstance(value, numbers.Real):
            f = float(value)
        elif isinstance(value, str):
            try:
                f = float(value.strip())
            except ValueError:
                raise _Problem from None
        else:
            raise _Problem
        if not math.isfinite(f):
            raise _Problem
        return f
    if kind is bool:
        if isinstance(value, bool):
            return value
        if type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"):
            return bool(value)  # numpy.bool_ (named numpy.bool since numpy 2)
        if isinstance(value, numbers.Integral) and value in (0, 1):
            return bool(value)
        if isinstance(value, str):
            s = value.strip().casefold()
            if s in _TRUE:
                return True
            if s in _FALSE:
                return False
        raise _Problem
    if kind is str:
        if isinstance(value, str):
            return value.strip()
        if from_text and isinstance(value, numbers.Integral) and not isinstance(value, bool):
            return str(value)
        raise _Problem
    return value  # item_kind None: keep as given


def _split_list_text(text: str) -> list:
    """Parse a list given as text: JSON, a Python literal list/tuple, or comma/space separated."""
    s = text.strip()
    if not s:
        return []
    if s[0] in "[(":
        try:
            parsed = json.loads(s)
        except json.JSONDecodeError:
            try:
                parsed = ast.literal_eval(s)
            except (ValueError, SyntaxError):
                raise _Problem from None
        if not isinstance(parsed, (list, tuple)):
            raise _Problem
        return list(parsed)
    return [p for p in re.split(r"[,\s]+", s) if p]


def _check_choice(param: Param, value: Any, label: str) -> Any:
    """Return the canonical choice for ``value`` or raise _Problem with a suggestion."""
    choices = param.choices
    if choices is None:
        return value
    if isinstance(value, str):
        folded = value.casefold()
        for c in choices:
            if isinstance(c, str) and c.casefold() == folded:
                return c
        suggestion = None
        if param.hints and folded in param.hints:
            suggestion = param.hints[folded]
        else:
            str_choices = [c for c in choices if isinstance(c, str)]
            close = difflib.get_close_matches(folded, [c.casefold() for c in str_choices], n=1)
            if close:
                suggestion = next(c for c in str_choices if c.casefold() == close[0])
        hint = f" (did you mean {suggestion!r}?)" if suggestion is not None else ""
        raise _Problem(f"{label}: {value!r} is not one of {_choices_text(choices)}{hint}")
    for c in choices:  # 1 == True in Python: also require the same bool-ness
        if c == value and isinstance(c, bool) == isinstance(value, bool):
            return c
    raise _Problem(f"{label}: {value!r} is not one of {_choices_text(choices)}")


def _check_range(param: Param, value: float) -> bool:
    if param.minimum is not None and value < param.minimum:
        return False
    if param.maximum is not None and value > param.maximum:
        return False
    return True


def _coerce_one(param: Param, kind: type | None, value: Any, label: str, *, from_text: bool,
                original: Any) -> Any:
    """Coerce a scalar (a value or a list item), then check choices and range."""
    if kind is not None:
        try:
            value = _scalar(kind, value, from_text=from_text)
        except _Problem:
            raise _Problem(f"{label}: expected {param.expected()}, got {_got(original)}") from None
    value = _check_choice(param, value, label)
    if kind in (int, float) and not _check_range(param, value):
        raise _Problem(f"{label}: expected {param.expected()}, got {_got(original)}")
    return value


def _coerce(param: Param, value: Any) -> Any:
    """Coerce ``value`` for ``param``; raise _Problem (one line) when it is not valid."""
    name = param.name
    if value is None or (
        param.nullable
        and isinstance(value, str)
        and value.strip().casefold() in _NONE_STRINGS
        and not (param.choices and any(isinstance(c, str) and c.casefold() == value.strip().casefold()
                                       for c in param.choices))
    ):
        if param.nullable:
            return None
        raise _Problem(f"{name}: expected {param.expected()}, got None; None is not allowed here")

    if param.kind is not list:
        return _coerce_one(param, param.kind, value, name, from_text=False, original=value)

    if isinstance(value, (list, tuple)):
        items, from_text = list(value), False
    elif isinstance(value, str):
        try:
            items = _split_list_text(value)
        except _Problem:
            raise _Problem(
                f"{name}: expected {param.expected()}, got {_got(value)}; write it as a JSON list "
                f"such as [1, 2] or as items separated by commas or spaces"
            ) from None
        from_text = True
    elif isinstance(value, (numbers.Real, bool)):
        # papermill -p turns a one-item list such as "64" into the number 64
        items, from_text = [value], False
    else:
        raise _Problem(f"{name}: expected {param.expected()}, got {_got(value)}")

    out, bad = [], []
    for i, item in enumerate(items):
        try:
            out.append(_coerce_one(param, param.item_kind, item, f"{name}[{i}]",
                                   from_text=from_text, original=item))
        except _Problem as exc:
            bad.append(str(exc))
    if bad:
        more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
        raise _Problem("; ".join(bad[:3]) + more)
    return out


def coerce(param: Param, value: Any) -> Any:
    """Convert one value to the parameter's kind and check it.

    Rules (papermill passes strings with ``-r`` and for values it cannot guess):

    * int: an int, or a string of one (``"32"``); not a bool (``True`` is an
      int in Python), not ``3.5`` nor ``"3.5"``.
    * float: an int, a float or a numeric string (``"1e-3"``); NaN and
      infinity are rejected.
    * bool: a bool; the strings true/false, yes/no, 1/0 (any case); the ints
      0 and 1. Any other string (``"maybe"``) or number is rejected.
    * str: a str, stripped of surrounding spaces. Numbers are rejected (papermill
      ``-p`` already turned ``"0042"`` into 42; pass it with ``-r`` instead).
    * list: a list or tuple; a string holding a JSON list (``"[1, 2]"``), a
      Python list or tuple literal (``"(4, 5)"``, as papermill passes tuples),
      or items separated by commas and/or spaces (``"01 02"``, ``"01,02"``);
      a single number becomes a one-item list. Items are coerced by
      ``item_kind`` (an int item from a string also counts as a str item).
    * None: only if ``nullable`` (the strings ``"None"``/``"null"`` too,
      unless they are one of the choices).

    Then choices are checked (case-insensitive for str, returning the
    canonical spelling) and the inclusive range ``minimum``..``maximum``.

    Parameters
    ----------
    param : Param
        The declaration.
    value : Any
        The value as received.

    Returns
    -------
    Any
        The coerced value.

    Raises
    ------
    ParameterError
        With one line naming the parameter, the value seen (repr and type)
        and what is allowed.
    """
    if not isinstance(param, Param):
        raise ParameterError(f"coerce: expected a Param, got {type(param).__name__}")
    try:
        return _coerce(param, value)
    except _Problem as exc:
        err = ParameterError(str(exc))
        err.problems = (str(exc),)
        raise err from None


# --------------------------------------------------------------------------- validate


def _check_spec(spec: Sequence[Param]) -> dict[str, Param]:
    if isinstance(spec, (str, bytes)) or not isinstance(spec, Sequence):
        raise ParameterError(f"spec: expected a sequence of Param, got {type(spec).__name__}")
    by_name: dict[str, Param] = {}
    for p in spec:
        if not isinstance(p, Param):
            raise ParameterError(f"spec: expected Param entries, got {p!r}")
        if p.name in by_name:
            raise ParameterError(f"spec: parameter {p.name!r} is declared twice")
        by_name[p.name] = p
    return by_name


def validate(
    values: Mapping[str, Any],
    spec: Sequence[Param],
    *,
    allow_unknown: bool = False,
    fill_defaults: bool = True,
) -> dict[str, Any]:
    """Check and coerce a notebook's parameters, reporting every problem at once.

    Parameters
    ----------
    values : mapping
        Parameter name to value as received (e.g. the notebook's globals for
        the declared names, or papermill's parameters).
    spec : sequence of Param
        The declarations.
    allow_unknown : bool, default False
        Pass names that are not declared through unchanged instead of
        reporting them.
    fill_defaults : bool, default True
        Add declared parameters missing from ``values`` with their default.

    Returns
    -------
    dict
        Coerced values, in ``spec`` order (then any passed-through unknown names).

    Raises
    ------
    ParameterError
        One error listing every problem, one line each, e.g.
        ``batch_size: expected an int >= 1, got -3 (int)``,
        ``device: 'gpu' is not one of auto, cpu, cuda, npu (did you mean 'cuda'?)``,
        ``unknown parameter 'batchsize' (did you mean 'batch_size'?); known: ...``.
        The lines are also in its ``problems`` attribute (a tuple of str).
    """
    if not isinstance(values, Mapping):
        raise ParameterError(f"values: expected a mapping of name to value, got {type(values).__name__}")
    by_name = _check_spec(spec)
    problems: list[str] = []
    out: dict[str, Any] = {}
    for name, param in by_name.items():
        if name in values:
            try:
                out[name] = _coerce(param, values[name])
            except _Problem as exc:
                problems.append(str(exc))
        elif fill_defaults:
            out[name] = _coerce(param, param.default)
    known = list(by_name)
    for name in values:
        if name in by_name:
            continue
        if allow_unknown:
            logger.info("parameter %r is not declared; passed through unchanged", name)
            out[name] = values[name]
            continue
        close = difflib.get_close_matches(str(name), known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        problems.append(f"unknown parameter {name!r}{hint}; known: {', '.join(known)}")
    if problems:
        err = ParameterError("\n".join(problems))
        err.problems = tuple(problems)
        raise err
    return out


def describe(spec: Sequence[Param]) -> list[dict[str, Any]]:
    """Describe the parameters for documentation and ``--help`` output.

    Parameters
    ----------
    spec : sequence of Param

    Returns
    -------
    list of dict
        One dict per parameter with keys ``name``, ``type`` (e.g. ``"int"``,
        ``"list[str] or None"``), ``default``, ``allowed`` (choices and range
        in words, ``"any"`` if unconstrained) and ``help``.
    """
    rows = []
    for p in _check_spec(spec).values():
        allowed = []
        if p.choices is not None:
            allowed.append(f"one of {_choices_text(p.choices)}")
        rng = p._range_text()
        if rng:
            allowed.append(rng)
        if p._scalar_kind is bool:
            allowed.append("true or false")
        if p.nullable:
            allowed.append("None")
        rows.append(
            {
                "name": p.name,
                "type": p._type_text + (" or None" if p.nullable else ""),
                "default": p.default,
                "allowed": "; ".join(allowed) if allowed else "any",
                "help": p.help,
            }
        )
    return rows


def headless() -> bool:
    """True when running without a person at the keyboard: no widgets, no progress bars.

    The runner and the tests set ``WORKBOOK_HEADLESS=1``; CI sets ``CI``. A papermill or nbval run started by hand
    must set ``WORKBOOK_HEADLESS=1`` itself (docs/run_options.md).
    """
    return os.environ.get("WORKBOOK_HEADLESS", "") not in ("", "0") or bool(os.environ.get("CI"))
