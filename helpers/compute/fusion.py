"""Operator fusion: fused attention and ``torch.compile``.

* :func:`manual_attention` is attention written out (matmul, softmax,
  matmul: three kernels and a materialised ``(B, H, L, L)`` score tensor);
  :func:`fused_attention` calls
  :func:`torch.nn.functional.scaled_dot_product_attention`, which picks a fused
  kernel where the backend has one. Both use the SDPA mask convention (boolean
  mask, True = attend).
* :func:`try_compile` wraps ``torch.compile`` so that the first call (tracing
  and code generation) is timed on its own and any failure (no C compiler,
  unsupported backend) is returned as a :class:`CompileResult` instead of
  raised.

On Ascend NPU the fused operators are ``torch_npu.npu_fusion_attention`` and
``torch_npu.optim.NpuFusedAdamW`` (docs/ascend_api_factcheck.md); they are not
called here.

Nothing is done at import time.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

from helpers.errors import ParameterError
from helpers.timing import PhaseTimer

logger = logging.getLogger(__name__)

__all__ = [
    "attention_inputs",
    "manual_attention",
    "fused_attention",
    "CompileResult",
    "try_compile",
]


def attention_inputs(
    batch: int,
    heads: int,
    seq_len: int,
    head_dim: int,
    *,
    pad_fraction: float = 0.0,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Random query, key, value and an optional key-padding mask.

    Parameters
    ----------
    batch, heads, seq_len, head_dim : int
        Shape ``(B, H, L, Dh)`` of q, k and v (each >= 1).
    pad_fraction : float, default 0.0
        Share of the last key positions of every other sample marked as
        padding, in ``[0, 1)``; 0 gives no mask (None). At least one key per
        row is always kept.
    device : torch.device or str
    dtype : torch.dtype
    seed : int
        Seed of a private ``torch.Generator`` (the global one is not touched).

    Returns
    -------
    (q, k, v, mask)
        q, k, v: ``(B, H, L, Dh)``, standard normal. mask: bool ``(B, 1, 1, L)``,
        True = attend, or None.

    Raises
    ------
    ParameterError
        Non-positive sizes or ``pad_fraction`` outside ``[0, 1)``.
    """
    for name, value in (("batch", batch), ("heads", heads), ("seq_len", seq_len), ("head_dim", head_dim)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ParameterError(f"{name}={value!r}; expected an integer >= 1.")
    if not 0.0 <= pad_fraction < 1.0:
        raise ParameterError(f"pad_fraction={pad_fraction!r}; expected a float in [0, 1).")
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, seq_len, head_dim, generator=gen, dtype=torch.float32)
               .to(device=device, dtype=dtype) for _ in range(3))
    mask = None
    if pad_fraction > 0.0:
        n_pad = min(seq_len - 1, int(round(pad_fraction * seq_len)))
        keep = torch.ones(batch, 1, 1, seq_len, dtype=torch.bool)
        if n_pad:
            keep[1::2, ..., seq_len - n_pad:] = False
        mask = keep.to(device)
    return q, k, v, mask


def manual_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     attn_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Attention written out: ``softmax(q k^T / sqrt(Dh) + mask) v``.

    Parameters
    ----------
    q, k, v : torch.Tensor
        ``(..., L, Dh)``, ``(..., S, Dh)``, ``(..., S, Dv)``.
    attn_mask : torch.Tensor or None
        Boolean, broadcastable to ``(..., L, S)``, True = attend (the SDPA
        convention); masked scores are set to ``-inf`` before the softmax.

    Returns
    -------
    torch.Tensor
        ``(..., L, Dv)``, same values as
        ``F.scaled_dot_product_attention(q, k, v, attn_mask)`` within float rounding.
    """
    scores = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(q.shape[-1]))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def fused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    attn_mask: torch.Tensor | None = None) -> torch.Tensor:
    """``torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask)`` (no dropout, not causal).

    Parameters and return value as :func:`manual_attention`.
    """
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)


@dataclass(frozen=True)
class CompileResult:
    """Outcome of :func:`try_compile`.

    Attributes
    ----------
    ok : bool
        True when compilation and the first call succeeded.
    compiled : callable or None
        The compiled callable (None on failure).
    first_call_s : float or None
        Seconds of the first call, which includes tracing and code generation
        (one phase of :class:`helpers.timing.PhaseTimer`, synchronised before and after).
    first_output : Any
        What the first call returned (None on failure).
    error : str
        ``"ExceptionType: message"`` (first line, at most 300 characters) on
        failure, else "".
    """

    ok: bool
    compiled: Callable[..., Any] | None
    first_call_s: float | None
    first_output: Any = None
    error: str = ""


def try_compile(
    fn: Callable[..., Any],
    call: Callable[[Callable[..., Any]], Any],
    *,
    sync: Callable[[], None] | None = None,
    compiler: Callable[..., Any] | None = None,
    **compile_kwargs: Any,
) -> CompileResult:
    """Compile ``fn`` and run it once, timing that first call; never raises on a compile failure.

    ``torch.compile`` is lazy: the work (graph capture, Inductor code generation,
    a C++ compiler run on CPU) happens on the first call, which is therefore
    timed separately from steady-state calls.

    Parameters
    ----------
    fn : callable
        A model or function.
    call : callable
        ``call(compiled) -> output``: runs the compiled object once (e.g.
        forward and backward of a batch).
    sync : callable or None
        Device synchronisation for the timing.
    compiler : callable or None
        Replaces ``torch.compile`` (for tests); called as ``compiler(fn, **compile_kwargs)``.
    **compile_kwargs
        Passed to the compiler (e.g. ``mode="default"``).

    Returns
    -------
    CompileResult
        ``ok=False`` with the error text when compiling or the first call failed.
    """

    compile_fn = torch.compile if compiler is None else compiler
    timer = PhaseTimer(sync=sync)
    try:
        compiled = compile_fn(fn, **compile_kwargs)
        with timer.phase("compile + first call"):
            out = call(compiled)
        timer.end_step()
    except Exception as exc:  # noqa: BLE001 - any compile failure is reported, not raised
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        text = f"{type(exc).__name__}: {first_line}"[:300]
        logger.warning("torch.compile failed: %s", text)
        return CompileResult(ok=False, compiled=None, first_call_s=None, error=text)
    first_s = float(timer.frame()["duration_s"].sum())
    return CompileResult(ok=True, compiled=compiled, first_call_s=first_s, first_output=out)
