"""Checks a run makes before its first notebook starts: the device, the user's job, the user's images.

Each check that needs torch or the user's code runs in a child process, so that a broken accelerator install or
a job that crashes cannot take the runner down; what fails is raised as a :class:`helpers.errors.ParameterError`
or :class:`helpers.errors.DeviceUnavailableError` naming the cause.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

from helpers.errors import DeviceUnavailableError, ParameterError
from helpers.experiments import registry
from helpers.pipeline.dataset import list_image_files
from helpers.pipeline.images import IMAGE_SUFFIXES
from helpers.pipeline.scan_cache import cached_scan
from helpers.specs import DEVICE_CHOICES
from helpers.workbook.rundir import NotebookRun

#: Devices this process has resolved, ``{device asked: "kind:name"}``: a device that one child process found usable
#: is not probed again by the same process (a second run from one Python session, as docs/solutions.md's reruns and
#: the tests make, skips the child's torch import, about 1.3 s on the 2-core developer machine). Failures are not kept.
_RESOLVED: dict[str, str] = {}


def check_device(device: str, *, timeout_s: float = 300.0) -> str:
    """Resolve ``device`` in a child process and return "kind:name".

    The child imports torch (and torch_npu where usable), so a broken install
    cannot take the runner down with it. A device resolved once is remembered for the rest of the process
    (:data:`_RESOLVED`); one that failed is checked again on the next call.

    Raises
    ------
    ParameterError
        Unknown device kind.
    DeviceUnavailableError
        The device cannot be used here; the message is the device view's reason.
    """
    if device not in DEVICE_CHOICES:
        raise ParameterError(f"--device: {device!r} is not one of {', '.join(DEVICE_CHOICES)}")
    if device in _RESOLVED:
        return _RESOLVED[device]
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
    _RESOLVED[device] = out["device"]
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


def check_data_dir_fills_batches(data_dir: Path, entries: Sequence[NotebookRun]) -> int:
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
        params = registry.validate_notebook_params(e.id, e.parameters)  # defaults filled in
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


def index_data_dir(data_dir: Path, entries: Sequence[NotebookRun], echo: Callable[[str], None]) -> None:
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

