"""An Ascend folder's trace_view.json and kernel_details.csv read into steps: the host phases of every read, and the
device phases where step_trace_time.csv is missing (a partial folder, see :mod:`helpers.traces.ascend`).

:func:`_read_trace_view` streams trace_view.json (ijson) for the host's ``ProfilerStep#N``, DataLoader and optimizer
spans and, with ``device=True``, sums the device timeline per step the way ``TraceStepTimeParser`` does (each step's
device window found through the ``torch_to_npu`` flow events); :func:`_read_kernel_steps` reads kernel_details.csv's
kernels per ``Step Id``; :func:`_partial_steps` makes the steps of a folder without step_trace_time.csv from them, or
says why nothing per step can be read.
"""

from __future__ import annotations

import bisect
import csv
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from helpers.traces.ascend_format import (
    _US,
    BUBBLE_PREFIX,
    COMMUNICATION_FILE,
    DATALOADER_PREFIX,
    DATALOADER_SUFFIX,
    DEVICE_EVENTS,
    FLOW_CAT,
    FLOW_NAME,
    HOST_OP_CAT,
    KERNEL_DETAILS_FILE,
    KERNEL_DEVICE,
    KERNEL_DURATION,
    KERNEL_NAME,
    KERNEL_START,
    KERNEL_STEP,
    KERNEL_TYPE,
    NPU_LABEL,
    OFFLINE_PARSE,
    OPTIMIZER_PREFIX,
    OUTPUT_DIR,
    PROCESS_LABELS,
    PROFILER_STEP_PREFIX,
    STEP_TRACE_FILE,
    TRACE_VIEW_FILE,
    _int_or_none,
    _ns,
    _ranges,
    _s,
    _us,
)
from helpers.traces.model import StepPhases, TraceError
from helpers.traces.peek import _Counted

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
        with path.open("rb") as raw:
            # one string or number that runs on (a corrupt file) stops the read as a cut does, within ~2 MiB of it,
            # before yajl lexes it again after every read (quadratic time) and holds it whole
            f = _Counted(raw, path, writer="torch_npu", todo="the read stops there")
            for ev in ijson.items(f, "item", use_float=True, buf_size=1 << 20):
                count += 1
                if _take(ev, scan) and not device and (scan.steps or scan.loads or scan.opts):
                    break  # the host's own events are all read; the rest is the device timeline
    except (ijson.JSONError, ValueError, OSError) as exc:
        cut = exc
    host_only = (cut is not None and not isinstance(cut, TraceError) and scan.host_done and not scan.phases
                 and not scan.flows)
    if isinstance(cut, TraceError):  # a token that runs on (_Counted): the message says what and where
        limits.append(f"{cut}: host phases come from the {count} events before it, steps after it have none")
    elif cut is not None and host_only:
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
