"""The decoded-image cache: the same crops as the reference within PSNR, never stale, bounded, shared with workers."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers.errors import DataError, ParameterError
from helpers.pipeline.baseline import ImageTransformConfig
from helpers.pipeline.dataset import DatasetIndex, build_embedded, load_dataset
from helpers.pipeline.decode import psnr, reference_augment
from helpers.pipeline.image_cache import CachedDataset, cached_size, open_image_cache
from helpers.pipeline.sampler import batch_sampler
from helpers.pipeline.text import build_tokenizer

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "data" / "fixtures"
S, L = 32, 8


@pytest.fixture()
def folder(tmp_path):
    """16 embedded photos plus the EXIF-rotated, grey, CMYK and PNG fixtures, in a folder of their own."""
    root = build_embedded(tmp_path / "photos", n_images=16, seed=3)
    for name in ("exif_orientation6.jpg", "grey.jpg", "cmyk.jpg", "rgba.png"):
        shutil.copy(FIXTURES / name, root / name)
    return root


def _open(index, tmp_path, **kw):
    return open_image_cache(index, ImageTransformConfig(image_size=S), root=tmp_path / "cache", threads=2, **kw)


def _dataset(index, cache, **kw):
    tok = build_tokenizer(list(index.captions), vocab_size=96)
    return CachedDataset(index, tok, cache=cache, image_size=S, text_len=L, seed=5, threads=2, **kw)


def test_cached_size_keeps_the_smallest_crop_at_the_output_size():
    t = ImageTransformConfig(image_size=64)  # crop_scale (0.6, 1), ratio (3/4, 4/3)
    h, w = cached_size(480, 640, t)
    smallest = (0.6 * h * w / (4 / 3)) ** 0.5
    assert 64 <= smallest < 66 and h / w == pytest.approx(480 / 640, rel=0.02)
    assert cached_size(40, 50, t) == (40, 50)  # never enlarged


def test_cached_batches_match_the_reference_crops(folder, tmp_path):
    index = load_dataset(folder)
    cache, info = _open(index, tmp_path)
    assert info.rebuilt_because == "new" and info.build_s > 0 and info.images == len(index) and not info.failed
    ds = _dataset(index, cache)
    try:
        order = list(batch_sampler(len(ds), 8, seed=5))
        for indices in order[:2]:
            batch = ds[indices]
            assert batch["image"].dtype == torch.uint8 and tuple(batch["image"].shape) == (8, S, S, 3)
            for k, i in enumerate(indices):
                ref = reference_augment(index.paths[i], seed=5, epoch=0, index=int(i),
                                        transform=ImageTransformConfig(image_size=S))
                assert psnr(batch["image"][k].numpy(), ref) >= 30.0, index.paths[i]  # EXIF, grey, CMYK, PNG too
        assert ds.stats()["route:cache"] == 16
    finally:
        ds.close()
    again, info2 = _open(index, tmp_path)
    assert info2.build_s is None and info2.rebuilt_because == "" and again.meta["bytes"] == info.bytes


def test_a_changed_source_file_rebuilds_or_is_refused(folder, tmp_path):
    index = load_dataset(folder)
    _open(index, tmp_path)
    victim = Path(index.paths[0])
    shutil.copy(Path(index.paths[1]), victim)  # other pixels under the same name
    st = victim.stat()
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with pytest.raises(DataError, match="stale"):
        _open(index, tmp_path, on_stale="refuse")
    cache, info = _open(index, tmp_path)
    assert info.rebuilt_because.startswith("stale") and info.build_s is not None
    ds = _dataset(index, cache)
    try:
        got = ds[[0]]["image"][0].numpy()
        ref = reference_augment(index.paths[0], seed=5, epoch=0, index=0, transform=ImageTransformConfig(image_size=S))
        assert psnr(got, ref) >= 30.0  # the new content, not the stale one
    finally:
        ds.close()


def test_the_bound_is_checked_before_any_decode(folder, tmp_path):
    index = load_dataset(folder)
    with pytest.raises(DataError, match=r"would take .* MiB, above its bound .* raise the bound"):
        _open(index, tmp_path, max_bytes=1000)
    assert not list((tmp_path / "cache").rglob("pixels.u8"))
    with pytest.raises(ParameterError, match="on_stale"):
        _open(index, tmp_path, on_stale="maybe")


def test_a_file_that_fails_at_build_time_is_reported_and_substituted(folder, tmp_path):
    index = load_dataset(folder)
    paths = index.paths.astype(object)
    paths[2] = str(FIXTURES / "truncated.jpg")
    broken = DatasetIndex(root=index.root, paths=np.array(paths, dtype=np.str_), captions=index.captions,
                          labels=index.labels, n_classes=index.n_classes)
    cache, info = _open(broken, tmp_path)
    assert 2 in info.failed
    ds = _dataset(broken, cache)
    try:
        batch = ds[[1, 2, 3]]
        assert [name for name, _ in batch["skipped"]] == ["truncated.jpg"]
        assert batch["label"][1] == broken.labels[3]  # the next decodable item took its slot
    finally:
        ds.close()


def test_workers_read_the_same_cache(folder, tmp_path):
    from helpers.pipeline.loader import LoaderConfig, make_loader

    index = load_dataset(folder)
    cache, _ = _open(index, tmp_path)
    ds = _dataset(index, cache)
    sampler = batch_sampler(len(ds), 8, seed=5)
    try:
        sampler.set_epoch(0)
        here = [ds[b]["image"].clone() for b in sampler]
        sampler.set_epoch(0)
        loader = make_loader(ds, LoaderConfig(batch_size=8, num_workers=1, timeout_s=60, seed=5),
                             batch_sampler=sampler)
        there = [b["image"] for b in loader]
        assert len(there) == len(here) and all(torch.equal(a, b) for a, b in zip(here, there))
    finally:
        ds.close()
