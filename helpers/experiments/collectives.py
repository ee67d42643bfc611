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
from helpers.compute.ppo import ppo_loss
from helpers.device import get_accelerator
from helpers.errors import ParameterError
from helpers.experiments.base import Experiment
from helpers.experiments.training import fixed_batches
from helpers.fsutil import write_atomic
from helpers.jobs.base import Workload, close_dataset
from helpers.jobs.ppo import PPOJob
from helpers.jobspec import FACTORY_DEFAULTS_KEY, absolute_job_spec
from helpers.live import LivePoint, Progress, no_progress
from helpers.params import Param
from helpers.timing import timed_call
from helpers.verdict import Action, Verdict


__all__ = ["DDP_KEYS", "DDP_TASK", "SWEEP_TASK", "bucket_comparison", "ddp_benchmark", "ddp_in_launched_job",
           "hook_comparison", "live_point", "run_allreduce_sweep", "run_ddp", "try_allreduce", "verdict"]

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


def _grad_loss(model, images, tokens, labels):
    """A deterministic PPO loss of one batch (rollout quantities taken from the same forward, detached)."""
    logits, values = model(images, tokens)
    with torch.no_grad():
        actions = labels % logits.shape[1]
        old = torch.log_softmax(logits.float(), dim=1).gather(1, actions[:, None]).squeeze(1)
        rewards = (logits.argmax(1) == actions).float()
        adv = rewards - values.float()
    loss, _ = ppo_loss(logits, actions, old, adv, values, rewards)
    return loss


def _flat_grads(model):
    grads = [p.grad.reshape(-1).float() for p in model.parameters() if p.grad is not None]
    return torch.cat(grads) if grads else torch.zeros(0)


def _backward_gradients(job, model, acc, batch, module=None):
    """The gradients one backward pass of ``job`` leaves in ``module`` (default ``model``), flat fp32.

    The built-in job: :func:`_grad_loss` on the batch (its step does several updates). Any other job: one
    call of its own step, whose gradients stay in the parameters after the optimizer step (a step that
    clears them at its end leaves none: then the result is empty).
    """
    module = module if module is not None else model
    if isinstance(job, PPOJob):
        _grad_loss(model, *batch).backward()
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


def _rank_job(cfg: Mapping[str, Any], workload: Workload):
    """The job this rank trains: the user's (``cfg["job"]``, loaded in every rank) or the built-in PPO job."""
    spec = str(cfg.get("job") or "")
    if spec:
        from helpers.jobs.load import load_job
        from helpers.jobspec import factory_params

        return load_job(spec, factory_params(cfg))
    return PPOJob.from_data(workload, cfg.get("data_dir") or None, max_images=int(cfg.get("max_images", 0)))


def run_ddp(cfg: Mapping[str, Any], rc) -> dict[str, Any] | None:
    """The DDP experiments on this rank (inside an initialized default process group); rank 0 returns the result.

    Parameters
    ----------
    cfg : mapping
        ``data_dir``, ``max_images``, ``seed``, ``batch_size`` (per rank),
        ``image_size``, ``text_len``, ``model_width``, ``d_model``, ``steps``,
        ``warmup_steps``, ``bucket_cap_mb_list``, ``compression_hooks``; optional ``job`` (a user's job spec,
        an absolute path or a module: every rank loads it; empty: the built-in PPO job).
    rc : helpers.comm.rank.RankContext

    Returns
    -------
    dict or None
        ``buckets`` (rows: cap_mb, bucket_sizes, n_buckets, step time stats),
        ``hooks`` (rows: hook, bytes_per_step, step time stats, errors),
        ``overlap`` ({cap_mb, n_buckets, t_ddp_s, t_nosync_s, t_allreduce_s}
        and the keys of :func:`overlap_figures`; hidden_fraction is None when
        the measurement is inconsistent), hook rows carry ``cap_mb`` (the
        default cap, 25 when swept),
        ``grad_bytes``, ``params``, ``world_size``, ``batch_per_rank``, ``backward_passes`` (per step: the
        PPO step's ``ppo_epochs``; a user's step's, counted), ``job`` (its name), ``samples`` (in its data).
        A user's job's gradient errors come from one call of its own step (see :func:`_backward_gradients`);
        ``grad_check`` says how they were taken.
    """
    caps = [float(c) for c in cfg["bucket_cap_mb_list"]]
    hooks = list(cfg["compression_hooks"])
    for h in hooks:
        hook_function(h)
    acc = get_accelerator(rc.device.type, index=rc.device.index or 0)
    workload = Workload.from_params(cfg)
    job = _rank_job(cfg, workload)
    builtin = isinstance(job, PPOJob)
    seed, bs = job.workload.seed, job.workload.batch_size
    batches = fixed_batches(job, acc, 2, epoch=rc.rank)  # rank r draws the epoch-r order: different samples
    if builtin:
        n_samples = len(job.index)
    else:
        counted = job.make_dataset(job.pipelines[0])
        n_samples = len(counted)
        close_dataset(counted)
    base = job.make_model(acc)
    base_state = copy.deepcopy(base.state_dict())
    grad_bytes = sum(p.numel() * 4 for p in base.parameters() if p.requires_grad)

    def fresh(cap: float, hook: str = "none"):
        m = job.make_model(acc)
        m.load_state_dict(base_state)
        d = DDP(m, bucket_cap_mb=cap, broadcast_buffers=False)
        fn = hook_function(hook)
        if fn is not None:
            d.register_comm_hook(state=None, hook=fn)
        return d

    default_cap = 25.0 if 25.0 in caps else caps[-1]
    local: dict[str, Any] = {"buckets": [], "hooks": [], "errors": {}}
    n_warm = int(cfg["warmup_steps"])

    def stepper(ddp, *, no_sync: bool = False):
        if builtin:  # its actions are sampled: each rank its own stream
            train_step = job.make_step(ddp, acc, generator=torch.Generator(device=rc.device).manual_seed(seed + rc.rank))
        else:
            train_step = job.make_step(ddp, acc)
        it = itertools.cycle(batches)

        def step():
            if no_sync:
                with ddp.no_sync():
                    train_step(next(it))
            else:
                train_step(next(it))
        return step

    # every variant is built and warmed up first (>= 2 steps for the cap models: DDP rebuilds its buckets after
    # the first iteration), then all are timed INTERLEAVED, one step each per round, the order reversed every
    # other round (ABBA), so that a slow phase of the machine hits every variant alike
    models: dict[float, Any] = {}
    variants: list[tuple[str, Any]] = []
    passes = job.ppo.ppo_epochs if builtin else None
    for cap in caps:
        d = fresh(cap)
        fn = stepper(d)
        for _ in range(max(2, n_warm) - (passes is None)):
            fn()
        if passes is None:  # a user's step: count its backward passes on its last warm-up step
            passes = _count_backward_passes(d, fn)
        models[cap] = d
        variants.append((f"cap:{cap}", fn))
    # overlap needs several buckets: the smallest cap that made more than one (else the default cap)
    multi = sorted(c for c in caps if len(bucket_sizes(models[c])) > 1)
    overlap_cap = multi[0] if multi else default_cap
    unsupported: dict[str, str] = {}
    hook_models = []
    for h in hooks:
        if h == "none":
            continue
        if h == "bf16" and rc.backend == "gloo":
            # DDP's own check (torch/nn/parallel/distributed.py, _check_comm_hook) accepts the bf16 hook only with
            # CUDA + NCCL >= 2.10 or XPU + XCCL; ask before building a DDP model that would be torn down half-made
            unsupported[h] = ("TypeError: BF16 all reduce communication hook required CUDA 11+ and NCCL 2.10+ "
                              "or XPU and XCCL (DDP's check; not available with gloo)")
            continue
        try:
            d = fresh(default_cap, h)
            fn = stepper(d)
            for _ in range(n_warm):
                fn()
        except (TypeError, RuntimeError) as exc:  # e.g. bf16 hook: "required CUDA 11+ and NCCL 2.10+"
            unsupported[h] = f"{type(exc).__name__}: {exc}"
            continue
        hook_models.append(d)
        variants.append((f"hook:{h}", fn))
    # overlap: the same step without communication (a model of its own, so the DDP model's ranks stay in step),
    # and the allreduce alone on DDP's buckets
    nosync_model = fresh(overlap_cap)
    fn = stepper(nosync_model, no_sync=True)
    for _ in range(n_warm):
        fn()
    variants.append(("nosync", fn))
    sizes = bucket_sizes(models[overlap_cap]) or [grad_bytes]
    bufs = [torch.zeros(max(1, s // 4), dtype=torch.float32, device=rc.device) for s in sizes]

    def allreduce_alone():
        for _ in range(passes):
            for t in bufs:
                dist.all_reduce(t)

    for _ in range(n_warm):
        allreduce_alone()
    variants.append(("ar", allreduce_alone))
    times: dict[str, list[float]] = {name: [] for name, _ in variants}
    for r in range(int(cfg["steps"])):
        for name, fn in (variants if r % 2 == 0 else variants[::-1]):
            times[name].append(timed_call(fn, rc.sync, time.perf_counter))
    for cap in caps:
        d = models[cap]
        local["buckets"].append({"cap_mb": cap, "bucket_sizes": bucket_sizes(d),
                                 "rebuilt": int(d._get_ddp_logging_data().get("has_rebuilt_buckets", 0)),
                                 "times": times[f"cap:{cap}"]})
    for h in hooks:
        if h == "none":
            local["hooks"].append({"hook": h, "times": times[f"cap:{default_cap}"]})
        elif f"hook:{h}" in times:
            local["hooks"].append({"hook": h, "times": times[f"hook:{h}"]})
    t_nosync, t_ar = times["nosync"], times["ar"]
    del models, hook_models, nosync_model, variants
    # gradient error of each hook against the fp32 reference
    plain = job.make_model(acc)
    plain.load_state_dict(base_state)
    plain.train()
    ref = _backward_gradients(job, plain, acc, batches[0]) / rc.world_size
    dist.all_reduce(ref)
    grad_check = ("one PPO loss's backward pass on the rank's first batch" if builtin else
                  "one call of the job's own step on the rank's first batch (the gradients it leaves in the "
                  "parameters; a step that clips them before the optimizer clips local and averaged gradients "
                  "differently, so even plain DDP then differs from the reference)")
    if ref.numel() == 0:
        grad_check = ("not measured: the job's step leaves no gradients in the parameters after it returns "
                      "(zero_grad at its end?), so there is nothing to compare")
    for h in hooks:
        if h in unsupported or ref.numel() == 0:
            continue
        d = fresh(default_cap, h)
        d.train()
        local["errors"][h] = grad_error(_backward_gradients(job, d, acc, batches[0], module=d.module), ref)
    gathered: list = [None] * rc.world_size
    dist.all_gather_object(gathered, {"buckets": [b["times"] for b in local["buckets"]],
                                      "hooks": [h["times"] for h in local["hooks"]],
                                      "nosync": t_nosync, "ar": t_ar, "errors": local["errors"]})
    # release every DDP model (and its reducer) while the process group is alive: a reducer torn down after
    # destroy_process_group() can abort the rank at exit ("terminate called without an active exception")
    del d, plain
    gc.collect()
    dist.barrier()
    if rc.rank != 0:
        return None
    buckets = []
    for i, b in enumerate(local["buckets"]):
        buckets.append({"cap_mb": b["cap_mb"], "bucket_sizes": b["bucket_sizes"], "n_buckets": len(b["bucket_sizes"]),
                        "rebuilt": b["rebuilt"], **_stats([g["buckets"][i] for g in gathered])})
    hook_rows = []
    nan = float("nan")
    no_err = {"max_abs_err": nan, "rel_err": nan, "mismatched": nan}
    for i, h in enumerate(local["hooks"]):
        errs = [g["errors"].get(h["hook"], no_err) for g in gathered]
        hook_rows.append({"hook": h["hook"], "cap_mb": default_cap,
                          "bytes_per_step": grad_bytes // 4 * HOOK_BYTES[h["hook"]] * passes,
                          **_stats([g["hooks"][i] for g in gathered]),
                          "max_abs_err": max(e["max_abs_err"] for e in errs),
                          "rel_err": max(e["rel_err"] for e in errs),
                          "mismatched": max(e["mismatched"] for e in errs)})
    t_d = _stats([g["buckets"][caps.index(overlap_cap)] for g in gathered])["time_s"]
    t_n = _stats([g["nosync"] for g in gathered])["time_s"]
    t_a = _stats([g["ar"] for g in gathered])["time_s"]
    return {"buckets": buckets, "hooks": hook_rows,
            "overlap": {"cap_mb": overlap_cap, "n_buckets": len(sizes), "steps": int(cfg["steps"]), "t_ddp_s": t_d, "t_nosync_s": t_n,
                        "t_allreduce_s": t_a, **overlap_figures(t_d, t_n, t_a)},
            "unsupported_hooks": unsupported, "grad_bytes": grad_bytes, "params": count_parameters(base), "world_size": rc.world_size,
            "batch_per_rank": bs, "backward_passes": passes, "job": job.describe().get("job", job.name),
            "samples": n_samples, "grad_check": grad_check,
            "timing": ("median over steps of the max over ranks (each rank synced its device after every step); "
                       "all variants timed interleaved, one step each per round, the order reversed every other "
                       "round")}


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
    missing = [k for k in DDP_KEYS if k not in params]
    if missing:
        raise ParameterError(f"ddp_benchmark needs {', '.join(missing)} in params; pass notebook 08's parameters.")
    cfg = {k: params[k] for k in DDP_KEYS}
    if params.get("job"):  # every rank loads the user's job: a path relative to here would not be theirs
        cfg["job"] = absolute_job_spec(str(params["job"]))
        cfg[FACTORY_DEFAULTS_KEY] = list(params.get(FACTORY_DEFAULTS_KEY) or ())  # sizes its factory keeps
    launched = run_job(DDP_TASK, cfg, world_size=world_size, backend=backend, device_kind=device_kind,
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
    missing = [k for k in DDP_KEYS if k not in params]
    if missing:
        raise ParameterError(f"ddp_in_launched_job needs {', '.join(missing)} in params; pass notebook 08's parameters.")
    from helpers.comm.launch import resolve_backend
    from helpers.comm.rank import init_rank

    cfg = {k: params[k] for k in DDP_KEYS}
    if params.get("job"):
        cfg["job"] = absolute_job_spec(str(params["job"]))
        cfg[FACTORY_DEFAULTS_KEY] = list(params.get(FACTORY_DEFAULTS_KEY) or ())
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
        why = (f"compression: {hcmp['note']} per step (median [25th-75th percentile]), so none measurable; "
               f"{best_comp['hook']} costs a relative gradient error of {best_comp['rel_err']:.1e}")
    best_cap = buckets["best"]
    cap_txt = "none measurable" if best_cap == "none measurable" else "cap " + "/".join(f"{c:g}" for c in best_cap)
    ov = ddp_res["overlap"]
    reason = (f"{why}; best bucket_cap_mb: {cap_txt} ({buckets['note']}); overlap at bucket_cap_mb {ov['cap_mb']:g} "
              f"({ov['n_buckets']} buckets): {ov['note']}; busbw {largest['busbw_gbps']:.2f} GB/s at "
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
