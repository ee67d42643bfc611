"""Host-to-device copies: pageable, pinned per batch, the DataLoader's pin thread, a reused pinned buffer.

A copy from ordinary (pageable) host memory cannot be handed to the device's
DMA engine directly: the driver first copies it into a page-locked (pinned)
staging buffer of its own, in pieces, and waits for each piece. From memory
that is already pinned the DMA engine reads directly and the copy can be
asynchronous (``non_blocking=True``). Pinning is not free: it allocates
page-locked memory and costs a host memcpy, and doing it on every batch can
cost more than it saves (pytorch/pytorch#124456). So this module times
the ways to get a batch onto the device side by side:

``pageable``
    ``host.to(device)``: the driver stages the copy itself.
``pin_per_batch``
    ``host.pin_memory().to(device, non_blocking=True)``: pin, then copy, on
    the training thread, every batch.
``loader_pin_thread``
    ``DataLoader(pin_memory=True, num_workers=1)``: a worker process makes the
    batch, the loader's pin thread (it exists only with ``num_workers > 0``,
    ``torch/utils/data/dataloader.py``) copies it into pinned memory in the
    background, and the training thread only issues the non-blocking copy.
``pinned_buffer``
    One pinned buffer allocated once: ``buffer.copy_(host)`` then a
    non-blocking copy; before the buffer is overwritten, the previous copy's
    event is waited for, so the DMA never reads half-overwritten data.

and, as the ceiling the four are measured against, ``pinned_copy_only``: a
non-blocking copy from memory pinned beforehand, timed with device events
(the DMA's own rate).

Without an accelerator none of this applies: ``Tensor.pin_memory()`` raises
``RuntimeError: Cannot access accelerator device when none is available``
(pytorch/pytorch#73003; docs/ascend_api_factcheck.md, section 1).
Every function here decides from ``acc.capabilities.pinned_memory`` and, on a
CPU, reports "not applicable" with the reason instead of raising.

Bandwidth is in GB/s = 1e9 bytes per second (not GiB/s). The theoretical
limit of the host-device link is read from Linux sysfs for a CUDA device
(PCIe generation and width) or given as a parameter (:func:`link_limit`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from helpers.errors import DataError, ParameterError
from helpers.verdict import Action

if TYPE_CHECKING:  # pragma: no cover - typing only
    import pandas as pd
    import torch

    from helpers.device import Accelerator
    from helpers.timing import Comparison

logger = logging.getLogger(__name__)

__all__ = [
    "GB",
    "METHODS",
    "REFERENCE_METHOD",
    "PCIE_LANE_RATES",
    "LinkInfo",
    "Applicability",
    "pinning_applicability",
    "parse_link_speed",
    "parse_link_width",
    "pcie_limit_gbps",
    "read_pcie_link",
    "device_pci_address",
    "link_limit",
    "transfer_sizes",
    "PinnedStaging",
    "copy_method",
    "check_methods",
    "bandwidth_sweep",
    "host_copy_sweep",
    "batch_comparison",
    "last_level_cache_bytes",
    "size_regime",
    "bandwidth_summary",
    "bandwidth_records",
    "memcpy_reference",
    "pinning_verdict",
    "method_label",
]

#: Bytes in a gigabyte as used for bandwidth here (SI: 1e9 bytes, not 2**30).
GB = 1e9

#: The four copy methods compared, in the order they are shown.
METHODS: tuple[str, ...] = ("pageable", "pin_per_batch", "loader_pin_thread", "pinned_buffer")
#: The DMA-only reference: a copy from memory pinned beforehand, timed with device events.
REFERENCE_METHOD = "pinned_copy_only"

_METHOD_LABELS = {
    "pageable": "pageable .to(device)",
    "pin_per_batch": "pin_memory() then copy, every batch",
    "loader_pin_thread": "DataLoader pin thread, then copy",
    "pinned_buffer": "reused pinned buffer",
    REFERENCE_METHOD: "pinned source, copy only (DMA rate)",
    "host_memcpy": "host memcpy (the cost of staging)",
}

#: PCIe line rate per lane (GT/s) -> (generation, encoding efficiency).
#: Source: PCI-SIG specifications as summarised by PCI-SIG's FAQ
#: (https://pcisig.com/faq): Gen1 2.5 GT/s and Gen2 5.0 GT/s with 8b/10b
#: encoding; Gen3 8.0, Gen4 16.0 and Gen5 32.0 GT/s with 128b/130b encoding;
#: Gen6 64.0 GT/s with PAM4 signalling and FLIT mode (no 8b/10b or 128b/130b
#: line code): its efficiency is given here as 1.0, i.e. the FLIT framing,
#: CRC and FEC overheads are *not* subtracted, so a Gen6 limit is an upper bound.
PCIE_LANE_RATES: dict[float, tuple[int, float]] = {
    2.5: (1, 8 / 10),
    5.0: (2, 8 / 10),
    8.0: (3, 128 / 130),
    16.0: (4, 128 / 130),
    32.0: (5, 128 / 130),
    64.0: (6, 1.0),
}


# --------------------------------------------------------------------------- applicability


@dataclass(frozen=True)
class Applicability:
    """Whether pinned memory and asynchronous copies apply on this device.

    Attributes
    ----------
    applicable : bool
        True on an accelerator with pinned memory.
    reason : str
        What pinning is here, or why it does not apply.
    """

    applicable: bool
    reason: str


def pinning_applicability(acc: "Accelerator") -> Applicability:
    """Decide from the device's capabilities whether pinned host memory applies.

    Parameters
    ----------
    acc : helpers.device.Accelerator

    Returns
    -------
    Applicability
        Not applicable on a CPU (nothing is copied to a device, and
        ``Tensor.pin_memory()`` raises without an accelerator: pytorch/pytorch#73003),
        with the capability's own explanation as the reason.
    """
    cap = acc.capabilities.pinned_memory
    if not cap.available:
        return Applicability(False, f"pinned memory does not apply on {acc.kind} ({cap.detail})")
    return Applicability(True, f"pinned memory is available on {acc.kind} ({cap.detail})")


# --------------------------------------------------------------------------- the link


@dataclass(frozen=True)
class LinkInfo:
    """The host-device link and its theoretical bandwidth.

    Attributes
    ----------
    limit_gbps : float or None
        Theoretical one-direction bandwidth, GB/s (1e9 bytes/s); None when unknown.
    source : str
        ``"parameter"`` (given by the user), ``"sysfs"`` (read from Linux) or
        ``"unknown"``.
    detail : str
        How the limit was found, or why it was not (one sentence for the reader).
    address : str or None
        PCI address (``domain:bus:device.function``), when known.
    generation : int or None
        PCIe generation of the speed used for the limit.
    gt_per_s : float or None
        Per-lane line rate used for the limit, GT/s.
    width : int or None
        Lanes used for the limit.
    current_gt_per_s, max_gt_per_s : float or None
        The device's ``current_link_speed`` and ``max_link_speed``, GT/s.
    current_width, max_width : int or None
        The device's ``current_link_width`` and ``max_link_width``, lanes.
    upstream_max_gt_per_s : float or None
        ``max_link_speed`` of the port above the device (the other end of the link).
    notes : tuple of str
        Warnings about what was read (link slowed down at idle, fewer lanes
        than both ends support).
    """

    limit_gbps: float | None
    source: str
    detail: str
    address: str | None = None
    generation: int | None = None
    gt_per_s: float | None = None
    width: int | None = None
    current_gt_per_s: float | None = None
    max_gt_per_s: float | None = None
    current_width: int | None = None
    max_width: int | None = None
    upstream_max_gt_per_s: float | None = None
    notes: tuple[str, ...] = field(default=())

    def label(self) -> str:
        """Short text for a plot legend, e.g. ``"PCIe Gen4 x16: 31.5 GB/s"``."""
        if self.limit_gbps is None:
            return "link limit unknown"
        if self.generation is not None and self.width is not None:
            return f"PCIe Gen{self.generation} x{self.width}: {self.limit_gbps:.1f} GB/s"
        return f"link limit ({self.source}): {self.limit_gbps:.1f} GB/s"


_SPEED_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*GT/s", re.IGNORECASE)


def parse_link_speed(text: str) -> float | None:
    """Parse a sysfs ``*_link_speed`` value into GT/s.

    Linux writes e.g. ``"16.0 GT/s PCIe"`` (recent kernels), ``"8 GT/s"`` or
    ``"8.0 GT/s"`` (older ones), or ``"Unknown"``
    (``drivers/pci/pci-sysfs.c``, ``pci_speed_string``).

    Parameters
    ----------
    text : str

    Returns
    -------
    float or None
        GT/s per lane, or None when the text holds no rate.
    """
    m = _SPEED_RE.match(text or "")
    return float(m.group(1)) if m else None


def parse_link_width(text: str) -> int | None:
    """Parse a sysfs ``*_link_width`` value (``"16"``, ``"x16"``) into lanes; None if unreadable or 0."""
    m = re.search(r"(\d+)", text or "")
    if not m:
        return None
    width = int(m.group(1))
    return width if width > 0 else None


def pcie_limit_gbps(gt_per_s: float, width: int) -> float:
    """Theoretical one-direction bandwidth of a PCIe link, GB/s (1e9 bytes/s).

    ``gt_per_s * width * encoding / 8``: one transfer carries one bit per
    lane; the encoding (8b/10b for Gen1-2, 128b/130b for Gen3-5; see
    :data:`PCIE_LANE_RATES`) removes the line-code overhead. Packet (TLP)
    headers are not subtracted, so published pinned host-to-device copies
    reach about 77-87% of this figure: 12.15 GB/s on Gen3 x16 (P100,
    bandwidthTest; mpicbg-scicomp/gearshifft#82), 25.13 GB/s on Gen4 x16
    (A100, nvbandwidth; NVIDIA/nvbandwidth#42), 54.8 GB/s on Gen5 x16 (H100,
    https://github.com/ZiyanIshani/vpbenchmarking,
    results/stream_nvbench/stream_nvbench_summary.md). Gen3 x16 gives
    15.75 GB/s, Gen4 x16 31.5, Gen5 x16 63.0.

    Parameters
    ----------
    gt_per_s : float
        Line rate per lane, GT/s (one of the keys of :data:`PCIE_LANE_RATES`).
    width : int
        Lanes (1, 2, 4, 8, 16, ...).

    Returns
    -------
    float

    Raises
    ------
    ParameterError
        For a rate that is not a PCIe rate, or a width < 1.
    """
    if gt_per_s not in PCIE_LANE_RATES:
        raise ParameterError(
            f"{gt_per_s!r} GT/s is not a PCIe line rate; known rates: "
            f"{', '.join(str(r) for r in PCIE_LANE_RATES)} GT/s. Pass link_gbps to give the limit yourself"
        )
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise ParameterError(f"PCIe width must be a positive number of lanes, got {width!r}")
    return gt_per_s * 1e9 * width * PCIE_LANE_RATES[gt_per_s][1] / 8 / GB


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def read_pcie_link(address: str, *, sysfs_root: Path | str = "/sys") -> LinkInfo:
    """Read a PCI device's link from sysfs and compute its theoretical limit.

    Reads ``<sysfs_root>/bus/pci/devices/<address>/{current,max}_link_{speed,width}``
    and the ``max_link_speed``/``max_link_width`` of the port above it (the
    parent folder of the device's real path, when it has them). The limit
    uses the fastest speed both ends support and the width the link trained
    at:

    - GPUs lower their link speed when idle (power management) and raise it
      under load, so a ``current_link_speed`` below what both ends support is
      noted and the supported speed is used;
    - a ``current_link_width`` below what both ends support (an x16 card
      trained at x8: a slot, riser or BIOS setting) is real, so the trained
      width is used, with a note.

    Parameters
    ----------
    address : str
        PCI address, ``"0000:65:00.0"``.
    sysfs_root : path, default "/sys"
        Root of the sysfs tree (a fake tree in tests).

    Returns
    -------
    LinkInfo
        ``source="sysfs"`` with the limit, or ``source="unknown"`` with the
        reason when the files are missing or unreadable.
    """
    dev = Path(sysfs_root) / "bus" / "pci" / "devices" / address
    if not dev.exists():
        return LinkInfo(None, "unknown", f"no sysfs entry for PCI device {address} (not Linux, or a "
                        "virtual machine that hides it); pass link_gbps", address=address)
    cur_speed = parse_link_speed(_read(dev / "current_link_speed") or "")
    max_speed = parse_link_speed(_read(dev / "max_link_speed") or "")
    cur_width = parse_link_width(_read(dev / "current_link_width") or "")
    max_width = parse_link_width(_read(dev / "max_link_width") or "")
    up_speed = up_width = None
    try:
        parent = dev.resolve().parent
    except OSError:
        parent = None
    if parent is not None and (parent / "max_link_speed").exists():
        up_speed = parse_link_speed(_read(parent / "max_link_speed") or "")
        up_width = parse_link_width(_read(parent / "max_link_width") or "")
    common = dict(address=address, current_gt_per_s=cur_speed, max_gt_per_s=max_speed,
                  current_width=cur_width, max_width=max_width, upstream_max_gt_per_s=up_speed)

    speeds = [s for s in (max_speed, up_speed) if s is not None]
    speed = min(speeds) if speeds else cur_speed
    if speed is not None and cur_speed is not None and cur_speed > speed:
        speed = cur_speed  # a link cannot run faster than it can; trust what it runs at
    widths = [w for w in (max_width, up_width) if w is not None]
    supported_width = min(widths) if widths else None
    width = cur_width or supported_width
    if speed is None or width is None:
        return LinkInfo(None, "unknown", f"sysfs for PCI device {address} has no readable link speed or "
                        "width (not a PCIe device?); pass link_gbps", **common)
    if speed not in PCIE_LANE_RATES:
        return LinkInfo(None, "unknown", f"sysfs reports {speed} GT/s for {address}, not a known PCIe "
                        "rate; pass link_gbps", **common)
    notes = []
    if cur_speed is not None and cur_speed < speed:
        notes.append(
            f"the link ran at {cur_speed:g} GT/s when read, below the {speed:g} GT/s both ends support: "
            "devices lower the link speed when idle and raise it under load, so the limit uses "
            f"{speed:g} GT/s; if copies stay far below it, check the link under load "
            "(nvidia-smi -q, 'GPU Link Info'; or lspci -vv, 'LnkSta')")
    if cur_width is not None and supported_width is not None and cur_width < supported_width:
        notes.append(
            f"the link trained at x{cur_width} although both ends support x{supported_width} "
            f"(slot, riser or BIOS setting): the limit uses x{cur_width}")
    gen, enc = PCIE_LANE_RATES[speed]
    limit = pcie_limit_gbps(speed, width)
    code = "128b/130b" if gen in (3, 4, 5) else ("8b/10b" if gen in (1, 2) else "FLIT mode, overheads not subtracted")
    detail = (f"PCIe Gen{gen} x{width} ({speed:g} GT/s per lane, {code}) read from sysfs for {address}: "
              f"{limit:.2f} GB/s per direction")
    return LinkInfo(limit, "sysfs", detail, generation=gen, gt_per_s=speed, width=width,
                    notes=tuple(notes), **common)


def device_pci_address(acc: "Accelerator") -> tuple[str | None, str]:
    """The PCI address of the device, where torch tells it.

    For CUDA, ``torch.cuda.get_device_properties(i)`` has ``pci_domain_id``,
    ``pci_bus_id`` and ``pci_device_id`` (torch 2.13; torch's own
    ``torch/numa/binding.py`` builds the sysfs address from them the same way).
    torch_npu's device properties do not expose a PCI address (its
    ``NPUDeviceProp`` holds a name and the memory size), so on an NPU the
    limit must be given as ``link_gbps``.

    Parameters
    ----------
    acc : helpers.device.Accelerator

    Returns
    -------
    (address, reason) : (str or None, str)
        ``"0000:65:00.0"`` and an empty reason, or None and why not.
    """
    if acc.kind != "cuda":
        why = ("the device is the CPU: there is no host-device link" if acc.is_cpu else
               f"torch does not report a PCI address for {acc.kind} devices here")
        return None, why
    import torch

    try:
        props = torch.cuda.get_device_properties(acc.index)
        domain, bus, device = props.pci_domain_id, props.pci_bus_id, props.pci_device_id
    except (AttributeError, RuntimeError) as exc:
        return None, f"torch.cuda.get_device_properties({acc.index}) has no PCI ids ({exc})"
    return f"{int(domain):04x}:{int(bus):02x}:{int(device):02x}.0", ""


def link_limit(acc: "Accelerator", link_gbps: float = 0.0, *, sysfs_root: Path | str = "/sys") -> LinkInfo:
    """The theoretical bandwidth of the host-device link.

    Parameters
    ----------
    acc : helpers.device.Accelerator
    link_gbps : float, default 0.0
        The limit in GB/s when known (e.g. 31.5 for PCIe Gen4 x16); 0 reads
        it from sysfs where the device's PCI address is known (CUDA on Linux).
    sysfs_root : path, default "/sys"

    Returns
    -------
    LinkInfo

    Raises
    ------
    ParameterError
        If ``link_gbps`` is negative or not finite.
    """
    if isinstance(link_gbps, bool) or not isinstance(link_gbps, (int, float)) or not math.isfinite(link_gbps) \
            or link_gbps < 0:
        raise ParameterError(f"link_gbps must be a finite number >= 0 (GB/s; 0 reads sysfs), got {link_gbps!r}")
    if link_gbps > 0:
        return LinkInfo(float(link_gbps), "parameter", f"{link_gbps:g} GB/s, given as the link_gbps parameter")
    address, why = device_pci_address(acc)
    if address is None:
        return LinkInfo(None, "unknown", f"no link limit: {why}; pass link_gbps to draw one")
    return read_pcie_link(address, sysfs_root=sysfs_root)


# --------------------------------------------------------------------------- sizes


def transfer_sizes(min_size_kib: int, max_size_mib: int) -> list[int]:
    """Transfer sizes in bytes: powers of 2 from ``min_size_kib`` KiB to ``max_size_mib`` MiB.

    Parameters
    ----------
    min_size_kib : int
        Smallest size, KiB (1 KiB = 1024 bytes), >= 1; rounded up to a power of 2.
    max_size_mib : int
        Largest size, MiB (1 MiB = 2**20 bytes), >= 1; rounded down to a power of 2.

    Returns
    -------
    list of int
        Ascending, each a power of 2.

    Raises
    ------
    ParameterError
        If either bound is not a positive int, or the range is empty.
    """
    for name, v in (("min_size_kib", min_size_kib), ("max_size_mib", max_size_mib)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ParameterError(f"{name} must be a positive int, got {v!r}")
    lo = 1 << (int(min_size_kib * 1024) - 1).bit_length()
    hi = 1 << (int(max_size_mib * 2**20).bit_length() - 1)
    if lo > hi:
        raise ParameterError(
            f"min_size_kib={min_size_kib} KiB is above max_size_mib={max_size_mib} MiB: no size to test; "
            "lower min_size_kib or raise max_size_mib")
    sizes = []
    n = lo
    while n <= hi:
        sizes.append(n)
        n *= 2
    return sizes


# --------------------------------------------------------------------------- the methods


def _require_applicable(acc: "Accelerator") -> None:
    app = pinning_applicability(acc)
    if not app.applicable:
        from helpers.errors import DeviceUnavailableError

        raise DeviceUnavailableError(f"{app.reason}. Check pinning_applicability(acc) first and record "
                                     "'not applicable' instead of copying")


class PinnedStaging:
    """A pinned host buffer allocated once and reused for every copy.

    Each :meth:`copy` writes the host tensor into the buffer (a host memcpy),
    issues a non-blocking copy to the device and records an event after it.
    The next :meth:`copy` first waits for that event, so the buffer is never
    overwritten while the DMA engine still reads it; without that wait an
    asynchronous copy could carry half of one batch and half of the next.

    Parameters
    ----------
    acc : helpers.device.Accelerator
        An accelerator with pinned memory.
    nbytes : int
        Capacity of the buffer in bytes (>= 1).

    Raises
    ------
    DeviceUnavailableError
        When pinned memory does not apply on ``acc`` (a CPU).
    ParameterError
        For ``nbytes`` < 1.
    """

    def __init__(self, acc: "Accelerator", nbytes: int) -> None:
        _require_applicable(acc)
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 1:
            raise ParameterError(f"nbytes must be a positive int, got {nbytes!r}")
        import torch

        self.acc = acc
        self.nbytes = nbytes
        # .pin_memory() on an empty tensor, not torch.empty(pin_memory=True): one code path to pin.
        self.buffer = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
        self._done = None
        self.waits = 0

    def copy(self, host: "torch.Tensor") -> "torch.Tensor":
        """Copy ``host`` to the device through the buffer.

        Parameters
        ----------
        host : torch.Tensor
            Any shape and dtype, on the CPU, at most ``nbytes`` bytes.

        Returns
        -------
        torch.Tensor
            Same shape and dtype on ``acc.device``; the copy may still be in
            flight (use it on the current stream, or synchronize).

        Raises
        ------
        ParameterError
            If ``host`` is larger than the buffer.
        """
        import torch

        n = host.numel() * host.element_size()
        if n > self.nbytes:
            raise ParameterError(f"a {n}-byte tensor does not fit the {self.nbytes}-byte pinned buffer; "
                                 "make the buffer as large as the largest batch")
        if self._done is not None:
            self._done.synchronize()  # the previous DMA has finished reading the buffer
            self.waits += 1
        flat = host.contiguous().view(-1).view(torch.uint8)
        staged = self.buffer[:n]
        staged.copy_(flat)
        out = staged.to(self.acc.device, non_blocking=True)
        if out.data_ptr() == staged.data_ptr():  # the "device" is the host itself: .to() did not copy
            out = out.clone()
        if self._done is None:
            self._done = self.acc.new_event()
        if self._done is not None:
            self._done.record()
        else:  # no events on this device: wait by synchronizing instead
            self.acc.synchronize()
        return out.view(host.dtype).view(host.shape)


class _CloneDataset:
    """Map-style dataset returning a fresh copy of one tensor per item (what a real collate returns).

    Module-level so that DataLoader workers can unpickle it under spawn (Optimization-AI/LibAUC#60).
    """

    def __init__(self, tensor, length: int) -> None:
        self.tensor = tensor
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i):
        return self.tensor.clone()


@contextlib.contextmanager
def copy_method(method: str, acc: "Accelerator", host: "torch.Tensor", *,
                first_batch_timeout_s: float = 120.0) -> Iterator[Callable[[], "torch.Tensor"]]:
    """A zero-argument function that copies ``host`` to the device by ``method``.

    Parameters
    ----------
    method : str
        One of :data:`METHODS` (see the module docstring).
    acc : helpers.device.Accelerator
        An accelerator with pinned memory.
    host : torch.Tensor
        The host data (pageable, on the CPU).
    first_batch_timeout_s : float, default 120
        ``loader_pin_thread`` only: the DataLoader's ``timeout``, so a worker
        or pin thread that hangs becomes an error instead of a silent wait
        (pytorch/pytorch#47445).

    Yields
    ------
    callable
        ``fn() -> torch.Tensor`` on ``acc.device``, equal to ``host``; the
        copy may still be in flight (synchronize before timing its end).

    Raises
    ------
    ParameterError
        For an unknown method.
    DeviceUnavailableError
        On a device without pinned memory (a CPU): check
        :func:`pinning_applicability` first.
    """
    if method not in METHODS:
        raise ParameterError(f"unknown copy method {method!r}; choose one of {', '.join(METHODS)}")
    _require_applicable(acc)
    dev = acc.device
    if method == "pageable":
        yield lambda: host.to(dev)
    elif method == "pin_per_batch":
        yield lambda: host.pin_memory().to(dev, non_blocking=True)
    elif method == "pinned_buffer":
        staging = PinnedStaging(acc, host.numel() * host.element_size())
        yield lambda: staging.copy(host)
    else:  # loader_pin_thread
        from torch.utils.data import DataLoader

        loader = DataLoader(_CloneDataset(host, 1 << 30), batch_size=None, num_workers=1, pin_memory=True,
                            prefetch_factor=2, timeout=float(first_batch_timeout_s))
        it = iter(loader)
        try:
            yield lambda: next(it).to(dev, non_blocking=True)
        finally:
            del it  # shuts the worker and the pin thread down


def check_methods(acc: "Accelerator", nbytes: int = 1 << 20, *, seed: int = 0,
                  methods: Sequence[str] = METHODS) -> dict[str, bool]:
    """Check that every method delivers exactly the host bytes to the device.

    Each method copies a random uint8 pattern (three times in a row, so that
    a reused buffer is overwritten while a copy could be in flight); each
    result is synchronized and compared bit for bit with the source.

    Parameters
    ----------
    acc : helpers.device.Accelerator
    nbytes : int, default 1 MiB
    seed : int
    methods : sequence of str

    Returns
    -------
    dict
        ``{method: True when every copy equalled its source}``; empty when
        pinning does not apply on ``acc`` (a CPU).
    """
    import torch

    if not pinning_applicability(acc).applicable:
        return {}
    g = torch.Generator().manual_seed(seed)
    out: dict[str, bool] = {}
    for method in methods:
        ok = True
        for k in range(3):
            host = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g)
            with copy_method(method, acc, host) as fn:
                results = [fn() for _ in range(2)]
                acc.synchronize()
                ok &= all(torch.equal(r.cpu(), host) for r in results)
        out[method] = bool(ok)
    return out


# --------------------------------------------------------------------------- sweeps


def _sweep_row(method: str, nbytes: int, m, *, applicable: bool = True, reason: str = "") -> dict[str, Any]:
    if m is None:
        return {"method": method, "label": _METHOD_LABELS.get(method, method), "size_bytes": nbytes,
                "median_s": math.nan, "p25_s": math.nan, "p75_s": math.nan, "gbps": math.nan,
                "gbps_p25": math.nan, "gbps_p75": math.nan, "repeats": 0, "applicable": applicable,
                "reason": reason}
    return {"method": method, "label": _METHOD_LABELS.get(method, method), "size_bytes": nbytes,
            "median_s": m.median_s, "p25_s": m.p25_s, "p75_s": m.p75_s,
            "gbps": nbytes / m.median_s / GB if m.median_s > 0 else math.nan,
            "gbps_p25": nbytes / m.p75_s / GB if m.p75_s > 0 else math.nan,
            "gbps_p75": nbytes / m.p25_s / GB if m.p25_s > 0 else math.nan,
            "repeats": m.repeats, "applicable": applicable, "reason": reason}


def _random_host(nbytes: int, seed: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.empty(nbytes, dtype=torch.uint8).random_(0, 256, generator=g)


def bandwidth_sweep(acc: "Accelerator", sizes: Sequence[int], *, methods: Sequence[str] = METHODS,
                    repeats: int = 10, warmup: int = 2, reference: bool = True, seed: int = 0,
                    progress: Callable[[str], None] | None = None) -> "pd.DataFrame":
    """Host-to-device bandwidth of each copy method at each size.

    Each (method, size) is timed with :func:`helpers.timing.measure`:
    ``warmup`` untimed copies, then ``repeats`` copies, each bracketed by a
    device synchronize, so the time covers everything the training thread
    waits for (pinning, staging memcpy, the DMA). The reference
    ``pinned_copy_only`` is timed with device events
    (:func:`helpers.timing.measure_events`): the DMA alone.

    Parameters
    ----------
    acc : helpers.device.Accelerator
    sizes : sequence of int
        Transfer sizes in bytes (see :func:`transfer_sizes`).
    methods : sequence of str
        Subset of :data:`METHODS`.
    repeats, warmup : int
        Timed and untimed copies per method and size.
    reference : bool, default True
        Also time :data:`REFERENCE_METHOD`.
    seed : int
        Seed of the host data.
    progress : callable, optional
        Called with a short line per size (e.g. ``print``), for long sweeps.

    Returns
    -------
    pandas.DataFrame
        One row per method and size: ``method``, ``label``, ``size_bytes``,
        ``median_s``, ``p25_s``, ``p75_s`` (seconds per copy), ``gbps``
        (size / median time, GB/s = 1e9 bytes/s), ``gbps_p25``, ``gbps_p75``
        (the rate at the 75th and 25th percentile times), ``repeats``,
        ``applicable`` (bool) and ``reason``. Where pinning does not apply
        (a CPU), one row per method with ``applicable=False``, the reason, and
        NaN numbers; nothing raises.

    Raises
    ------
    ParameterError
        For an unknown method or an empty ``sizes``.
    """
    import pandas as pd
    import torch

    from helpers.timing import measure, measure_events

    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise ParameterError(f"unknown copy method(s) {bad}; choose from {', '.join(METHODS)}")
    if not sizes:
        raise ParameterError("sizes is empty: give at least one transfer size in bytes")
    app = pinning_applicability(acc)
    names = list(methods) + ([REFERENCE_METHOD] if reference else [])
    if not app.applicable:
        return pd.DataFrame([_sweep_row(m, 0, None, applicable=False, reason=app.reason) for m in names])
    rows = []
    for nbytes in sizes:
        host = _random_host(int(nbytes), seed)
        for method in methods:
            with copy_method(method, acc, host) as fn:
                m = measure(fn, repeats=repeats, warmup=warmup, sync=acc.synchronize, name=method,
                            items_per_call=nbytes)
            rows.append(_sweep_row(method, nbytes, m))
        if reference:
            pinned = host.pin_memory()
            dst = torch.empty(int(nbytes), dtype=torch.uint8, device=acc.device)
            m = measure_events(lambda: dst.copy_(pinned, non_blocking=True),
                               new_event=lambda: acc.new_event(enable_timing=True), sync=acc.synchronize,
                               repeats=repeats, warmup=warmup, name=REFERENCE_METHOD, items_per_call=nbytes)
            rows.append(_sweep_row(REFERENCE_METHOD, nbytes, m))
            del pinned, dst
        if progress is not None:
            done = [r for r in rows if r["size_bytes"] == nbytes]
            progress(f"{nbytes / 2**20:9.3f} MiB: " + ", ".join(f"{r['method']} {r['gbps']:.2f}" for r in done)
                     + " GB/s")
    return pd.DataFrame(rows)


def host_copy_sweep(sizes: Sequence[int], *, repeats: int = 10, warmup: int = 2, seed: int = 0) -> "pd.DataFrame":
    """Host memcpy bandwidth at each size: what staging into a pinned buffer costs at least.

    Runs on any machine (no device involved): ``dst.copy_(src)`` between two
    preallocated uint8 host tensors, timed with :func:`helpers.timing.measure`.
    Pinning a batch (``pin_memory()``, the loader's pin thread, a reused
    buffer) costs one such copy per batch on some host thread.

    Parameters
    ----------
    sizes : sequence of int
        Bytes.
    repeats, warmup, seed : int

    Returns
    -------
    pandas.DataFrame
        Same columns as :func:`bandwidth_sweep`, ``method="host_memcpy"``.
    """
    import pandas as pd
    import torch

    from helpers.timing import measure

    if not sizes:
        raise ParameterError("sizes is empty: give at least one transfer size in bytes")
    rows = []
    for nbytes in sizes:
        src = _random_host(int(nbytes), seed)
        dst = torch.empty_like(src)
        m = measure(lambda: dst.copy_(src), repeats=repeats, warmup=warmup, name="host_memcpy",
                    items_per_call=nbytes)
        if not torch.equal(dst, src):  # pragma: no cover - would be a torch bug
            raise DataError("host copy_ produced different bytes; the memory or torch is broken")
        rows.append(_sweep_row("host_memcpy", nbytes, m))
    return pd.DataFrame(rows)


def batch_comparison(acc: "Accelerator", shape: Sequence[int], *, methods: Sequence[str] = METHODS[1:],
                     repeats: int = 10, warmup: int = 2, seed: int = 0) -> dict[str, "Comparison"]:
    """Per-batch copy time of each pinned method against pageable, interleaved.

    For each method, :func:`helpers.timing.compare` times ``pageable`` (A)
    and the method (B) in the ABBA order in one run; the ratio is the
    speedup of B's copy rate over pageable's (> 1: the method is faster).

    Parameters
    ----------
    acc : helpers.device.Accelerator
    shape : sequence of int
        The batch, uint8; the workload's is ``(batch_size, image_size, image_size, 3)`` (NHWC).
    methods : sequence of str
        Methods compared with pageable (default: the three pinned ones).
    repeats, warmup, seed : int

    Returns
    -------
    dict
        ``{method: Comparison}`` (names ``"pageable"`` and the method); empty
        where pinning does not apply (a CPU).
    """
    from helpers.timing import compare

    if not pinning_applicability(acc).applicable:
        return {}
    shape = tuple(int(s) for s in shape)
    nbytes = math.prod(shape)
    host = _random_host(nbytes, seed).view(shape)
    out = {}
    with copy_method("pageable", acc, host) as pageable:
        for method in methods:
            with copy_method(method, acc, host) as fn:
                out[method] = compare(pageable, fn, repeats=repeats, warmup=warmup, sync=acc.synchronize,
                                      names=("pageable", method), items_per_call=nbytes, seed=seed)
    return out


# --------------------------------------------------------------------------- what a rate is


_CACHE_SIZE_RE = re.compile(r"^\s*(\d+)\s*([KMG]?)B?\s*$", re.IGNORECASE)


def last_level_cache_bytes(root: Path | str = "/sys/devices/system/cpu/cpu0/cache") -> int | None:
    """Size of the CPU's last-level cache (data or unified), from Linux sysfs.

    Parameters
    ----------
    root : path
        The cache folder of one CPU; each ``index*`` subfolder has ``level``,
        ``type`` (``Data``, ``Instruction``, ``Unified``) and ``size`` (e.g.
        ``32768K``), as described in the Linux ABI document
        ``sysfs-devices-system-cpu`` (``/sys/devices/system/cpu/cpuX/cache/indexY``).

    Returns
    -------
    int or None
        Bytes of the highest-level data or unified cache; None where sysfs
        does not describe the caches (not Linux, a container hiding them).
    """
    best: tuple[int, int] | None = None
    folder = Path(root)
    if not folder.is_dir():
        return None
    for index in sorted(folder.glob("index*")):
        level, kind, size = (_read(index / n) for n in ("level", "type", "size"))
        if not level or not size or (kind or "").strip().lower() == "instruction":
            continue
        m = _CACHE_SIZE_RE.match(size)
        if not level.strip().isdigit() or not m:
            continue
        nbytes = int(m.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[m.group(2).upper()]
        candidate = (int(level.strip()), nbytes)
        if best is None or candidate > best:
            best = candidate
    return None if best is None else best[1]


def size_regime(nbytes: int, cache_bytes: int | None) -> str:
    """Where a copy of ``nbytes`` (source + destination) lives: in the cache or in main memory.

    Parameters
    ----------
    nbytes : int
        Bytes copied (the source; the destination is as large).
    cache_bytes : int or None
        Last-level cache (:func:`last_level_cache_bytes`).

    Returns
    -------
    str
        ``"cache"`` when source and destination together fit in the cache,
        ``"memory"`` when the source alone is at least the cache (so most
        bytes come from main memory), ``"mixed"`` in between, ``"unknown"``
        without a cache size.
    """
    if not cache_bytes:
        return "unknown"
    if 2 * nbytes <= cache_bytes:
        return "cache"
    if nbytes >= cache_bytes:
        return "memory"
    return "mixed"


def bandwidth_summary(table: "pd.DataFrame", *, cache_bytes: int | None = None) -> "pd.DataFrame":
    """Per method, the peak rate over sizes and the rate at the largest size, each with what it is.

    A host memcpy peaks at sizes that fit in the CPU's caches; at sizes well
    beyond the last-level cache it runs at the speed of main memory, which is
    what staging a real stream of batches pays. So the two are kept apart and
    each is labelled with :func:`size_regime`.

    Parameters
    ----------
    table : pandas.DataFrame
        Rows of :func:`bandwidth_sweep` and/or :func:`host_copy_sweep`
        (``method``, ``size_bytes``, ``gbps``, ``gbps_p25``, ``gbps_p75``,
        ``repeats``); rows without a rate are ignored.
    cache_bytes : int, optional
        Last-level cache size (:func:`last_level_cache_bytes`).

    Returns
    -------
    pandas.DataFrame
        One row per method, in the table's order: ``method``, ``label``, and
        for ``peak`` and ``largest``: ``{x}_gbps``, ``{x}_gbps_p25``,
        ``{x}_gbps_p75``, ``{x}_size_bytes``, ``{x}_repeats``, ``{x}_regime``.
    """
    import pandas as pd

    rows = []
    data = table.dropna(subset=["gbps"])
    for method in dict.fromkeys(data["method"]):
        part = data[data["method"] == method]
        row: dict[str, Any] = {"method": method, "label": method_label(method)}
        chosen = (("peak", part.loc[part["gbps"].idxmax()]), ("largest", part.loc[part["size_bytes"].idxmax()]))
        for name, r in chosen:
            row.update({f"{name}_gbps": float(r["gbps"]), f"{name}_gbps_p25": float(r["gbps_p25"]),
                        f"{name}_gbps_p75": float(r["gbps_p75"]), f"{name}_size_bytes": int(r["size_bytes"]),
                        f"{name}_repeats": int(r["repeats"]),
                        f"{name}_regime": size_regime(int(r["size_bytes"]), cache_bytes)})
        rows.append(row)
    return pd.DataFrame(rows)


def _size_text(nbytes: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes:g} B"


def _largest_label(size: int, regime: str, cache_bytes: int | None) -> str:
    if regime == "memory":
        return f"main-memory rate ({_size_text(size)} copies; last-level cache {_size_text(cache_bytes)})"
    if regime == "unknown":
        return f"rate at the largest size ({_size_text(size)} copies; cache size unknown)"
    where = "in" if regime == "cache" else "partly in"
    return (f"rate at the largest size ({_size_text(size)} copies, {where} the {_size_text(cache_bytes)} cache: "
            "not main memory)")


def _advice(regime: str, cache_bytes: int | None) -> str:
    if regime in ("cache", "mixed") and cache_bytes:
        return f"set max_size_mib to {max(1, 2 * cache_bytes // 2**20)} or more for a main-memory rate"
    if regime == "unknown":
        return "the cache size is unknown, so whether this is a main-memory rate is not known"
    return ""


def memcpy_reference(summary: "pd.DataFrame", *, cache_bytes: int | None = None) -> dict[str, Any] | None:
    """The host memcpy figure to keep as the reference: its rate at the largest size.

    Pinning a batch costs one host memcpy per batch; a stream of batches does
    not stay in the cache, so the rate that matters is the main-memory one,
    not the cache-sized peak.

    Parameters
    ----------
    summary : pandas.DataFrame
        :func:`bandwidth_summary` (a ``host_memcpy`` row).
    cache_bytes : int, optional
        As given to :func:`bandwidth_summary` (for the label).

    Returns
    -------
    dict or None
        ``gbps``, ``gbps_p25``, ``gbps_p75``, ``size_bytes``, ``repeats``,
        ``regime``, ``label`` (what the number is, with the size and the
        cache), ``advice`` (how to get a main-memory rate when this is not
        one; empty when it is), ``peak_gbps``, ``peak_size_bytes``,
        ``peak_regime``; None without a host memcpy row.
    """
    rows = summary[summary["method"] == "host_memcpy"] if len(summary) else summary
    if not len(rows):
        return None
    r = rows.iloc[0]
    return {"gbps": float(r["largest_gbps"]), "gbps_p25": float(r["largest_gbps_p25"]),
            "gbps_p75": float(r["largest_gbps_p75"]), "size_bytes": int(r["largest_size_bytes"]),
            "repeats": int(r["largest_repeats"]), "regime": str(r["largest_regime"]),
            "label": _largest_label(int(r["largest_size_bytes"]), str(r["largest_regime"]), cache_bytes),
            "advice": _advice(str(r["largest_regime"]), cache_bytes),
            "peak_gbps": float(r["peak_gbps"]), "peak_size_bytes": int(r["peak_size_bytes"]),
            "peak_regime": str(r["peak_regime"])}


def bandwidth_records(summary: "pd.DataFrame", *, cache_bytes: int | None = None,
                      link_gbps: float | None = None) -> list[dict[str, Any]]:
    """The records notebook 04 stores for its bandwidth summary, each named for what it is.

    - ``host_memcpy``: experiment ``"host memcpy bandwidth"`` (it is not a
      host-to-device copy); first the reference, metric
      ``"memcpy_bandwidth"``, the rate at the largest size, labelled as a
      main-memory rate only when that size is beyond the last-level cache;
      then, when it is at another size, metric ``"memcpy_peak_bandwidth"``,
      the peak (labelled cache-sized when it fits in the cache).
    - every device method: experiment ``"h2d bandwidth"``, metrics
      ``"bandwidth_at_largest_size"`` and ``"peak_bandwidth"``, each with its
      size and, when the link's limit is known, its fraction of it.

    Parameters
    ----------
    summary : pandas.DataFrame
        :func:`bandwidth_summary`.
    cache_bytes : int, optional
    link_gbps : float, optional
        The link's limit (GB/s), or None/0 when unknown.

    Returns
    -------
    list of dict
        Keyword arguments for :meth:`helpers.results.ResultsStore.add`:
        ``experiment``, ``variant``, ``metric``, ``value``, ``unit``
        (``"GB/s"``), ``repeats``, ``spread`` (``p25``/``p75``) and extra
        fields (``size_bytes``, ``regime``, ``reference``, and for device
        methods ``fraction_of_link``).
    """
    out: list[dict[str, Any]] = []

    def record(experiment, variant, metric, row, which, **extra):
        return {"experiment": experiment, "variant": variant, "metric": metric, "value": float(row[f"{which}_gbps"]),
                "unit": "GB/s", "repeats": int(row[f"{which}_repeats"]),
                "spread": {"p25": float(row[f"{which}_gbps_p25"]), "p75": float(row[f"{which}_gbps_p75"])},
                "size_bytes": int(row[f"{which}_size_bytes"]), "regime": str(row[f"{which}_regime"]), **extra}

    for _, row in summary.iterrows():
        if row["method"] == "host_memcpy":
            ref = memcpy_reference(summary, cache_bytes=cache_bytes)
            out.append(record("host memcpy bandwidth", ref["label"], "memcpy_bandwidth", row, "largest",
                              reference=True))
            if int(row["peak_size_bytes"]) != int(row["largest_size_bytes"]):
                kind = "cache-sized peak" if row["peak_regime"] == "cache" else "peak"
                out.append(record("host memcpy bandwidth", f"{kind} ({_size_text(row['peak_size_bytes'])} copies)",
                                  "memcpy_peak_bandwidth", row, "peak", reference=False))
            continue
        for which, metric in (("largest", "bandwidth_at_largest_size"), ("peak", "peak_bandwidth")):
            frac = float(row[f"{which}_gbps"]) / link_gbps if link_gbps else None
            out.append(record("h2d bandwidth", str(row["method"]), metric, row, which, fraction_of_link=frac))
    return out


def pinning_verdict(comparisons: dict[str, "Comparison"], *, threshold: float = 1.05,
                    applicability: Applicability | None = None,
                    reference: dict[str, Any] | None = None) -> dict[str, Any]:
    """The notebook's verdict: enable the best pinned method, leave pinning off, or not applicable.

    Parameters
    ----------
    comparisons : dict
        From :func:`batch_comparison`.
    threshold : float, default 1.05
        Least lower bound of the speedup's confidence interval that counts as
        a real gain (5%: smaller gains are within run-to-run noise of copies).
    applicability : Applicability, optional
        When given and not applicable, the verdict is "not applicable" with its reason.
    reference : dict, optional
        :func:`memcpy_reference`; when the verdict is "not applicable", its
        rate is quoted in the reason (what pinning a batch would cost at
        least), labelled for what it is.

    Returns
    -------
    dict
        ``recommendation`` ("enable", "leave off", "not applicable"),
        ``value`` (the best method's speedup, or None), ``method`` (its name
        or None), ``spread`` (its interval or None) and ``reason`` (a
        sentence built from the numbers), ``action`` (a :class:`helpers.verdict.Action` on
        ``pin_memory``).
    """
    v = _pinning_decision(comparisons, threshold=threshold, applicability=applicability, reference=reference)
    rec = v["recommendation"]
    v["action"] = Action("pin_memory", rec == "enable", f"pinned memory: {rec}", current=False)
    return v


def _pinning_decision(comparisons: dict[str, "Comparison"], *, threshold: float = 1.05,
                      applicability: Applicability | None = None,
                      reference: dict[str, Any] | None = None) -> dict[str, Any]:
    if applicability is not None and not applicability.applicable:
        reason = applicability.reason
        if reference is not None:
            reason += (f"; for reference, the host memcpy that pinning a batch would cost at least: "
                       f"{reference['gbps']:.1f} GB/s, {reference['label']}"
                       + (f" ({reference['advice']})" if reference["advice"] else ""))
            if reference["peak_size_bytes"] != reference["size_bytes"]:
                kind = "cache-sized peak" if reference["peak_regime"] == "cache" else "peak"
                reason += (f"; its {kind} is {reference['peak_gbps']:.1f} GB/s at "
                           f"{_size_text(reference['peak_size_bytes'])}")
        return {"recommendation": "not applicable", "value": None, "method": None, "spread": None,
                "reason": reason}
    if not comparisons:
        return {"recommendation": "not applicable", "value": None, "method": None, "spread": None,
                "reason": "no pinned copy method was measured"}
    best_method, best = max(comparisons.items(), key=lambda kv: kv[1].ratio)
    spread = {"ci_low": best.ci_low, "ci_high": best.ci_high, "confidence": best.confidence}
    others = "; ".join(f"{k} {c.ratio:.2f}x" for k, c in comparisons.items() if k != best_method)
    pct = f"{best.confidence * 100:.0f}%"
    if best.ci_low > threshold:
        reason = (f"{_METHOD_LABELS[best_method]} copies a batch {best.ratio:.2f}x as fast as pageable "
                  f"({pct} CI {best.ci_low:.2f}-{best.ci_high:.2f}, above the {threshold:.2f}x threshold)"
                  + (f"; others: {others}" if others else ""))
        return {"recommendation": "enable", "value": best.ratio, "method": best_method, "spread": spread,
                "reason": reason}
    reason = (f"the best pinned method, {_METHOD_LABELS[best_method]}, reached {best.ratio:.2f}x pageable "
              f"({pct} CI {best.ci_low:.2f}-{best.ci_high:.2f}), not clearly above {threshold:.2f}x"
              + (f"; others: {others}" if others else ""))
    return {"recommendation": "leave off", "value": best.ratio, "method": best_method, "spread": spread,
            "reason": reason}


def method_label(method: str) -> str:
    """Human-readable name of a copy method (for tables and legends)."""
    return _METHOD_LABELS.get(method, method)
