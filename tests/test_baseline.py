"""Notebook 01's experiment: the baseline's run on small data, its result's records and texts, its verdict at each
branch and its "try it" panel, for the built-in job and a user's."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

from helpers.compute.train import TrainRun
from helpers.experiments import baseline
from helpers.experiments.three_run import CeilingResult
from helpers.live import Knob, TrySpec
from helpers.results import ResultsStore
from helpers.timing import Comparison, Measurement

NOTEBOOK = "01_baseline_profiling"


def _keys(records, tmp_path):
    store = ResultsStore(tmp_path / "r.jsonl", notebook=NOTEBOOK)
    return [(r.experiment, r.variant, r.metric, r.unit) for r in store.write(records)]


def _steps(data_ms, h2d_ms, compute_ms, n=6):
    step = data_ms + h2d_ms + compute_ms
    return pd.DataFrame({"step": range(n), "data": [data_ms / 1e3] * n, "h2d": [h2d_ms / 1e3] * n,
                         "compute": [compute_ms / 1e3] * n, "step_s": [step / 1e3] * n,
                         "exposed_fraction": [(data_ms + h2d_ms) / step] * n, "loss": [1.0] * n})


def _ceiling(real_ms=100.0, synthetic_ms=60.0, n=5):
    real = Measurement("real", tuple((real_ms + i) / 1e3 for i in range(n)), 1)
    synthetic = Measurement("synthetic", tuple((synthetic_ms + i) / 1e3 for i in range(n)), 1)
    steps = {"real": _steps(40, 0, 60, n), "synthetic": _steps(0, 0, 60, n)}
    return CeilingResult(job="j", steps=steps, ceiling=Comparison.from_measurements(real, synthetic), machine=None)


def _result(data_ms=40.0, h2d_ms=0.0, compute_ms=60.0, *, builtin=True, trace=None, **kw):
    run = TrainRun(phases=None, steps=_steps(data_ms, h2d_ms, compute_ms), warmup_steps=1)
    dataset = None
    description = {"job": "mine", "batch_size": 8, "image_size": 32}
    if builtin:
        table = pd.DataFrame({"path": [f"images/{i:05d}.jpg" for i in range(7)], "caption": ["c"] * 7,
                              "label": [0, 1] * 3 + [0]})
        dataset = baseline.DatasetSummary(images=7, classes=2, skipped=(("bad.jpg", "truncated"),), source="embedded",
                                          table=table)
        description = {"job": "built-in PPO job", "batch_size": 8, "image_size": 32, "model_width": 4, "d_model": 8,
                       "images": 7, "classes": 2, "skipped": 1}
    per_image = Measurement("per-image preprocessing", (0.004, 0.005, 0.006), 2, items_per_call=1) if builtin else None
    fields = dict(device_kind="cpu", description=description, job_spec="" if builtin else "job.py:make_job",
                  dataset=dataset, batch_size=8, per_image=per_image, run=run, steps=6, warmup_steps=1,
                  threshold=0.1, profile=None, trace_file=None, ceiling=_ceiling(), trace=trace, trace_given=False)
    return baseline.BaselineResult(**{**fields, **kw})


@pytest.fixture(autouse=True)
def _no_spare_cores(monkeypatch):
    monkeypatch.setattr(baseline, "spare_cores", lambda kind, share=None: 0)


@pytest.mark.parametrize("data_ms, label", [(5.0, "device-bound"), (25.0, "balanced"), (60.0, "host-bound")])
def test_the_verdict_at_each_branch(data_ms, label):
    v = _result(data_ms, 0.0, 100.0 - data_ms).verdict()
    assert v.notebook == NOTEBOOK and v.metric == "exposed_input_fraction" and v.unit == "fraction"
    assert v.recommendation == label == v.extra["bottleneck"]["label"]
    assert v.value == pytest.approx(data_ms / 100.0)
    assert set(v.extra["phases"]) == {"data", "h2d", "compute", "step_s"} and "ceiling" in v.extra
    assert "; next: " in v.reason and "ms/image" in v.reason
    assert "multimodal policy" in v.context


def test_the_builtin_jobs_records_in_order(tmp_path):
    keys = _keys(_result().records(), tmp_path)
    assert keys[:2] == [("dataset", "usable images", "images", "images"),
                        ("preprocess", "baseline per-image", "time_per_image", "s")]
    assert ("preprocess", "baseline per-image", "throughput", "images/s") in keys
    phases = [k[1] for k in keys if k[0] == "baseline step" and k[2] == "time_per_step"]
    assert phases == ["data", "h2d", "compute", "step"]
    assert ("baseline step", "step", "throughput", "samples/s") in keys
    assert ("baseline step", "exposed input", "exposed_input_fraction", "fraction") in keys
    assert ("input-free ceiling", "real / synthetic", "ceiling_fraction", "fraction") in keys
    assert any(k[0] == "input-free ceiling" and k[2] == "free_input_speedup" for k in keys)
    assert not any(k[0] in ("your trace", "verdict") for k in keys)  # no trace; the verdict is ctx.record's


def test_a_trace_read_back_is_recorded_per_rank(tmp_path):
    rank = SimpleNamespace(label="rank 0", exposed_fraction=0.4, label_text="host-bound",
                           provenance={"reader": "kineto", "bytes": 10})
    trace = SimpleNamespace(ranks=[rank], job=SimpleNamespace(exposed_fraction=0.41), label="host-bound",
                            limits=["a CPU-only trace has no device idle time"], sentence=lambda: "host-bound")
    r = _result(trace=trace)
    store = ResultsStore(tmp_path / "r.jsonl", notebook=NOTEBOOK)
    rec = [x for x in store.write(r.records()) if x.experiment == "your trace"]
    assert len(rec) == 1 and rec[0].value == 0.4 and rec[0].extra["trace"]["reader"] == "kineto"
    assert rec[0].extra["verdict"] == "host-bound"
    text = r.trace_text()
    assert text.startswith("this job's own trace: exposed input 41% of the step (host-bound); timed in section 3: 40%")
    assert "  the trace cannot tell: a CPU-only trace" in text
    assert _result(trace=trace, trace_given=True).trace_text().startswith("your trace: host-bound")
    assert _result().trace_text().startswith("no trace to read")


def test_the_texts_of_the_builtin_job():
    r = _result()
    assert r.dataset_text().splitlines() == ["7 images, 2 class(es), 1 file(s) skipped", "  skipped bad.jpg: truncated"]
    assert len(r.dataset_table()) == 5
    assert r.per_image_text().startswith("per-image preprocessing: median 5.0 ms (IQR")
    assert r.per_image_ms() == pytest.approx([4.0, 5.0, 6.0])
    assert r.steps_text() == "6 measured steps after 1 warm-up; median step 100 ms: data 40 ms, h2d 0 ms, compute 60 ms"
    assert list(r.summary_table().index) == ["median", "min", "max"] and "loss" in r.summary_table()
    assert r.phase_totals().loc["baseline"].to_dict() == pytest.approx({"data": 0.04, "h2d": 0.0, "compute": 0.06})
    assert "= 40 ms predicted from the per-image timing (1.00x)" in r.consistency_text()
    assert r.profile_text() == "profiling skipped (profile_steps=0)" and r.top_ops() is None
    lines = r.ceiling_text().splitlines()
    assert lines[0].startswith("real      step") and lines[1].startswith("synthetic step")
    assert "faster" in lines[-1]


def test_verdict_at_moves_with_the_threshold(capsys):
    r = _result(25.0, 0.0, 75.0)
    assert r.verdict_at(0.1) == "balanced" and r.verdict_at(0.5) == "device-bound"
    assert "threshold 50%: device-bound (exposed input 25% of the step)" in capsys.readouterr().out


def test_a_users_job_has_no_per_image_cost_and_no_image_size_knob(tmp_path):
    r = _result(builtin=False)
    keys = _keys(r.records(), tmp_path)
    assert keys[0] == ("dataset", "your job", "batch_size", "samples")
    assert not any(k[0] == "preprocess" for k in keys)
    assert r.dataset_text() == "your job: mine (batch_size 8, image_size 32)" and r.dataset_table() is None
    assert r.per_image_text().startswith("your job: its dataset is timed as a whole")
    assert r.consistency_text().startswith("your job:")
    assert "its own loader as given" in r.verdict().context and "ms/image" not in r.verdict().reason
    spec = r.try_it(SimpleNamespace(kind="cpu"), {"batch_size": 8, "image_size": 32, "steps": 20})
    assert isinstance(spec, TrySpec) and set(spec.knobs) == {"batch_size"}
    assert spec.reference.label == "bs=8" and spec.reference.metric == "exposed_input_fraction"


def test_the_builtin_jobs_panel_offers_batch_and_crop_sizes():
    spec = _result().try_it(SimpleNamespace(kind="cpu"), {"batch_size": 8, "image_size": 32, "steps": 20})
    assert set(spec.knobs) == {"batch_size", "image_size"} and all(isinstance(k, Knob) for k in spec.knobs.values())
    assert spec.knobs["batch_size"].value == 8 and (("8", 8) in spec.knobs["batch_size"].options)
    assert spec.knobs["image_size"].value == 32 and spec.reference.label == "bs=8, 32px"


def test_timed_steps_counts_the_baseline_and_both_ceiling_runs():
    assert baseline.timed_steps({"warmup_steps": 1, "steps": 4, "ceiling_steps": 3}) == 5 + 2 * 4


def test_run_on_small_data(tmp_path):
    """The whole experiment on a dozen images: every record key, the verdict, the profile's trace read back."""
    from helpers.device import get_accelerator
    from helpers.jobs.base import Workload
    from helpers.jobs.ppo import PPOJob
    from helpers.pipeline.dataset import build_embedded, load_dataset
    from helpers.pipeline.text import build_tokenizer

    index = load_dataset(build_embedded(tmp_path / "d", n_images=12, seed=5))
    job = PPOJob(index, build_tokenizer(list(index.captions), vocab_size=128),
                 Workload(batch_size=4, image_size=16, text_len=4, model_width=4, d_model=8, seed=0))
    P = {"trace_path": "", "data_dir": "", "preprocess_samples": 4, "warmup_steps": 1, "steps": 3,
         "profile_steps": 1, "ceiling_steps": 3, "host_bound_threshold": 0.1, "job": ""}
    ctx = SimpleNamespace(params=P, acc=get_accelerator("cpu"), job=lambda: job, out_dir=tmp_path / "run",
                          artifacts_dir=tmp_path / "run" / "artifacts" / NOTEBOOK)
    seen = []
    r = baseline.run(ctx, progress=lambda done, total: seen.append(done))
    assert len(seen) == baseline.timed_steps(P)
    assert r.dataset.images == 12 and r.per_image.repeats == 4 and len(r.run.steps) == 3
    assert r.trace_file and r.trace_file.startswith("artifacts/")
    assert r.profile_text() == f"trace: {tmp_path / 'run' / r.trace_file}"  # the whole path, to open
    assert r.trace is not None and r.trace_text().startswith("this job's own trace")
    # where the trace's label and the timing's differ, the notebook says why, from both figures
    from dataclasses import replace

    from helpers.traces.analysis import PhaseStat

    other = "host-bound" if r.verdict().recommendation != "host-bound" else "device-bound"
    fake = SimpleNamespace(label=other, limits=(), job=SimpleNamespace(
        exposed_fraction=0.05, steps=2, phases={"compute": PhaseStat(0.05, 0.04, 0.06, 2)}))
    text = replace(r, trace=fake).trace_text()
    assert "why they differ: the trace holds 2 profiled step(s), section 3 times 3" in text
    assert "its compute phase is 50 ms per step against" in text and "act on section 6's verdict" in text
    assert "why they differ" not in replace(r, trace=replace_label(r.trace, r.verdict().recommendation)).trace_text()
    keys = _keys(r.records(), tmp_path)
    assert {k[0] for k in keys} == {"dataset", "preprocess", "baseline step", "input-free ceiling", "your trace"}
    v = r.verdict()
    assert v.recommendation in ("host-bound", "balanced", "device-bound") and 0 < v.value < 1


def test_the_panel_measures_the_baseline_again(tmp_path):
    """The panel's measure (headless: once at the knobs' first values) reruns the job at the sizes picked."""
    from helpers.device import get_accelerator
    from helpers.experiments.registry import validate_notebook_params
    from helpers.pipeline.dataset import build_embedded

    folder = build_embedded(tmp_path / "d", n_images=12, seed=5)
    P = validate_notebook_params(NOTEBOOK, {"data_dir": str(folder), "batch_size": 4, "image_size": 16, "text_len": 4,
                                            "model_width": 4, "d_model": 8, "steps": 3, "warmup_steps": 1})
    spec = _result().try_it(get_accelerator("cpu"), P)
    seen = []
    point = spec.measure(progress=lambda done, total: seen.append((done, total)), batch_size=4, image_size=16)
    assert point.label == "bs=4, 16px" and point.metric == "exposed_input_fraction" and 0 <= point.value <= 1
    assert point.repeats == 3 and seen[-1] == (5, 5)  # 2 warm-up steps and min(steps, 10) measured
    assert point.extra["verdict"] in ("host-bound", "balanced", "device-bound")


def replace_label(trace, label):
    """``trace`` whose job's label reads ``label`` (a stand-in with the same job figures)."""
    return SimpleNamespace(label=label, limits=(), job=trace.job)
