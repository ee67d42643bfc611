"""Cross-checks that catch a polluted measurement before it becomes a verdict.

A comparison is only as good as the machine's speed was constant while both
sides ran. The busy-machine guard (:mod:`helpers.machine`) sees other
processes; these checks see the measurement itself contradict what the
mechanism can do, which also catches a slowdown the guard cannot see (a
throttled CPU, a noisy neighbour in another VM, a burst between snapshots):

- :func:`untouched_phases`: a phase that no compared optimization acts on
  (:func:`helpers.experiments.registry.acts_on`) must not change between the two jobs.
  Batched decode does not touch the training computation; if the compute
  phase is 11x faster in the optimized job, the machine's speed changed.
- :func:`same_job`: the same job measured in two notebooks of one run
  (notebook 01's baseline and notebook 10's) must agree.
- :func:`amdahl`: a speedup above what the phases acted on can give (if they
  took no time at all) is impossible: ``1 / (1 - f)`` where ``f`` is their
  share of the baseline step (Amdahl's law).

A failed check makes the result "inconclusive" (:func:`apply`), never a
verdict. Each check reports the figures it compared, so a reader can judge.

Thresholds
----------
:data:`MAX_PHASE_DRIFT` (1.5x). Measured on the 2-core development machine (quiet, built-in job, notebook 10's
interleaved rotation, 20 steps each): with batched decode alone, the compute phase of the optimized job was
0.995x and 1.006x the baseline's (95% CIs 0.93-1.09 and 0.83-1.23); the loaded machine of issue 11 produced 11x
(352 ms vs 32 ms). 1.5x lies well between the two. A check fails only when the whole 95% interval of the ratio
lies beyond the threshold, so a few noisy steps cannot fail it.

On a CPU the input and the computation share the cores, so an optimization that runs input work *while* the
step computes also acts on the compute phase: with ``dataloader_workers`` (2 workers on 2 cores) the compute phase
was 1.97x and 2.03x the baseline's on the same quiet machine (CIs 1.77-2.15 and 1.88-2.18), a real cost, not
noise. :data:`CPU_CONTENDING` lists those optimizations; with ``device_kind="cpu"`` their compute phase is not
checked.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from helpers.checklist import PHASES
from helpers.experiments import registry
from helpers.errors import ParameterError
from helpers.timing import Comparison, Measurement
from helpers.verdict import Verdict

__all__ = ["MAX_PHASE_DRIFT", "CPU_CONTENDING", "AMDAHL_SLACK", "MIN_PHASE_SHARE", "CrossCheck", "untouched_phases", "same_job",
           "amdahl", "apply", "failed_sentence"]

MAX_PHASE_DRIFT = 1.5
"""Largest factor (either way) by which a phase no compared optimization acts on may differ (see the module notes)."""

CPU_CONTENDING: tuple[str, ...] = ("dataloader_workers", "prefetcher")
"""Optimizations that run input work concurrently with the step: on a CPU they take cores from the computation,
so they act on its compute phase too (see the module notes for the measured slowdown)."""

AMDAHL_SLACK = 1.10
"""Allowance above the Amdahl bound: the bound is computed from phase medians, which need not add up to the
median step (the phase-breakdown figure says so); 10% absorbs that difference."""

MIN_PHASE_SHARE = 0.05
"""A phase shorter than this share of the baseline's median step (in both jobs) is not checked: the ratio of
two near-zero times is noise (e.g. the h2d phase on a CPU, where nothing is copied)."""


@dataclass(frozen=True)
class CrossCheck:
    """The outcome of one cross-check.

    Attributes
    ----------
    name : str
        ``"untouched phase"``, ``"same job"`` or ``"Amdahl bound"``.
    ok : bool
        False when the measurement contradicts what its mechanism can do.
    sentence : str
        What was compared, with the figures and the threshold.
    figures : dict
        The numbers compared (JSON-able), for the results file.
    """

    name: str
    ok: bool
    sentence: str
    figures: dict = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form: ``name``, ``ok``, ``sentence``, ``figures``."""
        return {"name": self.name, "ok": self.ok, "sentence": self.sentence, "figures": dict(self.figures)}


def _acted_on(optimizations: Iterable[str]) -> set[str]:
    acted: set[str] = set()
    acts_on = registry.acts_on()
    for name in optimizations:
        if name not in acts_on:
            raise ParameterError(f"unknown optimization {name!r}; valid: {', '.join(acts_on)}")
        acted.update(acts_on[name])
    return acted


def _check_drift(max_drift: float) -> None:
    if not (isinstance(max_drift, (int, float)) and math.isfinite(max_drift) and max_drift > 1.0):
        raise ParameterError(f"max_drift must be a finite number > 1 (a factor), got {max_drift!r}")


def untouched_phases(baseline_steps, other_steps, optimizations: Sequence[str], *,
                     max_drift: float = MAX_PHASE_DRIFT, min_share: float = MIN_PHASE_SHARE,
                     seed: int = 0, device_kind: str = "") -> list[CrossCheck]:
    """Check that the phases none of ``optimizations`` acts on did not change between two jobs.

    Parameters
    ----------
    baseline_steps, other_steps : pandas.DataFrame
        Per measured step, the phase columns ``data``, ``h2d``, ``compute``
        (seconds) and ``step_s`` (:meth:`helpers.experiments.e2e_jobs.JobVariant.steps_frame`).
    optimizations : sequence of str
        The optimizations that differ between the two jobs (names of
        :func:`helpers.experiments.registry.acts_on`).
    max_drift : float, default :data:`MAX_PHASE_DRIFT`
        The factor a phase may change by; the check fails when the whole 95%
        bootstrap interval of baseline median / other median lies above
        ``max_drift`` or below ``1 / max_drift``.
    min_share : float, default :data:`MIN_PHASE_SHARE`
        Phases below this share of the baseline's median step in both jobs are skipped.
    seed : int
        Bootstrap seed.
    device_kind : str
        "cpu", "cuda" or "npu"; on "cpu", :data:`CPU_CONTENDING` optimizations also act on the compute phase.

    Returns
    -------
    list of CrossCheck
        One per checked phase (empty when every phase is acted on or too short to check).

    Raises
    ------
    ParameterError
        Unknown optimization, a frame without the phase columns, or a bad ``max_drift``.
    """
    _check_drift(max_drift)
    acted = _acted_on(optimizations)
    if device_kind == "cpu" and set(optimizations) & set(CPU_CONTENDING):
        acted.add("compute")  # the input work now runs beside the step, on the same cores
    for label, df in (("baseline_steps", baseline_steps), ("other_steps", other_steps)):
        absent = [c for c in (*PHASES, "step_s") if c not in df]
        if absent:
            raise ParameterError(f"{label} lacks column(s) {absent}; pass JobVariant.steps_frame()")
    step_median = float(baseline_steps["step_s"].median())
    out = []
    for phase in PHASES:
        if phase in acted:
            continue
        a = Measurement(f"baseline {phase}", tuple(float(x) for x in baseline_steps[phase]), 0)
        b = Measurement(f"other {phase}", tuple(float(x) for x in other_steps[phase]), 0)
        floor = min_share * step_median
        if a.median_s < floor and b.median_s < floor or a.median_s <= 0 or b.median_s <= 0:
            continue
        c = Comparison.from_measurements(a, b, seed=seed)
        ok = not (c.ci_low > max_drift or c.ci_high < 1.0 / max_drift)
        who = ", ".join(optimizations) or "no optimization"
        sentence = (f"the {phase} phase, which {who} does not act on, went {a.median_s * 1e3:.1f} -> "
                    f"{b.median_s * 1e3:.1f} ms per step ({1 / c.ratio:.2f}x the time, 95% CI "
                    f"{1 / c.ci_high:.2f}-{1 / c.ci_low:.2f}; allowed: within {1 / max_drift:.2f}-{max_drift:.2f}x)")
        out.append(CrossCheck("untouched phase", ok, sentence,
                              {"phase": phase, "baseline_ms": a.median_s * 1e3, "other_ms": b.median_s * 1e3,
                               "time_ratio": 1 / c.ratio, "ci": [1 / c.ci_high, 1 / c.ci_low],
                               "max_drift": max_drift}))
    return out


def same_job(name: str, earlier: Mapping[str, float], now_times_s: Sequence[float], *, where: str,
             max_drift: float = MAX_PHASE_DRIFT) -> CrossCheck:
    """Check that one job's phase, measured earlier in the run, agrees with its measurement now.

    They agree when the two medians are within ``max_drift`` of each other,
    or their interquartile ranges overlap (two runs minutes apart are not
    interleaved, so only a gross change is evidence of a changed machine).

    Parameters
    ----------
    name : str
        What is compared, e.g. ``"baseline compute"``.
    earlier : mapping
        ``median_s``, ``p25_s``, ``p75_s`` of the earlier measurement (seconds).
    now_times_s : sequence of float
        The per-step times measured now (seconds).
    where : str
        Where the earlier figure comes from, e.g. ``"notebook 01"``.
    max_drift : float, default :data:`MAX_PHASE_DRIFT`

    Returns
    -------
    CrossCheck

    Raises
    ------
    ParameterError
        If ``earlier`` lacks a key or holds a non-positive median, ``now_times_s`` is empty, or ``max_drift`` is bad.
    """
    _check_drift(max_drift)
    try:
        med, lo, hi = (float(earlier[k]) for k in ("median_s", "p25_s", "p75_s"))
    except (KeyError, TypeError, ValueError):
        raise ParameterError(f"earlier must hold median_s, p25_s and p75_s in seconds, got {earlier!r}") from None
    if not med > 0 or not now_times_s:
        raise ParameterError(f"same_job needs a positive earlier median and times now, got {med!r} and "
                             f"{len(now_times_s)} time(s)")
    now = Measurement(f"{name} now", tuple(float(x) for x in now_times_s), 0)
    ratio = now.median_s / med
    overlap = now.p25_s <= hi and lo <= now.p75_s
    ok = overlap or (1.0 / max_drift <= ratio <= max_drift)
    sentence = (f"{name}: {where} measured {med * 1e3:.1f} ms (IQR {lo * 1e3:.1f}-{hi * 1e3:.1f}), this notebook "
                f"{now.median_s * 1e3:.1f} ms (IQR {now.p25_s * 1e3:.1f}-{now.p75_s * 1e3:.1f}): {ratio:.2f}x "
                f"(allowed: within {1 / max_drift:.2f}-{max_drift:.2f}x or overlapping ranges)")
    return CrossCheck("same job", ok, sentence, {"earlier_ms": med * 1e3, "now_ms": now.median_s * 1e3,
                                                 "ratio": ratio, "overlap": overlap, "max_drift": max_drift})


def amdahl(speedup: Comparison, baseline_phase_medians: Mapping[str, float], optimizations: Sequence[str], *,
           slack: float = AMDAHL_SLACK) -> CrossCheck:
    """Check a speedup against the most the acted-on phases allow (Amdahl's law).

    If the phases that ``optimizations`` act on took no time at all, the step
    would be ``1 - f`` of the baseline's, ``f`` their share of the sum of the
    baseline's phase medians: the speedup cannot exceed ``1 / (1 - f)``. The
    check fails when the speedup's whole interval lies above ``slack`` times
    that bound. With every phase acted on there is no bound and it passes.

    Parameters
    ----------
    speedup : helpers.timing.Comparison
        Baseline vs the other job (``ratio`` > 1: the other is faster).
    baseline_phase_medians : mapping of str to float
        ``data``, ``h2d``, ``compute``: the baseline's median seconds per step.
    optimizations : sequence of str
    slack : float, default :data:`AMDAHL_SLACK`

    Returns
    -------
    CrossCheck

    Raises
    ------
    ParameterError
        Unknown optimization, a missing phase, or ``slack`` < 1.
    """
    if not (isinstance(slack, (int, float)) and math.isfinite(slack) and slack >= 1.0):
        raise ParameterError(f"slack must be a finite number >= 1, got {slack!r}")
    acted = _acted_on(optimizations)
    try:
        med = {p: float(baseline_phase_medians[p]) for p in PHASES}
    except KeyError as exc:
        raise ParameterError(f"baseline_phase_medians lacks the phase {exc}; give data, h2d and compute") from None
    total = sum(med.values())
    share = sum(med[p] for p in acted) / total if total > 0 else 0.0
    where = "+".join(p for p in PHASES if p in acted) or "no phase"
    if share >= 1.0 - 1e-9:
        return CrossCheck("Amdahl bound", True, f"the optimizations act on every phase ({where}): no upper bound",
                          {"acted_share": share, "bound": None})
    bound = 1.0 / (1.0 - share)
    ok = not speedup.ci_low > slack * bound
    sentence = (f"{speedup.ratio:.2f}x measured (95% CI {speedup.ci_low:.2f}-{speedup.ci_high:.2f}) where the "
                f"phases acted on ({where}) were {share:.0%} of the baseline step: even at zero cost they allow at "
                f"most {bound:.2f}x (Amdahl's law, {slack - 1:.0%} allowance)")
    return CrossCheck("Amdahl bound", ok, sentence, {"acted_share": share, "bound": bound, "ratio": speedup.ratio,
                                                     "ci_low": speedup.ci_low, "slack": slack})


def failed_sentence(checks: Sequence[CrossCheck]) -> str:
    """The sentence a verdict gives when checks failed ("" when none did)."""
    bad = [c.sentence for c in checks if not c.ok]
    if not bad:
        return ""
    return ("inconclusive: the machine's speed changed while measuring (" + "; ".join(bad)
            + "); rerun when the machine is quiet")


def apply(verdict: Verdict, checks: Sequence[CrossCheck]) -> Verdict:
    """Return ``verdict`` with its cross-checks recorded, made "inconclusive" when one failed.

    Every check goes into ``extra["cross_checks"]`` (:meth:`CrossCheck.to_dict`).
    When one failed and the verdict decided something, the recommendation
    becomes "inconclusive", the action is dropped, ``extra["measured_recommendation"]``
    keeps what it would have said, and the reason starts with the failed checks
    and keeps what was measured. A "not applicable" verdict is kept as it is.

    Parameters
    ----------
    verdict : helpers.verdict.Verdict
    checks : sequence of CrossCheck

    Returns
    -------
    helpers.verdict.Verdict
    """
    extra = {**dict(verdict.extra), "cross_checks": [c.to_dict() for c in checks]}
    why = failed_sentence(checks)
    if not why or verdict.recommendation in ("not applicable", "inconclusive"):
        return replace(verdict, extra=extra)
    extra["measured_recommendation"] = verdict.recommendation
    return replace(verdict, recommendation="inconclusive", action=None, extra=extra,
                   reason=f"{why}. What it measured: {verdict.recommendation}: {verdict.reason}")
