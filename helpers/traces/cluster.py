"""Find the ranks of a job among the paths a user gives, check they belong together, and read them.

Each PATH is a Kineto file (``*.pt.trace.json``, ``*.pt.trace.json.gz``, or any ``.json``/``.json.gz`` whose first
bytes are a Kineto trace's), a torch_npu folder (``*_ascend_pt``, or one that holds the profiler's files), or a
folder holding those, one per rank, at any depth up to :data:`MAX_DEPTH`, found by content, not by name (hidden
folders and symbolic links are not followed; an Ascend folder is not searched inside). A rank is what the file's own metadata says
(:mod:`helpers.traces.peek`: Kineto's ``distributedInfo``, Ascend's ``profiler_info_<rank>.json``), never its
name: torch's ``tensorboard_trace_handler`` names files ``<host>_<pid>.<time>.pt.trace.json``.

Checked from the headers before any big file is read, each a :class:`TraceError` naming the files:

* nothing trace-like found (the message says which names are looked for);
* single-process traces mixed with ranks, or several single-process traces (they are not ranks of one job);
* two traces claiming one rank that are not profiler cycles (two runs in one folder, or copies). Several
  profiling cycles of one run (``schedule(repeat=...)`` writes one file per cycle: every rank then has the same
  number of files, starting at different times) are read together, one window per cycle;
* world sizes that disagree, a rank outside its world size, run identities that differ (backend and world size),
  or start times further apart than :data:`RUN_START_SPREAD_S` (two runs of the same job).

Missing ranks (fewer traces than the world size) are a warning, not an error: profiling a subset of the ranks is
common (every rank's trace is large), and the ranks present still compare with each other; but the slow rank may
be one of the missing, so the warning is kept in :attr:`TraceSet.warnings` and added to every trace's ``limits``
(what the analysis reports as "what the traces cannot tell").

The readers (:mod:`helpers.traces.kineto`, :mod:`helpers.traces.ascend`) are imported when first needed, by
name, so that this module works while a reader is not installed (it then says which one is missing).
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from helpers.traces import peek
from helpers.traces.model import RankTrace, TraceError

__all__ = ["KINETO_SUFFIXES", "ASCEND_SUFFIX", "MAX_DEPTH", "RUN_START_SPREAD_S", "TraceSet", "find_traces",
           "check", "read"]

log = logging.getLogger(__name__)

#: File names of torch.profiler's Chrome traces (``tensorboard_trace_handler`` writes ``.pt.trace.json``, and
#: ``.pt.trace.json.gz`` with ``use_gzip=True``).
KINETO_SUFFIXES: tuple[str, ...] = (".pt.trace.json", ".pt.trace.json.gz")
#: torch_npu's profiler folder ends so (``<worker>_<time>_ascend_pt``, torch_npu 2.13.0
#: ``profiler/_profiler_path_creator.py``).
ASCEND_SUFFIX = "_ascend_pt"
#: How many folder levels below a given folder are searched (a cluster copy is typically ``job/node/rank``).
MAX_DEPTH = 6
#: Ranks of one run start their traces within about one step of each other: the profiler's schedule starts
#: recording at the same step on every rank, and the ranks are held together by their collectives (measured: 3.5
#: ms apart in tests/ddp_trace_job.py's 4 ranks). Starts further apart than this are taken to be different runs;
#: a minute allows for steps of many seconds and clocks of different hosts that disagree by seconds.
RUN_START_SPREAD_S = 60.0

_READERS = {"kineto": ("helpers.traces.kineto", "read_kineto", "looks_like_kineto"),
            "ascend": ("helpers.traces.ascend", "read_ascend", "looks_like_ascend")}
_LOOKED_FOR = (f"torch.profiler's Chrome traces (*{KINETO_SUFFIXES[0]}, *{KINETO_SUFFIXES[1]}, or any .json/.json.gz "
               f"whose content is one) and torch_npu's profiler folders (*{ASCEND_SUFFIX}, or a folder holding "
               "ASCEND_PROFILER_OUTPUT)")


class TraceSet(list):
    """The ranks read, sorted by rank (a list of :class:`RankTrace`), with :attr:`warnings`: what the set as a
    whole cannot tell (e.g. missing ranks)."""

    def __init__(self, traces: Iterable[RankTrace] = (), warnings: Sequence[str] = ()) -> None:
        super().__init__(traces)
        self.warnings: tuple[str, ...] = tuple(warnings)


def _reader(fmt: str, attr: str) -> Callable[..., Any] | None:
    """A reader's function, imported by name when first needed; None when its module is not there."""
    module, read_name, look_name = _READERS[fmt]
    try:
        mod = importlib.import_module(module)  # by name: the readers may be absent from a checkout (see the module)
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise
        return None
    return getattr(mod, {"read": read_name, "looks": look_name}[attr], None)


def _kind(path: Path) -> str | None:
    """"kineto", "ascend" or None for a path the user named, by its name, then by the readers' own test."""
    name = path.name
    if path.is_dir():
        if name.endswith(ASCEND_SUFFIX):
            return "ascend"
        looks = _reader("ascend", "looks")
        return "ascend" if looks is not None and looks(path) else None
    if name.endswith(KINETO_SUFFIXES):
        return "kineto"
    looks = _reader("kineto", "looks")
    if looks is not None:
        return "kineto" if looks(path) else None
    return "kineto" if name.endswith((".json", ".json.gz")) else None


def _search(folder: Path) -> list[tuple[Path, str]]:
    """The traces below ``folder``, found by content: Kineto files by name (``*.pt.trace.json[.gz]``) or, for any
    other ``.json``/``.json.gz``, by their first bytes (:func:`helpers.traces.kineto.looks_like_kineto`); Ascend
    folders by name or by what they hold (:func:`helpers.traces.ascend.looks_like_ascend`)."""
    found: list[tuple[Path, str]] = []
    root_depth = len(folder.parts)
    looks_kineto = _reader("kineto", "looks")
    looks_ascend = _reader("ascend", "looks")
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        here = Path(dirpath)
        keep = []
        for d in sorted(dirnames):
            if d.startswith("."):
                continue
            if d.endswith(ASCEND_SUFFIX) or (looks_ascend is not None and looks_ascend(here / d)):
                found.append((here / d, "ascend"))
            elif len(here.parts) - root_depth < MAX_DEPTH:
                keep.append(d)
        dirnames[:] = keep
        for f in sorted(filenames):
            if f.startswith("."):
                continue
            if f.endswith(KINETO_SUFFIXES) or (f.endswith((".json", ".json.gz")) and looks_kineto is not None
                                               and looks_kineto(here / f)):
                found.append((here / f, "kineto"))
    return found


def find_traces(paths: Sequence[str | os.PathLike]) -> list[tuple[Path, str]]:
    """The traces among ``paths``: ``(path, format)`` with format "kineto" or "ascend", each once, in path order.

    Parameters
    ----------
    paths : sequence of str or path
        Files and folders (see the module).

    Raises
    ------
    TraceError
        No path given, a path that does not exist, a file that is not a trace, or a folder with no trace in it;
        the message names the path and the file names looked for.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    if not paths:
        raise TraceError("no trace given: pass the profiler trace of one rank or a folder of ranks' traces "
                         f"({_LOOKED_FOR})")
    out: list[tuple[Path, str]] = []
    seen: set[Path] = set()
    for raw in paths:
        p = Path(raw).expanduser()
        if not p.exists():
            raise TraceError(f"{p}: no such file or folder; pass a trace file or a folder of traces ({_LOOKED_FOR})")
        kind = _kind(p)
        if kind is not None:
            found = [(p, kind)]
        elif p.is_dir():
            found = _search(p)
            if not found:
                raise TraceError(f"{p}: no profiler trace found in this folder or {MAX_DEPTH} levels below it; looked "
                                 f"for {_LOOKED_FOR}. Pass the folder torch.profiler's tensorboard_trace_handler "
                                 "wrote into, or the trace files themselves")
        else:
            if p.name.endswith(".gz") and _magic(p) != b"\x1f\x8b":
                raise TraceError(f"{p}: named .gz but not gzip data (and not a JSON trace either); pass the file "
                                 "torch.profiler wrote, or gunzip -t it to check the copy")
            raise TraceError(f"{p}: not a profiler trace (looked for {_LOOKED_FOR}); pass torch.profiler's "
                             "*.pt.trace.json or a torch_npu *_ascend_pt folder")
        for f, k in found:
            key = f.resolve()
            if key not in seen:
                seen.add(key)
                out.append((f, k))
    return out


def _magic(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(2)
    except OSError:
        return b""


def _names(items: Iterable[Any], most: int = 4) -> str:
    """The items' files, the first ``most`` of them named."""
    names = [str(getattr(i, "path", None) or getattr(i, "source", i)) for i in items]
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def check(items: Sequence[Any]) -> tuple[str, ...]:
    """Check that traces are the ranks of one run; return the warnings (missing ranks).

    Parameters
    ----------
    items : sequence of :class:`helpers.traces.peek.Header` or :class:`RankTrace`
        Anything with ``rank``, ``world_size``, ``run_id`` and ``path`` or ``source``; headers may carry
        ``start_ns`` / ``end_ns``.

    Returns
    -------
    tuple of str
        Warnings: ranks of the world size with no trace here.

    Raises
    ------
    TraceError
        As listed in the module; the message names the files involved and what to do.
    """
    items = list(items)
    if len(items) == 1:
        one = items[0]
        w = getattr(one, "world_size", None)
        if one.rank is not None and w is not None and w > 1:
            return (f"only rank {one.rank} of the {w} ranks has a trace here: a lone rank of a multi-rank job shows "
                    "its own steps, and its wait for the others, but not which rank it waits for",)
        return ()
    if not items:
        return ()
    no_rank = [i for i in items if i.rank is None]
    if no_rank:
        if len(no_rank) == len(items):
            if _worker(items[0]) is not None and len({_worker(i) for i in items}) == 1 and _distinct_starts(items):
                return (f"{len(items)} profiler cycles of one process ({_worker(items[0])}; schedule(repeat=...) "
                        "writes one file per cycle): their steps are read together, each cycle a window of its own",)
            raise TraceError(f"{len(items)} traces of single-process runs (no distributed rank in their metadata): "
                             f"{_names(items)}; they are not ranks of one job - read them one at a time")
        ranked = [i for i in items if i.rank is not None]
        worlds = sorted({i.world_size for i in ranked if i.world_size is not None})
        if len(worlds) > 1:
            raise TraceError(f"these traces come from several different jobs: single-process traces "
                             f"({_names(no_rank)}) and ranks of jobs with world sizes {', '.join(map(str, worlds))}; "
                             "pass the folder (or the files) of one job")
        raise TraceError(f"{_names(no_rank)}: no distributed rank in the trace's metadata, unlike the other traces "
                         f"({_names(ranked)}); remove the single-process traces")
    by_rank: dict[int, list[Any]] = {}
    for i in items:
        by_rank.setdefault(i.rank, []).append(i)
    dups = {r: v for r, v in sorted(by_rank.items()) if len(v) > 1}
    counts = {len(v) for v in by_rank.values()}
    cycles = (len(counts) == 1 and next(iter(counts)) > 1
              and all(_distinct_starts(v) for v in by_rank.values()))
    if cycles:  # schedule(repeat=k): every rank wrote k files, one per cycle; check each cycle as a run
        k = next(iter(counts))
        ordered = {r: sorted(v, key=lambda i: getattr(i, "start_ns", 0) or 0) for r, v in by_rank.items()}
        for c in range(k):
            world = _same_run([v[c] for v in ordered.values()])
        dups = {}
    else:
        world = _same_run(items)
    if dups:
        said = "; ".join(f"rank {r}: {_names(v)}" for r, v in list(dups.items())[:3])
        if len(dups) > 3:
            said += f"; and {len(dups) - 3} more ranks"
        raise TraceError(f"two or more traces claim the same rank ({said}): these are two runs in one folder, or "
                         "several profiling cycles of one run (schedule(repeat=...) writes one file per cycle); keep "
                         "one run's traces of one cycle in the folder, or pass those files")
    if world is None:
        return ()
    outside = sorted(r for r in by_rank if not 0 <= r < world)
    if outside:
        raise TraceError(f"rank(s) {outside} outside world size {world} ({_names(by_rank[r][0] for r in outside)}): "
                         "the trace's metadata is inconsistent; profile again")
    said = ((f"{next(iter(counts))} profiler cycles per rank (schedule(repeat=...) writes one file per cycle): "
             "each rank's steps are read together, each cycle a window of its own"),) if cycles else ()
    missing = [r for r in range(world) if r not in by_rank]
    if not missing:
        return said
    return said + (f"only {len(by_rank)} of the {world} ranks have a trace here (missing: {_ranges(missing)}): the "
                   "ranks are compared among those present, and the slow rank may be one of the missing",)


def _distinct_starts(items: Sequence[Any]) -> bool:
    """Whether the items start at different known times (profiler cycles of one process do; a copy does not)."""
    starts = [getattr(i, "start_ns", None) for i in items]
    if any(t is None for t in starts):
        starts = [_start_of(i) for i in items]
    return None not in starts and len(set(starts)) == len(starts)


def _start_of(item: Any) -> int | None:
    t = (getattr(item, "provenance", None) or {}).get("start_unix_s")
    return None if t is None else int(t * 1e9)


#: tensorboard_trace_handler's default file name: ``{hostname}_{pid}.{time in ms}.pt.trace.json[.gz]``.
_HANDLER_NAME = re.compile(r"^(?P<worker>.+)\.\d{10,}\.pt\.trace\.json(?:\.gz)?$")


def _worker(item: Any) -> str | None:
    """The worker a single-process trace came from: the ``{worker}`` of the handler's ``{worker}.{time in ms}``
    file name (by default ``{hostname}_{pid}``, or the ``worker_name`` given to the handler)."""
    path = Path(getattr(item, "path", None) or getattr(item, "source", ""))
    m = _HANDLER_NAME.match(path.name)
    return m.group("worker") if m else None


def _merge_cycles(traces: Sequence[RankTrace]) -> list[RankTrace]:
    """One RankTrace per rank (or per process): the profiler cycles of one rank joined, steps in order, each
    cycle named in ``limits`` and ``provenance["cycles"]``."""
    groups: dict[Any, list[RankTrace]] = {}
    for t in traces:
        key = ("rank", t.rank) if t.rank is not None else ("worker", _worker(t) or str(t.source))
        groups.setdefault(key, []).append(t)
    out = []
    for group in groups.values():
        if len(group) == 1:
            out.append(group[0])
            continue
        group.sort(key=lambda t: t.steps[0].step if t.steps else 0)
        numbers = [s.step for t in group for s in t.steps]
        if len(set(numbers)) != len(numbers):
            raise TraceError(f"{_names(group)}: the profiler cycles of {group[0].label} repeat step numbers; pass "
                             "one cycle's files")
        windows = [f"steps {t.steps[0].step}-{t.steps[-1].step} ({t.source.name})" for t in group if t.steps]
        first = group[0]
        out.append(dataclasses.replace(
            first, steps=tuple(s for t in group for s in t.steps),
            collectives=tuple(c for t in group for c in t.collectives),
            limits=tuple(dict.fromkeys(x for t in group for x in t.limits))
            + (f"{first.label}: {len(group)} profiler cycles read as windows: {'; '.join(windows)}",),
            provenance={**first.provenance, "cycles": [str(t.source) for t in group]}))
    return out


def _same_run(items: Sequence[Any]) -> int | None:
    """Raise unless the items share world size, run identity and (within RUN_START_SPREAD_S) start; the world
    size."""
    worlds = {i.world_size for i in items}
    if len(worlds) > 1:
        said = "; ".join(f"world size {w}: {_names(i for i in items if i.world_size == w)}"
                         for w in sorted(worlds, key=lambda w: (w is None, w)))
        raise TraceError(f"the traces disagree on the world size ({said}): they come from different jobs; pass the "
                         "traces of one job")
    runs = {i.run_id for i in items}
    if len(runs) > 1:
        said = "; ".join(f"{r}: {_names(i for i in items if i.run_id == r)}" for r in sorted(runs, key=str))
        raise TraceError(f"the traces come from different runs ({said}); pass the traces of one run")
    for attr, what in (("start_ns", "start"), ("end_ns", "end")):
        times = [(getattr(i, attr, None), i) for i in items]
        if any(t is None for t, _ in times):
            continue
        lo, hi = min(times, key=lambda x: x[0]), max(times, key=lambda x: x[0])
        if (hi[0] - lo[0]) / 1e9 > RUN_START_SPREAD_S:
            raise TraceError(
                f"the traces {what} {(hi[0] - lo[0]) / 1e9:.0f} s apart ({_names([lo[1]])} at {_iso(lo[0])}, "
                f"{_names([hi[1]])} at {_iso(hi[0])}): ranks of one run {what} their traces within about one step "
                f"of each other, so these are different runs (or profiling cycles far apart) mixed in one folder; pass "
                f"the traces of one run's one cycle")
    return next(iter(worlds))


def _size(path: Path) -> int:
    """Bytes on disk of a trace file, or of every file in a trace folder."""
    if path.is_file():
        return path.stat().st_size
    return sum((Path(d) / f).stat().st_size for d, _, fs in os.walk(path) for f in fs)


def _iso(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).isoformat(timespec="seconds")


def _ranges(xs: Sequence[int]) -> str:
    out, start = [], xs[0]
    for a, b in zip(xs, list(xs[1:]) + [None]):
        if b != a + 1:
            out.append(f"{start}" if start == a else f"{start}-{a}")
            start = b
    return ", ".join(f"rank {o}" if "-" not in o else f"ranks {o}" for o in out)


def read(paths: Sequence[str | os.PathLike] | str | os.PathLike, *,
         progress: Callable[[int, int], None] | None = None) -> TraceSet:
    """Read the traces of one job: one :class:`RankTrace` per rank, sorted by rank.

    Parameters
    ----------
    paths : path or sequence of paths
        Kineto files, ``*_ascend_pt`` folders, or folders holding them (see the module).
    progress : callable(done, total), optional
        Bytes of the traces read so far and their total size on disk (an Ascend folder: all its files), called
        while a Kineto file is read (by its reader) and after each trace (:data:`helpers.live.Progress`).

    Returns
    -------
    TraceSet
        A list of RankTrace (by rank; a single-process trace alone), with ``warnings`` (missing ranks), which are
        also appended to every trace's ``limits``.

    Raises
    ------
    TraceError
        Every problem of :func:`find_traces` and :func:`check` (raised before any trace's events are read), a
        reader that is not installed, and what the reader raises for a single trace; checked again on what the
        readers found. Of several traces, one the reader refuses (a file cut short, corrupt) is left out and named
        in ``warnings``; the error is raised only when none can be read.
    """
    found = find_traces(paths if not isinstance(paths, (str, os.PathLike)) else [paths])
    headers = [peek.header(p, k) for p, k in found]
    if all(getattr(h, "complete", True) for h in headers):
        check(headers)  # else the identity is checked on what the readers found, below
    readers = {}
    for _, k in found:
        if k not in readers:
            fn = _reader(k, "read")
            if fn is None:
                raise TraceError(f"{_names(p for p, kk in found if kk == k)}: a {k} trace, but this installation has "
                                 f"no {k} reader ({_READERS[k][0]}); update the workbook")
            readers[k] = fn
    sizes = [_size(p) for p, _ in found]
    total, done = sum(sizes), 0
    traces = []
    unread: list[str] = []
    kept_headers = []
    for (p, k), size, h in zip(found, sizes, headers):
        try:
            if progress is not None and k == "kineto":
                traces.append(readers[k](p, progress=lambda d, t, base=done: progress(base + min(d, t), total)))
            else:
                traces.append(readers[k](p))
            kept_headers.append(h)
        except TraceError as exc:
            if len(found) == 1:
                raise
            # one rank's file cut short or corrupt: the others are still analysed, and this one is named
            who = f"rank {h.rank}" if h.rank is not None else "one trace"
            unread.append(f"{who} could not be read and is left out ({exc})")
        done += size
        if progress is not None:
            progress(done, total)
    if not traces:
        raise TraceError("no trace could be read: " + "; ".join(unread))
    warnings = tuple(unread) + check(traces)
    for h, t in zip(kept_headers, traces):
        if h.rank is not None and t.rank is not None and h.rank != t.rank:
            raise TraceError(f"{h.path}: its metadata says rank {h.rank} but the reader found rank {t.rank}; "
                             "report this file")
    traces = _merge_cycles(traces)
    for w in warnings:  # said to the user in every trace's limits (the report's "what the traces cannot tell")
        log.info(w)
    if warnings:
        traces = [dataclasses.replace(t, limits=tuple(t.limits) + tuple(warnings)) for t in traces]
    traces.sort(key=lambda t: (t.rank is None, t.rank if t.rank is not None else 0, str(t.source)))
    return TraceSet(traces, warnings)
