"""Notebook 10's job builder: choosing the optimizations, the jobs, interleaving, learning gate, projection."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import pytest
import torch

from helpers.device import get_accelerator
from helpers.errors import ParameterError
from helpers.experiments import training
from helpers.experiments.base import JobPlan
from helpers.experiments.e2e_checks import ablation_frame, attribute, compute_side_lines, contribution_decision, project
from helpers.experiments.e2e_jobs import (OPTIMIZATIONS, JobConfig, JobSummary, JobVariant, ablation_configs,
                                          check_optimizations, plan_for, run_interleaved, same_input_check, speedup,
                                          summarize, summary_frame)
from helpers.experiments.e2e_select import SOURCE_NOTEBOOKS, device_defaults, select_optimizations
from helpers.experiments.e2e_verdict import batch_size_note, e2e_verdict, next_step, target_sentence
from helpers.jobs.base import Workload
from helpers.jobs.ppo import PPOJob
from helpers.pipeline.dataset import build_embedded, load_dataset
from helpers.pipeline.text import load_or_build_tokenizer
from helpers.results import ResultsStore, load_results
from helpers.timing import Comparison, Measurement
from helpers.units import format_value
from helpers.verdict import Action

TINY = Workload(batch_size=4, image_size=32, text_len=4, model_width=4, d_model=8, seed=0)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    index = load_dataset(build_embedded(tmp_path_factory.mktemp("emb") / "d", n_images=12, seed=3))
    return index, load_or_build_tokenizer(index, text_len=TINY.text_len)


@pytest.fixture(scope="module")
def cpu():
    return get_accelerator("cpu")


# ------------------------------------------------------------------ choosing


def test_check_optimizations_orders_and_rejects():
    assert check_optimizations(["auto"]) == ("auto",)
    assert check_optimizations(["channels_last", "batched_decode", "channels_last"]) == (
        "batched_decode", "channels_last")
    assert check_optimizations([]) == ()
    with pytest.raises(ParameterError, match="valid: auto, batched_decode"):
        check_optimizations(["batched_decoding"])
    with pytest.raises(ParameterError, match="mixes 'auto'"):
        check_optimizations(["auto", "prefetcher"])
    with pytest.raises(ParameterError, match="list of names"):
        check_optimizations("auto")


def test_cpu_defaults_keep_host_side_helpers_off(cpu):
    d = device_defaults(cpu, native_bf16=True)
    assert d["batched_decode"][0] and d["channels_last"][0]
    assert not d["dataloader_workers"][0] and not d["pinned_memory"][0] and not d["prefetcher"][0]
    assert d["mixed_precision"][0] == ("bfloat16" in cpu.capabilities.autocast_dtypes)
    assert not device_defaults(cpu, native_bf16=False)["mixed_precision"][0]


def test_npu_defaults_never_use_channels_last(cpu):
    from dataclasses import replace

    caps = replace(cpu.capabilities, autocast_dtypes=("bfloat16", "float16"))

    @dataclass
    class FakeNpu:
        kind: str = "npu"
        is_cpu: bool = False
        capabilities: object = caps

    d = device_defaults(FakeNpu())
    assert not d["channels_last"][0] and "NCHW" in d["channels_last"][1]
    assert d["dataloader_workers"][0] and d["mixed_precision"][0]


def _results(tmp_path, verdicts):
    path = tmp_path / "results.jsonl"
    for nb, rec, extra, params in verdicts:
        ResultsStore(path, notebook=nb, parameters=params).verdict(
            metric="speedup", value=1.5, unit="x", recommendation=rec, reason="test", **extra)
    return load_results(path)


def test_auto_follows_verdicts_and_reports_missing(tmp_path, cpu):
    df = _results(tmp_path, [
        ("02_batched_decode", "enable", {}, {}),
        # the worker count comes from the verdict's structured action, not from its wording
        ("03_dataloader_tuning", "enable", {"best_setting": "workers=9, prefetch=4, persistent",
                                            "action": Action("num_workers", 3, "DataLoader workers=3")}, {}),
        ("06_mixed_precision", "leave off", {}, {"autocast_dtype": "auto"}),
        ("07_channels_last", "enable", {}, {}),
    ])
    sel = select_optimizations(["auto"], df, cpu, native_bf16=True)
    assert sel.optimizations == ("batched_decode", "dataloader_workers", "channels_last")
    assert sel.num_workers == 3
    assert sel.missing == ("04_pinned_memory", "05_stream_overlap")
    by = {c.name: c for c in sel.choices}
    assert by["mixed_precision"].source == "verdict" and not by["mixed_precision"].enabled
    assert by["pinned_memory"].source == "not measured" and not by["pinned_memory"].enabled  # no verdict: off
    lines = sel.missing_lines()
    assert "04_pinned_memory, 05_stream_overlap" in lines[0]
    assert f"{sys.executable} -m helpers run --only 04 05 10" in lines[1]  # runnable from a fresh shell
    assert sel.job().num_workers == 3


def test_auto_without_results_enables_nothing_unless_device_defaults_are_asked_for(cpu):
    sel = select_optimizations(["auto"], None, cpu, native_bf16=False)
    assert sel.missing == tuple(dict.fromkeys(SOURCE_NOTEBOOKS.values()))  # 02 decides two, listed once
    assert sel.optimizations == () and set(sel.frame()["source"]) == {"not measured"}  # no guessing
    assert "not enabled, not measured in this run: batched_decode, dataset_cache" in sel.missing_lines()[0]
    assert "--only 02 03 04 05 06 07 10" in sel.missing_lines()[1]
    # bench end-to-end without --run: the device's stated defaults, labelled as such
    sel = select_optimizations(["auto"], None, cpu, native_bf16=False, device_defaults_for_missing=True)
    assert sel.optimizations == ("batched_decode", "channels_last")  # no cache on disk without 02's verdict
    assert set(sel.frame()["source"]) == {"device default"}
    assert "device default: on" in {c.name: c for c in sel.choices}["channels_last"].detail
    assert "device's stated default is used" in sel.missing_lines()[0]


def test_auto_enables_exactly_what_this_runs_verdicts_recommended(tmp_path, cpu):
    """--only 01 03 06 10: 03 and 06 recommended; channels_last (07 not in the run) is not guessed on."""
    df = _results(tmp_path, [
        ("01_baseline_profiling", "host-bound", {}, {}),
        ("03_dataloader_tuning", "enable", {"action": Action("num_workers", 2, "DataLoader workers=2")}, {}),
        ("06_mixed_precision", "enable", {}, {"autocast_dtype": "auto"}),
    ])
    sel = select_optimizations(["auto"], df, cpu, native_bf16=True)
    assert sel.optimizations == ("dataloader_workers", "mixed_precision") and sel.num_workers == 2
    by = {c.name: c for c in sel.choices}
    for name in ("batched_decode", "dataset_cache", "pinned_memory", "prefetcher", "channels_last"):
        assert not by[name].enabled and by[name].source == "not measured", name
    assert "no verdict from 07" in by["channels_last"].detail
    assert sel.missing == ("02_batched_decode", "04_pinned_memory", "05_stream_overlap", "07_channels_last")
    first, command = sel.missing_lines()
    assert "channels_last" in first and "enables only what a verdict of this run recommended" in first
    assert "--only 02 04 05 07 10" in command


def test_explicit_list_selects_exactly_those(tmp_path, cpu):
    df = _results(tmp_path, [("02_batched_decode", "leave off", {}, {})])
    sel = select_optimizations(["mixed_precision", "batched_decode"], df, cpu)
    assert sel.optimizations == ("batched_decode", "mixed_precision") and sel.missing == ()
    assert sel.missing_lines() == []
    with pytest.raises(ParameterError, match="unknown optimization"):
        select_optimizations(["fast"], df, cpu)


def test_job_config_without_and_label():
    cfg = JobConfig("opt", ("batched_decode", "mixed_precision", "channels_last"), amp_dtype="bfloat16")
    abl = ablation_configs(cfg)
    assert [c.name for c in abl] == ["without batched_decode", "without mixed_precision", "without channels_last"]
    assert abl[1].optimizations == ("batched_decode", "channels_last")
    assert "mixed_precision (bfloat16)" in cfg.label()
    assert JobConfig("b").label() == "none (baseline)"
    with pytest.raises(ParameterError):
        JobConfig("x", ("warp",))
    with pytest.raises(ParameterError):
        JobConfig("x", amp_dtype="float8")


# ------------------------------------------------------------------ jobs


def test_baseline_and_batched_jobs_see_the_same_batches(data, cpu):
    index, tok = data
    base = JobVariant(JobConfig("baseline"), PPOJob(index, tok, TINY), cpu)
    fast = JobVariant(JobConfig("fast", ("batched_decode",)), PPOJob(index, tok, TINY), cpu)
    try:
        bi, fi = base.batches(), fast.batches()
        n_per_epoch = len(index) // TINY.batch_size
        for _ in range(n_per_epoch + 1):  # crosses an epoch boundary
            b, f = next(bi), next(fi)
            assert torch.equal(b["label"], f["label"]) and torch.equal(b["tokens"], f["tokens"])
            bx, _, _ = base.transfer(b, cpu)
            fx, _, _ = fast.transfer(f, cpu)
            assert bx.shape == fx.shape == (TINY.batch_size, 3, TINY.image_size, TINY.image_size)
            # same crops and flips: the batched decode matches the reference pixels closely
            assert (bx - fx).abs().mean() < 0.1
    finally:
        base.close()
        fast.close()


def test_jobs_start_from_the_same_weights_and_time_every_phase(data, cpu):
    index, tok = data
    jobs = [JobVariant(JobConfig("baseline"), PPOJob(index, tok, TINY), cpu),
            JobVariant(JobConfig("opt", ("batched_decode", "mixed_precision", "channels_last")),
                       PPOJob(index, tok, TINY), cpu)]
    try:
        w0 = [next(j.trainer.model.parameters()).detach().clone() for j in jobs]
        assert torch.equal(w0[0], w0[1])
        assert jobs[1].trainer.model.image_encoder is not None
        run_interleaved(jobs, steps=3, warmup_steps=1, block=2)
        for j in jobs:
            df = j.steps_frame()
            assert len(df) == 3 and len(j.steps_frame(measured_only=False)) == 4
            assert (df[["data", "h2d", "compute"]] >= 0).all().all()
            assert (abs(df["data"] + df["h2d"] + df["compute"] - df["step_s"]) < 1e-9).all()
            assert df["value_loss"].notna().all()
            s = summarize(j)
            assert s.steps == 3 and s.throughput == pytest.approx(TINY.batch_size / s.step_median_s)
            assert s.peak_memory_bytes is None  # CPU: no device allocator
        c = speedup(jobs[0], jobs[1])
        assert c.ratio == pytest.approx(jobs[0].measurement().median_s / jobs[1].measurement().median_s)
        table = summary_frame([summarize(j) for j in jobs])
        assert list(table.index) == ["baseline", "opt"]
    finally:
        for j in jobs:
            j.close()


def test_channels_last_job_feeds_nhwc_images(data, cpu):
    index, tok = data
    job = JobVariant(JobConfig("cl", ("channels_last",)), PPOJob(index, tok, TINY), cpu)
    try:
        images, _, _ = job.transfer(next(job.batches()), cpu)
        assert images.is_contiguous(memory_format=torch.channels_last)
    finally:
        job.close()


class FakeJob:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def run(self, steps, *, measured=True):
        self.log.append((self.name, steps, measured))


def test_run_interleaved_rotates_blocks_and_warms_up_first():
    log = []
    jobs = [FakeJob("A", log), FakeJob("B", log), FakeJob("C", log)]
    run_interleaved(jobs, steps=5, warmup_steps=2, block=2)
    assert log[:3] == [("A", 2, False), ("B", 2, False), ("C", 2, False)]
    assert [x[0] for x in log[3:]] == list("ABCCBAABC")
    assert [x[1] for x in log[-3:]] == [1, 1, 1]
    for name in "ABC":
        assert sum(n for j, n, m in log if j == name and m) == 5
    with pytest.raises(ParameterError):
        run_interleaved(jobs, steps=0, warmup_steps=0)


# ------------------------------------------------------------------ learning, projection, verdict


def test_learning_check_gate():
    base = [1.0] * 10
    ok = training.learning_check(base, [1.05] * 10, 0.10)
    assert ok.ok and ok.tail == 3 and ok.rel_diff == pytest.approx(0.05) and "within" in ok.sentence()
    bad = training.learning_check(base, [1.2] * 10, 0.10)
    assert not bad.ok and "OUTSIDE" in bad.sentence()
    nan = training.learning_check(base, [1.0] * 9 + [math.nan], 0.10)
    assert not nan.ok and not nan.no_nan and "NaN" in nan.sentence()
    with pytest.raises(ParameterError):
        training.learning_check([1.0, 1.0], [1.0], 0.1)


def test_learning_check_measures_a_falling_loss_on_how_far_it_fell():
    """A classifier fitting its batches: 2.4 -> 0.26 against 2.4 -> 0.235 learned the same (10% of the level,
    1% of the decrease); one that barely learned is off by most of the decrease, whatever the level."""
    base = [2.4 - 2.14 * i / 29 for i in range(30)]
    close = [v - 0.025 * i / 29 for i, v in enumerate(base)]
    same = training.learning_check(base, close, 0.10)
    assert same.ok and same.level == pytest.approx(0.4076, abs=1e-3) and same.decrease > 1.8
    assert same.rel_diff == pytest.approx(same.abs_diff / same.decrease) and same.rel_diff < 0.02
    assert "of the loss's scale over the run (its decrease" in same.sentence()
    slow = [2.4 - 1.0 * i / 29 for i in range(30)]
    broken = training.learning_check(base, slow, 0.10)
    assert not broken.ok and broken.rel_diff > 0.5
    flat = training.learning_check([1.0] * 10, [1.05] * 10, 0.10)  # no decrease: compared with the level
    assert flat.scale == pytest.approx(1.0) and "its final level" in flat.sentence()


def _cmp(a_ms, b_ms):
    a = Measurement("baseline", tuple(t / 1e3 for t in a_ms), 0, 32)
    b = Measurement("opt", tuple(t / 1e3 for t in b_ms), 0, 32)
    return Comparison.from_measurements(a, b)


def test_projection_and_sentence():
    c = _cmp([300, 300, 300, 300], [100, 100, 100, 100])
    p = project(100_000, c.a, c)
    assert p.before_s == pytest.approx(30_000) and p.after_s == pytest.approx(10_000)
    assert p.after_range_s == (pytest.approx(10_000), pytest.approx(10_000))
    assert p.unit() == ("hours", 3600.0)
    assert "8.3 hours before (between 8.3 and 8.3 " in p.sentence()
    assert "-> 2.8 hours after (between 2.8 and 2.8 " in p.sentence()
    big = project(10_000_000, c.a, c)  # 3e6 s = 34.7 days: every number in days, the after too
    assert big.unit()[0] == "days" and "34.7 days before" in big.sentence() and "11.6 days after" in big.sentence()
    with pytest.raises(ParameterError):
        project(0, c.a, c)


def test_ablation_contribution():
    full = _cmp([300] * 4, [100] * 4)
    without = {"batched_decode": _cmp([300] * 4, [200] * 4), "channels_last": _cmp([300] * 4, [100] * 4)}
    df = ablation_frame(full, without)
    assert df.loc["all", "speedup"] == pytest.approx(3.0)
    assert df.loc["without batched_decode", "contribution"] == pytest.approx(2.0)
    assert df.loc["without channels_last", "contribution"] == pytest.approx(1.0)
    assert math.isnan(df.loc["without batched_decode", "contribution_low"])  # no interval without contributions


def _m(name, ms):
    return Measurement(name, tuple(t / 1e3 for t in ms), 0, 32)


def test_contribution_interval_decides_keep_drop_or_nothing():
    opt = [100, 102, 98, 101, 99, 100]
    keep = Comparison.from_measurements(_m("without a", [200, 205, 195, 201, 199, 200]), _m("opt", opt))
    drop = Comparison.from_measurements(_m("without b", [80, 81, 79, 80, 82, 78]), _m("opt", opt))
    none = Comparison.from_measurements(_m("without c", [99, 103, 97, 101, 100, 102]), _m("opt", opt))
    assert keep.ratio == pytest.approx(2.0, rel=0.02)
    assert contribution_decision(keep) == "keep it"
    assert contribution_decision(drop) == "drop it here"
    assert contribution_decision(none) == "no measurable contribution here"
    full = Comparison.from_measurements(_m("baseline", [300] * 6), _m("opt", opt))
    without = {n: Comparison.from_measurements(_m("baseline", [300] * 6), c.a)
               for n, c in (("a", keep), ("b", drop), ("c", none))}
    df = ablation_frame(full, without, {"a": keep, "b": drop, "c": none})
    assert df.loc["without b", "decision"] == "drop it here"
    assert df.loc["without b", "contribution_high"] < 1.0
    assert df.loc["without a", "contribution"] == pytest.approx(keep.ratio)
    # the verdict names what to drop and what does nothing, with the interval
    learned = training.learning_check([1.0] * 6, [1.0] * 6, 0.1)
    base = JobSummary("baseline", "none", 0.3, 0.29, 0.31, 0.23, 0.0, 0.07, 100.0, 0.77, 0.23, None, 6)
    v = e2e_verdict(full, learned, base, JobConfig("opt", ("batched_decode", "channels_last")),
                    host_bound_threshold=0.1, ablation=df)
    assert "b: drop it here" in v.reason and "c: no measurable contribution in this end-to-end job" in v.reason
    assert "a: " not in v.reason.split("ablation:")[1]
    v = e2e_verdict(full, learned, base, JobConfig("opt", ("batched_decode", "channels_last")),
                    host_bound_threshold=0.1, ablation=df, recommended=("c",), batch_note="notebook 09 says X")
    assert "c: recommended by notebook ??, but no measurable" in v.reason and "; notebook 09 says X;" in v.reason


def _steps(data, h2d, compute):
    import pandas as pd

    df = pd.DataFrame({"data": data, "h2d": h2d, "compute": compute}) / 1e3
    df["step_s"] = df["data"] + df["h2d"] + df["compute"]
    return df


def test_attribution_decides_on_the_phases_it_acts_on():
    n = 12
    jitter = [0.0, 0.3, -0.3, 0.2, -0.2, 0.1, -0.1, 0.25, -0.25, 0.15, -0.15, 0.05]
    opt = _steps([24 + j for j in jitter], [0.8] * n, [36 + j for j in jitter])
    # without channels_last: same compute and h2d, but a slower data phase (it does not touch it)
    wo = _steps([30 + j for j in jitter], [0.8] * n, [36 - j for j in jitter])
    a = attribute("channels_last", opt, wo)
    assert a.phases == ("h2d", "compute") and a.decision == "no measurable contribution here"
    assert a.step.ci_low > 1.0  # the whole step was faster with it...
    assert "not attributable here (the difference is in the data phase" in a.note  # ...but not because of it
    assert "acts on the h2d+compute phases" in a.sentence() and "whole step" in a.sentence()
    # the input side acts on data+h2d: the same numbers keep batched_decode
    b = attribute("batched_decode", opt, wo)
    assert b.decision == "keep it" and b.note == "" and b.phase.ci_low > 1.0
    # its phase faster, the whole step slower (e.g. workers taking cores): drop it, and say where
    wo2 = _steps([30 + j for j in jitter], [0.8] * n, [20 + j for j in jitter])
    c = attribute("dataloader_workers", opt, wo2)
    assert c.decision == "drop it here" and "the difference is in the compute phase" in c.note
    df = ablation_frame(_cmp([300] * 4, [60] * 4), {"channels_last": _cmp([300] * 4, [66] * 4)},
                        {"channels_last": a.step}, {"channels_last": a})
    row = df.loc["without channels_last"]
    assert row["decision"] == "no measurable contribution here" and row["phases"] == "h2d+compute"
    assert row["phase_low"] <= 1.0 <= row["phase_high"] and "not attributable" in row["note"]
    with pytest.raises(ParameterError):
        attribute("nope", opt, wo)


def test_batch_size_note_only_when_09_recommended_another_batch(tmp_path):
    import pandas as pd

    assert batch_size_note(None, 32) == ""
    store = ResultsStore(tmp_path / "r.jsonl", notebook="09_memory_and_batch_size", parameters={"batch_size": 32})
    store.verdict(metric="max_batch_size", value=80, unit="samples", recommendation="enable", reason="r",
                  best_throughput_batch=64)
    df = load_results(tmp_path / "r.jsonl")
    note = batch_size_note(df, 32)
    assert "recommended batch 64" in note and "batch_size=64" in note and "keeps batch_size 32" in note
    assert batch_size_note(df, 64) == ""
    assert isinstance(df, pd.DataFrame)


def test_compute_side_lines_reconcile_with_the_notebooks_figure():
    import pandas as pd

    opt = JobSummary("optimized", "x", 0.1, 0.1, 0.1, 0.04, 0.0, 0.06, 300.0, 0.4, 0.6, None, 6)
    wo = JobSummary("without mixed_precision", "x", 0.12, 0.12, 0.12, 0.04, 0.0, 0.08, 250.0, 1 / 3, 2 / 3,
                    None, 6)
    frame = pd.DataFrame([{"variant": "without mixed_precision", "contribution": 1.2, "contribution_low": 1.1,
                           "contribution_high": 1.3, "decision": "keep it"}]).set_index("variant")
    lines = compute_side_lines(frame, {"optimized": opt, "without mixed_precision": wo},
                               {"mixed_precision": (1.72, "x", "06_mixed_precision")})
    assert len(lines) == 1
    line = lines[0]
    # compute 80 -> 60 ms = 1.33x; compute is 2/3 of the step without it; at most 1 / (1/3 + (2/3) / 1.333) = 1.2x
    assert "notebook 06 measured 1.72x" in line and "80.0 -> 60.0 ms (1.33x)" in line and "67%" in line
    assert "predicts 1.20x for the whole job" in line and "keep it" in line


def test_next_step_follows_the_dominant_phase():
    host = JobSummary("optimized", "x", 0.064, 0.06, 0.07, 0.026, 0.001, 0.035, 500.0, 0.44, 0.56, None, 20)
    s = next_step(host, is_cpu=True, enabled=("batched_decode",), host_bound_threshold=0.1)
    assert "compute is the largest phase" in s and "still exposed" in s and "cheaper" in s
    s = next_step(host, is_cpu=False, enabled=("batched_decode",), host_bound_threshold=0.1)
    assert "dataloader_workers and prefetcher" in s
    dev = JobSummary("optimized", "x", 0.1, 0.1, 0.1, 0.005, 0.0, 0.095, 300.0, 0.05, 0.95, None, 20)
    s = next_step(dev, is_cpu=True, enabled=("batched_decode",), host_bound_threshold=0.1)
    assert "compute dominates" in s and "mixed_precision and channels_last" in s
    assert "h2d 0.0 ms (0%: conversion and normalization on the CPU, not a copy)" in s
    learned = training.learning_check([1.0] * 6, [1.0] * 6, 0.1)
    base = JobSummary("baseline", "none", 0.3, 0.29, 0.31, 0.23, 0.0, 0.07, 100.0, 0.77, 0.23, None, 20)
    v = e2e_verdict(_cmp([300] * 4, [64] * 4), learned, base, JobConfig("opt", ("batched_decode",)),
                    host_bound_threshold=0.1, optimized_summary=host)
    assert "STILL host-bound (input 44%" in v.reason and "target >= 2.5x" in v.reason and ": met" in v.reason


def test_value_formatting_and_percent():
    assert format_value(0.02, "fraction") == "2%" and format_value(0.025, "fraction") == "2.5%"
    assert format_value(1.7234, "x") == "1.72x" and format_value(1234.5, "samples/s") == "1,234 samples/s"
    assert format_value(None, "x") == "—" and format_value(float("nan"), "x") == "—"
    assert training.percent(0.00123) == "0.12%" and training.percent(0.031) == "3.1%" and training.percent(0.45) == "45%"
    check = training.learning_check([1.0] * 9, [1.0] * 8 + [1.004], 0.1)
    assert check.percent() == "0.13%" and "0.13%" in check.sentence() and "not that they converge" in check.sentence()


def test_workload_warning_when_the_deciding_notebook_ran_another_job(tmp_path, cpu):
    df = _results(tmp_path, [("02_batched_decode", "enable", {}, {"image_size": 128}),
                             ("07_channels_last", "enable", {}, {"image_size": 64, "model_width": 16})])
    sel = select_optimizations(["auto"], df, cpu, native_bf16=True,
                               workload=Workload(image_size=64, model_width=16))
    by = {c.name: c for c in sel.choices}
    assert "image_size 128 px there vs 64 px here" in by["batched_decode"].warning
    assert "ablation below (section 5) measures it" in by["batched_decode"].warning
    assert by["channels_last"].warning == ""
    (tmp_path / "off").mkdir()
    off = _results(tmp_path / "off", [("03_dataloader_tuning", "leave off", {}, {"image_size": 128}),
                                      ("02_batched_decode", "enable", {}, {"image_size": 64})])
    sel_off = select_optimizations(["auto"], off, cpu, native_bf16=True,
                                   workload=Workload(image_size=64, model_width=16))
    w = {c.name: c for c in sel_off.choices}["dataloader_workers"].warning
    assert "not enabled, so not measured here: rerun notebook 03 at image_size 64" in w
    assert "ablation" not in w and '"batched_decode", "dataloader_workers"' in w
    assert len(sel.warning_lines()) == 1 and "1.50x" in by["batched_decode"].detail
    frame = sel.frame()
    assert list(frame["workload"])[-1] == "same"


def test_verdict_wording():
    learned = training.learning_check([1.0] * 6, [1.0] * 6, 0.1)
    summary = JobSummary("baseline", "none", 0.3, 0.29, 0.31, 0.25, 0.0, 0.05, 100.0, 0.8, 0.2, None, 4)
    opt = JobConfig("opt", ("batched_decode",))
    fast = _cmp([300, 310, 290, 305], [100, 101, 99, 102])
    v = e2e_verdict(fast, learned, summary, opt, host_bound_threshold=0.1)
    assert v.recommendation == "enable" and "host-bound" in v.reason and "80%" in v.reason
    assert "within tolerance" in v.reason and "batched_decode" in v.reason and "not that they converge" in v.reason
    differs = training.learning_check([1.0] * 6, [2.0] * 6, 0.1)
    assert e2e_verdict(fast, differs, summary, opt, host_bound_threshold=0.1).recommendation == "leave off"
    same = _cmp([300, 310, 290, 305], [305, 295, 300, 310])  # an interval around 1: not decided either way
    assert e2e_verdict(same, learned, summary, opt, host_bound_threshold=0.1).recommendation == "inconclusive"
    slower = _cmp([100, 101, 99, 102], [300, 310, 290, 305])
    assert e2e_verdict(slower, learned, summary, opt, host_bound_threshold=0.1).recommendation == "leave off"
    none = e2e_verdict(fast, learned, summary, JobConfig("opt"), host_bound_threshold=0.1)
    assert none.recommendation == "not applicable"


@pytest.mark.parametrize("low, high, recommendation", [
    (0.40, 10.19, "inconclusive"),  # issue 36: spans 1, so neither faster nor slower for sure
    (0.97, 1.03, "inconclusive"),
    (0.30, 0.95, "leave off"),      # slower for sure
    (1.20, 3.00, "enable"),
])
def test_an_end_to_end_interval_that_spans_1_is_inconclusive_never_leave_off(low, high, recommendation):
    learned = training.learning_check([1.0] * 6, [1.0] * 6, 0.1)
    summary = JobSummary("baseline", "none", 0.3, 0.29, 0.31, 0.25, 0.0, 0.05, 100.0, 0.8, 0.2, None, 4)
    base = _cmp([300, 310, 290, 305], [100, 101, 99, 102])
    cmp = Comparison(a=base.a, b=base.b, ratio=2.02, ci_low=low, ci_high=high)
    v = e2e_verdict(cmp, learned, summary, JobConfig("opt", ("batched_decode",)), host_bound_threshold=0.1)
    assert v.recommendation == recommendation
    assert v.spread["ci_low"] == low and v.spread["ci_high"] == high
    if recommendation == "inconclusive":
        assert v.reason.startswith(f"not decided: 2.02x throughput (95% CI {low:.2f}-{high:.2f}) with ")
        assert "spans 1" in v.reason and "--patience" in v.reason


def test_same_input_check_compares_first_batches(data, cpu):
    index, tok = data
    r = same_input_check(JobConfig("baseline"), JobConfig("fast", ("batched_decode", "channels_last")),
                         PPOJob(index, tok, TINY), cpu)
    assert r["labels_equal"] and r["tokens_equal"]
    assert 0.0 <= r["mean_abs_levels"] < 10.0 and r["max_abs_levels"] <= 255.0
    same = same_input_check(JobConfig("a"), JobConfig("b"), PPOJob(index, tok, TINY), cpu)
    assert same["max_abs_levels"] == 0.0


@pytest.mark.parametrize("names", [
    ("dataloader_workers", "pinned_memory", "prefetcher"),  # per-item baseline dataset through workers
    OPTIMIZATIONS,  # everything at once
])
def test_host_side_optimizations_run_on_cpu_and_see_the_same_samples(data, cpu, names):
    index, tok = data
    cfg = JobConfig("opt", tuple(names), num_workers=1)
    check = same_input_check(JobConfig("baseline"), cfg, PPOJob(index, tok, TINY), cpu)
    assert check["labels_equal"] and check["tokens_equal"]
    job = JobVariant(cfg, PPOJob(index, tok, TINY), cpu)
    try:
        job.run(len(index) // TINY.batch_size + 1)  # crosses an epoch boundary with worker processes
        df = job.steps_frame()
        assert len(df) == len(index) // TINY.batch_size + 1 and df["value_loss"].notna().all()
    finally:
        job.close()


def test_the_target_sentence_says_which_condition_decided():
    """A 9.57x speedup on a 29%-exposed baseline is not a failure: the target does not apply (issue 11)."""
    s = target_sentence(9.57, 0.29)
    assert "does not apply" in s and "9.57x" in s and "29%" in s and "not met" not in s and "NOT" not in s
    assert target_sentence(3.0, 0.8).endswith(": met (3.00x, baseline exposed 80%)")
    assert ": not met (2.00x" in target_sentence(2.0, 0.8)


def test_the_decode_once_cache_follows_notebook_02s_own_decision_and_needs_batched_decode(tmp_path, cpu):
    cache = {"recommendation": "enable", "reason": "3.4x", "action": {"setting": "dataset_cache", "value": True,
                                                                       "text": "decode-once dataset cache: enable"}}
    df = _results(tmp_path, [("02_batched_decode", "enable", {"dataset_cache": cache}, {})])
    sel = select_optimizations(["auto"], df, cpu)
    by = {c.name: c for c in sel.choices}
    assert by["dataset_cache"].enabled and by["dataset_cache"].source == "verdict"
    assert "dataset_cache" in sel.optimizations and "batched_decode" in sel.optimizations
    (tmp_path / "b").mkdir()
    (tmp_path / "c").mkdir()
    df = _results(tmp_path / "b", [("02_batched_decode", "leave off", {"dataset_cache": cache}, {})])
    sel = select_optimizations(["auto"], df, cpu)
    by = {c.name: c for c in sel.choices}
    assert not by["dataset_cache"].enabled and "needs batched_decode" in by["dataset_cache"].detail
    df = _results(tmp_path / "c", [("02_batched_decode", "enable", {}, {})])  # 02 ran without the cache
    by = {c.name: c for c in select_optimizations(["auto"], df, cpu).choices}
    assert not by["dataset_cache"].enabled and "did not measure it" in by["dataset_cache"].detail


# ------------------------------------------------------------------ the plan: each optimization's apply hook


def _todays_choices(config, acc):
    """What JobVariant.__init__ chose before the JobPlan (the reference plan_for must keep)."""
    from helpers.jobs.base import StepOptions

    pipeline = ("cached" if config.has("dataset_cache") else "batched") if config.has("batched_decode") else "baseline"
    return JobPlan(pipeline=pipeline, num_workers=config.num_workers if config.has("dataloader_workers") else 0,
                   pin_memory=config.has("pinned_memory") and acc.capabilities.pinned_memory.available,
                   prefetcher=config.has("prefetcher"),
                   options=StepOptions(autocast_dtype=getattr(torch, config.amp_dtype)
                                       if config.has("mixed_precision") else None,
                                       channels_last=config.has("channels_last")))


def _fake_cuda():
    from types import SimpleNamespace

    from helpers.device import Capabilities, Capability

    yes = Capability(True, "faked")
    return SimpleNamespace(kind="cuda", name="fake", is_cpu=False,
                           capabilities=Capabilities(pinned_memory=yes, non_blocking_copy=yes, streams=yes, events=yes,
                                                     memory_stats=yes, channels_last=yes,
                                                     autocast_dtypes=("bfloat16", "float16")))


@pytest.mark.parametrize("names", [(), *[(n,) for n in OPTIMIZATIONS], ("batched_decode", "dataset_cache"),
                                   OPTIMIZATIONS])
def test_plan_for_keeps_todays_choices_for_each_optimization(cpu, names):
    for acc in (cpu, _fake_cuda()):
        for settings in ({"num_workers": 3, "amp_dtype": "float16"}, {}):
            cfg = JobConfig("opt", tuple(names), **settings)
            assert plan_for(cfg, acc) == _todays_choices(cfg, acc), (acc.kind, names, settings)


def test_job_config_settings_and_label_come_from_each_optimizations_setting():
    cfg = JobConfig("opt", ("dataloader_workers", "mixed_precision", "channels_last"), num_workers=3,
                    amp_dtype="float16")
    assert cfg.settings == {"amp_dtype": "float16", "num_workers": 3}
    assert cfg.label() == "dataloader_workers (3), mixed_precision (float16), channels_last"


def test_device_defaults_on_a_cuda_device_switch_the_accelerator_helpers_on():
    d = device_defaults(_fake_cuda())
    assert set(d) == set(OPTIMIZATIONS)
    assert d["dataloader_workers"][0] and d["pinned_memory"][0] and d["prefetcher"][0] and d["mixed_precision"][0]
    assert not d["dataset_cache"][0] and d["channels_last"][0]


# ------------------------------------------------------------------ the experiment's run and its result


_PARAMS = {**TINY.as_dict(), "optimizations": ["batched_decode", "channels_last"], "job": "", "ablation": True,
           "steps": 2, "warmup_steps": 0, "curve_steps": 3, "loss_rtol": 0.5, "projection_steps": 1000,
           "host_bound_threshold": 0.1, "data_dir": "", "max_images": 0}


def test_the_run_records_every_figure_in_the_notebooks_order_and_decides(data, cpu):
    from helpers.experiments import endtoend

    index, tok = data
    setup = endtoend.choose(PPOJob(index, tok, TINY), cpu, _PARAMS, None)
    assert setup.optimized.optimizations == ("batched_decode", "channels_last") and setup.timed_steps() == 10
    assert "optimized job: batched_decode, channels_last" in setup.selection_text()
    assert "12 images" in setup.data_sentence()
    result = endtoend.run(setup)
    keys = [(c[0], c[1][0], c[1][1] if c[0] != "add_comparison" else "") for c in result.records().calls]
    assert keys[0] == ("add", "same input", "first batch")
    assert [k for k in keys if k[1] == "step time"] == [
        ("add_measurement", "step time", n) for n in ("baseline", "optimized", "without batched_decode",
                                                       "without channels_last", "input-free ceiling")]
    experiments = [c[1][0] for c in result.records().calls]
    order = ["same input", "step time", "exposed input", "throughput", "input-free ceiling", "cross-check",
             "learning", "ablation", "ablation contribution", "projection", "change in code"]
    assert [e for e in dict.fromkeys(experiments) if e != "ablation phase contribution"] == order
    assert experiments[-3:] == ["projection", "projection", "change in code"]
    assert experiments.count("cross-check") == len(result.cross)
    change = result.records().calls[-1][2]
    assert "+model = model.to(memory_format=torch.channels_last)" in change["diff"]
    assert any("notebook 02" in n for n in change["notes"]) and result.change_text().startswith("The optimized job's")
    v = result.verdict()
    assert v.notebook == "10_end_to_end" and v.metric == "speedup" and v.unit == "x"
    assert v.extra["optimizations"] == ["batched_decode", "channels_last"] and "PPO on a multimodal" in v.context
    assert v.recommendation in ("enable", "leave off", "inconclusive")
    assert result.in_short().startswith("In short:\n- speedup ")
    assert "batched_decode: acts on the input (data+h2d) phase" in result.ablation_text()
    spec = result.try_it(cpu, _PARAMS)
    assert set(spec.knobs) == {*OPTIMIZATIONS, "steps"} and spec.knobs["batched_decode"] is True
    assert spec.knobs["pinned_memory"].options == (("off (nothing to act on here)", False),)  # a CPU: fixed
    assert spec.knobs["steps"].value == 2 and spec.reference.label == "decode+NHWC"


def test_a_result_without_optimizations_is_not_applicable_and_skips_the_ablation(data, cpu):
    from helpers.experiments import endtoend

    index, tok = data
    setup = endtoend.choose(PPOJob(index, tok, TINY), cpu, {**_PARAMS, "optimizations": []}, None)
    result = endtoend.run(setup)
    assert result.ablation is None and result.ablation_text() == "ablation skipped: the optimized job has 0 " \
                                                                  "optimization(s)"
    assert "ablation" not in {c[1][0] for c in result.records().calls}
    assert result.verdict().recommendation in ("not applicable", "inconclusive")
