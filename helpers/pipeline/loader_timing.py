"""Timing DataLoader settings: the mechanics of notebook 03's sweep, below the experiment.

:func:`run_sweep` times ``num_workers x prefetch_factor x persistent_workers`` (:func:`sweep_settings`, one
:class:`LoaderSetting` each) in rotated order, counting only batches finished after its clock started
(:func:`completion_window`); :func:`speedup_plausibility` flags a result no CPU-bound pipeline can reach.
:class:`SweepResult` holds the timings. :mod:`helpers.experiments.loader_sweep` runs it for the notebook, the
``bench`` command and the try-it panel.

The loaders are built by :mod:`helpers.pipeline.loader` and iterated by :mod:`helpers.pipeline.guarded`.
DataLoader workers started with ``spawn`` or ``forkserver`` unpickle the collate wrapper of this module by module
path (see "Fork and spawn" in :mod:`helpers.pipeline.loader`), so it is a module-level class, and this module
imports pandas only inside the functions that return tables.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch.utils.data._utils.collate import default_convert

from helpers.errors import DataError, ParameterError
from helpers.pipeline.guarded import SkipLog, iterate
from helpers.pipeline.loader import (
    TORCH_DEFAULT_PREFETCH,
    LoaderConfig,
    _is_int,
    close_loader,
    make_batch_sampler,
    make_loader,
)
from helpers.timing import Comparison, Measurement

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

logger = logging.getLogger(__name__)

__all__ = [
    "LoaderSetting",
    "sweep_settings",
    "SweepResult",
    "completion_window",
    "speedup_plausibility",
    "run_sweep",
]


# --------------------------------------------------------------------------- the sweep


@dataclass(frozen=True)
class LoaderSetting:
    """One point of the sweep.

    Attributes
    ----------
    num_workers : int
    prefetch_factor : int or None
        None with ``num_workers=0``.
    persistent_workers : bool
    """

    num_workers: int
    prefetch_factor: int | None = None
    persistent_workers: bool = False

    @property
    def label(self) -> str:
        """Short name, e.g. ``"workers=0"`` or ``"workers=2, prefetch=4, persistent"``."""
        if self.num_workers == 0:
            return "workers=0"
        return (f"workers={self.num_workers}, prefetch={self.prefetch_factor}"
                + (", persistent" if self.persistent_workers else ""))

    def config(self, base: LoaderConfig) -> LoaderConfig:
        """``base`` with this setting's three fields."""
        return base.with_(num_workers=self.num_workers, prefetch_factor=self.prefetch_factor,
                          persistent_workers=self.persistent_workers)

    @property
    def in_flight(self) -> int:
        """Batches a loader with this setting has requested but not yet delivered: ``num_workers x prefetch_factor``.

        torch dispatches that many tasks when an epoch starts and one more
        for each batch delivered (``_MultiProcessingDataLoaderIter``), so at
        any moment up to this many batches may be finished ahead of the
        consumer. 0 with ``num_workers=0``; a ``prefetch_factor`` of None
        counts as torch's default,
        :data:`helpers.pipeline.loader.TORCH_DEFAULT_PREFETCH`.
        """
        if self.num_workers == 0:
            return 0
        pf = self.prefetch_factor if self.prefetch_factor is not None else TORCH_DEFAULT_PREFETCH
        return self.num_workers * pf

    @property
    def min_timed_batches(self) -> int:
        """The shortest timing window worth trusting for this setting: two batches per worker (1 without workers).

        Each worker finishes batches at its own pace and phase; a window of
        fewer completions than ``2 x num_workers`` can fall inside one burst
        of nearly simultaneous completions (or between two), which makes it
        noisy and biased either way by that phase. :func:`run_sweep` counts
        such a window anyway; :meth:`SweepResult.short_windows` lists them.
        """
        return max(1, 2 * self.num_workers)


def sweep_settings(num_workers_list: Sequence[int], prefetch_factor_list: Sequence[int]) -> tuple[LoaderSetting, ...]:
    """The settings to time: ``num_workers x prefetch_factor x persistent_workers``.

    ``num_workers=0`` appears once (neither of the other two applies) and is
    always included, as the reference the verdict compares against.

    Parameters
    ----------
    num_workers_list : sequence of int
        Each >= 0; duplicates removed.
    prefetch_factor_list : sequence of int
        Each >= 1; must be non-empty when any ``num_workers > 0``.

    Returns
    -------
    tuple of LoaderSetting
        Sorted by workers, prefetch, persistent.

    Raises
    ------
    ParameterError
        For a negative worker count, a prefetch factor < 1, or an empty
        ``prefetch_factor_list`` with workers to sweep.
    """
    workers = sorted({int(w) for w in num_workers_list} | {0})
    if any(w < 0 for w in workers):
        raise ParameterError(f"num_workers_list={list(num_workers_list)!r}: every value must be >= 0")
    prefetch = sorted({int(p) for p in prefetch_factor_list})
    if any(p < 1 for p in prefetch):
        raise ParameterError(f"prefetch_factor_list={list(prefetch_factor_list)!r}: every value must be >= 1")
    if any(w > 0 for w in workers) and not prefetch:
        raise ParameterError("prefetch_factor_list is empty but num_workers_list has values > 0; give e.g. [2]")
    out = [LoaderSetting(0)]
    for w in workers:
        if w == 0:
            continue
        for p in prefetch:
            for persistent in (False, True):
                out.append(LoaderSetting(w, p, persistent))
    return tuple(out)


class _StampedCollate:
    """collate_fn wrapper that returns ``(batch, completion time)``; runs where the batch is made.

    The time is ``time.perf_counter()`` read right after the batch is
    collated, in the worker process (or in the main process with
    ``num_workers=0``). On Linux, macOS and Windows ``perf_counter`` reads a
    system-wide monotonic clock (``CLOCK_MONOTONIC``, ``mach_absolute_time``,
    ``QueryPerformanceCounter``), so it can be compared with the main
    process's; :func:`run_sweep` checks that anyway (no batch may be
    finished after it arrived) and falls back to arrival times if not.
    Module-level, so spawn and forkserver workers can unpickle it.
    """

    def __init__(self, inner: Callable[[Any], Any]) -> None:
        self.inner = inner

    def __call__(self, data: Any) -> tuple[Any, float]:
        out = self.inner(data)
        return out, time.perf_counter()


#: Slack, seconds, allowed between a batch's completion stamp and its arrival in the main process before the
#: two clocks are taken to disagree (the stamp is read before the batch is pickled and sent, so it must be earlier).
_CLOCK_SLACK_S = 1e-3


def completion_window(t0: float, completed_s: Sequence[float], n: int) -> tuple[float, float, int]:
    """The timing window of ``n`` batch completions, all after ``t0``, between two completions.

    The window opens at the first batch completion after ``t0`` and closes
    at the ``n``-th completion after that one, so it holds exactly ``n``
    completions and both of its ends are the same kind of moment (a batch
    just finished). Batches finished at or before ``t0`` (prepared ahead by
    workers while the consumer waited for an earlier batch) are outside it
    by construction, however late they are consumed. Opening on a completion
    instead of at ``t0`` also keeps out the work that was already under way
    at ``t0`` (up to one partly made batch per worker), which would
    otherwise be credited to the window.

    Parameters
    ----------
    t0 : float
        When the clock started, seconds on the same clock as ``completed_s``.
    completed_s : sequence of float
        Completion times of every batch delivered after the clock started,
        seconds (all of them: a batch finished inside the window but
        delivered after it must be included).
    n : int
        Completions the window must hold (>= 1).

    Returns
    -------
    start : float
        Completion time of the first batch finished after ``t0``.
    end : float
        Completion time of the ``n``-th batch finished after ``start``.
    prepared_ahead : int
        Batches in ``completed_s`` finished at or before ``t0`` (not counted).

    Raises
    ------
    ParameterError
        If ``n`` < 1.
    DataError
        If fewer than ``n + 1`` batches finished after ``t0``.
    """
    if not _is_int(n) or n < 1:
        raise ParameterError(f"completion_window: n={n!r}: allowed: an int >= 1")
    after = sorted(float(c) for c in completed_s if c > t0)
    ahead = len(completed_s) - len(after)
    if len(after) < n + 1:
        raise DataError(
            f"completion_window: only {len(after)} of the {len(completed_s)} batches finished after the clock "
            f"started ({ahead} were ready before it), {n + 1} needed; deliver at least n + 1 + num_workers x "
            "prefetch_factor batches after starting the clock"
        )
    return after[0], after[n], ahead


def speedup_plausibility(ratio: float, cores: int, *, baseline: str = "num_workers=0",
                         ci_low: float | None = None) -> str | None:
    """Why a measured speed-up of a CPU-bound loader over ``baseline`` cannot be real, or None when it can.

    A CPU-bound pipeline (decoding files already in the page cache) on
    ``cores`` usable cores can do at most ``cores`` times the work of the
    baseline, which itself keeps at least one core busy; more processes
    cannot add cores. A larger ratio means the measurement is wrong (batches
    counted that were made before the clock started, a window too short for
    the clock, other load on the machine during the baseline), not that the
    loader is that fast. A pipeline that waits on slow storage is not
    CPU-bound and is not covered by this check.

    Parameters
    ----------
    ratio : float
        Median time of the baseline / median time of the candidate (> 1: faster).
    cores : int
        Usable CPU cores (:func:`helpers.device.usable_cores`, >= 1).
    baseline : str
        Named in the sentence.
    ci_low : float, optional
        The lower bound of the ratio's confidence interval. When given, only a ratio whose whole interval
        lies above ``cores`` is impossible: a point estimate above it with an interval reaching below is a
        noisy measurement of a possible speed-up, not a wrong one.

    Returns
    -------
    str or None
        A sentence for the reader when ``ratio > cores`` (with ``ci_low``: when ``ci_low > cores``); else None.

    Raises
    ------
    ParameterError
        If ``cores`` < 1.
    """
    if not _is_int(cores) or cores < 1:
        raise ParameterError(f"speedup_plausibility: cores={cores!r}: allowed: an int >= 1")
    beyond = ratio if ci_low is None else ci_low
    if not math.isfinite(ratio) or not math.isfinite(beyond) or beyond > cores:
        what = f"a {ratio:.2f}x speed-up" + ("" if ci_low is None else f" (95% CI from {ci_low:.2f}x)")
        return (
            f"{what} over {baseline} on {cores} usable core(s) is not physically possible for a "
            f"CPU-bound pipeline (at most {cores}x: the baseline already keeps one core busy, and more processes "
            "add no cores), so this measurement is wrong - most likely other load on the machine or too little "
            "work timed; raise batches_per_trial and trials and run it on an otherwise idle machine"
        )
    return None


@dataclass(frozen=True)
class SweepResult:
    """The timings of a loader sweep.

    Attributes
    ----------
    trials : pandas.DataFrame
        One row per setting per trial: ``setting`` (label), ``num_workers``,
        ``prefetch_factor`` (float, NaN for 0 workers), ``persistent_workers``,
        ``trial``, ``position`` (order within the trial), ``first_batch_s``
        (iterator creation to first batch: worker start-up), ``elapsed_s``
        (seconds between the first batch finished after the clock started and
        the ``batches_per_trial``-th one after it; see :func:`run_sweep`),
        ``images`` (images in
        those batches), ``images_per_s``, ``in_flight`` (batches in flight,
        ``num_workers x prefetch_factor``), ``drained`` (batches delivered
        before the clock started), ``prepared_ahead`` (batches that were
        already finished when the clock started: not counted), ``clock``
        (``"completion"``: windows from the workers' completion times;
        ``"arrival"``: the fallback when the clocks disagree), ``skipped``
        (replaced images in the trial).
    settings : tuple of LoaderSetting
    batch_size : int
    batches_per_trial : int
    skipped : tuple of (str, str, int)
        Images replaced over the whole sweep, ``(file, reason, times)``.
    """

    trials: Any
    settings: tuple[LoaderSetting, ...]
    batch_size: int
    batches_per_trial: int
    skipped: tuple[tuple[str, str, int], ...] = ()

    def measurement(self, label: str):
        """The per-trial times of one setting as a :class:`helpers.timing.Measurement`.

        Parameters
        ----------
        label : str
            A setting's :attr:`LoaderSetting.label`.

        Returns
        -------
        helpers.timing.Measurement
            ``times_s``: seconds per trial for ``batches_per_trial`` batches;
            ``items_per_call``: images per trial (so ``rate`` is images/s).

        Raises
        ------
        ParameterError
            For an unknown label.
        """
        rows = self.trials[self.trials["setting"] == label]
        if rows.empty:
            raise ParameterError(f"no setting {label!r} in this sweep; known: {', '.join(s.label for s in self.settings)}")
        return Measurement(name=label, times_s=tuple(rows["elapsed_s"]), warmup=1,
                           items_per_call=float(self.batch_size * self.batches_per_trial))

    def summary(self) -> "pd.DataFrame":
        """One row per setting, fastest first.

        Returns
        -------
        pandas.DataFrame
            ``setting``, ``num_workers``, ``prefetch_factor``, ``persistent_workers``,
            ``images_per_s`` (median over trials), ``images_per_s_p25``/``_p75``
            (throughput at the time quartiles), ``first_batch_s`` (median,
            seconds), ``first_batch_max_s``, ``in_flight``,
            ``prepared_ahead_max`` (most batches found finished before the
            clock started in one trial, excluded from the timing), ``trials``.
        """
        import pandas as pd  # not at module level: see the module docstring (spawned workers import this module)

        rows = []
        for s in self.settings:
            m = self.measurement(s.label)
            sub = self.trials[self.trials["setting"] == s.label]
            rows.append({
                "setting": s.label, "num_workers": s.num_workers,
                "prefetch_factor": s.prefetch_factor, "persistent_workers": s.persistent_workers,
                "images_per_s": m.rate, "images_per_s_p25": m.rate_p25, "images_per_s_p75": m.rate_p75,
                "first_batch_s": float(sub["first_batch_s"].median()),
                "first_batch_max_s": float(sub["first_batch_s"].max()), "in_flight": s.in_flight,
                "prepared_ahead_max": int(sub["prepared_ahead"].max()), "trials": m.repeats,
            })
        df = pd.DataFrame(rows)
        return df.sort_values("images_per_s", ascending=False, kind="stable").reset_index(drop=True)

    def short_windows(self) -> list[str]:
        """Labels of settings whose ``batches_per_trial`` is below :attr:`LoaderSetting.min_timed_batches`."""
        return [s.label for s in self.settings if self.batches_per_trial < s.min_timed_batches]

    def ranking(self) -> list[str]:
        """Setting labels, fastest (highest median images/s) first."""
        return list(self.summary()["setting"])

    def compare(self, a_label: str, b_label: str, *, seed: int = 0):
        """Speedup of setting B over setting A, with a bootstrap interval.

        Returns
        -------
        helpers.timing.Comparison
            ``ratio`` = median time of A / median time of B (> 1: B faster),
            interval from :func:`helpers.timing.bootstrap_ratio_ci` over the
            per-trial times. With few trials the interval is wide, and
            honestly so.
        """
        return Comparison.from_measurements(self.measurement(a_label), self.measurement(b_label), seed=seed)


def run_sweep(make_dataset: Callable[[LoaderSetting], Any], n_items: int, settings: Sequence[LoaderSetting], *,
              base: LoaderConfig, batches_per_trial: int, trials: int, acc: Any = None,
              collate_fn: Callable | None = None, name: str = "sweep") -> SweepResult:
    """Time each loader setting over ``trials`` rounds, in rotated order.

    One trial of one setting is one loader pass of ``drain +
    batches_per_trial + in_flight + 1`` batches (the sampler cycles through
    the data, so a trial may span several epochs of a small dataset):

    1. **drain**: the first ``max(1, num_workers x prefetch_factor)``
       batches (:attr:`LoaderSetting.in_flight`, every task torch sends out
       when the epoch starts) are delivered untimed. The first one's latency
       from iterator creation (worker start-up, or resuming persistent
       workers) is recorded apart as ``first_batch_s``.
    2. **the window**: the clock starts when the last drained batch arrives.
       Every batch carries the time it was *finished* (read in the worker
       right after collation, :class:`_StampedCollate`). The window opens at
       the first batch finished after the clock started and closes
       ``batches_per_trial`` completions later (:func:`completion_window`):
       a batch a worker finished before the clock started is never counted,
       however late it is consumed, so work done before the window cannot be
       credited to it; how many were found is recorded as
       ``prepared_ahead``. Both ends of the window are completions, so the
       partly made batches under way at either end balance out.
    3. **the tail**: the ``in_flight + 1`` batches still to come are
       delivered too (untimed), so that every batch finished inside the
       window is seen and no worker is left working while the next setting
       is timed.

    If a completion time is later than the batch's arrival (the clocks of
    the processes disagree), the trial falls back to arrival times: the
    window runs from the first batch's arrival after the drain to the
    ``batches_per_trial``-th arrival after it (logged, ``clock="arrival"``).

    The consumer does nothing with a batch, so it never falls behind and
    ``prefetch_factor`` can only matter through the workers' own scheduling;
    its real use, absorbing uneven training steps, is measured with compute
    in notebook 05. Round ``t`` visits the settings starting at position
    ``t mod n``, so a slow drift of the machine is spread over all settings.
    A persistent-workers setting keeps one loader for all its trials (that
    is what persistence buys: no worker start-up per epoch); the others
    start new workers each trial.

    Parameters
    ----------
    make_dataset : callable
        ``make_dataset(setting)`` returns the batched dataset for a setting
        (so a per-setting thread count can be chosen); module-level class
        instances only (workers may pickle them).
    n_items : int
        Items in that dataset (>= 1; fewer than one batch is fine: the
        sampler cycles).
    settings : sequence of LoaderSetting
        E.g. :func:`sweep_settings`.
    base : helpers.pipeline.loader.LoaderConfig
        Batch size, seed, timeout, pinning, start method; its worker fields
        are replaced by each setting's.
    batches_per_trial : int
        Batch completions timed per setting and trial (>= 1).
    trials : int
        Rounds (>= 1).
    acc : helpers.device.Accelerator, optional
        Decides pinning.
    collate_fn : callable, optional
        Module-level function (picklable); default torch's
        ``default_convert``. Wrapped to stamp completion times.
    name : str
        Used in error messages.

    Returns
    -------
    SweepResult

    Raises
    ------
    ParameterError
        For ``batches_per_trial`` or ``trials`` < 1 or no settings.
    DataError
        On a loader failure (the message names the setting).
    """
    import pandas as pd  # not at module level: see the module docstring (spawned workers import this module)

    _require_count("batches_per_trial", batches_per_trial)
    _require_count("trials", trials)
    settings = tuple(settings)
    if not settings:
        raise ParameterError("run_sweep: no settings to time")
    stamped = _StampedCollate(collate_fn if collate_fn is not None else default_convert)
    keep: dict[LoaderSetting, Any] = {}
    rows = []
    skipped = SkipLog()
    try:
        for t in range(trials):
            k = t % len(settings)
            order = settings[k:] + settings[:k]
            for position, s in enumerate(order):
                loader = _trial_loader(make_dataset, n_items, s, keep, base=base,
                                       batches_per_trial=batches_per_trial, acc=acc, collate_fn=stamped)
                rows.append(_time_trial(loader, s, f"{name} [{s.label}]", base=base,
                                        batches_per_trial=batches_per_trial, skipped=skipped, trial=t,
                                        position=position))
    finally:
        for loader in keep.values():
            close_loader(loader)
    return SweepResult(trials=pd.DataFrame(rows), settings=settings, batch_size=base.batch_size,
                       batches_per_trial=batches_per_trial, skipped=skipped.entries())


def _require_count(name: str, value: Any) -> None:
    """Raise a ParameterError unless ``value`` (the parameter ``name``) is an int >= 1."""
    if not _is_int(value) or value < 1:
        raise ParameterError(f"{name}={value!r}: allowed: an int >= 1")


def _drain_and_tail(s: LoaderSetting) -> tuple[int, int]:
    """Batches of one trial delivered untimed before the window and after it: ``(max(1, in_flight), in_flight + 1)``."""
    return max(1, s.in_flight), s.in_flight + 1


def _trial_loader(make_dataset: Callable[[LoaderSetting], Any], n_items: int, s: LoaderSetting,
                  keep: dict[LoaderSetting, Any], *, base: LoaderConfig, batches_per_trial: int, acc: Any,
                  collate_fn: Callable) -> Any:
    """The loader for one trial of ``s``: the one kept in ``keep`` for persistent workers, else a new one."""
    cfg = s.config(base)
    drain, tail = _drain_and_tail(s)
    loader = keep.get(s)
    if loader is None:
        sampler = make_batch_sampler(n_items, cfg, num_batches=drain + batches_per_trial + tail)
        loader = make_loader(make_dataset(s), cfg, acc, batch_sampler=sampler, collate_fn=collate_fn)
        if s.persistent_workers:
            keep[s] = loader
    return loader


def _time_trial(loader: Any, s: LoaderSetting, label: str, *, base: LoaderConfig, batches_per_trial: int,
                skipped: SkipLog, trial: int, position: int) -> dict[str, Any]:
    """One trial of ``s`` (drain, window, tail: see :func:`run_sweep`): its row of :attr:`SweepResult.trials`."""
    drain, tail = _drain_and_tail(s)
    n_skipped = 0
    completed: list[float] = []
    arrived: list[float] = []
    with iterate(loader, name=label) as it:
        for batch, _done in it.take(drain):
            n_skipped += skipped.add(batch)
        t0 = time.perf_counter()
        for batch, done in it:
            arrived.append(time.perf_counter())
            completed.append(done)
            n_skipped += skipped.add(batch)
        first_s = it.first_batch_s
    if len(completed) != batches_per_trial + tail:
        raise DataError(f"{label}: expected {batches_per_trial + tail} batches after the drain, got "
                        f"{len(completed)}; the loader's sampler was changed or ran out")
    start, end, ahead, clock = _trial_window(label, t0, completed, arrived, batches_per_trial)
    elapsed = end - start
    images = batches_per_trial * base.batch_size
    row = {
        "setting": s.label, "num_workers": s.num_workers,
        "prefetch_factor": float("nan") if s.prefetch_factor is None else float(s.prefetch_factor),
        "persistent_workers": s.persistent_workers, "trial": trial, "position": position,
        "first_batch_s": first_s, "elapsed_s": elapsed, "images": images,
        "images_per_s": images / elapsed if elapsed > 0 else float("nan"),
        "in_flight": s.in_flight, "drained": drain, "prepared_ahead": ahead, "clock": clock,
        "skipped": n_skipped,
    }
    logger.info("%s trial %d: %.0f images/s, first batch %.3f s, %d batch(es) ready before the clock "
                "(not counted)", label, trial, row["images_per_s"], first_s, ahead)
    return row


def _trial_window(label: str, t0: float, completed: Sequence[float], arrived: Sequence[float],
                  batches_per_trial: int) -> tuple[float, float, int, str]:
    """A trial's window ``(start, end, prepared_ahead, clock)``, seconds; by arrival if the clocks disagree."""
    late = max(c - a for c, a in zip(completed, arrived))
    if late <= _CLOCK_SLACK_S:
        start, end, ahead = completion_window(t0, completed, batches_per_trial)
        return start, end, ahead, "completion"
    logger.warning("%s: a batch was stamped %.3f s after it arrived: the worker and main-process "
                   "clocks disagree; timing this trial by arrival instead", label, late)
    return arrived[0], arrived[batches_per_trial], 0, "arrival"
