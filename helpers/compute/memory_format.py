"""NCHW versus NHWC (``torch.channels_last``) for the convolution encoder.

Three tools for notebook 07:

* :func:`trace_memory_format` runs a model once with forward hooks on every
  module and records, for each 4-D output, whether it is still
  channels_last-contiguous, so the layers that silently convert back to NCHW
  (a ``view``/``flatten``, a custom op) can be named;
* :func:`to_memory_format` converts a model and an image batch to one memory
  format (a copy of the model, the original is left alone);
* :func:`conv_step` builds the forward + backward call that the notebook times
  with :func:`helpers.timing.compare`, optionally under autocast.

On Ascend NPU channels_last is not supported (``Tensor.to`` and ``.npu()``
accept only ``contiguous_format``/``preserve_format``; see
docs/ascend_api_factcheck.md); :func:`channels_last_status` reports that from
the accelerator's capabilities so the notebook records "not applicable".

Nothing is done at import time.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from helpers.errors import ParameterError

logger = logging.getLogger(__name__)

__all__ = [
    "FORMATS",
    "LayerFormat",
    "FormatTrace",
    "trace_memory_format",
    "to_memory_format",
    "conv_step",
    "channels_last_status",
    "output_tolerance",
    "max_abs_diff",
]

#: Memory-format names accepted by :func:`to_memory_format` and :func:`conv_step`.
FORMATS: dict[str, torch.memory_format] = {
    "nchw": torch.contiguous_format,
    "channels_last": torch.channels_last,
}


def _fmt(name: Any) -> torch.memory_format:
    if name not in FORMATS:
        raise ParameterError(
            f"memory format {name!r} is not known; allowed: {', '.join(FORMATS)}. Pass one of those names."
        )
    return FORMATS[name]


@dataclass(frozen=True)
class LayerFormat:
    """The memory format of one module's 4-D output.

    Attributes
    ----------
    name : str
        Qualified module name (``model.named_modules()``), ``"<root>"`` for the model itself.
    kind : str
        Class name of the module (``"Conv2d"``, ``"Flatten"``...).
    shape : tuple of int
        Shape of the output, ``(N, C, H, W)``.
    channels_last : bool
        ``output.is_contiguous(memory_format=torch.channels_last)``.
    """

    name: str
    kind: str
    shape: tuple[int, ...]
    channels_last: bool


@dataclass(frozen=True)
class FormatTrace:
    """Result of :func:`trace_memory_format`: every 4-D output in call order.

    Attributes
    ----------
    layers : tuple of LayerFormat
        One entry per call of a module that returned a 4-D tensor.
    """

    layers: tuple[LayerFormat, ...]

    @property
    def kept(self) -> tuple[str, ...]:
        """tuple of str: names of the layers whose output is channels_last."""
        return tuple(layer.name for layer in self.layers if layer.channels_last)

    @property
    def dropped(self) -> tuple[str, ...]:
        """tuple of str: names of the layers whose 4-D output is no longer channels_last."""
        return tuple(layer.name for layer in self.layers if not layer.channels_last)

    @property
    def all_kept(self) -> bool:
        """bool: True when there is at least one 4-D output and all of them are channels_last."""
        return bool(self.layers) and not self.dropped

    def rows(self) -> list[dict[str, Any]]:
        """Return the layers as dicts (for a pandas table): name, kind, shape, channels_last."""
        return [
            {"layer": layer.name, "kind": layer.kind, "shape": "x".join(map(str, layer.shape)),
             "channels_last": layer.channels_last}
            for layer in self.layers
        ]


def trace_memory_format(model: nn.Module, *inputs: Any, leaves_only: bool = True) -> FormatTrace:
    """Run ``model(*inputs)`` once and record the memory format of each 4-D module output.

    A forward hook on each module records
    ``output.is_contiguous(memory_format=torch.channels_last)`` for outputs
    that are 4-D tensors (other outputs are skipped). The call runs under
    ``torch.no_grad()``; the model's train/eval mode is not changed (in
    training mode BatchNorm running statistics are updated once, as in any
    forward pass). The hooks are removed afterwards, even on error.

    Note that a tensor with a channel count of 1 or a 1x1 spatial size is
    contiguous in both formats, so such a layer reads as "kept".

    Parameters
    ----------
    model : torch.nn.Module
        The model; convert it (and the images) with :func:`to_memory_format` first.
    *inputs
        Positional inputs of ``model``.
    leaves_only : bool, default True
        Hook only modules without children (Conv2d, BatchNorm2d, ReLU, Flatten...);
        False hooks containers too.

    Returns
    -------
    FormatTrace
        The 4-D outputs in call order.

    Raises
    ------
    ParameterError
        If ``model`` is not an ``nn.Module``.
    """
    if not isinstance(model, nn.Module):
        raise ParameterError(f"model has type {type(model).__name__}; expected a torch.nn.Module.")
    found: list[LayerFormat] = []
    handles = []

    def hook_for(name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if isinstance(output, torch.Tensor) and output.dim() == 4:
                found.append(LayerFormat(
                    name=name or "<root>", kind=type(module).__name__, shape=tuple(output.shape),
                    channels_last=bool(output.is_contiguous(memory_format=torch.channels_last)),
                ))
        return hook

    try:
        for name, module in model.named_modules():
            if leaves_only and any(True for _ in module.children()):
                continue
            handles.append(module.register_forward_hook(hook_for(name)))
        with torch.no_grad():
            model(*inputs)
    finally:
        for h in handles:
            h.remove()
    trace = FormatTrace(layers=tuple(found))
    if trace.dropped:
        logger.info("channels_last dropped by: %s", ", ".join(trace.dropped))
    return trace


def to_memory_format(model: nn.Module, images: torch.Tensor, fmt: str) -> tuple[nn.Module, torch.Tensor]:
    """Return a deep copy of ``model`` and a copy of ``images`` in memory format ``fmt``.

    Parameters
    ----------
    model : torch.nn.Module
        Left unchanged; the copy has the same weights.
    images : torch.Tensor
        Float ``(N, C, H, W)``.
    fmt : str
        ``"nchw"`` (``torch.contiguous_format``) or ``"channels_last"``.

    Returns
    -------
    (torch.nn.Module, torch.Tensor)
        The converted model copy (4-D weights in ``fmt``) and images
        (``images.contiguous(memory_format=...)``).

    Raises
    ------
    ParameterError
        Unknown ``fmt``, or ``images`` not 4-D.
    """
    memory_format = _fmt(fmt)
    if not isinstance(images, torch.Tensor) or images.dim() != 4:
        shape = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
        raise ParameterError(f"images has shape {shape}; expected a 4-D (N, C, H, W) tensor.")
    out = copy.deepcopy(model).to(memory_format=memory_format)
    return out, images.contiguous(memory_format=memory_format)


def conv_step(
    module: nn.Module,
    images: torch.Tensor,
    *,
    backward: bool = True,
    autocast: Callable[[], contextlib.AbstractContextManager] | None = None,
) -> Callable[[], torch.Tensor]:
    """Build a call that runs ``module(images)`` forward (and backward) once.

    The loss is ``module(images).float().sum()``; gradients are reset with
    ``set_to_none`` before each backward so they do not accumulate. The call
    returns the output (detached), so a first call can be compared between
    variants before timing.

    Parameters
    ----------
    module : torch.nn.Module
        E.g. ``model.image_encoder`` in one memory format.
    images : torch.Tensor
        Float ``(N, C, H, W)`` input in the same memory format.
    backward : bool, default True
        Also run the backward pass.
    autocast : callable or None
        Zero-argument factory of an autocast context (e.g.
        ``lambda: acc.autocast("bfloat16")``); None runs in the input's dtype.

    Returns
    -------
    callable
        ``fn() -> torch.Tensor``.
    """
    if not isinstance(module, nn.Module):
        raise ParameterError(f"module has type {type(module).__name__}; expected a torch.nn.Module.")

    def step() -> torch.Tensor:
        ctx = autocast() if autocast is not None else contextlib.nullcontext()
        if backward:
            module.zero_grad(set_to_none=True)
            with ctx:
                out = module(images)
            out.float().sum().backward()
        else:
            with torch.no_grad(), ctx:
                out = module(images)
        return out.detach()

    return step


def channels_last_status(acc: Any) -> tuple[bool, str]:
    """Whether channels_last can be measured on ``acc``, and why not.

    Parameters
    ----------
    acc : helpers.device.Accelerator

    Returns
    -------
    (bool, str)
        ``(True, "")`` when ``acc.capabilities.channels_last`` is available,
        else ``(False, reason)`` with the capability's detail (on NPU: not
        supported, keep NCHW; see the fact-check).
    """
    cap = acc.capabilities.channels_last
    if cap.available:
        return True, ""
    return False, cap.detail or f"channels_last is not available on {acc.kind}"


#: (rtol, atol) per compute dtype for outputs of the same network in two memory
#: formats. float32: different kernel orderings of the reductions (conv, BN
#: statistics) differ by a few ulp per op; bfloat16 has an 8-bit mantissa
#: (relative step 2**-8 = 0.0039) and the formats round at different points.
_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-4, 1e-4),
    torch.float64: (1e-10, 1e-10),
    torch.bfloat16: (5e-2, 5e-2),
    torch.float16: (1e-2, 1e-2),
}


#: (rtol, atol) for float32 convolutions that may run in TF32 (cuDNN on Ampere and
#: newer GPUs with ``torch.backends.cudnn.allow_tf32``, True by default): TF32
#: keeps a 10-bit mantissa (relative step 2**-10, about 1e-3) in the products.
_TF32_TOLERANCE: tuple[float, float] = (5e-3, 5e-3)


def output_tolerance(dtype: torch.dtype, *, tf32: bool = False) -> tuple[float, float]:
    """Return ``(rtol, atol)`` for comparing two variants computed in ``dtype``.

    Parameters
    ----------
    dtype : torch.dtype
        The compute dtype (the autocast dtype, or float32).
    tf32 : bool, default False
        True when float32 convolutions may use TF32 (on CUDA:
        ``torch.backends.cudnn.allow_tf32``); loosens the float32 tolerance.

    Returns
    -------
    (float, float)
        Relative and absolute tolerance for ``torch.testing.assert_close`` /
        ``torch.allclose`` on outputs of order 1 (batch-normalised activations).

    Raises
    ------
    ParameterError
        For a dtype with no tolerance defined.
    """
    if tf32 and dtype == torch.float32:
        return _TF32_TOLERANCE
    try:
        return _TOLERANCES[dtype]
    except KeyError:
        raise ParameterError(
            f"no tolerance for dtype {dtype}; known: {', '.join(str(d) for d in _TOLERANCES)}."
        ) from None


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest ``|a - b|`` over all elements, computed in float32 on ``a``'s device.

    Raises
    ------
    ParameterError
        When the shapes differ.
    """
    if a.shape != b.shape:
        raise ParameterError(f"shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}; compare like with like.")
    return float((a.float() - b.float().to(a.device)).abs().max()) if a.numel() else 0.0
