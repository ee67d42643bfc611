"""Every notebook's verdict function returns a Verdict whose decision and action follow from the figures."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

from helpers.experiments import collectives, decode, environment, loader_sweep, memory, precision
from helpers.experiments.loader_sweep import LoaderSetting
from helpers.timing import Comparison, Measurement
from helpers.verdict import Verdict


def comparison(a_s: float, b_s: float, *, name_a="A", name_b="B", spread: float = 0.01, n: int = 8) -> Comparison:
    """A comparison of two tight measurements around a_s and b_s seconds."""
    a = Measurement(name=name_a, times_s=tuple(a_s * (1 + spread * ((i % 3) - 1)) for i in range(n)), warmup=0,
                    items_per_call=32)
    b = Measurement(name=name_b, times_s=tuple(b_s * (1 + spread * ((i % 3) - 1)) for i in range(n)), warmup=0,
                    items_per_call=32)
    return Comparison.from_measurements(a, b)


def test_decode_enables_a_clear_speedup_only_when_the_pixels_match():
    pre, eff = comparison(0.2, 0.05, name_a="per-image", name_b="batched"), comparison(0.05, 0.06)
    kw = dict(min_psnr_db=40.0, psnr_min_db=30.0, tokenize_share=0.02, batch_size=32, image_size=64, images=100,
              repeats=8, warmup=1, threads=2, device_kind="cpu")
    v = decode.verdict(pre, eff, pixels_ok=True, **kw)
    assert isinstance(v, Verdict) and v.notebook == "02_batched_decode" and v.recommendation == "enable"
    assert v.action.setting == "batched_decode" and v.action.value is True and v.value == pytest.approx(4.0, rel=0.05)
    bad = decode.verdict(pre, eff, pixels_ok=False, **kw)
    assert bad.recommendation == "leave off" and "differ from the reference" in bad.reason
    same = decode.verdict(comparison(0.1, 0.1), eff, pixels_ok=True, **kw)
    assert same.recommendation == "leave off" and same.action.value is False


def test_loader_verdict_branches():
    best = LoaderSetting(2, 4, True)
    kw = dict(best_rate=900.0, zero_rate=500.0, cores=2, trials=3, context="c")
    win = loader_sweep.verdict(best, comparison(0.2, 0.1), implausible=None, **kw)
    assert win.recommendation == "enable" and win.action.value == 2 and win.extra["best_setting"] == best.label
    assert win.extra["plausible"] is True
    odd = loader_sweep.verdict(best, comparison(0.5, 0.1), implausible="more than 2 cores allow", **kw)
    assert odd.recommendation == "not applicable" and odd.action.value is None and odd.extra["plausible"] is False
    none = loader_sweep.verdict(LoaderSetting(0), None, implausible=None, **kw)
    assert none.recommendation == "leave off" and none.action.value == 0 and none.value == 1.0


def test_precision_needs_the_same_learning_before_speed():
    fast = comparison(0.2, 0.1)
    kw = dict(dtype_name="bfloat16", rel_diff=0.01, no_nan=True, loss_rtol=0.1, device_kind="cuda", native_bf16=None,
              context="c")
    assert precision.verdict(fast, loss_ok=True, **kw).action.value == "bfloat16"
    off = precision.verdict(fast, loss_ok=False, **kw)
    assert off.recommendation == "leave off" and off.action.value is None and "did not reproduce" in off.reason
    assert precision.verdict(fast, loss_ok=True, **{**kw, "device_kind": "cpu", "native_bf16": False}).reason.endswith(
        "CPU native bf16: False")
    assert precision.verdict(fast, loss_ok=True, **kw).action.text == "bf16 autocast: enable"


def _found(chosen, *, reached_max=False, sizes=(8, 16, 32)):
    frame = pd.DataFrame({"batch": list(sizes), "peak_mib": [10.0 * s for s in sizes]})
    return SimpleNamespace(chosen=chosen, frame=frame, reached_max=reached_max, budget_bytes=1 << 30,
                           limit_bytes=900 << 20, stop_reason="out of memory at 64",
                           largest_fit_text=lambda: f"batch {chosen}")


@pytest.mark.parametrize("current, best, gain, rec, target", [
    (32, 16, None, "enable", 16),            # the current batch does not fit: lower it
    (8, 16, (1.3, 1.1, 1.5), "enable", 16),  # a measured gain: raise it
    (8, 16, (1.02, 0.95, 1.1), "leave off", 8),  # no measured gain: keep it
    (16, 16, None, "leave off", 16),
])
def test_memory_verdict_moves_the_batch_only_for_a_reason(current, best, gain, rec, target):
    v = memory.verdict(_found(16), current=current, best=best, gain=gain, finder_throughput={8: 100.0, 16: 120.0},
                       budget_why="half the RAM", budget_set=False, safety_margin=0.1, used_name="peak", steps=5,
                       finder_steps=3, start_batch=8, context="c")
    assert v.recommendation == rec and v.action.setting == "batch_size" and v.action.value == target
    assert v.action.current == current and v.value == 16.0


def test_memory_verdict_from_a_budget_set_for_the_run_is_a_demonstration():
    kw = dict(current=32, best=16, gain=None, finder_throughput={8: 100.0, 16: 120.0}, budget_why="set by memory_budget_mib",
              safety_margin=0.1, used_name="peak", steps=5, finder_steps=3, start_batch=8, context="c")
    v = memory.verdict(_found(16), budget_set=True, **kw)
    assert v.recommendation == "not applicable" and v.action is None  # nothing for the first screen
    assert v.reason.startswith("demonstration budget 1,024 MiB: lower the batch to 16")
    assert "not a batch size for this machine" in v.reason
    assert v.extra["budget_set_by_parameter"] is True and v.extra["demonstration_batch_size"] == 16
    free = memory.verdict(_found(16), budget_set=False, **kw)
    assert free.recommendation == "enable" and free.action.text == "batch size 32 → 16"
    assert "memory_budget_mib" not in free.reason and "demonstration" not in free.reason


def test_memory_verdict_when_nothing_fits():
    kw = dict(current=8, best=None, gain=None, finder_throughput={}, budget_why="set", safety_margin=0.1,
              used_name="peak", steps=5, finder_steps=3, start_batch=8, context="c")
    v = memory.verdict(_found(None), budget_set=False, **kw)
    assert v.value is None and v.recommendation == "leave off" and v.reason.startswith("lower the batch below 8")
    demo = memory.verdict(_found(None), budget_set=True, **kw)
    assert demo.recommendation == "not applicable" and demo.reason.startswith(
        "demonstration budget 1,024 MiB: lower the batch below 8")


def test_collectives_not_applicable_without_a_run():
    v = collectives.verdict(None, None, None, why_not="needs 2 devices", context="c")
    assert v.recommendation == "not applicable" and v.reason == "needs 2 devices" and v.value is None


def test_environment_verdict_lists_what_is_missing():
    v = environment.verdict(device_kind="cpu", device_name="x86", native_bf16=False, invalid_settings=2,
                            capabilities={"pinned_memory": "not available: no accelerator", "channels_last": "yes"})
    assert v.recommendation == "not applicable" and v.value == 2
    assert "not available here: pinned_memory" in v.reason and "2 invalid environment setting(s)" in v.reason
