"""Where a hung process is stuck: every thread's stack dumped before it is stopped, and the user's own frame named.

A command or a notebook cell that runs past its limit is stopped; before that, the stacks of the stuck
process are written out (:mod:`faulthandler`) and the message names the innermost frame of the *user's*
code, e.g. ``stuck in Squares.__getitem__(37) at myjob.py:42``, rather than only advising a larger limit.

- :class:`Watchdog` runs in the process that may hang (``diagnose``; a notebook's kernel, armed by
  :func:`arm_cell_watchdog` around every cell). After its limit, a thread of its own reads the live stacks
  (:func:`sys._current_frames`: the frames' arguments too, such as the index asked of a dataset), dumps every
  thread's stack with :func:`faulthandler.dump_traceback` and calls back with the sentence. A thread that waits
  for a DataLoader worker's batch is said to, naming the worker, its pid and the sample index it is stuck in
  where its workers record them (:func:`dataloader_workers`; :mod:`helpers.pipeline.worker_progress`). A C-level
  :func:`faulthandler.dump_traceback_later` backs it up for a thread that never lets go of the interpreter.
- :func:`parse_faulthandler` and :func:`where_from_dump` read such a dump back (the runner, from the kernel's
  file, when the kernel left no sentence of its own).

A frame is the user's when its file is neither the workbook's (``helpers/``), nor the standard library's or an
installed package's, nor a notebook cell's (IPython's ``ipykernel_*`` files). Part of the foundation: imports
only the standard library.
"""

from __future__ import annotations

import faulthandler
import json
import os
import re
import sys
import sysconfig
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

__all__ = ["CELL_TIMEOUT_ENV", "STUCK_DIR_ENV", "FrameInfo", "Watchdog", "arm_cell_watchdog", "cell_files",
           "dataloader_workers", "describe", "frames_of", "parse_faulthandler", "user_frame", "where_from_dump",
           "read_stuck"]

#: Environment variables through which the runner tells a notebook's kernel its per-cell limit and where to dump.
CELL_TIMEOUT_ENV = "WORKBOOK_CELL_TIMEOUT_S"
STUCK_DIR_ENV = "WORKBOOK_STUCK_DIR"
STUCK_NAME_ENV = "WORKBOOK_STUCK_NAME"

_HELPERS = str(Path(__file__).resolve().parent) + os.sep


def _library_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    return tuple(str(Path(d).resolve()) + os.sep for d in dirs if d)


_LIBRARIES = _library_dirs()


@dataclass(frozen=True)
class FrameInfo:
    """One frame of a stack: ``file``, ``line``, ``func`` and, from a live frame, ``call``
    (``"Squares.__getitem__(37)"``: the function with its arguments' values)."""

    file: str
    line: int
    func: str
    call: str | None = None

    def text(self) -> str:
        """``"Squares.__getitem__(37) at myjob.py:42"`` (the function's name where the arguments are unknown)."""
        return f"{self.call or self.func} at {Path(self.file).name}:{self.line}"


def is_users(filename: str) -> bool:
    """Whether a frame's file is the user's own code (not the workbook's, a library's, or a notebook cell's)."""
    if not filename or filename.startswith("<") or "ipykernel_" in filename:
        return False
    try:
        path = str(Path(filename).resolve())
    except (OSError, ValueError):
        path = filename
    return not path.startswith(_HELPERS) and not any(path.startswith(d) for d in _LIBRARIES)


def _call_text(frame) -> str:
    code = frame.f_code
    name = getattr(code, "co_qualname", code.co_name)
    names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    values = []
    for n in names:
        if n in ("self", "cls") or n not in frame.f_locals:
            continue
        try:
            text = repr(frame.f_locals[n])
        except Exception:  # a repr that fails is no reason to lose the sentence
            text = "?"
        values.append(text if len(text) <= 40 else text[:37] + "...")
    return f"{name.replace('.<locals>', '')}({', '.join(values)})"


def frames_of(frame) -> list[FrameInfo]:
    """A live frame's stack, innermost first, each with its call (its arguments' values)."""
    out = []
    while frame is not None:
        out.append(FrameInfo(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name, _call_text(frame)))
        frame = frame.f_back
    return out


def user_frame(frames: Sequence[FrameInfo]) -> FrameInfo | None:
    """The innermost frame of the user's code in a stack (innermost first), or None."""
    return next((f for f in frames if is_users(f.file)), None)


_WAITS = ("_get_data", "_try_get_data", "_next_data", "get", "wait", "poll", "select")


def describe(stacks: Iterable[Sequence[FrameInfo]], *, workers: str | None = None) -> str:
    """``"stuck in Squares.__getitem__(37) at myjob.py:42"``: the user's innermost frame of the first stack that has
    one, unless the first (the stuck thread's) has none and waits on a DataLoader's workers: that is said, with the
    worker and the sample where known; else the innermost frame of the first stack.

    Parameters
    ----------
    stacks : iterable of sequence of FrameInfo
        One per thread, innermost frame first; the stuck thread's first.
    workers : str, optional
        Where the first stack waits on a DataLoader's workers: which worker is stuck in which sample
        (:func:`dataloader_workers`); None: the sentence says that it is not known.

    Returns
    -------
    str
    """
    stacks = [list(s) for s in stacks if s]
    for i, stack in enumerate(stacks):
        mine = user_frame(stack)
        if mine is not None:
            return f"stuck in {mine.text()}"
        if i == 0 and any("dataloader" in f.file.lower() and f.func in _WAITS for f in stack):
            # the stuck thread waits for a worker's batch: that is where it is stuck, whatever other threads run
            which = workers or ("which worker is stuck and in which sample is not known (its loader's workers do not "
                                "record what they load: a loader built by the workbook's make_loader does)")
            return (f"stuck waiting for a DataLoader worker's batch (at {stack[0].text()}): {which}; num_workers=0 "
                    "runs the dataset in the main process, where the stuck frame can be named")
    if not stacks:
        return "stuck where no stack could be read"
    return f"stuck in {stacks[0][0].text()} (no frame of your code on the stack)"


def dataloader_workers(frame) -> str | None:
    """Which DataLoader worker a live stack waits for and in which sample it is stuck, or None.

    Walks the stack from ``frame`` outwards to a frame whose ``self`` is a DataLoader iterator whose
    ``_worker_init_fn`` has a ``stuck_sentence`` method (:class:`helpers.pipeline.worker_progress.WorkerProgress`,
    found by that name: this module imports only the standard library), and returns its sentence."""
    while frame is not None:
        try:
            owner = frame.f_locals.get("self")
            say = getattr(getattr(owner, "_worker_init_fn", None), "stuck_sentence", None)
            if callable(say):
                return str(say(owner))
        except Exception:  # noqa: BLE001  a stack that cannot be read: the generic sentence stands
            return None
        frame = frame.f_back
    return None


_THREAD_RE = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)", re.I)
_FRAME_RE = re.compile(r'^\s*File "(.*)", line (\d+) in (\S+)')


def parse_faulthandler(text: str) -> list[list[FrameInfo]]:
    """The stacks of a :mod:`faulthandler` dump, one per thread, innermost first (the dump's own order)."""
    stacks: list[list[FrameInfo]] = []
    current: list[FrameInfo] | None = None
    for line in text.splitlines():
        if _THREAD_RE.match(line) or line.startswith("Stack (most recent call first)"):
            current = []
            stacks.append(current)
            continue
        m = _FRAME_RE.match(line)
        if m:
            if current is None:
                current = []
                stacks.append(current)
            current.append(FrameInfo(m.group(1), int(m.group(2)), m.group(3)))
    return [s for s in stacks if s]


def where_from_dump(text: str) -> str | None:
    """:func:`describe` of a faulthandler text; None for no stack.

    A dump does not say which thread was the stuck one: the stack whose user frame is nearest its innermost
    frame is taken (a thread blocked in the user's code, rather than one waiting on it), the latest dump first
    (a file may hold several)."""
    stacks = list(reversed(parse_faulthandler(text)))

    def depth(stack: list[FrameInfo]) -> int:
        return next((i for i, f in enumerate(stack) if is_users(f.file)), len(stack) + 1_000)

    return describe(sorted(stacks, key=depth)) if stacks else None


class Watchdog:
    """After ``seconds``, dump every thread's stack and call back with where the process is stuck.

    Parameters
    ----------
    seconds : float
        The limit (> 0).
    on_timeout : callable
        ``on_timeout(sentence, stacks)``: :func:`describe`'s sentence and the stacks read (innermost first),
        called from the watchdog's thread after the dump. It may end the process (``os._exit``).
    dump : file object with ``fileno()``, optional
        Where the stacks go (default ``sys.stderr``); kept open by the caller while armed.
    backstop_s : float or None
        Seconds after ``seconds`` at which :func:`faulthandler.dump_traceback_later` dumps again from C (for a
        thread that holds the interpreter, where the watchdog's thread cannot run); ``backstop_exit`` ends the
        process then. None: no backstop.

    Raises
    ------
    ValueError
        If ``seconds`` is not a positive number.
    """

    def __init__(self, seconds: float, on_timeout: Callable[[str, list], Any], *, dump: Any = None,
                 backstop_s: float | None = 5.0, backstop_exit: bool = False) -> None:
        if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not seconds > 0:
            raise ValueError(f"a watchdog needs a positive number of seconds, got {seconds!r}")
        self.seconds, self.on_timeout, self.dump = float(seconds), on_timeout, dump
        self.backstop_s, self.backstop_exit = backstop_s, backstop_exit
        self._cancel = threading.Event()
        self._thread: threading.Thread | None = None
        self.fired = False

    def _file(self):
        return self.dump if self.dump is not None else sys.stderr

    def start(self) -> "Watchdog":
        """Arm it (a daemon thread); returns self."""
        watched = threading.current_thread().ident
        self._thread = threading.Thread(target=self._wait, args=(watched,), name="workbook-watchdog", daemon=True)
        self._thread.start()
        if self.backstop_s is not None:
            try:
                faulthandler.dump_traceback_later(self.seconds + self.backstop_s, exit=self.backstop_exit,
                                                  file=self._file())
            except (ValueError, OSError, AttributeError, RuntimeError):  # no real file descriptor: no backstop
                pass
        return self

    def cancel(self) -> None:
        """Disarm it (the work finished in time)."""
        self._cancel.set()
        if self.backstop_s is not None:
            faulthandler.cancel_dump_traceback_later()

    def _wait(self, watched: int | None) -> None:
        if self._cancel.wait(self.seconds):
            return
        self.fired = True
        frames = sys._current_frames()
        me = threading.get_ident()
        order = [watched] + [t for t in frames if t not in (watched, me)]
        stacks = [frames_of(frames[t]) for t in order if t in frames]
        workers = dataloader_workers(frames.get(order[0])) if order and order[0] in frames else None
        out = self._file()
        try:
            out.flush()
            faulthandler.dump_traceback(file=out, all_threads=True)
            out.flush()
        except (ValueError, OSError, AttributeError, RuntimeError):
            pass
        self.on_timeout(describe(stacks, workers=workers), stacks)


# --------------------------------------------------------------------------- a notebook's kernel, cell by cell


def cell_files(folder: Path, name: str) -> tuple[Path, Path]:
    """(stacks dump, stuck sentence) files of notebook ``name`` in ``folder`` (the run's ``logs/``)."""
    return Path(folder) / f"{name}.stacks.txt", Path(folder) / f"{name}.stuck.json"


def read_stuck(folder: Path, name: str) -> str | None:
    """Where the kernel of notebook ``name`` was stuck at its cell's limit: its own sentence, else read from its
    stacks dump; None when it left neither."""
    stacks, sentence = cell_files(folder, name)
    try:
        return str(json.loads(sentence.read_text())["where"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        return where_from_dump(stacks.read_text(errors="replace"))
    except OSError:
        return None


_ARMED: dict[str, Any] = {}


def arm_cell_watchdog(shell: Any = None, environ: Any = None) -> bool:
    """In a notebook's kernel run by the runner: dump the stacks shortly before a cell reaches the run's limit.

    Reads :data:`CELL_TIMEOUT_ENV` (the per-cell limit, s), :data:`STUCK_DIR_ENV` (a folder) and
    :data:`STUCK_NAME_ENV` (the notebook), set by the runner; before every cell (IPython's ``pre_run_cell``) a
    :class:`Watchdog` is armed for the limit less a margin (a fifth of it, at most 5 s), and disarmed after it
    (``post_run_cell``). When it fires, the stacks go to the folder's ``<name>.stacks.txt`` and the sentence
    to ``<name>.stuck.json`` (:func:`read_stuck`). Does nothing outside IPython or without those variables.

    Returns
    -------
    bool
        Whether it was armed.
    """
    environ = os.environ if environ is None else environ
    try:
        limit = float(environ.get(CELL_TIMEOUT_ENV, ""))
        folder, name = Path(environ[STUCK_DIR_ENV]), environ[STUCK_NAME_ENV]
    except (ValueError, KeyError):
        return False
    if not limit > 0:
        return False
    if shell is None:
        try:
            from IPython import get_ipython
        except ImportError:
            return False
        shell = get_ipython()
    if shell is None or _ARMED.get("shell") is shell:
        return shell is not None
    stacks_path, sentence_path = cell_files(folder, name)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        dump = open(stacks_path, "a", buffering=1)
    except OSError:
        return False
    margin = min(5.0, limit / 5)

    def fired(sentence: str, stacks: list) -> None:
        try:
            sentence_path.write_text(json.dumps({"where": sentence, "frames": [asdict(f) for f in stacks[0]]
                                                 if stacks else []}))
        except OSError:
            pass

    def pre(*_args: Any) -> None:
        post()
        try:
            sentence_path.unlink(missing_ok=True)  # an earlier cell's, that finished in time, says nothing of this one
        except OSError:
            pass
        _ARMED["dog"] = Watchdog(limit - margin, fired, dump=dump, backstop_s=min(1.0, margin / 2)).start()

    def post(*_args: Any) -> None:
        dog = _ARMED.pop("dog", None)
        if dog is not None:
            dog.cancel()

    shell.events.register("pre_run_cell", pre)
    shell.events.register("post_run_cell", post)
    _ARMED.update(shell=shell, dump=dump)
    return True
