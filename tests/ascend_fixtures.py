"""Build torch_npu profiler folders (``*_ascend_pt``) for the trace reader's tests.

These folders are BUILT, not real profiler output: no Ascend machine wrote them. They follow torch_npu 2.13.0's
writer (the file layout, file names, CSV header rows, the trace_view.json event keys and the metadata keys, read
from the wheel: ``torch_npu/profiler/_profiler_path_creator.py``, ``profiler_interface.py``
(``_dump_profiler_info``, ``_dump_metadata``), ``analysis/prof_view/_trace_step_time_parser.py``,
``_operator_view_parser.py``, ``_kernel_view_parser.py``, ``_communication_parser.py``,
``prof_common_func/_csv_headers.py``, ``_trace_event_manager.py``, ``_file_manager.py``), and
``tests/test_ascend_format.py`` checks them against the wheel so they cannot drift. What they cannot reproduce:
CANN's own raw files (``FRAMEWORK/`` and ``PROF_*/`` hold only the info.json files the reader reads), CANN's own
field names inside communication.json's per-operator entries (``Elapse Time(ms)``, ``Idle Time(ms)``, the
transport names; msprof writes those, torch_npu copies them through) and the timing details of a real device
(the device timeline is one Overlap Analysis event per phase per step, its kernels back to back). See
docs/trace_formats.md.

Partial folders (what users hold): :func:`copy_outputs` copies some of a built folder's output files the way a
user copies them, into a folder of any name, with or without the ``ASCEND_PROFILER_OUTPUT/`` level; a folder the
writer itself leaves partial (``profiler_level`` Level_none, no NPU activity) is ``build_ascend_folder`` with
``step_trace=False, kernel_details=False, device_timeline=False``.

Times are given in seconds (:class:`Step`) and milliseconds (:class:`HcclOp`, as communication.json holds them)
and written in microseconds, as torch_npu writes them.
"""

from __future__ import annotations

import csv
import json
import re
import shutil
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from helpers.traces.ascend import (
    ASCEND_SUFFIX, BANDWIDTH_GB_S, COMM_BANDWIDTH_INFO, COMM_TIME_INFO, COMMUNICATION_FILE,
    COMMUNICATION_MATRIX_FILE, ELAPSE_TIME_MS, FLOW_CAT, FLOW_NAME, FRAMEWORK_DIR, IDLE_TIME_MS, KERNEL_DETAILS_FILE,
    METADATA_FILE, OPERATOR_DETAILS_FILE, OUTPUT_DIR, STEP_TRACE_COLUMNS, STEP_TRACE_FILE, SYNC_TIME_MS,
    TOTAL_OP_INFO, TRACE_VIEW_FILE, TRANSIT_SIZE_MB, TRANSIT_TIME_MS, TRANSPORT_TYPE, WAIT_TIME_MS,
)

#: ``OperatorViewParser.OPERATOR_HEADERS`` (torch_npu 2.13.0).
OPERATOR_COLUMNS: tuple[str, ...] = (
    "Name", "Input Shapes", "Call Stack", "Host Self Duration(us)", "Host Total Duration(us)",
    "Device Self Duration(us)", "Device Total Duration(us)", "Device Self Duration With AICore(us)",
    "Device Total Duration With AICore(us)",
)
#: ``["Step Id"] + CsvHeaders.OP_SUMMARY_KERNEL_BASE_HEADERS``: kernel_details.csv at Level0 with a schedule
#: (without steps the writer leaves "Step Id" out).
KERNEL_COLUMNS: tuple[str, ...] = (
    "Step Id", "Device_id", "Name", "Type", "Accelerator Core", "Start Time(us)", "Duration(us)",
    "Wait Time(us)", "Block Num",
)
#: Keys of a host event (``TraceEventManager.create_x_event``); ``ts`` is a string of µs, ``dur`` a float.
X_EVENT_KEYS: tuple[str, ...] = ("ph", "name", "pid", "tid", "ts", "dur", "cat", "args")
#: Keys of a torch_to_npu flow event (``TraceEventManager.create_torch_to_npu_flow``).
FLOW_KEYS: tuple[str, ...] = ("ph", "bp", "name", "id", "pid", "tid", "ts", "cat")
#: Top-level keys of profiler_info*.json (``_dump_profiler_info``: Constant.CONFIG, START_INFO, END_INFO,
#: TORCH_NPU_VERSION, CANN_VERSION; "rank_id" only when RANK is set or torch.distributed is initialised).
INFO_KEYS: tuple[str, ...] = ("config", "start_info", "end_info", "torch_npu_version", "cann_version")
#: The keys of one operator's "Communication Time Info", in msprof's order (CANN's names; the writer's
#: combine_time_info sums all but the start and the ratios into "Total Op Info").
COMM_TIME_KEYS: tuple[str, ...] = ("Start Timestamp(us)", ELAPSE_TIME_MS, TRANSIT_TIME_MS, WAIT_TIME_MS,
                                   SYNC_TIME_MS, IDLE_TIME_MS, "Wait Time Ratio", "Synchronization Time Ratio")
#: The transports of "Communication Bandwidth Info" (CANN's; SDMA is the intra-node copy engine, its traffic
#: the sum of HCCS and PCIE; RDMA is between nodes).
TRANSPORTS: tuple[str, ...] = ("RDMA", "HCCS", "PCIE", "SDMA")
#: ``CommunicationParser.HCCL_PATTERN``: the operator type of a communication_matrix.json entry.
HCCL_PATTERN = r"send|reduce|invalid|broadcast|allreduce|" \
               "receive|allgather|reducescatter|scatter|alltoall|alltoallv|alltoallvc|batchsendrecv"
#: ``CommunicationParser.HCOM_SEND``, ``HCOM_RECEIVE``, ``HCOM_BATCHSENDRECV``: the p2p operators.
P2P_PREFIXES: tuple[str, ...] = ("hcom_send", "hcom_receive", "hcom_batchsendrecv")

#: The operators each built step runs: name -> (calls, device µs per call, kernel name).
DEFAULT_OPS: dict[str, tuple[int, float, str]] = {
    "aten::addmm": (2, 300.0, "MatMulV2"), "aten::relu": (1, 40.0, "Relu"), "aten::add": (3, 10.0, "Add"),
}
#: The HCCL group every built communication operator runs in (``<op>@<group>``).
HCCL_GROUP = "6297232067196334501"

_T0_NS = 1_735_732_800_000_000_000  # 2025-01-01T12:00:00Z, ns since the epoch
_STREAM, _HCCL_TID = 2, 5


@dataclass(frozen=True)
class Step:
    """One built step, seconds.

    ``host_s`` is the ProfilerStep#N span; the DataLoader's ``__next__`` (``data_s``) opens the step and
    ``Optimizer.step`` (``optimizer_s``) closes it. The device columns of step_trace_time.csv are written as
    given; ``stage_s`` defaults to compute + comm_exposed + free, ``prepare_s`` to ``data_s``. On the device
    timeline the step starts ``prepare`` after its host start: Computing, then Communication(Not Overlapped),
    then Free, back to back; Communication covers the end of Computing (its overlapped part) and the exposed
    part; the kernels run back to back from the step's device start.
    """

    step: int
    host_s: float
    data_s: float = 0.0
    optimizer_s: float = 0.0
    compute_s: float = 0.0
    comm_s: float = 0.0
    comm_exposed_s: float = 0.0
    free_s: float = 0.0
    stage_s: float | None = None
    prepare_s: float | None = None
    bubble_s: float = 0.0

    @property
    def stage(self) -> float:
        return self.compute_s + self.comm_exposed_s + self.free_s if self.stage_s is None else self.stage_s

    @property
    def prepare(self) -> float:
        return self.data_s if self.prepare_s is None else self.prepare_s


@dataclass(frozen=True)
class HcclOp:
    """One HCCL operator in one step, as CANN's communication analysis reports it (ms, MB).

    ``links``: transport -> (Transit Size(MB), Transit Time(ms)); SDMA, when not given, is HCCS + PCIE.
    ``pairs``: "<src rank>-<dst rank>" -> (Transport Type, Transit Size(MB), Transit Time(ms)) for
    communication_matrix.json. Idle is what the elapse leaves after transit and wait. ``name`` is the operator's
    type; CANN's name adds a counter and the group (``hcom_allReduce__<n>_<i>_1@<group>``, :func:`hccl_names`).
    """

    name: str = "hcom_allReduce"
    elapse_ms: float = 2.0
    transit_ms: float = 1.0
    wait_ms: float = 0.8
    sync_ms: float = 0.5
    links: Mapping[str, tuple[float, float]] = field(default_factory=lambda: {"HCCS": (40.0, 1.0)})
    pairs: Mapping[str, tuple[str, float, float]] = field(default_factory=dict)

    @property
    def idle_ms(self) -> float:
        return max(self.elapse_ms - self.transit_ms - self.wait_ms, 0.0)


def us_str(ns: int) -> str:
    """µs as torch_npu writes a ``ts`` (``convert_ns2us_str``): the ns integer with a point 3 digits in."""
    s = str(ns)
    return "0." + s.rjust(3, "0") if len(s) <= 3 else f"{s[:-3]}.{s[-3:]}"


def folder_name(hostname: str, pid: int, stamp: str) -> str:
    """``{worker_name or hostname}_{pid}_{%Y%m%d%H%M%S%f[:-3]}_ascend_pt`` (``ProfPathCreator.create_prof_dir``)."""
    return f"{hostname}_{pid}_{stamp}{ASCEND_SUFFIX}"


def build_ascend_folder(parent: Path, steps: Sequence[Step], *, rank: int | None = None,
                        world_size: int | None = None, hostname: str = "node-a", pid: int = 4242,
                        device_id: int | None = None, comm_name: str = "10.0.0.1%eth0_60000_0_1735732800000000",
                        stamp: str = "20250101120000000", torch_npu_version: str = "2.13.0",
                        cann_version: str = "8.5.0", dataloader: bool = True, optimizer: bool = True,
                        trace_view: str | None = "full", step_marks: bool = True, parsed: bool = True,
                        operator_details: bool = True, kernel_details: bool = True, step_trace: bool = True,
                        device_timeline: bool = True, flows: bool = True,
                        hccl: Mapping[int, Sequence[HcclOp]] | None = None, matrix: bool = True,
                        level: str = "Level0", ops: dict[str, tuple[int, float, str]] | None = None) -> Path:
    """Write one built ``*_ascend_pt`` folder under ``parent`` and return it.

    Parameters
    ----------
    steps : sequence of Step
    rank, world_size : int, optional
        rank -> ``profiler_info_<rank>.json`` with ``rank_id`` (a string, as from the RANK variable); world_size ->
        ``profiler_metadata.json``'s HCCL default group with ``global_ranks = range(world_size)``.
    hostname : str
        The folder's worker name and CANN's ``hostname``.
    trace_view : {"full", "truncated", "cut", None}
        "truncated": the host part only, without its closing bracket (what TracePreParser writes before
        TraceViewParser appends the device part); "cut": the full text cut in the middle of an event; None: none.
    step_marks : bool
        False: no ProfilerStep#N events, one csv row with an empty Step (a run without a schedule), kernel_details
        without its Step Id column, communication.json's one key "step".
    parsed : bool
        False: no ASCEND_PROFILER_OUTPUT/ (the profiler stopped before parsing).
    step_trace, kernel_details, operator_details : bool
        Whether the parse wrote each file (Level_none writes neither step_trace_time.csv nor kernel_details.csv).
    device_timeline : bool
        False: trace_view.json holds the host events only, a whole JSON array (no NPU activity, or Level_none).
    flows : bool
        False: no torch_to_npu flow events in trace_view.json.
    hccl : mapping of step number to HcclOp list, optional
        Writes communication.json (and, with ``matrix``, communication_matrix.json from the ops' ``pairs``).
    level : str
        ``experimental_config._profiler_level`` in profiler_info.
    """
    device = (rank or 0) if device_id is None else device_id
    root = Path(parent) / folder_name(hostname, pid, stamp)
    root.mkdir(parents=True)
    _write_raw(root, hostname, pid, device, rank, stamp)
    _write_info(root, rank, torch_npu_version, cann_version, steps, level)
    _write_metadata(root, rank, world_size, comm_name)
    if not parsed:
        return root
    out = root / OUTPUT_DIR
    out.mkdir()
    ops = DEFAULT_OPS if ops is None else ops
    timeline = _Timeline(steps, ops, pid, device)
    if step_trace:
        _write_step_trace(out / STEP_TRACE_FILE, steps, device, step_marks)
    if trace_view is not None:
        _write_trace_view(out / TRACE_VIEW_FILE, timeline, trace_view, dataloader=dataloader, optimizer=optimizer,
                          step_marks=step_marks, device_timeline=device_timeline, flows=flows)
    if operator_details:
        _write_csv(out / OPERATOR_DETAILS_FILE, OPERATOR_COLUMNS, [
            [name, "[[8, 16], [16, 32]]", "", 12.0, 20.0, us, us, us, us]
            for _s in steps for name, (calls, us, _k) in ops.items() for _ in range(calls)])
    if kernel_details:
        rows = [([s.step] if step_marks else []) + [device, kernel, kernel, "AI_CORE", us_str(start) + "\t",
                                                    (end - start) / 1000.0, 0.5, 8]
                for s in steps for _op, kernel, start, end in timeline.kernels[s.step]]
        _write_csv(out / KERNEL_DETAILS_FILE, KERNEL_COLUMNS if step_marks else KERNEL_COLUMNS[1:], rows)
    if hccl:
        _write_communication(out, hccl, timeline, step_marks, matrix)
    return root


def build_cluster(parent: Path, per_rank: Sequence[Sequence[Step]], *, hostnames: Sequence[str] | None = None,
                  comm_name: str = "10.0.0.1%eth0_60000_0_1735732800000000", **kwargs) -> list[Path]:
    """One built folder per rank (rank r on ``hostnames[r]``, pid 4000 + r), all of one run (one HCCL group)."""
    world = len(per_rank)
    names = list(hostnames) if hostnames is not None else ["node-a"] * world
    return [build_ascend_folder(parent, steps, rank=r, world_size=world, hostname=names[r], pid=4000 + r,
                                device_id=r % 8, comm_name=comm_name, **kwargs)
            for r, steps in enumerate(per_rank)]


def copy_outputs(folder: Path, dest: Path, files: Sequence[str], *, flat: bool = False,
                 metadata: bool = False) -> Path:
    """What a user who copied only some files holds: ``dest`` with ``files`` of the built folder's
    ASCEND_PROFILER_OUTPUT/, under ``dest/ASCEND_PROFILER_OUTPUT/`` (or directly in ``dest`` with ``flat``), and
    with ``metadata`` the folder's profiler_info*.json and profiler_metadata.json beside them. No raw data."""
    target = dest if flat else dest / OUTPUT_DIR
    target.mkdir(parents=True)
    for name in files:
        shutil.copy2(folder / OUTPUT_DIR / name, target / name)
    if metadata:
        for p in folder.glob("profiler_*.json"):
            shutil.copy2(p, dest / p.name)
    return dest


# --- the device timeline -----------------------------------------------------------------------------------


class _Timeline:
    """Where each step's host and device events sit (ns): the host step back to back from _T0_NS, the device
    part ``prepare`` after the host start."""

    def __init__(self, steps: Sequence[Step], ops: dict[str, tuple[int, float, str]], pid: int, device: int):
        self.steps, self.pid, self.device = steps, pid, device
        self.host_start: dict[int, int] = {}
        self.device_start: dict[int, int] = {}
        self.kernels: dict[int, list[tuple[str, str, int, int]]] = {}  # (op, kernel, start, end)
        t = _T0_NS
        for s in steps:
            self.host_start[s.step] = t
            d = self.device_start[s.step] = t + round(s.prepare * 1e9)
            k = d
            self.kernels[s.step] = []
            for op, (calls, us, kernel) in ops.items():
                for _ in range(calls):
                    self.kernels[s.step].append((op, kernel, k, k + round(us * 1000)))
                    k += round(us * 1000)
            t += round(s.host_s * 1e9)

    def comm_start(self, s: Step) -> int:
        """Communication starts where its overlapped part begins: before the end of Computing."""
        overlapped = max(s.comm_s - s.comm_exposed_s, 0.0)
        return self.device_start[s.step] + round((s.compute_s - min(overlapped, s.compute_s)) * 1e9)


def _write_csv(path: Path, header: Sequence[str], rows: list[list]) -> None:
    with path.open("w", newline="") as f:  # FileManager.create_csv_file: csv.writer, header then rows
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def _write_raw(root: Path, hostname: str, pid: int, device: int, rank: int | None, stamp: str) -> None:
    (root / FRAMEWORK_DIR).mkdir()
    prof = root / f"PROF_000001_{stamp}_ABCDEFGHIJKLMNOP"
    (prof / "host").mkdir(parents=True)
    (prof / f"device_{device}").mkdir()
    host = {"hostname": hostname, "pid": str(pid), "CPU": [{"Frequency": "100.000000"}], "DeviceInfo": []}
    (prof / "host" / "info.json").write_text(json.dumps(host))
    dev = dict(host, devices=str(device), rank_id=-1 if rank is None else rank,
               DeviceInfo=[{"id": device, "hwts_frequency": "50"}])
    (prof / f"device_{device}" / f"info.json.{device}").write_text(json.dumps(dev))


def _write_info(root: Path, rank: int | None, version: str, cann: str, steps: Sequence[Step], level: str) -> None:
    info = {
        "config": {
            "common_config": {
                "activities": ["ProfilerActivity.CPU", "ProfilerActivity.NPU"],
                "schedule": {"wait": 0, "warmup": 1, "active": len(steps), "repeat": 1, "skip_first": 0},
                "record_shapes": False, "profile_memory": False, "with_stack": False, "with_flops": False,
                "with_modules": False,
            },
            "experimental_config": {"_profiler_level": level, "_aic_metrics": "ACL_AICORE_NONE",
                                    "_l2_cache": False, "_msprof_tx": False, "_op_attr": False,
                                    "_data_simplification": True, "_export_type": ["text"]},
        },
        "start_info": {"syscnt_enable": True, "freq": 100.0, "start_cnt": 0, "start_monotonic": 0},
        "end_info": {"collectionTimeEnd": _T0_NS + 10**9, "MonotonicTimeEnd": 10**9},
        "torch_npu_version": version,
        "cann_version": cann,
    }
    name = "profiler_info.json"
    if rank is not None:
        info["rank_id"] = str(rank)
        name = f"profiler_info_{rank}.json"
    (root / name).write_text(json.dumps(info, indent=4))


def _write_metadata(root: Path, rank: int | None, world: int | None, comm_name: str) -> None:
    md: dict = {"ENV_VARIABLES": {"ASCEND_LAUNCH_BLOCKING": "", "HCCL_ALGO": ""},
                "trace_id": f"{(rank or 0) + 0xABC:032X}"}
    if world is not None:
        md["parallel_group_info"] = {comm_name: {"group_name": "default_group", "group_rank": rank,
                                                 "global_ranks": list(range(world))}}
    (root / METADATA_FILE).write_text(json.dumps(md))


def _write_step_trace(path: Path, steps: Sequence[Step], device: int, step_marks: bool) -> None:
    rows = []
    for s in steps if step_marks else steps[:1]:
        us = [v * 1e6 for v in (s.compute_s, s.comm_exposed_s, s.comm_s, s.free_s, s.stage, s.bubble_s,
                                s.prepare)]
        compute, exposed, comm, free, stage, bubble, prepare = us
        rows.append([device, str(s.step) if step_marks else None, compute, exposed, comm - exposed, comm, free,
                     stage, bubble, max(exposed - bubble, 0), prepare])
    _write_csv(path, STEP_TRACE_COLUMNS, rows)


def _x(name: str, pid: int, tid: int, ts_ns: int, dur_ns: int, cat: str = "cpu_op") -> dict:
    return {"ph": "X", "name": name, "pid": pid, "tid": tid, "ts": us_str(ts_ns), "dur": dur_ns / 1000.0,
            "cat": cat, "args": {"Sequence number": -1, "Fwd thread id": 0}}


def _device_x(name: str, pid: int, tid: int, ts_ns: int, dur_ns: int, args: dict | None = None) -> dict:
    """A device event of CANN's msprof timeline: no "cat"; ts a string of µs."""
    ev = {"name": name, "pid": pid, "tid": tid, "ts": us_str(ts_ns), "dur": dur_ns / 1000.0}
    if args is not None:
        ev["args"] = args
    ev["ph"] = "X"
    return ev


def _process(pid: int, name: str, device: int, sort_index: int) -> list[dict]:
    return [{"name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}, "ph": "M"},
            {"name": "process_labels", "pid": pid, "tid": 0, "args": {"labels": f"NPU {device}"}, "ph": "M"},
            {"name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": sort_index}, "ph": "M"}]


def _write_trace_view(path: Path, tl: _Timeline, form: str, *, dataloader: bool, optimizer: bool,
                      step_marks: bool, device_timeline: bool, flows: bool) -> None:
    pid, device = tl.pid, tl.device
    tid = pid
    host: list[dict] = []
    # Device processes (TraceEventManager.get_pid_format: pid << 10 | sort index << 5 | device id).
    hw_pid, hccl_pid, overlap_pid = ((pid << 10) | (i << 5) | device for i in (1, 2, 3))
    meta = [*_process(hw_pid, "Ascend Hardware", device, 1),
            {"name": "thread_name", "pid": hw_pid, "tid": _STREAM, "args": {"name": f"Stream {_STREAM}"}, "ph": "M"},
            *_process(hccl_pid, "HCCL", device, 2),
            {"name": "thread_name", "pid": hccl_pid, "tid": _HCCL_TID, "args": {"name": "Communication"},
             "ph": "M"},
            *_process(overlap_pid, "Overlap Analysis", device, 3)]
    dev: list[dict] = []
    flow: list[dict] = []
    for s in tl.steps:
        t = tl.host_start[s.step]
        host_ns, data_ns, opt_ns = (round(v * 1e9) for v in (s.host_s, s.data_s, s.optimizer_s))
        if step_marks:
            host.append(_x(f"ProfilerStep#{s.step}", pid, tid, t, host_ns))
        if dataloader:
            host.append(_x("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", pid, tid, t + 1000,
                           data_ns))
        fwd = t + 1000 + data_ns + 1000
        host.append(_x("aten::addmm", pid, tid, fwd, 5000))
        if optimizer:
            host.append(_x("Optimizer.step#SGD.step", pid, tid, t + host_ns - opt_ns - 1000, opt_ns))
        for i, (_op, kernel, start, end) in enumerate(tl.kernels[s.step]):
            dev.append(_device_x(kernel, hw_pid, _STREAM, start, end - start, {
                "Model Id": 4294967295, "Task Type": "AI_CORE", "Stream Id": _STREAM, "Task Id": i, "Batch Id": 0,
                "Subtask Id": 4294967295}))
            # TraceEventManager.create_torch_to_npu_flow(torch op, kernel): id = the kernel's start in ns
            flow += [{"ph": "s", "bp": "e", "name": FLOW_NAME, "id": start, "pid": pid, "tid": tid,
                      "ts": us_str(fwd), "cat": FLOW_CAT},
                     {"ph": "f", "bp": "e", "name": FLOW_NAME, "id": start, "pid": hw_pid, "tid": _STREAM,
                      "ts": us_str(start), "cat": FLOW_CAT}]
        d = tl.device_start[s.step]
        compute, exposed, free, comm = (round(v * 1e9) for v in (s.compute_s, s.comm_exposed_s, s.free_s,
                                                                  s.comm_s))
        c0 = tl.comm_start(s)
        if comm:
            dev.append(_device_x("hcom_allReduce__501_0_1", hccl_pid, _HCCL_TID, c0, comm, {
                "connection_id": 0, "model id": 4294967295, "data_type": "FP32", "alg_type": "MESH-RING",
                "count": 1024}))
        for name, start, dur in (("Computing", d, compute), ("Communication", c0, comm),
                                 ("Communication(Not Overlapped)", d + compute, exposed),
                                 ("Free", d + compute + exposed, free)):
            if dur:
                dev.append(_device_x(name, overlap_pid, {"Computing": 1, "Communication": 2,
                                                         "Communication(Not Overlapped)": 3, "Free": 4}[name],
                                     start, dur))
    host += [  # FwkFileParser.get_fwk_trace_data: the X events first, then TraceEventManager.create_m_event
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "Python"}},
        {"ph": "M", "name": "process_labels", "pid": pid, "tid": 0, "args": {"labels": "CPU"}},
        {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": 0}},
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": f"Thread {tid}"}},
        {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}},
    ]
    text = json.dumps(host, ensure_ascii=False)
    if form == "truncated":
        path.write_text(text[:-1])  # FileManager.create_prepare_trace_json_by_path
        return
    if not device_timeline:
        full = text  # FileManager.create_json_file_by_path: the host part alone, a whole array
    else:
        # TraceViewParser.generate_view: the (pruned) msprof timeline, then the flow events, appended
        full = text[:-1] + "," + json.dumps(meta + dev + (flow if flows else []), ensure_ascii=False)[1:]
    if form == "cut":
        full = full[: len(text) // 2]
    elif form != "full":
        raise ValueError(f"trace_view must be 'full', 'truncated', 'cut' or None, got {form!r}")
    path.write_text(full)


# --- communication.json, communication_matrix.json ---------------------------------------------------------


def _op_entry(op: HcclOp, start_us: float) -> dict:
    """One operator as CANN's communication analysis writes it."""
    ratio = lambda a, b: round(a / b, 4) if b else 0  # noqa: E731  CommunicationParser.compute_ratio
    times = dict(zip(COMM_TIME_KEYS, (start_us, op.elapse_ms, op.transit_ms, op.wait_ms, op.sync_ms, op.idle_ms,
                                      ratio(op.wait_ms, op.wait_ms + op.transit_ms),
                                      ratio(op.sync_ms, op.sync_ms + op.transit_ms))))
    links = dict(op.links)
    if "SDMA" not in links:
        hccs, pcie = links.get("HCCS", (0.0, 0.0)), links.get("PCIE", (0.0, 0.0))
        links["SDMA"] = (hccs[0] + pcie[0], hccs[1] + pcie[1])
    bandwidth = {}
    for t in TRANSPORTS:
        size, ms = links.get(t, (0.0, 0.0))
        bandwidth[t] = {TRANSIT_SIZE_MB: size, TRANSIT_TIME_MS: ms, BANDWIDTH_GB_S: ratio(size, ms),
                        "Large Packet Ratio": 0.0, "Size Distribution": {f"{size}": [1, ms]} if size else {}}
    return {COMM_TIME_INFO: times, COMM_BANDWIDTH_INFO: bandwidth}


def _with_total(ops: dict) -> dict:
    """CommunicationParser.compute_total_info: the group's ops summed into "Total Op Info"."""
    if not ops:
        return ops
    times: dict = defaultdict(float)
    bandwidth: dict = {}
    for info in ops.values():
        for k, v in info[COMM_TIME_INFO].items():
            if k not in ("Wait Time Ratio", "Synchronization Time Ratio", "Start Timestamp(us)"):
                times[k] += v
        for t, b in info[COMM_BANDWIDTH_INFO].items():
            tot = bandwidth.setdefault(t, {TRANSIT_TIME_MS: 0, TRANSIT_SIZE_MB: 0,
                                           "Size Distribution": defaultdict(lambda: [0, 0])})
            tot[TRANSIT_TIME_MS] += b[TRANSIT_TIME_MS]
            tot[TRANSIT_SIZE_MB] += b[TRANSIT_SIZE_MB]
            for size, (n, ms) in b["Size Distribution"].items():
                tot["Size Distribution"][size][0] += n
                tot["Size Distribution"][size][1] += ms
    w, tr, sy = times[WAIT_TIME_MS], times[TRANSIT_TIME_MS], times[SYNC_TIME_MS]
    times["Wait Time Ratio"] = round(w / (w + tr), 4) if w + tr else 0
    times["Synchronization Time Ratio"] = round(sy / (tr + sy), 4) if tr + sy else 0
    ops[TOTAL_OP_INFO] = {COMM_TIME_INFO: times, COMM_BANDWIDTH_INFO: bandwidth}
    return ops


def _split(ops: dict) -> dict:
    """CommunicationParser.split_communication_p2p_ops."""
    out: dict = {"p2p": {}, "collective": {}}
    for name, info in ops.items():
        out["p2p" if name.lower().startswith(P2P_PREFIXES) else "collective"][name] = info
    return out


def _matrix_group(ops: dict[str, dict]) -> dict:
    """CommunicationParser.get_comm_type + integrate_matrix_data for one group of ops (raw matrix entries)."""
    by_name: dict = defaultdict(list)
    for full, links in ops.items():
        m = re.compile(HCCL_PATTERN).search(full.lower())
        kind = m.group() if m else full.split("__")[0]
        for link, data in links.items():
            by_name[(kind, full.split("@")[-1], link)].append(dict(data, **{"Op Name": full.split("@")[0]}))
    out: dict = defaultdict(dict)
    for (kind, group, link), data in by_name.items():
        data.sort(key=lambda x: x[BANDWIDTH_GB_S], reverse=True)
        size, ms = sum(x[TRANSIT_SIZE_MB] for x in data), sum(x[TRANSIT_TIME_MS] for x in data)
        out[f"{kind}-top1@{group}"][link] = data[0]
        out[f"{kind}-middle@{group}"][link] = data[len(data) // 2]
        out[f"{kind}-bottom1@{group}"][link] = data[-1]
        out[f"{kind}-total@{group}"][link] = {TRANSPORT_TYPE: data[0][TRANSPORT_TYPE], TRANSIT_SIZE_MB: size,
                                              TRANSIT_TIME_MS: ms, BANDWIDTH_GB_S: round(size / ms, 4) if ms else 0}
        if len(data) >= 2:
            out[f"{kind}-bottom2@{group}"][link] = data[-2]
        if len(data) >= 3:
            out[f"{kind}-bottom3@{group}"][link] = data[-3]
    return dict(out)


def hccl_names(ops: Sequence[HcclOp], step: int) -> dict[str, HcclOp]:
    """``<op>__<n>_<i>_1@<group>`` -> op, as CANN names its operators (unique across steps)."""
    return {f"{op.name}__{500 + step}_{i}_1@{HCCL_GROUP}": op for i, op in enumerate(ops)}


def raw_communication(ops: Sequence[HcclOp], step: int, start_us: float) -> dict:
    """CANN's per-operator communication data (analyze/communication.json), the parser's input; the ops start
    1 µs apart from ``start_us``."""
    return {name: _op_entry(op, start_us + i) for i, (name, op) in enumerate(hccl_names(ops, step).items())}


def raw_matrix(ops: Sequence[HcclOp], step: int) -> dict:
    """CANN's per-operator link data (analyze/communication_matrix.json), the parser's input."""
    return {name: {link: {TRANSPORT_TYPE: t, TRANSIT_SIZE_MB: size, TRANSIT_TIME_MS: ms,
                          BANDWIDTH_GB_S: round(size / ms, 4) if ms else 0}
                   for link, (t, size, ms) in op.pairs.items()}
            for name, op in hccl_names(ops, step).items()}


def comm_start_us(tl: "_Timeline", s: Step) -> float:
    """Where a step's HCCL operators start (µs): with its Communication event, inside its device window."""
    return tl.comm_start(s) / 1000.0


def _write_communication(out: Path, hccl: Mapping[int, Sequence[HcclOp]], tl: _Timeline, step_marks: bool,
                         matrix: bool) -> None:
    comm, mat = {}, {}
    by_step = {s.step: s for s in tl.steps}
    for n, ops in hccl.items():
        key = f"step{n}" if step_marks else "step"  # "step" + step_id, or "step" without steps
        raw = raw_communication(ops, n, comm_start_us(tl, by_step[n]))
        comm[key] = {g: _with_total(v) for g, v in _split(raw).items()}
        mat[key] = {g: _matrix_group(v) for g, v in _split(raw_matrix(ops, n)).items()}
    (out / COMMUNICATION_FILE).write_text(json.dumps(comm, ensure_ascii=False))  # create_json_file: no indent
    if matrix and any(op.pairs for ops in hccl.values() for op in ops):
        (out / COMMUNICATION_MATRIX_FILE).write_text(json.dumps(mat, ensure_ascii=False))
