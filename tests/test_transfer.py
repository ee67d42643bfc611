"""Host-to-device copy methods, the PCIe link limit from sysfs, and the pinning verdict.

No accelerator here: the CPU path must report "not applicable" without raising
(pytorch/pytorch#73003), and the device paths are exercised with a faked accelerator whose
"device" is the CPU, with ``Tensor.pin_memory`` replaced by a copy (pinning itself
cannot run without an accelerator).
"""

from __future__ import annotations

import math
import os
import warnings
from types import SimpleNamespace

import pytest
import torch

from helpers.device import Capabilities, Capability, get_accelerator
from helpers.errors import DeviceUnavailableError, ParameterError
from helpers.pipeline import transfer as tr
from helpers.timing import Comparison, Measurement

# --------------------------------------------------------------------------- fakes


class FakeEvent:
    """Records its calls in a shared log; elapsed_time returns a fixed 2 ms."""

    def __init__(self, log, name):
        self.log, self.name, self.recorded = log, name, 0

    def record(self, stream=None):
        self.recorded += 1
        self.log.append(("record", self.name))

    def synchronize(self):
        self.log.append(("synchronize", self.name))

    def elapsed_time(self, other):
        return 2.0


def fake_accelerator(log=None):
    """An accelerator that claims pinned memory, streams and events, on the CPU device."""
    log = [] if log is None else log
    yes = Capability(True, "faked for a test")
    caps = Capabilities(pinned_memory=yes, non_blocking_copy=yes, streams=yes, events=yes,
                        memory_stats=Capability(False, "fake"), channels_last=yes)
    counter = iter(range(10**6))
    return SimpleNamespace(
        kind="cuda", name="fake", count=1, index=0, device=torch.device("cpu"), capabilities=caps, is_cpu=False,
        synchronize=lambda: log.append(("device_sync",)),
        new_event=lambda enable_timing=False: FakeEvent(log, f"ev{next(counter)}"),
        new_stream=lambda: None, log=log,
    )


@pytest.fixture
def fake_pin(monkeypatch):
    """Make Tensor.pin_memory a plain copy (counted), as it cannot run without an accelerator."""
    calls = []

    def pin(self, *args, **kwargs):
        calls.append(self.numel())
        return self.clone()

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin)
    return calls


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
    assert tr.parse_link_speed(text) == expected


@pytest.mark.parametrize("text, expected", [("16", 16), ("x8", 8), ("0", None), ("", None)])
def test_parse_link_width(text, expected):
    assert tr.parse_link_width(text) == expected


def test_pcie_limits_match_the_published_figures():
    # 128b/130b: Gen3 x16 = 8 GT/s x 16 x 128/130 / 8 = 15.75 GB/s, Gen4 31.5, Gen5 63.0
    assert tr.pcie_limit_gbps(8.0, 16) == pytest.approx(15.754, abs=1e-3)
    assert tr.pcie_limit_gbps(16.0, 16) == pytest.approx(31.508, abs=1e-3)
    assert tr.pcie_limit_gbps(32.0, 16) == pytest.approx(63.015, abs=1e-3)
    assert tr.pcie_limit_gbps(2.5, 1) == pytest.approx(0.25)  # 8b/10b
    with pytest.raises(ParameterError, match="not a PCIe line rate"):
        tr.pcie_limit_gbps(10.0, 16)
    with pytest.raises(ParameterError, match="width"):
        tr.pcie_limit_gbps(8.0, 0)


def test_read_link_gen5_x16(tmp_path):
    root = make_sysfs(tmp_path)
    link = tr.read_pcie_link("0000:65:00.0", sysfs_root=root)
    assert (link.source, link.generation, link.width) == ("sysfs", 5, 16)
    assert link.limit_gbps == pytest.approx(63.015, abs=1e-3)
    assert link.notes == ()
    assert "Gen5 x16" in link.label()


def test_read_link_idle_speed_uses_what_both_ends_support(tmp_path):
    # a Gen5 GPU in a Gen4 slot, idling at Gen1: the limit is Gen4 x16, with a note
    root = make_sysfs(tmp_path, cur_speed="2.5 GT/s PCIe", up_speed="16.0 GT/s PCIe")
    link = tr.read_pcie_link("0000:65:00.0", sysfs_root=root)
    assert (link.generation, link.gt_per_s, link.width) == (4, 16.0, 16)
    assert link.current_gt_per_s == 2.5 and link.upstream_max_gt_per_s == 16.0
    assert link.limit_gbps == pytest.approx(31.508, abs=1e-3)
    assert len(link.notes) == 1 and "idle" in link.notes[0]


def test_read_link_trained_narrow_uses_the_trained_width(tmp_path):
    root = make_sysfs(tmp_path, cur_width="8")
    link = tr.read_pcie_link("0000:65:00.0", sysfs_root=root)
    assert link.width == 8 and link.limit_gbps == pytest.approx(31.508, abs=1e-3)
    assert any("x8" in n and "x16" in n for n in link.notes)


def test_read_link_without_upstream_port_or_with_old_kernel_format(tmp_path):
    root = make_sysfs(tmp_path, cur_speed="8 GT/s", max_speed="8 GT/s", up_speed=None)
    link = tr.read_pcie_link("0000:65:00.0", sysfs_root=root)
    assert link.generation == 3 and link.limit_gbps == pytest.approx(15.754, abs=1e-3)


def test_read_link_missing_or_unreadable_is_unknown_not_an_error(tmp_path):
    link = tr.read_pcie_link("0000:01:00.0", sysfs_root=tmp_path)
    assert link.limit_gbps is None and link.source == "unknown" and "link_gbps" in link.detail
    root = make_sysfs(tmp_path / "b", cur_speed="Unknown", max_speed="Unknown", up_speed=None)
    link = tr.read_pcie_link("0000:65:00.0", sysfs_root=root)
    assert link.limit_gbps is None and link.source == "unknown"


def test_link_limit_parameter_cpu_and_cuda_address(tmp_path, monkeypatch):
    cpu = get_accelerator("cpu")
    assert tr.link_limit(cpu, 12.5).limit_gbps == 12.5
    unknown = tr.link_limit(cpu)
    assert unknown.limit_gbps is None and "CPU" in unknown.detail
    with pytest.raises(ParameterError):
        tr.link_limit(cpu, -1.0)
    # CUDA: the PCI address comes from torch.cuda.get_device_properties (faked here)
    props = SimpleNamespace(pci_domain_id=0, pci_bus_id=0x65, pci_device_id=0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    acc = fake_accelerator()
    assert tr.device_pci_address(acc) == ("0000:65:00.0", "")
    root = make_sysfs(tmp_path, cur_speed="16.0 GT/s PCIe", max_speed="16.0 GT/s PCIe", up_speed="16.0 GT/s PCIe")
    link = tr.link_limit(acc, sysfs_root=root)
    assert link.source == "sysfs" and link.generation == 4 and link.address == "0000:65:00.0"
    npu = SimpleNamespace(**{**vars(fake_accelerator()), "kind": "npu"})
    address, why = tr.device_pci_address(npu)
    assert address is None and "npu" in why


# --------------------------------------------------------------------------- sizes


def test_transfer_sizes_are_powers_of_two_between_the_bounds():
    sizes = tr.transfer_sizes(4, 1)
    assert sizes[0] == 4096 and sizes[-1] == 2**20 and len(sizes) == 9
    assert all(b == 2 * a for a, b in zip(sizes, sizes[1:]))
    assert tr.transfer_sizes(3, 1)[0] == 4096  # rounded up to a power of two
    with pytest.raises(ParameterError, match="above"):
        tr.transfer_sizes(4096, 1)
    with pytest.raises(ParameterError):
        tr.transfer_sizes(0, 1)


# --------------------------------------------------------------------------- CPU: not applicable


def test_cpu_reports_not_applicable_without_raising():
    acc = get_accelerator("cpu")
    app = tr.pinning_applicability(acc)
    assert not app.applicable and "Cannot access accelerator" in app.reason
    sweep = tr.bandwidth_sweep(acc, tr.transfer_sizes(4, 1))
    assert set(sweep["method"]) == set(tr.METHODS) | {tr.REFERENCE_METHOD}
    assert not sweep["applicable"].any() and sweep["gbps"].isna().all()
    assert (sweep["reason"] == app.reason).all()
    assert tr.check_methods(acc) == {}
    assert tr.batch_comparison(acc, (2, 8, 8, 3)) == {}
    verdict = tr.pinning_verdict({}, applicability=app)
    assert verdict["recommendation"] == "not applicable" and verdict["value"] is None
    assert verdict["reason"] == app.reason


def test_cpu_refuses_to_pin_with_a_clear_error():
    acc = get_accelerator("cpu")
    with pytest.raises(DeviceUnavailableError, match="not applicable|pinning_applicability"):
        with tr.copy_method("pin_per_batch", acc, torch.zeros(4, dtype=torch.uint8)):
            pass
    with pytest.raises(DeviceUnavailableError):
        tr.PinnedStaging(acc, 16)


def test_unknown_method_is_a_parameter_error():
    with pytest.raises(ParameterError, match="unknown copy method"):
        with tr.copy_method("telepathy", fake_accelerator(), torch.zeros(4)):
            pass
    with pytest.raises(ParameterError, match="unknown copy method"):
        tr.bandwidth_sweep(fake_accelerator(), [4096], methods=("telepathy",))


def test_host_copy_sweep_runs_anywhere():
    df = tr.host_copy_sweep([4096, 65536], repeats=3, warmup=1)
    assert list(df["size_bytes"]) == [4096, 65536]
    assert (df["gbps"] > 0).all() and (df["gbps_p25"] <= df["gbps_p75"]).all()


# --------------------------------------------------------------------------- faked device


def test_every_method_delivers_the_host_bytes(fake_pin):
    acc = fake_accelerator()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # DataLoader: "pin_memory ... no accelerator"
        ok = tr.check_methods(acc, nbytes=4096)
    assert ok == {m: True for m in tr.METHODS}
    assert fake_pin, "pin_memory() was used by the pinned methods"


def test_pinned_buffer_waits_for_the_previous_copy_before_overwriting(fake_pin):
    log = []
    acc = fake_accelerator(log)
    staging = tr.PinnedStaging(acc, 64)
    a = torch.arange(64, dtype=torch.uint8)
    b = torch.arange(64, dtype=torch.uint8).flip(0)
    out_a = staging.copy(a)
    assert torch.equal(out_a, a) and log == [("record", "ev0")]
    out_b = staging.copy(b.view(8, 8))
    # the second copy first waited for the event recorded after the first one
    assert log[1:] == [("synchronize", "ev0"), ("record", "ev0")]
    assert torch.equal(out_b, b.view(8, 8)) and out_b.shape == (8, 8)
    assert torch.equal(out_a, a), "the first result was not overwritten"
    f = torch.linspace(0, 1, 8)  # other dtypes travel as bytes and come back as themselves
    assert torch.equal(staging.copy(f), f)
    with pytest.raises(ParameterError, match="does not fit"):
        staging.copy(torch.zeros(65, dtype=torch.uint8))


def test_sweep_and_batch_comparison_on_the_faked_device(fake_pin):
    acc = fake_accelerator()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        sweep = tr.bandwidth_sweep(acc, [4096, 8192], methods=("pageable", "pinned_buffer"), repeats=3, warmup=1)
        comps = tr.batch_comparison(acc, (2, 8, 8, 3), methods=("pin_per_batch", "loader_pin_thread"),
                                    repeats=3, warmup=1)
    assert len(sweep) == 2 * 3 and sweep["applicable"].all()
    ref = sweep[sweep["method"] == tr.REFERENCE_METHOD]
    assert ref["median_s"].tolist() == pytest.approx([2e-3, 2e-3])  # fake events: 2 ms
    assert ref["gbps"].tolist() == pytest.approx([4096 / 2e-3 / 1e9, 8192 / 2e-3 / 1e9])
    assert set(comps) == {"pin_per_batch", "loader_pin_thread"}
    assert all(c.a.name == "pageable" and c.a.items_per_call == 2 * 8 * 8 * 3 for c in comps.values())


def _comparison(ratio_times, name):
    a = Measurement("pageable", tuple([1.0] * 5), warmup=0)
    b = Measurement(name, tuple(ratio_times), warmup=0)
    return Comparison.from_measurements(a, b)


def test_pinning_verdict_enables_only_a_clear_gain():
    clear = {"pin_per_batch": _comparison([0.9, 0.95, 0.92, 0.97, 0.93], "pin_per_batch"),
             "pinned_buffer": _comparison([0.5, 0.52, 0.49, 0.51, 0.5], "pinned_buffer")}
    v = tr.pinning_verdict(clear)
    assert v["recommendation"] == "enable" and v["method"] == "pinned_buffer"
    assert v["value"] == pytest.approx(2.0) and v["spread"]["ci_low"] > 1.05
    assert "reused pinned buffer" in v["reason"] and "pin_per_batch" in v["reason"]
    unclear = {"pin_per_batch": _comparison([0.97, 1.0, 0.98, 1.01, 0.99], "pin_per_batch")}
    v = tr.pinning_verdict(unclear)
    assert v["recommendation"] == "leave off" and not math.isnan(v["value"])
    assert tr.pinning_verdict({})["recommendation"] == "not applicable"


# --------------------------------------------------------------------------- what a rate is (review item 11)


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
    assert tr.last_level_cache_bytes(root) == 32 * 2**20
    only_l2 = _cache_tree(tmp_path / "l2", [(1, "Instruction", "64K"), (2, "Unified", "2M")])
    assert tr.last_level_cache_bytes(only_l2) == 2 * 2**20
    assert tr.last_level_cache_bytes(tmp_path / "absent") is None
    garbled = _cache_tree(tmp_path / "bad", [(3, "Unified", "lots")])
    assert tr.last_level_cache_bytes(garbled) is None


def test_size_regime():
    mib = 2**20
    assert tr.size_regime(8 * mib, 32 * mib) == "cache"
    assert tr.size_regime(24 * mib, 32 * mib) == "mixed"
    assert tr.size_regime(256 * mib, 32 * mib) == "memory"
    assert tr.size_regime(256 * mib, None) == "unknown"


def _sweep_table():
    """A host memcpy that peaks in the cache (87.5 GB/s at 8 MiB) and runs at 15.6 GB/s at 256 MiB."""
    import pandas as pd

    mib = 2**20
    rows = [(4 * mib, 60.0), (8 * mib, 87.5), (64 * mib, 20.0), (256 * mib, 15.6)]
    return pd.DataFrame([{"method": "host_memcpy", "label": "host memcpy", "size_bytes": n, "gbps": g,
                          "gbps_p25": g * 0.9, "gbps_p75": g * 1.1, "repeats": 10} for n, g in rows])


def test_memcpy_records_name_the_main_memory_rate_as_the_reference():
    """The reviewer's case: the cache-sized peak was recorded as if it were the h2d bandwidth."""
    cache = 32 * 2**20
    summary = tr.bandwidth_summary(_sweep_table(), cache_bytes=cache)
    row = summary.iloc[0]
    assert row["peak_gbps"] == 87.5 and row["peak_regime"] == "cache"
    assert row["largest_gbps"] == 15.6 and row["largest_regime"] == "memory"
    records = tr.bandwidth_records(summary, cache_bytes=cache)
    assert [r["experiment"] for r in records] == ["host memcpy bandwidth"] * 2  # not "h2d"
    ref, peak = records
    assert ref["metric"] == "memcpy_bandwidth" and ref["value"] == 15.6 and ref["reference"]
    assert ref["variant"].startswith("main-memory rate (256 MiB copies")
    assert peak["metric"] == "memcpy_peak_bandwidth" and peak["value"] == 87.5 and not peak["reference"]
    assert peak["variant"] == "cache-sized peak (8 MiB copies)"
    assert ref["spread"] == {"p25": pytest.approx(15.6 * 0.9), "p75": pytest.approx(15.6 * 1.1)}


def test_a_largest_size_in_the_cache_is_not_called_main_memory():
    table = _sweep_table()
    small = table[table["size_bytes"] <= 8 * 2**20]
    ref = tr.memcpy_reference(tr.bandwidth_summary(small, cache_bytes=32 * 2**20), cache_bytes=32 * 2**20)
    assert ref["regime"] == "cache" and "not main memory" in ref["label"] and "main-memory rate" not in ref["label"]
    assert "max_size_mib to 64" in ref["advice"]
    unknown = tr.memcpy_reference(tr.bandwidth_summary(table), cache_bytes=None)
    assert unknown["regime"] == "unknown" and "cache size unknown" in unknown["label"]


def test_device_methods_are_recorded_as_h2d_with_the_link_fraction():
    table = _sweep_table().assign(method="pinned_buffer")
    records = tr.bandwidth_records(tr.bandwidth_summary(table, cache_bytes=32 * 2**20), link_gbps=31.5)
    assert {r["experiment"] for r in records} == {"h2d bandwidth"}
    assert {r["metric"]: r["value"] for r in records} == {"bandwidth_at_largest_size": 15.6, "peak_bandwidth": 87.5}
    assert records[1]["fraction_of_link"] == pytest.approx(87.5 / 31.5)


def test_cpu_verdict_is_not_applicable_and_quotes_the_reference():
    app = tr.pinning_applicability(get_accelerator("cpu"))
    cache = 32 * 2**20
    ref = tr.memcpy_reference(tr.bandwidth_summary(_sweep_table(), cache_bytes=cache), cache_bytes=cache)
    v = tr.pinning_verdict({}, applicability=app, reference=ref)
    assert v["recommendation"] == "not applicable" and v["value"] is None and v["spread"] is None
    assert v["reason"].startswith(app.reason)
    assert "15.6 GB/s, main-memory rate" in v["reason"] and "cache-sized peak is 87.5 GB/s at 8 MiB" in v["reason"]
