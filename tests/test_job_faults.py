"""The user's job's faults as verdicts or one-line errors that name the cause, never a workbook traceback.

The jobs are in tests/fault_jobs.py, loaded by path as a user's are: a loss that turns NaN at step 3 (in every
configuration, or under bf16 only), a ``__getitem__`` that never returns for index 37, one that raises on it.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from helpers.compute.train import TimedLoop
from helpers.device import get_accelerator
from helpers.jobs.check import loss_divergence
from helpers.jobs.load import load_job
from helpers.timing import Comparison, Measurement
from session_support import session_uses

ROOT = Path(__file__).resolve().parents[1]
JOBS = Path(__file__).resolve().parent / "fault_jobs.py"


@pytest.fixture(scope="module")
def cpu():
    return get_accelerator("cpu")


# ---------------------------------------------------------------- the two hangs that run in the background

#: The arguments of the diagnose command that hangs in item 37 (its --timeout 60 s is what the test waits for: at a
#: load of 8 on 2 cores, importing torch alone took over 20 s, and the stack then showed the import, not item 37).
DIAGNOSE_HANG = ["-m", "helpers", "diagnose", "--job", f"{JOBS}:make_hang_job", "--device", "cpu", "--steps", "4",
                 "--warmup-steps", "1", "--timeout", "60"]


def _run_hang(out: Path) -> list[str]:
    """The arguments of the runner's command line on notebook 01 with the job that hangs in item 37, each cell
    limited to 20 s (the limit is what the test waits for), into the run folder ``out``."""
    return ["-m", "helpers", "run", "--profile", "smoke", "--device", "cpu", "--only", "01", "--job",
            f"{JOBS}:make_hang_job", "--timeout", "20", "--out", str(out)]


@pytest.fixture(scope="module")
def hangs(tmp_path_factory):
    """Three of this file's hangs, started together and left to wait out their timeouts while the file's other tests
    run (a hang waits on the clock, not on a core): ``diagnose`` on the job that hangs in item 37 (a process), the
    runner's command line on notebook 01 with that job (a process, its run folder ``run_dir``) and the runner's
    first-step check of the job that hangs in item 16 (its child process, driven from a thread). Yields
    ``{"diagnose": Popen, "run": Popen, "run_dir": Path, "first_step": Future of check_job}``; whatever still runs
    at the end of the file is killed."""
    from helpers.workbook.preflight import check_job

    run_dir = tmp_path_factory.mktemp("cell-timeout") / "run"
    procs = {name: subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, cwd=ROOT)
             for name, args in (("diagnose", DIAGNOSE_HANG), ("run", _run_hang(run_dir)))}
    with ThreadPoolExecutor(max_workers=1) as pool:
        first_step = pool.submit(check_job, f"{JOBS}:make_hang_job", {"hang": 16}, device="cpu", timeout_s=75)
        yield {**procs, "run_dir": run_dir, "first_step": first_step}
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.communicate()


@pytest.fixture(scope="module", autouse=True)
def _hangs_start_with_the_file(request):
    """Starts :func:`hangs` with this file's first test when a test that reads it is selected, so that the waits
    overlap the other tests instead of following them."""
    if session_uses(request, "hangs"):
        request.getfixturevalue("hangs")


def _cmp(a_ms, b_ms):
    return Comparison.from_measurements(Measurement("fp32", tuple(t / 1e3 for t in a_ms), 0, 8),
                                        Measurement("bf16", tuple(t / 1e3 for t in b_ms), 0, 8))


# ---------------------------------------------------------------- a loss that turns NaN


def test_the_timed_loop_keeps_the_first_nonfinite_loss_across_its_warmup():
    losses = iter([1.0, 0.5, float("nan"), float("inf"), 0.1, 0.1])
    loop = TimedLoop(iter(range(100)), lambda b: b, lambda b: {"loss": torch.tensor(next(losses)),
                                                              "reward": torch.tensor(float("nan"))}, lambda: None)
    loop.run(2, measured=False).discard()
    assert loop.nonfinite is None  # a non-finite statistic that is not a loss is not a divergence
    loop.run(4)
    assert loop.nonfinite == (3, "loss", pytest.approx(float("nan"), nan_ok=True)) and loop.steps_run == 6
    assert math.isnan(loop.nonfinite[2])


def test_a_divergence_says_where_and_whether_the_baseline_diverges_too():
    both = loss_divergence({"fp32": [2.0, 1.0, float("nan")], "bf16 autocast": [2.0, float("inf"), 1.0]},
                           baseline="fp32")
    assert both.diverged and both.baseline_diverged
    text = both.sentence()
    assert text.startswith("your job diverges: its loss is nan at step 3 in fp32 too")
    assert "loss inf at step 2 in bf16 autocast" in text and "no optimization is to blame" in text
    only = loss_divergence({"fp32": [2.0, 1.0, 0.5], "bf16 autocast": [2.0, 1.0, float("nan")]}, baseline="fp32")
    assert only.diverged and not only.baseline_diverged
    assert only.sentence() == ("your job diverges only in bf16 autocast: loss nan at step 3 in bf16 autocast, while "
                               "fp32 stays finite over its 3 steps")
    assert json.loads(json.dumps(only.as_dict()))["first"]["bf16 autocast"] == {"step": 3, "stat": "loss",
                                                                               "value": "nan"}
    fine = loss_divergence({"fp32": [1.0, 0.5]}, baseline="fp32")
    assert not fine.diverged and not fine.baseline_diverged


def test_three_runs_of_a_diverging_job_give_no_verdict(cpu):
    from helpers.experiments.three_run import three_run

    job = load_job(f"{JOBS}:make_nan_job")
    r = three_run(job, cpu, steps=4, warmup_steps=1, cache_batches=2)
    assert r.diverged and {v[0] for v in r.divergence.first.values()} == {3}
    lines = r.lines()
    assert lines[1].startswith("your job diverges: its loss is nan at step 3 in the real run")
    assert not any(w in "\n".join(lines) for w in ("host-bound", "device-bound", "next:"))
    out = json.loads(json.dumps(r.as_dict()))
    assert out["recommendation"] == "inconclusive" and out["divergence"]["first"]["the cached run"]["step"] == 3


def test_notebook_01s_experiment_says_the_job_diverges(cpu, tmp_path):
    """Issue 36: notebook 01 called a job whose loss is NaN from step 3 host-bound or device-bound from its
    timings. Its experiment (helpers.experiments.baseline.run, as the notebook calls it) says it diverges, in the
    words of notebooks 06 and 10 and of diagnose."""
    from types import SimpleNamespace

    from helpers.experiments import baseline

    job = load_job(f"{JOBS}:make_nan_job")
    params = {"trace_path": "", "data_dir": "", "job": f"{JOBS}:make_nan_job", "preprocess_samples": 4,
              "warmup_steps": 1, "steps": 4, "profile_steps": 0, "ceiling_steps": 3, "host_bound_threshold": 0.1}
    ctx = SimpleNamespace(params=params, acc=cpu, job=lambda: job, artifacts_dir=tmp_path, out_dir=tmp_path)
    v = baseline.run(ctx).verdict()
    assert v.recommendation == "inconclusive" and v.action is None
    assert v.reason.startswith("your job diverges: its loss is nan at step 3 in the baseline; no speed figure")
    assert not any(w in v.reason for w in ("host-bound", "balanced", "device-bound", "next:"))
    assert v.extra["divergence"]["first"]["the baseline"] == {"step": 3, "stat": "loss", "value": "nan"}
    assert v.extra["measured_recommendation"] in ("host-bound", "balanced", "device-bound")


def test_diagnose_says_the_job_diverges_and_exits_nonzero(capsys):
    from helpers.workbook.cli import main

    rc = main(["diagnose", "--job", f"{JOBS}:make_nan_job", "--device", "cpu", "--steps", "4", "--warmup-steps", "1"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "your job diverges: its loss is nan at step 3" in out and "host-bound" not in out


def test_notebook_06_verdict_when_fp32_diverges_too_and_when_only_bf16_does(cpu, tmp_path):
    from helpers.experiments import precision
    from helpers.experiments.training import loss_curve
    from helpers.jobs.base import StepOptions
    from helpers.results import ResultsStore, load_results, verdicts

    curves = {}
    for name in ("make_nan_job", "make_bf16_nan_job"):
        job = load_job(f"{JOBS}:{name}")
        curves[name] = [loss_curve(job, cpu, StepOptions(autocast_dtype=d), steps=6) for d in (None, torch.bfloat16)]
    both = precision.divergence(*curves["make_nan_job"], dtype_name="bfloat16")
    only = precision.divergence(*curves["make_bf16_nan_job"], dtype_name="bfloat16")
    assert both.first["fp32"][0] == 3 and both.first["bf16 autocast"][0] == 3
    assert only.first["fp32"] is None and only.first["bf16 autocast"][0] == 3
    cmp = _cmp([10, 11, 10, 12], [5, 5, 6, 5])  # bf16 measurably faster: must not matter
    kw = dict(loss_ok=False, rel_diff=math.inf, no_nan=False, loss_rtol=0.1, device_kind="cpu", native_bf16=True,
              context="your job's training step", loss_name="loss")
    v = precision.verdict(cmp, dtype_name="bfloat16", divergence=both, **kw)
    assert v.recommendation == "inconclusive" and v.action is None
    assert v.reason.startswith("your job diverges: its loss is nan at step 3 in fp32 too")
    w = precision.verdict(cmp, dtype_name="bfloat16", divergence=only, **kw)
    assert w.recommendation == "leave off" and "diverges only in bf16 autocast" in w.reason
    assert w.action.value is None
    store = ResultsStore(tmp_path / "results.jsonl", notebook=precision.NOTEBOOK)
    store.add_verdict(v)  # storable: no infinite value on the way
    row = verdicts(load_results(tmp_path / "results.jsonl")).iloc[0]
    assert row["extra"]["divergence"]["first"]["fp32"]["step"] == 3


def test_notebook_10_verdict_does_not_blame_the_optimizations_when_the_baseline_diverges(cpu):
    from helpers.experiments.e2e_jobs import JobConfig, JobSummary, JobVariant, run_interleaved, speedup, summarize
    from helpers.experiments.e2e_verdict import e2e_verdict
    from helpers.experiments.training import learning_check
    from helpers.jobs.check import loop_divergence

    job = load_job(f"{JOBS}:make_nan_job")
    base = JobVariant(JobConfig("baseline"), job, cpu)
    opt = JobVariant(JobConfig("optimized", ("mixed_precision",)), job, cpu)
    try:
        run_interleaved([base, opt], steps=4, warmup_steps=1)
        div = loop_divergence({"the baseline": base, "the optimized job": opt}, baseline="the baseline")
        learned = learning_check(base.steps_frame()["loss"], opt.steps_frame()["loss"], 0.1, loss_name="loss")
        v = e2e_verdict(speedup(base, opt), learned, summarize(base), opt.config,
                        host_bound_threshold=0.1, divergence=div)
    finally:
        base.close()
        opt.close()
    assert v.recommendation == "inconclusive"
    assert v.reason.startswith("your job diverges: its loss is nan at step 3 in the baseline too")
    assert "no optimization is to blame" in v.reason and "did not reproduce" not in v.reason
    assert v.extra["divergence"]["baseline_diverged"] is True
    only = loss_divergence({"the baseline": [1.0, 0.5], "the optimized job": [1.0, float("nan")]},
                           baseline="the baseline")
    learned = learning_check([1.0] * 4, [1.0] * 4, 0.1)
    summary = JobSummary("baseline", "none", 0.3, 0.29, 0.31, 0.25, 0.0, 0.05, 100.0, 0.8, 0.2, None, 4)
    w = e2e_verdict(_cmp([300, 310, 290, 305], [100, 101, 99, 102]), learned, summary,
                    JobConfig("opt", ("mixed_precision",)), host_bound_threshold=0.1, divergence=only)
    assert w.recommendation == "leave off" and "diverges only in the optimized job" in w.reason


# ---------------------------------------------------------------- a hang


def _stuck_here(event):  # a frame of "the user's" code (this file is not the workbook's)
    while not event.is_set():
        time.sleep(0.01)


def test_a_watchdog_dumps_the_stacks_and_names_the_users_frame_with_its_arguments(tmp_path):
    from helpers.stuck import Watchdog, where_from_dump

    seen, done = [], threading.Event()
    release = threading.Event()

    def fired(sentence, stacks):
        seen.append(sentence)
        done.set()

    def worker():
        with open(tmp_path / "stacks.txt", "w") as dump:
            Watchdog(0.3, fired, dump=dump, backstop_s=None).start()
            _stuck_here(release)

    t = threading.Thread(target=worker)
    t.start()
    assert done.wait(30)
    release.set()
    t.join(30)
    assert seen[0].startswith("stuck in _stuck_here(<threading.Event") and "at test_job_faults.py:" in seen[0]
    dumped = (tmp_path / "stacks.txt").read_text()
    assert "_stuck_here" in dumped and "Thread 0x" in dumped
    assert where_from_dump(dumped).startswith("stuck in _stuck_here at test_job_faults.py:")


@pytest.mark.skipif("fork" not in __import__("multiprocessing").get_all_start_methods(), reason="needs fork")
def test_a_watchdog_names_the_hung_dataloader_worker_and_its_sample(tmp_path):
    """Issue 36: a loop stuck waiting for a DataLoader worker (diagnose, a notebook's cell) was said to wait for "a
    worker". The workbook's loader (make_loader) records what each worker loads; the watchdog names it. The loop
    runs as the workbook's does, with no frame of the user's on the stack (its driver is compiled as "<loop>")."""
    from fault_jobs import Squares

    from helpers.pipeline.guarded import run_epoch
    from helpers.pipeline.loader import LoaderConfig, make_loader
    from helpers.stuck import Watchdog, describe

    loader = make_loader(Squares(16, hang=5), LoaderConfig(batch_size=2, num_workers=1, timeout_s=5.0,
                                                           shuffle=False))
    seen, errors = [], []
    ns: dict = {}
    exec(compile("def loop(start, run, loader, errors):\n    start()\n    try:\n        run(loader)\n"
                 "    except Exception as exc:\n        errors.append(exc)\n", "<loop>", "exec"), ns)
    with open(tmp_path / "stacks.txt", "w") as dump:
        dog = Watchdog(2.0, lambda sentence, stacks: seen.append(sentence), dump=dump, backstop_s=None)
        t = threading.Thread(target=ns["loop"], args=(dog.start, run_epoch, loader, errors))
        t.start()
        t.join(60)  # the loader's own timeout (5 s) ends the loop, its workers stopped
    assert not t.is_alive() and errors and seen, (seen, errors)
    pid = loader.worker_init_fn.rows()[0].pid
    assert seen[0].startswith("stuck waiting for a DataLoader worker's batch (at "), seen[0]
    assert f"): worker 0 (pid {pid}), whose batch the loop waits for, has been in __getitem__(index 5) for " in seen[0]
    # where nothing records the workers: said plainly
    from torch.utils.data import dataloader

    from helpers.stuck import FrameInfo

    assert "which worker is stuck and in which sample is not known" in describe([[
        FrameInfo(dataloader.__file__, 1, "_get_data")]])


def test_a_cancelled_watchdog_stays_silent():
    from helpers.stuck import Watchdog

    fired = []
    dog = Watchdog(0.2, lambda *a: fired.append(a), backstop_s=None).start()
    dog.cancel()
    time.sleep(0.4)
    assert not fired and not dog.fired


def test_the_cell_watchdog_leaves_where_the_kernel_was_stuck(tmp_path):
    from helpers.stuck import CELL_TIMEOUT_ENV, STUCK_DIR_ENV, STUCK_NAME_ENV, arm_cell_watchdog, read_stuck

    class Events:
        def __init__(self):
            self.hooks = {}

        def register(self, name, fn):
            self.hooks[name] = fn

    class Shell:
        events = Events()

    shell = Shell()
    env = {CELL_TIMEOUT_ENV: "1", STUCK_DIR_ENV: str(tmp_path), STUCK_NAME_ENV: "03_dataloader_tuning"}
    assert arm_cell_watchdog(shell, env)
    shell.events.hooks["pre_run_cell"](None)  # a cell starts; it hangs past 0.8 s (the limit less a fifth)
    release = threading.Event()
    threading.Timer(3.0, release.set).start()
    _stuck_here(release)
    shell.events.hooks["post_run_cell"](None)
    where = read_stuck(tmp_path, "03_dataloader_tuning")
    assert where is not None and where.startswith("stuck in _stuck_here(") and "test_job_faults.py:" in where
    assert "_stuck_here" in (tmp_path / "03_dataloader_tuning.stacks.txt").read_text()


def test_a_cell_timeout_says_where_it_was_stuck_and_reads_the_cell_as_text(tmp_path):
    from helpers.workbook.nbexec import error_info

    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "03_dataloader_tuning.stuck.json").write_text(
        json.dumps({"where": "stuck in Squares.__getitem__(37) at fault_jobs.py:34"}))
    lines = [f"x{i} = {i}" for i in range(12)]
    src = f"{lines[:5]}\n...\n{lines[-5:]}"  # nbclient's preview of a cell of 11 lines or more: a Python list

    class CellTimeoutError(Exception):
        pass

    exc = CellTimeoutError("A cell timed out while it was being executed, after 20 seconds.\nThe message was: Cell "
                           f"execution timed out.\nHere is a preview of the cell contents:\n-------------------\n"
                           f"{src}\n-------------------\n")
    info = error_info(exc, None, logs=tmp_path / "logs", name="03_dataloader_tuning")
    msg = info["message"]
    assert msg.startswith("the cell starting `x0 = 0` ran past the per-cell limit of 20 s, stuck in "
                          "Squares.__getitem__(37) at fault_jobs.py:34")
    assert "logs/03_dataloader_tuning.stacks.txt" in msg and "['" not in msg and info["cell_source"] == "x0 = 0"
    plain = error_info(exc, None)  # no dump: the old advice, the cell still as text
    assert "stuck" not in plain["message"] and "`x0 = 0`" in plain["message"]


# ---------------------------------------------------------------- a sample that raises


def test_diagnose_names_the_sample_that_raises_in_one_line(capsys):
    from helpers.workbook.cli import main

    rc = main(["diagnose", "--job", f"{JOBS}:make_raising_job", "--device", "cpu", "--steps", "4",
               "--warmup-steps", "1"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert err == "error: dataset[37] raised ValueError: corrupt record 37 (at fault_jobs.py:36 in __getitem__)"


def test_a_run_skips_the_notebooks_that_read_a_dataset_that_raised(tmp_path, monkeypatch):
    from papermill.exceptions import PapermillExecutionError

    from helpers.workbook import runner

    monkeypatch.setattr(runner, "check_job", lambda spec, params, device="cpu": {"name": "raising job"})
    called, lines = [], []
    cause = "dataset[37] raised ValueError: corrupt record 37 (at fault_jobs.py:36 in __getitem__)"

    def executor(nb, **kw):
        called.append(nb.id[:2])
        if nb.id.startswith("01"):
            raise PapermillExecutionError(7, 3, "steps = time_job(...)", "SampleError", cause, [])

    run_dir, state = runner.run(runner.RunOptions(profile="smoke", device="cpu", only=("00", "01", "03", "10"),
                                                  job=f"{JOBS}:make_raising_job", out=tmp_path / "run"),
                                echo=lines.append, executor=executor, device_checker=lambda kind: "cpu:test")
    assert called == ["00", "01"]  # 00 does not read the job's dataset; 03 and 10 would fail on the same sample
    by = {n.id[:2]: n for n in state.notebooks}
    assert by["00"].status == "ok" and by["01"].status == "failed" and state.status == "failed"
    for nb in ("03", "10"):
        assert by[nb].status == "skipped"
        assert by[nb].error["message"] == f"skipped: your dataset raised in notebook 01 ({cause})"
    said = [ln for ln in lines if ln.startswith("Your dataset raised")]
    assert len(said) == 1 and cause in said[0] and "(03, 10) are skipped" in said[0] and "--resume" in said[0]
    saved = json.loads((run_dir / "run.json").read_text())
    assert [n["status"] for n in saved["notebooks"]] == ["ok", "failed", "skipped", "skipped"]
    report = (run_dir / "report.md").read_text()
    assert "Skipped: your dataset raised in an earlier notebook" in report
    assert "Skipped: your dataset raised in notebook 01 (dataset[37] raised ValueError" in report
    _, again = runner.run(runner.RunOptions(resume=True, out=run_dir), echo=lambda s: None,
                          executor=lambda nb, **kw: called.append(nb.id[:2]), device_checker=lambda kind: "cpu:test")
    assert called[2:] == ["01", "03", "10"] and again.status == "ok"  # fixed: --resume runs what was skipped


# ---------------------------------------------------------------- the notebooks, run as a user runs them


@pytest.mark.slow
@pytest.mark.notebook
def test_notebooks_01_06_and_10_say_the_job_diverges(tmp_path, monkeypatch):
    from helpers.results import load_results, verdicts
    from helpers.workbook.runner import RunOptions, run

    monkeypatch.chdir(ROOT)
    run_dir, state = run(RunOptions(profile="smoke", device="cpu", only=("01", "06", "10"),
                                    job=f"{JOBS}:make_nan_job", out=tmp_path / "run", timeout_s=600), echo=print)
    assert state.status == "ok", {n.id: n.error for n in state.notebooks if n.status != "ok"}  # no crash in 06
    table = verdicts(load_results(run_dir / "results.jsonl")).set_index("notebook")
    v = table.loc["01_baseline_profiling"]  # its timings give no label: the job no longer trains
    assert v["recommendation"] == "inconclusive"
    assert v["reason"].startswith("your job diverges: its loss is nan at step 3 in the baseline;"), v["reason"]
    for nb, base in (("06_mixed_precision", "fp32"), ("10_end_to_end", "the baseline")):
        v = table.loc[nb]
        assert v["recommendation"] == "inconclusive"  # kept on a busy machine: a NaN loss is no timing
        assert v["reason"].startswith(f"your job diverges: its loss is nan at step 3 in {base} too"), v["reason"]
        assert "no optimization is to blame" in v["reason"]
    assert "your job diverges" in (run_dir / "report.md").read_text().split("\n\n")[1]


# ---------------------------------------------------------------- the hangs started with the file (hangs), last


@pytest.mark.slow
@pytest.mark.notebook
def test_a_cell_timeout_names_the_stuck_getitem(hangs):
    from helpers.workbook.rundir import RunState

    p, run_dir = hangs["run"], hangs["run_dir"]  # _run_hang: notebook 01, cells limited to 20 s, started with the file
    stdout, stderr = p.communicate(timeout=300)
    assert p.returncode != 0, stdout[-2000:]
    nb = RunState.load(run_dir).notebooks[0]
    assert nb.status == "failed" and nb.error["type"] == "CellTimeoutError", (nb.error, stderr[-2000:])
    assert nb.error["stuck"].startswith("stuck in Squares.__getitem__(37) at fault_jobs.py:"), nb.error
    assert "stuck in Squares.__getitem__(37)" in next(ln for ln in stdout.splitlines()
                                                      if "01_baseline_profiling: failed" in ln)
    assert "Squares" not in nb.error.get("cell_source", "") and "['" not in nb.error["message"]
    assert "__getitem__" in (run_dir / "logs" / "01_baseline_profiling.stacks.txt").read_text()


@pytest.mark.slow
def test_diagnose_times_out_naming_the_stuck_getitem(hangs):
    p = hangs["diagnose"]  # DIAGNOSE_HANG, started with the file
    _, stderr = p.communicate(timeout=240)
    assert p.returncode == 1, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("error: diagnose ran past --timeout 60 s, stuck in Squares.__getitem__(37) at "
                           "fault_jobs.py:"), stderr[-3000:]
    assert "Traceback" not in stderr and 'File "' in stderr  # the stacks, not a Python traceback


@pytest.mark.slow
def test_the_runners_first_step_check_names_a_hang_in_the_first_batch(hangs):
    from helpers.errors import ParameterError

    with pytest.raises(ParameterError) as e:  # check_job(make_hang_job, hang=16, timeout_s=75), started with the file
        hangs["first_step"].result(timeout=240)
    assert "did not finish in 65 s, stuck in Squares.__getitem__(16) at fault_jobs.py:" in str(e.value)
