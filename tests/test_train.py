"""The timed training loop and the host-bound verdict."""

from __future__ import annotations

import time

import pytest
import torch

from helpers.compute.model import PolicyConfig, build_policy
from helpers.compute.ppo import PPOConfig, PPOTrainer
from helpers.compute.train import PHASES, TimedLoop, epochs
from helpers.experiments.baseline import classify
from helpers.device import get_accelerator
from helpers.errors import ParameterError

TINY = PolicyConfig(image_size=16, conv_channels=(4, 8), vocab_size=16, text_len=4, d_model=8, n_heads=2,
                    n_layers=1, fusion_hidden=16, n_actions=3)


class SlowLoader:
    """A loader whose batches take ``delay_s`` of host time each; counts epochs."""

    def __init__(self, n_batches=3, batch=8, delay_s=0.0):
        self.n_batches, self.batch, self.delay_s = n_batches, batch, delay_s
        self.epochs = 0

    def __iter__(self):
        self.epochs += 1
        g = torch.Generator().manual_seed(self.epochs)
        for _ in range(self.n_batches):
            if self.delay_s:
                time.sleep(self.delay_s)
            yield {"image": torch.randn(self.batch, 3, 16, 16, generator=g),
                   "tokens": torch.randint(1, 16, (self.batch, 4), generator=g),
                   "label": torch.randint(0, 3, (self.batch,), generator=g)}


class EpochDataset:
    def __init__(self):
        self.epochs = []

    def set_epoch(self, epoch):
        self.epochs.append(epoch)


@pytest.fixture
def trainer():
    torch.manual_seed(0)
    return PPOTrainer(build_policy(TINY), PPOConfig(horizon=2, ppo_epochs=1))


def _run(loader, trainer, acc, *, steps, warmup_steps, datasets=()):
    """The phase-timed loop over a loader of baseline batches: copy in h2d, the PPO step in compute."""
    move = lambda b: tuple(b[k].to(acc.device) for k in ("image", "tokens", "label"))  # noqa: E731
    loop = TimedLoop(epochs(loader, datasets=datasets), move, lambda b: trainer.step(*b), acc.synchronize)
    return loop.run(warmup_steps, measured=False).discard().run(steps).result()


def test_loop_times_each_phase_of_measured_steps_only(trainer):
    acc = get_accelerator("cpu")
    ds = EpochDataset()
    run = _run(SlowLoader(n_batches=3, delay_s=0.02), trainer, acc, steps=5, warmup_steps=2, datasets=[ds])
    assert len(run.steps) == 5 and run.warmup_steps == 2
    assert set(PHASES) <= set(run.phases["phase"])
    assert len(run.phases) == 5 * 3
    steps = run.steps
    assert (steps["step_s"] - steps[list(PHASES)].sum(axis=1)).abs().max() < 1e-9
    assert (steps["data"] >= 0.019).all(), "the loader's sleep is charged to the data phase"
    assert ((steps["exposed_fraction"] > 0) & (steps["exposed_fraction"] < 1)).all()
    assert {"loss", "reward_mean", "entropy"} <= set(steps.columns)
    assert steps["loss"].notna().all()
    # 7 steps over 3-batch epochs: epochs 0, 1, 2 started, each announced to the dataset
    assert ds.epochs == [0, 1, 2]
    med = run.phase_medians()
    assert med["step_s"] > 0 and 0 < run.exposed_fraction < 1
    # the timeline starts at the first measured step
    assert run.phases["step"].min() == 0 and run.phases["start_s"].min() >= 0


def test_loop_rejects_an_empty_loader(trainer):
    acc = get_accelerator("cpu")
    with pytest.raises(ParameterError, match="smaller than one batch"):
        _run(SlowLoader(n_batches=0), trainer, acc, steps=1, warmup_steps=0)


def test_classify_host_bound_reason_is_computed_from_the_split():
    label, reason = classify(0.6, 0.1, device_kind="cuda")
    assert label == "host-bound"
    assert "60%" in reason and "40%" in reason and "20%" in reason and "threshold 10%" in reason
    label, reason = classify(0.05, 0.1, device_kind="cpu")
    assert label == "device-bound" and "5%" in reason and "same CPU" in reason
    assert classify(0.1, 0.1)[0] == "device-bound"  # at the threshold: not above it


@pytest.mark.parametrize("exposed", [i / 100 for i in range(11, 100, 2)])
def test_classify_label_follows_the_larger_lever_at_every_share(exposed):
    """Above the threshold the label names the larger saving: host-bound from a third of the step on, else
    balanced (issue 21: "host-bound" beside "the compute side is the larger lever" contradicted itself)."""
    label, reason = classify(exposed, 0.1, device_kind="cuda")
    input_saving = 100 * exposed
    compute_saving = (100 - input_saving) / 2
    if input_saving >= compute_saving:
        assert label == "host-bound" and reason.endswith("the input is the larger lever")
    else:
        assert label == "balanced" and "the compute is the larger lever" in reason
    assert f"{compute_saving:.0f}%" in reason and f"{input_saving:.0f}%" in reason
