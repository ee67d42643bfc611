"""Who this rank is, and small JSON payloads gathered from every rank onto rank 0, with a timeout.

A rank's identity comes from the variables its launcher sets: torchrun (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` and ``GROUP_RANK``, the node's rank among the launches), SLURM
(``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``, ``SLURM_NODEID``, read where ``RANK`` is not set),
DeepSpeed's launcher (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and the node's rank as ``CROSS_RANK``:
``deepspeed/launcher/launch.py``) and others that set ``RANK`` / ``WORLD_SIZE`` with ``NODE_RANK``. The
node is named by its node rank and the host name together: two launches on one machine (the multi-node test)
share a host name but not a node rank.

:func:`gather_to_root` brings one JSON payload per rank to rank 0. Two transports:

- the job's process group, when ``torch.distributed`` is initialized: each rank writes its payload into the
  group's key-value store (``set``), and rank 0 polls for the others' keys (``check``) until the timeout. No
  collective is called, so a rank that died or never reports cannot hang rank 0 (a collective would wait for
  it until the group's timeout, 30 minutes by default);
- otherwise a folder: each rank writes ``<key>.rank<N>.json`` (atomically: a temporary file, then a rename),
  rank 0 polls the folder. This works before ``init_process_group`` and with no group at all; across machines
  the folder must be shared by them (NFS, a cluster file system).

Rank 0 gets a :class:`Gathered`: the payloads found and the ranks missing at the timeout; the other ranks get
None and do not wait. Under torchrun a rank that dies makes the launcher stop the others with SIGTERM: while
rank 0 waits, that signal ends the wait instead, so that rank 0 can report the ranks present before it ends
(:func:`resume_signal`). This module imports torch only inside :func:`gather_to_root`, and knows nothing of what
the payloads hold.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from helpers.errors import ParameterError

__all__ = ["DEFAULT_TIMEOUT_S", "STALE_S", "Gathered", "RankIdentity", "check_folder", "gather_to_root", "job_key",
           "resume_signal"]

#: How long rank 0 waits for the other ranks' payloads by default, seconds: ranks of a synchronous job reach the
#: end of their loop within a step of each other, so a minute is long for them and short for a person waiting.
DEFAULT_TIMEOUT_S = 60.0
#: A file payload whose rank started more than this many seconds before or after rank 0 is from another job
#: (an earlier launch with the same key: static rendezvous reuses MASTER_PORT 29500 and run id "none"), and is
#: ignored: the ranks of one job are started together, within seconds, once the rendezvous completes.
STALE_S = 30.0


def _int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ParameterError(f"environment variable {name}={raw!r} is not an integer; the launcher sets it to this "
                             "rank's number (unset it, or launch with torchrun / srun)") from None


@dataclass(frozen=True)
class RankIdentity:
    """This process's place in a multi-rank job.

    Attributes
    ----------
    rank, world_size : int
        Global rank in [0, world_size); world_size 1 for a process not started by a launcher.
    local_rank : int
        Rank on its node.
    node_rank : int or None
        The node's rank among the job's nodes (torchrun's ``GROUP_RANK``, SLURM's ``SLURM_NODEID``,
        DeepSpeed's ``CROSS_RANK``, ``NODE_RANK``); None when the launcher says nothing.
    host : str
        The host name.
    source : str
        Which launcher's variables were read: "torchrun", "slurm", "deepspeed", "env" or "none".
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    node_rank: int | None = None
    host: str = ""
    source: str = "none"

    @property
    def node(self) -> str:
        """How reports name the node: ``"1 (host)"``, or the host alone when no node rank is known."""
        return f"{self.node_rank} ({self.host})" if self.node_rank is not None else self.host

    @property
    def label(self) -> str:
        """``"rank 2 (node 1 (host))"``."""
        return f"rank {self.rank} (node {self.node})"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "RankIdentity":
        """Read the launcher's variables (see the module notes).

        Raises
        ------
        ParameterError
            A variable that is not an integer, a world size < 1, or a rank outside [0, world size).
        """
        env = os.environ if environ is None else environ
        host = socket.gethostname()
        if env.get("RANK") not in (None, ""):
            rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE")
            local = _int(env, "LOCAL_RANK")
            node = _int(env, "GROUP_RANK")
            source = "torchrun" if "TORCHELASTIC_RUN_ID" in env or node is not None else "env"
            if node is None and env.get("CROSS_RANK") not in (None, ""):
                node, source = _int(env, "CROSS_RANK"), "deepspeed"
            if node is None:
                node = _int(env, "NODE_RANK")
            if node is None:
                node = _int(env, "SLURM_NODEID")
            names = ("RANK", "WORLD_SIZE")
        elif env.get("SLURM_PROCID") not in (None, "") and env.get("SLURM_NTASKS") not in (None, ""):
            rank, world = _int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS")
            local, node, source = _int(env, "SLURM_LOCALID"), _int(env, "SLURM_NODEID"), "slurm"
            names = ("SLURM_PROCID", "SLURM_NTASKS")
        else:
            return cls(host=host)
        if world is None:
            raise ParameterError(f"{names[0]} is set but {names[1]} is not: a launcher sets both; set "
                                 f"{names[1]} to the number of ranks, or unset {names[0]}")
        if world < 1 or not 0 <= rank < world:
            raise ParameterError(f"{names[0]}={rank} and {names[1]}={world}: the world size must be >= 1 and the "
                                 "rank in [0, world size)")
        return cls(rank=rank, world_size=world, local_rank=local if local is not None else 0, node_rank=node,
                   host=host, source=source)


def job_key(environ: Mapping[str, str] | None = None) -> str:
    """A name shared by the ranks of one launch and no other: torchrun's run id, restart count, and the
    rendezvous' address and port (SLURM: the job and step ids). Safe as a file name."""
    env = os.environ if environ is None else environ
    parts = [env.get("TORCHELASTIC_RUN_ID", ""), env.get("TORCHELASTIC_RESTART_COUNT", ""),
             env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", ""), env.get("SLURM_JOB_ID", ""),
             env.get("SLURM_STEP_ID", "")]
    raw = "-".join(p for p in parts if p) or "job"
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in raw)


def check_folder(folder: Path) -> Path:
    """Make ``folder`` (and its parents) and check that a file can be written there.

    Raises
    ------
    ParameterError
        The folder cannot be made, or a file cannot be written in it.
    """
    folder = Path(folder)
    probe = folder / f".write-test-{os.getpid()}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise ParameterError(f"rendezvous folder {folder}: cannot write there ({exc.strerror or exc}); name a "
                             "writable folder shared by every rank (gather_dir=..., or the environment variable "
                             "WORKBOOK_GATHER_DIR)") from None
    return folder


@dataclass(frozen=True)
class Gathered:
    """What rank 0 received.

    Attributes
    ----------
    payloads : dict of int to dict
        Rank -> its payload, rank 0's own included.
    missing : tuple of int
        Ranks whose payload had not arrived at the timeout (died, stopped before reporting, or still running).
    world_size : int
    transport : str
        "process group" or "folder <path>".
    waited_s : float
        Seconds rank 0 waited.
    stopped_by : str
        "SIGTERM" when the launcher stopped rank 0 while it waited (torchrun ends the remaining ranks with
        SIGTERM as soon as one fails): the payloads are what had arrived, and the caller should report them and
        then end as the launcher asked (:func:`resume_signal`); "" otherwise.
    """

    payloads: Mapping[int, Mapping[str, Any]]
    missing: tuple[int, ...]
    world_size: int
    transport: str
    waited_s: float
    stopped_by: str = ""


def resume_signal(got: "Gathered | None") -> None:
    """End this process as the launcher asked when rank 0's wait was stopped by it (``got.stopped_by``); a no-op
    otherwise. Call it after reporting what had arrived."""
    if got is not None and got.stopped_by == "SIGTERM":
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.raise_signal(signal.SIGTERM)


@contextmanager
def _sigterm_stops(flag: list):
    """While rank 0 waits: SIGTERM (torchrun's stop after another rank failed) ends the wait instead of the
    process, so that what arrived is reported; the previous handler is restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda *_: flag.append("SIGTERM"))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _group_store():
    """The default process group's key-value store, or None when no group is initialized."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    # torch.distributed has no public accessor for the default group's store; this one is what
    # torch.distributed.elastic and torch's own tests use (torch/distributed/distributed_c10d.py).
    return dist.distributed_c10d._get_default_store()


def gather_to_root(payload: Mapping[str, Any], identity: RankIdentity, *, name: str, folder: Path | None = None,
                   timeout_s: float = DEFAULT_TIMEOUT_S, started_at: float | None = None,
                   poll_s: float = 0.05) -> Gathered | None:
    """Send this rank's ``payload`` to rank 0; on rank 0 wait for the others' and return them all.

    Parameters
    ----------
    payload : mapping
        JSON types only (numbers, strings, lists, dicts).
    identity : RankIdentity
        This rank (:meth:`RankIdentity.from_env`).
    name : str
        Names this gather among others of the same job (e.g. "instrument-3": the third report of the loop),
        letters, digits, "-", "_" and "." only.
    folder : path or None
        Where the file transport writes; used when no process group is initialized (then required, and
        checked with :func:`check_folder`).
    timeout_s : float
        How long rank 0 waits for the missing ranks, seconds, > 0.
    started_at : float or None
        When this rank started (``time.time()``); file payloads of ranks started more than :data:`STALE_S`
        away from rank 0 are another job's and ignored. None: now.
    poll_s : float
        Rank 0's polling interval, seconds.

    Returns
    -------
    Gathered on rank 0; None on the other ranks (they return as soon as their payload is written).

    Raises
    ------
    ParameterError
        A payload that is not JSON, a bad ``name`` or ``timeout_s``, no folder where one is needed, or a
        folder that cannot be written.
    """
    if not (isinstance(timeout_s, (int, float)) and not isinstance(timeout_s, bool) and timeout_s > 0):
        raise ParameterError(f"gather timeout_s must be a positive number of seconds, got {timeout_s!r}")
    if not name or any(not (c.isalnum() or c in "-_.") for c in name):
        raise ParameterError(f"gather name {name!r} must be letters, digits, '-', '_' or '.'")
    started = time.time() if started_at is None else float(started_at)
    try:
        body = json.dumps({"rank": identity.rank, "started_at": started, "payload": payload}, allow_nan=True)
    except (TypeError, ValueError) as exc:
        raise ParameterError(f"gather payload of rank {identity.rank} is not JSON: {exc}") from None
    world, me = identity.world_size, identity.rank
    t0 = time.monotonic()
    stopped: list[str] = []
    store = _group_store()
    if store is not None:
        gathered = _gather_by_store(store, body, payload, name=name, me=me, world=world, t0=t0,
                                    timeout_s=timeout_s, poll_s=poll_s, stopped=stopped)
    else:
        gathered = _gather_by_folder(folder, body, payload, name=name, me=me, started=started, world=world, t0=t0,
                                     timeout_s=timeout_s, poll_s=poll_s, stopped=stopped)
    if gathered is None:  # not rank 0: its payload is sent, it does not wait
        return None
    got, transport = gathered
    missing = tuple(r for r in range(world) if r not in got)
    return Gathered(payloads=got, missing=missing, world_size=world, transport=transport,
                    waited_s=time.monotonic() - t0, stopped_by=stopped[0] if stopped else "")


def _poll(payload: Mapping[str, Any], read: Callable[[int], Mapping[str, Any] | None], *, world: int, t0: float,
          timeout_s: float, poll_s: float, stopped: list[str]) -> dict[int, Mapping[str, Any]]:
    """Rank 0's wait: ``read(r)`` every ``poll_s`` s for each rank not yet in, until all ``world`` are, the
    ``timeout_s`` since ``t0`` (monotonic s) has passed, or a SIGTERM came (``stopped``); rank 0's own ``payload``
    is in from the start."""
    got: dict[int, Mapping[str, Any]] = {0: dict(payload)}
    with _sigterm_stops(stopped):
        while True:
            for r in range(1, world):
                if r not in got and (body := read(r)) is not None:
                    got[r] = body
            if len(got) == world or time.monotonic() - t0 >= timeout_s or stopped:
                return got
            time.sleep(poll_s)


def _gather_by_store(store: Any, body: str, payload: Mapping[str, Any], *, name: str, me: int, world: int,
                     t0: float, timeout_s: float, poll_s: float,
                     stopped: list[str]) -> tuple[dict[int, Mapping[str, Any]], str] | None:
    """:func:`gather_to_root` through the process group's store: None off rank 0, else (payloads, transport)."""
    prefix = f"helpers-gather/{name}/"
    store.set(f"{prefix}{me}", body)
    if me != 0:
        return None
    def read(r: int) -> Mapping[str, Any] | None:
        return json.loads(store.get(f"{prefix}{r}"))["payload"] if store.check([f"{prefix}{r}"]) else None

    got = _poll(payload, read, world=world, t0=t0, timeout_s=timeout_s, poll_s=poll_s, stopped=stopped)
    for r in got:
        try:
            store.delete_key(f"{prefix}{r}")
        except (RuntimeError, AttributeError):  # a store without delete (FileStore on old torch): left there
            pass
    return got, "process group"


def _gather_by_folder(folder: Path | None, body: str, payload: Mapping[str, Any], *, name: str, me: int,
                      started: float, world: int, t0: float, timeout_s: float, poll_s: float,
                      stopped: list[str]) -> tuple[dict[int, Mapping[str, Any]], str] | None:
    """:func:`gather_to_root` through files in ``folder``: None off rank 0, else (payloads, transport)."""
    if folder is None:
        raise ParameterError("gather: no process group is initialized and no rendezvous folder was named; "
                             "name a folder every rank can write (gather_dir=...)")
    folder = check_folder(Path(folder))
    path = folder / f"{name}.rank{me}.json"
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    try:
        tmp.write_text(body)
        os.replace(tmp, path)
    except OSError as exc:
        raise ParameterError(f"rendezvous folder {folder}: cannot write {path.name} ({exc.strerror or exc}); "
                             "name a writable folder shared by every rank") from None
    if me != 0:
        return None
    def read(r: int) -> Mapping[str, Any] | None:
        try:
            rec = json.loads((folder / f"{name}.rank{r}.json").read_text())
        except (OSError, ValueError):  # not there yet (a rename is atomic: never half a file)
            return None
        return rec["payload"] if abs(float(rec.get("started_at", 0.0)) - started) <= STALE_S else None

    got = _poll(payload, read, world=world, t0=t0, timeout_s=timeout_s, poll_s=poll_s, stopped=stopped)
    for r in got:
        try:
            (folder / f"{name}.rank{r}.json").unlink()
        except OSError:
            pass
    return got, f"folder {folder}"
