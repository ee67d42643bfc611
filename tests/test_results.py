"""Tests for helpers.results: the record schema, the append-only store, loading."""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from helpers import results as results_mod
from helpers.errors import OutputDirError, ParameterError
from helpers.results import (
    RECOMMENDATIONS,
    RECORD_COLUMNS,
    Record,
    ResultsStore,
    load_results,
    verdicts,
    versions,
)
from helpers.timing import Comparison, Measurement


def make_record(**kw):
    base = dict(notebook="nb", experiment="exp", variant="v", metric="time", value=1.5, unit="s")
    base.update(kw)
    return Record(**base)


# --------------------------------------------------------------------------- Record


def test_record_to_json_is_one_line_and_round_trips():
    r = make_record(repeats=5, spread={"p25": 1.0, "p75": 2.0}, device="cpu",
                    parameters={"batch_size": np.int64(32), "data_dir": Path("/tmp/x"),
                                "shape": (4, 5)},
                    extra={"note": "line\nbreak", "arr": np.array([1.0, 2.0])})
    line = r.to_json()
    assert "\n" not in line
    data = json.loads(line)
    assert list(data) == list(RECORD_COLUMNS)
    assert data["parameters"] == {"batch_size": 32, "data_dir": "/tmp/x", "shape": [4, 5]}
    assert data["extra"]["arr"] == [1.0, 2.0]
    assert Record.from_dict(data) == r
    assert r.timestamp.endswith("+00:00")  # ISO-8601 UTC


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), np.float64("nan")])
def test_record_rejects_non_finite_value(bad):
    with pytest.raises(ParameterError, match="not finite"):
        make_record(value=bad)


def test_record_accepts_none_value_and_numpy_number():
    assert make_record(value=None).value is None
    r = make_record(value=np.float32(2.5))
    assert r.value == 2.5 and type(r.value) is float


@pytest.mark.parametrize(
    "kw",
    [
        {"value": "1.5"},
        {"value": True},
        {"notebook": ""},
        {"metric": None},
        {"repeats": 0},
        {"repeats": True},
        {"spread": {"p25": float("nan")}},
        {"spread": [1, 2]},
        {"recommendation": "maybe", "reason": "x"},
        {"recommendation": "enable"},
        {"recommendation": "enable", "reason": "  "},
        {"extra": {"x": float("inf")}},
        {"extra": {"obj": object()}},
        {"parameters": [1]},
    ],
)
def test_record_validation(kw):
    with pytest.raises(ParameterError):
        make_record(**kw)


def test_record_from_dict_keeps_unknown_keys_in_extra():
    r = Record.from_dict({"notebook": "nb", "experiment": "e", "variant": "v", "metric": "m",
                          "value": 1, "unit": "", "future_field": 7})
    assert r.extra == {"future_field": 7}
    with pytest.raises(ParameterError, match="missing"):
        Record.from_dict({"notebook": "nb"})


def test_versions_never_imports_torch_npu(monkeypatch):
    import sys

    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    v = versions()
    assert set(v) == {"python", "torch", "torch_npu", "numpy", "pillow", "helpers"}
    assert v["numpy"] == np.__version__
    assert v["helpers"]
    assert "torch_npu" not in sys.modules


# --------------------------------------------------------------------------- store


def test_store_round_trip(tmp_path):
    path = tmp_path / "sub" / "results.jsonl"
    store = ResultsStore(path, notebook="04_pinned", device="cpu", parameters={"size_mb": 64})
    assert path.exists() and path.parent.is_dir()
    r1 = store.add("h2d", "pinned", "bandwidth", 12.5, "GB/s", repeats=10,
                   spread={"p25": 12.0, "p75": 13.0}, size_bytes=1 << 20)
    store.add("h2d", "cpu", "bandwidth", None, "GB/s", recommendation="not applicable",
              reason="no accelerator on this machine")
    v = store.verdict(metric="speedup", value=2.4, unit="x", recommendation="enable",
                      reason="pinned copies were 2.4x faster here", repeats=10,
                      spread={"ci_low": 2.2, "ci_high": 2.6, "confidence": 0.95})
    assert r1.notebook == "04_pinned" and r1.device == "cpu"
    assert r1.parameters == {"size_mb": 64} and r1.versions == store.versions()
    assert r1.extra == {"size_bytes": 1 << 20}
    assert v.experiment == "verdict" and v.variant == "verdict"
    assert v.spread == {"ci_low": 2.2, "ci_high": 2.6, "confidence": 0.95} and v.extra == {}
    assert len(store.records) == 3

    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 3
    assert [Record.from_dict(json.loads(line)) for line in lines] == list(store.records)

    df = load_results(path)
    assert list(df.columns) == list(RECORD_COLUMNS)
    assert len(df) == 3
    assert df["value"].dtype == "float64" and math.isnan(df["value"][1])
    assert df["value"][0] == 12.5
    assert df["repeats"].tolist() == [10, None, 10]  # plain ints and None, no pd.NA
    assert isinstance(df["spread"][0], dict) and df["spread"][0]["p75"] == 13.0
    assert isinstance(df["extra"][0], dict) and df["extra"][0]["size_bytes"] == 1 << 20
    assert df["recommendation"][1] == "not applicable"
    pd.testing.assert_frame_equal(df, store.frame())


def test_store_appends_to_existing_file(tmp_path):
    path = tmp_path / "r.jsonl"
    ResultsStore(path, notebook="a").add("e", "v", "m", 1.0, "s")
    ResultsStore(path, notebook="b").add("e", "v", "m", 2.0, "s")
    df = load_results(path)
    assert df["notebook"].tolist() == ["a", "b"]


def test_store_fsyncs_every_line(tmp_path, monkeypatch):
    path = tmp_path / "r.jsonl"
    store = ResultsStore(path, notebook="nb")
    synced = []
    real_fsync = os.fsync

    def spy(fd):
        # at the moment of the fsync the line is already flushed to the file
        synced.append(path.read_text(encoding="utf-8").count("\n"))
        real_fsync(fd)

    monkeypatch.setattr(results_mod.os, "fsync", spy)
    store.add("e", "v", "m", 1.0, "s")
    store.add("e", "v", "m", 2.0, "s")
    assert synced == [1, 2]


def test_in_memory_store_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for path in (None, ""):
        store = ResultsStore(path, notebook="nb")
        store.add("e", "v", "m", 1.0, "s")
        assert store.path is None and len(store.records) == 1
        assert len(store.frame()) == 1
    assert list(tmp_path.iterdir()) == []


def test_unwritable_path_raises_output_dir_error(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    with pytest.raises(OutputDirError, match="cannot be written"):
        ResultsStore(blocker / "results.jsonl", notebook="nb")
    with pytest.raises(OutputDirError):
        ResultsStore(tmp_path, notebook="nb")  # a folder, not a file
    with pytest.raises(ParameterError):
        ResultsStore(None, notebook="")


def test_nan_never_enters_the_store(tmp_path):
    path = tmp_path / "r.jsonl"
    store = ResultsStore(path, notebook="nb")
    with pytest.raises(ParameterError):
        store.add("e", "v", "m", float("nan"), "s")
    with pytest.raises(ParameterError):
        store.add("e", "v", "m", 1.0, "s", spread={"p25": float("inf")})
    assert path.read_text() == "" and store.records == ()


def test_verdict_validation():
    store = ResultsStore(None, notebook="nb")
    with pytest.raises(ParameterError, match="not one of"):
        store.verdict(metric="speedup", value=1.0, unit="x", recommendation="yes", reason="r")
    with pytest.raises(ParameterError, match="reason"):
        store.verdict(metric="speedup", value=1.0, unit="x", recommendation="enable", reason="")
    for rec in RECOMMENDATIONS:
        store.verdict(metric="m", value=None, unit="", recommendation=rec, reason="because")
    assert len(store.records) == len(RECOMMENDATIONS)


def test_add_measurement_with_rate():
    store = ResultsStore(None, notebook="nb")
    m = Measurement("decode", (0.1, 0.2, 0.3, 0.4, 0.5), warmup=2, items_per_call=64)
    recs = store.add_measurement("decode", "batched", m, rate_metric="images", rate_unit="img/s",
                                 batch_size=64)
    assert len(recs) == 2
    t, r = recs
    assert (t.metric, t.unit, t.value, t.repeats) == ("time", "s", pytest.approx(0.3), 5)
    assert t.spread == pytest.approx({"p25": 0.2, "p75": 0.4, "min": 0.1, "max": 0.5})
    assert t.extra["times_s"] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5])
    assert t.extra["warmup"] == 2 and t.extra["batch_size"] == 64
    assert (r.metric, r.unit) == ("images", "img/s")
    assert r.value == pytest.approx(64 / 0.3)
    assert r.spread == pytest.approx({"p25": 64 / 0.4, "p75": 64 / 0.2, "min": 64 / 0.5,
                                      "max": 64 / 0.1})


def test_add_measurement_without_items():
    store = ResultsStore(None, notebook="nb")
    m = Measurement("x", (1.0, 2.0, 3.0), warmup=0)
    assert len(store.add_measurement("e", "v", m)) == 1
    with pytest.raises(ParameterError, match="items_per_call"):
        store.add_measurement("e", "v", m, rate_metric="rate")
    with pytest.raises(ParameterError):
        store.add_measurement("e", "v", {"median": 1.0})


def test_add_comparison():
    store = ResultsStore(None, notebook="nb")
    c = Comparison.from_measurements(Measurement("pageable", (2.0, 2.1, 1.9), 0),
                                     Measurement("pinned", (1.0, 1.05, 0.95), 0))
    r = store.add_comparison("h2d", c)
    assert r.variant == "pinned vs pageable"
    assert (r.metric, r.unit, r.value) == ("speedup", "x", pytest.approx(2.0))
    assert set(r.spread) == {"ci_low", "ci_high", "confidence"}
    assert r.spread["ci_low"] <= r.value <= r.spread["ci_high"]
    assert r.extra["a_median_s"] == pytest.approx(2.0)
    assert "pinned is" in r.extra["verdict_text"]


# --------------------------------------------------------------------------- loading


def test_corrupt_last_line_is_skipped_with_line_number(tmp_path, caplog):
    path = tmp_path / "r.jsonl"
    store = ResultsStore(path, notebook="nb")
    store.add("e", "v", "m", 1.0, "s")
    store.add("e", "v", "m", 2.0, "s")
    full = path.read_bytes()
    path.write_bytes(full[: len(full) - 20])  # the second write was interrupted
    with caplog.at_level(logging.WARNING, logger="helpers.results"):
        df = load_results(path)
    assert df["value"].tolist() == [1.0]
    assert any("line 2" in r.getMessage() for r in caplog.records)

    # a later run appends after the cut-off line without gluing onto it
    ResultsStore(path, notebook="nb2").add("e", "v", "m", 3.0, "s")
    df = load_results(path)
    assert df["value"].tolist() == [1.0, 3.0]


def test_load_results_missing_file_and_odd_lines(tmp_path, caplog):
    empty = load_results(tmp_path / "nope.jsonl")
    assert empty.empty and list(empty.columns) == list(RECORD_COLUMNS)
    path = tmp_path / "r.jsonl"
    path.write_text('\n[1, 2]\n{"notebook": "nb", "experiment": "e", "variant": "v", '
                    '"metric": "m", "value": 1, "unit": "s", "new_key": 1}\n\n'
                    '{"notebook": "nb", "experiment": "e", "variant": "v", "metric": "m", '
                    '"value": NaN, "unit": "s"}\n'
                    '{"notebook": "nb", "experiment": "e", "variant": "v", "metric": "m", '
                    '"value": 1, "unit": "s", "repeats": "many"}\n')
    with caplog.at_level(logging.WARNING, logger="helpers.results"):
        df = load_results(path)
    assert len(df) == 1 and df["new_key"].tolist() == [1]
    messages = [r.getMessage() for r in caplog.records]
    assert any("line 2" in m and "not a JSON object" in m for m in messages)
    assert any("line 5" in m and "not a valid record" in m for m in messages)
    assert any("line 6" in m and "not a valid record" in m for m in messages)


def test_verdicts_last_per_notebook(tmp_path):
    path = tmp_path / "r.jsonl"
    s1 = ResultsStore(path, notebook="01")
    s2 = ResultsStore(path, notebook="02")
    s1.add("e", "v", "m", 1.0, "s")
    s1.verdict(metric="m", value=1.0, unit="x", recommendation="enable", reason="first run")
    s2.verdict(metric="m", value=1.0, unit="x", recommendation="leave off", reason="slower")
    s1.verdict(metric="m", value=2.0, unit="x", recommendation="host-bound", reason="rerun")
    v = verdicts(load_results(path))
    assert v["notebook"].tolist() == ["01", "02"]
    assert v["recommendation"].tolist() == ["host-bound", "leave off"]
    assert v.index.tolist() == [0, 1]
    assert verdicts(load_results(tmp_path / "none.jsonl")).empty
