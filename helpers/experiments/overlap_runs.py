"""Notebook 05's measurement: the job trained with one input setting per variant, timed, and the comparison.

:func:`run_overlap_variant` trains the job on its DataLoader (and a :class:`helpers.pipeline.prefetch.DevicePrefetcher`)
through the phase-timed loop and measures the overlap (:mod:`helpers.pipeline.overlap_metric`); :func:`run_overlap`
runs *after* with each thread split of :func:`thread_splits`, keeps the fastest (:func:`fastest`) and decides
(:func:`helpers.experiments.overlap_decision.overlap_decision`) against a *before* at the same torch thread count
(like with like: the two sides differ only in the overlap); the thread split's own effect on the step is measured
apart (:func:`thread_split_effect`: the same variant at two thread counts), never folded into the overlap's gain.
:func:`compute_thread_scaling` times the step alone per torch thread count. :mod:`helpers.experiments.overlap` runs
it for notebook 05, ``bench input-pipeline`` and the try-it panel.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch

from helpers.compute.train import TimedLoop, epochs
from helpers.conditions import ran_with
from helpers.device import Accelerator, usable_cores
from helpers.errors import ParameterError
from helpers.experiments.overlap_decision import overlap_decision
from helpers.experiments.training import fixed_batches
from helpers.jobs.base import Job, close_dataset
from helpers.live import Progress
from helpers.pipeline.loader import LoaderConfig, close_loader
from helpers.pipeline.overlap_metric import OverlapRun, input_work_per_step, overlap_stats
from helpers.pipeline.prefetch import ConsumerStreamSync, DevicePrefetcher, RecordingLoader, prefetched
from helpers.timing import Comparison, Measurement, measure

logger = logging.getLogger(__name__)

__all__ = ["OverlapResult", "choose_threads", "compute_thread_scaling", "fastest", "run_overlap",
           "run_overlap_variant", "thread_split_effect", "thread_splits"]


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
    on a CPU both are run and the faster *after* is kept, compared with a
    *before* at its own torch thread count (:func:`run_overlap`):

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
        ``torch_threads`` (as read while the count was timed), ``batch_size`` (samples), ``median_s``, ``p25_s``,
        ``p75_s`` (seconds per step).

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
            rows.append({**ran_with(job.workload.batch_size), "median_s": m.median_s, "p25_s": m.p25_s,
                         "p75_s": m.p75_s})
    finally:
        torch.set_num_threads(previous)
    return pd.DataFrame(rows)


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
        Default from :func:`choose_threads`. ``torch.set_num_threads`` is restored afterwards; the settings'
        ``torch_threads`` and ``batch_size`` are read while the variant runs (:func:`helpers.conditions.ran_with`).
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
        ran = ran_with(w.batch_size)  # what the variant runs with, read while it runs
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
                "pin_memory": pin, "torch_threads": ran["torch_threads"], "decode_threads": decode_threads,
                "batch_size": ran["batch_size"], "steps": steps, "warmup_steps": warmup_steps,
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
    """Notebook 05's comparison: the job before and after overlapping its input, like with like.

    The *after* with the shortest step among the thread splits of :func:`thread_splits` is kept, and the verdict
    compares it with a *before* at the same torch thread count, batch, seed and data, so that the pair differs only
    in the overlap. What the thread count itself does to the step is :attr:`thread_effect`, apart from the
    overlap's gain.

    Attributes
    ----------
    before : OverlapRun
        ``num_workers=0``, synchronous copy, at the kept *after*'s torch thread count.
    candidates : tuple of OverlapRun
        The overlapped job with each thread split of :func:`thread_splits`.
    after : OverlapRun
        The fastest candidate (shortest median step).
    verdict : dict
        :func:`overlap_decision` of before vs after.
    befores : tuple of OverlapRun
        Every *before* run, in the order they ran (one per torch thread count measured); default ``(before,)``.
    thread_effect : dict
        ``{"after": Comparison}``, and ``"before"`` where two befores ran (:func:`thread_split_effect`): the step
        time of the same variant at the last split's thread count (A) and the first's (B); empty with one split.
    """

    before: OverlapRun
    candidates: tuple[OverlapRun, ...]
    after: OverlapRun
    verdict: dict
    befores: tuple[OverlapRun, ...] = ()
    thread_effect: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.befores:
            object.__setattr__(self, "befores", (self.before,))
        if not any(b is self.before for b in self.befores):
            raise ParameterError("OverlapResult: befores must hold the before the verdict compares")

    def before_of(self, candidate: OverlapRun) -> OverlapRun | None:
        """The *before* compared with ``candidate``: :attr:`before` for the kept one, else a *before* at its torch
        thread count (None where none ran)."""
        if candidate is self.after:
            return self.before
        threads = candidate.settings.get("torch_threads")
        return next((b for b in self.befores if b.settings.get("torch_threads") == threads), None)

    @property
    def pairs(self) -> tuple[tuple[OverlapRun, OverlapRun], ...]:
        """``(before, after)`` of each candidate that has a *before* (:meth:`before_of`), in the candidates' order;
        the kept one always."""
        return tuple((self.before_of(c), c) for c in self.candidates if self.before_of(c) is not None)

    @property
    def variants(self) -> tuple[OverlapRun, ...]:
        """Every run once: each candidate after its *before*, then any *before* left."""
        out: list[OverlapRun] = []
        for run in [r for c in self.candidates for r in (self.before_of(c), c)] + list(self.befores):
            if run is not None and not any(run is seen for seen in out):
                out.append(run)
        return tuple(out)

    def decisions(self, seed: int = 0) -> tuple[dict, ...]:
        """:func:`overlap_decision` of each pair (the kept one's is :attr:`verdict`), in :attr:`pairs`' order."""
        return tuple(self.verdict if a is self.after else overlap_decision(b, a, seed=seed) for b, a in self.pairs)


def thread_split_effect(runs: Sequence[OverlapRun], *, seed: int = 0) -> Comparison | None:
    """The thread split's own effect on one variant: its step time at two torch thread counts, everything else alike.

    Parameters
    ----------
    runs : sequence of OverlapRun
        The same variant (the same ``num_workers`` and prefetcher) at each thread split, in :func:`thread_splits`'
        order.
    seed : int
        Seed of the bootstrap.

    Returns
    -------
    helpers.timing.Comparison or None
        Step time per step (seconds) of the last run (A) against the first (B): ratio > 1 means the first split's
        thread count gives the shorter step. None with fewer than two runs or when their torch threads are the
        same.

    Raises
    ------
    ParameterError
        Runs of different variants (workers, prefetcher or batch differ): their difference is not the threads'.
    """
    if len(runs) < 2:
        return None
    first, last = runs[0], runs[-1]
    for k in ("num_workers", "prefetcher", "batch_size"):
        if first.settings.get(k) != last.settings.get(k):
            raise ParameterError(f"thread_split_effect: {first.label!r} and {last.label!r} differ in {k} "
                                 f"({first.settings.get(k)} vs {last.settings.get(k)}), not only in their threads")
    if first.settings.get("torch_threads") == last.settings.get("torch_threads"):
        return None

    def steps(v: OverlapRun) -> Measurement:
        return Measurement(v.label, tuple(float(x) for x in v.run.steps["step_s"]), warmup=0)

    return Comparison.from_measurements(steps(last), steps(first), seed=seed)


def run_overlap(job: Job, acc: Accelerator, *, steps: int, warmup_steps: int, num_workers: int,
                prefetch_factor: int = 2, cores: int | None = None) -> OverlapResult:
    """Run notebook 05's experiment: *before*, *after* at each thread split, the kept *after*'s verdict against a
    *before* at its own torch thread count, and the thread split's own effect.

    *Before* (``num_workers=0``, synchronous copy) runs first, at the first split's torch thread count
    (:func:`choose_threads`); then *after* at each split of :func:`thread_splits`. The *after* with the shortest
    median step is kept (:func:`fastest`); where it ran at another thread count than the first *before*, a second
    *before* runs at its count, so that the verdict's two sides differ only in the overlap (torch threads, batch,
    seed and data alike). On an accelerator, or without workers, there is one split (two runs); on a CPU with
    workers three runs, four when the second split's *after* is the faster.

    Parameters
    ----------
    job : helpers.jobs.base.Job
        The built-in job (batched pipeline, per-batch preparation times) or a user's (its own dataset; input
        work per step taken from the first synchronous run, see :func:`run_overlap_variant`)
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
    splits = thread_splits(num_workers, cores, is_cpu=acc.is_cpu)
    common = dict(steps=steps, warmup_steps=warmup_steps)

    def before_at(threads: int) -> OverlapRun:
        return run_overlap_variant(job, acc, label=f"before, {threads} torch thread(s)", num_workers=0,
                                   prefetcher=False, torch_threads=threads, **common)

    befores = [before_at(splits[0]["torch_threads"])]
    if befores[0].batches is not None and "prep_s" not in befores[0].batches:  # a user's job: its input work
        common["input_work_s"] = (befores[0].run.steps["data"] + befores[0].run.steps["h2d"]).tolist()
    candidates = tuple(
        run_overlap_variant(job, acc, label=f"after, {split['label']} ({split['torch_threads']} torch thread(s))",
                            num_workers=num_workers, prefetch_factor=prefetch_factor, prefetcher=True,
                            torch_threads=split["torch_threads"], decode_threads=split["decode_threads"], **common)
        for split in splits)
    after = fastest(candidates)
    if after.settings["torch_threads"] != befores[0].settings["torch_threads"]:  # like with like: its own before
        befores.append(before_at(after.settings["torch_threads"]))
    before, seed = befores[-1], job.workload.seed
    effect = {name: c for name, c in (("before", thread_split_effect(befores, seed=seed)),
                                      ("after", thread_split_effect(candidates, seed=seed))) if c is not None}
    return OverlapResult(before, candidates, after, overlap_decision(before, after, seed=seed),
                         befores=tuple(befores), thread_effect=effect)
