"""Issue 44, items 1 and 8: the advice reads the precision the trace records before it names mixed precision, and a
verdict at its threshold says so.

Synthetic CUDA traces (:func:`helpers.traces.synthetic.write_synthetic_kineto`) whose GEMM kernels and
``aten::addmm`` ``Input type`` are rewritten to fp8, bf16 or fp32, as real traces name them; the kernel names are
those of real traces (tests/data/public_traces, DeepSeek's profile-data, the issue's Qwen trace).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.bottleneck import ComputeMix, classify
from helpers.traces.analysis import analyze
from helpers.traces.kineto import read_kineto
from helpers.traces.model import RankTrace, StepPhases
from helpers.traces.precision import compute_mix, kernel_precision, matrix_kind, op_precision
from helpers.traces.synthetic import StepTiming, write_synthetic_kineto
from helpers.verdict import HEADLINE_CHARS

HERE = Path(__file__).resolve().parent
#: A step whose device computes most of the time (input 2%, idle ~14%): the compute is the largest lever.
TIMING = StepTiming(step_us=100_000, data_us=2_000, h2d_us=1_000, kernel_busy=0.97, compute_end=0.78)
_SYNTH_KERNEL = "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(Params)"
KERNELS = {
    "fp8": ("void cutlass::device_kernel<dpsk::grouped_gemm::cuda::fp8_ptp128c::GemmKernel>(Params)",
            "c10::Float8_e4m3fn"),
    "bf16": ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off",
             "c10::BFloat16"),
    "fp32": ("volta_sgemm_128x64_nn", "float"),
}


def _shared(key: str, sha256: str) -> Path:
    import hashlib
    import os

    for root in (os.environ.get("PUBLIC_TRACES_DIR"), HERE.parent.parent / "shared" / "public_traces"):
        p = Path(root) / key if root else None
        if p is not None and p.is_file():
            assert hashlib.sha256(p.read_bytes()).hexdigest() == sha256, f"{p}: not the published file"
            return p
    pytest.skip(f"{key} is not in ../shared/public_traces (tests/data/public_traces/README.md, Further traces)")


def _trace(tmp_path: Path, prec: str, *, input_type: bool = True) -> Path:
    path = tmp_path / f"{prec}.pt.trace.json"
    write_synthetic_kineto(path, steps=5, units_per_step=20, timing=TIMING)
    kernel, dtype = KERNELS[prec]
    text = path.read_text().replace(_SYNTH_KERNEL, kernel)
    if input_type:  # what record_shapes=True adds to each aten::addmm
        types = json.dumps([dtype, dtype, dtype, "Scalar", "Scalar"])
        text = text.replace('"Fwd thread id": 0', f'"Fwd thread id": 0, "Input type": {types}')
    path.write_text(text)
    return path


@pytest.mark.parametrize("prec", sorted(KERNELS))
def test_the_trace_names_the_precision_of_its_matrix_work(tmp_path, prec):
    mix = read_kineto(_trace(tmp_path, prec)).compute_mix
    assert mix.dtype == prec and mix.conv == 0.0 and mix.ops == 100  # 20 addmm a step, 5 steps
    assert mix.low == (0.0 if prec == "fp32" else 1.0) and mix.ops_low == (0 if prec == "fp32" else 100)
    assert f"{prec} on 100% of the matrix kernels' time" in mix.text and "of 100 matrix operators" in mix.text


@pytest.mark.parametrize("prec", ["fp8", "bf16"])
def test_a_job_already_in_low_precision_is_not_advised_mixed_precision(tmp_path, prec):
    a = analyze([read_kineto(_trace(tmp_path, prec))])
    b = a.bottleneck
    assert "06" not in b.next_notebooks and "mixed precision" not in b.reason.split("; precision is")[0]
    assert f"precision is already low ({prec} on 100% of the matrix kernels' time" in b.reason
    assert f"mixed precision left out: the matrix work is {prec} already" in a.next_text()
    # no convolution in the trace: channels_last is not advised either; a lever the evidence leaves open is named
    assert "07" not in b.next_notebooks and b.next_notebooks
    assert "channels_last left out: no convolution" in a.next_text()
    v = a.verdict()
    assert len(v.headline()) <= HEADLINE_CHARS and v.extra["bottleneck"]["precision"] == b.precision


def test_an_fp32_job_is_advised_mixed_precision_first(tmp_path):
    a = analyze([read_kineto(_trace(tmp_path, "fp32"))])
    assert a.bottleneck.next_notebooks[0] == "06" and "precision is already low" not in a.bottleneck.reason
    assert "fp32 on 100%" in a.bottleneck.precision


def test_the_operators_input_type_decides_where_kernel_names_say_nothing(tmp_path):
    path = _trace(tmp_path, "bf16")
    path.write_text(path.read_text().replace(KERNELS["bf16"][0], "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN"))
    mix = read_kineto(path).compute_mix
    assert mix.low is None and mix.low_share == 1.0 and mix.dtype == "bf16"
    assert "06" not in analyze([read_kineto(path)]).bottleneck.next_notebooks


def test_without_any_precision_evidence_the_advice_is_unchanged(tmp_path):
    path = tmp_path / "plain.pt.trace.json"
    write_synthetic_kineto(path, steps=5, units_per_step=20, timing=TIMING)
    path.write_text(path.read_text().replace(_SYNTH_KERNEL, "void my_fused_kernel<float4>(Params)"))
    assert read_kineto(path).compute_mix is None
    assert analyze([read_kineto(path)]).bottleneck.next_notebooks[:2] == ("06", "07")


@pytest.mark.parametrize("name, prec, kind", [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "bf16", "gemm"),
    ("void cutlass::device_kernel<dpsk::grouped_gemm::cuda::fp8_dptp128c_acc::GemmKernel>(Params)", "fp8", "gemm"),
    ("ampere_fp16_s16816gemm_fp16_256x128_ldg8_f2f_stages_64x3_nn", "fp16", "gemm"),
    ("volta_sgemm_128x64_nn", "fp32", "gemm"),
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_tn_align1>(Params)", "tf32", "gemm"),
    ("volta_scudnn_128x64_relu_interior_nn_v1", "fp32", "conv"),
    ("void implicit_convolve_sgemm<float, float, 1024, 6, 7, 3, 3, 5, 1, false, true, true>(int)", "fp32", "conv"),
    ("sm80_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x32", "bf16", "conv"),
    ("Cijk_Alik_Bljk_BBS_BH_Bias_HAS_SAV_UserArgs_MT256x256x64_MI16x16x1_SN_LDSB1", "bf16", "gemm"),
    ("Cijk_Ailk_Bjlk_SB_Bias_AS_SAV_UserArgs_MT64x16x16_MI16x16x1_SN_LDSB0", "fp32", "gemm"),
    ("void flash::compute_attn_ws<Flash_fwd_kernel_traits<192, 128, 128, 12, 2, false, 1, cutlass::bfloat16_t, 128>>",
     "bf16", "attention"),
    ("void cutlass::device_kernel<flash::FlashAttnBwdPostprocessConvertdQ<cutlass::bfloat16_t>>", "bf16", "attention"),
    # not matrix work, though the names say gemm, conv or cudnn
    ("void fbgemm_gpu::permute_2D_data_kernel<false, int, int, decltype(nullptr)>(int)", None, None),
    ("void cudnn::ops::nchwToNhwcKernel<float, float, float, false, true, (cudnnKernelDataType_t)2>(float)", "fp32",
     None),
    ("void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 128, true, 1>(float)", "fp32", None),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "fp32", None),
])
def test_kernel_names_of_real_traces(name, prec, kind):
    assert matrix_kind(name) == kind
    if kind is not None or prec is not None:
        assert kernel_precision(name) == prec


def test_operator_input_types():
    assert op_precision('"c10::BFloat16", "c10::BFloat16", ""') == "bf16"
    assert op_precision('"", "c10::Half"') == "fp16"
    assert op_precision('"c10::Float8_e4m3fn", "c10::Float8_e4m3fn", "float"') == "fp8"
    assert op_precision('"float", "float"') == "fp32"
    assert op_precision('"GenericList", "long int"') is None
    assert compute_mix({}, {}) is None


def test_mixed_precision_stays_a_lever_while_much_of_the_matrix_work_is_fp32():
    # half the matrix time in bf16, compute 80% of the step: mixed precision could still save (1 - 0.5) * 40% = 20%
    half = ComputeMix(low=0.5, dtype="bf16", conv=0.0, text="bf16 on 50% of the matrix kernels' time")
    assert "06" in classify(0.0, 0.1, device_kind="cuda", compute_fraction=0.8, idle_fraction=0.2,
                            compute_mix=half).next_notebooks
    most = ComputeMix(low=0.9, dtype="bf16", conv=0.3, text="bf16 on 90% of the matrix kernels' time")
    b = classify(0.0, 0.1, device_kind="cuda", compute_fraction=0.8, idle_fraction=0.2, compute_mix=most)
    assert b.next_notebooks[0] == "07" and "06" not in b.next_notebooks  # 10% of 40% = 4%: below the threshold


def test_a_public_fp32_resnet_keeps_mixed_precision_and_channels_last():
    root = HERE.parent.parent / "shared" / "public_traces"
    key = "tb_plugin/resnet50_num_workers_4/worker0.1623212756351.pt.trace.json.gz"
    if not (root / key).is_file():
        pytest.skip(f"{key} is not in ../shared/public_traces (tests/data/public_traces/README.md)")
    rt = read_kineto(root / key)
    assert rt.compute_mix.low == 0.0 and rt.compute_mix.dtype == "fp32" and rt.compute_mix.conv > 0.5
    assert analyze([rt]).bottleneck.next_notebooks[:2] == ("06", "07")


def test_deepseek_v3s_fp8_rank_is_not_advised_mixed_precision():
    rt = read_kineto(_shared("deepseek_profile_data/train.json",
                             "d7b7232efa7708990df5973a0558cf07394ec3f9387ac5d705a607960f2467c1"))
    a, mix = analyze([rt]), rt.compute_mix
    assert mix.dtype == "fp8" and mix.low > 0.95 and mix.conv == 0.0
    assert "06" not in a.bottleneck.next_notebooks and "precision is already low" in a.bottleneck.reason


# --------------------------------------------------------------------------- issue 44, item 8: at the threshold


def _rank(compute: float, idle: float, sync: float, *, data: float | None = None) -> RankTrace:
    """Six steps of 100 ms on ROCm: the device computes ``compute`` of each, idles ``idle``; the host waits in
    hipStreamSynchronize for ``sync`` of it while the device computes."""
    steps = tuple(StepPhases(step=i, step_s=0.100, compute=compute * 0.1, idle=idle * 0.1, comm_exposed=0.0, comm=0.0,
                             data=data, sync_wait=sync * 0.1, sync_on={"compute": sync * 0.1}) for i in range(6))
    ops = ({"name": "hipStreamSynchronize", "calls": 6, "self_ms": sync * 600, "where": "host"},
           {"name": "Cijk_Alik_Bljk_BBS_BH_MT256x256x64", "calls": 600, "self_ms": 400.0, "where": "device"})
    return RankTrace(source=Path("mi300x.json"), format="kineto", device_kind="rocm", steps=steps, top_ops=ops)


def test_a_verdict_at_the_90_percent_rule_says_so_and_names_the_sync_wait():
    a = analyze([_rank(0.91, 0.09, 0.30)])
    b = a.bottleneck
    assert a.label == "device-bound" and b.at_threshold.startswith("the device computes for 91% against the 90% rule")
    head = a.headline()
    assert "at the threshold (the device computes for 91% against the 90% rule" in head
    assert "the host waits in synchronize calls (hipStreamSynchronize) for 30% of the step" in head
    first = a.verdict().headline()
    assert len(first) <= HEADLINE_CHARS and first.startswith("DEVICE-BOUND at the 90% rule: compute first")
    assert "busy 91%" in first and "host sync 30%" in first


def test_below_the_rule_the_other_label_is_named():
    # 88% (HTA's figure on the same trace) with 12% idle: below the rule the host's own work is above the threshold
    b = analyze([_rank(0.88, 0.12, 0.30, data=0.0)]).bottleneck
    assert b.label == "balanced" and "at or above it: device-bound" in b.at_threshold
    b = analyze([_rank(0.91, 0.09, 0.30, data=0.0)]).bottleneck
    assert b.label == "device-bound" and "below it: the same label" in b.at_threshold


def test_far_from_any_threshold_nothing_is_said_and_the_sync_stays_in_the_details():
    a = analyze([_rank(0.98, 0.02, 0.30)])
    assert a.bottleneck.at_threshold == "" and "at the threshold" not in a.headline()
    assert "synchronize calls" not in a.headline() and "synchronize calls (hipStreamSynchronize)" in a.sentence()


# --------------------------------------------------------------------------- the issue's own traces, where present

#: AMD-AGI/TraceLens 13730e84e1ee04c1e272d23b60e792492f1a39c8, tests/traces/{mi300,h100}/ (MIT): Qwen1.5-0.5B-Chat
#: inference, one ProfilerStep each (tests/data/public_traces/README.md, Further traces).
QWEN = {"mi300": ("tracelens/mi300/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
                  "1bfbe813843070fcf629db2d67afbcabafe4e0a61bd1d30157b58a171f0664ac"),
        "h100": ("tracelens/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
                 "7c4a4b817b79db0aa90f0df0368de88ac6f6e22261864b68fa88d0a3f9c5c63d")}


@pytest.mark.parametrize("gpu", sorted(QWEN))
def test_the_qwen_bf16_inference_traces_are_not_advised_mixed_precision(gpu):
    rt = read_kineto(_shared(*QWEN[gpu]))
    a, mix = analyze([rt]), rt.compute_mix
    assert mix.dtype == "bf16" and mix.low > 0.99 and mix.ops_low >= 216 and mix.conv == 0.0
    assert "06" not in a.bottleneck.next_notebooks and "07" not in a.bottleneck.next_notebooks
    assert "precision is already low (bf16 on 100%" in a.bottleneck.reason


def test_the_mi300x_qwen_trace_is_at_the_90_percent_rule_with_its_sync_wait_named():
    # device busy 91% here, 88% by HTA (the issue): at the rule, and the host's synchronize calls take 30% of the step
    a = analyze([read_kineto(_shared(*QWEN["mi300"]))])
    assert a.label == "device-bound" and "against the 90% rule" in a.bottleneck.at_threshold
    head = a.headline()
    assert "at the threshold" in head and "the host waits in synchronize calls (hipDeviceSynchronize) for 3" in head
    first = a.verdict().headline()
    assert len(first) <= HEADLINE_CHARS and "at the 90% rule" in first and "host sync 3" in first


def test_an_exposed_input_near_its_threshold_names_the_other_sides_label():
    b = classify(0.12, 0.1, device_kind="cuda", compute_fraction=0.5, idle_fraction=0.12)
    assert b.label == "balanced" and b.reason.startswith("at the threshold (input exposed 12% against the 10% "
                                                         "threshold, within 5 points; on its other side: device-bound)")
    far = classify(0.30, 0.1, device_kind="cuda", compute_fraction=0.5, idle_fraction=0.30)
    assert far.at_threshold == "" and not far.reason.startswith("at the threshold")


def test_the_host_side_names_its_input_after_its_own_work_when_both_are_levers():
    # idle 50%, input 15%: the host's own work (35%) is the larger host-side lever, the input (15%) the next one
    b = classify(0.15, 0.1, device_kind="cuda", compute_fraction=0.5, idle_fraction=0.5)
    assert b.label == "host-bound" and b.next_notebooks[:3] == ("09", "03", "02")
    assert "then the input (15% of the step)" in b.next_reason
    only = classify(0.03, 0.1, device_kind="cuda", compute_fraction=0.78, idle_fraction=0.19)
    assert only.label == "balanced" and only.next_notebooks == ("06", "07", "09")
