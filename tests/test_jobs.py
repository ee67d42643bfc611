"""The Job layer: one Workload, the built-in PPOJob, the one timed loop and the shared training experiments."""

from __future__ import annotations

import pytest
import torch

from helpers.compute.train import TimedLoop, epochs
from helpers.device import get_accelerator
from helpers.errors import ParameterError
from helpers.experiments.training import fixed_batches, prepare_job, time_job
from helpers.jobs.base import WORKLOAD_PARAMS, Job, PerItemBatches, StepOptions, Workload
from helpers.jobs.ppo import PPOJob
from helpers.pipeline.dataset import build_embedded, load_dataset
from helpers.pipeline.text import load_or_build_tokenizer

TINY = Workload(batch_size=4, image_size=32, text_len=4, model_width=4, d_model=8, seed=0)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    index = load_dataset(build_embedded(tmp_path_factory.mktemp("emb") / "d", n_images=12, seed=3))
    return PPOJob(index, load_or_build_tokenizer(index, text_len=TINY.text_len), TINY)


@pytest.fixture(scope="module")
def cpu():
    return get_accelerator("cpu")


def test_workload_is_validated_and_read_from_parameters():
    assert Workload.from_params({"batch_size": "8", "image_size": 64, "other": 1}) == Workload(batch_size=8,
                                                                                               image_size=64)
    assert "seed" not in WORKLOAD_PARAMS and "batch_size" in WORKLOAD_PARAMS
    for bad in ({"batch_size": 0}, {"seed": -1}, {"d_model": True}, {"image_size": 1.5}):
        with pytest.raises(ParameterError, match="Workload"):
            Workload(**bad)


def test_ppo_job_is_a_job_with_two_pipelines_that_feed_the_same_samples(job, cpu):
    assert isinstance(job, Job) and job.pipelines == ("baseline", "cached", "batched")
    base, fast = job.make_dataset("baseline"), job.make_dataset("batched")
    try:
        idx = next(iter(job.batch_sampler(len(base))))
        b, f = base[idx], fast[idx]
        assert torch.equal(b["label"], f["label"]) and torch.equal(b["tokens"], f["tokens"])
        bx, _, _ = job.to_device(b, cpu)
        fx, _, _ = job.to_device(f, cpu, options=StepOptions(channels_last=True))
        assert bx.shape == fx.shape == (4, 3, 32, 32) and bx.dtype == fx.dtype == torch.float32
        assert fx.is_contiguous(memory_format=torch.channels_last)
        assert (bx - fx).abs().mean() < 0.1  # same crops and flips; the decoders differ slightly
    finally:
        fast.close()
    with pytest.raises(ParameterError, match="pipeline='dali'"):
        job.make_dataset("dali")


def test_models_start_from_the_same_weights_and_steps_train(job, cpu):
    a, b = job.make_model(cpu), job.make_model(cpu)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    batch = fixed_batches(job, cpu, 1)[0]
    stats = job.make_step(a, cpu)(batch)
    assert {"loss", "value_loss"} <= set(stats) and torch.isfinite(stats["loss"])
    assert not all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert job.describe()["job"] == "built-in PPO job" and job.describe()["images"] == 12


def test_fp16_options_ask_for_a_scaler_bf16_not():
    assert StepOptions(autocast_dtype=torch.float16).uses_scaler
    assert not StepOptions(autocast_dtype=torch.bfloat16).uses_scaler
    assert not StepOptions().uses_scaler and StepOptions(grad_scaler=True).uses_scaler


def test_timed_loop_times_every_phase_and_separates_warmup(cpu):
    calls = []
    loop = TimedLoop(iter(range(100)), lambda b: calls.append(("h2d", b)) or b,
                     lambda b: calls.append(("compute", b)) or {"loss": torch.tensor(float(b))}, cpu.synchronize)
    loop.run(2, measured=False).run(3)
    df = loop.steps_frame()
    assert list(df["loss"]) == [2.0, 3.0, 4.0] and len(loop.steps_frame(measured_only=False)) == 5
    assert (df["step_s"] >= df["compute"]).all() and set(df["exposed_fraction"].between(0, 1)) == {True}
    run = loop.result()
    assert run.warmup_steps == 2 and list(run.steps["step"]) == [0, 1, 2]
    assert sorted(set(run.phases["step"])) == [0, 1, 2]
    assert calls[:2] == [("h2d", 0), ("compute", 0)]
    after = loop.discard().run(1).result()
    assert after.warmup_steps == 5 and len(after.steps) == 1


def test_epochs_sets_the_epoch_and_rejects_an_empty_loader():
    class Data:
        epoch = None

        def set_epoch(self, e):
            self.epoch = e

    d = Data()
    it = epochs([1, 2], datasets=[d])
    assert [next(it) for _ in range(5)] == [1, 2, 1, 2, 1] and d.epoch == 2
    with pytest.raises(ParameterError, match="no batch"):
        next(epochs([]))


def test_time_job_runs_the_baseline_and_the_batched_pipeline(job, cpu):
    base = time_job(job, cpu, steps=2, warmup_steps=1)
    fast = time_job(job, cpu, steps=2, warmup_steps=1, pipeline="batched")
    for run in (base, fast):
        assert len(run.steps) == 2 and run.warmup_steps == 1
        assert {"data", "h2d", "compute", "step_s", "loss"} <= set(run.steps.columns)
    # the first measured step of both pipelines saw the same samples: the same reward statistics
    assert base.steps["reward_mean"].iloc[0] == pytest.approx(fast.steps["reward_mean"].iloc[0], abs=0.5)
    with pytest.raises(ParameterError, match="steps must be >= 1"):
        time_job(job, cpu, steps=0)


def test_prepare_job_gives_a_loop_over_the_jobs_loader(job, cpu):
    timed = prepare_job(job, cpu)
    try:
        run = timed.loop.run(1, measured=False).discard().run(2).result()
        assert len(run.steps) == 2
        batch = next(timed.loop.batches)
        assert timed.step(job.to_device(batch, cpu))["loss"].isfinite()
    finally:
        timed.close()


def test_fixed_batches_are_cloned_device_batches(job, cpu):
    batches = fixed_batches(job, cpu, 2)
    assert len(batches) == 2 and batches[0][0].data_ptr() != batches[1][0].data_ptr()
    with pytest.raises(ParameterError):
        fixed_batches(job, cpu, 0)


# ------------------------------------------------------------------ a job that is not the built-in one


class Pictures(torch.utils.data.Dataset):
    """A per-item dataset of random 8x8 images with a label: what a user's own dataset looks like."""

    def __init__(self, n=24):
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 3, (n,), generator=g)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def stack(samples):
    """Module-level collate (picklable): a dict batch of inputs and targets."""
    xs, ys = zip(*samples)
    return {"x": torch.stack(xs), "y": torch.stack(ys)}


class ClassifierJob(Job):
    """A plain supervised job written against the public interface only."""

    name = "tiny classifier"

    def __init__(self):
        self.workload = Workload(batch_size=6, image_size=8)

    def make_dataset(self, pipeline="default", **options):
        if pipeline not in self.pipelines:
            raise ParameterError(f"pipeline={pipeline!r}")
        return PerItemBatches(Pictures(), collate=stack)

    def batch_sampler(self, n_items):
        from helpers.pipeline.sampler import batch_sampler

        return batch_sampler(n_items, self.workload.batch_size, seed=self.workload.seed)

    def make_model(self, acc, options=StepOptions()):
        torch.manual_seed(self.workload.seed)
        return torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.Flatten(), torch.nn.Linear(144, 3)).to(acc.device)

    def make_step(self, model, acc, options=StepOptions()):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(batch):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(batch["x"]), batch["y"])
            loss.backward()
            opt.step()
            return {"loss": loss.detach()}

        return step

    def to_device(self, batch, acc, *, non_blocking=False, options=StepOptions()):
        return {k: v.to(acc.device, non_blocking=non_blocking) for k, v in batch.items()}


def test_a_users_job_runs_through_the_timed_loop_and_fixed_batches(cpu):
    job = ClassifierJob()
    run = time_job(job, cpu, steps=5, warmup_steps=1)
    assert len(run.steps) == 5 and run.steps["loss"].notna().all() and (run.steps["step_s"] > 0).all()
    batches = fixed_batches(job, cpu, 2)
    assert set(batches[0]) == {"x", "y"} and batches[0]["x"].shape == (6, 1, 8, 8)
    fresh = job.to_device(job.make_dataset()[list(range(6))], cpu)
    assert batches[0]["x"].data_ptr() != fresh["x"].data_ptr()  # cloned, not the pipeline's own tensor
    assert job.describe()["job"] == "tiny classifier"


def test_a_jobs_options_are_checked_not_dropped(cpu):
    from helpers.pipeline.loader import LoaderConfig

    job = ClassifierJob()
    with pytest.raises(ParameterError, match="offers: default"):
        time_job(job, cpu, steps=1, pipeline="batched")
    with pytest.raises(ParameterError, match="workload has batch_size=6"):
        time_job(job, cpu, steps=1, loader=LoaderConfig(batch_size=16))
    with pytest.raises(TypeError):
        time_job(job, cpu, steps=1, num_workers=2)  # not a dataset option in disguise
