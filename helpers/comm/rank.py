"""One rank's place in a process group: joining it from torchrun's environment.

Shared by the collective tasks (:mod:`helpers.comm.allreduce`, :mod:`helpers.comm.ddp`) and by the
rank entry point :mod:`helpers.comm.worker`, which dispatches to them; kept apart so that the tasks
need not import their dispatcher.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class RankContext:
    """Where this rank runs: rank, world size, local rank, backend, torch device and its sync function."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: Any
    sync: Callable[[], None]


def init_rank(backend: str, *, timeout_s: float = 600.0) -> RankContext:
    """Join the default process group from torchrun's environment variables.

    On nccl/hccl the rank uses device ``LOCAL_RANK`` (one process per device);
    on gloo the CPU.

    Raises
    ------
    KeyError
        If RANK / WORLD_SIZE / LOCAL_RANK are not set (not started by torchrun).
    """
    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    if backend == "hccl":
        import torch_npu  # noqa: F401  registers the "hccl" backend (fact-check line 91)
    kind = {"nccl": "cuda", "hccl": "npu"}.get(backend, "cpu")
    if kind == "cpu":
        device = torch.device("cpu")

        def sync() -> None:
            return None
    else:
        device = torch.device(kind, local)
        getattr(torch, kind).set_device(device)
        mod = getattr(torch, kind)

        def sync() -> None:
            mod.synchronize()
    dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    return RankContext(rank, world, local, backend, device, sync)
