"""The instrument's reports: one loop's (:class:`LoopReport`) and the whole job's from every rank's figures
(:func:`job_report`, :class:`JobReport`: the table, the job's verdict, the slow-rank sentence, what the
communication hid), and DDP's own timers as the ranks send them (:func:`ddp_timers`).

:mod:`helpers.workbook.instrument` times the loop (:class:`helpers.workbook.instrument.InstrumentedLoader`) and
gathers the ranks' figures; what is measured, and how the ranks' reports are read, is described there. Every
report here is made from figures already taken, and never raises for them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

import pandas as pd

from helpers import bottleneck, machine, stragglers
from helpers.errors import ParameterError
from helpers.experiments.baseline import spare_cores
from helpers.jobs.check import Divergence
from helpers.verdict import Verdict, detail_lines

__all__ = ["JobReport", "LoopReport", "ddp_timers", "job_report"]

#: Appended to the "next" advice when the input counts: the measurement the instrument cannot make in a loop.
_DIAGNOSE = "; `python -m helpers diagnose --job` measures what free input would give"


@dataclass(frozen=True)
class LoopReport:
    """What :meth:`InstrumentedLoader.report` found.

    Attributes
    ----------
    steps : pandas.DataFrame
        One row per measured step: ``data``, ``copy``, ``compute``, ``step_s`` (seconds), ``exposed_fraction``.
    exposed_fraction : float
        Median over steps of (data + copy) / step.
    recommendation : str
        One of :data:`helpers.bottleneck.LABELS`, or "inconclusive": a busy machine (``measured_recommendation``
        keeps the label), or fewer than 3 steps measured (``measured_recommendation`` is "inconclusive" too and
        ``bottleneck`` None).
    measured_recommendation, reason : str
    next_notebook : str
        The notebooks to open next, with why (:meth:`helpers.bottleneck.Bottleneck.next_text`).
    machine : helpers.machine.BusyCheck
    bottleneck : helpers.bottleneck.Bottleneck or None
        The classification (the two levers' savings, the idle cores).
    divergence : helpers.jobs.check.Divergence or None
        Where the loss given to :meth:`InstrumentedLoader.loss` first became NaN or infinite (step counted from 1,
        warm-up included); None when no loss was given. When it did, ``recommendation`` is "inconclusive",
        ``reason`` is its sentence ("your job diverges: ...") and the printed report gives no verdict.
    """

    steps: Any
    exposed_fraction: float
    recommendation: str
    measured_recommendation: str
    reason: str
    next_notebook: str
    machine: Any
    bottleneck: Any = None
    divergence: Any = None

    def verdict(self, name: str = "your loop") -> Verdict:
        """The report as a :class:`helpers.verdict.Verdict`: the exposed input share (fraction of the step, median
        with the steps' interquartile range), the label or "inconclusive" and why, the notebooks to open next."""
        df = self.steps
        spread = ({"p25": float(df["exposed_fraction"].quantile(0.25)),
                   "p75": float(df["exposed_fraction"].quantile(0.75))} if len(df) else None)
        value = self.exposed_fraction if len(df) and math.isfinite(self.exposed_fraction) else None
        extra: dict[str, Any] = {"measured_recommendation": self.measured_recommendation}
        if self.bottleneck is not None:
            extra["bottleneck"] = {"next_notebooks": list(self.bottleneck.next_notebooks)}
        if self.machine is not None:
            extra["machine"] = {"busy": bool(self.machine.busy)}
        if self.divergence is not None and self.divergence.diverged:
            extra["divergence"] = {"first": str(self.divergence.first)}
        elif self.bottleneck is None:
            extra["inconclusive_why"] = f"too few steps, run at least {MIN_STEPS} after the warm-up"
        return Verdict(notebook=name, metric="exposed_input_fraction", value=value, unit="fraction",
                       recommendation=self.recommendation, reason=self.reason, spread=spread if value is not None
                       else None, extra=extra)

    def lines(self, name: str = "your loop") -> list[str]:
        """The printed report: the steps measured, the verdict's headline (what to do, the exposed share and its
        interval; :meth:`helpers.verdict.Verdict.headline`), its reason a clause per line, the phase medians,
        the notebooks to open next and the machine's state."""
        df = self.steps
        verdict = self.verdict(name)

        def phase(col: str) -> str:
            return (f"{col} {df[col].median() * 1e3:.1f} ms (IQR {df[col].quantile(0.25) * 1e3:.1f}-"
                    f"{df[col].quantile(0.75) * 1e3:.1f})")

        machine_line = [f"machine: {self.machine.sentence()}"] if self.machine is not None else []
        step_line = ([f"median step {df['step_s'].median() * 1e3:.1f} ms: {phase('data')}, {phase('copy')}, "
                      f"{phase('compute')}"] if len(df) else [])
        counted = f"{name}: {len(df)} step{'s' if len(df) != 1 else ''} measured"
        if self.divergence is not None and self.divergence.diverged:  # a loss that is not finite: no verdict
            return [counted, verdict.headline(), *detail_lines(self.reason), *step_line, *machine_line]
        if self.bottleneck is None:  # too few steps for a verdict: what it has, and what to do
            return [counted, verdict.headline(), *detail_lines(self.reason), *step_line,
                    f"next: {self.next_notebook}", *machine_line]
        measured = (f"what it measured: {self.measured_recommendation}: " if self.recommendation == "inconclusive"
                    else "")
        return [counted, verdict.headline(), *detail_lines(measured + self.reason), *step_line,
                f"next: {self.next_notebook}", *machine_line]


#: The communication line without DDP's timers: what the instrument cannot see then.
_NOT_MEASURED = ("not measured without a DDP model passed to instrument(..., model=ddp): the compute column holds "
                 "each rank's wait in the collectives, and a rank slow in its own compute cannot be told from the "
                 "ranks that wait for it (the instrument adds no synchronize inside the step)")


def ddp_timers(model: Any) -> tuple[dict[str, float] | None, str]:
    """DDP's own timers of ``model`` (seconds), and a sentence when there are none.

    Reads ``DistributedDataParallel._get_ddp_logging_data()`` (a private but long-standing method, also read by
    :func:`helpers.comm.ddp.bucket_sizes`): ``avg_forward_compute_time``, ``avg_backward_compute_time``,
    ``avg_backward_comm_time`` and ``avg_backward_compute_comm_overlap_time``, nanoseconds, averaged by DDP over
    the iterations it samples (the first 10 and every 100th: ``should_collect_runtime_stats`` in torch's
    ``torch/csrc/distributed/c10d/reducer.cpp``). Nothing is synchronized by this call.

    Returns
    -------
    (dict or None, str)
        ``forward_s``, ``backward_compute_s``, ``backward_comm_s``, ``overlap_s``, ``hidden_fraction``
        (overlap / communication, 0..1) and ``exposed_comm_s`` (communication - overlap); or None and why.
    """
    if model is None:
        return None, _NOT_MEASURED
    get = getattr(model, "_get_ddp_logging_data", None)
    if get is None:
        return None, f"not measured: model= is a {type(model).__name__}, not a DistributedDataParallel model"
    try:
        d = get()
    except Exception as exc:  # noqa: BLE001  a private method: any failure means no figures, said so
        return None, f"not measured: DDP's timers could not be read ({type(exc).__name__}: {exc})"
    comm = float(d.get("avg_backward_comm_time", 0) or 0) * 1e-9
    if comm <= 0:
        return None, "not measured: DDP has not sampled its timers yet (it does from its first backward passes)"
    overlap = float(d.get("avg_backward_compute_comm_overlap_time", 0) or 0) * 1e-9
    return {"forward_s": float(d.get("avg_forward_compute_time", 0) or 0) * 1e-9,
            "backward_compute_s": float(d.get("avg_backward_compute_time", 0) or 0) * 1e-9,
            "backward_comm_s": comm, "overlap_s": overlap, "hidden_fraction": min(1.0, overlap / comm),
            "exposed_comm_s": max(0.0, comm - overlap)}, ""


@dataclass(frozen=True)
class JobReport:
    """What rank 0's :meth:`InstrumentedLoader.report` found for the whole job (:func:`job_report`).

    Attributes
    ----------
    table : pandas.DataFrame
        One row per rank that reported 3 steps or more: ``rank``, ``node``, ``steps``, ``data_ms``, ``copy_ms``,
        ``compute_ms``, ``step_ms`` (medians over its steps, milliseconds), ``exposed_pct`` (median (data + copy)
        / step, %), ``wait_ms`` (the allreduce time not hidden behind backward, DDP's timers on the steps it
        sampled: the rank's wait for the others) and ``own_compute_ms`` (compute minus that wait, on those steps),
        ``allreduce_ms`` and ``allreduce_hidden_pct`` (DDP's own averages); NaN where not measured.
    exposed_fraction : float
        The job's exposed input share: the largest rank's (the slowest rank bounds a synchronous job); NaN when no
        rank measured 3 steps.
    bound_by : str
        Who sets it: the slow node or rank(s) of ``slow`` where they are slow in input, else the rank with the
        largest share.
    recommendation, measured_recommendation, reason, next_notebook : str
        As in :class:`LoopReport`, for the job. ``recommendation`` is "inconclusive" on a busy machine, with ranks
        missing (the missing one may be the slow one) and with no rank of 3 steps (``measured_recommendation``
        "inconclusive" too).
    slow : helpers.stragglers.SlowRanks or None
        The slow-rank rule's finding (None with fewer than two ranks reporting 3 steps).
    missing : tuple of int
        Ranks that had not reported at the timeout (or whose only file was another launch's).
    world_size : int
    notes : tuple of str
        Different step counts, missing ranks, rank files of another launch ignored, what the compute phase holds
        and what the report cannot see.
    communication : str
        How much of the allreduce hid behind backward per rank, or why it is not known.
    machine : helpers.machine.BusyCheck or None
        The job's machine check: per host, the job's ranks on it (every launch's) count as its own work; the
        busiest host's.
    bottleneck : helpers.bottleneck.Bottleneck or None
    transport : str
    wait_measured : bool
        Whether the slow-rank rule compared each rank's compute outside its allreduce wait (DDP's per-step timers,
        every rank): the table then shows the wait column.
    """

    table: Any
    exposed_fraction: float
    bound_by: str
    recommendation: str
    measured_recommendation: str
    reason: str
    next_notebook: str
    slow: Any
    missing: tuple[int, ...]
    world_size: int
    notes: tuple[str, ...] = ()
    communication: str = ""
    machine: Any = None
    bottleneck: Any = None
    transport: str = ""
    waited_s: float = 0.0
    verdict_line: str = field(default="", repr=False)
    wait_measured: bool = False

    def lines(self, name: str = "your loop") -> list[str]:
        """The printed report: a header, the table, the job's verdict, the slow rank, communication, notes,
        next, machine."""
        t = self.table
        nodes = t["node"].nunique() if len(t) else 0
        counts = sorted(set(int(n) for n in t["steps"])) if len(t) else []
        per = ("no rank measured 3 steps" if not counts else f"{counts[0]} steps measured per rank"
               if len(counts) == 1 else f"{counts[0]}-{counts[-1]} steps measured per rank")
        out = [f"{name}: {len(t)} of {self.world_size} ranks on {nodes} node(s), {per} (gathered through the "
               f"{self.transport} in {self.waited_s:.1f} s)"]
        width = max([4] + [len(str(n)) for n in t["node"]]) if len(t) else 4
        wait = self.wait_measured
        out.append(f"{'rank':>4}  {'node':<{width}}  {'steps':>5}  {'data ms':>8}  {'copy ms':>8}  "
                   f"{'compute ms':>10}  " + (f"{'wait ms':>8}  " if wait else "") + f"{'step ms':>8}  {'exposed':>7}")
        for row in t.itertuples():
            out.append(f"{row.rank:>4}  {row.node:<{width}}  {row.steps:>5}  {row.data_ms:>8.1f}  {row.copy_ms:>8.1f}"
                       f"  {row.compute_ms:>10.1f}  " + (f"{row.wait_ms:>8.1f}  " if wait else "") +
                       f"{row.step_ms:>8.1f}  {row.exposed_pct:>6.0f}%")
        if wait:
            out.append("(wait: the allreduce time not hidden behind backward, DDP's own timers on the steps it "
                       "sampled: the rank's wait for the others; the slow-rank rule compares compute minus wait)")
        out.append(self.verdict_line)
        if self.slow is not None:
            out.append(f"slow: {self.slow.sentence()}")
        out.append(f"communication: {self.communication}")
        out += [f"note: {n}" for n in self.notes]
        out.append(f"next: {self.next_notebook}")
        if self.machine is not None:
            out.append(f"machine: {self.machine.sentence()}")
        return out

    def as_dict(self) -> dict[str, Any]:
        """JSON types: the table's rows, the verdict, the slow-rank finding, notes."""
        return {"ranks": self.table.to_dict(orient="records"), "world_size": self.world_size,
                "missing": list(self.missing), "exposed_fraction": self.exposed_fraction, "bound_by": self.bound_by,
                "recommendation": self.recommendation, "measured_recommendation": self.measured_recommendation,
                "reason": self.reason, "verdict": self.verdict_line, "next": self.next_notebook,
                "slow": self.slow.as_dict() if self.slow is not None else None, "notes": list(self.notes),
                "communication": self.communication, "wait_measured": self.wait_measured,
                "machine": self.machine.sentence() if self.machine is not None else None}


def _job_machine(payloads: Mapping[int, Mapping[str, Any]], busy_cpu_share: float):
    """The busiest host's check, the job's ranks on each host (every launch on it) counted as the job's work.

    Each launch's own CPU time (its launcher's process tree: :func:`helpers.machine._job_root`; a rank started
    without torchrun, e.g. by srun alone, is a launch of its own) is taken once, from its lowest rank; the
    machine's CPU time and the interval from the host's lowest rank."""
    worst = None
    hosts: dict[str, list[int]] = {}
    for r, p in payloads.items():
        if p.get("machine_before") and p.get("machine_after"):
            hosts.setdefault(str(p.get("host")), []).append(r)
    for host, ranks in hosts.items():
        ranks.sort()
        ref = payloads[ranks[0]]
        launches: dict[Any, int] = {}
        for r in ranks:  # one launch: one torchrun's ranks (they share its process tree), or one lone process
            launches.setdefault(payloads[r].get("launch", payloads[r].get("node_rank")), r)
        own_b = sum(payloads[r]["machine_before"]["own_cpu_s"] for r in launches.values())
        own_a = sum(payloads[r]["machine_after"]["own_cpu_s"] for r in launches.values())
        before = machine.MachineState(**{**ref["machine_before"], "own_cpu_s": own_b})
        after = machine.MachineState(**{**ref["machine_after"], "own_cpu_s": own_a})
        try:
            c = machine.check(before, after, max_other_cpu_share=busy_cpu_share)
        except ParameterError:
            continue
        if worst is None or (c.busy, c.other_cpu_share) > (worst.busy, worst.other_cpu_share):
            worst = c
    return worst


def job_report(payloads: Mapping[int, Mapping[str, Any]], *, world_size: int, missing: Sequence[int] = (),
               threshold: float = 0.10, busy_cpu_share: float = machine.MAX_OTHER_CPU_SHARE,
               transport: str = "", waited_s: float = 0.0, stopped_by: str = "", ignored: str = "") -> JobReport:
    """One report for the whole job from every rank's figures (rank 0 of :meth:`InstrumentedLoader.report`).

    Parameters
    ----------
    payloads : mapping of int to dict
        Rank -> what :meth:`InstrumentedLoader._payload` sent: ``steps`` (``data``, ``copy``, ``compute``,
        ``step_s`` lists, seconds per step; ``wait``, DDP's allreduce wait of the steps it sampled, None for the
        others), ``node``, ``host``, ``node_rank``, ``device_kind``, ``copy_marked``, ``synchronous``, ``ddp``
        (:func:`ddp_timers`), ``warmup``, ``machine_before`` / ``machine_after`` (:class:`helpers.machine.MachineState`
        as dicts).
    world_size : int
        Ranks in the job (the missing ones included).
    missing : sequence of int
        Ranks that did not report.
    threshold, busy_cpu_share : float
        As in :class:`InstrumentedLoader`.
    transport, waited_s, stopped_by : as in :class:`helpers.comm.gather.Gathered`.
    ignored : str
        The note on rank files of another launch that were not merged ("" for none).

    Returns
    -------
    JobReport
        Never raises for the figures: with no rank of 3 steps its verdict is "inconclusive" and says so. Where a
        rank's payload has ``nonfinite`` (``[step, stat, value]``: its first NaN or infinite loss,
        :meth:`InstrumentedLoader.loss`), the job diverges: "inconclusive", with the divergence's sentence as
        the reason and the verdict line.
    """
    rows, frames = _rank_tables(payloads)
    few = sorted(set(payloads) - set(frames))
    table = pd.DataFrame(rows, columns=_TABLE_COLUMNS)
    ddps = {r: payloads[r].get("ddp") for r in frames}
    synchronous = any(payloads[r].get("synchronous") for r in frames)
    mode = _rule_mode(frames, synchronous)
    notes = ([ignored] if ignored else []) + _reporting_notes(
        rows, few, payloads=payloads, world_size=world_size, missing=missing, stopped_by=stopped_by,
        synchronous=synchronous, mode=mode, frames=frames)
    if not frames:
        return _with_divergence(payloads, _too_few_job(payloads, table=table, world_size=world_size, missing=missing,
                                                       notes=notes, transport=transport, waited_s=waited_s))
    # the slow-rank rule on the per-step phases (the compute phase of a synchronizing job holds its wait)
    slow = _slow_ranks(frames, payloads, mode=mode, marked=any(payloads[r].get("copy_marked") for r in frames))
    communication = _communication(frames, payloads, ddps, synchronous=synchronous, mode=mode)
    # the job's verdict: the largest exposed share bounds a synchronous job
    exposed = {r: float(df["exposed_fraction"].median()) for r, df in frames.items()}
    top = max(exposed, key=exposed.get)
    x = exposed[top]
    check = _job_machine({r: payloads[r] for r in frames}, busy_cpu_share)
    kind = str(payloads[top].get("device_kind", "cpu"))
    data, copy = float(frames[top]["data"].median()), float(frames[top]["copy"].median())
    b = bottleneck.classify(min(1.0, max(0.0, x)), threshold, device_kind=kind,
                            spare_cores=spare_cores(kind, getattr(check, "other_cpu_share", None)),
                            copy_share=copy / (data + copy) if data + copy > 0 else None)
    partial = len(frames) < int(world_size)
    who, line = _job_verdict_line(b, slow, exposed, top, payloads=payloads, threshold=threshold, check=check,
                                  synchronous=synchronous, world_size=int(world_size))
    nxt = b.next_text() + (_DIAGNOSE if b.label != bottleneck.DEVICE_BOUND else "")
    if partial:  # the lever rests on the ranks that reported: say so, never as the job's
        nxt = (f"first have every rank report (a rank that did not may be the slow one: let every rank reach "
               f"report(), or raise gather_timeout_s); for the {len(frames)} that did: {nxt}")
    busy = check is not None and check.busy
    rep = JobReport(table=table, exposed_fraction=x, bound_by=who,
                    recommendation="inconclusive" if busy or partial else b.label,
                    measured_recommendation=b.label, reason=b.reason, next_notebook=nxt,
                    slow=slow, missing=tuple(missing), world_size=int(world_size), notes=tuple(notes),
                    communication=communication, machine=check, bottleneck=b, transport=transport,
                    waited_s=float(waited_s), verdict_line=line, wait_measured=mode == "ddp-wait")
    return _with_divergence(payloads, rep)  # a rank whose loss is not finite: the job diverges, no verdict


#: The least steps a rank must measure after its warm-up for a verdict.
MIN_STEPS = 3
_TABLE_COLUMNS = ["rank", "node", "steps", "data_ms", "copy_ms", "compute_ms", "step_ms", "exposed_pct", "wait_ms",
                  "own_compute_ms", "allreduce_ms", "allreduce_hidden_pct"]


def _diverged(df: pd.DataFrame, divergence: Divergence, check: Any) -> LoopReport:
    """One rank's report when its loss became NaN or infinite: its figures, the divergence's sentence, no verdict."""
    exposed = float(df["exposed_fraction"].median()) if len(df) else float("nan")
    return LoopReport(steps=df, exposed_fraction=exposed, recommendation="inconclusive",
                      measured_recommendation="inconclusive", reason=divergence.sentence(),
                      next_notebook="fix the job's training, then measure again", machine=check, bottleneck=None,
                      divergence=divergence)


def _with_divergence(payloads: Mapping[int, Mapping[str, Any]], rep: JobReport) -> JobReport:
    """``rep``, made "your job diverges" where a rank's loss became NaN or infinite (its payload's ``nonfinite``)."""
    first: dict[str, tuple[int, str, float] | None] = {}
    for r in sorted(payloads):
        bad = payloads[r].get("nonfinite")
        try:
            first[f"rank {r}"] = (int(bad[0]), str(bad[1]), float(bad[2])) if bad else None
        except (TypeError, ValueError, IndexError):  # a payload this version cannot read: no divergence from it
            first[f"rank {r}"] = None
    div = Divergence(first=first, steps={f"rank {r}": int(payloads[r].get("seen") or 0) for r in sorted(payloads)})
    if not div.diverged:
        return rep
    return replace(rep, recommendation="inconclusive", measured_recommendation="inconclusive", reason=div.sentence(),
                   verdict_line=f"job: {div.sentence()}", next_notebook="fix the job's training, then measure again")


def _few_sentence(n: int, warmup: int | None, seen: int | None = None) -> str:
    """``"only 2 steps measured after the 3 warm-up steps: too few for a verdict; run more steps"``."""
    after = (f" after the {warmup} warm-up step{'s' if warmup != 1 else ''}" if warmup else
             " (no warm-up)" if warmup == 0 else " after the warm-up")
    ran = f" (the loop ran {seen} in all)" if seen is not None and n == 0 and seen else ""
    return (f"only {n} step{'s' if n != 1 else ''} measured{after}{ran}: too few for a verdict; run more steps (at "
            f"least {MIN_STEPS} after the warm-up)")


def _too_few(df: pd.DataFrame, warmup: int, seen: int, check: Any) -> LoopReport:
    """One rank's report with fewer than :data:`MIN_STEPS` steps measured: what it has, an inconclusive verdict."""
    exposed = float(df["exposed_fraction"].median()) if len(df) else float("nan")
    return LoopReport(steps=df, exposed_fraction=exposed, recommendation="inconclusive",
                      measured_recommendation="inconclusive", reason=_few_sentence(len(df), warmup, seen),
                      next_notebook=f"run more steps (at least {MIN_STEPS} after the warm-up), then report() again",
                      machine=check, bottleneck=None)


def _too_few_job(payloads: Mapping[int, Mapping[str, Any]], *, table: Any, world_size: int, missing: Sequence[int],
                 notes: Sequence[str], transport: str, waited_s: float) -> JobReport:
    """The job's report when no rank measured :data:`MIN_STEPS` steps: what each had, an inconclusive verdict."""
    each = ", ".join(f"rank {r} {len(payloads[r]['steps']['step_s'])}" for r in sorted(payloads)) or "none"
    warm = sorted({payloads[r].get("warmup") for r in payloads} - {None})
    after = (f" after the {warm[0]} warm-up step{'s' if warm[0] != 1 else ''}" if len(warm) == 1 else
             " after the warm-up")
    line = (f"job: inconclusive: no rank measured {MIN_STEPS} steps{after} ({each}): too few for a verdict; run more "
            "steps")
    return JobReport(table=table, exposed_fraction=float("nan"), bound_by="", recommendation="inconclusive",
                     measured_recommendation="inconclusive", reason=line[len("job: inconclusive: "):],
                     next_notebook=f"run more steps (at least {MIN_STEPS} after the warm-up), then report() again",
                     slow=None, missing=tuple(missing), world_size=int(world_size), notes=tuple(notes),
                     communication="", machine=None, bottleneck=None, transport=transport,
                     waited_s=float(waited_s), verdict_line=line)


def _rank_tables(payloads: Mapping[int, Mapping[str, Any]]) -> tuple[list[dict], dict[int, pd.DataFrame]]:
    """Each rank of >= 3 steps: its table row (medians, ms and %) and its per-step frame (seconds; ``wait``, NaN
    where DDP did not sample the step), by rank."""
    rows, frames = [], {}
    for r in sorted(payloads):
        p = payloads[r]
        df = pd.DataFrame({c: p["steps"][c] for c in ("data", "copy", "compute", "step_s")})
        if len(df) < MIN_STEPS:
            continue
        df["exposed_fraction"] = (df["data"] + df["copy"]) / df["step_s"]
        wait = p["steps"].get("wait")
        df["wait"] = pd.to_numeric(pd.Series(wait if wait and len(wait) == len(df) else [None] * len(df),
                                             index=df.index, dtype=object), errors="coerce")
        frames[r] = df
        ddp = p.get("ddp") or {}
        sampled = df[df["wait"].notna()]
        rows.append({"rank": r, "node": str(p.get("node", "")), "steps": int(p.get("n_steps", len(df))),
                     "data_ms": 1e3 * df["data"].median(), "copy_ms": 1e3 * df["copy"].median(),
                     "compute_ms": 1e3 * df["compute"].median(), "step_ms": 1e3 * df["step_s"].median(),
                     "exposed_pct": 100.0 * df["exposed_fraction"].median(),
                     "wait_ms": 1e3 * sampled["wait"].median() if len(sampled) else float("nan"),
                     "own_compute_ms": (1e3 * (sampled["compute"] - sampled["wait"]).clip(lower=0).median()
                                        if len(sampled) else float("nan")),
                     "allreduce_ms": 1e3 * ddp["backward_comm_s"] if ddp else float("nan"),
                     "allreduce_hidden_pct": 100.0 * ddp["hidden_fraction"] if ddp else float("nan")})
    return rows, frames


def _rule_mode(frames: Mapping[int, pd.DataFrame], synchronous: bool) -> str:
    """How the slow-rank rule reads the compute column: "independent" (no process group: the rank's own work),
    "ddp-wait" (every rank has DDP's wait on 3 measured steps or more: compute minus wait is its own work), or
    "holds-wait" (ranks that synchronize, without it: the compute column holds the wait, compared as waiting)."""
    if not synchronous:
        return "independent"
    if frames and all(int(df["wait"].notna().sum()) >= MIN_STEPS for df in frames.values()):
        return "ddp-wait"
    return "holds-wait"


def _reporting_notes(rows: list[dict], few: Sequence[int], *, payloads: Mapping[int, Any], world_size: int,
                     missing: Sequence[int], stopped_by: str, synchronous: bool, mode: str,
                     frames: Mapping[int, Any]) -> list[str]:
    """The report's notes: ranks missing, with too few or uneven steps, what the phases hold, what is not seen."""
    notes = []
    if missing and stopped_by:
        notes.append(f"rank(s) {', '.join(map(str, missing))} of {world_size} did not report: the launcher stopped "
                     f"the job ({stopped_by}: a rank failed) while rank 0 waited; the table and the verdict hold the "
                     f"{len(payloads)} that had reported")
    elif missing:
        notes.append(f"rank(s) {', '.join(map(str, missing))} of {world_size} did not report within the timeout "
                     f"(died, stopped before report(), or still running): the table and the verdict hold the "
                     f"{len(payloads)} that did")
    if few:
        notes.append(f"rank(s) {', '.join(map(str, few))} measured fewer than {MIN_STEPS} steps after the warm-up: "
                     "left out")
    counts = {int(r["rank"]): int(r["steps"]) for r in rows}
    if len(set(counts.values())) > 1:
        notes.append("the ranks measured different numbers of steps (" + ", ".join(
            f"rank {r}: {n}" for r, n in counts.items()) + "): each rank's medians are over its own steps; the "
            "ranks of a synchronous job take the same steps, so check that every rank iterates as many batches")
    if mode == "ddp-wait":
        n = min(int(df["wait"].notna().sum()) for df in frames.values())
        notes.append(f"the ranks synchronize (DDP): each rank's compute column holds its wait for the others in the "
                     f"gradient allreduce; DDP's own timers give that wait on the steps DDP sampled ({n} or more per "
                     "rank: its first 10 iterations and every 100th), and the slow-rank rule compares compute minus "
                     "wait on those steps as the rank's own work, the wait as waiting")
    elif mode == "holds-wait":
        sampled = {r: int(df["wait"].notna().sum()) for r, df in frames.items()}
        with_model = any(sampled.values()) or any(payloads[r].get("ddp") for r in frames)
        why = ("DDP's timers paired fewer than 3 measured steps on " + ", ".join(
            f"rank {r} ({n})" for r, n in sampled.items() if n < MIN_STEPS) + " (DDP samples its first 10 "
            "iterations and every 100th: a warm-up shorter than 8 steps leaves 3 of them measured)" if with_model
            else "no DDP model was passed to instrument(..., model=ddp), so the wait is not measured")
        notes.append("the ranks synchronize (a process group is initialized), so each rank's compute column holds "
                     "its wait for the others in the collectives: the slow-rank rule compares it as waiting, and "
                     f"cannot see a rank slow in its own compute (its excess and the others' wait look alike): {why}")
    elif mode == "independent" and len(frames) > 1:
        notes.append("no process group was initialized at report(): the ranks do not wait for each other, so each "
                     "rank's compute column is its own work and each rank's share of exposed input its own")
    return notes


#: How the slow-rank sentence describes a phase, per mode of the rule (the table's columns).
_WORDS = {"ddp-wait": {"compute": "compute outside the allreduce wait: compute minus wait in the table",
                       "comm": "allreduce wait (the wait column, DDP's own timers)"},
          "holds-wait": {"comm": "compute-column time (which holds each rank's wait in the collectives)"},
          "independent": {}}
_NO_WAIT = {"independent": ("The ranks do not synchronize (no process group was initialized at report()): the "
                            "others do not wait for {culprit}."),
            "ddp-wait": "No other rank is left whose wait for {culprit} the instrument could show.",
            "holds-wait": "No other rank is left whose wait for {culprit} the instrument could show."}


def _slow_ranks(frames: Mapping[int, pd.DataFrame], payloads: Mapping[int, Mapping[str, Any]], *,
                mode: str, marked: bool) -> stragglers.SlowRanks | None:
    """:func:`helpers.stragglers.find` on the ranks' per-step phases (seconds); None with fewer than 2 ranks.

    ``mode`` (:func:`_rule_mode`): "independent", the compute column as work; "ddp-wait", on the steps DDP
    sampled, compute minus the allreduce wait as work and the wait as waiting, a rank slow in that compute only
    where the others' extra wait covers 80% of its excess (a wait outside the allreduce, which stays in it, never
    names the rank that waits); "holds-wait", the compute column as waiting (it holds the wait, and no wait is
    measured to take out of it)."""
    ranks = []
    for r, df in frames.items():
        ph = {"step_s": list(df["step_s"]), "data": list(df["data"])}
        if marked:
            ph["h2d"] = list(df["copy"])
        if mode == "ddp-wait":
            s = df[df["wait"].notna()]
            ph["compute"] = [float(v) for v in (s["compute"] - s["wait"]).clip(lower=0)]
            ph["comm"] = [float(v) for v in s["wait"]]
        elif mode == "holds-wait":  # compute + the wait in the collectives: compared as waiting
            ph["comm"] = list(df["compute"])
        else:
            ph["compute"] = list(df["compute"])
        p = payloads[r]
        ranks.append(stragglers.RankPhases(label=f"rank {r}", phases=ph, rank=r,
                                           node=str(p["node"]) if p.get("node") else None))
    if len(ranks) < 2:
        return None
    # compute minus the allreduce wait holds any wait outside the allreduce (a buffer broadcast in forward): a rank
    # is slow in it only where the others' extra allreduce wait shows that they waited for it
    return stragglers.find(ranks, source="the instrument", words=_WORDS[mode], no_wait=_NO_WAIT.get(mode),
                           confirm={"compute": "comm"} if mode == "ddp-wait" else None)


def _communication(frames: Mapping[int, Any], payloads: Mapping[int, Mapping[str, Any]],
                   ddps: Mapping[int, Any], *, synchronous: bool, mode: str = "") -> str:
    """The report's communication sentence: DDP's own timers per rank, or why there are none (never "not
    measured" where the table shows the wait)."""
    if mode == "ddp-wait" and not (ddps and all(ddps.values())):
        return ("the wait column: the allreduce time not hidden behind backward, from DDP's own timers on the steps "
                "it sampled (DDP's averages could not be read)")
    if ddps and all(ddps.values()):
        return "allreduce hidden behind backward (DDP's own timers, its sampled iterations): " + "; ".join(
            f"rank {r} {100 * ddps[r]['hidden_fraction']:.0f}% of {1e3 * ddps[r]['backward_comm_s']:.1f} ms "
            f"(forward + backward compute {1e3 * (ddps[r]['forward_s'] + ddps[r]['backward_compute_s']):.1f} ms)"
            for r in frames)
    if synchronous:
        why = sorted({payloads[r].get("ddp_note") or "" for r in frames} - {""})
        return why[0] if why else _NOT_MEASURED
    return ("none through torch.distributed: no process group was initialized at report(), the ranks "
            "did not communicate through one")


def _job_verdict_line(b: bottleneck.Bottleneck, slow: stragglers.SlowRanks | None, exposed: Mapping[int, float],
                      top: int, *, payloads: Mapping[int, Mapping[str, Any]], threshold: float,
                      check: Any, synchronous: bool = True, world_size: int | None = None) -> tuple[str, str]:
    """``(bound_by, verdict_line)``: who bounds the job (``top``: the most exposed rank) and the job's sentence.

    Ranks missing (fewer in ``exposed`` than ``world_size``): the line is inconclusive and says that the verdict
    covers the ranks that reported; without a process group it does not speak of waits in collectives."""
    x = exposed[top]
    input_culprit = slow is not None and slow.findings and slow.phase in ("data", "h2d")
    if input_culprit:
        found = sorted((f for f in slow.findings if f.phase in ("data", "h2d")), key=lambda f: f.rank)
        who = (f"node {slow.node}, ranks {' and '.join(str(f.rank) for f in found)}" if slow.node else
               " and ".join(f"rank {f.rank} on node {f.node}" if f.node else f"rank {f.rank}" for f in found))
    else:
        who = f"rank {top}" + (f" on node {payloads[top]['node']}" if payloads[top].get("node") else "")
    their = "their" if input_culprit and len(found) > 1 else "its"
    low = min(exposed.values())
    n, m = len(exposed), int(world_size) if world_size is not None else len(exposed)
    heads = []
    if n < m:
        heads.append(f"{n} of {m} ranks reported: the verdict covers these; the missing rank(s) may be the slow one")
    if check is not None and check.busy:
        heads.append(check.sentence())
    head = f"inconclusive: {'; '.join(heads)}; what {'they' if n < m else 'it'} measured: " if heads else ""
    # with ranks missing, no lever is given as the job's: the reason (which names one) is left to the next line
    reason = f"; {b.reason}" if n >= m else ""
    if b.label == bottleneck.DEVICE_BOUND:
        line = (f"job: {head}{b.label}: no {'reporting ' if n < m else ''}rank's input is exposed more than "
                f"{threshold:.0%} of its step (the largest is {x:.0%}, {who}){reason}")
    elif input_culprit and synchronous:
        line = (f"job: {head}{b.label} because of {who}: {their} input is exposed up to {x:.0%} of the step; the "
                f"other ranks' smaller shares (down to {low:.0%}) are their wait for it in the collectives, not free "
                f"input: every step of a synchronous job waits for its slowest rank{reason}")
    elif input_culprit:
        line = (f"job: {head}{b.label} because of {who}: {their} input is exposed up to {x:.0%} of the step; the "
                f"ranks do not synchronize (no process group), so the others do not wait for it: their smaller "
                f"shares (down to {low:.0%}) are their own{reason}")
    elif low > threshold:
        line = (f"job: {head}{b.label} on every {'reporting ' if n < m else ''}rank: input exposed {low:.0%}-{x:.0%} "
                f"of the step (the largest, {who}, sets the job's){reason}")
    else:
        why = ("the slowest rank bounds a synchronous job" if synchronous else
               "the ranks do not synchronize: each rank's share is its own")
        line = (f"job: {head}{b.label}, set by {who}: its input is exposed {x:.0%} of the step, the others' down "
                f"to {low:.0%} ({why}; no rank is named slow above the noise){reason}")
    return who, line
