"""Timed training of a Job: what the experiments that train share (notebook 01's timed job; 06 and 07's fixed batches; the learning gate of 06 and 10).

:func:`time_job` builds the job's input (one pipeline, one validated loader
configuration), model and step, and runs them in the one phase-timed loop
(:class:`helpers.compute.train.TimedLoop`): data, h2d and compute, each
closed by a device synchronize, warm-up excluded.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch

from helpers.compute.amp import tail_relative_difference
from helpers.compute.train import TimedLoop, TrainRun, epochs
from helpers.errors import ParameterError
from helpers.jobs.base import Job, StepOptions, close_dataset
from helpers.pipeline.loader import LoaderConfig, close_loader

__all__ = ["BatchAgreement", "LearningCheck", "TimedJob", "batch_agreement", "clone_batch", "fixed_batches",
           "learning_check", "loss_curve", "percent", "prepare_job", "same_structure", "same_values",
           "step_options_comparison", "time_job"]


@dataclass
class TimedJob:
    """A job made ready to step: its dataset, loader, model, step function and the timed loop.

    Attributes
    ----------
    job : Job
    dataset, loader : the job's input
    model : torch.nn.Module
    step : callable
        ``step(device_batch) -> stats``.
    loop : helpers.compute.train.TimedLoop
    options : StepOptions
    """

    job: Job
    dataset: Any
    loader: Any
    model: Any
    step: Any
    loop: TimedLoop
    options: StepOptions

    def close(self) -> None:
        """Stop the loader's workers and release the dataset's threads."""
        close_loader(self.loader)
        close_dataset(self.dataset)


def _pipeline(job: Job, pipeline: str | None, default: str) -> str:
    name = pipeline or default
    if name not in job.pipelines:
        raise ParameterError(f"pipeline={name!r}; {job.name} offers: {', '.join(job.pipelines)}")
    return name


def prepare_job(job: Job, acc, *, pipeline: str | None = None, loader: LoaderConfig | None = None,
                options: StepOptions = StepOptions(), non_blocking: bool = False,
                dataset_options: Mapping[str, Any] | None = None) -> TimedJob:
    """Build the job's dataset, loader, model and step, and a :class:`TimedLoop` over them.

    Parameters
    ----------
    job : Job
    acc : helpers.device.Accelerator
    pipeline : str, optional
        One of ``job.pipelines`` (default: the first, the job as it is).
    loader : LoaderConfig, optional
        Default: ``num_workers=0`` with the workload's batch size and seed.
    options : StepOptions
        Precision and memory format of the step.
    non_blocking : bool
        Copy batches to the device with ``non_blocking``.
    dataset_options : mapping, optional
        Keyword arguments of ``job.make_dataset`` (e.g. ``{"threads": 2}``).

    Raises
    ------
    ParameterError
        If ``pipeline`` is not one of ``job.pipelines`` or the loader's batch size is not the workload's.
    """
    w = job.workload
    cfg = loader or LoaderConfig(batch_size=w.batch_size, num_workers=0, seed=w.seed)
    dataset = job.make_dataset(_pipeline(job, pipeline, job.pipelines[0]), **dict(dataset_options or {}))
    sampler = job.batch_sampler(len(dataset))
    dl = job.make_loader(dataset, cfg, acc, batch_sampler=sampler)
    model = job.make_model(acc, options)
    step = job.make_step(model, acc, options)
    loop = TimedLoop(epochs(dl, datasets=[dataset, sampler]),
                     lambda batch: job.to_device(batch, acc, non_blocking=non_blocking, options=options),
                     step, acc.synchronize)
    return TimedJob(job, dataset, dl, model, step, loop, options)


def time_job(job: Job, acc, *, steps: int, warmup_steps: int = 2, **kwargs: Any) -> TrainRun:
    """Run ``warmup_steps`` untimed and ``steps`` timed training steps of ``job``; the options of :func:`prepare_job`.

    Returns
    -------
    helpers.compute.train.TrainRun
        Per-step phase times (seconds) and statistics of the measured steps.

    Raises
    ------
    ParameterError
        ``steps < 1`` or ``warmup_steps < 0`` (before any work).
    """
    if steps < 1 or warmup_steps < 0:
        raise ParameterError(f"steps must be >= 1 and warmup_steps >= 0, got steps={steps}, "
                             f"warmup_steps={warmup_steps}")
    timed = prepare_job(job, acc, **kwargs)
    try:
        return timed.loop.run(warmup_steps, measured=False).discard().run(steps).result()
    finally:
        timed.close()


def fixed_batches(job: Job, acc, n: int, *, pipeline: str | None = None, epoch: int = 0,
                  options: StepOptions = StepOptions()) -> list:
    """The first ``n`` batches of one epoch of ``job``, on the device, kept for repeated timing.

    Notebooks 06, 07 and the DDP variants time the step alone on such fixed
    batches, so that the input pipeline is not part of the comparison.

    Parameters
    ----------
    job : Job
    acc : helpers.device.Accelerator
    n : int
        Batches (>= 1; fewer when the epoch has fewer).
    pipeline : str, optional
        Default: the job's last pipeline (for the built-in job, ``"batched"``).
    epoch : int
        Epoch of the batch order and augmentations.

    Returns
    -------
    list
        Device batches as ``job.to_device`` returns them, their tensors cloned (the pipeline may reuse its
        buffers): tuples, lists and dicts of tensors are cloned element by element.

    Raises
    ------
    ParameterError
        If ``n < 1`` or ``pipeline`` is not one of ``job.pipelines``.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ParameterError(f"n must be an int >= 1, got {n!r}")
    dataset = job.make_dataset(_pipeline(job, pipeline, job.pipelines[-1]))
    try:
        if hasattr(dataset, "set_epoch"):
            dataset.set_epoch(epoch)
        sampler = job.batch_sampler(len(dataset))
        sampler.set_epoch(epoch)
        out = []
        for indices in itertools.islice(sampler, n):
            out.append(clone_batch(job.to_device(dataset[indices], acc, options=options)))
        return out
    finally:
        close_dataset(dataset)


def clone_batch(batch: Any) -> Any:
    """A copy of a (nested) batch whose tensors are cloned: tuples, lists and dicts element by element, other
    values as they are. Pipelines may reuse their buffers; a batch kept for later must own its memory."""
    if isinstance(batch, torch.Tensor):
        return batch.clone()
    if isinstance(batch, (tuple, list)):
        return type(batch)(clone_batch(b) for b in batch)
    if isinstance(batch, Mapping):
        return {k: clone_batch(v) for k, v in batch.items()}
    return batch


def same_values(a: Any, b: Any, *, exact: bool = True) -> bool:
    """Whether two (nested) batches hold the same values: tuples, lists and dicts element by element.

    Tensors must have the same shape; ``exact`` also asks for the same dtype and bit-equal values, while
    ``exact=False`` compares floating-point values with ``torch.allclose`` (a copy in another memory format or
    on another device, or rounded once) and ignores the device. Other values compare with ``==``.
    """
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.shape != b.shape:
            return False
        if exact:
            return a.dtype == b.dtype and bool(torch.equal(a, b))
        x, y = a.detach().cpu(), b.detach().cpu()
        return bool(torch.allclose(x.float(), y.float())) if x.is_floating_point() else bool(torch.equal(x, y))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(same_values(a[k], b[k], exact=exact) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_values(x, y, exact=exact) for x, y in zip(a, b))
    return a == b


def same_structure(a: Any, b: Any) -> bool:
    """Whether two (nested) batches agree in everything a random augmentation cannot change.

    The same nesting and keys; every tensor of the same shape and dtype; integer and boolean tensors (labels,
    token ids, masks) and non-tensor values equal. Floating-point values are not compared.
    """
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        return True if a.is_floating_point() or a.is_complex() else bool(torch.equal(a.cpu(), b.cpu()))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(same_structure(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_structure(x, y) for x, y in zip(a, b))
    return a == b


@dataclass(frozen=True)
class BatchAgreement:
    """How two configurations' batches of one job agree (:func:`batch_agreement`).

    Attributes
    ----------
    identical : bool
        Every batch bit-identical (the workbook's per-sample seeds made the augmentations the same).
    structure_equal : bool
        Every batch the same in order, labels, shapes and dtypes (:func:`same_structure`).
    reproducible : bool
        Reading the same batch twice in one process gives the same values.
    """

    identical: bool
    structure_equal: bool
    reproducible: bool

    @property
    def ok(self) -> bool:
        """The batches agree as far as the job allows: identical, or (the job's augmentations cannot be
        reproduced) the same order, labels, shapes and dtypes."""
        return self.identical or (not self.reproducible and self.structure_equal)

    def sentence(self) -> str:
        """What was compared and what it showed, in words."""
        if self.identical:
            return "identical values"
        if self.ok:
            return ("the same order, labels, shapes and dtypes; the augmented values themselves differ because "
                    "your dataset draws its randomness from a source the workbook cannot seed (not random, "
                    "numpy.random, torch's generator or an RNG object the dataset holds, e.g. a new unseeded "
                    "np.random.default_rng() per call), so the values could not be compared")
        if not self.structure_equal:
            return "DIFFERENT batches (order, labels, shapes or dtypes differ)"
        return "DIFFERENT values although your dataset gives the same values when read twice"


def batch_agreement(a: Sequence[Any], b: Sequence[Any], reread: Any = None) -> BatchAgreement:
    """Compare two lists of batches of one job (two configurations), allowing for unseedable augmentations.

    Parameters
    ----------
    a, b : sequence of batches
        The same batches (same indices, same epoch) from two configurations.
    reread : callable, optional
        ``reread() -> batch``: the first batch read again in this process; when it differs from ``a[0]`` the
        job's augmentations are not reproducible and only :func:`same_structure` is asked of the two. None:
        reproducible.

    Returns
    -------
    BatchAgreement
    """
    pairs = list(zip(a, b))
    identical = len(a) == len(b) and all(same_values(x, y) for x, y in pairs)
    structure = len(a) == len(b) and all(same_structure(x, y) for x, y in pairs)
    reproducible = True
    if not identical and reread is not None and len(a):
        reproducible = same_values(a[0], reread())
    return BatchAgreement(identical=identical, structure_equal=structure, reproducible=reproducible)


# --------------------------------------------------------------------------- the same learning


@dataclass(frozen=True)
class LearningCheck:
    """Whether two jobs learned the same: their tail mean losses close on the loss's own scale, no NaN.

    Attributes
    ----------
    rel_diff : float
        ``|mean(opt tail) - mean(base tail)| / scale`` (inf with a NaN).
    tolerance : float
    tail : int
        Steps averaged at the end (and at the start, for the decrease).
    no_nan : bool
    ok : bool
        ``no_nan and rel_diff <= tolerance``.
    steps : int
    loss_name : str
    abs_diff : float
        ``|mean(opt tail) - mean(base tail)|``, in the loss's units.
    level : float
        The baseline's tail mean (its final loss level).
    decrease : float
        ``|mean(base head) - mean(base tail)|``: how far the baseline's loss moved over the run.
    scale : float
        ``max(level, decrease)``: the loss's scale over the run (see :func:`learning_check`).
    """

    rel_diff: float
    tolerance: float
    tail: int
    no_nan: bool
    ok: bool
    steps: int = 0
    loss_name: str = "value loss"
    abs_diff: float = math.nan
    level: float = math.nan
    decrease: float = math.nan
    scale: float = math.nan

    def percent(self) -> str:
        """``rel_diff`` as a percentage with two significant digits (e.g. ``"0.12%"``, ``"3.1%"``)."""
        return percent(self.rel_diff)

    def sentence(self) -> str:
        """E.g. "numerical agreement on identical batches over 30 steps: mean loss of the last 5 steps 0.012 from
        the baseline's, 0.57% of the loss's scale over the run (the larger of its final level 0.26 and its decrease
        2.1), within tolerance (10%), no NaN (...)"."""
        if not self.no_nan:
            return "a loss was NaN or infinite: the optimized job does not compute like the baseline"
        word = "within tolerance" if self.ok else "OUTSIDE the tolerance"
        over = f" over {self.steps} steps" if self.steps else ""
        if math.isfinite(self.scale):
            which = "its decrease" if self.decrease > self.level else "its final level"
            how = (f"{self.abs_diff:.3g} from the baseline's, {self.percent()} of the loss's scale over the run "
                   f"({which}: final level {self.level:.3g}, decrease {self.decrease:.3g})")
        else:
            how = f"{self.percent()} from the baseline's"
        return (f"numerical agreement on identical batches{over}: mean {self.loss_name} of the last {self.tail} steps "
                f"{how}, {word} ({self.tolerance:.0%}), no NaN (this checks that both jobs compute the same, not "
                f"that they converge)")


def percent(fraction: float) -> str:
    """A fraction as a percentage with two significant digits: 0.00123 -> ``"0.12%"``, 0.031 -> ``"3.1%"``."""
    if not math.isfinite(fraction):
        return "inf%"
    pct = 100.0 * fraction
    if pct == 0:
        return "0%"
    digits = max(0, 1 - int(math.floor(math.log10(abs(pct)))))
    return f"{pct:.{digits}f}%"


def learning_check(base_losses: Sequence[float], opt_losses: Sequence[float], tolerance: float, *,
                   tail: int | None = None, loss_name: str = "value loss") -> LearningCheck:
    """Gate "same learning": two loss curves on identical batches agree, on the loss's own scale.

    Notebook 06 (mixed precision against fp32) and notebook 10 (the optimized
    job against the baseline) both decide with this one function. The tail
    means' difference is divided by the loss's scale over the run: the larger
    of the baseline's final level and how far its loss moved (head mean minus
    tail mean). A loss that stays near one level is compared with that level
    (the relative tail difference of :func:`helpers.compute.amp.tail_relative_difference`);
    a loss that training drives towards zero (a classifier fitting its fixed
    batches: 2.4 down to 0.26 in 30 steps on the image example) is compared
    with how far it came, since two correct trajectories that reach 0.26 and
    0.24 learned the same, while a broken one (one that does not learn, or
    learns far slower) is off by most of the decrease.

    Parameters
    ----------
    base_losses, opt_losses : sequence of float
        Value loss per step (same length >= 2), baseline and optimized.
    tolerance : float
        Largest allowed relative difference of the tail means (>= 0).
    tail : int, optional
        Steps averaged; default ``max(1, min(5, len // 3))`` (notebook 06's).
    loss_name : str, default "value loss"
        What the curves are, for the sentence (the built-in job's value loss; a user's job's ``"loss"``).

    Returns
    -------
    LearningCheck

    Raises
    ------
    ParameterError
        Different lengths or fewer than 2 values.
    """
    base, opt = [float(v) for v in base_losses], [float(v) for v in opt_losses]
    if len(base) != len(opt) or len(base) < 2:
        raise ParameterError(f"need two loss curves of equal length >= 2; got {len(base)} and {len(opt)}")
    tail = tail or max(1, min(5, len(base) // 3))
    no_nan = all(math.isfinite(v) for v in base + opt)
    if not no_nan:
        return LearningCheck(rel_diff=math.inf, tolerance=float(tolerance), tail=tail, no_nan=False, ok=False,
                             steps=len(base), loss_name=loss_name)
    level = sum(base[-tail:]) / tail
    decrease = abs(sum(base[:tail]) / tail - level)
    abs_diff = abs(sum(opt[-tail:]) / tail - level)
    scale = max(abs(level), decrease)
    if not scale > 0:
        rel = tail_relative_difference(base, opt, tail)  # raises: a loss identically zero has no scale
    else:
        rel = abs_diff / scale
    return LearningCheck(rel_diff=rel, tolerance=float(tolerance), tail=tail, no_nan=True,
                         ok=rel <= tolerance, steps=len(base), loss_name=loss_name, abs_diff=abs_diff,
                         level=level, decrease=decrease, scale=scale)


# --------------------------------------------------------------------------- a step under two sets of options


def step_options_comparison(job: Job, acc, a: StepOptions, b: StepOptions, *, steps: int, warmup_steps: int,
                            n_batches: int = 4, seed: int = 0, names: tuple[str, str] = ("A", "B")):
    """Time ``job``'s training step with options ``a`` against ``b`` on fixed device batches, interleaved.

    Each side gets its own fixed batches (:func:`fixed_batches` with its options: channels_last changes
    the batch's memory format), its own model (same seed: same initial weights) and step, and cycles over
    its batches; :func:`helpers.timing.compare` runs them A B B A with a device synchronize around each
    step and gives the ratio of medians with a bootstrap interval. The input pipeline is not timed.

    Parameters
    ----------
    job : Job
    acc : helpers.device.Accelerator
    a, b : StepOptions
        E.g. fp32 against ``StepOptions(autocast_dtype=torch.bfloat16)``.
    steps, warmup_steps : int
        Timed and untimed steps per side.
    n_batches : int
        Fixed batches per side (>= 1).
    seed : int
        Bootstrap seed.
    names : (str, str)

    Returns
    -------
    helpers.timing.Comparison
        A = ``a``, B = ``b``; ``ratio`` > 1: ``b`` is faster.
    """
    from helpers.timing import compare

    sides = []
    for options in (a, b):
        batches = fixed_batches(job, acc, n_batches, pipeline=job.pipelines[0], options=options)
        step = job.make_step(job.make_model(acc, options), acc, options)
        it = itertools.cycle(batches)
        sides.append(lambda step=step, it=it: step(next(it)))
    return compare(sides[0], sides[1], repeats=steps, warmup=warmup_steps, sync=acc.synchronize, names=names,
                   items_per_call=job.workload.batch_size, seed=seed)


def loss_curve(job: Job, acc, options: StepOptions, *, steps: int, n_batches: int = 4,
               stat: str = "loss") -> list[float]:
    """``steps`` training steps of a fresh model (seeded) on fixed batches; the ``stat`` of each step.

    Two calls with different options see the same weights and the same batches, so their curves
    differ only by the options (the numerics gate of notebooks 06 and 10, :func:`learning_check`).

    Raises
    ------
    ParameterError
        If the step's statistics lack ``stat``.
    """
    batches = fixed_batches(job, acc, n_batches, pipeline=job.pipelines[0], options=options)
    step = job.make_step(job.make_model(acc, options), acc, options)
    out = []
    for i in range(int(steps)):
        stats = step(batches[i % len(batches)])
        if stat not in stats:
            raise ParameterError(f"the job's step returns {sorted(stats)}, not {stat!r}")
        out.append(float(stats[stat]))
    return out
