"""The "try it" functions of notebooks 08, 09 and 10: collectives.try_allreduce, memory.try_batch_size,
e2e_try.try_optimizations (and their live_point helpers).

Behaviour only, at tiny sizes: each returns LivePoints with the right metric and unit, the knob values reach the
mechanism, a bad knob raises ParameterError before any work, a sweep yields one point per setting and calls
progress. No test asserts a speed.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from helpers.comm import allreduce as ar
from helpers.compute import batch_finder  # the finder releases memory there
from helpers.device import get_accelerator
from helpers.errors import ParameterError
from helpers.experiments import collectives as coll
from helpers.experiments import e2e_try
from helpers.experiments.e2e_jobs import OPTIMIZATIONS, JobConfig
from helpers.experiments import memory as mem
from helpers.jobs.base import Workload
from helpers.jobs.ppo import PPOJob
from helpers.live import LivePoint
from helpers.pipeline.dataset import build_embedded, load_dataset
from helpers.pipeline.text import load_or_build_tokenizer
from helpers.timing import Comparison, Measurement

MIB = 2**20
TINY = Workload(batch_size=4, image_size=32, text_len=4, model_width=4, d_model=8, seed=0)


@pytest.fixture(scope="module")
def cpu():
    return get_accelerator("cpu")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    index = load_dataset(build_embedded(tmp_path_factory.mktemp("emb") / "d", n_images=12, seed=3))
    return index, load_or_build_tokenizer(index, text_len=TINY.text_len)


# ------------------------------------------------------------------ 08: allreduce sweep


def _row(nbytes, t=1e-3, p25=0.8e-3, p75=1.5e-3, world_size=2, repeats=10):
    r = ar.summarize(nbytes, [[t, p25, p75, t]] * world_size, world_size)
    r.update(time_s=t, time_p25_s=p25, time_p75_s=p75, repeats=repeats,
             algbw_gbps=ar.algbw_gbps(nbytes, t), busbw_gbps=ar.busbw_gbps(nbytes, t, world_size))
    return r


@pytest.mark.parametrize("n", [1, 2, 4])
def test_allreduce_point_is_nccl_tests_bus_bandwidth_with_its_iqr(n):
    row = _row(4 * MIB, world_size=n)
    p = coll.live_point(row, world_size=n, backend="gloo")
    assert isinstance(p, LivePoint) and p.metric == "bus_bandwidth" and p.unit == "GB/s"
    assert p.value == pytest.approx(4 * MIB / 1e-3 / 1e9 * 2 * (n - 1) / n)  # algbw x 2(n-1)/n
    assert p.value == pytest.approx(ar.busbw_gbps(4 * MIB, 1e-3, n))
    assert p.low == pytest.approx(ar.busbw_gbps(4 * MIB, 1.5e-3, n))  # the slower quartile: the lower busbw
    assert p.high == pytest.approx(ar.busbw_gbps(4 * MIB, 0.8e-3, n))
    assert p.label == f"4 MiB, {n} rank{'s' if n > 1 else ''}" and p.extra["world_size"] == n
    if n == 1:
        assert p.value == 0.0 and "nothing crosses a link" in p.sentence


class _FakeGroup:
    """A one-process stand-in for a process group of ``world_size`` ranks (this process is rank 0)."""

    def __init__(self, monkeypatch, world_size):
        self.world_size, self.reduces = world_size, 0
        expected = world_size * (world_size + 1) / 2

        def all_reduce(t, *a, **k):  # rank r holds r + 1: the sum over ranks is n(n+1)/2 x (rank 0's value)
            self.reduces += 1
            t.mul_(expected)

        def all_gather_object(out, obj):
            for i in range(len(out)):
                out[i] = obj

        monkeypatch.setattr(torch.distributed, "all_reduce", all_reduce)
        monkeypatch.setattr(torch.distributed, "all_gather_object", all_gather_object)

    def rc(self):
        return SimpleNamespace(rank=0, world_size=self.world_size, local_rank=0, device=torch.device("cpu"),
                               sync=lambda: None, backend="gloo")


def test_the_rank_task_writes_one_row_per_size_and_stops_when_asked(monkeypatch, tmp_path):
    group = _FakeGroup(monkeypatch, 2)
    points, stop = tmp_path / "points", tmp_path / "stop"
    points.mkdir()
    cfg = {"sizes": [1024, 2048, 4096], "repeats": 3, "warmup": 1, "points_dir": str(points),
           "stop_file": str(stop)}
    out = coll.run_allreduce_sweep(cfg, group.rc())
    files = sorted(points.glob("*.json"))
    assert [json.loads(f.read_text())["bytes"] for f in files] == [1024, 2048, 4096]
    assert [r["bytes"] for r in out["sizes"]] == [1024, 2048, 4096] and not out["stopped"]
    # each size timed by the notebook's run_allreduce: x5 calls up to 64 KiB
    assert all(r["repeats"] == 3 * ar.SMALL_REPEAT_FACTOR for r in out["sizes"])
    for f in files:
        f.unlink()
    stop.touch()
    out = coll.run_allreduce_sweep(cfg, group.rc())
    assert out["stopped"] and out["sizes"] == [] and not list(points.glob("*.json"))


def test_the_sweep_yields_one_point_per_size_and_reports_progress(monkeypatch):
    group = _FakeGroup(monkeypatch, 2)
    seen = {}

    def fake_run_job(task, cfg, *, world_size, backend, **kw):  # the launcher, in this process
        seen.update(task=task, world_size=world_size, backend=backend, sizes=cfg["sizes"],
                    repeats=cfg["repeats"], warmup=cfg["warmup"])
        return SimpleNamespace(data=coll.run_allreduce_sweep(cfg, group.rc()))

    monkeypatch.setattr(coll, "run_job", fake_run_job)
    calls = []
    pts = list(coll.try_allreduce(min_mib=1 / 1024, max_mib=4 / 1024, world_size=2, backend="gloo",
                                  device_kind="cpu", repeats=3, warmup=0,
                                  progress=lambda d, t: calls.append((d, t))))
    assert seen == {"task": coll.SWEEP_TASK, "world_size": 2, "backend": "gloo", "sizes": [1024, 2048, 4096],
                    "repeats": 3, "warmup": 0}
    assert [p.extra["bytes"] for p in pts] == [1024, 2048, 4096]
    assert all(p.metric == "bus_bandwidth" and p.unit == "GB/s" and p.extra["world_size"] == 2 for p in pts)
    assert calls == [(1, 3), (2, 3), (3, 3)]


def test_a_failed_job_reaches_the_caller(monkeypatch):
    def failing(*a, **k):
        raise RuntimeError("rank 1 exited with code 3")

    monkeypatch.setattr(coll, "run_job", failing)
    with pytest.raises(RuntimeError, match="rank 1 exited"):
        list(coll.try_allreduce(min_mib=1, max_mib=1, world_size=2, backend="gloo", device_kind="cpu"))


@pytest.mark.parametrize("knobs, match", [
    ({"min_mib": 4, "max_mib": 1}, r"the smallest size \(4 MiB, min_mib\) is larger than the largest"),
    ({"min_mib": 1e-7, "max_mib": 1}, "below one float32"),
    ({"min_mib": 0, "max_mib": 1}, "number > 0"),
    ({"min_mib": 1, "max_mib": 1, "world_size": 0}, "world_size"),
    ({"min_mib": 1, "max_mib": 1, "world_size": 10_000}, "larger than what can run here"),
    ({"min_mib": 1, "max_mib": 1, "repeats": 0}, "repeats"),
    ({"min_mib": 1, "max_mib": 1, "backend": "mpi"}, "backend"),
])
def test_bad_allreduce_knobs_are_rejected_before_anything_starts(monkeypatch, knobs, match):
    monkeypatch.setattr(coll, "run_job", lambda *a, **k: pytest.fail("nothing may start"))
    kw = {"world_size": 2, "backend": "gloo", "device_kind": "cpu", **knobs}
    with pytest.raises(ParameterError, match=match):
        coll.try_allreduce(**kw)


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 2])
def test_a_real_sweep_runs_on_the_launcher_with_that_world_size(world_size):
    calls = []
    pts = list(coll.try_allreduce(min_mib=1 / 1024, max_mib=2 / 1024, world_size=world_size, backend="gloo",
                                  device_kind="cpu", repeats=3, warmup=1, timeout_s=120,
                                  progress=lambda d, t: calls.append((d, t))))
    assert [p.extra["bytes"] for p in pts] == [1024, 2048] and calls == [(1, 2), (2, 2)]
    assert all(p.extra["world_size"] == world_size and p.extra["backend"] == "gloo" for p in pts)
    assert all(p.extra["bus_factor"] == pytest.approx(2 * (world_size - 1) / world_size) for p in pts)


# ------------------------------------------------------------------ 09: one batch size


class _FakeDevice:
    """A device whose allocator reports one MiB per sample of the last step."""

    is_cpu, kind = False, "cuda"

    def __init__(self):
        self.peak = 0

    def synchronize(self):
        pass

    def reset_peak_memory_stats(self):
        self.peak = 0

    def memory_stats(self):
        return {"peak_allocated_bytes": self.peak}


def test_batch_size_point_on_a_device_is_its_peak_with_the_throughput(monkeypatch):
    acc = _FakeDevice()
    monkeypatch.setattr(batch_finder, "release_memory", lambda a: None)
    built = []

    def make_step(batch):
        built.append(batch)

        def step():
            acc.peak = max(acc.peak, batch * MIB)
        return step

    calls = []
    p = mem.try_batch_size(make_step, acc, batch_size=24, budget_bytes=1000 * MIB, steps=3, warmup=1,
                           multiple_of=4, progress=lambda d, t: calls.append((d, t)))
    assert built == [24]  # the knob reaches the job: one step built at that batch size
    assert p.metric == "peak_memory" and p.unit == "MiB" and p.value == 24.0 and p.low is None
    assert p.extra["batch"] == 24 and p.extra["status"] == "fits" and p.extra["throughput"] > 0
    assert calls == [(1, 4), (2, 4), (3, 4), (4, 4)]  # warm-up + timed steps


def test_a_batch_over_the_budget_is_a_point_and_a_real_oom_an_error(monkeypatch):
    acc = _FakeDevice()
    monkeypatch.setattr(batch_finder, "release_memory", lambda a: None)

    def make_step(batch):
        def step():
            if batch > 40:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            acc.peak = batch * MIB
        return step

    p = mem.try_batch_size(make_step, acc, batch_size=32, budget_bytes=30 * MIB, steps=2)
    assert p.extra["status"] == "over budget" and p.value == 32.0
    with pytest.raises(ParameterError, match="ran out of device memory"):
        mem.try_batch_size(make_step, acc, batch_size=48, budget_bytes=1000 * MIB, steps=2)


@pytest.mark.parametrize("knobs, match", [
    ({"batch_size": 30, "multiple_of": 4}, r"not a multiple of the PPO horizon 4 .*: pick 28 or 32"),
    ({"batch_size": 0}, "batch_size must be an int >= 1"),
    ({"batch_size": 512, "max_batch": 256}, "above finder_max_batch"),
    ({"batch_size": 8, "steps": 0}, "steps"),
    ({"batch_size": 8, "safety_margin": 0.95}, "safety_margin"),
])
def test_bad_batch_size_knobs_are_rejected_before_any_step(knobs, match):
    kw = {"budget_bytes": 100 * MIB, **knobs}
    with pytest.raises(ParameterError, match=match):
        mem.try_batch_size(lambda b: pytest.fail("no step may be built"), _FakeDevice(), **kw)


def test_batch_size_on_the_cpu_measures_the_built_in_job_as_the_finder_does(data, cpu):
    index, tok = data
    make_step = mem.job_step_factory(PPOJob(index, tok, TINY), cpu)
    calls = []
    p = mem.try_batch_size(make_step, cpu, batch_size=8, budget_bytes=4096 * MIB, steps=3, warmup=1,
                           multiple_of=4, progress=lambda d, t: calls.append((d, t)))
    assert p.metric == "peak_rss_growth" and p.unit == "MiB" and p.value >= 0
    assert p.extra["batch"] == 8 and p.extra["memory_source"].startswith("process RSS")
    assert calls[-1] == (4, 4)
    # the notebook's own finder row gives the reference point of the same metric
    ref = mem.live_point({"batch": 8, "status": "fits", "peak_mib": 12.0, "step_ms": 5.0, "throughput": 1600.0,
                          "throughput_p25": 1500.0, "throughput_p75": 1700.0, "error": ""}, is_cpu=True)
    assert (ref.metric, ref.unit, ref.value) == ("peak_rss_growth", "MiB", 12.0)


# ------------------------------------------------------------------ 10: optimizations on/off


def test_speedup_point_from_the_notebooks_comparison():
    c = Comparison.from_measurements(Measurement("baseline", (0.02, 0.021, 0.019, 0.02), 1, items_per_call=4),
                                     Measurement("optimized", (0.01, 0.011, 0.009, 0.01), 1, items_per_call=4))
    p = e2e_try.live_point(c, JobConfig("optimized", ("batched_decode", "channels_last")))
    assert p.metric == "speedup" and p.unit == "x" and p.value == pytest.approx(c.ratio)
    assert (p.low, p.high) == (pytest.approx(c.ci_low), pytest.approx(c.ci_high))
    assert p.label == "decode+NHWC" and p.extra["optimizations"] == ["batched_decode", "channels_last"]


@pytest.mark.parametrize("switches, expect", [
    ({"batched_decode": True, "channels_last": True},
     {"dataset": "BatchedDataset", "channels_last": True, "autocast_dtype": None, "num_workers": 0}),
    ({"mixed_precision": True}, {"dataset": "PerItemBatches", "autocast_dtype": "bfloat16", "channels_last": False}),
    ({"dataloader_workers": True}, {"num_workers": 1, "pin_memory": False}),  # no pinned memory on a CPU
])
def test_the_switches_reach_the_optimized_job(data, cpu, switches, expect):
    index, tok = data
    calls = []
    p = e2e_try.try_optimizations(PPOJob(index, tok, TINY), cpu, steps=2, warmup_steps=0, num_workers=1,
                                  progress=lambda d, t: calls.append((d, t)), **switches)
    assert p.metric == "speedup" and p.unit == "x" and p.low <= p.value <= p.high
    assert p.extra["optimizations"] == [n for n in OPTIMIZATIONS if switches.get(n)]
    assert {k: p.extra[k] for k in expect} == expect
    assert calls[-1] == (4, 4) and [d for d, _ in calls] == sorted(d for d, _ in calls)  # 2 jobs x 2 steps


def test_every_switch_off_is_an_aa_comparison(data, cpu):
    index, tok = data
    p = e2e_try.try_optimizations(PPOJob(index, tok, TINY), cpu, steps=2, warmup_steps=0,
                                  **{n: False for n in OPTIMIZATIONS})
    assert p.label == "none (A/A)" and p.extra["optimizations"] == [] and p.extra["steps"] == 2


@pytest.mark.parametrize("switches, kw, match", [
    ({"warp_drive": True}, {}, "unknown optimization switch"),
    ({"channels_last": "yes"}, {}, "True or False"),
    ({"dataset_cache": True}, {}, "only together with batched_decode"),
    ({"batched_decode": True}, {"unavailable": {"batched_decode": "your job decodes in its own dataset"}},
     "not available for this job"),
    ({"mixed_precision": True}, {"amp_dtype": "float8"}, "amp_dtype"),
    ({}, {"steps": 0}, "steps"),
])
def test_bad_switches_are_rejected_before_any_job_is_built(monkeypatch, switches, kw, match):
    monkeypatch.setattr(e2e_try, "JobVariant", lambda *a, **k: pytest.fail("no job may be built"))
    with pytest.raises(ParameterError, match=match):
        e2e_try.try_optimizations(object(), object(), **{"steps": 2, "warmup_steps": 0, **kw}, **switches)
