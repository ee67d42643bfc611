"""Profile a few training steps on cpu, cuda or npu, and return a trace and the top operators.

One call, :func:`profile_steps`, covers the three device kinds:

- cpu / cuda: ``torch.profiler.profile`` with ``torch.profiler.schedule`` and a
  Chrome trace written by ``torch.profiler.tensorboard_trace_handler``; the top
  operators come from ``prof.key_averages()``.
- npu: ``torch_npu.profiler.profile`` with ``torch_npu.profiler.schedule`` and
  ``torch_npu.profiler.tensorboard_trace_handler`` (fact-check §5). The Ascend
  profiler has no ``key_averages()``; its parsed output folder
  ``<out_dir>/<worker>_<time>_ascend_pt/ASCEND_PROFILER_OUTPUT/`` holds
  ``trace_view.json`` (Chrome trace) and ``operator_details.csv``, which
  :func:`top_ops_from_operator_details` aggregates.

Field case 19 shapes the wrapper: the CUDA activity is invalid on Ascend
(:func:`activities_for` picks activities per device), the output folder must be
writable (:func:`check_output_dir` proves it before profiling), and a run that
stops mid-record leaves incomplete data (the profiler is always stopped, and a
trace from an interrupted run is not exported/parsed).

Open the trace in https://ui.perfetto.dev or chrome://tracing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from helpers.errors import DataError, DeviceUnavailableError, ParameterError
from helpers.fsutil import ensure_writable_dir

logger = logging.getLogger(__name__)

__all__ = [
    "KINDS",
    "TOP_OPS_COLUMNS",
    "activities_for",
    "check_output_dir",
    "ProfileResult",
    "profile_steps",
    "top_ops_from_key_averages",
    "top_ops_from_operator_details",
]

KINDS: tuple[str, ...] = ("cpu", "cuda", "npu")

#: Columns of :attr:`ProfileResult.top_ops`; times in milliseconds.
TOP_OPS_COLUMNS: tuple[str, ...] = (
    "name", "calls", "self_cpu_ms", "cpu_total_ms", "self_device_ms", "device_total_ms",
)

# Row names the profiler adds for the schedule's step markers ("ProfilerStep#3",
# aggregated by key_averages() as "ProfilerStep*"); they are not operators.
_STEP_MARKER_PREFIX = "ProfilerStep"


def _check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise ParameterError(f"kind must be one of {KINDS}, got {kind!r}; pass 'cpu', 'cuda' or 'npu'")
    return kind


def _import_torch_npu():
    """Import torch_npu, turning any failure into DeviceUnavailableError with a fix."""
    try:
        import torch_npu  # noqa: F401  (registers torch.npu)
    except Exception as exc:  # ImportError, or RuntimeError/OSError when CANN libraries are missing
        raise DeviceUnavailableError(
            f"kind='npu' needs torch_npu, but importing it failed: {type(exc).__name__}: {exc}. "
            "Install torch_npu with the same version as torch (pip install torch_npu==<torch version>), "
            "and source the CANN environment first (source /usr/local/Ascend/ascend-toolkit/set_env.sh); "
            "otherwise use kind='cpu' or 'cuda'."
        ) from exc
    return torch_npu


def activities_for(kind: str) -> list:
    """Profiler activities to record for a device kind.

    Parameters
    ----------
    kind : {"cpu", "cuda", "npu"}

    Returns
    -------
    list
        cpu: ``[torch.profiler.ProfilerActivity.CPU]``; cuda: CPU and CUDA;
        npu: ``[torch_npu.profiler.ProfilerActivity.CPU, torch_npu.profiler.ProfilerActivity.NPU]``
        (the CUDA activity is invalid on Ascend, sgl-project/sglang#14308).

    Raises
    ------
    ParameterError
        If ``kind`` is not one of :data:`KINDS`.
    DeviceUnavailableError
        If ``kind == "npu"`` and torch_npu cannot be imported (the message says why and what to do).
    """
    _check_kind(kind)
    if kind == "npu":
        torch_npu = _import_torch_npu()
        activity = torch_npu.profiler.ProfilerActivity
        return [activity.CPU, activity.NPU]
    import torch

    if kind == "cuda":
        return [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    return [torch.profiler.ProfilerActivity.CPU]


def check_output_dir(path: str | os.PathLike) -> Path:
    """Create a folder if needed and prove it is writable.

    A probe file is written and removed, because permission bits do not tell
    the whole story (read-only mounts, quotas, root squashing).

    Parameters
    ----------
    path : path-like
        The folder that will receive profiler output.

    Returns
    -------
    pathlib.Path
        The absolute, resolved folder.

    Raises
    ------
    OutputDirError
        If the folder cannot be created or written; the message names the path
        and the operating-system error.
    """
    return ensure_writable_dir(path, what="profiler output folder")


@dataclass(frozen=True, eq=False)
class ProfileResult:
    """What one profiling run produced.

    Parameters
    ----------
    out_dir : pathlib.Path
        The folder the profiler wrote into.
    trace_path : pathlib.Path or None
        The Chrome trace JSON of this run (open it in https://ui.perfetto.dev or
        chrome://tracing); None if the profiler wrote none.
    top_ops : pandas.DataFrame
        Columns :data:`TOP_OPS_COLUMNS`: ``name`` (str), ``calls`` (int), and
        ``self_cpu_ms``, ``cpu_total_ms``, ``self_device_ms``, ``device_total_ms``
        (float, milliseconds summed over the active steps; device columns NaN
        on cpu). Sorted by self device time when any op has device time, else by
        self CPU time; at most ``row_limit`` rows. Step markers are excluded.
    kind : str
        "cpu", "cuda" or "npu".
    steps : int
        Number of recorded (active) steps.
    """

    out_dir: Path
    trace_path: Path | None
    top_ops: Any = field(repr=False)
    kind: str
    steps: int = 0


def _empty_top_ops():
    import pandas as pd

    return pd.DataFrame({
        "name": pd.Series(dtype="object"), "calls": pd.Series(dtype="int64"),
        **{c: pd.Series(dtype="float64") for c in TOP_OPS_COLUMNS[2:]},
    })


def _sort_and_limit(frame, row_limit: int):
    if frame.empty:
        return frame.reset_index(drop=True)
    has_device = frame["self_device_ms"].notna().any() and (frame["self_device_ms"].fillna(0) > 0).any()
    key = "self_device_ms" if has_device else "self_cpu_ms"
    frame = frame.sort_values([key, "name"], ascending=[False, True], kind="mergesort")
    return frame.head(row_limit).reset_index(drop=True)


def top_ops_from_key_averages(averages, *, device: bool, row_limit: int = 20):
    """Build the top-operator table from ``prof.key_averages()``.

    Parameters
    ----------
    averages : iterable of torch.autograd.profiler_util.FunctionEventAvg
        Uses the documented attributes ``key``, ``count``,
        ``self_cpu_time_total``, ``cpu_time_total``, ``self_device_time_total``
        and ``device_time_total`` (all times in microseconds).
    device : bool
        Whether device activity was recorded; if False the device columns are NaN.
    row_limit : int
        Maximum number of rows.

    Returns
    -------
    pandas.DataFrame
        Columns :data:`TOP_OPS_COLUMNS` (times in ms), sorted as described in :class:`ProfileResult`.
    """
    import math

    import pandas as pd

    rows = []
    for avg in averages:
        name = str(avg.key)
        if name.startswith(_STEP_MARKER_PREFIX):
            continue
        rows.append({
            "name": name,
            "calls": int(avg.count),
            "self_cpu_ms": float(avg.self_cpu_time_total) / 1000.0,
            "cpu_total_ms": float(avg.cpu_time_total) / 1000.0,
            "self_device_ms": float(avg.self_device_time_total) / 1000.0 if device else math.nan,
            "device_total_ms": float(avg.device_time_total) / 1000.0 if device else math.nan,
        })
    if not rows:
        return _empty_top_ops()
    frame = pd.DataFrame(rows, columns=list(TOP_OPS_COLUMNS))
    return _sort_and_limit(frame, row_limit)


#: Column names of torch_npu's ``operator_details.csv`` (OperatorViewParser.OPERATOR_HEADERS,
#: Ascend/pytorch torch_npu/profiler/analysis/prof_view/_operator_view_parser.py); one row per call, µs.
_NPU_OPERATOR_COLUMNS = {
    "name": "Name",
    "self_cpu": "Host Self Duration(us)",
    "cpu_total": "Host Total Duration(us)",
    "self_device": "Device Self Duration(us)",
    "device_total": "Device Total Duration(us)",
}


def top_ops_from_operator_details(csv_path: str | os.PathLike, *, row_limit: int = 20):
    """Aggregate torch_npu's ``operator_details.csv`` into the top-operator table.

    Parameters
    ----------
    csv_path : path-like
        ``.../ASCEND_PROFILER_OUTPUT/operator_details.csv`` from the Ascend
        profiler (one row per operator call; durations in microseconds).
    row_limit : int
        Maximum number of rows.

    Returns
    -------
    pandas.DataFrame
        Columns :data:`TOP_OPS_COLUMNS` (times in ms, summed over calls).

    Raises
    ------
    DataError
        If the file lacks the expected columns.
    """
    import pandas as pd

    raw = pd.read_csv(csv_path)
    missing = [c for c in _NPU_OPERATOR_COLUMNS.values() if c not in raw.columns]
    if missing:
        raise DataError(
            f"{str(csv_path)!r} lacks columns {missing} (has {list(raw.columns)}); "
            "it does not look like torch_npu's operator_details.csv"
        )
    c = _NPU_OPERATOR_COLUMNS
    raw = raw[~raw[c["name"]].astype(str).str.startswith(_STEP_MARKER_PREFIX)]
    if raw.empty:
        return _empty_top_ops()
    grouped = raw.groupby(c["name"], sort=False)
    frame = pd.DataFrame({
        "name": grouped.size().index.astype(str),
        "calls": grouped.size().to_numpy().astype("int64"),
        "self_cpu_ms": grouped[c["self_cpu"]].sum().to_numpy(dtype="float64") / 1000.0,
        "cpu_total_ms": grouped[c["cpu_total"]].sum().to_numpy(dtype="float64") / 1000.0,
        "self_device_ms": grouped[c["self_device"]].sum().to_numpy(dtype="float64") / 1000.0,
        "device_total_ms": grouped[c["device_total"]].sum().to_numpy(dtype="float64") / 1000.0,
    })
    return _sort_and_limit(frame, row_limit)


def _default_sync(kind: str) -> Callable[[], None] | None:
    """The device synchronisation used after each step when the caller gives none."""
    if kind == "cpu":
        return None
    import torch

    return torch.accelerator.synchronize


def _check_device(kind: str) -> None:
    import torch

    if kind == "cuda" and not torch.cuda.is_available():
        raise DeviceUnavailableError(
            "kind='cuda' but torch.cuda.is_available() is False "
            f"(torch {torch.__version__}, CUDA build: {torch.version.cuda}); "
            "install a CUDA build of torch on a machine with an NVIDIA GPU, or use kind='cpu'"
        )
    if kind == "npu":
        _import_torch_npu()
        if not (hasattr(torch, "npu") and torch.npu.is_available()):
            raise DeviceUnavailableError(
                "kind='npu' but torch.npu.is_available() is False: no usable Ascend NPU "
                "(check npu-smi info and ASCEND_RT_VISIBLE_DEVICES), or use kind='cpu'"
            )


def _validate_counts(steps: int, warmup: int, row_limit: int) -> None:
    for name, value, low in (("steps", steps, 1), ("warmup", warmup, 0), ("row_limit", row_limit, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ParameterError(f"{name} must be an integer >= {low}, got {value!r}")


_KINETO_MARKER = re.compile(rb"^(USDT|STAGE):\S+ \S+ \d+:\d+ \S+\.cpp:\d+\] ")


@contextlib.contextmanager
def _without_kineto_markers():
    """Drop the profiler back-end's start/stop marker lines from the process's stderr.

    torch's C++ profiler (Kineto) writes lines such as
    ``USDT:<date> <time> <pid>:<tid> SyncActivityProfilerHandler.cpp:52] profiler_start``
    straight to file descriptor 2, where a notebook shows them as output.
    Everything else written to stderr meanwhile is passed through unchanged.
    """
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real stderr (embedded interpreters)
        yield
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            try:
                sys.stderr.flush()
            except ValueError:
                pass
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            kept = [line for line in tmp.read().splitlines(keepends=True) if not _KINETO_MARKER.match(line)]
            if kept:
                os.write(2, b"".join(kept))


def _run_steps(prof, step_fn, sync, total: int, state: dict) -> None:
    """Run the steps inside a started profiler; always stop it, re-raise step errors."""
    failed = False
    done = 0
    try:
        for _ in range(total):
            step_fn()
            if sync is not None:
                sync()
            prof.step()
            done += 1
        state["complete"] = True
    except BaseException:
        failed = True
        logger.warning("step %d of %d raised; stopping the profiler without exporting a trace",
                       done + 1, total)
        raise
    finally:
        try:
            prof.stop()
        except Exception:
            if not failed:
                raise
            logger.exception("stopping the profiler after a failed step also failed")


def profile_steps(
    step_fn: Callable[[], Any],
    *,
    kind: str,
    out_dir: str | os.PathLike,
    steps: int = 3,
    warmup: int = 1,
    sync: Callable[[], Any] | None = None,
    record_shapes: bool = False,
    row_limit: int = 20,
) -> ProfileResult:
    """Profile ``warmup + steps`` calls of ``step_fn`` and record the last ``steps``.

    Parameters
    ----------
    step_fn : callable
        One training step, called with no arguments.
    kind : {"cpu", "cuda", "npu"}
        Device kind; picks the profiler (torch.profiler or torch_npu.profiler)
        and its activities (:func:`activities_for`).
    out_dir : path-like
        Folder for the trace; created and proved writable first.
    steps : int, default 3
        Recorded (active) steps, >= 1.
    warmup : int, default 1
        Profiler warm-up steps (run with the profiler on but not recorded), >= 0.
    sync : callable, optional
        Called after each step so device work is inside its step; default
        ``torch.accelerator.synchronize`` for cuda/npu and nothing for cpu.
    record_shapes : bool, default False
        Record operator input shapes (larger traces).
    row_limit : int, default 20
        Rows in :attr:`ProfileResult.top_ops`.

    Returns
    -------
    ProfileResult

    Raises
    ------
    ParameterError
        For an unknown ``kind`` or invalid counts.
    DeviceUnavailableError
        If the device kind is not usable here.
    OutputDirError
        If ``out_dir`` cannot be created or written.
    Exception
        Whatever ``step_fn`` raises is re-raised after the profiler is stopped;
        the interrupted run's trace is not exported (it would be incomplete).
    """
    _check_kind(kind)
    _validate_counts(steps, warmup, row_limit)
    if not callable(step_fn):
        raise ParameterError(f"step_fn must be callable, got {type(step_fn).__name__}")
    _check_device(kind)
    folder = check_output_dir(out_dir)
    activities = activities_for(kind)
    if sync is None:
        sync = _default_sync(kind)
    total = warmup + steps
    state = {"complete": False}

    if kind == "npu":
        return _profile_npu(step_fn, folder, activities, sync, total, steps, warmup,
                            record_shapes, row_limit, state)

    import torch

    before = set(folder.glob("*.pt.trace.json"))
    handler = torch.profiler.tensorboard_trace_handler(str(folder))

    def on_trace_ready(prof) -> None:
        if state["complete"] or prof.step_num >= total:
            handler(prof)
        else:
            logger.warning("profiling stopped after %d of %d steps; the incomplete trace is not written",
                           prof.step_num, total)

    prof = torch.profiler.profile(
        activities=activities,
        schedule=torch.profiler.schedule(wait=0, warmup=warmup, active=steps, repeat=1),
        on_trace_ready=on_trace_ready,
        record_shapes=record_shapes,
    )
    with _without_kineto_markers():
        prof.start()
        _run_steps(prof, step_fn, sync, total, state)

    new = [p for p in folder.glob("*.pt.trace.json") if p not in before]
    trace_path = max(new, key=lambda p: p.stat().st_mtime_ns) if new else None
    if trace_path is None:
        logger.warning("the profiler wrote no trace file into %s", folder)
    top_ops = top_ops_from_key_averages(prof.key_averages(), device=(kind != "cpu"), row_limit=row_limit)
    return ProfileResult(out_dir=folder, trace_path=trace_path, top_ops=top_ops, kind=kind, steps=steps)


def _profile_npu(step_fn, folder: Path, activities, sync, total: int, steps: int, warmup: int,
                 record_shapes: bool, row_limit: int, state: dict) -> ProfileResult:
    """The torch_npu.profiler path of :func:`profile_steps` (fact-check §5)."""
    torch_npu = _import_torch_npu()
    npu_prof = torch_npu.profiler
    before = set(folder.glob("*_ascend_pt"))
    handler = npu_prof.tensorboard_trace_handler(str(folder))

    def on_trace_ready(prof) -> None:
        # torch_npu calls this on stop() even mid-record; parsing an interrupted
        # run would produce incomplete data (sgl-project/sglang#14308), so skip it.
        if state["complete"] or getattr(prof, "step_num", 0) >= total:
            handler(prof)
        else:
            logger.warning("NPU profiling stopped early; raw data left unparsed in %s", folder)

    prof = npu_prof.profile(
        activities=activities,
        schedule=npu_prof.schedule(wait=0, warmup=warmup, active=steps, repeat=1),
        on_trace_ready=on_trace_ready,
        record_shapes=record_shapes,
    )
    prof.start()
    _run_steps(prof, step_fn, sync, total, state)

    runs = [p for p in folder.glob("*_ascend_pt") if p not in before and p.is_dir()]
    run_dir = max(runs, key=lambda p: p.stat().st_mtime_ns) if runs else None
    trace_path = None
    top_ops = _empty_top_ops()
    if run_dir is None:
        logger.warning("torch_npu.profiler wrote no *_ascend_pt folder into %s", folder)
    else:
        traces = sorted(run_dir.rglob("trace_view.json"), key=lambda p: p.stat().st_mtime_ns)
        trace_path = traces[-1] if traces else None
        details = sorted(run_dir.rglob("operator_details.csv"), key=lambda p: p.stat().st_mtime_ns)
        if details:
            top_ops = top_ops_from_operator_details(details[-1], row_limit=row_limit)
        else:
            logger.warning("no operator_details.csv under %s; top_ops is empty", run_dir)
    return ProfileResult(out_dir=folder, trace_path=trace_path, top_ops=top_ops, kind="npu", steps=steps)
