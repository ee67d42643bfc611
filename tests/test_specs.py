"""Notebook parameter specs: validation as a notebook sees it."""

from __future__ import annotations

import pytest

from helpers.errors import ParameterError
from helpers.experiments.registry import spec_for, validate_notebook_params
from helpers.specs import injected_parameter_names

INJECTED = '# Parameters\nbatchsize = 8\ndevice = "cpu"\n'


def test_globals_are_filtered_to_the_spec():
    ns = {"batch_size": 8, "device": "cpu", "some_variable": object(), "In": ["x = 1"]}
    p = validate_notebook_params("01_baseline_profiling", ns, allow_unknown=True)
    assert p["batch_size"] == 8 and p["device"] == "cpu" and "some_variable" not in p
    assert p["steps"] == 20  # the default


def test_misspelt_injected_parameter_is_rejected_with_a_suggestion():
    ns = {"batchsize": 8, "device": "cpu", "In": ["", "device: str = 'auto'", INJECTED]}
    assert injected_parameter_names(ns) == {"batchsize", "device"}
    with pytest.raises(ParameterError, match="batchsize.*batch_size"):
        validate_notebook_params("01_baseline_profiling", ns, allow_unknown=True)


def test_strings_from_the_command_line_are_coerced():
    p = validate_notebook_params("01_baseline_profiling", {"batch_size": "16", "host_bound_threshold": "0.2"})
    assert p["batch_size"] == 16 and p["host_bound_threshold"] == 0.2


def test_unknown_notebook():
    with pytest.raises(ParameterError, match="no parameter spec"):
        spec_for("99_nothing")
