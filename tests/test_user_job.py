"""A user's own job: loaded from a file with their errors shown as theirs, adapted in one call, diagnosed."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from collections import namedtuple
from pathlib import Path

import pytest
import torch

from helpers.device import get_accelerator
from helpers.errors import DataError
from helpers.jobs.base import Job
from helpers.jobs.load import load_job
from helpers.jobs.supervised import JobError, move_to_device, supervised_job

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cpu():
    return get_accelerator("cpu")


class Squares(torch.utils.data.Dataset):
    def __init__(self, n=32, delay_s=0.0):
        self.n, self.delay_s = n, delay_s

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.delay_s:
            time.sleep(self.delay_s)  # a slow reader: the input cost does not depend on the CPU's load
        x = torch.full((4,), float(i % 5))
        return x, torch.tensor(float(i % 5) ** 2)


def _job(**kw):
    return supervised_job(kw.pop("dataset", Squares()), lambda: torch.nn.Linear(4, 1),
                          kw.pop("loss_fn", lambda out, y: torch.nn.functional.mse_loss(out.squeeze(1), y)),
                          lambda params: torch.optim.SGD(params, lr=1e-3), batch_size=kw.pop("batch_size", 8),
                          name="squares", **kw)


# ---------------------------------------------------------------- loading a job file

def _write(tmp_path, body, name="myjob.py"):
    path = tmp_path / name
    path.write_text(body)
    return path


def test_missing_file_and_module_get_clear_errors(tmp_path):
    with pytest.raises(JobError, match=r"job file .*nope\.py does not exist"):
        load_job(str(tmp_path / "nope.py") + ":make_job")
    with pytest.raises(JobError, match="is not importable"):
        load_job("no_such_package_xyz.jobs:make_job")


def test_an_import_error_shows_the_users_own_frame(tmp_path):
    path = _write(tmp_path, "import torch\n\ndef helper():\n    raise RuntimeError('my bug')\n\nhelper()\n")
    with pytest.raises(JobError) as e:
        load_job(f"{path}:make_job")
    text = str(e.value)
    assert f"job file {path} failed to import: RuntimeError: my bug" in text
    assert str(path) in text.split("\n", 1)[1] and "raise RuntimeError('my bug')" in text
    assert "helpers/jobs/load.py" not in text and "importlib" not in text


def test_missing_factory_lists_what_the_file_has(tmp_path):
    path = _write(tmp_path, "def build():\n    pass\n\nclass Thing:\n    pass\n")
    with pytest.raises(JobError, match=r"has no 'make_job'; its functions and classes: Thing, build"):
        load_job(str(path))


def test_a_factory_that_raises_or_returns_no_job(tmp_path):
    path = _write(tmp_path, "def make_job(batch_size=4):\n    raise ValueError(f'bad {batch_size}')\n\n"
                            "def wrong():\n    return 42\n")
    with pytest.raises(JobError, match=r"make_job\(batch_size\) raised ValueError: bad 16") as e:
        load_job(f"{path}:make_job", {"batch_size": 16, "unknown": 1})  # only the names it takes are passed
    assert "raise ValueError" in str(e.value)
    with pytest.raises(JobError, match=r"wrong\(\) returned a int, not a Job"):
        load_job(f"{path}:wrong")


def test_the_example_job_loads_through_its_file(tmp_path):
    job = load_job(str(ROOT / "examples" / "image_classifier.py") + ":make_job", {"batch_size": 8, "max_images": 16})
    assert isinstance(job, Job) and job.describe()["samples"] == 16 and job.workload.batch_size == 8


# ---------------------------------------------------------------- the one-call adapter

def test_nested_batches_move_to_the_device(cpu):
    @dataclasses.dataclass
    class Pair:
        a: torch.Tensor
        b: list

    Point = namedtuple("Point", "x y")
    batch = {"img": torch.ones(2, 3, 4, 4), "meta": [Point(torch.zeros(1), 3), Pair(torch.ones(1), [torch.ones(2)])],
             "name": "b0"}
    out = move_to_device(batch, cpu.device, channels_last=True)
    assert out["img"].is_contiguous(memory_format=torch.channels_last)
    assert isinstance(out["meta"][0], Point) and out["meta"][0].y == 3 and isinstance(out["meta"][1], Pair)
    assert out["name"] == "b0"
    with pytest.raises(DataError, match=r"a object at batch\['odd'\]"):
        move_to_device({"odd": object()}, cpu.device)


def test_a_bad_loss_is_named_on_the_first_step(cpu):
    from helpers.experiments.training import time_job

    vector = _job(loss_fn=lambda out, y: (out.squeeze(1) - y) ** 2)
    with pytest.raises(JobError, match=r"loss_fn returned \(8,\), not a 0-d tensor"):
        time_job(vector, cpu, steps=1, warmup_steps=0)
    nan = _job(loss_fn=lambda out, y: torch.tensor(float("nan"), requires_grad=True) + out.sum() * 0)
    with pytest.raises(JobError, match="the loss is nan on the first step"):
        time_job(nan, cpu, steps=1, warmup_steps=0)
    with pytest.raises(JobError, match="fewer than batch_size=64"):
        _job(batch_size=64)
    with pytest.raises(JobError, match="has no len"):
        _job(dataset=iter([1, 2]))


def test_the_adapter_trains(cpu):
    from helpers.experiments.training import time_job

    run = time_job(_job(), cpu, steps=6, warmup_steps=1)
    assert len(run.steps) == 6 and run.steps["loss"].notna().all()


# ---------------------------------------------------------------- the three-run test

@pytest.mark.busy_safe  # the reader sleeps: its label and ceiling hold beside busy loops
def test_three_runs_find_a_slow_reader_and_its_ceiling(cpu):
    from helpers.experiments.three_run import RUNS, three_run

    job = _job(dataset=Squares(n=64, delay_s=0.004))  # 8 samples x 4 ms of waiting per batch
    r = three_run(job, cpu, steps=6, warmup_steps=1, cache_batches=2)
    assert set(r.steps) == set(RUNS) and all(len(r.steps[k]) == 6 for k in RUNS)
    assert r.recommendation == "host-bound" and r.exposed_fraction > 0.5
    assert r.ceiling.ci_low > 1.5  # the reader's sleep is gone in the synthetic run
    assert (r.steps["synthetic"]["data"] < 1e-3).all() and (r.steps["synthetic"]["h2d"] < 1e-3).all()
    text = "\n".join(r.lines())
    assert "with free input this job would be" in text and f"next: notebook {r.bottleneck.next_notebooks[0]}" in text
    assert r.bottleneck.next_notebooks[0] in ("02", "03") and r.next_notebook in text  # the input side first
    assert "no measurable speedup" not in text
    assert json.loads(json.dumps(r.as_dict()))["free_input_speedup"]["ratio"] == pytest.approx(r.ceiling.ratio)


@pytest.mark.slow
def test_diagnose_command_on_the_example_job():
    p = subprocess.run([sys.executable, "-m", "helpers", "diagnose", "--job", "examples/image_classifier.py:make_job",
                        "--device", "cpu", "--steps", "4", "--warmup-steps", "1", "--json"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout)
    assert out["job"].startswith("image classifier") and out["measured_recommendation"] in ("host-bound",
                                                                                           "balanced", "device-bound")
    assert out["free_input_speedup"]["ratio"] > 0 and out["next_notebook"].startswith("notebook ")
    bad = subprocess.run([sys.executable, "-m", "helpers", "diagnose", "--job", "examples/nope.py:make_job"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert bad.returncode == 2 and "does not exist" in bad.stderr


# ---------------------------------------------------------------- the runner on a user's job

def test_run_rejects_a_broken_job_before_any_work(tmp_path):
    from helpers.errors import ParameterError
    from helpers.workbook.runner import RunOptions, run

    bad = tmp_path / "badjob.py"
    bad.write_text("def make_job(batch_size=8):\n    return 'not a job'\n")
    with pytest.raises(ParameterError, match=r"make_job\(\) returned a str, not a Job"):
        run(RunOptions(profile="smoke", device="cpu", job=f"{bad}:make_job", out=tmp_path / "run"),
            echo=lambda s: None, executor=lambda nb, **kw: pytest.fail("no notebook may start"),
            device_checker=lambda kind: "cpu:test")
    assert not (tmp_path / "run" / "run.json").exists()


@pytest.mark.slow
@pytest.mark.notebook
@pytest.mark.parametrize("example, name", [("image_classifier", "image classifier"),
                                           ("text_classifier", "text classifier")])
def test_the_smoke_profile_runs_on_the_example_jobs(tmp_path, monkeypatch, example, name):
    from helpers.results import load_results, verdicts
    from helpers.workbook.runner import RunOptions, run

    monkeypatch.chdir(ROOT)  # the spec is relative to where the user stands
    # 32-px photos instead of the factory's 64 (a quarter of the convolutions; nothing below depends on the size):
    # the run took 261 s instead of 306 s, the two side by side. The factory's own batch size (32) stands, so every
    # notebook still measures a size the workbook did not set (batches of 16 saved only 7 s of 121 s, quiet: the
    # run's cost is its notebooks' start and checks, not the batch); test_runner.py checks a factory's own
    # image_size.
    sizes = (("image_size", "32"),) if example == "image_classifier" else ()
    # Each job runs the notebooks whose verdict its kind of job changes, and the two together run every notebook but
    # 00 (the machine, not the job; the session's smoke run has it) on a job file: 01 and 07 on both (a convolution
    # or none); 02 (an image decode notebook) and 08 (DDP on a job file: the same code whatever the model) on the
    # photos; 03, 04, 05, 06, 09 and 10 (the user's step and loader, whatever the model) on the text. The whole
    # workbook on both took 152 s and 101 s of a 2,537-test run; 03 and 10 on the photos too, 33 s more.
    only = {"image_classifier": ("01", "02", "07", "08"),
            "text_classifier": ("01", "03", "04", "05", "06", "07", "09", "10")}[example]
    run_dir, state = run(RunOptions(profile="smoke", device="cpu", job=f"examples/{example}.py:make_job",
                                    out=tmp_path / "run", timeout_s=600, overrides=sizes, only=only), echo=print)
    assert state.status == "ok", {n.id: n.error for n in state.notebooks if n.status != "ok"}
    assert state.job == f"{ROOT / 'examples' / (example + '.py')}:make_job"
    table = verdicts(load_results(run_dir / "results.jsonl")).set_index("notebook")
    assert sorted(n[:2] for n in table.index) == sorted(only)
    assert table.loc["01_baseline_profiling", "recommendation"] in ("host-bound", "balanced", "device-bound",
                                                                     "inconclusive")
    assert name in table.loc["01_baseline_profiling", "extra"]["context"]
    cl = table.loc["07_channels_last"]
    if example == "text_classifier":  # no convolution: said so from inspecting the model
        assert name in table.loc["03_dataloader_tuning", "extra"]["context"]  # the sweep ran on the user's dataset
        assert "built-in PPO job only" not in table.loc["03_dataloader_tuning", "reason"]
        e2e = table.loc["10_end_to_end"]
        assert name in e2e["extra"]["context"]
        assert e2e["recommendation"] in ("enable", "leave off", "inconclusive") or (
            e2e["recommendation"] == "not applicable" and "no optimization selected" in e2e["reason"])
        assert "batched_decode" not in e2e["extra"]["optimizations"]  # the workbook's JPEG pipeline is not the user's
        assert cl["recommendation"] == "not applicable" and "no 2-D convolution" in cl["reason"]
        assert name in table.loc["06_mixed_precision", "extra"]["context"]  # autocast measured on the user's step
        assert "your job's training step" in table.loc["09_memory_and_batch_size", "extra"]["context"]
        pin = table.loc["04_pinned_memory"]  # the CPU has no copy to pin; the reason says so, on the user's batch
        assert pin["recommendation"] == "not applicable" and "your job" in pin["extra"]["context"]
        overlap = table.loc["05_stream_overlap"]  # workers and the prefetcher around the user's own loader
        assert f"your job '{name}" in overlap["extra"]["context"]
        assert overlap["recommendation"] in ("enable", "leave off", "inconclusive")
    else:
        assert "your job's training step" in cl["extra"]["context"]
        ddp = table.loc["08_collectives"]  # every rank loaded the user's job file and trained it under DDP
        assert f"your job '{name}" in ddp["extra"]["context"]
        decode = table.loc["02_batched_decode"]
        assert decode["recommendation"] == "not applicable"
        assert "not applicable to your job yet" in decode["reason"] and "diagnose --job" in decode["reason"]
        assert "your dataset's decode and preprocessing are notebook 01's data phase" in decode["reason"]
    report = (run_dir / "report.md").read_text()
    assert "Job measured: your job" in report and "at batch size 32 (your factory's own" in report
    from trace_agreement import assert_trace_agrees, trace_agreement  # the reader against 01's own timing

    print(f"{name}: timed %.3f, traced %.3f, %s / %s, busy %s" % trace_agreement(run_dir))
    assert_trace_agrees(run_dir)


# ---------------------------------------------------------------- the first step, part by part

def test_first_step_check_reports_what_it_saw(cpu):
    from helpers.jobs.check import first_step_check

    out = first_step_check(_job(), cpu)
    assert out["name"] == "squares" and out["samples"] == 32
    assert out["batch"] == "[0] float32 (8, 4), [1] float32 (8,)"
    assert out["loss"] > 0


class _Strings(Squares):
    def __getitem__(self, i):
        return {"x": torch.full((4,), 1.0), "y": torch.tensor(1.0), "note": object()}


def test_first_step_check_names_each_failing_part(cpu):
    from helpers.jobs.check import first_step_check

    with pytest.raises(JobError, match=r"job 'squares': making the first batch .* failed"):
        first_step_check(_job(dataset=_Strings()), cpu)  # default_collate cannot stack an object()
    with pytest.raises(JobError, match=r"not a 0-d tensor"):
        first_step_check(_job(loss_fn=lambda out, y: (out.squeeze(1) - y) ** 2), cpu)
    with pytest.raises(JobError, match=r"the loss is nan on the first step"):
        first_step_check(_job(loss_fn=lambda out, y: (out * float("nan")).mean()), cpu)

    def too_big():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")

    job = supervised_job(Squares(), too_big, lambda o, y: o.mean(), lambda p: torch.optim.SGD(p, lr=0.1),
                         batch_size=8, name="huge")
    with pytest.raises(JobError, match=r"job 'huge': building the model on the device does not fit in cpu memory "
                                       r".* at batch_size 8: lower batch_size \(notebook 09"):
        first_step_check(job, cpu)


class _NoLossJob(Job):
    """A full Job whose step forgets to return its loss."""

    name = "no loss"

    def __init__(self):
        from helpers.jobs.base import Workload

        self.inner = _job()
        self.workload = Workload(batch_size=8)

    def make_dataset(self, pipeline="default", **options):
        return self.inner.make_dataset(pipeline)

    def batch_sampler(self, n_items):
        return self.inner.batch_sampler(n_items)

    def make_model(self, acc, options=None):
        return self.inner.make_model(acc)

    def make_step(self, model, acc, options=None):
        step = self.inner.make_step(model, acc)
        return lambda batch: {"accuracy": step(batch)["loss"] * 0}

    def to_device(self, batch, acc, *, non_blocking=False, options=None):
        return self.inner.to_device(batch, acc)


def test_first_step_check_wants_a_loss(cpu):
    from helpers.jobs.check import first_step_check

    with pytest.raises(JobError, match=r"job 'no loss': the step returned \['accuracy'\], with no loss"):
        first_step_check(_NoLossJob(), cpu)


def test_run_rejects_a_job_whose_first_step_fails(tmp_path):
    from helpers.errors import ParameterError
    from helpers.workbook.runner import RunOptions, run

    bad = tmp_path / "nanjob.py"
    bad.write_text("import torch\nfrom helpers.jobs.supervised import supervised_job\n\n"
                   "def make_job(batch_size=4):\n"
                   "    data = [(torch.ones(3), torch.tensor(0.0))] * 8\n"
                   "    return supervised_job(data, lambda: torch.nn.Linear(3, 1), lambda o, y: o.sum() / 0 * 0,\n"
                   "                          lambda p: torch.optim.SGD(p, lr=0.1), batch_size=batch_size,\n"
                   "                          name='nan job')\n")
    with pytest.raises(ParameterError, match=r"job 'nan job': the loss is nan on the first step"):
        run(RunOptions(profile="smoke", device="cpu", job=f"{bad}:make_job", out=tmp_path / "run"),
            echo=lambda s: None, executor=lambda nb, **kw: pytest.fail("no notebook may start"),
            device_checker=lambda kind: "cpu:test")
    assert not (tmp_path / "run" / "run.json").exists()


# ---------------------------------------------------------------- several ranks: DDP around the same job

def test_distributed_job_wraps_the_model_and_gives_each_rank_its_own_order(cpu):
    from helpers.jobs.distributed import DistributedJob

    job = _job()
    r0, r1 = DistributedJob(job, 0, 2), DistributedJob(job, 1, 2)
    assert r0.name == "squares (DDP, 2 ranks)" and r1.describe()["rank"] == 1
    orders = []
    for wrapped in (r0, r1):
        s = wrapped.batch_sampler(32)
        s.set_epoch(3)  # epoch 3 of rank r: the job's epoch 3 * 2 + r
        orders.append([list(b) for b in s])
    plain = job.batch_sampler(32)
    plain.set_epoch(6)
    assert orders[0] == [list(b) for b in plain] and orders[0] != orders[1]


@pytest.mark.slow
def test_diagnose_and_bench_ddp_run_the_example_job_under_torchrun(tmp_path):
    """The job file unchanged, as 2 gloo ranks: diagnose trains it in DDP, bench ddp measures buckets and hooks."""
    torchrun = Path(sys.executable).with_name("torchrun")
    spec = "examples/text_classifier.py:make_job"
    p = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "helpers", "diagnose",
                        "--job", spec, "--device", "cpu", "--steps", "4", "--warmup-steps", "1", "--json"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout)  # rank 0 alone prints
    assert out["job"] == "text classifier (examples/text_classifier.py) (DDP, 2 ranks)"
    assert out["free_input_speedup"]["ratio"] > 0
    p = subprocess.run([sys.executable, "-m", "helpers", "bench", "ddp", "--job", spec, "--profile", "smoke",
                        "--backend", "gloo"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    ddp = json.loads(p.stdout)
    assert ddp["job"].startswith("text classifier") and ddp["backward_passes"] == 1 and ddp["world_size"] == 2
    none = next(h for h in ddp["hooks"] if h["hook"] == "none")
    assert none["max_abs_err"] == 0.0  # plain DDP averages the job's own gradients exactly as the reference
    assert all(sum(b["bucket_sizes"]) == ddp["grad_bytes"] for b in ddp["buckets"])


def test_max_images_bounds_a_supervised_job_whose_factory_does_not_take_it(tmp_path):
    path = _write(tmp_path, "import torch\nfrom helpers.jobs.supervised import supervised_job\n\n"
                            "def make_job(batch_size=4):\n"
                            "    data = [(torch.ones(3), torch.tensor(0.0))] * 100\n"
                            "    return supervised_job(data, lambda: torch.nn.Linear(3, 1), lambda o, y: o.mean(),\n"
                            "                          lambda p: torch.optim.SGD(p, lr=0.1), batch_size=batch_size)\n",
                  name="bigjob.py")
    assert len(load_job(f"{path}:make_job", {"max_images": 12, "batch_size": 4}).make_dataset()) == 12
    assert len(load_job(f"{path}:make_job", {"batch_size": 4}).make_dataset()) == 100


def test_first_step_errors_show_the_users_own_frames(tmp_path, cpu):
    from helpers.jobs.check import first_step_check

    path = _write(tmp_path, "import torch\nfrom helpers.jobs.supervised import supervised_job\n\n"
                            "class Broken(torch.utils.data.Dataset):\n"
                            "    def __len__(self):\n        return 8\n"
                            "    def __getitem__(self, i):\n        raise KeyError('no such sample')\n\n"
                            "def broken_model():\n    raise RuntimeError('my model constructor is broken')\n\n"
                            "def make_job(batch_size=4, which='data'):\n"
                            "    data = Broken() if which == 'data' else [(torch.ones(3), torch.tensor(0.0))] * 8\n"
                            "    model = broken_model if which == 'model' else (lambda: torch.nn.Linear(3, 1))\n"
                            "    return supervised_job(data, model, lambda o, y: o.mean(),\n"
                            "                          lambda p: torch.optim.SGD(p, lr=0.1), batch_size=batch_size)\n",
                  name="framesjob.py")
    with pytest.raises(JobError) as exc:
        first_step_check(load_job(f"{path}:make_job", {"which": "data"}), cpu)
    assert "making the first batch" in str(exc.value) and "framesjob.py\", line 8, in __getitem__" in str(exc.value)
    with pytest.raises(JobError) as exc:
        first_step_check(load_job(f"{path}:make_job", {"which": "model"}), cpu)
    assert "model_fn() raised RuntimeError" in str(exc.value) and "in broken_model" in str(exc.value)
    bad = _write(tmp_path, "def make_job(:\n    pass\n", name="syntaxjob.py")
    with pytest.raises(JobError, match=r"SyntaxError.*\n  def make_job\(:"):
        load_job(f"{bad}:make_job")


# ---------------------------------------------------------------- the user's batch size is the user's

def test_sizes_the_user_did_not_set_are_left_to_the_factory(tmp_path):
    from helpers.jobspec import factory_params
    from helpers.experiments.registry import validate_notebook_params
    from helpers.workbook.nbsetup import factory_defaults

    nb = "01_baseline_profiling"
    params = validate_notebook_params(nb, {"job": "x.py:make_job"})
    assert factory_defaults(nb, {}, params) == ["batch_size", "image_size"]  # the cell's defaults: the job's own
    injected = {"In": ["", "# Parameters\njob = 'x.py:make_job'\nbatch_size = 32\n"]}  # papermill's -p
    assert factory_defaults(nb, injected, params) == ["image_size"]  # 32 passed on purpose is passed
    edited = validate_notebook_params(nb, {"job": "x.py:make_job", "batch_size": 16})  # JupyterLab, cell edited
    assert factory_defaults(nb, {}, edited) == ["image_size"]
    assert factory_defaults(nb, {}, validate_notebook_params(nb, {})) == []  # the built-in job takes them all
    given = factory_params({**edited, "factory_defaults": ["image_size"]})
    assert given["batch_size"] == 16 and "image_size" not in given and given["seed"] == 0


def test_the_parameters_cell_marks_the_sizes_a_users_job_keeps():
    """The second cell shows ctx.shown_params(): no notebook default where the user's factory keeps its own size."""
    from helpers.jobspec import FACTORY_DEFAULTS_KEY
    from helpers.workbook.nbsetup import NotebookContext

    params = {"results_path": "r.jsonl", "out_dir": "o", "batch_size": 32, "image_size": 64, "seed": 0,
              "job": "x.py:make_job", FACTORY_DEFAULTS_KEY: ["batch_size"]}
    ctx = NotebookContext(notebook="01_baseline_profiling", params=params, acc=None, store=None, out_dir=Path("."))
    assert ctx.shown_params() == {"batch_size": "your job's own default", "image_size": 64, "seed": 0,
                                  "job": "x.py:make_job"}
    builtin = NotebookContext(notebook="01_baseline_profiling", params={"out_dir": "o", "batch_size": 32}, acc=None,
                              store=None, out_dir=Path("."))
    assert builtin.shown_params() == {"batch_size": 32}


def test_every_notebook_loads_the_job_through_its_context():
    """ctx.job() makes the parameters (and every record after it) say the batch the user's job really has."""
    import nbformat

    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        source = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
        assert "notebook_job(P)" not in source, path.name
        assert "exp.trace_job(cfg)" not in source or "ctx.job()" in source, path.name


def test_a_job_request_resolves_the_users_job_or_the_builtin_one(tmp_path):
    """JobRequest: the one flat form of "the user's job or the built-in one" that a child process builds."""
    from helpers.jobs.load import JobRequest

    params = {"job": "examples/image_classifier.py:make_job", "factory_defaults": ["image_size"], "batch_size": 8,
              "max_images": 16, "image_size": 48, "seed": 0, "data_dir": ""}
    req = JobRequest.from_params(params)
    assert req.spec == str((ROOT / "examples" / "image_classifier.py").resolve()) + ":make_job" or \
        req.spec.endswith("examples/image_classifier.py:make_job")
    assert JobRequest.from_dict(json.loads(json.dumps(req.as_dict()))) == req  # survives a child's JSON
    job = req.job()
    assert not job.is_builtin and job.workload.batch_size == 8 and job.batch_multiple == 1
    assert job.backward_passes is None
    builtin = JobRequest.from_params({"batch_size": 4, "max_images": 8, "image_size": 32, "model_width": 4,
                                      "d_model": 16, "text_len": 8}).job()
    assert builtin.is_builtin and builtin.batch_multiple == builtin.ppo.horizon
    assert builtin.backward_passes == builtin.ppo.ppo_epochs
