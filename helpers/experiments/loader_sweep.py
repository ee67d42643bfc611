"""Notebook 03's experiment: time DataLoader worker settings, and the datasets its demonstrations use.

:func:`run` does the notebook's whole measurement on the notebook's job (the built-in job's batched pipeline, or a
user's job's own dataset: the job decides, through :attr:`helpers.jobs.base.Job.has_batched_pipeline` and
:meth:`helpers.jobs.base.Job.image_data`) and returns a :class:`LoaderResult`, which knows the notebook's records,
its verdict and its try-it panel; :func:`fault_demo` shows the loader's guards.

* :func:`run_sweep` times ``num_workers x prefetch_factor x persistent_workers``
  (:func:`sweep_settings`, one :class:`LoaderSetting` each) in rotated
  order, counting only batches finished after its clock started
  (:func:`completion_window`); :func:`speedup_plausibility` flags a result
  no CPU-bound pipeline can reach. :class:`SweepResult` holds the timings.
* :func:`batches_equal` checks that a loader with workers delivers the same
  batches as the main process.
* :class:`MetadataDataset` shows how a forked worker's memory grows when
  per-sample metadata is kept in Python objects (pytorch/pytorch#13246), and
  :class:`FaultyDataset` fails inside workers to show the guards of
  :mod:`helpers.pipeline.guarded`.

The loaders are built by :mod:`helpers.pipeline.loader` and iterated by
:mod:`helpers.pipeline.guarded`. DataLoader workers started with ``spawn`` or
``forkserver`` unpickle the datasets and the collate wrapper of this module
by module path (see "Fork and spawn" in :mod:`helpers.pipeline.loader`), so
they are module-level classes, and this module imports pandas only inside
the functions that return tables.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import Dataset
from torch.utils.data._utils.collate import default_convert

from helpers import specs
from helpers.checklist import Item
from helpers.errors import DataError, ParameterError
from helpers.experiments.base import Experiment, ExperimentResult, Optimization, checked_fields, no_expected_warnings
from helpers.experiments.training import same_values
from helpers.live import Knob, LivePoint, Progress, TrySpec, no_progress
from helpers.params import Param
from helpers.pipeline.guarded import SkipLog, iterate
from helpers.pipeline.loader import (
    TORCH_DEFAULT_PREFETCH,
    LoaderConfig,
    _is_int,
    close_loader,
    make_batch_sampler,
    make_loader,
)
from helpers.results import Records
from helpers.timing import Comparison, Measurement
from helpers.verdict import Action, Verdict

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

logger = logging.getLogger(__name__)

__all__ = [
    "MetadataDataset",
    "FaultyDataset",
    "batches_equal",
    "LoaderSetting",
    "sweep_settings",
    "SweepResult",
    "completion_window",
    "speedup_plausibility",
    "run_sweep",
    "live_point",
    "try_loader",
    "LoaderResult",
    "fault_demo",
    "run",
]


# --------------------------------------------------------------------------- demonstration datasets


class MetadataDataset(Dataset):
    """A batched dataset of per-sample metadata only, to show how worker memory grows (pytorch/pytorch#13246).

    Each item has a path, a caption and a label. ``storage="arrays"`` keeps
    them in three NumPy arrays (fixed-width unicode and int64): reading an
    item writes nothing to the shared pages. ``storage="objects"`` keeps
    them as a Python list of dicts, the way people often write it: reading
    an item writes the reference counts of the dict and its strings, so a
    forked worker copies every page it reads, and its USS grows through the
    epoch towards the size of the whole list.

    Parameters
    ----------
    n_items : int
        Items (>= 1).
    storage : {"arrays", "objects"}
    seed : int
        Seed of the generated captions and labels.

    Raises
    ------
    ParameterError
        For an invalid ``n_items`` or ``storage``.
    """

    def __init__(self, n_items: int, storage: str = "arrays", *, seed: int = 0) -> None:
        if not _is_int(n_items) or n_items < 1:
            raise ParameterError(f"n_items={n_items!r}: allowed: an int >= 1")
        if storage not in ("arrays", "objects"):
            raise ParameterError(f"storage={storage!r}: allowed: 'arrays' or 'objects'")
        self.storage = storage
        rng = np.random.default_rng(seed)
        labels = rng.integers(0, 10, size=n_items)
        words = np.array(["a cat", "a red cup", "a rocket", "grass", "a wall of bricks", "distant galaxies"])
        picks = rng.integers(0, len(words), size=n_items)
        if storage == "arrays":
            self.paths = np.array([f"images/{i:07d}.jpg" for i in range(n_items)])
            self.captions = words[picks]
            self.labels = labels.astype(np.int64)
            self.items = None
        else:
            self.items = [
                {"path": f"images/{i:07d}.jpg", "caption": f"{words[p]} number {i}", "label": int(lab)}
                for i, (p, lab) in enumerate(zip(picks.tolist(), labels.tolist()))
            ]

    def __len__(self) -> int:
        return len(self.items) if self.items is not None else int(self.labels.shape[0])

    def __getitem__(self, indices: list[int]) -> dict:
        """Read the metadata of a batch of items.

        Returns
        -------
        dict
            ``label``: int64 tensor (B,); ``caption_chars``: int64 tensor (B,),
            characters per caption (so every caption is really read).
        """
        if self.items is not None:
            rows = [self.items[i] for i in indices]
            labels = [r["label"] for r in rows]
            chars = [len(r["caption"]) + len(r["path"]) for r in rows]
        else:
            idx = np.asarray(indices, dtype=np.int64)
            labels = self.labels[idx]
            chars = np.strings.str_len(self.captions[idx]) + np.strings.str_len(self.paths[idx])
        return {"label": torch.as_tensor(np.asarray(labels, dtype=np.int64)),
                "caption_chars": torch.as_tensor(np.asarray(chars, dtype=np.int64))}


class FaultyDataset(Dataset):
    """A per-item dataset that fails inside DataLoader workers, to show and test the guards.

    In the main process (``num_workers=0``) items load normally, so the
    failure is clearly the worker's.

    Parameters
    ----------
    n_items : int
        Items (>= 1).
    fault : {"hang", "exit"}
        ``"hang"``: ``__getitem__`` sleeps forever in a worker (a read that
        never returns); ``"exit"``: the worker process ends with
        ``os._exit(exit_code)`` (as if killed).
    exit_code : int, default 1
    """

    def __init__(self, n_items: int = 16, fault: str = "hang", *, exit_code: int = 1) -> None:
        if fault not in ("hang", "exit"):
            raise ParameterError(f"fault={fault!r}: allowed: 'hang' or 'exit'")
        self.n_items, self.fault, self.exit_code = int(n_items), fault, int(exit_code)

    def __len__(self) -> int:
        return self.n_items

    def __getitem__(self, i: int) -> dict:
        if torch.utils.data.get_worker_info() is not None:
            if self.fault == "exit":
                os._exit(self.exit_code)
            while True:  # a hang: never returns
                time.sleep(3600)
        return {"label": torch.tensor(int(i), dtype=torch.int64)}


def batches_equal(a: Any, b: Any, keys: Sequence[str] = ("image", "tokens", "label")) -> bool:
    """True when two batches hold exactly the same tensors under ``keys``.

    Parameters
    ----------
    a, b : dict, or any nesting of tuples, lists, dicts and tensors
        Batches; for dicts, keys missing from both are ignored; other batches are compared whole
        (same structure, equal tensors and values).
    keys : sequence of str

    Returns
    -------
    bool
    """
    if not isinstance(a, Mapping) or not isinstance(b, Mapping):
        return same_values(a, b)  # a user's batch: tuples, lists, dicts of tensors
    for key in keys:
        if key not in a and key not in b:
            continue
        if key not in a or key not in b:
            return False
        x, y = torch.as_tensor(a[key]), torch.as_tensor(b[key])
        if x.shape != y.shape or x.dtype != y.dtype or not torch.equal(x, y):
            return False
    return True


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


# --------------------------------------------------------------------------- try it


def live_point(result: SweepResult, label: str, *, items: str = "images") -> LivePoint:
    """One setting of a sweep as a "try it" point: its median throughput over the trials and the IQR.

    Parameters
    ----------
    result : SweepResult
        From :func:`run_sweep` (notebook 03's sweep or confirmation, or :func:`try_loader`'s own).
    label : str
        The setting's :attr:`LoaderSetting.label`.
    items : str, default "images"
        What the dataset yields, for the unit ("images" for the built-in job, "samples" for a user's).

    Returns
    -------
    LivePoint
        metric ``throughput``, unit ``{items}/s``; low/high: the rates at the quartiles of the per-trial times;
        ``extra``: ``first_batch_s`` (median start-up latency, seconds), ``repeats`` and ``trials`` (the
        trials, the record's repeats), ``batches_per_trial``.

    Raises
    ------
    ParameterError
        For a label the sweep did not time.
    """
    m = result.measurement(label)
    first = result.trials.loc[result.trials["setting"] == label, "first_batch_s"]
    first_s = float(first.median())
    low, high = sorted((m.rate_p25, m.rate_p75))
    sentence = (f"{label}: {m.rate:,.0f} {items}/s (IQR {low:,.0f}-{high:,.0f}, {m.repeats} trial(s) of "
                f"{result.batches_per_trial} timed batches); first batch after {first_s:.2f} s")
    return LivePoint.from_rate(label, m, unit=f"{items}/s", sentence=sentence, repeats=m.repeats,
                               first_batch_s=first_s, trials=m.repeats, batches_per_trial=result.batches_per_trial)


def try_loader(make_dataset: Callable[[LoaderSetting], Any], n_items: int, *, base: LoaderConfig,
               num_workers: int, prefetch_factor: int | None, persistent_workers: bool,
               batches_per_trial: int = 8, trials: int = 2, acc: Any = None, items: str = "images",
               progress: Progress = no_progress) -> LivePoint:
    """Notebook 03's loader timing at one setting of ``num_workers``, ``prefetch_factor`` and ``persistent_workers``.

    The setting is timed by :func:`run_sweep` exactly as the notebook's sweep times each of its settings: the
    batches in flight drained untimed, only batches finished after the clock started counted, the first batch's
    latency kept apart, ``trials`` loader passes (one loader kept for all of them with persistent workers).
    The window is at least two batches per worker (:attr:`LoaderSetting.min_timed_batches`), as in the
    notebook's held-out confirmation.

    ``prefetch_factor`` is handled as :class:`torch.utils.data.DataLoader` handles it: it applies only with
    ``num_workers > 0``, and a value with ``num_workers=0`` is refused (torch raises ``ValueError``; here a
    ParameterError before any work); None means torch's default (2 batches per worker with workers, none
    without). ``persistent_workers=True`` also needs ``num_workers > 0``, as in torch.

    Parameters
    ----------
    make_dataset : callable
        ``make_dataset(setting)`` returns the batched dataset (as :func:`run_sweep`; notebook 03's
        ``dataset_for``, which gives each worker ``cores // num_workers`` decode threads, or the user's job's).
    n_items : int
        Items in that dataset.
    base : helpers.pipeline.loader.LoaderConfig
        Batch size, seed, timeout, pinning: the notebook's ``base``.
    num_workers : int
        Worker processes (>= 0; 0 builds the batches in the main process).
    prefetch_factor : int or None
        Batches each worker prepares ahead (>= 1), or None for torch's default; must be None with
        ``num_workers=0``.
    persistent_workers : bool
        Keep the workers alive between loader passes (needs ``num_workers > 0``).
    batches_per_trial : int, default 8
        Timed batch completions per trial (>= 1; raised to two per worker).
    trials : int, default 2
        Loader passes (>= 1).
    acc : helpers.device.Accelerator, optional
        Decides pinning, as in the notebook.
    items : str, default "images"
        What one item is, for the unit: ``"images"`` (built-in job) or ``"samples"`` (a user's).
    progress : callable
        ``progress(done, trials)``: trials finished (counted as each new loader is built, outside the timing;
        with persistent workers one loader serves every trial, so it jumps from 0 to the end).

    Returns
    -------
    LivePoint
        metric ``throughput``, unit ``{items}/s`` (:func:`live_point`); ``extra`` also holds
        ``num_workers``, ``prefetch_factor``, ``persistent_workers`` and ``in_flight``.

    Raises
    ------
    helpers.errors.ParameterError
        For a negative ``num_workers``, a ``prefetch_factor`` < 1, a ``prefetch_factor`` or
        ``persistent_workers=True`` with ``num_workers=0`` (set it to None / False, or use workers), a
        non-bool ``persistent_workers``, or ``batches_per_trial``/``trials`` < 1.
    helpers.errors.DataError
        On a loader failure (a worker that hangs or dies), naming the setting.
    """
    if not isinstance(persistent_workers, bool):
        raise ParameterError(f"persistent_workers must be True or False, got {persistent_workers!r}")
    setting = LoaderSetting(num_workers, prefetch_factor, persistent_workers)
    setting.config(base)  # LoaderConfig refuses what torch's DataLoader refuses, before any work
    _require_count("trials", trials)
    _require_count("batches_per_trial", batches_per_trial)
    result = run_sweep(_progress_per_loader(make_dataset, progress, trials), n_items, (setting,), base=base,
                       batches_per_trial=max(int(batches_per_trial), setting.min_timed_batches), trials=trials,
                       acc=acc, name="try it")
    progress(trials, trials)
    point = live_point(result, setting.label, items=items)
    return dataclasses.replace(point, extra={**point.extra, "num_workers": num_workers,
                                             "prefetch_factor": prefetch_factor,
                                             "persistent_workers": persistent_workers,
                                             "in_flight": setting.in_flight})


def _progress_per_loader(make_dataset: Callable[[LoaderSetting], Any], progress: Progress,
                         trials: int) -> Callable[[LoaderSetting], Any]:
    """``make_dataset`` that first calls ``progress(trials done, trials)``: once per new loader, outside the timing."""
    built = [0]

    def dataset_and_progress(s: LoaderSetting):
        progress(min(built[0], trials), trials)  # a new loader: the trials before it are done (outside the timing)
        built[0] += 1
        return make_dataset(s)

    return dataset_and_progress


# --------------------------------------------------------------------------- the verdict

#: Notebook whose verdict :func:`verdict` gives.
NOTEBOOK = "03_dataloader_tuning"
#: Least lower bound of the speedup's 95% interval over num_workers=0 that counts as a gain.
SPEEDUP_THRESHOLD = 1.05


def verdict(best: LoaderSetting, over_zero: Comparison | None, *, best_rate: float, zero_rate: float,
            implausible: str | None, cores: int, trials: int, context: str, items: str = "images") -> Verdict:
    """Notebook 03's verdict from the held-out confirmation of the sweep's best setting against num_workers=0.

    Parameters
    ----------
    best : LoaderSetting
        The sweep's fastest setting.
    over_zero : helpers.timing.Comparison or None
        The confirmation (num_workers=0 as A, ``best`` as B); None when num_workers=0 won the sweep.
    best_rate, zero_rate : float
        Images/s of ``best`` and of num_workers=0 in the confirmation (in the sweep when ``over_zero`` is None).
    implausible : str or None
        :func:`speedup_plausibility`'s note when the speedup exceeds what the cores allow.
    cores : int
        Usable CPU cores.
    trials : int
        Confirmation trials.
    context : str
        What was measured, in one sentence.
    items : str, default "images"
        What the dataset yields, for the rates in the reason ("images" for the built-in job, "samples" for a user's).

    Returns
    -------
    helpers.verdict.Verdict
        metric ``speedup`` (x over num_workers=0); action on ``num_workers``; ``extra``: ``best_setting``
        (the label), ``plausible`` and, with a confirmation, ``decision_threshold`` (:data:`SPEEDUP_THRESHOLD`).
    """
    label = best.label
    if over_zero is None:
        value, spread = 1.0, None
        recommendation = "leave off"
        reason = (f"num_workers=0 was the fastest setting ({zero_rate:.0f} {items}/s): on {cores} core(s) worker "
                  "processes did not pay for themselves; keep the batched pipeline in the main process")
    else:
        value = over_zero.ratio
        spread = {"ci_low": over_zero.ci_low, "ci_high": over_zero.ci_high, "confidence": over_zero.confidence}
        ci = f"95% CI {over_zero.ci_low:.2f}-{over_zero.ci_high:.2f}"
        threshold = SPEEDUP_THRESHOLD
        if implausible:
            recommendation = "not applicable"
            reason = (f"no recommendation: {label} measured {value:.2f}x num_workers=0 ({best_rate:.0f} vs "
                      f"{zero_rate:.0f} {items}/s; {ci}), more than the {cores} usable core(s) allow, so the "
                      "measurement is not trustworthy; re-run with larger batches_per_trial and trials on an idle "
                      "machine")
        elif over_zero.ci_low > threshold:
            recommendation = "enable"
            reason = (f"use {label}: {best_rate:.0f} {items}/s, {value:.2f}x num_workers=0 ({zero_rate:.0f} "
                      f"{items}/s; {ci}, above the {threshold}x threshold)")
        else:
            recommendation = "leave off"
            reason = (f"the fastest setting, {label}, reached {value:.2f}x num_workers=0 ({best_rate:.0f} vs "
                      f"{zero_rate:.0f} {items}/s; {ci}), not clearly above {threshold}x on {cores} core(s); keep "
                      "num_workers=0 here, or run more trials")
    if recommendation == "enable":
        action = Action("num_workers", best.num_workers, f"DataLoader {label}", current=0)
    elif recommendation == "leave off":
        action = Action("num_workers", 0, "DataLoader workers: keep num_workers=0", current=0)
    else:
        action = Action("num_workers", None, f"DataLoader workers: {recommendation}", current=0)
    return Verdict(notebook=NOTEBOOK, metric="speedup", value=value, unit="x", recommendation=recommendation,
                   reason=reason, context=context, action=action, spread=spread, repeats=trials,
                   extra={"best_setting": label, "plausible": not (over_zero is not None and implausible)}
                   | ({"decision_threshold": SPEEDUP_THRESHOLD} if spread else {}))


# --------------------------------------------------------------------------- the notebook's run and its result


class _Datasets:
    """Notebook 03's datasets: the built-in job's batched pipeline with ``cores // num_workers`` decode threads per
    process (one dataset per thread count), or a user's job's own dataset for every setting."""

    def __init__(self, job: Any, cores: int) -> None:
        self.job, self.cores, self.by_threads = job, cores, {}
        self.own = None if job.has_batched_pipeline else job.make_dataset()

    def __call__(self, num_workers: int):
        if self.own is not None:
            return self.own  # your dataset, the same for every setting
        threads = max(1, self.cores // max(1, num_workers))  # its thread pool is created lazily in each process
        if threads not in self.by_threads:
            self.by_threads[threads] = self.job.make_dataset("batched", threads=threads, pin_memory=False)
        return self.by_threads[threads]

    def close(self) -> None:
        from helpers.jobs.base import close_dataset

        for ds in self.by_threads.values():
            close_dataset(ds)


@dataclass(frozen=True, eq=False)
class LoaderChecks:
    """Notebook 03 before any timing (:func:`check`): the machine, the data, the workers-vs-main-process batch
    comparison and the randomness probes, each asserted. :class:`LoaderResult` extends it with the measurement.

    Attributes
    ----------
    params : mapping
        The notebook's validated parameters.
    device_kind : str
    cores : int
        Usable CPU cores.
    method : helpers.pipeline.loader.StartMethod
        The workers' start method (``method``, ``source``, ``explanation``).
    builtin : bool
        The built-in job (its images) or a user's job (its samples).
    job_spec, job_describe : str, dict
        The user's job spec and ``describe()`` (a built-in job: its ``describe()``).
    n_items, batch_size : int
    data : dict
        Built-in: ``images``, ``classes``, ``skipped`` (list of (name, reason)).
    agreement : str
        The workers-vs-main-process batch comparison, in a sentence.
    probe : helpers.pipeline.randomness.ProbeResult
    epoch_result : pandas.DataFrame
    base : helpers.pipeline.loader.LoaderConfig
        The loader configuration every setting starts from (keyword-only).
    make_dataset : callable
        ``make_dataset(num_workers)`` for the sweep and the try-it panel (closed datasets reopen their pool lazily;
        keyword-only).
    job : helpers.jobs.base.Job
        The job whose dataset :func:`run` sweeps next (keyword-only; None in a result built by hand).
    """

    params: Mapping[str, Any]
    device_kind: str
    cores: int
    method: Any
    builtin: bool
    job_spec: str
    job_describe: Mapping[str, Any]
    n_items: int
    batch_size: int
    data: Mapping[str, Any]
    agreement: str
    probe: Any
    epoch_result: Any
    base: LoaderConfig = dataclasses.field(compare=False, repr=False, default=None, kw_only=True)
    make_dataset: Any = dataclasses.field(compare=False, repr=False, default=None, kw_only=True)
    job: Any = dataclasses.field(compare=False, repr=False, default=None, kw_only=True)

    @property
    def machine_text(self) -> str:
        """Cores and start method (section 1)."""
        m = self.method
        return (f"{self.cores} usable CPU core(s); workers start with {m.method!r} ({m.source})\n"
                f"what that means: {m.explanation}")

    @property
    def data_text(self) -> str:
        """The dataset swept (section 2)."""
        if not self.builtin:
            return f"your job: {dict(self.job_describe)}; {self.n_items} items in batches of {self.batch_size}"
        d = self.data
        lines = [f"{d['images']} images, {d['classes']} class(es), {len(d['skipped'])} file(s) skipped"]
        lines += [f"  skipped {name}: {reason}" for name, reason in d["skipped"][:10]]
        return "\n".join(lines)

    @property
    def probe_text(self) -> str:
        """Repeated draws before and after worker_init_fn (section 5)."""
        from helpers.pipeline.randomness import VARIANTS

        r = self.probe
        return (f"{r.items} items x {r.epochs} epochs x {r.ranks} ranks, 2 workers: {r.duplicates(VARIANTS[0])} "
                f"repeated draws before the fix, {r.duplicates(VARIANTS[1])} after")


@dataclass(frozen=True, eq=False)
class LoaderResult(LoaderChecks, ExperimentResult):
    """Everything notebook 03 measured (see :func:`run`); ``records()`` and ``verdict()`` in the notebook's order.

    Attributes
    ----------
    params, device_kind, cores, method, builtin, job_spec, job_describe, n_items, batch_size, data, agreement, probe,
    epoch_result, base, make_dataset, job
        As :class:`LoaderChecks`'s (sections 1-5, with their texts).
    settings : tuple of LoaderSetting
    sweep : SweepResult
    memory, growth : pandas.DataFrame
        USS samples, and start/end/growth per (loader, role).
    bad_input : object or None
        The bad-input epoch report (built-in job only).
    confirmation : SweepResult or None
        Held-out trials of the best setting against num_workers=0 (None when num_workers=0 won).
    confirm_batches : int
    """

    settings: tuple
    sweep: SweepResult
    memory: Any
    growth: Any
    bad_input: Any
    confirmation: SweepResult | None
    confirm_batches: int

    # -- derived figures ----------------------------------------------------------------------------------------
    @property
    def items(self) -> str:
        """What one item is: ``"images"`` (the built-in job) or ``"samples"`` (a user's)."""
        return "images" if self.builtin else "samples"

    @property
    def summary(self):
        """:meth:`SweepResult.summary` of the sweep, fastest first."""
        return self.sweep.summary()

    @property
    def best(self) -> str:
        """The fastest setting's label."""
        return self.sweep.ranking()[0]

    @property
    def best_setting(self) -> LoaderSetting:
        """The fastest setting."""
        return next(s for s in self.settings if s.label == self.best)

    def _rate(self, sweep: SweepResult, label: str) -> float:
        summary = sweep.summary()
        return float(summary.loc[summary["setting"] == label, "images_per_s"].iloc[0])

    @property
    def runner_up(self) -> str | None:
        """The second fastest setting's label (None with one setting)."""
        ranking = self.sweep.ranking()
        return ranking[1] if len(ranking) > 1 else None

    @property
    def margin(self) -> Comparison | None:
        """The best setting over the runner-up, in the sweep."""
        return None if self.runner_up is None else self.sweep.compare(self.runner_up, self.best,
                                                                      seed=self.params["seed"])

    @property
    def sweep_over_zero(self) -> Comparison | None:
        """The best setting over num_workers=0 in the sweep (best chosen: flattered); None when it is workers=0."""
        return None if self.best == "workers=0" else self.sweep.compare("workers=0", self.best,
                                                                        seed=self.params["seed"])

    @property
    def over_zero(self) -> Comparison | None:
        """The held-out confirmation: num_workers=0 (A) vs the best setting (B); None when workers=0 won."""
        return None if self.confirmation is None else self.confirmation.compare("workers=0", self.best,
                                                                                seed=self.params["seed"])

    @property
    def rates(self) -> tuple[float, float]:
        """(best, num_workers=0) in images/s: from the confirmation, or from the sweep when workers=0 won."""
        src = self.confirmation if self.confirmation is not None else self.sweep
        return self._rate(src, self.best), self._rate(src, "workers=0")

    @property
    def implausible(self) -> str | None:
        """:func:`speedup_plausibility` of the confirmation (None: plausible, or no confirmation)."""
        c = self.over_zero
        return None if c is None else speedup_plausibility(c.ratio, self.cores, ci_low=c.ci_low)

    @property
    def worker_growth(self):
        """Median worker USS growth over the epoch, MiB, per loader (a Series)."""
        g = self.growth.reset_index()
        return g[g["role"] != "main"].groupby("loader", sort=False)["growth_mib"].median()

    # -- what the cells print (sections 1, 2 and 5: LoaderChecks) ----------------------------------------------------
    @property
    def sweep_text(self) -> str:
        """How the sweep timed, and which settings had short windows (section 6)."""
        p, settings, summary = self.params, self.settings, self.summary
        lines = []
        if 0 not in p["num_workers_list"]:
            lines.append("num_workers=0 added to the sweep: it is the reference of the verdict")
        lines += [f"{len(settings)} settings x {p['trials']} trials, {p['batches_per_trial']} timed batches of "
                  f"{self.batch_size} items each, after draining up to {max(s.in_flight for s in settings)} batches "
                  "in flight",
                  f"batches finished before the clock started (not counted): up to "
                  f"{int(summary['prepared_ahead_max'].max())} in one trial"]
        short = self.sweep.short_windows()
        if short:
            lines.append(f"note: {len(short)} setting(s) timed fewer than two batches per worker ({'; '.join(short)}): "
                         "their throughput depends on how the workers' batches happened to line up; raise "
                         f"batches_per_trial to {max(s.min_timed_batches for s in settings)} or more for a steadier "
                         "figure")
        return "\n".join(lines)

    @property
    def sweep_table(self):
        """The sweep's summary, rounded for display."""
        return self.summary.round({"images_per_s": 0, "images_per_s_p25": 0, "images_per_s_p75": 0,
                                   "first_batch_s": 3, "first_batch_max_s": 3})

    @property
    def peak_text(self) -> str:
        """Where the fastest setting stands against the core count."""
        w, cores = self.best_setting.num_workers, self.cores
        if w == 0:
            return (f"the fastest setting used no workers: on {cores} core(s) the main process with {cores} decode "
                    "thread(s) was not beaten by worker processes")
        if w <= cores:
            return f"the fastest setting used {w} worker(s) on {cores} core(s): within the core count"
        return (f"the fastest setting used {w} workers on {cores} core(s), more than the cores: extra processes can "
                "gain a little when some of them wait (reading files, handing batches to the main process) while "
                "others compute, but such a lead is small and easily noise; the held-out confirmation below "
                "measures it again")

    @property
    def ranking_text(self) -> str:
        """The best setting, its margin over the runner-up and over num_workers=0 in the sweep."""
        best, cores = self.best, self.cores
        lines = [f"fastest here: {best} at {self._rate(self.sweep, best):.0f} images/s (median of "
                 f"{self.params['trials']} trials)"]
        if self.margin is not None:
            lines.append(f"margin over the next: {self.margin.verdict_text()}")
        c = self.sweep_over_zero
        if c is not None:
            lines.append(f"against num_workers=0 ({self._rate(self.sweep, 'workers=0'):.0f} images/s): "
                         f"{c.verdict_text()}")
            odd = speedup_plausibility(c.ratio, cores, ci_low=c.ci_low)
            if odd:
                lines.append(f"IMPLAUSIBLE: {odd}")
        else:
            lines.append(f"num_workers=0 was the fastest setting: worker processes did not pay for themselves on "
                         f"{cores} core(s)")
        return "\n".join(lines)

    @property
    def memory_text(self) -> str:
        """The header of the worker-memory table (section 7)."""
        return (f"start method {self.method.method!r}, {MEMORY_WORKERS} workers; USS in MiB at the start and end of "
                "one epoch:")

    @property
    def growth_text(self) -> str:
        """Median worker USS growth per loader."""
        return "median worker USS growth over the epoch: " + "; ".join(
            f"{label}: {value:+.1f} MiB" for label, value in self.worker_growth.items())

    @property
    def bad_input_text(self) -> str:
        """The corrupt-file epoch (section 9), or where it is shown for a user's job."""
        rep = self.bad_input
        if rep is None:
            return "(demonstrated on the built-in job's photos; run the notebook without job= to see it)"
        lines = [f"epoch complete: {rep.batches} batches, {rep.items} images, {len(rep.skipped)} file(s) replaced"]
        lines += [f"  {name}: {reason} (met {times}x)" for name, reason, times in rep.skipped]
        return "\n".join(lines)

    @property
    def confirmation_text(self) -> str:
        """The held-out confirmation (section 10)."""
        c = self.over_zero
        if c is None:
            return "num_workers=0 won the sweep: there is nothing to confirm"
        best_rate, zero_rate = self.rates
        text = (f"confirmation, {self.params['trials']} new trials of {self.confirm_batches} timed batches: "
                f"{self.best} at {best_rate:.0f} images/s, num_workers=0 at {zero_rate:.0f} images/s; "
                f"{c.verdict_text()}")
        return text + (f"\nIMPLAUSIBLE: {self.implausible}" if self.implausible else "")

    # -- records and verdict ------------------------------------------------------------------------------------
    def records(self) -> Records:
        """Notebook 03's records in its sections' order: machine, dataset, loader sweep and first batch per setting,
        best vs next, best vs num_workers=0 (sweep), worker randomness, epoch in workers, worker memory, bad input,
        the held-out confirmation."""
        from helpers.pipeline.randomness import VARIANTS

        r, p = Records(), self.params
        r.add("machine", "this machine", "usable_cores", self.cores, "cores", start_method=self.method.method,
              start_method_source=self.method.source)
        if self.builtin:
            d = self.data
            r.add("dataset", "usable images", "images", d["images"], "images", skipped=len(d["skipped"]),
                  classes=d["classes"], source=p["data_dir"] and "user folder" or "embedded")
        else:
            r.add("dataset", "your job", "items", self.n_items, "items", **self.job_describe, spec=self.job_spec)
        for s in self.settings:
            r.add_measurement("loader sweep", s.label, self.sweep.measurement(s.label), metric="time_per_trial",
                              unit="s", rate_metric="throughput", rate_unit="images/s", num_workers=s.num_workers,
                              prefetch_factor=s.prefetch_factor, persistent_workers=s.persistent_workers)
            first = self.sweep.trials.loc[self.sweep.trials["setting"] == s.label, "first_batch_s"]
            r.add("first batch", s.label, "first_batch_latency", float(first.median()), "s", repeats=len(first),
                  spread={"min": float(first.min()), "max": float(first.max())})
        if self.margin is not None:
            r.add_comparison("best vs next", self.margin, unit="x")
        if self.sweep_over_zero is not None:
            r.add_comparison("best vs num_workers=0 (sweep, best chosen)", self.sweep_over_zero, unit="x")
        summary = self.probe.summary
        for variant in VARIANTS:
            sub = summary[summary["variant"] == variant]
            r.add("worker randomness", variant, "repeated_draws", int(sub["repeated_draws"].sum()), "draws",
                  draws=int(sub["draws"].sum()), epochs=p["probe_epochs"], ranks=p["probe_ranks"], num_workers=2)
        for _, row in self.epoch_result.iterrows():
            r.add("epoch in workers", row["variant"], "repeated_items", int(row["repeated_items"]), "items",
                  items=int(row["items"]), later_epochs=int(row["later_epochs"]),
                  persistent_workers=bool(row["persistent_workers"]))
        self._later_records(r)
        return r

    def _later_records(self, r: Records) -> None:
        for (label, role), row in self.growth.iterrows():
            if role != "main":
                r.add("worker memory", f"{label}, {role}", "uss_growth", float(row["growth_mib"]), "MiB",
                      uss_start_mib=float(row["start"]), uss_end_mib=float(row["end"]), start_method=self.method.method)
        rep = self.bad_input
        if rep is not None:
            r.add("bad input", "truncated file mid-epoch", "skipped_images", sum(t for *_, t in rep.skipped), "images",
                  batches=rep.batches, images=rep.items, files=[{"file": f, "reason": w} for f, w, _ in rep.skipped])
        if self.over_zero is not None:
            r.add_comparison("best vs num_workers=0 (held-out confirmation)", self.over_zero, unit="x",
                             batches_per_trial=self.confirm_batches, trials=self.params["trials"])

    @property
    def context(self) -> str:
        """What was measured, in one sentence (the verdict's context)."""
        p = self.params
        what = (f"batched pipeline (helpers.pipeline.fast.BatchedDataset, cores/num_workers decode threads per "
                f"process), batch {p['batch_size']} of {p['image_size']} px from {self.n_items} images" if self.builtin
                else f"your job's dataset ({self.job_describe.get('job')}), batch {self.batch_size} of "
                     f"{self.n_items} items")
        return (f"{what}; settings: num_workers {sorted({s.num_workers for s in self.settings})} x prefetch_factor "
                f"{sorted(set(p['prefetch_factor_list']))} x persistent_workers; {p['batches_per_trial']} timed "
                "batches per trial after draining the batches in flight, counting only batches finished after the "
                f"clock started, {p['trials']} trials in rotated order; the verdict from {p['trials']} held-out "
                f"confirmation trials of {self.best} against num_workers=0 ({self.confirm_batches} timed batches "
                f"each); {self.cores} usable cores, start method {self.method.method}, device {self.device_kind}")

    def verdict(self) -> Verdict:
        """Notebook 03's verdict (:func:`verdict`) from the held-out confirmation."""
        best_rate, zero_rate = self.rates
        return verdict(self.best_setting, self.over_zero, best_rate=best_rate, zero_rate=zero_rate,
                       implausible=self.implausible, cores=self.cores, trials=self.params["trials"],
                       context=self.context, items=self.items)

    def try_it(self, acc: Any, params: Mapping[str, Any]) -> TrySpec:
        """The try-it panel: one DataLoader setting timed as the sweep timed each, beside the chosen one.

        Returns
        -------
        helpers.live.TrySpec
            Knobs ``num_workers``, ``prefetch_factor`` (torch's None travels as the string ``"None"``: ipywidgets
            reads a value of None as "nothing selected") and ``persistent_workers`` (a checkbox).
        """
        p, best, cores = params, self.best_setting, self.cores
        workers = tuple((str(w), w) for w in sorted({0, 1, 2, cores, 2 * cores, *p["num_workers_list"]}))
        prefetch = (("None (torch's default: 2 with workers)", "None"),) + tuple(
            (str(f), f) for f in sorted({1, 2, 4, 8, *p["prefetch_factor_list"]}))
        knobs = {"num_workers": Knob(workers, best.num_workers, "num_workers"),
                 "prefetch_factor": Knob(prefetch, "None" if best.prefetch_factor is None else best.prefetch_factor,
                                         "prefetch_factor"),
                 "persistent_workers": best.persistent_workers}
        make, n_items, base, items = self.make_dataset, self.n_items, self.base, self.items

        def measure(progress=no_progress, *, num_workers, prefetch_factor, persistent_workers):
            return try_loader(lambda s: make(s.num_workers), n_items, base=base, num_workers=num_workers,
                              prefetch_factor=None if prefetch_factor == "None" else prefetch_factor,
                              persistent_workers=persistent_workers, batches_per_trial=p["batches_per_trial"],
                              trials=min(p["trials"], 2), acc=acc, items=items, progress=progress)

        ref = live_point(self.confirmation if self.confirmation is not None else self.sweep, self.best, items=items)
        return TrySpec("DataLoader at another setting", measure, knobs, reference=ref)

    def close(self) -> None:
        """Close the swept datasets' decode thread pools (after the try-it panel)."""
        if self.make_dataset is not None:
            self.make_dataset.close()


#: DataLoader workers of notebook 03's worker-memory measurement.
MEMORY_WORKERS = 2


def _first_batches(make: _Datasets, n_items: int, base: LoaderConfig, acc: Any, num_workers: int, n: int = 2):
    # num_batches=n: the sampler goes on into the next epoch when one epoch holds fewer than n batches
    cfg = base.with_(num_workers=num_workers, prefetch_factor=2 if num_workers else None)
    loader = make_loader(make(num_workers), cfg, acc, batch_sampler=make_batch_sampler(n_items, cfg, num_batches=n))
    with iterate(loader, name=f"num_workers={num_workers}") as it:
        return it.take(n)


def _agreement(make: _Datasets, n_items: int, base: LoaderConfig, acc: Any, builtin: bool) -> str:
    """The first batches with num_workers=0 and 2, compared (asserted the same), in a sentence (section 4)."""
    from helpers.experiments.training import batch_agreement

    reference = _first_batches(make, n_items, base, acc, 0)
    with_workers = _first_batches(make, n_items, base, acc, 2)
    if builtin:
        same = all(batches_equal(a, b) for a, b in zip(reference, with_workers))
        b = reference[0]
        text = (f"{len(reference)} batches of {tuple(b['image'].shape)} {b['image'].dtype} images compared: "
                f"{'identical' if same else 'DIFFERENT'} with num_workers=0 and num_workers=2")
    else:  # your augmentations are seeded per sample; one drawn from an unseedable source is compared by structure
        agreement = batch_agreement(reference, with_workers,
                                    reread=lambda: _first_batches(make, n_items, base, acc, 0, n=1)[0])
        same = agreement.ok
        text = (f"{len(reference)} batches of your job compared with num_workers=0 and num_workers=2: "
                f"{agreement.sentence()}")
    assert same, "a loader with workers must deliver the same batches as the main process"
    return text


def _probes(p: Mapping[str, Any]):
    """The worker-randomness probe and the epoch-in-workers probe, asserted (section 5)."""
    from helpers.pipeline.randomness import EPOCH_VARIANTS, VARIANTS, epoch_probe, probe

    probe_result = probe(epochs=p["probe_epochs"], ranks=p["probe_ranks"], num_workers=2, seed=p["seed"],
                         timeout_s=p["first_batch_timeout_s"])
    assert probe_result.duplicates(VARIANTS[1]) == 0, "worker_init_fn must remove every repeat"
    epoch_result = epoch_probe(epochs=max(2, p["probe_epochs"]), num_workers=2, seed=p["seed"],
                               timeout_s=p["first_batch_timeout_s"])
    by_variant = epoch_result.set_index("variant")["repeated_items"]
    assert by_variant[EPOCH_VARIANTS[1]] > 0, "persistent workers that never see set_epoch must repeat epoch 0"
    assert by_variant[EPOCH_VARIANTS[2]] == 0, "the epoch carried by the sampler must give every epoch new draws"
    return probe_result, epoch_result


def _worker_memory(make: _Datasets, n_items: int, base: LoaderConfig, acc: Any, builtin: bool, seed: int):
    """USS of the workers over one epoch: the pipeline, and metadata as arrays and as objects (section 7)."""
    import pandas as pd

    from helpers.pipeline.worker_memory import measure_epoch_memory

    cfg = base.with_(num_workers=MEMORY_WORKERS, prefetch_factor=2)
    pipeline = make_loader(make(MEMORY_WORKERS), cfg, acc, batch_sampler=make_batch_sampler(n_items, cfg))
    frames = [measure_epoch_memory(pipeline, label="batched pipeline" if builtin else "your dataset")]
    n_meta = 200_000
    meta_cfg = cfg.with_(batch_size=2048)
    for storage in ("arrays", "objects"):
        meta = MetadataDataset(n_meta, storage, seed=seed)
        loader = make_loader(meta, meta_cfg, batch_sampler=make_batch_sampler(len(meta), meta_cfg))
        frames.append(measure_epoch_memory(loader, label=f"{n_meta:,} items as {storage}"))
        del meta, loader
    memory = pd.concat(frames, ignore_index=True)
    growth = (memory.pivot_table(index=["loader", "role"], columns="moment", values="uss_mib", sort=False)
              .assign(growth_mib=lambda d: d["end"] - d["start"]))
    return memory, growth


def _bad_input(index, tokenizer, p: Mapping[str, Any], expect):
    """Seven photos and one cut in half, read by two workers without the scan: the epoch completes (section 9)."""
    import shutil
    import tempfile
    from pathlib import Path

    from helpers.pipeline.dataset import load_dataset
    from helpers.pipeline.fast import BatchedDataset
    from helpers.pipeline.guarded import run_epoch

    with tempfile.TemporaryDirectory(prefix="workbook-bad-input-") as tmp:
        sources = [Path(q) for q in index.paths[:7]]
        for k, src in enumerate(sources):
            shutil.copy(src, Path(tmp) / f"photo_{k}{src.suffix}")
        data = sources[0].read_bytes()
        (Path(tmp) / "photo_4_cut_in_half.jpg").write_bytes(data[: len(data) // 2])
        bad_index = load_dataset(tmp, scan=False)
        bad_set = BatchedDataset(bad_index, tokenizer, image_size=p["image_size"], text_len=p["text_len"],
                                 seed=p["seed"], threads=1)
        bad_cfg = LoaderConfig(batch_size=2, num_workers=2, shuffle=False, timeout_s=p["first_batch_timeout_s"])
        with expect("the file cut in half is reported by the worker that met it and replaced, on purpose"):
            report = run_epoch(make_loader(bad_set, bad_cfg, batch_sampler=make_batch_sampler(len(bad_index), bad_cfg)),
                               name="bad-input loader")
    assert report.batches == len(bad_index) // 2 and report.items == len(bad_index), "the epoch must complete"
    return report


def fault_demo(first_batch_timeout_s: float) -> str:
    """A worker that exits and one that hangs, each turned into a DataError; no worker process left behind.

    Parameters
    ----------
    first_batch_timeout_s : float
        Notebook 03's timeout; the demo waits at most 1 s.

    Returns
    -------
    str
        Each fault's error message, then "no worker process left behind".

    Raises
    ------
    AssertionError
        If a broken loader did not fail, or a worker process outlived it.
    """
    import psutil

    from helpers.pipeline.guarded import run_epoch

    def live_children():
        pids = set()
        for proc in psutil.Process().children(recursive=True):
            try:
                if proc.status() != psutil.STATUS_ZOMBIE:
                    pids.add(proc.pid)
            except psutil.NoSuchProcess:
                pass
        return pids

    before, lines = live_children(), []
    timeout_s = min(1.0, first_batch_timeout_s)
    for fault in ("exit", "hang"):
        broken = make_loader(FaultyDataset(8, fault), LoaderConfig(batch_size=2, num_workers=1, timeout_s=timeout_s))
        try:
            run_epoch(broken, name=f"demo loader ({fault})")
            raise AssertionError("the broken loader should have failed")
        except DataError as exc:
            lines.append(f"{fault}: {exc}\n")
    left = live_children() - before
    assert not left, f"worker processes left behind: {sorted(left)}"
    return "\n".join(lines + ["no worker process left behind"])


def check(job: Any, acc: Any, params: Mapping[str, Any]) -> LoaderChecks:
    """Notebook 03 before any timing, on ``job``'s dataset: the machine, the data, the workers-vs-main-process batch
    comparison and the worker-randomness and epoch probes (sections 1-5).

    Parameters
    ----------
    job : helpers.jobs.base.Job
        The notebook's job (``ctx.job()``).
    acc : helpers.device.Accelerator
    params : mapping
        Notebook 03's validated parameters.

    Returns
    -------
    LoaderChecks

    Raises
    ------
    AssertionError
        If workers deliver other batches than the main process, or a probe finds what its fix must remove.
    helpers.errors.DataError
        On a loader failure (a worker that hangs or dies).
    """
    from helpers.pipeline.loader import start_method, usable_cores

    p, cores, method = params, usable_cores(), start_method()
    data = job.image_data()
    make = _Datasets(job, cores)
    n_items = job.item_count() if make.own is None else len(make.own)
    base = LoaderConfig(batch_size=job.workload.batch_size, pin_memory=True, timeout_s=p["first_batch_timeout_s"],
                        seed=p["seed"])
    agreement = _agreement(make, n_items, base, acc, job.is_builtin)
    probe_result, epoch_result = _probes(p)
    index = data[0] if data is not None else None
    return LoaderChecks(
        params=dict(p), device_kind=acc.kind, cores=cores, method=method, builtin=job.is_builtin,
        job_spec=str(p.get("job") or ""), job_describe=job.describe(), n_items=n_items,
        batch_size=job.workload.batch_size,
        data={} if index is None else {"images": len(index), "classes": index.n_classes,
                                       "skipped": [(b.path.name, b.reason) for b in index.skipped]},
        agreement=agreement, probe=probe_result, epoch_result=epoch_result, base=base, make_dataset=make, job=job)


def run(job: Any, acc: Any, params: Mapping[str, Any], *, expect: Callable[..., Any] = no_expected_warnings,
        checks: LoaderChecks | None = None) -> LoaderResult:
    """Notebook 03's whole measurement on ``job``'s dataset: :func:`check` (agreement, probes), then the sweep,
    worker memory, bad input and the confirmation.

    Parameters
    ----------
    job : helpers.jobs.base.Job
        The notebook's job (``ctx.job()``): the built-in one sweeps its batched pipeline with ``cores //
        num_workers`` decode threads per process; a user's job sweeps its own dataset.
    acc : helpers.device.Accelerator
    params : mapping
        Notebook 03's validated parameters.
    expect : callable, optional
        ``expect(why, match=None)``: a context manager around work that warns on purpose
        (:func:`helpers.workbook.output.expected_warnings`); default: none.
    checks : LoaderChecks, optional
        :func:`check`'s result for the same job and parameters (the notebook shows it before the timing starts);
        None checks here.

    Returns
    -------
    LoaderResult

    Raises
    ------
    AssertionError, helpers.errors.DataError
        As :func:`check` (called here when ``checks`` is None), and a loader failure while timing.
    """
    p = params
    c = checks if checks is not None else check(job, acc, p)
    make, n_items, base = c.make_dataset, c.n_items, c.base
    data = job.image_data()
    settings = sweep_settings(p["num_workers_list"], p["prefetch_factor_list"])
    with expect("the sweep tries more workers than cores on purpose, to show where they stop paying",
                match=r"more than the \d+ usable CPU core"):
        sweep = run_sweep(lambda s: make(s.num_workers), n_items, settings, base=base,
                          batches_per_trial=p["batches_per_trial"], trials=p["trials"], acc=acc, name="sweep")
    memory, growth = _worker_memory(make, n_items, base, acc, job.is_builtin, p["seed"])
    bad = _bad_input(*data, p, expect) if data is not None else None
    best = next(s for s in settings if s.label == sweep.ranking()[0])
    confirm_batches = max(p["batches_per_trial"], best.min_timed_batches)
    confirmation = None if best.num_workers == 0 else run_sweep(
        lambda s: make(s.num_workers), n_items, (LoaderSetting(0), best), base=base,
        batches_per_trial=confirm_batches, trials=p["trials"], acc=acc, name="confirmation")
    return LoaderResult(**checked_fields(c), settings=settings, sweep=sweep, memory=memory, growth=growth,
                        bad_input=bad, confirmation=confirmation, confirm_batches=confirm_batches)


# -- the notebook's declaration, found by helpers.experiments.registry ------------------------------------

EXPERIMENT = Experiment(
    item=Item("03", "03_dataloader_tuning", "DataLoader tuning",
         "Tune the DataLoader's workers for this machine",
         "Which num_workers / prefetch_factor / persistent_workers is best here?",
         ("dataloader_workers",)),
    spec=specs.COMMON + specs.DATA + specs.batch("images per batch") + (
        Param("num_workers_list", list, [0, 1, 2, 3], "num_workers values to sweep", item_kind=int,
              minimum=0, maximum=256),
        Param("prefetch_factor_list", list, [2, 4], "prefetch_factor values to sweep (workers > 0 only)",
              item_kind=int, minimum=1, maximum=64),
        Param("batches_per_trial", int, 8, "timed batches per loader setting and trial", minimum=2,
              maximum=100000),
        Param("trials", int, 2, "rounds over all settings (rotated order)", minimum=1, maximum=100),
        Param("first_batch_timeout_s", float, 120.0, "seconds to wait for any worker batch, the first included",
              minimum=1.0, maximum=3600.0),
        Param("probe_epochs", int, 2, "epochs drawn by the worker-randomness probe", minimum=1, maximum=20),
        Param("probe_ranks", int, 2, "simulated distributed ranks in the randomness probe", minimum=1,
              maximum=64),
    ) + specs.JOB,
    optimizations=(
        Optimization("dataloader_workers", "03_dataloader_tuning", ("data", "h2d"), setting="num_workers",
                     default=lambda acc, native_bf16=None: (
                         not acc.is_cpu, "worker processes feed an accelerator" if not acc.is_cpu else
                         "on a CPU, workers take cores from the training computation"),
                     apply=lambda plan, settings, acc: replace(plan, num_workers=int(settings["num_workers"]))),
    ),
    interleaved_repeats="trials",
)
