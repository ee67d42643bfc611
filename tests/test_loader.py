"""DataLoader configuration: validation, kwargs, pinning, start method, samplers, loaders (helpers.pipeline.loader).

Seeding, guarded iteration, worker memory and notebook 03's sweep are tested
in test_loader_seeding.py, test_loader_guarded.py,
test_loader_worker_memory.py and test_loader_sweep.py. Multi-worker tests are
few and small (this machine has 2 cores); each one checks that no worker
process is left behind.
"""

from __future__ import annotations

import logging
import multiprocessing
import warnings
from types import SimpleNamespace

import psutil
import pytest
import torch
from loader_support import FORK, Numbers, no_stray_workers  # noqa: F401  (no_stray_workers: a fixture)
from torch.utils.data import DataLoader

from helpers.device import Capabilities, Capability, get_accelerator
from helpers.errors import DataError, ParameterError
from helpers.pipeline import loader as L
from helpers.pipeline import seeding
from helpers.pipeline.guarded import iterate
from helpers.pipeline.loader import (
    LoaderConfig,
    close_loader,
    make_batch_sampler,
    make_loader,
    pin_memory_decision,
    start_method,
)
from helpers.pipeline.seeding import worker_init_fn


# --------------------------------------------------------------------------- configuration


def test_prefetch_factor_without_workers_is_refused_with_the_reason():
    with pytest.raises(ParameterError) as exc:
        LoaderConfig(batch_size=8, num_workers=0, prefetch_factor=4)
    msg = str(exc.value)
    assert "prefetch_factor=4" in msg and "only with num_workers > 0" in msg and "num_workers=0" in msg
    assert "prefetch_factor=None" in msg  # what to do


def test_persistent_workers_without_workers_is_refused():
    with pytest.raises(ParameterError, match=r"persistent_workers=True applies only with num_workers > 0"):
        LoaderConfig(batch_size=8, persistent_workers=True)


def test_every_problem_is_reported_at_once():
    with pytest.raises(ParameterError) as exc:
        LoaderConfig(batch_size=0, num_workers=-1, timeout_s=0.0, multiprocessing_context="threads", seed=-3,
                     shuffle="yes")
    msg = str(exc.value)
    for part in ("batch_size=0", "num_workers=-1", "timeout_s=0.0", "multiprocessing_context='threads'",
                 "seed=-3", "shuffle='yes'"):
        assert part in msg, part
    assert "allowed" in msg


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0, True])
def test_timeout_must_be_a_finite_positive_number(bad):
    with pytest.raises(ParameterError, match="timeout_s"):
        LoaderConfig(batch_size=4, num_workers=1, timeout_s=bad)


def test_more_workers_than_cores_is_allowed_with_a_warning(caplog, monkeypatch):
    monkeypatch.setattr(L, "usable_cores", lambda: 2)
    monkeypatch.setattr(L, "_CORE_WARNING_SHOWN", set())
    with caplog.at_level(logging.WARNING, logger="helpers.pipeline.loader"):
        cfg = LoaderConfig(batch_size=4, num_workers=5)
    assert cfg.num_workers == 5
    assert any("num_workers=5" in r.getMessage() and "2 usable" in r.getMessage() for r in caplog.records)


def test_the_core_count_warning_is_shown_once_per_process(caplog, monkeypatch):
    monkeypatch.setattr(L, "usable_cores", lambda: 2)
    monkeypatch.setattr(L, "_CORE_WARNING_SHOWN", set())
    with caplog.at_level(logging.WARNING, logger="helpers.pipeline.loader"):
        cfg = LoaderConfig(batch_size=4, num_workers=4, prefetch_factor=2)
        for pf in (2, 4):  # what a sweep does: many configs with the same worker counts
            cfg.with_(prefetch_factor=pf)
        LoaderConfig(batch_size=4, num_workers=3)
    warned = [r for r in caplog.records if "usable CPU core" in r.getMessage()]
    assert len(warned) == 1 and "num_workers=4" in warned[0].getMessage()


def test_torchs_duplicate_worker_count_warning_is_hidden(monkeypatch, recwarn):
    # torch compares num_workers with torch._utils.cpu_count() when a loader is built and at every epoch
    monkeypatch.setattr(torch._utils, "cpu_count", lambda: 1)
    monkeypatch.setattr(L, "_CORE_WARNING_SHOWN", {2})  # ours was already shown
    cfg = LoaderConfig(batch_size=2, num_workers=2, timeout_s=30)
    DataLoader(list(range(4)), batch_size=2, num_workers=2)  # plain torch warns: the check is live
    assert any("worker processes in total" in str(w.message) for w in recwarn.list)
    recwarn.clear()
    loader = make_loader(Numbers(4), cfg, batch_sampler=make_batch_sampler(4, cfg))
    if FORK:
        with iterate(loader) as it:
            list(it)
    assert not [w for w in recwarn.list if "worker processes in total" in str(w.message)]
    with pytest.warns(UserWarning, match="unrelated"):  # other warnings still pass
        with L.quiet_worker_count_warning():
            warnings.warn("unrelated", UserWarning)


def test_kwargs_without_workers_pass_only_what_applies():
    cfg = LoaderConfig(batch_size=4, seed=3)
    kw = cfg.to_kwargs()
    assert kw["num_workers"] == 0 and kw["batch_size"] == 4 and kw["pin_memory"] is False
    for absent in ("prefetch_factor", "persistent_workers", "timeout", "worker_init_fn", "multiprocessing_context"):
        assert absent not in kw, absent
    assert isinstance(kw["generator"], torch.Generator) and kw["generator"].initial_seed() == 3
    DataLoader(list(range(8)), **kw)  # torch accepts them


def test_kwargs_with_workers_carry_timeout_prefetch_seeded_init():
    cfg = LoaderConfig(batch_size=4, num_workers=2, prefetch_factor=3, persistent_workers=True, timeout_s=7.5,
                       multiprocessing_context="spawn")
    kw = cfg.to_kwargs(rank=3)
    assert kw["prefetch_factor"] == 3 and kw["persistent_workers"] is True and kw["timeout"] == 7.5
    assert kw["multiprocessing_context"] == "spawn"
    assert kw["worker_init_fn"].func is worker_init_fn and kw["worker_init_fn"].keywords == {"rank": 3}
    loader = DataLoader(list(range(8)), **kw)
    assert loader.prefetch_factor == 3 and loader.timeout == 7.5


def test_kwargs_for_a_batched_dataset_use_the_sampler_and_no_batch_size():
    cfg = LoaderConfig(batch_size=4, num_workers=1)
    sampler = make_batch_sampler(10, cfg)
    kw = cfg.to_kwargs(batch_sampler=sampler)
    assert kw["batch_size"] is None and kw["sampler"] is sampler
    assert "shuffle" not in kw and "drop_last" not in kw


def test_pinning_is_decided_by_the_device_and_refused_on_cpu(caplog):
    cpu = get_accelerator("cpu")
    with caplog.at_level(logging.INFO, logger="helpers.pipeline.loader"):
        decision = pin_memory_decision(True, cpu)
    assert decision.pin is False and "not available on cpu" in decision.reason
    assert any("pin_memory off" in r.getMessage() for r in caplog.records)
    assert LoaderConfig(batch_size=2, pin_memory=True).to_kwargs(cpu)["pin_memory"] is False
    assert pin_memory_decision(True, None).pin is False
    assert pin_memory_decision(False, cpu).reason == "pin_memory was not requested"


def test_pinning_is_granted_where_the_device_can_pin():
    caps = Capabilities(*(Capability(True, "fake") for _ in range(6)))
    fake = SimpleNamespace(kind="cuda", capabilities=caps)
    assert pin_memory_decision(True, fake).pin is True
    assert LoaderConfig(batch_size=2, pin_memory=True).to_kwargs(fake)["pin_memory"] is True


def test_start_method_is_reported_without_fixing_it():
    before = multiprocessing.get_start_method(allow_none=True)
    sm = start_method()
    assert sm.method in multiprocessing.get_all_start_methods() and sm.source and sm.explanation
    assert multiprocessing.get_start_method(allow_none=True) == before
    assert start_method(LoaderConfig(batch_size=2, num_workers=1, multiprocessing_context="spawn")).method == "spawn"


def test_current_rank_is_the_one_the_workers_are_seeded_with():
    # defined beside worker_init_fn, which reads it in the worker; re-exported here for the loader's users
    assert L.current_rank is seeding.current_rank


# --------------------------------------------------------------------------- samplers and loaders


def test_batch_sampler_is_seeded_and_can_outrun_the_dataset():
    cfg = LoaderConfig(batch_size=4, seed=1)
    a = list(make_batch_sampler(10, cfg, num_batches=6))
    b = list(make_batch_sampler(10, cfg, num_batches=6))
    assert a == b and len(a) == 6 and all(len(x) == 4 for x in a)
    flat = [i for batch in a for i in batch]
    assert sorted(flat[:10]) == list(range(10))  # one full permutation first
    assert list(make_batch_sampler(10, cfg.with_(shuffle=False), num_batches=3)) == [[0, 1, 2, 3], [4, 5, 6, 7],
                                                                                  [8, 9, 0, 1]]


def test_fewer_images_than_a_batch_is_a_clear_error():
    cfg = LoaderConfig(batch_size=8)
    with pytest.raises(DataError, match=r"3 item\(s\), fewer than batch_size=8"):
        make_loader(list(range(3)), cfg)
    with pytest.raises(DataError, match="batch_size=8"):
        make_batch_sampler(3, cfg)
    with pytest.raises(DataError, match="at least one"):
        make_batch_sampler(0, cfg)
    assert len(make_loader(list(range(3)), cfg.with_(drop_last=False))) == 1


@pytest.mark.skipif(not FORK, reason="needs the fork start method (Linux)")
def test_persistent_workers_are_reused_then_closed(no_stray_workers):
    cfg = LoaderConfig(batch_size=4, num_workers=1, persistent_workers=True, timeout_s=30)
    loader = make_loader(Numbers(8), cfg, batch_sampler=make_batch_sampler(8, cfg))
    with iterate(loader) as first:
        list(first)
        pids = first.worker_pids
    with iterate(loader) as second:
        list(second)
        assert second.worker_pids == pids  # the same worker served the second epoch
    assert psutil.pid_exists(pids[0])
    close_loader(loader)
    assert loader._iterator is None
    try:
        psutil.Process(pids[0]).wait(timeout=10)
    except psutil.NoSuchProcess:
        pass
    assert not psutil.pid_exists(pids[0])
