"""The run report: checklist, overall verdict, embedded figures, and missing or damaged inputs."""

from __future__ import annotations

import base64
import io
import json
import re
import shlex
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from PIL import Image

from helpers.results import ResultsStore
from helpers.workbook import report
from helpers.workbook.cli import _parser, main
from helpers.verdict import Action, Verdict
from helpers.verdict import HEADLINE_CHARS
from helpers.workbook.report import checklist_items, collect, headline, overall_verdict, to_html, to_markdown
from helpers.workbook.report.collect import _advice

IDS = {
    "00": "00_environment_check", "01": "01_baseline_profiling", "02": "02_batched_decode",
    "07": "07_channels_last", "10": "10_end_to_end",
}


def _png(path: Path, color=(30, 120, 200), size=(24, 16)) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, "PNG")
    path.write_bytes(buf.getvalue())
    return buf.getvalue()


def _store(run_dir: Path, nb: str) -> ResultsStore:
    return ResultsStore(run_dir / "results.jsonl", notebook=nb, device="cpu:test")


def _run_json(run_dir: Path, entries: dict, *, only=(), profile="smoke", device="cpu", status="failed"):
    nbs = [{"id": nb, "input": f"notebooks/{nb}.ipynb", "output": str(run_dir / f"{nb}.ipynb"),
            "parameters": {}, "status": st, "duration_s": 1.5, "error": err}
           for nb, (st, err) in entries.items()]
    (run_dir / "run.json").write_text(json.dumps({
        "run_dir": str(run_dir), "profile": profile, "device": device, "resolved_device": "cpu:test",
        "only": list(only), "started": "2025-01-01T00:00:00+00:00", "status": status, "duration_s": 12.0,
        "notebooks": nbs}))


@pytest.fixture
def partial_run(tmp_path):
    """A run of 00, 01, 02, 07, 10 (--only): 02 failed in cell 3; the others recorded verdicts; 01 has a figure."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    s = _store(run_dir, IDS["00"])
    s.add("host", "cpu", "usable_cores", 2, "cores")
    s.verdict(metric="invalid_env_settings", value=0, unit="settings", recommendation="not applicable",
              reason="0 invalid environment settings")
    s = _store(run_dir, IDS["01"])
    s.add("step", "baseline", "step_time", 0.2, "s", repeats=20, spread={"p25": 0.19, "p75": 0.21})
    s.verdict(metric="exposed_input_fraction", value=0.8, unit="fraction", recommendation="host-bound",
              reason="the device waits for input 80% of each step", spread={"p25": 0.78, "p75": 0.83}, repeats=20)
    s = _store(run_dir, IDS["07"])
    s.verdict(metric="speedup", value=1.26, unit="x", recommendation="enable", reason="channels_last 1.26x faster",
              spread={"ci_low": 1.14, "ci_high": 1.40, "confidence": 0.95}, repeats=9)
    s = _store(run_dir, IDS["10"])
    s.verdict(metric="speedup", value=2.7, unit="x", recommendation="enable", reason="2.7x the baseline, same learning",
              spread={"ci_low": 2.5, "ci_high": 2.9, "confidence": 0.95}, repeats=5)
    fig = _png(run_dir / "figures" / f"{IDS['01']}__phase_breakdown.png")
    for nb in (IDS["00"], IDS["01"], IDS["02"]):
        (run_dir / f"{nb}.ipynb").write_text("{}")
    err = {"type": "PapermillExecutionError", "ename": "RuntimeError", "evalue": "boom",
           "message": "RuntimeError: boom", "cell_index": 3}
    _run_json(run_dir, {IDS["00"]: ("ok", None), IDS["01"]: ("ok", None), IDS["02"]: ("failed", err),
                        IDS["07"]: ("ok", None), IDS["10"]: ("ok", None)},
              only=("00", "01", "02", "07", "10"))
    return run_dir, fig


class _Doc(HTMLParser):
    """Collects the checklist rows, every img src, href, id and script tag of a page."""

    def __init__(self):
        super().__init__()
        self.rows, self.imgs, self.hrefs, self.ids, self.scripts, self.stylesheets = [], [], [], set(), 0, 0
        self._in_checklist = False
        self._row = None
        self._cell = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids.add(a["id"])
        if tag == "table" and a.get("id") == "checklist":
            self._in_checklist = True
        elif tag == "tr" and self._in_checklist and "data-notebook" in a:
            self._row = {"id": a["data-notebook"], "cells": [], "hrefs": [], "badges": []}
        elif tag == "td" and self._row is not None:
            self._cell = []
        elif tag == "img":
            self.imgs.append(a.get("src", ""))
        elif tag == "script":
            self.scripts += 1
        elif tag == "link" and a.get("rel") == "stylesheet":
            self.stylesheets += 1
        if tag == "a" and "href" in a:
            self.hrefs.append(a["href"])
            if self._row is not None:
                self._row["hrefs"].append(a["href"])
        if tag == "span" and self._row is not None and "badge" in (a.get("class") or ""):
            self._row["badges"].append(a["class"])

    def handle_endtag(self, tag):
        if tag == "td" and self._row is not None and self._cell is not None:
            self._row["cells"].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.rows.append(self._row)
            self._row = None
        elif tag == "table":
            self._in_checklist = False

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def _parse(text: str) -> _Doc:
    doc = _Doc()
    doc.feed(text)
    return doc


def _cli_accepts(command: str):
    """Parse a `<this interpreter> -m helpers ...` command with the real command-line parser (flags must exist).

    The report names the interpreter that wrote it by its absolute path, so the command works from a fresh shell
    where `python` may be the system's."""
    argv = shlex.split(command)
    assert argv[:3] == [sys.executable, "-m", "helpers"], command
    return _parser().parse_args(argv[3:])


# --------------------------------------------------------------------------- the first screen


def test_overall_verdict_states_baseline_and_end_to_end_speedup(partial_run):
    run_dir, _ = partial_run
    rep = collect(run_dir)
    assert overall_verdict(rep) == "host-bound baseline → 2.70x faster end to end (95% CI 2.50–2.90)"
    assert overall_verdict(rep) in to_html(rep) and overall_verdict(rep) in to_markdown(rep)


def test_overall_verdict_without_notebook_10_gives_the_baseline_state(tmp_path):
    s = _store(tmp_path, IDS["01"])
    s.verdict(metric="exposed_input_fraction", value=0.67, unit="fraction", recommendation="host-bound",
              reason="waits 67%")
    assert overall_verdict(collect(tmp_path)) == ("host-bound baseline (exposed input 67% of each step); "
                                                  "end to end not measured yet (notebook 10)")


def test_overall_verdict_names_a_balanced_baseline(tmp_path):
    """The third label of helpers.bottleneck reaches the first screen and its badge like the other two."""
    _store(tmp_path, IDS["01"]).verdict(metric="exposed_input_fraction", value=0.2, unit="fraction",
                                        recommendation="balanced", reason="the compute is the larger lever")
    rep = collect(tmp_path)
    assert overall_verdict(rep) == ("balanced baseline (exposed input 20% of each step); end to end not measured "
                                    "yet (notebook 10)")
    assert "badge b-balanced" in to_html(rep) and ".b-balanced{" in to_html(rep)


def _ablated_enable(tmp_path, low, high):
    _store(tmp_path, "06_mixed_precision").add_verdict(Verdict(
        notebook="06_mixed_precision", metric="speedup", value=1.3, unit="x", recommendation="enable",
        reason="1.30x", action=Action("autocast_dtype", "bfloat16", "bf16 autocast: enable")))
    ablation = {"mixed_precision": {"decision": "keep it", "contribution": 1.03, "ci_low": low, "ci_high": high,
                                    "phases": "compute", "phase_contribution": 1.12, "phase_low": 1.04,
                                    "phase_high": 1.2}}
    _store(tmp_path, IDS["10"]).verdict(metric="speedup", value=1.5, unit="x", recommendation="enable", reason="r",
                                        ablation=ablation)
    return dict(_advice(collect(tmp_path)))["Enable on this machine"]


def test_confirmed_end_to_end_only_when_the_whole_step_interval_excludes_1(tmp_path):
    """Issue 21: "confirmed end to end by notebook 10" beside a whole-step 1.03x (95% CI 0.95-1.17)."""
    unconfirmed = _ablated_enable(tmp_path / "a", 0.95, 1.17)
    assert "confirmed end to end by notebook 10" not in unconfirmed
    assert "not confirmed end to end (whole step 95% CI 0.95–1.17 includes 1)" in unconfirmed
    assert "compute phase 1.12x" in unconfirmed  # the phase gain it was kept for is still shown
    confirmed = _ablated_enable(tmp_path / "b", 1.01, 1.17)
    assert "bf16 autocast: enable (confirmed end to end by notebook 10: contribution" in confirmed
    assert "not confirmed" not in confirmed


def test_overall_verdict_does_not_call_a_job_that_computes_otherwise_or_a_polluted_run_faster(tmp_path):
    _store(tmp_path, IDS["01"]).verdict(metric="exposed_input_fraction", value=0.73, unit="fraction",
                                        recommendation="host-bound", reason="r")
    _store(tmp_path, IDS["10"]).verdict(metric="speedup", value=3.53, unit="x", recommendation="leave off",
                                        reason="faster but the loss differs", learning_ok=False,
                                        spread={"ci_low": 2.08, "ci_high": 4.07, "confidence": 0.95})
    assert overall_verdict(collect(tmp_path)) == (
        "host-bound baseline → leave off: 3.53x end to end (95% CI 2.08–4.07), but its loss differs from the "
        "baseline's")
    _store(tmp_path, IDS["10"]).verdict(metric="speedup", value=9.57, unit="x", recommendation="inconclusive",
                                        reason="inconclusive: the machine's speed changed",
                                        spread={"ci_low": 9.0, "ci_high": 10.0, "confidence": 0.95})
    assert overall_verdict(collect(tmp_path)) == ("host-bound baseline → end to end inconclusive, machine busy or "
                                                  "its speed changed: rerun when quiet (9.57x)")
    # notebook 10's own "inconclusive" on a quiet machine (issue 36): its interval spans 1, no busy machine to blame
    _store(tmp_path, IDS["10"]).verdict(metric="speedup", value=2.02, unit="x", recommendation="inconclusive",
                                        reason="not decided: the interval spans 1",
                                        spread={"ci_low": 0.40, "ci_high": 10.19, "confidence": 0.95})
    assert overall_verdict(collect(tmp_path)) == (
        "host-bound baseline → end to end inconclusive: 2.02x (95% CI 0.40–10.19) spans 1; rerun with --patience")
    assert len(overall_verdict(collect(tmp_path))) <= HEADLINE_CHARS


def test_overall_verdict_says_the_job_diverges_when_notebook_01_does(tmp_path):
    _store(tmp_path, IDS["01"]).verdict(metric="exposed_input_fraction", value=0.73, unit="fraction",
                                        recommendation="inconclusive", reason="your job diverges: its loss is nan",
                                        divergence={"baseline": None, "baseline_diverged": True, "first": {}})
    assert overall_verdict(collect(tmp_path)).startswith("your job diverges: its loss becomes NaN or infinite in "
                                                         "notebook 01's baseline")


def test_checklist_has_every_item_in_order_with_effect_badge_and_links(partial_run):
    run_dir, _ = partial_run
    doc = _parse(to_html(run_dir))
    assert [r["cells"][0] for r in doc.rows] == [name for _, name in checklist_items()]
    by_id = {r["id"]: r for r in doc.rows}
    ch = by_id[IDS["07"]]
    assert ch["cells"][1] == "1.26x (95% CI 1.14–1.40)"
    assert ch["cells"][2] == "enable" and "b-enable" in ch["badges"][0]
    assert by_id[IDS["01"]]["cells"][1] == "80% (IQR 78%–83%)"
    assert "b-host-bound" in by_id[IDS["01"]]["badges"][0]
    # links: the section anchor (which exists) and the executed notebook, relative to the run folder
    for row in doc.rows:
        assert row["hrefs"][0] == f"#{row['id']}" and row["id"] in doc.ids
    assert by_id[IDS["01"]]["hrefs"][1] == f"{IDS['01']}.ipynb"
    assert (run_dir / by_id[IDS["01"]]["hrefs"][1]).is_file()
    assert len(by_id[IDS["07"]]["hrefs"]) == 1  # no executed notebook in the folder: no dangling link


def test_html_is_self_contained_and_embeds_the_figure_bytes(partial_run):
    run_dir, fig = partial_run
    text = to_html(run_dir)
    doc = _parse(text)
    assert doc.scripts == 0 and doc.stylesheets == 0 and "<style>" in text
    assert len(doc.imgs) == 1
    prefix = "data:image/png;base64,"
    assert doc.imgs[0].startswith(prefix) and base64.b64decode(doc.imgs[0][len(prefix):]) == fig
    assert not [h for h in doc.hrefs if re.match(r"^[a-z]+://", h)]
    assert "max-width:100%" in text


def test_markdown_has_checklist_sections_and_relative_figure_links(partial_run):
    run_dir, _ = partial_run
    md = to_markdown(run_dir)
    assert "| [channels_last](#07_channels_last) | 1.26x (95% CI 1.14–1.40) | **enable** |" in md
    assert f"![phase_breakdown](figures/{IDS['01']}__phase_breakdown.png)" in md
    for nb_id in IDS.values():
        assert f'<a id="{nb_id}"></a>' in md


# --------------------------------------------------------------------------- missing results


def test_failed_notebook_says_where_and_how_to_rerun(partial_run):
    run_dir, _ = partial_run
    rep = collect(run_dir)
    sec = next(s for s in rep.sections if s.id == IDS["02"])
    assert sec.verdict is None and sec.status == "failed"
    # no execution count and no readable executed notebook: the runner's cell index is all there is
    assert "Failed at cell 3: RuntimeError: boom." in sec.missing and f"logs/{IDS['02']}.log" in sec.missing
    cmd = re.search(r"`([^`]+)`", sec.missing).group(1)
    args = _cli_accepts(cmd)
    assert args.resume and Path(args.out).resolve() == run_dir.resolve()
    doc = _parse(to_html(rep))
    row = next(r for r in doc.rows if r["id"] == IDS["02"])
    assert row["cells"][2] == "failed" and "b-failed" in row["badges"][0]


def test_notebook_outside_the_run_gets_the_command_that_produces_it(partial_run):
    run_dir, _ = partial_run
    rep = collect(run_dir)
    sec = next(s for s in rep.sections if s.number == "03")
    assert sec.status == "not in run" and sec.verdict is None
    assert "selected only notebooks 00 01 02 07 10 (--only)" in sec.missing
    cmd = re.search(r"`([^`]+)`", sec.missing).group(1)
    args = _cli_accepts(cmd)
    assert (args.only, args.profile, args.device, args.resume) == (["03"], "smoke", "cpu", False)
    assert f"`{cmd}`" in to_markdown(rep)
    assert f"<code>{cmd}</code>" in to_html(rep)


def test_records_without_run_json(tmp_path):
    s = _store(tmp_path, IDS["01"])
    s.verdict(metric="exposed_input_fraction", value=0.5, unit="fraction", recommendation="host-bound", reason="r")
    rep = collect(tmp_path)
    assert rep.state == {} and len(rep.sections) == len(checklist_items())
    sec = next(s for s in rep.sections if s.number == "05")
    cmd = re.search(r"`([^`]+)`", sec.missing).group(1)
    assert _cli_accepts(cmd).only == ["05"]
    assert "records only" in to_html(rep)


def test_empty_results_file(tmp_path):
    (tmp_path / "results.jsonl").write_text("")
    _run_json(tmp_path, {IDS["00"]: ("ok", None)}, only=("00",), status="ok")
    rep = collect(tmp_path)
    sec = rep.sections[0]
    assert sec.id == IDS["00"] and sec.verdict is None
    assert "holds no records for it" in sec.missing
    assert overall_verdict(rep) == "no baseline measured yet (notebook 01); run status: ok"
    html_text, md = to_html(rep), to_markdown(rep)
    assert "holds no records for it" in html_text and "holds no records for it" in md


def test_no_results_file_at_all(tmp_path):
    _run_json(tmp_path, {IDS["00"]: ("pending", None)}, status="interrupted")
    rep = collect(tmp_path)
    assert any("no results.jsonl" in n for n in rep.notes)
    assert "Did not finish (status: pending)" in rep.sections[0].missing


def test_truncated_last_line_is_left_out_and_said(partial_run):
    run_dir, _ = partial_run
    path = run_dir / "results.jsonl"
    before = collect(run_dir)
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines) + "\n" + lines[-1][: len(lines[-1]) // 2])  # a write cut short
    rep = collect(run_dir)
    assert rep.notes == ("1 line(s) of results.jsonl could not be read (cut off by an interrupted write, "
                         "or not a valid record) and are left out.",)
    assert [s.verdict for s in rep.sections] == [s.verdict for s in before.sections]
    assert rep.notes[0] in to_html(rep) and rep.notes[0] in to_markdown(rep)


def test_corrupted_run_json_is_reported_not_raised(partial_run):
    run_dir, _ = partial_run
    (run_dir / "run.json").write_text('{"notebooks": [')
    rep = collect(run_dir)
    assert rep.state == {} and "run.json could not be read" in rep.notes[0]
    assert next(s for s in rep.sections if s.number == "07").verdict["value"] == 1.26
    to_html(rep), to_markdown(rep)


def test_missing_broken_and_absent_figures(partial_run):
    run_dir, _ = partial_run
    figs = run_dir / "figures"
    (figs / f"{IDS['07']}__empty.png").write_bytes(b"")
    (figs / f"{IDS['07']}__text.png").write_text("not a png")
    _png(figs / f"{IDS['07']}__ok.png")
    (figs / f"{IDS['07']}__gone.png").symlink_to(figs / "deleted.png")  # the file it names is missing
    rep = collect(run_dir)
    sec = next(s for s in rep.sections if s.id == IDS["07"])
    assert [p.name for p, _ in sec.figures] == [f"{IDS['07']}__ok.png"]
    bad = {p.name.split("__")[1]: why for p, why in sec.bad_figures}
    assert set(bad) == {"empty.png", "text.png", "gone.png"} and "missing" in bad["gone.png"]
    html_text = to_html(rep)
    assert html_text.count("could not be shown") == 3
    assert len(_parse(html_text).imgs) == 2  # 01's figure and 07's readable one
    # a notebook with a verdict but no figure says so
    assert f"No figure was saved (figures/{IDS['10']}__*.png)" in html_text


def test_write_report_through_the_command_line(partial_run, capsys):
    run_dir, _ = partial_run
    assert main(["report", str(run_dir)]) == 0
    assert (run_dir / "report.html").stat().st_size > 0 and (run_dir / "report.md").stat().st_size > 0
    assert str(run_dir / "report.html") in capsys.readouterr().out


def test_report_command_on_a_full_disk_keeps_the_old_report_and_says_so(partial_run, capsys, monkeypatch):
    import errno
    import os

    run_dir, _ = partial_run
    assert main(["report", str(run_dir)]) == 0
    before = (run_dir / "report.md").read_bytes(), (run_dir / "report.html").read_bytes()

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)  # every whole-file write (helpers.fsutil.write_atomic) meets a full disk
    capsys.readouterr()
    assert main(["report", str(run_dir)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: the report could not be written in {run_dir}: No space left on device;")
    assert "Traceback" not in err
    assert ((run_dir / "report.md").read_bytes(), (run_dir / "report.html").read_bytes()) == before
    assert not [p for p in run_dir.iterdir() if p.name.endswith(".tmp")]


# --------------------------------------------------------------------------- formatting


@pytest.mark.parametrize("verdict, text", [
    (None, "—"),
    ({"value": None, "unit": "x", "recommendation": "not applicable"}, "not applicable"),
    ({"value": 2.0, "unit": "x", "spread": {"ci_low": 1.5, "ci_high": 2.5, "confidence": 0.9}},
     "2.00x (90% CI 1.50–2.50)"),
    ({"value": 0.42, "unit": "fraction", "spread": {"p25": 0.4, "p75": 0.45}}, "42% (IQR 40%–45%)"),
    ({"value": 812.0, "unit": "GB/s", "spread": None}, "812 GB/s"),
    # a "leave off" beside a large point estimate: the interval is what the recommendation rests on
    ({"value": 4.12, "unit": "x", "recommendation": "leave off", "spread": {"ci_low": 0.8, "ci_high": 9.1}},
     "no measurable effect (4.12x, 95% CI 0.80–9.10)"),
    ({"value": 1536.0, "unit": "samples", "spread": {"p25": 1500.0, "p75": 1600.0}}, "1,536 samples (IQR 1,500–1,600)"),
])
def test_headline(verdict, text):
    assert headline(verdict) == text


def test_unknown_extra_notebook_gets_its_own_section(tmp_path):
    s = _store(tmp_path, "11_custom_study")
    s.verdict(metric="m", value=1.0, unit="x", recommendation="enable", reason="custom")
    rep = collect(tmp_path)
    assert [s.id for s in rep.sections][-1] == "11_custom_study"
    assert report.to_markdown(rep).count("## ") >= len(checklist_items()) + 2


# --------------------------------------------------------------------------- failures, as the user sees them

#: run.json's error record of a notebook whose torchrun job aborted (shape of a real run's record).
DDP_ERROR = {
    "type": "PapermillExecutionError", "ename": "RuntimeError",
    "evalue": ("collective job 'ddp' (gloo, world_size=2) failed: rank 1 exited with code -6. The other ranks "
               "were stopped. Last output:\nE1129 16:10:08.550000 api.py:1002] failed (exitcode: -6)\n"
               "Traceback (most recent call last):\n  File \"/venv/lib/python3.11/site-packages/torch/run.py\", "
               "line 1032, in <module>\n    main()\ntorch.distributed.elastic.multiprocessing.errors."
               "ChildFailedError:\nRoot Cause (first observed failure):\n  exitcode  : -6 (pid: 16411)  (SIGABRT)"),
    "message": "RuntimeError: collective job 'ddp' (gloo, world_size=2) failed: rank 1 exited with code -6. "
               "The other ranks were stopped. Last output:\nE1129 16:10:08.550000 api.py:1002] failed\n"
               "  File \"/venv/lib/python3.11/site-packages/",
    "cell_index": 12, "exec_count": 8,
    "cell_source": "from helpers.comm.ddp import ddp_benchmark\n\nddp_res = None\n",
}


def _cell(kind, source, count=None, tags=()):
    c = {"cell_type": kind, "metadata": {"tags": list(tags)}, "source": source}
    if kind == "code":
        c.update(execution_count=count, outputs=[])
    return c


def _executed_08() -> dict:
    """An executed notebook as papermill leaves it after a failure: error banner cells and the failed In [8]."""
    banner = '<span id="papermill-error-cell" style="color:red">Execution using papermill encountered an exception'
    return {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
        _cell("markdown", '<span style="color:red">An Exception was encountered</span>',
              tags=["papermill-error-cell-tag"]),
        _cell("markdown", "# Measure collectives\n\nintro"),
        _cell("code", "x = 1", 1, tags=["parameters"]),
        _cell("markdown", "## 2. Allreduce bandwidth\n\ntext"),
        _cell("code", 'plots.save_figure(fig, ctx, "allreduce_bandwidth")', 7),
        _cell("markdown", "Below the crossover ...\n\n## 3. DDP on the PPO workload\n\nbuckets"),
        _cell("markdown", banner, tags=["papermill-error-cell-tag"]),
        _cell("code", DDP_ERROR["cell_source"], 8),
        _cell("code", "later()", None),
    ]}


@pytest.fixture
def failed_ddp_run(tmp_path):
    """A run whose 08 failed at In [8] (with its executed notebook) while 07 recorded a verdict."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    s = _store(run_dir, IDS["07"])
    s.verdict(metric="speedup", value=1.26, unit="x", recommendation="enable", reason="faster",
              spread={"ci_low": 1.14, "ci_high": 1.40, "confidence": 0.95})
    nb08 = "08_collectives"
    (run_dir / f"{nb08}.ipynb").write_text(json.dumps(_executed_08()))
    _run_json(run_dir, {IDS["07"]: ("ok", None), nb08: ("failed", DDP_ERROR)}, only=("07", "08"))
    return run_dir


def test_error_cause_is_the_exception_and_first_line_of_its_message():
    cause = report.error_cause(DDP_ERROR)
    assert cause == ("RuntimeError: collective job 'ddp' (gloo, world_size=2) failed: rank 1 exited with code -6. "
                     "The other ranks were stopped.")  # the dangling "Last output:" lead-in is dropped
    assert report.error_cause({"type": "CellTimeoutError", "message": "A cell timed out after 600 s."}) == \
        "CellTimeoutError: A cell timed out after 600 s."
    assert report.error_cause({"ename": "ValueError", "evalue": "\x1b[0;31mbad value\x1b[0m\nmore"}) == \
        "ValueError: bad value"
    assert report.error_cause(None) == "no error message"
    long = report.error_cause({"ename": "E", "evalue": "word " * 200})
    assert len(long) <= report.MAX_CAUSE_CHARS + 2 and long.endswith(" …") and "word wo " not in long


def test_failed_cell_is_named_as_the_notebook_shows_it():
    nb = _executed_08()
    assert report.failed_cell(DDP_ERROR, nb) == "In [8], under “3. DDP on the PPO workload”"
    # without the execution count, papermill's error marker finds the cell
    no_count = {k: v for k, v in DDP_ERROR.items() if k != "exec_count"}
    assert report.failed_cell(no_count, nb) == "In [8], under “3. DDP on the PPO workload”"
    assert report.failed_cell(DDP_ERROR, None) == "In [8]"
    assert report.failed_cell(no_count, None) == "the cell that starts `from helpers.comm.ddp import ddp_benchmark`"
    assert report.failed_cell({"cell_index": 3}, None) == "cell 3"
    assert report.failed_cell({}, None) == ""


def test_failed_notebook_gets_a_failed_bucket_cell_and_the_error_tail(failed_ddp_run):
    rep = collect(failed_ddp_run)
    sec = next(s for s in rep.sections if s.number == "08")
    assert sec.cause == report.error_cause(DDP_ERROR)
    assert sec.missing_short.startswith("Failed at In [8], under “3. DDP on the PPO workload”: RuntimeError: "
                                        "collective job 'ddp'")
    assert "site-packages" not in sec.missing_short and "site-packages" not in sec.missing
    assert sec.error_tail.endswith("exitcode  : -6 (pid: 16411)  (SIGABRT)")  # the root cause, not a cut middle
    md, html_text = to_markdown(rep), to_html(rep)
    assert f"- Failed: collectives ({sec.cause})" in md
    not_measured = next(line for line in md.splitlines() if line.startswith("- Not measured in this run:"))
    assert "collectives" not in not_measured and "environment check" in not_measured
    assert "(SIGABRT)" in md and "(SIGABRT)" in html_text
    assert "<li class=failed><b>Failed:</b> collectives (RuntimeError: collective job &#x27;ddp&#x27;" in html_text
    row = next(r for r in _parse(html_text).rows if r["id"] == "08_collectives")
    assert row["cells"][3].startswith("Failed at In [8]")


# --------------------------------------------------------------------------- figure order


def test_figures_keep_the_order_the_notebook_saved_them(failed_ddp_run, tmp_path):
    import os
    import shutil

    run_dir = failed_ddp_run
    nb = _executed_08()
    nb["cells"].insert(2, _cell("code", 'plots.save_figure(fig, ctx, "zeta plot");\nfig2 = 1', 2))
    nb["cells"].insert(3, _cell("code", "plots.save_figure(fig, ctx, 'alpha')", 3))
    (run_dir / "08_collectives.ipynb").write_text(json.dumps(nb))
    figs = run_dir / "figures"
    names = ["allreduce_bandwidth", "alpha", "zeta_plot", "unnamed_b", "unnamed_a"]
    for i, name in enumerate(names):
        _png(figs / f"08_collectives__{name}.png")
        os.utime(figs / f"08_collectives__{name}.png", (1000 + i, 1000 + i))  # file times: allreduce first
    expected = ["zeta_plot", "alpha", "allreduce_bandwidth", "unnamed_b", "unnamed_a"]

    def shown(folder):
        sec = next(s for s in collect(folder).sections if s.number == "08")
        return [p.stem.split("__", 1)[1] for p, _ in sec.figures]

    # the notebook's save_figure calls decide; figures it does not name follow by file time
    assert shown(run_dir) == expected
    md = to_markdown(run_dir)
    assert [md.index(f"__{n}.png") for n in expected] == sorted(md.index(f"__{n}.png") for n in expected)
    # a copy of the run folder (file times lost) keeps the notebook's order
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy, copy_function=shutil.copyfile)
    assert shown(copy)[:3] == expected[:3]


# --------------------------------------------------------------------------- small numbers


@pytest.mark.parametrize("value, text", [
    (0.77, "77%"), (0.025, "2.5%"), (0.0201, "2%"), (0.001, "0.1%"), (0.0005, "0.05%"),
    (0.00144, "0.14%"), (0.0, "0%"), (1e-9, "<0.001%"), (-0.003, "-0.3%"),
])
def test_small_fractions_are_not_rounded_to_zero(value, text):
    assert headline({"value": value, "unit": "fraction"}) == text


def test_fraction_records_in_tables_keep_their_digits(tmp_path):
    s = _store(tmp_path, IDS["10"])
    s.add("learning", "optimized vs baseline", "value_loss_relative_difference", 0.001, "fraction")
    s.verdict(metric="speedup", value=2.87, unit="x", recommendation="enable",
              reason="2.87x; value loss within 0.1% of the baseline's",
              spread={"ci_low": 2.53, "ci_high": 3.21, "confidence": 0.95})
    md = to_markdown(tmp_path)
    assert "| value_loss_relative_difference | 0.1% |" in md
    assert "within 0.1% of the baseline's" in md  # the reason is quoted as written
    assert "| [end to end](#10_end_to_end) | 2.87x (95% CI 2.53–3.21) | **enable** |" in md


def test_batch_size_verdict_reads_as_a_number_of_samples(tmp_path):
    s = _store(tmp_path, "09_memory_and_batch_size")
    s.verdict(metric="max_batch_size", value=256.0, unit="samples", recommendation="leave off", reason="r")
    assert "| [memory and batch size](#09_memory_and_batch_size) | 256 samples | **leave off** |" in \
        to_markdown(tmp_path)


def test_first_screen_lists_settings_not_notebooks(tmp_path):
    """The advice lists say what each verdict decides; notebook 10 (the summary) is not among them."""
    _store(tmp_path, "06_mixed_precision").verdict(
        metric="speedup", value=1.08, unit="x", recommendation="enable",
        reason="bfloat16 autocast is 1.08x faster than fp32 (95% CI 1.04-1.14)",
        action=Action("autocast_dtype", "bfloat16", "bf16 autocast: enable"))
    _store(tmp_path, "08_collectives").verdict(
        metric="busbw_at_largest_size", value=1.6, unit="GB/s", recommendation="leave off",
        reason="fp16 compression was 1.03x as fast here but not clearly faster", best_hook="none",
        action=Action("comm_hook", "none", "fp16 gradient compression: leave off"))
    _store(tmp_path, "09_memory_and_batch_size").verdict(
        metric="max_batch_size", value=96.0, unit="samples", recommendation="enable",
        reason="raise the batch to 80: 1.24x the throughput of the current 32 (95% CI 1.11-1.41)",
        action=Action("batch_size", 80, "batch size 32 → 80", current=32))
    _store(tmp_path, IDS["10"]).verdict(metric="speedup", value=2.6, unit="x", recommendation="enable", reason="r")
    advice = dict(_advice(collect(tmp_path)))
    assert advice["Enable on this machine"] == ("bf16 autocast: enable (notebook 06's isolated measurement only: not "
                                                "in notebook 10's optimized job); batch size 32 → 80")
    assert advice["Leave off (measured: no gain here)"] == "fp16 gradient compression: leave off"


def test_first_screen_lists_the_decode_once_cache_beside_batched_decode(tmp_path):
    """Notebook 02 decides two optimizations: batched decode by its verdict, the cache under extra, each listed."""
    cache = {"recommendation": "enable", "reason": "3.4x the batched decode",
             "action": Action("dataset_cache", True, "decode-once dataset cache: enable").to_dict()}
    _store(tmp_path, "02_batched_decode").verdict(
        metric="speedup", value=6.7, unit="x", recommendation="enable", reason="6.7x",
        action=Action("batched_decode", True, "batched decode + device normalize: enable"), dataset_cache=cache)
    advice = dict(_advice(collect(tmp_path)))
    assert advice["Enable on this machine"] == (
        "batched decode + device normalize: enable (notebook 02's isolated measurement only: notebook 10 did not "
        "run); decode-once dataset cache: enable (notebook 02's isolated measurement only: notebook 10 did not run)")


def test_first_screen_reads_the_action_not_the_wording(tmp_path):
    """A reason that names another setting does not change what the first screen says the verdict decides."""
    _store(tmp_path, "06_mixed_precision").verdict(
        metric="speedup", value=1.08, unit="x", recommendation="enable",
        reason="float16 autocast was measured beside bf16 autocast; current 32",
        action=Action("autocast_dtype", "bfloat16", "bf16 autocast: enable"))
    _store(tmp_path, "07_channels_last").verdict(metric="speedup", value=1.0, unit="x", recommendation="leave off",
                                                 reason="bf16 autocast and fp16 compression were also tried")
    advice = dict(_advice(collect(tmp_path)))
    assert advice["Enable on this machine"] == ("bf16 autocast: enable (notebook 06's isolated measurement only: "
                                                "notebook 10 did not run)")
    # a verdict recorded without an action (an older results file) shows its item, nothing parsed
    assert advice["Leave off (measured: no gain here)"] == "channels_last: leave off"


def test_checklist_why_is_the_first_clause_and_the_section_keeps_the_reason(tmp_path):
    long_aside = "(" + "detail " * 20 + ")"
    reason = (f"the input is hidden {long_aside}, but the step got slower: the cores cost more; "
              "why: the worker(s) cost the step CPU time " + "x" * 200)
    _store(tmp_path, "05_stream_overlap").verdict(metric="exposed_input_fraction", value=0.03, unit="fraction",
                                                  recommendation="leave off", reason=reason)
    md = to_markdown(tmp_path)
    row = next(line for line in md.splitlines() if line.startswith("| [stream overlap]"))
    assert "| the input is hidden, but the step got slower: the cores cost more |" in row
    # in the notebook's section, whole: a one-line headline (what to do, the number), then a clause per line
    section = md[md.index('<a id="05_stream_overlap">'):]
    assert "**LEAVE OFF: exposed input fraction 3%**" in section
    assert "\n- the input is hidden (detail" in section and "\n- why: the worker(s) cost the step" in section
    assert all(clause in section for clause in reason.split("; "))
    cut = report.short_reason("word " * 100)
    assert len(cut) <= report.WHY_MAX_CHARS and cut.endswith("…")


def test_record_values_units_severity_time_iqr_and_folded_sweeps(tmp_path):
    s = _store(tmp_path, "08_collectives")
    for i in range(26):
        s.add("allreduce", f"{8 << i} B", "busbw", float(i + 1) if i != 5 else 99.0, "GB/s", repeats=10,
              spread={"time_s": 2e-3, "time_p25_s": 1e-3, "time_p75_s": 3e-3})
    s.add("ddp_compression", "fp16", "grad_rel_err", 1.4e-4, "1")
    s.add("env_check", "HCCL_ALGO", "severity", 2, "level", severity="error")
    s.add("env_check", "NCCL_DEBUG", "severity", 1, "level")
    s.verdict(metric="busbw_at_largest_size", value=1.6, unit="GB/s", recommendation="leave off", reason="r")
    md = to_markdown(tmp_path)
    assert "| ddp_compression | fp16 | grad_rel_err | 0.00014 |" in md  # unit "1" left out
    assert "| env_check | HCCL_ALGO | severity | error |" in md
    assert "| env_check | NCCL_DEBUG | severity | warning |" in md
    assert "| allreduce | 8 B (first/min) | busbw | 1 GB/s | time IQR 1–3 ms | 10 |" in md
    assert f"| allreduce | {8 << 5} B (max) | busbw | 99 GB/s |" in md
    assert f"| allreduce | {8 << 25} B (last) | busbw | 26 GB/s |" in md
    assert md.count("| allreduce |") == 3  # first/min, max, last
    assert "allreduce busbw: 26 rows folded to first, last, min and max" in md
    assert "shown" not in md.split("Records (")[1].split(")")[0]


@pytest.mark.parametrize("value, low, high, expected", [
    (1.39, 0.06, 31.43, "host-bound baseline → no measurable speedup end to end (1.39x, 95% CI 0.06–31.43)"),
    (0.80, 0.70, 0.90, "host-bound baseline → slower end to end: 0.80x (95% CI 0.70–0.90)"),
    (2.10, 1.50, 2.50, "host-bound baseline → 2.10x faster end to end (95% CI 1.50–2.50)"),
])
def test_the_headline_calls_a_speedup_only_what_its_interval_supports(tmp_path, value, low, high, expected):
    _store(tmp_path, "01_baseline_profiling").verdict(metric="exposed_input_fraction", value=0.7, unit="fraction",
                                                      recommendation="host-bound", reason="r")
    _store(tmp_path, IDS["10"]).verdict(metric="speedup", value=value, unit="x", recommendation="leave off",
                                        reason="r", spread={"ci_low": low, "ci_high": high, "confidence": 0.95})
    assert overall_verdict(collect(tmp_path)) == expected


def test_the_suggested_command_keeps_the_runs_parameters(partial_run):
    run_dir, _ = partial_run
    state = json.loads((run_dir / "run.json").read_text())
    state.update(overrides=[["batch_size", "64"], ["num_workers_list", "[0, 2]"], ["autocast_dtype", "float16"]],
                 data_dir="/data/my photos")
    (run_dir / "run.json").write_text(json.dumps(state))
    sec = next(s for s in collect(run_dir).sections if s.number == "03")
    args = _cli_accepts(re.search(r"`([^`]+)`", sec.missing).group(1))
    assert args.overrides == [["batch_size", "64"], ["num_workers_list", "[0, 2]"]]  # not 06's autocast_dtype
    assert args.data_dir == "/data/my photos"
    sec04 = next(s for s in collect(run_dir).sections if s.number == "04")  # outside the run, like 03
    args04 = _cli_accepts(re.search(r"`([^`]+)`", sec04.missing).group(1))
    assert args04.overrides == [["batch_size", "64"]]  # 04 declares batch_size, not the other two


def test_try_it_rows_say_whether_they_are_headless_repeats_or_live(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    s = _store(run_dir, IDS["07"])
    s.add("try it", "bfloat16", "speedup", 1.3, "x", spread={"ci_low": 1.1, "ci_high": 1.5, "confidence": 0.95},
          interactive=False, busy=False)
    s.add("try it", "float32", "speedup", 1.0, "x", interactive=True, busy=True)
    s.verdict(metric="speedup", value=1.3, unit="x", recommendation="enable", reason="r")
    sec = next(x for x in collect(run_dir).sections if x.number == "07")
    variants = list(sec.records["variant"])
    assert "bfloat16 (headless repeat at the panel's initial values)" in variants
    assert "float32 (live, in JupyterLab; machine busy: noise)" in variants


def test_first_screen_lists_what_notebook_10_left_off_for_want_of_a_verdict(tmp_path):
    """--only 01 03 06 10: 07's channels_last (and the others without a verdict) are "not measured in this run",
    with a command that measures them and 10 together; nothing says they were enabled."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    ids = {"01": "01_baseline_profiling", "03": "03_dataloader_tuning", "06": "06_mixed_precision",
           "10": "10_end_to_end"}
    _run_json(run_dir, {nb: ("ok", None) for nb in ids.values()}, only=("01", "03", "06", "10"), status="ok")
    state = json.loads((run_dir / "run.json").read_text())
    state.update(job="/home/me/myjob.py:make_job", overrides=[["batch_size", "16"]])
    (run_dir / "run.json").write_text(json.dumps(state))
    _store(run_dir, ids["03"]).verdict(metric="speedup", value=1.4, unit="x", recommendation="enable", reason="r",
                                       action=Action("num_workers", 2, "DataLoader workers=2"))
    _store(run_dir, ids["06"]).verdict(metric="speedup", value=1.3, unit="x", recommendation="enable", reason="r",
                                       action=Action("autocast_dtype", "bfloat16", "bf16 autocast: enable"))
    _store(run_dir, ids["10"]).verdict(
        metric="speedup", value=1.2, unit="x", recommendation="enable", reason="r",
        optimizations=["dataloader_workers", "mixed_precision"],
        missing_verdicts=["02_batched_decode", "04_pinned_memory", "05_stream_overlap", "07_channels_last"])
    advice = dict(_advice(collect(run_dir)))
    missing = advice["Not measured in this run, so not enabled by notebook 10"]
    assert "channels_last (07)" in missing and "pinned_memory (04)" in missing and "batched_decode (02)" in missing
    assert "notebook 10 enables only what a verdict of this run recommended" in missing
    assert "channels_last" in advice["Not measured in this run"].split("; ")  # its notebook, outside the run
    args = _cli_accepts(re.search(r"`([^`]+)`", missing).group(1))
    assert args.only == ["01", "02", "03", "04", "05", "06", "07", "10"]  # this run's notebooks and theirs
    assert args.job == "/home/me/myjob.py:make_job" and args.overrides == [["batch_size", "16"]]
    assert "channels_last" not in advice["Enable on this machine"]
    md = to_markdown(collect(run_dir))
    first_screen = md.split("## Checklist")[0]
    assert "Not measured in this run, so not enabled by notebook 10" in first_screen
    assert "channels_last (07)" in first_screen
    # the batch size the run measured is in the first lines, and where it came from
    assert "at batch size" not in first_screen  # no verdict carried a batch size: nothing is invented
    _store_p = ResultsStore(run_dir / "results.jsonl", notebook=ids["01"], parameters={"batch_size": 16, "job": "x"})
    _store_p.verdict(metric="exposed_input_fraction", value=0.2, unit="fraction", recommendation="host-bound",
                     reason="r")
    line = next(x for x in to_markdown(collect(run_dir)).splitlines() if x.startswith("Job measured:"))
    assert "your job /home/me/myjob.py:make_job at batch size 16 (set with -p batch_size)" in line


# --------------------------------------------------------------------------- user strings in report.md

#: A job's name as a user may write it: HTML, a table pipe, backticks, emphasis and link markup.
_HOSTILE = "<script>alert(1)</script>|x`y`*b*_[l](u)__init__&amp;"


def _hostile_run(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    s = ResultsStore(run_dir / "results.jsonl", notebook=IDS["01"], device="cpu:test")
    s.add("step", _HOSTILE, "step_time", 0.2, "s", repeats=5)
    s.verdict(metric="exposed_input_fraction", value=0.8, unit="fraction", recommendation="host-bound",
              reason=f"your job {_HOSTILE} waits for input 80% of each step", spread={"p25": 0.78, "p75": 0.83},
              repeats=20, context=f"your job: {_HOSTILE}")
    err = {"type": "PapermillExecutionError", "ename": "ValueError", "evalue": f"bad sample in {_HOSTILE}",
           "message": f"ValueError: bad sample in {_HOSTILE}", "cell_index": 3}
    _run_json(run_dir, {IDS["00"]: ("failed", err), IDS["01"]: ("ok", None)}, only=("00", "01"),
              profile=f"/home/u/{_HOSTILE}.yaml")
    state = json.loads((run_dir / "run.json").read_text())
    state["job"] = f"/home/u/{_HOSTILE}.py:make_job"
    (run_dir / "run.json").write_text(json.dumps(state))
    return run_dir


def test_report_md_escapes_user_strings_so_they_render_as_text(tmp_path):
    from helpers.workbook.report.markdown import md_escape

    md = to_markdown(_hostile_run(tmp_path))
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in md
    # raw only inside the code span of a suggested command (--job '...'), where Markdown shows it as text
    outside = re.sub(r"(`+).+?\1(?!`)", "", md)
    assert "<script>" not in outside and "alert(1)</script>" not in outside
    # each place that shows the name outside a command shows it escaped, the same way
    esc = md_escape(_HOSTILE)
    for start in ("Run `run` · profile **/home/u/", "Job measured: your job /home/u/", "- Failed: environment check",
                  "- your job", "*Setting:* your job:", "| step | ", "**failed**: Failed at cell 3"):
        line = next(ln for ln in md.splitlines() if ln.startswith(start))
        assert esc in line, line
    assert md_escape(_HOSTILE) == ("&lt;script&gt;alert(1)&lt;/script&gt;\\|x\\`y\\`\\*b\\*\\_[l\\](u)\\_\\_init\\_\\_"
                                   "&amp;amp;")
    assert md_escape("batch_size 32\n# not a heading") == "batch_size 32 # not a heading"  # words stay readable
    assert md_escape("dataset[37] raised") == "dataset[37] raised" and md_escape("![x][y]") == "![x\\][y]"
    # a table row keeps its columns: no unescaped pipe from the name
    for ln in md.splitlines():
        if ln.startswith("| ") and "alert(1)" in ln:
            assert len(re.split(r"(?<!\\)\|", ln)) in (7, 8), ln  # checklist (5 cells) or records (6 cells)
    mistune = pytest.importorskip("mistune")
    page = mistune.create_markdown(escape=False, plugins=["table"])(md)  # raw HTML would pass through
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;|x`y`*b*_[l](u)__init__&amp;amp;" in page
    assert not re.search(r"<(em|strong)>(b|init|l\]\(u\))</\1>", page) and 'href="u"' not in page


def test_the_report_ends_with_notebook_10s_change_in_code(tmp_path):
    from helpers.tune.loop_diff import change_as_code

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    _run_json(run_dir, {IDS["10"]: ("ok", None)}, only=("10",), status="ok")
    diff, notes = change_as_code(["dataloader_workers", "pinned_memory", "prefetcher", "batched_decode"],
                                 device_type="cuda")
    s = _store(run_dir, IDS["10"])
    s.add("change in code", "optimized", "lines_changed", 4.0, "lines", diff=diff, notes=notes,
          text="The optimized job's changes, written into the training loop; measured above at 1.50x\n" + diff)
    md = to_markdown(run_dir)
    tail = md[md.index("## The change in your code"):]
    # a removed indented line ("-    images, ...") stays in the diff, not among the notes
    assert "-    images, labels = images.to(device), labels.to(device)" in tail.split("~~~~", 2)[1]
    assert "+for images, labels in prefetch(loader, device):" in tail
    assert "- decode each batch at once on a thread pool" in tail
    page = to_html(run_dir)
    assert "<h2>The change in your code</h2>" in page and "non_blocking=True" in page
    empty = tmp_path / "empty"
    empty.mkdir()
    _run_json(empty, {IDS["10"]: ("ok", None)}, only=("10",), status="ok")
    _store(empty, IDS["10"]).add("step time", "baseline", "time_per_step", 0.1, "s")
    assert "The change in your code" not in to_markdown(empty)


def test_the_first_screen_says_how_to_rerun_just_the_inconclusive_notebooks(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    ids = {"03": "03_dataloader_tuning", "04": "04_pinned_memory", "06": "06_mixed_precision"}
    _run_json(run_dir, {ids["03"]: ("ok", None), ids["04"]: ("ok", None), ids["06"]: ("ok", None)},
              status="ok", profile="quick")
    for nb, rec in (("03", "inconclusive"), ("04", "enable"), ("06", "inconclusive")):
        _store(run_dir, ids[nb]).verdict(metric="speedup", value=1.1, unit="x", recommendation=rec, reason="r")
    advice = dict(_advice(collect(run_dir)))
    inconclusive = next(v for k, v in advice.items() if k.startswith("Inconclusive"))
    assert "run --only 03 06 --profile quick --device cpu --patience 2" in inconclusive
    assert "04" not in inconclusive.split("run --only")[1]
