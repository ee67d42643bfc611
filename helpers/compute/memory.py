"""Memory over a training run and allocator settings: the mechanisms behind notebook 09.

- :func:`trace_memory` runs a training step repeatedly and records, per step,
  what the device's caching allocator holds (allocated, reserved, the step's
  peak, fragmentation = 1 - allocated/reserved) through
  :meth:`helpers.device.Accelerator.memory_stats` (``torch.accelerator.memory``
  in torch 2.13). A CPU has no caching allocator: there the trace reports the
  process's resident memory (RSS/USS from psutil) and the step's peak RSS as
  seen by a light sampling thread (:class:`RssPeakSampler`), a lower bound of
  the true peak, said in the frame's ``source`` column (``"process"``).
- Allocator settings (``PYTORCH_CUDA_ALLOC_CONF`` on cuda,
  ``PYTORCH_NPU_ALLOC_CONF`` on npu) are read once, before the first device
  allocation (torch 2.13 ``c10/core/AllocatorConfig.h``: ``PYTORCH_ALLOC_CONF``
  is the primary name, ``PYTORCH_CUDA_ALLOC_CONF`` is read with lower priority;
  torch_npu refuses ``PYTORCH_NPU_ALLOC_CONF`` and ``PYTORCH_ALLOC_CONF``
  together, ``docs/ascend_api_factcheck.md``); :func:`check_alloc_conf` checks
  every value with :func:`helpers.diagnose.envcatalog.validate_value`.
  :func:`measure_empty_cache` shows what ``empty_cache`` frees and costs.
- :func:`is_oom` and :class:`MemoryBudgetExceeded` tell an out-of-memory from other errors.

The batch-size finder is :mod:`helpers.compute.batch_finder`; notebook 09's
experiment (the allocator-settings child process, the finder run on a job)
is :mod:`helpers.experiments.memory`.
"""

from __future__ import annotations

import gc
import logging
import sys
import threading
from typing import TYPE_CHECKING, Any, Callable

from helpers.diagnose.envcatalog import validate_value
from helpers.errors import ParameterError
from helpers.timing import PhaseTimer

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from helpers.device import Accelerator

logger = logging.getLogger(__name__)

__all__ = [
    "MIB",
    "ALLOC_CONF_VAR",
    "RssPeakSampler",
    "MemoryBudgetExceeded",
    "is_oom",
    "trace_memory",
    "alloc_conf_var",
    "check_alloc_conf",
    "check_alloc_conf_list",
    "measure_empty_cache",
]

#: Bytes in a MiB.
MIB = 1024 * 1024
GIB = 1024 * MIB

#: Environment variable each device's caching allocator reads (torch 2.13
#: ``c10/cuda/CUDAAllocatorConfig.h``; torch_npu ``NPUAllocatorConfig.cpp``;
#: ``docs/ascend_api_factcheck.md`` "PYTORCH_NPU_ALLOC_CONF").
ALLOC_CONF_VAR: dict[str, str] = {"cuda": "PYTORCH_CUDA_ALLOC_CONF", "npu": "PYTORCH_NPU_ALLOC_CONF"}



# --------------------------------------------------------------------------
# process memory (CPU)


def rss_bytes() -> int:
    """Resident set size of this process, bytes (psutil)."""
    import psutil

    return int(psutil.Process().memory_info().rss)


class RssPeakSampler:
    """Track the peak resident set size (RSS) of this process while a block runs.

    A background thread reads RSS every ``interval_s`` seconds. The peak it
    reports is the largest value *seen*: a lower bound of the true peak (a
    spike shorter than the interval can be missed). The process's lifetime
    peak (``getrusage`` ``ru_maxrss``) cannot be reset, so it cannot give a
    per-step peak.

    Parameters
    ----------
    interval_s : float, default 0.002
        Seconds between reads (> 0).

    Attributes
    ----------
    start_bytes, peak_bytes, end_bytes : int
        RSS when the block started, the largest RSS seen, RSS when it ended.
    samples : int
        Reads taken.

    Examples
    --------
    >>> with RssPeakSampler() as s:          # doctest: +SKIP
    ...     work()
    >>> s.peak_bytes - s.start_bytes         # doctest: +SKIP
    """

    def __init__(self, interval_s: float = 0.002) -> None:
        if not isinstance(interval_s, (int, float)) or not interval_s > 0:
            raise ParameterError(f"interval_s must be a number > 0 (seconds), got {interval_s!r}")
        self.interval_s = float(interval_s)
        self.start_bytes = 0
        self.peak_bytes = 0
        self.end_bytes = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        import psutil

        proc = psutil.Process()
        while not self._stop.is_set():
            rss = int(proc.memory_info().rss)
            self.samples += 1
            if rss > self.peak_bytes:
                self.peak_bytes = rss
            self._stop.wait(self.interval_s)

    def __enter__(self) -> "RssPeakSampler":
        self.start_bytes = self.peak_bytes = rss_bytes()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="rss-peak-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.end_bytes = rss_bytes()
        self.peak_bytes = max(self.peak_bytes, self.end_bytes)


# --------------------------------------------------------------------------
# out of memory


class MemoryBudgetExceeded(RuntimeError):
    """Raised inside :func:`find_batch_size` when a batch's measured peak exceeds the budget.

    It stands in for a device out-of-memory where there is none (the CPU), so
    the finder handles both the same way. It never escapes the finder.

    Parameters
    ----------
    batch : int
        The batch size that went over.
    used_bytes, budget_bytes : int
        The measured peak and the budget, in bytes.
    """

    def __init__(self, batch: int, used_bytes: int, budget_bytes: int, what: str = "peak") -> None:
        self.batch = batch
        self.used_bytes = used_bytes
        self.budget_bytes = budget_bytes
        super().__init__(
            f"batch {batch}: measured {what} {used_bytes / MIB:.1f} MiB exceeds the memory budget "
            f"{budget_bytes / MIB:.1f} MiB"
        )


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` means "out of memory".

    True for ``torch.OutOfMemoryError`` (CUDA, and torch_npu versions that
    raise it), :class:`MemoryBudgetExceeded`, Python's ``MemoryError``, and a
    ``RuntimeError`` whose message contains "out of memory" (older torch_npu
    raise ``RuntimeError: NPU out of memory. Tried to allocate ...``) or
    "not enough memory" (c10's CPU allocator: "DefaultCPUAllocator: not
    enough memory").

    Parameters
    ----------
    exc : BaseException

    Returns
    -------
    bool
    """
    if isinstance(exc, (MemoryBudgetExceeded, MemoryError)):
        return True
    try:
        import torch

        if isinstance(exc, torch.OutOfMemoryError):
            return True
    except (ImportError, AttributeError):  # pragma: no cover - torch always there in practice
        pass
    if isinstance(exc, RuntimeError):
        text = str(exc).lower()
        return "out of memory" in text or "not enough memory" in text
    return False


def _malloc_trim() -> None:
    """Hand freed heap memory back to the OS (glibc ``malloc_trim(0)``), so RSS reflects what is in use.

    Without it glibc keeps freed arenas mapped and a smaller batch run after a
    larger one would be charged the larger one's RSS. A no-op where glibc is
    not the C library.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError) as exc:  # musl, or no libc.so.6
        logger.debug("malloc_trim not available: %r", exc)


def release_memory(acc: "Accelerator | None") -> None:
    """Free what can be freed (after each size, and after an OOM): collect garbage, empty the device cache.

    On a CPU, also :func:`_malloc_trim`.
    """
    gc.collect()
    if acc is None or acc.is_cpu:
        _malloc_trim()
    if acc is not None and not acc.is_cpu:
        import torch

        mem = getattr(torch.accelerator, "memory", None)
        (mem.empty_cache if mem is not None else torch.get_device_module(acc.kind).empty_cache)()


# --------------------------------------------------------------------------
# the per-step trace


def trace_memory(step: Callable[[], Any], acc: "Accelerator", steps: int, *,
                 sample_interval_s: float = 0.005) -> "pd.DataFrame":
    """Run ``step`` ``steps`` times and record memory after each.

    On a device with a caching allocator: before each step the peak counter
    is reset (:meth:`Accelerator.reset_peak_memory_stats`); after it (device
    synchronized) allocated, reserved and the step's peak are read. On a CPU:
    the process's RSS and USS after the step and the largest RSS seen during
    it by :class:`RssPeakSampler` (a lower bound).

    Parameters
    ----------
    step : callable
        One training step, no arguments; its result is dropped after the step.
    acc : helpers.device.Accelerator
    steps : int
        Steps to run (>= 1).
    sample_interval_s : float, default 0.005
        RSS sampling interval on a CPU, seconds.

    Returns
    -------
    pandas.DataFrame
        One row per step: ``step`` (1-based), ``source`` ("device" or
        "process"), ``allocated_mib``, ``reserved_mib``, ``peak_mib`` (the
        step's peak: allocated on a device, sampled RSS on a CPU),
        ``fragmentation`` (1 - allocated/reserved; NaN on a CPU or when
        nothing is reserved), ``rss_mib``, ``uss_mib`` (NaN on a device).
        MiB = 2**20 bytes.

    Raises
    ------
    ParameterError
        If ``steps`` < 1 or ``step`` is not callable.
    """
    import pandas as pd

    if not callable(step):
        raise ParameterError(f"step must be callable, got {type(step).__name__}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ParameterError(f"steps must be an int >= 1, got {steps!r}")
    nan = float("nan")
    rows = []
    for i in range(1, steps + 1):
        if acc.is_cpu:
            with RssPeakSampler(sample_interval_s) as sampler:
                out = step()
                del out
            snap = acc.memory_stats()
            rows.append({"step": i, "source": "process", "allocated_mib": nan, "reserved_mib": nan,
                         "peak_mib": sampler.peak_bytes / MIB, "fragmentation": nan,
                         "rss_mib": snap["rss_bytes"] / MIB, "uss_mib": snap["uss_bytes"] / MIB})
        else:
            acc.synchronize()
            acc.reset_peak_memory_stats()
            out = step()
            acc.synchronize()
            del out
            snap = acc.memory_stats()
            frag = snap["fragmentation"]
            rows.append({"step": i, "source": "device", "allocated_mib": snap["allocated_bytes"] / MIB,
                         "reserved_mib": snap["reserved_bytes"] / MIB,
                         "peak_mib": snap["peak_allocated_bytes"] / MIB,
                         "fragmentation": nan if frag is None else float(frag),
                         "rss_mib": nan, "uss_mib": nan})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------
# allocator settings


def alloc_conf_var(kind: str) -> str | None:
    """The allocator-settings variable of device ``kind``, or None where there is none (cpu).

    Parameters
    ----------
    kind : str
        "cpu", "cuda" or "npu".

    Returns
    -------
    str or None
        ``PYTORCH_CUDA_ALLOC_CONF`` for cuda, ``PYTORCH_NPU_ALLOC_CONF`` for
        npu (:data:`ALLOC_CONF_VAR`), None for cpu.
    """
    return ALLOC_CONF_VAR.get(kind)


def check_alloc_conf(value: str, kind: str) -> list:
    """Validate one allocator setting for device ``kind`` with the environment catalog.

    Parameters
    ----------
    value : str
        e.g. ``"expandable_segments:True"``; ``""`` means the defaults.
    kind : str
        "cuda" or "npu" (for "cpu" the value is still checked, against the
        CUDA variable's rules, so a typo is caught on every machine).

    Returns
    -------
    list of helpers.diagnose.envcatalog.Finding
        Warnings and "ok" findings (empty for ``""``).

    Raises
    ------
    ParameterError
        If ``value`` is not a str, or the catalog finds an error (unknown key,
        bad value, forbidden combination); the message has the catalog's
        message and fix.
    """

    if not isinstance(value, str):
        raise ParameterError(f"an allocator setting must be a string like 'expandable_segments:True', "
                             f"got {type(value).__name__} {value!r}")
    if not value.strip():
        return []
    var = alloc_conf_var(kind) or ALLOC_CONF_VAR["cuda"]
    findings = validate_value(var, value, npu=(kind == "npu"))
    errors = [f for f in findings if f.severity == "error"]
    if errors:
        detail = "; ".join(f"{f.message} (fix: {f.fix})" if f.fix else f.message for f in errors)
        raise ParameterError(f"allocator setting {value!r} is invalid for {var}: {detail}")
    return findings


def check_alloc_conf_list(values: Any, kind: str) -> list[str]:
    """Validate every setting of ``values`` before any work (see :func:`check_alloc_conf`).

    Returns
    -------
    list of str
        The settings, whitespace-stripped, duplicates removed, order kept.

    Raises
    ------
    ParameterError
        If ``values`` is not a list of str or any setting is invalid.
    """
    if not isinstance(values, (list, tuple)):
        raise ParameterError(f"alloc_conf_list must be a list of strings, got {type(values).__name__}")
    out: list[str] = []
    for v in values:
        check_alloc_conf(v, kind)
        v = "".join(v.split())
        if v not in out:
            out.append(v)
    return out


def measure_empty_cache(step: Callable[[], Any], acc: "Accelerator", *, repeats: int = 3,
                        steady_steps: int = 2) -> "pd.DataFrame | None":
    """What ``empty_cache()`` frees and what it costs, on a device with a caching allocator.

    For each repeat: ``steady_steps`` steps (the cache is warm; the last one
    is timed as the steady step), memory read, ``empty_cache()`` timed, memory
    read, then the next step timed (it must reserve memory again). Timing with
    :class:`helpers.timing.PhaseTimer` (device synchronized around each phase).

    Parameters
    ----------
    step : callable
        One training step.
    acc : helpers.device.Accelerator
    repeats : int, default 3
        Rounds (>= 1).
    steady_steps : int, default 2
        Steps before each ``empty_cache`` (>= 1).

    Returns
    -------
    pandas.DataFrame or None
        None on a CPU (there is no device cache to empty). Otherwise one row
        per repeat: ``allocated_before_mib``, ``allocated_after_mib``,
        ``reserved_before_mib``, ``reserved_after_mib``, ``empty_cache_ms``,
        ``steady_step_ms``, ``next_step_ms``.
    """
    import pandas as pd
    import torch

    if acc.is_cpu:
        return None
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ParameterError(f"repeats must be an int >= 1, got {repeats!r}")
    if isinstance(steady_steps, bool) or not isinstance(steady_steps, int) or steady_steps < 1:
        raise ParameterError(f"steady_steps must be an int >= 1, got {steady_steps!r}")
    mem = getattr(torch.accelerator, "memory", None)
    empty = mem.empty_cache if mem is not None else torch.get_device_module(acc.kind).empty_cache
    timer = PhaseTimer(sync=acc.synchronize)
    rows = []
    for _ in range(repeats):
        for _ in range(steady_steps - 1):
            step()
        with timer.phase("steady_step"):
            step()
        before = acc.memory_stats()
        with timer.phase("empty_cache"):
            empty()
        after = acc.memory_stats()
        with timer.phase("next_step"):
            step()
        timer.end_step()
        rows.append({"allocated_before_mib": before["allocated_bytes"] / MIB,
                     "allocated_after_mib": after["allocated_bytes"] / MIB,
                     "reserved_before_mib": before["reserved_bytes"] / MIB,
                     "reserved_after_mib": after["reserved_bytes"] / MIB})
    times = timer.frame().pivot_table(index="step", columns="phase", values="duration_s", aggfunc="sum")
    out = pd.DataFrame(rows)
    for phase in ("empty_cache", "steady_step", "next_step"):
        out[f"{phase}_ms"] = times[phase].to_numpy() * 1e3
    return out


# --------------------------------------------------------------------------
# the child process
