"""Machine facts of the host-device link and the host's caches: what a copy's bandwidth can be measured against.

- The theoretical bandwidth of a PCIe link (:func:`pcie_limit_gbps`, from
  :data:`PCIE_LANE_RATES`), read from Linux sysfs for a PCI device
  (:func:`read_pcie_link`: generation and width of both ends), found for an
  accelerator from its PCI address (:func:`device_pci_address`) or given as a
  parameter (:func:`link_limit`).
- The size of the CPU's last-level cache (:func:`last_level_cache_bytes`) and
  whether a host copy of a given size runs in it or in main memory
  (:func:`size_regime`).

Everything here only *reads* the system (sysfs, and torch's device
properties for a CUDA device); nothing changes a setting, and what cannot be
read is not an error: the result says "unknown" with the reason.

Bandwidth is in GB/s = 1e9 bytes per second (not GiB/s).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from helpers.errors import ParameterError

if TYPE_CHECKING:  # pragma: no cover - typing only
    from helpers.device import Accelerator

__all__ = [
    "GB",
    "PCIE_LANE_RATES",
    "LinkInfo",
    "parse_link_speed",
    "parse_link_width",
    "pcie_limit_gbps",
    "read_pcie_link",
    "device_pci_address",
    "link_limit",
    "last_level_cache_bytes",
    "size_regime",
]

#: Bytes in a gigabyte as used for bandwidth here (SI: 1e9 bytes, not 2**30).
GB = 1e9

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
    # torch only here, for a CUDA device: the rest of this module reads sysfs, and the diagnose layer's machine
    # facts import without torch (importing it can fail where torch_npu is installed but CANN is not set up).
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


# --------------------------------------------------------------------------- the host's caches


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
