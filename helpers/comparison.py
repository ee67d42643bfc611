"""Two variants timed interleaved in one run, and their ratio with a bootstrap confidence interval
(:func:`compare`, :class:`Comparison`, :func:`bootstrap_ratio_ci`); :class:`ProgressClock` reports progress
between the timed calls.

Two variants timed one after the other see different machine states (thermal drift, background load), so an
A/B comparison interleaves them (ABBA) and reports the ratio with its interval. The conventions are in
:mod:`helpers.timing`, which re-exports every public name here; one variant's timing is :mod:`helpers.measurement`.
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from helpers.errors import ParameterError
from helpers.measurement import (
    Measurement,
    _check_callable,
    _check_int,
    _check_items,
    _check_repeats_warmup,
    _warn_zero_times,
    timed_call,
)

__all__ = ["Comparison", "ProgressClock", "bootstrap_ratio_ci", "compare"]

#: Bootstrap resamples used by :func:`compare` (2000 is the usual choice for a
#: 95% percentile interval; Efron & Tibshirani, *An Introduction to the Bootstrap*, 1993, ch. 13).
DEFAULT_RESAMPLES = 2000


def bootstrap_ratio_ci(
    a_times: Sequence[float],
    b_times: Sequence[float],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    confidence: float = 0.95,
    seed: int = 0,
    statistic: str = "median",
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``median(a) / median(b)`` (or of the means).

    Each side's values are resampled with replacement independently
    (``resamples`` times, with ``numpy.random.default_rng(seed)``), the ratio
    of the resampled medians (means) is computed each time, and the
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
    statistic : {"median", "mean"}, default "median"
        The statistic of each side. "mean" where the total time is what
        counts (a throughput, with rare long steps that are part of it).

    Returns
    -------
    (float, float)
        Lower and upper bound of the ratio (dimensionless). The upper bound is
        ``inf`` if some resample of B has a median (mean) of 0 s.

    Raises
    ------
    ParameterError
        On empty inputs, ``resamples`` < 100, ``confidence`` outside (0, 1),
        or an unknown ``statistic``.
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
    if statistic not in ("median", "mean"):
        raise ParameterError(f"statistic: expected 'median' or 'mean', got {statistic!r}")
    stat = np.median if statistic == "median" else np.mean
    rng = np.random.default_rng(seed)
    stat_a = stat(rng.choice(a, size=(resamples, a.size), replace=True), axis=1)
    stat_b = stat(rng.choice(b, size=(resamples, b.size), replace=True), axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = stat_a / stat_b
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
