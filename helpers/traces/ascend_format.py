"""What a torch_npu (Ascend) profiler folder is made of, by name, and how its values are read.

The folder and file names, the CSV columns and the JSON keys are torch_npu 2.13.0's and CANN's (each named where it
comes from); ``tests/test_ascend_format.py`` reads them from the wheel's source and fails when they drift. The value
readers (:func:`_us`, :func:`_ns`, :func:`_int_or_none`, :func:`_s`, :func:`_load_json`, :func:`_ranges`) are shared
by the reader's parts: :mod:`helpers.traces.ascend` (the folder, step_trace_time.csv, the metadata),
:mod:`helpers.traces.ascend_timeline` (trace_view.json, kernel_details.csv) and :mod:`helpers.traces.ascend_hccl`
(communication.json). :mod:`helpers.traces.ascend` imports every public name here.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

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
#: CANN's per-operator-type totals over the whole recording (``_integrate_parser.py``: ``op_statistic.csv``), with
#: ``OpStatisticBean.HEADERS`` (torch_npu 2.13.0): "OP Type", "Core Type", "Count", "Total Time(us)", ...
OP_STATISTIC_FILE = "op_statistic.csv"
OP_STAT_TYPE, OP_STAT_COUNT, OP_STAT_TOTAL = "OP Type", "Count", "Total Time(us)"
#: torch_npu's name for the default process group's entry in ``profiler_metadata.json``'s ``parallel_group_info``
#: (``profiler_interface.py``, ``_add_group_info_to_metadata``); other groups carry their hccl_config's
#: ``group_name``, "" when none was set.
DEFAULT_GROUP = "default_group"
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


def _int_or_none(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def _load_json(path: Path, limits: list[str]) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        limits.append(f"{path.name} could not be read ({type(exc).__name__}: {exc}); its facts are unknown")
        return None


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


def _s(us: float | None) -> float | None:
    return None if us is None else us * _US


def _ranges(ns: list[int]) -> str:
    return ", ".join(map(str, ns)) if len(ns) <= 6 else f"{ns[0]}..{ns[-1]} ({len(ns)} steps)"
