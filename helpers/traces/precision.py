"""What precision a trace's matrix work runs in, read from its kernel names and its operators' ``Input type``.

Mixed precision (notebook 06) is the first device-side lever only for a job whose matrix work is not already in
16-bit or lower precision; a trace says which it is in two places:

- the device kernels' names: cuBLAS, cuDNN and CUTLASS name the input type of their GEMM and convolution kernels
  (``sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_...``, ``ampere_fp16_s16816gemm_fp16_...``, ``volta_sgemm_128x64_nn``,
  ``volta_scudnn_128x64_relu_interior_nn_v1``, ``sm80_xmma_fprop_implicit_gemm_tf32f32_...``), as do the libraries
  built on them (``dpsk::grouped_gemm::cuda::fp8_...``); ROCm's Tensile kernels (rocBLAS, hipBLASLt) name it in
  their problem type, the fourth ``_`` field of ``Cijk_Ailk_Bljk_BBS_BH_...`` (its first letter the input type:
  B bf16, H half, S single, D double; F8/B8 fp8).
- the host operators' ``Input type`` (recorded with ``record_shapes=True``): the dtypes of ``aten::mm``,
  ``aten::addmm``, ``aten::bmm``, ``aten::_convolution``, ... (``c10::BFloat16``, ``c10::Half``, ``float``,
  ``c10::Float8_e4m3fn``). Only the operators that do the matrix work are counted, not the composite ones that
  call them (``aten::linear``, ``aten::matmul``, ``aten::conv2d``): under autocast the composite one is recorded
  twice, once with the float inputs before the cast and once after it.

A kernel is matrix work when its name says GEMM, convolution or attention (:func:`matrix_kind`); its time is the
device time of the trace's profiled steps (the readers' ``top_ops`` self time, all kernels).
"""

from __future__ import annotations

import re
from typing import Mapping

from helpers.bottleneck import ComputeMix

__all__ = ["LOW", "MATRIX_OPS", "compute_mix", "kernel_precision", "matrix_kind", "op_precision"]

#: Precisions of 16 bits or fewer: the ones mixed precision moves matrix work to.
LOW: frozenset[str] = frozenset({"fp8", "bf16", "fp16"})
#: The operators that do the matrix work (not the composite ones that call them): their ``Input type`` is counted.
MATRIX_OPS: frozenset[str] = frozenset({
    "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_mm", "aten::_convolution",
    "aten::convolution_backward", "aten::_scaled_dot_product_flash_attention",
    "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_cudnn_attention",
    "aten::_flash_attention_forward", "aten::_efficient_attention_forward"})
_CONV_OPS = frozenset({"aten::_convolution", "aten::convolution_backward"})

# Tokens in a lower-cased kernel name, lowest precision first (a mixed kernel, bf16 in and f32 accumulate, is the
# lower one: its inputs are). CUTLASS's s1688 tensor-op GEMM takes fp32 data and computes in TF32.
_TOKENS = (("fp8", re.compile(r"fp8|float8|e4m3|e5m2|f8f8|(?<![a-z0-9])f8(?![0-9])")),
           ("bf16", re.compile(r"bf16|bfloat")),
           ("fp16", re.compile(r"fp16|f16|half|h884|h1688|h16816|hgemm|hcudnn")),
           ("tf32", re.compile(r"tf32|xf32|tensorop_s1688gemm")),
           ("fp32", re.compile(r"sgemm|scudnn|fp32|f32|float")),
           ("fp64", re.compile(r"dgemm|fp64|f64|double")))
_TENSILE = re.compile(r"cijk_[a-z]+_[a-z]+_([a-z0-9]+)")
_TENSILE_TYPES = (("f8", "fp8"), ("b8", "fp8"), ("b", "bf16"), ("h", "fp16"), ("x", "tf32"), ("s", "fp32"),
                  ("d", "fp64"))
_CONV = re.compile(r"conv(?!ert)|fprop|dgrad|wgrad|winograd|scudnn|hcudnn|igemm_fwd|igemm_bwd|igemm_wrw")
_CUDNN_OTHER = ("bn_", "batchnorm", "pool", "softmax", "lrn", "op_tensor", "transpose", "reduce", "activation",
                "tonhwc", "tonchw", "2nhwc", "2nchw")
# fbgemm_gpu's kernels (embedding tables, permutes) are not GEMMs, though the library's name says so
_GEMM = re.compile(r"(?<!fb)gemm|gemv|cutlass|xmma|cijk_|matmul|wgmma|nvjet")
_ATTENTION = ("flash", "fmha", "attention", "attn")
_OP_TYPES = {"float": "fp32", "double": "fp64", "c10::half": "fp16", "c10::bfloat16": "bf16"}


def kernel_precision(name: str) -> str | None:
    """The input precision a kernel's name says: "fp8", "bf16", "fp16", "tf32", "fp32", "fp64", or None."""
    low = name.lower()
    t = _TENSILE.search(low)
    if t:
        for prefix, prec in _TENSILE_TYPES:
            if t.group(1).startswith(prefix):
                return prec
    for prec, rx in _TOKENS:
        if rx.search(low):
            return prec
    return None


def matrix_kind(name: str) -> str | None:
    """"conv", "gemm" or "attention" for a kernel whose name says it does that matrix work, else None."""
    low = name.lower()
    if any(w in low for w in _ATTENTION):  # before "conv": FlashAttnBwdPostprocessConvertdQ converts
        return "attention"
    if _CONV.search(low) or ("cudnn" in low and not any(w in low for w in _CUDNN_OTHER)):
        return "conv"
    if _GEMM.search(low):
        return "gemm"
    return None


def op_precision(input_types: str) -> str | None:
    """The precision of an operator from its ``Input type`` list as the trace's JSON text holds it (e.g.
    ``'"c10::BFloat16", "c10::BFloat16", ""'``): its first floating-point input's; None where it has none."""
    for t in re.findall(r'"([^"]*)"', input_types):
        low = t.lower()
        if low.startswith("c10::float8"):
            return "fp8"
        if low in _OP_TYPES:
            return _OP_TYPES[low]
    return None


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def compute_mix(kernel_ns: Mapping[str, float], op_counts: Mapping[tuple[str, str], int]) -> ComputeMix | None:
    """The :class:`~helpers.bottleneck.ComputeMix` of a trace.

    Parameters
    ----------
    kernel_ns : mapping of str to float
        Device time of each kernel name over the profiled steps (any unit: only shares are taken).
    op_counts : mapping of (str, str) to int
        Calls of each (operator of :data:`MATRIX_OPS`, precision of :func:`op_precision`).

    Returns
    -------
    ComputeMix or None
        None where the trace has neither a matrix kernel nor a matrix operator with a float ``Input type``.
    """
    by_prec: dict[str, float] = {}
    matrix = conv = 0.0
    for name, ns in kernel_ns.items():
        kind = matrix_kind(name)
        if kind is None or ns <= 0:
            continue
        matrix += ns
        conv += ns if kind == "conv" else 0.0
        prec = kernel_precision(name)
        if prec is not None:
            by_prec[prec] = by_prec.get(prec, 0.0) + ns
    ops: dict[str, int] = {}
    conv_ops = 0
    for (name, prec), n in op_counts.items():
        ops[prec] = ops.get(prec, 0) + n
        conv_ops += n if name in _CONV_OPS else 0
    n_ops = sum(ops.values())
    if not matrix and not n_ops:
        return None
    known = sum(by_prec.values())
    low = sum(v for p, v in by_prec.items() if p in LOW) / known if known else None
    ops_low = sum(n for p, n in ops.items() if p in LOW)
    dtype = max(by_prec, key=by_prec.get) if by_prec else (max(ops, key=ops.get) if ops else "")
    parts = []
    if known:
        names = sorted((p for p in by_prec if p in LOW) if low else by_prec, key=by_prec.get, reverse=True)
        share = low if low else 1.0
        said = "" if known >= 0.95 * matrix else f", of the {_pct(known / matrix)} whose names say a precision"
        parts.append(f"{'/'.join(names)} on {_pct(share)} of the matrix kernels' time (kernel names{said})")
    if n_ops:
        shown = sorted((p for p in ops if p in LOW) if ops_low else ops, key=ops.get, reverse=True)
        parts.append(f"{'/'.join(shown)} on {ops_low if ops_low else n_ops:,} of {n_ops:,} matrix operators "
                     "(Input type)")
    conv_share = conv / matrix if matrix else (0.0 if n_ops and not conv_ops else None)
    return ComputeMix(low=low, dtype=dtype, conv=conv_share, ops_low=ops_low, ops=n_ops, text=", ".join(parts))
