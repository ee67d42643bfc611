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
    "PROBE_OPS",
    "make_grad_scaler",
    "overflow_flags",
    "probe_autocast_ops",
    "record_output_dtypes",
    "tail_relative_difference",
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

    @property
    def effect(self) -> str:
        """How autocast treated this call, judged from input vs output dtype.

        ``"cast to <dtype>"`` when the output dtype differs from the input's
        (autocast, or the layer itself, changed it); ``"pass-through"`` when
        they are equal (the layer ran in whatever dtype it received; a float32
        output then says nothing about autocast's float32 list); ``""`` when a
        dtype is missing (integer inputs such as token ids).
        """
        if not self.input_dtype or not self.output_dtype:
            return ""
        return "pass-through" if self.input_dtype == self.output_dtype else f"cast to {self.output_dtype}"


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

    Call it inside ``torch.amp.autocast(...)`` to see what autocast does on a
    real model. Judge each call by input vs output dtype
    (:attr:`DtypeRow.effect`): a float32 output from a float32 input is a
    pass-through, not proof that autocast keeps the layer in float32 (on a
    CPU, LayerNorm passes bf16 through). Which ops autocast upcasts differs per
    device type; see :func:`probe_autocast_ops`. The
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


def _probe_fns() -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    import torch.nn.functional as F

    return {
        "linear": lambda x: F.linear(x, torch.ones(x.shape[-1], x.shape[-1], device=x.device)),
        "layer_norm": lambda x: F.layer_norm(x, (x.shape[-1],)),
        "softmax": lambda x: torch.softmax(x, -1),
        "log_softmax": lambda x: F.log_softmax(x, -1),
        "sum": lambda x: x.sum(),
        "exp": lambda x: x.exp(),
        "mse_loss": lambda x: F.mse_loss(x, torch.zeros_like(x)),
        "cross_entropy": lambda x: F.cross_entropy(x, torch.zeros(x.shape[0], dtype=torch.long, device=x.device)),
    }


#: Operations :func:`probe_autocast_ops` runs, in report order.
PROBE_OPS: tuple[str, ...] = ("linear", "layer_norm", "softmax", "log_softmax", "sum", "exp", "mse_loss",
                              "cross_entropy")


def probe_autocast_ops(device: torch.device | str, dtype: torch.dtype,
                       ops: Iterable[str] = PROBE_OPS) -> dict[str, str]:
    """Run a few ops under autocast on a **low-precision input** and return their output dtypes.

    Autocast's op lists differ per device type (CUDA's float32 list is not the
    CPU's; https://docs.pytorch.org/docs/stable/amp.html#autocast-op-reference
    lists CUDA and CPU separately), and they are not exposed as a Python
    list. Probing them directly on the device is the reliable check: an op
    whose output is float32 although its input was ``dtype`` is on this
    device's float32 (upcast) list; an op whose output stays ``dtype`` runs in
    whatever it receives (pass-through); ``linear`` is the low-precision
    control. (On torch 2.13 CPU: ``mse_loss`` and ``cross_entropy`` upcast;
    ``layer_norm``, ``softmax``, ``log_softmax``, ``sum`` pass through.)

    Parameters
    ----------
    device : torch.device or str
        Where to run (its ``.type`` is the autocast device type).
    dtype : torch.dtype
        The autocast dtype, also the dtype of the probe input (4 x 8).
    ops : iterable of str
        Names from :data:`PROBE_OPS`.

    Returns
    -------
    dict of str to str
        Op name to output dtype name (e.g. ``"float32"``), in ``ops`` order.

    Raises
    ------
    ParameterError
        If an op name is unknown.
    """
    fns = _probe_fns()
    ops = list(ops)
    unknown = [o for o in ops if o not in fns]
    if unknown:
        raise ParameterError(f"unknown probe op(s) {unknown}; choose from {', '.join(PROBE_OPS)}.")
    device = torch.device(device)
    x = torch.randn(4, 8, device=device).to(dtype)
    out: dict[str, str] = {}
    with torch.no_grad(), torch.amp.autocast(device.type, dtype=dtype):
        for name in ops:
            out[name] = str(fns[name](x).dtype).replace("torch.", "")
    return out


def overflow_flags(scales: Iterable[float], init_scale: float) -> list[bool]:
    """Per-update overflow flags recovered from a GradScaler's scale history.

    ``GradScaler.update`` multiplies the scale by ``backoff_factor`` (< 1)
    after, and only after, an update whose gradients were not finite; growth
    multiplies it by ``growth_factor`` (> 1). So a drop of the scale marks an
    overflowed (skipped) update.

    Parameters
    ----------
    scales : iterable of float
        Scale after each update (:attr:`AmpStepper.scale_history`).
    init_scale : float
        Scale before the first update (> 0).

    Returns
    -------
    list of bool
        True where the scale dropped at that update; same length as ``scales``.

    Raises
    ------
    ParameterError
        If ``init_scale`` is not positive.
    """
    if not init_scale > 0:
        raise ParameterError(f"init_scale must be > 0, got {init_scale!r}; pass the scaler's initial scale.")
    flags, prev = [], float(init_scale)
    for s in scales:
        flags.append(float(s) < prev)
        prev = float(s)
    return flags


def tail_relative_difference(ref: Iterable[float], other: Iterable[float], tail: int) -> float:
    """Relative difference of the mean of the last ``tail`` values of two positive curves.

    Meant for a loss that stays positive (the PPO value loss, a mean squared
    error): a relative gate on a quantity that crosses zero (the total PPO
    loss) is meaningless near zero.

    Parameters
    ----------
    ref, other : iterable of float
        Reference (fp32) and compared curves, same length >= ``tail``.
    tail : int
        Number of final values averaged, >= 1.

    Returns
    -------
    float
        ``|mean(other_tail) - mean(ref_tail)| / mean(ref_tail)``.

    Raises
    ------
    ParameterError
        If lengths differ, ``tail`` is out of range, or the reference tail
        mean is not positive.
    """
    ref, other = [float(v) for v in ref], [float(v) for v in other]
    if len(ref) != len(other) or not 1 <= tail <= len(ref):
        raise ParameterError(f"need two curves of equal length >= tail; got {len(ref)}, {len(other)}, "
                             f"tail {tail}.")
    a, b = sum(ref[-tail:]) / tail, sum(other[-tail:]) / tail
    if not a > 0:
        raise ParameterError(f"reference tail mean is {a!r}, not positive; use a positive loss (value loss).")
    return abs(b - a) / a
