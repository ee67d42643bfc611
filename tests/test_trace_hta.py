"""The trace reader against Holistic Trace Analysis (HTA 0.5.0, the test extra), both run here on the same files.

tests/test_trace_public.py holds the reader to HTA's numbers on public traces, where they are on the machine; this
module runs HTA itself, on every machine with the test extra, on CUDA-shaped traces of two ranks made by
:func:`helpers.traces.synthetic.write_synthetic_kineto` with a host-bound, a balanced and a device-bound timing.
HTA measures each rank over one window, from the first kernel's start to the last kernel's end of the steps it
keeps (it drops the last ``ProfilerStep``); the reader measures each step over the host's ``ProfilerStep`` span. So
the times are compared over HTA's steps: compute and non-compute (communication and copies not hidden behind
compute) within 5% of HTA's, and the shares of the step time within 5 points of HTA's shares of its window where
the two windows are within 5% of each other.

Where HTA runs. HTA 0.5.0 does not work under pandas 3 on every trace: ``hta/common/trace.py`` downcasts the
``correlation`` column to int16 where every correlation id fits (below 32,768), gives ``index_correlation`` that
dtype, and then writes event row numbers into it, which pandas 3 refuses once the trace holds more than 32,767
events (``TypeError: Invalid value '[...]' for dtype 'int16'``; pandas 2 upcast silently). Reproduced here on a
synthetic trace of 45,139 events and 9,018 correlation ids: pandas 3.1.1 (the project's pin) raises, pandas 2.3.3
gives HTA's breakdown. So HTA runs in the interpreter named by ``$HTA_PYTHON`` where it is set (a venv with
``HolisticTraceAnalysis==0.5.0 pandas==2.3.3``, made as tests/tools/hta_reference.py says), else in this process
(the test extra's HTA under the project's pandas), where a trace HTA cannot read under it skips with that reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import warnings
from pathlib import Path

import pytest

from helpers.traces.kineto import read_kineto
from helpers.traces.synthetic import StepTiming, write_synthetic_kineto

#: An interpreter whose environment runs HTA 0.5.0 on every trace (pandas < 3); None: HTA runs in this process.
HTA_PYTHON = os.environ.get("HTA_PYTHON") or None
if HTA_PYTHON is None:
    hta = pytest.importorskip("hta.trace_analysis", reason="HolisticTraceAnalysis (the test extra) is not installed")
#: HTA's temporal breakdown and kept steps as JSON, run by $HTA_PYTHON on the folder given.
_HTA_SCRIPT = """
import contextlib, json, sys, warnings
from hta.trace_analysis import TraceAnalysis
with warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr):
    warnings.simplefilter("ignore")
    a = TraceAnalysis(trace_dir=sys.argv[1])
    rows = a.get_temporal_breakdown(visualize=False).to_dict("records")
    steps = [int(s) for s in a.get_profiler_steps()]
print(json.dumps({"rows": rows, "steps": steps}, default=float))
"""

#: Points a share may differ from HTA's, and the relative difference a time may have (the public traces' rule).
POINTS, RELATIVE = 5.0, 0.05

TIMINGS = {
    "host-bound": StepTiming(step_us=100_000, data_us=35_000, h2d_us=3_000, kernel_busy=0.3),
    "balanced": StepTiming(),
    "device-bound": StepTiming(step_us=100_000, data_us=2_000, h2d_us=1_000, kernel_busy=0.97, compute_end=0.78),
}


def _hta(folder: Path):
    """HTA's temporal breakdown per rank and the steps it keeps, from $HTA_PYTHON where set, else this process."""
    if HTA_PYTHON is not None:
        p = subprocess.run([HTA_PYTHON, "-c", _HTA_SCRIPT, str(folder)], capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, f"HTA under {HTA_PYTHON} failed: {p.stderr[-1500:]}"
        got = json.loads(p.stdout.strip().splitlines()[-1])
        return {int(r["rank"]): r for r in got["rows"]}, got["steps"]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            analysis = hta.TraceAnalysis(trace_dir=str(folder))
            df = analysis.get_temporal_breakdown(visualize=False)
    except TypeError as exc:
        if "for dtype 'int16'" not in str(exc):
            raise
        import pandas

        pytest.skip(f"HTA 0.5.0 cannot read this trace under pandas {pandas.__version__} (its int16 correlation "
                    "column, see the module's text); set HTA_PYTHON to a venv's python with pandas==2.3.3 "
                    "(tests/tools/hta_reference.py)")
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


@pytest.mark.slow
def test_a_trace_of_more_than_32767_events_agrees_with_hta_where_hta_runs(tmp_path):
    # 45,139 events, 9,018 correlation ids: the trace HTA 0.5.0 cannot read under pandas 3 (the module's text)
    path = tmp_path / "host0_4600.1796184147071102324.pt.trace.json"
    write_synthetic_kineto(path, steps=6, units_per_step=1500, rank=0, world_size=1)
    rows, kept = _hta(tmp_path)
    t, rt = rows[0], read_kineto(path)
    steps = [s for s in rt.steps if s.step in set(kept)]
    assert len(steps) == len(kept) == 5
    compute = sum(s.compute for s in steps) * 1e6
    assert compute == pytest.approx(t["compute_time(us)"], rel=RELATIVE), (compute, t)


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
