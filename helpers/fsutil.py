"""File-system facts shared by every layer: where the checkout is (if any), writable output folders, and files
written whole without ever truncating the previous copy (:func:`write_atomic`)."""

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


#: Suffix of the temporary file :func:`write_atomic` writes beside its target (removed on any failure).
TMP_SUFFIX = ".tmp"


def write_atomic(path: str | os.PathLike, data: str | bytes, *, encoding: str = "utf-8") -> Path:
    """Write a whole file through a temporary file in the same folder, then rename it over ``path``.

    A reader (or a crash, or a full disk) sees either the previous file or the
    new one, never a truncated mix: the data goes to a hidden temporary file
    ``.<name>.<pid>.<random>.tmp`` beside ``path``, is flushed to the disk
    (``fsync``) and renamed onto ``path`` (atomic on POSIX within one file
    system). On any failure, ENOSPC included, the temporary file is removed and
    the previous ``path`` is left as it was. The new file gets the usual
    permissions (``0o666`` less the umask), as ``open(path, "w")`` would.

    Parameters
    ----------
    path : path-like
        The file to write; its folder must exist.
    data : str or bytes
        The whole content; ``str`` is encoded with ``encoding``.
    encoding : str, default "utf-8"
        Encoding of ``str`` data.

    Returns
    -------
    pathlib.Path
        ``path``.

    Raises
    ------
    OSError
        If the temporary file cannot be written or renamed (e.g. ``errno.ENOSPC``
        on a full disk); ``path`` is unchanged and no temporary file is left.
    """
    path = Path(path)
    blob = data.encode(encoding) if isinstance(data, str) else bytes(data)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}{TMP_SUFFIX}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
        with os.fdopen(fd, "wb") as fh:
            fh.write(blob)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:  # never created, or already renamed
            pass
        raise
    return path
