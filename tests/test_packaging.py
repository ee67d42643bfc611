"""The project's set-up files agree with each other and with the README."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_environment_yml_pins_match_pyproject():
    # environment.yml is the developer's environment: the workbook's dependencies and the tests' extra
    project = _pyproject()["project"]
    deps = project["dependencies"] + project["optional-dependencies"]["test"]
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    conda_pins = sorted(p for p in pip_section if not p.startswith("-e"))
    assert conda_pins == sorted(deps), "environment.yml and pyproject.toml list different packages or pins"
    assert "-e ." in pip_section


def test_every_dependency_is_pinned():
    project = _pyproject()["project"]
    for dep in project["dependencies"] + [d for extra in project["optional-dependencies"].values() for d in extra]:
        assert re.fullmatch(r"[A-Za-z0-9_.\-\[\]]+==[0-9][0-9A-Za-z.]*", dep), f"not pinned exactly: {dep}"


def test_the_tests_own_tools_stay_out_of_a_users_install():
    project = _pyproject()["project"]
    names = {re.split(r"[=<>\[]", d)[0].lower() for d in project["dependencies"]}
    assert not names & {"playwright", "pytest-xdist", "filelock"}  # the test extra: `pip install -e '.[test]'`
    assert "'.[test]'" in (ROOT / "Makefile").read_text()


def test_npu_extra_matches_torch_version():
    proj = _pyproject()["project"]
    torch_pin = next(d for d in proj["dependencies"] if d.startswith("torch=="))
    npu_pin = next(d for d in proj["optional-dependencies"]["npu"] if d.startswith("torch_npu=="))
    assert torch_pin.split("==")[1] == npu_pin.split("==")[1], "torch_npu's version must equal torch's"


def test_required_packages_are_dependencies():
    names = {re.split(r"[=<>\[]", d)[0].lower() for d in _pyproject()["project"]["dependencies"]}
    for required in ("jupyterlab", "torch", "ipywidgets", "pandas", "matplotlib", "papermill", "nbval"):
        assert required in names


def test_readme_starts_with_the_two_commands_and_ci_calls_the_test_one():
    readme = (ROOT / "README.md").read_text()
    first_block = readme.split("```")[1]
    assert "make workbook" in first_block and "make test" in first_block
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^workbook:", makefile, re.M) and re.search(r"^test:", makefile, re.M)
    assert re.search(r"^lab:", makefile, re.M)


def test_required_top_level_layout():
    for name in ("notebooks", "helpers", "data", "tests", "environment.yml", "README.md", "pyproject.toml",
                 "Makefile", ".ci/run"):
        assert (ROOT / name).exists(), name
