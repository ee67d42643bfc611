"""The steps of a Kineto trace and their phases, read from its events' columns with vectorised interval arithmetic.

:func:`helpers.traces.kineto.read_kineto` parses the file into columns (:class:`_Events`: start, duration, end,
interned name, category and thread of each complete span); :func:`_analyse` finds the steps (``ProfilerStep#N``) and
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
- steps without ``ProfilerStep#N`` (``torch.autograd.profiler``, or a profiler without a schedule): from the
  most frequent ``Optimizer.step#<class>.step`` name, a step from the end of one to the end of the next; else
  from the DataLoader's ``__next__`` spans, from the start of one to the start of the next; numbered 1, 2, ...
  (``provenance["step_marker"]`` and ``limits`` name the marker); refused only where no marker exists.
- communication kernels, beyond HTA's name rule: kernels that carry a collective's metadata (kineto copies the
  launching ``record_param_comms`` op's ``Collective name`` onto them), DeepEP's internode/intranode kernels, and
  kernels on a stream where those take most of the kernel time (:data:`COMM_RULES`; ``provenance["communication"]``
  lists each kernel with the rule that took it, and ``limits`` says it).
- ``collectives``: each communication kernel taken by name or metadata (not by its stream; a CPU trace: each
  ``gloo:*`` span) starting inside a step, with its duration: the input of :mod:`helpers.traces.arrival`.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from helpers.traces.model import RankTrace, StepPhases, TraceError
from helpers.traces.precision import compute_mix

#: Ops reported in ``top_ops``.
TOP_OPS = 20

_STEP = re.compile(r"ProfilerStep#(\d+)")
#: Where a trace has no ``ProfilerStep#N``, its steps are read from the optimizer's step spans (torch's optimizer
#: hook, torch/optim/optimizer.py: ``record_function(f"Optimizer.step#{self.__class__.__name__}.step")``), else from
#: the DataLoader's ``__next__`` spans (torch/utils/data/dataloader.py:
#: ``f"enumerate(DataLoader)#{self.__class__.__name__}.__next__"``), in that order.
_OPT_STEP = re.compile(r"Optimizer\.step#[^#]*\.step")
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
#: DeepEP's kernels that move tokens between GPUs (github.com/deepseek-ai/DeepEP, ``csrc/kernels/internode.cu``,
#: ``intranode.cu``, ``internode_ll.cu``: the namespaces ``deep_ep::internode``, ``::intranode``, ``::internode_ll``,
#: holding notify_dispatch, dispatch, cached_notify, combine; its ``deep_ep::layout`` kernel computes locally).
#: DeepSeek's own traces (deepseek-ai/profile-data) name the namespace ``dpsk::ep``.
_DEEP_EP = re.compile(r"\b(?:deep_ep|ep)::(?:internode|intranode|internode_ll)::")
#: A kernel on a stream (a kernel event's pid and tid: device and stream) where the communication kernels take
#: more than this share of the kernel time is taken as communication: collective libraries run on streams of their
#: own (ProcessGroupNCCL's NCCL streams, DeepEP's ``Buffer::comm_stream``), and what else runs there prepares or
#: finishes their transfers (on the 4 NCCL traces of tests/data/public_traces nothing else runs on those streams).
COMM_STREAM_SHARE = 0.5
#: The rules a kernel is taken as communication by, as the verdict states them.
COMM_RULES = {
    "name": "their names hold nccl, rccl or hccl (HTA's rule)",
    "metadata": "they carry a collective's metadata (args 'Collective name', copied from the record_param_comms op "
                "that launched them)",
    "DeepEP": "they are DeepEP's internode/intranode kernels (namespaces deep_ep::internode, ::intranode, "
              "::internode_ll)",
    "stream": f"they run on a stream where communication kernels take more than {COMM_STREAM_SHARE:.0%} of the "
              "kernel time",
}


def _no_steps(path: Path, *, early: int | None = None) -> TraceError:
    seen = f" in its first {early:,} events" if early else ""
    return TraceError(f"{path}: the trace has no ProfilerStep#N annotations{seen}, and no Optimizer.step# or "
                      "DataLoader __next__ spans to mark its steps either, so its steps cannot be told "
                      "apart; record with schedule=torch.profiler.schedule(wait=1, warmup=1, active=3) and call "
                      "prof.step() once per training step")


def _is_marker(name: str) -> bool:
    """Whether a span can mark steps: ``ProfilerStep#N``, an optimizer's step, a DataLoader's ``__next__``."""
    return _STEP.fullmatch(name) is not None or _OPT_STEP.fullmatch(name) is not None or _is_data(name)


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
    """Complete spans as columns: start, duration, end (int64 ns), interned name (int32), category (int16) and
    thread (int32) ids into ``names``, ``cats`` and ``threads`` (the whole trace's tables, shared by every
    window)."""

    ts: np.ndarray
    dur: np.ndarray
    end: np.ndarray
    name: np.ndarray
    cat: np.ndarray
    thread: np.ndarray
    names: list[str]
    cats: list[str]
    threads: list[tuple[str, str]]


def _is_data(name: str) -> bool:
    return name.startswith("enumerate(DataLoader)#") and name.endswith("__next__")


def _is_optimizer(name: str) -> bool:
    return name.startswith(("Optimizer.step#", "Optimizer.zero_grad#"))


def _is_nccl(name: str) -> bool:
    low = name.lower()
    return any(w in low for w in _COMM_WORDS)


class _Lookups:
    """What each interned name and category is, as boolean arrays indexed by id, built once per trace (so that a
    mask over millions of events is one fancy index, in every window)."""

    def __init__(self, names: list[str], cats: list[str], collective: frozenset[str] | set[str] = frozenset()) -> None:
        def by_name(pred) -> np.ndarray:
            return np.fromiter((bool(pred(n)) for n in names), dtype=bool, count=len(names))

        def by_cat(wanted) -> np.ndarray:
            return np.fromiter((c in wanted for c in cats), dtype=bool, count=len(cats))

        self.step = by_name(lambda n: _STEP.fullmatch(n) is not None)
        self.data = by_name(_is_data)
        self.optimizer = by_name(_is_optimizer)
        self.nccl = by_name(_is_nccl)
        self.deep_ep = by_name(lambda n: _DEEP_EP.search(n) is not None)
        self.metadata = by_name(lambda n: n in collective)
        #: communication kernels by name: HTA's rule, DeepEP's kernels, kernels with a collective's metadata
        self.comm = self.nccl | self.deep_ep | self.metadata
        self.sync = by_name(lambda n: n in _SYNC_CALLS)
        self.copy = by_name(lambda n: n in _COPY_OPS)
        self.gloo = by_name(lambda n: n.startswith("gloo:"))
        self.htod = by_name(lambda n: "HtoD" in n or "H2D" in n)
        self.step_cat = by_cat({"user_annotation", "cpu_op"})
        self.phase_cat = by_cat(_PHASE_CATS)
        self.host_cat = by_cat(_HOST_CATS)
        self.device_cat = by_cat(_DEVICE_CATS)
        self.kernel_cat = by_cat({"kernel", "mtia_ccp_events"})
        self.memcpy_cat = by_cat({"gpu_memcpy"})


@dataclass
class _Plan:
    """What every window needs to know of the whole trace: the steps (host spans, ns), the training thread, the
    device, and where the profiled steps begin and end."""

    lo: np.ndarray
    hi: np.ndarray
    numbers: list[int]
    step_thread: int
    device: bool
    comm_stream: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))  # per thread id: a comm stream


class _Sums:
    """Per-step int64 ns sums over the windows (each window's contribution is clipped to it, so they add), flags
    for "the trace has such spans at all", and the few things kept whole: collectives, the training thread's
    DataLoader spans and the steps' direct children (a CPU trace's copy rule), the top operators' self times."""

    def __init__(self, n_steps: int, n_names: int) -> None:
        self.n = n_steps
        self.arrays: dict[str, np.ndarray] = {}
        self.flags: set[str] = set()
        self.collectives: list[tuple[int, int, int]] = []  # (ts ns, name id, dur ns)
        self.data_spans: set[tuple[int, int]] = set()
        self.children: set[tuple[int, int, int, int]] = set()  # (step index, ts, end, name id)
        self.device_pids: set[str] = set()
        self.self_ns = np.zeros(n_names, np.float64)
        self.calls = np.zeros(n_names, np.int64)
        self.device_names = np.zeros(n_names, bool)

    def add(self, key: str, value: np.ndarray) -> None:
        if key in self.arrays:
            self.arrays[key] += value
        else:
            self.arrays[key] = value.astype(np.int64, copy=True)

    def get(self, key: str) -> np.ndarray:
        return self.arrays.get(key, np.zeros(self.n, np.int64))


def _mask_union(ev: _Events, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return _union(ev.ts[mask], ev.end[mask])


def _window(ev: _Events, lk: _Lookups, plan: _Plan, wlo: int, whi: int, sums: _Sums) -> None:
    """Add one window's contribution to ``sums``: the events of ``ev`` are every span that overlaps [wlo, whi)
    (a span crossing a boundary is in both windows); each covered time is measured inside the window only."""
    lo, hi = np.clip(plan.lo, wlo, whi), np.clip(plan.hi, wlo, whi)

    def cov(u):
        return _covered(u, lo, hi)

    name, cat = ev.name, ev.cat
    on_thread = (ev.thread == plan.step_thread) & lk.phase_cat[cat]
    step_row = on_thread & lk.step[name] & lk.step_cat[cat]
    data_mask = on_thread & lk.data[name]
    data_u = _mask_union(ev, data_mask)
    if data_mask.any():
        sums.flags.add("data")
        sums.add("data", cov(data_u))
        inside = data_mask & (ev.ts >= wlo) & (ev.ts < whi)
        sums.data_spans.update(zip(ev.ts[inside].tolist(), ev.end[inside].tolist()))
    opt_mask = on_thread & lk.optimizer[name]
    if opt_mask.any():
        sums.flags.add("optimizer")
        sums.add("optimizer", cov(_mask_union(ev, opt_mask)))
    in_window = (ev.ts >= wlo) & (ev.ts < whi)
    if plan.device:
        device = lk.device_cat[cat]
        kernel = lk.kernel_cat[cat] & device
        named = kernel & lk.comm[name]
        nccl = named | (kernel & plan.comm_stream[ev.thread]) if len(plan.comm_stream) else named
        all_u = _mask_union(ev, device)
        comp_u = _mask_union(ev, kernel & ~nccl)
        comm_u = _mask_union(ev, nccl)
        work_u = _merge(comm_u, comp_u)
        busy, work = cov(all_u), cov(work_u)
        sums.add("busy", busy)
        sums.add("compute", cov(comp_u))
        sums.add("comm", cov(comm_u))
        sums.add("work", work)
        htod = device & lk.memcpy_cat[cat] & lk.htod[name]
        if htod.any():
            sums.flags.add("htod")
            sums.add("copy_work", cov(_merge(_mask_union(ev, htod), work_u)))
        else:
            sums.add("copy_work", work)
        sums.add("data_busy", cov(_merge(data_u, all_u)) if data_mask.any() else busy)
        sync = (ev.thread == plan.step_thread) & lk.host_cat[cat] & lk.sync[name]
        if sync.any():
            sums.flags.add("sync")
            sync_u = _mask_union(ev, sync)
            sums.add("sync", cov(sync_u))
            sums.add("sync_comm", cov(_merge(sync_u, comm_u)))
            sums.add("sync_work", cov(_merge(sync_u, work_u)))
            sums.add("sync_busy", cov(_merge(sync_u, all_u)))
        else:  # |sync ∩ u| = 0 in this window: |sync ∪ u| = |u|
            sums.add("sync_comm", cov(comm_u))
            sums.add("sync_work", work)
            sums.add("sync_busy", busy)
        sums.device_pids.update(ev.threads[t][0] for t in np.unique(ev.thread[device]).tolist())
        coll = named & in_window  # the collectives themselves, for the arrival rule
    else:
        ops = on_thread & ~step_row
        busy_u = _mask_union(ev, ops)
        cpu_busy = cov(busy_u)
        sums.add("cpu_busy", cpu_busy)
        gloo = lk.gloo[name] & lk.step_cat[cat]
        if gloo.any():
            sums.flags.add("gloo")
            comm_u = _mask_union(ev, gloo)
            sums.add("comm", cov(comm_u))
            sums.add("comm_busy", cov(_merge(comm_u, busy_u)))
        else:
            sums.add("comm_busy", cpu_busy)
        _step_children(ev, on_thread, step_row, plan, wlo, whi, sums)
        coll = gloo & in_window
    idx = np.flatnonzero(coll)
    sums.collectives.extend(zip(ev.ts[idx].tolist(), ev.name[idx].tolist(), ev.dur[idx].tolist()))
    _top_ops_window(ev, lk, plan, wlo, whi, sums)


def _step_children(ev: _Events, on_thread, step_row, plan: _Plan, wlo: int, whi: int, sums: _Sums) -> None:
    """The direct children of the steps on the training thread that start in this window (a child's ancestors
    all overlap its start, so they are in the window too): the input of a CPU trace's copy rule."""
    th = np.flatnonzero(on_thread)
    if not len(th) or not step_row.any():
        return
    order, parent = _nesting(ev.ts[th], ev.end[th])
    rows = th[order]
    has = parent >= 0
    kid = np.flatnonzero(has)
    par = rows[parent[kid]]
    ok = step_row[par] & (ev.ts[rows[kid]] >= wlo) & (ev.ts[rows[kid]] < whi)
    kids, owners = rows[kid[ok]], par[ok]
    k = np.searchsorted(plan.lo, ev.ts[owners], side="right") - 1
    sums.children.update(zip(k.tolist(), ev.ts[kids].tolist(), ev.end[kids].tolist(), ev.name[kids].tolist()))


def _top_ops_window(ev: _Events, lk: _Lookups, plan: _Plan, wlo: int, whi: int, sums: _Sums) -> None:
    """Self times by name of the ops that start in this window and inside the profiled steps: a host op's duration
    less its direct children's (nesting per thread, among the host ops inside the profiled steps), a device
    event's duration."""
    first, last = int(plan.lo[0]), int(plan.hi[-1])
    profiled = (ev.ts >= first) & (ev.ts < last)
    here = profiled & (ev.ts >= wlo) & (ev.ts < whi)
    host = profiled & lk.host_cat[ev.cat] & ~lk.step[ev.name]
    hidx = np.flatnonzero(host)
    n_names = len(sums.calls)
    for t in np.unique(ev.thread[hidx]).tolist():
        rows = hidx[ev.thread[hidx] == t]
        order, parent = _nesting(ev.ts[rows], ev.end[rows])
        r = rows[order]
        s, e = ev.ts[r], ev.end[r]
        child = np.flatnonzero((parent >= 0) & here[r])
        p = parent[child]
        overlap = np.maximum(np.minimum(e[child], e[p]) - s[child], 0)
        sums.self_ns -= np.bincount(ev.name[r[p]], weights=overlap.astype(np.float64), minlength=n_names)
    for mask in (host & here, profiled & here & lk.device_cat[ev.cat]):
        ids = ev.name[mask]
        sums.self_ns += np.bincount(ids, weights=ev.dur[mask].astype(np.float64), minlength=n_names)
        sums.calls += np.bincount(ids, minlength=n_names)
    sums.device_names[np.unique(ev.name[profiled & here & lk.device_cat[ev.cat]])] = True


def _analyse(path: Path, parser: Any, steps: _Events, windows, *, has_device: bool, events: int) -> RankTrace:
    """The :class:`RankTrace` of a parsed trace (``parser``: kineto's ``_Parser``, for the metadata).

    ``steps`` holds the trace's spans that can mark steps (:func:`_is_marker`) and the tables; ``windows`` yields
    ``(events, wlo, whi)``: the spans that overlap [wlo, whi) as :class:`_Events`, windows that partition time
    (one window of everything for a trace read into memory, several for one spilled to disk); ``has_device``:
    whether any device event was read; ``events``: how many complete events were read.
    """
    meta = parser.meta
    cols = getattr(parser, "cols", None)
    lk = _Lookups(steps.names, steps.cats, getattr(cols, "collective_kernels", frozenset()))
    step_thread, lo, hi, numbers, marker = _step_spans(path, steps, lk)
    length = hi - lo
    device_kind = _device_kind(steps.names, steps.cats, meta, has_device)
    comm_stream, comm_kernels = _comm_plan(lk, getattr(cols, "stream_kernels", {}), steps.names, len(steps.threads))
    plan = _Plan(lo=lo, hi=hi, numbers=numbers, step_thread=step_thread, device=device_kind != "cpu",
                 comm_stream=comm_stream)
    sums = _Sums(len(lo), len(steps.names))
    for ev, wlo, whi in windows:
        _window(ev, lk, plan, wlo, whi, sums)
        del ev

    limits: list[str] = []
    if marker != "ProfilerStep#N":
        how = ("from the end of one to the end of the next" if marker.startswith("Optimizer")
               else "from the start of one to the start of the next")
        limits.append(f"steps marked by the {marker} spans (the trace has no ProfilerStep#N annotation): a step runs "
                      f"{how}, so {len(lo) + 1} spans give {len(lo)} steps, numbered in order")
    get = sums.get
    data = get("data") if "data" in sums.flags else None
    if data is None:
        limits.append("data phase unknown: the step thread has no DataLoader __next__ spans (torch records them "
                      "only for a torch.utils.data.DataLoader iterated inside the profiled steps)")
    h2d = None
    if not plan.device:
        copy_u = _host_copies(sums, lk) if data is not None else None
        if copy_u is None:
            limits.append("h2d phase unknown: with no DataLoader span, the batch's copy cannot be told from the "
                          "step's other ops")
        else:
            spans = np.array(sorted(sums.data_spans), np.int64).reshape(-1, 2)
            data_u = _union(spans[:, 0], spans[:, 1])
            h2d = _covered(_merge(copy_u, data_u), lo, hi) - data
    optimizer = get("optimizer") if "optimizer" in sums.flags else None
    if optimizer is None:
        limits.append("optimizer phase unknown: no Optimizer.step# spans (torch records them for a "
                      "torch.optim optimizer)")
    unrecorded = False  # a job on a device whose activity the profiler did not record
    compute = idle = comm = comm_exposed = other = sync = None
    sync_on: dict[str, np.ndarray] = {}
    if not plan.device:
        limits.append("a CPU-only trace records no device: device idle time is unknown; compute is the training "
                      "thread's time in recorded operators outside data and copy, and the step's remaining time "
                      "(its gaps between operators: Python, the framework) is unattributed")
        if meta.get("deviceProperties"):
            limits.append("the trace lists devices in deviceProperties but recorded no device activity: profile "
                          "with activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA] to see the device")
            unrecorded = True
        if "gloo" in sums.flags:
            comm = get("comm")
            comm_exposed = np.maximum(get("comm_busy") - get("cpu_busy"), 0)
            limits.append("communication on a CPU trace is read from gloo's gloo:* spans (on its own threads) and "
                          "the gaps of the training thread while one is in flight; a gloo span can end late, when "
                          "the next collective is queued")
        busy = get("cpu_busy")
        if not unrecorded and busy.any():  # on a GPU job whose device was not recorded, host ops are launches
            spent = (data if data is not None else 0) + (h2d if h2d is not None else 0)
            compute = np.maximum(busy - spent, 0)
            other = np.maximum(length - busy - (comm_exposed if comm_exposed is not None else 0), 0)
    else:
        busy, work = get("busy"), get("work")
        compute, comm = get("compute"), get("comm")
        idle = np.maximum(length - busy, 0)
        comm_exposed = work - compute
        if data is not None:  # the wait for data the device does not hide: while it has nothing to run
            data = np.maximum(get("data_busy") - busy, 0)
        if "htod" in sums.flags:  # the device's own copy time, not the host's wait for it (that is sync_wait)
            h2d = np.maximum(get("copy_work") - work, 0)
        else:
            limits.append("h2d unknown: the trace records no host-to-device copy on the device")
        if "sync" in sums.flags:
            sync = get("sync")
            on_comm = sync + get("comm") - get("sync_comm")
            on_kernels = sync + work - get("sync_work")
            on_busy = sync + busy - get("sync_busy")
            sync_on = {"communication": on_comm, "compute": np.maximum(on_kernels - on_comm, 0),
                       "copy": np.maximum(on_busy - on_kernels, 0), "idle": np.maximum(sync - on_busy, 0)}
        if len(sums.device_pids) > 1:
            limits.append("the trace holds several devices: device times are the union over all of them")
        limits.append("device times are those of the work that ran during the host's step span (device work "
                      "lags the host by its launch queue)")

    steps_out = []
    for k, n in enumerate(numbers):
        def s(a):
            return None if a is None else float(a[k]) / 1e9
        on = {key: float(v[k]) / 1e9 for key, v in sync_on.items() if v[k] > 0}
        steps_out.append(StepPhases(step=n, step_s=float(length[k]) / 1e9, data=s(data), h2d=s(h2d),
                                    optimizer=s(optimizer), compute=s(compute), comm_exposed=s(comm_exposed),
                                    idle=s(idle), comm=s(comm), other=s(other), sync_wait=s(sync),
                                    sync_on=on or None))

    dist = meta.get("distributedInfo") if isinstance(meta.get("distributedInfo"), dict) else {}
    rank = dist.get("rank") if isinstance(dist.get("rank"), int) else None
    world = dist.get("world_size") if isinstance(dist.get("world_size"), int) else None
    start_unix = _start_unix(meta, int(lo[0]))
    prov = _provenance(path, parser, events, start_unix, steps.threads[step_thread])
    prov["pid"] = steps.threads[step_thread][0]
    prov["step_marker"] = marker
    if comm_kernels and plan.device:
        prov["communication"] = comm_kernels
        limits.append(comm_text(comm_kernels))
    if unrecorded:
        prov["device_not_recorded"] = True
    return RankTrace(
        source=path, format="kineto", device_kind=device_kind, steps=tuple(steps_out), rank=rank, world_size=world,
        node=_node(path, meta), run_id=_run_id(dist), top_ops=_top_ops(sums, steps.names), limits=tuple(limits),
        provenance=prov, collectives=tuple(_collectives(sums, steps.names, lo, hi, numbers)),
        compute_mix=_compute_mix(sums, steps.names, getattr(getattr(parser, "cols", None), "op_types", {})))


def _compute_mix(sums: _Sums, names: list[str], op_types):
    """The precision of the matrix work (:func:`helpers.traces.precision.compute_mix`): every device kernel's time
    in the profiled steps, and the matrix operators' ``Input type`` counted while parsing."""
    dev = np.flatnonzero(sums.device_names)
    return compute_mix({names[i]: float(sums.self_ns[i]) for i in dev.tolist()}, op_types)


def _comm_plan(lk: _Lookups, stream_kernels: dict, names: list[str],
               n_threads: int) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """(per thread id: whether it is a communication stream, the kernels taken as communication): each kernel name
    with the rule that took it (:data:`COMM_RULES`; the first that applies, in that order), its kernel time in the
    whole trace (ms, the streams it was taken on) and its calls, largest first."""
    comm_ns: dict[int, int] = {}
    all_ns: dict[int, int] = {}
    for (tid, nid), (ns, _) in stream_kernels.items():
        all_ns[tid] = all_ns.get(tid, 0) + ns
        if lk.comm[nid]:
            comm_ns[tid] = comm_ns.get(tid, 0) + ns
    stream = np.zeros(n_threads, bool)
    for tid, ns in comm_ns.items():
        if ns > COMM_STREAM_SHARE * all_ns[tid] and tid < n_threads:
            stream[tid] = True
    taken: dict[tuple[str, str], list[int]] = {}
    for (tid, nid), (ns, calls) in stream_kernels.items():
        rule = ("name" if lk.nccl[nid] else "metadata" if lk.metadata[nid] else "DeepEP" if lk.deep_ep[nid]
                else "stream" if tid < n_threads and stream[tid] else None)
        if rule is not None:
            acc = taken.setdefault((names[nid], rule), [0, 0])
            acc[0] += ns
            acc[1] += calls
    out = [{"name": n, "rule": r, "ms": ns / 1e6, "calls": c} for (n, r), (ns, c) in taken.items()]
    out.sort(key=lambda d: (-d["ms"], d["name"]))
    return stream, out


def comm_text(kernels: list[dict[str, Any]], shown: int = 3) -> str:
    """The kernels taken as communication (``provenance["communication"]`` of a trace read here: dicts with
    ``name``, ``rule`` (a key of :data:`COMM_RULES`), ``ms``, ``calls``), by rule, in one sentence."""
    parts = []
    for rule, why in COMM_RULES.items():
        mine = [k for k in kernels if k["rule"] == rule]
        if not mine:
            continue
        ms = sum(k["ms"] for k in mine)
        eg = ", ".join(_short(k["name"]) for k in mine[:shown]) + (", ..." if len(mine) > shown else "")
        parts.append(f"{len(mine)} kernel{'s' if len(mine) > 1 else ''} ({ms:,.1f} ms: {eg}) because {why}")
    return "communication is read from " + "; ".join(parts)


def _short(name: str, width: int = 60) -> str:
    """A kernel's name without its argument list, cut to ``width`` characters."""
    head = name.split("(", 1)[0] if not name.startswith("(") else name
    return head if len(head) <= width else head[:width - 3] + "..."


def _step_spans(path: Path, steps: _Events, lk: _Lookups) -> tuple[int, np.ndarray, np.ndarray, list[int], str]:
    """(training thread, step starts, step ends (int64 ns), step numbers, the marker read) from the spans that mark
    steps: the ``ProfilerStep#N`` spans (numbered N); where there are none, the spans of the most frequent
    ``Optimizer.step#<class>.step`` name (a step from the end of one to the end of the next), else the DataLoader's
    ``__next__`` spans (from the start of one to the start of the next); nested spans of the same name count once,
    and such steps are numbered 1, 2, ... in order. Raises :class:`TraceError` where no marker gives a step."""
    host = lk.step_cat[steps.cat]
    step_mask = lk.step[steps.name] & host
    if step_mask.any():
        thread = int(np.bincount(steps.thread[step_mask]).argmax())
        sidx = np.flatnonzero(step_mask & (steps.thread == thread))
        sidx = sidx[np.argsort(steps.ts[sidx], kind="stable")]
        numbers = [int(_STEP.fullmatch(steps.names[i]).group(1)) for i in steps.name[sidx]]
        return thread, steps.ts[sidx], steps.end[sidx], numbers, "ProfilerStep#N"
    is_opt = np.fromiter((_OPT_STEP.fullmatch(n) is not None for n in steps.names), bool, len(steps.names))
    for kind, by_name in (("optimizer", is_opt), ("data", lk.data)):
        mask = by_name[steps.name] & host
        if not mask.any():
            continue
        name = int(np.bincount(steps.name[mask]).argmax())  # one optimizer's spans: one per step
        mask &= steps.name == name
        thread = int(np.bincount(steps.thread[mask]).argmax())
        s, e = _union(steps.ts[mask & (steps.thread == thread)], steps.end[mask & (steps.thread == thread)])
        marker = steps.names[name]
        if len(s) < 2:
            raise TraceError(f"{path}: the trace has no ProfilerStep#N annotations and only one {marker} span, "
                             "which marks no whole step; record with schedule=torch.profiler.schedule(wait=1, "
                             "warmup=1, active=3) and call prof.step() once per training step")
        lo, hi = (e[:-1], e[1:]) if kind == "optimizer" else (s[:-1], s[1:])
        return thread, lo, hi, list(range(1, len(lo) + 1)), marker
    raise _no_steps(path)


def _host_copies(sums: _Sums, lk: _Lookups):
    """Union of the host copy spans of the batch on a CPU trace: the copy ops that are the step's direct children
    right after its last DataLoader span and before its first other child after it (None where no step has a
    DataLoader child)."""
    if not sums.children:
        return None
    kids = np.array(sorted(sums.children, key=lambda r: (r[0], r[1], r[1] - r[2])), np.int64)  # by start, longest first
    owner, ts, end, name = kids.T
    is_data, is_copy = lk.data[name], lk.copy[name]
    picked = np.zeros(len(kids), bool)
    for k in np.unique(owner).tolist():
        rows = np.flatnonzero(owner == k)
        data_rows = rows[is_data[rows]]
        if not len(data_rows):
            continue
        for r in rows[rows > data_rows[-1]].tolist():
            if not is_copy[r]:
                break
            picked[r] = True
    return _union(ts[picked], end[picked])


def _collectives(sums: _Sums, names: list[str], lo, hi, numbers) -> list[tuple[int, str, float]]:
    """(step number, name, duration in s) of each collective that starts inside a step, in order: the input of
    the arrival rule (:mod:`helpers.traces.arrival`)."""
    out = []
    for ts, nid, dur in sorted(sums.collectives, key=lambda c: c[0]):
        k = int(np.searchsorted(lo, ts, side="right")) - 1
        if k >= 0 and ts < hi[k]:
            out.append((numbers[k], names[nid], float(dur) / 1e9))
    return out


def _device_kind(names: list[str], cats: list[str], meta: dict, has_device: bool) -> str:
    """The device the trace recorded, named as it is: "cuda", "rocm", "mtia", "xpu", "npu", "privateuse1", or
    "cpu" when it recorded none."""
    cat_set = set(cats)
    if cat_set & {"mtia_ccp_events", "mtia_runtime"}:
        return "mtia"
    if not has_device:
        return "cpu"
    if "xpu_runtime" in cat_set:
        return "xpu"
    if cat_set & {"privateuse1_runtime", "privateuse1_driver"}:
        text = " ".join(n for n in names[:5000]).lower()
        return "npu" if ("acl" in text or "npu" in text) else "privateuse1"
    props = meta.get("deviceProperties")
    text = json.dumps(props, default=str).lower() if props else ""
    if any(w in text for w in ("amd", "radeon", "instinct", "gfx9")) or any(n.startswith("hip") for n in names):
        return "rocm"
    return "cuda"


def _top_ops(sums: _Sums, names: list[str]) -> tuple[dict[str, Any], ...]:
    out = []
    for i in np.flatnonzero(sums.calls).tolist():
        out.append({"name": names[i], "calls": int(sums.calls[i]), "self_ms": max(float(sums.self_ns[i]), 0.0) / 1e6,
                    "where": "device" if sums.device_names[i] else "host"})
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


def _provenance(path: Path, parser: Any, events: int, start_unix, step_thread: tuple[str, str]) -> dict[str, Any]:
    st = path.stat()
    meta = parser.meta
    out: dict[str, Any] = {
        "path": str(path), "bytes": st.st_size,
        "mtime": _dt.datetime.fromtimestamp(st.st_mtime, _dt.timezone.utc).isoformat(timespec="seconds"),
        "reader": "kineto", "gzip": parser.gz, "events": int(events),
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
    pid, tid = step_thread
    out["step_thread"] = f"pid {pid} tid {tid}"
    return out
