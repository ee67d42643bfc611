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
from helpers.device import Capability
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
    assert "slower" in channels_last_decision({"fp32": slow})["reason"]
    na = channels_last_decision({}, applicable=False, why_not="not supported on NPU")
    assert na["recommendation"] == "not applicable" and na["value"] is None and "NPU" in na["reason"]
    with pytest.raises(ParameterError, match="no comparison"):
        channels_last_decision({})
