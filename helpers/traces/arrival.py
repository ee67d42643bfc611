"""Which rank arrives last at the collectives, and which ranks wait for it: the straggler as the traces show it.

A collective (an NCCL/RCCL allreduce kernel on a GPU, a gloo ``gloo:*`` span on a CPU) starts on each rank when
that rank reaches it and ends on every rank at about the same time, once the last one has arrived and the data
has moved. So its duration on a rank is that rank's wait for the others plus the transfer, and the rank that
arrives last has the shortest one. Comparing durations, not start times, needs no common clock: ranks on
different hosts have clocks that disagree by more than a collective lasts.

This is HolisticTraceAnalysis' straggler idea (``hta/analyzers/straggler.py``,
``find_stragglers_with_late_start_comm_kernels``: the rank that starts its communication kernels late), read
clock-free. For each collective matched across ranks (the k-th collective of step N, the same name on every
rank), the rank with the shortest duration arrived last; its lateness is the longest duration minus the
shortest (how long the first rank waited for it). A rank is **the straggler** when it arrives last in at least
:data:`MAJORITY` of the collectives whose lateness is above noise (:data:`MIN_LATE_FRACTION` of the median
step, msprof-analyze's 5% slow-rank ratio, :data:`helpers.stragglers.MIN_EXCESS_FRACTION`), those are at
least :data:`MIN_COLLECTIVES`, and ranks that are all alike would give some rank such a count with a chance of
:data:`CHANCE` or less (:func:`chance_of`). The other ranks are **the ranks that wait**, each with its median wait. A rank
that waits is never called slow.

Part of the traces layer; imports only the foundation and :mod:`helpers.traces.model`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from helpers.stragglers import MIN_EXCESS_FRACTION
from helpers.traces.model import RankTrace

__all__ = ["MAJORITY", "MIN_COLLECTIVES", "MIN_LATE_FRACTION", "CHANCE", "Arrival", "chance_of", "find_last"]

#: Share of the late collectives a rank must arrive last at to be the straggler: more than half, so one rank.
MAJORITY = 0.5
#: Late collectives needed before naming a straggler (fewer: one odd collective decides nothing).
MIN_COLLECTIVES = 3
#: Largest chance, in a job whose ranks are all alike, that some rank arrives last at least as often as the one
#: named: 1%. With few collectives a majority comes by chance (4 even gloo ranks on 2 cores: one was last at 6 of
#: 10, which chance gives some rank about 8% of the time).
CHANCE = 0.01
#: A collective's lateness (longest minus shortest duration across ranks) counts when above this share of the
#: median step: msprof-analyze's 5% (:data:`helpers.stragglers.MIN_EXCESS_FRACTION`).
MIN_LATE_FRACTION = MIN_EXCESS_FRACTION


def chance_of(count: int, late: int, ranks: int) -> float:
    """Chance that some rank of ``ranks`` equally likely ones arrives last at ``count`` or more of ``late``
    collectives: the binomial tail at p = 1 / ranks, times the number of ranks (Bonferroni), at most 1."""
    if ranks < 2 or late < 1:
        return 1.0
    p = 1.0 / ranks
    tail = sum(math.comb(late, k) * p ** k * (1 - p) ** (late - k) for k in range(count, late + 1))
    return min(1.0, ranks * tail)


def _ms(s: float) -> str:
    return f"{s * 1e3:.1f} ms" if s >= 1e-3 else f"{s * 1e6:.0f} us"


@dataclass(frozen=True)
class Arrival:
    """The arrival finding of a set of ranks' traces.

    Attributes
    ----------
    matched : int
        Collectives matched across all the ranks (same step, same position, same name).
    late : int
        Of those, the collectives whose lateness is above :data:`MIN_LATE_FRACTION` of the median step.
    step_s : float
        The median step over the ranks, seconds.
    last_counts : dict of str to int
        Per rank label, how many of the late collectives it arrived last at.
    straggler : str or None
        The rank that arrives last at :data:`MAJORITY` or more of the late collectives (None: none does, or too
        few late collectives).
    lateness_s : float or None
        The straggler's median lateness over the late collectives it was last at, seconds.
    waits_s : dict of str to float
        Per other rank, its median wait for the last rank over the late collectives, seconds.
    ranks : tuple of str
        The ranks compared, in order.
    """

    matched: int
    late: int
    step_s: float
    last_counts: dict[str, int]
    straggler: str | None
    lateness_s: float | None
    waits_s: dict[str, float] = field(default_factory=dict)
    ranks: tuple[str, ...] = ()

    @property
    def lateness_fraction(self) -> float | None:
        """The straggler's median lateness / the median step (0..1), None without a straggler."""
        if self.lateness_s is None or self.step_s <= 0:
            return None
        return self.lateness_s / self.step_s

    def pointed(self) -> tuple[str, int, float] | None:
        """The rank the arrivals point to when the evidence does not name a straggler: (label, late collectives it
        arrived last at, the chance that ranks all alike give some rank that count or more, :func:`chance_of`);
        None where a straggler is named, no collective is late, or two ranks share the highest count."""
        if self.straggler is not None or self.late < 1 or not self.last_counts:
            return None
        counts = sorted(self.last_counts.values(), reverse=True)
        if counts[0] == 0 or (len(counts) > 1 and counts[1] == counts[0]):
            return None
        top = max(self.last_counts, key=self.last_counts.get)
        return top, counts[0], chance_of(counts[0], self.late, len(self.ranks) or len(self.last_counts))

    def sentence(self) -> str:
        """The finding in words, with its evidence (how many collectives it rests on)."""
        if self.matched == 0:
            return ("no collective could be matched across the ranks (none recorded, or the ranks' steps hold "
                    "different collectives), so which rank arrives last is not known")
        if self.straggler is None:
            if self.late < MIN_COLLECTIVES:
                return (f"the ranks arrive at their collectives together: {self.late} of {self.matched} matched "
                        f"collectives {'has' if self.late == 1 else 'have'} one rank later by more than "
                        f"{_ms(MIN_LATE_FRACTION * self.step_s)} ({MIN_LATE_FRACTION:.0%} of the "
                        f"{_ms(self.step_s)} median step), too few to name a rank")
            counts = ", ".join(f"{k} {v}" for k, v in sorted(self.last_counts.items(), key=lambda kv: -kv[1]) if v)
            top, n = max(self.last_counts.items(), key=lambda kv: kv[1])
            if n > MAJORITY * self.late:
                return (f"{top} arrived last at {n} of {self.late} late collectives, but ranks that are all alike "
                        f"give one rank such a count {chance_of(n, self.late, len(self.ranks)):.0%} of the time "
                        f"(above {CHANCE:.0%}): too few collectives to name it; profile more steps to decide")
            return (f"no single rank arrives last: of {self.late} late collectives, the last to arrive was "
                    f"{counts}; the lateness moves between ranks (a shared cause or noise), so no rank is named")
        n = self.last_counts[self.straggler]
        waits = ", ".join(f"{k} {_ms(v)}" for k, v in sorted(self.waits_s.items(), key=lambda kv: -kv[1]))
        return (f"{self.straggler} arrives last at {n} of {self.late} late collectives ({self.matched} matched), "
                f"{_ms(self.lateness_s or 0.0)} after the first rank ({self.lateness_fraction or 0:.0%} of the "
                f"{_ms(self.step_s)} median step); the others wait for it inside the collective (median wait: "
                f"{waits}): their communication time is that wait, not slow communication")

    def as_dict(self) -> dict[str, Any]:
        """The finding as JSON types."""
        return {"matched": self.matched, "late": self.late, "step_s": self.step_s,
                "last_counts": dict(self.last_counts), "straggler": self.straggler, "lateness_s": self.lateness_s,
                "lateness_fraction": self.lateness_fraction, "waits_s": dict(self.waits_s),
                "ranks": list(self.ranks), "sentence": self.sentence()}


def _matched(traces: Sequence[RankTrace]) -> np.ndarray:
    """Durations (seconds) of the collectives matched across all ranks: shape (collectives, ranks)."""
    per_rank = []
    for t in traces:
        by_step: dict[int, list[tuple[str, float]]] = {}
        for step, name, dur in t.collectives:
            by_step.setdefault(step, []).append((name, dur))
        per_rank.append(by_step)
    steps = sorted(set.intersection(*(set(d) for d in per_rank))) if per_rank else []
    rows = []
    for s in steps:
        seqs = [d[s] for d in per_rank]
        if len({len(q) for q in seqs}) != 1:
            continue  # the ranks' step spans hold different collectives: not matched
        for k in range(len(seqs[0])):
            names = {q[k][0] for q in seqs}
            if len(names) == 1:
                rows.append([q[k][1] for q in seqs])
    return np.asarray(rows, dtype=float).reshape(-1, len(traces))


def find_last(traces: Sequence[RankTrace]) -> Arrival | None:
    """The rank that arrives last at the collectives, from two or more ranks' traces.

    Parameters
    ----------
    traces : sequence of RankTrace
        The ranks of one job (:func:`helpers.traces.read`), each with its ``collectives``.

    Returns
    -------
    Arrival or None
        None for fewer than two ranks or where no rank records a collective; else the finding (with
        ``straggler`` None when the evidence names no rank: see :meth:`Arrival.sentence`).
    """
    traces = list(traces)
    if len(traces) < 2 or not any(t.collectives for t in traces):
        return None
    labels = tuple(t.label for t in traces)
    steps = [s.step_s for t in traces for s in t.steps]
    step_s = float(np.median(steps)) if steps else 0.0
    d = _matched(traces)
    counts = {lab: 0 for lab in labels}
    if not len(d):
        return Arrival(matched=0, late=0, step_s=step_s, last_counts=counts, straggler=None, lateness_s=None,
                       ranks=labels)
    lateness = d.max(axis=1) - d.min(axis=1)
    late = lateness > MIN_LATE_FRACTION * step_s
    last = d.argmin(axis=1)
    for i in last[late]:
        counts[labels[int(i)]] += 1
    n_late = int(late.sum())
    straggler = None
    if n_late >= MIN_COLLECTIVES:
        top = max(counts, key=counts.get)
        if counts[top] > MAJORITY * n_late and chance_of(counts[top], n_late, len(labels)) <= CHANCE:
            straggler = top
    lateness_s, waits = None, {}
    if straggler is not None:
        j = labels.index(straggler)
        rows = late & (last == j)
        lateness_s = float(np.median(lateness[rows]))
        wait = d[rows] - d[rows, j][:, None]
        waits = {lab: float(np.median(wait[:, i])) for i, lab in enumerate(labels) if i != j}
    return Arrival(matched=int(len(d)), late=n_late, step_s=step_s, last_counts=counts, straggler=straggler,
                   lateness_s=lateness_s, waits_s=waits, ranks=labels)
