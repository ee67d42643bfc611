"""Executing one notebook of a run: papermill, the kernel's log, its errors as run.json entries, its web page.

This module does not import torch: the kernel does the device work.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
from pathlib import Path

import nbformat

from helpers import stuck
from helpers.fsutil import write_atomic
from helpers.process import cli_command
from helpers.workbook.rundir import NotebookRun

#: nbconvert's ``lab`` template with one change: a PNG output's ``alt`` metadata (``{"image/png": {"alt": ...}}``,
#: what :func:`helpers.workbook.plots.show_png` writes) becomes its ``<img alt>``. nbconvert 7's ``classic`` template
#: reads that key; its ``lab`` template ignores it, and the exporter then warns "Alternative text is missing on N
#: image(s)" for every figure (nbconvert/exporters/html.py, ``from_notebook_node``).
_LAB_WITH_ALT = """{%- extends 'index.html.j2' -%}
{% block data_png scoped %}
{%- set alt = output | get_metadata('alt', 'image/png') -%}
{%- if alt -%}
{{ super() | replace('<img src=', '<img alt="' ~ (alt | escape_html) ~ '" src=', 1) }}
{%- else -%}
{{ super() }}
{%- endif -%}
{% endblock data_png %}
"""


def html_exporter():
    """nbconvert's HTML exporter with the ``lab`` template, a figure's alternative text kept (:data:`_LAB_WITH_ALT`)."""
    from jinja2 import DictLoader
    from nbconvert import HTMLExporter

    return HTMLExporter(template_name="lab", extra_loaders=[DictLoader({"workbook_lab.html.j2": _LAB_WITH_ALT})],
                        template_file="workbook_lab.html.j2")


def export_html(notebook: Path) -> Path | None:
    """Render an executed notebook as a self-contained web page beside it (``.html``), for the report's links.

    A browser shows an ``.ipynb`` as raw JSON; nbconvert's HTML exporter (the ``lab`` template, outputs and
    figures embedded, each figure with its alternative text) gives the page a reader can open from the report. A
    rendering that fails only costs the link: it is logged, never raised (the notebook itself ran and its results
    are kept).

    Returns
    -------
    pathlib.Path or None
        The page, or None when there is no notebook or the rendering failed.
    """
    if not notebook.is_file():
        return None
    try:
        body, _ = html_exporter().from_notebook_node(nbformat.read(str(notebook), as_version=4))
        out = notebook.with_suffix(".html")
        write_atomic(out, body)
        return out
    except Exception as exc:  # noqa: BLE001 - a missing template or a broken output must not fail the run
        logging.getLogger(__name__).warning("no HTML rendering of %s: %s: %s", notebook.name, type(exc).__name__,
                                            exc)
        return None


#: nbclient's CellTimeoutError message (nbclient.exceptions.timeout_err_msg): the limit and a preview of the cell
#: between two lines of dashes; it carries no structured fields, so these are read from it.
_CELL_TIMEOUT_RE = re.compile(r"timed out while it was being executed, after (\d+) seconds")


def _preview_first_line(preview: str) -> str:
    """The first line of nbclient's cell preview, as text (a long cell's preview is a Python list of its lines)."""
    import ast

    first = next((line.strip() for line in preview.splitlines() if line.strip()), "")
    if first.startswith("["):
        try:
            lines = ast.literal_eval(first)
        except (ValueError, SyntaxError):
            lines = None
        if isinstance(lines, list):
            first = next((str(x).strip() for x in lines if str(x).strip()), "")
    return first


def _cell_timeout_info(exc: BaseException, notebook: str | None, *, logs: Path | None = None,
                       name: str | None = None) -> dict | None:
    """For a cell timeout: which cell (number and first line), the limit in effect, where the kernel was stuck
    (its stacks dumped in ``logs/<name>.stacks.txt`` before the limit, :mod:`helpers.stuck`) and the option
    that raises the limit."""
    text = str(exc)
    m = _CELL_TIMEOUT_RE.search(text)
    if m is None:
        return None
    limit = int(m.group(1))
    parts = text.split("-------------------")
    preview = parts[1].strip() if len(parts) >= 3 else ""
    first = _preview_first_line(preview)
    index = None
    if notebook and first:
        try:
            cells = nbformat.read(notebook, as_version=4).cells
        except (OSError, ValueError):
            cells = []
        for i, cell in enumerate(cells):
            if cell.cell_type == "code" and cell.source.strip().startswith(first.strip("[]'\"")):
                index = i
                break
    where = f"cell {index} (`{first}`)" if index is not None else (f"the cell starting `{first}`" if first
                                                                   else "a cell")
    where_stuck = stuck.read_stuck(logs, name) if logs is not None and name else None
    stacks = f"; the kernel's stacks: logs/{name}.stacks.txt" if where_stuck else ""
    info = {"type": "CellTimeoutError", "limit_s": limit,
            "message": (f"{where} ran past the per-cell limit of {limit} s"
                        + (f", {where_stuck}{stacks}; if it is only slow, raise the limit" if where_stuck
                           else "; raise it")
                        + f" with --timeout S ({cli_command()} run --timeout {limit * 2} ...), or use a smaller "
                          "--profile")}
    if where_stuck:
        info["stuck"] = where_stuck
    if index is not None:
        info["cell_index"] = index
    if first:
        info["cell_source"] = first[:1000]
    return info


def error_info(exc: BaseException, notebook: str | None = None, *, logs: Path | None = None,
                name: str | None = None) -> dict:
    """A failed notebook's ``error`` entry of run.json: type, one-line message, and the failing cell if known.

    A cell timeout names the cell, the limit and where the kernel was stuck (:func:`_cell_timeout_info`);
    papermill's ``PapermillExecutionError`` gives ``ename``, ``evalue``, ``cell_index``, ``exec_count`` and the
    cell's source (at most 1000 characters); the message is at most 500 characters.
    """
    timeout = _cell_timeout_info(exc, notebook, logs=logs, name=name)
    if timeout is not None:
        return timeout
    info = {"type": type(exc).__name__, "message": str(exc).strip().splitlines()[-1][:500] if str(exc).strip() else ""}
    for attr in ("ename", "evalue", "cell_index", "exec_count"):
        if hasattr(exc, attr):
            info[attr] = getattr(exc, attr)
    if getattr(exc, "source", None):
        info["cell_source"] = str(exc.source)[:1000]
    if "ename" in info:
        info["message"] = f"{info['ename']}: {info.get('evalue', '')}"[:500]
    return info


@contextlib.contextmanager
def _child_stderr_to(path: Path):
    """Send the stderr of processes started inside the block (the kernel) to ``path``.

    The kernel's own log lines (ipykernel's start-up warnings, profiler
    back-end messages) would otherwise interleave with the runner's progress;
    they are kept in the run folder instead. This process's ``sys.stderr``
    (progress bar, errors) still goes to the terminal.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "ab") as log_file:
        os.dup2(log_file.fileno(), 2)
    old = sys.stderr
    sys.stderr = os.fdopen(os.dup(saved), "w", buffering=1)
    try:
        yield
    finally:
        sys.stderr.flush()
        sys.stderr.close()
        sys.stderr = old
        os.dup2(saved, 2)
        os.close(saved)


def execute_notebook(nb: NotebookRun, *, timeout_s: float, progress: bool) -> None:
    """Execute one notebook with papermill (kernel "python3", cwd = notebooks/).

    The kernel's stderr goes to ``<run folder>/logs/<notebook>.log``.
    """
    import papermill as pm

    log_path = Path(nb.output).parent / "logs" / f"{nb.id}.log"
    watch = {stuck.CELL_TIMEOUT_ENV: str(int(timeout_s)), stuck.STUCK_DIR_ENV: str(log_path.parent),
             stuck.STUCK_NAME_ENV: nb.id}  # the kernel dumps its stacks before a cell reaches the limit
    saved = {k: os.environ.get(k) for k in watch}
    for path in stuck.cell_files(log_path.parent, nb.id):
        path.unlink(missing_ok=True)
    os.environ.update(watch)
    try:
        with _child_stderr_to(log_path):
            pm.execute_notebook(
                nb.input, nb.output, parameters=nb.parameters, kernel_name="python3",
                cwd=str(Path(nb.input).parent), progress_bar=progress, log_output=False,
                execution_timeout=int(timeout_s), start_timeout=120,
            )
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

