"""Hide the input behind compute: a side-stream prefetcher and the overlap metric.

:class:`DevicePrefetcher` copies batch k+1 to the device on one side stream
while step k computes on the consumer (current) stream. Side-stream
prefetchers are easy to get subtly wrong
(huggingface/pytorch-image-models#2781):

- using a batch before its copy has finished (no ``wait_stream``): the step
  reads memory the DMA is still writing;
- freeing a batch without ``record_stream``: the caching allocator only knows
  the stream a block was allocated on (the side stream), so once the tensor
  is freed it may hand the memory to the next copy while the consumer's
  kernels still read it;
- creating a new stream every epoch (streams are a finite device resource and
  each one adds a pool to the allocator).

This prefetcher is correct by construction: ONE side stream per prefetcher,
created in ``__init__`` and reused for every epoch; before each copy the side
stream waits for the consumer stream (so the copy never reads a tensor the
consumer is still producing); before a batch is handed out the consumer
stream waits for the side stream (its copy is complete before any kernel of
the step runs) and every device tensor of the batch is marked with
``record_stream(consumer)``; device events time each copy. Where the device
has no streams (a CPU) it degrades to a synchronous transfer with the same
interface: on a CPU the overlap comes from DataLoader worker processes
instead.

The overlap metric (:func:`overlap_stats`): *input work* is what the
pipeline spent producing a batch (``prep_s`` of the host batch: decode,
augment, tokenize, collate, wherever it ran) plus its copy; *exposed input* is
what the training loop waited for it (the ``data`` + ``h2d`` phases of
:func:`helpers.compute.train.train`). Each is summarized by its median over
the measured steps; the hidden fraction is ``1 - exposed / work`` and the
exposed fraction ``exposed / step time``, both ratios of those medians.
:func:`overlap_limits` says why an overlap could not work when it did not.
"""

from __future__ import annotations

import collections
import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from helpers.errors import DataError, ParameterError
from helpers.verdict import Action

if TYPE_CHECKING:  # pragma: no cover - typing only
    from pathlib import Path

    import pandas as pd
    import torch

    from helpers.device import Accelerator

logger = logging.getLogger(__name__)

__all__ = [
    "DevicePrefetcher",
    "prefetched",
    "verify_prefetcher",
    "RecordingLoader",
    "ConsumerStreamSync",
    "OverlapStats",
    "input_work_per_step",
    "overlap_stats",
    "timeline_frame",
    "choose_threads",
    "thread_splits",
    "fastest",
    "compute_thread_scaling",
    "OverlapRun",
    "run_overlap_variant",
    "baseline_workload",
    "overlap_limits",
    "overlap_verdict",
    "overlap_bench",
]

#: Keys of a host batch that are tensors to copy (the shared fast batch format).
_TENSOR_KEYS = ("image", "tokens", "label")
#: Keys of a host batch with per-batch metadata, passed through unchanged.
_META_KEYS = ("prep_start_s", "prep_end_s", "prep_s", "worker", "skipped")


# --------------------------------------------------------------------------- stream primitives
# Module-level so that the tests can replace them with fakes that record the calls.


def _current_stream(acc: "Accelerator"):
    """The stream the consumer (the training step) runs on: ``torch.accelerator.current_stream``."""
    import torch

    return torch.accelerator.current_stream(acc.index)


def _record_stream(tensor: "torch.Tensor", stream) -> None:
    """``tensor.record_stream(stream)``: tell the caching allocator the tensor is used on ``stream``."""
    tensor.record_stream(stream)


def _device_tensors(out: Any) -> list:
    """The tensors in a transfer's result (a tensor, or a tuple/list/dict of them)."""
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for v in out.values() for t in _device_tensors(v)]
    if isinstance(out, (tuple, list)):
        return [t for v in out for t in _device_tensors(v)]
    return []


def _default_transfer(batch: dict, acc: "Accelerator", *, non_blocking: bool = False):
    """``helpers.pipeline.fast.to_device_batch`` (the fast uint8 NHWC batch), imported on first use."""
    from helpers.pipeline.fast import to_device_batch

    return to_device_batch(batch, acc, non_blocking=non_blocking)


def prefetched(batch: dict, acc: "Accelerator" = None, *, non_blocking: bool = False):
    """The ``transfer`` for :func:`helpers.compute.train.train` when the loader is a :class:`DevicePrefetcher`.

    The prefetcher has already copied the batch; this returns its device
    tensors, so the *h2d* phase only measures what is left (nothing).

    Parameters
    ----------
    batch : dict
        An item of :class:`DevicePrefetcher` (key ``"device"``).
    acc, non_blocking
        Ignored (the signature of a ``transfer``).

    Returns
    -------
    tuple
        ``batch["device"]``, e.g. ``(images, tokens, labels)``.

    Raises
    ------
    ParameterError
        If the batch did not come from a prefetcher.
    """
    try:
        return batch["device"]
    except (KeyError, TypeError):
        raise ParameterError(
            "prefetched() got a batch without a 'device' entry: use it as train(..., transfer=prefetched) "
            "only when the loader is a DevicePrefetcher") from None


# --------------------------------------------------------------------------- the prefetcher


@dataclass(frozen=True)
class _Pending:
    index: int
    epoch: int
    device: Any
    meta: dict
    start: Any  # device event or None
    end: Any  # device event or None
    host_start_s: float
    host_end_s: float


@dataclass(frozen=True)
class _CopyRecord:
    """The timing of one copy; holds no tensor, so the log never keeps a batch alive."""

    index: int
    epoch: int
    start: Any
    end: Any
    host_start_s: float
    host_end_s: float


#: Copies remembered for :meth:`DevicePrefetcher.copy_frame` (the oldest are dropped beyond this).
COPY_LOG_SIZE = 100_000


class DevicePrefetcher:
    """Iterate a loader with each batch's host-to-device copy one step ahead, on a side stream.

    Parameters
    ----------
    loader : iterable of dict
        Host batches in the fast format (``image`` uint8 (B, S, S, 3), pinned
        where the device supports it; ``tokens``, ``label``; metadata
        ``prep_start_s``, ``prep_end_s``, ``prep_s``, ``worker``, ``skipped``).
        Iterated once per epoch (each ``iter(prefetcher)``).
    acc : helpers.device.Accelerator
    transfer : callable, optional
        ``transfer(batch, acc, non_blocking=...) -> tensors on the device``,
        e.g. :func:`helpers.pipeline.fast.to_device_batch` (the default):
        copy, then convert and normalize on the device. Everything it
        launches runs on the side stream.
    non_blocking : bool, default True
        Passed to ``transfer``; asynchronous only from pinned memory.
    time_copies : bool, default True
        Record a pair of timing events around every copy (device time).

    Attributes
    ----------
    stream : torch.Stream or None
        The one side stream (None where the device has no streams).
    streams_created : int
        Side streams this prefetcher created (1 on a device with streams,
        0 on a CPU, whatever the number of epochs).

    Notes
    -----
    Each item is a dict: ``device`` (what ``transfer`` returned, e.g.
    ``(images, tokens, labels)``), ``index`` (batches handed out so far by
    this prefetcher, from 0), ``epoch``, and the host batch's metadata keys.
    Pass ``transfer=prefetched`` to :func:`helpers.compute.train.train`.

    Raises
    ------
    ParameterError
        If ``transfer`` is not callable.
    """

    def __init__(self, loader: Iterable, acc: "Accelerator", *, transfer: Callable[..., Any] | None = None,
                 non_blocking: bool = True, time_copies: bool = True) -> None:
        if transfer is not None and not callable(transfer):
            raise ParameterError(f"transfer must be a callable (batch, acc, non_blocking=...) -> tensors, "
                                 f"got {transfer!r}")
        self.loader = loader
        self.acc = acc
        self.transfer = transfer or _default_transfer
        self.non_blocking = bool(non_blocking)
        self.time_copies = bool(time_copies)
        self.stream = acc.new_stream() if acc.capabilities.streams.available else None
        self.streams_created = 0 if self.stream is None else 1
        self._epoch = 0
        self._handed_out = 0
        self._issued = 0
        self._copies: collections.deque[_CopyRecord] = collections.deque(maxlen=COPY_LOG_SIZE)
        self._origin = None  # (host perf_counter s, device event) pair for aligning events to host time

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return (f"DevicePrefetcher(device={self.acc.device}, side_stream={'yes' if self.stream else 'none'}, "
                f"handed_out={self._handed_out})")

    @property
    def uses_side_stream(self) -> bool:
        """True when copies run on a side stream (a device with streams)."""
        return self.stream is not None

    def _new_event(self, timing: bool):
        return self.acc.new_event(enable_timing=timing) if self.stream is not None else None

    def _issue(self, host: dict, index: int, epoch: int) -> _Pending:
        """Launch the transfer of one host batch (on the side stream where there is one)."""
        meta = {k: host[k] for k in _META_KEYS if isinstance(host, dict) and k in host}
        t0 = time.perf_counter()
        if self.stream is None:
            device = self.transfer(host, self.acc, non_blocking=False)
            t1 = time.perf_counter()
            return _Pending(index, epoch, device, meta, None, None, t0, t1)
        consumer = _current_stream(self.acc)
        # The copy must not read anything the consumer is still producing (e.g. constants of the transfer).
        self.stream.wait_stream(consumer)
        start = self._new_event(True) if self.time_copies else None
        end = self._new_event(True) if self.time_copies else None
        with self.stream:
            if start is not None:
                start.record(self.stream)
            device = self.transfer(host, self.acc, non_blocking=self.non_blocking)
            if end is not None:
                end.record(self.stream)
        t1 = time.perf_counter()
        return _Pending(index, epoch, device, meta, start, end, t0, t1)

    def _hand_out(self, pending: _Pending) -> dict:
        """Make the consumer stream wait for the copy and protect its memory; return the item."""
        if self.stream is not None:
            consumer = _current_stream(self.acc)
            consumer.wait_stream(self.stream)
            for t in _device_tensors(pending.device):
                _record_stream(t, consumer)
        self._copies.append(_CopyRecord(pending.index, pending.epoch, pending.start, pending.end,
                                        pending.host_start_s, pending.host_end_s))
        self._handed_out += 1
        return {"device": pending.device, "index": pending.index, "epoch": pending.epoch, **pending.meta}

    def __iter__(self) -> Iterator[dict]:
        epoch = self._epoch
        self._epoch += 1
        it = iter(self.loader)
        if self.stream is not None and self._origin is None and self.time_copies:
            self.acc.synchronize()
            origin = self._new_event(True)
            origin.record(self.stream)
            self._origin = (time.perf_counter(), origin)
        pending = self._next_pending(it, epoch)
        while pending is not None:
            ready = self._hand_out(pending)
            pending = None
            if self.stream is not None:
                # batch k+1's copy is launched before batch k is handed out: it overlaps step k
                pending = self._next_pending(it, epoch)
                yield ready
            else:
                yield ready
                pending = self._next_pending(it, epoch)
            del ready

    def _next_pending(self, it: Iterator, epoch: int) -> _Pending | None:
        """Fetch the next host batch and launch its transfer; None at the end of the epoch.

        The host batch is not kept once its transfer is launched, so a
        pipeline that reuses its host buffers (``BatchedDataset``'s ring) sees
        it released. Releasing a pinned source while its non-blocking copy is
        in flight is safe: PyTorch's caching host (pinned-memory) allocator
        records an event for each such copy and does not hand the block out
        again before it has completed (for CUDA, ``copy_kernel_cuda`` calls
        its ``record_event``: ``ATen/cuda/CachingHostAllocator.h``; torch_npu
        has its own caching host allocator); ``BatchedDataset`` likewise
        waits for the event :func:`~helpers.pipeline.fast.to_device_batch`
        leaves on the image before rewriting a buffer.
        """
        try:
            host = next(it)
        except StopIteration:
            return None
        pending = self._issue(host, self._issued, epoch)
        self._issued += 1
        return pending

    def copy_frame(self) -> "pd.DataFrame":
        """The copies handed out so far (the last :data:`COPY_LOG_SIZE`), one row each.

        Waits for the device first (events can only be read once complete),
        so call it after the timed run, not inside it.

        Returns
        -------
        pandas.DataFrame
            ``index`` (int), ``epoch`` (int), ``start_s`` (``time.perf_counter``
            seconds when the copy started: device events aligned to the host
            clock through an origin event recorded after a synchronize; on a
            CPU the host time), ``duration_s`` (the copy's time: device events,
            or host time on a CPU), ``issue_s`` (host seconds spent launching
            it) and ``timed_on`` (``"events"`` or ``"host"``).
        """
        import pandas as pd

        rows = []
        if self._copies and self.stream is not None:
            self.acc.synchronize()
        for p in self._copies:
            if p.start is not None and p.end is not None and self._origin is not None:
                duration = p.start.elapsed_time(p.end) / 1e3
                start = self._origin[0] + self._origin[1].elapsed_time(p.start) / 1e3
                timed_on = "events"
            else:
                duration = p.host_end_s - p.host_start_s
                start = p.host_start_s
                timed_on = "host"
            rows.append({"index": p.index, "epoch": p.epoch, "start_s": start, "duration_s": duration,
                         "issue_s": p.host_end_s - p.host_start_s, "timed_on": timed_on})
        return pd.DataFrame(rows, columns=["index", "epoch", "start_s", "duration_s", "issue_s", "timed_on"])


def verify_prefetcher(make_source: Callable[[], Iterable], acc: "Accelerator", *,
                      transfer: Callable[..., Any] | None = None, non_blocking: bool = True) -> dict[str, Any]:
    """Compare every batch a :class:`DevicePrefetcher` hands out with a synchronous copy of the same batch.

    Parameters
    ----------
    make_source : callable
        Returns a fresh iterable of host batches; called twice, it must give
        the same batches in the same order (a fixed epoch and seed).
    acc : helpers.device.Accelerator
    transfer : callable, optional
        As in :class:`DevicePrefetcher` (default ``to_device_batch``).
    non_blocking : bool, default True

    Returns
    -------
    dict
        ``batches`` (int), ``identical`` (batches whose every tensor is
        bit-identical, same dtype and shape), ``side_stream`` (bool),
        ``streams_created`` (int).
    """
    import torch

    transfer = transfer or _default_transfer

    def host_copy(out):
        return [t.detach().to("cpu", copy=True) for t in _device_tensors(out)]

    reference = [host_copy(transfer(b, acc, non_blocking=False)) for b in make_source()]
    acc.synchronize()
    prefetcher = DevicePrefetcher(make_source(), acc, transfer=transfer, non_blocking=non_blocking)
    identical = 0
    n = 0
    for item, ref in zip(prefetcher, reference):
        got = host_copy(item["device"])
        n += 1
        identical += int(len(got) == len(ref) and all(
            g.dtype == r.dtype and g.shape == r.shape and torch.equal(g, r) for g, r in zip(got, ref)))
    if n != len(reference):
        raise ParameterError(f"the prefetcher handed out {n} batches, the synchronous pass {len(reference)}; "
                             "make_source must give the same batches each call")
    return {"batches": n, "identical": identical, "side_stream": prefetcher.uses_side_stream,
            "streams_created": prefetcher.streams_created}


class ConsumerStreamSync:
    """An accelerator view whose ``synchronize()`` waits for the current stream only.

    :func:`helpers.compute.train.train` closes every phase with
    ``acc.synchronize()``, which waits for *all* streams of the device: it
    would also wait for the side stream's copy of the next batch at the end
    of the compute phase, so no copy could ever overlap a step and the
    prefetcher would look useless. Waiting for the consumer (current) stream
    only keeps each phase honest (its own work is finished when it is
    stopped) and lets the side stream run on. On a single-stream job (the
    baseline) the two are the same. Everything else is the wrapped
    accelerator's.

    Parameters
    ----------
    acc : helpers.device.Accelerator
    """

    def __init__(self, acc: "Accelerator") -> None:
        self._acc = acc

    def __getattr__(self, name: str) -> Any:
        return getattr(self._acc, name)

    def __repr__(self) -> str:
        return f"ConsumerStreamSync({self._acc.device})"

    def synchronize(self) -> None:
        """Wait for the work queued on the current stream (no-op on a CPU)."""
        if self._acc.is_cpu or not self._acc.capabilities.streams.available:
            self._acc.synchronize()
            return
        _current_stream(self._acc).synchronize()


# --------------------------------------------------------------------------- recording batches


class RecordingLoader:
    """Wrap a loader and log every batch it yields: when it was asked for, when it came, its metadata.

    Parameters
    ----------
    loader : iterable of dict
        A DataLoader of host batches, or a :class:`DevicePrefetcher`.

    Notes
    -----
    Batches are yielded unchanged. Times are ``time.perf_counter()``
    seconds: CLOCK_MONOTONIC on Linux, the same clock in every process, so
    a worker's ``prep_start_s`` and this process's times share an origin.
    """

    def __init__(self, loader: Iterable) -> None:
        self.loader = loader
        self._rows: list[dict] = []
        self._epoch = 0

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def set_epoch(self, epoch: int) -> None:
        """Forward ``set_epoch`` to the wrapped loader's dataset when it has one."""
        ds = getattr(self.loader, "dataset", None)
        if ds is not None and hasattr(ds, "set_epoch"):
            ds.set_epoch(epoch)

    def __iter__(self) -> Iterator:
        epoch = self._epoch
        self._epoch += 1
        it = iter(self.loader)
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                return
            t1 = time.perf_counter()
            row = {"order": len(self._rows), "epoch": epoch, "request_s": t0, "return_s": t1}
            if isinstance(batch, dict):
                for k in ("prep_start_s", "prep_end_s", "prep_s", "worker"):
                    if k in batch:
                        row[k] = batch[k]
                if "skipped" in batch:
                    row["n_skipped"] = len(batch["skipped"])
            self._rows.append(row)
            yield batch

    def frame(self) -> "pd.DataFrame":
        """One row per batch yielded, in order.

        Returns
        -------
        pandas.DataFrame
            ``order`` (int, from 0), ``epoch``, ``request_s``, ``return_s``
            (perf_counter seconds), and where the batches carry them
            ``prep_start_s``, ``prep_end_s``, ``prep_s`` (seconds),
            ``worker`` (int, -1 for the main process) and ``n_skipped``.
        """
        import pandas as pd

        return pd.DataFrame(self._rows)


# --------------------------------------------------------------------------- the overlap metric


@dataclass(frozen=True)
class OverlapStats:
    """How much of the input pipeline's work the training loop still waits for.

    One statistic throughout: every time is the **median over the measured
    steps** of a per-step value, and every fraction is a **ratio of those
    medians**, so that a table of the medians reproduces the fractions (a
    median of per-step ratios need not equal the ratio of the medians, and a
    ratio of totals is dragged by a few slow steps). The totals are kept for
    reference only.

    Attributes
    ----------
    steps : int
        Measured steps.
    median_input_work_s : float
        Median input work per step, seconds (batch preparation + copy,
        wherever they ran).
    median_exposed_s : float
        Median time the loop waited for input per step, seconds (``data`` +
        ``h2d`` phases).
    median_compute_s, median_step_s : float
        Median ``compute`` phase and step time, seconds.
    exposed_fraction : float
        ``median_exposed_s / median_step_s``: the share of the step the loop
        waits for input.
    hidden_fraction : float
        ``1 - median_exposed_s / median_input_work_s``, clipped to [0, 1]: the
        share of the input work that ran while the step computed. 0 when
        nothing was hidden, or when the loop waited longer than the work
        itself (``exposed_over_work`` > 1: start-up, IPC, contention).
    exposed_over_work : float
        ``median_exposed_s / median_input_work_s`` (unclipped; inf when the
        work is 0).
    exposed_fraction_per_step : float
        Median over steps of exposed input / step time: notebook 01's
        statistic (:attr:`helpers.compute.train.TrainRun.exposed_fraction`),
        kept to compare with it.
    input_work_s, exposed_input_s, step_s, compute_s : float
        Totals over the measured steps, seconds (reference only).
    """

    steps: int
    median_input_work_s: float
    median_exposed_s: float
    median_compute_s: float
    median_step_s: float
    exposed_fraction: float
    hidden_fraction: float
    exposed_over_work: float
    exposed_fraction_per_step: float
    input_work_s: float
    exposed_input_s: float
    step_s: float
    compute_s: float

    def as_dict(self) -> dict[str, float]:
        """All fields as a flat dict (seconds and fractions)."""
        import dataclasses

        return dataclasses.asdict(self)


def _median(values: Sequence[float]) -> float:
    import numpy as np

    return float(np.median(np.asarray(values, dtype=float))) if len(values) else math.nan


def input_work_per_step(batches: "pd.DataFrame", *, skip: int, steps: int,
                        copy_s: Sequence[float] | None = None) -> list[float]:
    """Input work of each measured step: the batch's ``prep_s`` plus its copy time.

    Parameters
    ----------
    batches : pandas.DataFrame
        :meth:`RecordingLoader.frame` (column ``prep_s``, seconds), rows in
        the order the training loop consumed them.
    skip : int
        Batches consumed before the measured steps (``warmup_steps``).
    steps : int
        Measured steps.
    copy_s : sequence of float, optional
        Copy time of each batch consumed (same order, starting at the first
        batch, including the skipped ones), seconds; or of each measured step
        only (length ``steps``). None: no copy time is added.

    Returns
    -------
    list of float
        ``steps`` values, seconds.

    Raises
    ------
    ParameterError
        If ``prep_s`` is missing or there are fewer batches than ``skip + steps``.
    """
    if "prep_s" not in batches:
        raise ParameterError("the batches carry no 'prep_s': input work needs the fast batch format's "
                             "prep_s (time spent preparing each batch)")
    if len(batches) < skip + steps:
        raise ParameterError(f"{len(batches)} batches recorded, fewer than skip + steps = {skip + steps}")
    prep = [float(v) for v in batches["prep_s"].iloc[skip:skip + steps]]
    if copy_s is None:
        return prep
    copies = list(copy_s)
    if len(copies) == steps:
        measured = copies
    elif len(copies) >= skip + steps:
        measured = copies[skip:skip + steps]
    else:
        raise ParameterError(f"copy_s has {len(copies)} values; give one per measured step ({steps}) or one per "
                             f"batch consumed (>= {skip + steps})")
    return [p + float(c) for p, c in zip(prep, measured)]


def overlap_stats(steps: "pd.DataFrame", input_work_s: Sequence[float]) -> OverlapStats:
    """The overlap metric from a training run's phase table and the input work of its steps.

    Parameters
    ----------
    steps : pandas.DataFrame
        One row per measured step with ``data``, ``h2d``, ``compute`` and
        ``step_s`` (seconds), e.g. :attr:`helpers.compute.train.TrainRun.steps`.
    input_work_s : sequence of float
        Input work of each measured step, seconds (:func:`input_work_per_step`).

    Returns
    -------
    OverlapStats

    Raises
    ------
    ParameterError
        When a column is missing, the lengths differ, there is no step, or a
        time is negative or not finite.
    """
    import numpy as np

    missing = [c for c in ("data", "h2d", "compute", "step_s") if c not in steps]
    if missing:
        raise ParameterError(f"the phase table lacks column(s) {missing}; pass TrainRun.steps")
    n = len(steps)
    work = np.asarray(list(input_work_s), dtype=float)
    if n == 0:
        raise ParameterError("the phase table has no step; run at least one measured step")
    if work.shape != (n,):
        raise ParameterError(f"input_work_s has {work.size} values for {n} steps; give one per measured step")
    exposed = steps["data"].to_numpy(dtype=float) + steps["h2d"].to_numpy(dtype=float)
    step = steps["step_s"].to_numpy(dtype=float)
    compute = steps["compute"].to_numpy(dtype=float)
    for name, arr in (("input_work_s", work), ("exposed input", exposed), ("step_s", step)):
        if not np.all(np.isfinite(arr)) or np.any(arr < 0):
            raise ParameterError(f"{name} holds a negative or non-finite time: {arr[:5].tolist()}...")
    if np.any(step <= 0):
        raise ParameterError("a step took 0 s: the clock is too coarse or the table is wrong")
    med_work, med_exposed, med_step = _median(work), _median(exposed), _median(step)
    ratio = med_exposed / med_work if med_work > 0 else math.inf
    hidden = min(1.0, max(0.0, 1.0 - ratio)) if math.isfinite(ratio) else 0.0
    return OverlapStats(
        steps=n, median_input_work_s=med_work, median_exposed_s=med_exposed, median_compute_s=_median(compute),
        median_step_s=med_step, exposed_fraction=med_exposed / med_step, hidden_fraction=hidden,
        exposed_over_work=ratio, exposed_fraction_per_step=_median(exposed / step),
        input_work_s=float(work.sum()), exposed_input_s=float(exposed.sum()), step_s=float(step.sum()),
        compute_s=float(compute.sum()),
    )


def timeline_frame(phases: "pd.DataFrame", batches: "pd.DataFrame", *, skip: int,
                   copies: "pd.DataFrame | None" = None, max_steps: int | None = None) -> "pd.DataFrame":
    """One table of spans for a Gantt chart: worker preparation, copies, data wait and compute.

    Everything is put on one clock: seconds since the start of the first
    measured step. The phase table's times are relative to its first phase;
    its absolute start is recovered from the batch log (the first measured
    step's data phase ends when its batch was returned: ``return_s`` of batch
    ``skip``), to within one synchronize.

    Parameters
    ----------
    phases : pandas.DataFrame
        :attr:`helpers.compute.train.TrainRun.phases` (``step``, ``phase``,
        ``start_s``, ``duration_s``).
    batches : pandas.DataFrame
        :meth:`RecordingLoader.frame` of the loader the loop consumed.
    skip : int
        Warm-up steps (batches consumed before the measured steps).
    copies : pandas.DataFrame, optional
        :meth:`DevicePrefetcher.copy_frame`; when given, its copies form the
        ``copy`` row (else the ``h2d`` phase does).
    max_steps : int, optional
        Keep only spans that start before the end of this many measured steps.

    Returns
    -------
    pandas.DataFrame
        ``row`` (str: ``"worker N prep"`` / ``"main process prep"``, ``"copy"``,
        ``"data wait"``, ``"compute"``), ``kind`` (``"prep"``, ``"copy"``,
        ``"data"``, ``"compute"``), ``start_s``, ``duration_s`` (seconds),
        ``batch`` (int or -1).
    """
    import pandas as pd

    if len(batches) <= skip:
        raise ParameterError(f"the batch log has {len(batches)} rows; need more than skip={skip}")
    first = phases[(phases["step"] == phases["step"].min()) & (phases["phase"] == "data")]
    data_dur = float(first["duration_s"].iloc[0]) if len(first) else 0.0
    origin = float(batches["return_s"].iloc[skip]) - data_dur
    rows = []
    for _, r in phases.iterrows():
        if r["phase"] == "data":
            rows.append(("data wait", "data", float(r["start_s"]), float(r["duration_s"]), int(r["step"])))
        elif r["phase"] == "compute":
            rows.append(("compute", "compute", float(r["start_s"]), float(r["duration_s"]), int(r["step"])))
        elif r["phase"] == "h2d" and copies is None:
            rows.append(("copy", "copy", float(r["start_s"]), float(r["duration_s"]), int(r["step"])))
    if copies is not None:
        for _, c in copies.iterrows():
            rows.append(("copy", "copy", float(c["start_s"]) - origin, float(c["duration_s"]),
                         int(c["index"]) - skip))
    if "prep_start_s" in batches:
        for i, b in batches.iterrows():
            worker = int(b["worker"]) if "worker" in b and not pd.isna(b.get("worker")) else -1
            label = f"worker {worker} prep" if worker >= 0 else "main process prep"
            rows.append((label, "prep", float(b["prep_start_s"]) - origin,
                         float(b["prep_end_s"]) - float(b["prep_start_s"]), int(b["order"]) - skip))
    out = pd.DataFrame(rows, columns=["row", "kind", "start_s", "duration_s", "batch"])
    if max_steps is not None and len(phases):
        steps = sorted(phases["step"].unique())[:max_steps]
        sub = phases[phases["step"].isin(steps)]
        end = float((sub["start_s"] + sub["duration_s"]).max())
        out = out[(out["start_s"] < end) & (out["start_s"] + out["duration_s"] > -end)]
    return out.reset_index(drop=True)


# --------------------------------------------------------------------------- the experiment


def choose_threads(num_workers: int, cores: int | None = None) -> dict[str, Any]:
    """Split the CPU cores between the training step's torch threads and the DataLoader workers.

    Each worker process decodes with its own threads while the main process
    computes with torch's intra-op threads. When both together ask for more
    threads than there are cores, they take turns on the same cores: the
    input no longer runs *beside* the compute but steals from it, which is
    what the overlap was meant to avoid. So each worker gets one decode
    thread and the step keeps the remaining cores (at least one).

    Parameters
    ----------
    num_workers : int
        DataLoader worker processes (>= 0).
    cores : int, optional
        Usable cores; default :func:`helpers.pipeline.loader.usable_cores`.

    Returns
    -------
    dict
        ``torch_threads`` (for ``torch.set_num_threads`` in the main process),
        ``decode_threads`` (per process that decodes), ``cores`` and
        ``reason`` (a sentence).
    """
    from helpers.pipeline.loader import usable_cores

    cores = int(cores or usable_cores())
    if num_workers <= 0:
        return {"torch_threads": cores, "decode_threads": cores, "cores": cores,
                "reason": f"no workers: the main process decodes and computes in turn, each with all {cores} cores"}
    torch_threads = max(1, cores - num_workers)
    over = num_workers + torch_threads > cores
    reason = (f"{num_workers} worker(s) with 1 decode thread each, the training step with {torch_threads} torch "
              f"thread(s), on {cores} core(s)" + ("; more threads than cores: they will share" if over else
                                                   ": one core per thread, so input and compute do not compete"))
    return {"torch_threads": torch_threads, "decode_threads": 1, "cores": cores, "reason": reason}


def thread_splits(num_workers: int, cores: int | None = None, *, is_cpu: bool = True) -> list[dict[str, Any]]:
    """The ways to share the cores between the step and the workers that notebook 05 measures.

    Which is faster depends on how busy a worker is: a worker that needs a
    quarter of a core wastes most of a dedicated one, while a busy worker
    slows down every parallel region of the step it shares cores with. So
    on a CPU both are run and the faster one is kept (:func:`fastest`):

    - ``"1 core per worker"``: :func:`choose_threads`;
    - ``"all cores to torch"``: torch keeps one thread per core, each worker
      decodes with one thread beside it (the operating system shares).

    On an accelerator the step runs on the device, and only the first is used.

    Parameters
    ----------
    num_workers : int
    cores : int, optional
        Usable cores; default :func:`helpers.pipeline.loader.usable_cores`.
    is_cpu : bool, default True
        Whether the step runs on the CPU.

    Returns
    -------
    list of dict
        Each ``label``, ``torch_threads``, ``decode_threads``, ``reason``; one
        entry when the two splits coincide (no workers, or not a CPU).
    """
    first = choose_threads(num_workers, cores)
    out = [{"label": "1 core per worker", **{k: first[k] for k in ("torch_threads", "decode_threads", "reason")}}]
    if is_cpu and num_workers > 0 and first["torch_threads"] < first["cores"]:
        out.append({"label": "all cores to torch", "torch_threads": first["cores"], "decode_threads": 1,
                    "reason": f"{num_workers} worker(s) with 1 decode thread each beside {first['cores']} torch "
                              f"threads on {first['cores']} core(s): the operating system shares the cores"})
    return out


def fastest(runs: Sequence["OverlapRun"]) -> "OverlapRun":
    """The run with the shortest median step time.

    Raises
    ------
    ParameterError
        If ``runs`` is empty.
    """
    if not runs:
        raise ParameterError("fastest() needs at least one run")
    return min(runs, key=lambda r: r.stats.median_step_s)


def compute_thread_scaling(acc: "Accelerator", *, batch_size: int, image_size: int, text_len: int,
                           model_width: int, d_model: int, vocab_size: int, n_actions: int,
                           threads: Sequence[int], repeats: int = 3, warmup: int = 1,
                           seed: int = 0) -> "pd.DataFrame":
    """Time the training step alone (synthetic batch, no input pipeline) at several torch thread counts.

    What a worker process costs the step on a small CPU: each core given to
    a worker is taken from torch's intra-op threads. Each count is timed with
    :func:`helpers.timing.measure` (device-synchronized); the previous
    ``torch.get_num_threads()`` is restored.

    Parameters
    ----------
    acc : helpers.device.Accelerator
    batch_size, image_size, text_len, model_width, d_model, vocab_size, n_actions : int
        The workload.
    threads : sequence of int
        Thread counts to time (each >= 1).
    repeats, warmup, seed : int

    Returns
    -------
    pandas.DataFrame
        ``torch_threads``, ``median_s``, ``p25_s``, ``p75_s`` (seconds per step).

    Raises
    ------
    ParameterError
        For a thread count < 1 or an empty list.
    """
    import pandas as pd
    import torch

    from helpers.compute.model import PolicyConfig, build_policy
    from helpers.compute.ppo import PPOConfig, PPOTrainer
    from helpers.timing import measure

    counts = [int(t) for t in threads]
    if not counts or any(t < 1 for t in counts):
        raise ParameterError(f"threads must be a non-empty list of counts >= 1, got {list(threads)!r}")
    w = int(model_width)
    cfg = PolicyConfig(image_size=image_size, conv_channels=(w, 2 * w, 4 * w), vocab_size=vocab_size,
                       text_len=text_len, d_model=d_model, n_actions=n_actions)
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(batch_size, 3, image_size, image_size, generator=g).to(acc.device)
    tokens = torch.randint(1, vocab_size, (batch_size, text_len), generator=g).to(acc.device)
    labels = torch.randint(0, n_actions, (batch_size,), generator=g).to(acc.device)
    previous = torch.get_num_threads()
    rows = []
    try:
        for t in counts:
            torch.set_num_threads(t)
            torch.manual_seed(seed)
            trainer = PPOTrainer(build_policy(cfg, device=acc.device), PPOConfig())
            m = measure(lambda: trainer.step(images, tokens, labels), repeats=repeats, warmup=warmup,
                        sync=acc.synchronize, name=f"{t} thread(s)")
            rows.append({"torch_threads": t, "median_s": m.median_s, "p25_s": m.p25_s, "p75_s": m.p75_s})
    finally:
        torch.set_num_threads(previous)
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class OverlapRun:
    """One timed training run of notebook 05 and everything measured about it.

    Attributes
    ----------
    label : str
        Variant name, e.g. ``"before: num_workers=0, synchronous"``.
    run : helpers.compute.train.TrainRun
        Phases and steps (seconds).
    batches : pandas.DataFrame
        :meth:`RecordingLoader.frame` (one row per batch consumed).
    copies : pandas.DataFrame or None
        :meth:`DevicePrefetcher.copy_frame`, or None without a prefetcher
        (the copy is then the ``h2d`` phase).
    stats : OverlapStats
    settings : dict
        ``num_workers``, ``prefetch_factor``, ``prefetcher``, ``side_stream``,
        ``pin_memory``, ``torch_threads``, ``decode_threads``, ``batch_size``,
        ``steps``, ``warmup_steps``, ``batches_per_epoch`` (full batches the
        data gives per epoch), ``cores`` (usable CPU cores) and
        ``step_on_cpu`` (bool).
    """

    label: str
    run: Any
    batches: Any
    copies: Any
    stats: OverlapStats
    settings: dict

    def timeline(self, max_steps: int | None = 8) -> "pd.DataFrame":
        """Spans for :func:`helpers.workbook.plots_transfer.overlap_timeline` (see :func:`timeline_frame`)."""
        return timeline_frame(self.run.phases, self.batches, skip=self.run.warmup_steps, copies=self.copies,
                              max_steps=max_steps)


def run_overlap_variant(index, tokenizer, acc: "Accelerator", *, label: str, batch_size: int, image_size: int,
                        text_len: int, model_width: int, d_model: int, steps: int, warmup_steps: int,
                        num_workers: int, prefetch_factor: int = 2, prefetcher: bool = True,
                        torch_threads: int | None = None, decode_threads: int | None = None, seed: int = 0,
                        timeout_s: float = 120.0) -> OverlapRun:
    """Train the workload with one input-pipeline setting and measure the overlap.

    The batched pipeline (:class:`helpers.pipeline.fast.BatchedDataset`,
    :func:`helpers.pipeline.fast.to_device_batch`) feeds a DataLoader built by
    :func:`helpers.pipeline.loader.make_loader`; with ``prefetcher`` the loader
    is wrapped in a :class:`DevicePrefetcher`. The model is built from ``seed``,
    so every variant starts from the same weights and sees the same batches.
    The phases are timed by :func:`helpers.compute.train.train` through
    :class:`ConsumerStreamSync` (see there why).

    Parameters
    ----------
    index : helpers.pipeline.dataset.DatasetIndex
    tokenizer : tokenizers.Tokenizer
    acc : helpers.device.Accelerator
    label : str
    batch_size, image_size, text_len, model_width, d_model : int
        The workload (notebook 05's parameters).
    steps, warmup_steps : int
        Measured and warm-up steps.
    num_workers, prefetch_factor : int
        Loader workers (0: in the main process) and batches each prepares ahead.
        Workers persist across epochs.
    prefetcher : bool, default True
        Wrap the loader in a :class:`DevicePrefetcher`; False transfers in the
        ``h2d`` phase (synchronous).
    torch_threads, decode_threads : int, optional
        Default from :func:`choose_threads`. ``torch.set_num_threads`` is
        restored afterwards.
    seed : int
    timeout_s : float
        Loader timeout: a hung worker becomes an error (Optimization-AI/LibAUC#60,
        pytorch/pytorch#47445).

    Returns
    -------
    OverlapRun
    """
    import torch

    from helpers.compute.model import PolicyConfig, build_policy
    from helpers.compute.ppo import PPOConfig, PPOTrainer
    from helpers.compute.train import train
    from helpers.pipeline.fast import BatchedDataset, batch_sampler, to_device_batch
    from helpers.pipeline.loader import LoaderConfig, close_loader, make_loader

    split = choose_threads(num_workers)
    torch_threads = int(torch_threads or split["torch_threads"])
    decode_threads = int(decode_threads or split["decode_threads"])
    pin = bool(acc.capabilities.pinned_memory.available)
    dataset = BatchedDataset(index, tokenizer, image_size=image_size, text_len=text_len, seed=seed,
                             threads=decode_threads, pin_memory=pin and num_workers == 0)
    config = LoaderConfig(batch_size=batch_size, num_workers=num_workers,
                          prefetch_factor=prefetch_factor if num_workers > 0 else None,
                          persistent_workers=num_workers > 0, pin_memory=pin and num_workers > 0,
                          timeout_s=timeout_s, seed=seed)
    loader = make_loader(dataset, config, acc, batch_sampler=batch_sampler(len(index), batch_size, seed=seed))
    source = DevicePrefetcher(loader, acc, transfer=to_device_batch) if prefetcher else None
    recorder = RecordingLoader(source if source is not None else loader)
    w = int(model_width)
    cfg = PolicyConfig(image_size=image_size, conv_channels=(w, 2 * w, 4 * w),
                       vocab_size=tokenizer.get_vocab_size(), text_len=text_len, d_model=d_model,
                       n_actions=max(2, index.n_classes))
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(torch_threads)
    try:
        torch.manual_seed(seed)
        trainer = PPOTrainer(build_policy(cfg, device=acc.device), PPOConfig())
        gen = torch.Generator(device=acc.device).manual_seed(seed)
        run = train(recorder, trainer, ConsumerStreamSync(acc), steps=steps, warmup_steps=warmup_steps,
                    generator=gen, dataset=dataset, non_blocking=pin,
                    transfer=prefetched if source is not None else to_device_batch)
    finally:
        torch.set_num_threads(previous_threads)
        close_loader(loader)
        dataset.close()
    batches = recorder.frame()
    copies = source.copy_frame() if source is not None else None
    copy_s = copies["duration_s"].tolist() if copies is not None else run.steps["h2d"].tolist()
    work = input_work_per_step(batches, skip=warmup_steps, steps=steps, copy_s=copy_s)
    stats = overlap_stats(run.steps, work)
    settings = {"num_workers": num_workers, "prefetch_factor": prefetch_factor if num_workers > 0 else None,
                "prefetcher": bool(prefetcher), "side_stream": bool(source is not None and source.uses_side_stream),
                "pin_memory": pin, "torch_threads": torch_threads, "decode_threads": decode_threads,
                "batch_size": batch_size, "steps": steps, "warmup_steps": warmup_steps,
                "batches_per_epoch": len(index) // batch_size, "cores": split["cores"], "step_on_cpu": acc.is_cpu}
    logger.info("%s: exposed %.1f%% of the step, %.0f%% of the input hidden", label,
                100 * stats.exposed_fraction, 100 * stats.hidden_fraction)
    return OverlapRun(label=label, run=run, batches=batches, copies=copies, stats=stats, settings=settings)


#: The parameters that make notebook 01's workload (the model and the batch it trains on).
WORKLOAD_PARAMS = ("batch_size", "image_size", "text_len", "model_width", "d_model")
#: Notebook whose workload notebook 05 is compared with.
BASELINE_NOTEBOOK = "01_baseline_profiling"


def baseline_workload(results_path: "str | Path | None" = None) -> tuple[dict[str, int], str]:
    """Notebook 01's workload, to say how notebook 05's model and batch compare with it.

    Parameters
    ----------
    results_path : str or Path, optional
        A results file (JSON lines). When it holds records of notebook 01,
        the parameters of its latest record are used (that is the run the
        report shows beside notebook 05's); otherwise notebook 01's defaults
        (:func:`helpers.specs.spec_for`).

    Returns
    -------
    (dict, str)
        ``{name: value}`` for :data:`WORKLOAD_PARAMS`, and where it came from:
        ``"notebook 01's run in this results file"`` or ``"notebook 01's
        defaults"``.
    """
    from helpers.results import load_results
    from helpers.specs import spec_for

    values = {p.name: p.default for p in spec_for(BASELINE_NOTEBOOK) if p.name in WORKLOAD_PARAMS}
    source = "notebook 01's defaults"
    if results_path:
        try:
            df = load_results(results_path)
        except DataError as exc:  # an unreadable file only costs the comparison its precision
            logger.info("results file %s not read (%s); using notebook 01's defaults", results_path, exc)
            df = None
        if df is not None and len(df) and "notebook" in df:
            rows = df[df["notebook"] == BASELINE_NOTEBOOK]
            params = rows["parameters"].iloc[-1] if len(rows) else None
            if isinstance(params, dict) and all(k in params for k in WORKLOAD_PARAMS):
                values = {k: int(params[k]) for k in WORKLOAD_PARAMS}
                source = "notebook 01's run in this results file"
    return values, source


#: Floor applied to per-step exposed times before forming a ratio, seconds: below the
#: resolution that matters for a step (and time.perf_counter's own), and it keeps a
#: fully hidden input (0 s exposed) from dividing by zero.
EXPOSED_FLOOR_S = 1e-6


#: Batches per epoch below which the refill at each epoch start is worth a note: the first batch
#: of every epoch is prepared while the loop waits, so 1 step in N cannot be hidden (10%+ of the steps).
FEW_BATCHES_PER_EPOCH = 10
#: Exposed share of the step, before any overlap, below which there is nothing worth hiding (2%).
NOTHING_TO_HIDE = 0.02


def _interval(c: Any) -> str:
    """``"1.23x, 95% CI 1.01-1.50"`` for a :class:`helpers.timing.Comparison`."""
    return f"{c.ratio:.2f}x, {c.confidence:.0%} CI {c.ci_low:.2f}-{c.ci_high:.2f}"


def overlap_limits(before: OverlapRun, after: OverlapRun, *, compute: Any = None) -> list[str]:
    """Why the overlap of *after* could not hide (all of) the input: one sentence per cause found.

    The causes checked, from the runs' settings and medians:

    - the data gives one batch per epoch (``batches_per_epoch`` 1): a
      DataLoader and a :class:`DevicePrefetcher` start each epoch empty (they
      do not prepare the next epoch's batches ahead), so every batch is
      prepared while the loop waits; with few batches per epoch (fewer than
      :data:`FEW_BATCHES_PER_EPOCH`), one step in N waits this way;
    - nothing runs beside the step: no worker process and no side stream;
    - the workers took CPU from the step: its compute got measurably slower
      (``compute``'s interval lies below 1);
    - the input work per step is longer than what the workers can prepare
      during the step's compute (``num_workers`` x compute);
    - the input was already hidden before (exposed < :data:`NOTHING_TO_HIDE`
      of the step).

    Parameters
    ----------
    before, after : OverlapRun
        As for :func:`overlap_verdict`; read ``settings`` (``num_workers``,
        ``side_stream``, ``batches_per_epoch``, ``torch_threads``, ``cores``,
        ``step_on_cpu``; missing keys skip their check) and ``stats``.
    compute : helpers.timing.Comparison, optional
        Compute time per step, before (A) vs after (B); None skips the check
        for stolen cores.

    Returns
    -------
    list of str
        Empty when none of the causes applies.
    """
    notes = []
    s_after, s_before = after.settings, before.settings
    workers = int(s_after.get("num_workers") or 0)
    per_epoch = s_after.get("batches_per_epoch")
    if per_epoch is not None and per_epoch <= 1:
        notes.append(f"the data gives {per_epoch} batch per epoch, so there is nothing to prefetch: a DataLoader "
                     "and the prefetcher start every epoch empty (they do not prepare the next epoch's batches "
                     "ahead), so each batch is prepared while the loop waits; lower batch_size or add images so "
                     "that an epoch holds several batches")
    elif per_epoch is not None and per_epoch < FEW_BATCHES_PER_EPOCH:
        notes.append(f"the data gives only {per_epoch} batches per epoch: the first batch of every epoch (1 step "
                     f"in {per_epoch}) is prepared while the loop waits, because loaders do not prefetch across "
                     "epochs")
    if workers == 0 and not s_after.get("side_stream"):
        notes.append("nothing runs beside the step: with num_workers=0 the batch is prepared in the training "
                     "process, and without a side stream (no accelerator) the copy is synchronous")
    if compute is not None and compute.ci_high < 1.0 and workers > 0:
        cores = s_after.get("cores")
        where = (f"{workers} worker(s) beside {s_after.get('torch_threads', '?')} torch thread(s) on {cores} "
                 f"core(s)" if cores else f"{workers} worker(s)")
        notes.append(f"the worker(s) cost the step CPU time: its compute went from "
                     f"{before.stats.median_compute_s * 1e3:.1f} to {after.stats.median_compute_s * 1e3:.1f} ms "
                     f"(before/after {_interval(compute)}) with {where}")
    work, comp = after.stats.median_input_work_s, after.stats.median_compute_s
    if workers > 0 and work > workers * comp:
        notes.append(f"the input work per step ({work * 1e3:.1f} ms) is longer than what {workers} worker(s) can "
                     f"prepare during the step's compute ({workers} x {comp * 1e3:.1f} ms): at most that much can "
                     "be hidden; make the input cheaper (notebook 02), add workers, or train a larger model")
    if before.stats.exposed_fraction < NOTHING_TO_HIDE:
        notes.append(f"the input was already nearly hidden before ({before.stats.exposed_fraction:.1%} of the "
                     "step): there was little to gain")
    return notes


def overlap_verdict(before: OverlapRun, after: OverlapRun, *, seed: int = 0) -> dict[str, Any]:
    """Decide whether to enable the overlap, from two runs of :func:`run_overlap_variant`.

    "enable" when the exposed input time per step dropped measurably (the
    95% bootstrap interval of median(before) / median(after) lies above 1)
    and the step did not get measurably slower (the interval of the step
    times' ratio does not lie below 1); "leave off" otherwise, with the
    reason. On a small CPU the cores given to workers are taken from the
    step, so a drop in exposure alone is not enough. The reason always shows
    the interval of the exposed input's ratio, and, when the overlap did not
    work, the causes :func:`overlap_limits` found.

    Parameters
    ----------
    before, after : OverlapRun
    seed : int
        Seed of the bootstraps.

    Returns
    -------
    dict
        ``recommendation``, ``reason`` (a sentence with the numbers),
        ``exposed``, ``step`` and ``compute`` (:class:`helpers.timing.Comparison`
        per step: before as A, after as B; ratio > 1 means after is shorter),
        ``dropped`` and ``slower`` (bool), ``notes`` (list of str, from
        :func:`overlap_limits`; empty when nothing limited the overlap).
    """
    import numpy as np

    from helpers.timing import Comparison, Measurement

    def exposed(v: OverlapRun) -> tuple[float, ...]:
        per_step = (v.run.steps["data"] + v.run.steps["h2d"]).to_numpy(dtype=float)
        return tuple(np.maximum(per_step, EXPOSED_FLOOR_S))

    def per_step(v: OverlapRun, column: str) -> tuple[float, ...]:
        return tuple(np.maximum(v.run.steps[column].to_numpy(dtype=float), EXPOSED_FLOOR_S))

    exposed_cmp = Comparison.from_measurements(Measurement("before", exposed(before), warmup=0),
                                               Measurement("after", exposed(after), warmup=0), seed=seed)
    step_cmp = Comparison.from_measurements(Measurement("before", per_step(before, "step_s"), warmup=0),
                                            Measurement("after", per_step(after, "step_s"), warmup=0), seed=seed)
    compute_cmp = Comparison.from_measurements(Measurement("before", per_step(before, "compute"), warmup=0),
                                               Measurement("after", per_step(after, "compute"), warmup=0),
                                               seed=seed)
    dropped = exposed_cmp.ci_low > 1.0
    slower = step_cmp.ci_high < 1.0
    b, a = before.stats, after.stats
    workers = after.settings.get("num_workers", "?")
    numbers = (f"exposed input {b.exposed_fraction:.0%} -> {a.exposed_fraction:.0%} of the step "
               f"({b.median_exposed_s * 1e3:.1f} -> {a.median_exposed_s * 1e3:.1f} ms, before/after "
               f"{_interval(exposed_cmp)}), {a.hidden_fraction:.0%} of the input work hidden behind compute, "
               f"step {b.median_step_s * 1e3:.0f} -> {a.median_step_s * 1e3:.0f} ms (before/after "
               f"{_interval(step_cmp)}); medians of {a.steps} steps")
    notes = overlap_limits(before, after, compute=compute_cmp)
    why = ("; why: " + "; ".join(notes)) if notes else ""
    if dropped and not slower:
        recommendation = "enable"
        reason = f"{workers} worker(s) plus the prefetcher: {numbers}" + (
            f"; what still limits it: {'; '.join(notes)}" if notes else "")
    elif dropped:
        recommendation = "leave off"
        reason = (f"the input is hidden ({numbers}), but the step got slower: the cores given to the worker(s) "
                  "cost the compute more than the hidden input saved" + why)
    else:
        recommendation = "leave off"
        direction = ("it rose measurably (the interval lies below 1)" if exposed_cmp.ci_high < 1.0
                     else "the interval includes 1")
        if not notes:
            why = ("; none of the known causes (one batch per epoch, workers taking the cores, input longer than "
                   "the compute) was found: with few steps the interval is wide, so run more steps")
        reason = f"no measurable drop in exposed input ({direction}): {numbers}" + why
    action = Action("prefetcher", recommendation == "enable",
                    f"overlapped input (worker/stream prefetch): {recommendation}", current=False)
    return {"recommendation": recommendation, "reason": reason, "exposed": exposed_cmp, "step": step_cmp,
            "compute": compute_cmp, "dropped": dropped, "slower": slower, "notes": notes, "action": action}


# --------------------------------------------------------------------------- the benchmark


def overlap_bench(*, data_dir: str | None = None, max_images: int = 0, batch_size: int = 32, image_size: int = 128,
                  text_len: int = 16, model_width: int = 32, d_model: int = 64, steps: int = 20,
                  warmup_steps: int = 3, num_workers: int = 1, prefetch_factor: int = 2, seed: int = 0,
                  device: str = "cpu", prepared: tuple | None = None) -> dict:
    """The ``exposed_input_fraction`` of ``python -m helpers bench input-pipeline``.

    Trains the workload twice on the batched pipeline: *before* (the loader
    in the main process, the copy in the step: ``num_workers=0``, no
    prefetcher) and *after* (``num_workers`` worker processes and the
    :class:`DevicePrefetcher`, with each thread split of
    :func:`thread_splits`, keeping the fastest, as notebook 05 does). The
    defaults are notebook 05's quick profile; the compute per step is chosen
    (``model_width``) to be at least the input work per step, and both are
    reported so that this can be checked.

    Parameters
    ----------
    data_dir : str, optional
        Folder of images; None or "" for the embedded dataset.
    max_images, batch_size, image_size, text_len, model_width, d_model, steps, warmup_steps, num_workers,
    prefetch_factor, seed
        As notebook 05's parameters.
    device : str, default "cpu"
        Device kind (``helpers.device.get_accelerator``).
    prepared : (DatasetIndex, tokenizers.Tokenizer), optional
        Data already loaded by :func:`helpers.pipeline.prepare.prepare_data`
        (so a caller running several benchmarks scans the folder once).

    Returns
    -------
    dict
        ``exposed_input_fraction`` (after: median exposed input / median step
        time), ``exposed_input_fraction_before``, ``hidden_fraction`` (after:
        1 - median exposed / median input work), ``input_time_s`` and
        ``compute_time_s`` (after: medians per step, seconds),
        ``step_time_s_before`` / ``step_time_s_after`` (medians),
        ``after_variant`` (the thread split kept), ``step_time_s_candidates``
        (median step time of each split), ``num_workers``,
        ``torch_threads``, ``decode_threads``, ``cores``, ``steps``,
        ``batches_per_epoch``, ``statistic`` (what the figures are),
        ``recommendation`` and ``exposed_reduction`` (``ratio``, ``ci_low``,
        ``ci_high``, ``confidence``: exposed input before / after) from
        :func:`overlap_verdict`, ``note`` (why the overlap could not work,
        from :func:`overlap_limits`; None when nothing limited it) and
        ``device``.

    Raises
    ------
    helpers.errors.DataError
        If the dataset holds fewer images than one batch.
    """
    from helpers.device import get_accelerator
    from helpers.pipeline.prepare import prepare_data

    acc = get_accelerator(device)
    if prepared is None:
        prepared = prepare_data(data_dir, max_images=max_images, seed=seed, batch_size=batch_size,
                                text_len=text_len)
    index, tokenizer = prepared
    common = dict(batch_size=batch_size, image_size=image_size, text_len=text_len, model_width=model_width,
                  d_model=d_model, steps=steps, warmup_steps=warmup_steps, seed=seed)
    before = run_overlap_variant(index, tokenizer, acc, label="before", num_workers=0, prefetcher=False, **common)
    candidates = [run_overlap_variant(index, tokenizer, acc, label=f"after, {split['label']}",
                                      num_workers=num_workers, prefetch_factor=prefetch_factor, prefetcher=True,
                                      torch_threads=split["torch_threads"], decode_threads=split["decode_threads"],
                                      **common)
                  for split in thread_splits(num_workers, is_cpu=acc.is_cpu)]
    after = fastest(candidates)
    verdict = overlap_verdict(before, after, seed=seed)
    return {
        "exposed_input_fraction": after.stats.exposed_fraction,
        "exposed_input_fraction_before": before.stats.exposed_fraction,
        "hidden_fraction": after.stats.hidden_fraction,
        "input_time_s": after.stats.median_input_work_s,
        "compute_time_s": after.stats.median_compute_s,
        "step_time_s_before": before.stats.median_step_s,
        "step_time_s_after": after.stats.median_step_s,
        "after_variant": after.label,
        "step_time_s_candidates": {r.label: r.stats.median_step_s for r in candidates},
        "num_workers": num_workers,
        "torch_threads": after.settings["torch_threads"],
        "decode_threads": after.settings["decode_threads"],
        "cores": choose_threads(num_workers)["cores"],
        "steps": steps,
        "batches_per_epoch": after.settings["batches_per_epoch"],
        "statistic": "medians over the measured steps; fractions are ratios of those medians",
        "recommendation": verdict["recommendation"],
        "exposed_reduction": {"ratio": verdict["exposed"].ratio, "ci_low": verdict["exposed"].ci_low,
                              "ci_high": verdict["exposed"].ci_high, "confidence": verdict["exposed"].confidence},
        "note": "; ".join(verdict["notes"]) or None,
        "device": acc.kind,
    }
