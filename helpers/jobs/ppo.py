"""The workbook's built-in training job: PPO on a multimodal policy, fed JPEG photos and captions.

This is the one place where the built-in job is assembled (dataset, loader,
model, trainer, batch transfer); notebooks 01, 05-07, 09, 10 and the DDP
variants of 08 get it from here, through the :class:`helpers.jobs.base.Job`
interface, from one :class:`helpers.jobs.base.Workload`.

Three input pipelines, chosen by :meth:`PPOJob.make_dataset`:

``"baseline"``
    :class:`helpers.pipeline.baseline.BaselineDataset` (per-image Pillow
    decode, augment, normalize and tokenize in the calling process), batched
    by :class:`PerItemBatches`; the batch is float32 NCHW, normalized on the host.
``"batched"``
    :class:`helpers.pipeline.fast.BatchedDataset` (a thread pool decodes a
    whole batch with libjpeg-turbo and DCT-domain scaling into one uint8 NHWC
    buffer); :func:`helpers.pipeline.fast.to_device_batch` converts and
    normalizes on the device.
``"cached"``
    :class:`helpers.pipeline.image_cache.CachedDataset`: the batched pipeline
    reading every image from the decoded-image cache (decoded once, kept at
    the size its crops need), so a batch decodes nothing.

All seed every item's crop and flip from ``(seed, epoch, index)`` and all are
drawn in the order of one :func:`helpers.pipeline.sampler.batch_sampler`, so the
pipelines feed the same samples in the same order.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

import torch

from helpers.compute.amp import make_grad_scaler
from helpers.compute.model import PolicyConfig, build_policy
from helpers.compute.ppo import PPOConfig, PPOTrainer, ppo_loss
from helpers.errors import ParameterError
from helpers.jobs.base import Job, PerItemBatches, StepOptions, Workload
from helpers.pipeline.baseline import BaselineDataset, ImageTransformConfig, host_to_device
from helpers.pipeline.fast import BatchedDataset, to_device_batch
from helpers.pipeline.prepare import prepare_data
from helpers.pipeline.sampler import batch_sampler

__all__ = ["PPOJob", "PPOStep", "host_to_device"]


class PPOJob(Job):
    """The built-in job: a multimodal policy (conv image encoder, text transformer, fused head) trained with PPO.

    Parameters
    ----------
    index : helpers.pipeline.dataset.DatasetIndex
        The images, captions and labels.
    tokenizer : tokenizers.Tokenizer
        Caption tokenizer (:func:`helpers.pipeline.text.load_or_build_tokenizer`).
    workload : Workload
        Batch size, crop, caption length, model size, seed.
    n_actions : int, optional
        Policy actions; default one per class, at least 2.
    ppo : helpers.compute.ppo.PPOConfig, optional
        PPO hyper-parameters (default ``PPOConfig()``).
    name : str
        How the report names the job.
    """

    pipelines = ("baseline", "cached", "batched")

    def __init__(self, index, tokenizer, workload: Workload, *, n_actions: int | None = None,
                 ppo: PPOConfig | None = None, name: str = "built-in PPO job") -> None:
        self.index, self.tokenizer, self.workload = index, tokenizer, workload
        self.n_actions = n_actions
        self.ppo = ppo or PPOConfig()
        self.name = name

    @classmethod
    def from_data(cls, workload: Workload, data_dir: str | None = None, *, max_images: int = 0,
                  any_batch_size: bool = False, **kwargs: Any) -> "PPOJob":
        """Load the images (embedded photos when ``data_dir`` is empty) and build the job.

        ``any_batch_size``: the data need not hold one batch (a caller that draws its batches from a decoded pool,
        with repetition, as notebook 09 does); by default it must, as every loader of the job needs.

        Raises
        ------
        helpers.errors.DataError
            Missing, empty or undecodable folder, or fewer images than one batch (unless ``any_batch_size``).
        """
        index, tokenizer = prepare_data(data_dir or None, max_images=max_images, seed=workload.seed,
                                        batch_size=1 if any_batch_size else workload.batch_size,
                                        text_len=workload.text_len)
        return cls(index, tokenizer, workload, **kwargs)

    @classmethod
    def from_params(cls, params: Mapping[str, Any], **kwargs: Any) -> "PPOJob":
        """The job of a notebook's parameters (``data_dir``, ``max_images`` and the workload's names)."""
        return cls.from_data(Workload.from_params(params), params.get("data_dir") or None,
                             max_images=int(params.get("max_images") or 0), **kwargs)

    # -- the input ------------------------------------------------------------------------

    def make_dataset(self, pipeline: str = "baseline", *, threads: int = 0, pin_memory: bool = False,
                     max_cache_bytes: int | None = None, **options: Any):
        """The dataset of one pipeline (``"baseline"``, ``"cached"`` or ``"batched"``, see the module docstring).

        ``"cached"`` is the batched pipeline reading the decoded-image cache
        (:mod:`helpers.pipeline.image_cache`: every image decoded once, kept at the size its crops need in a
        memory-mapped file; built on first use, rebuilt when the folder changed).

        Parameters
        ----------
        threads : int
            Decode threads of the batched pipelines (0: all usable cores).
        pin_memory : bool
            The batched pipelines write their batches into pinned buffers (only in the main process).
        max_cache_bytes : int, optional
            ``"cached"``: bound on the cache's size (default
            :data:`helpers.pipeline.image_cache.DEFAULT_MAX_BYTES`).
        **options
            Passed to the dataset (e.g. ``transform``, ``decode``).

        Raises
        ------
        ParameterError
            If ``pipeline`` is unknown.
        helpers.errors.DataError
            ``"cached"``: the cache would exceed its bound.
        """
        w = self.workload
        if pipeline == "baseline":
            return PerItemBatches(BaselineDataset(self.index, self.tokenizer, image_size=w.image_size,
                                                  text_len=w.text_len, seed=w.seed, **options))
        if pipeline == "batched":
            return BatchedDataset(self.index, self.tokenizer, image_size=w.image_size, text_len=w.text_len,
                                  seed=w.seed, threads=threads, pin_memory=pin_memory, **options)
        if pipeline == "cached":
            from helpers.pipeline.image_cache import DEFAULT_MAX_BYTES, CachedDataset, open_image_cache

            transform = options.pop("transform", None) or ImageTransformConfig(image_size=w.image_size)
            cache, _ = open_image_cache(self.index, transform, max_bytes=max_cache_bytes or DEFAULT_MAX_BYTES,
                                        threads=threads)
            return CachedDataset(self.index, self.tokenizer, cache=cache, image_size=w.image_size,
                                 text_len=w.text_len, seed=w.seed, threads=threads, pin_memory=pin_memory,
                                 transform=transform, **options)
        raise ParameterError(f"pipeline={pipeline!r}; allowed: {', '.join(self.pipelines)}")

    def batch_sampler(self, n_items: int):
        """The seeded epoch batch order shared by every pipeline (:func:`helpers.pipeline.sampler.batch_sampler`)."""
        return batch_sampler(n_items, self.workload.batch_size, seed=self.workload.seed)

    def to_device(self, batch: dict, acc, *, non_blocking: bool = False,
                  options: StepOptions = StepOptions()) -> tuple:
        """``(images, tokens, labels)`` on the device; images float32 NCHW (or NHWC with channels_last).

        A batched-pipeline batch (uint8 NHWC) is converted and normalized on the
        device (:func:`helpers.pipeline.fast.to_device_batch`); a baseline batch is copied.
        """
        move = to_device_batch if batch["image"].dtype == torch.uint8 else host_to_device
        images, tokens, labels = move(batch, acc, non_blocking=non_blocking)
        if options.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return images, tokens, labels

    # -- the model and its step -------------------------------------------------------------

    def policy_config(self) -> PolicyConfig:
        """The policy's sizes from the workload (:meth:`helpers.compute.model.PolicyConfig.for_job`)."""
        w = self.workload
        cfg = PolicyConfig.for_job(image_size=w.image_size, model_width=w.model_width, d_model=w.d_model,
                                   text_len=w.text_len, vocab_size=self.tokenizer.get_vocab_size(),
                                   n_classes=self.index.n_classes)
        return replace(cfg, n_actions=self.n_actions) if self.n_actions else cfg

    def make_model(self, acc, options: StepOptions = StepOptions()) -> torch.nn.Module:
        """The policy on ``acc.device``, initialized from ``workload.seed`` (the same weights every call)."""
        torch.manual_seed(self.workload.seed)
        model = build_policy(self.policy_config(), device=acc.device)
        if options.channels_last:
            model = model.to(memory_format=torch.channels_last)
        return model

    def make_trainer(self, model: torch.nn.Module, acc, options: StepOptions = StepOptions()) -> PPOTrainer:
        """The PPO trainer of ``model`` (with a GradScaler when the options ask for one)."""
        scaler = make_grad_scaler(acc.kind, options.autocast_dtype) if options.uses_scaler else None
        return PPOTrainer(model, self.ppo, scaler=scaler)

    def make_step(self, model: torch.nn.Module, acc, options: StepOptions = StepOptions(), *,
                  generator: torch.Generator | None = None) -> "PPOStep":
        """``step((images, tokens, labels)) -> stats``: one PPO step (rollout, GAE, update epochs).

        ``generator`` samples the actions (default: a device generator seeded from the workload).
        """
        gen = generator or torch.Generator(device=acc.device).manual_seed(self.workload.seed)
        return PPOStep(self.make_trainer(model, acc, options), gen, options.autocast_dtype)

    def describe(self) -> dict[str, Any]:
        """Name, workload and data: what the report says was measured."""
        return {**super().describe(), "images": len(self.index), "classes": self.index.n_classes}

    # -- what the job can do (helpers.jobs.base.Job) --------------------------------------------

    @property
    def is_builtin(self) -> bool:
        """True: the notebook's parameters size this job."""
        return True

    def sentence(self) -> str:
        """``"the built-in PPO job (batch 32, 64 px, width 16)"``."""
        w = self.workload
        return f"the {self.name} (batch {w.batch_size}, {w.image_size} px, width {w.model_width})"

    def item_count(self) -> int:
        """Images in the dataset index."""
        return len(self.index)

    @property
    def model_width(self) -> int:
        """The policy's conv width (``workload.model_width``)."""
        return self.workload.model_width

    @property
    def batch_multiple(self) -> int:
        """The PPO horizon: a batch is a whole number of rollouts of ``ppo.horizon`` samples."""
        return self.ppo.horizon

    @property
    def backward_passes(self) -> int:
        """``ppo.ppo_epochs``: each PPO step's updates, each with a backward pass."""
        return self.ppo.ppo_epochs

    def with_model_width(self, model_width: int) -> "PPOJob":
        """The same job with the policy ``model_width`` wide (the same data, tokenizer and PPO settings)."""
        if model_width == self.workload.model_width:
            return self
        return PPOJob(self.index, self.tokenizer, replace(self.workload, model_width=model_width),
                      n_actions=self.n_actions, ppo=self.ppo, name=self.name)

    def image_encoder(self, model: torch.nn.Module) -> torch.nn.Module:
        """``model.image_encoder``: the policy's conv encoder."""
        return model.image_encoder

    def gradient_loss(self, model: torch.nn.Module, batch: tuple) -> torch.Tensor:
        """A deterministic PPO loss of one device batch ``(images, tokens, labels)``: the rollout quantities
        (actions from the labels, old log-probabilities, rewards, advantages) come from the same forward, detached,
        so the gradients are the same on every call."""
        images, tokens, labels = batch
        logits, values = model(images, tokens)
        with torch.no_grad():
            actions = labels % logits.shape[1]
            old = torch.log_softmax(logits.float(), dim=1).gather(1, actions[:, None]).squeeze(1)
            rewards = (logits.argmax(1) == actions).float()
            adv = rewards - values.float()
        loss, _ = ppo_loss(logits, actions, old, adv, values, rewards)
        return loss

    def image_data(self) -> tuple:
        """``(index, tokenizer)``: the images and caption tokenizer of this job's pipelines."""
        return self.index, self.tokenizer

    def synthetic_batch(self, acc, *, seed: int = 0) -> tuple:
        """``(images, tokens, labels)`` of the workload's shapes with random contents, on ``acc.device``: float32
        (B, 3, S, S), int64 (B, L) token ids >= 1, int64 (B,) labels (one of the policy's actions)."""
        w, cfg = self.workload, self.policy_config()
        g = torch.Generator().manual_seed(seed)
        images = torch.randn(w.batch_size, 3, w.image_size, w.image_size, generator=g).to(acc.device)
        tokens = torch.randint(1, cfg.vocab_size, (w.batch_size, w.text_len), generator=g).to(acc.device)
        labels = torch.randint(0, cfg.n_actions, (w.batch_size,), generator=g).to(acc.device)
        return images, tokens, labels


class PPOStep:
    """One PPO training step on a device batch: ``step((images, tokens, labels)) -> stats``.

    Attributes
    ----------
    trainer : helpers.compute.ppo.PPOTrainer
        The trainer (its model, optimizer and, for fp16, GradScaler).
    generator : torch.Generator
        Samples the rollout's actions.
    autocast_dtype : torch.dtype or None
        Forward and loss under autocast with this dtype (None: fp32).
    """

    def __init__(self, trainer: PPOTrainer, generator: torch.Generator, autocast_dtype: torch.dtype | None) -> None:
        self.trainer, self.generator, self.autocast_dtype = trainer, generator, autocast_dtype

    def __call__(self, device_batch: tuple) -> dict:
        """Run the step; the stats are 0-d device tensors (read them after the step's timing)."""
        images, tokens, labels = device_batch
        return self.trainer.step(images, tokens, labels, generator=self.generator,
                                 autocast_dtype=self.autocast_dtype)
