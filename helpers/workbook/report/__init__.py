"""The run report: report.md and a self-contained report.html.

The first screen answers "what should I change on this machine, and why":
the run's overall verdict (host-bound, balanced or device-bound baseline, and the
end-to-end speedup when notebook 10 ran), then the checklist table with one
row per item of the workbook (environment check ... end to end): the measured
effect with its interval, the recommendation as a badge, the reason, and links
to the item's section and to the executed notebook in the run folder. Then one
section per notebook: its verdict sentence, its figures and a compact table of
its records.

Every number comes from ``results.jsonl`` (read with
:func:`helpers.results.load_results`); nothing is typed by hand. A notebook
without results (not part of the run, failed, interrupted, or records lost)
gets a row and a section that say what is missing and the command that
produces it; building the report never raises because of a missing or damaged
input. report.html embeds its figures as base64 PNG and its CSS inline: it
makes no network request and needs no JavaScript.

The package is split along its three concerns: :mod:`.collect` reads the run
folder (and holds the logic both renderers share), :mod:`.format` formats
numbers, reasons and record tables, and :mod:`.markdown` and :mod:`.html`
render the two files. This module re-exports the public names.
"""

from __future__ import annotations

from pathlib import Path

from helpers.fsutil import write_atomic

from helpers.workbook.report.collect import (MAX_CAUSE_CHARS, NotebookSection, Report, checklist_items, collect,
                                             error_cause, failed_cell, overall_verdict)
from helpers.workbook.report.format import WHY_MAX_CHARS, headline, short_reason
from helpers.workbook.report.html import to_html
from helpers.workbook.report.markdown import to_markdown

__all__ = [
    "checklist_items",
    "MAX_CAUSE_CHARS",
    "NotebookSection",
    "Report",
    "WHY_MAX_CHARS",
    "collect",
    "error_cause",
    "failed_cell",
    "headline",
    "overall_verdict",
    "short_reason",
    "to_html",
    "to_markdown",
    "write_report",
]


def write_report(run_dir: Path) -> tuple[Path, Path]:
    """Write ``report.html`` and ``report.md`` into ``run_dir``.

    Each file is written whole through a temporary file and renamed
    (:func:`helpers.fsutil.write_atomic`): a failed write (a full disk) leaves
    the previous report as it was and no temporary file behind.

    Parameters
    ----------
    run_dir : Path
        The run folder (see :func:`collect`).

    Returns
    -------
    tuple of Path
        ``(report.html, report.md)``.

    Raises
    ------
    OSError
        If the files cannot be written (the previous ones are then unchanged).
    """
    run_dir = Path(run_dir)
    rep = collect(run_dir)
    html_path, md_path = run_dir / "report.html", run_dir / "report.md"
    md, html = to_markdown(rep), to_html(rep)  # both rendered before either file is replaced
    write_atomic(md_path, md)
    write_atomic(html_path, html)
    return html_path, md_path
