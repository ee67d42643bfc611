"""Tests of helpers.compute.memory_format (channels_last tracing, conversion, outputs)."""

from __future__ import annotations

import types

import pytest
import torch
from torch import nn

from helpers.compute.memory_format import (
    FORMATS,
    channels_last_status,
    conv_step,
    max_abs_diff,
    output_tolerance,
    to_memory_format,
    trace_memory_format,
)
from helpers.compute.model import PolicyConfig, build_policy
from helpers.device import Capability, get_accelerator
from helpers.errors import ParameterError
from helpers.experiments.memory_format import channels_last_decision

CFG = PolicyConfig(image_size=32, conv_channels=(8, 16), d_model=16, n_heads=2, n_layers=1, fusion_hidden=32)


def _model_and_images(seed: int = 0):
    torch.manual_seed(seed)
    model = build_policy(CFG)
    images = torch.randn(4, 3, 32, 32)
    return model, images


class _Dropper(nn.Module):
    """A conv, then a flatten/unflatten round trip (as before a linear head) that returns NCHW, then a conv."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.flat = nn.Flatten(1)  # (N, C*H*W): not a view of NHWC storage -> copied in NCHW order
        self.unflat = nn.Unflatten(1, (8, 16, 16))
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.unflat(self.flat(self.conv1(x))))


def test_trace_keeps_channels_last_through_conv_encoder():
    model, images = _model_and_images()
    cl_model, cl_images = to_memory_format(model, images, "channels_last")
    trace = trace_memory_format(cl_model.image_encoder, cl_images)
    kinds = {layer.kind for layer in trace.layers}
    assert {"Conv2d", "BatchNorm2d", "ReLU"} <= kinds
    assert trace.all_kept, trace.dropped
    # one Conv2d + BatchNorm2d + ReLU per stage
    assert len(trace.layers) == 3 * len(CFG.conv_channels)


def test_trace_of_nchw_model_reports_every_layer_dropped():
    model, images = _model_and_images()
    trace = trace_memory_format(model.image_encoder, images)
    assert trace.layers and not trace.kept
    assert not trace.all_kept


def test_trace_names_the_layer_that_drops_channels_last():
    torch.manual_seed(0)
    model, images = to_memory_format(_Dropper(), torch.randn(2, 3, 16, 16), "channels_last")
    trace = trace_memory_format(model, images)
    assert trace.kept[0] == "conv1"
    assert "unflat" in trace.dropped  # the 4-D output rebuilt from a flattened view is NCHW
    assert not trace.all_kept
    rows = trace.rows()
    assert [r["layer"] for r in rows] == [layer.name for layer in trace.layers]


def test_trace_removes_hooks():
    model, images = _model_and_images()
    trace_memory_format(model, images, torch.randint(1, CFG.vocab_size, (4, CFG.text_len)))
    assert all(not m._forward_hooks for m in model.modules())


def test_to_memory_format_copies_and_keeps_original():
    model, images = _model_and_images()
    cl_model, cl_images = to_memory_format(model, images, "channels_last")
    assert cl_images.is_contiguous(memory_format=torch.channels_last)
    conv = model.image_encoder.stages[0][0]
    assert conv.weight.is_contiguous()  # original untouched
    assert cl_model.image_encoder.stages[0][0].weight.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(cl_images, images)
    with pytest.raises(ParameterError, match="memory format"):
        to_memory_format(model, images, "nhwc")
    with pytest.raises(ParameterError, match="4-D"):
        to_memory_format(model, images[0], "nchw")


@pytest.mark.parametrize("backward", [False, True])
def test_channels_last_outputs_match_nchw_fp32(backward):
    model, images = _model_and_images()
    outs, grads = {}, {}
    for fmt in FORMATS:
        m, x = to_memory_format(model, images, fmt)
        outs[fmt] = conv_step(m.image_encoder, x, backward=backward)()
        if backward:
            grads[fmt] = m.image_encoder.stages[0][0].weight.grad.contiguous()
    rtol, atol = output_tolerance(torch.float32)
    torch.testing.assert_close(outs["channels_last"], outs["nchw"], rtol=rtol, atol=atol)
    if backward:
        torch.testing.assert_close(grads["channels_last"], grads["nchw"], rtol=1e-3, atol=1e-3)
        assert max_abs_diff(grads["channels_last"], grads["nchw"]) < 1e-3


def test_channels_last_outputs_match_under_bf16_autocast():
    model, images = _model_and_images()
    ref = conv_step(model.image_encoder, images, backward=False)()
    m, x = to_memory_format(model, images, "channels_last")
    out = conv_step(m.image_encoder, x, backward=True,
                    autocast=lambda: torch.autocast("cpu", dtype=torch.bfloat16))()
    assert out.dtype == torch.bfloat16
    rtol, atol = output_tolerance(torch.bfloat16)
    torch.testing.assert_close(out.float(), ref, rtol=rtol, atol=atol)


def test_conv_step_resets_gradients():
    model, images = _model_and_images()
    step = conv_step(model.image_encoder, images)
    step()
    g1 = model.image_encoder.stages[0][0].weight.grad.clone()
    step()
    # BatchNorm in training mode: same batch, same statistics -> same gradient, not doubled
    torch.testing.assert_close(model.image_encoder.stages[0][0].weight.grad, g1, rtol=1e-4, atol=1e-6)


def test_channels_last_status_from_capabilities():
    yes = types.SimpleNamespace(kind="cuda", capabilities=types.SimpleNamespace(channels_last=Capability(True, "")))
    no = types.SimpleNamespace(kind="npu", capabilities=types.SimpleNamespace(
        channels_last=Capability(False, "not supported on NPU; keep NCHW")))
    assert channels_last_status(yes) == (True, "")
    ok, why = channels_last_status(no)
    assert not ok and "NCHW" in why


def test_tolerance_and_diff_errors():
    with pytest.raises(ParameterError, match="tolerance"):
        output_tolerance(torch.int32)
    assert output_tolerance(torch.float32, tf32=True)[0] > output_tolerance(torch.float32)[0]
    assert output_tolerance(torch.bfloat16, tf32=True) == output_tolerance(torch.bfloat16)
    with pytest.raises(ParameterError, match="shapes differ"):
        max_abs_diff(torch.zeros(2), torch.zeros(3))
    assert max_abs_diff(torch.tensor([1.0, 2.0]), torch.tensor([1.5, 2.0])) == pytest.approx(0.5)


def _cmp(a_times, b_times):
    from helpers.timing import Comparison, Measurement
    return Comparison.from_measurements(Measurement("NCHW", tuple(a_times), 0), Measurement("cl", tuple(b_times), 0))


def test_channels_last_verdict():
    fast = _cmp([1.0, 1.01, 0.99, 1.02, 1.0], [0.5, 0.51, 0.49, 0.5, 0.52])
    same = _cmp([1.0, 1.01, 0.99, 1.02, 1.0], [1.0, 1.02, 0.98, 1.01, 1.0])
    v = channels_last_decision({"fp32": same, "bfloat16 autocast": fast})
    assert v["recommendation"] == "enable" and v["best"] == "bfloat16 autocast"
    assert v["value"] == pytest.approx(fast.ratio) and "fp32" in v["reason"]
    v = channels_last_decision({"fp32": same})
    assert v["recommendation"] == "leave off" and v["spread"]["ci_low"] <= 1.0
    slow = _cmp([0.5, 0.51, 0.49, 0.5, 0.52], [1.0, 1.01, 0.99, 1.02, 1.0])
    assert channels_last_decision({"fp32": slow})["reason"].startswith("channels_last was slower than NCHW in fp32 (")
    noisy = _cmp([0.5, 0.51, 0.49, 0.5, 0.52], [0.3, 1.2, 0.4, 1.3, 1.25])  # slower still, its interval spans 1
    assert noisy.ratio < slow.ratio and noisy.outcome() == "no_difference"
    v = channels_last_decision({"fp32": slow, "bfloat16 autocast": noisy})
    assert v["recommendation"] == "leave off" and v["best"] == "fp32"
    assert v["reason"].startswith("channels_last was slower than NCHW in fp32; no measurable difference in "
                                  "bfloat16 autocast (best fp32: 0.50x)")
    assert "slower than NCHW in fp32 and bfloat16 autocast (" in channels_last_decision(
        {"fp32": slow, "bfloat16 autocast": slow})["reason"]
    na = channels_last_decision({}, applicable=False, why_not="not supported on NPU")
    assert na["recommendation"] == "not applicable" and na["value"] is None and "NPU" in na["reason"]
    with pytest.raises(ParameterError, match="no comparison"):
        channels_last_decision({})


# --------------------------------------------------------------------------- the notebook's result


def _written(records, tmp_path):
    from helpers.results import ResultsStore

    store = ResultsStore(tmp_path / "r.jsonl", notebook="07_channels_last")
    return [(r.experiment, r.variant, r.metric, r.unit) for r in store.write(records)]


def _result(comparisons=None, *, builtin=True, convs=None, device_ok=True, compiled=None, low="bfloat16"):
    from helpers.compute.memory_format import FormatTrace, LayerFormat
    from helpers.experiments import memory_format as mf

    same = _cmp([1.0, 1.01, 0.99, 1.02, 1.0], [1.0, 1.02, 0.98, 1.01, 1.0])
    comparisons = {"fp32": same} if comparisons is None else comparisons
    applicable = device_ok and convs != 0
    why = "" if device_ok else "not supported on NPU; keep NCHW"
    if device_ok and convs == 0:
        why = "your model has no 2-D convolution (nn.Conv2d): channels_last reorders only 4-D tensors"
    trace = FormatTrace((LayerFormat("stages.0.0", "Conv2d", (2, 8, 16, 16), True),
                         LayerFormat("head", "Conv2d", (2, 8, 16, 16), False))) if device_ok else None
    job = types.SimpleNamespace(is_builtin=builtin)
    return mf.ChannelsLastResult(
        job=job, device="cpu", device_name="fake cpu", settings={"steps": 5, "warmup_steps": 1, "seed": 0,
                                                                "job": "" if builtin else "mine.py:make_job"},
        n_images=12, images=(torch.zeros(2, 3, 32, 32),) * 3, conv_channels=(8, 16),
        job_description={} if builtin else {"job": "mine"}, user_convs=convs, device_applicable=device_ok,
        device_why="" if device_ok else why, applicable=applicable, why_not=why, trace=trace,
        correctness=((("float32", 1e-7, 1e-5, 1e-5),) + (((low, 1e-3, 1e-2, 1e-2),) if low else ()))
        if device_ok else (),
        low=low, comparisons=comparisons if applicable else {}, cudnn_benchmark=False,
        cpu_bf16={"native_bf16": False, "detail": "none"} if builtin else None,
        attention=mf.AttentionOutcome((2, 2, 16, 8), 6e-7, _pair([1.0] * 5, [0.5] * 5, "manual attention", "SDPA")),
        compiled=compiled or mf.CompileOutcome("skipped", "compile_model is False"))


def _pair(a_times, b_times, a_name, b_name):
    from helpers.timing import Comparison, Measurement

    return Comparison.from_measurements(Measurement(a_name, tuple(a_times), 0), Measurement(b_name, tuple(b_times), 0))


NOTEBOOK_KEYS = [("dataset", "fixed batches", "batches", "batches"),
                 ("memory_format", "channels_last trace", "layers_kept", "layers"),
                 ("correctness", "channels_last vs NCHW (fp32)", "max_abs_diff", "1"),
                 ("correctness", "channels_last vs NCHW (bfloat16 autocast)", "max_abs_diff", "1"),
                 ("channels_last", "channels_last fp32 vs NCHW fp32", "speedup", "x"),
                 ("channels_last", "channels_last bfloat16 autocast vs NCHW bfloat16 autocast", "speedup", "x"),
                 ("correctness", "SDPA vs manual attention", "max_abs_diff", "1"),
                 ("attention", "SDPA vs manual attention", "speedup", "x"),
                 ("compile", "torch.compile", "first_call_time", "s")]


def _named(a_times, b_times, label):
    return _pair(a_times, b_times, f"NCHW {label}", f"channels_last {label}")


def test_result_records_what_the_notebook_recorded_and_enables_the_faster_layout(tmp_path):
    comps = {"fp32": _named([1.0, 1.01, 0.99, 1.02, 1.0], [1.0, 1.02, 0.98, 1.01, 1.0], "fp32"),
             "bfloat16 autocast": _named([1.0, 1.01, 0.99, 1.02, 1.0], [0.5, 0.51, 0.49, 0.5, 0.52],
                                         "bfloat16 autocast")}
    r = _result(comps)
    assert _written(r.records(), tmp_path) == NOTEBOOK_KEYS
    v = r.verdict()
    assert (v.notebook, v.recommendation, v.action.value, v.extra["best"]) == (
        "07_channels_last", "enable", "channels_last", "bfloat16 autocast")
    assert v.extra["decision_threshold"] == 1.05
    assert v.reason.startswith("channels_last made the conv encoder's forward+backward 2.00x faster")
    assert v.reason.endswith("Fusion: SDPA vs manual attention 2.00x (max diff 6.0e-07); torch.compile skipped "
                             "(compile_model is False)")
    assert v.context == ("conv encoder (8, 16) forward+backward on 3 fixed batches of (2, 3, 32, 32), 5 timed calls "
                         "after 1 warm-up per variant; attention (2, 2, 16, 8); on cpu (fake cpu)")
    assert r.trace_text() == "4-D outputs in the conv encoder: 2; channels_last kept by 1; dropped by: head"
    assert list(r.trace_table()["layer"]) == ["stages.0.0", "head"]
    assert r.match_text().endswith("float32, bfloat16")
    assert "per forward+backward" in r.timing_text() and "CPU native bf16: False" in r.timing_text()
    assert list(r.speedups()) == ["channels_last vs NCHW (fp32)", "channels_last vs NCHW (bfloat16 autocast)",
                                  "SDPA vs manual attention"]
    spec = r.try_it(get_accelerator("cpu"), {"steps": 20, "warmup_steps": 3, "seed": 0})
    assert not spec.unavailable and spec.reference is not None
    assert (spec.knobs["memory_format"].value, spec.knobs["autocast"].value) == ("channels_last", "off")


def test_result_of_a_users_job_leaves_off_and_names_the_job(tmp_path):
    r = _result({"fp32": _named([1.0, 1.01, 0.99, 1.02, 1.0], [1.0, 1.02, 0.98, 1.01, 1.0], "fp32")}, convs=3,
                builtin=False, low=None)
    keys = _written(r.records(), tmp_path)
    assert ("channels_last", "channels_last fp32 vs NCHW fp32", "speedup", "x") in keys
    assert ("add_comparison", "fp32", "mine.py:make_job") in [
        (name, kw.get("precision"), kw.get("job")) for name, _, kw in r.records().calls]
    v = r.verdict()
    assert v.recommendation == "leave off" and v.action.value == "contiguous_format"
    assert "channels_last gave no speedup of at least 1.05x" in v.reason
    assert v.context.startswith("your job's training step (mine) on 4 fixed batches")
    assert "(built-in job)" in v.context
    assert "3 nn.Conv2d layer(s)" in r.batches_text() and "training step of your job" in r.timing_text()
    assert "CPU native bf16" not in r.timing_text() and "no autocast dtype on cpu" in r.correctness_text()


def test_result_without_a_convolution_or_on_an_npu_is_not_applicable(tmp_path):
    from helpers.experiments import memory_format as mf

    r = _result(convs=0, builtin=False)
    assert _written(r.records(), tmp_path) == NOTEBOOK_KEYS[:4] + NOTEBOOK_KEYS[6:]
    v = r.verdict()
    assert (v.recommendation, v.value, v.action.text) == ("not applicable", None, "channels_last: not applicable")
    assert "no 2-D convolution" in v.reason and "not applicable to your job" in r.timing_text()
    spec = r.try_it(get_accelerator("cpu"), {"steps": 20, "warmup_steps": 3, "seed": 0})
    assert "no 2-D convolution" in spec.unavailable and spec.reference is None
    npu = _result(device_ok=False, compiled=mf.CompileOutcome("failed", "RuntimeError: no compiler"))
    keys = _written(npu.records(), tmp_path)
    assert keys == [NOTEBOOK_KEYS[0], NOTEBOOK_KEYS[1]] + NOTEBOOK_KEYS[6:]
    assert npu.verdict().recommendation == "not applicable" and "NCHW" in npu.verdict().reason
    assert npu.trace_table().iloc[0]["channels_last"] == "not measured on cpu"
    assert npu.compile_text() == "torch.compile failed: RuntimeError: no compiler"
    assert npu.fusion_text().endswith("torch.compile failed (RuntimeError: no compiler)")


def test_result_with_torch_compile_records_its_first_call_and_steady_state(tmp_path):
    from helpers.experiments import memory_format as mf

    k = mf.CompileOutcome("measured", first_call_s=12.0, max_abs_diff=1e-6,
                          comparison=_pair([1.0, 1.01, 0.99, 1.02, 1.0], [0.5, 0.51, 0.49, 0.5, 0.52], "eager",
                                           "compiled"))
    r = _result(compiled=k)
    assert _written(r.records(), tmp_path)[-3:] == [("correctness", "compiled vs eager", "max_abs_diff", "1"),
                                                    ("compile", "torch.compile", "first_call_time", "s"),
                                                    ("compile", "compiled vs eager", "speedup", "x")]
    assert "pays for itself after about 24 steps" in r.compile_text()
    assert "torch.compile 2.00x in steady state after a 12 s first call" in r.verdict().reason
    assert "compiled vs eager (steady state)" in r.speedups()


def test_run_measures_the_builtin_job_on_small_data(tmp_path):
    from helpers.experiments import memory_format as mf
    from helpers.experiments.registry import spec_for
    from helpers.jobs.load import notebook_job
    from helpers.pipeline.dataset import build_embedded

    root = build_embedded(tmp_path / "photos", n_images=12, seed=3)
    P = {p.name: p.default for p in spec_for("07_channels_last")}
    P.update(data_dir=str(root), batch_size=4, image_size=32, text_len=8, model_width=4, d_model=16, steps=3,
             warmup_steps=0, compile_model=False, attention_seq_len=16, attention_heads=2, attention_head_dim=8)
    ctx = types.SimpleNamespace(params=P, acc=get_accelerator("cpu"), job=lambda: notebook_job(P))
    r = mf.run(ctx)
    keys = _written(r.records(), tmp_path)
    assert [k[0] for k in keys[:4]] == ["dataset", "memory_format", "correctness", "correctness"]
    assert ("channels_last", "channels_last fp32 vs NCHW fp32", "speedup", "x") in keys
    assert keys[-1] == ("compile", "torch.compile", "first_call_time", "s")
    assert r.batch_shape == (4, 3, 32, 32) and r.n_images == 12 and r.trace.all_kept
    assert r.verdict().recommendation in ("enable", "leave off")
    assert r.attention_text().startswith("q, k, v of shape (4, 2, 16, 8)")
