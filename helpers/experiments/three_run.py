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
import math
from dataclasses import dataclass
from typing import Any

from helpers import bottleneck, machine
from helpers.compute.train import TimedLoop
from helpers.conditions import held, ran_with
from helpers.errors import ParameterError
from helpers.experiments.training import clone_batch, prepare_job
from helpers.jobs.base import Job, close_dataset
from helpers.jobs.check import loop_divergence
from helpers.timing import Comparison, Measurement

__all__ = ["RUNS", "CeilingResult", "ThreeRunResult", "copy_share", "exposed_ceiling", "free_input_sentence",
           "input_free_ceiling", "loader_sentence", "spare_cores", "three_run"]

def spare_cores(device_kind: str, other_cpu_share: float | None = None) -> int:
    """Idle cores for DataLoader workers on this machine (:func:`helpers.bottleneck.spare_cores`), with
    torch's intra-op threads as the computation's on a CPU (here, not in notebook 01's module, which runs the
    ceiling of this one: :mod:`helpers.experiments.baseline` re-exports it)."""
    import torch

    return bottleneck.spare_cores(device_kind, compute_threads=torch.get_num_threads() if device_kind == "cpu"
                                  else None, other_cpu_share=other_cpu_share)


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
        :func:`helpers.bottleneck.classify` of that share (one of :data:`helpers.bottleneck.LABELS`).
    ceiling : helpers.timing.Comparison
        real vs synthetic step time: ``ratio`` = how many times faster the job would be with free input.
    loader : helpers.timing.Comparison
        real vs cached: what removing the loader alone (keeping the copy) would give.
    machine : helpers.machine.BusyCheck
        The machine's state over the measurement.
    next_notebook : str
        The notebooks to open next, with why (:meth:`helpers.bottleneck.Bottleneck.next_text`).
    bottleneck : helpers.bottleneck.Bottleneck or None
        The classification those come from (the two levers' savings, the idle cores).
    divergence : helpers.jobs.check.Divergence or None
        Where the loss became NaN or infinite in each run (read from the steps' losses after the runs); when
        it did, the job diverges: :meth:`lines` says so instead of a verdict.
    ran : dict or None
        :func:`helpers.conditions.ran_with` over the interleaved runs (torch threads, batch): all three ran with
        them; None where not stated.
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
    bottleneck: Any = None
    divergence: Any = None
    ran: Any = None

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
        out.append(f"{free_input_sentence(c.ratio, c.ci_low, c.ci_high, exposed=self.exposed_fraction)}; "
                   f"{loader_sentence((ld.ratio, ld.ci_low, ld.ci_high), (c.ratio, c.ci_low, c.ci_high))}")
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
                "bottleneck": self.bottleneck.as_dict() if self.bottleneck is not None else None,
                "machine": self.machine.as_dict(), "ran_with": dict(self.ran) if self.ran is not None else None}


def exposed_ceiling(exposed_fraction: float) -> float:
    """The most that free input can give a serial step whose exposed input is that share: 1 / (1 - exposed).

    Returns ``inf`` for an exposed share of 1 (a step that is all waiting)."""
    return math.inf if exposed_fraction >= 1.0 else 1.0 / (1.0 - float(exposed_fraction))


def free_input_sentence(ratio: float, ci_low: float, ci_high: float, *, exposed: float | None = None) -> str:
    """The input-free ceiling (real / synthetic step time, with its 95% interval) in words, reconciled with the
    exposed share.

    A serial step whose exposed input is X of it can be at most 1 / (1 - X) times faster with free input
    (:func:`exposed_ceiling`). A measured ratio above that whose interval still reaches it is the same within
    noise and is said so, capped at that figure; one whose interval lies above it is said with its cause (the
    input's work also slows the computation); an interval that reaches 1 is no measured speedup.

    Parameters
    ----------
    ratio, ci_low, ci_high : float
        Real / synthetic median step time and its 95% interval.
    exposed : float, optional
        The real run's exposed input share, 0..1 (None: not reconciled).

    Returns
    -------
    str
    """
    ci = f"95% CI {ci_low:.2f}-{ci_high:.2f}"
    if not ci_low > 1.0:  # an interval that reaches 1 is no measured gain: never print "N x faster" for it
        return f"free input would give no measurable speedup ({ratio:.2f}x real / synthetic, {ci})"
    cap = exposed_ceiling(exposed) if exposed is not None else math.inf
    if ratio > cap and ci_low <= cap:
        return (f"with free input this job would be about {cap:.2f}x faster, what its {exposed:.0%} exposed input "
                f"allows (measured {ratio:.2f}x real / synthetic, {ci}: the same within noise)")
    if ratio > cap:
        return (f"with free input this job would be {ratio:.2f}x faster (real / synthetic, {ci}), more than the "
                f"{cap:.2f}x its {exposed:.0%} exposed input alone allows: the input's work also slows the "
                "computation (shared cores, caches)")
    return f"with free input this job would be {ratio:.2f}x faster (real / synthetic, {ci})"


def loader_sentence(loader: tuple[float, float, float], ceiling: tuple[float, float, float]) -> str:
    """What removing the loader's work alone gives (real / cached), reconciled with the input-free ceiling.

    The cached run still copies its batches, so it cannot be faster than the synthetic one: a real / cached
    ratio above real / synthetic is noise when the two intervals overlap ("the same as free input, within
    noise"), and a run-to-run difference of the machine when they do not (said so, not printed as a gain).

    Parameters
    ----------
    loader, ceiling : (ratio, ci_low, ci_high)
        Real / cached and real / synthetic median step time ratios with their 95% intervals.

    Returns
    -------
    str
    """
    r, lo, hi = loader
    c, c_lo, c_hi = ceiling
    figures = f"{r:.2f}x real / cached, 95% CI {lo:.2f}-{hi:.2f}"
    if r > c and lo <= c_hi:
        return (f"with its loader's work removed but the copy kept, the same as free input, within noise ({figures}; "
                f"free input {c:.2f}x, 95% CI {c_lo:.2f}-{c_hi:.2f}): the copy costs nothing measurable")
    if r > c:
        return (f"with its loader's work removed but the copy kept, faster than with free input ({figures}; free "
                f"input {c:.2f}x, 95% CI {c_lo:.2f}-{c_hi:.2f}), which a run that still copies cannot be: the "
                "machine's speed changed between the runs; read the two as the same and rerun when it is quiet")
    return f"with its loader's work removed but the copy kept, {r:.2f}x (real / cached, 95% CI {lo:.2f}-{hi:.2f})"


def copy_share(real: float, cached: float, synthetic: float) -> float | None:
    """The copy's share of the input's cost from the three runs' median step times (any one unit):
    (cached - synthetic) / (real - synthetic), clipped to 0..1; None when the real run is not slower than the
    synthetic one."""
    total = real - synthetic
    if not total > 0:
        return None
    return min(1.0, max(0.0, (cached - synthetic) / total))


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
    ran : dict or None
        :func:`helpers.conditions.ran_with` over the interleaved runs (torch threads, batch): both ran with them;
        None where not stated.
    """

    job: str
    steps: dict
    ceiling: Any
    machine: Any
    ran: Any = None

    @property
    def fraction(self) -> tuple[float, float, float]:
        """The job's throughput as a fraction of its ceiling's: ``(value, ci_low, ci_high)`` (1 / the ratio)."""
        return self.ceiling.inverse()

    def sentence(self, exposed: float | None = None) -> str:
        """"with free input this job would be 2.68x faster (real / synthetic, 95% CI 2.42-2.96): it runs at 37%
        of its input-free ceiling (95% CI 34-41%)", or "no measurable speedup" when the interval reaches 1;
        with ``exposed`` (the exposed input share, 0..1) reconciled with it (:func:`free_input_sentence`)."""
        c = self.ceiling
        f, lo, hi = self.fraction
        # a share of the ceiling is at most 100%: a run that loads its input cannot beat the same steps without it,
        # so the interval is shown within 0-100% (the ratio's own interval, in the first clause, is not cut)
        at = f"it runs at {f:.0%} of its input-free ceiling (95% CI {max(lo, 0.0):.0%}-{min(hi, 1.0):.0%})"
        if f > 1.0:  # faster than its own ceiling: noise when the interval reaches 100%, else the machine changed
            at = (f"it runs at its input-free ceiling, within noise (95% CI from {lo:.0%} to 100%)"
                  if lo <= 1.0 else
                  f"it measured faster than its input-free ceiling ({f:.0%}, 95% CI {lo:.0%}-{hi:.0%}), which a run "
                  "that still loads its input cannot be: the machine's speed changed between the runs")
        return f"{free_input_sentence(c.ratio, c.ci_low, c.ci_high, exposed=exposed)}: {at}"


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
    ran = ran_with(job.workload.batch_size)  # read as the runs start, held to their end
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
                         ceiling=Comparison.from_measurements(meas["real"], meas["synthetic"]), machine=check,
                         ran=held(ran))


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
    ran = ran_with(job.workload.batch_size)  # read as the runs start, held to their end
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
    med = {name: float(frames[name]["step_s"].median()) for name in RUNS}
    real = frames["real"]
    compute = (float((real["compute"] / real["step_s"]).median()) if "compute" in real else None)  # measured
    b = bottleneck.classify(exposed, threshold, device_kind=acc.kind,
                            spare_cores=spare_cores(acc.kind, check.other_cpu_share),
                            copy_share=copy_share(med["real"], med["cached"], med["synthetic"]),
                            compute_fraction=None if compute is None else min(1.0, max(0.0, compute)))
    return ThreeRunResult(job=job.describe().get("job", job.name), steps=frames, exposed_fraction=exposed,
                          recommendation=b.label, reason=b.reason, ceiling=ceiling, loader=loader, machine=check,
                          next_notebook=b.next_text(), bottleneck=b, divergence=divergence, ran=held(ran))
