"""Read-only environment doctor: what this machine and Python look like.

Everything here only *reads* the system (``/proc``, ``/sys``, ``psutil``,
``importlib.metadata``); nothing changes a setting. The module does not import
torch: the environment notebook calls it before torch is imported, because
importing torch can fail when torch_npu is installed but CANN is not set up
(huggingface/accelerate#3754). Torch facts (intra-op threads) are reported only when torch is
already in ``sys.modules``.

Typical use::

    info = system_info()
    environment_frame(info)          # a two-column table for display
    package_versions()               # {"torch": "2.13.0", "torch_npu": None, ...}
    cpu_bf16_support(info)           # {"native_bf16": False, "detail": "..."}
"""

from __future__ import annotations

import importlib.metadata
import logging
import multiprocessing
import os
import platform
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping

logger = logging.getLogger(__name__)

__all__ = [
    "CPU_FLAGS",
    "DEFAULT_PACKAGES",
    "system_info",
    "package_versions",
    "cpu_bf16_support",
    "environment_frame",
]

#: x86 CPU flags (as spelled in the ``flags`` line of Linux ``/proc/cpuinfo``)
#: that decide how fast CPU training kernels can be. ``avx512_bf16`` and
#: ``amx_bf16`` are the native bf16 paths (pytorch/pytorch#118499);
#: ``amx_tile`` is the AMX tile unit; ``avx512_fp16`` is AVX512-FP16.
CPU_FLAGS: tuple[str, ...] = (
    "avx2",
    "avx512f",
    "avx512_bf16",
    "amx_bf16",
    "amx_tile",
    "avx512_fp16",
)

#: Arm CPU features (as spelled in the ``Features`` line of aarch64
#: ``/proc/cpuinfo``) that matter for training: ``bf16`` is the Armv8.6 BF16
#: extension, ``sve`` the Scalable Vector Extension, ``asimd`` NEON.
ARM_CPU_FLAGS: tuple[str, ...] = ("asimd", "sve", "bf16")

#: Distributions whose versions the workbook reports (PyPI names).
DEFAULT_PACKAGES: tuple[str, ...] = (
    "torch",
    "torch_npu",
    "torchvision",
    "numpy",
    "pillow",
    "simplejpeg",
    "tokenizers",
    "pandas",
    "matplotlib",
    "papermill",
    "nbval",
    "jupyterlab",
    "ipywidgets",
)

_X86_MACHINES = {"x86_64", "amd64", "i386", "i686", "x86"}
_ARM_MACHINES = {"aarch64", "arm64"}


def _read_text(path: Path) -> str | None:
    """Return the text of ``path``, or None if it cannot be read."""
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _parse_cpuinfo(text: str) -> dict[str, Any]:
    """Parse the first processor block of Linux ``/proc/cpuinfo``.

    Parameters
    ----------
    text : str
        Contents of ``/proc/cpuinfo``.

    Returns
    -------
    dict
        ``model_name`` (str or None; from "model name", or on Arm from
        "CPU implementer"/"CPU part"), ``flags`` (set of str from the x86
        ``flags`` line or the Arm ``Features`` line; None if neither is present).
    """
    model_name: str | None = None
    flags: set[str] | None = None
    implementer = part = None
    for line in text.splitlines():
        if ":" not in line:
            continue
        key, _, value = line.partition(":")
        key = key.strip().lower()
        value = value.strip()
        if key == "model name" and model_name is None:
            model_name = value
        elif key in ("flags", "features") and flags is None:
            flags = set(value.split())
        elif key == "cpu implementer" and implementer is None:
            implementer = value
        elif key == "cpu part" and part is None:
            part = value
    if model_name is None and implementer is not None:
        model_name = f"Arm CPU (implementer {implementer}, part {part})"
    return {"model_name": model_name, "flags": flags}


def _numa_nodes(root: Path) -> tuple[int | None, dict[str, str]]:
    """Count NUMA nodes under ``<root>/sys/devices/system/node`` and read their cpulists.

    Returns
    -------
    (count, cpulists)
        ``count`` is None when the folder does not exist (non-Linux, or a
        container that hides it); ``cpulists`` maps "node0" to e.g. "0-15,32-47".
    """
    node_dir = root / "sys" / "devices" / "system" / "node"
    if not node_dir.is_dir():
        return None, {}
    nodes = sorted(
        (p for p in node_dir.glob("node*") if p.name[4:].isdigit()),
        key=lambda p: int(p.name[4:]),
    )
    cpulists: dict[str, str] = {}
    for node in nodes:
        text = _read_text(node / "cpulist")
        cpulists[node.name] = text.strip() if text is not None else ""
    return len(nodes), cpulists


def _cgroup_cpu_quota(root: Path) -> dict[str, Any]:
    """Read the cgroup CPU quota (v2 ``cpu.max``, else v1 ``cpu.cfs_quota_us``).

    Returns
    -------
    dict
        ``cgroup_cpu_max``: the raw setting (str, e.g. "200000 100000" or
        "max 100000") or None when no cgroup CPU file exists;
        ``cgroup_cpu_quota_cores``: quota/period in cores (float), or None when
        unlimited or unknown.
    """
    cg = root / "sys" / "fs" / "cgroup"
    raw = _read_text(cg / "cpu.max")
    if raw is not None:
        raw = raw.strip()
        parts = raw.split()
        cores = None
        if len(parts) == 2 and parts[0] != "max":
            try:
                cores = int(parts[0]) / int(parts[1])
            except (ValueError, ZeroDivisionError):
                cores = None
        return {"cgroup_cpu_max": raw, "cgroup_cpu_quota_cores": cores}
    quota = _read_text(cg / "cpu" / "cpu.cfs_quota_us")
    period = _read_text(cg / "cpu" / "cpu.cfs_period_us")
    if quota is not None and period is not None:
        raw = f"{quota.strip()} {period.strip()}"
        cores = None
        try:
            q, p = int(quota), int(period)
            if q > 0 and p > 0:
                cores = q / p
        except ValueError:
            cores = None
        return {"cgroup_cpu_max": raw, "cgroup_cpu_quota_cores": cores}
    return {"cgroup_cpu_max": None, "cgroup_cpu_quota_cores": None}


def _torch_threads() -> dict[str, Any]:
    """Torch thread settings, only if torch is already imported (never imports it)."""
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "get_num_threads"):
        return {"torch_imported": False, "torch_intra_op_threads": None,
                "torch_inter_op_threads": None}
    try:
        intra = int(torch.get_num_threads())
        inter = int(torch.get_num_interop_threads())
    except Exception:  # a half-initialised torch must not break the doctor
        logger.debug("torch is imported but its thread counts could not be read", exc_info=True)
        intra = inter = None
    return {"torch_imported": True, "torch_intra_op_threads": intra,
            "torch_inter_op_threads": inter}


def system_info(*, root: Path | str = Path("/")) -> dict[str, Any]:
    """Describe this machine and Python process, reading only.

    Parameters
    ----------
    root : path-like, default "/"
        Filesystem root under which ``proc/cpuinfo``, ``sys/devices/system/node``
        and ``sys/fs/cgroup`` are read. Tests pass a fake tree; normal use keeps "/".

    Returns
    -------
    dict
        Keys and units:

        - ``os``, ``kernel``, ``platform``, ``machine`` (str): from :mod:`platform`.
        - ``python_version``, ``python_implementation``, ``python_executable`` (str).
        - ``cpu_model`` (str or None): ``/proc/cpuinfo`` "model name" (Arm:
          implementer/part), else :func:`platform.processor`, else None.
        - ``cpu_flags`` (dict[str, bool | None]): each of :data:`CPU_FLAGS`;
          None where ``/proc/cpuinfo`` is unreadable or the CPU is not x86.
        - ``arm_cpu_flags`` (dict[str, bool | None]): each of
          :data:`ARM_CPU_FLAGS`; None unless the CPU is Arm and flags were read.
        - ``logical_cores`` (int or None): :func:`os.cpu_count`.
        - ``usable_cores`` (int or None): ``len(os.sched_getaffinity(0))``, the
          cores this process may run on (None where unsupported).
        - ``physical_cores`` (int or None): ``psutil.cpu_count(logical=False)``.
        - ``memory_total_bytes``, ``memory_available_bytes`` (int, bytes):
          ``psutil.virtual_memory()``; None if psutil is missing.
        - ``numa_nodes`` (int or None) and ``numa_cpulists`` (dict[str, str]).
        - ``torch_imported`` (bool), ``torch_intra_op_threads``,
          ``torch_inter_op_threads`` (int or None): only read if torch is
          already imported.
        - ``mp_start_method`` (str): the multiprocessing start method that a
          new process would use; ``mp_start_method_fixed`` (bool): whether the
          program has already fixed it (reading does not fix it).
        - ``cgroup_cpu_max`` (str or None), ``cgroup_cpu_quota_cores``
          (float or None): the container CPU quota, if any.
    """
    root = Path(root)
    info: dict[str, Any] = {
        "os": platform.system(),
        "kernel": platform.release(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python_version": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "python_executable": sys.executable,
    }

    cpuinfo_text = _read_text(root / "proc" / "cpuinfo")
    parsed = _parse_cpuinfo(cpuinfo_text) if cpuinfo_text is not None else {
        "model_name": None, "flags": None}
    info["cpu_model"] = parsed["model_name"] or platform.processor() or None

    flags = parsed["flags"]
    machine = platform.machine().lower()
    is_x86 = machine in _X86_MACHINES
    is_arm = machine in _ARM_MACHINES
    info["cpu_flags"] = {
        name: (name in flags) if (flags is not None and is_x86) else None
        for name in CPU_FLAGS
    }
    info["arm_cpu_flags"] = {
        name: (name in flags) if (flags is not None and is_arm) else None
        for name in ARM_CPU_FLAGS
    }

    info["logical_cores"] = os.cpu_count()
    try:
        info["usable_cores"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        info["usable_cores"] = None

    try:
        import psutil
    except ImportError:
        logger.warning("psutil is not installed: physical cores and memory are unknown")
        psutil = None
    if psutil is not None:
        info["physical_cores"] = psutil.cpu_count(logical=False)
        vm = psutil.virtual_memory()
        info["memory_total_bytes"] = int(vm.total)
        info["memory_available_bytes"] = int(vm.available)
    else:
        info["physical_cores"] = None
        info["memory_total_bytes"] = None
        info["memory_available_bytes"] = None

    count, cpulists = _numa_nodes(root)
    info["numa_nodes"] = count
    info["numa_cpulists"] = cpulists

    info.update(_torch_threads())

    # get_start_method() without allow_none would fix the method for the whole
    # program; the docs say the first entry of get_all_start_methods() is the
    # platform default, which is what an unfixed program will use.
    fixed = multiprocessing.get_start_method(allow_none=True)
    info["mp_start_method"] = fixed or multiprocessing.get_all_start_methods()[0]
    info["mp_start_method_fixed"] = fixed is not None

    info.update(_cgroup_cpu_quota(root))
    return info


def package_versions(names: Iterable[str] = DEFAULT_PACKAGES) -> dict[str, str | None]:
    """Installed versions of the named distributions, without importing them.

    Parameters
    ----------
    names : iterable of str
        Distribution names as on PyPI (``importlib.metadata`` normalises case,
        ``-`` and ``_``). Default :data:`DEFAULT_PACKAGES`.

    Returns
    -------
    dict[str, str | None]
        Name to version string, or None where the distribution is not installed.
    """
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def cpu_bf16_support(info: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Say whether this CPU has native bf16 arithmetic.

    bf16 autocast on a CPU without AVX512-BF16 or AMX is emulated and can be
    slower than fp32 (pytorch/pytorch#118499), so the mixed-precision
    notebook measures before it recommends; this function gives the reason.

    Parameters
    ----------
    info : mapping, optional
        The result of :func:`system_info`; read afresh when omitted.

    Returns
    -------
    dict
        ``native_bf16`` (bool): True when x86 ``avx512_bf16`` or ``amx_bf16``
        is present, or the Arm ``bf16`` feature is present; ``detail`` (str):
        which flags were seen, or why nothing could be said.
    """
    if info is None:
        info = system_info()
    flags = info.get("cpu_flags") or {}
    arm = info.get("arm_cpu_flags") or {}
    if any(v is not None for v in flags.values()):
        native = [name for name in ("amx_bf16", "avx512_bf16") if flags.get(name)]
        if native:
            return {"native_bf16": True,
                    "detail": f"native bf16 instructions present: {', '.join(native)}"}
        return {"native_bf16": False,
                "detail": ("no avx512_bf16 or amx_bf16 flag: bf16 is emulated on this CPU and "
                           "autocast to bf16 may be slower than fp32; measure before enabling it")}
    if any(v is not None for v in arm.values()):
        if arm.get("bf16"):
            return {"native_bf16": True,
                    "detail": "Arm BF16 extension present (bf16 in /proc/cpuinfo Features)"}
        return {"native_bf16": False,
                "detail": ("no Arm bf16 feature: bf16 is emulated on this CPU and autocast to "
                           "bf16 may be slower than fp32; measure before enabling it")}
    return {"native_bf16": False,
            "detail": ("CPU flags could not be read (not Linux, or /proc/cpuinfo hidden): "
                       "unknown; measure bf16 against fp32 before enabling it")}


def _format_value(key: str, value: Any) -> str:
    """Render one value for display (bytes as GiB, None as 'n/a')."""
    if value is None:
        return "n/a"
    if key.endswith("_bytes") and isinstance(value, int):
        return f"{value / 2**30:.1f} GiB ({value} bytes)"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def environment_frame(info: Mapping[str, Any]):
    """Flatten :func:`system_info` (or any flat/nested mapping) into a display table.

    Parameters
    ----------
    info : mapping
        Usually the result of :func:`system_info`. Nested mappings (such as
        ``cpu_flags``) become one row per entry, named ``"cpu_flags.avx2"``.

    Returns
    -------
    pandas.DataFrame
        Columns ``item`` (str) and ``value`` (str; None shown as "n/a",
        byte counts as GiB with the exact byte count), in the mapping's order.
    """
    import pandas as pd

    rows: list[tuple[str, str]] = []
    for key, value in info.items():
        if isinstance(value, Mapping):
            if not value:
                rows.append((key, "n/a"))
            for sub, subvalue in value.items():
                rows.append((f"{key}.{sub}", _format_value(sub, subvalue)))
        else:
            rows.append((key, _format_value(key, value)))
    return pd.DataFrame(rows, columns=["item", "value"])
