"""``python -m helpers trace``: notebook 01's verdict from profiler traces (analysis, report files, command line).

The analysis runs on constructed RankTraces (no profiler needed), so every figure below is known in advance.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from helpers.bottleneck import BALANCED, COMM_BOUND, DEVICE_BOUND, HOST_BOUND
from helpers.errors import ParameterError
from helpers.traces.model import RankTrace, StepPhases, TraceError

from helpers.traces import analysis
from helpers.traces.analysis import analyze


def _trace(data=0.040, h2d=0.005, step=0.100, *, n=8, rank=None, node=None, device="cuda", compute=None,
           idle=None, comm_exposed=None, name="trace.json", top_ops=(), limits=(), collectives=(),
           world=4) -> RankTrace:
    """A rank whose steps all have the same phases (seconds), with a small spread so quartiles are not all equal."""
    steps = []
    for i in range(n):
        wobble = 1.0 + 0.01 * (i - (n - 1) / 2)  # symmetric: the median is the value given
        steps.append(StepPhases(step=i, step_s=step * wobble, data=None if data is None else data * wobble,
                                h2d=None if h2d is None else h2d * wobble,
                                compute=compute, idle=idle, comm_exposed=comm_exposed))
    return RankTrace(source=Path(f"/traces/{name}"), format="kineto", device_kind=device, steps=tuple(steps),
                     rank=rank, world_size=None if rank is None else world, node=node, top_ops=tuple(top_ops),
                     collectives=tuple(collectives),
                     limits=tuple(limits), provenance={"path": f"/traces/{name}", "bytes": 1234,
                                                       "mtime": "2025-01-31T12:00:00+00:00", "reader": "kineto"})


# --------------------------------------------------------------------------- analysis


def test_host_bound_trace_gets_notebook_01s_verdict_and_next_notebook():
    a = analyze([_trace(data=0.040, h2d=0.005, step=0.100)])
    assert a.label == HOST_BOUND and a.job.exposed_fraction == pytest.approx(0.45)
    v = a.verdict()
    assert (v.notebook, v.metric, v.unit, v.recommendation) == ("01_baseline_profiling", "exposed_input_fraction",
                                                                "fraction", HOST_BOUND)
    assert v.value == pytest.approx(0.45) and v.spread["p25"] <= v.value <= v.spread["p75"]
    assert v.repeats == 8 and v.extra["source"] == "trace"
    assert v.extra["bottleneck"]["next_notebooks"] == ["03", "02"]  # the loader first, spare cores unknown
    assert "notebook 03" in a.next_text() and v.reason.endswith(a.next_text())
    assert v.extra["phases"]["data"]["median_s"] == pytest.approx(0.040)


def test_device_bound_trace_points_at_the_compute_notebooks():
    a = analyze([_trace(data=0.002, h2d=0.001, step=0.100, compute=0.090, idle=0.008)])
    assert a.label == DEVICE_BOUND and a.bottleneck.next_notebooks == ("06", "07")
    assert a.job.phases["compute"].median_s == pytest.approx(0.090)


def test_a_copy_dominated_input_points_at_pinned_memory():
    a = analyze([_trace(data=0.010, h2d=0.040, step=0.100)])
    assert a.job.copy_share == pytest.approx(0.8) and a.bottleneck.next_notebooks == ("04", "05")


def test_exposed_share_is_the_median_of_per_step_fractions_not_a_ratio_of_medians():
    # per-step fractions 0.1, 0.5, 0.3: median 0.3; median data / median step would be 0.05 / 0.1 = 0.5
    steps = (StepPhases(0, 0.100, data=0.010), StepPhases(1, 0.100, data=0.050), StepPhases(2, 0.200, data=0.060))
    t = RankTrace(source=Path("t.json"), format="kineto", device_kind="cuda", steps=steps)
    a = analyze([t])
    assert a.job.exposed_fraction == pytest.approx(0.3) and a.label == BALANCED


def test_no_data_annotation_gives_no_confident_label():
    a = analyze([_trace(data=None, h2d=None, step=0.100, compute=0.060, idle=0.040)])
    v = a.verdict()
    assert a.bottleneck is None and v.recommendation == "inconclusive" and v.value is None and v.spread is None
    assert not any(lab in v.reason for lab in (HOST_BOUND, DEVICE_BOUND, BALANCED))
    assert "cannot be told" in v.reason and "idle for 40%" in v.reason and "DataLoader" in v.reason
    assert any("not measurable" in lim for lim in a.limits)
    assert "notebook 01" in a.next_text() and a.job.label_text == "not measurable"


@pytest.mark.parametrize("compute, comm, idle, label", [
    (0.95, None, 0.03, DEVICE_BOUND),   # busy computing 90% or more: device-bound whatever else
    (0.70, None, 0.05, DEVICE_BOUND),   # idle at most the threshold: the input, which shows as idle, is no lever
    (0.40, 0.45, 0.10, COMM_BOUND),     # the exposed communication is the largest lever
])
def test_without_dataloader_spans_the_device_timeline_decides(compute, comm, idle, label):
    a = analyze([_trace(data=None, h2d=None, compute=compute * 0.1, comm_exposed=None if comm is None else comm * 0.1,
                        idle=idle * 0.1)])
    assert a.label == label and a.verdict().value is None  # the input's share itself is not measured
    assert any("device timeline decides" in lim for lim in a.limits)


def test_compute_is_the_measured_share_never_one_minus_the_input():
    # input 5%, the device computes 40% and is idle 55%: not "device-bound, computes 95%"
    a = analyze([_trace(data=0.005, h2d=0.0, step=0.100, compute=0.040, idle=0.055)])
    assert a.label == HOST_BOUND and a.bottleneck.compute_fraction == pytest.approx(0.40, abs=0.01)
    assert "idle for 55%" in a.verdict().reason and "95%" not in a.verdict().reason
    assert a.bottleneck.next_notebooks[0] == "09"  # a larger batch amortizes the host's launches


def _ranks_with_a_late_one(late: int, *, ranks=(0, 1, 2, 3), world=4):
    """Ranks whose own work is equal; at each of 3 collectives per step every rank waits 20 ms for ``late``,
    which waits 1 ms; the waiting ranks' exposed communication is 20% of their step."""
    out = []
    for r in ranks:
        wait = 0.001 if r == late else 0.020
        coll = [(i, "ncclDevKernel_AllReduce", wait + 0.001 * (r % 2)) for i in range(8) for _ in range(3)]
        out.append(_trace(data=0.005, h2d=0.001, step=0.100, compute=0.060, idle=0.01,
                          comm_exposed=0.020 if r != late else 0.002, rank=r, world=world,
                          name=f"rank{r}.json", collectives=coll))
    return out


def test_the_rank_that_arrives_last_is_the_straggler_and_the_waiters_are_not_slow():
    a = analyze(_ranks_with_a_late_one(2))
    assert a.arrival.straggler == "rank 2" and a.job.label == "rank 2"
    assert a.arrival.last_counts["rank 2"] == a.arrival.late == 24
    assert set(a.arrival.waits_s) == {"rank 0", "rank 1", "rank 3"}
    assert all(w == pytest.approx(0.019, abs=0.0015) for w in a.arrival.waits_s.values())
    sentence = a.slow_rank_sentence()
    assert "rank 2 arrives last" in sentence and "wait for it" in sentence
    assert a.evidence.startswith("all 4 ranks") and not a.withheld and a.label != "inconclusive"


def test_missing_ranks_withhold_a_lever_the_evidence_does_not_support():
    a = analyze(_ranks_with_a_late_one(3, ranks=(0, 1)))  # rank 3, the late one, has no trace
    assert a.missing_ranks == 2 and a.label == "inconclusive"
    v = a.verdict()
    assert "2 of 4 ranks" in v.reason and "may be the slow one" in v.reason
    assert "may be one of the 2 without a trace" in v.reason
    assert "profile every rank" in a.next_text()
    assert v.extra["withheld"] and v.extra["world_size"] == 4 and v.extra["ranks_present"] == 2


def test_a_lone_rank_of_a_multi_rank_job_says_so():
    a = analyze([_trace(data=0.002, h2d=0.001, compute=0.060, comm_exposed=0.030, idle=0.005, rank=0, world=2)])
    assert a.label == "inconclusive" and "one rank (rank 0) of a 2-rank job" in a.verdict().reason
    from helpers.traces.cluster import check
    (warning,) = check([_trace(rank=0, world=2)])
    assert "only rank 0 of the 2 ranks" in warning


def test_too_few_steps_lead_the_headline():
    a = analyze([_trace(n=2)])
    assert a.headline().split(": ", 1)[1].startswith("only 2 steps recorded")


def test_partly_annotated_steps_are_said_and_the_rest_measured():
    t = _trace(data=0.040, h2d=None, step=0.100, n=4)
    t = RankTrace(source=t.source, format=t.format, device_kind="cuda",
                  steps=t.steps + (StepPhases(9, 0.1, data=None),))
    a = analyze([t])
    assert a.job.exposed_steps == 4 and a.label == HOST_BOUND
    assert any("1 of 5 steps have no data-loading annotation" in lim for lim in a.limits)
    assert any("no host-to-device copy is measured" in lim for lim in a.limits)


def test_the_readers_limits_are_merged_once_each():
    lim = "a CPU-only trace records no device idle time"
    a = analyze([_trace(rank=0, limits=(lim,)), _trace(rank=1, limits=(lim,))])
    assert a.limits.count(lim) == 1


def test_many_ranks_job_verdict_is_the_slowest_ranks_and_the_stragglers_rule_is_called(monkeypatch):
    ranks = [_trace(data=0.005, step=0.100, rank=r, node="node-a" if r < 2 else "node-b", name=f"r{r}.json")
             for r in range(4)]
    ranks[3] = _trace(data=0.060, h2d=0.005, step=0.150, rank=3, node="node-b", name="r3.json")
    seen = []

    class Finding:
        def sentence(self):
            return "rank 3 (node-b) is slow: its data phase is 12x the others' median"

        def as_dict(self):
            return {"slow_ranks": [3], "node": "node-b", "phase": "data"}

    monkeypatch.setattr(analysis.stragglers, "find", lambda traces: seen.append(list(traces)) or Finding())
    a = analyze(ranks)
    assert seen == [ranks]
    assert a.job.rank == 3 and a.label == HOST_BOUND  # the other ranks alone would be device-bound
    assert [r.label_text for r in a.ranks] == [DEVICE_BOUND] * 3 + [HOST_BOUND]
    v = a.verdict()
    # no rank named by the rule (the stub has no primary) and no communication measured: the longest step's rank,
    # never called the pace-setter
    assert "longest median step" in v.reason and "synchronous" in v.reason and "rank 3 (node-b)" in v.reason
    assert "slowest rank" not in v.reason and "steps at the pace" not in v.reason
    assert v.extra["stragglers"] == {"slow_ranks": [3], "node": "node-b", "phase": "data"}
    assert a.slow_rank_sentence().startswith("rank 3 (node-b) is slow")
    assert v.extra["bounding_rank"] == "rank 3 (node-b)" and len(v.extra["ranks"]) == 4


def test_in_ddp_the_jobs_verdict_is_the_slow_ranks_not_the_longest_step():
    """Synchronous DDP: every rank's step is as long; the fast ranks wait in the allreduce (device-bound by their own
    trace), the slow rank waits for its loader. The job is host-bound because of the slow rank."""
    ranks = [_trace(data=0.004, h2d=None, step=0.100 + 0.001 * r, comm_exposed=0.055, compute=0.040, rank=r,
                    name=f"r{r}.json") for r in (0, 1, 3)]
    ranks.insert(2, _trace(data=0.060, h2d=None, step=0.100, comm_exposed=0.002, compute=0.040, rank=2,
                           name="r2.json"))
    a = analyze(ranks)
    assert a.stragglers.ranks == (2,) and a.stragglers.phase == "data"
    assert a.job.rank == 2 and a.label == HOST_BOUND  # not rank 3, whose step is the longest by a millisecond
    # the fast ranks' own steps are their wait in the collectives, not their computation
    assert [r.label_text for r in a.ranks] == [COMM_BOUND, COMM_BOUND, HOST_BOUND, COMM_BOUND]
    assert "the slow rank" in a.verdict().reason and "waiting for it" in a.verdict().reason


def _one_step_ranks(last_at: dict[int, int]) -> list[RankTrace]:
    """8 ranks of 1 step: rank 1's step is the longest (it waits most: 60 ms of exposed communication); 3 matched
    allreduces, each 20 ms late, rank ``last_at[k]`` arriving last at the k-th (the shortest duration)."""
    ranks = []
    for r in range(8):
        coll = [(0, "ncclDevKernel_AllReduce", 0.005 if last_at[k] == r else 0.025) for k in range(3)]
        step, wait = (0.160, 0.060) if r == 1 else (0.150, 0.050 - 0.004 * (r == 7))
        ranks.append(_trace(data=0.002, h2d=None, step=step, n=1, rank=r, compute=0.080, comm_exposed=wait,
                            idle=0.010, collectives=coll, world=8, name=f"r{r}.json"))
    return ranks


def test_the_longest_step_is_not_called_the_pace_setter_and_arrival_points_with_its_odds():
    a = analyze(_one_step_ranks({0: 7, 1: 7, 2: 3}))
    assert a.arrival.straggler is None and a.arrival.pointed()[:2] == ("rank 7", 2)
    assert a.job.rank == 7  # the rank the arrivals point to, not rank 1 whose step is the longest
    head = a.headline()
    assert "rank 1" not in head.split(":", 1)[0] and "slowest" not in head and "pace of its" not in head
    odds = a.arrival.pointed()[2]
    assert "rank 7's, the rank the collectives point to" in head and "2 of 3 late collectives" in head
    assert f"{odds:.0%} of the time" in head and 0.01 < odds < 1


def test_without_a_pointed_rank_the_rank_that_waits_least_is_read_and_the_longest_step_called_the_waiting_one():
    a = analyze(_one_step_ranks({0: 7, 1: 3, 2: 5}))  # each late collective has another last rank
    assert a.arrival.straggler is None and a.arrival.pointed() is None
    assert a.job.rank == 7  # 4.6 ms less exposed communication than the others
    reason = a.verdict().reason
    assert "waits least in communication" in reason and "rank 1, 160 ms) is the one that waits most" in reason
    assert "slowest rank" not in reason


def test_the_stragglers_rule_runs_on_real_ranks():
    ranks = [_trace(data=0.005, step=0.100, rank=r, name=f"r{r}.json") for r in range(3)]
    ranks.append(_trace(data=0.060, step=0.200, rank=3, name="r3.json"))
    a = analyze(ranks)
    assert a.stragglers is not None and "3" in a.slow_rank_sentence()
    json.dumps(a.as_dict())  # JSON types throughout


def test_a_single_trace_calls_no_stragglers_rule(monkeypatch):
    monkeypatch.setattr(analysis.stragglers, "find", lambda traces: pytest.fail("called for one rank"))
    assert analyze([_trace()]).stragglers is None


def test_slowest_rank_without_data_annotation_makes_the_job_inconclusive():
    a = analyze([_trace(rank=0, step=0.1), _trace(data=None, h2d=None, rank=1, step=0.2)])
    assert a.label == "inconclusive" and any("rank 1, has no data-loading annotation" in lim for lim in a.limits)


def test_exposed_communication_is_named_as_a_lever():
    a = analyze([_trace(data=0.002, h2d=None, step=0.100, compute=0.070, comm_exposed=0.025)])
    assert "notebook 08" in a.verdict().reason


@pytest.mark.parametrize("bad, match", [([], "no trace given"), (["x.json"], "not a RankTrace")])
def test_bad_traces_argument_is_refused(bad, match):
    with pytest.raises(ParameterError, match=match):
        analyze(bad)


@pytest.mark.parametrize("threshold", [-0.1, 1.5, float("nan"), True])
def test_bad_threshold_is_refused(threshold):
    with pytest.raises(ParameterError, match="threshold"):
        analyze([_trace()], threshold=threshold)


def test_threshold_moves_the_verdict():
    assert analyze([_trace(data=0.15, h2d=0.0, step=1.0)], threshold=0.10).label == BALANCED
    assert analyze([_trace(data=0.15, h2d=0.0, step=1.0)], threshold=0.20).label == DEVICE_BOUND


def test_a_trace_without_steps_names_its_file():
    t = RankTrace(source=Path("/x/empty.json"), format="kineto", device_kind="cuda", steps=())
    with pytest.raises(TraceError, match="empty.json.*no annotated training step"):
        analyze([t])


def test_records_carry_the_traces_provenance():
    ops = ({"name": "aten::conv2d", "calls": 16, "self_ms": 120.0, "where": "device"},)
    recs = analyze([_trace(rank=0, name="r0.json", top_ops=ops), _trace(rank=1, name="r1.json")]).records()
    v = recs[0]
    assert (v.notebook, v.experiment, v.recommendation) == ("01_baseline_profiling", "verdict", HOST_BOUND)
    assert [t["path"] for t in v.extra["trace"]] == ["/traces/r0.json", "/traces/r1.json"]
    assert v.parameters["host_bound_threshold"] == 0.10 and v.parameters["traces"][0] == "/traces/r0.json"
    phases = [r for r in recs if r.experiment == "trace_phases"]
    assert {(r.variant, r.metric) for r in phases} >= {("rank 0", "data"), ("rank 1", "step_s")}
    assert all(r.extra["trace"]["path"] == f"/traces/r{r.extra['rank']}.json" for r in phases)
    exposed = [r for r in recs if r.experiment == "trace_exposed_input"]
    assert [r.value for r in exposed] == pytest.approx([0.45, 0.45])
    (op,) = [r for r in recs if r.experiment == "trace_top_ops"]
    assert op.variant == "aten::conv2d" and op.value == pytest.approx(0.120) and op.extra["calls"] == 16


# --------------------------------------------------------------------------- the report


def _ranks():
    ops = ({"name": "aten::convolution_backward", "calls": 16, "self_ms": 210.0, "where": "device"},
           {"name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", "calls": 8, "self_ms": 380.0,
            "where": "host"})
    return [_trace(data=0.004, step=0.100, rank=0, node="node-a", name="r0.json", compute=0.090, idle=0.006),
            _trace(data=0.060, step=0.160, rank=1, node="<b>node-b</b>", name="r1.json", compute=0.090,
                   idle=0.065, top_ops=ops, limits=("the trace records no memory events",))]


def test_report_files_verdict_first_then_ranks_operators_limits_provenance(tmp_path):
    from helpers.results import Record
    from helpers.workbook.trace_report import write_trace_report

    a = analyze(_ranks())
    rep = write_trace_report(a, tmp_path / "out")
    page = rep.html.read_text()
    order = [page.index(k) for k in ("id='verdict'", "<b>Next:</b>", "<b>Slow ranks:</b>", "id='ranks'",
                                     "data:image/png;base64,", "id='slow-ranks'", "id='operators'", "id='limits'",
                                     "id='provenance'")]
    assert order == sorted(order)
    verdict = page[page.index("id='verdict'"):page.index("</p>", page.index("id='verdict'"))]
    why = page[page.index("<ul class='why'>"):page.index("</ul>", page.index("<ul class='why'>"))]
    assert "HOST-BOUND" in verdict and len(verdict.split(">", 1)[1]) <= 120  # the headline; the reason follows
    assert "rank 1" in why and why.count("<li>") >= 2
    assert "notebook 03" in page[page.index("<b>Next:</b>"):page.index("id='ranks'")]
    assert "<b>node-b</b>" not in page and "&lt;b&gt;node-b&lt;/b&gt;" in page  # a node name is text, not markup
    assert "aten::convolution_backward" in page and "the trace records no memory events" in page
    assert "/traces/r1.json" in page and "<script" not in page
    md = rep.markdown.read_text()
    assert md.startswith("# Training-performance workbook: trace report\n\n**Verdict: HOST-BOUND")
    assert md.index("- Next:") < md.index("## Ranks") < md.index("## Top operators") < md.index("## Provenance")
    assert "](figures/trace__rank_phases.png)" in md and rep.figure.read_bytes().startswith(b"\x89PNG")
    rows = [Record.from_dict(json.loads(line)) for line in rep.results.read_text().splitlines()]
    assert rows[0].experiment == "verdict" and rows[0].recommendation == HOST_BOUND
    assert [t["path"] for t in rows[0].extra["trace"]] == ["/traces/r0.json", "/traces/r1.json"]
    assert all("trace" in r.extra for r in rows)
    assert not list(rep.folder.glob(".*.tmp"))


def test_report_of_an_unmeasurable_trace_says_so_first(tmp_path):
    from helpers.workbook.trace_report import write_trace_report

    rep = write_trace_report(analyze([_trace(data=None, h2d=None, compute=0.05)]), tmp_path / "r")
    page = rep.html.read_text()
    verdict = page[page.index("id='verdict'"):page.index("</ul>", page.index("id='verdict'"))]  # headline + why
    assert "INCONCLUSIVE" in verdict and "cannot be told" in verdict
    assert "host-bound" not in verdict and "device-bound" not in verdict


def test_default_folder_is_a_new_trace_folder_under_runs(tmp_path, monkeypatch):
    import datetime as dt

    from helpers.workbook.trace_report import default_out_dir

    monkeypatch.setenv("WORKBOOK_RUNS_DIR", str(tmp_path))
    now = dt.datetime(2025, 1, 31, 12, 0, 0, tzinfo=dt.timezone.utc)
    assert default_out_dir(now) == tmp_path / "trace-20250131-120000Z"
    (tmp_path / "trace-20250131-120000Z").mkdir()
    assert default_out_dir(now) == tmp_path / "trace-20250131-120000Z-2"


def test_a_run_folder_is_not_overwritten(tmp_path):
    from helpers.errors import OutputDirError
    from helpers.workbook.trace_report import write_trace_report

    (tmp_path / "run.json").write_text("{}")
    (tmp_path / "results.jsonl").write_text("kept\n")
    with pytest.raises(OutputDirError, match="run folder"):
        write_trace_report(analyze([_trace()]), tmp_path)
    assert (tmp_path / "results.jsonl").read_text() == "kept\n" and sorted(p.name for p in tmp_path.iterdir()) == [
        "results.jsonl", "run.json"]


# --------------------------------------------------------------------------- the command line


@pytest.fixture
def fake_read(monkeypatch):
    """``helpers.traces.read`` returning the given traces (or raising), recording what it was called with."""
    import helpers.traces

    calls = []

    def install(result):
        def read(paths, *, progress=None):
            calls.append(list(paths))
            if isinstance(result, Exception):
                raise result
            if progress is not None:
                progress(10, 10)
            return result
        monkeypatch.setattr(helpers.traces, "read", read, raising=False)
        return calls
    return install


def test_cli_prints_verdict_ranks_slow_ranks_next_and_report(tmp_path, fake_read, capsys):
    from helpers.workbook.cli import main

    calls = fake_read(_ranks())
    assert main(["trace", "a.json", "b.json", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert calls == [[Path("a.json"), Path("b.json")]]
    lines = out.splitlines()
    assert lines[0].startswith("HOST-BOUND: ") and len(lines[0]) <= 120  # the headline; the reason, a clause a line
    why = lines[1:lines.index(next(line for line in lines if line.startswith("Next: ")))]
    assert why and all(line.startswith("  - ") for line in why)
    assert why[0] == "  - 2 of 4 ranks (8 steps each): the verdict covers these;"
    assert any("the job's verdict is rank 1" in line for line in why)
    assert lines[len(why) + 1].startswith("Next: notebook 03")
    assert any(line.startswith("rank 1 (<b>node-b</b>) *") for line in lines)
    assert "Slow ranks:" in out and f"Report: {tmp_path / 'o' / 'report.html'}" in out
    assert (tmp_path / "o" / "report.md").is_file()


def test_cli_json_and_threshold(tmp_path, fake_read, capsys):
    from helpers.workbook.cli import main

    fake_read([_trace(data=0.015, h2d=0.0)])
    assert main(["trace", "t.json", "--json", "--threshold", "0.2", "--out", str(tmp_path / "j")]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["verdict"] == DEVICE_BOUND and d["threshold"] == 0.2 and d["exposed_fraction"] == pytest.approx(0.15)
    assert d["report"]["html"] == str(tmp_path / "j" / "report.html") and d["ranks"][0]["steps"] == 8


@pytest.mark.parametrize("error, argv", [
    (TraceError("/x/t.json: not a Chrome trace (no traceEvents); pass a torch.profiler export"), []),
    (None, ["--threshold", "1.5"]),
])
def test_cli_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, fake_read, capsys, error, argv):
    from helpers.workbook.cli import main

    fake_read(error if error is not None else [_trace()])
    out = tmp_path / "never"
    assert main(["trace", "t.json", "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1
    assert ("no traceEvents" in err) if error is not None else ("threshold" in err)
    assert not out.exists()


def test_cli_full_disk_exits_1_and_leaves_the_old_report(tmp_path, fake_read, capsys, monkeypatch):
    import errno

    from helpers.workbook import trace_report
    from helpers.workbook.cli import main

    fake_read([_trace()])
    (tmp_path / "report.html").write_text("old")

    def full(path, data, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(trace_report, "write_atomic", full)
    assert main(["trace", "t.json", "--out", str(tmp_path)]) == 1
    assert "No space left on device" in capsys.readouterr().err
    assert (tmp_path / "report.html").read_text() == "old"


def test_two_traces_of_the_same_rank_are_refused():
    with pytest.raises(TraceError, match="r0.json, /traces/r0b.json are all 'rank 0'"):
        analyze([_trace(rank=0, name="r0.json"), _trace(rank=0, name="r0b.json")])


# --------------------------------------------------------------------------- a real torch.profiler trace

#: A single process training a tiny MLP on CPU; its dataset sleeps 30 ms per batch (on the training thread:
#: num_workers=0), so the steps wait for their input: host-bound. 4 profiled steps after 1 wait and 1 warm-up.
_TRACE_JOB = r"""
import sys, time, torch
torch.set_num_threads(1)
class Slow:
    def __len__(self): return 6
    def __getitem__(self, i):
        time.sleep(0.03)
        x = torch.randn(16, 32)
        return x, (x.sum(1, keepdim=True) > 0).float()
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = torch.utils.data.DataLoader(Slow(), batch_size=None, num_workers=0)
sched = torch.profiler.schedule(wait=1, warmup=1, active=4, repeat=1)
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=sched,
                            on_trace_ready=lambda p: p.export_chrome_trace(sys.argv[1])) as prof:
    for x, y in loader:
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.binary_cross_entropy_with_logits(model(x), y).backward()
        opt.step()
        prof.step()
"""


def _cli(*argv: str, timeout: float = 120):
    import os
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.run([sys.executable, "-m", "helpers", *argv], env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def real_trace(tmp_path_factory) -> Path:
    """A torch.profiler Chrome trace of :data:`_TRACE_JOB`, written by a child process (a few seconds)."""
    import subprocess

    pytest.importorskip("helpers.traces.kineto", reason="the Kineto reader (branch traces-kineto) is not merged")
    path = tmp_path_factory.mktemp("kineto") / "host_bound.pt.trace.json"
    done = subprocess.run([sys.executable, "-c", _TRACE_JOB, str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and path.is_file(), done.stderr[-2000:]
    return path


def test_cli_on_a_real_kineto_trace(real_trace, tmp_path):
    done = _cli("trace", str(real_trace), "--out", str(tmp_path / "rep"))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("HOST-BOUND: ") and len(lines[0]) <= 120, done.stdout
    assert lines[1].startswith("  - ") and any(line.startswith("Next: notebook 03") for line in lines), done.stdout
    assert "host_bound.pt.trace.json" in done.stdout and "a single-process run: no ranks to compare" in done.stdout
    assert {p.name for p in (tmp_path / "rep").iterdir()} == {"report.html", "report.md", "results.jsonl", "figures"}
    first = json.loads((tmp_path / "rep" / "results.jsonl").read_text().splitlines()[0])
    assert first["recommendation"] == HOST_BOUND and first["extra"]["trace"][0]["path"].endswith(real_trace.name)
    assert first["repeats"] >= 3  # the profiled steps (the schedule records 4; the reader may drop a partial one)


def test_cli_json_on_a_real_kineto_trace(real_trace, tmp_path):
    done = _cli("trace", str(real_trace), "--json", "--out", str(tmp_path / "j"))
    assert done.returncode == 0, done.stderr
    d = json.loads(done.stdout)
    assert d["verdict"] == HOST_BOUND and d["exposed_fraction"] > 1 / 3 and d["ranks"][0]["phases"]["data"]


def test_cli_on_a_file_that_is_no_trace_exits_2_and_writes_nothing(tmp_path):
    bad = tmp_path / "notes.json"
    bad.write_text('{"hello": 1}')
    done = _cli("trace", str(bad), "--out", str(tmp_path / "never"))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("error: ") and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "notes.json" in done.stderr and not (tmp_path / "never").exists()


def test_cli_on_a_missing_path_exits_2(tmp_path):
    done = _cli("trace", str(tmp_path / "nowhere.json"), "--out", str(tmp_path / "never"))
    assert done.returncode == 2 and "nowhere.json" in done.stderr and not (tmp_path / "never").exists()


def test_out_never_replaces_an_earlier_report(tmp_path):
    from helpers.workbook.trace_report import write_trace_report

    first = write_trace_report(analyze([_trace()]), tmp_path / "r")
    before = first.html.read_text()
    second = write_trace_report(analyze([_trace(data=0.001)]), tmp_path / "r")
    assert second.folder == tmp_path / "r-2" and first.html.read_text() == before


def test_a_device_job_whose_device_was_not_recorded_gets_no_label():
    t = _trace(data=0.001, h2d=None, device="cpu")
    t = RankTrace(source=t.source, format=t.format, device_kind="cpu", steps=t.steps,
                  provenance={**t.provenance, "device_not_recorded": True})
    a = analyze([t])
    assert a.label == "inconclusive" and "did not record its activity" in a.verdict().reason


def test_an_unrecorded_input_is_not_said_to_be_zero():
    a = analyze([_trace(data=None, h2d=None, compute=0.098, idle=0.001)])
    assert a.label == DEVICE_BOUND and "input not recorded" in a.headline() and "0%" not in a.headline()
    assert "the input is not recorded" in a.next_text()


def test_with_too_few_steps_no_rank_is_named_slow_by_its_work():
    ranks = [_trace(data=0.005, step=0.100, rank=r, n=2, name=f"r{r}.json") for r in range(3)]
    ranks.append(_trace(data=0.060, step=0.200, rank=3, n=2, name="r3.json"))
    a = analyze(ranks)
    assert a.stragglers is None and any("no rank is named slow" in lim for lim in a.limits)


def test_a_long_kernel_name_is_shortened_in_the_report_table_only():
    from helpers.workbook.trace_report import OP_NAME_CHARS, short_op_name

    kernel = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
              "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)")
    assert short_op_name(kernel) == "at::native::vectorized_elementwise_kernel<…>(…)"
    assert short_op_name("aten::conv2d") == "aten::conv2d"
    cut = short_op_name("k" * 300)
    assert len(cut) == OP_NAME_CHARS and cut.endswith("…")
