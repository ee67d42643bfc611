"""Cross-checks turn a measurement that contradicts its mechanism into "inconclusive", never a verdict."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from helpers.errors import ParameterError
from helpers.experiments import crosscheck as cc
from helpers.results import ResultsStore, load_results, verdicts
from helpers.timing import Comparison, Measurement
from helpers.verdict import Action, Verdict


def _steps(data_ms, h2d_ms, compute_ms, n=20, jitter=0.03, seed=0):
    rng = np.random.default_rng(seed)
    cols = {}
    for name, ms in (("data", data_ms), ("h2d", h2d_ms), ("compute", compute_ms)):
        cols[name] = ms / 1e3 * (1 + jitter * rng.standard_normal(n)).clip(0.5)
    df = pd.DataFrame(cols)
    df["step_s"] = df["data"] + df["h2d"] + df["compute"]
    return df


def _speedup(base, other, seed=0):
    return Comparison.from_measurements(Measurement("base", tuple(base["step_s"]), 0),
                                        Measurement("other", tuple(other["step_s"]), 0), seed=seed)


# ---------------------------------------------------------------- the case of issue 11: 352 ms vs 32 ms compute

def test_compute_changed_elevenfold_under_an_input_only_optimization_fails():
    base, opt = _steps(140, 0.1, 352), _steps(20, 0.5, 32, seed=1)
    checks = cc.untouched_phases(base, opt, ["batched_decode"])
    assert [c.ok for c in checks] == [False] and checks[0].figures["phase"] == "compute"
    assert "the compute phase, which batched_decode does not act on, went 35" in checks[0].sentence
    assert "(0.09x the time" in checks[0].sentence


def test_small_legitimate_drift_passes():
    base, opt = _steps(140, 0.1, 40), _steps(25, 0.5, 46, seed=1)  # workers sharing the cores: 1.15x
    checks = cc.untouched_phases(base, opt, ["batched_decode", "dataloader_workers"])
    assert checks and all(c.ok for c in checks)


def test_a_phase_acted_on_is_not_checked_and_tiny_phases_are_skipped():
    base, opt = _steps(140, 0.1, 352), _steps(20, 0.5, 32, seed=1)
    assert cc.untouched_phases(base, opt, ["batched_decode", "mixed_precision"]) == []
    # h2d (~0.1 ms of a 500 ms step) is not checked even though no optimization acts on it
    base, opt = _steps(140, 0.1, 40), _steps(140, 0.4, 40, seed=1)
    assert [c.figures["phase"] for c in cc.untouched_phases(base, opt, ["mixed_precision"])] == ["data"]


def test_untouched_phases_rejects_bad_input():
    base = _steps(10, 1, 10)
    with pytest.raises(ParameterError, match="unknown optimization"):
        cc.untouched_phases(base, base, ["warp_drive"])
    with pytest.raises(ParameterError, match="lacks column"):
        cc.untouched_phases(base.drop(columns="compute"), base, [])
    with pytest.raises(ParameterError, match="max_drift"):
        cc.untouched_phases(base, base, [], max_drift=1.0)


def test_amdahl_bound_flags_an_impossible_speedup():
    base = _steps(29, 0, 71)  # input 29% of the step: at most 1.41x from input-side optimizations
    fast = _steps(1, 0, 9.5, seed=1)  # "9.57x"
    c = cc.amdahl(_speedup(base, fast), {p: base[p].median() for p in ("data", "h2d", "compute")},
                  ["batched_decode"])
    assert not c.ok and c.figures["bound"] == pytest.approx(1 / 0.71, rel=0.05)
    assert "allow at most 1.4" in c.sentence
    ok = cc.amdahl(_speedup(base, _steps(5, 0, 71, seed=2)), {p: base[p].median() for p in ("data", "h2d", "compute")},
                   ["batched_decode"])
    assert ok.ok  # 1.3x is possible
    every = cc.amdahl(_speedup(base, fast), {p: base[p].median() for p in ("data", "h2d", "compute")},
                      ["batched_decode", "mixed_precision"])
    assert every.ok and every.figures["bound"] is None  # no bound (and nothing non-finite to store)


def test_same_job_agrees_within_drift_or_overlap_and_fails_on_a_gross_change():
    earlier = {"median_s": 0.030, "p25_s": 0.029, "p75_s": 0.031}
    assert cc.same_job("compute", earlier, [0.033] * 10, where="notebook 01").ok
    bad = cc.same_job("compute", earlier, [0.78] * 10, where="notebook 01")
    assert not bad.ok and "26.00x" in bad.sentence
    with pytest.raises(ParameterError, match="median_s"):
        cc.same_job("compute", {"median_s": 1}, [1.0], where="x")


def test_apply_makes_a_verdict_inconclusive_and_keeps_what_it_measured():
    v = Verdict(notebook="10_end_to_end", metric="speedup", value=9.57, unit="x", recommendation="enable",
                reason="9.57x throughput", action=Action("x", 1, "x: enable"))
    bad = cc.CrossCheck("Amdahl bound", False, "9.57x where at most 1.41x is possible")
    good = cc.CrossCheck("same job", True, "agrees")
    out = cc.apply(v, [good, bad])
    assert out.recommendation == "inconclusive" and out.action is None
    assert out.reason.startswith("inconclusive: the machine's speed changed while measuring (9.57x where")
    assert "What it measured: enable: 9.57x throughput" in out.reason
    assert out.extra["measured_recommendation"] == "enable"
    assert [c["ok"] for c in out.extra["cross_checks"]] == [True, False]
    kept = cc.apply(v, [good])
    assert kept.recommendation == "enable" and kept.extra["cross_checks"][0]["name"] == "same job"
    na = Verdict(notebook="10_end_to_end", metric="speedup", value=1.0, unit="x", recommendation="not applicable",
                 reason="nothing selected")
    assert cc.apply(na, [bad]).recommendation == "not applicable"


def test_notebook_10_reads_notebook_01s_phases_only_for_the_same_job(tmp_path):
    from helpers.experiments.e2e_checks import earlier_baseline_phases
    from helpers.jobs.base import Workload

    params = {"batch_size": 32, "image_size": 64, "text_len": 16, "model_width": 16, "d_model": 64, "seed": 0,
              "data_dir": "", "max_images": 0}
    store = ResultsStore(tmp_path / "r.jsonl", notebook="01_baseline_profiling", parameters=params)
    phases = {"compute": {"median_s": 0.03, "p25_s": 0.029, "p75_s": 0.031}}
    store.add_verdict(Verdict(notebook="01_baseline_profiling", metric="exposed_input_fraction", value=0.7,
                              unit="fraction", recommendation="host-bound", reason="r", extra={"phases": phases}))
    results = load_results(tmp_path / "r.jsonl")
    got, why = earlier_baseline_phases(results, Workload.from_params(params), params)
    assert got == phases and why == ""
    other = {**params, "image_size": 128}
    got, why = earlier_baseline_phases(results, Workload.from_params(other), other)
    assert got is None and "different job" in why
    assert earlier_baseline_phases(None, Workload.from_params(params), params)[0] is None
    assert len(verdicts(results)) == 1


def test_first_screen_follows_the_end_to_end_ablation(tmp_path):
    from helpers.workbook.report import collect
    from helpers.workbook.report.collect import _advice

    path = tmp_path / "results.jsonl"

    def add(nb, v):
        ResultsStore(path, notebook=nb).add_verdict(v)

    add("06_mixed_precision", Verdict(notebook="06_mixed_precision", metric="speedup", value=1.24, unit="x",
                                      recommendation="enable", reason="1.24x",
                                      action=Action("autocast_dtype", "bfloat16", "bf16 autocast: enable")))
    add("07_channels_last", Verdict(notebook="07_channels_last", metric="speedup", value=1.3, unit="x",
                                    recommendation="enable", reason="1.30x",
                                    action=Action("memory_format", "channels_last", "channels_last: enable")))
    add("02_batched_decode", Verdict(notebook="02_batched_decode", metric="speedup", value=4.4, unit="x",
                                     recommendation="enable", reason="4.4x",
                                     action=Action("pipeline", "batched", "batched decode: enable")))
    ablation = {"mixed_precision": {"decision": "keep it", "contribution": 1.09, "ci_low": 1.05, "ci_high": 1.15,
                                    "phases": "compute", "phase_contribution": 1.11, "phase_low": 1.05,
                                    "phase_high": 1.16},
                "channels_last": {"decision": "no measurable contribution here", "contribution": 1.02,
                                  "ci_low": 0.98, "ci_high": 1.06}}
    add("10_end_to_end", Verdict(notebook="10_end_to_end", metric="speedup", value=3.06, unit="x",
                                 recommendation="enable", reason="3.06x", extra={"ablation": ablation}))
    advice = dict(_advice(collect(tmp_path)))
    enable = advice["Enable on this machine"]
    assert ("bf16 autocast: enable (confirmed end to end by notebook 10: contribution compute phase 1.11x, 95% CI "
            "1.05–1.16; whole step 1.09x, 95% CI 1.05–1.15)") in enable
    assert "batched decode: enable (notebook 02's isolated measurement only" in enable
    assert "channels_last" not in enable
    assert "notebook 10's ablation found no measurable contribution" in \
        advice["Gain in its notebook only, not confirmed end to end (optional)"]


def test_on_a_cpu_workers_act_on_compute_too():
    """Measured: 2 DataLoader workers on 2 cores make the compute phase ~2x slower; that is their cost, not noise."""
    base, opt = _steps(140, 0.1, 40), _steps(10, 0.5, 80, seed=1)
    assert [c.ok for c in cc.untouched_phases(base, opt, ["batched_decode", "dataloader_workers"])] == [False]
    assert cc.untouched_phases(base, opt, ["batched_decode", "dataloader_workers"], device_kind="cpu") == []
    # the same slowdown with batched decode alone (no concurrent input work) is still a polluted measurement
    assert [c.ok for c in cc.untouched_phases(base, opt, ["batched_decode"], device_kind="cpu")] == [False]
