"""Notebook 05's experiment: the overlap metric, the variants on a Job, the verdict and the benchmark.
"""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from helpers.device import get_accelerator
from helpers.errors import ParameterError
from helpers.experiments import overlap as ov
from helpers.experiments import overlap_runs
from helpers.jobs.base import Workload
from helpers.jobs.ppo import PPOJob

# --------------------------------------------------------------------------- stand-ins for the fast format


def phase_table(data, h2d, compute):
    df = pd.DataFrame({"step": range(len(data)), "data": data, "h2d": h2d, "compute": compute})
    df["step_s"] = df["data"] + df["h2d"] + df["compute"]
    return df

def test_overlap_stats_arithmetic():
    steps = phase_table([0.01, 0.02, 0.01, 0.0], [0.0, 0.01, 0.0, 0.0], [0.09, 0.07, 0.09, 0.1])
    work = [0.1, 0.1, 0.1, 0.1]
    s = ov.overlap_stats(steps, work)
    # per-step exposed 0.01, 0.03, 0.01, 0.0 -> median 0.01; work median 0.1; steps all 0.1
    assert s.steps == 4 and s.median_exposed_s == pytest.approx(0.01) and s.median_input_work_s == pytest.approx(0.1)
    assert s.median_step_s == pytest.approx(0.1) and s.median_compute_s == pytest.approx(0.09)
    assert s.hidden_fraction == pytest.approx(1 - 0.01 / 0.1)
    assert s.exposed_over_work == pytest.approx(0.1)
    assert s.exposed_fraction == pytest.approx(0.01 / 0.1)
    assert s.exposed_fraction_per_step == pytest.approx(0.1)  # per-step fractions 0.1, 0.3, 0.1, 0.0 -> median 0.1
    # totals are kept for reference only
    assert s.input_work_s == pytest.approx(0.4) and s.exposed_input_s == pytest.approx(0.05)
    assert s.step_s == pytest.approx(0.4) and s.compute_s == pytest.approx(0.35)
    assert set(s.as_dict()) >= {"hidden_fraction", "exposed_fraction", "exposed_fraction_per_step"}

def test_overlap_fractions_follow_from_the_medians_not_the_totals():
    """Review item 5: two runs with the same medians give the same fractions, whatever a slow step does to the mean."""
    calm = ov.overlap_stats(phase_table([0.002] * 5, [0.0] * 5, [0.03] * 5), [0.008] * 5)
    spiky = ov.overlap_stats(phase_table([0.002, 0.002, 0.002, 0.05, 0.002], [0.0] * 5,
                                         [0.03, 0.03, 0.03, 0.03, 0.2]), [0.008, 0.008, 0.008, 0.06, 0.008])
    assert spiky.exposed_input_s / spiky.input_work_s != pytest.approx(calm.exposed_input_s / calm.input_work_s)
    for s in (calm, spiky):
        # the fractions are reproduced from the medians a table shows
        assert s.hidden_fraction == pytest.approx(1 - s.median_exposed_s / s.median_input_work_s)
        assert s.exposed_fraction == pytest.approx(s.median_exposed_s / s.median_step_s)
    assert spiky.hidden_fraction == pytest.approx(calm.hidden_fraction) == pytest.approx(0.75)
    assert spiky.exposed_fraction == pytest.approx(calm.exposed_fraction)

def test_overlap_stats_serial_and_over_exposed_cases():
    serial = ov.overlap_stats(phase_table([0.05] * 3, [0.01] * 3, [0.04] * 3), [0.06] * 3)
    assert serial.hidden_fraction == pytest.approx(0.0) and serial.exposed_fraction == pytest.approx(0.6)
    worse = ov.overlap_stats(phase_table([0.08] * 2, [0.0] * 2, [0.02] * 2), [0.05] * 2)
    assert worse.hidden_fraction == 0.0 and worse.exposed_over_work == pytest.approx(1.6)

def test_overlap_stats_validates_its_inputs():
    steps = phase_table([0.1], [0.0], [0.1])
    with pytest.raises(ParameterError, match="one per measured step"):
        ov.overlap_stats(steps, [0.1, 0.2])
    with pytest.raises(ParameterError, match="lacks"):
        ov.overlap_stats(steps.drop(columns="h2d"), [0.1])
    with pytest.raises(ParameterError, match="negative"):
        ov.overlap_stats(steps, [-1.0])
    with pytest.raises(ParameterError, match="no step"):
        ov.overlap_stats(steps.iloc[:0], [])

def test_input_work_per_step_aligns_batches_and_copies():
    frame = pd.DataFrame({"prep_s": [1.0, 2.0, 3.0, 4.0, 5.0]})
    assert ov.input_work_per_step(frame, skip=2, steps=2) == [3.0, 4.0]
    assert ov.input_work_per_step(frame, skip=2, steps=2, copy_s=[0.1, 0.2]) == pytest.approx([3.1, 4.2])
    assert ov.input_work_per_step(frame, skip=1, steps=2, copy_s=[9, 0.5, 0.25, 9]) == pytest.approx([2.5, 3.25])
    with pytest.raises(ParameterError, match="fewer"):
        ov.input_work_per_step(frame, skip=4, steps=2)
    with pytest.raises(ParameterError, match="prep_s"):
        ov.input_work_per_step(pd.DataFrame({"x": [1]}), skip=0, steps=1)

def test_timeline_frame_puts_everything_on_one_clock():
    phases = pd.DataFrame({"step": [0, 0, 0, 1, 1, 1], "phase": ["data", "h2d", "compute"] * 2,
                           "start_s": [0.0, 0.1, 0.2, 1.0, 1.1, 1.2], "duration_s": [0.1, 0.1, 0.8] * 2})
    # batch 1 (first measured, skip=1) was returned at t=100.1, so the first measured step began at t=100.0
    batches_log = pd.DataFrame({"order": [0, 1, 2], "return_s": [99.0, 100.1, 101.1],
                                "prep_start_s": [98.0, 99.5, 100.3], "prep_end_s": [98.5, 100.0, 100.9],
                                "prep_s": [0.5, 0.5, 0.6], "worker": [0, 1, 0]})
    spans = ov.timeline_frame(phases, batches_log, skip=1)
    prep = spans[spans["kind"] == "prep"].set_index("batch")
    assert prep.loc[0, "start_s"] == pytest.approx(-0.5) and prep.loc[0, "row"] == "worker 1 prep"
    assert prep.loc[1, "start_s"] == pytest.approx(0.3) and prep.loc[1, "duration_s"] == pytest.approx(0.6)
    assert set(spans["row"]) == {"worker 0 prep", "worker 1 prep", "copy", "data wait", "compute"}
    copies = pd.DataFrame({"index": [1, 2], "start_s": [100.05, 100.95], "duration_s": [0.01, 0.01]})
    spans = ov.timeline_frame(phases, batches_log, skip=1, copies=copies)
    copy = spans[spans["kind"] == "copy"]
    assert copy["start_s"].tolist() == pytest.approx([0.05, 0.95]) and copy["batch"].tolist() == [0, 1]

@pytest.fixture(scope="module")
def small_data(tmp_path_factory):
    from helpers.pipeline.dataset import build_embedded, load_dataset
    from helpers.pipeline.text import build_tokenizer

    index = load_dataset(build_embedded(tmp_path_factory.mktemp("emb") / "d", n_images=16, seed=5))
    return index, build_tokenizer(list(index.captions), vocab_size=128)

def test_choose_threads_gives_each_worker_a_core():
    assert ov.choose_threads(1, 2)["torch_threads"] == 1
    assert ov.choose_threads(1, 8)["torch_threads"] == 7
    over = ov.choose_threads(3, 2)
    assert over["torch_threads"] == 1 and over["decode_threads"] == 1 and "share" in over["reason"]
    none = ov.choose_threads(0, 4)
    assert none["torch_threads"] == 4 and none["decode_threads"] == 4

def test_thread_splits_and_fastest():
    splits = ov.thread_splits(1, 2)
    assert [s["label"] for s in splits] == ["1 core per worker", "all cores to torch"]
    assert [s["torch_threads"] for s in splits] == [1, 2] and all(s["decode_threads"] == 1 for s in splits)
    assert len(ov.thread_splits(1, 2, is_cpu=False)) == 1  # the step runs on the device
    assert len(ov.thread_splits(0, 2)) == 1
    assert [s["torch_threads"] for s in ov.thread_splits(2, 2)] == [1, 2]  # torch keeps at least one thread
    runs = [_fake_run([0.0] * 3, [c] * 3, f"c{c}") for c in (0.3, 0.1, 0.2)]
    assert ov.fastest(runs).label == "c0.1"
    with pytest.raises(ParameterError):
        ov.fastest([])

def test_run_overlap_variants_and_verdict(small_data):
    index, tokenizer = small_data
    acc = get_accelerator("cpu")
    job = PPOJob(index, tokenizer, Workload(batch_size=4, image_size=16, text_len=4, model_width=4, d_model=8, seed=0))
    common = dict(steps=3, warmup_steps=1)
    before = ov.run_overlap_variant(job, acc, label="before", num_workers=0, prefetcher=False, **common)
    after = ov.run_overlap_variant(job, acc, label="after", num_workers=1, prefetcher=True, **common)
    assert before.copies is None and len(after.copies) >= 4
    assert before.settings["torch_threads"] == ov.choose_threads(0)["torch_threads"]
    assert after.settings["num_workers"] == 1 and not after.settings["side_stream"]
    assert (before.batches["worker"] == -1).all() and (after.batches["worker"] == 0).all()
    assert before.stats.steps == after.stats.steps == 3
    assert after.settings["batches_per_epoch"] == 4 and after.settings["cores"] >= 1
    # synchronous: the loop waits for all of the input
    assert before.stats.hidden_fraction == 0.0
    spans = after.timeline()
    assert {"worker 0 prep", "copy", "data wait", "compute"} <= set(spans["row"])
    verdict = ov.overlap_decision(before, after)
    assert verdict["recommendation"] in ("enable", "leave off")
    assert "->" in verdict["reason"] and verdict["exposed"].a.name == "before"
    assert verdict["dropped"] == (verdict["exposed"].ci_low > 1.0)
    # 16 images in batches of 4: the refill at each epoch start is named
    assert any("only 4 batches per epoch" in n for n in verdict["notes"])

def _fake_run(data, compute, label, work=0.05, **settings):
    steps = phase_table(data, [0.0] * len(data), compute)
    stats = ov.overlap_stats(steps, [work] * len(data))
    return ov.OverlapRun(label=label, run=SimpleNamespace(steps=steps, warmup_steps=0), batches=None, copies=None,
                         stats=stats, settings={"num_workers": 1, **settings})

def test_notebook_05s_exposed_share_lies_inside_the_spread_it_is_shown_with(tmp_path):
    """Issue 36: the verdict showed median exposed / median step beside the quartiles of the per-step fractions
    (exposed / that step's time), a different statistic that need not hold it. Here the short steps wait 1 ms of
    2 ms and the long ones 1 or 9 ms of 20 ms: the per-step fractions' quartiles are 45%-50%, the share 5%."""
    from helpers.results import Records, ResultsStore

    before = _fake_run([0.05, 0.051, 0.049, 0.05, 0.052], [0.1] * 5, "before")
    after = _fake_run([0.001, 0.001, 0.001, 0.009, 0.009], [0.001, 0.001, 0.019, 0.011, 0.011], "after")
    result = ov.OverlapResult(before, (after,), after, ov.overlap_decision(before, after))
    v = ov.verdict(result, context="c", model_width_01=16)
    assert v.value == pytest.approx(0.001 / 0.020) and v.spread["p25"] <= v.value <= v.spread["p75"]
    assert (v.spread["p25"], v.spread["p75"]) == (pytest.approx(0.05), pytest.approx(0.45))  # each step's / 20 ms
    store = ResultsStore(tmp_path / "r.jsonl", notebook=ov.NOTEBOOK)
    out = Records()
    for run in (before, after):
        ov._variant_records(out, run, 4)
    for r in store.write(out):
        if r.metric == "exposed_input_fraction":
            assert r.spread["p25"] <= r.value <= r.spread["p75"], (r.variant, r.value, r.spread)
    for run in (before, after):  # whatever the steps: the median of the values always lies between their quartiles
        assert run.stats.exposed_fraction_p25 <= run.stats.exposed_fraction <= run.stats.exposed_fraction_p75


def test_overlap_verdict_rules():
    before = _fake_run([0.05, 0.051, 0.049, 0.05, 0.052], [0.1] * 5, "before")
    hidden = _fake_run([0.0, 0.001, 0.0, 0.0, 0.001], [0.1, 0.101, 0.099, 0.1, 0.1], "after")
    v = ov.overlap_decision(before, hidden)
    assert v["recommendation"] == "enable" and v["dropped"] and not v["slower"] and v["notes"] == []
    # the input is hidden but the compute got much slower (cores taken by workers): leave it off, and say why
    slow = _fake_run([0.0, 0.001, 0.0, 0.0, 0.001], [0.3, 0.31, 0.29, 0.3, 0.3], "after", cores=2, torch_threads=1)
    v = ov.overlap_decision(before, slow)
    assert v["recommendation"] == "leave off" and v["slower"] and "slower" in v["reason"]
    assert any("cost the step CPU time" in n and "on 2 core(s)" in n for n in v["notes"])
    assert v["compute"].ci_high < 1.0

def test_no_measurable_drop_shows_its_interval():
    """Review item 6: a verdict that calls a drop not measurable shows the interval it used."""
    before = _fake_run([0.05, 0.049, 0.051, 0.05, 0.05], [0.1] * 5, "before")
    same = _fake_run([0.05, 0.049, 0.051, 0.05, 0.05], [0.1] * 5, "after")
    v = ov.overlap_decision(before, same)
    assert v["recommendation"] == "leave off" and "no measurable drop" in v["reason"]
    c = v["exposed"]
    assert c.ci_low <= 1.0 <= c.ci_high and "the interval includes 1" in v["reason"]
    assert f"95% CI {c.ci_low:.2f}-{c.ci_high:.2f}" in v["reason"]
    assert "none of the known causes" in v["reason"]  # and says that no cause was found
    worse = _fake_run([0.07, 0.071, 0.069, 0.07, 0.072], [0.1] * 5, "after")
    assert "rose measurably" in ov.overlap_decision(before, worse)["reason"]

def test_overlap_limits_name_each_cause():
    """Review item 6: when the overlap cannot work, the verdict says why."""
    before = _fake_run([0.05] * 4, [0.1] * 4, "before")
    one_batch = _fake_run([0.06] * 4, [0.1] * 4, "after", batches_per_epoch=1)
    notes = ov.overlap_limits(before, one_batch)
    assert len(notes) == 1 and "1 batch per epoch" in notes[0] and "nothing to prefetch" in notes[0]
    v = ov.overlap_decision(before, one_batch)
    assert v["notes"] == notes and "why: the data gives 1 batch per epoch" in v["reason"]
    few = ov.overlap_limits(before, _fake_run([0.01] * 4, [0.1] * 4, "after", batches_per_epoch=4))
    assert len(few) == 1 and "1 step in 4" in few[0]
    assert ov.overlap_limits(before, _fake_run([0.01] * 4, [0.1] * 4, "after", batches_per_epoch=50)) == []
    # more input work than the workers can prepare during the compute
    long_input = ov.overlap_limits(before, _fake_run([0.01] * 4, [0.02] * 4, "after", work=0.05))
    assert len(long_input) == 1 and "longer than what 1 worker(s) can prepare" in long_input[0]
    assert ov.overlap_limits(before, _fake_run([0.01] * 4, [0.02] * 4, "after", work=0.05, num_workers=3)) == []
    # nothing beside the step
    alone = ov.overlap_limits(before, _fake_run([0.05] * 4, [0.1] * 4, "after", num_workers=0, side_stream=False))
    assert any("nothing runs beside the step" in n for n in alone)
    # nothing to hide in the first place
    hidden_before = _fake_run([0.0005] * 4, [0.1] * 4, "before")
    assert any("already nearly hidden" in n for n in ov.overlap_limits(hidden_before, hidden_before))

def test_overlap_bench_reports_a_note(monkeypatch):
    """overlap_bench's dict carries the verdict's interval and a note saying why the overlap could not work."""
    monkeypatch.setattr(ov.PPOJob, "from_data", classmethod(lambda cls, workload, *a, **k: SimpleNamespace(
        workload=workload)))
    def fake_variant(job, acc, *, label, num_workers, torch_threads=None, **kw):
        if num_workers == 0:
            return _fake_run([0.04] * 5, [0.1] * 5, label, num_workers=0, batches_per_epoch=1,
                             torch_threads=torch_threads, batch_size=12)
        return _fake_run([0.05, 0.051, 0.049, 0.05, 0.05], [0.1] * 5, label, num_workers=num_workers,
                         batches_per_epoch=1, torch_threads=torch_threads, decode_threads=1, batch_size=12)

    monkeypatch.setattr(overlap_runs, "run_overlap_variant", fake_variant)  # run_overlap calls it there
    out = ov.overlap_bench(batch_size=12, num_workers=1, steps=5)
    assert out["batches_per_epoch"] == 1 and out["hidden_fraction"] == 0.0
    assert out["note"] and "1 batch per epoch" in out["note"]
    assert out["recommendation"] == "leave off"
    assert out["exposed_reduction"]["ci_high"] < 1.0  # the exposed input rose
    assert "median" in out["statistic"]
    assert out["torch_threads"] == out["torch_threads_before"] and out["batch_size"] == 12  # like with like

def _tiny_job():
    """A PPOJob on a stand-in index and tokenizer: enough for steps on synthetic batches (no images read)."""
    index = SimpleNamespace(n_classes=3, __len__=lambda: 0)
    tokenizer = SimpleNamespace(get_vocab_size=lambda: 16)
    return PPOJob(index, tokenizer, Workload(batch_size=4, image_size=16, text_len=4, model_width=4, d_model=8))

def test_compute_thread_scaling_restores_threads():
    acc = get_accelerator("cpu")
    previous = torch.get_num_threads()
    job = _tiny_job()
    df = ov.compute_thread_scaling(job, acc, threads=[1], repeats=3, warmup=0)
    assert list(df["torch_threads"]) == [1] and (df["median_s"] > 0).all()
    assert torch.get_num_threads() == previous
    with pytest.raises(ParameterError):
        ov.compute_thread_scaling(job, acc, threads=[0])

def test_plots_draw_from_the_tables(small_data):
    import matplotlib

    matplotlib.use("Agg")
    from helpers.experiments.pinning import host_copy_sweep
    from helpers.workbook import plots_transfer as pt

    fig = pt.bandwidth_vs_size(host_copy_sweep([4096, 8192], repeats=3, warmup=0))
    assert fig.axes
    before = _fake_run([0.05] * 3, [0.1] * 3, "before")
    fig = pt.exposed_vs_hidden([("before", before.stats)])
    assert fig.axes
    phases = pd.DataFrame({"step": [0, 0, 0], "phase": ["data", "h2d", "compute"], "start_s": [0.0, 0.1, 0.2],
                           "duration_s": [0.1, 0.1, 0.5]})
    log = pd.DataFrame({"order": [0], "return_s": [10.1], "prep_start_s": [9.9], "prep_end_s": [10.0],
                        "prep_s": [0.1], "worker": [-1]})
    fig = pt.overlap_timeline([("x", ov.timeline_frame(phases, log, skip=0))])
    assert len(fig.axes) == 1

def test_timeline_panels_share_one_axis_and_keep_short_copies_visible():
    import matplotlib

    matplotlib.use("Agg")
    from helpers.workbook import plots_transfer as pt

    def spans(step_s, n=6):
        rows = []
        for k in range(n):
            rows += [("copy", "copy", k * step_s, 0.0002, k),
                     ("compute", "compute", k * step_s + 0.001, step_s - 0.001, k)]
        return pd.DataFrame(rows, columns=["row", "kind", "start_s", "duration_s", "batch"])

    fig = pt.overlap_timeline([("slow", spans(0.2)), ("fast", spans(0.05))])
    top, bottom = fig.axes[0], fig.axes[1]
    assert top.get_xlim() == bottom.get_xlim() and top.get_xlim()[1] >= 6 * 0.2 * 1e3
    window = top.get_xlim()[1] - top.get_xlim()[0]
    for ax in (top, bottom):
        copy_lane = ax.collections[0]  # first lane drawn: copy
        widths = [path.get_extents().width for path in copy_lane.get_paths()]
        assert len(widths) == 6 and min(widths) >= pt.MIN_SPAN_FRACTION * window * 0.999

def test_exposed_vs_hidden_draws_the_medians():
    import matplotlib

    matplotlib.use("Agg")
    from helpers.workbook import plots_transfer as pt

    run = _fake_run([0.002, 0.002, 0.002, 0.05, 0.002], [0.03, 0.03, 0.03, 0.03, 0.2], "after", work=0.008)
    fig = pt.exposed_vs_hidden([("after", run.stats)])
    widths = sorted(round(r.get_width(), 6) for r in fig.axes[0].patches)
    # compute 30, exposed 2 (twice: step bar and input bar), hidden 8 - 2 = 6 ms: the medians, not the means
    assert widths == sorted([30.0, 2.0, 2.0, 6.0])
    texts = " ".join(t.get_text() for t in fig.axes[0].texts)
    assert f"{run.stats.hidden_fraction:.0%} hidden" in texts and "75% hidden" in texts

def test_baseline_workload_reads_notebook_01s_run_or_its_defaults(tmp_path):
    """Review item 10: notebook 05 says which model it trains against notebook 01's."""
    from helpers.results import ResultsStore

    values, source = ov.baseline_workload(None)
    assert values["model_width"] == 16 and source == "notebook 01's defaults"
    assert set(values) == set(ov.WORKLOAD_PARAMS)
    assert ov.baseline_workload(tmp_path / "missing.jsonl")[1] == "notebook 01's defaults"
    path = tmp_path / "results.jsonl"
    params = {"batch_size": 8, "image_size": 64, "text_len": 12, "model_width": 8, "d_model": 32, "steps": 4}
    ResultsStore(path, notebook="01_baseline_profiling", device="cpu", parameters=params).add(
        "x", "y", "z", 1.0, "s")
    ResultsStore(path, notebook="05_stream_overlap", device="cpu", parameters={**params, "model_width": 32}).add(
        "x", "y", "z", 1.0, "s")
    values, source = ov.baseline_workload(path)
    assert values == {k: params[k] for k in ov.WORKLOAD_PARAMS} and "this results file" in source


# --------------------------------------------------------------------------- the notebook's result


BEFORE, AFTER = "before, 1 torch thread(s)", "after, 1 core per worker (1 torch thread(s))"


def _notebook_result(job, *, compute_01=None, base_width=16, overlap=None):
    before = _fake_run([0.05, 0.051, 0.049, 0.05, 0.052], [0.1] * 5, BEFORE, num_workers=0, torch_threads=1,
                       side_stream=False, batches_per_epoch=6, batch_size=4)
    after = _fake_run([0.0, 0.001, 0.0, 0.0, 0.001], [0.1, 0.101, 0.099, 0.1, 0.1], AFTER,
                      torch_threads=1, side_stream=False, batches_per_epoch=6, batch_size=4)
    overlap = overlap or ov.OverlapResult(before, (after,), after, ov.overlap_decision(before, after),
                                          befores=(before,))
    scaling = pd.DataFrame({"torch_threads": [1, 2], "median_s": [0.2, 0.1], "p25_s": [0.19, 0.09],
                            "p75_s": [0.21, 0.11]})
    settings = {"model_width": 4, "d_model": 8, "image_size": 16, "text_len": 4, "steps": 5, "warmup_steps": 1,
                "num_workers": 1, "prefetch_factor": 2, "data_dir": "", "job": "" if job.is_builtin else "mine.py:make"}
    return ov.StreamOverlapResult(
        job=job, device="cpu", settings=settings, n_items=24, per_epoch=6,
        dataset={"skipped": 0, "classes": 3} if job.is_builtin else {},
        check={"batches": 6, "identical": 6, "structure_equal": 6, "reproducible": True, "side_stream": False},
        cores=2, splits=({"label": "1 core per worker", "torch_threads": 1, "decode_threads": 1, "reason": "r"},),
        scaling=scaling, base={"batch_size": 4, "image_size": 16, "text_len": 4, "model_width": base_width,
                               "d_model": 8} if job.is_builtin else {"model_width": 4},
        base_source="notebook 01's defaults", compute_01=compute_01, overlap=overlap)


VARIANT_RECORDS = [("overlap", "exposed_input_fraction", "fraction"), ("overlap", "hidden_fraction", "fraction"),
                   ("step time", "time_per_step", "s"), ("step time", "throughput", "samples/s"),
                   ("input work", "input_work_per_step", "s"), ("compute", "compute_per_step", "s")]


def _keys(result, tmp_path):
    from helpers.results import ResultsStore

    store = ResultsStore(tmp_path / "r.jsonl", notebook="05_stream_overlap")
    return [(r.experiment, r.variant, r.metric, r.unit) for r in store.write(result.records())]


def test_the_built_in_jobs_result_records_every_variant_and_names_notebook_01(tmp_path):
    at_01 = pd.DataFrame({"torch_threads": [2], "median_s": [0.3], "p25_s": [0.29], "p75_s": [0.31]})
    r = _notebook_result(_tiny_job(), compute_01=at_01)
    variants = [(e, v, m, u) for v in (BEFORE, AFTER) for e, m, u in VARIANT_RECORDS]
    assert _keys(r, tmp_path) == [
        ("dataset", "usable images", "images", "images"),
        ("correctness", "prefetched vs synchronous", "identical_batches", "batches"),
        ("compute only", "1 torch thread(s)", "time_per_step", "s"), ("compute only", "2 torch thread(s)", "time_per_step", "s"),
        ("compute only", "model_width 16 (notebook 01's), 2 torch thread(s)", "time_per_step", "s"),
        *variants,
        ("exposed input per step", f"{AFTER} vs {BEFORE}", "reduction", "x"),
        ("step time", f"{AFTER} vs {BEFORE}", "speedup", "x")]
    v = r.verdict()
    assert v.notebook == "05_stream_overlap" and v.recommendation == "enable" and v.extra["model_width_01"] == 16
    assert v.context.startswith("PPO on a multimodal policy (4-channel conv stem, d_model 8; notebook 01 trains "
                                "model_width 16 (notebook 01's defaults)")
    assert "100 ms compute vs 50 ms input work, 300 ms at 01's width), batch 4 of 16 px from 24 images" in v.context
    assert v.context.endswith("5 measured steps each on cpu; figures are medians over the steps, fractions ratios of "
                              "those medians")
    assert "before: num_workers=0, synchronous copy, 1 torch thread(s), batch 4; after: 1 worker(s)" in v.context
    assert "DevicePrefetcher (synchronous copy), 1 torch thread(s), batch 4;" in v.context
    assert "both at 1 torch thread(s), batch 4" in v.reason
    assert (v.extra["a_torch_threads"], v.extra["b_torch_threads"], v.extra["b_batch_size"]) == (1, 1, 4)
    assert r.dataset_text().startswith("24 images, 3 class(es), 0 file(s) skipped, 6 batch(es) of 4 per epoch")
    assert "few batches per epoch" in r.dataset_text()
    assert r.identical_text() == "6 of 6 prefetched batches are bit-identical to the synchronous copy"
    assert "300.0 ms at notebook 01's 16, which covers it" in r.variants_text()
    assert r.kept_split == "1 core per worker" and list(r.overlap_table()["variant"]) == [BEFORE, AFTER]
    assert list(r.overlap_table()["torch threads"]) == [1, 1] and list(r.overlap_table()["batch"]) == [4, 4]
    spec = r.try_it(get_accelerator("cpu"), {"num_workers": 1, "model_width": 4, "prefetch_factor": 2, "steps": 20,
                                             "warmup_steps": 3})
    assert set(spec.knobs) == {"num_workers", "model_width", "threads"} and spec.knobs["model_width"].value == 4
    assert spec.reference.label == "width 4, 1 worker(s), 1 core per worker"


def test_a_users_jobs_result_records_its_items_and_offers_no_model_width(tmp_path):
    job = SimpleNamespace(is_builtin=False, model_width=None, name="mine", workload=Workload(batch_size=4),
                          describe=lambda: {"job": "mine", "batch_size": 4})
    r = _notebook_result(job)
    keys = _keys(r, tmp_path)
    assert keys[0] == ("dataset", "your job", "items", "items") and len(keys) == 2 + 2 + 12 + 2
    v = r.verdict()
    assert v.context.startswith("your job 'mine' (100 ms compute vs 50 ms input work per step, the input work read "
                                "from the synchronous run), batch 4 from 24 items (6 batch(es) per epoch)")
    assert r.workload_text().startswith("your job's own model and batch of 4")
    spec = r.try_it(get_accelerator("cpu"), {"num_workers": 1, "model_width": 4, "prefetch_factor": 2, "steps": 20,
                                             "warmup_steps": 3})
    assert "model_width" not in spec.knobs and spec.reference.label == "1 worker(s), 1 core per worker"


# --------------------------------------------------------------------------- like with like


def _split_runs(monkeypatch, *, legacy=False, slow_threads=2):
    """run_overlap on a busy 2-core machine, faked: the step costs 100 ms of compute at one torch thread count and
    300 ms at the other (``slow_threads``: 2, oversubscribed), the before waits 50 ms for its input, the after none.
    ``legacy``: the before ignores the thread count it is given and runs at all cores, as notebook 05 did before
    it compared like with like."""
    calls = []

    def fake_variant(job, acc, *, label, num_workers, torch_threads=None, **kw):
        threads = 2 if legacy and num_workers == 0 else torch_threads
        calls.append((num_workers, threads))
        compute = [0.3, 0.301, 0.299, 0.3, 0.3] if threads == slow_threads else [0.1, 0.101, 0.099, 0.1, 0.1]
        data = [0.05, 0.051, 0.049, 0.05, 0.05] if num_workers == 0 else [0.0, 0.001, 0.0, 0.0, 0.001]
        return _fake_run(data, compute, label, num_workers=num_workers, torch_threads=threads, batch_size=4,
                         prefetcher=num_workers > 0, side_stream=False, batches_per_epoch=6, cores=2)

    monkeypatch.setattr(overlap_runs, "run_overlap_variant", fake_variant)
    job = SimpleNamespace(workload=Workload(batch_size=4))
    return ov.run_overlap(job, get_accelerator("cpu"), steps=5, warmup_steps=0, num_workers=1, cores=2), calls


def _records(result, tmp_path):
    from helpers.results import ResultsStore

    return ResultsStore(tmp_path / "r.jsonl", notebook=ov.NOTEBOOK).write(result.records())


def test_the_before_runs_at_the_torch_threads_of_the_after_it_is_compared_with(monkeypatch, tmp_path):
    """The issue: 05 credited a 3.23x speedup to the overlap that came from the step running on 1 torch thread
    instead of 2. The verdict's before now runs at the kept after's thread count; the threads' effect is apart."""
    from helpers.conditions import unlike_records

    r, calls = _split_runs(monkeypatch)
    assert calls == [(0, 1), (1, 1), (1, 2)]  # before, then after at each split: 1 core per worker, all cores
    assert r.after.settings["torch_threads"] == r.before.settings["torch_threads"] == 1
    assert r.verdict["step"].ratio == pytest.approx(0.15 / 0.1, rel=0.02)  # the overlap's own gain, not 0.35 / 0.1
    assert set(r.thread_effect) == {"after"}  # the same variant at 2 and 1 threads, apart from the overlap
    assert r.thread_effect["after"].ratio == pytest.approx(0.3 / 0.1, rel=0.02)
    result = _notebook_result(_tiny_job(), overlap=r)
    records = _records(result, tmp_path)
    assert unlike_records(records) == []
    pairs = [x for x in records if x.experiment == "step time" and x.metric == "speedup"]
    assert len(pairs) == 1 and pairs[0].extra["kept"] and pairs[0].extra["a_torch_threads"] == 1
    split = [x for x in records if x.experiment == "thread split"]
    assert len(split) == 1 and split[0].extra["changes"] == ["torch_threads"]
    assert (split[0].extra["a_torch_threads"], split[0].extra["b_torch_threads"]) == (2, 1)
    assert [v.label for v in r.variants] == ["before, 1 torch thread(s)", "after, 1 core per worker (1 torch "
                                             "thread(s))", "after, all cores to torch (2 torch thread(s))"]
    text = result.variants_text()
    assert "against before, 1 torch thread(s): both at 1 torch thread(s), batch 4" in text
    assert ("thread split alone (after, same variant at two torch thread counts): after, 1 core per worker (1 torch "
            "thread(s)) 3.00x faster per step than after, all cores to torch (2 torch thread(s))") in text
    v = result.verdict()
    assert v.extra["thread_effect"]["after"]["ratio"] == pytest.approx(0.3 / 0.1, rel=0.02)
    assert "both at 1 torch thread(s), batch 4" in v.reason


def test_a_kept_after_at_the_other_thread_count_gets_its_own_before(monkeypatch, tmp_path):
    from helpers.conditions import unlike_records

    r, calls = _split_runs(monkeypatch, slow_threads=1)  # here all cores to torch is the faster
    assert calls == [(0, 1), (1, 1), (1, 2), (0, 2)]
    assert r.after.settings["torch_threads"] == r.before.settings["torch_threads"] == 2
    assert r.verdict["step"].ratio == pytest.approx(0.15 / 0.1, rel=0.02)
    assert r.thread_effect["before"].ratio == pytest.approx(0.15 / 0.35, rel=0.02)  # 2 (A) vs 1 (B): 1 slower here
    records = _records(_notebook_result(_tiny_job(), overlap=r), tmp_path)
    assert unlike_records(records) == []
    pairs = [x for x in records if x.experiment == "step time" and x.metric == "speedup"]
    assert [(x.extra["kept"], x.extra["a_torch_threads"]) for x in pairs] == [(False, 1), (True, 2)]
    assert len([x for x in records if x.experiment == "thread split"]) == 2


def test_the_like_with_like_check_fails_on_the_old_thread_split(monkeypatch, tmp_path):
    """The old behaviour (one before at all cores, compared with the fastest after, at 1 torch thread) is what the
    check of tests/test_like_with_like.py catches: its comparison records name two thread counts."""
    from helpers.conditions import unlike_records

    r, calls = _split_runs(monkeypatch, legacy=True)
    assert calls[:3] == [(0, 2), (1, 1), (1, 2)]
    assert r.verdict["step"].ratio == pytest.approx(0.35 / 0.1, rel=0.02)  # the lie: 3.5x, mostly the threads'
    assert "NOT like with like: before at 2 torch thread(s)" in r.verdict["reason"]
    problems = unlike_records(_records(_notebook_result(_tiny_job(), overlap=r), tmp_path))
    assert problems and any("different torch_threads: 2 (A) and 1 (B)" in p for p in problems)
    # and so on the old result's shape: one before, compared with the fastest after
    old = ov.OverlapResult(r.befores[0], r.candidates, r.after, r.verdict)
    assert old.befores == (r.befores[0],)
    assert unlike_records(_records(_notebook_result(_tiny_job(), overlap=old), tmp_path / "old"))


def test_thread_split_effect_compares_one_variant_only():
    one = _fake_run([0.0] * 3, [0.1] * 3, "a", torch_threads=1, num_workers=1)
    two = _fake_run([0.0] * 3, [0.2] * 3, "b", torch_threads=2, num_workers=1)
    c = ov.thread_split_effect([one, two])
    assert (c.a.name, c.b.name) == ("b", "a") and c.ratio == pytest.approx(2.0)
    assert ov.thread_split_effect([one]) is None and ov.thread_split_effect([one, one]) is None
    with pytest.raises(ParameterError, match="num_workers"):
        ov.thread_split_effect([one, _fake_run([0.0] * 3, [0.2] * 3, "c", torch_threads=2, num_workers=0)])
