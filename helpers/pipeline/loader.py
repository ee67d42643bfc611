"""DataLoader configuration: one validated set of loader settings, the start method, pinning, building loaders.

Everything a notebook needs to build a ``torch.utils.data.DataLoader`` with
worker processes without the usual failures (each reported in the public
issue cited):

* :class:`LoaderConfig` holds every loader setting, validated once, and
  :meth:`LoaderConfig.to_kwargs` passes ``DataLoader`` only what applies:
  no ``prefetch_factor``, ``persistent_workers`` or ``timeout`` with
  ``num_workers=0`` (torch raises ``ValueError`` for the first two;
  pytorch/pytorch#68576), and ``pin_memory`` only where the device can pin
  (pytorch/pytorch#73003).
* Every loader with workers gets
  :func:`helpers.pipeline.seeding.worker_init_fn`, bound to the distributed
  rank, so that workers, epochs and ranks draw different augmentations
  (pytorch/pytorch#5059).
* :func:`make_batch_sampler` and :func:`make_loader` build the loader from
  that configuration; :func:`close_loader` stops persistent workers.

The other concerns of running a loader live beside this module:
:mod:`helpers.pipeline.seeding` (per-worker seeding),
:mod:`helpers.pipeline.guarded` (an epoch whose failures become clear
errors), :mod:`helpers.pipeline.worker_memory` (the memory of each worker),
:mod:`helpers.pipeline.loader_timing` (the timing of worker settings) and,
above them, :mod:`helpers.experiments.loader_sweep` (notebook 03's sweep of
worker settings).

Fork and spawn
--------------
With the ``fork`` start method (the default on Linux up to Python 3.13) a
worker is a copy of the main process: the dataset is not pickled, a class
defined in a notebook works, and memory pages are shared until written, which
includes the reference-count writes Python makes when it merely *reads* a
list or dict (pytorch/pytorch#13246: keep per-sample metadata in NumPy arrays). With
``spawn`` (macOS and Windows default) and ``forkserver`` (Linux default from
Python 3.14) a worker is a fresh interpreter: the dataset, ``collate_fn`` and
``worker_init_fn`` are pickled and must be importable by name, so a class
defined in a notebook (module ``__main__``) fails in the worker with
"Can't get attribute ..." (Optimization-AI/LibAUC#60). That is why every dataset and
function the workbook sends to workers lives in a module of ``helpers``.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import multiprocessing
import numbers
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader

from helpers.device import usable_cores  # noqa: F401  (re-exported)
from helpers.errors import DataError, ParameterError
from helpers.pipeline.sampler import EpochBatchSampler
from helpers.pipeline.seeding import current_rank, worker_init_fn  # current_rank is re-exported
from helpers.pipeline.worker_progress import track

logger = logging.getLogger(__name__)

__all__ = [
    "LoaderConfig",
    "PinDecision",
    "StartMethod",
    "usable_cores",
    "current_rank",
    "start_method",
    "pin_memory_decision",
    "make_batch_sampler",
    "make_loader",
    "quiet_worker_count_warning",
    "close_loader",
    "TORCH_DEFAULT_PREFETCH",
]

#: Worker counts already warned about (LoaderConfig warns about more workers than cores once per process).
_CORE_WARNING_SHOWN: set[int] = set()

#: The start of torch's own warning about more workers than CPUs (``DataLoader.check_worker_number_rationality``),
#: which repeats :class:`LoaderConfig`'s warning at every loader and every epoch, with torch's file path.
_TORCH_WORKER_WARNING = r"This DataLoader will create \d+ worker processes in total"

#: torch's default ``prefetch_factor`` when ``num_workers > 0`` (``torch.utils.data.DataLoader`` documentation).
TORCH_DEFAULT_PREFETCH = 2


# --------------------------------------------------------------------------- machine facts


@dataclass(frozen=True)
class StartMethod:
    """How DataLoader worker processes are started.

    Attributes
    ----------
    method : str
        ``"fork"``, ``"spawn"`` or ``"forkserver"``.
    source : str
        Where the choice comes from: the loader configuration, an earlier
        ``set_start_method`` call, or the platform default.
    explanation : str
        What the method means for datasets and memory (one sentence).
    """

    method: str
    source: str
    explanation: str


_START_METHOD_NOTES = {
    "fork": (
        "workers are copies of this process: the dataset is not pickled (a class defined in a notebook "
        "works), and memory is shared until written - reading Python lists or dicts writes their "
        "reference counts, so keep per-sample metadata in NumPy arrays"
    ),
    "spawn": (
        "workers are fresh interpreters: the dataset, collate_fn and worker_init_fn are pickled and must "
        "be importable by name (a class defined in a notebook fails with \"Can't get attribute\"), and "
        "each worker imports torch again, so start-up is slower"
    ),
    "forkserver": (
        "workers are forked from a clean server process: the dataset, collate_fn and worker_init_fn are "
        "pickled and must be importable by name (a class defined in a notebook fails with "
        "\"Can't get attribute\")"
    ),
}


def start_method(config: "LoaderConfig | None" = None) -> StartMethod:
    """The start method DataLoader workers will use, without changing it.

    Parameters
    ----------
    config : LoaderConfig, optional
        Its ``multiprocessing_context``, when set, wins.

    Returns
    -------
    StartMethod

    Notes
    -----
    ``multiprocessing.get_start_method()`` without ``allow_none`` would *fix*
    the default context as a side effect; this function reads
    ``torch.multiprocessing.get_start_method(allow_none=True)`` and otherwise
    the platform default, the first entry of
    ``multiprocessing.get_all_start_methods()`` (Python documentation).
    """
    if config is not None and config.multiprocessing_context:
        method, source = config.multiprocessing_context, "LoaderConfig.multiprocessing_context"
    else:
        chosen = torch.multiprocessing.get_start_method(allow_none=True)
        if chosen:
            method, source = chosen, "set earlier with multiprocessing.set_start_method"
        else:
            method, source = multiprocessing.get_all_start_methods()[0], "the platform default"
    return StartMethod(method=method, source=source, explanation=_START_METHOD_NOTES.get(method, ""))


# --------------------------------------------------------------------------- pinning


@dataclass(frozen=True)
class PinDecision:
    """Whether the loader pins its batches, and why.

    Attributes
    ----------
    pin : bool
        The value passed as ``DataLoader(pin_memory=...)``.
    reason : str
        Why (a sentence for the reader).
    """

    pin: bool
    reason: str


def pin_memory_decision(requested: bool, acc: Any = None) -> PinDecision:
    """Decide ``pin_memory`` from the request and the device's capabilities.

    Parameters
    ----------
    requested : bool
        ``LoaderConfig.pin_memory``.
    acc : helpers.device.Accelerator, optional
        The device batches go to; pinning is decided by
        ``acc.capabilities.pinned_memory``.

    Returns
    -------
    PinDecision
        ``pin=True`` only when requested and the device can pin. On a
        CPU-only machine ``Tensor.pin_memory()`` raises "Cannot access
        accelerator device when none is available" (pytorch/pytorch#73003;
        ``docs/ascend_api_factcheck.md`` section 1), so the request is
        dropped with the reason, logged at INFO.
    """
    if not requested:
        return PinDecision(False, "pin_memory was not requested")
    if acc is None:
        reason = ("pin_memory requested but no device was given to decide it; pass acc "
                  "(helpers.device.get_accelerator()) so pinning is used only where the device supports it")
        logger.info("pin_memory off: %s", reason)
        return PinDecision(False, reason)
    cap = acc.capabilities.pinned_memory
    if not cap.available:
        reason = f"pin_memory requested but not available on {acc.kind}: {cap.detail}"
        logger.info("pin_memory off: %s", reason)
        return PinDecision(False, reason)
    return PinDecision(True, f"pinned host memory on {acc.kind}: {cap.detail}")


# --------------------------------------------------------------------------- the configuration


def _is_int(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, numbers.Integral)


@dataclass(frozen=True)
class LoaderConfig:
    """Every DataLoader setting of the workbook, validated once.

    Attributes
    ----------
    batch_size : int
        Samples per batch (>= 1).
    num_workers : int, default 0
        Worker processes (>= 0; 0 loads in the main process). More than the
        usable cores (:func:`usable_cores`) is allowed with a logged warning
        (once per process).
    prefetch_factor : int or None, default None
        Batches each worker prepares ahead (>= 1); only with
        ``num_workers > 0``. None lets torch use its default (2).
    persistent_workers : bool, default False
        Keep workers alive between epochs; only with ``num_workers > 0``.
    pin_memory : bool, default False
        Ask for pinned batches; granted only where the device can pin
        (:func:`pin_memory_decision`).
    timeout_s : float, default 120.0
        Seconds to wait for any batch from the workers (> 0, finite); a hang
        or a dead worker becomes an error after at most this long. Not used
        with ``num_workers=0`` (torch allows a timeout only with workers).
    multiprocessing_context : str or None, default None
        ``"fork"``, ``"spawn"`` or ``"forkserver"`` (those this platform
        supports), or None for the default (:func:`start_method`).
    drop_last : bool, default True
        Drop a last incomplete batch (every step the same shape).
    shuffle : bool, default True
        Random order, drawn from a ``torch.Generator`` seeded by ``seed``.
    seed : int, default 0
        Seed of the order and of the workers' base seed (>= 0).

    Raises
    ------
    ParameterError
        On construction, naming the field, the value seen and what is allowed.
    """

    batch_size: int
    num_workers: int = 0
    prefetch_factor: int | None = None
    persistent_workers: bool = False
    pin_memory: bool = False
    timeout_s: float = 120.0
    multiprocessing_context: str | None = None
    drop_last: bool = True
    shuffle: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        problems: list[str] = []
        if not _is_int(self.batch_size) or self.batch_size < 1:
            problems.append(f"batch_size={self.batch_size!r}: allowed: an int >= 1, e.g. 32")
        if not _is_int(self.num_workers) or self.num_workers < 0:
            problems.append(f"num_workers={self.num_workers!r}: allowed: an int >= 0 (0 loads in the main process)")
        if self.prefetch_factor is not None and (not _is_int(self.prefetch_factor) or self.prefetch_factor < 1):
            problems.append(f"prefetch_factor={self.prefetch_factor!r}: allowed: None or an int >= 1")
        for name in ("persistent_workers", "pin_memory", "drop_last", "shuffle"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                problems.append(f"{name}={value!r}: allowed: True or False")
        if (isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, numbers.Real)
                or not math.isfinite(self.timeout_s) or self.timeout_s <= 0):
            problems.append(
                f"timeout_s={self.timeout_s!r}: allowed: a finite number of seconds > 0 "
                "(a hang must become an error), e.g. 120"
            )
        methods = multiprocessing.get_all_start_methods()
        if self.multiprocessing_context is not None and self.multiprocessing_context not in methods:
            problems.append(
                f"multiprocessing_context={self.multiprocessing_context!r}: allowed: None or one of "
                f"{', '.join(repr(m) for m in methods)} (on this platform)"
            )
        if not _is_int(self.seed) or self.seed < 0:
            problems.append(f"seed={self.seed!r}: allowed: an int >= 0")
        workers_ok = _is_int(self.num_workers) and self.num_workers >= 0
        if workers_ok and self.num_workers == 0:
            # pytorch/pytorch#68576: torch raises ValueError for these.
            if self.prefetch_factor is not None:
                problems.append(
                    f"prefetch_factor={self.prefetch_factor!r} applies only with num_workers > 0 "
                    "(got num_workers=0): torch.utils.data.DataLoader raises ValueError for it; "
                    "set prefetch_factor=None or num_workers >= 1"
                )
            if self.persistent_workers is True:
                problems.append(
                    "persistent_workers=True applies only with num_workers > 0 (got num_workers=0): "
                    "torch.utils.data.DataLoader raises ValueError for it; set persistent_workers=False "
                    "or num_workers >= 1"
                )
            if self.multiprocessing_context is not None:
                problems.append(
                    f"multiprocessing_context={self.multiprocessing_context!r} applies only with "
                    "num_workers > 0 (got num_workers=0); set it to None or num_workers >= 1"
                )
        if problems:
            raise ParameterError("invalid LoaderConfig:\n  " + "\n  ".join(problems))
        object.__setattr__(self, "timeout_s", float(self.timeout_s))
        cores = usable_cores()
        if self.num_workers > cores:
            # once per process: a sweep builds many configs with the same worker counts
            level = logging.DEBUG if _CORE_WARNING_SHOWN else logging.WARNING
            _CORE_WARNING_SHOWN.add(self.num_workers)
            logger.log(
                level,
                "num_workers=%d is more than the %d usable CPU core(s): workers will share cores "
                "(allowed, but rarely faster; measure it). Shown once per process.", self.num_workers, cores,
            )

    def with_(self, **changes: Any) -> "LoaderConfig":
        """Return a copy with some fields changed (validated again).

        Parameters
        ----------
        **changes
            Field names and new values.

        Returns
        -------
        LoaderConfig
        """
        return dataclasses.replace(self, **changes)

    def to_kwargs(self, acc: Any = None, *, batch_sampler: Any = None, rank: int | None = None) -> dict[str, Any]:
        """Keyword arguments for ``torch.utils.data.DataLoader``: only what applies.

        Parameters
        ----------
        acc : helpers.device.Accelerator, optional
            Decides ``pin_memory`` (:func:`pin_memory_decision`).
        batch_sampler : iterable of list of int, optional
            For a *batched* dataset, whose ``__getitem__`` takes a list of
            indices and returns a whole batch: passed as ``sampler`` with
            ``batch_size=None`` (automatic batching off), and ``batch_size``,
            ``shuffle`` and ``drop_last`` are left out (the sampler decides).
        rank : int, optional
            Distributed rank mixed into the workers' seeds; default
            :func:`current_rank` read now, in the main process.

        Returns
        -------
        dict
            Always ``num_workers``, ``pin_memory`` (bool) and ``generator`` (a
            ``torch.Generator`` seeded with ``seed``: shuffling and the
            workers' base seed). With ``num_workers > 0`` also
            ``worker_init_fn`` (:func:`helpers.pipeline.seeding.worker_init_fn`
            bound to the rank),
            ``persistent_workers``, ``timeout`` (= ``timeout_s``), and
            ``prefetch_factor`` / ``multiprocessing_context`` when set.
        """
        kwargs: dict[str, Any] = {}
        if batch_sampler is None:
            kwargs.update(batch_size=self.batch_size, shuffle=self.shuffle, drop_last=self.drop_last)
        else:
            kwargs.update(batch_size=None, sampler=batch_sampler)
        kwargs["num_workers"] = self.num_workers
        kwargs["pin_memory"] = pin_memory_decision(self.pin_memory, acc).pin
        generator = torch.Generator()
        generator.manual_seed(self.seed)
        kwargs["generator"] = generator
        if self.num_workers > 0:
            kwargs["worker_init_fn"] = functools.partial(
                worker_init_fn, rank=current_rank() if rank is None else int(rank)
            )
            kwargs["persistent_workers"] = self.persistent_workers
            kwargs["timeout"] = self.timeout_s
            if self.prefetch_factor is not None:
                kwargs["prefetch_factor"] = self.prefetch_factor
            if self.multiprocessing_context is not None:
                kwargs["multiprocessing_context"] = self.multiprocessing_context
        return kwargs

    def describe(self) -> str:
        """A short label, e.g. ``"num_workers=2, prefetch_factor=4, persistent_workers=True"``."""
        if self.num_workers == 0:
            return "num_workers=0"
        pf = self.prefetch_factor if self.prefetch_factor is not None else "2 (default)"
        return f"num_workers={self.num_workers}, prefetch_factor={pf}, persistent_workers={self.persistent_workers}"


# --------------------------------------------------------------------------- building loaders


@contextmanager
def quiet_worker_count_warning() -> Iterator[None]:
    """Hide torch's UserWarning about more DataLoader workers than CPUs inside the block.

    torch warns "This DataLoader will create N worker processes in total..."
    when a loader is built and again at every epoch
    (``DataLoader.check_worker_number_rationality``), with the absolute path
    of its own source file. :class:`LoaderConfig` already says the same
    once per process, so :func:`make_loader`,
    :func:`helpers.pipeline.guarded.iterate` and the randomness probe build
    and start loaders inside this block. Other
    warnings pass through.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_TORCH_WORKER_WARNING, category=UserWarning)
        yield


def make_batch_sampler(n_items: int, config: LoaderConfig, *, num_batches: int | None = None):
    """Batches of indices for a batched dataset (``__getitem__(list[int])``), from ``config``.

    The workbook's one batch order (:class:`helpers.pipeline.sampler.EpochBatchSampler`)
    with the configuration's ``batch_size``, ``shuffle``, ``drop_last`` and ``seed``.

    Parameters
    ----------
    n_items : int
        Items in the dataset (>= 1).
    config : LoaderConfig
    num_batches : int, optional
        Batches per pass. Default: one pass over the items. More than the
        items hold continues into the next epochs' orders, so a timing trial
        can be longer than the dataset.

    Returns
    -------
    helpers.pipeline.sampler.EpochBatchSampler
        Yields lists of ``batch_size`` indices (the last one shorter only
        with ``drop_last=False``); each pass draws a new order from
        ``(config.seed, epoch)``.

    Raises
    ------
    DataError
        If no full batch can be formed (fewer items than ``batch_size`` with
        ``drop_last``), or ``n_items < 1``.
    ParameterError
        If ``num_batches`` < 1.
    """
    if not _is_int(n_items) or n_items < 1:
        raise DataError(f"the dataset holds {n_items!r} items; a loader needs at least one (check the folder)")
    if num_batches is not None and (not _is_int(num_batches) or num_batches < 1):
        raise ParameterError(f"num_batches={num_batches!r}: allowed: None or an int >= 1")
    _check_fits(int(n_items), config, num_batches)
    return EpochBatchSampler(int(n_items), config.batch_size, seed=config.seed, drop_last=config.drop_last,
                             shuffle=config.shuffle, num_batches=num_batches)


def _check_fits(n_items: int, config: LoaderConfig, num_batches: int | None = None) -> None:
    if config.drop_last and num_batches is None and n_items < config.batch_size:
        raise DataError(
            f"the dataset has {n_items} item(s), fewer than batch_size={config.batch_size}, and drop_last=True "
            "would yield no batch; lower batch_size, add images, or use drop_last=False"
        )


def make_loader(dataset: Any, config: LoaderConfig, acc: Any = None, *, batch_sampler: Any = None,
                collate_fn: Callable | None = None, rank: int | None = None):
    """Build a DataLoader from one validated configuration.

    Parameters
    ----------
    dataset : map-style dataset
        Per-item (``__getitem__(int)``), or batched (``__getitem__(list[int])``
        returning a whole batch) when ``batch_sampler`` is given.
    config : LoaderConfig
    acc : helpers.device.Accelerator, optional
        Decides pinning (:func:`pin_memory_decision`).
    batch_sampler : iterable of list of int, optional
        E.g. :func:`make_batch_sampler`; see :meth:`LoaderConfig.to_kwargs`.
    collate_fn : callable, optional
        Module-level function (picklable); default torch's
        (``default_collate`` per item, ``default_convert`` for batched).
    rank : int, optional
        See :meth:`LoaderConfig.to_kwargs`.

    Returns
    -------
    torch.utils.data.DataLoader
        With workers, its ``worker_init_fn`` is a
        :class:`helpers.pipeline.worker_progress.WorkerProgress` wrapping the
        configuration's (:func:`helpers.pipeline.worker_progress.track`): each
        worker records the sample it loads, so that a hung one can be named.

    Raises
    ------
    DataError
        If the dataset cannot fill one batch (fewer items than ``batch_size``
        with ``drop_last``, or a batch sampler that yields nothing).
    ParameterError
        If ``config`` is not a LoaderConfig.
    """
    if not isinstance(config, LoaderConfig):
        raise ParameterError(f"config: expected a LoaderConfig, got {type(config).__name__}")
    if batch_sampler is None:
        if hasattr(dataset, "__len__"):
            _check_fits(len(dataset), config)
    elif hasattr(batch_sampler, "__len__") and len(batch_sampler) == 0:
        raise DataError(
            f"the batch sampler yields no batch (dataset of {len(dataset) if hasattr(dataset, '__len__') else '?'} "
            f"item(s), batch_size={config.batch_size}, drop_last={config.drop_last}); lower batch_size or add images"
        )
    kwargs = config.to_kwargs(acc, batch_sampler=batch_sampler, rank=rank)
    if collate_fn is not None:
        kwargs["collate_fn"] = collate_fn
    with quiet_worker_count_warning():
        return track(DataLoader(dataset, **kwargs))  # a hung worker can be named, with its sample


def close_loader(loader: Any) -> None:
    """Stop the persistent workers a DataLoader keeps between epochs.

    A loader with ``persistent_workers=True`` keeps its iterator (and its
    worker processes) in ``loader._iterator`` until the loader is garbage
    collected. This calls that iterator's shutdown (the same method its
    ``__del__`` calls; a private torch attribute, present since torch 1.7)
    and forgets it. A no-op for any other loader.

    Parameters
    ----------
    loader : torch.utils.data.DataLoader
    """
    it = getattr(loader, "_iterator", None)
    if it is None:
        return
    shutdown = getattr(it, "_shutdown_workers", None)
    if callable(shutdown):
        shutdown()
    loader._iterator = None
