"""Tests for helpers.timing: warm-up, sync order, ABBA interleaving, ratios, events, phases."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest

from helpers.errors import ParameterError
from helpers.timing import (
    Comparison,
    Measurement,
    PhaseTimer,
    bootstrap_ratio_ci,
    compare,
    measure,
    measure_events,
)


class FakeClock:
    """A clock that only moves when told to; every read is logged."""

    def __init__(self, log: list) -> None:
        self.t = 100.0
        self.log = log

    def __call__(self) -> float:
        self.log.append("clock")
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


def make_env():
    log: list = []
    clock = FakeClock(log)

    def sync() -> None:
        log.append("sync")

    return log, clock, sync


# --------------------------------------------------------------------------- Measurement


def test_measurement_statistics_match_numpy():
    times = (0.5, 0.1, 0.3, 0.2, 0.4)
    m = Measurement("x", times, warmup=1, items_per_call=10)
    assert m.repeats == 5
    assert m.median_s == pytest.approx(0.3)
    assert m.p25_s == pytest.approx(np.percentile(times, 25))
    assert m.p75_s == pytest.approx(np.percentile(times, 75))
    assert m.iqr_s == pytest.approx(0.2)
    assert m.mean_s == pytest.approx(0.3)
    assert m.stdev_s == pytest.approx(np.std(times, ddof=1))
    assert (m.min_s, m.max_s) == (0.1, 0.5)
    assert m.rate == pytest.approx(10 / 0.3)
    # the low rate quartile comes from the slow time quartile
    assert m.rate_p25 == pytest.approx(10 / m.p75_s)
    assert m.rate_p75 == pytest.approx(10 / m.p25_s)
    assert m.rate_p25 < m.rate < m.rate_p75
    assert set(m.spread()) == {"p25", "p75", "min", "max", "stdev"}
    s = m.summary()
    assert s["median_s"] == m.median_s and s["rate"] == m.rate and s["warmup"] == 1


def test_measurement_without_items_has_no_rate_and_single_repeat_no_stdev():
    m = Measurement("x", (0.2,), warmup=0)
    assert m.rate is None and m.rate_p25 is None and m.rate_p75 is None
    assert m.stdev_s == 0.0
    assert m.times_s == (0.2,)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"times_s": ()},
        {"times_s": (0.1, float("nan"))},
        {"times_s": (0.1, -0.1)},
        {"times_s": (0.1,), "warmup": -1},
        {"times_s": (0.1,), "warmup": True},
        {"times_s": (0.1,), "items_per_call": 0},
        {"times_s": (0.1,), "items_per_call": float("inf")},
    ],
)
def test_measurement_rejects_bad_values(kwargs):
    kwargs.setdefault("warmup", 0)
    with pytest.raises(ParameterError):
        Measurement("x", **kwargs)


# --------------------------------------------------------------------------- measure


def test_measure_excludes_warmup_and_syncs_around_each_call():
    log, clock, sync = make_env()
    durations = iter([5.0, 5.0, 0.1, 0.2, 0.3])  # two slow warm-up calls, then three repeats

    def fn():
        log.append("fn")
        clock.advance(next(durations))

    m = measure(fn, repeats=3, warmup=2, sync=sync, clock=clock, name="f")
    assert m.times_s == pytest.approx((0.1, 0.2, 0.3))
    assert m.warmup == 2 and m.name == "f"
    # warm-up calls are untimed; each repeat is sync, clock, fn, sync, clock
    assert log == ["fn", "fn"] + ["sync", "clock", "fn", "sync", "clock"] * 3


def test_measure_sync_drains_earlier_work_before_start():
    """Work queued before a repeat (here: completed by the sync) is not charged to it."""
    log: list = []
    clock = FakeClock(log)
    pending = []

    def sync():
        while pending:
            clock.advance(pending.pop())

    def fn():  # "asynchronous": queues 0.5 s of work and returns at once
        pending.append(0.5)

    m = measure(fn, repeats=4, warmup=1, sync=sync, clock=clock)
    assert m.times_s == pytest.approx((0.5,) * 4)
    # without a sync the same function looks free: the lie this module exists to prevent
    pending.clear()
    naive = measure(fn, repeats=4, warmup=1, sync=None, clock=clock)
    assert naive.median_s == 0.0


def test_measure_without_sync_and_with_items():
    log, clock, _ = make_env()
    m = measure(lambda: clock.advance(0.25), repeats=4, warmup=0, clock=clock, items_per_call=50)
    assert m.median_s == pytest.approx(0.25)
    assert m.rate == pytest.approx(200.0)


def test_measure_with_real_clock_runs():
    m = measure(lambda: sum(range(1000)), repeats=3, warmup=1)
    assert m.repeats == 3 and all(t >= 0 for t in m.times_s)


@pytest.mark.parametrize(
    "kwargs",
    [{"repeats": 0}, {"repeats": 2.5}, {"repeats": True}, {"warmup": -1}, {"sync": 3},
     {"items_per_call": -5}],
)
def test_measure_validates_arguments(kwargs):
    with pytest.raises(ParameterError):
        measure(lambda: None, **kwargs)


def test_measure_rejects_non_callable():
    with pytest.raises(ParameterError, match="fn"):
        measure(42)


def test_measure_warns_below_three_repeats(caplog):
    with caplog.at_level(logging.WARNING, logger="helpers.measurement"):  # measure lives there
        measure(lambda: None, repeats=2, warmup=0)
    assert any("repeats=2" in r.getMessage() for r in caplog.records)


# --------------------------------------------------------------------------- events


class FakeEvent:
    """Mimics torch.Event(enable_timing=True): record() stamps the fake device clock."""

    def __init__(self, device) -> None:
        self.device = device
        self.t_ms = None
        self.device.log.append("new")

    def record(self) -> None:
        self.device.log.append("record")
        self.t_ms = self.device.now_ms

    def elapsed_time(self, end: "FakeEvent") -> float:
        assert self.device.synced, "events read before the final sync"
        return end.t_ms - self.t_ms


class FakeDevice:
    def __init__(self) -> None:
        self.now_ms = 0.0
        self.log: list = []
        self.synced = False

    def sync(self) -> None:
        self.log.append("sync")
        self.synced = True


def test_measure_events_reads_elapsed_ms_after_one_final_sync():
    dev = FakeDevice()
    durations_ms = iter([100.0, 100.0, 2.0, 4.0, 6.0])

    def fn():
        dev.log.append("fn")
        dev.now_ms += next(durations_ms)

    m = measure_events(fn, new_event=lambda: FakeEvent(dev), sync=dev.sync, repeats=3, warmup=2,
                       name="ev", items_per_call=8)
    assert m.times_s == pytest.approx((0.002, 0.004, 0.006))
    assert m.warmup == 2 and m.name == "ev"
    assert m.rate == pytest.approx(8 / 0.004)
    assert dev.log == ["fn", "fn"] + ["new", "new", "record", "fn", "record"] * 3 + ["sync"]


def test_measure_events_requires_sync_and_rejects_negative_times():
    dev = FakeDevice()
    with pytest.raises(ParameterError, match="sync"):
        measure_events(lambda: None, new_event=lambda: FakeEvent(dev), sync=None)

    class Backwards(FakeEvent):
        def elapsed_time(self, end):
            return -1.0

    with pytest.raises(ParameterError, match="no events"):
        measure_events(lambda: None, new_event=lambda: None, sync=dev.sync, repeats=3)

    with pytest.raises(ParameterError, match="enable_timing"):
        measure_events(lambda: None, new_event=lambda: Backwards(dev), sync=dev.sync, repeats=3)


# --------------------------------------------------------------------------- compare


def test_compare_interleaves_abba_and_excludes_warmup():
    log, clock, sync = make_env()
    calls: list = []

    def fn_a():
        calls.append("A")
        clock.advance(0.2)

    def fn_b():
        calls.append("B")
        clock.advance(0.1)

    c = compare(fn_a, fn_b, repeats=4, warmup=1, sync=sync, clock=clock, names=("slow", "fast"))
    assert calls == ["A", "B"] + ["A", "B", "B", "A", "A", "B", "B", "A"]
    # every timed call is bracketed by syncs; warm-up calls are not timed
    assert log.count("clock") == 2 * 4 * 2 and log.count("sync") == 2 * 4 * 2
    assert c.a.name == "slow" and c.b.name == "fast"
    assert c.a.times_s == pytest.approx((0.2,) * 4) and c.b.times_s == pytest.approx((0.1,) * 4)
    assert c.a.warmup == 1 and c.b.warmup == 1


def test_compare_ratio_direction_and_interval():
    rng = np.random.default_rng(1)
    a_times = iter(0.020 + 0.001 * rng.standard_normal(40))
    b_times = iter(0.010 + 0.0005 * rng.standard_normal(40))
    log, clock, _ = make_env()
    c = compare(lambda: clock.advance(next(a_times)), lambda: clock.advance(next(b_times)),
                repeats=20, warmup=0, clock=clock)
    # B takes half the time: speedup of B over A is ~2, not ~0.5
    assert c.ratio == pytest.approx(c.a.median_s / c.b.median_s)
    assert 1.8 < c.ratio < 2.2
    assert c.ci_low <= c.ratio <= c.ci_high
    assert c.ci_low > 1.0
    assert c.outcome() == "b_faster"
    text = c.verdict_text()
    assert text.startswith("B is ") and "faster than A" in text and "95% CI" in text


def test_comparison_is_reproducible_with_seed():
    rng = np.random.default_rng(0)
    a = Measurement("A", tuple(1.0 + 0.1 * rng.random(15)), warmup=0)
    b = Measurement("B", tuple(1.0 + 0.1 * rng.random(15)), warmup=0)
    c1 = Comparison.from_measurements(a, b, seed=3)
    c2 = Comparison.from_measurements(a, b, seed=3)
    assert (c1.ci_low, c1.ci_high) == (c2.ci_low, c2.ci_high)


def test_comparison_no_difference_and_slower_texts():
    rng = np.random.default_rng(2)
    same = tuple(1.0 + 0.05 * rng.standard_normal(30))
    same2 = tuple(1.0 + 0.05 * rng.standard_normal(30))
    c = Comparison.from_measurements(Measurement("A", same, 0), Measurement("B", same2, 0))
    assert c.ci_low < 1.0 < c.ci_high
    assert c.outcome() == "no_difference"
    assert "no measurable difference" in c.verdict_text() and "spans 1" in c.verdict_text()

    slow_b = Comparison.from_measurements(
        Measurement("base", (1.0, 1.01, 0.99, 1.0, 1.02), 0),
        Measurement("new", (3.0, 3.02, 2.98, 3.0, 3.01), 0),
    )
    assert slow_b.ratio < 1 and slow_b.outcome() == "a_faster"
    assert slow_b.verdict_text().startswith("new is 3x slower than base")

    small = Comparison.from_measurements(
        Measurement("A", (1.02, 1.021, 1.019, 1.02, 1.02), 0),
        Measurement("B", (1.0, 1.001, 0.999, 1.0, 1.0), 0),
    )
    assert small.ci_low > 1 and small.outcome(threshold=1.05) == "below_threshold"
    assert small.outcome(threshold=1.01) == "b_faster"
    with pytest.raises(ParameterError):
        small.outcome(threshold=0.9)


def test_comparison_summary_and_zero_median_rejected():
    c = Comparison.from_measurements(Measurement("A", (2.0, 2.0, 2.0), 0),
                                     Measurement("B", (1.0, 1.0, 1.0), 0))
    assert c.ratio == 2.0 and c.ci_low == 2.0 and c.ci_high == 2.0
    s = c.summary()
    assert s["ratio"] == 2.0 and s["a_median_s"] == 2.0 and s["confidence"] == 0.95
    with pytest.raises(ParameterError, match="too coarse"):
        Comparison.from_measurements(Measurement("A", (1.0,), 0), Measurement("B", (0.0,), 0))


def test_bootstrap_ratio_ci_validates():
    with pytest.raises(ParameterError):
        bootstrap_ratio_ci([], [1.0])
    with pytest.raises(ParameterError):
        bootstrap_ratio_ci([1.0], [1.0], confidence=1.5)
    with pytest.raises(ParameterError):
        bootstrap_ratio_ci([1.0], [1.0], resamples=10)
    lo, hi = bootstrap_ratio_ci([2.0, 2.2, 1.8], [1.0, 1.1, 0.9], confidence=0.9)
    assert lo <= 2.0 <= hi and math.isfinite(hi)


def test_compare_items_per_pair_and_bad_names():
    log, clock, _ = make_env()
    c = compare(lambda: clock.advance(0.5), lambda: clock.advance(0.25), repeats=3, warmup=0,
                clock=clock, items_per_call=(10, 20))
    assert c.a.rate == pytest.approx(20.0) and c.b.rate == pytest.approx(80.0)
    with pytest.raises(ParameterError, match="names"):
        compare(lambda: None, lambda: None, names=("only",))
    with pytest.raises(ParameterError, match="repeats"):
        compare(lambda: None, lambda: None, repeats=0)


# --------------------------------------------------------------------------- PhaseTimer


def test_phase_timer_rows_totals_and_sync_order():
    log, clock, sync = make_env()
    timer = PhaseTimer(sync=sync, clock=clock)
    plan = [{"data": 0.3, "compute": 1.0}, {"data": 0.1, "compute": 2.0}]
    for step in plan:
        for name, dt in step.items():
            with timer.phase(name):
                log.append(f"in {name}")
                clock.advance(dt)
        timer.end_step()
    # the second step enters "data" twice: two rows, summed in totals
    with timer.phase("data"):
        clock.advance(0.05)
    timer.end_step()

    assert log[:5] == ["sync", "clock", "in data", "sync", "clock"]
    df = timer.frame()
    assert list(df.columns) == ["step", "phase", "start_s", "duration_s"]
    assert list(df["step"]) == [0, 0, 1, 1, 2]
    assert list(df["phase"]) == ["data", "compute", "data", "compute", "data"]
    assert df["duration_s"].tolist() == pytest.approx([0.3, 1.0, 0.1, 2.0, 0.05])
    assert df["start_s"].tolist() == pytest.approx([0.0, 0.3, 1.3, 1.4, 3.4])

    tot = timer.totals()
    assert list(tot.columns) == ["step", "data", "compute", "step_s"]
    assert tot["step"].tolist() == [0, 1, 2]
    assert tot["data"].tolist() == pytest.approx([0.3, 0.1, 0.05])
    assert tot["compute"].tolist() == pytest.approx([1.0, 2.0, 0.0])
    assert tot["step_s"].tolist() == pytest.approx([1.3, 2.1, 0.05])
    skipped = timer.totals(skip_steps=2)
    assert skipped["step"].tolist() == [2]
    assert timer.totals(skip_steps=10).empty
    assert list(timer.totals(skip_steps=10).columns) == ["step", "data", "compute", "step_s"]


def test_phase_timer_same_phase_twice_in_a_step():
    log, clock, _ = make_env()
    timer = PhaseTimer(clock=clock)
    for dt in (0.1, 0.2):
        with timer.phase("h2d"):
            clock.advance(dt)
    timer.end_step()
    assert len(timer.frame()) == 2
    assert timer.totals()["h2d"].tolist() == pytest.approx([0.3])


def test_phase_timer_rejects_nesting_and_misuse_and_resets():
    timer = PhaseTimer()
    with pytest.raises(ParameterError, match="nested"):
        with timer.phase("outer"):
            with timer.phase("inner"):
                pass
    with pytest.raises(ParameterError):
        with timer.phase(""):
            pass
    with pytest.raises(ParameterError, match="end_step"):
        with timer.phase("x"):
            timer.end_step()
    with pytest.raises(ParameterError):
        timer.totals(skip_steps=-1)
    timer.reset()
    assert timer.frame().empty and timer.step == 0
    assert list(timer.totals().columns) == ["step", "step_s"]


def test_phase_timer_records_phase_that_raises_without_closing_sync():
    log, clock, sync = make_env()
    timer = PhaseTimer(sync=sync, clock=clock)
    with pytest.raises(RuntimeError):
        with timer.phase("boom"):
            clock.advance(0.5)
            raise RuntimeError("device error")
    assert log == ["sync", "clock", "clock"]
    assert timer.frame()["duration_s"].tolist() == pytest.approx([0.5])
    # the timer is usable again
    with timer.phase("ok"):
        pass
