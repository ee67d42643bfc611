"""Notebook 05's decision: whether to enable the overlap, from a run before and a run after, and why it could not
work where it did not (:func:`overlap_decision`, :func:`overlap_limits`: the decision and its sentences).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from helpers.pipeline.overlap_metric import OverlapRun
from helpers.timing import Comparison, Measurement
from helpers.verdict import Action

__all__ = ["EXPOSED_FLOOR_S", "FEW_BATCHES_PER_EPOCH", "NOTHING_TO_HIDE", "overlap_decision", "overlap_limits",
           "ran_alike"]


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


def ran_alike(before: OverlapRun, after: OverlapRun) -> str:
    """What the two sides ran with, in words: ``"both at 1 torch thread(s), batch 32"``, or each side's where they
    differ (then the comparison is not like with like, and the sentence says so); empty where the runs' settings
    do not state them.

    Parameters
    ----------
    before, after : OverlapRun
        Their ``settings``' ``torch_threads`` (count) and ``batch_size`` (samples) are read.

    Returns
    -------
    str
    """
    s_b, s_a = before.settings, after.settings
    if not all(k in s for s in (s_b, s_a) for k in ("torch_threads", "batch_size")):
        return ""
    if (s_b["torch_threads"], s_b["batch_size"]) == (s_a["torch_threads"], s_a["batch_size"]):
        return f"both at {s_a['torch_threads']} torch thread(s), batch {s_a['batch_size']}"
    return (f"NOT like with like: before at {s_b['torch_threads']} torch thread(s), batch {s_b['batch_size']}, "
            f"after at {s_a['torch_threads']} torch thread(s), batch {s_a['batch_size']}")


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
        ``recommendation``, ``reason`` (a sentence with the numbers and the
        torch threads and batch of each side, :func:`ran_alike`),
        ``exposed``, ``step`` and ``compute`` (:class:`helpers.timing.Comparison`
        per step: before as A, after as B, named by the runs' labels; ratio > 1
        means after is shorter),
        ``dropped`` and ``slower`` (bool), ``notes`` (list of str, from
        :func:`overlap_limits`; empty when nothing limited the overlap).
    """
    def exposed(v: OverlapRun) -> tuple[float, ...]:
        per_step = (v.run.steps["data"] + v.run.steps["h2d"]).to_numpy(dtype=float)
        return tuple(np.maximum(per_step, EXPOSED_FLOOR_S))

    def per_step(v: OverlapRun, column: str) -> tuple[float, ...]:
        return tuple(np.maximum(v.run.steps[column].to_numpy(dtype=float), EXPOSED_FLOOR_S))

    a, b = before.label, after.label
    exposed_cmp = Comparison.from_measurements(Measurement(a, exposed(before), warmup=0),
                                               Measurement(b, exposed(after), warmup=0), seed=seed)
    step_cmp = Comparison.from_measurements(Measurement(a, per_step(before, "step_s"), warmup=0),
                                            Measurement(b, per_step(after, "step_s"), warmup=0), seed=seed)
    compute_cmp = Comparison.from_measurements(Measurement(a, per_step(before, "compute"), warmup=0),
                                               Measurement(b, per_step(after, "compute"), warmup=0),
                                               seed=seed)
    dropped = exposed_cmp.ci_low > 1.0
    slower = step_cmp.ci_high < 1.0
    b, a = before.stats, after.stats
    workers = after.settings.get("num_workers", "?")
    alike = ran_alike(before, after)
    numbers = (f"exposed input {b.exposed_fraction:.0%} -> {a.exposed_fraction:.0%} of the step "
               f"({b.median_exposed_s * 1e3:.1f} -> {a.median_exposed_s * 1e3:.1f} ms, before/after "
               f"{_interval(exposed_cmp)}), {a.hidden_fraction:.0%} of the input work hidden behind compute, "
               f"step {b.median_step_s * 1e3:.0f} -> {a.median_step_s * 1e3:.0f} ms (before/after "
               f"{_interval(step_cmp)}); medians of {a.steps} steps" + (f", {alike}" if alike else ""))
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
