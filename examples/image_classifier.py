"""An image classifier over a folder of photos, written as its user writes it: a PIL Dataset, a small CNN,
cross-entropy and SGD. Nothing in the model or data code comes from the workbook; only ``make_job`` hands
the four pieces to its one-call adapter.

Run the workbook on it::

    python -m helpers diagnose --job examples/image_classifier.py:make_job
    python -m helpers run --profile smoke --job examples/image_classifier.py:make_job

The folder: ``data_dir`` (class subfolders of .jpg/.png, as torchvision's ImageFolder reads, or a
``manifest.csv`` of ``file,label``), else the workbook's embedded photos (built on first use).
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import Dataset

SUFFIXES = (".jpg", ".jpeg", ".png")


class PhotoFolder(Dataset):
    """Photos -> (3 x size x size float tensor in [0, 1], class index).

    Labels from ``root/manifest.csv`` (columns ``file``, ``label``) when it exists, else from the class
    subfolders ``root/<class>/<image>``.
    """

    def __init__(self, root: str | os.PathLike, size: int = 64, limit: int | None = None) -> None:
        root = Path(root)
        manifest = root / "manifest.csv"
        if manifest.is_file():
            with open(manifest, newline="", encoding="utf-8") as f:
                rows = [(root / r["file"], int(r["label"])) for r in csv.DictReader(f)]
            self.classes = sorted({label for _, label in rows})
            self.items = rows
        else:
            files = sorted(p for p in root.rglob("*") if p.suffix.lower() in SUFFIXES and not p.name.startswith("."))
            self.classes = sorted({p.parent.name for p in files})
            self.items = [(p, self.classes.index(p.parent.name)) for p in files]
        if limit:
            self.items = self.items[:limit]
        self.n_classes = (max(label for _, label in self.items) + 1) if manifest.is_file() else len(self.classes)
        self.size = size

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        path, label = self.items[i]
        with Image.open(path) as im:
            im = im.convert("RGB").resize((self.size, self.size), Image.BILINEAR)
            x = torch.from_numpy(np.asarray(im, dtype=np.float32) / 255.0).permute(2, 0, 1)
        return x, label


class SmallCNN(nn.Module):
    def __init__(self, n_classes: int, width: int = 16) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(2 * width, 4 * width, 3, padding=1), nn.BatchNorm2d(4 * width), nn.ReLU(),
        )
        self.head = nn.Linear(4 * width, n_classes)

    def forward(self, x):
        return self.head(self.features(x).mean(dim=(2, 3)))


def _photos(data_dir: str | None) -> Path:
    if data_dir:
        return Path(data_dir)
    from helpers.pipeline.dataset import ensure_embedded  # the workbook's sample photos, when no folder is given

    return ensure_embedded()


def make_job(data_dir: str | None = None, batch_size: int = 32, image_size: int = 64, seed: int = 0,
             max_images: int = 0):
    from helpers.jobs.supervised import supervised_job

    dataset = PhotoFolder(_photos(data_dir), size=image_size, limit=max_images or None)
    n_classes = max(1, dataset.n_classes)
    return supervised_job(dataset, lambda: SmallCNN(n_classes), nn.functional.cross_entropy,
                          lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9), batch_size=batch_size,
                          seed=seed, name="image classifier (examples/image_classifier.py)")
