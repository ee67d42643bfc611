"""Warnings a notebook shows on purpose, shown as intended output rather than as red error boxes.

The bad-image demo (notebooks 02 and 03) feeds the pipeline a truncated JPEG so that the learner sees the
pipeline report it and go on. The pipeline reports through :mod:`logging` (WARNING), which Jupyter prints on
stderr: JupyterLab draws stderr on a red background, so the one message the cell exists to show reads as a
failure. ``with expected_warnings("why this is expected"):`` around such a cell's work routes the log records
and :mod:`warnings` raised inside it to stdout instead, each line prefixed ``expected:``, after one line that
says why they are expected (printed only when a warning comes). Records are still emitted (a test or a handler of the user's sees them); only
the stderr handlers of the root logger skip them while the block runs. Anything not a warning (an error, a
traceback) is left alone.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings
from contextlib import contextmanager
from typing import Iterator


def _expected(record: logging.LogRecord, match: "re.Pattern[str] | None") -> bool:
    return record.levelno == logging.WARNING and (match is None or bool(match.search(record.getMessage())))


class _Skip(logging.Filter):
    def __init__(self, match: "re.Pattern[str] | None") -> None:
        super().__init__()
        self.match = match

    def filter(self, record: logging.LogRecord) -> bool:
        return not _expected(record, self.match)  # errors and unexpected warnings still reach stderr


class _ToStdout(logging.Handler):
    def __init__(self, lines: list[str], why: str, match: "re.Pattern[str] | None") -> None:
        super().__init__(level=logging.WARNING)
        self.lines, self.why, self.match = lines, why, match
        self.pid = os.getpid()  # a forked DataLoader worker inherits the handler: it prints no second header

    def show(self, line: str) -> None:
        if not self.lines and os.getpid() == self.pid:  # the reason once, before the first warning (none: nothing)
            print(f"(expected warnings below: {self.why})", file=sys.stdout, flush=True)
        self.lines.append(line)
        print(line, file=sys.stdout, flush=True)

    def emit(self, record: logging.LogRecord) -> None:
        if _expected(record, self.match):
            self.show(f"expected: {record.levelname} {record.name}: {record.getMessage()}")


@contextmanager
def expected_warnings(why: str, *, match: str | None = None) -> Iterator[list[str]]:
    """Show the WARNING log records and :mod:`warnings` raised inside the block on stdout, as intended output.

    Parameters
    ----------
    why : str
        One sentence printed before the first warning, e.g. "the truncated JPEG is reported and replaced in its
        batch"; nothing is printed when no warning comes.
    match : str, optional
        A regular expression: only warnings whose message it finds are expected; the others keep going to
        stderr as usual. None: every warning in the block is expected.

    Yields
    ------
    list of str
        The lines shown (``"expected: WARNING <logger>: <message>"``), filled as they happen.
    """
    lines: list[str] = []
    root = logging.getLogger()
    pattern = re.compile(match) if match else None
    handler, skip = _ToStdout(lines, why, pattern), _Skip(pattern)
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
            if pattern is None or pattern.search(str(w.message)):
                handler.show(f"expected: {w.category.__name__}: {w.message}")
            else:  # not the one this block expects: shown as Python shows warnings
                warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    finally:
        root.removeHandler(handler)
        for h in stderr_handlers:
            h.removeFilter(skip)
