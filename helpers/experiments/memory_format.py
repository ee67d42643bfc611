"""Notebook 07's verdict: does channels_last (NHWC) speed up the job's conv encoder here?

The measurements are the notebook's (the conv encoder's forward and backward
in NCHW and channels_last at each precision, interleaved, with
:mod:`helpers.compute.memory_format` and :mod:`helpers.compute.fusion`);
:func:`verdict` decides from them and returns the notebook's
:class:`helpers.verdict.Verdict`. The notebook's "try it" panel calls
:func:`try_memory_format`: one variant (memory format, autocast) timed against
NCHW in fp32 by the notebook's own interleaved encoder timing
(:func:`format_comparison`).
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any, Sequence

import torch

from helpers import specs
from helpers.checklist import Item
from helpers.compute.memory_format import FORMATS, channels_last_status, conv_step, to_memory_format
from helpers.errors import ParameterError
from helpers.experiments.base import Experiment, Optimization
from helpers.experiments.training import fixed_batches, step_options_comparison
from helpers.jobs.base import Job, StepOptions
from helpers.jobs.ppo import PPOJob
from helpers.live import LivePoint, Progress, no_progress
from helpers.params import Param
from helpers.timing import Comparison, ProgressClock, compare
from helpers.verdict import Action, Verdict


__all__ = ["NOTEBOOK", "channels_last_decision", "format_comparison", "live_point", "try_memory_format", "verdict"]

#: Notebook whose verdict :func:`verdict` gives.
NOTEBOOK = "07_channels_last"


def channels_last_decision(comparisons: dict[str, Any], *, applicable: bool = True, why_not: str = "",
                          threshold: float = 1.05, what: str = "the conv encoder's forward+backward") -> dict[str, Any]:
    """Turn the channels_last comparisons into the notebook's verdict.

    The best variant is the one with the largest ratio (NCHW time / channels_last
    time at the same precision). "enable" when its bootstrap interval lies
    above 1 and the ratio is at least ``threshold``
    (:meth:`helpers.timing.Comparison.outcome` is ``"b_faster"``), else "leave off".

    Parameters
    ----------
    comparisons : dict of str to helpers.timing.Comparison
        Label (e.g. ``"fp32"``, ``"bfloat16 autocast"``) to the comparison of
        channels_last (B) against NCHW (A) at that precision. Must be non-empty when
        ``applicable``.
    applicable : bool, default True
        False where the device does not support channels_last (NPU).
    why_not : str
        The reason when not applicable.
    threshold : float, default 1.05
        Least speedup worth enabling (5 %: below that a layout change is not worth its risk).
    what : str
        What was timed, for the reason (the built-in job's conv encoder; a user's job's whole step).

    Returns
    -------
    dict
        ``value`` (float or None, "x"), ``recommendation`` ("enable", "leave off"
        or "not applicable"), ``reason`` (sentence), ``spread`` (interval or
        None), ``best`` (label or None), ``threshold`` (x; measured only), ``action``
        (:class:`helpers.verdict.Action` on ``memory_format``).

    Raises
    ------
    ParameterError
        If applicable and ``comparisons`` is empty.
    """
    if not applicable:
        return {"value": None, "recommendation": "not applicable", "spread": None, "best": None,
                "reason": f"channels_last was not measured: {why_not or 'not supported on this device'}",
                "action": Action("memory_format", None, "channels_last: not applicable",
                                 current="contiguous_format")}
    if not comparisons:
        raise ParameterError("channels_last_decision: no comparison given; measure at least the fp32 one.")
    best = max(comparisons, key=lambda k: comparisons[k].ratio)
    c = comparisons[best]
    parts = [f"{label}: {cmp.ratio:.2f}x [{cmp.ci_low:.2f}, {cmp.ci_high:.2f}]" for label, cmp in comparisons.items()]
    outcome = c.outcome(threshold)
    rec = "enable" if outcome == "b_faster" else "leave off"
    if rec == "enable":
        head = f"channels_last made {what} {c.ratio:.2f}x faster ({best})"
    elif outcome == "a_faster":
        head = f"channels_last was slower than NCHW at every precision (best {best}: {c.ratio:.2f}x)"
    else:
        head = (f"channels_last gave no speedup of at least {threshold:.2f}x with a {c.confidence:.0%} interval "
                f"above 1 (best {best}: {c.ratio:.2f}x)")
    return {"value": c.ratio, "recommendation": rec, "best": best, "threshold": float(threshold),
            "spread": {"ci_low": c.ci_low, "ci_high": c.ci_high, "confidence": c.confidence},
            "reason": f"{head}; speedup over NCHW by precision: {'; '.join(parts)}",
            "action": Action("memory_format", "channels_last" if rec == "enable" else "contiguous_format",
                             f"channels_last: {rec}", current="contiguous_format")}


def verdict(comparisons: dict[str, Any], *, applicable: bool, why_not: str, fusion: str, context: str,
            what: str = "the conv encoder's forward+backward") -> Verdict:
    """Notebook 07's verdict: :func:`channels_last_decision`'s decision, with the fusion figures in its reason.

    Parameters
    ----------
    comparisons, applicable, why_not
        As :func:`channels_last_decision`.
    fusion : str
        The SDPA and torch.compile results in one sentence (informative; they decide nothing here).
    context : str
        What was measured, in one sentence.
    what : str
        What was timed (see :func:`channels_last_decision`).

    Returns
    -------
    helpers.verdict.Verdict
        metric ``speedup`` (x, NCHW time over channels_last time) of the best precision; action on
        ``memory_format``; ``extra["best"]``: that precision's label, and, with an interval,
        ``extra["decision_threshold"]`` (x).
    """
    v = channels_last_decision(comparisons, applicable=applicable, why_not=why_not, what=what)
    return Verdict(notebook=NOTEBOOK, metric="speedup", value=v["value"], unit="x",
                   recommendation=v["recommendation"], reason=f"{v['reason']}. Fusion: {fusion}", context=context,
                   action=v["action"], spread=v["spread"], extra={"best": v["best"]}
                   | ({"decision_threshold": v["threshold"]} if v["spread"] else {}))


# --------------------------------------------------------------------------- the "try it" panel

#: What each memory-format name is called in a label.
_LABEL = {"nchw": "NCHW", "channels_last": "channels_last"}


def _variant_label(memory_format: str, autocast: str) -> str:
    return f"{_LABEL[memory_format]}, {'fp32' if autocast == 'off' else autocast + ' autocast'}"


def format_comparison(job: Job, acc, *, memory_format: str, autocast: str = "off",
                      images: Sequence[torch.Tensor] | None = None, steps: int, warmup_steps: int, seed: int = 0,
                      progress: Progress = no_progress) -> Comparison:
    """Notebook 07's section 3 for one variant: NCHW in fp32 (A) against ``memory_format`` at ``autocast`` (B).

    The built-in job: its conv encoder (``model.image_encoder``, the job's seeded initial weights) forward and
    backward (:func:`helpers.compute.memory_format.conv_step`), each side cycling over the same fixed batches
    in its own format (the model copy and images converted by
    :func:`helpers.compute.memory_format.to_memory_format`), timed interleaved by :func:`helpers.timing.compare`
    with a device synchronize around each call, ``warmup_steps`` per side excluded. A user's job: its whole
    training step (:func:`helpers.experiments.training.step_options_comparison` with
    ``StepOptions(channels_last=..., autocast_dtype=...)``), as the notebook times it; ``progress`` is then only
    called at the start and the end.

    Parameters
    ----------
    job : helpers.jobs.base.Job
    acc : helpers.device.Accelerator
    memory_format : str
        ``"nchw"`` (``torch.contiguous_format``) or ``"channels_last"`` (NHWC, ``torch.channels_last``).
    autocast : str
        ``"off"`` (float32) or an autocast dtype of ``acc.capabilities.autocast_dtypes`` (``"bfloat16"``,
        ``"float16"``).
    images : sequence of torch.Tensor, optional
        The built-in job's fixed NCHW image batches on the device (the notebook's); default 3 from
        :func:`helpers.experiments.training.fixed_batches`.
    steps, warmup_steps : int
        Timed and untimed calls per side (>= 1 and >= 0).
    seed : int
        Seed of the bootstrap.
    progress : callable
        ``progress(done, total)`` after each call of either side (outside its timing).

    Returns
    -------
    helpers.timing.Comparison
        A = NCHW fp32, B = the variant, seconds per call; ``ratio`` > 1: the variant is faster.

    Raises
    ------
    helpers.errors.ParameterError
        For an unknown memory format, channels_last where the device does not support it (an Ascend NPU), an
        autocast dtype the device does not support, ``steps < 1`` or ``warmup_steps < 0``.
    """
    if memory_format not in FORMATS:
        raise ParameterError(f"memory_format={memory_format!r}; choose one of {', '.join(FORMATS)}")
    if memory_format == "channels_last":
        ok, why = channels_last_status(acc)
        if not ok:
            raise ParameterError(f"channels_last cannot be measured on {acc.kind}: {why}; keep nchw there")
    supported = acc.capabilities.autocast_dtypes
    if autocast != "off" and autocast not in supported:
        raise ParameterError(f"autocast={autocast!r} is not supported on {acc.kind}; choose 'off' or one of: "
                             f"{', '.join(supported) or 'none'}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1 or \
            isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
        raise ParameterError(f"steps must be an int >= 1 and warmup_steps an int >= 0, got steps={steps!r}, "
                             f"warmup_steps={warmup_steps!r}")
    names = ("NCHW fp32", _variant_label(memory_format, autocast))
    dtype = None if autocast == "off" else getattr(torch, autocast)
    if not isinstance(job, PPOJob):  # a user's job: its whole training step, as the notebook times it
        progress(0, 1)
        cmp = step_options_comparison(job, acc, StepOptions(),
                                      StepOptions(autocast_dtype=dtype, channels_last=memory_format == "channels_last"),
                                      steps=steps, warmup_steps=warmup_steps, seed=seed, names=names)
        progress(1, 1)
        return cmp
    if images is None:
        images = [b[0] for b in fixed_batches(job, acc, 3)]
    model = job.make_model(acc)
    encoder, imgs = model.image_encoder, list(images)
    if memory_format == "channels_last":
        cl_model, _ = to_memory_format(model, imgs[0], "channels_last")
        encoder_b, imgs_b = cl_model.image_encoder, [x.contiguous(memory_format=torch.channels_last) for x in imgs]
    else:
        encoder_b, imgs_b = encoder, imgs
    ac = (lambda: acc.autocast(autocast)) if dtype is not None else None

    def cycling(module, xs, autocast_ctx=None):
        fns = itertools.cycle([conv_step(module, x, autocast=autocast_ctx) for x in xs])
        return lambda: next(fns)()

    clock = ProgressClock(progress, warmup=warmup_steps, repeats=steps)
    return compare(clock.wrap(cycling(encoder, imgs)), clock.wrap(cycling(encoder_b, imgs_b, ac)), repeats=steps,
                   warmup=warmup_steps, sync=acc.synchronize, names=names, items_per_call=imgs[0].shape[0],
                   seed=seed, clock=clock)


def live_point(cmp: Comparison, label: str) -> LivePoint:
    """A comparison against NCHW fp32 as a "try it" point: the speedup with its interval.

    Parameters
    ----------
    cmp : helpers.timing.Comparison
        NCHW fp32 as A, the variant as B (notebook 07's ``comparisons["fp32"]``, or :func:`format_comparison`'s).
    label : str
        The variant, e.g. ``"channels_last, fp32"``.

    Returns
    -------
    LivePoint
        metric ``speedup``, unit ``x`` (NCHW fp32 median time over the variant's; > 1: faster), 95% bootstrap
        interval; ``extra``: ``nchw_fp32_s``, ``call_s`` (medians, seconds), ``samples_per_s`` (the variant's)
        and ``calls``.
    """
    rate = cmp.b.rate
    sentence = (f"{label}: {cmp.ratio:.2f}x the speed of NCHW fp32 (95% CI {cmp.ci_low:.2f}-{cmp.ci_high:.2f}); "
                f"{cmp.b.median_s * 1e3:.1f} ms vs {cmp.a.median_s * 1e3:.1f} ms per call"
                + (f", {rate:,.0f} samples/s" if rate else "") + f" ({cmp.b.repeats} interleaved calls each)")
    return LivePoint.from_comparison(label, cmp, metric="speedup", sentence=sentence, nchw_fp32_s=cmp.a.median_s,
                                     call_s=cmp.b.median_s, samples_per_s=rate, calls=cmp.b.repeats)


def try_memory_format(job: Job, acc, *, memory_format: str, autocast: str = "off",
                      images: Sequence[torch.Tensor] | None = None, steps: int = 10, warmup_steps: int = 2,
                      seed: int = 0, progress: Progress = no_progress) -> LivePoint:
    """Notebook 07's timing again for one memory format and precision: how fast is it against NCHW fp32?

    Runs :func:`format_comparison` (the notebook's own interleaved timing of the conv encoder's forward and
    backward, on its fixed batches; a user's job: its whole step) and returns :func:`live_point`. NCHW without
    autocast times NCHW fp32 against itself: the spread of that ratio around 1 is this machine's noise floor.

    Parameters
    ----------
    job : helpers.jobs.base.Job
        The notebook's built-in job or the user's.
    acc : helpers.device.Accelerator
    memory_format : str
        ``"nchw"`` or ``"channels_last"``.
    autocast : str
        ``"off"`` or an autocast dtype the device supports (``"bfloat16"``, ``"float16"``).
    images : sequence of torch.Tensor, optional
        The built-in job's fixed NCHW image batches (the notebook's).
    steps, warmup_steps : int
        Timed and untimed calls per side (>= 1 and >= 0).
    seed : int
        Bootstrap seed.
    progress : callable
        ``progress(done, total)`` after each call.

    Returns
    -------
    LivePoint
        metric ``speedup``, unit ``x`` (NCHW fp32 time / the variant's time, with its 95% bootstrap interval).

    Raises
    ------
    helpers.errors.ParameterError
        As :func:`format_comparison`: an unknown memory format, channels_last on a device without it, an
        unsupported autocast dtype, ``steps < 1`` or ``warmup_steps < 0``.
    """
    cmp = format_comparison(job, acc, memory_format=memory_format, autocast=autocast, images=images, steps=steps,
                            warmup_steps=warmup_steps, seed=seed, progress=progress)
    label = _variant_label(memory_format, autocast) + (" (vs itself)" if (memory_format, autocast) == ("nchw", "off")
                                                       else "")
    return live_point(cmp, label)


# -- the notebook's declaration, found by helpers.experiments.registry ------------------------------------

def _channels_last_default(acc, native_bf16=None) -> tuple[bool, str]:
    """channels_last where no verdict decides it: on CPU and CUDA, never on an NPU (fact-check, section 8)."""
    if acc.kind == "npu":
        return False, "NPU kernels want NCHW: channels_last must not be used there"
    if acc.capabilities.channels_last.available:
        return True, "the conv encoder runs NHWC kernels on this device"
    return False, f"channels_last unavailable: {acc.capabilities.channels_last.detail}"


EXPERIMENT = Experiment(
    item=Item("07", "07_channels_last", "channels_last",
         "Test channels_last and operator fusion on the training model",
         "Does channels_last (NHWC) help the conv encoder here, and what do torch.compile and SDPA give?",
         ("channels_last",)),
    spec=specs.COMMON + specs.DATA + specs.batch() + specs.training("timed training steps per variant") + (
        Param("compile_model", bool, True, "also measure torch.compile of the model (slow to compile)"),
        Param("attention_seq_len", int, 128, "sequence length of the attention comparison", minimum=1,
              maximum=65536),
        Param("attention_heads", int, 4, "heads of the attention comparison", minimum=1, maximum=256),
        Param("attention_head_dim", int, 32, "width of one head in the attention comparison", minimum=1,
              maximum=1024),
    ) + specs.JOB,
    optimizations=(
        Optimization("channels_last", "07_channels_last", ("h2d", "compute"), default=_channels_last_default,
                     apply=lambda plan, settings, acc: replace(plan, options=replace(plan.options, channels_last=True))),
    ),
    interleaved_repeats="steps",
)
