"""The torch_npu 2.13.0 wheel's Python source, for the tests that check the workbook against it.

The wheel is read as a zip file and never imported (torch_npu needs CANN's libraries to import). Where it is:

1. ``$TORCH_NPU_WHEEL``: a wheel file, or a folder holding one;
2. ``.cache/npu-wheel/`` in the checkout (``make npu-wheel`` downloads it there);
3. otherwise it is downloaded there with this interpreter's pip (the same command as ``make npu-wheel``), with a
   short timeout; a test that needs it is skipped, saying so, only when that fails.
"""

from __future__ import annotations

import ast
import functools
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

VERSION = "2.13.0"
ENV = "TORCH_NPU_WHEEL"
CACHE = Path(__file__).resolve().parents[1] / ".cache" / "npu-wheel"
PATTERN = f"torch_npu-{VERSION}-*.whl"
#: ``make npu-wheel``'s command; the platform is pinned so that every machine reads the same file.
DOWNLOAD = ["-m", "pip", "download", "--disable-pip-version-check", "--no-deps", "--only-binary=:all:",
            "--platform", "manylinux_2_28_x86_64", "--python-version", "3.11", f"torch-npu=={VERSION}"]
FETCH_TIMEOUT_S = 120


def _in(folder: Path) -> Path | None:
    found = sorted(folder.glob(PATTERN)) if folder.is_dir() else []
    return found[-1] if found else None


def locate() -> Path | None:
    """The wheel file, from ``$TORCH_NPU_WHEEL`` or the cache folder; None when neither has it."""
    given = os.environ.get(ENV)
    if given:
        p = Path(given)
        return p if p.is_file() else _in(p)
    return _in(CACHE)


def fetch() -> tuple[Path | None, str]:
    """Download the wheel into the cache folder; (path, "") or (None, why not)."""
    try:
        done = subprocess.run([sys.executable, *DOWNLOAD, "-d", str(CACHE)], capture_output=True, text=True,
                              timeout=FETCH_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{type(exc).__name__}: {exc}"
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()
        return None, last[-1] if last else f"pip exited {done.returncode}"
    return _in(CACHE), ""


class WheelSource:
    """The ``.py`` files of one wheel, by path inside it (``torch_npu/profiler/profiler.py``)."""

    def __init__(self, path: Path):
        self.path = path
        self._zip = zipfile.ZipFile(path)
        self.files = {n for n in self._zip.namelist() if n.endswith(".py")}

    @functools.lru_cache(maxsize=None)
    def text(self, name: str) -> str:
        """The source of ``name``; KeyError when the wheel has no such file."""
        return self._zip.read(name).decode("utf-8")

    @functools.lru_cache(maxsize=None)
    def tree(self, name: str) -> ast.Module:
        return ast.parse(self.text(name), filename=f"{self.path.name}:{name}")

    def class_attr(self, name: str, cls: str, attr: str):
        """The literal value of ``cls.attr`` in file ``name`` (a class-level assignment)."""
        for node in ast.walk(self.tree(name)):
            if isinstance(node, ast.ClassDef) and node.name == cls:
                for stmt in node.body:
                    if isinstance(stmt, ast.Assign) and any(getattr(t, "id", None) == attr for t in stmt.targets):
                        return ast.literal_eval(stmt.value)
        raise KeyError(f"{cls}.{attr} not found in {name} of {self.path.name}")


@functools.lru_cache(maxsize=1)
def _wheel() -> tuple[WheelSource | None, str]:
    path, why = locate() or _in(CACHE), ""
    if path is None:
        path, why = fetch()
    if path is None:
        given = f"${ENV}={os.environ.get(ENV)!r}" if os.environ.get(ENV) else f"${ENV} (unset)"
        return None, (f"torch_npu {VERSION} wheel not in {given} nor {CACHE}, and downloading it failed ({why}); "
                      "run make npu-wheel where the package index is reachable")
    try:
        return WheelSource(path), ""
    except (OSError, zipfile.BadZipFile) as exc:
        return None, f"{path} is not a readable wheel ({exc}); delete it and run make npu-wheel"


def wheel_or_skip() -> WheelSource:
    """The wheel's source, or skip the test with the reason it could not be found nor fetched."""
    source, why = _wheel()
    if source is None:
        pytest.skip(why)
    return source
