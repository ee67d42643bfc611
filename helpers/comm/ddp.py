"""DistributedDataParallel mechanics: compression hooks, the buckets DDP made, overlap arithmetic, gradient error.

Notebook 08's DDP experiment (the variants on the built-in job, timed
interleaved inside a process group, and the comparisons that judge them) is
:mod:`helpers.experiments.collectives`.

- :func:`hook_function`: DDP's own compression hooks by name (``fp16``, ``bf16``; ``none`` for plain allreduce).
- :func:`bucket_sizes`: the bucket sizes DDP actually made, read from
  ``DistributedDataParallel._get_ddp_logging_data()["rebuilt_bucket_sizes"]``
  (bytes, in DDP's bucket order; DDP rebuilds its buckets once, after the
  first iteration, in the order the gradients became ready; a bucket closes
  when it reaches ``bucket_cap_mb``, ``>=``, ``compute_bucket_assignment_by_size``
  in ``reducer.cpp``).
- :func:`hidden_fraction` / :func:`overlap_figures`: how much allreduce hides
  behind backward, ``1 - (t_ddp - t_nosync) / t_allreduce_alone``.
- :func:`grad_error`: DDP's averaged gradients against an fp32 reference.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

from helpers.errors import ParameterError

log = logging.getLogger(__name__)

HOOKS = ("none", "fp16", "bf16")
#: Bytes per gradient element sent by each hook (fp32 gradients; the
#: compress hooks cast to 16 bits before the allreduce, default_hooks.py).
HOOK_BYTES = {"none": 4, "fp16": 2, "bf16": 2}


def hook_function(name: str):
    """The DDP communication hook for ``name`` (None for "none").

    fp16 / bf16: ``torch.distributed.algorithms.ddp_comm_hooks.default_hooks``
    ``fp16_compress_hook`` / ``bf16_compress_hook``.
    """
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    if name not in HOOKS:
        raise ParameterError(f"compression hook {name!r} is not one of {', '.join(HOOKS)}.")
    return {"none": None, "fp16": default_hooks.fp16_compress_hook,
            "bf16": default_hooks.bf16_compress_hook}[name]


def bucket_sizes(ddp_model) -> list[int]:
    """Sizes in bytes of the gradient buckets ``ddp_model`` uses now (DDP's own logging data).

    DDP (torch 2.13, ``BucketCapacityConfig.compute_bucket_size_limits``)
    starts with all parameters in one bucket when ``find_unused_parameters``
    is off, then the reducer rebuilds the buckets after the first iteration in
    gradient-ready order and logs ``rebuilt_bucket_sizes``; before that only
    ``bucket_sizes`` (the initial buckets) exists. A bucket is closed as soon as
    it reaches the cap (``bucket.size >= limit`` in
    ``compute_bucket_assignment_by_size``, torch/csrc/distributed/c10d/
    reducer.cpp), so buckets are usually a little larger than ``bucket_cap_mb``.
    """
    data = ddp_model._get_ddp_logging_data()
    raw = str(data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes", ""))
    return [int(x) for x in raw.split(",") if x.strip()]


def hidden_fraction(t_ddp: float, t_nosync: float, t_allreduce: float) -> float:
    """Share of the allreduce time hidden behind computation, in [0, 1].

    ``1 - (t_ddp - t_nosync) / t_allreduce``: the exposed communication is
    what DDP adds to the step without communication; compared with the time
    the same allreduces take alone, the rest was overlapped with backward.
    """
    if t_allreduce <= 0:
        raise ParameterError(f"t_allreduce={t_allreduce} must be > 0.")
    return float(min(1.0, max(0.0, 1.0 - (t_ddp - t_nosync) / t_allreduce)))


def overlap_figures(t_ddp: float, t_nosync: float, t_allreduce: float,
                    n_buckets: int | None = None) -> dict[str, Any]:
    """The overlap figures of one cap, with a check that the three medians fit together.

    Parameters
    ----------
    t_ddp, t_nosync, t_allreduce : float
        Seconds: DDP step, the same step under ``no_sync()``, the step's
        allreduces alone.
    n_buckets : int or None
        Buckets DDP made at this cap. With 1, nothing can overlap by
        construction (the one allreduce starts when backward ends): the
        arithmetic is kept in ``raw_hidden_fraction`` but ``hidden_fraction``
        is None and the note says so. None: not known (judged from the times).

    Returns
    -------
    dict
        ``exposed_s`` (t_ddp - t_nosync), ``raw_hidden_fraction`` (``1 -
        exposed / t_allreduce``, unclipped), ``consistent`` (0 <= exposed <=
        t_allreduce), ``hidden_fraction`` (the raw value when consistent; 0.0
        when DDP adds at least as much as the allreduces take alone: no
        measurable overlap; None when DDP was faster than no_sync, i.e. noise,
        or with a single bucket), ``single_bucket`` (n_buckets == 1: overlap
        not measurable by construction) and ``note`` (a sentence).
    """
    if t_allreduce <= 0:
        raise ParameterError(f"t_allreduce={t_allreduce} must be > 0.")
    exposed = t_ddp - t_nosync
    raw = 1.0 - exposed / t_allreduce
    ok = 0.0 <= exposed <= t_allreduce
    single = n_buckets == 1
    if single:
        hidden = None
        note = "every cap made a single bucket: overlap not measurable by construction"
    elif exposed >= t_allreduce:
        hidden = 0.0
        note = (f"no measurable overlap (hidden ~ 0; DDP adds {exposed * 1e3:.1f} ms >= "
                f"{t_allreduce * 1e3:.1f} ms the allreduces take alone)")
    elif exposed < 0:
        hidden = None
        note = (f"measurement inconsistent (noise): the DDP step was {-exposed * 1e3:.1f} ms faster than the same "
                "step without communication")
    else:
        hidden = raw
        note = f"{100 * raw:.0f}% of the allreduce time hidden behind computation"
    return {"exposed_s": exposed, "raw_hidden_fraction": raw, "consistent": ok,
            "hidden_fraction": hidden, "single_bucket": single, "note": note}


def iqr_overlap(a: Mapping[str, float], b: Mapping[str, float]) -> bool:
    """Whether the 25th-75th percentile ranges (``time_p25_s``..``time_p75_s``) of two rows overlap."""
    return a["time_p25_s"] <= b["time_p75_s"] and b["time_p25_s"] <= a["time_p75_s"]


def _differs(a: Mapping[str, float], b: Mapping[str, float], noise_s: float | None) -> bool:
    """Measurably different: the quartile ranges do not overlap and the medians lie more than the noise apart."""
    return (not iqr_overlap(a, b)) and abs(a["time_s"] - b["time_s"]) > (noise_s or 0.0)


def grad_error(got: "Any", ref: "Any") -> dict[str, float]:
    """Max absolute and relative (to max |ref|) error of flat gradient tensors ``got`` against ``ref``."""
    import torch

    d = (got.double() - ref.double()).abs()
    scale = float(ref.double().abs().max())
    m = float(d.max()) if d.numel() else 0.0
    return {"max_abs_err": m, "rel_err": m / scale if scale > 0 else 0.0,
            "mismatched": int(torch.count_nonzero(d).item())}
