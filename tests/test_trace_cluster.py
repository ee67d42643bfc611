"""Finding a job's ranks among files and folders (helpers.traces.cluster), the cheap header read
(helpers.traces.peek), and, marked slow, a real 4-rank gloo DDP job's traces: the slowed rank is named with its
data phase and the others' wait in communication; the unslowed job has no slow rank."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import stragglers
from helpers.traces import cluster, peek
from helpers.traces.model import RankTrace, StepPhases, TraceError

BASE_NS = 1_790_857_026_000_000_000


def kineto(path: Path, rank: int | None, world: int | None = 4, *, start_s: float = 0.0, backend: str = "gloo",
           host: str = "n0", tail: str | None = None) -> Path:
    """A small file in torch 2.13's layout: metadata keys, then traceEvents. ``tail`` replaces what follows the
    first event (to prove the header read stops there)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    head = {"schemaVersion": 1, "deviceProperties": [], "trace_id": f"T{rank}"}
    if rank is not None:
        head["distributedInfo"] = {"backend": backend, "rank": rank, "world_size": world, "pg_count": 1,
                                   "pg_config": [{"pg_name": "0", "pg_size": world, "ranks": list(range(world))}]}
    head.update(host_name=host, displayTimeUnit="ms", baseTimeNanoseconds=BASE_NS)
    ts = 5_327_270_779_046.0 + start_s * 1e6
    first = {"ph": "M", "name": "process_name", "ts": ts, "pid": 1, "tid": 0, "args": {"name": "python"}}
    rest = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#2", "ts": ts + 10, "dur": 5000,
             "pid": 1, "tid": 1}]
    text = json.dumps(head)[:-1] + ', "traceEvents": [' + json.dumps(first)
    text += tail if tail is not None else "".join("," + json.dumps(e) for e in rest) + '], "traceName": "x"}'
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


@pytest.fixture
def fake_readers(monkeypatch):
    """Readers that build a RankTrace from the header alone, and record which files they read."""
    calls: list[Path] = []

    def make(fmt):
        def read(path, **_):
            calls.append(Path(path))
            h = peek.header(path, fmt)
            return RankTrace(source=Path(path), format=fmt, device_kind="cpu", steps=(StepPhases(step=1, step_s=0.1),),
                             rank=h.rank, world_size=h.world_size, node=h.node, run_id=h.run_id)
        return read

    real = cluster._reader
    monkeypatch.setattr(cluster, "_reader", lambda fmt, attr: make(fmt) if attr == "read" else real(fmt, attr))
    return calls


def test_ranks_come_from_the_metadata_not_the_file_names(tmp_path, fake_readers):
    # torch's default names (host_pid.time) in a job/node folder tree; name order is not rank order
    for rank, name in [(3, "a"), (0, "b"), (2, "c"), (1, "d")]:
        kineto(tmp_path / "job" / f"node{rank % 2}" / f"{name}_{100 + rank}.1796.pt.trace.json", rank,
               start_s=rank * 0.002, host=f"node{rank % 2}")
    (tmp_path / "job" / "notes.txt").write_text("not a trace")
    seen = []
    ranks = cluster.read([tmp_path / "job"], progress=lambda d, t: seen.append((d, t)))
    assert [t.rank for t in ranks] == [0, 1, 2, 3]
    assert [t.node for t in ranks] == ["node0", "node1", "node0", "node1"]
    total = sum(f.stat().st_size for f in (tmp_path / "job").rglob("*.pt.trace.json"))
    assert ranks.warnings == () and seen[-1] == (total, total) and len(fake_readers) == 4
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_a_single_gzipped_file(tmp_path, fake_readers):
    f = kineto(tmp_path / "w.pt.trace.json.gz", rank=None, world=None)
    [t] = cluster.read(f)
    assert t.rank is None and t.source == f


@pytest.mark.parametrize("setup", ["empty", "unrelated", "hidden", "too_deep"])
def test_a_folder_without_traces_says_what_is_looked_for(tmp_path, setup):
    if setup == "unrelated":
        (tmp_path / "events.json").write_text("{}")
        (tmp_path / "log.txt").write_text("")
    elif setup == "hidden":
        kineto(tmp_path / ".cache" / "x.pt.trace.json", 0)
    elif setup == "too_deep":
        kineto(tmp_path.joinpath(*"abcdefgh") / "x.pt.trace.json", 0)
    with pytest.raises(TraceError) as e:
        cluster.find_traces([tmp_path])
    msg = str(e.value)
    assert str(tmp_path) in msg and "*.pt.trace.json" in msg and "*.pt.trace.json.gz" in msg and "*_ascend_pt" in msg


def test_missing_path_and_non_trace_file(tmp_path):
    with pytest.raises(TraceError, match="no such file or folder"):
        cluster.find_traces([tmp_path / "nope"])
    (tmp_path / "a.txt").write_text("x")
    with pytest.raises(TraceError, match="not a profiler trace"):
        cluster.find_traces([tmp_path / "a.txt"])
    with pytest.raises(TraceError, match="no trace given"):
        cluster.find_traces([])


def test_an_ascend_folder_is_one_rank_and_is_not_searched_inside(tmp_path):
    asc = tmp_path / "host_1_20261202_ascend_pt"
    (asc / "ASCEND_PROFILER_OUTPUT").mkdir(parents=True)
    kineto(asc / "inner.pt.trace.json", 0)  # inside the Ascend folder: not a rank of its own
    (asc / "profiler_info_3.json").write_text(json.dumps({"rank_id": 3, "end_info": {"collectionTimeEnd": BASE_NS}}))
    (asc / "profiler_metadata.json").write_text(json.dumps({"parallel_group_info": {"c1": {
        "group_name": "default_group", "group_rank": 3, "global_ranks": list(range(8))}}}))
    assert cluster.find_traces([tmp_path]) == [(asc, "ascend")]
    h = peek.header(asc, "ascend")
    assert (h.rank, h.world_size, h.run_id, h.end_ns) == (3, 8, "hccl world 8", BASE_NS)


@pytest.mark.parametrize("case, match", [
    ("duplicate", "claim the same rank"),
    ("world", "disagree on the world size"),
    ("backend", "different runs"),
    ("time", "600 s apart"),
    ("single", "single-process runs"),
    ("mixed", "no distributed rank"),
    ("outside", "outside world size 4"),
])
def test_traces_that_are_not_one_runs_ranks_are_refused_before_reading(tmp_path, fake_readers, case, match):
    kineto(tmp_path / "a.pt.trace.json", 0 if case not in ("single",) else None, None if case == "single" else 4)
    second = {"duplicate": dict(rank=0), "world": dict(rank=1, world=8), "backend": dict(rank=1, backend="nccl"),
              "time": dict(rank=1, start_s=600.0), "single": dict(rank=None, world=None),
              "mixed": dict(rank=None, world=None), "outside": dict(rank=4)}[case]
    kineto(tmp_path / "b.pt.trace.json", **second)
    with pytest.raises(TraceError, match=match) as e:
        cluster.read([tmp_path])
    assert "a.pt.trace.json" in str(e.value) or case in ("mixed", "outside")
    assert "b.pt.trace.json" in str(e.value)
    assert fake_readers == []  # refused from the headers: no trace was read


def test_missing_ranks_are_a_warning_kept_in_the_result_and_the_limits(tmp_path, fake_readers):
    for r in (0, 2, 3, 5):
        kineto(tmp_path / f"r{r}.pt.trace.json", r, world=8)
    ranks = cluster.read([tmp_path])
    assert [t.rank for t in ranks] == [0, 2, 3, 5]
    [w] = ranks.warnings
    assert "only 4 of the 8 ranks" in w and "rank 1, rank 4, ranks 6-7" in w
    assert all(w in t.limits for t in ranks)


def test_the_same_file_given_twice_is_one_rank(tmp_path, fake_readers):
    f = kineto(tmp_path / "r0.pt.trace.json", 0, world=1)
    assert len(cluster.read([f, tmp_path, f])) == 1


def test_a_reader_that_is_not_installed_is_named(tmp_path, monkeypatch):
    kineto(tmp_path / "r0.pt.trace.json", 0, world=1)
    monkeypatch.setattr(cluster, "_reader", lambda fmt, attr: None)
    with pytest.raises(TraceError, match="no kineto reader"):
        cluster.read([tmp_path])


def test_a_reader_that_disagrees_on_the_rank(tmp_path, monkeypatch):
    kineto(tmp_path / "r0.pt.trace.json", 0, world=2)
    kineto(tmp_path / "r1.pt.trace.json", 1, world=2)
    wrong = lambda path, **_: RankTrace(source=Path(path), format="kineto", device_kind="cpu",  # noqa: E731
                                        steps=(StepPhases(1, 0.1),), rank=1 - int(Path(path).name[1]), world_size=2)
    monkeypatch.setattr(cluster, "_reader", lambda fmt, attr: wrong if attr == "read" else None)
    with pytest.raises(TraceError, match="metadata says rank 0 but the reader found rank 1"):
        cluster.read([tmp_path])


def test_the_header_read_stops_at_the_first_event(tmp_path):
    # everything after the first event is not JSON: the header is still read, so the events were not parsed
    f = kineto(tmp_path / "x.pt.trace.json", 2, world=4, tail=", {this is not json" + "x" * 100_000)
    h = peek.kineto_header(f)
    assert (h.rank, h.world_size, h.node, h.run_id) == (2, 4, "n0", "gloo world 4")
    assert h.start_ns == pytest.approx(BASE_NS + 5_327_270_779_046_000, abs=1e3)


@pytest.mark.parametrize("text, match", [("[1, 2]", "not a JSON object"), ('{"a": 1}', "no 'traceEvents'"),
                                          ('{"schemaVersion": 1, "traceEv', "not valid JSON")])
def test_a_file_that_is_not_a_kineto_trace(tmp_path, text, match):
    f = tmp_path / "x.pt.trace.json"
    f.write_text(text)
    with pytest.raises(TraceError, match=match):
        peek.kineto_header(f)


# ------------------------------------------------------------------------- a real 4-rank gloo DDP job (slow)

JOB = Path(__file__).with_name("ddp_trace_job.py")
SLOW_RANK, SLEEP_MS = 2, 40.0


def _run_job(out: Path, *extra: str) -> Path:
    """tests/ddp_trace_job.py in a child process (no process group in pytest), killed with its ranks on timeout."""
    env = {**os.environ, "PYTHONPATH": str(JOB.parents[1])}
    proc = subprocess.Popen([sys.executable, str(JOB), str(out), *extra], env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        log, _ = proc.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        log, _ = proc.communicate()
        pytest.fail(f"the DDP trace job did not finish in 150 s:\n{log[-3000:]}")
    assert proc.returncode == 0, f"the DDP trace job failed:\n{log[-3000:]}"
    return out


@pytest.fixture(scope="module")
def ddp_traces(tmp_path_factory):
    """The traces of the job with rank 2's dataset sleeping 40 ms per batch, and of the same job without."""
    pytest.importorskip("helpers.traces.kineto", reason="the Kineto reader (branch traces-kineto) is not merged")
    root = tmp_path_factory.mktemp("ddp")
    t0 = time.perf_counter()
    slowed, even = root / "slowed", root / "even"  # one job start-up, two runs: the slowed one, then the even one
    _run_job(slowed, "--slow-rank", str(SLOW_RANK), "--sleep-ms", str(SLEEP_MS), "--then-even", str(even))
    print(f"two 4-rank DDP jobs traced in {time.perf_counter() - t0:.1f} s")
    return {"slowed": slowed, "even": even}


def _medians(res) -> str:
    cols = [p for p in ("step_s", "data", "optimizer", "comm", "comm_exposed", "idle", "compute")
            if any(p in m for m in res.medians.values())]
    lines = ["rank        " + "".join(f"{c:>10}" for c in cols)]
    for label, m in res.medians.items():
        lines.append(f"{label:12}" + "".join(f"{m[c] * 1e3:10.2f}" if c in m else f"{'-':>10}" for c in cols))
    return "\n".join(lines) + "   (ms, medians over the steps)"


@pytest.mark.slow
def test_the_slowed_rank_is_named_with_its_data_phase_and_the_others_wait(ddp_traces):
    seen = []
    ranks = cluster.read([ddp_traces["slowed"]], progress=lambda d, t: seen.append((d, t)))
    assert [t.rank for t in ranks] == [0, 1, 2, 3] and ranks.warnings == ()
    total = sum(f.stat().st_size for f in ddp_traces["slowed"].iterdir())
    assert seen[-1] == (total, total) and [d for d, _ in seen] == sorted(d for d, _ in seen)
    res = stragglers.find(ranks)
    print(_medians(res), res.sentence(), sep="\n")
    assert res.ranks == (SLOW_RANK,) and res.phase == "data" and res.node is None
    assert res.excess_s == pytest.approx(SLEEP_MS / 1e3, rel=0.15)
    # the naive answer, the rank with the most communication, is a fast rank: they wait for rank 2 there
    most_comm = max(res.medians, key=lambda k: res.medians[k].get("comm", 0.0))
    assert not most_comm.startswith(f"rank {SLOW_RANK}")
    assert res.wait is not None and res.wait.phase == "comm_exposed"  # blocked time, the first wait phase named
    assert res.wait.coverage >= stragglers.WAIT_COVERAGE
    s = res.sentence()
    assert s.startswith(f"rank {SLOW_RANK}") and "data phase" in s and f"is their wait for rank {SLOW_RANK}" in s
    assert "more communication not hidden behind compute per step" in s
    # at the collectives: rank 2 arrives last (its gloo spans are the shortest), the others wait about the sleep
    from helpers.traces.arrival import find_last
    last = find_last(ranks)
    print(last.sentence())
    assert last.straggler.startswith(f"rank {SLOW_RANK} ") and last.straggler not in last.waits_s
    assert all(w == pytest.approx(SLEEP_MS / 1e3, rel=0.3) for w in last.waits_s.values())


@pytest.mark.slow
def test_the_unslowed_job_has_no_slow_rank(ddp_traces):
    ranks = cluster.read([ddp_traces["even"]])
    res = stragglers.find(ranks)
    print(_medians(res), res.sentence(), sep="\n")
    assert res.findings == ()
    assert res.sentence().startswith("No rank is slower than the others: across 4 ranks")
    from helpers.traces.arrival import find_last
    last = find_last(ranks)
    print(last.sentence())
    assert last.straggler is None  # no rank arrives last at most collectives


def test_a_folder_is_searched_by_content_not_by_name(tmp_path, fake_readers):
    kineto(tmp_path / "run" / "rank-0.json.gz", 0, world=2)
    kineto(tmp_path / "run" / "rank-1.json", 1, world=2)
    (tmp_path / "run" / "config.json").write_text('{"lr": 0.1, "epochs": 3}')  # a JSON that is no trace
    ranks = cluster.read([tmp_path])
    assert [t.rank for t in ranks] == [0, 1] and not ranks.warnings
    assert sorted(p.name for p in fake_readers) == ["rank-0.json.gz", "rank-1.json"]


def _two_cycles(path_of, *, ranks=(0, 1)):
    for r in ranks:
        for c, start in enumerate((0.0, 30.0)):
            kineto(path_of(r, c), r, world=len(ranks), start_s=start)


def test_profiler_cycles_of_each_rank_are_read_together_as_windows(tmp_path, monkeypatch):
    _two_cycles(lambda r, c: tmp_path / f"r{r}_c{c}.pt.trace.json")

    def read(path, **_):  # each cycle's file holds its own steps
        h = peek.header(path, "kineto")
        first = 1 if path.name.endswith("c0.pt.trace.json") else 11
        steps = tuple(StepPhases(step=first + i, step_s=0.1) for i in range(3))
        return RankTrace(source=Path(path), format="kineto", device_kind="cpu", steps=steps, rank=h.rank,
                         world_size=h.world_size, run_id=h.run_id, provenance={"start_unix_s": h.start_ns / 1e9})

    real = cluster._reader
    monkeypatch.setattr(cluster, "_reader", lambda fmt, attr: read if attr == "read" else real(fmt, attr))
    ranks = cluster.read([tmp_path])
    assert [t.rank for t in ranks] == [0, 1]
    assert [s.step for s in ranks[0].steps] == [1, 2, 3, 11, 12, 13]
    assert "2 profiler cycles per rank" in ranks.warnings[0]
    assert any("2 profiler cycles read as windows: steps 1-3" in lim for lim in ranks[0].limits)


def test_one_processs_cycles_are_windows_but_two_processes_are_refused(tmp_path, fake_readers):
    for c, start in enumerate((0.0, 20.0)):
        kineto(tmp_path / "one" / f"host-a_4242.{1796184176582 + c}.pt.trace.json", None, None, start_s=start)
    assert "2 profiler cycles of one process (host-a_4242" in cluster.check(
        [peek.header(p, "kineto") for p, _ in cluster.find_traces([tmp_path / "one"])])[0]
    kineto(tmp_path / "two" / "host-a_1.1796184176582.pt.trace.json", None, None)
    kineto(tmp_path / "two" / "host-a_2.1796184176582.pt.trace.json", None, None, start_s=5.0)
    with pytest.raises(TraceError, match="single-process runs"):
        cluster.read([tmp_path / "two"])


def test_a_truncated_rank_is_named_and_the_others_are_read(tmp_path):
    from helpers.traces.analysis import analyze

    for r in range(3):
        kineto(tmp_path / f"r{r}.pt.trace.json", r, world=3)
    cut = tmp_path / "r1.pt.trace.json"
    cut.write_text(cut.read_text()[:-40])  # a rank's file cut short by a killed job
    ranks = cluster.read([tmp_path])
    assert [t.rank for t in ranks] == [0, 2]
    assert any(w.startswith("rank 1 could not be read") and "ends early" in w for w in ranks.warnings)
    assert any("only 2 of the 3 ranks" in w for w in ranks.warnings)
    assert "2 of 3 ranks" in analyze(ranks).headline()


def test_a_folder_of_several_jobs_says_so(tmp_path, fake_readers):
    kineto(tmp_path / "a.pt.trace.json", None, None)
    kineto(tmp_path / "b.pt.trace.json", 0, world=8)
    kineto(tmp_path / "c.pt.trace.json", 0, world=2)
    with pytest.raises(TraceError, match="several different jobs.*world sizes 2, 8"):
        cluster.read([tmp_path])


def test_a_gz_name_on_data_that_is_not_gzip_is_said(tmp_path):
    bad = tmp_path / "t.json.gz"
    bad.write_bytes(b"\x00\x01 random bytes, not a trace")
    with pytest.raises(TraceError, match="named .gz but not gzip data"):
        cluster.read([bad])
