"""Fixtures shared by the test files: the runs of the workbook that several files read, made once per session.

A notebook executed by the runner is the slow part of ``make test``; a test that only reads what a smoke run left
(records, report, executed notebooks, figures) takes it from :func:`smoke_run` instead of running its notebooks again.
"""

from __future__ import annotations

import os

import pytest
from session_support import session_uses


def shared_run(tmp_path_factory, name: str, options):
    """``(run_dir, state)`` of the runner's run ``options(out)`` (a callable giving RunOptions for the folder
    ``out``), made once per test session. Under pytest-xdist (`make test`: two workers) it is made once for all the
    workers: the first to ask runs it holding a file lock, the others wait for the lock and read what it left
    (run.json through :meth:`helpers.workbook.rundir.RunState.load`), as pytest-xdist's guide does for session
    fixtures (https://pytest-xdist.readthedocs.io/en/stable/how-to.html#making-session-scoped-fixtures-execute-only-once)."""
    from filelock import FileLock

    from helpers.workbook.rundir import RunState
    from helpers.workbook.runner import run

    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return run(options(tmp_path_factory.mktemp(name) / "run"), echo=print)
    root = tmp_path_factory.getbasetemp().parent  # the folder of this session shared by its workers
    out, done = root / name / "run", root / f"{name}.done"
    with FileLock(str(root / f"{name}.lock")):
        if done.exists():
            return out, RunState.load(out)
        made = run(options(out), echo=print)
        done.write_text(str(made[0]))
        return made


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory):
    """Every notebook, smoke profile, on the CPU, in one run folder: ``(run_dir, state)`` as
    :func:`helpers.workbook.runner.run` returns them. Read it; never write into it (other tests read it too)."""
    from helpers.workbook.runner import RunOptions

    return shared_run(tmp_path_factory, "smoke",
                      lambda out: RunOptions(profile="smoke", device="cpu", out=out, timeout_s=600))


@pytest.fixture(scope="session")
def baseline_run(request, tmp_path_factory):
    """Notebook 01 at the smoke profile: the smoke run's own 01 when this session makes :func:`smoke_run` anyway,
    else 01 alone (about a minute on 2 quiet cores; ``pytest -m busy_safe``, as .ci/run repeats it beside busy
    loops). ``(run_dir, state)``; read notebook 01's rows by their ``notebook`` column."""
    if session_uses(request, "smoke_run"):
        return request.getfixturevalue("smoke_run")
    from helpers.workbook.runner import RunOptions

    return shared_run(tmp_path_factory, "baseline",
                      lambda out: RunOptions(profile="smoke", device="cpu", only=("01",), out=out, timeout_s=900))


#: Tests of tests/ that take seconds because they start processes (torchrun, ranks, a Python that imports torch, the
#: runner's job check) or run real measurements, and carry no marker of their own: ``make test-fast`` leaves them
#: out, ``make test`` runs them. Listed here (file::name, parameters ignored) rather than decorated in each file, so
#: that the notebook owners' edits to those files merge cleanly; a name that no longer exists selects nothing.
SECONDS_LONG = {
    "subprocess": (
        "test_bench.py::test_bench_end_to_end_refuses_a_folder_that_is_no_run",
        "test_bench.py::test_bench_rejects_unknown_benchmark",
        "test_comm_allreduce.py::test_bench_command_prints_the_json_schema",
        "test_comm_allreduce.py::test_bench_command_reports_a_failed_job_without_traceback",
        "test_comm_ddp.py::test_bucket_sizes_are_reported_and_cover_the_gradients",
        "test_comm_ddp.py::test_fp32_reference_is_exact_and_fp16_error_small",
        "test_comm_ddp.py::test_overlap_figures",
        "test_comm_ddp.py::test_a_result_records_the_sweep_ddp_and_the_env_check_in_order",  # the torchrun fixture
        "test_comm_ddp.py::test_the_check_before_timing_finds_the_buckets_the_timed_job_made",
        "test_comm_launch.py::test_two_launches_back_to_back_give_correct_sums",
        "test_comm_launch.py::test_hang_becomes_timeout_and_kills_every_process",
        "test_comm_launch.py::test_dead_peer_is_named_with_exit_code",
        "test_fast_pipeline.py::test_dataloader_workers_build_the_same_batches",
        "test_job_faults.py::test_the_cell_watchdog_leaves_where_the_kernel_was_stuck",
        "test_layers.py::test_the_command_line_and_runner_import_no_torch",
        "test_loader_guarded.py::test_a_hung_worker_becomes_an_error_within_the_timeout",
        "test_npu_probe.py::test_end_to_end_autoloaded_broken_torch_npu",
        "test_npu_probe.py::test_hanging_import_times_out",
        "test_npu_probe.py::test_imports_but_no_device_real_torch",
        "test_npu_probe.py::test_usable_real_torch",
        "test_npu_probe.py::test_missing_cann_library_real_torch",
        "test_runner.py::test_a_profiles_sizes_are_not_passed_to_a_users_job",
        "test_runner.py::test_cli_unusable_device_says_why",
        "test_runner.py::test_cli_rejects_unknown_device_and_notebook",
        "test_runner.py::test_cli_rejects_a_timeout_that_is_not_finite_before_work",
        "test_trace_kineto.py::test_bench_trace_prints_its_figures",
        "test_trace_report.py::test_cli_on_a_real_kineto_trace",
        "test_trace_report.py::test_cli_json_on_a_real_kineto_trace",
        "test_trace_report.py::test_cli_on_a_missing_path_exits_2",
        "test_trace_report.py::test_cli_on_a_file_that_is_no_trace_exits_2_and_writes_nothing",
        "test_transfer.py::test_the_mechanism_imports_no_pandas",
        "test_user_job.py::test_run_rejects_a_job_whose_first_step_fails",
        "test_user_job.py::test_run_rejects_a_broken_job_before_any_work",
    ),
    "slow": (
        "test_endtoend.py::test_jobs_start_from_the_same_weights_and_time_every_phase",
        "test_endtoend.py::test_host_side_optimizations_run_on_cpu_and_see_the_same_samples",
        "test_memory.py::test_finder_with_a_tiny_real_model_and_a_small_budget_on_cpu",
        "test_prefetch.py::test_prefetcher_keeps_no_batch_alive_after_the_step",
        "test_train.py::test_loop_times_each_phase_of_measured_steps_only",
        "test_try_b.py::test_try_overlap_returns_the_hidden_share_and_its_knobs_reach_the_loader",
        "test_try_b.py::test_try_precision_times_fp32_against_the_dtype_asked",
        "test_try_c.py::test_every_switch_off_is_an_aa_comparison",
        "test_try_c.py::test_the_switches_reach_the_optimized_job",
    ),
}


#: The files that take longest in `make test`, run first (in this order, the others after them in theirs): the
#: pytest-xdist workers then share out the many short files at the end instead of one worker finishing a long file
#: alone (the Makefile passes --no-loadscope-reorder so that pytest-xdist keeps this order). test_notebooks.py first:
#: its smoke run is shared (``shared_run``), and test_solutions.py, a few files later, then finds it made and reuses
#: it. Seconds of each file (the sum of its tests' durations), measured in one `make test` with two workers on the
#: 2-core developer machine beside other work (load average 3-8): 291, 853, 650, 427, 299, 204, 151, 141, 140, 104,
#: 87; every other file took under 65. (test_wheel.py has taken about 46 s since it stopped installing the
#: dependencies again: it stays in this list, early, as one long test.)
LONGEST_FIRST = ("test_notebooks.py", "test_user_job.py", "test_tune.py", "test_solutions.py", "test_wheel.py",
                 "test_instrument_ranks.py", "test_augmentation.py", "test_job_faults.py", "test_runner.py",
                 "test_tune_ddp.py", "test_bench.py")


def pytest_collection_modifyitems(config, items):
    """Marks the tests of :data:`SECONDS_LONG`, and the browser tests ``browser``; runs :data:`LONGEST_FIRST` first."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items[:] = sorted(items, key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file keeps its order
    marks = {name: mark for mark, names in SECONDS_LONG.items() for name in names}
    for item in items:
        if item.path.parent.name != "tests":
            continue
        key = f"{item.path.name}::{getattr(item, 'originalname', item.name)}"
        if key in marks:
            item.add_marker(getattr(pytest.mark, marks[key]))
        if item.path.name == "test_lab_browser.py" or key == "test_report_browser.py::test_report_renders_in_chromium":
            item.add_marker(pytest.mark.browser)
