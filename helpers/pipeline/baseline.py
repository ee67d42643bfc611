"""The baseline input pipeline: deliberately naive, as people write it first.

Per sample, in ``__getitem__``: open and decode the file with Pillow (the
reference decode of :mod:`helpers.pipeline.images`), random resized crop,
bilinear resize, random horizontal flip, conversion to float and
normalization, one image at a time in NumPy, then tokenization of one
caption. The loader uses ``num_workers=0`` and ``pin_memory=False``. Later
notebooks time this against batched and parallel versions; those reuse
:func:`item_generator` and :func:`sample_augment` so that both draw the same
crops and flips and their pixels can be compared.

Randomness is per item: a generator seeded from ``(seed, epoch, index)``
(:func:`item_generator`), never an RNG object made in ``__init__``, which
every DataLoader worker would copy with the same state and so repeat the same
augmentations (pytorch/pytorch#5059). The same item in the same epoch
gets the same augmentation whichever worker or rank loads it.

:func:`collate_batch` stacks the items into a batch and :func:`host_to_device`
copies that batch, already normalized on the host, to the device.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
from torch.utils.data import Dataset

from helpers.errors import ParameterError
from helpers.pipeline.images import load_rgb
from helpers.pipeline.text import encode_one
from helpers.workload import DEFAULT

logger = logging.getLogger(__name__)

#: ImageNet channel means and standard deviations (RGB), as given in the
#: torchvision models documentation ("mean=[0.485, 0.456, 0.406] and
#: std=[0.229, 0.224, 0.225]", https://docs.pytorch.org/vision/stable/models.html).
IMAGENET_MEAN: tuple[float, float, float] = (0.485, 0.456, 0.406)
IMAGENET_STD: tuple[float, float, float] = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class ImageTransformConfig:
    """Image augmentation and normalization of the workload.

    Attributes
    ----------
    image_size : int, default 64 (:data:`helpers.workload.DEFAULT`)
        Output side S in pixels; images come out (3, S, S).
    crop_scale : (float, float), default (0.6, 1.0)
        Range of the crop's area as a fraction of the image's area.
    crop_ratio : (float, float), default (3/4, 4/3)
        Range of the crop's width / height, drawn log-uniformly
        (torchvision ``RandomResizedCrop``'s default ratio).
    flip_p : float, default 0.5
        Probability of a horizontal flip.
    mean, std : (float, float, float)
        Per-channel normalization, RGB, for values in [0, 1]; default ImageNet
        (:data:`IMAGENET_MEAN`, :data:`IMAGENET_STD`).

    Raises
    ------
    ParameterError
        On construction, for any out-of-range value.
    """

    image_size: int = DEFAULT.image_size
    crop_scale: tuple[float, float] = (0.6, 1.0)
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip_p: float = 0.5
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD

    def __post_init__(self) -> None:
        if isinstance(self.image_size, bool) or not isinstance(self.image_size, (int, np.integer)) or self.image_size < 1:
            raise ParameterError(f"image_size must be a positive integer (pixels), got {self.image_size!r}; e.g. 128")
        lo, hi = self.crop_scale
        if not (0.0 < lo <= hi <= 1.0):
            raise ParameterError(f"crop_scale must satisfy 0 < low <= high <= 1, got {self.crop_scale!r}; e.g. (0.6, 1.0)")
        rlo, rhi = self.crop_ratio
        if not (0.0 < rlo <= rhi):
            raise ParameterError(f"crop_ratio must satisfy 0 < low <= high, got {self.crop_ratio!r}; e.g. (0.75, 1.333)")
        if not (0.0 <= self.flip_p <= 1.0):
            raise ParameterError(f"flip_p must be in [0, 1], got {self.flip_p!r}")
        if len(self.mean) != 3 or len(self.std) != 3 or any(s <= 0 for s in self.std):
            raise ParameterError(f"mean and std need 3 values each, std > 0; got mean={self.mean!r}, std={self.std!r}")


@dataclass(frozen=True)
class AugmentParams:
    """One sample's random augmentation, in source pixels.

    Attributes
    ----------
    top, left, height, width : int
        The crop box.
    flip : bool
        Whether the crop is mirrored left-right.
    """

    top: int
    left: int
    height: int
    width: int
    flip: bool


def item_generator(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The random generator of one item in one epoch.

    Parameters
    ----------
    seed, epoch, index : int
        Non-negative integers.

    Returns
    -------
    numpy.random.Generator
        PCG64 seeded with ``SeedSequence([seed, epoch, index])``; the same
        triple always gives the same stream.
    """
    return np.random.default_rng([int(seed), int(epoch), int(index)])


def sample_augment(rng: np.random.Generator, height: int, width: int, config: ImageTransformConfig) -> AugmentParams:
    """Draw a random-resized-crop box and a flip for an image of the given size.

    Follows ``torchvision.transforms.RandomResizedCrop.get_params``: up to 10
    tries of an area fraction in ``config.crop_scale`` and a log-uniform
    aspect ratio in ``config.crop_ratio``; if none fits, a centre crop with
    the ratio clamped to the range. Then one draw for the flip.

    Parameters
    ----------
    rng : numpy.random.Generator
    height, width : int
        Image size in pixels.
    config : ImageTransformConfig

    Returns
    -------
    AugmentParams
    """
    area = height * width
    log_lo, log_hi = math.log(config.crop_ratio[0]), math.log(config.crop_ratio[1])
    box = None
    for _ in range(10):
        target = area * rng.uniform(config.crop_scale[0], config.crop_scale[1])
        aspect = math.exp(rng.uniform(log_lo, log_hi))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            box = (top, left, h, w)
            break
    if box is None:  # fallback: centre crop
        in_ratio = width / height
        if in_ratio < config.crop_ratio[0]:
            w, h = width, int(round(width / config.crop_ratio[0]))
        elif in_ratio > config.crop_ratio[1]:
            h, w = height, int(round(height * config.crop_ratio[1]))
        else:
            w, h = width, height
        box = ((height - h) // 2, (width - w) // 2, h, w)
    flip = bool(rng.random() < config.flip_p)
    return AugmentParams(top=box[0], left=box[1], height=box[2], width=box[3], flip=flip)


def augment_one(rgb: np.ndarray, params: AugmentParams, config: ImageTransformConfig) -> np.ndarray:
    """Crop, resize, flip and normalize one decoded image (NumPy, per image).

    Parameters
    ----------
    rgb : numpy.ndarray
        (H, W, 3) uint8, RGB.
    params : AugmentParams
    config : ImageTransformConfig

    Returns
    -------
    numpy.ndarray
        (3, S, S) float32, ``(x / 255 - mean) / std`` per channel; with the
        ImageNet constants values lie in about [-2.12, 2.64].
    """
    from PIL import Image

    crop = rgb[params.top : params.top + params.height, params.left : params.left + params.width]
    size = config.image_size
    resized = Image.fromarray(crop).resize((size, size), Image.Resampling.BILINEAR)
    x = np.asarray(resized, dtype=np.float32) / np.float32(255.0)
    if params.flip:
        x = x[:, ::-1, :]
    x = (x - np.asarray(config.mean, dtype=np.float32)) / np.asarray(config.std, dtype=np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1))


def _non_negative_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ParameterError(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)


class BaselineDataset(Dataset):
    """Map-style dataset: one image and caption per item, preprocessed one at a time.

    Parameters
    ----------
    index : helpers.pipeline.dataset.DatasetIndex
        The images, captions and labels.
    tokenizer : tokenizers.Tokenizer
        From :func:`helpers.pipeline.text.load_or_build_tokenizer`.
    image_size : int, default 64 (:data:`helpers.workload.DEFAULT`)
        Output side S in pixels.
    text_len : int, default 16
        Token ids per caption.
    seed : int, default 0
        Base seed of the per-item generators.
    transform : ImageTransformConfig, optional
        Full augmentation settings; its ``image_size`` must equal
        ``image_size``. Default: ``ImageTransformConfig(image_size=image_size)``.

    Raises
    ------
    ParameterError
        For an invalid size, length or seed, or a ``transform`` whose size
        disagrees with ``image_size``.
    """

    def __init__(self, index, tokenizer, *, image_size: int = DEFAULT.image_size, text_len: int = DEFAULT.text_len, seed: int = 0,
                 transform: ImageTransformConfig | None = None) -> None:
        if transform is None:
            transform = ImageTransformConfig(image_size=image_size)
        elif transform.image_size != image_size:
            raise ParameterError(
                f"transform.image_size={transform.image_size} disagrees with image_size={image_size}; pass the same value"
            )
        if isinstance(text_len, bool) or not isinstance(text_len, (int, np.integer)) or text_len < 1:
            raise ParameterError(f"text_len must be a positive integer, got {text_len!r}; e.g. 16")
        self.index = index
        self.tokenizer = tokenizer
        self.transform = transform
        self.text_len = int(text_len)
        self.seed = _non_negative_int("seed", seed)
        self.epoch = 0
        # NumPy arrays, not lists: forked workers share these pages (pytorch/pytorch#13246).
        self.paths = index.paths
        self.captions = index.captions
        self.labels = np.asarray(index.labels, dtype=np.int64)

    @property
    def image_size(self) -> int:
        """Output side S in pixels."""
        return self.transform.image_size

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose augmentations ``__getitem__`` draws.

        With ``num_workers > 0`` and ``persistent_workers=True`` the workers
        hold their own copy of the dataset, so this call does not reach them.

        Parameters
        ----------
        epoch : int
            Non-negative.
        """
        self.epoch = _non_negative_int("epoch", epoch)

    def __len__(self) -> int:
        return int(self.paths.shape[0])

    def __getitem__(self, i: int) -> dict:
        """Load and preprocess item ``i``.

        Returns
        -------
        dict
            ``image``: float32 tensor (3, S, S), normalized; ``tokens``: int64
            tensor (text_len,); ``label``: int64 scalar tensor.

        Raises
        ------
        IndexError
            If ``i`` is out of range.
        helpers.pipeline.images.BadImage
            If the file no longer decodes (it did when the index was scanned).
        """
        import torch

        n = len(self)
        i = int(i)
        if not -n <= i < n:
            raise IndexError(f"index {i} out of range for a dataset of {n} items")
        i %= n
        rgb = load_rgb(str(self.paths[i]))
        rng = item_generator(self.seed, self.epoch, i)
        params = sample_augment(rng, rgb.shape[0], rgb.shape[1], self.transform)
        image = augment_one(rgb, params, self.transform)
        tokens = encode_one(self.tokenizer, str(self.captions[i]), self.text_len)
        return {
            "image": torch.from_numpy(image),
            "tokens": torch.from_numpy(tokens),
            "label": torch.tensor(int(self.labels[i]), dtype=torch.int64),
        }


def collate_batch(samples) -> dict:
    """Stack samples into a batch (a module-level function, so workers can pickle it).

    Parameters
    ----------
    samples : sequence of dict
        Items of :class:`BaselineDataset`.

    Returns
    -------
    dict
        ``image`` (B, 3, S, S) float32, ``tokens`` (B, L) int64, ``label`` (B,) int64.

    Raises
    ------
    ParameterError
        If ``samples`` is empty.
    """
    import torch

    if len(samples) == 0:
        raise ParameterError("collate_batch got an empty list of samples; a batch needs at least one")
    return {
        "image": torch.stack([s["image"] for s in samples]),
        "tokens": torch.stack([s["tokens"] for s in samples]),
        "label": torch.stack([s["label"] for s in samples]),
    }


def host_to_device(batch: dict, acc, *, non_blocking: bool = False) -> tuple:
    """Copy a baseline batch to the device: ``(images, tokens, labels)`` as given.

    ``batch["image"]`` is float32 (B, 3, S, S) already normalized on the host;
    ``tokens`` int64 (B, L); ``label`` int64 (B,).
    """
    return tuple(batch[k].to(acc.device, non_blocking=non_blocking) for k in ("image", "tokens", "label"))
