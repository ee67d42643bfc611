"""A trace's identity (rank, world size, host, run, time) read cheaply, before the big file is read.

:mod:`helpers.traces.cluster` checks a folder of ranks (two traces claiming one rank, world sizes that disagree,
runs mixed, ranks missing) from these headers before any reader parses the events.

* Kineto (torch.profiler's Chrome-trace JSON, maybe gzipped): torch writes its metadata as top-level keys before
  ``traceEvents`` (``schemaVersion``, ``deviceProperties``, ``trace_id``, ``distributedInfo`` with ``backend``,
  ``rank``, ``world_size``, ``pg_config``; ``host_name``, ``baseTimeNanoseconds``; seen in torch 2.13's output).
  :func:`kineto_header` streams the top-level keys with ijson and stops at the first event of ``traceEvents``
  (whose ``ts``, microseconds, plus ``baseTimeNanoseconds`` is the wall-clock time the trace starts): a few KB of
  a file of any size. Only a file whose metadata follows the events (no ``schemaVersion`` before them) is
  scanned to its end, tokenized but never built into objects. Nesting, the bytes scanned and the length of each
  token are bounded (:data:`MAX_DEPTH`, :data:`MAX_SCAN_BYTES`, :data:`MAX_TOKEN_BYTES`), so that a hostile file
  is refused in one line, in bounded time and memory.
* Ascend (a torch_npu ``*_ascend_pt`` folder): ``profiler_info_<rank>.json`` holds ``rank_id`` and
  ``end_info.collectionTimeEnd`` (ns, wall clock); ``profiler_metadata.json`` holds ``parallel_group_info``,
  whose ``default_group`` lists the ``global_ranks`` (torch_npu 2.13.0, ``profiler/profiler_interface.py``
  ``_dump_profiler_info`` and ``_add_group_info_to_metadata``). Both are small files.
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers.traces.model import TraceError

__all__ = ["Header", "kineto_header", "ascend_header", "header"]

_HEADER_KEYS = ("schemaVersion", "deviceProperties", "baseTimeNanoseconds", "distributedInfo")


@dataclass(frozen=True)
class Header:
    """What a trace says about whose it is, read without its events.

    Attributes
    ----------
    path : pathlib.Path
        The file or folder.
    format : str
        "kineto" or "ascend".
    rank, world_size : int or None
        The file's own distributed metadata; None for a single-process trace.
    node : str or None
        The host, where the trace names it (Kineto ``host_name``).
    run_id : str or None
        What ranks of one run share: ``"<backend> world <N>"`` (the process group's backend and size); None
        without distributed metadata. Runs of the same job share it too: :attr:`start_ns` and the rank
        uniqueness tell those apart.
    start_ns, end_ns : int or None
        Wall-clock time (ns since the epoch) the trace starts (Kineto) or its collection ends (Ascend).
    complete : bool
        False where the header read stopped before the metadata a file writes after its events (past
        :data:`MAX_SCAN_BYTES`): the identity is then checked after the full read.
    """

    path: Path
    format: str
    rank: int | None = None
    world_size: int | None = None
    node: str | None = None
    run_id: str | None = None
    start_ns: int | None = None
    end_ns: int | None = None
    complete: bool = True


def _open(path: Path):
    with open(path, "rb") as f:
        magic = f.read(2)
    return gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")


def _int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, str) and re.fullmatch(r"\d+", v.strip()):
        return int(v)
    return None


def kineto_header(path: str | Path) -> Header:
    """The identity of a Kineto trace from its top-level metadata (events are not read; see the module).

    Parameters
    ----------
    path : str or Path
        A ``*.pt.trace.json`` or ``*.pt.trace.json.gz`` file (gzip recognized by its magic bytes).

    Returns
    -------
    Header

    Raises
    ------
    TraceError
        The file cannot be opened, is not JSON, or is not a Chrome trace (no top-level ``traceEvents``); the
        message names the file.
    """
    import ijson

    path = Path(path)
    meta: dict[str, Any] = {}
    first_ts = None
    seen_events = False
    complete = True
    try:
        with _open(path) as raw:
            f = _Counted(raw, path)
            events = ijson.basic_parse(f, buf_size=READ_BYTES, use_float=True)
            ev = next(events, None)
            if ev is None or ev[0] != "start_map":
                raise TraceError(f"{path}: the top level is not a JSON object; a Kineto trace is an object with "
                                 "'traceEvents' (torch.profiler's export_chrome_trace or tensorboard_trace_handler)")
            for event, value in events:
                if event == "end_map":
                    break
                if event != "map_key":
                    continue
                if value != "traceEvents":
                    meta[value] = _build(events, path)
                    continue
                seen_events = True
                first_ts = _skip_events(events, f, path, early=any(k in meta for k in _HEADER_KEYS))
                if first_ts is _INCOMPLETE:
                    first_ts, complete = None, False
                    break
                if any(k in meta for k in _HEADER_KEYS):
                    break  # torch's layout: the metadata came first
    except TraceError:
        raise
    except (OSError, EOFError) as exc:
        raise TraceError(f"{path}: cannot be read ({type(exc).__name__}: {exc}); check the path and that the file is "
                         "complete") from exc
    except Exception as exc:  # ijson.JSONError, ijson.IncompleteJSONError, gzip.BadGzipFile, UnicodeDecodeError
        text = " ".join(str(exc).split())  # one line: yajl's messages point at the text over several
        cut = "incomplete" in type(exc).__name__.lower() and ("premature" in text.lower() or not text.strip())
        why = ("the file ends early (a file cut short by a killed job cannot be read: profile again)" if cut else
               "the file is corrupt or was not written by torch.profiler (e.g. NaN or Infinity, or text that "
               "is not JSON)")
        raise TraceError(f"{path}: not valid JSON ({type(exc).__name__}: {text[:200]}): {why}") from exc
    if not seen_events:
        raise TraceError(f"{path}: no 'traceEvents' at the top level, so it is not a Chrome trace; pass the "
                         "*.pt.trace.json file torch.profiler wrote")
    dist = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
    rank, world = _int(dist.get("rank")), _int(dist.get("world_size"))
    backend = dist.get("backend")
    base = meta.get("baseTimeNanoseconds")
    start = (int(base + first_ts * 1000) if isinstance(base, (int, float)) and not isinstance(base, bool)
             and first_ts is not None else None)
    node = meta.get("host_name") if isinstance(meta.get("host_name"), str) and meta.get("host_name") else None
    run_id = f"{backend or 'unknown backend'} world {world}" if world is not None else None
    return Header(path=path, format="kineto", rank=rank, world_size=world, node=node, run_id=run_id,
                  start_ns=start, complete=complete)


#: Nesting deeper than this in a trace's metadata or events is not a profiler's (Kineto's events nest their
#: ``args`` two or three levels): the header read refuses it rather than follow it.
MAX_DEPTH = 64
#: Bytes (uncompressed) the header read scans for metadata written after the events before it stops: the
#: header is then marked incomplete and the ranks are checked after the full read instead.
MAX_SCAN_BYTES = 64 << 20
#: The longest string, number or literal the header read lets ijson lex, bytes: one that runs on past the end of a
#: read after more than this many bytes is refused (so one of up to this plus :data:`READ_BYTES` may pass). yajl
#: (ijson's backend) keeps a token that runs past the end of a read in a buffer and lexes it again from its start
#: after every read, so a token of n bytes costs ~n**2 / (2 * READ_BYTES) bytes of lexing and n bytes of memory or
#: more: a trace of one 300 MB string took longer than the 120 s it was given (issue 44). torch.profiler's longest
#: strings are kernel names of templated code, a few KB, and its numbers a few dozen digits: 1 MiB leaves a margin
#: of a hundredfold, is the reader's bound on a name too (``kineto.MAX_STRING_CHARS``), and costs ~8 MiB of lexing
#: to reach (milliseconds).
MAX_TOKEN_BYTES = 1 << 20
#: Bytes ijson reads at a time (its default).
READ_BYTES = 64 << 10
_ESCAPE = re.compile(rb"\\.", re.S)  # a backslash and the byte it escapes
_BARE = re.compile(rb'[^\s"{}\[\],:]*')  # bytes of a number or literal (read backwards from the end of a read)
_INCOMPLETE = object()


class _Counted:
    """A binary file that counts the bytes read from it and refuses a JSON token longer than
    :data:`MAX_TOKEN_BYTES` as it reads it, before ijson's lexer holds it (see there).

    A string is followed from read to read by its quotes (its escapes masked first, so that ``\\"`` ends none), a
    number or literal as a run of bytes that are neither JSON punctuation nor whitespace: a few scans of each read
    in C, ~4 ms per MB. A token that ends within the read it starts in is not measured (ijson lexes it once).
    ``writer`` and ``todo`` end the error: who writes such files, and what to pass instead.
    """

    def __init__(self, f, path="the trace", *, writer: str = "torch.profiler",
                 todo: str = "pass the .pt.trace.json torch.profiler wrote, unchanged") -> None:
        self.f, self.path, self.n = f, path, 0
        self.writer, self.todo = writer, todo
        self.in_string = False  # the text read so far ends inside a string
        self.escape = False  # ... right after one of its backslashes
        self.start = -1  # the text's byte at which the token it ends in starts; -1: it ends between tokens

    def read(self, size: int = -1) -> bytes:
        b = self.f.read(size)
        if b:
            self._watch(b)
        self.n += len(b)
        return b

    def _watch(self, b: bytes) -> None:
        skip = 1 if self.escape else 0  # the byte a backslash at the end of the last read escapes
        base = self.n + skip  # the text's byte at s[0]
        s = b[skip:]
        if b"\\" in s:
            s = _ESCAPE.sub(b"__", s)
        self.escape = False
        out = 0  # where the text outside strings starts in s
        if self.in_string:
            out = s.find(b'"') + 1
            if out == 0:  # the string goes on past this read
                self.escape = s.endswith(b"\\")
                self._check(base + len(s))
                return
            self.in_string, self.start = False, -1
        if s.count(b'"', out) % 2:  # outside strings, quotes open and close them in turn: the last one opens
            self.in_string, self.start = True, base + s.rfind(b'"')
            self.escape = s.endswith(b"\\")
        else:
            bare = min(_BARE.match(s[::-1]).end(), len(s) - out)  # a number or literal the read ends in
            if bare == 0:
                self.start = -1
            elif bare < len(s) - out or self.start < 0:
                self.start = base + len(s) - bare
            # else the whole read goes on with the number or literal the last one ended in
        self._check(base + len(s))

    def _check(self, end: int) -> None:
        if self.start >= 0 and end - self.start > MAX_TOKEN_BYTES:
            what = "a string" if self.in_string else "a number or literal"
            raise TraceError(f"{self.path}: {what} in the JSON runs on for more than {MAX_TOKEN_BYTES >> 20} MiB "
                             f"from byte {self.start:,} of its text ({self.writer}'s longest strings, kernel names, "
                             f"are a few KB), so the file is corrupt or was not written by {self.writer}; {self.todo}")


def _too_deep(path) -> TraceError:
    return TraceError(f"{path}: the JSON is nested more than {MAX_DEPTH} levels deep, which no profiler writes: the "
                      "file is corrupt or not a trace; pass the .pt.trace.json torch.profiler wrote")


def _nest(event: str, depth: int, path) -> int:
    """The nesting depth after ``event``, refusing more than :data:`MAX_DEPTH` levels."""
    if event in ("start_map", "start_array"):
        depth += 1
        if depth > MAX_DEPTH:
            raise _too_deep(path)
    elif event in ("end_map", "end_array"):
        depth -= 1
    return depth


def _skip_events(events, f: _Counted, path, *, early: bool) -> Any:
    """The first event's ``ts`` (or None): at once where ``early`` (the metadata came first, torch's layout),
    else after the whole traceEvents array, or _INCOMPLETE when that scan passed :data:`MAX_SCAN_BYTES`."""
    depth, key, first_ts = 0, None, None
    for event, value in events:
        depth = _nest(event, depth, path)
        if depth == 0:  # the array's end
            return first_ts
        if event == "map_key":
            key = value
        elif first_ts is None and depth == 2 and key == "ts" and event == "number":
            first_ts = float(value)
            if early:
                return first_ts
        if f.n > MAX_SCAN_BYTES and first_ts is not None:
            return _INCOMPLETE
    raise TraceError(f"{path}: the file ends inside traceEvents: it is cut short (a killed job?); profile again")


def _build(events, path="the trace") -> Any:
    """The next complete JSON value of an ijson basic_parse stream, as Python objects (nesting bounded)."""
    import ijson

    builder = ijson.ObjectBuilder()
    depth = 0
    for event, value in events:
        builder.event(event, value)
        depth = _nest(event, depth, path)
        if depth == 0:
            return builder.value
    raise TraceError(f"{path}: the trace ends inside its metadata: the file is cut short")


def ascend_header(path: str | Path) -> Header:
    """The identity of a torch_npu profiler folder from its ``profiler_info_*.json`` and ``profiler_metadata.json``.

    Parameters
    ----------
    path : str or Path
        A ``*_ascend_pt`` folder, its ``ASCEND_PROFILER_OUTPUT`` folder (read from its parent), or a partial copy
        of it (:func:`helpers.traces.ascend.looks_like_ascend`).

    Returns
    -------
    Header
        Fields left None where the folder lacks the file (the reader then says what is missing).

    Raises
    ------
    TraceError
        A metadata file that is not valid JSON, or two ``profiler_info_*.json`` in one folder; the message names
        the file.
    """
    path = Path(path)
    where = path.parent if path.name == "ASCEND_PROFILER_OUTPUT" else path  # the output folder passed: its parent
    infos = sorted(where.glob("profiler_info_*.json")) or sorted(where.glob("profiler_info.json"))
    if len(infos) > 1:
        raise TraceError(f"{path}: holds {len(infos)} profiler_info files ({', '.join(p.name for p in infos)}); one "
                         "torch_npu profiler folder is one rank's - keep each rank's folder separate")
    rank = end = None
    if infos:
        info = _load_json(infos[0])
        rank = _int(info.get("rank_id")) if isinstance(info, dict) else None
        if rank is None:
            m = re.fullmatch(r"profiler_info_(\d+)\.json", infos[0].name)
            rank = int(m.group(1)) if m else None
        end_info = info.get("end_info") if isinstance(info, dict) else None
        end = _int(end_info.get("collectionTimeEnd")) if isinstance(end_info, dict) else None
    world = None
    meta_path = where / "profiler_metadata.json"
    if meta_path.is_file():
        meta = _load_json(meta_path)
        groups = meta.get("parallel_group_info") if isinstance(meta, dict) else None
        if isinstance(groups, dict):
            for g in groups.values():
                if isinstance(g, dict) and g.get("group_name") == "default_group" and isinstance(
                        g.get("global_ranks"), list):
                    world = len(g["global_ranks"])
    run_id = f"hccl world {world}" if world is not None else None
    return Header(path=path, format="ascend", rank=rank, world_size=world, run_id=run_id, end_ns=end)


def _load_json(p: Path) -> Any:
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TraceError(f"{p}: cannot be read as JSON ({type(exc).__name__}: {exc}); the torch_npu profiler folder "
                         "is incomplete - copy it again or profile again") from exc


def header(path: str | Path, fmt: str) -> Header:
    """:func:`kineto_header` or :func:`ascend_header` by ``fmt`` ("kineto" or "ascend")."""
    if fmt == "kineto":
        return kineto_header(path)
    if fmt == "ascend":
        return ascend_header(path)
    raise TraceError(f"{path}: unknown trace format {fmt!r}; 'kineto' or 'ascend'")
