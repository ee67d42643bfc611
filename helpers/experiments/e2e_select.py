"""Notebook 10's choice of optimizations: from this run's verdicts, an explicit list, or the device's defaults.

Under ``optimizations=["auto"]`` each optimization follows the verdict of the notebook that decides it
(:func:`helpers.experiments.registry.optimizations`: its ``notebook`` and ``decision``); one without a verdict of
this run stays off ("not measured"), or takes its stated default on this device (its ``default`` hook,
:func:`device_defaults`) where the caller asks for it (``bench end-to-end`` without a run folder).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

import pandas as pd

from helpers.compute.amp import resolve_autocast_dtype
from helpers.device import usable_cores
from helpers.errors import ParameterError
from helpers.experiments import registry
from helpers.experiments.e2e_jobs import JobConfig, check_optimizations
from helpers.process import cli_command
from helpers.results import verdicts
from helpers.units import format_value, is_number
from helpers.verdict import Action

log = logging.getLogger(__name__)

def source_notebooks() -> dict[str, str]:
    """The notebook whose verdict decides each optimization under ``optimizations=["auto"]``."""
    return {o.name: o.notebook for o in registry.optimizations()}


def __getattr__(name: str):
    """``SOURCE_NOTEBOOKS``: the registry's, read when asked for (the registry imports this module, so it cannot be read
    at import time)."""
    if name == "SOURCE_NOTEBOOKS":
        return source_notebooks()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class Choice:
    """Whether one optimization is on in the optimized job, and why.

    Attributes
    ----------
    name : str
        One of :func:`helpers.experiments.registry.optimization_names`.
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
        Enabled names, in checklist order (:func:`helpers.experiments.registry.optimization_names`).
    choices : tuple of Choice
        One per optimization name.
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

    def job(self, name: str = "optimized") -> JobConfig:
        """The :class:`helpers.experiments.e2e_jobs.JobConfig` of the optimized job."""
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
                 and source_notebooks().get(c.name) in self.missing]
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


def workload_warning(params: Mapping[str, Any] | None, workload, notebook: str, *,
                     enabled: bool = True, name: str = "", enabled_names: Sequence[str] = ()) -> str:
    """Say when ``notebook``'s recorded parameters ran a different image_size / model_width than ``workload``.

    Parameters
    ----------
    params : mapping or None
        The ``parameters`` of the notebook's verdict record.
    workload : helpers.jobs.base.Workload or None
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
    differ = [k for k in ("image_size", "model_width")
              if k in params and params[k] is not None and int(params[k]) != int(getattr(workload, k))]
    if not differ:
        return ""
    units = {"image_size": " px", "model_width": " channels"}
    diffs = [f"{k} {int(params[k])}{units[k]} there vs {int(getattr(workload, k))}{units[k]} here" for k in differ]
    head = (f"notebook {notebook[:2]} measured a different job ({'; '.join(diffs)}): its verdict may not hold for "
            "this job")
    if enabled:
        return f"{head}; the ablation below (section 5) measures it on this job"
    sizes = " and ".join(f"{k} {int(getattr(workload, k))}" for k in differ)
    names = [n for n in registry.optimization_names() if n in set(enabled_names) | ({name} if name else set())]
    listed = ", ".join(f'"{n}"' for n in names)
    return (f"{head}; not enabled, so not measured here: rerun notebook {notebook[:2]} at {sizes} before this one, "
            f"or pass optimizations=[{listed}] to measure it in this job")


def device_defaults(acc, *, native_bf16: bool | None = None) -> dict[str, tuple[bool, str]]:
    """The stated default of each optimization on this device, used where no verdict exists.

    Each optimization's ``default(acc, native_bf16)`` hook, in checklist order
    (:func:`helpers.experiments.registry.optimizations`).

    Parameters
    ----------
    acc : helpers.device.Accelerator
    native_bf16 : bool, optional
        Whether the CPU has native bf16 arithmetic
        (:func:`helpers.diagnose.environment.cpu_bf16_support`); None: each hook reads it where it needs it
        (mixed precision on a CPU).

    Returns
    -------
    dict
        name -> (enabled, reason). Batched decode always; workers, pinned memory
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


def action_value(row, setting: str) -> Any:
    """The value of a verdict's structured action on ``setting`` (None if it has none).

    Parameters
    ----------
    row : mapping or pandas.Series
        A verdict record (:func:`helpers.results.verdicts`).
    setting : str
        E.g. ``"num_workers"``, ``"batch_size"``.
    """
    extra = row.get("extra") if isinstance(row.get("extra"), dict) else {}
    action = Action.from_dict(extra.get("action"))
    return action.value if action is not None and action.setting == setting else None


def _verdict_table(results):
    """This run's verdicts indexed by notebook, or None when there are none."""
    if results is None or not len(results):
        return None
    table = verdicts(results)
    return table.set_index("notebook") if len(table) else None


def _settings(table, acc, default_workers: int | None) -> tuple[int, str]:
    """The worker count (notebook 03's action) and autocast dtype (notebook 06's parameter), whatever the mode."""
    workers = default_workers if default_workers is not None else max(1, min(4, usable_cores()))
    dtype = _default_dtype(acc)
    workers_nb = registry.optimization("dataloader_workers").notebook
    if table is not None and workers_nb in table.index:
        best = action_value(table.loc[workers_nb], "num_workers")
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
    return int(workers), dtype


def _verdict_choice(name: str, table, job_spec: str, defaults, fallback: str, missing: list) -> Choice:
    """One optimization under ``auto``: its notebook's verdict (or own decision), or the fallback without one."""
    opt = registry.optimization(name)
    nb = opt.notebook
    if table is None or nb not in table.index:
        if nb not in missing:  # one notebook may decide two optimizations
            missing.append(nb)
        on, why = defaults[name]
        return Choice(name, on, fallback, f"no verdict from {nb[:2]}; {why}")
    row = table.loc[nb]
    row_params = row.get("parameters")
    if isinstance(row_params, Mapping) and str(row_params.get("job") or "") != str(job_spec or ""):
        if nb not in missing:
            missing.append(nb)
        on, why = defaults[name]
        return Choice(name, on, fallback, f"notebook {nb[:2]} measured another job; {why}")
    check = "" if row_params is None else "check"  # the workload is compared once the enabled set is known
    if opt.decision:
        extra = row.get("extra") if isinstance(row.get("extra"), Mapping) else {}
        own = extra.get(opt.decision) if isinstance(extra.get(opt.decision), Mapping) else None
        if own is None:  # the notebook ran without measuring this one
            on, why = defaults[name]
            return Choice(name, on, fallback, f"notebook {nb[:2]} did not measure it; {why}")
        rec = str(own.get("recommendation"))
        return Choice(name, rec == "enable", "verdict", f"notebook {nb[:2]} ({opt.decision}): {rec}",
                      "" if rec == "not applicable" else check)
    rec = str(row.get("recommendation"))
    value = row.get("value")
    vtxt = f" ({format_value(value, row.get('unit'))})" if is_number(value) else ""
    # a "not applicable" verdict (capability absent) holds whatever the workload
    return Choice(name, rec == "enable", "verdict", f"notebook {nb[:2]}: {rec}{vtxt}",
                  "" if rec == "not applicable" else check)


def select_optimizations(requested: Sequence[str], results, acc, *, native_bf16: bool | None = None,
                         default_workers: int | None = None, workload=None,
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
        The ``optimizations`` parameter (see :func:`helpers.experiments.e2e_jobs.check_optimizations`).
    results : pandas.DataFrame or None
        This run's records (:func:`helpers.results.load_results`); None or
        empty when there are none (notebook 10 run alone).
    acc : helpers.device.Accelerator
    native_bf16 : bool, optional
        See :func:`device_defaults`.
    default_workers : int, optional
        Workers when notebook 03 recorded none; default ``min(4, usable cores)``.
    workload : helpers.jobs.base.Workload, optional
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
    table = _verdict_table(results)
    workers, dtype = _settings(table, acc, default_workers)
    choices, missing = [], []
    unavailable = dict(unavailable or {})
    for name in registry.optimization_names():
        if name in unavailable:
            choices.append(Choice(name, False, "job", f"not available for this job: {unavailable[name]}"))
        elif names != ("auto",):
            on = name in names
            choices.append(Choice(name, on, "requested", "in the optimizations list" if on else "not requested"))
        else:
            choices.append(_verdict_choice(name, table, job_spec, defaults, fallback, missing))
    choices = _finish(choices, table, workload)
    return Selection(optimizations=tuple(c.name for c in choices if c.enabled), choices=tuple(choices),
                     missing=tuple(missing), num_workers=workers, amp_dtype=dtype)


def _finish(choices: list[Choice], table, workload) -> list[Choice]:
    """Switch off what lacks the optimization it requires, then word the workload warnings of the enabled set."""
    on = {c.name for c in choices if c.enabled}
    for i, c in enumerate(choices):  # an optimization that works only with another is off without it
        needs = registry.optimization(c.name).requires
        if c.enabled and needs and needs not in on:
            choices[i] = replace(c, enabled=False, detail=f"{c.detail}; but it needs {needs}, which is off")
    enabled = tuple(c.name for c in choices if c.enabled)
    for i, c in enumerate(choices):  # now that the enabled set is known (a disabled one is not measured here)
        if c.warning:
            nb = registry.optimization(c.name).notebook
            choices[i] = replace(c, warning=workload_warning(table.loc[nb].get("parameters"), workload, nb,
                                                             enabled=c.enabled, name=c.name, enabled_names=enabled))
    return choices
