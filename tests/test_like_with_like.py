"""Like with like (DESIGN.md, "Measurement rules"): the two sides of every comparison ran with the same torch threads
and batch, unless that setting is the change measured, and every comparison record says what each side ran with
(:mod:`helpers.conditions`).

The unit tests check the rule on constructed records; the last test checks every comparison in the results.jsonl of
the test session's notebook runs: the smoke run of every notebook when the session makes it (tests/conftest.py's
``smoke_run``), else notebook 05 alone at the smoke profile (the notebook whose thread split once credited the
threads' gain to the overlap: tests/test_overlap.py shows this check failing on that behaviour).
"""

from __future__ import annotations

import pytest
import torch
from session_support import session_uses

from helpers.conditions import CONDITIONS, ran_with, sides, unlike, unlike_records
from helpers.errors import ParameterError
from helpers.results import Records, ResultsStore, load_results
from helpers.timing import Comparison, Measurement


def _cmp(a=(0.2, 0.21, 0.19), b=(0.1, 0.11, 0.09)):
    return Comparison.from_measurements(Measurement("A", a, warmup=0), Measurement("B", b, warmup=0))


def test_ran_with_reads_the_thread_count_when_it_is_called():
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = ran_with(8)
    finally:
        torch.set_num_threads(previous)
    assert one == {"torch_threads": 1, "batch_size": 8} and ran_with(8)["torch_threads"] == previous
    assert ran_with(None, torch_threads=3) == {"torch_threads": 3, "batch_size": None}
    assert tuple(one) == CONDITIONS


def test_two_thread_counts_in_one_comparison_fail_unless_they_are_the_change():
    alike = sides(ran_with(8, torch_threads=2), ran_with(8, torch_threads=2))
    assert alike == {"a_torch_threads": 2, "a_batch_size": 8, "b_torch_threads": 2, "b_batch_size": 8, "changes": []}
    assert unlike(alike) == []
    threads = sides(ran_with(8, torch_threads=2), ran_with(8, torch_threads=1))
    assert unlike(threads) == ["its sides ran with different torch_threads: 2 (A) and 1 (B), and torch_threads is "
                               "not the change it measures"]
    assert unlike(sides(ran_with(8, torch_threads=2), ran_with(8, torch_threads=1), changes=["torch_threads"])) == []
    batch = sides(ran_with(8, torch_threads=2), ran_with(16, torch_threads=2))
    assert len(unlike(batch)) == 1 and "batch_size" in unlike(batch)[0]
    assert unlike(sides(ran_with(8, torch_threads=2), ran_with(16, torch_threads=2), changes=["batch_size"])) == []
    # the batch being the change does not excuse the threads
    both = sides(ran_with(8, torch_threads=2), ran_with(16, torch_threads=1), changes=["batch_size"])
    assert len(unlike(both)) == 1 and "torch_threads" in unlike(both)[0]
    # a side that does not say is no comparison to trust
    assert unlike(sides(ran_with(8), None)) == ["does not say the torch_threads each side ran with",
                                                "does not say the batch_size each side ran with"]
    with pytest.raises(ParameterError, match="seed"):
        sides(ran_with(8), ran_with(8), changes=["seed"])


def test_the_check_reads_every_comparison_a_store_wrote(tmp_path):
    store = ResultsStore(tmp_path / "results.jsonl", notebook="99_test")
    out = Records()
    out.add("step time", "A", "time_per_step", 0.1, "s", **ran_with(8))  # no comparison: not checked
    out.add_comparison("alike", _cmp(), **sides(ran_with(8, torch_threads=2), ran_with(8, torch_threads=2)))
    out.add_comparison("threads", _cmp(), **sides(ran_with(8, torch_threads=2), ran_with(8, torch_threads=1)))
    out.add_comparison("silent", _cmp())
    written = store.write(out)
    problems = unlike_records(written)
    assert problems == unlike_records(load_results(tmp_path / "results.jsonl").to_dict("records"))
    assert len(problems) == 3
    assert problems[0].startswith("99_test / threads / B vs A: its sides ran with different torch_threads: 2 (A)")
    assert all(p.startswith("99_test / silent / B vs A: does not say") for p in problems[1:])


@pytest.fixture(scope="module")
def notebook_runs(request, tmp_path_factory):
    """``(run_dir, state)``: the session's smoke run of every notebook when it makes one, else notebook 05 alone at
    the smoke profile (about a minute on 2 quiet cores)."""
    if session_uses(request, "smoke_run"):
        return request.getfixturevalue("smoke_run")
    from helpers.workbook.runner import RunOptions, run

    out = tmp_path_factory.mktemp("like") / "run"
    return run(RunOptions(profile="smoke", device="cpu", only=("05",), out=out, timeout_s=900), echo=print)


@pytest.mark.notebook
def test_every_comparison_of_the_notebook_runs_ran_like_with_like(notebook_runs):
    """Each comparison record of the runs states the torch threads and batch of both sides, and they are the same
    unless the record names that setting as its change (notebook 09's batch-size search, 05's thread split)."""
    run_dir, state = notebook_runs
    assert state.status == "ok", {n.id: n.error for n in state.notebooks if n.status != "ok"}
    records = load_results(run_dir / "results.jsonl").to_dict("records")
    compared = [r for r in records if isinstance(r["extra"], dict) and "a_torch_threads" in r["extra"]]
    assert {r["notebook"] for r in compared} >= {n.id for n in state.notebooks if n.id.startswith("05")}
    problems = unlike_records(records)
    assert not problems, "\n".join(problems)
