"""Notebook 01's verdict from profiler traces a user already has: per rank its phases, the job's bottleneck, the
slow rank, and what the traces cannot tell.

:func:`analyze` takes the :class:`~helpers.traces.model.RankTrace` objects the readers return (one per rank) and
gives a :class:`TraceAnalysis`: per rank the median of each phase with its interquartile range and the exposed
input share, notebook 01's figure (the median over steps of (data + h2d) / step time,
:attr:`helpers.traces.model.StepPhases.exposed_fraction`, as :attr:`helpers.compute.train.TrainRun.exposed_fraction`);
its classification by the one rule, :func:`helpers.bottleneck.classify`; the notebook to open next; the top
operators; and the limits of the trace. With several ranks the job's verdict is the rank that sets the pace (the
one that arrives last at the collectives, else the one slow in its own work: :func:`helpers.stragglers.find`); where
the evidence names none, the rank the arrivals point to (with the odds that chance gives it), else the one that waits
least, never the longest step's as such: in a synchronous job the longest step is the one that waits most.

Where no step of a rank has a data-loading annotation, its exposed input cannot be measured: the rank gets no label
(the verdict is "inconclusive", value None) and the limits say why and what to do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from helpers import bottleneck, stragglers
from helpers.bottleneck import Bottleneck, StepShares
from helpers.checklist import BASELINE, COLLECTIVES, notebook_ref
from helpers.errors import ParameterError
from helpers.results import Record, ResultsStore
from helpers.traces.arrival import Arrival, find_last
from helpers.traces.kineto_phases import _SYNC_CALLS
from helpers.traces.kineto_phases import comm_text
from helpers.traces.model import DEVICE_PHASES, HOST_PHASES, SYNC_TARGETS, RankTrace, StepPhases, TraceError
from helpers.verdict import Verdict

__all__ = ["NOTEBOOK", "PHASES", "PhaseStat", "RankSummary", "TraceAnalysis", "analyze"]

#: The verdict's notebook: a trace answers notebook 01's question (where a step's time goes, and which side bounds it).
NOTEBOOK = BASELINE
#: Phases summarized per rank, host side then device side (:mod:`helpers.traces.model`), then all communication.
PHASES: tuple[str, ...] = (*HOST_PHASES, *DEVICE_PHASES, "comm", "other", "sync_wait")
#: Exposed communication above this share of the step is named as a further lever (notebook 08): the same default
#: as notebook 01's ``host_bound_threshold``, the share of a step below which a lever is not worth a notebook.
COMM_NOTE_SHARE = 0.10
#: Fewer annotated steps than this and a rank's medians rest on too few steps to have a spread (an IQR needs a few).
FEW_STEPS = 3
#: Top operators kept in the analysis (the readers keep at most 20 per rank, :class:`RankTrace`).
TOP_OPS = 10

_NOTEBOOK_01 = notebook_ref(BASELINE)
_COLLECTIVES = notebook_ref(COLLECTIVES)


@dataclass(frozen=True)
class PhaseStat:
    """One phase of one rank over its steps: median and quartiles (seconds), and how many steps measured it."""

    median_s: float
    p25_s: float
    p75_s: float
    steps: int

    def as_dict(self) -> dict[str, Any]:
        """``{"median_s", "p25_s", "p75_s", "steps"}``, as notebook 01's ``extra["phases"]`` (plus ``steps``)."""
        return {"median_s": self.median_s, "p25_s": self.p25_s, "p75_s": self.p75_s, "steps": self.steps}


def _stat(values: Sequence[float | None]) -> PhaseStat | None:
    """Median and quartiles (linear interpolation, as pandas' ``quantile``) of the measured values; None if none."""
    v = np.asarray([x for x in values if x is not None], dtype=float)
    if not len(v):
        return None
    p25, med, p75 = (float(x) for x in np.percentile(v, [25, 50, 75]))
    return PhaseStat(median_s=med, p25_s=p25, p75_s=p75, steps=int(len(v)))


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms" if seconds >= 0.01 else f"{seconds * 1e3:.2g} ms"


@dataclass(frozen=True)
class RankSummary:
    """One rank's row: its phases over the annotated steps, its exposed input share and its classification.

    Attributes
    ----------
    label : str
        :attr:`RankTrace.label` ("rank 3 (node-b)", or the file's name for a single process).
    rank : int or None
    node : str or None
    format, device_kind : str
        As :class:`RankTrace`.
    steps : int
        Annotated steps in the trace (>= 1).
    phases : mapping of str to PhaseStat or None
        ``step_s`` and every phase of :data:`PHASES`: median, p25 and p75 seconds over the steps that measured it;
        None where no step did (the trace has no such annotation or records no device).
    exposed_fraction : float or None
        Median over steps of (data + h2d) / step time, 0..1, over the steps with a data annotation; None when no
        step has one (not measurable).
    exposed_p25, exposed_p75 : float or None
        Its interquartile range over those steps.
    exposed_steps : int
        Steps the exposed share is the median of.
    copy_share : float or None
        Median h2d / (median data + median h2d), 0..1: the copy's part of the exposed input; None when the copy is
        not annotated or nothing is exposed.
    bottleneck : helpers.bottleneck.Bottleneck or None
        :func:`helpers.bottleneck.judge` of the rank's measured shares; None when the evidence cannot decide.
    limits : tuple of str
        What this rank's trace cannot tell: the reader's :attr:`RankTrace.limits`, then the analysis's own.
    top_ops : tuple of dict
        :attr:`RankTrace.top_ops`, the first :data:`TOP_OPS`.
    provenance : dict
        :attr:`RankTrace.provenance`, with ``source`` (the path read) and ``format``.
    shares : helpers.bottleneck.StepShares or None
        The step model: the median over steps of each measured phase's share of the step.
    undecided : str
        Why the evidence gives no label ("" when it gives one).
    """

    label: str
    rank: int | None
    node: str | None
    format: str
    device_kind: str
    steps: int
    phases: Mapping[str, PhaseStat | None]
    exposed_fraction: float | None
    exposed_p25: float | None
    exposed_p75: float | None
    exposed_steps: int
    copy_share: float | None
    bottleneck: Bottleneck | None
    limits: tuple[str, ...] = ()
    top_ops: tuple[dict[str, Any], ...] = ()
    provenance: Mapping[str, Any] = field(default_factory=dict)
    shares: StepShares | None = None
    undecided: str = ""

    @property
    def step_s(self) -> float:
        """Median step time, seconds."""
        return self.phases["step_s"].median_s  # type: ignore[union-attr]  # every rank has >= 1 step

    @property
    def measurable(self) -> bool:
        """Whether the exposed input share was measured (some step has a data annotation)."""
        return self.exposed_fraction is not None

    @property
    def label_text(self) -> str:
        """The bottleneck label, or "not measurable" where the evidence cannot decide."""
        return self.bottleneck.label if self.bottleneck is not None else "not measurable"

    def wait_share(self) -> float:
        """Share of the median step this rank spends in exposed communication (0..1; 0 when not measured): in a
        synchronous job mostly its wait for the others."""
        sh = self.shares
        return (sh.comm_exposed or 0.0) if sh is not None else 0.0

    def medians(self) -> dict[str, float | None]:
        """Median seconds of ``step_s`` and each phase (None where unmeasured)."""
        return {k: (s.median_s if s is not None else None) for k, s in self.phases.items()}

    def as_dict(self) -> dict[str, Any]:
        """The row as JSON types (``trace --json``, the verdict's ``extra["ranks"]``)."""
        return {"label": self.label, "rank": self.rank, "node": self.node, "format": self.format,
                "device_kind": self.device_kind, "steps": self.steps,
                "phases": {k: (s.as_dict() if s is not None else None) for k, s in self.phases.items()},
                "exposed_fraction": self.exposed_fraction, "exposed_p25": self.exposed_p25,
                "exposed_p75": self.exposed_p75, "exposed_steps": self.exposed_steps, "copy_share": self.copy_share,
                "verdict": self.label_text,
                "bottleneck": self.bottleneck.as_dict() if self.bottleneck is not None else None,
                "shares": self.shares.as_dict() if self.shares is not None else None, "undecided": self.undecided,
                "limits": list(self.limits), "top_ops": [dict(o) for o in self.top_ops],
                "provenance": dict(self.provenance)}


def _summarize(trace: RankTrace, threshold: float) -> RankSummary:
    """One rank's :class:`RankSummary` (see :func:`analyze`)."""
    steps: tuple[StepPhases, ...] = tuple(trace.steps)
    if not steps:
        raise TraceError(f"{trace.source}: the trace holds no annotated training step (no ProfilerStep#N span); "
                         "profile with torch.profiler.schedule and call prof.step() once per training step")
    phases = {"step_s": _stat([s.step_s for s in steps])}
    phases.update({p: _stat([getattr(s, p) for s in steps]) for p in PHASES})
    limits = list(trace.limits)
    if len(steps) < FEW_STEPS:
        limits.append(f"{trace.label}: only {len(steps)} step{'' if len(steps) == 1 else 's'} recorded, too few for "
                      "a spread: one slow step moves the median; record more (torch.profiler.schedule(active=...))")
    with_data = [s for s in steps if s.data is not None]
    fractions = [f for f in (s.exposed_fraction for s in with_data) if f is not None]
    exposed = _stat(fractions)
    copy_share = None
    shares = _shares(steps, trace.device_kind)
    # spare cores: the trace does not say how many cores the machine left idle (None: the workers are advised,
    # as notebook 03 measures whether they pay)
    if exposed is not None:  # notebook 01's figure: the median over steps of (data + h2d) / step
        b, undecided = bottleneck.classify(
            exposed.median_s, threshold, device_kind=trace.device_kind, spare_cores=None,
            copy_share=shares.copy_share, compute_fraction=shares.compute, comm_fraction=shares.comm_exposed,
            idle_fraction=shares.idle, compute_mix=getattr(trace, "compute_mix", None),
            comm_overlapped=shares.comm_overlapped), ""
    else:
        b, undecided = bottleneck.judge(shares, threshold, spare_cores=None,
                                        compute_mix=getattr(trace, "compute_mix", None))
    if trace.provenance.get("device_not_recorded"):
        b, undecided = None, ("the job ran on a device the trace lists, but the profiler did not record its "
                              "activity, so the host's operators are only the launches of its work and neither "
                              "the computation nor the device's idle time is known; profile with "
                              "activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]")
    if exposed is None:
        if b is not None:
            limits.append(f"{trace.label}: no step has a data-loading annotation (the DataLoader's __next__ inside "
                          "the profiler step), so the input's own share is not measured; the device timeline "
                          f"decides the label ({shares.text()})")
        else:
            limits.append(f"{trace.label}: no step has a data-loading annotation (the DataLoader's __next__ inside "
                          "the profiler step), so the share of the step spent waiting for input is not measurable "
                          "and no bottleneck label is given; iterate a torch.utils.data.DataLoader inside the "
                          "profiled steps (torch.profiler records its __next__), or run "
                          f"{_NOTEBOOK_01}, which times the job's data, copy and compute phases itself")
    else:
        if len(fractions) < len(steps):
            limits.append(f"{trace.label}: {len(steps) - len(fractions)} of {len(steps)} steps have no data-loading "
                          f"annotation; the exposed input share is the median over the other {len(fractions)}")
        if phases["h2d"] is None:
            limits.append(f"{trace.label}: no host-to-device copy is measured: the exposed input counts the wait "
                          "for data only, and whether the copy or the loader costs more is not known")
        copy_share = shares.copy_share
    return RankSummary(label=trace.label, rank=trace.rank, node=trace.node, format=trace.format,
                       device_kind=trace.device_kind, steps=len(steps), phases=phases,
                       exposed_fraction=exposed.median_s if exposed else None,
                       exposed_p25=exposed.p25_s if exposed else None, exposed_p75=exposed.p75_s if exposed else None,
                       exposed_steps=exposed.steps if exposed else 0, copy_share=copy_share, bottleneck=b,
                       limits=tuple(limits), top_ops=tuple(dict(o) for o in trace.top_ops[:TOP_OPS]),
                       provenance={"source": str(trace.source), "format": trace.format, **dict(trace.provenance)},
                       shares=shares, undecided=undecided)


def _median_share(steps: Sequence[StepPhases], get) -> float | None:
    v = [get(s) / s.step_s for s in steps if s.step_s > 0 and get(s) is not None]
    return min(1.0, float(np.median(v))) if v else None


def _shares(steps: Sequence[StepPhases], device_kind: str) -> StepShares:
    """The step model of one rank: the median over its steps of each measured phase's share of the step."""
    sync = {}
    if any(s.sync_on for s in steps):
        for key in SYNC_TARGETS:
            v = _median_share(steps, lambda s, k=key: (s.sync_on or {}).get(k, 0.0) if s.sync_wait is not None
                              else None)
            if v:
                sync[key] = v
    with_data = [s for s in steps if s.data is not None]
    return StepShares(input=_median_share(with_data, lambda s: s.data),
                      copy=_median_share(with_data or steps, lambda s: s.h2d),
                      compute=_median_share(steps, lambda s: s.compute),
                      comm_exposed=_median_share(steps, lambda s: s.comm_exposed),
                      idle=_median_share(steps, lambda s: s.idle),
                      other=_median_share(steps, lambda s: s.other), sync=sync, device_kind=device_kind,
                      comm_overlapped=_median_share(steps, lambda s: None if s.comm is None or s.comm_exposed is None
                                                    else max(0.0, s.comm - s.comm_exposed)))


def _unique(items) -> tuple[str, ...]:
    return tuple(dict.fromkeys(i for i in items if i))


@dataclass(frozen=True)
class TraceAnalysis:
    """What the traces of one job say: notebook 01's verdict, per rank and for the job.

    Attributes
    ----------
    ranks : tuple of RankSummary
        One per trace, in the order given.
    threshold : float
        The host-bound threshold (notebook 01's ``host_bound_threshold``), 0..1.
    bounding : int
        Index in ``ranks`` of the rank the job's verdict is read from: the rank that arrives last at the
        collectives (:func:`helpers.traces.arrival.find_last`), else the slow rank named by
        :func:`helpers.stragglers.find` from its own work phases (the others wait for it in the allreduce, so their
        own traces understate its cause), else the rank the arrivals point to without naming it
        (:meth:`~helpers.traces.arrival.Arrival.pointed`), else the one whose exposed communication is least (in a
        synchronous job the longest step is the one that waits most), else the longest median step's; 0 for a
        single trace.
    stragglers : object or None
        :func:`helpers.stragglers.find`'s result for two or more ranks (``sentence()``, ``as_dict()``); None for one.
    limits : tuple of str
        What the traces cannot tell, every rank's merged (each said once), then the job's.
    arrival : helpers.traces.arrival.Arrival or None
        Which rank arrives last at the collectives (two or more ranks with collectives), else None.
    world_size : int or None
        The job's world size from the traces' metadata (None for a single process).
    evidence : str
        What the verdict stands on, in one sentence ("2 of 8 ranks, 5 steps each, ...").
    withheld : str
        Why the job's label is withheld although a rank has one ("" when it is not): the evidence that would
        decide it is missing (e.g. the ranks present wait for a rank that has no trace here).
    """

    ranks: tuple[RankSummary, ...]
    threshold: float
    bounding: int
    stragglers: Any = None
    limits: tuple[str, ...] = ()
    arrival: Arrival | None = None
    world_size: int | None = None
    evidence: str = ""
    withheld: str = ""

    @property
    def missing_ranks(self) -> int:
        """Ranks of the world size with no trace here (0 for a single process or a complete job)."""
        if not self.world_size:
            return 0
        present = {r.rank for r in self.ranks if r.rank is not None}
        return max(0, self.world_size - len(present))

    @property
    def step_marker(self) -> str:
        """What marks the steps, when not ``ProfilerStep#N``: the span name (e.g. ``Optimizer.step#SGD.step``) the
        reader took the steps from (``provenance["step_marker"]``), the ranks' distinct ones joined; "" otherwise."""
        found = _unique(str(r.provenance.get("step_marker") or "") for r in self.ranks)
        return " / ".join(m for m in found if m != "ProfilerStep#N")

    def steps_text(self, count: str) -> str:
        """``"5 annotated steps"``, or ``"5 steps marked by Optimizer.step#SGD.step"`` (``count``: "5", "3-5")."""
        plural = "" if count == "1" else "s"
        marker = self.step_marker
        return f"{count} step{plural} marked by {marker}" if marker else f"{count} annotated step{plural}"

    @property
    def job(self) -> RankSummary:
        """The rank whose verdict is the job's (see ``bounding``)."""
        return self.ranks[self.bounding]

    @property
    def bottleneck(self) -> Bottleneck | None:
        """The job's :class:`helpers.bottleneck.Bottleneck`; None when its exposed input is not measurable."""
        return self.job.bottleneck

    @property
    def label(self) -> str:
        """The job's verdict: host-bound, balanced, device-bound, communication-bound, or "inconclusive" when the
        evidence cannot decide (no label for the job's rank, or the label withheld: see ``withheld``)."""
        if self.withheld or self.bottleneck is None:
            return "inconclusive"
        return self.bottleneck.label

    @property
    def top_ops(self) -> tuple[dict[str, Any], ...]:
        """The top operators of the bounding rank (its trace's own; operators are not summed across ranks)."""
        return self.job.top_ops

    @property
    def provenance(self) -> tuple[dict[str, Any], ...]:
        """Each rank's :attr:`RankSummary.provenance`, in order."""
        return tuple(dict(r.provenance) for r in self.ranks)

    def next_text(self) -> str:
        """The notebook(s) to open next and why (:meth:`helpers.bottleneck.Bottleneck.next_text`); where the label
        is withheld, what evidence to bring; notebook 01 when the exposed input is not measurable."""
        if self.withheld:
            return ("profile every rank of the job (on_trace_ready=torch.profiler.tensorboard_trace_handler(dir) on "
                    "each rank writes one file per rank into dir) and pass them all, so that the rank the others "
                    "wait for is among them")
        if self.bottleneck is not None:
            return self.bottleneck.next_text()
        return (f"{_NOTEBOOK_01}: it times the job's data, copy and compute phases itself, which this trace does not "
                "annotate (or `python -m helpers diagnose --job your_job.py:make_job`)")

    def slow_rank_sentence(self) -> str | None:
        """The arrival finding (:meth:`helpers.traces.arrival.Arrival.sentence`) and the slow-rank finding of
        :func:`helpers.stragglers.find`, for two or more ranks; None for one."""
        if self.stragglers is None and self.arrival is None:
            return None
        if self.arrival is None:
            return self.stragglers.sentence()
        parts = []
        if self.arrival is not None:
            among = " among the ranks present" if self.missing_ranks else ""
            parts.append(f"at the collectives{among}: {self.arrival.sentence()}")
        if self.stragglers is not None:
            parts.append(f"by each rank's own work: {self.stragglers.sentence()}")
        return "; ".join(parts)

    def _job_prefix(self) -> str:
        if len(self.ranks) < 2:
            return ""
        last = self.arrival.straggler if self.arrival is not None else None
        if last is not None and last == self.job.label:
            return (f"the job's verdict is {self.job.label}'s, the rank the others wait for at the collectives: a "
                    "synchronous job steps at the pace of its last rank, and the other ranks' communication time is "
                    "their wait for it; ")
        primary = getattr(self.stragglers, "primary", None)
        if primary is not None and primary.label == self.job.label:
            return (f"the job's verdict is {self.job.label}'s, the slow rank: a synchronous job steps at the pace of "
                    "its slowest rank, and the other ranks spend the difference waiting for it (their own steps look "
                    "less host-bound than the job is); ")
        pointed = self.arrival.pointed() if self.arrival is not None else None
        if pointed is not None and pointed[0] == self.job.label:
            _, n, odds = pointed
            return (f"the job's verdict is {self.job.label}'s, the rank the collectives point to: it arrived last at "
                    f"{n} of {self.arrival.late} late collectives, which ranks that are all alike give some rank "
                    f"{odds:.0%} of the time, too often to name it the slow rank; ")
        longest = max(self.ranks, key=lambda r: r.step_s)
        if _waits_differ(self.ranks):
            return (f"the job's verdict is {self.job.label}'s, the rank that waits least in communication "
                    f"({self.job.wait_share():.0%} of its step; no rank is named slow from this evidence): in a "
                    f"synchronous job the longest step ({longest.label}, {_ms(longest.step_s)}) is the one that "
                    "waits most, not the one that sets the pace; ")
        return (f"the job's verdict is {self.job.label}'s, the rank with the longest median step "
                f"({_ms(self.job.step_s)}); no rank is named slow from this evidence, and in a synchronous job the "
                "longest step may be the one that waits most; ")

    def _reason(self, *, brief: bool = False) -> str:
        """The verdict's reason: the job's rank, the classification, (not ``brief``) the phase medians, the
        exposed communication when it is a lever, and (not ``brief``) the "next" advice."""
        r = self.job
        med = r.medians()
        if self.withheld:
            head = self.withheld
        elif self.bottleneck is not None:
            head = self.bottleneck.reason
        else:
            head = (f"{r.undecided}; to tell, record the DataLoader inside the profiled steps (iterate a "
                    "torch.utils.data.DataLoader between prof.step() calls: torch.profiler records its __next__)")
        lead = f"{self.evidence}: " if self.evidence and not brief else ""
        parts = [f"{lead}{'' if self.withheld else self._job_prefix()}{head}"]
        sync = (r.shares.sync if r.shares is not None else None) or {}
        at = self.bottleneck is not None and bool(self.bottleneck.at_threshold) and not self.withheld
        if sync and (at or not brief):  # at a threshold, the sync wait is what may tip the label: said up front
            total = sum(sync.values())
            if total > self.threshold:
                on = max(sync, key=sync.get)
                calls = [o["name"] for o in r.top_ops if o.get("where") == "host" and o.get("name") in _SYNC_CALLS]
                named = f" ({', '.join(calls[:2])})" if calls else ""
                parts.append(f"the host waits in synchronize calls{named} for {total:.0%} of the step, mostly while "
                             f"the device does {on} ({sync[on]:.0%})"
                             + ("; each such wait drains the launch queue, so the device then waits for the host's "
                                "next launches" if at else ""))
        taken = r.provenance.get("communication")
        if taken and not brief:  # which kernels were taken as communication, and by which rule
            parts.append(comm_text(taken))
        if not brief:
            shown = ", ".join(f"{p} {med[p] * 1e3:.0f}" for p in ("data", "h2d", "optimizer", "compute",
                                                                    "comm_exposed", "idle", "other", "sync_wait")
                              if med.get(p) is not None)
            parts.append(f"median step {r.step_s * 1e3:.0f} ms"
                         + (f" (phase medians: {shown} ms; medians need not add up)" if shown else ""))
        comm = med.get("comm_exposed")
        if comm is not None and r.step_s > 0 and comm / r.step_s > COMM_NOTE_SHARE and not self.withheld \
                and self.label != bottleneck.COMM_BOUND:
            parts.append(f"communication not hidden behind compute takes {comm / r.step_s:.0%} of the step: "
                         f"{_COLLECTIVES} measures the collectives and DDP's buckets")
        if not brief:
            parts.append(f"next: {self.next_text()}")
        return "; ".join(parts)

    def _context(self) -> str:
        kinds = "/".join(_unique(r.device_kind for r in self.ranks))
        fmts = "/".join(_unique(r.format for r in self.ranks))
        n = len(self.ranks)
        counts = sorted({r.steps for r in self.ranks})
        steps = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
        who = "one process" if n == 1 and self.ranks[0].rank is None else f"{n} rank{'s' if n > 1 else ''}"
        return (f"profiler trace of {who} ({fmts}, {kinds}), {self.steps_text(steps)}"
                f"{' per rank' if n > 1 else ''}; exposed input = time the step waits for data and the host-to-device "
                "copy")

    def verdict(self) -> Verdict:
        """The job's verdict with notebook 01's semantics, read from the traces.

        Returns
        -------
        helpers.verdict.Verdict
            notebook ``"01_baseline_profiling"``, metric ``exposed_input_fraction`` (fraction) of the bounding rank,
            spread its per-step IQR, repeats its steps; recommendation host-bound, balanced or device-bound, or
            "inconclusive" (value None) where the trace annotates no data loading. ``extra``: ``phases`` (the bounding
            rank's, per phase ``median_s``/``p25_s``/``p75_s``/``steps``, seconds), ``bottleneck``
            (:meth:`helpers.bottleneck.Bottleneck.as_dict` or None), ``source`` ``"trace"``, ``ranks`` (every
            :meth:`RankSummary.as_dict`), ``bounding_rank``, ``stragglers`` (its ``as_dict()`` or None), ``limits``
            and ``trace`` (each rank's provenance).
        """
        r = self.job
        spread = ({"p25": r.exposed_p25, "p75": r.exposed_p75} if r.exposed_p25 is not None else None)
        extra = {"source": "trace",
                 "phases": {k: s.as_dict() for k, s in r.phases.items() if s is not None},
                 "bottleneck": self.bottleneck.as_dict() if self.bottleneck is not None else None,
                 "bounding_rank": r.label, "ranks": [x.as_dict() for x in self.ranks],
                 "stragglers": self.stragglers.as_dict() if self.stragglers is not None else None,
                 "limits": list(self.limits), "trace": list(self.provenance),
                 "arrival": self.arrival.as_dict() if self.arrival is not None else None,
                 "shares": r.shares.as_dict() if r.shares is not None else None,
                 "evidence": self.evidence, "withheld": self.withheld or None,
                 "world_size": self.world_size, "ranks_present": len(self.ranks),
                 "communication": list(r.provenance.get("communication") or [])}
        extra.update(self._first_line())
        # the exposed input share is the number a host-bound verdict stands on; another label's advice gives its own
        extra["headline_figure"] = self.label == bottleneck.HOST_BOUND
        return Verdict(notebook=NOTEBOOK, metric="exposed_input_fraction", value=r.exposed_fraction, unit="fraction",
                       recommendation=self.label, reason=self._reason(), spread=spread,
                       repeats=r.exposed_steps or None, context=self._context(), extra=extra)

    def _first_line(self) -> dict[str, str]:
        """``extra["advice"]`` (a label's: what to speed up first, the shares it stands on, the notebooks) or
        ``extra["inconclusive_why"]``, for :meth:`helpers.verdict.Verdict.headline`'s first line (at most
        :data:`helpers.verdict.HEADLINE_CHARS` characters with the figure: the notebooks are cut first)."""
        b, r = self.bottleneck, self.job
        if self.withheld:
            return {"inconclusive_why": f"{self.missing_ranks} ranks missing, the one waited for may be among them; "
                                        "profile every rank"}
        if b is None:
            why = ("device activity not recorded: profile with ProfilerActivity.CUDA"
                   if r.provenance.get("device_not_recorded") else
                   "no data-loading span: the input's share is not measured (notebook 01 measures it)")
            return {"inconclusive_why": why}
        sh = r.shares
        launch = sh is not None and sh.idle is not None and sh.idle - b.exposed_fraction > b.exposed_fraction
        todo = {bottleneck.HOST_BOUND: "host launches first" if launch else "input first",
                bottleneck.BALANCED: "compute first, then host", bottleneck.DEVICE_BOUND: "compute first",
                bottleneck.COMM_BOUND: "communication first"}[b.label]
        at = ""
        if b.at_threshold:
            at = (f" at the {bottleneck.DEVICE_BUSY:.0%} rule" if "rule" in b.at_threshold.split(";")[0]
                  else " at the threshold")
        pairs = (("busy", sh.compute if sh else None), ("idle", sh.idle if sh else None),
                 ("comm exposed", sh.comm_exposed if sh else None))
        shown = [f"{name} {v:.0%}" for name, v in pairs
                 if v is not None and (name != "comm exposed" or v > self.threshold)]
        if b.precision and "precision is already low" in b.reason:
            shown.append(b.precision.split(" on ")[0] + " matrix work")
        sync = sum(((sh.sync if sh else None) or {}).values())
        if b.at_threshold and sync > self.threshold:
            shown.append(f"host sync {sync:.0%}")
        where = f" (notebook {', '.join(b.next_notebooks)})" if b.next_notebooks else ""
        return {"advice": f"{b.label.upper()}{at}: {todo}" + (f"; {', '.join(shown)}" if shown else "") + where}

    def sentence(self) -> str:
        """The verdict's sentence (:meth:`helpers.verdict.Verdict.sentence`), ending with the "next" advice."""
        return self.verdict().sentence()

    def headline(self) -> str:
        """The verdict in one sentence for a first screen, without the phase medians (the rank table shows them)
        and the "next" advice (shown on a line of its own): ``"HOST-BOUND: input preparation and copy are exposed
        for 45% of each step ..."``."""
        return f"{self.label.upper()}: {self.why()}"

    def why(self) -> str:
        """:meth:`headline` without its label: how few steps, the evidence, the brief reason (the lines under the
        one-line verdict, :meth:`helpers.verdict.Verdict.headline`, in the trace report)."""
        few = min(r.steps for r in self.ranks)
        lead = (f"only {few} step{'' if few == 1 else 's'} recorded: one slow step moves the figures; "
                if few < FEW_STEPS else "")
        ev = f"{self.evidence}: " if self.evidence else ""
        return f"{lead}{ev}{self._reason(brief=True)}"

    def records(self) -> tuple[Record, ...]:
        """The analysis as results.jsonl records (:class:`helpers.results.Record`), each with its trace's provenance.

        Returns
        -------
        tuple of Record
            notebook ``"01_baseline_profiling"``, parameters ``{"host_bound_threshold", "traces"}`` (the paths read):
            first the verdict (:meth:`verdict`); then per rank (variant its label) experiment ``trace_phases``, one
            record per measured phase (metric the phase, unit ``s``, spread p25/p75, repeats the steps measuring
            it) and ``trace_exposed_input`` (metric ``exposed_input_fraction``, value None where not measurable);
            then the bounding rank's top operators, experiment ``trace_top_ops`` (variant the operator, metric
            ``self_time``, unit ``s``). Every record's ``extra["trace"]`` is its rank's provenance (the verdict's: all
            ranks'), ``extra["rank"]`` and ``extra["node"]`` where known.
        """
        kinds = "/".join(_unique(r.device_kind for r in self.ranks))
        store = ResultsStore(None, notebook=NOTEBOOK, device=f"{kinds} (profiler trace)",
                             parameters={"host_bound_threshold": self.threshold,
                                         "traces": [r.provenance.get("source") for r in self.ranks]})
        store.add_verdict(self.verdict())
        for r in self.ranks:
            who = {"rank": r.rank, "node": r.node, "trace": dict(r.provenance)}
            for name, s in r.phases.items():
                if s is not None:
                    store.add("trace_phases", r.label, name, s.median_s, "s", repeats=s.steps,
                              spread={"p25": s.p25_s, "p75": s.p75_s}, **who)
            if r.measurable:
                store.add("trace_exposed_input", r.label, "exposed_input_fraction", r.exposed_fraction, "fraction",
                          repeats=r.exposed_steps, spread={"p25": r.exposed_p25, "p75": r.exposed_p75},
                          verdict=r.label_text, **who)
            else:
                store.add("trace_exposed_input", r.label, "exposed_input_fraction", None, "fraction",
                          verdict=r.label_text, **who)
        job = self.job
        for op in self.top_ops:
            ms = op.get("self_ms")
            store.add("trace_top_ops", str(op.get("name")), "self_time",
                      ms / 1e3 if isinstance(ms, (int, float)) and math.isfinite(ms) else None, "s",
                      calls=op.get("calls"), where=op.get("where"), rank=job.rank, node=job.node,
                      trace=dict(job.provenance))
        return store.records

    def as_dict(self) -> dict[str, Any]:
        """The analysis as JSON types (``python -m helpers trace --json``)."""
        v = self.verdict()
        return {"verdict": self.label, "sentence": v.sentence(), "headline": self.headline(),
                "exposed_fraction": v.value,
                "threshold": self.threshold, "next": self.next_text(),
                "bottleneck": self.bottleneck.as_dict() if self.bottleneck is not None else None,
                "bounding_rank": self.job.label,
                "slow_ranks": self.stragglers.as_dict() if self.stragglers is not None else None,
                "slow_rank_sentence": self.slow_rank_sentence(),
                "arrival": self.arrival.as_dict() if self.arrival is not None else None,
                "evidence": self.evidence, "withheld": self.withheld or None, "world_size": self.world_size,
                "shares": self.job.shares.as_dict() if self.job.shares is not None else None,
                "ranks": [r.as_dict() for r in self.ranks], "top_ops": [dict(o) for o in self.top_ops],
                "limits": list(self.limits), "provenance": list(self.provenance), "context": v.context}


def _waits_differ(rows: Sequence[RankSummary]) -> bool:
    """Whether two or more ranks measured their exposed communication and it differs by 1 point of the step or
    more (then the rank that waits least is told apart from the others)."""
    waits = [r.wait_share() for r in rows if r.shares is not None and r.shares.comm_exposed is not None]
    return len(waits) > 1 and max(waits) - min(waits) >= 0.01


def _merge_limits(rows: Sequence[RankSummary]) -> list[str]:
    """Every rank's limits, each said once: a sentence several ranks share ("rank 0: no copy is annotated") is
    written once with the ranks it holds for ("every rank: ..." when it holds for all of them)."""
    labels = [r.label for r in rows]
    ranks_of: dict[str, list[str]] = {}
    for r in rows:
        for lim in r.limits:
            prefix = f"{r.label}: "
            text = lim[len(prefix):] if lim.startswith(prefix) else lim
            owner = r.label if lim.startswith(prefix) else ""
            who = ranks_of.setdefault(text, [])
            if owner and owner not in who:
                who.append(owner)
    out = []
    for text, who in ranks_of.items():
        if not who:
            out.append(text)
        elif len(rows) > 1 and len(who) == len(labels):
            out.append(f"every rank: {text}")
        else:
            out.append(f"{', '.join(who)}: {text}")
    return out


def analyze(traces: Sequence[RankTrace], *, threshold: float = 0.10) -> TraceAnalysis:
    """Notebook 01's verdict from the traces of one job: per rank its phases and label, the job's, the slow ranks.

    Parameters
    ----------
    traces : sequence of RankTrace
        One per rank (:func:`helpers.traces.read`), at least one; each with at least one annotated step.
    threshold : float, default 0.10
        Exposed input share at or below which a rank is device-bound (notebook 01's ``host_bound_threshold``), 0..1.

    Returns
    -------
    TraceAnalysis
        Per rank a :class:`RankSummary`; the job's verdict is the slow rank's (else the longest median step's); for
        two or more ranks the slow-rank finding of :func:`helpers.stragglers.find`.

    Raises
    ------
    ParameterError
        If ``traces`` is empty or holds something else than RankTrace, or ``threshold`` is not a share in [0, 1].
    TraceError
        If a trace holds no annotated step, or two traces are the same rank (the message names the files).
    """
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold) \
            or not 0.0 <= threshold <= 1.0:
        raise ParameterError(f"analyze: threshold must be a share in [0, 1] (e.g. --threshold 0.10, notebook 01's "
                             f"host_bound_threshold), got {threshold!r}")
    traces = list(traces)
    if not traces:
        raise ParameterError("analyze: no trace given; pass the RankTrace of at least one rank "
                             "(helpers.traces.read(paths))")
    for i, t in enumerate(traces):
        if not isinstance(t, RankTrace):
            raise ParameterError(f"analyze: traces[{i}] is a {type(t).__name__}, not a RankTrace; read the files "
                                 "with helpers.traces.read(paths)")
    labels = [t.label for t in traces]
    for lab in dict.fromkeys(x for x in labels if labels.count(x) > 1):
        same = [str(t.source) for t in traces if t.label == lab]
        raise TraceError(f"traces {', '.join(same)} are all {lab!r}: one job's traces hold each rank once; pass the "
                         "traces of one run (a trace of a single process has no rank: analyze it on its own)")
    rows = tuple(_summarize(t, float(threshold)) for t in traces)
    few = min(len(t.steps) for t in traces) < FEW_STEPS
    # the work-phase rule compares each rank's excess with its per-step spread: with too few steps there is none
    slow = stragglers.find(traces) if len(traces) > 1 and not few else None
    arrival = find_last(traces) if len(traces) > 1 else None
    primary = getattr(slow, "primary", None)
    last = arrival.straggler if arrival is not None else None
    culprit = last if last is not None else (primary.label if primary is not None else None)
    # In a synchronous job every rank's step lasts as long as the slowest one's (the others wait in the
    # collectives, where their own trace shows communication): the job's verdict is the rank that arrives last,
    # else the rank slow in its own work. Without either, the longest step is the one that waits most, not the
    # pace-setter: the rank the arrivals point to, else the one that waits least in communication, else (no
    # communication measured) the longest median step's.
    by_label = {r.label: i for i, r in enumerate(rows)}
    pointed = arrival.pointed() if arrival is not None and culprit is None else None
    if culprit in by_label:
        bounding = by_label[culprit]
    elif pointed is not None and pointed[0] in by_label:
        bounding = by_label[pointed[0]]
    elif _waits_differ(rows):
        bounding = min(range(len(rows)), key=lambda i: (rows[i].wait_share(), -rows[i].step_s))
    else:
        bounding = max(range(len(rows)), key=lambda i: rows[i].step_s)
    limits = _merge_limits(rows)
    if len(rows) > 1 and any(r.measurable for r in rows) and not rows[bounding].measurable:
        why = "the slow rank" if culprit is not None else "the rank the verdict is read from"
        limits.append(f"{why}, {rows[bounding].label}, has no data-loading annotation: its input's share is "
                      "not measured although other ranks' are")
    worlds = [t.world_size for t in traces if t.world_size]
    world = max(worlds) if worlds else None
    if len(rows) > 1 and few:
        limits.append(f"with fewer than {FEW_STEPS} steps per rank no rank is named slow by its own work: one "
                      "slow step would decide it")
    evidence, withheld = _evidence(rows, rows[bounding], world, float(threshold), last is not None)
    return TraceAnalysis(ranks=rows, threshold=float(threshold), bounding=bounding, stragglers=slow,
                         limits=tuple(limits), arrival=arrival, world_size=world, evidence=evidence,
                         withheld=withheld)


def _evidence(rows: Sequence[RankSummary], job: RankSummary, world: int | None, threshold: float,
              named: bool) -> tuple[str, str]:
    """(what the verdict stands on, why the job's label is withheld or ""): ranks present of the world size and
    steps; the label is withheld when ranks are missing and the ranks present mostly wait in communication (the
    rank they wait for may be missing), since no lever then follows from the evidence."""
    present = sorted({r.rank for r in rows if r.rank is not None})
    steps = sorted({r.steps for r in rows})
    per = f"{steps[0]}" if len(steps) == 1 else f"{steps[0]}-{steps[-1]}"
    if not world or world <= 1:
        return "", ""
    n = len(present)
    missing = world - n
    article = "an" if str(world)[0] == "8" or str(world).startswith(("11", "18")) else "a"
    each = f"{per} step{'' if per == '1' else 's'} each"
    head = (f"{n} of {world} ranks ({each})" if n > 1 else f"one rank ({job.label}) of {article} "
            f"{world}-rank job ({per} step{'' if per == '1' else 's'})")
    if missing <= 0:
        return f"all {world} ranks ({each})", ""
    evidence = (f"{head}: the verdict covers {'these' if n > 1 else 'this rank'}; "
                + (f"one of the {missing} missing ranks may be the slow one" if missing > 1
                   else "the missing rank may be the slow one"))
    wait = job.wait_share()
    label = job.bottleneck.label if job.bottleneck is not None else None
    if label == bottleneck.COMM_BOUND or wait > threshold:
        who = "this rank" if n == 1 else "the ranks present"
        withheld = (f"{who} spend{'s' if n == 1 else ''} {wait:.0%} of the step in communication not hidden behind "
                    "compute, which in a synchronous job is mostly waiting for a slower rank; "
                    + ("the last to arrive among them is named below, but " if named else "")
                    + f"the rank {'it waits' if n == 1 else 'they wait'} for may be "
                    + (f"one of the {missing} without a trace" if missing > 1 else "the one without a trace")
                    + ", so neither the slow rank nor the lever can be named from this evidence")
        return evidence, withheld
    return evidence, ""
