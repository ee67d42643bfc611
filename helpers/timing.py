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

Where the code lives: one variant's timing (:class:`Measurement`, :func:`measure`, :func:`measure_events`,
:func:`timed_call`) in :mod:`helpers.measurement`; the interleaved A/B comparison (:func:`compare`,
:class:`Comparison`, :func:`bootstrap_ratio_ci`, :class:`ProgressClock`) in :mod:`helpers.comparison`; per-step
phase timing (:class:`PhaseTimer`) in :mod:`helpers.phase_timer`. Every name is imported here, so
``from helpers.timing import ...`` finds them all.
"""

from __future__ import annotations

from helpers.comparison import DEFAULT_RESAMPLES, Comparison, ProgressClock, bootstrap_ratio_ci, compare
from helpers.measurement import RECOMMENDED_MIN_REPEATS, Measurement, measure, measure_events, timed_call
from helpers.phase_timer import PhaseTimer

__all__ = [
    "Measurement",
    "Comparison",
    "PhaseTimer",
    "measure",
    "timed_call",
    "measure_events",
    "compare",
    "bootstrap_ratio_ci",
    "ProgressClock",
    "RECOMMENDED_MIN_REPEATS",
    "DEFAULT_RESAMPLES",
]
