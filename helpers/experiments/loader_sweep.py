"""Notebook 03's experiment: time DataLoader worker settings on the notebook's job, and decide.

:func:`run` does the notebook's whole measurement on the notebook's job (the built-in job's batched pipeline, or a
user's job's own dataset: the job decides, through :attr:`helpers.jobs.base.Job.has_batched_pipeline` and
:meth:`helpers.jobs.base.Job.image_data`) and returns a :class:`LoaderResult`, which knows the notebook's records,
its verdict and its try-it panel; :func:`fault_demo` shows the loader's guards.

* The sweep's mechanics live in :mod:`helpers.pipeline.loader_timing`: :func:`run_sweep` times
  ``num_workers x prefetch_factor x persistent_workers`` (:func:`sweep_settings`, one :class:`LoaderSetting` each)
  in rotated order, counting only batches finished after its clock started (:func:`completion_window`);
  :func:`speedup_plausibility` flags a result no CPU-bound pipeline can reach. :class:`SweepResult` holds the
  timings. They are imported here, where notebooks and tests find them.
* :func:`batches_equal` checks that a loader with workers delivers the same
  batches as the main process.
* The demonstration datasets live in :mod:`helpers.experiments.loader_demos` (imported here):
  :class:`MetadataDataset` shows how a forked worker's memory grows when
  per-sample metadata is kept in Python objects (pytorch/pytorch#13246), and
  :class:`FaultyDataset` fails inside workers to show the guards of
  :mod:`helpers.pipeline.guarded`.
* What the result's cells print lives in :mod:`helpers.experiments.loader_text`.

The loaders are built by :mod:`helpers.pipeline.loader` and iterated by
:mod:`helpers.pipeline.guarded`. DataLoader workers started with ``spawn`` or
``forkserver`` unpickle the datasets and the collate wrapper by module path
(see "Fork and spawn" in :mod:`helpers.pipeline.loader`), so they are
module-level classes in their own modules, and this module imports pandas
only inside the functions that return tables.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from helpers import specs
from helpers.checklist import Item
from helpers.conditions import held, ran_with, sides
from helpers.errors import ParameterError
from helpers.experiments.base import Experiment, ExperimentResult, Optimization, checked_fields, no_expected_warnings
from helpers.experiments.loader_demos import FaultyDataset, MetadataDataset, fault_demo
from helpers.experiments.loader_text import LoaderChecksTexts, LoaderResultTexts
from helpers.experiments.training import same_values
from helpers.live import Knob, LivePoint, Progress, TrySpec, no_progress
from helpers.params import Param
from helpers.pipeline.guarded import iterate
from helpers.pipeline.loader import LoaderConfig, make_batch_sampler, make_loader
from helpers.pipeline.loader_timing import (
    LoaderSetting,
    SweepResult,
    _require_count,
    completion_window,
    run_sweep,
    speedup_plausibility,
    sweep_settings,
)
from helpers.results import Records
from helpers.timing import Comparison
from helpers.verdict import Action, Verdict

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
class LoaderChecks(LoaderChecksTexts):
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


@dataclass(frozen=True, eq=False)
class LoaderResult(LoaderChecks, LoaderResultTexts, ExperimentResult):
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
    confirmation : SweepResult or None
        Held-out trials of the best setting against num_workers=0 (None when num_workers=0 won).
    confirm_batches : int
    ran : dict or None
        :func:`helpers.conditions.ran_with` of the training process over the sweep and the confirmation (torch
        threads, batch size): every setting ran with them (the workers and their decode threads are the change);
        None where not stated.
    """

    settings: tuple
    sweep: SweepResult
    memory: Any
    growth: Any
    confirmation: SweepResult | None
    confirm_batches: int
    ran: Mapping[str, Any] | None = None

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

    @property
    def memory_text(self) -> str:
        """The header of the worker-memory table (section 7)."""
        return (f"start method {self.method.method!r}, {MEMORY_WORKERS} workers; USS in MiB at the start and end of "
                "one epoch:")

    # -- records and verdict ------------------------------------------------------------------------------------
    def records(self) -> Records:
        """Notebook 03's records in its sections' order: machine, dataset, loader sweep and first batch per setting,
        best vs next, best vs num_workers=0 (sweep), worker randomness, epoch in workers, worker memory, the held-out
        confirmation; each setting's and each comparison's with the torch threads and batch it ran with
        (:func:`helpers.conditions.sides`)."""
        from helpers.pipeline.randomness import VARIANTS

        r, p, ran, alike = Records(), self.params, self.ran or {}, sides(self.ran, self.ran)
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
                              prefetch_factor=s.prefetch_factor, persistent_workers=s.persistent_workers, **ran)
            first = self.sweep.trials.loc[self.sweep.trials["setting"] == s.label, "first_batch_s"]
            r.add("first batch", s.label, "first_batch_latency", float(first.median()), "s", repeats=len(first),
                  spread={"min": float(first.min()), "max": float(first.max())})
        if self.margin is not None:
            r.add_comparison("best vs next", self.margin, unit="x", **alike)
        if self.sweep_over_zero is not None:
            r.add_comparison("best vs num_workers=0 (sweep, best chosen)", self.sweep_over_zero, unit="x", **alike)
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
        if self.over_zero is not None:
            r.add_comparison("best vs num_workers=0 (held-out confirmation)", self.over_zero, unit="x",
                             batches_per_trial=self.confirm_batches, trials=self.params["trials"],
                             **sides(self.ran, self.ran))

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
    worker memory and the confirmation.

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
    settings = sweep_settings(p["num_workers_list"], p["prefetch_factor_list"])
    ran = ran_with(base.batch_size)  # the training process's, read as the sweep starts (held to the end)
    with expect("the sweep tries more workers than cores on purpose, to show where they stop paying",
                match=r"more than the \d+ usable CPU core"):
        sweep = run_sweep(lambda s: make(s.num_workers), n_items, settings, base=base,
                          batches_per_trial=p["batches_per_trial"], trials=p["trials"], acc=acc, name="sweep")
    memory, growth = _worker_memory(make, n_items, base, acc, job.is_builtin, p["seed"])
    best = next(s for s in settings if s.label == sweep.ranking()[0])
    confirm_batches = max(p["batches_per_trial"], best.min_timed_batches)
    confirmation = None if best.num_workers == 0 else run_sweep(
        lambda s: make(s.num_workers), n_items, (LoaderSetting(0), best), base=base,
        batches_per_trial=confirm_batches, trials=p["trials"], acc=acc, name="confirmation")
    return LoaderResult(**checked_fields(c), settings=settings, sweep=sweep, memory=memory, growth=growth,
                        confirmation=confirmation, confirm_batches=confirm_batches, ran=held(ran))


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
