"""Exceptions raised by the workbook helpers.

Every error says what was wrong, the value seen, and what to do about it.
They subclass the built-in exception a caller would naturally catch
(``ValueError`` for bad input, ``RuntimeError`` for an unusable device).
"""

from __future__ import annotations

import re as _re
import traceback as _traceback
from pathlib import Path as _Path

from helpers.stuck import is_users


class WorkbookError(Exception):
    """Base class of every error the helpers raise on purpose."""


class ParameterError(WorkbookError, ValueError):
    """A notebook or command parameter is unknown, of the wrong type or out of range."""


class DeviceUnavailableError(WorkbookError, RuntimeError):
    """The requested device kind cannot be used here; the message says why and how to fix it."""


class DataError(WorkbookError, ValueError):
    """A dataset folder is missing, empty, or holds no decodable image."""


class OutputDirError(WorkbookError, OSError):
    """An output folder cannot be created or written."""


def user_frame(frames) -> str:
    """The innermost frame of the user's own code in a traceback or stack, as ``"file.py:42 in func"``.

    Parameters
    ----------
    frames : traceback, list of traceback.FrameSummary, or traceback.StackSummary
        A traceback object (``exc.__traceback__``) or extracted frames, outermost first.

    Returns
    -------
    str
        The innermost frame of the user's code (:func:`helpers.stuck.is_users`: outside this package, the
        standard library, installed packages and notebook cells; the file named by its base name); failing
        that, the innermost frame of all; "" when there are no frames.
    """
    if frames is None:
        return ""
    if not isinstance(frames, list):
        frames = list(_traceback.extract_tb(frames)) if hasattr(frames, "tb_frame") else list(frames)
    if not frames:
        return ""
    ours = [f for f in frames if is_users(f.filename)]
    f = (ours or frames)[-1]
    return f"{_Path(f.filename).name}:{f.lineno} in {f.name}"


class SampleError(DataError):
    """The user's dataset raised while making one sample: which index, where in their code, and the cause.

    Raised by :class:`helpers.jobs.base.PerItemBatches` in place of the exception of ``dataset[i]`` (which stays
    its ``__cause__``). A DataLoader worker re-raises it in the main process by calling the class with one
    formatted-traceback string (torch's ``ExceptionWrapper``); the constructor then recovers the one-line
    message, the index and the place from that text, so the error reads the same from a worker.

    Parameters
    ----------
    message : str
        ``"dataset[37] raised ValueError: ... (at myjob.py:42 in __getitem__)"``, or a worker's traceback text
        that holds such a line.
    index : int, optional
        The sample's index (recovered from ``message`` when not given).
    where : str, optional
        The user's innermost frame, ``"file.py:line in func"`` (recovered from ``message`` when not given).

    Attributes
    ----------
    index : int or None
    where : str
    """

    _LINE = _re.compile(r"(dataset\[(\d+)\] raised .*?)(?: \(at ([^()]*)\))?$", _re.M)

    def __init__(self, message: str, *, index: int | None = None, where: str | None = None) -> None:
        text = str(message)
        worker = _re.search(r"in DataLoader worker process (\d+)", text)
        found = None
        for m in self._LINE.finditer(text):
            found = m  # the last such line is the innermost error
        if found is not None and (index is None or "\n" in text):
            index = int(found.group(2)) if index is None else index
            where = found.group(3) if where is None else where
            text = found.group(0).strip()
            if text.startswith("helpers.errors.SampleError: "):
                text = text[len("helpers.errors.SampleError: "):]
            if worker is not None:
                text += f" (in DataLoader worker process {worker.group(1)})"
        super().__init__(text)
        self.index = index
        self.where = where or ""

    @classmethod
    def from_exception(cls, index: int, exc: BaseException) -> "SampleError":
        """The error for ``dataset[index]`` having raised ``exc`` (its user frame from ``exc``'s traceback)."""
        where = user_frame(exc.__traceback__)
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        cause = f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
        at = f" (at {where})" if where else ""
        return cls(f"dataset[{int(index)}] raised {cause}{at}", index=int(index), where=where)
