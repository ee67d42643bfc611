"""The common supervised job in one call: a dataset, a model, a loss function and an optimizer factory.

A user whose training is slow writes, in their own file::

    from helpers.jobs.supervised import supervised_job

    def make_job():
        return supervised_job(MyDataset("/data/train"), lambda: MyNet(), torch.nn.functional.cross_entropy,
                              lambda params: torch.optim.SGD(params, lr=0.1), batch_size=64, name="my classifier")

and points the workbook at it (``python -m helpers diagnose --job myjob.py:make_job``). Their dataset
yields one sample per index, as any map-style ``torch.utils.data.Dataset`` does (``(input, target)``
tuples, dicts, dataclasses or nested lists of tensors, numbers or arrays); the batch is made by
``torch.utils.data.default_collate`` unless they pass their own ``collate``. Everything the workbook
varies (the loader's workers and pinning, autocast, channels_last) goes through the :class:`~helpers.jobs.base.Job`
interface, so the experiments measure their job the way they measure the built-in one.

Random augmentations (Python's ``random``, NumPy's global generator, torch's generator as torchvision's
transforms use it, or RNG objects the dataset holds) are seeded per sample from ``(seed, epoch, index)``
inside the workbook's wrapper (:class:`~helpers.jobs.base.PerItemBatches` with ``sample_seed``), so two
configurations of their job see the same augmented samples and can be compared batch for batch; the
generators' states are restored after every batch.

For anything else (a custom step, several models, a batched dataset) a user writes a :class:`Job`
subclass; :class:`helpers.jobs.ppo.PPOJob` is the worked example.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from helpers.errors import ParameterError
from helpers.jobs.base import Job, PerItemBatches, StepOptions, Workload
from helpers.pipeline.sampler import batch_sampler
from helpers.pipeline.transfer import map_tensors

__all__ = ["SupervisedJob", "supervised_job", "move_to_device", "JobError"]


class JobError(ParameterError):
    """A user's job is not usable as written: the message names the job, the part that failed and what to do."""


def move_to_device(batch: Any, device: Any, *, non_blocking: bool = False, channels_last: bool = False) -> Any:
    """Move every tensor of a nested batch to ``device``, keeping the structure.

    Parameters
    ----------
    batch : tensor, dict, list, tuple, namedtuple or dataclass instance (nested)
        Non-tensor leaves (numbers, strings, None) are kept as they are.
    device : torch.device or str
    non_blocking : bool
        Passed to ``Tensor.to`` (overlaps the copy with compute from pinned memory).
    channels_last : bool
        4-d floating-point tensors are returned in ``torch.channels_last`` memory format.

    Returns
    -------
    The same structure with tensors on ``device``.

    Raises
    ------
    DataError
        For a leaf that is neither a tensor nor a plain value (e.g. a PIL image left uncollated), naming its path.
    """
    def move(x: "torch.Tensor") -> "torch.Tensor":
        y = x.to(device, non_blocking=non_blocking)
        if channels_last and y.dim() == 4 and y.is_floating_point():
            y = y.contiguous(memory_format=torch.channels_last)
        return y

    return map_tensors(move, batch)


def _split(batch: Any) -> tuple[Any, Any]:
    """(inputs, target) of a batch: a pair ``(x, y)``, or a mapping with ``input``/``x`` and ``target``/``y``/``label``."""
    if isinstance(batch, Mapping):
        x = next((batch[k] for k in ("input", "inputs", "x", "image", "images") if k in batch), None)
        y = next((batch[k] for k in ("target", "targets", "y", "label", "labels") if k in batch), None)
        if x is None or y is None:
            raise JobError(f"a dict batch needs an input key (input, x, image) and a target key (target, y, label); "
                           f"got keys {sorted(batch)}: rename them, or pass split=(lambda b: (inputs, target))")
        return x, y
    if isinstance(batch, (list, tuple)) and len(batch) == 2:
        return batch[0], batch[1]
    raise JobError(f"a batch of type {type(batch).__name__} is not an (input, target) pair; return (x, y) from the "
                   "dataset, or pass split=(lambda batch: (inputs, target))")


@dataclasses.dataclass
class SupervisedJob(Job):
    """A supervised job: ``loss = loss_fn(model(inputs), target)``, one optimizer step per batch.

    Parameters
    ----------
    dataset : map-style dataset
        ``dataset[i]`` is one sample; ``len(dataset)`` is its size.
    model_fn : callable
        ``model_fn() -> torch.nn.Module`` (called for every fresh model, after seeding).
    loss_fn : callable
        ``loss_fn(output, target) -> 0-d tensor``.
    optimizer_fn : callable
        ``optimizer_fn(model.parameters()) -> torch.optim.Optimizer``.
    batch_size : int
        Samples per step.
    name : str
        How the report names the job.
    seed : int
        Seed of the batch order and of the model's initial weights.
    collate : callable, optional
        List of samples -> batch; default ``torch.utils.data.default_collate``. Module-level (picklable) for
        DataLoader workers under spawn.
    split : callable, optional
        Device batch -> ``(inputs, target)``; default: a pair, or a dict with input/target keys.
    max_items : int, optional
        Use at most this many samples (the first ones); the workbook never reads more.
    """

    dataset: Any
    model_fn: Callable[[], torch.nn.Module]
    loss_fn: Callable[[Any, Any], torch.Tensor]
    optimizer_fn: Callable[[Any], torch.optim.Optimizer]
    batch_size: int
    name: str = "supervised job"
    seed: int = 0
    collate: Callable[[list], Any] | None = None
    split: Callable[[Any], tuple[Any, Any]] | None = None
    max_items: int | None = None

    pipelines = ("default",)

    def __post_init__(self) -> None:
        for label, fn in (("model_fn", self.model_fn), ("loss_fn", self.loss_fn),
                          ("optimizer_fn", self.optimizer_fn)):
            if not callable(fn):
                raise JobError(f"job {self.name!r}: {label} must be callable, got {type(fn).__name__}")
        try:
            n = len(self.dataset)
        except TypeError:
            raise JobError(f"job {self.name!r}: the dataset has no len(): pass a map-style dataset "
                           "(dataset[i] is one sample), not an iterable") from None
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise JobError(f"job {self.name!r}: batch_size must be an int >= 1, got {self.batch_size!r}")
        if n < self.batch_size:
            raise JobError(f"job {self.name!r}: the dataset has {n} sample(s), fewer than batch_size="
                           f"{self.batch_size}: lower batch_size or give more data")
        self.workload = Workload(batch_size=self.batch_size, seed=self.seed)

    def __len__(self) -> int:
        n = len(self.dataset)
        return min(n, self.max_items) if self.max_items else n

    def make_dataset(self, pipeline: str = "default", **options: Any) -> Any:
        """The user's dataset, answering ``dataset[list_of_indices]`` with a collated batch."""
        if pipeline not in self.pipelines:
            raise ParameterError(f"job {self.name!r} offers: {', '.join(self.pipelines)}; got pipeline={pipeline!r}")
        if options:
            raise ParameterError(f"job {self.name!r}: its dataset takes no options, got {sorted(options)}")
        collate = self.collate or torch.utils.data.default_collate
        ds = PerItemBatches(self.dataset, collate=collate, sample_seed=self.seed)
        if self.max_items:
            return _Head(ds, self.max_items)
        return ds

    def batch_sampler(self, n_items: int):
        """The one seeded batch order (:func:`helpers.pipeline.sampler.batch_sampler`)."""
        return batch_sampler(n_items, self.batch_size, seed=self.seed)

    def make_model(self, acc: Any, options: StepOptions = StepOptions()) -> torch.nn.Module:
        """``model_fn()`` after seeding, on the device (channels_last when asked)."""
        torch.manual_seed(self.seed)
        try:
            model = self.model_fn()
        except Exception as exc:
            raise JobError(f"job {self.name!r}: model_fn() raised {type(exc).__name__}: {exc}") from exc
        if not isinstance(model, torch.nn.Module):
            raise JobError(f"job {self.name!r}: model_fn() returned {type(model).__name__}, not a torch.nn.Module")
        model = model.to(acc.device)
        if options.channels_last:
            model = model.to(memory_format=torch.channels_last)
        return model

    def make_step(self, model: torch.nn.Module, acc: Any,
                  options: StepOptions = StepOptions()) -> Callable[[Any], Mapping[str, torch.Tensor]]:
        """``step(device_batch) -> {"loss": 0-d tensor}``: forward and loss (under autocast when asked), backward,
        optimizer step (with a GradScaler when the options say so). The first step checks that the loss is a
        finite scalar (one sync, before any timing matters)."""
        try:
            opt = self.optimizer_fn(model.parameters())
        except Exception as exc:
            raise JobError(f"job {self.name!r}: optimizer_fn(model.parameters()) raised {type(exc).__name__}: "
                           f"{exc}") from exc
        scaler = torch.amp.GradScaler(acc.kind) if options.uses_scaler else None
        split = self.split or _split
        checked = [False]
        name = self.name

        def step(batch: Any) -> dict[str, torch.Tensor]:
            inputs, target = split(batch)
            opt.zero_grad(set_to_none=True)
            with acc.autocast(options.autocast_dtype) if options.autocast_dtype is not None else contextlib.nullcontext():
                output = model(*inputs) if isinstance(inputs, (list, tuple)) else model(inputs)
                loss = self.loss_fn(output, target)
            if not checked[0]:
                if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
                    shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
                    raise JobError(f"job {name!r}: loss_fn returned {shape}, not a 0-d tensor: reduce it (e.g. "
                                   "mean) in loss_fn")
                if not math.isfinite(float(loss.detach())):
                    raise JobError(f"job {name!r}: the loss is {float(loss.detach())} on the first step: check "
                                   "the inputs' scale and the model's output before measuring its speed")
                checked[0] = True
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()
            return {"loss": loss.detach()}

        return step

    def to_device(self, batch: Any, acc: Any, *, non_blocking: bool = False,
                  options: StepOptions = StepOptions()) -> Any:
        """Every tensor of the batch on the device (:func:`move_to_device`)."""
        return move_to_device(batch, acc.device, non_blocking=non_blocking, channels_last=options.channels_last)

    def describe(self) -> dict[str, Any]:
        """The job's name, batch size, seed and dataset size."""
        return {"job": self.name, "batch_size": self.batch_size, "seed": self.seed, "samples": len(self)}


class _Head:
    """The first ``n`` items of a batched dataset (a bounded subset)."""

    def __init__(self, dataset: Any, n: int) -> None:
        self.dataset, self.n = dataset, min(int(n), len(dataset))

    def __len__(self) -> int:
        return self.n

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)

    def __getitem__(self, indices):
        return self.dataset[indices]


def supervised_job(dataset: Any, model_fn: Callable[[], torch.nn.Module], loss_fn: Callable[[Any, Any], torch.Tensor],
                   optimizer_fn: Callable[[Any], torch.optim.Optimizer], *, batch_size: int,
                   name: str = "supervised job", seed: int = 0, collate: Callable[[list], Any] | None = None,
                   split: Callable[[Any], tuple[Any, Any]] | None = None,
                   max_items: int | None = None) -> SupervisedJob:
    """The one-call adapter: a :class:`SupervisedJob` from the four things every supervised job has.

    Parameters and errors: see :class:`SupervisedJob`.

    Returns
    -------
    SupervisedJob
    """
    return SupervisedJob(dataset, model_fn, loss_fn, optimizer_fn, batch_size, name=name, seed=seed,
                         collate=collate, split=split, max_items=max_items)
