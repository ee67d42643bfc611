"""Tests of the batched pipeline: batch format, same pixels and draws, bad files, buffer reuse, workers."""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from helpers.errors import DataError, ParameterError
from helpers.experiments import decode as XD
from helpers.pipeline import decode_bench
from helpers.pipeline import fast as F
from helpers.pipeline import sampler as sampler_mod
from helpers.pipeline.baseline import IMAGENET_MEAN, IMAGENET_STD, BaselineDataset, collate_batch
from helpers.pipeline.dataset import DatasetIndex, build_embedded, load_dataset
from helpers.pipeline.decode import decode_augment, psnr, reference_augment
from helpers.pipeline.text import build_tokenizer, encode_one

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "data" / "fixtures"
S, L = 32, 8


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    return load_dataset(build_embedded(tmp_path_factory.mktemp("emb") / "d", n_images=16, seed=2))


@pytest.fixture(scope="module")
def tokenizer(index):
    return build_tokenizer(list(index.captions), vocab_size=96)


@pytest.fixture()
def dataset(index, tokenizer):
    ds = F.BatchedDataset(index, tokenizer, image_size=S, text_len=L, seed=4, threads=2)
    yield ds
    ds.close()


def _with_files(index, extra: dict[int, Path]) -> DatasetIndex:
    """A copy of ``index`` whose items at the given positions point at other files (e.g. bad fixtures)."""
    paths = index.paths.copy().astype(object)
    for i, p in extra.items():
        paths[i] = str(p)
    return DatasetIndex(root=index.root, paths=np.array(paths, dtype=np.str_), captions=index.captions,
                        labels=index.labels, n_classes=index.n_classes)


class _FakeEvent:
    def __init__(self):
        self.recorded = 0
        self.synchronized = 0

    def record(self, stream=None):
        self.recorded += 1

    def synchronize(self):
        self.synchronized += 1


class _Cap:
    def __init__(self, available):
        self.available = available


class _FakeAcc:
    """A CPU 'device' that claims asynchronous copies and events (to test the fence logic)."""

    kind = "cpu"
    device = torch.device("cpu")

    def __init__(self):
        self.events = []
        self.capabilities = type("C", (), {"non_blocking_copy": _Cap(True), "pinned_memory": _Cap(True)})()

    def new_event(self, enable_timing=False):
        self.events.append(_FakeEvent())
        return self.events[-1]

    def synchronize(self):
        pass


# ---------------------------------------------------------------- the batch


def test_host_batch_format(dataset, tokenizer, index):
    batch = dataset[[3, 0, 7, 5]]
    assert tuple(batch) == F.HOST_BATCH_KEYS
    img = batch["image"]
    assert img.dtype == torch.uint8 and tuple(img.shape) == (4, S, S, 3) and img.is_contiguous()
    assert batch["tokens"].dtype == torch.int64 and tuple(batch["tokens"].shape) == (4, L)
    assert batch["label"].dtype == torch.int64 and batch["label"].tolist() == index.labels[[3, 0, 7, 5]].tolist()
    assert batch["prep_start_s"] <= batch["prep_end_s"]
    assert batch["prep_s"] == pytest.approx(batch["prep_end_s"] - batch["prep_start_s"])
    assert batch["worker"] == -1 and batch["skipped"] == []
    for k, i in enumerate([3, 0, 7, 5]):
        np.testing.assert_array_equal(batch["tokens"][k].numpy(), encode_one(tokenizer, str(index.captions[i]), L))
    assert isinstance(dataset.paths, np.ndarray) and isinstance(dataset.captions, np.ndarray)


def test_batch_equals_per_image_fast_decode_and_matches_the_reference(dataset, index):
    dataset.set_epoch(3)
    idx = list(range(len(index)))
    batch = dataset[idx]
    for k, i in enumerate(idx):
        one = decode_augment(index.paths[i], seed=4, epoch=3, index=i, transform=dataset.transform)
        np.testing.assert_array_equal(batch["image"][k].numpy(), one.image)
        ref = reference_augment(index.paths[i], seed=4, epoch=3, index=i, transform=dataset.transform)
        assert psnr(batch["image"][k].numpy(), ref) >= 30.0
    stats = dataset.stats()
    assert stats["route:turbo"] == len(idx) and stats["images"] == len(idx) and stats["batches"] == 1


def test_normalized_batch_matches_the_baseline_batch(dataset, index, tokenizer):
    from helpers.device import get_accelerator

    acc = get_accelerator("cpu")
    idx = [1, 2, 3, 4, 5, 6]
    images, tokens, labels = F.to_device_batch(dataset[idx], acc)
    base = collate_batch([BaselineDataset(index, tokenizer, image_size=S, text_len=L, seed=4)[i] for i in idx])
    assert images.dtype == torch.float32 and images.is_contiguous() and tuple(images.shape) == (6, 3, S, S)
    torch.testing.assert_close(tokens, base["tokens"], rtol=0, atol=0)
    torch.testing.assert_close(labels, base["label"], rtol=0, atol=0)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    fast_px = (images * std + mean) * 255
    base_px = (base["image"] * std + mean) * 255
    assert psnr(fast_px.numpy(), base_px.numpy()) >= 30.0


def test_to_device_batch_normalizes_like_the_baseline():
    from helpers.device import get_accelerator

    gen = torch.Generator().manual_seed(0)
    image = torch.randint(0, 256, (3, 5, 4, 3), dtype=torch.uint8, generator=gen)
    batch = {"image": image, "tokens": torch.zeros(3, 2, dtype=torch.int64), "label": torch.arange(3)}
    x, _, _ = F.to_device_batch(batch, get_accelerator("cpu"))
    ref = (image.numpy().astype(np.float32) / np.float32(255) - np.float32(IMAGENET_MEAN)) / np.float32(IMAGENET_STD)
    np.testing.assert_allclose(x.numpy(), ref.transpose(0, 3, 1, 2), atol=1e-5)
    assert x.is_contiguous()


def test_to_device_batch_rejects_a_float_batch():
    from helpers.device import get_accelerator

    batch = {"image": torch.zeros(2, 3, 8, 8), "tokens": torch.zeros(2, 2), "label": torch.zeros(2)}
    with pytest.raises(ParameterError, match="host_to_device"):
        F.to_device_batch(batch, get_accelerator("cpu"))


def test_determinism_per_seed_epoch_and_indices(index, tokenizer):
    one = F.BatchedDataset(index, tokenizer, image_size=S, text_len=L, seed=9, threads=1)
    two = F.BatchedDataset(index, tokenizer, image_size=S, text_len=L, seed=9, threads=2)
    for epoch in (0, 1):
        one.set_epoch(epoch)
        two.set_epoch(epoch)
        a, b = one[[5, 1, 9]], two[[5, 1, 9]]
        assert torch.equal(a["image"], b["image"]) and torch.equal(a["tokens"], b["tokens"])
    one.set_epoch(0)
    e0 = one[[5, 1, 9]]["image"].clone()
    one.set_epoch(1)
    assert not torch.equal(e0, one[[5, 1, 9]]["image"]), "a new epoch draws new crops"
    two.close()


def test_bad_index_arguments(dataset):
    with pytest.raises(ParameterError, match="list of indices"):
        dataset[3]
    with pytest.raises(ParameterError):
        dataset[[]]
    with pytest.raises(IndexError):
        dataset[[0, 99]]
    with pytest.raises(ParameterError):
        F.BatchedDataset(dataset.index, dataset.tokenizer, threads=-1)
    assert dataset[np.array([1, 2])]["image"].shape[0] == 2
    assert dataset[torch.tensor([1, 2])]["image"].shape[0] == 2


# ---------------------------------------------------------------- bad files mid-epoch


def test_truncated_file_mid_batch_is_skipped_reported_and_replaced(index, tokenizer, caplog):
    bad = _with_files(index, {2: FIXTURES / "truncated.jpg"})
    ds = F.BatchedDataset(bad, tokenizer, image_size=S, text_len=L, seed=4, threads=2)
    with caplog.at_level(logging.WARNING, logger="helpers.pipeline.fast"):
        first = ds[[0, 1, 2, 3]]
        second = ds[[2, 5]]
    assert first["image"].shape[0] == 4 and second["image"].shape[0] == 2
    assert first["skipped"] == [("truncated.jpg", "truncated JPEG (image file is truncated)")]
    assert second["skipped"] == first["skipped"], "reported in every batch it would have been in"
    warnings = [r for r in caplog.records if "truncated.jpg" in r.getMessage()]
    assert len(warnings) == 1, "logged once per process"
    # the slot holds item 3 (the next one), with its own augmentation, label and caption
    sub = decode_augment(bad.paths[3], seed=4, epoch=0, index=3, transform=ds.transform)
    np.testing.assert_array_equal(first["image"][2].numpy(), sub.image)
    assert first["label"][2].item() == bad.labels[3]
    np.testing.assert_array_equal(first["tokens"][2].numpy(), encode_one(tokenizer, str(bad.captions[3]), L))
    stats = ds.stats()
    assert stats["bad_files"] == 1 and stats["substituted"] == 2
    ds.close()


def test_a_batch_of_only_bad_files_keeps_its_shape(tokenizer, index):
    names = ["truncated.jpg", "zero_bytes.jpg", "not_an_image.jpg"]
    bad = DatasetIndex(root=FIXTURES, paths=np.array([str(FIXTURES / n) for n in names]),
                       captions=np.array(["a", "b", "c"]), labels=np.array([0, 1, 2]), n_classes=3)
    ds = F.BatchedDataset(bad, tokenizer, image_size=S, text_len=L, threads=1, max_substitutes=2)
    batch = ds[[0, 1]]
    assert batch["image"].shape[0] == 2 and {n for n, _ in batch["skipped"]} == set(names)
    mean = np.round(np.asarray(IMAGENET_MEAN) * 255).astype(np.uint8)
    assert (batch["image"].numpy() == mean).all()
    assert "mean colour" in dict(batch["skipped"])["truncated.jpg"]


def test_cmyk_and_png_in_a_batch_take_the_reference_route(index, tokenizer):
    mixed = _with_files(index, {0: FIXTURES / "cmyk.jpg", 1: FIXTURES / "grey16.png", 2: FIXTURES / "grey.jpg"})
    ds = F.BatchedDataset(mixed, tokenizer, image_size=S, text_len=L, threads=2)
    batch = ds[[0, 1, 2, 3]]
    assert batch["skipped"] == []
    for k in range(3):
        ref = reference_augment(mixed.paths[k], seed=0, epoch=0, index=k, transform=ds.transform)
        assert psnr(batch["image"][k].numpy(), ref) >= 30.0
    stats = ds.stats()
    assert stats["route:reference"] == 2 and stats["route:turbo"] == 2
    ds.close()


# ---------------------------------------------------------------- buffer reuse


def test_buffers_are_reused_when_nobody_holds_them(index, tokenizer):
    ds = F.BatchedDataset(index, tokenizer, image_size=S, text_len=L, threads=1, buffers=2)
    ptrs = set()
    for k in range(6):
        batch = ds[[k, k + 1]]
        ptrs.add(batch["image"].data_ptr())
        del batch
    assert len(ptrs) == 2 and ds.stats()["buffer_allocations"] == 2


def test_a_held_batch_is_never_overwritten(index, tokenizer):
    ds = F.BatchedDataset(index, tokenizer, image_size=S, text_len=L, threads=2, buffers=2)
    held = ds[[0, 1, 2]]
    snapshot = held["image"].clone()
    image_only = ds[[3, 4, 5]]["image"]  # the consumer keeps just the tensor
    image_copy = image_only.clone()
    for k in range(5):
        ds[[6 + k, 7 + k, 8 % 16]]
    assert torch.equal(held["image"], snapshot)
    assert torch.equal(image_only, image_copy)
    assert ds.stats()["buffer_reallocations"] >= 2
    ds.close()


def test_no_buffer_ring_means_a_new_buffer_per_batch(index, tokenizer):
    ds = F.BatchedDataset(index, tokenizer, image_size=S, text_len=L, threads=1, buffers=0)
    a = ds[[0, 1]]["image"]
    b = ds[[0, 1]]["image"]
    assert a.data_ptr() != b.data_ptr() and torch.equal(a, b)


def test_an_async_copy_fences_its_buffer_before_reuse(index, tokenizer, monkeypatch):
    monkeypatch.setattr(F, "_is_pinned", lambda t: True)
    acc = _FakeAcc()
    ds = F.BatchedDataset(index, tokenizer, image_size=S, text_len=L, threads=1, buffers=1)
    images, _, _ = F.to_device_batch(ds[[0, 1]], acc, non_blocking=True)
    assert len(acc.events) == 1 and acc.events[0].recorded == 1 and acc.events[0].synchronized == 0
    ds[[2, 3]]  # reuses the only buffer: must wait for the copy first
    assert acc.events[0].synchronized == 1 and ds.stats()["fence_waits"] == 1
    F.to_device_batch(ds[[4, 5]], acc, non_blocking=False)
    assert len(acc.events) == 1, "a blocking copy needs no fence"


def test_pin_memory_without_an_accelerator_warns_and_falls_back(index, tokenizer, caplog):
    ds = F.BatchedDataset(index, tokenizer, image_size=S, text_len=L, threads=1, pin_memory=True)
    with caplog.at_level(logging.WARNING, logger="helpers.pipeline.fast"):
        batch = ds[[0, 1]]
    if torch.accelerator.is_available():  # pragma: no cover - a machine with a device
        assert ds.pinned and batch["image"].is_pinned()
    else:
        assert not ds.pinned and "pin_memory=True" in caplog.text


# ---------------------------------------------------------------- processes


def test_pool_is_lazy_and_the_dataset_pickles(dataset):
    assert dataset._pool is None
    before = dataset[[1, 2]]["image"].clone()
    assert dataset._pool is not None
    clone = pickle.loads(pickle.dumps(dataset))
    assert clone._pool is None and clone._ring is None
    assert torch.equal(clone[[1, 2]]["image"], before)
    clone.close()


def test_a_forked_copy_starts_its_own_pool(dataset):
    dataset[[0, 1]]
    parent_pool = dataset._pool
    dataset._pid = -1  # what a forked child sees: another pid
    dataset[[0, 1]]
    assert dataset._pool is not None and dataset._pool is not parent_pool
    parent_pool.shutdown()


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_build_the_same_batches(index, tokenizer, context):
    ds = F.BatchedDataset(index, tokenizer, image_size=S, text_len=L, seed=4, threads=2)
    ds[[0, 1]]  # the parent's pool exists before the fork
    sampler = sampler_mod.batch_sampler(len(index), 4, seed=1)
    expected = [ds[b]["image"].clone() for b in sampler.batches(0)]
    loader = DataLoader(ds, batch_size=None, sampler=sampler, num_workers=2, multiprocessing_context=context,
                        timeout=120)
    got = list(loader)
    assert len(got) == len(expected)
    for batch, want in zip(got, expected):
        assert torch.equal(batch["image"], want)
        assert batch["worker"] in (0, 1)
    ds.close()


# ---------------------------------------------------------------- sampling


def test_batch_sampler_epochs():
    s = sampler_mod.batch_sampler(10, 3, seed=5)
    e0, e1 = list(s), list(s)
    assert len(e0) == 3 == len(s) and e0 != e1, "each pass is the next epoch"
    assert e0 == sampler_mod.batch_sampler(10, 3, seed=5).batches(0)
    s.set_epoch(0)
    assert list(s) == e0
    s.set_epoch(0)
    next(iter(s))  # an abandoned pass (DataLoader makes one when it starts workers) does not advance
    assert list(s) == e0 and list(s) == e1
    full = sampler_mod.EpochBatchSampler(10, 3, seed=5, drop_last=False)
    flat = [i for b in full.batches(0) for i in b]
    assert sorted(flat) == list(range(10)) and len(full) == 4
    with pytest.raises(DataError, match="fewer than batch_size"):
        sampler_mod.batch_sampler(2, 3)


def test_threads_zero_shares_the_cores_among_workers(dataset, monkeypatch):
    import types

    import torch.utils.data as tud

    auto = F.BatchedDataset(dataset.index, dataset.tokenizer, image_size=S, text_len=L, threads=0)
    monkeypatch.setattr(F, "usable_cores", lambda: 8)
    assert auto.threads == 8 and dataset.threads == 2
    monkeypatch.setattr(tud, "get_worker_info", lambda: types.SimpleNamespace(id=1, num_workers=3))
    assert auto.threads == 2 and dataset.threads == 2, "8 cores // 3 workers; an explicit count is kept"
    assert F._worker_id() == 1


def test_trains_through_the_loop_with_to_device_batch(index, tokenizer):
    from helpers.compute.model import PolicyConfig, build_policy
    from helpers.compute.ppo import PPOConfig, PPOTrainer
    from helpers.compute.train import TimedLoop, epochs
    from helpers.device import get_accelerator

    acc = get_accelerator("cpu")
    ds = F.BatchedDataset(index, tokenizer, image_size=16, text_len=4, threads=2)
    loader = DataLoader(ds, batch_size=None, sampler=sampler_mod.batch_sampler(len(index), 8, seed=0))
    cfg = PolicyConfig(image_size=16, conv_channels=(4, 8), vocab_size=tokenizer.get_vocab_size(), text_len=4,
                       d_model=8, n_heads=2, n_layers=1, fusion_hidden=16, n_actions=index.n_classes)
    trainer = PPOTrainer(build_policy(cfg, device=acc.device), PPOConfig())
    gen = torch.Generator().manual_seed(0)
    loop = TimedLoop(epochs(loader, datasets=[ds]), lambda b: F.to_device_batch(b, acc),
                     lambda b: trainer.step(*b, generator=gen), acc.synchronize)
    run = loop.run(1, measured=False).discard().run(3).result()
    assert len(run.steps) == 3 and (run.steps["h2d"] > 0).all() and run.steps["loss"].notna().all()
    assert ds.epoch == 1, "the loop's set_epoch reached the dataset (2 batches per epoch, 4 steps)"
    ds.close()


# ---------------------------------------------------------------- the measurements of notebook 02


def _counting_to_device(monkeypatch) -> list:
    """Count the calls of to_device_batch (the device copy and normalization) made by DecodeBench."""
    calls = []
    real = F.to_device_batch

    def counted(batch, acc, **kw):
        calls.append(1)
        return real(batch, acc, **kw)

    monkeypatch.setattr(decode_bench, "to_device_batch", counted)  # DecodeBench is there
    return calls


def test_decode_bench_names_each_variant_by_what_it_times(dataset, monkeypatch):
    from helpers.device import get_accelerator

    bench = XD.DecodeBench(dataset, get_accelerator("cpu"), batch_size=4, repeats=3, warmup=0)
    calls = _counting_to_device(monkeypatch)
    pre = bench.compare_preprocess()
    assert (pre.a.name, pre.b.name) == (XD.BASELINE_LABEL, XD.BATCHED_DEVICE_LABEL)
    assert len(calls) == 3, "every timed batched call of the speedup ends on the device"
    calls.clear()
    eff = bench.compare_raw_decode()
    assert (eff.a.name, eff.b.name) == (XD.RAW_DECODE_LABEL, XD.BATCHED_HOST_LABEL)
    assert not calls, "decode efficiency compares host work with host work: no device step on either side"
    # the efficiency is the batched (host) rate over the raw decode-only rate of the same comparison
    assert eff.ratio == pytest.approx(eff.b.rate / eff.a.rate)
    assert len({XD.BASELINE_LABEL, XD.BATCHED_DEVICE_LABEL, XD.BATCHED_HOST_LABEL, XD.RAW_DECODE_LABEL}) == 4


def test_tokenize_share_is_over_the_host_batch_time(dataset, monkeypatch):
    from helpers.device import get_accelerator

    bench = XD.DecodeBench(dataset, get_accelerator("cpu"), batch_size=4, repeats=3, warmup=0)
    given = bench.tokenize_share(host_s=0.5, baseline_s=2.0)
    assert given["host_s"] == 0.5 and given["baseline_s"] == 2.0
    assert given["batched_share"] == pytest.approx(given["tokenize_batch_s"] / 0.5)
    assert given["per_sample_share"] == pytest.approx(given["tokenize_per_sample_s"] / 2.0)
    calls = _counting_to_device(monkeypatch)
    measured = bench.tokenize_share()
    assert not calls, "measured on its own, the batched time is that of the host batch (dataset[indices])"
    assert measured["host_s"] > 0 and measured["baseline_s"] > 0


@pytest.mark.parametrize("persistent", [False, True])
def test_persistent_workers_draw_each_epochs_augmentations(index, tokenizer, persistent):
    """With persistent workers the main process's set_epoch never reaches them; the epoch tag on each batch does.
    Before the fix every epoch repeated epoch 0's crops and flips (issue 11)."""
    ds = F.BatchedDataset(index, tokenizer, image_size=S, text_len=L, seed=4, threads=1)
    sampler = sampler_mod.batch_sampler(len(index), 4, seed=1)
    loader = DataLoader(ds, batch_size=None, sampler=sampler, num_workers=1, persistent_workers=persistent,
                        timeout=120)
    try:
        for epoch in range(2):
            ds.set_epoch(epoch)  # what the loop does; it reaches only the main process's copy
            for batch_indices, got in zip(sampler.batches(epoch), loader):
                ref = F.BatchedDataset(index, tokenizer, image_size=S, text_len=L, seed=4, threads=1)
                ref.set_epoch(epoch)
                assert torch.equal(got["image"], ref[batch_indices]["image"]), (epoch, batch_indices)
                ref.close()
    finally:
        ds.close()
