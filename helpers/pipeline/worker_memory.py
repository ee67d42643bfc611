"""The memory of a DataLoader's processes: USS/PSS/RSS of the main process and each worker over an epoch.

:func:`measure_epoch_memory` reads the memory of the main process and of each
worker (:func:`process_memory`, psutil's ``memory_full_info``) at the start and
at the end of an epoch, to show how a forked worker's unique memory grows when
the dataset keeps per-sample metadata in Python objects
(pytorch/pytorch#13246; see "Fork and spawn" in
:mod:`helpers.pipeline.loader`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import psutil

from helpers.errors import DataError, ParameterError
from helpers.pipeline.guarded import iterate

logger = logging.getLogger(__name__)

__all__ = ["ProcessMemory", "process_memory", "measure_epoch_memory"]

#: Bytes per MiB (the ``*_mib`` columns).
_MIB = float(1 << 20)


# --------------------------------------------------------------------------- memory


@dataclass(frozen=True)
class ProcessMemory:
    """Memory of one process, in bytes.

    Attributes
    ----------
    role : str
        ``"main"`` or ``"worker <i>"``.
    pid : int
    rss_bytes : int
        Resident set size: counts pages shared with other processes in full
        in every process (so summing RSS over workers overcounts).
    uss_bytes : int or None
        Unique set size: pages only this process has (what freeing it would
        give back). None where psutil cannot read it.
    pss_bytes : int or None
        Proportional set size: unique pages plus a share of shared pages
        (sums correctly over processes; Linux only). None elsewhere.
    """

    role: str
    pid: int
    rss_bytes: int
    uss_bytes: int | None
    pss_bytes: int | None


def process_memory(pid: int | None = None, role: str = "main") -> ProcessMemory:
    """Read RSS, USS and PSS of a process with psutil (``memory_full_info``).

    Parameters
    ----------
    pid : int, optional
        Default: this process.
    role : str
        Label stored in the result.

    Returns
    -------
    ProcessMemory

    Raises
    ------
    DataError
        If the process no longer exists.
    """
    try:
        proc = psutil.Process(pid)
        rss = int(proc.memory_info().rss)
        try:
            full = proc.memory_full_info()
            uss = int(full.uss)
            pss = int(full.pss) if hasattr(full, "pss") else None
        except (psutil.AccessDenied, AttributeError) as exc:
            logger.debug("USS/PSS of pid %s not readable: %r", pid, exc)
            uss = pss = None
    except psutil.NoSuchProcess as exc:
        raise DataError(f"process {pid} ({role}) exited before its memory could be read; measure while "
                        "the loader's iterator is alive") from exc
    return ProcessMemory(role=role, pid=int(proc.pid), rss_bytes=rss, uss_bytes=uss, pss_bytes=pss)


def _snapshot(moment: str, batches: int, worker_pids: Sequence[int], label: str) -> list[dict[str, Any]]:
    rows = []
    procs = [(None, "main")] + [(pid, f"worker {i}") for i, pid in enumerate(worker_pids)]
    for pid, role in procs:
        try:
            m = process_memory(pid, role)
        except DataError as exc:
            logger.warning("%s", exc)
            continue
        rows.append({
            "loader": label, "moment": moment, "batches": batches, "role": m.role, "pid": m.pid,
            "rss_mib": m.rss_bytes / _MIB,
            "uss_mib": None if m.uss_bytes is None else m.uss_bytes / _MIB,
            "pss_mib": None if m.pss_bytes is None else m.pss_bytes / _MIB,
        })
    return rows


def measure_epoch_memory(loader: Any, *, label: str = "loader", max_batches: int | None = None) -> pd.DataFrame:
    """USS/PSS/RSS of the main process and each worker at the start and at the end of an epoch.

    "start" is read right after the first batch arrives (the workers are up
    and have done one task each), "end" right after the last batch arrives,
    while the workers are still alive. Workers are found as new child
    processes of this one (:class:`helpers.pipeline.guarded.LoaderIterator`).

    Parameters
    ----------
    loader : torch.utils.data.DataLoader
        With ``len(loader)`` defined, or give ``max_batches``.
    label : str
        Stored in the ``loader`` column (to compare several loaders).
    max_batches : int, optional
        Stop after this many batches (the "end").

    Returns
    -------
    pandas.DataFrame
        One row per process per moment: ``loader`` (str), ``moment``
        ("start"/"end"), ``batches`` (int, received so far), ``role``
        ("main", "worker 0", ...), ``pid`` (int), ``rss_mib``, ``uss_mib``,
        ``pss_mib`` (MiB, float; None where unreadable).

    Raises
    ------
    ParameterError
        If the epoch length is unknown (no ``len`` and no ``max_batches``).
    DataError
        On a loader failure.
    """
    if max_batches is None:
        try:
            max_batches = len(loader)
        except TypeError:
            raise ParameterError("measure_epoch_memory: the loader has no len(); pass max_batches") from None
    if max_batches < 1:
        raise DataError(f"{label}: the loader yields no batch (len {max_batches}); add items or lower batch_size")
    rows: list[dict[str, Any]] = []
    with iterate(loader, name=label) as it:
        for i, _batch in enumerate(it):
            if i == 0:
                rows += _snapshot("start", 1, it.worker_pids, label)
            if i + 1 >= max_batches:
                rows += _snapshot("end", i + 1, it.worker_pids, label)
                break
    return pd.DataFrame(rows, columns=["loader", "moment", "batches", "role", "pid", "rss_mib", "uss_mib",
                                       "pss_mib"])
