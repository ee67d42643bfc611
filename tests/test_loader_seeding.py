"""Per-worker seeding: the reseed protocol, seeds per rank and worker, the rank (helpers.pipeline.seeding)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from helpers.errors import ParameterError
from helpers.pipeline import seeding
from helpers.pipeline.seeding import current_rank, reseed_dataset_rngs, seed_worker, worker_init_fn


class _Transform:
    def __init__(self):
        self.gen = np.random.default_rng(7)


class _RngHolder:
    """A dataset that makes the mistake of pytorch/pytorch#5059 (RNG objects copied into workers) in several ways."""

    def __init__(self):
        self.rng = np.random.default_rng(0)
        self.legacy = np.random.RandomState(0)
        self.torch_rng = torch.Generator().manual_seed(0)
        self.py = random.Random(0)
        self.transform = _Transform()
        self.pipeline = [_Transform(), _Transform()]
        self.same = self.rng  # a second reference: reseeded once, in place
        self.big = [np.random.default_rng(1) for _ in range(seeding.MAX_SCAN_CONTAINER + 1)]

    def draws(self):
        return (self.rng.random(), self.legacy.random_sample(), float(torch.rand((), generator=self.torch_rng)),
                self.py.random(), self.transform.gen.random(), self.pipeline[0].gen.random(),
                self.pipeline[1].gen.random())


def test_reseed_finds_rng_objects_and_reseeds_them_in_place():
    a, b, c = _RngHolder(), _RngHolder(), _RngHolder()
    assert a.draws() == b.draws()  # the mistake: same state everywhere
    rng_id = id(a.rng)
    found = reseed_dataset_rngs(a, 1)
    reseed_dataset_rngs(b, 2)
    reseed_dataset_rngs(c, 1)
    assert set(found) == {"dataset.rng", "dataset.legacy", "dataset.torch_rng", "dataset.py", "dataset.transform.gen",
                          "dataset.pipeline[0].gen", "dataset.pipeline[1].gen"}
    assert id(a.rng) == rng_id and a.same is a.rng
    da, db, dc = a.draws(), b.draws(), c.draws()
    assert da == dc  # reproducible from the seed
    assert all(x != y for x, y in zip(da, db))  # different seeds: every source differs
    assert len(set(da[4:])) == 3  # each object got its own child seed
    assert a.big[0].random() == np.random.default_rng(1).random()  # large containers are not walked


def test_a_reseed_method_takes_precedence():
    class WithHook(_RngHolder):
        def reseed(self, seed):
            self.seen = seed

    ds = WithHook()
    state = ds.rng.bit_generator.state
    assert reseed_dataset_rngs(ds, 5) == ("reseed()",)
    assert isinstance(ds.seen, int) and ds.seen >= 0
    assert ds.rng.bit_generator.state == state  # the hook owns reseeding


def test_seed_worker_differs_per_rank_and_per_worker_seed():
    def draws(worker_seed, rank):
        ds = _RngHolder()
        out = seed_worker(worker_seed, rank, ds)
        return (random.random(), float(np.random.random()), float(torch.rand(())), ds.rng.random()), out

    r0, info = draws(100, 0)
    r1, _ = draws(100, 1)
    r0_again, _ = draws(100, 0)
    w1, _ = draws(101, 0)
    assert r0 == r0_again
    assert all(x != y for x, y in zip(r0, r1)), "same worker seed on two ranks must not repeat"
    assert all(x != y for x, y in zip(r0, w1))
    assert info.rank == 0 and "dataset.rng" in info.reseeded


def test_worker_init_fn_outside_a_worker_is_an_error():
    with pytest.raises(ParameterError, match="outside a DataLoader worker"):
        worker_init_fn(0)


def test_current_rank_reads_env_and_rejects_garbage(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    assert current_rank() == 0
    monkeypatch.setenv("RANK", "3")
    assert current_rank() == 3
    monkeypatch.setenv("RANK", "two")
    with pytest.raises(ParameterError, match="RANK='two'"):
        current_rank()
