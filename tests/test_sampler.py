"""The one batch order: per-epoch permutations from (seed, epoch), one epoch or a fixed number of batches."""

from __future__ import annotations

import pytest

from helpers.errors import DataError, ParameterError
from helpers.pipeline.loader import LoaderConfig, make_batch_sampler
from helpers.pipeline.sampler import EpochBatchSampler, batch_sampler


def test_an_epoch_is_a_permutation_and_the_next_epoch_another():
    s = batch_sampler(10, 3, seed=5)
    e0, e1 = list(s), list(s)
    assert len(e0) == len(e1) == 3 and all(len(b) == 3 for b in e0 + e1)
    assert len({i for b in e0 for i in b}) == 9 and e0 != e1
    assert e0 == EpochBatchSampler(10, 3, seed=5).batches(0) and e1 == s.batches(1)


def test_num_batches_continues_into_the_next_epochs_orders():
    s = EpochBatchSampler(5, 2, seed=1, num_batches=6)
    got = list(s)
    assert len(s) == 6 and len(got) == 6 and all(len(b) == 2 for b in got)
    flat = [i for b in got for i in b]
    assert flat == s.order(0).tolist() + s.order(1).tolist() + s.order(2).tolist()[:2]
    assert s.epoch == 3  # three epochs' orders were drawn
    # a trial longer than a tiny dataset: 3 items, batches of 8
    assert [len(b) for b in EpochBatchSampler(3, 8, num_batches=2)] == [8, 8]


def test_make_batch_sampler_is_the_same_order_from_a_config():
    cfg = LoaderConfig(batch_size=3, seed=5)
    assert list(make_batch_sampler(10, cfg)) == EpochBatchSampler(10, 3, seed=5).batches(0)
    assert list(make_batch_sampler(4, LoaderConfig(batch_size=3, shuffle=False, drop_last=False))) == [[0, 1, 2], [3]]


def test_bad_sizes_are_rejected():
    with pytest.raises(DataError, match="fewer than batch_size=3"):
        EpochBatchSampler(2, 3)
    with pytest.raises(ParameterError, match="num_batches"):
        EpochBatchSampler(5, 2, num_batches=0)
    with pytest.raises(DataError, match="no item"):
        EpochBatchSampler(0, 2, num_batches=1)
    with pytest.raises(ParameterError, match="batch_size"):
        EpochBatchSampler(5, 0)


def test_each_batch_carries_its_epoch_and_keeps_it_through_pickling():
    import pickle

    from helpers.pipeline.sampler import EpochIndices, batch_epoch

    s = EpochBatchSampler(8, 4, seed=2)
    first, second = list(s), list(s)
    assert {b.epoch for b in first} == {0} and {b.epoch for b in second} == {1}
    back = pickle.loads(pickle.dumps(second[0]))
    assert isinstance(back, EpochIndices) and back == second[0] and back.epoch == 1
    assert [b.epoch for b in EpochBatchSampler(5, 2, num_batches=4)] == [0, 0, 0, 1]  # the 3rd spans epochs 0-1
    assert batch_epoch([1, 2], 7) == 7 and batch_epoch(back, 7) == 1
