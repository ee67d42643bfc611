"""DDP mechanics and notebook 08's DDP experiment on the built-in job: bucket sizes reported, hook errors, fp32 reference exact, overlap arithmetic."""

from __future__ import annotations

import psutil
import pytest

from helpers.comm import ddp
from helpers.experiments import collectives
from helpers.errors import ParameterError


def test_hidden_fraction_is_clipped():
    assert ddp.hidden_fraction(1.0, 0.8, 0.4) == pytest.approx(0.5)
    assert ddp.hidden_fraction(1.0, 1.0, 0.4) == 1.0
    assert ddp.hidden_fraction(2.0, 1.0, 0.4) == 0.0
    with pytest.raises(ParameterError):
        ddp.hidden_fraction(1.0, 1.0, 0.0)


def test_grad_error_and_hooks():
    import torch

    ref = torch.tensor([1.0, -2.0, 4.0])
    e = ddp.grad_error(ref + torch.tensor([0.0, 0.0, 0.5]), ref)
    assert e == {"max_abs_err": 0.5, "rel_err": 0.125, "mismatched": 1}
    assert ddp.hook_function("none") is None
    assert ddp.hook_function("fp16").__name__ == "fp16_compress_hook"
    with pytest.raises(ParameterError):
        ddp.hook_function("int8")
    with pytest.raises(ParameterError, match="needs"):
        collectives.ddp_benchmark({"seed": 0})


PARAMS = dict(data_dir="", max_images=32, seed=0, batch_size=8, image_size=32, text_len=8, model_width=16,
              d_model=16, steps=3, warmup_steps=1, bucket_cap_mb_list=[0.01, 25.0],
              compression_hooks=["none", "fp16", "bf16"])


@pytest.fixture(scope="module")
def result():
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    out = collectives.ddp_benchmark(PARAMS, world_size=2, backend="gloo", timeout_s=150)
    after = {p.pid for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE}
    out["_stray"] = after - before
    return out


def test_bucket_sizes_are_reported_and_cover_the_gradients(result):
    assert not result["_stray"]
    assert [b["cap_mb"] for b in result["buckets"]] == [0.01, 25.0]
    for b in result["buckets"]:
        assert b["n_buckets"] == len(b["bucket_sizes"]) >= 1
        assert sum(b["bucket_sizes"]) == result["grad_bytes"]  # every fp32 gradient byte is in one bucket
        assert b["time_p25_s"] <= b["time_s"] <= b["time_p75_s"]
    # a tiny cap gives more buckets than the default one
    assert result["buckets"][0]["n_buckets"] > result["buckets"][1]["n_buckets"]


def test_the_check_before_timing_finds_the_buckets_the_timed_job_made(result):
    from helpers.comm.launch import run_job

    cfg = collectives.DDPConfig.from_params(PARAMS).as_dict()
    checked = run_job(collectives.DDP_CHECK_TASK, cfg, world_size=2, backend="gloo", timeout_s=150).data
    assert checked["bucket_sizes"] == [b["bucket_sizes"] for b in result["buckets"]]  # the same job, rebuilt alike
    assert checked["grad_bytes"] == result["grad_bytes"] and checked["in_buckets"] is True
    assert checked["plain"] == {"max_abs_err": 0.0, "rel_err": 0.0, "mismatched": 0}
    assert checked["grad_check"] == result["grad_check"] and checked["world_size"] == 2
    plan = collectives.plan_backend("gloo", 2, "cpu")
    env = collectives.EnvCheck((), (), __import__("pathlib").Path("x.env"))
    text = collectives.CollectivesChecks(plan=plan, device_kind="cpu", env=env, params={},
                                         ddp_check=checked).ddp_check_text()
    assert text == ("plain DDP allreduce equals the fp32 reference exactly: True\n"
                    "every gradient byte is in a bucket: True")
    broken = dict(checked, in_buckets=False, plain=None, grad_check="not measured: no gradients")
    assert collectives.CollectivesChecks(plan=plan, device_kind="cpu", env=env, params={}, ddp_check=broken
                                         ).ddp_check_text().splitlines() == [
        "plain DDP allreduce equals the fp32 reference exactly: not measured: no gradients",
        "every gradient byte is in a bucket: False"]


def test_fp32_reference_is_exact_and_fp16_error_small(result):
    rows = {r["hook"]: r for r in result["hooks"]}
    assert rows["none"]["max_abs_err"] == 0.0 and rows["none"]["mismatched"] == 0
    assert 0.0 < rows["fp16"]["rel_err"] < 1e-2  # fp16 has ~11 significant bits
    assert rows["fp16"]["bytes_per_step"] * 2 == rows["none"]["bytes_per_step"]
    # bf16 either ran (error within bf16's 8 bits) or was reported unsupported on this backend
    if "bf16" in rows:
        assert rows["bf16"]["rel_err"] < 5e-2
    else:
        assert "bf16" in result["unsupported_hooks"]


def test_overlap_arithmetic_flags_inconsistent_medians():
    ok = ddp.overlap_figures(1.0, 0.8, 0.4)
    assert ok["consistent"] and ok["hidden_fraction"] == pytest.approx(0.5) and "50%" in ok["note"]
    bad = ddp.overlap_figures(2.0, 1.0, 0.4)  # exposed 1.0 s > allreduce alone 0.4 s: nothing hidden
    assert not bad["consistent"] and bad["hidden_fraction"] == 0.0
    assert bad["note"].startswith("no measurable overlap (hidden ~ 0; DDP adds 1000.0 ms >= 400.0 ms")
    assert bad["raw_hidden_fraction"] == pytest.approx(-1.5)
    neg = ddp.overlap_figures(0.9, 1.0, 0.4)
    assert not neg["consistent"] and neg["hidden_fraction"] is None
    with pytest.raises(ParameterError):
        ddp.overlap_figures(1.0, 1.0, 0.0)
    one = ddp.overlap_figures(1.0, 0.8, 0.4, n_buckets=1)  # one bucket: nothing can overlap, whatever the times say
    assert one["single_bucket"] and one["hidden_fraction"] is None and one["raw_hidden_fraction"] == pytest.approx(0.5)
    assert one["note"] == "every cap made a single bucket: overlap not measurable by construction"
    assert "%" not in one["note"] and not ok["single_bucket"]


def test_overlap_figures(result):
    ov = result["overlap"]
    # measured at a cap with several buckets (the smallest of the sweep here), never at a single bucket
    assert ov["cap_mb"] == 0.01 and ov["n_buckets"] > 1
    assert ov["n_buckets"] == result["buckets"][0]["n_buckets"]
    fig = ddp.overlap_figures(ov["t_ddp_s"], ov["t_nosync_s"], ov["t_allreduce_s"])
    assert ov["consistent"] == fig["consistent"] and ov["note"] == fig["note"]
    assert ov["hidden_fraction"] == fig["hidden_fraction"] and ov["steps"] >= 1
    if ov["hidden_fraction"] is not None:
        assert 0.0 <= ov["hidden_fraction"] <= 1.0
    assert all(h["cap_mb"] == 25.0 for h in result["hooks"])
    assert result["world_size"] == 2 and result["backward_passes"] >= 1


def _b(cap, sizes, t, lo, hi):
    return {"cap_mb": cap, "bucket_sizes": sizes, "n_buckets": len(sizes), "time_s": t, "time_p25_s": lo,
            "time_p75_s": hi}


def test_bucket_comparison_uses_same_layout_caps_as_noise():
    # caps 1 and 25 made the same single bucket but took 51.6 vs 43.3 ms: that gap is noise
    rows = [_b(0.25, [300, 300, 345], 0.048, 0.046, 0.050), _b(1, [945], 0.0516, 0.050, 0.053),
            _b(25, [945], 0.0433, 0.042, 0.045)]
    cmp_ = collectives.bucket_comparison(rows, backward_passes=4)
    assert cmp_["noise_s"] == pytest.approx(0.0083)
    assert [g["caps"] for g in cmp_["groups"]] == [[1, 25], [0.25]]
    assert not cmp_["measurable"] and cmp_["per_bucket_s"] is None and cmp_["best"] == "none measurable"
    assert cmp_["note"].startswith("no measurable difference")


def test_bucket_comparison_reports_cost_when_clear():
    rows = [_b(0.25, [1, 2, 3], 0.080, 0.079, 0.081), _b(25, [6], 0.040, 0.039, 0.041)]
    cmp_ = collectives.bucket_comparison(rows, backward_passes=4)
    assert cmp_["measurable"] and cmp_["best"] == [25]
    assert cmp_["per_bucket_s"] == pytest.approx(0.040 / (2 * 4))


def test_hook_comparison():
    none = {"hook": "none", "time_s": 0.05, "time_p25_s": 0.045, "time_p75_s": 0.055}
    fp16 = {"hook": "fp16", "time_s": 0.048, "time_p25_s": 0.044, "time_p75_s": 0.052}
    assert collectives.hook_comparison([none, fp16])["best"] == "none measurable"
    fast = dict(fp16, time_s=0.02, time_p25_s=0.019, time_p75_s=0.021)
    assert collectives.hook_comparison([none, fast])["best"] == "fp16"
    slow = dict(fp16, time_s=0.09, time_p25_s=0.08, time_p75_s=0.1)
    out = collectives.hook_comparison([none, slow])
    assert out["best"] == "none measurable" and out["slower"] == ["fp16"]


def _verdict(n_buckets, fp16=(0.048, 0.044, 0.052)):
    """Notebook 08's verdict on made-up rows: plain allreduce 50 ms, fp16 as given, a 1 MiB sweep point."""
    none = {"hook": "none", "time_s": 0.05, "time_p25_s": 0.045, "time_p75_s": 0.055, "rel_err": 0.0}
    comp = {"hook": "fp16", "time_s": fp16[0], "time_p25_s": fp16[1], "time_p75_s": fp16[2], "rel_err": 2e-4}
    sizes = [945] * n_buckets
    ov = {"cap_mb": 25.0, "n_buckets": n_buckets, **ddp.overlap_figures(0.05, 0.04, 0.03, n_buckets)}
    bench = {"sizes": [{"bytes": 2**20, "busbw_gbps": 1.5}]}
    buckets = collectives.bucket_comparison([_b(25.0, sizes, 0.05, 0.045, 0.055)])
    return collectives.verdict(bench, {"hooks": [none, comp], "overlap": ov}, buckets, why_not="", context="c")


def test_the_verdict_claims_no_hidden_share_with_a_single_bucket():
    one = _verdict(1)
    assert "every cap made a single bucket: overlap not measurable by construction" in one.reason
    assert "hidden behind computation" not in one.reason
    assert "(1 bucket):" in one.reason and "(3 buckets):" in _verdict(3).reason
    assert "67% of the allreduce time hidden behind computation" in _verdict(3).reason


def test_the_verdict_says_none_measurable_only_without_a_measurable_difference():
    same = _verdict(3)
    assert "no measurable difference: fp16" in same.reason and "so none measurable;" in same.reason
    slow = _verdict(3, fp16=(0.09, 0.08, 0.1))
    assert "fp16 measurably slower" in slow.reason and "so leave compression off;" in slow.reason
    assert "none measurable;" not in slow.reason.split("best bucket_cap_mb")[0]
    assert same.recommendation == slow.recommendation == "leave off"


# ---------------------------------------------------------------- the notebook's experiment: one CollectivesResult

def _bench(world_size=2):
    from helpers.comm.allreduce import algbw_gbps, busbw_gbps

    rows = []
    for k in range(3, 21):
        n = 2**k
        t = 1e-4 + n / 1e9
        rows.append({"bytes": n, "repeats": 5, "time_s": t, "time_p25_s": 0.95 * t, "time_p75_s": 1.05 * t,
                     "algbw_gbps": algbw_gbps(n, t), "busbw_gbps": busbw_gbps(n, t, world_size)})
    bare = {"bytes": 2**20, "chunks": 5, "chunk_calls": 2, "busbw_gbps": 1.0, "bench_busbw_gbps": 0.95}
    return {"sizes": rows, "bare": bare, "overhead_vs_bare": 1.05, "overhead_statistic": "median chunk mean",
            "met": {"overhead_vs_bare": True}, "overhead_note": "met", "device": "cpu"}


def _params(**kw):
    P = {p.name: p.default for p in collectives.EXPERIMENT.spec}
    P.update(kw)
    return P


def test_a_result_that_could_not_run_records_not_applicable(tmp_path):
    plan = collectives.BackendPlan("nccl", None, 2, False, "needs 2 devices", "needs 2 devices", 1, "no devices")
    env = collectives.env_check(tmp_path)
    res = collectives.CollectivesResult(plan=plan, device_kind="cpu", bench=None, ddp=None, env=env,
                                        params=_params(backend="nccl"))
    keys = [args[:3] for _, args, _ in res.records().calls]
    assert keys[:2] == [("allreduce", "benchmark", "busbw"), ("ddp_buckets", "sweep", "step_time")]
    assert all(k[0] == "env_check" for k in keys[2:]) and keys[-1][1] == "validated env file"
    v = res.verdict()
    assert v.recommendation == "not applicable" and v.reason == "needs 2 devices"
    assert v.context == "backend nccl, world_size 2 on cpu"
    assert res.ddp_text() == "DDP not run: needs 2 devices" and res.allreduce_table() is None
    assert res.env.written_text().startswith("rejected: ASCEND_COMPRESS_LEVEL, HCCL_ALGO")
    assert res.try_it(__import__("helpers.device", fromlist=["x"]).get_accelerator("cpu"), res.params).unavailable


def test_a_result_records_the_sweep_ddp_and_the_env_check_in_order(result, tmp_path):
    ddp_res = {k: v for k, v in result.items() if k != "_stray"}
    plan = collectives.plan_backend("gloo", 2, "cpu")
    checked = {"bucket_sizes": [b["bucket_sizes"] for b in ddp_res["buckets"]], "grad_bytes": ddp_res["grad_bytes"],
               "in_buckets": True, "plain": {"max_abs_err": 0.0, "rel_err": 0.0, "mismatched": 0},
               "grad_check": ddp_res["grad_check"], "job": ddp_res["job"], "world_size": 2}
    res = collectives.CollectivesResult(plan=plan, device_kind="cpu", bench=_bench(), ddp=ddp_res, ddp_check=checked,
                                        env=collectives.env_check(tmp_path), params=_params(steps=3))
    experiments = [args[0] for _, args, _ in res.records().calls]
    order = [e for i, e in enumerate(experiments) if i == 0 or experiments[i - 1] != e]
    assert order == ["allreduce", "ddp_buckets", "ddp_compression", "ddp_overlap", "env_check"]
    assert experiments.count("ddp_buckets") == len(ddp_res["buckets"])
    v = res.verdict()
    assert v.metric == "busbw_at_largest_size" and v.action.setting == "comm_hook"
    assert v.context.startswith("gloo, 2 ranks on cpu; allreduce 8 B to 256 MiB, 10 repeats; PPO DDP 32 samples")
    assert "every gradient byte is in a bucket: True" in res.ddp_check_text()
    assert res.overlap_text().startswith("overlap at bucket_cap_mb")
    hooks = res.hooks_table()  # rounded like the bucket table, errors to two significant digits
    assert (hooks["step ms"] == hooks["step ms"].round(2)).all() and hooks.loc[0, "max abs err"] == "0"
    knobs = res.try_it(__import__("helpers.device", fromlist=["x"]).get_accelerator("cpu"), res.params).knobs
    assert knobs["min_mib"].value == 1.0 and knobs["max_mib"].value == 4.0


def test_ddp_config_survives_the_ranks_json():
    import json

    cfg = collectives.DDPConfig.from_params(_params(job="examples/image_classifier.py:make_job", steps=2))
    assert cfg.job.spec.endswith("examples/image_classifier.py:make_job") and cfg.steps == 2
    assert collectives.DDPConfig.from_dict(json.loads(json.dumps(cfg.as_dict()))) == cfg
    with pytest.raises(ParameterError):
        collectives.DDPConfig.from_params(_params(compression_hooks=["int8"]))
