"""Mixed precision done right: one optimizer-step helper, on-device clipping, dtype hooks.

The order of a mixed-precision update with a loss scaler is fixed by what each
call does (PyTorch AMP examples, "Working with Unscaled Gradients",
https://docs.pytorch.org/docs/stable/notes/amp_examples.html)::

    scaler.scale(loss).backward()   # gradients are multiplied by the scale S
    scaler.unscale_(optimizer)      # divided by S in place, inf/NaN recorded
    clip(params, max_norm)          # so the threshold applies to TRUE gradients
    scaler.step(optimizer)          # skipped when an inf/NaN was found
    scaler.update()                 # S halves after an overflow, doubles after
                                    # growth_interval clean steps

:class:`AmpStepper` runs exactly that, counts overflowed (skipped) steps in a
device tensor, and survives a step in which no parameter received a gradient
(``GradScaler.step`` would raise "No inf checks were recorded for this
optimizer").

About "hysteresis": no PyTorch or torch_npu GradScaler accepts it
(``TypeError: ... unexpected keyword argument 'hysteresis'``). It comes from
Megatron-LM's ``DynamicGradScaler`` and DeepSpeed's fp16 config, where the
scale is only backed off after several consecutive overflows. The real
signature is ``torch.amp.GradScaler(device, init_scale, growth_factor,
backoff_factor, growth_interval, enabled)``; the nearest real form of a
"init_scale 2**10, growth_interval 200, hysteresis 2" setting is
``torch.amp.GradScaler(device, init_scale=2.**10, growth_interval=200)``, which
backs off on every overflow (docs/ascend_api_factcheck.md, section 2).

Host synchronisation: the clip coefficient and the overflow counter stay on
the device. ``GradScaler.step`` itself reads the found-inf flag on the host
once per step (``found_inf.item()`` in ``torch/amp/grad_scaler.py``) unless
the optimizer handles scaling itself (fused AdamW/Adam); that one read is
PyTorch's, not this module's.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Iterable

import torch
from torch import nn

from helpers.errors import ParameterError

logger = logging.getLogger(__name__)

__all__ = [
    "AmpStepper",
    "DtypeRow",
    "StepOutcome",
    "clip_grad_norm_on_device",
    "make_grad_scaler",
    "record_output_dtypes",
    "resolve_autocast_dtype",
]

#: autocast dtype picked by ``"auto"`` per device kind. fp16 on accelerators is
#: supported by every CUDA GPU and every Ascend NPU generation and is the case
#: that needs a GradScaler; CPUs only autocast to bf16 usefully.
AUTO_DTYPE: dict[str, str] = {"cpu": "bfloat16", "cuda": "float16", "npu": "float16"}


def resolve_autocast_dtype(requested: str, device_kind: str,
                           supported: Iterable[str] | None = None) -> torch.dtype:
    """Turn the notebook's ``autocast_dtype`` parameter into a torch dtype.

    Parameters
    ----------
    requested : str
        ``"auto"``, ``"bfloat16"`` or ``"float16"``.
    device_kind : str
        ``"cpu"``, ``"cuda"`` or ``"npu"``.
    supported : iterable of str, optional
        Dtype names the device can autocast to
        (``Accelerator.capabilities.autocast_dtypes``); not checked if None.

    Returns
    -------
    torch.dtype
        ``torch.bfloat16`` or ``torch.float16``.

    Raises
    ------
    ParameterError
        Unknown name, unknown device kind with ``"auto"``, or a dtype the
        device does not support.
    """
    if requested == "auto":
        if device_kind not in AUTO_DTYPE:
            raise ParameterError(f"device kind {device_kind!r} has no automatic autocast dtype; "
                                 f"pass autocast_dtype='bfloat16' or 'float16'.")
        name = AUTO_DTYPE[device_kind]
    elif requested in ("bfloat16", "float16"):
        name = requested
    else:
        raise ParameterError(f"autocast_dtype={requested!r} is not allowed; allowed: auto, bfloat16, float16.")
    if supported is not None:
        supported = tuple(supported)
        if name not in supported:
            raise ParameterError(
                f"autocast dtype {name} is not supported on {device_kind}; supported here: "
                f"{', '.join(supported) or 'none'}. Pick one of those with autocast_dtype.")
    return getattr(torch, name)


def make_grad_scaler(device_type: str, dtype: torch.dtype | None, *, init_scale: float = 2.0 ** 10,
                     growth_interval: int = 200, force: bool = False) -> torch.amp.GradScaler:
    """Build ``torch.amp.GradScaler`` with only real arguments.

    A scaler is needed for float16 only: fp16's exponent range (smallest normal
    6.1e-5) lets small gradients underflow to zero, while bfloat16 keeps
    float32's exponent range. For other dtypes the scaler is built disabled
    (all its methods then pass through), unless ``force`` is set (used to
    demonstrate overflow handling on a CPU).

    Parameters
    ----------
    device_type : str
        ``"cpu"``, ``"cuda"`` or ``"npu"`` (``"npu"`` needs torch_npu loaded).
    dtype : torch.dtype or None
        The autocast dtype; None means full precision.
    init_scale : float
        Initial loss scale, > 0. Default 2**10 (the seed's value; PyTorch's
        default is 2**16).
    growth_interval : int
        Consecutive overflow-free steps before the scale doubles, >= 1.
        Default 200 (the seed's value; PyTorch's default is 2000).
    force : bool
        Enable the scaler whatever the dtype.

    Returns
    -------
    torch.amp.GradScaler

    Raises
    ------
    ParameterError
        ``init_scale <= 0`` or ``growth_interval < 1``.
    """
    if not isinstance(init_scale, (int, float)) or isinstance(init_scale, bool) or not init_scale > 0:
        raise ParameterError(f"init_scale={init_scale!r} is not allowed; pass a number > 0 (e.g. 1024.0).")
    if not isinstance(growth_interval, int) or isinstance(growth_interval, bool) or growth_interval < 1:
        raise ParameterError(f"growth_interval={growth_interval!r} is not allowed; pass an integer >= 1.")
    enabled = force or dtype == torch.float16
    return torch.amp.GradScaler(device_type, init_scale=float(init_scale), growth_interval=growth_interval,
                                enabled=enabled)


def clip_grad_norm_on_device(params: Iterable[torch.Tensor], max_norm: float, *,
                             foreach: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Clip gradients to a global L2 norm without reading anything on the host.

    The clip scale is computed from the gradient norm on the device,
    ``coef = min(1, max_norm / (norm + 1e-6))`` (the formula and epsilon of
    ``torch.nn.utils.clip_grad_norm_``), and applied with one multi-tensor
    multiply (``foreach``). Nothing calls ``.item()``: no Python branch on
    the norm, so the device queue is not drained.

    Parameters
    ----------
    params : iterable of torch.Tensor
        Parameters; those whose ``grad`` is None are ignored.
    max_norm : float
        Threshold, > 0 (``float('inf')`` measures without clipping).
    foreach : bool, optional
        Passed to ``torch.nn.utils.get_total_norm``/``clip_grads_with_norm_``;
        None lets PyTorch pick the multi-tensor path where supported.

    Returns
    -------
    norm : torch.Tensor
        Scalar float32 on the gradients' device: the norm before clipping
        (inf/NaN when a gradient overflowed).
    coef : torch.Tensor
        Scalar: the factor the gradients were multiplied by, in ``[0, 1]``.

    Raises
    ------
    ParameterError
        If ``max_norm`` is not > 0.
    """
    if not isinstance(max_norm, (int, float)) or isinstance(max_norm, bool) or not max_norm > 0:
        raise ParameterError(f"max_norm={max_norm!r} is not allowed; pass a number > 0 (inf: no clipping).")
    params = [p for p in params if p.grad is not None]
    if not params:
        zero = torch.zeros(())
        return zero, torch.ones(())
    grads = [p.grad for p in params]
    norm = nn.utils.get_total_norm(grads, 2.0, error_if_nonfinite=False, foreach=foreach)
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    nn.utils.clip_grads_with_norm_(params, max_norm, norm, foreach=foreach)
    return norm, coef


@dataclass(frozen=True)
class StepOutcome:
    """What one :meth:`AmpStepper.step` did.

    Attributes
    ----------
    grad_norm : torch.Tensor
        Scalar, the true (unscaled) gradient norm before clipping; inf/NaN on
        an overflow step.
    clip_coef : torch.Tensor
        Scalar in ``[0, 1]``: factor applied to the gradients.
    overflow : torch.Tensor
        Bool scalar on the device: the gradients were not finite, so the
        scaler skipped the optimizer step (when it is enabled).
    stepped_without_grads : bool
        True when no parameter had a gradient and the step was skipped on the
        host (nothing to do; the scaler was left untouched).
    """

    grad_norm: torch.Tensor
    clip_coef: torch.Tensor
    overflow: torch.Tensor
    stepped_without_grads: bool = False


class AmpStepper:
    """The optimizer half of a training step, in the order mixed precision needs.

    ``step(loss)``: ``scaler.scale(loss).backward()``, ``scaler.unscale_``,
    clip to ``max_norm`` on true gradients (:func:`clip_grad_norm_on_device`),
    ``scaler.step``, ``scaler.update``. With ``scaler=None`` or a disabled
    scaler the same code is a plain fp32/bf16 step (backward, clip, step).

    Parameters
    ----------
    optimizer : torch.optim.Optimizer
    scaler : torch.amp.GradScaler, optional
        From :func:`make_grad_scaler`; None for no loss scaling.
    max_norm : float
        Gradient-clipping threshold, > 0 (inf: measure only).
    record_scale : bool
        Append the loss scale after each update to :attr:`scale_history`.
        This reads the scale on the host (``GradScaler.get_scale``), one
        synchronisation per step: use it for curves, not for timed runs.

    Attributes
    ----------
    overflow_steps : torch.Tensor
        int64 scalar on the device: steps whose gradients were not finite
        (with an enabled scaler: skipped steps).
    steps : int
        Calls of :meth:`step`.
    no_grad_steps : int
        Calls in which no parameter had a gradient.
    scale_history : list of float
        Loss scale after each step (only with ``record_scale``).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None = None, *,
                 max_norm: float = float("inf"), record_scale: bool = False) -> None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ParameterError(f"optimizer has type {type(optimizer).__name__}; expected a torch.optim.Optimizer.")
        if scaler is not None and not isinstance(scaler, torch.amp.GradScaler):
            raise ParameterError(f"scaler has type {type(scaler).__name__}; expected torch.amp.GradScaler or None.")
        if not isinstance(max_norm, (int, float)) or isinstance(max_norm, bool) or not max_norm > 0:
            raise ParameterError(f"max_norm={max_norm!r} is not allowed; pass a number > 0 (inf: no clipping).")
        self.optimizer = optimizer
        self.scaler = scaler
        self.max_norm = float(max_norm)
        self.record_scale = bool(record_scale)
        self.overflow_steps: torch.Tensor | None = None
        self.steps = 0
        self.no_grad_steps = 0
        self.scale_history: list[float] = []

    @property
    def scaling(self) -> bool:
        """True when a scaler is present and enabled."""
        return self.scaler is not None and self.scaler.is_enabled()

    def _params(self) -> list[torch.Tensor]:
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def step(self, loss: torch.Tensor) -> StepOutcome:
        """Backward the loss and update the parameters; see the class docstring.

        The caller zeroes the gradients before the forward pass
        (``optimizer.zero_grad(set_to_none=True)``).

        Parameters
        ----------
        loss : torch.Tensor
            Scalar loss (float32 recommended; computed under autocast is fine).

        Returns
        -------
        StepOutcome
            Device tensors; nothing was read on the host by this method.
        """
        self.steps += 1
        params = self._params()
        if loss.requires_grad:
            (self.scaler.scale(loss) if self.scaling else loss).backward()
        device = params[0].device if params else loss.device
        if all(p.grad is None for p in params):
            # GradScaler.step would raise "No inf checks were recorded for this optimizer".
            self.no_grad_steps += 1
            logger.debug("step %d: no parameter received a gradient; optimizer and scaler skipped", self.steps)
            zero = torch.zeros((), device=device)
            self._count(torch.zeros((), dtype=torch.bool, device=device))
            if self.record_scale:
                self.scale_history.append(self.scaler.get_scale() if self.scaling else 1.0)
            return StepOutcome(zero, torch.ones((), device=device),
                               torch.zeros((), dtype=torch.bool, device=device), True)
        if self.scaling:
            self.scaler.unscale_(self.optimizer)
        norm, coef = clip_grad_norm_on_device(params, self.max_norm)
        overflow = ~torch.isfinite(norm)
        self._count(overflow)
        if self.scaling:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        if self.record_scale:
            self.scale_history.append(self.scaler.get_scale() if self.scaling else 1.0)
        return StepOutcome(norm, coef, overflow)

    def _count(self, overflow: torch.Tensor) -> None:
        if self.overflow_steps is None:
            self.overflow_steps = torch.zeros((), dtype=torch.int64, device=overflow.device)
        self.overflow_steps += overflow.to(torch.int64)


@dataclass(frozen=True)
class DtypeRow:
    """Output dtype of one module seen by :func:`record_output_dtypes`.

    Attributes
    ----------
    module : str
        Qualified name in the model (``named_modules``).
    kind : str
        Class name, e.g. ``"LayerNorm"``.
    input_dtype : str
        dtype of the first floating-point input tensor ("" if none).
    output_dtype : str
        dtype of the first floating-point output tensor ("" if none).
    """

    module: str
    kind: str
    input_dtype: str
    output_dtype: str


def _first_float(value) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value if value.is_floating_point() else None
    if isinstance(value, (tuple, list)):
        for v in value:
            found = _first_float(v)
            if found is not None:
                return found
    if isinstance(value, dict):
        return _first_float(list(value.values()))
    return None


def record_output_dtypes(model: nn.Module, forward: Callable[[], object], *,
                         leaves_only: bool = True) -> list[DtypeRow]:
    """Run ``forward()`` once with forward hooks that record each module's dtypes.

    Call it inside ``torch.amp.autocast(...)`` to see which modules autocast
    runs in low precision and which it keeps in float32 (LayerNorm,
    softmax-like and reduction ops are on autocast's float32 list; see
    https://docs.pytorch.org/docs/stable/amp.html#autocast-op-reference). The
    hooks are removed afterwards, also on error. Functional ops called inside
    a module's ``forward`` (softmax in attention) show up only through the
    module that calls them.

    Parameters
    ----------
    model : torch.nn.Module
    forward : callable
        Runs one forward pass of ``model`` (its return value is ignored).
    leaves_only : bool
        Record only modules without children (default), else every module.

    Returns
    -------
    list of DtypeRow
        In call order, one row per module call.
    """
    rows: list[DtypeRow] = []
    handles = []

    def hook_for(name: str):
        def hook(module: nn.Module, args, output) -> None:
            x, y = _first_float(args), _first_float(output)
            rows.append(DtypeRow(name, type(module).__name__,
                                 str(x.dtype).replace("torch.", "") if x is not None else "",
                                 str(y.dtype).replace("torch.", "") if y is not None else ""))
        return hook

    for name, module in model.named_modules():
        if leaves_only and next(module.children(), None) is not None:
            continue
        handles.append(module.register_forward_hook(hook_for(name or type(module).__name__)))
    try:
        with torch.no_grad():
            forward()
    finally:
        for h in handles:
            h.remove()
    return rows
