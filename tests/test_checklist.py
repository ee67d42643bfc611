"""The registry: one Experiment per notebook, found in its module, and everything that lists notebooks reads it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from helpers import bottleneck, checklist
from helpers.experiments import e2e_checks, e2e_jobs, e2e_select, registry
from helpers.workbook import report

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"


def test_every_notebook_has_an_experiment_and_every_experiment_a_notebook():
    on_disk = sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    assert on_disk == list(registry.notebook_ids()), (
        "a notebook without an EXPERIMENT in its module, or an EXPERIMENT without a notebook: add both "
        "(docs/adding_a_notebook.md)")


def test_every_experiment_has_a_parameter_spec_with_the_common_parameters():
    for e in registry.experiments():
        names = [p.name for p in e.spec]
        assert names[:4] == ["device", "results_path", "out_dir", "busy_cpu_share"], e.item.id
        assert registry.spec_for(e.item.id) == e.spec


@pytest.mark.parametrize("entry", registry.items(), ids=lambda e: e.id)
def test_title_is_the_notebooks_first_heading(entry):
    nb = json.loads((NOTEBOOKS / f"{entry.id}.ipynb").read_text())
    first = "".join(nb["cells"][0]["source"]).splitlines()[0]
    assert first == f"# {entry.title}"


def test_numbers_are_unique_and_in_order():
    numbers = [i.number for i in registry.items()]
    assert numbers == sorted(set(numbers))
    for i in registry.items():
        assert i.id.startswith(i.number + "_")


def test_optimizations_and_notebooks_agree():
    for o in registry.optimizations():
        assert o.name in registry.item(o.notebook).optimizations
        assert set(o.acts_on) <= set(checklist.PHASES) and o.acts_on
    for i in registry.items():
        for name in i.optimizations:
            assert registry.optimization(name).notebook == i.id


def test_lookups_and_their_errors():
    assert registry.item("01") is registry.item("01_baseline_profiling") is registry.item(
        "01_baseline_profiling.ipynb")
    with pytest.raises(KeyError, match="known: 00_environment_check"):
        registry.item("99")
    with pytest.raises(KeyError, match="valid: batched_decode"):
        registry.optimization("turbo")


def test_the_notebooks_the_foundation_names_are_registered():
    ids = set(registry.notebook_ids())
    assert {checklist.BASELINE, checklist.END_TO_END, checklist.COLLECTIVES} <= ids
    assert set(bottleneck._NUMBER) <= ids
    assert checklist.notebook_ref("03_dataloader_tuning") == "notebook 03 (notebooks/03_dataloader_tuning.ipynb)"
    with pytest.raises(ValueError, match="not a notebook id"):
        checklist.notebook_ref("DataLoader tuning")


def test_profiles_name_only_registered_notebooks():
    for path in sorted((NOTEBOOKS / "profiles").glob("*.yaml")):
        data = yaml.safe_load(path.read_text()) or {}
        assert set(data) - {"common"} <= set(registry.notebook_ids()), path.name


def test_readers_take_the_registry():
    assert report.checklist_items() == tuple((i.number, i.name) for i in registry.items())
    assert e2e_jobs.OPTIMIZATIONS == registry.optimization_names()
    assert e2e_select.SOURCE_NOTEBOOKS == {o.name: o.notebook for o in registry.optimizations()}
    assert e2e_checks.ACTS_ON == {o.name: o.acts_on for o in registry.optimizations()}
    assert set(e2e_select.device_defaults(_cpu(), native_bf16=False)) == set(registry.optimization_names())


def _cpu():
    from helpers.device import get_accelerator

    return get_accelerator("cpu")


def test_readme_list_and_docs_table_of_notebooks_match_the_registry():
    known = [(i.number, i.id) for i in registry.items()]
    readme = (ROOT / "README.md").read_text()
    listed = re.findall(r"^(\d+)\. \[[^\]]+\]\(notebooks/((\d\d)_\w+)\.ipynb\)", readme, re.M)
    assert [(f"{int(n):02d}", nb) for n, nb, _ in listed] == known, "README's numbered list of notebooks"
    assert all(f"{int(n):02d}" == prefix for n, _, prefix in listed)
    table = (ROOT / "docs" / "notebooks.md").read_text()
    rows = re.findall(r"^\| (\d\d) \| \[`([^`]+)`\]\(\.\./notebooks/\2\.ipynb\) \|", table, re.M)
    assert rows == known, "docs/notebooks.md's table of notebooks"


def test_a_profile_section_for_no_notebook_is_rejected(tmp_path):
    from helpers.errors import ParameterError
    from helpers.workbook.profiles import load_profile

    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "smoke.yaml").write_text("common: {}\n11_turbo:\n  steps: 3\n")
    with pytest.raises(ParameterError, match="'11_turbo'.*name no notebook"):
        load_profile("smoke", tmp_path)
