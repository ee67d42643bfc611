"""Notebook 01's verdict on your own training loop, in three added lines.

::

    from helpers.workbook.instrument import instrument     # 1: the import
    steps = instrument(loader, device="cuda")              # 2: wrap the loader you already have
    for x, y in steps:                                      #    (the loop you already have, unchanged)
        x, y = x.to("cuda", non_blocking=True), y.to("cuda", non_blocking=True)
        steps.copied()                                      #    optional: split the copy from the compute
        loss = loss_fn(model(x), y); loss.backward(); opt.step(); opt.zero_grad()
        steps.loss(loss)                                    #    optional: a NaN or inf loss is said
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

Given each step's loss (:meth:`InstrumentedLoader.loss`, read at the step's end, after its synchronize), a loss
that is NaN or infinite (the rule of :func:`helpers.compute.train.nonfinite_loss`, as notebook 01's loop) makes
the report say "your job diverges" with the first such step, in the words of notebooks 01, 06, 10 and
``diagnose`` (:meth:`helpers.jobs.check.Divergence.sentence`), instead of a verdict: the timings are of a job
that no longer trains. Under a launcher, any rank's.

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
synchronize inside the step. In DDP the fast ranks wait in backward's gradient allreduce for the slow one, so
every rank's compute column comes out the same and a rank slow in its own compute (a longer forward, say) cannot
be told from the ranks that wait for it by the loop's phases. Given the DDP model
(``instrument(loader, model=ddp_model)``) the instrument reads DDP's own timers
(``DistributedDataParallel._get_ddp_logging_data()``, about 15 us, at each step boundary, no synchronize): for
the iterations DDP samples (its first 10 and every 100th: ``should_collect_runtime_stats`` in torch's
``torch/csrc/distributed/c10d/reducer.cpp``) it gives that step's backward communication and its overlap with
backward compute, logged at the next forward. The allreduce time not hidden behind backward (communication minus
overlap: from the rank's last gradient to the allreduce's end) is the rank's **wait** for the others, plus the
transfer itself. The slow-rank rule then compares, on those steps, each rank's compute outside the wait (compute
minus wait: forward, loss, backward and optimizer, its own work) as a work phase, and the wait as waiting: the
rank that computes more is named, the ranks that wait for it are not (they have the most wait and the least
compute outside it). Without the model, or where DDP sampled fewer than 3 measured steps, the compute column is
compared as waiting, and the report says that a rank slow in its own compute cannot be seen.

Without a process group the ranks do not wait for each other: each rank's compute column is its own work and is
compared as such, and the report does not speak of collectives.

Report, never raise
-------------------
:meth:`InstrumentedLoader.report` never raises in the user's job (under torchrun a raise in every rank is a
traceback from every rank): too few steps measured, ranks missing, a rendezvous that failed, each gives a report
that says so, with an "inconclusive" verdict where the figures cannot carry one. Ranks that did not report leave
the job's verdict "inconclusive" too: the missing rank may be the slow one.

Rank files of another launch
----------------------------
Each rank's payload carries its launch id (:func:`_launch_id`: the launcher's run id and rendezvous, the world
size, the torchrun agent that started it, and its process's start time). Rank 0 merges no file of another launch
from the gather folder: before it waits, a file there of another launch (an earlier run that stopped before its
rank 0 read it) is set aside, and one that arrives while it waits is dropped; the report names each ("ignored 1
rank file of an earlier launch: ...").

The reports (:class:`LoopReport`, :class:`JobReport`, :func:`job_report`) and DDP's timers (:func:`ddp_timers`)
live in :mod:`helpers.workbook.instrument_report`; they are imported here, where a user's job finds them.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import pandas as pd

from helpers import bottleneck, machine
from helpers.comm import gather
from helpers.compute.train import nonfinite_loss
from helpers.errors import ParameterError
from helpers.experiments.baseline import spare_cores
from helpers.jobs.check import Divergence
from helpers.workbook.instrument_report import (
    _DIAGNOSE,
    MIN_STEPS,
    JobReport,
    LoopReport,
    _diverged,
    _too_few,
    ddp_timers,
    job_report,
)

__all__ = ["InstrumentedLoader", "JobReport", "LoopReport", "instrument", "job_report"]


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
        Under torchrun: your DistributedDataParallel model, whose own timers give each rank's wait in the
        allreduce on the steps DDP samples (read at each step boundary, about 15 us, no synchronize added), so
        that a rank slow in its own compute can be named, and how much of the allreduce hid behind backward.
        Anything else: not read.
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
        self._loss: Any = None  # the open step's loss, read at its end
        self._nonfinite: tuple[int, str, float] | None = None  # (step, stat, value) of the first NaN or inf loss
        self._reports = 0
        self._started_at = _process_start()
        self._launch = _launch_id(self._started_at, self.identity)
        # DDP's per-iteration timers, read at each step boundary (see the module notes): step number -> (forward,
        # backward compute, backward communication, overlap), seconds
        self._ddp_get = getattr(model, "_get_ddp_logging_data", None) if model is not None else None
        self._ddp_steps: dict[int, tuple[float, float, float, float]] = {}
        self._ddp_last: tuple[int, int] | None = None  # (DDP's iteration, the step it was read at)
        self._ddp_offset: int | None = None  # step number - DDP's iteration; -1: not one forward per step
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

    def loss(self, value: Any) -> None:
        """Give the step's loss (optional): a NaN or infinite loss makes the report say "your job diverges".

        Nothing is read now: the value is kept and read at the step's end, after the synchronize the step ends
        with (no synchronize is added). A no-op between steps; never raises in the user's loop.

        Parameters
        ----------
        value : torch.Tensor or float
            The step's loss: a tensor of one element (any dtype, any device) or a number.
        """
        if self._open is not None:
            self._loss = value.detach() if hasattr(value, "detach") else value

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
        loss, self._loss = self._loss, None
        if loss is not None and self._nonfinite is None:  # read after the step's synchronize, outside its time
            bad = nonfinite_loss({"loss": _loss_value(loss)})
            if bad is not None:
                self._nonfinite = (self._seen, *bad)
        if self._seen > self.warmup:
            copy_end = copied if copied == copied else arrived  # nan: no copy marker
            self._rows.append((arrived - start, copy_end - arrived, end - copy_end, end - start))
        if self._ddp_get is not None:
            self._read_ddp()

    def _read_ddp(self) -> None:
        """DDP's timers of the step before this one, where DDP sampled it (outside the timed phases).

        DDP logs an iteration's timers at the next forward, under ``iteration`` = how many forwards it had run;
        read at the end of step ``n`` (one forward per step), new timers are step ``n - 1``'s. The offset between
        the two counts is learned from two consecutive iterations read at consecutive steps (DDP's first 10),
        and then places its every-100th samples; a step that runs more than one forward with grad (no offset
        holds) pairs nothing."""
        try:
            d = self._ddp_get()
            it = int(d.get("iteration", 0) or 0)
            vals = tuple(float(d.get(k, 0) or 0) * 1e-9 for k in (
                "forward_compute_time", "backward_compute_time", "backward_comm_time",
                "backward_compute_comm_overlap_time"))
        except Exception:  # noqa: BLE001  a private method: any failure means no per-step timers
            self._ddp_get = None
            return
        last, self._ddp_last = self._ddp_last, (it, self._seen)
        if last is None or it == last[0] or it <= 0:
            return
        if it == last[0] + 1 and last[1] == self._seen - 1:
            off = self._seen - 1 - it
            if self._ddp_offset is None:
                self._ddp_offset = off
            elif self._ddp_offset != off:
                self._ddp_offset = -1  # not one forward per step: no step can be paired
        if self._ddp_offset is None or self._ddp_offset == -1 or it + self._ddp_offset != self._seen - 1:
            return
        step = self._seen - 1
        if step > self.warmup and vals[2] > 0:
            self._ddp_steps[step] = vals  # type: ignore[assignment]

    def frame(self) -> pd.DataFrame:
        """The measured steps so far (closing the one in progress)."""
        self.end_step()
        df = pd.DataFrame(self._rows, columns=["data", "copy", "compute", "step_s"])
        df["exposed_fraction"] = (df["data"] + df["copy"]) / df["step_s"]
        return df

    def result(self) -> LoopReport:
        """The verdict and figures, without printing. Never raises for the loop's figures: with fewer than 3 steps
        measured after the warm-up the report says so and its verdict is "inconclusive"."""
        df = self.frame()
        if self._nonfinite is not None:  # the job no longer trains: no verdict from its timings
            return _diverged(df, self.divergence(), self._machine_check())
        if len(df) < MIN_STEPS:
            return _too_few(df, self.warmup, self._seen, self._machine_check())
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

    def divergence(self) -> Divergence:
        """Where the loss given to :meth:`loss` first became NaN or infinite, as a
        :class:`helpers.jobs.check.Divergence` of this loop (named as the report names it)."""
        return Divergence(first={self.name: self._nonfinite}, steps={self.name: self._seen})

    def _machine_check(self):
        """The machine's check over the measurement, or None where it cannot be made (a report never raises)."""
        try:
            return machine.check(self._before, machine.snapshot(), max_other_cpu_share=self.busy_cpu_share)
        except Exception:  # noqa: BLE001  the report goes on without the machine's line
            return None

    def report(self, *, print_it: bool = True, every_rank: bool = False) -> "LoopReport | JobReport":
        """Print (by default) and return the report. Never raises in the user's job (see the module notes).

        One process (no launcher, or world size 1): this loop's :class:`LoopReport`, as it always was. Under a
        launcher with two or more ranks every rank must call it: rank 0 gathers the ranks' figures (waiting up
        to ``gather_timeout_s`` for them) and prints and returns the :class:`JobReport`; the other ranks hand
        theirs over and return their own :class:`LoopReport`, printed only with ``every_rank=True``. Too few
        steps measured: a report that says so, whose verdict is "inconclusive". Rank 0 whose gather failed (a
        rendezvous folder that cannot be written): a line that says so, and its own report.
        """
        own = self.result()
        if self.identity.world_size <= 1:
            if print_it:
                print("\n".join(own.lines(self.name)))
            return own
        self._reports += 1
        name = f"{gather.job_key()}-instrument-{self._reports}"
        ignored: list[tuple[int, str, bool]] = []
        try:
            if self.identity.rank == 0 and not _group_initialized() and self.gather_dir is not None:
                ignored += _set_aside_other_launches(Path(self.gather_dir), name, self.identity.world_size,
                                                     self._launch)
            got = gather.gather_to_root(self._payload(), self.identity, name=name, folder=self.gather_dir,
                                        timeout_s=self.gather_timeout_s, started_at=self._started_at)
        except Exception as exc:  # noqa: BLE001  report() never raises in the user's job: it says what failed
            print(f"{self.name}, {self.identity.label}: the ranks' figures could not be gathered "
                  f"({type(exc).__name__}: {exc}); this rank's own report follows", flush=True)
            if print_it:
                print("\n".join(own.lines(f"{self.name}, {self.identity.label}")), flush=True)
            return own
        if got is None:  # not rank 0
            if print_it and every_rank:
                print("\n".join(own.lines(f"{self.name}, {self.identity.label}")))
            return own
        payloads, missing = dict(got.payloads), set(got.missing)
        if got.transport.startswith("folder"):  # a file that arrived while rank 0 waited: another launch's?
            for r in sorted(payloads):
                why = _other_launch(self._launch, payloads[r]) if r != 0 else None
                if why is not None:
                    ignored.append((r, why[0], why[1]))
                    del payloads[r]
                    missing.add(r)
        try:
            rep = job_report(payloads, world_size=got.world_size, missing=tuple(sorted(missing)),
                             threshold=self.threshold, busy_cpu_share=self.busy_cpu_share, transport=got.transport,
                             waited_s=got.waited_s, stopped_by=got.stopped_by,
                             ignored=_ignored_note(ignored, self.gather_dir))
        except Exception as exc:  # noqa: BLE001  a payload this version cannot read: say so, report this rank
            print(f"{self.name}: the job's report could not be made from the ranks' figures ({type(exc).__name__}: "
                  f"{exc}); rank 0's own report follows", flush=True)
            print("\n".join(own.lines(f"{self.name}, {self.identity.label}")), flush=True)
            gather.resume_signal(got)
            return own
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
        steps = {c: [float(v) for v in df[c]] for c in ("data", "copy", "compute", "step_s")}
        if self._ddp_steps:  # DDP's timers of the steps it sampled, aligned with the rows (None: not sampled)
            numbers = [self.warmup + 1 + int(i) for i in df.index]
            per = [self._ddp_steps.get(n) for n in numbers]
            steps["wait"] = [max(0.0, v[2] - v[3]) if v else None for v in per]
        return {"rank": ident.rank, "local_rank": ident.local_rank, "node_rank": ident.node_rank,
                "host": ident.host, "node": ident.node, "device_kind": self.device_kind,
                "launch": _launch_process(), "launch_id": dict(self._launch), "written_at": time.time(),
                "warmup": self.warmup, "seen": self._seen,
                "nonfinite": (list(self._nonfinite[:2]) + [repr(self._nonfinite[2])]
                              if self._nonfinite is not None else None),
                "steps": steps, "n_steps": int(len(self.frame())), "copy_marked": self._copy_marked,
                "synchronous": bool(_group_initialized()), "ddp": ddp, "ddp_note": note,
                "machine_before": self._before.as_dict(), "machine_after": machine.snapshot().as_dict()}


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


def _launch_process() -> int:
    """The process whose tree :mod:`helpers.machine` counts as this rank's own work: torchrun's agent for one of
    its ranks (as :func:`helpers.machine._job_root` decides), else this process."""
    if "TORCHELASTIC_RUN_ID" in os.environ and "LOCAL_RANK" in os.environ:
        return os.getppid()
    return os.getpid()


#: Ranks of one launch start within seconds of each other (torchrun starts its workers together once the
#: rendezvous completes; srun its tasks): a rank file whose process started further than this from rank 0's is
#: another launch's, seconds. The gather's own limit (:data:`helpers.comm.gather.STALE_S`, 30 s) let an earlier
#: launch of a short job through.
LAUNCH_SKEW_S = 10.0
#: A rank writes its file after it started, so after this launch began: a file written more than this before
#: rank 0's process started is an earlier launch's (the margin covers the start times' 1 s resolution), seconds.
WRITTEN_MARGIN_S = 2.0


def _launch_id(started_at: float, identity: gather.RankIdentity) -> dict[str, Any]:
    """What tells this launch's ranks from another launch's, stored in each rank's payload.

    ``key``: the launcher's run id, restart count and rendezvous (``TORCHELASTIC_RUN_ID``,
    ``TORCHELASTIC_RESTART_COUNT``, ``MASTER_ADDR``, ``MASTER_PORT``; SLURM's job and step ids:
    :func:`helpers.comm.gather.job_key`); ``world_size``; ``host`` and ``node_rank``; ``agent``: under torchrun
    the agent that started this rank (pid and start time, shared by the ranks it started on this node), else
    None; ``started_at``: this process's start (seconds since the epoch)."""
    agent = None
    if "TORCHELASTIC_RUN_ID" in os.environ and "LOCAL_RANK" in os.environ:
        try:
            import psutil

            parent = psutil.Process().parent()
            if parent is not None:
                agent = [int(parent.pid), round(float(parent.create_time()), 2)]
        except Exception:  # noqa: BLE001  no agent known: the other parts of the id still hold
            agent = None
    return {"key": gather.job_key(), "world_size": int(identity.world_size), "host": identity.host,
            "node_rank": identity.node_rank, "agent": agent, "started_at": float(started_at)}


def _other_launch(mine: Mapping[str, Any], payload: Any) -> tuple[str, bool] | None:
    """Why ``payload`` (a rank's, read from the gather folder) is not this launch's, and whether that launch was
    an earlier one; None when it is this launch's."""
    theirs = payload.get("launch_id") if isinstance(payload, Mapping) else None
    if not isinstance(theirs, Mapping):
        return "its file carries no launch id (written by an older version of the instrument)", True
    started = float(theirs.get("started_at", 0.0) or 0.0)
    earlier = started < float(mine["started_at"])
    if theirs.get("key") != mine["key"] or theirs.get("world_size") != mine["world_size"]:
        return (f"another rendezvous: {theirs.get('key')!r}, {theirs.get('world_size')} ranks, against this launch's "
                f"{mine['key']!r}, {mine['world_size']} ranks"), earlier
    if (theirs.get("agent") and mine.get("agent") and theirs.get("host") == mine.get("host")
            and theirs.get("node_rank") == mine.get("node_rank") and list(theirs["agent"]) != list(mine["agent"])):
        a = theirs["agent"]
        return (f"started by another torchrun on this node (its agent, pid {a[0]}, started "
                f"{abs(float(a[1]) - float(mine['agent'][1])):.0f} s {'before' if a[1] < mine['agent'][1] else 'after'}"
                " this launch's)"), float(a[1]) < float(mine["agent"][1])
    gap = started - float(mine["started_at"])
    if abs(gap) > LAUNCH_SKEW_S:
        return (f"its process started {abs(gap):.0f} s {'before' if gap < 0 else 'after'} rank 0's; the ranks of one "
                f"launch start within {LAUNCH_SKEW_S:.0f} s"), earlier
    written = payload.get("written_at")
    if isinstance(written, (int, float)) and written < float(mine["started_at"]) - WRITTEN_MARGIN_S:
        return (f"written {float(mine['started_at']) - written:.0f} s before rank 0's process started"), True
    return None


def _read_rank_file(path: Path) -> Mapping[str, Any] | None:
    """A rank file of :func:`helpers.comm.gather.gather_to_root` (``{"rank", "started_at", "payload"}``)'s payload,
    or None (not there, or not readable)."""
    import json

    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return rec.get("payload") if isinstance(rec, dict) and isinstance(rec.get("payload"), dict) else None


def _set_aside_other_launches(folder: Path, name: str, world: int,
                              mine: Mapping[str, Any]) -> list[tuple[int, str, bool]]:
    """Rank 0, before it waits: remove from ``folder`` the rank files of this gather's name that another launch
    left there, so that the gather never reads them and waits for this launch's own; ``(rank, why, earlier)``
    for each. A file is first renamed aside (atomic), then read again: where this launch's rank wrote its own in
    between, that file is put back."""
    out = []
    for r in range(1, world):
        path = folder / f"{name}.rank{r}.json"
        payload = _read_rank_file(path)
        if payload is None or _other_launch(mine, payload) is None:
            continue
        aside = path.with_name(f"{path.name}.other-launch{os.getpid()}")
        try:
            os.replace(path, aside)
        except OSError:
            continue
        payload = _read_rank_file(aside)
        why = _other_launch(mine, payload) if payload is not None else ("unreadable", True)
        if why is None:  # this launch's rank wrote its file between the read and the rename: it stays
            try:
                os.replace(aside, path)
            except OSError:
                pass
            continue
        try:
            aside.unlink()
        except OSError:
            pass
        out.append((r, why[0], why[1]))
    return out


def _ignored_note(ignored: Sequence[tuple[int, str, bool]], folder: Any) -> str:
    """The report's note on the rank files of another launch that were not merged ("" for none)."""
    if not ignored:
        return ""
    n = len(ignored)
    which = ("an earlier launch" if all(e for _, _, e in ignored) else
             "another launch" if not any(e for _, _, e in ignored) else "other launches")
    return (f"ignored {n} rank file{'s' if n > 1 else ''} of {which}: " + "; ".join(
        f"rank {r}'s ({why})" for r, why, _ in sorted(ignored)) + f", in {folder}: never merged; this launch's "
        "figures only")


def _process_start() -> float:
    """This process's start, seconds since the epoch: the ranks of one launch start within seconds of each other,
    which tells their rendezvous files from an earlier launch's."""
    import psutil

    try:
        return float(psutil.Process().create_time())
    except psutil.Error:
        return time.time()


def _loss_value(loss: Any) -> float:
    """A step's loss as one float (a tensor's sum: NaN or infinite when any element is); 0.0 when it cannot be
    read (the report never raises in the user's loop)."""
    try:
        return float(loss.float().sum()) if hasattr(loss, "float") and hasattr(loss, "sum") else float(loss)
    except Exception:  # noqa: BLE001  an unreadable loss is no divergence
        return 0.0


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
