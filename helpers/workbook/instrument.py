"""Notebook 01's verdict on your own training loop, in three added lines.

::

    from helpers.workbook.instrument import instrument     # 1: the import
    steps = instrument(loader, device="cuda")              # 2: wrap the loader you already have
    for x, y in steps:                                      #    (the loop you already have, unchanged)
        x, y = x.to("cuda", non_blocking=True), y.to("cuda", non_blocking=True)
        steps.copied()                                      #    optional: split the copy from the compute
        loss = loss_fn(model(x), y); loss.backward(); opt.step(); opt.zero_grad()
    steps.report()                                          # 3: the verdict and the phase breakdown

What is timed, per step (a step runs from one batch request to the next):

- **data**: the wait inside ``next(loader)`` (the input pipeline's exposed time);
- **copy**: from the batch's arrival to :meth:`InstrumentedLoader.copied` (0 when it is never called: the copy
  then counts as compute);
- **compute**: the rest of the step, up to the next batch request.

The device is synchronized once per step, at the step boundary (and once more at ``copied()`` when it is
called), so that a phase's time is the device's, not the time to queue its work: the least a per-phase
measurement needs. On a CPU the synchronize is a no-op. The first ``warmup`` steps are not measured. The
report gives notebook 01's verdict (:func:`helpers.bottleneck.classify`: host-bound, balanced or
device-bound) from the median per-step share of exposed input, the phase medians with their interquartile
ranges, the notebooks to open next on this machine, and the machine's state over the measurement (:mod:`helpers.machine`): a busy machine makes the
verdict "inconclusive". ``python -m helpers bench instrument`` measures the instrument's overhead.

Many ranks, many nodes
----------------------
Under a launcher that sets ``RANK`` and ``WORLD_SIZE`` (torchrun, srun + torchrun, DeepSpeed's launcher; see
:class:`helpers.comm.gather.RankIdentity` for the variables read and how the node is named), each rank times
its own steps as above, and :meth:`InstrumentedLoader.report` gathers every rank's per-step phases on rank 0
(:func:`helpers.comm.gather.gather_to_root`: through the job's process group when one is initialized, else
through files in ``gather_dir``: the environment variable ``WORKBOOK_GATHER_DIR``, else the run folder's
``instrument-ranks/``, so it works before ``init_process_group``). Rank 0 prints one :class:`JobReport`: a table
(rank, node, steps, data, copy, compute, step, exposed share), one verdict for the job and the slow-rank or
slow-node sentence of :func:`helpers.stragglers.find` with the culprit's phase; the other ranks print nothing
(``report(every_rank=True)``: their own report too). The job's exposed share is the largest rank's: a
synchronous job's every step waits for its slowest rank, so rank 0's small share in a DDP job whose node 1
waits for its loader is rank 0 waiting in the allreduce, not free input. A rank that has not reported within
``gather_timeout_s`` is named as missing and the others are reported.

In a job whose ranks synchronize (a process group is initialized at ``report()``), the compute phase holds each
rank's wait for the others inside the collectives: the instrument sees the loop from the loader, with no
synchronize inside the step. Given the DDP model (``instrument(loader, model=ddp_model)``) it reads DDP's own
timers (``DistributedDataParallel._get_ddp_logging_data()``: forward, backward compute, backward communication
and their overlap, averaged over the iterations DDP samples: the first 10 and every 100th, the
``should_collect_runtime_stats`` rule of torch's ``torch/csrc/distributed/c10d/reducer.cpp``), and says per rank
how much of the allreduce was hidden behind backward, with its own forward + backward compute. The slow-rank rule
compares the compute phase as waiting either way (DDP's timers are averages, with no per-step spread to judge a
difference by), so it cannot name a rank slow in its own compute, and the report says so.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import pandas as pd

from helpers import bottleneck, machine, stragglers
from helpers.comm import gather
from helpers.errors import ParameterError
from helpers.experiments.baseline import spare_cores

__all__ = ["InstrumentedLoader", "JobReport", "LoopReport", "instrument", "job_report"]


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
        One of :data:`helpers.bottleneck.LABELS`, or "inconclusive" (a busy machine; ``measured_recommendation``
        keeps the label).
    measured_recommendation, reason : str
    next_notebook : str
        The notebooks to open next, with why (:meth:`helpers.bottleneck.Bottleneck.next_text`).
    machine : helpers.machine.BusyCheck
    bottleneck : helpers.bottleneck.Bottleneck or None
        The classification (the two levers' savings, the idle cores).
    """

    steps: Any
    exposed_fraction: float
    recommendation: str
    measured_recommendation: str
    reason: str
    next_notebook: str
    machine: Any
    bottleneck: Any = None

    def lines(self, name: str = "your loop") -> list[str]:
        """The printed report."""
        df = self.steps

        def phase(col: str) -> str:
            return (f"{col} {df[col].median() * 1e3:.1f} ms (IQR {df[col].quantile(0.25) * 1e3:.1f}-"
                    f"{df[col].quantile(0.75) * 1e3:.1f})")

        head = (f"inconclusive: {self.machine.sentence()}; what it measured: " if self.recommendation == "inconclusive"
                else "")
        return [f"{name}: {len(df)} steps measured",
                f"{head}{self.measured_recommendation}: {self.reason}",
                f"median step {df['step_s'].median() * 1e3:.1f} ms: {phase('data')}, {phase('copy')}, "
                f"{phase('compute')}",
                f"next: {self.next_notebook}",
                f"machine: {self.machine.sentence()}"]


class InstrumentedLoader:
    """Your loader, with each step of the loop around it timed (see the module notes).

    Parameters
    ----------
    loader : iterable
        Your DataLoader (or any iterable of batches); iterate the wrapper where you iterated it, as many
        epochs as you like.
    device : str, torch.device, helpers.device.Accelerator or None, default "auto"
        The device whose work is synchronized at step boundaries ("auto": npu, else cuda, else cpu; None: no
        synchronize, host time only).
    warmup : int, default 3
        Steps not measured at the start (compilation, allocator warm-up, worker start).
    threshold : float, default 0.10
        Exposed-input share above which the loop is host-bound (notebook 01's default).
    busy_cpu_share : float, default :data:`helpers.machine.MAX_OTHER_CPU_SHARE`
        Share of the cores other processes may take before the verdict is inconclusive.
    name : str
        How the report names the loop.
    model : torch.nn.Module or None
        Under torchrun: your DistributedDataParallel model, whose own timers say how much of the allreduce hid
        behind backward (read once, at ``report()``; no synchronize is added). Anything else: not read.
    gather_dir : path or None
        Under a launcher, with no process group initialized at ``report()``: the folder, shared by every rank,
        where the ranks leave their figures for rank 0. None: ``WORKBOOK_GATHER_DIR``, else
        ``<runs>/instrument-ranks`` (:func:`helpers.workbook.paths.runs_dir`). Checked when the wrapper is made
        (before ``init_process_group`` nothing else could be used).
    gather_timeout_s : float, default :data:`helpers.comm.gather.DEFAULT_TIMEOUT_S`
        How long rank 0's ``report()`` waits for the other ranks, seconds.

    Raises
    ------
    ParameterError
        Bad ``warmup``, ``threshold``, ``busy_cpu_share`` or ``gather_timeout_s``, launcher variables that are
        not integers, or a rendezvous folder that cannot be written (when the wrapper is made).
    """

    def __init__(self, loader: Iterable, *, device: Any = "auto", warmup: int = 3, threshold: float = 0.10,
                 busy_cpu_share: float = machine.MAX_OTHER_CPU_SHARE, name: str = "your loop", model: Any = None,
                 gather_dir: str | os.PathLike | None = None,
                 gather_timeout_s: float = gather.DEFAULT_TIMEOUT_S) -> None:
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ParameterError(f"warmup must be an int >= 0, got {warmup!r}")
        if not 0.0 < float(threshold) < 1.0:
            raise ParameterError(f"threshold must be in (0, 1), got {threshold!r}")
        if not 0.0 < float(busy_cpu_share) <= 1.0:
            raise ParameterError(f"busy_cpu_share must be in (0, 1], got {busy_cpu_share!r}")
        if isinstance(gather_timeout_s, bool) or not isinstance(gather_timeout_s, (int, float)) \
                or not gather_timeout_s > 0:
            raise ParameterError(f"gather_timeout_s must be a positive number of seconds, got {gather_timeout_s!r}")
        self.loader, self.warmup, self.threshold, self.name = loader, warmup, float(threshold), name
        self.busy_cpu_share = float(busy_cpu_share)
        self.identity = gather.RankIdentity.from_env()
        self.model, self.gather_timeout_s = model, float(gather_timeout_s)
        self.gather_dir = None
        if self.identity.world_size > 1:
            self.gather_dir = Path(gather_dir if gather_dir is not None else
                                   os.environ.get("WORKBOOK_GATHER_DIR") or _default_gather_dir())
            if _group_initialized() is False:  # before init_process_group (or without one): files it will be
                gather.check_folder(self.gather_dir)
        self._sync, self.device_kind = _synchronizer(device)
        self._it = None
        self._open: list[float] | None = None  # [request start, batch arrived, copy end or nan]
        self._rows: list[tuple[float, float, float, float]] = []
        self._copy_marked = False
        self._seen = 0
        self._reports = 0
        self._started_at = _process_start()
        self._before = machine.snapshot()

    def __iter__(self) -> "InstrumentedLoader":
        self.end_step()
        self._it = iter(self.loader)
        return self

    def __next__(self) -> Any:
        self.end_step()
        start = time.perf_counter()
        try:
            batch = next(self._it)
        except StopIteration:
            self._open = None
            raise
        self._open = [start, time.perf_counter(), float("nan")]
        return batch

    def copied(self) -> None:
        """Mark the end of the step's host-to-device copy (one synchronize): the copy is timed apart from compute."""
        if self._open is not None:
            self._sync()
            self._open[2] = time.perf_counter()
            self._copy_marked = True

    def end_step(self) -> None:
        """End the step in progress now (one synchronize) instead of at the next batch request; a no-op between
        steps. The loop never needs it; a caller that times blocks of steps (``bench instrument``) does."""
        if self._open is None:
            return
        self._sync()
        end = time.perf_counter()
        start, arrived, copied = self._open
        self._open = None
        self._seen += 1
        if self._seen <= self.warmup:
            return
        copy_end = copied if copied == copied else arrived  # nan: no copy marker
        self._rows.append((arrived - start, copy_end - arrived, end - copy_end, end - start))

    def frame(self) -> pd.DataFrame:
        """The measured steps so far (closing the one in progress)."""
        self.end_step()
        df = pd.DataFrame(self._rows, columns=["data", "copy", "compute", "step_s"])
        df["exposed_fraction"] = (df["data"] + df["copy"]) / df["step_s"]
        return df

    def result(self) -> LoopReport:
        """The verdict and figures, without printing.

        Raises
        ------
        ParameterError
            If fewer than 3 steps were measured after the warm-up.
        """
        df = self.frame()
        if len(df) < 3:
            raise ParameterError(f"{self.name}: only {len(df)} step(s) measured after {self.warmup} warm-up step(s); "
                                 "run more steps (at least 3 after the warm-up) before report()")
        check = machine.check(self._before, machine.snapshot(), max_other_cpu_share=self.busy_cpu_share)
        exposed = float(df["exposed_fraction"].median())
        data, copy = float(df["data"].median()), float(df["copy"].median())
        b = bottleneck.classify(exposed, self.threshold, device_kind=self.device_kind,
                                spare_cores=spare_cores(self.device_kind, getattr(check, "other_cpu_share", None)),
                                copy_share=copy / (data + copy) if data + copy > 0 else None)
        return LoopReport(steps=df, exposed_fraction=exposed,
                          recommendation="inconclusive" if check.busy else b.label, measured_recommendation=b.label,
                          reason=b.reason, machine=check, bottleneck=b,
                          next_notebook=b.next_text() + (_DIAGNOSE if b.label != bottleneck.DEVICE_BOUND else ""))

    def report(self, *, print_it: bool = True, every_rank: bool = False) -> "LoopReport | JobReport | None":
        """Print (by default) and return the report.

        One process (no launcher, or world size 1): this loop's :class:`LoopReport`, as it always was. Under a
        launcher with two or more ranks every rank must call it: rank 0 gathers the ranks' figures (waiting up
        to ``gather_timeout_s`` for them) and prints and returns the :class:`JobReport`; the other ranks hand
        theirs over and return their own :class:`LoopReport` (None with fewer than 3 steps measured), printed
        only with ``every_rank=True``.

        Raises
        ------
        ParameterError
            World size 1: fewer than 3 steps measured. Rank 0: no rank (itself included) measured 3 steps, or a
            rendezvous folder that cannot be written.
        """
        if self.identity.world_size <= 1:
            r = self.result()
            if print_it:
                print("\n".join(r.lines(self.name)))
            return r
        own = self.result() if len(self.frame()) >= 3 else None
        self._reports += 1
        got = gather.gather_to_root(self._payload(), self.identity, name=f"{gather.job_key()}-instrument-"
                                    f"{self._reports}", folder=self.gather_dir, timeout_s=self.gather_timeout_s,
                                    started_at=self._started_at)
        if got is None:  # not rank 0
            if print_it and every_rank and own is not None:
                print("\n".join(own.lines(f"{self.name}, {self.identity.label}")))
            return own
        rep = job_report(got.payloads, world_size=got.world_size, missing=got.missing, threshold=self.threshold,
                         busy_cpu_share=self.busy_cpu_share, transport=got.transport, waited_s=got.waited_s,
                         stopped_by=got.stopped_by)
        if print_it or got.stopped_by:
            print("\n".join(rep.lines(self.name)), flush=True)
        gather.resume_signal(got)  # the launcher stopped the job (a rank failed): end as it asked, once reported
        return rep

    def _payload(self) -> dict[str, Any]:
        """This rank's figures for rank 0 (JSON types): identity, per-step phases, machine snapshots, DDP's
        timers."""
        df = self.frame().tail(_MAX_STEPS_SENT)
        ident = self.identity
        ddp, note = ddp_timers(self.model)
        return {"rank": ident.rank, "local_rank": ident.local_rank, "node_rank": ident.node_rank,
                "host": ident.host, "node": ident.node, "device_kind": self.device_kind, "launch": _launch_id(),
                "steps": {c: [float(v) for v in df[c]] for c in ("data", "copy", "compute", "step_s")},
                "n_steps": int(len(self.frame())), "copy_marked": self._copy_marked,
                "synchronous": bool(_group_initialized()), "ddp": ddp, "ddp_note": note,
                "machine_before": self._before.as_dict(), "machine_after": machine.snapshot().as_dict()}


#: Appended to the "next" advice when the input counts: the measurement the instrument cannot make in a loop.
_DIAGNOSE = "; `python -m helpers diagnose --job` measures what free input would give"
#: Per-step rows a rank sends to rank 0 at most (its last ones): 4 floats each, a few hundred kB as JSON.
_MAX_STEPS_SENT = 5000


def _default_gather_dir() -> Path:
    from helpers.workbook.paths import runs_dir

    return runs_dir() / "instrument-ranks"


def _group_initialized() -> bool:
    """True when torch.distributed has a default process group (torch is not imported for the answer)."""
    import sys

    dist = sys.modules.get("torch.distributed")
    return bool(dist is not None and dist.is_available() and dist.is_initialized())


def _launch_id() -> int:
    """The process whose tree :mod:`helpers.machine` counts as this rank's own work: torchrun's agent for one of
    its ranks (as :func:`helpers.machine._job_root` decides), else this process."""
    if "TORCHELASTIC_RUN_ID" in os.environ and "LOCAL_RANK" in os.environ:
        return os.getppid()
    return os.getpid()


def _process_start() -> float:
    """This process's start, seconds since the epoch: the ranks of one launch start within seconds of each other,
    which tells their rendezvous files from an earlier launch's."""
    import psutil

    try:
        return float(psutil.Process().create_time())
    except psutil.Error:
        return time.time()


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
        return None, ("not measured: pass your DDP model (instrument(loader, model=ddp_model)) for DDP's own "
                      "timers; the instrument adds no synchronize inside the step")
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
        One row per rank that reported: ``rank``, ``node``, ``steps``, ``data_ms``, ``copy_ms``, ``compute_ms``,
        ``step_ms`` (medians over its steps, milliseconds), ``exposed_pct`` (median (data + copy) / step, %),
        ``allreduce_ms`` and ``allreduce_hidden_pct`` (DDP's own timers; NaN without them).
    exposed_fraction : float
        The job's exposed input share: the largest rank's (the slowest rank bounds a synchronous job).
    bound_by : str
        Who sets it: the slow node or rank(s) of ``slow`` where they are slow in input, else the rank with the
        largest share.
    recommendation, measured_recommendation, reason, next_notebook : str
        As in :class:`LoopReport`, for the job.
    slow : helpers.stragglers.SlowRanks or None
        The slow-rank rule's finding (None with fewer than two ranks reporting 3 steps).
    missing : tuple of int
        Ranks that had not reported at the timeout.
    world_size : int
    notes : tuple of str
        Different step counts, missing ranks, what the compute phase holds.
    communication : str
        How much of the allreduce hid behind backward per rank, or why it is not known.
    machine : helpers.machine.BusyCheck or None
        The job's machine check: per host, the job's ranks on it (every launch's) count as its own work; the
        busiest host's.
    bottleneck : helpers.bottleneck.Bottleneck
    transport : str
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

    def lines(self, name: str = "your loop") -> list[str]:
        """The printed report: a header, the table, the job's verdict, the slow rank, communication, notes,
        next, machine."""
        t = self.table
        nodes = t["node"].nunique() if len(t) else 0
        counts = sorted(set(int(n) for n in t["steps"]))
        per = f"{counts[0]} steps measured per rank" if len(counts) == 1 else \
            f"{counts[0]}-{counts[-1]} steps measured per rank"
        out = [f"{name}: {len(t)} of {self.world_size} ranks on {nodes} node(s), {per} (gathered through the "
               f"{self.transport} in {self.waited_s:.1f} s)"]
        width = max([4] + [len(str(n)) for n in t["node"]])
        out.append(f"{'rank':>4}  {'node':<{width}}  {'steps':>5}  {'data ms':>8}  {'copy ms':>8}  "
                   f"{'compute ms':>10}  {'step ms':>8}  {'exposed':>7}")
        for row in t.itertuples():
            out.append(f"{row.rank:>4}  {row.node:<{width}}  {row.steps:>5}  {row.data_ms:>8.1f}  {row.copy_ms:>8.1f}"
                       f"  {row.compute_ms:>10.1f}  {row.step_ms:>8.1f}  {row.exposed_pct:>6.0f}%")
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
                "communication": self.communication,
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
               transport: str = "", waited_s: float = 0.0, stopped_by: str = "") -> JobReport:
    """One report for the whole job from every rank's figures (rank 0 of :meth:`InstrumentedLoader.report`).

    Parameters
    ----------
    payloads : mapping of int to dict
        Rank -> what :meth:`InstrumentedLoader._payload` sent: ``steps`` (``data``, ``copy``, ``compute``,
        ``step_s`` lists, seconds per step), ``node``, ``host``, ``node_rank``, ``device_kind``, ``copy_marked``,
        ``synchronous``, ``ddp`` (:func:`ddp_timers`), ``machine_before`` / ``machine_after``
        (:class:`helpers.machine.MachineState` as dicts).
    world_size : int
        Ranks in the job (the missing ones included).
    missing : sequence of int
        Ranks that did not report.
    threshold, busy_cpu_share : float
        As in :class:`InstrumentedLoader`.
    transport, waited_s, stopped_by : as in :class:`helpers.comm.gather.Gathered`.

    Returns
    -------
    JobReport

    Raises
    ------
    ParameterError
        No rank measured 3 steps after its warm-up.
    """
    rows, frames = _rank_tables(payloads)
    few = sorted(set(payloads) - set(frames))
    if not frames:
        raise ParameterError(f"no rank measured 3 steps after its warm-up (ranks {sorted(payloads)} reported); run "
                             "more steps before report()")
    table = pd.DataFrame(rows)
    ddps = {r: payloads[r].get("ddp") for r in frames}
    synchronous = any(payloads[r].get("synchronous") for r in frames)
    notes = _reporting_notes(rows, few, payloads=payloads, world_size=world_size, missing=missing,
                             stopped_by=stopped_by, synchronous=synchronous, have_ddp=all(ddps.values()))
    # the slow-rank rule on the per-step phases (the compute phase of a synchronizing job holds its wait)
    slow = _slow_ranks(frames, payloads, synchronous=synchronous,
                       marked=any(payloads[r].get("copy_marked") for r in frames))
    communication = _communication(frames, payloads, ddps, synchronous=synchronous)
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
    who, line = _job_verdict_line(b, slow, exposed, top, payloads=payloads, threshold=threshold, check=check)
    return JobReport(table=table, exposed_fraction=x, bound_by=who,
                     recommendation="inconclusive" if check is not None and check.busy else b.label,
                     measured_recommendation=b.label, reason=b.reason,
                     next_notebook=b.next_text() + (_DIAGNOSE if b.label != bottleneck.DEVICE_BOUND else ""),
                     slow=slow, missing=tuple(missing), world_size=int(world_size), notes=tuple(notes),
                     communication=communication, machine=check, bottleneck=b, transport=transport,
                     waited_s=float(waited_s), verdict_line=line)


def _rank_tables(payloads: Mapping[int, Mapping[str, Any]]) -> tuple[list[dict], dict[int, pd.DataFrame]]:
    """Each rank of >= 3 steps: its table row (medians, ms and %) and its per-step frame (seconds), by rank."""
    rows, frames = [], {}
    for r in sorted(payloads):
        p = payloads[r]
        df = pd.DataFrame({c: p["steps"][c] for c in ("data", "copy", "compute", "step_s")})
        if len(df) < 3:
            continue
        df["exposed_fraction"] = (df["data"] + df["copy"]) / df["step_s"]
        frames[r] = df
        ddp = p.get("ddp") or {}
        rows.append({"rank": r, "node": str(p.get("node", "")), "steps": int(p.get("n_steps", len(df))),
                     "data_ms": 1e3 * df["data"].median(), "copy_ms": 1e3 * df["copy"].median(),
                     "compute_ms": 1e3 * df["compute"].median(), "step_ms": 1e3 * df["step_s"].median(),
                     "exposed_pct": 100.0 * df["exposed_fraction"].median(),
                     "allreduce_ms": 1e3 * ddp["backward_comm_s"] if ddp else float("nan"),
                     "allreduce_hidden_pct": 100.0 * ddp["hidden_fraction"] if ddp else float("nan")})
    return rows, frames


def _reporting_notes(rows: list[dict], few: Sequence[int], *, payloads: Mapping[int, Any], world_size: int,
                     missing: Sequence[int], stopped_by: str, synchronous: bool, have_ddp: bool) -> list[str]:
    """The report's notes: ranks missing, with too few or uneven steps, and what synchronizing ranks' phases hold."""
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
        notes.append(f"rank(s) {', '.join(map(str, few))} measured fewer than 3 steps after the warm-up: left out")
    counts = {int(r["rank"]): int(r["steps"]) for r in rows}
    if len(set(counts.values())) > 1:
        notes.append("the ranks measured different numbers of steps (" + ", ".join(
            f"rank {r}: {n}" for r, n in counts.items()) + "): each rank's medians are over its own steps; the "
            "ranks of a synchronous job take the same steps, so check that every rank iterates as many batches")
    if synchronous:
        notes.append("the ranks synchronize (a process group is initialized), so each rank's compute column holds "
                     "its wait for the others in the collectives: the slow-rank rule compares it as waiting, and a "
                     "rank slow in its own compute cannot be told from the ranks that wait for it by the loop's "
                     "phases" + ("; DDP's own forward + backward compute per rank is on the communication line "
                                 "(averages over its sampled iterations, without a per-step spread to judge a "
                                 "difference by)" if have_ddp else
                                 "; pass your DDP model (instrument(loader, model=ddp_model)) for DDP's own timers"))
    return notes


def _slow_ranks(frames: Mapping[int, pd.DataFrame], payloads: Mapping[int, Mapping[str, Any]], *,
                synchronous: bool, marked: bool) -> stragglers.SlowRanks | None:
    """:func:`helpers.stragglers.find` on the ranks' per-step phases (seconds); None with fewer than 2 ranks."""
    ranks = []
    for r, df in frames.items():
        ph = {"step_s": list(df["step_s"]), "data": list(df["data"])}
        if marked:
            ph["h2d"] = list(df["copy"])
        if synchronous:  # compute + the wait in the collectives: compared as waiting
            ph["comm"] = list(df["compute"])
        else:
            ph["compute"] = list(df["compute"])
        p = payloads[r]
        ranks.append(stragglers.RankPhases(label=f"rank {r}", phases=ph, rank=r,
                                           node=str(p["node"]) if p.get("node") else None))
    return stragglers.find(ranks) if len(ranks) >= 2 else None


def _communication(frames: Mapping[int, Any], payloads: Mapping[int, Mapping[str, Any]],
                   ddps: Mapping[int, Any], *, synchronous: bool) -> str:
    """The report's communication sentence: DDP's own timers per rank, or why there are none."""
    if all(ddps.values()):
        return "allreduce hidden behind backward (DDP's own timers, its sampled iterations): " + "; ".join(
            f"rank {r} {100 * ddps[r]['hidden_fraction']:.0f}% of {1e3 * ddps[r]['backward_comm_s']:.1f} ms "
            f"(forward + backward compute {1e3 * (ddps[r]['forward_s'] + ddps[r]['backward_compute_s']):.1f} ms)"
            for r in frames)
    if synchronous:
        why = sorted({payloads[r].get("ddp_note") or "" for r in frames} - {""})
        return why[0] if why else "not measured"
    return ("none through torch.distributed: no process group was initialized at report(), the ranks "
            "did not communicate through one")


def _job_verdict_line(b: bottleneck.Bottleneck, slow: stragglers.SlowRanks | None, exposed: Mapping[int, float],
                      top: int, *, payloads: Mapping[int, Mapping[str, Any]], threshold: float,
                      check: Any) -> tuple[str, str]:
    """``(bound_by, verdict_line)``: who bounds the job (``top``: the most exposed rank) and the job's sentence."""
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
    head = (f"inconclusive: {check.sentence()}; what it measured: " if check is not None and check.busy else "")
    if b.label == bottleneck.DEVICE_BOUND:
        line = (f"job: {head}{b.label}: no rank's input is exposed more than {threshold:.0%} of its step (the "
                f"largest is {x:.0%}, {who}); {b.reason}")
    elif input_culprit:
        line = (f"job: {head}{b.label} because of {who}: {their} input is exposed up to {x:.0%} of the step; the "
                f"other ranks' smaller shares (down to {low:.0%}) are their wait for it in the collectives, not free "
                f"input: every step of a synchronous job waits for its slowest rank; {b.reason}")
    elif low > threshold:
        line = (f"job: {head}{b.label} on every rank: input exposed {low:.0%}-{x:.0%} of the step (the largest, "
                f"{who}, sets the job's); {b.reason}")
    else:
        line = (f"job: {head}{b.label}, set by {who}: its input is exposed {x:.0%} of the step, the others' down "
                f"to {low:.0%} (the slowest rank bounds a synchronous job; no rank is named slow above the noise); "
                f"{b.reason}")
    return who, line


def _synchronizer(device: Any):
    """(sync function, device kind) for ``device``."""
    if device is None:
        return (lambda: None), "cpu"
    if hasattr(device, "synchronize") and hasattr(device, "kind"):  # an Accelerator
        return device.synchronize, device.kind
    from helpers.device import get_accelerator

    kind = str(device).split(":")[0]
    acc = get_accelerator(kind if kind in ("auto", "cpu", "cuda", "npu") else "auto")
    return acc.synchronize, acc.kind


def instrument(loader: Iterable, **options: Any) -> InstrumentedLoader:
    """Wrap ``loader`` so that the loop around it is timed per phase (see :class:`InstrumentedLoader`)."""
    return InstrumentedLoader(loader, **options)
