"""What every experiment module declares, and the shape of what its run returns.

Each ``helpers/experiments/<name>.py`` that backs a notebook declares one :class:`Experiment`, ``EXPERIMENT``: the
notebook's checklist item, its parameter spec and the optimizations its verdict decides, each with its default on a
device and what it switches in notebook 10's optimized job. :mod:`helpers.experiments.registry` finds these objects
(so the checklist, the parameter specs, the report and notebook 10 read one table that nobody edits by hand), and
adding a notebook adds no line anywhere else.

An experiment's run returns an :class:`ExperimentResult`: a frozen dataclass that holds the measurement (DataFrames
with units, :class:`helpers.timing.Comparison` objects) and knows its own records (:meth:`ExperimentResult.records`)
and its verdict (:meth:`ExperimentResult.verdict`). A notebook writes both with one call, ``ctx.record(result)``
(:meth:`helpers.workbook.nbsetup.NotebookContext.record`), which applies the busy-machine check; nothing else writes
records or verdicts (``tests/test_layers.py`` keeps it so).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Callable

from helpers.checklist import PHASES, Item
from helpers.params import Param
from helpers.results import Records

__all__ = ["Experiment", "ExperimentResult", "JobPlan", "Optimization", "VerdictResult", "checked_fields",
           "no_expected_warnings"]


@dataclass(frozen=True)
class JobPlan:
    """What notebook 10 switches on a job, built by its optimizations' :attr:`Optimization.apply` hooks in turn.

    Attributes
    ----------
    pipeline : str
        The job's image pipeline: ``"baseline"`` (per-image Pillow; a user's job: its own first pipeline),
        ``"batched"`` or ``"cached"`` (:meth:`helpers.jobs.base.Job.make_dataset`).
    num_workers : int
        DataLoader worker processes (0: the main process loads).
    pin_memory : bool
        Page-locked host batches (only where the device has pinned memory).
    prefetcher : bool
        A side-stream prefetcher copies the next batch while the current one computes.
    options : helpers.jobs.base.StepOptions
        The step's options (autocast dtype, channels_last); default ``StepOptions()``.
    """

    pipeline: str = "baseline"
    num_workers: int = 0
    pin_memory: bool = False
    prefetcher: bool = False
    options: Any = field(default_factory=lambda: _step_options())


def _step_options() -> Any:
    from helpers.jobs.base import StepOptions  # torch: only when a plan is made (this module is read without it)

    return StepOptions()


def _off(acc: Any, native_bf16: bool | None = None) -> tuple[bool, str]:
    return False, "no stated default"


def _unchanged(plan: JobPlan, settings: Any, acc: Any) -> JobPlan:
    return plan


@dataclass(frozen=True)
class Optimization:
    """One optimization that notebook 10 can switch on in the optimized job, declared by the notebook deciding it.

    Attributes
    ----------
    name : str
        Identifier used by notebook 10's ``optimizations`` parameter, e.g. ``"batched_decode"``.
    notebook : str
        Id (file stem) of the notebook whose verdict decides it, e.g. ``"02_batched_decode"``.
    acts_on : tuple of str
        The step phases (from :data:`helpers.checklist.PHASES`) where its effect must show; notebook 10's
        ablation judges it there only. Input side: data and h2d (batched decode also moves the conversion and
        normalization into h2d). Compute side: compute; channels_last also converts the images to NHWC in the h2d
        phase, so h2d counts too.
    decision : str
        Empty when the notebook's verdict decides this optimization. Otherwise the key of the verdict's ``extra``
        that holds this optimization's own decision (a mapping with ``recommendation``, ``reason`` and
        ``action``), as notebook 02 keeps the decode-once cache's under ``extra["dataset_cache"]``.
    requires : str
        Another optimization this one only works with (empty: none); e.g. the decode-once cache feeds the batched
        pipeline, so it needs ``batched_decode``.
    setting : str
        The setting whose value the verdict's action carries and notebook 10 uses with it (empty: on/off only),
        e.g. ``"num_workers"`` or ``"amp_dtype"``.
    default : callable
        ``default(acc, native_bf16) -> (enabled, reason)``: whether it is on where this run has no verdict for
        it, and why (``native_bf16``: whether a CPU has native bf16 arithmetic, None: unknown).
    apply : callable
        ``apply(plan, settings, acc) -> JobPlan``: the job plan with this optimization switched on; ``settings``
        maps each :attr:`setting` name to its value for this job.
    """

    name: str
    notebook: str
    acts_on: tuple[str, ...]
    decision: str = ""
    requires: str = ""
    setting: str = ""
    default: Callable[..., tuple[bool, str]] = field(default=_off, compare=False, repr=False)
    apply: Callable[[JobPlan, Any, Any], JobPlan] = field(default=_unchanged, compare=False, repr=False)

    def __post_init__(self) -> None:
        bad = [p for p in self.acts_on if p not in PHASES]
        if not self.acts_on or bad:
            raise ValueError(f"Optimization {self.name!r}: acts_on {self.acts_on!r} must name phases from {PHASES}")


def no_expected_warnings(why: str, *, match: str | None = None):
    """The default ``expect`` of an experiment's run: a context that lets warnings through as they are.

    A notebook passes :func:`helpers.workbook.output.expected_warnings` instead (the experiment layer cannot import
    the workbook), so that a warning a cell raises on purpose shows as output; the arguments are that function's.
    """
    import contextlib

    return contextlib.nullcontext([])


class ExperimentResult:
    """The base of every experiment's result: its records and its verdict, made by the result itself.

    Subclasses are frozen dataclasses whose fields hold what was measured. They override :meth:`records` (what the
    results file keeps) and, when the result decides something, :meth:`verdict`; both are pure functions of the
    fields, so a result can be recorded once, displayed many times and tested without a store.
    """

    def records(self) -> Records:
        """The records this result writes, described (:class:`helpers.results.Records`); none by default."""
        return Records()

    def verdict(self) -> Any:
        """The verdict (:class:`helpers.verdict.Verdict`) this result decides, or None (the default)."""
        return None


def checked_fields(checks: Any) -> dict[str, Any]:
    """``{name: value}`` of a dataclass instance's fields, not copied (``dataclasses.asdict`` deep-copies tensors
    and models): what an experiment's ``check(...)`` found, handed on to its result class, which extends the checks'
    class with the measurement (``Result(**checked_fields(checks), ...)``).

    Raises
    ------
    TypeError
        If ``checks`` is not a dataclass instance.
    """
    return {f.name: getattr(checks, f.name) for f in fields(checks)}


@dataclass(frozen=True)
class VerdictResult(ExperimentResult):
    """A result that is a verdict decided elsewhere and nothing more (records: none).

    For a verdict built outside an experiment's run (a test's constructed verdict, a command that decides from
    records already written) that must still go through ``ctx.record`` and its busy-machine check.
    """

    decided: Any  # a helpers.verdict.Verdict

    def verdict(self) -> Any:
        return self.decided


@dataclass(frozen=True)
class Experiment:
    """One notebook's experiment, declared once in its module as ``EXPERIMENT``.

    Attributes
    ----------
    item : helpers.checklist.Item
        The notebook's checklist entry (number, id, name, title, question, the names of the optimizations it
        decides).
    spec : tuple of helpers.params.Param
        The notebook's parameters, in the order of its ``parameters`` cell (helpers/specs.py has the shared
        building blocks).
    optimizations : tuple of helpers.checklist.Optimization
        The optimizations whose decision this notebook's verdict holds, in the order notebook 10 applies them;
        their names are ``item.optimizations``.
    interleaved_repeats : str
        The parameter that counts the interleaved repeats behind the notebook's ratio verdict (timed batches,
        rotated trials, interleaved steps; empty: its verdict is no interleaved ratio). Raising it narrows the
        verdict's interval, which is how a verdict measured on a busy machine can still clear its threshold
        (:func:`helpers.workbook.nbsetup.guard_verdict`); the runner's ``--patience K`` multiplies it.
    """

    item: Item
    spec: tuple[Param, ...]
    optimizations: tuple[Optimization, ...] = ()
    interleaved_repeats: str = ""

    def __post_init__(self) -> None:
        names = tuple(o.name for o in self.optimizations)
        if names != tuple(self.item.optimizations):
            raise ValueError(f"Experiment {self.item.id}: item.optimizations {self.item.optimizations!r} and the "
                             f"declared optimizations {names!r} must name the same, in the same order")
        for o in self.optimizations:
            if o.notebook != self.item.id:
                raise ValueError(f"Experiment {self.item.id}: optimization {o.name!r} says notebook {o.notebook!r}")
        names = [p.name for p in self.spec]
        if len(set(names)) != len(names):
            raise ValueError(f"Experiment {self.item.id}: a parameter is declared twice in {names}")
        if self.interleaved_repeats and self.interleaved_repeats not in names:
            raise ValueError(f"Experiment {self.item.id}: interleaved_repeats {self.interleaved_repeats!r} is not "
                             "one of its parameters")

    @property
    def notebook(self) -> str:
        """The notebook's id (file stem), e.g. ``"04_pinned_memory"``."""
        return self.item.id
