"""Tests of the baseline (per-sample) input pipeline."""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers.errors import DataError, ParameterError
from helpers.jobs.base import PerItemBatches
from helpers.pipeline.baseline import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    AugmentParams,
    BaselineDataset,
    ImageTransformConfig,
    augment_one,
    collate_batch,
    item_generator,
    sample_augment,
)
from helpers.pipeline.dataset import build_embedded, load_dataset
from helpers.pipeline.images import load_rgb
from helpers.pipeline.loader import LoaderConfig, make_batch_sampler, make_loader
from helpers.pipeline.text import build_tokenizer, encode_one

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "data" / "fixtures"
N = 10
MEAN = np.array(IMAGENET_MEAN, dtype=np.float32)[:, None, None]
STD = np.array(IMAGENET_STD, dtype=np.float32)[:, None, None]


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    return load_dataset(build_embedded(tmp_path_factory.mktemp("emb") / "d", n_images=N, seed=5))


@pytest.fixture(scope="module")
def tokenizer(index):
    return build_tokenizer(list(index.captions), vocab_size=128)


@pytest.fixture()
def dataset(index, tokenizer):
    return BaselineDataset(index, tokenizer, image_size=32, text_len=8, seed=7)


def _pixels(image: torch.Tensor) -> np.ndarray:
    """Undo the normalization: (3, S, S) float in [0, 1]."""
    return image.numpy() * STD + MEAN


def test_item_shapes_dtypes_and_range(dataset, index, tokenizer):
    item = dataset[3]
    assert set(item) == {"image", "tokens", "label"}
    assert item["image"].shape == (3, 32, 32) and item["image"].dtype == torch.float32
    assert item["tokens"].shape == (8,) and item["tokens"].dtype == torch.int64
    assert item["label"].shape == () and item["label"].dtype == torch.int64
    assert int(item["label"]) == int(index.labels[3])
    assert np.array_equal(item["tokens"].numpy(), encode_one(tokenizer, str(index.captions[3]), 8))
    px = _pixels(item["image"])
    assert px.min() >= -1e-5 and px.max() <= 1 + 1e-5
    assert px.std() > 0.01  # a picture, not a constant


def test_determinism_per_seed_epoch_and_index(dataset, index, tokenizer):
    a, b = dataset[2]["image"], dataset[2]["image"]
    assert torch.equal(a, b)
    twin = BaselineDataset(index, tokenizer, image_size=32, text_len=8, seed=7)
    assert torch.equal(twin[2]["image"], a)
    dataset.set_epoch(1)
    assert not torch.equal(dataset[2]["image"], a)  # new epoch, new augmentation
    dataset.set_epoch(0)
    assert torch.equal(dataset[2]["image"], a)
    other_seed = BaselineDataset(index, tokenizer, image_size=32, text_len=8, seed=8)
    assert not torch.equal(other_seed[2]["image"], a)
    assert torch.equal(dataset[-1]["image"], dataset[N - 1]["image"])


def test_augmentations_differ_across_items_and_epochs():
    cfg = ImageTransformConfig()
    draws = {sample_augment(item_generator(0, e, i), 480, 640, cfg) for e in range(3) for i in range(20)}
    assert len(draws) == 60
    assert sample_augment(item_generator(0, 1, 4), 480, 640, cfg) == sample_augment(item_generator(0, 1, 4), 480, 640, cfg)


def test_dataset_holds_no_shared_rng_and_workers_match_main_process(dataset):
    # pytorch/pytorch#5059: the augmentation of item i must not depend on which process loads it
    assert not any(isinstance(v, (np.random.Generator, torch.Generator)) for v in vars(dataset).values())
    loader = torch.utils.data.DataLoader(dataset, batch_size=1, shuffle=False, num_workers=2,
                                         collate_fn=collate_batch, timeout=60)
    for i, batch in enumerate(loader):
        assert torch.equal(batch["image"][0], dataset[i]["image"]), i


def test_sample_augment_box_follows_scale_and_ratio():
    cfg = ImageTransformConfig(crop_scale=(0.6, 1.0))
    for i in range(200):
        p = sample_augment(item_generator(1, 0, i), 300, 451, cfg)
        assert 0 <= p.top and p.top + p.height <= 300 and 0 <= p.left and p.left + p.width <= 451
        area = p.height * p.width / (300 * 451)
        assert 0.6 - 0.02 <= area <= 1.0 + 1e-9
        assert 3 / 4 - 0.02 <= p.width / p.height <= 4 / 3 + 0.02


def test_sample_augment_falls_back_to_a_centre_crop():
    cfg = ImageTransformConfig(crop_scale=(0.9, 1.0))
    p = sample_augment(item_generator(0, 0, 0), 10, 1000, cfg)  # no 3/4..4/3 box of 90% area fits
    assert (p.height, p.width) == (10, round(10 * 4 / 3))
    assert p.top == 0 and p.left == (1000 - p.width) // 2


def test_augment_one_identity_keeps_pixels_and_channel_order():
    rgb = load_rgb(FIXTURES / "rgb_patches.png")[:64, :64]  # red top-left, green top-right
    cfg = ImageTransformConfig(image_size=64)
    out = augment_one(rgb, AugmentParams(0, 0, 64, 64, False), cfg)
    assert out.shape == (3, 64, 64) and out.dtype == np.float32 and out.flags.c_contiguous
    restored = out * STD + MEAN
    assert np.abs(restored * 255 - rgb.transpose(2, 0, 1)).max() < 1e-3
    assert restored[0, 8, 8] > 0.99 and restored[1, 8, 8] < 0.01  # red stays in channel 0
    flipped = augment_one(rgb, AugmentParams(0, 0, 64, 64, True), cfg)
    assert np.array_equal(flipped, out[:, :, ::-1])


def test_augment_one_normalizes_extremes_to_the_imagenet_bounds():
    cfg = ImageTransformConfig(image_size=4)
    black = augment_one(np.zeros((4, 4, 3), np.uint8), AugmentParams(0, 0, 4, 4, False), cfg)
    white = augment_one(np.full((4, 4, 3), 255, np.uint8), AugmentParams(0, 0, 4, 4, False), cfg)
    for c in range(3):
        assert math.isclose(float(black[c, 0, 0]), -IMAGENET_MEAN[c] / IMAGENET_STD[c], rel_tol=1e-5)
        assert math.isclose(float(white[c, 0, 0]), (1 - IMAGENET_MEAN[c]) / IMAGENET_STD[c], rel_tol=1e-5)


def test_collate_and_the_jobs_loader(dataset):
    batch = collate_batch([dataset[0], dataset[1], dataset[2]])
    assert batch["image"].shape == (3, 3, 32, 32) and batch["image"].dtype == torch.float32
    assert batch["tokens"].shape == (3, 8) and batch["tokens"].dtype == torch.int64
    assert batch["label"].shape == (3,) and batch["label"].dtype == torch.int64
    pickle.dumps(collate_batch)  # importable by name in worker processes
    # the baseline's batches: the per-item dataset batched in the one batch order (as PPOJob builds them)
    batched = PerItemBatches(dataset)
    cfg = LoaderConfig(batch_size=4, seed=1)

    def loader(config=cfg):
        return make_loader(batched, config, batch_sampler=make_batch_sampler(len(batched), config))

    first = loader()
    assert first.num_workers == 0 and first.pin_memory is False
    batches = list(first)
    assert len(batches) == N // 4 and all(b["image"].shape == (4, 3, 32, 32) for b in batches)
    assert [b["label"].tolist() for b in loader()] == [b["label"].tolist() for b in batches]  # same seed, order
    ordered = list(loader(LoaderConfig(batch_size=3, shuffle=False, drop_last=False)))
    assert [len(b["label"]) for b in ordered] == [3, 3, 3, 1]
    assert torch.equal(ordered[0]["image"][1], dataset[1]["image"])


def test_fewer_images_than_a_batch_is_a_data_error(dataset):
    with pytest.raises(DataError, match=r"fewer than batch_size=64"):
        make_batch_sampler(len(dataset), LoaderConfig(batch_size=64))
    assert len(list(make_batch_sampler(len(dataset), LoaderConfig(batch_size=64, drop_last=False)))) == 1


@pytest.mark.parametrize("bad", [0, -2, 2.0, True])
def test_loader_rejects_bad_batch_sizes(bad):
    with pytest.raises(ParameterError):
        LoaderConfig(batch_size=bad)


def test_parameter_checks(index, tokenizer, dataset):
    with pytest.raises(ParameterError):
        ImageTransformConfig(image_size=0)
    with pytest.raises(ParameterError):
        ImageTransformConfig(crop_scale=(0.0, 1.0))
    with pytest.raises(ParameterError):
        ImageTransformConfig(crop_scale=(0.9, 0.5))
    with pytest.raises(ParameterError):
        ImageTransformConfig(std=(0.2, 0.0, 0.2))
    with pytest.raises(ParameterError, match="disagrees"):
        BaselineDataset(index, tokenizer, image_size=32, transform=ImageTransformConfig(image_size=64))
    with pytest.raises(ParameterError):
        BaselineDataset(index, tokenizer, text_len=0)
    with pytest.raises(ParameterError):
        dataset.set_epoch(-1)
    with pytest.raises(IndexError):
        dataset[N]
    with pytest.raises(ParameterError):
        collate_batch([])
