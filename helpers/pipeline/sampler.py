"""The one batch order of the workbook: batches of indices, shuffled per epoch from ``(seed, epoch)``.

Every job draws its batches through :class:`EpochBatchSampler` (the built-in
job's :meth:`helpers.jobs.ppo.PPOJob.batch_sampler`, the loader sweep's
:func:`helpers.pipeline.loader.make_batch_sampler`), so that two pipelines or
two loader settings fed from the same seed see the same samples in the same
order. Use it as ``DataLoader(dataset, batch_size=None, sampler=...)`` with a
batched dataset (``dataset[list_of_indices]`` returns a batch).
"""

from __future__ import annotations

import math
from typing import Iterator

import numpy as np

from helpers.errors import DataError, ParameterError

__all__ = ["EpochBatchSampler", "EpochIndices", "batch_epoch", "batch_sampler", "check_int"]


def check_int(name: str, value, minimum: int) -> int:
    """``value`` as an int, if it is an integer (NumPy's included, bool excluded) >= ``minimum``.

    Raises
    ------
    ParameterError
        Naming ``name``, the value seen and the minimum.
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ParameterError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


class EpochIndices(list):
    """A batch's item indices, tagged with the epoch they belong to.

    DataLoader workers receive the sampler's batches through their index queue, pickled; the tag travels
    with them, so a dataset read in a worker can draw that epoch's augmentations even when the workers are
    persistent and never see the main process's ``set_epoch`` (pytorch/pytorch#97326, the repeated-epoch
    failure of ``persistent_workers=True``).

    Attributes
    ----------
    epoch : int
        The epoch of the sampler's order this batch comes from.
    """

    def __init__(self, indices, epoch: int) -> None:
        super().__init__(indices)
        self.epoch = int(epoch)

    def __reduce__(self):
        return (EpochIndices, (list(self), self.epoch))


def batch_epoch(indices, default: int) -> int:
    """The epoch a batch of indices is tagged with (:class:`EpochIndices`), else ``default``."""
    epoch = getattr(indices, "epoch", None)
    return default if epoch is None else int(epoch)


class EpochBatchSampler:
    """Batches of indices, shuffled per epoch from ``(seed, epoch)``; usable as a DataLoader sampler.

    Each batch is an :class:`EpochIndices` (a list tagged with its epoch), so datasets read in persistent
    DataLoader workers draw the right epoch's augmentations.

    Each iteration yields the batches of one epoch; once it has yielded them
    all, the sampler moves to the next epoch, so re-iterating a DataLoader (as
    ``helpers.compute.train`` does every epoch) gets a new order,
    reproducibly. An iteration abandoned before its end does not advance the
    epoch (DataLoader starts and drops an iterator when it launches workers).
    :meth:`set_epoch` chooses the epoch of the next iteration.

    Parameters
    ----------
    n : int
        Dataset size (items).
    batch_size : int
    seed : int, default 0
    epoch : int, default 0
        Epoch of the first iteration.
    drop_last : bool, default True
        Drop the last incomplete batch.
    shuffle : bool, default True
        False yields 0..n-1 in order.
    num_batches : int, optional
        Batches per iteration. Default: one epoch. More than an epoch holds
        continues into the next epochs' orders (a batch may span two of them),
        so a timing trial can be longer than the dataset; fewer stops early.

    Raises
    ------
    ParameterError
        For invalid sizes or seeds.
    DataError
        If ``drop_last`` and ``n < batch_size`` (no batch at all).
    """

    def __init__(self, n: int, batch_size: int, *, seed: int = 0, epoch: int = 0, drop_last: bool = True,
                 shuffle: bool = True, num_batches: int | None = None) -> None:
        self.n = check_int("n", n, 0)
        self.batch_size = check_int("batch_size", batch_size, 1)
        self.seed = check_int("seed", seed, 0)
        self.epoch = check_int("epoch", epoch, 0)
        self.drop_last = bool(drop_last)
        self.shuffle = bool(shuffle)
        self.num_batches = None if num_batches is None else check_int("num_batches", num_batches, 1)
        if self.num_batches is not None and self.n < 1:
            raise DataError("the dataset holds no item; a sampler needs at least one (check the folder)")
        if self.num_batches is None and self.drop_last and self.n < self.batch_size:
            raise DataError(
                f"the dataset has {self.n} images, fewer than batch_size={self.batch_size}, and drop_last=True "
                "would yield no batch; lower batch_size, add images, or pass drop_last=False"
            )

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch of the next iteration."""
        self.epoch = check_int("epoch", epoch, 0)

    def order(self, epoch: int) -> np.ndarray:
        """The item order of ``epoch``: a permutation drawn from ``(seed, epoch)``, or 0..n-1 without shuffling."""
        if self.shuffle:
            return np.random.default_rng([self.seed, int(epoch)]).permutation(self.n)
        return np.arange(self.n)

    def batches(self, epoch: int) -> list[list[int]]:
        """The batches of one epoch, ``epoch`` (does not change the sampler's epoch; ignores ``num_batches``)."""
        order = self.order(epoch)
        stop = (self.n // self.batch_size) * self.batch_size if self.drop_last else self.n
        return [order[s: s + self.batch_size].tolist() for s in range(0, stop, self.batch_size)]

    def __iter__(self) -> Iterator[list[int]]:
        epoch = self.epoch
        if self.num_batches is not None:
            need, items, epochs, e = self.num_batches * self.batch_size, [], [], epoch
            while len(items) < need:
                order = self.order(e).tolist()
                items.extend(order)
                epochs.extend([e] * len(order))
                e += 1
            for s in range(0, need, self.batch_size):
                yield EpochIndices(items[s: s + self.batch_size], epochs[s])
            if self.epoch == epoch:
                self.epoch = e
            return
        for batch in self.batches(epoch):
            yield EpochIndices(batch, epoch)
        # Move on only once a pass is complete: DataLoader creates (and drops) a sampler
        # iterator more than once when it starts workers, and those must not skip epochs.
        if self.epoch == epoch:
            self.epoch = epoch + 1

    def __len__(self) -> int:
        if self.num_batches is not None:
            return self.num_batches
        return self.n // self.batch_size if self.drop_last else math.ceil(self.n / self.batch_size)


def batch_sampler(n: int, batch_size: int, seed: int = 0, epoch: int = 0, drop_last: bool = True
                  ) -> EpochBatchSampler:
    """Return the sampler to pass as ``DataLoader(dataset, batch_size=None, sampler=...)``.

    Parameters
    ----------
    n : int
        Dataset size.
    batch_size : int
    seed : int, default 0
    epoch : int, default 0
        Epoch of the first pass.
    drop_last : bool, default True

    Returns
    -------
    EpochBatchSampler

    Raises
    ------
    DataError
        If ``drop_last`` and ``n < batch_size``.
    """
    return EpochBatchSampler(n, batch_size, seed=seed, epoch=epoch, drop_last=drop_last)
