"""Train a small classifier on synthetic data, as a script looks after a debugging session: it still works, slowly.

Anomaly detection is still on (set while a NaN was hunted), the validation loop runs the model with gradients
enabled, the gradients are zeroed in place, and Adam runs its default for-loop implementation. Make it faster::

    workbook tune -- python examples/debug_left_on.py --epochs 4

examples/debug_left_on.expected.diff is tune's edit for its anomaly detection and validation loop (see the note in it).
"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def make_data(n, features, classes, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    w = torch.randn(features, classes, generator=g)
    return TensorDataset(x, (x @ w).argmax(dim=1))


def evaluate(model, loader, criterion):
    model.eval()
    total, correct, loss_sum = 0, 0, 0.0
    for x, y in loader:
        logits = model(x)
        loss_sum += criterion(logits, y).item() * len(y)
        correct += (logits.argmax(dim=1) == y).sum().item()
        total += len(y)
    model.train()
    return loss_sum / total, correct / total


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()

    torch.manual_seed(0)
    torch.autograd.set_detect_anomaly(True)  # find where the NaN comes from
    train = DataLoader(make_data(640, 256, 10, seed=1), batch_size=args.batch_size, shuffle=True)
    val = DataLoader(make_data(640, 256, 10, seed=2), batch_size=args.batch_size)

    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    criterion = nn.CrossEntropyLoss()

    for epoch in range(args.epochs):
        for x, y in train:
            loss = criterion(model(x), y)
            optimizer.zero_grad(set_to_none=False)
            loss.backward()
            optimizer.step()
        val_loss, accuracy = evaluate(model, val, criterion)
        print(f"epoch {epoch} train loss {loss.item():.3f} val loss {val_loss:.3f} accuracy {accuracy:.2f}")


if __name__ == "__main__":
    main()
