"""Memory over a training run, allocator settings, and a batch-size finder (notebook 09).

Three tools:

- :func:`trace_memory` runs a training step repeatedly and records, per step,
  what the device's caching allocator holds (allocated, reserved, the step's
  peak, fragmentation = 1 - allocated/reserved) through
  :meth:`helpers.device.Accelerator.memory_stats` (``torch.accelerator.memory``
  in torch 2.13). A CPU has no caching allocator: there the trace reports the
  process's resident memory (RSS/USS from psutil) and the step's peak RSS as
  seen by a light sampling thread (:class:`RssPeakSampler`), a lower bound of
  the true peak, said in the frame's ``source`` column (``"process"``).
- :func:`run_alloc_conf_child` runs the trace in a **child process** with one
  allocator setting (``PYTORCH_CUDA_ALLOC_CONF`` on cuda,
  ``PYTORCH_NPU_ALLOC_CONF`` on npu), because the allocator reads its
  configuration once, before the first device allocation (torch 2.13
  ``c10/core/AllocatorConfig.h``: ``PYTORCH_ALLOC_CONF`` is the primary name,
  ``PYTORCH_CUDA_ALLOC_CONF`` is read with lower priority; torch_npu refuses
  ``PYTORCH_NPU_ALLOC_CONF`` and ``PYTORCH_ALLOC_CONF`` together,
  ``docs/ascend_api_factcheck.md``). Every value is checked first with
  :func:`helpers.diagnose.envcatalog.validate_value`.
  :func:`measure_empty_cache` shows what ``empty_cache`` frees and costs.
- :func:`find_batch_size` doubles the batch until it runs out of memory (a
  real device OOM, or on a CPU the memory budget exceeded by the measured
  peak, raised inside the finder as :class:`MemoryBudgetExceeded`), recovers,
  optionally bisects, and chooses the largest batch that leaves
  ``safety_margin`` of the budget free.

Run as ``python -m helpers.compute.memory '<json config>'`` it is the child
process of :func:`run_alloc_conf_child` and prints one JSON line.
"""

from __future__ import annotations

import gc
import json
import logging
import math
import os
import subprocess
import sys
import threading
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from helpers.errors import ParameterError

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from helpers.device import Accelerator

logger = logging.getLogger(__name__)

__all__ = [
    "MIB",
    "ALLOC_CONF_VAR",
    "RssPeakSampler",
    "MemoryBudgetExceeded",
    "is_oom",
    "trace_memory",
    "alloc_conf_var",
    "check_alloc_conf",
    "check_alloc_conf_list",
    "measure_empty_cache",
    "TraceConfig",
    "ppo_step_factory",
    "run_alloc_conf_child",
    "FinderConfig",
    "FinderResult",
    "resolve_budget_bytes",
    "find_batch_size",
]

#: Bytes in a MiB.
MIB = 1024 * 1024
GIB = 1024 * MIB

#: Environment variable each device's caching allocator reads (torch 2.13
#: ``c10/cuda/CUDAAllocatorConfig.h``; torch_npu ``NPUAllocatorConfig.cpp``;
#: ``docs/ascend_api_factcheck.md`` "PYTORCH_NPU_ALLOC_CONF").
ALLOC_CONF_VAR: dict[str, str] = {"cuda": "PYTORCH_CUDA_ALLOC_CONF", "npu": "PYTORCH_NPU_ALLOC_CONF"}

#: Variables removed from a child's environment so that only the setting under
#: test is in effect (torch 2.13 gives ``PYTORCH_ALLOC_CONF`` priority over
#: ``PYTORCH_CUDA_ALLOC_CONF``; torch_npu exits when it and
#: ``PYTORCH_NPU_ALLOC_CONF`` are both set).
_CONFLICTING_VARS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_NPU_ALLOC_CONF",
                     "PYTORCH_HIP_ALLOC_CONF")

#: Marker before the child's JSON result on its stdout.
_RESULT_MARK = "@@MEMORY_RESULT@@"


# --------------------------------------------------------------------------
# process memory (CPU)


def _rss_bytes() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


class RssPeakSampler:
    """Track the peak resident set size (RSS) of this process while a block runs.

    A background thread reads RSS every ``interval_s`` seconds. The peak it
    reports is the largest value *seen*: a lower bound of the true peak (a
    spike shorter than the interval can be missed). The process's lifetime
    peak (``getrusage`` ``ru_maxrss``) cannot be reset, so it cannot give a
    per-step peak.

    Parameters
    ----------
    interval_s : float, default 0.002
        Seconds between reads (> 0).

    Attributes
    ----------
    start_bytes, peak_bytes, end_bytes : int
        RSS when the block started, the largest RSS seen, RSS when it ended.
    samples : int
        Reads taken.

    Examples
    --------
    >>> with RssPeakSampler() as s:          # doctest: +SKIP
    ...     work()
    >>> s.peak_bytes - s.start_bytes         # doctest: +SKIP
    """

    def __init__(self, interval_s: float = 0.002) -> None:
        if not isinstance(interval_s, (int, float)) or not interval_s > 0:
            raise ParameterError(f"interval_s must be a number > 0 (seconds), got {interval_s!r}")
        self.interval_s = float(interval_s)
        self.start_bytes = 0
        self.peak_bytes = 0
        self.end_bytes = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        import psutil

        proc = psutil.Process()
        while not self._stop.is_set():
            rss = int(proc.memory_info().rss)
            self.samples += 1
            if rss > self.peak_bytes:
                self.peak_bytes = rss
            self._stop.wait(self.interval_s)

    def __enter__(self) -> "RssPeakSampler":
        self.start_bytes = self.peak_bytes = _rss_bytes()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="rss-peak-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.end_bytes = _rss_bytes()
        self.peak_bytes = max(self.peak_bytes, self.end_bytes)


# --------------------------------------------------------------------------
# out of memory


class MemoryBudgetExceeded(RuntimeError):
    """Raised inside :func:`find_batch_size` when a batch's measured peak exceeds the budget.

    It stands in for a device out-of-memory where there is none (the CPU), so
    the finder handles both the same way. It never escapes the finder.

    Parameters
    ----------
    batch : int
        The batch size that went over.
    used_bytes, budget_bytes : int
        The measured peak and the budget, in bytes.
    """

    def __init__(self, batch: int, used_bytes: int, budget_bytes: int, what: str = "peak") -> None:
        self.batch = batch
        self.used_bytes = used_bytes
        self.budget_bytes = budget_bytes
        super().__init__(
            f"batch {batch}: measured {what} {used_bytes / MIB:.1f} MiB exceeds the memory budget "
            f"{budget_bytes / MIB:.1f} MiB"
        )


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` means "out of memory".

    True for ``torch.OutOfMemoryError`` (CUDA, and torch_npu versions that
    raise it), :class:`MemoryBudgetExceeded`, Python's ``MemoryError``, and a
    ``RuntimeError`` whose message contains "out of memory" (older torch_npu
    raise ``RuntimeError: NPU out of memory. Tried to allocate ...``) or
    "not enough memory" (c10's CPU allocator: "DefaultCPUAllocator: not
    enough memory").

    Parameters
    ----------
    exc : BaseException

    Returns
    -------
    bool
    """
    if isinstance(exc, (MemoryBudgetExceeded, MemoryError)):
        return True
    try:
        import torch

        if isinstance(exc, torch.OutOfMemoryError):
            return True
    except (ImportError, AttributeError):  # pragma: no cover - torch always there in practice
        pass
    if isinstance(exc, RuntimeError):
        text = str(exc).lower()
        return "out of memory" in text or "not enough memory" in text
    return False


def _malloc_trim() -> None:
    """Hand freed heap memory back to the OS (glibc ``malloc_trim(0)``), so RSS reflects what is in use.

    Without it glibc keeps freed arenas mapped and a smaller batch run after a
    larger one would be charged the larger one's RSS. A no-op where glibc is
    not the C library.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError) as exc:  # musl, or no libc.so.6
        logger.debug("malloc_trim not available: %r", exc)


def _release(acc: "Accelerator | None") -> None:
    """Free what can be freed (after each size, and after an OOM): collect garbage, empty the device cache.

    On a CPU, also :func:`_malloc_trim`.
    """
    gc.collect()
    if acc is None or acc.is_cpu:
        _malloc_trim()
    if acc is not None and not acc.is_cpu:
        import torch

        mem = getattr(torch.accelerator, "memory", None)
        (mem.empty_cache if mem is not None else torch.get_device_module(acc.kind).empty_cache)()


# --------------------------------------------------------------------------
# the per-step trace


def trace_memory(step: Callable[[], Any], acc: "Accelerator", steps: int, *,
                 sample_interval_s: float = 0.005) -> "pd.DataFrame":
    """Run ``step`` ``steps`` times and record memory after each.

    On a device with a caching allocator: before each step the peak counter
    is reset (:meth:`Accelerator.reset_peak_memory_stats`); after it (device
    synchronized) allocated, reserved and the step's peak are read. On a CPU:
    the process's RSS and USS after the step and the largest RSS seen during
    it by :class:`RssPeakSampler` (a lower bound).

    Parameters
    ----------
    step : callable
        One training step, no arguments; its result is dropped after the step.
    acc : helpers.device.Accelerator
    steps : int
        Steps to run (>= 1).
    sample_interval_s : float, default 0.005
        RSS sampling interval on a CPU, seconds.

    Returns
    -------
    pandas.DataFrame
        One row per step: ``step`` (1-based), ``source`` ("device" or
        "process"), ``allocated_mib``, ``reserved_mib``, ``peak_mib`` (the
        step's peak: allocated on a device, sampled RSS on a CPU),
        ``fragmentation`` (1 - allocated/reserved; NaN on a CPU or when
        nothing is reserved), ``rss_mib``, ``uss_mib`` (NaN on a device).
        MiB = 2**20 bytes.

    Raises
    ------
    ParameterError
        If ``steps`` < 1 or ``step`` is not callable.
    """
    import pandas as pd

    if not callable(step):
        raise ParameterError(f"step must be callable, got {type(step).__name__}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ParameterError(f"steps must be an int >= 1, got {steps!r}")
    nan = float("nan")
    rows = []
    for i in range(1, steps + 1):
        if acc.is_cpu:
            with RssPeakSampler(sample_interval_s) as sampler:
                out = step()
                del out
            snap = acc.memory_stats()
            rows.append({"step": i, "source": "process", "allocated_mib": nan, "reserved_mib": nan,
                         "peak_mib": sampler.peak_bytes / MIB, "fragmentation": nan,
                         "rss_mib": snap["rss_bytes"] / MIB, "uss_mib": snap["uss_bytes"] / MIB})
        else:
            acc.synchronize()
            acc.reset_peak_memory_stats()
            out = step()
            acc.synchronize()
            del out
            snap = acc.memory_stats()
            frag = snap["fragmentation"]
            rows.append({"step": i, "source": "device", "allocated_mib": snap["allocated_bytes"] / MIB,
                         "reserved_mib": snap["reserved_bytes"] / MIB,
                         "peak_mib": snap["peak_allocated_bytes"] / MIB,
                         "fragmentation": nan if frag is None else float(frag),
                         "rss_mib": nan, "uss_mib": nan})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------
# allocator settings


def alloc_conf_var(kind: str) -> str | None:
    """The allocator-settings variable of device ``kind``, or None where there is none (cpu).

    Parameters
    ----------
    kind : str
        "cpu", "cuda" or "npu".

    Returns
    -------
    str or None
        ``PYTORCH_CUDA_ALLOC_CONF`` for cuda, ``PYTORCH_NPU_ALLOC_CONF`` for
        npu (:data:`ALLOC_CONF_VAR`), None for cpu.
    """
    return ALLOC_CONF_VAR.get(kind)


def check_alloc_conf(value: str, kind: str) -> list:
    """Validate one allocator setting for device ``kind`` with the environment catalog.

    Parameters
    ----------
    value : str
        e.g. ``"expandable_segments:True"``; ``""`` means the defaults.
    kind : str
        "cuda" or "npu" (for "cpu" the value is still checked, against the
        CUDA variable's rules, so a typo is caught on every machine).

    Returns
    -------
    list of helpers.diagnose.envcatalog.Finding
        Warnings and "ok" findings (empty for ``""``).

    Raises
    ------
    ParameterError
        If ``value`` is not a str, or the catalog finds an error (unknown key,
        bad value, forbidden combination); the message has the catalog's
        message and fix.
    """
    from helpers.diagnose.envcatalog import validate_value

    if not isinstance(value, str):
        raise ParameterError(f"an allocator setting must be a string like 'expandable_segments:True', "
                             f"got {type(value).__name__} {value!r}")
    if not value.strip():
        return []
    var = alloc_conf_var(kind) or ALLOC_CONF_VAR["cuda"]
    findings = validate_value(var, value, npu=(kind == "npu"))
    errors = [f for f in findings if f.severity == "error"]
    if errors:
        detail = "; ".join(f"{f.message} (fix: {f.fix})" if f.fix else f.message for f in errors)
        raise ParameterError(f"allocator setting {value!r} is invalid for {var}: {detail}")
    return findings


def check_alloc_conf_list(values: Any, kind: str) -> list[str]:
    """Validate every setting of ``values`` before any work (see :func:`check_alloc_conf`).

    Returns
    -------
    list of str
        The settings, whitespace-stripped, duplicates removed, order kept.

    Raises
    ------
    ParameterError
        If ``values`` is not a list of str or any setting is invalid.
    """
    if not isinstance(values, (list, tuple)):
        raise ParameterError(f"alloc_conf_list must be a list of strings, got {type(values).__name__}")
    out: list[str] = []
    for v in values:
        check_alloc_conf(v, kind)
        v = "".join(v.split())
        if v not in out:
            out.append(v)
    return out


def measure_empty_cache(step: Callable[[], Any], acc: "Accelerator", *, repeats: int = 3,
                        steady_steps: int = 2) -> "pd.DataFrame | None":
    """What ``empty_cache()`` frees and what it costs, on a device with a caching allocator.

    For each repeat: ``steady_steps`` steps (the cache is warm; the last one
    is timed as the steady step), memory read, ``empty_cache()`` timed, memory
    read, then the next step timed (it must reserve memory again). Timing with
    :class:`helpers.timing.PhaseTimer` (device synchronized around each phase).

    Parameters
    ----------
    step : callable
        One training step.
    acc : helpers.device.Accelerator
    repeats : int, default 3
        Rounds (>= 1).
    steady_steps : int, default 2
        Steps before each ``empty_cache`` (>= 1).

    Returns
    -------
    pandas.DataFrame or None
        None on a CPU (there is no device cache to empty). Otherwise one row
        per repeat: ``allocated_before_mib``, ``allocated_after_mib``,
        ``reserved_before_mib``, ``reserved_after_mib``, ``empty_cache_ms``,
        ``steady_step_ms``, ``next_step_ms``.
    """
    import pandas as pd
    import torch

    from helpers.timing import PhaseTimer

    if acc.is_cpu:
        return None
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ParameterError(f"repeats must be an int >= 1, got {repeats!r}")
    if isinstance(steady_steps, bool) or not isinstance(steady_steps, int) or steady_steps < 1:
        raise ParameterError(f"steady_steps must be an int >= 1, got {steady_steps!r}")
    mem = getattr(torch.accelerator, "memory", None)
    empty = mem.empty_cache if mem is not None else torch.get_device_module(acc.kind).empty_cache
    timer = PhaseTimer(sync=acc.synchronize)
    rows = []
    for _ in range(repeats):
        for _ in range(steady_steps - 1):
            step()
        with timer.phase("steady_step"):
            step()
        before = acc.memory_stats()
        with timer.phase("empty_cache"):
            empty()
        after = acc.memory_stats()
        with timer.phase("next_step"):
            step()
        timer.end_step()
        rows.append({"allocated_before_mib": before["allocated_bytes"] / MIB,
                     "allocated_after_mib": after["allocated_bytes"] / MIB,
                     "reserved_before_mib": before["reserved_bytes"] / MIB,
                     "reserved_after_mib": after["reserved_bytes"] / MIB})
    times = timer.frame().pivot_table(index="step", columns="phase", values="duration_s", aggfunc="sum")
    out = pd.DataFrame(rows)
    for phase in ("empty_cache", "steady_step", "next_step"):
        out[f"{phase}_ms"] = times[phase].to_numpy() * 1e3
    return out


# --------------------------------------------------------------------------
# the child process


@dataclass(frozen=True)
class TraceConfig:
    """What the allocator-settings child runs: the PPO workload of notebook 09.

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


def ppo_step_factory(cfg: TraceConfig, acc: "Accelerator", *, n_batches: int = 2
                     ) -> Callable[[int], Callable[[], Any]]:
    """Decode the photos once and return ``make_step(batch_size) -> step`` for the PPO workload.

    The images are decoded once (:func:`helpers.pipeline.prepare.prepare_data`,
    :class:`helpers.pipeline.fast.BatchedDataset`) into a host pool of uint8
    images. ``make_step(b)`` draws ``n_batches`` fixed batches of ``b`` samples
    from the pool (with repetition when ``b`` exceeds the pool; seeded by
    ``cfg.seed``), moves them to the device
    (:func:`helpers.pipeline.fast.to_device_batch`), builds a fresh policy and
    :class:`helpers.compute.ppo.PPOTrainer` (same seed), and returns a closure
    that trains on the batches in turn, as notebooks 06/07 do.

    Parameters
    ----------
    cfg : TraceConfig
    acc : helpers.device.Accelerator
    n_batches : int, default 2
        Fixed batches each step closure cycles through (>= 1).

    Returns
    -------
    callable
        ``make_step(batch_size: int) -> step``; ``step()`` runs one PPO step
        and returns its stats (scalar tensors on the device).
    """
    import torch

    from helpers.compute.model import PolicyConfig, build_policy
    from helpers.compute.ppo import PPOConfig, PPOTrainer
    from helpers.pipeline.fast import BatchedDataset, to_device_batch
    from helpers.pipeline.prepare import prepare_data

    index, tokenizer = prepare_data(cfg.data_dir, max_images=cfg.max_images, seed=cfg.seed,
                                    batch_size=1, text_len=cfg.text_len)
    dataset = BatchedDataset(index, tokenizer, image_size=cfg.image_size, text_len=cfg.text_len, seed=cfg.seed)
    try:
        decoded = dataset[list(range(len(index)))]
        pool = {k: decoded[k].clone() for k in ("image", "tokens", "label")}  # the image buffer is reused
    finally:
        dataset.close()
    policy_cfg = PolicyConfig.for_job(image_size=cfg.image_size, model_width=cfg.model_width, d_model=cfg.d_model,
                                      text_len=cfg.text_len, vocab_size=tokenizer.get_vocab_size(),
                                      n_classes=index.n_classes)

    def make_step(batch_size: int) -> Callable[[], Any]:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ParameterError(f"batch_size must be an int >= 1, got {batch_size!r}")
        gen = torch.Generator().manual_seed(cfg.seed)
        batches = []
        for _ in range(max(1, n_batches)):
            idx = torch.randint(0, len(index), (batch_size,), generator=gen)
            host = {k: v[idx] for k, v in pool.items()}
            batches.append(to_device_batch(host, acc))
        torch.manual_seed(cfg.seed)
        trainer = PPOTrainer(build_policy(policy_cfg, device=acc.device), PPOConfig())
        rng = torch.Generator(device=acc.device).manual_seed(cfg.seed)
        counter = [0]

        def step() -> Any:
            images, tokens, labels = batches[counter[0] % len(batches)]
            counter[0] += 1
            return trainer.step(images, tokens, labels, generator=rng)

        return step

    return make_step


def _child_main(cfg: TraceConfig) -> dict[str, Any]:
    """Body of the child process: trace memory (and empty_cache) under the inherited allocator setting."""
    from helpers.device import get_accelerator

    acc = get_accelerator(cfg.device)
    step = ppo_step_factory(cfg, acc)(cfg.batch_size)
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
    cmd = [sys.executable, "-m", "helpers.compute.memory", json.dumps(asdict(cfg))]
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
        why = "set by parameter (the quick profile uses a small one to show the back-off)"
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
        import psutil

        avail = int(psutil.virtual_memory().available)
        return avail // 2, f"half of the available RAM ({avail / MIB:,.0f} MiB available, psutil)"
    import torch

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
    import pandas as pd

    from helpers.timing import measure

    if not isinstance(cfg, FinderConfig):
        raise ParameterError(f"cfg must be a FinderConfig, got {type(cfg).__name__}")
    if not callable(make_step):
        raise ParameterError(f"make_step must be callable, got {type(make_step).__name__}")
    nan = float("nan")
    _release(acc)
    base_rss = _rss_bytes() if acc.is_cpu else 0
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
            _release(acc)
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
    """Child-process entry point: ``python -m helpers.compute.memory '<TraceConfig as JSON>'``.

    Prints one line ``@@MEMORY_RESULT@@{json}`` on stdout; exit status 0, or 2
    for a bad argument.
    """
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.stderr.write("usage: python -m helpers.compute.memory '<TraceConfig as JSON>'\n")
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
