"""A trace too large to keep in memory: its events go to disk and come back in windows of time, same answer.

The windowed analysis must give exactly what the in-memory one gives (every phase is a length of a union of spans
inside a step, and such a length adds over windows that partition time); these tests force the spill on small
traces (``SPILL_EVENTS``, ``WINDOW_EVENTS`` set low) and compare the two reads of the same file, on a real CPU
trace, a synthetic CUDA trace with NCCL and copies, hand-built traces with spans across window edges, and the
public traces where they are on the machine.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest

from helpers.traces import kineto
from helpers.traces.kineto import read_kineto
from helpers.traces.kineto_spill import RECORD, Spill
from helpers.traces.synthetic import write_synthetic_kineto

HERE = Path(__file__).resolve().parent


def _same(a, b) -> None:
    assert a.device_kind == b.device_kind and a.limits == b.limits and a.rank == b.rank
    assert a.provenance["events"] == b.provenance["events"]
    assert len(a.steps) == len(b.steps)
    for x, y in zip(a.steps, b.steps):
        dx, dy = dataclasses.asdict(x), dataclasses.asdict(y)
        for k, v in dx.items():
            if isinstance(v, float):
                assert dy[k] == pytest.approx(v, abs=1e-9), (x.step, k)
            elif isinstance(v, dict):
                assert dy[k].keys() == v.keys() and all(dy[k][q] == pytest.approx(v[q], abs=1e-9) for q in v), k
            else:
                assert dy[k] == v, (x.step, k)
    assert [(c[0], c[1]) for c in a.collectives] == [(c[0], c[1]) for c in b.collectives]
    assert [c[2] for c in a.collectives] == pytest.approx([c[2] for c in b.collectives], abs=1e-9)
    assert [(o["name"], o["calls"], o["where"]) for o in a.top_ops] == [
        (o["name"], o["calls"], o["where"]) for o in b.top_ops]
    assert [o["self_ms"] for o in a.top_ops] == pytest.approx([o["self_ms"] for o in b.top_ops], abs=1e-6)


def _both(path: Path, monkeypatch, *, window: int | None = None):
    """The trace read in memory, then spilled to disk and read back in windows of about ``window`` events (default
    a sixth of the trace's)."""
    whole = read_kineto(path)
    window = window or max(3, whole.provenance["events"] // 6)
    seen = []
    real_windows = Spill.windows

    def counting(self, target):
        for cols, wlo, whi in real_windows(self, target):
            seen.append((len(cols[0]), wlo, whi))
            yield cols, wlo, whi

    with monkeypatch.context() as m:
        m.setattr(kineto, "SPILL_EVENTS", 2)
        m.setattr(kineto, "WINDOW_EVENTS", window)
        m.setattr(Spill, "windows", counting)
        spilled = read_kineto(path)
    assert len(seen) >= 3, f"the spill was not cut into windows: {seen}"
    assert all(hi > lo for _, lo, hi in seen) and all(seen[i][2] == seen[i + 1][1] for i in range(len(seen) - 1))
    return whole, spilled, seen


def test_a_real_cpu_trace_gives_the_same_steps_from_disk(tmp_path, monkeypatch):
    from tests.test_trace_kineto import _profile_cpu

    trace = _profile_cpu(tmp_path)
    whole, spilled, _ = _both(trace, monkeypatch, window=150)
    assert whole.steps[0].data is not None and whole.steps[0].compute is not None
    _same(whole, spilled)


@pytest.mark.parametrize("gz", [False, True])
def test_a_synthetic_cuda_trace_gives_the_constructed_phases_from_disk(tmp_path, monkeypatch, gz):
    path = tmp_path / ("t.pt.trace.json" + (".gz" if gz else ""))
    info = write_synthetic_kineto(path, steps=12, units_per_step=60, gzip=gz)
    whole, spilled, seen = _both(path, monkeypatch, window=400)
    _same(whole, spilled)
    for got, want in zip(spilled.steps, info["expected"]):
        for k, v in want.items():
            assert getattr(got, k) == pytest.approx(v, abs=1e-9), k
    # each window holds about its quota (a span across an edge counts in both windows it touches)
    assert max(n for n, _, _ in seen) < 3 * 400


def _x(name, ts, dur, *, cat="cpu_op", pid=1, tid=1):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}


def test_spans_across_window_edges_and_nested_ops_count_once(tmp_path, monkeypatch):
    # long steps with ops nested three deep, a DataLoader span and a sync wait per step, kernels on the device;
    # windows of ~100 events cut through steps and ops alike
    events = []
    for k in range(8):
        t0 = k * 10_000
        events += [_x(f"ProfilerStep#{k}", t0, 10_000, cat="user_annotation"),
                   _x("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", t0 + 10, 1_500),
                   _x("cudaStreamSynchronize", t0 + 9_000, 900, cat="cuda_runtime"),
                   _x("Optimizer.step#SGD.step", t0 + 8_000, 900)]
        for j in range(40):
            a = t0 + 1_600 + j * 160
            events += [_x("aten::linear", a, 150), _x("aten::addmm", a + 5, 140), _x("cudaLaunchKernel", a + 10, 20,
                                                                                     cat="cuda_runtime"),
                       _x("gemm_kernel", a + 40, 130, cat="kernel", pid=0, tid=7)]
        events += [_x("ncclDevKernel_AllReduce_Sum_f32_RING_LL", t0 + 8_900, 1_000, cat="kernel", pid=0, tid=8),
                   _x("Memcpy HtoD (Pinned -> Device)", t0 + 1_520, 60, cat="gpu_memcpy", pid=0, tid=9)]
    path = tmp_path / "t.pt.trace.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    whole, spilled, _ = _both(path, monkeypatch, window=100)
    _same(whole, spilled)
    assert whole.steps[0].sync_wait == pytest.approx(900e-9 * 1000)
    assert {o["name"] for o in whole.top_ops} >= {"aten::linear", "gemm_kernel"}


def test_the_spill_folder_is_removed_after_a_read_and_after_a_failure(tmp_path, monkeypatch):
    spill_root = tmp_path / "tmp"
    spill_root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spill_root))
    path = tmp_path / "t.pt.trace.json"
    write_synthetic_kineto(path, steps=4, units_per_step=40)
    monkeypatch.setattr(kineto, "SPILL_EVENTS", 50)
    monkeypatch.setattr(kineto, "WINDOW_EVENTS", 200)
    made = []
    real_init = Spill.__init__

    def track(self):
        real_init(self)
        made.append(self.folder)

    monkeypatch.setattr(Spill, "__init__", track)
    read_kineto(path)
    assert made and not any(spill_root.iterdir())

    def broken(*a, **k):
        raise RuntimeError("the analysis failed")

    monkeypatch.setattr(kineto, "_analyse", broken)
    with pytest.raises(RuntimeError):
        read_kineto(path)
    assert len(made) == 2 and not any(spill_root.iterdir())


def test_windows_partition_time_and_hold_every_overlapping_event(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    rng = np.random.default_rng(0)
    n = 5_000
    ts = np.sort(rng.integers(0, 1_000_000, n)).astype(np.int64)
    dur = rng.integers(0, 5_000, n).astype(np.int64)
    dur[::500] = 200_000  # a few long spans cross many windows
    spill = Spill()
    try:
        for a in range(0, n, 777):  # written in parts, out of time order
            b = min(a + 777, n)
            sl = slice(a, b)
            spill.write(ts[sl][::-1], dur[sl][::-1], np.arange(a, b, dtype=np.int32)[::-1],
                        np.zeros(b - a, np.int16), np.zeros(b - a, np.int32))
        got = list(spill.windows(600))
    finally:
        spill.close()
    assert not any(tmp_path.iterdir())
    assert 6 <= len(got) <= 20
    assert got[0][1] == ts.min() and got[-1][2] > (ts + dur).max()
    for (cols, wlo, whi) in got:
        ids = set(cols[2].tolist())
        want = np.flatnonzero((ts < whi) & ((ts + dur > wlo) | (ts >= wlo)))
        assert ids == set(want.tolist()), (wlo, whi)
    assert RECORD.itemsize == 26


PUBLIC = Path(os.environ.get("PUBLIC_TRACES_DIR") or HERE.parent.parent / "shared" / "public_traces")
EXPECTED = json.loads((HERE / "data" / "public_traces" / "hta_expected.json").read_text())
WITH_STEPS = sorted(k for k, v in EXPECTED.items()
                    if not k.startswith("_") and k != "tb_plugin_expected" and v["trace"]["profiler_steps"])


@pytest.mark.skipif(not all((PUBLIC / k).is_file() for k in WITH_STEPS),
                    reason="the public traces are not on this machine (see tests/data/public_traces/README.md)")
@pytest.mark.parametrize("key", WITH_STEPS)
def test_public_traces_give_the_same_answer_from_disk(key, monkeypatch):
    whole, spilled, _ = _both(PUBLIC / key, monkeypatch)
    _same(whole, spilled)


def test_a_tmpdir_that_cannot_be_used_is_said_not_silently_replaced(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "missing"))
    monkeypatch.setattr(tempfile, "tempdir", None)  # tempfile looks again, and falls back
    with pytest.warns(UserWarning, match="TMPDIR=.*missing is not a folder this process can write"):
        spill = Spill()
    spill.close()
