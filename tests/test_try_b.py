"""The "try it" functions of notebooks 05, 06 and 07 (helpers/experiments/overlap, precision, memory_format).

Behaviour only, at tiny sizes: each returns a LivePoint with its metric and unit, the knob values reach the
mechanism (the loader's workers, the policy's width, the autocast dtype, the memory format), a bad knob raises
ParameterError before any work, progress is reported. No test asserts a speed.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from helpers.compute.ppo import PPOTrainer
from helpers.device import get_accelerator
from helpers.errors import ParameterError
from helpers.experiments import memory_format as mf
from helpers.experiments import overlap as ov
from helpers.experiments import precision as pr
from helpers.jobs.base import Workload
from helpers.jobs.ppo import PPOJob
from helpers.jobs.supervised import supervised_job
from helpers.live import LivePoint


@pytest.fixture(scope="module")
def cpu():
    return get_accelerator("cpu")


@pytest.fixture(scope="module")
def small_data(tmp_path_factory):
    from helpers.pipeline.dataset import build_embedded, load_dataset
    from helpers.pipeline.text import build_tokenizer

    index = load_dataset(build_embedded(tmp_path_factory.mktemp("emb") / "d", n_images=16, seed=5))
    return index, build_tokenizer(list(index.captions), vocab_size=128)


@pytest.fixture(scope="module")
def job(small_data):
    index, tokenizer = small_data
    return PPOJob(index, tokenizer, Workload(batch_size=4, image_size=16, text_len=4, model_width=4, d_model=8))


@pytest.fixture(scope="module")
def batches(job, cpu):
    return [job.synthetic_batch(cpu, seed=s) for s in range(2)]


class Ticks:
    """A progress callback that keeps what it was told."""

    def __init__(self):
        self.calls = []

    def __call__(self, done, total):
        self.calls.append((done, total))

    def check(self, total):
        assert self.calls, "progress was never called"
        done = [d for d, _ in self.calls]
        assert done == sorted(done) and done[-1] == total and {t for _, t in self.calls} == {total}


def with_capabilities(acc, **changes):
    """The accelerator with some capabilities replaced (a device this machine is not)."""
    return dataclasses.replace(acc, capabilities=dataclasses.replace(acc.capabilities, **changes))


class Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, i):
        return torch.full((4,), float(i % 5)), torch.tensor(float(i % 5) ** 2)


class Pictures(torch.utils.data.Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        return torch.full((3, 8, 8), float(i % 3)), torch.tensor(i % 2)


def user_job(kind="linear"):
    if kind == "linear":
        return supervised_job(Squares(), lambda: torch.nn.Linear(4, 1),
                              lambda out, y: torch.nn.functional.mse_loss(out.squeeze(1), y),
                              lambda params: torch.optim.SGD(params, lr=1e-3), batch_size=8, name="squares")

    def convnet():
        return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                   torch.nn.Linear(4, 2))

    return supervised_job(Pictures(), convnet, torch.nn.functional.cross_entropy,
                          lambda params: torch.optim.SGD(params, lr=1e-2), batch_size=4, name="pictures")


# --------------------------------------------------------------------------- 05: overlap


@pytest.fixture
def overlap_runs(monkeypatch):
    """Every run_overlap_variant call of try_overlap: the job it got, its keyword arguments and the run."""
    seen = []
    real = ov.run_overlap_variant

    def spy(job, acc, **kw):
        run = real(job, acc, **kw)
        seen.append(SimpleNamespace(job=job, kw=kw, run=run))
        return run

    monkeypatch.setattr(ov, "run_overlap_variant", spy)
    return seen


def test_try_overlap_returns_the_hidden_share_and_its_knobs_reach_the_loader(job, cpu, overlap_runs):
    ticks = Ticks()
    p = ov.try_overlap(job, cpu, num_workers=2, model_width=8, threads="all cores to torch", cores=2, steps=3,
                       warmup_steps=1, progress=ticks)
    assert isinstance(p, LivePoint) and p.metric == "hidden_fraction" and p.unit == "fraction"
    assert 0.0 <= p.value <= 1.0 and (p.low is None or p.low <= p.high)
    assert p.label == "width 8, 2 worker(s), all cores to torch" and "hidden behind compute" in p.sentence
    (call,) = overlap_runs  # the built-in job: one overlapped run, its input work from each batch's prep_s
    run = call.run
    assert run.settings["num_workers"] == 2 and run.settings["prefetcher"] and run.settings["torch_threads"] == 2
    assert set(run.batches["worker"]) == {0, 1}  # two worker processes really prepared the batches
    assert call.job.workload.model_width == 8 and call.job.index is job.index
    first_conv = next(m for m in call.job.make_model(cpu).image_encoder.modules() if isinstance(m, torch.nn.Conv2d))
    assert first_conv.out_channels == 8
    assert p.extra["num_workers"] == 2 and p.extra["steps"] == 3 and p.extra["compute_s"] > 0
    ticks.check(4)


def test_try_overlap_defaults_keep_the_job_and_the_first_split(job, cpu, overlap_runs):
    p = ov.try_overlap(job, cpu, num_workers=0, cores=2, steps=2, warmup_steps=0)
    (call,) = overlap_runs
    assert call.job is job and call.run.settings["num_workers"] == 0
    assert p.label == "width 4, 0 worker(s), 1 core per worker"
    # no worker and no side stream on a CPU: nothing runs beside the step, so nothing is hidden
    assert p.value == 0.0


def test_try_overlap_names_a_split_that_does_not_apply(job, cpu, overlap_runs):
    p = ov.try_overlap(job, cpu, num_workers=0, threads="all cores to torch", cores=2, steps=2, warmup_steps=0)
    assert "does not apply here" in p.label


@pytest.mark.parametrize("knobs, match", [
    ({"num_workers": -1}, "num_workers"),
    ({"num_workers": 1, "model_width": 2}, "model_width"),
    ({"num_workers": 1, "threads": "half the cores"}, "threads"),
    ({"num_workers": 1, "prefetch_factor": 0}, "prefetch_factor"),
    ({"num_workers": 1, "steps": 0}, "steps"),
])
def test_try_overlap_rejects_bad_knobs_before_any_work(job, cpu, overlap_runs, knobs, match):
    with pytest.raises(ParameterError, match=match):
        ov.try_overlap(job, cpu, **knobs)
    assert overlap_runs == []


def test_try_overlap_on_a_users_job_measures_its_input_work_first(cpu, overlap_runs):
    job = user_job()
    with pytest.raises(ParameterError, match="builds its own model"):
        ov.try_overlap(job, cpu, num_workers=0, model_width=8)
    ticks = Ticks()
    p = ov.try_overlap(job, cpu, num_workers=0, steps=2, warmup_steps=1, progress=ticks)
    assert p.metric == "hidden_fraction" and p.label == "0 worker(s), 1 core per worker"
    sync, tried = overlap_runs
    assert sync.kw["prefetcher"] is False and tried.kw["prefetcher"] is True
    assert tried.kw["input_work_s"] == pytest.approx((sync.run.run.steps["data"] + sync.run.run.steps["h2d"]).tolist())
    ticks.check(6)  # both runs, warm-up included


def test_overlap_live_point_of_a_run_reads_its_stats():
    steps = ov.pd.DataFrame({"step": range(4), "data": [0.01, 0.0, 0.02, 0.0], "h2d": [0.0] * 4,
                             "compute": [0.1] * 4})
    steps["step_s"] = steps["data"] + steps["h2d"] + steps["compute"]
    stats = ov.overlap_stats(steps, [0.04] * 4)
    run = ov.OverlapRun(label="after", run=SimpleNamespace(steps=steps, warmup_steps=0), batches=None, copies=None,
                        stats=stats, settings={"num_workers": 1, "torch_threads": 1, "side_stream": False})
    p = ov.live_point(run, "notebook")
    assert p.value == pytest.approx(stats.hidden_fraction) and p.metric == "hidden_fraction"
    assert 0.0 <= p.low <= p.value <= p.high <= 1.0 and "hide" in p.sentence


# --------------------------------------------------------------------------- 06: precision


@pytest.fixture
def autocast_seen(monkeypatch):
    """The autocast dtype and scaler of every PPO trainer step."""
    seen = []
    real = PPOTrainer.step

    def spy(self, *args, **kw):
        seen.append((kw.get("autocast_dtype"), self.stepper is not None and self.stepper.scaling))
        return real(self, *args, **kw)

    monkeypatch.setattr(PPOTrainer, "step", spy)
    return seen


def test_try_precision_times_fp32_against_the_dtype_asked(job, cpu, batches, autocast_seen):
    ticks = Ticks()
    p = pr.try_precision(job, cpu, dtype="bfloat16", batches=batches, steps=3, warmup_steps=1, progress=ticks)
    assert isinstance(p, LivePoint) and p.metric == "speedup" and p.unit == "x" and p.label == "bfloat16"
    assert p.value > 0 and p.low <= p.high and p.extra["steps"] == 3 and p.extra["samples_per_s"] > 0
    assert sorted(autocast_seen, key=str) == sorted([(None, False)] * 4 + [(torch.bfloat16, False)] * 4, key=str)
    ticks.check(8)  # (1 warm-up + 3 timed) x 2 sides


def test_try_precision_float16_gets_a_grad_scaler_and_float32_is_the_a_a_test(job, cpu, batches, autocast_seen):
    pr.try_precision(job, cpu, dtype="float16", batches=batches, steps=1, warmup_steps=0, init_scale=8.0)
    assert sorted(autocast_seen, key=str) == sorted([(None, False), (torch.float16, True)], key=str)
    autocast_seen.clear()
    p = pr.try_precision(job, cpu, dtype="float32", batches=batches, steps=1, warmup_steps=0)
    assert autocast_seen == [(None, False), (None, False)] and p.label == "float32 (vs itself)"


@pytest.mark.parametrize("dtype, acc_dtypes, match", [
    ("int8", None, "choose one of"),
    ("float16", ("bfloat16",), "not supported on cpu"),
])
def test_try_precision_rejects_a_dtype_before_any_work(job, cpu, batches, autocast_seen, dtype, acc_dtypes, match):
    acc = cpu if acc_dtypes is None else with_capabilities(cpu, autocast_dtypes=acc_dtypes)
    with pytest.raises(ParameterError, match=match):
        pr.try_precision(job, acc, dtype=dtype, batches=batches)
    with pytest.raises(ParameterError, match="steps"):
        pr.try_precision(job, cpu, dtype="bfloat16", batches=batches, steps=0)
    assert autocast_seen == []


def test_try_precision_on_a_users_job_times_its_step_under_the_options(cpu, monkeypatch):
    seen = []
    real = pr.step_options_comparison
    monkeypatch.setattr(pr, "step_options_comparison", lambda job, acc, a, b, **kw: seen.append((a, b)) or
                        real(job, acc, a, b, **kw))
    ticks = Ticks()
    p = pr.try_precision(user_job(), cpu, dtype="bfloat16", steps=2, warmup_steps=1, progress=ticks)
    assert p.metric == "speedup" and p.unit == "x"
    ((a, b),) = seen
    assert a.autocast_dtype is None and b.autocast_dtype is torch.bfloat16
    ticks.check(1)


def test_precision_live_point_of_the_notebooks_comparison():
    from helpers.timing import Comparison, Measurement

    cmp = Comparison.from_measurements(Measurement("fp32", (0.2, 0.21, 0.19), 1, items_per_call=8),
                                       Measurement("bf16", (0.1, 0.11, 0.09), 1, items_per_call=8))
    p = pr.live_point(cmp, "bfloat16")
    assert p.value == pytest.approx(cmp.ratio) and (p.low, p.high) == (cmp.ci_low, cmp.ci_high)
    assert p.extra["fp32_step_s"] == pytest.approx(0.2) and "fp32" in p.sentence


def test_progress_clock_reports_outside_the_timed_calls():
    ticks = Ticks()
    t = iter(range(100))
    clock = pr.ProgressClock(ticks, warmup=1, repeats=2, clock=lambda: float(next(t)))
    fn = clock.wrap(lambda: None)
    fn(), fn()  # the two warm-up calls (A, B)
    assert ticks.calls == [(1, 6), (2, 6)]
    for _ in range(4):  # four timed calls: start and stop read each
        clock(), fn(), clock()
    assert ticks.calls[2:] == [(3, 6), (4, 6), (5, 6), (6, 6)]


# --------------------------------------------------------------------------- 07: memory format


@pytest.fixture
def conv_steps(monkeypatch):
    """Every conv_step built by format_comparison: its module, images and autocast factory."""
    seen = []
    real = mf.conv_step

    def spy(module, images, **kw):
        seen.append(SimpleNamespace(module=module, images=images, autocast=kw.get("autocast")))
        return real(module, images, **kw)

    monkeypatch.setattr(mf, "conv_step", spy)
    return seen


def _cl(t):
    return t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()


def test_try_memory_format_runs_channels_last_under_autocast_against_nchw_fp32(job, cpu, batches, conv_steps):
    images = [b[0] for b in batches]
    ticks = Ticks()
    p = mf.try_memory_format(job, cpu, memory_format="channels_last", autocast="bfloat16", images=images, steps=3,
                             warmup_steps=1, progress=ticks)
    assert isinstance(p, LivePoint) and p.metric == "speedup" and p.unit == "x"
    assert p.label == "channels_last, bfloat16 autocast" and p.value > 0 and p.low <= p.high
    a_side, b_side = conv_steps[:2], conv_steps[2:]
    assert len(a_side) == len(b_side) == len(images)
    for s in a_side:  # A: NCHW in fp32
        assert s.images.is_contiguous() and s.autocast is None
    for s in b_side:  # B: the model copy and the images in channels_last, under bf16 autocast
        assert _cl(s.images)
        conv = next(m for m in s.module.modules() if isinstance(m, torch.nn.Conv2d))
        assert _cl(conv.weight)
        with s.autocast():
            assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    ticks.check(8)


def test_try_memory_format_nchw_fp32_is_the_a_a_test(job, cpu, batches, conv_steps):
    p = mf.try_memory_format(job, cpu, memory_format="nchw", autocast="off", images=[b[0] for b in batches],
                             steps=1, warmup_steps=0)
    assert p.label == "NCHW, fp32 (vs itself)"
    assert all(s.images.is_contiguous() and s.autocast is None for s in conv_steps)


@pytest.mark.parametrize("knobs, acc_changes, match", [
    ({"memory_format": "nhwc"}, {}, "memory_format"),
    ({"memory_format": "nchw", "autocast": "int8"}, {}, "autocast"),
    ({"memory_format": "nchw", "autocast": "float16"}, {"autocast_dtypes": ("bfloat16",)}, "autocast"),
    ({"memory_format": "nchw", "steps": 0}, {}, "steps"),
])
def test_try_memory_format_rejects_bad_knobs_before_any_work(job, cpu, batches, conv_steps, knobs, acc_changes,
                                                             match):
    acc = with_capabilities(cpu, **acc_changes) if acc_changes else cpu
    with pytest.raises(ParameterError, match=match):
        mf.try_memory_format(job, acc, images=[b[0] for b in batches], **knobs)
    assert conv_steps == []


def test_try_memory_format_refuses_channels_last_where_the_device_has_none(job, cpu, batches, conv_steps):
    npu_like = with_capabilities(cpu, channels_last=dataclasses.replace(
        cpu.capabilities.channels_last, available=False, detail="only contiguous_format on this device"))
    with pytest.raises(ParameterError, match="only contiguous_format"):
        mf.try_memory_format(job, npu_like, memory_format="channels_last", images=[b[0] for b in batches])
    assert conv_steps == []


def test_try_memory_format_on_a_users_job_times_its_step_in_the_format(cpu, monkeypatch):
    seen = []
    real = mf.step_options_comparison
    monkeypatch.setattr(mf, "step_options_comparison", lambda job, acc, a, b, **kw: seen.append((a, b)) or
                        real(job, acc, a, b, **kw))
    p = mf.try_memory_format(user_job("conv"), cpu, memory_format="channels_last", steps=2, warmup_steps=1)
    assert p.metric == "speedup" and p.label == "channels_last, fp32"
    ((a, b),) = seen
    assert not a.channels_last and a.autocast_dtype is None and b.channels_last and b.autocast_dtype is None
