"""Train a small image classifier: a plain training script, written the way its user writes it.

argparse, a PIL dataset with torchvision-style transforms, a small CNN, SGD, a checkpoint at the end. Nothing
in it comes from the workbook (the embedded photos are used only when no --data-dir is given). Make it faster::

    workbook tune -- python examples/train_script.py --epochs 2

examples/train_script.expected.diff is the change tune wrote for it on a 2-core CPU.
"""

import argparse
import csv
import random
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Compose:
    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, img):
        for t in self.transforms:
            img = t(img)
        return img


class RandomResizedCrop:
    """Crop a random 60-100% square of the image and resize it to size x size."""

    def __init__(self, size):
        self.size = size

    def __call__(self, img):
        w, h = img.size
        side = int(min(w, h) * random.uniform(0.6, 1.0))
        x, y = random.randint(0, w - side), random.randint(0, h - side)
        return img.crop((x, y, x + side, y + side)).resize((self.size, self.size), Image.BILINEAR)


class RandomHorizontalFlip:
    def __call__(self, img):
        return img.transpose(Image.FLIP_LEFT_RIGHT) if random.random() < 0.5 else img


class ToTensorNormalize:
    def __init__(self, mean, std):
        self.mean = torch.tensor(mean).view(3, 1, 1)
        self.std = torch.tensor(std).view(3, 1, 1)

    def __call__(self, img):
        x = torch.from_numpy(np.asarray(img, dtype=np.float32) / 255.0).permute(2, 0, 1)
        return (x - self.mean) / self.std


class Photos(Dataset):
    """Rows of manifest.csv (file, label) -> (image tensor, label)."""

    def __init__(self, root, transform):
        self.root = Path(root)
        with open(self.root / "manifest.csv", newline="") as f:
            self.rows = [(r["file"], int(r["label"])) for r in csv.DictReader(f)]
        self.transform = transform

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        file, label = self.rows[i]
        with Image.open(self.root / file) as im:
            img = im.convert("RGB")
        return self.transform(img), label


class Net(nn.Module):
    def __init__(self, n_classes):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
        )
        self.head = nn.Linear(64, n_classes)

    def forward(self, x):
        return self.head(self.body(x).mean(dim=(2, 3)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=None, help="folder with manifest.csv (default: the sample photos)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--out", default="checkpoint.pt")
    args = parser.parse_args()

    data_dir = args.data_dir
    if data_dir is None:
        from helpers.pipeline.dataset import ensure_embedded  # the workbook's sample photos

        data_dir = ensure_embedded()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    transform = Compose([RandomResizedCrop(args.image_size), RandomHorizontalFlip(),
                         ToTensorNormalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    dataset = Photos(data_dir, transform)
    n_classes = max(label for _, label in dataset.rows) + 1
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, drop_last=True)

    model = Net(n_classes).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    criterion = nn.CrossEntropyLoss()

    step = 0
    for epoch in range(args.epochs):
        model.train()
        for images, labels in loader:
            images, labels = images.to(device), labels.to(device)
            logits = model(images)
            loss = criterion(logits, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step % 10 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.3f}")
    torch.save(model.state_dict(), args.out)


if __name__ == "__main__":
    main()
