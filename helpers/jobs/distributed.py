"""Any job as one rank of a DDP job: the same Job, its model wrapped in DistributedDataParallel.

When ``diagnose`` is started by torchrun (``torchrun --nproc-per-node N -m helpers diagnose --job ...``),
every rank loads the user's job and trains it through :class:`DistributedJob`: the model is wrapped in
:class:`torch.nn.parallel.DistributedDataParallel` (so each backward pass allreduces the gradients over the
device's backend: hccl, nccl or gloo), and each rank draws its own batch order (epoch ``e`` of rank ``r``
is the job's epoch ``e * world_size + r``), so the ranks see different samples as a DistributedSampler
would arrange. Nothing in the user's job changes.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import torch
from torch.nn.parallel import DistributedDataParallel

from helpers.jobs.base import Job, StepOptions

__all__ = ["DistributedJob"]


class _RankSampler:
    """The job's batch sampler, its epochs interleaved over the ranks."""

    def __init__(self, inner: Any, rank: int, world_size: int) -> None:
        self.inner, self.rank, self.world_size = inner, rank, world_size
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        self.inner.set_epoch(int(epoch) * self.world_size + self.rank)

    def __len__(self) -> int:
        return len(self.inner)

    def __iter__(self):
        return iter(self.inner)


class DistributedJob(Job):
    """``job`` as rank ``rank`` of ``world_size``: DDP around its model, a batch order of its own.

    Parameters
    ----------
    job : Job
        The user's job (or the built-in one), loaded in this rank.
    rank, world_size : int
        This process's place in the default process group (initialized by the caller).
    """

    def __init__(self, job: Job, rank: int, world_size: int) -> None:
        self.job, self.rank, self.world_size = job, int(rank), int(world_size)
        self.name = f"{job.name} (DDP, {self.world_size} ranks)"
        self.workload = job.workload
        self.pipelines = job.pipelines

    def make_dataset(self, pipeline: str = "default", **options: Any) -> Any:
        """The job's own dataset."""
        return self.job.make_dataset(pipeline, **options)

    def batch_sampler(self, n_items: int):
        """The job's sampler, epoch ``e`` of this rank being the job's epoch ``e * world_size + rank``."""
        return _RankSampler(self.job.batch_sampler(n_items), self.rank, self.world_size)

    def make_loader(self, dataset: Any, config: Any, acc: Any = None, *, batch_sampler: Any = None):
        """The job's own loader, over this rank's batch order."""
        sampler = batch_sampler if batch_sampler is not None else self.batch_sampler(len(dataset))
        return self.job.make_loader(dataset, config, acc, batch_sampler=sampler)

    def make_model(self, acc: Any, options: StepOptions = StepOptions()) -> torch.nn.Module:
        """The job's model (same seed on every rank), wrapped in DistributedDataParallel."""
        model = self.job.make_model(acc, options)
        ids = [acc.device.index] if acc.device.type != "cpu" and acc.device.index is not None else None
        return DistributedDataParallel(model, device_ids=ids)

    def make_step(self, model: torch.nn.Module, acc: Any,
                  options: StepOptions = StepOptions()) -> Callable[[Any], Mapping[str, torch.Tensor]]:
        """The job's own step on the DDP model (its backward pass allreduces the gradients)."""
        return self.job.make_step(model, acc, options)

    def to_device(self, batch: Any, acc: Any, *, non_blocking: bool = False,
                  options: StepOptions = StepOptions()) -> Any:
        """The job's own copy to the device."""
        return self.job.to_device(batch, acc, non_blocking=non_blocking, options=options)

    def describe(self) -> dict[str, Any]:
        """The job's description, with the rank and the world size."""
        return {**self.job.describe(), "job": self.name, "rank": self.rank, "world_size": self.world_size}
