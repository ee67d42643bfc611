"""Notebook 05's experiment: hide the input pipeline behind compute, measured on a Job.

Each variant trains the job on its batched pipeline with one input setting
(:func:`run_overlap_variant`): *before* (the loader in the main process, the
copy in the step) and *after* (DataLoader worker processes and a
:class:`helpers.pipeline.prefetch.DevicePrefetcher`, with each thread split
of :func:`thread_splits`, keeping the fastest). :func:`run_overlap` runs the
whole comparison; notebook 05 and ``python -m helpers bench input-pipeline``
(:func:`overlap_bench`) both call it.

The overlap metric (:func:`overlap_stats`): *input work* is what the
pipeline spent producing a batch (``prep_s`` of the host batch: decode,
augment, tokenize, collate, wherever it ran) plus its copy; *exposed input* is
what the training loop waited for it (the ``data`` + ``h2d`` phases of the
timed loop, :class:`helpers.compute.train.TimedLoop`). Each is summarized by
its median over the measured steps; the hidden fraction is
``1 - exposed / work`` and the exposed fraction ``exposed / step time``, both
ratios of those medians. :func:`overlap_limits` says why an overlap could not
work when it did not. The notebook's "try it" panel calls :func:`try_overlap`:
the *after* variant again at another model width, worker count and core split.
Notebook 05 calls :func:`run`, whose :class:`StreamOverlapResult` holds all of
it and makes the notebook's records, verdict and panel.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd
import torch

from helpers import checklist, specs
from helpers.checklist import Item
from helpers.compute.train import TimedLoop, epochs
from helpers.device import Accelerator, get_accelerator, usable_cores
from helpers.errors import DataError, ParameterError
from helpers.experiments import registry
from helpers.experiments.base import Experiment, ExperimentResult, Optimization, checked_fields
from helpers.experiments.training import fixed_batches
from helpers.jobs.base import WORKLOAD_PARAMS, Job, Workload, close_dataset
from helpers.jobs.ppo import PPOJob
from helpers.live import Knob, LivePoint, Progress, TrySpec, no_progress
from helpers.params import Param, coerce
from helpers.pipeline.loader import LoaderConfig, close_loader
from helpers.pipeline.prefetch import ConsumerStreamSync, DevicePrefetcher, RecordingLoader, prefetched
from helpers.results import Records, load_results
from helpers.timing import Comparison, Measurement, measure
from helpers.verdict import Action, Verdict
from helpers.workload import DEFAULT

logger = logging.getLogger(__name__)

# --------------------------------------------------------------------------- the overlap metric


@dataclass(frozen=True)
class OverlapStats:
    """How much of the input pipeline's work the training loop still waits for.

    One statistic throughout: every time is the **median over the measured
    steps** of a per-step value, and every fraction is a **ratio of those
    medians**, so that a table of the medians reproduces the fractions (a
    median of per-step ratios need not equal the ratio of the medians, and a
    ratio of totals is dragged by a few slow steps). The totals are kept for
    reference only.

    Attributes
    ----------
    steps : int
        Measured steps.
    median_input_work_s : float
        Median input work per step, seconds (batch preparation + copy,
        wherever they ran).
    median_exposed_s : float
        Median time the loop waited for input per step, seconds (``data`` +
        ``h2d`` phases).
    median_compute_s, median_step_s : float
        Median ``compute`` phase and step time, seconds.
    exposed_fraction : float
        ``median_exposed_s / median_step_s``: the share of the step the loop
        waits for input.
    hidden_fraction : float
        ``1 - median_exposed_s / median_input_work_s``, clipped to [0, 1]: the
        share of the input work that ran while the step computed. 0 when
        nothing was hidden, or when the loop waited longer than the work
        itself (``exposed_over_work`` > 1: start-up, IPC, contention).
    exposed_over_work : float
        ``median_exposed_s / median_input_work_s`` (unclipped; inf when the
        work is 0).
    exposed_fraction_per_step : float
        Median over steps of exposed input / step time: notebook 01's
        statistic (:attr:`helpers.compute.train.TrainRun.exposed_fraction`),
        kept to compare with it.
    input_work_s, exposed_input_s, step_s, compute_s : float
        Totals over the measured steps, seconds (reference only).
    exposed_fraction_p25, exposed_fraction_p75 : float
        The quartiles of ``exposed_fraction``'s own statistic: the 25th and
        75th percentiles of the per-step exposed input over the median step
        (fractions). ``exposed_fraction`` is the median of the same values, so
        it always lies between them; the quartiles of the per-step fractions
        (exposed / that step's time) need not hold it (a step whose exposed
        input and length both vary moves each on its own).
    """

    steps: int
    median_input_work_s: float
    median_exposed_s: float
    median_compute_s: float
    median_step_s: float
    exposed_fraction: float
    hidden_fraction: float
    exposed_over_work: float
    exposed_fraction_per_step: float
    input_work_s: float
    exposed_input_s: float
    step_s: float
    compute_s: float
    exposed_fraction_p25: float = math.nan
    exposed_fraction_p75: float = math.nan

    def as_dict(self) -> dict[str, float]:
        """All fields as a flat dict (seconds and fractions)."""
        return asdict(self)


def _median(values: Sequence[float]) -> float:
    return float(np.median(np.asarray(values, dtype=float))) if len(values) else math.nan


def input_work_per_step(batches: "pd.DataFrame", *, skip: int, steps: int,
                        copy_s: Sequence[float] | None = None) -> list[float]:
    """Input work of each measured step: the batch's ``prep_s`` plus its copy time.

    Parameters
    ----------
    batches : pandas.DataFrame
        :meth:`RecordingLoader.frame` (column ``prep_s``, seconds), rows in
        the order the training loop consumed them.
    skip : int
        Batches consumed before the measured steps (``warmup_steps``).
    steps : int
        Measured steps.
    copy_s : sequence of float, optional
        Copy time of each batch consumed (same order, starting at the first
        batch, including the skipped ones), seconds; or of each measured step
        only (length ``steps``). None: no copy time is added.

    Returns
    -------
    list of float
        ``steps`` values, seconds.

    Raises
    ------
    ParameterError
        If ``prep_s`` is missing or there are fewer batches than ``skip + steps``.
    """
    if "prep_s" not in batches:
        raise ParameterError("the batches carry no 'prep_s': input work needs the fast batch format's "
                             "prep_s (time spent preparing each batch)")
    if len(batches) < skip + steps:
        raise ParameterError(f"{len(batches)} batches recorded, fewer than skip + steps = {skip + steps}")
    prep = [float(v) for v in batches["prep_s"].iloc[skip:skip + steps]]
    if copy_s is None:
        return prep
    copies = list(copy_s)
    if len(copies) == steps:
        measured = copies
    elif len(copies) >= skip + steps:
        measured = copies[skip:skip + steps]
    else:
        raise ParameterError(f"copy_s has {len(copies)} values; give one per measured step ({steps}) or one per "
                             f"batch consumed (>= {skip + steps})")
    return [p + float(c) for p, c in zip(prep, measured)]


def overlap_stats(steps: "pd.DataFrame", input_work_s: Sequence[float]) -> OverlapStats:
    """The overlap metric from a training run's phase table and the input work of its steps.

    Parameters
    ----------
    steps : pandas.DataFrame
        One row per measured step with ``data``, ``h2d``, ``compute`` and
        ``step_s`` (seconds), e.g. :attr:`helpers.compute.train.TrainRun.steps`.
    input_work_s : sequence of float
        Input work of each measured step, seconds (:func:`input_work_per_step`).

    Returns
    -------
    OverlapStats

    Raises
    ------
    ParameterError
        When a column is missing, the lengths differ, there is no step, or a
        time is negative or not finite.
    """
    missing = [c for c in ("data", "h2d", "compute", "step_s") if c not in steps]
    if missing:
        raise ParameterError(f"the phase table lacks column(s) {missing}; pass TrainRun.steps")
    n = len(steps)
    work = np.asarray(list(input_work_s), dtype=float)
    if n == 0:
        raise ParameterError("the phase table has no step; run at least one measured step")
    if work.shape != (n,):
        raise ParameterError(f"input_work_s has {work.size} values for {n} steps; give one per measured step")
    exposed = steps["data"].to_numpy(dtype=float) + steps["h2d"].to_numpy(dtype=float)
    step = steps["step_s"].to_numpy(dtype=float)
    compute = steps["compute"].to_numpy(dtype=float)
    for name, arr in (("input_work_s", work), ("exposed input", exposed), ("step_s", step)):
        if not np.all(np.isfinite(arr)) or np.any(arr < 0):
            raise ParameterError(f"{name} holds a negative or non-finite time: {arr[:5].tolist()}...")
    if np.any(step <= 0):
        raise ParameterError("a step took 0 s: the clock is too coarse or the table is wrong")
    med_work, med_exposed, med_step = _median(work), _median(exposed), _median(step)
    ratio = med_exposed / med_work if med_work > 0 else math.inf
    hidden = min(1.0, max(0.0, 1.0 - ratio)) if math.isfinite(ratio) else 0.0
    # the spread of exposed_fraction is that of its own statistic: each step's exposed input over the median step
    p25, p75 = (float(q) for q in np.quantile(exposed / med_step, [0.25, 0.75]))
    return OverlapStats(
        steps=n, median_input_work_s=med_work, median_exposed_s=med_exposed, median_compute_s=_median(compute),
        median_step_s=med_step, exposed_fraction=med_exposed / med_step, hidden_fraction=hidden,
        exposed_over_work=ratio, exposed_fraction_per_step=_median(exposed / step),
        input_work_s=float(work.sum()), exposed_input_s=float(exposed.sum()), step_s=float(step.sum()),
        compute_s=float(compute.sum()), exposed_fraction_p25=p25, exposed_fraction_p75=p75,
    )


def timeline_frame(phases: "pd.DataFrame", batches: "pd.DataFrame", *, skip: int,
                   copies: "pd.DataFrame | None" = None, max_steps: int | None = None) -> "pd.DataFrame":
    """One table of spans for a Gantt chart: worker preparation, copies, data wait and compute.

    Everything is put on one clock: seconds since the start of the first
    measured step. The phase table's times are relative to its first phase;
    its absolute start is recovered from the batch log (the first measured
    step's data phase ends when its batch was returned: ``return_s`` of batch
    ``skip``), to within one synchronize.

    Parameters
    ----------
    phases : pandas.DataFrame
        :attr:`helpers.compute.train.TrainRun.phases` (``step``, ``phase``,
        ``start_s``, ``duration_s``).
    batches : pandas.DataFrame
        :meth:`RecordingLoader.frame` of the loader the loop consumed.
    skip : int
        Warm-up steps (batches consumed before the measured steps).
    copies : pandas.DataFrame, optional
        :meth:`DevicePrefetcher.copy_frame`; when given, its copies form the
        ``copy`` row (else the ``h2d`` phase does).
    max_steps : int, optional
        Keep only spans that start before the end of this many measured steps.

    Returns
    -------
    pandas.DataFrame
        ``row`` (str: ``"worker N prep"`` / ``"main process prep"``, ``"copy"``,
        ``"data wait"``, ``"compute"``), ``kind`` (``"prep"``, ``"copy"``,
        ``"data"``, ``"compute"``), ``start_s``, ``duration_s`` (seconds),
        ``batch`` (int or -1).
    """
    if len(batches) <= skip:
        raise ParameterError(f"the batch log has {len(batches)} rows; need more than skip={skip}")
    first = phases[(phases["step"] == phases["step"].min()) & (phases["phase"] == "data")]
    data_dur = float(first["duration_s"].iloc[0]) if len(first) else 0.0
    origin = float(batches["return_s"].iloc[skip]) - data_dur
    rows = []
    for _, r in phases.iterrows():
        if r["phase"] == "data":
            rows.append(("data wait", "data", float(r["start_s"]), float(r["duration_s"]), int(r["step"])))
        elif r["phase"] == "compute":
            rows.append(("compute", "compute", float(r["start_s"]), float(r["duration_s"]), int(r["step"])))
        elif r["phase"] == "h2d" and copies is None:
            rows.append(("copy", "copy", float(r["start_s"]), float(r["duration_s"]), int(r["step"])))
    if copies is not None:
        for _, c in copies.iterrows():
            rows.append(("copy", "copy", float(c["start_s"]) - origin, float(c["duration_s"]),
                         int(c["index"]) - skip))
    if "prep_start_s" in batches:
        for i, b in batches.iterrows():
            worker = int(b["worker"]) if "worker" in b and not pd.isna(b.get("worker")) else -1
            label = f"worker {worker} prep" if worker >= 0 else "main process prep"
            rows.append((label, "prep", float(b["prep_start_s"]) - origin,
                         float(b["prep_end_s"]) - float(b["prep_start_s"]), int(b["order"]) - skip))
    out = pd.DataFrame(rows, columns=["row", "kind", "start_s", "duration_s", "batch"])
    if max_steps is not None and len(phases):
        steps = sorted(phases["step"].unique())[:max_steps]
        sub = phases[phases["step"].isin(steps)]
        end = float((sub["start_s"] + sub["duration_s"]).max())
        out = out[(out["start_s"] < end) & (out["start_s"] + out["duration_s"] > -end)]
    return out.reset_index(drop=True)


# --------------------------------------------------------------------------- the experiment


def choose_threads(num_workers: int, cores: int | None = None) -> dict[str, Any]:
    """Split the CPU cores between the training step's torch threads and the DataLoader workers.

    Each worker process decodes with its own threads while the main process
    computes with torch's intra-op threads. When both together ask for more
    threads than there are cores, they take turns on the same cores: the
    input no longer runs *beside* the compute but steals from it, which is
    what the overlap was meant to avoid. So each worker gets one decode
    thread and the step keeps the remaining cores (at least one).

    Parameters
    ----------
    num_workers : int
        DataLoader worker processes (>= 0).
    cores : int, optional
        Usable cores; default :func:`helpers.pipeline.loader.usable_cores`.

    Returns
    -------
    dict
        ``torch_threads`` (for ``torch.set_num_threads`` in the main process),
        ``decode_threads`` (per process that decodes), ``cores`` and
        ``reason`` (a sentence).
    """
    cores = int(cores or usable_cores())
    if num_workers <= 0:
        return {"torch_threads": cores, "decode_threads": cores, "cores": cores,
                "reason": f"no workers: the main process decodes and computes in turn, each with all {cores} cores"}
    torch_threads = max(1, cores - num_workers)
    over = num_workers + torch_threads > cores
    reason = (f"{num_workers} worker(s) with 1 decode thread each, the training step with {torch_threads} torch "
              f"thread(s), on {cores} core(s)" + ("; more threads than cores: they will share" if over else
                                                   ": one core per thread, so input and compute do not compete"))
    return {"torch_threads": torch_threads, "decode_threads": 1, "cores": cores, "reason": reason}


def thread_splits(num_workers: int, cores: int | None = None, *, is_cpu: bool = True) -> list[dict[str, Any]]:
    """The ways to share the cores between the step and the workers that notebook 05 measures.

    Which is faster depends on how busy a worker is: a worker that needs a
    quarter of a core wastes most of a dedicated one, while a busy worker
    slows down every parallel region of the step it shares cores with. So
    on a CPU both are run and the faster one is kept (:func:`fastest`):

    - ``"1 core per worker"``: :func:`choose_threads`;
    - ``"all cores to torch"``: torch keeps one thread per core, each worker
      decodes with one thread beside it (the operating system shares).

    On an accelerator the step runs on the device, and only the first is used.

    Parameters
    ----------
    num_workers : int
    cores : int, optional
        Usable cores; default :func:`helpers.pipeline.loader.usable_cores`.
    is_cpu : bool, default True
        Whether the step runs on the CPU.

    Returns
    -------
    list of dict
        Each ``label``, ``torch_threads``, ``decode_threads``, ``reason``; one
        entry when the two splits coincide (no workers, or not a CPU).
    """
    first = choose_threads(num_workers, cores)
    out = [{"label": "1 core per worker", **{k: first[k] for k in ("torch_threads", "decode_threads", "reason")}}]
    if is_cpu and num_workers > 0 and first["torch_threads"] < first["cores"]:
        out.append({"label": "all cores to torch", "torch_threads": first["cores"], "decode_threads": 1,
                    "reason": f"{num_workers} worker(s) with 1 decode thread each beside {first['cores']} torch "
                              f"threads on {first['cores']} core(s): the operating system shares the cores"})
    return out


def fastest(runs: Sequence["OverlapRun"]) -> "OverlapRun":
    """The run with the shortest median step time.

    Raises
    ------
    ParameterError
        If ``runs`` is empty.
    """
    if not runs:
        raise ParameterError("fastest() needs at least one run")
    return min(runs, key=lambda r: r.stats.median_step_s)


def compute_thread_scaling(job: Job, acc: Accelerator, *, threads: Sequence[int], repeats: int = 3,
                           warmup: int = 1) -> pd.DataFrame:
    """Time the job's training step alone (synthetic batch, no input pipeline) at several torch thread counts.

    What a worker process costs the step on a small CPU: each core given to
    a worker is taken from torch's intra-op threads. Each count is timed with
    :func:`helpers.timing.measure` (device-synchronized); the previous
    ``torch.get_num_threads()`` is restored.

    Parameters
    ----------
    job : helpers.jobs.base.Job
        The workload (batch, crop, model) and its step. A job that makes a synthetic batch of its shapes (the
        built-in job: :meth:`helpers.jobs.base.Job.synthetic_batch`) is timed on it; any other job on its first
        real batch, already on the device.
    acc : helpers.device.Accelerator
    threads : sequence of int
        Thread counts to time (each >= 1).
    repeats, warmup : int

    Returns
    -------
    pandas.DataFrame
        ``torch_threads``, ``median_s``, ``p25_s``, ``p75_s`` (seconds per step).

    Raises
    ------
    ParameterError
        For a thread count < 1 or an empty list.
    """
    counts = [int(t) for t in threads]
    if not counts or any(t < 1 for t in counts):
        raise ParameterError(f"threads must be a non-empty list of counts >= 1, got {list(threads)!r}")
    batch = job.synthetic_batch(acc, seed=job.workload.seed)
    if batch is None:  # a user's job: its first real batch, on the device
        batch = fixed_batches(job, acc, 1)[0]
    previous = torch.get_num_threads()
    rows = []
    try:
        for t in counts:
            torch.set_num_threads(t)
            step = job.make_step(job.make_model(acc), acc)
            m = measure(lambda: step(batch), repeats=repeats, warmup=warmup, sync=acc.synchronize,
                        name=f"{t} thread(s)")
            rows.append({"torch_threads": t, "median_s": m.median_s, "p25_s": m.p25_s, "p75_s": m.p75_s})
    finally:
        torch.set_num_threads(previous)
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class OverlapRun:
    """One timed training run of notebook 05 and everything measured about it.

    Attributes
    ----------
    label : str
        Variant name, e.g. ``"before: num_workers=0, synchronous"``.
    run : helpers.compute.train.TrainRun
        Phases and steps (seconds).
    batches : pandas.DataFrame
        :meth:`RecordingLoader.frame` (one row per batch consumed).
    copies : pandas.DataFrame or None
        :meth:`DevicePrefetcher.copy_frame`, or None without a prefetcher
        (the copy is then the ``h2d`` phase).
    stats : OverlapStats
    settings : dict
        ``num_workers``, ``prefetch_factor``, ``prefetcher``, ``side_stream``,
        ``pin_memory``, ``torch_threads``, ``decode_threads``, ``batch_size``,
        ``steps``, ``warmup_steps``, ``batches_per_epoch`` (full batches the
        data gives per epoch), ``cores`` (usable CPU cores) and
        ``step_on_cpu`` (bool).
    """

    label: str
    run: Any
    batches: Any
    copies: Any
    stats: OverlapStats
    settings: dict

    def timeline(self, max_steps: int | None = 8) -> "pd.DataFrame":
        """Spans for :func:`helpers.workbook.plots_transfer.overlap_timeline` (see :func:`timeline_frame`)."""
        return timeline_frame(self.run.phases, self.batches, skip=self.run.warmup_steps, copies=self.copies,
                              max_steps=max_steps)


def run_overlap_variant(job: Job, acc: Accelerator, *, label: str, steps: int, warmup_steps: int,
                        num_workers: int, prefetch_factor: int = 2, prefetcher: bool = True,
                        torch_threads: int | None = None, decode_threads: int | None = None,
                        timeout_s: float = 120.0, input_work_s: Sequence[float] | None = None,
                        progress: Progress | None = None) -> OverlapRun:
    """Train the job with one input-pipeline setting and measure the overlap.

    The job's dataset (the built-in job's batched pipeline; a user's job's own dataset) feeds a DataLoader
    built from one :class:`helpers.pipeline.loader.LoaderConfig`; with ``prefetcher`` the
    loader is wrapped in a :class:`helpers.pipeline.prefetch.DevicePrefetcher`.
    The model is built from the workload's seed, so every variant starts from
    the same weights and sees the same batches. The phases are timed by the
    one training loop (:class:`helpers.compute.train.TimedLoop`) through
    :class:`helpers.pipeline.prefetch.ConsumerStreamSync` (see there why).

    Parameters
    ----------
    job : helpers.jobs.base.Job
    acc : helpers.device.Accelerator
    label : str
    steps, warmup_steps : int
        Measured and warm-up steps.
    num_workers, prefetch_factor : int
        Loader workers (0: in the main process) and batches each prepares ahead.
        Workers persist across epochs.
    prefetcher : bool, default True
        Wrap the loader in a DevicePrefetcher; False transfers in the ``h2d`` phase (synchronous).
    torch_threads, decode_threads : int, optional
        Default from :func:`choose_threads`. ``torch.set_num_threads`` is restored afterwards.
    timeout_s : float
        Loader timeout: a hung worker becomes an error (Optimization-AI/LibAUC#60,
        pytorch/pytorch#47445).
    input_work_s : sequence of float, optional
        Input work per measured step, seconds, for a job whose batches do not say how long they took to
        prepare (a user's job: no ``prep_s``). Default for such a job: this run's own exposed input (data +
        h2d), which is the whole input work only when nothing overlaps (``num_workers=0``, no prefetcher);
        :func:`run_overlap` passes the synchronous run's to the overlapped ones.
    progress : callable, optional
        ``progress(done, warmup_steps + steps)`` after each step, warm-up included (outside the step's timing;
        :meth:`helpers.compute.train.TimedLoop.run`), e.g. a "try it" panel's progress bar.

    Returns
    -------
    OverlapRun

    Raises
    ------
    ParameterError
        A job without ``prep_s`` in its batches, overlapped, and no ``input_work_s``.
    """
    w = job.workload
    split = choose_threads(num_workers)
    torch_threads = int(torch_threads or split["torch_threads"])
    decode_threads = int(decode_threads or split["decode_threads"])
    pin = bool(acc.capabilities.pinned_memory.available)
    dataset, decode_threads, sampler, loader = _variant_loader(
        job, acc, num_workers=num_workers, prefetch_factor=prefetch_factor, decode_threads=decode_threads, pin=pin,
        timeout_s=timeout_s)
    move = lambda batch, acc, non_blocking=False: job.to_device(batch, acc, non_blocking=non_blocking)  # noqa: E731
    source = DevicePrefetcher(loader, acc, transfer=move) if prefetcher else None
    recorder = RecordingLoader(source if source is not None else loader)
    to_device = prefetched if source is not None else move
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(torch_threads)
    try:
        run = _timed_run(job, acc, recorder, [dataset, sampler], to_device, pin=pin, steps=steps,
                         warmup_steps=warmup_steps, progress=progress)
    finally:
        torch.set_num_threads(previous_threads)
        close_loader(loader)
        close_dataset(dataset)
    batches = recorder.frame()
    copies = source.copy_frame() if source is not None else None
    work, work_from = _input_work(label, batches, run, copies, steps=steps, warmup_steps=warmup_steps,
                                  input_work_s=input_work_s, synchronous=num_workers == 0 and not prefetcher)
    stats = overlap_stats(run.steps, work)
    settings = {"num_workers": num_workers, "prefetch_factor": prefetch_factor if num_workers > 0 else None,
                "prefetcher": bool(prefetcher), "side_stream": bool(source is not None and source.uses_side_stream),
                "pin_memory": pin, "torch_threads": torch_threads, "decode_threads": decode_threads,
                "batch_size": w.batch_size, "steps": steps, "warmup_steps": warmup_steps,
                "batches_per_epoch": len(dataset) // w.batch_size, "cores": split["cores"],
                "step_on_cpu": acc.is_cpu, "input_work_from": work_from}
    logger.info("%s: exposed %.1f%% of the step, %.0f%% of the input hidden", label,
                100 * stats.exposed_fraction, 100 * stats.hidden_fraction)
    return OverlapRun(label=label, run=run, batches=batches, copies=copies, stats=stats, settings=settings)


def _variant_loader(job: Job, acc: Accelerator, *, num_workers: int, prefetch_factor: int, decode_threads: int,
                    pin: bool, timeout_s: float) -> tuple[Any, int, Any, Any]:
    """The job's dataset and its DataLoader for one variant: ``(dataset, decode_threads, sampler, loader)``."""
    w = job.workload
    if "batched" in job.pipelines:
        dataset = job.make_dataset("batched", threads=decode_threads, pin_memory=pin and num_workers == 0)
    else:  # a user's dataset: it decodes in its own way, with no thread pool of the workbook's
        dataset, decode_threads = job.make_dataset(job.pipelines[0]), 0
    config = LoaderConfig(batch_size=w.batch_size, num_workers=num_workers,
                          prefetch_factor=prefetch_factor if num_workers > 0 else None,
                          persistent_workers=num_workers > 0, pin_memory=pin and num_workers > 0,
                          timeout_s=timeout_s, seed=w.seed)
    sampler = job.batch_sampler(len(dataset))
    return dataset, decode_threads, sampler, job.make_loader(dataset, config, acc, batch_sampler=sampler)


def _timed_run(job: Job, acc: Accelerator, recorder: RecordingLoader, datasets: list, to_device: Any, *, pin: bool,
               steps: int, warmup_steps: int, progress: Progress | None) -> Any:
    """``warmup_steps`` untimed then ``steps`` timed steps on ``recorder``'s batches: the TrainRun (seconds)."""
    step = job.make_step(job.make_model(acc), acc)
    loop = TimedLoop(epochs(recorder, datasets=datasets),
                     lambda batch: to_device(batch, acc, non_blocking=pin), step,
                     ConsumerStreamSync(acc).synchronize)
    total = int(warmup_steps) + int(steps)

    def tick(offset: int):  # TimedLoop.run counts each block from 1; the caller sees one count over both
        return None if progress is None else (lambda done, _block: progress(offset + done, total))

    return (loop.run(warmup_steps, measured=False, progress=tick(0)).discard()
            .run(steps, progress=tick(int(warmup_steps))).result())


def _input_work(label: str, batches: pd.DataFrame, run: Any, copies: pd.DataFrame | None, *, steps: int,
                warmup_steps: int, input_work_s: Sequence[float] | None, synchronous: bool) -> tuple[list, str]:
    """Input work per measured step (seconds), and where it came from (the settings' ``input_work_from``)."""
    copy_s = copies["duration_s"].tolist() if copies is not None else run.steps["h2d"].tolist()
    if "prep_s" in batches:
        return (input_work_per_step(batches, skip=warmup_steps, steps=steps, copy_s=copy_s),
                "each batch's preparation time (prep_s) plus its copy")
    from_synchronous = ("the synchronous run's exposed input per step (data + h2d): the job's "
                        "batches do not time their own preparation")
    if input_work_s is not None:
        return list(input_work_s)[:steps], from_synchronous
    if synchronous:
        return (run.steps["data"] + run.steps["h2d"]).tolist(), from_synchronous
    raise ParameterError(f"{label}: the job's batches carry no prep_s, so the input work of an overlapped run "
                         "cannot be read from it; pass input_work_s (the synchronous run's data + h2d)")


@dataclass(frozen=True)
class OverlapResult:
    """Notebook 05's comparison: the job before and after overlapping its input.

    Attributes
    ----------
    before : OverlapRun
        ``num_workers=0``, synchronous copy.
    candidates : tuple of OverlapRun
        The overlapped job with each thread split of :func:`thread_splits`.
    after : OverlapRun
        The fastest candidate (shortest median step).
    verdict : dict
        :func:`overlap_decision` of before vs after.
    """

    before: OverlapRun
    candidates: tuple[OverlapRun, ...]
    after: OverlapRun
    verdict: dict

    @property
    def variants(self) -> tuple[OverlapRun, ...]:
        """Before, then every candidate."""
        return (self.before, *self.candidates)


def run_overlap(job: Job, acc: Accelerator, *, steps: int, warmup_steps: int, num_workers: int,
                prefetch_factor: int = 2, cores: int | None = None) -> OverlapResult:
    """Run notebook 05's experiment: *before*, then *after* with each thread split, and the verdict.

    Parameters
    ----------
    job : helpers.jobs.base.Job
        The built-in job (batched pipeline, per-batch preparation times) or a user's (its own dataset; input
        work per step taken from the synchronous run, see :func:`run_overlap_variant`)
    acc : helpers.device.Accelerator
    steps, warmup_steps : int
        Measured and warm-up steps per variant.
    num_workers, prefetch_factor : int
        The overlapped variant's loader workers and batches each prepares ahead.
    cores : int, optional
        Usable CPU cores (default :func:`helpers.device.usable_cores`).

    Returns
    -------
    OverlapResult
    """
    common = dict(steps=steps, warmup_steps=warmup_steps)
    before = run_overlap_variant(job, acc, label="before", num_workers=0, prefetcher=False, **common)
    if before.batches is not None and "prep_s" not in before.batches:  # a user's job: the serial run gives its input work
        common["input_work_s"] = (before.run.steps["data"] + before.run.steps["h2d"]).tolist()
    candidates = tuple(
        run_overlap_variant(job, acc, label=f"after, {split['label']}", num_workers=num_workers,
                            prefetch_factor=prefetch_factor, prefetcher=True, torch_threads=split["torch_threads"],
                            decode_threads=split["decode_threads"], **common)
        for split in thread_splits(num_workers, cores, is_cpu=acc.is_cpu))
    after = fastest(candidates)
    return OverlapResult(before, candidates, after, overlap_decision(before, after, seed=job.workload.seed))


#: Notebook whose workload notebook 05 is compared with.
BASELINE_NOTEBOOK = checklist.BASELINE


def baseline_workload(results_path: "str | Path | None" = None) -> tuple[dict[str, int], str]:
    """Notebook 01's workload, to say how notebook 05's model and batch compare with it.

    Parameters
    ----------
    results_path : str or Path, optional
        A results file (JSON lines). When it holds records of notebook 01,
        the parameters of its latest record are used (that is the run the
        report shows beside notebook 05's); otherwise notebook 01's defaults
        (:func:`helpers.experiments.registry.spec_for`).

    Returns
    -------
    (dict, str)
        ``{name: value}`` for :data:`WORKLOAD_PARAMS`, and where it came from:
        ``"notebook 01's run in this results file"`` or ``"notebook 01's
        defaults"``.
    """
    values = {p.name: p.default for p in registry.spec_for(BASELINE_NOTEBOOK) if p.name in WORKLOAD_PARAMS}
    source = "notebook 01's defaults"
    if results_path:
        try:
            df = load_results(results_path)
        except DataError as exc:  # an unreadable file only costs the comparison its precision
            logger.info("results file %s not read (%s); using notebook 01's defaults", results_path, exc)
            df = None
        if df is not None and len(df) and "notebook" in df:
            rows = df[df["notebook"] == BASELINE_NOTEBOOK]
            params = rows["parameters"].iloc[-1] if len(rows) else None
            if isinstance(params, dict) and all(k in params for k in WORKLOAD_PARAMS):
                values = {k: int(params[k]) for k in WORKLOAD_PARAMS}
                source = "notebook 01's run in this results file"
    return values, source


#: Floor applied to per-step exposed times before forming a ratio, seconds: below the
#: resolution that matters for a step (and time.perf_counter's own), and it keeps a
#: fully hidden input (0 s exposed) from dividing by zero.
EXPOSED_FLOOR_S = 1e-6


#: Batches per epoch below which the refill at each epoch start is worth a note: the first batch
#: of every epoch is prepared while the loop waits, so 1 step in N cannot be hidden (10%+ of the steps).
FEW_BATCHES_PER_EPOCH = 10
#: Exposed share of the step, before any overlap, below which there is nothing worth hiding (2%).
NOTHING_TO_HIDE = 0.02


def _interval(c: Any) -> str:
    """``"1.23x, 95% CI 1.01-1.50"`` for a :class:`helpers.timing.Comparison`."""
    return f"{c.ratio:.2f}x, {c.confidence:.0%} CI {c.ci_low:.2f}-{c.ci_high:.2f}"


def overlap_limits(before: OverlapRun, after: OverlapRun, *, compute: Any = None) -> list[str]:
    """Why the overlap of *after* could not hide (all of) the input: one sentence per cause found.

    The causes checked, from the runs' settings and medians:

    - the data gives one batch per epoch (``batches_per_epoch`` 1): a
      DataLoader and a :class:`DevicePrefetcher` start each epoch empty (they
      do not prepare the next epoch's batches ahead), so every batch is
      prepared while the loop waits; with few batches per epoch (fewer than
      :data:`FEW_BATCHES_PER_EPOCH`), one step in N waits this way;
    - nothing runs beside the step: no worker process and no side stream;
    - the workers took CPU from the step: its compute got measurably slower
      (``compute``'s interval lies below 1);
    - the input work per step is longer than what the workers can prepare
      during the step's compute (``num_workers`` x compute);
    - the input was already hidden before (exposed < :data:`NOTHING_TO_HIDE`
      of the step).

    Parameters
    ----------
    before, after : OverlapRun
        As for :func:`overlap_decision`; read ``settings`` (``num_workers``,
        ``side_stream``, ``batches_per_epoch``, ``torch_threads``, ``cores``,
        ``step_on_cpu``; missing keys skip their check) and ``stats``.
    compute : helpers.timing.Comparison, optional
        Compute time per step, before (A) vs after (B); None skips the check
        for stolen cores.

    Returns
    -------
    list of str
        Empty when none of the causes applies.
    """
    notes = []
    s_after, s_before = after.settings, before.settings
    workers = int(s_after.get("num_workers") or 0)
    per_epoch = s_after.get("batches_per_epoch")
    if per_epoch is not None and per_epoch <= 1:
        notes.append(f"the data gives {per_epoch} batch per epoch, so there is nothing to prefetch: a DataLoader "
                     "and the prefetcher start every epoch empty (they do not prepare the next epoch's batches "
                     "ahead), so each batch is prepared while the loop waits; lower batch_size or add images so "
                     "that an epoch holds several batches")
    elif per_epoch is not None and per_epoch < FEW_BATCHES_PER_EPOCH:
        notes.append(f"the data gives only {per_epoch} batches per epoch: the first batch of every epoch (1 step "
                     f"in {per_epoch}) is prepared while the loop waits, because loaders do not prefetch across "
                     "epochs")
    if workers == 0 and not s_after.get("side_stream"):
        notes.append("nothing runs beside the step: with num_workers=0 the batch is prepared in the training "
                     "process, and without a side stream (no accelerator) the copy is synchronous")
    if compute is not None and compute.ci_high < 1.0 and workers > 0:
        cores = s_after.get("cores")
        where = (f"{workers} worker(s) beside {s_after.get('torch_threads', '?')} torch thread(s) on {cores} "
                 f"core(s)" if cores else f"{workers} worker(s)")
        notes.append(f"the worker(s) cost the step CPU time: its compute went from "
                     f"{before.stats.median_compute_s * 1e3:.1f} to {after.stats.median_compute_s * 1e3:.1f} ms "
                     f"(before/after {_interval(compute)}) with {where}")
    work, comp = after.stats.median_input_work_s, after.stats.median_compute_s
    if workers > 0 and work > workers * comp:
        notes.append(f"the input work per step ({work * 1e3:.1f} ms) is longer than what {workers} worker(s) can "
                     f"prepare during the step's compute ({workers} x {comp * 1e3:.1f} ms): at most that much can "
                     "be hidden; make the input cheaper (notebook 02), add workers, or train a larger model")
    if before.stats.exposed_fraction < NOTHING_TO_HIDE:
        notes.append(f"the input was already nearly hidden before ({before.stats.exposed_fraction:.1%} of the "
                     "step): there was little to gain")
    return notes


def overlap_decision(before: OverlapRun, after: OverlapRun, *, seed: int = 0) -> dict[str, Any]:
    """Decide whether to enable the overlap, from two runs of :func:`run_overlap_variant`.

    "enable" when the exposed input time per step dropped measurably (the
    95% bootstrap interval of median(before) / median(after) lies above 1)
    and the step did not get measurably slower (the interval of the step
    times' ratio does not lie below 1); "leave off" otherwise, with the
    reason. On a small CPU the cores given to workers are taken from the
    step, so a drop in exposure alone is not enough. The reason always shows
    the interval of the exposed input's ratio, and, when the overlap did not
    work, the causes :func:`overlap_limits` found.

    Parameters
    ----------
    before, after : OverlapRun
    seed : int
        Seed of the bootstraps.

    Returns
    -------
    dict
        ``recommendation``, ``reason`` (a sentence with the numbers),
        ``exposed``, ``step`` and ``compute`` (:class:`helpers.timing.Comparison`
        per step: before as A, after as B; ratio > 1 means after is shorter),
        ``dropped`` and ``slower`` (bool), ``notes`` (list of str, from
        :func:`overlap_limits`; empty when nothing limited the overlap).
    """
    def exposed(v: OverlapRun) -> tuple[float, ...]:
        per_step = (v.run.steps["data"] + v.run.steps["h2d"]).to_numpy(dtype=float)
        return tuple(np.maximum(per_step, EXPOSED_FLOOR_S))

    def per_step(v: OverlapRun, column: str) -> tuple[float, ...]:
        return tuple(np.maximum(v.run.steps[column].to_numpy(dtype=float), EXPOSED_FLOOR_S))

    exposed_cmp = Comparison.from_measurements(Measurement("before", exposed(before), warmup=0),
                                               Measurement("after", exposed(after), warmup=0), seed=seed)
    step_cmp = Comparison.from_measurements(Measurement("before", per_step(before, "step_s"), warmup=0),
                                            Measurement("after", per_step(after, "step_s"), warmup=0), seed=seed)
    compute_cmp = Comparison.from_measurements(Measurement("before", per_step(before, "compute"), warmup=0),
                                               Measurement("after", per_step(after, "compute"), warmup=0),
                                               seed=seed)
    dropped = exposed_cmp.ci_low > 1.0
    slower = step_cmp.ci_high < 1.0
    b, a = before.stats, after.stats
    workers = after.settings.get("num_workers", "?")
    numbers = (f"exposed input {b.exposed_fraction:.0%} -> {a.exposed_fraction:.0%} of the step "
               f"({b.median_exposed_s * 1e3:.1f} -> {a.median_exposed_s * 1e3:.1f} ms, before/after "
               f"{_interval(exposed_cmp)}), {a.hidden_fraction:.0%} of the input work hidden behind compute, "
               f"step {b.median_step_s * 1e3:.0f} -> {a.median_step_s * 1e3:.0f} ms (before/after "
               f"{_interval(step_cmp)}); medians of {a.steps} steps")
    notes = overlap_limits(before, after, compute=compute_cmp)
    why = ("; why: " + "; ".join(notes)) if notes else ""
    if dropped and not slower:
        recommendation = "enable"
        reason = f"{workers} worker(s) plus the prefetcher: {numbers}" + (
            f"; what still limits it: {'; '.join(notes)}" if notes else "")
    elif dropped:
        recommendation = "leave off"
        reason = (f"the input is hidden ({numbers}), but the step got slower: the cores given to the worker(s) "
                  "cost the compute more than the hidden input saved" + why)
    else:
        recommendation = "leave off"
        direction = ("it rose measurably (the interval lies below 1)" if exposed_cmp.ci_high < 1.0
                     else "the interval includes 1")
        if not notes:
            why = ("; none of the known causes (one batch per epoch, workers taking the cores, input longer than "
                   "the compute) was found: with few steps the interval is wide, so run more steps")
        reason = f"no measurable drop in exposed input ({direction}): {numbers}" + why
    action = Action("prefetcher", recommendation == "enable",
                    f"overlapped input (worker/stream prefetch): {recommendation}", current=False)
    return {"recommendation": recommendation, "reason": reason, "exposed": exposed_cmp, "step": step_cmp,
            "compute": compute_cmp, "dropped": dropped, "slower": slower, "notes": notes, "action": action}


# --------------------------------------------------------------------------- the benchmark


def overlap_bench(*, data_dir: str | None = None, max_images: int = 0, batch_size: int = DEFAULT.batch_size,
                  image_size: int = DEFAULT.image_size, text_len: int = DEFAULT.text_len, model_width: int = 32,
                  d_model: int = DEFAULT.d_model, steps: int = 20,
                  warmup_steps: int = 3, num_workers: int = 1, prefetch_factor: int = 2, seed: int = 0,
                  device: str = "cpu", prepared: tuple | None = None) -> dict:
    """The ``exposed_input_fraction`` of ``python -m helpers bench input-pipeline``.

    Trains the workload twice on the batched pipeline: *before* (the loader
    in the main process, the copy in the step: ``num_workers=0``, no
    prefetcher) and *after* (``num_workers`` worker processes and the
    :class:`DevicePrefetcher`, with each thread split of
    :func:`thread_splits`, keeping the fastest, as notebook 05 does). The
    defaults are notebook 05's quick profile; the compute per step is chosen
    (``model_width``) to be at least the input work per step, and both are
    reported so that this can be checked.

    Parameters
    ----------
    data_dir : str, optional
        Folder of images; None or "" for the embedded dataset.
    max_images, batch_size, image_size, text_len, model_width, d_model, steps, warmup_steps, num_workers,
    prefetch_factor, seed
        As notebook 05's parameters.
    device : str, default "cpu"
        Device kind (``helpers.device.get_accelerator``).
    prepared : (DatasetIndex, tokenizers.Tokenizer), optional
        Data already loaded by :func:`helpers.pipeline.prepare.prepare_data`
        (so a caller running several benchmarks scans the folder once).

    Returns
    -------
    dict
        ``exposed_input_fraction`` (after: median exposed input / median step
        time), ``exposed_input_fraction_before``, ``hidden_fraction`` (after:
        1 - median exposed / median input work), ``input_time_s`` and
        ``compute_time_s`` (after: medians per step, seconds),
        ``step_time_s_before`` / ``step_time_s_after`` (medians),
        ``after_variant`` (the thread split kept), ``step_time_s_candidates``
        (median step time of each split), ``num_workers``,
        ``torch_threads``, ``decode_threads``, ``cores``, ``steps``,
        ``batches_per_epoch``, ``statistic`` (what the figures are),
        ``recommendation`` and ``exposed_reduction`` (``ratio``, ``ci_low``,
        ``ci_high``, ``confidence``: exposed input before / after) from
        :func:`overlap_decision`, ``note`` (why the overlap could not work,
        from :func:`overlap_limits`; None when nothing limited it) and
        ``device``.

    Raises
    ------
    helpers.errors.DataError
        If the dataset holds fewer images than one batch.
    """
    acc = get_accelerator(device)
    workload = Workload(batch_size=batch_size, image_size=image_size, text_len=text_len, model_width=model_width,
                        d_model=d_model, seed=seed)
    job = (PPOJob(*prepared, workload) if prepared is not None
           else PPOJob.from_data(workload, data_dir, max_images=max_images))
    result = run_overlap(job, acc, steps=steps, warmup_steps=warmup_steps, num_workers=num_workers,
                         prefetch_factor=prefetch_factor)
    return _bench_figures(result, num_workers=num_workers, steps=steps, device=acc.kind)


def _bench_figures(result: OverlapResult, *, num_workers: int, steps: int, device: str) -> dict:
    """:func:`overlap_bench`'s figures from notebook 05's comparison (seconds, and fractions of the step)."""
    before, candidates, after, verdict = result.before, result.candidates, result.after, result.verdict
    return {
        "exposed_input_fraction": after.stats.exposed_fraction,
        "exposed_input_fraction_before": before.stats.exposed_fraction,
        "hidden_fraction": after.stats.hidden_fraction,
        "input_time_s": after.stats.median_input_work_s,
        "compute_time_s": after.stats.median_compute_s,
        "step_time_s_before": before.stats.median_step_s,
        "step_time_s_after": after.stats.median_step_s,
        "after_variant": after.label,
        "step_time_s_candidates": {r.label: r.stats.median_step_s for r in candidates},
        "num_workers": num_workers,
        "torch_threads": after.settings["torch_threads"],
        "decode_threads": after.settings["decode_threads"],
        "cores": choose_threads(num_workers)["cores"],
        "steps": steps,
        "batches_per_epoch": after.settings["batches_per_epoch"],
        "statistic": "medians over the measured steps; fractions are ratios of those medians",
        "recommendation": verdict["recommendation"],
        "exposed_reduction": {"ratio": verdict["exposed"].ratio, "ci_low": verdict["exposed"].ci_low,
                              "ci_high": verdict["exposed"].ci_high, "confidence": verdict["exposed"].confidence},
        "note": "; ".join(verdict["notes"]) or None,
        "device": device,
    }


#: Notebook whose verdict :func:`verdict` gives.
NOTEBOOK = "05_stream_overlap"


def verdict(result: OverlapResult, *, context: str, model_width_01: int) -> Verdict:
    """Notebook 05's verdict as a :class:`helpers.verdict.Verdict` (the decision is :func:`overlap_decision`'s).

    Parameters
    ----------
    result : OverlapResult
        :func:`run_overlap`'s comparison.
    context : str
        What was measured, in one sentence.
    model_width_01 : int
        Notebook 01's model width, recorded beside this notebook's so the report can compare the jobs.

    Returns
    -------
    helpers.verdict.Verdict
        metric ``exposed_input_fraction`` after the overlap (fraction: median exposed input / median step), with
        the quartiles of the same statistic (:attr:`OverlapStats.exposed_fraction_p25` and ``_p75``: the per-step
        exposed input over the median step), so that the value lies inside its spread; ``extra``: ``before``,
        ``hidden_fraction``, ``input_time_s``, ``compute_time_s`` (seconds per step, medians), ``notes``,
        ``model_width_01``.
    """
    v, a, b = result.verdict, result.after.stats, result.before.stats
    return Verdict(notebook=NOTEBOOK, metric="exposed_input_fraction", value=a.exposed_fraction, unit="fraction",
                   repeats=a.steps, recommendation=v["recommendation"], reason=v["reason"], context=context,
                   action=v["action"], spread={"p25": a.exposed_fraction_p25, "p75": a.exposed_fraction_p75},
                   extra={"before": b.exposed_fraction, "hidden_fraction": a.hidden_fraction,
                          "input_time_s": a.median_input_work_s, "compute_time_s": a.median_compute_s,
                          "notes": v["notes"], "model_width_01": model_width_01})


# --------------------------------------------------------------------------- the "try it" panel


def live_point(v: OverlapRun, label: str) -> LivePoint:
    """One overlapped run as a "try it" point: the share of its input work hidden behind compute.

    Parameters
    ----------
    v : OverlapRun
        A run of :func:`run_overlap_variant` (notebook 05's ``result.after``, or :func:`try_overlap`'s).
    label : str
        The settings it ran at, e.g. ``"width 16, 1 worker(s), 1 core per worker"``.

    Returns
    -------
    LivePoint
        metric ``hidden_fraction``, unit ``fraction``: ``1 - median exposed input / median input work`` (the
        notebook's statistic, :func:`overlap_stats`); ``low``/``high``: the quartiles of the per-step exposed
        input over the median input work (clipped to [0, 1]). The sentence gives the compute and the input work
        per step (medians, ms), whether the compute covers the input work, and the exposed share of the step;
        ``extra``: ``compute_s``, ``input_work_s``, ``step_s`` (medians, seconds), ``exposed_fraction``,
        ``num_workers``, ``torch_threads``, ``side_stream``, ``steps``.
    """
    s = v.stats
    exposed = (v.run.steps["data"] + v.run.steps["h2d"]).to_numpy(dtype=float)
    if s.median_input_work_s > 0:
        per_step = np.clip(1.0 - exposed / s.median_input_work_s, 0.0, 1.0)
        low, high = float(np.quantile(per_step, 0.25)), float(np.quantile(per_step, 0.75))
    else:
        low = high = None
    covers = ("is long enough to hide" if s.median_compute_s >= s.median_input_work_s
              else "is too short to hide all of")
    spread = f" (IQR over steps {low:.0%}-{high:.0%})" if low is not None else ""
    sentence = (f"{label}: {s.hidden_fraction:.0%} of the input work hidden behind compute{spread}; compute "
                f"{s.median_compute_s * 1e3:.1f} ms {covers} input work {s.median_input_work_s * 1e3:.1f} ms per step; "
                f"input exposed for {s.exposed_fraction:.0%} of a {s.median_step_s * 1e3:.0f} ms step "
                f"(medians of {s.steps} steps)")
    return LivePoint(label=label, value=float(s.hidden_fraction), unit="fraction", metric="hidden_fraction",
                     low=low, high=high, sentence=sentence,
                     extra={"compute_s": s.median_compute_s, "input_work_s": s.median_input_work_s,
                            "step_s": s.median_step_s, "exposed_fraction": s.exposed_fraction,
                            "num_workers": v.settings["num_workers"], "torch_threads": v.settings["torch_threads"],
                            "side_stream": v.settings["side_stream"], "steps": s.steps})


#: The thread splits a "try it" panel can ask for (:func:`thread_splits`' labels).
SPLITS = ("1 core per worker", "all cores to torch")


def _knob(name: str, value: Any) -> Any:
    """A knob value checked against notebook 05's declaration of the parameter of that name (type and range)."""
    param = next(p for p in EXPERIMENT.spec if p.name == name)
    return coerce(param, value)


def try_overlap(job: Job, acc: Accelerator, *, num_workers: int, model_width: int | None = None,
                threads: str = SPLITS[0], prefetch_factor: int = 2, steps: int = 10, warmup_steps: int = 2,
                cores: int | None = None, progress: Progress = no_progress) -> LivePoint:
    """Notebook 05's overlapped loop again at another model width and worker count: does the overlap appear?

    The overlap can hide at most as much input work as there is compute to hide it behind: widen the model
    (more compute per step) or add workers (more input prepared at once) and the hidden share rises; narrow it
    or take the workers away and it vanishes. The run is the notebook's own *after* variant
    (:func:`run_overlap_variant`: the job's DataLoader with ``num_workers`` persistent workers and
    ``prefetch_factor``, the :class:`DevicePrefetcher`, the phase-timed loop closed by the consumer stream's
    synchronize), ``warmup_steps`` excluded, the input work of each step from its batch's ``prep_s`` plus its
    copy.

    Parameters
    ----------
    job : helpers.jobs.base.Job
        The notebook's job. The built-in :class:`helpers.jobs.ppo.PPOJob` is rebuilt at ``model_width`` on the
        same images; a user's job runs as it is (its model is its own), and its synchronous run is measured
        first, since its batches do not time their own preparation (its data + h2d phases are then the input
        work, as in the notebook).
    acc : helpers.device.Accelerator
    num_workers : int
        DataLoader worker processes, 0-256 (0: the loader runs in the training process; on a CPU nothing then
        runs beside the step).
    model_width : int, optional
        Channels of the first conv stage of the built-in job's policy, 4-512 (compute per step grows roughly
        with its square); None keeps the job's.
    threads : str
        How the CPU cores are shared between the step's torch threads and the workers, one of :data:`SPLITS`
        (:func:`thread_splits`). Where the split does not exist (no workers, one core, or the step on an
        accelerator) the first one is used and the label says so.
    prefetch_factor : int
        Batches each worker prepares ahead, 1-64.
    steps, warmup_steps : int
        Measured and excluded steps (>= 1 and >= 0).
    cores : int, optional
        Usable CPU cores (default :func:`helpers.device.usable_cores`).
    progress : callable
        ``progress(done, total)`` after each step (warm-up included; a user's job counts both runs).

    Returns
    -------
    LivePoint
        metric ``hidden_fraction`` (fraction of the input work per step hidden behind compute, 0-1), unit
        ``fraction``; see :func:`live_point`.

    Raises
    ------
    helpers.errors.ParameterError
        For a ``num_workers``, ``model_width`` or ``prefetch_factor`` outside notebook 05's ranges, a
        ``threads`` not in :data:`SPLITS`, ``steps < 1`` or ``warmup_steps < 0``, or a ``model_width`` for a
        user's job (set its model's size in its own factory instead).
    """
    num_workers = _knob("num_workers", num_workers)
    prefetch_factor = _knob("prefetch_factor", prefetch_factor)
    steps, warmup_steps = _knob("steps", steps), _knob("warmup_steps", warmup_steps)
    if threads not in SPLITS:
        raise ParameterError(f"threads={threads!r}; choose one of {', '.join(map(repr, SPLITS))}")
    if model_width is not None:
        model_width = _knob("model_width", model_width)
        job = job.with_model_width(model_width)  # a user's job: ParameterError, its factory sizes its model
    splits = thread_splits(num_workers, cores, is_cpu=acc.is_cpu)
    split = next((s for s in splits if s["label"] == threads), splits[0])
    common = dict(steps=steps, warmup_steps=warmup_steps)
    runs = 1 if job.is_builtin else 2  # the built-in job's batches time their own preparation (prep_s)
    total = runs * (warmup_steps + steps)
    if runs == 2:  # a user's job: its synchronous run's exposed input is its input work (run_overlap does the same)
        sync_run = run_overlap_variant(job, acc, label="synchronous", num_workers=0, prefetcher=False,
                                       progress=lambda done, _n: progress(done, total), **common)
        common["input_work_s"] = (sync_run.run.steps["data"] + sync_run.run.steps["h2d"]).tolist()
    offset = total - (warmup_steps + steps)
    run = run_overlap_variant(job, acc, label="try it", num_workers=num_workers, prefetch_factor=prefetch_factor,
                              prefetcher=True, torch_threads=split["torch_threads"],
                              decode_threads=split["decode_threads"],
                              progress=lambda done, _n: progress(offset + done, total), **common)
    width = f"width {job.model_width}, " if job.model_width is not None else ""
    used = split["label"] + ("" if split["label"] == threads else f" ({threads!r} does not apply here)")
    return live_point(run, f"{width}{num_workers} worker(s), {used}")


# --------------------------------------------------------------------------- the notebook's run


@dataclass(frozen=True, eq=False)
class OverlapChecks:
    """Notebook 05 before any timing (:func:`check`): the data and the prefetcher's check against synchronous copies.
    :class:`StreamOverlapResult` extends it with the measurement.

    Attributes
    ----------
    job : helpers.jobs.base.Job
        The job measured (the built-in one or the user's); the "try it" panel runs it again.
    device : str
        The accelerator's kind, e.g. ``"cpu"``.
    n_items, per_epoch : int
        Items of one epoch and the full batches it gives.
    dataset : dict
        The built-in job's ``skipped`` files and ``classes``; empty for a user's job.
    check : dict
        :func:`helpers.pipeline.prefetch.verify_prefetcher` of one epoch.
    """

    job: Job = field(repr=False)
    device: str
    n_items: int
    per_epoch: int
    dataset: Mapping[str, Any]
    check: Mapping[str, Any]

    @property
    def batch_size(self) -> int:
        """Samples per step, the job's own."""
        return self.job.workload.batch_size

    def dataset_text(self) -> str:
        """Section 1: the data, its batches per epoch, and a note where they are too few to prefetch."""
        if self.job.is_builtin:
            lines = [f"{self.n_items} images, {self.dataset['classes']} class(es), {self.dataset['skipped']} file(s) "
                     f"skipped, {self.per_epoch} batch(es) of {self.batch_size} per epoch"]
        else:
            lines = [f"your job: {self.job.summary()}; {self.per_epoch} batch(es) of {self.batch_size} per epoch"]
        if self.per_epoch <= 1:
            lines.append("only 1 batch per epoch: there is nothing to prefetch (a loader starts every epoch empty), "
                         "so no overlap can hide this input; lower batch_size or add images to see one work")
        elif self.per_epoch < FEW_BATCHES_PER_EPOCH:
            lines.append(f"few batches per epoch: the first batch of every epoch (1 step in {self.per_epoch}) cannot "
                         "be prefetched")
        return "\n".join(lines)

    def correctness_text(self) -> str:
        """Section 2: the side stream, and what was compared where the dataset cannot be read twice alike."""
        c = self.check
        lines = [f"side stream: {'yes, 1 stream for all epochs' if c['side_stream'] else 'none on ' + self.device + ' (synchronous copies)'}"]
        if c["identical"] != c["batches"] and not c["reproducible"]:
            lines.append("your dataset gives different values when the same batch is read twice (its randomness "
                         "comes from a source the workbook cannot seed): compared shapes, dtypes and labels instead")
        return "\n".join(lines)

    def identical_text(self) -> str:
        """Section 2: how many prefetched batches equal the synchronous copy."""
        return (f"{self.check['identical']} of {self.check['batches']} prefetched batches are bit-identical to the "
                "synchronous copy")

@dataclass(frozen=True, eq=False)
class StreamOverlapResult(OverlapChecks, ExperimentResult):
    """Notebook 05's measurement: the data, the prefetcher's check, the compute per thread count and the overlap.

    Attributes
    ----------
    job, device, n_items, per_epoch, dataset, check
        As :class:`OverlapChecks`'s (sections 1 and 2, with their texts).
    settings : dict
        The notebook's parameters the sentences name: ``model_width``, ``d_model``, ``image_size``, ``steps``,
        ``num_workers``, ``prefetch_factor``, ``warmup_steps``, ``data_dir``, ``job`` (the job's spec, empty for
        the built-in job).
    cores : int
        Usable CPU cores.
    splits : tuple of dict
        :func:`thread_splits`, in the order the candidates ran.
    scaling : pandas.DataFrame
        :func:`compute_thread_scaling` (seconds per step).
    base, base_source : dict, str
        Notebook 01's workload and where it came from (:func:`baseline_workload`; a user's job: its own width).
    compute_01 : pandas.DataFrame or None
        The step timed at notebook 01's model width when it differs from this notebook's (one row as
        ``scaling``); None otherwise.
    overlap : OverlapResult
        :func:`run_overlap`'s comparison.
    """

    settings: Mapping[str, Any]
    cores: int
    splits: tuple[Mapping[str, Any], ...]
    scaling: pd.DataFrame
    base: Mapping[str, int]
    base_source: str
    compute_01: pd.DataFrame | None
    overlap: OverlapResult

    # -- figures the cells print (sections 1 and 2: OverlapChecks) ------------------------------

    @property
    def compute_here_s(self) -> float:
        """Compute per step alone with all cores to torch, this notebook's model, seconds (median)."""
        return float(self.scaling.loc[self.scaling["torch_threads"] == self.cores, "median_s"].iloc[0])

    @property
    def compute_01_s(self) -> float:
        """The same at notebook 01's model width (:attr:`compute_here_s` where the widths are the same)."""
        return self.compute_here_s if self.compute_01 is None else float(self.compute_01["median_s"].iloc[0])

    @property
    def work_ms(self) -> float:
        """Input work per step of the synchronous run, ms (median)."""
        return self.overlap.before.stats.median_input_work_s * 1e3

    @property
    def kept_split(self) -> str:
        """The label of the thread split kept as *after*."""
        return next(s["label"] for s, c in zip(self.splits, self.overlap.candidates) if c is self.overlap.after)

    def splits_text(self) -> str:
        """Section 3: the cores and the splits tried, each with its reason."""
        return "\n".join([f"{self.cores} usable core(s); splits to try:"]
                         + [f"  {s['label']}: {s['reason']}" for s in self.splits])

    def scaling_table(self) -> pd.DataFrame:
        """Section 3: ms per step (compute alone) per torch thread count."""
        return self.scaling.assign(ms_per_step=1e3 * self.scaling["median_s"])[["torch_threads", "ms_per_step"]]

    def workload_text(self) -> str:
        """Section 3: this notebook's workload beside notebook 01's, and the compute per step at each width."""
        here = self.compute_here_s * 1e3
        if not self.job.is_builtin:
            return "\n".join([f"your job's own model and batch of {self.batch_size}, as in notebook 01: no "
                              "model_width to change here",
                              f"compute per step, {self.cores} torch thread(s), on your job's first batch: "
                              f"{here:.1f} ms"])
        mine = {**self.settings, "batch_size": self.batch_size}
        return "\n".join([
            "this notebook:   " + ", ".join(f"{k} {mine[k]}" for k in self.base),
            "notebook 01:     " + ", ".join(f"{k} {v}" for k, v in self.base.items()) + f" ({self.base_source})",
            f"compute per step, {self.cores} torch thread(s), this notebook's batch: {here:.1f} ms at model_width "
            f"{self.settings['model_width']} (this notebook), {self.compute_01_s * 1e3:.1f} ms at model_width "
            f"{self.base['model_width']} (notebook 01's)"])

    def variants_text(self) -> str:
        """Section 4: each variant's medians, the one kept, and whether the compute covers the input work."""
        lines = ["medians over the measured steps (they need not add up: each is the median of its own column)"]
        for v in self.overlap.variants:
            s = v.stats
            lines.append(f"{v.label:28s} step {s.median_step_s * 1e3:7.1f} ms: compute {s.median_compute_s * 1e3:7.1f} "
                         f"ms, exposed input {s.median_exposed_s * 1e3:6.1f} ms, input work "
                         f"{s.median_input_work_s * 1e3:6.1f} ms")
        lines.append(f"kept as 'after' (shortest median step): {self.overlap.after.label}")

        def covers(compute_s):
            return "covers" if compute_s * 1e3 >= self.work_ms else "does NOT cover"

        here, width, width_01 = self.compute_here_s, self.settings["model_width"], self.base["model_width"]
        if not self.job.is_builtin:
            lines.append(f"input work per step {self.work_ms:.1f} ms (the synchronous run's data + h2d: your batches "
                         f"do not time their own preparation); compute per step ({self.cores} torch threads) "
                         f"{here * 1e3:.1f} ms, which {covers(here)} it")
        else:
            lines.append(f"input work per step {self.work_ms:.1f} ms; compute per step ({self.cores} torch threads) "
                         f"{here * 1e3:.1f} ms at this notebook's model_width {width}, which {covers(here)} it"
                         + (f"; {self.compute_01_s * 1e3:.1f} ms at notebook 01's {width_01}, which "
                            f"{covers(self.compute_01_s)} it" if width_01 != width else " (the same width as notebook 01)"))
        return "\n".join(lines)

    def overlap_table(self) -> pd.DataFrame:
        """Section 6: per variant its workers, threads and medians (ms), and both fractions (%)."""
        rows = []
        for v in self.overlap.variants:
            s = v.stats
            rows.append({"variant": v.label, "workers": v.settings["num_workers"],
                         "torch threads": v.settings["torch_threads"], "step ms": 1e3 * s.median_step_s,
                         "compute ms": 1e3 * s.median_compute_s, "input work ms": 1e3 * s.median_input_work_s,
                         "exposed ms": 1e3 * s.median_exposed_s, "exposed % of step": 100 * s.exposed_fraction,
                         "hidden % of input": 100 * s.hidden_fraction})
        return pd.DataFrame(rows)

    # -- records, verdict and the panel ----------------------------------------------------------

    def records(self) -> Records:
        """The data, the prefetcher's check, the compute per thread count (and at notebook 01's width), each
        variant's overlap, step time, input work and compute, then the two before/after comparisons."""
        out = Records()
        if self.job.is_builtin:
            out.add("dataset", "usable images", "images", self.n_items, "images", skipped=self.dataset["skipped"],
                    classes=self.dataset["classes"], source=self.settings["data_dir"] and "user folder" or "embedded")
        else:
            out.add("dataset", "your job", "items", self.n_items, "items", **self.job.describe(),
                    spec=self.settings["job"])
        c = self.check
        out.add("correctness", "prefetched vs synchronous", "identical_batches", c["identical"], "batches",
                batches=c["batches"], side_stream=c["side_stream"])
        for _, r in self.scaling.iterrows():
            out.add("compute only", f"{int(r['torch_threads'])} torch thread(s)", "time_per_step", r["median_s"], "s",
                    spread={"p25": r["p25_s"], "p75": r["p75_s"]})
        if self.compute_01 is not None:
            w, r = self.base["model_width"], self.compute_01.iloc[0]
            out.add("compute only", f"model_width {w} (notebook 01's), {self.cores} torch thread(s)", "time_per_step",
                    self.compute_01_s, "s", model_width=w, spread={"p25": float(r["p25_s"]), "p75": float(r["p75_s"])})
        for v in self.overlap.variants:
            _variant_records(out, v, self.batch_size)
        out.add_comparison("exposed input per step", self.overlap.verdict["exposed"], metric="reduction", unit="x")
        out.add_comparison("step time", self.overlap.verdict["step"])
        return out

    def context(self) -> str:
        """What was measured, in the verdict's one sentence."""
        here, s = self.compute_here_s * 1e3, self.settings
        if not self.job.is_builtin:
            what = (f"your job {self.job.name!r} ({here:.0f} ms compute vs {self.work_ms:.0f} ms input work per step, "
                    f"the input work read from the synchronous run), batch {self.batch_size} from {self.n_items} "
                    f"items ({self.per_epoch} batch(es) per epoch), its own dataset")
        else:
            what = (f"PPO on a multimodal policy ({s['model_width']}-channel conv stem, d_model {s['d_model']}; "
                    f"notebook 01 trains model_width {self.base['model_width']} ({self.base_source}): this notebook "
                    f"needs compute per step >= input work per step, here {here:.0f} ms compute vs "
                    f"{self.work_ms:.0f} ms input work, {self.compute_01_s * 1e3:.0f} ms at 01's width), batch "
                    f"{self.batch_size} of {s['image_size']} px from {self.n_items} images ({self.per_epoch} "
                    "batch(es) per epoch), batched pipeline")
        before, after = self.overlap.before.settings, self.overlap.after.settings
        return (f"{what}; before: num_workers=0, synchronous copy, {before['torch_threads']} torch thread(s); after: "
                f"{s['num_workers']} worker(s), prefetch_factor {s['prefetch_factor']}, DevicePrefetcher "
                f"({'side stream' if after['side_stream'] else 'synchronous copy'}), {after['torch_threads']} torch "
                f"thread(s); {s['steps']} measured steps each on {self.device}; figures are medians over the steps, "
                "fractions ratios of those medians")

    def verdict(self) -> Verdict:
        """Notebook 05's verdict (:func:`verdict`) with :meth:`context`."""
        return verdict(self.overlap, context=self.context(), model_width_01=self.base["model_width"])

    def try_it(self, acc: Accelerator, params: Mapping[str, Any]) -> TrySpec:
        """The "try it" panel: the *after* loop again at another worker count, model width (the built-in job
        only) and core split (a CPU only), beside this notebook's own *after*.

        Parameters
        ----------
        acc : helpers.device.Accelerator
        params : mapping
            The notebook's parameters (``num_workers``, ``model_width``, ``prefetch_factor``, ``steps`` and
            ``warmup_steps``, the last two capped at 10 and 2 for the panel).
        """
        def ints(values):
            return tuple((str(n), n) for n in sorted(values))

        kept, workers = self.kept_split, params["num_workers"]
        knobs = {"num_workers": Knob(ints({0, 1, 2, 4, workers}), workers, "num_workers")}
        label = f"{workers} worker(s), {kept}"
        if self.job.model_width is not None:  # a user's job builds its own model: no model_width to change
            width = params["model_width"]
            knobs["model_width"] = Knob(ints({4, 8, 16, 32, 64, width}), width, "model_width")
            label = f"width {width}, " + label
        if acc.is_cpu:  # on an accelerator the step runs on the device: one split only
            knobs["threads"] = Knob(tuple((s, s) for s in SPLITS), kept, "cores")
        job, cores = self.job, self.cores
        pf, steps, warmup = params["prefetch_factor"], min(params["steps"], 10), min(params["warmup_steps"], 2)
        return TrySpec("overlap at another model width and worker count",
                       lambda progress, **k: try_overlap(job, acc, prefetch_factor=pf, cores=cores, steps=steps,
                                                         warmup_steps=warmup, progress=progress, **k),
                       knobs, reference=live_point(self.overlap.after, label))


def _variant_records(out: Records, v: OverlapRun, batch_size: int) -> None:
    """One variant's records: exposed and hidden fractions, step time (and throughput), input work, compute.
    The exposed fraction's spread is that of its own statistic (:attr:`OverlapStats.exposed_fraction_p25`)."""
    s = v.stats
    out.add("overlap", v.label, "exposed_input_fraction", s.exposed_fraction, "fraction", repeats=s.steps,
            spread={"p25": s.exposed_fraction_p25, "p75": s.exposed_fraction_p75},
            statistic="median exposed / median step; spread: quartiles of exposed per step / median step",
            exposed_fraction_per_step=s.exposed_fraction_per_step, **v.settings)
    out.add("overlap", v.label, "hidden_fraction", s.hidden_fraction, "fraction", repeats=s.steps,
            statistic="1 - median exposed / median input work",
            exposed_over_work=s.exposed_over_work if s.exposed_over_work != float("inf") else None)
    step_m = Measurement(name=v.label, times_s=tuple(v.run.steps["step_s"]), warmup=v.run.warmup_steps,
                         items_per_call=batch_size)
    out.add_measurement("step time", v.label, step_m, metric="time_per_step", unit="s",
                        rate_metric="throughput", rate_unit="samples/s")
    out.add("input work", v.label, "input_work_per_step", s.median_input_work_s, "s", repeats=s.steps)
    out.add("compute", v.label, "compute_per_step", s.median_compute_s, "s", repeats=s.steps)


def _check_prefetcher(job: Job, acc: Accelerator) -> dict[str, Any]:
    """:func:`helpers.pipeline.prefetch.verify_prefetcher` on one epoch of the job (the batched pipeline where it
    has one, else its own dataset and copy).

    Raises
    ------
    helpers.errors.DataError
        If a prefetched batch differs from the synchronous copy (for a dataset that cannot be read twice alike:
        in its shapes, dtypes or labels).
    """
    from helpers.pipeline.fast import to_device_batch
    from helpers.pipeline.prefetch import verify_prefetcher

    if job.has_batched_pipeline:
        dataset = job.make_dataset("batched", pin_memory=acc.capabilities.pinned_memory.available)
        transfer = to_device_batch
    else:  # a user's dataset and the job's own copy to the device
        dataset = job.make_dataset(job.pipelines[0])
        transfer = lambda batch, acc, non_blocking=False: job.to_device(batch, acc, non_blocking=non_blocking)  # noqa: E731

    def one_epoch():
        dataset.set_epoch(0)
        return (dataset[b] for b in job.batch_sampler(len(dataset)))

    try:
        check = verify_prefetcher(one_epoch, acc, transfer=transfer)
    finally:
        close_dataset(dataset)
    same = check["structure_equal"] if check["identical"] != check["batches"] and not check["reproducible"] \
        else check["identical"]
    if same != check["batches"]:
        raise DataError(f"prefetched batches differ from the synchronous copy: {check}")
    return check


def check(ctx: Any) -> OverlapChecks:
    """Notebook 05 before any timing (sections 1 and 2): the data and the prefetcher's batches against synchronous
    copies.

    Parameters
    ----------
    ctx : helpers.workbook.nbsetup.NotebookContext
        The notebook's context: its parameters, accelerator and job (``ctx.job()``: the built-in job or the user's).

    Returns
    -------
    OverlapChecks

    Raises
    ------
    helpers.errors.DataError
        If a prefetched batch differs from the synchronous copy.
    """
    acc = ctx.acc
    job = ctx.job()  # the built-in job at this notebook's workload, or the user's (parameter job)
    n_items = job.item_count()
    dataset = ({"skipped": len(job.index.skipped), "classes": job.index.n_classes} if job.is_builtin else {})
    return OverlapChecks(job=job, device=acc.kind, n_items=n_items, per_epoch=n_items // job.workload.batch_size,
                         dataset=dataset, check=_check_prefetcher(job, acc))


def run(ctx: Any, checks: "OverlapChecks | None" = None) -> StreamOverlapResult:
    """Notebook 05's experiment, in the notebook's order: the data, the prefetcher's check, the compute per thread
    count (and at notebook 01's width), then *before* and *after* (:func:`run_overlap`).

    Parameters
    ----------
    ctx : helpers.workbook.nbsetup.NotebookContext
        The notebook's context: its parameters, accelerator and job (``ctx.job()``: the built-in job or the
        user's); the path of its results file is read to find notebook 01's workload (:func:`baseline_workload`).

    checks : OverlapChecks, optional
        :func:`check`'s result (the notebook shows it before the timing starts); None checks here.

    Returns
    -------
    StreamOverlapResult

    Raises
    ------
    helpers.errors.DataError
        If a prefetched batch differs from the synchronous copy.
    """
    P, acc = ctx.params, ctx.acc
    c = checks if checks is not None else check(ctx)
    job = c.job
    cores = usable_cores()
    splits = thread_splits(P["num_workers"], cores, is_cpu=acc.is_cpu)
    scaling = compute_thread_scaling(job, acc, threads=sorted({1, cores, *(s["torch_threads"] for s in splits)}))
    if job.model_width is None:  # a user's model is the same in every notebook: nothing to widen
        base, source, at_01 = {"model_width": P["model_width"]}, "", None
    else:
        (base, source), at_01 = baseline_workload(ctx.results_path), None
        if base["model_width"] != job.model_width:
            at_01 = compute_thread_scaling(job.with_model_width(base["model_width"]), acc, threads=[cores])
    result = run_overlap(job, acc, steps=P["steps"], warmup_steps=P["warmup_steps"], num_workers=P["num_workers"],
                         prefetch_factor=P["prefetch_factor"], cores=cores)
    names = ("model_width", "d_model", "image_size", "text_len", "steps", "warmup_steps", "num_workers",
             "prefetch_factor", "data_dir", "job")
    return StreamOverlapResult(**checked_fields(c), settings={k: P.get(k) for k in names}, cores=cores,
                               splits=tuple(splits), scaling=scaling, base=base, base_source=source,
                               compute_01=at_01, overlap=result)


# -- the notebook's declaration, found by helpers.experiments.registry ------------------------------------

def _prefetcher_default(acc, native_bf16=None) -> tuple[bool, str]:
    """The side-stream prefetcher where no verdict decides it: on wherever the device has streams."""
    streams = acc.capabilities.streams
    if not acc.is_cpu and streams.available:
        return True, "a side-stream copy hides the transfer"
    return False, f"no side streams here: {streams.detail or 'no accelerator'}"


EXPERIMENT = Experiment(
    item=Item("05", "05_stream_overlap", "stream overlap",
         "Hide the input pipeline behind compute",
         "How much input time hides behind compute with worker processes and a side-stream prefetcher?",
         ("prefetcher",)),
    spec=specs.COMMON + specs.DATA + specs.batch() + specs.training("measured training steps per variant") + (
        Param("num_workers", int, 1, "DataLoader worker processes of the overlapped variant", minimum=0,
              maximum=256),
        Param("prefetch_factor", int, 2, "batches each worker prepares ahead", minimum=1, maximum=64),
    ) + specs.JOB,
    optimizations=(
        Optimization("prefetcher", "05_stream_overlap", ("data", "h2d"), default=_prefetcher_default,
                     apply=lambda plan, settings, acc: replace(plan, prefetcher=True)),
    ),
)
