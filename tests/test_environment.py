"""Tests for helpers.diagnose.environment (read-only environment doctor)."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers.diagnose import environment as env

X86_CPUINFO = textwrap.dedent("""\
    processor\t: 0
    vendor_id\t: GenuineIntel
    model name\t: Intel(R) Xeon(R) Platinum 8480+
    flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_tile amx_bf16 avx512_fp16

    processor\t: 1
    model name\t: Intel(R) Xeon(R) Platinum 8480+
    flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_tile amx_bf16 avx512_fp16
    """)

X86_NO_BF16_CPUINFO = "processor\t: 0\nmodel name\t: Old CPU\nflags\t\t: fpu sse2 avx2\n"

ARM_CPUINFO = textwrap.dedent("""\
    processor\t: 0
    BogoMIPS\t: 200.00
    Features\t: fp asimd evtstrm aes sve bf16
    CPU implementer\t: 0x48
    CPU part\t: 0xd01
    """)


def make_root(tmp_path: Path, cpuinfo: str | None = None, nodes: dict[str, str] | None = None,
              cpu_max: str | None = None) -> Path:
    root = tmp_path / "root"
    (root / "proc").mkdir(parents=True)
    if cpuinfo is not None:
        (root / "proc" / "cpuinfo").write_text(cpuinfo)
    for node, cpulist in (nodes or {}).items():
        d = root / "sys" / "devices" / "system" / "node" / node
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpulist + "\n")
    if cpu_max is not None:
        cg = root / "sys" / "fs" / "cgroup"
        cg.mkdir(parents=True)
        (cg / "cpu.max").write_text(cpu_max + "\n")
    return root


def test_x86_flags_model_numa_and_quota(tmp_path, monkeypatch):
    monkeypatch.setattr(env.platform, "machine", lambda: "x86_64")
    root = make_root(tmp_path, X86_CPUINFO, {"node0": "0-55,112-167", "node1": "56-111,168-223"},
                     "200000 100000")
    info = env.system_info(root=root)
    assert info["cpu_model"] == "Intel(R) Xeon(R) Platinum 8480+"
    assert info["cpu_flags"] == {name: True for name in env.CPU_FLAGS}
    assert all(v is None for v in info["arm_cpu_flags"].values())
    assert info["numa_nodes"] == 2
    assert info["numa_cpulists"] == {"node0": "0-55,112-167", "node1": "56-111,168-223"}
    assert info["cgroup_cpu_max"] == "200000 100000"
    assert info["cgroup_cpu_quota_cores"] == pytest.approx(2.0)


def test_missing_flag_is_false_not_none(tmp_path, monkeypatch):
    monkeypatch.setattr(env.platform, "machine", lambda: "x86_64")
    info = env.system_info(root=make_root(tmp_path, X86_NO_BF16_CPUINFO))
    assert info["cpu_flags"]["avx2"] is True
    assert info["cpu_flags"]["avx512_bf16"] is False
    assert info["cpu_flags"]["amx_bf16"] is False


def test_unlimited_cgroup_quota_is_none(tmp_path):
    info = env.system_info(root=make_root(tmp_path, X86_CPUINFO, cpu_max="max 100000"))
    assert info["cgroup_cpu_max"] == "max 100000"
    assert info["cgroup_cpu_quota_cores"] is None


def test_unreadable_sources_give_none(tmp_path):
    info = env.system_info(root=make_root(tmp_path, cpuinfo=None))
    assert all(v is None for v in info["cpu_flags"].values())
    assert info["numa_nodes"] is None and info["numa_cpulists"] == {}
    assert info["cgroup_cpu_max"] is None and info["cgroup_cpu_quota_cores"] is None


def test_arm_features_and_bf16(tmp_path, monkeypatch):
    monkeypatch.setattr(env.platform, "machine", lambda: "aarch64")
    info = env.system_info(root=make_root(tmp_path, ARM_CPUINFO))
    assert all(v is None for v in info["cpu_flags"].values())
    assert info["arm_cpu_flags"] == {"asimd": True, "sve": True, "bf16": True}
    assert "0x48" in info["cpu_model"] and "0xd01" in info["cpu_model"]
    assert env.cpu_bf16_support(info)["native_bf16"] is True


def test_real_machine_counts_are_consistent():
    info = env.system_info()
    assert info["logical_cores"] >= 1
    if info["usable_cores"] is not None:
        assert 1 <= info["usable_cores"] <= info["logical_cores"]
    assert info["memory_total_bytes"] >= info["memory_available_bytes"] > 0
    assert info["mp_start_method"] in ("fork", "spawn", "forkserver")


def test_torch_threads_reported_only_when_imported():
    import torch

    info = env.system_info()
    assert info["torch_imported"] is True
    assert info["torch_intra_op_threads"] == torch.get_num_threads()
    assert info["torch_inter_op_threads"] == torch.get_num_interop_threads()


def test_does_not_import_torch_or_fix_start_method():
    code = ("import sys, multiprocessing; import helpers.diagnose.environment as e; "
            "i = e.system_info(); e.package_versions(); e.cpu_bf16_support(i); "
            "assert 'torch' not in sys.modules, 'torch was imported'; "
            "assert i['torch_imported'] is False; "
            "assert multiprocessing.get_start_method(allow_none=True) is None, 'start method fixed'")
    result = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_package_versions_reads_metadata():
    versions = env.package_versions(("pytest", "no-such-distribution-xyz-123"))
    assert versions == {"pytest": importlib.metadata.version("pytest"),
                        "no-such-distribution-xyz-123": None}
    assert set(env.package_versions()) == set(env.DEFAULT_PACKAGES)


@pytest.mark.parametrize("flags, native", [
    ({"amx_bf16": True, "avx512_bf16": False}, True),
    ({"amx_bf16": False, "avx512_bf16": True}, True),
    ({"amx_bf16": False, "avx512_bf16": False, "avx2": True}, False),
])
def test_cpu_bf16_support_from_flags(flags, native):
    result = env.cpu_bf16_support({"cpu_flags": flags, "arm_cpu_flags": {}})
    assert result["native_bf16"] is native
    if not native:
        assert "slower than fp32" in result["detail"]


def test_cpu_bf16_support_unknown_flags():
    result = env.cpu_bf16_support({"cpu_flags": {n: None for n in env.CPU_FLAGS},
                                   "arm_cpu_flags": {n: None for n in env.ARM_CPU_FLAGS}})
    assert result["native_bf16"] is False
    assert "could not be read" in result["detail"]


def test_environment_frame_flattens_and_formats():
    frame = env.environment_frame({"os": "Linux", "cpu_flags": {"avx2": True, "amx_bf16": None},
                                   "memory_total_bytes": 2 * 2**30, "numa_cpulists": {}})
    assert list(frame.columns) == ["item", "value"]
    rows = dict(zip(frame["item"], frame["value"]))
    assert rows["os"] == "Linux"
    assert rows["cpu_flags.avx2"] == "True"
    assert rows["cpu_flags.amx_bf16"] == "n/a"
    assert rows["memory_total_bytes"] == "2.0 GiB (2147483648 bytes)"
    assert rows["numa_cpulists"] == "n/a"
