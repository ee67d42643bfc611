"""Tests of helpers.compute.fusion (fused vs hand-written attention, guarded torch.compile)."""

from __future__ import annotations

import shutil

import pytest
import torch

from helpers.compute.fusion import attention_inputs, fused_attention, manual_attention, try_compile
from helpers.compute.model import PolicyConfig, build_policy
from helpers.errors import ParameterError


@pytest.mark.parametrize("pad_fraction", [0.0, 0.25])
def test_sdpa_equals_manual_attention(pad_fraction):
    q, k, v, mask = attention_inputs(3, 2, 16, 8, pad_fraction=pad_fraction, seed=1)
    assert (mask is None) == (pad_fraction == 0.0)
    ref = manual_attention(q, k, v, mask)
    out = fused_attention(q, k, v, mask)
    assert out.shape == (3, 2, 16, 8)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_padding_mask_hides_padded_keys():
    q, k, v, mask = attention_inputs(2, 1, 8, 4, pad_fraction=0.5, seed=2)
    assert mask[1].sum() == 4 and mask[0].all()
    out = fused_attention(q, k, v, mask)
    # changing the padded keys/values of sample 1 must not change its output
    k2, v2 = k.clone(), v.clone()
    k2[1, :, 4:] += 100.0
    v2[1, :, 4:] -= 100.0
    torch.testing.assert_close(fused_attention(q, k2, v2, mask), out)
    torch.testing.assert_close(manual_attention(q, k2, v2, mask), out, rtol=1e-5, atol=1e-5)


def test_attention_inputs_validation_and_seed():
    a = attention_inputs(1, 1, 4, 2, seed=3)[0]
    assert torch.equal(a, attention_inputs(1, 1, 4, 2, seed=3)[0])
    with pytest.raises(ParameterError, match="seq_len"):
        attention_inputs(1, 1, 0, 2)
    with pytest.raises(ParameterError, match="pad_fraction"):
        attention_inputs(1, 1, 4, 2, pad_fraction=1.0)


def test_compile_failure_is_reported_not_raised():
    def broken_compiler(fn, **kwargs):
        raise RuntimeError("InductorError: C++ compile error\nno compiler found")

    result = try_compile(lambda x: x + 1, lambda c: c(torch.ones(2)), compiler=broken_compiler)
    assert not result.ok and result.compiled is None and result.first_call_s is None
    assert result.error == "RuntimeError: InductorError: C++ compile error"


def test_compile_failure_on_first_call_is_reported():
    def lazy_compiler(fn, **kwargs):
        def compiled(*args):
            raise OSError("cc1: not found")
        return compiled

    result = try_compile(lambda x: x, lambda c: c(torch.ones(1)), compiler=lazy_compiler)
    assert not result.ok and "cc1: not found" in result.error


def test_try_compile_with_identity_compiler_times_first_call():
    result = try_compile(lambda x: x * 2, lambda c: c(torch.ones(3)), compiler=lambda fn, **kw: fn)
    assert result.ok and result.first_call_s >= 0.0
    assert torch.equal(result.first_output, torch.full((3,), 2.0))


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("cc") is None, reason="no C compiler for Inductor")
def test_compiled_model_matches_eager():
    torch.manual_seed(0)
    cfg = PolicyConfig(image_size=16, conv_channels=(4,), d_model=8, n_heads=2, n_layers=1, fusion_hidden=8,
                       vocab_size=16, text_len=4, n_actions=2)
    model = build_policy(cfg).eval()
    images = torch.randn(2, 3, 16, 16)
    tokens = torch.tensor([[1, 2, 3, 0], [4, 5, 0, 0]])
    with torch.no_grad():
        ref = model(images, tokens)
        result = try_compile(model, lambda c: c(images, tokens))
    assert result.ok, result.error
    for got, want in zip(result.first_output, ref):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
