"""One report across runs: a column per run, and disagreements classed by the runs' intervals."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.errors import ParameterError
from helpers.results import ResultsStore
from helpers.verdict import Action
from helpers.workbook.report.compare import compare_runs, write_comparison

ROOT = Path(__file__).resolve().parents[1]


def _run(folder: Path, device: str, verdicts: dict, job=None, overrides=()) -> Path:
    """A run folder as the runner leaves it: run.json and one verdict per notebook in results.jsonl."""
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"profile": "quick", "device": "auto", "resolved_device": device,
                                                 "status": "ok", "job": job, "notebooks": [],
                                                 "overrides": [list(p) for p in overrides]}))
    for nb, (value, lo, hi, rec) in verdicts.items():
        ResultsStore(folder / "results.jsonl", notebook=nb).verdict(
            metric="speedup", value=value, unit="x", recommendation=rec, reason="r",
            spread={"ci_low": lo, "ci_high": hi, "confidence": 0.95}, action=Action("s", rec == "enable", f"s: {rec}"))
    return folder


def test_disagreements_are_classed_by_the_intervals(tmp_path):
    a = _run(tmp_path / "laptop", "cpu:laptop", {"06_mixed_precision": (1.30, 1.20, 1.40, "enable"),
                                                 "07_channels_last": (1.04, 0.98, 1.10, "leave off"),
                                                 "03_dataloader_tuning": (1.5, 1.2, 1.8, "enable")})
    b = _run(tmp_path / "gpu", "cuda:H200", {"06_mixed_precision": (0.95, 0.90, 1.01, "leave off"),
                                             "07_channels_last": (1.08, 1.06, 1.12, "enable"),
                                             "03_dataloader_tuning": (1.4, 1.1, 1.6, "enable")})
    c = compare_runs([a, b])
    rows = {r.notebook: r for r in c.rows}
    assert [h["device"] for h in c.headers] == ["cpu:laptop", "cuda:H200"]
    assert rows["06_mixed_precision"].disagreement == "beyond the intervals"  # 1.20-1.40 vs 0.90-1.01
    assert rows["07_channels_last"].disagreement == "within the intervals"  # 0.98-1.10 overlaps 1.06-1.12
    assert rows["03_dataloader_tuning"].disagreement == ""  # both enable
    assert rows["06_mixed_precision"].cells[0].startswith("1.30x (95% CI 1.20–1.40) · enable")
    assert rows["00_environment_check"].cells == ("no verdict (not in run)",) * 2  # says what is missing
    assert c.notes == []
    html, md = write_comparison([a, b], tmp_path / "cmp")
    text = md.read_text()
    assert "| mixed precision |" in text and "**beyond the intervals**" in text and "cuda:H200" in text
    assert "class='apart'" in html.read_text()


def test_two_intervals_apart_are_beyond_even_when_a_third_run_has_none(tmp_path):
    a = _run(tmp_path / "a", "cpu:a", {"03_dataloader_tuning": (0.95, 0.89, 1.02, "leave off")})
    b = _run(tmp_path / "b", "cpu:b", {"03_dataloader_tuning": (1.6, 1.32, 1.95, "enable")})
    c = _run(tmp_path / "c", "cpu:c", {"03_dataloader_tuning": (1.0, 0.9, 1.1, "leave off")})
    ResultsStore(c / "results.jsonl", notebook="06_mixed_precision").verdict(
        metric="speedup", value=1.0, unit="x", recommendation="leave off", reason="r")  # no interval
    ResultsStore(a / "results.jsonl", notebook="06_mixed_precision").verdict(
        metric="speedup", value=1.3, unit="x", recommendation="enable", reason="r",
        spread={"ci_low": 1.2, "ci_high": 1.4})
    rows = {r.notebook: r for r in compare_runs([a, b, c]).rows}
    assert rows["03_dataloader_tuning"].disagreement == "beyond the intervals"
    assert rows["06_mixed_precision"].disagreement == "no interval"
    with pytest.raises(ParameterError, match="twice"):
        compare_runs([a, a])


def test_runs_of_different_jobs_are_said_to_compare_different_workloads(tmp_path):
    a = _run(tmp_path / "a", "cpu:x", {"06_mixed_precision": (1.3, 1.2, 1.4, "enable")})
    b = _run(tmp_path / "b", "cpu:x", {"06_mixed_precision": (1.3, 1.2, 1.4, "enable")}, job="my.py:make_job")
    assert "different jobs" in compare_runs([a, b]).notes[0]


def test_runs_with_different_parameters_are_said_to_measure_different_workloads(tmp_path):
    a = _run(tmp_path / "a", "cpu:x", {"06_mixed_precision": (1.3, 1.2, 1.4, "enable")})
    b = _run(tmp_path / "b", "cpu:x", {"06_mixed_precision": (1.3, 1.2, 1.4, "enable")},
             overrides=[("batch_size", "64")])
    c = compare_runs([a, b])
    assert [h["parameters"] for h in c.headers] == ["profile's", "-p batch_size 64"]
    assert any("different parameters" in n for n in c.notes)
    assert not compare_runs([a, _run(tmp_path / "a2", "cpu:y", {"06_mixed_precision": (1.3, 1.2, 1.4, "enable")})]).notes


def test_compare_needs_two_run_folders(tmp_path):
    a = _run(tmp_path / "a", "cpu:x", {})
    with pytest.raises(ParameterError, match="at least two"):
        compare_runs([a])
    with pytest.raises(ParameterError, match="not a run folder"):
        compare_runs([a, tmp_path])
    p = subprocess.run([sys.executable, "-m", "helpers", "compare", str(a), str(tmp_path)], capture_output=True,
                       text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 2 and "not a run folder" in p.stderr
