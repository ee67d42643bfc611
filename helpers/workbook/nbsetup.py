"""The first code cell of every notebook: validate, pick the device, open the results.

One call, ``start(notebook_id, globals())``, does in order what every
notebook needs before any work, so that a bad parameter or an unusable device
fails in the first seconds with a clear message:

1. validate the parameters cell's values against the notebook's spec
   (helpers/specs.py), coercing papermill's strings; for a user's job, list the
   sizes the user did not set in ``params["factory_defaults"]`` (their factory
   keeps its own; :func:`factory_defaults`);
2. probe torch_npu in a child process before ``import torch`` (a broken
   torch_npu install otherwise crashes the kernel on import; huggingface/accelerate#3754);
3. resolve the device (``auto`` / ``cpu`` / ``cuda`` / ``npu``);
4. seed Python, NumPy and torch; open the results store and the figure folder.
"""

from __future__ import annotations

import logging
import math
import random
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from helpers import machine
from helpers.fsutil import ensure_writable_dir
from helpers.jobspec import FACTORY_DEFAULTS_KEY, JOB_SIZE_PARAMS
from helpers.npu_probe import prepare_torch_import
from helpers.experiments.registry import interleaved_repeats, spec_for, validate_notebook_params
from helpers.specs import injected_parameter_names
from helpers.workbook.paths import interactive_dir

log = logging.getLogger(__name__)


@dataclass
class NotebookContext:
    """What a notebook's cells share after ``start``.

    Attributes
    ----------
    notebook : str
        Notebook id, e.g. "01_baseline_profiling".
    params : dict
        Validated parameters.
    acc : helpers.device.Accelerator
        The device view.
    store : helpers.results.ResultsStore
        Where this notebook's records go.
    out_dir : pathlib.Path
        Folder for this run's artefacts; figures go to ``out_dir / "figures"``.
    """

    notebook: str
    params: dict
    acc: Any
    store: Any
    out_dir: Path
    probe: Any = None
    figures: list = field(default_factory=list)
    machine_before: Any = None

    def record(self, result, *, show: bool = True):
        """Write an experiment's result: its records, then its verdict through the busy-machine guard.

        This is the one way a notebook writes to its results (``tests/test_layers.py`` fails a notebook or an
        experiment that writes records or verdicts around it).

        Parameters
        ----------
        result : helpers.experiments.base.ExperimentResult
            What the experiment returned; its ``records()`` are written in order, and its ``verdict()`` (when
            not None) through the busy-machine guard: the check (:func:`helpers.machine.check`, threshold:
            the ``busy_cpu_share`` parameter) since ``start`` is recorded as an ``experiment="machine state"``
            record and in the verdict's ``extra["machine"]``; what a busy machine does to the verdict is
            :func:`guard_verdict`'s rule.
        show : bool, default True
            Print the recorded verdict's sentence (the guarded one: "inconclusive" when the machine was busy).

        Returns
        -------
        helpers.verdict.Verdict or None
            The verdict as recorded (after the guard), or None when the result decides nothing.

        Raises
        ------
        TypeError
            If ``result`` is not an :class:`helpers.experiments.base.ExperimentResult`.
        """
        from helpers.experiments.base import ExperimentResult

        if not isinstance(result, ExperimentResult):
            raise TypeError(f"ctx.record: expected an experiment's result (helpers.experiments.base."
                            f"ExperimentResult), got {type(result).__name__}; record what the experiment's run "
                            "returned")
        self.store.write(result.records())
        verdict = result.verdict()
        if verdict is None:
            return None
        recorded = self._guarded_verdict(verdict)
        if show:
            print(recorded.text())
        return recorded

    def _guarded_verdict(self, verdict):
        before = self.machine_before or machine.snapshot()
        c = machine.check(before, machine.snapshot(),
                          max_other_cpu_share=float(self.params.get("busy_cpu_share") or machine.MAX_OTHER_CPU_SHARE))
        self.store.add("machine state", "while measuring", "other_cpu_share", c.other_cpu_share, "fraction", busy=c.busy,
                       load_per_core=c.load_per_core, seconds=c.seconds, reasons=list(c.reasons))
        guarded = guard_verdict(verdict, c)
        self.store.add_verdict(guarded)
        return guarded

    def job(self):
        """The job this notebook measures (:func:`helpers.jobs.load.notebook_job` of :attr:`params`).

        For a user's job, ``params["batch_size"]`` (and the parameters stored with every later record) are set
        to the batch size the job really has (``job.workload.batch_size``: its factory's own default unless the
        user set one), so that every figure, record and sentence downstream names the batch measured; an
        ``image_size`` the factory kept as its own is dropped from the stored parameters (the workbook does not
        know it).

        Returns
        -------
        helpers.jobs.base.Job

        Raises
        ------
        helpers.jobs.supervised.JobError, helpers.errors.DataError
            As :func:`helpers.jobs.load.notebook_job`.
        """
        from helpers.jobs.load import notebook_job

        job = notebook_job(self.params)
        if self.params.get("job"):
            self.use_job_batch(job.workload.batch_size)
        return job

    def shown_params(self) -> dict:
        """The parameters as a notebook's second cell shows them: without the output paths, and each size that a
        user's job keeps at its factory's own default marked so (the workbook reads its value from the job when
        the experiment loads it, e.g. the batch size: :meth:`job`), instead of the notebook's default.

        Returns
        -------
        dict
            Parameter name -> value, in the parameters cell's order.
        """
        own = set(self.params.get(FACTORY_DEFAULTS_KEY) or ())
        hidden = {"results_path", "out_dir", FACTORY_DEFAULTS_KEY}
        return {k: ("your job's own default" if k in own else v) for k, v in self.params.items() if k not in hidden}

    def use_job_batch(self, batch_size: int) -> None:
        """Make ``params["batch_size"]`` and the parameters stored with every later record say the batch a user's
        job really has (read from the job, e.g. by :meth:`job`, or from what its ranks trained, notebook 08).

        Parameters
        ----------
        batch_size : int
            Samples per step (per rank under DDP).
        """
        self.params["batch_size"] = int(batch_size)
        if self.store is not None:
            self.store.parameters["batch_size"] = int(batch_size)
            if "image_size" in (self.params.get(FACTORY_DEFAULTS_KEY) or ()):
                self.store.parameters.pop("image_size", None)  # the factory's own: the workbook does not know it

    def earlier_results(self):
        """This run's records so far (every earlier notebook's, from the results file), e.g. for notebook 10's
        choice of optimizations from their verdicts.

        Returns
        -------
        pandas.DataFrame or None
            :func:`helpers.results.load_results` of the store's file (empty when it has none yet); None when the
            store has no file.
        """
        from helpers.results import load_results

        path = getattr(self.store, "path", None)
        return load_results(path) if path else None

    @property
    def results_path(self) -> Path | None:
        """The run's results file (earlier notebooks' records are read from it; this one's go through
        :meth:`record`), or None for an in-memory store."""
        return self.store.path if self.store is not None else None

    @property
    def figures_dir(self) -> Path:
        """Folder where figures of every notebook of the run are written."""
        return self.out_dir / "figures"

    @property
    def artifacts_dir(self) -> Path:
        """Folder for this notebook's other artefacts (traces, tables)."""
        return self.out_dir / "artifacts" / self.notebook


#: The key of ``Verdict.extra`` where a verdict whose value is a ratio measured interleaved (A and B timed in
#: alternation: :func:`helpers.timing.compare`, notebook 03's rotated trials, notebook 10's rotation) records the
#: decision threshold it was judged against (x, >= 1; e.g. 1.05: "at least 5% faster"). Only such a verdict may stay
#: conclusive on a busy machine (:func:`guard_verdict`).
DECISION_THRESHOLD = "decision_threshold"


def ratio_decision(verdict) -> tuple[float, float, float, float] | None:
    """The interval and threshold of a verdict decided on an interleaved ratio: ``(ci_low, ci_high, threshold,
    confidence)``, or None for any other verdict (a share such as notebook 01's exposed input, a ratio without a
    95% (or wider) interval or without :data:`DECISION_THRESHOLD`).

    Parameters
    ----------
    verdict : helpers.verdict.Verdict

    Returns
    -------
    tuple of float or None
        Interval bounds and threshold in x; ``confidence`` as a fraction (0.95 where the spread does not say).
    """
    spread, extra = verdict.spread or {}, verdict.extra or {}
    try:
        lo, hi = float(spread["ci_low"]), float(spread["ci_high"])
        threshold = float(extra[DECISION_THRESHOLD])
        confidence = float(spread.get("confidence", 0.95))
    except (KeyError, TypeError, ValueError):
        return None
    if (verdict.unit != "x" or not all(math.isfinite(x) for x in (lo, hi, threshold)) or threshold < 1.0 or lo > hi
            or confidence < 0.95):
        return None
    return lo, hi, threshold, confidence


def guard_verdict(verdict, check):
    """The busy-machine guard: what other processes' load while measuring does to a verdict.

    The rule, keyed on the verdict's kind:

    * quiet machine (``check.busy`` false): the verdict as it is;
    * "not applicable" (nothing measured): kept, and so is a verdict that says the job diverges
      (``extra["divergence"]``: a loss that is not finite does not depend on the load);
    * an "enable" or "leave off" decided on a ratio measured interleaved, with a 95% interval and a decision
      threshold (:func:`ratio_decision`): the load slows A and B alike, so the verdict stands when the interval
      clears the threshold on the side the verdict says ("enable": the whole interval above it; "leave off": the
      whole interval below it) and its reason says the load and the interval; otherwise it becomes
      "inconclusive", and the reason says that more repeats (the notebook's repeat parameter, the runner's
      ``--patience``) can narrow the interval;
    * anything else, shares such as notebook 01's exposed input included (other processes change how much of
      the step the input takes), and a verdict the notebook already called inconclusive: "inconclusive", its
      reason led by the machine's state and keeping what was measured.

    An inconclusive verdict keeps the measured recommendation in ``extra["measured_recommendation"]`` (for a
    verdict the notebook already called inconclusive, the one it recorded there) and loses its action: noise never
    prints a confident recommendation.

    Parameters
    ----------
    verdict : helpers.verdict.Verdict
    check : helpers.machine.BusyCheck
        The machine's state over the measurement.

    Returns
    -------
    helpers.verdict.Verdict
        With ``extra["machine"]`` (the check's fields, and ``verdict_stands`` on a busy machine).
    """
    state = check.as_dict()
    extra = {**dict(verdict.extra), "machine": state}
    diverged = isinstance(verdict.extra.get("divergence"), Mapping)  # a NaN loss is no timing: load cannot undo it
    if not check.busy or verdict.recommendation == "not applicable" or diverged:
        return replace(verdict, extra=extra)
    ratio = ratio_decision(verdict) if verdict.recommendation in ("enable", "leave off") else None
    load = f"measured while other processes took {check.other_cpu_share:.0%} of the cores"
    if ratio is not None:
        lo, hi, threshold, confidence = ratio
        interval = f"the {confidence:.0%} interval {lo:.2f}-{hi:.2f}x"
        if verdict.recommendation == "enable" and lo > threshold:
            state["verdict_stands"] = True
            return replace(verdict, extra=extra, reason=f"{verdict.reason}; {load}; {interval} clears the "
                                                        f"{threshold:.2f}x threshold, so the verdict stands")
        if verdict.recommendation == "leave off" and hi < threshold:
            state["verdict_stands"] = True
            return replace(verdict, extra=extra, reason=f"{verdict.reason}; {load}; {interval} lies below the "
                                                        f"{threshold:.2f}x threshold, so the verdict stands")
        param = interleaved_repeats().get(verdict.notebook)
        more = (f"this notebook's {param!r} parameter, or the runner's --patience K for every notebook"
                if param else "the runner's --patience K")
        why = (f"{check.sentence()}, or measure more repeats ({more}): {interval} does not clear the "
               f"{threshold:.2f}x threshold")
    else:
        why = check.sentence()
    state["verdict_stands"] = False
    if verdict.recommendation != "inconclusive" or "measured_recommendation" not in extra:
        extra["measured_recommendation"] = verdict.recommendation  # a notebook's own inconclusive keeps its label
    measured = verdict.reason
    if not measured.startswith(f"{verdict.recommendation}: "):  # a notebook's own "inconclusive: ..." says it once
        measured = f"{verdict.recommendation}: {measured}"
    return replace(verdict, recommendation="inconclusive", action=None, extra=extra,
                   reason=f"{why}. What it measured: {measured}")


def factory_defaults(notebook: str, namespace: Mapping[str, Any], params: Mapping[str, Any]) -> list[str]:
    """The sizes (:data:`helpers.jobspec.JOB_SIZE_PARAMS`) a user's job keeps at its factory's own defaults.

    A size counts as set by the user when papermill injected it (the runner passes a size to a user's job only
    for ``-p``: a profile's sizes are for the built-in job), or, with nothing injected (JupyterLab), when the
    parameters cell holds another value than the notebook's default.

    Parameters
    ----------
    notebook : str
        Notebook id.
    namespace : mapping
        The notebook's ``globals()`` (papermill's injected cell is read from its input history).
    params : mapping
        The validated parameters.

    Returns
    -------
    list of str
        In :data:`~helpers.jobspec.JOB_SIZE_PARAMS` order; empty for the built-in job (``params["job"]`` empty).
    """
    if not params.get("job"):
        return []
    injected = injected_parameter_names(namespace)
    defaults = {p.name: p.default for p in spec_for(notebook)}
    return [name for name in JOB_SIZE_PARAMS if name in params
            and not (name in injected if injected else params[name] != defaults.get(name))]


def _writable_dir(path: Path, what: str) -> Path:
    return ensure_writable_dir(path, what=what,
                               hint="pass a writable folder (runner: --out DIR; notebook: out_dir=...)")


def start(notebook: str, namespace: Mapping[str, Any], *, need_device: bool = True) -> NotebookContext:
    """Validate parameters, pick the device and open the results store.

    Parameters
    ----------
    notebook : str
        Notebook id (file stem), e.g. "01_baseline_profiling".
    namespace : mapping
        The notebook's ``globals()``: the parameters are read from it by name.
    need_device : bool
        Resolve the accelerator (False for notebooks that only read results).

    Returns
    -------
    NotebookContext

    Raises
    ------
    helpers.errors.ParameterError
        A parameter is of the wrong type, out of range or not allowed.
    helpers.errors.DeviceUnavailableError
        The requested device cannot be used here (the message says why).
    helpers.errors.OutputDirError
        The output folder cannot be written.
    """
    params = validate_notebook_params(notebook, namespace, allow_unknown=True)
    if params.get("job"):  # the sizes the user did not set: their factory's own defaults stand
        params[FACTORY_DEFAULTS_KEY] = factory_defaults(notebook, namespace, params)
    from helpers.stuck import arm_cell_watchdog

    arm_cell_watchdog()  # under the runner: a cell stuck near its --timeout dumps its stacks and says where first
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    out_dir = Path(params["out_dir"]) if params.get("out_dir") else interactive_dir()
    _writable_dir(out_dir, "out_dir")
    results_path = Path(params["results_path"]) if params.get("results_path") else out_dir / "results.jsonl"
    _writable_dir(results_path.parent, "results_path folder")

    probe = prepare_torch_import(fallback_to_cpu=True)

    # torch (and everything that imports it) only after the probe: a broken torch_npu would crash the kernel
    import numpy as np
    import torch

    seed = int(params.get("seed", 0))
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)

    acc = None
    device_name = None
    if need_device:
        from helpers.device import get_accelerator

        acc = get_accelerator(params.get("device", "auto"))
        device_name = f"{acc.kind}:{acc.name}"

    from helpers.results import ResultsStore

    store = ResultsStore(results_path, notebook=notebook, device=device_name, parameters=params)
    ctx = NotebookContext(notebook=notebook, params=params, acc=acc, store=store, out_dir=out_dir,
                          probe=probe, machine_before=machine.snapshot())
    ctx.figures_dir.mkdir(parents=True, exist_ok=True)
    return ctx
