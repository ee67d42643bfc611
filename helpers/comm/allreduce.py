"""Allreduce bandwidth the way nccl-tests measures it.

Definitions (nccl-tests ``doc/PERFORMANCE.md``,
https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md):
``algbw = S / t`` and, for AllReduce, ``busbw = algbw * 2(n-1)/n``, with S the
message size in bytes, t the time of one allreduce and n the number of ranks.
Bandwidths here are in GB/s (1e9 bytes per second), as in nccl-tests.

:func:`run_allreduce` runs inside a rank (see :mod:`helpers.comm.worker`), and
so does :func:`run_allreduce_sweep` (the same benchmark one size at a time,
each row handed over as it is measured: notebook 08's "try it" panel); the
other functions are plain arithmetic usable anywhere.

Timing method: each rank times every allreduce on its own clock (read before
the call, and after the call plus a device synchronize), with no barrier in
the timed loop. Rank 0 gathers the per-rank times after the loop and reports,
per size, the maximum over ranks of each rank's median time (the slowest rank
sets the pace of a collective), with the 25th and 75th percentiles taken the
same way (max over ranks of each rank's percentile). Sizes up to
``SMALL_BYTES`` get ``SMALL_REPEAT_FACTOR`` times more timed calls: they cost
well under a millisecond each, and on a loaded machine a scheduler pause of a
few milliseconds can otherwise move a median built from a handful of calls.

Bare-loop comparison (``overhead_vs_bare``): at the bare size, ``chunks``
rounds each hold one chunk of ``chunk_calls`` benchmark-style calls (a clock
read around each call) and one chunk of the bare loop, in alternating order
(benchmark first in even rounds, bare first in odd ones), (``all_reduce; sync``
repeated, one clock read around the chunk). Both sides are reduced the same
way: per rank, the median over rounds of the chunk's mean time per call; then
the maximum over ranks. ``overhead_vs_bare`` = bare busbw / benchmark busbw
of these two figures (the same statistic, measured interleaved).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from helpers.comm.launch import backend_device_kind, resolve_backend, run_job
from helpers.comm.rank import init_rank
from helpers.device import get_accelerator
from helpers.errors import ParameterError
from helpers.fsutil import write_atomic

MIB = 2**20
#: Size of the bare reference loop (issue 5: "overhead_vs_bare ... at 64 MiB").
BARE_BYTES = 64 * MIB
#: Target on overhead_vs_bare (issue 5, Performance).
OVERHEAD_TARGET = 1.10
#: Sizes up to this many bytes get SMALL_REPEAT_FACTOR x the timed calls (cheap: well under 1 ms per call).
SMALL_BYTES = 64 * 2**10
SMALL_REPEAT_FACTOR = 5
#: Rounds of the interleaved benchmark-vs-bare comparison.
BARE_CHUNKS = 5
OVERHEAD_STATISTIC = ("per rank, median over {chunks} interleaved rounds of the mean time per call of a chunk of "
                      "{calls} calls (benchmark chunk: clock read around each call; bare chunk: one clock read "
                      "around the chunk); then max over ranks")


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


def regimes(rows: Sequence[dict], *, fraction: float = 0.5, plateau_sizes: int = 3) -> dict[str, Any]:
    """Split a bandwidth curve into its latency-bound and bandwidth-bound parts, from the data.

    - small-message time: the median of the per-size median times of the
      smallest sizes (the first quarter of the sizes, at least one). It is a
      typical value, not a lower bound: single sizes can lie below it.
    - plateau: the median busbw of the ``plateau_sizes`` largest sizes (not the
      maximum, which a single lucky size can set).
    - crossover: the smallest size from which *every* size (it and all larger
      ones) stays at or above ``fraction`` of the plateau; the largest size if
      none qualifies before it.

    Returns
    -------
    dict
        ``small_time_s``, ``small_sizes`` (bytes of the sizes it was taken
        from), ``plateau_busbw_gbps``, ``plateau_bytes`` (sizes used),
        ``peak_busbw_gbps`` and ``peak_bytes`` (the single highest point, for
        reference), ``crossover_bytes``, ``fraction``.
    """
    if not rows:
        raise ParameterError("regimes() needs at least one result row.")
    rows = sorted(rows, key=lambda r: r["bytes"])
    k = max(1, len(rows) // 4)
    small = float(np.median([r["time_s"] for r in rows[:k]]))
    top = rows[-max(1, min(plateau_sizes, len(rows))):]
    plateau = float(np.median([r["busbw_gbps"] for r in top]))
    peak = max(rows, key=lambda r: r["busbw_gbps"])
    cross = rows[-1]["bytes"]
    for i in range(len(rows) - 1, -1, -1):  # walk down from the largest size while every size stays above
        if rows[i]["busbw_gbps"] >= fraction * plateau:
            cross = rows[i]["bytes"]
        else:
            break
    return {"small_time_s": small, "small_sizes": [r["bytes"] for r in rows[:k]],
            "plateau_busbw_gbps": plateau, "plateau_bytes": [r["bytes"] for r in top],
            "peak_busbw_gbps": peak["busbw_gbps"], "peak_bytes": peak["bytes"], "crossover_bytes": cross,
            "fraction": fraction}


#: Below this overhead_vs_bare the bare loop was slower than the benchmark itself: the comparison says nothing.
OVERHEAD_INCONCLUSIVE_BELOW = 0.90


def overhead_status(ratio: float | None) -> dict[str, Any]:
    """Judge ``overhead_vs_bare`` against its target.

    Returns
    -------
    dict
        ``met``: True for OVERHEAD_INCONCLUSIVE_BELOW (0.90) <= ratio <= OVERHEAD_TARGET (1.10), False above the
        target, None when the ratio is missing or below 0.90 (the bare loop was slower than the benchmark:
        noise, not a result); ``note``: a sentence saying which.
    """
    if ratio is None:
        return {"met": None, "note": "no bare-loop comparison was run"}
    if ratio < OVERHEAD_INCONCLUSIVE_BELOW:
        return {"met": None, "note": "inconclusive (the bare loop was slower than the benchmark: noise)"}
    if ratio <= OVERHEAD_TARGET:
        return {"met": True, "note": f"met (target <= {OVERHEAD_TARGET})"}
    return {"met": False, "note": f"not met: the benchmark's bookkeeping costs bandwidth (target <= {OVERHEAD_TARGET})"}


def flag_outliers(rows: Sequence[dict], *, spread_factor: float = 5.0, trend_factor: float = 2.0,
                  growth_from_bytes: int | None = None, min_growth: float = 1.1) -> list[dict[str, Any]]:
    """Flag the sizes of a bandwidth curve whose times do not look like a clean measurement.

    Three checks, at every size:

    - spread: the slowest rank's 75th percentile is above ``spread_factor`` x the median time;
    - off trend: the median time is more than ``trend_factor`` x above or below the geometric mean of its two
      neighbours' median times (the straight line between them on log-log axes; ends are not checked);
    - no growth: from ``growth_from_bytes`` on (the bandwidth-bound part, e.g. :func:`regimes`'s crossover;
      None: the largest half of the sizes), a size at least twice the previous one that took less than
      ``min_growth`` x its time (e.g. 64 and 128 MiB in the same time), which a bandwidth-bound transfer cannot do.

    Parameters
    ----------
    rows : sequence of dict
        :func:`summarize` rows (``bytes``, ``time_s``, ``time_p75_s``; seconds).

    Returns
    -------
    list of dict
        One per flagged size, in size order: ``bytes`` and ``reasons`` (list of sentences).
    """
    rows = sorted(rows, key=lambda r: r["bytes"])
    if growth_from_bytes is None and rows:
        growth_from_bytes = rows[len(rows) // 2]["bytes"]
    reasons: dict[int, list[str]] = {}
    for i, r in enumerate(rows):
        t = r["time_s"]
        if t > 0 and r["time_p75_s"] > spread_factor * t:
            reasons.setdefault(r["bytes"], []).append(
                f"75th percentile {r['time_p75_s'] * 1e6:.0f} us > {spread_factor:g}x the median {t * 1e6:.0f} us")
        if 0 < i < len(rows) - 1:
            trend = float(np.sqrt(rows[i - 1]["time_s"] * rows[i + 1]["time_s"]))
            if trend > 0 and not (trend / trend_factor <= t <= trend * trend_factor):
                reasons.setdefault(r["bytes"], []).append(
                    f"median {t * 1e6:.0f} us is off its neighbours' trend ({trend * 1e6:.0f} us)")
        if i > 0 and r["bytes"] >= 2 * rows[i - 1]["bytes"] and rows[i - 1]["bytes"] >= growth_from_bytes:
            prev = rows[i - 1]
            if t < min_growth * prev["time_s"]:
                reasons.setdefault(r["bytes"], []).append(
                    f"time does not grow with size: {prev['time_s'] * 1e3:.2f} ms at {prev['bytes']:,} B, "
                    f"{t * 1e3:.2f} ms at {r['bytes']:,} B")
    return [{"bytes": b, "reasons": reasons[b]} for b in sorted(reasons)]


def run_allreduce(*, rank: int, world_size: int, device: Any, sizes: Sequence[int], repeats: int, warmup: int,
                  sync: Callable[[], None], bare_bytes: int | None = BARE_BYTES,
                  bare_chunks: int = BARE_CHUNKS, chunk_calls: int | None = None) -> dict[str, Any] | None:
    """The allreduce benchmark on this rank (inside an initialized default process group).

    For each size: a float32 tensor filled with ``rank + 1`` is allreduced
    once and checked against ``n(n+1)/2`` (correctness), then zeroed (so the
    repeated sums stay exact and free of overflow), ``warmup`` untimed calls,
    then ``repeats`` timed calls (``SMALL_REPEAT_FACTOR`` times more for sizes
    up to ``SMALL_BYTES``), each ``all_reduce`` followed by ``sync()``.
    Right after the timed calls of size ``bare_bytes`` (which must be one of
    ``sizes``), ``bare_chunks`` interleaved rounds of a benchmark-style chunk
    and a bare chunk of ``chunk_calls`` calls each (default
    ``max(2, repeats // 2)``); see the module docstring.

    Returns
    -------
    dict or None
        On rank 0: ``{"sizes": [rows...], "bare": {...}, "overhead_vs_bare",
        "timing": str}``; None on the other ranks. ``bare`` holds ``bytes``,
        ``time_s`` / ``busbw_gbps`` (bare loop), ``bench_time_s`` /
        ``bench_busbw_gbps`` (benchmark-style chunks), ``chunks``,
        ``chunk_calls`` and ``statistic``.

    Raises
    ------
    RuntimeError
        An allreduced value is wrong (names the size and the values seen).
    """
    import torch
    import torch.distributed as dist

    if bare_bytes and bare_bytes not in sizes:
        raise ParameterError(f"bare_bytes={bare_bytes} must be one of the sizes (see bench_config).")
    calls = int(chunk_calls or max(2, repeats // 2))
    chunks = max(1, int(bare_chunks))
    bare_stat = None
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
        n_rep = repeats * (SMALL_REPEAT_FACTOR if nbytes <= SMALL_BYTES else 1)
        times = [0.0] * n_rep
        for i in range(n_rep):
            t0 = clock()
            dist.all_reduce(t)
            sync()
            times[i] = clock() - t0
        all_times.append(times)
        if nbytes == bare_bytes:  # benchmark-style and bare chunks, interleaved, on the same tensor
            bench_means, bare_means = [], []
            for j in range(chunks):
                for kind in (("bench", "bare") if j % 2 == 0 else ("bare", "bench")):  # alternate which goes first
                    if kind == "bench":
                        acc = 0.0
                        for _ in range(calls):
                            t0 = clock()
                            dist.all_reduce(t)
                            sync()
                            acc += clock() - t0
                        bench_means.append(acc / calls)
                    else:
                        t0 = clock()
                        for _ in range(calls):
                            dist.all_reduce(t)
                            sync()
                        bare_means.append((clock() - t0) / calls)
            bare_stat = {"bench": float(np.median(bench_means)), "bare": float(np.median(bare_means))}
        del t
    bare = None
    gathered: list = [None] * world_size
    dist.all_gather_object(gathered, {"times": all_times, "bare": bare_stat if bare_bytes else None})
    if rank != 0:
        return None
    rows = [summarize(nb, [g["times"][i] for g in gathered], world_size) for i, nb in enumerate(sizes)]
    for row, nb in zip(rows, sizes):
        row["repeats"] = repeats * (SMALL_REPEAT_FACTOR if nb <= SMALL_BYTES else 1)
    overhead = None
    if bare_bytes:
        bt = max(g["bare"]["bare"] for g in gathered)
        bench_t = max(g["bare"]["bench"] for g in gathered)
        bare = {"bytes": int(bare_bytes), "time_s": bt, "algbw_gbps": algbw_gbps(bare_bytes, bt),
                "busbw_gbps": busbw_gbps(bare_bytes, bt, world_size), "bench_time_s": bench_t,
                "bench_busbw_gbps": busbw_gbps(bare_bytes, bench_t, world_size), "chunks": chunks,
                "chunk_calls": calls, "statistic": OVERHEAD_STATISTIC.format(chunks=chunks, calls=calls)}
        overhead = bare["busbw_gbps"] / bare["bench_busbw_gbps"]
    return {"sizes": rows, "bare": bare, "overhead_vs_bare": overhead,
            "timing": f"per size: max over ranks of each rank's median time of all_reduce + device sync "
                      f"(each rank on its own clock, no barrier; {repeats} calls, x{SMALL_REPEAT_FACTOR} up to "
                      f"{SMALL_BYTES} bytes); overhead_vs_bare: bare busbw / benchmark busbw, both "
                      + (bare["statistic"] if bare else "not measured")}


def bench_config(*, min_bytes: int = 8, max_size_mib: float = 256, repeats: int = 10, warmup: int = 3,
                 factor: int = 2) -> dict[str, Any]:
    """The worker config of one allreduce benchmark: sizes (with the bare size among them), repeats, warm-up.

    The bare loop runs at 64 MiB, or at the largest size when that is smaller.

    Raises
    ------
    ParameterError
        Sizes, repeats or warm-up out of range (the message names the ``bench`` flags too).
    """
    if not max_size_mib > 0 or min_bytes < 4 or min_bytes > max_size_mib * MIB:
        raise ParameterError(f"need 4 <= min_bytes (--min-bytes) <= max_size_mib (--max-size-mib) in bytes; got "
                             f"min_bytes={min_bytes}, max_size_mib={max_size_mib}: raise --max-size-mib or lower "
                             "--min-bytes.")
    max_bytes = int(max_size_mib * MIB)
    sizes = message_sizes(min_bytes, max_bytes, factor)
    bare = min(BARE_BYTES, sizes[-1])
    if bare not in sizes:
        sizes = sorted(sizes + [bare])
    if repeats < 1 or warmup < 0:
        raise ParameterError(f"repeats={repeats} (--repeats) must be >= 1 and warmup={warmup} (--warmup) >= 0.")
    return {"sizes": sizes, "repeats": int(repeats), "warmup": int(warmup), "bare_bytes": bare}


def allreduce_benchmark(*, backend: str = "auto", world_size: int = 2, min_bytes: int = 8,
                        max_size_mib: float = 256, repeats: int = 10, warmup: int = 3, timeout_s: float = 300.0,
                        master_port: int = 0, device_kind: str | None = None,
                        log_dir: "str | None" = None) -> dict[str, Any]:
    """Run the allreduce benchmark in ``world_size`` child processes and return its JSON-able result.

    Returns
    -------
    dict
        ``backend``, ``world_size``, ``device``, ``sizes`` (rows of
        :func:`summarize`, plus ``repeats``), ``bare``, ``overhead_vs_bare``,
        ``overhead_statistic``, ``bare_busbw_gbps`` and ``bare_bytes`` (the
        bare loop's busbw and its size: 64 MiB, or the largest size when that
        is smaller, then with ``bare_note``), ``target`` and ``met``,
        ``timing`` and ``wall_s``. ``log_dir``: where the logs of a failed
        job are kept (see :func:`helpers.comm.launch.run_job`).

    Raises
    ------
    ParameterError, DeviceUnavailableError, TimeoutError, RuntimeError
        See :func:`helpers.comm.launch.run_job`.
    """

    cfg = bench_config(min_bytes=min_bytes, max_size_mib=max_size_mib, repeats=repeats, warmup=warmup)

    job = run_job("allreduce", cfg, world_size=world_size, backend=backend, device_kind=device_kind,
                  timeout_s=timeout_s, master_port=master_port, bytes_per_rank=2 * cfg["sizes"][-1],
                  log_dir=log_dir)
    return finish_result(job.data, backend=job.backend, world_size=job.world_size, wall_s=job.wall_s)


def finish_result(data: Mapping[str, Any], *, backend: str | None = None, world_size: int | None = None,
                  wall_s: float | None = None) -> dict[str, Any]:
    """Rank 0's raw result (:func:`run_allreduce`) with the job's ``backend``, ``world_size`` and ``device`` (when
    ``backend`` is given) and the target fields (shared by the launcher, the torchrun path and notebook 08)."""
    if backend is not None:
        data = {**data, "backend": backend, "world_size": world_size, "device": backend_device_kind(backend)}
    lead = ("backend", "world_size", "device")
    out = {k: data[k] for k in lead if k in data}
    out.update({k: v for k, v in data.items() if k not in lead})
    ov = out.get("overhead_vs_bare")
    bare = out.get("bare") or {}
    out["overhead_statistic"] = bare.get("statistic")
    out["bare_busbw_gbps"] = bare.get("busbw_gbps")
    out["bare_bytes"] = bare.get("bytes")
    if bare.get("bytes") is not None and bare["bytes"] != BARE_BYTES:
        out["bare_note"] = (f"bare loop at {bare['bytes'] / MIB:g} MiB, the largest size, not at 64 MiB "
                            "(--max-size-mib is below 64)")
    out["target"] = {"overhead_vs_bare": f"<= {OVERHEAD_TARGET}"}
    status = overhead_status(ov)
    out["met"] = {"overhead_vs_bare": status["met"]}
    out["overhead_note"] = status["note"]
    if wall_s is not None:
        out["wall_s"] = round(wall_s, 2)
    return out


def allreduce_in_launched_job(*, backend: str = "auto", min_bytes: int = 8, max_size_mib: float = 256,
                              repeats: int = 10, warmup: int = 3) -> dict[str, Any] | None:
    """Run the benchmark as one rank of a job that torchrun started (RANK, WORLD_SIZE, MASTER_ADDR set).

    This is the multi-node path: ``torchrun ... -m helpers bench allreduce``
    runs this in every rank; rank 0 returns the result, the others None.
    """

    if backend == "auto":
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
    return finish_result(data, backend=backend, world_size=rc.world_size, wall_s=time.perf_counter() - t0)


def launched_by_torchrun(environ: "dict[str, str] | None" = None) -> bool:
    """True when RANK, WORLD_SIZE and MASTER_ADDR are all set (this process is a rank of a torchrun job)."""
    import os

    env = os.environ if environ is None else environ
    return all(k in env for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))


def run_allreduce_sweep(cfg: Mapping[str, Any], rc) -> dict[str, Any] | None:
    """The allreduce benchmark one size at a time, each size's row written as soon as it is measured (in a rank).

    Each size runs :func:`helpers.comm.allreduce.run_allreduce` with ``sizes=[size]`` (its correctness check,
    warm-up and timed calls, the slowest rank's median; no bare-loop comparison), so a live sweep is timed
    exactly as notebook 08's table. Rank 0 writes each row to ``cfg["points_dir"]/<index>.json`` (written
    whole, then renamed) for the parent to read while the job runs. Before each size the ranks agree
    (an allreduce of a flag) on whether ``cfg["stop_file"]`` exists: then every rank stops before that size.

    Parameters
    ----------
    cfg : mapping
        ``sizes`` (bytes), ``repeats``, ``warmup``, ``points_dir``, ``stop_file``.
    rc : helpers.comm.rank.RankContext

    Returns
    -------
    dict or None
        On rank 0: ``sizes`` (the rows measured, as :func:`helpers.comm.allreduce.summarize` plus ``repeats``),
        ``stopped`` (bool) and ``world_size``; None on the other ranks.
    """
    import torch
    import torch.distributed as dist

    points, stop = Path(cfg["points_dir"]), Path(cfg["stop_file"])
    flag = torch.zeros(1, dtype=torch.float32, device=rc.device)
    rows, stopped = [], False
    for i, nbytes in enumerate(int(b) for b in cfg["sizes"]):
        flag.fill_(1.0 if rc.rank == 0 and stop.exists() else 0.0)
        dist.all_reduce(flag)  # rank 0's decision reaches every rank: all stop before the same size
        if float(flag.item()) > 0:
            stopped = True
            break
        out = run_allreduce(rank=rc.rank, world_size=rc.world_size, device=rc.device, sizes=[nbytes],
                            repeats=int(cfg["repeats"]), warmup=int(cfg["warmup"]), sync=rc.sync, bare_bytes=None)
        if out is not None:
            row = out["sizes"][0]
            rows.append(row)
            write_atomic(points / f"{i:05d}.json", json.dumps(row))
    if rc.rank != 0:
        return None
    return {"sizes": rows, "stopped": stopped, "world_size": rc.world_size}
