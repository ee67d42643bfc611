"""The user's files a tune run writes outside its folder, kept before their first write so that
:func:`helpers.tune.engine.restore_user_files` can put them back (an audit hook in the run's process)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any


#: The folder beside a run's result where its processes keep the user's files before changing them
#: (:class:`UserFiles`); :func:`helpers.tune.engine.restore_user_files` puts them back after the run.
KEEP_SUFFIX = ".kept"
#: ``os.open`` flags that make an open a write (``open()`` passes the flags its mode means to the ``open`` event).
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


class UserFiles:
    """An audit hook (PEP 578, ``sys.addaudithook``) that keeps a copy of every file outside the run folder before
    the run first changes it, so that tune's runs lose nothing of the user's (a ``metrics.csv`` truncated, a log
    appended to): the events ``open`` with a write mode or flags, ``os.rename`` (also raised by ``os.replace`` and
    ``shutil.move``: both paths), ``os.remove`` / ``os.unlink``, ``os.truncate`` and ``os.mkdir`` (a folder the run
    creates), as listed in https://docs.python.org/3/library/audit_events.html.

    Each process (a DataLoader worker too) appends one JSON line per path to ``KEEP/<pid>.jsonl`` before the change
    happens: ``{"path", "t" (unix time, s), "kept" (the copy, or None where the path did not exist), "dir"}``.
    Writes by C code that bypasses Python's ``open`` are not seen (``torch.save`` is redirected instead).
    """

    def __init__(self, keep_dir: str, own_dirs: list[str]) -> None:
        self.keep = Path(keep_dir)
        self.own = [os.path.abspath(d) + os.sep for d in own_dirs] + [os.path.abspath(keep_dir) + os.sep]
        self.seen: set[str] = set()
        self.local = threading.local()
        self.n = 0

    def __call__(self, event: str, args: tuple) -> None:
        if event == "open":
            if len(args) < 3 or not isinstance(args[2], int) or not args[2] & _WRITE_FLAGS:
                return
            paths = args[:1]
        elif event == "os.rename":
            paths = args[:2]
        elif event in ("os.remove", "os.truncate", "os.mkdir"):
            paths = args[:1]
        else:
            return
        if getattr(self.local, "inside", False):
            return
        self.local.inside = True
        try:
            for path in paths:
                self.keep_one(path, folder=event == "os.mkdir")
        except Exception:  # noqa: BLE001 - the guard must never break the user's script
            pass
        finally:
            self.local.inside = False

    def skips(self, path: str) -> bool:
        """Whether ``path`` (absolute) is not the user's to keep: the run folder, devices, bytecode caches."""
        return (path.startswith(("/dev/", "/proc/", "/sys/")) or any(path.startswith(d) for d in self.own)
                or f"{os.sep}__pycache__{os.sep}" in path)

    def keep_one(self, path: Any, *, folder: bool = False) -> None:
        """Record ``path`` and copy it where it is a file, the first time this process changes it."""
        import shutil

        if not isinstance(path, (str, bytes, os.PathLike)):
            return  # a file descriptor: opened by path already
        p = os.path.abspath(os.fsdecode(path))
        if p in self.seen or self.skips(p):
            return
        self.seen.add(p)
        if os.path.exists(p) and not os.path.isfile(p):
            return  # an existing folder: its files are kept one by one
        self.keep.mkdir(parents=True, exist_ok=True)
        pid = os.getpid()
        entry: dict[str, Any] = {"path": p, "t": time.time(), "kept": None, "dir": folder}
        if os.path.isfile(p):
            self.n += 1
            kept = self.keep / f"{pid}-{self.n}-{os.path.basename(p)}"
            shutil.copy2(p, kept)
            entry["kept"] = str(kept)
        with open(self.keep / f"{pid}.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")
