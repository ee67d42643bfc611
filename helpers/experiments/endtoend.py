"""Notebook 10's experiment: the baseline of notebook 01 and the optimized job, side by side.

It composes the building blocks of notebooks 01-07 and adds no pipeline or compute code of its own. In the
notebook's order:

1. :func:`choose`: which optimizations the optimized job uses, from this run's verdicts or an explicit list
   (:mod:`helpers.experiments.e2e_select`), as an :class:`EndToEndSetup`;
2. :meth:`EndToEndSetup.check_same_input`: the baseline and the optimized job see the same samples;
3. :func:`run`: the baseline, the optimized job, its input-free ceiling and (with ``ablation``) the optimized job
   without each optimization, timed in interleaved blocks (:mod:`helpers.experiments.e2e_jobs`); the
   cross-checks, the learning check, the ablation and the projection (:mod:`helpers.experiments.e2e_checks`);
   it returns an :class:`EndToEndResult`, whose records and verdict (:mod:`helpers.experiments.e2e_verdict`)
   ``ctx.record(result)`` writes;
4. :meth:`EndToEndResult.try_it`: the notebook's "try it" panel, which times the baseline against a job with the
   optimizations switched on by hand (:func:`helpers.experiments.e2e_try.try_optimizations`), the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from helpers import bottleneck, specs
from helpers.checklist import Item
from helpers.conditions import held, ran_with, sides
from helpers.experiments import crosscheck
from helpers.experiments.base import Experiment, ExperimentResult
from helpers.experiments.e2e_checks import (Projection, ablation_frame, attribute, compute_side_lines, cross_checks,
                                            earlier_baseline_phases, project)
from helpers.experiments.e2e_jobs import (JobConfig, JobSummary, JobVariant, ablation_configs, ceiling_fraction,
                                          check_optimizations, contribution, run_interleaved, same_input_check, speedup,
                                          summarize, summary_frame)
from helpers.experiments.e2e_select import Selection, select_optimizations, source_notebooks
from helpers.experiments.e2e_try import BLOCK, live_point, try_optimizations
from helpers.experiments.e2e_verdict import batch_size_note, e2e_verdict, next_step
from helpers.experiments.training import LearningCheck, learning_check
from helpers.jobs.base import Workload
from helpers.jobs.check import loop_divergence
from helpers.live import Knob, Progress, TrySpec
from helpers.params import Param
from helpers.results import Records, verdicts
from helpers.timing import Comparison
from helpers.tune.loop_diff import change_as_code

__all__ = ["BLOCK", "CPU_H2D_NOTE", "Ablation", "EndToEndResult", "EndToEndSetup", "SameInput",
           "check_optimizations", "choose", "run"]

#: What the h2d phase is on a CPU (no copy there): printed under tables and in the next-step sentence.
CPU_H2D_NOTE = ("on the CPU the h2d phase is no copy: it is to_device_batch's conversion and normalization "
                "(uint8 NHWC -> float NCHW; plus the NHWC reorder with channels_last); the baseline normalizes "
                "on the host, in its data phase, so its h2d is ~0")

#: Why a job without the workbook's image pipeline cannot use the decode-side optimizations.
_NOT_FOR_YOUR_JOB = {
    "batched_decode": "it is the workbook's batched JPEG pipeline; your job decodes in its own dataset",
    "dataset_cache": "it caches the workbook's image-folder dataset; your job reads its own"}

# --------------------------------------------------------------------------- 1-2: the jobs, and the same input


@dataclass(frozen=True)
class SameInput:
    """The first batch of the baseline and of the optimized job, compared (:func:`e2e_jobs.same_input_check`).

    Attributes
    ----------
    labels_equal, tokens_equal : bool
        The same samples (a user's job: the same values, or the same order, labels, shapes and dtypes).
    mean_abs_levels, max_abs_levels : float
        Pixel difference in 0-255 levels, from decoding only (NaN for a user's job whose values differ).
    batches_equal : bool or None
        A user's job: the same values (None for the built-in job).
    builtin : bool
        Whether the job is the built-in one (the sentence's wording).
    """

    labels_equal: bool
    tokens_equal: bool
    mean_abs_levels: float
    max_abs_levels: float
    batches_equal: bool | None = None
    builtin: bool = True

    def sentence(self) -> str:
        """What the check found, in one line."""
        if not self.builtin:
            return f"same values in the first batch of both jobs: {self.batches_equal}"
        return (f"same samples in the first batch: labels {self.labels_equal}, tokens {self.tokens_equal}; pixels "
                f"differ by {self.mean_abs_levels:.2f} levels on average (max {self.max_abs_levels:.0f} of 255)")


@dataclass(frozen=True, eq=False)
class EndToEndSetup:
    """What notebook 10 will measure: the job, the device, its parameters and the chosen optimizations.

    Attributes
    ----------
    job : helpers.jobs.base.Job
    acc : helpers.device.Accelerator
    params : mapping
        The notebook's parameters (a copy, taken after the job set a user's batch size).
    selection : helpers.experiments.e2e_select.Selection
    unavailable : mapping of str to str
        Optimizations this job cannot use, with why.
    results : pandas.DataFrame or None
        This run's earlier records (the verdicts the selection read).
    """

    job: Any
    acc: Any
    params: Mapping[str, Any]
    selection: Selection
    unavailable: Mapping[str, str]
    results: Any = None

    @property
    def baseline(self) -> JobConfig:
        """The baseline job: no optimization."""
        return JobConfig("baseline")

    @property
    def optimized(self) -> JobConfig:
        """The optimized job (:meth:`Selection.job`)."""
        return self.selection.job("optimized")

    def variants(self) -> list[JobConfig]:
        """The ablation's jobs: the optimized job without each optimization (none without ``ablation`` or with
        fewer than two optimizations)."""
        opt = self.optimized
        return ablation_configs(opt) if self.params["ablation"] and len(opt.optimizations) > 1 else []

    def timed_steps(self) -> int:
        """Steps of the interleaved rotation, all jobs together (what a progress bar counts)."""
        jobs = 3 + len(self.variants())  # baseline, optimized, the input-free ceiling and the variants
        return jobs * (int(self.params["warmup_steps"]) + int(self.params["steps"]))

    def selection_text(self) -> str:
        """The missing verdicts and workload warnings, then ``"optimized job: <label>"``."""
        lines = self.selection.missing_lines() + self.selection.warning_lines()
        return "\n".join([*lines, f"optimized job: {self.optimized.label()}"])

    def data_sentence(self) -> str:
        """The dataset in one line: images, classes, skipped files, batches per epoch (a user's job: its
        description)."""
        if not self.job.is_builtin:
            return f"your job: {self.job.summary()}"
        index, bs = self.job.index, self.params["batch_size"]
        return (f"{len(index)} images, {index.n_classes} class(es), {len(index.skipped)} file(s) skipped; "
                f"{len(index) // bs} batches of {bs} per epoch")

    def check_same_input(self) -> SameInput:
        """Compare the first batch of the baseline and of the optimized job, before timing anything.

        Raises
        ------
        AssertionError
            If the jobs do not see the same samples (labels or tokens differ).
        """
        check = same_input_check(self.baseline, self.optimized, self.job, self.acc)
        if not (check["labels_equal"] and check["tokens_equal"]):
            raise AssertionError(f"the jobs do not see the same samples: {check}")
        return SameInput(builtin=self.job.is_builtin, **check)


def choose(job, acc, params: Mapping[str, Any], results=None) -> EndToEndSetup:
    """Choose the optimized job of notebook 10 (section 1): from this run's verdicts or an explicit list.

    Parameters
    ----------
    job : helpers.jobs.base.Job
        The notebook's job (``ctx.job()``): the built-in PPO job or the user's.
    acc : helpers.device.Accelerator
    params : mapping
        The notebook's parameters (``optimizations``, ``job``, the workload, ``steps``, ...).
    results : pandas.DataFrame, optional
        This run's earlier records (:func:`helpers.results.load_results`); None or empty: no verdicts.

    Returns
    -------
    EndToEndSetup

    Raises
    ------
    helpers.errors.ParameterError
        If ``params["optimizations"]`` is invalid.
    """
    unavailable = {} if job.has_batched_pipeline else dict(_NOT_FOR_YOUR_JOB)
    # the image-size check of earlier verdicts is the built-in job's; for yours, a verdict must name the same job
    workload = Workload.from_params(params) if job.is_builtin else None
    # run alone (no verdict of the notebooks that decide an optimization in this run's results), "auto" measures
    # each optimization's stated device default instead of nothing; the ablation then shows what each gives here
    alone = not _has_source_verdicts(results)
    selection = select_optimizations(params["optimizations"], results, acc, workload=workload,
                                     unavailable=unavailable, job_spec=params["job"],
                                     device_defaults_for_missing=alone)
    return EndToEndSetup(job=job, acc=acc, params=dict(params), selection=selection, unavailable=unavailable,
                         results=results)


def _has_source_verdicts(results) -> bool:
    """Whether ``results`` holds a verdict of a notebook that decides an optimization (02-07)."""
    if results is None or not len(results) or "experiment" not in results.columns:
        return False
    v = verdicts(results)
    return bool(len(v) and v["notebook"].isin(set(source_notebooks().values())).any())


# --------------------------------------------------------------------------- 3: the run


@dataclass(frozen=True, eq=False)
class Ablation:
    """Section 5: the optimized job without each of its optimizations, against the baseline and against itself.

    Attributes
    ----------
    without : dict of str to Comparison
        Optimization -> baseline vs the optimized job without it.
    contributions : dict of str to Comparison
        Optimization -> without it vs the full optimized job (:func:`e2e_checks.contribution`).
    attributions : dict of str to Attribution
        Optimization -> its decision on the phases it acts on (:func:`e2e_checks.attribute`).
    frame : pandas.DataFrame
        :func:`e2e_checks.ablation_frame` of all three.
    earlier : dict
        Optimization -> (value, unit, notebook) of its notebook's verdict in this run.
    """

    without: Mapping[str, Comparison]
    contributions: Mapping[str, Comparison]
    attributions: Mapping[str, Any]
    frame: Any
    earlier: Mapping[str, tuple]


@dataclass(frozen=True, eq=False)
class EndToEndResult(ExperimentResult):
    """What notebook 10 measured: both jobs and their ceiling, the checks, the learning curves, the ablation.

    Attributes
    ----------
    setup : EndToEndSetup
    same_input : SameInput
    summaries : dict of str to JobSummary
        By job name: ``"baseline"``, ``"optimized"``, ``"without <name>"`` (the timed jobs, in rotation order).
    measurements : dict of str to helpers.timing.Measurement
        Step times of the same jobs and of ``"input-free ceiling"``, taken after the timing.
    full : Comparison
        Baseline vs optimized.
    ceiling : dict
        :func:`e2e_jobs.ceiling_fraction` of the optimized job.
    free_vs_base : Comparison
        Baseline vs the input-free ceiling.
    peak_rss_bytes : int or None
        On a CPU, the process's peak RSS after the timing (all jobs together).
    cross : tuple of helpers.experiments.crosscheck.CrossCheck
    not_compared : str
        Why the baseline was not compared with notebook 01's ("" when it was).
    curves : dict of str to list of float
        ``"baseline"`` and ``"optimized"`` loss per step, ``curve_steps`` long.
    learned : helpers.experiments.training.LearningCheck
    divergence : helpers.jobs.check.Divergence
    ablation : Ablation or None
    projection : Projection
    ran : dict or None
        :func:`helpers.conditions.ran_with` over the interleaved rotation (torch threads, batch): every job, the
        ceiling and the ablation's stepped with them; None where not stated.
    """

    setup: EndToEndSetup
    same_input: SameInput
    summaries: Mapping[str, JobSummary]
    measurements: Mapping[str, Any]
    full: Comparison
    ceiling: Mapping[str, Any]
    free_vs_base: Comparison
    peak_rss_bytes: int | None
    cross: tuple
    not_compared: str
    curves: Mapping[str, list]
    learned: LearningCheck
    divergence: Any
    ablation: Ablation | None
    projection: Projection
    ran: Mapping[str, Any] | None = None

    # -- what the sections print -----------------------------------------------------------------------------
    @property
    def baseline(self) -> JobSummary:
        return self.summaries["baseline"]

    @property
    def optimized(self) -> JobSummary:
        return self.summaries["optimized"]

    def summary_table(self):
        """The before/after table of the baseline and the optimized job (:func:`e2e_jobs.summary_frame`)."""
        return summary_frame([self.baseline, self.optimized]).round(1)

    def phase_totals(self):
        """Median seconds per phase of both jobs: index baseline, optimized; columns data, h2d, compute."""
        import pandas as pd

        return pd.DataFrame([{"data": s.data_s, "h2d": s.h2d_s, "compute": s.compute_s}
                             for s in (self.baseline, self.optimized)], index=["baseline", "optimized"])

    def timing_text(self) -> str:
        """Section 3's lines: throughput, the ceiling, the exposed input, and what h2d and memory are here."""
        P, acc, builtin = self.setup.params, self.setup.acc, self.setup.job.is_builtin
        b, o, full, ceiling, free = self.baseline, self.optimized, self.full, self.ceiling, self.free_vs_base
        lines = [f"note on 'h2d ms': {CPU_H2D_NOTE}"] if acc.is_cpu and builtin else []
        lines += [f"throughput: {b.throughput:.0f} -> {o.throughput:.0f} samples/s = {full.ratio:.2f}x "
                  f"(95% CI {full.ci_low:.2f}-{full.ci_high:.2f}, {full.a.repeats} steps each)",
                  f"input-free ceiling (the optimized step on batches already on the device): "
                  f"{P['batch_size'] / self.measurements['input-free ceiling'].median_s:.0f} samples/s; the optimized "
                  f"job runs at {ceiling['fraction']:.0%} of it (95% CI {ceiling['ci_low']:.0%}-"
                  f"{min(ceiling['ci_high'], 1.0):.0%}); with free input the job would be {free.ratio:.2f}x the "
                  f"baseline (95% CI {free.ci_low:.2f}-{free.ci_high:.2f})",
                  f"exposed input: {b.exposed_fraction:.0%} -> {o.exposed_fraction:.0%} of the step; "
                  f"compute share of the step: {b.utilization:.0%} -> {o.utilization:.0%}"]
        if not acc.is_cpu:
            return "\n".join([*lines, f"peak device memory: baseline {(b.peak_memory_bytes or 0) / 2**20:.0f} MiB, "
                                      f"optimized {(o.peak_memory_bytes or 0) / 2**20:.0f} MiB"])
        h2d = f"h2d {b.h2d_s * 1e3:.1f} -> {o.h2d_s * 1e3:.1f} ms: on the CPU nothing is copied; "
        lines.append(h2d + ("the optimized job's h2d is to_device_batch's conversion and normalization (uint8 NHWC -> "
                            "float NCHW), which the baseline does on the host in its data phase" if builtin else
                            "h2d is your job's to_device (with channels_last, the reorder to NHWC)"))
        peak = self.peak_rss_bytes
        lines.append("on a CPU the 'device' is the same processor that prepares the input: the compute share is the "
                     "part of the step spent in the training computation, not an accelerator's utilization; peak "
                     "memory per job cannot be separated, hence 'n/a on CPU' in the table (process peak RSS "
                     f"{peak / 2**20:.0f} MiB for all jobs together)" if peak else
                     "on a CPU the compute share is the part of the step spent in the training computation")
        return "\n".join(lines)

    def cross_check_text(self) -> str:
        """One line per cross-check (ok / FAILED), and why notebook 01 was not compared, if it was not."""
        lines = [f"{'ok' if c.ok else 'FAILED'}: {c.sentence}" for c in self.cross]
        if self.not_compared:
            lines.append(f"not compared with notebook 01: {self.not_compared}")
        return "\n".join(lines)

    def learning_sentence(self) -> str:
        """Where a loss diverged, or the learning check's sentence."""
        return self.divergence.sentence() if self.divergence.diverged else self.learned.sentence()

    def learning_title(self) -> str:
        """The learning curves' title."""
        what = "Value loss" if self.setup.job.is_builtin else "Loss"
        return f"{what} on identical batches ({self.learned.percent()} apart over the last {self.learned.tail} steps)"

    def ablation_text(self) -> str:
        """Section 5's lines: each optimization's attribution, then the compute-side reconciliations (or why the
        ablation was skipped)."""
        if self.ablation is None:
            P, n = self.setup.params, len(self.setup.optimized.optimizations)
            return "ablation skipped: " + ("ablation=False" if not P["ablation"] else
                                           f"the optimized job has {n} optimization(s)")
        a = self.ablation
        lines = [a.attributions[name].sentence() for name in self.setup.optimized.optimizations]
        return "\n".join(lines + compute_side_lines(a.frame, self.summaries, a.earlier))

    def ablation_table(self):
        """The ablation's table without the decision and note columns, rounded (None without an ablation)."""
        return self.ablation.frame.drop(columns=["decision", "note"]).round(2) if self.ablation is not None else None

    def in_short(self) -> str:
        """The "In short:" lines under the verdict."""
        P, b, o, full = self.setup.params, self.baseline, self.optimized, self.full
        thr, opt = P["host_bound_threshold"], self.setup.optimized
        lines = [f"- speedup {full.ratio:.2f}x (95% CI {full.ci_low:.2f}-{full.ci_high:.2f}); exposed input "
                 f"{b.exposed_fraction:.0%} -> {o.exposed_fraction:.0%} of the median step (threshold {thr:.0%}): "
                 f"the optimized job is {bottleneck.classify(o.exposed_fraction, thr).label}",
                 "- " + next_step(o, is_cpu=self.setup.acc.is_cpu, enabled=opt.optimizations,
                                  host_bound_threshold=thr)]
        if self.ablation is not None:
            abl = self.ablation.frame
            for name in opt.optimizations:
                r = abl.loc[f"without {name}"]
                plural = "s" if "+" in r["phases"] else ""
                lines.append(f"- {name}: {r['decision']} (on its {r['phases']} phase{plural})"
                             + (f"; {r['note']}" if r["note"] else ""))
            idle = [n for n in self.recommended if abl.loc[f"without {n}", "decision"] != "keep it"]
            if idle:
                lines.append(f"- recommended by their notebooks but no measurable gain in this end-to-end job: "
                             f"{', '.join(idle)}")
        if self.batch_note:
            lines.append(f"- {self.batch_note}")
        return "\n".join(["In short:", *lines])

    def change_text(self) -> str:
        """Section 8, "the change in your code": the optimized job's changes as a diff of a plain training loop
        (:func:`helpers.tune.loop_diff.change_as_code`, tune's own rewriter), with the speedup measured above; for
        a user's job, how to get the diff of their own script (``workbook tune``)."""
        opt, acc = self.setup.optimized, self.setup.acc
        kind = acc.kind if acc.kind in ("cuda", "npu") else "cpu"
        diff, notes = change_as_code(opt.optimizations, num_workers=opt.num_workers, amp_dtype=opt.amp_dtype,
                                     device_type=kind)
        full = self.full
        figure = f"{full.ratio:.2f}x (95% CI {full.ci_low:.2f}-{full.ci_high:.2f})"
        measured = (f"measured above at {figure} on this {acc.kind}" if full.ci_low > 1.0 else
                    f"measured above at {figure} on this {acc.kind}, an interval that does not show a gain here"
                    if full.ci_high >= 1.0 else f"measured above at {figure} on this {acc.kind}: slower here")
        head = f"The optimized job's changes, written into the training loop every PyTorch script has; {measured}:"
        if not opt.optimizations:
            head = "The optimized job has no optimization switched on here, so there is no change to write."
        elif not diff:
            head = "The optimized job's changes are not one-line edits of a training loop:"
        lines = [head]
        if diff:
            lines += ["", diff.rstrip()]
        lines += [f"- {n}" for n in notes]
        if not self.setup.job.is_builtin:
            lines.append("- your job's loader and model are built by the workbook's adapter here; for the diff of your "
                         "own training script, measured and proven on it: workbook tune -- python train.py ARGS "
                         "(docs/tune.md)")
        return "\n".join(lines)

    # -- the verdict -----------------------------------------------------------------------------------------
    @property
    def recommended(self) -> list[str]:
        """The enabled optimizations that a verdict of this run recommended."""
        return [c.name for c in self.setup.selection.choices if c.enabled and c.source == "verdict"]

    @property
    def batch_note(self) -> str:
        """:func:`e2e_verdict.batch_size_note` of this run's results."""
        return batch_size_note(self.setup.results, self.setup.params["batch_size"])

    def context(self) -> str:
        """What was measured, in one sentence (the verdict's ``context``)."""
        P, job, acc = self.setup.params, self.setup.job, self.setup.acc
        what = (f"PPO on a multimodal policy ({P['model_width']}-channel conv stem, d_model {P['d_model']}), batch "
                f"{P['batch_size']} of {P['image_size']} px crops from {job.item_count()} images, seed {P['seed']}; "
                f"baseline = notebook 01's loader (per-image Pillow decode, no workers, fp32 NCHW)" if job.is_builtin
                else f"your job {job.summary()}; baseline = its own loader (no workers, fp32)")
        return (f"{what}; optimized = {self.setup.optimized.label()}"
                f"; {P['steps']} measured steps per job after {P['warmup_steps']} warm-up, interleaved in blocks of "
                f"{BLOCK} on {acc.kind} ({acc.name}); learning over {P['curve_steps']} steps; projection "
                f"{self.projection.sentence()}")

    def verdict(self):
        """Notebook 10's verdict (:func:`e2e_verdict.e2e_verdict`), inconclusive where a cross-check failed."""
        P = self.setup.params
        v = e2e_verdict(self.full, self.learned, self.baseline, self.setup.optimized,
                        host_bound_threshold=P["host_bound_threshold"], optimized_summary=self.optimized,
                        ablation=self.ablation.frame if self.ablation is not None else None,
                        is_cpu=self.setup.acc.is_cpu, recommended=self.recommended, batch_note=self.batch_note,
                        context=self.context(), missing=self.setup.selection.missing, ceiling=self.ceiling,
                        divergence=self.divergence)
        return crosscheck.apply(v, self.cross)  # a failed cross-check makes it inconclusive

    # -- the records -----------------------------------------------------------------------------------------
    def records(self) -> Records:
        """Every record of notebook 10, in the notebook's order: the same input, the step times and exposed input
        of each job, the speedup, the ceiling, the device memory (not on a CPU), the cross-checks, the learning
        check, the ablation and the projection (hours); each timed job and comparison with the torch threads and
        batch it ran with (:func:`helpers.conditions.sides`)."""
        r, ran, alike = Records(), self.ran or {}, sides(self.ran, self.ran)
        s = self.same_input
        r.add("same input", "first batch", "mean_abs_pixel_difference", s.mean_abs_levels, "levels",
              max_abs_levels=s.max_abs_levels)
        for name, summary in self.summaries.items():
            r.add_measurement("step time", name, self.measurements[name], metric="time_per_step", unit="s",
                              rate_metric="throughput", rate_unit="samples/s", optimizations=summary.optimizations,
                              **ran)
            r.add("exposed input", name, "exposed_input_fraction", summary.exposed_fraction, "fraction",
                  definition="(median data + median h2d) / sum of the phase medians")
        r.add_comparison("throughput", self.full, metric="speedup", unit="x",
                         optimizations=self.setup.optimized.label(), **alike)
        r.add_measurement("step time", "input-free ceiling", self.measurements["input-free ceiling"],
                          metric="time_per_step", unit="s", rate_metric="throughput", rate_unit="samples/s", **ran)
        c = self.ceiling
        r.add("input-free ceiling", "optimized / ceiling", "ceiling_fraction", c["fraction"], "fraction",
              repeats=c["comparison"].a.repeats, spread={"ci_low": c["ci_low"], "ci_high": c["ci_high"]}, **alike)
        if not self.setup.acc.is_cpu:
            for job in (self.baseline, self.optimized):
                if job.peak_memory_bytes:
                    r.add("memory", job.name, "peak_memory", job.peak_memory_bytes, "bytes")
        for check in self.cross:
            r.add("cross-check", check.name, "passed", float(check.ok), "bool", sentence=check.sentence,
                  figures=check.figures)
        self._learning_records(r)
        self._ablation_records(r)
        self._projection_records(r)
        opt = self.setup.optimized
        diff, notes = change_as_code(opt.optimizations, num_workers=opt.num_workers, amp_dtype=opt.amp_dtype,
                                     device_type=self.setup.acc.kind if self.setup.acc.kind in ("cuda", "npu")
                                     else "cpu")
        r.add("change in code", "optimized", "lines_changed",
              float(sum(1 for ln in diff.splitlines() if ln[:1] in "+-" and ln[:3] not in ("+++", "---"))), "lines",
              diff=diff, notes=notes, text=self.change_text())
        return r

    def _learning_records(self, r: Records) -> None:
        learned, P = self.learned, self.setup.params
        r.add("learning", "optimized vs baseline", "value_loss_relative_difference",
              learned.rel_diff if learned.no_nan else None, "fraction", tolerance=P["loss_rtol"],
              steps=P["curve_steps"], tail_steps=learned.tail, no_nan=learned.no_nan, ok=learned.ok)

    def _ablation_records(self, r: Records) -> None:
        if self.ablation is None:
            return
        a, alike = self.ablation, sides(self.ran, self.ran)
        for name, c in a.without.items():
            at = a.attributions[name]
            r.add_comparison("ablation", c, metric="speedup", unit="x", removed=name, **alike)
            r.add_comparison("ablation contribution", a.contributions[name], metric="contribution", unit="x",
                             optimization=name, decision=at.decision, note=at.note, **alike)
            if at.phase is not None:
                r.add_comparison("ablation phase contribution", at.phase, metric="contribution", unit="x",
                                 optimization=name, phases=list(at.phases), decision=at.decision, **alike)

    def _projection_records(self, r: Records) -> None:
        proj = self.projection
        r.add("projection", "before", "duration", proj.before_s / 3600, "h", steps=proj.steps,
              spread={"p25": proj.before_range_s[0] / 3600, "p75": proj.before_range_s[1] / 3600},
              spread_meaning="baseline step-time quartiles, hours")
        after_hi = proj.after_range_s[1] / 3600
        r.add("projection", "after", "duration", proj.after_s / 3600, "h", steps=proj.steps,
              spread={"ci_low": proj.after_range_s[0] / 3600, **({"ci_high": after_hi} if after_hi < float("inf")
                                                                 else {})},
              spread_meaning="at the speedup's 95% interval, hours")

    # -- the "try it" panel ----------------------------------------------------------------------------------
    def try_it(self, acc, params: Mapping[str, Any]) -> TrySpec:
        """The "try it" panel: the baseline against a job with the optimizations ticked, timed as in section 3.

        Each optimization this job can use is a switch starting where this notebook's selection set it (fixed,
        with one choice, where this device has nothing for it to act on: pinned memory and the prefetcher on a
        CPU); ``steps`` (measured steps per job) starts at ``min(steps, 5)``, at least 2.

        Returns
        -------
        helpers.live.TrySpec
            Measured by :func:`try_optimizations`, beside this notebook's optimized job (:func:`live_point`).
        """
        setup, sel = self.setup, self.setup.selection
        caps = acc.capabilities
        idle_here = {"pinned_memory": not caps.pinned_memory.available, "prefetcher": not caps.streams.available}
        knobs: dict[str, Any] = {}
        for c in sel.choices:
            if c.name in setup.unavailable:
                continue
            knobs[c.name] = (Knob(((f"{'on' if c.enabled else 'off'} (nothing to act on here)", c.enabled),),
                                  c.enabled, c.name) if idle_here.get(c.name) else c.enabled)  # a bool: a checkbox
        first, top = max(2, min(int(params["steps"]), 5)), max(int(params["steps"]), 50)
        counts = sorted(n for n in {2, 5, 10, 20, 50, first, int(params["steps"]), top} if 2 <= n <= top)
        knobs["steps"] = Knob(tuple((str(n), n) for n in counts), first, "steps")

        def measure(progress, steps, **on):
            return try_optimizations(setup.job, acc, steps=steps, warmup_steps=min(params["warmup_steps"], 1),
                                     num_workers=sel.num_workers, amp_dtype=sel.amp_dtype, seed=params["seed"],
                                     unavailable=setup.unavailable, progress=progress, **on)

        return TrySpec("speedup over the baseline with the optimizations you pick", measure, knobs,
                       reference=live_point(self.full, setup.optimized, baseline=self.baseline,
                                            optimized=self.optimized))


def run(setup: EndToEndSetup, same_input: SameInput | None = None, *, progress: Progress | None = None
        ) -> EndToEndResult:
    """Time the baseline, the optimized job, its ceiling and the ablation's jobs; check, learn and project.

    After each job's warm-up the jobs take turns in blocks of :data:`BLOCK` steps, the order reversed every
    round (:func:`e2e_jobs.run_interleaved`); then the cross-checks, the learning check (both jobs keep training,
    untimed, up to ``curve_steps``), the ablation (``ablation`` and at least two optimizations) and the
    projection of ``projection_steps`` steps. Every job is closed before it returns.

    Parameters
    ----------
    setup : EndToEndSetup
        :func:`choose`'s.
    same_input : SameInput, optional
        :meth:`EndToEndSetup.check_same_input` (run here when None).
    progress : callable, optional
        ``progress(done, total)`` after every interleaved step (:meth:`EndToEndSetup.timed_steps` in all).

    Returns
    -------
    EndToEndResult

    Raises
    ------
    AssertionError
        If the jobs do not see the same samples.
    helpers.errors.ParameterError
        For counts :func:`e2e_jobs.run_interleaved` rejects.
    """
    same_input = same_input if same_input is not None else setup.check_same_input()
    P, job, acc = setup.params, setup.job, setup.acc
    built: list[JobVariant] = []
    try:
        for cfg in [setup.baseline, setup.optimized, *setup.variants()]:
            built.append(JobVariant(cfg, job, acc))
        jobs = {v.config.name: v for v in built}
        # the optimized step on batches already on the device: the input-free ceiling, in the same rotation
        built.append(JobVariant(replace(setup.optimized, name="input-free ceiling"), job, acc, input_free=True))
        ran = ran_with(job.workload.batch_size)  # read as the rotation starts, held to its end
        run_interleaved(built, steps=P["steps"], warmup_steps=P["warmup_steps"], block=BLOCK, progress=progress)
        ran = held(ran)
        timed = _timed(jobs, built[-1], P["seed"], acc)
        earlier_phases, not_compared = earlier_baseline_phases(setup.results, Workload.from_params(P), P)
        cross = cross_checks(jobs["baseline"], jobs["optimized"], timed["full"], earlier_phases=earlier_phases,
                             seed=P["seed"])
        learned = _learning(jobs["baseline"], jobs["optimized"], P, job.is_builtin)
        ablation = _ablation(jobs, timed["full"], setup)
    finally:
        for v in built:
            v.close()
    return EndToEndResult(setup=setup, same_input=same_input, **timed, cross=tuple(cross), not_compared=not_compared,
                          **learned, ablation=ablation,
                          projection=project(P["projection_steps"], timed["measurements"]["baseline"], timed["full"]),
                          ran=ran)


def _timed(jobs: Mapping[str, JobVariant], ceiling_job: JobVariant, seed: int, acc) -> dict[str, Any]:
    """The summaries, step times, speedup and ceiling right after the rotation (before any untimed step)."""
    measurements = {name: j.measurement() for name, j in jobs.items()}
    measurements["input-free ceiling"] = ceiling_job.measurement()
    base, opt = jobs["baseline"], jobs["optimized"]
    return {"summaries": {name: summarize(j) for name, j in jobs.items()}, "measurements": measurements,
            "full": speedup(base, opt, seed=seed), "ceiling": ceiling_fraction(opt, ceiling_job, seed=seed),
            "free_vs_base": speedup(base, ceiling_job, seed=seed),
            "peak_rss_bytes": acc.memory_stats().get("peak_rss_bytes") if acc.is_cpu else None}


def _learning(base: JobVariant, opt: JobVariant, P: Mapping[str, Any], builtin: bool) -> dict[str, Any]:
    """Both jobs trained (untimed) up to ``curve_steps``; their loss curves, the learning check, the divergence."""
    for job in (base, opt):
        missing = P["curve_steps"] - len(job.measured)
        if missing > 0:
            job.run(missing, measured=False)
    loss_col = "value_loss" if builtin else "loss"  # the PPO value loss; a user's job's own loss
    curves = {name: job.steps_frame(measured_only=False)[loss_col].tolist()[: P["curve_steps"]]
              for name, job in (("baseline", base), ("optimized", opt))}
    learned = learning_check(curves["baseline"], curves["optimized"], P["loss_rtol"],
                             loss_name="value loss" if builtin else "loss")
    divergence = loop_divergence({"the baseline": base, "the optimized job": opt},  # from the steps' losses,
                                 baseline="the baseline")                           # after the runs
    return {"curves": curves, "learned": learned, "divergence": divergence}


def _ablation(jobs: Mapping[str, JobVariant], full: Comparison, setup: EndToEndSetup) -> Ablation | None:
    """Section 5 from the timed variants (None when there are none)."""
    if not setup.variants():
        return None
    seed, names = setup.params["seed"], setup.optimized.optimizations
    base, opt = jobs["baseline"], jobs["optimized"]
    without = {o: speedup(base, jobs[f"without {o}"], seed=seed) for o in names}
    contrib = {o: contribution(opt, jobs[f"without {o}"], seed=seed) for o in names}
    attrib = {o: attribute(o, opt.steps_frame(), jobs[f"without {o}"].steps_frame(), seed=seed) for o in names}
    earlier = {}
    if setup.results is not None and len(setup.results):
        vt = verdicts(setup.results).set_index("notebook")
        earlier = {o: (vt.loc[nb, "value"], vt.loc[nb, "unit"], nb) for o, nb in source_notebooks().items()
                   if nb in vt.index}
    return Ablation(without=without, contributions=contrib, attributions=attrib,
                    frame=ablation_frame(full, without, contrib, attrib), earlier=earlier)


# -- the notebook's declaration, found by helpers.experiments.registry ------------------------------------

EXPERIMENT = Experiment(
    item=Item("10", "10_end_to_end", "end to end",
         "Prove the speedup end to end: the same training job before and after",
         "The baseline job vs the same job with every optimization the earlier verdicts recommend"),
    spec=specs.COMMON + specs.DATA + specs.batch() + specs.training(
        "measured training steps per job") + (
        Param("optimizations", list, ["auto"],
              "optimizations of the optimized job: auto follows the earlier verdicts of this run; or names "
              "of the optimizations the earlier notebooks decide (an unknown name is rejected with the list)",
              item_kind=str),
        Param("ablation", bool, True, "also run the optimized job with each optimization removed in turn"),
        Param("curve_steps", int, 30, "training steps of the learning curves of both jobs", minimum=2,
              maximum=100000),
        Param("loss_rtol", float, 0.10,
              "tolerance of optimized vs baseline mean loss over the last steps, as a share of the loss's scale over the run",
              minimum=0.0, maximum=10.0),
        Param("projection_steps", int, 100000, "training steps of the projected full job (before vs after)",
              minimum=1, maximum=10**12),
        Param("host_bound_threshold", float, 0.10,
              "exposed input time / step time above which the job is called host-bound", minimum=0.0, maximum=1.0),
    ) + specs.JOB,
    interleaved_repeats="steps",
)
