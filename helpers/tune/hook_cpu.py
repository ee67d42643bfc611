"""tune's runtime watch of the PyTorch Performance Tuning Guide's CPU items in the user's process (run by
:mod:`helpers.tune.hook`): the training process's intra-op threads ("Utilize OpenMP") and the memory allocator
("Switch Memory allocator"), pytorch/tutorials ``recipes_source/recipes/tuning_guide.py``.

What it records (``rec.cpu``, the result's ``cpu``): ``torch.get_num_threads()`` at the start and at the end of the
run, the call sites in the user's files of ``torch.set_num_threads``, the thread variables of the environment
(:data:`THREAD_ENV`) as the process got them and whether the script changed them, the usable cores, ``LD_PRELOAD``
and the allocator libraries mapped into the process. What it applies: ``apply["threads"]`` (an int) is passed to
``torch.set_num_threads`` before the script runs. The allocator (``apply["ld_preload"]``) is not applied here: the
engine starts the process with ``LD_PRELOAD`` set (:func:`helpers.tune.engine.run_once`).

Only the standard library and torch are imported: it runs inside the user's process.
"""

from __future__ import annotations

import os
import sys
from typing import Any

#: The environment variables that set the intra-op threads of torch's CPU kernels (OpenMP's, and MKL's where torch
#: uses MKL): ``torch.__config__.parallel_info()`` lists both under "Environment variables".
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
#: Substrings of an allocator library's file name, as mapped into the process (``/proc/self/maps``).
ALLOCATOR_LIBS = ("libjemalloc", "libtcmalloc")


def _cores() -> int:
    """The CPU cores this process may run on, as :func:`helpers.device.usable_cores` counts them (not imported: this
    module runs in the user's process): ``len(os.sched_getaffinity(0))``, else ``os.cpu_count()``, at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def mapped_allocators(maps: str = "/proc/self/maps") -> list[str]:
    """The allocator libraries (:data:`ALLOCATOR_LIBS`) mapped into this process: their paths, each once; empty
    where none is, or where ``maps`` cannot be read (not Linux)."""
    try:
        with open(maps, encoding="utf-8", errors="replace") as f:
            paths = [line.split(None, 5)[-1].strip() for line in f if any(n in line for n in ALLOCATOR_LIBS)]
    except OSError:
        return []
    return list(dict.fromkeys(p for p in paths if p.startswith("/")))


def _watch_cpu(rec: Any) -> None:
    """Record the threads and the allocator (``rec.cpu``); apply ``rec.apply["threads"]``; count the user's calls
    of ``torch.set_num_threads`` (made in this process: a DataLoader worker's own call, torch's
    ``torch/utils/data/_utils/worker.py`` setting one thread per worker, is not the script's)."""
    import torch

    pid = os.getpid()
    info: dict[str, Any] = {"env": {k: os.environ.get(k) for k in THREAD_ENV}, "cores": _cores(),
                            "ld_preload": os.environ.get("LD_PRELOAD", ""), "set_sites": {}}
    rec.cpu = info
    threads = rec.apply.get("threads")
    if threads:
        torch.set_num_threads(int(threads))
    info["threads_at_start"] = torch.get_num_threads()
    orig = torch.set_num_threads

    def set_num_threads(n):
        if os.getpid() == pid:
            frame = rec.user_frame(sys._getframe(1))
            if frame is not None:
                key = rec.key(frame)
                site = info["set_sites"].setdefault(key, {**rec.site(frame), "count": 0, "value": n})
                site["count"] += 1
        return orig(n)

    torch.set_num_threads = set_num_threads


def _cpu_result(cpu: dict[str, Any] | None) -> dict[str, Any]:
    """``rec.cpu`` as the result JSON's ``cpu``: ``threads`` (``torch.get_num_threads()`` now, at the run's end),
    ``threads_at_start``, ``set_sites`` (the user's ``torch.set_num_threads`` calls: ``file``, ``line``, ``count``,
    ``value``), ``env`` (:data:`THREAD_ENV` as the process got them), ``env_set_by_script`` (those the script
    changed), ``cores``, ``ld_preload`` and ``allocators`` (:func:`mapped_allocators`)."""
    if not cpu:
        return {}
    torch = sys.modules.get("torch")
    return {"threads": torch.get_num_threads() if torch is not None else None,
            "threads_at_start": cpu.get("threads_at_start"), "set_sites": list(cpu["set_sites"].values()),
            "env": dict(cpu["env"]), "env_set_by_script": [k for k in THREAD_ENV if os.environ.get(k) != cpu["env"][k]],
            "cores": cpu["cores"], "ld_preload": cpu["ld_preload"], "allocators": mapped_allocators()}
