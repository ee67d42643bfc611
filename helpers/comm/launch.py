"""Start collective jobs in child processes with torchrun, with a timeout and no stray process.

The calling process (a notebook kernel, the ``bench`` command, a test) never
holds a process group (pytorch/pytorch#104136: "Address already in use" and hangs when
a notebook initializes a process group twice). It runs::

    python -m torch.distributed.run --standalone --nproc-per-node N \\
        -m helpers.comm.worker --task TASK --config CFG.json --out DIR

(or ``--nnodes 1 --master-addr 127.0.0.1 --master-port P`` when the caller
gives a port), waits at most ``timeout_s``, and on timeout kills torchrun and
every process it started (torchrun starts its workers in sessions of their
own, so the whole tree is collected with psutil before it is killed). Rank 0
writes the result as ``result.json`` in the output folder; a rank that fails
writes ``error_rank<R>.json`` with its message.

Each rank's own stdout and stderr are kept in files by torchrun
(``--log-dir OUT/ranks --tee 3``: ``ranks/<run id>/attempt_0/<local rank>/
std{out,err}.log``, and still copied to torchrun's console log). When a job
fails or times out, the error message quotes the last lines of the failed
rank's stderr, and ``torchrun.log`` with every rank's logs is copied to a
folder that survives the job (``log_dir``, or a new temporary folder that is
not removed) whose path the message gives.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from helpers.process import die_with_parent, register_child, stop_processes, unregister_child
from helpers.device import get_accelerator, usable_cores
from helpers.errors import DataError, DeviceUnavailableError, ParameterError

log = logging.getLogger(__name__)

BACKENDS = ("gloo", "nccl", "hccl")
#: Resident memory of one worker process that has imported torch (measured
#: about 0.3-0.4 GiB on CPU builds; rounded up to leave headroom).
WORKER_RSS_BYTES = 512 * 2**20
#: gloo processes per usable core allowed on one machine. Each gloo rank runs
#: its collectives on its own threads; beyond about 4 ranks per core the
#: processes mostly wait for CPU time and a "hang" cannot be told from a
#: starved process, so larger jobs are refused with an explanation.
GLOO_RANKS_PER_CORE = 4
GLOO_MAX_WORLD = 64


@dataclass(frozen=True)
class JobResult:
    """What a finished collective job returned.

    Attributes
    ----------
    data : dict
        The JSON object rank 0 wrote.
    backend : str
    world_size : int
    wall_s : float
        Seconds from launch to exit, process start-up included.
    log_tail : str
        The last lines of torchrun's combined output (for diagnosis).
    """

    data: dict
    backend: str
    world_size: int
    wall_s: float
    log_tail: str


def resolve_backend(backend: str = "auto", device_kind: str = "cpu") -> str:
    """The torch.distributed backend for ``backend`` on a device of kind ``device_kind``.

    Parameters
    ----------
    backend : {"auto", "gloo", "nccl", "hccl"}
        "auto" picks hccl on npu, nccl on cuda and gloo on cpu.
    device_kind : {"cpu", "cuda", "npu"}

    Returns
    -------
    str

    Raises
    ------
    ParameterError
        Unknown backend name.
    """
    if backend == "auto":
        return {"npu": "hccl", "cuda": "nccl"}.get(device_kind, "gloo")
    if backend not in BACKENDS:
        raise ParameterError(f"backend={backend!r} is not one of auto, {', '.join(BACKENDS)}; pick one of those.")
    return backend


def backend_device_kind(backend: str) -> str:
    """Device kind a backend's tensors live on: gloo -> cpu, nccl -> cuda, hccl -> npu."""
    return {"gloo": "cpu", "nccl": "cuda", "hccl": "npu"}[backend]


def check_backend(backend: str) -> None:
    """Raise unless ``backend`` can run here.

    gloo needs ``torch.distributed.is_gloo_available()``; nccl needs
    ``is_nccl_available()`` and a CUDA device; hccl needs an importable
    torch_npu with a usable NPU (torch_npu registers the "hccl" backend,
    fact-check line 91).

    Raises
    ------
    DeviceUnavailableError
        With the reason and what to do.
    """
    import torch
    import torch.distributed as dist

    if not dist.is_available():
        raise DeviceUnavailableError("this torch build has no torch.distributed; install a build with it.")
    if backend == "gloo":
        if not dist.is_gloo_available():
            raise DeviceUnavailableError("backend 'gloo' is not available in this torch build; use another backend.")
    elif backend == "nccl":
        if not dist.is_nccl_available() or not torch.cuda.is_available():
            raise DeviceUnavailableError(
                f"backend 'nccl' needs CUDA: is_nccl_available()={dist.is_nccl_available()}, "
                f"cuda.is_available()={torch.cuda.is_available()}; use backend='gloo' (CPU) or a CUDA build on a GPU.")
    elif backend == "hccl":
        try:
            acc = get_accelerator("npu")
        except Exception as exc:  # DeviceUnavailableError or an import failure of torch_npu
            raise DeviceUnavailableError(
                f"backend 'hccl' needs torch_npu and an Ascend NPU, which are not usable here ({exc}); "
                "use backend='gloo' or run on an NPU machine with CANN set up.") from exc
        del acc
    else:
        resolve_backend(backend)


def max_world_size(backend: str, *, bytes_per_rank: int = 0) -> tuple[int, str]:
    """Largest world size that can run on this machine, and why.

    cuda/npu: one process per visible device. gloo: ``min(64,
    GLOO_RANKS_PER_CORE * usable_cores(), available memory // (WORKER_RSS_BYTES
    + bytes_per_rank))``, at least 2.

    Parameters
    ----------
    backend : str
    bytes_per_rank : int
        Extra host memory each rank needs (e.g. twice the largest message), bytes.

    Returns
    -------
    (int, str)
    """
    import torch

    if backend == "nccl":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return n, f"{n} visible CUDA device(s), one process each"
    if backend == "hccl":
        npu = getattr(torch, "npu", None)
        n = npu.device_count() if npu is not None else 0
        return n, f"{n} visible NPU(s), one process each"
    import psutil

    cores = usable_cores()
    avail = psutil.virtual_memory().available
    by_mem = int(avail // (WORKER_RSS_BYTES + max(0, bytes_per_rank)))
    n = max(2, min(GLOO_MAX_WORLD, GLOO_RANKS_PER_CORE * cores, by_mem))
    return n, (f"gloo limit: {GLOO_RANKS_PER_CORE} ranks per usable core x {cores} cores, "
               f"{avail / 2**30:.1f} GiB available at {(WORKER_RSS_BYTES + bytes_per_rank) / 2**30:.2f} GiB "
               f"per rank, at most {GLOO_MAX_WORLD}")


def check_world_size(world_size: int, backend: str, *, bytes_per_rank: int = 0) -> None:
    """Raise ParameterError if ``world_size`` ranks of ``backend`` cannot run here (see :func:`max_world_size`)."""
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ParameterError(f"world_size={world_size!r} (--world-size) must be an integer >= 1.")
    n, why = max_world_size(backend, bytes_per_rank=bytes_per_rank)
    if world_size > n:
        raise ParameterError(f"world_size={world_size} is larger than what can run here with {backend}: "
                             f"at most {n} ({why}); lower world_size (--world-size) or run on more devices/nodes.")


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True if a TCP socket can be bound to ``host:port`` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def check_port(port: int) -> None:
    """Raise ParameterError if the explicit rendezvous ``port`` cannot be bound on 127.0.0.1."""
    if not 1 <= port <= 65535:
        raise ParameterError(f"master_port={port} (--master-port) is outside 1-65535; use 0 to pick a free port.")
    if not port_is_free(port):
        raise ParameterError(f"master_port={port} is already in use on 127.0.0.1 (another job, or a process group "
                             "left open); use master_port=0 (--master-port 0) to pick a free port, or stop the process holding it "
                             f"(e.g. `ss -ltnp 'sport = :{port}'`).")


def _descendants(pid: int) -> list:
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def kill_tree(proc: subprocess.Popen, *, grace_s: float = 3.0) -> None:
    """Stop ``proc`` and every process under it: SIGTERM, then SIGKILL after ``grace_s``.

    The tree is listed before anything is signalled, since torchrun's workers
    run in sessions of their own and lose their parent once torchrun dies.
    """
    import psutil

    procs = _descendants(proc.pid)
    try:
        procs.insert(0, psutil.Process(proc.pid))
    except psutil.Error:
        pass
    stop_processes(procs, grace_s=grace_s)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL was sent
        pass


_ROOT_CAUSE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


def failed_rank(log_text: str) -> tuple[int, int] | None:
    """(rank, exit code) of the first failure torchrun reported in ``log_text``, or None."""
    root = log_text.rfind("Root Cause")
    m = _ROOT_CAUSE.search(log_text, root if root >= 0 else 0)
    return (int(m.group(1)), int(m.group(2))) if m else None


def rank_log_tail(rank_logs: str | Path, local_rank: int, *, lines: int = 20) -> str:
    """The last ``lines`` lines a rank wrote to stderr (its stdout when stderr is empty), from torchrun's log folder.

    Parameters
    ----------
    rank_logs : path
        The ``--log-dir`` given to torchrun; the files are
        ``<run id>/attempt_<k>/<local_rank>/std{err,out}.log`` (torch 2.13,
        ``torch.distributed.elastic.multiprocessing``).
    local_rank : int

    Returns
    -------
    str
        Empty when the rank wrote nothing or no log exists.
    """
    root = Path(rank_logs)
    for stream in ("stderr.log", "stdout.log"):
        files = sorted(root.glob(f"*/attempt_*/{int(local_rank)}/{stream}"), key=lambda p: p.stat().st_mtime)
        if files:
            text = files[-1].read_text(errors="replace").strip()
            if text:
                return "\n".join(text.splitlines()[-lines:])
    return ""


def keep_logs(out: Path, log_dir: str | Path | None, task: str) -> Path | None:
    """Copy ``torchrun.log`` and the per-rank logs of a failed job out of ``out`` to a folder that survives it.

    Parameters
    ----------
    out : Path
        The job's output folder (holds ``torchrun.log`` and ``ranks/``).
    log_dir : path, optional
        Where to keep them: ``log_dir/comm_<task>_<time>``; None: a new
        temporary folder that is not removed.

    Returns
    -------
    Path or None
        The folder written, or None when nothing could be copied (the reason is logged).
    """
    task = task.rpartition(":")[2] or task  # a module:function task is named by its function
    try:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        if log_dir is None:
            dest = Path(tempfile.mkdtemp(prefix=f"comm_{task}_failed_"))
        else:
            dest = Path(log_dir) / f"comm_{task}_{stamp}"
            dest.mkdir(parents=True, exist_ok=True)
        for name in ("torchrun.log", "config.json"):
            if (out / name).is_file():
                shutil.copy2(out / name, dest / name)
        for err in out.glob("error_rank*.json"):
            shutil.copy2(err, dest / err.name)
        if (out / "ranks").is_dir():
            shutil.copytree(out / "ranks", dest / "ranks", dirs_exist_ok=True)
        return dest
    except OSError as exc:
        log.warning("could not keep the logs of the failed %s job: %s", task, exc)
        return None


def _advice(kept: Path | None, rank_tail: str, who: int | None) -> str:
    parts = []
    if rank_tail:
        parts.append(f"Last lines of rank {who}'s own output:\n{rank_tail}")
    parts.append("What to do: rerun (a rank killed once by a loaded machine usually passes); if it fails again, "
                 "lower world_size (--world-size), the steps or the largest size (--max-size-mib), or raise "
                 "timeout_s (--timeout)")
    if kept is not None:
        parts.append(f"Full logs (torchrun.log, ranks/*/std*.log): {kept}")
    return "\n".join(parts)


def run_job(task: str, config: Mapping[str, Any], *, world_size: int = 2, backend: str = "auto",
            device_kind: str | None = None, timeout_s: float = 300.0, master_port: int = 0,
            out_dir: str | Path | None = None, bytes_per_rank: int = 0,
            env: Mapping[str, str] | None = None, log_dir: str | Path | None = None) -> JobResult:
    """Run ``helpers.comm.worker --task task`` on ``world_size`` ranks under torchrun and return rank 0's JSON.

    Parameters
    ----------
    task : str
        A task of :mod:`helpers.comm.worker`: ``allreduce``, a self-test, or ``module:function``
        (e.g. ``helpers.experiments.collectives:run_ddp``).
    config : mapping
        JSON-able settings handed to the task.
    world_size : int
        Ranks (processes) on this machine.
    backend : {"auto", "gloo", "nccl", "hccl"}
    device_kind : str, optional
        Device kind for "auto" (default: the backend follows torch's best device).
    timeout_s : float
        Seconds before the job counts as hung; it is then killed with all its processes.
    master_port : int
        0: torchrun's standalone rendezvous on a free port; else this port on
        127.0.0.1 (checked before launch).
    out_dir : path, optional
        Folder for the JSON files (default: a new temporary folder, removed afterwards).
    bytes_per_rank : int
        Memory each rank needs beyond the interpreter, for the world-size check.
    env : mapping, optional
        Extra environment variables for the job (e.g. a validated HCCL set).
    log_dir : path, optional
        Where the logs of a failed or timed-out job are kept
        (``log_dir/comm_<task>_<time>/``: torchrun.log and each rank's
        stdout/stderr); default: a new temporary folder that is not removed.

    Returns
    -------
    JobResult

    Raises
    ------
    ParameterError
        Bad world size, task config or port (before anything starts), or a
        rank rejected its config.
    DataError
        A rank could not load its dataset.
    DeviceUnavailableError
        Backend unavailable (before anything starts).
    TimeoutError
        The job ran longer than ``timeout_s`` (it is killed first); the message
        says where the logs were kept.
    RuntimeError
        A rank failed: the message names the rank, its exit code, its error
        and the last lines of its own stderr, and where the logs were kept.
    """
    if device_kind is None:
        device_kind = get_accelerator("auto").kind
    be = resolve_backend(backend, device_kind)
    if not isinstance(timeout_s, (int, float)) or timeout_s <= 0:
        raise ParameterError(f"timeout_s={timeout_s!r} (--timeout) must be a positive number of seconds.")
    check_backend(be)
    check_world_size(world_size, be, bytes_per_rank=bytes_per_rank)
    if master_port:
        check_port(master_port)
    tmp = None
    if out_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="comm_job_")
        out = Path(tmp.name)
    else:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
    try:
        for stale in list(out.glob("error_rank*.json")) + [out / "result.json"]:
            stale.unlink(missing_ok=True)
        shutil.rmtree(out / "ranks", ignore_errors=True)
        cfg_path = out / "config.json"
        cfg_path.write_text(json.dumps(dict(config)))
        rdzv = (["--standalone"] if not master_port else
                ["--nnodes", "1", "--node-rank", "0", "--master-addr", "127.0.0.1", "--master-port", str(master_port)])
        cmd = [sys.executable, "-m", "torch.distributed.run", *rdzv, "--nproc-per-node", str(world_size),
               "--monitor-interval", "0.2", "--log-dir", str(out / "ranks"), "--tee", "3",
               "-m", "helpers.comm.worker", "--task", task, "--backend", be,
               "--config", str(cfg_path), "--out", str(out)]
        job_env = dict(os.environ)
        job_env.update(env or {})
        job_env.setdefault("OMP_NUM_THREADS", "1")
        log_path = out / "torchrun.log"
        t0 = time.perf_counter()
        with open(log_path, "wb") as logf:
            proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=job_env,
                                    start_new_session=True, preexec_fn=die_with_parent)  # torchrun dies with us
            record = register_child(proc.pid, role="torchrun")  # and a resumed run ends it if it did not
            try:
                rc = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                kill_tree(proc)
                kept = keep_logs(out, log_dir, task)
                raise TimeoutError(f"collective job {task!r} ({be}, world_size={world_size}) did not finish "
                                   f"within timeout_s={timeout_s:g} s (--timeout) and was stopped with all its "
                                   "processes; a peer may be stuck or the job is too large: raise timeout_s "
                                   "(--timeout) or shrink the job (--world-size, --max-size-mib, steps)."
                                   + (f" Logs: {kept}" if kept is not None else "")) from None
            except BaseException:
                kill_tree(proc)
                raise
            finally:
                for p in _descendants(proc.pid):  # nothing may outlive the job
                    p.kill()
                unregister_child(record)
        wall = time.perf_counter() - t0
        text = log_path.read_text(errors="replace")
        tail = "\n".join(text.splitlines()[-40:])
        errors = sorted(out.glob("error_rank*.json"))
        if rc != 0 or errors:
            detail = ""
            if errors:
                e = json.loads(errors[0].read_text())
                detail = f"rank {e.get('rank')} raised {e.get('type')}: {e.get('message')}"
                if e.get("type") == "DataError":
                    raise DataError(f"collective job {task!r} could not load its data: {detail}")
                if e.get("type") == "ParameterError":
                    raise ParameterError(f"collective job {task!r} rejected its input: {detail}")
            fr = failed_rank(text)
            who = f"rank {fr[0]} exited with code {fr[1]}" if fr else f"torchrun exited with code {rc}"
            if fr and fr[1] < 0:
                try:
                    who += f" ({signal.Signals(-fr[1]).name})"
                except ValueError:
                    pass
            bad = fr[0] if fr else (json.loads(errors[0].read_text()).get("rank") if errors else None)
            # single node: local rank == rank
            rank_tail = rank_log_tail(out / "ranks", bad) if bad is not None else ""
            kept = keep_logs(out, log_dir, task)
            raise RuntimeError(f"collective job {task!r} ({be}, world_size={world_size}) failed: {who}"
                               f"{'; ' + detail if detail else ''}. The other ranks were stopped.\n"
                               f"{_advice(kept, rank_tail, bad)}\n"
                               f"Last lines of torchrun's log:\n{tail}")
        res = out / "result.json"
        if not res.is_file():
            raise RuntimeError(f"collective job {task!r} finished but rank 0 wrote no result.json. "
                               f"Last output:\n{tail}")
        return JobResult(data=json.loads(res.read_text()), backend=be, world_size=world_size,
                         wall_s=wall, log_tail=tail)
    finally:
        if tmp is not None:
            tmp.cleanup()
