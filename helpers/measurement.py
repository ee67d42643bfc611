"""One variant timed honestly: warm-up excluded, each call closed by a device synchronize or timed with device
events, repeated, and summarized as a median with its spread (:class:`Measurement`, :func:`measure`,
:func:`measure_events`, :func:`timed_call`).

Why naive timing lies, and the conventions (seconds, ``sync`` as a plain callable, no torch import), are in
:mod:`helpers.timing`, which re-exports every public name here; interleaved A/B comparisons are
:mod:`helpers.comparison`, per-step phase timing :mod:`helpers.phase_timer`.
"""

from __future__ import annotations

import logging
import math
import numbers
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from helpers.errors import ParameterError

__all__ = ["Measurement", "measure", "measure_events", "timed_call"]

logger = logging.getLogger(__name__)

#: Fewer repeats than this give a median but no meaningful spread; a warning is logged.
RECOMMENDED_MIN_REPEATS = 3


# --------------------------------------------------------------------------- validation


def _check_int(name: str, value: Any, minimum: int) -> int:
    """Return ``value`` as an int >= ``minimum`` or raise ParameterError (bools are rejected)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ParameterError(
            f"{name}: expected an int >= {minimum}, got {value!r} ({type(value).__name__}); "
            f"pass a whole number"
        )
    if value < minimum:
        raise ParameterError(
            f"{name}: expected an int >= {minimum}, got {value!r} ({type(value).__name__}); "
            f"pass a larger value"
        )
    return int(value)


def _check_items(value: Any, name: str = "items_per_call") -> float | None:
    """Return ``value`` as a positive finite float, or None; raise ParameterError otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ParameterError(
            f"{name}: expected a positive number or None, got {value!r} ({type(value).__name__})"
        )
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise ParameterError(
            f"{name}: expected a positive finite number or None, got {value!r} (float); "
            f"give the number of items (samples, bytes, tokens) one call processes"
        )
    return value


def _check_callable(name: str, value: Any, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not callable(value):
        raise ParameterError(
            f"{name}: expected a callable, got {value!r} ({type(value).__name__})"
        )


# --------------------------------------------------------------------------- Measurement


@dataclass(frozen=True)
class Measurement:
    """The timings of repeated calls of one function, warm-up excluded.

    Parameters
    ----------
    name : str
        What was timed (a label for tables and records; may be empty).
    times_s : tuple of float
        Wall time of each timed repeat, in seconds, in the order measured.
        Warm-up calls are not included. Must be non-empty, finite and >= 0.
    warmup : int
        How many untimed warm-up calls preceded the repeats (>= 0).
    items_per_call : float or None
        Items (samples, images, bytes, tokens) processed by one call, used
        for :attr:`rate`; None when a rate makes no sense.

    Notes
    -----
    Quartiles use linear interpolation between order statistics (numpy's
    default ``percentile`` method). ``stdev_s`` is the sample standard
    deviation (ddof=1), 0.0 for a single repeat.

    Raises
    ------
    ParameterError
        If ``times_s`` is empty or holds a negative or non-finite value, or
        ``warmup`` or ``items_per_call`` is invalid.
    """

    name: str
    times_s: tuple[float, ...]
    warmup: int
    items_per_call: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise ParameterError(
                f"Measurement.name: expected a str, got {self.name!r} ({type(self.name).__name__})"
            )
        try:
            times = tuple(float(t) for t in self.times_s)
        except (TypeError, ValueError) as exc:
            raise ParameterError(
                f"Measurement.times_s: expected a sequence of seconds, got {self.times_s!r}: {exc}"
            ) from None
        if not times:
            raise ParameterError(
                "Measurement.times_s: expected at least one timing, got an empty sequence; "
                "run at least one repeat"
            )
        bad = [t for t in times if not math.isfinite(t) or t < 0]
        if bad:
            raise ParameterError(
                f"Measurement.times_s: every time must be finite and >= 0 s, got {bad[:3]!r}; "
                f"check the clock and the timed function"
            )
        object.__setattr__(self, "times_s", times)
        object.__setattr__(self, "warmup", _check_int("Measurement.warmup", self.warmup, 0))
        object.__setattr__(
            self, "items_per_call", _check_items(self.items_per_call, "Measurement.items_per_call")
        )

    # -- basic statistics (seconds) ---------------------------------------------------

    @property
    def repeats(self) -> int:
        """Number of timed repeats."""
        return len(self.times_s)

    def _pct(self, q: float) -> float:
        return float(np.percentile(np.asarray(self.times_s, dtype=np.float64), q))

    @property
    def median_s(self) -> float:
        """Median time per call, seconds."""
        return self._pct(50.0)

    @property
    def p25_s(self) -> float:
        """25th percentile of the time per call, seconds."""
        return self._pct(25.0)

    @property
    def p75_s(self) -> float:
        """75th percentile of the time per call, seconds."""
        return self._pct(75.0)

    @property
    def iqr_s(self) -> float:
        """Interquartile range (p75 - p25) of the time per call, seconds."""
        return self.p75_s - self.p25_s

    @property
    def mean_s(self) -> float:
        """Arithmetic mean time per call, seconds (sensitive to outliers; prefer the median)."""
        return float(np.mean(self.times_s))

    @property
    def stdev_s(self) -> float:
        """Sample standard deviation (ddof=1) of the time per call, seconds; 0.0 for one repeat."""
        if self.repeats < 2:
            return 0.0
        return float(np.std(self.times_s, ddof=1))

    @property
    def min_s(self) -> float:
        """Fastest repeat, seconds."""
        return min(self.times_s)

    @property
    def max_s(self) -> float:
        """Slowest repeat, seconds."""
        return max(self.times_s)

    # -- rates (items / s) ------------------------------------------------------------

    def _rate_at(self, seconds: float) -> float | None:
        if self.items_per_call is None or seconds <= 0:
            return None
        return self.items_per_call / seconds

    @property
    def rate(self) -> float | None:
        """Throughput at the median time, items per second.

        None when ``items_per_call`` is None or the median time is 0 (the
        clock is too coarse for the work: time more work per call).
        """
        return self._rate_at(self.median_s)

    @property
    def rate_p25(self) -> float | None:
        """25th percentile of the throughput, items/s (= items_per_call / p75_s)."""
        return self._rate_at(self.p75_s)

    @property
    def rate_p75(self) -> float | None:
        """75th percentile of the throughput, items/s (= items_per_call / p25_s)."""
        return self._rate_at(self.p25_s)

    # -- summaries -----------------------------------------------------------------

    def spread(self) -> dict[str, float]:
        """Return the spread of the time per call.

        Returns
        -------
        dict
            ``{"p25", "p75", "min", "max", "stdev"}``, all in seconds.
        """
        return {
            "p25": self.p25_s,
            "p75": self.p75_s,
            "min": self.min_s,
            "max": self.max_s,
            "stdev": self.stdev_s,
        }

    def summary(self) -> dict[str, Any]:
        """Return every statistic as a flat dict (seconds and items/s), for tables and logs."""
        return {
            "name": self.name,
            "repeats": self.repeats,
            "warmup": self.warmup,
            "median_s": self.median_s,
            "p25_s": self.p25_s,
            "p75_s": self.p75_s,
            "iqr_s": self.iqr_s,
            "mean_s": self.mean_s,
            "stdev_s": self.stdev_s,
            "min_s": self.min_s,
            "max_s": self.max_s,
            "items_per_call": self.items_per_call,
            "rate": self.rate,
            "rate_p25": self.rate_p25,
            "rate_p75": self.rate_p75,
        }

    def __str__(self) -> str:
        label = self.name or "measurement"
        text = (
            f"{label}: median {self.median_s * 1e3:.3g} ms "
            f"(IQR {self.p25_s * 1e3:.3g}-{self.p75_s * 1e3:.3g} ms, n={self.repeats})"
        )
        if self.rate is not None:
            text += f", {self.rate:.4g} items/s"
        return text


# --------------------------------------------------------------------------- measure


def timed_call(fn: Callable[[], Any], sync: Callable[[], None] | None = None,
               clock: Callable[[], float] = time.perf_counter) -> float:
    """Time one call of ``fn`` between two device synchronizations.

    For interleaving several variants step by step (each call timed on its
    own, statistics taken by the caller); :func:`measure` is the usual entry.

    Parameters
    ----------
    fn : callable
        The work, called once with no arguments.
    sync : callable or None
        Device synchronize, called before the first and after the call.
    clock : callable
        Seconds clock (default ``time.perf_counter``).

    Returns
    -------
    float
        ``t1 - t0`` in seconds.
    """
    if sync is not None:
        sync()
    t0 = clock()
    fn()
    if sync is not None:
        sync()
    t1 = clock()
    return t1 - t0


def _check_repeats_warmup(repeats: Any, warmup: Any) -> tuple[int, int]:
    repeats = _check_int("repeats", repeats, 1)
    warmup = _check_int("warmup", warmup, 0)
    if repeats < RECOMMENDED_MIN_REPEATS:
        logger.warning(
            "repeats=%d gives a median without a meaningful spread; use repeats >= %d",
            repeats,
            RECOMMENDED_MIN_REPEATS,
        )
    return repeats, warmup


def _warn_zero_times(name: str, times: Sequence[float]) -> None:
    if any(t <= 0 for t in times):
        logger.warning(
            "%s: %d of %d repeats took 0 s or less by the clock; the clock is too coarse "
            "for this work - time more work per call",
            name or "measurement",
            sum(1 for t in times if t <= 0),
            len(times),
        )


def measure(
    fn: Callable[[], Any],
    *,
    repeats: int = 10,
    warmup: int = 2,
    sync: Callable[[], None] | None = None,
    name: str = "",
    items_per_call: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Measurement:
    """Time repeated calls of ``fn`` honestly.

    Runs ``warmup`` untimed calls, then for each repeat: ``sync()``, read the
    clock, ``fn()``, ``sync()``, read the clock. The sync before the start
    drains work queued earlier (warm-up included) so it is not charged to this
    call; the sync before the stop waits for the work ``fn`` queued.

    Parameters
    ----------
    fn : callable
        The work to time, called with no arguments; its result is discarded.
    repeats : int, default 10
        Timed calls (>= 1; fewer than 3 logs a warning: no meaningful spread).
    warmup : int, default 2
        Untimed calls before the first timed one (>= 0).
    sync : callable or None
        Blocks until the device has finished all queued work (for example
        ``torch.cuda.synchronize`` or ``torch.accelerator.synchronize``).
        None on a CPU, where work is done when the call returns.
    name : str
        Label stored in the Measurement.
    items_per_call : float or None
        Items one call processes, for :attr:`Measurement.rate` (items/s).
    clock : callable, default time.perf_counter
        Returns the time in seconds; replaceable for tests.

    Returns
    -------
    Measurement
        The per-repeat times in seconds.

    Raises
    ------
    ParameterError
        If ``repeats`` < 1, ``warmup`` < 0, either is not an int, ``fn`` or
        ``sync`` is not callable, or ``items_per_call`` is not positive.
    """
    _check_callable("fn", fn)
    _check_callable("sync", sync, optional=True)
    repeats, warmup = _check_repeats_warmup(repeats, warmup)
    items = _check_items(items_per_call)

    for _ in range(warmup):
        fn()
    times = [timed_call(fn, sync, clock) for _ in range(repeats)]
    _warn_zero_times(name, times)
    return Measurement(name=name, times_s=tuple(times), warmup=warmup, items_per_call=items)


def measure_events(
    fn: Callable[[], Any],
    *,
    new_event: Callable[[], Any],
    sync: Callable[[], None],
    repeats: int = 10,
    warmup: int = 2,
    name: str = "",
    items_per_call: float | None = None,
) -> Measurement:
    """Time repeated calls of ``fn`` with device events instead of host syncs.

    For each repeat a start and an end event are recorded on the current
    stream around the call (``start.record(); fn(); end.record()``); after
    all repeats, one ``sync()`` waits for the device and each time is read as
    ``start.elapsed_time(end)`` (milliseconds, converted to seconds). The host
    never waits between repeats, so the device queue stays full, as in a real
    training loop; the time is the device-side time between the two events
    (including any idle gap while the device waited for the host to launch).

    With torch (``torch.Event`` is device-generic since PyTorch 2.4 and works
    for cuda and npu; see the fact-check, section 2)::

        measure_events(step, new_event=lambda: torch.Event(enable_timing=True),
                       sync=torch.accelerator.synchronize)
        # or, with helpers.device: new_event=lambda: acc.new_event(enable_timing=True),
        #                          sync=acc.synchronize

    A CPU has no device events: use :func:`measure` there.

    Parameters
    ----------
    fn : callable
        The work to time, called with no arguments.
    new_event : callable
        Returns a new timing event with ``record()`` and
        ``elapsed_time(other) -> float`` (milliseconds), such as
        ``torch.Event(enable_timing=True)``.
    sync : callable
        Blocks until the device has finished all queued work; required, since
        events can only be read once they have completed.
    repeats, warmup, name, items_per_call
        As in :func:`measure`.

    Returns
    -------
    Measurement
        The per-repeat device times in seconds.

    Raises
    ------
    ParameterError
        For invalid arguments as in :func:`measure`, when ``new_event``
        returns something that is not an event (e.g. None on a CPU), or when
        an event reports a negative or non-finite elapsed time.
    """
    _check_callable("fn", fn)
    _check_callable("new_event", new_event)
    _check_callable("sync", sync)
    repeats, warmup = _check_repeats_warmup(repeats, warmup)
    items = _check_items(items_per_call)

    for _ in range(warmup):
        fn()
    pairs = []
    for _ in range(repeats):
        start, end = new_event(), new_event()
        for ev in (start, end):
            if not (callable(getattr(ev, "record", None)) and callable(getattr(ev, "elapsed_time", None))):
                raise ParameterError(
                    f"new_event returned {ev!r}, not a timing event with record() and "
                    f"elapsed_time(); this device has no events (a CPU?) - use measure() instead"
                )
        start.record()
        fn()
        end.record()
        pairs.append((start, end))
    sync()
    times = []
    for i, (start, end) in enumerate(pairs):
        ms = float(start.elapsed_time(end))
        if not math.isfinite(ms) or ms < 0:
            raise ParameterError(
                f"{name or 'measure_events'}: event pair {i} reported {ms!r} ms; events must be "
                f"created with timing enabled (enable_timing=True) and recorded on one stream"
            )
        times.append(ms / 1e3)
    _warn_zero_times(name, times)
    return Measurement(name=name, times_s=tuple(times), warmup=warmup, items_per_call=items)
