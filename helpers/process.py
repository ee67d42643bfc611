"""Child processes that die with their parent (Linux ``prctl(PR_SET_PDEATHSIG)``).

A runner or kernel killed with SIGKILL gets no chance to stop what it started; torchrun and its ranks would
live on under PID 1, holding ports, memory and devices. Each such child asks the kernel to SIGKILL it when
its parent exits (:func:`die_with_parent`). Part of the foundation: imports only the standard library, so
that a rank can call it before importing torch.
"""

from __future__ import annotations

import os
import signal
import sys

__all__ = ["die_with_parent"]

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
