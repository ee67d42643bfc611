"""Keep committed notebooks clean and checkable.

The committed notebooks carry outputs only for cells marked
``# NBVAL_CHECK_OUTPUT`` (deterministic cells that nbval compares in lax
mode), with their execution counts; every other cell is stored without
outputs, and execution metadata (papermill's, nbclient's) is dropped.

``python -m helpers.workbook.nbtools refresh notebooks/01_baseline_profiling.ipynb``
executes a notebook with its default parameters and stores it that way;
``clean`` only strips.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import nbformat

CHECK_MARK = "NBVAL_CHECK_OUTPUT"
_DROP_CELL_META = ("papermill", "execution", "ExecuteTime", "collapsed", "scrolled")


def is_check_cell(cell) -> bool:
    """True for a code cell whose output nbval compares (comment marker or tag)."""
    return cell.cell_type == "code" and (CHECK_MARK in cell.source
                                         or "nbval-check-output" in cell.metadata.get("tags", []))


def clean(nb) -> "nbformat.NotebookNode":
    """Strip outputs of all but check cells, renumber those, drop execution metadata; returns ``nb``."""
    count = 0
    for cell in nb.cells:
        for key in _DROP_CELL_META:
            cell.metadata.pop(key, None)
        if "tags" in cell.metadata:
            cell.metadata["tags"] = [t for t in cell.metadata["tags"] if t != "injected-parameters"]
            if not cell.metadata["tags"]:
                del cell.metadata["tags"]
        if cell.cell_type != "code":
            continue
        if is_check_cell(cell) and cell.outputs:
            count += 1
            cell.execution_count = count
            for out in cell.outputs:
                if "execution_count" in out:
                    out["execution_count"] = count
        else:
            cell.outputs = []
            cell.execution_count = None
    for key in ("papermill", "widgets"):
        nb.metadata.pop(key, None)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def refresh(path: Path, *, timeout_s: int = 1800) -> None:
    """Execute ``path`` with its default parameters, then store it cleaned."""
    import papermill as pm

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / path.name
        pm.execute_notebook(str(path), str(out), kernel_name="python3", cwd=str(path.parent),
                            progress_bar=False, execution_timeout=timeout_s)
        nb = nbformat.read(out, as_version=4)
    nbformat.write(clean(nb), path)


def main(argv: list[str] | None = None) -> int:
    """Command line: ``refresh`` or ``clean`` the given notebooks."""
    ap = argparse.ArgumentParser(prog="python -m helpers.workbook.nbtools")
    ap.add_argument("action", choices=("refresh", "clean"))
    ap.add_argument("notebooks", nargs="+", type=Path)
    args = ap.parse_args(argv)
    for path in args.notebooks:
        if args.action == "refresh":
            refresh(path)
        else:
            nbformat.write(clean(nbformat.read(path, as_version=4)), path)
        print(f"{args.action}: {path}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
