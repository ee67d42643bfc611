"""The workbook's training workload: a small multimodal policy network.

The model reads an RGB image and a short caption (token ids) and returns the
logits of a categorical policy over ``n_actions`` discrete actions together with
a scalar value estimate. It is deliberately built from the layer types whose
performance the notebooks study:

* an image encoder of convolution stages (``Conv2d`` 3x3 + ``BatchNorm2d`` +
  ``ReLU``; the first convolution of a stage has stride 2), followed by a global
  average pool;
* a text encoder of pre-LayerNorm transformer blocks whose attention calls
  :func:`torch.nn.functional.scaled_dot_product_attention` with a key-padding
  mask (token id 0 is padding), followed by a masked mean pool;
* a fusion MLP over the concatenated features with a policy head and a value
  head.

The forward pass uses no data-dependent Python control flow and no host
synchronisation, works with ``channels_last`` image inputs and weights, and runs
under :func:`torch.amp.autocast` (fp16/bf16).

Nothing is done at import time; build a model with :func:`build_policy`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from helpers.compute._checks import bad_field, check_positive_int, is_int
from helpers.errors import ParameterError
from helpers.workload import DEFAULT

logger = logging.getLogger(__name__)

__all__ = [
    "PAD_ID",
    "PolicyConfig",
    "MultimodalPolicy",
    "build_policy",
    "count_parameters",
]

#: Token id that marks padding in ``tokens``. Positions holding it are ignored
#: by attention (as keys) and by the text pooling.
PAD_ID: int = 0


@dataclass(frozen=True)
class PolicyConfig:
    """Sizes of the multimodal policy.

    The defaults give a model of about 0.35 M parameters (see
    :func:`count_parameters`) that trains at a few steps per second on a
    laptop CPU at batch 32; scale ``image_size``, ``conv_channels``,
    ``d_model`` and ``n_layers`` up for an accelerator.

    Parameters
    ----------
    image_size : int
        Side of the square input images in pixels (``S`` in ``(B, 3, S, S)``).
        The network itself accepts any size; this value is what data loaders and
        notebooks use, and it must be at least ``2 ** len(conv_channels)`` so
        that every stride-2 stage has a pixel left.
    in_channels : int
        Number of image channels (3 for RGB).
    conv_channels : tuple of int
        Output channels of each convolution stage; each stage halves the
        spatial size.
    convs_per_stage : int
        Convolutions per stage: the first has stride 2, the others stride 1.
        Each is followed by ``BatchNorm2d`` and ``ReLU``.
    vocab_size : int
        Number of token ids, including the padding id 0.
    text_len : int
        Maximum caption length ``L`` in tokens (size of the learned positional
        embedding). Shorter inputs are accepted.
    d_model : int
        Width of the text encoder; must be divisible by ``n_heads``.
    n_heads : int
        Attention heads per transformer block.
    n_layers : int
        Number of pre-LN transformer blocks.
    ffn_mult : int
        Hidden width of each block's feed-forward network, as a multiple of
        ``d_model``.
    fusion_hidden : int
        Width of the hidden layer of the fusion MLP.
    n_actions : int
        Number of discrete actions ``A`` (policy logits per sample).
    dropout : float
        Dropout probability in the text encoder and fusion MLP, in ``[0, 1)``.
        Keep 0.0 for PPO: with dropout the rollout and the update see different
        networks, so the first-epoch probability ratio is no longer 1.

    Raises
    ------
    ParameterError
        If a field has the wrong type or is out of range; the message names
        the field, the value seen and what is allowed.
    """

    image_size: int = DEFAULT.image_size
    in_channels: int = 3
    conv_channels: tuple[int, ...] = (32, 64, 128)
    convs_per_stage: int = 1
    vocab_size: int = 512
    text_len: int = DEFAULT.text_len
    d_model: int = DEFAULT.d_model
    n_heads: int = 4
    n_layers: int = 2
    ffn_mult: int = 4
    fusion_hidden: int = 256
    n_actions: int = 16
    dropout: float = 0.0

    @classmethod
    def for_job(cls, *, image_size: int, model_width: int, d_model: int, text_len: int, vocab_size: int,
                n_classes: int) -> "PolicyConfig":
        """The workbook's sizing of the policy from a notebook's parameters.

        Conv stages of ``model_width``, ``2 * model_width`` and ``4 * model_width``
        channels, one action per class (at least 2).

        Parameters
        ----------
        image_size, model_width, d_model, text_len : int
            The notebook parameters of the same names (px, channels, width, tokens).
        vocab_size : int
            The tokenizer's vocabulary size.
        n_classes : int
            Labels in the dataset (``DatasetIndex.n_classes``).

        Raises
        ------
        ParameterError
            As the constructor, for out-of-range sizes.
        """
        w = model_width
        return cls(image_size=image_size, conv_channels=(w, 2 * w, 4 * w), vocab_size=vocab_size,
                   text_len=text_len, d_model=d_model, n_actions=max(2, n_classes))

    def __post_init__(self) -> None:
        owner = "PolicyConfig"
        for name in (
            "image_size",
            "in_channels",
            "convs_per_stage",
            "text_len",
            "d_model",
            "n_heads",
            "n_layers",
            "ffn_mult",
            "fusion_hidden",
        ):
            check_positive_int(f"{owner}.{name}", getattr(self, name))
        if not is_int(self.vocab_size) or self.vocab_size < 2:
            raise bad_field(f"{owner}.vocab_size", self.vocab_size, "an integer >= 2 (id 0 is padding)")
        if not is_int(self.n_actions) or self.n_actions < 2:
            raise bad_field(f"{owner}.n_actions", self.n_actions, "an integer >= 2")
        channels = self.conv_channels
        if isinstance(channels, list):
            channels = tuple(channels)
            object.__setattr__(self, "conv_channels", channels)
        if (
            not isinstance(channels, tuple)
            or len(channels) == 0
            or not all(is_int(c) and c >= 1 for c in channels)
        ):
            raise bad_field(
                f"{owner}.conv_channels", self.conv_channels, "a non-empty tuple of integers >= 1"
            )
        if self.d_model % self.n_heads != 0:
            raise bad_field(
                f"{owner}.d_model",
                self.d_model,
                f"a multiple of n_heads={self.n_heads} (e.g. {self.n_heads * max(1, self.d_model // self.n_heads)})",
            )
        min_size = 2 ** len(channels)
        if self.image_size < min_size:
            raise bad_field(
                f"{owner}.image_size",
                self.image_size,
                f"an integer >= 2**len(conv_channels) = {min_size}",
            )
        dropout = self.dropout
        if (
            isinstance(dropout, bool)
            or not isinstance(dropout, (int, float))
            or not (0.0 <= float(dropout) < 1.0)
        ):
            raise bad_field(f"{owner}.dropout", dropout, "a float in [0, 1)")


class _ConvStage(nn.Sequential):
    """``convs`` x (Conv3x3 + BatchNorm2d + ReLU); the first convolution has stride 2."""

    def __init__(self, c_in: int, c_out: int, convs: int) -> None:
        layers: list[nn.Module] = []
        for i in range(convs):
            layers += [
                nn.Conv2d(c_in if i == 0 else c_out, c_out, 3, stride=2 if i == 0 else 1,
                          padding=1, bias=False),
                nn.BatchNorm2d(c_out),
                nn.ReLU(inplace=True),
            ]
        super().__init__(*layers)


class _ImageEncoder(nn.Module):
    """Convolution stages followed by a global average pool: ``(B, C, S, S) -> (B, C_last)``."""

    def __init__(self, cfg: PolicyConfig) -> None:
        super().__init__()
        stages = []
        c_in = cfg.in_channels
        for c_out in cfg.conv_channels:
            stages.append(_ConvStage(c_in, c_out, cfg.convs_per_stage))
            c_in = c_out
        self.stages = nn.Sequential(*stages)
        self.out_dim = c_in

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.stages(images)
        # A mean over H and W works for NCHW and NHWC (channels_last) storage
        # alike; no view/flatten that would need a contiguous NCHW tensor.
        return x.mean(dim=(2, 3))


class _SelfAttention(nn.Module):
    """Multi-head self-attention through ``F.scaled_dot_product_attention``."""

    def __init__(self, d_model: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.dropout = dropout

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor) -> torch.Tensor:
        b, length, d = x.shape
        # (B, L, 3D) -> (3, B, H, L, Dh)
        qkv = self.qkv(x).unflatten(-1, (3, self.n_heads, d // self.n_heads)).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=self.dropout if self.training else 0.0
        )
        return self.proj(out.transpose(1, 2).reshape(b, length, d))


class _TransformerBlock(nn.Module):
    """Pre-LN block: ``x + attn(LN(x))`` then ``x + ffn(LN(x))``."""

    def __init__(self, d_model: int, n_heads: int, ffn_mult: int, dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = _SelfAttention(d_model, n_heads, dropout)
        self.ln2 = nn.LayerNorm(d_model)
        self.ffn = nn.Sequential(
            nn.Linear(d_model, ffn_mult * d_model),
            nn.GELU(),
            nn.Linear(ffn_mult * d_model, d_model),
        )
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln1(x), attn_mask))
        return x + self.drop(self.ffn(self.ln2(x)))


class _TextEncoder(nn.Module):
    """Token + learned positional embedding, pre-LN blocks, final LN, masked mean pool."""

    def __init__(self, cfg: PolicyConfig) -> None:
        super().__init__()
        self.text_len = cfg.text_len
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.text_len, cfg.d_model)
        self.blocks = nn.ModuleList(
            _TransformerBlock(cfg.d_model, cfg.n_heads, cfg.ffn_mult, cfg.dropout)
            for _ in range(cfg.n_layers)
        )
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.out_dim = cfg.d_model

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        keep = tokens != PAD_ID  # (B, L) True where a real token is
        # A caption made only of padding would leave its queries with no key to
        # attend to: softmax over an all -inf row is NaN on several backends.
        # Such rows attend to all of their (padding) positions instead; their
        # pooled feature is still zero because the pool below uses ``keep``.
        # Pure tensor ops: no data-dependent branch, no host sync.
        empty = ~keep.any(dim=1, keepdim=True)  # (B, 1)
        attn_keep = (keep | empty)[:, None, None, :]  # (B, 1, 1, L): True = attend
        positions = torch.arange(length, device=tokens.device)
        x = self.tok(tokens) + self.pos(positions)
        for block in self.blocks:
            x = block(x, attn_keep)
        x = self.ln_f(x)
        weights = keep.to(x.dtype).unsqueeze(-1)  # (B, L, 1)
        count = weights.sum(dim=1).clamp_min(1.0)  # (B, 1); 0 tokens -> divide by 1
        return (x * weights).sum(dim=1) / count


class MultimodalPolicy(nn.Module):
    """Actor-critic network over an image and a caption.

    Parameters
    ----------
    cfg : PolicyConfig
        Sizes of the network.

    Notes
    -----
    ``forward(images, tokens)`` takes

    * ``images``: float tensor ``(B, in_channels, S, S)``, any float dtype,
      NCHW or ``channels_last`` memory format; values are expected to be
      normalised (roughly zero mean, unit variance);
    * ``tokens``: int64 tensor ``(B, L)`` with ``L <= cfg.text_len``; id 0 is
      padding (a row of only padding is allowed and gives finite outputs);

    and returns ``(logits, value)``: ``logits`` ``(B, n_actions)`` and
    ``value`` ``(B,)``, floats (the autocast dtype under autocast).
    """

    def __init__(self, cfg: PolicyConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.image_encoder = _ImageEncoder(cfg)
        self.text_encoder = _TextEncoder(cfg)
        fused = self.image_encoder.out_dim + self.text_encoder.out_dim
        self.fusion = nn.Sequential(
            nn.Linear(fused, cfg.fusion_hidden),
            nn.ReLU(inplace=True),
            nn.Dropout(cfg.dropout),
            nn.Linear(cfg.fusion_hidden, cfg.fusion_hidden),
            nn.ReLU(inplace=True),
        )
        self.policy_head = nn.Linear(cfg.fusion_hidden, cfg.n_actions)
        self.value_head = nn.Linear(cfg.fusion_hidden, 1)
        self._init_heads()

    def _init_heads(self) -> None:
        # Policy output layer initialised 100x smaller than usual so the initial
        # policy is close to uniform: Andrychowicz et al. 2020, "What Matters in
        # On-Policy Reinforcement Learning?" (arXiv:2006.05990), section 3.2.
        # Plain scaling of PyTorch's default init keeps the operation a
        # cheap CPU-side elementwise op (no QR as orthogonal init would need).
        with torch.no_grad():
            self.policy_head.weight.mul_(0.01)
            self.policy_head.bias.zero_()
            self.value_head.bias.zero_()

    def forward(self, images: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Compute policy logits and value estimates.

        Parameters
        ----------
        images : torch.Tensor
            Float, shape ``(B, in_channels, S, S)``.
        tokens : torch.Tensor
            int64, shape ``(B, L)`` with ``1 <= L <= cfg.text_len``; 0 is padding.

        Returns
        -------
        logits : torch.Tensor
            Shape ``(B, n_actions)``, unnormalised log-probabilities.
        value : torch.Tensor
            Shape ``(B,)``, the value estimate.

        Raises
        ------
        ParameterError
            If a shape or dtype does not fit the configuration (checked on
            metadata only, so no host synchronisation).
        """
        self._check_inputs(images, tokens)
        img = self.image_encoder(images)
        txt = self.text_encoder(tokens)
        # Under autocast the two features can differ in dtype (LayerNorm runs
        # in fp32); cast to the image feature's dtype before concatenating.
        h = self.fusion(torch.cat([img, txt.to(img.dtype)], dim=1))
        return self.policy_head(h), self.value_head(h).squeeze(-1)

    def _check_inputs(self, images: torch.Tensor, tokens: torch.Tensor) -> None:
        cfg = self.cfg
        if images.dim() != 4 or images.shape[1] != cfg.in_channels:
            raise ParameterError(
                f"images has shape {tuple(images.shape)}; expected (B, {cfg.in_channels}, S, S). "
                "Pass a batch of images in NCHW order (channels_last storage is fine)."
            )
        if not images.is_floating_point():
            raise ParameterError(
                f"images has dtype {images.dtype}; expected a float dtype. "
                "Convert uint8 pixels to float and normalise them first."
            )
        if tokens.dim() != 2 or tokens.shape[0] != images.shape[0]:
            raise ParameterError(
                f"tokens has shape {tuple(tokens.shape)} for {images.shape[0]} images; "
                "expected (B, L) with the same B as images."
            )
        if not 1 <= tokens.shape[1] <= cfg.text_len:
            raise ParameterError(
                f"tokens has length L={tokens.shape[1]}; allowed 1..text_len={cfg.text_len}. "
                "Truncate captions or build the policy with a larger text_len."
            )
        if tokens.dtype not in (torch.int64, torch.int32):
            raise ParameterError(
                f"tokens has dtype {tokens.dtype}; expected torch.int64 token ids."
            )


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Count the parameters of a model.

    Parameters
    ----------
    model : torch.nn.Module
        Any module.
    trainable_only : bool
        Count only parameters with ``requires_grad=True``.

    Returns
    -------
    int
        Total number of scalar parameters (buffers such as BatchNorm running
        statistics are not counted).
    """
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def build_policy(cfg: PolicyConfig | None = None, device: torch.device | str | None = None) -> MultimodalPolicy:
    """Build a :class:`MultimodalPolicy` and move it to a device.

    The weights are initialised on the CPU from PyTorch's global generator and
    only then moved, so the same ``torch.manual_seed(seed)`` before the call
    gives the same initial weights on every device. Seeding is the caller's job.

    Parameters
    ----------
    cfg : PolicyConfig, optional
        Sizes of the network; ``PolicyConfig()`` if omitted.
    device : torch.device or str, optional
        Where to put the model (``"cpu"``, ``"cuda"``, ``"npu:0"``...); stays
        on the CPU if omitted.

    Returns
    -------
    MultimodalPolicy
        The model, in training mode.

    Raises
    ------
    ParameterError
        If ``cfg`` is not a PolicyConfig.
    """
    if cfg is None:
        cfg = PolicyConfig()
    if not isinstance(cfg, PolicyConfig):
        raise ParameterError(
            f"cfg has type {type(cfg).__name__}; expected a PolicyConfig. Build one with PolicyConfig(...)."
        )
    model = MultimodalPolicy(cfg)
    if device is not None:
        model = model.to(device)
    logger.debug("built MultimodalPolicy with %d parameters on %s", count_parameters(model), device or "cpu")
    return model
