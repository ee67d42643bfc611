"""Train a small residual MLP on synthetic data: many small element-wise operations per layer, run one by one.

Each block is LayerNorm, Linear, GELU, Linear and a residual add: in eager mode every one of them reads and writes
the whole activation, which ``torch.compile`` fuses. Whether that pays depends on how long the job runs: compiling
takes seconds to minutes, saved back a few milliseconds per step. Ask tune::

    workbook tune -- python examples/compile_mlp.py --epochs 5

examples/compile_mlp.expected.diff is tune's edit for torch.compile (see the note in it for what it measured).
"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Block(nn.Module):
    def __init__(self, width, hidden):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, hidden)
        self.down = nn.Linear(hidden, width)

    def forward(self, x):
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


class ResidualMLP(nn.Module):
    def __init__(self, features, width=128, hidden=512, depth=4, classes=10):
        super().__init__()
        self.stem = nn.Linear(features, width)
        self.blocks = nn.Sequential(*[Block(width, hidden) for _ in range(depth)])
        self.head = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, classes))

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)))


def make_data(n, features, classes, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    w = torch.randn(features, classes, generator=g)
    return TensorDataset(x, (x @ w).argmax(dim=1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()

    torch.manual_seed(0)
    train = DataLoader(make_data(4000, 64, 10, seed=1), batch_size=args.batch_size, shuffle=True)
    model = ResidualMLP(64)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    criterion = nn.CrossEntropyLoss()

    for epoch in range(args.epochs):
        for x, y in train:
            loss = criterion(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch} train loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
