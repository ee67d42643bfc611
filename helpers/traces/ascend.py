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
- ``operator_details.csv`` (device self time per torch operator), else ``kernel_details.csv`` (device kernels):
  top_ops;
- ``communication.json`` (``CommunicationParser``, when HCCL ran): per step, each HCCL operator's elapse, wait,
  transit, synchronization and idle times and its bandwidth per transport (SDMA, RDMA, HCCS, PCIE), summed per
  step into ``provenance["hccl"]``; ``communication_matrix.json``: the slowest rank-to-rank link;
- ``profiler_info[_<rank>].json`` (rank_id, torch_npu_version, cann_version), ``profiler_metadata.json``
  (``parallel_group_info``: the HCCL default group's global ranks and communicator name), and CANN's
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
"""

from __future__ import annotations

import bisect
import csv
import json
import logging
import math
import os
import re
import statistics
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from helpers.errors import DataError
from helpers.traces.model import RankTrace, StepPhases, TraceError

logger = logging.getLogger(__name__)

__all__ = [
    "ASCEND_SUFFIX", "OUTPUT_DIR", "FRAMEWORK_DIR", "STEP_TRACE_FILE", "STEP_TRACE_COLUMNS", "STEP_TRACE_REQUIRED",
    "TRACE_VIEW_FILE", "OPERATOR_DETAILS_FILE", "KERNEL_DETAILS_FILE", "COMMUNICATION_FILE",
    "COMMUNICATION_MATRIX_FILE", "OUTPUT_FILES", "METADATA_FILE", "OFFLINE_PARSE",
    "DATALOADER_PREFIX", "DATALOADER_SUFFIX", "OPTIMIZER_PREFIX", "PROFILER_STEP_PREFIX", "SLOW_LINK_RATIO",
    "looks_like_ascend", "read_ascend",
]

# Names below are torch_npu 2.13.0's (torch_npu/profiler/analysis/...); tests/test_ascend_format.py reads them
# from the wheel's source and fails when they drift.
#: Suffix of a profiler folder (``_profiler_path_creator.py``: ``"{}_{}_ascend_pt"``).
ASCEND_SUFFIX = "_ascend_pt"
#: Parsed output folder (``Constant.OUTPUT_DIR``).
OUTPUT_DIR = "ASCEND_PROFILER_OUTPUT"
#: Raw host-side data folder (``Constant.FRAMEWORK_DIR``).
FRAMEWORK_DIR = "FRAMEWORK"
#: Raw CANN data folder (``ProfilerPathManager.get_cann_path``).
PROF_DIR_PATTERN = re.compile(r"^PROF_\d+_\d+_[0-9a-zA-Z]+")
#: Profiler info file (``ProfilerPathManager.get_info_file_path``).
INFO_FILE_PATTERN = re.compile(r"^profiler_info(_\d+)?\.json$")
METADATA_FILE = "profiler_metadata.json"
STEP_TRACE_FILE = "step_trace_time.csv"
#: ``TraceStepTimeParser.title``: the header row of step_trace_time.csv, in order.
STEP_TRACE_COLUMNS: tuple[str, ...] = (
    "Device_id", "Step", "Computing", "Communication(Not Overlapped)", "Overlapped", "Communication", "Free",
    "Stage", "Bubble", "Communication(Not Overlapped and Exclude Receive)", "Preparing",
)
#: The columns this reader needs (older torch_npu releases lack Device_id, Bubble and Preparing).
STEP_TRACE_REQUIRED: tuple[str, ...] = (
    "Step", "Computing", "Communication(Not Overlapped)", "Communication", "Free", "Stage",
)
TRACE_VIEW_FILE = "trace_view.json"
OPERATOR_DETAILS_FILE = "operator_details.csv"
KERNEL_DETAILS_FILE = "kernel_details.csv"
#: ``kernel_details.csv``'s name and duration columns (``CsvHeaders.OP_SUMMARY_KERNEL_BASE_HEADERS``), µs.
KERNEL_NAME, KERNEL_DURATION = "Name", "Duration(us)"
#: Its kernel type, start (µs, CANN writes it with a trailing tab that ``convert_us2ns`` strips) and device.
KERNEL_TYPE, KERNEL_START, KERNEL_DEVICE = "Type", "Start Time(us)", "Device_id"
#: The first column of kernel_details.csv when the profiler recorded steps (``KernelViewParser``:
#: ``["Step Id"] + output_headers``); empty for a kernel outside every step.
KERNEL_STEP = "Step Id"
#: ``CommunicationParser.COMMUNICATION`` and ``.COMMUNICATION_MATRIX``.
COMMUNICATION_FILE = "communication.json"
COMMUNICATION_MATRIX_FILE = "communication_matrix.json"
#: The files the parse writes into ASCEND_PROFILER_OUTPUT that this reader can use; a folder holding any of them
#: directly is read as an output folder.
OUTPUT_FILES: tuple[str, ...] = (STEP_TRACE_FILE, TRACE_VIEW_FILE, KERNEL_DETAILS_FILE, OPERATOR_DETAILS_FILE,
                                 COMMUNICATION_FILE)
#: The offline parse of a folder left unparsed (``torch_npu/profiler/profiler.py``, ``__all__``).
OFFLINE_PARSE = "torch_npu.profiler.profiler.analyse"
#: torch's record_function names (torch 2.13 ``torch/utils/data/dataloader.py`` and ``torch/optim/optimizer.py``).
DATALOADER_PREFIX, DATALOADER_SUFFIX = "enumerate(DataLoader)#", ".__next__"
OPTIMIZER_PREFIX = "Optimizer.step#"
PROFILER_STEP_PREFIX = "ProfilerStep#"

# The device timeline in trace_view.json (CANN's msprof timeline, appended by TraceViewParser), as
# TraceStepTimeParser.create_step_file reads it:
#: ``TraceStepTimeParser.timeflag``: the device events summed per step, and the phase each is read as.
DEVICE_EVENTS: dict[str, str] = {"Computing": "compute", "Communication": "comm",
                                 "Communication(Not Overlapped)": "comm_exposed", "Free": "idle"}
#: Events whose name starts so are pipeline receive waits (``timeflag["hcom_receive"]`` = "bubble").
BUBBLE_PREFIX = "hcom_receive"
#: A device process: its ``process_labels`` metadata event's ``args.labels`` is "NPU <id>" ("NPU": id -1).
PROCESS_LABELS, NPU_LABEL = "process_labels", "NPU"
#: ``TraceEventManager.create_torch_to_npu_flow``: a flow from a host operator (``ph`` "s", its pid/tid/ts) to
#: the kernel it launched (``ph`` "f"); the flow's ``id`` is the kernel's start in ns.
FLOW_NAME, FLOW_CAT = "torch_to_npu", "async_npu"
#: A host operator's ``cat`` (``FwkFileParser.get_fwk_trace_data``); every host event has a ``cat``
#: (``TraceEventManager.create_x_event``), the device timeline's events have none.
HOST_OP_CAT = "cpu_op"

# communication.json (CommunicationParser): {"step<N>" (or "step" without steps): {"p2p": {...}, "collective":
# {"<op>@<group>": {COMM_TIME_INFO: {...}, COMM_BANDWIDTH_INFO: {"<transport>": {...}}}, TOTAL_OP_INFO: {...}}}}
COMM_STEP_PREFIX = "step"
COMM_GROUPS: tuple[str, ...] = ("p2p", "collective")
COMM_TIME_INFO = "Communication Time Info"
COMM_BANDWIDTH_INFO = "Communication Bandwidth Info"
#: The summary entry the writer adds to each group (``compute_total_info``); its ops' sum, so it is skipped.
TOTAL_OP_INFO = "Total Op Info"
WAIT_TIME_MS = "Wait Time(ms)"
TRANSIT_TIME_MS = "Transit Time(ms)"
SYNC_TIME_MS = "Synchronization Time(ms)"
TRANSIT_SIZE_MB = "Transit Size(MB)"
BANDWIDTH_GB_S = "Bandwidth(GB/s)"
TRANSPORT_TYPE = "Transport Type"
#: CANN's own names (msprof's analyze output, which torch_npu copies through: ``combine_time_info`` sums every
#: time key but the ratios and the start): the op's duration on the device, and its time neither waiting nor
#: transferring.
ELAPSE_TIME_MS = "Elapse Time(ms)"
IDLE_TIME_MS = "Idle Time(ms)"
#: communication_matrix.json's per-op summary over its links (``integrate_matrix_data``: "<type>-total@<group>").
MATRIX_TOTAL = "-total@"

#: A transport (or a rank-to-rank link) whose bandwidth is below this share of the fastest other one is named
#: in ``limits`` as the slow link.
SLOW_LINK_RATIO = 0.25

_US = 1e-6  # seconds per microsecond: every time torch_npu writes is in µs
_TOP_OPS = 20


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
    top_ops, ops_file = _top_ops(out, limits)
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


def _int_or_none(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


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


def _load_json(path: Path, limits: list[str]) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        limits.append(f"{path.name} could not be read ({type(exc).__name__}: {exc}); its facts are unknown")
        return None


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
            if isinstance(g, dict) and g.get("group_name") == "default_group":
                ranks = g.get("global_ranks")
                meta.world_size = len(ranks) if isinstance(ranks, list) and ranks else None
                meta.run_id = f"hccl:{comm_name}"
                if meta.rank is None:
                    meta.rank = _int_or_none(g.get("group_rank"))
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


# --- trace_view.json ---------------------------------------------------------------------------------------


@dataclass
class _Device:
    """What trace_view.json's device timeline said for one device: per step number (None: the whole recording,
    no steps marked), the phase sums of :data:`DEVICE_EVENTS` and ``stage``, ``bubble``, ``prepare`` (all µs)."""

    device_id: int | None
    devices: list[int]
    steps: dict[int | None, dict[str, float]]
    windows: str  # "kernels" (as torch_npu), "host" (no flow events: from the host spans) or "all" (no steps)


@dataclass
class _Host:
    """What trace_view.json said about the host, per step number (all µs), and its device timeline if read."""

    step_span: dict[int, tuple[float, float]]
    data: dict[int, float] | None  # None: no DataLoader annotation anywhere
    optimizer: dict[int, float] | None
    events: int = 0
    device: _Device | None = None
    host_only: bool = False  # the file stops right after its host part: no device timeline was appended
    device_events: int = 0  # device events other than the step sums' (kernels, HCCL tasks), when read


@dataclass
class _Scan:
    """The events kept while streaming trace_view.json (µs, but kernel starts and ends in ns)."""

    device: bool
    steps: dict[int, tuple[float, float, Any]] = field(default_factory=dict)
    loads: list[tuple[float, float, Any]] = field(default_factory=list)
    opts: list[tuple[float, float, Any]] = field(default_factory=list)
    host_done: bool = False  # the host part's "Python" process name was seen
    labels: dict[Any, int] = field(default_factory=dict)  # pid -> NPU id
    phases: list[tuple[Any, str, float, float]] = field(default_factory=list)  # (pid, phase, ts, dur)
    flows: list[tuple[float, int]] = field(default_factory=list)  # (host operator ts, kernel start ns)
    kernel_end: dict[int, int] = field(default_factory=dict)  # device event start ns -> its latest end ns
    first_host: float | None = None  # the first host operator's start


def _read_trace_view(path: Path, limits: list[str], device: bool = False) -> _Host | None:
    """Stream trace_view.json, keeping the step, DataLoader and optimizer events (and with ``device`` the
    device timeline's step sums); None if absent."""
    if not path.is_file():
        limits.append(f"no {TRACE_VIEW_FILE}: host phases (data, optimizer) unknown")
        return None
    import ijson

    scan = _Scan(device=device)
    count = 0
    cut: Exception | None = None
    try:
        with path.open("rb") as f:
            for ev in ijson.items(f, "item", use_float=True, buf_size=1 << 20):
                count += 1
                if _take(ev, scan) and not device and (scan.steps or scan.loads or scan.opts):
                    break  # the host's own events are all read; the rest is the device timeline
    except (ijson.JSONError, ValueError, OSError) as exc:
        cut = exc
    host_only = cut is not None and scan.host_done and not scan.phases and not scan.flows
    if cut is not None and host_only:
        limits.append(f"{TRACE_VIEW_FILE} ends right after its host events, without the device timeline and the "
                      "closing bracket: torch_npu leaves it so when parsing fails after the host part was written; "
                      "the host steps are whole, the device timeline is missing")
    elif cut is not None:
        limits.append(f"{TRACE_VIEW_FILE} stops before its end after {count} events ({type(cut).__name__}: "
                      f"{cut}); torch_npu leaves it so when parsing fails after the host events were written; "
                      "host phases come from the events before the cut, steps after it have none")
    if count == 0:
        limits.append(f"{TRACE_VIEW_FILE} holds no events as a JSON array: host phases unknown")
    host = _host_phases(scan.steps, scan.loads, scan.opts, count, limits)
    host.host_only = host_only
    if device:
        host.device = _device_steps(scan, host.step_span, limits)
        host.device_events = len(scan.kernel_end)
    return host


def _take(ev: Any, scan: _Scan) -> bool:
    """File one event; True at the host part's end (its "Python" process name)."""
    if not isinstance(ev, dict):
        return False
    ph, name = ev.get("ph"), ev.get("name")
    if ph == "M":
        args = ev.get("args")
        if not isinstance(args, dict):
            return False
        if name == "process_name" and args.get("name") == "Python":
            scan.host_done = True
            return True
        if scan.device and name == PROCESS_LABELS:
            label = args.get("labels")
            if isinstance(label, str) and label.startswith(NPU_LABEL):  # TraceStepTimeParser: "NPU 0"; "NPU": -1
                dev = -1 if label == NPU_LABEL else _int_or_none(label.split(" ")[-1])
                if dev is not None:
                    scan.labels[ev.get("pid")] = dev
        return False
    if not scan.device and ph != "X":
        return False
    if ph == "s" and ev.get("cat") == FLOW_CAT and name == FLOW_NAME:
        ts, kernel = _us(ev.get("ts")), _flow_ns(ev.get("id"))
        if ts is not None and kernel is not None:
            scan.flows.append((ts, kernel))
        return False
    if ph != "X" or not isinstance(name, str):
        return False
    ts, dur = _us(ev.get("ts")), _us(ev.get("dur", 0.0))  # ts is a string of µs in torch_npu's writer
    if ts is None or dur is None or dur < 0:
        return False
    thread = (ev.get("pid"), ev.get("tid"))
    if name.startswith(PROFILER_STEP_PREFIX):
        n = _int_or_none(name[len(PROFILER_STEP_PREFIX):])
        if n is not None and (n not in scan.steps or dur > scan.steps[n][1] - scan.steps[n][0]):
            scan.steps[n] = (ts, ts + dur, thread)
    elif name.startswith(DATALOADER_PREFIX) and name.endswith(DATALOADER_SUFFIX):
        scan.loads.append((ts, ts + dur, thread))
    elif name.startswith(OPTIMIZER_PREFIX):
        scan.opts.append((ts, ts + dur, thread))
    if not scan.device:
        return False
    cat = ev.get("cat")
    if cat == HOST_OP_CAT:
        scan.first_host = ts if scan.first_host is None else min(scan.first_host, ts)
    elif name in DEVICE_EVENTS or name.startswith(BUBBLE_PREFIX):
        scan.phases.append((ev.get("pid"), DEVICE_EVENTS.get(name, "bubble"), ts, dur))
    elif cat is None:  # a device event (a kernel, an HCCL task): the host's all have a "cat"
        start = _ns(ev.get("ts"))
        if start is not None:
            end = start + round(dur * 1000)
            if end > scan.kernel_end.get(start, -1):
                scan.kernel_end[start] = end
    return False


def _us(v: Any) -> float | None:
    """A time in µs as torch_npu and CANN write it (a float, or a string maybe ending in a tab), or None."""
    try:
        x = float(v.strip() if isinstance(v, str) else v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _ns(v: Any) -> int | None:
    """A µs value as integer ns, exactly for a string (``convert_us2ns``: digits after the point padded to 3)."""
    if isinstance(v, str):
        whole, _, frac = v.strip().partition(".")
        if whole.isdigit() and (frac.isdigit() or not frac):
            return int(whole) * 1000 + int((frac + "000")[:3])
    x = _us(v)
    return None if x is None else round(x * 1000)


def _flow_ns(v: Any) -> int | None:
    """A flow's id: the kernel's start, integer ns (``create_torch_to_npu_flow``: ``flow_id = end_event.ts``)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    try:
        return int(str(v).strip())
    except ValueError:
        return None


def _host_phases(steps: dict, loads: list, opts: list, count: int, limits: list[str]) -> _Host:
    if count and not steps:
        limits.append(f"{TRACE_VIEW_FILE} has no ProfilerStep#N events (no schedule, or prof.step() not "
                      "called): host phases unknown")
    data = {n: _covered(s, e, t, loads) for n, (s, e, t) in steps.items()} if loads else None
    optimizer = {n: _covered(s, e, t, opts) for n, (s, e, t) in steps.items()} if opts else None
    if steps and data is None:
        limits.append(
            f"{TRACE_VIEW_FILE} has no DataLoader annotation ({DATALOADER_PREFIX}...{DATALOADER_SUFFIX}: the "
            "loop does not iterate a torch DataLoader inside the profiled steps): the data phase is unknown, so "
            "the exposed input share is None, not 0. The best evidence left is the device's idle time: idle "
            "(Free, device idle inside the step's device span) and the time before the step's first device "
            "task (Preparing); together they bound what the step could have waited on the host for, input or "
            "anything else")
    if steps and optimizer is None:
        limits.append(f"{TRACE_VIEW_FILE} has no {OPTIMIZER_PREFIX}... event: the optimizer phase is unknown")
    span = {n: (s, e) for n, (s, e, _t) in steps.items()}
    return _Host(step_span=span, data=data, optimizer=optimizer, events=count)


def _covered(start: float, end: float, thread: Any, spans: Iterable[tuple[float, float, Any]]) -> float:
    """µs of [start, end) covered by the spans of the same thread (their union, clipped to the step)."""
    parts = sorted((max(s, start), min(e, end)) for s, e, t in spans if t == thread and start <= s < end)
    total, reach = 0.0, start
    for s, e in parts:
        s = max(s, reach)
        if e > s:
            total += e - s
            reach = e
    return total


def _device_steps(scan: _Scan, spans: dict[int, tuple[float, float]], limits: list[str]) -> _Device | None:
    """Sum the device timeline per step as ``TraceStepTimeParser.create_step_file`` does.

    A step's device window runs from its first kernel's start to the later of its last kernel's end and its host
    end (``FwkCANNRelationParser.get_step_range``); its kernels are those the ``torch_to_npu`` flows link to host
    operators inside its ``ProfilerStep#N`` span. A device event counts to the first window holding its start;
    one outside every window counts to none. Stage = the span of the step's events less Bubble; Preparing = its
    first Computing or Communication start less the host step's start.
    """
    events = scan.phases
    if not events:
        return None
    devices = sorted({scan.labels[p] for p, *_ in events if p in scan.labels})
    if not devices:
        limits.append(f"{TRACE_VIEW_FILE}'s device events belong to no process labelled \"{NPU_LABEL} <id>\": "
                      "the device phases are unknown")
        return None
    if len(devices) > 1:
        limits.append(f"{TRACE_VIEW_FILE} holds devices {devices}; read device {devices[0]} only")
    dev = devices[0]
    order = sorted(spans.items(), key=lambda kv: kv[1][0])
    windows: list[tuple[int | None, float, float, float | None]] = []  # (step, start, end, host start)
    if not order:
        windows, mode = [(None, -math.inf, math.inf, scan.first_host)], "all"
    elif scan.flows:
        starts = [s for _n, (s, _e) in order]
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        for host_ts, kernel in scan.flows:
            i = bisect.bisect_right(starts, host_ts) - 1
            if i < 0 or host_ts > order[i][1][1]:
                continue
            first[i] = min(first.get(i, kernel), kernel)
            last[i] = max(last.get(i, kernel), scan.kernel_end.get(kernel, kernel))
        windows = [(n, first[i] / 1000, max(last[i] / 1000, e), s) for i, (n, (s, e)) in enumerate(order)
                   if i in first]
        mode = "kernels"
    else:
        nxt = [s for _n, (s, _e) in order[1:]] + [math.inf]
        windows = [(n, s, nxt[i], s) for i, (n, (s, _e)) in enumerate(order)]
        mode = "host"
    acc: dict[int, dict[str, float]] = {}
    reach = list(_running_max(w[2] for w in windows))
    starts = [w[1] for w in windows]
    ordered = starts == sorted(starts)
    for pid, phase, ts, dur in events:
        if scan.labels.get(pid) != dev:
            continue
        last = bisect.bisect_right(starts, ts) - 1 if ordered else len(windows) - 1
        j = _window_of(ts, windows, bisect.bisect_right(reach, ts), last)
        if j is None:
            continue
        a = acc.setdefault(j, {"compute": 0.0, "comm": 0.0, "comm_exposed": 0.0, "idle": 0.0, "bubble": 0.0})
        a[phase] += dur
        a["e2e0"] = min(a.get("e2e0", ts), ts)
        a["e2e1"] = max(a.get("e2e1", ts + dur), ts + dur)
        if phase in ("compute", "comm"):
            a["first"] = min(a.get("first", ts), ts)
    out: dict[int | None, dict[str, float]] = {}
    for j, a in acc.items():
        n, _s, _e, host_start = windows[j]
        first_task = a.get("first")
        prepare = first_task - host_start if first_task is not None and host_start is not None else 0.0
        out[n] = {k: a[k] for k in ("compute", "comm", "comm_exposed", "idle", "bubble")}
        out[n].update(stage=a["e2e1"] - a["e2e0"] - a["bubble"], prepare=prepare)
    return _Device(device_id=dev, devices=devices, steps=out, windows=mode)


def _running_max(xs: Iterable[float]) -> Iterable[float]:
    m = -math.inf
    for x in xs:
        m = max(m, x)
        yield m


def _window_of(ts: float, windows: list, first: int, last: int) -> int | None:
    """The first window (in step order) with start <= ts < end, as ``TraceStepTimeParser.count_time`` picks;
    only windows first..last can hold ts (those before first end at or before it, those after last start after
    it)."""
    for j in range(first, last + 1):
        if windows[j][1] <= ts < windows[j][2]:
            return j
    return None


# --- kernel_details.csv as steps ---------------------------------------------------------------------------


@dataclass
class _KernelStep:
    start: float  # µs: the step's first kernel start
    end: float  # its last kernel end
    busy: float  # the union of its kernels' [start, start + duration)
    kernels: int


@dataclass
class _Kernels:
    device_id: int | None = None
    steps: dict[int, _KernelStep] = field(default_factory=dict)
    why: str | None = None  # why it has no steps


def _read_kernel_steps(path: Path, limits: list[str]) -> _Kernels:
    """kernel_details.csv's kernels per ``Step Id`` (HCCL ``hcom_*`` kernels left out: compute only)."""
    spans: dict[int | None, dict[int, list[tuple[float, float]]]] = {}
    try:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            fields = [c.strip() for c in reader.fieldnames or []]
            if KERNEL_STEP not in fields:
                return _Kernels(why=f"has no {KERNEL_STEP!r} column: torch_npu writes it only when the profiler "
                                "recorded steps (a schedule and prof.step())")
            lacking = [c for c in (KERNEL_START, KERNEL_DURATION) if c not in fields]
            if lacking:
                return _Kernels(why=f"lacks the columns {lacking}")
            reader.fieldnames = fields
            for row in reader:
                step = (row.get(KERNEL_STEP) or "").strip()
                if step in ("", "None"):
                    continue  # a kernel outside every recorded step
                name = f"{row.get(KERNEL_NAME) or ''} {row.get(KERNEL_TYPE) or ''}".lower()
                if name.startswith("hcom") or " hcom" in name:
                    continue  # an HCCL communication kernel
                n, start, dur = _int_or_none(step.split(".")[0]), _us(row.get(KERNEL_START)), _us(
                    row.get(KERNEL_DURATION))
                if n is None or start is None or dur is None or dur < 0:
                    continue
                dev = _int_or_none((row.get(KERNEL_DEVICE) or "").strip())
                spans.setdefault(dev, {}).setdefault(n, []).append((start, start + dur))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        limits.append(f"{KERNEL_DETAILS_FILE} could not be read ({type(exc).__name__}: {exc}); not used")
        return _Kernels(why=f"could not be read ({type(exc).__name__})")
    if not spans:
        return _Kernels(why=f"has no kernel inside a step (every {KERNEL_STEP!r} is empty)")
    devices = sorted(spans, key=lambda d: (d is None, d))
    if len(devices) > 1:
        limits.append(f"{KERNEL_DETAILS_FILE} holds devices {devices}; read device {devices[0]} only")
    steps = {}
    for n, iv in spans[devices[0]].items():
        iv.sort()
        busy, reach = 0.0, -math.inf
        for s, e in iv:
            s = max(s, reach)
            if e > s:
                busy += e - s
                reach = e
        steps[n] = _KernelStep(start=iv[0][0], end=max(e for _s, e in iv), busy=busy, kernels=len(iv))
    return _Kernels(device_id=devices[0], steps=steps)


# --- steps without step_trace_time.csv ---------------------------------------------------------------------


def _partial_steps(out: Path, limits: list[str]) -> tuple[int | None, list[StepPhases], list[Path]]:
    """The steps of a folder without step_trace_time.csv: from trace_view.json (host spans, device timeline),
    else from kernel_details.csv's ``Step Id``; TraceError when neither has steps."""
    tv, kd = out / TRACE_VIEW_FILE, out / KERNEL_DETAILS_FILE
    missing = (f"no {STEP_TRACE_FILE} in {out.name}/ (a partial copy, or a profiler_level or export that does not "
               "write it): the steps are read from ")
    host = _read_trace_view(tv, limits, device=True) if tv.is_file() else None
    kernels = _read_kernel_steps(kd, limits) if kd.is_file() else None
    if host is not None and (host.step_span or (host.device is not None and host.device.steps)):
        limits.insert(0, missing + TRACE_VIEW_FILE)
        device_id, steps, with_kernels = _trace_view_steps(host, kernels, limits)
        return device_id, steps, [tv, *([kd] if with_kernels else [])]
    if kernels is not None and kernels.steps:
        limits.insert(0, missing + f"{KERNEL_DETAILS_FILE} alone")
        return kernels.device_id, _kernel_steps(kernels, limits), [kd]
    raise TraceError(_nothing_per_step(out, host, kernels))


def _trace_view_steps(host: _Host, kernels: _Kernels | None, limits: list[str]
                      ) -> tuple[int | None, list[StepPhases], bool]:
    dev = host.device
    if dev is None and host.device_events:
        limits.append(f"{TRACE_VIEW_FILE} has device events but none of the step sums' ({', '.join(DEVICE_EVENTS)}: "
                      "CANN's Overlap Analysis rows): compute, comm, comm_exposed and idle are unknown")
    elif dev is None:
        why = ("its file ends after the host part" if host.host_only else
               "recorded without ProfilerActivity.NPU, at profiler_level Level_none, or a copy of its host part")
        limits.append(f"{TRACE_VIEW_FILE} has no device timeline ({why}): compute, comm, comm_exposed and idle "
                      "are unknown")
    else:
        how = {"kernels": "each step's device window runs from its first kernel to the later of its last kernel "
                          "and its host end, found through the torch_to_npu flows from its host operators",
               "host": f"{TRACE_VIEW_FILE} has no {FLOW_NAME} flow events, so each step's device window runs from "
                       "its ProfilerStep#N start to the next one's (torch_npu uses the step's first to last "
                       "kernel): device work of a step that runs on after the next step starts counts to that "
                       "next step",
               "all": "no step is marked, so the whole recording is one window"}[dev.windows]
        limits.append(f"compute, comm, comm_exposed and idle are summed per step from {TRACE_VIEW_FILE}'s device "
                      f"timeline (its {', '.join(DEVICE_EVENTS)} events of NPU {dev.device_id}), the way torch_npu "
                      f"sums them into {STEP_TRACE_FILE}; {how}")
    numbers: list[int | None] = sorted(host.step_span) if host.step_span else [None]
    out, no_device, from_kernels = [], [], []
    for n in numbers:
        d = dev.steps.get(n) if dev is not None else None
        if n is None:
            if d is None:
                continue
            step_us = max(d["prepare"], 0.0) + d["stage"] + d["bubble"]
        else:
            step_us = host.step_span[n][1] - host.step_span[n][0]
        compute = comm = exposed = idle = None
        if d is not None:
            compute, comm, exposed, idle = d["compute"], d["comm"], d["comm_exposed"], d["idle"]
        elif kernels is not None and n in kernels.steps:
            compute = kernels.steps[n].busy
            from_kernels.append(n)
        elif dev is not None:
            no_device.append(n)
        data = host.data.get(n) if host.data is not None and n is not None else None
        opt = host.optimizer.get(n) if host.optimizer is not None and n is not None else None
        out.append(StepPhases(step=0 if n is None else n, step_s=step_us * _US, data=_s(data), h2d=None,
                              optimizer=_s(opt), compute=_s(compute), comm_exposed=_s(exposed), idle=_s(idle),
                              comm=_s(comm)))
    if numbers == [None] and out:
        limits.append(f"{TRACE_VIEW_FILE} marks no step: the whole recording is read as one step, numbered 0, its "
                      "time Preparing + Stage + Bubble of the device timeline (the first host operator to the last "
                      "device activity)")
    if no_device:
        limits.append(f"steps {_ranges(no_device)} have no device event in {TRACE_VIEW_FILE}'s timeline: their "
                      "compute, comm, comm_exposed and idle are unknown")
    if from_kernels:
        limits.append(f"compute of steps {_ranges(from_kernels)} is the union of their kernels' times in "
                      f"{KERNEL_DETAILS_FILE} ({KERNEL_STEP} column; HCCL kernels left out); comm, comm_exposed and "
                      "idle are unknown")
    limits.append("h2d unknown: a torch_npu trace does not tell a host-to-device copy from other copies; "
                  "the exposed input share counts the DataLoader wait only")
    device_id = dev.device_id if dev is not None else (kernels.device_id if from_kernels and kernels else None)
    return device_id, out, bool(from_kernels)


def _kernel_steps(kernels: _Kernels, limits: list[str]) -> list[StepPhases]:
    """Steps from kernel_details.csv alone: compute known, wall time not (step_s the device's step period)."""
    numbers = sorted(kernels.steps)
    steps, spans = [], []
    for n in numbers:
        k, nxt = kernels.steps[n], kernels.steps.get(n + 1)
        if nxt is not None and nxt.start > k.start:
            step_us = nxt.start - k.start
        else:
            step_us = k.end - k.start
            spans.append(n)
        steps.append(StepPhases(step=n, step_s=step_us * _US, compute=k.busy * _US))
    last = (f"; for step{'s' if len(spans) > 1 else ''} {_ranges(spans)}, with no next step, it is the span from "
            "the first kernel start to the last kernel end, a lower bound (it leaves out the host time before the "
            "first kernel, where a step waits for its batch)") if spans else ""
    limits.append(
        f"only {KERNEL_DETAILS_FILE} has steps: a step's wall time is NOT known, so no per-step share (exposed "
        "input, idle, communication) can be given from this folder. step_s is the device's step period, from the "
        "step's first kernel start to the next step's (in a steady loop the time per step, but not the host's "
        f"ProfilerStep#N span){last}; compute is the union of the step's kernels' times (HCCL kernels left out); "
        "data, optimizer, comm, comm_exposed and idle are unknown. Copy the profiler folder's "
        f"{OUTPUT_DIR}/{STEP_TRACE_FILE} and {TRACE_VIEW_FILE} as well to have them")
    return steps


def _nothing_per_step(out: Path, host: _Host | None, kernels: _Kernels | None) -> str:
    """The error for a folder with no file that has steps: what was looked for, and which file would help."""
    if host is None:
        tv = "missing"
    else:
        tv = "no ProfilerStep#N events and no device timeline" + (" (it ends after its host part)"
                                                                   if host.host_only else "")
    kd = "missing" if kernels is None else (kernels.why or "no steps")
    looked = [f"{STEP_TRACE_FILE} (missing)", f"{TRACE_VIEW_FILE} ({tv})", f"{KERNEL_DETAILS_FILE} ({kd})"]
    if (out / COMMUNICATION_FILE).is_file():
        looked.append(f"{COMMUNICATION_FILE} (present, but HCCL times only: no step time, no compute)")
    dbs = sorted(p.name for p in out.glob("*.db")) if out.is_dir() else []
    if dbs:
        hint = (f"The folder was exported as a database ({', '.join(dbs)}; experimental_config "
                "export_type='db'); record again with export_type='text' (the default)")
    else:
        hint = (f"Copy the profiler folder's {OUTPUT_DIR}/{STEP_TRACE_FILE} (each step's device phases) and "
                f"{TRACE_VIEW_FILE} (the steps' host spans and the device timeline). torch_npu writes "
                f"{STEP_TRACE_FILE} only when the NPU was recorded (activities include ProfilerActivity.NPU) at a "
                "profiler_level other than Level_none and parsing finished, and marks steps only with a schedule "
                f"and prof.step(); a folder whose parse failed can be parsed again with {OFFLINE_PARSE}")
    return f"{str(out)!r}: nothing per step can be read. Looked for {'; '.join(looked)}. {hint}"


# --- communication.json ------------------------------------------------------------------------------------


@dataclass
class _Hccl:
    summary: dict[str, Any]
    elapse_ms: dict[int | None, float]  # per step number (None: "step", no steps marked)


_HCCL_TIMES = (("elapse_ms", ELAPSE_TIME_MS), ("wait_ms", WAIT_TIME_MS), ("transit_ms", TRANSIT_TIME_MS),
               ("sync_ms", SYNC_TIME_MS), ("idle_ms", IDLE_TIME_MS))


def _read_hccl(out: Path, limits: list[str]) -> tuple[_Hccl | None, list[Path]]:
    """communication.json summed per step over its HCCL operators (p2p and collective), its transports'
    bandwidth, and communication_matrix.json's slowest link; (None, []) without the file."""
    path = out / COMMUNICATION_FILE
    if not path.is_file():
        return None, []
    data = _load_json(path, limits)
    if not isinstance(data, dict):
        if data is not None:
            limits.append(f"{COMMUNICATION_FILE} is not a JSON object of steps; HCCL times unknown")
        return None, []
    per_step: list[dict[str, Any]] = []
    links: dict[str, list[float]] = {}
    for key, groups in data.items():
        rest = key[len(COMM_STEP_PREFIX):] if isinstance(key, str) and key.startswith(COMM_STEP_PREFIX) else None
        if rest is None or not isinstance(groups, dict) or (rest and not rest.isdigit()):
            continue
        row: dict[str, Any] = {"step": int(rest) if rest else None, "ops": 0}
        row.update({k: 0.0 for k, _c in _HCCL_TIMES})
        for group in COMM_GROUPS:
            ops = groups.get(group)
            for name, info in (ops.items() if isinstance(ops, dict) else ()):
                if not isinstance(info, dict) or str(name).lower().startswith("total"):
                    continue  # TOTAL_OP_INFO: the writer's sum of the ops of the group
                row["ops"] += 1
                times = info.get(COMM_TIME_INFO)
                for k, column in _HCCL_TIMES:
                    row[k] += _num(times.get(column)) if isinstance(times, dict) else 0.0
                bandwidth = info.get(COMM_BANDWIDTH_INFO)
                for transport, b in (bandwidth.items() if isinstance(bandwidth, dict) else ()):
                    if isinstance(b, dict):
                        acc = links.setdefault(str(transport), [0.0, 0.0])
                        acc[0] += _num(b.get(TRANSIT_SIZE_MB))
                        acc[1] += _num(b.get(TRANSIT_TIME_MS))
        per_step.append(row)
    if not per_step:
        limits.append(f"{COMMUNICATION_FILE} holds no {COMM_STEP_PREFIX}<N> entry; HCCL times unknown")
        return None, [path]
    per_step.sort(key=lambda r: (r["step"] is None, r["step"] or 0))
    summary: dict[str, Any] = {k: statistics.median(r[k] for r in per_step) for k, _c in _HCCL_TIMES}
    wait, transit = sum(r["wait_ms"] for r in per_step), sum(r["transit_ms"] for r in per_step)
    summary["wait_ratio"] = round(wait / (wait + transit), 4) if wait + transit > 0 else None
    bw = {t: {"bandwidth_gb_s": size / ms, "transit_size_mb": size, "transit_time_ms": ms}
          for t, (size, ms) in sorted(links.items()) if size > 0 and ms > 0}  # MB/ms = GB/s (compute_ratio)
    summary["links"] = bw
    summary["slow_link"] = None
    if bw:
        slow = min(bw, key=lambda t: bw[t]["bandwidth_gb_s"])
        summary["slow_link"] = {"type": slow, **bw[slow]}
        others = {t: v["bandwidth_gb_s"] for t, v in bw.items() if t != slow}
        if others:
            fast = max(others, key=others.get)
            if bw[slow]["bandwidth_gb_s"] < SLOW_LINK_RATIO * others[fast]:
                s = bw[slow]
                limits.append(
                    f"HCCL's slow link is {slow}: {s['bandwidth_gb_s']:.2f} GB/s ({s['transit_size_mb']:.1f} MB in "
                    f"{s['transit_time_ms']:.1f} ms over the recorded steps), far below {fast} at "
                    f"{others[fast]:.2f} GB/s ({COMMUNICATION_FILE}); the communication over {slow} is what waits "
                    "on the wire. Small transfers measure latency more than bandwidth, so compare the sizes too")
    summary["steps"] = per_step
    files = [path]
    pair = _read_matrix(out / COMMUNICATION_MATRIX_FILE, limits)
    if pair is not None:
        summary["slow_pair"] = pair
        files.append(out / COMMUNICATION_MATRIX_FILE)
    return _Hccl(summary=summary, elapse_ms={r["step"]: r["elapse_ms"] for r in per_step}), files


def _read_matrix(path: Path, limits: list[str]) -> dict[str, Any] | None:
    """The slowest rank-to-rank link of communication_matrix.json (its ``<type>-total@<group>`` entries summed per
    link ``"<src>-<dst>"``, a rank's copy to itself left out): the link furthest below the median of the other
    links of its transport (else the slowest); a limit when it is far below that median."""
    if not path.is_file():
        return None
    data = _load_json(path, limits)
    if not isinstance(data, dict):
        return None
    pairs: dict[str, list[Any]] = {}
    for groups in data.values():
        for group in (groups.get(g) for g in COMM_GROUPS) if isinstance(groups, dict) else ():
            for op, by_link in (group.items() if isinstance(group, dict) else ()):
                if MATRIX_TOTAL not in str(op) or not isinstance(by_link, dict):
                    continue
                for link, d in by_link.items():
                    src, _, dst = str(link).partition("-")
                    if not isinstance(d, dict) or src == dst:
                        continue
                    acc = pairs.setdefault(str(link), [d.get(TRANSPORT_TYPE), 0.0, 0.0])
                    acc[1] += _num(d.get(TRANSIT_SIZE_MB))
                    acc[2] += _num(d.get(TRANSIT_TIME_MS))
    rated = {k: (t, size / ms, size, ms) for k, (t, size, ms) in pairs.items() if size > 0 and ms > 0}
    if not rated:
        return None
    peers = {k: [v[1] for j, v in rated.items() if j != k and v[0] == rated[k][0]] for k in rated}
    compared = {k: rated[k][1] / statistics.median(p) for k, p in peers.items() if p and statistics.median(p) > 0}
    # the link furthest below the other links of its transport; without such peers, the slowest
    link = min(compared, key=compared.get) if compared else min(rated, key=lambda k: rated[k][1])
    kind, gbs, size, ms = rated[link]
    pair = {"link": link, "type": kind, "bandwidth_gb_s": gbs, "transit_size_mb": size, "transit_time_ms": ms}
    if link in compared:
        median = statistics.median(peers[link])
        pair["peer_median_gb_s"] = median
        if compared[link] < SLOW_LINK_RATIO:
            limits.append(f"link {link} ({kind}) moved {gbs:.2f} GB/s against a median {median:.2f} GB/s of this "
                          f"rank's {len(peers[link])} other {kind} links ({COMMUNICATION_MATRIX_FILE}): a slow link "
                          "between those two ranks")
    return pair


def _num(v: Any) -> float:
    x = _us(v)
    return x if x is not None and x >= 0 else 0.0


def _comm_from_hccl(steps: list[StepPhases], hccl: _Hccl | None, limits: list[str]) -> list[StepPhases]:
    """comm from communication.json's Elapse per step, for the steps whose trace does not say."""
    if hccl is None:
        return steps
    elapse = dict(hccl.elapse_ms)
    if None in elapse and len(steps) == 1:
        elapse.setdefault(steps[0].step, elapse[None])
    filled = [s.step for s in steps if s.comm is None and s.step in elapse]
    if not filled:
        return steps
    limits.append(f"comm of steps {_ranges(filled)} is the sum of {COMMUNICATION_FILE}'s {ELAPSE_TIME_MS} over the "
                  "step's HCCL operators (the device timeline is missing): overlapped communication counts too, and "
                  "operators on parallel streams add up; comm_exposed is unknown")
    return [replace(s, comm=elapse[s.step] / 1000.0) if s.step in filled else s for s in steps]


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


def _s(us: float | None) -> float | None:
    return None if us is None else us * _US


def _ranges(ns: list[int]) -> str:
    return ", ".join(map(str, ns)) if len(ns) <= 6 else f"{ns[0]}..{ns[-1]} ({len(ns)} steps)"


# --- top operators -----------------------------------------------------------------------------------------


def _top_ops(out: Path, limits: list[str]) -> tuple[list[dict[str, Any]], list[Path]]:
    """Device time per torch operator (operator_details.csv), else per kernel (kernel_details.csv), and the
    file it came from."""
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
    kernels = out / KERNEL_DETAILS_FILE
    if kernels.is_file():
        found = _kernel_totals(kernels, limits)
        if found:
            return found, [kernels]
    limits.append(f"no device time per operator ({OPERATOR_DETAILS_FILE}, {KERNEL_DETAILS_FILE}): top_ops empty")
    return [], []


def _kernel_totals(path: Path, limits: list[str]) -> list[dict[str, Any]]:
    totals: dict[str, list[float]] = {}
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
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        limits.append(f"{KERNEL_DETAILS_FILE} could not be read ({type(exc).__name__}: {exc}); not used")
        return []
    ranked = sorted(totals.items(), key=lambda kv: (-kv[1][1], kv[0]))[:_TOP_OPS]
    return [{"name": k, "calls": int(c), "self_ms": us / 1000.0, "where": "device"} for k, (c, us) in ranked]


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
