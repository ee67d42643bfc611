"""Widgets that are inert when headless.

``interact(f, **controls)`` shows ipywidgets controls in JupyterLab; when the
notebook runs headless (runner, papermill, nbval, CI) it calls ``f`` once with
each control's initial value and returns the result, so the computation in
the callback is still executed and checked, and no widget state is left
behind. Callbacks must also work without widgets (plain functions with
explicit arguments), following clawpack/riemann_book's ``*_demos.py`` split.
"""

from __future__ import annotations

from numbers import Real
from typing import Any, Callable

from helpers.errors import ParameterError
from helpers.params import headless


def _initial(control: Any) -> Any:
    """The value ``ipywidgets.interactive`` first calls ``f`` with for ``control``, without importing ipywidgets.

    Follows ipywidgets' abbreviations (``ipywidgets.widgets.interaction``,
    ``_get_min_max_value``, ``widget_from_tuple``, ``widget_from_iterable``):

    - a widget (or ``ipywidgets.fixed``): its ``value``;
    - ``(min, max)``: the slider's midpoint, ``min + (max - min) // 2`` when
      both are integers, ``min + (max - min) / 2`` otherwise;
    - ``(min, max, step)``: that midpoint moved down onto the step grid that
      starts at ``min``, ``min + int((mid - min) / step) * step``;
    - a non-empty list or dict (a dropdown): its first option's value (the
      value of a ``(label, value)`` pair, a dict's first value);
    - anything else: the value itself.

    Parameters
    ----------
    control : object
        An ipywidgets control or an abbreviation of one.

    Returns
    -------
    object
        The initial value.

    Raises
    ------
    helpers.errors.ParameterError
        For a ``(min, max[, step])`` slider with ``min > max`` or ``step <= 0``,
        which ipywidgets rejects too (so a headless run fails where JupyterLab would).
    """
    if hasattr(control, "value"):  # a widget, ipywidgets.fixed or a helpers.live.Knob
        return control.value
    if isinstance(control, tuple) and len(control) in (2, 3) and all(isinstance(c, Real) for c in control):
        low, high = control[0], control[1]
        if low > high or (len(control) == 3 and control[2] <= 0):
            raise ParameterError(f"slider abbreviation {control!r}: need min <= max and step > 0")
        diff = high - low
        mid = low + diff / 2
        if not isinstance(mid, type(diff)):  # integer bounds: integer midpoint, as ipywidgets
            mid = low + diff // 2
        if len(control) == 3:
            step = control[2]
            mid = low + int((mid - low) / step) * step
        return mid
    if isinstance(control, (list, dict)) and control:
        options = list(control.items()) if isinstance(control, dict) else control
        if all(isinstance(o, (list, tuple)) and len(o) == 2 for o in options):
            return options[0][1]
        return options[0]
    return control


def interact(f: Callable[..., Any], **controls: Any) -> Any:
    """Interactive when a person is at the keyboard, a single plain call otherwise.

    Parameters
    ----------
    f : callable
        Function of keyword arguments named like ``controls``.
    **controls
        ipywidgets controls (e.g. ``FloatSlider(value=0.1, min=0, max=1)``),
        their abbreviations (``(min, max)``, ``(min, max, step)``, a list of
        options) or plain values. Headless, each is replaced by the value the
        control starts at (see :func:`_initial`), e.g. ``(0, 10)`` by 5.

    Returns
    -------
    object
        Headless: ``f``'s return value for the initial values. Interactive:
        the ``ipywidgets.interactive`` object (its ``.result`` holds the latest value).

    Raises
    ------
    helpers.errors.ParameterError
        Headless, for a slider abbreviation ipywidgets would reject (``min > max``, ``step <= 0``).
    """
    if headless():
        return f(**{k: _initial(v) for k, v in controls.items()})
    import ipywidgets
    from IPython.display import display

    w = ipywidgets.interactive(f, **controls)
    display(w)
    return w
