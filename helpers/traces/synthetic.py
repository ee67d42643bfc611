"""Write a Kineto-shaped trace of any size whose phases are known, for the trace reader's benchmark and tests.

:func:`write_synthetic_kineto` writes what torch.profiler's ``tensorboard_trace_handler`` writes for a training
loop (one ``ProfilerStep#N`` span per step holding the DataLoader's ``__next__``, the batch's ``aten::to`` with its
``cudaMemcpyAsync`` and ``Memcpy HtoD``, forward/backward ops each launching a kernel, a DDP bucket's
``record_param_comms`` with its NCCL kernel, ``Optimizer.step#`` and ``Optimizer.zero_grad#``), laid out as
torch 2.13 lays out its own trace (every key on its own line, the metadata before ``traceEvents``, ``traceName``
after it; ``layout="compact"`` writes one sorted-key ``json.dumps`` per event instead, which the reader's fast
path does not accept), step by step, so that a 1 GB trace takes a few MB of memory to write. Every interval is
an integer number of ns chosen here, and the phases the reader should find are computed from them with plain
Python interval arithmetic (independent of the reader's numpy code) and returned.
"""

from __future__ import annotations

import gzip as _gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers.errors import ParameterError

__all__ = ["StepTiming", "write_synthetic_kineto"]

#: Base of the trace's clock, ns (baseTimeNanoseconds): 2026-10-01, as a torch 2.13 trace here has it.
BASE_TIME_NS = 1_790_857_026_000_000_000


@dataclass(frozen=True)
class StepTiming:
    """The constructed times of one step, microseconds (the device windows as fractions of the step).

    step_us: ProfilerStep span; data_us: DataLoader ``__next__``; h2d_us: the batch's ``aten::to`` (a pageable copy,
    blocking); the computing kernels fill ``kernel_busy`` of each launch pitch from just after the copy to
    ``compute_end`` of the step; the NCCL kernel runs from ``comm_start`` to ``comm_end``; the optimizer from
    ``opt_start`` to ``opt_end`` (host span, its kernel 5 us later to the same end).
    """

    step_us: int = 100_000
    data_us: int = 20_000
    h2d_us: int = 3_000
    kernel_busy: float = 0.8
    compute_end: float = 0.75
    comm_start: float = 0.6
    comm_end: float = 0.8
    opt_start: float = 0.8
    opt_end: float = 0.9

    @classmethod
    def for_units(cls, units_per_step: int) -> "StepTiming":
        """The default proportions, with a step long enough for ``units_per_step`` host ops of 3 us (12 us each)."""
        step_us = max(cls.step_us, 12 * units_per_step)
        return cls(step_us=step_us, data_us=step_us // 5, h2d_us=step_us * 3 // 100)

    def host_pitch_ns(self, units_per_step: int) -> int:
        """Room for each forward/backward host op, ns."""
        f0 = 10_000 + self.data_us * 1000 + 10_000 + self.h2d_us * 1000 + 20_000
        return (int(self.comm_start * self.step_us * 1000) - f0) // units_per_step


def _length(intervals: list[tuple[int, int]], lo: int, hi: int) -> int:
    """Length of the union of ``intervals`` inside [lo, hi), plain Python."""
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted((max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + (cur_e - cur_s if cur_e is not None else 0)


def _us(ns: int) -> str:
    return f"{ns // 1000}.{ns % 1000:03d}"


class _Writer:
    def __init__(self, out, layout: str) -> None:
        self.out, self.layout, self.first, self.events = out, layout, True, 0

    def x(self, cat: str, name: str, pid: Any, tid: Any, ts: int, dur: int, args: dict | None = None) -> None:
        self.events += 1
        sep = "" if self.first else ","
        self.first = False
        if self.layout == "compact":
            ev = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts / 1000, "dur": dur / 1000}
            if args:
                ev["args"] = args
            self.out.write(sep + "\n" + json.dumps(ev, sort_keys=True, separators=(",", ":")))
            return
        a = ""
        if args:
            a = ',\n    "args": {\n      ' + ", ".join(f'"{k}": {json.dumps(v)}' for k, v in args.items()) + "\n    }"
        self.out.write(f'{sep}\n  {{\n    "ph": "X",\n    "cat": "{cat}",\n    "name": {json.dumps(name)},\n'
                       f'    "pid": {json.dumps(pid)},\n    "tid": {json.dumps(tid)},\n    "ts": {_us(ts)},\n'
                       f'    "dur": {_us(dur)}\n    {a}\n  }}')

    def flow(self, ph: str, fid: int, pid: Any, tid: Any, ts: int) -> None:
        self.events += 1
        sep = "" if self.first else ","
        self.first = False
        if self.layout == "compact":
            ev = {"ph": ph, "id": fid, "pid": pid, "tid": tid, "ts": ts / 1000, "cat": "ac2g", "name": "ac2g"}
            self.out.write(sep + "\n" + json.dumps(ev, sort_keys=True, separators=(",", ":")))
            return
        bp = ', "bp": "e"' if ph == "f" else ""
        self.out.write(f'{sep}\n  {{\n    "ph": "{ph}", "id": {fid}, "pid": {json.dumps(pid)}, '
                       f'"tid": {json.dumps(tid)}, "ts": {_us(ts)},\n    "cat": "ac2g", "name": "ac2g"{bp}\n  }}')


def write_synthetic_kineto(path, *, steps: int = 5, units_per_step: int = 20, size_mb: float | None = None,
                           device: str = "cuda", timing: StepTiming | None = None, rank: int | None = None,
                           world_size: int | None = None, layout: str = "torch", gzip: bool = False,
                           first_step: int = 10, start_ns: int = 5_327_121_062_000_000) -> dict[str, Any]:
    """Write a synthetic Kineto trace to ``path`` and return the phases it was built with.

    Parameters
    ----------
    path : str or pathlib.Path
        The file (``.pt.trace.json``, or ``.pt.trace.json.gz`` with ``gzip=True``).
    steps : int
        ProfilerStep spans, numbered from ``first_step``.
    units_per_step : int
        Forward/backward ops per step, each a host ``aten::addmm`` with its ``cudaLaunchKernel``, a kernel and an
        ``ac2g`` flow pair on CUDA (one ``aten::mul`` on CPU). Ignored when ``size_mb`` is given.
    size_mb : float, optional
        Aim at this many MB (1e6 bytes) of uncompressed JSON by choosing ``units_per_step``.
    device : str
        "cuda" (kernels, memcpy, NCCL, deviceProperties) or "cpu" (host ops only).
    timing : StepTiming, optional
        The step's constructed times (default: :meth:`StepTiming.for_units` of the ops per step).
    rank, world_size : int, optional
        Written as ``distributedInfo`` (backend nccl on CUDA, gloo on CPU) when both are given.
    layout : str
        "torch" (torch 2.13's own layout) or "compact" (one sorted-key line per event).
    gzip : bool
        Gzip the file while writing it.
    first_step : int
        Number of the first step.
    start_ns : int
        The first step's start on the trace's clock, ns.

    Returns
    -------
    dict
        ``path``, ``bytes`` (the file), ``json_bytes`` (uncompressed), ``events``, ``units_per_step``, and
        ``expected``: one dict per step with ``step``, ``step_s``, ``data``, ``h2d``, ``optimizer`` and, on CUDA,
        ``compute``, ``comm``, ``comm_exposed``, ``idle`` (seconds).

    Raises
    ------
    ParameterError
        For steps < 1, units_per_step < 1, a device other than cpu/cuda, an unknown layout, or a timing whose
        windows do not fit in the step.
    """
    if steps < 1 or units_per_step < 1:
        raise ParameterError(f"steps and units_per_step must be >= 1, got {steps}, {units_per_step}")
    if device not in ("cpu", "cuda"):
        raise ParameterError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if layout not in ("torch", "compact"):
        raise ParameterError(f"layout must be 'torch' or 'compact', got {layout!r}")
    if size_mb is not None:
        units_per_step = max(1, int(size_mb * 1e6 / steps / _unit_bytes(device, layout)))
    t = timing if timing is not None else StepTiming.for_units(units_per_step)
    if not (t.data_us + t.h2d_us + 100 < t.comm_start * t.step_us < t.compute_end * t.step_us
            <= t.comm_end * t.step_us <= t.opt_start * t.step_us < t.opt_end * t.step_us < 0.95 * t.step_us):
        raise ParameterError(f"timing {t} does not fit: data + h2d < comm_start < compute_end <= comm_end <= "
                             "opt_start < opt_end < 0.95 of the step")
    if t.host_pitch_ns(units_per_step) < 4_000:
        raise ParameterError(f"{units_per_step} ops per step do not fit in a {t.step_us} us step (each needs 4 us); "
                             f"use timing=StepTiming.for_units({units_per_step}) or more steps")
    p = Path(path)
    opener = (lambda: _gzip.open(p, "wt", encoding="utf-8", compresslevel=1)) if gzip else (
        lambda: open(p, "w", encoding="utf-8"))
    pid, tid = 4601, 4601
    expected = []
    with opener() as out:
        _header(out, device, rank, world_size, p)
        w = _Writer(out, layout)
        corr = 1000
        for k in range(steps):
            t0 = start_ns + k * t.step_us * 1000
            corr, exp = _step(w, k + first_step, t0, t, units_per_step, device, pid, tid, corr)
            expected.append(exp)
        end = start_ns + steps * t.step_us * 1000
        out.write(f',\n  {{\n    "ph": "i",\n    \n    "s": "g",\n    "name": "Record Window End",\n'
                  f'    "pid": "",\n    "tid": "",\n    "ts": {_us(end + 1000)}\n    \n  }}\n  ],')
        out.write(f'"traceName": {json.dumps(str(p))} }}')
        w.events += 1
    json_bytes = p.stat().st_size if not gzip else None
    return {"path": str(p), "bytes": p.stat().st_size, "json_bytes": json_bytes, "events": w.events,
            "units_per_step": units_per_step, "expected": expected}


def _unit_bytes(device: str, layout: str) -> float:
    import io

    buf = io.StringIO()
    w = _Writer(buf, layout)
    w.first = False
    _unit(w, device, 4601, 4601, 5_327_121_062_000_000, 7_000, 5_327_121_062_500_000, 5_600, 123456)
    return len(buf.getvalue())


def _header(out, device: str, rank, world_size, path: Path) -> None:
    props = ""
    if device == "cuda":
        props = ('\n      {\n      "id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150109880320,\n'
                 '      "computeMajor": 9, "computeMinor": 0,\n      "maxThreadsPerBlock": 1024, '
                 '"maxThreadsPerMultiprocessor": 2048,\n      "regsPerBlock": 65536, "warpSize": 32,\n'
                 '      "sharedMemPerBlock": 49152, "numSms": 132\n    }')
    out.write(f' {{\n    "schemaVersion": 1,\n    "deviceProperties": [{props}\n    ],\n    \n')
    out.write('      "trace_id": "5F8EC04BDD6B4215B53A041E1A5C6035",\n')
    if rank is not None and world_size is not None:
        backend = "nccl" if device == "cuda" else "gloo"
        info = {"backend": backend, "rank": rank, "world_size": world_size, "pg_count": 1,
                "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": f"cuda:{backend}",
                               "pg_size": world_size, "ranks": list(range(world_size))}]}
        out.write(f'      "distributedInfo": {json.dumps(info)},\n')
    out.write(f'      "host_name": "synthetic",\n    "displayTimeUnit": "ms",\n'
              f'    "baseTimeNanoseconds": {BASE_TIME_NS},\n    "traceEvents": [\n    ')


_KERNEL = "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(Params)"
_KERNEL_ARGS = {"queued": 0, "device": 0, "context": 1, "stream": 7, "registers per thread": 232,
                "shared memory": 73728, "blocks per SM": 0.5, "warps per SM": 4.0, "grid": [66, 1, 1],
                "block": [128, 1, 1], "est. achieved occupancy %": 6}
# One forward/backward op on CUDA in torch 2.13's layout, written with one format call (the writer's speed).
_UNIT_CUDA = (
    ',\n  {{\n    "ph": "X",\n    "cat": "cpu_op",\n    "name": "aten::addmm",\n    "pid": {pid},\n'
    '    "tid": {tid},\n    "ts": {h},\n    "dur": {hd}\n    ,\n    "args": {{\n      "External id": {c}, '
    '"Record function id": 0, "Sequence number": 12, "Fwd thread id": 0\n    }}\n  }}'
    ',\n  {{\n    "ph": "X",\n    "cat": "cuda_runtime",\n    "name": "cudaLaunchKernel",\n    "pid": {pid},\n'
    '    "tid": {tid},\n    "ts": {l},\n    "dur": {ld}\n    ,\n    "args": {{\n      "External id": {c}, '
    '"cbid": 211, "correlation": {c}\n    }}\n  }}'
    ',\n  {{\n    "ph": "s", "id": {c}, "pid": {pid}, "tid": {tid}, "ts": {l},\n    "cat": "ac2g", "name": "ac2g"\n  }}'
    ',\n  {{\n    "ph": "X",\n    "cat": "kernel",\n    "name": "' + _KERNEL + '",\n    "pid": 0,\n'
    '    "tid": 7,\n    "ts": {k},\n    "dur": {kd}\n    ,\n    "args": {{\n      "External id": {c}, '
    + ", ".join(f'"{k}": {json.dumps(v)}' for k, v in _KERNEL_ARGS.items()).replace("{", "{{").replace("}", "}}")
    + ', "correlation": {c}\n    }}\n  }}'
    ',\n  {{\n    "ph": "f", "id": {c}, "pid": 0, "tid": 7, "ts": {k},\n    "cat": "ac2g", "name": "ac2g", '
    '"bp": "e"\n  }}')


def _unit(w: _Writer, device: str, pid, tid, host_ts: int, host_dur: int, dev_ts: int, dev_dur: int,
          corr: int) -> None:
    """One forward/backward op: host op (+ launch, kernel and flow on CUDA)."""
    if device == "cpu":
        w.x("cpu_op", "aten::mul", pid, tid, host_ts, host_dur, {"External id": corr, "Record function id": 0})
        return
    if w.layout == "torch" and not w.first:
        w.out.write(_UNIT_CUDA.format(pid=pid, tid=tid, h=_us(host_ts), hd=_us(host_dur), l=_us(host_ts + 1000),
                                      ld=_us(host_dur - 2000), k=_us(dev_ts), kd=_us(dev_dur), c=corr))
        w.events += 5
        return
    w.x("cpu_op", "aten::addmm", pid, tid, host_ts, host_dur, {"External id": corr, "Record function id": 0,
                                                                "Sequence number": 12, "Fwd thread id": 0})
    w.x("cuda_runtime", "cudaLaunchKernel", pid, tid, host_ts + 1000, host_dur - 2000,
        {"External id": corr, "cbid": 211, "correlation": corr})
    w.flow("s", corr, pid, tid, host_ts + 1000)
    w.x("kernel", _KERNEL, 0, 7, dev_ts, dev_dur, {"External id": corr, **_KERNEL_ARGS, "correlation": corr})
    w.flow("f", corr, 0, 7, dev_ts)


def _step(w: _Writer, number: int, t0: int, t: StepTiming, units: int, device: str, pid, tid, corr: int):
    """Write one step; return the next correlation id and the step's expected phases (seconds)."""
    T = t.step_us * 1000
    D, H = t.data_us * 1000, t.h2d_us * 1000
    cuda = device == "cuda"
    w.x("user_annotation", f"ProfilerStep#{number}", pid, tid, t0, T, {"External id": corr, "Record function id": 0})
    d0 = t0 + 10_000
    w.x("user_annotation", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", pid, tid, d0, D,
        {"External id": corr + 1, "Record function id": 0})
    for i in range(8):  # the batch's collate: nested ops inside __next__
        w.x("cpu_op", "aten::stack", pid, tid, d0 + (i + 1) * D // 10, D // 20, {"External id": corr + 2 + i})
    a0 = d0 + D + 10_000
    w.x("cpu_op", "aten::to", pid, tid, a0, H, {"External id": corr + 10, "Record function id": 0})
    w.x("cpu_op", "aten::_to_copy", pid, tid, a0 + 1_000, H - 2_000, {"External id": corr + 11})
    w.x("cpu_op", "aten::copy_", pid, tid, a0 + 2_000, H - 4_000, {"External id": corr + 12})
    dev: list[tuple[int, int]] = []
    comp: list[tuple[int, int]] = []
    comm: list[tuple[int, int]] = []
    if cuda:
        w.x("cuda_runtime", "cudaMemcpyAsync", pid, tid, a0 + 3_000, H - 6_000,
            {"External id": corr + 12, "cbid": 41, "correlation": corr + 13})
        m0, m1 = a0 + 5_000, a0 + H - 8_000
        w.x("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 0, 7, m0, m1 - m0,
            {"External id": corr + 12, "device": 0, "context": 1, "stream": 7, "correlation": corr + 13,
             "bytes": 6291456, "memory bandwidth (GB/s)": 2.5})
        dev.append((m0, m1))
    # forward/backward: host ops in [f0, comm_start), kernels in [f0 + 20 us, compute_end)
    f0 = a0 + H + 20_000
    host_end = t0 + int(t.comm_start * T)
    dev_lo, dev_hi = f0 + 20_000, t0 + int(t.compute_end * T)
    hp = (host_end - f0) // units
    dp = (dev_hi - dev_lo) // units
    corr += 20
    host_ops: list[tuple[int, int]] = []
    for i in range(units):
        ks = dev_lo + i * dp
        kd = int(dp * t.kernel_busy)
        _unit(w, device, pid, tid, f0 + i * hp, max(hp - 1_000, 3_000), ks, kd, corr)
        host_ops.append((f0 + i * hp, f0 + i * hp + max(hp - 1_000, 3_000)))
        comp.append((ks, ks + kd))
        corr += 1
    c0, c1 = t0 + int(t.comm_start * T), t0 + int(t.comm_end * T)
    if cuda:
        w.x("cpu_op", "record_param_comms", pid, tid, c0 + 10_000, 20_000,
            {"External id": corr, "Collective name": "allreduce", "dtype": "Float", "In msg nelems": 1048576,
             "Out msg nelems": 1048576, "Group size": 2})
        w.x("cuda_runtime", "cudaLaunchKernel", pid, tid, c0 + 12_000, 10_000,
            {"External id": corr, "cbid": 211, "correlation": corr})
        w.x("kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", 0, 20,
            c0, c1 - c0, {"External id": corr, "device": 0, "context": 1, "stream": 20, "correlation": corr})
        comm.append((c0, c1))
        corr += 1
    o0, o1 = t0 + int(t.opt_start * T), t0 + int(t.opt_end * T)
    w.x("user_annotation", "Optimizer.step#AdamW.step", pid, tid, o0, o1 - o0, {"External id": corr})
    w.x("cpu_op", "aten::_foreach_add_", pid, tid, o0 + 1_000, o1 - o0 - 2_000, {"External id": corr + 1})
    if cuda:
        w.x("cuda_runtime", "cudaLaunchKernel", pid, tid, o0 + 2_000, 5_000,
            {"External id": corr + 1, "cbid": 211, "correlation": corr + 1})
        w.x("kernel", "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<...>", 0, 7,
            o0 + 5_000, o1 - o0 - 5_000, {"External id": corr + 1, "device": 0, "stream": 7,
                                          "correlation": corr + 1})
        comp.append((o0 + 5_000, o1))
    z0 = o1 + 10_000
    w.x("user_annotation", "Optimizer.zero_grad#AdamW.zero_grad", pid, tid, z0, 40_000, {"External id": corr + 2})
    corr += 3
    lo, hi = t0, t0 + T
    exp: dict[str, Any] = {"step": number, "step_s": T / 1e9, "data": D / 1e9, "h2d": H / 1e9,
                           "optimizer": (_length([(o0, o1), (z0, z0 + 40_000)], lo, hi)) / 1e9}
    if cuda:
        busy = _length(dev + comp + comm, lo, hi)
        c = _length(comp, lo, hi)
        work = _length(comm + comp, lo, hi)
        # h2d: the device's copy time not under a kernel (the host's wait in the copy is not the copy)
        exp.update(compute=c / 1e9, comm=_length(comm, lo, hi) / 1e9, h2d=(busy - work) / 1e9,
                   comm_exposed=(work - c) / 1e9, idle=(T - busy) / 1e9)
    else:
        # a CPU trace: compute is the thread's operators outside data and copy, the rest of the step unattributed
        work = host_ops + [(o0, o1), (z0, z0 + 40_000)]
        busy = _length(work + [(d0, d0 + D), (a0, a0 + H)], lo, hi)
        exp.update(compute=_length(work, lo, hi) / 1e9, other=(T - busy) / 1e9)
    return corr, exp
