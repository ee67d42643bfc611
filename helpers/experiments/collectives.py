"""Notebook 08's DDP experiment: buckets, compression hooks and overlap on a job, inside a process group.

:func:`run_ddp` runs inside a rank (launched as the task
``helpers.experiments.collectives:run_ddp`` of :mod:`helpers.comm.worker`);
:func:`ddp_benchmark` launches it from a process that holds no process group.

What is measured, per rank, on fixed real batches of the job (each rank draws
its own samples: the batch order of rank r is the epoch-r permutation of the
dataset):

- step time of one training step of the job (the built-in PPO step: rollout,
  GAE, ``ppo_epochs`` updates, each with a backward pass and therefore one
  gradient allreduce; a user's job: its own step, whose backward passes are
  counted) for each ``bucket_cap_mb`` and each compression hook; reported as
  the median (and quartiles) over steps of the max over ranks;
- the bucket sizes DDP actually made (:func:`helpers.comm.ddp.bucket_sizes`);
- gradient error of each hook: the averaged gradients DDP produced for one
  backward pass against an fp32 reference (the same local gradients, divided
  by the world size and summed with ``all_reduce`` in float32, which is what
  DDP's default ``allreduce_hook`` does);
- overlap, at the smallest cap of the sweep that gave more than one bucket
  (with a single bucket nothing can overlap: its allreduce starts when the
  backward pass ends): the same step under ``ddp.no_sync()`` (no
  communication) and the gradients' allreduce alone (flat float32 buffers of
  DDP's bucket sizes, ``ppo_epochs`` times); see
  :func:`helpers.comm.ddp.overlap_figures`.

All variants (caps, hooks, no_sync, allreduce alone) are timed interleaved in
one job: one step of each per round, the order reversed every other round
(ABBA), so that slow phases of a shared machine hit every variant alike.
:func:`bucket_comparison` and :func:`hook_comparison` then judge whether any
difference exceeds the noise (the spread between caps that made the same
buckets, and the quartile ranges).

:func:`check` (the notebook's first call, before any timing) resolves the backend (:func:`plan_backend`), checks
the environment (:func:`env_check`) and DDP's correctness on the job (:func:`run_ddp_check` in a short collective
job: every cap's buckets hold every gradient byte, plain DDP equals the fp32 reference); :func:`run` then runs the
allreduce sweep and :func:`run_ddp` on the job (:class:`DDPConfig`: the user's job or the built-in one, as a
:class:`helpers.jobs.load.JobRequest` every rank resolves) in one collective job (:func:`run_sweep_and_ddp`) and
returns one :class:`CollectivesResult` (which extends the checks' :class:`CollectivesChecks`): the text the cells
print, the records, the verdict and the "try it" panel.

The "try it" panel of notebook 08 calls :func:`try_allreduce`: the allreduce benchmark over a range of message
sizes and a world size, in a new job started by the same launcher, whose rank task :func:`run_allreduce_sweep`
times each size with :func:`helpers.comm.allreduce.run_allreduce` and hands it to the notebook as it finishes.
"""

from __future__ import annotations

import copy
import gc
import itertools
import json
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from helpers import specs
from helpers.checklist import Item
from helpers.comm.allreduce import MIB, algbw_gbps, bus_factor, busbw_gbps, message_sizes, run_allreduce
from helpers.comm.ddp import HOOK_BYTES, bucket_sizes, grad_error, hook_function, iqr_overlap, overlap_figures
from helpers.comm.launch import check_backend, check_world_size, resolve_backend, run_job
from helpers.compute.model import count_parameters
from helpers.device import get_accelerator
from helpers.errors import ParameterError
from helpers.experiments.base import Experiment, ExperimentResult, checked_fields
from helpers.experiments.training import fixed_batches
from helpers.fsutil import write_atomic
from helpers.jobs.load import JobRequest
from helpers.live import Knob, LivePoint, Progress, TrySpec, no_progress
from helpers.results import Records
from helpers.params import Param
from helpers.timing import timed_call
from helpers.units import format_bytes
from helpers.verdict import Action, Verdict


__all__ = ["BackendPlan", "CollectivesChecks", "CollectivesResult", "DDPConfig", "DDP_CHECK_TASK", "DDP_KEYS",
           "DDP_TASK", "EnvCheck", "MEASURE_TASK", "PROPOSED_ENV", "SWEEP_TASK", "bucket_comparison", "check", "ddp_benchmark",
           "ddp_in_launched_job", "env_check", "hccl_options_text", "hook_comparison", "live_point", "plan_backend",
           "run", "run_allreduce_sweep", "run_ddp", "run_ddp_check", "run_sweep_and_ddp", "try_allreduce", "verdict"]

#: The rank task of :func:`run_ddp`, as :func:`helpers.comm.launch.run_job` names it.
DDP_TASK = "helpers.experiments.collectives:run_ddp"


def _differs(a: Mapping[str, float], b: Mapping[str, float], noise_s: float | None) -> bool:
    """Measurably different: the quartile ranges do not overlap and the medians lie more than the noise apart."""
    return (not iqr_overlap(a, b)) and abs(a["time_s"] - b["time_s"]) > (noise_s or 0.0)


def bucket_comparison(buckets: Sequence[Mapping[str, Any]], backward_passes: int = 1) -> dict[str, Any]:
    """Group the bucket-sweep rows by the bucket layout DDP made and decide whether any layout was measurably faster.

    Caps that produced the same buckets ran the same computation and communication, so the spread of
    their medians is the noise of the measurement. Two layouts differ measurably only when their quartile
    ranges do not overlap and their medians lie further apart than that noise.

    Parameters
    ----------
    buckets : sequence of dict
        :func:`run_ddp`'s ``buckets`` rows (``cap_mb``, ``bucket_sizes``, ``n_buckets``, ``time_s``,
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
        :func:`run_ddp`'s ``hooks`` rows (``hook``, ``time_s``, ``time_p25_s``, ``time_p75_s``, ``rel_err``).
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


def _stats(times_by_rank: Sequence[Sequence[float]]) -> dict[str, float]:
    t = np.asarray(times_by_rank, dtype=float).max(axis=0)
    return {"time_s": float(np.median(t)), "time_p25_s": float(np.percentile(t, 25)),
            "time_p75_s": float(np.percentile(t, 75))}


def _flat_grads(model):
    grads = [p.grad.reshape(-1).float() for p in model.parameters() if p.grad is not None]
    return torch.cat(grads) if grads else torch.zeros(0)


def _backward_gradients(job, model, acc, batch, module=None):
    """The gradients one backward pass of ``job`` leaves in ``module`` (default ``model``), flat fp32.

    The built-in job: its :meth:`~helpers.jobs.base.Job.gradient_loss` on the batch (its step does several updates). Any other job: one
    call of its own step, whose gradients stay in the parameters after the optimizer step (a step that
    clears them at its end leaves none: then the result is empty).
    """
    module = module if module is not None else model
    loss = job.gradient_loss(model, batch)
    if loss is not None:
        loss.backward()
    else:
        job.make_step(model, acc)(batch)
    return _flat_grads(module)


def _count_backward_passes(model, step) -> int:
    """Backward passes one call of ``step`` makes: gradient hooks on the first trainable parameter, counted."""
    param = next((p for p in model.parameters() if p.requires_grad), None)
    if param is None:
        return 1
    calls: list[int] = []
    handle = param.register_hook(lambda g: calls.append(1))
    try:
        step()
    finally:
        handle.remove()
    return max(1, len(calls))


@dataclass(frozen=True)
class DDPConfig:
    """What each DDP rank runs (:func:`run_ddp`): the job and the variants, as JSON-able fields.

    Attributes
    ----------
    job : helpers.jobs.load.JobRequest
        The user's job (every rank loads it) or the built-in PPO job.
    steps : int
        Timed steps per variant (>= 1).
    warmup_steps : int
        Untimed steps per variant (>= 0; the cap models get at least 2: DDP rebuilds its buckets after the first).
    bucket_cap_mb_list : tuple of float
        The ``bucket_cap_mb`` values swept.
    compression_hooks : tuple of str
        The hooks compared (``"none"``, ``"fp16"``, ``"bf16"``).
    """

    job: JobRequest
    steps: int
    warmup_steps: int
    bucket_cap_mb_list: tuple
    compression_hooks: tuple

    def __post_init__(self) -> None:
        for h in self.compression_hooks:
            hook_function(h)  # an unknown hook fails here, before any rank builds a model
        if not self.bucket_cap_mb_list:
            raise ParameterError("bucket_cap_mb_list is empty: give at least one bucket_cap_mb")

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> "DDPConfig":
        """The config of notebook 08's parameters (:data:`DDP_KEYS`, and ``job`` / ``factory_defaults``).

        Raises
        ------
        ParameterError
            A key of :data:`DDP_KEYS` is missing.
        """
        missing = [k for k in DDP_KEYS if k not in params]
        if missing:
            raise ParameterError(f"the DDP experiment needs {', '.join(missing)} in params; pass notebook 08's "
                                 "parameters.")
        return cls(job=JobRequest.from_params(params), steps=int(params["steps"]),
                   warmup_steps=int(params["warmup_steps"]),
                   bucket_cap_mb_list=tuple(float(c) for c in params["bucket_cap_mb_list"]),
                   compression_hooks=tuple(params["compression_hooks"]))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "DDPConfig":
        """The config back from :meth:`as_dict` (the rank's JSON)."""
        return cls(job=JobRequest.from_dict(data["job"]), steps=int(data["steps"]),
                   warmup_steps=int(data["warmup_steps"]),
                   bucket_cap_mb_list=tuple(float(c) for c in data["bucket_cap_mb_list"]),
                   compression_hooks=tuple(data["compression_hooks"]))

    def as_dict(self) -> dict[str, Any]:
        """JSON-able fields (what :func:`helpers.comm.launch.run_job` hands each rank)."""
        return {"job": self.job.as_dict(), "steps": self.steps, "warmup_steps": self.warmup_steps,
                "bucket_cap_mb_list": list(self.bucket_cap_mb_list),
                "compression_hooks": list(self.compression_hooks)}


#: bf16 under gloo: DDP's own check (torch/nn/parallel/distributed.py, _check_comm_hook) accepts the bf16 hook only
#: with CUDA + NCCL >= 2.10 or XPU + XCCL; asked before building a DDP model that would be torn down half-made.
_BF16_GLOO = ("TypeError: BF16 all reduce communication hook required CUDA 11+ and NCCL 2.10+ or XPU and XCCL (DDP's "
              "check; not available with gloo)")


class _Rank:
    """One rank's DDP experiment (:func:`run_ddp`): the job, its fixed batches and the DDP models of the variants."""

    def __init__(self, cfg: DDPConfig, rc) -> None:
        self.cfg, self.rc = cfg, rc
        self.acc = get_accelerator(rc.device.type, index=rc.device.index or 0)
        self.job = cfg.job.job()
        self.batches = fixed_batches(self.job, self.acc, 2, epoch=rc.rank)  # rank r: the epoch-r order
        self.n_samples = self.job.item_count()
        self.base = self.job.make_model(self.acc)
        self.base_state = copy.deepcopy(self.base.state_dict())
        self.grad_bytes = sum(p.numel() * 4 for p in self.base.parameters() if p.requires_grad)
        caps = list(cfg.bucket_cap_mb_list)
        self.default_cap = 25.0 if 25.0 in caps else caps[-1]
        self.passes = self.job.backward_passes  # None: a user's step, counted on its last warm-up step

    def fresh(self, cap: float, hook: str = "none"):
        """A DDP model with the base weights, ``bucket_cap_mb=cap`` and the compression ``hook``."""
        m = self.job.make_model(self.acc)
        m.load_state_dict(self.base_state)
        d = DDP(m, bucket_cap_mb=cap, broadcast_buffers=False)
        fn = hook_function(hook)
        if fn is not None:
            d.register_comm_hook(state=None, hook=fn)
        return d

    def stepper(self, ddp, *, no_sync: bool = False):
        """One training step of the job on ``ddp``, cycling through the rank's batches (``no_sync``: no
        communication)."""
        if self.job.is_builtin:  # its actions are sampled: each rank its own stream
            gen = torch.Generator(device=self.rc.device).manual_seed(self.job.workload.seed + self.rc.rank)
            train_step = self.job.make_step(ddp, self.acc, generator=gen)
        else:
            train_step = self.job.make_step(ddp, self.acc)
        it = itertools.cycle(self.batches)

        def step():
            if no_sync:
                with ddp.no_sync():
                    train_step(next(it))
            else:
                train_step(next(it))
        return step

    def warm(self, fn, n: int) -> None:
        for _ in range(n):
            fn()

    def variants(self) -> tuple[list[tuple[str, Any]], dict[float, Any], dict[str, str], float, list[int]]:
        """Every variant built and warmed up: the caps, the hooks (at the default cap), no_sync and the allreduce
        alone (on DDP's buckets at the overlap cap). Returns (variants, cap models, unsupported hooks, overlap
        cap, its bucket sizes)."""
        n_warm, models, variants = self.cfg.warmup_steps, {}, []
        for cap in self.cfg.bucket_cap_mb_list:
            d = self.fresh(cap)
            fn = self.stepper(d)
            self.warm(fn, max(2, n_warm) - (self.passes is None))
            if self.passes is None:
                self.passes = _count_backward_passes(d, fn)
            models[cap] = d
            variants.append((f"cap:{cap}", fn))
        # overlap needs several buckets: the smallest cap that made more than one (else the default cap)
        multi = sorted(c for c in self.cfg.bucket_cap_mb_list if len(bucket_sizes(models[c])) > 1)
        overlap_cap = multi[0] if multi else self.default_cap
        unsupported: dict[str, str] = {}
        for h in self.cfg.compression_hooks:
            if h == "none":
                continue
            if h == "bf16" and self.rc.backend == "gloo":
                unsupported[h] = _BF16_GLOO
                continue
            try:
                fn = self.stepper(self.fresh(self.default_cap, h))
                self.warm(fn, n_warm)
            except (TypeError, RuntimeError) as exc:  # e.g. bf16 hook: "required CUDA 11+ and NCCL 2.10+"
                unsupported[h] = f"{type(exc).__name__}: {exc}"
                continue
            variants.append((f"hook:{h}", fn))
        # overlap: the same step without communication (a model of its own, so the DDP model's ranks stay in
        # step), and the allreduce alone on DDP's buckets
        fn = self.stepper(self.fresh(overlap_cap), no_sync=True)
        self.warm(fn, n_warm)
        variants.append(("nosync", fn))
        sizes = bucket_sizes(models[overlap_cap]) or [self.grad_bytes]
        bufs = [torch.zeros(max(1, s // 4), dtype=torch.float32, device=self.rc.device) for s in sizes]

        def allreduce_alone():
            for _ in range(self.passes):
                for t in bufs:
                    dist.all_reduce(t)

        self.warm(allreduce_alone, n_warm)
        variants.append(("ar", allreduce_alone))
        return variants, models, unsupported, overlap_cap, sizes

    def reference(self) -> tuple[Any, str]:
        """The fp32 reference of the averaged gradients (the local gradients over the world size, summed in float32
        with ``all_reduce``; a collective: every rank calls it) and how the gradients were taken. The reference is
        None when the job's step leaves no gradients (the text then says so)."""
        plain = self.job.make_model(self.acc)
        plain.load_state_dict(self.base_state)
        plain.train()
        ref = _backward_gradients(self.job, plain, self.acc, self.batches[0]) / self.rc.world_size
        dist.all_reduce(ref)
        if ref.numel() == 0:
            return None, ("not measured: the job's step leaves no gradients in the parameters after it returns "
                          "(zero_grad at its end?), so there is nothing to compare")
        return ref, ("one PPO loss's backward pass on the rank's first batch" if self.job.is_builtin else
                     "one call of the job's own step on the rank's first batch (the gradients it leaves in the "
                     "parameters; a step that clips them before the optimizer clips local and averaged gradients "
                     "differently, so even plain DDP then differs from the reference)")

    def hook_error(self, hook: str, ref: Any) -> dict[str, float]:
        """:func:`helpers.comm.ddp.grad_error` of the gradients DDP averaged with ``hook`` (at the default cap, on
        the rank's first batch) against the reference ``ref`` (:meth:`reference`)."""
        d = self.fresh(self.default_cap, hook)
        d.train()
        return grad_error(_backward_gradients(self.job, d, self.acc, self.batches[0], module=d.module), ref)

    def grad_errors(self, unsupported: Mapping[str, str]) -> tuple[dict[str, Any], str]:
        """Each supported hook's averaged gradients against the fp32 reference (:meth:`hook_error`), and how the
        gradients were taken."""
        ref, grad_check = self.reference()
        if ref is None:
            return {}, grad_check
        return {h: self.hook_error(h, ref) for h in self.cfg.compression_hooks if h not in unsupported}, grad_check


def _time_interleaved(variants: Sequence[tuple[str, Any]], steps: int, sync) -> dict[str, list[float]]:
    """Every variant timed interleaved, one step each per round, the order reversed every other round (ABBA), so
    that a slow phase of the machine hits every variant alike."""
    times: dict[str, list[float]] = {name: [] for name, _ in variants}
    for r in range(steps):
        for name, fn in (variants if r % 2 == 0 else variants[::-1]):
            times[name].append(timed_call(fn, sync, time.perf_counter))
    return times


def run_ddp(cfg: "DDPConfig | Mapping[str, Any]", rc) -> dict[str, Any] | None:
    """The DDP experiments on this rank (inside an initialized default process group); rank 0 returns the result.

    Parameters
    ----------
    cfg : DDPConfig or mapping
        The config, or its :meth:`DDPConfig.as_dict` (what the launcher hands the rank).
    rc : helpers.comm.rank.RankContext

    Returns
    -------
    dict or None
        ``buckets`` (rows: cap_mb, bucket_sizes, n_buckets, step time stats),
        ``hooks`` (rows: hook, bytes_per_step, step time stats, errors),
        ``overlap`` ({cap_mb, n_buckets, t_ddp_s, t_nosync_s, t_allreduce_s}
        and the keys of :func:`overlap_figures`; hidden_fraction is None when
        the measurement is inconsistent or there is a single bucket), hook rows carry ``cap_mb`` (the
        default cap, 25 when swept),
        ``grad_bytes``, ``params``, ``world_size``, ``batch_per_rank``, ``backward_passes`` (per step: the
        PPO step's ``ppo_epochs``; a user's step's, counted), ``job`` (its name), ``samples`` (in its data).
        A user's job's gradient errors come from one call of its own step (see :func:`_backward_gradients`);
        ``grad_check`` says how they were taken.
    """
    cfg = cfg if isinstance(cfg, DDPConfig) else DDPConfig.from_dict(cfg)
    rank = _Rank(cfg, rc)
    variants, models, unsupported, overlap_cap, sizes = rank.variants()
    times = _time_interleaved(variants, cfg.steps, rc.sync)
    caps = list(cfg.bucket_cap_mb_list)
    layouts = [(bucket_sizes(models[c]), int(models[c]._get_ddp_logging_data().get("has_rebuilt_buckets", 0)))
               for c in caps]
    hooks = [h for h in cfg.compression_hooks if h == "none" or f"hook:{h}" in times]
    hook_times = [times[f"cap:{rank.default_cap}"] if h == "none" else times[f"hook:{h}"] for h in hooks]
    del models, variants
    errors, grad_check = rank.grad_errors(unsupported)
    gathered: list = [None] * rc.world_size
    dist.all_gather_object(gathered, {"buckets": [times[f"cap:{c}"] for c in caps], "hooks": hook_times,
                                      "nosync": times["nosync"], "ar": times["ar"], "errors": errors})
    # release every DDP model (and its reducer) while the process group is alive: a reducer torn down after
    # destroy_process_group() can abort the rank at exit ("terminate called without an active exception")
    gc.collect()
    dist.barrier()
    if rc.rank != 0:
        return None
    return _summary(rank, gathered, caps=caps, layouts=layouts, hooks=hooks, unsupported=unsupported,
                    overlap_cap=overlap_cap, sizes=sizes, grad_check=grad_check)


def _summary(rank: _Rank, gathered: Sequence[Mapping[str, Any]], *, caps: list, layouts: list, hooks: list,
             unsupported: Mapping[str, str], overlap_cap: float, sizes: list, grad_check: str) -> dict[str, Any]:
    """Rank 0's result of :func:`run_ddp` from every rank's times and errors (the slowest rank's per step)."""
    buckets = [{"cap_mb": cap, "bucket_sizes": layout, "n_buckets": len(layout), "rebuilt": rebuilt,
                **_stats([g["buckets"][i] for g in gathered])} for i, (cap, (layout, rebuilt)) in
               enumerate(zip(caps, layouts))]
    nan = float("nan")
    no_err = {"max_abs_err": nan, "rel_err": nan, "mismatched": nan}
    hook_rows = []
    for i, h in enumerate(hooks):
        errs = [g["errors"].get(h, no_err) for g in gathered]
        hook_rows.append({"hook": h, "cap_mb": rank.default_cap,
                          "bytes_per_step": rank.grad_bytes // 4 * HOOK_BYTES[h] * rank.passes,
                          **_stats([g["hooks"][i] for g in gathered]),
                          "max_abs_err": max(e["max_abs_err"] for e in errs),
                          "rel_err": max(e["rel_err"] for e in errs),
                          "mismatched": max(e["mismatched"] for e in errs)})
    t_d = _stats([g["buckets"][caps.index(overlap_cap)] for g in gathered])["time_s"]
    t_n = _stats([g["nosync"] for g in gathered])["time_s"]
    t_a = _stats([g["ar"] for g in gathered])["time_s"]
    job = rank.job
    return {"buckets": buckets, "hooks": hook_rows,
            "overlap": {"cap_mb": overlap_cap, "n_buckets": len(sizes), "steps": rank.cfg.steps, "t_ddp_s": t_d,
                        "t_nosync_s": t_n, "t_allreduce_s": t_a, **overlap_figures(t_d, t_n, t_a, len(sizes))},
            "unsupported_hooks": dict(unsupported), "grad_bytes": rank.grad_bytes,
            "params": count_parameters(rank.base), "world_size": rank.rc.world_size,
            "batch_per_rank": job.workload.batch_size, "backward_passes": rank.passes,
            "job": job.describe().get("job", job.name), "builtin": job.is_builtin, "samples": rank.n_samples,
            "grad_check": grad_check,
            "timing": ("median over steps of the max over ranks (each rank synced its device after every step); "
                       "all variants timed interleaved, one step each per round, the order reversed every other "
                       "round")}


def run_ddp_check(cfg: "DDPConfig | Mapping[str, Any]", rc) -> dict[str, Any] | None:
    """Notebook 08's DDP check before any timing, on this rank (inside an initialized default process group): each
    ``bucket_cap_mb``'s DDP model takes steps of the job until DDP has rebuilt its buckets (one step of the built-in
    job, whose PPO updates make several backward passes; two of a step with one backward pass), and plain
    DDP's averaged gradients are compared with the fp32 reference (:meth:`_Rank.reference`). Rank 0 returns the
    result; :func:`run_ddp` times the same variants afterwards, in a job of its own.

    Parameters
    ----------
    cfg : DDPConfig or mapping
        The config, or its :meth:`DDPConfig.as_dict` (what the launcher hands the rank).
    rc : helpers.comm.rank.RankContext

    Returns
    -------
    dict or None
        On rank 0: ``bucket_sizes`` (per cap, in the order of ``bucket_cap_mb_list``, the bytes of each bucket DDP
        made on rank 0), ``grad_bytes`` (fp32 gradient bytes), ``in_buckets`` (True when, on every rank and under
        every cap, the buckets hold exactly ``grad_bytes``), ``plain`` (:func:`helpers.comm.ddp.grad_error` of plain
        DDP, the largest over the ranks; None when the step leaves no gradients), ``grad_check`` (how the
        gradients were taken), ``job`` and ``world_size``; None on the other ranks.
    """
    cfg = cfg if isinstance(cfg, DDPConfig) else DDPConfig.from_dict(cfg)
    rank = _Rank(cfg, rc)
    layouts = []
    for cap in cfg.bucket_cap_mb_list:
        d = rank.fresh(cap)
        step = rank.stepper(d)
        step()  # the first backward pass uses one bucket; DDP rebuilds them in the next forward
        if not d._get_ddp_logging_data().get("has_rebuilt_buckets", 0):  # one backward pass per step: a second
            step()
        layouts.append(bucket_sizes(d))
        del d
    ref, grad_check = rank.reference()
    plain = rank.hook_error("none", ref) if ref is not None else None
    gathered: list = [None] * rc.world_size
    dist.all_gather_object(gathered, {"layouts": layouts, "plain": plain})
    gc.collect()  # every DDP model released while the process group is alive (see run_ddp)
    dist.barrier()
    if rc.rank != 0:
        return None
    plains = [g["plain"] for g in gathered]
    return {"bucket_sizes": layouts, "grad_bytes": rank.grad_bytes,
            "in_buckets": all(sum(sizes) == rank.grad_bytes for g in gathered for sizes in g["layouts"]),
            "plain": None if None in plains else {k: max(p[k] for p in plains) for k in plains[0]},
            "grad_check": grad_check, "job": rank.job.describe().get("job", rank.job.name),
            "world_size": rc.world_size}


#: The rank task of :func:`run_ddp_check`, as :func:`helpers.comm.launch.run_job` names it.
DDP_CHECK_TASK = "helpers.experiments.collectives:run_ddp_check"


def run_sweep_and_ddp(cfg: Mapping[str, Any], rc) -> dict[str, Any] | None:
    """Notebook 08's measurement in one collective job, on this rank: the allreduce sweep
    (:func:`helpers.comm.allreduce.run_allreduce`: its correctness check, the timed sizes and the bare loop), then
    the DDP experiment (:func:`run_ddp`). One job instead of two saves a start of ``world_size`` processes.

    Parameters
    ----------
    cfg : mapping
        ``allreduce`` (:func:`helpers.comm.allreduce.bench_config`'s ``sizes``, ``repeats``, ``warmup``,
        ``bare_bytes``) and ``ddp`` (:meth:`DDPConfig.as_dict`).
    rc : helpers.comm.rank.RankContext

    Returns
    -------
    dict or None
        On rank 0: ``allreduce`` (run_allreduce's result), ``ddp`` (run_ddp's) and ``allreduce_s``, ``ddp_s`` (the
        seconds of each part on rank 0); None on the other ranks.
    """
    sweep = cfg["allreduce"]
    t0 = time.perf_counter()
    bench = run_allreduce(rank=rc.rank, world_size=rc.world_size, device=rc.device, sizes=sweep["sizes"],
                          repeats=sweep["repeats"], warmup=sweep["warmup"], sync=rc.sync,
                          bare_bytes=sweep.get("bare_bytes"))
    t1 = time.perf_counter()
    ddp_res = run_ddp(cfg["ddp"], rc)
    if rc.rank != 0:
        return None
    return {"allreduce": bench, "ddp": ddp_res, "allreduce_s": t1 - t0, "ddp_s": time.perf_counter() - t1}


#: The rank task of :func:`run_sweep_and_ddp`, as :func:`helpers.comm.launch.run_job` names it.
MEASURE_TASK = "helpers.experiments.collectives:run_sweep_and_ddp"


DDP_KEYS = ("data_dir", "max_images", "seed", "batch_size", "image_size", "text_len", "model_width", "d_model",
            "steps", "warmup_steps", "bucket_cap_mb_list", "compression_hooks")


def ddp_benchmark(params: Mapping[str, Any], *, world_size: int = 2, backend: str = "auto",
                  timeout_s: float = 300.0, master_port: int = 0, device_kind: str | None = None,
                  log_dir: "str | None" = None) -> dict[str, Any]:
    """Run :func:`run_ddp` in ``world_size`` child processes (see :func:`helpers.comm.launch.run_job`).

    Parameters
    ----------
    params : mapping
        Must hold the keys of :data:`DDP_KEYS` (e.g. notebook 08's parameters); a non-empty ``job`` (a
        user's job spec) is made absolute and loaded by every rank instead of the built-in job.
    log_dir : path, optional
        Where the logs of a failed job are kept (see :func:`helpers.comm.launch.run_job`).

    Raises
    ------
    ParameterError
        A key is missing, or the job rejected its input.
    """
    cfg = DDPConfig.from_params(params)
    launched = run_job(DDP_TASK, cfg.as_dict(), world_size=world_size, backend=backend, device_kind=device_kind,
                       timeout_s=timeout_s, master_port=master_port, log_dir=log_dir)
    out = dict(launched.data)
    out["wall_s"] = round(launched.wall_s, 2)
    out["backend"] = launched.backend
    return out


def ddp_in_launched_job(params: Mapping[str, Any], *, backend: str = "auto") -> dict[str, Any] | None:
    """Run :func:`run_ddp` as one rank of a job that torchrun started (RANK, WORLD_SIZE, MASTER_ADDR set).

    The multi-node path of notebook 08's DDP experiment: ``torchrun ... -m helpers bench ddp --job ...`` runs
    this in every rank, on the device the rank was given; rank 0 returns the result, the others None.

    Raises
    ------
    ParameterError
        A key of :data:`DDP_KEYS` is missing.
    """
    from helpers.comm.rank import init_rank

    cfg = DDPConfig.from_params(params)
    if backend == "auto":
        backend = resolve_backend("auto", get_accelerator("auto").kind)
    rc = init_rank(backend)
    t0 = time.perf_counter()
    try:
        out = run_ddp(cfg, rc)
    finally:
        dist.destroy_process_group()
    if out is not None:
        out.update(backend=backend, wall_s=round(time.perf_counter() - t0, 2))
    return out


# --------------------------------------------------------------------------- the verdict

#: Notebook whose verdict :func:`verdict` gives.
NOTEBOOK = "08_collectives"


def _n_buckets(n: int) -> str:
    """``"1 bucket"``, ``"3 buckets"``."""
    return f"{n} bucket" + ("" if n == 1 else "s")


def verdict(bench: Mapping[str, Any] | None, ddp_res: Mapping[str, Any] | None, buckets: Mapping[str, Any] | None, *,
            why_not: str, context: str) -> Verdict:
    """Notebook 08's verdict: whether a gradient-compression hook is measurably faster, with the bucket and overlap figures.

    Parameters
    ----------
    bench : mapping or None
        :func:`helpers.comm.allreduce.allreduce_benchmark`'s result (``sizes`` rows with ``bytes`` and
        ``busbw_gbps``, ``device``); None when the collectives could not run here.
    ddp_res : mapping or None
        :func:`ddp_benchmark`'s result; None when it could not run.
    buckets : mapping or None
        :func:`bucket_comparison` of ``ddp_res["buckets"]`` (``best``, ``note``, ``noise_s``).
    why_not : str
        Why the collectives could not run (used when ``bench`` or ``ddp_res`` is None).
    context : str
        What was measured, in one sentence.

    Returns
    -------
    helpers.verdict.Verdict
        metric ``busbw_at_largest_size`` (GB/s; None when not applicable); action on ``comm_hook``; ``extra``:
        ``best_bucket_cap_mb`` and ``best_hook``.
    """
    if bench is None or ddp_res is None or buckets is None:
        return Verdict(notebook=NOTEBOOK, metric="busbw_at_largest_size", value=None, unit="GB/s",
                       recommendation="not applicable", reason=why_not, context=context)
    largest = bench["sizes"][-1]
    hcmp = hook_comparison(ddp_res["hooks"], buckets["noise_s"])
    best_comp = hcmp["candidate"]
    if best_comp is None:
        rec, why = "not applicable", hcmp["note"]
    elif hcmp["best"] != "none measurable":
        rec = "enable"
        why = f"{hcmp['note']} per step, for a relative gradient error of {best_comp['rel_err']:.1e}"
    else:
        rec = "leave off"
        so = "so leave compression off" if best_comp["hook"] in hcmp["slower"] else "so none measurable"
        why = (f"compression: {hcmp['note']} per step (median [25th-75th percentile]), {so}; "
               f"{best_comp['hook']} costs a relative gradient error of {best_comp['rel_err']:.1e}")
    best_cap = buckets["best"]
    cap_txt = "none measurable" if best_cap == "none measurable" else "cap " + "/".join(f"{c:g}" for c in best_cap)
    ov = ddp_res["overlap"]
    reason = (f"{why}; best bucket_cap_mb: {cap_txt} ({buckets['note']}); overlap at bucket_cap_mb {ov['cap_mb']:g} "
              f"({_n_buckets(ov['n_buckets'])}): {ov['note']}; busbw {largest['busbw_gbps']:.2f} GB/s at "
              f"{largest['bytes'] / 2**20:g} MiB")
    hook = hcmp["best"] if hcmp["best"] in ("fp16", "bf16") else (best_comp or {}).get("hook", "")
    hook = hook if hook in ("fp16", "bf16") else ""
    action = Action("comm_hook", hook if rec == "enable" else "none",
                    f"{hook + ' ' if hook else ''}gradient compression: {rec}", current="none")
    return Verdict(notebook=NOTEBOOK, metric="busbw_at_largest_size", value=largest["busbw_gbps"], unit="GB/s",
                   recommendation=rec, reason=reason, context=context, action=action,
                   extra={"best_bucket_cap_mb": best_cap, "best_hook": hcmp["best"]})


# --------------------------------------------------------------------------- the "try it" panel: allreduce sweep

#: The rank task of :func:`run_allreduce_sweep`, as :func:`helpers.comm.launch.run_job` names it.
SWEEP_TASK = "helpers.experiments.collectives:run_allreduce_sweep"


def _size_text(nbytes: int) -> str:
    """``"4 MiB"``, ``"64 KiB"``, ``"8 B"``: a message size as the notebook's table writes it."""
    if nbytes >= MIB:
        return f"{nbytes / MIB:g} MiB"
    if nbytes >= 1024:
        return f"{nbytes / 1024:g} KiB"
    return f"{nbytes} B"


def run_allreduce_sweep(cfg: Mapping[str, Any], rc) -> dict[str, Any] | None:
    """The allreduce benchmark one size at a time, each size's row written as soon as it is measured (in a rank).

    Each size runs :func:`helpers.comm.allreduce.run_allreduce` with ``sizes=[size]`` (its correctness check,
    warm-up and timed calls, the slowest rank's median; no bare-loop comparison), so a live sweep is timed
    exactly as notebook 08's table. Rank 0 writes each row to ``cfg["points_dir"]/<index>.json`` (written
    whole, then renamed) for the parent to read while the job runs. Before each size the ranks agree
    (an allreduce of a flag) on whether ``cfg["stop_file"]`` exists: then every rank stops before that size.

    Parameters
    ----------
    cfg : mapping
        ``sizes`` (bytes), ``repeats``, ``warmup``, ``points_dir``, ``stop_file``.
    rc : helpers.comm.rank.RankContext

    Returns
    -------
    dict or None
        On rank 0: ``sizes`` (the rows measured, as :func:`helpers.comm.allreduce.summarize` plus ``repeats``),
        ``stopped`` (bool) and ``world_size``; None on the other ranks.
    """
    points, stop = Path(cfg["points_dir"]), Path(cfg["stop_file"])
    flag = torch.zeros(1, dtype=torch.float32, device=rc.device)
    rows, stopped = [], False
    for i, nbytes in enumerate(int(b) for b in cfg["sizes"]):
        flag.fill_(1.0 if rc.rank == 0 and stop.exists() else 0.0)
        dist.all_reduce(flag)  # rank 0's decision reaches every rank: all stop before the same size
        if float(flag.item()) > 0:
            stopped = True
            break
        out = run_allreduce(rank=rc.rank, world_size=rc.world_size, device=rc.device, sizes=[nbytes],
                            repeats=int(cfg["repeats"]), warmup=int(cfg["warmup"]), sync=rc.sync, bare_bytes=None)
        if out is not None:
            row = out["sizes"][0]
            rows.append(row)
            write_atomic(points / f"{i:05d}.json", json.dumps(row))
    if rc.rank != 0:
        return None
    return {"sizes": rows, "stopped": stopped, "world_size": rc.world_size}


def live_point(row: Mapping[str, Any], *, world_size: int, backend: str = "", label: str | None = None) -> LivePoint:
    """One allreduce size as a "try it" point: its bus bandwidth, nccl-tests' way, with the spread of its times.

    Parameters
    ----------
    row : mapping
        A row of notebook 08's allreduce table (:func:`helpers.comm.allreduce.summarize`, plus ``repeats``):
        ``bytes``, ``time_s``, ``time_p25_s``, ``time_p75_s`` (seconds, the slowest rank's), ``busbw_gbps``.
    world_size : int
        Ranks it ran on (n in the factor 2(n-1)/n).
    backend : str
        For the sentence (``gloo``, ``nccl``, ``hccl``).
    label : str, optional
        Default ``"<size>, <n> ranks"``.

    Returns
    -------
    LivePoint
        metric ``bus_bandwidth``, unit ``GB/s`` (1e9 B/s): busbw = algbw x 2(n-1)/n at the median time;
        ``low``/``high``: the busbw at the 75th/25th percentile times (the interquartile range).

    Raises
    ------
    helpers.errors.ParameterError
        For a world size below 1 or a time that is not positive.
    """
    nbytes, n = int(row["bytes"]), int(world_size)
    factor = bus_factor(n)
    t, algbw = float(row["time_s"]), algbw_gbps(nbytes, float(row["time_s"]))
    busbw = busbw_gbps(nbytes, t, n)
    low = busbw_gbps(nbytes, float(row["time_p75_s"]), n)
    high = busbw_gbps(nbytes, float(row["time_p25_s"]), n)
    size = _size_text(nbytes)
    label = label or f"{size}, {n} rank{'s' if n != 1 else ''}"
    repeats = row.get("repeats")
    how = f"{backend}, " if backend else ""
    if n == 1:
        tail = ("one rank: nothing crosses a link, so busbw = algbw x 2(n-1)/n = 0; algbw "
                f"{algbw:.3g} GB/s measures only the call's own overhead (a copy within one process)")
    else:
        tail = f"algbw {algbw:.2f} GB/s x 2(n-1)/n = {factor:.2f}"
    sentence = (f"{label} ({how}{t * 1e6:,.0f} us per allreduce, slowest rank's median"
                + (f" of {repeats} calls" if repeats else "") + f"): busbw {busbw:.3g} GB/s (IQR {low:.3g}-"
                f"{high:.3g}); {tail}")
    return LivePoint(label=label, value=busbw, unit="GB/s", metric="bus_bandwidth", low=low, high=high,
                     sentence=sentence, extra={"bytes": nbytes, "world_size": n, "algbw_gbps": algbw,
                                               "time_s": t, "bus_factor": factor, "backend": backend,
                                               "calls": repeats})


def try_allreduce(*, min_mib: float, max_mib: float, world_size: int, backend: str = "auto",
                  device_kind: str | None = None, repeats: int = 10, warmup: int = 3, timeout_s: float = 300.0,
                  master_port: int = 0, log_dir: "str | None" = None,
                  progress: Progress = no_progress) -> Iterator[LivePoint]:
    """Notebook 08's allreduce benchmark again over a range of message sizes and a world size: one point per size.

    The sizes are ``min_mib`` doubled up to ``max_mib`` (both included; whole float32 elements, as
    :func:`helpers.comm.allreduce.message_sizes`). One collective job of ``world_size`` processes on this
    machine, started by the notebook's launcher (:func:`helpers.comm.launch.run_job`, torchrun, the process
    group in child processes only), times every size with the notebook's own code
    (:func:`run_allreduce_sweep`: correctness check, ``warmup`` untimed and ``repeats`` timed calls, each
    followed by a device synchronize, five times the calls up to 64 KiB, the slowest rank's median). Points
    are yielded while the job runs, as each size finishes; closing the iterator early (or Kernel > Interrupt)
    asks the ranks to stop after the size they are in, and waits for them.

    Parameters
    ----------
    min_mib, max_mib : float
        Smallest and largest message, MiB (2**20 bytes); 4 bytes <= min_mib <= max_mib.
    world_size : int
        Ranks (processes) of the job, >= 1; at most what :func:`helpers.comm.launch.max_world_size` allows here
        (gloo: 4 per usable core and the memory; nccl/hccl: one per visible device).
    backend : {"auto", "gloo", "nccl", "hccl"}
        As the notebook's (the one it resolved, e.g. its fallback to gloo).
    device_kind : str, optional
        For ``"auto"``: the notebook's device kind (default: torch's best device).
    repeats, warmup : int
        Timed (>= 1) and untimed (>= 0) allreduces per size: the notebook's ``repeats`` and ``warmup``.
    timeout_s : float
        Seconds before the job counts as hung and is stopped with every process it started.
    master_port : int
        0: a free port; else this port on 127.0.0.1.
    log_dir : str, optional
        Where the logs of a failed job are kept.
    progress : callable
        ``progress(done, total)`` after each size, in sizes.

    Returns
    -------
    iterator of LivePoint
        One per size, smallest first, see :func:`live_point`: metric ``bus_bandwidth``, unit ``GB/s``.

    Raises
    ------
    helpers.errors.ParameterError
        At the call, before anything starts: a size range that is empty or below 4 bytes, repeats < 1 or
        warmup < 0, a world size below 1 or above what this machine runs with the backend, an unknown backend.
    helpers.errors.DeviceUnavailableError
        At the call: the backend cannot run here.
    TimeoutError, RuntimeError
        While iterating: the job hung (past ``timeout_s``) or a rank failed (see
        :func:`helpers.comm.launch.run_job`).
    """
    for name, v in (("min_mib", min_mib), ("max_mib", max_mib)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ParameterError(f"{name}={v!r}: a message size in MiB must be a number > 0")
    min_bytes, max_bytes = int(round(min_mib * MIB)), int(round(max_mib * MIB))
    if min_bytes < 4:
        raise ParameterError(f"min_mib={min_mib!r} is {min_bytes} bytes, below one float32 element (4 bytes): "
                             "raise min_mib")
    if min_bytes > max_bytes:
        raise ParameterError(f"the smallest size ({_size_label(min_bytes)}, min_mib) is larger than the largest "
                             f"({_size_label(max_bytes)}, max_mib): the size range is empty; lower the smallest or "
                             "raise the largest")
    for name, v, lo in (("repeats", repeats, 1), ("warmup", warmup, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ParameterError(f"{name}={v!r} must be an int >= {lo}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ParameterError(f"world_size={world_size!r} must be an int >= 1 (ranks of the job)")
    sizes = message_sizes(min_bytes, max_bytes)
    kind = device_kind or get_accelerator("auto").kind
    be = resolve_backend(backend, kind)
    check_backend(be)
    check_world_size(world_size, be, bytes_per_rank=2 * sizes[-1])  # what the sweep's largest size needs
    return _sweep_points(sizes, world_size=world_size, backend=be, device_kind=kind, repeats=repeats,
                         warmup=warmup, timeout_s=timeout_s, master_port=master_port, log_dir=log_dir,
                         progress=progress)


def _size_label(nbytes: int) -> str:
    """``"1 KiB"``, ``"4 MiB"``: a size as the panel's knobs show it."""
    return f"{nbytes / MIB:g} MiB" if nbytes >= MIB else f"{nbytes / 1024:g} KiB"


def _sweep_points(sizes: Sequence[int], *, world_size: int, backend: str, device_kind: str, repeats: int,
                  warmup: int, timeout_s: float, master_port: int, log_dir, progress: Progress
                  ) -> Iterator[LivePoint]:
    """Run :func:`run_allreduce_sweep` in a job (a thread waits for it) and yield each row as rank 0 writes it."""
    with tempfile.TemporaryDirectory(prefix="try_allreduce_", ignore_cleanup_errors=True) as tmp:
        root = Path(tmp)
        points, stop = root / "points", root / "stop"
        points.mkdir()
        cfg = {"sizes": [int(s) for s in sizes], "repeats": int(repeats), "warmup": int(warmup),
               "points_dir": str(points), "stop_file": str(stop)}
        box: dict[str, Any] = {}

        def job() -> None:  # run_job waits for torchrun; this thread ends only after the job has ended
            try:
                box["result"] = run_job(SWEEP_TASK, cfg, world_size=world_size, backend=backend,
                                        device_kind=device_kind, timeout_s=timeout_s, master_port=master_port,
                                        out_dir=root / "job", bytes_per_rank=2 * int(sizes[-1]), log_dir=log_dir)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread below
                box["error"] = exc

        waiter = threading.Thread(target=job, name="try-allreduce", daemon=True)
        waiter.start()
        seen = 0
        try:
            while True:
                ended = not waiter.is_alive()  # read first: a row written before the job ended is listed below
                for f in sorted(points.glob("[0-9]*.json"))[seen:]:
                    row = json.loads(f.read_text())
                    seen += 1
                    progress(seen, len(sizes))
                    yield live_point(row, world_size=world_size, backend=backend)
                if ended:
                    break
                waiter.join(timeout=0.05)
        finally:
            if waiter.is_alive():  # closed early or interrupted: the ranks stop after the size they are in
                stop.touch()
                waiter.join()
        if "error" in box:
            raise box["error"]


# --------------------------------------------------------------------------- the notebook's experiment: one result


@dataclass(frozen=True)
class BackendPlan:
    """The collective backend notebook 08 runs on, and whether it can run here.

    Attributes
    ----------
    requested : str
        The ``backend`` parameter (``"auto"``, ``"gloo"``, ``"nccl"``, ``"hccl"``).
    backend : str or None
        The one resolved (auto falls back to gloo on the CPU where the device's library cannot run); None when
        none can run.
    world_size : int
    runnable : bool
    why_not : str
        Why the collectives cannot run (empty when they can).
    note : str
        What was tried and failed on the way (empty when the first choice ran).
    limit : int
        The largest world size this machine allows with the backend, and ``limit_why`` why.
    limit_why : str
    """

    requested: str
    backend: str | None
    world_size: int
    runnable: bool
    why_not: str
    note: str
    limit: int
    limit_why: str

    def text(self) -> str:
        """The backend, the world size and this machine's limit (and the note)."""
        line = (f"backend: {self.backend or 'none'}; world_size {self.world_size} (this machine allows at most "
                f"{self.limit}: {self.limit_why})")
        return line + (f"\nnote: {self.note}" if self.note else "")


def plan_backend(requested: str, world_size: int, kind: str) -> BackendPlan:
    """Resolve the backend for device ``kind`` and check it and the world size, falling back to gloo on the CPU
    for ``"auto"`` on a device whose library cannot run here."""
    from helpers.comm.launch import max_world_size
    from helpers.errors import DeviceUnavailableError

    def checked(req: str, k: str) -> str:
        be = resolve_backend(req, k)
        check_backend(be)
        check_world_size(world_size, be)
        return be

    why_not, note = "", ""
    try:
        backend = checked(requested, kind)
    except (DeviceUnavailableError, ParameterError) as exc:
        backend, note = None, str(exc)
        if requested == "auto" and kind != "cpu":
            try:
                backend = checked("gloo", "cpu")
                note = f"{note} -> falling back to gloo on the CPU"
            except (DeviceUnavailableError, ParameterError) as exc2:
                note = f"{note}; gloo: {exc2}"
        if backend is None:
            why_not = note
    limit, limit_why = max_world_size(backend or "gloo")
    return BackendPlan(requested, backend, world_size, backend is not None, why_not, note, limit, limit_why)


#: Notebook 08's proposed environment: (name, value, what it is); invented names, a bad value and a rejected pair
#: among real ones, so that the catalog's check shows each kind of finding.
PROPOSED_ENV = (
    ("HCCL_OP_BLOCK_LIST", "AllReduce", "invented"),
    ("PT_DEBUG", "1", "invented"),
    ("ASCEND_COMPRESS_LEVEL", "3", "invented"),
    ("HCCL_ALGO", "tree", "real name, invalid value"),
    ("HCCL_BUFFSIZE", "400", "real: MB per communicator buffer"),
    ("HCCL_CONNECT_TIMEOUT", "1200", "real: seconds, 120-7200"),
    ("HCCL_EXEC_TIMEOUT", "1836", "real: seconds"),
    ("NCCL_DEBUG", "WARN", "real"),
    ("HCCL_INTRA_ROCE_ENABLE", "1", "real, but not together with the next one"),
    ("HCCL_INTRA_PCIE_ENABLE", "1", "real; both set to 1 is rejected by the catalog's cross-checks"),
)

_LEVEL = {"ok": 0, "warning": 1, "error": 2}


@dataclass(frozen=True)
class EnvCheck:
    """The environment catalog's findings on this process's environment and on :data:`PROPOSED_ENV`, and the
    validated env file written from the latter (``path``)."""

    current: tuple
    found: tuple
    path: Path

    def current_text(self) -> str:
        """The watched settings in this process's environment, one finding a line."""
        from helpers.diagnose.envcatalog import format_finding

        return "\n".join([f"current environment: {len(self.current)} watched setting(s) found"]
                         + [format_finding(f) for f in self.current])

    def proposed_text(self) -> str:
        """The findings on the proposed settings, errors first."""
        from helpers.diagnose.envcatalog import format_finding

        order = sorted(self.found, key=lambda f: (-_LEVEL[f.severity], f.name))
        return "\n".join(["proposed settings (one finding per line):"] + [format_finding(f) for f in order])

    def written_text(self) -> str:
        """The rejected names and the settings the validated env file holds."""
        written = [line for line in self.path.read_text().splitlines() if line.startswith("export ")]
        bad = sorted({f.name for f in self.found if f.severity == "error"})
        return "\n".join([f"rejected: {', '.join(bad)}", f"written to {self.path.name}:"] + written)

    def add_records(self, out: Records) -> None:
        for f in self.found:
            out.add("env_check", f.name, "severity", _LEVEL[f.severity], "level", value_seen=f.value,
                    severity=f.severity, message=f.message, fix=f.fix)
        out.add("env_check", "validated env file", "settings_written",
                sum(line.startswith("export ") for line in self.path.read_text().splitlines()), "settings",
                path=self.path.name)


def env_check(out_dir: "str | Path") -> EnvCheck:
    """Check this process's environment and :data:`PROPOSED_ENV` against the catalog (as on an NPU), and write the
    valid proposed settings to ``out_dir/08_collectives_validated.env``."""
    import logging
    import os

    from helpers.diagnose.envcatalog import check_env, write_env_file

    current = check_env(os.environ)
    proposed = {n: v for n, v, _ in PROPOSED_ENV}
    found = check_env(proposed, npu=True)
    envlog = logging.getLogger("helpers.diagnose.envcatalog")
    level = envlog.level
    envlog.setLevel(logging.ERROR)  # the rejected names are printed by written_text, without the folder's path
    try:
        path, _ = write_env_file(proposed, Path(out_dir) / "08_collectives_validated.env", npu=True, skip_invalid=True)
    finally:
        envlog.setLevel(level)
    return EnvCheck(tuple(current), tuple(found), Path(path))


def hccl_options_text(kind: str) -> str:
    """Per-process-group HCCL options on an NPU (torch_npu's ``ProcessGroupHCCL.Options``), or why not here."""
    if kind != "npu":
        return f"per-group HCCL options: not applicable on {kind} (needs torch_npu and an NPU)"
    from helpers.comm.hccl_options import hccl_process_group_options

    opts = hccl_process_group_options(buffer_size_mb=400, op_expansion_mode=None)
    return (f"hccl_config: {getattr(opts, 'hccl_config', None)}\n"
            "use: dist.init_process_group('hccl', pg_options=opts) or dist.new_group(ranks, pg_options=opts)")


@dataclass(frozen=True, eq=False)
class CollectivesChecks:
    """Notebook 08 before any timing (:func:`check`): the backend, the environment check and DDP's correctness on
    the job. :class:`CollectivesResult` extends it with the measurement.

    Attributes
    ----------
    plan : BackendPlan
    device_kind : str
        ``acc.kind`` of the notebook.
    env : EnvCheck
    params : mapping
        The notebook's parameters (``world_size``, ``min_bytes``, ``max_size_mib``, ``repeats``, ``warmup``,
        ``steps``, ``batch_size``, ``image_size``, ``model_width``, ``timeout_s``, ``master_port``, ``backend``).
    ddp_check : dict or None
        :func:`run_ddp_check`'s result (the buckets of every cap, plain DDP against the fp32 reference); None when
        the collectives cannot run here.
    log_dir : str
        Where a failed collective job keeps its logs (the notebook's artifacts folder).
    """

    plan: BackendPlan
    device_kind: str
    env: EnvCheck
    params: Mapping[str, Any] = field(repr=False)
    ddp_check: Mapping[str, Any] | None = None
    log_dir: str = ""

    def ddp_check_text(self) -> str:
        """Section 3: plain DDP equals the fp32 reference, every gradient byte is in a bucket."""
        c = self.ddp_check
        if c is None:
            return f"DDP not run: {self.plan.why_not}"
        plain = c["plain"]
        exact = str(plain["max_abs_err"] == 0.0) if plain is not None else c["grad_check"]
        return (f"plain DDP allreduce equals the fp32 reference exactly: {exact}\n"
                f"every gradient byte is in a bucket: {c['in_buckets']}")


@dataclass(frozen=True, eq=False)
class CollectivesResult(CollectivesChecks, ExperimentResult):
    """Notebook 08's measurement: the backend, the allreduce sweep, DDP's buckets, hooks and overlap on the job,
    and the environment check.

    Attributes
    ----------
    plan, device_kind, env, params, ddp_check, log_dir
        As :class:`CollectivesChecks`'s (sections 1-3, with their texts).
    bench : dict or None
        :func:`helpers.comm.allreduce.allreduce_benchmark`'s result; None when the collectives cannot run here.
    ddp : dict or None
        :func:`ddp_benchmark`'s result; None when they cannot.
    """

    bench: Mapping[str, Any] | None = field(default=None, kw_only=True)
    ddp: Mapping[str, Any] | None = field(default=None, kw_only=True)

    # -- derived figures -----------------------------------------------------------------------

    @property
    def regimes(self) -> dict[str, Any] | None:
        """:func:`helpers.comm.allreduce.regimes` of the sweep (None without one)."""
        from helpers.comm.allreduce import regimes

        return regimes(self.bench["sizes"]) if self.bench is not None else None

    @property
    def flags(self) -> list[dict[str, Any]]:
        """The sweep's sizes that look noisy (:func:`helpers.comm.allreduce.flag_outliers`)."""
        from helpers.comm.allreduce import flag_outliers

        if self.bench is None:
            return []
        return flag_outliers(self.bench["sizes"], growth_from_bytes=self.regimes["crossover_bytes"])

    @property
    def buckets(self) -> dict[str, Any] | None:
        """:func:`bucket_comparison` of DDP's bucket sweep (None without DDP)."""
        return None if self.ddp is None else bucket_comparison(self.ddp["buckets"], self.ddp["backward_passes"])

    # -- what the cells print ----------------------------------------------------------------

    def allreduce_table(self):
        """Section 4: per size, its calls, times (us, median and quartiles) and bandwidths (None without a run)."""
        import pandas as pd

        if self.bench is None:
            return None
        df = pd.DataFrame(self.bench["sizes"])
        show = df.assign(size=[f"{b / 2**20:g} MiB" if b >= 2**20 else f"{b} B" for b in df["bytes"]],
                         median_us=df["time_s"] * 1e6, p25_us=df["time_p25_s"] * 1e6, p75_us=df["time_p75_s"] * 1e6)
        return show[["size", "repeats", "median_us", "p25_us", "p75_us", "algbw_gbps", "busbw_gbps"]].round(4)

    def allreduce_text(self) -> str:
        """Section 4: the small-message time, the noisy sizes, the plateau, the largest size and the bare loop."""
        if self.bench is None:
            return f"allreduce benchmark not run: {self.plan.why_not}"
        bench, reg, flags = self.bench, self.regimes, self.flags
        small = [r for r in bench["sizes"] if r["bytes"] in reg["small_sizes"]]
        lines = [f"median small-message time: {reg['small_time_s'] * 1e6:.0f} us per allreduce (median of the "
                 f"per-size medians of the {len(small)} smallest sizes, {small[0]['bytes']} to {small[-1]['bytes']} "
                 "B; a typical value, single sizes lie above and below it)"]
        if flags:
            lines.append(f"flagged: {len(flags)} of {len(bench['sizes'])} sizes look noisy (ringed in the plot; a "
                         "loaded machine gives millisecond scheduler pauses: rerun on an idle machine or raise "
                         "repeats):")
            lines += [f"  {format_bytes(f['bytes'])}: {'; '.join(f['reasons'])}" for f in flags]
        else:
            lines.append("steady: no size has a 75th percentile above 5x its median, a median off its neighbours' "
                         "trend, or (in the bandwidth-bound part) a time that does not grow with size")
        lines.append(f"plateau: {reg['plateau_busbw_gbps']:.2f} GB/s busbw (median of the {len(reg['plateau_bytes'])} "
                     f"largest sizes, {reg['plateau_bytes'][0] / 2**20:g} MiB and up); from "
                     f"{reg['crossover_bytes']:,} bytes on (the crossover), every size reaches at least half of it "
                     f"(highest single point: {reg['peak_busbw_gbps']:.2f} GB/s at {reg['peak_bytes'] / 2**20:g} MiB)")
        largest, b = bench["sizes"][-1], bench["bare"]
        row = next((r for r in bench["sizes"] if r["bytes"] == b["bytes"]), None)
        lines.append(f"largest size {largest['bytes'] / 2**20:g} MiB: busbw {largest['busbw_gbps']:.2f} GB/s. At "
                     f"{b['bytes'] / 2**20:g} MiB, {b['chunks']} interleaved rounds of {b['chunk_calls']} calls: bare "
                     f"loop {b['busbw_gbps']:.2f} GB/s, benchmark {b['bench_busbw_gbps']:.2f} GB/s (both the median "
                     f"chunk mean, slowest rank); the sweep's own {b['bytes'] / 2**20:g} MiB point above: "
                     f"{row['busbw_gbps'] if row else float('nan'):.2f} GB/s")
        lines.append(f"overhead_vs_bare {bench['overhead_vs_bare']:.3f}: {bench['overhead_note']}")
        return "\n".join(lines)

    def references_text(self) -> str:
        """Section 4: published figures beside this run's (empty without a run)."""
        if self.bench is None:
            return ""
        bench, reg = self.bench, self.regimes
        at40 = min(bench["sizes"], key=lambda r: abs(r["bytes"] - 40e6))
        refs = [
            ("localhost gloo allreduce latency (tiny messages)", "about 0.2 ms",
             f"median small-message time {reg['small_time_s'] * 1e3:.3f} ms",
             "https://github.com/meta-pytorch/torchft/pull/199"),
            ("localhost gloo allreduce at 40 MB", "about 2.4 GB/s",
             f"{at40['algbw_gbps']:.2f} GB/s algbw at {format_bytes(at40['bytes'])}",
             "https://github.com/meta-pytorch/torchft/pull/199"),
            ("8x H100 nccl allreduce busbw, NVLink SHARP (ring: about 370 GB/s)", "about 480 GB/s",
             f"plateau busbw {reg['plateau_busbw_gbps']:.2f} GB/s ({self.plan.backend}, {self.plan.world_size} ranks "
             f"on {bench['device']})", "https://github.com/NVIDIA/nccl-tests/issues/212"),
        ]
        return "\n".join(f"{what}: published {published}; this run: {here}\n    source: {url}"
                         for what, published, here, url in refs)

    def ddp_text(self) -> str:
        """Section 5: the job under DDP, each bucket layout and the bucket comparison's note."""
        d, cmp_ = self.ddp, self.buckets
        if d is None:
            return f"DDP not run: {self.plan.why_not}"
        lines = [f"{d['job']}: {d['params']:,} parameters, {d['grad_bytes'] / 2**20:.2f} MiB of fp32 gradients per "
                 f"backward, {d['backward_passes']} backward pass(es) per step; {d['world_size']} ranks x "
                 f"{d['batch_per_rank']} samples; {d['samples']} samples in the data"]
        for g in cmp_["groups"]:
            caps = ", ".join(f"{c:g}" for c in g["caps"])
            lines.append(f"bucket layout {g['n_buckets']} bucket(s) from cap(s) {caps}: {g['time_s'] * 1e3:.1f} ms "
                         "per step"
                         + (f", the caps' medians {g['spread_s'] * 1e3:.1f} ms apart (same work: noise)"
                            if len(g["caps"]) > 1 else ""))
        return "\n".join(lines + [f"buckets: {cmp_['note']}"])

    def buckets_table(self):
        """Section 5: per ``bucket_cap_mb``, the buckets DDP made and the step time (None without DDP)."""
        import pandas as pd

        if self.ddp is None:
            return None
        return pd.DataFrame([{"bucket_cap_mb": b["cap_mb"], "buckets made": b["n_buckets"],
                              "bucket sizes (KiB)": ", ".join(f"{s / 1024:.0f}" for s in b["bucket_sizes"]),
                              "step ms": b["time_s"] * 1e3, "p25 ms": b["time_p25_s"] * 1e3,
                              "p75 ms": b["time_p75_s"] * 1e3} for b in self.ddp["buckets"]]).round(2)

    def hooks_text(self) -> str:
        """Section 5: the hooks not supported here, and where the hooks were measured."""
        d = self.ddp
        if d is None:
            return f"DDP not run: {self.plan.why_not}"
        lines = [f"{name}: not supported with {self.plan.backend} here ({why})"
                 for name, why in d["unsupported_hooks"].items()]
        cap = d["hooks"][0]["cap_mb"] if d["hooks"] else float("nan")
        lines.append(f"hooks measured at bucket_cap_mb {cap:g}; the 'none' row is the same run as the bucket_cap_mb "
                     f"{cap:g} row of the table above; gradient error from {d['grad_check']}")
        return "\n".join(lines)

    def hooks_table(self):
        """Section 5: per hook, the bytes sent (three significant digits: a small model sends a few KiB), the step
        time (rounded like :meth:`buckets_table`) and the gradient error (two significant digits, "0" when exact)
        (None without DDP)."""
        import pandas as pd

        if self.ddp is None:
            return None
        err = lambda x: f"{x:.1e}" if x else "0"  # noqa: E731  (errors span decades: two significant digits)
        return pd.DataFrame([{"hook": h["hook"], "MiB per step": float(f"{h['bytes_per_step'] / 2**20:.3g}"),
                              "step ms": h["time_s"] * 1e3, "p25 ms": h["time_p25_s"] * 1e3,
                              "p75 ms": h["time_p75_s"] * 1e3, "max abs err": err(h["max_abs_err"]),
                              "rel err": err(h["rel_err"]), "elements differing": h["mismatched"]}
                             for h in self.ddp["hooks"]]).round({"step ms": 2, "p25 ms": 2, "p75 ms": 2})

    def overlap_text(self) -> str:
        """Section 5: communication hidden behind the backward pass, and the cost per bucket where measurable."""
        d, cmp_ = self.ddp, self.buckets
        if d is None:
            return f"DDP not run: {self.plan.why_not}"
        ov = d["overlap"]
        line = (f"overlap at bucket_cap_mb {ov['cap_mb']:g} ({_n_buckets(ov['n_buckets'])}, {ov['steps']} interleaved "
                f"steps each): step with DDP {ov['t_ddp_s'] * 1e3:.1f} ms, without communication (no_sync) "
                f"{ov['t_nosync_s'] * 1e3:.1f} ms, the allreduces alone {ov['t_allreduce_s'] * 1e3:.1f} ms: "
                f"communication adds {ov['exposed_s'] * 1e3:.1f} ms to the step; {ov['note']}.")
        if cmp_["measurable"]:
            extra = cmp_["per_bucket_s"]
            return line + (f"\n{'fewer' if extra > 0 else 'more'} buckets were measurably faster here: "
                           f"{extra * 1e3:+.2f} ms per extra bucket per backward pass ({d['backward_passes']} "
                           "backward passes per step)"
                           + (f"; the allreduce curve above puts one small allreduce at about "
                              f"{self.regimes['small_time_s'] * 1e3:.2f} ms" if self.bench is not None else ""))
        return line + (f"\nbucket size: no measurable difference between the layouts (noise "
                       f"{(cmp_['noise_s'] or 0) * 1e3:.1f} ms between caps with the same buckets), so no per-bucket "
                       "cost is computed")

    # -- records, verdict and the panel ----------------------------------------------------------

    def records(self) -> Records:
        """The allreduce sweep, DDP's buckets, hooks and overlap, and the environment check; in that order."""
        out, why = Records(), self.plan.why_not
        self._allreduce_records(out)
        if self.ddp is None:
            out.add("ddp_buckets", "sweep", "step_time", None, "s", recommendation="not applicable", reason=why)
        else:
            self._ddp_records(out)
        self.env.add_records(out)
        return out

    def _allreduce_records(self, out: Records) -> None:
        bench = self.bench
        if bench is None:
            out.add("allreduce", "benchmark", "busbw", None, "GB/s", recommendation="not applicable",
                    reason=self.plan.why_not)
            return
        for r in bench["sizes"]:
            out.add("allreduce", f"{r['bytes']} B", "busbw", r["busbw_gbps"], "GB/s", repeats=r["repeats"],
                    spread={"time_s": r["time_s"], "time_p25_s": r["time_p25_s"], "time_p75_s": r["time_p75_s"]},
                    algbw_gbps=r["algbw_gbps"], backend=self.plan.backend, world_size=self.plan.world_size)
        b = bench["bare"]
        out.add("allreduce", "bare loop", "overhead_vs_bare", bench["overhead_vs_bare"], "x",
                bare_busbw_gbps=b["busbw_gbps"], bench_busbw_gbps=b["bench_busbw_gbps"], bytes=b["bytes"],
                statistic=bench["overhead_statistic"], target="<= 1.10", met=bench["met"]["overhead_vs_bare"],
                note=bench["overhead_note"])

    def _ddp_records(self, out: Records) -> None:
        d, steps = self.ddp, self.params["steps"]
        for b in d["buckets"]:
            out.add("ddp_buckets", f"bucket_cap_mb={b['cap_mb']:g}", "step_time", b["time_s"], "s", repeats=steps,
                    spread={"p25": b["time_p25_s"], "p75": b["time_p75_s"]}, bucket_sizes=b["bucket_sizes"],
                    n_buckets=b["n_buckets"])
        for h in d["hooks"]:
            out.add("ddp_compression", h["hook"], "step_time", h["time_s"], "s", repeats=steps,
                    spread={"p25": h["time_p25_s"], "p75": h["time_p75_s"]}, bytes_per_step=h["bytes_per_step"])
            out.add("ddp_compression", h["hook"], "grad_rel_err", h["rel_err"], "1", max_abs_err=h["max_abs_err"],
                    mismatched=h["mismatched"])
        for name, why in d["unsupported_hooks"].items():
            out.add("ddp_compression", name, "step_time", None, "s", recommendation="not applicable", reason=why)
        ov = d["overlap"]
        out.add("ddp_overlap", f"bucket_cap_mb={ov['cap_mb']:g}", "hidden_fraction", ov["hidden_fraction"], "1",
                t_ddp_s=ov["t_ddp_s"], t_nosync_s=ov["t_nosync_s"], t_allreduce_s=ov["t_allreduce_s"],
                n_buckets=ov["n_buckets"], consistent=ov["consistent"], note=ov["note"],
                raw_hidden_fraction=ov["raw_hidden_fraction"], single_bucket=ov.get("single_bucket", False))

    @property
    def context(self) -> str:
        """What was measured, in the verdict's one sentence."""
        P, plan, d = self.params, self.plan, self.ddp
        if self.bench is None or d is None:
            return f"backend {P['backend']}, world_size {P['world_size']} on {self.device_kind}"
        trained = (f"PPO DDP {P['batch_size']} samples per rank, image {P['image_size']} px, width {P['model_width']}"
                   if d.get("builtin", True) else
                   f"your job {d['job']!r} under DDP, {d['batch_per_rank']} samples per rank")
        return (f"{plan.backend}, {P['world_size']} ranks on {self.bench['device']}; allreduce {P['min_bytes']} B to "
                f"{P['max_size_mib']} MiB, {P['repeats']} repeats; {trained}, {P['steps']} steps per variant, "
                "interleaved")

    def verdict(self) -> Verdict:
        """Notebook 08's verdict (:func:`verdict`) with :attr:`context`."""
        ran = self.bench is not None and self.ddp is not None
        return verdict(self.bench, self.ddp, self.buckets if ran else None, why_not=self.plan.why_not,
                       context=self.context)

    def try_it(self, acc: Any, params: Mapping[str, Any]) -> TrySpec:
        """The "try it" panel: the allreduce benchmark over another size range and world size
        (:func:`try_allreduce`), beside this notebook's own point at the panel's largest starting size.

        Knobs: ``min_mib`` and ``max_mib`` (1 KiB up to the larger of ``max_size_mib`` and 256 MiB, powers of two;
        starting at 1 MiB and the smaller of 4 MiB and ``max_size_mib``, a cheap range for the headless point) and
        ``world_size`` (1 up to this machine's cores with gloo, its devices otherwise).
        """
        import math

        from helpers.comm.launch import max_world_size
        from helpers.device import usable_cores

        P, plan = params, self.plan
        be = plan.backend or "gloo"
        most = usable_cores() if be == "gloo" else max(1, max_world_size(be)[0])  # processes on this machine
        top = int(math.log2(max(P["max_size_mib"], 256)))
        sizes = tuple((f"{2.0**k * 1024:g} KiB" if k < 0 else f"{2**k} MiB", 2.0**k) for k in range(-10, top + 1))
        lo, hi = 1.0, float(min(4, P["max_size_mib"]))
        reference = None
        if self.bench is not None:  # the notebook's own size at the panel's largest starting size
            row = min(self.bench["sizes"], key=lambda r: abs(r["bytes"] - hi * 2**20))
            reference = live_point(row, world_size=P["world_size"], backend=plan.backend)
        kind, log_dir = acc.kind, self.log_dir
        knobs = {"min_mib": Knob(sizes, lo, "smallest"), "max_mib": Knob(sizes, hi, "largest"),
                 "world_size": Knob(tuple((str(n), n) for n in range(1, most + 1)), min(P["world_size"], most),
                                    "world_size")}
        return TrySpec("allreduce bus bandwidth against message size",
                       lambda progress, min_mib, max_mib, world_size: try_allreduce(
                           min_mib=min_mib, max_mib=max_mib, world_size=world_size, backend=be, device_kind=kind,
                           repeats=P["repeats"], warmup=P["warmup"], timeout_s=P["timeout_s"],
                           master_port=P["master_port"], log_dir=log_dir, progress=progress),
                       knobs, reference=reference,
                       unavailable="" if plan.runnable else f"the collectives cannot run here: {plan.why_not}")


def _launch_options(ctx: Any, plan: BackendPlan) -> dict[str, Any]:
    """The launcher's keywords (:func:`helpers.comm.launch.run_job`) of notebook 08's collective jobs."""
    P = ctx.params
    return dict(world_size=P["world_size"], backend=plan.backend, timeout_s=P["timeout_s"],
                master_port=P["master_port"], device_kind=ctx.acc.kind, log_dir=str(ctx.artifacts_dir))


def check(ctx: Any) -> CollectivesChecks:
    """Notebook 08 before any timing, in the notebook's order: the backend, the environment check and DDP's
    correctness on the job (:func:`run_ddp_check` in a short collective job: seconds where :func:`run` takes
    minutes at the default sizes).

    Parameters
    ----------
    ctx : helpers.workbook.nbsetup.NotebookContext
        The notebook's parameters, accelerator, artifacts folder (a failed job's logs) and out folder (the
        validated env file).

    Returns
    -------
    CollectivesChecks

    Raises
    ------
    ParameterError, DataError, TimeoutError, RuntimeError
        The collective job's (:func:`helpers.comm.launch.run_job`).
    """
    P, acc = ctx.params, ctx.acc
    plan = plan_backend(P["backend"], P["world_size"], acc.kind)
    ddp_check = None
    if plan.runnable:
        ddp_check = run_job(DDP_CHECK_TASK, DDPConfig.from_params(P).as_dict(), **_launch_options(ctx, plan)).data
    return CollectivesChecks(plan=plan, device_kind=acc.kind, env=env_check(ctx.out_dir), params=dict(P),
                             ddp_check=ddp_check, log_dir=str(ctx.artifacts_dir))


def run(ctx: Any, checks: CollectivesChecks | None = None) -> CollectivesResult:
    """Notebook 08's experiment, in the notebook's order: :func:`check` (the backend, the environment, DDP's
    correctness), then the allreduce sweep and DDP timed on the job (the user's, ``params["job"]``, loaded by every
    rank; else the built-in PPO job), both in one collective job (:func:`run_sweep_and_ddp`).

    Parameters
    ----------
    ctx : helpers.workbook.nbsetup.NotebookContext
        The notebook's parameters, accelerator, artifacts folder (a failed job's logs) and out folder (the
        validated env file). For a user's job, ``params["batch_size"]`` is set to the batch its ranks trained
        (``ctx.use_job_batch``).
    checks : CollectivesChecks, optional
        :func:`check`'s result (the notebook shows it before the timing starts); None checks here.

    Returns
    -------
    CollectivesResult

    Raises
    ------
    ParameterError, DataError, TimeoutError, RuntimeError
        A collective job's (:func:`helpers.comm.launch.run_job`).
    """
    from helpers.comm.allreduce import bench_config, finish_result

    P = ctx.params
    c = checks if checks is not None else check(ctx)
    bench = ddp_res = None
    if c.plan.runnable:
        sweep = bench_config(min_bytes=P["min_bytes"], max_size_mib=P["max_size_mib"], repeats=P["repeats"],
                             warmup=P["warmup"])
        launched = run_job(MEASURE_TASK, {"allreduce": sweep, "ddp": DDPConfig.from_params(P).as_dict()},
                           bytes_per_rank=2 * sweep["sizes"][-1], **_launch_options(ctx, c.plan))
        data, be = launched.data, launched.backend
        # as allreduce_benchmark and ddp_benchmark return them, each part timed inside the job
        bench = finish_result(data["allreduce"], backend=be, world_size=launched.world_size,
                              wall_s=data["allreduce_s"])
        ddp_res = {**data["ddp"], "wall_s": round(data["ddp_s"], 2), "backend": be}
        if not ddp_res.get("builtin", True):  # a user's job trained at its own batch per rank: the records say it
            ctx.use_job_batch(ddp_res["batch_per_rank"])
    return CollectivesResult(**checked_fields(c), bench=bench, ddp=ddp_res)


# -- the notebook's declaration, found by helpers.experiments.registry ------------------------------------

EXPERIMENT = Experiment(
    item=Item("08", "08_collectives", "collectives",
         "Measure collectives and tune DDP's communication",
         "Allreduce bus bandwidth vs message size, DDP's buckets and gradient compression on this backend"),
    spec=specs.COMMON + specs.DATA + specs.batch("samples per rank per DDP step") + specs.training(
        "timed DDP steps per variant") + (
        Param("backend", str, "auto", "torch.distributed backend: auto picks hccl on npu, nccl on cuda, gloo on cpu",
              choices=("auto", "gloo", "nccl", "hccl")),
        Param("world_size", int, 2, "processes in the process group (one per device on cuda/npu)", minimum=2,
              maximum=64),
        Param("min_bytes", int, 8, "smallest allreduce message, bytes", minimum=4, maximum=1 << 30),
        Param("max_size_mib", int, 256, "largest allreduce message, MiB", minimum=1, maximum=1 << 16),
        Param("repeats", int, 10, "timed allreduces per message size", minimum=3, maximum=10000),
        Param("warmup", int, 3, "untimed allreduces per message size", minimum=0, maximum=1000),
        Param("bucket_cap_mb_list", list, [0.25, 1, 25], "DDP bucket_cap_mb values to sweep (25 is DDP's default)",
              item_kind=float, minimum=0.01, maximum=4096),
        Param("compression_hooks", list, ["none", "fp16", "bf16"],
              "DDP gradient compression hooks to compare (none is plain allreduce)", item_kind=str,
              choices=("none", "fp16", "bf16")),
        Param("timeout_s", float, 300.0, "seconds before a collective job counts as hung and is stopped",
              minimum=5.0, maximum=7200.0),
        Param("master_port", int, 0, "TCP port of the rendezvous on 127.0.0.1 (0 picks a free one)", minimum=0,
              maximum=65535),
    ) + specs.JOB,
)
