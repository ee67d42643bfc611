"""Check each image file once: a persistent cache of :func:`~helpers.pipeline.images.scan_images` results.

Fully decoding a file to learn whether it is usable costs about 3.5 ms of CPU
per image here; a run of the workbook indexes its data folder in every
notebook and every DDP rank, so without a cache a folder of a million images
would be decoded again and again. :func:`cached_scan` keeps the outcome of
each file's check (usable, or the reason it is not) in one SQLite file per
data folder, keyed by the file's path relative to the folder, its size in
bytes and its modification time in nanoseconds. The next notebook or run
re-checks only the files that are new or whose size or modification time
changed (an incremental re-index); files that left the folder drop out of
the cache on the next update.

A file whose bytes change without changing its size or modification time
(possible only by deliberately resetting the time) keeps its old outcome; a
file that then fails to decode during training is still reported and skipped
by the pipeline (:mod:`helpers.pipeline.guarded`), as for any bad file.

The cache is safe to share between processes: an advisory ``fcntl`` lock on
a ``.lock`` file beside the database makes one process check the files while
the others (the DDP ranks of one job, two notebooks) wait and then reuse its
results. Deleting the cache folder is always safe: it is rebuilt on use.

Where the cache lives: ``$WORKBOOK_CACHE_DIR/index`` when that variable is
set, else ``platformdirs.user_cache_dir("training-perf-workbook")/index``
(``~/.cache/training-perf-workbook/index`` on Linux); when that user folder
cannot be written (a read-only or missing home), a folder in the system's
temporary directory instead, said once per process (:func:`cache_root`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import sqlite3
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from helpers.errors import OutputDirError, ParameterError
from helpers.fsutil import ensure_writable_dir
from helpers.params import headless
from helpers.pipeline.images import BadFile, ScanReport, _refuse_truncated_loading, check_image_file

logger = logging.getLogger(__name__)

CACHE_DIR_ENV = "WORKBOOK_CACHE_DIR"
"""Environment variable that moves the cache folder (e.g. to a fast local disk)."""

SCHEMA_VERSION = 1
"""Bumped whenever the meaning of a cached outcome changes, so old caches are rebuilt, not misread."""

PROGRESS_MIN_FILES = 2000
"""Files to check from which a progress bar is shown: about 5 s of decoding on 2 cores (the embedded 512 photos
are checked silently)."""


#: The user cache folder probed, per path: (the folder used, why it is not the usual one or None). Probed once a
#: process (a write probe, :func:`helpers.fsutil.ensure_writable_dir`).
_LOCATED: dict[str, tuple[Path, str | None]] = {}
#: The fallback notes already said in this process (logged by :func:`cache_root`, or returned by
#: :func:`cache_fallback_note` for a caller to print).
_SAID: set[str] = set()
#: Cache folders already said to be unusable (the "checking without a cache" warning is given once each).
_UNUSABLE_SAID: set[str] = set()


def _fallback_dir() -> Path:
    uid = os.getuid() if hasattr(os, "getuid") else os.environ.get("USERNAME", "user")
    return Path(tempfile.gettempdir()) / f"training-perf-workbook-cache-{uid}"


def _locate() -> tuple[Path, str | None]:
    env = os.environ.get(CACHE_DIR_ENV, "").strip()
    if env:  # the user's choice: used as it is (an unusable one is said where it fails, once)
        return Path(env).expanduser(), None
    import platformdirs

    usual = Path(platformdirs.user_cache_dir("training-perf-workbook"))
    if str(usual) not in _LOCATED:
        try:
            ensure_writable_dir(usual, what="the workbook's cache folder", hint="")
            _LOCATED[str(usual)] = (usual, None)
        except OutputDirError as exc:  # a read-only or missing home, a path through a file
            fallback = _fallback_dir()
            _LOCATED[str(usual)] = (fallback, (
                f"{str(exc).rstrip('; ')}: the image check and decoded-image caches go to {fallback} instead "
                f"(set {CACHE_DIR_ENV} to choose their folder)"))
    return _LOCATED[str(usual)]


def cache_root() -> Path:
    """The workbook's cache folder.

    Returns
    -------
    pathlib.Path
        ``$WORKBOOK_CACHE_DIR`` when set and not empty; else
        ``platformdirs.user_cache_dir("training-perf-workbook")`` when it can be
        created and written (probed once per process, which creates it); else
        ``<temporary directory>/training-perf-workbook-cache-<uid>``, and a
        warning, logged once per process, says which folder could not be
        written, why, and where the caches go instead.
    """
    root, note = _locate()
    if note is not None and note not in _SAID:
        _SAID.add(note)
        logger.warning("%s", note)
    return root


def cache_fallback_note() -> str | None:
    """Why the caches are not in the user's cache folder, and where they go, if not yet said in this process.

    For a caller that prints it (the runner's console): once returned, :func:`cache_root` does not log it again.

    Returns
    -------
    str or None
        The sentence, or None when the usual folder (or ``$WORKBOOK_CACHE_DIR``) is used, or it was said.
    """
    _, note = _locate()
    if note is None or note in _SAID:
        return None
    _SAID.add(note)
    return note


def index_cache_dir() -> Path:
    """Folder that holds the per-data-folder caches.

    Returns
    -------
    pathlib.Path
        ``<cache_root()>/index``: ``$WORKBOOK_CACHE_DIR/index`` when the variable is set and not empty,
        else ``platformdirs.user_cache_dir("training-perf-workbook")/index``. Not created here.
    """
    return cache_root() / "index"


def cache_path(root: str | os.PathLike) -> Path:
    """The SQLite file that caches the checks of the data folder ``root``.

    The name is a hash of the folder's resolved absolute path, so two folders
    never share a cache and the same folder always finds its own.
    """
    key = hashlib.sha256(str(Path(root).resolve()).encode("utf-8")).hexdigest()[:24]
    return index_cache_dir() / f"{key}.sqlite"


@dataclass(frozen=True)
class ScanStats:
    """What one :func:`cached_scan` did.

    Attributes
    ----------
    files : int
        Files asked about.
    cached : int
        Of those, answered from the cache.
    checked : int
        Of those, decoded now (new or changed files); ``cached + checked == files``.
    seconds : float
        Wall time of the whole call, in seconds (listing not included).
    cache_file : pathlib.Path or None
        The cache used; None when caching was off or the cache could not be written.
    """

    files: int
    cached: int
    checked: int
    seconds: float
    cache_file: Path | None


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``path`` (created when missing) for the block."""
    with open(path, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _open_db(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, timeout=60.0)
    db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
    row = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
    if row is None or row[0] != str(SCHEMA_VERSION):
        db.execute("DROP TABLE IF EXISTS files")
        db.execute("INSERT OR REPLACE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
    db.execute("CREATE TABLE IF NOT EXISTS files (rel TEXT PRIMARY KEY, size INTEGER NOT NULL, "
               "mtime_ns INTEGER NOT NULL, reason TEXT)")
    db.commit()
    return db


def _stat_key(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return int(st.st_size), int(st.st_mtime_ns)


def _check_all(paths: Sequence[Path], max_workers: int, progress: bool) -> list[BadFile | None]:
    if not paths:
        return []
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(paths), desc="checking images", unit="img", file=sys.stderr, mininterval=1.0)
    try:
        if max_workers == 1 or len(paths) < 2:
            out = []
            for p in paths:
                out.append(check_image_file(p))
                if bar is not None:
                    bar.update(1)
            return out
        with ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="cached_scan") as pool:
            out = []
            for result in pool.map(check_image_file, paths, chunksize=16):
                out.append(result)
                if bar is not None:
                    bar.update(1)
            return out
    finally:
        if bar is not None:
            bar.close()


def cached_scan(root: str | os.PathLike, paths: Sequence[str | os.PathLike], *, use_cache: bool = True,
                max_workers: int | None = None, progress: bool | None = None) -> tuple[ScanReport, ScanStats]:
    """Sort image files into usable and bad, decoding only those the cache does not know.

    Each file is checked as :func:`~helpers.pipeline.images.scan_images` does
    (``verify()`` and then a full reference decode); the outcome is stored per
    file under ``(path relative to root, size, mtime_ns)`` in
    :func:`cache_path` ``(root)``. One warning line is logged per bad file
    that is checked now; bad files answered from the cache are counted in one
    summary line instead.

    Parameters
    ----------
    root : str or os.PathLike
        The data folder; every path must lie inside it.
    paths : sequence of str or os.PathLike
        The files to sort, in the order wanted back.
    use_cache : bool, default True
        False decodes every file and leaves the cache untouched.
    max_workers : int, optional
        Decoding threads (Pillow releases the GIL while decoding). Default
        ``min(8, os.cpu_count())``.
    progress : bool, optional
        Show a progress bar (tqdm, on stderr) while decoding. Default: when at
        least :data:`PROGRESS_MIN_FILES` files must be decoded and the session
        is not headless (:func:`helpers.params.headless`: the runner, the tests, CI).

    Returns
    -------
    (ScanReport, ScanStats)
        ``good`` and ``bad`` in the order given, and what came from the cache.

    Raises
    ------
    ParameterError
        If ``max_workers`` is not a positive integer, or a path lies outside ``root``.
    DataError
        If ``PIL.ImageFile.LOAD_TRUNCATED_IMAGES`` has been set to True.

    Notes
    -----
    When the cache folder cannot be written (read-only home, full disk), the
    files are checked without a cache and a warning says why; nothing fails.
    """
    root_p = Path(root).resolve()
    files = [Path(p) for p in paths]
    rels = []
    for f in files:
        try:
            rels.append(f.relative_to(root_p).as_posix())  # listings are made under the resolved root
        except ValueError:
            try:
                rels.append(f.resolve().relative_to(root_p).as_posix())
            except ValueError:
                raise ParameterError(f"{f} is not inside the data folder {root_p}") from None
    reasons, stats = scan_relative(root_p, rels, use_cache=use_cache, max_workers=max_workers, progress=progress)
    good = tuple(f for f, r in zip(files, reasons) if r is None)
    bad = tuple(BadFile(f, r) for f, r in zip(files, reasons) if r is not None)
    return ScanReport(good=good, bad=bad), stats


def scan_relative(root: Path, rels: Sequence[str], *, use_cache: bool = True, max_workers: int | None = None,
                  progress: bool | None = None) -> tuple[list[str | None], ScanStats]:
    """:func:`cached_scan` for paths given relative to ``root`` (POSIX strings, as the dataset index keeps them).

    No ``pathlib`` object is made per file, so that answering 20,000 files
    from the cache takes a fraction of a second.

    Parameters
    ----------
    root : pathlib.Path
        The data folder, resolved (absolute, no symlinks).
    rels : sequence of str
        Files relative to ``root``, ``/`` separated.
    use_cache, max_workers, progress
        As :func:`cached_scan`.

    Returns
    -------
    (list of str or None, ScanStats)
        Per file, None when it is usable, else the reason it is not.

    Raises
    ------
    ParameterError, DataError
        As :func:`cached_scan`.
    """
    t0 = time.perf_counter()
    _refuse_truncated_loading()
    if max_workers is None:
        max_workers = min(8, os.cpu_count() or 1)
    if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
        raise ParameterError(f"max_workers must be a positive integer, got {max_workers!r}; pass e.g. 4 or None")
    base = str(root)
    full = [os.path.join(base, r) for r in rels]
    keys = [_stat_key(f) for f in full]

    db_file: Path | None = cache_path(root) if use_cache else None
    reasons: list[str | None] = [None] * len(rels)
    todo = list(range(len(rels)))
    n_cached_bad = 0
    with contextlib.ExitStack() as stack:
        db = None
        if db_file is not None:
            try:
                db_file.parent.mkdir(parents=True, exist_ok=True)
                stack.enter_context(locked(db_file.with_suffix(".lock")))
                db = _open_db(db_file)
                stack.callback(db.close)
            except (OSError, sqlite3.Error) as exc:
                if str(db_file.parent) not in _UNUSABLE_SAID:  # once per folder, not once per call
                    _UNUSABLE_SAID.add(str(db_file.parent))
                    logger.warning("image check cache %s unusable (%s); checking without a cache", db_file, exc)
                db_file, db = None, None
        if db is not None:
            known = {rel: (size, mtime, reason) for rel, size, mtime, reason in
                     db.execute("SELECT rel, size, mtime_ns, reason FROM files")}
            todo = []
            for i, (rel, key) in enumerate(zip(rels, keys)):
                hit = known.get(rel)
                if key is not None and hit is not None and (hit[0], hit[1]) == key:
                    if hit[2] is not None:
                        reasons[i] = hit[2]
                        n_cached_bad += 1
                else:
                    todo.append(i)
        show = progress if progress is not None else (len(todo) >= PROGRESS_MIN_FILES and not headless())
        checked = _check_all([Path(full[i]) for i in todo], max_workers, show)
        for i, result in zip(todo, checked):
            if result is not None:
                reasons[i] = result.reason
                logger.warning("bad image: %s: %s", full[i], result.reason)
        if db is not None and todo:
            rows = []
            for i in todo:
                key = _stat_key(full[i]) if keys[i] is None else keys[i]
                if key is not None:  # a vanished file: nothing to remember
                    rows.append((rels[i], key[0], key[1], reasons[i]))
            try:
                db.executemany("INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?)", rows)
                db.commit()
            except sqlite3.Error as exc:  # e.g. disk full: the answer is still right, only not remembered
                logger.warning("could not update the image check cache %s (%s)", db_file, exc)
    if n_cached_bad:
        logger.warning("%s: %d bad file(s) known from the image check cache", root, n_cached_bad)
    stats = ScanStats(files=len(rels), cached=len(rels) - len(todo), checked=len(todo),
                      seconds=time.perf_counter() - t0, cache_file=db_file)
    return reasons, stats


def prune_cache(root: str | os.PathLike, keep: Sequence[str]) -> int:
    """Forget cached files of ``root`` that are not in ``keep`` (relative POSIX paths); return how many.

    Called after a full listing of the folder, so files that were deleted or
    renamed do not keep the cache growing.
    """
    db_file = cache_path(root)
    if not db_file.is_file():
        return 0
    keep_set = set(keep)
    try:
        with locked(db_file.with_suffix(".lock")):
            db = _open_db(db_file)
            try:
                gone = [(rel,) for (rel,) in db.execute("SELECT rel FROM files") if rel not in keep_set]
                if gone:
                    db.executemany("DELETE FROM files WHERE rel = ?", gone)
                    db.commit()
                return len(gone)
            finally:
                db.close()
    except (OSError, sqlite3.Error) as exc:
        logger.warning("could not prune the image check cache %s (%s)", db_file, exc)
        return 0
