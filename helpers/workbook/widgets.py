"""Widgets that are inert when headless.

``interact(f, **controls)`` shows ipywidgets controls in JupyterLab; when the
notebook runs headless (runner, papermill, nbval, CI) it calls ``f`` once with
each control's initial value and returns the result, so the computation in
the callback is still executed and checked, and no widget state is left
behind. Callbacks must also work without widgets (plain functions with
explicit arguments), following clawpack/riemann_book's ``*_demos.py`` split.
"""

from __future__ import annotations

from typing import Any, Callable

from helpers.workbook.nbsetup import headless


def _initial(control: Any) -> Any:
    if hasattr(control, "value"):
        return control.value
    if isinstance(control, tuple) and len(control) >= 2 and all(isinstance(c, (int, float)) for c in control[:2]):
        return control[0] if len(control) < 3 else control[0]
    if isinstance(control, (list,)) and control:
        return control[0]
    return control


def interact(f: Callable[..., Any], **controls: Any) -> Any:
    """Interactive when a person is at the keyboard, a single plain call otherwise.

    Parameters
    ----------
    f : callable
        Function of keyword arguments named like ``controls``.
    **controls
        ipywidgets controls (e.g. ``FloatSlider(value=0.1, min=0, max=1)``)
        or plain values.

    Returns
    -------
    object
        Headless: ``f``'s return value for the initial values. Interactive:
        the ``ipywidgets.interactive`` object (its ``.result`` holds the latest value).
    """
    if headless():
        return f(**{k: _initial(v) for k, v in controls.items()})
    import ipywidgets
    from IPython.display import display

    w = ipywidgets.interactive(f, **controls)
    display(w)
    return w
