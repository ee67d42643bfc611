"""The steps of a Kineto trace and their phases, read from its events' columns with vectorised interval arithmetic.

:func:`helpers.traces.kineto.read_kineto` parses the file into columns (:class:`_Events`: start, duration, end,
interned name, category and thread of each complete span); :func:`_analyse` finds the ``ProfilerStep#N`` spans and
each step's phases, the device, the collectives, the top ops and the provenance, and returns the
:class:`~helpers.traces.model.RankTrace`.

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
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from helpers.traces.model import RankTrace, StepPhases, TraceError

#: Ops reported in ``top_ops``.
TOP_OPS = 20

_STEP = re.compile(r"ProfilerStep#(\d+)")
_COPY_OPS = frozenset({"aten::to", "aten::_to_copy", "aten::copy_"})
_HOST_CATS = frozenset({"cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver",
                        "privateuse1_runtime", "privateuse1_driver", "xpu_runtime", "mtia_runtime"})
#: Host categories the phases read (python_function spans of with_stack=True enclose whole steps).
_PHASE_CATS = frozenset({"cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "privateuse1_runtime",
                         "privateuse1_driver", "xpu_runtime", "mtia_runtime"})
#: Device activity: CUDA/ROCm/XPU kernels and copies, and MTIA's command-processor events.
_DEVICE_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "mtia_ccp_events"})
#: Host calls that block until the device has done its work (CUDA and HIP runtime names): the host's wait in
#: them is ``sync_wait``, attributed to what the device did meanwhile.
_SYNC_CALLS = frozenset({"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
                         "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize",
                         "hipStreamSynchronize", "hipDeviceSynchronize", "hipEventSynchronize", "hipMemcpy",
                         "hipMemcpyWithStream"})
#: Communication kernels: HTA's rule (``nccl`` in the name, ``hta/utils/utils.py``) with ROCm's RCCL, which
#: names its kernels ``ncclDevKernel...`` as well, and Ascend's HCCL.
_COMM_WORDS = ("nccl", "rccl", "hccl")


def _no_steps(path: Path, *, early: int | None = None) -> TraceError:
    seen = f" in its first {early:,} events" if early else ""
    return TraceError(f"{path}: the trace has no ProfilerStep#N annotations{seen}, so its steps cannot be told "
                      "apart; record with schedule=torch.profiler.schedule(wait=1, warmup=1, active=3) and call "
                      "prof.step() once per training step")


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



def _analyse(path: Path, parser: Any, ev: _Events) -> RankTrace:  # parser: kineto's _Parser
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


def _provenance(path: Path, parser: Any, ev: _Events, start_unix, step_thread: int) -> dict[str, Any]:
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
