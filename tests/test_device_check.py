"""The prepared accelerator check, run here on the CPU: every step runs, the device parts say why they do not apply."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from helpers.errors import ParameterError
from helpers.workbook.device_check import DEVICE_NOTEBOOKS, bandwidth_summary, device_check


def test_a_bad_profile_is_refused_before_any_work(tmp_path):
    with pytest.raises(ParameterError, match="--profile"):
        device_check(device="cpu", out=tmp_path / "dc", profile="nope", echo=lambda s: None)
    assert not (tmp_path / "dc").exists()


def test_bandwidth_summary_reads_notebook_04s_records(tmp_path):
    from helpers.results import ResultsStore

    store = ResultsStore(tmp_path / "results.jsonl", notebook="04_pinned_memory")
    store.add("link", "host-device link", "link_limit", 63.0, "GB/s", source="sysfs")
    for method, peak in (("pageable", 20.0), ("pinned_copy_only", 55.0)):
        store.add("h2d bandwidth", method, "peak_bandwidth", peak, "GB/s")
        store.add("h2d bandwidth", method, "bandwidth_at_largest_size", peak * 0.9, "GB/s")
    out = bandwidth_summary(tmp_path / "results.jsonl")
    assert out["link_gbps"] == 63.0 and out["link_source"] == "sysfs"
    assert out["methods"]["pinned_copy_only"]["peak_share_of_link"] == pytest.approx(55 / 63)
    assert out["pinned_over_pageable"] == pytest.approx(2.75)


@pytest.mark.slow
@pytest.mark.notebook
def test_device_check_runs_every_step_on_the_cpu(tmp_path, smoke_run, monkeypatch):
    """Every step on the CPU. The notebooks step is the session's smoke run (the same notebooks, profile and device
    as device-check asks the runner for, already executed once), copied to where device-check wants its run."""
    from helpers.workbook import runner

    smoke_dir, smoke_state = smoke_run
    asked = []

    def the_smoke_run(options, echo=print, **kw):
        asked.append((options.profile, options.device, tuple(options.only)))
        out = Path(options.out)
        shutil.copytree(smoke_dir, out)
        lines = (out / "results.jsonl").read_text().splitlines()
        keep = [line for line in lines if json.loads(line)["notebook"][:2] in options.only]
        (out / "results.jsonl").write_text("".join(line + "\n" for line in keep))
        return out, replace(smoke_state, notebooks=[n for n in smoke_state.notebooks if n.id[:2] in options.only])

    monkeypatch.setattr(runner, "run", the_smoke_run)
    summary = device_check(device="cpu", out=tmp_path / "dc", profile="smoke", echo=print)
    assert asked == [("smoke", "cpu", tuple(DEVICE_NOTEBOOKS))]
    written = json.loads((tmp_path / "dc" / "device_check.json").read_text())
    assert written["steps"] == summary["steps"]
    assert summary["steps"]["bandwidth"]["status"] == "not applicable"  # nothing is copied on a CPU
    assert all(s["status"] == "ok" for k, s in summary["steps"].items() if k not in ("bandwidth", "tune")), \
        summary["steps"]
    assert "apply only on a CUDA or NPU device" in summary["steps"]["tune"]["reason"]  # nothing to measure here
    ran = {nb[:2] for nb in summary["notebooks"]}
    assert ran == set(DEVICE_NOTEBOOKS)
    assert summary["notebooks"]["04_pinned_memory"]["recommendation"] == "not applicable"  # no copy on a CPU
    assert summary["bench_input_pipeline"]["preprocess_speedup"] > 0
    assert summary["bandwidth"]["methods"] == {} or all(
        m["peak_gbps"] is None for m in summary["bandwidth"]["methods"].values())
    assert summary["traces"]["ok"], summary["traces"]  # the two loops' verdicts flip, by trace and by instrument


def test_the_trace_step_records_two_loops_whose_verdicts_flip(tmp_path):
    from helpers.bottleneck import DEVICE_BOUND, HOST_BOUND
    from helpers.workbook.trace_check import trace_flip

    lines = []
    out = trace_flip("cpu", tmp_path, echo=lines.append)
    for kind, label in (("host-bound", HOST_BOUND), ("device-bound", DEVICE_BOUND)):
        assert list((tmp_path / kind).glob("*.pt.trace.json")), f"no trace written for the {kind} loop"
        assert out[kind]["trace"]["label"] == label and out[kind]["instrument"]["label"] == label, out[kind]
    host, dev = out["host-bound"], out["device-bound"]
    assert host["trace"]["exposed_fraction"] > 0.5 > dev["trace"]["exposed_fraction"]
    assert dev["trace"]["compute_share"] > host["trace"]["compute_share"]
    assert out["flips"] == {"trace": True, "instrument": True} and out["ok"]
    assert any("trace says host-bound" in line and "instrument says host-bound" in line for line in lines)


def test_the_trace_step_is_not_applicable_on_an_npu(tmp_path):
    from helpers.workbook.trace_check import trace_flip

    out = trace_flip("npu", tmp_path)
    assert out["status"] == "not applicable" and "torch_npu.profiler" in out["reason"]
    assert not any(tmp_path.iterdir())
