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


def test_bench_rejects_unknown_benchmark():
    p = subprocess.run([sys.executable, "-m", "helpers", "bench", "nothing"], capture_output=True, text=True,
                       timeout=60, cwd=ROOT)
    assert p.returncode == 2 and "input-pipeline" in p.stderr
