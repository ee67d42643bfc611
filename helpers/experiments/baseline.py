"""Notebook 01's experiment: the baseline job's phase breakdown and its host-bound verdict.

:func:`run` measures the whole notebook in one go and returns a :class:`BaselineResult`: the job (the built-in
job's scanned images, or what a user's job says of itself), one image's preprocessing cost, the steps timed phase
by phase by the one loop (:func:`helpers.experiments.training.prepare_job`), the profiler's top operators and
trace, the input-free ceiling (:func:`helpers.experiments.three_run.input_free_ceiling`) and a trace read back
(``trace_path``, else the profile's own). The result's :meth:`BaselineResult.records` are what the results file
keeps and its :meth:`BaselineResult.verdict` is :func:`verdict`: :func:`classify` calls the job host-bound,
balanced or device-bound (:mod:`helpers.bottleneck`) from the share of the step in which the computation waits
for input, as a :class:`helpers.verdict.Verdict` with the figures it rests on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import pandas as pd

from helpers import bottleneck
from helpers import specs
from helpers.checklist import PHASES
from helpers.checklist import Item
from helpers.compute.train import TrainRun
from helpers.conditions import sides
from helpers.experiments.base import Experiment, ExperimentResult, checked_fields
from helpers.experiments.three_run import CeilingResult, spare_cores
from helpers.jobs.base import description_text
from helpers.jobs.check import loop_divergence
from helpers.live import Knob, LivePoint, Progress, TrySpec, no_progress
from helpers.params import Param
from helpers.results import Records
from helpers.timing import Measurement
from helpers.verdict import Verdict


__all__ = ["NOTEBOOK", "BaselineData", "BaselineResult", "classify", "run", "scan", "spare_cores", "timed_steps",
           "verdict", "live_point", "try_baseline"]

NOTEBOOK = "01_baseline_profiling"


def classify(exposed_fraction: float, threshold: float, *, device_kind: str = "") -> tuple[str, str]:
    """Call a job host-bound, balanced or device-bound from its exposed input share.

    The label and sentence of :func:`helpers.bottleneck.classify` (the one rule, shared with ``diagnose``,
    the instrument and the report): with input at X of a serial step, removing it saves X, a 2x faster
    compute saves (1-X)/2; at or below the threshold the job is device-bound, above it host-bound when the
    input is the larger lever (X >= 1/3), else balanced. Notebook 01's timed loop runs its three phases one
    after the other and each is timed (the compute after a device synchronize), so they add up to the step and
    the computation's measured share is 1 - X here; a profiler trace, whose step also holds idle time and
    communication, passes its own measured shares to :func:`helpers.bottleneck.classify` instead.

    Parameters
    ----------
    exposed_fraction : float
        Exposed input time / step time, 0..1.
    threshold : float
        Share above which the input counts (notebook 01's ``host_bound_threshold``, default 0.10), 0..1.
    device_kind : str
        "cpu", "cuda" or "npu"; on "cpu" the reason says that the "device"
        is the same processor that prepares the input.

    Returns
    -------
    (recommendation, reason) : tuple of str
        recommendation is one of :data:`helpers.bottleneck.LABELS`.

    Raises
    ------
    helpers.errors.ParameterError
        For a share outside [0, 1].
    """
    b = bottleneck.classify(exposed_fraction, threshold, device_kind=device_kind,
                            compute_fraction=max(0.0, 1.0 - float(exposed_fraction))
                            if isinstance(exposed_fraction, (int, float)) and not isinstance(exposed_fraction, bool)
                            and 0.0 <= exposed_fraction <= 1.0 else None)
    return b.label, b.reason


def _share(fraction: float | None) -> str:
    """A share of the step as percent, or "not measurable" for None."""
    return "not measurable" if fraction is None else f"{fraction:.0%}"


def verdict(run: TrainRun, per_image: Measurement | None, *, threshold: float, device_kind: str,
            description: Mapping[str, Any], steps: int, ceiling: Any = None, divergence: Any = None) -> Verdict:
    """Notebook 01's verdict: host-bound, balanced or device-bound, with the phase medians it rests on; "your job
    diverges" where its loss became NaN or infinite.

    Parameters
    ----------
    run : helpers.compute.train.TrainRun
        The baseline's measured steps (seconds per phase).
    per_image : helpers.timing.Measurement or None
        Per-image preprocessing time of the baseline (seconds); None for a user's job, whose dataset
        is timed only as the data phase.
    threshold : float
        ``host_bound_threshold`` (exposed input / step time, 0..1).
    device_kind : str
        "cpu", "cuda" or "npu".
    description : mapping
        ``job.describe()`` (plus ``skipped``, images skipped, for the built-in job).
    steps : int
        Measured steps.
    ceiling : helpers.experiments.three_run.CeilingResult, optional
        The job against its input-free ceiling; its sentence joins the reason and its figures
        ``extra["ceiling"]`` (``free_input_speedup`` with ``ci_low``/``ci_high``, ``fraction`` with its interval).
    divergence : helpers.jobs.check.Divergence, optional
        Where the loss of the timed steps first became NaN or infinite (:func:`helpers.jobs.check.loop_divergence`
        of the run's loop). When it did, the job diverges: the recommendation is "inconclusive" and the reason is
        :meth:`~helpers.jobs.check.Divergence.sentence` ("your job diverges: its loss is nan at step 3 ...") with
        no label (the timings are of a job that no longer trains); ``extra["divergence"]`` keeps where, and
        ``extra["measured_recommendation"]`` the label the timings alone give.

    Returns
    -------
    helpers.verdict.Verdict
        metric ``exposed_input_fraction`` (fraction), with the interquartile range of the per-step fractions;
        ``extra["phases"]``: per phase (``data``, ``h2d``, ``compute``, ``step_s``) its ``median_s``, ``p25_s``
        and ``p75_s`` in seconds, which notebook 10 cross-checks its own baseline against;
        ``extra["bottleneck"]``: :meth:`helpers.bottleneck.Bottleneck.as_dict` (the two levers' savings, the
        notebooks to open next and why); the reason ends with that "next" advice.
    """
    med = run.phase_medians()
    exposed_s = med["data"] + med["h2d"]
    # the computation is timed on its own (synchronized forward, backward and optimizer), so its share is passed
    # as measured, never taken as the rest of the step
    compute_fraction = float((run.steps["compute"] / run.steps["step_s"]).median())
    b = bottleneck.classify(run.exposed_fraction, threshold, device_kind=device_kind,
                            spare_cores=spare_cores(device_kind),
                            copy_share=med["h2d"] / exposed_s if exposed_s > 0 else None,
                            compute_fraction=min(1.0, max(0.0, compute_fraction)))
    recommendation, reason = b.label, b.reason
    reason += (f"; median step {med['step_s'] * 1e3:.0f} ms (phase medians: data {med['data'] * 1e3:.0f}, h2d "
               f"{med['h2d'] * 1e3:.0f}, compute {med['compute'] * 1e3:.0f} ms; medians need not add up)")
    if per_image is not None:
        reason += f"; baseline preprocessing {per_image.median_s * 1e3:.1f} ms/image"
    extra: dict[str, Any] = {"bottleneck": b.as_dict()}
    if ceiling is not None:
        reason += f"; {ceiling.sentence(exposed=run.exposed_fraction)}"
        c = ceiling.ceiling
        f, lo, hi = ceiling.fraction
        extra["ceiling"] = {"free_input_speedup": c.ratio, "ci_low": c.ci_low, "ci_high": c.ci_high,
                            "fraction": f, "fraction_ci": [lo, hi]}
    d = description
    if "model_width" in d and "images" in d:  # the built-in PPO job
        context = (f"{d.get('job', 'job')}: a multimodal policy ({d['model_width']}-channel conv stem, d_model "
                   f"{d['d_model']}) trained with PPO, batch {d['batch_size']} of {d['image_size']} px crops from "
                   f"{d['images']} images ({d.get('skipped', 0)} skipped), baseline loader (num_workers=0, per-image "
                   f"PIL decode), {steps} measured steps on {device_kind}")
    else:  # a user's job: what it says about itself
        context = (f"{description_text(d)}, its own loader as given (num_workers=0), {steps} measured steps "
                   f"on {device_kind}")
    reason += f"; next: {b.next_text()}"
    context += "; exposed input = time the step waits for data and the host-to-device copy"
    fractions = Measurement(name="exposed", times_s=tuple(run.steps["exposed_fraction"]), warmup=run.warmup_steps)
    phases = {c: {"median_s": float(run.steps[c].median()), "p25_s": float(run.steps[c].quantile(0.25)),
                  "p75_s": float(run.steps[c].quantile(0.75))} for c in (*PHASES, "step_s")}
    if divergence is not None and divergence.diverged:  # the loss is not finite: no label from these timings
        extra = {**extra, "divergence": divergence.as_dict(), "measured_recommendation": recommendation}
        recommendation, reason = "inconclusive", (
            f"{divergence.sentence()} (median step {med['step_s'] * 1e3:.0f} ms, exposed input "
            f"{run.exposed_fraction:.0%} of it)")
    return Verdict(notebook=NOTEBOOK, metric="exposed_input_fraction", value=run.exposed_fraction, unit="fraction",
                   recommendation=recommendation, reason=reason, context=context,
                   spread={"p25": fractions.p25_s, "p75": fractions.p75_s}, extra={"phases": phases, **extra})


def live_point(run: TrainRun, label: str, *, threshold: float, device_kind: str = "",
               batch_size: int | None = None) -> LivePoint:
    """A run's exposed input share as a "try it" point: the median per step, its IQR, and the verdict it gives.

    Parameters
    ----------
    run : TrainRun
        Measured steps (warm-up excluded).
    label : str
        The settings it ran at, e.g. ``"bs=32, 64px"``.
    threshold : float
        The host-bound threshold (notebook 01's ``host_bound_threshold``).
    device_kind : str
        As :func:`classify`.
    batch_size : int, optional
        Samples per step, for the throughput in the sentence.

    Returns
    -------
    LivePoint
        metric ``exposed_input_fraction``, unit ``fraction``; the sentence names the verdict at ``threshold``.
    """
    fractions = run.steps["exposed_fraction"]
    label_now, _ = classify(run.exposed_fraction, threshold, device_kind=device_kind)
    step_s = float(run.steps["step_s"].median())
    rate = f", {batch_size / step_s:,.0f} samples/s" if batch_size else ""
    return LivePoint(label=label, value=float(run.exposed_fraction), unit="fraction", metric="exposed_input_fraction",
                     low=float(fractions.quantile(0.25)), high=float(fractions.quantile(0.75)),
                     sentence=(f"{label}: {label_now} - input exposed for {run.exposed_fraction:.0%} of a "
                               f"{step_s * 1e3:.0f} ms step (IQR {fractions.quantile(0.25):.0%}-"
                               f"{fractions.quantile(0.75):.0%}, {len(fractions)} steps){rate}"),
                     extra={"verdict": label_now, "step_s": step_s}, repeats=len(fractions))


def try_baseline(params: Mapping[str, Any], acc, *, batch_size: int, image_size: int | None = None,
                 steps: int = 10, warmup_steps: int = 2, progress: Progress = no_progress) -> LivePoint:
    """Notebook 01's baseline again at another batch size (and image size): where does the verdict move?

    The job is rebuilt from the notebook's parameters with these two changed (the built-in job, or the user's
    through its factory's ``batch_size``/``image_size`` arguments where it takes them) and timed by the same
    phase-timed loop as the notebook, ``warmup_steps`` excluded.

    Parameters
    ----------
    params : mapping
        The notebook's validated parameters.
    acc : helpers.device.Accelerator
    batch_size : int
        Samples per step (> 0).
    image_size : int, optional
        Side of the square crop in px; None keeps the notebook's.
    steps, warmup_steps : int
        Measured and excluded steps.
    progress : callable
        ``progress(done, total)`` after each step.

    Returns
    -------
    LivePoint
        See :func:`live_point`.

    Raises
    ------
    helpers.errors.ParameterError
        For a batch size or image size the job's parameters reject.
    """
    from helpers.experiments.training import prepare_job
    from helpers.jobs.load import notebook_job
    from helpers.jobspec import FACTORY_DEFAULTS_KEY
    from helpers.experiments.registry import validate_notebook_params

    changed = {"batch_size": int(batch_size)}
    if image_size is not None:
        changed["image_size"] = int(image_size)
    p = validate_notebook_params(NOTEBOOK, {**params, **changed}, allow_unknown=True)
    if params.get(FACTORY_DEFAULTS_KEY):  # a user's job keeps its own sizes, but for the ones changed here
        p[FACTORY_DEFAULTS_KEY] = [k for k in params[FACTORY_DEFAULTS_KEY] if k not in changed]
    job = notebook_job(p)
    timed = prepare_job(job, acc)
    total = int(warmup_steps) + int(steps)
    try:
        timed.loop.run(warmup_steps, measured=False, progress=lambda d, _t: progress(d, total)).discard()
        timed.loop.run(steps, progress=lambda d, _t: progress(int(warmup_steps) + d, total))
        run = timed.loop.result()
    finally:
        timed.close()
    label = f"bs={batch_size}" + (f", {image_size}px" if image_size is not None else "")
    return live_point(run, label, threshold=float(p["host_bound_threshold"]), device_kind=acc.kind,
                      batch_size=int(batch_size))


# -- the experiment: one run, one result ----------------------------------------------------------------

#: The columns of the per-step summary table (:meth:`BaselineResult.summary_table`), where the run has them.
SUMMARY_COLUMNS = ("data", "h2d", "compute", "step_s", "exposed_fraction", "loss", "reward_mean")


@dataclass(frozen=True)
class DatasetSummary:
    """The built-in job's scanned images, as section 1 reports them.

    Attributes
    ----------
    images, classes : int
        Usable images and their distinct labels.
    skipped : tuple of (str, str)
        ``(file name, reason)`` of each file the scan skipped.
    source : str
        ``"embedded"`` or ``"user folder"`` (``data_dir`` set).
    table : pandas.DataFrame
        :meth:`helpers.pipeline.dataset.DatasetIndex.frame` with each path relative to the folder.
    """

    images: int
    classes: int
    skipped: tuple[tuple[str, str], ...]
    source: str
    table: pd.DataFrame


@dataclass(frozen=True, eq=False)
class BaselineData:
    """Section 1 of notebook 01, before any timing (:func:`scan`): the job's scanned images and its description.
    :class:`BaselineResult` extends it with the measurement.

    Attributes
    ----------
    dataset : DatasetSummary or None
        The built-in job's images; None for a user's job, whose dataset the workbook does not scan.
    description : dict
        ``job.describe()`` (plus ``skipped``, images skipped, for the built-in job): the verdict's context.
    job : helpers.jobs.base.Job or None
        The built-in PPO job, or the user's (``params["job"]``), that :func:`run` measures next (keyword-only; None
        in a result built by hand).
    """

    dataset: DatasetSummary | None
    description: Mapping[str, Any]
    job: Any = field(default=None, repr=False, kw_only=True)

    def dataset_text(self) -> str:
        """Section 1: the images scanned, the files skipped (at most 10) and a note when every label is the same;
        for a user's job, what it says about itself."""
        d = self.dataset
        if d is None:
            return f"your job: {description_text(self.description)}"
        lines = [f"{d.images} images, {d.classes} class(es), {len(d.skipped)} file(s) skipped"]
        lines += [f"  skipped {name}: {reason}" for name, reason in d.skipped[:10]]
        if d.classes < 2:
            lines.append("note: every image has the same label, so the reward is trivial; the timing is still valid "
                         "(add class subfolders or a label column to captions.csv for a real task)")
        return "\n".join(lines)

    def dataset_table(self) -> pd.DataFrame | None:
        """Section 1: the first rows of the scanned images' table (None for a user's job)."""
        return None if self.dataset is None else self.dataset.table.head()


@dataclass(frozen=True, eq=False)
class BaselineResult(BaselineData, ExperimentResult):
    """Notebook 01's measurement: the job, one image's cost, the phase-timed steps, the profile, the input-free
    ceiling and a trace read back.

    Attributes
    ----------
    device_kind : str
        ``"cpu"``, ``"cuda"`` or ``"npu"``.
    dataset, description, job
        As :class:`BaselineData`'s (section 1, with its texts).
    job_spec : str
        The ``job`` parameter (empty: the built-in job).
    batch_size : int
        Samples per step (a user's job: its own).
    per_image : helpers.timing.Measurement or None
        Per-image preprocessing time, seconds (the built-in job's per-image pipeline); None for a user's job.
    run : helpers.compute.train.TrainRun
        The baseline's measured steps (seconds per phase).
    steps, warmup_steps : int
        Measured and excluded steps.
    threshold : float
        ``host_bound_threshold``.
    profile : helpers.diagnose.profiler.ProfileResult or None
        The profiler's run (None: ``profile_steps=0``).
    trace_file : str or None
        The profiler's trace, relative to the run folder; None when none was written.
    ceiling : helpers.experiments.three_run.CeilingResult
        The job against its input-free ceiling.
    divergence : helpers.jobs.check.Divergence or None
        Where the timed steps' loss first became NaN or infinite (:func:`helpers.jobs.check.loop_divergence`;
        keyword-only, None in a result built without it): :meth:`verdict` then says the job diverges.
    trace : helpers.traces.analysis.TraceAnalysis or None
        The trace read back (``trace_path``, else the profile's own); None without one.
    trace_given : bool
        Whether ``trace_path`` named the trace (else it is this job's own, from the profile).
    """

    device_kind: str
    job_spec: str
    batch_size: int
    per_image: Measurement | None
    run: TrainRun
    steps: int
    warmup_steps: int
    threshold: float
    profile: Any
    trace_file: str | None
    ceiling: CeilingResult
    trace: Any
    trace_given: bool
    divergence: Any = field(default=None, kw_only=True)

    # -- what the cells print ----------------------------------------------------------------

    def per_image_ms(self) -> list[float]:
        """Section 2: each timed image's preprocessing time, ms (empty for a user's job)."""
        return [] if self.per_image is None else [t * 1e3 for t in self.per_image.times_s]

    def per_image_text(self) -> str:
        """Section 2: the median per-image cost with its IQR and rate, or why a user's job has none."""
        m = self.per_image
        if m is None:
            return ("your job: its dataset is timed as a whole, as the data phase of each step below "
                    "(the per-image breakdown is the built-in job's)")
        return (f"per-image preprocessing: median {m.median_s * 1e3:.1f} ms (IQR {m.p25_s * 1e3:.1f}-"
                f"{m.p75_s * 1e3:.1f} ms, {m.repeats} images) = {m.rate:.0f} images/s in one process")

    def steps_text(self) -> str:
        """Section 3: the steps measured and the median of each phase."""
        med = self.run.phase_medians()
        return (f"{self.steps} measured steps after {self.warmup_steps} warm-up; median step "
                f"{med['step_s'] * 1e3:.0f} ms: " + ", ".join(f"{p} {med[p] * 1e3:.0f} ms" for p in PHASES))

    def summary_table(self) -> pd.DataFrame:
        """Section 3: per column of the steps (phases, step, exposed share, loss, reward), its median, min and max."""
        summary = self.run.steps[[c for c in SUMMARY_COLUMNS if c in self.run.steps]]
        return summary.describe().loc[["50%", "min", "max"]].rename(index={"50%": "median"}).round(4)

    def phase_totals(self) -> pd.DataFrame:
        """Section 3: the median of each phase, seconds, one row ``baseline`` (the phase breakdown's input)."""
        med = self.run.phase_medians()
        return pd.DataFrame([{p: med[p] for p in PHASES}], index=["baseline"])

    def consistency_text(self) -> str:
        """Section 3: the data phase against the per-image cost times the batch size (num_workers=0)."""
        if self.per_image is None:
            return "your job: no per-image timing to predict its data phase from"
        med, m, bs = self.run.phase_medians(), self.per_image, self.batch_size
        expected = m.median_s * bs
        return (f"data phase {med['data'] * 1e3:.0f} ms per step vs {bs} x {m.median_s * 1e3:.1f} ms "
                f"= {expected * 1e3:.0f} ms predicted from the per-image timing ({med['data'] / expected:.2f}x)")

    def profile_text(self) -> str:
        """Section 4: where the profiler's trace is (its full path, to open in Perfetto), or why there is none."""
        if self.profile is None:
            return "profiling skipped (profile_steps=0)"
        path = getattr(self.profile, "trace_path", None) or self.trace_file
        return f"trace: {path}" if self.trace_file else "no trace file was written"

    def top_ops(self) -> pd.DataFrame | None:
        """Section 4: the profiler's 12 top operators (device columns dropped where empty, as on a CPU)."""
        return None if self.profile is None else self.profile.top_ops.head(12).dropna(axis=1, how="all")

    def ceiling_text(self) -> str:
        """Section 5: each run's median step and phases, then the ceiling's sentence, reconciled with the
        exposed share."""
        lines = []
        for name, df in self.ceiling.steps.items():
            lines.append(f"{name:9s} step {df['step_s'].median() * 1e3:7.1f} ms (IQR "
                         f"{df['step_s'].quantile(0.25) * 1e3:.1f}-{df['step_s'].quantile(0.75) * 1e3:.1f}): data "
                         f"{df['data'].median() * 1e3:.1f}, h2d {df['h2d'].median() * 1e3:.1f}, compute "
                         f"{df['compute'].median() * 1e3:.1f} ms")
        lines.append(self.ceiling.sentence(exposed=self.run.exposed_fraction))
        return "\n".join(lines)

    def verdict_at(self, threshold: float) -> str:
        """Section 6: the label at another ``threshold`` (printed, and returned), for the slider."""
        label, _ = classify(self.run.exposed_fraction, threshold)
        print(f"threshold {threshold:.0%}: {label} (exposed input {self.run.exposed_fraction:.0%} of the step)")
        return label

    def trace_text(self) -> str:
        """Section 7: the trace's reading (yours, or this job's own beside section 3's timing) and what it cannot
        tell."""
        mine = self.trace
        if mine is None:
            return "no trace to read: set trace_path, or profile_steps > 0 so that section 4 writes one"
        if self.trace_given:
            lines = [f"your trace: {mine.sentence()}"]
        else:
            timed = self.verdict().recommendation
            lines = [f"this job's own trace: exposed input {_share(mine.job.exposed_fraction)} of the step "
                     f"({mine.label}); timed in section 3: {self.run.exposed_fraction:.0%} ({timed})"]
            if mine.label != timed:
                lines.append(self._why_trace_differs(mine))
        lines += [f"  the trace cannot tell: {limit}" for limit in mine.limits]
        return "\n".join(lines)

    def _why_trace_differs(self, mine: Any) -> str:
        """Why this job's own trace and section 3's timing give different labels, from the figures of both."""
        compute = mine.job.phases.get("compute") if isinstance(mine.job.phases, Mapping) else None
        timed_ms = self.run.phase_medians()["compute"] * 1e3
        longer = (f"; its compute phase is {compute.median_s * 1e3:.0f} ms per step against {timed_ms:.0f} ms timed "
                  "without it" if compute is not None and compute.median_s > 0 else "")
        return (f"  why they differ: the trace holds {mine.job.steps} profiled step(s), section 3 times "
                f"{self.steps}, and the profiler records every operator, which lengthens the compute it "
                f"times{longer}. A share near the {self.threshold:.0%} threshold or the one-third rule can fall "
                "on either side: act on section 6's verdict, measured over more steps without the profiler")

    # -- records, verdict and the panel ----------------------------------------------------------

    def records(self) -> Records:
        """The dataset (or the user's job), the per-image cost, each phase of the step and the exposed share, the
        input-free ceiling and, per rank, the trace's exposed share; in that order."""
        out = Records()
        d = self.dataset
        if d is not None:
            out.add("dataset", "usable images", "images", d.images, "images", skipped=len(d.skipped),
                    classes=d.classes, source=d.source)
        else:
            out.add("dataset", "your job", "batch_size", self.batch_size, "samples", **self.description,
                    spec=self.job_spec)
        if self.per_image is not None:
            out.add_measurement("preprocess", "baseline per-image", self.per_image, metric="time_per_image", unit="s",
                                rate_metric="throughput", rate_unit="images/s")
        run = self.run
        for phase in (*PHASES, "step_s"):
            m = Measurement(name=phase, times_s=tuple(run.steps[phase]), warmup=self.warmup_steps,
                            items_per_call=self.batch_size if phase == "step_s" else None)
            out.add_measurement("baseline step", phase.replace("_s", ""), m, metric="time_per_step", unit="s",
                                rate_metric="throughput" if phase == "step_s" else None,
                                rate_unit="samples/s" if phase == "step_s" else None)
        fractions = Measurement(name="exposed", times_s=tuple(run.steps["exposed_fraction"]), warmup=self.warmup_steps)
        out.add("baseline step", "exposed input", "exposed_input_fraction", run.exposed_fraction, "fraction",
                repeats=fractions.repeats, spread={"p25": fractions.p25_s, "p75": fractions.p75_s})
        ran = self.ceiling.ran  # both runs' torch threads and batch (helpers.conditions)
        out.add_comparison("input-free ceiling", self.ceiling.ceiling, metric="free_input_speedup", unit="x",
                           **sides(ran, ran))
        f, lo, hi = self.ceiling.fraction
        out.add("input-free ceiling", "real / synthetic", "ceiling_fraction", f, "fraction",
                repeats=self.ceiling.ceiling.b.repeats, spread={"ci_low": lo, "ci_high": hi})
        for r in self.trace.ranks if self.trace is not None else ():  # with the trace's provenance
            out.add("your trace", r.label, "exposed_input_fraction", r.exposed_fraction, "fraction",
                    verdict=r.label_text, trace=dict(r.provenance))
        return out

    def verdict(self) -> Verdict:
        """Notebook 01's verdict (:func:`verdict`): host-bound, balanced or device-bound; "inconclusive", saying
        that the job diverges, where its loss became NaN or infinite."""
        return verdict(self.run, self.per_image, threshold=self.threshold, device_kind=self.device_kind,
                       steps=self.steps, description=self.description, ceiling=self.ceiling,
                       divergence=self.divergence)

    @property
    def label(self) -> str:
        """The settings measured, as the panel labels its points: ``"bs=32, 64px"`` (a user's job: ``"bs=64"``)."""
        size = self.description.get("image_size")
        return f"bs={self.batch_size}" + (f", {size}px" if self.dataset is not None and size else "")

    def try_it(self, acc: Any, params: Mapping[str, Any]) -> TrySpec:
        """The "try it" panel: the same baseline at another batch size (and, for the built-in job, crop size),
        at most 10 measured steps after 2 warm-up, beside this notebook's own point.

        Parameters
        ----------
        acc : helpers.device.Accelerator
        params : mapping
            The notebook's parameters (a user's job: with its own batch size, as ``ctx.job()`` sets it).
        """
        bs = int(params["batch_size"])
        knobs = {"batch_size": Knob(tuple((str(v), v) for v in sorted({8, 16, 32, 64, 128, bs})), bs, "batch_size")}
        if self.dataset is not None:  # a user's job takes image_size only where its factory does: the built-in's
            size = int(params["image_size"])
            knobs["image_size"] = Knob(tuple((str(v), v) for v in sorted({32, 64, 96, 128, size})), size,
                                       "image_size")
        steps = min(int(params["steps"]), 10)
        return TrySpec("baseline at another batch size and crop size",
                       lambda progress, **k: try_baseline(params, acc, steps=steps, warmup_steps=2, progress=progress,
                                                          **k),
                       knobs, reference=live_point(self.run, self.label, threshold=self.threshold,
                                                   device_kind=self.device_kind, batch_size=self.batch_size))


def timed_steps(params: Mapping[str, Any]) -> int:
    """The steps :func:`run` reports to its ``progress``: the baseline's warm-up and measured steps, then the
    ceiling's two runs' (``2 * (warmup_steps + ceiling_steps)``)."""
    w = int(params["warmup_steps"])
    return w + int(params["steps"]) + 2 * (w + int(params["ceiling_steps"]))


def scan(ctx: Any) -> BaselineData:
    """Notebook 01's section 1, before any timing: a ``trace_path`` that holds no trace is refused, the job is
    built (``ctx.job()``) and the built-in job's images are scanned.

    Parameters
    ----------
    ctx : helpers.workbook.nbsetup.NotebookContext
        The notebook's context: its parameters (``trace_path``, ``data_dir``, ``job``) and job.

    Returns
    -------
    BaselineData
        What :func:`run` measures next.

    Raises
    ------
    helpers.errors.DataError
        If ``trace_path`` holds no trace, or the images cannot be read.
    """
    from helpers.traces import find_traces

    P = ctx.params
    if P["trace_path"]:  # a path that holds no trace stops here, before minutes of measuring
        find_traces([P["trace_path"]])
    job = ctx.job()  # the built-in job (photos scanned, captions tokenized), or the user's
    dataset = _dataset_summary(job, P["data_dir"])
    description = {**job.describe(), **({"skipped": len(dataset.skipped)} if dataset is not None else {})}
    return BaselineData(job=job, dataset=dataset, description=description)


def _dataset_summary(job: Any, data_dir: str) -> DatasetSummary | None:
    """The built-in job's scanned images (its :meth:`helpers.jobs.base.Job.image_data`), or None for a job
    whose factory built its own dataset."""
    from pathlib import Path

    data = job.image_data()
    if data is None:
        return None
    index = data[0]
    table = index.frame()
    table["path"] = [Path(p).relative_to(index.root).as_posix() for p in table["path"]]
    return DatasetSummary(images=len(index), classes=index.n_classes,
                          skipped=tuple((bad.path.name, bad.reason) for bad in index.skipped),
                          source="user folder" if data_dir else "embedded", table=table)


def _per_image(job: Any, repeats: int) -> Measurement:
    """The built-in job's per-image preprocessing, one image at a time in the loader's cyclic order."""
    import itertools

    from helpers.jobs.base import close_dataset
    from helpers.timing import measure

    batches = job.make_dataset("baseline")
    try:
        dataset = batches.dataset  # the per-image dataset behind the baseline's batches
        order = itertools.cycle(range(len(dataset)))
        return measure(lambda: dataset[next(order)], repeats=repeats, warmup=2, name="per-image preprocessing",
                       items_per_call=1)
    finally:
        close_dataset(batches)


def run(ctx: Any, data: BaselineData | None = None, *, progress: Progress = no_progress) -> BaselineResult:
    """Notebook 01's experiment, in the notebook's order: the job (and its images: ``data``), one image's cost,
    the phase-timed steps, the profile, the input-free ceiling and the trace read back.

    Parameters
    ----------
    ctx : helpers.workbook.nbsetup.NotebookContext
        The notebook's context: its parameters, accelerator, run folder and job (``ctx.job()``: the built-in
        PPO job, or the user's with ``job`` set).
    data : BaselineData, optional
        Section 1 as :func:`scan` returned it (the notebook shows it before the timing starts); None scans here.
    progress : callable
        ``progress(done, total)`` after every timed step, :func:`timed_steps` calls in all (e.g.
        :func:`helpers.workbook.progress.progress_bar`'s).

    Returns
    -------
    BaselineResult

    Raises
    ------
    helpers.errors.DataError
        If ``trace_path`` holds no trace (before any measuring).
    """
    from helpers.diagnose.profiler import profile_steps
    from helpers.experiments.three_run import input_free_ceiling
    from helpers.experiments.training import prepare_job
    from helpers.traces import read
    from helpers.traces.analysis import analyze

    P, acc = ctx.params, ctx.acc
    data = data if data is not None else scan(ctx)
    job, dataset = data.job, data.dataset
    per_image = _per_image(job, P["preprocess_samples"]) if dataset is not None else None
    warmup, steps = P["warmup_steps"], P["steps"]
    base = warmup + steps
    timed = prepare_job(job, acc)  # the baseline: per-image pipeline, num_workers=0, fp32, NCHW
    try:
        loop = timed.loop.run(warmup, measured=False, progress=progress).discard()
        train = loop.run(steps, progress=lambda d, _t: progress(warmup + d, base)).result()
        prof = trace_file = None
        if P["profile_steps"] > 0:
            prof = profile_steps(lambda: timed.step(job.to_device(next(timed.loop.batches), acc)), kind=acc.kind,
                                 out_dir=ctx.artifacts_dir / "profile", steps=P["profile_steps"], warmup=1,
                                 sync=acc.synchronize)
            trace_file = prof.trace_path.relative_to(ctx.out_dir).as_posix() if prof.trace_path else None
    finally:
        timed.close()  # the loader and the dataset are done
    divergence = loop_divergence({"the baseline": timed.loop})  # from the steps' losses, read after the runs
    ceiling = input_free_ceiling(job, acc, steps=P["ceiling_steps"], warmup_steps=warmup,
                                 progress=lambda d, t: progress(base + d, base + t))
    source = P["trace_path"] or (prof.trace_path if prof is not None else None)  # yours, or section 4's
    trace = analyze(read([source]), threshold=P["host_bound_threshold"]) if source else None
    return BaselineResult(**checked_fields(data), device_kind=acc.kind, job_spec=P.get("job") or "",
                          batch_size=int(job.workload.batch_size), per_image=per_image, run=train,
                          steps=steps, warmup_steps=warmup, threshold=float(P["host_bound_threshold"]), profile=prof,
                          trace_file=trace_file, ceiling=ceiling, trace=trace, trace_given=bool(P["trace_path"]),
                          divergence=divergence)


# -- the notebook's declaration, found by helpers.experiments.registry ------------------------------------

EXPERIMENT = Experiment(
    item=Item("01", "01_baseline_profiling", "baseline profiling",
         "Find where a training step spends its time",
         "Where does a training step's time go, and is the job host-bound?"),
    spec=specs.COMMON + specs.DATA + specs.batch() + specs.training() + (
        Param("host_bound_threshold", float, 0.10,
              "exposed input time / step time above which the job is called host-bound",
              minimum=0.0, maximum=1.0),
        Param("preprocess_samples", int, 64, "images timed one by one for ms/image", minimum=1,
              maximum=100000),
        Param("profile_steps", int, 2, "steps recorded by the profiler (0 skips profiling)",
              minimum=0, maximum=100),
        Param("ceiling_steps", int, 10, "measured steps of each run of the input-free ceiling (real vs on-device "
              "batches)", minimum=3, maximum=100000),
        Param("trace_path", str, "", "your profiler trace: a .pt.trace.json(.gz), an *_ascend_pt folder, or a folder "
              "of one per rank (empty: section 4's)"),
    ) + specs.JOB,
)
