"""Correctness gates of mixed precision (issue 4): helpers.compute.amp and PPOTrainer(scaler=)."""

from __future__ import annotations

import inspect
import math

import pytest
import torch
from torch import nn

from helpers.compute.amp import (
    AmpStepper,
    clip_grad_norm_on_device,
    PROBE_OPS,
    make_grad_scaler,
    overflow_flags,
    probe_autocast_ops,
    record_output_dtypes,
    tail_relative_difference,
    resolve_autocast_dtype,
)
from helpers.compute.model import PolicyConfig, build_policy
from helpers.compute.ppo import PPOConfig, PPOTrainer
from helpers.errors import ParameterError

#: Relative tolerance of the bf16-autocast loss against fp32 after N PPO steps
#: (mean of the last 3 step losses). bf16 keeps 8 mantissa bits (relative
#: rounding 2**-8 = 0.4 %); 10 % leaves room for a few steps of divergence.
LOSS_RTOL = 0.10


def _toy(seed: int = 0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(16, 4)
    return model, opt, x


def test_real_gradscaler_signature_has_no_hysteresis():
    names = inspect.signature(torch.amp.GradScaler.__init__).parameters
    assert "hysteresis" not in names
    with pytest.raises(TypeError):
        torch.amp.GradScaler("cpu", hysteresis=2)  # the seed's invented argument
    s = make_grad_scaler("cpu", torch.float16, init_scale=1024.0, growth_interval=200)
    assert s.is_enabled() and s.get_scale() == 1024.0 and s.get_growth_interval() == 200
    assert not make_grad_scaler("cpu", torch.bfloat16).is_enabled()
    assert not make_grad_scaler("cpu", None).is_enabled()
    assert make_grad_scaler("cpu", torch.bfloat16, force=True).is_enabled()


@pytest.mark.parametrize("bad", [dict(init_scale=0.0), dict(init_scale=-1.0), dict(growth_interval=0)])
def test_make_grad_scaler_rejects_bad_values(bad):
    with pytest.raises(ParameterError):
        make_grad_scaler("cpu", torch.float16, **bad)


def test_resolve_autocast_dtype():
    assert resolve_autocast_dtype("auto", "cpu") is torch.bfloat16
    assert resolve_autocast_dtype("auto", "cuda") is torch.float16
    assert resolve_autocast_dtype("float16", "npu", ("float16", "bfloat16")) is torch.float16
    with pytest.raises(ParameterError, match="not supported"):
        resolve_autocast_dtype("float16", "cpu", ("bfloat16",))
    with pytest.raises(ParameterError):
        resolve_autocast_dtype("fp8", "cpu")


def test_injected_inf_gradient_is_skipped_counted_and_backs_off():
    model, opt, x = _toy()
    scaler = make_grad_scaler("cpu", torch.float16, init_scale=1024.0, growth_interval=200, force=True)
    stepper = AmpStepper(opt, scaler, max_norm=1.0, record_scale=True)
    before = [p.detach().clone() for p in model.parameters()]

    opt.zero_grad(set_to_none=True)
    loss = model(x).pow(2).mean()
    handle = model[0].weight.register_hook(lambda g: torch.full_like(g, float("inf")))  # injected overflow
    out = stepper.step(loss)

    assert bool(out.overflow)
    assert int(stepper.overflow_steps) == 1
    assert scaler.get_scale() == 512.0  # backoff_factor 0.5
    assert stepper.scale_history == [512.0]
    for b, p in zip(before, model.parameters()):
        assert torch.equal(b, p.detach()), "the overflowed step must not touch the weights"

    # The next, clean step is taken and not counted.
    handle.remove()
    opt.zero_grad(set_to_none=True)
    out = stepper.step(model(x).pow(2).mean())
    assert not bool(out.overflow) and math.isfinite(float(out.grad_norm))
    assert int(stepper.overflow_steps) == 1
    assert not torch.equal(before[0], model[0].weight.detach())
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_scale_grows_after_growth_interval_clean_steps():
    model, opt, x = _toy()
    scaler = make_grad_scaler("cpu", None, init_scale=8.0, growth_interval=2, force=True)
    stepper = AmpStepper(opt, scaler, record_scale=True)
    for _ in range(4):
        opt.zero_grad(set_to_none=True)
        stepper.step(model(x).pow(2).mean())
    assert stepper.scale_history == [8.0, 16.0, 16.0, 32.0]
    assert int(stepper.overflow_steps) == 0


def test_step_without_gradients_does_not_raise():
    model, opt, x = _toy()
    scaler = make_grad_scaler("cpu", torch.float16, force=True)
    # Plain GradScaler breaks here; the stepper must not.
    other = nn.Linear(4, 1)  # the loss does not depend on the optimizer's parameters
    opt.zero_grad(set_to_none=True)
    scaler.scale(other(x).sum()).backward()
    with pytest.raises(AssertionError, match="No inf checks"):
        scaler.step(opt)
    scaler = make_grad_scaler("cpu", torch.float16, force=True)
    stepper = AmpStepper(opt, scaler, max_norm=1.0)
    opt.zero_grad(set_to_none=True)
    out = stepper.step(other(x).sum())
    assert out.stepped_without_grads and stepper.no_grad_steps == 1
    with torch.no_grad():
        out = stepper.step(model(x).sum())  # a loss without graph at all
    assert out.stepped_without_grads and stepper.no_grad_steps == 2
    assert int(stepper.overflow_steps) == 0
    # and the scaler still works afterwards
    opt.zero_grad(set_to_none=True)
    out = stepper.step(model(x).pow(2).mean())
    assert not out.stepped_without_grads and scaler.get_scale() == 1024.0  # make_grad_scaler default
    assert math.isfinite(float(out.grad_norm))


def test_clipping_after_unscale_uses_true_gradient_norms():
    model, opt, x = _toy()
    ref_model, _, _ = _toy()
    opt.zero_grad(set_to_none=True)
    ref_model(x).pow(2).mean().backward()
    true_norm = float(torch.nn.utils.get_total_norm([p.grad for p in ref_model.parameters()]))

    scale = 1024.0
    scaler = make_grad_scaler("cpu", None, init_scale=scale, force=True)
    max_norm = true_norm / 4
    stepper = AmpStepper(torch.optim.SGD(model.parameters(), lr=0.0), scaler, max_norm=max_norm)
    out = stepper.step(model(x).pow(2).mean())
    assert float(out.grad_norm) == pytest.approx(true_norm, rel=1e-5)  # not scale * true_norm
    assert float(out.clip_coef) == pytest.approx(0.25, rel=1e-4)
    clipped = float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]))
    assert clipped == pytest.approx(max_norm, rel=1e-4)
    for p, r in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(p.grad, r.grad * 0.25, rtol=1e-4, atol=1e-7)


def test_clip_on_device_matches_torch_and_does_not_clip_small_grads():
    torch.manual_seed(1)
    a = [nn.Parameter(torch.randn(5, 3)) for _ in range(3)]
    b = [nn.Parameter(p.detach().clone()) for p in a]
    for p, q in zip(a, b):
        g = torch.randn_like(p) * 3
        p.grad, q.grad = g.clone(), g.clone()
    norm, coef = clip_grad_norm_on_device(a, 1.0)
    ref = torch.nn.utils.clip_grad_norm_(b, 1.0)
    torch.testing.assert_close(norm, ref)
    assert 0 < float(coef) < 1
    for p, q in zip(a, b):
        torch.testing.assert_close(p.grad, q.grad)
    norm2, coef2 = clip_grad_norm_on_device(a, 100.0)
    assert float(coef2) == 1.0
    with pytest.raises(ParameterError):
        clip_grad_norm_on_device(a, 0.0)


def test_dtype_hooks_judge_layernorm_by_input_not_output_under_cpu_bf16_autocast():
    # On a CPU, autocast does NOT keep LayerNorm in float32: it passes through the dtype it receives.
    torch.manual_seed(0)
    cfg = PolicyConfig(image_size=32, conv_channels=(4, 8, 8), vocab_size=50, text_len=8, d_model=16,
                       n_heads=2, n_layers=1, fusion_hidden=16, n_actions=4)
    model = build_policy(cfg)
    images = torch.randn(4, 3, 32, 32)
    tokens = torch.randint(1, 50, (4, 8))
    with torch.amp.autocast("cpu", dtype=torch.bfloat16):
        rows = record_output_dtypes(model, lambda: model(images, tokens))
        standalone = record_output_dtypes(nn.LayerNorm(8), lambda: nn.LayerNorm(8)(torch.randn(2, 8).bfloat16()))
    norms = [r for r in rows if r.kind == "LayerNorm"]
    assert norms and all(r.output_dtype == r.input_dtype and r.effect == "pass-through" for r in norms)
    linears = [r for r in rows if r.kind == "Linear"]
    assert all(r.output_dtype == "bfloat16" for r in linears)
    assert any(r.effect == "cast to bfloat16" for r in linears)  # a float32 input cast down by autocast
    assert "bfloat16" in {r.output_dtype for r in rows if r.kind == "Conv2d"}
    # hooks are removed afterwards
    assert all(not m._forward_hooks for m in model.modules())


def test_layernorm_on_bf16_input_stays_bf16_under_cpu_autocast():
    with torch.amp.autocast("cpu", dtype=torch.bfloat16):
        y = nn.LayerNorm(8)(torch.randn(2, 8).bfloat16())
    assert y.dtype == torch.bfloat16


def test_probe_autocast_ops_on_cpu_bf16_matches_cpu_lists():
    out = probe_autocast_ops("cpu", torch.bfloat16)
    assert list(out) == list(PROBE_OPS)
    assert out["linear"] == "bfloat16"
    # CPU's float32 list has the losses, not layer_norm/softmax (CUDA's list differs)
    assert out["mse_loss"] == "float32" and out["cross_entropy"] == "float32"
    for op in ("layer_norm", "softmax", "log_softmax", "sum"):
        assert out[op] == "bfloat16", (op, out)
    with pytest.raises(ParameterError):
        probe_autocast_ops("cpu", torch.bfloat16, ops=["nope"])


def test_overflow_flags_mark_scale_backoffs():
    assert overflow_flags([8.0, 4.0, 4.0, 8.0, 4.0], 8.0) == [False, True, False, False, True]
    assert overflow_flags([], 1.0) == []
    with pytest.raises(ParameterError):
        overflow_flags([1.0], 0.0)


def test_overflow_flags_match_injected_overflows_through_stepper():
    model, opt, x = _toy()
    scaler = make_grad_scaler("cpu", None, init_scale=16.0, growth_interval=2, force=True)
    stepper = AmpStepper(opt, scaler, record_scale=True)
    inject = {2, 5}
    for i in range(1, 7):
        opt.zero_grad(set_to_none=True)
        loss = model(x).pow(2).mean()
        if i in inject:
            loss = loss * float("inf")
        stepper.step(loss)
    flags = overflow_flags(stepper.scale_history, 16.0)
    assert [i + 1 for i, f in enumerate(flags) if f] == sorted(inject)
    assert int(stepper.overflow_steps) == len(inject)


def test_tail_relative_difference():
    assert tail_relative_difference([4.0, 2.0, 2.0], [9.0, 2.2, 1.8], 2) == pytest.approx(0.0)
    assert tail_relative_difference([1.0, 2.0], [1.0, 3.0], 1) == pytest.approx(0.5)
    with pytest.raises(ParameterError):
        tail_relative_difference([1.0, -1.0], [1.0, -1.0], 1)  # crosses zero: not a relative quantity
    with pytest.raises(ParameterError):
        tail_relative_difference([1.0], [1.0, 2.0], 1)


def _ppo_losses(dtype, steps, scaler=None, seed=0):
    torch.manual_seed(seed)
    cfg = PolicyConfig(image_size=32, conv_channels=(4, 8, 8), vocab_size=50, text_len=8, d_model=16,
                       n_heads=2, n_layers=1, fusion_hidden=32, n_actions=4)
    model = build_policy(cfg)
    g = torch.Generator().manual_seed(seed + 1)
    images = torch.randn(16, 3, 32, 32, generator=g)
    tokens = torch.randint(1, 50, (16, 8), generator=g)
    labels = torch.arange(16) % 4
    trainer = PPOTrainer(model, PPOConfig(lr=1e-3), scaler=scaler)
    gen = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        s = trainer.step(images, tokens, labels, generator=gen, autocast_dtype=dtype)
        losses.append(float(s["value_loss"]))
    return losses, trainer


def test_bf16_loss_after_n_steps_within_rtol_of_fp32_and_no_nan():
    n = 12
    ref, _ = _ppo_losses(None, n)
    mixed, trainer = _ppo_losses(torch.bfloat16, n,
                                 scaler=make_grad_scaler("cpu", torch.bfloat16))  # disabled scaler path
    assert all(math.isfinite(v) for v in ref + mixed)
    # gate on the value loss: positive, so a relative tolerance means something (the total PPO loss crosses 0)
    assert tail_relative_difference(ref, mixed, 3) <= LOSS_RTOL, (ref, mixed)
    assert int(trainer.stepper.overflow_steps) == 0


def test_trainer_with_enabled_scaler_matches_plain_fp32():
    # An enabled scaler with a power-of-two scale and no overflow must not change fp32 training.
    ref, _ = _ppo_losses(None, 4)
    scaled, trainer = _ppo_losses(None, 4, scaler=make_grad_scaler("cpu", None, init_scale=1024.0, force=True))
    for a, b in zip(ref, scaled):
        assert b == pytest.approx(a, rel=1e-4, abs=1e-6)
    assert trainer.stepper.steps == 4 * PPOConfig().ppo_epochs


def test_stepper_rejects_bad_arguments():
    model, opt, _ = _toy()
    with pytest.raises(ParameterError):
        AmpStepper(model, None)
    with pytest.raises(ParameterError):
        AmpStepper(opt, scaler="yes")
    with pytest.raises(ParameterError):
        AmpStepper(opt, None, max_norm=-1.0)
