"""Notebook 01's experiment: the baseline job's phase breakdown and its host-bound verdict.

The job is timed by the one loop (:func:`helpers.experiments.training.prepare_job`);
:func:`classify` calls it host-bound, balanced or device-bound (:mod:`helpers.bottleneck`) from the share
of the step in which the computation waits for input, and :func:`verdict` returns
that decision as a :class:`helpers.verdict.Verdict` with the figures it rests on.
"""

from __future__ import annotations

from typing import Any, Mapping

from helpers import bottleneck
from helpers import specs
from helpers.checklist import PHASES
from helpers.checklist import Item
from helpers.compute.train import TrainRun
from helpers.experiments.base import Experiment
from helpers.live import LivePoint, Progress, no_progress
from helpers.params import Param
from helpers.timing import Measurement
from helpers.verdict import Verdict


__all__ = ["NOTEBOOK", "classify", "spare_cores", "verdict", "live_point", "try_baseline"]

NOTEBOOK = "01_baseline_profiling"


def classify(exposed_fraction: float, threshold: float, *, device_kind: str = "") -> tuple[str, str]:
    """Call a job host-bound, balanced or device-bound from its exposed input share.

    The label and sentence of :func:`helpers.bottleneck.classify` (the one rule, shared with ``diagnose``,
    the instrument and the report): with input at X of a serial step, removing it saves X, a 2x faster
    compute saves (1-X)/2; at or below the threshold the job is device-bound, above it host-bound when the
    input is the larger lever (X >= 1/3), else balanced.

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
    b = bottleneck.classify(exposed_fraction, threshold, device_kind=device_kind)
    return b.label, b.reason


def spare_cores(device_kind: str, other_cpu_share: float | None = None) -> int:
    """Idle cores for DataLoader workers on this machine (:func:`helpers.bottleneck.spare_cores`), with
    torch's intra-op threads as the computation's on a CPU."""
    import torch

    return bottleneck.spare_cores(device_kind, compute_threads=torch.get_num_threads() if device_kind == "cpu"
                                  else None, other_cpu_share=other_cpu_share)


def verdict(run: TrainRun, per_image: Measurement | None, *, threshold: float, device_kind: str,
            description: Mapping[str, Any], steps: int, ceiling: Any = None) -> Verdict:
    """Notebook 01's verdict: host-bound, balanced or device-bound, with the phase medians it rests on.

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
    b = bottleneck.classify(run.exposed_fraction, threshold, device_kind=device_kind,
                            spare_cores=spare_cores(device_kind),
                            copy_share=med["h2d"] / exposed_s if exposed_s > 0 else None)
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
        what = ", ".join(f"{k} {v}" for k, v in d.items() if k != "job")
        context = (f"{d.get('job', 'job')} ({what}), its own loader as given (num_workers=0), {steps} measured steps "
                   f"on {device_kind}")
    reason += f"; next: {b.next_text()}"
    context += "; exposed input = time the step waits for data and the host-to-device copy"
    fractions = Measurement(name="exposed", times_s=tuple(run.steps["exposed_fraction"]), warmup=run.warmup_steps)
    phases = {c: {"median_s": float(run.steps[c].median()), "p25_s": float(run.steps[c].quantile(0.25)),
                  "p75_s": float(run.steps[c].quantile(0.75))} for c in (*PHASES, "step_s")}
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
