"""Tests for helpers.device.

On this CPU-only machine the real paths are the CPU ones; the CUDA path is
checked by faking torch.accelerator / torch.cuda availability with
monkeypatch (the Accelerator must then reach the device only through the
generic calls that are faked), and NPU decisions by faking the probe.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import torch

from helpers import device as dev
from helpers.device import Capabilities, Capability, get_accelerator
from helpers import npu_probe
from helpers.npu_probe import NpuProbe
from helpers.errors import DeviceUnavailableError, ParameterError

REPO = Path(__file__).resolve().parents[1]

CPU_BUILD = torch.version.cuda is None and getattr(torch.version, "hip", None) is None
NO_ACCELERATOR = not torch.accelerator.is_available()
TORCH_NPU_PRESENT = importlib.util.find_spec("torch_npu") is not None

NOT_INSTALLED = NpuProbe(status="not installed", cause="torch_npu is not installed.",
                         fix="pip install -e '.[npu]'")
BROKEN = NpuProbe(status="broken",
                  cause="CANN runtime libraries are not on the library path (libhccl.so not found).",
                  fix="source /usr/local/Ascend/ascend-toolkit/set_env.sh")

needs_plain_cpu = pytest.mark.skipif(
    not NO_ACCELERATOR or TORCH_NPU_PRESENT,
    reason="checks the CPU-only behaviour; this machine has an accelerator or torch_npu",
)


@pytest.fixture
def cpu():
    return get_accelerator("cpu")


# ---------------------------------------------------------------------------
# import and kind validation


def test_importing_device_does_not_import_torch():
    code = "import sys, helpers.device; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("kind", ["cpu", "CPU", " Cpu "])
def test_kind_is_case_insensitive(kind):
    assert get_accelerator(kind).kind == "cpu"


def test_unknown_kind_gpu_suggests_cuda():
    with pytest.raises(ParameterError) as err:
        get_accelerator("gpu")
    msg = str(err.value)
    assert "'gpu'" in msg and "auto, cpu, cuda, npu" in msg and "did you mean 'cuda'" in msg


def test_unsupported_torch_device_kind_is_named():
    with pytest.raises(ParameterError, match="'xpu' is not supported by the workbook"):
        get_accelerator("xpu")


def test_kind_with_index_suggests_index_argument():
    with pytest.raises(ParameterError, match=r"get_accelerator\('cuda', index=1\)"):
        get_accelerator("cuda:1")


@pytest.mark.parametrize("kind", [None, 3, ["cpu"]])
def test_kind_must_be_a_string(kind):
    with pytest.raises(ParameterError, match="must be a string"):
        get_accelerator(kind)


@pytest.mark.parametrize("index", [-1, 1, True, 0.0, "0"])
def test_bad_cpu_index(index):
    with pytest.raises(ParameterError, match="index"):
        get_accelerator("cpu", index=index)


# ---------------------------------------------------------------------------
# the CPU


@needs_plain_cpu
def test_auto_is_cpu_here():
    acc = get_accelerator()
    assert acc.kind == "cpu" and acc.is_cpu
    assert acc.device == torch.device("cpu")
    assert acc.count == 1 and acc.index == 0
    assert acc.name and isinstance(acc.name, str)


def test_cpu_capabilities_say_why_not(cpu):
    caps = cpu.capabilities
    for name in ("pinned_memory", "non_blocking_copy", "streams", "events", "memory_stats"):
        cap = getattr(caps, name)
        assert cap.available is False, name
        assert str(cap).startswith("not available: ") and len(cap.detail) > 20, name
    assert "no overlap" in caps.streams.detail or "overlaps nothing" in caps.streams.detail
    assert str(caps.channels_last) == "available"
    # torch 2.13's CPU autocast accepts both (torch/amp/autocast_mode.py)
    assert caps.autocast_dtypes == ("bfloat16", "float16")
    d = caps.as_dict()
    assert set(d) == {"pinned_memory", "non_blocking_copy", "streams", "events",
                      "memory_stats", "channels_last", "autocast_dtypes"}
    assert d["autocast_dtypes"] == "bfloat16, float16"
    assert all(isinstance(v, str) for v in d.values())


@needs_plain_cpu
def test_cpu_pinned_reason_matches_torch_behaviour(cpu):
    # The reason the capability gives is what torch really does here.
    with pytest.raises(RuntimeError, match="Cannot access accelerator device"):
        torch.zeros(4).pin_memory()
    assert "Cannot access accelerator device" in cpu.capabilities.pinned_memory.detail


def test_capability_str():
    assert str(Capability(True, "x")) == "available"
    assert str(Capability(False, "no device")) == "not available: no device"


def test_cpu_device_operations_are_safe_no_ops(cpu):
    assert cpu.synchronize() is None
    assert cpu.new_stream() is None
    assert cpu.new_event(enable_timing=True) is None
    assert cpu.reset_peak_memory_stats() is None


def test_cpu_memory_stats_are_process_rss_and_uss(cpu):
    stats = cpu.memory_stats()
    assert stats["source"] == "process"
    assert stats["rss_bytes"] > 0 and stats["uss_bytes"] > 0
    assert stats["uss_bytes"] <= stats["rss_bytes"] or stats["uss_is_rss"]
    if stats["peak_rss_bytes"] is not None:
        assert stats["peak_rss_bytes"] > 0


def test_cpu_memory_stats_fall_back_to_rss_when_uss_denied(cpu, monkeypatch):
    def denied(self):
        raise psutil.AccessDenied(pid=os.getpid())

    monkeypatch.setattr(psutil.Process, "memory_full_info", denied)
    stats = cpu.memory_stats()
    assert stats["uss_is_rss"] is True
    assert stats["uss_bytes"] == stats["rss_bytes"]


@pytest.mark.parametrize("dtype", ["bfloat16", "bf16", "BF16", torch.bfloat16])
def test_cpu_autocast_bf16_matmul(cpu, dtype):
    a = torch.randn(16, 16)
    with cpu.autocast(dtype):
        out = a @ a
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), a @ a, rtol=2e-2, atol=1e-1)


def test_cpu_autocast_fp16_alias(cpu):
    with cpu.autocast("fp16"):
        out = torch.randn(4, 4) @ torch.randn(4, 4)
    assert out.dtype == torch.float16


@pytest.mark.parametrize("dtype", [torch.float64, "float64", "float32", "int8", "nonsense"])
def test_cpu_autocast_rejects_unsupported(cpu, dtype):
    with pytest.raises(ParameterError, match="not supported on cpu.*bfloat16, float16"):
        cpu.autocast(dtype)


def test_autocast_dtype_type_checked(cpu):
    with pytest.raises(ParameterError, match="str or torch.dtype"):
        cpu.autocast(16)


def test_to_device_on_cpu(cpu):
    t = torch.arange(6.0).reshape(2, 3)
    assert cpu.to_device(t) is t
    assert cpu.to_device(t, non_blocking=True) is t  # ignored on cpu, no error


def test_describe_is_json_serialisable(cpu):
    d = cpu.describe()
    json.dumps(d)
    assert d["kind"] == "cpu" and d["torch_version"] == torch.__version__
    assert d["capabilities"]["streams"].startswith("not available: ")


# ---------------------------------------------------------------------------
# CUDA and NPU requested where they cannot be used


@pytest.mark.skipif(not CPU_BUILD, reason="needs a CPU build of torch")
def test_cuda_on_cpu_build_says_so():
    with pytest.raises(DeviceUnavailableError) as err:
        get_accelerator("cuda")
    msg = str(err.value)
    assert "CPU build" in msg and "torch.version.cuda is None" in msg
    assert "install a CUDA build of torch" in msg


def test_cuda_build_without_gpu_names_visible_devices(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(DeviceUnavailableError, match=r"no GPU is visible \(CUDA_VISIBLE_DEVICES=''\)"):
        get_accelerator("cuda")


@pytest.mark.skipif(TORCH_NPU_PRESENT, reason="torch_npu is installed here")
def test_npu_not_installed_says_how_to_install(monkeypatch):
    monkeypatch.setattr(npu_probe, "_CACHE", None)  # a real probe
    with pytest.raises(DeviceUnavailableError) as err:
        get_accelerator("NPU")
    msg = str(err.value)
    assert "torch_npu is not installed" in msg
    assert "pip install -e '.[npu]'" in msg and "CANN" in msg


def test_npu_broken_gives_cause_and_fix(monkeypatch):
    monkeypatch.setattr(npu_probe, "_CACHE", BROKEN)
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    with pytest.raises(DeviceUnavailableError, match="libhccl.so not found.*set_env.sh"):
        get_accelerator("npu")


@pytest.mark.skipif(TORCH_NPU_PRESENT, reason="torch_npu is installed here")
def test_npu_usable_in_child_but_not_importable_here(monkeypatch):
    monkeypatch.setattr(npu_probe, "_CACHE", NpuProbe(status="usable", device_count=1))
    with pytest.raises(DeviceUnavailableError, match="child process but not here"):
        get_accelerator("npu")


@pytest.mark.skipif(not CPU_BUILD, reason="needs a CPU build of torch")
def test_auto_with_broken_npu_falls_back_and_warns(monkeypatch, caplog):
    monkeypatch.setattr(npu_probe, "_CACHE", BROKEN)
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    with caplog.at_level(logging.WARNING, logger=dev.__name__):
        acc = get_accelerator("auto")
    assert acc.kind == "cpu"
    assert "libhccl.so not found" in caplog.text


def test_npu_capabilities_forbid_channels_last():
    caps = dev._device_capabilities(torch, "npu")
    assert not caps.channels_last.available
    assert "contiguous_format/preserve_format" in str(caps.channels_last)
    assert caps.streams.available and caps.pinned_memory.available


# ---------------------------------------------------------------------------
# a faked CUDA device: everything must go through the generic APIs


class Recorder:
    def __init__(self, value=None):
        self.calls = []
        self.value = value

    def __call__(self, *args, **kwargs):
        self.calls.append(args)
        return self.value


@pytest.fixture
def fake_cuda(monkeypatch):
    """Make this CPU build look like a CUDA build with two GPUs (nothing runs on them)."""
    if not CPU_BUILD:
        pytest.skip("fakes CUDA on a CPU build only")
    monkeypatch.setattr(npu_probe, "_CACHE", NOT_INSTALLED)
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: f"Fake GPU {index}")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "device_count", lambda: 2)
    monkeypatch.setattr(torch.accelerator, "current_accelerator",
                        lambda check_available=False: torch.device("cuda"))
    rec = {
        "synchronize": Recorder(),
        "reset_peak_memory_stats": Recorder(),
        "memory_allocated": Recorder(300),
        "memory_reserved": Recorder(400),
        "max_memory_allocated": Recorder(350),
    }
    monkeypatch.setattr(torch.accelerator, "synchronize", rec["synchronize"])
    for name in ("reset_peak_memory_stats", "memory_allocated", "memory_reserved",
                 "max_memory_allocated"):
        monkeypatch.setattr(torch.accelerator.memory, name, rec[name])
    return rec


def test_fake_cuda_is_chosen_by_auto_with_generic_capabilities(fake_cuda):
    acc = get_accelerator("auto", index=1)
    assert acc.kind == "cuda" and acc.count == 2 and acc.index == 1
    assert acc.device == torch.device("cuda", 1)
    assert acc.name == "Fake GPU 1"  # via torch.get_device_module("cuda")
    caps = acc.capabilities
    for name in ("pinned_memory", "non_blocking_copy", "streams", "events", "memory_stats",
                 "channels_last"):
        assert getattr(caps, name).available, name
    assert caps.autocast_dtypes == ("bfloat16", "float16")


def test_fake_cuda_without_bf16(fake_cuda, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    acc = get_accelerator("cuda")
    assert acc.capabilities.autocast_dtypes == ("float16",)
    with pytest.raises(ParameterError, match="not supported on cuda"):
        acc.autocast("bf16")
    ctx = acc.autocast("fp16")
    assert isinstance(ctx, torch.amp.autocast) and ctx.device == "cuda"
    assert ctx.fast_dtype == torch.float16


def test_fake_cuda_sync_and_memory_use_torch_accelerator(fake_cuda):
    acc = get_accelerator("cuda", index=1)
    acc.synchronize()
    assert fake_cuda["synchronize"].calls == [(1,)]
    stats = acc.memory_stats()
    assert stats == {
        "allocated_bytes": 300, "reserved_bytes": 400, "peak_allocated_bytes": 350,
        "fragmentation": pytest.approx(0.25), "source": "device", "device": "cuda:1",
    }
    assert fake_cuda["memory_allocated"].calls == [(1,)]
    acc.reset_peak_memory_stats()
    assert fake_cuda["reset_peak_memory_stats"].calls == [(1,)]


def test_fake_cuda_fragmentation_none_when_nothing_reserved(fake_cuda):
    fake_cuda["memory_reserved"].value = 0
    fake_cuda["memory_allocated"].value = 0
    assert get_accelerator("cuda").memory_stats()["fragmentation"] is None


def test_fake_cuda_index_out_of_range(fake_cuda):
    with pytest.raises(ParameterError, match=r"index 2 is out of range: 2 cuda device\(s\)"):
        get_accelerator("cuda", index=2)


def test_capabilities_dataclass_is_frozen(cpu):
    with pytest.raises(AttributeError):
        cpu.capabilities.streams = Capability(True)  # type: ignore[misc]
    assert isinstance(cpu.capabilities, Capabilities)
    with pytest.raises(AttributeError):
        cpu.kind = "cuda"  # type: ignore[misc]
