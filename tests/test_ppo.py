"""Tests of helpers.compute.ppo: GAE, the PPO loss and the trainer step."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

import helpers.compute.model as model_module
import helpers.compute.ppo as ppo_module
from helpers.compute.model import PolicyConfig, build_policy
from helpers.compute.ppo import STAT_KEYS, PPOConfig, PPOTrainer, compute_gae, ppo_loss
from helpers.errors import ParameterError

TINY = PolicyConfig(
    image_size=16,
    conv_channels=(8, 16),
    vocab_size=32,
    text_len=4,
    d_model=16,
    n_heads=2,
    n_layers=1,
    fusion_hidden=32,
    n_actions=4,
)


def _bandit_batch(cfg: PolicyConfig = TINY, batch: int = 32, seed: int = 0):
    """Synthetic batch whose label is encoded in the pixels: one colour per class plus noise."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(batch) % cfg.n_actions
    colours = torch.rand(cfg.n_actions, 3, 1, 1, generator=g) * 2 - 1
    images = colours[labels] + 0.3 * torch.randn(batch, 3, cfg.image_size, cfg.image_size, generator=g)
    tokens = torch.randint(1, cfg.vocab_size, (batch, cfg.text_len), generator=g)
    tokens[0, 2:] = 0  # some padding
    return images, tokens, labels


def _trainer(seed: int = 0, ppo: PPOConfig | None = None, cfg: PolicyConfig = TINY) -> PPOTrainer:
    torch.manual_seed(seed)
    return PPOTrainer(build_policy(cfg), ppo or PPOConfig())


# --------------------------------------------------------------------------- GAE


def test_gae_hand_computed_example():
    gamma, lam = 0.5, 0.5
    # column 0: episode ends at the last step (last_value ignored);
    # column 1: episode ends at step 0, then a new one bootstraps from last_value.
    rewards = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 0.0]])
    values = torch.tensor([[0.5, 1.0], [1.0, 1.0], [1.0, 1.0]])
    dones = torch.tensor([[False, True], [False, False], [True, False]])
    last_value = torch.tensor([10.0, 2.0])
    adv, ret = compute_gae(rewards, values, dones, last_value, gamma=gamma, lam=lam)
    # column 0: delta2 = 2 - 1 = 1; delta1 = 0 + .5*1 - 1 = -.5; delta0 = 1 + .5*1 - .5 = 1
    #           adv2 = 1; adv1 = -.5 + .25*1 = -.25; adv0 = 1 + .25*(-.25) = .9375
    # column 1: delta2 = 0 + .5*2 - 1 = 0; delta1 = 1 + .5*1 - 1 = .5; delta0 = 0 - 1 = -1 (done)
    #           adv2 = 0; adv1 = .5; adv0 = -1
    expected_adv = torch.tensor([[0.9375, -1.0], [-0.25, 0.5], [1.0, 0.0]])
    torch.testing.assert_close(adv, expected_adv)
    torch.testing.assert_close(ret, expected_adv + values)


def _naive_gae(rewards, values, dones, last_value, gamma, lam):
    T, N = rewards.shape
    adv = torch.zeros(T, N, dtype=torch.float64)
    for n in range(N):
        for t in range(T):
            total, discount = 0.0, 1.0
            for k in range(t, T):
                next_v = last_value[n] if k == T - 1 else values[k + 1, n]
                nonterminal = 1.0 - float(dones[k, n])
                delta = rewards[k, n] + gamma * nonterminal * next_v - values[k, n]
                total += discount * delta
                if not nonterminal:
                    break
                discount *= gamma * lam
            adv[t, n] = total
    return adv


def test_gae_matches_naive_sum_on_random_input():
    g = torch.Generator().manual_seed(0)
    T, N = 9, 6
    rewards = torch.randn(T, N, generator=g, dtype=torch.float64)
    values = torch.randn(T, N, generator=g, dtype=torch.float64)
    dones = torch.rand(T, N, generator=g) < 0.25
    last_value = torch.randn(N, generator=g, dtype=torch.float64)
    adv, ret = compute_gae(rewards, values, dones.double(), last_value, gamma=0.97, lam=0.9)
    expected = _naive_gae(rewards, values, dones, last_value, 0.97, 0.9)
    torch.testing.assert_close(adv, expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(ret, expected + values)
    # bool and float dones give the same result
    adv_bool, _ = compute_gae(rewards, values, dones, last_value, gamma=0.97, lam=0.9)
    torch.testing.assert_close(adv_bool, adv)


def test_gae_lambda_one_is_monte_carlo_return_minus_value():
    g = torch.Generator().manual_seed(1)
    T, N = 5, 3
    rewards = torch.randn(T, N, generator=g)
    values = torch.randn(T, N, generator=g)
    last_value = torch.randn(N, generator=g)
    dones = torch.zeros(T, N, dtype=torch.bool)
    gamma = 0.9
    adv, ret = compute_gae(rewards, values, dones, last_value, gamma=gamma, lam=1.0)
    mc = torch.zeros(T, N)
    running = last_value.clone()
    for t in reversed(range(T)):
        running = rewards[t] + gamma * running
        mc[t] = running
    torch.testing.assert_close(ret, mc, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(adv, mc - values, rtol=1e-5, atol=1e-5)


def test_gae_upcasts_half_precision():
    rewards = torch.ones(3, 2, dtype=torch.bfloat16)
    values = torch.zeros(3, 2, dtype=torch.bfloat16)
    adv, ret = compute_gae(rewards, values, torch.zeros(3, 2), torch.zeros(2, dtype=torch.bfloat16))
    assert adv.dtype == torch.float32 and ret.dtype == torch.float32


@pytest.mark.parametrize(
    ("shapes", "name"),
    [
        (((3,), (3,), (3,), ()), "rewards"),
        (((3, 2), (3, 1), (3, 2), (2,)), "values"),
        (((3, 2), (3, 2), (2, 2), (2,)), "dones"),
        (((3, 2), (3, 2), (3, 2), (3,)), "last_value"),
    ],
)
def test_gae_shape_errors_name_the_input(shapes, name):
    tensors = [torch.zeros(s) for s in shapes]
    with pytest.raises(ParameterError, match=name):
        compute_gae(*tensors)


def test_gae_rejects_bad_gamma():
    z = torch.zeros(2, 2)
    with pytest.raises(ParameterError, match="gamma"):
        compute_gae(z, z, z, torch.zeros(2), gamma=1.5)


# --------------------------------------------------------------------------- ppo_loss


def _loss_inputs(batch=4, n_actions=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, n_actions, generator=g, requires_grad=True)
    actions = torch.randint(0, n_actions, (batch,), generator=g)
    old = torch.log_softmax(logits.detach(), -1).gather(1, actions[:, None]).squeeze(1)
    return logits, actions, old


def test_ppo_loss_clipping_zeroes_the_clipped_side():
    n_actions = 3
    logits = torch.zeros(4, n_actions, requires_grad=True)
    actions = torch.zeros(4, dtype=torch.int64)
    new_logp = math.log(1.0 / n_actions)
    # ratio = exp(new - old): samples 0, 1 have ratio 2 (> 1 + eps), samples 2, 3 ratio 0.5 (< 1 - eps)
    old = torch.tensor([new_logp - math.log(2.0), new_logp - math.log(2.0),
                        new_logp + math.log(2.0), new_logp + math.log(2.0)])
    advantages = torch.tensor([1.0, -1.0, -1.0, 1.0])
    zeros = torch.zeros(4)
    loss, stats = ppo_loss(logits, actions, old, advantages, zeros, zeros, clip_eps=0.2,
                           value_coef=0.0, entropy_coef=0.0, normalize_advantages=False)
    loss.backward()
    grad_norms = logits.grad.abs().sum(dim=1)
    # ratio > 1+eps with A > 0, and ratio < 1-eps with A < 0: clipped, no gradient.
    assert grad_norms[0] == 0 and grad_norms[2] == 0
    # the pessimistic side stays unclipped: gradient flows.
    assert grad_norms[1] > 0 and grad_norms[3] > 0
    assert stats["clip_fraction"] == 1.0
    # policy_loss = mean(max(-A r, -A clip(r))): [-1.2, 2, 0.8, -0.5]
    torch.testing.assert_close(stats["policy_loss"], torch.tensor((-1.2 + 2.0 + 0.8 - 0.5) / 4))


def test_ppo_loss_ratio_one_inside_clip_range():
    logits, actions, old = _loss_inputs(batch=6)
    g = torch.Generator().manual_seed(2)
    advantages = torch.randn(6, generator=g)
    zeros = torch.zeros(6)
    loss, stats = ppo_loss(logits, actions, old, advantages, zeros, zeros,
                           value_coef=0.0, entropy_coef=0.0)
    # normalised advantages have zero mean, ratio is 1: the surrogate is 0
    assert abs(stats["policy_loss"]) < 1e-6
    assert stats["approx_kl"] == 0 and stats["clip_fraction"] == 0
    loss.backward()
    assert logits.grad.abs().sum() > 0  # unclipped: gradient flows for every sample


def test_ppo_loss_entropy_value_and_sign():
    n_actions, batch = 5, 4
    logits = torch.zeros(batch, n_actions, requires_grad=True)  # uniform policy
    actions = torch.zeros(batch, dtype=torch.int64)
    old = torch.full((batch,), -math.log(n_actions))
    zeros = torch.zeros(batch)
    loss, stats = ppo_loss(logits, actions, old, zeros, zeros, zeros,
                           value_coef=0.5, entropy_coef=0.1)
    torch.testing.assert_close(stats["entropy"], torch.tensor(math.log(n_actions)))
    # advantages all zero (normalised to zero), values == returns: only the bonus is left
    torch.testing.assert_close(loss.detach(), torch.tensor(-0.1 * math.log(n_actions)))

    # a gradient step on the loss raises the entropy of a peaked policy
    peaked = torch.tensor([[3.0, 0.0, 0.0, -1.0, 0.5]]).repeat(batch, 1).requires_grad_(True)
    loss, stats = ppo_loss(peaked, actions, old, zeros, zeros, zeros,
                           value_coef=0.0, entropy_coef=1.0)
    loss.backward()
    with torch.no_grad():
        stepped = peaked - 0.1 * peaked.grad
        _, after = ppo_loss(stepped, actions, old, zeros, zeros, zeros,
                            value_coef=0.0, entropy_coef=1.0)
    assert after["entropy"] > stats["entropy"]


def test_ppo_loss_value_loss_and_gradient():
    batch = 4
    logits, actions, old = _loss_inputs(batch=batch)
    values = torch.tensor([1.0, 2.0, -1.0, 0.0], requires_grad=True)
    returns = torch.tensor([0.0, 2.0, 1.0, 0.5])
    zeros = torch.zeros(batch)
    loss, stats = ppo_loss(logits, actions, old, zeros, values, returns,
                           value_coef=0.5, entropy_coef=0.0)
    expected = 0.5 * ((values.detach() - returns) ** 2).mean()
    torch.testing.assert_close(stats["value_loss"], expected)
    torch.testing.assert_close(loss.detach(), 0.5 * expected)  # policy part is 0
    loss.backward()
    torch.testing.assert_close(values.grad, 0.5 * (values.detach() - returns) / batch)


def test_ppo_loss_stats_are_detached_scalars_and_finite_for_one_sample():
    logits, actions, old = _loss_inputs(batch=1)
    one = torch.ones(1)
    loss, stats = ppo_loss(logits, actions, old, one, one, one)
    assert loss.shape == () and loss.requires_grad and torch.isfinite(loss)
    assert set(stats) == {"policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction"}
    for name, value in stats.items():
        assert value.shape == () and not value.requires_grad, name
        assert torch.isfinite(value), name


def test_ppo_loss_upcasts_half_precision_inputs():
    logits, actions, old = _loss_inputs(batch=4)
    half = logits.detach().to(torch.bfloat16).requires_grad_(True)
    values = torch.zeros(4, dtype=torch.bfloat16, requires_grad=True)
    loss, _ = ppo_loss(half, actions, old, torch.randn(4), values, torch.ones(4))
    assert loss.dtype == torch.float32
    loss.backward()
    assert half.grad.dtype == torch.bfloat16 and torch.isfinite(half.grad.float()).all()


def test_ppo_loss_shape_and_range_errors():
    logits, actions, old = _loss_inputs(batch=4)
    z = torch.zeros(4)
    with pytest.raises(ParameterError, match="advantages"):
        ppo_loss(logits, actions, old, torch.zeros(3), z, z)
    with pytest.raises(ParameterError, match="logits"):
        ppo_loss(logits[0], actions, old, z, z, z)
    with pytest.raises(ParameterError, match="clip_eps"):
        ppo_loss(logits, actions, old, z, z, z, clip_eps=0.0)
    with pytest.raises(ParameterError, match="entropy_coef"):
        ppo_loss(logits, actions, old, z, z, z, entropy_coef=-1.0)


# --------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"horizon": 0}, "horizon"),
        ({"horizon": 2.0}, "horizon"),
        ({"gamma": 1.01}, "gamma"),
        ({"lam": -0.1}, "lam"),
        ({"clip_eps": 0.0}, "clip_eps"),
        ({"clip_eps": 1.0}, "clip_eps"),
        ({"value_coef": -1}, "value_coef"),
        ({"entropy_coef": "0.01"}, "entropy_coef"),
        ({"ppo_epochs": 0}, "ppo_epochs"),
        ({"ppo_epochs": True}, "ppo_epochs"),
        ({"lr": 0.0}, "lr"),
        ({"max_grad_norm": 0.0}, "max_grad_norm"),
    ],
)
def test_ppo_config_validation_names_the_field(kwargs, field):
    with pytest.raises(ParameterError, match=rf"PPOConfig\.{field}=") as info:
        PPOConfig(**kwargs)
    assert repr(next(iter(kwargs.values()))) in str(info.value)


def test_trainer_rejects_non_config():
    torch.manual_seed(0)
    with pytest.raises(ParameterError, match="PPOConfig"):
        PPOTrainer(build_policy(TINY), {"lr": 1e-3})  # type: ignore[arg-type]


# --------------------------------------------------------------------------- trainer


def test_step_returns_detached_scalars():
    trainer = _trainer()
    images, tokens, labels = _bandit_batch(batch=16)
    stats = trainer.step(images, tokens, labels, generator=torch.Generator().manual_seed(0))
    assert tuple(stats) == STAT_KEYS
    for name, value in stats.items():
        assert isinstance(value, torch.Tensor) and value.shape == (), name
        assert not value.requires_grad and torch.isfinite(value), name
    assert 0.0 <= stats["reward_mean"] <= 1.0
    assert stats["grad_norm"] > 0


def test_step_changes_the_weights():
    trainer = _trainer()
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.step(*_bandit_batch(batch=8), generator=torch.Generator().manual_seed(0))
    after = list(trainer.model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, after))


def test_first_epoch_ratio_is_one():
    """Rollout and the first update see the same network: no KL, nothing clipped."""
    trainer = _trainer(ppo=PPOConfig(ppo_epochs=1))
    stats = trainer.step(*_bandit_batch(batch=16), generator=torch.Generator().manual_seed(0))
    assert abs(stats["approx_kl"]) < 1e-7
    assert stats["clip_fraction"] == 0


def test_rewards_follow_the_label_rule(monkeypatch):
    """Reward is 1 exactly where action == label % n_actions."""
    seen = {}
    real_gae = ppo_module.compute_gae

    def spy(rewards, *args, **kwargs):
        seen["rewards"] = rewards.clone()
        return real_gae(rewards, *args, **kwargs)

    monkeypatch.setattr(ppo_module, "compute_gae", spy)
    real_multinomial = torch.multinomial
    drawn = {}

    def spy_multinomial(probs, *args, **kwargs):
        drawn["actions"] = real_multinomial(probs, *args, **kwargs)
        return drawn["actions"]

    monkeypatch.setattr(torch, "multinomial", spy_multinomial)
    trainer = _trainer(ppo=PPOConfig(horizon=4))
    images, tokens, _ = _bandit_batch(batch=8)
    labels = torch.arange(8) + 10  # labels above n_actions: the rule takes them modulo
    stats = trainer.step(images, tokens, labels, generator=torch.Generator().manual_seed(0))
    actions = drawn["actions"].squeeze(1)
    expected = (actions == labels % TINY.n_actions).float()
    # (B,) -> (T, N): env n owns samples n*T .. n*T+T-1
    torch.testing.assert_close(seen["rewards"], expected.reshape(2, 4).T)
    torch.testing.assert_close(stats["reward_mean"], expected.mean())


def test_step_batch_must_be_multiple_of_horizon():
    trainer = _trainer(ppo=PPOConfig(horizon=3))
    with pytest.raises(ParameterError, match="horizon"):
        trainer.step(*_bandit_batch(batch=8))


def test_step_rejects_mismatched_device_type_and_labels():
    trainer = _trainer()
    images, tokens, labels = _bandit_batch(batch=8)
    with pytest.raises(ParameterError, match="device_type"):
        trainer.step(images, tokens, labels, device_type="cuda")
    with pytest.raises(ParameterError, match="labels"):
        trainer.step(images, tokens, labels.float())
    with pytest.raises(ParameterError, match="labels"):
        trainer.step(images, tokens, labels[:4])


def _run(steps=3, seed=0, **step_kwargs):
    trainer = _trainer(seed=seed)
    images, tokens, labels = _bandit_batch(batch=16)
    g = torch.Generator().manual_seed(seed)
    return [trainer.step(images, tokens, labels, generator=g, **step_kwargs) for _ in range(steps)]


def test_same_seeds_give_identical_steps():
    a, b = _run(), _run()
    for step_a, step_b in zip(a, b):
        for key in STAT_KEYS:
            assert torch.equal(step_a[key], step_b[key]), key
    c = _run(seed=1)
    assert any(not torch.equal(a[-1][k], c[-1][k]) for k in ("loss", "grad_norm"))


def test_channels_last_step_matches_contiguous():
    ref = _trainer()
    images, tokens, labels = _bandit_batch(batch=16)
    s_ref = ref.step(images, tokens, labels, generator=torch.Generator().manual_seed(0))
    cl = _trainer()
    cl.model.to(memory_format=torch.channels_last)
    s_cl = cl.step(images.contiguous(memory_format=torch.channels_last), tokens, labels,
                   generator=torch.Generator().manual_seed(0))
    assert torch.equal(s_ref["reward_mean"], s_cl["reward_mean"])
    for key in ("loss", "entropy", "grad_norm"):
        torch.testing.assert_close(s_cl[key], s_ref[key], rtol=1e-4, atol=1e-5)


def test_autocast_bf16_step_is_finite():
    stats = _run(steps=2, autocast_dtype=torch.bfloat16, device_type="cpu")
    for step in stats:
        for key in STAT_KEYS:
            assert torch.isfinite(step[key]), key


_HOST_READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__")


def _guard_host_reads(monkeypatch, files: set[Path]) -> list[str]:
    """Record every Tensor value read (``.item()``, ``bool(t)``...) made from one of ``files``."""
    files = {f.resolve() for f in files}
    offenders: list[str] = []

    def guard(name):
        original = getattr(torch.Tensor, name)

        def wrapper(self, *args, **kwargs):
            frame = sys._getframe(1)
            if Path(frame.f_code.co_filename).resolve() in files:
                offenders.append(f"{name} at {frame.f_code.co_filename}:{frame.f_lineno}")
            return original(self, *args, **kwargs)

        return wrapper

    for name in _HOST_READS:
        monkeypatch.setattr(torch.Tensor, name, guard(name))
    return offenders


def test_step_never_reads_tensor_values_on_the_host(monkeypatch):
    """No .item()/bool()/float()/.tolist()/.cpu() from the workload's own code.

    On CPU a host sync cannot be observed directly, so this checks that no call
    site in helpers/compute/model.py or ppo.py reads a tensor's value (each of
    those is a device sync on an accelerator).
    """
    trainer = _trainer()
    trainer.model.to(memory_format=torch.channels_last)
    images, tokens, labels = _bandit_batch(batch=16)
    tokens[3] = 0
    offenders = _guard_host_reads(
        monkeypatch, {Path(model_module.__file__), Path(ppo_module.__file__)}
    )
    trainer.step(images.contiguous(memory_format=torch.channels_last), tokens, labels,
                 generator=torch.Generator().manual_seed(0), autocast_dtype=torch.bfloat16)
    monkeypatch.undo()
    assert offenders == []


def test_host_read_guard_catches_a_leak(monkeypatch):
    """The guard above does flag value reads made from a watched file."""
    real_gae = ppo_module.compute_gae

    def leaky(rewards, *args, **kwargs):  # lives in this file, which is watched below
        if rewards.sum() > -1:  # bool(tensor)
            rewards.mean().item()
        return real_gae(rewards, *args, **kwargs)

    monkeypatch.setattr(ppo_module, "compute_gae", leaky)
    trainer = _trainer()
    batch = _bandit_batch(batch=8)
    offenders = _guard_host_reads(monkeypatch, {Path(__file__)})
    trainer.step(*batch)
    monkeypatch.undo()
    assert [o.split(" ")[0] for o in offenders] == ["__bool__", "item"]


@pytest.mark.slow
def test_policy_learns_the_bandit_above_chance():
    """On a fixed batch whose label is in the pixels, reward climbs well above 1/n_actions."""
    torch.manual_seed(0)
    trainer = PPOTrainer(build_policy(TINY), PPOConfig(lr=3e-3))
    images, tokens, labels = _bandit_batch(batch=32)
    g = torch.Generator().manual_seed(1)
    rewards = torch.stack(
        [trainer.step(images, tokens, labels, generator=g)["reward_mean"] for _ in range(60)]
    )
    chance = 1.0 / TINY.n_actions
    assert rewards[:5].mean() < 0.5
    assert rewards[-10:].mean() > 0.6, f"last rewards {rewards[-10:]} vs chance {chance}"
