"""File-system facts shared by every layer: where the checkout is (if any), and writable output folders."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from helpers.errors import OutputDirError


def repo_root() -> Path:
    """Return the folder that holds the ``helpers`` package (the repository root in a checkout)."""
    return Path(__file__).resolve().parents[1]


def in_checkout() -> bool:
    """True when the package runs from a checkout of the repository (``notebooks/`` and ``pyproject.toml`` beside
    it); False for an installed wheel, which must write nothing beside its own files."""
    root = repo_root()
    return (root / "notebooks").is_dir() and (root / "pyproject.toml").is_file()


def ensure_writable_dir(path: str | os.PathLike, *, what: str = "output folder",
                        hint: str = "choose a folder you can write to") -> Path:
    """Create a folder if needed and prove it is writable.

    A probe file is written and removed, because permission bits do not tell
    the whole story (read-only mounts, quotas, root squashing, a path that
    runs through a regular file).

    Parameters
    ----------
    path : path-like
        The folder.
    what : str
        How the error message names the folder (e.g. "run folder").
    hint : str
        What the error message tells the user to do.

    Returns
    -------
    pathlib.Path
        The absolute, resolved folder.

    Raises
    ------
    OutputDirError
        If the folder cannot be created or written; the message names the
        path, the operating-system error and ``hint``.
    """
    folder = Path(path).expanduser()
    if folder.exists() and not folder.is_dir():
        raise OutputDirError(f"{what} {str(folder)!r} exists but is not a folder; {hint}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputDirError(
            f"cannot create {what} {str(folder)!r}: {exc.strerror or exc} ({type(exc).__name__}); {hint}"
        ) from exc
    probe = folder / f".write_probe_{os.getpid()}_{uuid.uuid4().hex}"
    try:
        probe.write_bytes(b"probe")
        probe.unlink()
    except OSError as exc:
        raise OutputDirError(
            f"{what} {str(folder)!r} is not writable: {exc.strerror or exc} ({type(exc).__name__}); {hint}"
        ) from exc
    return folder.resolve()
