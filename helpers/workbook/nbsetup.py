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
import random
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from helpers import machine
from helpers.fsutil import ensure_writable_dir
from helpers.jobspec import FACTORY_DEFAULTS_KEY, JOB_SIZE_PARAMS
from helpers.npu_probe import prepare_torch_import
from helpers.specs import injected_parameter_names, spec_for, validate_notebook_params
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

    def add_verdict(self, verdict):
        """Record the notebook's verdict with the machine's state since ``start``; a busy machine makes it inconclusive.

        The check (:func:`helpers.machine.check`, threshold: the ``busy_cpu_share`` parameter) is recorded as
        an ``experiment="machine state"`` record and in the verdict's ``extra["machine"]``. When other processes
        took more than that share of the cores, a verdict that decided something becomes "inconclusive",
        its reason says so first and keeps what was measured, and its action is dropped: noise never prints
        a confident recommendation. A "not applicable" verdict (nothing measured) is kept, and so is one that
        says the job diverges (``extra["divergence"]``: a loss that is not finite does not depend on the load).

        Returns
        -------
        helpers.results.Record
        """
        before = self.machine_before or machine.snapshot()
        c = machine.check(before, machine.snapshot(),
                          max_other_cpu_share=float(self.params.get("busy_cpu_share") or machine.MAX_OTHER_CPU_SHARE))
        self.store.add("machine state", "while measuring", "other_cpu_share", c.other_cpu_share, "fraction", busy=c.busy,
                       load_per_core=c.load_per_core, seconds=c.seconds, reasons=list(c.reasons))
        extra = {**dict(verdict.extra), "machine": c.as_dict()}
        diverged = isinstance(verdict.extra.get("divergence"), Mapping)  # a NaN loss is no timing: load cannot undo it
        if c.busy and verdict.recommendation != "not applicable" and not diverged:
            extra["measured_recommendation"] = verdict.recommendation
            verdict = replace(verdict, recommendation="inconclusive", action=None, extra=extra,
                              reason=f"{c.sentence()}. What it measured: {verdict.recommendation}: {verdict.reason}")
        else:
            verdict = replace(verdict, extra=extra)
        return self.store.add_verdict(verdict)

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

    @property
    def figures_dir(self) -> Path:
        """Folder where figures of every notebook of the run are written."""
        return self.out_dir / "figures"

    @property
    def artifacts_dir(self) -> Path:
        """Folder for this notebook's other artefacts (traces, tables)."""
        return self.out_dir / "artifacts" / self.notebook


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
