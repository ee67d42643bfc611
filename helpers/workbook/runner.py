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
import logging
import math
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from helpers.errors import ParameterError
from helpers.experiments import registry
from helpers.jobspec import absolute_job_spec, factory_params
from helpers.pipeline.scan_cache import cache_fallback_note
from helpers.process import CHILDREN_DIR_ENV, cli_command, end_stale_children, terminate_like_interrupt
from helpers.specs import DEVICE_CHOICES, PROFILES
from helpers.workbook.nbexec import error_info, execute_notebook, export_html
from helpers.workbook.preflight import check_data_dir_fills_batches, check_device, check_job, index_data_dir
from helpers.workbook.profiles import (apply_patience, build_parameters, discover_notebooks, job_applies,
                                       load_profile, not_applicable_reason, notebook_parameter_names,
                                       parse_overrides, select_notebooks)
from helpers.workbook.report import write_report
from helpers.workbook.rundir import (CHILDREN_DIR, RESULTS_FILE, RUN_FILE, DiskFullError, NotebookRun, RunState,
                                     disk_full_error, drop_records, full_disk_stops, is_disk_full, latest_run_dir,
                                     lock_run_dir, new_run_dir, prepare_dir, record_not_applicable, save_state,
                                     saved_status)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunOptions:
    """Options of one run (the command line's ``run`` options).

    Attributes
    ----------
    profile : str or None
        Parameter profile: "smoke", "quick", "full" or "classroom" (notebooks/profiles/<name>.yaml);
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


def _execute_all(state: RunState, run_dir: Path, executor, options: RunOptions, echo, progress: bool) -> None:
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
        tag = f"[{i}/{len(state.notebooks)}] {nb.id}"
        with full_disk_stops(run_dir):  # results.jsonl is rewritten whole (write_atomic), or kept as it was
            drop_records(run_dir / RESULTS_FILE, nb.id)
        if dataset_fault is not None and _reads_users_dataset(nb):  # it would fail on the same sample
            first, cause = dataset_fault
            nb.status, nb.duration_s = "skipped", 0.0
            nb.error = {"type": "SampleError", "skipped_because": first,
                        "message": f"skipped: your dataset raised in notebook {first[:2]} ({cause})"}
            save_state(state, run_dir)
            echo(f"{tag}: skipped (your dataset raised in notebook {first[:2]})")
            continue
        if nb.not_applicable:
            with full_disk_stops(run_dir):
                record_not_applicable(run_dir, nb)
            nb.status, nb.duration_s = "ok", 0.0
            save_state(state, run_dir)
            echo(f"{tag}: not applicable to your job (recorded)")
            continue
        _execute_one(nb, tag, state, run_dir, executor, options, echo, progress)
        cause = _sample_error(nb.error) if nb.status == "failed" and dataset_fault is None else None
        if cause is not None and _reads_users_dataset(nb):
            dataset_fault = (nb.id, cause)
            later = [n.id[:2] for n in state.notebooks[i:] if n.status != "ok" and _reads_users_dataset(n)]
            if later:
                echo(f"Your dataset raised: {cause}. The notebooks that read it ({', '.join(later)}) are skipped; "
                     f"fix the sample, then continue with: {cli_command()} run --resume --out {run_dir}")


def _execute_one(nb: NotebookRun, tag: str, state: RunState, run_dir: Path, executor, options: RunOptions, echo,
                 progress: bool) -> None:
    """Execute one notebook of the run, record how it went in run.json and say it in one line (``tag``: ...).

    Raises
    ------
    KeyboardInterrupt
        After marking the notebook "interrupted".
    DiskFullError
        When the notebook failed on a full disk.
    """
    echo(f"{tag} ...")
    nb.status, nb.error = "running", None
    save_state(state, run_dir)
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
        nb.error = error_info(exc, nb.input, logs=Path(nb.output).parent / "logs", name=nb.id)
        if is_disk_full(exc):
            full = disk_full_error(run_dir, exc)
            nb.error["message"] = str(full)
    nb.duration_s = round(time.perf_counter() - t0, 2)
    if full is not None:  # run.json is tried again when the run ends; the caller says the reason once
        echo(f"{tag}: failed in {nb.duration_s:.1f} s — disk full")
        raise full
    export_html(Path(nb.output))  # a web page of the executed notebook (a failed one shows its traceback there)
    save_state(state, run_dir)
    line = f"{tag}: {nb.status} in {nb.duration_s:.1f} s"
    if nb.error:
        count, cell = nb.error.get("exec_count"), nb.error.get("cell_index")
        where = f"In [{count}]" if count is not None else (f"cell {cell}" if cell is not None else "")
        message = nb.error["message"].split("\n")[0][:300]
        line += f" — {message}" + (f" ({where}; log: logs/{nb.id}.log)" if where else "")
    echo(line)


def _check_options(options: RunOptions) -> None:
    """Reject a bad ``--timeout``, ``--patience`` or ``--data-dir`` before anything else (ParameterError)."""
    if (isinstance(options.timeout_s, bool) or not isinstance(options.timeout_s, (int, float))
            or not math.isfinite(options.timeout_s) or options.timeout_s <= 0):
        raise ParameterError(f"--timeout must be a positive, finite number of seconds (a cell's limit), got "
                             f"{options.timeout_s!r}")
    apply_patience("", {}, options.patience)  # a bad --patience fails before anything else
    if options.data_dir and not Path(options.data_dir).is_dir():
        raise ParameterError(f"--data-dir: {options.data_dir!r} is not a folder; pass a folder of images")


def _resume_run(options: RunOptions, echo, device_checker) -> tuple[Path, RunState, Any, str]:
    """The run to continue (``--resume``): its folder, its state, its lock (taken) and the resolved device.

    Raises
    ------
    ParameterError
        No run to resume, an option that would change its parameters, or another runner holding it.
    """
    run_dir = Path(options.out).resolve() if options.out else latest_run_dir()
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
    return run_dir, state, lock, device_checker(state.device)


def _run_overrides(options: RunOptions, selected: list[Path]) -> dict[str, Any]:
    """The ``-p`` values of a new run, checked: each names a parameter of a selected notebook, a trace path
    is made absolute and must hold a trace (the kernels run in notebooks/).

    Raises
    ------
    ParameterError
        See :func:`helpers.workbook.profiles.parse_overrides`; a name no selected notebook declares.
    """
    overrides = parse_overrides(options.overrides)
    if overrides.get("trace_path"):  # the kernels run in notebooks/: a path is the user's, from here
        from helpers.traces import find_traces

        overrides["trace_path"] = str(Path(str(overrides["trace_path"])).expanduser().resolve())
        find_traces([overrides["trace_path"]])  # a path that holds no trace stops here, before any work
    unused = set(overrides) - set().union(*(notebook_parameter_names(nb) for nb in selected))
    if unused:
        raise ParameterError(f"-p {', '.join(sorted(unused))}: no selected notebook has such a parameter; see a "
                             "notebook's parameters cell (or notebooks/profiles/*.yaml) for the names")
    return overrides


def _plan(selected: list[Path], profile_data: dict, options: RunOptions, *, device: str, run_dir: Path,
          job_spec: str | None, overrides: dict[str, Any]) -> list[NotebookRun]:
    """The run.json entry of each selected notebook, its parameters validated (ParameterError before any work)."""
    entries = []
    for nb in selected:
        registry.spec_for(nb.stem)
        params = build_parameters(nb, profile_data, device=device, run_dir=run_dir,
                                  data_dir=options.data_dir, job=job_spec, overrides=overrides)
        params = apply_patience(nb.stem, params, options.patience)
        skip = None
        if options.job and not job_applies(set(notebook_parameter_names(nb))):
            skip = not_applicable_reason(nb.stem, job_spec)
        entries.append(NotebookRun(id=nb.stem, input=str(nb), output=str(run_dir / nb.name),
                                   parameters=params, not_applicable=skip))
    return entries


def _already_a_run(run_dir: Path) -> ParameterError:
    """The error for an ``--out`` folder that already holds a run."""
    return ParameterError(f"--out: {run_dir} already holds a run; add --resume to continue it, or choose a new folder")


def _new_run(options: RunOptions, echo, device_checker,
             notebooks_folder: Path | None) -> tuple[Path, RunState, Any, str]:
    """A new run: every notebook's parameters, the user's images and job, then the device checked; its folder
    prepared and locked and its run.json written. Returns the folder, the state, the lock and the device.

    Raises
    ------
    ParameterError, DeviceUnavailableError, OutputDirError
        Before any notebook starts.
    """
    profile, device = options.profile or "quick", options.device or "auto"
    if profile not in PROFILES:  # a user's profile file: stored absolute, so --resume finds it from anywhere
        profile = str(Path(profile).expanduser().resolve())
    profile_data = load_profile(profile, notebooks_folder)  # validates the name
    selected = select_notebooks(discover_notebooks(notebooks_folder), options.only or ())
    if device not in DEVICE_CHOICES:
        raise ParameterError(f"--device: {device!r} is not one of {', '.join(DEVICE_CHOICES)}")
    run_dir = Path(options.out).resolve() if options.out else new_run_dir(profile, device)  # the kernels run elsewhere
    if (run_dir / RUN_FILE).exists():
        raise _already_a_run(run_dir)
    # Validate every notebook's parameters, then the device, before any work.
    job_spec = absolute_job_spec(options.job) if options.job else None  # the kernels run in notebooks/
    entries = _plan(selected, profile_data, options, device=device, run_dir=run_dir, job_spec=job_spec,
                    overrides=_run_overrides(options, selected))
    if options.data_dir:
        check_data_dir_fills_batches(Path(options.data_dir), entries)
        index_data_dir(Path(options.data_dir), entries, echo)
    resolved = device_checker(device)
    if options.job:
        first = next((e.parameters for e in entries if "job" in e.parameters), {})
        seen = check_job(job_spec, factory_params(first), device=device)
        echo(f"Your job: {seen['name']} ({job_spec})"
             + (f"; first step on {resolved.split(':')[0]}: loss {seen['loss']:.4g}, batch {seen['batch']}"
                if "loss" in seen else ""))
    prepare_dir(run_dir)
    lock = lock_run_dir(run_dir)
    if (run_dir / RUN_FILE).exists():  # another runner created the run while this one validated
        lock.close()
        raise _already_a_run(run_dir)
    state = RunState(run_dir=str(run_dir), profile=profile, device=device, job=job_spec,
                     data_dir=str(options.data_dir) if options.data_dir else None,
                     overrides=[list(p) for p in options.overrides],
                     resolved_device=resolved, only=list(options.only or ()),
                     started=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                     notebooks=entries)
    try:
        save_state(state, run_dir)
    except DiskFullError:
        lock.close()
        raise
    return run_dir, state, lock, resolved


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
        Resolves the device before any work (default: :func:`helpers.workbook.preflight.check_device`).
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
    _check_options(options)
    if options.resume:
        run_dir, state, lock, resolved = _resume_run(options, echo, device_checker)
    else:
        run_dir, state, lock, resolved = _new_run(options, echo, device_checker, notebooks_folder)
    echo(f"Run folder: {run_dir}")
    echo(f"Profile {state.profile}, device {state.device} -> {resolved}; {len(state.notebooks)} notebook(s)")
    if (cache_note := cache_fallback_note()) is not None:  # once, unless indexing --data-dir already said it
        echo(f"Cache: {cache_note}")
    t_run = time.perf_counter()
    if options.resume:
        todo = [n for n in state.notebooks if n.status != "ok"]
        echo(f"{len(state.notebooks) - len(todo)} notebook(s) already finished; running {len(todo)}")
    children = run_dir / CHILDREN_DIR
    for line in end_stale_children(children):  # an earlier run of this folder, killed, may have left them
        echo(f"Ended a process left by an earlier run of this folder: {line}")
    old_children_env = os.environ.get(CHILDREN_DIR_ENV)
    os.environ[CHILDREN_DIR_ENV] = str(children)  # torchrun and its ranks register here (helpers.process)
    try:
        _execute_run(state, run_dir, executor, options, echo, t_run)
    finally:
        lock.close()
        if old_children_env is None:
            os.environ.pop(CHILDREN_DIR_ENV, None)
        else:
            os.environ[CHILDREN_DIR_ENV] = old_children_env
    return run_dir, state


def _execute_run(state: RunState, run_dir: Path, executor, options: RunOptions, echo, t_run: float) -> None:
    """Execute the run's notebooks; whatever stops it (a full disk, Ctrl-C, SIGTERM), save run.json and write
    the report. A full disk is said once and ends the run as "failed"; an interruption is re-raised.
    ``t_run``: when the run started (``time.perf_counter``), for its duration."""
    progress = sys.stderr.isatty()
    state.status, state.error = "running", None
    disk_full = False  # said once: the later writes that fail for the same reason say so in a few words
    try:
        save_state(state, run_dir)
        with terminate_like_interrupt():
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
        disk_full = _save_final(state, run_dir, disk_full, echo)
        _write_report(run_dir, disk_full, echo)


def _save_final(state: RunState, run_dir: Path, disk_full: bool, echo) -> bool:
    """Write the run's final run.json; a failure is said, not raised. Returns whether the disk is known full."""
    try:
        save_state(state, run_dir)
    except OSError as exc:  # a full disk: run.json keeps its last good copy, the report is tried anyway
        if disk_full:
            echo(f"run.json could not be updated either (disk full): it keeps its last good copy, which says "
                 f"{saved_status(run_dir)!r}")
        else:
            echo(f"run.json could not be updated: {exc}")
            disk_full = is_disk_full(exc)
    return disk_full


def _write_report(run_dir: Path, disk_full: bool, echo) -> None:
    """Write the run's report and say where; a failure is said in one line, never raised."""
    try:
        html, md = write_report(run_dir)
        echo(f"Report: {html}")
        echo(f"        {md}")
    except OSError as exc:  # a full disk, a folder gone: said in one line, no traceback
        kept = [p.name for p in (run_dir / "report.md", run_dir / "report.html") if p.is_file()]
        why = ("disk full" if disk_full else str(disk_full_error(run_dir, exc))) if is_disk_full(exc) else (
            f"{type(exc).__name__}: {exc}")
        echo(f"Report could not be written ({why})"
             + (f"; {' and '.join(kept)} on disk are left whole, not truncated" if kept else ""))
    except Exception as exc:  # the report must never lose the run
        log.exception("could not write the report")
        echo(f"Report could not be written: {type(exc).__name__}: {exc}")
