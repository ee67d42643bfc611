"""Tests for helpers.params: coercion of papermill-style values, choices, ranges, messages."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.errors import ParameterError
from helpers.params import Param, coerce, describe, validate

BATCH = Param("batch_size", int, 32, "samples per step", minimum=1)
LR = Param("lr", float, 1e-3, "learning rate", minimum=0.0, maximum=1.0)
PIN = Param("pin_memory", bool, False, "pin host batches")
NAME = Param("run_name", str, "baseline", "label of the run")
DEVICE = Param("device", str, "auto", "device kind", choices=("auto", "cpu", "cuda", "npu"),
               hints={"gpu": "cuda"})
SIZES = Param("sizes", list, [1, 2], "transfer sizes, MiB", item_kind=int, minimum=1)
IDS = Param("ids", list, [], "image ids", item_kind=str)
WORKERS = Param("num_workers", int, None, "DataLoader workers; None = auto", nullable=True,
                minimum=0)
SPEC = [BATCH, LR, PIN, NAME, DEVICE, SIZES, IDS, WORKERS]


# --------------------------------------------------------------------------- int


@pytest.mark.parametrize("value,expected", [(32, 32), ("32", 32), (" 7 ", 7), ("+3", 3),
                                            (np.int64(5), 5)])
def test_int_accepts_ints_and_int_strings(value, expected):
    out = coerce(BATCH, value)
    assert out == expected and type(out) is int


@pytest.mark.parametrize("value", [True, False, 3.5, 32.0, "3.5", "1e3", "abc", "", None, [1]])
def test_int_rejects_bool_float_and_junk(value):
    with pytest.raises(ParameterError, match=r"^batch_size: expected an int >= 1, got "):
        coerce(BATCH, value)


def test_int_range_message():
    with pytest.raises(ParameterError) as info:
        coerce(BATCH, -3)
    assert str(info.value) == "batch_size: expected an int >= 1, got -3 (int)"


# --------------------------------------------------------------------------- float


@pytest.mark.parametrize("value,expected", [(0.5, 0.5), (1, 1.0), ("1e-3", 1e-3), (" 0.25", 0.25),
                                            (np.float32(0.5), 0.5)])
def test_float_accepts_numbers_and_numeric_strings(value, expected):
    out = coerce(LR, value)
    assert out == pytest.approx(expected) and type(out) is float


@pytest.mark.parametrize("value", [float("nan"), float("inf"), "nan", "inf", "-inf", True, "fast",
                                   1.5, -0.1])
def test_float_rejects_non_finite_bool_text_and_out_of_range(value):
    with pytest.raises(ParameterError, match=r"lr: expected a finite float between 0 and 1"):
        coerce(LR, value)


# --------------------------------------------------------------------------- bool


@pytest.mark.parametrize(
    "value,expected",
    [(True, True), (False, False), ("False", False), ("false", False), ("TRUE", True),
     ("yes", True), ("No", False), ("1", True), ("0", False), (1, True), (0, False),
     (np.bool_(True), True)],
)
def test_bool_accepts_bools_and_papermill_strings(value, expected):
    assert coerce(PIN, value) is expected


@pytest.mark.parametrize("value", ["maybe", "", 2, -1, 0.0, 1.0, None, "False!"])
def test_bool_rejects_other_values(value):
    with pytest.raises(ParameterError, match=r"pin_memory: expected a bool"):
        coerce(PIN, value)


def test_raw_string_false_is_false_not_truthy():
    # papermill -r pin_memory False gives the str "False", which Python treats as True
    assert bool("False") is True
    assert validate({"pin_memory": "False"}, [PIN]) == {"pin_memory": False}


# --------------------------------------------------------------------------- str


def test_str_strips_and_rejects_numbers():
    assert coerce(NAME, "  run 1 ") == "run 1"
    with pytest.raises(ParameterError, match=r"run_name: expected a str, got 42 \(int\)"):
        coerce(NAME, 42)
    with pytest.raises(ParameterError):
        coerce(NAME, True)


def test_str_choices_are_case_insensitive_and_canonicalised():
    assert coerce(DEVICE, "CUDA") == "cuda"
    assert coerce(DEVICE, " Npu ") == "npu"


def test_str_choice_error_uses_hint_then_close_match():
    with pytest.raises(ParameterError) as info:
        coerce(DEVICE, "gpu")
    assert str(info.value) == "device: 'gpu' is not one of auto, cpu, cuda, npu (did you mean 'cuda'?)"
    with pytest.raises(ParameterError, match=r"did you mean 'auto'\?"):
        coerce(DEVICE, "autoo")
    with pytest.raises(ParameterError) as info:
        coerce(DEVICE, "tpu-pod-xyz")
    assert "did you mean" not in str(info.value)


def test_int_choices():
    p = Param("bits", int, 16, "precision bits", choices=(16, 32))
    assert coerce(p, "32") == 32
    with pytest.raises(ParameterError, match="not one of 16, 32"):
        coerce(p, 8)


# --------------------------------------------------------------------------- list


@pytest.mark.parametrize(
    "value,expected",
    [([1, 2], [1, 2]), ((4, 5), [4, 5]), ("[1, 2]", [1, 2]), ("(4, 5)", [4, 5]),
     ("01 02", [1, 2]), ("01,02", [1, 2]), ("1, 2  3", [1, 2, 3]), (["3", "4"], [3, 4]),
     (64, [64]), ("", []), ("[]", [])],
)
def test_list_of_int_from_lists_and_papermill_strings(value, expected):
    assert coerce(SIZES, value) == expected


def test_list_of_str_keeps_leading_zeros_from_text():
    assert coerce(IDS, "01 02") == ["01", "02"]
    assert coerce(IDS, "01,02") == ["01", "02"]
    assert coerce(IDS, '["a", "b"]') == ["a", "b"]
    assert coerce(IDS, "['a', 'b']") == ["a", "b"]  # a Python literal, as str() of a list gives
    assert coerce(IDS, "[1, 2]") == ["1", "2"]


def test_list_item_errors_name_the_index():
    with pytest.raises(ParameterError) as info:
        coerce(SIZES, "1 x 0")
    msg = str(info.value)
    assert "sizes[1]: expected a list of int, each >= 1, got 'x' (str)" in msg
    assert "sizes[2]" in msg and "\n" not in msg
    with pytest.raises(ParameterError, match="JSON list"):
        coerce(SIZES, "[1, 2")
    with pytest.raises(ParameterError):
        coerce(SIZES, {"a": 1})


def test_list_choices_apply_per_item():
    p = Param("devices", list, ["cpu"], "devices", item_kind=str, choices=("cpu", "cuda"))
    assert coerce(p, "CPU, Cuda") == ["cpu", "cuda"]
    with pytest.raises(ParameterError, match=r"devices\[1\]: 'npux' is not one of"):
        coerce(p, "cpu npux")


# --------------------------------------------------------------------------- None


def test_none_only_when_nullable():
    assert coerce(WORKERS, None) is None
    assert coerce(WORKERS, "None") is None  # papermill -r passes "None"
    assert coerce(WORKERS, "4") == 4
    with pytest.raises(ParameterError, match="None is not allowed"):
        coerce(BATCH, None)
    with pytest.raises(ParameterError):
        coerce(BATCH, "None")
    p = Param("compression", str, "none", "codec", choices=("none", "fp16"), nullable=True)
    assert coerce(p, "None") == "none"  # a real choice wins over null


# --------------------------------------------------------------------------- validate


def test_validate_fills_defaults_and_coerces():
    out = validate({"batch_size": "64", "device": "CPU", "sizes": "8 16"}, SPEC)
    assert out == {"batch_size": 64, "lr": 1e-3, "pin_memory": False, "run_name": "baseline",
                   "device": "cpu", "sizes": [8, 16], "ids": [], "num_workers": None}
    assert list(out) == [p.name for p in SPEC]
    assert validate({"lr": "0.1"}, SPEC, fill_defaults=False) == {"lr": 0.1}


def test_validate_reports_every_problem_in_one_error():
    values = {"batch_size": -3, "device": "gpu", "pin_memory": "maybe", "batchsize": 8, "lr": 0.1}
    with pytest.raises(ParameterError) as info:
        validate(values, SPEC)
    lines = str(info.value).splitlines()
    assert len(lines) == 4 == len(info.value.problems)
    assert "batch_size: expected an int >= 1, got -3 (int)" in lines
    assert "device: 'gpu' is not one of auto, cpu, cuda, npu (did you mean 'cuda'?)" in lines
    assert any(line.startswith("pin_memory: expected a bool") and "'maybe' (str)" in line
               for line in lines)
    unknown = [line for line in lines if line.startswith("unknown parameter 'batchsize'")]
    assert unknown and "(did you mean 'batch_size'?)" in unknown[0]
    assert "known: batch_size, lr, pin_memory" in unknown[0]


def test_validate_unknown_without_close_match_and_allow_unknown():
    with pytest.raises(ParameterError) as info:
        validate({"zzz": 1}, [BATCH])
    assert str(info.value) == "unknown parameter 'zzz'; known: batch_size"
    out = validate({"zzz": 1, "batch_size": "2"}, [BATCH], allow_unknown=True)
    assert out == {"batch_size": 2, "zzz": 1}


def test_validate_rejects_bad_spec_and_values():
    with pytest.raises(ParameterError, match="declared twice"):
        validate({}, [BATCH, BATCH])
    with pytest.raises(ParameterError, match="mapping"):
        validate([("batch_size", 1)], [BATCH])


# --------------------------------------------------------------------------- Param and describe


@pytest.mark.parametrize(
    "kwargs",
    [
        {"kind": dict},
        {"kind": str, "minimum": 1},
        {"kind": int, "minimum": 5, "maximum": 1},
        {"kind": int, "item_kind": int},
        {"kind": int, "default": "not a number"},
        {"kind": int, "default": None},
        {"kind": str, "default": "x", "choices": "abc"},
        {"kind": int, "name": "batch size"},
    ],
)
def test_param_declaration_checks(kwargs):
    base = {"name": "p", "kind": int, "default": 1, "help": "h"}
    base.update(kwargs)
    with pytest.raises(ParameterError):
        Param(**base)


def test_describe():
    rows = describe([BATCH, LR, DEVICE, SIZES, WORKERS, PIN, NAME])
    by = {r["name"]: r for r in rows}
    assert set(rows[0]) == {"name", "type", "default", "allowed", "help"}
    assert by["batch_size"]["allowed"] == ">= 1" and by["batch_size"]["type"] == "int"
    assert by["lr"]["allowed"] == "between 0 and 1"
    assert by["device"]["allowed"] == "one of auto, cpu, cuda, npu"
    assert by["sizes"]["type"] == "list[int]"
    assert by["num_workers"]["type"] == "int or None" and "None" in by["num_workers"]["allowed"]
    assert by["pin_memory"]["allowed"] == "true or false"
    assert by["run_name"]["allowed"] == "any" and by["run_name"]["help"] == "label of the run"
