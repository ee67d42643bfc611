"""Guarded iteration of a DataLoader: every loader failure becomes a clear error, and no worker is left behind.

* :class:`LoaderIterator` (``iterate(loader)``) turns a hung or dead worker,
  a dead pin-memory thread, or a dataset that cannot be sent to a worker into
  a :class:`~helpers.errors.DataError` that names the loader setting and the
  likely cause (:func:`explain_loader_error`), within
  :attr:`helpers.pipeline.loader.LoaderConfig.timeout_s`
  (Optimization-AI/LibAUC#60, pytorch/pytorch#47445), and leaves no worker
  process behind. A timeout names the stuck worker, its pid and the sample
  index it has been loading for how long, where the workers record it
  (:mod:`helpers.pipeline.worker_progress`, which the iterator applies to the
  loader), and says so plainly where that is not known.
* :func:`run_epoch` drains one epoch through it and collects the files a
  batched dataset replaced because they failed to decode (:class:`SkipLog`,
  :class:`EpochReport`).

Worker processes are found as new child processes of this one (psutil).
"""

from __future__ import annotations

import logging
import pickle
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psutil

from helpers.errors import DataError, ParameterError
from helpers.pipeline.loader import _is_int, quiet_worker_count_warning, start_method
from helpers.pipeline.worker_progress import stuck_workers_sentence, track

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

logger = logging.getLogger(__name__)

__all__ = [
    "LoaderIterator",
    "iterate",
    "explain_loader_error",
    "SkipLog",
    "EpochReport",
    "run_epoch",
]

#: torch's worker-status polling interval, seconds (``torch.utils.data._utils.MP_STATUS_CHECK_INTERVAL``):
#: shutting down a stuck worker waits this long for it before terminating it.
_TORCH_WORKER_JOIN_S = 5.0


# --------------------------------------------------------------------------- guarded iteration


def _descendants() -> dict[int, Any]:
    """Live descendant processes of this one, by pid (psutil)."""
    try:
        return {p.pid: p for p in psutil.Process().children(recursive=True)}
    except psutil.Error:
        return {}


def _new_workers(before: dict[int, Any]) -> list[Any]:
    """Processes started since ``before``, less multiprocessing's helper processes.

    Drops the resource tracker and the forkserver server (the parent of the
    forkserver's workers), which appear the first time spawn or forkserver is used.
    """
    new = {pid: p for pid, p in _descendants().items() if pid not in before}
    parents = set()
    keep = []
    for p in new.values():
        try:
            parents.add(p.ppid())
        except psutil.Error:
            continue
    for pid, p in sorted(new.items()):
        if pid in parents:
            continue  # a server process (forkserver) whose children are the workers
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            cmd = ""
        if "resource_tracker" in cmd:
            continue
        keep.append(p)
    return keep


def _known_workers(workers: Iterable[Any]) -> list[Any]:
    out = []
    for w in workers:
        try:
            if w.pid is not None:
                out.append(psutil.Process(w.pid))
        except psutil.Error:
            continue
    return out


def _loader_facts(loader: Any) -> dict[str, Any]:
    num_workers = int(getattr(loader, "num_workers", 0) or 0)
    ctx = getattr(loader, "multiprocessing_context", None)
    method = getattr(ctx, "get_start_method", None)
    if callable(method):
        method = method()
    elif ctx is None or isinstance(ctx, str):
        method = ctx or start_method().method
    else:
        method = str(ctx)
    return {
        "num_workers": num_workers,
        "timeout": float(getattr(loader, "timeout", 0) or 0),
        "pin_memory": bool(getattr(loader, "pin_memory", False)),
        "prefetch_factor": getattr(loader, "prefetch_factor", None),
        "persistent_workers": bool(getattr(loader, "persistent_workers", False)),
        "start_method": method,
    }


_PICKLE_HINTS = ("can't pickle", "cannot pickle", "can't get attribute", "pickle", "not picklable")


def explain_loader_error(exc: BaseException, loader: Any, *, name: str = "loader",
                         workers: str | None = None) -> DataError | None:
    """Turn a DataLoader machinery failure into a DataError that names the setting and the likely cause.

    Parameters
    ----------
    exc : BaseException
        What the DataLoader raised.
    loader : torch.utils.data.DataLoader
        The loader (its ``num_workers``, ``timeout``, ``pin_memory`` and
        start method are quoted).
    name : str
        What the loader is called in the message.
    workers : str, optional
        For a timeout: which worker is stuck in which sample, and for how long
        (:func:`helpers.pipeline.worker_progress.stuck_workers_sentence`, read
        before the workers are stopped); None: the message says that it is not
        known.

    Returns
    -------
    DataError or None
        None when ``exc`` is not a loader failure (an error raised by the
        dataset itself, which torch re-raises with the worker's traceback,
        is left as it is).
    """
    if str(exc).startswith("Caught "):
        return None  # the dataset's own error, re-raised by torch with the worker's traceback
    facts = _loader_facts(loader)
    text = f"{type(exc).__name__}: {exc}"
    low = str(exc).lower()
    nw, method, timeout = facts["num_workers"], facts["start_method"], facts["timeout"]
    setting = f"num_workers={nw}, start method {method!r}"
    first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if isinstance(exc, RuntimeError) and "timed out after" in low:
        spawn_hint = (
            "; under spawn/forkserver, a Dataset, collate_fn or worker_init_fn defined in the notebook cannot be "
            "imported by the worker (move it into a module such as helpers)" if method != "fork" else ""
        )
        pin_hint = "; the pin-memory thread may have stopped (pin_memory=True; try pin_memory=False)" \
            if facts["pin_memory"] else ""
        stuck = workers or ("which worker is stuck and in which sample is not known (the workers' table could not "
                            "be read)")
        return DataError(
            f"{name}: no batch arrived within timeout={timeout:g} s (DataLoader timeout, LoaderConfig.timeout_s) "
            f"with {setting}: {stuck}. Likely cause: a worker is stuck in the dataset's __getitem__ (a read that "
            f"never returns, a lock or thread pool inherited through fork){spawn_hint}{pin_hint}. What to do: load "
            "that sample (or one batch) with num_workers=0 to see the problem directly; raise timeout_s only if one "
            "batch really takes that long"
        )
    if isinstance(exc, RuntimeError) and "pin memory thread exited" in low:
        return DataError(
            f"{name}: the pin-memory thread exited unexpectedly (pin_memory=True, {setting}): {first_line}. Likely "
            "cause: pinning failed (no accelerator, out of pinned memory) or several loaders under fork share a "
            "broken state (pytorch#47445). What to do: set pin_memory=False to confirm, and give each loader its "
            "own timeout_s"
        )
    if isinstance(exc, RuntimeError) and ("exited unexpectedly" in low or "killed by signal" in low):
        spawn_hint = (
            " or it could not import the dataset's class (under spawn/forkserver a Dataset defined in a notebook "
            "fails with \"Can't get attribute\": keep it in a module such as helpers)"
        )
        return DataError(
            f"{name}: a DataLoader worker process died ({setting}): {first_line}. Likely cause: it was killed for "
            "memory (see the kernel log for the OOM killer; lower num_workers or prefetch_factor), it crashed in "
            f"native code,{spawn_hint}. What to do: run one batch with num_workers=0 to see the error directly"
        )
    is_pickle = isinstance(exc, pickle.PicklingError) or (
        isinstance(exc, (AttributeError, TypeError)) and any(h in low for h in _PICKLE_HINTS)
    )
    if is_pickle:
        return DataError(
            f"{name}: the dataset, collate_fn or worker_init_fn cannot be sent to the worker processes ({setting}): "
            f"{text}. Under spawn and forkserver these are pickled and must be defined at module level in an "
            "importable module (such as helpers), not in a notebook cell or inside a function. What to do: move "
            "them into a module, or use num_workers=0"
        )
    return None


class LoaderIterator:
    """An epoch of a DataLoader, with every loader failure turned into a clear DataError.

    Create it with :func:`iterate`. With ``num_workers > 0`` each batch,
    the first included, waits at most the loader's ``timeout`` (set from
    :attr:`helpers.pipeline.loader.LoaderConfig.timeout_s`); a hang, a dead
    worker, a dead pin-memory thread or a dataset that cannot be pickled raises
    :class:`~helpers.errors.DataError` (:func:`explain_loader_error`) after
    the workers have been stopped: after a timeout the stuck workers are
    terminated at once (torch's own shutdown would first wait 5 s, its
    ``MP_STATUS_CHECK_INTERVAL``, for each). Before its workers start, the
    loader is tracked (:func:`helpers.pipeline.worker_progress.track`: its
    ``worker_init_fn`` is wrapped), so that a timeout's message names the
    stuck worker and sample ("worker 1 (pid 4242) has been in
    __getitem__(index 37) for 30 s").

    Attributes
    ----------
    first_batch_s : float or None
        Seconds from :func:`iterate` to the first batch (worker start-up
        included), None before it arrives.
    batches : int
        Batches received so far.
    worker_pids : tuple of int
        Worker processes found as new children of this process when the
        iterator was created (empty with ``num_workers=0`` or persistent
        workers reused from an earlier epoch).
    """

    def __init__(self, loader: Any, *, name: str = "loader") -> None:
        self.loader = loader
        self.name = name
        self.batches = 0
        self.first_batch_s: float | None = None
        before = _descendants() if getattr(loader, "num_workers", 0) else {}
        track(loader)  # its workers record the sample they load: a timeout names the stuck one
        self._it = None
        self._procs: list[Any] = []
        self._t0 = time.perf_counter()
        try:
            with quiet_worker_count_warning():
                self._it = iter(loader)
            # a worker that dies at once makes torch's SIGCHLD handler raise here, while the workers are looked up
            self._procs = _new_workers(before) if getattr(loader, "num_workers", 0) else []
            if not self._procs and getattr(loader, "num_workers", 0):
                # persistent workers resumed from an earlier epoch are not new children:
                # read them from the iterator (torch's private ``_workers`` list)
                self._procs = _known_workers(getattr(self._it, "_workers", ()))
        except Exception as exc:
            err = explain_loader_error(exc, loader, name=name)
            self.close(force=True)
            if err is None:
                raise
            raise err from exc
        self.worker_pids = tuple(p.pid for p in self._procs)

    def __iter__(self) -> "LoaderIterator":
        return self

    def __next__(self) -> Any:
        if self._it is None:
            raise StopIteration
        try:
            batch = next(self._it)
        except StopIteration:
            self._it = None
            raise
        except Exception as exc:
            timed_out = isinstance(exc, RuntimeError) and "timed out after" in str(exc).lower()
            # which worker is stuck in which sample: read before the workers are stopped
            workers = stuck_workers_sentence(self._it) if timed_out else None
            err = explain_loader_error(exc, self.loader, name=self.name, workers=workers)
            if err is None:
                raise
            if timed_out:
                self._terminate_workers()  # stuck: torch's shutdown would wait 5 s for each before doing the same
            self.close(force=True)
            raise err from exc
        if self.batches == 0:
            self.first_batch_s = time.perf_counter() - self._t0
        self.batches += 1
        return batch

    def take(self, n: int) -> list[Any]:
        """The next ``n`` batches, or a DataError that says how to get them.

        Parameters
        ----------
        n : int
            Batches wanted (>= 0).

        Returns
        -------
        list
            ``n`` batches.

        Raises
        ------
        DataError
            If the epoch ends first (a bare ``StopIteration`` would say
            nothing): the message gives the batches the loader made, the
            dataset size and batch size where known, and the ways out (ask
            for fewer, lower the batch size, add images, or build the
            sampler with :func:`helpers.pipeline.loader.make_batch_sampler`
            ``num_batches=n`` so that it iterates across epochs).
        ParameterError
            If ``n`` is not an int >= 0.
        """
        if not _is_int(n) or n < 0:
            raise ParameterError(f"take(n={n!r}): allowed: an int >= 0")
        out: list[Any] = []
        for _ in range(n):
            try:
                out.append(next(self))
            except StopIteration:
                raise DataError(_ran_out_message(self.loader, self.name, wanted=n, got=self.batches)) from None
        return out

    def close(self, *, force: bool = False) -> None:
        """Stop this epoch's workers (not a persistent loader's, unless ``force``).

        Parameters
        ----------
        force : bool
            Also shut down persistent workers (used after a failure).
        """
        it, self._it = getattr(self, "_it", None), None
        if it is None:
            return
        persistent = bool(getattr(self.loader, "persistent_workers", False))
        if persistent and not force:
            return  # the workers wait for the next epoch
        shutdown = getattr(it, "_shutdown_workers", None)
        if callable(shutdown):
            shutdown()
        if persistent:
            self.loader._iterator = None
        self._reap()

    def _terminate_workers(self) -> None:
        """SIGTERM this epoch's workers: after the loader's timeout expired they are stuck (in ``__getitem__``, a
        lock), and :meth:`close` would otherwise wait :data:`_TORCH_WORKER_JOIN_S` for each before torch sends them
        the same signal."""
        for p in self._procs:
            try:
                p.terminate()
            except psutil.Error:
                pass

    def _reap(self) -> None:
        for p in self._procs:
            try:
                p.wait(timeout=_TORCH_WORKER_JOIN_S)
            except psutil.TimeoutExpired:
                logger.warning("%s: worker pid %d still alive after shutdown; killing it", self.name, p.pid)
                p.kill()
            except psutil.Error:
                pass

    def __enter__(self) -> "LoaderIterator":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close(force=exc[0] is not None)


def _ran_out_message(loader: Any, name: str, *, wanted: int, got: int) -> str:
    """Why a loader gave ``got`` batches where ``wanted`` were needed, and what to change."""
    dataset = getattr(loader, "dataset", None)
    n_items = len(dataset) if hasattr(dataset, "__len__") else None
    sampler = getattr(loader, "sampler", None)
    batch_size = getattr(loader, "batch_size", None) or getattr(sampler, "batch_size", None)
    data = []
    if n_items is not None:
        data.append(f"{n_items} item(s)")
    if batch_size is not None:
        data.append(f"batch_size={batch_size}")
    about = f" ({', '.join(data)})" if data else ""
    need = f"at least {wanted} batches"
    return (
        f"{name}: the loader ended after {got} batch(es) but {wanted} were asked for: one pass over the "
        f"data{about} makes only {got} batch(es) and this step needs {need}. What to change: lower the "
        f"batch size (the batch_size parameter) so that one pass makes {wanted} or more, or add images; in "
        f"code, build the sampler with make_batch_sampler(n_items, config, num_batches={wanted}), which "
        "iterates across epochs"
    )


def iterate(loader: Any, *, name: str = "loader") -> LoaderIterator:
    """Start an epoch of ``loader`` with failures turned into DataErrors (see :class:`LoaderIterator`).

    Parameters
    ----------
    loader : torch.utils.data.DataLoader
    name : str
        What the loader is called in error messages.

    Returns
    -------
    LoaderIterator

    Raises
    ------
    DataError
        If the workers cannot be started (e.g. the dataset cannot be pickled
        under spawn).
    """
    return LoaderIterator(loader, name=name)


# --------------------------------------------------------------------------- bad input


class SkipLog:
    """Files that a batched dataset replaced because they failed to decode, collected over batches.

    A host batch reports them in ``batch["skipped"]`` as ``(file name,
    reason)`` pairs (tuples, or lists after torch's ``default_convert``).
    """

    def __init__(self) -> None:
        self._counts: Counter[tuple[str, str]] = Counter()

    def add(self, batch: Any) -> int:
        """Record the skipped files of one batch; return how many it had.

        Parameters
        ----------
        batch : dict
            A host batch; a batch without ``"skipped"`` counts 0.
        """
        entries = batch.get("skipped", ()) if isinstance(batch, dict) else ()
        n = 0
        for entry in entries or ():
            name, reason = (entry[0], entry[1]) if len(entry) >= 2 else (entry[0], "")
            self._counts[(str(name), str(reason))] += 1
            n += 1
        return n

    @property
    def total(self) -> int:
        """Replacements seen (a file met twice counts twice)."""
        return sum(self._counts.values())

    def entries(self) -> tuple[tuple[str, str, int], ...]:
        """``(file, reason, times)`` per distinct file and reason, sorted by file."""
        return tuple((f, r, n) for (f, r), n in sorted(self._counts.items()))

    def frame(self) -> "pd.DataFrame":
        """The entries as a table: ``file`` (str), ``reason`` (str), ``times`` (int)."""
        # pandas is imported here, not at module level: DataLoader workers started with spawn or forkserver
        # import this module (through the datasets that use it), and need not pay for pandas.
        import pandas as pd

        return pd.DataFrame(list(self.entries()), columns=["file", "reason", "times"])


@dataclass(frozen=True)
class EpochReport:
    """One pass through a loader.

    Attributes
    ----------
    batches : int
        Batches received.
    items : int
        Items received (sum of the batches' first dimension of ``image`` or
        ``label``; 0 where neither exists).
    first_batch_s : float or None
        Seconds to the first batch, worker start-up included.
    elapsed_s : float
        Seconds for the whole pass.
    skipped : tuple of (str, str, int)
        ``(file, reason, times)`` of images replaced in the batches.
    worker_pids : tuple of int
        The epoch's worker processes.
    """

    batches: int
    items: int
    first_batch_s: float | None
    elapsed_s: float
    skipped: tuple[tuple[str, str, int], ...]
    worker_pids: tuple[int, ...]


def _batch_len(batch: Any) -> int:
    if isinstance(batch, dict):
        for key in ("label", "image"):
            value = batch.get(key)
            if value is not None and hasattr(value, "shape") and len(value.shape) > 0:
                return int(value.shape[0])
    return 0


def run_epoch(loader: Any, *, name: str = "loader", max_batches: int | None = None,
              on_batch: Callable[[int, Any], None] | None = None) -> EpochReport:
    """Drain one epoch (or ``max_batches``) of ``loader`` through :func:`iterate`, collecting skipped files.

    Parameters
    ----------
    loader : torch.utils.data.DataLoader
    name : str
        Used in error messages.
    max_batches : int, optional
        Stop after this many batches (the workers are then stopped).
    on_batch : callable, optional
        ``on_batch(i, batch)`` for each batch.

    Returns
    -------
    EpochReport

    Raises
    ------
    DataError
        On a loader failure (see :class:`LoaderIterator`).
    """
    log = SkipLog()
    items = 0
    t0 = time.perf_counter()
    with iterate(loader, name=name) as it:
        for i, batch in enumerate(it):
            log.add(batch)
            items += _batch_len(batch)
            if on_batch is not None:
                on_batch(i, batch)
            if max_batches is not None and i + 1 >= max_batches:
                break
        elapsed = time.perf_counter() - t0
        report = EpochReport(batches=it.batches, items=items, first_batch_s=it.first_batch_s, elapsed_s=elapsed,
                             skipped=log.entries(), worker_pids=it.worker_pids)
    if report.skipped:
        logger.warning("%s: %d image(s) failed to decode and were replaced: %s", name, log.total,
                       "; ".join(f"{f} ({r})" for f, r, _ in report.skipped[:5]))
    return report
