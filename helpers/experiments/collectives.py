"""Notebook 08's DDP experiment: buckets, compression hooks and overlap on a job, inside a process group.

:func:`run_ddp` runs inside a rank (launched as the task
``helpers.experiments.collectives:run_ddp`` of :mod:`helpers.comm.worker`);
:func:`ddp_benchmark` launches it from a process that holds no process group.

What is measured, per rank, on fixed real batches of the job (each rank draws
its own samples: the batch order of rank r is the epoch-r permutation of the
dataset):

- step time of one training step of the job (the built-in PPO step: rollout,
  GAE, ``ppo_epochs`` updates, each with a backward pass and therefore one
  gradient allreduce; a user's job: its own step, whose backward passes are
  counted) for each ``bucket_cap_mb`` and each compression hook; reported as
  the median (and quartiles) over steps of the max over ranks;
- the bucket sizes DDP actually made (:func:`helpers.comm.ddp.bucket_sizes`);
- gradient error of each hook: the averaged gradients DDP produced for one
  backward pass against an fp32 reference (the same local gradients, divided
  by the world size and summed with ``all_reduce`` in float32, which is what
  DDP's default ``allreduce_hook`` does);
- overlap, at the smallest cap of the sweep that gave more than one bucket
  (with a single bucket nothing can overlap: its allreduce starts when the
  backward pass ends): the same step under ``ddp.no_sync()`` (no
  communication) and the gradients' allreduce alone (flat float32 buffers of
  DDP's bucket sizes, ``ppo_epochs`` times); see
  :func:`helpers.comm.ddp.overlap_figures`.

All variants (caps, hooks, no_sync, allreduce alone) are timed interleaved in
one job: one step of each per round, the order reversed every other round
(ABBA), so that slow phases of a shared machine hit every variant alike.
:func:`bucket_comparison` and :func:`hook_comparison` then judge whether any
difference exceeds the noise (the spread between caps that made the same
buckets, and the quartile ranges).

:func:`check` (the notebook's first call, before any timing) resolves the backend (:func:`plan_backend`), checks
the environment (:func:`env_check`) and DDP's correctness on the job (:func:`run_ddp_check` in a short collective
job: every cap's buckets hold every gradient byte, plain DDP equals the fp32 reference); :func:`run` then runs the
allreduce sweep and :func:`run_ddp` on the job (:class:`DDPConfig`: the user's job or the built-in one, as a
:class:`helpers.jobs.load.JobRequest` every rank resolves) in one collective job (:func:`run_sweep_and_ddp`) and
returns one :class:`CollectivesResult` (which extends the checks' :class:`CollectivesChecks`): the text the cells
print, the records, the verdict and the "try it" panel.

The "try it" panel of notebook 08 calls :func:`try_allreduce`: the allreduce benchmark over a range of message
sizes and a world size, in a new job started by the same launcher, whose rank task :func:`run_allreduce_sweep`
times each size with :func:`helpers.comm.allreduce.run_allreduce` and hands it to the notebook as it finishes.

Where the parts live (each imported here, so the names above and the rank tasks' ``collectives:...`` names hold):
the rank side of the DDP experiment (:class:`DDPConfig`, :func:`run_ddp`, :func:`run_ddp_check`,
:func:`run_sweep_and_ddp`, :func:`ddp_benchmark`) in :mod:`helpers.experiments.collectives_ddp`; the comparisons
(:func:`bucket_comparison`, :func:`hook_comparison`) in :mod:`helpers.comm.ddp`; the one-size-at-a-time rank task
:func:`run_allreduce_sweep` in :mod:`helpers.comm.allreduce`; what the result's cells print in
:mod:`helpers.experiments.collectives_text`.
"""

from __future__ import annotations

import json
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from helpers import specs
from helpers.checklist import Item
from helpers.comm.allreduce import MIB, algbw_gbps, bus_factor, busbw_gbps, message_sizes, run_allreduce_sweep
from helpers.comm.ddp import bucket_comparison, hook_comparison
from helpers.comm.launch import check_backend, check_world_size, resolve_backend, run_job
from helpers.device import get_accelerator
from helpers.errors import ParameterError
from helpers.experiments.base import Experiment, ExperimentResult, checked_fields
from helpers.experiments.collectives_ddp import (
    DDP_CHECK_TASK,
    DDP_KEYS,
    DDP_TASK,
    MEASURE_TASK,
    DDPConfig,
    ddp_benchmark,
    ddp_in_launched_job,
    run_ddp,
    run_ddp_check,
    run_sweep_and_ddp,
)
from helpers.experiments.collectives_text import CollectivesChecksTexts, CollectivesResultTexts, _n_buckets
from helpers.live import Knob, LivePoint, Progress, TrySpec, no_progress
from helpers.results import Records
from helpers.params import Param
from helpers.verdict import Action, Verdict


__all__ = ["BackendPlan", "CollectivesChecks", "CollectivesResult", "DDPConfig", "DDP_CHECK_TASK", "DDP_KEYS",
           "DDP_TASK", "EnvCheck", "MEASURE_TASK", "PROPOSED_ENV", "SWEEP_TASK", "bucket_comparison", "check", "ddp_benchmark",
           "ddp_in_launched_job", "env_check", "hccl_options_text", "hook_comparison", "live_point", "plan_backend",
           "run", "run_allreduce_sweep", "run_ddp", "run_ddp_check", "run_sweep_and_ddp", "try_allreduce", "verdict"]


# --------------------------------------------------------------------------- the verdict

#: Notebook whose verdict :func:`verdict` gives.
NOTEBOOK = "08_collectives"


def verdict(bench: Mapping[str, Any] | None, ddp_res: Mapping[str, Any] | None, buckets: Mapping[str, Any] | None, *,
            why_not: str, context: str) -> Verdict:
    """Notebook 08's verdict: whether a gradient-compression hook is measurably faster, with the bucket and overlap figures.

    Parameters
    ----------
    bench : mapping or None
        :func:`helpers.comm.allreduce.allreduce_benchmark`'s result (``sizes`` rows with ``bytes`` and
        ``busbw_gbps``, ``device``); None when the collectives could not run here.
    ddp_res : mapping or None
        :func:`ddp_benchmark`'s result; None when it could not run.
    buckets : mapping or None
        :func:`bucket_comparison` of ``ddp_res["buckets"]`` (``best``, ``note``, ``noise_s``).
    why_not : str
        Why the collectives could not run (used when ``bench`` or ``ddp_res`` is None).
    context : str
        What was measured, in one sentence.

    Returns
    -------
    helpers.verdict.Verdict
        metric ``busbw_at_largest_size`` (GB/s; None when not applicable); action on ``comm_hook``; ``extra``:
        ``best_bucket_cap_mb`` and ``best_hook``.
    """
    if bench is None or ddp_res is None or buckets is None:
        return Verdict(notebook=NOTEBOOK, metric="busbw_at_largest_size", value=None, unit="GB/s",
                       recommendation="not applicable", reason=why_not, context=context)
    largest = bench["sizes"][-1]
    hcmp = hook_comparison(ddp_res["hooks"], buckets["noise_s"])
    best_comp = hcmp["candidate"]
    if best_comp is None:
        rec, why = "not applicable", hcmp["note"]
    elif hcmp["best"] != "none measurable":
        rec = "enable"
        why = f"{hcmp['note']} per step, for a relative gradient error of {best_comp['rel_err']:.1e}"
    else:
        rec = "leave off"
        so = "so leave compression off" if best_comp["hook"] in hcmp["slower"] else "so none measurable"
        why = (f"compression: {hcmp['note']} per step (median [25th-75th percentile]), {so}; "
               f"{best_comp['hook']} costs a relative gradient error of {best_comp['rel_err']:.1e}")
    best_cap = buckets["best"]
    cap_txt = "none measurable" if best_cap == "none measurable" else "cap " + "/".join(f"{c:g}" for c in best_cap)
    ov = ddp_res["overlap"]
    reason = (f"{why}; best bucket_cap_mb: {cap_txt} ({buckets['note']}); overlap at bucket_cap_mb {ov['cap_mb']:g} "
              f"({_n_buckets(ov['n_buckets'])}): {ov['note']}; busbw {largest['busbw_gbps']:.2f} GB/s at "
              f"{largest['bytes'] / 2**20:g} MiB")
    hook = hcmp["best"] if hcmp["best"] in ("fp16", "bf16") else (best_comp or {}).get("hook", "")
    hook = hook if hook in ("fp16", "bf16") else ""
    action = Action("comm_hook", hook if rec == "enable" else "none",
                    f"{hook + ' ' if hook else ''}gradient compression: {rec}", current="none")
    return Verdict(notebook=NOTEBOOK, metric="busbw_at_largest_size", value=largest["busbw_gbps"], unit="GB/s",
                   recommendation=rec, reason=reason, context=context, action=action,
                   extra={"best_bucket_cap_mb": best_cap, "best_hook": hcmp["best"]})


# --------------------------------------------------------------------------- the "try it" panel: allreduce sweep

#: The rank task of :func:`run_allreduce_sweep`, as :func:`helpers.comm.launch.run_job` names it.
SWEEP_TASK = "helpers.experiments.collectives:run_allreduce_sweep"


def _size_text(nbytes: int) -> str:
    """``"4 MiB"``, ``"64 KiB"``, ``"8 B"``: a message size as the notebook's table writes it."""
    if nbytes >= MIB:
        return f"{nbytes / MIB:g} MiB"
    if nbytes >= 1024:
        return f"{nbytes / 1024:g} KiB"
    return f"{nbytes} B"


def live_point(row: Mapping[str, Any], *, world_size: int, backend: str = "", label: str | None = None) -> LivePoint:
    """One allreduce size as a "try it" point: its bus bandwidth, nccl-tests' way, with the spread of its times.

    Parameters
    ----------
    row : mapping
        A row of notebook 08's allreduce table (:func:`helpers.comm.allreduce.summarize`, plus ``repeats``):
        ``bytes``, ``time_s``, ``time_p25_s``, ``time_p75_s`` (seconds, the slowest rank's), ``busbw_gbps``.
    world_size : int
        Ranks it ran on (n in the factor 2(n-1)/n).
    backend : str
        For the sentence (``gloo``, ``nccl``, ``hccl``).
    label : str, optional
        Default ``"<size>, <n> ranks"``.

    Returns
    -------
    LivePoint
        metric ``bus_bandwidth``, unit ``GB/s`` (1e9 B/s): busbw = algbw x 2(n-1)/n at the median time;
        ``low``/``high``: the busbw at the 75th/25th percentile times (the interquartile range).

    Raises
    ------
    helpers.errors.ParameterError
        For a world size below 1 or a time that is not positive.
    """
    nbytes, n = int(row["bytes"]), int(world_size)
    factor = bus_factor(n)
    t, algbw = float(row["time_s"]), algbw_gbps(nbytes, float(row["time_s"]))
    busbw = busbw_gbps(nbytes, t, n)
    low = busbw_gbps(nbytes, float(row["time_p75_s"]), n)
    high = busbw_gbps(nbytes, float(row["time_p25_s"]), n)
    size = _size_text(nbytes)
    label = label or f"{size}, {n} rank{'s' if n != 1 else ''}"
    repeats = row.get("repeats")
    how = f"{backend}, " if backend else ""
    if n == 1:
        tail = ("one rank: nothing crosses a link, so busbw = algbw x 2(n-1)/n = 0; algbw "
                f"{algbw:.3g} GB/s measures only the call's own overhead (a copy within one process)")
    else:
        tail = f"algbw {algbw:.2f} GB/s x 2(n-1)/n = {factor:.2f}"
    sentence = (f"{label} ({how}{t * 1e6:,.0f} us per allreduce, slowest rank's median"
                + (f" of {repeats} calls" if repeats else "") + f"): busbw {busbw:.3g} GB/s (IQR {low:.3g}-"
                f"{high:.3g}); {tail}")
    return LivePoint(label=label, value=busbw, unit="GB/s", metric="bus_bandwidth", low=low, high=high,
                     sentence=sentence, extra={"bytes": nbytes, "world_size": n, "algbw_gbps": algbw,
                                               "time_s": t, "bus_factor": factor, "backend": backend,
                                               "calls": repeats})


def try_allreduce(*, min_mib: float, max_mib: float, world_size: int, backend: str = "auto",
                  device_kind: str | None = None, repeats: int = 10, warmup: int = 3, timeout_s: float = 300.0,
                  master_port: int = 0, log_dir: "str | None" = None,
                  progress: Progress = no_progress) -> Iterator[LivePoint]:
    """Notebook 08's allreduce benchmark again over a range of message sizes and a world size: one point per size.

    The sizes are ``min_mib`` doubled up to ``max_mib`` (both included; whole float32 elements, as
    :func:`helpers.comm.allreduce.message_sizes`). One collective job of ``world_size`` processes on this
    machine, started by the notebook's launcher (:func:`helpers.comm.launch.run_job`, torchrun, the process
    group in child processes only), times every size with the notebook's own code
    (:func:`run_allreduce_sweep`: correctness check, ``warmup`` untimed and ``repeats`` timed calls, each
    followed by a device synchronize, five times the calls up to 64 KiB, the slowest rank's median). Points
    are yielded while the job runs, as each size finishes; closing the iterator early (or Kernel > Interrupt)
    asks the ranks to stop after the size they are in, and waits for them.

    Parameters
    ----------
    min_mib, max_mib : float
        Smallest and largest message, MiB (2**20 bytes); 4 bytes <= min_mib <= max_mib.
    world_size : int
        Ranks (processes) of the job, >= 1; at most what :func:`helpers.comm.launch.max_world_size` allows here
        (gloo: 4 per usable core and the memory; nccl/hccl: one per visible device).
    backend : {"auto", "gloo", "nccl", "hccl"}
        As the notebook's (the one it resolved, e.g. its fallback to gloo).
    device_kind : str, optional
        For ``"auto"``: the notebook's device kind (default: torch's best device).
    repeats, warmup : int
        Timed (>= 1) and untimed (>= 0) allreduces per size: the notebook's ``repeats`` and ``warmup``.
    timeout_s : float
        Seconds before the job counts as hung and is stopped with every process it started.
    master_port : int
        0: a free port; else this port on 127.0.0.1.
    log_dir : str, optional
        Where the logs of a failed job are kept.
    progress : callable
        ``progress(done, total)`` after each size, in sizes.

    Returns
    -------
    iterator of LivePoint
        One per size, smallest first, see :func:`live_point`: metric ``bus_bandwidth``, unit ``GB/s``.

    Raises
    ------
    helpers.errors.ParameterError
        At the call, before anything starts: a size range that is empty or below 4 bytes, repeats < 1 or
        warmup < 0, a world size below 1 or above what this machine runs with the backend, an unknown backend.
    helpers.errors.DeviceUnavailableError
        At the call: the backend cannot run here.
    TimeoutError, RuntimeError
        While iterating: the job hung (past ``timeout_s``) or a rank failed (see
        :func:`helpers.comm.launch.run_job`).
    """
    for name, v in (("min_mib", min_mib), ("max_mib", max_mib)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ParameterError(f"{name}={v!r}: a message size in MiB must be a number > 0")
    min_bytes, max_bytes = int(round(min_mib * MIB)), int(round(max_mib * MIB))
    if min_bytes < 4:
        raise ParameterError(f"min_mib={min_mib!r} is {min_bytes} bytes, below one float32 element (4 bytes): "
                             "raise min_mib")
    if min_bytes > max_bytes:
        raise ParameterError(f"the smallest size ({_size_label(min_bytes)}, min_mib) is larger than the largest "
                             f"({_size_label(max_bytes)}, max_mib): the size range is empty; lower the smallest or "
                             "raise the largest")
    for name, v, lo in (("repeats", repeats, 1), ("warmup", warmup, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ParameterError(f"{name}={v!r} must be an int >= {lo}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ParameterError(f"world_size={world_size!r} must be an int >= 1 (ranks of the job)")
    sizes = message_sizes(min_bytes, max_bytes)
    kind = device_kind or get_accelerator("auto").kind
    be = resolve_backend(backend, kind)
    check_backend(be)
    check_world_size(world_size, be, bytes_per_rank=2 * sizes[-1])  # what the sweep's largest size needs
    return _sweep_points(sizes, world_size=world_size, backend=be, device_kind=kind, repeats=repeats,
                         warmup=warmup, timeout_s=timeout_s, master_port=master_port, log_dir=log_dir,
                         progress=progress)


def _size_label(nbytes: int) -> str:
    """``"1 KiB"``, ``"4 MiB"``: a size as the panel's knobs show it."""
    return f"{nbytes / MIB:g} MiB" if nbytes >= MIB else f"{nbytes / 1024:g} KiB"


def _sweep_points(sizes: Sequence[int], *, world_size: int, backend: str, device_kind: str, repeats: int,
                  warmup: int, timeout_s: float, master_port: int, log_dir, progress: Progress
                  ) -> Iterator[LivePoint]:
    """Run :func:`run_allreduce_sweep` in a job (a thread waits for it) and yield each row as rank 0 writes it."""
    with tempfile.TemporaryDirectory(prefix="try_allreduce_", ignore_cleanup_errors=True) as tmp:
        root = Path(tmp)
        points, stop = root / "points", root / "stop"
        points.mkdir()
        cfg = {"sizes": [int(s) for s in sizes], "repeats": int(repeats), "warmup": int(warmup),
               "points_dir": str(points), "stop_file": str(stop)}
        box: dict[str, Any] = {}

        def job() -> None:  # run_job waits for torchrun; this thread ends only after the job has ended
            try:
                box["result"] = run_job(SWEEP_TASK, cfg, world_size=world_size, backend=backend,
                                        device_kind=device_kind, timeout_s=timeout_s, master_port=master_port,
                                        out_dir=root / "job", bytes_per_rank=2 * int(sizes[-1]), log_dir=log_dir)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread below
                box["error"] = exc

        waiter = threading.Thread(target=job, name="try-allreduce", daemon=True)
        waiter.start()
        seen = 0
        try:
            while True:
                ended = not waiter.is_alive()  # read first: a row written before the job ended is listed below
                for f in sorted(points.glob("[0-9]*.json"))[seen:]:
                    row = json.loads(f.read_text())
                    seen += 1
                    progress(seen, len(sizes))
                    yield live_point(row, world_size=world_size, backend=backend)
                if ended:
                    break
                waiter.join(timeout=0.05)
        finally:
            if waiter.is_alive():  # closed early or interrupted: the ranks stop after the size they are in
                stop.touch()
                waiter.join()
        if "error" in box:
            raise box["error"]


# --------------------------------------------------------------------------- the notebook's experiment: one result


@dataclass(frozen=True)
class BackendPlan:
    """The collective backend notebook 08 runs on, and whether it can run here.

    Attributes
    ----------
    requested : str
        The ``backend`` parameter (``"auto"``, ``"gloo"``, ``"nccl"``, ``"hccl"``).
    backend : str or None
        The one resolved (auto falls back to gloo on the CPU where the device's library cannot run); None when
        none can run.
    world_size : int
    runnable : bool
    why_not : str
        Why the collectives cannot run (empty when they can).
    note : str
        What was tried and failed on the way (empty when the first choice ran).
    limit : int
        The largest world size this machine allows with the backend, and ``limit_why`` why.
    limit_why : str
    """

    requested: str
    backend: str | None
    world_size: int
    runnable: bool
    why_not: str
    note: str
    limit: int
    limit_why: str

    def text(self) -> str:
        """The backend, the world size and this machine's limit (and the note)."""
        line = (f"backend: {self.backend or 'none'}; world_size {self.world_size} (this machine allows at most "
                f"{self.limit}: {self.limit_why})")
        return line + (f"\nnote: {self.note}" if self.note else "")


def plan_backend(requested: str, world_size: int, kind: str) -> BackendPlan:
    """Resolve the backend for device ``kind`` and check it and the world size, falling back to gloo on the CPU
    for ``"auto"`` on a device whose library cannot run here."""
    from helpers.comm.launch import max_world_size
    from helpers.errors import DeviceUnavailableError

    def checked(req: str, k: str) -> str:
        be = resolve_backend(req, k)
        check_backend(be)
        check_world_size(world_size, be)
        return be

    why_not, note = "", ""
    try:
        backend = checked(requested, kind)
    except (DeviceUnavailableError, ParameterError) as exc:
        backend, note = None, str(exc)
        if requested == "auto" and kind != "cpu":
            try:
                backend = checked("gloo", "cpu")
                note = f"{note} -> falling back to gloo on the CPU"
            except (DeviceUnavailableError, ParameterError) as exc2:
                note = f"{note}; gloo: {exc2}"
        if backend is None:
            why_not = note
    limit, limit_why = max_world_size(backend or "gloo")
    return BackendPlan(requested, backend, world_size, backend is not None, why_not, note, limit, limit_why)


#: Notebook 08's proposed environment: (name, value, what it is); invented names, a bad value and a rejected pair
#: among real ones, so that the catalog's check shows each kind of finding.
PROPOSED_ENV = (
    ("HCCL_OP_BLOCK_LIST", "AllReduce", "invented"),
    ("PT_DEBUG", "1", "invented"),
    ("ASCEND_COMPRESS_LEVEL", "3", "invented"),
    ("HCCL_ALGO", "tree", "real name, invalid value"),
    ("HCCL_BUFFSIZE", "400", "real: MB per communicator buffer"),
    ("HCCL_CONNECT_TIMEOUT", "1200", "real: seconds, 120-7200"),
    ("HCCL_EXEC_TIMEOUT", "1836", "real: seconds"),
    ("NCCL_DEBUG", "WARN", "real"),
    ("HCCL_INTRA_ROCE_ENABLE", "1", "real, but not together with the next one"),
    ("HCCL_INTRA_PCIE_ENABLE", "1", "real; both set to 1 is rejected by the catalog's cross-checks"),
)

_LEVEL = {"ok": 0, "warning": 1, "error": 2}


@dataclass(frozen=True)
class EnvCheck:
    """The environment catalog's findings on this process's environment and on :data:`PROPOSED_ENV`, and the
    validated env file written from the latter (``path``)."""

    current: tuple
    found: tuple
    path: Path

    def current_text(self) -> str:
        """The watched settings in this process's environment, one finding a line."""
        from helpers.diagnose.envcatalog import format_finding

        return "\n".join([f"current environment: {len(self.current)} watched setting(s) found"]
                         + [format_finding(f) for f in self.current])

    def proposed_text(self) -> str:
        """The findings on the proposed settings, errors first."""
        from helpers.diagnose.envcatalog import format_finding

        order = sorted(self.found, key=lambda f: (-_LEVEL[f.severity], f.name))
        return "\n".join(["proposed settings (one finding per line):"] + [format_finding(f) for f in order])

    def written_text(self) -> str:
        """The rejected names and the settings the validated env file holds."""
        written = [line for line in self.path.read_text().splitlines() if line.startswith("export ")]
        bad = sorted({f.name for f in self.found if f.severity == "error"})
        return "\n".join([f"rejected: {', '.join(bad)}", f"written to {self.path.name}:"] + written)

    def add_records(self, out: Records) -> None:
        for f in self.found:
            out.add("env_check", f.name, "severity", _LEVEL[f.severity], "level", value_seen=f.value,
                    severity=f.severity, message=f.message, fix=f.fix)
        out.add("env_check", "validated env file", "settings_written",
                sum(line.startswith("export ") for line in self.path.read_text().splitlines()), "settings",
                path=self.path.name)


def env_check(out_dir: "str | Path") -> EnvCheck:
    """Check this process's environment and :data:`PROPOSED_ENV` against the catalog (as on an NPU), and write the
    valid proposed settings to ``out_dir/08_collectives_validated.env``."""
    import logging
    import os

    from helpers.diagnose.envcatalog import check_env, write_env_file

    current = check_env(os.environ)
    proposed = {n: v for n, v, _ in PROPOSED_ENV}
    found = check_env(proposed, npu=True)
    envlog = logging.getLogger("helpers.diagnose.envcatalog")
    level = envlog.level
    envlog.setLevel(logging.ERROR)  # the rejected names are printed by written_text, without the folder's path
    try:
        path, _ = write_env_file(proposed, Path(out_dir) / "08_collectives_validated.env", npu=True, skip_invalid=True)
    finally:
        envlog.setLevel(level)
    return EnvCheck(tuple(current), tuple(found), Path(path))


def hccl_options_text(kind: str) -> str:
    """Per-process-group HCCL options on an NPU (torch_npu's ``ProcessGroupHCCL.Options``), or why not here."""
    if kind != "npu":
        return f"per-group HCCL options: not applicable on {kind} (needs torch_npu and an NPU)"
    from helpers.comm.hccl_options import hccl_process_group_options

    opts = hccl_process_group_options(buffer_size_mb=400, op_expansion_mode=None)
    return (f"hccl_config: {getattr(opts, 'hccl_config', None)}\n"
            "use: dist.init_process_group('hccl', pg_options=opts) or dist.new_group(ranks, pg_options=opts)")


@dataclass(frozen=True, eq=False)
class CollectivesChecks(CollectivesChecksTexts):
    """Notebook 08 before any timing (:func:`check`): the backend, the environment check and DDP's correctness on
    the job. :class:`CollectivesResult` extends it with the measurement.

    Attributes
    ----------
    plan : BackendPlan
    device_kind : str
        ``acc.kind`` of the notebook.
    env : EnvCheck
    params : mapping
        The notebook's parameters (``world_size``, ``min_bytes``, ``max_size_mib``, ``repeats``, ``warmup``,
        ``steps``, ``batch_size``, ``image_size``, ``model_width``, ``timeout_s``, ``master_port``, ``backend``).
    ddp_check : dict or None
        :func:`run_ddp_check`'s result (the buckets of every cap, plain DDP against the fp32 reference); None when
        the collectives cannot run here.
    log_dir : str
        Where a failed collective job keeps its logs (the notebook's artifacts folder).
    """

    plan: BackendPlan
    device_kind: str
    env: EnvCheck
    params: Mapping[str, Any] = field(repr=False)
    ddp_check: Mapping[str, Any] | None = None
    log_dir: str = ""


@dataclass(frozen=True, eq=False)
class CollectivesResult(CollectivesChecks, CollectivesResultTexts, ExperimentResult):
    """Notebook 08's measurement: the backend, the allreduce sweep, DDP's buckets, hooks and overlap on the job,
    and the environment check.

    Attributes
    ----------
    plan, device_kind, env, params, ddp_check, log_dir
        As :class:`CollectivesChecks`'s (sections 1-3, with their texts).
    bench : dict or None
        :func:`helpers.comm.allreduce.allreduce_benchmark`'s result; None when the collectives cannot run here.
    ddp : dict or None
        :func:`ddp_benchmark`'s result; None when they cannot.
    """

    bench: Mapping[str, Any] | None = field(default=None, kw_only=True)
    ddp: Mapping[str, Any] | None = field(default=None, kw_only=True)

    # -- derived figures -----------------------------------------------------------------------

    @property
    def regimes(self) -> dict[str, Any] | None:
        """:func:`helpers.comm.allreduce.regimes` of the sweep (None without one)."""
        from helpers.comm.allreduce import regimes

        return regimes(self.bench["sizes"]) if self.bench is not None else None

    @property
    def flags(self) -> list[dict[str, Any]]:
        """The sweep's sizes that look noisy (:func:`helpers.comm.allreduce.flag_outliers`)."""
        from helpers.comm.allreduce import flag_outliers

        if self.bench is None:
            return []
        return flag_outliers(self.bench["sizes"], growth_from_bytes=self.regimes["crossover_bytes"])

    @property
    def buckets(self) -> dict[str, Any] | None:
        """:func:`bucket_comparison` of DDP's bucket sweep (None without DDP)."""
        return None if self.ddp is None else bucket_comparison(self.ddp["buckets"], self.ddp["backward_passes"])

    # -- records, verdict and the panel ----------------------------------------------------------

    def records(self) -> Records:
        """The allreduce sweep, DDP's buckets, hooks and overlap, and the environment check; in that order."""
        out, why = Records(), self.plan.why_not
        self._allreduce_records(out)
        if self.ddp is None:
            out.add("ddp_buckets", "sweep", "step_time", None, "s", recommendation="not applicable", reason=why)
        else:
            self._ddp_records(out)
        self.env.add_records(out)
        return out

    def _allreduce_records(self, out: Records) -> None:
        bench = self.bench
        if bench is None:
            out.add("allreduce", "benchmark", "busbw", None, "GB/s", recommendation="not applicable",
                    reason=self.plan.why_not)
            return
        for r in bench["sizes"]:
            out.add("allreduce", f"{r['bytes']} B", "busbw", r["busbw_gbps"], "GB/s", repeats=r["repeats"],
                    spread={"time_s": r["time_s"], "time_p25_s": r["time_p25_s"], "time_p75_s": r["time_p75_s"]},
                    algbw_gbps=r["algbw_gbps"], backend=self.plan.backend, world_size=self.plan.world_size)
        b = bench["bare"]
        out.add("allreduce", "bare loop", "overhead_vs_bare", bench["overhead_vs_bare"], "x",
                bare_busbw_gbps=b["busbw_gbps"], bench_busbw_gbps=b["bench_busbw_gbps"], bytes=b["bytes"],
                statistic=bench["overhead_statistic"], target="<= 1.10", met=bench["met"]["overhead_vs_bare"],
                note=bench["overhead_note"])

    def _ddp_records(self, out: Records) -> None:
        d, steps = self.ddp, self.params["steps"]
        for b in d["buckets"]:
            out.add("ddp_buckets", f"bucket_cap_mb={b['cap_mb']:g}", "step_time", b["time_s"], "s", repeats=steps,
                    spread={"p25": b["time_p25_s"], "p75": b["time_p75_s"]}, bucket_sizes=b["bucket_sizes"],
                    n_buckets=b["n_buckets"])
        for h in d["hooks"]:
            out.add("ddp_compression", h["hook"], "step_time", h["time_s"], "s", repeats=steps,
                    spread={"p25": h["time_p25_s"], "p75": h["time_p75_s"]}, bytes_per_step=h["bytes_per_step"])
            out.add("ddp_compression", h["hook"], "grad_rel_err", h["rel_err"], "1", max_abs_err=h["max_abs_err"],
                    mismatched=h["mismatched"])
        for name, why in d["unsupported_hooks"].items():
            out.add("ddp_compression", name, "step_time", None, "s", recommendation="not applicable", reason=why)
        ov = d["overlap"]
        out.add("ddp_overlap", f"bucket_cap_mb={ov['cap_mb']:g}", "hidden_fraction", ov["hidden_fraction"], "1",
                t_ddp_s=ov["t_ddp_s"], t_nosync_s=ov["t_nosync_s"], t_allreduce_s=ov["t_allreduce_s"],
                n_buckets=ov["n_buckets"], consistent=ov["consistent"], note=ov["note"],
                raw_hidden_fraction=ov["raw_hidden_fraction"], single_bucket=ov.get("single_bucket", False))

    def verdict(self) -> Verdict:
        """Notebook 08's verdict (:func:`verdict`) with :attr:`context`."""
        ran = self.bench is not None and self.ddp is not None
        return verdict(self.bench, self.ddp, self.buckets if ran else None, why_not=self.plan.why_not,
                       context=self.context)

    def try_it(self, acc: Any, params: Mapping[str, Any]) -> TrySpec:
        """The "try it" panel: the allreduce benchmark over another size range and world size
        (:func:`try_allreduce`), beside this notebook's own point at the panel's largest starting size.

        Knobs: ``min_mib`` and ``max_mib`` (1 KiB up to the larger of ``max_size_mib`` and 256 MiB, powers of two;
        starting at 1 MiB and the smaller of 4 MiB and ``max_size_mib``, a cheap range for the headless point) and
        ``world_size`` (1 up to this machine's cores with gloo, its devices otherwise).
        """
        import math

        from helpers.comm.launch import max_world_size
        from helpers.device import usable_cores

        P, plan = params, self.plan
        be = plan.backend or "gloo"
        most = usable_cores() if be == "gloo" else max(1, max_world_size(be)[0])  # processes on this machine
        top = int(math.log2(max(P["max_size_mib"], 256)))
        sizes = tuple((f"{2.0**k * 1024:g} KiB" if k < 0 else f"{2**k} MiB", 2.0**k) for k in range(-10, top + 1))
        lo, hi = 1.0, float(min(4, P["max_size_mib"]))
        reference = None
        if self.bench is not None:  # the notebook's own size at the panel's largest starting size
            row = min(self.bench["sizes"], key=lambda r: abs(r["bytes"] - hi * 2**20))
            reference = live_point(row, world_size=P["world_size"], backend=plan.backend)
        kind, log_dir = acc.kind, self.log_dir
        knobs = {"min_mib": Knob(sizes, lo, "smallest"), "max_mib": Knob(sizes, hi, "largest"),
                 "world_size": Knob(tuple((str(n), n) for n in range(1, most + 1)), min(P["world_size"], most),
                                    "world_size")}
        return TrySpec("allreduce bus bandwidth against message size",
                       lambda progress, min_mib, max_mib, world_size: try_allreduce(
                           min_mib=min_mib, max_mib=max_mib, world_size=world_size, backend=be, device_kind=kind,
                           repeats=P["repeats"], warmup=P["warmup"], timeout_s=P["timeout_s"],
                           master_port=P["master_port"], log_dir=log_dir, progress=progress),
                       knobs, reference=reference,
                       unavailable="" if plan.runnable else f"the collectives cannot run here: {plan.why_not}")


def _launch_options(ctx: Any, plan: BackendPlan) -> dict[str, Any]:
    """The launcher's keywords (:func:`helpers.comm.launch.run_job`) of notebook 08's collective jobs."""
    P = ctx.params
    return dict(world_size=P["world_size"], backend=plan.backend, timeout_s=P["timeout_s"],
                master_port=P["master_port"], device_kind=ctx.acc.kind, log_dir=str(ctx.artifacts_dir))


def check(ctx: Any) -> CollectivesChecks:
    """Notebook 08 before any timing, in the notebook's order: the backend, the environment check and DDP's
    correctness on the job (:func:`run_ddp_check` in a short collective job: seconds where :func:`run` takes
    minutes at the default sizes).

    Parameters
    ----------
    ctx : helpers.workbook.nbsetup.NotebookContext
        The notebook's parameters, accelerator, artifacts folder (a failed job's logs) and out folder (the
        validated env file).

    Returns
    -------
    CollectivesChecks

    Raises
    ------
    ParameterError, DataError, TimeoutError, RuntimeError
        The collective job's (:func:`helpers.comm.launch.run_job`).
    """
    P, acc = ctx.params, ctx.acc
    plan = plan_backend(P["backend"], P["world_size"], acc.kind)
    ddp_check = None
    if plan.runnable:
        ddp_check = run_job(DDP_CHECK_TASK, DDPConfig.from_params(P).as_dict(), **_launch_options(ctx, plan)).data
    return CollectivesChecks(plan=plan, device_kind=acc.kind, env=env_check(ctx.out_dir), params=dict(P),
                             ddp_check=ddp_check, log_dir=str(ctx.artifacts_dir))


def run(ctx: Any, checks: CollectivesChecks | None = None) -> CollectivesResult:
    """Notebook 08's experiment, in the notebook's order: :func:`check` (the backend, the environment, DDP's
    correctness), then the allreduce sweep and DDP timed on the job (the user's, ``params["job"]``, loaded by every
    rank; else the built-in PPO job), both in one collective job (:func:`run_sweep_and_ddp`).

    Parameters
    ----------
    ctx : helpers.workbook.nbsetup.NotebookContext
        The notebook's parameters, accelerator, artifacts folder (a failed job's logs) and out folder (the
        validated env file). For a user's job, ``params["batch_size"]`` is set to the batch its ranks trained
        (``ctx.use_job_batch``).
    checks : CollectivesChecks, optional
        :func:`check`'s result (the notebook shows it before the timing starts); None checks here.

    Returns
    -------
    CollectivesResult

    Raises
    ------
    ParameterError, DataError, TimeoutError, RuntimeError
        A collective job's (:func:`helpers.comm.launch.run_job`).
    """
    from helpers.comm.allreduce import bench_config, finish_result

    P = ctx.params
    c = checks if checks is not None else check(ctx)
    bench = ddp_res = None
    if c.plan.runnable:
        sweep = bench_config(min_bytes=P["min_bytes"], max_size_mib=P["max_size_mib"], repeats=P["repeats"],
                             warmup=P["warmup"])
        launched = run_job(MEASURE_TASK, {"allreduce": sweep, "ddp": DDPConfig.from_params(P).as_dict()},
                           bytes_per_rank=2 * sweep["sizes"][-1], **_launch_options(ctx, c.plan))
        data, be = launched.data, launched.backend
        # as allreduce_benchmark and ddp_benchmark return them, each part timed inside the job
        bench = finish_result(data["allreduce"], backend=be, world_size=launched.world_size,
                              wall_s=data["allreduce_s"])
        ddp_res = {**data["ddp"], "wall_s": round(data["ddp_s"], 2), "backend": be}
        if not ddp_res.get("builtin", True):  # a user's job trained at its own batch per rank: the records say it
            ctx.use_job_batch(ddp_res["batch_per_rank"])
    return CollectivesResult(**checked_fields(c), bench=bench, ddp=ddp_res)


# -- the notebook's declaration, found by helpers.experiments.registry ------------------------------------

EXPERIMENT = Experiment(
    item=Item("08", "08_collectives", "collectives",
         "Measure collectives and tune DDP's communication",
         "Allreduce bus bandwidth vs message size, DDP's buckets and gradient compression on this backend"),
    spec=specs.COMMON + specs.DATA + specs.batch("samples per rank per DDP step") + specs.training(
        "timed DDP steps per variant") + (
        Param("backend", str, "auto", "torch.distributed backend: auto picks hccl on npu, nccl on cuda, gloo on cpu",
              choices=("auto", "gloo", "nccl", "hccl")),
        Param("world_size", int, 2, "processes in the process group (one per device on cuda/npu)", minimum=2,
              maximum=64),
        Param("min_bytes", int, 8, "smallest allreduce message, bytes", minimum=4, maximum=1 << 30),
        Param("max_size_mib", int, 256, "largest allreduce message, MiB", minimum=1, maximum=1 << 16),
        Param("repeats", int, 10, "timed allreduces per message size", minimum=3, maximum=10000),
        Param("warmup", int, 3, "untimed allreduces per message size", minimum=0, maximum=1000),
        Param("bucket_cap_mb_list", list, [0.25, 1, 25], "DDP bucket_cap_mb values to sweep (25 is DDP's default)",
              item_kind=float, minimum=0.01, maximum=4096),
        Param("compression_hooks", list, ["none", "fp16", "bf16"],
              "DDP gradient compression hooks to compare (none is plain allreduce)", item_kind=str,
              choices=("none", "fp16", "bf16")),
        Param("timeout_s", float, 300.0, "seconds before a collective job counts as hung and is stopped",
              minimum=5.0, maximum=7200.0),
        Param("master_port", int, 0, "TCP port of the rendezvous on 127.0.0.1 (0 picks a free one)", minimum=0,
              maximum=65535),
    ) + specs.JOB,
)
