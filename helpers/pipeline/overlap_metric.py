"""The overlap metric of notebook 05: how much of the input pipeline's work a training loop still waits for.

*Input work* is what the pipeline spent producing a batch (``prep_s`` of the host batch: decode, augment, tokenize,
collate, wherever it ran) plus its copy; *exposed input* is what the training loop waited for it (the ``data`` +
``h2d`` phases of the timed loop, :class:`helpers.compute.train.TimedLoop`). Each is summarized by its median over
the measured steps; the hidden fraction is ``1 - exposed / work`` and the exposed fraction ``exposed / step time``,
both ratios of those medians (:func:`overlap_stats`, :class:`OverlapStats`). :func:`input_work_per_step` reads the
input work from a :class:`helpers.pipeline.prefetch.RecordingLoader`'s batch log, :func:`timeline_frame` puts the
workers' preparation, the copies and the loop's phases on one clock, and :class:`OverlapRun` holds one timed run and
all of it. Notebook 05's experiment, which runs the variants and decides, is :mod:`helpers.experiments.overlap`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from helpers.errors import ParameterError

__all__ = ["OverlapRun", "OverlapStats", "input_work_per_step", "overlap_stats", "timeline_frame"]


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
