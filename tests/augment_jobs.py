"""Three image jobs with random augmentations, written the way users write them (tests of issue 21).

Each is a PIL folder dataset over the workbook's embedded photos whose ``__getitem__`` does a random
resized crop and a horizontal flip, drawing from one source of randomness:

- ``make_random_job``: Python's ``random`` (``random.uniform``, ``random.random``), as hand-written
  augmentations usually do;
- ``make_numpy_job``: NumPy's global generator (``np.random.uniform``, ``np.random.rand``);
- ``make_torch_job``: torch's default generator, as torchvision's transforms draw their parameters
  (``RandomResizedCrop.get_params`` uses ``torch.empty(1).uniform_`` and ``torch.randint``;
  ``RandomHorizontalFlip`` uses ``torch.rand(1)``), written here as a torchvision-style transform class
  because torchvision's wheel does not import beside this torch build;
- ``make_object_rng_job``: a ``numpy.random.Generator`` made in the dataset's ``__init__`` (field case 1);
- ``make_mixed_job``: all three global sources in one sample (the crop's scale from ``random``, its aspect ratio
  from NumPy, its position and the flip from torch), as a job that stacks transforms from several libraries does:
  one runner pass covers the three seedings at once.

None of them seeds anything: the workbook must make the same sample get the same augmentation in every
configuration it compares.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn

SUFFIXES = (".jpg", ".jpeg", ".png")


def _crop_box(w: int, h: int, scale: float, ratio: float, fx: float, fy: float) -> tuple[int, int, int, int]:
    area = w * h * scale
    cw = max(1, min(w, int(round(math.sqrt(area * ratio)))))
    ch = max(1, min(h, int(round(math.sqrt(area / ratio)))))
    x0, y0 = int(fx * (w - cw)), int(fy * (h - ch))
    return x0, y0, x0 + cw, y0 + ch


class TorchRandomResizedCrop:
    """A torchvision-style RandomResizedCrop + RandomHorizontalFlip on a PIL image (torch's generator)."""

    def __init__(self, size: int, scale=(0.35, 1.0), ratio=(3 / 4, 4 / 3)) -> None:
        self.size, self.scale, self.ratio = size, scale, ratio

    def __call__(self, im: Image.Image) -> Image.Image:
        w, h = im.size
        scale = torch.empty(1).uniform_(*self.scale).item()
        log_r = torch.empty(1).uniform_(math.log(self.ratio[0]), math.log(self.ratio[1])).item()
        fx = torch.randint(0, 1001, (1,)).item() / 1000
        fy = torch.randint(0, 1001, (1,)).item() / 1000
        im = im.resize((self.size, self.size), Image.BILINEAR, box=_crop_box(w, h, scale, math.exp(log_r), fx, fy))
        if torch.rand(1).item() < 0.5:
            im = im.transpose(Image.FLIP_LEFT_RIGHT)
        return im


class AugmentedPhotos(torch.utils.data.Dataset):
    """Photos -> (3 x size x size float tensor in [0, 1], class index), randomly cropped and flipped."""

    def __init__(self, root, size: int = 48, source: str = "random", limit: int | None = None) -> None:
        files = sorted(p for p in Path(root).rglob("*") if p.suffix.lower() in SUFFIXES)
        self.items = [(p, i % 4) for i, p in enumerate(files[:limit] if limit else files)]
        self.size, self.source = size, source
        self.transform = TorchRandomResizedCrop(size) if source == "torch" else None
        self.rng = np.random.default_rng() if source == "object" else None  # unseeded, copied into workers

    def __len__(self) -> int:
        return len(self.items)

    def _draw(self) -> tuple[float, float, float, float, bool]:
        if self.source == "random":
            return (random.uniform(0.35, 1.0), math.exp(random.uniform(math.log(3 / 4), math.log(4 / 3))),
                    random.random(), random.random(), random.random() < 0.5)
        if self.source == "numpy":
            return (float(np.random.uniform(0.35, 1.0)), float(np.exp(np.random.uniform(np.log(3 / 4), np.log(4 / 3)))),
                    float(np.random.rand()), float(np.random.rand()), bool(np.random.rand() < 0.5))
        if self.source == "mixed":
            return (random.uniform(0.35, 1.0), float(np.exp(np.random.uniform(np.log(3 / 4), np.log(4 / 3)))),
                    torch.rand(1).item(), torch.rand(1).item(), bool(torch.rand(1).item() < 0.5))
        u = self.rng.random(5)
        return 0.35 + 0.65 * u[0], math.exp(math.log(3 / 4) + u[1] * math.log(16 / 9)), u[2], u[3], bool(u[4] < 0.5)

    def __getitem__(self, i: int):
        path, label = self.items[i]
        with Image.open(path) as im:
            im = im.convert("RGB")
            if self.transform is not None:
                im = self.transform(im)
            else:
                scale, ratio, fx, fy, flip = self._draw()
                im = im.resize((self.size, self.size), Image.BILINEAR,
                               box=_crop_box(*im.size, scale, ratio, fx, fy))
                if flip:
                    im = im.transpose(Image.FLIP_LEFT_RIGHT)
            x = torch.from_numpy(np.asarray(im, dtype=np.float32) / 255.0).permute(2, 0, 1).contiguous()
        return x, label


class SmallNet(nn.Module):
    def __init__(self, n_classes: int = 4, width: int = 8) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
                                      nn.MaxPool2d(2), nn.Conv2d(width, 2 * width, 3, padding=1),
                                      nn.BatchNorm2d(2 * width), nn.ReLU())
        self.head = nn.Linear(2 * width, n_classes)

    def forward(self, x):
        return self.head(self.features(x).mean(dim=(2, 3)))


def _make(source: str, data_dir=None, batch_size: int = 16, max_images: int = 0, seed: int = 0):
    from helpers.jobs.supervised import supervised_job
    from helpers.pipeline.dataset import ensure_embedded

    root = Path(data_dir) if data_dir else ensure_embedded()
    data = AugmentedPhotos(root, source=source, limit=max_images or 96)
    return supervised_job(data, SmallNet, lambda out, y: nn.functional.cross_entropy(out, y, label_smoothing=0.1),
                          lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True),
                          batch_size=batch_size, seed=seed, name=f"augmented photos ({source})")


def make_random_job(data_dir=None, batch_size: int = 16, max_images: int = 0, seed: int = 0):
    return _make("random", data_dir, batch_size, max_images, seed)


def make_numpy_job(data_dir=None, batch_size: int = 16, max_images: int = 0, seed: int = 0):
    return _make("numpy", data_dir, batch_size, max_images, seed)


def make_torch_job(data_dir=None, batch_size: int = 16, max_images: int = 0, seed: int = 0):
    return _make("torch", data_dir, batch_size, max_images, seed)


def make_object_rng_job(data_dir=None, batch_size: int = 16, max_images: int = 0, seed: int = 0):
    return _make("object", data_dir, batch_size, max_images, seed)


def make_mixed_job(data_dir=None, batch_size: int = 16, max_images: int = 0, seed: int = 0):
    return _make("mixed", data_dir, batch_size, max_images, seed)
