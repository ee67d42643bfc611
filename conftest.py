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


def pytest_collection_modifyitems(config, items):
    """nbval's items (``pytest notebooks/...``: one per cell of a committed notebook, default parameters) are
    marked ``notebook`` and ``slow``, so that ``make test-fast`` (the selection in pyproject.toml's comment on its
    markers) leaves them out."""
    import pytest

    for item in items:
        if item.path.suffix == ".ipynb":
            item.add_marker(pytest.mark.notebook)
            item.add_marker(pytest.mark.slow)
