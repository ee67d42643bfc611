"""Notebook 10's jobs: one configuration of the training job, its plan, the interleaved runner and its summaries.

The job itself (dataset, loader, model, step, transfer) comes from a :class:`helpers.jobs.base.Job` (the built-in
:class:`helpers.jobs.ppo.PPOJob` or a user's). A :class:`JobConfig` names the optimizations one job uses;
:func:`plan_for` folds each enabled optimization's ``apply`` hook (declared by the notebook that decides it,
:func:`helpers.experiments.registry.optimizations`) into a :class:`helpers.experiments.base.JobPlan`, and
:class:`JobVariant` builds the job from that plan alone:

- the baseline: the job's per-image pipeline (the built-in job: per-image Pillow decode, augment, normalize,
  tokenize in the training process), no workers, no pinning, float32 NCHW;
- ``batched_decode`` (:class:`helpers.pipeline.fast.BatchedDataset` and :func:`helpers.pipeline.fast.to_device_batch`),
  ``dataset_cache`` (the decode-once cache feeding it), ``dataloader_workers``
  (:func:`helpers.pipeline.loader.make_loader`), ``pinned_memory``, ``prefetcher``
  (:class:`helpers.pipeline.prefetch.DevicePrefetcher`), ``mixed_precision`` (autocast in the step, a GradScaler
  for float16 from :func:`helpers.compute.amp.make_grad_scaler`) and ``channels_last`` (model and images in NHWC).

Every job draws the same batches in the same order (one batch sampler per job, same seed) and the same crops and
flips (both datasets seed each item from ``(seed, epoch, index)``), and starts from the same initial weights, so
the jobs' learning curves can be compared. :func:`run_interleaved` times several jobs in rotating blocks of steps,
so a busy machine slows them all alike.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping, Sequence

import pandas as pd
import torch

from helpers import checklist
from helpers.compute.train import TimedLoop, epochs
from helpers.device import usable_cores
from helpers.errors import ParameterError
from helpers.experiments import registry
from helpers.experiments.base import JobPlan
from helpers.experiments.training import clone_batch, same_structure, same_values
from helpers.jobs.base import close_dataset
from helpers.pipeline.baseline import IMAGENET_STD
from helpers.pipeline.loader import LoaderConfig, close_loader
from helpers.pipeline.prefetch import DevicePrefetcher, prefetched
from helpers.timing import Comparison, Measurement

PHASES = checklist.PHASES


def __getattr__(name: str):
    """``OPTIMIZATIONS``: the registry's, read when asked for (the registry imports this module, so it cannot be read
    at import time)."""
    if name == "OPTIMIZATIONS":
        return registry.optimization_names()  # in checklist order
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def check_optimizations(requested: Iterable[str]) -> tuple[str, ...]:
    """Validate the ``optimizations`` parameter before any work.

    Parameters
    ----------
    requested : iterable of str
        ``["auto"]``, or names from :func:`helpers.experiments.registry.optimization_names` (an empty list means
        the optimized job equals the baseline).

    Returns
    -------
    tuple of str
        ``("auto",)`` or the distinct names in :func:`helpers.experiments.registry.optimization_names` order.

    Raises
    ------
    ParameterError
        An unknown name, or ``"auto"`` mixed with names; the message lists the valid ones.
    """
    if isinstance(requested, str):
        raise ParameterError(f"optimizations must be a list of names, got the string {requested!r}; "
                             f"e.g. ['auto'] or ['batched_decode', 'mixed_precision']")
    names, known = [str(n) for n in requested], registry.optimization_names()
    if "auto" in names:
        if len(set(names)) > 1:
            raise ParameterError(f"optimizations={names!r} mixes 'auto' with names; pass ['auto'] alone, or "
                                 f"a list from: {', '.join(known)}")
        return ("auto",)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ParameterError(f"unknown optimization(s) {', '.join(map(repr, unknown))} in optimizations; valid: "
                             f"auto, {', '.join(known)}")
    return tuple(n for n in known if n in names)


# --------------------------------------------------------------------------- one job


@dataclass(frozen=True)
class JobConfig:
    """One job: a name, the optimizations it uses and their settings.

    Attributes
    ----------
    name : str
        Label in tables and figures.
    optimizations : tuple of str
        Names from :func:`helpers.experiments.registry.optimization_names` (empty: the baseline).
    num_workers : int
        DataLoader workers when ``dataloader_workers`` is on (>= 1); its setting ``num_workers``.
    amp_dtype : str
        Autocast dtype name when ``mixed_precision`` is on; its setting ``amp_dtype``.
    """

    name: str
    optimizations: tuple[str, ...] = ()
    num_workers: int = 2
    amp_dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        check_optimizations(list(self.optimizations))
        if self.num_workers < 1:
            raise ParameterError(f"num_workers={self.num_workers}; the workers optimization needs >= 1")
        if self.amp_dtype not in ("bfloat16", "float16"):
            raise ParameterError(f"amp_dtype={self.amp_dtype!r}; allowed: bfloat16, float16")

    @property
    def settings(self) -> dict[str, Any]:
        """Each optimization's :attr:`~helpers.experiments.base.Optimization.setting` name -> its value here."""
        names = {o.setting for o in registry.optimizations() if o.setting}
        return {s: getattr(self, s) for s in sorted(names)}

    def has(self, name: str) -> bool:
        """Whether ``name`` is on."""
        return name in self.optimizations

    def without(self, name: str) -> "JobConfig":
        """This job with ``name`` removed, named ``"without <name>"``."""
        return replace(self, name=f"without {name}", optimizations=tuple(o for o in self.optimizations if o != name))

    def label(self) -> str:
        """The optimizations in words, each with its setting's value: ``"batched_decode, mixed_precision (bfloat16)"``
        (``"none (baseline)"`` when empty)."""
        settings = self.settings
        parts = []
        for name in self.optimizations:
            setting = registry.optimization(name).setting
            parts.append(f"{name} ({settings[setting]})" if setting else name)
        return ", ".join(parts) or "none (baseline)"


def ablation_configs(optimized: JobConfig) -> list[JobConfig]:
    """The optimized job with each of its optimizations removed in turn."""
    return [optimized.without(o) for o in optimized.optimizations]


def plan_for(config: JobConfig, acc) -> JobPlan:
    """What ``config`` switches on a job: each enabled optimization's ``apply`` hook folded in checklist order.

    Starts from :class:`helpers.experiments.base.JobPlan` (the baseline) and applies
    ``optimization.apply(plan, config.settings, acc)`` for every optimization of ``config``, in the order of
    :func:`helpers.experiments.registry.optimizations`. An optimization whose ``requires`` is not on is skipped
    (the decode-once cache without batched decode leaves the baseline's pipeline).

    Parameters
    ----------
    config : JobConfig
    acc : helpers.device.Accelerator
        The device (its capabilities: pinned memory only where it has any).

    Returns
    -------
    helpers.experiments.base.JobPlan
    """
    plan, settings = JobPlan(), config.settings
    for o in registry.optimizations():
        if config.has(o.name) and (not o.requires or config.has(o.requires)):
            plan = o.apply(plan, settings, acc)
    return plan


class JobVariant:
    """One configuration of a training job, stepped in blocks with every phase of every step timed.

    The job itself (dataset, loader, model, step, transfer) comes from ``job``; this class builds it as
    :func:`plan_for` of ``config`` says (pipeline, workers, pinning, prefetcher, step options) and times it in a
    :class:`helpers.compute.train.TimedLoop`.

    Parameters
    ----------
    config : JobConfig
    job : helpers.jobs.base.Job
        The job (data, workload, model, step): the built-in :class:`helpers.jobs.ppo.PPOJob` or a user's;
        ``batched_decode`` uses its ``"batched"`` pipeline (the built-in job's only).
    acc : helpers.device.Accelerator
    input_free : bool, default False
        The job's input-free ceiling instead: its first ``input_free_batches`` batches (through this
        configuration's loader and transfer) are kept on the device and cycled, so its steps load and copy
        nothing (the same model initialization, step and options).
    input_free_batches : int, default 8

    Raises
    ------
    helpers.errors.ParameterError
        If the plan's pipeline is not one the job offers.

    Notes
    -----
    Steps are timed by the loop (a device synchronize closes each phase):
    *data* (next batch), *h2d* (the transfer: copy, and for the batched
    pipeline conversion and normalization on the device) and *compute* (one
    training step). Statistics are read from the device after the step's timing.
    The data iterator lives across blocks, so worker processes and the
    prefetcher keep running between blocks.
    """

    def __init__(self, config: JobConfig, job, acc, *, input_free: bool = False,
                 input_free_batches: int = 8) -> None:
        workload = job.workload
        self.config, self.acc, self.workload, self.job = config, acc, workload, job
        self.plan = plan = plan_for(config, acc)
        pin, workers = plan.pin_memory, plan.num_workers
        self.options = plan.options
        self.dataset = self._dataset(job, plan)
        self.sampler = job.batch_sampler(len(self.dataset))
        loader_cfg = LoaderConfig(batch_size=workload.batch_size, num_workers=workers,
                                  pin_memory=pin and workers > 0, seed=workload.seed)
        self.loader = job.make_loader(self.dataset, loader_cfg, acc, batch_sampler=self.sampler)
        self.transfer = _Transfer(job, self.options)
        self.prefetcher = None
        if plan.prefetcher:
            self.prefetcher = DevicePrefetcher(self.loader, acc, transfer=self.transfer, non_blocking=pin,
                                               time_copies=False)
            self.source, self.transfer = self.prefetcher, prefetched
        else:
            self.source = self.loader
        model = job.make_model(acc, self.options)
        self.step = job.make_step(model, acc, self.options)
        self.trainer = getattr(self.step, "trainer", None)  # the built-in job's PPO trainer (None for others)
        self.non_blocking = bool(pin)
        self.loop = TimedLoop(self.batches(),
                              lambda batch: self.transfer(batch, acc, non_blocking=self.non_blocking),
                              self.step, acc.synchronize)
        self.timer = self.loop.timer
        self.peak_bytes: int | None = None
        self.input_free = bool(input_free)
        if self.input_free:
            source = iter(self.batches())
            kept = [clone_batch(self.transfer(batch, acc, non_blocking=False))
                    for batch in itertools.islice(source, max(1, int(input_free_batches)))]
            del source
            acc.synchronize()
            self.loop = TimedLoop(itertools.cycle(kept), lambda batch: batch, self.step, acc.synchronize)
            self.timer = self.loop.timer

    @staticmethod
    def _dataset(job, plan: JobPlan):
        """The plan's dataset: the job's own first pipeline for the baseline, else the named one."""
        if plan.pipeline == "baseline":
            return job.make_dataset("baseline" if "baseline" in job.pipelines else job.pipelines[0])
        if plan.pipeline not in job.pipelines:
            raise ParameterError(f"batched_decode needs the workbook's {plan.pipeline} image pipeline; the job "
                                 f"{job.name!r} offers {', '.join(job.pipelines)}")
        workers = plan.num_workers
        threads = 0 if workers == 0 else max(1, usable_cores() // workers)
        return job.make_dataset(plan.pipeline, threads=threads, pin_memory=plan.pin_memory and workers == 0)

    def batches(self):
        """The host batches of this job, epoch after epoch (a new iterator over the same loader)."""
        return epochs(self.source, datasets=[self.dataset, self.sampler])

    @property
    def measured(self) -> list[bool]:
        """Per step run so far: measured (True) or warm-up (False)."""
        return self.loop.measured

    def run(self, steps: int, *, measured: bool = True, progress=None) -> None:
        """Run ``steps`` training steps, timing each phase; ``measured=False`` marks them as warm-up.

        ``progress(done, steps)`` is called after each step, outside its timing (:meth:`TimedLoop.run`)."""
        if not self.acc.is_cpu:
            self.acc.reset_peak_memory_stats()
        self.loop.run(steps, measured=measured, progress=progress)
        if not self.acc.is_cpu:
            peak = self.acc.memory_stats().get("peak_allocated_bytes")
            if peak is not None:
                self.peak_bytes = max(self.peak_bytes or 0, int(peak))

    def steps_frame(self, *, measured_only: bool = True):
        """One row per step: step, data, h2d, compute, step_s, exposed_input_s, exposed_fraction, and the step's
        statistics (the built-in job: the PPO losses).

        With ``measured_only=False`` every step is returned, with a ``measured`` column.
        """
        return self.loop.steps_frame(measured_only=measured_only)

    def measurement(self, column: str = "step_s"):
        """The measured steps' ``column`` as a :class:`helpers.timing.Measurement` (items = batch size)."""
        df = self.steps_frame()
        return Measurement(name=self.config.name, times_s=tuple(float(x) for x in df[column]),
                           warmup=int(len(self.measured) - len(df)),
                           items_per_call=self.workload.batch_size if column == "step_s" else None)

    def close(self) -> None:
        """Release the dataset's thread pool and the loader's workers."""
        self.loop.batches = None
        close_loader(self.loader)
        close_dataset(self.dataset)


class _Transfer:
    """``transfer(batch, acc, non_blocking=...)`` of a job with its step options (picklable, no closure)."""

    def __init__(self, job, options) -> None:
        self.job, self.options = job, options

    def __call__(self, batch, acc, *, non_blocking: bool = False):
        return self.job.to_device(batch, acc, non_blocking=non_blocking, options=self.options)


def same_input_check(a: JobConfig, b: JobConfig, job, acc) -> dict[str, Any]:
    """Check, before timing, that two jobs feed the same samples: first batch of each, on the device.

    Two throwaway jobs are built (their own loaders; the timed jobs are not
    touched) and their first batch compared after the transfer.

    Returns
    -------
    dict
        ``labels_equal``, ``tokens_equal`` (bool); ``mean_abs_levels`` and
        ``max_abs_levels``: pixel difference in 0-255 levels (normalized
        difference times 255 x the channel's std), from decoding differences
        only (same crops and flips; the batched decoder may scale in the DCT
        domain). For a user's job, ``batches_equal`` (bool: the same values,
        their augmentations seeded per sample alike); when the values differ
        because the job's augmentations cannot be reproduced (a first batch
        read again differs too), ``labels_equal`` and ``tokens_equal`` say
        whether the order, labels, shapes and dtypes agree
        (:func:`helpers.experiments.training.same_structure`).
    """
    ja, jb = JobVariant(a, job, acc), JobVariant(b, job, acc)
    try:
        if not job.is_builtin:  # a user's job: the same dataset, order and per-sample seeds: same values
            return _same_user_batches(ja, jb, a, job, acc)
        xa, ta, la = ja.transfer(next(ja.batches()), acc)
        xb, tb, lb = jb.transfer(next(jb.batches()), acc)
        std = torch.tensor(IMAGENET_STD, device=xa.device).view(1, 3, 1, 1)
        levels = ((xa.float() - xb.float()).abs() * std * 255.0)
        return {"labels_equal": bool(torch.equal(la.cpu(), lb.cpu())),
                "tokens_equal": bool(torch.equal(ta.cpu(), tb.cpu())),
                "mean_abs_levels": float(levels.mean()), "max_abs_levels": float(levels.max())}
    finally:
        ja.close()
        jb.close()


def _same_user_batches(ja: JobVariant, jb: JobVariant, a: JobConfig, job, acc) -> dict[str, Any]:
    """:func:`same_input_check` for a user's job: the same values, or (unseedable augmentations) the same
    order, labels, shapes and dtypes."""
    ba, bb = ja.transfer(next(ja.batches()), acc), jb.transfer(next(jb.batches()), acc)
    same = same_values(ba, bb, exact=False)
    agree = same
    if not same:  # augmentations from a source nobody can seed: the order, labels, shapes and dtypes
        jc = JobVariant(a, job, acc)
        try:
            again = jc.transfer(next(jc.batches()), acc)
        finally:
            jc.close()
        agree = not same_values(ba, again, exact=False) and same_structure(ba, bb)
    return {"labels_equal": agree, "tokens_equal": agree, "mean_abs_levels": 0.0 if same else float("nan"),
            "max_abs_levels": 0.0 if same else float("nan"), "batches_equal": same}


# --------------------------------------------------------------------------- running and comparing jobs


def run_interleaved(jobs: Sequence[JobVariant], *, steps: int, warmup_steps: int, block: int = 2,
                    progress=None) -> None:
    """Run every job for ``warmup_steps`` then ``steps`` measured steps, in rotating blocks.

    Warm-up: each job in turn. Measured: rounds of ``block`` steps per job, the
    job order reversed every other round (A B C, C B A, ...: ABBA for two
    jobs), so a drift of the machine's speed touches every job alike.

    Parameters
    ----------
    jobs : sequence of JobVariant
    steps : int
        Measured steps per job (>= 1).
    warmup_steps : int
        Unmeasured steps per job first (>= 0).
    block : int
        Steps per job per turn (>= 1).
    progress : callable, optional
        ``progress(done, total)`` after every step of every job (warm-up included), outside the timing.

    Raises
    ------
    ParameterError
        For invalid counts or no job.
    """
    if not jobs or steps < 1 or warmup_steps < 0 or block < 1:
        raise ParameterError(f"need >= 1 job, steps >= 1, warmup_steps >= 0 and block >= 1; got {len(jobs)} "
                             f"job(s), steps={steps}, warmup_steps={warmup_steps}, block={block}")
    extra = {"progress": progress} if progress is not None else {}  # wrappers without the keyword still work
    for job in jobs:
        if warmup_steps:
            job.run(warmup_steps, measured=False, **extra)
    done, rnd = 0, 0
    while done < steps:
        n = min(block, steps - done)
        for job in (jobs if rnd % 2 == 0 else list(reversed(jobs))):
            job.run(n, **extra)
        done += n
        rnd += 1


@dataclass(frozen=True)
class JobSummary:
    """The before/after table's numbers for one job.

    Attributes
    ----------
    name, optimizations : str
    step_median_s, step_p25_s, step_p75_s : float
        Step time, seconds.
    data_s, h2d_s, compute_s : float
        Median seconds per step of each phase.
    throughput : float
        Samples/s at the median step time.
    exposed_fraction : float
        (median data + median h2d) / (sum of the three phase medians): the
        input's share of the median step, as drawn in the phase-breakdown figure.
    utilization : float
        median compute / (sum of the three phase medians): the share of the
        median step the device computes (same definition, so the two add up to 1).
    peak_memory_bytes : int or None
        Device peak allocated memory (None on a CPU).
    steps : int
        Measured steps.
    """

    name: str
    optimizations: str
    step_median_s: float
    step_p25_s: float
    step_p75_s: float
    data_s: float
    h2d_s: float
    compute_s: float
    throughput: float
    exposed_fraction: float
    utilization: float
    peak_memory_bytes: int | None
    steps: int


def summarize(job: JobVariant) -> JobSummary:
    """Summarize a job's measured steps (see :class:`JobSummary`)."""
    df = job.steps_frame()
    m = job.measurement()
    data, h2d, comp = (float(df[p].median()) for p in PHASES)
    total = data + h2d + comp
    exposed = (data + h2d) / total if total > 0 else 0.0
    return JobSummary(name=job.config.name, optimizations=job.config.label(), step_median_s=m.median_s,
                      step_p25_s=m.p25_s, step_p75_s=m.p75_s, data_s=data, h2d_s=h2d, compute_s=comp,
                      throughput=job.workload.batch_size / m.median_s,
                      exposed_fraction=exposed, utilization=(comp / total if total > 0 else 0.0),
                      peak_memory_bytes=job.peak_bytes, steps=m.repeats)


def summary_frame(summaries: Sequence[JobSummary]):
    """The before/after table: one row per job, times in ms, fractions in %.

    ``peak memory MiB`` is the device's peak allocated memory, or the text
    ``"n/a on CPU"`` where the device does not report it (a CPU: the process's
    peak RSS covers every job of the process and cannot be split).
    """
    rows = []
    for s in summaries:
        rows.append({"job": s.name, "step ms (median)": s.step_median_s * 1e3,
                     "step ms (IQR)": f"{s.step_p25_s * 1e3:.0f}-{s.step_p75_s * 1e3:.0f}",
                     "data ms": s.data_s * 1e3, "h2d ms": s.h2d_s * 1e3, "compute ms": s.compute_s * 1e3,
                     "samples/s": s.throughput, "exposed input %": 100 * s.exposed_fraction,
                     "compute share %": 100 * s.utilization,
                     "peak memory MiB": (f"{s.peak_memory_bytes / 2 ** 20:.0f}" if s.peak_memory_bytes
                                         else "n/a on CPU")})
    return pd.DataFrame(rows).set_index("job")


def speedup(baseline: JobVariant, other: JobVariant, *, seed: int = 0):
    """Throughput of ``other`` over ``baseline`` (= baseline step time / other's) with a bootstrap interval.

    Returns
    -------
    helpers.timing.Comparison
        A = baseline, B = other; ``ratio`` > 1 means ``other`` is faster.
    """
    return Comparison.from_measurements(baseline.measurement(), other.measurement(), seed=seed)


def ceiling_fraction(job: JobVariant, ceiling: JobVariant, *, seed: int = 0) -> dict[str, Any]:
    """The job's throughput as a fraction of its input-free ceiling's, with a bootstrap interval.

    Parameters
    ----------
    job : JobVariant
        The measured job (e.g. the optimized one).
    ceiling : JobVariant
        The same configuration with ``input_free=True``, timed in the same rotation.

    Returns
    -------
    dict
        ``fraction`` (ceiling's median step / the job's: 1 means input costs nothing), ``ci_low``, ``ci_high``
        (95%), ``free_input_speedup`` (its inverse: how much faster the job would be with free input) and the
        :class:`helpers.timing.Comparison` under ``comparison`` (A = the job, B = the ceiling).
    """
    c = Comparison.from_measurements(job.measurement(), ceiling.measurement(), seed=seed)
    fraction, low, high = c.inverse()
    return {"fraction": fraction, "ci_low": low, "ci_high": high, "free_input_speedup": c.ratio, "comparison": c}


def contribution(optimized: JobVariant, without: JobVariant, *, seed: int = 0):
    """What one optimization contributes: the optimized job vs the same job without it, with a bootstrap interval.

    Parameters
    ----------
    optimized : JobVariant
        The full optimized job.
    without : JobVariant
        The optimized job with one optimization removed (timed in the same rotation).
    seed : int

    Returns
    -------
    helpers.timing.Comparison
        A = ``without``, B = ``optimized``; ``ratio`` = median step without /
        median step with (= full speedup / speedup without it): > 1 means the
        optimization makes the job faster, < 1 that the job is faster without it.
    """
    return Comparison.from_measurements(without.measurement(), optimized.measurement(), seed=seed)


def live_settings(job: JobVariant) -> Mapping[str, Any]:
    """What a built job really runs with, read from its objects (the "try it" point's ``extra``).

    Returns
    -------
    dict
        ``num_workers`` (its DataLoader's), ``pin_memory``, ``prefetcher``, ``autocast_dtype`` (a dtype name or
        None), ``channels_last``, ``dataset`` (its class name).
    """
    dtype = job.options.autocast_dtype
    return {"num_workers": int(getattr(job.loader, "num_workers", 0)),
            "pin_memory": bool(job.non_blocking),  # pinned where the device has pinned memory (not a CPU)
            "prefetcher": job.prefetcher is not None,
            "autocast_dtype": str(dtype).replace("torch.", "") if dtype is not None else None,
            "channels_last": bool(job.options.channels_last), "dataset": type(job.dataset).__name__}
