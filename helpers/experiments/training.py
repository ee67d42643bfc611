"""Timed training of a Job: the shared surface of every experiment that trains (notebooks 01, 05-07, 09, 10).

:func:`time_job` builds the job's input (one pipeline, one validated loader
configuration), model and step, and runs them in the one phase-timed loop
(:class:`helpers.compute.train.TimedLoop`): data, h2d and compute, each
closed by a device synchronize, warm-up excluded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from helpers.compute.train import TimedLoop, TrainRun, epochs
from helpers.errors import ParameterError
from helpers.jobs.base import Job, StepOptions
from helpers.pipeline.loader import LoaderConfig, close_loader

__all__ = ["TimedJob", "time_job"]


@dataclass
class TimedJob:
    """A job made ready to step: its dataset, loader, model, step function and the timed loop.

    Attributes
    ----------
    job : Job
    dataset, loader : the job's input
    model : torch.nn.Module
    step : callable
        ``step(device_batch) -> stats``.
    loop : helpers.compute.train.TimedLoop
    options : StepOptions
    """

    job: Job
    dataset: Any
    loader: Any
    model: Any
    step: Any
    loop: TimedLoop
    options: StepOptions

    def close(self) -> None:
        """Stop the loader's workers and release the dataset's threads."""
        close_loader(self.loader)
        inner = getattr(self.dataset, "close", None)
        if inner is not None:
            inner()


def prepare_job(job: Job, acc, *, pipeline: str | None = None, loader: LoaderConfig | None = None,
                options: StepOptions = StepOptions(), non_blocking: bool = False, **dataset_options: Any) -> TimedJob:
    """Build the job's dataset, loader, model and step, and a :class:`TimedLoop` over them.

    Parameters
    ----------
    job : Job
    acc : helpers.device.Accelerator
    pipeline : str, optional
        One of ``job.pipelines`` (default: the first, the job as it is).
    loader : LoaderConfig, optional
        Default: ``num_workers=0`` with the workload's batch size and seed.
    options : StepOptions
        Precision and memory format of the step.
    non_blocking : bool
        Copy batches to the device with ``non_blocking``.
    **dataset_options
        Passed to ``job.make_dataset``.
    """
    w = job.workload
    cfg = loader or LoaderConfig(batch_size=w.batch_size, num_workers=0, seed=w.seed)
    dataset = job.make_dataset(pipeline or job.pipelines[0], **dataset_options)
    sampler = job.batch_sampler(len(dataset))
    dl = job.make_loader(dataset, cfg, acc, batch_sampler=sampler)
    model = job.make_model(acc, options)
    step = job.make_step(model, acc, options)
    loop = TimedLoop(epochs(dl, datasets=[dataset, sampler]),
                     lambda batch: job.to_device(batch, acc, non_blocking=non_blocking, options=options),
                     step, acc.synchronize)
    return TimedJob(job, dataset, dl, model, step, loop, options)


def time_job(job: Job, acc, *, steps: int, warmup_steps: int = 2, **kwargs: Any) -> TrainRun:
    """Run ``warmup_steps`` untimed and ``steps`` timed training steps of ``job``; see :func:`prepare_job`.

    Returns
    -------
    helpers.compute.train.TrainRun
        Per-step phase times (seconds) and statistics of the measured steps.

    Raises
    ------
    ParameterError
        ``steps < 1`` or ``warmup_steps < 0`` (before any work).
    """
    if steps < 1 or warmup_steps < 0:
        raise ParameterError(f"steps must be >= 1 and warmup_steps >= 0, got steps={steps}, "
                             f"warmup_steps={warmup_steps}")
    timed = prepare_job(job, acc, **kwargs)
    try:
        return timed.loop.run(warmup_steps, measured=False).discard().run(steps).result()
    finally:
        timed.close()
