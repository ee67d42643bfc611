"""Find out, without importing torch here, whether torch_npu can be used.

When ``torch_npu`` is installed, ``import torch`` loads it automatically
through the entry point ``[torch.backends] torch_npu = torch_npu:_autoload``
(PyTorch >= 2.5).  If the CANN runtime is not set up, or torch and torch_npu
versions differ, that makes ``import torch`` itself fail, and a notebook
kernel that tried it is unusable until restarted
(huggingface/accelerate#3754).  This module therefore tries the import in a
*child* process, turns what went wrong into one sentence of cause and the
exact command that fixes it, and can switch autoloading off
(``TORCH_DEVICE_BACKEND_AUTOLOAD=0``) before the parent imports torch.

Nothing in this module imports torch, neither at import time nor later.

Sources
-------
- ``TORCH_DEVICE_BACKEND_AUTOLOAD``: ``torch/__init__.py``
  (``_is_device_backend_autoload_enabled`` reads
  ``os.getenv("TORCH_DEVICE_BACKEND_AUTOLOAD", "1") == "1"``).
- The error texts matched here: ``torch_npu/__init__.py`` (libhccl.so /
  libascendcl.so handling; "Two accelerators cannot be used at the same time
  in PyTorch: npu and <type>") and ``docs/ascend_api_factcheck.md``
  section 7 (local reproduction with torch 2.13.0+cpu and torch_npu 2.13.0).
- torch_npu ``X.Y.Z`` requires ``torch==X.Y.Z.*`` (wheel METADATA, fact-check
  section 7).
- ``torch_npu.utils.get_cann_version(module="CANN")`` (Ascend/op-plugin docs,
  ``torch_npu-utils-get_cann_version.md``) and ``torch.version.cann``.
"""

from __future__ import annotations

import dataclasses
import importlib.machinery
import importlib.metadata
import json
import logging
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from helpers.errors import DeviceUnavailableError, ParameterError

logger = logging.getLogger(__name__)

__all__ = [
    "NpuProbe",
    "STATUSES",
    "AUTOLOAD_ENV",
    "CANN_SET_ENV",
    "probe_npu",
    "get_probe",
    "prepare_torch_import",
]

#: The values ``NpuProbe.status`` can take.
STATUSES: tuple[str, ...] = ("usable", "not installed", "broken", "no device")

#: PyTorch's switch for loading device extensions on ``import torch``.
AUTOLOAD_ENV = "TORCH_DEVICE_BACKEND_AUTOLOAD"

#: Default location of CANN's environment script (Ascend installation guide;
#: the fact-check, section 7).
CANN_SET_ENV = "/usr/local/Ascend/ascend-toolkit/set_env.sh"

#: Prefix of the JSON lines the child prints, so that anything else torch or
#: torch_npu print on stdout cannot be mistaken for the result.
_MARK = "@@helpers.npu_probe@@ "

#: How many lines of the child's stderr are kept in ``NpuProbe.detail``.
_DETAIL_LINES = 15

#: The child program.  ``meta`` as first argument: report package metadata
#: and whether ``torch_npu`` is importable, without importing torch.
_CHILD = r"""
import importlib.metadata as _md
import importlib.util as _iu
import json, os, sys
MARK = %(mark)r

def _ver(name):
    try:
        return _md.version(name)
    except Exception:
        return None

meta = {"stage": "meta", "python": sys.executable,
        "spec_found": _iu.find_spec("torch_npu") is not None,
        "torch_version": _ver("torch"), "torch_npu_version": _ver("torch_npu")}
print(MARK + json.dumps(meta), flush=True)
if sys.argv[1:2] == ["meta"]:
    sys.exit(0)

import torch
import torch_npu

res = {"stage": "result", "torch_version": getattr(torch, "__version__", None),
       "torch_npu_version": getattr(torch_npu, "__version__", None),
       "is_available": False, "device_count": 0, "device_name": None,
       "cann_version": None,
       "visible_devices": os.environ.get("ASCEND_RT_VISIBLE_DEVICES")}
npu = getattr(torch, "npu", None)
if npu is not None:
    try:
        res["is_available"] = bool(npu.is_available())
        res["device_count"] = int(npu.device_count())
    except Exception as exc:
        res["error"] = "%%s: %%s" %% (type(exc).__name__, exc)
    if res["is_available"] and res["device_count"] > 0:
        try:
            res["device_name"] = str(npu.get_device_name(0))
        except Exception:
            pass
try:
    from torch_npu.utils import get_cann_version
    cann = get_cann_version(module="CANN")
except Exception:
    cann = getattr(getattr(torch, "version", None), "cann", None)
res["cann_version"] = str(cann) if cann else None
print(MARK + json.dumps(res), flush=True)
""" % {"mark": _MARK}

_LIB_RE = re.compile(r"(lib[\w.+\-]*?\.so(?:\.[\w]+)*): cannot open shared object file")
_TWO_ACC_RE = re.compile(r"Two accelerators cannot be used at the same time(?: in PyTorch)?:?\s*(\w+)?(?: and (\w+))?")
_RELEASE_RE = re.compile(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?")

# Filled lazily by get_probe(); never at import time.
_CACHE: "NpuProbe | None" = None


@dataclass(frozen=True)
class NpuProbe:
    """What a child process found when it imported torch and torch_npu.

    Attributes
    ----------
    status : str
        One of :data:`STATUSES`: ``"usable"`` (imported, at least one NPU
        visible), ``"not installed"`` (no torch_npu package), ``"broken"``
        (installed but importing it fails or hangs), ``"no device"`` (imports,
        but ``torch.npu`` sees no NPU).
    torch_version, torch_npu_version : str or None
        Installed versions, read from package metadata (no import), e.g.
        ``"2.13.0+cpu"``; None where the package or its metadata is missing.
    device_count : int
        Number of NPUs the child saw (0 unless it imported).
    device_name : str or None
        Name of NPU 0 (``torch.npu.get_device_name(0)``), e.g.
        ``"Ascend910B3"``.
    cann_version : str or None
        CANN version from ``torch_npu.utils.get_cann_version`` (or
        ``torch.version.cann``); None when torch_npu does not expose one.
    cause : str
        One sentence saying what was found or what is wrong.
    fix : str
        The exact command(s) to run; empty when nothing needs fixing.
    detail : str
        The last lines of the child's stderr (or a note when no child ran).
    """

    status: str
    torch_version: str | None = None
    torch_npu_version: str | None = None
    device_count: int = 0
    device_name: str | None = None
    cann_version: str | None = None
    cause: str = ""
    fix: str = ""
    detail: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ParameterError(
                f"NpuProbe.status must be one of {STATUSES}, got {self.status!r}"
            )

    @property
    def usable(self) -> bool:
        """bool: True when torch_npu imports and sees at least one NPU."""
        return self.status == "usable"

    @property
    def installed(self) -> bool:
        """bool: True when a torch_npu package was found (usable or not)."""
        return self.status != "not installed"

    def as_dict(self) -> dict[str, Any]:
        """Return the probe as a plain, JSON-serialisable dict (adds ``usable``)."""
        out = dataclasses.asdict(self)
        out["usable"] = self.usable
        return out


# --------------------------------------------------------------------------
# version helpers


def _release(version: str | None) -> tuple[int, int, int] | None:
    """Return the ``(X, Y, Z)`` release of a version string, or None.

    ``"2.13.0+cpu"`` -> ``(2, 13, 0)``; ``"2.12.0.post3"`` -> ``(2, 12, 0)``;
    ``"2.13"`` -> ``(2, 13, 0)``.
    """
    if not version:
        return None
    m = _RELEASE_RE.match(version)
    if m is None:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def _fmt(rel: tuple[int, int, int]) -> str:
    return ".".join(str(p) for p in rel)


def _version_problem(torch_v: str | None, npu_v: str | None) -> tuple[str, str] | None:
    """Return ``(cause, fix)`` when the installed versions cannot work together.

    torch_npu ``X.Y.Z`` (any ``.postN``) requires ``torch==X.Y.Z.*`` (its
    wheel's ``Requires-Dist``, see the module docstring).
    """
    npu_rel = _release(npu_v)
    if npu_v and torch_v is None:
        target = _fmt(npu_rel) if npu_rel else npu_v
        return (
            f"torch_npu {npu_v} is installed but torch is not.",
            f"pip install torch=={target} --index-url https://download.pytorch.org/whl/cpu",
        )
    torch_rel = _release(torch_v)
    if npu_rel is None or torch_rel is None or npu_rel == torch_rel:
        return None
    return (
        f"torch {torch_v} and torch_npu {npu_v} do not match: torch_npu "
        f"{_fmt(npu_rel)} requires torch=={_fmt(npu_rel)}.*.",
        f"pip install torch_npu=={_fmt(torch_rel)}   "
        f"(or keep torch_npu and run: pip install torch=={_fmt(npu_rel)} "
        f"--index-url https://download.pytorch.org/whl/cpu)",
    )


# --------------------------------------------------------------------------
# locating the package without importing it


def _search_path(extra_sys_path: Sequence[str | os.PathLike[str]],
                 env: Mapping[str, str] | None) -> list[str]:
    """The module search path the child will have: extra, then PYTHONPATH, then ours."""
    source = os.environ if env is None else env
    pythonpath = [p for p in source.get("PYTHONPATH", "").split(os.pathsep) if p]
    return [os.fspath(p) for p in extra_sys_path] + pythonpath + list(sys.path)


def _local_meta(search: list[str]) -> dict[str, Any]:
    """Metadata and spec lookup for this interpreter, on ``search``; imports nothing."""

    def ver(name: str) -> str | None:
        for dist in importlib.metadata.distributions(name=name, path=search):
            return dist.version
        return None

    spec = importlib.machinery.PathFinder.find_spec("torch_npu", search)
    return {
        "spec_found": spec is not None,
        "torch_version": ver("torch"),
        "torch_npu_version": ver("torch_npu"),
    }


def _same_interpreter(python: str) -> bool:
    """True when ``python`` names this interpreter (same path; symlinks are not
    followed, since a virtual environment's python is a link to its base)."""
    found = shutil.which(python) or python
    return os.path.abspath(found) == os.path.abspath(sys.executable)


def _child_env(extra_sys_path: Sequence[str | os.PathLike[str]],
               env: Mapping[str, str] | None) -> dict[str, str]:
    out = dict(os.environ if env is None else env)
    parts = [os.fspath(p) for p in extra_sys_path]
    if out.get("PYTHONPATH"):
        parts.append(out["PYTHONPATH"])
    if parts:
        out["PYTHONPATH"] = os.pathsep.join(parts)
    out.setdefault("PYTHONUNBUFFERED", "1")
    return out


def _parse_lines(stdout: str) -> dict[str, dict[str, Any]]:
    """Return the child's JSON records by stage (``meta``, ``result``)."""
    found: dict[str, dict[str, Any]] = {}
    for line in stdout.splitlines():
        if not line.startswith(_MARK):
            continue
        try:
            rec = json.loads(line[len(_MARK):])
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and "stage" in rec:
            found[str(rec["stage"])] = rec
    return found


def _tail(text: str, n: int = _DETAIL_LINES) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return "\n".join(lines[-n:])


def _last_error_line(stderr: str) -> str:
    """The last line that looks like ``SomeError: message`` (else the last line)."""
    lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.match(r"^[\w.]+(Error|Exception|Exit|Interrupt)\b", ln):
            return ln
    return lines[-1] if lines else ""


# --------------------------------------------------------------------------
# diagnosis


def _not_installed(meta: Mapping[str, Any], python: str) -> NpuProbe:
    torch_rel = _release(meta.get("torch_version"))
    pin = f"torch_npu=={_fmt(torch_rel)}" if torch_rel else "torch_npu (same X.Y.Z as torch)"
    return NpuProbe(
        status="not installed",
        torch_version=meta.get("torch_version"),
        torch_npu_version=None,
        cause=f"torch_npu is not installed in this Python environment ({python}).",
        fix=(
            f"pip install -e '.[npu]'   (or: pip install {pin}); torch_npu also needs "
            f"the CANN toolkit installed and set up: source {CANN_SET_ENV}"
        ),
        detail="found by package lookup; no child process was run",
    )


def _diagnose_failure(meta: Mapping[str, Any], stderr: str, rc: int | None) -> NpuProbe:
    """Turn a failed child (no result line) into a ``"broken"`` probe."""
    base = dict(
        status="broken",
        torch_version=meta.get("torch_version"),
        torch_npu_version=meta.get("torch_npu_version"),
        detail=_tail(stderr),
    )
    lib = _LIB_RE.search(stderr)
    if lib is not None:
        return NpuProbe(
            **base,
            cause=(
                "CANN runtime libraries are not on the library path "
                f"({lib.group(1)} not found)."
            ),
            fix=(
                f"source {CANN_SET_ENV} (or your CANN install's set_env.sh), then "
                f"restart the kernel; or set {AUTOLOAD_ENV}=0 to use torch without the NPU"
            ),
        )
    two = _TWO_ACC_RE.search(stderr)
    if two is not None:
        other = two.group(2) or ""
        torch_rel = _release(meta.get("torch_version"))
        cpu_pin = f"torch=={_fmt(torch_rel)}" if torch_rel else "torch"
        if other == "npu":
            return NpuProbe(
                **base,
                cause=(
                    "torch_npu was registered twice (npu and npu): another package "
                    "claimed the NPU backend before torch_npu loaded."
                ),
                fix=(
                    f"export {AUTOLOAD_ENV}=0 and put 'import torch_npu' right after "
                    "'import torch', before any other Ascend extension"
                ),
            )
        kind = other or "another accelerator"
        return NpuProbe(
            **base,
            cause=(
                f"torch is a {kind} build and torch_npu cannot be loaded next to it "
                "(Two accelerators cannot be used at the same time)."
            ),
            fix=(
                f"on an NPU machine install the CPU build of torch: pip install {cpu_pin} "
                "--index-url https://download.pytorch.org/whl/cpu; on a "
                f"{kind} machine: pip uninstall torch_npu (or export {AUTOLOAD_ENV}=0)"
            ),
        )
    last = _last_error_line(stderr)
    if not last:
        last = f"the child process exited with status {rc} and printed no error"
    return NpuProbe(
        **base,
        cause=f"importing torch and torch_npu failed: {last}",
        fix=(
            "read the detail below; check that torch and torch_npu versions match "
            f"(pip show torch torch_npu) and that CANN is set up (source {CANN_SET_ENV})"
        ),
    )


def _from_result(meta: Mapping[str, Any], res: Mapping[str, Any], stderr: str) -> NpuProbe:
    count = int(res.get("device_count") or 0)
    common = dict(
        torch_version=meta.get("torch_version") or res.get("torch_version"),
        torch_npu_version=meta.get("torch_npu_version") or res.get("torch_npu_version"),
        device_count=count,
        device_name=res.get("device_name"),
        cann_version=res.get("cann_version"),
        detail=_tail(stderr),
    )
    if res.get("is_available") and count > 0:
        name = res.get("device_name") or "NPU"
        return NpuProbe(
            status="usable",
            cause=f"torch_npu imports and sees {count} NPU(s) ({name}).",
            fix="",
            **common,
        )
    visible = res.get("visible_devices")
    hidden = (
        f"ASCEND_RT_VISIBLE_DEVICES={visible!r} may hide them"
        if visible is not None
        else "ASCEND_RT_VISIBLE_DEVICES is not set"
    )
    err = f" ({res['error']})" if res.get("error") else ""
    return NpuProbe(
        status="no device",
        cause=(
            "torch_npu imports but sees no NPU: the driver is not loaded or no device "
            f"is visible to this process; {hidden}{err}."
        ),
        fix=(
            "npu-smi info   (lists the NPUs the driver sees; if it fails, install or "
            "load the Ascend driver; else unset or correct ASCEND_RT_VISIBLE_DEVICES)"
        ),
        **common,
    )


def _run_child(python: str, args: list[str], env: dict[str, str],
               timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [python, "-c", _CHILD, *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
        check=False,
    )


def probe_npu(
    *,
    timeout_s: float = 120,
    python: str = sys.executable,
    env: Mapping[str, str] | None = None,
    extra_sys_path: Sequence[str | os.PathLike[str]] = (),
) -> NpuProbe:
    """Find out whether torch_npu is usable, importing torch only in a child process.

    Steps: (1) look torch_npu up (module spec and package metadata) without
    importing anything; no package -> ``"not installed"`` at once; (2) compare
    the torch and torch_npu release versions (the most common failure) ->
    ``"broken"`` without a child; (3) run ``python -c <script>`` that imports
    torch then torch_npu and prints one JSON line, and diagnose its output.

    Parameters
    ----------
    timeout_s : float, default 120
        Seconds the child may take; a child that hangs longer is killed and
        the probe says ``"broken"`` (it hung).  Must be > 0.
    python : str, default ``sys.executable``
        The interpreter to probe.  For another interpreter than this one,
        step (1) and (2) run in a short child that does not import torch.
    env : mapping of str to str, optional
        Environment of the child (default: this process's).  Its
        ``PYTHONPATH`` is also searched in step (1), so the lookup and the
        child agree.
    extra_sys_path : sequence of path-like, default ()
        Folders put in front of the module search path, both for the lookup
        and (through ``PYTHONPATH``) for the child.  Used by tests to put a
        fake ``torch_npu`` in place.

    Returns
    -------
    NpuProbe
        Status, versions, device count and name, and a cause and fix.

    Raises
    ------
    ParameterError
        If ``timeout_s`` is not a positive number.
    """
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or timeout_s <= 0:
        raise ParameterError(
            f"timeout_s must be a positive number of seconds, got {timeout_s!r}; "
            "use e.g. 120"
        )
    child_env = _child_env(extra_sys_path, env)

    # (1) lookup without importing
    if _same_interpreter(python):
        meta = _local_meta(_search_path(extra_sys_path, env))
    else:
        try:
            proc = _run_child(python, ["meta"], child_env, timeout_s)
        except (subprocess.TimeoutExpired, OSError) as exc:
            return NpuProbe(
                status="broken",
                cause=f"could not run the interpreter {python!r}: {exc}.",
                fix=f"check that {python} exists and runs: {python} -c 'print(1)'",
                detail=str(exc),
            )
        meta = _parse_lines(proc.stdout).get("meta")
        if meta is None:
            return NpuProbe(
                status="broken",
                cause=f"the interpreter {python!r} did not answer the package lookup: "
                f"{_last_error_line(proc.stderr) or 'no output'}.",
                fix=f"check that {python} is a working Python 3 interpreter",
                detail=_tail(proc.stderr),
            )
    if not meta.get("spec_found") and not meta.get("torch_npu_version"):
        probe = _not_installed(meta, python)
        logger.debug("npu probe: %s", probe.cause)
        return probe

    # (2) versions, before spending seconds on a child
    problem = _version_problem(meta.get("torch_version"), meta.get("torch_npu_version"))
    if problem is not None:
        probe = NpuProbe(
            status="broken",
            torch_version=meta.get("torch_version"),
            torch_npu_version=meta.get("torch_npu_version"),
            cause=problem[0],
            fix=problem[1],
            detail="found from package metadata; no child process was run",
        )
        logger.debug("npu probe: %s", probe.cause)
        return probe

    # (3) import in a child
    try:
        proc = _run_child(python, [], child_env, timeout_s)
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        return NpuProbe(
            status="broken",
            torch_version=meta.get("torch_version"),
            torch_npu_version=meta.get("torch_npu_version"),
            cause=f"importing torch and torch_npu hung for {timeout_s:g} s and was stopped.",
            fix=(
                f"source {CANN_SET_ENV}, check the NPU driver answers (npu-smi info), "
                "and retry with a larger timeout_s if the machine is only slow"
            ),
            detail=_tail(err) or "no stderr before the timeout",
        )
    except OSError as exc:
        return NpuProbe(
            status="broken",
            torch_version=meta.get("torch_version"),
            torch_npu_version=meta.get("torch_npu_version"),
            cause=f"could not start the probe process with {python!r}: {exc}.",
            fix=f"check that {python} exists and runs: {python} -c 'print(1)'",
            detail=str(exc),
        )
    records = _parse_lines(proc.stdout)
    result = records.get("result")
    if result is None:
        probe = _diagnose_failure(meta, proc.stderr, proc.returncode)
    else:
        probe = _from_result(meta, result, proc.stderr)
    logger.debug("npu probe: %s (%s)", probe.status, probe.cause)
    return probe


def get_probe(*, refresh: bool = False) -> NpuProbe:
    """Return this process's cached :func:`probe_npu` result (probing on first use).

    Parameters
    ----------
    refresh : bool, default False
        Probe again and replace the cached result.

    Returns
    -------
    NpuProbe
    """
    global _CACHE
    if _CACHE is None or refresh:
        _CACHE = probe_npu()
    return _CACHE


def prepare_torch_import(*, fallback_to_cpu: bool = True,
                         probe: NpuProbe | None = None) -> NpuProbe:
    """Make the coming ``import torch`` succeed even when torch_npu is broken.

    Call this before the first ``import torch`` of a process (the workbook's
    first cell does).  When torch_npu is installed but broken and
    ``fallback_to_cpu`` is true, sets ``os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"]
    = "0"`` so torch does not autoload it (torch then runs on CPU or CUDA) and
    logs a WARNING with the cause and the fix.  If torch is already imported,
    nothing can be changed: the probe is returned and the situation logged.

    Parameters
    ----------
    fallback_to_cpu : bool, default True
        Disable autoloading of a broken torch_npu.  With False a broken
        torch_npu raises instead, since ``import torch`` would fail.
    probe : NpuProbe, optional
        A probe to act on; default: :func:`get_probe` (cached per process).

    Returns
    -------
    NpuProbe
        The probe acted on.

    Raises
    ------
    DeviceUnavailableError
        When torch_npu is broken, torch is not yet imported and
        ``fallback_to_cpu`` is False; the message holds the cause and fix.
    """
    if probe is None:
        probe = get_probe()
    if "torch" in sys.modules:
        if probe.status == "broken":
            logger.warning(
                "torch is already imported, so %s=0 can no longer take effect; "
                "torch_npu is broken: %s Fix: %s",
                AUTOLOAD_ENV, probe.cause, probe.fix,
            )
        else:
            logger.info("torch already imported; torch_npu status: %s", probe.status)
        return probe
    if probe.status != "broken":
        logger.info("torch_npu status: %s (%s)", probe.status, probe.cause)
        return probe
    if not fallback_to_cpu:
        raise DeviceUnavailableError(
            f"torch_npu is installed but broken, so 'import torch' would fail: "
            f"{probe.cause} Fix: {probe.fix}. Or call prepare_torch_import("
            f"fallback_to_cpu=True) to use torch without the NPU."
        )
    previous = os.environ.get(AUTOLOAD_ENV)
    os.environ[AUTOLOAD_ENV] = "0"
    logger.warning(
        "torch_npu is broken, so torch will start without it (%s=0, was %r): %s Fix: %s",
        AUTOLOAD_ENV, previous, probe.cause, probe.fix,
    )
    return probe
