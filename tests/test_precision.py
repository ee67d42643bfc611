"""Notebook 06's experiment (helpers/experiments/precision.py): run() on small data, its result's records, text and
verdict, and a diverging loss that still gives its verdict (the verdict's own branches: tests/test_verdicts.py,
tests/test_job_faults.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers.device import get_accelerator
from helpers.experiments import precision
from helpers.jobs.load import load_job
from helpers.results import ResultsStore

JOBS = Path(__file__).resolve().parent / "fault_jobs.py"
SMALL = {"batch_size": 4, "image_size": 16, "text_len": 4, "model_width": 4, "d_model": 8, "steps": 3,
         "warmup_steps": 1, "curve_steps": 4, "autocast_dtype": "bfloat16"}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    from helpers.pipeline.dataset import build_embedded

    return str(build_embedded(tmp_path_factory.mktemp("emb") / "d", n_images=16, seed=5))


def _ctx(data_dir, job=None, **overrides):
    P = {p.name: p.default for p in precision.EXPERIMENT.spec}
    P.update(SMALL, data_dir=data_dir, job="" if job is None else f"{JOBS}:{job}", **overrides)
    acc = get_accelerator("cpu")
    return SimpleNamespace(params=P, acc=acc, job=lambda: load_job(f"{JOBS}:{job}"))


def _keys(result, tmp_path):
    store = ResultsStore(tmp_path / "r.jsonl", notebook=precision.NOTEBOOK)
    return [(r.experiment, r.variant, r.metric, r.unit) for r in store.write(result.records())]


@pytest.fixture(scope="module")
def builtin(data_dir):
    return precision.run(_ctx(data_dir))


def test_the_built_in_jobs_result_records_what_the_notebook_recorded(builtin, tmp_path):
    assert _keys(builtin, tmp_path) == [
        ("capabilities", "cpu", "native_bf16", "bool"),
        ("capabilities", "cpu bfloat16", "autocast_dtype_bits", "bits"),
        ("numerics", "bfloat16 vs fp32", "value_loss_rel_diff", "fraction"),
        ("step time", "bfloat16 autocast vs fp32", "speedup", "x"),
        ("step time", "fp32", "time_per_step", "s"), ("step time", "fp32", "throughput", "samples/s"),
        ("step time", "bfloat16 autocast", "time_per_step", "s"),
        ("step time", "bfloat16 autocast", "throughput", "samples/s"),
        ("memory", "fp32", "process_rss", "bytes"), ("memory", "bfloat16", "process_rss", "bytes")]
    v = builtin.verdict()
    assert v.notebook == precision.NOTEBOOK and v.metric == "speedup" and v.recommendation in ("enable", "leave off")
    assert v.action.text.startswith("bf16 autocast: ") and "decision_threshold" in v.extra
    assert v.context.startswith("PPO step (rollout + 2 updates) of a 4-channel conv + d_model 8 policy, batch 4 of "
                                "16 px, 4 fixed batches on cpu")
    assert v.context.endswith("fp32 vs bfloat16 autocast, 3 interleaved steps each after 1 warm-up")


def test_the_built_in_jobs_result_says_each_section(builtin):
    r = builtin
    assert r.caps.text().splitlines()[1] == "chosen: bfloat16 (parameter autocast_dtype='bfloat16')"
    assert r.batches_text() == "16 images, 11 class(es); 4 fixed batches of 4 (16 px) kept on the device"
    assert r.probe_text().splitlines()[-1] == "  cast down (control): linear -> bfloat16"
    assert set(r.dtypes.columns) == {"kind", "input_dtype", "output_dtype", "effect", "calls"}
    assert r.casts_text().startswith("cast by autocast (bfloat16 autocast on cpu): ")
    assert r.demo.ok and r.demo.text().startswith("injected infs at updates [4, 9]: 2 update(s) skipped and counted")
    assert r.curves.loss_name == "value loss" and r.curves.no_nan and r.curves.steps == 4
    assert r.curves.text().startswith("mean value loss of the last 1 of 4 steps: fp32 ")
    assert r.curves.scaler is None and r.curves.scaler_text().startswith("bfloat16: no loss scaler needed")
    assert r.timing_text().splitlines()[1].startswith("  fp32: median ")  # no divergence note
    assert r.memory_text().endswith("(process RSS, not separable per variant on a CPU)")
    assert r.memory_text().startswith("fp32 ") and ", bfloat16 " in r.memory_text()
    demo = r.demo.text().splitlines()
    assert demo[1].startswith("this demonstration's own scaler: init_scale 1024, growth_interval "
                              f"{precision.DEMO_GROWTH_INTERVAL} ")
    assert demo[2] == "scale after each update: " + " → ".join(f"{s:g}" for s in r.demo.scales)


def test_the_try_it_panel_offers_the_devices_precisions(builtin):
    spec = builtin.try_it(get_accelerator("cpu"), {"steps": 20, "warmup_steps": 3})
    assert spec.knobs["dtype"].value == "bfloat16" and spec.knobs["dtype"].options[0] == ("float32", "float32")
    assert spec.reference.metric == "speedup" and spec.reference.label == "bfloat16"
    point = spec.measure(dtype="float32")
    assert point.metric == "speedup" and point.label == "float32 (vs itself)"


def test_the_figures_draw_from_the_result(builtin):
    import matplotlib.pyplot as plt

    from helpers.workbook import plots_compute

    for fig in (plots_compute.precision_scaler_demo_figure(builtin), plots_compute.precision_loss_figure(builtin),
                plots_compute.precision_step_time_figure(builtin)):
        assert fig.axes
        plt.close(fig)
    assert plots_compute.precision_loss_scale_figure(builtin) is None  # bf16: no scaler ran
    fig = plots_compute.precision_loss_figure(builtin)
    assert fig.axes[0].get_ylabel() == "value loss" and "apart at the end" in fig.axes[0].get_title()
    plt.close(fig)


def test_float16_on_the_built_in_job_records_its_scaler(data_dir, tmp_path):
    r = precision.run(_ctx(data_dir, autocast_dtype="float16", curve_steps=3, steps=2))
    keys = _keys(r, tmp_path)
    assert ("loss scaler", "float16", "skipped_updates", "updates") in keys
    assert keys.index(("loss scaler", "float16", "skipped_updates", "updates")) == 3  # after the numerics
    assert r.curves.scaler is not None and r.curves.scaler_text().startswith("fp16: ")
    assert "with GradScaler" in r.context
    assert "float16 autocast on a CPU is not what CPUs accelerate" in r.verdict().reason
    assert "NOTE: float16 autocast on a CPU" in r.caps.text()


@pytest.mark.parametrize("job, recommendation, starts", [
    ("make_nan_job", "inconclusive", "your job diverges: its loss is nan at step 3 in fp32 too"),
    ("make_bf16_nan_job", "leave off", "bfloat16 autocast breaks this job's training: "),
])
def test_a_diverging_loss_gives_its_verdict_and_records_where(data_dir, tmp_path, job, recommendation, starts):
    r = precision.run(_ctx(data_dir, job=job, curve_steps=6))
    assert not r.curves.no_nan and r.curves.divergence.diverged and r.memory is None
    keys = _keys(r, tmp_path)  # storable: no NaN or infinite value on the way
    nonfinite = [k for k in keys if k[0] == "numerics"]
    assert nonfinite and all(k[2:] == ("first_nonfinite_loss_step", "step") for k in nonfinite)
    assert ("numerics", "bf16 autocast", "first_nonfinite_loss_step", "step") in nonfinite
    assert ("fp32" in [k[1] for k in nonfinite]) == (job == "make_nan_job")
    assert not [k for k in keys if k[0] == "memory"]
    v = r.verdict()
    assert v.recommendation == recommendation and v.reason.startswith(starts), v.reason
    assert v.extra["divergence"]["first"]["bf16 autocast"]["step"] == 3
    assert r.curves.text() == r.curves.divergence.sentence()
    timing = r.timing_text().splitlines()
    assert timing[0].startswith("NOTE: the loss diverged (") and "not meaningful" in timing[0]
    assert timing[1] == r.cmp.verdict_text()
    assert r.batches_text().splitlines()[1].startswith(f"your job: {r.job.name} (batch_size ")
    assert r.memory_text().startswith("peak memory: not measured for your job")
    assert "your job's training step (" in v.context
    store = ResultsStore(tmp_path / "v.jsonl", notebook=precision.NOTEBOOK)
    store.add_verdict(v)

    import matplotlib.pyplot as plt

    from helpers.workbook import plots_compute

    fig = plots_compute.precision_loss_figure(r)  # NaN points are not drawn; the figure still is
    title, ylabel = fig.axes[0].get_title(), fig.axes[0].get_ylabel()
    plt.close(fig)
    assert ylabel == "loss" and "inf%" not in title and "diverged: " in title and "at step 3 in bf16 autocast" in title
