"""Warnings a notebook shows on purpose, shown as intended output rather than as red error boxes.

The bad-image demo (notebooks 02 and 03) feeds the pipeline a truncated JPEG so that the learner sees the
pipeline report it and go on. The pipeline reports through :mod:`logging` (WARNING), which Jupyter prints on
stderr: JupyterLab draws stderr on a red background, so the one message the cell exists to show reads as a
failure. ``with expected_warnings("why this is expected"):`` around such a cell's work routes the log records
and :mod:`warnings` raised inside it to stdout instead, each line prefixed ``expected:``, after one line that
says why they are expected. Records are still emitted (a test or a handler of the user's sees them); only
the stderr handlers of the root logger skip them while the block runs. Anything not a warning (an error, a
traceback) is left alone.
"""

from __future__ import annotations

import logging
import sys
import warnings
from contextlib import contextmanager
from typing import Iterator


class _Skip(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.WARNING  # errors still reach stderr


class _ToStdout(logging.Handler):
    def __init__(self, lines: list[str]) -> None:
        super().__init__(level=logging.WARNING)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno == logging.WARNING:
            line = f"expected: {record.levelname} {record.name}: {record.getMessage()}"
            self.lines.append(line)
            print(line, file=sys.stdout, flush=True)


@contextmanager
def expected_warnings(why: str) -> Iterator[list[str]]:
    """Show the WARNING log records and :mod:`warnings` raised inside the block on stdout, as intended output.

    Parameters
    ----------
    why : str
        One sentence printed first, e.g. "the truncated JPEG is reported and replaced in its batch".

    Yields
    ------
    list of str
        The lines shown (``"expected: WARNING <logger>: <message>"``), filled as they happen.
    """
    print(f"(expected warnings below: {why})", flush=True)
    lines: list[str] = []
    root = logging.getLogger()
    handler, skip = _ToStdout(lines), _Skip()
    stderr_handlers = [h for h in root.handlers
                       if isinstance(h, logging.StreamHandler) and getattr(h, "stream", None) in (sys.stderr,
                                                                                                   sys.__stderr__)]
    for h in stderr_handlers:
        h.addFilter(skip)
    root.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield lines
        for w in caught:
            line = f"expected: {w.category.__name__}: {w.message}"
            lines.append(line)
            print(line, flush=True)
    finally:
        root.removeHandler(handler)
        for h in stderr_handlers:
            h.removeFilter(skip)
