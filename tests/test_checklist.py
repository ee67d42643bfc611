"""The checklist registry: one entry per notebook, and everything that lists notebooks reads it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from helpers import checklist
from helpers.specs import SPECS
from helpers.experiments import e2e_checks, e2e_jobs, e2e_select
from helpers.workbook import report

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"


def test_every_notebook_has_an_entry_and_every_entry_a_notebook():
    on_disk = sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    assert on_disk == list(checklist.notebook_ids()), (
        "a notebook without a registry entry, or an entry without a notebook: add both "
        "(docs/adding_a_notebook.md)")


def test_every_entry_has_a_parameter_spec():
    assert sorted(SPECS) == sorted(checklist.notebook_ids())


@pytest.mark.parametrize("entry", checklist.CHECKLIST, ids=lambda e: e.id)
def test_title_is_the_notebooks_first_heading(entry):
    nb = json.loads((NOTEBOOKS / f"{entry.id}.ipynb").read_text())
    first = "".join(nb["cells"][0]["source"]).splitlines()[0]
    assert first == f"# {entry.title}"


def test_numbers_are_unique_and_in_order():
    numbers = [i.number for i in checklist.CHECKLIST]
    assert numbers == sorted(set(numbers))
    for i in checklist.CHECKLIST:
        assert i.id.startswith(i.number + "_")


def test_optimizations_and_notebooks_agree():
    for o in checklist.OPTIMIZATIONS:
        assert o.name in checklist.item(o.notebook).optimizations
        assert set(o.acts_on) <= set(checklist.PHASES) and o.acts_on
    for i in checklist.CHECKLIST:
        for name in i.optimizations:
            assert checklist.optimization(name).notebook == i.id


def test_lookups_and_their_errors():
    assert checklist.item("01") is checklist.item("01_baseline_profiling") is checklist.item(
        "01_baseline_profiling.ipynb")
    with pytest.raises(KeyError, match="known: 00_environment_check"):
        checklist.item("99")
    with pytest.raises(KeyError, match="valid: batched_decode"):
        checklist.optimization("turbo")


def test_profiles_name_only_registered_notebooks():
    for path in sorted((NOTEBOOKS / "profiles").glob("*.yaml")):
        data = yaml.safe_load(path.read_text()) or {}
        assert set(data) - {"common"} <= set(checklist.notebook_ids()), path.name


def test_readers_take_the_registry():
    assert report.CHECKLIST == tuple((i.number, i.name) for i in checklist.CHECKLIST)
    assert e2e_jobs.OPTIMIZATIONS == checklist.optimization_names()
    assert e2e_select.SOURCE_NOTEBOOKS == {o.name: o.notebook for o in checklist.OPTIMIZATIONS}
    assert e2e_checks.ACTS_ON == {o.name: o.acts_on for o in checklist.OPTIMIZATIONS}


def test_readme_table_lists_the_registry():
    text = (ROOT / "README.md").read_text()
    for i in checklist.CHECKLIST:
        assert f"| {i.number} | `{i.id}` |" in text, f"README's notebook table lacks {i.id}"


def test_a_profile_section_for_no_notebook_is_rejected(tmp_path):
    from helpers.errors import ParameterError
    from helpers.workbook.runner import load_profile

    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "smoke.yaml").write_text("common: {}\n11_turbo:\n  steps: 3\n")
    with pytest.raises(ParameterError, match="'11_turbo'.*name no notebook"):
        load_profile("smoke", tmp_path)
