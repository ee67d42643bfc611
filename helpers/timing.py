"""Honest timing: warm-up, device sync or events, repeats, spread, interleaved A/B.

Why naive timing lies. Accelerators (CUDA, Ascend NPU) run asynchronously: a
Python call returns as soon as its work is *queued*, so ``t1 - t0`` around a
call without a device synchronization measures the launch, not the work, and
gives impossibly fast numbers (pytorch#80129). The first calls are slower than
the rest (kernel selection and compilation, allocator growth, cold caches,
lazy initialization), so counting them inflates the result. A single timing
is one draw from a noisy distribution (other processes, clock boosts, the
garbage collector), so it must be repeated and reported as a median with its
spread; and two variants timed one after the other see different machine
states (thermal drift, background load), so an A/B comparison interleaves
them in one run and reports the ratio with a confidence interval.

Every function here takes the device synchronization as a plain callable
(``sync``), so this module never imports torch; ``helpers.device`` supplies
the right one for npu, cuda or cpu (on a CPU, ``None``: the work is already
done when the call returns).

Units: all times are seconds (``float``) unless a name ends in ``_ms``; rates
are items per second.
"""

from __future__ import annotations

import contextlib
import logging
import math
import numbers
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from helpers.errors import ParameterError

if TYPE_CHECKING:  # pragma: no cover - only for type checkers
    import pandas as pd

__all__ = [
    "Measurement",
    "Comparison",
    "PhaseTimer",
    "measure",
    "timed_call",
    "measure_events",
    "compare",
    "bootstrap_ratio_ci",
]

logger = logging.getLogger(__name__)

#: Fewer repeats than this give a median but no meaningful spread; a warning is logged.
RECOMMENDED_MIN_REPEATS = 3
#: Bootstrap resamples used by :func:`compare` (2000 is the usual choice for a
#: 95% percentile interval; Efron & Tibshirani, *An Introduction to the Bootstrap*, 1993, ch. 13).
DEFAULT_RESAMPLES = 2000


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


# --------------------------------------------------------------------------- Comparison


def bootstrap_ratio_ci(
    a_times: Sequence[float],
    b_times: Sequence[float],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``median(a) / median(b)``.

    Each side's values are resampled with replacement independently
    (``resamples`` times, with ``numpy.random.default_rng(seed)``), the ratio
    of the resampled medians is computed each time, and the
    ``(1 - confidence) / 2`` and ``(1 + confidence) / 2`` quantiles of those
    ratios are returned (Efron & Tibshirani 1993, ch. 13, percentile interval).

    Parameters
    ----------
    a_times, b_times : sequence of float
        Per-repeat times of A and B, seconds (non-empty).
    resamples : int, default 2000
        Bootstrap resamples (>= 100).
    confidence : float, default 0.95
        Coverage of the interval, strictly between 0 and 1.
    seed : int, default 0
        Seed of the numpy Generator, so the interval is reproducible.

    Returns
    -------
    (float, float)
        Lower and upper bound of the ratio (dimensionless). The upper bound is
        ``inf`` if some resample of B has a median of 0 s.

    Raises
    ------
    ParameterError
        On empty inputs, ``resamples`` < 100, or ``confidence`` outside (0, 1).
    """
    a = np.asarray(a_times, dtype=np.float64)
    b = np.asarray(b_times, dtype=np.float64)
    if a.ndim != 1 or b.ndim != 1 or a.size == 0 or b.size == 0:
        raise ParameterError(
            f"bootstrap_ratio_ci: expected two non-empty 1-D sequences of times, got sizes "
            f"{a.size} and {b.size}"
        )
    resamples = _check_int("resamples", resamples, 100)
    if isinstance(confidence, bool) or not isinstance(confidence, numbers.Real) or not 0 < confidence < 1:
        raise ParameterError(
            f"confidence: expected a number strictly between 0 and 1, got {confidence!r}; "
            f"0.95 is usual"
        )
    rng = np.random.default_rng(seed)
    med_a = np.median(rng.choice(a, size=(resamples, a.size), replace=True), axis=1)
    med_b = np.median(rng.choice(b, size=(resamples, b.size), replace=True), axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = med_a / med_b
    ratios = np.where(np.isnan(ratios), np.inf, ratios)  # 0/0: treat as unbounded
    alpha = 1.0 - float(confidence)
    low, high = np.quantile(ratios, [alpha / 2.0, 1.0 - alpha / 2.0])
    return float(low), float(high)


def _fmt(x: float) -> str:
    """Three significant digits: 2.4, 1.03, 12.3."""
    if math.isinf(x):
        return "inf"
    return f"{x:.3g}"


@dataclass(frozen=True)
class Comparison:
    """An A/B timing comparison: the speedup of B over A with a bootstrap interval.

    Parameters
    ----------
    a, b : Measurement
        The two variants, usually measured interleaved by :func:`compare`.
    ratio : float
        ``a.median_s / b.median_s`` (dimensionless). Greater than 1 means B is
        faster than A: "speedup of B over A".
    ci_low, ci_high : float
        Bounds of the ``confidence`` percentile-bootstrap interval of the ratio.
    confidence : float, default 0.95
        Coverage of the interval.

    Build one with :meth:`from_measurements` (or :func:`compare`), which
    computes the ratio and the interval.
    """

    a: Measurement
    b: Measurement
    ratio: float
    ci_low: float
    ci_high: float
    confidence: float = 0.95

    @classmethod
    def from_measurements(
        cls,
        a: Measurement,
        b: Measurement,
        *,
        confidence: float = 0.95,
        resamples: int = DEFAULT_RESAMPLES,
        seed: int = 0,
    ) -> Comparison:
        """Compare two measurements: ratio of medians and its bootstrap interval.

        Parameters
        ----------
        a, b : Measurement
            Baseline (A) and candidate (B).
        confidence, resamples, seed
            See :func:`bootstrap_ratio_ci`.

        Returns
        -------
        Comparison

        Raises
        ------
        ParameterError
            If either argument is not a Measurement, or B's median time is 0 s
            (the clock is too coarse: time more work per call).
        """
        for label, m in (("a", a), ("b", b)):
            if not isinstance(m, Measurement):
                raise ParameterError(
                    f"Comparison.{label}: expected a Measurement, got {type(m).__name__}"
                )
        if b.median_s <= 0:
            raise ParameterError(
                f"Comparison: median time of {b.name or 'B'} is {b.median_s!r} s, so no ratio "
                f"can be formed; the clock is too coarse - time more work per call"
            )
        low, high = bootstrap_ratio_ci(
            a.times_s, b.times_s, resamples=resamples, confidence=confidence, seed=seed
        )
        return cls(
            a=a, b=b, ratio=a.median_s / b.median_s, ci_low=low, ci_high=high,
            confidence=float(confidence),
        )

    def inverse(self) -> tuple[float, float, float]:
        """The ratio the other way round with its interval: ``(1 / ratio, 1 / ci_high, 1 / ci_low)`` (A's rate over
        B's), e.g. a job's throughput as a fraction of its input-free ceiling's when A is the job and B the ceiling."""
        return 1.0 / self.ratio, 1.0 / self.ci_high, 1.0 / self.ci_low

    def outcome(self, threshold: float = 1.05) -> str:
        """Classify the comparison.

        Parameters
        ----------
        threshold : float, default 1.05
            Smallest speedup (>= 1) that counts as a difference worth acting on.

        Returns
        -------
        str
            ``"b_faster"``: the interval lies above 1 and the ratio >= threshold;
            ``"a_faster"``: the interval lies below 1 and 1/ratio >= threshold;
            ``"below_threshold"``: the interval excludes 1 but the effect is
            smaller than the threshold; ``"no_difference"``: the interval spans 1.

        Raises
        ------
        ParameterError
            If ``threshold`` < 1.
        """
        if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real) or not threshold >= 1:
            raise ParameterError(
                f"threshold: expected a number >= 1 (e.g. 1.05 for 5%), got {threshold!r}"
            )
        if self.ci_low <= 1.0 <= self.ci_high:
            return "no_difference"
        if self.ci_low > 1.0:
            return "b_faster" if self.ratio >= threshold else "below_threshold"
        return "a_faster" if self.ratio > 0 and 1.0 / self.ratio >= threshold else "below_threshold"

    def verdict_text(self, threshold: float = 1.05) -> str:
        """One sentence for the reader, e.g. ``"B is 2.4x faster than A (95% CI 2.2-2.6)"``.

        Parameters
        ----------
        threshold : float, default 1.05
            See :meth:`outcome`.

        Returns
        -------
        str
        """
        a_name, b_name = self.a.name or "A", self.b.name or "B"
        pct = f"{self.confidence * 100:.0f}%"
        outcome = self.outcome(threshold)
        if outcome == "b_faster":
            return (
                f"{b_name} is {_fmt(self.ratio)}x faster than {a_name} "
                f"({pct} CI {_fmt(self.ci_low)}-{_fmt(self.ci_high)})"
            )
        if outcome == "a_faster":
            slow_lo = 1.0 / self.ci_high if self.ci_high > 0 else math.inf
            slow_hi = 1.0 / self.ci_low if self.ci_low > 0 else math.inf
            return (
                f"{b_name} is {_fmt(1.0 / self.ratio)}x slower than {a_name} "
                f"({pct} CI {_fmt(slow_lo)}-{_fmt(slow_hi)})"
            )
        if outcome == "below_threshold":
            return (
                f"{b_name} vs {a_name}: ratio {_fmt(self.ratio)} ({pct} CI "
                f"{_fmt(self.ci_low)}-{_fmt(self.ci_high)}), a difference smaller than the "
                f"{_fmt(threshold)}x threshold"
            )
        return (
            f"no measurable difference between {b_name} and {a_name} (ratio {_fmt(self.ratio)}, "
            f"{pct} CI {_fmt(self.ci_low)}-{_fmt(self.ci_high)} spans 1)"
        )

    def summary(self) -> dict[str, Any]:
        """Return the comparison as a flat dict (medians in seconds, ratio dimensionless)."""
        return {
            "a": self.a.name,
            "b": self.b.name,
            "a_median_s": self.a.median_s,
            "b_median_s": self.b.median_s,
            "a_repeats": self.a.repeats,
            "b_repeats": self.b.repeats,
            "ratio": self.ratio,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "confidence": self.confidence,
            "verdict": self.verdict_text(),
        }

    def __str__(self) -> str:
        return self.verdict_text()


def compare(
    fn_a: Callable[[], Any],
    fn_b: Callable[[], Any],
    *,
    repeats: int = 10,
    warmup: int = 2,
    sync: Callable[[], None] | None = None,
    names: tuple[str, str] = ("A", "B"),
    items_per_call: float | tuple[float | None, float | None] | None = None,
    seed: int = 0,
    clock: Callable[[], float] = time.perf_counter,
    confidence: float = 0.95,
    resamples: int = DEFAULT_RESAMPLES,
) -> Comparison:
    """Time A and B interleaved in one run and report the speedup of B over A.

    Warm-up runs ``warmup`` calls of each (A, B, A, B, ...). The timed calls
    follow the ABBA pattern A B B A A B B A ..., so that a slow drift of the
    machine (clock boost, heating, background load) affects both variants
    alike. Each call is timed as in :func:`measure` (sync, t0, call, sync, t1).

    Parameters
    ----------
    fn_a, fn_b : callable
        Baseline (A) and candidate (B), called with no arguments. Check they
        compute the same thing before timing them.
    repeats : int, default 10
        Timed calls of each variant (>= 1; fewer than 3 logs a warning).
    warmup : int, default 2
        Untimed calls of each variant first (>= 0).
    sync : callable or None
        Device synchronization, as in :func:`measure`.
    names : (str, str), default ("A", "B")
        Labels of A and B.
    items_per_call : float, (float, float) or None
        Items one call processes, for both variants or one value per variant.
    seed : int, default 0
        Seed of the bootstrap.
    clock : callable, default time.perf_counter
        Seconds; replaceable for tests.
    confidence : float, default 0.95
    resamples : int, default 2000
        See :func:`bootstrap_ratio_ci`.

    Returns
    -------
    Comparison
        ``ratio = median(A) / median(B)``; > 1 means B is faster.

    Raises
    ------
    ParameterError
        On invalid arguments (see :func:`measure`), or ``names`` not two strings.
    """
    _check_callable("fn_a", fn_a)
    _check_callable("fn_b", fn_b)
    _check_callable("sync", sync, optional=True)
    repeats, warmup = _check_repeats_warmup(repeats, warmup)
    if (
        not isinstance(names, Sequence)
        or isinstance(names, str)
        or len(names) != 2
        or not all(isinstance(n, str) for n in names)
    ):
        raise ParameterError(f"names: expected two strings such as ('A', 'B'), got {names!r}")
    if isinstance(items_per_call, (tuple, list)):
        if len(items_per_call) != 2:
            raise ParameterError(
                f"items_per_call: expected a number or a pair of numbers, got {items_per_call!r}"
            )
        items_a, items_b = (_check_items(v) for v in items_per_call)
    else:
        items_a = items_b = _check_items(items_per_call)

    for _ in range(warmup):
        fn_a()
        fn_b()
    times_a: list[float] = []
    times_b: list[float] = []
    for i in range(repeats):
        order = ((fn_a, times_a), (fn_b, times_b))
        if i % 2 == 1:
            order = order[::-1]
        for fn, times in order:
            times.append(timed_call(fn, sync, clock))
    _warn_zero_times(names[0], times_a)
    _warn_zero_times(names[1], times_b)
    a = Measurement(name=names[0], times_s=tuple(times_a), warmup=warmup, items_per_call=items_a)
    b = Measurement(name=names[1], times_s=tuple(times_b), warmup=warmup, items_per_call=items_b)
    return Comparison.from_measurements(a, b, confidence=confidence, resamples=resamples, seed=seed)


# --------------------------------------------------------------------------- PhaseTimer


@dataclass(frozen=True)
class _PhaseRow:
    step: int
    phase: str
    start: float
    duration_s: float


class PhaseTimer:
    """Per-step phase timing for a training loop (data, h2d, forward, backward, ...).

    Use::

        timer = PhaseTimer(sync=device_sync)
        for batch in loader_iter:
            with timer.phase("h2d"):
                ...
            with timer.phase("compute"):
                ...
            timer.end_step()
        timer.totals(skip_steps=2)

    Each phase is bracketed by ``sync()`` before its start and before its
    stop, so device work queued inside the phase is charged to it and not to
    the next one. Phases may not be nested (their times would be counted
    twice in a step's total).

    Parameters
    ----------
    sync : callable or None
        Device synchronization (None on a CPU).
    clock : callable, default time.perf_counter
        Returns seconds; replaceable for tests.
    """

    def __init__(
        self,
        sync: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        _check_callable("sync", sync, optional=True)
        _check_callable("clock", clock)
        self.sync = sync
        self.clock = clock
        self._rows: list[_PhaseRow] = []
        self._step = 0
        self._origin: float | None = None
        self._open: str | None = None

    def __repr__(self) -> str:
        return f"PhaseTimer(step={self._step}, rows={len(self._rows)})"

    @property
    def step(self) -> int:
        """Index of the step now being timed (0 for the first)."""
        return self._step

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the enclosed block as phase ``name`` of the current step.

        Parameters
        ----------
        name : str
            Phase label (non-empty).

        Raises
        ------
        ParameterError
            If ``name`` is empty or not a str, or another phase is open.

        Notes
        -----
        If the block raises, the phase is recorded without the closing sync
        (which could raise again and hide the first error) and the exception
        propagates.
        """
        if not isinstance(name, str) or not name:
            raise ParameterError(f"phase name: expected a non-empty str, got {name!r}")
        if self._open is not None:
            raise ParameterError(
                f"phase {name!r} opened inside phase {self._open!r}; phases cannot be nested "
                f"(a step's total would count the time twice) - close the outer one first"
            )
        if self.sync is not None:
            self.sync()
        start = self.clock()
        if self._origin is None:
            self._origin = start
        self._open = name
        ok = False
        try:
            yield
            ok = True
        finally:
            if ok and self.sync is not None:
                self.sync()
            stop = self.clock()
            self._open = None
            self._rows.append(_PhaseRow(self._step, name, start, stop - start))

    def end_step(self) -> None:
        """Close the current step; later phases belong to the next one.

        Raises
        ------
        ParameterError
            If called while a phase is open.
        """
        if self._open is not None:
            raise ParameterError(
                f"end_step() called inside phase {self._open!r}; call it after the phase's block"
            )
        self._step += 1

    def reset(self) -> None:
        """Forget all rows and start again at step 0."""
        if self._open is not None:
            raise ParameterError(f"reset() called inside phase {self._open!r}")
        self._rows.clear()
        self._step = 0
        self._origin = None

    def frame(self) -> pd.DataFrame:
        """Return one row per phase per step.

        Returns
        -------
        pandas.DataFrame
            Columns ``step`` (int), ``phase`` (str), ``start_s`` (seconds since
            the start of the timer's first phase) and ``duration_s`` (seconds).
            A phase entered twice in a step gives two rows. Rows of the
            current (not yet ended) step are included.
        """
        import pandas as pd

        origin = self._origin if self._origin is not None else 0.0
        return pd.DataFrame(
            {
                "step": pd.Series([r.step for r in self._rows], dtype="int64"),
                "phase": pd.Series([r.phase for r in self._rows], dtype=object),
                "start_s": pd.Series([r.start - origin for r in self._rows], dtype="float64"),
                "duration_s": pd.Series([r.duration_s for r in self._rows], dtype="float64"),
            }
        )

    def totals(self, skip_steps: int = 0) -> pd.DataFrame:
        """Return the time of each phase per step.

        Parameters
        ----------
        skip_steps : int, default 0
            Leave out steps numbered below this (warm-up steps).

        Returns
        -------
        pandas.DataFrame
            One row per step that has at least one phase: ``step`` (int), one
            column per phase in first-seen order (seconds; a phase entered twice
            is summed; 0.0 where absent from that step), and ``step_s`` (the sum
            of the phases, seconds). Call :meth:`end_step` first so the last
            step is complete.

        Raises
        ------
        ParameterError
            If ``skip_steps`` is not an int >= 0.
        """
        import pandas as pd

        skip_steps = _check_int("skip_steps", skip_steps, 0)
        df = self.frame()
        phases = list(dict.fromkeys(df["phase"]))
        df = df[df["step"] >= skip_steps]
        if df.empty:
            out = pd.DataFrame({"step": pd.Series([], dtype="int64")})
            for p in phases:
                out[p] = pd.Series([], dtype="float64")
            out["step_s"] = pd.Series([], dtype="float64")
            return out
        wide = df.pivot_table(
            index="step", columns="phase", values="duration_s", aggfunc="sum", fill_value=0.0
        )
        wide = wide.reindex(columns=[p for p in phases if p in wide.columns]).fillna(0.0)
        for p in phases:
            if p not in wide.columns:
                wide[p] = 0.0
        wide = wide[phases].astype("float64")
        wide["step_s"] = wide.sum(axis=1)
        wide.columns.name = None
        out = wide.reset_index()
        out["step"] = out["step"].astype("int64")
        return out


class ProgressClock:
    """A clock for :func:`helpers.timing.compare` that reports progress between the timed calls.

    ``compare`` reads its ``clock`` twice per timed call (start and stop, each after a device synchronize); after
    every second read (a call's stop time, already taken) this calls ``progress(done, total)``, so the update is
    outside every timed interval. Its :meth:`wrap` counts the untimed warm-up calls the same way (after each
    returns). ``total`` is ``2 * (warmup + repeats)``, the calls of both variants.

    Parameters
    ----------
    progress : callable
        ``progress(done, total)``.
    warmup, repeats : int
        As passed to ``compare``.
    clock : callable, default time.perf_counter
    """

    def __init__(self, progress: Callable[[int, int], None], *, warmup: int, repeats: int,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.progress, self.clock = progress, clock
        self.warmup_calls, self.total = 2 * int(warmup), 2 * (int(warmup) + int(repeats))
        self.calls = self.reads = 0

    def __call__(self) -> float:
        t = self.clock()
        self.reads += 1
        if self.reads % 2 == 0:
            self.progress(self.warmup_calls + self.reads // 2, self.total)
        return t

    def wrap(self, fn: Callable[[], Any]) -> Callable[[], Any]:
        """``fn`` that reports each warm-up call after it returns (timed calls are reported by the clock)."""
        def call():
            out = fn()
            if self.calls < self.warmup_calls:
                self.calls += 1
                self.progress(self.calls, self.total)
            return out
        return call
