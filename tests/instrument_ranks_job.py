"""A user's tiny DDP loop with the three-line instrument in it, for tests/test_instrument_ranks.py.

Run by torchrun (gloo, CPU). Environment: ``SLOW_NODE`` (a node rank whose ranks' loader sleeps ``SLOW_S``
per batch), ``SLOW_RANK`` (one global rank that does), ``STEPS``, ``NO_GROUP=1`` (no process group: the ranks
train apart and gather through files), ``DIE_RANK`` (that rank SIGKILLs itself before report()),
``EXIT_RANK`` (that rank exits 0 before it),
``STEPS_RANK``/``STEPS_EXTRA`` (that rank takes extra steps), ``SLOW_FORWARD_RANK`` (that rank's model forward
sleeps ``SLOW_S``: slow in its own compute, its loader as fast as the others'), ``WITH_MODEL=1`` (the DDP model is
passed to the instrument), ``OUT`` (rank 0 writes its report's as_dict() there).
"""

from __future__ import annotations

import json
import os
import signal
import time

import torch

from helpers.workbook.instrument import instrument

torch.set_num_threads(1)
rank, node = int(os.environ["RANK"]), int(os.environ.get("GROUP_RANK", "0"))
slow_s = float(os.environ.get("SLOW_S", "0.04"))
slow = str(node) == os.environ.get("SLOW_NODE") or str(rank) == os.environ.get("SLOW_RANK")
steps = int(os.environ.get("STEPS", "14")) + (int(os.environ.get("STEPS_EXTRA", "0"))
                                              if str(rank) == os.environ.get("STEPS_RANK") else 0)
group = os.environ.get("NO_GROUP") != "1"
if group:
    import torch.distributed as dist

    dist.init_process_group("gloo")
slow_forward = str(rank) == os.environ.get("SLOW_FORWARD_RANK")


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))

    def forward(self, x):
        if slow_forward:
            time.sleep(slow_s)  # a rank slow in its own compute (a sleep: the signal holds on a busy machine)
        return self.body(x)


model = Net()
if group:
    model = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
g = torch.Generator().manual_seed(rank)
batches = [(torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)) for _ in range(steps)]


def loader():
    for b in batches:
        if slow:
            time.sleep(slow_s)  # a reader that waits: the signal holds on a busy machine
        yield b


with_model = os.environ.get("WITH_MODEL") == "1"
loop = instrument(loader(), device="cpu", warmup=2, gather_timeout_s=float(os.environ.get("GATHER_TIMEOUT", "60")),
                  **({"model": model} if with_model else {}))
for x, y in loop:
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    time.sleep(0.005)  # a little device time of its own
if str(rank) == os.environ.get("DIE_RANK"):
    os.kill(os.getpid(), signal.SIGKILL)
if str(rank) == os.environ.get("EXIT_RANK"):
    os._exit(0)  # stops before report() without an error: torchrun lets the others finish
rep = loop.report()
if rank == 0 and os.environ.get("OUT"):
    with open(os.environ["OUT"], "w") as f:
        json.dump(rep.as_dict(), f, default=str)
if group:
    dist.destroy_process_group()
