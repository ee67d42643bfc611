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

The overlap metric lives in :mod:`helpers.pipeline.overlap_metric`, notebook 05's experiment in
:mod:`helpers.experiments.overlap`.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from helpers.errors import ParameterError
from helpers.pipeline.fast import to_device_batch

if TYPE_CHECKING:  # pragma: no cover - typing only
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
    """The tensors in a transfer's result (a tensor, or a tuple/list/dict/dataclass of them, nested)."""
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for v in out.values() for t in _device_tensors(v)]
    if isinstance(out, (tuple, list)):
        return [t for v in out for t in _device_tensors(v)]
    if hasattr(out, "__dataclass_fields__") and not isinstance(out, type):
        return [t for name in out.__dataclass_fields__ for t in _device_tensors(getattr(out, name))]
    return []


def _default_transfer(batch: dict, acc: "Accelerator", *, non_blocking: bool = False):
    """``helpers.pipeline.fast.to_device_batch`` (the fast uint8 NHWC batch), imported on first use."""

    return to_device_batch(batch, acc, non_blocking=non_blocking)


def prefetched(batch: dict, acc: "Accelerator" = None, *, non_blocking: bool = False):
    """The ``transfer`` for :class:`helpers.compute.train.TimedLoop` when the loader is a :class:`DevicePrefetcher`.

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
            "prefetched() got a batch without a 'device' entry: use it as the timed loop's transfer "
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
    Pass ``transfer=prefetched`` to :class:`helpers.compute.train.TimedLoop`.

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
        bit-identical, same dtype and shape), ``structure_equal`` (batches
        whose tensors have the same dtypes and shapes and whose integer
        tensors, labels and token ids, are equal), ``reproducible`` (bool:
        ``make_source`` gives the same first batch when read again; False
        for augmentations drawn from a source nobody seeded), ``side_stream``
        (bool), ``streams_created`` (int).
    """
    import torch

    transfer = transfer or _default_transfer

    def host_copy(out):
        return [t.detach().to("cpu", copy=True) for t in _device_tensors(out)]

    reference = [host_copy(transfer(b, acc, non_blocking=False)) for b in make_source()]
    acc.synchronize()
    prefetcher = DevicePrefetcher(make_source(), acc, transfer=transfer, non_blocking=non_blocking)
    identical = structural = 0
    n = 0
    for item, ref in zip(prefetcher, reference):
        got = host_copy(item["device"])
        n += 1
        alike = len(got) == len(ref) and all(g.dtype == r.dtype and g.shape == r.shape for g, r in zip(got, ref))
        identical += int(alike and all(torch.equal(g, r) for g, r in zip(got, ref)))
        structural += int(alike and all(g.is_floating_point() or torch.equal(g, r) for g, r in zip(got, ref)))
    if n != len(reference):
        raise ParameterError(f"the prefetcher handed out {n} batches, the synchronous pass {len(reference)}; "
                             "make_source must give the same batches each call")
    reproducible = True
    if identical != n and n:  # read the first batch once more: do its values come back the same?
        first = next(iter(make_source()))
        reproducible = all(torch.equal(a, b) for a, b in zip(host_copy(transfer(first, acc, non_blocking=False)),
                                                               reference[0]))
    return {"batches": n, "identical": identical, "structure_equal": structural, "reproducible": bool(reproducible),
            "side_stream": prefetcher.uses_side_stream, "streams_created": prefetcher.streams_created}


class ConsumerStreamSync:
    """An accelerator view whose ``synchronize()`` waits for the current stream only.

    :class:`helpers.compute.train.TimedLoop` closes every phase with
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
