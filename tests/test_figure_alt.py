"""Figures carry alternative text: in the notebook's outputs and on the executed notebook's web page, so that
nbconvert no longer warns "Alternative text is missing on N image(s)" once per notebook of a run."""

from __future__ import annotations

import logging
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import nbformat  # noqa: E402
import pytest  # noqa: E402

from helpers.workbook.nbexec import export_html  # noqa: E402
from helpers.workbook.plots import figure_alt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_alt_text_says_the_title_and_the_axes():
    fig, (a, b) = plt.subplots(1, 2)
    fig.suptitle("Allreduce")
    a.set_title("time")
    a.set_xlabel("message size (bytes)")
    a.set_ylabel("median time (ms)")
    b.set_ylabel("bus bandwidth (GB/s)")
    assert figure_alt(fig) == ("Chart: Allreduce; time (x axis: message size (bytes); y axis: median time (ms)); "
                               "y axis: bus bandwidth (GB/s)")
    plt.close(fig)
    bare, _ = plt.subplots()
    assert figure_alt(bare, fallback="phase breakdown") == "Chart: phase breakdown"
    plt.close(bare)


#: A notebook that draws as the workbook's notebooks do: figures saved with save_figure (shown inline by it, not by
#: the inline backend) and a "Try it" panel, which headless measures once and draws its chart.
_CELLS = [
    """import os
from types import SimpleNamespace
from pathlib import Path
import matplotlib.pyplot as plt
from helpers.live import LivePoint
from helpers.results import ResultsStore
from helpers.workbook import plots
from helpers.workbook.panel import try_it
os.environ["WORKBOOK_HEADLESS"] = "1"
store = ResultsStore(Path(OUT) / "results.jsonl", notebook="99_alt", device="cpu:test")
ctx = SimpleNamespace(out_dir=Path(OUT), notebook="99_alt", figures=[], params={"busy_cpu_share": 1.0}, store=store)""",
    """fig, ax = plt.subplots()
ax.plot([1, 2, 3])
ax.set_title("Step time")
ax.set_xlabel("step")
plots.save_figure(fig, ctx, "step_time");""",
    """plots.save_figure(plt.subplots()[0], ctx, "bare_chart");""",
    """def measure(workers):
    return LivePoint(label=f"workers={workers}", value=10.0, unit="samples/s", metric="throughput")

try_it(ctx, "loader", measure, workers=[0, 1]);""",
]


@pytest.mark.notebook
def test_executed_notebook_figures_carry_alt_text_and_its_page_warns_of_none(tmp_path, caplog):
    import papermill as pm

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in _CELLS])
    nb.cells.insert(0, nbformat.v4.new_code_cell(f"OUT = {str(tmp_path)!r}"))
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    src, out = tmp_path / "in.ipynb", tmp_path / "99_alt.ipynb"
    nbformat.write(nb, src)
    pm.execute_notebook(str(src), str(out), kernel_name="python3", progress_bar=False, cwd=str(ROOT))

    executed = nbformat.read(out, as_version=4)
    images = [o for c in executed.cells for o in c.outputs if "image/png" in o.get("data", {})]
    alts = [o.metadata.get("image/png", {}).get("alt") for o in images]
    # one image per figure: save_figure closed each, so the inline backend drew none again without its text
    assert alts == ["Chart: Step time (x axis: step)", "Chart: bare chart",
                    "Chart: Try it: loader (y axis: throughput (samples/s))"]
    assert sorted(p.name for p in (tmp_path / "figures").glob("*.png")) == ["99_alt__bare_chart.png",
                                                                          "99_alt__step_time.png"]

    with caplog.at_level(logging.WARNING):
        page = export_html(out)
    assert page is not None
    html = page.read_text()
    assert "Alternative text is missing" not in caplog.text
    assert "No description has been provided for this image" not in html  # nbconvert's stand-in for a missing alt
    assert 'alt="Chart: Step time (x axis: step)"' in html
