"""One view of the accelerator: NPU (torch_npu), CUDA or plain CPU.

The device kind is resolved once, in :func:`get_accelerator`; everything after
that goes through PyTorch's device-generic APIs (``torch.accelerator``,
``torch.accelerator.memory``, ``torch.Stream``, ``torch.Event``,
``torch.amp.autocast(device_type=...)``), so callers never write
``if cuda ... elif npu ...``.

On a CPU-only build of torch, ``torch.accelerator.synchronize()``,
``current_stream()``, the ``memory_*`` functions and ``Tensor.pin_memory()``
raise ``RuntimeError: Cannot access accelerator device when none is
available`` (``docs/ascend_api_factcheck.md``, sections 1 and 2), so
every such call here is behind the device kind: on ``"cpu"`` they are no-ops
or report "not available" with the reason.

Importing this module does not import torch: torch is imported on the first
call, after :func:`helpers.npu_probe.prepare_torch_import` has made
sure a broken torch_npu cannot make ``import torch`` fail (huggingface/accelerate#3754).

What the CPU reports, and why
-----------------------------
- streams: **not available**.  ``torch.Stream(device="cpu")`` can be created,
  but CPU operators run synchronously on the calling thread, so a side stream
  overlaps nothing; :meth:`Accelerator.new_stream` returns None.
- events: not available, for the same reason (:meth:`Accelerator.new_event`
  returns None); time CPU work with ``time.perf_counter``.
- pinned memory and non-blocking copies: not available (no device to copy to).
- memory_stats: the device allocator statistics are not available;
  :meth:`Accelerator.memory_stats` reports the process's RSS and USS instead.
- autocast: ``bfloat16`` and ``float16`` (torch 2.13's CPU autocast accepts
  both: ``torch/amp/autocast_mode.py``, ``device_supported_dtypes``).  Accepted
  does not mean fast: bf16 on a CPU without AVX512-BF16/AMX can be slower than
  fp32 (pytorch/pytorch#118499); the notebooks measure it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import logging
import os
import platform
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from helpers import npu_probe
from helpers.errors import DeviceUnavailableError, ParameterError

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

logger = logging.getLogger(__name__)

__all__ = [
    "KINDS",
    "Capability",
    "Capabilities",
    "Accelerator",
    "get_accelerator",
]

#: Accepted values of ``kind`` in :func:`get_accelerator`.
KINDS: tuple[str, ...] = ("auto", "cpu", "cuda", "npu")

#: Names people type for a device kind, and the kind they mean.
_KIND_ALIASES = {
    "gpu": "cuda",
    "nvidia": "cuda",
    "cuda0": "cuda",
    "ascend": "npu",
    "torch_npu": "npu",
    "host": "cpu",
}

#: Device types torch knows that this workbook does not support.
_UNSUPPORTED_KINDS = ("xpu", "mps", "mtia", "hpu", "xla", "meta", "privateuseone")

#: Autocast dtypes tried, in order of preference.
_AUTOCAST_CANDIDATES: tuple[str, ...] = ("bfloat16", "float16")

#: Spellings accepted by :meth:`Accelerator.autocast`.
_DTYPE_ALIASES = {
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
}

#: Device kinds on which ``torch.channels_last`` must not be used, and why
#: (``docs/ascend_api_factcheck.md``, section 8, "channels_last / NHWC").
_NO_CHANNELS_LAST = {
    "npu": (
        "NPU Tensor.to accepts only contiguous_format/preserve_format; conv kernels "
        "use internal formats (5HD/FRACTAL_Z), so keep NCHW-contiguous"
    ),
}


# --------------------------------------------------------------------------
# capabilities


@dataclass(frozen=True)
class Capability:
    """Whether this device can do one thing, and why (not).

    Attributes
    ----------
    available : bool
        True when the feature can be used on this device.
    detail : str
        What the feature is on this device, or the reason it is not available.
    """

    available: bool
    detail: str = ""

    def __str__(self) -> str:
        return "available" if self.available else f"not available: {self.detail}"


@dataclass(frozen=True)
class Capabilities:
    """What the chosen device can do.

    Attributes
    ----------
    pinned_memory : Capability
        Page-locked host buffers (``Tensor.pin_memory()``,
        ``DataLoader(pin_memory=True)``).
    non_blocking_copy : Capability
        Asynchronous host-to-device copies (``tensor.to(dev, non_blocking=True)``).
    streams : Capability
        Side streams (``torch.Stream``) whose work overlaps the default stream.
    events : Capability
        Device events (``torch.Event``) for ordering and timing.
    memory_stats : Capability
        Device allocator statistics (``torch.accelerator.memory``).
    channels_last : Capability
        ``torch.channels_last`` (NHWC) memory format.
    autocast_dtypes : tuple of str
        Dtype names ``torch.amp.autocast(device_type=kind, dtype=...)``
        accepts here, e.g. ``("bfloat16", "float16")``; empty when none.
    """

    pinned_memory: Capability
    non_blocking_copy: Capability
    streams: Capability
    events: Capability
    memory_stats: Capability
    channels_last: Capability
    autocast_dtypes: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, str]:
        """Return ``{name: str(capability)}``; ``autocast_dtypes`` as a comma list or "none"."""
        out: dict[str, str] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Capability):
                out[f.name] = str(value)
            else:
                out[f.name] = ", ".join(value) if value else "none"
        return out


def _autocast_dtypes(torch_mod: Any, kind: str) -> tuple[str, ...]:
    """Dtype names that ``torch.amp.autocast(device_type=kind, dtype=...)`` accepts.

    Asks torch itself: a dtype counts when constructing the autocast context
    neither raises nor warns (torch warns "... Disabling autocast" for an
    unsupported dtype and raises for bfloat16 on a CUDA device without it,
    ``torch/amp/autocast_mode.py``).  When the device module has
    ``is_bf16_supported`` (``torch.cuda``, ``torch.npu``), bfloat16 also needs it.
    Nothing runs on the device.
    """
    is_available = getattr(getattr(torch_mod.amp, "autocast_mode", None), "is_autocast_available", None)
    try:
        if is_available is not None and not is_available(kind):
            return ()
    except RuntimeError as exc:  # e.g. "npu" before torch_npu registered it
        logger.debug("autocast not available on %s: %s", kind, exc)
        return ()
    module = getattr(torch_mod, kind, None)
    found = []
    for name in _AUTOCAST_CANDIDATES:
        dtype = getattr(torch_mod, name)
        if name == "bfloat16":
            bf16_ok = getattr(module, "is_bf16_supported", None)
            try:
                if bf16_ok is not None and not bf16_ok():
                    continue
            except Exception as exc:  # a probe must not break device selection
                logger.debug("is_bf16_supported() on %s raised %r", kind, exc)
                continue
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            try:
                torch_mod.amp.autocast(device_type=kind, dtype=dtype)
            except (Warning, RuntimeError, AssertionError, ValueError) as exc:
                logger.debug("autocast(%s, %s) not accepted: %s", kind, name, exc)
                continue
        found.append(name)
    return tuple(found)


def _cpu_capabilities(torch_mod: Any) -> Capabilities:
    no_acc = (
        "; this torch has no usable accelerator, and Tensor.pin_memory() raises "
        "'Cannot access accelerator device when none is available'"
        if not torch_mod.accelerator.is_available()
        else ""
    )
    return Capabilities(
        pinned_memory=Capability(
            False, "the device is the CPU: there is no host-to-device copy to speed up" + no_acc
        ),
        non_blocking_copy=Capability(
            False, "the device is the CPU: a copy is a plain host memcpy, nothing runs asynchronously"
        ),
        streams=Capability(
            False,
            "the device is the CPU: torch.Stream(device='cpu') can be created, but CPU "
            "operators run synchronously on the calling thread, so a side stream overlaps nothing",
        ),
        events=Capability(
            False,
            "the device is the CPU: work is synchronous, so time it with time.perf_counter "
            "after the call returns",
        ),
        memory_stats=Capability(
            False,
            "the device is the CPU: there is no device allocator; memory_stats() reports "
            "this process's RSS/USS instead",
        ),
        channels_last=Capability(True, "torch.channels_last tensors; oneDNN convolutions run NHWC on CPU"),
        autocast_dtypes=_autocast_dtypes(torch_mod, "cpu"),
    )


def _device_capabilities(torch_mod: Any, kind: str) -> Capabilities:
    """Capabilities of an available accelerator of type ``kind``, from generic APIs."""
    has_memory = hasattr(torch_mod.accelerator, "memory") or hasattr(
        getattr(torch_mod, kind, None), "memory_allocated"
    )
    no_cl = _NO_CHANNELS_LAST.get(kind)
    return Capabilities(
        pinned_memory=Capability(
            True, "Tensor.pin_memory() / DataLoader(pin_memory=True) allocate page-locked host memory"
        ),
        non_blocking_copy=Capability(
            True, f"tensor.to('{kind}', non_blocking=True) is asynchronous from pinned memory"
        ),
        streams=Capability(
            hasattr(torch_mod, "Stream"),
            f"torch.Stream(device='{kind}')" if hasattr(torch_mod, "Stream")
            else f"this torch {torch_mod.__version__} has no generic torch.Stream (added around torch 2.4, PyTorch PR #123611)",
        ),
        events=Capability(
            hasattr(torch_mod, "Event"),
            f"torch.Event(device='{kind}', enable_timing=True)" if hasattr(torch_mod, "Event")
            else f"this torch {torch_mod.__version__} has no generic torch.Event (added around torch 2.4, PyTorch PR #123611)",
        ),
        memory_stats=Capability(
            has_memory,
            "torch.accelerator.memory (allocated, reserved, peak)" if has_memory
            else f"this torch {torch_mod.__version__} has no torch.accelerator.memory",
        ),
        channels_last=Capability(False, no_cl) if no_cl else Capability(True, "torch.channels_last (NHWC)"),
        autocast_dtypes=_autocast_dtypes(torch_mod, kind),
    )


# --------------------------------------------------------------------------
# the accelerator


def _cpu_name() -> str:
    """The CPU model: ``model name`` from /proc/cpuinfo, else platform's answer."""
    cpuinfo = Path("/proc/cpuinfo")
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


@dataclass(frozen=True)
class Accelerator:
    """The device a workbook runs on, with one set of generic operations.

    Create it with :func:`get_accelerator`; do not build it by hand.

    Attributes
    ----------
    kind : str
        ``"cpu"``, ``"cuda"`` or ``"npu"``.
    name : str
        Device name (e.g. ``"NVIDIA H100 80GB HBM3"``, ``"Ascend910B3"``); on
        the CPU, the CPU model.
    count : int
        Number of devices of this kind visible to the process (1 for cpu).
    index : int
        The index used, ``0 <= index < count``.
    device : torch.device
        ``torch.device(kind, index)`` (``torch.device("cpu")`` for cpu).
    capabilities : Capabilities
        What this device can do.
    """

    kind: str
    name: str
    count: int
    index: int
    device: "torch.device"
    capabilities: Capabilities

    @property
    def is_cpu(self) -> bool:
        """bool: True when the device is the CPU (no accelerator in use)."""
        return self.kind == "cpu"

    def synchronize(self) -> None:
        """Wait until all work queued on the device is done (no-op on cpu)."""
        if self.is_cpu:
            return
        import torch

        torch.accelerator.synchronize(self.index)

    def new_stream(self) -> "torch.Stream | None":
        """Return a new side stream on the device, or None where streams are not available."""
        if not self.capabilities.streams.available:
            return None
        import torch

        return torch.Stream(device=self.device)

    def new_event(self, enable_timing: bool = False) -> "torch.Event | None":
        """Return a new device event, or None where events are not available.

        Parameters
        ----------
        enable_timing : bool, default False
            Let the event measure elapsed time (``Event.elapsed_time``, in ms).
        """
        if not self.capabilities.events.available:
            return None
        import torch

        return torch.Event(device=self.device, enable_timing=enable_timing)

    def memory_stats(self) -> dict[str, Any]:
        """Return memory in use, in bytes.

        Returns
        -------
        dict
            On a device (``source="device"``): ``allocated_bytes``,
            ``reserved_bytes``, ``peak_allocated_bytes`` (since the last
            :meth:`reset_peak_memory_stats`), ``fragmentation`` = 1 -
            allocated/reserved (None when nothing is reserved), ``device``.
            On the CPU (``source="process"``): ``rss_bytes``, ``uss_bytes``
            (unique set size; equals RSS with ``uss_is_rss=True`` where the OS
            does not let psutil read it), ``peak_rss_bytes`` (peak RSS of the
            process's lifetime, from ``resource.getrusage``; None where
            unknown), ``device``.
        """
        if self.is_cpu:
            return _process_memory()
        import torch

        mem = _memory_api(torch, self.kind)
        allocated = int(mem.memory_allocated(self.index))
        reserved = int(mem.memory_reserved(self.index))
        peak = int(mem.max_memory_allocated(self.index))
        return {
            "allocated_bytes": allocated,
            "reserved_bytes": reserved,
            "peak_allocated_bytes": peak,
            "fragmentation": (1.0 - allocated / reserved) if reserved > 0 else None,
            "source": "device",
            "device": str(self.device),
        }

    def reset_peak_memory_stats(self) -> None:
        """Restart the device's peak-memory counter (no-op on cpu, whose peak RSS cannot be reset)."""
        if self.is_cpu:
            return
        import torch

        _memory_api(torch, self.kind).reset_peak_memory_stats(self.index)

    def autocast(self, dtype: "str | torch.dtype") -> contextlib.AbstractContextManager:
        """Return ``torch.amp.autocast(device_type=self.kind, dtype=dtype)``.

        Parameters
        ----------
        dtype : str or torch.dtype
            ``"bfloat16"``/``"bf16"``, ``"float16"``/``"fp16"``/``"half"``, or
            the torch dtype.

        Returns
        -------
        contextlib.AbstractContextManager
            The autocast context.

        Raises
        ------
        ParameterError
            When ``dtype`` is not one of ``capabilities.autocast_dtypes``.
        """
        import torch

        name = _dtype_name(torch, dtype)
        allowed = self.capabilities.autocast_dtypes
        if name not in allowed:
            raise ParameterError(
                f"autocast dtype {dtype!r} is not supported on {self.kind}; supported here: "
                f"{', '.join(allowed) if allowed else 'none'}. Use one of those, or run in "
                "float32 without autocast."
            )
        return torch.amp.autocast(device_type=self.kind, dtype=getattr(torch, name))

    def to_device(self, tensor: "torch.Tensor", non_blocking: bool = False) -> "torch.Tensor":
        """Copy ``tensor`` to this device.

        Parameters
        ----------
        tensor : torch.Tensor
            Any shape and dtype.
        non_blocking : bool, default False
            Ask for an asynchronous copy; ignored (a plain copy) where
            ``capabilities.non_blocking_copy`` is not available.  Only a copy
            from pinned memory is truly asynchronous; synchronize before the
            host reuses the source buffer.

        Returns
        -------
        torch.Tensor
            The tensor on ``self.device`` (the same tensor if already there).
        """
        return tensor.to(self.device, non_blocking=bool(non_blocking and self.capabilities.non_blocking_copy.available))

    def describe(self) -> dict[str, Any]:
        """Return a JSON-serialisable summary: kind, name, count, index, device, torch version, capabilities."""
        import torch

        return {
            "kind": self.kind,
            "name": self.name,
            "count": self.count,
            "index": self.index,
            "device": str(self.device),
            "torch_version": torch.__version__,
            "capabilities": self.capabilities.as_dict(),
        }


def _memory_api(torch_mod: Any, kind: str) -> Any:
    """``torch.accelerator.memory`` where it exists (it does in torch 2.13), else ``torch.<kind>``.

    Both have ``memory_allocated``, ``memory_reserved``, ``max_memory_allocated``
    and ``reset_peak_memory_stats`` taking a device index.
    """
    return getattr(torch_mod.accelerator, "memory", None) or getattr(torch_mod, kind)


def _process_memory() -> dict[str, Any]:
    """RSS/USS of this process from psutil (bytes)."""
    import psutil

    proc = psutil.Process()
    rss = int(proc.memory_info().rss)
    uss_is_rss = False
    try:
        uss = int(proc.memory_full_info().uss)
    except (psutil.AccessDenied, AttributeError, OSError) as exc:
        logger.debug("USS not readable (%r); reporting RSS as USS", exc)
        uss, uss_is_rss = rss, True
    peak = None
    try:
        import resource

        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        # Linux reports KiB, macOS bytes (getrusage(2) on each).
        peak = int(maxrss) if sys.platform == "darwin" else int(maxrss) * 1024
    except (ImportError, OSError, ValueError):
        pass
    return {
        "rss_bytes": rss,
        "uss_bytes": uss,
        "uss_is_rss": uss_is_rss,
        "peak_rss_bytes": peak,
        "source": "process",
        "device": "cpu",
    }


def _dtype_name(torch_mod: Any, dtype: Any) -> str:
    """Canonical dtype name for an autocast dtype given as str or torch.dtype."""
    if isinstance(dtype, torch_mod.dtype):
        return str(dtype).removeprefix("torch.")
    if isinstance(dtype, str):
        key = dtype.strip().lower().removeprefix("torch.")
        return _DTYPE_ALIASES.get(key, key)
    raise ParameterError(
        f"autocast dtype must be a str or torch.dtype, got {type(dtype).__name__} {dtype!r}; "
        "use e.g. 'bfloat16'"
    )


# --------------------------------------------------------------------------
# choosing the device


def _normalise_kind(kind: Any) -> str:
    if not isinstance(kind, str):
        raise ParameterError(
            f"device kind must be a string, one of {', '.join(KINDS)}; got {kind!r}"
        )
    value = kind.strip().lower()
    if value in KINDS:
        return value
    if value in _UNSUPPORTED_KINDS:
        raise ParameterError(
            f"device kind {kind!r} is not supported by the workbook: allowed values are "
            f"{', '.join(KINDS)}; use 'cpu' to run without an accelerator"
        )
    hint = _KIND_ALIASES.get(value)
    if hint is None and ":" in value:
        base, _, idx = value.partition(":")
        if base in KINDS and idx.isdigit():
            raise ParameterError(
                f"device kind {kind!r} is not one of {', '.join(KINDS)}; pass the index "
                f"separately: get_accelerator({base!r}, index={idx})"
            )
    if hint is None:
        close = difflib.get_close_matches(value, KINDS, n=1)
        hint = close[0] if close else None
    suggestion = f"; did you mean {hint!r}?" if hint else ""
    raise ParameterError(
        f"unknown device kind {kind!r}: allowed values are {', '.join(KINDS)}{suggestion}"
    )


def _check_index(index: Any) -> int:
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ParameterError(f"device index must be an int >= 0, got {index!r}")
    return index


def _import_torch() -> Any:
    """Import torch, first making sure a broken torch_npu cannot make that fail."""
    if "torch" not in sys.modules:
        npu_probe.prepare_torch_import(fallback_to_cpu=True)
    import torch

    return torch


def _npu_status(torch_mod: Any) -> tuple[bool, str]:
    """Whether the NPU can be used in this process, and the reason if not.

    torch_npu is imported here only when the probe (run in a child process)
    said it is usable, or when it is already loaded.
    """
    if "torch_npu" not in sys.modules:
        probe = npu_probe.get_probe()
        if not probe.usable:
            return False, f"{probe.cause} Fix: {probe.fix}"
        try:
            import torch_npu  # noqa: F401  (registers torch.npu and the "npu" device)
        except Exception as exc:  # the child could, this process cannot
            return False, (
                f"torch_npu imported in a child process but not here: {type(exc).__name__}: "
                f"{exc}. Fix: restart the kernel after sourcing {npu_probe.CANN_SET_ENV}"
            )
    acc = torch_mod.accelerator.current_accelerator()
    if acc is None or acc.type != "npu":
        return False, (
            f"torch_npu is loaded but the current accelerator is {acc.type if acc else None!r}, "
            f"not 'npu'. Fix: check {npu_probe.AUTOLOAD_ENV} and that torch is a CPU build"
        )
    if not torch_mod.accelerator.is_available() or torch_mod.accelerator.device_count() == 0:
        visible = os.environ.get("ASCEND_RT_VISIBLE_DEVICES")
        return False, (
            f"torch_npu is loaded but sees no NPU (ASCEND_RT_VISIBLE_DEVICES={visible!r}). "
            "Fix: run npu-smi info to check the driver"
        )
    return True, ""


def _cuda_status(torch_mod: Any) -> tuple[bool, str]:
    """Whether CUDA can be used, and the reason if not."""
    if torch_mod.version.cuda is None and getattr(torch_mod.version, "hip", None) is None:
        return False, (
            f"this torch {torch_mod.__version__} is a CPU build (torch.version.cuda is None). "
            "Fix: install a CUDA build of torch (see docs/run_options.md, 'Other devices')"
        )
    if not torch_mod.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        shown = "unset" if visible is None else repr(visible)
        return False, (
            f"torch {torch_mod.__version__} is built with CUDA {torch_mod.version.cuda} but no "
            f"GPU is visible (CUDA_VISIBLE_DEVICES={shown}). Fix: check nvidia-smi, the "
            "driver, and CUDA_VISIBLE_DEVICES"
        )
    return True, ""


def _resolve_kind(torch_mod: Any, requested: str) -> str:
    """Turn ``"auto"`` into a kind, or check that the requested kind is usable."""
    if requested == "cpu":
        return "cpu"
    if requested == "npu":
        ok, why = _npu_status(torch_mod)
        if not ok:
            raise DeviceUnavailableError(f"device 'npu' requested but not usable: {why}")
        return "npu"
    if requested == "cuda":
        ok, why = _cuda_status(torch_mod)
        if not ok:
            raise DeviceUnavailableError(f"device 'cuda' requested but not usable: {why}")
        return "cuda"
    # auto: npu, then cuda, then cpu
    npu_ok, npu_why = _npu_status(torch_mod)
    if npu_ok:
        return "npu"
    if npu_probe.get_probe().status in ("broken", "no device"):
        logger.warning("NPU not used: %s", npu_why)
    else:
        logger.debug("NPU not used: %s", npu_why)
    cuda_ok, cuda_why = _cuda_status(torch_mod)
    if cuda_ok:
        return "cuda"
    logger.debug("CUDA not used: %s", cuda_why)
    return "cpu"


def usable_cores() -> int:
    """Number of CPU cores this process may run on, at least 1.

    Returns
    -------
    int
        ``len(os.sched_getaffinity(0))`` where the OS has it (Linux; respects
        ``taskset`` and container CPU sets), else ``os.cpu_count()``.
    """
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def get_accelerator(kind: str = "auto", *, index: int = 0) -> Accelerator:
    """Choose the device and describe what it can do.

    Parameters
    ----------
    kind : str, default "auto"
        ``"auto"``, ``"cpu"``, ``"cuda"`` or ``"npu"`` (case-insensitive).
        ``"auto"`` picks the NPU when torch_npu is usable (checked in a child
        process by :func:`helpers.npu_probe.get_probe`), else CUDA
        when available, else the CPU.
    index : int, default 0
        Which device of that kind (``0 <= index < count``; 0 for cpu).

    Returns
    -------
    Accelerator

    Raises
    ------
    ParameterError
        For an unknown kind (the message lists the allowed values and the
        nearest one, e.g. "gpu" -> "cuda") or an index out of range.
    DeviceUnavailableError
        When ``"cuda"`` or ``"npu"`` is requested and cannot be used; the
        message says why (CPU build of torch, no GPU visible, torch_npu not
        installed or broken) and the fix.
    """
    requested = _normalise_kind(kind)
    index = _check_index(index)
    torch = _import_torch()
    resolved = _resolve_kind(torch, requested)

    if resolved == "cpu":
        if index != 0:
            raise ParameterError(f"device index {index} is out of range for cpu: use index=0")
        acc = Accelerator(
            kind="cpu",
            name=_cpu_name(),
            count=1,
            index=0,
            device=torch.device("cpu"),
            capabilities=_cpu_capabilities(torch),
        )
    else:
        count = int(torch.accelerator.device_count())
        if index >= count:
            raise ParameterError(
                f"device index {index} is out of range: {count} {resolved} device(s) visible "
                f"(valid: 0..{count - 1})"
            )
        try:
            name = str(torch.get_device_module(resolved).get_device_name(index))
        except Exception as exc:  # a name is nice to have, not essential
            logger.debug("get_device_name(%d) on %s failed: %r", index, resolved, exc)
            name = f"{resolved}:{index}"
        acc = Accelerator(
            kind=resolved,
            name=name,
            count=count,
            index=index,
            device=torch.device(resolved, index),
            capabilities=_device_capabilities(torch, resolved),
        )
    logger.info(
        "device: %s (%s), %d visible, requested %r", acc.device, acc.name, acc.count, requested
    )
    return acc
