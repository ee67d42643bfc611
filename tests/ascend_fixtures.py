"""Build torch_npu profiler folders (``*_ascend_pt``) for the trace reader's tests.

These folders are BUILT, not real profiler output: no Ascend machine wrote them. They follow torch_npu 2.13.0's
writer (the file layout, file names, CSV header rows, the trace_view.json event keys and the metadata keys, read
from the wheel: ``torch_npu/profiler/_profiler_path_creator.py``, ``profiler_interface.py``
(``_dump_profiler_info``, ``_dump_metadata``), ``analysis/prof_view/_trace_step_time_parser.py``,
``_operator_view_parser.py``, ``_kernel_view_parser.py``, ``prof_common_func/_csv_headers.py``,
``_trace_event_manager.py``, ``_file_manager.py``), and ``tests/test_ascend_format.py`` checks them against the
wheel so they cannot drift. What they cannot reproduce: CANN's own raw files (``FRAMEWORK/`` and ``PROF_*/`` hold
only the info.json files the reader reads) and the timing details of a real device (the device timeline is one
event per phase per step). See docs/trace_formats.md.

Times are given in seconds (:class:`Step`) and written in microseconds, as torch_npu writes them.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from helpers.traces.ascend import (
    ASCEND_SUFFIX, FRAMEWORK_DIR, KERNEL_DETAILS_FILE, METADATA_FILE, OPERATOR_DETAILS_FILE, OUTPUT_DIR,
    STEP_TRACE_COLUMNS, STEP_TRACE_FILE, TRACE_VIEW_FILE,
)

#: ``OperatorViewParser.OPERATOR_HEADERS`` (torch_npu 2.13.0).
OPERATOR_COLUMNS: tuple[str, ...] = (
    "Name", "Input Shapes", "Call Stack", "Host Self Duration(us)", "Host Total Duration(us)",
    "Device Self Duration(us)", "Device Total Duration(us)", "Device Self Duration With AICore(us)",
    "Device Total Duration With AICore(us)",
)
#: ``["Step Id"] + CsvHeaders.OP_SUMMARY_KERNEL_BASE_HEADERS``: kernel_details.csv at Level0 with a schedule.
KERNEL_COLUMNS: tuple[str, ...] = (
    "Step Id", "Device_id", "Name", "Type", "Accelerator Core", "Start Time(us)", "Duration(us)",
    "Wait Time(us)", "Block Num",
)
#: Keys of a host event (``TraceEventManager.create_x_event``); ``ts`` is a string of µs, ``dur`` a float.
X_EVENT_KEYS: tuple[str, ...] = ("ph", "name", "pid", "tid", "ts", "dur", "cat", "args")
#: Top-level keys of profiler_info*.json (``_dump_profiler_info``: Constant.CONFIG, START_INFO, END_INFO,
#: TORCH_NPU_VERSION, CANN_VERSION; "rank_id" only when RANK is set or torch.distributed is initialised).
INFO_KEYS: tuple[str, ...] = ("config", "start_info", "end_info", "torch_npu_version", "cann_version")

#: The operators each built step runs: name -> (calls, device µs per call, kernel name).
DEFAULT_OPS: dict[str, tuple[int, float, str]] = {
    "aten::addmm": (2, 300.0, "MatMulV2"), "aten::relu": (1, 40.0, "Relu"), "aten::add": (3, 10.0, "Add"),
}

_T0_NS = 1_735_732_800_000_000_000  # 2025-01-01T12:00:00Z, ns since the epoch


@dataclass(frozen=True)
class Step:
    """One built step, seconds.

    ``host_s`` is the ProfilerStep#N span; the DataLoader's ``__next__`` (``data_s``) opens the step and
    ``Optimizer.step`` (``optimizer_s``) closes it. The device columns of step_trace_time.csv are written as
    given; ``stage_s`` defaults to compute + comm_exposed + free, ``prepare_s`` to ``data_s``.
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
                        operator_details: bool = True, kernel_details: bool = True,
                        ops: dict[str, tuple[int, float, str]] | None = None) -> Path:
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
        False: no ProfilerStep#N events and one csv row with an empty Step (a run without a schedule).
    parsed : bool
        False: no ASCEND_PROFILER_OUTPUT/ (the profiler stopped before parsing).
    """
    device = (rank or 0) if device_id is None else device_id
    root = Path(parent) / folder_name(hostname, pid, stamp)
    root.mkdir(parents=True)
    _write_raw(root, hostname, pid, device, rank, stamp)
    _write_info(root, rank, torch_npu_version, cann_version, steps)
    _write_metadata(root, rank, world_size, comm_name)
    if not parsed:
        return root
    out = root / OUTPUT_DIR
    out.mkdir()
    ops = DEFAULT_OPS if ops is None else ops
    _write_step_trace(out / STEP_TRACE_FILE, steps, device, step_marks)
    if trace_view is not None:
        _write_trace_view(out / TRACE_VIEW_FILE, steps, pid, device, trace_view, dataloader=dataloader,
                          optimizer=optimizer, step_marks=step_marks)
    if operator_details:
        _write_csv(out / OPERATOR_DETAILS_FILE, OPERATOR_COLUMNS, [
            [name, "[[8, 16], [16, 32]]", "", 12.0, 20.0, us, us, us, us]
            for _s in steps for name, (calls, us, _k) in ops.items() for _ in range(calls)])
    if kernel_details:
        rows, t = [], _T0_NS // 1000
        for s in steps:
            for _name, (calls, us, kernel) in ops.items():
                for _ in range(calls):
                    rows.append([s.step, device, kernel, kernel, "AI_CORE", f"{t}.000", us, 0.5, 8])
                    t += int(us) + 1
        _write_csv(out / KERNEL_DETAILS_FILE, KERNEL_COLUMNS, rows)
    return root


def build_cluster(parent: Path, per_rank: Sequence[Sequence[Step]], *, hostnames: Sequence[str] | None = None,
                  comm_name: str = "10.0.0.1%eth0_60000_0_1735732800000000", **kwargs) -> list[Path]:
    """One built folder per rank (rank r on ``hostnames[r]``, pid 4000 + r), all of one run (one HCCL group)."""
    world = len(per_rank)
    names = list(hostnames) if hostnames is not None else ["node-a"] * world
    return [build_ascend_folder(parent, steps, rank=r, world_size=world, hostname=names[r], pid=4000 + r,
                                device_id=r % 8, comm_name=comm_name, **kwargs)
            for r, steps in enumerate(per_rank)]


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


def _write_info(root: Path, rank: int | None, version: str, cann: str, steps: Sequence[Step]) -> None:
    info = {
        "config": {
            "common_config": {
                "activities": ["ProfilerActivity.CPU", "ProfilerActivity.NPU"],
                "schedule": {"wait": 0, "warmup": 1, "active": len(steps), "repeat": 1, "skip_first": 0},
                "record_shapes": False, "profile_memory": False, "with_stack": False, "with_flops": False,
                "with_modules": False,
            },
            "experimental_config": {"_profiler_level": "Level0", "_aic_metrics": "ACL_AICORE_NONE",
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


def _write_trace_view(path: Path, steps: Sequence[Step], pid: int, device: int, form: str, *, dataloader: bool,
                      optimizer: bool, step_marks: bool) -> None:
    tid = pid
    host: list[dict] = []
    npu_pid = (pid << 10) | (3 << 5) | device  # TraceEventManager.get_pid_format
    dev: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": npu_pid, "tid": 0, "args": {"name": "Overlap Analysis"}},
        {"ph": "M", "name": "process_labels", "pid": npu_pid, "tid": 0, "args": {"labels": f"NPU {device}"}},
    ]
    t = _T0_NS
    for s in steps:
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
        d = t + round(s.prepare * 1e9)
        for name, sec in (("Computing", s.compute_s), ("Communication", s.comm_s), ("Free", s.free_s),
                          ("Communication(Not Overlapped)", s.comm_exposed_s)):
            dev.append({"name": name, "pid": npu_pid, "tid": 0, "ts": us_str(d), "dur": sec * 1e6, "ph": "X"})
        t += host_ns
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
    full = text[:-1] + "," + json.dumps(dev)[1:]  # FileManager.append_trace_json_by_path
    if form == "cut":
        full = full[: len(text) // 2]
    elif form != "full":
        raise ValueError(f"trace_view must be 'full', 'truncated', 'cut' or None, got {form!r}")
    path.write_text(full)
