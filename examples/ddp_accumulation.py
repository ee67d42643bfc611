"""Train a small MLP with DistributedDataParallel and gradient accumulation: a torchrun script, as its user writes it.

argparse, gloo (CPU), a DistributedSampler, the loss divided over ``--accum-steps`` micro-batches whose gradients
add up before each optimizer step, a checkpoint from rank 0 at the end. Every ``backward()`` all-reduces the
gradients, also on the micro-steps that do not step the optimizer. Nothing in it comes from the workbook. Make
it faster::

    workbook tune -- torchrun --nproc-per-node 2 examples/ddp_accumulation.py

examples/ddp_accumulation.expected.diff is the change tune wrote for it on a 2-core CPU.
"""

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def make_data(n, features, classes, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    w = torch.randn(features, classes, generator=g)
    return TensorDataset(x, (x @ w).argmax(dim=1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=8, help="samples per micro-batch, per rank")
    parser.add_argument("--accum-steps", type=int, default=4, help="micro-batches per optimizer step")
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--out", default="ddp_checkpoint.pt")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    data = make_data(8192, 64, 10)
    sampler = DistributedSampler(data, seed=0)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, drop_last=True)

    model = nn.Sequential(nn.Linear(64, args.width), nn.ReLU(), nn.Linear(args.width, args.width), nn.ReLU(),
                          nn.Linear(args.width, args.width), nn.ReLU(), nn.Linear(args.width, 10))
    model = DDP(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    criterion = nn.CrossEntropyLoss()

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        for i, (x, y) in enumerate(loader):
            loss = criterion(model(x), y) / args.accum_steps
            loss.backward()
            if (i + 1) % args.accum_steps == 0:
                optimizer.step()
                optimizer.zero_grad()
                if rank == 0 and (i + 1) % (20 * args.accum_steps) == 0:
                    print(f"epoch {epoch} step {(i + 1) // args.accum_steps} loss {loss.item() * args.accum_steps:.3f}")
    if rank == 0:
        torch.save(model.module.state_dict(), args.out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
