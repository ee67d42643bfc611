"""Host-to-device copies timed: each copy method's bandwidth per size, the host memcpy, one batch per method.

The copy methods themselves (``pageable``, ``pin_per_batch``, ``loader_pin_thread``, ``pinned_buffer``) are
:mod:`helpers.pipeline.transfer`; here they are timed: :func:`bandwidth_sweep` (each method at each size of
:func:`transfer_sizes`, and :data:`REFERENCE_METHOD`, a copy from memory pinned beforehand timed with device events:
the DMA's own rate), :func:`host_copy_sweep` (the host memcpy that pinning a batch costs at least),
:func:`batch_comparison` and :func:`job_batch_comparison` (one batch, each pinned method against pageable,
interleaved) and :func:`bandwidth_summary` (per method the peak and the rate at the largest size, each with its
cache regime, :func:`helpers.diagnose.pcie.size_regime`). Where pinning does not apply (a CPU) they report "not
applicable" instead of raising. Notebook 04's experiment, which runs them and decides, is
:mod:`helpers.experiments.pinning`. Bandwidth is in GB/s = 1e9 bytes per second (:data:`helpers.diagnose.pcie.GB`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd
import torch

from helpers.diagnose.pcie import GB, size_regime
from helpers.errors import DataError, ParameterError
from helpers.pipeline.transfer import (BATCH_METHODS, METHODS, batch_copy_method, batch_nbytes, copy_method,
                                      pinning_applicability)
from helpers.timing import compare, measure, measure_events

if TYPE_CHECKING:  # pragma: no cover - typing only
    from helpers.device import Accelerator
    from helpers.timing import Comparison

__all__ = ["REFERENCE_METHOD", "bandwidth_summary", "bandwidth_sweep", "batch_comparison", "host_copy_sweep",
           "job_batch_comparison", "method_label", "transfer_sizes"]

#: The DMA-only reference: a copy from memory pinned beforehand, timed with device events.
REFERENCE_METHOD = "pinned_copy_only"

_METHOD_LABELS = {
    "pageable": "pageable .to(device)",
    "pin_per_batch": "pin_memory() then copy, every batch",
    "loader_pin_thread": "DataLoader pin thread, then copy",
    "pinned_buffer": "reused pinned buffer",
    REFERENCE_METHOD: "pinned source, copy only (DMA rate)",
    "host_memcpy": "host memcpy (the cost of staging)",
}


def method_label(method: str) -> str:
    """Human-readable name of a copy method (for tables and legends)."""
    return _METHOD_LABELS.get(method, method)


# --------------------------------------------------------------------------- sizes


def transfer_sizes(min_size_kib: int, max_size_mib: int) -> list[int]:
    """Transfer sizes in bytes: powers of 2 from ``min_size_kib`` KiB to ``max_size_mib`` MiB.

    Parameters
    ----------
    min_size_kib : int
        Smallest size, KiB (1 KiB = 1024 bytes), >= 1; rounded up to a power of 2.
    max_size_mib : int
        Largest size, MiB (1 MiB = 2**20 bytes), >= 1; rounded down to a power of 2.

    Returns
    -------
    list of int
        Ascending, each a power of 2.

    Raises
    ------
    ParameterError
        If either bound is not a positive int, or the range is empty.
    """
    for name, v in (("min_size_kib", min_size_kib), ("max_size_mib", max_size_mib)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ParameterError(f"{name} must be a positive int, got {v!r}")
    lo = 1 << (int(min_size_kib * 1024) - 1).bit_length()
    hi = 1 << (int(max_size_mib * 2**20).bit_length() - 1)
    if lo > hi:
        raise ParameterError(
            f"min_size_kib={min_size_kib} KiB is above max_size_mib={max_size_mib} MiB: no size to test; "
            "lower min_size_kib or raise max_size_mib")
    sizes = []
    n = lo
    while n <= hi:
        sizes.append(n)
        n *= 2
    return sizes


# --------------------------------------------------------------------------- sweeps


def _sweep_row(method: str, nbytes: int, m, *, applicable: bool = True, reason: str = "") -> dict[str, Any]:
    if m is None:
        return {"method": method, "label": _METHOD_LABELS.get(method, method), "size_bytes": nbytes,
                "median_s": math.nan, "p25_s": math.nan, "p75_s": math.nan, "gbps": math.nan,
                "gbps_p25": math.nan, "gbps_p75": math.nan, "repeats": 0, "applicable": applicable,
                "reason": reason}
    return {"method": method, "label": _METHOD_LABELS.get(method, method), "size_bytes": nbytes,
            "median_s": m.median_s, "p25_s": m.p25_s, "p75_s": m.p75_s,
            "gbps": nbytes / m.median_s / GB if m.median_s > 0 else math.nan,
            "gbps_p25": nbytes / m.p75_s / GB if m.p75_s > 0 else math.nan,
            "gbps_p75": nbytes / m.p25_s / GB if m.p25_s > 0 else math.nan,
            "repeats": m.repeats, "applicable": applicable, "reason": reason}


def _random_host(nbytes: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.empty(nbytes, dtype=torch.uint8).random_(0, 256, generator=g)


def bandwidth_sweep(acc: "Accelerator", sizes: Sequence[int], *, methods: Sequence[str] = METHODS,
                    repeats: int = 10, warmup: int = 2, reference: bool = True, seed: int = 0,
                    progress: Callable[[str], None] | None = None) -> "pd.DataFrame":
    """Host-to-device bandwidth of each copy method at each size.

    Each (method, size) is timed with :func:`helpers.timing.measure`:
    ``warmup`` untimed copies, then ``repeats`` copies, each bracketed by a
    device synchronize, so the time covers everything the training thread
    waits for (pinning, staging memcpy, the DMA). The reference
    ``pinned_copy_only`` is timed with device events
    (:func:`helpers.timing.measure_events`): the DMA alone.

    Parameters
    ----------
    acc : helpers.device.Accelerator
    sizes : sequence of int
        Transfer sizes in bytes (see :func:`transfer_sizes`).
    methods : sequence of str
        Subset of :data:`helpers.pipeline.transfer.METHODS`.
    repeats, warmup : int
        Timed and untimed copies per method and size.
    reference : bool, default True
        Also time :data:`REFERENCE_METHOD`.
    seed : int
        Seed of the host data.
    progress : callable, optional
        Called with a short line per size (e.g. ``print``), for long sweeps.

    Returns
    -------
    pandas.DataFrame
        One row per method and size: ``method``, ``label``, ``size_bytes``,
        ``median_s``, ``p25_s``, ``p75_s`` (seconds per copy), ``gbps``
        (size / median time, GB/s = 1e9 bytes/s), ``gbps_p25``, ``gbps_p75``
        (the rate at the 75th and 25th percentile times), ``repeats``,
        ``applicable`` (bool) and ``reason``. Where pinning does not apply
        (a CPU), one row per method with ``applicable=False``, the reason, and
        NaN numbers; nothing raises.

    Raises
    ------
    ParameterError
        For an unknown method or an empty ``sizes``.
    """
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise ParameterError(f"unknown copy method(s) {bad}; choose from {', '.join(METHODS)}")
    if not sizes:
        raise ParameterError("sizes is empty: give at least one transfer size in bytes")
    app = pinning_applicability(acc)
    names = list(methods) + ([REFERENCE_METHOD] if reference else [])
    if not app.applicable:
        return pd.DataFrame([_sweep_row(m, 0, None, applicable=False, reason=app.reason) for m in names])
    rows = []
    for nbytes in sizes:
        host = _random_host(int(nbytes), seed)
        for method in methods:
            with copy_method(method, acc, host) as fn:
                m = measure(fn, repeats=repeats, warmup=warmup, sync=acc.synchronize, name=method,
                            items_per_call=nbytes)
            rows.append(_sweep_row(method, nbytes, m))
        if reference:
            pinned = host.pin_memory()
            dst = torch.empty(int(nbytes), dtype=torch.uint8, device=acc.device)
            m = measure_events(lambda: dst.copy_(pinned, non_blocking=True),
                               new_event=lambda: acc.new_event(enable_timing=True), sync=acc.synchronize,
                               repeats=repeats, warmup=warmup, name=REFERENCE_METHOD, items_per_call=nbytes)
            rows.append(_sweep_row(REFERENCE_METHOD, nbytes, m))
            del pinned, dst
        if progress is not None:
            done = [r for r in rows if r["size_bytes"] == nbytes]
            progress(f"{nbytes / 2**20:9.3f} MiB: " + ", ".join(f"{r['method']} {r['gbps']:.2f}" for r in done)
                     + " GB/s")
    return pd.DataFrame(rows)


def host_copy_sweep(sizes: Sequence[int], *, repeats: int = 10, warmup: int = 2, seed: int = 0) -> "pd.DataFrame":
    """Host memcpy bandwidth at each size: what staging into a pinned buffer costs at least.

    Runs on any machine (no device involved): ``dst.copy_(src)`` between two
    preallocated uint8 host tensors, timed with :func:`helpers.timing.measure`.
    Pinning a batch (``pin_memory()``, the loader's pin thread, a reused
    buffer) costs one such copy per batch on some host thread.

    Parameters
    ----------
    sizes : sequence of int
        Bytes.
    repeats, warmup, seed : int

    Returns
    -------
    pandas.DataFrame
        Same columns as :func:`bandwidth_sweep`, ``method="host_memcpy"``.
    """
    if not sizes:
        raise ParameterError("sizes is empty: give at least one transfer size in bytes")
    rows = []
    for nbytes in sizes:
        src = _random_host(int(nbytes), seed)
        dst = torch.empty_like(src)
        m = measure(lambda: dst.copy_(src), repeats=repeats, warmup=warmup, name="host_memcpy",
                    items_per_call=nbytes)
        if not torch.equal(dst, src):  # pragma: no cover - would be a torch bug
            raise DataError("host copy_ produced different bytes; the memory or torch is broken")
        rows.append(_sweep_row("host_memcpy", nbytes, m))
    return pd.DataFrame(rows)


def batch_comparison(acc: "Accelerator", shape: Sequence[int], *, methods: Sequence[str] = METHODS[1:],
                     repeats: int = 10, warmup: int = 2, seed: int = 0) -> dict[str, "Comparison"]:
    """Per-batch copy time of each pinned method against pageable, interleaved.

    For each method, :func:`helpers.timing.compare` times ``pageable`` (A)
    and the method (B) in the ABBA order in one run; the ratio is the
    speedup of B's copy rate over pageable's (> 1: the method is faster).

    Parameters
    ----------
    acc : helpers.device.Accelerator
    shape : sequence of int
        The batch, uint8; the workload's is ``(batch_size, image_size, image_size, 3)`` (NHWC).
    methods : sequence of str
        Methods compared with pageable (default: the three pinned ones).
    repeats, warmup, seed : int

    Returns
    -------
    dict
        ``{method: Comparison}`` (names ``"pageable"`` and the method); empty
        where pinning does not apply (a CPU).
    """
    if not pinning_applicability(acc).applicable:
        return {}
    shape = tuple(int(s) for s in shape)
    nbytes = math.prod(shape)
    host = _random_host(nbytes, seed).view(shape)
    out = {}
    with copy_method("pageable", acc, host) as pageable:
        for method in methods:
            with copy_method(method, acc, host) as fn:
                out[method] = compare(pageable, fn, repeats=repeats, warmup=warmup, sync=acc.synchronize,
                                      names=("pageable", method), items_per_call=nbytes, seed=seed)
    return out


def job_batch_comparison(acc: "Accelerator", batch: Any, to_device: Callable[..., Any], *,
                         methods: Sequence[str] = BATCH_METHODS[1:], repeats: int = 10, warmup: int = 2,
                         seed: int = 0) -> dict[str, "Comparison"]:
    """A user's job: its own host batch copied by each pinned method against pageable, interleaved.

    The same comparison as :func:`batch_comparison`, on the batch the job's dataset makes (any nesting of
    tensors) and through the job's own ``to_device``; the methods are those of
    :data:`helpers.pipeline.transfer.BATCH_METHODS` (a reused pinned buffer needs one flat tensor).

    Parameters
    ----------
    acc : helpers.device.Accelerator
    batch : nested host batch
        One batch from the job's dataset, on the CPU.
    to_device : callable
        ``to_device(batch, non_blocking=bool)``, e.g. ``lambda b, non_blocking: job.to_device(b, acc,
        non_blocking=non_blocking)``.
    methods : sequence of str
        Default: the two pinned methods.
    repeats, warmup, seed : int

    Returns
    -------
    dict
        ``{method: Comparison}``, ``items_per_call`` = the batch's bytes (:func:`batch_nbytes`); empty where
        pinning does not apply (a CPU).
    """
    if not pinning_applicability(acc).applicable:
        return {}
    nbytes = batch_nbytes(batch)
    out = {}
    with batch_copy_method("pageable", acc, batch, to_device) as pageable:
        for method in methods:
            with batch_copy_method(method, acc, batch, to_device) as fn:
                out[method] = compare(pageable, fn, repeats=repeats, warmup=warmup, sync=acc.synchronize,
                                      names=("pageable", method), items_per_call=nbytes, seed=seed)
    return out


def bandwidth_summary(table: "pd.DataFrame", *, cache_bytes: int | None = None) -> "pd.DataFrame":
    """Per method, the peak rate over sizes and the rate at the largest size, each with what it is.

    A host memcpy peaks at sizes that fit in the CPU's caches; at sizes well
    beyond the last-level cache it runs at the speed of main memory, which is
    what staging a real stream of batches pays. So the two are kept apart and
    each is labelled with :func:`helpers.diagnose.pcie.size_regime`.

    Parameters
    ----------
    table : pandas.DataFrame
        Rows of :func:`bandwidth_sweep` and/or :func:`host_copy_sweep`
        (``method``, ``size_bytes``, ``gbps``, ``gbps_p25``, ``gbps_p75``,
        ``repeats``); rows without a rate are ignored.
    cache_bytes : int, optional
        Last-level cache size (:func:`helpers.diagnose.pcie.last_level_cache_bytes`).

    Returns
    -------
    pandas.DataFrame
        One row per method, in the table's order: ``method``, ``label``, and
        for ``peak`` and ``largest``: ``{x}_gbps``, ``{x}_gbps_p25``,
        ``{x}_gbps_p75``, ``{x}_size_bytes``, ``{x}_repeats``, ``{x}_regime``.
    """
    rows = []
    data = table.dropna(subset=["gbps"])
    for method in dict.fromkeys(data["method"]):
        part = data[data["method"] == method]
        row: dict[str, Any] = {"method": method, "label": method_label(method)}
        chosen = (("peak", part.loc[part["gbps"].idxmax()]), ("largest", part.loc[part["size_bytes"].idxmax()]))
        for name, r in chosen:
            row.update({f"{name}_gbps": float(r["gbps"]), f"{name}_gbps_p25": float(r["gbps_p25"]),
                        f"{name}_gbps_p75": float(r["gbps_p75"]), f"{name}_size_bytes": int(r["size_bytes"]),
                        f"{name}_repeats": int(r["repeats"]),
                        f"{name}_regime": size_regime(int(r["size_bytes"]), cache_bytes)})
        rows.append(row)
    return pd.DataFrame(rows)
