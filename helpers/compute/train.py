"""The training loop with per-phase timing: :class:`TimedLoop`, the one loop every experiment that trains uses.

Each step has three phases, each closed by a device synchronize so that
asynchronous device work is charged to the phase that launched it:

``data``
    waiting for the next batch from the input pipeline (decode, augment,
    tokenize, collate: host work);
``h2d``
    copying the batch to the device;
``compute``
    the job's training step (for the built-in job, the PPO step: rollout
    forward, GAE, update epochs) on the device.

*Exposed input time* is ``data + h2d``: the part of a step in which the
device waits for input. Its share of the step time is the host-bound
indicator of notebook 01 (and the quantity later notebooks drive down).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping

import pandas as pd
import torch

from helpers.checklist import INPUT_PHASES, PHASES
from helpers.errors import ParameterError
from helpers.timing import PhaseTimer

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class TrainRun:
    """What a timed training run produced.

    Attributes
    ----------
    phases : pandas.DataFrame
        One row per phase per measured step: step, phase, start_s, duration_s (seconds).
    steps : pandas.DataFrame
        One row per measured step: step, data, h2d, compute, step_s (seconds),
        exposed_input_s, exposed_fraction, and the step's statistics (loss,
        reward_mean, ... as floats).
    warmup_steps : int
        Steps run before measuring (not in the frames).
    """

    phases: Any
    steps: Any
    warmup_steps: int

    @property
    def exposed_fraction(self) -> float:
        """Median over steps of exposed input time / step time (0..1)."""
        return float(self.steps["exposed_fraction"].median())

    def phase_medians(self) -> dict[str, float]:
        """Median seconds per step of each phase and of the whole step."""
        return {c: float(self.steps[c].median()) for c in (*PHASES, "step_s")}


def epochs(source: Iterable, *, datasets: Iterable = ()) -> Iterator:
    """Iterate ``source`` again and again, one pass per epoch, forever.

    Before each pass ``set_epoch(epoch)`` is called on each of ``datasets``
    that has it (a dataset that draws augmentations per epoch, a batch
    sampler that draws a new order per epoch).

    Raises
    ------
    ParameterError
        If a pass yields no batch (the dataset is smaller than one batch).
    """
    epoch = 0
    while True:
        for obj in datasets:
            if obj is not None and hasattr(obj, "set_epoch"):
                obj.set_epoch(epoch)
        yielded = False
        for batch in source:
            yielded = True
            yield batch
        if not yielded:
            raise ParameterError("the data loader yielded no batch: the dataset is smaller than one batch "
                                 "(with drop_last); lower batch_size or add images")
        epoch += 1


def _stats_row(stats: Mapping[str, Any] | None) -> dict[str, float]:
    """A step's statistics as floats, read after the step's timing (the sync it implies is not charged)."""
    out = {}
    for k, v in (stats or {}).items():
        out[k] = float(v.detach().float().cpu()) if isinstance(v, torch.Tensor) else float(v)
    return out


def nonfinite_loss(row: Mapping[str, float]) -> tuple[str, float] | None:
    """The first loss statistic of a step's row that is NaN or infinite, as ``(name, value)``; None if all are finite.

    A loss statistic is ``"loss"`` or a name ending in ``"_loss"`` (the built-in job's ``value_loss``).
    """
    for k, v in row.items():
        if (k == "loss" or k.endswith("_loss")) and not math.isfinite(v):
            return k, float(v)
    return None


class TimedLoop:
    """The phase-timed training loop of the workbook: every experiment that trains runs its steps here.

    Each step has three phases, each closed by a device synchronize
    (:class:`helpers.timing.PhaseTimer`): *data* (``next(batches)``), *h2d*
    (``to_device(batch)``) and *compute* (``step(device_batch)``). The loop
    can run in blocks (:meth:`run`), so several jobs can be interleaved, and
    marks each step as measured or warm-up.

    Parameters
    ----------
    batches : iterator
        Host batches (e.g. :func:`epochs` over a loader).
    to_device : callable
        ``to_device(batch) -> device_batch``; timed as *h2d*.
    step : callable
        ``step(device_batch) -> stats`` (dict of 0-d tensors or floats); timed as *compute*.
    sync : callable
        The device synchronize (``Accelerator.synchronize``).

    Attributes
    ----------
    steps_run : int
        Steps run since the loop was made (warm-up and discarded steps included).
    nonfinite : tuple of (int, str, float) or None
        The first step whose loss was NaN or infinite (:func:`nonfinite_loss`): ``(step, stat, value)``, the
        step counted from 1 over :attr:`steps_run`; None while every loss was finite. Read from the step's
        statistics after its timing (no synchronize is added), and kept across :meth:`discard`.
    """

    def __init__(self, batches: Iterator, to_device: Callable[[Any], Any], step: Callable[[Any], Any],
                 sync: Callable[[], None]) -> None:
        self.batches, self.to_device, self.step = batches, to_device, step
        self.timer = PhaseTimer(sync=sync)
        self.measured: list[bool] = []
        self.stats: list[dict[str, float]] = []
        self.discarded = 0
        self.steps_run = 0
        self.nonfinite: tuple[int, str, float] | None = None

    def discard(self) -> "TimedLoop":
        """Forget the steps run so far (counted as warm-up); the next step's phases start the timeline at 0."""
        self.discarded += len(self.measured)
        self.timer.reset()
        self.measured, self.stats = [], []
        return self

    def run(self, steps: int, *, measured: bool = True,
            progress: Callable[[int, int], None] | None = None) -> "TimedLoop":
        """Run ``steps`` steps; ``measured=False`` marks them as warm-up. Returns self.

        ``progress(done, steps)`` is called after each step (outside its timing), e.g. a progress bar's update.
        """
        for i in range(int(steps)):
            with self.timer.phase("data"):
                batch = next(self.batches)
            with self.timer.phase("h2d"):
                device_batch = self.to_device(batch)
            with self.timer.phase("compute"):
                stats = self.step(device_batch)
            self.timer.end_step()
            self.measured.append(bool(measured))
            row = _stats_row(stats)
            self.stats.append(row)
            self.steps_run += 1
            if self.nonfinite is None:
                bad = nonfinite_loss(row)
                if bad is not None:
                    self.nonfinite = (self.steps_run, *bad)
            if progress is not None:
                progress(i + 1, int(steps))
        return self

    def steps_frame(self, *, measured_only: bool = True):
        """One row per step: step, data, h2d, compute, step_s, exposed_input_s, exposed_fraction, the stats."""
        totals = self.timer.totals().reset_index(drop=True)
        for p in PHASES:
            if p not in totals:
                totals[p] = 0.0
        totals["exposed_input_s"] = totals[list(INPUT_PHASES)].sum(axis=1)
        totals["exposed_fraction"] = totals["exposed_input_s"] / totals["step_s"]
        df = pd.concat([totals, pd.DataFrame(self.stats)], axis=1)
        df["measured"] = self.measured[: len(df)]
        if not measured_only:
            return df
        return df[df["measured"]].reset_index(drop=True)

    def phases_frame(self, *, measured_only: bool = True):
        """One row per phase per step (``step``, ``phase``, ``start_s``, ``duration_s``)."""
        phases = self.timer.frame()
        if not measured_only or not len(phases):
            return phases
        keep = {i for i, m in enumerate(self.measured) if m}
        return phases[phases["step"].isin(keep)].reset_index(drop=True)

    def result(self) -> TrainRun:
        """The measured steps as a :class:`TrainRun` (step numbers restart at 0 after the warm-up)."""
        kept_warmup = sum(1 for m in self.measured if not m)
        steps = self.steps_frame()
        steps["step"] = range(len(steps))
        phases = self.phases_frame()
        if len(phases):
            phases = phases.assign(step=phases["step"] - kept_warmup)
        return TrainRun(phases=phases, steps=steps, warmup_steps=self.discarded + kept_warmup)
