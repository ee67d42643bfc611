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
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import pandas as pd

from helpers import bottleneck, machine, stragglers
from helpers.comm import gather
from helpers.compute.train import nonfinite_loss
from helpers.errors import ParameterError
from helpers.experiments.baseline import spare_cores
from helpers.jobs.check import Divergence

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

    def lines(self, name: str = "your loop") -> list[str]:
        """The printed report."""
        df = self.steps

        def phase(col: str) -> str:
            return (f"{col} {df[col].median() * 1e3:.1f} ms (IQR {df[col].quantile(0.25) * 1e3:.1f}-"
                    f"{df[col].quantile(0.75) * 1e3:.1f})")

        machine_line = [f"machine: {self.machine.sentence()}"] if self.machine is not None else []
        step_line = ([f"median step {df['step_s'].median() * 1e3:.1f} ms: {phase('data')}, {phase('copy')}, "
                      f"{phase('compute')}"] if len(df) else [])
        if self.divergence is not None and self.divergence.diverged:  # a loss that is not finite: no verdict
            return [f"{name}: {len(df)} step{'s' if len(df) != 1 else ''} measured", self.reason, *step_line,
                    *machine_line]
        if self.bottleneck is None:  # too few steps for a verdict: what it has, and what to do
            return [f"{name}: {len(df)} step{'s' if len(df) != 1 else ''} measured",
                    f"inconclusive: {self.reason}", *step_line, f"next: {self.next_notebook}", *machine_line]
        head = (f"inconclusive: {self.machine.sentence()}; what it measured: " if self.recommendation == "inconclusive"
                else "")
        return [f"{name}: {len(df)} steps measured",
                f"{head}{self.measured_recommendation}: {self.reason}",
                *step_line,
                f"next: {self.next_notebook}",
                *machine_line]


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


def _loss_value(loss: Any) -> float:
    """A step's loss as one float (a tensor's sum: NaN or infinite when any element is); 0.0 when it cannot be
    read (the report never raises in the user's loop)."""
    try:
        return float(loss.float().sum()) if hasattr(loss, "float") and hasattr(loss, "sum") else float(loss)
    except Exception:  # noqa: BLE001  an unreadable loss is no divergence
        return 0.0


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
