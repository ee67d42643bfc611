"""Keep a large trace's event columns on disk, and give them back in windows of time that fit in memory.

:func:`helpers.traces.kineto.read_kineto` keeps the columns of a trace (start, duration, name, category and thread
of each complete span: 26 bytes an event) in memory up to :data:`helpers.traces.kineto.SPILL_EVENTS` events;
beyond that it appends them here, to one file in a temporary folder, as they are parsed. Once the file is read,
:meth:`Spill.windows` cuts time into windows of about ``target`` events each (a histogram of the start times,
one pass), writes each window's events to a file of its own (a second pass; a span that crosses a window's edge is
written to every window it overlaps), and yields one window at a time. Every phase the analysis measures is a
length of a union of spans inside a step (:mod:`helpers.traces.kineto_phases`), and such a length is the sum of its
parts in windows that partition time; so the memory of the analysis is bounded by the window, not the trace.

The folder is made by :func:`tempfile.mkdtemp` (``$TMPDIR``, else the system's temporary folder) and removed by
:meth:`Spill.close`. It needs about twice the columns' size on disk: about 0.2 GB per GB of trace text.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np

__all__ = ["RECORD", "Spill"]

#: One event on disk: start and duration in ns, name, category and thread ids (26 bytes, packed).
RECORD = np.dtype([("ts", "<i8"), ("dur", "<i8"), ("name", "<i4"), ("cat", "<i2"), ("thread", "<i4")])
#: Events read from the spill file at a time while it is cut into windows.
BLOCK_EVENTS = 1 << 20
#: Bins of the start-time histogram the windows are cut from.
BINS = 1 << 16


class Spill:
    """An append-only file of :data:`RECORD` rows in a temporary folder of its own.

    Raises
    ------
    OSError
        The folder cannot be made or written (no space left: set ``TMPDIR`` to a folder with room).
    """

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="workbook-trace-"))
        wanted = os.environ.get("TMPDIR")
        if wanted and Path(wanted).resolve() != self.folder.parent.resolve():  # Python fell back: say where to
            warnings.warn(f"TMPDIR={wanted} is not a folder this process can write; the trace's events go to "
                          f"{self.folder.parent} instead", stacklevel=2)
        self.path = self.folder / "events.bin"
        self._f = open(self.path, "wb")
        self.min_ts: int | None = None
        self.max_ts: int | None = None

    def write(self, ts: np.ndarray, dur: np.ndarray, name: np.ndarray, cat: np.ndarray, thread: np.ndarray) -> None:
        """Append events (int64 ns start and duration, int32 name, int16 category, int32 thread ids)."""
        if not len(ts):
            return
        rec = np.empty(len(ts), RECORD)
        rec["ts"], rec["dur"], rec["name"], rec["cat"], rec["thread"] = ts, dur, name, cat, thread
        rec.tofile(self._f)
        lo, hi = int(ts.min()), int(ts.max())
        self.min_ts = lo if self.min_ts is None else min(self.min_ts, lo)
        self.max_ts = hi if self.max_ts is None else max(self.max_ts, hi)

    def _blocks(self, path: Path) -> Iterator[np.ndarray]:
        with open(path, "rb") as f:
            while True:
                block = np.fromfile(f, dtype=RECORD, count=BLOCK_EVENTS)
                if not len(block):
                    return
                yield block

    def edges(self, target: int) -> np.ndarray:
        """Window edges (int64 ns, ascending; the first is the earliest start, the last past the latest) such that
        each window starts about ``target`` events, or fewer; a single histogram bin is never split."""
        self._f.flush()
        lo, hi = int(self.min_ts), int(self.max_ts) + 1
        width = max(-(-(hi - lo) // BINS), 1)
        counts = np.zeros(BINS, np.int64)
        for block in self._blocks(self.path):
            counts += np.bincount((block["ts"] - lo) // width, minlength=BINS)[:BINS]
        cum = np.cumsum(counts)
        cuts, start = [], 0
        while True:  # the first bin whose cumulative count passes the window's quota ends it
            j = int(np.searchsorted(cum, start + target, side="right"))
            if j >= BINS or cum[-1] - start <= target:
                break
            j = max(j, (cuts[-1] + 1) if cuts else 1)
            cuts.append(j)
            start = int(cum[j - 1])
        inner = [lo + j * width for j in cuts if lo + j * width < hi]
        return np.array([lo, *inner, hi], np.int64)

    def windows(self, target: int) -> Iterator[tuple[tuple[np.ndarray, ...], int, int]]:
        """Yield ``((ts, dur, name, cat, thread), wlo, whi)`` per window, in time order: the columns of every event
        that overlaps [wlo, whi) (a zero-length one: that starts in it). The last window's ``whi`` is past every
        event's end. Each window's file is deleted once it has been read."""
        edges = self.edges(target)
        last_end = self.max_ts
        n = len(edges) - 1
        paths = [self.folder / f"window{i}.bin" for i in range(n)]
        files = [open(p, "wb") for p in paths]
        try:
            for block in self._blocks(self.path):
                ts = block["ts"]
                end = ts + block["dur"]
                last_end = max(last_end, int(end.max()))
                first = np.clip(np.searchsorted(edges, ts, side="right") - 1, 0, n - 1)
                last = np.clip(np.searchsorted(edges, end, side="left") - 1, first, n - 1)
                span = last - first + 1
                if (span > 1).any():  # a span across an edge goes to every window it overlaps
                    rows = np.repeat(np.arange(len(block)), span)
                    offset = np.arange(len(rows)) - np.repeat(np.cumsum(span) - span, span)
                    block, win = block[rows], first[rows] + offset
                else:
                    win = first
                order = np.argsort(win, kind="stable")
                bounds = np.searchsorted(win[order], np.arange(n + 1))
                for i in np.flatnonzero(np.diff(bounds)).tolist():
                    block[order[bounds[i]:bounds[i + 1]]].tofile(files[i])
        finally:
            for f in files:
                f.close()
        self.path.unlink()
        edges[-1] = max(int(edges[-1]), last_end + 1)
        for i, p in enumerate(paths):
            rec = np.fromfile(p, dtype=RECORD)
            p.unlink()
            cols = tuple(np.ascontiguousarray(rec[k]) for k in ("ts", "dur", "name", "cat", "thread"))
            del rec
            yield cols, int(edges[i]), int(edges[i + 1])

    def close(self) -> None:
        """Close the file and remove the folder (safe to call twice)."""
        try:
            self._f.close()
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)
