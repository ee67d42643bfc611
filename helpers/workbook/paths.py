"""Where things live: the repository, the notebooks, the default run folders."""

from __future__ import annotations

import os
from pathlib import Path


def repo_root() -> Path:
    """Return the repository root (the folder that holds ``helpers/`` and ``notebooks/``)."""
    return Path(__file__).resolve().parents[2]


def notebooks_dir() -> Path:
    """Return the folder of the numbered notebooks."""
    return repo_root() / "notebooks"


def runs_dir() -> Path:
    """Return the folder in which run folders are created (``WORKBOOK_RUNS_DIR`` overrides it)."""
    env = os.environ.get("WORKBOOK_RUNS_DIR")
    return Path(env) if env else repo_root() / "runs"


def interactive_dir() -> Path:
    """Return the folder used by notebooks opened by hand (no ``out_dir`` given)."""
    return runs_dir() / "interactive"
