"""Tests of helpers.compute.model: the multimodal policy network."""

from __future__ import annotations

import math

import pytest
import torch

from helpers.compute.model import (
    PAD_ID,
    MultimodalPolicy,
    PolicyConfig,
    build_policy,
    count_parameters,
)
from helpers.errors import ParameterError

TINY = PolicyConfig(
    image_size=16,
    conv_channels=(8, 16),
    convs_per_stage=2,
    vocab_size=32,
    text_len=6,
    d_model=16,
    n_heads=2,
    n_layers=2,
    fusion_hidden=32,
    n_actions=5,
)


def _inputs(cfg: PolicyConfig, batch: int = 4, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(batch, cfg.in_channels, cfg.image_size, cfg.image_size, generator=g)
    tokens = torch.randint(1, cfg.vocab_size, (batch, cfg.text_len), generator=g)
    return images, tokens


def _model(cfg: PolicyConfig = TINY, seed: int = 0) -> MultimodalPolicy:
    torch.manual_seed(seed)
    return build_policy(cfg)


def test_forward_shapes_and_dtypes_tiny():
    model = _model()
    images, tokens = _inputs(TINY, batch=4)
    logits, value = model(images, tokens)
    assert logits.shape == (4, TINY.n_actions)
    assert value.shape == (4,)
    assert logits.dtype == torch.float32 and value.dtype == torch.float32
    assert torch.isfinite(logits).all() and torch.isfinite(value).all()


def test_forward_default_config_and_shorter_captions():
    cfg = PolicyConfig()
    model = _model(cfg)
    images, tokens = _inputs(cfg, batch=2)
    logits, value = model(images, tokens[:, :5])  # L < text_len is allowed
    assert logits.shape == (2, cfg.n_actions) and value.shape == (2,)


def test_initial_policy_is_near_uniform():
    model = _model()
    images, tokens = _inputs(TINY, batch=8)
    logits, _ = model(images, tokens)
    probs = logits.softmax(-1)
    entropy = -(probs * probs.log()).sum(-1)
    assert torch.allclose(entropy, torch.full_like(entropy, math.log(TINY.n_actions)), atol=1e-2)


def test_all_padding_row_is_finite_forward_and_backward():
    model = _model()
    images, tokens = _inputs(TINY, batch=3)
    tokens[1] = PAD_ID  # a caption made only of padding
    tokens[2, 3:] = PAD_ID
    logits, value = model(images, tokens)
    assert torch.isfinite(logits).all() and torch.isfinite(value).all()
    (logits.sum() + value.sum()).backward()
    for name, p in model.named_parameters():
        assert p.grad is None or torch.isfinite(p.grad).all(), name


def test_all_padding_row_leaves_every_query_a_key(monkeypatch):
    """Backends differ on fully masked rows (NaN on some); the mask must never have one."""
    masks = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        masks.append(kwargs["attn_mask"])
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    model = _model()
    images, tokens = _inputs(TINY, batch=3)
    tokens[1] = PAD_ID
    tokens[2, 2:] = PAD_ID
    model(images, tokens)
    mask = masks[0][:, 0, 0, :]  # (B, L), True = attend
    assert mask.any(dim=-1).all()
    assert mask[0].all()
    assert mask[2].tolist() == [True, True] + [False] * (TINY.text_len - 2)


def test_all_padding_row_text_feature_is_zero():
    model = _model().eval()
    tokens = torch.zeros(2, TINY.text_len, dtype=torch.int64)
    tokens[0, :2] = torch.tensor([3, 4])
    feature = model.text_encoder(tokens)
    assert torch.equal(feature[1], torch.zeros_like(feature[1]))
    assert feature[0].abs().sum() > 0


def test_padding_is_ignored():
    """Trailing padding must not change the output: masked keys and masked pooling."""
    model = _model().eval()
    images, tokens = _inputs(TINY, batch=2)
    short = tokens[:, :3]
    padded = torch.cat([short, torch.zeros(2, 3, dtype=torch.int64)], dim=1)
    with torch.no_grad():
        logits_a, value_a = model(images, short)
        logits_b, value_b = model(images, padded)
    torch.testing.assert_close(logits_a, logits_b, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(value_a, value_b, rtol=1e-5, atol=1e-6)


def test_text_changes_output():
    """Real tokens matter (the text branch is wired in)."""
    model = _model().eval()
    images, tokens = _inputs(TINY, batch=2)
    other = tokens.clone()
    other[:, 0] = tokens[:, 0] % (TINY.vocab_size - 1) + 1  # a different real token
    assert (other[:, 0] != tokens[:, 0]).all()
    with torch.no_grad():
        _, value_a = model(images, tokens)
        _, value_b = model(images, other)
    assert not torch.allclose(value_a, value_b)


def test_attention_uses_sdpa(monkeypatch):
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append(kwargs.get("attn_mask"))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    model = _model()
    images, tokens = _inputs(TINY, batch=2)
    model(images, tokens)
    assert len(calls) == TINY.n_layers
    assert calls[0].dtype == torch.bool and calls[0].shape == (2, 1, 1, TINY.text_len)


def test_channels_last_matches_contiguous():
    model = _model().eval()
    images, tokens = _inputs(TINY, batch=4)
    with torch.no_grad():
        ref_logits, ref_value = model(images, tokens)
        model = model.to(memory_format=torch.channels_last)
        cl_images = images.contiguous(memory_format=torch.channels_last)
        assert cl_images.is_contiguous(memory_format=torch.channels_last)
        logits, value = model(cl_images, tokens)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(value, ref_value, rtol=1e-4, atol=1e-5)


def test_channels_last_backward_and_grad_layout():
    model = _model().to(memory_format=torch.channels_last)
    images, tokens = _inputs(TINY, batch=4)
    logits, value = model(images.contiguous(memory_format=torch.channels_last), tokens)
    (logits.sum() + value.sum()).backward()
    conv = model.image_encoder.stages[0][0]
    assert conv.weight.grad is not None and torch.isfinite(conv.weight.grad).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_forward_backward(dtype):
    model = _model()
    images, tokens = _inputs(TINY, batch=4)
    tokens[0] = PAD_ID
    with torch.amp.autocast("cpu", dtype=dtype):
        logits, value = model(images.contiguous(memory_format=torch.channels_last), tokens)
    assert logits.dtype == dtype and value.dtype == dtype
    assert torch.isfinite(logits).all() and torch.isfinite(value).all()
    (logits.float().sum() + value.float().sum()).backward()
    for name, p in model.named_parameters():
        assert p.grad is None or torch.isfinite(p.grad).all(), name


def test_build_policy_is_deterministic_from_seed():
    a = _model(seed=3).state_dict()
    b = _model(seed=3).state_dict()
    c = _model(seed=4).state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a if a[k].is_floating_point())


def test_build_policy_device_and_type_check():
    torch.manual_seed(0)
    model = build_policy(TINY, device="cpu")
    assert all(p.device.type == "cpu" for p in model.parameters())
    assert model.training
    with pytest.raises(ParameterError, match="PolicyConfig"):
        build_policy({"d_model": 16})  # type: ignore[arg-type]


def test_count_parameters():
    model = _model()
    expected = sum(p.numel() for p in model.parameters())
    assert count_parameters(model) == expected
    frozen = sum(p.numel() for p in model.text_encoder.parameters())
    for p in model.text_encoder.parameters():
        p.requires_grad_(False)
    assert count_parameters(model, trainable_only=True) == expected - frozen
    # BatchNorm running statistics are buffers, not parameters.
    bn = model.image_encoder.stages[0][1]
    assert count_parameters(bn) == 2 * bn.num_features


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"d_model": 63}, "d_model"),
        ({"n_heads": 0}, "n_heads"),
        ({"n_layers": -1}, "n_layers"),
        ({"conv_channels": ()}, "conv_channels"),
        ({"conv_channels": (8, 0)}, "conv_channels"),
        ({"image_size": 4}, "image_size"),
        ({"vocab_size": 1}, "vocab_size"),
        ({"n_actions": 1}, "n_actions"),
        ({"dropout": 1.0}, "dropout"),
        ({"dropout": -0.1}, "dropout"),
        ({"text_len": 2.5}, "text_len"),
        ({"ffn_mult": True}, "ffn_mult"),
        ({"convs_per_stage": 0}, "convs_per_stage"),
    ],
)
def test_config_validation_names_the_field(kwargs, field):
    with pytest.raises(ParameterError, match=field) as info:
        PolicyConfig(**kwargs)
    assert isinstance(info.value, ValueError)
    assert repr(next(iter(kwargs.values()))) in str(info.value)


def test_config_accepts_list_channels_and_is_frozen():
    cfg = PolicyConfig(conv_channels=[8, 16], image_size=16)  # type: ignore[arg-type]
    assert cfg.conv_channels == (8, 16)
    hash(cfg)
    with pytest.raises(AttributeError):
        cfg.d_model = 32  # type: ignore[misc]


@pytest.mark.parametrize(
    ("images_shape", "tokens", "message"),
    [
        ((2, 1, 16, 16), torch.ones(2, 6, dtype=torch.int64), "images"),
        ((2, 3, 16, 16), torch.ones(3, 6, dtype=torch.int64), "tokens"),
        ((2, 3, 16, 16), torch.ones(2, 7, dtype=torch.int64), "text_len"),
        ((2, 3, 16, 16), torch.ones(2, 6), "dtype"),
    ],
)
def test_forward_rejects_bad_inputs(images_shape, tokens, message):
    model = _model()
    with pytest.raises(ParameterError, match=message):
        model(torch.randn(images_shape), tokens)


def test_forward_rejects_integer_images():
    model = _model()
    with pytest.raises(ParameterError, match="float"):
        model(torch.zeros(2, 3, 16, 16, dtype=torch.uint8), torch.ones(2, 6, dtype=torch.int64))
