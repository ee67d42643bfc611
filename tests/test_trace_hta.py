"""The trace reader against Holistic Trace Analysis (HTA 0.5.0, the test extra), both run here on the same files.

tests/test_trace_public.py holds the reader to HTA's numbers on public traces, where they are on the machine; this
module runs HTA itself, on every machine with the test extra, on CUDA-shaped traces of two ranks made by
:func:`helpers.traces.synthetic.write_synthetic_kineto` with a host-bound, a balanced and a device-bound timing.
HTA measures each rank over one window, from the first kernel's start to the last kernel's end of the steps it
keeps (it drops the last ``ProfilerStep``); the reader measures each step over the host's ``ProfilerStep`` span. So
the times are compared over HTA's steps: compute and non-compute (communication and copies not hidden behind
compute) within 5% of HTA's, and the shares of the step time within 5 points of HTA's shares of its window where
the two windows are within 5% of each other.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from helpers.traces.kineto import read_kineto
from helpers.traces.synthetic import StepTiming, write_synthetic_kineto

hta = pytest.importorskip("hta.trace_analysis", reason="HolisticTraceAnalysis (the test extra) is not installed")

#: Points a share may differ from HTA's, and the relative difference a time may have (the public traces' rule).
POINTS, RELATIVE = 5.0, 0.05

TIMINGS = {
    "host-bound": StepTiming(step_us=100_000, data_us=35_000, h2d_us=3_000, kernel_busy=0.3),
    "balanced": StepTiming(),
    "device-bound": StepTiming(step_us=100_000, data_us=2_000, h2d_us=1_000, kernel_busy=0.97, compute_end=0.78),
}


def _hta(folder: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        analysis = hta.TraceAnalysis(trace_dir=str(folder))
        df = analysis.get_temporal_breakdown(visualize=False)
    rows = {int(r["rank"]): r for r in df.to_dict("records")}
    return rows, [int(s) for s in analysis.get_profiler_steps()]


@pytest.mark.parametrize("kind", sorted(TIMINGS))
def test_compute_communication_and_idle_agree_with_hta_on_the_same_traces(tmp_path, kind):
    for rank in (0, 1):
        write_synthetic_kineto(tmp_path / f"host{rank}_{4600 + rank}.1796184147071102324.pt.trace.json", steps=10,
                               units_per_step=80, timing=TIMINGS[kind], rank=rank, world_size=2)
    rows, kept = _hta(tmp_path)
    assert sorted(rows) == [0, 1] and len(kept) == 9
    for path in sorted(tmp_path.glob("*.pt.trace.json")):
        rt = read_kineto(path)
        t = rows[rt.rank]
        steps = [s for s in rt.steps if s.step in set(kept)]
        assert len(steps) == len(kept)
        window = sum(s.step_s for s in steps) * 1e6
        compute = sum(s.compute for s in steps) * 1e6
        idle = sum(s.idle for s in steps) * 1e6
        non_compute = window - compute - idle
        assert compute == pytest.approx(t["compute_time(us)"], rel=RELATIVE), (kind, compute, t)
        assert non_compute == pytest.approx(t["non_compute_time(us)"], rel=RELATIVE, abs=500), (kind, non_compute, t)
        if abs(window / t["kernel_time(us)"] - 1) <= RELATIVE:
            got = {"compute": compute, "non_compute": non_compute, "idle": idle}
            for name, v in got.items():
                assert abs(100 * v / window - t[f"{name}_time_pctg"]) <= POINTS, (kind, name, got, t)


def test_the_reader_and_hta_rank_the_timings_alike(tmp_path):
    # the reader's verdict follows HTA's picture: the device-bound timing has the most compute, the host-bound the
    # least, in both tools
    shares = {}
    for kind, timing in TIMINGS.items():
        folder = tmp_path / kind
        folder.mkdir()
        write_synthetic_kineto(folder / "host0_4600.1796184147071102324.pt.trace.json", steps=6, units_per_step=60,
                               timing=timing, rank=0, world_size=1)
        rows, _ = _hta(folder)
        rt = read_kineto(next(folder.glob("*.json")))
        ours = sum(s.compute for s in rt.steps[:-1]) / sum(s.step_s for s in rt.steps[:-1])
        shares[kind] = (ours, rows[0]["compute_time_pctg"])
    order = sorted(shares, key=lambda k: shares[k][0])
    assert order == ["host-bound", "balanced", "device-bound"] == sorted(shares, key=lambda k: shares[k][1])
