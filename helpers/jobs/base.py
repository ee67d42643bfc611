"""What a training job is to the workbook: the :class:`Job` interface and its :class:`Workload`.

A Job says how to make its dataset and loader (from one validated
:class:`helpers.pipeline.loader.LoaderConfig`), its model, one training step
(forward, loss, backward, optimizer step, with the precision and memory-format
switches of :class:`StepOptions`), how a batch goes to the device, and what
its workload parameters are. The experiments (``helpers/experiments``) time
and compare jobs through this interface only, with the one phase-timed loop
:class:`helpers.compute.train.TimedLoop`; the built-in PPO job
(:class:`helpers.jobs.ppo.PPOJob`) is one implementation.
"""

from __future__ import annotations

import abc
import contextlib
from dataclasses import asdict, dataclass, fields
from typing import Any, Callable, Mapping

import torch

from helpers.errors import ParameterError, SampleError
from helpers.pipeline.baseline import collate_batch
from helpers.pipeline.loader import LoaderConfig, make_loader
from helpers.pipeline.seeding import SampleSeeder
from helpers.workload import WORKLOAD_PARAMS, Workload

__all__ = ["Job", "PerItemBatches", "StepOptions", "Workload", "WORKLOAD_PARAMS", "close_dataset",
           "description_text"]




@dataclass(frozen=True)
class StepOptions:
    """The switches of one training step.

    Attributes
    ----------
    autocast_dtype : torch.dtype or None
        Run forward and loss under ``torch.autocast`` with this dtype (None: fp32).
    channels_last : bool
        Model and images in the channels_last (NHWC) memory format.
    grad_scaler : bool or None
        Scale the loss with a GradScaler; None: exactly when ``autocast_dtype`` is float16.
    """

    autocast_dtype: torch.dtype | None = None
    channels_last: bool = False
    grad_scaler: bool | None = None

    @property
    def uses_scaler(self) -> bool:
        """Whether the step scales its loss (fp16 needs it; bf16 and fp32 do not)."""
        return self.autocast_dtype is torch.float16 if self.grad_scaler is None else bool(self.grad_scaler)


def description_text(description: Mapping[str, Any]) -> str:
    """A job's ``describe()`` as text: its name, then its other entries, ``"mnist (batch_size 64, seed 0)"``."""
    rest = ", ".join(f"{k} {v}" for k, v in description.items() if k != "job")
    name = str(description.get("job", "job"))
    return f"{name} ({rest})" if rest else name


def close_dataset(dataset: Any) -> None:
    """Release what a job's dataset holds (the batched pipeline's thread pool), where it has ``close()``."""
    close = getattr(dataset, "close", None)
    if close is not None:
        close()


class PerItemBatches:
    """Make a per-item dataset answer ``dataset[list_of_indices]`` with a batch, as a Job's dataset must.

    The batch is ``collate([dataset[i] for i in indices])``: exactly the
    per-item work, so a per-item dataset and a batched pipeline share one
    loader path (the one batch sampler). Picklable (for workers) when the
    wrapped dataset and ``collate`` are.

    Parameters
    ----------
    dataset : map-style dataset
        ``dataset[i]`` is one sample (e.g. :class:`helpers.pipeline.baseline.BaselineDataset`).
    collate : callable, optional
        Module-level function from a list of samples to a batch; default
        :func:`helpers.pipeline.baseline.collate_batch` (the built-in job's dict of image, tokens, label).
    sample_seed : int, optional
        Seed every sample's random augmentation from ``(sample_seed, epoch, index)``
        (:class:`helpers.pipeline.seeding.SampleSeeder`): the same sample gets the same augmentation in every
        configuration, process and worker, so two configurations of a job can be compared batch for batch.
        None (the built-in job, whose dataset seeds itself): the dataset's own randomness as it is.
    """

    def __init__(self, dataset, collate: Callable[[list], Any] | None = None, *,
                 sample_seed: int | None = None) -> None:
        self.dataset = dataset
        self.collate = collate or collate_batch
        self.seeder = SampleSeeder(sample_seed, dataset) if sample_seed is not None else None
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.dataset)

    def set_epoch(self, epoch: int) -> None:
        """Forward the epoch where the dataset draws augmentations per epoch (and seed samples from it)."""
        self.epoch = int(epoch)
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    def __getitem__(self, indices):
        """``collate([dataset[i] for i in indices])``.

        With ``sample_seed``, each ``dataset[i]`` runs after :meth:`SampleSeeder.seed_sample` for (epoch, i),
        and the generators' states are restored after the batch.

        Raises
        ------
        helpers.errors.SampleError
            When ``dataset[i]`` raises: the index, the user's frame and the cause (the original exception is
            its ``__cause__``).
        """
        epoch = getattr(indices, "epoch", None)  # tagged by the batch sampler: reaches persistent workers
        if epoch is not None and hasattr(self.dataset, "set_epoch") and getattr(self.dataset, "epoch", None) != epoch:
            self.dataset.set_epoch(epoch)
        epoch = self.epoch if epoch is None else int(epoch)
        samples = []
        with self.seeder.batch() if self.seeder is not None else contextlib.nullcontext():
            for i in indices:
                i = int(i)
                if self.seeder is not None:
                    self.seeder.seed_sample(epoch, i)
                try:
                    samples.append(self.dataset[i])
                except SampleError:
                    raise
                except Exception as exc:
                    raise SampleError.from_exception(i, exc) from exc
        return self.collate(samples)


class Job(abc.ABC):
    """A training job as the workbook sees it.

    Subclasses implement the abstract methods; :meth:`make_loader` and
    :meth:`describe` have defaults. A batch is whatever the dataset yields
    (a dict of host tensors for the built-in job); :meth:`to_device` turns
    it into the arguments of the step function.

    Attributes
    ----------
    name : str
        Whose job this is, as the report names it.
    workload : Workload
        Its workload parameters.
    """

    name: str = "job"
    workload: Workload

    #: The input pipelines this job can build (:meth:`make_dataset`'s ``pipeline``).
    pipelines: tuple[str, ...] = ("default",)

    @abc.abstractmethod
    def make_dataset(self, pipeline: str = "default", **options: Any) -> Any:
        """A map-style dataset whose ``dataset[list_of_indices]`` is one batch (host side).

        A per-item dataset (``dataset[i]`` is one sample) becomes one with :class:`PerItemBatches`.

        Raises
        ------
        ParameterError
            If ``pipeline`` is not one of :attr:`pipelines`.
        """

    def make_loader(self, dataset: Any, config: LoaderConfig, acc: Any = None, *, batch_sampler: Any = None):
        """A DataLoader over ``dataset`` built from one validated ``config``.

        Default: :func:`helpers.pipeline.loader.make_loader` with the batch
        sampler of :meth:`batch_sampler` (every job draws its batches in the
        same seeded order), so only what applies to ``config`` is passed on.

        Raises
        ------
        ParameterError
            If ``config.batch_size`` is not the workload's (the sampler makes the batches: change the
            workload's ``batch_size`` instead).
        """
        if config.batch_size != self.workload.batch_size:
            raise ParameterError(f"LoaderConfig.batch_size={config.batch_size} but the job's workload has "
                                 f"batch_size={self.workload.batch_size}; the job's batch sampler makes the batches, "
                                 "so set the workload's batch_size (notebook parameter batch_size)")
        sampler = batch_sampler if batch_sampler is not None else self.batch_sampler(len(dataset))
        return make_loader(dataset, config, acc, batch_sampler=sampler)

    @abc.abstractmethod
    def batch_sampler(self, n_items: int):
        """The one batch order: a sampler of index lists with ``set_epoch(epoch)``."""

    @abc.abstractmethod
    def make_model(self, acc: Any, options: StepOptions = StepOptions()) -> torch.nn.Module:
        """The model on ``acc.device``, seeded from the workload (same initial weights every time)."""

    @abc.abstractmethod
    def make_step(self, model: torch.nn.Module, acc: Any,
                  options: StepOptions = StepOptions()) -> Callable[[Any], Mapping[str, torch.Tensor]]:
        """One training step on a device batch: forward, loss, backward, optimizer step.

        Returns a function ``step(device_batch) -> stats`` (a dict of 0-d device tensors,
        read only after the step's timing). The step must not synchronize the device itself.
        """

    @abc.abstractmethod
    def to_device(self, batch: Any, acc: Any, *, non_blocking: bool = False,
                  options: StepOptions = StepOptions()) -> Any:
        """The host batch on the device, in the form :meth:`make_step`'s function takes."""

    def describe(self) -> dict[str, Any]:
        """Name and workload parameters, as records and the report show them."""
        return {"job": self.name, **self.workload.as_dict()}

    # -- what the job can do: experiments ask these, never which class a job is -----------------

    @property
    def is_builtin(self) -> bool:
        """Whether this is the workbook's own job, whose sizes the notebook's parameters set (False: a user's job,
        whose factory built its dataset and model; the workbook reads its batch size from it)."""
        return False

    def sentence(self) -> str:
        """The job in a few words, for a notebook's or a verdict's sentence: ``"your job 'mnist' (batch 64)"``."""
        return f"your job {self.name!r} (batch {self.workload.batch_size})"

    def summary(self) -> str:
        """:meth:`describe` as text (:func:`description_text`): ``"mnist (batch_size 64, seed 0)"``."""
        return description_text(self.describe())

    def item_count(self) -> int:
        """Samples in one epoch of the job's dataset (its first pipeline's), >= 1."""
        dataset = self.make_dataset(self.pipelines[0])
        try:
            return len(dataset)
        finally:
            close_dataset(dataset)

    @property
    def has_batched_pipeline(self) -> bool:
        """Whether :meth:`make_dataset` offers the workbook's batched decode (``"batched"``; the built-in job's)."""
        return "batched" in self.pipelines

    @property
    def model_width(self) -> int | None:
        """The conv width of the model, where the workbook sizes the model (the built-in job); None for a job that
        builds its own model."""
        return None

    @property
    def batch_multiple(self) -> int:
        """Every batch size this job can train is a multiple of this (the built-in job's PPO horizon: a batch is a
        whole number of rollouts); 1 for any batch size."""
        return 1

    @property
    def backward_passes(self) -> int | None:
        """Backward passes (so gradient allreduces under DDP) one training step makes, where the workbook knows it
        (the built-in job's ``ppo_epochs``); None for a job's own step (count them, as notebook 08 does)."""
        return None

    def with_model_width(self, model_width: int) -> "Job":
        """This job with its model built ``model_width`` wide.

        Raises
        ------
        ParameterError
            For a job that builds its own model (:attr:`model_width` is None): its factory sizes it.
        """
        raise ParameterError(f"model_width={model_width}: it sizes the built-in job's policy; your job "
                             f"{self.name!r} builds its own model, so leave model_width at None and change its "
                             "size in your job's factory")

    def image_encoder(self, model: torch.nn.Module) -> torch.nn.Module | None:
        """The convolutional image encoder of ``model`` (one of :meth:`make_model`'s), timed alone by notebooks 06
        and 07, or None when the model is the job's own (then they time its whole step)."""
        return None

    def gradient_loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor | None:
        """A scalar loss whose ``backward()`` leaves one step's gradients in ``model`` (notebook 08 sizes DDP's
        buckets with it), or None when only the job's own step (:meth:`make_step`) can make them."""
        return None

    def image_data(self) -> tuple[Any, Any] | None:
        """The scanned images and caption tokenizer the workbook's own pipelines read, ``(DatasetIndex,
        tokenizers.Tokenizer)`` (the built-in job's), or None for a job whose factory built its own dataset."""
        return None

    def synthetic_batch(self, acc: Any, *, seed: int = 0) -> Any | None:
        """A device batch of the job's shapes and dtypes with random contents (no input pipeline), for timing the
        step alone (notebook 05), or None where the workbook does not know the shapes (a user's job: time it on
        its first real batch)."""
        return None
