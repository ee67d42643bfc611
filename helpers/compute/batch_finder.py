"""The batch-size finder: grow the batch until it runs out of memory, recover, bisect, and choose the largest that
fits a memory budget with a safety margin.

:func:`find_batch_size` times any ``make_step(batch_size) -> step`` (:class:`FinderConfig` in, :class:`FinderResult`
out) while tracking the peak (device: ``max_memory_allocated``; CPU: the sampled RSS growth), catches a real
out-of-memory or the budget exceeded (:class:`helpers.compute.memory.MemoryBudgetExceeded`) and releases the memory
before the next size; :func:`resolve_budget_bytes` picks the budget. Notebook 09's experiment, which runs it on a
job and decides, is :mod:`helpers.experiments.memory`.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import pandas as pd
import psutil
import torch

from helpers.compute.memory import GIB, MIB, MemoryBudgetExceeded, RssPeakSampler, is_oom, release_memory, rss_bytes
from helpers.device import Accelerator
from helpers.errors import ParameterError
from helpers.timing import measure

logger = logging.getLogger(__name__)

__all__ = ["FinderConfig", "FinderResult", "find_batch_size", "resolve_budget_bytes"]


@dataclass(frozen=True)
class FinderConfig:
    """Settings of :func:`find_batch_size`.

    Attributes
    ----------
    start_batch : int
        First batch size tried (>= 1; rounded up to ``multiple_of``).
    max_batch : int
        Largest batch size tried (>= start_batch).
    steps : int
        Timed steps per size (>= 1).
    budget_bytes : int
        Memory the workload may use, bytes (> 0); see :func:`resolve_budget_bytes`.
    safety_margin : float
        Fraction of the budget kept free, in [0, 0.9]: a size "fits" when its
        peak is at most ``(1 - safety_margin) * budget_bytes``.
    warmup : int
        Untimed steps per size before timing (>= 0).
    multiple_of : int
        Every size tried is a multiple of this (the PPO horizon), >= 1.
    refine_steps : int
        Bisection rounds between the last fit and the first failure (0: none).
    """

    start_batch: int
    max_batch: int
    steps: int
    budget_bytes: int
    safety_margin: float = 0.10
    warmup: int = 1
    multiple_of: int = 1
    refine_steps: int = 2

    def __post_init__(self) -> None:
        for name, lo in (("start_batch", 1), ("max_batch", 1), ("steps", 1), ("budget_bytes", 1),
                         ("warmup", 0), ("multiple_of", 1), ("refine_steps", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ParameterError(f"FinderConfig.{name} must be an int >= {lo}, got {v!r}")
        if self.max_batch < self.start_batch:
            raise ParameterError(f"FinderConfig.max_batch ({self.max_batch}) is smaller than start_batch "
                                 f"({self.start_batch}); raise max_batch or lower start_batch")
        if self.max_batch < self.multiple_of:
            raise ParameterError(f"FinderConfig.max_batch ({self.max_batch}) is below multiple_of "
                                 f"({self.multiple_of}): no batch size can be tried")
        m = self.safety_margin
        if isinstance(m, bool) or not isinstance(m, (int, float)) or not (0.0 <= m <= 0.9):
            raise ParameterError(f"FinderConfig.safety_margin must be a fraction in [0, 0.9], got {m!r}")

    @property
    def limit_bytes(self) -> int:
        """int: the most a fitting size may use, ``(1 - safety_margin) * budget_bytes``."""
        return int(self.budget_bytes * (1.0 - self.safety_margin))


@dataclass(frozen=True)
class FinderResult:
    """What :func:`find_batch_size` found.

    Attributes
    ----------
    chosen : int or None
        Largest batch size tried that ran and stayed within the margin; None
        when none did.
    frame : pandas.DataFrame
        One row per size tried, in the order tried (see :func:`find_batch_size`).
    stop_reason : str
        Why growing stopped, in words.
    budget_bytes, limit_bytes : int
        The budget and the most a fitting size may use.
    reached_max : bool
        True when every size up to ``max_batch`` fitted: growing stopped at the
        search cap, not at a memory limit, so ``chosen`` is a lower bound of
        the largest batch that fits.
    max_batch : int or None
        The search cap (``FinderConfig.max_batch``).
    """

    chosen: int | None
    frame: Any = field(repr=False)
    stop_reason: str
    budget_bytes: int
    limit_bytes: int
    reached_max: bool = False
    max_batch: int | None = None

    def largest_fit_text(self) -> str:
        """The largest fitting batch in words: ``"80"``, ``">= 256 (no limit found up to finder_max_batch=256)"``
        or ``"none"``.

        Returns
        -------
        str
        """
        if self.chosen is None:
            return "none"
        if self.reached_max:
            return f">= {self.chosen} (no limit found up to finder_max_batch={self.max_batch})"
        return str(self.chosen)


def resolve_budget_bytes(budget_mib: int, acc: "Accelerator") -> tuple[int, str]:
    """The finder's memory budget in bytes, and where it came from.

    Parameters
    ----------
    budget_mib : int
        >= 0. Positive: that many MiB. 0: on a device, its free memory plus
        what this process's allocator already reserves
        (``torch.accelerator.memory.get_memory_info`` + ``memory_reserved``);
        on a CPU, half of the available RAM (``psutil.virtual_memory().available``).

    Returns
    -------
    (int, str)
        Bytes, and a sentence saying how they were chosen; for a budget set by
        parameter it also names the default this machine would get.

    Raises
    ------
    ParameterError
        If ``budget_mib`` is not an int >= 0.
    """
    if isinstance(budget_mib, bool) or not isinstance(budget_mib, int) or budget_mib < 0:
        raise ParameterError(f"memory_budget_mib must be an int >= 0 (MiB; 0 picks one), got {budget_mib!r}")
    if budget_mib > 0:
        why = ("set by parameter: a demonstration budget (the quick profile uses a small one to show the back-off), "
               "not this machine's free memory")
        try:
            default, _ = _default_budget(acc)
            why += f"; the default here would be {default / GIB:.1f} GiB"
        except Exception as exc:  # noqa: BLE001 - the default is only a hint in the message
            logger.debug("default memory budget unavailable: %s", exc)
        return budget_mib * MIB, why
    return _default_budget(acc)


def _default_budget(acc: "Accelerator") -> tuple[int, str]:
    """The budget ``memory_budget_mib=0`` picks: see :func:`resolve_budget_bytes`."""
    if acc.is_cpu:
        avail = int(psutil.virtual_memory().available)
        return avail // 2, f"half of the available RAM ({avail / MIB:,.0f} MiB available, psutil)"
    mem = getattr(torch.accelerator, "memory", None) or torch.get_device_module(acc.kind)
    info = getattr(mem, "get_memory_info", None) or getattr(mem, "mem_get_info")
    free, total = (int(x) for x in info(acc.index))
    reserved = int(mem.memory_reserved(acc.index))
    return free + reserved, (f"the device's free memory plus this process's reserved memory "
                             f"({(free + reserved) / MIB:,.0f} of {total / MIB:,.0f} MiB)")


def _round_up(n: int, m: int) -> int:
    return int(math.ceil(n / m) * m)


def find_batch_size(make_step: Callable[[int], Callable[[], Any]], acc: "Accelerator", cfg: FinderConfig, *,
                    on_result: Callable[[dict[str, Any]], None] | None = None,
                    sample_interval_s: float = 0.005) -> FinderResult:
    """Grow the batch until out of memory, recover, bisect, and choose the largest that fits.

    Sizes ``start_batch``, x2, x2, ... up to ``max_batch`` (each rounded to
    ``multiple_of``; the last one capped at ``max_batch``). For each size:
    ``make_step(size)`` builds the workload, ``warmup`` untimed steps, then
    ``steps`` steps timed with :func:`helpers.timing.measure` (device
    synchronized) while the peak is tracked:

    - device: ``max_memory_allocated`` after :meth:`Accelerator.reset_peak_memory_stats`
      (the whole process's allocations, model included);
    - CPU: the largest RSS seen by :class:`RssPeakSampler` minus the RSS when
      the finder started (what the workload added; a lower bound).

    A size whose peak exceeds the budget raises :class:`MemoryBudgetExceeded`
    inside the finder; that, a real out-of-memory (:func:`is_oom`), is caught:
    references are dropped, garbage collected, the device cache emptied, the
    row recorded as ``"oom"`` or ``"over budget"``, and growing stops. Any
    other exception propagates. On a CPU a size whose peak, extrapolated
    linearly from the previous size, would exceed the RAM available now is not
    run (``"skipped"``), so the operating system's OOM killer never ends the
    kernel. Then up to ``refine_steps`` bisection rounds between the largest
    fitting size and the smallest failing one.

    Parameters
    ----------
    make_step : callable
        ``make_step(batch_size) -> step``; ``step()`` runs one training step.
    acc : helpers.device.Accelerator
    cfg : FinderConfig
    on_result : callable, optional
        Called with each row (a dict) as soon as the size is done, so the
        caller can record it before the next size runs.
    sample_interval_s : float, default 0.005
        RSS sampling interval on a CPU, seconds.

    Returns
    -------
    FinderResult
        ``frame`` columns: ``batch``, ``phase`` ("grow" or "refine"),
        ``status`` ("fits", "over margin", "over budget", "oom", "skipped"),
        ``peak_mib``, ``step_ms`` (median), ``throughput`` (samples/s at the
        median step), ``throughput_p25``, ``throughput_p75`` (samples/s at the
        75th and 25th percentile step times), ``error`` ("" when none).

    Raises
    ------
    ParameterError
        If ``cfg`` is not a FinderConfig or ``make_step`` is not callable.
    """
    if not isinstance(cfg, FinderConfig):
        raise ParameterError(f"cfg must be a FinderConfig, got {type(cfg).__name__}")
    if not callable(make_step):
        raise ParameterError(f"make_step must be callable, got {type(make_step).__name__}")
    release_memory(acc)
    base_rss = rss_bytes() if acc.is_cpu else 0
    rows: list[dict[str, Any]] = []
    tried: set[int] = set()

    def attempt(batch: int, phase: str) -> dict[str, Any]:
        tried.add(batch)
        row = _skipped_row(batch, phase, rows) if acc.is_cpu else None
        row = row or _attempt(make_step, acc, cfg, batch, phase, base_rss=base_rss,
                              sample_interval_s=sample_interval_s)
        rows.append(row)
        if on_result is not None:
            on_result(dict(row))
        return row

    stop_reason, reached_max = _grow(attempt, cfg, tried)
    _refine(attempt, cfg, rows, tried)
    fits = [r["batch"] for r in rows if r["status"] == "fits"]
    frame = pd.DataFrame(rows, columns=list(_empty_row(0, "")))
    return FinderResult(chosen=max(fits) if fits else None, frame=frame, stop_reason=stop_reason,
                        budget_bytes=cfg.budget_bytes, limit_bytes=cfg.limit_bytes,
                        reached_max=reached_max and bool(fits), max_batch=cfg.max_batch)


def _empty_row(batch: int, phase: str) -> dict[str, Any]:
    """A finder row before its size is measured (the frame's columns, in order)."""
    nan = float("nan")
    return {"batch": batch, "phase": phase, "status": "", "peak_mib": nan, "step_ms": nan,
            "throughput": nan, "throughput_p25": nan, "throughput_p75": nan, "error": ""}


def _skipped_row(batch: int, phase: str, rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """On a CPU: the row of a size not run because its peak, linear in the batch from the largest smaller size
    that ran, would pass 80% of the RAM available now (the OS's OOM killer would end the kernel); else None."""
    prev = [r for r in rows if r["status"] in ("fits", "over margin") and r["batch"] < batch]
    if not prev:
        return None
    p = max(prev, key=lambda r: r["batch"])
    predicted = p["peak_mib"] * MIB * batch / p["batch"]
    avail = int(psutil.virtual_memory().available)
    if predicted <= 0.8 * avail:
        return None
    row = _empty_row(batch, phase)
    row["status"] = "skipped"
    row["error"] = (f"predicted peak {predicted / MIB:.0f} MiB (linear in batch size) exceeds 80% "
                    f"of the available RAM ({avail / MIB:.0f} MiB): not run, to protect the kernel")
    return row


def _attempt(make_step: Callable[[int], Callable[[], Any]], acc: "Accelerator", cfg: FinderConfig, batch: int,
             phase: str, *, base_rss: int, sample_interval_s: float) -> dict[str, Any]:
    """One size of the finder: build, warm up, time ``cfg.steps`` steps while tracking the peak; an OOM (or the
    budget exceeded) is caught, recorded and the memory released (see :func:`find_batch_size`)."""
    nan = float("nan")
    row = _empty_row(batch, phase)
    step = None
    try:
        step = make_step(batch)
        for _ in range(cfg.warmup):
            step()
        if acc.is_cpu:
            with RssPeakSampler(sample_interval_s) as sampler:
                m = measure(step, repeats=cfg.steps, warmup=0, sync=None, name=f"batch {batch}", items_per_call=batch)
            used = max(0, sampler.peak_bytes - base_rss)
        else:
            acc.synchronize()
            acc.reset_peak_memory_stats()
            m = measure(step, repeats=cfg.steps, warmup=0, sync=acc.synchronize, name=f"batch {batch}",
                        items_per_call=batch)
            used = int(acc.memory_stats()["peak_allocated_bytes"])
        row.update(peak_mib=used / MIB, step_ms=m.median_s * 1e3,
                   throughput=m.rate if m.rate is not None else nan,
                   throughput_p25=m.rate_p25 if m.rate_p25 is not None else nan,
                   throughput_p75=m.rate_p75 if m.rate_p75 is not None else nan)
        if used > cfg.budget_bytes:
            raise MemoryBudgetExceeded(batch, used, cfg.budget_bytes, what="RSS growth" if acc.is_cpu else "peak")
        row["status"] = "fits" if used <= cfg.limit_bytes else "over margin"
    except Exception as exc:  # noqa: BLE001 - only OOMs are handled, the rest re-raised
        if not is_oom(exc):
            raise
        row["status"] = "over budget" if isinstance(exc, MemoryBudgetExceeded) else "oom"
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
        logger.info("batch %d: %s", batch, row["error"])
    finally:
        step = None  # drop the model, optimizer state and batches before the next size
        release_memory(acc)
    return row


#: Why growing stopped, by the status of the size that stopped it.
_STOPPED = {"oom": "out of memory at batch {}", "over budget": "batch {} exceeded the memory budget",
            "over margin": "batch {} left less than the safety margin free",
            "skipped": "batch {} was predicted not to fit in the available RAM"}


def _grow(attempt: Callable[[int, str], dict[str, Any]], cfg: FinderConfig, tried: set[int]) -> tuple[str, bool]:
    """Double from ``start_batch`` (multiples of ``multiple_of``, the last capped at ``max_batch``) until a size
    does not fit; returns why growing stopped and whether every size up to ``max_batch`` fitted."""
    m = cfg.multiple_of
    size = _round_up(cfg.start_batch, m)
    while size <= cfg.max_batch and size not in tried:
        row = attempt(size, "grow")
        if row["status"] != "fits":
            return _STOPPED[row["status"]].format(size), False
        nxt = size * 2
        if nxt > cfg.max_batch and size < cfg.max_batch:
            nxt = (cfg.max_batch // m) * m
        size = nxt
    return f"reached finder_max_batch={cfg.max_batch} with every size fitting: no memory limit found", True


def _refine(attempt: Callable[[int, str], dict[str, Any]], cfg: FinderConfig, rows: list[dict[str, Any]],
            tried: set[int]) -> None:
    """Up to ``refine_steps`` bisection rounds between the largest fitting size and the smallest failing one."""
    m = cfg.multiple_of
    for _ in range(cfg.refine_steps):
        fits = [r["batch"] for r in rows if r["status"] == "fits"]
        above = [r["batch"] for r in rows if r["status"] != "fits" and fits and r["batch"] > max(fits)]
        if not above:
            break
        lo, hi = max(fits), min(above)
        mid = ((lo + hi) // 2 // m) * m
        if mid <= lo or mid >= hi or mid in tried:
            break
        attempt(mid, "refine")
