"""Notebook 10's "try it" panel: the baseline against a job with the optimizations switched on by hand.

:func:`try_optimizations` builds and times both jobs as notebook 10 does (:mod:`helpers.experiments.e2e_jobs`);
:func:`live_point` turns the speedup into the panel's point (:class:`helpers.live.LivePoint`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from helpers.errors import ParameterError
from helpers.experiments import registry
from helpers.experiments.e2e_jobs import (JobConfig, JobSummary, JobVariant, live_settings,
                                          run_interleaved, speedup, summarize)
from helpers.live import LivePoint, Progress, no_progress
from helpers.timing import Comparison

#: Steps per job per turn of the interleaved rotation (notebook 10's).
BLOCK = 2

#: Short names of the optimizations for a chart's axis.
SHORT_NAMES: dict[str, str] = {"batched_decode": "decode", "dataset_cache": "cache", "dataloader_workers": "workers",
                               "pinned_memory": "pin", "prefetcher": "prefetch", "mixed_precision": "amp",
                               "channels_last": "NHWC"}


def live_point(comparison: Comparison, config: JobConfig, *, baseline: JobSummary | None = None,
               optimized: JobSummary | None = None, label: str | None = None) -> LivePoint:
    """A speedup over the baseline job as a "try it" point: the ratio, its bootstrap interval and the outcome.

    Parameters
    ----------
    comparison : helpers.timing.Comparison
        :func:`e2e_jobs.speedup` of the baseline (A) and the job (B): ratio > 1 means the job is faster.
    config : JobConfig
        The job's optimizations (the label and the sentence name them).
    baseline, optimized : JobSummary, optional
        Both jobs' summaries, for the exposed input share in the sentence.
    label : str, optional
        Default: the short names of the optimizations joined by "+" (``"none (A/A)"`` for the baseline itself).

    Returns
    -------
    LivePoint
        metric ``speedup``, unit ``x`` (baseline median step time / the job's), ``low``/``high``: its 95%
        bootstrap interval; ``extra``: ``optimizations``, ``outcome`` and, with the summaries, both exposed
        input shares and throughputs.
    """
    label = label or ("+".join(SHORT_NAMES.get(o, o) for o in config.optimizations) or "none (A/A)")
    extra: dict[str, Any] = {"optimizations": list(config.optimizations), "outcome": comparison.outcome(),
                             "steps": comparison.a.repeats}
    exposed = ""
    if baseline is not None and optimized is not None:
        extra.update(baseline_exposed_fraction=baseline.exposed_fraction,
                     exposed_fraction=optimized.exposed_fraction, baseline_throughput=baseline.throughput,
                     throughput=optimized.throughput)
        exposed = (f"; {baseline.throughput:,.0f} -> {optimized.throughput:,.0f} samples/s, exposed input "
                   f"{baseline.exposed_fraction:.0%} -> {optimized.exposed_fraction:.0%} of the median step")
    said = {"b_faster": "faster", "a_faster": "slower", "below_threshold": "a difference below 5%",
            "no_difference": "no measurable difference: the interval spans 1"}[comparison.outcome()]
    sentence = (f"{label} ({config.label()}): {comparison.ratio:.2f}x the baseline's throughput (95% CI "
                f"{comparison.ci_low:.2f}-{comparison.ci_high:.2f}, {comparison.a.repeats} interleaved steps "
                f"each: {said}){exposed}")
    return LivePoint.from_comparison(label, comparison, sentence=sentence, **extra)


def _switched_on(switches: Mapping[str, Any], unavailable: Mapping[str, str] | None) -> tuple[str, ...]:
    """The optimizations switched on, checked: names, bools, availability, requirements."""
    known = registry.optimization_names()
    unknown = [n for n in switches if n not in known]
    if unknown:
        raise ParameterError(f"unknown optimization switch(es) {', '.join(map(repr, unknown))}; valid: "
                             f"{', '.join(known)}")
    bad = {n: v for n, v in switches.items() if not isinstance(v, bool)}
    if bad:
        raise ParameterError(f"optimization switches are True or False, got {bad!r}")
    enabled = tuple(n for n in known if switches.get(n, False))
    for name in enabled:
        why = (unavailable or {}).get(name)
        if why:
            raise ParameterError(f"{name} is not available for this job: {why}; switch it off")
        needs = registry.optimization(name).requires
        if needs and needs not in enabled:
            raise ParameterError(f"{name} works only together with {needs}: switch {needs} on too, or {name} off")
    return enabled


def try_optimizations(job, acc, *, steps: int, warmup_steps: int, num_workers: int = 2,
                      amp_dtype: str = "bfloat16", seed: int = 0, block: int = BLOCK,
                      unavailable: Mapping[str, str] | None = None, progress: Progress = no_progress,
                      **switches: bool) -> LivePoint:
    """Notebook 10's before/after comparison with the optimizations switched on and off by hand.

    A baseline job and a job with the optimizations switched on are built as the notebook builds its jobs
    (:class:`e2e_jobs.JobVariant` on the notebook's job: same seed, same batches, same initial weights), timed in
    the same rotation (:func:`e2e_jobs.run_interleaved`: each job's warm-up first, then blocks of ``block``
    steps, the order reversed every round; every phase closed by a device synchronize), and compared by
    :func:`e2e_jobs.speedup`. With every switch off the second job is the baseline itself: an A/A comparison,
    whose interval shows the noise of this machine.

    Parameters
    ----------
    job : helpers.jobs.base.Job
        The notebook's job (the built-in PPO job, or the user's: then ``batched_decode`` and
        ``dataset_cache`` are not available, see ``unavailable``).
    acc : helpers.device.Accelerator
    steps, warmup_steps : int
        Measured (>= 1) and excluded (>= 0) steps per job.
    num_workers : int
        DataLoader worker processes when ``dataloader_workers`` is on (>= 1; the notebook's selection's).
    amp_dtype : {"bfloat16", "float16"}
        Autocast dtype when ``mixed_precision`` is on (the notebook's selection's).
    seed : int
        Seed of the bootstrap interval.
    block : int
        Steps per job per turn.
    unavailable : mapping of str to str, optional
        Optimizations this job cannot use, with why (the notebook's ``unavailable``).
    progress : callable
        ``progress(done, total)`` in steps of both jobs, after each step (outside the timing).
    **switches : bool
        One per optimization name (``batched_decode=True, channels_last=False, ...``); a name not given is off.

    Returns
    -------
    LivePoint
        See :func:`live_point`: metric ``speedup``, unit ``x``, with its 95% bootstrap interval. ``extra`` also
        holds what the optimized job really ran with, read from its objects (:func:`e2e_jobs.live_settings`).

    Raises
    ------
    helpers.errors.ParameterError
        A switch that is not an optimization name or not a bool; an optimization switched on without the one it
        requires (``dataset_cache`` needs ``batched_decode``) or one this job cannot use; counts or settings
        :class:`e2e_jobs.JobConfig` and :func:`e2e_jobs.run_interleaved` reject.
    """
    enabled = _switched_on(switches, unavailable)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ParameterError(f"steps={steps!r} must be an int >= 1 (measured steps per job)")
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
        raise ParameterError(f"warmup_steps={warmup_steps!r} must be an int >= 0")
    config = JobConfig("try it", enabled, num_workers=int(num_workers), amp_dtype=str(amp_dtype))
    total = 2 * (int(warmup_steps) + int(steps))
    done = [0]

    def tick(_done: int, _steps: int) -> None:  # after every step of either job, outside its timing
        done[0] += 1
        progress(min(done[0], total), total)

    base = opt = None
    try:
        base = JobVariant(JobConfig("baseline"), job, acc)
        opt = JobVariant(config, job, acc)
        run_interleaved([base, opt], steps=steps, warmup_steps=warmup_steps, block=block, progress=tick)
        point = live_point(speedup(base, opt, seed=seed), config, baseline=summarize(base), optimized=summarize(opt))
        return replace(point, extra={**point.extra, **live_settings(opt)})
    finally:
        for v in (base, opt):
            if v is not None:
                v.close()
