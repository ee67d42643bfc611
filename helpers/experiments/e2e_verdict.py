"""Notebook 10's verdict: the speedup, the learning check, the exposed input, the ablation and the next step.

:func:`e2e_verdict` decides "enable" when the optimized job is reliably faster than the baseline and still
computes the same (the learning check), and words its reason from the phase breakdowns (:func:`next_step`), the
ablation, notebook 09's batch size (:func:`batch_size_note`) and the review's target (:func:`target_sentence`).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from helpers import bottleneck, checklist
from helpers.experiments.e2e_jobs import PHASES, JobConfig, JobSummary
from helpers.experiments.e2e_select import action_value, source_notebooks
from helpers.experiments.training import LearningCheck
from helpers.results import verdicts
from helpers.verdict import Verdict

#: The review's target for the end-to-end job (project brief): optimized throughput >= 2.5x the baseline's,
#: on a baseline whose input is exposed for >= 70% of the step.
TARGET_SPEEDUP = 2.5
TARGET_BASELINE_EXPOSED = 0.70


def next_step(summary: JobSummary, *, is_cpu: bool, enabled: Sequence[str], host_bound_threshold: float) -> str:
    """What to try next on a job, from its phase breakdown (which phase dominates now).

    Parameters
    ----------
    summary : JobSummary
        The job (normally the optimized one).
    is_cpu : bool
        Whether the device is the CPU that also prepares the input.
    enabled : sequence of str
        Optimizations already on in the job.
    host_bound_threshold : float
        Exposed-input share above which the job is host-bound.

    Returns
    -------
    str
        One sentence: the phases' shares of the median step and the next
        lever for the dominant one (or for the exposed input when the job is
        host-bound).
    """
    total = summary.data_s + summary.h2d_s + summary.compute_s
    if total <= 0:
        return "no phase time was measured"
    shares = {p: getattr(summary, f"{p}_s") / total for p in PHASES}
    top = max(shares, key=shares.get)
    parts = ", ".join(f"{p} {getattr(summary, f'{p}_s') * 1e3:.1f} ms ({shares[p]:.0%}"
                      f"{': conversion and normalization on the CPU, not a copy' if is_cpu and p == 'h2d' else ''})"
                      for p in PHASES)
    host_bound = summary.exposed_fraction > host_bound_threshold
    if host_bound:
        input_top = "data" if shares["data"] >= shares["h2d"] else "h2d"
        if input_top == "h2d" and is_cpu:
            lever = ("on a CPU the h2d phase is the batch's conversion and normalization: convert fewer bytes "
                     "(smaller crops) or fold the normalization into the model's first layer")
        elif input_top == "h2d":
            todo = [o for o in ("pinned_memory", "prefetcher") if o not in enabled]
            lever = (f"hide the copy ({' and '.join(todo)}, notebooks 04-05)" if todo else
                     "the copy is already pinned and prefetched: send smaller batches (uint8 images, "
                     "normalize on the device)")
        elif is_cpu and "dataset_cache" in enabled:
            lever = ("on a CPU the input shares the cores with the computation and cannot overlap for free; "
                     "nothing is decoded any more (the decode-once cache), so what is left is the crop, resize "
                     "and tokenization per batch: smaller crops, fewer augmentations per step, or a machine with "
                     "idle cores for workers (notebook 03)")
        elif is_cpu:
            lever = ("on a CPU the input shares the cores with the computation and cannot overlap for free, "
                     "so make it cheaper: decode once (notebook 02's dataset cache) or store the images "
                     "pre-resized near the crop size; workers help only with idle cores (notebook 03)")
        else:
            todo = [o for o in ("dataloader_workers", "prefetcher") if o not in enabled]
            lever = (f"overlap the input with compute ({' and '.join(todo)}, notebooks 03 and 05)" if todo else
                     "more DataLoader workers or cheaper decoding (images stored near the crop size)")
        return (f"the median step is {parts}; {top} is the largest phase and the input is still exposed, "
                f"so next: {lever}")
    if top == "compute":
        todo = [o for o in ("mixed_precision", "channels_last") if o not in enabled]
        lever = (f"try {' and '.join(todo)} (notebooks 06-07)" if todo else
                 "a larger batch per step (notebook 09) or a smaller model; the input side no longer limits it")
        return f"the median step is {parts}; compute dominates, so next: {lever}"
    return f"the median step is {parts}; {top} dominates"


#: The notebook that decides the batch size (its verdict's action is on ``batch_size``).
_BATCH_NOTEBOOK = "09_memory_and_batch_size"


def target_sentence(speedup: float, baseline_exposed: float) -> str:
    """Whether the end-to-end target applied and was met, saying which condition decided it.

    The target (:data:`TARGET_SPEEDUP` on a baseline exposed for at least :data:`TARGET_BASELINE_EXPOSED` of
    its step) only applies to a host-bound enough baseline: below that share, no input fix can give the
    target speedup, and the sentence says the target does not apply instead of calling the speedup a failure.
    """
    if baseline_exposed < TARGET_BASELINE_EXPOSED:
        return (f"the target of >= {TARGET_SPEEDUP:g}x applies to a baseline whose input is exposed for >= "
                f"{TARGET_BASELINE_EXPOSED:.0%} of the step; this baseline's was {baseline_exposed:.0%}, so it does "
                f"not apply here ({speedup:.2f}x measured)")
    word = "met" if speedup >= TARGET_SPEEDUP else "not met"
    return (f"target >= {TARGET_SPEEDUP:g}x on a baseline exposed >= {TARGET_BASELINE_EXPOSED:.0%}: {word} "
            f"({speedup:.2f}x, baseline exposed {baseline_exposed:.0%})")


def batch_size_note(results, batch_size: int) -> str:
    """Say that notebook 09's recommended batch is not part of this job, when it differs from ``batch_size``.

    Parameters
    ----------
    results : pandas.DataFrame or None
        This run's records (:func:`helpers.results.load_results`).
    batch_size : int
        This job's batch size.

    Returns
    -------
    str
        Empty when no verdict of this run decides ``batch_size`` (notebook 09's action), it did not
        recommend a change, or it recommended this very batch size. The recommended batch is the action's
        value (for a verdict recorded without an action, ``extra["best_throughput_batch"]``).
    """
    if results is None or not len(results):
        return ""
    table = verdicts(results)
    source, best = None, None
    for _, row in (table.iterrows() if len(table) else ()):
        if action_value(row, "batch_size") is not None or row.get("notebook") == _BATCH_NOTEBOOK:
            source, best = row, action_value(row, "batch_size")
    if source is None or str(source.get("recommendation")) != "enable":
        return ""
    if best is None:
        extra = source.get("extra") if isinstance(source.get("extra"), Mapping) else {}
        best = extra.get("best_throughput_batch", source.get("value"))
    try:
        best = int(best)
    except (TypeError, ValueError):
        return ""
    if best == int(batch_size):
        return ""
    number = str(source.get("notebook"))[:2]
    return (f"notebook {number} recommended batch {best}, which is not part of this job: it keeps batch_size "
            f"{int(batch_size)} (notebook 01's workload), so the speedup above does not include it; pass "
            f"batch_size={best} to measure it here")


def e2e_verdict(comparison, learning: LearningCheck, baseline: JobSummary, optimized: JobConfig, *,
                host_bound_threshold: float, optimized_summary: JobSummary | None = None,
                ablation=None, is_cpu: bool = True, recommended: Sequence[str] = (),
                batch_note: str = "", context: str | None = None,
                missing: Sequence[str] = (), ceiling: Mapping[str, Any] | None = None,
                divergence: Any = None) -> Verdict:
    """Decide the end-to-end verdict from the speedup, the learning check and the exposed input.

    "enable" when the interval's lower bound is above 1 (faster for sure) and
    the numerical-agreement check passed; "leave off" when the check failed or
    the whole interval lies below 1 (slower for sure); "inconclusive" when the
    interval spans 1 (e.g. 0.40-10.19x: it may be slower or faster, so neither
    "enable" nor "leave off" follows from it). The reason says what decided
    it, and also whether the baseline and the
    optimized job are host-bound (and, for the optimized job, the next step
    from :func:`next_step`), which optimizations the ablation says to drop,
    and whether the target (:data:`TARGET_SPEEDUP` on a baseline exposed for
    at least :data:`TARGET_BASELINE_EXPOSED`) was met.

    Parameters
    ----------
    comparison : helpers.timing.Comparison
        Baseline vs optimized.
    learning : LearningCheck
    baseline : JobSummary
    optimized : JobConfig
    host_bound_threshold : float
    optimized_summary : JobSummary, optional
        The optimized job's summary (adds its host-bound state and the next step).
    ablation : pandas.DataFrame, optional
        :func:`ablation_frame` with contributions (adds the drop/no-effect decisions).
    is_cpu : bool
        Whether the device is a CPU (for the next step's advice).
    recommended : sequence of str
        Optimizations enabled because their notebook recommended them (named
        as such when the ablation finds no measurable contribution).
    batch_note : str
        :func:`batch_size_note`, appended when non-empty.
    context : str, optional
        What was measured, in one sentence.
    missing : sequence of str
        Notebooks whose verdict this run lacked (their optimizations used the device defaults).
    ceiling : mapping, optional
        :func:`ceiling_fraction` of the optimized job against its input-free ceiling: the reason says the
        fraction with its interval, and ``extra["ceiling"]`` keeps ``fraction``, ``ci_low``, ``ci_high`` and
        ``free_input_speedup``.
    divergence : helpers.jobs.check.Divergence, optional
        Where each job's loss became NaN or infinite (:func:`helpers.jobs.check.loop_divergence` of the jobs,
        the baseline named): when the baseline diverges too, the job diverges, and the verdict is
        "inconclusive" saying so instead of blaming an optimization; when only optimized jobs do, "leave
        off" with the step. Kept in ``extra["divergence"]``.

    Returns
    -------
    helpers.verdict.Verdict
        Notebook 10's: metric ``speedup`` (x, optimized throughput over the baseline's) with its 95% interval;
        ``extra``: ``optimizations``, ``baseline_exposed_fraction``, ``loss_rtol``, ``learning_ok``,
        ``missing_verdicts``, ``ablation`` (optimization -> ``decision``, ``contribution``, ``ci_low``,
        ``ci_high`` of the whole step, ``phases``, ``phase_contribution``, ``phase_low``, ``phase_high`` where it
        acts (what the decision rests on), ``source`` notebook; empty without an ablation). It decides no single setting, so it carries
        no action.
    """
    recommendation, reason = _decide(comparison, learning, baseline, optimized, host_bound_threshold=host_bound_threshold,
                                     optimized_summary=optimized_summary, ablation=ablation, is_cpu=is_cpu,
                                     recommended=recommended, batch_note=batch_note)
    extra_ceiling, extra_divergence = {}, {}
    if divergence is not None and divergence.diverged:  # a loss that is not finite decides before any speed figure
        speed = f"{comparison.ratio:.2f}x throughput (95% CI {comparison.ci_low:.2f}-{comparison.ci_high:.2f})"
        if divergence.baseline_diverged:
            recommendation = "inconclusive"
            reason = f"{divergence.sentence()} (measured: {speed} with {optimized.label()})"
        else:
            recommendation, reason = "leave off", f"{speed} with {optimized.label()}, but {divergence.sentence()}"
        extra_divergence = {"divergence": divergence.as_dict()}
    if ceiling is not None and not extra_divergence:
        reason += (f"; the optimized job runs at {ceiling['fraction']:.0%} of its input-free ceiling (95% CI "
                   f"{ceiling['ci_low']:.0%}-{min(ceiling['ci_high'], 1.0):.0%}, a share at most 100%; the same "
                   "step on batches already on the device)")
        extra_ceiling = {"ceiling": {k: float(ceiling[k]) for k in ("fraction", "ci_low", "ci_high",
                                                                    "free_input_speedup")}}
    return Verdict(notebook=checklist.END_TO_END, metric="speedup", value=comparison.ratio, unit="x",
                   recommendation=recommendation, reason=reason, context=context,
                   repeats=min(comparison.a.repeats, comparison.b.repeats),
                   spread={"ci_low": comparison.ci_low, "ci_high": comparison.ci_high,
                           "confidence": comparison.confidence},
                   extra={"optimizations": list(optimized.optimizations),
                          "baseline_exposed_fraction": baseline.exposed_fraction, "loss_rtol": learning.tolerance,
                          "learning_ok": learning.ok, "missing_verdicts": list(missing),
                          "ablation": _ablation_evidence(ablation), **extra_ceiling, **extra_divergence,
                          "decision_threshold": 1.0})  # "enable" when the interval's lower bound is above 1


def _ablation_evidence(ablation) -> dict[str, dict[str, Any]]:
    """Optimization name -> its ablation decision and whole-step contribution (for the report's first screen)."""
    out: dict[str, dict[str, Any]] = {}
    if ablation is None or "decision" not in getattr(ablation, "columns", ()):
        return out
    for variant, row in ablation.iterrows():
        if variant == "all":
            continue
        name = str(variant).replace("without ", "")

        def num(key: str) -> float | None:
            x = row.get(key)
            return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None

        out[name] = {"decision": str(row["decision"]), "contribution": num("contribution"),
                     "ci_low": num("contribution_low"), "ci_high": num("contribution_high"),
                     "phases": str(row.get("phases") or ""), "phase_contribution": num("phase_contribution"),
                     "phase_low": num("phase_low"), "phase_high": num("phase_high"),
                     "source": source_notebooks().get(name, "")}
    return out


def _decide(comparison, learning: LearningCheck, baseline: JobSummary, optimized: JobConfig, *,
            host_bound_threshold: float, optimized_summary: JobSummary | None, ablation, is_cpu: bool,
            recommended: Sequence[str], batch_note: str) -> tuple[str, str]:
    """:func:`e2e_verdict`'s recommendation and reason."""
    def bound(frac: float) -> str:
        return bottleneck.classify(frac, host_bound_threshold).label

    tail = [f"the baseline was {bound(baseline.exposed_fraction)} (input {baseline.exposed_fraction:.0%} of the "
            f"median step, threshold {host_bound_threshold:.0%})"]
    if optimized_summary is not None and optimized.optimizations:
        o = optimized_summary
        if o.exposed_fraction > host_bound_threshold:
            state = "STILL host-bound" if bound(o.exposed_fraction) == bottleneck.HOST_BOUND else "balanced"
            tail.append(f"the optimized job is {state} (input {o.exposed_fraction:.0%} of the median step): "
                        + next_step(o, is_cpu=is_cpu, enabled=optimized.optimizations,
                                    host_bound_threshold=host_bound_threshold))
        else:
            tail.append(f"the optimized job is device-bound (input {o.exposed_fraction:.0%} of the median step): "
                        + next_step(o, is_cpu=is_cpu, enabled=optimized.optimizations,
                                    host_bound_threshold=host_bound_threshold))
    if ablation is not None and "decision" in getattr(ablation, "columns", ()):
        notes = []
        for variant, row in ablation.iterrows():
            if variant == "all" or row["decision"] in ("", "keep it"):
                continue
            name = str(variant).replace("without ", "")
            nb = source_notebooks().get(name, "??")
            who = f"recommended by notebook {nb[:2]}, but " if name in recommended else ""
            where = ""
            if "phase_contribution" in row and isinstance(row.get("phases"), str) and row["phases"] \
                    and math.isfinite(row["phase_contribution"]):
                where = (f"{row['phases']} phase {row['phase_contribution']:.2f}x, 95% CI {row['phase_low']:.2f}-"
                         f"{row['phase_high']:.2f}; ")
            what = ("no measurable contribution in this end-to-end job"
                    if row["decision"] == "no measurable contribution here" else row["decision"])
            notes.append(f"{name}: {who}{what} ({where}whole step {row['contribution']:.2f}x, 95% CI "
                         f"{row['contribution_low']:.2f}-{row['contribution_high']:.2f})")
        if notes:
            tail.append("ablation: " + "; ".join(notes))
    if batch_note:
        tail.append(batch_note)
    tail.append(target_sentence(comparison.ratio, baseline.exposed_fraction))
    rest = "; ".join(tail)
    opts = optimized.label()
    if not optimized.optimizations:
        return "not applicable", f"no optimization selected, so the optimized job is the baseline; {rest}"
    speed = f"{comparison.ratio:.2f}x throughput (95% CI {comparison.ci_low:.2f}-{comparison.ci_high:.2f})"
    if not learning.ok:
        return "leave off", f"{speed} with {opts}, but {learning.sentence()}; {rest}"
    if comparison.ci_low > 1.0:
        return "enable", f"{speed} with {opts}; {learning.sentence()}; {rest}"
    if comparison.ci_high < 1.0:
        return "leave off", f"reliably slower: {speed} with {opts}; {learning.sentence()}; {rest}"
    # the interval holds speedups below and above 1: no decision either way
    return "inconclusive", (f"not decided: {speed} with {opts} spans 1, so the optimized job may be slower or "
                            f"faster; more steps (`run --patience K`) or a quieter machine narrow the interval; "
                            f"{learning.sentence()}; {rest}")
