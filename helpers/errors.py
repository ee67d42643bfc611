"""Exceptions raised by the workbook helpers.

Every error says what was wrong, the value seen, and what to do about it.
They subclass the built-in exception a caller would naturally catch
(``ValueError`` for bad input, ``RuntimeError`` for an unusable device).
"""

from __future__ import annotations


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
