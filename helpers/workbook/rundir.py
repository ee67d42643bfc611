"""A run folder: its state (``run.json``), its results file, its lock, and what a full disk does to it.

A run folder holds the executed notebooks, ``results.jsonl`` (every record the notebooks appended), ``run.json``
(status, duration and error of each notebook, rewritten after each one: :class:`RunState`) and ``report.html`` /
``report.md``. One runner at a time writes it (:func:`lock_run_dir`); a full disk stops the run with a
:class:`DiskFullError` that keeps what was written.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import json
import logging
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

try:  # POSIX advisory locks for the run folder (lock_run_dir); absent on Windows
    import fcntl
except ImportError:  # pragma: no cover - not a POSIX system
    fcntl = None

from helpers.errors import OutputDirError, ParameterError
from helpers.fsutil import ensure_writable_dir, write_atomic
from helpers.process import cli_command
from helpers.workbook.paths import runs_dir

log = logging.getLogger(__name__)

RUN_FILE = "run.json"
RESULTS_FILE = "results.jsonl"


@dataclass
class NotebookRun:
    """Status of one notebook in a run (an entry of run.json)."""

    id: str
    input: str
    output: str
    parameters: dict
    status: str = "pending"  # pending | running | ok | failed | interrupted | skipped
    duration_s: float | None = None
    error: dict | None = None
    not_applicable: str | None = None  # why the notebook does not run on the user's job (recorded, not executed)


@dataclass
class RunState:
    """The content of run.json."""

    run_dir: str
    profile: str
    device: str
    resolved_device: str | None
    only: list
    started: str
    status: str = "running"  # running | ok | failed | interrupted
    job: str | None = None  # the user's job spec; None: the built-in PPO job
    data_dir: str | None = None  # --data-dir; None: the embedded photos
    overrides: list = field(default_factory=list)  # the -p NAME VALUE pairs, as given
    duration_s: float | None = None
    notebooks: list = field(default_factory=list)
    error: str | None = None  # why the run stopped before its notebooks were done (e.g. a full disk)

    def save(self, run_dir: Path) -> None:
        """Write run.json atomically (:func:`helpers.fsutil.write_atomic`: the last good copy survives a full disk)."""
        write_atomic(run_dir / RUN_FILE, json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, run_dir: Path) -> "RunState":
        """Read run.json of ``run_dir``."""
        data = json.loads((run_dir / RUN_FILE).read_text())
        nbs = [NotebookRun(**n) for n in data.pop("notebooks", [])]
        return cls(notebooks=nbs, **data)


def new_run_dir(profile: str, device: str) -> Path:
    """Return a new, not yet existing run folder under runs/."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = runs_dir() / f"{stamp}-{Path(profile).stem}-{device}"  # a profile file by its name
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def latest_run_dir() -> Path | None:
    """Return the most recently started run folder (one with run.json), if any."""
    root = runs_dir()
    if not root.is_dir():
        return None
    cands = [p for p in root.iterdir() if (p / RUN_FILE).is_file()]
    return max(cands, key=lambda p: (p / RUN_FILE).stat().st_mtime, default=None)


def prepare_dir(path: Path) -> Path:
    """Create the run folder ``path`` if needed and check that it is writable; return it.

    Raises
    ------
    OutputDirError
        If it cannot be created or written (:func:`helpers.fsutil.ensure_writable_dir`).
    """
    return ensure_writable_dir(path, what="run folder", hint="pass a writable folder with --out")


def drop_records(results: Path, notebook: str) -> int:
    """Remove the records of ``notebook`` from a results file (before rerunning it).

    Returns the number of lines removed. Lines that are not valid JSON (an
    interrupted write) are removed too.
    """
    if not results.is_file():
        return 0
    keep, dropped = [], 0
    for line in results.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            dropped += 1
            continue
        if rec.get("notebook") == notebook:
            dropped += 1
        else:
            keep.append(line)
    write_atomic(results, "".join(k + "\n" for k in keep))
    return dropped


#: The advisory lock a runner holds on its run folder for the run's life (see :func:`lock_run_dir`).
LOCK_FILE = ".runner.lock"


def lock_run_dir(run_dir: Path):
    """Take the run folder's lock, so that one runner at a time writes it; return the open lock file.

    The lock is an exclusive ``fcntl.flock`` on ``<run folder>/.runner.lock``, held while the returned file
    is open. The kernel drops it when the holder exits in any way (kill -9 included), so a lock left by a
    killed runner is no lock: the next runner takes it over. The file names the holder (pid, start time).

    Raises
    ------
    ParameterError
        If another live runner holds the folder; the message names its process.
    """
    path = Path(run_dir) / LOCK_FILE
    handle = open(path, "a+")
    if fcntl is None:  # not a POSIX system: no advisory locks; say so once per run
        log.warning("no file locking on this system: make sure one runner at a time uses %s", run_dir)
        return handle
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise ParameterError(f"{run_dir} is in use by another runner ({holder}); wait for it to finish, or "
                             "choose another folder with --out") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()}, started {_dt.datetime.now(_dt.timezone.utc).isoformat(timespec='seconds')}")
    handle.flush()
    return handle


#: Folder of a run where torchrun and its ranks register themselves while they run (see helpers.process).
CHILDREN_DIR = ".children"


class DiskFullError(OutputDirError):
    """The run folder's file system is full: the run stops, keeping what was written."""


def is_disk_full(exc: BaseException) -> bool:
    """True when ``exc`` (or its cause or context) is ENOSPC/EDQUOT, or a kernel's error saying so."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(exc) or "Disk quota exceeded" in str(exc):
            return True  # raised in the kernel, reported to the runner as text
        exc = exc.__cause__ or exc.__context__
    return False


def disk_full_error(run_dir: Path, exc: BaseException) -> DiskFullError:
    """The :class:`DiskFullError` for ``exc`` met in ``run_dir``: the free space, the error, how to resume."""
    try:
        free = shutil.disk_usage(run_dir).free
        room = f"{free / 2**20:,.1f} MiB free"
    except OSError:
        room = "free space unknown"
    ename, evalue = getattr(exc, "ename", None), getattr(exc, "evalue", None)  # a kernel's error (papermill)
    what = f"{ename}: {evalue}" if ename and evalue else f"{type(exc).__name__}: {exc}"
    what = " ".join(what.split())[:200]
    return DiskFullError(
        f"the disk of the run folder {run_dir} is full ({room}): {what}. What was "
        f"written is kept; free some space (or pass --out on another disk) and continue with: "
        f"{cli_command()} run --resume --out {run_dir}")


@contextlib.contextmanager
def full_disk_stops(run_dir: Path):
    """Turn a full disk met inside the block into a :class:`DiskFullError` (other errors pass unchanged)."""
    try:
        yield
    except OSError as exc:
        if is_disk_full(exc):
            raise disk_full_error(run_dir, exc) from exc
        raise


def save_state(state: "RunState", run_dir: Path) -> None:
    """``state.save`` with a full disk turned into a :class:`DiskFullError` (run.json keeps its last good copy)."""
    with full_disk_stops(run_dir):
        state.save(run_dir)


def saved_status(run_dir: Path) -> str:
    """The status run.json holds on disk ("unknown" when it cannot be read)."""
    try:
        return str(json.loads((run_dir / RUN_FILE).read_text()).get("status", "unknown"))
    except (OSError, ValueError, AttributeError):
        return "unknown"


def record_not_applicable(run_dir: Path, nb: NotebookRun) -> None:
    """Write a notebook's "not applicable" verdict for the user's job into the run's results."""
    from helpers.results import ResultsStore
    from helpers.verdict import Verdict

    store = ResultsStore(run_dir / RESULTS_FILE, notebook=nb.id, parameters=nb.parameters)
    store.add_verdict(Verdict(notebook=nb.id, metric="not measured", value=None, unit="",
                              recommendation="not applicable", reason=str(nb.not_applicable),
                              context=f"your job: {nb.parameters.get('job', '')}"))

