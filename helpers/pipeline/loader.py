"""DataLoader tuning: one validated configuration, per-worker seeding, guarded iteration, worker memory, the sweep.

Everything a notebook needs to run ``torch.utils.data.DataLoader`` with worker
processes without the usual failures (each reported in the public issue cited):

* :class:`LoaderConfig` holds every loader setting, validated once, and
  :meth:`LoaderConfig.to_kwargs` passes ``DataLoader`` only what applies:
  no ``prefetch_factor``, ``persistent_workers`` or ``timeout`` with
  ``num_workers=0`` (torch raises ``ValueError`` for the first two;
  pytorch/pytorch#68576), and ``pin_memory`` only where the device can pin
  (pytorch/pytorch#73003).
* :func:`worker_init_fn` reseeds ``random``, NumPy's global generator and
  torch in each worker from the worker's seed *and the distributed rank*, and
  reseeds the RNG objects a dataset holds (pytorch/pytorch#5059; protocol below).
* :class:`LoaderIterator` (``iterate(loader)``) turns a hung or dead worker,
  a dead pin-memory thread, or a dataset that cannot be sent to a worker into
  a :class:`~helpers.errors.DataError` that names the loader setting and the
  likely cause, within ``LoaderConfig.timeout_s`` (Optimization-AI/LibAUC#60,
  pytorch/pytorch#47445), and
  leaves no worker process behind.
* :func:`measure_epoch_memory` reads the USS/PSS of the main process and of
  each worker at the start and at the end of an epoch (pytorch/pytorch#13246).
* :func:`run_sweep` times ``num_workers x prefetch_factor x persistent_workers``
  in rotated order, counting only batches finished after its clock started
  (:func:`completion_window`); :func:`speedup_plausibility` flags a result
  no CPU-bound pipeline can reach.

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
function here lives in a module of ``helpers``.

The reseed protocol (worker_init_fn)
------------------------------------
PyTorch seeds ``random``, ``numpy.random`` and torch's default generator in
every worker (``torch/utils/data/_utils/worker.py``, ``_worker_loop``), but a
generator *object* made in a dataset's ``__init__`` is copied into every
worker with the same state, so every worker draws the same "random"
augmentations (pytorch#5059). :func:`reseed_dataset_rngs` fixes that:

1. if the dataset has a callable ``reseed(seed: int)``, it is called with a
   64-bit seed derived from the worker's seed and the rank, and nothing else
   is touched (the dataset knows its own generators best);
2. otherwise the dataset's instance attributes are scanned, and those of the
   plain objects it holds (a transform, an augmenter) down to ``max_depth``
   levels, including lists, tuples and dicts of at most
   :data:`MAX_SCAN_CONTAINER` items (larger containers are skipped: walking a
   big metadata list would itself touch every object's reference count).
   Every ``numpy.random.Generator``, ``numpy.random.RandomState``,
   ``torch.Generator`` and ``random.Random`` found is reseeded *in place*
   (so other references to it see the new state), each from its own child
   seed, in sorted attribute order.
"""

from __future__ import annotations

import functools
import logging
import math
import multiprocessing
import numbers
import os
import pickle
import random
import time
import types
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import Dataset

from helpers.device import usable_cores  # noqa: F401  (re-exported)
from helpers.errors import DataError, ParameterError

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

logger = logging.getLogger(__name__)

__all__ = [
    "LoaderConfig",
    "PinDecision",
    "StartMethod",
    "usable_cores",
    "current_rank",
    "start_method",
    "pin_memory_decision",
    "worker_init_fn",
    "seed_worker",
    "WorkerSeeds",
    "reseed_dataset_rngs",
    "make_batch_sampler",
    "make_loader",
    "quiet_worker_count_warning",
    "close_loader",
    "LoaderIterator",
    "iterate",
    "explain_loader_error",
    "SkipLog",
    "EpochReport",
    "run_epoch",
    "ProcessMemory",
    "process_memory",
    "measure_epoch_memory",
    "MetadataDataset",
    "FaultyDataset",
    "batches_equal",
    "LoaderSetting",
    "sweep_settings",
    "SweepResult",
    "completion_window",
    "speedup_plausibility",
    "TORCH_DEFAULT_PREFETCH",
    "run_sweep",
]

#: Containers with more items than this are not scanned for RNG objects
#: (walking a large list of metadata would touch every item's reference count).
MAX_SCAN_CONTAINER = 32

#: torch's worker-status polling interval, seconds (``torch.utils.data._utils.MP_STATUS_CHECK_INTERVAL``):
#: shutting down a stuck worker waits this long for it before terminating it.
_TORCH_WORKER_JOIN_S = 5.0

_MIB = float(1 << 20)

#: Worker counts already warned about (LoaderConfig warns about more workers than cores once per process).
_CORE_WARNING_SHOWN: set[int] = set()

#: The start of torch's own warning about more workers than CPUs (``DataLoader.check_worker_number_rationality``),
#: which repeats :class:`LoaderConfig`'s warning at every loader and every epoch, with torch's file path.
_TORCH_WORKER_WARNING = r"This DataLoader will create \d+ worker processes in total"

#: torch's default ``prefetch_factor`` when ``num_workers > 0`` (``torch.utils.data.DataLoader`` documentation).
TORCH_DEFAULT_PREFETCH = 2


# --------------------------------------------------------------------------- machine facts


def current_rank() -> int:
    """The distributed rank of this process.

    Returns
    -------
    int
        ``torch.distributed.get_rank()`` when a process group is initialized;
        else the ``RANK`` environment variable (set by torchrun); else 0.

    Raises
    ------
    ParameterError
        If ``RANK`` is set but is not a non-negative integer.
    """
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    raw = os.environ.get("RANK")
    if raw is None or raw.strip() == "":
        return 0
    try:
        rank = int(raw)
    except ValueError:
        rank = -1
    if rank < 0:
        raise ParameterError(
            f"environment variable RANK={raw!r} is not a non-negative integer; torchrun sets it to the "
            "process's global rank - unset it or set it to 0, 1, ..."
        )
    return rank


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
        import dataclasses

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
            ``worker_init_fn`` (:func:`worker_init_fn` bound to the rank),
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


# --------------------------------------------------------------------------- seeding


def _reseed_one(obj: Any, seq: np.random.SeedSequence) -> bool:
    """Reseed one RNG object in place from ``seq``; False if ``obj`` is not an RNG we know."""
    if isinstance(obj, np.random.Generator):
        bitgen = obj.bit_generator
        bitgen.state = type(bitgen)(seq).state
        return True
    if isinstance(obj, np.random.RandomState):
        obj.seed(seq.generate_state(4, np.uint32))  # MT19937 seeding from 128 bits
        return True
    if isinstance(obj, torch.Generator):
        obj.manual_seed(int(seq.generate_state(1, np.uint64)[0]) & ((1 << 63) - 1))
        return True
    if isinstance(obj, random.Random) and not isinstance(obj, random.SystemRandom):
        obj.seed(int.from_bytes(seq.generate_state(4, np.uint32).tobytes(), "little"))
        return True
    return False


def _is_rng(obj: Any) -> bool:
    return isinstance(obj, (np.random.Generator, np.random.RandomState, torch.Generator)) or (
        isinstance(obj, random.Random) and not isinstance(obj, random.SystemRandom)
    )


_NOT_SCANNED = (str, bytes, numbers.Number, np.ndarray, torch.Tensor, type, types.ModuleType, types.FunctionType,
                types.BuiltinFunctionType, types.MethodType, functools.partial)


def _scan_targets(obj: Any, path: str, depth: int, seen: set[int], out: list[tuple[str, Any]]) -> None:
    """Collect (path, rng) pairs reachable from ``obj`` within ``depth`` more attribute levels.

    Containers (list, tuple, dict of at most MAX_SCAN_CONTAINER items) do not
    use up a level; larger ones, arrays, tensors, strings, numbers, modules,
    classes and functions are not entered.
    """
    if depth < 0 or id(obj) in seen:
        return
    seen.add(id(obj))
    if _is_rng(obj):
        out.append((path, obj))
        return
    if isinstance(obj, _NOT_SCANNED):
        return
    if isinstance(obj, dict):
        if len(obj) <= MAX_SCAN_CONTAINER:
            for key in sorted(obj, key=repr):
                _scan_targets(obj[key], f"{path}[{key!r}]", depth, seen, out)
        return
    if isinstance(obj, (list, tuple)):
        if len(obj) <= MAX_SCAN_CONTAINER:
            for i, item in enumerate(obj):
                _scan_targets(item, f"{path}[{i}]", depth, seen, out)
        return
    attrs = getattr(obj, "__dict__", None)
    if isinstance(attrs, dict):
        for name in sorted(attrs):
            _scan_targets(attrs[name], f"{path}.{name}", depth - 1, seen, out)


def reseed_dataset_rngs(dataset: Any, seed: int | np.random.SeedSequence, *, max_depth: int = 2) -> tuple[str, ...]:
    """Reseed the RNG objects a dataset holds (the protocol in the module docstring).

    Parameters
    ----------
    dataset : object
        The worker's copy of the dataset (``get_worker_info().dataset``).
    seed : int or numpy.random.SeedSequence
        Root seed; each RNG found gets its own child of it.
    max_depth : int, default 2
        How many levels of attributes below the dataset are scanned.

    Returns
    -------
    tuple of str
        What was reseeded: ``("reseed()",)`` when the dataset has a
        ``reseed`` method, else the attribute paths, e.g.
        ``("dataset.rng", "dataset.transform.gen")``; empty if none.
    """
    root = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(int(seed))
    hook = getattr(dataset, "reseed", None)
    if callable(hook):
        hook(int(root.generate_state(1, np.uint64)[0]) & ((1 << 63) - 1))
        return ("reseed()",)
    targets: list[tuple[str, Any]] = []
    attrs = getattr(dataset, "__dict__", None)
    if isinstance(attrs, dict):
        seen = {id(dataset)}
        for name in sorted(attrs):
            _scan_targets(attrs[name], f"dataset.{name}", max_depth - 1, seen, targets)
    done = []
    for (path, rng), child in zip(targets, root.spawn(len(targets))):
        if _reseed_one(rng, child):
            done.append(path)
    return tuple(done)


@dataclass(frozen=True)
class WorkerSeeds:
    """What :func:`seed_worker` did in one worker.

    Attributes
    ----------
    worker_seed : int
        The worker's seed from torch (``get_worker_info().seed``).
    rank : int
        The distributed rank mixed in.
    reseeded : tuple of str
        RNG objects of the dataset reseeded (see :func:`reseed_dataset_rngs`).
    """

    worker_seed: int
    rank: int
    reseeded: tuple[str, ...]


def seed_worker(worker_seed: int, rank: int, dataset: Any = None) -> WorkerSeeds:
    """Seed ``random``, NumPy's global RNG, torch and the dataset's RNG objects from (worker seed, rank).

    The seeds come from ``numpy.random.SeedSequence([worker_seed, rank])``,
    so two ranks whose loaders were seeded alike (the usual DDP set-up: the
    same seed everywhere) still draw different augmentations, and so do two
    workers and two epochs (torch draws a new base seed per epoch unless the
    workers persist, in which case their generators simply continue).

    Parameters
    ----------
    worker_seed : int
        ``torch.utils.data.get_worker_info().seed`` (>= 0).
    rank : int
        Distributed rank (>= 0).
    dataset : object, optional
        The worker's dataset copy, for :func:`reseed_dataset_rngs`.

    Returns
    -------
    WorkerSeeds
    """
    root = np.random.SeedSequence([int(worker_seed), int(rank)])
    py_seq, np_seq, torch_seq, data_seq = root.spawn(4)
    random.seed(int(py_seq.generate_state(1, np.uint64)[0]))
    np.random.seed(np_seq.generate_state(4, np.uint32))
    torch.manual_seed(int(torch_seq.generate_state(1, np.uint64)[0]) & ((1 << 63) - 1))
    reseeded = reseed_dataset_rngs(dataset, data_seq) if dataset is not None else ()
    return WorkerSeeds(worker_seed=int(worker_seed), rank=int(rank), reseeded=reseeded)


def worker_init_fn(worker_id: int, rank: int | None = None) -> WorkerSeeds:
    """DataLoader ``worker_init_fn``: seed this worker from its seed and the rank.

    Module-level, so workers started with ``spawn`` or ``forkserver`` can
    unpickle it; :meth:`LoaderConfig.to_kwargs` passes it bound to the rank
    (``functools.partial(worker_init_fn, rank=r)``), read in the main
    process where a process group may exist.

    Parameters
    ----------
    worker_id : int
        Given by the DataLoader (0 .. num_workers-1).
    rank : int, optional
        Distributed rank; default :func:`current_rank` read in the worker.

    Returns
    -------
    WorkerSeeds

    Raises
    ------
    ParameterError
        When called outside a DataLoader worker.
    """
    info = torch.utils.data.get_worker_info()
    if info is None:
        raise ParameterError(
            f"worker_init_fn({worker_id!r}) was called outside a DataLoader worker (get_worker_info() is "
            "None); pass it as DataLoader(worker_init_fn=...), or call seed_worker() directly"
        )
    seeds = seed_worker(info.seed, current_rank() if rank is None else rank, info.dataset)
    logger.debug("worker %d (pid %d): seed %d, rank %d, reseeded %s", info.id, os.getpid(), info.seed,
                 seeds.rank, ", ".join(seeds.reseeded) or "nothing")
    return seeds


# --------------------------------------------------------------------------- building loaders


@contextmanager
def quiet_worker_count_warning() -> Iterator[None]:
    """Hide torch's UserWarning about more DataLoader workers than CPUs inside the block.

    torch warns "This DataLoader will create N worker processes in total..."
    when a loader is built and again at every epoch
    (``DataLoader.check_worker_number_rationality``), with the absolute path
    of its own source file. :class:`LoaderConfig` already says the same
    once per process, so :func:`make_loader`, :func:`iterate` and the
    randomness probe build and start loaders inside this block. Other
    warnings pass through.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_TORCH_WORKER_WARNING, category=UserWarning)
        yield


def make_batch_sampler(n_items: int, config: LoaderConfig, *, num_batches: int | None = None):
    """Batches of indices for a batched dataset (``__getitem__(list[int])``).

    Parameters
    ----------
    n_items : int
        Items in the dataset (>= 1).
    config : LoaderConfig
        ``batch_size``, ``shuffle``, ``drop_last`` and ``seed`` are used.
    num_batches : int, optional
        Batches per pass. Default: one pass over the items. More than the
        items hold cycles through them again (new permutations when
        shuffling), so a timing trial can be longer than the dataset.

    Returns
    -------
    torch.utils.data.BatchSampler
        Yields lists of ``batch_size`` indices (the last one shorter only
        with ``drop_last=False``); each pass draws a new order from a
        ``torch.Generator`` seeded with ``config.seed``.

    Raises
    ------
    DataError
        If no full batch can be formed (fewer items than ``batch_size`` with
        ``drop_last``), or ``n_items < 1``.
    ParameterError
        If ``num_batches`` < 1.
    """
    from torch.utils.data import BatchSampler, RandomSampler

    if not _is_int(n_items) or n_items < 1:
        raise DataError(f"the dataset holds {n_items!r} items; a loader needs at least one (check the folder)")
    if num_batches is not None and (not _is_int(num_batches) or num_batches < 1):
        raise ParameterError(f"num_batches={num_batches!r}: allowed: None or an int >= 1")
    _check_fits(int(n_items), config, num_batches)
    n_samples = None if num_batches is None else int(num_batches) * config.batch_size
    if config.shuffle:
        generator = torch.Generator()
        generator.manual_seed(config.seed)
        sampler: Iterable[int] = RandomSampler(range(n_items), num_samples=n_samples, generator=generator)
    else:
        sampler = [i % n_items for i in range(n_samples if n_samples is not None else n_items)]
    return BatchSampler(sampler, batch_size=config.batch_size, drop_last=config.drop_last)


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

    Raises
    ------
    DataError
        If the dataset cannot fill one batch (fewer items than ``batch_size``
        with ``drop_last``, or a batch sampler that yields nothing).
    ParameterError
        If ``config`` is not a LoaderConfig.
    """
    from torch.utils.data import DataLoader

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
        return DataLoader(dataset, **kwargs)


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


# --------------------------------------------------------------------------- guarded iteration


def _descendants() -> dict[int, Any]:
    """Live descendant processes of this one, by pid (psutil)."""
    import psutil

    try:
        return {p.pid: p for p in psutil.Process().children(recursive=True)}
    except psutil.Error:
        return {}


def _new_workers(before: dict[int, Any]) -> list[Any]:
    """Processes started since ``before``, less multiprocessing's helper processes.

    Drops the resource tracker and the forkserver server (the parent of the
    forkserver's workers), which appear the first time spawn or forkserver is used.
    """
    import psutil

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
    import psutil

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


def explain_loader_error(exc: BaseException, loader: Any, *, name: str = "loader") -> DataError | None:
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
        return DataError(
            f"{name}: no batch arrived within timeout={timeout:g} s (DataLoader timeout, LoaderConfig.timeout_s) "
            f"with {setting}. Likely cause: a worker is stuck in the dataset's __getitem__ (a read that never "
            f"returns, a lock or thread pool inherited through fork){spawn_hint}{pin_hint}. What to do: load one "
            "batch with num_workers=0 to see the problem directly; raise timeout_s only if one batch really takes "
            "that long"
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
    :attr:`LoaderConfig.timeout_s`); a hang, a dead worker, a dead
    pin-memory thread or a dataset that cannot be pickled raises
    :class:`~helpers.errors.DataError` (:func:`explain_loader_error`) after
    the workers have been stopped. Stopping a stuck worker waits up to
    5 s for it (torch's ``MP_STATUS_CHECK_INTERVAL``) before terminating it.

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
            err = explain_loader_error(exc, self.loader, name=self.name)
            if err is None:
                raise
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
            sampler with :func:`make_batch_sampler` ``num_batches=n`` so that
            it iterates across epochs).
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

    def _reap(self) -> None:
        import psutil

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


# --------------------------------------------------------------------------- memory


@dataclass(frozen=True)
class ProcessMemory:
    """Memory of one process, in bytes.

    Attributes
    ----------
    role : str
        ``"main"`` or ``"worker <i>"``.
    pid : int
    rss_bytes : int
        Resident set size: counts pages shared with other processes in full
        in every process (so summing RSS over workers overcounts).
    uss_bytes : int or None
        Unique set size: pages only this process has (what freeing it would
        give back). None where psutil cannot read it.
    pss_bytes : int or None
        Proportional set size: unique pages plus a share of shared pages
        (sums correctly over processes; Linux only). None elsewhere.
    """

    role: str
    pid: int
    rss_bytes: int
    uss_bytes: int | None
    pss_bytes: int | None


def process_memory(pid: int | None = None, role: str = "main") -> ProcessMemory:
    """Read RSS, USS and PSS of a process with psutil (``memory_full_info``).

    Parameters
    ----------
    pid : int, optional
        Default: this process.
    role : str
        Label stored in the result.

    Returns
    -------
    ProcessMemory

    Raises
    ------
    DataError
        If the process no longer exists.
    """
    import psutil

    try:
        proc = psutil.Process(pid)
        rss = int(proc.memory_info().rss)
        try:
            full = proc.memory_full_info()
            uss = int(full.uss)
            pss = int(full.pss) if hasattr(full, "pss") else None
        except (psutil.AccessDenied, AttributeError) as exc:
            logger.debug("USS/PSS of pid %s not readable: %r", pid, exc)
            uss = pss = None
    except psutil.NoSuchProcess as exc:
        raise DataError(f"process {pid} ({role}) exited before its memory could be read; measure while "
                        "the loader's iterator is alive") from exc
    return ProcessMemory(role=role, pid=int(proc.pid), rss_bytes=rss, uss_bytes=uss, pss_bytes=pss)


def _snapshot(moment: str, batches: int, worker_pids: Sequence[int], label: str) -> list[dict[str, Any]]:
    rows = []
    procs = [(None, "main")] + [(pid, f"worker {i}") for i, pid in enumerate(worker_pids)]
    for pid, role in procs:
        try:
            m = process_memory(pid, role)
        except DataError as exc:
            logger.warning("%s", exc)
            continue
        rows.append({
            "loader": label, "moment": moment, "batches": batches, "role": m.role, "pid": m.pid,
            "rss_mib": m.rss_bytes / _MIB,
            "uss_mib": None if m.uss_bytes is None else m.uss_bytes / _MIB,
            "pss_mib": None if m.pss_bytes is None else m.pss_bytes / _MIB,
        })
    return rows


def measure_epoch_memory(loader: Any, *, label: str = "loader", max_batches: int | None = None) -> "pd.DataFrame":
    """USS/PSS/RSS of the main process and each worker at the start and at the end of an epoch.

    "start" is read right after the first batch arrives (the workers are up
    and have done one task each), "end" right after the last batch arrives,
    while the workers are still alive. Workers are found as new child
    processes of this one (:class:`LoaderIterator`).

    Parameters
    ----------
    loader : torch.utils.data.DataLoader
        With ``len(loader)`` defined, or give ``max_batches``.
    label : str
        Stored in the ``loader`` column (to compare several loaders).
    max_batches : int, optional
        Stop after this many batches (the "end").

    Returns
    -------
    pandas.DataFrame
        One row per process per moment: ``loader`` (str), ``moment``
        ("start"/"end"), ``batches`` (int, received so far), ``role``
        ("main", "worker 0", ...), ``pid`` (int), ``rss_mib``, ``uss_mib``,
        ``pss_mib`` (MiB, float; None where unreadable).

    Raises
    ------
    ParameterError
        If the epoch length is unknown (no ``len`` and no ``max_batches``).
    DataError
        On a loader failure.
    """
    import pandas as pd

    if max_batches is None:
        try:
            max_batches = len(loader)
        except TypeError:
            raise ParameterError("measure_epoch_memory: the loader has no len(); pass max_batches") from None
    if max_batches < 1:
        raise DataError(f"{label}: the loader yields no batch (len {max_batches}); add items or lower batch_size")
    rows: list[dict[str, Any]] = []
    with iterate(loader, name=label) as it:
        for i, _batch in enumerate(it):
            if i == 0:
                rows += _snapshot("start", 1, it.worker_pids, label)
            if i + 1 >= max_batches:
                rows += _snapshot("end", i + 1, it.worker_pids, label)
                break
    return pd.DataFrame(rows, columns=["loader", "moment", "batches", "role", "pid", "rss_mib", "uss_mib",
                                       "pss_mib"])


class MetadataDataset(Dataset):
    """A batched dataset of per-sample metadata only, to show how worker memory grows (pytorch/pytorch#13246).

    Each item has a path, a caption and a label. ``storage="arrays"`` keeps
    them in three NumPy arrays (fixed-width unicode and int64): reading an
    item writes nothing to the shared pages. ``storage="objects"`` keeps
    them as a Python list of dicts, the way people often write it: reading
    an item writes the reference counts of the dict and its strings, so a
    forked worker copies every page it reads, and its USS grows through the
    epoch towards the size of the whole list.

    Parameters
    ----------
    n_items : int
        Items (>= 1).
    storage : {"arrays", "objects"}
    seed : int
        Seed of the generated captions and labels.

    Raises
    ------
    ParameterError
        For an invalid ``n_items`` or ``storage``.
    """

    def __init__(self, n_items: int, storage: str = "arrays", *, seed: int = 0) -> None:
        if not _is_int(n_items) or n_items < 1:
            raise ParameterError(f"n_items={n_items!r}: allowed: an int >= 1")
        if storage not in ("arrays", "objects"):
            raise ParameterError(f"storage={storage!r}: allowed: 'arrays' or 'objects'")
        self.storage = storage
        rng = np.random.default_rng(seed)
        labels = rng.integers(0, 10, size=n_items)
        words = np.array(["a cat", "a red cup", "a rocket", "grass", "a wall of bricks", "distant galaxies"])
        picks = rng.integers(0, len(words), size=n_items)
        if storage == "arrays":
            self.paths = np.array([f"images/{i:07d}.jpg" for i in range(n_items)])
            self.captions = words[picks]
            self.labels = labels.astype(np.int64)
            self.items = None
        else:
            self.items = [
                {"path": f"images/{i:07d}.jpg", "caption": f"{words[p]} number {i}", "label": int(lab)}
                for i, (p, lab) in enumerate(zip(picks.tolist(), labels.tolist()))
            ]

    def __len__(self) -> int:
        return len(self.items) if self.items is not None else int(self.labels.shape[0])

    def __getitem__(self, indices: list[int]) -> dict:
        """Read the metadata of a batch of items.

        Returns
        -------
        dict
            ``label``: int64 tensor (B,); ``caption_chars``: int64 tensor (B,),
            characters per caption (so every caption is really read).
        """
        if self.items is not None:
            rows = [self.items[i] for i in indices]
            labels = [r["label"] for r in rows]
            chars = [len(r["caption"]) + len(r["path"]) for r in rows]
        else:
            idx = np.asarray(indices, dtype=np.int64)
            labels = self.labels[idx]
            chars = np.strings.str_len(self.captions[idx]) + np.strings.str_len(self.paths[idx])
        return {"label": torch.as_tensor(np.asarray(labels, dtype=np.int64)),
                "caption_chars": torch.as_tensor(np.asarray(chars, dtype=np.int64))}


class FaultyDataset(Dataset):
    """A per-item dataset that fails inside DataLoader workers, to show and test the guards.

    In the main process (``num_workers=0``) items load normally, so the
    failure is clearly the worker's.

    Parameters
    ----------
    n_items : int
        Items (>= 1).
    fault : {"hang", "exit"}
        ``"hang"``: ``__getitem__`` sleeps forever in a worker (a read that
        never returns); ``"exit"``: the worker process ends with
        ``os._exit(exit_code)`` (as if killed).
    exit_code : int, default 1
    """

    def __init__(self, n_items: int = 16, fault: str = "hang", *, exit_code: int = 1) -> None:
        if fault not in ("hang", "exit"):
            raise ParameterError(f"fault={fault!r}: allowed: 'hang' or 'exit'")
        self.n_items, self.fault, self.exit_code = int(n_items), fault, int(exit_code)

    def __len__(self) -> int:
        return self.n_items

    def __getitem__(self, i: int) -> dict:
        if torch.utils.data.get_worker_info() is not None:
            if self.fault == "exit":
                os._exit(self.exit_code)
            while True:  # a hang: never returns
                time.sleep(3600)
        return {"label": torch.tensor(int(i), dtype=torch.int64)}


def batches_equal(a: Any, b: Any, keys: Sequence[str] = ("image", "tokens", "label")) -> bool:
    """True when two batches hold exactly the same tensors under ``keys``.

    Parameters
    ----------
    a, b : dict
        Batches; keys missing from both are ignored.
    keys : sequence of str

    Returns
    -------
    bool
    """
    for key in keys:
        if key not in a and key not in b:
            continue
        if key not in a or key not in b:
            return False
        x, y = torch.as_tensor(a[key]), torch.as_tensor(b[key])
        if x.shape != y.shape or x.dtype != y.dtype or not torch.equal(x, y):
            return False
    return True


# --------------------------------------------------------------------------- the sweep


@dataclass(frozen=True)
class LoaderSetting:
    """One point of the sweep.

    Attributes
    ----------
    num_workers : int
    prefetch_factor : int or None
        None with ``num_workers=0``.
    persistent_workers : bool
    """

    num_workers: int
    prefetch_factor: int | None = None
    persistent_workers: bool = False

    @property
    def label(self) -> str:
        """Short name, e.g. ``"workers=0"`` or ``"workers=2, prefetch=4, persistent"``."""
        if self.num_workers == 0:
            return "workers=0"
        return (f"workers={self.num_workers}, prefetch={self.prefetch_factor}"
                + (", persistent" if self.persistent_workers else ""))

    def config(self, base: LoaderConfig) -> LoaderConfig:
        """``base`` with this setting's three fields."""
        return base.with_(num_workers=self.num_workers, prefetch_factor=self.prefetch_factor,
                          persistent_workers=self.persistent_workers)

    @property
    def in_flight(self) -> int:
        """Batches a loader with this setting has requested but not yet delivered: ``num_workers x prefetch_factor``.

        torch dispatches that many tasks when an epoch starts and one more
        for each batch delivered (``_MultiProcessingDataLoaderIter``), so at
        any moment up to this many batches may be finished ahead of the
        consumer. 0 with ``num_workers=0``; a ``prefetch_factor`` of None
        counts as torch's default, :data:`TORCH_DEFAULT_PREFETCH`.
        """
        if self.num_workers == 0:
            return 0
        pf = self.prefetch_factor if self.prefetch_factor is not None else TORCH_DEFAULT_PREFETCH
        return self.num_workers * pf

    @property
    def min_timed_batches(self) -> int:
        """The shortest timing window worth trusting for this setting: two batches per worker (1 without workers).

        Each worker finishes batches at its own pace and phase; a window of
        fewer completions than ``2 x num_workers`` can fall inside one burst
        of nearly simultaneous completions (or between two), which makes it
        noisy and biased either way by that phase. :func:`run_sweep` counts
        such a window anyway; :meth:`SweepResult.short_windows` lists them.
        """
        return max(1, 2 * self.num_workers)


def sweep_settings(num_workers_list: Sequence[int], prefetch_factor_list: Sequence[int]) -> tuple[LoaderSetting, ...]:
    """The settings to time: ``num_workers x prefetch_factor x persistent_workers``.

    ``num_workers=0`` appears once (neither of the other two applies) and is
    always included, as the reference the verdict compares against.

    Parameters
    ----------
    num_workers_list : sequence of int
        Each >= 0; duplicates removed.
    prefetch_factor_list : sequence of int
        Each >= 1; must be non-empty when any ``num_workers > 0``.

    Returns
    -------
    tuple of LoaderSetting
        Sorted by workers, prefetch, persistent.

    Raises
    ------
    ParameterError
        For a negative worker count, a prefetch factor < 1, or an empty
        ``prefetch_factor_list`` with workers to sweep.
    """
    workers = sorted({int(w) for w in num_workers_list} | {0})
    if any(w < 0 for w in workers):
        raise ParameterError(f"num_workers_list={list(num_workers_list)!r}: every value must be >= 0")
    prefetch = sorted({int(p) for p in prefetch_factor_list})
    if any(p < 1 for p in prefetch):
        raise ParameterError(f"prefetch_factor_list={list(prefetch_factor_list)!r}: every value must be >= 1")
    if any(w > 0 for w in workers) and not prefetch:
        raise ParameterError("prefetch_factor_list is empty but num_workers_list has values > 0; give e.g. [2]")
    out = [LoaderSetting(0)]
    for w in workers:
        if w == 0:
            continue
        for p in prefetch:
            for persistent in (False, True):
                out.append(LoaderSetting(w, p, persistent))
    return tuple(out)


class _StampedCollate:
    """collate_fn wrapper that returns ``(batch, completion time)``; runs where the batch is made.

    The time is ``time.perf_counter()`` read right after the batch is
    collated, in the worker process (or in the main process with
    ``num_workers=0``). On Linux, macOS and Windows ``perf_counter`` reads a
    system-wide monotonic clock (``CLOCK_MONOTONIC``, ``mach_absolute_time``,
    ``QueryPerformanceCounter``), so it can be compared with the main
    process's; :func:`run_sweep` checks that anyway (no batch may be
    finished after it arrived) and falls back to arrival times if not.
    Module-level, so spawn and forkserver workers can unpickle it.
    """

    def __init__(self, inner: Callable[[Any], Any]) -> None:
        self.inner = inner

    def __call__(self, data: Any) -> tuple[Any, float]:
        out = self.inner(data)
        return out, time.perf_counter()


#: Slack, seconds, allowed between a batch's completion stamp and its arrival in the main process before the
#: two clocks are taken to disagree (the stamp is read before the batch is pickled and sent, so it must be earlier).
_CLOCK_SLACK_S = 1e-3


def completion_window(t0: float, completed_s: Sequence[float], n: int) -> tuple[float, float, int]:
    """The timing window of ``n`` batch completions, all after ``t0``, between two completions.

    The window opens at the first batch completion after ``t0`` and closes
    at the ``n``-th completion after that one, so it holds exactly ``n``
    completions and both of its ends are the same kind of moment (a batch
    just finished). Batches finished at or before ``t0`` (prepared ahead by
    workers while the consumer waited for an earlier batch) are outside it
    by construction, however late they are consumed. Opening on a completion
    instead of at ``t0`` also keeps out the work that was already under way
    at ``t0`` (up to one partly made batch per worker), which would
    otherwise be credited to the window.

    Parameters
    ----------
    t0 : float
        When the clock started, seconds on the same clock as ``completed_s``.
    completed_s : sequence of float
        Completion times of every batch delivered after the clock started,
        seconds (all of them: a batch finished inside the window but
        delivered after it must be included).
    n : int
        Completions the window must hold (>= 1).

    Returns
    -------
    start : float
        Completion time of the first batch finished after ``t0``.
    end : float
        Completion time of the ``n``-th batch finished after ``start``.
    prepared_ahead : int
        Batches in ``completed_s`` finished at or before ``t0`` (not counted).

    Raises
    ------
    ParameterError
        If ``n`` < 1.
    DataError
        If fewer than ``n + 1`` batches finished after ``t0``.
    """
    if not _is_int(n) or n < 1:
        raise ParameterError(f"completion_window: n={n!r}: allowed: an int >= 1")
    after = sorted(float(c) for c in completed_s if c > t0)
    ahead = len(completed_s) - len(after)
    if len(after) < n + 1:
        raise DataError(
            f"completion_window: only {len(after)} of the {len(completed_s)} batches finished after the clock "
            f"started ({ahead} were ready before it), {n + 1} needed; deliver at least n + 1 + num_workers x "
            "prefetch_factor batches after starting the clock"
        )
    return after[0], after[n], ahead


def speedup_plausibility(ratio: float, cores: int, *, baseline: str = "num_workers=0") -> str | None:
    """Why a measured speed-up of a CPU-bound loader over ``baseline`` cannot be real, or None when it can.

    A CPU-bound pipeline (decoding files already in the page cache) on
    ``cores`` usable cores can do at most ``cores`` times the work of the
    baseline, which itself keeps at least one core busy; more processes
    cannot add cores. A larger ratio means the measurement is wrong (batches
    counted that were made before the clock started, a window too short for
    the clock, other load on the machine during the baseline), not that the
    loader is that fast. A pipeline that waits on slow storage is not
    CPU-bound and is not covered by this check.

    Parameters
    ----------
    ratio : float
        Median time of the baseline / median time of the candidate (> 1: faster).
    cores : int
        Usable CPU cores (:func:`usable_cores`, >= 1).
    baseline : str
        Named in the sentence.

    Returns
    -------
    str or None
        A sentence for the reader when ``ratio > cores``; else None.

    Raises
    ------
    ParameterError
        If ``cores`` < 1.
    """
    if not _is_int(cores) or cores < 1:
        raise ParameterError(f"speedup_plausibility: cores={cores!r}: allowed: an int >= 1")
    if not math.isfinite(ratio) or ratio > cores:
        return (
            f"a {ratio:.2f}x speed-up over {baseline} on {cores} usable core(s) is not physically possible for a "
            f"CPU-bound pipeline (at most {cores}x: the baseline already keeps one core busy, and more processes "
            "add no cores), so this measurement is wrong - most likely other load on the machine or too little "
            "work timed; raise batches_per_trial and trials and run it on an otherwise idle machine"
        )
    return None


@dataclass(frozen=True)
class SweepResult:
    """The timings of a loader sweep.

    Attributes
    ----------
    trials : pandas.DataFrame
        One row per setting per trial: ``setting`` (label), ``num_workers``,
        ``prefetch_factor`` (float, NaN for 0 workers), ``persistent_workers``,
        ``trial``, ``position`` (order within the trial), ``first_batch_s``
        (iterator creation to first batch: worker start-up), ``elapsed_s``
        (seconds between the first batch finished after the clock started and
        the ``batches_per_trial``-th one after it; see :func:`run_sweep`),
        ``images`` (images in
        those batches), ``images_per_s``, ``in_flight`` (batches in flight,
        ``num_workers x prefetch_factor``), ``drained`` (batches delivered
        before the clock started), ``prepared_ahead`` (batches that were
        already finished when the clock started: not counted), ``clock``
        (``"completion"``: windows from the workers' completion times;
        ``"arrival"``: the fallback when the clocks disagree), ``skipped``
        (replaced images in the trial).
    settings : tuple of LoaderSetting
    batch_size : int
    batches_per_trial : int
    skipped : tuple of (str, str, int)
        Images replaced over the whole sweep, ``(file, reason, times)``.
    """

    trials: Any
    settings: tuple[LoaderSetting, ...]
    batch_size: int
    batches_per_trial: int
    skipped: tuple[tuple[str, str, int], ...] = ()

    def measurement(self, label: str):
        """The per-trial times of one setting as a :class:`helpers.timing.Measurement`.

        Parameters
        ----------
        label : str
            A setting's :attr:`LoaderSetting.label`.

        Returns
        -------
        helpers.timing.Measurement
            ``times_s``: seconds per trial for ``batches_per_trial`` batches;
            ``items_per_call``: images per trial (so ``rate`` is images/s).

        Raises
        ------
        ParameterError
            For an unknown label.
        """
        from helpers.timing import Measurement

        rows = self.trials[self.trials["setting"] == label]
        if rows.empty:
            raise ParameterError(f"no setting {label!r} in this sweep; known: {', '.join(s.label for s in self.settings)}")
        return Measurement(name=label, times_s=tuple(rows["elapsed_s"]), warmup=1,
                           items_per_call=float(self.batch_size * self.batches_per_trial))

    def summary(self) -> "pd.DataFrame":
        """One row per setting, fastest first.

        Returns
        -------
        pandas.DataFrame
            ``setting``, ``num_workers``, ``prefetch_factor``, ``persistent_workers``,
            ``images_per_s`` (median over trials), ``images_per_s_p25``/``_p75``
            (throughput at the time quartiles), ``first_batch_s`` (median,
            seconds), ``first_batch_max_s``, ``in_flight``,
            ``prepared_ahead_max`` (most batches found finished before the
            clock started in one trial, excluded from the timing), ``trials``.
        """
        import pandas as pd

        rows = []
        for s in self.settings:
            m = self.measurement(s.label)
            sub = self.trials[self.trials["setting"] == s.label]
            rows.append({
                "setting": s.label, "num_workers": s.num_workers,
                "prefetch_factor": s.prefetch_factor, "persistent_workers": s.persistent_workers,
                "images_per_s": m.rate, "images_per_s_p25": m.rate_p25, "images_per_s_p75": m.rate_p75,
                "first_batch_s": float(sub["first_batch_s"].median()),
                "first_batch_max_s": float(sub["first_batch_s"].max()), "in_flight": s.in_flight,
                "prepared_ahead_max": int(sub["prepared_ahead"].max()), "trials": m.repeats,
            })
        df = pd.DataFrame(rows)
        return df.sort_values("images_per_s", ascending=False, kind="stable").reset_index(drop=True)

    def short_windows(self) -> list[str]:
        """Labels of settings whose ``batches_per_trial`` is below :attr:`LoaderSetting.min_timed_batches`."""
        return [s.label for s in self.settings if self.batches_per_trial < s.min_timed_batches]

    def ranking(self) -> list[str]:
        """Setting labels, fastest (highest median images/s) first."""
        return list(self.summary()["setting"])

    def compare(self, a_label: str, b_label: str, *, seed: int = 0):
        """Speedup of setting B over setting A, with a bootstrap interval.

        Returns
        -------
        helpers.timing.Comparison
            ``ratio`` = median time of A / median time of B (> 1: B faster),
            interval from :func:`helpers.timing.bootstrap_ratio_ci` over the
            per-trial times. With few trials the interval is wide, and
            honestly so.
        """
        from helpers.timing import Comparison

        return Comparison.from_measurements(self.measurement(a_label), self.measurement(b_label), seed=seed)


def run_sweep(make_dataset: Callable[[LoaderSetting], Any], n_items: int, settings: Sequence[LoaderSetting], *,
              base: LoaderConfig, batches_per_trial: int, trials: int, acc: Any = None,
              collate_fn: Callable | None = None, name: str = "sweep") -> SweepResult:
    """Time each loader setting over ``trials`` rounds, in rotated order.

    One trial of one setting is one loader pass of ``drain +
    batches_per_trial + in_flight + 1`` batches (the sampler cycles through
    the data, so a trial may span several epochs of a small dataset):

    1. **drain**: the first ``max(1, num_workers x prefetch_factor)``
       batches (:attr:`LoaderSetting.in_flight`, every task torch sends out
       when the epoch starts) are delivered untimed. The first one's latency
       from iterator creation (worker start-up, or resuming persistent
       workers) is recorded apart as ``first_batch_s``.
    2. **the window**: the clock starts when the last drained batch arrives.
       Every batch carries the time it was *finished* (read in the worker
       right after collation, :class:`_StampedCollate`). The window opens at
       the first batch finished after the clock started and closes
       ``batches_per_trial`` completions later (:func:`completion_window`):
       a batch a worker finished before the clock started is never counted,
       however late it is consumed, so work done before the window cannot be
       credited to it; how many were found is recorded as
       ``prepared_ahead``. Both ends of the window are completions, so the
       partly made batches under way at either end balance out.
    3. **the tail**: the ``in_flight + 1`` batches still to come are
       delivered too (untimed), so that every batch finished inside the
       window is seen and no worker is left working while the next setting
       is timed.

    If a completion time is later than the batch's arrival (the clocks of
    the processes disagree), the trial falls back to arrival times: the
    window runs from the first batch's arrival after the drain to the
    ``batches_per_trial``-th arrival after it (logged, ``clock="arrival"``).

    The consumer does nothing with a batch, so it never falls behind and
    ``prefetch_factor`` can only matter through the workers' own scheduling;
    its real use, absorbing uneven training steps, is measured with compute
    in notebook 05. Round ``t`` visits the settings starting at position
    ``t mod n``, so a slow drift of the machine is spread over all settings.
    A persistent-workers setting keeps one loader for all its trials (that
    is what persistence buys: no worker start-up per epoch); the others
    start new workers each trial.

    Parameters
    ----------
    make_dataset : callable
        ``make_dataset(setting)`` returns the batched dataset for a setting
        (so a per-setting thread count can be chosen); module-level class
        instances only (workers may pickle them).
    n_items : int
        Items in that dataset (>= 1; fewer than one batch is fine: the
        sampler cycles).
    settings : sequence of LoaderSetting
        E.g. :func:`sweep_settings`.
    base : LoaderConfig
        Batch size, seed, timeout, pinning, start method; its worker fields
        are replaced by each setting's.
    batches_per_trial : int
        Batch completions timed per setting and trial (>= 1).
    trials : int
        Rounds (>= 1).
    acc : helpers.device.Accelerator, optional
        Decides pinning.
    collate_fn : callable, optional
        Module-level function (picklable); default torch's
        ``default_convert``. Wrapped to stamp completion times.
    name : str
        Used in error messages.

    Returns
    -------
    SweepResult

    Raises
    ------
    ParameterError
        For ``batches_per_trial`` or ``trials`` < 1 or no settings.
    DataError
        On a loader failure (the message names the setting).
    """
    import pandas as pd
    from torch.utils.data._utils.collate import default_convert

    if not _is_int(batches_per_trial) or batches_per_trial < 1:
        raise ParameterError(f"batches_per_trial={batches_per_trial!r}: allowed: an int >= 1")
    if not _is_int(trials) or trials < 1:
        raise ParameterError(f"trials={trials!r}: allowed: an int >= 1")
    settings = tuple(settings)
    if not settings:
        raise ParameterError("run_sweep: no settings to time")
    stamped = _StampedCollate(collate_fn if collate_fn is not None else default_convert)
    keep: dict[LoaderSetting, Any] = {}
    rows = []
    skipped = SkipLog()
    try:
        for t in range(trials):
            k = t % len(settings)
            order = settings[k:] + settings[:k]
            for position, s in enumerate(order):
                cfg = s.config(base)
                drain, tail = max(1, s.in_flight), s.in_flight + 1
                loader = keep.get(s)
                if loader is None:
                    sampler = make_batch_sampler(n_items, cfg, num_batches=drain + batches_per_trial + tail)
                    loader = make_loader(make_dataset(s), cfg, acc, batch_sampler=sampler, collate_fn=stamped)
                    if s.persistent_workers:
                        keep[s] = loader
                label = f"{name} [{s.label}]"
                n_skipped = 0
                completed: list[float] = []
                arrived: list[float] = []
                with iterate(loader, name=label) as it:
                    for batch, _done in it.take(drain):
                        n_skipped += skipped.add(batch)
                    t0 = time.perf_counter()
                    for batch, done in it:
                        arrived.append(time.perf_counter())
                        completed.append(done)
                        n_skipped += skipped.add(batch)
                    first_s = it.first_batch_s
                if len(completed) != batches_per_trial + tail:
                    raise DataError(f"{label}: expected {batches_per_trial + tail} batches after the drain, got "
                                    f"{len(completed)}; the loader's sampler was changed or ran out")
                late = max(c - a for c, a in zip(completed, arrived))
                if late <= _CLOCK_SLACK_S:
                    start, end, ahead = completion_window(t0, completed, batches_per_trial)
                    clock = "completion"
                else:
                    logger.warning("%s: a batch was stamped %.3f s after it arrived: the worker and main-process "
                                   "clocks disagree; timing this trial by arrival instead", label, late)
                    start, end, ahead, clock = arrived[0], arrived[batches_per_trial], 0, "arrival"
                elapsed = end - start
                images = batches_per_trial * base.batch_size
                rows.append({
                    "setting": s.label, "num_workers": s.num_workers,
                    "prefetch_factor": float("nan") if s.prefetch_factor is None else float(s.prefetch_factor),
                    "persistent_workers": s.persistent_workers, "trial": t, "position": position,
                    "first_batch_s": first_s, "elapsed_s": elapsed, "images": images,
                    "images_per_s": images / elapsed if elapsed > 0 else float("nan"),
                    "in_flight": s.in_flight, "drained": drain, "prepared_ahead": ahead, "clock": clock,
                    "skipped": n_skipped,
                })
                logger.info("%s trial %d: %.0f images/s, first batch %.3f s, %d batch(es) ready before the clock "
                            "(not counted)", label, t, rows[-1]["images_per_s"], first_s, ahead)
    finally:
        for loader in keep.values():
            close_loader(loader)
    return SweepResult(trials=pd.DataFrame(rows), settings=settings, batch_size=base.batch_size,
                       batches_per_trial=batches_per_trial, skipped=skipped.entries())
