"""Where runs go (docs/run_options.md, "Where runs go"): ``WORKBOOK_RUNS_DIR`` when set; in a clone, the clone's
``runs/`` from whatever folder the command starts in; installed from a wheel, ``./runs`` of the current folder."""

from __future__ import annotations

from pathlib import Path

from helpers.workbook import paths

ROOT = Path(__file__).resolve().parents[1]


def test_a_clone_writes_to_its_own_runs_folder_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("WORKBOOK_RUNS_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    assert paths.in_checkout()
    assert paths.runs_dir() == ROOT / "runs"
    assert paths.interactive_dir() == ROOT / "runs" / "interactive"


def test_an_installed_package_writes_to_the_current_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("WORKBOOK_RUNS_DIR", raising=False)
    monkeypatch.setattr(paths, "in_checkout", lambda: False)
    monkeypatch.chdir(tmp_path)
    assert paths.runs_dir() == tmp_path / "runs"


def test_the_environment_variable_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBOOK_RUNS_DIR", str(tmp_path / "mine"))
    assert paths.runs_dir() == tmp_path / "mine"
