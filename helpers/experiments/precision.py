"""Notebook 06's experiment: does autocast (bf16/fp16) speed up the job's training step here, and learn the same?

The notebook measures on fixed batches of the job
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
from dataclasses import replace
from typing import Sequence

import torch

from helpers import specs
from helpers.checklist import Item
from helpers.compute.amp import make_grad_scaler, resolve_autocast_dtype
from helpers.compute.ppo import PPOTrainer
from helpers.diagnose.environment import cpu_bf16_support
from helpers.errors import ParameterError
from helpers.experiments.base import Experiment, Optimization
from helpers.experiments.training import fixed_batches, step_options_comparison
from helpers.jobs.base import Job, StepOptions
from helpers.jobs.check import Divergence, loss_divergence
from helpers.jobs.ppo import PPOJob, PPOStep
from helpers.live import LivePoint, Progress, no_progress
from helpers.params import Param
from helpers.timing import Comparison, ProgressClock, compare
from helpers.verdict import Action, Verdict


__all__ = ["NOTEBOOK", "DTYPES", "ProgressClock", "autocast_comparison", "divergence", "live_point", "try_precision",
           "verdict"]

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
    if not isinstance(job, PPOJob):  # a user's job: its whole step on its own fixed batches, as the notebook times it
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
