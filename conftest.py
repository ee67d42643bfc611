"""Test-session settings shared by every test and by the notebook kernels they start (at the repository root, so
that `pytest notebooks/NN_*.ipynb` alone, nbval without tests/, gets them too).

Environment variables set here reach papermill and nbval kernels (they
inherit the pytest process's environment):

* ``WORKBOOK_HEADLESS=1``: widgets are evaluated once, no progress bars;
* ``WORKBOOK_RUNS_DIR``: run folders (and the notebooks' interactive output)
  go to a temporary folder, not into the repository's runs/;
* ``WORKBOOK_CACHE_DIR``: the image check cache goes to a temporary folder,
  not into the user's cache folder.
"""

from __future__ import annotations

import os
import tempfile

os.environ["WORKBOOK_HEADLESS"] = "1"
os.environ.setdefault("WORKBOOK_RUNS_DIR", tempfile.mkdtemp(prefix="workbook-test-runs-"))
os.environ.setdefault("WORKBOOK_CACHE_DIR", tempfile.mkdtemp(prefix="workbook-test-cache-"))

# `make test` runs the tests in pytest-xdist workers (PYTEST_XDIST_WORKER: gw0, gw1, ...; see the Makefile).
if os.environ.get("PYTEST_XDIST_WORKER"):
    # The workers inherit the folders above from the controlling process: each gets its own below them, so that no
    # two kernels append to one interactive results file or write one cache entry at the same time.
    for _var in ("WORKBOOK_RUNS_DIR", "WORKBOOK_CACHE_DIR"):
        os.environ[_var] = os.path.join(os.environ[_var], os.environ["PYTEST_XDIST_WORKER"])
        os.makedirs(os.environ[_var], exist_ok=True)
    # One intra-op thread per worker, inherited by its kernels and child processes: two workers on two cores with
    # torch's default (a thread per core) leave OpenMP threads waiting at each operator's barrier for a core the
    # other worker holds. Measured on the 2-core developer machine: notebook 06's check cells took 11.7 s alone,
    # 310 s beside one busy loop, 14.6 s beside it with OMP_NUM_THREADS=1.
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"


def pytest_collection_modifyitems(config, items):
    """nbval's items (``pytest notebooks/...``: one per cell of a committed notebook, default parameters) are
    marked ``notebook`` and ``slow``, so that ``make test-fast`` (the selection in pyproject.toml's comment on its
    markers) leaves them out."""
    import pytest

    for item in items:
        if item.path.suffix == ".ipynb":
            item.add_marker(pytest.mark.notebook)
            item.add_marker(pytest.mark.slow)
