"""Benchmark commands print the promised JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_bench_input_pipeline_prints_the_figures():
    p = subprocess.run([sys.executable, "-m", "helpers", "bench", "input-pipeline", "--profile", "smoke",
                        "--device", "cpu"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout)
    for key in ("preprocess_speedup", "decode_efficiency", "tokenize_speedup", "exposed_input_fraction"):
        assert isinstance(out[key], float) and out[key] > 0, key
    assert 0 <= out["exposed_input_fraction"] <= 1
    assert set(out["targets"]) == {"preprocess_speedup", "decode_efficiency", "exposed_input_fraction"}
    assert all(isinstance(t["met"], bool) for t in out["targets"].values())
    assert out["device"] == "cpu" and out["profile"] == "smoke"
    assert isinstance(out["machine"]["busy"], bool) and out["machine_note"]  # the machine's state beside the figures


@pytest.mark.slow
def test_bench_end_to_end_reports_the_ceiling_fraction():
    p = subprocess.run([sys.executable, "-m", "helpers", "bench", "end-to-end", "--profile", "smoke", "--device",
                        "cpu"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout)
    lo, hi = out["ceiling_fraction_ci"]
    assert 0 < lo <= out["ceiling_fraction"] <= hi  # the optimized job's throughput over its input-free ceiling's
    assert out["ceiling_fraction"] == pytest.approx(out["step_ms"]["ceiling"] / out["step_ms"]["optimized"], rel=0.2)
    assert out["exposed_input_fraction"]["ceiling"] < 0.05  # the ceiling loads and copies nothing
    assert set(out["targets"]) == {"ceiling_fraction", "speedup"} and isinstance(out["machine"]["busy"], bool)


@pytest.mark.slow
@pytest.mark.notebook
def test_bench_end_to_end_selects_the_optimizations_from_a_runs_verdicts(smoke_run):
    from helpers.results import load_results
    from helpers.workbook.bench import run_benchmark

    run_dir, state = smoke_run  # the session's smoke run (tests/conftest.py): notebook 03 among the others
    assert next(n for n in state.notebooks if n.id == "03_dataloader_tuning").status == "ok"
    recs = load_results(run_dir / "results.jsonl")
    v03 = recs[(recs["experiment"] == "verdict") & (recs["notebook"] == "03_dataloader_tuning")].iloc[-1]
    out = json.loads(run_benchmark("end-to-end", profile="smoke", device="cpu", run=str(run_dir)))
    assert out["run"] == str(run_dir)
    # notebook 10's rule: workers where notebook 03 enabled them (a CPU's default is none)
    assert ("dataloader_workers" in out["optimizations"]) == (v03["recommendation"] == "enable")


def test_bench_end_to_end_refuses_a_folder_that_is_no_run(tmp_path):
    p = subprocess.run([sys.executable, "-m", "helpers", "bench", "end-to-end", "--run", str(tmp_path)],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 2 and "no results.jsonl there" in p.stderr


def test_bench_rejects_unknown_benchmark():
    p = subprocess.run([sys.executable, "-m", "helpers", "bench", "nothing"], capture_output=True, text=True,
                       timeout=60, cwd=ROOT)
    assert p.returncode == 2 and "input-pipeline" in p.stderr


@pytest.mark.slow
def test_bench_dataset_index_reuses_the_cache_and_checks_only_what_changed(tmp_path):
    env = {**__import__("os").environ, "WORKBOOK_CACHE_DIR": str(tmp_path / "user-cache")}
    p = subprocess.run([sys.executable, "-m", "helpers", "bench", "dataset-index", "--images", "300"],
                       capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout)
    assert out["images"] == out["usable"] == 300 and out["skipped"] == 0
    assert out["incremental_checked"] == 3  # 1% of the files were touched
    assert out["sample_checked"] == 300  # min(sample, images)
    for key in ("list_s", "cold_index_s", "cached_index_s", "incremental_index_s", "sample_index_s",
                "rss_peak_mib", "cached_index_python_peak_mib"):
        assert isinstance(out[key], float) and out[key] >= 0, key
    assert set(out["targets"]) == {"cached_index_s"} and isinstance(out["targets"]["cached_index_s"]["met"], bool)
    assert isinstance(out["machine"]["busy"], bool) and out["machine_note"]
    assert not (tmp_path / "user-cache").exists()  # the benchmark's caches are its own, in a temporary folder


@pytest.mark.slow
def test_bench_dataset_cache_reports_build_size_and_read_rate():
    p = subprocess.run([sys.executable, "-m", "helpers", "bench", "dataset-cache", "--profile", "smoke"],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout)
    assert out["build_s"] > 0 and out["cache_mib"] > 0 and out["reopened_as_is"] and out["failed_at_build"] == 0
    assert out["psnr_min_db"] >= 30.0  # the cached crops are the reference's within the decode tolerance
    lo, hi = out["cached_over_batched_ci"]
    assert lo <= out["cached_over_batched"] <= hi and out["cached_images_per_s"] > 0
    assert isinstance(out["machine"]["busy"], bool)
