"""Notebook 10's checks of its comparison: what each optimization contributes, cross-checks, the projection.

- the ablation: each optimization decided on the step phases it acts on (:func:`attribute`; its phases are the
  optimization's ``acts_on``, :func:`helpers.experiments.registry.optimizations`), next to its contribution to
  the whole step (:func:`ablation_frame`) and, for the compute-side ones, to its own notebook's figure
  (:func:`compute_side_lines`);
- the cross-checks of the before/after comparison (:func:`cross_checks`, :mod:`helpers.experiments.crosscheck`);
- the projection of a long training run before and after (:func:`project`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import pandas as pd

from helpers import checklist
from helpers.errors import ParameterError
from helpers.experiments import registry
from helpers.experiments.e2e_jobs import PHASES, JobSummary
from helpers.jobs.base import Workload
from helpers.results import verdicts
from helpers.timing import Comparison, Measurement
from helpers.units import format_value, is_number

def __getattr__(name: str):
    """``ACTS_ON``: the registry's, read when asked for (the registry imports this module, so it cannot be read
    at import time)."""
    if name == "ACTS_ON":
        return registry.acts_on()  # where each optimization's effect must show
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def contribution_decision(c) -> str:
    """What to do with one optimization from its contribution interval (see :func:`contribution`).

    Returns
    -------
    str
        ``"keep it"`` when the interval lies entirely above 1, ``"drop it here"``
        when it lies entirely below 1 (removing it made the job measurably
        faster), ``"no measurable contribution here"`` when it includes 1.
    """
    if c.ci_low > 1.0:
        return "keep it"
    if c.ci_high < 1.0:
        return "drop it here"
    return "no measurable contribution here"


def phase_label(phases: Sequence[str]) -> str:
    """``("data", "h2d")`` -> ``"input (data+h2d)"``; ``("compute",)`` -> ``"compute"``; else ``"h2d+compute"``."""
    if tuple(phases) == ("data", "h2d"):
        return "input (data+h2d)"
    return "+".join(phases)


@dataclass(frozen=True)
class Attribution:
    """One optimization's contribution where it acts (its phases) and on the whole step.

    Attributes
    ----------
    name : str
    phases : tuple of str
        The phases it acts on (:func:`helpers.experiments.registry.acts_on`).
    phase : helpers.timing.Comparison or None
        Without it vs with it, on the per-step sum of ``phases`` (None when
        that sum's median is 0 with it, so no ratio exists).
    step : helpers.timing.Comparison
        Without it vs with it, on the whole step (:func:`contribution`).
    phase_ms : (float, float)
        Median per-step time of ``phases`` without it and with it, ms.
    decision : str
        ``"keep it"``, ``"drop it here"`` or ``"no measurable contribution here"``,
        decided on ``phase`` (see :func:`attribute`).
    note : str
        Why the step-level figure tells something else, or empty.
    """

    name: str
    phases: tuple[str, ...]
    phase: Any
    step: Any
    phase_ms: tuple[float, float]
    decision: str
    note: str = ""

    def sentence(self) -> str:
        """E.g. "channels_last: acts on the h2d+compute phases: 36.3 -> 36.6 ms, contribution 0.99x (95% CI
        0.95-1.03): no measurable contribution here; whole step 1.11x (95% CI 1.02-1.19); not attributable ..."."""
        ph = phase_label(self.phases)
        where = f"acts on the {ph} phase{'s' if '+' in ph else ''}"
        if self.phase is None:
            pc = f"{where}: {self.phase_ms[0]:.1f} -> {self.phase_ms[1]:.1f} ms (no ratio)"
        else:
            pc = (f"{where}: {self.phase_ms[0]:.1f} -> {self.phase_ms[1]:.1f} ms, contribution "
                  f"{self.phase.ratio:.2f}x (95% CI {self.phase.ci_low:.2f}-{self.phase.ci_high:.2f})")
        st = f"whole step {self.step.ratio:.2f}x (95% CI {self.step.ci_low:.2f}-{self.step.ci_high:.2f})"
        return f"{self.name}: {pc}: {self.decision}; {st}" + (f"; {self.note}" if self.note else "")


def _phase_measurement(steps, phases: Sequence[str], name: str):
    total = sum(steps[p] for p in phases)
    return Measurement(name=name, times_s=tuple(float(x) for x in total), warmup=0)


def attribute(name: str, optimized_steps, without_steps, *, seed: int = 0) -> Attribution:
    """Decide one optimization on the phases it acts on, and check the whole step against it.

    An optimization can only change the phases it acts on (:func:`helpers.experiments.registry.acts_on`);
    a step-level difference that shows up in another phase is noise or the
    rotation's side effects, not its doing. The decision therefore follows
    the contribution on its own phases (median per-step sum of those phases
    without it / with it, 95% bootstrap interval over the steps):

    - ``"keep it"``: that interval lies above 1, and the whole step is not
      measurably slower with it;
    - ``"drop it here"``: its phases are measurably slower with it, or they are
      faster but the whole step is measurably slower (it costs more elsewhere,
      e.g. worker processes taking cores from the computation on a CPU);
    - ``"no measurable contribution here"``: otherwise.

    When the whole-step interval excludes 1 but the decision does not say
    the same, ``note`` names the phase that changed most outside the acted-on
    ones ("not attributable here (the difference is in the data phase, which
    it does not touch)").

    Parameters
    ----------
    name : str
        One of :func:`helpers.experiments.registry.optimization_names`.
    optimized_steps, without_steps : pandas.DataFrame
        :meth:`helpers.experiments.e2e_jobs.JobVariant.steps_frame` of the full optimized job and of the job
        without ``name``: per measured step, the columns ``data``, ``h2d``,
        ``compute`` and ``step_s`` (seconds).
    seed : int
        Bootstrap seed.

    Returns
    -------
    Attribution

    Raises
    ------
    ParameterError
        Unknown ``name``, or a frame lacking a phase column.
    """

    acts_on = registry.acts_on()
    if name not in acts_on:
        raise ParameterError(f"unknown optimization {name!r}; valid: {', '.join(acts_on)}")
    for label, df in (("optimized_steps", optimized_steps), ("without_steps", without_steps)):
        absent = [c for c in (*PHASES, "step_s") if c not in df]
        if absent:
            raise ParameterError(f"{label} lacks column(s) {absent}; pass JobVariant.steps_frame()")
    phases = acts_on[name]
    step = Comparison.from_measurements(
        Measurement(f"without {name}", tuple(float(x) for x in without_steps["step_s"]), 0),
        Measurement("optimized", tuple(float(x) for x in optimized_steps["step_s"]), 0), seed=seed)
    wo = _phase_measurement(without_steps, phases, f"without {name}")
    op = _phase_measurement(optimized_steps, phases, "optimized")
    phase = Comparison.from_measurements(wo, op, seed=seed) if op.median_s > 0 else None
    step_decision = contribution_decision(step)
    if phase is None:
        decision = "no measurable contribution here"
    elif phase.ci_high < 1.0:
        decision = "drop it here"
    elif phase.ci_low > 1.0:
        decision = "drop it here" if step.ci_high < 1.0 else "keep it"
    else:
        decision = "no measurable contribution here"
    others = [p for p in PHASES if p not in phases]
    diffs = {p: float(optimized_steps[p].median() - without_steps[p].median()) for p in others}
    top = max(diffs, key=lambda p: abs(diffs[p])) if diffs else "other"
    d_ms = diffs.get(top, math.nan) * 1e3
    note = ""
    if phase is not None and phase.ci_low > 1.0 and step.ci_high < 1.0:
        note = (f"its own phases are faster but the whole step is slower: the difference is in the {top} phase "
                f"({d_ms:+.1f} ms per step with it)")
    elif step_decision != "no measurable contribution here" and step_decision != decision:
        note = (f"the step-level change is not attributable here (the difference is in the {top} phase, "
                f"{d_ms:+.1f} ms per step with it, which it does not touch)")
    return Attribution(name=name, phases=tuple(phases), phase=phase, step=step,
                       phase_ms=(wo.median_s * 1e3, op.median_s * 1e3), decision=decision, note=note)


def ablation_frame(full, without: Mapping[str, Any], contributions: Mapping[str, Any] | None = None,
                   attributions: Mapping[str, Attribution] | None = None):
    """Speedup of each ablated job vs the baseline and the contribution of each optimization.

    Parameters
    ----------
    full : helpers.timing.Comparison
        Baseline vs the full optimized job.
    without : mapping of str to Comparison
        Optimization name -> baseline vs the optimized job without it.
    contributions : mapping of str to Comparison, optional
        Optimization name -> :func:`contribution` (without it vs the full
        optimized job). When given, the contribution's interval and the
        decision come from it; otherwise the contribution is the ratio of the
        two speedups, without interval or decision.

    Returns
    -------
    pandas.DataFrame
        Index: ``"all"`` then ``"without <name>"``. Columns: ``speedup``,
        ``ci_low``, ``ci_high`` (vs baseline, x), ``contribution`` (x: how many
        times slower the job gets when it is removed; 1.0 for "all"),
        ``contribution_low``, ``contribution_high`` (its 95% interval) and
        ``decision`` (:func:`contribution_decision`; empty for "all").
        With ``attributions`` also ``phases`` (where it acts),
        ``phase_contribution``, ``phase_low``, ``phase_high`` and ``note``,
        and ``decision`` is :attr:`Attribution.decision` (decided on its phases).
    attributions : mapping of str to Attribution, optional
        Optimization name -> :func:`attribute`.
    """
    contributions = contributions or {}
    attributions = attributions or {}
    rows = [{"variant": "all", "speedup": full.ratio, "ci_low": full.ci_low, "ci_high": full.ci_high,
             "contribution": 1.0, "contribution_low": math.nan, "contribution_high": math.nan, "decision": ""}]
    if attributions:
        rows[0].update({"phases": "", "phase_contribution": math.nan, "phase_low": math.nan, "phase_high": math.nan,
                        "note": ""})
    for name, c in without.items():
        k = contributions.get(name)
        a = attributions.get(name)
        row = {"variant": f"without {name}", "speedup": c.ratio, "ci_low": c.ci_low, "ci_high": c.ci_high,
               "contribution": k.ratio if k is not None else full.ratio / c.ratio,
               "contribution_low": k.ci_low if k is not None else math.nan,
               "contribution_high": k.ci_high if k is not None else math.nan,
               "decision": contribution_decision(k) if k is not None else ""}
        if attributions:
            ph = a.phase if a is not None else None
            row.update({"phases": phase_label(a.phases) if a is not None else "",
                        "phase_contribution": ph.ratio if ph is not None else math.nan,
                        "phase_low": ph.ci_low if ph is not None else math.nan,
                        "phase_high": ph.ci_high if ph is not None else math.nan,
                        "note": a.note if a is not None else ""})
            if a is not None:
                row["decision"] = a.decision
        rows.append(row)
    return pd.DataFrame(rows).set_index("variant")


def compute_side_lines(frame, summaries: Mapping[str, JobSummary], earlier: Mapping[str, Any]) -> list[str]:
    """Reconcile each compute-side optimization's contribution here with its own notebook's figure.

    For ``mixed_precision`` and ``channels_last`` (when ablated): the compute
    phase's median with and without it in this job, the share of the step the
    compute phase takes without it, and the job-level contribution, next to
    the speedup its notebook measured (all measured numbers).

    Parameters
    ----------
    frame : pandas.DataFrame
        :func:`ablation_frame` with contributions.
    summaries : mapping of str to JobSummary
        By job name: ``"optimized"`` and ``"without <name>"``.
    earlier : mapping of str to (value, unit, notebook)
        Optimization name -> its notebook's verdict value, unit and notebook id
        (missing names are described without it).

    Returns
    -------
    list of str
    """
    lines = []
    opt = summaries.get("optimized")
    for name in ("mixed_precision", "channels_last"):
        key = f"without {name}"
        if opt is None or key not in summaries or key not in frame.index:
            continue
        w = summaries[key]
        row = frame.loc[key]
        comp_ratio = w.compute_s / opt.compute_s if opt.compute_s > 0 else math.nan
        share = w.compute_s / (w.data_s + w.h2d_s + w.compute_s) if w.compute_s > 0 else 0.0
        ref = ""
        if name in earlier:
            value, unit, nb = earlier[name]
            if is_number(value):
                ref = f"notebook {nb[:2]} measured {format_value(value, unit)} on its own comparison; "
        bound = 1.0 / ((1.0 - share) + share / comp_ratio) if comp_ratio > 0 and math.isfinite(comp_ratio) \
            else math.nan
        lines.append(f"{name}: {ref}in this job its compute phase went {w.compute_s * 1e3:.1f} -> "
                     f"{opt.compute_s * 1e3:.1f} ms ({comp_ratio:.2f}x); compute is {share:.0%} of the median step "
                     f"without it (data {w.data_s * 1e3:.1f} ms, h2d {w.h2d_s * 1e3:.1f} ms), which alone predicts "
                     f"{bound:.2f}x for the whole job; whole step measured: {row['contribution']:.2f}x (95% CI "
                     f"{row['contribution_low']:.2f}-{row['contribution_high']:.2f}); decided on the phases it acts "
                     f"on: {row['decision'] or 'no interval'}")
    return lines


# --------------------------------------------------------------------------- cross-checks


def earlier_baseline_phases(results, workload: Workload, params: Mapping[str, Any]) -> tuple[dict | None, str]:
    """Notebook 01's phase statistics of the same job in this run, for :func:`cross_checks`.

    Parameters
    ----------
    results : pandas.DataFrame or None
        This run's records (:func:`helpers.results.load_results`).
    workload : Workload
        This notebook's workload.
    params : mapping
        This notebook's parameters (``data_dir`` and ``max_images`` must match too).

    Returns
    -------
    (dict or None, str)
        ``extra["phases"]`` of notebook 01's verdict (phase -> ``median_s``,
        ``p25_s``, ``p75_s``) when it measured this very job, else None and why not.
    """
    if results is None or not len(results):
        return None, "notebook 01 has no verdict in this run"
    table = verdicts(results)
    rows = table[table["notebook"] == checklist.BASELINE] if len(table) else table
    if not len(rows):
        return None, "notebook 01 has no verdict in this run"
    row = rows.iloc[-1]
    extra = row.get("extra") if isinstance(row.get("extra"), Mapping) else {}
    theirs = row.get("parameters") if isinstance(row.get("parameters"), Mapping) else {}
    phases = extra.get("phases") if isinstance(extra.get("phases"), Mapping) else None
    if phases is None:
        return None, "notebook 01's verdict carries no phase statistics (recorded by an older version)"
    try:
        same = Workload.from_params(theirs) == workload
    except (ParameterError, TypeError, ValueError, KeyError):
        same = False
    same = same and all(str(theirs.get(k) or "") == str(params.get(k) or "") for k in ("data_dir", "max_images", "job"))
    if not same:
        return None, "notebook 01 measured a different job (workload, data_dir, max_images or job differ)"
    return dict(phases), ""


def cross_checks(baseline, optimized, full, *, earlier_phases: Mapping | None = None,
                 seed: int = 0, max_drift: float | None = None) -> list:
    """Every cross-check of the before/after comparison (:mod:`helpers.experiments.crosscheck`).

    - the phases none of the optimized job's optimizations acts on must not change (on a CPU, DataLoader workers
      and the prefetcher act on the compute phase too: they share its cores; the device is the jobs' own);
    - the speedup must not exceed what the acted-on phases allow (Amdahl);
    - the baseline's compute phase must agree with notebook 01's, when it measured this job.

    Parameters
    ----------
    baseline, optimized : helpers.experiments.e2e_jobs.JobVariant
        Both measured (interleaved).
    full : helpers.timing.Comparison
        :func:`speedup` of the two.
    earlier_phases : mapping, optional
        :func:`earlier_baseline_phases`'s statistics (skipped when None).
    seed : int
    max_drift : float, optional
        Default :data:`helpers.experiments.crosscheck.MAX_PHASE_DRIFT`.

    Returns
    -------
    list of helpers.experiments.crosscheck.CrossCheck
    """
    from helpers.experiments import crosscheck

    drift = crosscheck.MAX_PHASE_DRIFT if max_drift is None else max_drift
    opts = tuple(optimized.config.optimizations)
    base_steps, opt_steps = baseline.steps_frame(), optimized.steps_frame()
    checks = crosscheck.untouched_phases(base_steps, opt_steps, opts, max_drift=drift, seed=seed,
                                         device_kind=getattr(optimized.acc, "kind", ""))
    medians = {p: float(base_steps[p].median()) for p in PHASES}
    checks.append(crosscheck.amdahl(full, medians, opts))
    if earlier_phases and isinstance(earlier_phases.get("compute"), Mapping):
        checks.append(crosscheck.same_job("the baseline's compute phase", earlier_phases["compute"],
                                          list(base_steps["compute"]), where="notebook 01", max_drift=drift))
    return checks



def duration_unit(seconds: float) -> tuple[str, float]:
    """The unit for durations around ``seconds``: (name, seconds per unit).

    Days from 2 days up, hours from 2 hours, minutes from 2 minutes, else seconds.
    """
    if seconds >= 2 * 86400:
        return "days", 86400.0
    if seconds >= 2 * 3600:
        return "hours", 3600.0
    if seconds >= 120:
        return "minutes", 60.0
    return "s", 1.0


@dataclass(frozen=True)
class Projection:
    """How long ``steps`` training steps take before and after, from measured step times.

    Attributes
    ----------
    steps : int
    before_s, after_s : float
        At the median step times, seconds.
    before_range_s, after_range_s : (float, float)
        Before: at the baseline's step-time quartiles; after: before / the
        speedup's interval bounds.
    """

    steps: int
    before_s: float
    after_s: float
    before_range_s: tuple[float, float]
    after_range_s: tuple[float, float]

    def unit(self) -> tuple[str, float]:
        """One unit for every number of this projection, chosen from the before duration (:func:`duration_unit`)."""
        return duration_unit(self.before_s)

    def sentence(self) -> str:
        """The seed's "7 days to 2.5 days" sentence, computed, every number in one unit."""
        name, div = self.unit()

        def f(x: float) -> str:
            return "inf" if not math.isfinite(x) else f"{x / div:.1f}"

        return (f"{self.steps:,} steps: {f(self.before_s)} {name} before (between {f(self.before_range_s[0])} and "
                f"{f(self.before_range_s[1])} at the baseline's step-time quartiles) -> {f(self.after_s)} {name} after "
                f"(between {f(self.after_range_s[0])} and {f(self.after_range_s[1])} at the speedup's 95% interval)")


def project(steps: int, baseline_step, comparison) -> Projection:
    """Project ``steps`` steps before and after.

    Parameters
    ----------
    steps : int
        Training steps (>= 1).
    baseline_step : helpers.timing.Measurement
        The baseline's measured step times.
    comparison : helpers.timing.Comparison
        Baseline vs optimized.

    Returns
    -------
    Projection

    Raises
    ------
    ParameterError
        ``steps < 1``.
    """
    if steps < 1:
        raise ParameterError(f"projection steps={steps}; need >= 1")
    before = steps * baseline_step.median_s
    after = before / comparison.ratio
    lo = before / comparison.ci_high if comparison.ci_high > 0 and math.isfinite(comparison.ci_high) else 0.0
    hi = before / comparison.ci_low if comparison.ci_low > 0 else math.inf
    return Projection(steps=int(steps), before_s=before, after_s=after,
                      before_range_s=(steps * baseline_step.p25_s, steps * baseline_step.p75_s),
                      after_range_s=(lo, hi))
