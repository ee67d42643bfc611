"""Allreduce benchmark: nccl-tests arithmetic, sizes, values, and the bench command's JSON."""

from __future__ import annotations

import json

import pytest

from helpers.comm import allreduce as ar
from helpers.errors import ParameterError


def test_bus_factor_matches_nccl_tests():
    # nccl-tests doc/PERFORMANCE.md: 1.0 for n=2, 1.5 for n=4, 1.75 for n=8, 1.875 for n=16
    assert [ar.bus_factor(n) for n in (1, 2, 4, 8, 16)] == [0.0, 1.0, 1.5, 1.75, 1.875]
    assert ar.algbw_gbps(2e9, 1.0) == pytest.approx(2.0)
    assert ar.busbw_gbps(1e9, 0.5, 4) == pytest.approx(3.0)
    with pytest.raises(ParameterError):
        ar.algbw_gbps(1, 0.0)


def test_message_sizes_double_and_end_on_max():
    assert ar.message_sizes(8, 64) == [8, 16, 32, 64]
    assert ar.message_sizes(6, 40) == [8, 12, 24, 40]  # rounded up to float32 elements; max appended
    assert ar.message_sizes(4, 256, factor=4) == [4, 16, 64, 256]
    with pytest.raises(ParameterError):
        ar.message_sizes(2, 8)
    cfg = ar.bench_config(min_bytes=8, max_size_mib=1)
    assert cfg["bare_bytes"] == 2**20 and cfg["sizes"][-1] == 2**20
    cfg = ar.bench_config(min_bytes=1000, max_size_mib=128)
    assert ar.BARE_BYTES in cfg["sizes"] and cfg["bare_bytes"] == ar.BARE_BYTES


def test_summarize_takes_slowest_rank_median():
    row = ar.summarize(1000, [[1.0, 2.0, 3.0], [2.0, 4.0, 6.0]], 2)
    assert row["time_s"] == 4.0 and row["time_p25_s"] == 3.0 and row["time_p75_s"] == 5.0
    assert row["algbw_gbps"] == pytest.approx(1000 / 4.0 / 1e9)
    assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"])


def test_regimes_from_data():
    rows = [{"bytes": b, "time_s": t, "busbw_gbps": bw} for b, t, bw in
            [(8, 1e-4, 8e-5), (64, 2e-4, 3e-4), (512, 1e-4, 5e-3), (4096, 1e-4, 0.04), (2**20, 2e-3, 0.5),
             (2**24, 2e-2, 0.8), (2**26, 7e-2, 0.95), (2**28, 0.3, 0.9)]]
    reg = ar.regimes(rows)
    assert reg["small_time_s"] == pytest.approx(1.5e-4)  # median time of the first quarter (2 smallest sizes)
    assert reg["small_sizes"] == [8, 64]
    assert reg["plateau_busbw_gbps"] == pytest.approx(0.9)  # median of the 3 largest sizes, not the max
    assert reg["peak_busbw_gbps"] == 0.95 and reg["peak_bytes"] == 2**26
    assert reg["crossover_bytes"] == 2**20  # from here on every size is >= half of the plateau
    with pytest.raises(ParameterError):
        ar.regimes([])


def test_regimes_crossover_ignores_an_early_spike():
    """A lucky small size above half the plateau, followed by a dip, is not the crossover."""
    bws = [0.001, 0.01, 2.7, 1.0, 0.3, 1.5, 1.6, 1.7]  # 2.7 at 1 KiB is a spike; 0.3 dips below half of 1.6
    rows = [{"bytes": 2**(7 + i), "time_s": 1e-3, "busbw_gbps": bw} for i, bw in enumerate(bws)]
    reg = ar.regimes(rows)
    assert reg["plateau_busbw_gbps"] == pytest.approx(1.6)
    assert reg["crossover_bytes"] == 2**12  # first size after the dip; all larger ones stay >= 0.8
    assert all(r["busbw_gbps"] >= 0.5 * reg["plateau_busbw_gbps"] for r in rows if r["bytes"] >= 2**12)


def test_bench_command_prints_the_json_schema(capsys):
    from helpers.workbook.cli import main

    rc = main(["bench", "allreduce", "--backend", "gloo", "--world-size", "2", "--min-bytes", "8",
               "--max-size-mib", "1", "--repeats", "3", "--warmup", "1", "--timeout", "90"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["backend"] == "gloo" and out["world_size"] == 2 and out["device"] == "cpu"
    assert isinstance(out["machine"]["busy"], bool) and out["machine_note"]  # the machine's state beside it
    sizes = [r["bytes"] for r in out["sizes"]]
    assert sizes[0] == 8 and sizes[-1] == 2**20 and sizes == sorted(sizes)
    for r in out["sizes"]:
        assert set(r) == {"bytes", "time_s", "time_p25_s", "time_p75_s", "algbw_gbps", "busbw_gbps", "repeats"}
        assert r["repeats"] == (3 * ar.SMALL_REPEAT_FACTOR if r["bytes"] <= ar.SMALL_BYTES else 3)
        assert r["time_p25_s"] <= r["time_s"] <= r["time_p75_s"]
        assert r["algbw_gbps"] == pytest.approx(r["bytes"] / r["time_s"] / 1e9)
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"])  # n=2
    assert out["bare"]["bytes"] == 2**20  # largest size when under 64 MiB
    # both sides of the ratio use the same statistic, measured interleaved
    assert out["overhead_vs_bare"] == pytest.approx(out["bare"]["busbw_gbps"] / out["bare"]["bench_busbw_gbps"])
    assert out["bare"]["bench_busbw_gbps"] == pytest.approx(2**20 / out["bare"]["bench_time_s"] / 1e9)
    assert "median over" in out["overhead_statistic"] and out["overhead_statistic"] == out["bare"]["statistic"]
    assert out["bare_busbw_gbps"] == out["bare"]["busbw_gbps"] and out["bare_bytes"] == 2**20
    assert "not at 64 MiB" in out["bare_note"] and "bare_busbw_gbps_64mib" not in out
    assert out["target"] == {"overhead_vs_bare": "<= 1.1"}
    assert out["met"]["overhead_vs_bare"] == ar.overhead_status(out["overhead_vs_bare"])["met"]
    assert out["overhead_note"] == ar.overhead_status(out["overhead_vs_bare"])["note"]


def test_wrong_values_are_detected(monkeypatch):
    """run_allreduce checks the sums: a backend that corrupts data is caught (faked single-rank group)."""
    import torch

    calls = {"n": 0}

    def bad_all_reduce(t, *a, **k):
        calls["n"] += 1
        t.add_(1.0)  # not what a sum over ranks gives

    monkeypatch.setattr(torch.distributed, "all_reduce", bad_all_reduce)
    with pytest.raises(RuntimeError, match="expected all 3.0"):
        ar.run_allreduce(rank=0, world_size=2, device="cpu", sizes=[16], repeats=3, warmup=0,
                         sync=lambda: None, bare_bytes=None)
    assert calls["n"] == 1


def test_torchrun_environment_detection():
    assert ar.launched_by_torchrun({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h"})
    assert not ar.launched_by_torchrun({"RANK": "0"})


def test_bench_command_reports_a_failed_job_without_traceback(capsys):
    from helpers.workbook.cli import main

    rc = main(["bench", "allreduce", "--backend", "gloo", "--world-size", "2", "--max-size-mib", "1",
               "--repeats", "2", "--warmup", "0", "--timeout", "0.5"])
    err = capsys.readouterr().err
    assert rc == 1
    assert err.startswith("error: ") and "--timeout" in err and "Traceback" not in err


def test_bench_command_bad_flag_values_exit_2(capsys):
    from helpers.workbook.cli import main

    assert main(["bench", "allreduce", "--backend", "gloo", "--world-size", "0"]) == 2
    assert "--world-size" in capsys.readouterr().err
    assert main(["bench", "allreduce", "--backend", "gloo", "--timeout", "-1"]) == 2
    assert "--timeout" in capsys.readouterr().err


def test_overhead_status_bands():
    assert ar.overhead_status(1.0)["met"] is True
    assert ar.overhead_status(1.10)["met"] is True
    assert ar.overhead_status(1.2)["met"] is False and "not met" in ar.overhead_status(1.2)["note"]
    low = ar.overhead_status(0.77)  # bare loop slower than the benchmark: noise, not "met"
    assert low["met"] is None and low["note"].startswith("inconclusive")
    assert ar.overhead_status(None)["met"] is None


def _row(nbytes, t, p75=None):
    return {"bytes": nbytes, "time_s": t, "time_p25_s": t, "time_p75_s": t if p75 is None else p75}


def test_flag_outliers_finds_spread_trend_and_flat_sizes():
    mib = 2**20
    rows = [_row(8, 1e-4), _row(16, 1e-4, p75=9e-4), _row(32, 1e-4), _row(64, 2e-3), _row(128, 1e-4),
            _row(16 * mib, 10e-3), _row(32 * mib, 20e-3), _row(64 * mib, 40e-3), _row(128 * mib, 41e-3)]
    flags = {f["bytes"]: " ".join(f["reasons"]) for f in ar.flag_outliers(rows, growth_from_bytes=16 * mib)}
    assert "75th percentile" in flags[16]
    assert "trend" in flags[64]
    assert "does not grow" in flags[128 * mib]
    assert 8 not in flags and 32 * mib not in flags and 64 * mib not in flags


def test_flag_outliers_clean_curve_has_no_flags():
    rows = [_row(2**k, 1e-4 + 2**k / 1e9) for k in range(3, 28)]
    assert ar.flag_outliers(rows) == []
