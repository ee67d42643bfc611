"""The quick answer for any job: the host-bound verdict and a three-run test of its input's cost.

After DS-Analyzer's differential approach (Mohan et al., "Analyzing and Mitigating Data Stalls in DNN
Training", VLDB 2021, arXiv 2007.06775): run the same training steps three ways and read the input's cost
from the differences, instead of from a profile.

1. **real**: the job as it is, batches from its loader (files read, decoded, collated) then copied;
2. **cached**: the same steps on host batches made by one pass of the loader and kept in memory, then
   copied: no reading, no decoding, no collation; what remains is the copy and the computation;
3. **synthetic**: the same batches already on the device: the step alone, the *input-free ceiling* of
   this job on this machine.

DS-Analyzer's second run caches the raw data (so it still pays the decode); this one caches whole
batches, because a user's dataset does not separate reading from decoding. So here ``real - cached`` is
the whole loader's exposed cost, ``cached - synthetic`` the copy's, and ``real / synthetic`` how much
faster the job would be with free input.

The three runs take turns in blocks of steps (order reversed every round), each step's phases closed by a
device synchronize (:class:`helpers.compute.train.TimedLoop`), warm-up excluded; the ratios carry 95%
bootstrap intervals over the steps; the machine's state is checked beside them (:mod:`helpers.machine`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from helpers import checklist, machine
from helpers.compute.train import TimedLoop
from helpers.errors import ParameterError
from helpers.experiments.baseline import classify
from helpers.experiments.training import clone_batch, prepare_job
from helpers.jobs.base import Job, close_dataset
from helpers.jobs.check import loop_divergence
from helpers.timing import Comparison, Measurement

__all__ = ["RUNS", "CeilingResult", "ThreeRunResult", "input_free_ceiling", "three_run", "next_notebook"]

#: The three runs, in the order they are reported.
RUNS: tuple[str, str, str] = ("real", "cached", "synthetic")


@dataclass(frozen=True)
class ThreeRunResult:
    """The three runs of one job and what they say.

    Attributes
    ----------
    job : str
        The job's name.
    steps : dict of str to pandas.DataFrame
        Per run (:data:`RUNS`), one row per measured step: ``data``, ``h2d``, ``compute``, ``step_s`` (seconds).
    exposed_fraction : float
        The real run's median per-step share of exposed input (data + h2d) in the step (as notebook 01).
    recommendation, reason : str
        :func:`helpers.experiments.baseline.classify` of that share ("host-bound" / "device-bound").
    ceiling : helpers.timing.Comparison
        real vs synthetic step time: ``ratio`` = how many times faster the job would be with free input.
    loader : helpers.timing.Comparison
        real vs cached: what removing the loader alone (keeping the copy) would give.
    machine : helpers.machine.BusyCheck
        The machine's state over the measurement.
    next_notebook : str
        The notebook to open next, with why (:func:`next_notebook`).
    divergence : helpers.jobs.check.Divergence or None
        Where the loss became NaN or infinite in each run (read from the steps' losses after the runs); when
        it did, the job diverges: :meth:`lines` says so instead of a verdict.
    """

    job: str
    steps: dict
    exposed_fraction: float
    recommendation: str
    reason: str
    ceiling: Any
    loader: Any
    machine: Any
    next_notebook: str
    divergence: Any = None

    @property
    def diverged(self) -> bool:
        """Whether the job's loss became NaN or infinite in any of the runs."""
        return self.divergence is not None and self.divergence.diverged

    def median_ms(self, run: str) -> float:
        """Median step time of one run, ms."""
        return float(self.steps[run]["step_s"].median()) * 1e3

    def lines(self) -> list[str]:
        """What ``diagnose`` prints: the verdict, the three runs, the ceiling, the next notebook, the machine."""
        if self.diverged:  # the timings are of a job that no longer trains: no verdict from them
            return [f"job: {self.job}", self.divergence.sentence(), f"machine: {self.machine.sentence()}"]
        busy = self.machine.busy
        head = ("inconclusive: " + self.machine.sentence() + "; what it measured: " if busy else "")
        out = [f"job: {self.job}",
               f"{head}{self.recommendation}: {self.reason}"]
        for run in RUNS:
            df = self.steps[run]
            out.append(f"  {run:<9} step {self.median_ms(run):8.1f} ms (IQR {df['step_s'].quantile(0.25) * 1e3:.1f}-"
                       f"{df['step_s'].quantile(0.75) * 1e3:.1f}; data {df['data'].median() * 1e3:.1f}, h2d "
                       f"{df['h2d'].median() * 1e3:.1f}, compute {df['compute'].median() * 1e3:.1f} ms)")
        c, ld = self.ceiling, self.loader
        if c.ci_low > 1.0:
            free = (f"with free input this job would be {c.ratio:.2f}x faster (real / synthetic, 95% CI "
                    f"{c.ci_low:.2f}-{c.ci_high:.2f})")
        else:  # an interval that reaches 1 is no measured gain: never print "N x faster" for it
            free = (f"free input would give no measurable speedup ({c.ratio:.2f}x real / synthetic, 95% CI "
                    f"{c.ci_low:.2f}-{c.ci_high:.2f})")
        out.append(f"{free}; with its loader's work removed but the copy kept, {ld.ratio:.2f}x (real / cached, "
                   f"95% CI {ld.ci_low:.2f}-{ld.ci_high:.2f})")
        out.append(f"next: {self.next_notebook}")
        out.append(f"machine: {self.machine.sentence()}")
        return out

    def as_dict(self) -> dict[str, Any]:
        """JSON-able figures (``diagnose --json``)."""
        def cmp(c: Comparison) -> dict:
            return {"ratio": c.ratio, "ci_low": c.ci_low, "ci_high": c.ci_high}

        return {"job": self.job,
                "recommendation": "inconclusive" if self.machine.busy or self.diverged else self.recommendation,
                "divergence": self.divergence.as_dict() if self.diverged else None,
                "measured_recommendation": self.recommendation, "reason": self.reason,
                "exposed_input_fraction": self.exposed_fraction,
                "step_ms": {r: self.median_ms(r) for r in RUNS}, "free_input_speedup": cmp(self.ceiling),
                "no_loader_speedup": cmp(self.loader), "next_notebook": self.next_notebook,
                "machine": self.machine.as_dict()}


def next_notebook(recommendation: str, loader_ratio: float, ceiling_ratio: float, *, device_kind: str) -> str:
    """The notebook to open next for the three runs' figures, with the reason."""
    nb = checklist.notebook_ref
    if recommendation == "host-bound":
        if loader_ratio >= 0.9 * ceiling_ratio or device_kind == "cpu":
            return (f"{nb('DataLoader tuning')}: the loader's work is most of the input's cost (removing it gives "
                    f"{loader_ratio:.2f}x of the {ceiling_ratio:.2f}x free input would); then make each sample "
                    f"cheaper ({nb('batched decode')} shows how for images)")
        return (f"{nb('pinned memory')} and {nb('stream overlap')}: the copy is a large part of the input's cost "
                f"(without the loader {loader_ratio:.2f}x, with free input {ceiling_ratio:.2f}x)")
    return f"{nb('mixed precision')}: the step is the computation; device-side optimizations pay off first"


def _host_batches(job: Job, n: int, pipeline: str) -> list:
    dataset = job.make_dataset(pipeline)
    try:
        sampler = job.batch_sampler(len(dataset))
        return [clone_batch(dataset[idx]) for idx in itertools.islice(sampler, n)]
    finally:
        close_dataset(dataset)


def _check_counts(**counts: tuple[int, int]) -> None:
    for name, (value, low) in counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ParameterError(f"{name} must be an int >= {low}, got {value!r}")


def _interleave(loops: dict, *, steps: int, warmup_steps: int, block: int, progress=None) -> dict:
    """Warm each loop up, then run them in rotating blocks (order reversed every round); their step frames.

    ``progress(done, total)`` is called after every step of every loop (outside its timing)."""
    order = list(loops)
    for name in order:
        loops[name].run(warmup_steps, measured=False, progress=progress).discard()
    done, rnd = 0, 0
    while done < steps:
        n = min(block, steps - done)
        for name in (order if rnd % 2 == 0 else order[::-1]):
            loops[name].run(n, progress=progress)
        done += n
        rnd += 1
    return {name: loops[name].steps_frame() for name in order}


@dataclass(frozen=True)
class CeilingResult:
    """A job against its input-free ceiling: the same steps on batches already on the device.

    Attributes
    ----------
    job : str
    steps : dict of str to pandas.DataFrame
        ``"real"`` and ``"synthetic"``: one row per measured step (``data``, ``h2d``, ``compute``, ``step_s``).
    ceiling : helpers.timing.Comparison
        A = real, B = synthetic step times: ``ratio`` = how many times faster the job would be with free input.
    machine : helpers.machine.BusyCheck
    """

    job: str
    steps: dict
    ceiling: Any
    machine: Any

    @property
    def fraction(self) -> tuple[float, float, float]:
        """The job's throughput as a fraction of its ceiling's: ``(value, ci_low, ci_high)`` (1 / the ratio)."""
        return self.ceiling.inverse()

    def sentence(self) -> str:
        """"with free input this job would be 2.68x faster (real / synthetic step, 95% CI 2.42-2.96): it runs
        at 37% of its input-free ceiling (95% CI 34-41%)", or "no measurable speedup" when the interval reaches 1."""
        c = self.ceiling
        f, lo, hi = self.fraction
        at = f"it runs at {f:.0%} of its input-free ceiling (95% CI {lo:.0%}-{hi:.0%})"
        if c.ci_low > 1.0:
            return (f"with free input this job would be {c.ratio:.2f}x faster (real / synthetic step, 95% CI "
                    f"{c.ci_low:.2f}-{c.ci_high:.2f}): {at}")
        return (f"free input would give no measurable speedup ({c.ratio:.2f}x real / synthetic, 95% CI "
                f"{c.ci_low:.2f}-{c.ci_high:.2f}): {at}")


def input_free_ceiling(job: Job, acc, *, steps: int = 20, warmup_steps: int = 3, block: int = 2,
                       cache_batches: int = 8, pipeline: str | None = None, loader: Any = None,
                       options: Any = None, progress: Any = None) -> CeilingResult:
    """The job as it is against the same steps on batches already on the device, interleaved.

    The synthetic run is the input-free ceiling of this job on this machine: the first ``cache_batches``
    batches of the real loader's order, copied to the device once and cycled, with the same step (same model
    initialization, precision and memory format); no loading, no copy.

    Parameters
    ----------
    job : helpers.jobs.base.Job
    acc : helpers.device.Accelerator
    steps, warmup_steps, block, cache_batches : int
        As :func:`three_run`.
    pipeline : str, optional
        The job's input pipeline (default its first).
    loader : helpers.pipeline.loader.LoaderConfig, optional
        The real run's loader (default ``num_workers=0``).
    options : helpers.jobs.base.StepOptions, optional
        The step's options, for both runs.
    progress : callable, optional
        ``progress(done, total)`` after every step of either run, warm-up included
        (``2 * (warmup_steps + steps)`` calls), e.g. :func:`helpers.workbook.progress.progress_bar`'s.

    Returns
    -------
    CeilingResult

    Raises
    ------
    ParameterError
        Bad counts (before any work).
    """
    from helpers.jobs.base import StepOptions

    _check_counts(steps=(steps, 3), warmup_steps=(warmup_steps, 0), block=(block, 1),
                  cache_batches=(cache_batches, 1))
    options = options or StepOptions()
    pipeline = pipeline or job.pipelines[0]
    before = machine.snapshot()
    real = prepare_job(job, acc, pipeline=pipeline, loader=loader, options=options)
    try:
        host = _host_batches(job, cache_batches, pipeline)
        device = [clone_batch(job.to_device(b, acc, options=options)) for b in host]
        acc.synchronize()
        step = job.make_step(job.make_model(acc, options), acc, options)
        loops = {"real": real.loop, "synthetic": TimedLoop(itertools.cycle(device), lambda b: b, step,
                                                           acc.synchronize)}
        frames = _interleave(loops, steps=steps, warmup_steps=warmup_steps, block=block, progress=progress)
    finally:
        real.close()
    check = machine.check(before, machine.snapshot())
    meas = {n: Measurement(n, tuple(float(x) for x in frames[n]["step_s"]), warmup_steps) for n in frames}
    return CeilingResult(job=job.describe().get("job", job.name), steps=frames,
                         ceiling=Comparison.from_measurements(meas["real"], meas["synthetic"]), machine=check)


def three_run(job: Job, acc, *, steps: int = 20, warmup_steps: int = 3, block: int = 2, cache_batches: int = 8,
              threshold: float = 0.10) -> ThreeRunResult:
    """Run the three-run test on ``job`` (see the module notes).

    Parameters
    ----------
    job : helpers.jobs.base.Job
    acc : helpers.device.Accelerator
    steps : int, default 20
        Measured steps per run (>= 3).
    warmup_steps : int, default 3
        Untimed steps per run first (>= 0).
    block : int, default 2
        Steps per run per turn of the rotation.
    cache_batches : int, default 8
        Host batches kept for the cached and synthetic runs (>= 1; bounded memory: the runs cycle over them).
    threshold : float, default 0.10
        Exposed-input share above which the job is host-bound (notebook 01's ``host_bound_threshold``).

    Returns
    -------
    ThreeRunResult

    Raises
    ------
    ParameterError
        Bad counts or threshold (before any work); the job's own errors (see :mod:`helpers.jobs.supervised`).
    """
    _check_counts(steps=(steps, 3), warmup_steps=(warmup_steps, 0), block=(block, 1),
                  cache_batches=(cache_batches, 1))
    if not 0.0 < float(threshold) < 1.0:
        raise ParameterError(f"threshold must be in (0, 1), got {threshold!r}")
    pipeline = job.pipelines[0]
    before = machine.snapshot()
    real = prepare_job(job, acc, pipeline=pipeline)
    loops = {"real": real.loop}
    try:
        host = _host_batches(job, cache_batches, pipeline)
        device = [clone_batch(job.to_device(b, acc)) for b in host]
        acc.synchronize()
        for name, batches, to_dev in (("cached", host, lambda b: job.to_device(b, acc)),
                                      ("synthetic", device, lambda b: b)):
            step = job.make_step(job.make_model(acc), acc)
            loops[name] = TimedLoop(itertools.cycle(batches), to_dev, step, acc.synchronize)
        frames = _interleave({name: loops[name] for name in RUNS}, steps=steps, warmup_steps=warmup_steps,
                             block=block)
    finally:
        real.close()
    check = machine.check(before, machine.snapshot())
    divergence = loop_divergence({f"the {name} run": loops[name] for name in RUNS})
    meas = {name: Measurement(name, tuple(float(x) for x in frames[name]["step_s"]), warmup_steps) for name in RUNS}
    ceiling = Comparison.from_measurements(meas["real"], meas["synthetic"])
    loader = Comparison.from_measurements(meas["real"], meas["cached"])
    exposed = float(frames["real"]["exposed_fraction"].median())
    rec, reason = classify(exposed, threshold, device_kind=acc.kind)
    return ThreeRunResult(job=job.describe().get("job", job.name), steps=frames, exposed_fraction=exposed,
                          recommendation=rec, reason=reason, ceiling=ceiling, loader=loader, machine=check,
                          next_notebook=next_notebook(rec, loader.ratio, ceiling.ratio, device_kind=acc.kind),
                          divergence=divergence)
