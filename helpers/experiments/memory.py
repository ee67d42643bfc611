"""Notebook 09's experiment: memory per step of a Job, allocator settings in child processes, the batch-size finder.

- :func:`job_step_factory` decodes the job's images once and returns
  ``make_step(batch_size) -> step`` for any batch size.
- :func:`run_alloc_conf_child` runs the memory trace in a **child process**
  with one allocator setting, because the allocator reads its configuration
  once, before the first device allocation (see :mod:`helpers.compute.memory`).
  Run as ``python -m helpers.experiments.memory '<json config>'`` this module
  is that child and prints one JSON line.
- :func:`find_batch_size` doubles the batch until it runs out of memory (a
  real device OOM, or on a CPU the memory budget exceeded by the measured
  peak, raised inside the finder as
  :class:`helpers.compute.memory.MemoryBudgetExceeded`), recovers, optionally
  bisects, and chooses the largest batch that leaves ``safety_margin`` of the
  budget free.
- :func:`try_batch_size` (the notebook's "try it" panel) measures one batch size exactly as the finder measures
  each size, and :func:`live_point` turns a finder row into the panel's point.
"""

from __future__ import annotations

import json
import logging
import math
import os
import psutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import pandas as pd
import torch

from helpers import specs
from helpers.checklist import Item
from helpers.compute.memory import (
    GIB,
    MIB,
    MemoryBudgetExceeded,
    RssPeakSampler,
    alloc_conf_var,
    check_alloc_conf,
    is_oom,
    measure_empty_cache,
    release_memory,
    rss_bytes,
    trace_memory,
)
from helpers.device import Accelerator, get_accelerator
from helpers.errors import ParameterError
from helpers.experiments.base import Experiment
from helpers.jobs.base import Workload, close_dataset
from helpers.jobs.ppo import PPOJob
from helpers.live import LivePoint, Progress, no_progress
from helpers.params import Param
from helpers.pipeline.prepare import prepare_data
from helpers.timing import measure
from helpers.verdict import Action, Verdict


logger = logging.getLogger(__name__)

__all__ = ["TraceConfig", "POOL_IMAGES", "job_step_factory", "run_alloc_conf_child", "FinderConfig", "FinderResult",
           "resolve_budget_bytes", "find_batch_size", "live_point", "try_batch_size"]

#: Variables removed from a child's environment so that only the setting under
#: test is in effect (torch 2.13 gives ``PYTORCH_ALLOC_CONF`` priority over
#: ``PYTORCH_CUDA_ALLOC_CONF``; torch_npu exits when it and
#: ``PYTORCH_NPU_ALLOC_CONF`` are both set).
_CONFLICTING_VARS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_NPU_ALLOC_CONF",
                     "PYTORCH_HIP_ALLOC_CONF")

#: Marker before the child's JSON result on its stdout.
_RESULT_MARK = "@@MEMORY_RESULT@@"


@dataclass(frozen=True)
class TraceConfig:
    """What the allocator-settings child runs: the built-in job of notebook 09, as flat JSON-able fields.

    Attributes
    ----------
    device : str
        "cpu", "cuda" or "npu".
    data_dir : str
        Image folder; "" for the embedded photos.
    max_images, seed, batch_size, image_size, text_len, model_width, d_model : int
        As the notebook's parameters of the same names.
    steps : int
        Traced steps.
    warmup_steps : int
        Steps before the trace.
    empty_cache_repeats : int
        Rounds of :func:`measure_empty_cache` (0: skip).
    job : str
        The user's job spec (:func:`helpers.jobs.load.load_job`); "" for the built-in job.
    factory_defaults : tuple of str
        The sizes the user's job keeps at its factory's own defaults (not passed to it; see
        :data:`helpers.jobspec.FACTORY_DEFAULTS_KEY`).
    """

    device: str
    data_dir: str = ""
    max_images: int = 0
    seed: int = 0
    batch_size: int = 32
    image_size: int = 128
    text_len: int = 16
    model_width: int = 16
    d_model: int = 64
    steps: int = 8
    warmup_steps: int = 1
    empty_cache_repeats: int = 2
    job: str = ""
    factory_defaults: tuple = ()

    @property
    def workload(self) -> Workload:
        """The job's workload (this config is its flat JSON form for the child process)."""
        return Workload(batch_size=self.batch_size, image_size=self.image_size, text_len=self.text_len,
                        model_width=self.model_width, d_model=self.d_model, seed=self.seed)


POOL_IMAGES = 256
"""Images decoded into :func:`job_step_factory`'s host pool, at most: 256 x 3 x 224 x 224 bytes is 37 MiB."""


def job_step_factory(job, acc: Accelerator, *, n_batches: int = 2,
                     pool_images: int = POOL_IMAGES) -> Callable[[int], Callable[[], Any]]:
    """Decode a bounded sample of the job's photos once and return ``make_step(batch_size) -> step``.

    At most ``pool_images`` images (a seeded sample of the dataset, never the
    whole of a large folder) are decoded once (the job's ``"batched"``
    pipeline) into a host pool of uint8 images: memory is
    ``pool_images x 3 x image_size**2`` bytes whatever the folder holds. ``make_step(b)`` draws ``n_batches`` fixed batches of
    ``b`` samples from the pool (with repetition when ``b`` exceeds the pool;
    seeded by the workload's seed), moves them to the device
    (``job.to_device``), builds a fresh model and step (same seed), and returns
    a closure that trains on the batches in turn, as notebooks 06/07 do.
    A user's job (any other :class:`helpers.jobs.base.Job`) draws each size's batches from its own dataset
    instead (seeded; nothing but those batches is read).

    Parameters
    ----------
    job : helpers.jobs.ppo.PPOJob or helpers.jobs.base.Job
    acc : helpers.device.Accelerator
    n_batches : int, default 2
        Fixed batches each step closure cycles through (>= 1).
    pool_images : int, default :data:`POOL_IMAGES`
        Most images decoded into the pool (>= 1).

    Returns
    -------
    callable
        ``make_step(batch_size: int) -> step``; ``step()`` runs one training step
        and returns its stats (scalar tensors on the device).

    Raises
    ------
    ParameterError
        (from ``make_step``) for a batch size that is not an int >= 1.
    """
    seed = job.workload.seed
    if isinstance(pool_images, bool) or not isinstance(pool_images, int) or pool_images < 1:
        raise ParameterError(f"pool_images must be an int >= 1, got {pool_images!r}")
    if not isinstance(job, PPOJob):  # a user's job: each size's batches drawn from its own dataset
        dataset = job.make_dataset(job.pipelines[0])
        return _step_factory(job, acc, len(dataset), lambda idx: dataset[[int(i) for i in idx]], n_batches=n_batches)
    dataset = job.make_dataset("batched")
    try:
        n = len(dataset)
        pick = (sorted(int(i) for i in torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:pool_images])
                if n > pool_images else list(range(n)))
        decoded = dataset[pick]
        pool = {k: decoded[k].clone() for k in ("image", "tokens", "label")}  # the image buffer is reused
    finally:
        close_dataset(dataset)
    return _step_factory(job, acc, len(pool["label"]), lambda idx: {k: v[idx] for k, v in pool.items()},
                         n_batches=n_batches)


def _step_factory(job, acc: Accelerator, n_items: int, take: Callable[[torch.Tensor], Any], *,
                  n_batches: int) -> Callable[[int], Callable[[], Any]]:
    """``make_step(batch_size) -> step``: ``n_batches`` fixed device batches of seeded random items (``take(indices)``
    gives the host batch), a fresh model and step (same seed), and a closure that trains on the batches in turn."""
    seed = job.workload.seed

    def make_step(batch_size: int) -> Callable[[], Any]:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ParameterError(f"batch_size must be an int >= 1, got {batch_size!r}")
        gen = torch.Generator().manual_seed(seed)
        batches = [job.to_device(take(torch.randint(0, n_items, (batch_size,), generator=gen)), acc)
                   for _ in range(max(1, n_batches))]
        train_step = job.make_step(job.make_model(acc), acc)
        counter = [0]

        def step() -> Any:
            batch = batches[counter[0] % len(batches)]
            counter[0] += 1
            return train_step(batch)

        return step

    return make_step


def trace_job(cfg: "TraceConfig"):
    """The job of a :class:`TraceConfig`: the user's (``cfg.job``), or the built-in one (any batch size: the
    images are only decoded once)."""
    if cfg.job:
        from helpers.jobs.load import load_job
        from helpers.jobspec import factory_params

        return load_job(cfg.job, factory_params(asdict(cfg)))
    index, tokenizer = prepare_data(cfg.data_dir, max_images=cfg.max_images, seed=cfg.seed, batch_size=1,
                                    text_len=cfg.text_len)
    return PPOJob(index, tokenizer, cfg.workload)


def _child_main(cfg: TraceConfig) -> dict[str, Any]:
    """Body of the child process: trace memory (and empty_cache) under the inherited allocator setting."""
    acc = get_accelerator(cfg.device)
    step = job_step_factory(trace_job(cfg), acc)(cfg.batch_size)
    for _ in range(cfg.warmup_steps):
        step()
    trace = trace_memory(step, acc, cfg.steps)
    empty = None
    if cfg.empty_cache_repeats > 0:
        frame = measure_empty_cache(step, acc, repeats=cfg.empty_cache_repeats)
        empty = None if frame is None else frame.to_dict(orient="list")
    var = alloc_conf_var(acc.kind)
    return {"ok": True, "device": acc.kind, "alloc_conf_var": var,
            "alloc_conf": os.environ.get(var, "") if var else "",
            "trace": json.loads(trace.to_json(orient="records")), "empty_cache": empty}


def run_alloc_conf_child(alloc_conf: str, cfg: TraceConfig, *, timeout_s: float = 600.0) -> dict[str, Any]:
    """Run the memory trace in a child process with one allocator setting.

    The setting is validated first (:func:`check_alloc_conf`); the child gets
    it in the device's variable (:func:`alloc_conf_var`), with the other
    allocator variables removed from its environment, so that the allocator
    sees exactly this setting from its first allocation.

    Parameters
    ----------
    alloc_conf : str
        The setting, e.g. ``"expandable_segments:True"``; "" for the defaults.
    cfg : TraceConfig
        The workload; ``cfg.device`` must be the kind the parent uses.
    timeout_s : float, default 600
        Seconds before the child is killed.

    Returns
    -------
    dict
        ``ok`` (bool), ``alloc_conf``, ``alloc_conf_var``, ``device``,
        ``trace`` (list of row dicts, as :func:`trace_memory`),
        ``empty_cache`` (dict of lists or None); when the child failed:
        ``ok=False``, ``error`` (the last lines of its stderr, or the
        timeout), ``returncode``.

    Raises
    ------
    ParameterError
        If the setting is invalid (before any child starts) or ``cfg`` is not
        a TraceConfig.
    """
    if not isinstance(cfg, TraceConfig):
        raise ParameterError(f"cfg must be a TraceConfig, got {type(cfg).__name__}")
    check_alloc_conf(alloc_conf, cfg.device)
    env = {k: v for k, v in os.environ.items() if k not in _CONFLICTING_VARS}
    var = alloc_conf_var(cfg.device)
    if var and alloc_conf.strip():
        env[var] = "".join(alloc_conf.split())
    cmd = [sys.executable, "-m", "helpers.experiments.memory", json.dumps(asdict(cfg))]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"ok": False, "alloc_conf": alloc_conf, "alloc_conf_var": var, "device": cfg.device,
                "returncode": None, "error": f"the child did not finish within {timeout_s:g} s and was killed"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(_RESULT_MARK):
            result = json.loads(line[len(_RESULT_MARK):])
            result["alloc_conf"] = alloc_conf
            return result
    tail = "\n".join(proc.stderr.strip().splitlines()[-8:])
    return {"ok": False, "alloc_conf": alloc_conf, "alloc_conf_var": var, "device": cfg.device,
            "returncode": proc.returncode, "error": tail or "the child printed no result"}


# --------------------------------------------------------------------------
# the batch-size finder


@dataclass(frozen=True)
class FinderConfig:
    """Settings of :func:`find_batch_size`.

    Attributes
    ----------
    start_batch : int
        First batch size tried (>= 1; rounded up to ``multiple_of``).
    max_batch : int
        Largest batch size tried (>= start_batch).
    steps : int
        Timed steps per size (>= 1).
    budget_bytes : int
        Memory the workload may use, bytes (> 0); see :func:`resolve_budget_bytes`.
    safety_margin : float
        Fraction of the budget kept free, in [0, 0.9]: a size "fits" when its
        peak is at most ``(1 - safety_margin) * budget_bytes``.
    warmup : int
        Untimed steps per size before timing (>= 0).
    multiple_of : int
        Every size tried is a multiple of this (the PPO horizon), >= 1.
    refine_steps : int
        Bisection rounds between the last fit and the first failure (0: none).
    """

    start_batch: int
    max_batch: int
    steps: int
    budget_bytes: int
    safety_margin: float = 0.10
    warmup: int = 1
    multiple_of: int = 1
    refine_steps: int = 2

    def __post_init__(self) -> None:
        for name, lo in (("start_batch", 1), ("max_batch", 1), ("steps", 1), ("budget_bytes", 1),
                         ("warmup", 0), ("multiple_of", 1), ("refine_steps", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ParameterError(f"FinderConfig.{name} must be an int >= {lo}, got {v!r}")
        if self.max_batch < self.start_batch:
            raise ParameterError(f"FinderConfig.max_batch ({self.max_batch}) is smaller than start_batch "
                                 f"({self.start_batch}); raise max_batch or lower start_batch")
        if self.max_batch < self.multiple_of:
            raise ParameterError(f"FinderConfig.max_batch ({self.max_batch}) is below multiple_of "
                                 f"({self.multiple_of}): no batch size can be tried")
        m = self.safety_margin
        if isinstance(m, bool) or not isinstance(m, (int, float)) or not (0.0 <= m <= 0.9):
            raise ParameterError(f"FinderConfig.safety_margin must be a fraction in [0, 0.9], got {m!r}")

    @property
    def limit_bytes(self) -> int:
        """int: the most a fitting size may use, ``(1 - safety_margin) * budget_bytes``."""
        return int(self.budget_bytes * (1.0 - self.safety_margin))


@dataclass(frozen=True)
class FinderResult:
    """What :func:`find_batch_size` found.

    Attributes
    ----------
    chosen : int or None
        Largest batch size tried that ran and stayed within the margin; None
        when none did.
    frame : pandas.DataFrame
        One row per size tried, in the order tried (see :func:`find_batch_size`).
    stop_reason : str
        Why growing stopped, in words.
    budget_bytes, limit_bytes : int
        The budget and the most a fitting size may use.
    reached_max : bool
        True when every size up to ``max_batch`` fitted: growing stopped at the
        search cap, not at a memory limit, so ``chosen`` is a lower bound of
        the largest batch that fits.
    max_batch : int or None
        The search cap (``FinderConfig.max_batch``).
    """

    chosen: int | None
    frame: Any = field(repr=False)
    stop_reason: str
    budget_bytes: int
    limit_bytes: int
    reached_max: bool = False
    max_batch: int | None = None

    def largest_fit_text(self) -> str:
        """The largest fitting batch in words: ``"80"``, ``">= 256 (no limit found up to finder_max_batch=256)"``
        or ``"none"``.

        Returns
        -------
        str
        """
        if self.chosen is None:
            return "none"
        if self.reached_max:
            return f">= {self.chosen} (no limit found up to finder_max_batch={self.max_batch})"
        return str(self.chosen)


def resolve_budget_bytes(budget_mib: int, acc: "Accelerator") -> tuple[int, str]:
    """The finder's memory budget in bytes, and where it came from.

    Parameters
    ----------
    budget_mib : int
        >= 0. Positive: that many MiB. 0: on a device, its free memory plus
        what this process's allocator already reserves
        (``torch.accelerator.memory.get_memory_info`` + ``memory_reserved``);
        on a CPU, half of the available RAM (``psutil.virtual_memory().available``).

    Returns
    -------
    (int, str)
        Bytes, and a sentence saying how they were chosen; for a budget set by
        parameter it also names the default this machine would get.

    Raises
    ------
    ParameterError
        If ``budget_mib`` is not an int >= 0.
    """
    if isinstance(budget_mib, bool) or not isinstance(budget_mib, int) or budget_mib < 0:
        raise ParameterError(f"memory_budget_mib must be an int >= 0 (MiB; 0 picks one), got {budget_mib!r}")
    if budget_mib > 0:
        why = ("set by parameter: a demonstration budget (the quick profile uses a small one to show the back-off), "
               "not this machine's free memory")
        try:
            default, _ = _default_budget(acc)
            why += f"; the default here would be {default / GIB:.1f} GiB"
        except Exception as exc:  # noqa: BLE001 - the default is only a hint in the message
            logger.debug("default memory budget unavailable: %s", exc)
        return budget_mib * MIB, why
    return _default_budget(acc)


def _default_budget(acc: "Accelerator") -> tuple[int, str]:
    """The budget ``memory_budget_mib=0`` picks: see :func:`resolve_budget_bytes`."""
    if acc.is_cpu:
        avail = int(psutil.virtual_memory().available)
        return avail // 2, f"half of the available RAM ({avail / MIB:,.0f} MiB available, psutil)"
    mem = getattr(torch.accelerator, "memory", None) or torch.get_device_module(acc.kind)
    info = getattr(mem, "get_memory_info", None) or getattr(mem, "mem_get_info")
    free, total = (int(x) for x in info(acc.index))
    reserved = int(mem.memory_reserved(acc.index))
    return free + reserved, (f"the device's free memory plus this process's reserved memory "
                             f"({(free + reserved) / MIB:,.0f} of {total / MIB:,.0f} MiB)")


def _round_up(n: int, m: int) -> int:
    return int(math.ceil(n / m) * m)


def find_batch_size(make_step: Callable[[int], Callable[[], Any]], acc: "Accelerator", cfg: FinderConfig, *,
                    on_result: Callable[[dict[str, Any]], None] | None = None,
                    sample_interval_s: float = 0.005) -> FinderResult:
    """Grow the batch until out of memory, recover, bisect, and choose the largest that fits.

    Sizes ``start_batch``, x2, x2, ... up to ``max_batch`` (each rounded to
    ``multiple_of``; the last one capped at ``max_batch``). For each size:
    ``make_step(size)`` builds the workload, ``warmup`` untimed steps, then
    ``steps`` steps timed with :func:`helpers.timing.measure` (device
    synchronized) while the peak is tracked:

    - device: ``max_memory_allocated`` after :meth:`Accelerator.reset_peak_memory_stats`
      (the whole process's allocations, model included);
    - CPU: the largest RSS seen by :class:`RssPeakSampler` minus the RSS when
      the finder started (what the workload added; a lower bound).

    A size whose peak exceeds the budget raises :class:`MemoryBudgetExceeded`
    inside the finder; that, a real out-of-memory (:func:`is_oom`), is caught:
    references are dropped, garbage collected, the device cache emptied, the
    row recorded as ``"oom"`` or ``"over budget"``, and growing stops. Any
    other exception propagates. On a CPU a size whose peak, extrapolated
    linearly from the previous size, would exceed the RAM available now is not
    run (``"skipped"``), so the operating system's OOM killer never ends the
    kernel. Then up to ``refine_steps`` bisection rounds between the largest
    fitting size and the smallest failing one.

    Parameters
    ----------
    make_step : callable
        ``make_step(batch_size) -> step``; ``step()`` runs one training step.
    acc : helpers.device.Accelerator
    cfg : FinderConfig
    on_result : callable, optional
        Called with each row (a dict) as soon as the size is done, so the
        caller can record it before the next size runs.
    sample_interval_s : float, default 0.005
        RSS sampling interval on a CPU, seconds.

    Returns
    -------
    FinderResult
        ``frame`` columns: ``batch``, ``phase`` ("grow" or "refine"),
        ``status`` ("fits", "over margin", "over budget", "oom", "skipped"),
        ``peak_mib``, ``step_ms`` (median), ``throughput`` (samples/s at the
        median step), ``throughput_p25``, ``throughput_p75`` (samples/s at the
        75th and 25th percentile step times), ``error`` ("" when none).

    Raises
    ------
    ParameterError
        If ``cfg`` is not a FinderConfig or ``make_step`` is not callable.
    """
    if not isinstance(cfg, FinderConfig):
        raise ParameterError(f"cfg must be a FinderConfig, got {type(cfg).__name__}")
    if not callable(make_step):
        raise ParameterError(f"make_step must be callable, got {type(make_step).__name__}")
    nan = float("nan")
    release_memory(acc)
    base_rss = rss_bytes() if acc.is_cpu else 0
    rows: list[dict[str, Any]] = []
    sync = None if acc.is_cpu else acc.synchronize

    def attempt(batch: int, phase: str) -> dict[str, Any]:
        row = {"batch": batch, "phase": phase, "status": "", "peak_mib": nan, "step_ms": nan,
               "throughput": nan, "throughput_p25": nan, "throughput_p75": nan, "error": ""}
        if acc.is_cpu and rows:
            prev = [r for r in rows if r["status"] in ("fits", "over margin") and r["batch"] < batch]
            if prev:
                import psutil

                p = max(prev, key=lambda r: r["batch"])
                predicted = p["peak_mib"] * MIB * batch / p["batch"]
                avail = int(psutil.virtual_memory().available)
                if predicted > 0.8 * avail:
                    row["status"] = "skipped"
                    row["error"] = (f"predicted peak {predicted / MIB:.0f} MiB (linear in batch size) exceeds 80% "
                                    f"of the available RAM ({avail / MIB:.0f} MiB): not run, to protect the kernel")
                    return row
        step = None
        try:
            step = make_step(batch)
            for _ in range(cfg.warmup):
                step()
            if acc.is_cpu:
                with RssPeakSampler(sample_interval_s) as sampler:
                    m = measure(step, repeats=cfg.steps, warmup=0, sync=None, name=f"batch {batch}",
                                items_per_call=batch)
                used = max(0, sampler.peak_bytes - base_rss)
            else:
                acc.synchronize()
                acc.reset_peak_memory_stats()
                m = measure(step, repeats=cfg.steps, warmup=0, sync=sync, name=f"batch {batch}",
                            items_per_call=batch)
                used = int(acc.memory_stats()["peak_allocated_bytes"])
            row["peak_mib"] = used / MIB
            row["step_ms"] = m.median_s * 1e3
            row["throughput"] = m.rate if m.rate is not None else nan
            row["throughput_p25"] = m.rate_p25 if m.rate_p25 is not None else nan
            row["throughput_p75"] = m.rate_p75 if m.rate_p75 is not None else nan
            if used > cfg.budget_bytes:
                raise MemoryBudgetExceeded(batch, used, cfg.budget_bytes,
                                           what="RSS growth" if acc.is_cpu else "peak")
            row["status"] = "fits" if used <= cfg.limit_bytes else "over margin"
        except Exception as exc:  # noqa: BLE001 - only OOMs are handled, the rest re-raised
            if not is_oom(exc):
                raise
            row["status"] = "over budget" if isinstance(exc, MemoryBudgetExceeded) else "oom"
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
            logger.info("batch %d: %s", batch, row["error"])
        finally:
            step = None  # drop the model, optimizer state and batches before the next size
            release_memory(acc)
        return row

    def record(row: dict[str, Any]) -> None:
        rows.append(row)
        if on_result is not None:
            on_result(dict(row))

    m = cfg.multiple_of
    size = _round_up(cfg.start_batch, m)
    stop_reason = f"reached finder_max_batch={cfg.max_batch} with every size fitting: no memory limit found"
    reached_max = True
    tried: set[int] = set()
    while size <= cfg.max_batch and size not in tried:
        tried.add(size)
        row = attempt(size, "grow")
        record(row)
        if row["status"] != "fits":
            stop_reason = {"oom": f"out of memory at batch {size}",
                           "over budget": f"batch {size} exceeded the memory budget",
                           "over margin": f"batch {size} left less than the safety margin free",
                           "skipped": f"batch {size} was predicted not to fit in the available RAM"}[row["status"]]
            reached_max = False
            break
        nxt = size * 2
        if nxt > cfg.max_batch and size < cfg.max_batch:
            nxt = (cfg.max_batch // m) * m
        size = nxt

    def fitting() -> list[int]:
        return [r["batch"] for r in rows if r["status"] == "fits"]

    for _ in range(cfg.refine_steps):
        fits = fitting()
        fails = [r["batch"] for r in rows if r["status"] != "fits"]
        if not fits or not fails:
            break
        lo = max(fits)
        above = [b for b in fails if b > lo]
        if not above:
            break
        hi = min(above)
        mid = ((lo + hi) // 2 // m) * m
        if mid <= lo or mid >= hi or mid in tried:
            break
        tried.add(mid)
        record(attempt(mid, "refine"))

    fits = fitting()
    frame = pd.DataFrame(rows, columns=["batch", "phase", "status", "peak_mib", "step_ms", "throughput",
                                        "throughput_p25", "throughput_p75", "error"])
    return FinderResult(chosen=max(fits) if fits else None, frame=frame, stop_reason=stop_reason,
                        budget_bytes=cfg.budget_bytes, limit_bytes=cfg.limit_bytes,
                        reached_max=reached_max and bool(fits), max_batch=cfg.max_batch)


def main(argv: list[str] | None = None) -> int:
    """Child-process entry point: ``python -m helpers.experiments.memory '<TraceConfig as JSON>'``.

    Prints one line ``@@MEMORY_RESULT@@{json}`` on stdout; exit status 0, or 2
    for a bad argument.
    """
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.stderr.write("usage: python -m helpers.experiments.memory '<TraceConfig as JSON>'\n")
        return 2
    try:
        cfg = TraceConfig(**json.loads(argv[0]))
    except (TypeError, ValueError) as exc:
        sys.stderr.write(f"bad TraceConfig JSON: {exc}\n")
        return 2
    result = _child_main(cfg)
    sys.stdout.write(_RESULT_MARK + json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":  # pragma: no cover - exercised through run_alloc_conf_child
    logging.basicConfig(level=logging.WARNING)
    sys.exit(main())


# --------------------------------------------------------------------------- the verdict

#: Notebook whose verdict :func:`verdict` gives.
NOTEBOOK = "09_memory_and_batch_size"
#: Least throughput ratio (with the 95% interval above 1) that counts as a measured gain of a batch size.
GAIN_THRESHOLD = 1.05


def verdict(found: FinderResult, *, current: int, best: int | None, gain: tuple[float, float, float] | None,
            finder_throughput: dict, budget_why: str, budget_set: bool, safety_margin: float, used_name: str,
            steps: int, finder_steps: int, start_batch: int, context: str) -> Verdict:
    """Notebook 09's verdict: change the batch size only for a measured gain, or when the current one does not fit.

    Parameters
    ----------
    found : FinderResult
        :func:`find_batch_size`'s result (the largest batch that fits with the margin, and every size tried).
    current : int
        The batch size in use.
    best : int or None
        The finder's highest-throughput batch that fits (None when none fitted).
    gain : (ratio, ci_low, ci_high) or None
        Throughput of ``best`` over ``current``, timed interleaved (None when not compared).
    finder_throughput : dict
        Batch size -> samples/s measured by the finder (no interval).
    budget_why : str
        Where the memory budget comes from.
    budget_set : bool
        The budget was set by ``memory_budget_mib`` (the reason then says so).
    safety_margin : float
        Fraction of the budget kept free.
    used_name : str
        What the peak memory per size is ("device peak", "process RSS growth").
    steps, finder_steps, start_batch : int
        Interleaved steps of the gain comparison, timed steps per finder size, the first size tried.
    context : str
        What was measured, in one sentence.

    Returns
    -------
    helpers.verdict.Verdict
        metric ``max_batch_size`` (samples; None when no size fitted); action on ``batch_size``; ``extra``:
        ``best_throughput_batch``, ``reached_max``, ``budget_set_by_parameter``. With ``budget_set`` (a budget set
        for the run, e.g. the quick profile's demonstration budget, not this machine's free memory) the result is
        a demonstration: recommendation "not applicable", no action (nothing for the report's first screen), the
        reason starting "demonstration budget N MiB: " with what the finder found within it, and ``extra``
        adding ``demonstration`` (True), ``measured_recommendation`` and ``demonstration_batch_size``.
    """
    chosen, cur = found.chosen, current
    budget_mib, limit_mib = found.budget_bytes / MIB, found.limit_bytes / MIB
    target = cur
    if chosen is None:
        recommendation, value, unit = "leave off", None, "samples"
        reason = (f"lower the batch below {start_batch} or raise memory_budget_mib: no batch size from {start_batch} "
                  f"fitted within {limit_mib:.0f} MiB (budget {budget_mib:.0f} MiB, {safety_margin:.0%} margin); "
                  f"{found.stop_reason}")
    else:
        ch = found.frame[found.frame.batch == chosen].iloc[0]
        mem_txt = (f"largest batch that fits: {found.largest_fit_text()}, {used_name} {ch.peak_mib:.0f} MiB of the "
                   f"{budget_mib:,.0f} MiB budget ({safety_margin:.0%} kept free)")
        value = float(chosen)
        unit = "samples or more (no limit found up to finder_max_batch)" if found.reached_max else "samples"
        measured_gain = gain is not None and gain[1] > 1.0 and gain[0] >= GAIN_THRESHOLD
        if cur > chosen and not found.reached_max:
            target = best if best is not None and best <= chosen else chosen
            recommendation = "enable"
            reason = (f"lower the batch to {target}: the current {cur} does not fit the budget with the margin; "
                      f"{mem_txt}")
        elif measured_gain:
            recommendation, target = "enable", best
            verb = "raise" if best > cur else "lower"
            reason = (f"{verb} the batch to {best}: {gain[0]:.2f}x the throughput of the current {cur} "
                      f"(95% CI {gain[1]:.2f}-{gain[2]:.2f}, {steps} interleaved steps each); {mem_txt}")
        else:
            recommendation = "leave off"
            if best is None or best == cur:
                why = f"it had the highest throughput of the sizes tried ({finder_steps} steps each, no interval)"
            elif gain is None:
                why = (f"it is above the largest size tried ({chosen}), so it was not compared with batch {best}, "
                       f"the best of those ({finder_throughput[best]:.1f} samples/s, {finder_steps} steps, no "
                       "interval)")
            else:
                why = (f"batch {best} had the highest finder throughput ({finder_throughput[best]:.1f} vs "
                       f"{finder_throughput.get(cur, float('nan')):.1f} samples/s, {finder_steps} steps each, no "
                       f"interval), but interleaved it gives {gain[0]:.2f}x (95% CI {gain[1]:.2f}-{gain[2]:.2f}, "
                       f"{steps} steps each): not a measured gain")
            reason = f"keep batch {cur}: {why}; {mem_txt}"
    if budget_set:
        # a budget given as a parameter (a profile's demonstration budget) is not this machine's memory: what the
        # finder found within it is a demonstration of the back-off, never an action for this machine
        measured = recommendation
        reason = (f"demonstration budget {budget_mib:,.0f} MiB: {reason}; budget {budget_why}; a demonstration, not "
                  f"a batch size for this machine: run with memory_budget_mib=0 (the default) to size the batch "
                  f"from its free memory")
        return Verdict(notebook=NOTEBOOK, metric="max_batch_size", value=value, unit=unit,
                       recommendation="not applicable", reason=reason, context=context, action=None,
                       extra={"best_throughput_batch": best, "reached_max": found.reached_max,
                              "budget_set_by_parameter": True, "demonstration": True,
                              "measured_recommendation": measured,
                              "demonstration_batch_size": int(target) if measured == "enable" else cur})
    if recommendation == "enable":
        action = Action("batch_size", int(target), f"batch size {cur} → {int(target)}", current=cur)
    else:
        action = Action("batch_size", cur, f"batch size: keep {cur}", current=cur)
    return Verdict(notebook=NOTEBOOK, metric="max_batch_size", value=value, unit=unit, recommendation=recommendation,
                   reason=reason, context=context, action=action,
                   extra={"best_throughput_batch": best, "reached_max": found.reached_max,
                          "budget_set_by_parameter": False})


# --------------------------------------------------------------------------- the "try it" panel: one batch size


def _finite(x: Any) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def live_point(row: Any, *, is_cpu: bool, budget_bytes: int | None = None, label: str | None = None) -> LivePoint:
    """One batch size the finder measured, as a "try it" point: its memory, with its throughput in the sentence.

    Parameters
    ----------
    row : mapping or pandas.Series
        A row of :func:`find_batch_size`'s frame: ``batch``, ``status``, ``peak_mib``, ``step_ms``,
        ``throughput``, ``throughput_p25``, ``throughput_p75`` (samples/s), ``error``.
    is_cpu : bool
        Whether it ran on a CPU, where the figure is the process's sampled RSS growth, not a device peak.
    budget_bytes : int, optional
        The finder's budget, for the sentence.
    label : str, optional
        Default ``"batch <n>"``.

    Returns
    -------
    LivePoint
        On a device: metric ``peak_memory``, unit ``MiB``, the device's peak allocated memory over the timed steps
        (``max_memory_allocated``: the whole process's tensors, model included). On a CPU: metric
        ``peak_rss_growth``, unit ``MiB``, the largest process RSS a sampling thread saw during the steps minus
        the RSS before them (what the batch added; a lower bound of the true peak). A peak is one reading:
        no ``low``/``high``. ``extra`` holds ``batch``, ``status``, ``throughput`` (samples/s, median step) and its
        quartiles, ``step_ms``.
    """
    batch = int(row["batch"])
    peak = _finite(row["peak_mib"])
    tp, tp25, tp75 = (_finite(row[k]) for k in ("throughput", "throughput_p25", "throughput_p75"))
    label = label or f"batch {batch}"
    what = "RSS growth (sampled, a lower bound)" if is_cpu else "device peak allocated"
    status = str(row["status"])
    budget = f" of the {budget_bytes / MIB:,.0f} MiB budget" if budget_bytes else ""
    rate = (f", {tp:,.1f} samples/s (IQR {min(tp25, tp75):,.1f}-{max(tp25, tp75):,.1f})"
            if tp is not None and tp25 is not None and tp75 is not None else "")
    sentence = f"{label}: {what} {peak if peak is not None else float('nan'):,.1f} MiB{budget}, {status}{rate}"
    return LivePoint(label=label, value=peak if peak is not None else float("nan"), unit="MiB",
                     metric="peak_rss_growth" if is_cpu else "peak_memory", sentence=sentence,
                     extra={"batch": batch, "status": status, "throughput": tp, "throughput_p25": tp25,
                            "throughput_p75": tp75, "step_ms": _finite(row["step_ms"]),
                            "memory_source": "process RSS growth (CPU)" if is_cpu else "device allocator"})


def try_batch_size(make_step: Callable[[int], Callable[[], Any]], acc: "Accelerator", *, batch_size: int,
                   budget_bytes: int, safety_margin: float = 0.10, steps: int = 3, warmup: int = 1,
                   multiple_of: int = 1, max_batch: int | None = None,
                   progress: Progress = no_progress) -> LivePoint:
    """Notebook 09's memory and throughput at one batch size, measured as its finder measures every size.

    Runs :func:`find_batch_size` on exactly this size (``start_batch = max_batch = batch_size``, no bisection):
    ``make_step(batch_size)`` builds the job's model and fixed batches, ``warmup`` untimed steps, then ``steps``
    steps timed by :func:`helpers.timing.measure` (device synchronized) while the peak is tracked (device:
    ``max_memory_allocated`` after a reset; CPU: the sampled RSS growth), judged against the budget and margin.

    Parameters
    ----------
    make_step : callable
        The notebook's ``make_step`` (:func:`job_step_factory`), the built-in job or the user's.
    acc : helpers.device.Accelerator
    batch_size : int
        Samples per step, >= 1 and a multiple of ``multiple_of``.
    budget_bytes : int
        The finder's memory budget, bytes (:func:`resolve_budget_bytes`).
    safety_margin : float
        Fraction of the budget kept free (the status says "over margin" above it).
    steps, warmup : int
        Timed (>= 1) and untimed (>= 0) steps: the notebook's ``finder_steps`` and its finder's warm-up.
    multiple_of : int
        The PPO horizon (1 for a user's job): a PPO batch is a whole number of rollouts.
    max_batch : int, optional
        The largest batch allowed (the notebook's ``finder_max_batch``), to keep a CPU kernel clear of the
        operating system's OOM killer: the finder's own RAM prediction needs a smaller size measured first.
    progress : callable
        ``progress(done, warmup + steps)`` after each step (called inside the timed step, after its work:
        keep it cheap, as a progress bar's update is).

    Returns
    -------
    LivePoint
        See :func:`live_point`: metric ``peak_memory`` (device) or ``peak_rss_growth`` (CPU), unit ``MiB``;
        the throughput (samples/s) in ``extra`` and the sentence.

    Raises
    ------
    helpers.errors.ParameterError
        For a batch size that is not an int >= 1, not a multiple of ``multiple_of``, or above ``max_batch``;
        for steps, warm-up, budget or margin the finder rejects; and when the batch ran out of device memory
        (a real OOM: pick a smaller batch). A batch over the budget on a CPU is a point (status
        ``"over budget"``), not an error.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ParameterError(f"batch_size must be an int >= 1, got {batch_size!r}")
    if isinstance(multiple_of, bool) or not isinstance(multiple_of, int) or multiple_of < 1:
        raise ParameterError(f"multiple_of must be an int >= 1, got {multiple_of!r}")
    if batch_size % multiple_of:
        lo = max(multiple_of, batch_size // multiple_of * multiple_of)
        raise ParameterError(f"batch_size={batch_size} is not a multiple of the PPO horizon {multiple_of} (a PPO "
                             f"batch is a whole number of rollouts): pick {lo} or {lo + multiple_of}")
    if max_batch is not None and batch_size > max_batch:
        raise ParameterError(f"batch_size={batch_size} is above finder_max_batch={max_batch}: raise "
                             "finder_max_batch and rerun the finder first, so a size that cannot fit in RAM is "
                             "predicted from a smaller one instead of started")
    cfg = FinderConfig(start_batch=batch_size, max_batch=batch_size, steps=steps, budget_bytes=int(budget_bytes),
                       safety_margin=safety_margin, warmup=warmup, multiple_of=multiple_of, refine_steps=0)
    total = int(warmup) + int(steps)

    def counted(b: int) -> Callable[[], Any]:
        step = make_step(b)
        calls = [0]

        def run() -> Any:
            out = step()
            calls[0] += 1
            progress(min(calls[0], total), total)
            return out

        return run

    found = find_batch_size(counted, acc, cfg)
    row = found.frame.iloc[0]
    if row["status"] == "oom":
        raise ParameterError(f"batch_size={batch_size} ran out of device memory ({row['error']}); the memory was "
                             "released and the kernel keeps running: pick a smaller batch")
    return live_point(row, is_cpu=acc.is_cpu, budget_bytes=int(budget_bytes))


# -- the notebook's declaration, found by helpers.experiments.registry ------------------------------------

EXPERIMENT = Experiment(
    item=Item("09", "09_memory_and_batch_size", "memory and batch size",
         "Measure memory per step and find the largest batch that fits",
         "Allocated, reserved and peak memory per step; the largest batch that fits with a margin"),
    spec=specs.COMMON + specs.DATA + specs.batch("samples per step of the memory trace") + specs.training(
        "training steps of the memory trace, and of each side of the current-vs-best batch comparison") + (
        Param("memory_budget_mib", int, 0,
              "memory the batch-size finder may use, MiB (0: the device's free memory; on CPU half the available RAM)",
              minimum=0, maximum=1 << 24),
        Param("finder_start_batch", int, 8, "first batch size the finder tries", minimum=1, maximum=1 << 20),
        Param("finder_max_batch", int, 256, "largest batch size the finder tries", minimum=1, maximum=1 << 20),
        Param("finder_steps", int, 3, "timed training steps per batch size tried", minimum=1, maximum=1000),
        Param("safety_margin", float, 0.10, "fraction of memory kept free when choosing the batch size",
              minimum=0.0, maximum=0.9),
        Param("alloc_conf_list", list, ["", "expandable_segments:True"],
              "allocator settings to compare on cuda/npu (PYTORCH_CUDA_ALLOC_CONF / PYTORCH_NPU_ALLOC_CONF)",
              item_kind=str),
    ) + specs.JOB,
)
