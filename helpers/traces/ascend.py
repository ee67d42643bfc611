"""Read a torch_npu (Ascend) profiler folder into one :class:`~helpers.traces.model.RankTrace`.

``torch_npu.profiler.profile(..., on_trace_ready=torch_npu.profiler.tensorboard_trace_handler(dir))`` writes one
folder per process, ``<worker>_<pid>_<%Y%m%d%H%M%S%f minus 3 digits>_ascend_pt/`` (worker: the handler's
``worker_name``, by default the host name; ``torch_npu/profiler/_profiler_path_creator.py``), holding the raw
data (``FRAMEWORK/``, ``PROF_<n>_<time>_<id>/``), ``profiler_info.json`` or ``profiler_info_<rank>.json`` and
``profiler_metadata.json``; parsing adds ``ASCEND_PROFILER_OUTPUT/``. What this reader takes from each file
(field meanings and wheel paths: ``docs/trace_formats.md``):

- ``ASCEND_PROFILER_OUTPUT/step_trace_time.csv`` (``TraceStepTimeParser``): one row per device and step, times in
  microseconds: ``Computing`` -> compute, ``Communication(Not Overlapped)`` -> comm_exposed, ``Communication`` ->
  comm, ``Free`` -> idle (device idle inside the step's device span);
- ``ASCEND_PROFILER_OUTPUT/trace_view.json`` (a JSON array of Chrome-trace events, streamed with ijson): the host
  ``ProfilerStep#N`` span is the step's wall time; the DataLoader's ``enumerate(DataLoader)#<Iter>.__next__`` and
  the optimizer's ``Optimizer.step#<Optimizer>.step`` inside it give data and optimizer (torch's own
  ``record_function`` names, ``torch/utils/data/dataloader.py``, ``torch/optim/optimizer.py``);
- ``operator_details.csv`` (device self time per torch operator), else ``op_statistic.csv`` (device time per
  operator type over the whole recording), else ``kernel_details.csv`` (device kernels; the window they cover is
  said, since the file may hold only part of the run): top_ops;
- ``communication.json`` (``CommunicationParser``, when HCCL ran): per step, each HCCL operator's elapse, wait,
  transit, synchronization and idle times and its bandwidth per transport (SDMA, RDMA, HCCS, PCIE), summed per
  step into ``provenance["hccl"]``; ``communication_matrix.json``: the slowest rank-to-rank link;
- ``profiler_info[_<rank>].json`` (rank_id, torch_npu_version, cann_version), ``profiler_metadata.json``
  (``parallel_group_info``: the HCCL default group's global ranks and communicator name; without a default group,
  the union of the rank's other HCCL groups' global ranks, said in ``limits``), and CANN's
  ``PROF_*/host/info.json`` (hostname).

The step's wall time: the writer's ``Stage`` is the span from the step's first to its last device activity less
pipeline receive bubbles; it leaves out ``Preparing`` (from the host's ``ProfilerStep#N`` start to the step's
first device task), which is where a step that waits for its batch spends that wait. So ``step_s`` is the host's
``ProfilerStep#N`` span (the same quantity as notebook 01's step and torch.profiler's Kineto trace), and where
trace_view.json has no such event, ``Preparing + Stage + Bubble`` (the step from its host start to its last device
activity), said in ``limits``.

Partial folders. Users often hold only part of the folder (they copied ``trace_view.json`` or
``kernel_details.csv`` alone; ``profiler_level=Level_none`` writes no step_trace_time.csv). Without
step_trace_time.csv the device phases are summed from trace_view.json's device timeline the way
``TraceStepTimeParser`` sums them (its ``Computing``, ``Communication``, ``Communication(Not Overlapped)`` and
``Free`` events, each step's device window found through the ``torch_to_npu`` flow events from the step's host
operators to their kernels); with kernel_details.csv alone, a step is its kernels (its ``Step Id`` column): the
compute time is known, the step's wall time is not, and ``limits`` says that no per-step share can be given. A
folder holding these files directly (an ``ASCEND_PROFILER_OUTPUT`` copied under another name) is read too.

This module reads the folder, step_trace_time.csv, the metadata and the top operators, and puts the steps
together. The names torch_npu writes (and the value readers the parts share) are
:mod:`helpers.traces.ascend_format`, imported here; trace_view.json and kernel_details.csv are read by
:mod:`helpers.traces.ascend_timeline`, communication.json and communication_matrix.json by
:mod:`helpers.traces.ascend_hccl`.
"""

from __future__ import annotations

import csv
import logging
import math
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from helpers.errors import DataError
from helpers.traces.ascend_format import (
    ASCEND_SUFFIX,
    BANDWIDTH_GB_S,
    BUBBLE_PREFIX,
    COMMUNICATION_FILE,
    COMMUNICATION_MATRIX_FILE,
    COMM_BANDWIDTH_INFO,
    COMM_GROUPS,
    COMM_STEP_PREFIX,
    COMM_TIME_INFO,
    DATALOADER_PREFIX,
    DATALOADER_SUFFIX,
    DEFAULT_GROUP,
    DEVICE_EVENTS,
    ELAPSE_TIME_MS,
    FLOW_CAT,
    FLOW_NAME,
    FRAMEWORK_DIR,
    HOST_OP_CAT,
    IDLE_TIME_MS,
    INFO_FILE_PATTERN,
    KERNEL_DETAILS_FILE,
    KERNEL_DEVICE,
    KERNEL_DURATION,
    KERNEL_NAME,
    KERNEL_START,
    KERNEL_STEP,
    KERNEL_TYPE,
    MATRIX_TOTAL,
    METADATA_FILE,
    NPU_LABEL,
    OFFLINE_PARSE,
    OPERATOR_DETAILS_FILE,
    OPTIMIZER_PREFIX,
    OP_STATISTIC_FILE,
    OP_STAT_COUNT,
    OP_STAT_TOTAL,
    OP_STAT_TYPE,
    OUTPUT_DIR,
    OUTPUT_FILES,
    PROCESS_LABELS,
    PROFILER_STEP_PREFIX,
    PROF_DIR_PATTERN,
    SLOW_LINK_RATIO,
    STEP_TRACE_COLUMNS,
    STEP_TRACE_FILE,
    STEP_TRACE_REQUIRED,
    SYNC_TIME_MS,
    TOTAL_OP_INFO,
    TRACE_VIEW_FILE,
    TRANSIT_SIZE_MB,
    TRANSIT_TIME_MS,
    TRANSPORT_TYPE,
    WAIT_TIME_MS,
    _TOP_OPS,
    _US,
    _int_or_none,
    _load_json,
    _ranges,
    _s,
)
from helpers.traces.ascend_hccl import _comm_from_hccl, _read_hccl
from helpers.traces.ascend_timeline import _Host, _partial_steps, _read_trace_view
from helpers.traces.model import RankTrace, StepPhases, TraceError

logger = logging.getLogger(__name__)

__all__ = [
    "ASCEND_SUFFIX", "OUTPUT_DIR", "FRAMEWORK_DIR", "STEP_TRACE_FILE", "STEP_TRACE_COLUMNS", "STEP_TRACE_REQUIRED",
    "TRACE_VIEW_FILE", "OPERATOR_DETAILS_FILE", "KERNEL_DETAILS_FILE", "COMMUNICATION_FILE",
    "COMMUNICATION_MATRIX_FILE", "OUTPUT_FILES", "METADATA_FILE", "OFFLINE_PARSE",
    "DATALOADER_PREFIX", "DATALOADER_SUFFIX", "OPTIMIZER_PREFIX", "PROFILER_STEP_PREFIX", "SLOW_LINK_RATIO",
    "looks_like_ascend", "read_ascend",
    # the other names torch_npu writes (helpers.traces.ascend_format), read here by the tests
    "PROF_DIR_PATTERN", "INFO_FILE_PATTERN", "KERNEL_NAME", "KERNEL_DURATION", "KERNEL_TYPE", "KERNEL_START",
    "KERNEL_DEVICE", "KERNEL_STEP", "DEVICE_EVENTS", "BUBBLE_PREFIX", "PROCESS_LABELS", "NPU_LABEL", "FLOW_NAME",
    "FLOW_CAT", "HOST_OP_CAT", "COMM_STEP_PREFIX", "COMM_GROUPS", "COMM_TIME_INFO", "COMM_BANDWIDTH_INFO",
    "TOTAL_OP_INFO", "WAIT_TIME_MS", "TRANSIT_TIME_MS", "SYNC_TIME_MS", "TRANSIT_SIZE_MB", "BANDWIDTH_GB_S",
    "TRANSPORT_TYPE", "ELAPSE_TIME_MS", "IDLE_TIME_MS", "MATRIX_TOTAL",
]


def looks_like_ascend(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a torch_npu profiler folder, by its name or what it holds: a ``*_ascend_pt`` folder, one
    holding ``ASCEND_PROFILER_OUTPUT/``, an ``ASCEND_PROFILER_OUTPUT`` folder, or a folder holding any of
    :data:`OUTPUT_FILES` directly (a copy of the output folder under another name).

    Parameters
    ----------
    path : path-like

    Returns
    -------
    bool
        False for a file or a missing path; only names are looked at, nothing is read.
    """
    p = Path(path)
    if not p.is_dir():
        return False
    return (p.name.endswith(ASCEND_SUFFIX) or p.name == OUTPUT_DIR or (p / OUTPUT_DIR).is_dir()
            or any((p / f).is_file() for f in OUTPUT_FILES))


def read_ascend(path: str | os.PathLike) -> RankTrace:
    """Read one torch_npu profiler folder: its steps split into phases, its rank, its top operators.

    Parameters
    ----------
    path : path-like
        The ``*_ascend_pt`` folder, its ``ASCEND_PROFILER_OUTPUT`` folder, or a folder holding some of that
        folder's files (a partial copy).

    Returns
    -------
    RankTrace
        format "ascend", device_kind "npu"; seconds everywhere. Per step: step_s (see the module docstring),
        compute / comm_exposed / comm / idle from step_trace_time.csv (without it: from trace_view.json's device
        timeline, else compute from kernel_details.csv), data and optimizer from trace_view.json's host events
        inside the step (None when the trace has no such annotation), h2d None (a torch_npu trace does not tell
        a host-to-device copy from other copies). rank / world_size / node / run_id from the folder's metadata
        (None where it does not say); provenance["hccl"] the HCCL summary of communication.json; limits says each
        thing the folder could not tell.

    Raises
    ------
    TraceError
        The folder is missing or not a torch_npu folder; it was never parsed (no ASCEND_PROFILER_OUTPUT: the
        message names :data:`OFFLINE_PARSE`); step_trace_time.csv is unreadable, lacks a column, has no rows or a
        non-numeric or negative time (checked before trace_view.json is streamed); or nothing per step can be
        read: no step_trace_time.csv, no trace_view.json with steps or a device timeline, no kernel_details.csv
        with a ``Step Id`` column (the message names the files looked for and which would help).

    Notes
    -----
    With step_trace_time.csv, trace_view.json is read only up to the end of its host part: torch_npu writes the
    host events first (the X events, then the "Python" process-name metadata, ``FwkFileParser.get_fwk_trace_data``)
    and appends the device timeline after them (``TraceViewParser``). So a file that torch_npu left without its
    device part and closing bracket (parsing failed after the host part) reads in full; a file cut inside its host
    part is not an error either: the events before the cut are used, later steps fall back to the csv's step
    span, and limits says so. Without step_trace_time.csv the whole file is streamed (its device timeline is
    needed); only the device events the step sums use are kept.
    """
    root, out = _locate(Path(path))
    limits: list[str] = []
    step_csv = out / STEP_TRACE_FILE
    used: list[Path] = []
    if step_csv.is_file():
        device_id, rows = _read_step_trace(step_csv, limits)
        meta = _read_metadata(root, limits)
        host = _read_trace_view(out / TRACE_VIEW_FILE, limits)
        steps = _merge_steps(rows, host, limits)
        used += [step_csv, out / TRACE_VIEW_FILE]
    else:
        meta = _read_metadata(root, limits)
        device_id, steps, files = _partial_steps(out, limits)
        used += files
    hccl, hccl_files = _read_hccl(out, limits)
    steps = _comm_from_hccl(steps, hccl, limits)
    top_ops, ops_file = _top_ops(out, limits, sum(st.step_s for st in steps))
    files = [*dict.fromkeys([*used, *meta.files, *hccl_files, *ops_file])]
    provenance = _provenance(root, [f for f in files if f.is_file()], meta, device_id)
    if hccl is not None:
        provenance["hccl"] = hccl.summary
    return RankTrace(source=root, format="ascend", device_kind="npu", steps=tuple(steps), rank=meta.rank,
                     world_size=meta.world_size, node=meta.node, run_id=meta.run_id, top_ops=tuple(top_ops),
                     limits=tuple(limits), provenance=provenance)


# --- the folder ---------------------------------------------------------------------------------------------


def _locate(p: Path) -> tuple[Path, Path]:
    """(the folder read, the folder holding its output files), after checking it was parsed; TraceError
    otherwise."""
    if not p.exists():
        raise TraceError(f"{str(p)!r} does not exist; pass a torch_npu profiler folder (*{ASCEND_SUFFIX})")
    if not p.is_dir():
        raise TraceError(f"{str(p)!r} is a file; pass the torch_npu profiler folder (*{ASCEND_SUFFIX}) that "
                         f"holds {OUTPUT_DIR}/, not a file inside it")
    if p.name == OUTPUT_DIR:
        return p.parent, p
    if (p / OUTPUT_DIR).is_dir():
        return p, p / OUTPUT_DIR
    if any((p / f).is_file() for f in OUTPUT_FILES):
        return p, p  # the output folder's files, copied without it
    raw = [d.name for d in _subdirs(p) if d.name == FRAMEWORK_DIR or PROF_DIR_PATTERN.match(d.name)]
    if raw or p.name.endswith(ASCEND_SUFFIX):
        found = ", ".join(sorted(raw)) or "no raw data either"
        raise TraceError(
            f"{str(p)!r} has no {OUTPUT_DIR}/ (found: {found}): the profiler stopped before parsing its "
            "data (a run interrupted, or tensorboard_trace_handler(analyse_flag=False)). Parse it on a machine "
            "with torch_npu and CANN: python -c \"from torch_npu.profiler.profiler import analyse; "
            f"analyse('{p}')\" ({OFFLINE_PARSE}), then pass the folder again")
    raise TraceError(f"{str(p)!r} is not a torch_npu profiler folder: no {OUTPUT_DIR}/, none of "
                     f"{', '.join(OUTPUT_FILES)}, no {FRAMEWORK_DIR}/ or PROF_*/ folder; pass a *{ASCEND_SUFFIX} "
                     "folder written by torch_npu.profiler")


def _subdirs(p: Path) -> list[Path]:
    try:
        return [d for d in p.iterdir() if d.is_dir()]
    except OSError:
        return []


# --- step_trace_time.csv ------------------------------------------------------------------------------------


def _read_step_trace(path: Path, limits: list[str]) -> tuple[int | None, list[dict[str, Any]]]:
    """(device id, one dict per step with the csv's times in µs) for one device; TraceError on bad input."""
    try:
        with path.open(newline="", encoding="utf-8") as f:
            table = list(csv.reader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise TraceError(f"{str(path)!r} cannot be read as CSV ({type(exc).__name__}: {exc}); parse the folder "
                         f"again with {OFFLINE_PARSE}") from exc
    if not table or not any(c.strip() for c in table[0]):
        raise TraceError(f"{str(path)!r} is empty (no header row); parse the folder again with {OFFLINE_PARSE}")
    header = [c.strip() for c in table[0]]
    missing = [c for c in STEP_TRACE_REQUIRED if c not in header]
    if missing:
        raise TraceError(f"{str(path)!r} lacks columns {missing} (has {header}); it is not torch_npu's "
                         f"step_trace_time.csv (its header is {list(STEP_TRACE_COLUMNS)})")
    body = [r for r in table[1:] if any(c.strip() for c in r)]
    if not body:
        raise TraceError(f"{str(path)!r} has its header but no rows: the profiler recorded no device activity "
                         "in a step; record more steps with ProfilerActivity.NPU, then parse again")
    rows = [_step_row(path, header, i + 2, r) for i, r in enumerate(body)]
    devices = sorted({r["Device_id"] for r in rows}, key=lambda d: (d is None, d))
    if len(devices) > 1:
        limits.append(f"{STEP_TRACE_FILE} holds devices {devices}; read device {devices[0]} only")
    rows = [r for r in rows if r["Device_id"] == devices[0]]
    for name in ("Preparing", "Bubble"):
        if name not in header:
            limits.append(f"{STEP_TRACE_FILE} has no {name} column (an older torch_npu); counted as 0")
    return devices[0], rows


def _step_row(path: Path, header: list[str], line: int, cells: list[str]) -> dict[str, Any]:
    values = dict(zip(header, (c.strip() for c in cells)))
    row: dict[str, Any] = {"Device_id": _int_or_none(values.get("Device_id"))}
    step = values.get("Step", "")
    if step in ("", "None"):
        row["Step"] = None
    else:
        try:
            row["Step"] = int(float(step))
        except ValueError:
            raise TraceError(f"{str(path)!r} line {line}: Step = {step!r} is not a step number") from None
    for name in _READ_COLUMNS:
        raw = values.get(name)
        if raw is None or raw == "":
            row[name] = None if name not in STEP_TRACE_REQUIRED else _bad(path, line, name, raw)
            continue
        try:
            v = float(raw)
        except ValueError:
            _bad(path, line, name, raw)
        if not math.isfinite(v) or (v < 0 and name != "Preparing"):  # Preparing < 0: clocks apart; clipped
            _bad(path, line, name, raw)
        row[name] = v
    return row


#: The columns read (the others are derived from these by the writer).
_READ_COLUMNS = ("Computing", "Communication(Not Overlapped)", "Communication", "Free", "Stage", "Bubble",
                 "Preparing")


def _bad(path: Path, line: int, column: str, raw: Any):
    raise TraceError(f"{str(path)!r} line {line}: {column} = {raw!r} is not a time in microseconds >= 0; "
                     f"parse the folder again with {OFFLINE_PARSE}")


# --- metadata ----------------------------------------------------------------------------------------------


@dataclass
class _Meta:
    rank: int | None = None
    world_size: int | None = None
    node: str | None = None
    run_id: str | None = None
    torch_npu_version: str | None = None
    cann_version: str | None = None
    files: tuple[Path, ...] = ()


def _read_metadata(root: Path, limits: list[str]) -> _Meta:
    """rank, world_size, node, run_id and versions from the folder's own metadata files."""
    meta = _Meta()
    files: list[Path] = []
    infos = sorted(p for p in root.glob("profiler_info*.json") if INFO_FILE_PATTERN.match(p.name))
    info = _load_json(infos[0], limits) if infos else None
    files += infos[:1]
    if isinstance(info, dict):
        meta.rank = _int_or_none(info.get("rank_id"))
        meta.torch_npu_version = _str_or_none(info.get("torch_npu_version"))
        meta.cann_version = _str_or_none(info.get("cann_version"))
    elif not infos:
        limits.append(f"no profiler_info*.json in {root.name}: rank and versions unknown")
    groups = None
    if (root / METADATA_FILE).is_file():
        files.append(root / METADATA_FILE)
        md = _load_json(root / METADATA_FILE, limits)
        groups = md.get("parallel_group_info") if isinstance(md, dict) else None
    if isinstance(groups, dict):
        for comm_name, g in groups.items():
            if isinstance(g, dict) and g.get("group_name") == DEFAULT_GROUP:
                ranks = g.get("global_ranks")
                meta.world_size = len(ranks) if isinstance(ranks, list) and ranks else None
                meta.run_id = f"hccl:{comm_name}"
                if meta.rank is None:
                    meta.rank = _int_or_none(g.get("group_rank"))
        if meta.world_size is None:
            _world_from_groups(meta, groups, limits)
    cann = _cann_info(root, limits, files)
    if isinstance(cann, dict):
        meta.node = _str_or_none(cann.get("hostname"))
        cann_rank = _int_or_none(cann.get("rank_id"))
        if meta.rank is None and cann_rank is not None and cann_rank >= 0:
            meta.rank = cann_rank
    if meta.node is None:
        limits.append("no host name in the CANN info.json (PROF_*/host/info.json): node unknown")
    if meta.rank is not None and meta.world_size is None:
        limits.append(f"{METADATA_FILE} names no HCCL default group: world size and run unknown")
    meta.files = tuple(files)
    return meta


def _world_from_groups(meta: _Meta, groups: dict, limits: list[str]) -> None:
    """Where ``parallel_group_info`` has no default group (torch_npu writes it only when the default group's HCCL
    communicator exists), the job holds at least the global ranks of the rank's other HCCL groups: their union is
    the world size (said in ``limits``), the communicator names the run."""
    ranks: set[int] = set()
    names = []
    for comm_name, g in groups.items():
        got = g.get("global_ranks") if isinstance(g, dict) else None
        if isinstance(got, list) and got and all(isinstance(r, int) and not isinstance(r, bool) for r in got):
            ranks.update(got)
            names.append(str(comm_name))
    if not ranks:
        return
    meta.world_size = len(ranks)
    meta.run_id = "hccl:" + "+".join(sorted(names))
    if meta.rank is None:
        firsts = [g for g in groups.values() if isinstance(g, dict) and isinstance(g.get("global_ranks"), list)]
        meta.rank = _int_or_none(firsts[0].get("group_rank")) if len(ranks) == len(firsts[0]["global_ranks"]) \
            else None
    listed = sorted(ranks)
    span = (f"{listed[0]}-{listed[-1]}" if len(listed) == listed[-1] - listed[0] + 1
            else ", ".join(map(str, listed[:8])) + (", ..." if len(listed) > 8 else ""))
    limits.append(f"{METADATA_FILE} lists no {DEFAULT_GROUP} in parallel_group_info; its {len(names)} HCCL "
                  f"group{'s' if len(names) > 1 else ''} hold global ranks {span}, so the job has at least "
                  f"{len(ranks)} ranks (taken as its world size; the job may hold more)")


def _cann_info(root: Path, limits: list[str], files: list[Path]) -> Any:
    """CANN's info.json (host/ first, then device_<id>/info.json.<id>), or None."""
    for prof in sorted(d for d in _subdirs(root) if PROF_DIR_PATTERN.match(d.name)):
        candidates = [prof / "host" / "info.json"]
        candidates += sorted(p for d in sorted(prof.glob("device_*")) for p in d.glob("info.json*"))
        for c in candidates:
            if c.is_file():
                files.append(c)
                return _load_json(c, limits)
    return None


def _str_or_none(v: Any) -> str | None:
    return str(v) if v not in (None, "") else None


# --- steps --------------------------------------------------------------------------------------------------


def _merge_steps(rows: list[dict[str, Any]], host: _Host | None, limits: list[str]) -> list[StepPhases]:
    """One StepPhases per csv row, in step order, with the host phases of the same step number."""
    if len(rows) == 1 and rows[0]["Step"] is None:
        limits.append(f"{STEP_TRACE_FILE} has no step numbers (no schedule, or prof.step() not called): the "
                      "whole recording is read as one step, numbered 0")
        rows = [dict(rows[0], Step=0)]
    rows = sorted((r for r in rows if r["Step"] is not None), key=lambda r: r["Step"])
    spans = host.step_span if host else {}
    fallback = [r["Step"] for r in rows if r["Step"] not in spans]
    if fallback:
        limits.append(f"steps {_ranges(fallback)} have no host ProfilerStep#N span in {TRACE_VIEW_FILE}: their "
                      "step time is Preparing + Stage + Bubble of step_trace_time.csv (host start of the step "
                      "to its last device activity)")
    out = []
    for r in rows:
        n = r["Step"]
        if n in spans:
            step_us = spans[n][1] - spans[n][0]
        else:
            step_us = max(r["Preparing"] or 0.0, 0.0) + r["Stage"] + (r["Bubble"] or 0.0)
        data = host.data.get(n) if host and host.data is not None and n in spans else None
        opt = host.optimizer.get(n) if host and host.optimizer is not None and n in spans else None
        try:
            out.append(StepPhases(
                step=n, step_s=step_us * _US, data=_s(data), h2d=None, optimizer=_s(opt),
                compute=_s(r["Computing"]), comm_exposed=_s(r["Communication(Not Overlapped)"]),
                idle=_s(r["Free"]), comm=_s(r["Communication"])))
        except TraceError as exc:
            raise TraceError(f"{STEP_TRACE_FILE}: {exc}; parse the folder again with {OFFLINE_PARSE}") from None
    limits.append("h2d unknown: a torch_npu trace does not tell a host-to-device copy from other copies; "
                  "the exposed input share counts the DataLoader wait only")
    return out


# --- top operators -----------------------------------------------------------------------------------------


def _top_ops(out: Path, limits: list[str], recorded_s: float = 0.0) -> tuple[list[dict[str, Any]], list[Path]]:
    """Device time per torch operator (operator_details.csv), else per operator type over the whole recording
    (op_statistic.csv), else per kernel (kernel_details.csv, which may hold only part of the run: the window its
    kernels cover is said in ``limits``, against ``recorded_s``, the steps' total in seconds), and the file it came
    from."""
    ops = out / OPERATOR_DETAILS_FILE
    if ops.is_file():
        # diagnose.profiler owns the operator_details aggregation; traces -> diagnose is the one direction.
        from helpers.diagnose.profiler import top_ops_from_operator_details

        try:
            table = top_ops_from_operator_details(ops, row_limit=10_000)
        except (DataError, OSError, ValueError) as exc:
            limits.append(f"{OPERATOR_DETAILS_FILE} not used: {exc}")
        else:
            table = table[table["self_device_ms"].fillna(0) > 0]
            if len(table):
                table = table.sort_values(["self_device_ms", "name"], ascending=[False, True], kind="mergesort")
                return [{"name": str(r.name), "calls": int(r.calls), "self_ms": float(r.self_device_ms),
                         "where": "device"} for r in table.head(_TOP_OPS).itertuples()], [ops]
    stats = out / OP_STATISTIC_FILE
    if stats.is_file():
        found = _op_statistic(stats, limits)
        if found:
            limits.append(f"top operators from {OP_STATISTIC_FILE}: device time per operator type over the whole "
                          "recording (every step, and any device work between them)")
            return found, [stats]
    kernels = out / KERNEL_DETAILS_FILE
    if kernels.is_file():
        found = _kernel_totals(kernels, limits, recorded_s)
        if found:
            return found, [kernels]
    limits.append(f"no device time per operator ({OPERATOR_DETAILS_FILE}, {KERNEL_DETAILS_FILE}): top_ops empty")
    return [], []


def _op_statistic(path: Path, limits: list[str]) -> list[dict[str, Any]]:
    """The top operator types of op_statistic.csv (``OP Type``, ``Count``, ``Total Time(us)``), summed over its
    devices and core types; [] (and a line in ``limits``) where the file cannot be used."""
    totals: dict[str, list[float]] = {}
    try:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            if not reader.fieldnames or {OP_STAT_TYPE, OP_STAT_COUNT, OP_STAT_TOTAL} - set(reader.fieldnames):
                limits.append(f"{OP_STATISTIC_FILE} lacks {OP_STAT_TYPE!r}, {OP_STAT_COUNT!r} or {OP_STAT_TOTAL!r}; "
                              "not used")
                return []
            for row in reader:
                try:
                    us, n = float(row[OP_STAT_TOTAL]), int(float(row[OP_STAT_COUNT]))
                except (TypeError, ValueError):
                    continue
                if math.isfinite(us) and us >= 0 and n >= 0:
                    t = totals.setdefault(str(row[OP_STAT_TYPE]), [0, 0.0])
                    t[0] += n
                    t[1] += us
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        limits.append(f"{OP_STATISTIC_FILE} could not be read ({type(exc).__name__}: {exc}); not used")
        return []
    ranked = sorted(totals.items(), key=lambda kv: (-kv[1][1], kv[0]))[:_TOP_OPS]
    return [{"name": k, "calls": int(c), "self_ms": us / 1000.0, "where": "device"} for k, (c, us) in ranked if us > 0]


def _kernel_totals(path: Path, limits: list[str], recorded_s: float = 0.0) -> list[dict[str, Any]]:
    """The top kernels of kernel_details.csv by total duration; the window its kernels cover (first start to last
    end) is said in ``limits``, as a share of ``recorded_s`` where that is known."""
    totals: dict[str, list[float]] = {}
    first, last = math.inf, -math.inf
    try:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            if not reader.fieldnames or {KERNEL_NAME, KERNEL_DURATION} - set(reader.fieldnames):
                limits.append(f"{KERNEL_DETAILS_FILE} lacks {KERNEL_NAME!r} or {KERNEL_DURATION!r}; not used")
                return []
            for row in reader:
                try:
                    us = float(row[KERNEL_DURATION])
                except (TypeError, ValueError):
                    continue
                t = totals.setdefault(row[KERNEL_NAME], [0, 0.0])
                t[0] += 1
                t[1] += us
                try:
                    start = float(str(row.get(KERNEL_START) or "").strip())
                except ValueError:
                    continue
                if math.isfinite(start) and math.isfinite(us):
                    first, last = min(first, start), max(last, start + us)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        limits.append(f"{KERNEL_DETAILS_FILE} could not be read ({type(exc).__name__}: {exc}); not used")
        return []
    if totals and last > first:
        window_s = (last - first) / 1e6
        of = (f" of the {_ms_text(recorded_s)} recorded ({window_s / recorded_s:.0%})"
              if recorded_s > 0 and window_s < recorded_s else "")
        limits.append(f"top operators from {KERNEL_DETAILS_FILE}, whose kernels span {_ms_text(window_s)} from the "
                      f"first start to the last end{of}: the table covers that window only")
    ranked = sorted(totals.items(), key=lambda kv: (-kv[1][1], kv[0]))[:_TOP_OPS]
    return [{"name": k, "calls": int(c), "self_ms": us / 1000.0, "where": "device"} for k, (c, us) in ranked]


def _ms_text(seconds: float) -> str:
    return f"{seconds:,.1f} s" if seconds >= 10 else f"{seconds * 1e3:,.0f} ms"


# --- provenance --------------------------------------------------------------------------------------------


def _provenance(root: Path, files: list[Path], meta: _Meta, device_id: int | None) -> dict[str, Any]:
    stats = [f.stat() for f in files]
    newest = max((s.st_mtime for s in stats), default=root.stat().st_mtime)
    prov: dict[str, Any] = {
        "path": str(root),
        "bytes": int(sum(s.st_size for s in stats)),
        "mtime": datetime.fromtimestamp(newest, tz=timezone.utc).isoformat(),
        "reader": "ascend",
        "files": [str(f.relative_to(root)) for f in files],
    }
    for key in ("torch_npu_version", "cann_version"):
        if getattr(meta, key):
            prov[key] = getattr(meta, key)
    if device_id is not None:
        prov["device_id"] = device_id
    return prov
