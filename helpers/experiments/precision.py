"""Notebook 06's experiment: does autocast (bf16/fp16) speed up the job's training step here, and learn the same?

:func:`run` is the whole notebook: it returns a :class:`PrecisionResult` (the capabilities, the autocast op probe
and dtype hooks, the loss-scaler demonstration, the loss curves, the step times and the peak memory), whose
``records()`` and ``verdict()`` the notebook writes with ``ctx.record(result)``. It measures on fixed batches of the job
(:func:`helpers.experiments.training.fixed_batches`): fp32 and mixed-precision
steps timed interleaved (:func:`helpers.timing.compare`), and the loss curves
of both gated by :func:`helpers.experiments.training.learning_check` (the
gate notebook 10 uses too). :func:`verdict` turns those figures into the
notebook's :class:`helpers.verdict.Verdict`. The notebook's "try it" panel calls
:func:`try_precision`: the same interleaved fp32-vs-autocast timing
(:func:`autocast_comparison`) at the precision a learner picks.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

import pandas as pd
import torch

from helpers import specs
from helpers.checklist import Item
from helpers.compute.amp import (make_grad_scaler, overflow_flags, probe_autocast_ops, record_output_dtypes,
                                 resolve_autocast_dtype)
from helpers.compute.ppo import PPOTrainer
from helpers.conditions import held, ran_with, sides
from helpers.diagnose.environment import cpu_bf16_support
from helpers.errors import DataError, ParameterError
from helpers.experiments.base import Experiment, ExperimentResult, Optimization, checked_fields
from helpers.experiments.training import (LearningCheck, fixed_batches, learning_check, loss_curve,
                                          step_options_comparison)
from helpers.jobs.base import Job, StepOptions
from helpers.jobs.check import Divergence, loss_divergence
from helpers.jobs.ppo import PPOJob, PPOStep
from helpers.live import Knob, LivePoint, Progress, TrySpec, no_progress
from helpers.params import Param
from helpers.results import Records
from helpers.timing import Comparison, ProgressClock, compare
from helpers.verdict import Action, Verdict


__all__ = ["NOTEBOOK", "DTYPES", "Capabilities", "LossCurves", "PeakMemory", "PrecisionChecks", "PrecisionResult",
           "ProgressClock", "ScalerDemo", "ScalerRun", "autocast_comparison", "check", "divergence", "live_point",
           "run", "try_precision", "verdict"]

#: Notebook whose verdict :func:`verdict` gives.
NOTEBOOK = "06_mixed_precision"

_SHORT = {"bfloat16": "bf16", "float16": "fp16"}
#: Least speedup worth enabling autocast for (:meth:`helpers.timing.Comparison.outcome`'s threshold, x).
SPEEDUP_THRESHOLD = 1.05


def verdict(cmp: Comparison, *, dtype_name: str, loss_ok: bool, rel_diff: float, no_nan: bool, loss_rtol: float,
            device_kind: str, native_bf16: bool | None, context: str, loss_name: str = "value loss",
            divergence: Divergence | None = None) -> Verdict:
    """Notebook 06's verdict: enable autocast only when it is measurably faster and learns like fp32.

    Parameters
    ----------
    cmp : helpers.timing.Comparison
        fp32 steps as A, mixed-precision steps as B (seconds per step).
    dtype_name : str
        ``"bfloat16"`` or ``"float16"``.
    loss_ok, no_nan : bool
        The learning gate passed; no loss was NaN or infinite.
    rel_diff : float
        Relative difference of the tail mean value loss, mixed vs fp32 (fraction).
    loss_rtol : float
        The gate's tolerance (fraction).
    device_kind : str
        "cpu", "cuda" or "npu".
    native_bf16 : bool or None
        On a CPU, whether it has native bf16 arithmetic (:func:`helpers.diagnose.environment.cpu_bf16_support`).
    context : str
        What was measured, in one sentence.
    loss_name : str, default "value loss"
        The loss the gate compared (the built-in job's value loss; a user's job's ``"loss"``).
    divergence : helpers.jobs.check.Divergence, optional
        Where the loss curves became NaN or infinite (:func:`divergence`). When fp32 diverges too, the job
        diverges and the verdict is "inconclusive", saying so (no precision is to blame); when only the mixed
        precision does, "leave off" with the step.

    Returns
    -------
    helpers.verdict.Verdict
        metric ``speedup`` (x, fp32 time over mixed time) with its 95% interval; action on ``autocast_dtype``
        (none when the job diverges in fp32); ``extra["divergence"]`` where a loss was not finite, and
        ``extra["decision_threshold"]`` (:data:`SPEEDUP_THRESHOLD`) unless the fp32 baseline diverges.
    """
    extra = {"divergence": divergence.as_dict()} if divergence is not None and divergence.diverged else {}
    if extra and divergence.baseline_diverged:
        return Verdict(notebook=NOTEBOOK, metric="speedup", value=cmp.ratio, unit="x", recommendation="inconclusive",
                       reason=f"{divergence.sentence()} (the step times: {cmp.verdict_text()})", context=context,
                       action=None, repeats=min(cmp.a.repeats, cmp.b.repeats),
                       spread={"ci_low": cmp.ci_low, "ci_high": cmp.ci_high, "confidence": cmp.confidence},
                       extra=extra)
    if extra:
        recommendation = "leave off"
        reason = f"{dtype_name} autocast breaks this job's training: {divergence.sentence()}"
    elif not loss_ok:
        recommendation = "leave off"
        reason = (f"mixed precision did not reproduce fp32 training: {loss_name} difference {rel_diff:.1%} of its "
                  f"scale over the run (tolerance {loss_rtol:.0%}), NaN-free: {no_nan}")
    elif cmp.outcome(SPEEDUP_THRESHOLD) == "b_faster":
        recommendation = "enable"
        reason = (f"{cmp.verdict_text()}, {loss_name} within {rel_diff:.2%} of fp32 on its scale over the run "
                  f"(tolerance {loss_rtol:.0%})")
    else:
        recommendation = "leave off"
        reason = f"{cmp.verdict_text()}, so {dtype_name} autocast does not pay here"
    if device_kind == "cpu" and dtype_name == "bfloat16":
        reason += f"; CPU native bf16: {native_bf16}"
    elif device_kind == "cpu":
        reason += f"; {dtype_name} autocast on a CPU is not what CPUs accelerate (they accelerate bf16 at most)"
    action = Action("autocast_dtype", dtype_name if recommendation == "enable" else None,
                    f"{_SHORT.get(dtype_name, dtype_name)} autocast: {recommendation}", current="float32")
    return Verdict(notebook=NOTEBOOK, metric="speedup", value=cmp.ratio, unit="x", recommendation=recommendation,
                   reason=reason, context=context, action=action, repeats=min(cmp.a.repeats, cmp.b.repeats),
                   spread={"ci_low": cmp.ci_low, "ci_high": cmp.ci_high, "confidence": cmp.confidence},
                   extra={**extra, "decision_threshold": SPEEDUP_THRESHOLD})


def divergence(fp32_losses: Sequence[float], mixed_losses: Sequence[float], *, dtype_name: str,
               stat: str = "loss") -> Divergence:
    """Where the fp32 and the mixed-precision loss curves first became NaN or infinite (notebook 06's curves).

    Parameters
    ----------
    fp32_losses, mixed_losses : sequence of float
        The loss per step of each curve (same seed and batches).
    dtype_name : str
        ``"bfloat16"`` or ``"float16"``.
    stat : str
        The loss's name, for the sentence.

    Returns
    -------
    helpers.jobs.check.Divergence
        Configurations ``"fp32"`` (the baseline) and e.g. ``"bf16 autocast"``.
    """
    return loss_divergence({"fp32": fp32_losses, f"{_SHORT.get(dtype_name, dtype_name)} autocast": mixed_losses},
                           baseline="fp32", stat=stat)


# --------------------------------------------------------------------------- the "try it" panel

#: The precisions a "try it" panel offers, where the device supports them: float32 (no autocast: the A/A
#: comparison, fp32 against itself, shows the noise floor), then the autocast dtypes.
DTYPES = ("float32", "bfloat16", "float16")


def _dtype(name: str, acc) -> torch.dtype | None:
    """``"float32"`` -> None (no autocast), else the autocast dtype, checked against what ``acc`` supports."""
    if name == "float32":
        return None
    if name not in DTYPES:
        raise ParameterError(f"dtype={name!r}; choose one of {', '.join(DTYPES)} (float32: no autocast)")
    return resolve_autocast_dtype(name, acc.kind, acc.capabilities.autocast_dtypes)


def autocast_comparison(job: Job, acc, dtype: str, *, batches: Sequence | None = None, steps: int,
                        warmup_steps: int, init_scale: float = 1024.0, growth_interval: int = 200, seed: int = 0,
                        progress: Progress = no_progress) -> Comparison:
    """Notebook 06's section 6: the job's training step in fp32 (A) against ``dtype`` (B), interleaved.

    The built-in job: two :class:`helpers.compute.ppo.PPOTrainer` from the same initial weights (the job's seed),
    each cycling over the same fixed device batches with its own seeded sampling generator, the mixed one under
    ``torch.amp.autocast`` with a GradScaler for float16 (``init_scale``, ``growth_interval``), timed by
    :func:`helpers.timing.compare` (A B B A, a device synchronize around every call, ``warmup_steps`` per
    side excluded). A user's job: :func:`helpers.experiments.training.step_options_comparison` (its whole step
    on its own fixed batches), as the notebook does; ``progress`` is then called only at the start and the end.

    Parameters
    ----------
    job : helpers.jobs.base.Job
    acc : helpers.device.Accelerator
    dtype : str
        ``"float32"`` (no autocast: fp32 against fp32), ``"bfloat16"`` or ``"float16"``.
    batches : sequence of (images, tokens, labels), optional
        The built-in job's fixed device batches (the notebook's); default 4 from
        :func:`helpers.experiments.training.fixed_batches`.
    steps, warmup_steps : int
        Timed and untimed steps per side (>= 1 and >= 0).
    init_scale, growth_interval
        The GradScaler's (float16 only), as notebook 06's parameters.
    seed : int
        Seed of the sampling generators and of the bootstrap.
    progress : callable
        ``progress(done, total)`` after each step of either side (outside its timing).

    Returns
    -------
    helpers.timing.Comparison
        A = fp32, B = ``dtype``, seconds per step; ``ratio`` > 1: ``dtype`` is faster.

    Raises
    ------
    helpers.errors.ParameterError
        For a dtype not in :data:`DTYPES` or not supported on ``acc``, ``steps < 1`` or ``warmup_steps < 0``.
    """
    low = _dtype(dtype, acc)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1 or \
            isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
        raise ParameterError(f"steps must be an int >= 1 and warmup_steps an int >= 0, got steps={steps!r}, "
                             f"warmup_steps={warmup_steps!r}")
    names = ("fp32", "fp32 again" if low is None else f"{dtype} autocast")
    if not job.is_builtin:  # a user's job: its whole step (its own optimizer, no workbook GradScaler) on its own
        # fixed batches, as the notebook times it
        progress(0, 1)
        cmp = step_options_comparison(job, acc, StepOptions(), StepOptions(autocast_dtype=low), steps=steps,
                                      warmup_steps=warmup_steps, seed=seed, names=names)
        progress(1, 1)
        return cmp
    if batches is None:
        batches = fixed_batches(job, acc, 4)
    sides = []
    for side_dtype in (None, low):
        scaler = (make_grad_scaler(acc.kind, side_dtype, init_scale=init_scale, growth_interval=growth_interval)
                  if side_dtype == torch.float16 else None)
        step = PPOStep(PPOTrainer(job.make_model(acc), job.ppo, scaler=scaler),
                       torch.Generator(device=acc.device).manual_seed(seed), side_dtype)
        it = itertools.cycle(batches)
        sides.append(lambda step=step, it=it: step(next(it)))
    clock = ProgressClock(progress, warmup=warmup_steps, repeats=steps)
    return compare(clock.wrap(sides[0]), clock.wrap(sides[1]), repeats=steps, warmup=warmup_steps,
                   sync=acc.synchronize, names=names, items_per_call=job.workload.batch_size, seed=seed, clock=clock)


def live_point(cmp: Comparison, label: str) -> LivePoint:
    """An fp32-vs-autocast comparison as a "try it" point: the step-time speedup over fp32 with its interval.

    Parameters
    ----------
    cmp : helpers.timing.Comparison
        fp32 as A, the precision tried as B (notebook 06's ``cmp``, or :func:`autocast_comparison`'s).
    label : str
        The precision, e.g. ``"bfloat16"``.

    Returns
    -------
    LivePoint
        metric ``speedup``, unit ``x`` (fp32 median step time over the other's; > 1: faster than fp32), with its
        95% bootstrap interval; ``extra``: ``fp32_step_s``, ``step_s`` (medians, seconds), ``samples_per_s``
        (of B, where the comparison has a rate) and ``steps``.
    """
    rate = cmp.b.rate
    sentence = (f"{label}: {cmp.ratio:.2f}x the speed of fp32 (95% CI {cmp.ci_low:.2f}-{cmp.ci_high:.2f}); step "
                f"{cmp.b.median_s * 1e3:.1f} ms vs fp32 {cmp.a.median_s * 1e3:.1f} ms"
                + (f", {rate:,.0f} samples/s" if rate else "") + f" ({cmp.b.repeats} interleaved steps each)")
    return LivePoint.from_comparison(label, cmp, metric="speedup", sentence=sentence, fp32_step_s=cmp.a.median_s,
                                     step_s=cmp.b.median_s, samples_per_s=rate, steps=cmp.b.repeats)


def try_precision(job: Job, acc, *, dtype: str, batches: Sequence | None = None, steps: int = 10,
                  warmup_steps: int = 2, init_scale: float = 1024.0, growth_interval: int = 200, seed: int = 0,
                  progress: Progress = no_progress) -> LivePoint:
    """Notebook 06's timing again at another precision: how much faster than fp32 is the step here?

    Runs :func:`autocast_comparison` (the notebook's own interleaved fp32-vs-autocast timing, on its fixed
    batches) and returns :func:`live_point`. ``dtype="float32"`` times fp32 against itself: the spread of that
    ratio around 1 is this machine's noise floor, against which the other precisions' speedups can be read.

    Parameters
    ----------
    job : helpers.jobs.base.Job
        The notebook's built-in job, or the user's (its whole step, see :func:`autocast_comparison`).
    acc : helpers.device.Accelerator
    dtype : str
        ``"float32"``, ``"bfloat16"`` or ``"float16"``; the autocast ones only where
        ``acc.capabilities.autocast_dtypes`` has them.
    batches : sequence, optional
        The built-in job's fixed device batches (the notebook's ``batches``).
    steps, warmup_steps : int
        Timed and untimed steps per side (>= 1 and >= 0).
    init_scale, growth_interval
        GradScaler settings for float16 (notebook 06's parameters).
    seed : int
    progress : callable
        ``progress(done, total)`` after each step.

    Returns
    -------
    LivePoint
        metric ``speedup``, unit ``x`` (fp32 step time / step time at ``dtype``, with its 95% bootstrap interval).

    Raises
    ------
    helpers.errors.ParameterError
        For a dtype not in :data:`DTYPES`, one this device cannot autocast to (the message lists those it can),
        ``steps < 1`` or ``warmup_steps < 0``.
    """
    cmp = autocast_comparison(job, acc, dtype, batches=batches, steps=steps, warmup_steps=warmup_steps,
                              init_scale=init_scale, growth_interval=growth_interval, seed=seed, progress=progress)
    return live_point(cmp, dtype if dtype != "float32" else "float32 (vs itself)")


# --------------------------------------------------------------------------- the notebook's experiment

#: Optimizer updates (1-based) whose gradient the loss-scaler demonstration makes infinite.
DEMO_INJECT_AT = (4, 9)
#: Steps of that demonstration, and its scaler's growth interval (short, so that the scale visibly grows).
DEMO_STEPS, DEMO_GROWTH_INTERVAL = 6, 3


@dataclass(frozen=True)
class Capabilities:
    """Section 1: what low precision the device can do, and which dtype the notebook measures.

    Attributes
    ----------
    kind, name : str
        The accelerator's kind (``"cpu"``, ``"cuda"``, ``"npu"``) and name.
    supported : tuple of str
        Its autocast dtypes (``acc.capabilities.autocast_dtypes``).
    requested : str
        The ``autocast_dtype`` parameter (``"auto"``, ``"bfloat16"``, ``"float16"``).
    dtype_name : str
        The dtype chosen (``"bfloat16"`` or ``"float16"``).
    bits : int
        Its width (16).
    native_bf16 : bool
        Whether the CPU has native bf16 arithmetic (:func:`helpers.diagnose.environment.cpu_bf16_support`).
    bf16_detail : str
        The flags behind that answer.
    """

    kind: str
    name: str
    supported: tuple[str, ...]
    requested: str
    dtype_name: str
    bits: int
    native_bf16: bool
    bf16_detail: str

    @property
    def cpu_fp16(self) -> bool:
        """float16 autocast on a CPU, which CPUs do not accelerate."""
        return self.kind == "cpu" and self.dtype_name == "float16"

    def text(self) -> str:
        """The supported dtypes, the one chosen, the CPU's bf16 flags (and a note for fp16 on a CPU)."""
        lines = [f"autocast dtypes supported on {self.kind}: {', '.join(self.supported)}",
                 f"chosen: {self.dtype_name} (parameter autocast_dtype={self.requested!r})",
                 f"CPU native bf16: {self.native_bf16} - {self.bf16_detail}"]
        if self.cpu_fp16:
            lines.append("NOTE: float16 autocast on a CPU was requested. CPUs accelerate bf16 (AVX512-BF16, AMX), "
                         "not fp16 training: expect fp16 autocast here to be much slower than fp32. Measuring it "
                         "anyway, as asked; the CPU's bf16 flags above do not apply to it.")
        return "\n".join(lines)

    def records(self) -> Records:
        """The CPU's native bf16 flag and the chosen dtype's width."""
        r = Records()
        r.add("capabilities", "cpu", "native_bf16", float(self.native_bf16), "bool", detail=self.bf16_detail)
        r.add("capabilities", f"{self.kind} {self.dtype_name}", "autocast_dtype_bits", float(self.bits), "bits",
              dtype=self.dtype_name, supported=", ".join(self.supported))
        return r


@dataclass(frozen=True)
class ScalerDemo:
    """Section 4: a GradScaler forced on, infinite gradients injected at chosen updates of the built-in model.

    Attributes
    ----------
    inject_at : tuple of int
        The poisoned optimizer updates (1-based).
    skipped : int
        Updates the stepper skipped and counted.
    scales : tuple of float
        The loss scale after each update.
    overflow : tuple of bool
        Per update, whether the scale backed off (:func:`helpers.compute.amp.overflow_flags`).
    finite : bool
        Whether every weight was finite afterwards.
    init_scale : float
        The demonstration scaler's initial scale (the ``init_scale`` parameter).
    growth_interval : int
        Its growth interval (:data:`DEMO_GROWTH_INTERVAL`, not the ``growth_interval`` parameter).
    """

    inject_at: tuple[int, ...]
    skipped: int
    scales: tuple[float, ...]
    overflow: tuple[bool, ...]
    finite: bool
    init_scale: float
    growth_interval: int

    @property
    def ok(self) -> bool:
        """Each injected overflow was skipped, counted and seen in the scale history, and the weights are finite."""
        return self.skipped == len(self.inject_at) == sum(self.overflow) and self.finite

    def text(self) -> str:
        """What was injected, skipped and counted, the demonstration scaler's settings and the scale after each
        update."""
        return "\n".join([
            f"injected infs at updates {sorted(self.inject_at)}: {self.skipped} update(s) skipped and counted; "
            f"weights finite afterwards: {self.finite}",
            f"this demonstration's own scaler: init_scale {self.init_scale:g}, growth_interval {self.growth_interval} "
            "(short, so that the scale visibly grows; the growth_interval parameter sets the float16 run's scaler)",
            "scale after each update: " + " → ".join(f"{s:g}" for s in self.scales),
            "overflowed updates read from the scale history: " + str([i + 1 for i, o in enumerate(self.overflow)
                                                                       if o])])


@dataclass(frozen=True)
class ScalerRun:
    """The fp16 loss curve's real GradScaler (the built-in job under float16 only).

    Attributes
    ----------
    skipped, updates : int
        Updates skipped for overflow, of all updates.
    scales : tuple of float
        The loss scale after each update.
    overflow : tuple of bool
        Per update, whether it overflowed (read from the scale history).
    """

    skipped: int
    updates: int
    scales: tuple[float, ...]
    overflow: tuple[bool, ...]


@dataclass(frozen=True)
class LossCurves:
    """Section 5: fp32 and mixed precision from the same weights on the same batches, and the learning gate.

    Attributes
    ----------
    dtype_name : str
    loss_name : str
        The gated loss: ``"value loss"`` (the built-in job) or ``"loss"`` (a user's job).
    fp32, mixed : tuple of float
        The gated loss per step.
    fp32_total, mixed_total : tuple of float
        The total loss per step (a user's job: the same as the gated one).
    learned : helpers.experiments.training.LearningCheck
    no_nan : bool
        Every loss of both runs finite.
    divergence : helpers.jobs.check.Divergence
        Where a loss first became NaN or infinite (:func:`divergence`), total loss first, then the gated one.
    scaler : ScalerRun or None
        The fp16 run's GradScaler (the built-in job under float16), else None.
    """

    dtype_name: str
    loss_name: str
    fp32: tuple[float, ...]
    mixed: tuple[float, ...]
    fp32_total: tuple[float, ...]
    mixed_total: tuple[float, ...]
    learned: LearningCheck
    no_nan: bool
    divergence: Divergence
    scaler: ScalerRun | None = None

    @property
    def rel_diff(self) -> float:
        """The tail means' difference on the loss's scale (fraction; inf where a loss was not finite)."""
        return self.learned.rel_diff if self.no_nan else math.inf

    @property
    def ok(self) -> bool:
        """The learning gate passed and no loss was NaN or infinite."""
        return self.no_nan and self.learned.ok

    @property
    def steps(self) -> int:
        return len(self.fp32)

    def text(self) -> str:
        """The tail means and their difference against the tolerance, or where a loss became NaN or infinite."""
        if not self.no_nan:
            return self.divergence.sentence()
        tail = self.learned.tail
        ref_tail, mixed_tail = sum(self.fp32[-tail:]) / tail, sum(self.mixed[-tail:]) / tail
        return (f"mean {self.loss_name} of the last {tail} of {self.steps} steps: fp32 {ref_tail:.4f}, "
                f"{self.dtype_name} {mixed_tail:.4f}; difference {self.rel_diff:.2%} of the loss's scale over the "
                f"run (tolerance {self.learned.tolerance:.0%}): {'within' if self.ok else 'OUTSIDE'}")

    def scaler_text(self) -> str:
        """The fp16 run's skipped updates, or why no scaler was needed."""
        s = self.scaler
        if s is None:
            return (f"{self.dtype_name}: no loss scaler needed (bf16 has float32's exponent range); the scaler's "
                    "overflow handling was shown in section 4 instead")
        return (f"fp16: {s.skipped} of {s.updates} updates skipped for overflow\n"
                f"overflowed updates read from the scale history: {sum(s.overflow)}")

    def records(self) -> Records:
        """The gate's difference (finite losses), else each configuration's first non-finite step; then the fp16
        scaler's skipped updates."""
        r = Records()
        if self.no_nan:
            r.add("numerics", f"{self.dtype_name} vs fp32", "value_loss_rel_diff", self.rel_diff, "fraction",
                  tolerance=self.learned.tolerance, steps=self.steps, tail_steps=self.learned.tail,
                  no_nan=self.no_nan)
        else:
            for name, first in self.divergence.first.items():
                if first is not None:
                    r.add("numerics", name, "first_nonfinite_loss_step", first[0], "step", stat=first[1],
                          loss=repr(first[2]), steps=self.steps)
        if self.scaler is not None:
            r.add("loss scaler", self.dtype_name, "skipped_updates", self.scaler.skipped, "updates",
                  updates=self.scaler.updates, final_scale=self.scaler.scales[-1])
        return r


@dataclass(frozen=True)
class PeakMemory:
    """Section 6's memory: per variant, the device's peak over one step, or (a CPU) the process's resident memory.

    Attributes
    ----------
    rows : tuple of (variant, metric, bytes, source)
        ``metric``: ``"peak_memory"`` (a device's allocator peak) or ``"process_rss"``; ``bytes`` may be None.
    on_cpu : bool
    """

    rows: tuple[tuple[str, str, int | None, str | None], ...]
    on_cpu: bool

    def text(self) -> str:
        peaks = ", ".join(f"{name} {v / 2**20:.0f} MiB" if v else f"{name} n/a" for name, _, v, _ in self.rows)
        return (f"{peaks} " + ("(process RSS, not separable per variant on a CPU)" if self.on_cpu
                               else "(device peak per variant)"))

    def records(self) -> Records:
        r = Records()
        for name, metric, value, source in self.rows:
            r.add("memory", name, metric, value, "bytes", source=source)
        return r


@dataclass(frozen=True, eq=False)
class PrecisionChecks:
    """Notebook 06 before any timing (:func:`check`): the device's capabilities, the fixed batches, the autocast op
    probe and dtype hooks and the loss-scaler demonstration, all on the built-in job.
    :class:`PrecisionResult` extends it with the measurement.

    Attributes
    ----------
    caps : Capabilities
    images, classes, batch_size, image_size : int
        The built-in job's data and batches (the demonstrations' job).
    job_name : str or None
        A user's job's :meth:`~helpers.jobs.base.Job.summary` (sections 5-7 measure it); None for the built-in job.
    probe : dict
        ``{op: output dtype}`` of :func:`helpers.compute.amp.probe_autocast_ops`.
    dtypes : pandas.DataFrame
        Calls per layer kind, input dtype, output dtype and effect (:func:`helpers.compute.amp.record_output_dtypes`
        on one forward of the built-in model).
    demo : ScalerDemo
    job, batches
        The job measured and (the built-in job) its fixed device batches, for the "try it" panel (keyword-only).
    amp_dtype : torch.dtype or None
        The autocast dtype resolved from ``autocast_dtype`` on this device (keyword-only; None in a result built by
        hand).
    """

    caps: Capabilities
    images: int
    classes: int
    batch_size: int
    image_size: int
    job_name: str | None
    probe: Mapping[str, str]
    dtypes: pd.DataFrame
    demo: ScalerDemo
    job: Any = field(default=None, repr=False, kw_only=True)
    batches: tuple = field(default=(), repr=False, kw_only=True)
    amp_dtype: Any = field(default=None, repr=False, kw_only=True)

    @property
    def dtype_name(self) -> str:
        return self.caps.dtype_name

    def batches_text(self) -> str:
        """Section 2: the images and the fixed batches (and the user's job measured in sections 5-7)."""
        lines = [f"{self.images} images, {self.classes} class(es); {len(self.batches)} fixed batches of "
                 f"{self.batch_size} ({self.image_size} px) kept on the device"]
        if self.job_name is not None:
            lines.append(f"your job: {self.job_name} (the demonstrations of sections 2-4 use the built-in job above)")
        return "\n".join(lines)

    def probe_text(self) -> str:
        """Section 3: the ops this device's autocast upcasts to float32, passes through or casts down."""
        d, kind = self.dtype_name, self.caps.kind
        upcast = [op for op, t in self.probe.items() if t == "float32"]
        passthrough = [op for op, t in self.probe.items() if t == d and op != "linear"]
        return "\n".join([f"{kind}, {d} input under {d} autocast:",
                          f"  upcast to float32 on this device: {', '.join(upcast) or 'none'}",
                          f"  pass-through (stay {d}): {', '.join(passthrough) or 'none'}",
                          f"  cast down (control): linear -> {self.probe['linear']}"])

    def casts_text(self) -> str:
        """Section 3: the layers autocast cast, and those that passed their input dtype through."""
        t = self.dtypes
        casts = sorted({f"{k} ({i} -> {o})" for k, i, o, e in zip(t.kind, t.input_dtype, t.output_dtype, t.effect)
                        if e.startswith("cast")})
        passes = sorted({f"{k} ({i})" for k, i, e in zip(t.kind, t.input_dtype, t.effect) if e == "pass-through"})
        return (f"cast by autocast ({self.dtype_name} autocast on {self.caps.kind}): {', '.join(casts) or 'none'}\n"
                f"passed their input dtype through: {', '.join(passes) or 'none'}")


@dataclass(frozen=True, eq=False)
class PrecisionResult(PrecisionChecks, ExperimentResult):
    """Notebook 06's measurement: the device's capabilities, the autocast op probe and dtype hooks, the loss-scaler
    demonstration, the learning gate, the interleaved step times and the peak memory per variant.

    Attributes
    ----------
    caps, images, classes, batch_size, image_size, job_name, probe, dtypes, demo, job, batches
        As :class:`PrecisionChecks`'s (sections 1-4, with their texts).
    curves : LossCurves
    cmp : helpers.timing.Comparison
        fp32 steps as A, mixed-precision steps as B.
    memory : PeakMemory or None
        None for a user's job (measured on the built-in job only).
    context : str
        What was measured, in the verdict's sentence.
    steps, warmup_steps : int
    init_scale : float
    growth_interval, seed : int
    ran : dict or None
        :func:`helpers.conditions.ran_with` over the interleaved step times (torch threads, batch): both precisions
        stepped with them; None where not stated.
    """

    curves: LossCurves
    cmp: Comparison
    memory: PeakMemory | None
    context: str
    steps: int
    warmup_steps: int
    init_scale: float
    growth_interval: int
    seed: int
    ran: Mapping[str, Any] | None = None

    @property
    def builtin(self) -> bool:
        """Whether sections 5-7 measured the built-in job."""
        return self.job_name is None

    # -- what the cells print ----------------------------------------------------------------

    def timing_text(self) -> str:
        """Section 6: the comparison's sentence and each variant's median step time with its IQR; first, where a
        loss diverged, a note that these times are not meaningful."""
        lines = [self.cmp.verdict_text()]
        d = self.curves.divergence
        if d.diverged:
            where = "; ".join(f"{stat} {value:g} at step {step} in {name}"
                              for name, (step, stat, value) in ((n, f) for n, f in d.first.items() if f is not None))
            lines.insert(0, f"NOTE: the loss diverged ({where}), so these step times are not meaningful: a step on "
                            "NaN or infinite numbers is no speed figure (see section 5 and the verdict)")
        for m in (self.cmp.a, self.cmp.b):
            lines.append(f"  {m.name}: median {m.median_s * 1e3:.1f} ms (IQR {m.p25_s * 1e3:.1f}-"
                         f"{m.p75_s * 1e3:.1f} ms, {m.repeats} steps)")
        return "\n".join(lines)

    def memory_text(self) -> str:
        """Section 6: the peak memory per variant (the built-in job only)."""
        if self.memory is None:
            return "peak memory: not measured for your job (measured only when the built-in job is the job measured)"
        return self.memory.text()

    # -- records, verdict and the panel ----------------------------------------------------------

    def records(self) -> Records:
        """The capabilities, the learning gate (or where a loss diverged), the fp16 scaler, the step times (with the
        torch threads and batch both precisions ran with, :func:`helpers.conditions.sides`) and the peak memory; in
        that order."""
        r = Records().extend(self.caps.records()).extend(self.curves.records())
        r.add_comparison("step time", self.cmp, metric="speedup", unit="x", dtype=self.dtype_name,
                         **sides(self.ran, self.ran))
        for m in (self.cmp.a, self.cmp.b):
            r.add_measurement("step time", m.name, m, metric="time_per_step", unit="s",
                              rate_metric="throughput", rate_unit="samples/s", **(self.ran or {}))
        if self.memory is not None:
            r.extend(self.memory.records())
        return r

    def verdict(self) -> Verdict:
        """Notebook 06's verdict (:func:`verdict`): given also where a loss diverged."""
        c = self.curves
        return verdict(self.cmp, dtype_name=self.dtype_name, loss_ok=c.ok, rel_diff=c.rel_diff, no_nan=c.no_nan,
                       loss_rtol=c.learned.tolerance, device_kind=self.caps.kind,
                       native_bf16=self.caps.native_bf16, context=self.context, loss_name=c.loss_name,
                       divergence=c.divergence)

    def try_it(self, acc, params: Mapping[str, Any]) -> TrySpec:
        """The "try it" panel: the step timed again at another precision (:func:`try_precision`, fewer steps),
        beside this notebook's speedup.

        Parameters
        ----------
        acc : helpers.device.Accelerator
        params : mapping
            The notebook's parameters (``steps`` and ``warmup_steps`` are capped at 10 and 2 for the panel).
        """
        offered = [d for d in DTYPES if d == "float32" or d in acc.capabilities.autocast_dtypes]
        job, batches = self.job, (list(self.batches) if self.builtin else None)
        steps, warmup = min(params["steps"], 10), min(params["warmup_steps"], 2)

        def measure(progress=no_progress, **knobs):
            return try_precision(job, acc, batches=batches, steps=steps, warmup_steps=warmup,
                                 init_scale=self.init_scale, growth_interval=self.growth_interval, seed=self.seed,
                                 progress=progress, **knobs)

        return TrySpec("step time at another precision", measure,
                       {"dtype": Knob(tuple((d, d) for d in offered), self.dtype_name, "dtype")},
                       reference=live_point(self.cmp, self.dtype_name))


def _scaler_demo(job, acc, batches: Sequence, amp_dtype: torch.dtype, P: Mapping[str, Any]) -> ScalerDemo:
    """Section 4: a scaler forced on, infinite gradients at :data:`DEMO_INJECT_AT`, :data:`DEMO_STEPS` steps."""
    scaler = make_grad_scaler(acc.kind, amp_dtype, init_scale=P["init_scale"],
                              growth_interval=DEMO_GROWTH_INTERVAL, force=True)
    demo = PPOTrainer(job.make_model(acc), job.ppo, scaler=scaler, record_scale=True)
    update_no = [0]

    def poison(grad):
        update_no[0] += 1
        return torch.full_like(grad, float("inf")) if update_no[0] in DEMO_INJECT_AT else grad

    handle = next(demo.model.parameters()).register_hook(poison)
    gen = torch.Generator(device=acc.device).manual_seed(P["seed"])
    try:
        for i in range(DEMO_STEPS):
            images, tokens, labels = batches[i % len(batches)]
            demo.step(images, tokens, labels, generator=gen, autocast_dtype=amp_dtype)
    finally:
        handle.remove()
    scales = tuple(demo.stepper.scale_history)
    out = ScalerDemo(inject_at=DEMO_INJECT_AT, skipped=int(demo.stepper.overflow_steps), scales=scales,
                     overflow=tuple(overflow_flags(scales, P["init_scale"])),
                     finite=all(torch.isfinite(p).all().item() for p in demo.model.parameters()),
                     init_scale=P["init_scale"], growth_interval=DEMO_GROWTH_INTERVAL)
    if not out.ok:
        raise DataError(f"the loss scaler did not skip exactly the injected overflows: {out.text()}")
    return out


def _dtype_table(job, acc, batches: Sequence, amp_dtype: torch.dtype) -> pd.DataFrame:
    """Section 3: one forward of the built-in model under autocast with dtype hooks, counted per layer kind."""
    model = job.make_model(acc)
    images, tokens, _ = batches[0]
    with acc.autocast(amp_dtype):
        rows = record_output_dtypes(model, lambda: model(images, tokens))
    table = pd.DataFrame([{**r.__dict__, "effect": r.effect or "n/a"} for r in rows])
    return (table.groupby(["kind", "input_dtype", "output_dtype", "effect"]).size().rename("calls").reset_index()
            .sort_values(["effect", "kind"]).reset_index(drop=True))


def _curves(job, acc, batches: Sequence, amp_dtype: torch.dtype, dtype_name: str, scaler,
            P: Mapping[str, Any]) -> LossCurves:
    """Section 5: the loss curves of fp32 and mixed precision, same weights, batches and seed; the gate."""
    steps = P["curve_steps"]
    scaler_run = None
    if job.is_builtin:
        def curve(dtype, scaler=None):
            trainer = PPOTrainer(job.make_model(acc), job.ppo, scaler=scaler, record_scale=scaler is not None)
            g = torch.Generator(device=acc.device).manual_seed(P["seed"])
            stats = []
            for i in range(steps):
                images, tokens, labels = batches[i % len(batches)]
                stats.append(trainer.step(images, tokens, labels, generator=g, autocast_dtype=dtype))
            return ([float(s["value_loss"]) for s in stats], [float(s["loss"]) for s in stats]), trainer

        (fp32, fp32_total), _ = curve(None)
        (mixed, mixed_total), trainer = curve(amp_dtype, scaler)
        if scaler is not None:
            history = tuple(trainer.stepper.scale_history)
            scaler_run = ScalerRun(skipped=int(trainer.stepper.overflow_steps), updates=trainer.stepper.steps,
                                   scales=history, overflow=tuple(overflow_flags(history, P["init_scale"])))
        loss_name = "value loss"
    else:  # a user's job: its own loss, fp32 and under autocast, same weights and batches
        fp32 = fp32_total = loss_curve(job, acc, StepOptions(), steps=steps)
        mixed = mixed_total = loss_curve(job, acc, StepOptions(autocast_dtype=amp_dtype), steps=steps)
        loss_name = "loss"
    learned = learning_check(fp32, mixed, P["loss_rtol"], loss_name=loss_name)  # the gate notebook 10 uses too
    no_nan = learned.no_nan and all(math.isfinite(v) for v in list(fp32_total) + list(mixed_total))
    diverged = divergence(fp32_total, mixed_total, dtype_name=dtype_name)  # where a loss became NaN or inf
    if not diverged.diverged:
        diverged = divergence(fp32, mixed, dtype_name=dtype_name, stat="value loss")
    return LossCurves(dtype_name=dtype_name, loss_name=loss_name, fp32=tuple(fp32), mixed=tuple(mixed),
                      fp32_total=tuple(fp32_total), mixed_total=tuple(mixed_total), learned=learned, no_nan=no_nan,
                      divergence=diverged, scaler=scaler_run)


def _builtin_timing(job, acc, batches: Sequence, amp_dtype: torch.dtype, dtype_name: str, scaler,
                    P: Mapping[str, Any]) -> tuple[Comparison, PeakMemory]:
    """Section 6 on the built-in job: fp32 against autocast steps interleaved (each on the next fixed batch), then
    one more step of each with the device's peak memory reset before it."""
    trainers = {"fp32": PPOTrainer(job.make_model(acc), job.ppo),
                dtype_name: PPOTrainer(job.make_model(acc), job.ppo, scaler=scaler)}
    gens = {k: torch.Generator(device=acc.device).manual_seed(P["seed"]) for k in trainers}
    counters = {k: 0 for k in trainers}

    def stepper(name, dtype):
        def step():
            images, tokens, labels = batches[counters[name] % len(batches)]
            counters[name] += 1
            return trainers[name].step(images, tokens, labels, generator=gens[name], autocast_dtype=dtype)
        return step

    cmp = compare(stepper("fp32", None), stepper(dtype_name, amp_dtype), repeats=P["steps"],
                  warmup=P["warmup_steps"], sync=acc.synchronize, names=("fp32", f"{dtype_name} autocast"),
                  items_per_call=P["batch_size"], seed=P["seed"])
    rows = []
    for name, dtype in (("fp32", None), (dtype_name, amp_dtype)):
        acc.synchronize()
        acc.reset_peak_memory_stats()
        stepper(name, dtype)()
        acc.synchronize()
        mem = acc.memory_stats()
        device = mem.get("source") == "device"
        rows.append((name, "peak_memory" if device else "process_rss",
                     mem.get("peak_allocated_bytes") if device else mem.get("rss_bytes"), mem.get("source")))
    return cmp, PeakMemory(tuple(rows), on_cpu=acc.is_cpu)


def check(ctx: Any) -> PrecisionChecks:
    """Notebook 06 before any timing, in the notebook's order (sections 1-4): capabilities, fixed batches, the
    autocast op probe and dtype hooks and the loss-scaler demonstration, all on the built-in job.

    Parameters
    ----------
    ctx : helpers.workbook.nbsetup.NotebookContext
        The notebook's context: its parameters (the spec of :data:`EXPERIMENT`) and accelerator; ``ctx.job()``
        is the job sections 5-7 measure.

    Returns
    -------
    PrecisionChecks

    Raises
    ------
    helpers.errors.ParameterError
        For an autocast dtype the device does not support.
    helpers.errors.DataError
        If the loss scaler did not skip exactly the injected overflows.
    """
    P, acc = ctx.params, ctx.acc
    amp_dtype = resolve_autocast_dtype(P["autocast_dtype"], acc.kind, acc.capabilities.autocast_dtypes)
    dtype_name = str(amp_dtype).replace("torch.", "")
    bf16 = cpu_bf16_support()
    caps = Capabilities(kind=acc.kind, name=acc.name, supported=tuple(acc.capabilities.autocast_dtypes),
                        requested=P["autocast_dtype"], dtype_name=dtype_name, bits=int(torch.finfo(amp_dtype).bits),
                        native_bf16=bool(bf16["native_bf16"]), bf16_detail=str(bf16["detail"]))
    demo_job = PPOJob.from_params(P)  # the built-in job at this notebook's workload: sections 2-4 demonstrate on it
    index = demo_job.index
    n_fixed = min(4, len(index) // P["batch_size"])
    batches = fixed_batches(demo_job, acc, n_fixed)  # batched pipeline, on the device: the input is not timed
    job = ctx.job() if P.get("job") else demo_job  # the job sections 5-7 measure
    probe = probe_autocast_ops(acc.device, amp_dtype)
    dtypes = _dtype_table(demo_job, acc, batches, amp_dtype)
    demo = _scaler_demo(demo_job, acc, batches, amp_dtype, P)
    return PrecisionChecks(caps=caps, images=len(index), classes=index.n_classes,
                           batch_size=demo_job.workload.batch_size, image_size=P["image_size"],
                           job_name=None if job.is_builtin else job.summary(), probe=dict(probe), dtypes=dtypes,
                           demo=demo, job=job, batches=tuple(batches), amp_dtype=amp_dtype)


def run(ctx: Any, checks: PrecisionChecks | None = None) -> PrecisionResult:
    """Notebook 06's experiment, in the notebook's order: :func:`check` (capabilities, fixed batches, the autocast op
    probe and dtype hooks, the loss-scaler demonstration, all on the built-in job), then on the job measured (the
    user's, where ``job`` is set) the loss curves and their gate, the interleaved step times and (the built-in job)
    the peak memory per variant.

    Parameters
    ----------
    ctx : helpers.workbook.nbsetup.NotebookContext
        The notebook's context: its parameters (the spec of :data:`EXPERIMENT`) and accelerator; ``ctx.job()``
        is the job sections 5-7 measure.
    checks : PrecisionChecks, optional
        :func:`check`'s result (the notebook shows it before the timing starts); None checks here.

    Returns
    -------
    PrecisionResult
        Its verdict stands also when a loss became NaN or infinite (:func:`verdict`'s divergence).

    Raises
    ------
    helpers.errors.ParameterError
        For an autocast dtype the device does not support.
    helpers.errors.DataError
        If the loss scaler did not skip exactly the injected overflows.
    """
    P, acc = ctx.params, ctx.acc
    c = checks if checks is not None else check(ctx)
    amp_dtype, dtype_name, job, batches = c.amp_dtype, c.dtype_name, c.job, list(c.batches)
    use_scaler = amp_dtype == torch.float16
    scaler = (make_grad_scaler(acc.kind, amp_dtype, init_scale=P["init_scale"], growth_interval=P["growth_interval"])
              if use_scaler and job.is_builtin else None)
    curves = _curves(job, acc, batches, amp_dtype, dtype_name, scaler, P)
    names = ("fp32", f"{dtype_name} autocast")
    ran = ran_with(job.workload.batch_size)  # read as the interleaved timing starts, held to its end
    if job.is_builtin:
        cmp, memory = _builtin_timing(job, acc, batches, amp_dtype, dtype_name, scaler, P)
        what = (f"PPO step (rollout + {job.ppo.ppo_epochs} updates) of a {P['model_width']}-channel conv + d_model "
                f"{P['d_model']} policy, batch {P['batch_size']} of {P['image_size']} px, {len(batches)} fixed "
                "batches")
    else:  # the user's whole training step on fixed device batches, fp32 against autocast, interleaved
        cmp = step_options_comparison(job, acc, StepOptions(), StepOptions(autocast_dtype=amp_dtype),
                                      steps=P["steps"], warmup_steps=P["warmup_steps"], seed=P["seed"], names=names)
        memory = None
        what = f"your job's training step ({job.summary()}), 4 fixed batches"
    context = (f"{what} on {acc.kind} ({acc.name}), fp32 vs {dtype_name} autocast"
               f"{' with GradScaler' if use_scaler else ''}, {P['steps']} interleaved steps each after "
               f"{P['warmup_steps']} warm-up")
    return PrecisionResult(**checked_fields(c), curves=curves, cmp=cmp, memory=memory, context=context,
                           steps=P["steps"], warmup_steps=P["warmup_steps"], init_scale=P["init_scale"],
                           growth_interval=P["growth_interval"], seed=P["seed"], ran=held(ran))


# -- the notebook's declaration, found by helpers.experiments.registry ------------------------------------

def _amp_default(acc, native_bf16=None) -> tuple[bool, str]:
    """Mixed precision where no verdict decides it: where the device autocasts to bf16/fp16 and, on a CPU, only
    with native bf16 (``native_bf16``; read with :func:`helpers.diagnose.environment.cpu_bf16_support` when None):
    emulated bf16 is slower than fp32 (pytorch/pytorch#118499)."""
    dtypes = tuple(acc.capabilities.autocast_dtypes)
    if not dtypes:
        return False, f"{acc.kind} has no autocast dtype"
    if acc.is_cpu:
        if native_bf16 is None:
            native_bf16 = bool(cpu_bf16_support()["native_bf16"])
        return (bool(native_bf16) and "bfloat16" in dtypes,
                "this CPU has native bf16 (AVX512-BF16/AMX/Arm BF16)" if native_bf16 else
                "this CPU has no native bf16: emulated bf16 is slower than fp32")
    return True, f"{acc.kind} autocasts to {', '.join(dtypes)}"


EXPERIMENT = Experiment(
    item=Item("06", "06_mixed_precision", "mixed precision",
         "Decide whether mixed precision speeds up training here",
         "Does autocast (bf16/fp16) speed up this training step here, and does it still learn the same?",
         ("mixed_precision",)),
    spec=specs.COMMON + specs.DATA + specs.batch() + specs.training("timed training steps per variant") + (
        Param("autocast_dtype", str, "auto", "low-precision dtype: auto picks what the device supports",
              choices=("auto", "bfloat16", "float16")),
        Param("curve_steps", int, 30, "training steps of the fp32 and mixed-precision loss curves",
              minimum=2, maximum=100000),
        Param("loss_rtol", float, 0.10,
              "tolerance of mixed vs fp32 mean loss over the last steps, as a share of the loss's scale over the run",
              minimum=0.0, maximum=10.0),
        Param("init_scale", float, 1024.0, "GradScaler initial loss scale (fp16 only)", minimum=1.0,
              maximum=1e10),
        Param("growth_interval", int, 200, "GradScaler steps without overflow before the scale grows",
              minimum=1, maximum=1000000),
    ) + specs.JOB,
    optimizations=(
        Optimization("mixed_precision", "06_mixed_precision", ("compute",), setting="amp_dtype",
                     default=_amp_default,
                     apply=lambda plan, settings, acc: replace(plan, options=replace(
                         plan.options, autocast_dtype=getattr(torch, settings["amp_dtype"])))),
    ),
    interleaved_repeats="steps",
)
