"""read_ascend on built torch_npu profiler folders (tests/ascend_fixtures.py): phases, units, rank metadata, and
each bad input. The folders are built from the writer's layout, not recorded on an Ascend machine."""

from __future__ import annotations

import csv
import json
from datetime import datetime

import pytest

from helpers.traces.ascend import (
    COMMUNICATION_FILE, COMMUNICATION_MATRIX_FILE, KERNEL_DETAILS_FILE, OFFLINE_PARSE, OPERATOR_DETAILS_FILE,
    OUTPUT_DIR, STEP_TRACE_FILE, TRACE_VIEW_FILE, looks_like_ascend, read_ascend,
)
from helpers.traces.model import TraceError
from tests.ascend_fixtures import HcclOp, Step, build_ascend_folder, build_cluster, copy_outputs

HOST_BOUND = [Step(n, host_s=0.100, data_s=0.060, optimizer_s=0.004, compute_s=0.025, comm_s=0.010,
                   comm_exposed_s=0.003, free_s=0.012, prepare_s=0.061, bubble_s=0.0) for n in (5, 6, 7)]


def _limits(trace, *words):
    return [x for x in trace.limits if all(w in x for w in words)]


def _rewrite_step_trace(folder, edit):
    path = folder / OUTPUT_DIR / STEP_TRACE_FILE
    with path.open(newline="") as f:
        table = list(csv.reader(f))
    with path.open("w", newline="") as f:
        csv.writer(f).writerows(edit(table))
    return path


def test_phases_in_seconds_from_microseconds(tmp_path):
    folder = build_ascend_folder(tmp_path, HOST_BOUND)
    with (folder / OUTPUT_DIR / STEP_TRACE_FILE).open(newline="") as f:
        row = next(csv.DictReader(f))
    assert float(row["Computing"]) == pytest.approx(25_000.0)  # the file holds µs
    t = read_ascend(folder)
    assert (t.format, t.device_kind) == ("ascend", "npu")
    assert [s.step for s in t.steps] == [5, 6, 7]
    for s in t.steps:
        assert s.step_s == pytest.approx(0.100, abs=1e-9)  # the host ProfilerStep#N span
        assert s.data == pytest.approx(0.060, abs=1e-9)
        assert s.optimizer == pytest.approx(0.004, abs=1e-9)
        assert (s.compute, s.comm, s.comm_exposed, s.idle) == pytest.approx((0.025, 0.010, 0.003, 0.012))
        assert s.h2d is None
        assert s.exposed_fraction == pytest.approx(0.6, abs=1e-6)
    assert _limits(t, "h2d unknown")


def test_device_bound_step_reads_small_share(tmp_path):
    steps = [Step(n, host_s=0.080, data_s=0.002, compute_s=0.075, free_s=0.001) for n in range(4)]
    t = read_ascend(build_ascend_folder(tmp_path, steps))
    assert [s.exposed_fraction for s in t.steps] == pytest.approx([0.025] * 4, abs=1e-6)


def test_rank_metadata_of_one_run(tmp_path):
    folders = build_cluster(tmp_path, [HOST_BOUND, HOST_BOUND], hostnames=["node-a", "node-b"])
    a, b = (read_ascend(f) for f in folders)
    assert (a.rank, a.world_size, a.node) == (0, 2, "node-a")
    assert (b.rank, b.world_size, b.node) == (1, 2, "node-b")
    assert a.run_id == b.run_id is not None
    assert b.label == "rank 1 (node-b)"
    assert b.provenance["device_id"] == 1
    other = read_ascend(build_ascend_folder(tmp_path / "x", HOST_BOUND, rank=0, world_size=2,
                                            comm_name="10.0.0.9%eth0_60000_0_1736000000000000"))
    assert other.run_id != a.run_id


def test_node_comes_from_cann_metadata_not_the_folder_name(tmp_path):
    folder = build_ascend_folder(tmp_path, HOST_BOUND, rank=2, world_size=4, hostname="worker7")
    info = next(folder.glob("PROF_*")) / "host" / "info.json"
    info.write_text(json.dumps(dict(json.loads(info.read_text()), hostname="real-host")))
    t = read_ascend(folder)
    assert folder.name.startswith("worker7_") and t.node == "real-host"


def test_single_process_has_no_rank(tmp_path):
    folder = build_ascend_folder(tmp_path, HOST_BOUND)
    t = read_ascend(folder)
    assert (t.rank, t.world_size, t.run_id) == (None, None, None)
    assert t.label == folder.name
    p = t.provenance
    assert (p["reader"], p["path"], p["torch_npu_version"], p["cann_version"]) == (
        "ascend", str(folder), "2.13.0", "8.5.0")
    assert p["bytes"] == sum((folder / f).stat().st_size for f in p["files"])
    assert datetime.fromisoformat(p["mtime"]).tzinfo is not None


def test_no_dataloader_annotation_leaves_the_share_unknown(tmp_path):
    t = read_ascend(build_ascend_folder(tmp_path, HOST_BOUND, dataloader=False))
    assert all(s.data is None and s.exposed_fraction is None for s in t.steps)
    assert all(s.idle == pytest.approx(0.012) for s in t.steps)
    assert _limits(t, "data phase is unknown", "Free", "Preparing")


def test_no_trace_view_falls_back_to_the_writer_step_span(tmp_path):
    t = read_ascend(build_ascend_folder(tmp_path, HOST_BOUND, trace_view=None))
    # Preparing + Stage + Bubble = 0.061 + (0.025 + 0.003 + 0.012) + 0
    assert [s.step_s for s in t.steps] == pytest.approx([0.101] * 3)
    assert all(s.data is None and s.optimizer is None for s in t.steps)
    assert _limits(t, f"no {TRACE_VIEW_FILE}") and _limits(t, "Preparing + Stage + Bubble")


def test_truncated_trace_view_keeps_the_host_events(tmp_path):
    # What torch_npu leaves when parsing fails after the host part: the array without its closing bracket.
    # The host part is whole, and the reader stops at its end: nothing is lost.
    t = read_ascend(build_ascend_folder(tmp_path, HOST_BOUND, trace_view="truncated"))
    assert [s.data for s in t.steps] == pytest.approx([0.060] * 3)
    assert [s.step_s for s in t.steps] == pytest.approx([0.100] * 3)
    assert not _limits(t, TRACE_VIEW_FILE)


def test_trace_view_cut_midway_loses_the_later_steps_only(tmp_path):
    steps = [Step(n, host_s=0.1, data_s=0.05, compute_s=0.04, free_s=0.01) for n in range(40)]
    t = read_ascend(build_ascend_folder(tmp_path, steps, trace_view="cut"))
    with_host = [s for s in t.steps if s.data is not None]
    assert 0 < len(with_host) < len(steps)
    assert with_host == list(t.steps[: len(with_host)])
    assert _limits(t, "stops before its end") and _limits(t, "Preparing + Stage + Bubble")


def test_run_without_step_marks_is_one_step(tmp_path):
    t = read_ascend(build_ascend_folder(tmp_path, HOST_BOUND, step_marks=False))
    assert [s.step for s in t.steps] == [0]
    assert t.steps[0].data is None
    assert _limits(t, "no step numbers") and _limits(t, "no ProfilerStep#N events")


def test_top_ops_by_device_time(tmp_path):
    ops = {"aten::addmm": (2, 300.0, "MatMulV2"), "aten::relu": (1, 40.0, "Relu"), "aten::mul": (5, 100.0, "Mul")}
    t = read_ascend(build_ascend_folder(tmp_path, HOST_BOUND, ops=ops))
    assert [(o["name"], o["calls"], o["where"]) for o in t.top_ops] == [
        ("aten::addmm", 6, "device"), ("aten::mul", 15, "device"), ("aten::relu", 3, "device")]
    assert t.top_ops[0]["self_ms"] == pytest.approx(1.8)  # 3 steps x 2 calls x 300 µs
    k = read_ascend(build_ascend_folder(tmp_path / "k", HOST_BOUND, ops=ops, operator_details=False))
    assert [(o["name"], o["calls"]) for o in k.top_ops] == [("MatMulV2", 6), ("Mul", 15), ("Relu", 3)]
    none = read_ascend(build_ascend_folder(tmp_path / "n", HOST_BOUND, operator_details=False,
                                           kernel_details=False))
    assert none.top_ops == () and _limits(none, "top_ops empty")


def test_looks_like_ascend(tmp_path):
    folder = build_ascend_folder(tmp_path, HOST_BOUND)
    renamed = folder.rename(tmp_path / "renamed")
    assert looks_like_ascend(renamed)
    assert not looks_like_ascend(renamed / OUTPUT_DIR / STEP_TRACE_FILE)
    assert not looks_like_ascend(tmp_path / "missing")
    (tmp_path / "plain").mkdir()
    assert not looks_like_ascend(tmp_path / "plain")
    assert read_ascend(renamed / OUTPUT_DIR).source == renamed  # its output folder is read from its parent


def test_stopped_before_parsing_names_the_offline_parse(tmp_path):
    folder = build_ascend_folder(tmp_path, HOST_BOUND, parsed=False)
    assert looks_like_ascend(folder)
    with pytest.raises(TraceError) as e:
        read_ascend(folder)
    msg = str(e.value)
    assert OUTPUT_DIR in msg and OFFLINE_PARSE in msg and str(folder) in msg
    assert "from torch_npu.profiler.profiler import analyse" in msg


@pytest.mark.parametrize("make, words", [
    (lambda p: p / "missing", ["does not exist"]),
    (lambda p: (p / "f.csv").write_text("x") and p / "f.csv", ["is a file"]),
    (lambda p: (p / "plain").mkdir() or p / "plain", ["not a torch_npu profiler folder"]),
])
def test_not_a_folder(tmp_path, make, words):
    with pytest.raises(TraceError) as e:
        read_ascend(make(tmp_path))
    assert all(w in str(e.value) for w in words)


def test_missing_step_trace_reads_trace_view(tmp_path):
    folder = build_ascend_folder(tmp_path, HOST_BOUND)
    with_csv = read_ascend(folder)
    (folder / OUTPUT_DIR / STEP_TRACE_FILE).unlink()
    t = read_ascend(folder)
    assert t.steps == with_csv.steps  # the device timeline sums to the csv's columns
    assert _limits(t, f"no {STEP_TRACE_FILE}", TRACE_VIEW_FILE)


def test_nothing_per_step_names_the_files_looked_for(tmp_path):
    folder = build_ascend_folder(tmp_path, HOST_BOUND, hccl={n: [HcclOp()] for n in (5, 6, 7)})
    for name in (STEP_TRACE_FILE, TRACE_VIEW_FILE, KERNEL_DETAILS_FILE):
        (folder / OUTPUT_DIR / name).unlink()
    with pytest.raises(TraceError) as e:
        read_ascend(folder)
    msg = str(e.value)
    assert "nothing per step" in msg and "ProfilerActivity.NPU" in msg
    assert all(f"{name} (missing)" in msg for name in (STEP_TRACE_FILE, TRACE_VIEW_FILE, KERNEL_DETAILS_FILE))
    assert f"{COMMUNICATION_FILE} (present, but HCCL times only" in msg
    assert f"Copy the profiler folder's {OUTPUT_DIR}/{STEP_TRACE_FILE}" in msg
    (folder / OUTPUT_DIR / "ascend_pytorch_profiler_0.db").write_bytes(b"")
    with pytest.raises(TraceError, match="export_type='text'"):
        read_ascend(folder)


@pytest.mark.parametrize("edit, words", [
    (lambda t: [[c for c in r if c != "Free"] for r in t], ["lacks columns ['Free']"]),
    (lambda t: t[:1], ["no rows"]),
    (lambda t: [], ["empty"]),
    (lambda t: [t[0], [c if i != 3 else "n/a" for i, c in enumerate(t[1])]] + t[2:],
     ["line 2", "Communication(Not Overlapped)", "'n/a'"]),
    (lambda t: [t[0], [c if i != 2 else "-5.0" for i, c in enumerate(t[1])]] + t[2:], ["line 2", "Computing = '-5.0'"]),
])
def test_bad_step_trace(tmp_path, edit, words):
    path = _rewrite_step_trace(build_ascend_folder(tmp_path, HOST_BOUND), edit)
    with pytest.raises(TraceError) as e:
        read_ascend(path.parents[1])
    assert STEP_TRACE_FILE in str(e.value)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_unreadable_step_trace(tmp_path):
    folder = build_ascend_folder(tmp_path, HOST_BOUND)
    (folder / OUTPUT_DIR / STEP_TRACE_FILE).write_bytes(b"\xff\xfe\x00Step,\x9c\x00")
    with pytest.raises(TraceError, match="cannot be read as CSV"):
        read_ascend(folder)


def test_two_devices_reads_the_first(tmp_path):
    path = _rewrite_step_trace(build_ascend_folder(tmp_path, HOST_BOUND),
                               lambda t: t + [["1", *r[1:]] for r in t[1:]])
    t = read_ascend(path.parents[1])
    assert len(t.steps) == 3 and _limits(t, "devices [0, 1]")


def test_broken_metadata_is_a_limit_not_an_error(tmp_path):
    folder = build_ascend_folder(tmp_path, HOST_BOUND, rank=1, world_size=2)
    (folder / "profiler_info_1.json").write_text("{not json")
    t = read_ascend(folder)
    assert t.rank == 1  # from the HCCL default group in profiler_metadata.json
    assert _limits(t, "profiler_info_1.json could not be read")
    assert "torch_npu_version" not in t.provenance


def test_operator_details_without_device_time_falls_back_to_kernels(tmp_path):
    folder = build_ascend_folder(tmp_path, HOST_BOUND)
    path = folder / OUTPUT_DIR / OPERATOR_DETAILS_FILE
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    with path.open("w", newline="") as f:
        csv.writer(f).writerows([rows[0]] + [r[:5] + ["0", "0", "0", "0"] for r in rows[1:]])
    t = read_ascend(folder)
    assert t.top_ops[0]["name"] == "MatMulV2"


# --- partial folders ---------------------------------------------------------------------------------------


def _phases(s):
    return s.step_s, s.data, s.optimizer, s.compute, s.comm, s.comm_exposed, s.idle


def test_trace_view_only(tmp_path):
    """A user's copy of trace_view.json alone, under ASCEND_PROFILER_OUTPUT/ in a folder of another name."""
    full = build_ascend_folder(tmp_path / "full", HOST_BOUND, rank=2, world_size=4)
    copy = copy_outputs(full, tmp_path / "rank2_copy", [TRACE_VIEW_FILE])
    assert looks_like_ascend(copy)
    t = read_ascend(copy)
    assert t.source == copy and [s.step for s in t.steps] == [5, 6, 7]
    for s in t.steps:
        assert _phases(s) == pytest.approx((0.100, 0.060, 0.004, 0.025, 0.010, 0.003, 0.012), abs=1e-9)
        assert s.exposed_fraction == pytest.approx(0.6, abs=1e-6)
    assert t.provenance["files"] == [f"{OUTPUT_DIR}/{TRACE_VIEW_FILE}"] and t.provenance["device_id"] == 2
    assert (t.rank, t.world_size, t.top_ops) == (None, None, ())
    assert _limits(t, f"no {STEP_TRACE_FILE}", f"read from {TRACE_VIEW_FILE}")
    assert _limits(t, "summed per step", "Computing", "torch_to_npu flows")
    assert _limits(t, "no profiler_info") and _limits(t, "top_ops empty")


def test_partial_copy_is_found_by_content(tmp_path):
    from helpers.traces.cluster import find_traces
    from helpers.traces.peek import header

    full = build_ascend_folder(tmp_path / "full", HOST_BOUND, rank=1, world_size=2)
    flat = copy_outputs(full, tmp_path / "from_rank1", [TRACE_VIEW_FILE, KERNEL_DETAILS_FILE], flat=True,
                        metadata=True)
    assert looks_like_ascend(flat) and looks_like_ascend(full / OUTPUT_DIR)
    t = read_ascend(flat)
    assert (t.source, t.rank, t.world_size) == (flat, 1, 2)
    assert t.provenance["files"][0] == TRACE_VIEW_FILE
    assert find_traces([flat]) == [(flat, "ascend")]
    assert header(full / OUTPUT_DIR, "ascend").rank == 1  # the output folder's identity is its parent's
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.csv").write_text("step,time\n")
    assert not looks_like_ascend(other)


def test_trace_view_without_flows_splits_the_device_by_host_steps(tmp_path):
    t = read_ascend(build_ascend_folder(tmp_path, HOST_BOUND, step_trace=False, flows=False))
    assert [_phases(s) for s in t.steps] == [pytest.approx((0.1, 0.06, 0.004, 0.025, 0.01, 0.003, 0.012))] * 3
    assert _limits(t, "no torch_to_npu flow events", "next step")


def test_trace_view_without_step_marks_is_one_step(tmp_path):
    t = read_ascend(build_ascend_folder(tmp_path, HOST_BOUND, step_trace=False, step_marks=False))
    (s,) = t.steps
    assert s.step == 0 and s.data is None
    assert (s.compute, s.comm, s.comm_exposed, s.idle) == pytest.approx((0.075, 0.030, 0.009, 0.036))
    # Preparing (first host operator to first device task) + Stage + Bubble: 0.061 - 1 µs + 0.2 + 0.04
    assert s.step_s == pytest.approx(0.300999, abs=1e-9)
    assert _limits(t, "marks no step", "numbered 0")


def test_level_none_folder_has_host_phases_only(tmp_path):
    """Level_none writes trace_view.json (host only) and operator_details.csv, no step files (the writer's own
    partial folder)."""
    folder = build_ascend_folder(tmp_path, HOST_BOUND, step_trace=False, kernel_details=False,
                                 device_timeline=False, level="Level_none")
    t = read_ascend(folder)
    for s in t.steps:
        assert (s.step_s, s.data, s.exposed_fraction) == pytest.approx((0.1, 0.06, 0.6))
        assert (s.compute, s.comm, s.comm_exposed, s.idle) == (None, None, None, None)
    assert _limits(t, "no device timeline", "Level_none", "unknown")
    assert t.top_ops[0]["name"] == "aten::addmm"


def test_kernel_details_only(tmp_path):
    full = build_ascend_folder(tmp_path / "full", HOST_BOUND)
    t = read_ascend(copy_outputs(full, tmp_path / "kernels", [KERNEL_DETAILS_FILE]))
    assert [s.step for s in t.steps] == [5, 6, 7]
    # 2 x 300 + 40 + 3 x 10 µs of kernels per step, back to back
    assert [s.compute for s in t.steps] == pytest.approx([670e-6] * 3)
    # the device's step period to the next step; the last step, with none, its kernels' span (a lower bound)
    assert [s.step_s for s in t.steps] == pytest.approx([0.1, 0.1, 670e-6])
    assert all(s.data is None and s.idle is None and s.exposed_fraction is None for s in t.steps)
    assert _limits(t, "wall time is NOT known", "no per-step share", "for step 7", STEP_TRACE_FILE)
    assert _limits(t, f"{KERNEL_DETAILS_FILE} alone")
    assert [o["name"] for o in t.top_ops] == ["MatMulV2", "Relu", "Add"]


def test_kernel_details_without_step_id_is_an_error(tmp_path):
    full = build_ascend_folder(tmp_path / "full", HOST_BOUND, step_marks=False)
    copy = copy_outputs(full, tmp_path / "kernels", [KERNEL_DETAILS_FILE, OPERATOR_DETAILS_FILE])
    with pytest.raises(TraceError) as e:
        read_ascend(copy)
    msg = str(e.value)
    assert "'Step Id' column" in msg and f"{TRACE_VIEW_FILE} (missing)" in msg and STEP_TRACE_FILE in msg


def test_host_only_trace_view_takes_compute_from_kernel_details(tmp_path):
    """trace_view.json as torch_npu leaves it when parsing fails after its host part, with kernel_details.csv."""
    t = read_ascend(build_ascend_folder(tmp_path, HOST_BOUND, trace_view="truncated", step_trace=False))
    for s in t.steps:
        assert (s.step_s, s.data, s.compute) == pytest.approx((0.1, 0.06, 670e-6))
        assert (s.comm, s.comm_exposed, s.idle) == (None, None, None)
    assert _limits(t, "ends right after its host events")
    assert _limits(t, "compute of steps 5, 6, 7", KERNEL_DETAILS_FILE)
    assert f"{OUTPUT_DIR}/{KERNEL_DETAILS_FILE}" in t.provenance["files"]


def _hccl(send_wait_ms):
    """Per step an allReduce over HCCS and RDMA (RDMA far slower; the pair 0-3 slow among the HCCS ones) and a
    send whose wait varies."""
    return {n: [HcclOp(links={"HCCS": (40.0, 1.0), "RDMA": (2.0, 1.0)},
                       pairs={"0-1": ("HCCS", 40.0, 1.0), "0-2": ("HCCS", 38.0, 1.0), "0-3": ("HCCS", 4.0, 1.0),
                              "0-8": ("RDMA", 2.0, 1.0)}),
                HcclOp(name="hcom_send", elapse_ms=0.5, transit_ms=0.2, wait_ms=w, sync_ms=0.1,
                       links={"RDMA": (0.4, 0.2)}, pairs={"0-8": ("RDMA", 0.4, 0.2)})]
            for n, w in zip((5, 6, 7), send_wait_ms)}


def test_communication_summary(tmp_path):
    t = read_ascend(build_ascend_folder(tmp_path, HOST_BOUND, rank=0, world_size=16, hccl=_hccl((0.1, 0.2, 0.9))))
    h = t.provenance["hccl"]
    json.dumps(h)  # JSON-ready
    assert [s["step"] for s in h["steps"]] == [5, 6, 7] and [s["ops"] for s in h["steps"]] == [2, 2, 2]
    assert [s["wait_ms"] for s in h["steps"]] == pytest.approx([0.9, 1.0, 1.7])
    assert (h["wait_ms"], h["transit_ms"], h["sync_ms"], h["elapse_ms"]) == pytest.approx((1.0, 1.2, 0.6, 2.5))
    assert h["slow_link"]["type"] == "RDMA"
    assert h["slow_link"]["bandwidth_gb_s"] == pytest.approx(7.2 / 3.6)  # (3 x 2.4 MB) / (3 x 1.2 ms)
    assert h["links"]["HCCS"]["bandwidth_gb_s"] == pytest.approx(40.0)
    assert (h["slow_pair"]["link"], h["slow_pair"]["type"]) == ("0-3", "HCCS")
    assert (h["slow_pair"]["bandwidth_gb_s"], h["slow_pair"]["peer_median_gb_s"]) == pytest.approx((4.0, 39.0))
    assert _limits(t, "slow link is RDMA", "2.00 GB/s", "far below HCCS", COMMUNICATION_FILE)
    assert _limits(t, "link 0-3 (HCCS)", COMMUNICATION_MATRIX_FILE)
    assert [s.comm for s in t.steps] == pytest.approx([0.010] * 3)  # step_trace_time.csv's, not replaced
    files = t.provenance["files"]
    assert f"{OUTPUT_DIR}/{COMMUNICATION_FILE}" in files and f"{OUTPUT_DIR}/{COMMUNICATION_MATRIX_FILE}" in files


def test_communication_without_a_slow_link(tmp_path):
    hccl = {n: [HcclOp(links={"HCCS": (40.0, 1.0), "RDMA": (20.0, 1.0)})] for n in (5, 6, 7)}
    t = read_ascend(build_ascend_folder(tmp_path, HOST_BOUND, hccl=hccl))
    h = t.provenance["hccl"]
    assert h["slow_link"]["type"] == "RDMA" and "slow_pair" not in h  # no pairs: no matrix file
    assert not _limits(t, "slow link")


def test_communication_gives_comm_without_a_device_timeline(tmp_path):
    full = build_ascend_folder(tmp_path / "full", HOST_BOUND, hccl=_hccl((0.1, 0.2, 0.9)))
    t = read_ascend(copy_outputs(full, tmp_path / "copy", [KERNEL_DETAILS_FILE, COMMUNICATION_FILE]))
    assert [s.comm for s in t.steps] == pytest.approx([0.0025] * 3)  # 2.0 + 0.5 ms of Elapse per step
    assert all(s.comm_exposed is None for s in t.steps)
    assert _limits(t, "comm of steps 5, 6, 7", "Elapse Time(ms)", "comm_exposed is unknown")
    assert t.provenance["hccl"]["wait_ms"] == pytest.approx(1.0)


def test_broken_communication_json_is_a_limit(tmp_path):
    folder = build_ascend_folder(tmp_path, HOST_BOUND, hccl=_hccl((0.1, 0.2, 0.9)))
    (folder / OUTPUT_DIR / COMMUNICATION_FILE).write_text("{\"step5\": ")
    t = read_ascend(folder)
    assert "hccl" not in t.provenance and _limits(t, f"{COMMUNICATION_FILE} could not be read")


def test_device_timeline_without_step_sums(tmp_path):
    """Kernels but no Computing/Communication/Free rows: the device phases are unknown, not 0; kernel_details.csv
    gives compute."""
    folder = build_ascend_folder(tmp_path, HOST_BOUND, step_trace=False)
    path = folder / OUTPUT_DIR / TRACE_VIEW_FILE
    events = [e for e in json.loads(path.read_text())
              if e.get("name") not in ("Computing", "Communication", "Communication(Not Overlapped)", "Free")]
    path.write_text(json.dumps(events))
    t = read_ascend(folder)
    assert [s.compute for s in t.steps] == pytest.approx([670e-6] * 3)
    assert all(s.idle is None and s.comm is None for s in t.steps)
    assert _limits(t, "has device events but none of the step sums'")


def test_hccl_groups_without_a_default_group_give_the_world_and_the_missing_ranks(tmp_path):
    """torch_npu writes the default group only when its HCCL communicator exists; the npu-mfu-analyzer sample's
    rank 0 lists two groups of global ranks [0, 1, 2, 3] with group_name "" and no default group."""
    from helpers.traces.analysis import analyze

    folder = build_ascend_folder(tmp_path, HOST_BOUND, rank=0, world_size=4)
    md_path = folder / "profiler_metadata.json"
    md = json.loads(md_path.read_text())
    md["parallel_group_info"] = {f"group_name_{k}": {"group_name": "", "group_rank": 0,
                                                     "global_ranks": [0, 1, 2, 3]} for k in (2, 3)}
    md_path.write_text(json.dumps(md))
    t = read_ascend(folder)
    assert (t.rank, t.world_size) == (0, 4) and t.run_id == "hccl:group_name_2+group_name_3"
    assert _limits(t, "no default_group", "global ranks 0-3", "at least 4 ranks")
    a = analyze([t])
    assert a.missing_ranks == 3 and "one rank (rank 0 (node-a)) of a 4-rank job" in a.headline()
    assert "3 missing ranks" in a.headline() and "single-process" not in a.headline()


def test_top_ops_from_op_statistic_cover_the_whole_run_and_kernel_details_say_their_window(tmp_path):
    folder = build_ascend_folder(tmp_path, HOST_BOUND, operator_details=False)
    out = folder / OUTPUT_DIR
    k = read_ascend(folder)  # kernel_details.csv alone: the window its kernels span is said
    window = _limits(k, "top operators from kernel_details.csv, whose kernels span", "covers that window only")
    assert window and "recorded" in window[0]
    (out / "op_statistic.csv").write_text(
        "Device_id,OP Type,Core Type,Count,Total Time(us),Min Time(us),Avg Time(us),Max Time(us),Ratio(%)\n"
        "4,MatMulV2,AI_CORE,32689,327673.06,3.1,10.023,613.3,51.081\n"
        "4,Cast,AI_VECTOR_CORE,4394,102638.58,1.06,23.358,567.44,16\n"
        "4,Cast,AI_CORE,6,1.5,0.2,0.25,0.3,0.0\n"
        "4,Bad,AI_CORE,x,y,0,0,0,0\n")
    t = read_ascend(folder)
    assert [(o["name"], o["calls"]) for o in t.top_ops] == [("MatMulV2", 32689), ("Cast", 4400)]
    assert t.top_ops[0]["self_ms"] == pytest.approx(327.67306)
    assert _limits(t, "top operators from op_statistic.csv", "whole recording")
    assert not _limits(t, "top operators from kernel_details.csv")
