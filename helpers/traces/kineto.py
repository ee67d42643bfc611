"""Read torch.profiler's Kineto Chrome-trace JSON (``*.pt.trace.json``, maybe gzipped) into a :class:`RankTrace`.

A trace is the file ``torch.profiler.tensorboard_trace_handler`` writes (``{worker}.{time}.pt.trace.json``, or
``.pt.trace.json.gz`` with ``use_gzip=True``) or ``prof.export_chrome_trace(path)``: one JSON object whose
``traceEvents`` array holds every recorded span, and beside it the run's metadata (``distributedInfo``,
``deviceProperties``, ``baseTimeNanoseconds``, ``schemaVersion``, ``traceName``), before or after the array.
:func:`read_kineto` reads it once, keeps each complete ("X") span as five numbers in numpy columns (start and
duration in ns, interned name, category and thread: 25 bytes an event, no dicts), then finds the steps and their
phases with vectorised interval arithmetic.

How it parses, and why (measured on this project's 2-core machine while other agents loaded it: load average
0.3-0.8 for the first five rows, on a 210 MB trace of 0.83 M events made by repeating a real torch 2.13 CPU trace):

=====================================================  ===========  =========
approach                                                 MB/s         peak RSS
=====================================================  ===========  =========
``json.load`` of the whole file                          40           815 MiB
``ijson.items(f, "traceEvents.item", use_float=True)``  38 (no use)   13 MiB
``ijson.parse`` (yajl2_c), token by token                16           29 MiB
``json.JSONDecoder.raw_decode`` one event at a time      39 (no use)   37 MiB
one ``json.loads`` per 8 MB chunk of events              37          224 MiB
a regular expression per 8 MB chunk, columns built       56          133 MiB
=====================================================  ===========  =========

("no use": the parse alone, before a single field is put in a column; the columns cost another ~20%.) The
stdlib's and yajl's C parsers both build a dict per event, which is what costs on this machine; so the reader
takes the fields it needs straight from the text: Kineto writes every complete event with its keys in one order
(``"ph": "X", "cat", "name", "pid", "tid", "ts", "dur"``, whatever the line breaks: torch 2.13 puts each key on
its own line, newer libkineto several on one), and one regular expression per chunk reads them. Each chunk is
checked before it is trusted: the expression must have matched exactly as many events as the chunk has
``"X"`` values (a complete event's ``"ph"``, however it is spaced); a chunk that fails is parsed with
``json.loads`` instead, and where even that fails (a file laid out by another writer, e.g. ``json.dump`` with
sorted keys) the whole file is read again with the exact path, ``raw_decode`` one event at a time from a sliding
buffer. The same exact path reads the metadata before the events, the last part of the array, its end and the
metadata after it, in the same single pass. ijson is not used: it was no faster than the stdlib here and cannot
give the metadata after the array in the same pass without going token by token (16 MB/s).

Memory is bounded whatever the trace's size. Up to :data:`SPILL_EVENTS` complete events the columns stay in memory
(26 bytes an event, plus the analysis' arrays over them: about 0.2 KB an event at the peak); past that, every event
goes to a file in ``$TMPDIR`` as it is parsed (:mod:`helpers.traces.kineto_spill`), and the analysis reads it back
in windows of time of about :data:`WINDOW_EVENTS` events, adding each window's part of each step's phases (a length
of a union of spans inside a step is the sum of its parts in windows that partition time; the windowed and the
in-memory reads give the same phases, tests/test_trace_spill.py). The ``ProfilerStep#N`` spans and the count of
events per category are kept apart while parsing, so the steps and the device are known before the windows are
read. The spill takes about 0.2-0.35 bytes of disk per byte of trace text, asked of ``$TMPDIR`` before a large read.

The whole reader (``python -m helpers bench trace``: a CUDA-shaped trace in torch's layout, 50 steps, read in a
child process; 2026-12-05, this project's 2-core machine, quiet: other processes took 0-4% of the cores):

========  ==========  ========  =======  ===========  ==========================================
trace     events      read      MB/s     peak RSS     notes
========  ==========  ========  =======  ===========  ==========================================
300 MB    1.16 M      2.5 s     118      160 MiB      in memory (spill threshold then 2 M events);
                                                      HTA 0.5.0 on the same file: 50.0 s, 1,406 MiB
1,000 MB  3.86 M      9.8 s     102      246 MiB      spilled, windows of 1 M events
5,020 MB  19.3 M      45.4 s    110      252 MiB      spilled, windows of 1 M events
========  ==========  ========  =======  ===========  ==========================================

Before the spill, the same 1,000 MB trace peaked at 406 MiB and a 10 GB one would have needed about 3.5 GiB.
The exact path alone (a 195 MB trace written with sorted keys, load average 4.4) read 10.5 MB/s, 184 MiB.

This module parses the file into the columns (the parse's limits, its constants and its fallbacks); what each
phase of a :class:`~helpers.traces.model.StepPhases` is read from, and the interval arithmetic that reads it, is
:mod:`helpers.traces.kineto_phases`.
"""

from __future__ import annotations

import gzip
import io
import json
import re
import sys
import time
import zlib
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from helpers.live import Progress
from helpers.traces.kineto_phases import _DEVICE_CATS, _analyse, _Events, _is_marker, _no_steps
from helpers.traces.kineto_spill import Spill
from helpers.traces.model import RankTrace, TraceError
from helpers.traces.precision import MATRIX_OPS, op_precision

__all__ = ["looks_like_kineto", "read_kineto"]

#: Characters read per chunk of the event array.
CHUNK_CHARS = 8 << 20
#: The longest single JSON value (one event, or one metadata value beside ``traceEvents``) the exact path decodes,
#: characters: torch.profiler's events are a few hundred bytes. Longer is refused, since decoding it would hold the
#: text and its objects (up to ~24 bytes per character for ``[{},{},...]``) at once.
MAX_EVENT_CHARS = 16 << 20
#: The longest event name or category, characters: no profiler writes a name of a MiB (kernel names of templated
#: code run to a few KB).
MAX_STRING_CHARS = 1 << 20
#: All the metadata beside ``traceEvents`` together, characters (torch writes a few KB of it).
MAX_META_CHARS = 16 << 20
#: The exact path hands its decoded events to the columns every this many events or characters of their text,
#: whichever comes first, so that large events never pile up as dicts.
PENDING_EVENTS = 20_000
PENDING_CHARS = 4 << 20
#: A chunk the fast path's expression does not trust is decoded by ``json.loads`` in pieces of at most this many
#: characters (cut before an event, as the chunks are).
JSON_PIECE_CHARS = 2 << 20
#: The largest |ts| and dur, microseconds (~127 years): ns times and their ends must fit in int64.
MAX_TIME_US = 4e15
#: A gzip whose text grows past :data:`GZIP_RATIO_AFTER` bytes at more than this many bytes per compressed byte
#: read is refused: torch.profiler's traces compress 10-30-fold (8-30x measured on the 18 public traces of
#: tests/data/public_traces, 13x on a real torch 2.13 CPU trace, 25x on ``bench trace``'s), a stream of spaces or
#: of one repeated event 300-1000-fold.
MAX_GZIP_RATIO = 200
GZIP_RATIO_AFTER = 64 << 20
#: Events read with no ``ProfilerStep#`` among them after which the reader gives up early.
EARLY_NO_STEP_EVENTS = 2_000_000
#: Seconds between two calls of the progress callback.
PROGRESS_EVERY_S = 0.25
#: Events kept in memory as columns; past this many, every event goes to a file on disk (:mod:`.kineto_spill`) and
#: the analysis reads it back in windows of time of :data:`WINDOW_EVENTS` events, so that the peak memory stays
#: bounded whatever the trace's size.
SPILL_EVENTS = 1_000_000
WINDOW_EVENTS = 1_000_000
#: Peak memory of the reader per MB of uncompressed trace, MiB, and its fixed part (the interpreter, numpy, the
#: 8 MB text buffer), up to the bound the spill sets: ``python -m helpers bench trace`` (see the module's text).
MIB_PER_TRACE_MB = 0.40
BASE_MIB = 40.0
PEAK_CAP_MIB = 300.0
#: Share of the memory available now that a read may plan to take before it is refused up front.
MEMORY_SHARE = 0.8
#: Disk the spill takes, bytes per byte of trace text (26 bytes an event, twice while the windows are cut, at 150
#: bytes of text an event or more), asked of ``$TMPDIR`` before a trace of more than :data:`DISK_CHECK_AFTER` bytes.
DISK_PER_TRACE_BYTE = 0.35
DISK_CHECK_AFTER = 256 << 20

#: PyTorch 1.8-1.9 (Kineto schema of the TensorBoard plugin's samples) named the categories otherwise; read as
#: today's names (``Operator`` also holds the ``ProfilerStep#N`` and DataLoader spans then).
_OLD_CATS = {"Operator": "cpu_op", "Kernel": "kernel", "Runtime": "cuda_runtime", "Driver": "cuda_driver",
             "Memcpy": "gpu_memcpy", "Memset": "gpu_memset", "Python": "python_function"}

# One complete event as Kineto writes it (any whitespace between the keys).
_X = re.compile(r'"ph": "X",\s*"cat": "([^"\\]*)",\s*"name": "([^"\\]*(?:\\.[^"\\]*)*)",\s*"pid": ([^,]*,'
                r'\s*"tid": [^,]*),\s*"ts": ([^,\s}]*),\s*"dur": ([^,\s}]*)')
# The Input type of an operator that does matrix work (helpers.traces.precision.MATRIX_OPS), where the trace
# recorded shapes: its args come after "dur" in the same event, and hold no nested object.
_OP_TYPES = re.compile(r'"name": "(' + "|".join(re.escape(n) for n in sorted(MATRIX_OPS))
                       + r')",[^{}]*?"args": \{[^{}]*?"Input type": \[([^\]]*)\]')
# A kernel that carries a collective's metadata (kineto copies the launching record_param_comms op's "Collective
# name", "Process Group Name", ... onto the kernel's args): its name. Its args come after "dur" in the same event.
_COLL_KERNEL = re.compile(r'"cat": "[Kk]ernel",\s*"name": "([^"\\]*(?:\\.[^"\\]*)*)",[^{}]*?"args": \{[^{}]*?'
                          r'"Collective name": "')
_WS = re.compile(r"\s*")
_DECODER = json.JSONDecoder()


class _Restart(Exception):
    """The fast path met a layout it cannot trust: read the file again with the exact path."""


class _SpillFailed(Exception):
    """Writing the columns to disk failed (:class:`OSError` in ``args[0]``)."""


class _BadValue(Exception):
    """An event the columns refuse (a time that is not a finite number, a name of a MiB): the message says what is
    wrong and what to do; :func:`_parse` names the file."""


# ------------------------------------------------------------------------------------------------ the sniff


def looks_like_kineto(path) -> bool:
    """Whether ``path`` looks like a Kineto trace, from its name and first bytes (no parse).

    True for a file named ``*.pt.trace.json`` / ``*.pt.trace.json.gz`` (tensorboard_trace_handler's names), or a
    ``.json`` / ``.json.gz`` whose first 64 KiB (decompressed) start a JSON object and name ``traceEvents``,
    ``schemaVersion`` or ``deviceProperties``. False for a folder, an unreadable file or anything else; never raises.
    """
    p = Path(path)
    try:
        if not p.is_file():
            return False
        name = p.name.lower()
        if name.endswith((".pt.trace.json", ".pt.trace.json.gz")):
            return True
        if not name.endswith((".json", ".json.gz")):
            return False
        with open(p, "rb") as raw:
            head = raw.read(2)
            raw.seek(0)
            stream = gzip.GzipFile(fileobj=raw) if head == b"\x1f\x8b" else raw
            text = stream.read(1 << 16).decode("utf-8", errors="replace")
    except (OSError, EOFError, zlib.error):
        return False
    text = text.lstrip()
    return text.startswith("{") and any(k in text for k in ('"traceEvents"', '"schemaVersion"', '"deviceProperties"'))


# ------------------------------------------------------------------------------------------------ the columns


class _Table(dict):
    """Interned strings: looking up a new one gives it the next id (so ``map(table.__getitem__, ...)`` interns)."""

    def __missing__(self, key):
        self[key] = n = len(self)
        return n


def _thread_key(text: str) -> tuple[str, str]:
    """(pid, tid) as JSON text from the fast path's ``pid, "tid": tid`` capture."""
    pid, _, tid = text.partition(",")
    return pid.strip(), tid.split(":", 1)[1].strip()


@dataclass
class _Columns:
    """The complete events read so far, as numpy chunks in memory or, past :data:`SPILL_EVENTS`, in a
    :class:`~helpers.traces.kineto_spill.Spill` on disk; names, categories and threads interned. The
    spans that mark steps (``ProfilerStep#N``, ``Optimizer.step#``, the DataLoader's ``__next__``) are also kept
    apart (``step_parts``) and the events counted per category (``cat_counts``), so that the steps and the device
    are known before the events are read back."""

    names: _Table = field(default_factory=_Table)
    cats: _Table = field(default_factory=_Table)
    threads: _Table = field(default_factory=_Table)
    raw_threads: dict[str, int] = field(default_factory=dict)
    parts: list[tuple[np.ndarray, ...]] = field(default_factory=list)
    step_parts: list[tuple[np.ndarray, ...]] = field(default_factory=list)
    is_step: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    cat_counts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    spill: Spill | None = None
    events: int = 0
    saw_step: bool = False
    #: names of the kernels that carry a collective's metadata (args "Collective name")
    collective_kernels: set[str] = field(default_factory=set)
    #: kernel time per (thread id, name id): [ns, calls], for the stream rule of kineto_phases._comm_plan
    stream_kernels: dict[tuple[int, int], list[int]] = field(default_factory=dict)
    is_kernel_cat: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))

    def add_collective_kernels(self, names, escaped: bool) -> None:
        """Kernel names (as the text holds them) whose events carry a collective's metadata."""
        self.collective_kernels.update(json.loads(f'"{n}"') if escaped and "\\" in n else n for n in names)
    op_types: dict[tuple[str, str], int] = field(default_factory=dict)  # (matrix op, precision) -> calls

    def add_op_types(self, rows) -> None:
        """Count (operator name, ``Input type`` text) rows of matrix operators by their precision."""
        for name, types in rows:
            prec = op_precision(types)
            if prec is not None:
                self.op_types[name, prec] = self.op_types.get((name, prec), 0) + 1

    def _name_ids(self, names) -> np.ndarray:
        table = self.names
        before = len(table)
        ids = np.fromiter(map(table.__getitem__, names), dtype=np.int32, count=len(names))
        if len(table) > before:
            new = [_is_marker(n) for n in islice(table, before, None)]
            self.is_step = np.concatenate([self.is_step, np.array(new, bool)])
            self.saw_step = self.saw_step or any(new)
        return ids

    def add_text(self, rows: list[tuple[str, ...]], escaped: bool) -> None:
        """Rows of (cat, name, 'pid, "tid": tid', ts, dur) as the text holds them (ts, dur in microseconds);
        ``escaped``: the text has a backslash somewhere (a name may need unescaping)."""
        if not rows:
            return
        cat, name, pidtid, ts, dur = zip(*rows)
        if escaped:
            name = tuple(json.loads(f'"{n}"') if "\\" in n else n for n in name)
        raw = self.raw_threads
        for key in set(pidtid).difference(raw):
            raw[key] = self.threads[_thread_key(key)]
        tids = np.fromiter(map(raw.__getitem__, pidtid), dtype=np.int32, count=len(pidtid))
        self._store(cat, name, tids, np.array(ts, dtype=np.float64), np.array(dur, dtype=np.float64))

    def add_dicts(self, events: list) -> None:
        """Events as decoded dicts; only complete ("X") events with a ts and a dur are kept."""
        cat, name, tids, ts, dur = [], [], [], [], []
        threads = self.threads
        for e in events:
            if not isinstance(e, dict) or e.get("ph") != "X":
                continue
            t, d = e.get("ts"), e.get("dur")
            if not isinstance(t, (int, float)) or not isinstance(d, (int, float)) or isinstance(t, bool) or (
                    isinstance(d, bool)):
                continue
            c, n = str(e.get("cat", "")), str(e.get("name", ""))
            if c in ("kernel", "Kernel") and isinstance(e.get("args"), dict) and "Collective name" in e["args"]:
                self.collective_kernels.add(n)
            if n in MATRIX_OPS and isinstance(e.get("args"), dict) and isinstance(e["args"].get("Input type"), list):
                self.add_op_types([(n, json.dumps(e["args"]["Input type"]))])
            cat.append(c)
            name.append(n)
            tids.append(threads[(json.dumps(e.get("pid")), json.dumps(e.get("tid")))])
            ts.append(t)
            dur.append(d)
        if cat:
            self._store(cat, name, np.array(tids, dtype=np.int32), np.array(ts, dtype=np.float64),
                        np.array(dur, dtype=np.float64))

    def _store(self, cat, name, tids, ts_us, dur_us) -> None:
        # NaN fails every comparison: one pass refuses NaN, infinities, negative durations and times out of range
        ok = (np.abs(ts_us) <= MAX_TIME_US) & (dur_us >= 0) & (dur_us <= MAX_TIME_US)
        if not ok.all():
            self._bad_time(int(np.argmin(ok)), name, ts_us, dur_us)
        cats = self.cats
        before = len(cats), len(self.names)
        cid = np.fromiter(map(cats.__getitem__, cat), dtype=np.int32, count=len(cat))
        names = self._name_ids(name)
        for table, n0, what in ((cats, before[0], "category"), (self.names, before[1], "name")):
            if len(table) > n0:  # only the strings new in this batch are measured
                longest = max(map(len, islice(reversed(table), len(table) - n0)))
                if longest > MAX_STRING_CHARS:
                    raise _BadValue(f"an event {what} is {longest:,} characters long (more than "
                                    f"{MAX_STRING_CHARS >> 20} MiB; no profiler writes one that long): the file is "
                                    "corrupt or was not written by torch.profiler; pass the .pt.trace.json "
                                    "torch.profiler wrote, unchanged")
        if len(cats) > np.iinfo(np.int16).max:
            raise _BadValue(f"the events have more than {np.iinfo(np.int16).max:,} categories (torch.profiler "
                            "writes about a dozen): the file is corrupt or was not written by torch.profiler; "
                            "pass the .pt.trace.json torch.profiler wrote, unchanged")
        ts_ns = np.rint(ts_us * 1000.0).astype(np.int64)
        dur_ns = np.rint(dur_us * 1000.0).astype(np.int64)
        part = (ts_ns, dur_ns, names, cid.astype(np.int16), tids)
        steps = self.is_step[names]
        if steps.any():
            self.step_parts.append(tuple(c[steps] for c in part))
        counts = np.bincount(cid, minlength=len(cats))
        counts[:len(self.cat_counts)] += self.cat_counts
        self.cat_counts = counts
        self._add_stream_kernels(cid, names, tids, dur_ns)
        self.events += len(cat)
        try:
            if self.spill is None and self.events > SPILL_EVENTS:
                self.spill = Spill()
                for old in self.parts:
                    self.spill.write(*old)
                self.parts = []
            if self.spill is not None:
                self.spill.write(*part)
            else:
                self.parts.append(part)
        except OSError as exc:  # no room in $TMPDIR
            raise _SpillFailed(exc) from None

    def _add_stream_kernels(self, cid: np.ndarray, names: np.ndarray, tids: np.ndarray, dur_ns: np.ndarray) -> None:
        """Add the batch's kernel time per (thread, name): a kernel's thread is its device and stream."""
        if len(self.is_kernel_cat) < len(self.cats):
            self.is_kernel_cat = np.array([c in ("kernel", "Kernel") for c in self.cats], bool)
        rows = np.flatnonzero(self.is_kernel_cat[cid])
        if not len(rows):
            return
        key = (tids[rows].astype(np.int64) << 32) | names[rows].astype(np.int64)
        uniq, inv = np.unique(key, return_inverse=True)
        ns = np.bincount(inv, weights=dur_ns[rows].astype(np.float64))
        calls = np.bincount(inv)
        table = self.stream_kernels
        for k, t, c in zip(uniq.tolist(), ns.tolist(), calls.tolist()):
            acc = table.setdefault((k >> 32, k & 0xFFFFFFFF), [0, 0])
            acc[0] += int(t)
            acc[1] += int(c)

    def _bad_time(self, i: int, name, ts_us: np.ndarray, dur_us: np.ndarray):
        """Raise the :class:`_BadValue` for row ``i`` of a batch, the first whose ts or dur is refused."""
        def spelled(x: float) -> str:  # as the JSON holds it (Python's json module reads NaN and Infinity)
            if x != x:
                return "NaN"
            if abs(x) == float("inf"):
                return "Infinity" if x > 0 else "-Infinity"
            return f"{x:g}"

        ts, dur = float(ts_us[i]), float(dur_us[i])
        if not abs(ts) <= MAX_TIME_US:
            field = f"ts={spelled(ts)}"
        elif dur < 0:
            field = f"a negative duration, dur={spelled(dur)}"
        else:
            field = f"dur={spelled(dur)}"
        shown = str(name[i])
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        raise _BadValue(f"complete event {self.events + i + 1:,} ({shown!r}) has {field}: the file is corrupt or was "
                        "not written by torch.profiler, which writes finite times (microseconds, |ts| up to "
                        f"{MAX_TIME_US:.0e}) and durations of 0 or more; profile again, or pass the .pt.trace.json "
                        "torch.profiler wrote, unchanged")

    def _events(self, columns: tuple[np.ndarray, ...], names: list, cats: list, threads: list) -> _Events:
        ts, dur, name, cat, thread = columns
        return _Events(ts, dur, ts + dur, name, cat, thread, names, cats, threads)

    def step_events(self, names: list, cats: list, threads: list) -> _Events:
        """The spans that mark steps (any category or thread), as :class:`_Events` over the given tables."""
        return self._events(_join(self.step_parts), names, cats, threads)

    def windows(self, names: list, cats: list, threads: list):
        """Yield ``(events, wlo, whi)``: all the events in one window when they are in memory, else the spill's
        windows of about :data:`WINDOW_EVENTS` events (:meth:`~helpers.traces.kineto_spill.Spill.windows`)."""
        if self.spill is None:
            columns, self.parts = _join(self.parts), []
            yield self._events(columns, names, cats, threads), -(1 << 62), 1 << 62
            return
        for columns, wlo, whi in self.spill.windows(WINDOW_EVENTS):
            yield self._events(columns, names, cats, threads), wlo, whi

    def discard(self) -> None:
        """Remove the spill, if any (the read is over, or restarts)."""
        if self.spill is not None:
            self.spill.close()


def _join(parts: list[tuple[np.ndarray, ...]]) -> tuple[np.ndarray, ...]:
    """ts_ns, dur_ns (int64), name id (int32), category id (int16), thread id (int32), concatenated."""
    if not parts:
        return (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int16),
                np.zeros(0, np.int32))
    columns = [list(c) for c in zip(*parts)]
    parts.clear()
    out = []
    for i, chunks in enumerate(columns):  # one column at a time: its chunks are freed as it is joined
        out.append(np.concatenate(chunks))
        columns[i] = None
    return tuple(out)


# ------------------------------------------------------------------------------------------------ the parser


class _Parser:
    """One pass over the file: the top-level object, its metadata and its event array."""

    def __init__(self, path: Path, progress: Progress | None, *, fast: bool) -> None:
        self.path, self.progress, self.fast = path, progress, fast
        self.total = path.stat().st_size
        self.raw = open(path, "rb")
        gz = self.raw.read(2) == b"\x1f\x8b"
        self.gz = gz
        self.gzfile = gzip.GzipFile(fileobj=self.raw) if gz else None
        # the uncompressed size the memory check assumed (memory_needed_mib): ISIZE, at least 8x the file
        self.isize = 0
        if gz and self.total >= 18:
            self.raw.seek(self.total - 4)
            self.isize = int.from_bytes(self.raw.read(4), "little")
        self.gz_checked = max(self.isize, 8 * self.total)
        self.raw.seek(0)
        self.text = io.TextIOWrapper(self.gzfile if gz else self.raw, encoding="utf-8")
        self.buf, self.pos, self.eof = "", 0, False
        self.cols = _Columns()
        self.meta: dict[str, Any] = {}
        self.meta_chars = 0
        self.last_chars = 0  # characters of the value value() returned last
        self.fast_chunks = 0
        self.fallback_chunks = 0
        self._last_progress = 0.0

    def close(self) -> None:
        self.text.close()
        self.raw.close()

    # -- reading
    def _fail(self, what: str, todo: str) -> TraceError:
        return TraceError(f"{self.path}: {what}; {todo}")

    def _truncated(self) -> TraceError:
        return self._fail("the file ends early, in the middle of the trace (probably the run was killed while the "
                          "profiler was writing it)", "profile again and let the run end (or the profiler's "
                          "context exit) before copying the file")

    def fill(self) -> bool:
        """Read one more chunk into the buffer (dropping what was consumed); False at the end of the file."""
        if self.eof:
            return False
        try:
            more = self.text.read(CHUNK_CHARS)
        except EOFError:
            raise self._truncated() from None
        except (gzip.BadGzipFile, zlib.error) as exc:
            raise self._fail(f"the gzip data is corrupt ({exc})", "copy the file again, or gunzip -t it to check "
                             "it") from None
        except UnicodeDecodeError as exc:
            raise self._fail(f"byte {exc.start} of a chunk is not UTF-8 text, so this is not a JSON trace",
                             "pass the .pt.trace.json (or .json.gz) file torch.profiler wrote") from None
        if self.gzfile is not None and more:
            self._check_gzip()
        self.buf = self.buf[self.pos:] + more
        self.pos = 0
        if not more:
            self.eof = True
        self._report()
        return bool(more)

    def _check_gzip(self) -> None:
        """Refuse a gzip that expands like a bomb, or whose text outgrows the memory the check before the read
        allowed (its ISIZE trailer is the size modulo 4 GiB, so the text may be ISIZE + k * 4 GiB)."""
        out, into = self.gzfile.tell(), max(self.raw.tell(), 1)
        if out > GZIP_RATIO_AFTER and out > MAX_GZIP_RATIO * into:
            raise self._fail(f"the gzip expands more than {MAX_GZIP_RATIO}-fold ({into / 1e6:,.1f} MB of it gave "
                             f"{out / 1e6:,.0f} MB of text so far; torch.profiler's traces compress 10-30-fold), so "
                             "it is not a profiler's trace and reading on could exhaust memory",
                             "pass the .pt.trace.json.gz torch.profiler wrote; if this is one, gunzip it and pass the "
                             ".json")
        if out > self.gz_checked:
            grown = self.isize + ((out - self.isize) // (1 << 32) + 1) * (1 << 32)
            need, free, where = _disk_needed(grown)
            if need > free:
                raise self._fail(f"the gzip holds more text than the {self.gz_checked / 1e9:.1f} GB the disk check "
                                 f"assumed ({out / 1e9:.1f} GB read so far; its trailer gives the size modulo 4 GiB, "
                                 f"so it holds at least {grown / 1e9:.1f} GB), and reading that needs about "
                                 f"{need / 1e9:.1f} GB of disk in {where} with {free / 1e9:.1f} GB free",
                                 "set TMPDIR to a folder with room, or record fewer steps "
                                 "(torch.profiler.schedule(active=...))")
            self.gz_checked = grown

    def _report(self, final: bool = False) -> None:
        if self.progress is None:
            return
        now = time.monotonic()
        if final or now - self._last_progress >= PROGRESS_EVERY_S:
            self._last_progress = now
            done = self.total if final else min(self.raw.tell(), self.total)
            self.progress(done, self.total)

    def skip_ws(self) -> str:
        """Skip whitespace; the next character ("" at the end of the file)."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self.fill():
                return ""

    def expect(self, ch: str, what: str) -> None:
        got = self.skip_ws()
        if got != ch:
            if got == "":
                raise self._truncated()
            raise self._fail(f"expected {what} at character {self.pos} of the text, found {got!r}",
                             "pass the JSON file torch.profiler wrote, unchanged")
        self.pos += 1

    def value(self) -> Any:
        """One JSON value at the current position, reading more of the file as needed."""
        self.skip_ws()
        while True:
            try:
                v, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                at = exc.pos - self.pos  # in the value (fill() moves the value to the start of the buffer)
                cut = exc.msg.startswith("Unterminated string")
                # the value runs into the end of the text read (a cut token is reported at its start: "-Infinity")
                if (cut or exc.pos >= len(self.buf.rstrip()) - 32) and not self.eof:
                    if self.fill() and len(self.buf) - self.pos <= MAX_EVENT_CHARS:
                        continue
                    if not self.eof:  # the buffer outgrew the limit and the value goes on
                        raise self._fail(f"{'a string' if cut else 'one JSON value'} in the trace runs on for more "
                                         f"than {MAX_EVENT_CHARS >> 20} MiB (torch.profiler's events are a few hundred "
                                         "bytes), so the file is corrupt or was not written by torch.profiler",
                                         "pass the .pt.trace.json torch.profiler wrote, unchanged") from None
                if self.eof and (cut or self.pos + at >= len(self.buf.rstrip())):
                    raise self._truncated() from None  # the value runs into the end of the file
                raise self._fail(f"not valid JSON near character {at} of a value ({exc.msg})",
                                 "pass the JSON file torch.profiler wrote, unchanged") from None
            except RecursionError:
                raise self._too_deep() from None
            except ValueError as exc:  # e.g. an integer of more than 4,300 digits (sys.set_int_max_str_digits)
                raise self._fail(f"a value in the trace cannot be decoded ({exc})", "pass the .pt.trace.json "
                                 "torch.profiler wrote, unchanged") from None
            if end == len(self.buf) and not self.eof and self.fill():
                continue  # a number or literal may go on in the next chunk
            self.last_chars = end - self.pos
            self.pos = end
            return v

    def _too_deep(self) -> TraceError:
        # json's decoder recurses once per level and stops at the interpreter's recursion limit (RecursionError,
        # after ~1,000 levels: a few hundred KB of stack and no more memory), so the nesting costs nothing to refuse
        return self._fail(f"arrays or objects in the trace are nested more than ~{sys.getrecursionlimit():,} levels "
                          "deep (torch.profiler's events nest 3 or 4), so the file is corrupt or was not written by "
                          "torch.profiler", "pass the .pt.trace.json torch.profiler wrote, unchanged")

    # -- the top level
    def run(self) -> None:
        first = self.skip_ws()
        if first == "":
            raise self._fail("the file holds only whitespace", "pass a trace written by torch.profiler")
        if first != "{":
            hint = (" (a bare JSON array of events: torch.profiler writes an object with traceEvents)"
                    if first == "[" else "")
            raise self._fail(f"this is not a JSON object (it starts with {first!r}){hint}",
                             "pass the .pt.trace.json file torch.profiler wrote")
        self.pos += 1
        seen_events = False
        while True:
            ch = self.skip_ws()
            if ch == "}":
                self.pos += 1
                break
            if ch == ",":
                self.pos += 1
                continue
            if ch == "":
                raise self._truncated()
            if ch != '"':
                raise self._fail(f"expected a key at character {self.pos}, found {ch!r}",
                                 "pass the JSON file torch.profiler wrote, unchanged")
            key = self.value()
            self.expect(":", "':'")
            if key == "traceEvents":
                self.events()
                seen_events = True
            else:
                self.meta[key] = self.value()
                self.meta_chars += self.last_chars
                if self.meta_chars > MAX_META_CHARS:
                    raise self._fail(f"the metadata beside traceEvents runs to more than {MAX_META_CHARS >> 20} MiB "
                                     f"({len(self.meta):,} keys; torch.profiler writes a few KB of it), so the file "
                                     "is corrupt or was not written by torch.profiler", "pass the .pt.trace.json "
                                     "torch.profiler wrote, unchanged")
        if not seen_events:
            raise self._fail("this JSON has no traceEvents array, so it is not a profiler trace (keys: "
                             f"{', '.join(list(self.meta)[:8]) or 'none'})",
                             "pass the .pt.trace.json file torch.profiler's tensorboard_trace_handler or "
                             "export_chrome_trace wrote")
        self._report(final=True)

    def events(self) -> None:
        if self.skip_ws() != "[":
            raise self._fail("traceEvents is not an array", "pass the JSON file torch.profiler wrote, unchanged")
        self.pos += 1
        pending: list = []
        pending_chars = 0
        fast = self.fast
        while True:
            if fast:
                if self._fast_chunk():
                    self._early_check()
                    continue
                fast = False  # the rest of the file is short: the exact path reads it
            ch = self.skip_ws()
            if ch == "]":
                self.pos += 1
                break
            if ch == ",":
                self.pos += 1
                continue
            if ch == "":
                raise self._truncated()
            pending.append(self.value())
            pending_chars += self.last_chars
            if len(pending) >= PENDING_EVENTS or pending_chars >= PENDING_CHARS:
                self.cols.add_dicts(pending)
                pending, pending_chars = [], 0
                self._early_check()
        self.cols.add_dicts(pending)

    def _early_check(self) -> None:
        if not self.cols.saw_step and self.cols.events >= EARLY_NO_STEP_EVENTS:
            raise _no_steps(self.path, early=self.cols.events)

    def _fast_chunk(self) -> bool:
        """Read the complete events of the next chunk with the expressions; False where the rest is for the exact
        path (the last chunk, which holds the end of the array)."""
        while len(self.buf) - self.pos < CHUNK_CHARS and not self.eof:
            self.fill()
        k = self.buf.rfind('"ph"', self.pos)
        cut = self.buf.rfind("{", self.pos, k) if k > 0 else -1
        if cut - self.pos < (CHUNK_CHARS // 8 if self.eof else 1):
            return False  # the rest is short: the exact path reads it, the end of the array and what follows
        chunk = self.buf[self.pos:cut]
        rows = _X.findall(chunk)
        # every complete event has the value "X" once (its "ph"), however it is spaced; a match for each
        trusted = chunk.count('"X"') == len(rows)
        if trusted:
            try:
                self.cols.add_text(rows, "\\" in chunk)
                if '"Collective name"' in chunk:
                    self.cols.add_collective_kernels(_COLL_KERNEL.findall(chunk), "\\" in chunk)
            except ValueError:  # a ts or dur that is not a number: not Kineto's layout after all
                trusted = False
            else:
                self.cols.add_op_types(_OP_TYPES.findall(chunk))
        if trusted:
            self.fast_chunks += 1
        else:
            # json.loads in pieces cut like the chunk, so that the dicts of at most JSON_PIECE_CHARS of text (up to
            # ~24 bytes a character for "[{},{},...]") are alive at once, and a failing piece stops early
            start = 0
            while start < len(chunk):
                end = len(chunk)
                if end - start > JSON_PIECE_CHARS:
                    k = chunk.rfind('"ph"', start, start + JSON_PIECE_CHARS)
                    c = chunk.rfind("{", start, k) if k > start else -1
                    end = c if c > start else end
                body = chunk[start:end].strip().rstrip(",")
                try:
                    events = json.loads(f"[{body}]")
                except RecursionError:
                    raise self._too_deep() from None
                except ValueError:  # JSONDecodeError, or an integer too long to convert: the exact path says which
                    raise _Restart() from None
                del body
                self.cols.add_dicts(events)
                del events
                start = end
            self.fallback_chunks += 1
        self.pos = cut
        return True


def _precheck(path: Path) -> None:
    """The errors that need no parse: a missing or empty file, and a plain file whose end is not a JSON object's."""
    if not path.exists():
        raise TraceError(f"{path}: no such file; pass the path of a .pt.trace.json written by torch.profiler")
    if path.is_dir():
        raise TraceError(f"{path}: is a folder; pass one .pt.trace.json file of it (the trace command reads "
                         "folders)")
    size = path.stat().st_size
    if size == 0:
        raise TraceError(f"{path}: the file is empty (0 bytes): the profiler wrote nothing, or the copy failed; "
                         "profile again and let the profiler's context exit before copying the file")
    _check_memory(path, size)
    _check_disk(path, size)
    with open(path, "rb") as raw:
        head = raw.read(64)
        if head[:2] == b"\x1f\x8b":
            return  # a gzip's end is known only once decompressed
        raw.seek(max(0, size - 4096))
        tail = raw.read().rstrip()
    if head.lstrip().startswith(b"{") and not tail.endswith(b"}"):
        raise TraceError(f"{path}: the file ends early, in the middle of the trace (its last bytes are "
                         f"{tail[-40:].decode('utf-8', 'replace')!r}; probably the run was killed while the "
                         "profiler was writing it); profile again and let the run end before copying the file")


def text_bytes(path, size: int | None = None) -> int:
    """The trace's text size, bytes: the file's, or a gzip's uncompressed size from its trailer (ISIZE, the size
    modulo 4 GiB, RFC 1952), taken as at least 8 times the compressed size (a JSON trace compresses about 10x),
    since the trailer wraps above 4 GiB."""
    p = Path(path)
    size = p.stat().st_size if size is None else size
    with open(p, "rb") as raw:
        gz = raw.read(2) == b"\x1f\x8b"
        if gz and size >= 18:
            raw.seek(size - 4)
            size = max(int.from_bytes(raw.read(4), "little"), 8 * size)
    return size


def memory_needed_mib(path, size: int | None = None) -> float:
    """The reader's expected peak memory for a trace file, MiB: :data:`BASE_MIB` plus :data:`MIB_PER_TRACE_MB` per
    MB of text, up to :data:`PEAK_CAP_MIB` (past :data:`SPILL_EVENTS` events the columns go to disk)."""
    return BASE_MIB + min(MIB_PER_TRACE_MB * text_bytes(path, size) / 1e6, PEAK_CAP_MIB)


def _disk_needed(text: int) -> tuple[float, float, str]:
    """(bytes of disk a trace of ``text`` bytes may spill, bytes free there, the folder): ``$TMPDIR``'s."""
    import shutil
    import tempfile

    where = tempfile.gettempdir()
    return DISK_PER_TRACE_BYTE * text, float(shutil.disk_usage(where).free), where


def _check_disk(path: Path, size: int) -> None:
    """Refuse, before the read, a large trace whose spilled columns would not fit in ``$TMPDIR``."""
    text = text_bytes(path, size)
    if text <= DISK_CHECK_AFTER:
        return
    need, free, where = _disk_needed(text)
    if need > free:
        raise TraceError(f"{path}: reading this {text / 1e9:.1f} GB trace keeps its events on disk, about "
                         f"{need / 1e9:.1f} GB in {where} ({DISK_PER_TRACE_BYTE} bytes per byte of trace), and "
                         f"{free / 1e9:.1f} GB are free there; set TMPDIR to a folder with room, or record fewer "
                         "steps (torch.profiler.schedule(active=...))")


def _check_memory(path: Path, size: int) -> None:
    """Refuse, before the read, a trace whose columns would not fit in the memory available now."""
    import psutil

    need = memory_needed_mib(path, size)
    free = psutil.virtual_memory().available / 2**20
    if need > MEMORY_SHARE * free:
        text = text_bytes(path, size)  # a gzip's text, as its trailer gives it
        what = (f"{size / 1e9:.1f} GB trace" if abs(text - size) < 1e6 else
                f"{size / 1e9:.2f} GB gzip (of {text / 1e9:.1f} GB of text, its trailer says)")
        raise TraceError(f"{path}: reading this {what} needs about {need / 1024:.1f} GiB of memory "
                         f"({MIB_PER_TRACE_MB} MiB per MB of trace up to {PEAK_CAP_MIB:.0f} MiB, measured by "
                         "`python -m helpers bench trace`) and "
                         f"{free / 1024:.1f} GiB are available; free memory, read it on a larger machine, or record "
                         "fewer steps (torch.profiler.schedule(active=...)) or one rank's file at a time")


def _parse(path: Path, progress: Progress | None) -> _Parser:
    """Parse the file (the fast path, else again with the exact one); the caller discards the columns' spill."""
    for fast in (True, False):
        parser = _Parser(path, progress, fast=fast)
        ok = False
        try:
            parser.run()
            ok = True
            return parser
        except _Restart:
            continue
        except _BadValue as exc:
            raise TraceError(f"{path}: {exc}") from None
        except _SpillFailed as exc:
            raise _spill_failed(path, exc.args[0]) from None
        finally:
            parser.close()
            if not ok:
                parser.cols.discard()
    raise AssertionError("the exact path does not restart")  # pragma: no cover


def read_kineto(path, *, progress: Progress | None = None) -> RankTrace:
    """Read one Kineto trace (``.json`` or ``.json.gz``) into a :class:`~helpers.traces.model.RankTrace`.

    Parameters
    ----------
    path : str or pathlib.Path
        The ``*.pt.trace.json`` (or ``.json.gz``) torch.profiler wrote.
    progress : callable, optional
        ``progress(done, total)`` with bytes of the file read and its size (compressed bytes for a gz), called at
        most every 0.25 s and once at the end (:data:`helpers.live.Progress`).

    Returns
    -------
    RankTrace
        ``format`` "kineto"; one :class:`StepPhases` per ``ProfilerStep#N`` span (without them, per step marked
        by the optimizer's or the DataLoader's spans: :mod:`~helpers.traces.kineto_phases`), in order, times in
        seconds (the module's docstring says what each phase is read from); ``top_ops`` self times in ms.

    Raises
    ------
    TraceError
        Naming the file, what is missing and what to do: a missing, empty or truncated file (checked before
        the parse where the file is not gzipped), a corrupt gzip, text that is not JSON, JSON without
        ``traceEvents``, a trace with no ``ProfilerStep#N``, ``Optimizer.step#`` or DataLoader ``__next__`` span.
    """
    p = Path(path)
    _precheck(p)
    parser = _parse(p, progress)
    cols = parser.cols
    try:
        if not cols.saw_step:
            raise _no_steps(p)
        names, cats, threads = list(cols.names), [_OLD_CATS.get(c, c) for c in cols.cats], list(cols.threads)
        has_device = bool(sum(int(n) for c, n in zip(cats, cols.cat_counts.tolist()) if c in _DEVICE_CATS))
        return _analyse(p, parser, cols.step_events(names, cats, threads), cols.windows(names, cats, threads),
                        has_device=has_device, events=cols.events)
    except OSError as exc:
        raise _spill_failed(p, exc) from None
    finally:
        cols.discard()


def _spill_failed(path: Path, exc: OSError) -> TraceError:
    import tempfile

    return TraceError(f"{path}: keeping the trace's events on disk in {tempfile.gettempdir()} failed ({exc}); set "
                      "TMPDIR to a folder with room (about "
                      f"{DISK_PER_TRACE_BYTE * text_bytes(path) / 1e9:.1f} GB), or record fewer steps")

