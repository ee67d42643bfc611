"""Allreduce bandwidth the way nccl-tests measures it.

Definitions (nccl-tests ``doc/PERFORMANCE.md``,
https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md):
``algbw = S / t`` and, for AllReduce, ``busbw = algbw * 2(n-1)/n``, with S the
message size in bytes, t the time of one allreduce and n the number of ranks.
Bandwidths here are in GB/s (1e9 bytes per second), as in nccl-tests.

:func:`run_allreduce` runs inside a rank (see :mod:`helpers.comm.worker`);
the other functions are plain arithmetic usable anywhere.

Timing method: each rank times every allreduce on its own clock (read before
the call, and after the call plus a device synchronize), with no barrier in
the timed loop. Rank 0 gathers the per-rank times after the loop and reports,
per size, the maximum over ranks of each rank's median time (the slowest rank
sets the pace of a collective), with the 25th and 75th percentiles taken the
same way (max over ranks of each rank's percentile).
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Sequence

import numpy as np

from helpers.errors import ParameterError

MIB = 2**20
#: Size of the bare reference loop (issue 5: "overhead_vs_bare ... at 64 MiB").
BARE_BYTES = 64 * MIB
#: Target on overhead_vs_bare (issue 5, Performance).
OVERHEAD_TARGET = 1.10


def bus_factor(world_size: int) -> float:
    """nccl-tests' AllReduce bus-bandwidth factor ``2(n-1)/n`` (1.0 for n=2, 1.5 for n=4, 1.75 for n=8)."""
    if not isinstance(world_size, int) or world_size < 1:
        raise ParameterError(f"world_size={world_size!r} must be an integer >= 1.")
    return 2.0 * (world_size - 1) / world_size


def algbw_gbps(nbytes: float, seconds: float) -> float:
    """Algorithm bandwidth ``nbytes / seconds`` in GB/s (1e9 B/s)."""
    if seconds <= 0:
        raise ParameterError(f"seconds={seconds!r} must be > 0 to compute a bandwidth.")
    return nbytes / seconds / 1e9


def busbw_gbps(nbytes: float, seconds: float, world_size: int) -> float:
    """Bus bandwidth ``algbw * 2(n-1)/n`` in GB/s (nccl-tests' AllReduce definition)."""
    return algbw_gbps(nbytes, seconds) * bus_factor(world_size)


def message_sizes(min_bytes: int, max_bytes: int, factor: int = 2) -> list[int]:
    """Message sizes in bytes from ``min_bytes`` multiplied by ``factor`` up to ``max_bytes`` (both included).

    Sizes are rounded up to whole float32 elements (multiples of 4 bytes);
    ``max_bytes`` is appended when the sequence does not land on it.

    Raises
    ------
    ParameterError
        ``min_bytes`` < 4, ``max_bytes`` < ``min_bytes`` or ``factor`` < 2.
    """
    if min_bytes < 4 or max_bytes < min_bytes or factor < 2:
        raise ParameterError(f"need 4 <= min_bytes <= max_bytes and factor >= 2; got min_bytes={min_bytes}, "
                             f"max_bytes={max_bytes}, factor={factor}.")
    sizes, s = [], int(min_bytes)
    while s <= max_bytes:
        sizes.append(4 * math.ceil(s / 4))
        s *= factor
    last = 4 * (max_bytes // 4)
    if sizes[-1] != last:
        sizes.append(last)
    return sorted(set(sizes))


def summarize(nbytes: int, times_by_rank: Sequence[Sequence[float]], world_size: int) -> dict[str, float]:
    """One result row from the per-rank timings of one size.

    Parameters
    ----------
    nbytes : int
        Message size, bytes.
    times_by_rank : sequence of sequences of float
        ``times_by_rank[r][i]``: seconds of iteration i on rank r.
    world_size : int

    Returns
    -------
    dict
        ``bytes``, ``time_s`` (max over ranks of each rank's median),
        ``time_p25_s``, ``time_p75_s``, ``algbw_gbps``, ``busbw_gbps``.
    """
    t = np.asarray(times_by_rank, dtype=float)
    med = float(np.median(t, axis=1).max())
    return {"bytes": int(nbytes), "time_s": med, "time_p25_s": float(np.percentile(t, 25, axis=1).max()),
            "time_p75_s": float(np.percentile(t, 75, axis=1).max()), "algbw_gbps": algbw_gbps(nbytes, med),
            "busbw_gbps": busbw_gbps(nbytes, med, world_size)}


def regimes(rows: Sequence[dict], *, fraction: float = 0.5) -> dict[str, Any]:
    """Split a bandwidth curve into its latency and bandwidth regimes, from the data.

    The latency floor is the median time of the smallest sizes (the first
    quarter, at least one); the bandwidth plateau is the largest busbw seen.
    The crossover is the first size whose busbw reaches ``fraction`` of the
    plateau.

    Returns
    -------
    dict
        ``latency_s``, ``peak_busbw_gbps``, ``peak_bytes``, ``crossover_bytes``.
    """
    if not rows:
        raise ParameterError("regimes() needs at least one result row.")
    rows = sorted(rows, key=lambda r: r["bytes"])
    k = max(1, len(rows) // 4)
    latency = float(np.median([r["time_s"] for r in rows[:k]]))
    peak = max(rows, key=lambda r: r["busbw_gbps"])
    cross = next((r["bytes"] for r in rows if r["busbw_gbps"] >= fraction * peak["busbw_gbps"]), peak["bytes"])
    return {"latency_s": latency, "peak_busbw_gbps": peak["busbw_gbps"], "peak_bytes": peak["bytes"],
            "crossover_bytes": cross}


def run_allreduce(*, rank: int, world_size: int, device: Any, sizes: Sequence[int], repeats: int, warmup: int,
                  sync: Callable[[], None], bare_bytes: int | None = BARE_BYTES,
                  bare_repeats: int | None = None) -> dict[str, Any] | None:
    """The allreduce benchmark on this rank (inside an initialized default process group).

    For each size: a float32 tensor filled with ``rank + 1`` is allreduced
    once and checked against ``n(n+1)/2`` (correctness), then zeroed (so the
    repeated sums stay exact and free of overflow), ``warmup`` untimed calls,
    then ``repeats`` timed calls, each ``all_reduce`` followed by ``sync()``.
    Right after the timed calls of size ``bare_bytes`` (which must be one of
    ``sizes``), the bare loop on the same tensor: ``for _ in range(R):
    all_reduce(t); sync()`` timed as a whole and divided by R (no per-call
    clock reads).

    Returns
    -------
    dict or None
        On rank 0: ``{"sizes": [rows...], "bare": {...}, "overhead_vs_bare",
        "timing": str}``; None on the other ranks.

    Raises
    ------
    RuntimeError
        An allreduced value is wrong (names the size and the values seen).
    """
    import torch
    import torch.distributed as dist

    if bare_bytes and bare_bytes not in sizes:
        raise ParameterError(f"bare_bytes={bare_bytes} must be one of the sizes (see bench_config).")
    reps = bare_repeats or repeats
    bare_time = None
    expected = world_size * (world_size + 1) / 2
    clock = time.perf_counter
    all_times: list[list[float]] = []
    for nbytes in sizes:
        t = torch.full((nbytes // 4,), float(rank + 1), dtype=torch.float32, device=device)
        dist.all_reduce(t)
        sync()
        lo, hi = float(t.min()), float(t.max())
        if lo != expected or hi != expected:
            raise RuntimeError(f"allreduce of {nbytes} bytes gave values in [{lo}, {hi}] on rank {rank}; "
                               f"expected all {expected}. The backend or the interconnect corrupts data.")
        t.zero_()
        for _ in range(warmup):
            dist.all_reduce(t)
        sync()
        times = [0.0] * repeats
        for i in range(repeats):
            t0 = clock()
            dist.all_reduce(t)
            sync()
            times[i] = clock() - t0
        all_times.append(times)
        if nbytes == bare_bytes:  # the bare loop, right after the same size, on the same tensor
            t0 = clock()
            for _ in range(reps):
                dist.all_reduce(t)
                sync()
            bare_time = (clock() - t0) / reps
        del t
    bare = None
    gathered: list = [None] * world_size
    dist.all_gather_object(gathered, {"times": all_times, "bare": bare_time if bare_bytes else None})
    if rank != 0:
        return None
    rows = [summarize(nb, [g["times"][i] for g in gathered], world_size) for i, nb in enumerate(sizes)]
    overhead = None
    if bare_bytes:
        bt = max(g["bare"] for g in gathered)
        bare = {"bytes": int(bare_bytes), "time_s": bt, "algbw_gbps": algbw_gbps(bare_bytes, bt),
                "busbw_gbps": busbw_gbps(bare_bytes, bt, world_size), "repeats": reps}
        # the benchmark's own figure at the same size, measured in this run
        at = [r for r in rows if r["bytes"] == bare_bytes]
        overhead = bare["busbw_gbps"] / at[0]["busbw_gbps"]
    return {"sizes": rows, "bare": bare, "overhead_vs_bare": overhead,
            "timing": "per size: max over ranks of each rank's median time of all_reduce + device sync "
                      "(each rank on its own clock, no barrier); bare: whole loop / repeats, max over ranks"}


def bench_config(*, min_bytes: int = 8, max_size_mib: float = 256, repeats: int = 10, warmup: int = 3,
                 factor: int = 2) -> dict[str, Any]:
    """The worker config of one allreduce benchmark: sizes (with the bare size among them), repeats, warm-up.

    The bare loop runs at 64 MiB, or at the largest size when that is smaller.
    """
    max_bytes = int(max_size_mib * MIB)
    sizes = message_sizes(min_bytes, max_bytes, factor)
    bare = min(BARE_BYTES, sizes[-1])
    if bare not in sizes:
        sizes = sorted(sizes + [bare])
    if repeats < 1 or warmup < 0:
        raise ParameterError(f"repeats={repeats} must be >= 1 and warmup={warmup} >= 0.")
    return {"sizes": sizes, "repeats": int(repeats), "warmup": int(warmup), "bare_bytes": bare}


def allreduce_benchmark(*, backend: str = "auto", world_size: int = 2, min_bytes: int = 8,
                        max_size_mib: float = 256, repeats: int = 10, warmup: int = 3, timeout_s: float = 300.0,
                        master_port: int = 0, device_kind: str | None = None) -> dict[str, Any]:
    """Run the allreduce benchmark in ``world_size`` child processes and return its JSON-able result.

    Returns
    -------
    dict
        ``backend``, ``world_size``, ``device``, ``sizes`` (rows of
        :func:`summarize`), ``bare``, ``overhead_vs_bare``,
        ``bare_busbw_gbps_64mib`` (the bare loop's busbw; at the largest size
        when that is under 64 MiB, see ``bare["bytes"]``), ``target`` and
        ``met``, ``timing`` and ``wall_s``.

    Raises
    ------
    ParameterError, DeviceUnavailableError, TimeoutError, RuntimeError
        See :func:`helpers.comm.launch.run_job`.
    """
    from helpers.comm.launch import run_job

    cfg = bench_config(min_bytes=min_bytes, max_size_mib=max_size_mib, repeats=repeats, warmup=warmup)
    from helpers.comm.launch import backend_device_kind

    job = run_job("allreduce", cfg, world_size=world_size, backend=backend, device_kind=device_kind,
                  timeout_s=timeout_s, master_port=master_port, bytes_per_rank=2 * cfg["sizes"][-1])
    data = dict(job.data)
    data.update(backend=job.backend, world_size=job.world_size, device=backend_device_kind(job.backend))
    return finish_result(data, wall_s=job.wall_s)


def finish_result(data: dict[str, Any], *, wall_s: float | None = None) -> dict[str, Any]:
    """Add the target fields to rank 0's raw result (shared by the launcher and the torchrun path)."""
    lead = ("backend", "world_size", "device")
    out = {k: data[k] for k in lead if k in data}
    out.update({k: v for k, v in data.items() if k not in lead})
    ov = out.get("overhead_vs_bare")
    out["bare_busbw_gbps_64mib"] = (out.get("bare") or {}).get("busbw_gbps")
    out["target"] = {"overhead_vs_bare": f"<= {OVERHEAD_TARGET}"}
    out["met"] = {"overhead_vs_bare": None if ov is None else bool(ov <= OVERHEAD_TARGET)}
    if wall_s is not None:
        out["wall_s"] = round(wall_s, 2)
    return out


def allreduce_in_launched_job(*, backend: str = "auto", min_bytes: int = 8, max_size_mib: float = 256,
                              repeats: int = 10, warmup: int = 3) -> dict[str, Any] | None:
    """Run the benchmark as one rank of a job that torchrun started (RANK, WORLD_SIZE, MASTER_ADDR set).

    This is the multi-node path: ``torchrun ... -m helpers bench allreduce``
    runs this in every rank; rank 0 returns the result, the others None.
    """
    from helpers.comm.launch import backend_device_kind, resolve_backend
    from helpers.comm.worker import init_rank

    if backend == "auto":
        from helpers.device import get_accelerator

        backend = resolve_backend("auto", get_accelerator("auto").kind)
    cfg = bench_config(min_bytes=min_bytes, max_size_mib=max_size_mib, repeats=repeats, warmup=warmup)
    import torch.distributed as dist

    rc = init_rank(backend)
    t0 = time.perf_counter()
    try:
        data = run_allreduce(rank=rc.rank, world_size=rc.world_size, device=rc.device, sizes=cfg["sizes"],
                             repeats=cfg["repeats"], warmup=cfg["warmup"], sync=rc.sync,
                             bare_bytes=cfg["bare_bytes"])
    finally:
        dist.destroy_process_group()
    if data is None:
        return None
    data.update(backend=backend, world_size=rc.world_size, device=backend_device_kind(backend))
    return finish_result(data, wall_s=time.perf_counter() - t0)


def launched_by_torchrun(environ: "dict[str, str] | None" = None) -> bool:
    """True when RANK, WORLD_SIZE and MASTER_ADDR are all set (this process is a rank of a torchrun job)."""
    import os

    env = os.environ if environ is None else environ
    return all(k in env for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))
