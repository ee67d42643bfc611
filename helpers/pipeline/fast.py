"""The batched input pipeline: one call builds a whole batch of uint8 images, tokens and labels.

Where the baseline (:mod:`helpers.pipeline.baseline`) prepares one sample per
``__getitem__`` (full-size Pillow decode, crop, resize, float conversion and
normalization in NumPy, one caption tokenized), :class:`BatchedDataset`
takes a *list* of indices and:

* decodes the images on ``threads`` threads (the calling thread and a pool
  of helpers, one pool per process, created lazily; libjpeg-turbo and
  Pillow's resize release the GIL) with
  DCT-domain downscaling and a uint8 crop, resize and flip
  (:func:`helpers.pipeline.decode.decode_augment`), using the *same* crop and
  flip draws as the baseline for ``(seed, epoch, index)``;
* writes each image straight into its slot of one preallocated uint8 NHWC
  batch buffer (pinned when asked for and the device supports it);
* tokenizes all captions with one ``Tokenizer.encode_batch`` call;
* leaves the float conversion and normalization to :func:`to_device_batch`,
  which does them once per batch, on the device, after copying the uint8
  batch (a quarter of the bytes of a float32 batch).

Use it with ``DataLoader(dataset, batch_size=None, sampler=batch_sampler(...))``
so that one worker builds one whole batch.

The host batch (the format shared with notebooks 03-05)
--------------------------------------------------------
``image``
    torch.uint8 (B, S, S, 3), NHWC, RGB, contiguous; pinned when the dataset
    pins (``dataset.pinned``).
``tokens`` / ``label``
    torch.int64 (B, L) / (B,).
``prep_start_s``, ``prep_end_s``, ``prep_s``
    ``time.perf_counter()`` when the batch's preparation started and ended
    (CLOCK_MONOTONIC on Linux, so comparable across processes), and the
    difference, seconds.
``worker``
    ``torch.utils.data.get_worker_info().id``, or -1 in the main process.
``skipped``
    list of ``(file name, reason)`` for images that failed to decode and were
    replaced (see below).

Buffer reuse: who may hold a batch, and for how long
-----------------------------------------------------
In the main process the image buffers come from a small ring (``buffers``
slots, 3 by default) allocated once and reused, so that no batch pays for
allocating (or pinning: pytorch/pytorch#124456) memory. A slot is reused only when it is
safe:

* if the consumer still holds the tensor handed out (the batch dict or
  ``batch["image"]`` itself is still referenced anywhere), the slot gets a
  fresh buffer and the old one stays with the consumer (counted in
  ``stats()["buffer_reallocations"]``); a *view or slice* of the image
  (``batch["image"][0]``) is not seen as a hold: keep the tensor, or copy;
* if :func:`to_device_batch` started an asynchronous (``non_blocking``) copy
  from that buffer, it left a device event on the tensor, and the slot waits
  for that event before the buffer is overwritten, so the DMA never reads a
  half-written batch (huggingface/pytorch-image-models#2781).

In a DataLoader worker process there is no ring: each batch gets a new
buffer, because sending a tensor to the main process moves its storage into
shared memory in place, and rewriting it would change the batch the main
process is reading. Pinning is not done in workers either (the DataLoader's
pin-memory thread pins in the main process).

Bad files met mid-epoch (pytorch/vision#138 and #6538)
------------------------------------------------------
A file that fails to decode (truncated, corrupt, unsupported) never kills the
epoch: it is logged once per process, listed in ``batch["skipped"]``, and its
slot is filled with a deterministic substitute, the next item of the dataset
(``(i + 1) % n``, then ``i + 2``, ...) that decodes, with that item's own
augmentation, label and caption; the batch keeps its size.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from queue import SimpleQueue
from typing import TYPE_CHECKING, Any

import numpy as np

from helpers.errors import DataError, ParameterError
from helpers.pipeline.baseline import IMAGENET_MEAN, IMAGENET_STD, ImageTransformConfig
from helpers.pipeline.decode import (
    DecodeConfig,
    DecodePlan,
    decode_jpeg_scaled,
    plan_decode,
    psnr,
    reference_augment,
    run_plan,
    usable_cores,
)
from helpers.pipeline.images import BadImage
from helpers.pipeline.sampler import batch_epoch, check_int
from helpers.pipeline.text import encode_batch, encode_one
from helpers.workload import DEFAULT

if TYPE_CHECKING:  # pragma: no cover - typing only

    pass

logger = logging.getLogger(__name__)

__all__ = [
    "HOST_BATCH_KEYS",
    "BatchedDataset",
    "to_device_batch",
    "reference_check",
]

#: Keys of a host batch, in order.
HOST_BATCH_KEYS: tuple[str, ...] = ("image", "tokens", "label", "prep_start_s", "prep_end_s", "prep_s",
                                    "worker", "skipped")

# Attribute set on a host image tensor by to_device_batch: the device event
# recorded after its asynchronous copy (the ring waits for it before reuse).
_FENCE_ATTR = "_workbook_copy_fence"

# Cache of normalization constants per (device, mean, std): (scale, shift), each (1, 3, 1, 1) float32.
_NORM_CACHE: dict[tuple[str, tuple[float, ...], tuple[float, ...]], tuple[Any, Any]] = {}
_NORM_LOCK = threading.Lock()


def _worker_id() -> int:
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    return -1 if info is None else int(info.id)


# --------------------------------------------------------------------------- buffers


class _BufferRing:
    """A few uint8 batch buffers, reused in turn (main process only); see the module docstring."""

    def __init__(self, slots: int, pin: bool) -> None:
        self.pin = pin
        self._slots: list[Any] = [None] * slots
        self._free_refs: list[int] = [0] * slots
        self._next = 0
        self.allocations = 0
        self.reallocations = 0
        self.fence_waits = 0

    def _alloc(self, shape: tuple[int, ...]):
        import torch

        self.allocations += 1
        return torch.empty(shape, dtype=torch.uint8, pin_memory=self.pin)

    def _refs(self, i: int) -> int:
        # Always measured through this one function, so that the count of a buffer nobody else
        # holds (recorded at allocation) and the count now differ only by outside references.
        return sys.getrefcount(self._slots[i])

    def _fresh(self, i: int, shape: tuple[int, ...]):
        self._slots[i] = self._alloc(shape)
        self._free_refs[i] = self._refs(i)
        return self._slots[i]

    def acquire(self, shape: tuple[int, ...]):
        """Return a buffer of ``shape`` that nobody else uses any more."""
        if not self._slots:
            return self._alloc(shape)
        i = self._next
        self._next = (i + 1) % len(self._slots)
        buf = self._slots[i]
        if buf is None or tuple(buf.shape) != shape:
            return self._fresh(i, shape)
        del buf
        if self._refs(i) > self._free_refs[i]:  # the consumer still holds the batch or its image
            self.reallocations += 1
            logger.debug("batch buffer %d is still held by the consumer; allocating a new one", i)
            return self._fresh(i, shape)
        buf = self._slots[i]
        fence = getattr(buf, _FENCE_ATTR, None)
        if fence is not None:
            self.fence_waits += 1
            fence.synchronize()  # the asynchronous copy from this buffer has finished
            setattr(buf, _FENCE_ATTR, None)
        return buf


# --------------------------------------------------------------------------- the dataset


@dataclass(frozen=True)
class _Filled:
    """What filled one slot of a batch."""

    item: int  # dataset index whose image, label and caption fill the slot
    route: str
    why: str
    denominator: int
    skipped: tuple[tuple[str, str], ...]


class BatchedDataset:
    """Map-style dataset whose items are whole batches: ``dataset[list_of_indices] -> host batch``.

    Parameters
    ----------
    index : helpers.pipeline.dataset.DatasetIndex
        Images, captions and labels (kept as NumPy arrays: pytorch/pytorch#13246).
    tokenizer : tokenizers.Tokenizer
        From :func:`helpers.pipeline.text.load_or_build_tokenizer`.
    image_size : int, default 64 (:data:`helpers.workload.DEFAULT`)
        Output side S in pixels.
    text_len : int, default 16
        Token ids per caption.
    seed : int, default 0
        Base seed of the per-item generators (the baseline's, so the draws match).
    threads : int, default 0
        Decode threads per process (the calling thread included); 0 means the
        usable cores (:func:`helpers.pipeline.decode.usable_cores`), shared out
        among the workers inside a DataLoader worker. Each worker has its own
        pool: workers x threads should not exceed the cores.
    pin_memory : bool, default False
        Allocate the batch buffers in pinned memory (main process only). Pass
        ``acc.capabilities.pinned_memory.available``; when pinning is not
        possible here (no accelerator) a warning is logged and plain memory
        is used (pytorch/pytorch#73003).
    transform : ImageTransformConfig, optional
        Crop, flip and normalization settings; its ``image_size`` must equal
        ``image_size``. Default ``ImageTransformConfig(image_size=image_size)``.
    decode : DecodeConfig, optional
        DCT scaling and decoder flags.
    buffers : int, default 3
        Batch buffers in the main-process ring (>= 0; 0 allocates a new buffer
        for every batch).
    max_substitutes : int, default 8
        Items tried, in order after a bad one, to fill its slot (>= 1).

    Raises
    ------
    ParameterError
        For an invalid size, length, seed, thread count, buffer count, or a
        ``transform`` that disagrees with ``image_size``.
    DataError
        If the index holds no image.

    Notes
    -----
    Picklable (for spawn-started DataLoader workers): the thread pool, the
    buffer ring and the locks are not pickled; each process creates its own
    on first use, and a process forked after the pool was started notices it
    (the pool's threads do not survive a fork) and starts a new one.
    """

    def __init__(self, index, tokenizer, *, image_size: int = DEFAULT.image_size, text_len: int = DEFAULT.text_len, seed: int = 0,
                 threads: int = 0, pin_memory: bool = False, transform: ImageTransformConfig | None = None,
                 decode: DecodeConfig | None = None, buffers: int = 3, max_substitutes: int = 8) -> None:
        if transform is None:
            transform = ImageTransformConfig(image_size=image_size)
        elif transform.image_size != image_size:
            raise ParameterError(
                f"transform.image_size={transform.image_size} disagrees with image_size={image_size}; "
                "pass the same value"
            )
        self.text_len = check_int("text_len", text_len, 1)
        self.seed = check_int("seed", seed, 0)
        self.requested_threads = check_int("threads", threads, 0)
        self.buffers = check_int("buffers", buffers, 0)
        self.max_substitutes = check_int("max_substitutes", max_substitutes, 1)
        if len(index) == 0:
            raise DataError("the dataset index holds no image; load a folder with at least one decodable image")
        self.index = index
        self.tokenizer = tokenizer
        self.transform = transform
        self.decode = decode or DecodeConfig()
        self.pin_memory = bool(pin_memory)
        self.epoch = 0
        # NumPy arrays, not lists: forked workers share these pages (pytorch/pytorch#13246).
        self.paths = np.asarray(index.paths)
        self.captions = np.asarray(index.captions)
        self.labels = np.asarray(index.labels, dtype=np.int64)
        self._init_transient()

    # -- per-process state ---------------------------------------------------------

    def _init_transient(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._ring: _BufferRing | None = None
        self._pinned: bool | None = None
        self._bad: dict[int, str] = {}
        self._reported: set[str] = set()
        self._counts: Counter = Counter()

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        for key in ("_pid", "_lock", "_pool", "_ring", "_pinned", "_bad", "_reported", "_counts"):
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._init_transient()

    def _check_process(self) -> None:
        """After a fork, start afresh: the parent's pool threads and lock do not exist here."""
        if self._pid != os.getpid():
            self._init_transient()

    @property
    def threads(self) -> int:
        """Decode threads used in this process.

        The ``threads`` parameter, or for 0 the usable cores; in a DataLoader
        worker, 0 means the usable cores shared out among the workers
        (``max(1, cores // num_workers)``), so that workers x threads does not
        oversubscribe the machine.
        """
        if self.requested_threads:
            return self.requested_threads
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        cores = usable_cores()
        return max(1, cores // info.num_workers) if info is not None else cores

    @property
    def image_size(self) -> int:
        """Output side S in pixels."""
        return self.transform.image_size

    @property
    def pinned(self) -> bool:
        """Whether this process's batch buffers are pinned (decided on first use)."""
        self._check_process()
        if self._pinned is None:
            self._pinned = self._decide_pinning()
        return self._pinned

    def _decide_pinning(self) -> bool:
        if not self.pin_memory:
            return False
        if _worker_id() >= 0:
            logger.debug("pin_memory ignored in a DataLoader worker; the loader's pin thread pins instead")
            return False
        import torch

        if not torch.accelerator.is_available():
            logger.warning(
                "pin_memory=True but this torch has no usable accelerator (Tensor.pin_memory() would raise "
                "'Cannot access accelerator device when none is available'); using ordinary memory. "
                "Pass pin_memory=acc.capabilities.pinned_memory.available"
            )
            return False
        return True

    def _get_pool(self) -> ThreadPoolExecutor | None:
        """The helper threads: ``threads - 1`` of them (the calling thread is the last one)."""
        self._check_process()
        if self.threads <= 1:
            return None
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.threads - 1, thread_name_prefix="batched_decode")
        return self._pool

    def _get_buffer(self, n: int):
        shape = (n, self.image_size, self.image_size, 3)
        if _worker_id() >= 0:  # no reuse across the process boundary (see the module docstring)
            import torch

            return torch.empty(shape, dtype=torch.uint8)
        if self._ring is None:
            self._ring = _BufferRing(self.buffers, self.pinned)
        return self._ring.acquire(shape)

    def close(self) -> None:
        """Shut the thread pool down (it is started again on next use)."""
        if self._pool is not None and self._pid == os.getpid():
            self._pool.shutdown(wait=True)
        self._pool = None

    def __del__(self) -> None:  # pragma: no cover - best effort at interpreter exit
        try:
            if getattr(self, "_pool", None) is not None and self._pid == os.getpid():
                self._pool.shutdown(wait=False)
        except Exception:  # noqa: BLE001
            pass

    # -- running work on the pool ----------------------------------------------------

    def run_parallel(self, fn: Callable[[int], Any], n: int) -> list:
        """Run ``fn(k)`` for k in range(n) on this dataset's pool; return the results in order.

        The calling thread and the ``threads - 1`` helper threads each take
        the next k from a shared counter until none is left (dynamic load
        balance, no future per item). With one thread, runs in the calling
        thread only.

        Parameters
        ----------
        fn : callable
            Called with an int in ``range(n)``; must be thread-safe.
        n : int

        Returns
        -------
        list
            ``[fn(0), ..., fn(n - 1)]``.
        """
        results: list[Any] = [None] * n
        pool = self._get_pool()
        if pool is None or n <= 1:
            for k in range(n):
                results[k] = fn(k)
            return results
        counter = itertools.count()

        def drain() -> None:
            for k in counter:  # next() on itertools.count is atomic under the GIL
                if k >= n:
                    return
                results[k] = fn(k)

        futures = [pool.submit(drain) for _ in range(min(self.threads, n) - 1)]
        try:
            drain()  # the calling thread works too
        finally:
            for f in futures:
                f.result()  # re-raises the first error of a thread
        return results

    # -- the batch ---------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose augmentations ``__getitem__`` draws.

        With ``persistent_workers=True`` the workers hold their own copy of
        the dataset, so this call does not reach them; the epoch a batch of
        :class:`helpers.pipeline.sampler.EpochBatchSampler` is tagged with does
        (``__getitem__`` reads it).

        Parameters
        ----------
        epoch : int
            Non-negative.
        """
        self.epoch = check_int("epoch", epoch, 0)

    def __len__(self) -> int:
        """Number of items (images), not batches."""
        return int(self.paths.shape[0])

    def _indices(self, indices) -> np.ndarray:
        if isinstance(indices, (int, np.integer)) and not isinstance(indices, bool):
            raise ParameterError(
                f"BatchedDataset takes a list of indices, got the single index {indices!r}; use "
                "DataLoader(dataset, batch_size=None, sampler=batch_sampler(...)) so that each item is a batch"
            )
        try:
            idx = np.asarray(indices if not hasattr(indices, "tolist") else indices.tolist(), dtype=np.int64)
        except (TypeError, ValueError):
            raise ParameterError(f"indices must be a list of integers, got {indices!r}") from None
        if idx.ndim != 1 or idx.size == 0:
            raise ParameterError(f"indices must be a non-empty 1-D list of integers, got shape {idx.shape}")
        n = len(self)
        bad = idx[(idx < -n) | (idx >= n)]
        if bad.size:
            raise IndexError(f"index {int(bad[0])} out of range for a dataset of {n} items")
        return idx % n

    def _note_bad(self, i: int, reason: str) -> None:
        name = os.path.basename(str(self.paths[i]))
        with self._lock:
            self._bad[i] = reason
            first = name not in self._reported
            self._reported.add(name)
            if first:
                self._counts["bad_files"] += 1
        if first:
            logger.warning("bad image %s (item %d): %s; replaced in its batch by the next decodable item",
                           name, i, reason)

    def _plan(self, i: int) -> DecodePlan | None:
        """Plan item i (None when it is already known to be bad)."""
        if i in self._bad:
            return None
        return plan_decode(self.paths[i], seed=self.seed, epoch=self.epoch, index=i, transform=self.transform,
                           config=self.decode)

    def _run(self, plan: DecodePlan | None, i: int, out: np.ndarray) -> _Filled | str:
        """Decode a planned item into ``out``; on failure return the reason (a str)."""
        if plan is None:
            return self._bad[i]
        try:
            r = run_plan(plan, self.transform, self.decode, out)
        except BadImage as exc:
            self._note_bad(i, exc.reason)
            return exc.reason
        return _Filled(i, r.route, r.why, r.denominator, ())

    def _substitute(self, out: np.ndarray, i: int, reason: str) -> _Filled:
        """Fill the slot of bad item i with the next decodable item, or the mean colour."""
        name = os.path.basename(str(self.paths[i]))
        skipped: list[tuple[str, str]] = [(name, reason)]
        n = len(self)
        for t in range(1, min(self.max_substitutes + 1, n)):
            j = (i + t) % n
            got = self._run(self._plan(j), j, out)
            if isinstance(got, _Filled):
                return _Filled(j, got.route, got.why, got.denominator, tuple(skipped))
            skipped.append((os.path.basename(str(self.paths[j])), got))
        # nothing decodable nearby: the mean colour (0 after normalization) keeps the batch's shape
        out[...] = np.round(np.asarray(self.transform.mean) * 255).astype(np.uint8)
        skipped[0] = (name, f"{reason}; no decodable substitute in the next {self.max_substitutes} items, "
                            "filled with the mean colour")
        return _Filled(i, "mean-fill", "no decodable substitute", 1, tuple(skipped))

    def _decode_all(self, idx: np.ndarray, out: np.ndarray) -> tuple[list, Any]:
        """Plan and decode every slot; tokenize the items' captions meanwhile. Returns (results, tokens)."""
        n = int(idx.size)
        results: list[Any] = [None] * n
        pool = self._get_pool()
        if pool is None or n == 1:
            for k in range(n):
                i = int(idx[k])
                results[k] = self._run(self._plan(i), i, out[k])
            return results, encode_batch(self.tokenizer, self.captions[idx], self.text_len)
        # The calling thread plans (Python: header, crop draw) while the helper threads decode (C, GIL
        # released); then it tokenizes and joins the decoding. Planning all images in one tight loop also
        # keeps that Python code's caches warm.
        rows = list(out)
        plans: list[DecodePlan | None] = [None] * n
        queue: SimpleQueue = SimpleQueue()

        def consume() -> None:
            while (k := queue.get()) is not None:
                results[k] = self._run(plans[k], int(idx[k]), rows[k])

        n_helpers = min(self.threads, n) - 1
        futures = [pool.submit(consume) for _ in range(n_helpers)]
        try:
            try:
                for k in range(n):
                    plans[k] = self._plan(int(idx[k]))
                    queue.put(k)
                tokens = encode_batch(self.tokenizer, self.captions[idx], self.text_len)
            finally:
                for _ in range(n_helpers + 1):
                    queue.put(None)  # one stop mark per consumer, the calling thread included
            consume()
        finally:
            for f in futures:
                f.result()  # re-raises an unexpected error of a helper thread
            rows.clear()  # no view of the buffer may outlive the call (the ring counts references)
        return results, tokens

    def __getitem__(self, indices) -> dict:
        """Build one host batch from a list of item indices.

        Parameters
        ----------
        indices : sequence of int
            Items of the batch (e.g. one element of :func:`batch_sampler`).

        Returns
        -------
        dict
            The host batch (module docstring): ``image`` uint8 (B, S, S, 3),
            ``tokens`` int64 (B, L), ``label`` int64 (B,), ``prep_start_s``,
            ``prep_end_s``, ``prep_s``, ``worker``, ``skipped``.

        Raises
        ------
        ParameterError
            For a single int or an empty or malformed list.
        IndexError
            For an index out of range.
        """
        self.epoch = batch_epoch(indices, self.epoch)  # the epoch reaches persistent workers with the batch
        import torch

        start = time.perf_counter()
        self._check_process()
        idx = self._indices(indices)
        buf = self._get_buffer(int(idx.size))
        out = buf.numpy()
        results, tokens = self._decode_all(idx, out)
        for k, r in enumerate(results):
            if not isinstance(r, _Filled):
                results[k] = f = self._substitute(out[k], int(idx[k]), r)
                if f.item != int(idx[k]):
                    tokens[k] = encode_one(self.tokenizer, str(self.captions[f.item]), self.text_len)
        del out
        items = np.fromiter((f.item for f in results), dtype=np.int64, count=len(results))
        first_by_name: dict[str, tuple[str, str]] = {}
        for f in results:
            for name, reason in f.skipped:
                first_by_name.setdefault(name, (name, reason))
        skipped = list(first_by_name.values())  # each bad file once
        with self._lock:
            for f in results:
                self._counts[f"route:{f.route}"] += 1
                self._counts[f"scale:1/{f.denominator}"] += 1
                if f.why and f.route == "reference":
                    self._counts[f"reference because: {f.why.split(' (')[0]}"] += 1
            self._counts["batches"] += 1
            self._counts["images"] += len(results)
            self._counts["substituted"] += int(np.count_nonzero(items != idx))
        end = time.perf_counter()
        return {
            "image": buf,
            "tokens": torch.from_numpy(tokens),
            "label": torch.from_numpy(self.labels[items]),
            "prep_start_s": start,
            "prep_end_s": end,
            "prep_s": end - start,
            "worker": _worker_id(),
            "skipped": skipped,
        }

    def stats(self) -> dict[str, int]:
        """Counters of this process since creation or :meth:`reset_stats`.

        Returns
        -------
        dict
            ``batches``, ``images``, ``route:turbo`` / ``route:reference`` /
            ``route:mean-fill`` (images per decode route), ``scale:1/d``
            (images decoded at 1/d size), ``reference because: ...``,
            ``bad_files`` (distinct files that failed), ``substituted``,
            ``buffer_allocations``, ``buffer_reallocations``, ``fence_waits``.
        """
        self._check_process()
        with self._lock:
            out = dict(self._counts)
        ring = self._ring
        out["buffer_allocations"] = ring.allocations if ring else 0
        out["buffer_reallocations"] = ring.reallocations if ring else 0
        out["fence_waits"] = ring.fence_waits if ring else 0
        return out

    def reset_stats(self) -> None:
        """Zero the counters of :meth:`stats` (the buffers are kept)."""
        self._check_process()
        with self._lock:
            self._counts.clear()
        if self._ring is not None:
            self._ring.allocations = self._ring.reallocations = self._ring.fence_waits = 0

    # -- for measurements --------------------------------------------------------------

    def decode_plan(self, indices) -> list[DecodePlan]:
        """Plan these items as a batch would (same epoch): bytes, header, crop draw, DCT scale.

        Parameters
        ----------
        indices : sequence of int

        Returns
        -------
        list of DecodePlan
            For :meth:`raw_decode`.
        """
        return [plan_decode(self.paths[i], seed=self.seed, epoch=self.epoch, index=int(i),
                            transform=self.transform, config=self.decode) for i in self._indices(indices)]

    def raw_decode(self, plans: list[DecodePlan], *, pool_of: "BatchedDataset | None" = None) -> int:
        """Decode the planned files only, from memory, on the pool: the decoder's own limit.

        No file read, header, crop, resize, flip, copy or tokenization: a
        turbo-route file is decoded by libjpeg-turbo at its planned DCT scale,
        a reference-route file by Pillow at full size.

        Parameters
        ----------
        plans : list of DecodePlan
            From :meth:`decode_plan`.
        pool_of : BatchedDataset, optional
            Run on that dataset's pool instead (e.g. one with another thread count).

        Returns
        -------
        int
            Number of images decoded.
        """
        import io

        from PIL import Image

        config = self.decode

        def one(k: int) -> None:
            plan = plans[k]
            try:
                if plan.route == "turbo":
                    decode_jpeg_scaled(plan.data, plan.header, plan.denominator, config)
                else:
                    with Image.open(io.BytesIO(plan.data)) as im:
                        im.load()
            except Exception:  # noqa: BLE001 - a bad file costs what it costs; the batch path reports it
                pass

        (pool_of or self).run_parallel(one, len(plans))
        return len(plans)


# --------------------------------------------------------------------------- sampling


# --------------------------------------------------------------------------- to the device


def _norm_constants(device, mean: Sequence[float], std: Sequence[float]):
    import torch

    key = (str(device), tuple(float(m) for m in mean), tuple(float(s) for s in std))
    with _NORM_LOCK:
        found = _NORM_CACHE.get(key)
        if found is None:
            if len(key[1]) != 3 or len(key[2]) != 3 or any(s <= 0 for s in key[2]):
                raise ParameterError(f"mean and std need 3 values each, std > 0; got mean={mean!r}, std={std!r}")
            m = torch.tensor(key[1], dtype=torch.float64)
            s = torch.tensor(key[2], dtype=torch.float64)
            scale = (1.0 / (255.0 * s)).to(torch.float32).view(1, 3, 1, 1).to(device)
            shift = (m / s).to(torch.float32).view(1, 3, 1, 1).to(device)
            found = _NORM_CACHE[key] = (scale, shift)
    return found


def to_device_batch(batch: dict, acc, *, non_blocking: bool = False, mean: Sequence[float] = IMAGENET_MEAN,
                    std: Sequence[float] = IMAGENET_STD):
    """Copy a uint8 host batch to the device, then convert and normalize it there, once per batch.

    ``images = (uint8 / 255 - mean) / std``, computed as ``uint8 * (1 / (255 std))
    - mean / std`` in float32 on the device (same values as the baseline's
    NumPy normalization to within 1e-6), laid out NCHW-contiguous (the
    baseline's layout; NPU kernels want NCHW, see the fact-check, section 8).

    With ``non_blocking=True`` on a device that supports it, and a pinned
    source, the copies are asynchronous; a device event is recorded after them
    and left on ``batch["image"]`` so that :class:`BatchedDataset` does not
    overwrite that buffer before the copy has read it.

    Parameters
    ----------
    batch : dict
        A host batch (``image`` uint8 (B, S, S, 3), ``tokens``, ``label``).
    acc : helpers.device.Accelerator
    non_blocking : bool, default False
    mean, std : 3 floats
        Normalization for values in [0, 1]; default ImageNet
        (:data:`helpers.pipeline.baseline.IMAGENET_MEAN` / ``IMAGENET_STD``).

    Returns
    -------
    (images, tokens, labels)
        float32 (B, 3, S, S) normalized, int64 (B, L), int64 (B,), on ``acc.device``.

    Raises
    ------
    ParameterError
        If ``batch["image"]`` is not a uint8 (B, S, S, 3) tensor (e.g. a
        baseline float batch: use ``helpers.jobs.ppo.host_to_device``).
    """
    import torch

    image = batch["image"]
    if not isinstance(image, torch.Tensor) or image.dtype != torch.uint8 or image.dim() != 4 or image.shape[-1] != 3:
        raise ParameterError(
            "to_device_batch expects batch['image'] as a uint8 (B, S, S, 3) tensor (a host batch of "
            f"BatchedDataset), got {getattr(image, 'dtype', type(image).__name__)} "
            f"{tuple(getattr(image, 'shape', ()))}; a baseline float batch goes through helpers.jobs.ppo.host_to_device"
        )
    nb = bool(non_blocking and acc.capabilities.non_blocking_copy.available)
    device = acc.device
    img = image.to(device, non_blocking=nb)
    tokens = batch["tokens"].to(device, non_blocking=nb)
    labels = batch["label"].to(device, non_blocking=nb)
    if nb and image.device.type == "cpu" and _is_pinned(image):
        event = acc.new_event()
        if event is not None:
            event.record()
            setattr(image, _FENCE_ATTR, event)
    scale, shift = _norm_constants(device, mean, std)
    b, s1, s2, _ = img.shape
    x = torch.empty((b, 3, s1, s2), dtype=torch.float32, device=device)
    torch.mul(img.permute(0, 3, 1, 2), scale, out=x)
    x.sub_(shift)
    return x, tokens, labels


def torch_from(array: np.ndarray):
    """``torch.from_numpy`` (imported lazily: this module does no work at import time)."""
    import torch

    return torch.from_numpy(np.ascontiguousarray(array))


def _is_pinned(t) -> bool:
    try:
        return bool(t.is_pinned())
    except RuntimeError:  # CPU-only builds may refuse to answer
        return False


def reference_check(dataset: BatchedDataset, indices: Sequence[int]):
    """Compare a batch built by ``dataset`` with the reference per-image pipeline, image by image.

    Parameters
    ----------
    dataset : BatchedDataset
        Its current epoch, seed, transform and decoder settings are used.
    indices : sequence of int
        The items to check (one batch).

    Returns
    -------
    pandas.DataFrame
        One row per image: ``item``, ``file`` (name), ``route``,
        ``denominator`` (DCT scale 1/d used), ``psnr_db`` (batched vs
        :func:`helpers.pipeline.decode.reference_augment`) and
        ``max_abs_error`` (uint8 levels). A bad file's row has the reason in
        ``route`` and NaN values.
    """
    import pandas as pd

    idx = dataset._indices(indices)
    batch = dataset[idx]
    rows = []
    for k, i in enumerate(idx):
        plan = dataset._plan(int(i))
        name = os.path.basename(str(dataset.paths[i]))
        try:
            ref = reference_augment(dataset.paths[i], seed=dataset.seed, epoch=dataset.epoch, index=int(i),
                                    transform=dataset.transform)
        except BadImage as exc:
            rows.append({"item": int(i), "file": name, "route": f"bad: {exc.reason}", "denominator": 0,
                         "psnr_db": math.nan, "max_abs_error": math.nan})
            continue
        got = batch["image"][k].numpy()
        rows.append({"item": int(i), "file": name, "route": plan.route if plan else "bad",
                     "denominator": plan.denominator if plan else 0, "psnr_db": psnr(got, ref),
                     "max_abs_error": int(np.abs(got.astype(np.int16) - ref).max())})
    return pd.DataFrame(rows, columns=["item", "file", "route", "denominator", "psnr_db", "max_abs_error"])
