"""The measurements of notebook 02 and of ``bench input-pipeline`` on one dataset: :class:`DecodeBench`.

Its interleaved comparisons (preprocessing speedup, decode efficiency against the raw decoder, thread scaling,
decoder flags, GPU decode, tokenization, the decode-once cache) time the mechanisms of this package:
:class:`helpers.pipeline.fast.BatchedDataset`, :func:`helpers.pipeline.fast.to_device_batch`,
:class:`helpers.pipeline.baseline.BaselineDataset` and the decoder routes of :mod:`helpers.pipeline.decode`. The
variants carry the labels defined here (:data:`BASELINE_LABEL` and the others), so that each number carries the
name of what was timed. Notebook 02's experiment, which runs them and decides, is :mod:`helpers.experiments.decode`.
"""

from __future__ import annotations

import itertools
from typing import Callable, Sequence

from helpers.errors import DeviceUnavailableError
from helpers.pipeline.baseline import BaselineDataset, collate_batch, host_to_device
from helpers.pipeline.decode import DecodeConfig, cuda_decode_support, decode_augment_cuda, psnr, reference_augment
from helpers.pipeline.fast import BatchedDataset, to_device_batch, torch_from
from helpers.pipeline.sampler import EpochBatchSampler, check_int
from helpers.pipeline.text import encode_batch, encode_one
from helpers.timing import Comparison, Measurement, compare, measure

__all__ = ["BASELINE_LABEL", "BATCHED_DEVICE_LABEL", "BATCHED_HOST_LABEL", "CACHED_LABEL", "RAW_DECODE_LABEL",
           "DecodeBench"]

#: Names of the measured variants, used alike by the comparisons, the records, the figures and the bench,
#: so that each number carries the name of what was timed:
#: the per-image baseline (``BaselineDataset`` items + ``collate_batch`` + copy to the device),
BASELINE_LABEL = "per-image baseline"
#: the batched pipeline up to a normalized float batch on the device (``dataset[indices]`` + ``to_device_batch``),
BATCHED_DEVICE_LABEL = "batched + device normalize"
#: the batched pipeline up to the uint8 host batch only (``dataset[indices]``),
BATCHED_HOST_LABEL = "batched (host)"
#: and the decoder alone, from bytes in memory, same DCT scales and thread pool (``raw_decode``).
RAW_DECODE_LABEL = "raw decode only"
#: the batched pipeline reading the decode-once cache (``CachedDataset[indices]``, uint8 host batch).
CACHED_LABEL = "decode-once cache (host)"


class DecodeBench:
    """The measurements of notebook 02 and of ``bench input-pipeline``, on one dataset.

    All variants see the same batches (drawn once from :func:`batch_sampler`
    with ``seed``, epoch 0) in the same order. Each figure comes from one
    interleaved comparison, and its variants carry the module's labels:

    * the **preprocessing speedup** (:meth:`compare_preprocess`):
      :data:`BATCHED_DEVICE_LABEL` over :data:`BASELINE_LABEL`, both ending
      with a normalized float batch on the device;
    * the **decode efficiency** (:meth:`compare_raw_decode`):
      :data:`BATCHED_HOST_LABEL` over :data:`RAW_DECODE_LABEL`, the batched
      rate over the raw decode-only rate of the same decoder at the same
      thread count. Both stop at the host (the raw decode has no device
      step), so the device copy and normalization are not part of it.

    The two batched rates differ by the device step and are never
    interchangeable: quote the efficiency with the rates of its own
    comparison.

    Parameters
    ----------
    dataset : BatchedDataset
    acc : helpers.device.Accelerator
    batch_size : int
    repeats, warmup : int
        Timed and untimed calls per variant (``helpers.timing``).
    seed : int, default 0
    """

    def __init__(self, dataset: BatchedDataset, acc, *, batch_size: int, repeats: int = 10, warmup: int = 2,
                 seed: int = 0) -> None:
        self.dataset = dataset
        self.acc = acc
        self.batch_size = check_int("batch_size", batch_size, 1)
        self.repeats = check_int("repeats", repeats, 1)
        self.warmup = check_int("warmup", warmup, 0)
        self.seed = seed
        dataset.set_epoch(0)
        self.batches = EpochBatchSampler(len(dataset), self.batch_size, seed=seed).batches(0)
        self.baseline = BaselineDataset(dataset.index, dataset.tokenizer, image_size=dataset.image_size,
                                        text_len=dataset.text_len, seed=dataset.seed, transform=dataset.transform)
        self._plans: dict[int, list] = {}

    def _cycle(self) -> Callable[[], list[int]]:
        it = itertools.cycle(self.batches)
        return lambda: next(it)

    def baseline_batch(self, indices: Sequence[int]):
        """The per-image way: ``BaselineDataset`` items, ``collate_batch``, copy to the device."""

        return host_to_device(collate_batch([self.baseline[i] for i in indices]), self.acc)

    def batched_batch(self, indices: Sequence[int]):
        """The batched way: ``dataset[indices]`` then :func:`to_device_batch`."""
        return to_device_batch(self.dataset[list(indices)], self.acc)

    def compare_preprocess(self) -> "Comparison":
        """The preprocessing speedup: per-image baseline (A) vs batched + device normalize (B), interleaved.

        Both variants end with a normalized float32 batch on the device,
        synchronized: A is :meth:`baseline_batch`, B :meth:`batched_batch`.

        Returns
        -------
        helpers.timing.Comparison
            Named (:data:`BASELINE_LABEL`, :data:`BATCHED_DEVICE_LABEL`);
            ratio = images/s of B over images/s of A.
        """

        next_a, next_b = self._cycle(), self._cycle()
        return compare(lambda: self.baseline_batch(next_a()), lambda: self.batched_batch(next_b()),
                       repeats=self.repeats, warmup=self.warmup, sync=self.acc.synchronize,
                       names=(BASELINE_LABEL, BATCHED_DEVICE_LABEL), items_per_call=self.batch_size,
                       seed=self.seed)

    def measure_batched(self) -> Measurement:
        """The batched pipeline alone: :meth:`batched_batch` on this bench's batches, in order.

        The B side of :meth:`compare_preprocess` timed on its own (:func:`helpers.timing.measure`: ``warmup``
        untimed batches, then ``repeats`` batches, each closed by a device synchronize), for a "try it" point.

        Returns
        -------
        helpers.timing.Measurement
            Named :data:`BATCHED_DEVICE_LABEL`; ``rate`` in images/s (``items_per_call`` = ``batch_size``).
        """
        next_b = self._cycle()
        return measure(lambda: self.batched_batch(next_b()), repeats=self.repeats, warmup=self.warmup,
                       sync=self.acc.synchronize, name=BATCHED_DEVICE_LABEL, items_per_call=self.batch_size)

    def _plan(self, k: int) -> list:
        if k not in self._plans:
            self._plans[k] = self.dataset.decode_plan(self.batches[k])
        return self._plans[k]

    def compare_raw_decode(self, against=None) -> "Comparison":
        """The decode efficiency: raw decode only (A) vs batched (host) (B), interleaved.

        With ``against`` (a :class:`helpers.pipeline.image_cache.CachedDataset` over the same index), B is that
        dataset's host batch instead, named :data:`CACHED_LABEL`: the decode-once cache against the decoder's
        own limit.

        A decodes the batch's files from bytes already in memory at the
        planned DCT scales on the dataset's pool (:meth:`BatchedDataset.raw_decode`);
        B builds the uint8 host batch, ``dataset[indices]`` (read, header, crop
        draw, decode, resize, flip, copy into the batch, tokenization), with
        the same decoder and thread count. Neither touches the device.

        Returns
        -------
        helpers.timing.Comparison
            Named (:data:`RAW_DECODE_LABEL`, :data:`BATCHED_HOST_LABEL`). Its
            ratio (median A / median B) is the decode efficiency: batched
            (host) images/s over raw decode-only images/s, 1.0 when everything
            but the decode costs nothing.
        """

        n = len(self.batches)
        order_a, order_b = itertools.cycle(range(n)), self._cycle()
        for k in range(min(n, self.repeats + self.warmup)):
            self._plan(k)
        other = self.dataset if against is None else against
        if against is not None:
            against.set_epoch(0)
        return compare(lambda: self.dataset.raw_decode(self._plan(next(order_a))),
                       lambda: other[order_b()],
                       repeats=self.repeats, warmup=self.warmup,
                       names=(RAW_DECODE_LABEL, BATCHED_HOST_LABEL if against is None else CACHED_LABEL),
                       items_per_call=self.batch_size, seed=self.seed)

    def cache_psnr(self, cached, n_batches: int = 2) -> list[float]:
        """PSNR (dB) of the decode-once cache's crops against the per-image reference, on the first batches.

        Parameters
        ----------
        cached : helpers.pipeline.image_cache.CachedDataset
            Over this bench's index, transform and seed.
        n_batches : int
            Batches of :attr:`batches` checked.

        Returns
        -------
        list of float
            One value per image, in batch order.
        """
        cached.set_epoch(0)
        out: list[float] = []
        for indices in self.batches[:n_batches]:
            imgs = cached[indices]["image"].numpy()
            out += [psnr(imgs[k], reference_augment(cached.paths[i], seed=cached.seed, epoch=0, index=int(i),
                                                    transform=cached.transform)) for k, i in enumerate(indices)]
        return out

    def compare_cache(self, cached) -> "Comparison":
        """The decode-once cache: batched (host) (A) vs the cached pipeline (B), interleaved, same batches.

        Parameters
        ----------
        cached : helpers.pipeline.image_cache.CachedDataset
            Over the same index, transform and seed as this bench's dataset.

        Returns
        -------
        helpers.timing.Comparison
            Named (:data:`BATCHED_HOST_LABEL`, :data:`CACHED_LABEL`); ratio = images/s of the cached batches over
            the batched decode's. Both stop at the uint8 host batch.
        """
        cached.set_epoch(0)
        next_a, next_b = self._cycle(), self._cycle()
        return compare(lambda: self.dataset[next_a()], lambda: cached[next_b()], repeats=self.repeats,
                       warmup=self.warmup, names=(BATCHED_HOST_LABEL, CACHED_LABEL), items_per_call=self.batch_size,
                       seed=self.seed)

    def compare_threads(self, threads: int = 1) -> "Comparison":
        """Raw decode with ``threads`` threads (A) vs the dataset's thread count (B).

        The ratio is the speedup of the dataset's pool over ``threads``
        threads: near the thread ratio when the decoder releases the GIL,
        near 1 when it does not.
        """

        other = BatchedDataset(self.dataset.index, self.dataset.tokenizer, image_size=self.dataset.image_size,
                               text_len=self.dataset.text_len, seed=self.dataset.seed, threads=threads,
                               transform=self.dataset.transform, decode=self.dataset.decode, buffers=0)
        n = len(self.batches)
        for k in range(min(n, self.repeats + self.warmup)):
            self._plan(k)
        order_a, order_b = itertools.cycle(range(n)), itertools.cycle(range(n))
        try:
            return compare(lambda: self.dataset.raw_decode(self._plan(next(order_a)), pool_of=other),
                           lambda: self.dataset.raw_decode(self._plan(next(order_b))),
                           repeats=self.repeats, warmup=self.warmup,
                           names=(f"raw decode, {threads} thread(s)", f"raw decode, {self.dataset.threads} threads"),
                           items_per_call=self.batch_size, seed=self.seed)
        finally:
            other.close()

    def compare_decoder_flags(self, config: DecodeConfig) -> "Comparison":
        """Raw decode with the dataset's decoder settings (A) vs ``config`` (B), same files and scales.

        The ratio is the decode speedup of ``config`` (e.g. ``fastdct`` and
        ``fastupsample`` on).
        """

        other = BatchedDataset(self.dataset.index, self.dataset.tokenizer, image_size=self.dataset.image_size,
                               text_len=self.dataset.text_len, seed=self.dataset.seed,
                               threads=self.dataset.requested_threads, transform=self.dataset.transform,
                               decode=config, buffers=0)
        n = len(self.batches)
        for k in range(min(n, self.repeats + self.warmup)):
            self._plan(k)
        order_a, order_b = itertools.cycle(range(n)), itertools.cycle(range(n))
        try:
            return compare(lambda: self.dataset.raw_decode(self._plan(next(order_a))),
                           lambda: other.raw_decode(self._plan(next(order_b))),
                           repeats=self.repeats, warmup=self.warmup, names=("default decoder", "fast flags"),
                           items_per_call=self.batch_size, seed=self.seed)
        finally:
            other.close()

    def compare_gpu_decode(self) -> tuple["Comparison", list[float]]:
        """Batched + device normalize (A) vs GPU decode + device normalize (B), both to a normalized batch.

        B plans on the CPU (read, header, crop draw) and decodes, crops,
        resizes and flips on the GPU (:func:`helpers.pipeline.decode.decode_augment_cuda`).
        Only turbo-route files (colour or grey JPEGs) are used, in both variants.

        Returns
        -------
        (Comparison, list of float)
            The comparison (ratio = images/s of B over A) and the PSNR of
            each GPU-decoded image of the first batch against the reference.

        Raises
        ------
        helpers.errors.DeviceUnavailableError
            Where GPU decode is not available (see ``cuda_decode_support``).
        """

        ok, why = cuda_decode_support(self.acc)
        if not ok:
            raise DeviceUnavailableError(f"batched GPU decode is not available here: {why}")
        ds = self.dataset
        jpeg_batches = []
        for k in range(len(self.batches)):
            keep = [p.index for p in self._plan(k) if p.route == "turbo"]
            if keep:
                jpeg_batches.append(keep)
        first = jpeg_batches[0]
        gpu = decode_augment_cuda(ds.decode_plan(first), ds.image_size, self.acc).cpu().numpy()
        quality = [psnr(gpu[k], reference_augment(ds.paths[i], seed=ds.seed, epoch=ds.epoch, index=i,
                                                  transform=ds.transform)) for k, i in enumerate(first)]
        it_a, it_b = itertools.cycle(jpeg_batches), itertools.cycle(jpeg_batches)

        def gpu_batch():
            b = next(it_b)
            images = decode_augment_cuda(ds.decode_plan(b), ds.image_size, self.acc)
            tokens = torch_from(encode_batch(ds.tokenizer, ds.captions[b], ds.text_len))
            return to_device_batch({"image": images, "tokens": tokens, "label": torch_from(ds.labels[b])}, self.acc)

        comparison = compare(lambda: to_device_batch(ds[next(it_a)], self.acc), gpu_batch,
                             repeats=self.repeats, warmup=self.warmup, sync=self.acc.synchronize,
                             names=(f"{BATCHED_DEVICE_LABEL} (CPU decode)", "GPU decode + device normalize"),
                             items_per_call=(float(len(first)), float(len(first))), seed=self.seed)
        return comparison, quality

    def compare_tokenize(self) -> "Comparison":
        """Per-sample ``encode_one`` (A) vs one ``encode_batch`` (B) on the same captions."""

        ds = self.dataset
        next_a, next_b = self._cycle(), self._cycle()

        def per_sample():
            for i in next_a():
                encode_one(ds.tokenizer, str(ds.captions[i]), ds.text_len)

        return compare(per_sample, lambda: encode_batch(ds.tokenizer, ds.captions[next_b()], ds.text_len),
                       repeats=self.repeats, warmup=self.warmup, names=("per-sample encode", "encode_batch"),
                       items_per_call=self.batch_size, seed=self.seed)

    def tokenize_share(self, *, host_s: float | None = None, baseline_s: float | None = None
                       ) -> dict[str, float]:
        """Tokenization's share of preprocessing time, batched and per-sample.

        Parameters
        ----------
        host_s : float, optional
            Median seconds per batch of :data:`BATCHED_HOST_LABEL`
            (``dataset[indices]``), e.g. ``compare_raw_decode().b.median_s``;
            measured here otherwise.
        baseline_s : float, optional
            Median seconds per batch of :data:`BASELINE_LABEL` (items,
            ``collate_batch``, copy: :meth:`baseline_batch`), e.g.
            ``compare_preprocess().a.median_s``; measured here otherwise.

        Returns
        -------
        dict
            ``batched_share``: median ``encode_batch`` time of a batch over
            ``host_s`` (tokenization runs on the host, inside
            ``dataset[indices]``); ``per_sample_share``: median per-sample
            tokenization time of a batch over ``baseline_s``; and the four
            medians in seconds (``tokenize_batch_s``, ``tokenize_per_sample_s``,
            ``host_s``, ``baseline_s``).
        """

        ds = self.dataset
        n1, n2, n3, n4 = self._cycle(), self._cycle(), self._cycle(), self._cycle()
        kw = dict(repeats=self.repeats, warmup=self.warmup, items_per_call=self.batch_size)
        tok_b = measure(lambda: encode_batch(ds.tokenizer, ds.captions[n1()], ds.text_len), **kw)
        tok_s = measure(lambda: [encode_one(ds.tokenizer, str(ds.captions[i]), ds.text_len) for i in n2()], **kw)
        if host_s is None:
            host_s = measure(lambda: ds[n3()], **kw).median_s
        if baseline_s is None:
            baseline_s = measure(lambda: self.baseline_batch(n4()), sync=self.acc.synchronize, **kw).median_s
        return {
            "batched_share": tok_b.median_s / host_s,
            "per_sample_share": tok_s.median_s / baseline_s,
            "tokenize_batch_s": tok_b.median_s,
            "tokenize_per_sample_s": tok_s.median_s,
            "host_s": host_s,
            "baseline_s": baseline_s,
        }
