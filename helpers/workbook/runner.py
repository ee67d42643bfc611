"""Run the workbook: execute the numbered notebooks with papermill into a run folder.

A run folder holds the executed notebooks, ``results.jsonl`` (every record the
notebooks appended), ``run.json`` (status, duration and error of each
notebook, rewritten after each one) and ``report.html`` / ``report.md``.

Behaviour a user can rely on:

* every parameter of every selected notebook is validated, and the device is
  checked, before the first notebook starts;
* a failing notebook is recorded with its failing cell and error, and the
  others still run; the exit status says that something failed;
* an interrupted run keeps what finished; ``--resume`` runs only what did not
  finish (a notebook's partial records are dropped before it is rerun).

This module does not import torch: the kernel does the device work, and a
broken accelerator install cannot crash the runner.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import json
import logging
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import nbformat
import yaml

try:  # POSIX advisory locks for the run folder (lock_run_dir); absent on Windows
    import fcntl
except ImportError:  # pragma: no cover - not a POSIX system
    fcntl = None

from helpers import checklist, stuck
from helpers.errors import DeviceUnavailableError, OutputDirError, ParameterError
from helpers.jobspec import JOB_SIZE_PARAMS, absolute_job_spec, factory_params
from helpers.process import CHILDREN_DIR_ENV, cli_command, end_stale_children
from helpers.fsutil import ensure_writable_dir, write_atomic
from helpers.pipeline.dataset import list_image_files
from helpers.pipeline.images import IMAGE_SUFFIXES
from helpers.pipeline.scan_cache import cache_fallback_note, cached_scan
from helpers.experiments.registry import interleaved_repeats, notebook_ids, spec_for, validate_notebook_params
from helpers.specs import DEVICE_CHOICES, PROFILES
from helpers.workbook.paths import notebooks_dir, runs_dir
from helpers.workbook.report import write_report

log = logging.getLogger(__name__)

RUN_FILE = "run.json"
RESULTS_FILE = "results.jsonl"
#: Parameters the runner sets itself; profiles must not set them.
RUNNER_PARAMS = ("device", "results_path", "out_dir")

#: A profile's values that are for the built-in job only, not passed to a user's job (``--job``; ``-p`` still sets
#: them): its sizes (:data:`helpers.jobspec.JOB_SIZE_PARAMS`: the user's factory keeps its own defaults) and
#: notebook 09's demonstration memory budget (a user's batch size comes from the machine's free memory).
BUILTIN_JOB_ONLY = (*JOB_SIZE_PARAMS, "memory_budget_mib")

#: What to use instead of setting a runner-owned parameter by hand (-p or a profile).
_RUNNER_OPTIONS = {"device": "use --device", "results_path": "the run folder's results.jsonl: choose the folder "
                   "with --out", "out_dir": "the run folder: use --out", "job": "use --job, which checks the job "
                   "before any notebook starts", "data_dir": "use --data-dir, which checks the folder before any "
                   "notebook starts"}


@dataclass(frozen=True)
class RunOptions:
    """Options of one run (the command line's ``run`` options).

    Attributes
    ----------
    profile : str or None
        Parameter profile: "smoke", "quick" or "full" (notebooks/profiles/<name>.yaml);
        None = "quick" for a new run, the stored one when resuming.
    device : str or None
        "auto", "cpu", "cuda" or "npu"; None = "auto" (new run) or the stored one (resume).
    only : tuple of str or None
        Notebook numbers or ids to run ("01", "1", "01_baseline_profiling"); None or empty = all.
    out : pathlib.Path or None
        Run folder; None = a new folder under runs/.
    resume : bool
        Continue the run in ``out`` (or the latest run) and skip notebooks that finished.
    timeout_s : float
        Limit for one notebook cell, seconds (> 0).
    data_dir : str or None
        A folder of the user's images, passed to every notebook that takes
        ``data_dir``; None = the embedded photos.
    job : str or None
        The user's own job (``path/to/job.py:make_job`` or ``module:attr``), passed as ``job`` to every
        notebook that takes it; the notebooks that measure the built-in job only record "not applicable"
        (:func:`job_applies`). None = the built-in PPO job.
    overrides : tuple of (str, str)
        ``-p NAME VALUE`` pairs: each value (read as YAML: ``64`` is an int, ``[0, 2]`` a list, ``true`` a
        bool) replaces the profile's for every selected notebook that declares ``NAME``; a name that no
        selected notebook declares, or that the runner sets itself, is rejected before any work.
    patience : int
        ``--patience K``: every notebook whose verdict is a ratio measured interleaved measures K times as many
        repeats (:func:`apply_patience`), so that on a busy machine its interval can still clear its threshold.
    """

    profile: str | None = None
    device: str | None = None
    only: tuple[str, ...] | None = None
    out: Path | None = None
    resume: bool = False
    timeout_s: float = 1800.0
    data_dir: str | None = None
    job: str | None = None
    overrides: tuple[tuple[str, str], ...] = ()
    patience: int = 1


@dataclass
class NotebookRun:
    """Status of one notebook in a run (an entry of run.json)."""

    id: str
    input: str
    output: str
    parameters: dict
    status: str = "pending"  # pending | running | ok | failed | interrupted | skipped
    duration_s: float | None = None
    error: dict | None = None
    not_applicable: str | None = None  # why the notebook does not run on the user's job (recorded, not executed)


@dataclass
class RunState:
    """The content of run.json."""

    run_dir: str
    profile: str
    device: str
    resolved_device: str | None
    only: list
    started: str
    status: str = "running"  # running | ok | failed | interrupted
    job: str | None = None  # the user's job spec; None: the built-in PPO job
    data_dir: str | None = None  # --data-dir; None: the embedded photos
    overrides: list = field(default_factory=list)  # the -p NAME VALUE pairs, as given
    duration_s: float | None = None
    notebooks: list = field(default_factory=list)
    error: str | None = None  # why the run stopped before its notebooks were done (e.g. a full disk)

    def save(self, run_dir: Path) -> None:
        """Write run.json atomically (:func:`helpers.fsutil.write_atomic`: the last good copy survives a full disk)."""
        write_atomic(run_dir / RUN_FILE, json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, run_dir: Path) -> "RunState":
        """Read run.json of ``run_dir``."""
        data = json.loads((run_dir / RUN_FILE).read_text())
        nbs = [NotebookRun(**n) for n in data.pop("notebooks", [])]
        return cls(notebooks=nbs, **data)


# --------------------------------------------------------------------------- discovery and plan

def discover_notebooks(folder: Path | None = None) -> list[Path]:
    """Return the numbered notebooks (``NN_name.ipynb``) of ``folder``, in order."""
    folder = folder or notebooks_dir()
    return sorted(p for p in folder.glob("[0-9][0-9]_*.ipynb") if p.is_file())


def select_notebooks(notebooks: Sequence[Path], only: Sequence[str]) -> list[Path]:
    """Pick the notebooks named in ``only`` (numbers like "01" or "1", or ids).

    Raises
    ------
    ParameterError
        If a name matches no notebook (the message lists the available ones).
    """
    if not only:
        return list(notebooks)
    chosen, unknown = [], []
    for item in only:
        key = str(item).strip()
        match = [p for p in notebooks
                 if p.stem == key or (key.isdigit() and int(key) == int(p.stem[:2]))]
        if not match:
            unknown.append(key)
        for p in match:
            if p not in chosen:
                chosen.append(p)
    if unknown:
        avail = ", ".join(p.stem for p in notebooks)
        raise ParameterError(f"--only: no notebook {', '.join(map(repr, unknown))}; available: {avail}")
    return sorted(chosen)


def load_profile(name: str, folder: Path | None = None) -> dict:
    """Read a parameter profile: ``{"common": {...}, "<notebook id>": {...}}``.

    Raises
    ------
    ParameterError
        Unknown profile name (a name of :data:`helpers.specs.PROFILES` or the path of a ``.yaml`` file), a
        profile file that is not a mapping, or a section named after no notebook of the checklist registry
        (:mod:`helpers.checklist`).
    """
    if name in PROFILES:
        path = (folder or notebooks_dir()) / "profiles" / f"{name}.yaml"
    elif str(name).endswith((".yaml", ".yml")):  # a user's own profile file
        path = Path(name).expanduser()
        if not path.is_file():
            raise ParameterError(f"--profile: no profile file {path}; give one of {', '.join(PROFILES)} or the path "
                                 "of a YAML file with sections 'common' and/or notebook ids")
    else:
        raise ParameterError(f"--profile: {name!r} is not one of {', '.join(PROFILES)}, nor a .yaml file")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ParameterError(f"--profile: {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ParameterError(f"profile file {path.name} must hold a mapping, got {type(data).__name__}")
    unknown = [k for k in data if k != "common" and k not in notebook_ids()]
    if unknown:
        raise ParameterError(f"profile file {path.name} has section(s) {', '.join(map(repr, unknown))} that name no "
                             f"notebook; known: common, {', '.join(notebook_ids())}")
    common = data.get("common") or {}
    if not isinstance(common, dict):
        raise ParameterError(f"profile file {path.name}: 'common' must be a mapping of parameter names to values")
    known = {p.name for nb in notebook_ids() for p in spec_for(nb)}
    typos = sorted(set(common) - known)
    if typos:  # a name no notebook declares would be ignored everywhere: a typo, said before any work
        raise ParameterError(f"profile file {path.name}: 'common' sets {', '.join(map(repr, typos))}, which no "
                             "notebook declares; check the spelling against a notebook's parameters cell")
    return data


def notebook_parameter_names(path: Path) -> set[str]:
    """Names declared in the notebook's ``parameters`` cell (papermill's own parser)."""
    import papermill as pm

    return set(pm.inspect_notebook(str(path)).keys())


#: Why a notebook does not measure a user's job (yet), and where their job's figure for it is instead.
_NOT_FOR_YOUR_JOB = {
    "02": ("it measures the workbook's own batched JPEG pipeline, which your job does not use: your dataset's "
           "decode and preprocessing are notebook 01's data phase, and `diagnose`'s real vs cached runs give "
           "their whole exposed cost"),
}


def not_applicable_reason(notebook: str, job_spec: str) -> str:
    """The "not applicable" reason a notebook records for a user's job: why, and where their figure is instead."""
    why = _NOT_FOR_YOUR_JOB.get(notebook[:2], "it measures the built-in PPO job only")
    return (f"not applicable to your job yet: notebook {notebook[:2]} {why.replace('it ', 'is skipped: it ', 1)}; "
            f"your job's phase breakdown and host-bound verdict are in notebook 01, its three-run test in "
            f"`{cli_command()} diagnose --job {job_spec}`")


def job_applies(declared: set[str] | frozenset[str]) -> bool:
    """Whether a notebook with these parameters runs on a user's job: it takes ``job``, or it measures no job
    at all (no ``batch_size`` or ``data_dir``: the environment check)."""
    return "job" in declared or not ({"batch_size", "data_dir"} & set(declared))


def parse_overrides(pairs) -> dict[str, Any]:
    """``-p NAME VALUE`` pairs as ``{name: value}``, each value read as YAML (``64`` -> 64, ``[0, 2]`` -> a list).

    Raises
    ------
    ParameterError
        A name the runner sets itself (use its own option), or a value that is not valid YAML.
    """
    out: dict[str, Any] = {}
    for name, text in pairs:
        if name in RUNNER_PARAMS or name in _RUNNER_OPTIONS:
            raise ParameterError(f"-p {name}: the runner sets {name!r} ({_RUNNER_OPTIONS.get(name, '')})")
        try:
            out[name] = yaml.safe_load(str(text))
        except yaml.YAMLError as exc:
            raise ParameterError(f"-p {name} {text!r}: not a YAML value ({exc})") from None
    return out


def build_parameters(nb: Path, profile: dict, *, device: str, run_dir: Path,
                     data_dir: str | None = None, job: str | None = None,
                     overrides: dict[str, Any] | None = None) -> dict:
    """Parameters passed to one notebook: profile values, then the runner's own.

    A profile's :data:`BUILTIN_JOB_ONLY` values are for the built-in job: with ``job`` they are not passed, so
    the user's factory keeps its own sizes and notebook 09 sizes the batch from the machine's free memory;
    ``-p`` still sets them (``overrides``).

    Raises
    ------
    ParameterError
        A profile sets a name the notebook does not declare, or a value is invalid.
    """
    params = {}
    declared = notebook_parameter_names(nb)
    for source in (profile.get("common") or {}, profile.get(nb.stem) or {}):
        for key, value in source.items():
            if key in RUNNER_PARAMS:
                raise ParameterError(f"profile sets {key!r} for {nb.stem}; the runner sets it ({_RUNNER_OPTIONS[key]})")
            if key in declared:
                if not (job and key in BUILTIN_JOB_ONLY):  # the built-in job's: the user's job keeps its own
                    params[key] = value
            elif source is not profile.get("common"):
                raise ParameterError(
                    f"profile sets unknown parameter {key!r} for {nb.stem}; it declares: {', '.join(sorted(declared))}")
    params.update({k: v for k, v in (overrides or {}).items() if k in declared})
    params.update(device=device, results_path=str(run_dir / RESULTS_FILE), out_dir=str(run_dir))
    if data_dir:
        params["data_dir"] = str(data_dir)
    if job:
        params["job"] = str(job)
    params = {k: v for k, v in params.items() if k in declared}
    validate_notebook_params(nb.stem, params)  # raises before any work
    return params


#: Largest ``--patience``: beyond it a notebook's run grows by hours on a small machine.
MAX_PATIENCE = 100


def apply_patience(notebook: str, params: dict, patience: int) -> dict:
    """``params`` with the notebook's interleaved repeats (:func:`helpers.experiments.registry.interleaved_repeats`) multiplied.

    Parameters
    ----------
    notebook : str
        Notebook id, e.g. ``"06_mixed_precision"``.
    params : dict
        Its parameters as :func:`build_parameters` made them (profile, ``-p``, runner's own).
    patience : int
        The factor, 1..:data:`MAX_PATIENCE` (1: unchanged). The value multiplied is the one in ``params``, or the
        notebook's default when the profile does not set it.

    Returns
    -------
    dict
        A new dict; notebooks without a ratio verdict get their parameters unchanged.

    Raises
    ------
    ParameterError
        A patience that is not an int in range, or a product above the parameter's maximum.
    """
    if isinstance(patience, bool) or not isinstance(patience, int) or not 1 <= patience <= MAX_PATIENCE:
        raise ParameterError(f"--patience must be an integer from 1 to {MAX_PATIENCE} (how many times as many "
                             f"interleaved repeats to measure), got {patience!r}")
    name = interleaved_repeats().get(notebook)
    if patience == 1 or name is None:
        return dict(params)
    spec = {p.name: p for p in spec_for(notebook)}[name]
    value = int(params.get(name, spec.default)) * patience
    if spec.maximum is not None and value > spec.maximum:
        raise ParameterError(f"--patience {patience}: {notebook}'s {name} would be {value}, above its maximum "
                             f"{spec.maximum:g}; choose a smaller --patience or a smaller {name} (-p {name} N)")
    return {**params, name: value}


def export_html(notebook: Path) -> Path | None:
    """Render an executed notebook as a self-contained web page beside it (``.html``), for the report's links.

    A browser shows an ``.ipynb`` as raw JSON; nbconvert's HTML exporter (the ``lab`` template, outputs and
    figures embedded) gives the page a reader can open from the report. A rendering that fails only costs the
    link: it is logged, never raised (the notebook itself ran and its results are kept).

    Returns
    -------
    pathlib.Path or None
        The page, or None when there is no notebook or the rendering failed.
    """
    if not notebook.is_file():
        return None
    try:
        import nbformat
        from nbconvert import HTMLExporter

        body, _ = HTMLExporter(template_name="lab").from_notebook_node(nbformat.read(str(notebook), as_version=4))
        out = notebook.with_suffix(".html")
        write_atomic(out, body)
        return out
    except Exception as exc:  # noqa: BLE001 - a missing template or a broken output must not fail the run
        logging.getLogger(__name__).warning("no HTML rendering of %s: %s: %s", notebook.name, type(exc).__name__,
                                            exc)
        return None


def check_device(device: str, *, timeout_s: float = 300.0) -> str:
    """Resolve ``device`` in a child process and return "kind:name".

    The child imports torch (and torch_npu where usable), so a broken install
    cannot take the runner down with it.

    Raises
    ------
    ParameterError
        Unknown device kind.
    DeviceUnavailableError
        The device cannot be used here; the message is the device view's reason.
    """
    if device not in DEVICE_CHOICES:
        raise ParameterError(f"--device: {device!r} is not one of {', '.join(DEVICE_CHOICES)}")
    code = (
        "import json,sys\n"
        "from helpers.npu_probe import prepare_torch_import\n"
        "prepare_torch_import(fallback_to_cpu=True)\n"
        "from helpers.device import get_accelerator\n"
        "try:\n"
        f"    a = get_accelerator({device!r})\n"
        "except Exception as e:\n"
        "    print(json.dumps({'error': f'{type(e).__name__}: {e}'})); sys.exit(0)\n"
        "print(json.dumps({'device': f'{a.kind}:{a.name}'}))\n"
    )
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise DeviceUnavailableError(f"checking device {device!r} did not finish in {timeout_s:.0f} s") from None
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
        raise DeviceUnavailableError(f"checking device {device!r} failed:\n{tail}")
    out = json.loads(lines[-1])
    if "error" in out:
        raise DeviceUnavailableError(out["error"])
    return out["device"]


def check_job(spec: str, params: dict, *, device: str = "cpu", timeout_s: float = 300.0) -> dict:
    """Load the user's job and run one training step of it on ``device``, in a child process, before any work.

    The child imports torch and the user's code, so neither can take the runner down. It runs
    :func:`helpers.jobs.check.first_step_check`: dataset, first batch, copy, model, step and loss, each
    part's failure named (a model that does not fit the device's memory says so, with the batch size); the
    error (a :class:`helpers.jobs.supervised.JobError` with the user's own frames) becomes this
    ParameterError, so no notebook starts on a job that cannot train.

    Returns
    -------
    dict
        ``name``, ``batch`` (its tensors' dtypes and shapes), ``loss`` (first step), ``samples``.

    Raises
    ------
    ParameterError
        The job file is missing, fails to import, its factory fails or returns no Job, or its first step
        fails (see :func:`helpers.jobs.check.first_step_check`).
    """
    code = ("import json, sys\nfrom helpers.npu_probe import prepare_torch_import\n"
            "prepare_torch_import(fallback_to_cpu=True)\nfrom helpers.device import get_accelerator\n"
            "from helpers.jobs.check import first_step_check\nfrom helpers.jobs.load import load_job\n"
            "import os\nfrom helpers.stuck import Watchdog\n"
            "def stuck(where, _stacks):\n    print(f'STUCK: {where}', file=sys.stderr, flush=True)\n    os._exit(4)\n"
            "Watchdog(float(sys.argv[4]), stuck, backstop_s=None).start()\n"
            "try:\n    job = load_job(sys.argv[1], json.loads(sys.argv[2]))\n"
            "    out = first_step_check(job, get_accelerator(sys.argv[3]))\n"
            "except Exception as exc:\n    print(f'{type(exc).__name__}: {exc}', file=sys.stderr)\n    sys.exit(3)\n"
            "print(json.dumps(out))\n")
    try:
        proc = subprocess.run([sys.executable, "-c", code, spec, json.dumps(params), device,
                               str(max(1.0, timeout_s - 10))], capture_output=True, text=True, timeout=timeout_s,
                              cwd=os.getcwd())
    except subprocess.TimeoutExpired:
        raise ParameterError(f"--job {spec}: loading the job took more than {timeout_s:.0f} s") from None
    where = next((ln.removeprefix("STUCK: ") for ln in proc.stderr.splitlines() if ln.startswith("STUCK: ")), None)
    if proc.returncode == 4 and where:  # its watchdog dumped the stacks and named where it hung
        raise ParameterError(f"--job {spec}: loading the job and its first step did not finish in "
                             f"{max(1.0, timeout_s - 10):.0f} s, {where}")
    if proc.returncode != 0:
        msg = proc.stderr.strip()
        tail = msg[msg.find("JobError: "):] if "JobError: " in msg else "\n".join(msg.splitlines()[-12:])
        raise ParameterError(f"--job {spec}: {tail.removeprefix('JobError: ')}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    return json.loads(lines[-1]) if lines else {"name": spec}


def _check_data_dir_fills_batches(data_dir: Path, entries: Sequence[NotebookRun]) -> int:
    """Reject a --data-dir that cannot fill one batch of some notebook, before any work.

    Candidate files are listed (:func:`helpers.pipeline.dataset.list_image_files`), then checked through the image
    check cache (:func:`helpers.pipeline.scan_cache.cached_scan`) in sorted order only until the largest batch any
    selected notebook needs is filled: a folder of thousands of good images costs a few dozen decodes here (none
    when the cache knows them), while a folder whose files are all broken is stopped with their reasons instead of
    failing in every data notebook one by one. The notebooks still check the files they use and skip bad ones.
    """
    files = list_image_files(data_dir.resolve())
    if not files:
        raise ParameterError(f"--data-dir: {data_dir} holds no image files ({', '.join(IMAGE_SUFFIXES)})")
    needs = {}
    for e in entries:
        if "data_dir" not in e.parameters:
            continue  # the notebook does not read images
        params = validate_notebook_params(e.id, e.parameters)  # defaults filled in
        needs[e.id] = int(params.get("batch_size", 1))
    if not needs:
        return len(files)
    need = max(needs.values())
    good, bad = 0, []
    chunk = max(need, 32)
    for start in range(0, len(files), chunk):
        report, _ = cached_scan(data_dir.resolve(), files[start:start + chunk])
        good += len(report.good)
        bad += list(report.bad)
        if good >= need:
            return len(files)
    too_big = {nb: b for nb, b in needs.items() if b > good}
    worst = ", ".join(f"{k} (batch_size {v})" for k, v in too_big.items())
    reasons = "; ".join(f"{f.path.name}: {f.reason}" for f in bad[:10]) + (" ..." if len(bad) > 10 else "")
    raise ParameterError(
        f"--data-dir: {data_dir} holds {len(files)} image file(s), of which {good} decode and {len(bad)} do not"
        + (f" ({reasons})" if bad else "") + f": fewer than one batch of {worst}; add or repair images, or "
        "lower batch_size for those notebooks in notebooks/profiles/<profile>.yaml, or use a smaller profile")


def _index_data_dir(data_dir: Path, entries: Sequence[NotebookRun], echo: Callable[[str], None]) -> None:
    """Build the dataset index the notebooks will use, once, before the first notebook starts.

    Each distinct ``(max_images, seed)`` among the selected data notebooks is
    loaded (:func:`helpers.pipeline.dataset.load_dataset`): the files checked
    are stored in the image check cache, with a progress bar here on the
    terminal, so that no notebook cell (under its timeout) and no DDP rank
    decodes the folder again. With the cache warm this takes about a second.
    """
    from helpers.pipeline.dataset import load_dataset

    draws = sorted({(int(e.parameters.get("max_images") or 0), int(e.parameters.get("seed") or 0))
                    for e in entries if "data_dir" in e.parameters})
    for max_images, seed in draws:
        t0 = time.perf_counter()
        index = load_dataset(data_dir, max_images=max_images, sample_seed=seed, progress=sys.stderr.isatty() or None)
        what = f"a sample of {max_images} (seed {seed})" if max_images else "all files"
        echo(f"Indexed {data_dir} ({what}): {len(index)} usable of {index.found} image files, "
             f"{len(index.skipped)} skipped, {time.perf_counter() - t0:.1f} s")


def new_run_dir(profile: str, device: str) -> Path:
    """Return a new, not yet existing run folder under runs/."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = runs_dir() / f"{stamp}-{Path(profile).stem}-{device}"  # a profile file by its name
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def latest_run_dir() -> Path | None:
    """Return the most recently started run folder (one with run.json), if any."""
    root = runs_dir()
    if not root.is_dir():
        return None
    cands = [p for p in root.iterdir() if (p / RUN_FILE).is_file()]
    return max(cands, key=lambda p: (p / RUN_FILE).stat().st_mtime, default=None)


def _prepare_dir(path: Path) -> Path:
    return ensure_writable_dir(path, what="run folder", hint="pass a writable folder with --out")


def drop_records(results: Path, notebook: str) -> int:
    """Remove the records of ``notebook`` from a results file (before rerunning it).

    Returns the number of lines removed. Lines that are not valid JSON (an
    interrupted write) are removed too.
    """
    if not results.is_file():
        return 0
    keep, dropped = [], 0
    for line in results.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            dropped += 1
            continue
        if rec.get("notebook") == notebook:
            dropped += 1
        else:
            keep.append(line)
    write_atomic(results, "".join(k + "\n" for k in keep))
    return dropped


# --------------------------------------------------------------------------- execution

#: nbclient's CellTimeoutError message (nbclient.exceptions.timeout_err_msg): the limit and a preview of the cell
#: between two lines of dashes; it carries no structured fields, so these are read from it.
_CELL_TIMEOUT_RE = re.compile(r"timed out while it was being executed, after (\d+) seconds")


def _preview_first_line(preview: str) -> str:
    """The first line of nbclient's cell preview, as text (a long cell's preview is a Python list of its lines)."""
    import ast

    first = next((line.strip() for line in preview.splitlines() if line.strip()), "")
    if first.startswith("["):
        try:
            lines = ast.literal_eval(first)
        except (ValueError, SyntaxError):
            lines = None
        if isinstance(lines, list):
            first = next((str(x).strip() for x in lines if str(x).strip()), "")
    return first


def _cell_timeout_info(exc: BaseException, notebook: str | None, *, logs: Path | None = None,
                       name: str | None = None) -> dict | None:
    """For a cell timeout: which cell (number and first line), the limit in effect, where the kernel was stuck
    (its stacks dumped in ``logs/<name>.stacks.txt`` before the limit, :mod:`helpers.stuck`) and the option
    that raises the limit."""
    text = str(exc)
    m = _CELL_TIMEOUT_RE.search(text)
    if m is None:
        return None
    limit = int(m.group(1))
    parts = text.split("-------------------")
    preview = parts[1].strip() if len(parts) >= 3 else ""
    first = _preview_first_line(preview)
    index = None
    if notebook and first:
        try:
            cells = nbformat.read(notebook, as_version=4).cells
        except (OSError, ValueError):
            cells = []
        for i, cell in enumerate(cells):
            if cell.cell_type == "code" and cell.source.strip().startswith(first.strip("[]'\"")):
                index = i
                break
    where = f"cell {index} (`{first}`)" if index is not None else (f"the cell starting `{first}`" if first
                                                                   else "a cell")
    where_stuck = stuck.read_stuck(logs, name) if logs is not None and name else None
    stacks = f"; the kernel's stacks: logs/{name}.stacks.txt" if where_stuck else ""
    info = {"type": "CellTimeoutError", "limit_s": limit,
            "message": (f"{where} ran past the per-cell limit of {limit} s"
                        + (f", {where_stuck}{stacks}; if it is only slow, raise the limit" if where_stuck
                           else "; raise it")
                        + f" with --timeout S ({cli_command()} run --timeout {limit * 2} ...), or use a smaller "
                          "--profile")}
    if where_stuck:
        info["stuck"] = where_stuck
    if index is not None:
        info["cell_index"] = index
    if first:
        info["cell_source"] = first[:1000]
    return info


def _error_info(exc: BaseException, notebook: str | None = None, *, logs: Path | None = None,
                name: str | None = None) -> dict:
    timeout = _cell_timeout_info(exc, notebook, logs=logs, name=name)
    if timeout is not None:
        return timeout
    info = {"type": type(exc).__name__, "message": str(exc).strip().splitlines()[-1][:500] if str(exc).strip() else ""}
    for attr in ("ename", "evalue", "cell_index", "exec_count"):
        if hasattr(exc, attr):
            info[attr] = getattr(exc, attr)
    if getattr(exc, "source", None):
        info["cell_source"] = str(exc.source)[:1000]
    if "ename" in info:
        info["message"] = f"{info['ename']}: {info.get('evalue', '')}"[:500]
    return info


@contextlib.contextmanager
def _child_stderr_to(path: Path):
    """Send the stderr of processes started inside the block (the kernel) to ``path``.

    The kernel's own log lines (ipykernel's start-up warnings, profiler
    back-end messages) would otherwise interleave with the runner's progress;
    they are kept in the run folder instead. This process's ``sys.stderr``
    (progress bar, errors) still goes to the terminal.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "ab") as log_file:
        os.dup2(log_file.fileno(), 2)
    old = sys.stderr
    sys.stderr = os.fdopen(os.dup(saved), "w", buffering=1)
    try:
        yield
    finally:
        sys.stderr.flush()
        sys.stderr.close()
        sys.stderr = old
        os.dup2(saved, 2)
        os.close(saved)


def execute_notebook(nb: NotebookRun, *, timeout_s: float, progress: bool) -> None:
    """Execute one notebook with papermill (kernel "python3", cwd = notebooks/).

    The kernel's stderr goes to ``<run folder>/logs/<notebook>.log``.
    """
    import papermill as pm

    log_path = Path(nb.output).parent / "logs" / f"{nb.id}.log"
    watch = {stuck.CELL_TIMEOUT_ENV: str(int(timeout_s)), stuck.STUCK_DIR_ENV: str(log_path.parent),
             stuck.STUCK_NAME_ENV: nb.id}  # the kernel dumps its stacks before a cell reaches the limit
    saved = {k: os.environ.get(k) for k in watch}
    for path in stuck.cell_files(log_path.parent, nb.id):
        path.unlink(missing_ok=True)
    os.environ.update(watch)
    try:
        with _child_stderr_to(log_path):
            pm.execute_notebook(
                nb.input, nb.output, parameters=nb.parameters, kernel_name="python3",
                cwd=str(Path(nb.input).parent), progress_bar=progress, log_output=False,
                execution_timeout=int(timeout_s), start_timeout=120,
            )
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


#: The advisory lock a runner holds on its run folder for the run's life (see :func:`lock_run_dir`).
LOCK_FILE = ".runner.lock"


def _sigterm_as_interrupt(signum, frame) -> None:
    """SIGTERM (a scheduler, ``kill``, a container stop) stops the run as Ctrl-C does: kernel stopped, state kept."""
    raise KeyboardInterrupt(f"signal {signum} (SIGTERM)")


@contextlib.contextmanager
def _terminate_like_interrupt():
    """While the run executes, turn SIGTERM into KeyboardInterrupt (main thread only; restored afterwards)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def lock_run_dir(run_dir: Path):
    """Take the run folder's lock, so that one runner at a time writes it; return the open lock file.

    The lock is an exclusive ``fcntl.flock`` on ``<run folder>/.runner.lock``, held while the returned file
    is open. The kernel drops it when the holder exits in any way (kill -9 included), so a lock left by a
    killed runner is no lock: the next runner takes it over. The file names the holder (pid, start time).

    Raises
    ------
    ParameterError
        If another live runner holds the folder; the message names its process.
    """
    path = Path(run_dir) / LOCK_FILE
    handle = open(path, "a+")
    if fcntl is None:  # not a POSIX system: no advisory locks; say so once per run
        log.warning("no file locking on this system: make sure one runner at a time uses %s", run_dir)
        return handle
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise ParameterError(f"{run_dir} is in use by another runner ({holder}); wait for it to finish, or "
                             "choose another folder with --out") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()}, started {_dt.datetime.now(_dt.timezone.utc).isoformat(timespec='seconds')}")
    handle.flush()
    return handle


#: Folder of a run where torchrun and its ranks register themselves while they run (see helpers.process).
CHILDREN_DIR = ".children"


class DiskFullError(OutputDirError):
    """The run folder's file system is full: the run stops, keeping what was written."""


def _is_disk_full(exc: BaseException) -> bool:
    """True when ``exc`` (or its cause or context) is ENOSPC/EDQUOT, or a kernel's error saying so."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(exc) or "Disk quota exceeded" in str(exc):
            return True  # raised in the kernel, reported to the runner as text
        exc = exc.__cause__ or exc.__context__
    return False


def _disk_full(run_dir: Path, exc: BaseException) -> DiskFullError:
    try:
        free = shutil.disk_usage(run_dir).free
        room = f"{free / 2**20:,.1f} MiB free"
    except OSError:
        room = "free space unknown"
    ename, evalue = getattr(exc, "ename", None), getattr(exc, "evalue", None)  # a kernel's error (papermill)
    what = f"{ename}: {evalue}" if ename and evalue else f"{type(exc).__name__}: {exc}"
    what = " ".join(what.split())[:200]
    return DiskFullError(
        f"the disk of the run folder {run_dir} is full ({room}): {what}. What was "
        f"written is kept; free some space (or pass --out on another disk) and continue with: "
        f"{cli_command()} run --resume --out {run_dir}")


@contextlib.contextmanager
def _full_disk_stops(run_dir: Path):
    """Turn a full disk met inside the block into a :class:`DiskFullError` (other errors pass unchanged)."""
    try:
        yield
    except OSError as exc:
        if _is_disk_full(exc):
            raise _disk_full(run_dir, exc) from exc
        raise


def _save(state: "RunState", run_dir: Path) -> None:
    """``state.save`` with a full disk turned into a :class:`DiskFullError` (run.json keeps its last good copy)."""
    with _full_disk_stops(run_dir):
        state.save(run_dir)


def _saved_status(run_dir: Path) -> str:
    """The status run.json holds on disk ("unknown" when it cannot be read)."""
    try:
        return str(json.loads((run_dir / RUN_FILE).read_text()).get("status", "unknown"))
    except (OSError, ValueError, AttributeError):
        return "unknown"


def _record_not_applicable(run_dir: Path, nb: NotebookRun) -> None:
    """Write a notebook's "not applicable" verdict for the user's job into the run's results."""
    from helpers.results import ResultsStore
    from helpers.verdict import Verdict

    store = ResultsStore(run_dir / RESULTS_FILE, notebook=nb.id, parameters=nb.parameters)
    store.add_verdict(Verdict(notebook=nb.id, metric="not measured", value=None, unit="",
                              recommendation="not applicable", reason=str(nb.not_applicable),
                              context=f"your job: {nb.parameters.get('job', '')}"))


_SAMPLE_RE = re.compile(r"dataset\[\d+\] raised [^\n]*")


def _sample_error(error: dict | None) -> str | None:
    """The one-line cause when a notebook failed on a sample of the user's dataset (a SampleError); else None."""
    if not error:
        return None
    text = f"{error.get('evalue') or ''}\n{error.get('message') or ''}"
    m = _SAMPLE_RE.search(text)
    if m is not None:
        return m.group(0).strip()
    return str(error.get("evalue") or error.get("message")) if error.get("ename") == "SampleError" else None


def _reads_users_dataset(nb: NotebookRun) -> bool:
    """Whether a notebook of the run measures the user's job (so reads its dataset)."""
    return bool(nb.parameters.get("job")) and not nb.not_applicable


def _execute_all(state: "RunState", run_dir: Path, executor, options: RunOptions, echo, progress: bool) -> None:
    """Run each notebook of ``state`` not yet "ok", in order, recording its status, duration and error.

    Once a notebook fails on a sample of the user's dataset (a :class:`helpers.errors.SampleError`: the index
    and the user's frame), the run says so once and the later notebooks that read the dataset are not
    started: they are recorded as "skipped", with that reason (``--resume`` runs them after the fix).

    Raises
    ------
    DiskFullError
        When the run folder's disk is full (a notebook failed with ENOSPC, or run.json could not be written):
        the notebooks after it are not started, since they could not write their results either.
    """
    dataset_fault: tuple[str, str] | None = None  # (notebook, error) once the user's dataset raised in one
    for i, nb in enumerate(state.notebooks, 1):
        if nb.status == "ok":
            continue
        with _full_disk_stops(run_dir):  # results.jsonl is rewritten whole (write_atomic), or kept as it was
            drop_records(run_dir / RESULTS_FILE, nb.id)
        if dataset_fault is not None and _reads_users_dataset(nb):  # it would fail on the same sample
            first, cause = dataset_fault
            nb.status, nb.duration_s = "skipped", 0.0
            nb.error = {"type": "SampleError", "skipped_because": first,
                        "message": f"skipped: your dataset raised in notebook {first[:2]} ({cause})"}
            _save(state, run_dir)
            echo(f"[{i}/{len(state.notebooks)}] {nb.id}: skipped (your dataset raised in notebook {first[:2]})")
            continue
        if nb.not_applicable:
            with _full_disk_stops(run_dir):
                _record_not_applicable(run_dir, nb)
            nb.status, nb.duration_s = "ok", 0.0
            _save(state, run_dir)
            echo(f"[{i}/{len(state.notebooks)}] {nb.id}: not applicable to your job (recorded)")
            continue
        echo(f"[{i}/{len(state.notebooks)}] {nb.id} ...")
        nb.status, nb.error = "running", None
        _save(state, run_dir)
        t0 = time.perf_counter()
        full = None
        try:
            executor(nb, timeout_s=math.ceil(options.timeout_s), progress=progress)
            nb.status = "ok"
        except KeyboardInterrupt:
            nb.status = "interrupted"
            nb.duration_s = round(time.perf_counter() - t0, 2)
            raise
        except Exception as exc:  # a failing notebook must not stop the others
            nb.status = "failed"
            nb.error = _error_info(exc, nb.input, logs=Path(nb.output).parent / "logs", name=nb.id)
            if _is_disk_full(exc):
                full = _disk_full(run_dir, exc)
                nb.error["message"] = str(full)
        nb.duration_s = round(time.perf_counter() - t0, 2)
        if full is not None:  # run.json is tried again when the run ends; the caller says the reason once
            echo(f"[{i}/{len(state.notebooks)}] {nb.id}: failed in {nb.duration_s:.1f} s — disk full")
            raise full
        export_html(Path(nb.output))  # a web page of the executed notebook (a failed one shows its traceback there)
        _save(state, run_dir)
        line = f"[{i}/{len(state.notebooks)}] {nb.id}: {nb.status} in {nb.duration_s:.1f} s"
        if nb.error:
            count, cell = nb.error.get("exec_count"), nb.error.get("cell_index")
            where = f"In [{count}]" if count is not None else (f"cell {cell}" if cell is not None else "")
            message = nb.error["message"].split("\n")[0][:300]
            line += f" — {message}" + (f" ({where}; log: logs/{nb.id}.log)" if where else "")
        echo(line)
        cause = _sample_error(nb.error) if nb.status == "failed" and dataset_fault is None else None
        if cause is not None and _reads_users_dataset(nb):
            dataset_fault = (nb.id, cause)
            later = [n.id[:2] for n in state.notebooks[i:] if n.status != "ok" and _reads_users_dataset(n)]
            if later:
                echo(f"Your dataset raised: {cause}. The notebooks that read it ({', '.join(later)}) are skipped; "
                     f"fix the sample, then continue with: {cli_command()} run --resume --out {run_dir}")


def run(options: RunOptions, *, echo: Callable[[str], None] = print,
        executor: Callable[..., None] = execute_notebook,
        device_checker: Callable[[str], str] = check_device,
        notebooks_folder: Path | None = None) -> tuple[Path, RunState]:
    """Run the workbook; return the run folder and its final state.

    Parameters
    ----------
    options : RunOptions
    echo : callable
        Where progress lines go (the console by default).
    executor : callable
        Executes one notebook; tests substitute it.
    device_checker : callable
        Resolves the device before any work (default: :func:`check_device`).
    notebooks_folder : pathlib.Path, optional
        Where the notebooks and ``profiles/`` are (default: the repository's notebooks/).

    Raises
    ------
    ParameterError, DeviceUnavailableError, OutputDirError
        Before any notebook starts.
    KeyboardInterrupt
        After recording the interrupted notebook and writing the report.
    """
    os.environ.setdefault("WORKBOOK_HEADLESS", "1")
    all_nbs = discover_notebooks(notebooks_folder)

    if (isinstance(options.timeout_s, bool) or not isinstance(options.timeout_s, (int, float))
            or not math.isfinite(options.timeout_s) or options.timeout_s <= 0):
        raise ParameterError(f"--timeout must be a positive, finite number of seconds (a cell's limit), got "
                             f"{options.timeout_s!r}")
    apply_patience("", {}, options.patience)  # a bad --patience fails before anything else
    if options.data_dir and not Path(options.data_dir).is_dir():
        raise ParameterError(f"--data-dir: {options.data_dir!r} is not a folder; pass a folder of images")
    if options.resume:
        run_dir = options.out or latest_run_dir()
        if run_dir is None or not (Path(run_dir) / RUN_FILE).is_file():
            raise ParameterError("--resume: no run to resume" + (f" in {run_dir}" if run_dir else " under runs/")
                                 + "; start a run first (python -m helpers run)")
        run_dir = Path(run_dir)
        state = RunState.load(run_dir)
        conflicts = [f"--{name} {mine!r} (the run used {theirs!r})"
                     for name, mine, theirs in (("profile", options.profile, state.profile),
                                                ("device", options.device, state.device),
                                                ("only", list(options.only or []) or None, state.only or None))
                     if mine is not None and mine != theirs]
        if options.data_dir is not None:
            conflicts.append("--data-dir (a resumed run keeps its notebooks' parameters)")
        if options.overrides:
            conflicts.append("-p (a resumed run keeps its notebooks' parameters)")
        if options.patience != 1:
            conflicts.append("--patience (a resumed run keeps its notebooks' parameters)")
        if conflicts:
            raise ParameterError("--resume continues a run with its own options; drop "
                                 + ", ".join(conflicts) + ", or start a new run without --resume")
        lock = lock_run_dir(run_dir)  # before anything is read for writing: a second --resume stops here
        echo(f"Resuming {run_dir} (profile {state.profile}, device {state.device})")
        profile, device = state.profile, state.device
        resolved = device_checker(device)
    else:
        profile, device = options.profile or "quick", options.device or "auto"
        if profile not in PROFILES:  # a user's profile file: stored absolute, so --resume finds it from anywhere
            profile = str(Path(profile).expanduser().resolve())
        profile_data = load_profile(profile, notebooks_folder)  # validates the name
        selected = select_notebooks(all_nbs, options.only or ())
        if device not in DEVICE_CHOICES:
            raise ParameterError(f"--device: {device!r} is not one of {', '.join(DEVICE_CHOICES)}")
        run_dir = Path(options.out) if options.out else new_run_dir(profile, device)
        if (run_dir / RUN_FILE).exists():
            raise ParameterError(f"--out: {run_dir} already holds a run; add --resume to continue it, "
                                 "or choose a new folder")
        # Validate every notebook's parameters, then the device, before any work.
        job_spec = absolute_job_spec(options.job) if options.job else None  # the kernels run in notebooks/
        overrides = parse_overrides(options.overrides)
        if overrides.get("trace_path"):  # the kernels run in notebooks/: a path is the user's, from here
            from helpers.traces import find_traces

            overrides["trace_path"] = str(Path(str(overrides["trace_path"])).expanduser().resolve())
            find_traces([overrides["trace_path"]])  # a path that holds no trace stops here, before any work
        unused = set(overrides) - set().union(*(notebook_parameter_names(nb) for nb in selected))
        if unused:
            raise ParameterError(f"-p {', '.join(sorted(unused))}: no selected notebook has such a parameter; see a "
                                 "notebook's parameters cell (or notebooks/profiles/*.yaml) for the names")
        entries = []
        for nb in selected:
            spec_for(nb.stem)
            params = build_parameters(nb, profile_data, device=device, run_dir=run_dir,
                                      data_dir=options.data_dir, job=job_spec, overrides=overrides)
            params = apply_patience(nb.stem, params, options.patience)
            skip = None
            if options.job and not job_applies(set(notebook_parameter_names(nb))):
                skip = not_applicable_reason(nb.stem, job_spec)
            entries.append(NotebookRun(id=nb.stem, input=str(nb), output=str(run_dir / nb.name),
                                       parameters=params, not_applicable=skip))
        if options.data_dir:
            _check_data_dir_fills_batches(Path(options.data_dir), entries)
            _index_data_dir(Path(options.data_dir), entries, echo)
        resolved = device_checker(device)
        if options.job:
            first = next((e.parameters for e in entries if "job" in e.parameters), {})
            seen = check_job(job_spec, factory_params(first), device=device)
            echo(f"Your job: {seen['name']} ({job_spec})"
                 + (f"; first step on {resolved.split(':')[0]}: loss {seen['loss']:.4g}, batch {seen['batch']}" if "loss" in seen
                    else ""))
        _prepare_dir(run_dir)
        lock = lock_run_dir(run_dir)
        if (run_dir / RUN_FILE).exists():  # another runner created the run while this one validated
            lock.close()
            raise ParameterError(f"--out: {run_dir} already holds a run; add --resume to continue it, "
                                 "or choose a new folder")
        state = RunState(run_dir=str(run_dir), profile=profile, device=device, job=job_spec,
                         data_dir=str(options.data_dir) if options.data_dir else None,
                         overrides=[list(p) for p in options.overrides],
                         resolved_device=resolved, only=list(options.only or ()),
                         started=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                         notebooks=entries)
        try:
            _save(state, run_dir)
        except DiskFullError:
            lock.close()
            raise

    echo(f"Run folder: {run_dir}")
    echo(f"Profile {profile}, device {device} -> {resolved}; {len(state.notebooks)} notebook(s)")
    if (cache_note := cache_fallback_note()) is not None:  # once, unless indexing --data-dir already said it
        echo(f"Cache: {cache_note}")
    progress = sys.stderr.isatty()
    t_run = time.perf_counter()
    todo = [n for n in state.notebooks if n.status != "ok"]
    if options.resume:
        done = len(state.notebooks) - len(todo)
        echo(f"{done} notebook(s) already finished; running {len(todo)}")
    children = run_dir / CHILDREN_DIR
    for line in end_stale_children(children):  # an earlier run of this folder, killed, may have left them
        echo(f"Ended a process left by an earlier run of this folder: {line}")
    old_children_env = os.environ.get(CHILDREN_DIR_ENV)
    os.environ[CHILDREN_DIR_ENV] = str(children)  # torchrun and its ranks register here (helpers.process)
    state.status, state.error = "running", None
    disk_full = False  # said once: the later writes that fail for the same reason say so in a few words
    try:
        _save(state, run_dir)
        with _terminate_like_interrupt():
            _execute_all(state, run_dir, executor, options, echo, progress)
    except DiskFullError as exc:
        state.status, state.error, disk_full = "failed", str(exc), True
        for nb in state.notebooks:  # the notebook whose start could not be recorded
            if nb.status == "running":
                nb.status, nb.error = "failed", {"message": str(exc)}
        left = [n.id for n in state.notebooks if n.status == "pending"]
        echo(f"Stopped: {exc}" + (f"\nNot started: {', '.join(left)}" if left else ""))
    except KeyboardInterrupt:
        state.status = "interrupted"
        echo(f"Interrupted: what finished is kept. Continue with:\n  {cli_command()} run --resume --out {run_dir}\n"
             f"  (or: make workbook ARGS='--resume --out {run_dir}')")
        raise
    finally:
        state.duration_s = round((state.duration_s or 0) + time.perf_counter() - t_run, 2)
        if state.status != "interrupted":
            failed = [n.id for n in state.notebooks if n.status != "ok"]
            state.status = "failed" if failed else "ok"
        try:
            _save(state, run_dir)
        except OSError as exc:  # a full disk: run.json keeps its last good copy, the report is tried anyway
            if disk_full:
                echo(f"run.json could not be updated either (disk full): it keeps its last good copy, which says "
                     f"{_saved_status(run_dir)!r}")
            else:
                echo(f"run.json could not be updated: {exc}")
                disk_full = _is_disk_full(exc)
        try:
            html, md = write_report(run_dir)
            echo(f"Report: {html}")
            echo(f"        {md}")
        except OSError as exc:  # a full disk, a folder gone: said in one line, no traceback
            kept = [p.name for p in (run_dir / "report.md", run_dir / "report.html") if p.is_file()]
            why = ("disk full" if disk_full else str(_disk_full(run_dir, exc))) if _is_disk_full(exc) else (
                f"{type(exc).__name__}: {exc}")
            echo(f"Report could not be written ({why})"
                 + (f"; {' and '.join(kept)} on disk are left whole, not truncated" if kept else ""))
        except Exception as exc:  # the report must never lose the run
            log.exception("could not write the report")
            echo(f"Report could not be written: {type(exc).__name__}: {exc}")
        finally:
            lock.close()
            if old_children_env is None:
                os.environ.pop(CHILDREN_DIR_ENV, None)
            else:
                os.environ[CHILDREN_DIR_ENV] = old_children_env
    return run_dir, state
