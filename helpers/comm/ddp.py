"""DistributedDataParallel mechanics: compression hooks, the buckets DDP made, overlap arithmetic, gradient error.

Notebook 08's DDP experiment (the variants on the built-in job, timed
interleaved inside a process group) is :mod:`helpers.experiments.collectives`;
the comparisons that judge its rows are here.

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
- :func:`bucket_comparison` / :func:`hook_comparison`: whether a bucket layout or a compression hook was
  measurably faster than the others, judged against the noise of the measurement.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

import numpy as np

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


def bucket_comparison(buckets: Sequence[Mapping[str, Any]], backward_passes: int = 1) -> dict[str, Any]:
    """Group the bucket-sweep rows by the bucket layout DDP made and decide whether any layout was measurably faster.

    Caps that produced the same buckets ran the same computation and communication, so the spread of
    their medians is the noise of the measurement. Two layouts differ measurably only when their quartile
    ranges do not overlap and their medians lie further apart than that noise.

    Parameters
    ----------
    buckets : sequence of dict
        :func:`helpers.experiments.collectives.run_ddp`'s ``buckets`` rows (``cap_mb``, ``bucket_sizes``, ``n_buckets``, ``time_s``,
        ``time_p25_s``, ``time_p75_s``; seconds).
    backward_passes : int
        Backward passes (so allreduce rounds) per step, for the per-bucket cost (the PPO step's ``ppo_epochs``).

    Returns
    -------
    dict
        ``groups`` (rows: ``caps``, ``bucket_sizes``, ``n_buckets``, ``time_s`` (median of the member medians),
        ``time_p25_s`` (lowest member p25), ``time_p75_s`` (highest p75), ``spread_s`` (max - min of the member
        medians)); ``noise_s`` (largest spread of a group with >= 2 caps, None without one); ``measurable``
        (the fewest- and most-bucket layouts differ measurably); ``per_bucket_s`` (seconds per extra bucket per
        backward pass, only when measurable, else None); ``best`` (the caps of the fastest layout when it is
        measurably faster than every other layout, else "none measurable"); ``note`` (a sentence).
    """
    if not buckets:
        raise ParameterError("bucket_comparison() needs at least one bucket row.")
    by_layout: dict[tuple, list] = {}
    for b in buckets:
        by_layout.setdefault(tuple(b["bucket_sizes"]), []).append(b)
    groups = []
    for layout, rows in by_layout.items():
        med = [r["time_s"] for r in rows]
        groups.append({"caps": [r["cap_mb"] for r in rows], "bucket_sizes": list(layout), "n_buckets": len(layout),
                       "time_s": float(np.median(med)), "time_p25_s": min(r["time_p25_s"] for r in rows),
                       "time_p75_s": max(r["time_p75_s"] for r in rows), "spread_s": max(med) - min(med)})
    groups.sort(key=lambda g: g["n_buckets"])
    spreads = [g["spread_s"] for g in groups if len(g["caps"]) > 1]
    noise = max(spreads) if spreads else None
    few, many = groups[0], groups[-1]
    per_bucket = None
    noise_txt = (f"caps with the same buckets differ by up to {noise * 1e3:.1f} ms (noise)" if noise is not None
                 else "no two caps made the same buckets, so the noise is only judged by the quartile ranges")
    if len(groups) == 1:
        measurable = False
        note = f"every cap made the same {few['n_buckets']} bucket(s); {noise_txt}"
    else:
        measurable = _differs(few, many, noise)
        caps_txt = lambda g: "/".join(f"{c:g}" for c in g["caps"])  # noqa: E731
        if measurable:
            per_bucket = (many["time_s"] - few["time_s"]) / ((many["n_buckets"] - few["n_buckets"]) * backward_passes)
            note = (f"{many['n_buckets']} buckets (cap {caps_txt(many)}) {many['time_s'] * 1e3:.1f} ms vs "
                    f"{few['n_buckets']} (cap {caps_txt(few)}) {few['time_s'] * 1e3:.1f} ms per step: "
                    f"{per_bucket * 1e3:+.2f} ms per extra bucket per backward pass; {noise_txt}")
        else:
            note = (f"no measurable difference: {many['n_buckets']} buckets (cap {caps_txt(many)}) "
                    f"{many['time_s'] * 1e3:.1f} ms [{many['time_p25_s'] * 1e3:.1f}-{many['time_p75_s'] * 1e3:.1f}] "
                    f"vs {few['n_buckets']} (cap {caps_txt(few)}) {few['time_s'] * 1e3:.1f} ms "
                    f"[{few['time_p25_s'] * 1e3:.1f}-{few['time_p75_s'] * 1e3:.1f}] per step (median "
                    f"[25th-75th percentile]); {noise_txt}")
    fastest = min(groups, key=lambda g: g["time_s"])
    best: Any = "none measurable"
    if len(groups) > 1 and all(_differs(fastest, g, noise) for g in groups if g is not fastest):
        best = fastest["caps"]
    return {"groups": groups, "noise_s": noise, "measurable": measurable, "per_bucket_s": per_bucket,
            "best": best, "note": note}


def hook_comparison(hooks: Sequence[Mapping[str, Any]], noise_s: float | None = None) -> dict[str, Any]:
    """Whether a compression hook made the step measurably faster than plain allreduce ("none").

    Parameters
    ----------
    hooks : sequence of dict
        :func:`helpers.experiments.collectives.run_ddp`'s ``hooks`` rows (``hook``, ``time_s``, ``time_p25_s``, ``time_p75_s``, ``rel_err``).
    noise_s : float or None
        Noise level in seconds (e.g. :func:`bucket_comparison`'s ``noise_s``); medians closer than this do not
        count as different.

    Returns
    -------
    dict
        ``best`` (the hook name when it is measurably faster than "none", else "none measurable"),
        ``faster`` / ``slower`` (lists of hooks measurably faster / slower than "none"), ``candidate`` (the
        fastest compressed row or None), ``base`` (the "none" row or None), ``note`` (a sentence).
    """
    rows = {h["hook"]: h for h in hooks}
    base = rows.get("none")
    comp = [h for k, h in rows.items() if k != "none"]
    if base is None or not comp:
        return {"best": "none measurable", "faster": [], "slower": [], "candidate": None, "base": base,
                "note": "no compression hook and plain allreduce both measured"}
    faster = [h["hook"] for h in comp if _differs(h, base, noise_s) and h["time_s"] < base["time_s"]]
    slower = [h["hook"] for h in comp if _differs(h, base, noise_s) and h["time_s"] > base["time_s"]]
    cand = min(comp, key=lambda h: h["time_s"])
    best = cand["hook"] if cand["hook"] in faster else "none measurable"
    ms = lambda h: f"{h['time_s'] * 1e3:.1f} ms [{h['time_p25_s'] * 1e3:.1f}-{h['time_p75_s'] * 1e3:.1f}]"  # noqa: E731
    if best != "none measurable":
        note = f"{cand['hook']} measurably faster: {ms(cand)} vs plain allreduce {ms(base)}"
    elif cand["hook"] in slower:
        note = f"{cand['hook']} measurably slower: {ms(cand)} vs plain allreduce {ms(base)}"
    else:
        note = f"no measurable difference: {cand['hook']} {ms(cand)} vs plain allreduce {ms(base)}"
    return {"best": best, "faster": faster, "slower": slower, "candidate": cand, "base": base, "note": note}
