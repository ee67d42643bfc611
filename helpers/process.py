"""Child processes that die with their parent (Linux ``prctl(PR_SET_PDEATHSIG)``).

A runner or kernel killed with SIGKILL gets no chance to stop what it started; torchrun and its ranks would
live on under PID 1, holding ports, memory and devices. Each such child asks the kernel to SIGKILL it when
its parent exits (:func:`die_with_parent`). Part of the foundation: imports only the standard library (psutil
only inside the registry functions), so that a rank can call :func:`die_with_parent` before importing torch.

As a second net, for what outlives its parent anyway (a child whose parent is not the runner's tree, a
non-Linux system): children register themselves in the run folder (:func:`register_child`), and a resumed
run ends those still alive (:func:`end_stale_children`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Iterator

__all__ = ["die_with_parent", "stop_processes", "CHILDREN_DIR_ENV", "register_child", "unregister_child",
           "end_stale_children", "cli_command", "terminate_like_interrupt"]


def _sigterm_as_interrupt(signum, frame) -> None:
    """SIGTERM (a scheduler, ``kill``, a container stop) stops the work as Ctrl-C does."""
    raise KeyboardInterrupt(f"signal {signum} (SIGTERM)")


@contextlib.contextmanager
def terminate_like_interrupt() -> Iterator[None]:
    """While the block runs, SIGTERM raises KeyboardInterrupt, so that it ends the work as Ctrl-C does: what the
    block's ``finally`` clauses stop and put back (child process groups, the user's files) is stopped and put back.
    Main thread only (elsewhere the block runs as it is); the previous handler is restored afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def cli_command() -> str:
    """The workbook's command line as a fresh shell can run it: this interpreter's absolute path, ``-m helpers``.

    A report or an error message is read later, from another shell, where ``python`` may be the system's
    (without the workbook's packages); the interpreter that wrote it (e.g. the checkout's ``.venv/bin/python``)
    is the one that has them.
    """
    exe = sys.executable or "python"
    return f"{exe} -m helpers"

#: prctl(2) option that asks the kernel to signal a process when its parent exits (Linux <sys/prctl.h>).
_PR_SET_PDEATHSIG = 1


def _parent_cmdline() -> str:
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def die_with_parent(*, parent_must_contain: str | None = None) -> None:
    """Ask the kernel to SIGKILL this process when its parent exits, however the parent exits (kill -9 too).

    Parameters
    ----------
    parent_must_contain : str, optional
        Text the parent's command line holds when the parent is the one expected (e.g. ``"torch.distributed"``
        for a rank). A process whose parent died before this call was reparented already and would never get
        the signal: when the parent does not match, this process exits at once (status 1).

    Notes
    -----
    Linux only; elsewhere a no-op. A failing ``prctl`` is ignored: this is a safety net.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes  # only here: the standard library's, on Linux

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):  # no libc or no prctl: nothing to do
        return
    if parent_must_contain and parent_must_contain not in _parent_cmdline():
        os._exit(1)  # the parent is already gone: nobody is left to wait for this process


def stop_processes(procs, *, grace_s: float = 3.0) -> None:
    """SIGTERM every process of ``procs`` (``psutil.Process`` objects), then SIGKILL those alive after ``grace_s``.

    Processes that are already gone are skipped; returns once all have exited or ``2 x grace_s`` passed.
    """
    import psutil

    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace_s)


# --------------------------------------------------------------------------- stale children of an earlier run

#: Environment variable naming the folder where long-lived children (torchrun, its ranks) register
#: themselves; the runner sets it to ``<run folder>/.children`` so that a resumed run can end what an
#: earlier, killed run left behind (:func:`end_stale_children`).
CHILDREN_DIR_ENV = "WORKBOOK_CHILDREN_DIR"


def _create_time(pid: int) -> float | None:
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def register_child(pid: int | None = None, *, role: str = "") -> str | None:
    """Record a child process in ``$WORKBOOK_CHILDREN_DIR`` (no-op when the variable is unset).

    Parameters
    ----------
    pid : int, optional
        The process; default this one.
    role : str
        What it is ("torchrun", "rank 1"), for the message that ends it.

    Returns
    -------
    str or None
        The record's path, to pass to :func:`unregister_child` when the process ends normally.
    """
    import json

    folder = os.environ.get(CHILDREN_DIR_ENV, "").strip()
    if not folder:
        return None
    pid = os.getpid() if pid is None else int(pid)
    created = _create_time(pid)
    if created is None:
        return None
    try:
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{pid}.json")
        with open(path, "w") as f:
            json.dump({"pid": pid, "create_time": created, "role": role}, f)
        return path
    except OSError:  # a safety net: never fail the job for it
        return None


def unregister_child(path: str | None) -> None:
    """Remove a record made by :func:`register_child` (its process ended normally)."""
    if path:
        try:
            os.unlink(path)
        except OSError:
            pass


def end_stale_children(folder: str | os.PathLike, *, grace_s: float = 3.0) -> list[str]:
    """End the registered children of an earlier run that are still alive; return what was ended.

    A record whose process is gone, or whose PID now belongs to another
    process (its start time differs), is removed without touching anything.
    A live one is sent SIGTERM, then SIGKILL after ``grace_s``, with the
    processes under it.

    Parameters
    ----------
    folder : str or os.PathLike
        The children folder (``<run folder>/.children``); a missing folder ends nothing.
    grace_s : float, default 3.0

    Returns
    -------
    list of str
        One line per process ended, e.g. ``"torchrun (pid 4242)"``.
    """
    import json

    import psutil

    ended, procs = [], []
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    for name in names:
        path = os.path.join(folder, name)
        try:
            with open(path) as f:
                rec = json.load(f)
            pid, created = int(rec["pid"]), float(rec["create_time"])
        except (OSError, ValueError, KeyError, TypeError):
            unregister_child(path)
            continue
        now = _create_time(pid)
        if now is not None and abs(now - created) < 0.5 and pid != os.getpid():
            try:
                p = psutil.Process(pid)
                procs.extend([p, *p.children(recursive=True)])
                ended.append(f"{rec.get('role') or 'child'} (pid {pid})")
            except psutil.Error:
                pass
        unregister_child(path)
    stop_processes(procs, grace_s=grace_s)
    return ended
