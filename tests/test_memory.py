"""Tests of helpers.compute.memory: trace, allocator settings, empty_cache, batch-size finder."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from helpers.compute import batch_finder as BF  # the finder reads release_memory and psutil there
from helpers.compute import memory as M
from helpers.experiments import memory as E
from helpers.device import get_accelerator
from helpers.errors import ParameterError

MIB = M.MIB


@pytest.fixture(scope="module")
def cpu():
    return get_accelerator("cpu")


# ---------------------------------------------------------------- OOM detection


def test_is_oom_recognises_the_kinds_of_out_of_memory():
    assert M.is_oom(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert M.is_oom(RuntimeError("NPU out of memory. Tried to allocate 260.00 MiB (NPU 0; 28.50 GiB total)"))
    assert M.is_oom(RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate 8 GB"))
    assert M.is_oom(MemoryError())
    assert M.is_oom(M.MemoryBudgetExceeded(64, 200 * MIB, 100 * MIB))
    assert not M.is_oom(RuntimeError("shape mismatch"))
    assert not M.is_oom(ValueError("out of memory"))  # not a RuntimeError: a bug, not an OOM


# ---------------------------------------------------------------- trace


def test_trace_on_cpu_reports_process_memory_per_step(cpu):
    keep = []

    def step():
        # +64 MiB per step, kept alive: above glibc's largest mmap threshold (32 MiB on 64-bit), so each block is a
        # fresh mapping and cannot reuse heap freed by earlier tests (4 MiB blocks could: the test was order-dependent)
        keep.append(torch.ones(64 * MIB // 4))
        return keep[-1].sum()

    frame = M.trace_memory(step, cpu, 3, sample_interval_s=0.001)
    assert list(frame["step"]) == [1, 2, 3]
    assert set(frame["source"]) == {"process"}
    assert frame["allocated_mib"].isna().all() and frame["fragmentation"].isna().all()
    assert (frame["peak_mib"] >= frame["rss_mib"] - 1).all()
    # memory kept alive grows the RSS by about 64 MiB per step
    assert frame["rss_mib"].iloc[-1] - frame["rss_mib"].iloc[0] >= 112


def test_trace_on_a_device_reads_allocator_stats(cpu, monkeypatch):
    class FakeAcc:
        is_cpu = False
        resets = 0
        allocated = 0

        def synchronize(self):
            pass

        def reset_peak_memory_stats(self):
            FakeAcc.resets += 1

        def memory_stats(self):
            return {"allocated_bytes": 30 * MIB, "reserved_bytes": 40 * MIB,
                    "peak_allocated_bytes": 35 * MIB, "fragmentation": 0.25}

    frame = M.trace_memory(lambda: None, FakeAcc(), 2)
    assert FakeAcc.resets == 2  # the peak is reset before every step
    assert list(frame["source"]) == ["device", "device"]
    assert frame["allocated_mib"].tolist() == [30.0, 30.0]
    assert frame["reserved_mib"].tolist() == [40.0, 40.0]
    assert frame["peak_mib"].tolist() == [35.0, 35.0]
    assert frame["fragmentation"].tolist() == [0.25, 0.25]


def test_trace_rejects_bad_arguments(cpu):
    with pytest.raises(ParameterError, match="steps"):
        M.trace_memory(lambda: None, cpu, 0)
    with pytest.raises(ParameterError, match="callable"):
        M.trace_memory(None, cpu, 1)


def test_rss_peak_sampler_sees_a_transient_allocation():
    with M.RssPeakSampler(0.0005) as s:
        x = torch.ones(64 * MIB // 4)
        x += 1
        t0 = __import__("time").perf_counter()
        while __import__("time").perf_counter() - t0 < 0.02:  # stay alive long enough to be sampled
            pass
        del x
    assert s.samples >= 1
    assert s.peak_bytes - s.start_bytes >= 32 * MIB
    with pytest.raises(ParameterError):
        M.RssPeakSampler(0)


# ---------------------------------------------------------------- allocator settings


def test_alloc_conf_var_per_device():
    assert M.alloc_conf_var("cuda") == "PYTORCH_CUDA_ALLOC_CONF"
    assert M.alloc_conf_var("npu") == "PYTORCH_NPU_ALLOC_CONF"
    assert M.alloc_conf_var("cpu") is None


def test_check_alloc_conf_accepts_valid_and_rejects_bad_values():
    assert M.check_alloc_conf("", "cuda") == []
    assert M.check_alloc_conf("expandable_segments:True", "npu")
    with pytest.raises(ParameterError, match="True or False"):
        M.check_alloc_conf("expandable_segments:true", "cuda")
    with pytest.raises(ParameterError, match="expandable_segmets"):
        M.check_alloc_conf("expandable_segmets:True", "cuda")
    # torch_npu refuses expandable segments together with max_split_size_mb
    with pytest.raises(ParameterError, match="cannot be enabled"):
        M.check_alloc_conf("expandable_segments:True,max_split_size_mb:128", "npu")
    with pytest.raises(ParameterError, match="string"):
        M.check_alloc_conf(3, "cuda")
    assert M.check_alloc_conf_list(["", " expandable_segments:True", "expandable_segments:True"], "cuda") == [
        "", "expandable_segments:True"]


def test_bad_alloc_conf_fails_before_any_child_starts(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a child was started for an invalid setting")

    monkeypatch.setattr(subprocess, "run", boom)
    with pytest.raises(ParameterError, match="max_split_size_mb"):
        E.run_alloc_conf_child("max_split_size_mb:10", E.TraceConfig(device="cuda"))


def test_child_gets_exactly_the_setting_under_test(monkeypatch):
    seen = {}

    def fake_run(cmd, env, capture_output, text, timeout):
        seen["cmd"], seen["env"] = cmd, env
        out = E._RESULT_MARK + json.dumps({"ok": True, "device": "cuda", "trace": [], "empty_cache": None})
        return subprocess.CompletedProcess(cmd, 0, stdout="noise\n" + out + "\n", stderr="")

    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "max_split_size_mb:64")  # would take priority in torch 2.13
    monkeypatch.setattr(subprocess, "run", fake_run)
    res = E.run_alloc_conf_child("expandable_segments:True", E.TraceConfig(device="cuda", steps=2))
    assert res["ok"] and res["alloc_conf"] == "expandable_segments:True"
    assert seen["env"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert "PYTORCH_ALLOC_CONF" not in seen["env"]
    assert json.loads(seen["cmd"][-1])["steps"] == 2


def test_child_failure_and_timeout_are_reported_not_raised(monkeypatch):
    def failing(cmd, **k):
        return subprocess.CompletedProcess(cmd, 1, stdout="", stderr="Traceback\nRuntimeError: broken driver")

    monkeypatch.setattr(subprocess, "run", failing)
    res = E.run_alloc_conf_child("", E.TraceConfig(device="npu"))
    assert res["ok"] is False and "broken driver" in res["error"] and res["returncode"] == 1

    def slow(cmd, **k):
        raise subprocess.TimeoutExpired(cmd, k["timeout"])

    monkeypatch.setattr(subprocess, "run", slow)
    res = E.run_alloc_conf_child("", E.TraceConfig(device="npu"), timeout_s=5)
    assert res["ok"] is False and "5 s" in res["error"]


def test_child_main_rejects_bad_arguments(capsys):
    assert E.main([]) == 2
    assert E.main(["{\"nope\": 1}"]) == 2


def test_empty_cache_is_not_applicable_on_cpu(cpu):
    assert M.measure_empty_cache(lambda: None, cpu) is None


# ---------------------------------------------------------------- budget


def test_budget_from_parameter_and_default(cpu):
    assert E.resolve_budget_bytes(100, cpu)[0] == 100 * MIB
    import psutil

    b, why = E.resolve_budget_bytes(0, cpu)
    avail = psutil.virtual_memory().available
    assert 0.3 * avail < b <= 0.7 * avail and "half" in why
    with pytest.raises(ParameterError):
        E.resolve_budget_bytes(-1, cpu)


def test_finder_config_validation():
    with pytest.raises(ParameterError, match="max_batch"):
        E.FinderConfig(start_batch=64, max_batch=8, steps=1, budget_bytes=MIB)
    with pytest.raises(ParameterError, match="safety_margin"):
        E.FinderConfig(start_batch=8, max_batch=64, steps=1, budget_bytes=MIB, safety_margin=0.95)
    with pytest.raises(ParameterError, match="steps"):
        E.FinderConfig(start_batch=8, max_batch=64, steps=0, budget_bytes=MIB)
    assert E.FinderConfig(start_batch=8, max_batch=64, steps=1, budget_bytes=100,
                          safety_margin=0.1).limit_bytes == 90


# ---------------------------------------------------------------- finder


class FakeDeviceAcc:
    """A device whose allocator reports ``per_sample`` bytes per sample of the last step."""

    is_cpu = False
    kind = "cuda"

    def __init__(self, per_sample):
        self.per_sample = per_sample
        self.peak = 0
        self.emptied = 0

    def synchronize(self):
        pass

    def reset_peak_memory_stats(self):
        self.peak = 0

    def memory_stats(self):
        return {"allocated_bytes": 0, "reserved_bytes": 0, "peak_allocated_bytes": self.peak,
                "fragmentation": None}


def test_finder_recovers_from_a_real_oom_and_keeps_earlier_records(monkeypatch):
    acc = FakeDeviceAcc(per_sample=MIB)
    monkeypatch.setattr(BF, "release_memory", lambda a: setattr(a, "emptied", a.emptied + 1))
    recorded = []

    def make_step(batch):
        def step():
            if batch > 40:
                raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {batch} MiB")
            acc.peak = max(acc.peak, batch * acc.per_sample)
        return step

    cfg = E.FinderConfig(start_batch=8, max_batch=1024, steps=3, budget_bytes=1000 * MIB,
                         safety_margin=0.1, multiple_of=4, refine_steps=2)
    res = E.find_batch_size(make_step, acc, cfg, on_result=recorded.append)
    f = res.frame
    assert f["batch"].tolist() == [8, 16, 32, 64, 48, 40]
    assert f["status"].tolist() == ["fits", "fits", "fits", "oom", "oom", "fits"]
    assert f["phase"].tolist() == ["grow"] * 4 + ["refine"] * 2
    assert res.chosen == 40 and "out of memory at batch 64" in res.stop_reason
    assert len(recorded) == len(f)  # every row reported as it came
    assert [r["batch"] for r in recorded] == f["batch"].tolist()
    assert "OutOfMemoryError" in f.loc[3, "error"]
    assert f.loc[0, "peak_mib"] == 8.0 and f.loc[0, "throughput"] > 0
    assert acc.emptied >= len(f)  # released after every size


def test_npu_style_runtime_error_counts_as_oom_but_other_errors_propagate(monkeypatch):
    acc = FakeDeviceAcc(per_sample=MIB)
    monkeypatch.setattr(BF, "release_memory", lambda a: None)

    def npu_step(batch):
        def step():
            if batch >= 16:
                raise RuntimeError("NPU out of memory. Tried to allocate 1.00 GiB")
        return step

    cfg = E.FinderConfig(start_batch=8, max_batch=64, steps=1, budget_bytes=1000 * MIB, refine_steps=0)
    res = E.find_batch_size(npu_step, acc, cfg)
    assert res.chosen == 8 and res.frame["status"].tolist() == ["fits", "oom"]

    def buggy(batch):
        def step():
            raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")
        return step

    with pytest.raises(RuntimeError, match="shapes"):
        E.find_batch_size(buggy, acc, cfg)


def test_finder_margin_and_max_batch(monkeypatch):
    acc = FakeDeviceAcc(per_sample=MIB)
    monkeypatch.setattr(BF, "release_memory", lambda a: None)

    def make_step(batch):
        def step():
            acc.peak = batch * MIB
        return step

    # budget 100 MiB, margin 0.2: a size fits when its peak <= 80 MiB; 128 MiB is over budget
    cfg = E.FinderConfig(start_batch=8, max_batch=1024, steps=1, budget_bytes=100 * MIB,
                         safety_margin=0.2, refine_steps=3)
    res = E.find_batch_size(make_step, acc, cfg)
    st = dict(zip(res.frame["batch"], res.frame["status"]))
    assert st[64] == "fits" and st[128] == "over budget"
    assert res.chosen == 80 and st[96] == "over margin"
    assert not res.reached_max and res.largest_fit_text() == "80"  # a real limit was found
    # never beyond max_batch; the last size is capped at it
    cfg = E.FinderConfig(start_batch=8, max_batch=50, steps=1, budget_bytes=1000 * MIB, multiple_of=2)
    res = E.find_batch_size(make_step, acc, cfg)
    assert res.frame["batch"].tolist() == [8, 16, 32, 50] and res.chosen == 50
    assert "finder_max_batch=50" in res.stop_reason
    # every size fitted: 50 is the search cap, a lower bound, and the text says so
    assert res.reached_max and res.max_batch == 50
    assert res.largest_fit_text() == ">= 50 (no limit found up to finder_max_batch=50)"
    # the cap reached exactly on the doubling path is also "no limit found"
    cfg = E.FinderConfig(start_batch=8, max_batch=32, steps=1, budget_bytes=1000 * MIB)
    res = E.find_batch_size(make_step, acc, cfg)
    assert res.frame["batch"].tolist() == [8, 16, 32] and res.reached_max
    # nothing fits: no lower bound to state
    cfg = E.FinderConfig(start_batch=8, max_batch=32, steps=1, budget_bytes=4 * MIB)
    res = E.find_batch_size(make_step, acc, cfg)
    assert res.chosen is None and not res.reached_max and res.largest_fit_text() == "none"


def test_finder_with_a_tiny_real_model_and_a_small_budget_on_cpu(cpu):
    torch.manual_seed(0)
    width = 2048

    def make_step(batch):
        model = torch.nn.Sequential(torch.nn.Linear(256, width), torch.nn.ReLU(), torch.nn.Linear(width, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(batch, 256)

        def step():
            opt.zero_grad()
            h = model[1](model[0](x))
            # activations of about batch * width * 4 bytes, several copies kept for backward
            loss = (model[2](h * h.sigmoid() + h.tanh())).square().mean()
            loss.backward()
            opt.step()
            return loss.detach()
        return step

    # activations at batch 4096: 4096 * 2048 * 4 B = 32 MiB each, several alive at once
    cfg = E.FinderConfig(start_batch=256, max_batch=1 << 15, steps=2, budget_bytes=160 * MIB,
                         safety_margin=0.1, refine_steps=1)
    res = E.find_batch_size(make_step, cpu, cfg, sample_interval_s=0.0005)
    f = res.frame
    assert res.chosen is not None and 256 <= res.chosen < (1 << 15)
    assert f["status"].iloc[0] == "fits"
    failed = f[f["status"].isin(["over budget", "over margin", "skipped"])]
    assert len(failed) >= 1  # the budget stopped the growth before max_batch
    assert (f.loc[f["status"] == "fits", "peak_mib"] <= cfg.limit_bytes / MIB).all()
    assert (f.loc[f["status"] == "over budget", "peak_mib"] > 160).all()
    ok = f[f["status"] == "fits"]
    assert (ok["throughput"] > 0).all() and (ok["throughput_p25"] <= ok["throughput_p75"]).all()


def test_job_step_factory_builds_a_training_step(cpu):
    cfg = E.TraceConfig(device="cpu", max_images=8, batch_size=8, image_size=32, model_width=4, d_model=16)
    make_step = E.job_step_factory(E.trace_job(cfg), cpu)
    step = make_step(8)
    stats = step()
    assert {"loss", "value_loss"} <= set(stats) and torch.isfinite(stats["loss"])
    frame = M.trace_memory(step, cpu, 2)
    assert len(frame) == 2 and (frame["rss_mib"] > 0).all()
    with pytest.raises(ParameterError):
        make_step(0)


def test_budget_from_parameter_names_the_default(cpu):
    """A budget set by parameter says so once, and names the default this machine would get."""
    b, why = E.resolve_budget_bytes(100, cpu)
    assert b == 100 * MIB
    assert why.startswith("set by parameter") and "the default here would be" in why and "GiB" in why
    assert "memory_budget_mib=100" not in why  # no "(memory_budget_mib=100 MiB (set by parameter))" nesting


def test_budget_exceeded_names_what_was_measured():
    assert "measured RSS growth 2.0 MiB" in str(M.MemoryBudgetExceeded(8, 2 * MIB, MIB, what="RSS growth"))


# ---------------------------------------------------------------- a batch size from the free memory, never a demo

class _FakeDeviceWithFreeMemory(FakeDeviceAcc):
    index = 0


def _finder_and_verdict(acc, budget_bytes, budget_why, *, budget_set, current=128):
    def make_step(batch):
        def step():
            acc.peak = batch * MIB
        return step

    cfg = E.FinderConfig(start_batch=8, max_batch=1024, steps=1, budget_bytes=budget_bytes, safety_margin=0.2,
                         refine_steps=3)
    found = E.find_batch_size(make_step, acc, cfg)
    fin_tp = dict(zip(found.frame.batch, found.frame.throughput))
    return E.verdict(found, current=current, best=None, gain=None, finder_throughput=fin_tp, budget_why=budget_why,
                     budget_set=budget_set, safety_margin=0.2, used_name="peak", steps=3, finder_steps=1,
                     start_batch=8, context="c")


def test_a_batch_size_action_comes_from_the_devices_free_memory(monkeypatch, tmp_path):
    """The default budget is the device's free memory (mem_get_info + reserved; psutil's available RAM on a CPU),
    and a batch size derived from it is an action on the report's first screen."""
    from types import SimpleNamespace

    from helpers.results import ResultsStore
    from helpers.workbook.report.collect import _advice, collect

    monkeypatch.setattr(BF, "release_memory", lambda a: None)
    monkeypatch.setattr(BF.psutil, "virtual_memory", lambda: SimpleNamespace(available=400 * MIB))
    assert E.resolve_budget_bytes(0, get_accelerator("cpu")) == (
        200 * MIB, "half of the available RAM (400 MiB available, psutil)")
    device_memory = SimpleNamespace(get_memory_info=lambda index: (90 * MIB, 24 * 1024 * MIB),
                                    memory_reserved=lambda index: 10 * MIB)
    monkeypatch.setattr(torch.accelerator, "memory", device_memory, raising=False)
    acc = _FakeDeviceWithFreeMemory(per_sample=MIB)
    budget, why = E.resolve_budget_bytes(0, acc)
    assert budget == 100 * MIB and "free memory" in why
    v = _finder_and_verdict(acc, budget, why, budget_set=False)
    assert v.recommendation == "enable" and v.action.value == 80 and v.action.text == "batch size 128 → 80"
    assert "demonstration" not in v.reason
    ResultsStore(tmp_path / "results.jsonl", notebook=E.NOTEBOOK).add_verdict(v)
    assert dict(_advice(collect(tmp_path)))["Enable on this machine"] == "batch size 128 → 80"


def test_a_demonstration_budget_is_shown_as_such_and_is_never_an_action(monkeypatch, tmp_path):
    """The quick profile's 100 MiB budget: what the finder found within it is a demonstration, not a batch size for
    this machine; the first screen says nothing about the batch size."""
    from helpers.results import ResultsStore
    from helpers.workbook.report import to_markdown
    from helpers.workbook.report.collect import _advice, collect

    monkeypatch.setattr(BF, "release_memory", lambda a: None)
    acc = _FakeDeviceWithFreeMemory(per_sample=MIB)
    v = _finder_and_verdict(acc, 100 * MIB, "set by parameter: a demonstration budget", budget_set=True)
    assert v.recommendation == "not applicable" and v.action is None
    assert v.reason.startswith("demonstration budget 100 MiB: lower the batch to 80: the current 128 does not fit")
    assert "not a batch size for this machine" in v.reason and "memory_budget_mib=0" in v.reason
    assert v.extra["demonstration"] is True and v.extra["demonstration_batch_size"] == 80
    assert v.extra["measured_recommendation"] == "enable"
    ResultsStore(tmp_path / "results.jsonl", notebook=E.NOTEBOOK).add_verdict(v)
    advice = dict(_advice(collect(tmp_path)))
    assert "Enable on this machine" not in advice and not any("batch size" in x for x in advice.values())
    first_screen = to_markdown(collect(tmp_path)).split("## Checklist")[0]
    assert "→" not in first_screen and "batch size 128" not in first_screen


# ---------------------------------------------------------------- the notebook's experiment: one MemoryResult

def _ctx(cpu, **params):
    """A notebook context without a store: the spec's defaults, small sizes, and ``ctx.job()``."""
    from types import SimpleNamespace

    from helpers.jobs.load import notebook_job

    P = {p.name: p.default for p in E.EXPERIMENT.spec}
    P.update(max_images=8, batch_size=4, image_size=32, text_len=8, model_width=4, d_model=16, steps=3,
             warmup_steps=1, finder_start_batch=4, finder_max_batch=8, finder_steps=1, **params)
    ctx = SimpleNamespace(params=P, acc=cpu)
    ctx.job = lambda: notebook_job(P)
    return ctx


def test_run_gives_one_result_with_its_records_verdict_and_panel(cpu):
    ctx = _ctx(cpu)
    plan = E.plan(ctx)
    assert plan.text() == ("allocator settings to compare: ['(defaults)', 'expandable_segments:True'], all valid\n"
                           "batch sizes are multiples of the PPO horizon (4)")
    result = E.run(ctx, plan)
    recs = result.records()
    keys = [(args[0], args[1], args[2], args[4]) for call, args, _ in recs.calls]
    assert keys[:5] == [("memory_trace", "batch 4", "rss", "MiB"), ("memory_trace", "batch 4", "uss", "MiB"),
                        ("memory_trace", "batch 4", "peak_rss_sampled", "MiB"),
                        ("allocator", "alloc_conf", "peak_reserved", "MiB"),
                        ("allocator", "empty_cache", "empty_cache_time", "ms")]
    finder = [k for k in keys[5:] if k[2] == "throughput"]
    assert finder == [("batch_size_finder", f"batch {b}", "throughput", "samples/s") for b in result.found.frame.batch]
    assert len(keys) == 5 + len(finder) + (result.comparison is not None)
    v = result.verdict()
    assert v.metric == "max_batch_size" and v.action.setting == "batch_size" and v.action.current == 4
    assert v.context.startswith("PPO step (rollout + 2 updates) of a 4-channel conv + d_model 16 policy, 32 px")
    assert "memory per size = sampled process RSS growth" in v.context
    assert result.trace_text().startswith("CPU: no device allocator")
    assert result.allocator_text().startswith("not applicable on CPU") and result.allocator_table() is None
    assert "largest batch that fits:" in result.finder_text()
    spec = result.try_it(cpu, ctx.params)
    knob = spec.knobs["batch_size"]
    assert knob.value == 4 and [v for _, v in knob.options] == [4, 8]
    point = spec.measure(lambda *a: None, batch_size=4)
    assert point.metric == "peak_rss_growth" and point.extra["batch"] == 4


def test_a_user_job_is_sized_by_its_own_batch_and_takes_any_batch_size(cpu):
    job = str(Path(__file__).resolve().parent.parent / "examples" / "image_classifier.py") + ":make_job"
    ctx = _ctx(cpu, job=job, factory_defaults=["image_size"])
    plan = E.plan(ctx)
    assert plan.job.batch_multiple == 1 and plan.text().endswith(f"your job ({job}): any batch size")
    assert not plan.job.is_builtin


def test_the_memory_per_step_figure_has_whole_step_ticks():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    from helpers.workbook import plots_memory

    frame = pd.DataFrame({"step": [1, 2, 3], "source": "process", "rss_mib": [400.0] * 3, "uss_mib": [315.0] * 3,
                          "peak_mib": [401.0] * 3})
    fig = plots_memory.memory_per_step(frame)
    fig.canvas.draw()
    ticks = fig.axes[0].get_xticks()
    assert len(ticks) and all(float(t).is_integer() for t in ticks)
    plt.close(fig)
