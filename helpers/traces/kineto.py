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

The whole reader (``python -m helpers bench trace``: a 1,024 MB CUDA-shaped trace of 3.95 M events in torch's
layout, read in a child process, never on a quiet machine): 16.1 s, 63.5 MB/s, peak RSS 377 MiB at load average
4-5 from other agents; 22.4 s, 45.6 MB/s, 388 MiB in a run where other processes took 65% of the two cores;
35 MiB of the peak is the interpreter and numpy; the phases of all 50 steps equal to the constructed ones. Memory is
the 8 MB text buffer, 26 bytes per complete event in the columns and the analysis' arrays over them: about
0.35 MiB per MB of trace at the peak, so a 10 GB trace needs about 3.5 GiB (``json.load`` would need ~40 GiB):
the peak is bounded by 512 MiB only up to traces of about 1.2 GB. Before a read, :func:`memory_needed_mib` estimates
the peak, and a trace that would not fit in the memory available is refused with the figures, before any work.
The exact path alone (a 195 MB trace written with sorted keys, load average 4.4) read 10.5 MB/s, 184 MiB.

What each phase of a :class:`~helpers.traces.model.StepPhases` is read from, per ``ProfilerStep#N`` span (the
step: on the thread that holds most of those annotations; the step number is N):

- ``data``: the DataLoader's ``__next__`` spans (torch names them ``enumerate(DataLoader)#<iterator class>.__next__``,
  e.g. ``_SingleProcessDataLoaderIter`` or ``_MultiProcessingDataLoaderIter``) inside the step, as a union; on a
  trace that records a device, only the part of them during which the device runs nothing (work already queued
  hides the rest of the wait). This is how the TensorBoard plugin counts its step's "DataLoader" time (its
  overview gives each instant to the first of Kernel, Memcpy, Memset, Runtime, DataLoader, CPU Exec, Other:
  ``tb_plugin/torch_tb_profiler/profiler/overall_parser.py``), and its expected answers for its resnet50 samples
  are met (tests/test_trace_public.py).
- ``h2d``: on a trace that records a device, the device's own host-to-device copy time (``Memcpy HtoD`` events)
  not overlapped by its kernels: the copy the step waits for. The host's wait for a copy (a pageable
  ``cudaMemcpyAsync`` that blocks, a ``cudaStreamSynchronize`` after it) is not the copy: on a real 8-rank NCCL
  job the "copy" the host waited 6.6 ms in was a ``cudaStreamSynchronize`` behind a SendRecv kernel, for a 1 us
  copy. On a CPU-only trace, the copy ops (``aten::to``, ``aten::_to_copy``, ``aten::copy_``) that are the step's
  direct children right after its last DataLoader span (notebook 01's ``job.to_device``); a ``.to("cpu")`` of
  such a loop returns the same tensor, so ``h2d`` there is the time of any real conversion, usually near 0.
- ``sync_wait``, ``sync_on``: the training thread's time in blocking runtime calls (``cudaStreamSynchronize``,
  ``cudaDeviceSynchronize``, ``cudaEventSynchronize``, a synchronous ``cudaMemcpy``, their HIP twins), split by
  what the device did meanwhile: communication kernels, computing kernels, copies, or nothing.
- ``compute`` on a CPU trace: the training thread's recorded operators outside data and copy (measured, never
  "the rest of the step"); ``other``: the step's remaining time that is not exposed communication (the thread's
  gaps between operators: Python, the framework).
- categories: PyTorch 1.8-1.9 wrote ``Operator``, ``Kernel``, ``Runtime``, ``Memcpy``, ``Memset`` (the TensorBoard
  plugin's samples), read as ``cpu_op``, ``kernel``, ``cuda_runtime``, ``gpu_memcpy``, ``gpu_memset``.
- ``optimizer``: ``Optimizer.step#...`` and ``Optimizer.zero_grad#...`` spans (torch's optimizer hooks), union.
- ``compute``, ``idle``, ``comm``, ``comm_exposed`` (CUDA): as HolisticTraceAnalysis defines its temporal
  breakdown (facebookresearch/HolisticTraceAnalysis, ``hta/analyzers/breakdown_analysis.py``,
  ``_get_idle_time_for_kernels``: "idle time = kernel time - merged execution time of all kernels", every GPU
  event counted; ``hta/utils/utils.py``: a communication kernel has ``nccl`` in its name, a memory event is a
  ``Memcpy``/``Memset``, every other kernel computes), with the step's span in place of HTA's first-to-last kernel
  window: ``idle`` = step span minus the union of all device events in it, ``compute`` = the union of the computing
  kernels, ``comm`` = the union of the NCCL kernels, ``comm_exposed`` = NCCL time not overlapped by any computing
  kernel. The step span is the host's; device work lags the host by its launch queue, so a step's device times
  are those of the work that ran while the host was in that step.
- ``comm``, ``comm_exposed`` on a CPU trace (gloo): what a real DDP step looks like, read from two gloo ranks
  (torch 2.13, ``torch.multiprocessing``, a 64-256-1 MLP, ``schedule(wait=1, warmup=1, active=3)``, rank 1
  sleeping 20 ms per step): the training thread runs forward and backward; in backward the DDP reducer's
  ``torch::distributed::reducer::mul_out`` ops precede one ``c10d::allreduce_`` op (~0.1 ms: it only queues the
  bucket); the collective itself is a ``gloo:all_reduce`` user annotation on one of gloo's own threads (named
  ``pt_gloo_runloop``), which starts as soon as it is queued; no ``record_param_comms`` op appears on CPU. The
  training thread then records nothing at all for as long as it waits (DDP's reducer waits for the bucket in the
  backward pass's final callback): on the fast rank a 22 ms gap, after which it runs
  ``torch.distributed.ddp.reducer::copy_bucket_to_grad`` and ``Optimizer.step#SGD.step``. So ``comm`` = the union
  of the ``gloo:*`` spans in the step, and ``comm_exposed`` = the part of them during which the training thread
  ran no op: a rank that waits for a slow peer shows the wait there (22 ms of its 24 ms step on the fast rank,
  ~0.9 ms on the slow one). Caveat seen in that trace: a ``gloo:all_reduce`` span can end late, when the next
  collective is queued (1.6-2.2 ms after the training thread went on), so ``comm`` can run over by that much,
  and ``comm_exposed`` by the gaps between the thread's ops in that time.
- ``device_kind``: the device named as it is: "mtia" (``mtia_*`` categories), "xpu" (``xpu_runtime``), "npu" or
  "privateuse1" (``privateuse1_*``), "rocm" (an AMD device in ``deviceProperties`` or ``hip*`` runtime calls), else
  "cuda" when the trace holds device events (kernels, memcpy, memset), else "cpu" (also when
  ``deviceProperties`` lists a GPU but ``ProfilerActivity.CUDA`` was not recorded, which ``limits`` says).
- ``collectives``: each NCCL/RCCL kernel (a CPU trace: each ``gloo:*`` span) starting inside a step, with its
  duration: the input of :mod:`helpers.traces.arrival`.
- ``rank``, ``world_size``: ``distributedInfo``. ``run_id``: the backend, world size and a digest of
  ``pg_config`` (equal on every rank of a run). Two runs of the same configuration share it; they are told apart
  by their start times (``provenance``'s ``start_unix_s``, the UTC start of the first profiled step:
  ``baseTimeNanoseconds`` + its ``ts``), which :mod:`helpers.traces.cluster` compares with a tolerance (ranks of
  one run start their profiled steps within milliseconds of one another). ``trace_id`` is not used: it differs on
  every rank.
- ``node``: the trace's ``host_name``, else the host of the tensorboard handler's default file name
  (``{hostname}_{pid}.{time}.pt.trace.json``) where the name follows that pattern, else unknown (None): a name
  like ``rank-3.json`` says nothing about the host, and 8 ranks on one host are not 8 nodes.
- ``top_ops``: the 20 largest by self time: host ops (``cpu_op``, ``user_annotation``, ``python_function``, CUDA
  runtime calls; self = duration minus the direct children's, nesting per thread) and device events (kernels,
  memcpy, memset; self = duration), within the profiled steps.
"""

from __future__ import annotations

import datetime as _dt
import gzip
import hashlib
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
from helpers.traces.model import RankTrace, StepPhases, TraceError

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
#: Ops reported in ``top_ops``.
TOP_OPS = 20
#: Peak memory of the reader per MB of uncompressed trace, MiB, and its fixed part (the interpreter, numpy, the
#: 8 MB text buffer): ``python -m helpers bench trace`` on a 1,024 MB trace peaked at 377-388 MiB (0.37-0.38 MiB
#: per MB with the fixed ~35 MiB); the events are kept as columns, so the peak grows with the trace.
MIB_PER_TRACE_MB = 0.40
BASE_MIB = 40.0
#: Share of the memory available now that a read may plan to take before it is refused up front.
MEMORY_SHARE = 0.8

_STEP = re.compile(r"ProfilerStep#(\d+)")
_COPY_OPS = frozenset({"aten::to", "aten::_to_copy", "aten::copy_"})
_HOST_CATS = frozenset({"cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver",
                        "privateuse1_runtime", "privateuse1_driver", "xpu_runtime", "mtia_runtime"})
#: Host categories the phases read (python_function spans of with_stack=True enclose whole steps).
_PHASE_CATS = frozenset({"cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "privateuse1_runtime",
                         "privateuse1_driver", "xpu_runtime", "mtia_runtime"})
#: Device activity: CUDA/ROCm/XPU kernels and copies, and MTIA's command-processor events.
_DEVICE_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "mtia_ccp_events"})
#: PyTorch 1.8-1.9 (Kineto schema of the TensorBoard plugin's samples) named the categories otherwise; read as
#: today's names (``Operator`` also holds the ``ProfilerStep#N`` and DataLoader spans then).
_OLD_CATS = {"Operator": "cpu_op", "Kernel": "kernel", "Runtime": "cuda_runtime", "Driver": "cuda_driver",
             "Memcpy": "gpu_memcpy", "Memset": "gpu_memset", "Python": "python_function"}
#: Host calls that block until the device has done its work (CUDA and HIP runtime names): the host's wait in
#: them is ``sync_wait``, attributed to what the device did meanwhile.
_SYNC_CALLS = frozenset({"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
                         "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize",
                         "hipStreamSynchronize", "hipDeviceSynchronize", "hipEventSynchronize", "hipMemcpy",
                         "hipMemcpyWithStream"})
#: Communication kernels: HTA's rule (``nccl`` in the name, ``hta/utils/utils.py``) with ROCm's RCCL, which
#: names its kernels ``ncclDevKernel...`` as well, and Ascend's HCCL.
_COMM_WORDS = ("nccl", "rccl", "hccl")

# One complete event as Kineto writes it (any whitespace between the keys).
_X = re.compile(r'"ph": "X",\s*"cat": "([^"\\]*)",\s*"name": "([^"\\]*(?:\\.[^"\\]*)*)",\s*"pid": ([^,]*,'
                r'\s*"tid": [^,]*),\s*"ts": ([^,\s}]*),\s*"dur": ([^,\s}]*)')
_WS = re.compile(r"\s*")
_DECODER = json.JSONDecoder()


class _Restart(Exception):
    """The fast path met a layout it cannot trust: read the file again with the exact path."""


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
    """The complete events read so far, as numpy chunks; names, categories and threads interned."""

    names: _Table = field(default_factory=_Table)
    cats: _Table = field(default_factory=_Table)
    threads: _Table = field(default_factory=_Table)
    raw_threads: dict[str, int] = field(default_factory=dict)
    parts: list[tuple[np.ndarray, ...]] = field(default_factory=list)
    events: int = 0
    saw_step: bool = False

    def _name_ids(self, names) -> np.ndarray:
        table = self.names
        before = len(table)
        ids = np.fromiter(map(table.__getitem__, names), dtype=np.int32, count=len(names))
        if len(table) > before and not self.saw_step:
            self.saw_step = any(n.startswith("ProfilerStep#") for n in list(table)[before:])
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
        self.parts.append((ts_ns, dur_ns, names, cid.astype(np.int16), tids))
        self.events += len(cat)

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

    def arrays(self) -> tuple[np.ndarray, ...]:
        """ts_ns, dur_ns (int64), name id (int32), category id (int16), thread id (int32), concatenated."""
        if not self.parts:
            return (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int16),
                    np.zeros(0, np.int32))
        columns = [list(c) for c in zip(*self.parts)]
        self.parts = []
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
            import psutil

            grown = self.isize + ((out - self.isize) // (1 << 32) + 1) * (1 << 32)
            need = BASE_MIB + MIB_PER_TRACE_MB * grown / 1e6
            free = psutil.virtual_memory().available / 2**20
            if need > MEMORY_SHARE * free:
                raise self._fail(f"the gzip holds more text than the {self.gz_checked / 1e9:.1f} GB the memory check "
                                 f"assumed ({out / 1e9:.1f} GB read so far; its trailer gives the size modulo 4 GiB, "
                                 f"so it holds at least {grown / 1e9:.1f} GB), and reading that needs about "
                                 f"{need / 1024:.1f} GiB of memory ({MIB_PER_TRACE_MB} MiB per MB of trace) with "
                                 f"{free / 1024:.1f} GiB available", "free memory, read it on a larger machine, or "
                                 "record fewer steps (torch.profiler.schedule(active=...))")
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
            except ValueError:  # a ts or dur that is not a number: not Kineto's layout after all
                trusted = False
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


def _no_steps(path: Path, *, early: int | None = None) -> TraceError:
    seen = f" in its first {early:,} events" if early else ""
    return TraceError(f"{path}: the trace has no ProfilerStep#N annotations{seen}, so its steps cannot be told "
                      "apart; record with schedule=torch.profiler.schedule(wait=1, warmup=1, active=3) and call "
                      "prof.step() once per training step")


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


def memory_needed_mib(path, size: int | None = None) -> float:
    """The reader's expected peak memory for a trace file, MiB (:data:`MIB_PER_TRACE_MB`, :data:`BASE_MIB`).

    A gzip's uncompressed size is read from its trailer (ISIZE, the size modulo 4 GiB, RFC 1952), and taken as at
    least 8 times the compressed size (a JSON trace compresses about 10x), since the trailer wraps above 4 GiB.
    """
    p = Path(path)
    size = p.stat().st_size if size is None else size
    with open(p, "rb") as raw:
        gz = raw.read(2) == b"\x1f\x8b"
        if gz and size >= 18:
            raw.seek(size - 4)
            size = max(int.from_bytes(raw.read(4), "little"), 8 * size)
    return BASE_MIB + MIB_PER_TRACE_MB * size / 1e6


def _check_memory(path: Path, size: int) -> None:
    """Refuse, before the read, a trace whose columns would not fit in the memory available now."""
    import psutil

    need = memory_needed_mib(path, size)
    free = psutil.virtual_memory().available / 2**20
    if need > MEMORY_SHARE * free:
        text = (need - BASE_MIB) / MIB_PER_TRACE_MB * 1e6  # a gzip's text, as its trailer gives it
        what = (f"{size / 1e9:.1f} GB trace" if abs(text - size) < 1e6 else
                f"{size / 1e9:.2f} GB gzip (of {text / 1e9:.1f} GB of text, its trailer says)")
        raise TraceError(f"{path}: reading this {what} needs about {need / 1024:.1f} GiB of memory "
                         f"({MIB_PER_TRACE_MB} MiB per MB of trace, measured by `python -m helpers bench trace`) and "
                         f"{free / 1024:.1f} GiB are available; free memory, read it on a larger machine, or record "
                         "fewer steps (torch.profiler.schedule(active=...)) or one rank's file at a time")


def _parse(path: Path, progress: Progress | None) -> _Parser:
    for fast in (True, False):
        parser = _Parser(path, progress, fast=fast)
        try:
            parser.run()
            return parser
        except _Restart:
            continue
        except _BadValue as exc:
            raise TraceError(f"{path}: {exc}") from None
        finally:
            parser.close()
    raise AssertionError("the exact path does not restart")  # pragma: no cover


# ------------------------------------------------------------------------------------------------ intervals


def _union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merged, sorted intervals of [starts, ends) (int64 ns)."""
    if len(starts) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    run_end = np.maximum.accumulate(e)
    new = np.ones(len(s), bool)
    new[1:] = s[1:] > run_end[:-1]
    idx = np.flatnonzero(new)
    last = np.r_[idx[1:] - 1, len(s) - 1]
    return s[idx], run_end[last]


def _covered(union: tuple[np.ndarray, np.ndarray], lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Length (ns) of a merged union inside each window [lo, hi), vectorised over windows."""
    s, e = union
    if len(s) == 0:
        return np.zeros(len(lo), np.int64)
    cum = np.r_[0, np.cumsum(e - s)]

    def upto(t):
        i = np.searchsorted(s, t, side="right") - 1
        ok = i >= 0
        out = np.zeros(len(t), np.int64)
        j = i[ok]
        out[ok] = cum[j] + np.minimum(t[ok] - s[j], e[j] - s[j])
        return out

    return np.maximum(upto(hi) - upto(lo), 0)


def _merge(*unions) -> tuple[np.ndarray, np.ndarray]:
    return _union(np.concatenate([u[0] for u in unions]), np.concatenate([u[1] for u in unions]))


def _nesting(ts: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Order (by start, longest first) and each event's parent in that order (-1 for none), for one thread."""
    n = len(ts)
    order = np.lexsort((ts - end, ts))
    s = ts[order]
    e = np.maximum(end[order], s + 1)  # a zero-length event still opens and closes
    ended = np.searchsorted(np.sort(e), s, side="right")
    pos = np.arange(n, dtype=np.int64)
    depth = np.maximum(pos - ended, 0)
    key = depth * (n + 1) + pos
    skey = np.sort(key)
    j = np.searchsorted(skey, (depth - 1) * (n + 1) + pos, side="left") - 1
    parent = np.full(n, -1, np.int64)
    ok = (depth > 0) & (j >= 0)
    cand = skey[j[ok]]
    good = cand // (n + 1) == depth[ok] - 1
    idx = np.flatnonzero(ok)[good]
    parent[idx] = cand[good] % (n + 1)
    return order, parent


# ------------------------------------------------------------------------------------------------ analysis


@dataclass
class _Events:
    ts: np.ndarray
    dur: np.ndarray
    end: np.ndarray
    name: np.ndarray
    cat: np.ndarray
    thread: np.ndarray
    names: list[str]
    cats: list[str]
    threads: list[tuple[str, str]]

    def cat_mask(self, wanted) -> np.ndarray:
        ids = [i for i, c in enumerate(self.cats) if c in wanted]
        return np.isin(self.cat, ids)

    def name_mask(self, pred) -> np.ndarray:
        ids = [i for i, n in enumerate(self.names) if pred(n)]
        return np.isin(self.name, ids) if ids else np.zeros(len(self.name), bool)


def _is_data(name: str) -> bool:
    return name.startswith("enumerate(DataLoader)#") and name.endswith("__next__")


def _is_optimizer(name: str) -> bool:
    return name.startswith(("Optimizer.step#", "Optimizer.zero_grad#"))


def _is_nccl(name: str) -> bool:
    low = name.lower()
    return any(w in low for w in _COMM_WORDS)


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
        ``format`` "kineto"; one :class:`StepPhases` per ``ProfilerStep#N`` span, in order, times in seconds (the
        module's docstring says what each phase is read from); ``top_ops`` self times in ms.

    Raises
    ------
    TraceError
        Naming the file, what is missing and what to do: a missing, empty or truncated file (checked before
        the parse where the file is not gzipped), a corrupt gzip, text that is not JSON, JSON without
        ``traceEvents``, a trace without ``ProfilerStep#N`` annotations.
    """
    p = Path(path)
    _precheck(p)
    parser = _parse(p, progress)
    cols = parser.cols
    ts, dur, name, cat, thread = cols.arrays()
    cats = [_OLD_CATS.get(c, c) for c in cols.cats]
    ev = _Events(ts, dur, ts + dur, name, cat, thread, list(cols.names), cats, list(cols.threads))
    if not cols.saw_step:
        raise _no_steps(p)
    return _analyse(p, parser, ev)


def _analyse(path: Path, parser: _Parser, ev: _Events) -> RankTrace:
    meta = parser.meta
    step_mask = ev.name_mask(lambda n: _STEP.fullmatch(n) is not None) & ev.cat_mask({"user_annotation", "cpu_op"})
    if not step_mask.any():
        raise _no_steps(path)
    step_thread = int(np.bincount(ev.thread[step_mask]).argmax())
    sidx = np.flatnonzero(step_mask & (ev.thread == step_thread))
    sidx = sidx[np.argsort(ev.ts[sidx], kind="stable")]
    lo, hi = ev.ts[sidx], ev.end[sidx]
    numbers = [int(_STEP.fullmatch(ev.names[i]).group(1)) for i in ev.name[sidx]]
    length = hi - lo

    device = ev.cat_mask(_DEVICE_CATS)
    device_kind = _device_kind(ev, meta, bool(device.any()))
    limits: list[str] = []
    data, h2d, optimizer = _host_phases(ev, step_thread, sidx, limits, host_copy=device_kind == "cpu")
    unrecorded = False  # a job on a device whose activity the profiler did not record
    if device_kind == "cpu":
        limits.append("a CPU-only trace records no device: device idle time is unknown; compute is the training "
                      "thread's time in recorded operators outside data and copy, and the step's remaining time "
                      "(its gaps between operators: Python, the framework) is unattributed")
        if meta.get("deviceProperties"):
            limits.append("the trace lists devices in deviceProperties but recorded no device activity: profile "
                          "with activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA] to see the device")
            unrecorded = True

    compute = idle = comm = comm_exposed = other = sync = None
    sync_on: dict[str, np.ndarray] = {}
    collectives: list[tuple[int, str, float]] = []
    if device_kind != "cpu":
        compute, idle, comm, comm_exposed, dev_h2d, unions = _device_phases(ev, device, lo, hi, length)
        if data is not None:  # the wait for data the device does not hide: while it has nothing to run
            data = _exposed(ev, step_thread, lo, hi, unions["busy"], _is_data)
        h2d = dev_h2d  # the device's own copy time, not the host's wait for it (that is sync_wait)
        if h2d is None:
            limits.append("h2d unknown: the trace records no host-to-device copy on the device")
        sync, sync_on = _sync_waits(ev, step_thread, lo, hi, unions)
        if len({ev.threads[t][0] for t in np.unique(ev.thread[device])}) > 1:
            limits.append("the trace holds several devices: device times are the union over all of them")
        limits.append("device times are those of the work that ran during the host's step span (device work "
                      "lags the host by its launch queue)")
        comm_mask = device & ev.cat_mask({"kernel"}) & ev.name_mask(_is_nccl)
        collectives = _collectives(ev, comm_mask, lo, hi, numbers)
    else:
        comm, comm_exposed = _host_comm(ev, step_thread, sidx, lo, hi, limits)
        if not unrecorded:  # on a GPU job whose device was not recorded, the host's ops are launches, not compute
            compute, other = _cpu_compute(ev, step_thread, sidx, lo, hi, length, data, h2d, comm_exposed)
        gloo = ev.name_mask(lambda n: n.startswith("gloo:")) & ev.cat_mask({"user_annotation", "cpu_op"})
        collectives = _collectives(ev, gloo, lo, hi, numbers)

    steps = []
    for k, n in enumerate(numbers):
        def s(a):
            return None if a is None else float(a[k]) / 1e9
        on = {key: float(v[k]) / 1e9 for key, v in sync_on.items() if v[k] > 0}
        steps.append(StepPhases(step=n, step_s=float(length[k]) / 1e9, data=s(data), h2d=s(h2d),
                                optimizer=s(optimizer), compute=s(compute), comm_exposed=s(comm_exposed),
                                idle=s(idle), comm=s(comm), other=s(other), sync_wait=s(sync),
                                sync_on=on or None))

    dist = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
    rank = dist.get("rank") if isinstance(dist.get("rank"), int) else None
    world = dist.get("world_size") if isinstance(dist.get("world_size"), int) else None
    start_unix = _start_unix(meta, int(lo[0]))
    prov = _provenance(path, parser, ev, start_unix, step_thread)
    prov["pid"] = ev.threads[step_thread][0]
    if unrecorded:
        prov["device_not_recorded"] = True
    return RankTrace(
        source=path, format="kineto", device_kind=device_kind, steps=tuple(steps), rank=rank, world_size=world,
        node=_node(path, meta), run_id=_run_id(dist), top_ops=_top_ops(ev, lo[0], hi[-1]),
        limits=tuple(limits), provenance=prov, collectives=tuple(collectives))


def _exposed(ev: _Events, step_thread: int, lo, hi, busy_u, pred) -> np.ndarray:
    """Per step (ns), the time the step thread spends in spans whose name satisfies ``pred`` while the device runs
    nothing: the part of a host wait the device does not hide behind work already queued."""
    mask = (ev.thread == step_thread) & ev.cat_mask(_PHASE_CATS) & ev.name_mask(pred)
    u = _union(ev.ts[mask], ev.end[mask])
    return np.maximum(_covered(u, lo, hi) - (_covered(u, lo, hi) + _covered(busy_u, lo, hi)
                                             - _covered(_merge(u, busy_u), lo, hi)), 0)


def _device_kind(ev: _Events, meta: dict, has_device: bool) -> str:
    """The device the trace recorded, named as it is: "cuda", "rocm", "mtia", "xpu", "npu", "privateuse1", or
    "cpu" when it recorded none."""
    cats = set(ev.cats)
    if cats & {"mtia_ccp_events", "mtia_runtime"}:
        return "mtia"
    if not has_device:
        return "cpu"
    if "xpu_runtime" in cats:
        return "xpu"
    if cats & {"privateuse1_runtime", "privateuse1_driver"}:
        names = " ".join(n for n in ev.names[:5000]).lower()
        return "npu" if ("acl" in names or "npu" in names) else "privateuse1"
    props = meta.get("deviceProperties")
    text = json.dumps(props, default=str).lower() if props else ""
    if any(w in text for w in ("amd", "radeon", "instinct", "gfx9")) or any(n.startswith("hip") for n in ev.names):
        return "rocm"
    return "cuda"


def _sync_waits(ev: _Events, step_thread: int, lo, hi, unions: dict) -> tuple[np.ndarray | None, dict]:
    """Host time in synchronize calls per step (ns) and its split by what the device did meanwhile, in order of
    precedence: communication kernels, computing kernels, copies and memsets, nothing (idle)."""
    mask = (ev.thread == step_thread) & ev.cat_mask(_HOST_CATS) & ev.name_mask(lambda n: n in _SYNC_CALLS)
    if not mask.any():
        return None, {}
    sync_u = _union(ev.ts[mask], ev.end[mask])
    total = _covered(sync_u, lo, hi)

    def inter(u):  # |sync ∩ u| per step
        return total + _covered(u, lo, hi) - _covered(_merge(sync_u, u), lo, hi)

    comm_u, comp_u, busy_u = unions["comm"], unions["compute"], unions["busy"]
    on_comm = inter(comm_u)
    on_kernels = inter(_merge(comm_u, comp_u))
    on_busy = inter(busy_u)
    out = {"communication": on_comm, "compute": np.maximum(on_kernels - on_comm, 0),
           "copy": np.maximum(on_busy - on_kernels, 0), "idle": np.maximum(total - on_busy, 0)}
    return total, out


def _collectives(ev: _Events, mask: np.ndarray, lo, hi, numbers) -> list[tuple[int, str, float]]:
    """(step number, name, duration in s) of each collective that starts inside a step, in order: the input of
    the arrival rule (:mod:`helpers.traces.arrival`)."""
    idx = np.flatnonzero(mask)
    if not len(idx):
        return []
    idx = idx[np.argsort(ev.ts[idx], kind="stable")]
    where = np.searchsorted(lo, ev.ts[idx], side="right") - 1
    out = []
    for i, k in zip(idx, where):
        if k >= 0 and ev.ts[i] < hi[k]:
            out.append((numbers[k], ev.names[ev.name[i]], float(ev.dur[i]) / 1e9))
    return out


def _cpu_compute(ev: _Events, step_thread: int, sidx: np.ndarray, lo, hi, length, data, h2d, comm_exposed):
    """compute and other per step (ns) of a CPU trace: the training thread's recorded operators outside data and
    copy, and the rest of the step that is not exposed communication."""
    ops = (ev.thread == step_thread) & ev.cat_mask(_PHASE_CATS)
    ops[sidx] = False
    busy = _covered(_union(ev.ts[ops], ev.end[ops]), lo, hi)
    if not busy.any():  # the training thread recorded no operator in any step: compute is unrecorded, not 0
        return None, None
    spent = (data if data is not None else 0) + (h2d if h2d is not None else 0)
    compute = np.maximum(busy - spent, 0)
    other = np.maximum(length - busy - (comm_exposed if comm_exposed is not None else 0), 0)
    return compute, other


def _host_phases(ev: _Events, step_thread: int, sidx: np.ndarray, limits: list, *, host_copy: bool):
    """data, h2d, optimizer per step (int64 ns arrays, or None where the trace cannot tell, said in ``limits``);
    h2d only where ``host_copy`` (a CPU trace: a device trace's copy is the device's, :func:`_device_phases`)."""
    lo, hi = ev.ts[sidx], ev.end[sidx]
    on_thread = (ev.thread == step_thread) & ev.cat_mask(_PHASE_CATS)
    data_mask = on_thread & ev.name_mask(_is_data)
    data_u = _union(ev.ts[data_mask], ev.end[data_mask])
    data = _covered(data_u, lo, hi) if data_mask.any() else None
    if data is None:
        limits.append("data phase unknown: the step thread has no DataLoader __next__ spans (torch records them "
                      "only for a torch.utils.data.DataLoader iterated inside the profiled steps)")
    copy_u = _h2d_spans(ev, step_thread, sidx) if host_copy and data_mask.any() else None
    if copy_u is None:
        h2d = None
        if host_copy:
            limits.append("h2d phase unknown: with no DataLoader span, the batch's copy cannot be told from the "
                          "step's other ops")
    else:
        h2d = _covered(_merge(copy_u, data_u), lo, hi) - (data if data is not None else 0)
    opt_mask = on_thread & ev.name_mask(_is_optimizer)
    optimizer = _covered(_union(ev.ts[opt_mask], ev.end[opt_mask]), lo, hi) if opt_mask.any() else None
    if optimizer is None:
        limits.append("optimizer phase unknown: no Optimizer.step# spans (torch records them for a "
                      "torch.optim optimizer)")
    return data, h2d, optimizer


def _h2d_spans(ev: _Events, step_thread: int, sidx: np.ndarray):
    """Union of the host copy spans of the batch on a CPU trace: the copy ops that are the step's direct children
    right after its last DataLoader span."""
    th = np.flatnonzero((ev.thread == step_thread) & ev.cat_mask(_PHASE_CATS))
    order, parent = _nesting(ev.ts[th], ev.end[th])
    rows = th[order]
    n = len(rows)
    is_copy = np.isin(ev.name[rows], [i for i, nm in enumerate(ev.names) if nm in _COPY_OPS])
    picked = np.zeros(n, bool)
    pos = np.full(len(ev.ts), -1, np.int64)
    pos[rows] = np.arange(n)
    is_step = np.zeros(n, bool)
    is_step[pos[sidx][pos[sidx] >= 0]] = True
    kid = np.flatnonzero((parent >= 0) & is_step[np.maximum(parent, 0)])
    owner = parent[kid]
    is_data = np.isin(ev.name[rows[kid]], [i for i, nm in enumerate(ev.names) if _is_data(nm)])
    last_data = np.full(n, -1, np.int64)
    np.maximum.at(last_data, owner[is_data], kid[is_data])
    after = kid > last_data[owner]
    first_other = np.full(n, n, np.int64)
    other = after & ~is_copy[kid] & (last_data[owner] >= 0)
    np.minimum.at(first_other, owner[other], kid[other])
    ok = after & is_copy[kid] & (last_data[owner] >= 0) & (kid < first_other[owner])
    picked[kid[ok]] = True
    r = rows[picked]
    return _union(ev.ts[r], ev.end[r])


def _device_phases(ev: _Events, device: np.ndarray, lo, hi, length):
    """compute, idle, comm, comm_exposed, h2d per step (ns; h2d None where no HtoD copy is recorded) and the
    unions they come from."""
    kernel = ev.cat_mask({"kernel", "mtia_ccp_events"}) & device
    nccl = kernel & ev.name_mask(_is_nccl)
    comp = kernel & ~nccl
    htod = device & ev.cat_mask({"gpu_memcpy"}) & ev.name_mask(lambda n: "HtoD" in n or "H2D" in n)
    all_u = _union(ev.ts[device], ev.end[device])
    comp_u = _union(ev.ts[comp], ev.end[comp])
    comm_u = _union(ev.ts[nccl], ev.end[nccl])
    busy = _covered(all_u, lo, hi)
    compute = _covered(comp_u, lo, hi)
    comm = _covered(comm_u, lo, hi)
    work = _merge(comm_u, comp_u)
    covered_work = _covered(work, lo, hi)
    exposed = covered_work - compute
    h2d = None
    if htod.any():
        copy_u = _union(ev.ts[htod], ev.end[htod])
        h2d = np.maximum(_covered(_merge(copy_u, work), lo, hi) - covered_work, 0)
    unions = {"comm": comm_u, "compute": comp_u, "busy": all_u}
    return compute, np.maximum(length - busy, 0), comm, exposed, h2d, unions


def _host_comm(ev: _Events, step_thread: int, sidx: np.ndarray, lo, hi, limits: list):
    """comm, comm_exposed of a CPU trace from the gloo:* spans and the step thread's gaps (None without them)."""
    gloo = ev.name_mask(lambda n: n.startswith("gloo:")) & ev.cat_mask({"user_annotation", "cpu_op"})
    if not gloo.any():
        return None, None
    comm_u = _union(ev.ts[gloo], ev.end[gloo])
    busy_mask = (ev.thread == step_thread) & ev.cat_mask(_PHASE_CATS)
    busy_mask[sidx] = False
    busy_u = _union(ev.ts[busy_mask], ev.end[busy_mask])
    comm = _covered(comm_u, lo, hi)
    exposed = _covered(_merge(comm_u, busy_u), lo, hi) - _covered(busy_u, lo, hi)
    limits.append("communication on a CPU trace is read from gloo's gloo:* spans (on its own threads) and the "
                  "gaps of the training thread while one is in flight; a gloo span can end late, when the next "
                  "collective is queued")
    return comm, np.maximum(exposed, 0)


def _top_ops(ev: _Events, lo: int, hi: int) -> tuple[dict[str, Any], ...]:
    window = (ev.ts >= lo) & (ev.ts < hi)
    self_ns = np.zeros(len(ev.ts), np.int64)
    host = window & ev.cat_mask(_HOST_CATS) & ~ev.name_mask(lambda n: _STEP.fullmatch(n) is not None)
    hidx = np.flatnonzero(host)
    for t in np.unique(ev.thread[hidx]):
        rows = hidx[ev.thread[hidx] == t]
        order, parent = _nesting(ev.ts[rows], ev.end[rows])
        r = rows[order]
        s, e = ev.ts[r], ev.end[r]
        has = parent >= 0
        overlap = np.minimum(e[has], e[parent[has]]) - s[has]
        kids = np.bincount(parent[has], weights=np.maximum(overlap, 0), minlength=len(r))
        self_ns[r] = np.maximum(ev.dur[r] - kids.astype(np.int64), 0)
    dev = window & ev.cat_mask(_DEVICE_CATS)
    self_ns[dev] = ev.dur[dev]
    out = []
    for where, mask in (("host", host), ("device", dev)):
        if not mask.any():
            continue
        ids = ev.name[mask]
        sums = np.bincount(ids, weights=self_ns[mask].astype(np.float64), minlength=len(ev.names))
        calls = np.bincount(ids, minlength=len(ev.names))
        for i in np.flatnonzero(calls):
            out.append({"name": ev.names[i], "calls": int(calls[i]), "self_ms": float(sums[i]) / 1e6,
                        "where": where})
    out.sort(key=lambda d: d["self_ms"], reverse=True)
    return tuple(out[:TOP_OPS])


def _start_unix(meta: dict, first_ts_ns: int) -> float | None:
    base = meta.get("baseTimeNanoseconds")
    t = (int(base) + first_ts_ns) / 1e9 if isinstance(base, int) else first_ts_ns / 1e9
    # 2015-01-01 .. 2100-01-01: a wall clock; anything else is a clock of its own
    return t if 1_420_070_400 <= t <= 4_102_444_800 else None


def _run_id(dist: dict) -> str | None:
    if not dist:
        return None
    cfg = json.dumps(dist.get("pg_config"), sort_keys=True, default=str)
    digest = hashlib.sha1(cfg.encode()).hexdigest()[:8]
    return f"{dist.get('backend', '?')}-w{dist.get('world_size', '?')}-{digest}"


#: tensorboard_trace_handler's file names: ``{worker}.{time in ms}.pt.trace.json[.gz]`` with the default worker name
#: ``{hostname}_{pid}`` (torch/profiler/profiler.py, ``tensorboard_trace_handler``).
_HANDLER_NAME = re.compile(r"^(?P<host>.+)_(?P<pid>\d+)\.(?P<time>\d{10,})\.pt\.trace\.json(?:\.gz)?$")


def _node(path: Path, meta: dict) -> str | None:
    """The host the rank ran on: the trace's ``host_name``, else the host of tensorboard_trace_handler's default
    file name (``{hostname}_{pid}.{time}.pt.trace.json``) where the name follows that pattern; else None (a
    file name that is not the handler's says nothing about the host)."""
    host = meta.get("host_name")
    if isinstance(host, str) and host:
        return host
    m = _HANDLER_NAME.match(path.name)
    return m.group("host") if m else None


def _provenance(path: Path, parser: _Parser, ev: _Events, start_unix, step_thread: int) -> dict[str, Any]:
    st = path.stat()
    meta = parser.meta
    out: dict[str, Any] = {
        "path": str(path), "bytes": st.st_size,
        "mtime": _dt.datetime.fromtimestamp(st.st_mtime, _dt.timezone.utc).isoformat(timespec="seconds"),
        "reader": "kineto", "gzip": parser.gz, "events": int(len(ev.ts)),
        "parse": {"fast_chunks": parser.fast_chunks, "json_chunks": parser.fallback_chunks,
                  "restarted": not parser.fast},
        "start_unix_s": start_unix,
    }
    for key in ("schemaVersion", "traceName", "displayTimeUnit", "baseTimeNanoseconds"):
        if key in meta:
            out[key] = meta[key]
    for key, v in meta.items():
        if "version" in key.lower() and key != "schemaVersion" and isinstance(v, (str, int, float)):
            out[key] = v
    pid, tid = ev.threads[step_thread]
    out["step_thread"] = f"pid {pid} tid {tid}"
    return out
