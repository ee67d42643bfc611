"""Which sample each DataLoader worker is loading, and since when: how a hung worker is named.

A worker stuck in the dataset's ``__getitem__`` leaves the main process waiting for a batch that never comes; torch
then says only that the DataLoader timed out. :func:`track` makes each worker record, in a small table in shared
memory, its process id, the index it is loading and the time it started (a few array writes per sample, no lock, no
message), so that the wait can be named: ``worker 1 (pid 4242) has been in __getitem__(index 37) for 30 s``
(:func:`stuck_workers_sentence`). :func:`helpers.pipeline.loader.make_loader` tracks every loader with workers,
:class:`helpers.pipeline.guarded.LoaderIterator` any other it is given, and the timeout of either, like the watchdog
of a hung cell or ``diagnose`` (:mod:`helpers.stuck`, which finds the tracker on the stuck stack), says the sentence.

How a worker records: the tracker is the loader's ``worker_init_fn`` (it calls the one it replaces first). In each
worker it swaps the class of the worker's own copy of the dataset (:func:`torch.utils.data.get_worker_info`'s
``dataset``; the main process's object is untouched) for a subclass whose ``__getitem__``, and ``__getitems__``
where the class has one, writes the index and the time before calling the original and marks the worker idle
after it; nothing else changes (``isinstance`` holds, the class keeps its name). Where the index is not known the
sentence says so plainly: an iterable dataset (no index), a class that cannot be swapped (a layout of its own), a
loader whose workers were started without the tracker (persistent workers of an earlier epoch), an index that is
not an integer or a list of them.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["WorkerProgress", "WorkerRow", "stuck_workers_sentence", "track"]

# the table's columns, one row per worker (float64: an index, a pid and a Unix time are exact up to 2**53)
_PID, _KIND, _STATE, _INDEX, _COUNT, _STARTED = range(6)
_COLUMNS = 6
# _KIND: how the worker records; _STATE: whether it is inside __getitem__ now
_TRACKED, _ITERABLE, _UNTRACKABLE = 1.0, 2.0, 3.0
_IDLE, _LOADING = 0.0, 1.0
# _COUNT: 1 for one index, n for a list of n, 0 for an index that is not an integer or a list of them


@dataclass(frozen=True)
class WorkerRow:
    """One worker's entry in a :class:`WorkerProgress` table.

    Attributes
    ----------
    worker : int
        The worker's id (0 .. num_workers - 1, torch's ``WorkerInfo.id``).
    pid : int
        Its process id.
    kind : str
        ``"tracked"``, ``"iterable"`` (an IterableDataset: no index) or ``"untrackable"`` (its dataset's class
        could not be swapped).
    loading : bool
        Whether it is inside ``__getitem__`` (or ``__getitems__``) now.
    index : int or None
        The index it is loading (or last loaded), the first of a list; None where not known.
    count : int
        1 for one index, the length of a list of indices, 0 where the index is not known.
    started : float or None
        When it entered that ``__getitem__``, Unix time in seconds (:func:`time.time`); None before its first.
    """

    worker: int
    pid: int
    kind: str
    loading: bool
    index: int | None
    count: int
    started: float | None

    def call(self) -> str:
        """``"__getitem__(index 37)"``, ``"__getitem__(8 indices from 32)"``, or ``"__getitem__"`` with the index
        said to be unknown."""
        if self.index is None or self.count <= 0:
            return "__getitem__ (its index is not an integer: not known)"
        if self.count == 1:
            return f"__getitem__(index {self.index})"
        return f"__getitem__({self.count} indices from {self.index})"


class WorkerProgress:
    """A loader's table of what each worker is loading, and the ``worker_init_fn`` that fills it.

    Parameters
    ----------
    num_workers : int
        The loader's ``num_workers`` (> 0): one row each.
    inner : callable, optional
        The loader's own ``worker_init_fn``, called first in each worker (e.g.
        :func:`helpers.pipeline.seeding.worker_init_fn`). Must be picklable under spawn and forkserver, as the
        tracker is.

    Attributes
    ----------
    table : torch.Tensor
        float64, shape (num_workers, 6), in shared memory (:meth:`torch.Tensor.share_memory_`), so that the workers'
        writes are seen by the main process under fork, spawn and forkserver alike.

    Raises
    ------
    ValueError
        If ``num_workers`` is not a positive int.
    """

    def __init__(self, num_workers: int, inner: Any = None) -> None:
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers <= 0:
            raise ValueError(f"num_workers must be a positive int, got {num_workers!r}")
        self.inner = inner
        self.table = torch.full((num_workers, _COLUMNS), math.nan, dtype=torch.float64).share_memory_()

    def __call__(self, worker_id: int) -> None:
        """In worker ``worker_id``: the wrapped ``worker_init_fn``, then the recording set up (see the module)."""
        if self.inner is not None:
            self.inner(worker_id)
        row = self.table.numpy()[worker_id]
        row[:] = math.nan
        row[_STATE] = _IDLE
        info = torch.utils.data.get_worker_info()
        dataset = info.dataset if info is not None else None
        if dataset is None or isinstance(dataset, torch.utils.data.IterableDataset):
            row[_KIND] = _ITERABLE
        else:
            try:
                dataset.__class__ = _recording_class(type(dataset))
                row[_KIND] = _TRACKED
            except Exception:  # noqa: BLE001  a class of another layout: load as it is, say the index is unknown
                row[_KIND] = _UNTRACKABLE
        _WORKER["row"], _WORKER["depth"] = row, 0
        row[_PID] = os.getpid()  # last: a row with a pid is ready

    def rows(self) -> list[WorkerRow]:
        """The workers that have started (run this tracker), by id."""
        out = []
        kinds = {_TRACKED: "tracked", _ITERABLE: "iterable", _UNTRACKABLE: "untrackable"}
        for w, r in enumerate(self.table.numpy().tolist()):
            if math.isnan(r[_PID]):
                continue
            known = not math.isnan(r[_INDEX]) and not math.isnan(r[_COUNT]) and r[_COUNT] > 0
            out.append(WorkerRow(worker=w, pid=int(r[_PID]), kind=kinds.get(r[_KIND], "untrackable"),
                                 loading=r[_STATE] == _LOADING, index=int(r[_INDEX]) if known else None,
                                 count=int(r[_COUNT]) if known else 0,
                                 started=None if math.isnan(r[_STARTED]) else float(r[_STARTED])))
        return out

    def stuck_sentence(self, iterator: Any = None) -> str:
        """:func:`stuck_workers_sentence` of the loader's iterator (what :mod:`helpers.stuck` calls, finding this
        tracker as the iterator's ``_worker_init_fn`` on a stuck stack)."""
        return stuck_workers_sentence(iterator, tracker=self)


# --------------------------------------------------------------------------- in the worker

#: This worker's row of its loader's table and how deep it is in __getitem__ (a dataset may call itself).
_WORKER: dict[str, Any] = {}
_CLASSES: dict[type, type] = {}


def _enter(index: Any) -> None:
    row = _WORKER.get("row")
    if row is None:
        return
    _WORKER["depth"] += 1
    if _WORKER["depth"] > 1:  # a dataset that calls itself (a retry on the next file): the sampler's index stays
        return
    row[_STATE] = _IDLE
    first, count = _index_of(index)
    row[_INDEX], row[_COUNT], row[_STARTED] = first, count, time.time()
    row[_STATE] = _LOADING


def _leave() -> None:
    row = _WORKER.get("row")
    if row is None:
        return
    _WORKER["depth"] -= 1
    if _WORKER["depth"] <= 0:
        _WORKER["depth"] = 0
        row[_STATE] = _IDLE


def _index_of(index: Any) -> tuple[float, float]:
    """(first index, count) of what ``__getitem__`` was given; (nan, 0) for anything but integers."""
    try:
        if isinstance(index, (list, tuple)) or (hasattr(index, "ndim") and getattr(index, "ndim", 0) == 1):
            items = list(index)
            return (float(int(items[0])), float(len(items))) if items else (math.nan, 0.0)
        return float(int(index)), 1.0
    except (TypeError, ValueError, IndexError, OverflowError):
        return math.nan, 0.0


def _recording_class(cls: type) -> type:
    """A subclass of ``cls`` (same name, no new slots: an instance's class can be swapped to it) whose
    ``__getitem__`` (and ``__getitems__`` where ``cls`` has one) records the index around the original."""
    sub = _CLASSES.get(cls)
    if sub is not None:
        return sub
    original = cls.__getitem__

    def __getitem__(self, index):
        _enter(index)
        try:
            return original(self, index)
        finally:
            _leave()

    namespace: dict[str, Any] = {"__slots__": (), "__module__": cls.__module__, "__qualname__": cls.__qualname__,
                                 "__doc__": cls.__doc__, "__getitem__": __getitem__}
    many = getattr(cls, "__getitems__", None)
    if many:
        def __getitems__(self, indices):
            _enter(indices)
            try:
                return many(self, indices)
            finally:
                _leave()

        namespace["__getitems__"] = __getitems__
    sub = type(cls)(cls.__name__, (cls,), namespace)
    _CLASSES[cls] = sub
    return sub


# --------------------------------------------------------------------------- in the main process


def track(loader: Any) -> Any:
    """Make ``loader``'s workers record what they load (a no-op without workers or when already tracked).

    Sets ``loader.worker_init_fn`` to a :class:`WorkerProgress` wrapping the one it had; workers started from
    now on record (persistent workers already running do not).

    Parameters
    ----------
    loader : torch.utils.data.DataLoader

    Returns
    -------
    the same loader
    """
    num_workers = int(getattr(loader, "num_workers", 0) or 0)
    current = getattr(loader, "worker_init_fn", None)
    if num_workers > 0 and not isinstance(current, WorkerProgress):
        try:
            loader.worker_init_fn = WorkerProgress(num_workers, inner=current)
        except (AttributeError, ValueError, RuntimeError):  # a loader that refuses it: its workers stay unnamed
            pass
    return loader


def _seconds(s: float) -> str:
    """``"30 s"``, ``"1.2 s"``: whole seconds from 10 s on."""
    s = max(0.0, float(s))
    return f"{s:.0f} s" if s >= 10 else f"{s:.1f} s"


def _awaited_worker(iterator: Any) -> int | None:
    """The worker whose batch the iterator waits for (torch's private ``_task_info[_rcvd_idx]``), or None."""
    try:
        info = iterator._task_info.get(iterator._rcvd_idx)
        return int(info[0]) if info and len(info) == 1 else None
    except Exception:  # noqa: BLE001  another torch's internals: the sentence goes without it
        return None


def _worker_pids(iterator: Any) -> dict[int, int]:
    try:
        return {i: int(w.pid) for i, w in enumerate(iterator._workers) if w.pid is not None}
    except Exception:  # noqa: BLE001  another torch's internals
        return {}


def stuck_workers_sentence(iterator: Any = None, *, tracker: WorkerProgress | None = None,
                           now: float | None = None) -> str:
    """Which worker a DataLoader waits for and which sample it is stuck in, as far as it can be known.

    E.g. ``"worker 1 (pid 4242), whose batch the loop waits for, has been in __getitem__(index 37) for 30 s"``;
    every worker inside ``__getitem__`` is named, the longest first (at most 3). Where the index is not known the
    sentence says so and why, naming the awaited worker where torch's iterator tells it.

    Parameters
    ----------
    iterator : torch.utils.data.dataloader._MultiProcessingDataLoaderIter, optional
        The waiting iterator (its ``_worker_init_fn`` is the tracker, its private ``_task_info`` and
        ``_rcvd_idx`` name the awaited worker); None with ``tracker`` given.
    tracker : WorkerProgress, optional
        Default: the iterator's ``_worker_init_fn`` where it is one.
    now : float, optional
        Unix time in seconds to measure "for N s" to (default :func:`time.time`).

    Returns
    -------
    str
        One sentence, without a final period. Never raises.
    """
    now = time.time() if now is None else float(now)
    if tracker is None:
        found = getattr(iterator, "_worker_init_fn", None)
        tracker = found if isinstance(found, WorkerProgress) else None
    awaited = _awaited_worker(iterator) if iterator is not None else None
    pids = _worker_pids(iterator) if iterator is not None else {}

    def name(w: int) -> str:
        row = by_id.get(w)
        pid = pids.get(w) or (row.pid if row is not None else None)
        return f"worker {w}" + (f" (pid {pid})" if pid else "")

    by_id: dict[int, WorkerRow] = {}
    if tracker is None:
        waits = f"the loop waits for the batch of {name(awaited)}; " if awaited is not None else ""
        return (f"{waits}which worker is stuck and in which sample is not known: this loader's workers do not record "
                "what they load (helpers.pipeline.worker_progress.track, which make_loader applies, makes them)")
    try:
        rows = tracker.rows()
    except Exception as exc:  # noqa: BLE001  a table that cannot be read: say so
        return f"which worker is stuck and in which sample is not known (the workers' table: {exc})"
    if not rows:
        return ("no worker has started yet (none has run its worker_init_fn): stuck starting the workers, e.g. "
                "importing the dataset's module under spawn, or in the loader's own worker_init_fn")
    by_id = {r.worker: r for r in rows}
    loading = sorted((r for r in rows if r.loading and r.started is not None), key=lambda r: r.started)
    if loading:
        if awaited is not None:  # the awaited worker first, then the longest
            loading.sort(key=lambda r: r.worker != awaited)
        said = [f"{name(r.worker)}{', whose batch the loop waits for,' if r.worker == awaited else ''} has been in "
                f"{r.call()} for {_seconds(now - r.started)}" for r in loading[:3]]
        more = f" (and {len(loading) - 3} more worker(s))" if len(loading) > 3 else ""
        return "; ".join(said) + more
    lead = by_id.get(awaited) if awaited is not None else None
    if lead is not None and lead.kind != "tracked":
        why = ("its dataset is iterable, so it has no index" if lead.kind == "iterable" else
               "its dataset's class could not record it")
        return f"the loop waits for the batch of {name(lead.worker)}, stuck in a sample that is not known: {why}"
    if all(r.kind != "tracked" for r in rows):
        why = ("the dataset is iterable, so there is no index" if rows[0].kind == "iterable" else
               "the dataset's class could not record it")
        return f"which sample the workers are stuck in is not known: {why}"
    last = ""
    if lead is not None and lead.started is not None:
        last = (f"; the loop waits for the batch of {name(lead.worker)}, which returned from {lead.call()} "
                f"{_seconds(now - lead.started)} ago")
    return ("no worker is inside __getitem__ (each returned from its last sample): the wait is elsewhere, in the "
            f"collate_fn, the pin-memory thread or a worker that died{last}")
