"""The "try it" panel: headless it measures once at the initial values; in JupyterLab the Measure button measures
at the knobs' current values, every point is recorded (interactive ones marked), an interrupt keeps what finished,
and a failing measurement says why without losing earlier points."""

from __future__ import annotations

from types import SimpleNamespace

import ipywidgets
import pytest

from chart_pixels import bars

from helpers.errors import ParameterError
from helpers.live import LivePoint
from helpers.results import ResultsStore, load_results
from helpers.workbook import panel as panel_mod
from helpers.workbook.panel import try_it


@pytest.fixture
def ctx(tmp_path):
    store = ResultsStore(tmp_path / "results.jsonl", notebook="03_dataloader_tuning", device="cpu:test")
    return SimpleNamespace(params={"busy_cpu_share": 0.25}, store=store, path=tmp_path / "results.jsonl")


def point(label: str, value: float) -> LivePoint:
    return LivePoint(label=label, value=value, unit="samples/s", metric="throughput", low=value - 1, high=value + 1,
                     sentence=f"{label}: {value}")


@pytest.fixture
def shown(monkeypatch):
    """Interactive mode with IPython's display captured (what would be shown in JupyterLab)."""
    seen = []
    monkeypatch.setattr(panel_mod, "headless", lambda: False)
    import IPython.display

    monkeypatch.setattr(IPython.display, "display", lambda *objs, **kw: seen.extend(objs))
    return seen


def test_headless_measures_once_at_the_initial_values_and_records_it(ctx, monkeypatch, capsys):
    monkeypatch.setattr(panel_mod, "headless", lambda: True)
    calls = []

    def measure(num_workers, persistent_workers):
        calls.append((num_workers, persistent_workers))
        return point(f"nw={num_workers}", 10.0 * (num_workers + 1))

    p = try_it(ctx, "loader", measure, reference=point("notebook", 5.0),
               num_workers=ipywidgets.Dropdown(options=[0, 1, 2], value=2), persistent_workers=[False, True])
    assert calls == [(2, False)]
    assert [pp.point.value for pp in p.points] == [30.0]
    assert "try it: nw=2: 30.0 [machine" in capsys.readouterr().out
    df = load_results(ctx.path)
    rec = df[df["experiment"] == "try it"].iloc[0]
    assert rec["variant"] == "nw=2" and rec["metric"] == "throughput" and rec["value"] == 30.0
    assert rec["extra"]["interactive"] is False and rec["extra"]["knobs"] == {"num_workers": 2,
                                                                             "persistent_workers": False}
    assert rec["spread"] == {"p25": 29.0, "p75": 31.0} and "busy" in rec["extra"]  # an IQR, keyed as the report reads
    import torch

    assert rec["extra"]["torch_threads"] == torch.get_num_threads()  # what the point ran with, beside its figure


def test_a_point_that_states_its_own_threads_keeps_them(ctx, monkeypatch):
    """Notebook 05's points carry the thread count their run set (helpers.conditions); the panel's reading of the
    count at the start does not replace it, nor collide with it."""
    monkeypatch.setattr(panel_mod, "headless", lambda: True)
    own = LivePoint(label="after", value=1.0, unit="x", metric="speedup", extra={"torch_threads": 1, "batch_size": 8})
    try_it(ctx, "overlap", lambda width: own, width=[16])
    rec = load_results(ctx.path).iloc[0]
    assert rec["extra"]["torch_threads"] == 1 and rec["extra"]["batch_size"] == 8


def test_a_sweep_yields_one_record_per_point_and_reports_progress(ctx, monkeypatch):
    monkeypatch.setattr(panel_mod, "headless", lambda: True)
    progress = []

    def sweep(max_mib, progress):
        sizes = [1, 2, 4][: max_mib.bit_length()]
        for i, s in enumerate(sizes):
            progress(i + 1, len(sizes))
            yield point(f"{s} MiB", float(s))

    p = try_it(ctx, "sweep", sweep, max_mib=4)
    assert [pp.point.label for pp in p.points] == ["1 MiB", "2 MiB", "4 MiB"]
    assert len(load_results(ctx.path)) == 3


def test_unavailable_panel_measures_nothing_and_says_why(ctx, monkeypatch, capsys):
    monkeypatch.setattr(panel_mod, "headless", lambda: True)
    p = try_it(ctx, "pinned", lambda size_mib: pytest.fail("must not measure"), unavailable="no accelerator",
               size_mib=[1, 64])
    assert p.points == [] and "not available here: no accelerator" in capsys.readouterr().out
    with pytest.raises(ParameterError, match="cannot measure here: no accelerator"):
        p.run({"size_mib": 1})


def test_a_panel_needs_a_knob_and_a_measurement_that_returns_points(ctx, monkeypatch):
    monkeypatch.setattr(panel_mod, "headless", lambda: True)
    with pytest.raises(ParameterError, match="at least one knob"):
        try_it(ctx, "none", lambda: point("x", 1.0))
    with pytest.raises(ParameterError, match="returned nothing"):
        try_it(ctx, "bad", lambda n: None, n=1)


def test_interactive_measure_button_uses_the_knobs_current_values_and_marks_records(ctx, shown):
    seen = []

    def measure(num_workers):
        seen.append(num_workers)
        return point(f"nw={num_workers}", float(num_workers))

    p = try_it(ctx, "loader", measure, reference=point("notebook", 1.0),
               num_workers=ipywidgets.Dropdown(options=[0, 1, 2], value=0))
    assert seen == [] and p.points == []  # nothing is measured until the button is pressed
    inter = p._widgets["interactive"]
    assert inter.manual_button.description == "Measure"
    inter.kwargs_widgets[0].value = 2
    inter.manual_button.click()
    inter.kwargs_widgets[0].value = 1
    inter.manual_button.click()
    assert seen == [2, 1] and [pp.point.label for pp in p.points] == ["nw=2", "nw=1"]
    assert "2 in all, recorded" in p._widgets["status"].value
    df = load_results(ctx.path)
    assert list(df["variant"]) == ["nw=2", "nw=1"] and all(e["interactive"] for e in df["extra"])
    # the chart was redrawn with the reference and both points (3 bars)
    fig = p.figure()
    assert len(fig.axes[0].patches) == 3
    # and the widget the learner sees holds them: its pixels, not only a changed image
    assert bars(shown_png(p)) == {**bars(shown_png(p)), "live": 2, "reference": 1}


def shown_png(panel) -> bytes:
    """The PNG inside the chart widget's ``<img src="data:image/png;base64,...">``."""
    import base64
    import re

    return base64.b64decode(re.search(r'src="data:image/png;base64,([^"]+)"', panel._widgets["chart"].value)[1])


def test_every_press_redraws_the_chart_widget_with_a_bar_per_point(ctx, shown):
    """The chart is an HTML widget whose value is set on each point: no Output widget whose capture can race."""
    p = try_it(ctx, "loader", lambda num_workers: point(f"nw={num_workers}", 2.0 + num_workers),
               reference=point("notebook", 1.0), num_workers=ipywidgets.Dropdown(options=[0, 1, 2], value=0))
    chart = p._widgets["chart"]
    assert isinstance(chart, ipywidgets.HTML)  # a string: saved with the notebook, restored on reopening
    assert bars(shown_png(p))["reference"] == 1 and bars(shown_png(p))["live"] == 0  # before any press
    for n in range(1, 4):
        p._widgets["interactive"].manual_button.click()
        assert bars(shown_png(p))["live"] == n and bars(shown_png(p))["reference"] == 1
        assert 'alt="Chart: Try it: loader' in chart.value and 'width="' in chart.value
    # a blank image is told apart: the check reads pixels
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (400, 300), "white").save(buf, format="PNG")
    assert bars(buf.getvalue())["live"] == 0 and bars(buf.getvalue())["reference"] == 0


def test_a_chart_that_renders_blank_is_drawn_again_and_said(ctx, shown, monkeypatch, capsys):
    """A render that comes out white (seen in JupyterLab on a busy machine) is redrawn; the log says so."""
    from matplotlib.figure import Figure
    from PIL import Image

    from helpers.workbook import plots
    from helpers.workbook.plots import blank_png

    real = Figure.savefig
    blanks = {"left": 0}

    def savefig(self, fname, **kw):
        if blanks["left"] > 0:  # a render that drew nothing: one colour, the figure's own size
            blanks["left"] -= 1
            Image.new("RGBA", (479, 307), "white").save(fname, format="PNG")
            return
        real(self, fname, **kw)

    monkeypatch.setattr(Figure, "savefig", savefig)
    p = try_it(ctx, "loader", lambda num_workers: point(f"nw={num_workers}", 2.0 + num_workers),
               reference=point("notebook", 1.0), num_workers=ipywidgets.Dropdown(options=[0, 1, 2], value=0))
    blanks["left"] = 1
    p._widgets["interactive"].manual_button.click()
    assert bars(shown_png(p))["live"] == 1 and not blank_png(shown_png(p))
    log = capsys.readouterr().out  # the panel's log (an Output widget prints through outside a kernel)
    assert "came out blank and was drawn again (2 renders)" in log
    blanks["left"] = plots.RENDERS  # blank every time: shown blank, and said, never silently
    p._widgets["interactive"].manual_button.click()
    assert blank_png(shown_png(p))
    log = capsys.readouterr().out
    assert f"came out blank {plots.RENDERS} times" in log and "every point is in the log above" in log


def test_a_notebook_figure_that_renders_blank_is_drawn_again_or_warned(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure
    from PIL import Image

    from helpers.workbook import plots

    real, blanks = Figure.savefig, {"left": 1}

    def savefig(self, fname, **kw):
        if blanks["left"] > 0:
            blanks["left"] -= 1
            Image.new("RGB", (300, 200), "white").save(fname, format="PNG")
            return
        real(self, fname, **kw)

    monkeypatch.setattr(Figure, "savefig", savefig)
    fig, ax = plt.subplots()
    ax.bar([0, 1], [1.0, 2.0], color="#1b9e77")
    ctx = SimpleNamespace(out_dir=tmp_path, notebook="01_x", figures=[])
    path = plots.save_figure(fig, ctx, "bars")
    assert not plots.blank_png(path.read_bytes()) and bars(path.read_bytes())["live"] == 2
    blanks["left"] = plots.RENDERS
    with pytest.warns(RuntimeWarning, match="came out blank 3 times"):
        plots.save_figure(fig, ctx, "bars2")
    plt.close(fig)


def test_interrupt_keeps_the_points_that_finished(ctx, shown):
    def sweep(n):
        yield point("first", 1.0)
        raise KeyboardInterrupt

    p = try_it(ctx, "sweep", sweep, n=3)
    p._widgets["interactive"].manual_button.click()
    assert [pp.point.label for pp in p.points] == ["first"]
    assert "interrupted: kept the 1 point(s)" in p._widgets["status"].value
    assert len(load_results(ctx.path)) == 1


def test_a_failing_measurement_says_why_and_keeps_earlier_points(ctx, shown):
    def measure(batch_size):
        if batch_size > 8:
            raise ParameterError("batch_size 16 does not fit")
        return point(f"bs={batch_size}", 1.0)

    p = try_it(ctx, "memory", measure, batch_size=ipywidgets.Dropdown(options=[8, 16], value=8))
    inter = p._widgets["interactive"]
    inter.manual_button.click()
    inter.kwargs_widgets[0].value = 16
    inter.manual_button.click()
    assert len(p.points) == 1 and "could not measure" in p._widgets["status"].value
    assert "does not fit" in p._widgets["status"].value
    assert not inter.manual_button.disabled  # ready for the next try


def test_unavailable_panel_disables_its_controls_in_jupyterlab(ctx, shown):
    p = try_it(ctx, "pinned", lambda size_mib: pytest.fail("must not measure"), unavailable="no accelerator",
               size_mib=[1, 64])
    inter = p._widgets["interactive"]
    assert all(w.disabled for w in inter.kwargs_widgets)
    assert "not available here" in p._widgets["status"].value


def test_the_workbooks_figures_are_not_pyplots_so_no_other_thread_draws_or_closes_them():
    """A Try it chart held only its title in JupyterLab: a widget's comm message, handled on a kernel subshell's
    thread, fired ``post_execute``, and matplotlib-inline's ``flush_figures`` rendered and closed every pyplot figure
    while the panel rendered its chart. Here a thread does what ``flush_figures`` does, as fast as it can, while
    charts are made and rendered: each keeps its bars, because the workbook's figures are not pyplot's."""
    import io
    import threading
    import time

    import matplotlib.pyplot as plt
    from matplotlib._pylab_helpers import Gcf

    from helpers.workbook import plots

    stop, flushed = threading.Event(), []

    def flush_figures():  # matplotlib_inline.backend_inline.show(close=True), without IPython's display
        while not stop.is_set():
            managers = Gcf.get_all_fig_managers()
            for manager in managers:
                manager.canvas.figure.savefig(io.BytesIO(), format="png")
                flushed.append(manager.num)
            if managers:  # as matplotlib-inline does: close("all") collects garbage, only when there is a figure
                plt.close("all")
            time.sleep(0.001)

    before = plt.get_fignums()
    flusher = threading.Thread(target=flush_figures, daemon=True)
    flusher.start()
    try:
        for _ in range(8):
            fig = plots.live_points(point("notebook", 74.0), [(point("bs=16", 24.0), False)], title="Try it: baseline")
            png, renders = plots.render_png(fig)
            assert (bars(png)["live"], bars(png)["reference"], renders) == (1, 1, 1)
    finally:
        stop.set()
        flusher.join(timeout=10)
    assert plt.get_fignums() == before and not flushed  # pyplot never held a chart, so nothing else drew one


def test_no_module_of_the_workbook_makes_a_figure_through_pyplot():
    """Every figure comes from :func:`helpers.workbook.plots.subplots` (why: the test above); a new plot function
    that calls ``plt.subplots`` or ``plt.figure`` would bring the race back."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "helpers"
    made = [f"{p.relative_to(root.parent)}:{n}" for p in sorted(root.rglob("*.py"))
            for n, line in enumerate(p.read_text().splitlines(), 1)
            if re.search(r"\b(plt|pyplot)\.(subplots|figure|subplot|axes)\(", line)]
    assert made == []
