"""Train a small image classifier whose samples are augmented in two DataLoader workers, on a machine of few cores.

The workers run their ops on one thread each (torch sets it in every worker), while the training process keeps
torch's default of one intra-op thread per core: on 2 cores, 2 busy workers and 2 compute threads want 4. Make it
faster::

    workbook tune -- python examples/threads_oversubscribed.py --epochs 2

examples/threads_oversubscribed.expected.diff is tune's edit for it (see the note in it).
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Augmented(Dataset):
    """Synthetic 3 x 64 x 64 images, each blurred, flipped and cropped at random when it is drawn."""

    def __init__(self, n, classes, seed):
        g = torch.Generator().manual_seed(seed)
        self.images = torch.randn(n, 3, 72, 72, generator=g)
        self.labels = torch.randint(0, classes, (n,), generator=g)
        self.kernel = torch.ones(3, 1, 5, 5) / 25

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        x = F.conv2d(self.images[i : i + 1], self.kernel, padding=2, groups=3)[0]
        if torch.rand(()) < 0.5:
            x = x.flip(-1)
        top, left = torch.randint(0, 9, (2,)).tolist()
        return x[:, top : top + 64, left : left + 64].contiguous(), self.labels[i]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()

    torch.manual_seed(0)
    loader = DataLoader(Augmented(2048, 10, seed=1), batch_size=args.batch_size, shuffle=True, num_workers=2)
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 16 * 16, 256), nn.ReLU(), nn.Linear(256, 10),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    criterion = nn.CrossEntropyLoss()

    for epoch in range(args.epochs):
        for x, y in loader:
            loss = criterion(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch} loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
