"""The notebooks: well-formed, parameters match their specs, their links lead to the file and heading their text
names, a smoke run produces the promised records, and the cells marked NBVAL_CHECK_OUTPUT give their committed outputs
with the default parameters (nbval's lax check, tests/nbval_sanitize.cfg; `pytest notebooks/NN_....ipynb` runs nbval
itself on every cell).

Every notebook is executed once per session at the smoke profile (tests/conftest.py's ``smoke_run``) and once, up to
its last check cell, with its default parameters.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import nbformat
import papermill as pm
import pytest

from test_docs import _anchors  # GitHub's heading anchors, as the docs/ pages' links are checked

from helpers.results import load_results, verdicts
from helpers.verdict import RECOMMENDATIONS
from helpers.workbook.nbtools import is_check_cell
from helpers.experiments.registry import spec_for
from helpers.workbook.runner import discover_notebooks

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = discover_notebooks(ROOT / "notebooks")


#: Notebooks without a "Try it" panel: 00 measures nothing it could re-measure live (it reads the environment).
NO_PANEL = {"00_environment_check"}


def test_there_are_notebooks():
    assert [p.stem[:2] for p in NOTEBOOKS][:2] == ["00", "01"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_well_formed(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    # the name JupyterLab writes on opening (ipykernel's kernelspec): anything else marks the notebook modified
    from ipykernel.kernelspec import get_kernel_dict

    assert nb.metadata["kernelspec"]["display_name"] == get_kernel_dict()["display_name"]
    text = "\n".join(c.source for c in nb.cells)
    if "try_it(" not in text and path.stem not in NO_PANEL:
        pytest.fail(f"{path.stem} measures but has no 'Try it' panel (helpers.workbook.panel.try_it)")
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, "exactly one cell tagged 'parameters'"
    first_md = nb.cells[0].source
    assert first_md.startswith("# ") and "What you'll do" in first_md and "What you'll need" in first_md
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    for heading in ("## Summary", "## On your own", "## In practice", "## Further reading"):
        assert heading in text, heading
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        assert "time.time()" not in cell.source, "time with helpers.timing, not time.time()"
        assert "interact_manual" not in cell.source
        assert not any(o.get("output_type") == "error" for o in cell.outputs)
        if cell.outputs:
            assert cell.execution_count is not None and is_check_cell(cell), \
                "only NBVAL_CHECK_OUTPUT cells keep outputs (python -m helpers.workbook.nbtools clean)"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_parameters_cell_matches_spec(path):
    declared = pm.inspect_notebook(str(path))
    spec = {p.name: p for p in spec_for(path.stem)}
    assert set(declared) == set(spec)
    for name, info in declared.items():
        assert info["inferred_type_name"] == spec[name].kind.__name__, name
        assert info["help"], f"{name} needs a comment"
        assert eval(info["default"]) == spec[name].default, name  # literals only


# smoke_run (every notebook at the smoke profile, once per session) and baseline_run (notebook 01: the smoke run's
# own when the session makes it, else 01 alone) are in tests/conftest.py, shared with the other files that read them.


@pytest.mark.notebook
def test_smoke_run_finishes_every_notebook(smoke_run):
    run_dir, state = smoke_run
    failed = {n.id: n.error for n in state.notebooks if n.status != "ok"}
    assert not failed, failed
    assert {n.id for n in state.notebooks} == {p.stem for p in NOTEBOOKS}
    saved = json.loads((run_dir / "run.json").read_text())
    assert saved["status"] == "ok" and all(n["duration_s"] > 0 for n in saved["notebooks"])


@pytest.mark.notebook
def test_smoke_run_records_a_verdict_per_notebook(smoke_run):
    run_dir, _ = smoke_run
    df = load_results(run_dir / "results.jsonl")
    verdicts = df[df["experiment"] == "verdict"]
    assert set(verdicts["notebook"]) == {p.stem for p in NOTEBOOKS}
    for _, v in verdicts.iterrows():
        assert v["metric"] and v["unit"] and v["reason"]
        assert v["recommendation"] in RECOMMENDATIONS  # "inconclusive" when the machine was busy
        assert isinstance(v["extra"].get("machine"), dict), "every verdict carries the machine's state"


@pytest.mark.notebook
def test_smoke_run_verdicts_that_decide_a_setting_carry_it_as_fields(smoke_run):
    """Each notebook that decides an optimization or a setting records the action as fields (nothing parses prose)."""
    from helpers.verdict import Verdict

    run_dir, _ = smoke_run
    deciding = {"02", "03", "04", "05", "06", "07", "08", "09"}
    for _, row in verdicts(load_results(run_dir / "results.jsonl")).iterrows():
        v = Verdict.from_record(row.to_dict())
        if v.notebook[:2] in deciding and v.recommendation in ("enable", "leave off"):
            assert v.action is not None and v.action.text, v.notebook


#: Notebook 01's measured labels (its verdict is a share of the step: inconclusive whenever the machine was busy).
BASELINE_LABELS = ("host-bound", "balanced", "device-bound")


def assert_label_unless_busy(verdict, labels) -> None:
    """A measured verdict's label follows the machine state recorded with it: "inconclusive" exactly when that state
    says busy (and the guard did not let a ratio whose interval cleared its threshold stand), else one of
    ``labels``; the measured label is one of ``labels`` either way. ``verdict``: a verdict record (a row)."""
    state = verdict["extra"]["machine"]
    if state["busy"] and not state.get("verdict_stands"):
        assert verdict["recommendation"] == "inconclusive", (verdict["recommendation"], state)
        assert verdict["extra"]["measured_recommendation"] in labels
        assert verdict["reason"].startswith("measured on a busy machine")
    else:
        assert verdict["recommendation"] in labels, (verdict["recommendation"], state)


@pytest.mark.notebook
@pytest.mark.busy_safe
def test_baseline_verdict_is_inconclusive_exactly_when_the_machine_was_busy(baseline_run):
    run_dir, state = baseline_run  # notebook 01 alone, or the session's smoke run (01 among the others)
    assert state.status == "ok", {n.id: n.error for n in state.notebooks if n.status != "ok"}
    df = load_results(run_dir / "results.jsonl")
    b = df[df["notebook"] == "01_baseline_profiling"]
    verdict = b[b["experiment"] == "verdict"].iloc[-1]
    assert verdict["notebook"] == "01_baseline_profiling" and 0 < verdict["value"] < 1
    assert not verdict["extra"]["machine"].get("verdict_stands")  # a share never stands on a busy machine
    assert_label_unless_busy(verdict, BASELINE_LABELS)
    recorded = b[b["experiment"] == "machine state"].iloc[-1]
    assert bool(recorded["extra"]["busy"]) == bool(verdict["extra"]["machine"]["busy"])
    md = (run_dir / "report.md").read_text()
    assert any(label in md for label in BASELINE_LABELS)  # the measured label is shown, inconclusive or not


@pytest.mark.notebook
def test_the_trace_of_notebook_01_gives_its_own_verdict(smoke_run):
    """Ground truth for ``python -m helpers trace``: the trace notebook 01 wrote of the built-in job, read back."""
    from trace_agreement import assert_trace_agrees, trace_agreement

    run_dir, _ = smoke_run
    print("built-in job: timed %.3f, traced %.3f, %s / %s, busy %s" % trace_agreement(run_dir))
    assert_trace_agrees(run_dir)


@pytest.mark.notebook
def test_smoke_run_baseline_records(smoke_run):
    run_dir, _ = smoke_run
    df = load_results(run_dir / "results.jsonl")
    b = df[df["notebook"] == "01_baseline_profiling"]
    per_image = b[(b["experiment"] == "preprocess") & (b["metric"] == "time_per_image")]
    assert len(per_image) == 1 and per_image["value"].iloc[0] > 0 and per_image["repeats"].iloc[0] == 12
    phases = b[(b["experiment"] == "baseline step") & (b["metric"] == "time_per_step")]
    assert set(phases["variant"]) == {"data", "h2d", "compute", "step"}
    med = dict(zip(phases["variant"], phases["value"]))
    assert med["data"] > 0 and med["compute"] > 0
    assert med["step"] == pytest.approx(med["data"] + med["h2d"] + med["compute"], rel=0.35)
    verdict = b[b["experiment"] == "verdict"].iloc[-1]
    assert verdict["metric"] == "exposed_input_fraction" and 0 < verdict["value"] < 1
    assert_label_unless_busy(verdict, BASELINE_LABELS)  # a busy machine makes it inconclusive, and only then
    for r in b.itertuples():
        assert r.device and r.device.startswith("cpu") and r.versions.get("torch")
        assert r.parameters.get("batch_size") == 8


@pytest.mark.notebook
def test_smoke_run_report_shows_verdicts_and_figures(smoke_run):
    run_dir, _ = smoke_run
    html = (run_dir / "report.html").read_text()
    md = (run_dir / "report.md").read_text()
    assert "id='checklist'" in html and "data:image/png;base64," in html
    assert any(label in md for label in BASELINE_LABELS)  # also when inconclusive: "What it measured: host-bound"
    figs = sorted(p.name for p in (run_dir / "figures").glob("*.png"))
    assert "01_baseline_profiling__phase_breakdown.png" in figs
    assert "01_baseline_profiling__step_timeline.png" in figs
    assert any((run_dir / "artifacts" / "01_baseline_profiling" / "profile").rglob("*.json"))


@pytest.mark.notebook
def test_bad_parameter_stops_the_notebook_before_any_work(tmp_path):
    out = tmp_path / "bad.ipynb"
    with pytest.raises(pm.PapermillExecutionError) as exc:
        pm.execute_notebook(str(ROOT / "notebooks" / "01_baseline_profiling.ipynb"), str(out),
                            parameters={"batch_size": "-4", "device": "gpu", "out_dir": str(tmp_path)},
                            kernel_name="python3", progress_bar=False, cwd=str(ROOT / "notebooks"))
    err = exc.value
    assert err.ename == "ParameterError"
    assert "batch_size" in err.evalue and "-4" in err.evalue and "'gpu'" in err.evalue and "cuda" in err.evalue
    executed = nbformat.read(out, as_version=4)
    params_at = next(i for i, c in enumerate(executed.cells) if "injected-parameters" in c.metadata.get("tags", []))
    # the first code cell after the parameters is the one that failed: no data was loaded
    assert err.cell_index <= params_at + 2
    assert not (tmp_path / "results.jsonl").exists() or not (tmp_path / "results.jsonl").read_text()


@pytest.mark.notebook
def test_smoke_run_notebooks_show_their_figures(smoke_run):
    run_dir, _ = smoke_run
    nb = nbformat.read(run_dir / "01_baseline_profiling.ipynb", as_version=4)
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 3, "figures are drawn inline in the executed notebook"
    # each with alternative text, which every notebook's web page keeps (no "Alternative text is missing" warning)
    assert all(o.metadata.get("image/png", {}).get("alt", "").startswith("Chart: ") for o in images)
    pages = sorted(run_dir.glob("[0-9][0-9]_*.html"))
    assert pages and not [p.name for p in pages if "No description has been provided for this image" in p.read_text()]


@pytest.mark.notebook
def test_smoke_run_every_try_it_panel_draws_its_bars(smoke_run):
    """Every notebook's "try it" chart holds bars (its pixels read), not a blank or bar-less image."""
    import base64

    from chart_pixels import bars

    run_dir, _ = smoke_run
    seen = {}
    for path in sorted(run_dir.glob("[0-9][0-9]_*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        cell = next((c for c in nb.cells if c.cell_type == "code" and "try_it(" in c.source), None)
        if cell is None:
            continue
        text = "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream")
        if "not available here" in text:
            seen[path.stem[:2]] = "not available"
            continue
        pngs = [o["data"]["image/png"] for o in cell.outputs if "image/png" in o.get("data", {})]
        assert pngs, f"{path.stem}: the try-it cell shows no chart (outputs: {text[:300]!r})"
        counted = bars(base64.b64decode(pngs[-1]))
        assert counted["live"] >= 1, f"{path.stem}: the try-it chart has no bar of the live point: {counted}"
        seen[path.stem[:2]] = counted
    assert len(seen) >= 9, f"expected a try-it panel in notebooks 01-10, found {sorted(seen)}"


# ---------------------------------------------------------------- the committed outputs (what nbval checked)

#: nbval's keys that are never compared (nbval 0.11's IPyNbFile.skip_compare, images included: no --nbdime).
SKIP_COMPARE = ("metadata", "traceback", "prompt_number", "output_type", "name", "execution_count",
                "application/vnd.jupyter.widget-view+json", "image/png", "image/jpeg")


def _comparable(outputs, patterns) -> dict[str, list]:
    """``outputs`` as nbval lax mode compares them: streams coalesced, every key but :data:`SKIP_COMPARE` (``data``
    flattened into its MIME types), each value passed through the sanitize ``patterns`` (tests/nbval_sanitize.cfg)."""
    import re
    from collections import defaultdict

    from nbval.plugin import coalesce_streams, transform_streams_for_comparison

    def clean(value):
        if isinstance(value, str):
            for regex, replace in patterns.items():
                value = re.sub(regex, replace, value)
        return value

    out = defaultdict(list)
    for o in transform_streams_for_comparison(coalesce_streams([nbformat.from_dict(o) for o in outputs])):
        for key, value in o.items():
            if key == "data":
                for mime, v in value.items():
                    if mime not in SKIP_COMPARE:
                        out[mime].append(clean(v))
            elif key not in SKIP_COMPARE:
                out[key].append(clean(value))
    return dict(out)


@pytest.mark.notebook
@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_check_cells_give_their_committed_outputs(path):
    """What ``pytest --nbval-lax notebooks/`` checks, in one kernel per notebook with its default parameters: every
    cell up to the last ``NBVAL_CHECK_OUTPUT`` cell runs without an error, and each check cell's outputs equal the
    committed ones after tests/nbval_sanitize.cfg. The cells after the last check cell (the long measurements) are not
    run here: the session's smoke run runs every cell of every notebook (test_smoke_run_finishes_every_notebook).
    ``pytest notebooks/NN_....ipynb`` still runs nbval itself on all cells (pyproject's addopts)."""
    from nbclient import NotebookClient
    from nbval.plugin import get_sanitize_patterns

    patterns = dict(get_sanitize_patterns((ROOT / "tests" / "nbval_sanitize.cfg").read_text()))
    committed = nbformat.read(path, as_version=4)
    last = max(i for i, c in enumerate(committed.cells) if c.cell_type == "code" and is_check_cell(c))
    nb = copy.deepcopy(committed)
    nb.cells = nb.cells[: last + 1]
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
    NotebookClient(nb, timeout=900, kernel_name="python3", allow_errors=False,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    for i, (ref, ran) in enumerate(zip(committed.cells, nb.cells)):
        if ref.cell_type == "code" and is_check_cell(ref):
            assert _comparable(ran.outputs, patterns) == _comparable(ref.outputs, patterns), \
                f"{path.stem} cell {i}: the outputs differ from the committed ones (refresh: python -m " \
                f"helpers.workbook.nbtools refresh notebooks/{path.name})"


#: Markdown words per line of code a notebook may have: numpy-tutorials runs 21-24 and d2l-en 14-19 (counted the same
#: way on numpy/numpy-tutorials and d2l-ai/d2l-en); the prose a learner does not need to run the cell in front of
#: them lives in docs/notebook_notes.md.
MAX_WORDS_PER_CODE_LINE = 24


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem[:2])
def test_the_text_between_cells_stays_short(nb):
    import re

    cells = nbformat.read(nb, as_version=4).cells
    words = sum(len(re.findall(r"\S+", c.source)) for c in cells if c.cell_type == "markdown")
    code = sum(1 for c in cells if c.cell_type == "code" for line in c.source.splitlines()
               if line.strip() and not line.strip().startswith("#"))
    assert words / code <= MAX_WORDS_PER_CODE_LINE, (
        f"{nb.name}: {words} words of text for {code} lines of code ({words / code:.1f} a line); move what a learner "
        "does not need to run the next cell to docs/notebook_notes.md")


# --------------------------------------------------------------------------- links in the text

_LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")
_NAMED_FILE = re.compile(r"[\w./-]+\.(?:md|ipynb)\b")


def _link_faults(nb: Path, markdown: str) -> list[str]:
    """What is wrong with the relative links of one markdown cell of ``nb``: a target file that is missing, an anchor
    that is no heading of the .md file it names, link text naming another file (``.md`` or ``.ipynb``) than the
    target. Anchors into a notebook are not checked (JupyterLab's anchors are not GitHub's)."""
    faults = []
    for text, target in _LINK.findall(re.sub(r"```.*?```", "", markdown, flags=re.S)):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        dest = (nb.parent / path).resolve() if path else nb.resolve()
        if not dest.exists():
            faults.append(f"{target}: no such file")
            continue
        if anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            faults.append(f"{target}: no such heading in {dest.name}")
        for named in _NAMED_FILE.findall(text):
            parts = Path(named).parts
            if (nb.parent / named).resolve() != dest and dest.parts[-len(parts):] != parts:
                faults.append(f"[{text}]({target}): the text names {named}, the link leads to {dest.name}")
    return faults


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem[:2])
def test_relative_links_lead_to_a_file_and_a_heading_their_text_names(nb):
    faults = [f"cell {c.get('id')}: {fault}" for c in nbformat.read(nb, as_version=4).cells
              if c.cell_type == "markdown" for fault in _link_faults(nb, c.source)]
    assert not faults, f"{nb.name}:\n" + "\n".join(faults)


def test_the_link_check_finds_text_naming_another_file_and_a_missing_target_or_heading():
    nb = NOTEBOOKS[0]
    assert _link_faults(nb, "[notes](../docs/notebook_notes.md#05-stream-overlap), [docs/tune.md](../docs/tune.md), "
                            "[notebook_notes.md](../docs/notebook_notes.md), [web](https://pytorch.org/x.md)") == []
    faults = _link_faults(nb, "[docs/notebooks.md](../docs/notebook_notes.md#05-stream-overlap) "
                              "[notes](../docs/no_such_page.md) [notes](../docs/notebook_notes.md#no-such-heading)")
    assert faults == ["[docs/notebooks.md](../docs/notebook_notes.md#05-stream-overlap): the text names "
                      "docs/notebooks.md, the link leads to notebook_notes.md",
                      "../docs/no_such_page.md: no such file",
                      "../docs/notebook_notes.md#no-such-heading: no such heading in notebook_notes.md"]
