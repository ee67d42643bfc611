"""Notebook 07's experiment: does channels_last (NHWC) speed up the job's conv encoder here, and what do fused
attention and torch.compile give?

:func:`run` measures it all in the notebook's order (with :mod:`helpers.compute.memory_format` and
:mod:`helpers.compute.fusion`) and returns a :class:`ChannelsLastResult`, which makes the notebook's records, its
verdict and its "try it" panel:

- sections 1 and 2: the built-in job's fixed batches, the layout of every 4-D output of its conv encoder in
  channels_last, and the encoder's output in both layouts at each precision (asserted equal within tolerance);
- section 3: NCHW against channels_last at fp32 and under autocast, interleaved: the built-in job's conv
  encoder forward and backward, or a user's whole training step (:func:`helpers.experiments.training.
  step_options_comparison`); a user's model without a 2-D convolution is "not applicable";
- sections 4 and 5: SDPA against attention written out, and torch.compile's first call and steady state (the
  built-in policy);
- :func:`verdict` (:func:`channels_last_decision`): enable channels_last, leave it off, or not applicable.

The "try it" panel calls :func:`try_memory_format`: one variant (memory format, autocast) timed against NCHW in
fp32 by the notebook's own interleaved encoder timing (:func:`format_comparison`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

import pandas as pd
import torch

from helpers import specs
from helpers.checklist import Item
from helpers.compute.memory_format import (FORMATS, FormatTrace, channels_last_status, conv_step, max_abs_diff,
                                           output_tolerance, to_memory_format, trace_memory_format)
from helpers.conditions import held, ran_with, sides
from helpers.errors import ParameterError
from helpers.experiments.base import Experiment, ExperimentResult, Optimization, checked_fields
from helpers.experiments.training import fixed_batches, step_options_comparison
from helpers.jobs.base import Job, StepOptions, description_text
from helpers.live import Knob, LivePoint, Progress, TrySpec, no_progress
from helpers.params import Param
from helpers.results import Records
from helpers.timing import Comparison, ProgressClock, compare
from helpers.verdict import Action, Verdict


__all__ = ["NOTEBOOK", "AttentionOutcome", "ChannelsLastChecks", "ChannelsLastResult", "CompileOutcome",
           "channels_last_decision", "check", "format_comparison", "live_point", "run", "try_memory_format", "verdict"]

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
    elif outcome == "a_faster":  # the best is measurably slower; each other precision as measured
        by = {o: [k for k, m in comparisons.items() if m.outcome(threshold) == o]
              for o in ("a_faster", "below_threshold", "no_difference")}
        head = (f"channels_last was slower than NCHW in {' and '.join(by['a_faster'])}"
                + (f"; slower by less than {threshold:.2f}x in {' and '.join(by['below_threshold'])}"
                   if by["below_threshold"] else "")
                + (f"; no measurable difference in {' and '.join(by['no_difference'])}" if by["no_difference"] else "")
                + f" (best {best}: {c.ratio:.2f}x)")
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
    model = job.make_model(acc)
    encoder = job.image_encoder(model)
    if encoder is None:  # a user's job: its whole training step, as the notebook times it
        del model
        progress(0, 1)
        cmp = step_options_comparison(job, acc, StepOptions(),
                                      StepOptions(autocast_dtype=dtype, channels_last=memory_format == "channels_last"),
                                      steps=steps, warmup_steps=warmup_steps, seed=seed, names=names)
        progress(1, 1)
        return cmp
    if images is None:
        images = [b[0] for b in fixed_batches(job, acc, 3)]
    imgs = list(images)
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


# --------------------------------------------------------------------------- the notebook's run

#: What the timing of section 3 times, per kind of job (the verdict's ``what``).
_WHAT = {True: "the conv encoder's forward+backward", False: "your job's training step"}


@dataclass(frozen=True)
class AttentionOutcome:
    """Section 4: fused attention (SDPA) against attention written out, on one masked input.

    Attributes
    ----------
    shape : tuple of int
        ``(batch, heads, sequence, head_dim)`` of q, k and v (float32, 25% padded keys in every other sample).
    max_abs_diff : float
        Largest ``|SDPA - manual|`` over the output.
    comparison : helpers.timing.Comparison
        Manual attention (A) against SDPA (B), forward only, interleaved; ``ratio`` > 1: SDPA is faster.
    """

    shape: tuple[int, ...]
    max_abs_diff: float
    comparison: Comparison


@dataclass(frozen=True)
class CompileOutcome:
    """Section 5: ``torch.compile`` of the built-in policy's forward and backward, or why it was not measured.

    Attributes
    ----------
    status : str
        ``"measured"``, ``"skipped"`` (``compile_model`` False) or ``"failed"`` (compiling or the first call
        raised; :func:`helpers.compute.fusion.try_compile`).
    why : str
        The reason when not measured (the error text when failed), else empty.
    first_call_s : float or None
        Seconds of the first call, compilation included (measured only).
    max_abs_diff : float or None
        Largest difference of the compiled logits and value from eager mode (measured only).
    comparison : helpers.timing.Comparison or None
        Eager (A) against compiled (B) steady state, interleaved on the fixed batches (measured only).
    """

    status: str
    why: str = ""
    first_call_s: float | None = None
    max_abs_diff: float | None = None
    comparison: Comparison | None = None


@dataclass(frozen=True, eq=False)
class ChannelsLastChecks:
    """Notebook 07 before any timing (:func:`check`): the fixed batches, the layout trace, channels_last's outputs
    against NCHW and SDPA's against the hand-written attention, each asserted. :class:`ChannelsLastResult` extends it
    with the measurement.

    Attributes
    ----------
    job : helpers.jobs.base.Job
        The job section 3 timed (the built-in one or the user's); the "try it" panel times it again.
    device, device_name : str
        The accelerator's kind and name.
    n_images : int
        Images of the built-in job's dataset.
    images : tuple of torch.Tensor
        The built-in job's fixed NCHW image batches on the device (the panel's, for the built-in job).
    conv_channels : tuple of int
        The built-in policy's conv stages.
    job_description : dict
        ``job.describe()`` of a user's job (empty for the built-in job).
    user_convs : int or None
        ``nn.Conv2d`` layers in a user's model; None for the built-in job.
    device_applicable, device_why : bool, str
        Whether the device runs channels_last (:func:`helpers.compute.memory_format.channels_last_status`).
    applicable, why_not : bool, str
        Whether section 3 measured channels_last, and why not (the device's reason, or a user's model without a
        2-D convolution).
    trace : helpers.compute.memory_format.FormatTrace or None
        The layout of every 4-D output of the built-in conv encoder in channels_last (None where not applicable).
    correctness : tuple of (str, float, float, float)
        Per precision (``"float32"``, then the autocast dtype), ``(dtype, max_abs_diff, rtol, atol)`` of the
        encoder's channels_last output against NCHW; empty where not applicable.
    low : str or None
        The autocast dtype measured besides fp32 (``"bfloat16"``, ``"float16"``), None without one.
    sdpa_max_abs_diff : float or None
        Largest ``|SDPA - manual|`` over the masked attention's output (asserted within 1e-4).
    builtin, batches, model, cl_model, attention_inputs
        What :func:`run` times next: the built-in job, its fixed ``(images, tokens)`` batches on the device, its
        policy in NCHW and in channels_last (None where not applicable), and the attention's ``(q, k, v, mask)``
        (keyword-only, None in a result built by hand).
    """

    job: Job = field(repr=False)
    device: str
    device_name: str
    n_images: int
    images: tuple[torch.Tensor, ...] = field(repr=False)
    conv_channels: tuple[int, ...]
    job_description: Mapping[str, Any]
    user_convs: int | None
    device_applicable: bool
    device_why: str
    applicable: bool
    why_not: str
    trace: FormatTrace | None
    correctness: tuple[tuple[str, float, float, float], ...]
    low: str | None
    sdpa_max_abs_diff: float | None = field(default=None, kw_only=True)
    builtin: Job | None = field(default=None, repr=False, kw_only=True)
    batches: tuple[tuple[torch.Tensor, torch.Tensor], ...] | None = field(default=None, repr=False, kw_only=True)
    model: Any = field(default=None, repr=False, kw_only=True)
    cl_model: Any = field(default=None, repr=False, kw_only=True)
    attention_inputs: tuple[torch.Tensor, ...] | None = field(default=None, repr=False, kw_only=True)

    @property
    def batch_shape(self) -> tuple[int, ...]:
        """The built-in job's fixed batch, ``(N, C, H, W)``."""
        return tuple(self.images[0].shape)

    def batches_text(self) -> str:
        """Section 1: the images, the fixed batches on the device and, with a user's job, its model's convs."""
        lines = [f"{self.n_images} images; {len(self.images)} fixed batch(es) of shape {self.batch_shape} "
                 f"(float32, NCHW) kept on {self.device}"]
        if self.user_convs is not None:
            lines.append(f"your job: {description_text(self.job_description)}; {self.user_convs} nn.Conv2d layer(s) in its model "
                         "(the demonstrations of sections 2, 4 and 5 use the built-in job above)")
        return "\n".join(lines)

    def trace_table(self) -> pd.DataFrame:
        """Section 2: each 4-D output of the channels_last conv encoder (layer, kind, shape, channels_last); where
        channels_last does not apply, one row that says why."""
        if self.trace is None:
            return pd.DataFrame([{"channels_last": f"not measured on {self.device}", "why": self.device_why}])
        return pd.DataFrame(self.trace.rows())

    def trace_text(self) -> str:
        """Section 2: how many 4-D outputs kept channels_last, and which dropped it."""
        if self.trace is None:
            return "channels_last: not applicable on this device"
        return (f"4-D outputs in the conv encoder: {len(self.trace.layers)}; channels_last kept by "
                f"{len(self.trace.kept)}; dropped by: {', '.join(self.trace.dropped) or 'none'}")

    def correctness_text(self) -> str:
        """Section 2: the largest difference of the channels_last output from NCHW, per precision."""
        if not self.correctness:
            return f"channels_last not measured on {self.device}: {self.device_why}"
        fp32 = f"max |channels_last - NCHW|: fp32 {self.correctness[0][1]:.2e}"
        if len(self.correctness) > 1:
            return fp32 + f", {self.low} autocast {self.correctness[1][1]:.2e}"
        return fp32 + f" (no autocast dtype on {self.device})"

    def match_text(self) -> str:
        """Section 2: the precisions whose outputs matched NCHW within their tolerance (:func:`check` asserts it)."""
        if not self.correctness:
            return "channels_last: not applicable on this device"
        return "channels_last outputs equal NCHW within the tolerance of: " + ", ".join(d for d, *_ in self.correctness)

    def sdpa_text(self) -> str:
        """Section 4: SDPA equals the hand-written attention (:func:`check` asserts it)."""
        return "SDPA equals the hand-written attention (with a padding mask) within 1e-4: True"


@dataclass(frozen=True, eq=False)
class ChannelsLastResult(ChannelsLastChecks, ExperimentResult):
    """Notebook 07's measurement: the fixed batches, the layout trace, the outputs, NCHW against channels_last at
    each precision, fused attention and ``torch.compile``.

    Sections 2, 4 and 5 always use the built-in job (its policy and fixed batches); section 3 and the verdict
    measure :attr:`job`, the built-in job's conv encoder or a user's whole training step.

    Attributes
    ----------
    job, device, device_name, n_images, images, conv_channels, job_description, user_convs, device_applicable,
    device_why, applicable, why_not, trace, correctness, low
        As :class:`ChannelsLastChecks`'s (sections 1, 2 and the SDPA check, with their texts).
    settings : dict
        The parameters the sentences name: ``steps``, ``warmup_steps``, ``seed``, ``job`` (the user's job's spec,
        empty for the built-in job).
    comparisons : dict of str to helpers.timing.Comparison
        Section 3: per precision label (``"fp32"``, ``"bfloat16 autocast"``) NCHW (A) against channels_last (B).
    cudnn_benchmark : bool
        ``torch.backends.cudnn.benchmark`` while timing (PyTorch's default: the workbook never sets it).
    cpu_bf16 : dict or None
        :func:`helpers.diagnose.environment.cpu_bf16_support` on a CPU, else None.
    attention : AttentionOutcome
    compiled : CompileOutcome
    ran : dict or None
        :func:`helpers.conditions.ran_with` over every timed comparison (torch threads, batch): both sides of each ran
        with them; None where not stated.
    """

    settings: Mapping[str, Any]
    comparisons: Mapping[str, Comparison]
    cudnn_benchmark: bool
    cpu_bf16: Mapping[str, Any] | None
    attention: AttentionOutcome
    compiled: CompileOutcome
    ran: Mapping[str, Any] | None = None

    # -- what the cells print (sections 1 and 2: ChannelsLastChecks) ---------------------------------------------

    def timing_text(self) -> str:
        """Section 3: NCHW against channels_last per precision; for the built-in job, cuDNN's benchmark flag and a
        CPU's native bf16."""
        if not self.applicable:
            if self.device_applicable:  # the device runs it; a user's model has nothing it reorders
                return f"channels_last: not applicable to your job: {self.why_not}"
            return f"channels_last not measured on {self.device}: {self.why_not}"
        per = "forward+backward" if self.job.is_builtin else "training step of your job"
        lines = [f"{label}: NCHW {c.a.median_s * 1e3:.1f} ms, channels_last {c.b.median_s * 1e3:.1f} ms per {per}; "
                 f"{c.verdict_text()}" for label, c in self.comparisons.items()]
        if self.job.is_builtin:
            lines.append(f"torch.backends.cudnn.benchmark = {self.cudnn_benchmark} (the workbook leaves PyTorch's "
                         "default)")
            if self.cpu_bf16 is not None:
                lines.append(f"CPU native bf16: {self.cpu_bf16['native_bf16']} ({self.cpu_bf16['detail']})")
        return "\n".join(lines)

    def attention_text(self) -> str:
        """Section 4: the input, the difference and the two times."""
        a, c = self.attention, self.attention.comparison
        return "\n".join([f"q, k, v of shape {a.shape}, float32, 25% padded keys in every other sample; "
                          f"max |SDPA - manual| = {a.max_abs_diff:.2e}",
                          f"manual {c.a.median_s * 1e3:.2f} ms, SDPA {c.b.median_s * 1e3:.2f} ms; {c.verdict_text()}"])

    def compile_text(self) -> str:
        """Section 5: the first call and the steady state, or why torch.compile was not measured."""
        k = self.compiled
        if k.status != "measured":
            return f"torch.compile {k.status}: {k.why}"
        c = k.comparison
        lines = [f"first call (compilation included): {k.first_call_s:.1f} s (Inductor caches compiled code on disk, "
                 f"so this is the cold cost only on the first run on this machine); logits and value match eager, "
                 f"max diff {k.max_abs_diff:.1e}",
                 f"steady state per forward+backward: eager {c.a.median_s * 1e3:.1f} ms, compiled "
                 f"{c.b.median_s * 1e3:.1f} ms; {c.verdict_text()}"]
        saved = c.a.median_s - c.b.median_s
        if saved > 0:
            lines.append(f"the compilation pays for itself after about {k.first_call_s / saved:.0f} steps")
        return "\n".join(lines)

    def speedups(self) -> dict[str, Comparison]:
        """Section 6's figure: every speedup measured, by label (channels_last per precision, SDPA, compiled)."""
        shown = {f"channels_last vs NCHW ({k})": c for k, c in self.comparisons.items()}
        shown["SDPA vs manual attention"] = self.attention.comparison
        if self.compiled.comparison is not None:
            shown["compiled vs eager (steady state)"] = self.compiled.comparison
        return shown

    def speedups_title(self) -> str:
        """The figure's title."""
        return f"Speedups on {self.device}, {self.settings['steps']} timed calls each"

    # -- records, verdict and the panel ----------------------------------------------------------

    def records(self) -> Records:
        """The fixed batches, the layout trace, the outputs per precision, NCHW against channels_last per
        precision, SDPA (its difference and its speedup), then torch.compile (or why it was not measured); each
        comparison with the torch threads and batch both sides ran with (:func:`helpers.conditions.sides`)."""
        out, alike = Records(), sides(self.ran, self.ran)
        out.add("dataset", "fixed batches", "batches", len(self.images), "batches", images=self.n_images,
                batch_shape=list(self.batch_shape))
        if self.trace is not None:
            out.add("memory_format", "channels_last trace", "layers_kept", len(self.trace.kept), "layers",
                    layers=len(self.trace.layers), dropped=list(self.trace.dropped))
        else:
            out.add("memory_format", "channels_last trace", "layers_kept", None, "layers",
                    recommendation="not applicable", reason=self.device_why)
        for dtype, diff, rtol, atol in self.correctness:
            label = "fp32" if dtype == "float32" else f"{dtype} autocast"
            out.add("correctness", f"channels_last vs NCHW ({label})", "max_abs_diff", diff, "1", rtol=rtol, atol=atol)
        for label, c in self.comparisons.items():
            out.add_comparison("channels_last", c, precision=label,
                               **({} if self.job.is_builtin else {"job": self.settings["job"]}), **alike)
        a = self.attention
        out.add("correctness", "SDPA vs manual attention", "max_abs_diff", a.max_abs_diff, "1", shape=list(a.shape))
        out.add_comparison("attention", a.comparison, max_abs_diff=a.max_abs_diff, **alike)
        k = self.compiled
        if k.status == "measured":
            out.add("correctness", "compiled vs eager", "max_abs_diff", k.max_abs_diff, "1")
            out.add("compile", "torch.compile", "first_call_time", k.first_call_s, "s")
            out.add_comparison("compile", k.comparison, first_call_s=k.first_call_s, max_abs_diff=k.max_abs_diff,
                               **alike)
        else:
            out.add("compile", "torch.compile", "first_call_time", None, "s", recommendation="not applicable",
                    reason=k.why)
        return out

    def fusion_text(self) -> str:
        """SDPA's and torch.compile's results in one sentence (the verdict's reason ends with it)."""
        a, k = self.attention, self.compiled
        text = f"SDPA vs manual attention {a.comparison.ratio:.2f}x (max diff {a.max_abs_diff:.1e})"
        if k.status == "measured":
            return text + (f"; torch.compile {k.comparison.ratio:.2f}x in steady state after a {k.first_call_s:.0f} s "
                           "first call")
        return text + f"; torch.compile {k.status} ({k.why})"

    @property
    def context(self) -> str:
        """What was measured, in the verdict's one sentence."""
        s = self.settings
        if self.job.is_builtin:
            measured = (f"conv encoder {self.conv_channels} forward+backward on {len(self.images)} fixed batches of "
                        f"{self.batch_shape}")
        else:
            measured = f"your job's training step ({description_text(self.job_description)}) on 4 fixed batches"
        return (f"{measured}, {s['steps']} timed calls after {s['warmup_steps']} warm-up per variant; attention "
                f"{self.attention.shape}{'' if self.job.is_builtin else ' (built-in job)'}; on {self.device} "
                f"({self.device_name})")

    def verdict(self) -> Verdict:
        """Notebook 07's verdict (:func:`verdict`): channels_last's best precision, with the fusion figures."""
        return verdict(self.comparisons, applicable=self.applicable, why_not=self.why_not, fusion=self.fusion_text(),
                       context=self.context, what=_WHAT[self.job.is_builtin])

    def try_it(self, acc, params: Mapping[str, Any]) -> TrySpec:
        """The "try it" panel: one memory format and precision against NCHW fp32 (:func:`try_memory_format`, the
        built-in job's encoder on its fixed batches, a user's job its whole step), beside this notebook's
        channels_last-vs-NCHW fp32 result.

        Parameters
        ----------
        acc : helpers.device.Accelerator
        params : mapping
            The notebook's parameters (``steps`` and ``warmup_steps``, capped at 10 and 2 for the panel, and
            ``seed``).
        """
        knobs = {"memory_format": Knob((("contiguous (NCHW)", "nchw"), ("channels_last (NHWC)", "channels_last")),
                                       "channels_last", "format"),
                 "autocast": Knob(tuple((d, d) for d in ("off", *acc.capabilities.autocast_dtypes)), "off",
                                  "autocast")}
        job, images = self.job, list(self.images)
        steps, warmup, seed = min(params["steps"], 10), min(params["warmup_steps"], 2), params["seed"]
        return TrySpec("memory format and autocast against NCHW fp32",
                       lambda progress, **k: try_memory_format(job, acc, images=images, steps=steps,
                                                               warmup_steps=warmup, seed=seed, progress=progress, **k),
                       knobs,
                       reference=live_point(self.comparisons["fp32"], "channels_last, fp32") if self.applicable
                       else None,
                       unavailable="" if self.applicable else (
                           f"{self.why_not}; channels_last applies to models with 2-D convolutions on CPUs (oneDNN) "
                           "and CUDA GPUs (cuDNN)"))


def _cycling(module, images, autocast=None):
    """One call of ``conv_step`` per call, cycling over ``images``."""
    fns = itertools.cycle([conv_step(module, x, autocast=autocast) for x in images])
    return lambda: next(fns)()


def _correctness(acc, model, cl_model, images0, cl_images0,
                 low: str | None) -> tuple[tuple[str, float, float, float], ...]:
    """The encoder's channels_last output against NCHW, fp32 and (with ``low``) under autocast; asserts each."""
    ref = conv_step(model.image_encoder, images0, backward=False)()
    out = conv_step(cl_model.image_encoder, cl_images0, backward=False)()
    tf32 = acc.kind == "cuda" and torch.backends.cudnn.allow_tf32  # cuDNN may run fp32 convs in TF32
    rtol, atol = output_tolerance(torch.float32, tf32=tf32)
    found = [("float32", max_abs_diff(out, ref), rtol, atol)]
    torch.testing.assert_close(out, ref, rtol=rtol, atol=atol)
    if low is not None:
        ac = lambda: acc.autocast(low)  # noqa: E731
        ref_low = conv_step(model.image_encoder, images0, backward=False, autocast=ac)()
        out_low = conv_step(cl_model.image_encoder, cl_images0, backward=False, autocast=ac)()
        rtol_l, atol_l = output_tolerance(getattr(torch, low))
        found.append((low, max_abs_diff(out_low, ref_low), rtol_l, atol_l))
        torch.testing.assert_close(out_low.float(), ref_low.float(), rtol=rtol_l, atol=atol_l)
    return tuple(found)


def _precision_comparisons(job: Job, acc, model, cl_model, images: Sequence[torch.Tensor], low: str | None, *,
                           steps: int, warmup_steps: int, seed: int, batch_size: int) -> dict[str, Comparison]:
    """Section 3: NCHW (A) against channels_last (B) at fp32 and at ``low`` autocast, interleaved.

    The built-in job: its conv encoder's forward and backward on the fixed batches (each side in its own format).
    A user's job: its whole training step (:func:`helpers.experiments.training.step_options_comparison`).
    """
    out = {}
    variants = [("fp32", None)] + ([(f"{low} autocast", low)] if low else [])
    if not job.is_builtin:  # a user's job: its whole step, NCHW against channels_last
        for label, dtype in variants:
            ac = getattr(torch, dtype) if dtype else None
            out[label] = step_options_comparison(job, acc, StepOptions(autocast_dtype=ac),
                                                 StepOptions(autocast_dtype=ac, channels_last=True), steps=steps,
                                                 warmup_steps=warmup_steps, seed=seed,
                                                 names=(f"NCHW {label}", f"channels_last {label}"))
        return out
    nchw = list(images)
    cl = [x.contiguous(memory_format=torch.channels_last) for x in nchw]
    for label, dtype in variants:
        ac = (lambda d=dtype: acc.autocast(d)) if dtype else None
        out[label] = compare(_cycling(model.image_encoder, nchw, ac), _cycling(cl_model.image_encoder, cl, ac),
                             repeats=steps, warmup=warmup_steps,
                             sync=acc.synchronize, names=(f"NCHW {label}", f"channels_last {label}"),
                             items_per_call=batch_size, seed=seed)
    return out


def _attention_check(acc, P: Mapping[str, Any]) -> tuple[tuple[torch.Tensor, ...], float]:
    """Section 4's check: SDPA against attention written out, with a key-padding mask, asserted within 1e-4;
    returns ``((q, k, v, mask), max |SDPA - manual|)``."""
    from helpers.compute.fusion import attention_inputs, fused_attention, manual_attention

    q, k, v, mask = attention_inputs(P["batch_size"], P["attention_heads"], P["attention_seq_len"],
                                     P["attention_head_dim"], pad_fraction=0.25, device=acc.device, seed=P["seed"])
    diff = max_abs_diff(fused_attention(q, k, v, mask), manual_attention(q, k, v, mask))
    torch.testing.assert_close(fused_attention(q, k, v, mask), manual_attention(q, k, v, mask), rtol=1e-4, atol=1e-4)
    return (q, k, v, mask), diff


def _attention(acc, P: Mapping[str, Any], checks: "ChannelsLastChecks") -> AttentionOutcome:
    """Section 4: SDPA against attention written out on :func:`check`'s masked input, timed interleaved."""
    from helpers.compute.fusion import fused_attention, manual_attention

    q, k, v, mask = checks.attention_inputs
    with torch.no_grad():
        cmp = compare(lambda: manual_attention(q, k, v, mask), lambda: fused_attention(q, k, v, mask),
                      repeats=P["steps"], warmup=P["warmup_steps"], sync=acc.synchronize,
                      names=("manual attention", "SDPA"), seed=P["seed"])
    return AttentionOutcome(tuple(q.shape), checks.sdpa_max_abs_diff, cmp)


def _compile(acc, model, batches: Sequence[tuple[torch.Tensor, torch.Tensor]], P: Mapping[str, Any]) -> CompileOutcome:
    """Section 5: torch.compile of the policy's forward and backward: the first call, the outputs against eager
    (asserted) and the steady state against eager, interleaved; a failure is returned, not raised."""
    from helpers.compute.fusion import try_compile

    if not P["compile_model"]:
        return CompileOutcome("skipped", "compile_model is False")

    def fwd_bwd(m, x, t):
        model.zero_grad(set_to_none=True)
        logits, value = m(x, t)
        (logits.float().sum() + value.float().sum()).backward()
        return logits.detach(), value.detach()

    images0, tokens0 = batches[0]
    with torch.no_grad():
        eager_out = model(images0, tokens0)
    res = try_compile(model, lambda c: fwd_bwd(c, images0, tokens0), sync=acc.synchronize)
    if not res.ok:
        return CompileOutcome("failed", res.error)
    got = res.first_output
    diff = max(max_abs_diff(got[0], eager_out[0]), max_abs_diff(got[1], eager_out[1]))
    torch.testing.assert_close(got[0], eager_out[0], rtol=1e-3, atol=1e-4)  # policy logits
    torch.testing.assert_close(got[1], eager_out[1], rtol=1e-3, atol=1e-4)  # value
    eager_fns = itertools.cycle([(lambda x=x, t=t: fwd_bwd(model, x, t)) for x, t in batches])
    comp_fns = itertools.cycle([(lambda x=x, t=t: fwd_bwd(res.compiled, x, t)) for x, t in batches])
    cmp = compare(lambda: next(eager_fns)(), lambda: next(comp_fns)(), repeats=P["steps"], warmup=P["warmup_steps"],
                  sync=acc.synchronize, names=("eager", "compiled"), items_per_call=P["batch_size"], seed=P["seed"])
    return CompileOutcome("measured", first_call_s=res.first_call_s, max_abs_diff=diff, comparison=cmp)


def _conv2d_count(model: torch.nn.Module) -> int:
    return sum(isinstance(m, torch.nn.Conv2d) for m in model.modules())


def check(ctx: Any) -> ChannelsLastChecks:
    """Notebook 07 before any timing, in the notebook's order: the fixed batches, the layout trace and the outputs
    (the built-in policy), and SDPA against the hand-written attention; seconds where :func:`run` takes minutes.

    Parameters
    ----------
    ctx : helpers.workbook.nbsetup.NotebookContext
        The notebook's context: its parameters (the workload, ``seed``, ``attention_*``, ``job``), accelerator and
        job (``ctx.job()``).

    Returns
    -------
    ChannelsLastChecks

    Raises
    ------
    AssertionError
        If channels_last's output or SDPA's differs from its reference beyond tolerance.
    """
    from helpers.jobs.ppo import PPOJob

    P, acc = ctx.params, ctx.acc
    builtin = PPOJob.from_params(dict(P))  # the built-in job at this notebook's workload (sections 2, 4 and 5)
    batches = tuple((images, tokens) for images, tokens, _ in fixed_batches(builtin, acc, 3))  # on the device, NCHW
    job = ctx.job() if P.get("job") else builtin  # a user's job sets P["batch_size"] to its own
    convs = None if job.is_builtin else _conv2d_count(job.make_model(acc))
    device_ok, device_why = channels_last_status(acc)
    model = builtin.make_model(acc)  # NCHW, seeded from the workload
    images0, _ = batches[0]
    trace, correctness, cl_model = None, (), None
    ac_dtypes = acc.capabilities.autocast_dtypes
    low = "bfloat16" if "bfloat16" in ac_dtypes else ("float16" if "float16" in ac_dtypes else None)
    if device_ok:
        cl_model, cl_images0 = to_memory_format(model, images0, "channels_last")
        trace = trace_memory_format(cl_model.image_encoder, cl_images0)
        correctness = _correctness(acc, model, cl_model, images0, cl_images0, low)
    applicable, why_not = device_ok, device_why
    if applicable and convs == 0:
        applicable, why_not = False, ("your model has no 2-D convolution (nn.Conv2d): channels_last reorders only "
                                      "4-D tensors, for convolution kernels that read NHWC")
    attention_inputs, sdpa_diff = _attention_check(acc, P)
    return ChannelsLastChecks(
        job=job, device=acc.kind, device_name=acc.name, n_images=builtin.item_count(),
        images=tuple(x for x, _ in batches), conv_channels=tuple(builtin.policy_config().conv_channels),
        job_description={} if job.is_builtin else job.describe(), user_convs=convs, device_applicable=device_ok,
        device_why=device_why, applicable=applicable, why_not=why_not, trace=trace, correctness=correctness, low=low,
        sdpa_max_abs_diff=sdpa_diff, builtin=builtin, batches=batches, model=model, cl_model=cl_model,
        attention_inputs=attention_inputs)


def run(ctx: Any, checks: ChannelsLastChecks | None = None) -> ChannelsLastResult:
    """Notebook 07's experiment, in the notebook's order: :func:`check` (the fixed batches, the layout trace, the
    outputs), NCHW against channels_last at each precision (the job: the built-in encoder or a user's whole step),
    fused attention and torch.compile (the built-in policy).

    Parameters
    ----------
    ctx : helpers.workbook.nbsetup.NotebookContext
        The notebook's context: its parameters (the workload, ``steps``, ``warmup_steps``, ``seed``,
        ``compile_model``, ``attention_*``, ``job``), accelerator and job (``ctx.job()``).
    checks : ChannelsLastChecks, optional
        :func:`check`'s result (the notebook shows it before the timing starts); None checks here.

    Returns
    -------
    ChannelsLastResult

    Raises
    ------
    AssertionError
        If channels_last's output, SDPA's or the compiled model's differs from its reference beyond tolerance.
    """
    from helpers.diagnose.environment import cpu_bf16_support

    P, acc = ctx.params, ctx.acc
    c = checks if checks is not None else check(ctx)
    ran = ran_with(P["batch_size"])  # read as the timing starts, held to its end
    comparisons = (_precision_comparisons(c.job, acc, c.model, c.cl_model, list(c.images), c.low,
                                          steps=P["steps"], warmup_steps=P["warmup_steps"], seed=P["seed"],
                                          batch_size=P["batch_size"]) if c.applicable else {})
    attention = _attention(acc, P, c)
    compiled = _compile(acc, c.model, list(c.batches), P)
    return ChannelsLastResult(
        **checked_fields(c), settings={k: P.get(k) for k in ("steps", "warmup_steps", "seed", "job")},
        comparisons=comparisons, cudnn_benchmark=bool(torch.backends.cudnn.benchmark),
        cpu_bf16=cpu_bf16_support() if acc.is_cpu and c.applicable and c.job.is_builtin else None,
        attention=attention, compiled=compiled, ran=held(ran))


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
