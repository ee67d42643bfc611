"""PPO for the workbook's workload: GAE, the clipped loss and a trainer step.

The "environment" is a contextual bandit laid out as a rollout. A batch of
``B`` samples (image, caption, label) is split into ``N = B // T`` environments
of ``T = PPOConfig.horizon`` consecutive samples each; each environment's ``T``
samples form one trajectory that ends (``done``) at its last step. The policy
picks one of ``n_actions`` actions per sample and earns reward 1.0 when the
action equals ``label % n_actions`` and 0.0 otherwise. The label is the index of
the photograph an image was cut from, so the policy has to recognise the source
photo from the pixels and the caption: a real learning signal, on real data.

Nothing in this module reads a tensor's value on the host (no ``.item()``,
``float(t)``, ``bool(t)``, ``.cpu()``, ``.tolist()``): a training step queues
device work and returns, so callers can time its phases and convert the
returned tensors afterwards.

References
----------
GAE: J. Schulman, P. Moritz, S. Levine, M. Jordan, P. Abbeel, "High-Dimensional
Continuous Control Using Generalized Advantage Estimation", 2016,
arXiv:1506.02438.

PPO: J. Schulman, F. Wolski, P. Dhariwal, A. Radford, O. Klimov, "Proximal
Policy Optimization Algorithms", 2017, arXiv:1707.06347.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from helpers.compute._checks import check_positive_int, check_real
from helpers.compute.amp import AmpStepper
from helpers.errors import ParameterError

logger = logging.getLogger(__name__)

__all__ = ["PPOConfig", "PPOTrainer", "compute_gae", "ppo_loss", "STAT_KEYS"]

#: Keys of the dict returned by :meth:`PPOTrainer.step`, in a stable order.
STAT_KEYS: tuple[str, ...] = (
    "loss",
    "policy_loss",
    "value_loss",
    "entropy",
    "reward_mean",
    "approx_kl",
    "clip_fraction",
    "grad_norm",
)


def _shape_error(name: str, tensor: torch.Tensor, expected: str) -> ParameterError:
    return ParameterError(
        f"{name} has shape {tuple(tensor.shape)}; expected {expected}. "
        "Check that every input comes from the same batch."
    )


@dataclass(frozen=True)
class PPOConfig:
    """Hyperparameters of the PPO update.

    Defaults follow the PPO paper's Atari/MuJoCo settings where they apply
    (gamma 0.99, lambda 0.95, clip 0.2, value coefficient 0.5, entropy
    coefficient 0.01; Schulman et al. 2017, arXiv:1707.06347, tables 3-5) and
    the Adam learning rate 3e-4 and gradient-norm clipping of common PPO
    implementations (OpenAI baselines ``ppo2``, CleanRL ``ppo.py``).

    Parameters
    ----------
    horizon : int
        Trajectory length ``T``. A batch of ``B`` samples must have
        ``B % T == 0``; it is split into ``N = B // T`` environments.
    gamma : float
        Discount factor, in ``[0, 1]``.
    lam : float
        GAE lambda, in ``[0, 1]``.
    clip_eps : float
        PPO clip range: ratios outside ``[1 - clip_eps, 1 + clip_eps]`` are
        clipped; in ``(0, 1)``.
    value_coef : float
        Weight of the value loss in the total loss, ``>= 0``.
    entropy_coef : float
        Weight of the entropy bonus (subtracted from the loss), ``>= 0``.
    ppo_epochs : int
        Optimisation passes over the batch per step, ``>= 1``.
    lr : float
        Learning rate of the default AdamW optimizer, ``> 0``.
    max_grad_norm : float
        Global L2 norm to which gradients are clipped, ``> 0``
        (``float('inf')`` measures the norm without clipping).

    Raises
    ------
    ParameterError
        If a field is of the wrong type or out of range; the message names it.
    """

    horizon: int = 4
    gamma: float = 0.99
    lam: float = 0.95
    clip_eps: float = 0.2
    value_coef: float = 0.5
    entropy_coef: float = 0.01
    ppo_epochs: int = 2
    lr: float = 3e-4
    max_grad_norm: float = 1.0

    def __post_init__(self) -> None:
        for name in ("horizon", "ppo_epochs"):
            check_positive_int(f"PPOConfig.{name}", getattr(self, name))
        inf = float("inf")
        check_real("PPOConfig.gamma", self.gamma, 0.0, 1.0)
        check_real("PPOConfig.lam", self.lam, 0.0, 1.0)
        check_real("PPOConfig.clip_eps", self.clip_eps, 0.0, 1.0, lo_open=True, hi_open=True)
        check_real("PPOConfig.value_coef", self.value_coef, 0.0, inf, hi_open=True)
        check_real("PPOConfig.entropy_coef", self.entropy_coef, 0.0, inf, hi_open=True)
        check_real("PPOConfig.lr", self.lr, 0.0, inf, lo_open=True, hi_open=True)
        check_real("PPOConfig.max_grad_norm", self.max_grad_norm, 0.0, inf, lo_open=True)


def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    dones: torch.Tensor,
    last_value: torch.Tensor,
    gamma: float = 0.99,
    lam: float = 0.95,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized Advantage Estimation over a ``(T, N)`` rollout.

    For ``t = T-1 .. 0`` (Schulman et al. 2016, arXiv:1506.02438, eq. 16)::

        next_value[t] = last_value if t == T-1 else values[t+1]
        delta[t]      = rewards[t] + gamma * (1 - dones[t]) * next_value[t] - values[t]
        adv[t]        = delta[t] + gamma * lam * (1 - dones[t]) * adv[t+1]
        returns[t]    = adv[t] + values[t]

    ``dones[t, n]`` is true when the episode of environment ``n`` ended with the
    transition taken at step ``t``: nothing after it is bootstrapped or
    accumulated into ``adv[t]``.

    The computation stays on the inputs' device: vectorised over ``N``, a
    Python loop over ``T`` only, and no host synchronisation.

    Parameters
    ----------
    rewards : torch.Tensor
        Float, shape ``(T, N)``: reward of the transition at each step.
    values : torch.Tensor
        Float, shape ``(T, N)``: value estimate of the state at each step.
    dones : torch.Tensor
        Bool or float (0/1), shape ``(T, N)``: episode ended at this step.
    last_value : torch.Tensor
        Float, shape ``(N,)``: value estimate of the state after the last step
        (ignored where ``dones[T-1]`` is true).
    gamma : float
        Discount factor in ``[0, 1]``.
    lam : float
        GAE lambda in ``[0, 1]``.

    Returns
    -------
    advantages : torch.Tensor
        Shape ``(T, N)``.
    returns : torch.Tensor
        Shape ``(T, N)``: ``advantages + values``, the value-function targets.

    Both are in the promoted dtype of the inputs, at least float32 (fp16/bf16
    inputs are upcast: a discounted sum in half precision loses digits).

    Raises
    ------
    ParameterError
        If the shapes do not match or gamma/lam are out of range.
    """
    check_real("gamma", gamma, 0.0, 1.0)
    check_real("lam", lam, 0.0, 1.0)
    if rewards.dim() != 2:
        raise _shape_error("rewards", rewards, "(T, N)")
    if values.shape != rewards.shape:
        raise _shape_error("values", values, f"{tuple(rewards.shape)} like rewards")
    if dones.shape != rewards.shape:
        raise _shape_error("dones", dones, f"{tuple(rewards.shape)} like rewards")
    if last_value.shape != rewards.shape[1:]:
        raise _shape_error("last_value", last_value, f"({rewards.shape[1]},)")

    dtype = torch.promote_types(torch.promote_types(rewards.dtype, values.dtype), torch.float32)
    r = rewards.to(dtype)
    v = values.to(dtype)
    nonterminal = 1.0 - dones.to(dtype)
    next_value = last_value.to(dtype)
    advantages = torch.empty_like(v)
    running = torch.zeros_like(next_value)
    for t in range(r.shape[0] - 1, -1, -1):
        delta = r[t] + gamma * nonterminal[t] * next_value - v[t]
        running = delta + (gamma * lam) * nonterminal[t] * running
        advantages[t] = running
        next_value = v[t]
    return advantages, advantages + v


def ppo_loss(
    logits: torch.Tensor,
    actions: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    values: torch.Tensor,
    returns: torch.Tensor,
    *,
    clip_eps: float = 0.2,
    value_coef: float = 0.5,
    entropy_coef: float = 0.01,
    normalize_advantages: bool = True,
    adv_eps: float = 1e-8,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped-surrogate loss with a value loss and an entropy bonus.

    With ``ratio = exp(log_prob(actions) - old_log_probs)`` and advantages
    ``A`` (Schulman et al. 2017, arXiv:1707.06347, eqs. 7 and 9)::

        policy_loss = mean(max(-A * ratio, -A * clip(ratio, 1 - eps, 1 + eps)))
        value_loss  = 0.5 * mean((values - returns) ** 2)
        entropy     = mean(H(softmax(logits)))
        loss        = policy_loss + value_coef * value_loss - entropy_coef * entropy

    The factor 0.5 in the value loss follows OpenAI baselines ``ppo2`` and
    CleanRL ``ppo.py``. A sample whose ratio is clipped on the side where the
    objective would keep improving contributes no policy gradient.

    Advantage normalisation: when ``normalize_advantages`` is true the
    advantages are standardised over the batch,
    ``(A - mean(A)) / (std(A) + adv_eps)`` with the population standard
    deviation (so a batch of one sample gives 0, not NaN), as in baselines and
    CleanRL. They are treated as constants (no gradient flows into them).

    All arithmetic runs in at least float32, also when ``logits``/``values``
    come from autocast in fp16/bf16.

    Parameters
    ----------
    logits : torch.Tensor
        Float, shape ``(B, A)``: current policy logits (with gradient).
    actions : torch.Tensor
        int64, shape ``(B,)``: actions taken in the rollout.
    old_log_probs : torch.Tensor
        Float, shape ``(B,)``: log-probabilities of ``actions`` under the
        rollout policy.
    advantages : torch.Tensor
        Float, shape ``(B,)``.
    values : torch.Tensor
        Float, shape ``(B,)``: current value estimates (with gradient).
    returns : torch.Tensor
        Float, shape ``(B,)``: value targets.
    clip_eps : float
        Clip range, in ``(0, 1)``.
    value_coef, entropy_coef : float
        Loss weights, ``>= 0``.
    normalize_advantages : bool
        Standardise the advantages over the batch (see above).
    adv_eps : float
        Added to the standard deviation, ``> 0``; 1e-8 as in baselines/CleanRL.

    Returns
    -------
    loss : torch.Tensor
        Scalar, float32 or wider, with gradient.
    stats : dict of str to torch.Tensor
        Detached scalars: ``policy_loss``, ``value_loss``, ``entropy``,
        ``approx_kl`` (the estimator ``mean((ratio - 1) - log(ratio))``, always
        >= 0; J. Schulman, "Approximating KL divergence", 2020,
        http://joschu.net/blog/kl-approx.html) and ``clip_fraction`` (share of
        samples with ``|ratio - 1| > clip_eps``).

    Raises
    ------
    ParameterError
        If shapes do not match or a coefficient is out of range.
    """
    inf = float("inf")
    check_real("clip_eps", clip_eps, 0.0, 1.0, lo_open=True, hi_open=True)
    check_real("value_coef", value_coef, 0.0, inf, hi_open=True)
    check_real("entropy_coef", entropy_coef, 0.0, inf, hi_open=True)
    check_real("adv_eps", adv_eps, 0.0, inf, lo_open=True, hi_open=True)
    if logits.dim() != 2:
        raise _shape_error("logits", logits, "(B, A)")
    batch = logits.shape[0]
    for name, tensor in (("actions", actions), ("old_log_probs", old_log_probs),
                         ("advantages", advantages), ("values", values), ("returns", returns)):
        if tensor.shape != (batch,):
            raise _shape_error(name, tensor, f"({batch},) to match logits")

    dtype = torch.promote_types(logits.dtype, torch.float32)
    log_probs_all = F.log_softmax(logits.to(dtype), dim=-1)
    log_probs = log_probs_all.gather(1, actions.long().unsqueeze(1)).squeeze(1)
    entropy = -(log_probs_all.exp() * log_probs_all).sum(dim=-1).mean()

    adv = advantages.detach().to(dtype)
    if normalize_advantages:
        adv = (adv - adv.mean()) / (adv.std(correction=0) + adv_eps)

    log_ratio = log_probs - old_log_probs.detach().to(dtype)
    ratio = log_ratio.exp()
    surrogate = -adv * ratio
    surrogate_clipped = -adv * ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps)
    policy_loss = torch.maximum(surrogate, surrogate_clipped).mean()

    value_loss = 0.5 * (values.to(dtype) - returns.detach().to(dtype)).pow(2).mean()
    loss = policy_loss + value_coef * value_loss - entropy_coef * entropy

    with torch.no_grad():
        approx_kl = ((ratio - 1.0) - log_ratio).mean()
        clip_fraction = ((ratio - 1.0).abs() > clip_eps).to(dtype).mean()
    stats = {
        "policy_loss": policy_loss.detach(),
        "value_loss": value_loss.detach(),
        "entropy": entropy.detach(),
        "approx_kl": approx_kl,
        "clip_fraction": clip_fraction,
    }
    return loss, stats


class PPOTrainer:
    """Runs PPO steps of a policy on the contextual-bandit rollout.

    Parameters
    ----------
    model : torch.nn.Module
        A module whose ``forward(images, tokens)`` returns
        ``(logits (B, A), value (B,))``, e.g. a
        :class:`helpers.compute.model.MultimodalPolicy`, already on its device.
    cfg : PPOConfig
        Hyperparameters.
    optimizer : torch.optim.Optimizer, optional
        Defaults to ``torch.optim.AdamW(model.parameters(), lr=cfg.lr)`` with
        PyTorch's default implementation choice for the device.
    scaler : torch.amp.GradScaler, optional
        Loss scaler for float16 autocast (see
        :func:`helpers.compute.amp.make_grad_scaler`). When given, each update
        runs through :class:`helpers.compute.amp.AmpStepper`: scaled backward,
        ``unscale_``, clipping of the true gradients, ``scaler.step``,
        ``scaler.update``; overflowed steps are skipped and counted in
        ``self.stepper.overflow_steps``. None (default): the plain step.
    record_scale : bool
        With a scaler, record the loss scale after every update in
        ``self.stepper.scale_history`` (one host read per update).

    Raises
    ------
    ParameterError
        If ``cfg`` is not a PPOConfig.
    """

    def __init__(self, model: nn.Module, cfg: PPOConfig | None = None,
                 optimizer: torch.optim.Optimizer | None = None, *,
                 scaler: torch.amp.GradScaler | None = None, record_scale: bool = False) -> None:
        if cfg is None:
            cfg = PPOConfig()
        if not isinstance(cfg, PPOConfig):
            raise ParameterError(
                f"cfg has type {type(cfg).__name__}; expected a PPOConfig. Build one with PPOConfig(...)."
            )
        self.model = model
        self.cfg = cfg
        self.optimizer = optimizer if optimizer is not None else torch.optim.AdamW(
            model.parameters(), lr=cfg.lr
        )
        self.stepper = None
        if scaler is not None:
            self.stepper = AmpStepper(self.optimizer, scaler, max_norm=cfg.max_grad_norm,
                                      record_scale=record_scale)

    def step(
        self,
        images: torch.Tensor,
        tokens: torch.Tensor,
        labels: torch.Tensor,
        *,
        generator: torch.Generator | None = None,
        autocast_dtype: torch.dtype | None = None,
        device_type: str | None = None,
    ) -> dict[str, torch.Tensor]:
        """One PPO step: rollout on the batch, GAE, then ``ppo_epochs`` updates.

        1. Without gradients: forward pass, sample one action per sample from
           ``Categorical(softmax(logits))`` with ``torch.multinomial`` and
           ``generator``, reward ``1.0`` where ``action == label % n_actions``.
        2. Lay the batch out as ``N = B // T`` trajectories of ``T`` consecutive
           samples (sample ``i`` is step ``i % T`` of environment ``i // T``),
           each done at its last step, and compute advantages and returns with
           :func:`compute_gae`.
        3. ``ppo_epochs`` times over the whole batch: forward, :func:`ppo_loss`,
           backward, ``clip_grad_norm_(max_grad_norm)``, optimizer step.

        The model is put in training mode for the whole step, so the rollout
        and the first update see the same BatchNorm batch statistics and, with
        dropout 0, the first epoch's probability ratio is exactly 1. BatchNorm
        running statistics are therefore updated by the rollout pass too
        (``1 + ppo_epochs`` updates per step); they are only used in eval mode.

        **No host synchronisation**: the step never reads a tensor's value on
        the host (no ``.item()``, no Python ``if`` on a tensor), so on an
        asynchronous device it returns once the work is queued. The caller must
        synchronise the device before reading a clock, and converts the
        returned tensors (e.g. ``{k: v.item() for k, v in stats.items()}``)
        only after timing.

        Parameters
        ----------
        images : torch.Tensor
            Float, ``(B, C, S, S)`` (NCHW or channels_last), on the model's device.
        tokens : torch.Tensor
            int64, ``(B, L)``; id 0 is padding.
        labels : torch.Tensor
            Integer, ``(B,)``: index of the source photo of each sample.
        generator : torch.Generator, optional
            Random generator for the action sampling, on the same device as
            ``images``; the global generator if omitted. Same seed, same model
            and same inputs give the same step.
        autocast_dtype : torch.dtype, optional
            Run the forward passes under
            ``torch.amp.autocast(device_type, dtype=autocast_dtype)``
            (``torch.float16`` or ``torch.bfloat16``); full precision if None.
            The loss is computed in float32. Without a trainer ``scaler``
            fp16 can underflow gradients; bf16 does not need one.
        device_type : str, optional
            Device type for autocast (``"cpu"``, ``"cuda"``, ``"npu"``);
            defaults to ``images.device.type`` and must match it if given.

        Returns
        -------
        dict of str to torch.Tensor
            Detached scalar tensors on the model's device, with the keys in
            :data:`STAT_KEYS`: ``loss``, ``policy_loss``, ``value_loss``,
            ``entropy``, ``approx_kl``, ``clip_fraction`` and ``grad_norm``
            (the norm before clipping) from the last epoch, and
            ``reward_mean`` of the rollout (chance level is ``1 / n_actions``).

        Raises
        ------
        ParameterError
            If ``B`` is not a multiple of ``horizon``, shapes do not match, the
            generator is on another device, or ``device_type`` contradicts the
            images' device.
        """
        device_type = self._check_step_inputs(images, labels, generator, device_type)
        model = self.model
        model.train()

        def autocast() -> torch.amp.autocast:
            return torch.amp.autocast(device_type, dtype=autocast_dtype, enabled=autocast_dtype is not None)

        with torch.no_grad():
            with autocast():
                logits, values = model(images, tokens)
            actions, old_log_probs, rewards, advantages, returns = self._rollout(logits, values, labels, generator)
        params = [p for p in model.parameters() if p.requires_grad]
        cfg = self.cfg
        stats: dict[str, torch.Tensor] = {}
        loss = grad_norm = None
        for _ in range(cfg.ppo_epochs):  # 3. updates
            self.optimizer.zero_grad(set_to_none=True)
            with autocast():
                logits, values = model(images, tokens)
            loss, stats = ppo_loss(
                logits, actions, old_log_probs, advantages, values, returns,
                clip_eps=cfg.clip_eps, value_coef=cfg.value_coef, entropy_coef=cfg.entropy_coef,
            )
            if self.stepper is not None:
                grad_norm = self.stepper.step(loss).grad_norm
                continue
            loss.backward()
            grad_norm = nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            self.optimizer.step()
        out = {**stats, "loss": loss.detach(), "reward_mean": rewards.mean(), "grad_norm": grad_norm.detach()}
        return {key: out[key] for key in STAT_KEYS}

    def _check_step_inputs(self, images: torch.Tensor, labels: torch.Tensor, generator: torch.Generator | None,
                           device_type: str | None) -> str:
        """:meth:`step`'s checks of its inputs (its Raises section); returns the autocast device type."""
        batch = images.shape[0]
        if batch % self.cfg.horizon != 0:
            raise ParameterError(
                f"batch size B={batch} is not a multiple of PPOConfig.horizon={self.cfg.horizon}; "
                "use a batch size divisible by horizon, or another horizon."
            )
        if labels.shape != (batch,) or labels.is_floating_point() or labels.is_complex():
            raise ParameterError(
                f"labels has shape {tuple(labels.shape)} and dtype {labels.dtype}; "
                f"expected integer labels of shape ({batch},)."
            )
        data_device = images.device.type
        if device_type is not None and device_type != data_device:
            raise ParameterError(
                f"device_type={device_type!r} but images are on {images.device}; "
                "pass the device type the data lives on (or leave device_type unset)."
            )
        if generator is not None and generator.device.type != data_device:
            raise ParameterError(
                f"generator is on {generator.device} but images are on {images.device}; "
                f"create it with torch.Generator(device={str(images.device)!r})."
            )
        return data_device

    def _rollout(self, logits: torch.Tensor, values: torch.Tensor, labels: torch.Tensor,
                 generator: torch.Generator | None) -> tuple[torch.Tensor, ...]:
        """:meth:`step`'s steps 1 and 2 from the rollout's forward pass (no gradients; call under ``no_grad``).

        ``logits``: ``(B, n_actions)``, ``values``: ``(B,)``, ``labels``: integer ``(B,)``. Returns the sampled
        actions (int64), their log-probabilities, the rewards, the advantages and the returns, each ``(B,)``.
        """
        horizon = self.cfg.horizon
        batch = logits.shape[0]
        n_envs = batch // horizon
        log_probs_all = F.log_softmax(logits.float(), dim=-1)
        actions = torch.multinomial(log_probs_all.exp(), 1, generator=generator).squeeze(1)
        old_log_probs = log_probs_all.gather(1, actions.unsqueeze(1)).squeeze(1)
        rewards = (actions == labels.remainder(logits.shape[-1])).float()

        def to_tn(x: torch.Tensor) -> torch.Tensor:  # (B,) -> (N, T) -> (T, N): env n owns samples n*T .. n*T+T-1
            return x.reshape(n_envs, horizon).transpose(0, 1)

        step_index = torch.arange(horizon, device=logits.device)
        dones = (step_index == horizon - 1).unsqueeze(1).expand(horizon, n_envs)
        last_value = torch.zeros(n_envs, device=logits.device, dtype=torch.float32)
        adv_tn, ret_tn = compute_gae(to_tn(rewards), to_tn(values.float()), dones, last_value,
                                     gamma=self.cfg.gamma, lam=self.cfg.lam)
        return (actions, old_log_probs, rewards, adv_tn.transpose(0, 1).reshape(batch),
                ret_tn.transpose(0, 1).reshape(batch))
