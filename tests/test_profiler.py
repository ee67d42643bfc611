"""Tests for helpers.diagnose.profiler (cpu for real; npu through a faked torch_npu)."""

from __future__ import annotations

import os
import json
import math
import sys
import types
from pathlib import Path

import pandas as pd
import pytest
import torch

from helpers.diagnose import profiler as P
from helpers.errors import DataError, DeviceUnavailableError, OutputDirError, ParameterError


def matmul_step():
    a = torch.randn(64, 64)
    b = torch.randn(64, 64)
    return a @ b


def test_cpu_profile_writes_valid_trace_and_top_ops(tmp_path):
    result = P.profile_steps(matmul_step, kind="cpu", out_dir=tmp_path / "prof", steps=3, warmup=1)
    assert result.kind == "cpu" and result.steps == 3
    assert result.out_dir == (tmp_path / "prof").resolve()
    assert result.trace_path is not None and result.trace_path.parent == result.out_dir
    trace = json.loads(result.trace_path.read_text())
    assert "traceEvents" in trace and trace["traceEvents"]

    ops = result.top_ops
    assert list(ops.columns) == list(P.TOP_OPS_COLUMNS)
    assert not ops.empty
    assert {"aten::mm", "aten::matmul", "aten::addmm"} & set(ops["name"])
    assert not ops["name"].str.startswith("ProfilerStep").any()
    assert (ops["self_cpu_ms"] >= 0).all() and (ops["cpu_total_ms"] >= ops["self_cpu_ms"] - 1e-9).all()
    assert ops["self_device_ms"].isna().all() and ops["device_total_ms"].isna().all()
    assert list(ops["self_cpu_ms"]) == sorted(ops["self_cpu_ms"], reverse=True)
    # Three recorded steps, one matmul each.
    mm_calls = ops.loc[ops["name"] == "aten::matmul", "calls"]
    assert list(mm_calls) == [3]


def test_unwritable_output_dir_raises(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    with pytest.raises(OutputDirError) as info:
        P.check_output_dir(afile / "sub")
    assert str(afile / "sub") in str(info.value)
    with pytest.raises(OutputDirError):
        P.profile_steps(matmul_step, kind="cpu", out_dir=afile / "sub")
    with pytest.raises(OutputDirError, match="not a folder"):
        P.check_output_dir(afile)


def test_check_output_dir_creates_and_leaves_no_probe(tmp_path):
    folder = P.check_output_dir(tmp_path / "a" / "b")
    assert folder.is_dir() and list(folder.iterdir()) == []


def test_failing_step_stops_profiler_and_reraises(tmp_path):
    calls = {"n": 0}

    def failing_step():
        calls["n"] += 1
        matmul_step()
        if calls["n"] == 3:  # inside the recorded window
            raise RuntimeError("step exploded")

    with pytest.raises(RuntimeError, match="step exploded"):
        P.profile_steps(failing_step, kind="cpu", out_dir=tmp_path / "bad", steps=3, warmup=1)
    assert list((tmp_path / "bad").glob("*.pt.trace.json")) == []  # no incomplete trace
    # The profiler was stopped: a second run works.
    result = P.profile_steps(matmul_step, kind="cpu", out_dir=tmp_path / "good", steps=1, warmup=1)
    assert result.trace_path is not None and not result.top_ops.empty


def test_sync_called_after_every_step(tmp_path):
    seen = []
    P.profile_steps(matmul_step, kind="cpu", out_dir=tmp_path, steps=2, warmup=1, sync=lambda: seen.append(1))
    assert len(seen) == 3


@pytest.mark.parametrize("kwargs", [dict(kind="tpu"), dict(kind="cpu", steps=0), dict(kind="cpu", warmup=-1),
                                    dict(kind="cpu", row_limit=0)])
def test_bad_parameters(tmp_path, kwargs):
    with pytest.raises(ParameterError):
        P.profile_steps(matmul_step, out_dir=tmp_path, **kwargs)


def test_activities_for_cpu_and_cuda():
    act = torch.profiler.ProfilerActivity
    assert P.activities_for("cpu") == [act.CPU]
    assert P.activities_for("cuda") == [act.CPU, act.CUDA]
    with pytest.raises(ParameterError):
        P.activities_for("gpu")


def test_activities_for_npu_without_torch_npu(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # makes `import torch_npu` raise ImportError
    with pytest.raises(DeviceUnavailableError) as info:
        P.activities_for("npu")
    message = str(info.value)
    assert "torch_npu" in message and "set_env.sh" in message
    assert not isinstance(info.value, ImportError)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error path")
def test_cuda_kind_without_gpu_is_device_unavailable(tmp_path):
    with pytest.raises(DeviceUnavailableError, match="cuda"):
        P.profile_steps(matmul_step, kind="cuda", out_dir=tmp_path)


OPERATOR_HEADERS = ["Name", "Input Shapes", "Call Stack", "Host Self Duration(us)", "Host Total Duration(us)",
                    "Device Self Duration(us)", "Device Total Duration(us)",
                    "Device Self Duration With AICore(us)", "Device Total Duration With AICore(us)"]


def write_operator_details(path: Path) -> None:
    rows = [
        ["aten::mm", "[64,64]", "", 10.0, 12.0, 100.0, 100.0, 100.0, 100.0],
        ["aten::mm", "[64,64]", "", 14.0, 16.0, 300.0, 300.0, 300.0, 300.0],
        ["aten::add", "[64]", "", 50.0, 55.0, 20.0, 20.0, 0.0, 0.0],
        ["ProfilerStep#1", "", "", 1.0, 500.0, 0.0, 420.0, 0.0, 0.0],
    ]
    pd.DataFrame(rows, columns=OPERATOR_HEADERS).to_csv(path, index=False)


def test_top_ops_from_operator_details(tmp_path):
    csv = tmp_path / "operator_details.csv"
    write_operator_details(csv)
    ops = P.top_ops_from_operator_details(csv)
    assert list(ops.columns) == list(P.TOP_OPS_COLUMNS)
    assert list(ops["name"]) == ["aten::mm", "aten::add"]  # sorted by self device time
    mm = ops.iloc[0]
    assert mm["calls"] == 2
    assert mm["self_cpu_ms"] == pytest.approx(0.024) and mm["self_device_ms"] == pytest.approx(0.4)
    bad = tmp_path / "bad.csv"
    pd.DataFrame({"x": [1]}).to_csv(bad, index=False)
    with pytest.raises(DataError):
        P.top_ops_from_operator_details(bad)


def make_fake_torch_npu(record: dict) -> types.ModuleType:
    """A stand-in for torch_npu.profiler with the call pattern of the real one (fact-check §5)."""

    class ProfilerActivity:
        CPU = "npu-act-cpu"
        NPU = "npu-act-npu"

    def schedule(wait, active, warmup=0, repeat=0, skip_first=0):
        record["schedule"] = dict(wait=wait, active=active, warmup=warmup, repeat=repeat)
        return ("schedule", wait, warmup, active)

    def tensorboard_trace_handler(dir_name=None, worker_name=None, analyse_flag=True, async_mode=False):
        def handler(prof):
            out = Path(dir_name) / "host_1_20260101000000000_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
            out.mkdir(parents=True)
            (out / "trace_view.json").write_text(json.dumps({"traceEvents": []}))
            write_operator_details(out / "operator_details.csv")
            record["parsed"] = record.get("parsed", 0) + 1
        return handler

    class profile:
        def __init__(self, *, activities=None, schedule=None, on_trace_ready=None, record_shapes=False, **kw):
            record["activities"] = activities
            self.schedule = schedule
            self.on_trace_ready = on_trace_ready
            self.step_num = 0
            _, _, warmup, active = schedule
            self.total = warmup + active

        def start(self):
            record["started"] = record.get("started", 0) + 1

        def step(self):
            self.step_num += 1
            if self.step_num == self.total:
                self.on_trace_ready(self)

        def stop(self):
            record["stopped"] = record.get("stopped", 0) + 1
            if self.step_num < self.total:  # like torch_npu: trace-ready also fires mid-record
                self.on_trace_ready(self)

    prof_mod = types.SimpleNamespace(ProfilerActivity=ProfilerActivity, schedule=schedule,
                                     tensorboard_trace_handler=tensorboard_trace_handler, profile=profile)
    module = types.ModuleType("torch_npu")
    module.profiler = prof_mod
    return module


@pytest.fixture
def fake_npu(monkeypatch):
    record: dict = {}
    monkeypatch.setitem(sys.modules, "torch_npu", make_fake_torch_npu(record))
    monkeypatch.setattr(torch, "npu", types.SimpleNamespace(is_available=lambda: True), raising=False)
    return record


def test_npu_path_uses_npu_profiler_and_parses_output(tmp_path, fake_npu):
    result = P.profile_steps(matmul_step, kind="npu", out_dir=tmp_path, steps=2, warmup=1, sync=lambda: None)
    assert fake_npu["activities"] == ["npu-act-cpu", "npu-act-npu"]  # no CUDA activity on Ascend
    assert fake_npu["schedule"] == dict(wait=0, active=2, warmup=1, repeat=1)
    assert fake_npu["started"] == 1 and fake_npu["stopped"] == 1 and fake_npu["parsed"] == 1
    assert result.kind == "npu" and result.trace_path.name == "trace_view.json"
    assert list(result.top_ops["name"]) == ["aten::mm", "aten::add"]
    assert not math.isnan(result.top_ops["self_device_ms"].iloc[0])


def test_npu_failing_step_is_stopped_and_not_parsed(tmp_path, fake_npu):
    def failing():
        raise ValueError("bad batch")

    with pytest.raises(ValueError, match="bad batch"):
        P.profile_steps(failing, kind="npu", out_dir=tmp_path, steps=2, warmup=0, sync=lambda: None)
    assert fake_npu["stopped"] == 1
    assert "parsed" not in fake_npu
    assert list(tmp_path.glob("*_ascend_pt")) == []


def test_npu_unavailable_device(tmp_path, fake_npu, monkeypatch):
    monkeypatch.setattr(torch, "npu", types.SimpleNamespace(is_available=lambda: False), raising=False)
    with pytest.raises(DeviceUnavailableError, match="npu"):
        P.profile_steps(matmul_step, kind="npu", out_dir=tmp_path, sync=lambda: None)


def test_kineto_marker_lines_are_dropped_and_other_stderr_kept(capfd):
    from helpers.diagnose.profiler import _without_kineto_markers

    with _without_kineto_markers():
        os.write(2, b"USDT:2026-11-29 13:25:51 10524:10524 SyncActivityProfilerHandler.cpp:52] profiler_start\n")
        os.write(2, b"a real warning\n")
    err = capfd.readouterr().err
    assert "a real warning" in err and "profiler_start" not in err
