"""One training step of a job, part by part, before any measurement: its failures named as the user's.

The runner calls :func:`first_step_check` once, in a child process on the run's device, before the first
notebook starts (``python -m helpers run --job ...``), and ``diagnose`` calls it before timing. Each part
of the job is tried in the order a training loop uses it (dataset, one batch, the copy to the device, the
model, the step, its loss), and the first that fails raises a :class:`~helpers.jobs.supervised.JobError`
naming the job, the part and what to do. A model or batch that does not fit the device's memory is said
in those words (:func:`helpers.compute.memory.is_oom`), with the batch size and the device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch

from helpers.compute.memory import is_oom
from helpers.errors import SampleError
from helpers.jobs.base import Job, close_dataset
from helpers.jobs.load import _user_frames
from helpers.jobs.supervised import JobError

__all__ = ["Divergence", "first_step_check", "describe_batch", "loop_divergence", "loss_divergence"]


def describe_batch(batch: Any, *, limit: int = 6) -> str:
    """A short text of a batch's tensors: ``"image float32 (32, 3, 64, 64), label int64 (32,)"``.

    Parameters
    ----------
    batch : tensor or nested dict/list/tuple/dataclass of tensors
    limit : int
        At most this many tensors are named; the rest are counted.
    """
    parts: list[str] = []

    def walk(x: Any, where: str) -> None:
        if isinstance(x, torch.Tensor):
            parts.append(f"{where or 'tensor'} {str(x.dtype).removeprefix('torch.')} {tuple(x.shape)}")
        elif isinstance(x, dict):
            for k, v in x.items():
                walk(v, f"{where}.{k}" if where else str(k))
        elif isinstance(x, (list, tuple)):
            for i, v in enumerate(x):
                walk(v, f"{where}[{i}]")
        elif hasattr(x, "__dataclass_fields__"):
            for name in x.__dataclass_fields__:
                walk(getattr(x, name), f"{where}.{name}" if where else name)

    walk(batch, "")
    more = f", and {len(parts) - limit} more" if len(parts) > limit else ""
    return ", ".join(parts[:limit]) + more if parts else "no tensors"


def _oom_advice(job: Job, acc: Any, what: str) -> str:
    bs = job.workload.batch_size
    return (f"job {job.name!r}: {what} does not fit in {acc.kind} memory ({acc.name}) at batch_size {bs}: lower "
            f"batch_size (notebook 09 finds the largest batch that fits), use a smaller model, or free the device "
            f"(another process may hold its memory)")


def _part(job: Job, acc: Any, what: str, fn: Callable[[], Any], fix: str) -> Any:
    try:
        return fn()
    except JobError as exc:  # the adapter already named the part; say "does not fit" where that is why
        cause = exc.__cause__
        if cause is not None and is_oom(cause):
            raise JobError(_oom_advice(job, acc, what)) from cause
        if cause is not None and _user_frames(cause):  # the adapter's message, with the user's own frames
            raise JobError(f"{exc}{_user_frames(cause)}") from cause
        raise
    except Exception as exc:  # the user's code: any exception is theirs to read
        if is_oom(exc):
            raise JobError(_oom_advice(job, acc, what)) from exc
        # a SampleError names the index; the user's frames are those of the exception it wraps
        origin = exc.__cause__ if isinstance(exc, SampleError) and exc.__cause__ is not None else exc
        raise JobError(f"job {job.name!r}: {what} failed: {type(exc).__name__}: {exc}; {fix}"
                       f"{_user_frames(origin)}") from exc


def _loss_of(stats: Any) -> torch.Tensor | None:
    if isinstance(stats, torch.Tensor):
        return stats
    loss = stats.get("loss") if isinstance(stats, dict) else None
    return loss if isinstance(loss, torch.Tensor) else None


def first_step_check(job: Job, acc: Any) -> dict[str, Any]:
    """Run one training step of ``job`` on ``acc``, part by part, and say what it saw.

    Parameters
    ----------
    job : helpers.jobs.base.Job
    acc : helpers.device.Accelerator

    Returns
    -------
    dict
        ``name`` (the job's), ``batch`` (:func:`describe_batch` of the device batch), ``loss`` (float, the
        first step's) and ``samples`` (items in the dataset).

    Raises
    ------
    JobError
        The dataset cannot be built or is smaller than one batch, the first batch cannot be made, it holds
        something that is not a tensor, the model or the batch does not fit the device's memory, the step
        raises, returns no loss (a 0-d tensor, or a dict with ``"loss"``), a loss with more than one element,
        or a loss that is NaN or infinite.
    """
    pipeline = job.pipelines[0]
    dataset = _part(job, acc, "making the dataset", lambda: job.make_dataset(pipeline),
                    "check the dataset's path and constructor in your job file")
    try:
        n = len(dataset)
        if n < job.workload.batch_size:
            raise JobError(f"job {job.name!r}: the dataset has {n} sample(s), fewer than one batch of "
                           f"{job.workload.batch_size}: lower batch_size or give more data")
        indices = next(iter(job.batch_sampler(n)))
        host = _part(job, acc, "making the first batch (dataset[...] and collate)", lambda: dataset[indices],
                     "the traceback's last frame in your dataset or collate function is where it broke")
    finally:
        close_dataset(dataset)
    batch = _part(job, acc, "moving the batch to the device", lambda: job.to_device(host, acc),
                  "a batch must be tensors (nested dicts, lists, tuples and dataclasses of tensors work)")
    model = _part(job, acc, "building the model on the device", lambda: job.make_model(acc),
                  "check the model's constructor in your job file")
    step = _part(job, acc, "building the step (optimizer)", lambda: job.make_step(model, acc),
                 "check the optimizer factory in your job file")
    stats = _part(job, acc, "the first training step", lambda: step(batch),
                  "the traceback's frames in your model or loss show where")
    acc.synchronize()
    loss = _loss_of(stats)
    if loss is None:
        got = sorted(stats) if isinstance(stats, dict) else type(stats).__name__
        raise JobError(f"job {job.name!r}: the step returned {got}, with no loss: return a dict with a 0-d tensor "
                       "under 'loss' (the workbook compares losses to check that an optimization keeps learning)")
    if loss.numel() != 1:
        raise JobError(f"job {job.name!r}: the step's loss has shape {tuple(loss.shape)}, not a scalar: reduce it "
                       "(e.g. .mean()) before backward")
    value = float(loss.detach().float())
    if not math.isfinite(value):
        raise JobError(f"job {job.name!r}: the loss is {value} on the first step, before any optimization: check "
                       "the inputs' scale, the labels' range and the learning rate before measuring its speed")
    return {"name": job.describe().get("job", job.name), "batch": describe_batch(batch), "loss": value,
            "samples": n}


# --------------------------------------------------------------------------- a loss that turns NaN or infinite


def _value_text(value: float) -> str:
    return repr(float(value)) if not math.isfinite(value) else f"{value:.4g}"


@dataclass(frozen=True)
class Divergence:
    """Where a job's loss first became NaN or infinite, in each configuration it was run in.

    Found after the runs, from the losses the steps returned (:attr:`helpers.compute.train.TimedLoop.nonfinite`
    or a loss curve): no synchronize is added inside a timed step.

    Attributes
    ----------
    first : dict of str to (int, str, float) or None
        Configuration (e.g. ``"fp32"``, ``"bf16 autocast"``, ``"the baseline"``) -> ``(step, stat, value)`` of its
        first non-finite loss (step counted from 1, warm-up included), or None where every loss was finite.
    steps : dict of str to int
        Steps each configuration ran.
    baseline : str or None
        The configuration without any optimization (fp32, notebook 10's baseline), when there is one.
    """

    first: Mapping[str, tuple[int, str, float] | None]
    steps: Mapping[str, int] = field(default_factory=dict)
    baseline: str | None = None

    @property
    def diverged(self) -> bool:
        """Whether the loss became NaN or infinite in any configuration."""
        return any(v is not None for v in self.first.values())

    @property
    def baseline_diverged(self) -> bool:
        """Whether it did in the configuration without optimization too (or in every one, with no baseline named)."""
        if self.baseline is None:
            return self.diverged
        return self.first.get(self.baseline) is not None

    def _at(self, name: str) -> str:
        step, stat, value = self.first[name]
        return f"{stat} {_value_text(value)} at step {step} in {name}"

    def sentence(self) -> str:
        """What diverged, where, and what to do: the reason a verdict gives instead of blaming an optimization."""
        bad = [n for n, v in self.first.items() if v is not None]
        if not bad:
            return f"the loss stays finite in {', '.join(f'{n} ({self.steps.get(n, 0)} steps)' for n in self.first)}"
        fix = ("fix the job's training before measuring its speed (the learning rate, the loss function, the "
               "inputs' scale and the labels' range{})")
        if self.baseline_diverged:
            lead = self.baseline if self.baseline in bad else min(bad, key=lambda n: self.first[n][0])
            step, stat, value = self.first[lead]
            fix = fix.format("; its loss was finite at the first step" if step > 1 else "")
            others = [self._at(n) for n in bad if n != lead]
            compared = self.baseline is not None and len(self.first) > 1
            fine = [n for n in self.first if n not in bad]
            return (f"your job diverges: its {stat} is {_value_text(value)} at step {step} in {lead}"
                    + (" too" if compared else "")
                    + (f" ({'; '.join(others)})" if others else "")
                    + (f", finite in {', '.join(fine)}" if fine else "")
                    + (", so no optimization is to blame" if compared else "")
                    + f"; no speed figure of a job whose loss is not finite is meaningful: {fix}")
        base_steps = self.steps.get(self.baseline)
        return (f"your job diverges only in {' and '.join(bad)}: {'; '.join(self._at(n) for n in bad)}, while "
                f"{self.baseline} stays finite" + (f" over its {base_steps} steps" if base_steps else ""))

    def as_dict(self) -> dict[str, Any]:
        """JSON-able: configuration -> ``{"step", "stat", "value"}`` (value as text: "nan", "inf") or None."""
        return {"baseline": self.baseline, "baseline_diverged": self.baseline_diverged,
                "first": {n: (None if v is None else {"step": v[0], "stat": v[1], "value": _value_text(v[2])})
                          for n, v in self.first.items()},
                "steps": dict(self.steps)}


def loss_divergence(curves: Mapping[str, Sequence[float]], *, baseline: str | None = None,
                    stat: str = "loss") -> Divergence:
    """The :class:`Divergence` of loss curves: per configuration, its first NaN or infinite value.

    Parameters
    ----------
    curves : mapping of str to sequence of float
        Configuration -> its loss per step (step 1 first).
    baseline : str, optional
        The key of the configuration without any optimization.
    stat : str
        What the curves are (``"loss"``, ``"value_loss"``), for the sentence.

    Returns
    -------
    Divergence
    """
    first: dict[str, tuple[int, str, float] | None] = {}
    for name, values in curves.items():
        first[name] = next(((i, stat, float(v)) for i, v in enumerate(values, 1) if not math.isfinite(float(v))),
                           None)
    return Divergence(first=first, steps={n: len(v) for n, v in curves.items()}, baseline=baseline)


def loop_divergence(loops: Mapping[str, Any], *, baseline: str | None = None) -> Divergence:
    """The :class:`Divergence` of timed loops (:class:`helpers.compute.train.TimedLoop`, or objects with ``.loop``).

    Read from each loop's ``nonfinite`` and ``steps_run``, after the runs.
    """
    first, steps = {}, {}
    for name, obj in loops.items():
        loop = getattr(obj, "loop", obj)
        first[name] = loop.nonfinite
        steps[name] = loop.steps_run
    return Divergence(first=first, steps=steps, baseline=baseline)
