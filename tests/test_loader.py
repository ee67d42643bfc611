"""DataLoader configuration, seeding, guarded iteration, worker memory and the sweep (helpers.pipeline.loader).

Multi-worker tests are few and small (this machine has 2 cores); each one
checks that no worker process is left behind.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import random
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import psutil
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from helpers.device import Capabilities, Capability, get_accelerator
from helpers.errors import DataError, ParameterError
from helpers.pipeline import loader as L
from helpers.pipeline.loader import (
    FaultyDataset,
    LoaderConfig,
    LoaderSetting,
    MetadataDataset,
    SkipLog,
    batches_equal,
    close_loader,
    current_rank,
    explain_loader_error,
    iterate,
    make_batch_sampler,
    make_loader,
    measure_epoch_memory,
    pin_memory_decision,
    reseed_dataset_rngs,
    run_epoch,
    run_sweep,
    seed_worker,
    start_method,
    sweep_settings,
    worker_init_fn,
)

FORK = "fork" in multiprocessing.get_all_start_methods()


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)
            if "resource_tracker" not in " ".join(_cmdline(p)) and p.status() != psutil.STATUS_ZOMBIE}


def _cmdline(p) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


@pytest.fixture
def no_stray_workers():
    """Fail if a test leaves a worker process running."""
    before = _children()
    yield
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _children() - before:
        time.sleep(0.1)
    assert _children() - before == set(), "worker processes left behind"


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
    loader = make_loader(_Numbers(4), cfg, batch_sampler=make_batch_sampler(4, cfg))
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


# --------------------------------------------------------------------------- seeding


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
        self.big = [np.random.default_rng(1) for _ in range(L.MAX_SCAN_CONTAINER + 1)]

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


# --------------------------------------------------------------------------- samplers and loaders


class _Numbers(Dataset):
    """Batched dataset: item i is the number i (module level: workers can import it)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, indices):
        idx = torch.as_tensor(indices, dtype=torch.int64)
        return {"label": idx, "image": (idx * 3).to(torch.uint8)}


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


def test_asking_for_more_batches_than_an_epoch_makes_is_a_data_error_that_says_what_to_change():
    cfg = LoaderConfig(batch_size=8)
    loader = make_loader(_Numbers(12), cfg, batch_sampler=make_batch_sampler(12, cfg))  # one batch per epoch
    with iterate(loader, name="first batches") as it:
        with pytest.raises(DataError) as exc:
            it.take(2)
    msg = str(exc.value)
    assert exc.value.__cause__ is None and exc.value.__suppress_context__  # no bare StopIteration behind it
    assert "first batches" in msg and "after 1 batch(es) but 2 were asked for" in msg
    assert "12 item(s)" in msg and "batch_size=8" in msg and "lower the batch size" in msg
    assert "num_batches=2" in msg
    # the fix it names works: the sampler iterates across epochs
    loader = make_loader(_Numbers(12), cfg, batch_sampler=make_batch_sampler(12, cfg, num_batches=2))
    with iterate(loader) as it:
        got = it.take(2)
    assert len(got) == 2 and all(b["label"].shape == (8,) for b in got)
    with pytest.raises(ParameterError):
        it.take(-1)


@pytest.mark.skipif(not FORK, reason="needs the fork start method (Linux)")
def test_workers_give_the_same_batches_as_the_main_process(no_stray_workers):
    base = LoaderConfig(batch_size=4, seed=5)
    ds = _Numbers(24)
    ref = [b for b in make_loader(ds, base, batch_sampler=make_batch_sampler(24, base))]
    cfg = base.with_(num_workers=2, prefetch_factor=2, timeout_s=30)
    got = list(iterate(make_loader(ds, cfg, batch_sampler=make_batch_sampler(24, cfg))))
    assert len(got) == len(ref) == 6
    assert all(batches_equal(x, y) for x, y in zip(ref, got))
    assert not batches_equal(ref[0], ref[1])


# --------------------------------------------------------------------------- failures become DataErrors


@pytest.mark.skipif(not FORK, reason="needs the fork start method (Linux)")
def test_a_hung_worker_becomes_an_error_within_the_timeout(no_stray_workers):
    loader = make_loader(FaultyDataset(8, "hang"), LoaderConfig(batch_size=2, num_workers=1, timeout_s=1.0))
    t0 = time.perf_counter()
    with pytest.raises(DataError) as exc:
        run_epoch(loader, name="hang test")
    elapsed = time.perf_counter() - t0
    msg = str(exc.value)
    assert "hang test" in msg and "timeout=1 s" in msg and "num_workers=1" in msg and "__getitem__" in msg
    assert elapsed < 1.0 + L._TORCH_WORKER_JOIN_S + 5  # the timeout, plus stopping the stuck worker


@pytest.mark.skipif(not FORK, reason="needs the fork start method (Linux)")
def test_a_worker_that_exits_becomes_a_clear_error(no_stray_workers):
    loader = make_loader(FaultyDataset(8, "exit"), LoaderConfig(batch_size=2, num_workers=2, timeout_s=30.0))
    with pytest.raises(DataError) as exc:
        run_epoch(loader, name="exit test")
    msg = str(exc.value)
    assert "worker process died" in msg and "num_workers=2" in msg and "num_workers=0" in msg
    assert isinstance(exc.value.__cause__, RuntimeError)


@pytest.mark.skipif(not FORK, reason="needs the fork start method (Linux)")
def test_a_worker_dying_while_the_epoch_starts_is_a_clear_error_too(monkeypatch, no_stray_workers):
    # a worker that exits at once makes torch's SIGCHLD handler raise while iterate() looks the workers up
    def dying(before):
        raise RuntimeError("DataLoader worker (pid 1) exited unexpectedly with exit code 1. Details are lost")

    monkeypatch.setattr(L, "_new_workers", dying)
    loader = make_loader(_Numbers(8), LoaderConfig(batch_size=2, num_workers=2, timeout_s=30.0))
    with pytest.raises(DataError, match="worker process died"):
        iterate(loader, name="start test")


@pytest.mark.filterwarnings("ignore:Got pickle error:UserWarning")
def test_a_dataset_that_cannot_be_pickled_under_spawn_names_the_fix(no_stray_workers):
    class DefinedInACell(Dataset):  # a local class: spawn cannot pickle it, as with a notebook's __main__ class
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return i

    loader = make_loader(DefinedInACell(), LoaderConfig(batch_size=2, num_workers=1, multiprocessing_context="spawn"))
    with pytest.raises(DataError) as exc:
        iterate(loader, name="spawn test")
    msg = str(exc.value)
    assert "cannot be sent to the worker" in msg and "'spawn'" in msg and "module" in msg


def _fail_like_a_notebook_class():
    raise AttributeError("Can't get attribute 'MyDataset' on <module '__main__' (built-in)>")


class _UnpicklesBadly(Dataset):
    """Pickles fine here, fails to unpickle in a spawned worker (as a notebook-defined class does)."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return i

    def __reduce__(self):
        return (_fail_like_a_notebook_class, ())


@pytest.mark.slow
def test_a_worker_that_cannot_load_the_dataset_under_spawn_is_reported(no_stray_workers):
    loader = make_loader(_UnpicklesBadly(), LoaderConfig(batch_size=2, num_workers=1, timeout_s=60.0,
                                                         multiprocessing_context="spawn"))
    t0 = time.perf_counter()
    with pytest.raises(DataError) as exc:
        run_epoch(loader, name="spawn worker")
    assert "worker process died" in str(exc.value) and "Can't get attribute" in str(exc.value)
    assert time.perf_counter() - t0 < 30  # noticed when the worker dies, not at the 60 s timeout


def test_pin_thread_and_dataset_errors_are_told_apart():
    loader = make_loader(list(range(4)), LoaderConfig(batch_size=2))
    pin = explain_loader_error(RuntimeError("Pin memory thread exited unexpectedly"), loader, name="pinned")
    assert isinstance(pin, DataError) and "pin_memory=True" in str(pin) and "pin_memory=False" in str(pin)
    own = RuntimeError("Caught RuntimeError in DataLoader worker process 0.\nOriginal Traceback: timed out after x")
    assert explain_loader_error(own, loader) is None  # the dataset's own error stays as it is
    assert explain_loader_error(ValueError("bad value"), loader) is None


# --------------------------------------------------------------------------- memory


@pytest.mark.skipif(not FORK, reason="worker memory sharing is shown with fork")
def test_epoch_memory_reads_uss_pss_of_main_and_each_worker(no_stray_workers):
    ds = MetadataDataset(2000, "objects")
    cfg = LoaderConfig(batch_size=200, num_workers=2, timeout_s=30)
    loader = make_loader(ds, cfg, batch_sampler=make_batch_sampler(len(ds), cfg))
    with iterate(loader) as it:
        expected = {w.pid for w in it._it._workers}  # torch's own record of its workers
        assert set(it.worker_pids) == expected
    df = measure_epoch_memory(loader, label="objects")
    assert list(df["moment"].unique()) == ["start", "end"]
    assert sorted(df["role"].unique()) == ["main", "worker 0", "worker 1"]
    assert df.loc[df["moment"] == "end", "batches"].iloc[0] == len(loader) == 10
    assert (df["uss_mib"] > 0).all() and (df["pss_mib"] > 0).all() and (df["rss_mib"] >= df["uss_mib"]).all()
    workers = df[df["role"] != "main"]
    assert (workers["rss_mib"] > workers["uss_mib"]).all()  # forked workers share pages with the main process


def test_metadata_dataset_reads_the_same_values_either_way():
    a, b = MetadataDataset(50, "arrays", seed=2), MetadataDataset(50, "objects", seed=2)
    x, y = a[[0, 7, 49]], b[[0, 7, 49]]
    assert torch.equal(x["label"], y["label"])
    assert (y["caption_chars"] > x["caption_chars"]).all()  # the object captions carry a number suffix
    with pytest.raises(ParameterError):
        MetadataDataset(5, "lists")


# --------------------------------------------------------------------------- bad input mid-epoch


def _folder_with_a_truncated_jpeg(tmp_path: Path, n_good: int = 7) -> list[Path]:
    """Seven good JPEGs and one cut in half, which sorts sixth (met mid-epoch, not in the first batch)."""
    from PIL import Image

    paths = []
    for i in range(n_good):
        p = tmp_path / f"good_{i}.jpg"
        Image.new("RGB", (32, 24), (10 * i, 100, 200)).save(p, quality=90)
        paths.append(p)
    full = (tmp_path / "good_0.jpg").read_bytes()
    bad = tmp_path / "good_4_truncated.jpg"
    bad.write_bytes(full[: len(full) // 2])
    paths.insert(5, bad)
    return paths


@pytest.mark.skipif(not FORK, reason="needs the fork start method (Linux)")
def test_a_truncated_file_in_a_worker_is_reported_and_the_epoch_completes(tmp_path, no_stray_workers):
    from helpers.pipeline.dataset import load_dataset
    from helpers.pipeline.fast import BatchedDataset
    from helpers.pipeline.text import build_tokenizer

    _folder_with_a_truncated_jpeg(tmp_path)
    index = load_dataset(tmp_path, scan=False)  # not scanned up front: the bad file is met mid-epoch
    assert len(index) == 8 and "good_4_truncated.jpg" in [Path(p).name for p in index.paths]
    tokenizer = build_tokenizer(list(index.captions), vocab_size=32, text_len=4)
    dataset = BatchedDataset(index, tokenizer, image_size=16, text_len=4, threads=1)
    cfg = LoaderConfig(batch_size=2, num_workers=2, shuffle=False, timeout_s=60)
    loader = make_loader(dataset, cfg, batch_sampler=make_batch_sampler(len(index), cfg))
    workers = set()
    report = run_epoch(loader, name="bad input", on_batch=lambda i, b: workers.add(b["worker"]))
    assert report.batches == 4 and report.items == 8  # every batch full: the bad image was replaced
    assert workers == {0, 1}
    assert len(report.skipped) == 1
    name, reason, times = report.skipped[0]
    assert name == "good_4_truncated.jpg" and "truncated" in reason.lower() and times == 1


def test_skip_log_accepts_tuples_and_converted_lists():
    log = SkipLog()
    assert log.add({"skipped": [("a.jpg", "truncated JPEG")]}) == 1
    assert log.add({"skipped": [["a.jpg", "truncated JPEG"], ["b.png", "zero bytes"]]}) == 2
    assert log.add({"image": None}) == 0
    assert log.total == 3
    assert log.entries() == (("a.jpg", "truncated JPEG", 2), ("b.png", "zero bytes", 1))
    assert list(log.frame().columns) == ["file", "reason", "times"]


# --------------------------------------------------------------------------- the sweep


def test_sweep_settings_cover_the_grid_with_zero_once():
    s = sweep_settings([2, 1, 2], [4, 2])
    assert s[0] == LoaderSetting(0)
    assert len(s) == 1 + 2 * 2 * 2
    assert LoaderSetting(2, 4, True) in s and LoaderSetting(1, 2, False) in s
    assert sweep_settings([1], [2])[0].label == "workers=0"  # the reference is always there
    with pytest.raises(ParameterError):
        sweep_settings([1], [])
    with pytest.raises(ParameterError):
        sweep_settings([-1], [2])


@pytest.mark.skipif(not FORK, reason="needs the fork start method (Linux)")
def test_sweep_times_every_setting_in_rotated_order(no_stray_workers):
    settings = (LoaderSetting(0), LoaderSetting(1, 2, False), LoaderSetting(1, 2, True))
    base = LoaderConfig(batch_size=4, timeout_s=30)
    result = run_sweep(lambda s: _Numbers(20), 20, settings, base=base, batches_per_trial=3, trials=3)
    t = result.trials
    assert len(t) == 9 and set(t["setting"]) == {s.label for s in settings}
    assert (t["images"] == 12).all() and (t["elapsed_s"] > 0).all() and (t["first_batch_s"] > 0).all()
    first_in_round = t[t["position"] == 0].sort_values("trial")["setting"].tolist()
    assert first_in_round == [s.label for s in settings]  # each round starts one setting later
    m = result.measurement("workers=1, prefetch=2")
    assert m.repeats == 3 and m.items_per_call == 12
    summary = result.summary()
    assert list(summary["images_per_s"]) == sorted(summary["images_per_s"], reverse=True)
    assert result.ranking()[0] == summary["setting"].iloc[0]
    c = result.compare("workers=0", result.ranking()[0])
    assert c.ci_low <= c.ratio <= c.ci_high
    with pytest.raises(ParameterError, match="no setting"):
        result.measurement("workers=9")


@pytest.mark.skipif(not FORK, reason="needs the fork start method (Linux)")
def test_persistent_workers_are_reused_then_closed(no_stray_workers):
    cfg = LoaderConfig(batch_size=4, num_workers=1, persistent_workers=True, timeout_s=30)
    loader = make_loader(_Numbers(8), cfg, batch_sampler=make_batch_sampler(8, cfg))
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


def test_in_flight_is_workers_times_prefetch():
    assert LoaderSetting(0).in_flight == 0
    assert LoaderSetting(3, 4, True).in_flight == 12
    assert LoaderSetting(2, None).in_flight == 2 * L.TORCH_DEFAULT_PREFETCH
    assert LoaderSetting(0).min_timed_batches == 1 and LoaderSetting(3, 2).min_timed_batches == 6
    short = L.SweepResult(trials=None, settings=(LoaderSetting(0), LoaderSetting(3, 2)), batch_size=2,
                          batches_per_trial=4)
    assert short.short_windows() == ["workers=3, prefetch=2"]


def test_the_window_never_counts_batches_finished_before_the_clock():
    # clock starts at 10 s; two batches were ready before it (prepared ahead), however late they are consumed
    stamps = [9.0, 10.4, 9.5, 10.2, 10.9, 10.6, 11.0]
    start, end, ahead = L.completion_window(10.0, stamps, 3)
    assert ahead == 2
    assert (start, end) == (10.2, 10.9)  # opens on the first completion after the clock, holds 3 more
    assert L.completion_window(10.0, stamps, 4)[1] == 11.0
    with pytest.raises(DataError, match="only 5 of the 7 batches finished after the clock"):
        L.completion_window(10.0, stamps, 5)
    with pytest.raises(ParameterError):
        L.completion_window(10.0, stamps, 0)


def test_a_speedup_above_the_core_count_is_flagged_as_implausible():
    note = L.speedup_plausibility(6.61, 2)
    assert note is not None and "6.61x" in note and "2 usable core(s)" in note and "not physically possible" in note
    assert "batches_per_trial" in note  # what to do
    assert L.speedup_plausibility(1.9, 2) is None and L.speedup_plausibility(2.0, 2) is None
    assert L.speedup_plausibility(float("nan"), 4) is not None
    with pytest.raises(ParameterError):
        L.speedup_plausibility(1.0, 0)


class _Straggler(Dataset):
    """Batched dataset: every batch takes SLEEP_S in a worker, except worker 1's first, which takes 20x longer.

    While worker 1 is stuck on its first batch, worker 0 finishes its queue
    and the batches sent to it as the consumer moves on: those are ready
    before the sweep's clock starts.
    """

    SLEEP_S = 0.03

    def __init__(self, n):
        self.n, self.calls = n, 0

    def __len__(self):
        return self.n

    def __getitem__(self, indices):
        info = torch.utils.data.get_worker_info()
        first = self.calls == 0
        self.calls += 1
        time.sleep(self.SLEEP_S * (20 if (info is not None and info.id == 1 and first) else 1))
        idx = torch.as_tensor(indices, dtype=torch.int64)
        return {"label": idx}


@pytest.mark.skipif(not FORK, reason="needs the fork start method (Linux)")
def test_the_sweep_excludes_batches_prepared_before_the_clock(no_stray_workers):
    setting = LoaderSetting(2, 4, False)
    n = 4
    result = run_sweep(lambda s: _Straggler(8), 8, (setting,), base=LoaderConfig(batch_size=2, timeout_s=30),
                       batches_per_trial=n, trials=1)
    row = result.trials.iloc[0]
    assert row["clock"] == "completion" and row["drained"] == setting.in_flight == 8
    assert row["prepared_ahead"] >= 1  # worker 0 ran ahead while worker 1 was stuck: those were not counted
    assert row["images"] == n * 2
    # physical floor: n + 1 completions (the window's two ends included) shared by 2 workers, each at least
    # SLEEP_S apart within a worker, span at least (ceil((n + 1) / 2) - 1) x SLEEP_S
    assert row["elapsed_s"] >= (math.ceil((n + 1) / 2) - 1) * _Straggler.SLEEP_S
    assert result.summary()["prepared_ahead_max"].iloc[0] == row["prepared_ahead"]
    assert result.short_windows() == []  # 4 timed batches = 2 per worker


@pytest.mark.skipif(not FORK, reason="needs the fork start method (Linux)")
def test_a_sweep_trial_spans_epochs_of_a_one_batch_dataset(no_stray_workers):
    # 5 items, batch 4: one batch per epoch; a trial needs drain + timed + tail batches
    settings = (LoaderSetting(0), LoaderSetting(1, 2, True))
    result = run_sweep(lambda s: _Numbers(5), 5, settings, base=LoaderConfig(batch_size=4, timeout_s=30),
                       batches_per_trial=3, trials=2)
    assert len(result.trials) == 4 and (result.trials["images"] == 12).all()
    assert (result.trials["elapsed_s"] > 0).all()


def test_the_first_batch_panel_labels_the_num_workers_0_line():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    from helpers.workbook.plots_loader import throughput_vs_workers

    summary = pd.DataFrame({
        "setting": ["workers=0", "workers=1, prefetch=2"], "num_workers": [0, 1], "prefetch_factor": [None, 2.0],
        "persistent_workers": [False, False], "images_per_s": [100.0, 150.0], "images_per_s_p25": [90.0, 140.0],
        "images_per_s_p75": [110.0, 160.0], "first_batch_s": [0.004, 0.08],
    })
    fig = throughput_vs_workers(summary, cores=2)
    try:
        panel = fig.axes[1]
        assert any(t.get_text().startswith("num_workers=0 (4 ms)") for t in panel.texts)
    finally:
        plt.close(fig)
