"""Notebook 05's experiment: hide the input pipeline behind compute, measured on a Job.

Each variant trains the job on its batched pipeline with one input setting
(:func:`run_overlap_variant`): *before* (the loader in the main process, the
copy in the step) and *after* (DataLoader worker processes and a
:class:`helpers.pipeline.prefetch.DevicePrefetcher`, with each thread split
of :func:`thread_splits`, keeping the fastest), the verdict's *before* at
the kept *after*'s torch thread count. :func:`run_overlap` runs the
whole comparison; notebook 05 and ``python -m helpers bench input-pipeline``
(:func:`overlap_bench`) both call it.

The overlap metric (:func:`overlap_stats`): *input work* is what the
pipeline spent producing a batch (``prep_s`` of the host batch: decode,
augment, tokenize, collate, wherever it ran) plus its copy; *exposed input* is
what the training loop waited for it (the ``data`` + ``h2d`` phases of the
timed loop, :class:`helpers.compute.train.TimedLoop`). Each is summarized by
its median over the measured steps; the hidden fraction is
``1 - exposed / work`` and the exposed fraction ``exposed / step time``, both
ratios of those medians. :func:`overlap_limits` says why an overlap could not
work when it did not. The notebook's "try it" panel calls :func:`try_overlap`:
the *after* variant again at another model width, worker count and core split.
Notebook 05 calls :func:`run`, whose :class:`StreamOverlapResult` holds all of
it and makes the notebook's records, verdict and panel.

Where the parts live (each imported here, where notebooks and tests find them): the overlap metric and
:class:`OverlapRun` in :mod:`helpers.pipeline.overlap_metric`; the variants' runs, the thread splits and
:func:`run_overlap` in :mod:`helpers.experiments.overlap_runs`; the decision and its limits in
:mod:`helpers.experiments.overlap_decision`; what the result's cells print in :mod:`helpers.experiments.overlap_text`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd

from helpers import checklist, specs
from helpers.checklist import Item
from helpers.conditions import CONDITIONS, sides
from helpers.device import Accelerator, get_accelerator, usable_cores
from helpers.errors import DataError, ParameterError
from helpers.experiments import registry
from helpers.experiments.base import Experiment, ExperimentResult, Optimization, checked_fields
from helpers.experiments.overlap_decision import (
    EXPOSED_FLOOR_S,
    FEW_BATCHES_PER_EPOCH,
    NOTHING_TO_HIDE,
    overlap_decision,
    overlap_limits,
    ran_alike,
)
from helpers.experiments.overlap_runs import (
    OverlapResult,
    choose_threads,
    compute_thread_scaling,
    fastest,
    run_overlap,
    run_overlap_variant,
    thread_split_effect,
    thread_splits,
)
from helpers.experiments.overlap_text import OverlapChecksTexts, StreamOverlapResultTexts
from helpers.jobs.base import WORKLOAD_PARAMS, Job, Workload, close_dataset
from helpers.jobs.ppo import PPOJob
from helpers.live import Knob, LivePoint, Progress, TrySpec, no_progress
from helpers.params import Param, coerce
from helpers.pipeline.overlap_metric import OverlapRun, OverlapStats, input_work_per_step, overlap_stats, timeline_frame
from helpers.results import Records, load_results
from helpers.timing import Measurement
from helpers.verdict import Verdict
from helpers.workload import DEFAULT

__all__ = [
    # the overlap metric (helpers.pipeline.overlap_metric)
    "OverlapRun", "OverlapStats", "input_work_per_step", "overlap_stats", "timeline_frame",
    # the variants, timed (helpers.experiments.overlap_runs)
    "OverlapResult", "choose_threads", "compute_thread_scaling", "fastest", "run_overlap", "run_overlap_variant",
    "thread_split_effect", "thread_splits",
    # the decision (helpers.experiments.overlap_decision)
    "EXPOSED_FLOOR_S", "FEW_BATCHES_PER_EPOCH", "NOTHING_TO_HIDE", "overlap_decision", "overlap_limits", "ran_alike",
    # this module
    "BASELINE_NOTEBOOK", "EXPERIMENT", "NOTEBOOK", "SPLITS", "OverlapChecks", "StreamOverlapResult",
    "baseline_workload", "check", "live_point", "overlap_bench", "run", "try_overlap", "verdict",
]

logger = logging.getLogger(__name__)

#: Notebook whose workload notebook 05 is compared with.
BASELINE_NOTEBOOK = checklist.BASELINE


def baseline_workload(results_path: "str | Path | None" = None) -> tuple[dict[str, int], str]:
    """Notebook 01's workload, to say how notebook 05's model and batch compare with it.

    Parameters
    ----------
    results_path : str or Path, optional
        A results file (JSON lines). When it holds records of notebook 01,
        the parameters of its latest record are used (that is the run the
        report shows beside notebook 05's); otherwise notebook 01's defaults
        (:func:`helpers.experiments.registry.spec_for`).

    Returns
    -------
    (dict, str)
        ``{name: value}`` for :data:`WORKLOAD_PARAMS`, and where it came from:
        ``"notebook 01's run in this results file"`` or ``"notebook 01's
        defaults"``.
    """
    values = {p.name: p.default for p in registry.spec_for(BASELINE_NOTEBOOK) if p.name in WORKLOAD_PARAMS}
    source = "notebook 01's defaults"
    if results_path:
        try:
            df = load_results(results_path)
        except DataError as exc:  # an unreadable file only costs the comparison its precision
            logger.info("results file %s not read (%s); using notebook 01's defaults", results_path, exc)
            df = None
        if df is not None and len(df) and "notebook" in df:
            rows = df[df["notebook"] == BASELINE_NOTEBOOK]
            params = rows["parameters"].iloc[-1] if len(rows) else None
            if isinstance(params, dict) and all(k in params for k in WORKLOAD_PARAMS):
                values = {k: int(params[k]) for k in WORKLOAD_PARAMS}
                source = "notebook 01's run in this results file"
    return values, source


# --------------------------------------------------------------------------- the benchmark


def overlap_bench(*, data_dir: str | None = None, max_images: int = 0, batch_size: int = DEFAULT.batch_size,
                  image_size: int = DEFAULT.image_size, text_len: int = DEFAULT.text_len, model_width: int = 32,
                  d_model: int = DEFAULT.d_model, steps: int = 20,
                  warmup_steps: int = 3, num_workers: int = 1, prefetch_factor: int = 2, seed: int = 0,
                  device: str = "cpu", prepared: tuple | None = None) -> dict:
    """The ``exposed_input_fraction`` of ``python -m helpers bench input-pipeline``.

    Trains the workload on the batched pipeline: *before* (the loader in
    the main process, the copy in the step: ``num_workers=0``, no
    prefetcher) and *after* (``num_workers`` worker processes and the
    :class:`DevicePrefetcher`, with each thread split of
    :func:`thread_splits`, keeping the fastest), compared with a *before*
    at the same torch thread count, as notebook 05 does. The
    defaults are notebook 05's quick profile; the compute per step is chosen
    (``model_width``) to be at least the input work per step, and both are
    reported so that this can be checked.

    Parameters
    ----------
    data_dir : str, optional
        Folder of images; None or "" for the embedded dataset.
    max_images, batch_size, image_size, text_len, model_width, d_model, steps, warmup_steps, num_workers,
    prefetch_factor, seed
        As notebook 05's parameters.
    device : str, default "cpu"
        Device kind (``helpers.device.get_accelerator``).
    prepared : (DatasetIndex, tokenizers.Tokenizer), optional
        Data already loaded by :func:`helpers.pipeline.prepare.prepare_data`
        (so a caller running several benchmarks scans the folder once).

    Returns
    -------
    dict
        ``exposed_input_fraction`` (after: median exposed input / median step
        time), ``exposed_input_fraction_before``, ``hidden_fraction`` (after:
        1 - median exposed / median input work), ``input_time_s`` and
        ``compute_time_s`` (after: medians per step, seconds),
        ``step_time_s_before`` / ``step_time_s_after`` (medians),
        ``after_variant`` (the thread split kept), ``step_time_s_candidates``
        and ``step_time_s_befores`` (median step time of each after and of
        each before run), ``num_workers``, ``torch_threads`` and
        ``torch_threads_before`` (equal: the two sides run at one count),
        ``batch_size``, ``decode_threads``, ``cores``, ``steps``,
        ``batches_per_epoch``, ``statistic`` (what the figures are),
        ``recommendation`` and ``exposed_reduction`` (``ratio``, ``ci_low``,
        ``ci_high``, ``confidence``: exposed input before / after) from
        :func:`overlap_decision`, ``note`` (why the overlap could not work,
        from :func:`overlap_limits`; None when nothing limited it) and
        ``device``.

    Raises
    ------
    helpers.errors.DataError
        If the dataset holds fewer images than one batch.
    """
    acc = get_accelerator(device)
    workload = Workload(batch_size=batch_size, image_size=image_size, text_len=text_len, model_width=model_width,
                        d_model=d_model, seed=seed)
    job = (PPOJob(*prepared, workload) if prepared is not None
           else PPOJob.from_data(workload, data_dir, max_images=max_images))
    result = run_overlap(job, acc, steps=steps, warmup_steps=warmup_steps, num_workers=num_workers,
                         prefetch_factor=prefetch_factor)
    return _bench_figures(result, num_workers=num_workers, steps=steps, device=acc.kind)


def _bench_figures(result: OverlapResult, *, num_workers: int, steps: int, device: str) -> dict:
    """:func:`overlap_bench`'s figures from notebook 05's comparison (seconds, and fractions of the step)."""
    before, candidates, after, verdict = result.before, result.candidates, result.after, result.verdict
    return {
        "exposed_input_fraction": after.stats.exposed_fraction,
        "exposed_input_fraction_before": before.stats.exposed_fraction,
        "hidden_fraction": after.stats.hidden_fraction,
        "input_time_s": after.stats.median_input_work_s,
        "compute_time_s": after.stats.median_compute_s,
        "step_time_s_before": before.stats.median_step_s,
        "step_time_s_after": after.stats.median_step_s,
        "after_variant": after.label,
        "step_time_s_candidates": {r.label: r.stats.median_step_s for r in candidates},
        "step_time_s_befores": {r.label: r.stats.median_step_s for r in result.befores},
        "num_workers": num_workers,
        "torch_threads": after.settings["torch_threads"],
        "torch_threads_before": before.settings["torch_threads"],
        "batch_size": after.settings.get("batch_size"),
        "decode_threads": after.settings["decode_threads"],
        "cores": choose_threads(num_workers)["cores"],
        "steps": steps,
        "batches_per_epoch": after.settings["batches_per_epoch"],
        "statistic": "medians over the measured steps; fractions are ratios of those medians",
        "recommendation": verdict["recommendation"],
        "exposed_reduction": {"ratio": verdict["exposed"].ratio, "ci_low": verdict["exposed"].ci_low,
                              "ci_high": verdict["exposed"].ci_high, "confidence": verdict["exposed"].confidence},
        "note": "; ".join(verdict["notes"]) or None,
        "device": device,
    }


#: Notebook whose verdict :func:`verdict` gives.
NOTEBOOK = "05_stream_overlap"


def verdict(result: OverlapResult, *, context: str, model_width_01: int) -> Verdict:
    """Notebook 05's verdict as a :class:`helpers.verdict.Verdict` (the decision is :func:`overlap_decision`'s).

    Parameters
    ----------
    result : OverlapResult
        :func:`run_overlap`'s comparison.
    context : str
        What was measured, in one sentence.
    model_width_01 : int
        Notebook 01's model width, recorded beside this notebook's so the report can compare the jobs.

    Returns
    -------
    helpers.verdict.Verdict
        metric ``exposed_input_fraction`` after the overlap (fraction: median exposed input / median step), with
        the quartiles of the same statistic (:attr:`OverlapStats.exposed_fraction_p25` and ``_p75``: the per-step
        exposed input over the median step), so that the value lies inside its spread; ``extra``: ``before``,
        ``hidden_fraction``, ``input_time_s``, ``compute_time_s`` (seconds per step, medians), ``notes``,
        ``model_width_01``, the torch threads and batch of each side (:func:`helpers.conditions.sides`: before as
        A, after as B), and ``thread_effect``: per variant (``before``, ``after``) the step time's ratio at the
        splits' two thread counts (``ratio``, ``ci_low``, ``ci_high``, ``a``, ``b``: the runs; empty with one
        split), the threads' own effect, not counted in the overlap's.
    """
    v, a, b = result.verdict, result.after.stats, result.before.stats
    effect = {name: {"ratio": c.ratio, "ci_low": c.ci_low, "ci_high": c.ci_high, "a": c.a.name, "b": c.b.name}
              for name, c in result.thread_effect.items()}
    return Verdict(notebook=NOTEBOOK, metric="exposed_input_fraction", value=a.exposed_fraction, unit="fraction",
                   repeats=a.steps, recommendation=v["recommendation"], reason=v["reason"], context=context,
                   action=v["action"], spread={"p25": a.exposed_fraction_p25, "p75": a.exposed_fraction_p75},
                   extra={"before": b.exposed_fraction, "hidden_fraction": a.hidden_fraction,
                          "input_time_s": a.median_input_work_s, "compute_time_s": a.median_compute_s,
                          "notes": v["notes"], "model_width_01": model_width_01,
                          **sides(_ran(result.before), _ran(result.after)), "thread_effect": effect})


# --------------------------------------------------------------------------- the "try it" panel


def live_point(v: OverlapRun, label: str) -> LivePoint:
    """One overlapped run as a "try it" point: the share of its input work hidden behind compute.

    Parameters
    ----------
    v : OverlapRun
        A run of :func:`run_overlap_variant` (notebook 05's ``result.after``, or :func:`try_overlap`'s).
    label : str
        The settings it ran at, e.g. ``"width 16, 1 worker(s), 1 core per worker"``.

    Returns
    -------
    LivePoint
        metric ``hidden_fraction``, unit ``fraction``: ``1 - median exposed input / median input work`` (the
        notebook's statistic, :func:`overlap_stats`); ``low``/``high``: the quartiles of the per-step exposed
        input over the median input work (clipped to [0, 1]). The sentence gives the compute and the input work
        per step (medians, ms), whether the compute covers the input work, and the exposed share of the step;
        ``extra``: ``compute_s``, ``input_work_s``, ``step_s`` (medians, seconds), ``exposed_fraction``,
        ``num_workers``, ``torch_threads``, ``side_stream``, ``steps``.
    """
    s = v.stats
    exposed = (v.run.steps["data"] + v.run.steps["h2d"]).to_numpy(dtype=float)
    if s.median_input_work_s > 0:
        per_step = np.clip(1.0 - exposed / s.median_input_work_s, 0.0, 1.0)
        low, high = float(np.quantile(per_step, 0.25)), float(np.quantile(per_step, 0.75))
    else:
        low = high = None
    covers = ("is long enough to hide" if s.median_compute_s >= s.median_input_work_s
              else "is too short to hide all of")
    spread = f" (IQR over steps {low:.0%}-{high:.0%})" if low is not None else ""
    sentence = (f"{label}: {s.hidden_fraction:.0%} of the input work hidden behind compute{spread}; compute "
                f"{s.median_compute_s * 1e3:.1f} ms {covers} input work {s.median_input_work_s * 1e3:.1f} ms per step; "
                f"input exposed for {s.exposed_fraction:.0%} of a {s.median_step_s * 1e3:.0f} ms step "
                f"(medians of {s.steps} steps)")
    return LivePoint(label=label, value=float(s.hidden_fraction), unit="fraction", metric="hidden_fraction",
                     low=low, high=high, sentence=sentence,
                     extra={"compute_s": s.median_compute_s, "input_work_s": s.median_input_work_s,
                            "step_s": s.median_step_s, "exposed_fraction": s.exposed_fraction,
                            "num_workers": v.settings["num_workers"], "torch_threads": v.settings["torch_threads"],
                            "side_stream": v.settings["side_stream"], "steps": s.steps})


#: The thread splits a "try it" panel can ask for (:func:`thread_splits`' labels).
SPLITS = ("1 core per worker", "all cores to torch")


def _knob(name: str, value: Any) -> Any:
    """A knob value checked against notebook 05's declaration of the parameter of that name (type and range)."""
    param = next(p for p in EXPERIMENT.spec if p.name == name)
    return coerce(param, value)


def try_overlap(job: Job, acc: Accelerator, *, num_workers: int, model_width: int | None = None,
                threads: str = SPLITS[0], prefetch_factor: int = 2, steps: int = 10, warmup_steps: int = 2,
                cores: int | None = None, progress: Progress = no_progress) -> LivePoint:
    """Notebook 05's overlapped loop again at another model width and worker count: does the overlap appear?

    The overlap can hide at most as much input work as there is compute to hide it behind: widen the model
    (more compute per step) or add workers (more input prepared at once) and the hidden share rises; narrow it
    or take the workers away and it vanishes. The run is the notebook's own *after* variant
    (:func:`run_overlap_variant`: the job's DataLoader with ``num_workers`` persistent workers and
    ``prefetch_factor``, the :class:`DevicePrefetcher`, the phase-timed loop closed by the consumer stream's
    synchronize), ``warmup_steps`` excluded, the input work of each step from its batch's ``prep_s`` plus its
    copy.

    Parameters
    ----------
    job : helpers.jobs.base.Job
        The notebook's job. The built-in :class:`helpers.jobs.ppo.PPOJob` is rebuilt at ``model_width`` on the
        same images; a user's job runs as it is (its model is its own), and its synchronous run is measured
        first, since its batches do not time their own preparation (its data + h2d phases are then the input
        work, as in the notebook).
    acc : helpers.device.Accelerator
    num_workers : int
        DataLoader worker processes, 0-256 (0: the loader runs in the training process; on a CPU nothing then
        runs beside the step).
    model_width : int, optional
        Channels of the first conv stage of the built-in job's policy, 4-512 (compute per step grows roughly
        with its square); None keeps the job's.
    threads : str
        How the CPU cores are shared between the step's torch threads and the workers, one of :data:`SPLITS`
        (:func:`thread_splits`). Where the split does not exist (no workers, one core, or the step on an
        accelerator) the first one is used and the label says so.
    prefetch_factor : int
        Batches each worker prepares ahead, 1-64.
    steps, warmup_steps : int
        Measured and excluded steps (>= 1 and >= 0).
    cores : int, optional
        Usable CPU cores (default :func:`helpers.device.usable_cores`).
    progress : callable
        ``progress(done, total)`` after each step (warm-up included; a user's job counts both runs).

    Returns
    -------
    LivePoint
        metric ``hidden_fraction`` (fraction of the input work per step hidden behind compute, 0-1), unit
        ``fraction``; see :func:`live_point`.

    Raises
    ------
    helpers.errors.ParameterError
        For a ``num_workers``, ``model_width`` or ``prefetch_factor`` outside notebook 05's ranges, a
        ``threads`` not in :data:`SPLITS`, ``steps < 1`` or ``warmup_steps < 0``, or a ``model_width`` for a
        user's job (set its model's size in its own factory instead).
    """
    num_workers = _knob("num_workers", num_workers)
    prefetch_factor = _knob("prefetch_factor", prefetch_factor)
    steps, warmup_steps = _knob("steps", steps), _knob("warmup_steps", warmup_steps)
    if threads not in SPLITS:
        raise ParameterError(f"threads={threads!r}; choose one of {', '.join(map(repr, SPLITS))}")
    if model_width is not None:
        model_width = _knob("model_width", model_width)
        job = job.with_model_width(model_width)  # a user's job: ParameterError, its factory sizes its model
    splits = thread_splits(num_workers, cores, is_cpu=acc.is_cpu)
    split = next((s for s in splits if s["label"] == threads), splits[0])
    common = dict(steps=steps, warmup_steps=warmup_steps)
    runs = 1 if job.is_builtin else 2  # the built-in job's batches time their own preparation (prep_s)
    total = runs * (warmup_steps + steps)
    if runs == 2:  # a user's job: its synchronous run's exposed input is its input work (run_overlap does the same)
        sync_run = run_overlap_variant(job, acc, label="synchronous", num_workers=0, prefetcher=False,
                                       torch_threads=split["torch_threads"],
                                       progress=lambda done, _n: progress(done, total), **common)
        common["input_work_s"] = (sync_run.run.steps["data"] + sync_run.run.steps["h2d"]).tolist()
    offset = total - (warmup_steps + steps)
    run = run_overlap_variant(job, acc, label="try it", num_workers=num_workers, prefetch_factor=prefetch_factor,
                              prefetcher=True, torch_threads=split["torch_threads"],
                              decode_threads=split["decode_threads"],
                              progress=lambda done, _n: progress(offset + done, total), **common)
    width = f"width {job.model_width}, " if job.model_width is not None else ""
    used = split["label"] + ("" if split["label"] == threads else f" ({threads!r} does not apply here)")
    return live_point(run, f"{width}{num_workers} worker(s), {used}")


# --------------------------------------------------------------------------- the notebook's run


@dataclass(frozen=True, eq=False)
class OverlapChecks(OverlapChecksTexts):
    """Notebook 05 before any timing (:func:`check`): the data and the prefetcher's check against synchronous copies.
    :class:`StreamOverlapResult` extends it with the measurement.

    Attributes
    ----------
    job : helpers.jobs.base.Job
        The job measured (the built-in one or the user's); the "try it" panel runs it again.
    device : str
        The accelerator's kind, e.g. ``"cpu"``.
    n_items, per_epoch : int
        Items of one epoch and the full batches it gives.
    dataset : dict
        The built-in job's ``skipped`` files and ``classes``; empty for a user's job.
    check : dict
        :func:`helpers.pipeline.prefetch.verify_prefetcher` of one epoch.
    """

    job: Job = field(repr=False)
    device: str
    n_items: int
    per_epoch: int
    dataset: Mapping[str, Any]
    check: Mapping[str, Any]

    @property
    def batch_size(self) -> int:
        """Samples per step, the job's own."""
        return self.job.workload.batch_size


@dataclass(frozen=True, eq=False)
class StreamOverlapResult(OverlapChecks, StreamOverlapResultTexts, ExperimentResult):
    """Notebook 05's measurement: the data, the prefetcher's check, the compute per thread count and the overlap.

    Attributes
    ----------
    job, device, n_items, per_epoch, dataset, check
        As :class:`OverlapChecks`'s (sections 1 and 2, with their texts).
    settings : dict
        The notebook's parameters the sentences name: ``model_width``, ``d_model``, ``image_size``, ``steps``,
        ``num_workers``, ``prefetch_factor``, ``warmup_steps``, ``data_dir``, ``job`` (the job's spec, empty for
        the built-in job).
    cores : int
        Usable CPU cores.
    splits : tuple of dict
        :func:`thread_splits`, in the order the candidates ran.
    scaling : pandas.DataFrame
        :func:`compute_thread_scaling` (seconds per step).
    base, base_source : dict, str
        Notebook 01's workload and where it came from (:func:`baseline_workload`; a user's job: its own width).
    compute_01 : pandas.DataFrame or None
        The step timed at notebook 01's model width when it differs from this notebook's (one row as
        ``scaling``); None otherwise.
    overlap : OverlapResult
        :func:`run_overlap`'s comparison.
    """

    settings: Mapping[str, Any]
    cores: int
    splits: tuple[Mapping[str, Any], ...]
    scaling: pd.DataFrame
    base: Mapping[str, int]
    base_source: str
    compute_01: pd.DataFrame | None
    overlap: OverlapResult

    # -- figures the cells print (sections 1 and 2: OverlapChecks) ------------------------------

    @property
    def compute_here_s(self) -> float:
        """Compute per step alone with all cores to torch, this notebook's model, seconds (median)."""
        return float(self.scaling.loc[self.scaling["torch_threads"] == self.cores, "median_s"].iloc[0])

    @property
    def compute_01_s(self) -> float:
        """The same at notebook 01's model width (:attr:`compute_here_s` where the widths are the same)."""
        return self.compute_here_s if self.compute_01 is None else float(self.compute_01["median_s"].iloc[0])

    @property
    def work_ms(self) -> float:
        """Input work per step of the synchronous run, ms (median)."""
        return self.overlap.before.stats.median_input_work_s * 1e3

    @property
    def kept_split(self) -> str:
        """The label of the thread split kept as *after*."""
        return next(s["label"] for s, c in zip(self.splits, self.overlap.candidates) if c is self.overlap.after)

    # -- records, verdict and the panel ----------------------------------------------------------

    def records(self) -> Records:
        """The data, the prefetcher's check, the compute per thread count (and at notebook 01's width), each
        variant's overlap, step time, input work and compute, then the two before/after comparisons of each after
        that has a before at its torch threads (``kept``: the verdict's) and the thread split's own effect on each
        variant measured at both thread counts (``thread split``). Every
        variant's record carries the ``torch_threads`` and ``batch_size`` it ran with, every comparison both
        sides' (:func:`helpers.conditions.sides`)."""
        out = Records()
        if self.job.is_builtin:
            out.add("dataset", "usable images", "images", self.n_items, "images", skipped=self.dataset["skipped"],
                    classes=self.dataset["classes"], source=self.settings["data_dir"] and "user folder" or "embedded")
        else:
            out.add("dataset", "your job", "items", self.n_items, "items", **self.job.describe(),
                    spec=self.settings["job"])
        c = self.check
        out.add("correctness", "prefetched vs synchronous", "identical_batches", c["identical"], "batches",
                batches=c["batches"], side_stream=c["side_stream"])
        for _, r in self.scaling.iterrows():
            out.add("compute only", f"{int(r['torch_threads'])} torch thread(s)", "time_per_step", r["median_s"], "s",
                    spread={"p25": r["p25_s"], "p75": r["p75_s"]}, **_row_ran(r, self.batch_size))
        if self.compute_01 is not None:
            w, r = self.base["model_width"], self.compute_01.iloc[0]
            out.add("compute only", f"model_width {w} (notebook 01's), {self.cores} torch thread(s)", "time_per_step",
                    self.compute_01_s, "s", model_width=w, spread={"p25": float(r["p25_s"]), "p75": float(r["p75_s"])},
                    **_row_ran(r, self.batch_size))
        for v in self.overlap.variants:
            _variant_records(out, v, self.batch_size)
        for (before, after), d in zip(self.overlap.pairs, self.overlap.decisions(self.job.workload.seed)):
            alike, kept = sides(_ran(before), _ran(after)), after is self.overlap.after
            out.add_comparison("exposed input per step", d["exposed"], metric="reduction", unit="x", kept=kept,
                               **alike)
            out.add_comparison("step time", d["step"], kept=kept, **alike)
        runs = {v.label: v for v in self.overlap.variants}
        for name, c in self.overlap.thread_effect.items():  # the threads' own effect, apart from the overlap's
            out.add_comparison("thread split", c, variant_kind=name,
                               **sides(_ran(runs[c.a.name]), _ran(runs[c.b.name]), changes=["torch_threads"]))
        return out

    def verdict(self) -> Verdict:
        """Notebook 05's verdict (:func:`verdict`) with :meth:`context`."""
        return verdict(self.overlap, context=self.context(), model_width_01=self.base["model_width"])

    def try_it(self, acc: Accelerator, params: Mapping[str, Any]) -> TrySpec:
        """The "try it" panel: the *after* loop again at another worker count, model width (the built-in job
        only) and core split (a CPU only), beside this notebook's own *after*.

        Parameters
        ----------
        acc : helpers.device.Accelerator
        params : mapping
            The notebook's parameters (``num_workers``, ``model_width``, ``prefetch_factor``, ``steps`` and
            ``warmup_steps``, the last two capped at 10 and 2 for the panel).
        """
        def ints(values):
            return tuple((str(n), n) for n in sorted(values))

        kept, workers = self.kept_split, params["num_workers"]
        knobs = {"num_workers": Knob(ints({0, 1, 2, 4, workers}), workers, "num_workers")}
        label = f"{workers} worker(s), {kept}"
        if self.job.model_width is not None:  # a user's job builds its own model: no model_width to change
            width = params["model_width"]
            knobs["model_width"] = Knob(ints({4, 8, 16, 32, 64, width}), width, "model_width")
            label = f"width {width}, " + label
        if acc.is_cpu:  # on an accelerator the step runs on the device: one split only
            knobs["threads"] = Knob(tuple((s, s) for s in SPLITS), kept, "cores")
        job, cores = self.job, self.cores
        pf, steps, warmup = params["prefetch_factor"], min(params["steps"], 10), min(params["warmup_steps"], 2)
        return TrySpec("overlap at another model width and worker count",
                       lambda progress, **k: try_overlap(job, acc, prefetch_factor=pf, cores=cores, steps=steps,
                                                         warmup_steps=warmup, progress=progress, **k),
                       knobs, reference=live_point(self.overlap.after, label))


def _ran(v: OverlapRun) -> dict[str, Any]:
    """What a run ran with (:data:`helpers.conditions.CONDITIONS`), from its settings (read while it ran); a setting
    its settings do not state is left out."""
    return {k: v.settings[k] for k in CONDITIONS if k in v.settings}


def _row_ran(row: Any, batch_size: int) -> dict[str, Any]:
    """What a row of :func:`compute_thread_scaling` ran with (its own ``batch_size`` where it has one)."""
    batch = row["batch_size"] if "batch_size" in row else batch_size
    return {"torch_threads": int(row["torch_threads"]), "batch_size": int(batch)}


def _variant_records(out: Records, v: OverlapRun, batch_size: int) -> None:
    """One variant's records: exposed and hidden fractions, step time (and throughput), input work, compute, each
    with the ``torch_threads`` and ``batch_size`` it ran with. The exposed fraction's spread is that of its own
    statistic (:attr:`OverlapStats.exposed_fraction_p25`)."""
    s, ran = v.stats, _ran(v)
    out.add("overlap", v.label, "exposed_input_fraction", s.exposed_fraction, "fraction", repeats=s.steps,
            spread={"p25": s.exposed_fraction_p25, "p75": s.exposed_fraction_p75},
            statistic="median exposed / median step; spread: quartiles of exposed per step / median step",
            exposed_fraction_per_step=s.exposed_fraction_per_step, **{**v.settings, **ran})
    out.add("overlap", v.label, "hidden_fraction", s.hidden_fraction, "fraction", repeats=s.steps,
            statistic="1 - median exposed / median input work",
            exposed_over_work=s.exposed_over_work if s.exposed_over_work != float("inf") else None, **ran)
    step_m = Measurement(name=v.label, times_s=tuple(v.run.steps["step_s"]), warmup=v.run.warmup_steps,
                         items_per_call=batch_size)
    out.add_measurement("step time", v.label, step_m, metric="time_per_step", unit="s",
                        rate_metric="throughput", rate_unit="samples/s", **ran)
    out.add("input work", v.label, "input_work_per_step", s.median_input_work_s, "s", repeats=s.steps, **ran)
    out.add("compute", v.label, "compute_per_step", s.median_compute_s, "s", repeats=s.steps, **ran)


def _check_prefetcher(job: Job, acc: Accelerator) -> dict[str, Any]:
    """:func:`helpers.pipeline.prefetch.verify_prefetcher` on one epoch of the job (the batched pipeline where it
    has one, else its own dataset and copy).

    Raises
    ------
    helpers.errors.DataError
        If a prefetched batch differs from the synchronous copy (for a dataset that cannot be read twice alike:
        in its shapes, dtypes or labels).
    """
    from helpers.pipeline.fast import to_device_batch
    from helpers.pipeline.prefetch import verify_prefetcher

    if job.has_batched_pipeline:
        dataset = job.make_dataset("batched", pin_memory=acc.capabilities.pinned_memory.available)
        transfer = to_device_batch
    else:  # a user's dataset and the job's own copy to the device
        dataset = job.make_dataset(job.pipelines[0])
        transfer = lambda batch, acc, non_blocking=False: job.to_device(batch, acc, non_blocking=non_blocking)  # noqa: E731

    def one_epoch():
        dataset.set_epoch(0)
        return (dataset[b] for b in job.batch_sampler(len(dataset)))

    try:
        check = verify_prefetcher(one_epoch, acc, transfer=transfer)
    finally:
        close_dataset(dataset)
    same = check["structure_equal"] if check["identical"] != check["batches"] and not check["reproducible"] \
        else check["identical"]
    if same != check["batches"]:
        raise DataError(f"prefetched batches differ from the synchronous copy: {check}")
    return check


def check(ctx: Any) -> OverlapChecks:
    """Notebook 05 before any timing (sections 1 and 2): the data and the prefetcher's batches against synchronous
    copies.

    Parameters
    ----------
    ctx : helpers.workbook.nbsetup.NotebookContext
        The notebook's context: its parameters, accelerator and job (``ctx.job()``: the built-in job or the user's).

    Returns
    -------
    OverlapChecks

    Raises
    ------
    helpers.errors.DataError
        If a prefetched batch differs from the synchronous copy.
    """
    acc = ctx.acc
    job = ctx.job()  # the built-in job at this notebook's workload, or the user's (parameter job)
    n_items = job.item_count()
    dataset = ({"skipped": len(job.index.skipped), "classes": job.index.n_classes} if job.is_builtin else {})
    return OverlapChecks(job=job, device=acc.kind, n_items=n_items, per_epoch=n_items // job.workload.batch_size,
                         dataset=dataset, check=_check_prefetcher(job, acc))


def run(ctx: Any, checks: "OverlapChecks | None" = None) -> StreamOverlapResult:
    """Notebook 05's experiment, in the notebook's order: the data, the prefetcher's check, the compute per thread
    count (and at notebook 01's width), then *before* and *after* (:func:`run_overlap`).

    Parameters
    ----------
    ctx : helpers.workbook.nbsetup.NotebookContext
        The notebook's context: its parameters, accelerator and job (``ctx.job()``: the built-in job or the
        user's); the path of its results file is read to find notebook 01's workload (:func:`baseline_workload`).

    checks : OverlapChecks, optional
        :func:`check`'s result (the notebook shows it before the timing starts); None checks here.

    Returns
    -------
    StreamOverlapResult

    Raises
    ------
    helpers.errors.DataError
        If a prefetched batch differs from the synchronous copy.
    """
    P, acc = ctx.params, ctx.acc
    c = checks if checks is not None else check(ctx)
    job = c.job
    cores = usable_cores()
    splits = thread_splits(P["num_workers"], cores, is_cpu=acc.is_cpu)
    scaling = compute_thread_scaling(job, acc, threads=sorted({1, cores, *(s["torch_threads"] for s in splits)}))
    if job.model_width is None:  # a user's model is the same in every notebook: nothing to widen
        base, source, at_01 = {"model_width": P["model_width"]}, "", None
    else:
        (base, source), at_01 = baseline_workload(ctx.results_path), None
        if base["model_width"] != job.model_width:
            at_01 = compute_thread_scaling(job.with_model_width(base["model_width"]), acc, threads=[cores])
    result = run_overlap(job, acc, steps=P["steps"], warmup_steps=P["warmup_steps"], num_workers=P["num_workers"],
                         prefetch_factor=P["prefetch_factor"], cores=cores)
    names = ("model_width", "d_model", "image_size", "text_len", "steps", "warmup_steps", "num_workers",
             "prefetch_factor", "data_dir", "job")
    return StreamOverlapResult(**checked_fields(c), settings={k: P.get(k) for k in names}, cores=cores,
                               splits=tuple(splits), scaling=scaling, base=base, base_source=source,
                               compute_01=at_01, overlap=result)


# -- the notebook's declaration, found by helpers.experiments.registry ------------------------------------

def _prefetcher_default(acc, native_bf16=None) -> tuple[bool, str]:
    """The side-stream prefetcher where no verdict decides it: on wherever the device has streams."""
    streams = acc.capabilities.streams
    if not acc.is_cpu and streams.available:
        return True, "a side-stream copy hides the transfer"
    return False, f"no side streams here: {streams.detail or 'no accelerator'}"


EXPERIMENT = Experiment(
    item=Item("05", "05_stream_overlap", "stream overlap",
         "Hide the input pipeline behind compute",
         "How much input time hides behind compute with worker processes and a side-stream prefetcher?",
         ("prefetcher",)),
    spec=specs.COMMON + specs.DATA + specs.batch() + specs.training("measured training steps per variant") + (
        Param("num_workers", int, 1, "DataLoader worker processes of the overlapped variant", minimum=0,
              maximum=256),
        Param("prefetch_factor", int, 2, "batches each worker prepares ahead", minimum=1, maximum=64),
    ) + specs.JOB,
    optimizations=(
        Optimization("prefetcher", "05_stream_overlap", ("data", "h2d"), default=_prefetcher_default,
                     apply=lambda plan, settings, acc: replace(plan, prefetcher=True)),
    ),
)
