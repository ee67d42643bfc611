"""Headless widgets: ``interact`` calls the callback once with the values the controls start at in JupyterLab."""

from __future__ import annotations

import ipywidgets
import pytest

from helpers.errors import ParameterError
from helpers.workbook import widgets
from helpers.workbook.widgets import _initial, interact

#: Controls and abbreviations as ipywidgets.interactive accepts them.
CONTROLS = [
    pytest.param((0, 10), id="int-range"),
    pytest.param((-5, 5), id="int-range-negative"),
    pytest.param((0, 9), id="int-range-odd"),
    pytest.param((0.0, 1.0), id="float-range"),
    pytest.param((0, 1.0), id="mixed-range"),
    pytest.param((0, 10, 3), id="int-range-step"),
    pytest.param((1, 4, 2), id="int-range-step-down"),
    pytest.param((0.0, 1.0, 0.3), id="float-range-step"),
    pytest.param((0.1, 0.9, 0.05), id="float-range-small-step"),
    pytest.param(["sgd", "adam"], id="list"),
    pytest.param([("fp32", "float32"), ("bf16", "bfloat16")], id="label-value-pairs"),
    pytest.param({"small": 16, "large": 64}, id="dict"),
    pytest.param(7, id="int"),
    pytest.param(0.25, id="float"),
    pytest.param("text", id="str"),
    pytest.param(True, id="bool"),
    pytest.param(ipywidgets.FloatSlider(value=0.1, min=0.0, max=1.0, step=0.05), id="widget"),
    pytest.param(ipywidgets.fixed("kept"), id="fixed"),
]


def _interactive_start(control):
    """The value ipywidgets.interactive calls the function with first, for one control."""
    seen = []
    ipywidgets.interactive(lambda x: seen.append(x), x=control)
    return seen[0]


@pytest.mark.parametrize("control", CONTROLS)
def test_initial_is_the_value_ipywidgets_starts_the_control_at(control):
    expected = _interactive_start(control)
    got = _initial(control)
    if isinstance(expected, float):
        assert isinstance(got, float) and got == pytest.approx(expected)
    else:
        assert type(got) is type(expected) and got == expected


def test_slider_abbreviations_start_mid_range_not_at_the_minimum():
    assert _initial((0, 10)) == 5 and isinstance(_initial((0, 10)), int)
    assert _initial((0, 9)) == 4
    assert _initial((0.0, 1.0)) == 0.5
    assert _initial((0, 10, 3)) == 3  # midpoint 5, down onto the grid 0, 3, 6, 9
    assert _initial((2, 12, 4)) == 6  # the grid starts at min: 2, 6, 10


@pytest.mark.parametrize("bad", [(5, 1), (0, 10, 0), (0.0, 1.0, -0.1)])
def test_slider_abbreviations_ipywidgets_rejects_fail_headless_too(bad):
    with pytest.raises(ValueError):
        _interactive_start(bad)
    with pytest.raises(ParameterError):
        _initial(bad)


def test_headless_interact_calls_once_with_initial_values_and_returns_the_result(monkeypatch):
    monkeypatch.setattr(widgets, "headless", lambda: True)
    calls = []

    def f(threshold, batch, optimizer):
        calls.append((threshold, batch, optimizer))
        return f"{optimizer}@{batch}:{threshold}"

    out = interact(f, threshold=ipywidgets.FloatSlider(value=0.1, min=0.0, max=1.0),
                   batch=(16, 128, 16), optimizer=["adam", "sgd"])
    assert calls == [(0.1, 64, "adam")]
    assert out == "adam@64:0.1"


def test_interactive_interact_shows_the_widget_and_agrees_with_headless(monkeypatch):
    import IPython.display

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda obj: shown.append(obj))
    monkeypatch.setattr(widgets, "headless", lambda: False)
    controls = {"size": (0, 100, 10), "scale": (0.5, 2.0), "mode": {"fast": 1, "slow": 2}}

    def f(size, scale, mode):
        return (size, scale, mode)

    w = interact(f, **controls)
    assert shown == [w] and isinstance(w, ipywidgets.interactive)
    monkeypatch.setattr(widgets, "headless", lambda: True)
    assert interact(f, **controls) == w.result == (50, 1.25, 1)
