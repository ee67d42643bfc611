"""A 4-rank gloo DDP job on CPU that writes one torch.profiler trace per rank into one folder.

Run it as a script (the tests start it in a child process, so that no process group lives in pytest)::

    python tests/ddp_trace_job.py OUT_DIR [--slow-rank 2] [--sleep-ms 40] [--world-size 4] [--active 10] \
        [--then-even DIR]

Every rank trains a tiny MLP under DistributedDataParallel on batches from a DataLoader (``num_workers=0``, so
the batch is made on the training thread, inside the profiler's ``enumerate(DataLoader)`` span). The dataset of
``--slow-rank`` sleeps ``--sleep-ms`` per batch: that rank is the straggler whose slow input the others wait for
in the gradient allreduce. ``torch.profiler.schedule(wait=1, warmup=1, active=N)`` and
``tensorboard_trace_handler(OUT_DIR)`` write ``<host>_<pid>.<time>.pt.trace.json`` per rank, the torch default
file name, which carries no rank: the rank is only in the file's ``distributedInfo``.

Each rank uses one intra-op thread (``torch.set_num_threads(1)``): four ranks share a 2-core machine.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from pathlib import Path


class BatchDataset:
    """``n`` batches of ``(x, y)``, one per index (the DataLoader runs with ``batch_size=None``); sleeps
    ``sleep_s`` seconds before making each batch."""

    def __init__(self, n: int, batch: int, features: int, sleep_s: float, seed: int) -> None:
        self.n, self.batch, self.features, self.sleep_s, self.seed = n, batch, features, sleep_s, seed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        import torch

        if self.sleep_s > 0:
            time.sleep(self.sleep_s)
        g = torch.Generator().manual_seed(self.seed * 1000 + i)
        x = torch.randn(self.batch, self.features, generator=g)
        return x, (x.sum(dim=1, keepdim=True) > 0).float()


def rank_main(rank: int, world_size: int, port: int, runs: list[tuple[str, int]], sleep_s: float,
              active: int) -> None:
    """One rank: init gloo, then each run ``(out_dir, slow_rank)`` in turn, one trace per run."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        for out_dir, slow_rank in runs:
            train(rank, out_dir, sleep_s if rank == slow_rank else 0.0, active)
            dist.barrier()
    finally:
        dist.destroy_process_group()


def train(rank: int, out_dir: str, sleep_s: float, active: int) -> None:
    """A fresh DDP model trained for 2 + ``active`` steps under the profiler, its trace written to ``out_dir``."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    steps = 2 + active  # schedule: 1 wait, 1 warm-up, `active` recorded steps
    loader = torch.utils.data.DataLoader(BatchDataset(steps, 16, 32, sleep_s, seed=rank), batch_size=None,
                                         num_workers=0)
    sched = torch.profiler.schedule(wait=1, warmup=1, active=active, repeat=1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=sched,
                                on_trace_ready=torch.profiler.tensorboard_trace_handler(out_dir)) as prof:
        for x, y in loader:
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            prof.step()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(out_dir: str | Path, *, world_size: int = 4, slow_rank: int = -1, sleep_ms: float = 40.0,
        active: int = 10, then_even: str | Path | None = None) -> Path:
    """Run the job; one trace per rank lands in ``out_dir``. ``slow_rank=-1``: no rank sleeps. ``then_even``: the
    same ranks then run the job again with no rank sleeping, into that folder (one start-up for both)."""
    import torch.multiprocessing as mp

    runs = [(str(out_dir), slow_rank)] + ([(str(then_even), -1)] if then_even is not None else [])
    for d, _ in runs:
        Path(d).mkdir(parents=True, exist_ok=True)
    mp.spawn(rank_main, args=(world_size, free_port(), runs, sleep_ms / 1000.0, active), nprocs=world_size,
             join=True)
    return Path(out_dir)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir")
    p.add_argument("--world-size", type=int, default=4)
    p.add_argument("--slow-rank", type=int, default=-1, help="the rank whose dataset sleeps (-1: none)")
    p.add_argument("--sleep-ms", type=float, default=40.0, help="the slow rank's sleep per batch, ms")
    p.add_argument("--active", type=int, default=10, help="profiled steps per rank")
    p.add_argument("--then-even", metavar="DIR", help="then run again with no rank sleeping, traces into DIR")
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    run(a.out_dir, world_size=a.world_size, slow_rank=a.slow_rank, sleep_ms=a.sleep_ms, active=a.active,
        then_even=a.then_even)
    print(f"traces in {a.out_dir} after {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
