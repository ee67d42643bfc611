"""Machine facts of the host-device link and the host's caches: the PCIe limit from sysfs, the last-level cache.

Everything is read from fake sysfs trees built in ``tmp_path``; a CUDA
device's PCI address comes from a faked ``torch.cuda.get_device_properties``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from helpers.device import get_accelerator
from helpers.diagnose import pcie
from helpers.errors import ParameterError


def accelerator_like(kind):
    """What :func:`helpers.diagnose.pcie.device_pci_address` reads of an accelerator, for a device of ``kind``."""
    return SimpleNamespace(kind=kind, index=0, is_cpu=False)


# --------------------------------------------------------------------------- sysfs


def make_sysfs(root, address="0000:65:00.0", *, cur_speed="32.0 GT/s PCIe", max_speed="32.0 GT/s PCIe",
               cur_width="16", max_width="16", up_speed="32.0 GT/s PCIe", up_width="16"):
    """A fake /sys with the device below an upstream port, linked from bus/pci/devices like Linux does."""
    port = root / "devices" / "pci0000:64" / "0000:64:01.0"
    dev = port / address
    dev.mkdir(parents=True)
    for name, value in (("current_link_speed", cur_speed), ("max_link_speed", max_speed),
                        ("current_link_width", cur_width), ("max_link_width", max_width)):
        if value is not None:
            (dev / name).write_text(value + "\n")
    if up_speed is not None:
        (port / "max_link_speed").write_text(up_speed + "\n")
        (port / "max_link_width").write_text(up_width + "\n")
    links = root / "bus" / "pci" / "devices"
    links.mkdir(parents=True)
    os.symlink(os.path.relpath(dev, links), links / address)
    return root


@pytest.mark.parametrize("text, expected", [
    ("16.0 GT/s PCIe", 16.0), ("8 GT/s", 8.0), ("8.0 GT/s", 8.0), ("2.5 GT/s PCIe", 2.5),
    ("32.0 GT/s PCIe\n", 32.0), ("Unknown", None), ("", None),
])
def test_parse_link_speed(text, expected):
    assert pcie.parse_link_speed(text) == expected


@pytest.mark.parametrize("text, expected", [("16", 16), ("x8", 8), ("0", None), ("", None)])
def test_parse_link_width(text, expected):
    assert pcie.parse_link_width(text) == expected


def test_pcie_limits_match_the_published_figures():
    # 128b/130b: Gen3 x16 = 8 GT/s x 16 x 128/130 / 8 = 15.75 GB/s, Gen4 31.5, Gen5 63.0
    assert pcie.pcie_limit_gbps(8.0, 16) == pytest.approx(15.754, abs=1e-3)
    assert pcie.pcie_limit_gbps(16.0, 16) == pytest.approx(31.508, abs=1e-3)
    assert pcie.pcie_limit_gbps(32.0, 16) == pytest.approx(63.015, abs=1e-3)
    assert pcie.pcie_limit_gbps(2.5, 1) == pytest.approx(0.25)  # 8b/10b
    with pytest.raises(ParameterError, match="not a PCIe line rate"):
        pcie.pcie_limit_gbps(10.0, 16)
    with pytest.raises(ParameterError, match="width"):
        pcie.pcie_limit_gbps(8.0, 0)


def test_read_link_gen5_x16(tmp_path):
    root = make_sysfs(tmp_path)
    link = pcie.read_pcie_link("0000:65:00.0", sysfs_root=root)
    assert (link.source, link.generation, link.width) == ("sysfs", 5, 16)
    assert link.limit_gbps == pytest.approx(63.015, abs=1e-3)
    assert link.notes == ()
    assert "Gen5 x16" in link.label()


def test_read_link_idle_speed_uses_what_both_ends_support(tmp_path):
    # a Gen5 GPU in a Gen4 slot, idling at Gen1: the limit is Gen4 x16, with a note
    root = make_sysfs(tmp_path, cur_speed="2.5 GT/s PCIe", up_speed="16.0 GT/s PCIe")
    link = pcie.read_pcie_link("0000:65:00.0", sysfs_root=root)
    assert (link.generation, link.gt_per_s, link.width) == (4, 16.0, 16)
    assert link.current_gt_per_s == 2.5 and link.upstream_max_gt_per_s == 16.0
    assert link.limit_gbps == pytest.approx(31.508, abs=1e-3)
    assert len(link.notes) == 1 and "idle" in link.notes[0]


def test_read_link_trained_narrow_uses_the_trained_width(tmp_path):
    root = make_sysfs(tmp_path, cur_width="8")
    link = pcie.read_pcie_link("0000:65:00.0", sysfs_root=root)
    assert link.width == 8 and link.limit_gbps == pytest.approx(31.508, abs=1e-3)
    assert any("x8" in n and "x16" in n for n in link.notes)


def test_read_link_without_upstream_port_or_with_old_kernel_format(tmp_path):
    root = make_sysfs(tmp_path, cur_speed="8 GT/s", max_speed="8 GT/s", up_speed=None)
    link = pcie.read_pcie_link("0000:65:00.0", sysfs_root=root)
    assert link.generation == 3 and link.limit_gbps == pytest.approx(15.754, abs=1e-3)


def test_read_link_missing_or_unreadable_is_unknown_not_an_error(tmp_path):
    link = pcie.read_pcie_link("0000:01:00.0", sysfs_root=tmp_path)
    assert link.limit_gbps is None and link.source == "unknown" and "link_gbps" in link.detail
    root = make_sysfs(tmp_path / "b", cur_speed="Unknown", max_speed="Unknown", up_speed=None)
    link = pcie.read_pcie_link("0000:65:00.0", sysfs_root=root)
    assert link.limit_gbps is None and link.source == "unknown"


def test_link_limit_parameter_cpu_and_cuda_address(tmp_path, monkeypatch):
    cpu = get_accelerator("cpu")
    assert pcie.link_limit(cpu, 12.5).limit_gbps == 12.5
    unknown = pcie.link_limit(cpu)
    assert unknown.limit_gbps is None and "CPU" in unknown.detail
    with pytest.raises(ParameterError):
        pcie.link_limit(cpu, -1.0)
    # CUDA: the PCI address comes from torch.cuda.get_device_properties (faked here)
    props = SimpleNamespace(pci_domain_id=0, pci_bus_id=0x65, pci_device_id=0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    acc = accelerator_like("cuda")
    assert pcie.device_pci_address(acc) == ("0000:65:00.0", "")
    root = make_sysfs(tmp_path, cur_speed="16.0 GT/s PCIe", max_speed="16.0 GT/s PCIe", up_speed="16.0 GT/s PCIe")
    link = pcie.link_limit(acc, sysfs_root=root)
    assert link.source == "sysfs" and link.generation == 4 and link.address == "0000:65:00.0"
    address, why = pcie.device_pci_address(accelerator_like("npu"))
    assert address is None and "npu" in why


def _cache_tree(root, entries):
    for i, (level, kind, size) in enumerate(entries):
        d = root / f"index{i}"
        d.mkdir(parents=True)
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size}\n")
    return root


def test_last_level_cache_from_sysfs(tmp_path):
    root = _cache_tree(tmp_path / "cache", [(1, "Data", "32K"), (1, "Instruction", "32K"), (2, "Unified", "1024K"),
                                            (3, "Unified", "32768K")])
    assert pcie.last_level_cache_bytes(root) == 32 * 2**20
    only_l2 = _cache_tree(tmp_path / "l2", [(1, "Instruction", "64K"), (2, "Unified", "2M")])
    assert pcie.last_level_cache_bytes(only_l2) == 2 * 2**20
    assert pcie.last_level_cache_bytes(tmp_path / "absent") is None
    garbled = _cache_tree(tmp_path / "bad", [(3, "Unified", "lots")])
    assert pcie.last_level_cache_bytes(garbled) is None


def test_size_regime():
    mib = 2**20
    assert pcie.size_regime(8 * mib, 32 * mib) == "cache"
    assert pcie.size_regime(24 * mib, 32 * mib) == "mixed"
    assert pcie.size_regime(256 * mib, 32 * mib) == "memory"
    assert pcie.size_regime(256 * mib, None) == "unknown"



def test_the_module_reads_the_machine_without_importing_torch():
    """torch is imported only to ask a CUDA device for its PCI address; reading sysfs needs none."""
    code = ("import sys; import helpers.diagnose.pcie as p; p.last_level_cache_bytes(); "
            "p.link_limit(__import__('types').SimpleNamespace(kind='cpu', is_cpu=True)); "
            "assert 'torch' not in sys.modules, 'importing pcie imported torch'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=os.path.dirname(os.path.dirname(__file__)))
