"""One profile measures one job: every notebook whose verdict notebook 10 applies runs notebook 01's workload."""

from __future__ import annotations

import pytest

from helpers import checklist
from helpers.experiments import registry
from helpers.experiments.registry import spec_for, validate_notebook_params
from helpers.workload import DEFAULT
from helpers.workbook.paths import notebooks_dir
from helpers.workbook.profiles import load_profile

PROFILES = sorted(p.stem for p in (notebooks_dir() / "profiles").glob("*.yaml"))
#: The notebooks whose verdicts decide notebook 10's optimized job, 09 (its batch size) and 10 itself.
JOB_NOTEBOOKS = ([checklist.BASELINE] + list(dict.fromkeys(o.notebook for o in registry.optimizations()))
                 + ["09_memory_and_batch_size", checklist.END_TO_END])
JOB_KEYS = ("batch_size", "image_size", "text_len", "model_width", "d_model", "max_images", "seed")


def _resolved(profile: dict, notebook: str) -> dict:
    names = {p.name for p in spec_for(notebook)}
    section = {**(profile.get("common") or {}), **(profile.get(notebook) or {})}
    return validate_notebook_params(notebook, {k: v for k, v in section.items() if k in names})


@pytest.mark.parametrize("name", PROFILES)
def test_every_profile_measures_one_job(name):
    profile = load_profile(name)
    job = _resolved(profile, checklist.BASELINE)
    for nb in JOB_NOTEBOOKS:
        params = _resolved(profile, nb)
        differs = {k: (params[k], job[k]) for k in JOB_KEYS if k in params and params[k] != job[k]}
        assert not differs, f"profile {name}: {nb} measures another job than notebook 01: {differs}"


def test_notebook_defaults_are_the_same_job():
    for nb in JOB_NOTEBOOKS:
        defaults = {p.name: p.default for p in spec_for(nb)}
        if "image_size" in defaults:
            assert defaults["image_size"] == DEFAULT.image_size, nb
        if "model_width" in defaults:
            assert defaults["model_width"] == DEFAULT.model_width, nb


@pytest.mark.parametrize("name", PROFILES)
def test_every_profile_is_valid_for_every_notebook(name, tmp_path):
    """What the runner passes each notebook under the profile (its parameters cell, the spec's ranges) is valid."""
    from helpers.workbook.profiles import build_parameters, discover_notebooks

    profile = load_profile(name)
    notebooks = discover_notebooks()
    assert [nb.stem for nb in notebooks] == list(registry.notebook_ids())
    for nb in notebooks:
        params = build_parameters(nb, profile, device="cpu", run_dir=tmp_path)
        assert set(profile.get(nb.stem) or {}) <= set(params), f"profile {name}: {nb.stem} drops a setting"


def test_the_classroom_profile_is_the_quick_job_with_repeats_for_a_spread():
    """docs/teaching.md: the quick profile's job, fewer steps and images, every ratio verdict still repeated."""
    from helpers.specs import PROFILES as NAMED

    assert "classroom" in NAMED
    classroom, quick = load_profile("classroom"), load_profile("quick")
    for nb in JOB_NOTEBOOKS:
        mine, theirs = _resolved(classroom, nb), _resolved(quick, nb)
        same = {k: (mine[k], theirs[k]) for k in ("batch_size", "image_size", "text_len", "model_width", "d_model")
                if k in mine and mine[k] != theirs[k]}
        assert not same, f"{nb}: the classroom measures another job than quick: {same}"
    for nb, name in registry.interleaved_repeats().items():
        assert _resolved(classroom, nb).get(name, {p.name: p.default for p in spec_for(nb)}[name]) >= 3, nb
    assert _resolved(classroom, "07_channels_last")["compile_model"] is False
