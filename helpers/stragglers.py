"""Which rank of a multi-rank job is slow, and in which phase: the slow-rank rule.

The input is, per rank, its per-step times split into phases (seconds): ``step_s`` (the whole step) and any of
``data``, ``h2d``, ``compute``, ``optimizer`` (work a rank does itself) and ``comm``, ``comm_exposed``, ``idle``
(time a rank may spend waiting for the others). It comes from profiler traces (:mod:`helpers.traces`; a
:class:`helpers.traces.model.RankTrace` is accepted as it is) or from live ranks under torchrun; this module
imports neither torch nor the trace readers.

The rule
--------
For each rank and each phase, the rank's median over its steps is compared with the median of the OTHER ranks'
medians. The rank is slow in that phase when its excess over the others is larger than both

* the per-step spread measured in the trace: the interquartile range (p75 - p25) of that phase across a rank's
  steps, the larger of the rank's own and the median of the other ranks', so that an excess the steps' own noise
  can produce is not a slow rank (the rank's own counts: in the 4-rank gloo test job, a fast rank's step median
  came out 3.1 ms above the others' with 6 steps whose own IQR was 6 ms, while the others' median IQR was 1.6 ms:
  noise, since ranks in lockstep have equal step times on average); and
* 5% of the mean step time (the mean of the other ranks' median ``step_s``): msprof-analyze's cluster rule
  (``RATIO_THRESHOLD = 0.05`` in ``msprof_analyze/advisor/analyzer/cluster/slow_rank_analyzer.py`` and
  ``advisor_backend/cluster_advice/slow_rank_advice.py``, gitcode.com/Ascend/msprof-analyze: a phase's
  max - min across ranks divided by the mean total step time; its docs, ``recipe_output_format_introduct.md``
  on ``cluster_step_trace_time.csv``: the times "should stay level, the difference between max and min not
  above 5%, otherwise there may be a slow rank"). The 5% is of the step, not of the phase: a 1 ms phase that
  doubles does not make a slow rank.

The sentence prints a finding's share with the mean it divides by: "41% of the other ranks' 29.2 ms mean step"
(the rank itself is left out of the mean it is compared with).

A rank is slow when its step time or one of its work phases is. Its phase is the work phase with the largest
excess that passes; a rank whose step alone is longer has no phase (none the trace measures explains it).

Wait phases (``comm``, ``comm_exposed``, ``idle``) never name a culprit's phase: in DDP every rank waits in the
gradient allreduce for the slowest one, so the fast ranks show the MOST communication and the naive "most
communication" rank is the wrong answer (the culprit, arriving last, waits least). Instead the result checks that
the numbers support the wait: the other ranks' extra time in a wait phase over the culprit's, and which share of
the culprit's excess it covers; at 80% or more (TraceML's attribution threshold, below) the sentence says that
the others' extra communication is their wait for the culprit.

A whole node is named when all of its ranks (two or more) are slow in the same phase against the ranks of the
other nodes and no rank outside it is slow against the others outside it.

Other tools, and how this rule differs
--------------------------------------
* HTA (facebookresearch/HolisticTraceAnalysis, ``hta/analyzers/straggler.py``,
  ``find_stragglers_with_late_start_comm_kernels``): the metric is the normalized start time of the last
  long communication kernel of each iteration (a straggler starts its allreduce late), and the top
  ``n_stragglers`` (default 2) ranks of each iteration are the candidates. It always names candidates, even in a
  balanced job, needs device communication kernels (a CPU gloo trace has none), and names no phase. Here a rank
  is named only above the spread and 5%, from host or device phases, with its phase.
* TraceML (traceopt-ai/traceml, ``docs/developer_guide/rank-straggler-policy.md``): in DDP the *culprit* is the
  rank with the least backward time (it waited least in the allreduce overlapped with backward), the *victim* the
  upper-median rank; the score (victim - culprit backward) / (victim's input wait + step) must reach 10%, and an
  input, H2D or forward excess of the culprit over the victim names the cause when it covers 80% of the gap. It
  compares the culprit with one victim rank and uses a fixed 10%; here every rank is compared with all the others,
  against the measured per-step spread and msprof-analyze's 5%, and TraceML's 80% is used the other way round:
  how much of the culprit's excess the others' extra wait covers.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from helpers.errors import ParameterError

__all__ = ["STEP", "WORK_PHASES", "WAIT_PHASES", "MIN_EXCESS_FRACTION", "WAIT_COVERAGE", "RankPhases", "Finding",
           "Wait", "SlowRanks", "find"]

#: The whole step's phase name.
STEP = "step_s"
#: Phases a rank spends on its own work: one of them can be a culprit's phase.
WORK_PHASES: tuple[str, ...] = ("data", "h2d", "compute", "optimizer")
#: Phases in which a rank may wait for the others: never a culprit's phase.
WAIT_PHASES: tuple[str, ...] = ("comm", "comm_exposed", "idle")
#: A slow rank's excess must exceed this share of the mean step time: msprof-analyze's RATIO_THRESHOLD (0.05,
#: ``msprof_analyze/advisor/analyzer/cluster/slow_rank_analyzer.py``).
MIN_EXCESS_FRACTION = 0.05
#: The others' extra wait must cover this share of the culprit's excess for the sentence to call it their wait for
#: the culprit: TraceML's cause-coverage threshold (80%, ``docs/developer_guide/rank-straggler-policy.md``).
WAIT_COVERAGE = 0.80

_KNOWN = (STEP, *WORK_PHASES, *WAIT_PHASES)
#: The wait phase a sentence names when several cover the excess: the time spent blocked first.
_WAIT_PREFERENCE = ("comm_exposed", "comm", "idle")
_WORDS = {"data": "waiting for the next batch", "h2d": "the host-to-device copy", "compute": "compute",
          "optimizer": "the optimizer step", STEP: "the whole step"}
_WAIT_WORDS = {"comm": "communication", "comm_exposed": "communication not hidden behind compute",
               "idle": "device idle time"}


@dataclass(frozen=True)
class RankPhases:
    """One rank's per-step phase times.

    Parameters
    ----------
    label : str
        How sentences name the rank, e.g. ``"rank 2 (node-a)"``; unique among the ranks compared.
    phases : mapping of str to sequence of float
        Phase name -> per-step values, seconds, finite and >= 0; must hold ``"step_s"`` with at least one value.
        A phase a rank does not measure is left out (never given as zeros).
    rank, node : int or str or None
        The rank's number and its host, where known; ranks with a node on two or more nodes allow a node finding.
    """

    label: str
    phases: Mapping[str, Sequence[float]]
    rank: int | None = None
    node: str | None = None

    @classmethod
    def from_steps(cls, label: str, steps: Iterable[Any], *, rank: int | None = None,
                   node: str | None = None) -> "RankPhases":
        """From step objects with phase attributes (``step_s``, ``data``, ... as in
        :class:`helpers.traces.model.StepPhases`; a None attribute is a phase not measured in that step)."""
        steps = list(steps)
        phases = {}
        for p in _KNOWN:
            vals = [getattr(s, p, None) for s in steps]
            vals = [float(v) for v in vals if v is not None]
            if vals:
                phases[p] = vals
        return cls(label=label, phases=phases, rank=rank, node=node)


@dataclass(frozen=True)
class Finding:
    """One slow rank (or one rank of a slow node).

    Attributes
    ----------
    label, rank, node : the rank's.
    phase : str or None
        The work phase it is slow in; None when only its step time is longer.
    excess_s : float
        Its median minus the others' (the median of their medians), seconds; of ``phase``, or of the step.
    excess_fraction : float
        ``excess_s`` / mean step of the others (0.41 = 41%).
    reference_s : float
        The others' median of that phase, seconds.
    spread_s : float
        The per-step spread used: the larger of the rank's own interquartile range of that phase over its steps
        and the median of the others', seconds.
    threshold_s : float
        5% (``min_excess``) of the others' mean step, seconds.
    mean_step_s : float or None
        The others' mean step (the mean of their median ``step_s``), seconds: what ``excess_fraction`` and
        ``threshold_s`` are shares of, and the mean the sentence prints.
    """

    label: str
    rank: int | None
    node: str | None
    phase: str | None
    excess_s: float
    excess_fraction: float
    reference_s: float
    spread_s: float
    threshold_s: float
    mean_step_s: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"label": self.label, "rank": self.rank, "node": self.node, "phase": self.phase,
                "excess_s": self.excess_s, "excess_pct": 100.0 * self.excess_fraction,
                "reference_s": self.reference_s, "spread_s": self.spread_s, "threshold_s": self.threshold_s,
                "mean_step_s": self.mean_step_s}


@dataclass(frozen=True)
class Wait:
    """What the other ranks show of their wait for the culprit(s).

    Attributes
    ----------
    phase : str
        The wait phase: the first of ``comm_exposed``, ``comm``, ``idle`` whose gap covers ``WAIT_COVERAGE`` of the
        excess, else the one with the largest gap.
    others_extra_s : float
        The median of the other ranks' medians of ``phase`` minus the culprits', seconds (negative: they wait less).
    coverage : float
        ``others_extra_s`` / the culprit's excess; at ``WAIT_COVERAGE`` or more it is their wait for the culprit.
    """

    phase: str
    others_extra_s: float
    coverage: float

    def as_dict(self) -> dict[str, Any]:
        return {"phase": self.phase, "others_extra_s": self.others_extra_s, "coverage": self.coverage}


@dataclass(frozen=True)
class SlowRanks:
    """The slow-rank finding of :func:`find`.

    Attributes
    ----------
    n_ranks : int
        Ranks compared.
    findings : tuple of Finding
        The slow ranks, largest excess first (the node's ranks when ``node`` is set); empty when none is slow.
    node : str or None
        The slow node, when a whole node is slower than the others.
    mean_step_s : float or None
        The mean of all ranks' median step times, seconds (None for one rank). Each finding's share and 5% are
        of the OTHER ranks' mean step (:attr:`Finding.mean_step_s`), which is the mean its sentence prints.
    min_excess : float
        The share of the mean step an excess must exceed (0.05).
    wait : Wait or None
        The others' extra wait over the culprits; None without a culprit or without a wait phase on both sides.
    medians : dict
        Per rank label, per phase, its median over the steps (seconds): the table behind the sentence.
    phases : tuple of str
        The phases compared (work phases and the step; wait phases are in ``medians`` only).
    closest : Finding or None
        With no slow rank: the rank and phase whose excess came closest to the thresholds (for the sentence).
    source : str
        What measured the phases, as the sentence names it: "the trace" (profiler traces), or e.g. "the
        instrument" (live ranks).
    words : mapping of str to str
        How the sentence describes a phase, where the caller's phase is not the default's quantity (e.g. a compute
        column that holds the wait in the collectives, passed as ``comm`` when no communication is measured).
    no_wait : str or None
        The sentence when no wait phase is measured on both sides (``{culprit}`` is replaced by the culprit's
        name); None: the traces' default (no communication or idle time measured).
    """

    n_ranks: int
    findings: tuple[Finding, ...] = ()
    node: str | None = None
    mean_step_s: float | None = None
    min_excess: float = MIN_EXCESS_FRACTION
    wait: Wait | None = None
    medians: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    phases: tuple[str, ...] = ()
    closest: Finding | None = None
    source: str = "the trace"
    words: Mapping[str, str] = field(default_factory=dict)
    no_wait: str | None = None

    @property
    def slow_ranks(self) -> tuple[str, ...]:
        """The slow ranks' labels, largest excess first."""
        return tuple(f.label for f in self.findings)

    @property
    def ranks(self) -> tuple[int | None, ...]:
        """The slow ranks' numbers, largest excess first."""
        return tuple(f.rank for f in self.findings)

    @property
    def primary(self) -> Finding | None:
        """The finding the sentence leads with: the largest excess."""
        return self.findings[0] if self.findings else None

    @property
    def phase(self) -> str | None:
        """The main culprit's work phase (None: no slow rank, or only its step is longer)."""
        return self.primary.phase if self.primary else None

    @property
    def excess_s(self) -> float | None:
        """The main culprit's excess over the others, seconds."""
        return self.primary.excess_s if self.primary else None

    @property
    def excess_pct(self) -> float | None:
        """The main culprit's excess as a percentage of the others' mean step."""
        return 100.0 * self.primary.excess_fraction if self.primary else None

    @property
    def spread_s(self) -> float | None:
        """The per-step spread the main culprit's excess was held against, seconds."""
        return self.primary.spread_s if self.primary else None

    def sentence(self) -> str:
        """One paragraph for the learner: who is slow, in which phase, by how much, and who waits for it.

        Every percentage is printed with the mean it is a share of: a finding's excess is a share of the OTHER
        ranks' mean step (the rank itself left out), and the sentence says so."""
        src = self.source
        if self.n_ranks < 2:
            only = next(iter(self.medians), "one rank")
            what = "trace" if src == "the trace" else "figures"
            return (f"Only one rank's {what} ({only}): there is no other rank to compare its steps with, so no slow "
                    f"rank can be named; pass the {what if what == 'figures' else 'traces'} of all the job's ranks.")
        pct = f"{self.min_excess:.0%}"
        if not self.findings:
            txt = (f"No rank is slower than the others: across {self.n_ranks} ranks, no rank's step time or work "
                   f"phase ({', '.join(p for p in self.phases if p != STEP) or 'none measured'}) is above the other "
                   f"ranks' by more than both the per-step spread and {pct} of the other ranks' mean step (all "
                   f"ranks' mean step: {_ms(self.mean_step_s)})")
            c = self.closest
            if c is not None and c.excess_s > 0:
                what = "step" if c.phase is None else f"{c.phase} phase"
                txt += (f"; the largest excess, {c.label}'s {what}, is {_ms(c.excess_s)} against a spread of "
                        f"{_ms(c.spread_s)} and {pct} of the other ranks' {_ms(c.mean_step_s)} mean step = "
                        f"{_ms(c.threshold_s)}")
            return txt + "."
        p = self.primary
        if self.node is not None:
            who = ", ".join(f.label for f in sorted(self.findings, key=lambda f: (f.rank is None, f.rank, f.label)))
            if p.phase is None:
                head = (f"Node {self.node} is slower than the others: the steps of all its ranks ({who}) take "
                        f"{_ms(p.excess_s)} longer than the other nodes' ranks' ({_ms(p.reference_s)})")
            else:
                head = (f"Node {self.node} is slower than the others: all its ranks ({who}) spend {_ms(p.excess_s)} "
                        f"more per step in {p.phase} ({self._words(p.phase)}) than the other nodes' ranks "
                        f"({_ms(p.reference_s)})")
            head += (f", {p.excess_fraction:.0%} of the other nodes' ranks' {_ms(p.mean_step_s)} mean step, above "
                     f"both the per-step spread ({_ms(p.spread_s)}) and {pct} of that mean ({_ms(p.threshold_s)}); "
                     "no rank on another node is slow")
            culprit = f"node {self.node}"
        else:
            if p.phase is None:
                head = (f"{p.label} is the slow rank: its step takes {_ms(p.excess_s)} longer than the other ranks' "
                        f"({_ms(p.reference_s)})")
            else:
                head = (f"{p.label} is the slow rank: its {p.phase} phase ({self._words(p.phase)}) takes "
                        f"{_ms(p.excess_s)} more per step than the other ranks' ({_ms(p.reference_s)})")
            head += (f", {p.excess_fraction:.0%} of the other ranks' {_ms(p.mean_step_s)} mean step, above both the "
                     f"per-step spread ({_ms(p.spread_s)}) and {pct} of that mean ({_ms(p.threshold_s)})")
            if p.phase is None:
                head += f", but no phase {src} measures explains it"
            culprit = " and ".join(f.label for f in self.findings)
            more = list(self.findings[1:])
            if more:
                head += "; also slow: " + ", ".join(
                    f"{f.label} ({f.phase or 'step'}, +{_ms(f.excess_s)})" for f in more)
        return f"{head}. {self._wait_sentence(culprit)}"

    def _words(self, phase: str) -> str:
        return self.words.get(phase) or _WORDS.get(phase, phase)

    def _wait_sentence(self, culprit: str) -> str:
        w = self.wait
        src = self.source
        if w is None:
            if self.no_wait is not None:
                return self.no_wait.replace("{culprit}", culprit)
            return ("The traces measure no communication or device idle time on both sides, so the other ranks' "
                    f"wait for {culprit} cannot be seen in them.")
        words = self.words.get(w.phase) or _WAIT_WORDS.get(w.phase, w.phase)
        if w.others_extra_s <= 0 or w.coverage <= 0:
            return (f"The other ranks do not spend longer in {words} than {culprit} does: they do not wait for it "
                    f"inside a collective (ranks that do not synchronize, or a wait {src} does not annotate).")
        if w.coverage >= WAIT_COVERAGE:
            return (f"The other ranks' {_ms(w.others_extra_s)} more {words} per step ({w.coverage:.0%} of the excess) "
                    f"is their wait for {culprit}: in a synchronous job (DDP) every rank waits in the gradient "
                    f"allreduce for the slowest, so the rank with the most {words.split(' (')[0]} is not the culprit.")
        return (f"The other ranks spend {_ms(w.others_extra_s)} more per step in {words}, {w.coverage:.0%} of the "
                f"excess: part of their wait for {culprit} shows there, the rest lies outside the phases {src} "
                "measures.")

    def as_dict(self) -> dict[str, Any]:
        """JSON types: the finding, every slow rank, the per-rank medians and the sentence."""
        return {"n_ranks": self.n_ranks, "slow_ranks": list(self.slow_ranks), "ranks": list(self.ranks),
                "node": self.node, "phase": self.phase, "excess_s": self.excess_s, "excess_pct": self.excess_pct,
                "spread_s": self.spread_s, "mean_step_s": self.mean_step_s, "min_excess": self.min_excess,
                "findings": [f.as_dict() for f in self.findings],
                "wait": self.wait.as_dict() if self.wait else None,
                "closest": self.closest.as_dict() if self.closest else None,
                "phases": list(self.phases),
                "medians": {k: dict(v) for k, v in self.medians.items()}, "sentence": self.sentence()}


def _ms(s: float | None) -> str:
    if s is None:
        return "n/a"
    ms = s * 1e3
    return f"{ms:.0f} ms" if abs(ms) >= 100 else f"{ms:.1f} ms" if abs(ms) >= 10 else f"{ms:.2f} ms"


def _iqr(vals: Sequence[float]) -> float:
    if len(vals) < 2:
        return 0.0
    q = statistics.quantiles(vals, n=4, method="inclusive")
    return q[2] - q[0]


def _as_rank(i: int, r: Any) -> RankPhases:
    if isinstance(r, RankPhases):
        rp = r
    elif hasattr(r, "steps") and hasattr(r, "label"):  # a helpers.traces RankTrace, read by duck typing
        rp = RankPhases.from_steps(str(r.label), r.steps, rank=getattr(r, "rank", None), node=getattr(r, "node", None))
    else:
        raise ParameterError(f"stragglers.find: ranks[{i}] is a {type(r).__name__}; pass RankPhases (label, phases) "
                             "or a helpers.traces RankTrace")
    for p, vals in rp.phases.items():
        for v in vals:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ParameterError(f"stragglers.find: {rp.label}: phase {p!r} holds {v!r}; per-step phase times "
                                     "are seconds, finite and >= 0 (leave an unmeasured phase out)")
    if not rp.phases.get(STEP):
        raise ParameterError(f"stragglers.find: {rp.label} has no step times ('{STEP}'); each rank needs at least "
                             "one step")
    return rp


class _Table:
    """Per-rank medians and interquartile ranges of each phase."""

    def __init__(self, ranks: Sequence[RankPhases]) -> None:
        self.ranks = list(ranks)
        self.med = {r.label: {p: statistics.median(v) for p, v in r.phases.items() if v} for r in ranks}
        self.iqr = {r.label: {p: _iqr(list(v)) for p, v in r.phases.items() if v} for r in ranks}

    def test(self, cand: RankPhases, others: Sequence[RankPhases], phase: str, min_excess: float) -> Finding | None:
        """The candidate's excess in ``phase`` over ``others`` (None when fewer than one other measures it)."""
        if phase not in self.med[cand.label]:
            return None
        have = [o for o in others if phase in self.med[o.label]]
        if not have:
            return None
        ref = statistics.median(self.med[o.label][phase] for o in have)
        spread = max(self.iqr[cand.label][phase], statistics.median(self.iqr[o.label][phase] for o in have))
        mean_step = statistics.fmean(self.med[o.label][STEP] for o in others)
        excess = self.med[cand.label][phase] - ref
        return Finding(label=cand.label, rank=cand.rank, node=cand.node, phase=None if phase == STEP else phase,
                       excess_s=excess, excess_fraction=excess / mean_step if mean_step > 0 else 0.0,
                       reference_s=ref, spread_s=spread, threshold_s=min_excess * mean_step, mean_step_s=mean_step)


def _passes(f: Finding | None) -> bool:
    return f is not None and f.excess_s > f.spread_s and f.excess_s > f.threshold_s


def _margin(f: Finding) -> float:
    """How close an excess comes to passing (1 = at the larger threshold)."""
    bar = max(f.spread_s, f.threshold_s)
    return f.excess_s / bar if bar > 0 else (math.inf if f.excess_s > 0 else 0.0)


def _pick(found: Sequence[Finding]) -> Finding | None:
    """The culprit's phase: the work phase with the largest passing excess; else the step."""
    work = [f for f in found if f.phase is not None]
    pool = work or list(found)
    return max(pool, key=lambda f: f.excess_s) if pool else None


def find(ranks: Sequence[Any], *, min_excess: float = MIN_EXCESS_FRACTION, source: str = "the trace",
         words: Mapping[str, str] | None = None, no_wait: str | None = None,
         confirm: Mapping[str, str] | None = None) -> SlowRanks:
    """Name the slow rank(s) of a job, or the slow node, and their phase (the rule: the module's docstring).

    Parameters
    ----------
    ranks : sequence of RankPhases or RankTrace
        One per rank, labels unique. A :class:`helpers.traces.model.RankTrace` (anything with ``label``, ``rank``,
        ``node`` and ``steps`` of phase attributes) is converted with :meth:`RankPhases.from_steps`.
    min_excess : float, default 0.05
        The share of the mean step time an excess must exceed (msprof-analyze's 5%), in (0, 1).
    source, words, no_wait :
        The sentence's wording (:class:`SlowRanks`): what measured the phases, how a phase is described where it
        is not the default's quantity, and what to say when no wait phase is measured. The rule is the same.
    confirm : mapping of str to str, optional
        Work phase -> wait phase: a rank is slow in that work phase only where the other ranks' extra time in the
        wait phase covers :data:`WAIT_COVERAGE` of its excess. For a work phase derived as the rest of a
        synchronized step (a live rank's compute minus its allreduce wait): a wait the caller did not measure
        (a collective elsewhere in the step) stays in it and would make a waiting rank look slow; a rank truly
        slow in it makes the others wait in the measured wait phase.

    Returns
    -------
    SlowRanks
        Frozen; ``sentence()`` and ``as_dict()``. One rank: ``n_ranks`` 1 and a sentence saying no comparison is
        possible.

    Raises
    ------
    ParameterError
        No rank, a rank of another type, a duplicate label, a rank without step times, a negative or non-finite
        time, or ``min_excess`` outside (0, 1).
    """
    if isinstance(min_excess, bool) or not isinstance(min_excess, (int, float)) or not 0 < min_excess < 1:
        raise ParameterError(f"stragglers.find: min_excess must be a share in (0, 1) (0.05 = 5% of the mean step), "
                             f"got {min_excess!r}")
    rows = [_as_rank(i, r) for i, r in enumerate(ranks)]
    if not rows:
        raise ParameterError("stragglers.find: no rank given; pass one RankPhases (or RankTrace) per rank")
    labels = [r.label for r in rows]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise ParameterError(f"stragglers.find: rank labels must be unique, {dup} appear more than once; label each "
                             "rank by its number (and node)")
    t = _Table(rows)
    medians = {r.label: dict(t.med[r.label]) for r in rows}
    wording = {"source": str(source), "words": dict(words or {}), "no_wait": no_wait}
    if len(rows) == 1:
        return SlowRanks(n_ranks=1, medians=medians, min_excess=float(min_excess), **wording)
    present = {p for r in rows for p in t.med[r.label]}
    phases = tuple(p for p in (STEP, *WORK_PHASES) if p in present) + tuple(
        sorted(p for p in present if p not in _KNOWN))
    mean_step = statistics.fmean(t.med[r.label][STEP] for r in rows)

    confirm = dict(confirm or {})
    node, findings = _node_finding(rows, t, phases, min_excess, confirm)
    closest = None
    if node is None:
        findings = []
        tried = []
        for r in rows:
            others = [o for o in rows if o is not r]
            res = [t.test(r, others, p, min_excess) for p in phases]
            res = [f for f in res if f is not None]
            tried += res
            pick = _pick([f for f in res if _passes(f) and _confirmed(f, [r], others, t, confirm)])
            if pick is not None:
                findings.append(pick)
        findings.sort(key=lambda f: f.excess_s, reverse=True)
        if not findings and tried:
            closest = max(tried, key=_margin)
    wait = _wait(rows, t, findings) if findings else None
    return SlowRanks(n_ranks=len(rows), findings=tuple(findings), node=node, mean_step_s=mean_step,
                     min_excess=float(min_excess), wait=wait, medians=medians, phases=phases, closest=closest,
                     **wording)


def _confirmed(f: Finding, culprits: Sequence[RankPhases], others: Sequence[RankPhases], t: _Table,
               confirm: Mapping[str, str]) -> bool:
    """Whether a finding in a phase of ``confirm`` is backed by the others' wait (see :func:`find`); True for the
    other phases."""
    wait = confirm.get(f.phase) if f.phase is not None else None
    if wait is None:
        return True
    c = [t.med[r.label][wait] for r in culprits if wait in t.med[r.label]]
    o = [t.med[r.label][wait] for r in others if wait in t.med[r.label]]
    return bool(c and o) and statistics.median(o) - statistics.median(c) >= WAIT_COVERAGE * f.excess_s


def _node_finding(rows: Sequence[RankPhases], t: _Table, phases: Sequence[str],
                  min_excess: float, confirm: Mapping[str, str] | None = None) -> tuple[str | None, list[Finding]]:
    """A node all of whose ranks (two or more) are slow in one phase against the other nodes' ranks, with no rank
    outside it slow against the others outside it."""
    if any(r.node is None for r in rows) or len({r.node for r in rows}) < 2:
        return None, []
    best: tuple[str, list[Finding]] | None = None
    for node in sorted({r.node for r in rows}):
        inside = [r for r in rows if r.node == node]
        outside = [r for r in rows if r.node != node]
        if len(inside) < 2:
            continue
        passing: dict[str, list[Finding]] = {}
        for p in phases:
            res = [t.test(r, outside, p, min_excess) for r in inside]
            if not all(_passes(f) and _confirmed(f, inside, outside, t, confirm or {}) for f in res):
                continue
            elsewhere = [t.test(o, [x for x in outside if x is not o], p, min_excess) for o in outside]
            if any(_passes(f) for f in elsewhere):
                continue
            passing[p] = sorted(res, key=lambda f: f.excess_s, reverse=True)
        if not passing:
            continue
        work = [p for p in passing if p != STEP]
        phase = max(work or list(passing), key=lambda p: statistics.median(f.excess_s for f in passing[p]))
        cand = (node, passing[phase])
        if best is None or statistics.median(f.excess_s for f in cand[1]) > statistics.median(
                f.excess_s for f in best[1]):
            best = cand
    return (best[0], best[1]) if best else (None, [])


def _wait(rows: Sequence[RankPhases], t: _Table, findings: Sequence[Finding]) -> Wait | None:
    """The other ranks' extra time in a wait phase over the culprits'."""
    slow = {f.label for f in findings}
    culprits = [r for r in rows if r.label in slow]
    others = [r for r in rows if r.label not in slow]
    if not others:
        return None
    excess = findings[0].excess_s
    waits = []
    for p in _WAIT_PREFERENCE:
        c = [t.med[r.label][p] for r in culprits if p in t.med[r.label]]
        o = [t.med[r.label][p] for r in others if p in t.med[r.label]]
        if not c or not o:
            continue
        gap = statistics.median(o) - statistics.median(c)
        waits.append(Wait(phase=p, others_extra_s=gap, coverage=gap / excess if excess > 0 else 0.0))
    covering = [w for w in waits if w.coverage >= WAIT_COVERAGE]
    if covering:
        return covering[0]
    return max(waits, key=lambda w: w.others_extra_s) if waits else None
