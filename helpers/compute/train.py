"""The training loop with per-phase timing.

Each step has three phases, each closed by a device synchronize so that
asynchronous device work is charged to the phase that launched it:

``data``
    waiting for the next batch from the input pipeline (decode, augment,
    tokenize, collate: host work);
``h2d``
    copying the batch to the device;
``compute``
    the PPO step (rollout forward, GAE, update epochs) on the device.

*Exposed input time* is ``data + h2d``: the part of a step in which the
device waits for input. Its share of the step time is the host-bound
indicator of notebook 01 (and the quantity later notebooks drive down).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch

from helpers.errors import ParameterError
from helpers.timing import PhaseTimer

log = logging.getLogger(__name__)

INPUT_PHASES = ("data", "h2d")
PHASES = ("data", "h2d", "compute")


@dataclass(frozen=True)
class TrainRun:
    """What a timed training run produced.

    Attributes
    ----------
    phases : pandas.DataFrame
        One row per phase per measured step: step, phase, start_s, duration_s (seconds).
    steps : pandas.DataFrame
        One row per measured step: step, data, h2d, compute, step_s (seconds),
        exposed_input_s, exposed_fraction, and the PPO statistics (loss,
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


def _infinite(loader: Iterable, dataset=None):
    epoch = 0
    while True:
        if dataset is not None and hasattr(dataset, "set_epoch"):
            dataset.set_epoch(epoch)
        yielded = False
        for batch in loader:
            yielded = True
            yield batch
        if not yielded:
            raise ParameterError("the data loader yielded no batch: the dataset is smaller than one batch "
                                 "(with drop_last); lower batch_size or add images")
        epoch += 1


def default_transfer(batch: dict, acc, *, non_blocking: bool = False):
    """Copy a baseline batch to the device: (images, tokens, labels) as given.

    ``batch["image"]`` is float32 (B, 3, S, S) already normalized on the host.
    """
    return tuple(batch[k].to(acc.device, non_blocking=non_blocking) for k in ("image", "tokens", "label"))


def train(loader: Iterable, trainer, acc, *, steps: int, warmup_steps: int = 2,
          generator: torch.Generator | None = None, non_blocking: bool = False,
          dataset=None, transfer: Callable[..., tuple] | None = None) -> TrainRun:
    """Run ``warmup_steps + steps`` PPO steps, timing the phases of the measured ones.

    Parameters
    ----------
    loader : iterable of dict
        Batches with ``image`` float32 (B, 3, S, S), ``tokens`` int64 (B, L),
        ``label`` int64 (B,), on the host. Restarted at the end of an epoch.
    trainer : helpers.compute.ppo.PPOTrainer
        Performs one PPO step on device tensors.
    acc : helpers.device.Accelerator
        Device view: where tensors go and how to synchronize.
    steps : int
        Measured steps (>= 1).
    warmup_steps : int
        Steps run first and excluded from the frames (>= 0).
    generator : torch.Generator, optional
        Generator for action sampling (reproducible runs).
    non_blocking : bool
        Pass ``non_blocking`` to the host-to-device copies.
    dataset : object, optional
        If it has ``set_epoch(epoch)``, it is called at each epoch start.
    transfer : callable, optional
        ``transfer(batch, acc, non_blocking=...) -> (images, tokens, labels)``
        on the device; the *h2d* phase times it. Default
        :func:`default_transfer` (the baseline's float batch). A pipeline that
        ships uint8 NHWC batches passes its own (copy, then convert and
        normalize on the device).

    Returns
    -------
    TrainRun

    Raises
    ------
    ParameterError
        ``steps < 1`` or ``warmup_steps < 0``, or a loader that yields nothing.
    """
    import pandas as pd

    if steps < 1 or warmup_steps < 0:
        raise ParameterError(f"steps must be >= 1 and warmup_steps >= 0, got steps={steps}, "
                             f"warmup_steps={warmup_steps}")
    timer = PhaseTimer(sync=acc.synchronize)
    it = _infinite(loader, dataset)
    stats_rows = []
    for i in range(warmup_steps + steps):
        measured = i >= warmup_steps
        if i == warmup_steps:
            timer.reset()
        with timer.phase("data"):
            batch = next(it)
        with timer.phase("h2d"):
            images, tokens, labels = (transfer or default_transfer)(batch, acc, non_blocking=non_blocking)
        with timer.phase("compute"):
            stats = trainer.step(images, tokens, labels, generator=generator)
        timer.end_step()
        if measured:
            # .item() after the step's timing: the sync it implies is not charged to any phase
            stats_rows.append({k: float(v.detach().float().cpu()) for k, v in stats.items()})
    phases = timer.frame()
    totals = timer.totals()
    for p in PHASES:
        if p not in totals:
            totals[p] = 0.0
    totals["exposed_input_s"] = totals[list(INPUT_PHASES)].sum(axis=1)
    totals["exposed_fraction"] = totals["exposed_input_s"] / totals["step_s"]
    stats_df = pd.DataFrame(stats_rows)
    steps_df = pd.concat([totals.reset_index(drop=True), stats_df.reset_index(drop=True)], axis=1)
    return TrainRun(phases=phases, steps=steps_df, warmup_steps=warmup_steps)


def classify(exposed_fraction: float, threshold: float, *, device_kind: str = "") -> tuple[str, str]:
    """Call a job host-bound or device-bound from its exposed input share.

    The reason is computed from the split, so it says what each side of the
    step is worth: with input at X% and compute at 1-X% of a serial step,
    removing the exposed input saves up to X% of the step, while making
    compute twice as fast saves (1-X)/2.

    Parameters
    ----------
    exposed_fraction : float
        Exposed input time / step time, 0..1.
    threshold : float
        Share above which the job is host-bound (notebook 01's
        ``host_bound_threshold``, default 0.10).
    device_kind : str
        "cpu", "cuda" or "npu"; on "cpu" the reason says that the "device"
        is the same processor that prepares the input.

    Returns
    -------
    (recommendation, reason) : tuple of str
        recommendation is "host-bound" or "device-bound".
    """
    pct, thr = 100 * exposed_fraction, 100 * threshold
    compute_pct = 100 - pct
    busy = ("the training computation, on the same CPU, runs" if device_kind == "cpu" else "the device computes")
    if exposed_fraction > threshold:
        # on a CPU the input shares the cores with the computation: hiding it behind compute (workers, a
        # prefetcher) is not free there (notebook 05 measures it), so only making it cheaper is a sure saving
        lever = ("making the input cheaper (hiding it behind compute needs idle cores)" if device_kind == "cpu"
                 else "hiding or speeding up the input")
        reason = (f"input preparation and copy are exposed for {pct:.0f}% of each step (threshold {thr:.0f}%), "
                  f"{busy} for {compute_pct:.0f}%: {lever} can save up to "
                  f"{pct:.0f}% of the step, a 2x faster compute only {compute_pct / 2:.0f}%; fix the input first")
        return "host-bound", reason
    reason = (f"input is exposed for only {pct:.0f}% of each step (threshold {thr:.0f}%) and {busy} for "
              f"{compute_pct:.0f}%: device-side optimizations (mixed precision, memory format, fusion) pay off first")
    return "device-bound", reason
