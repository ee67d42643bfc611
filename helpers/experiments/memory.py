"""Notebook 09's experiment: memory per step of a Job, allocator settings in child processes, the batch-size finder.

:func:`plan` checks the allocator settings and loads the job (the user's, or the built-in one) before any work;
:func:`run` measures everything and returns one :class:`MemoryResult`, whose text methods the notebook prints and
whose records and verdict ``ctx.record(result)`` writes. The parts:

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

Where the parts live (imported here, where notebooks and tests find them): the batch-size finder
(:func:`find_batch_size`, :class:`FinderConfig`, :class:`FinderResult`, :func:`resolve_budget_bytes`) in
:mod:`helpers.compute.batch_finder`; what the result's cells print in :mod:`helpers.experiments.memory_text`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping

import pandas as pd
import torch

from helpers import specs
from helpers.checklist import Item
from helpers.compute.batch_finder import FinderConfig, FinderResult, find_batch_size, resolve_budget_bytes
from helpers.compute.memory import (
    MIB,
    alloc_conf_var,
    check_alloc_conf,
    check_alloc_conf_list,
    measure_empty_cache,
    trace_memory,
)
from helpers.conditions import held, ran_with, sides
from helpers.device import Accelerator, get_accelerator
from helpers.errors import ParameterError
from helpers.experiments.base import Experiment, ExperimentResult
from helpers.experiments.memory_text import CPU_ALLOCATOR_WHY, MemoryResultTexts, _allocator_row
from helpers.jobs.base import close_dataset
from helpers.jobs.load import JobRequest
from helpers.live import Knob, LivePoint, Progress, TrySpec, no_progress
from helpers.params import Param
from helpers.results import Records
from helpers.timing import Comparison, compare
from helpers.verdict import Action, Verdict

__all__ = ["TraceConfig", "POOL_IMAGES", "job_step_factory", "run_alloc_conf_child", "FinderConfig", "FinderResult",
           "resolve_budget_bytes", "find_batch_size", "live_point", "try_batch_size", "verdict", "MemoryPlan",
           "MemoryResult", "plan", "run"]

#: Variables removed from a child's environment so that only the setting under
#: test is in effect (torch 2.13 gives ``PYTORCH_ALLOC_CONF`` priority over
#: ``PYTORCH_CUDA_ALLOC_CONF``; torch_npu exits when it and
#: ``PYTORCH_NPU_ALLOC_CONF`` are both set).
_CONFLICTING_VARS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_NPU_ALLOC_CONF",
                     "PYTORCH_HIP_ALLOC_CONF")

#: Marker before the child's JSON result on its stdout.
_RESULT_MARK = "@@MEMORY_RESULT@@"


@dataclass(frozen=True, kw_only=True)
class TraceConfig(JobRequest):
    """What the allocator-settings child runs: a :class:`helpers.jobs.load.JobRequest` (the user's job, or the
    built-in one at any batch size: its images are decoded once) with the device and the trace's lengths, as flat
    JSON-able fields.

    Attributes
    ----------
    device : str
        "cpu", "cuda" or "npu".
    steps : int
        Traced steps.
    warmup_steps : int
        Steps before the trace.
    empty_cache_repeats : int
        Rounds of :func:`measure_empty_cache` (0: skip).
    spec, factory_defaults, data_dir, max_images, seed, batch_size, image_size, text_len, model_width, d_model
        The job, as :class:`helpers.jobs.load.JobRequest`'s.
    """

    device: str
    steps: int = 8
    warmup_steps: int = 1
    empty_cache_repeats: int = 2
    any_batch_size: bool = True

    @classmethod
    def of(cls, device: str, request: JobRequest, **kwargs: Any) -> "TraceConfig":
        """The config of ``request``'s job on ``device`` (``kwargs``: ``steps``, ``warmup_steps``, ...)."""
        return cls(**{**asdict(request), "any_batch_size": True}, device=device, **kwargs)


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
    if not job.has_batched_pipeline:  # a user's job: each size's batches drawn from its own dataset
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
    """The job of a :class:`TraceConfig`: the user's (``cfg.spec``), or the built-in one (any batch size: the
    images are only decoded once)."""
    return cfg.job()


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
        cfg = TraceConfig.from_dict(json.loads(argv[0]))
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
    cur, budget_mib = current, found.budget_bytes / MIB
    if found.chosen is None:
        recommendation, value, unit, target = "leave off", None, "samples", cur
        reason = (f"lower the batch below {start_batch} or raise memory_budget_mib: no batch size from {start_batch} "
                  f"fitted within {found.limit_bytes / MIB:.0f} MiB (budget {budget_mib:.0f} MiB, "
                  f"{safety_margin:.0%} margin); {found.stop_reason}")
    else:
        value = float(found.chosen)
        unit = "samples or more (no limit found up to finder_max_batch)" if found.reached_max else "samples"
        recommendation, target, reason = _batch_decision(
            found, current=cur, best=best, gain=gain, finder_throughput=finder_throughput,
            safety_margin=safety_margin, used_name=used_name, steps=steps, finder_steps=finder_steps)
    extra = {"best_throughput_batch": best, "reached_max": found.reached_max, "budget_set_by_parameter": budget_set}
    if budget_set:
        # a budget given as a parameter (a profile's demonstration budget) is not this machine's memory: what the
        # finder found within it is a demonstration of the back-off, never an action for this machine
        reason = (f"demonstration budget {budget_mib:,.0f} MiB: {reason}; budget {budget_why}; a demonstration, not "
                  f"a batch size for this machine: run with memory_budget_mib=0 (the default) to size the batch "
                  f"from its free memory")
        extra.update(demonstration=True, measured_recommendation=recommendation,
                     demonstration_batch_size=int(target) if recommendation == "enable" else cur)
        return Verdict(notebook=NOTEBOOK, metric="max_batch_size", value=value, unit=unit,
                       recommendation="not applicable", reason=reason, context=context, action=None, extra=extra)
    if recommendation == "enable":
        action = Action("batch_size", int(target), f"batch size {cur} → {int(target)}", current=cur)
    else:
        action = Action("batch_size", cur, f"batch size: keep {cur}", current=cur)
    return Verdict(notebook=NOTEBOOK, metric="max_batch_size", value=value, unit=unit, recommendation=recommendation,
                   reason=reason, context=context, action=action, extra=extra)


def _batch_decision(found: FinderResult, *, current: int, best: int | None,
                    gain: tuple[float, float, float] | None, finder_throughput: dict, safety_margin: float,
                    used_name: str, steps: int, finder_steps: int) -> tuple[str, int, str]:
    """:func:`verdict`'s decision where a size fitted: (recommendation, target batch, reason)."""
    chosen, cur = found.chosen, current
    ch = found.frame[found.frame.batch == chosen].iloc[0]
    mem_txt = (f"largest batch that fits: {found.largest_fit_text()}, {used_name} {ch.peak_mib:.0f} MiB of the "
               f"{found.budget_bytes / MIB:,.0f} MiB budget ({safety_margin:.0%} kept free)")
    if cur > chosen and not found.reached_max:
        target = best if best is not None and best <= chosen else chosen
        return "enable", target, (f"lower the batch to {target}: the current {cur} does not fit the budget with the "
                                  f"margin; {mem_txt}")
    if gain is not None and gain[1] > 1.0 and gain[0] >= GAIN_THRESHOLD:
        verb = "raise" if best > cur else "lower"
        return "enable", best, (f"{verb} the batch to {best}: {gain[0]:.2f}x the throughput of the current {cur} "
                                f"(95% CI {gain[1]:.2f}-{gain[2]:.2f}, {steps} interleaved steps each); {mem_txt}")
    if best is None or best == cur:
        why = f"it had the highest throughput of the sizes tried ({finder_steps} steps each, no interval)"
    elif gain is None:
        why = (f"it is above the largest size tried ({chosen}), so it was not compared with batch {best}, "
               f"the best of those ({finder_throughput[best]:.1f} samples/s, {finder_steps} steps, no interval)")
    else:
        why = (f"batch {best} had the highest finder throughput ({finder_throughput[best]:.1f} vs "
               f"{finder_throughput.get(cur, float('nan')):.1f} samples/s, {finder_steps} steps each, no "
               f"interval), but interleaved it gives {gain[0]:.2f}x (95% CI {gain[1]:.2f}-{gain[2]:.2f}, "
               f"{steps} steps each): not a measured gain")
    return "leave off", cur, f"keep batch {cur}: {why}; {mem_txt}"


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


# --------------------------------------------------------------------------- the notebook's experiment: one result

@dataclass(frozen=True, eq=False)
class MemoryResult(MemoryResultTexts, ExperimentResult):
    """Notebook 09's measurement: memory per step, the allocator settings, the batch-size finder and the
    current-vs-best comparison.

    Attributes
    ----------
    device_kind, device_name : str
        The accelerator (``acc.kind``, ``acc.name``).
    is_cpu : bool
        Measured on a CPU (process memory, no allocator settings).
    what : str
        The training step measured, in words (the verdict's context).
    batch_note : str
        The batch sizes this job can take (a PPO batch is a whole number of rollouts).
    multiple_of : int
        Every size tried is a multiple of this (:attr:`helpers.jobs.base.Job.batch_multiple`).
    batch_size, steps, finder_steps : int
        The batch in use, the trace's and the comparison's steps, the finder's timed steps per size.
    safety_margin : float
    budget_set : bool
        The budget was set by ``memory_budget_mib`` (a demonstration, not this machine's memory).
    alloc_confs : tuple of str
        The validated allocator settings.
    alloc_conf_var : str or None
        Their variable on this device (None on a CPU).
    trace : pandas.DataFrame
        :func:`helpers.compute.memory.trace_memory` of the batch in use.
    allocator : tuple of dict
        :func:`run_alloc_conf_child`'s result per setting (empty on a CPU).
    budget_bytes : int
    budget_why : str
    finder : FinderConfig
    found : FinderResult
    best : int or None
        The finder's highest-throughput size that fits.
    comparison : helpers.timing.Comparison or None
        ``batch_size`` (A) against ``best`` (B), interleaved; None when not compared (:attr:`compare_note` says
        why).
    compare_note : str
    make_step : callable
        ``make_step(batch_size) -> step`` (:func:`job_step_factory`), for the "try it" panel.
    ran : dict or None
        :func:`helpers.conditions.ran_with` over the finder and the comparison: the torch threads every size
        stepped with (``batch_size`` None: the batch is what the finder changes); None where not stated.
    """

    device_kind: str
    device_name: str
    is_cpu: bool
    what: str
    batch_note: str
    multiple_of: int
    batch_size: int
    steps: int
    finder_steps: int
    safety_margin: float
    budget_set: bool
    alloc_confs: tuple
    alloc_conf_var: str | None
    trace: pd.DataFrame
    allocator: tuple
    budget_bytes: int
    budget_why: str
    finder: FinderConfig
    found: FinderResult
    best: int | None
    comparison: Comparison | None
    compare_note: str
    make_step: Callable[[int], Callable[[], Any]] = field(repr=False)
    ran: Mapping[str, Any] | None = None

    # -- derived figures (what the cells print: MemoryResultTexts) -------------------------------

    @property
    def used_name(self) -> str:
        """What the finder measures per size: ``"RSS growth"`` (CPU) or ``"peak"``."""
        return "RSS growth" if self.is_cpu else "peak"

    @property
    def gain(self) -> tuple[float, float, float] | None:
        """Throughput of :attr:`best` over the current batch (ratio, ci_low, ci_high), None when not compared."""
        c = self.comparison
        if c is None:
            return None
        scale = self.best / self.batch_size  # time ratio per step -> throughput ratio (samples per step differ)
        return c.ratio * scale, c.ci_low * scale, c.ci_high * scale

    @property
    def finder_throughput(self) -> dict:
        """Batch size -> samples/s measured by the finder (no interval)."""
        return dict(zip(self.found.frame.batch, self.found.frame.throughput))

    # -- records, verdict and the panel ----------------------------------------------------------

    def records(self) -> Records:
        """The memory trace, the allocator settings, each finder size and the current-vs-best ratio; in order. Each
        finder size and both sides of the ratio state the torch threads and batch they ran with; the ratio names the
        batch as its change (``changes``: :func:`helpers.conditions.sides`), the only setting its sides differ in."""
        out = Records()
        self._trace_records(out)
        self._allocator_records(out)
        threads = {k: v for k, v in (self.ran or {}).items() if k == "torch_threads"}
        for row in self.found.frame.to_dict("records"):
            out.add("batch_size_finder", f"batch {row['batch']}", "throughput", _finite(row["throughput"]),
                    "samples/s", repeats=self.finder_steps, batch=int(row["batch"]), status=row["status"],
                    phase=row["phase"], peak_mib=_finite(row["peak_mib"]), error=row["error"], **threads,
                    batch_size=int(row["batch"]))
        c, gain = self.comparison, self.gain
        if c is not None:
            alike = sides({**threads, "batch_size": self.batch_size}, {**threads, "batch_size": self.best},
                          changes=["batch_size"])
            out.add("batch_size_finder", f"batch {self.best} vs batch {self.batch_size}", "throughput_ratio", gain[0],
                    "x", repeats=self.steps, spread={"ci_low": gain[1], "ci_high": gain[2], "confidence": c.confidence},
                    current_rate=c.a.rate, best_rate=c.b.rate, interleaved=True, **alike)
        return out

    def _trace_records(self, out: Records) -> None:
        trace, variant = self.trace, f"batch {self.batch_size}"
        if trace["source"].iloc[0] == "device":
            for metric, col in (("allocated", "allocated_mib"), ("reserved", "reserved_mib"), ("peak", "peak_mib")):
                out.add("memory_trace", variant, metric, float(trace[col].max()), "MiB", repeats=len(trace),
                        source="device allocator")
            out.add("memory_trace", variant, "fragmentation", float(trace.iloc[-1].fragmentation), "fraction",
                    source="device allocator")
            return
        for metric, col in (("rss", "rss_mib"), ("uss", "uss_mib"), ("peak_rss_sampled", "peak_mib")):
            out.add("memory_trace", variant, metric, float(trace[col].max()), "MiB", repeats=len(trace),
                    source="process (CPU)")

    def _allocator_records(self, out: Records) -> None:
        if self.is_cpu:
            out.add("allocator", "alloc_conf", "peak_reserved", None, "MiB", recommendation="not applicable",
                    reason=CPU_ALLOCATOR_WHY)
            out.add("allocator", "empty_cache", "empty_cache_time", None, "ms", recommendation="not applicable",
                    reason=CPU_ALLOCATOR_WHY)
            return
        for res in self.allocator:
            label = res["alloc_conf"] or "(defaults)"
            if not res["ok"]:
                out.add("allocator", label, "peak_reserved", None, "MiB", reason=f"child failed: {res['error']}")
                continue
            row = _allocator_row(res)
            out.add("allocator", label, "peak_reserved", float(row["reserved_mib"]), "MiB",
                    variable=self.alloc_conf_var, fragmentation=float(row["fragmentation"]))
            if "empty_cache_ms" in row:
                out.add("allocator", label, "empty_cache_time", float(row["empty_cache_ms"]), "ms",
                        reserved_freed_mib=float(row["reserved_freed_mib"]),
                        next_step_extra_ms=float(row["next_step_extra_ms"]))

    def verdict(self) -> Verdict:
        """Notebook 09's verdict (:func:`verdict`) with :attr:`context`."""
        return verdict(self.found, current=self.batch_size, best=self.best, gain=self.gain,
                       finder_throughput=self.finder_throughput, budget_why=self.budget_why,
                       budget_set=self.budget_set, safety_margin=self.safety_margin, used_name=self.used_name,
                       steps=self.steps, finder_steps=self.finder_steps, start_batch=self.finder.start_batch,
                       context=self.context)

    def try_it(self, acc: "Accelerator", params: Mapping[str, Any]) -> TrySpec:
        """The "try it" panel: one batch size measured as the finder measured each (:func:`try_batch_size`),
        beside the finder's own row at the batch in use.

        The knob offers the multiples of :attr:`multiple_of` up to the finder's largest size that are powers of
        two times it, the sizes the finder tried and the batch in use; it starts at the batch in use.
        """
        cfg, h, frame = self.finder, self.multiple_of, self.found.frame
        start = min(self.batch_size, cfg.max_batch)
        sizes = {h << k for k in range(32) if h << k <= cfg.max_batch} | {cfg.max_batch // h * h, start}
        sizes |= {int(b) for b in frame.batch if b <= cfg.max_batch and b % h == 0}
        here = frame[(frame.batch == self.batch_size) & frame.peak_mib.notna()]  # the finder's row at the batch in use
        reference = live_point(here.iloc[0], is_cpu=self.is_cpu, budget_bytes=self.budget_bytes) if len(here) else None
        make_step, budget, margin, steps, warmup = (self.make_step, self.budget_bytes, self.safety_margin,
                                                    self.finder_steps, cfg.warmup)
        return TrySpec(f"{self.used_name} and throughput at one batch size",
                       lambda progress, batch_size: try_batch_size(
                           make_step, acc, batch_size=batch_size, budget_bytes=budget, safety_margin=margin,
                           steps=steps, warmup=warmup, multiple_of=h, max_batch=cfg.max_batch, progress=progress),
                       {"batch_size": Knob(tuple((str(b), b) for b in sorted(sizes)), start, "batch_size")},
                       reference=reference)


def _gain_comparison(make_step: Callable[[int], Callable[[], Any]], acc: "Accelerator", found: FinderResult, *,
                     current: int, steps: int, finder_steps: int) -> tuple[int | None, Comparison | None, str]:
    """The finder's highest-throughput fitting size, and it against ``current`` interleaved over ``steps`` steps
    each (or why they were not compared: none fitted, the current one is above the largest that did, or it is the
    best one)."""
    frame = found.frame
    fitting = frame[(frame.status == "fits") & frame.throughput.notna()]
    best = int(fitting.loc[fitting.throughput.idxmax(), "batch"]) if len(fitting) else None
    tp = dict(zip(frame.batch, frame.throughput))
    if best is None:
        return None, None, "no size fitted: nothing to compare"
    if found.chosen is None or current > found.chosen:
        return best, None, (f"the current batch {current} is above the largest size that fitted or was tried "
                            f"({found.chosen}): not run again (it could run out of memory)")
    if best == current:
        return best, None, (f"the current batch {current} had the highest finder throughput ({tp[current]:.1f} "
                            f"samples/s, {finder_steps} steps, no interval): nothing to compare")
    step_cur, step_best = make_step(current), make_step(best)
    c = compare(step_cur, step_best, repeats=steps, warmup=1, sync=None if acc.is_cpu else acc.synchronize,
                names=(f"batch {current}", f"batch {best}"), items_per_call=(current, best))
    return best, c, ""


@dataclass(frozen=True, eq=False)
class MemoryPlan:
    """What notebook 09 checks before any work: the allocator settings (all valid) and the job it measures.

    Attributes
    ----------
    alloc_confs : tuple of str
        The settings, validated (:func:`helpers.compute.memory.check_alloc_conf_list`).
    job : helpers.jobs.base.Job
        The user's job (at its own batch size) or the built-in one (at any batch size).
    job_spec : str
        The user's job spec as given ("" for the built-in job).
    """

    alloc_confs: tuple
    job: Any = field(repr=False)
    job_spec: str = ""

    @property
    def batch_note(self) -> str:
        """The batch sizes the job takes, in words."""
        if self.job.is_builtin:
            return f"batch sizes are multiples of the PPO horizon ({self.job.batch_multiple})"
        return f"your job ({self.job_spec}): any batch size"

    def text(self) -> str:
        """The allocator settings to compare (all valid) and the batch sizes the job takes."""
        return (f"allocator settings to compare: {[c or '(defaults)' for c in self.alloc_confs]}, all valid\n"
                f"{self.batch_note}")


def plan(ctx: Any) -> MemoryPlan:
    """Check the allocator settings and load the job, before any work.

    Parameters
    ----------
    ctx : helpers.workbook.nbsetup.NotebookContext
        With ``job`` set, the user's job (``ctx.job()``: ``params["batch_size"]`` then says its own batch), else
        the built-in PPO job at any batch size (its images are decoded once into a pool).

    Raises
    ------
    helpers.errors.ParameterError
        An invalid allocator setting (an unknown key, a bad value), before the job is loaded.
    """
    P, acc = ctx.params, ctx.acc
    alloc_confs = tuple(check_alloc_conf_list(P["alloc_conf_list"], acc.kind))
    request = JobRequest.from_params(P, any_batch_size=True)
    return MemoryPlan(alloc_confs, ctx.job() if request.spec else request.job(), str(P.get("job") or ""))


def run(ctx: Any, plan_: MemoryPlan | None = None) -> MemoryResult:
    """Notebook 09's experiment, in the notebook's order: memory per step of the batch in use, each allocator
    setting in a child process (not on a CPU), the batch-size finder and the throughput-best size against the
    current one.

    Parameters
    ----------
    ctx : helpers.workbook.nbsetup.NotebookContext
        The notebook's parameters and accelerator.
    plan_ : MemoryPlan, optional
        :func:`plan`'s (made here when not given).

    Returns
    -------
    MemoryResult

    Raises
    ------
    helpers.errors.ParameterError
        As :func:`plan`, or finder sizes out of range.
    """
    plan_ = plan_ if plan_ is not None else plan(ctx)
    P, acc, job, alloc_confs = ctx.params, ctx.acc, plan_.job, plan_.alloc_confs
    cur, horizon = int(P["batch_size"]), job.batch_multiple
    make_step = job_step_factory(job, acc)  # at most POOL_IMAGES images, decoded once
    step = make_step(cur)
    for _ in range(P["warmup_steps"]):
        step()
    trace = trace_memory(step, acc, P["steps"])
    del step
    cfg = TraceConfig.of(acc.kind, JobRequest.from_params(P, any_batch_size=True), steps=P["steps"],
                         warmup_steps=P["warmup_steps"])
    allocator = () if acc.is_cpu else tuple(run_alloc_conf_child(c, cfg, timeout_s=300) for c in alloc_confs)
    budget_bytes, budget_why = resolve_budget_bytes(P["memory_budget_mib"], acc)
    start_b = max(min(P["finder_start_batch"], cur), horizon)  # the range holds the batch in use
    fcfg = FinderConfig(start_batch=start_b, max_batch=max(P["finder_max_batch"], start_b, cur),
                        steps=P["finder_steps"], budget_bytes=budget_bytes, safety_margin=P["safety_margin"],
                        warmup=1, multiple_of=horizon, refine_steps=2)
    ran = ran_with(None)  # the finder changes the batch; the threads are read as it starts, held to the comparison's end
    found = find_batch_size(make_step, acc, fcfg)
    best, comparison, note = _gain_comparison(make_step, acc, found, current=cur, steps=P["steps"],
                                              finder_steps=P["finder_steps"])
    ran = held(ran)
    w = job.workload
    what = (f"PPO step (rollout + {job.backward_passes} updates) of a {w.model_width}-channel conv + d_model "
            f"{w.d_model} policy, {w.image_size} px" if job.is_builtin else f"your job's training step ({P['job']})")
    return MemoryResult(device_kind=acc.kind, device_name=acc.name, is_cpu=acc.is_cpu, what=what,
                        batch_note=plan_.batch_note, multiple_of=horizon, batch_size=cur, steps=P["steps"],
                        finder_steps=P["finder_steps"],
                        safety_margin=P["safety_margin"], budget_set=P["memory_budget_mib"] > 0,
                        alloc_confs=tuple(alloc_confs), alloc_conf_var=alloc_conf_var(acc.kind), trace=trace,
                        allocator=allocator, budget_bytes=budget_bytes, budget_why=budget_why, finder=fcfg,
                        found=found, best=best, comparison=comparison, compare_note=note, make_step=make_step,
                        ran=ran)


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
