"""A float32 MLP trained on a GPU with three habits that cost time there (tune's device candidates).

- float32 matmuls at torch's default precision ("highest"): a GPU with TF32 tensor cores (Ampere or later) is
  left to run them on its slower float32 path (the Guide: "Enable Tensor cores");
- the loss printed with ``.item()`` on every step: the host waits for the device each step (the Guide: "Avoid
  unnecessary CPU-GPU synchronization");
- the class weights made on the host and copied to the device on every step (the Guide: "Create tensors directly
  on the target device").

``workbook tune -- python examples/device_habits.py`` on a CUDA machine tries all three (``make device-check`` runs
it); on a CPU none applies, and tune says why. The data is made on the device, so no DataLoader is involved.
"""

import argparse

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=512)
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU(), nn.Linear(args.width, args.width), nn.ReLU(),
                          nn.Linear(args.width, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(args.batch_size, args.width, device=device)
    y = torch.randint(0, 10, (args.batch_size,), device=device)
    for step in range(args.steps):
        weights = torch.linspace(0.5, 1.5, 10).to(device)
        loss = nn.functional.cross_entropy(model(x), y, weight=weights)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
