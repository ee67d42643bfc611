"""Where things live: the notebooks, the default run folders, in a checkout or in an installed wheel.

In a checkout (``pip install -e .`` or ``make``) the notebooks are the repository's ``notebooks/`` and runs go
to its ``runs/``. Installed from a wheel into a user's own environment there is no repository: the notebooks,
their profiles and the example jobs are read from the package data (``helpers/bundled/``), runs go to
``./runs`` of the folder the command is started in, and nothing is written inside site-packages.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from helpers.fsutil import in_checkout, repo_root

__all__ = ["BUNDLED_EXAMPLES", "BUNDLED_NOTEBOOKS", "copy_notebooks", "examples_dir", "in_checkout", "interactive_dir",
           "notebooks_dir", "repo_root", "runs_dir"]

BUNDLED_NOTEBOOKS = "helpers.bundled.notebooks"
BUNDLED_EXAMPLES = "helpers.bundled.examples"


def _bundled(package: str) -> Path:
    """The folder of an installed ``helpers.bundled.*`` data package (beside the ``helpers`` package's files)."""
    return Path(__file__).resolve().parents[1].joinpath(*package.split(".")[1:])


def notebooks_dir() -> Path:
    """Return the folder of the numbered notebooks (the checkout's, else the installed package data's)."""
    return repo_root() / "notebooks" if in_checkout() else _bundled(BUNDLED_NOTEBOOKS)


def examples_dir() -> Path:
    """Return the folder of the example jobs (the checkout's ``examples/``, else the installed package data's)."""
    return repo_root() / "examples" if in_checkout() else _bundled(BUNDLED_EXAMPLES)


def runs_dir() -> Path:
    """Return the folder in which run folders are created.

    ``WORKBOOK_RUNS_DIR`` when set; else the checkout's ``runs/``; else ``./runs`` of the current folder
    (an installed wheel writes nothing inside site-packages).
    """
    env = os.environ.get("WORKBOOK_RUNS_DIR")
    if env:
        return Path(env)
    return repo_root() / "runs" if in_checkout() else Path.cwd() / "runs"


def interactive_dir() -> Path:
    """Return the folder used by notebooks opened by hand (no ``out_dir`` given)."""
    return runs_dir() / "interactive"


def copy_notebooks(dest: str | os.PathLike) -> list[Path]:
    """Copy the numbered notebooks and their ``profiles/`` into ``dest`` (for JupyterLab); return the notebooks.

    Existing files in ``dest`` are not overwritten (a learner's edits are kept).

    Raises
    ------
    helpers.errors.OutputDirError
        If ``dest`` cannot be created or written.
    """
    from helpers.errors import OutputDirError

    out = Path(dest).expanduser()
    try:
        (out / "profiles").mkdir(parents=True, exist_ok=True)
        copied = []
        src = notebooks_dir()
        for nb in sorted(src.glob("[0-9][0-9]_*.ipynb")):
            target = out / nb.name
            if not target.exists():
                shutil.copyfile(nb, target)
            copied.append(target)
        for prof in sorted((src / "profiles").glob("*.yaml")):
            if not (out / "profiles" / prof.name).exists():
                shutil.copyfile(prof, out / "profiles" / prof.name)
    except OSError as exc:
        raise OutputDirError(f"cannot copy the notebooks to {out}: {exc}; pass a writable folder") from exc
    return copied
