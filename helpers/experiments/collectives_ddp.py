"""Notebook 08's DDP experiment on a job, inside the ranks: the variants built, timed interleaved and checked.

:func:`run_ddp` runs inside a rank (launched as the task ``helpers.experiments.collectives:run_ddp`` of
:mod:`helpers.comm.worker`; :mod:`helpers.experiments.collectives` imports it, so the task keeps its name);
:func:`ddp_benchmark` launches it from a process that holds no process group, :func:`ddp_in_launched_job` in a job
torchrun started. :func:`run_ddp_check` is the notebook's check before any timing, :func:`run_sweep_and_ddp` the
allreduce sweep and :func:`run_ddp` in one collective job. :class:`DDPConfig` is what every rank runs (the user's
job or the built-in one, as a :class:`helpers.jobs.load.JobRequest` every rank resolves). The measurement and its
method are described in :mod:`helpers.experiments.collectives`; the comparisons that judge the rows are
:func:`helpers.comm.ddp.bucket_comparison` and :func:`helpers.comm.ddp.hook_comparison`.

It stays in the experiments layer, above the DDP mechanics of :mod:`helpers.comm.ddp`: a rank loads the job
(:mod:`helpers.jobs`) and its fixed batches (:func:`helpers.experiments.training.fixed_batches`).
"""

from __future__ import annotations

import copy
import gc
import itertools
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from helpers.comm.allreduce import run_allreduce
from helpers.comm.ddp import HOOK_BYTES, bucket_sizes, grad_error, hook_function, overlap_figures
from helpers.comm.launch import resolve_backend, run_job
from helpers.compute.model import count_parameters
from helpers.device import get_accelerator
from helpers.errors import ParameterError
from helpers.experiments.training import fixed_batches
from helpers.jobs.load import JobRequest
from helpers.timing import timed_call

__all__ = ["DDPConfig", "DDP_CHECK_TASK", "DDP_KEYS", "DDP_TASK", "MEASURE_TASK", "ddp_benchmark",
           "ddp_in_launched_job", "run_ddp", "run_ddp_check", "run_sweep_and_ddp"]

#: The rank task of :func:`run_ddp`, as :func:`helpers.comm.launch.run_job` names it.
DDP_TASK = "helpers.experiments.collectives:run_ddp"


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
