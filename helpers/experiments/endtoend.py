"""Notebook 10's experiment: the baseline of notebook 01 and the optimized job, side by side.

This module composes the building blocks of notebooks 01-07 and adds no
pipeline or compute code of its own:

- the baseline: :class:`helpers.pipeline.baseline.BaselineDataset` (per-image
  Pillow decode, augment, normalize, tokenize in the training process), no
  workers, no pinning, float32 NCHW, :class:`helpers.compute.ppo.PPOTrainer`;
- the optimizations, each switched by name (:data:`OPTIMIZATIONS`):
  ``batched_decode`` (:class:`helpers.pipeline.fast.BatchedDataset` and
  :func:`helpers.pipeline.fast.to_device_batch`), ``dataloader_workers``
  (:func:`helpers.pipeline.loader.make_loader`), ``pinned_memory``,
  ``prefetcher`` (:class:`helpers.pipeline.prefetch.DevicePrefetcher`),
  ``mixed_precision`` (autocast in ``PPOTrainer.step``, a GradScaler for
  float16 from :func:`helpers.compute.amp.make_grad_scaler`) and
  ``channels_last`` (model and images in NHWC).

Every job draws the same batches in the same order (one
:func:`helpers.pipeline.sampler.batch_sampler` per job, same seed) and the same
crops and flips (both datasets seed each item from ``(seed, epoch, index)``),
and starts from the same initial weights, so the jobs' learning curves can be
compared. :func:`run_interleaved` times several jobs in rotating blocks of
steps, so a busy machine slows them all alike. :func:`try_optimizations` (the notebook's "try it" panel)
times the baseline against a job with the optimizations switched on by hand, the same way.
"""

from __future__ import annotations

import itertools
import logging
import math
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping, Sequence

import pandas as pd
import torch

from helpers import bottleneck, checklist
from helpers import specs
from helpers.checklist import Item
from helpers.compute.amp import resolve_autocast_dtype
from helpers.compute.train import TimedLoop, epochs
from helpers.device import usable_cores
from helpers.errors import ParameterError
from helpers.experiments import registry
from helpers.experiments.base import Experiment
from helpers.experiments.training import LearningCheck, clone_batch, same_structure, same_values
from helpers.jobs.base import StepOptions, Workload, close_dataset
from helpers.jobs.ppo import PPOJob
from helpers.live import LivePoint, Progress, no_progress
from helpers.params import Param
from helpers.pipeline.baseline import IMAGENET_STD
from helpers.pipeline.loader import LoaderConfig, close_loader
from helpers.pipeline.prefetch import DevicePrefetcher, prefetched
from helpers.process import cli_command
from helpers.results import verdicts
from helpers.timing import Comparison, Measurement
from helpers.verdict import Action, Verdict


log = logging.getLogger(__name__)

PHASES = checklist.PHASES


def _source_notebooks() -> dict[str, str]:
    """The notebook whose verdict decides each optimization under ``optimizations=["auto"]``."""
    return {o.name: o.notebook for o in registry.optimizations()}


def __getattr__(name: str):
    """``OPTIMIZATIONS``, ``SOURCE_NOTEBOOKS`` and ``ACTS_ON``: the registry's, read when first asked for (the
    registry imports this module, so they cannot be read at import time)."""
    if name == "OPTIMIZATIONS":
        return registry.optimization_names()
    if name == "SOURCE_NOTEBOOKS":
        return _source_notebooks()
    if name == "ACTS_ON":
        return registry.acts_on()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: What the h2d phase is on a CPU (no copy there): printed under tables and in the next-step sentence.
CPU_H2D_NOTE = ("on the CPU the h2d phase is no copy: it is to_device_batch's conversion and normalization "
                "(uint8 NHWC -> float NCHW; plus the NHWC reorder with channels_last); the baseline normalizes "
                "on the host, in its data phase, so its h2d is ~0")


# --------------------------------------------------------------------------- choosing the optimizations


@dataclass(frozen=True)
class Choice:
    """Whether one optimization is on in the optimized job, and why.

    Attributes
    ----------
    name : str
        One of :data:`OPTIMIZATIONS`.
    enabled : bool
    source : str
        ``"verdict"`` (this run's verdict of its notebook), ``"not measured"`` (no verdict of this run decides
        it: off), ``"device default"`` (no verdict, and the caller asked for the device's stated default:
        ``bench end-to-end`` without ``--run``), ``"requested"`` (an explicit list) or ``"job"`` (not
        available for this job).
    detail : str
        One sentence for the reader.
    warning : str
        Non-empty when the deciding notebook ran a different workload
        (image_size / model_width) than this job.
    """

    name: str
    enabled: bool
    source: str
    detail: str
    warning: str = ""


@dataclass(frozen=True)
class Selection:
    """The optimized job's optimizations and settings, with the reasons.

    Attributes
    ----------
    optimizations : tuple of str
        Enabled names, in :data:`OPTIMIZATIONS` order.
    choices : tuple of Choice
        One per name of :data:`OPTIMIZATIONS`.
    missing : tuple of str
        Notebook ids whose verdict was needed (``auto``) but not found.
    num_workers : int
        DataLoader worker processes when ``dataloader_workers`` is on.
    amp_dtype : str
        ``"bfloat16"`` or ``"float16"``: the autocast dtype when
        ``mixed_precision`` is on.
    """

    optimizations: tuple[str, ...]
    choices: tuple[Choice, ...]
    missing: tuple[str, ...] = ()
    num_workers: int = 2
    amp_dtype: str = "bfloat16"

    def job(self, name: str = "optimized") -> "JobConfig":
        """The :class:`JobConfig` of the optimized job."""
        return JobConfig(name=name, optimizations=self.optimizations, num_workers=self.num_workers,
                         amp_dtype=self.amp_dtype)

    def missing_lines(self) -> list[str]:
        """What is missing and the command that produces it (empty when nothing is missing).

        The runner writes one results file per run folder and refuses to add to
        a finished run, so the command runs the missing notebooks and this one
        together in a new run.
        """
        if not self.missing:
            return []
        numbers = " ".join(nb[:2] for nb in self.missing)
        names = [c.name for c in self.choices if c.source in ("not measured", "device default")
                 and _source_notebooks().get(c.name) in self.missing]
        if any(c.source == "device default" for c in self.choices):
            what = (f"the device's stated default is used for {', '.join(names)} (table below: source "
                    "'device default')")
        else:
            what = (f"not enabled, not measured in this run: {', '.join(names)} (this notebook enables only what a "
                    f"verdict of this run recommended)")
        return [f"missing verdict(s) in this run's results: {', '.join(self.missing)}; {what}.",
                f"to measure them and follow their verdicts, run them and this notebook together: "
                f"`{cli_command()} run --only {numbers} 10` (same --profile, --device and --job as this run)"]

    def warning_lines(self) -> list[str]:
        """One line per choice whose deciding notebook ran a different workload than this job."""
        return [f"warning: {c.name}: {c.warning}" for c in self.choices if c.warning]

    def frame(self):
        """The choices as a table: optimization, enabled, source, detail (and workload warning, if any)."""
        return pd.DataFrame([{"optimization": c.name, "enabled": c.enabled, "source": c.source,
                              "detail": c.detail,
                              "workload": c.warning or ("same" if c.source == "verdict"
                                                        and not c.detail.endswith("not applicable") else "")}
                             for c in self.choices])


def format_value(value: Any, unit: Any) -> str:
    """A verdict's value in its own unit: fractions as percent, speedups as ``1.72x``.

    Parameters
    ----------
    value : float or None
    unit : str or None
        ``"fraction"`` -> ``"2%"``; ``"x"`` -> ``"1.72x"``; otherwise ``"<value> <unit>"``.

    Returns
    -------
    str
        Empty when ``value`` is None or NaN.
    """
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    v, u = float(value), str(unit or "")
    if u == "fraction":
        return f"{v:.0%}" if abs(v) >= 0.01 or v == 0 else f"{v:.1%}"
    if u == "x":
        return f"{v:.2f}x"
    return f"{v:.3g} {u}".strip()


def workload_warning(params: Mapping[str, Any] | None, workload: "Workload | None", notebook: str, *,
                     enabled: bool = True, name: str = "", enabled_names: Sequence[str] = ()) -> str:
    """Say when ``notebook``'s recorded parameters ran a different image_size / model_width than ``workload``.

    Parameters
    ----------
    params : mapping or None
        The ``parameters`` of the notebook's verdict record.
    workload : Workload or None
        This job's workload (None: no check).
    notebook : str
        Notebook id, for the sentence.
    enabled : bool
        Whether the optimization is on in the optimized job. Only enabled ones
        are ablated (measured) here; for a disabled one the sentence says how
        to measure it instead.
    name : str
        The optimization's name (for the ``optimizations=[...]`` suggestion).
    enabled_names : sequence of str
        The optimizations that are on (for the suggestion).

    Returns
    -------
    str
        Empty when the sizes match or are not recorded.
    """
    if workload is None or not isinstance(params, Mapping):
        return ""
    diffs = []
    for key, unit in (("image_size", " px"), ("model_width", " channels")):
        if key in params and params[key] is not None and int(params[key]) != int(getattr(workload, key)):
            diffs.append(f"{key} {int(params[key])}{unit} there vs {int(getattr(workload, key))}{unit} here")
    if not diffs:
        return ""
    head = f"notebook {notebook[:2]} measured a different job ({'; '.join(diffs)}): its verdict may not hold for this job"
    if enabled:
        return f"{head}; the ablation below (section 5) measures it on this job"
    sizes = " and ".join(f"{k} {int(getattr(workload, k))}" for k in ("image_size", "model_width")
                         if k in params and params[k] is not None and int(params[k]) != int(getattr(workload, k)))
    names = [n for n in registry.optimization_names() if n in set(enabled_names) | ({name} if name else set())]
    listed = ", ".join(f'"{n}"' for n in names)
    return (f"{head}; not enabled, so not measured here: rerun notebook {notebook[:2]} at {sizes} before this one, "
            f"or pass optimizations=[{listed}] to measure it in this job")


def check_optimizations(requested: Iterable[str]) -> tuple[str, ...]:
    """Validate the ``optimizations`` parameter before any work.

    Parameters
    ----------
    requested : iterable of str
        ``["auto"]``, or names from :data:`OPTIMIZATIONS` (an empty list means
        the optimized job equals the baseline).

    Returns
    -------
    tuple of str
        ``("auto",)`` or the distinct names in :data:`OPTIMIZATIONS` order.

    Raises
    ------
    ParameterError
        An unknown name, or ``"auto"`` mixed with names; the message lists the valid ones.
    """
    if isinstance(requested, str):
        raise ParameterError(f"optimizations must be a list of names, got the string {requested!r}; "
                             f"e.g. ['auto'] or ['batched_decode', 'mixed_precision']")
    names = [str(n) for n in requested]
    if "auto" in names:
        if len(set(names)) > 1:
            raise ParameterError(f"optimizations={names!r} mixes 'auto' with names; pass ['auto'] alone, or "
                                 f"a list from: {', '.join(registry.optimization_names())}")
        return ("auto",)
    unknown = [n for n in names if n not in registry.optimization_names()]
    if unknown:
        raise ParameterError(f"unknown optimization(s) {', '.join(map(repr, unknown))} in optimizations; valid: "
                             f"auto, {', '.join(registry.optimization_names())}")
    return tuple(n for n in registry.optimization_names() if n in names)


def device_defaults(acc, *, native_bf16: bool | None = None) -> dict[str, tuple[bool, str]]:
    """The stated default of each optimization on this device, used where no verdict exists.

    Parameters
    ----------
    acc : helpers.device.Accelerator
    native_bf16 : bool, optional
        Whether the CPU has native bf16 arithmetic
        (:func:`helpers.diagnose.environment.cpu_bf16_support`); read when
        None and the device is a CPU.

    Returns
    -------
    dict
        name -> (enabled, reason), from each optimization's ``default`` hook (declared with it, in the
        notebook that decides it). Batched decode always; workers, pinned memory
        and the prefetcher only on an accelerator (on a CPU they compete with
        the training computation for the same cores, and a CPU has no pinned
        memory or streams); mixed precision where the device autocasts to
        bf16/fp16 and, on a CPU, only with native bf16 (emulated bf16 is
        slower, pytorch/pytorch#118499); channels_last on CPU and CUDA, never on NPU
        (fact-check, section 8).
    """
    return {o.name: o.default(acc, native_bf16) for o in registry.optimizations()}


def _default_dtype(acc) -> str:
    dtypes = tuple(acc.capabilities.autocast_dtypes)
    if acc.is_cpu or "float16" not in dtypes:
        return "bfloat16" if "bfloat16" in dtypes or not dtypes else dtypes[0]
    return "bfloat16" if "bfloat16" in dtypes else "float16"


def _action_value(row, setting: str) -> Any:
    """The value of a verdict's structured action on ``setting`` (None if it has none)."""
    extra = row.get("extra") if isinstance(row.get("extra"), dict) else {}
    action = Action.from_dict(extra.get("action"))
    return action.value if action is not None and action.setting == setting else None


def select_optimizations(requested: Sequence[str], results, acc, *, native_bf16: bool | None = None,
                         default_workers: int | None = None, workload: "Workload | None" = None,
                         unavailable: Mapping[str, str] | None = None, job_spec: str = "",
                         device_defaults_for_missing: bool = False) -> Selection:
    """Decide the optimized job: from this run's verdicts (``auto``) or an explicit list.

    Under ``auto`` an optimization is on only when a verdict of this run recommended it; one without a
    verdict (its notebook not in the run, not measuring it, or measuring another job) is off, as "not
    measured" (:meth:`Selection.missing_lines` gives the command that measures it), unless
    ``device_defaults_for_missing`` asks for the device's stated default (:func:`device_defaults`).

    Parameters
    ----------
    requested : sequence of str
        The ``optimizations`` parameter (see :func:`check_optimizations`).
    results : pandas.DataFrame or None
        This run's records (:func:`helpers.results.load_results`); None or
        empty when there are none (notebook 10 run alone).
    acc : helpers.device.Accelerator
    native_bf16 : bool, optional
        See :func:`device_defaults`.
    default_workers : int, optional
        Workers when notebook 03 recorded none; default ``min(4, usable cores)``.
    workload : Workload, optional
        This job; when given, each verdict-based choice whose notebook recorded
        a different ``image_size`` or ``model_width`` carries a warning.
    unavailable : mapping of str to str, optional
        Optimizations this job cannot use (name -> why, e.g. batched decode for a job without the workbook's
        image pipeline): off whatever was requested or recommended, with the reason.
    job_spec : str
        The user's job spec ("" for the built-in job): a verdict recorded for another job is not followed.
    device_defaults_for_missing : bool, default False
        Where no verdict decides an optimization, use the device's stated default (source ``"device
        default"``; ``bench end-to-end`` without a run folder) instead of leaving it off.

    Returns
    -------
    Selection

    Raises
    ------
    ParameterError
        If ``requested`` is invalid (before any work).
    """

    names = check_optimizations(requested)
    if device_defaults_for_missing:
        defaults = {k: (on, f"device default: {'on' if on else 'off'} ({why})")
                    for k, (on, why) in device_defaults(acc, native_bf16=native_bf16).items()}
        fallback = "device default"
    else:  # no guessing: what no verdict of this run recommended stays off
        defaults = {k: (False, "not enabled: not measured in this run") for k in registry.optimization_names()}
        fallback = "not measured"
    workers = default_workers if default_workers is not None else max(1, min(4, usable_cores()))
    dtype = _default_dtype(acc)
    table = None
    if results is not None and len(results):
        table = verdicts(results)
        table = table.set_index("notebook") if len(table) else None
    # settings recorded by notebooks 03 and 06, whatever the mode
    workers_nb = registry.optimization("dataloader_workers").notebook
    if table is not None and workers_nb in table.index:
        best = _action_value(table.loc[workers_nb], "num_workers")
        workers = int(best) if isinstance(best, int) and not isinstance(best, bool) and best >= 1 else workers
    amp_nb = registry.optimization("mixed_precision").notebook
    if table is not None and amp_nb in table.index:
        params = table.loc[amp_nb].get("parameters") or {}
        try:
            d = resolve_autocast_dtype(str(params.get("autocast_dtype", "auto")), acc.kind,
                                       acc.capabilities.autocast_dtypes)
            dtype = str(d).replace("torch.", "")
        except ParameterError as exc:
            log.warning("notebook 06's autocast dtype does not apply here (%s); using %s", exc, dtype)
    choices, missing = [], []
    unavailable = dict(unavailable or {})
    for name in registry.optimization_names():
        nb = _source_notebooks()[name]
        if name in unavailable:
            choices.append(Choice(name, False, "job", f"not available for this job: {unavailable[name]}"))
            continue
        if names != ("auto",):
            on = name in names
            choices.append(Choice(name, on, "requested", "in the optimizations list" if on else "not requested"))
            continue
        row_params = table.loc[nb].get("parameters") if table is not None and nb in table.index else None
        other_job = isinstance(row_params, Mapping) and str(row_params.get("job") or "") != str(job_spec or "")
        if table is not None and nb in table.index and other_job:
            if nb not in missing:
                missing.append(nb)
            on, why = defaults[name]
            choices.append(Choice(name, on, fallback, f"notebook {nb[:2]} measured another job; {why}"))
        elif table is not None and nb in table.index and registry.optimization(name).decision:
            row = table.loc[nb]
            key = registry.optimization(name).decision
            extra = row.get("extra") if isinstance(row.get("extra"), Mapping) else {}
            own = extra.get(key) if isinstance(extra.get(key), Mapping) else None
            if own is None:  # the notebook ran without measuring this one
                on, why = defaults[name]
                choices.append(Choice(name, on, fallback, f"notebook {nb[:2]} did not measure it; {why}"))
            else:
                rec = str(own.get("recommendation"))
                choices.append(Choice(name, rec == "enable", "verdict", f"notebook {nb[:2]} ({key}): {rec}",
                                      "" if row.get("parameters") is None or rec == "not applicable" else "check"))
        elif table is not None and nb in table.index:
            row = table.loc[nb]
            rec = str(row.get("recommendation"))
            vtxt = format_value(row.get("value"), row.get("unit"))
            vtxt = f" ({vtxt})" if vtxt else ""
            choices.append(Choice(name, rec == "enable", "verdict", f"notebook {nb[:2]}: {rec}{vtxt}",
                                  # a "not applicable" verdict (capability absent) holds whatever the workload
                                  "" if row.get("parameters") is None or rec == "not applicable" else "check"))
        else:
            if nb not in missing:  # one notebook may decide two optimizations
                missing.append(nb)
            on, why = defaults[name]
            choices.append(Choice(name, on, fallback, f"no verdict from {nb[:2]}; {why}"))
    on = {c.name for c in choices if c.enabled}
    for i, c in enumerate(choices):  # an optimization that works only with another is off without it
        needs = registry.optimization(c.name).requires
        if c.enabled and needs and needs not in on:
            choices[i] = replace(c, enabled=False, detail=f"{c.detail}; but it needs {needs}, which is off")
    enabled = tuple(c.name for c in choices if c.enabled)
    # the workload warnings, now that the enabled set is known (a disabled one is not measured here)
    for i, c in enumerate(choices):
        if c.warning:
            params = table.loc[_source_notebooks()[c.name]].get("parameters")
            choices[i] = replace(c, warning=workload_warning(params, workload, _source_notebooks()[c.name],
                                                             enabled=c.enabled, name=c.name, enabled_names=enabled))
    return Selection(optimizations=enabled, choices=tuple(choices), missing=tuple(missing),
                     num_workers=int(workers), amp_dtype=dtype)


# --------------------------------------------------------------------------- one job


@dataclass(frozen=True)
class JobConfig:
    """One job: a name and the optimizations it uses.

    Attributes
    ----------
    name : str
        Label in tables and figures.
    optimizations : tuple of str
        Names from :data:`OPTIMIZATIONS` (empty: the baseline).
    num_workers : int
        DataLoader workers when ``dataloader_workers`` is on (>= 1).
    amp_dtype : str
        Autocast dtype name when ``mixed_precision`` is on.
    """

    name: str
    optimizations: tuple[str, ...] = ()
    num_workers: int = 2
    amp_dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        check_optimizations(list(self.optimizations))
        if self.num_workers < 1:
            raise ParameterError(f"num_workers={self.num_workers}; the workers optimization needs >= 1")
        if self.amp_dtype not in ("bfloat16", "float16"):
            raise ParameterError(f"amp_dtype={self.amp_dtype!r}; allowed: bfloat16, float16")

    def has(self, name: str) -> bool:
        """Whether ``name`` is on."""
        return name in self.optimizations

    def without(self, name: str) -> "JobConfig":
        """This job with ``name`` removed, named ``"without <name>"``."""
        return replace(self, name=f"without {name}", optimizations=tuple(o for o in self.optimizations if o != name))

    def label(self) -> str:
        """The optimizations in words (``"none (baseline)"`` when empty)."""
        parts = []
        for o in self.optimizations:
            if o == "dataloader_workers":
                parts.append(f"dataloader_workers ({self.num_workers})")
            elif o == "mixed_precision":
                parts.append(f"mixed_precision ({self.amp_dtype})")
            else:
                parts.append(o)
        return ", ".join(parts) or "none (baseline)"


def ablation_configs(optimized: JobConfig) -> list[JobConfig]:
    """The optimized job with each of its optimizations removed in turn."""
    return [optimized.without(o) for o in optimized.optimizations]


class JobVariant:
    """One configuration of a training job, stepped in blocks with every phase of every step timed.

    The job itself (dataset, loader, model, step, transfer) comes from
    :class:`helpers.jobs.ppo.PPOJob`; this class switches the optimizations of
    ``config`` on it and times it in a :class:`helpers.compute.train.TimedLoop`.

    Parameters
    ----------
    config : JobConfig
    job : helpers.jobs.base.Job
        The job (data, workload, model, step): the built-in :class:`helpers.jobs.ppo.PPOJob` or a user's;
        ``batched_decode`` uses its ``"batched"`` pipeline (the built-in job's only).
    acc : helpers.device.Accelerator

    input_free : bool, default False
        The job's input-free ceiling instead: its first ``input_free_batches`` batches (through this
        configuration's loader and transfer) are kept on the device and cycled, so its steps load and copy
        nothing (the same model initialization, step and options).
    input_free_batches : int, default 8

    Notes
    -----
    Steps are timed by the loop (a device synchronize closes each phase):
    *data* (next batch), *h2d* (the transfer: copy, and for the batched
    pipeline conversion and normalization on the device) and *compute* (one
    PPO step). Statistics are read from the device after the step's timing.
    The data iterator lives across blocks, so worker processes and the
    prefetcher keep running between blocks.
    """

    def __init__(self, config: JobConfig, job: PPOJob, acc, *, input_free: bool = False,
                 input_free_batches: int = 8) -> None:
        workload = job.workload
        self.config, self.acc, self.workload, self.job = config, acc, workload, job
        pin = config.has("pinned_memory") and acc.capabilities.pinned_memory.available
        workers = config.num_workers if config.has("dataloader_workers") else 0
        amp_dtype = getattr(torch, config.amp_dtype) if config.has("mixed_precision") else None
        self.options = StepOptions(autocast_dtype=amp_dtype, channels_last=config.has("channels_last"))
        self.amp_dtype = amp_dtype
        if config.has("batched_decode"):
            pipeline = "cached" if config.has("dataset_cache") else "batched"  # the cache feeds the batched pipeline
            if pipeline not in job.pipelines:
                raise ParameterError(f"batched_decode needs the workbook's {pipeline} image pipeline; the job "
                                     f"{job.name!r} offers {', '.join(job.pipelines)}")
            threads = 0 if workers == 0 else max(1, _cores() // workers)
            self.dataset = job.make_dataset(pipeline, threads=threads, pin_memory=pin and workers == 0)
        else:
            self.dataset = job.make_dataset("baseline" if "baseline" in job.pipelines else job.pipelines[0])
        self.sampler = job.batch_sampler(len(self.dataset))
        loader_cfg = LoaderConfig(batch_size=workload.batch_size, num_workers=workers,
                                  pin_memory=pin and workers > 0, seed=workload.seed)
        self.loader = job.make_loader(self.dataset, loader_cfg, acc, batch_sampler=self.sampler)
        self.transfer = _Transfer(job, self.options)
        self.prefetcher = None
        if config.has("prefetcher"):
            self.prefetcher = DevicePrefetcher(self.loader, acc, transfer=self.transfer, non_blocking=pin,
                                               time_copies=False)
            self.source, self.transfer = self.prefetcher, prefetched
        else:
            self.source = self.loader
        model = job.make_model(acc, self.options)
        self.step = job.make_step(model, acc, self.options)
        self.trainer = getattr(self.step, "trainer", None)  # the built-in job's PPO trainer (None for others)
        self.non_blocking = bool(pin)
        self.loop = TimedLoop(self.batches(),
                              lambda batch: self.transfer(batch, acc, non_blocking=self.non_blocking),
                              self.step, acc.synchronize)
        self.timer = self.loop.timer
        self.peak_bytes: int | None = None
        self.input_free = bool(input_free)
        if self.input_free:
            source = iter(self.batches())
            kept = [clone_batch(self.transfer(batch, acc, non_blocking=False))
                    for batch in itertools.islice(source, max(1, int(input_free_batches)))]
            del source
            acc.synchronize()
            self.loop = TimedLoop(itertools.cycle(kept), lambda batch: batch, self.step, acc.synchronize)
            self.timer = self.loop.timer

    def batches(self):
        """The host batches of this job, epoch after epoch (a new iterator over the same loader)."""
        return epochs(self.source, datasets=[self.dataset, self.sampler])

    @property
    def measured(self) -> list[bool]:
        """Per step run so far: measured (True) or warm-up (False)."""
        return self.loop.measured

    def run(self, steps: int, *, measured: bool = True, progress=None) -> None:
        """Run ``steps`` PPO steps, timing each phase; ``measured=False`` marks them as warm-up.

        ``progress(done, steps)`` is called after each step, outside its timing (:meth:`TimedLoop.run`)."""
        if not self.acc.is_cpu:
            self.acc.reset_peak_memory_stats()
        self.loop.run(steps, measured=measured, progress=progress)
        if not self.acc.is_cpu:
            peak = self.acc.memory_stats().get("peak_allocated_bytes")
            if peak is not None:
                self.peak_bytes = max(self.peak_bytes or 0, int(peak))

    def steps_frame(self, *, measured_only: bool = True):
        """One row per step: step, data, h2d, compute, step_s, exposed_input_s, exposed_fraction, and the PPO stats.

        With ``measured_only=False`` every step is returned, with a ``measured`` column.
        """
        return self.loop.steps_frame(measured_only=measured_only)

    def measurement(self, column: str = "step_s"):
        """The measured steps' ``column`` as a :class:`helpers.timing.Measurement` (items = batch size)."""
        df = self.steps_frame()
        return Measurement(name=self.config.name, times_s=tuple(float(x) for x in df[column]),
                           warmup=int(len(self.measured) - len(df)),
                           items_per_call=self.workload.batch_size if column == "step_s" else None)

    def close(self) -> None:
        """Release the dataset's thread pool and the loader's workers."""
        self.loop.batches = None
        close_loader(self.loader)
        close_dataset(self.dataset)


class _Transfer:
    """``transfer(batch, acc, non_blocking=...)`` of a job with its step options (picklable, no closure)."""

    def __init__(self, job: PPOJob, options: StepOptions) -> None:
        self.job, self.options = job, options

    def __call__(self, batch, acc, *, non_blocking: bool = False):
        return self.job.to_device(batch, acc, non_blocking=non_blocking, options=self.options)


def same_input_check(a: JobConfig, b: JobConfig, job: PPOJob, acc) -> dict[str, Any]:
    """Check, before timing, that two jobs feed the same samples: first batch of each, on the device.

    Two throwaway jobs are built (their own loaders; the timed jobs are not
    touched) and their first batch compared after the transfer.

    Returns
    -------
    dict
        ``labels_equal``, ``tokens_equal`` (bool); ``mean_abs_levels`` and
        ``max_abs_levels``: pixel difference in 0-255 levels (normalized
        difference times 255 x the channel's std), from decoding differences
        only (same crops and flips; the batched decoder may scale in the DCT
        domain). For a user's job, ``batches_equal`` (bool: the same values,
        their augmentations seeded per sample alike); when the values differ
        because the job's augmentations cannot be reproduced (a first batch
        read again differs too), ``labels_equal`` and ``tokens_equal`` say
        whether the order, labels, shapes and dtypes agree
        (:func:`helpers.experiments.training.same_structure`).
    """
    ja, jb = JobVariant(a, job, acc), JobVariant(b, job, acc)
    try:
        if not isinstance(job, PPOJob):  # a user's job: the same dataset, order and per-sample seeds: same values
            ba, bb = ja.transfer(next(ja.batches()), acc), jb.transfer(next(jb.batches()), acc)
            same = same_values(ba, bb, exact=False)
            agree = same
            if not same:  # augmentations from a source nobody can seed: the order, labels, shapes and dtypes
                jc = JobVariant(a, job, acc)
                try:
                    again = jc.transfer(next(jc.batches()), acc)
                finally:
                    jc.close()
                agree = not same_values(ba, again, exact=False) and same_structure(ba, bb)
            return {"labels_equal": agree, "tokens_equal": agree, "mean_abs_levels": 0.0 if same else float("nan"),
                    "max_abs_levels": 0.0 if same else float("nan"), "batches_equal": same}
        xa, ta, la = ja.transfer(next(ja.batches()), acc)
        xb, tb, lb = jb.transfer(next(jb.batches()), acc)
        std = torch.tensor(IMAGENET_STD, device=xa.device).view(1, 3, 1, 1)
        levels = ((xa.float() - xb.float()).abs() * std * 255.0)
        return {"labels_equal": bool(torch.equal(la.cpu(), lb.cpu())),
                "tokens_equal": bool(torch.equal(ta.cpu(), tb.cpu())),
                "mean_abs_levels": float(levels.mean()), "max_abs_levels": float(levels.max())}
    finally:
        ja.close()
        jb.close()


def _cores() -> int:
    return usable_cores()


# --------------------------------------------------------------------------- running and comparing jobs


def run_interleaved(jobs: Sequence[JobVariant], *, steps: int, warmup_steps: int, block: int = 2,
                    progress=None) -> None:
    """Run every job for ``warmup_steps`` then ``steps`` measured steps, in rotating blocks.

    Warm-up: each job in turn. Measured: rounds of ``block`` steps per job, the
    job order reversed every other round (A B C, C B A, ...: ABBA for two
    jobs), so a drift of the machine's speed touches every job alike.

    Parameters
    ----------
    jobs : sequence of JobVariant
    steps : int
        Measured steps per job (>= 1).
    warmup_steps : int
        Unmeasured steps per job first (>= 0).
    block : int
        Steps per job per turn (>= 1).
    progress : callable, optional
        ``progress(done, total)`` after every step of every job (warm-up included), outside the timing.

    Raises
    ------
    ParameterError
        For invalid counts or no job.
    """
    if not jobs or steps < 1 or warmup_steps < 0 or block < 1:
        raise ParameterError(f"need >= 1 job, steps >= 1, warmup_steps >= 0 and block >= 1; got {len(jobs)} "
                             f"job(s), steps={steps}, warmup_steps={warmup_steps}, block={block}")
    extra = {"progress": progress} if progress is not None else {}  # wrappers without the keyword still work
    for job in jobs:
        if warmup_steps:
            job.run(warmup_steps, measured=False, **extra)
    done, rnd = 0, 0
    while done < steps:
        n = min(block, steps - done)
        for job in (jobs if rnd % 2 == 0 else list(reversed(jobs))):
            job.run(n, **extra)
        done += n
        rnd += 1


@dataclass(frozen=True)
class JobSummary:
    """The before/after table's numbers for one job.

    Attributes
    ----------
    name, optimizations : str
    step_median_s, step_p25_s, step_p75_s : float
        Step time, seconds.
    data_s, h2d_s, compute_s : float
        Median seconds per step of each phase.
    throughput : float
        Samples/s at the median step time.
    exposed_fraction : float
        (median data + median h2d) / (sum of the three phase medians): the
        input's share of the median step, as drawn in the phase-breakdown figure.
    utilization : float
        median compute / (sum of the three phase medians): the share of the
        median step the device computes (same definition, so the two add up to 1).
    peak_memory_bytes : int or None
        Device peak allocated memory (None on a CPU).
    steps : int
        Measured steps.
    """

    name: str
    optimizations: str
    step_median_s: float
    step_p25_s: float
    step_p75_s: float
    data_s: float
    h2d_s: float
    compute_s: float
    throughput: float
    exposed_fraction: float
    utilization: float
    peak_memory_bytes: int | None
    steps: int


def summarize(job: JobVariant) -> JobSummary:
    """Summarize a job's measured steps (see :class:`JobSummary`)."""
    df = job.steps_frame()
    m = job.measurement()
    data, h2d, comp = (float(df[p].median()) for p in PHASES)
    total = data + h2d + comp
    exposed = (data + h2d) / total if total > 0 else 0.0
    return JobSummary(name=job.config.name, optimizations=job.config.label(), step_median_s=m.median_s,
                      step_p25_s=m.p25_s, step_p75_s=m.p75_s, data_s=data, h2d_s=h2d, compute_s=comp,
                      throughput=job.workload.batch_size / m.median_s,
                      exposed_fraction=exposed, utilization=(comp / total if total > 0 else 0.0),
                      peak_memory_bytes=job.peak_bytes, steps=m.repeats)


def summary_frame(summaries: Sequence[JobSummary]):
    """The before/after table: one row per job, times in ms, fractions in %.

    ``peak memory MiB`` is the device's peak allocated memory, or the text
    ``"n/a on CPU"`` where the device does not report it (a CPU: the process's
    peak RSS covers every job of the process and cannot be split).
    """
    rows = []
    for s in summaries:
        rows.append({"job": s.name, "step ms (median)": s.step_median_s * 1e3,
                     "step ms (IQR)": f"{s.step_p25_s * 1e3:.0f}-{s.step_p75_s * 1e3:.0f}",
                     "data ms": s.data_s * 1e3, "h2d ms": s.h2d_s * 1e3, "compute ms": s.compute_s * 1e3,
                     "samples/s": s.throughput, "exposed input %": 100 * s.exposed_fraction,
                     "compute share %": 100 * s.utilization,
                     "peak memory MiB": (f"{s.peak_memory_bytes / 2 ** 20:.0f}" if s.peak_memory_bytes
                                         else "n/a on CPU")})
    return pd.DataFrame(rows).set_index("job")


def speedup(baseline: JobVariant, other: JobVariant, *, seed: int = 0):
    """Throughput of ``other`` over ``baseline`` (= baseline step time / other's) with a bootstrap interval.

    Returns
    -------
    helpers.timing.Comparison
        A = baseline, B = other; ``ratio`` > 1 means ``other`` is faster.
    """

    return Comparison.from_measurements(baseline.measurement(), other.measurement(), seed=seed)


def ceiling_fraction(job: JobVariant, ceiling: JobVariant, *, seed: int = 0) -> dict[str, Any]:
    """The job's throughput as a fraction of its input-free ceiling's, with a bootstrap interval.

    Parameters
    ----------
    job : JobVariant
        The measured job (e.g. the optimized one).
    ceiling : JobVariant
        The same configuration with ``input_free=True``, timed in the same rotation.

    Returns
    -------
    dict
        ``fraction`` (ceiling's median step / the job's: 1 means input costs nothing), ``ci_low``, ``ci_high``
        (95%), ``free_input_speedup`` (its inverse: how much faster the job would be with free input) and the
        :class:`helpers.timing.Comparison` under ``comparison`` (A = the job, B = the ceiling).
    """
    c = Comparison.from_measurements(job.measurement(), ceiling.measurement(), seed=seed)
    fraction, low, high = c.inverse()
    return {"fraction": fraction, "ci_low": low, "ci_high": high, "free_input_speedup": c.ratio, "comparison": c}


def contribution(optimized: JobVariant, without: JobVariant, *, seed: int = 0):
    """What one optimization contributes: the optimized job vs the same job without it, with a bootstrap interval.

    Parameters
    ----------
    optimized : JobVariant
        The full optimized job.
    without : JobVariant
        The optimized job with one optimization removed (timed in the same rotation).
    seed : int

    Returns
    -------
    helpers.timing.Comparison
        A = ``without``, B = ``optimized``; ``ratio`` = median step without /
        median step with (= full speedup / speedup without it): > 1 means the
        optimization makes the job faster, < 1 that the job is faster without it.
    """

    return Comparison.from_measurements(without.measurement(), optimized.measurement(), seed=seed)


def contribution_decision(c) -> str:
    """What to do with one optimization from its contribution interval (see :func:`contribution`).

    Returns
    -------
    str
        ``"keep it"`` when the interval lies entirely above 1, ``"drop it here"``
        when it lies entirely below 1 (removing it made the job measurably
        faster), ``"no measurable contribution here"`` when it includes 1.
    """
    if c.ci_low > 1.0:
        return "keep it"
    if c.ci_high < 1.0:
        return "drop it here"
    return "no measurable contribution here"


def phase_label(phases: Sequence[str]) -> str:
    """``("data", "h2d")`` -> ``"input (data+h2d)"``; ``("compute",)`` -> ``"compute"``; else ``"h2d+compute"``."""
    if tuple(phases) == ("data", "h2d"):
        return "input (data+h2d)"
    return "+".join(phases)


@dataclass(frozen=True)
class Attribution:
    """One optimization's contribution where it acts (its phases) and on the whole step.

    Attributes
    ----------
    name : str
    phases : tuple of str
        The phases it acts on (:data:`ACTS_ON`).
    phase : helpers.timing.Comparison or None
        Without it vs with it, on the per-step sum of ``phases`` (None when
        that sum's median is 0 with it, so no ratio exists).
    step : helpers.timing.Comparison
        Without it vs with it, on the whole step (:func:`contribution`).
    phase_ms : (float, float)
        Median per-step time of ``phases`` without it and with it, ms.
    decision : str
        ``"keep it"``, ``"drop it here"`` or ``"no measurable contribution here"``,
        decided on ``phase`` (see :func:`attribute`).
    note : str
        Why the step-level figure tells something else, or empty.
    """

    name: str
    phases: tuple[str, ...]
    phase: Any
    step: Any
    phase_ms: tuple[float, float]
    decision: str
    note: str = ""

    def sentence(self) -> str:
        """E.g. "channels_last: acts on the h2d+compute phases: 36.3 -> 36.6 ms, contribution 0.99x (95% CI
        0.95-1.03): no measurable contribution here; whole step 1.11x (95% CI 1.02-1.19); not attributable ..."."""
        ph = phase_label(self.phases)
        where = f"acts on the {ph} phase{'s' if '+' in ph else ''}"
        if self.phase is None:
            pc = f"{where}: {self.phase_ms[0]:.1f} -> {self.phase_ms[1]:.1f} ms (no ratio)"
        else:
            pc = (f"{where}: {self.phase_ms[0]:.1f} -> {self.phase_ms[1]:.1f} ms, contribution "
                  f"{self.phase.ratio:.2f}x (95% CI {self.phase.ci_low:.2f}-{self.phase.ci_high:.2f})")
        st = f"whole step {self.step.ratio:.2f}x (95% CI {self.step.ci_low:.2f}-{self.step.ci_high:.2f})"
        return f"{self.name}: {pc}: {self.decision}; {st}" + (f"; {self.note}" if self.note else "")


def _phase_measurement(steps, phases: Sequence[str], name: str):
    total = sum(steps[p] for p in phases)
    return Measurement(name=name, times_s=tuple(float(x) for x in total), warmup=0)


def attribute(name: str, optimized_steps, without_steps, *, seed: int = 0) -> Attribution:
    """Decide one optimization on the phases it acts on, and check the whole step against it.

    An optimization can only change the phases it acts on (:data:`ACTS_ON`);
    a step-level difference that shows up in another phase is noise or the
    rotation's side effects, not its doing. The decision therefore follows
    the contribution on its own phases (median per-step sum of those phases
    without it / with it, 95% bootstrap interval over the steps):

    - ``"keep it"``: that interval lies above 1, and the whole step is not
      measurably slower with it;
    - ``"drop it here"``: its phases are measurably slower with it, or they are
      faster but the whole step is measurably slower (it costs more elsewhere,
      e.g. worker processes taking cores from the computation on a CPU);
    - ``"no measurable contribution here"``: otherwise.

    When the whole-step interval excludes 1 but the decision does not say
    the same, ``note`` names the phase that changed most outside the acted-on
    ones ("not attributable here (the difference is in the data phase, which
    it does not touch)").

    Parameters
    ----------
    name : str
        One of :data:`OPTIMIZATIONS`.
    optimized_steps, without_steps : pandas.DataFrame
        :meth:`JobVariant.steps_frame` of the full optimized job and of the job
        without ``name``: per measured step, the columns ``data``, ``h2d``,
        ``compute`` and ``step_s`` (seconds).
    seed : int
        Bootstrap seed.

    Returns
    -------
    Attribution

    Raises
    ------
    ParameterError
        Unknown ``name``, or a frame lacking a phase column.
    """

    if name not in registry.acts_on():
        raise ParameterError(f"unknown optimization {name!r}; valid: {', '.join(registry.optimization_names())}")
    for label, df in (("optimized_steps", optimized_steps), ("without_steps", without_steps)):
        absent = [c for c in (*PHASES, "step_s") if c not in df]
        if absent:
            raise ParameterError(f"{label} lacks column(s) {absent}; pass JobVariant.steps_frame()")
    phases = registry.acts_on()[name]
    step = Comparison.from_measurements(
        Measurement(f"without {name}", tuple(float(x) for x in without_steps["step_s"]), 0),
        Measurement("optimized", tuple(float(x) for x in optimized_steps["step_s"]), 0), seed=seed)
    wo = _phase_measurement(without_steps, phases, f"without {name}")
    op = _phase_measurement(optimized_steps, phases, "optimized")
    phase = Comparison.from_measurements(wo, op, seed=seed) if op.median_s > 0 else None
    step_decision = contribution_decision(step)
    if phase is None:
        decision = "no measurable contribution here"
    elif phase.ci_high < 1.0:
        decision = "drop it here"
    elif phase.ci_low > 1.0:
        decision = "drop it here" if step.ci_high < 1.0 else "keep it"
    else:
        decision = "no measurable contribution here"
    others = [p for p in PHASES if p not in phases]
    diffs = {p: float(optimized_steps[p].median() - without_steps[p].median()) for p in others}
    top = max(diffs, key=lambda p: abs(diffs[p])) if diffs else "other"
    d_ms = diffs.get(top, math.nan) * 1e3
    note = ""
    if phase is not None and phase.ci_low > 1.0 and step.ci_high < 1.0:
        note = (f"its own phases are faster but the whole step is slower: the difference is in the {top} phase "
                f"({d_ms:+.1f} ms per step with it)")
    elif step_decision != "no measurable contribution here" and step_decision != decision:
        note = (f"the step-level change is not attributable here (the difference is in the {top} phase, "
                f"{d_ms:+.1f} ms per step with it, which it does not touch)")
    return Attribution(name=name, phases=tuple(phases), phase=phase, step=step,
                       phase_ms=(wo.median_s * 1e3, op.median_s * 1e3), decision=decision, note=note)


def ablation_frame(full, without: Mapping[str, Any], contributions: Mapping[str, Any] | None = None,
                   attributions: Mapping[str, Attribution] | None = None):
    """Speedup of each ablated job vs the baseline and the contribution of each optimization.

    Parameters
    ----------
    full : helpers.timing.Comparison
        Baseline vs the full optimized job.
    without : mapping of str to Comparison
        Optimization name -> baseline vs the optimized job without it.
    contributions : mapping of str to Comparison, optional
        Optimization name -> :func:`contribution` (without it vs the full
        optimized job). When given, the contribution's interval and the
        decision come from it; otherwise the contribution is the ratio of the
        two speedups, without interval or decision.

    Returns
    -------
    pandas.DataFrame
        Index: ``"all"`` then ``"without <name>"``. Columns: ``speedup``,
        ``ci_low``, ``ci_high`` (vs baseline, x), ``contribution`` (x: how many
        times slower the job gets when it is removed; 1.0 for "all"),
        ``contribution_low``, ``contribution_high`` (its 95% interval) and
        ``decision`` (:func:`contribution_decision`; empty for "all").
        With ``attributions`` also ``phases`` (where it acts),
        ``phase_contribution``, ``phase_low``, ``phase_high`` and ``note``,
        and ``decision`` is :attr:`Attribution.decision` (decided on its phases).
    attributions : mapping of str to Attribution, optional
        Optimization name -> :func:`attribute`.
    """
    contributions = contributions or {}
    attributions = attributions or {}
    rows = [{"variant": "all", "speedup": full.ratio, "ci_low": full.ci_low, "ci_high": full.ci_high,
             "contribution": 1.0, "contribution_low": math.nan, "contribution_high": math.nan, "decision": ""}]
    if attributions:
        rows[0].update({"phases": "", "phase_contribution": math.nan, "phase_low": math.nan, "phase_high": math.nan,
                        "note": ""})
    for name, c in without.items():
        k = contributions.get(name)
        a = attributions.get(name)
        row = {"variant": f"without {name}", "speedup": c.ratio, "ci_low": c.ci_low, "ci_high": c.ci_high,
               "contribution": k.ratio if k is not None else full.ratio / c.ratio,
               "contribution_low": k.ci_low if k is not None else math.nan,
               "contribution_high": k.ci_high if k is not None else math.nan,
               "decision": contribution_decision(k) if k is not None else ""}
        if attributions:
            ph = a.phase if a is not None else None
            row.update({"phases": phase_label(a.phases) if a is not None else "",
                        "phase_contribution": ph.ratio if ph is not None else math.nan,
                        "phase_low": ph.ci_low if ph is not None else math.nan,
                        "phase_high": ph.ci_high if ph is not None else math.nan,
                        "note": a.note if a is not None else ""})
            if a is not None:
                row["decision"] = a.decision
        rows.append(row)
    return pd.DataFrame(rows).set_index("variant")


def compute_side_lines(frame, summaries: Mapping[str, JobSummary], earlier: Mapping[str, Any]) -> list[str]:
    """Reconcile each compute-side optimization's contribution here with its own notebook's figure.

    For ``mixed_precision`` and ``channels_last`` (when ablated): the compute
    phase's median with and without it in this job, the share of the step the
    compute phase takes without it, and the job-level contribution, next to
    the speedup its notebook measured (all measured numbers).

    Parameters
    ----------
    frame : pandas.DataFrame
        :func:`ablation_frame` with contributions.
    summaries : mapping of str to JobSummary
        By job name: ``"optimized"`` and ``"without <name>"``.
    earlier : mapping of str to (value, unit, notebook)
        Optimization name -> its notebook's verdict value, unit and notebook id
        (missing names are described without it).

    Returns
    -------
    list of str
    """
    lines = []
    opt = summaries.get("optimized")
    for name in ("mixed_precision", "channels_last"):
        key = f"without {name}"
        if opt is None or key not in summaries or key not in frame.index:
            continue
        w = summaries[key]
        row = frame.loc[key]
        comp_ratio = w.compute_s / opt.compute_s if opt.compute_s > 0 else math.nan
        share = w.compute_s / (w.data_s + w.h2d_s + w.compute_s) if w.compute_s > 0 else 0.0
        ref = ""
        if name in earlier:
            value, unit, nb = earlier[name]
            txt = format_value(value, unit)
            if txt:
                ref = f"notebook {nb[:2]} measured {txt} on its own comparison; "
        bound = 1.0 / ((1.0 - share) + share / comp_ratio) if comp_ratio > 0 and math.isfinite(comp_ratio) \
            else math.nan
        lines.append(f"{name}: {ref}in this job its compute phase went {w.compute_s * 1e3:.1f} -> "
                     f"{opt.compute_s * 1e3:.1f} ms ({comp_ratio:.2f}x); compute is {share:.0%} of the median step "
                     f"without it (data {w.data_s * 1e3:.1f} ms, h2d {w.h2d_s * 1e3:.1f} ms), which alone predicts "
                     f"{bound:.2f}x for the whole job; whole step measured: {row['contribution']:.2f}x (95% CI "
                     f"{row['contribution_low']:.2f}-{row['contribution_high']:.2f}); decided on the phases it acts "
                     f"on: {row['decision'] or 'no interval'}")
    return lines


# --------------------------------------------------------------------------- cross-checks


def earlier_baseline_phases(results, workload: Workload, params: Mapping[str, Any]) -> tuple[dict | None, str]:
    """Notebook 01's phase statistics of the same job in this run, for :func:`cross_checks`.

    Parameters
    ----------
    results : pandas.DataFrame or None
        This run's records (:func:`helpers.results.load_results`).
    workload : Workload
        This notebook's workload.
    params : mapping
        This notebook's parameters (``data_dir`` and ``max_images`` must match too).

    Returns
    -------
    (dict or None, str)
        ``extra["phases"]`` of notebook 01's verdict (phase -> ``median_s``,
        ``p25_s``, ``p75_s``) when it measured this very job, else None and why not.
    """
    if results is None or not len(results):
        return None, "notebook 01 has no verdict in this run"
    table = verdicts(results)
    rows = table[table["notebook"] == checklist.BASELINE] if len(table) else table
    if not len(rows):
        return None, "notebook 01 has no verdict in this run"
    row = rows.iloc[-1]
    extra = row.get("extra") if isinstance(row.get("extra"), Mapping) else {}
    theirs = row.get("parameters") if isinstance(row.get("parameters"), Mapping) else {}
    phases = extra.get("phases") if isinstance(extra.get("phases"), Mapping) else None
    if phases is None:
        return None, "notebook 01's verdict carries no phase statistics (recorded by an older version)"
    try:
        same = Workload.from_params(theirs) == workload
    except (ParameterError, TypeError, ValueError, KeyError):
        same = False
    same = same and all(str(theirs.get(k) or "") == str(params.get(k) or "") for k in ("data_dir", "max_images", "job"))
    if not same:
        return None, "notebook 01 measured a different job (workload, data_dir, max_images or job differ)"
    return dict(phases), ""


def cross_checks(baseline: "JobVariant", optimized: "JobVariant", full, *, earlier_phases: Mapping | None = None,
                 seed: int = 0, max_drift: float | None = None) -> list:
    """Every cross-check of the before/after comparison (:mod:`helpers.experiments.crosscheck`).

    - the phases none of the optimized job's optimizations acts on must not change (on a CPU, DataLoader workers
      and the prefetcher act on the compute phase too: they share its cores; the device is the jobs' own);
    - the speedup must not exceed what the acted-on phases allow (Amdahl);
    - the baseline's compute phase must agree with notebook 01's, when it measured this job.

    Parameters
    ----------
    baseline, optimized : JobVariant
        Both measured (interleaved).
    full : helpers.timing.Comparison
        :func:`speedup` of the two.
    earlier_phases : mapping, optional
        :func:`earlier_baseline_phases`'s statistics (skipped when None).
    seed : int
    max_drift : float, optional
        Default :data:`helpers.experiments.crosscheck.MAX_PHASE_DRIFT`.

    Returns
    -------
    list of helpers.experiments.crosscheck.CrossCheck
    """
    from helpers.experiments import crosscheck

    drift = crosscheck.MAX_PHASE_DRIFT if max_drift is None else max_drift
    opts = tuple(optimized.config.optimizations)
    base_steps, opt_steps = baseline.steps_frame(), optimized.steps_frame()
    checks = crosscheck.untouched_phases(base_steps, opt_steps, opts, max_drift=drift, seed=seed,
                                         device_kind=getattr(optimized.acc, "kind", ""))
    medians = {p: float(base_steps[p].median()) for p in PHASES}
    checks.append(crosscheck.amdahl(full, medians, opts))
    if earlier_phases and isinstance(earlier_phases.get("compute"), Mapping):
        checks.append(crosscheck.same_job("the baseline's compute phase", earlier_phases["compute"],
                                          list(base_steps["compute"]), where="notebook 01", max_drift=drift))
    return checks


# --------------------------------------------------------------------------- learning and projection


def duration_unit(seconds: float) -> tuple[str, float]:
    """The unit for durations around ``seconds``: (name, seconds per unit).

    Days from 2 days up, hours from 2 hours, minutes from 2 minutes, else seconds.
    """
    if seconds >= 2 * 86400:
        return "days", 86400.0
    if seconds >= 2 * 3600:
        return "hours", 3600.0
    if seconds >= 120:
        return "minutes", 60.0
    return "s", 1.0


@dataclass(frozen=True)
class Projection:
    """How long ``steps`` training steps take before and after, from measured step times.

    Attributes
    ----------
    steps : int
    before_s, after_s : float
        At the median step times, seconds.
    before_range_s, after_range_s : (float, float)
        Before: at the baseline's step-time quartiles; after: before / the
        speedup's interval bounds.
    """

    steps: int
    before_s: float
    after_s: float
    before_range_s: tuple[float, float]
    after_range_s: tuple[float, float]

    def unit(self) -> tuple[str, float]:
        """One unit for every number of this projection, chosen from the before duration (:func:`duration_unit`)."""
        return duration_unit(self.before_s)

    def sentence(self) -> str:
        """The seed's "7 days to 2.5 days" sentence, computed, every number in one unit."""
        name, div = self.unit()

        def f(x: float) -> str:
            return "inf" if not math.isfinite(x) else f"{x / div:.1f}"

        return (f"{self.steps:,} steps: {f(self.before_s)} {name} before (between {f(self.before_range_s[0])} and "
                f"{f(self.before_range_s[1])} at the baseline's step-time quartiles) -> {f(self.after_s)} {name} after "
                f"(between {f(self.after_range_s[0])} and {f(self.after_range_s[1])} at the speedup's 95% interval)")


def project(steps: int, baseline_step, comparison) -> Projection:
    """Project ``steps`` steps before and after.

    Parameters
    ----------
    steps : int
        Training steps (>= 1).
    baseline_step : helpers.timing.Measurement
        The baseline's measured step times.
    comparison : helpers.timing.Comparison
        Baseline vs optimized.

    Returns
    -------
    Projection

    Raises
    ------
    ParameterError
        ``steps < 1``.
    """
    if steps < 1:
        raise ParameterError(f"projection steps={steps}; need >= 1")
    before = steps * baseline_step.median_s
    after = before / comparison.ratio
    lo = before / comparison.ci_high if comparison.ci_high > 0 and math.isfinite(comparison.ci_high) else 0.0
    hi = before / comparison.ci_low if comparison.ci_low > 0 else math.inf
    return Projection(steps=int(steps), before_s=before, after_s=after,
                      before_range_s=(steps * baseline_step.p25_s, steps * baseline_step.p75_s),
                      after_range_s=(lo, hi))


#: The review's target for the end-to-end job (project brief): optimized throughput >= 2.5x the baseline's,
#: on a baseline whose input is exposed for >= 70% of the step.
TARGET_SPEEDUP = 2.5
TARGET_BASELINE_EXPOSED = 0.70


def next_step(summary: JobSummary, *, is_cpu: bool, enabled: Sequence[str], host_bound_threshold: float) -> str:
    """What to try next on a job, from its phase breakdown (which phase dominates now).

    Parameters
    ----------
    summary : JobSummary
        The job (normally the optimized one).
    is_cpu : bool
        Whether the device is the CPU that also prepares the input.
    enabled : sequence of str
        Optimizations already on in the job.
    host_bound_threshold : float
        Exposed-input share above which the job is host-bound.

    Returns
    -------
    str
        One sentence: the phases' shares of the median step and the next
        lever for the dominant one (or for the exposed input when the job is
        host-bound).
    """
    total = summary.data_s + summary.h2d_s + summary.compute_s
    if total <= 0:
        return "no phase time was measured"
    shares = {p: getattr(summary, f"{p}_s") / total for p in PHASES}
    top = max(shares, key=shares.get)
    parts = ", ".join(f"{p} {getattr(summary, f'{p}_s') * 1e3:.1f} ms ({shares[p]:.0%}"
                      f"{': conversion and normalization on the CPU, not a copy' if is_cpu and p == 'h2d' else ''})"
                      for p in PHASES)
    host_bound = summary.exposed_fraction > host_bound_threshold
    if host_bound:
        input_top = "data" if shares["data"] >= shares["h2d"] else "h2d"
        if input_top == "h2d" and is_cpu:
            lever = ("on a CPU the h2d phase is the batch's conversion and normalization: convert fewer bytes "
                     "(smaller crops) or fold the normalization into the model's first layer")
        elif input_top == "h2d":
            todo = [o for o in ("pinned_memory", "prefetcher") if o not in enabled]
            lever = (f"hide the copy ({' and '.join(todo)}, notebooks 04-05)" if todo else
                     "the copy is already pinned and prefetched: send smaller batches (uint8 images, "
                     "normalize on the device)")
        elif is_cpu and "dataset_cache" in enabled:
            lever = ("on a CPU the input shares the cores with the computation and cannot overlap for free; "
                     "nothing is decoded any more (the decode-once cache), so what is left is the crop, resize "
                     "and tokenization per batch: smaller crops, fewer augmentations per step, or a machine with "
                     "idle cores for workers (notebook 03)")
        elif is_cpu:
            lever = ("on a CPU the input shares the cores with the computation and cannot overlap for free, "
                     "so make it cheaper: decode once (notebook 02's dataset cache) or store the images "
                     "pre-resized near the crop size; workers help only with idle cores (notebook 03)")
        else:
            todo = [o for o in ("dataloader_workers", "prefetcher") if o not in enabled]
            lever = (f"overlap the input with compute ({' and '.join(todo)}, notebooks 03 and 05)" if todo else
                     "more DataLoader workers or cheaper decoding (images stored near the crop size)")
        return (f"the median step is {parts}; {top} is the largest phase and the input is still exposed, "
                f"so next: {lever}")
    if top == "compute":
        todo = [o for o in ("mixed_precision", "channels_last") if o not in enabled]
        lever = (f"try {' and '.join(todo)} (notebooks 06-07)" if todo else
                 "a larger batch per step (notebook 09) or a smaller model; the input side no longer limits it")
        return f"the median step is {parts}; compute dominates, so next: {lever}"
    return f"the median step is {parts}; {top} dominates"


#: The notebook that decides the batch size (its verdict's action is on ``batch_size``).
_BATCH_NOTEBOOK = "09_memory_and_batch_size"


def target_sentence(speedup: float, baseline_exposed: float) -> str:
    """Whether the end-to-end target applied and was met, saying which condition decided it.

    The target (:data:`TARGET_SPEEDUP` on a baseline exposed for at least :data:`TARGET_BASELINE_EXPOSED` of
    its step) only applies to a host-bound enough baseline: below that share, no input fix can give the
    target speedup, and the sentence says the target does not apply instead of calling the speedup a failure.
    """
    if baseline_exposed < TARGET_BASELINE_EXPOSED:
        return (f"the target of >= {TARGET_SPEEDUP:g}x applies to a baseline whose input is exposed for >= "
                f"{TARGET_BASELINE_EXPOSED:.0%} of the step; this baseline's was {baseline_exposed:.0%}, so it does "
                f"not apply here ({speedup:.2f}x measured)")
    word = "met" if speedup >= TARGET_SPEEDUP else "not met"
    return (f"target >= {TARGET_SPEEDUP:g}x on a baseline exposed >= {TARGET_BASELINE_EXPOSED:.0%}: {word} "
            f"({speedup:.2f}x, baseline exposed {baseline_exposed:.0%})")


def batch_size_note(results, batch_size: int) -> str:
    """Say that notebook 09's recommended batch is not part of this job, when it differs from ``batch_size``.

    Parameters
    ----------
    results : pandas.DataFrame or None
        This run's records (:func:`helpers.results.load_results`).
    batch_size : int
        This job's batch size.

    Returns
    -------
    str
        Empty when no verdict of this run decides ``batch_size`` (notebook 09's action), it did not
        recommend a change, or it recommended this very batch size. The recommended batch is the action's
        value (for a verdict recorded without an action, ``extra["best_throughput_batch"]``).
    """
    if results is None or not len(results):
        return ""
    table = verdicts(results)
    source, best = None, None
    for _, row in (table.iterrows() if len(table) else ()):
        if _action_value(row, "batch_size") is not None or row.get("notebook") == _BATCH_NOTEBOOK:
            source, best = row, _action_value(row, "batch_size")
    if source is None or str(source.get("recommendation")) != "enable":
        return ""
    if best is None:
        extra = source.get("extra") if isinstance(source.get("extra"), Mapping) else {}
        best = extra.get("best_throughput_batch", source.get("value"))
    try:
        best = int(best)
    except (TypeError, ValueError):
        return ""
    if best == int(batch_size):
        return ""
    number = str(source.get("notebook"))[:2]
    return (f"notebook {number} recommended batch {best}, which is not part of this job: it keeps batch_size "
            f"{int(batch_size)} (notebook 01's workload), so the speedup above does not include it; pass "
            f"batch_size={best} to measure it here")


def e2e_verdict(comparison, learning: LearningCheck, baseline: JobSummary, optimized: JobConfig, *,
                host_bound_threshold: float, optimized_summary: JobSummary | None = None,
                ablation=None, is_cpu: bool = True, recommended: Sequence[str] = (),
                batch_note: str = "", context: str | None = None,
                missing: Sequence[str] = (), ceiling: Mapping[str, Any] | None = None,
                divergence: Any = None) -> Verdict:
    """Decide the end-to-end verdict from the speedup, the learning check and the exposed input.

    "enable" when the interval's lower bound is above 1 (faster for sure) and
    the numerical-agreement check passed; "leave off" otherwise, with the
    reason that decided it. The reason also says whether the baseline and the
    optimized job are host-bound (and, for the optimized job, the next step
    from :func:`next_step`), which optimizations the ablation says to drop,
    and whether the target (:data:`TARGET_SPEEDUP` on a baseline exposed for
    at least :data:`TARGET_BASELINE_EXPOSED`) was met.

    Parameters
    ----------
    comparison : helpers.timing.Comparison
        Baseline vs optimized.
    learning : LearningCheck
    baseline : JobSummary
    optimized : JobConfig
    host_bound_threshold : float
    optimized_summary : JobSummary, optional
        The optimized job's summary (adds its host-bound state and the next step).
    ablation : pandas.DataFrame, optional
        :func:`ablation_frame` with contributions (adds the drop/no-effect decisions).
    is_cpu : bool
        Whether the device is a CPU (for the next step's advice).
    recommended : sequence of str
        Optimizations enabled because their notebook recommended them (named
        as such when the ablation finds no measurable contribution).
    batch_note : str
        :func:`batch_size_note`, appended when non-empty.
    context : str, optional
        What was measured, in one sentence.
    missing : sequence of str
        Notebooks whose verdict this run lacked (their optimizations used the device defaults).
    ceiling : mapping, optional
        :func:`ceiling_fraction` of the optimized job against its input-free ceiling: the reason says the
        fraction with its interval, and ``extra["ceiling"]`` keeps ``fraction``, ``ci_low``, ``ci_high`` and
        ``free_input_speedup``.
    divergence : helpers.jobs.check.Divergence, optional
        Where each job's loss became NaN or infinite (:func:`helpers.jobs.check.loop_divergence` of the jobs,
        the baseline named): when the baseline diverges too, the job diverges, and the verdict is
        "inconclusive" saying so instead of blaming an optimization; when only optimized jobs do, "leave
        off" with the step. Kept in ``extra["divergence"]``.

    Returns
    -------
    helpers.verdict.Verdict
        Notebook 10's: metric ``speedup`` (x, optimized throughput over the baseline's) with its 95% interval;
        ``extra``: ``optimizations``, ``baseline_exposed_fraction``, ``loss_rtol``, ``learning_ok``,
        ``missing_verdicts``, ``ablation`` (optimization -> ``decision``, ``contribution``, ``ci_low``,
        ``ci_high`` of the whole step, ``phases``, ``phase_contribution``, ``phase_low``, ``phase_high`` where it
        acts (what the decision rests on), ``source`` notebook; empty without an ablation). It decides no single setting, so it carries
        no action.
    """
    recommendation, reason = _decide(comparison, learning, baseline, optimized, host_bound_threshold=host_bound_threshold,
                                     optimized_summary=optimized_summary, ablation=ablation, is_cpu=is_cpu,
                                     recommended=recommended, batch_note=batch_note)
    extra_ceiling, extra_divergence = {}, {}
    if divergence is not None and divergence.diverged:  # a loss that is not finite decides before any speed figure
        speed = f"{comparison.ratio:.2f}x throughput (95% CI {comparison.ci_low:.2f}-{comparison.ci_high:.2f})"
        if divergence.baseline_diverged:
            recommendation = "inconclusive"
            reason = f"{divergence.sentence()} (measured: {speed} with {optimized.label()})"
        else:
            recommendation, reason = "leave off", f"{speed} with {optimized.label()}, but {divergence.sentence()}"
        extra_divergence = {"divergence": divergence.as_dict()}
    if ceiling is not None and not extra_divergence:
        reason += (f"; the optimized job runs at {ceiling['fraction']:.0%} of its input-free ceiling (95% CI "
                   f"{ceiling['ci_low']:.0%}-{ceiling['ci_high']:.0%}; the same step on batches already on the "
                   f"device)")
        extra_ceiling = {"ceiling": {k: float(ceiling[k]) for k in ("fraction", "ci_low", "ci_high",
                                                                    "free_input_speedup")}}
    return Verdict(notebook=checklist.END_TO_END, metric="speedup", value=comparison.ratio, unit="x",
                   recommendation=recommendation, reason=reason, context=context,
                   repeats=min(comparison.a.repeats, comparison.b.repeats),
                   spread={"ci_low": comparison.ci_low, "ci_high": comparison.ci_high,
                           "confidence": comparison.confidence},
                   extra={"optimizations": list(optimized.optimizations),
                          "baseline_exposed_fraction": baseline.exposed_fraction, "loss_rtol": learning.tolerance,
                          "learning_ok": learning.ok, "missing_verdicts": list(missing),
                          "ablation": _ablation_evidence(ablation), **extra_ceiling, **extra_divergence,
                          "decision_threshold": 1.0})  # "enable" when the interval's lower bound is above 1


def _ablation_evidence(ablation) -> dict[str, dict[str, Any]]:
    """Optimization name -> its ablation decision and whole-step contribution (for the report's first screen)."""
    out: dict[str, dict[str, Any]] = {}
    if ablation is None or "decision" not in getattr(ablation, "columns", ()):
        return out
    for variant, row in ablation.iterrows():
        if variant == "all":
            continue
        name = str(variant).replace("without ", "")

        def num(key: str) -> float | None:
            x = row.get(key)
            return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None

        out[name] = {"decision": str(row["decision"]), "contribution": num("contribution"),
                     "ci_low": num("contribution_low"), "ci_high": num("contribution_high"),
                     "phases": str(row.get("phases") or ""), "phase_contribution": num("phase_contribution"),
                     "phase_low": num("phase_low"), "phase_high": num("phase_high"),
                     "source": _source_notebooks().get(name, "")}
    return out


def _decide(comparison, learning: LearningCheck, baseline: JobSummary, optimized: JobConfig, *,
            host_bound_threshold: float, optimized_summary: JobSummary | None, ablation, is_cpu: bool,
            recommended: Sequence[str], batch_note: str) -> tuple[str, str]:
    """:func:`e2e_verdict`'s recommendation and reason."""
    def bound(frac: float) -> str:
        return bottleneck.classify(frac, host_bound_threshold).label

    tail = [f"the baseline was {bound(baseline.exposed_fraction)} (input {baseline.exposed_fraction:.0%} of the "
            f"median step, threshold {host_bound_threshold:.0%})"]
    if optimized_summary is not None and optimized.optimizations:
        o = optimized_summary
        if o.exposed_fraction > host_bound_threshold:
            state = "STILL host-bound" if bound(o.exposed_fraction) == bottleneck.HOST_BOUND else "balanced"
            tail.append(f"the optimized job is {state} (input {o.exposed_fraction:.0%} of the median step): "
                        + next_step(o, is_cpu=is_cpu, enabled=optimized.optimizations,
                                    host_bound_threshold=host_bound_threshold))
        else:
            tail.append(f"the optimized job is device-bound (input {o.exposed_fraction:.0%} of the median step): "
                        + next_step(o, is_cpu=is_cpu, enabled=optimized.optimizations,
                                    host_bound_threshold=host_bound_threshold))
    if ablation is not None and "decision" in getattr(ablation, "columns", ()):
        notes = []
        for variant, row in ablation.iterrows():
            if variant == "all" or row["decision"] in ("", "keep it"):
                continue
            name = str(variant).replace("without ", "")
            who = f"recommended by notebook {_source_notebooks().get(name, '??')[:2]}, but " if name in recommended else ""
            where = ""
            if "phase_contribution" in row and isinstance(row.get("phases"), str) and row["phases"] \
                    and math.isfinite(row["phase_contribution"]):
                where = (f"{row['phases']} phase {row['phase_contribution']:.2f}x, 95% CI {row['phase_low']:.2f}-"
                         f"{row['phase_high']:.2f}; ")
            what = ("no measurable contribution in this end-to-end job"
                    if row["decision"] == "no measurable contribution here" else row["decision"])
            notes.append(f"{name}: {who}{what} ({where}whole step {row['contribution']:.2f}x, 95% CI "
                         f"{row['contribution_low']:.2f}-{row['contribution_high']:.2f})")
        if notes:
            tail.append("ablation: " + "; ".join(notes))
    if batch_note:
        tail.append(batch_note)
    tail.append(target_sentence(comparison.ratio, baseline.exposed_fraction))
    rest = "; ".join(tail)
    opts = optimized.label()
    if not optimized.optimizations:
        return "not applicable", f"no optimization selected, so the optimized job is the baseline; {rest}"
    speed = f"{comparison.ratio:.2f}x throughput (95% CI {comparison.ci_low:.2f}-{comparison.ci_high:.2f})"
    if not learning.ok:
        return "leave off", f"{speed} with {opts}, but {learning.sentence()}; {rest}"
    if comparison.ci_low > 1.0:
        return "enable", f"{speed} with {opts}; {learning.sentence()}; {rest}"
    return "leave off", f"not reliably faster: {speed} with {opts}; {learning.sentence()}; {rest}"


# --------------------------------------------------------------------------- the "try it" panel: optimizations on/off

#: Short names of the optimizations for a chart's axis.
SHORT_NAMES: dict[str, str] = {"batched_decode": "decode", "dataset_cache": "cache", "dataloader_workers": "workers",
                               "pinned_memory": "pin", "prefetcher": "prefetch", "mixed_precision": "amp",
                               "channels_last": "NHWC"}


def live_point(comparison: Comparison, config: JobConfig, *, baseline: JobSummary | None = None,
               optimized: JobSummary | None = None, label: str | None = None) -> LivePoint:
    """A speedup over the baseline job as a "try it" point: the ratio, its bootstrap interval and the outcome.

    Parameters
    ----------
    comparison : helpers.timing.Comparison
        :func:`speedup` of the baseline (A) and the job (B): ratio > 1 means the job is faster.
    config : JobConfig
        The job's optimizations (the label and the sentence name them).
    baseline, optimized : JobSummary, optional
        Both jobs' summaries, for the exposed input share in the sentence.
    label : str, optional
        Default: the short names of the optimizations joined by "+" (``"none (A/A)"`` for the baseline itself).

    Returns
    -------
    LivePoint
        metric ``speedup``, unit ``x`` (baseline median step time / the job's), ``low``/``high``: its 95%
        bootstrap interval; ``extra``: ``optimizations``, ``outcome`` and, with the summaries, both exposed
        input shares and throughputs.
    """
    label = label or ("+".join(SHORT_NAMES.get(o, o) for o in config.optimizations) or "none (A/A)")
    extra: dict[str, Any] = {"optimizations": list(config.optimizations), "outcome": comparison.outcome(),
                             "steps": comparison.a.repeats}
    exposed = ""
    if baseline is not None and optimized is not None:
        extra.update(baseline_exposed_fraction=baseline.exposed_fraction,
                     exposed_fraction=optimized.exposed_fraction, baseline_throughput=baseline.throughput,
                     throughput=optimized.throughput)
        exposed = (f"; {baseline.throughput:,.0f} -> {optimized.throughput:,.0f} samples/s, exposed input "
                   f"{baseline.exposed_fraction:.0%} -> {optimized.exposed_fraction:.0%} of the median step")
    said = {"b_faster": "faster", "a_faster": "slower", "below_threshold": "a difference below 5%",
            "no_difference": "no measurable difference: the interval spans 1"}[comparison.outcome()]
    sentence = (f"{label} ({config.label()}): {comparison.ratio:.2f}x the baseline's throughput (95% CI "
                f"{comparison.ci_low:.2f}-{comparison.ci_high:.2f}, {comparison.a.repeats} interleaved steps "
                f"each: {said}){exposed}")
    return LivePoint.from_comparison(label, comparison, sentence=sentence, **extra)


def try_optimizations(job: PPOJob, acc, *, steps: int, warmup_steps: int, num_workers: int = 2,
                      amp_dtype: str = "bfloat16", seed: int = 0, block: int = 2,
                      unavailable: Mapping[str, str] | None = None, progress: Progress = no_progress,
                      **switches: bool) -> LivePoint:
    """Notebook 10's before/after comparison with the optimizations switched on and off by hand.

    A baseline job and a job with the optimizations switched on are built as the notebook builds its jobs
    (:class:`JobVariant` on the notebook's job: same seed, same batches, same initial weights), timed in the
    same rotation (:func:`run_interleaved`: each job's warm-up first, then blocks of ``block`` steps, the
    order reversed every round; every phase closed by a device synchronize), and compared by :func:`speedup`.
    With every switch off the second job is the baseline itself: an A/A comparison, whose interval shows the
    noise of this machine.

    Parameters
    ----------
    job : helpers.jobs.base.Job
        The notebook's job (the built-in PPO job, or the user's: then ``batched_decode`` and
        ``dataset_cache`` are not available, see ``unavailable``).
    acc : helpers.device.Accelerator
    steps, warmup_steps : int
        Measured (>= 1) and excluded (>= 0) steps per job.
    num_workers : int
        DataLoader worker processes when ``dataloader_workers`` is on (>= 1; the notebook's selection's).
    amp_dtype : {"bfloat16", "float16"}
        Autocast dtype when ``mixed_precision`` is on (the notebook's selection's).
    seed : int
        Seed of the bootstrap interval.
    block : int
        Steps per job per turn.
    unavailable : mapping of str to str, optional
        Optimizations this job cannot use, with why (the notebook's ``unavailable``).
    progress : callable
        ``progress(done, total)`` in steps of both jobs, after each block (outside the timing).
    **switches : bool
        One per optimization name of :data:`OPTIMIZATIONS` (``batched_decode=True, channels_last=False, ...``);
        a name not given is off.

    Returns
    -------
    LivePoint
        See :func:`live_point`: metric ``speedup``, unit ``x``, with its 95% bootstrap interval. ``extra`` also
        holds what the optimized job really ran with, read from its objects: ``num_workers`` (its DataLoader's),
        ``pin_memory``, ``prefetcher``, ``autocast_dtype``, ``channels_last``, ``dataset`` (its class).

    Raises
    ------
    helpers.errors.ParameterError
        A switch that is not an optimization name or not a bool; an optimization switched on without the one it
        requires (``dataset_cache`` needs ``batched_decode``) or one this job cannot use; counts or settings
        :class:`JobConfig` and :func:`run_interleaved` reject.
    """
    unknown = [n for n in switches if n not in registry.optimization_names()]
    if unknown:
        raise ParameterError(f"unknown optimization switch(es) {', '.join(map(repr, unknown))}; valid: "
                             f"{', '.join(registry.optimization_names())}")
    bad = {n: v for n, v in switches.items() if not isinstance(v, bool)}
    if bad:
        raise ParameterError(f"optimization switches are True or False, got {bad!r}")
    enabled = tuple(n for n in registry.optimization_names() if switches.get(n, False))
    for name in enabled:
        why = (unavailable or {}).get(name)
        if why:
            raise ParameterError(f"{name} is not available for this job: {why}; switch it off")
        needs = registry.optimization(name).requires
        if needs and needs not in enabled:
            raise ParameterError(f"{name} works only together with {needs}: switch {needs} on too, or {name} off")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ParameterError(f"steps={steps!r} must be an int >= 1 (measured steps per job)")
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
        raise ParameterError(f"warmup_steps={warmup_steps!r} must be an int >= 0")
    config = JobConfig("try it", enabled, num_workers=int(num_workers), amp_dtype=str(amp_dtype))
    total = 2 * (int(warmup_steps) + int(steps))
    done = [0]

    def tick(_done: int, _steps: int) -> None:  # after every step of either job, outside its timing
        done[0] += 1
        progress(min(done[0], total), total)

    base = opt = None
    try:
        base = JobVariant(JobConfig("baseline"), job, acc)
        opt = JobVariant(config, job, acc)
        run_interleaved([base, opt], steps=steps, warmup_steps=warmup_steps, block=block, progress=tick)
        c = speedup(base, opt, seed=seed)
        loader = opt.loader
        ran = {"num_workers": int(getattr(loader, "num_workers", 0)),
               "pin_memory": bool(opt.non_blocking),  # pinned where the device has pinned memory (not a CPU)
               "prefetcher": opt.prefetcher is not None,
               "autocast_dtype": str(opt.options.autocast_dtype).replace("torch.", "")
               if opt.options.autocast_dtype is not None else None,
               "channels_last": bool(opt.options.channels_last), "dataset": type(opt.dataset).__name__}
        point = live_point(c, config, baseline=summarize(base), optimized=summarize(opt))
        return replace(point, extra={**point.extra, **ran})
    finally:
        for v in (base, opt):
            if v is not None:
                v.close()


# -- the notebook's declaration, found by helpers.experiments.registry ------------------------------------

EXPERIMENT = Experiment(
    item=Item("10", "10_end_to_end", "end to end",
         "Prove the speedup end to end: the same training job before and after",
         "The baseline job vs the same job with every optimization the earlier verdicts recommend"),
    spec=specs.COMMON + specs.DATA + specs.batch() + specs.training(
        "measured training steps per job") + (
        Param("optimizations", list, ["auto"],
              "optimizations of the optimized job: auto follows the earlier verdicts of this run; or names "
              "of the optimizations the earlier notebooks decide (an unknown name is rejected with the list)",
              item_kind=str),
        Param("ablation", bool, True, "also run the optimized job with each optimization removed in turn"),
        Param("curve_steps", int, 30, "training steps of the learning curves of both jobs", minimum=2,
              maximum=100000),
        Param("loss_rtol", float, 0.10,
              "tolerance of optimized vs baseline mean loss over the last steps, as a share of the loss's scale over the run",
              minimum=0.0, maximum=10.0),
        Param("projection_steps", int, 100000, "training steps of the projected full job (before vs after)",
              minimum=1, maximum=10**12),
        Param("host_bound_threshold", float, 0.10,
              "exposed input time / step time above which the job is called host-bound", minimum=0.0, maximum=1.0),
    ) + specs.JOB,
    interleaved_repeats="steps",
)
