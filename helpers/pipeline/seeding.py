"""Per-worker seeding of DataLoader workers: ``random``, NumPy, torch and the RNG objects a dataset holds.

:func:`worker_init_fn` reseeds ``random``, NumPy's global generator and torch
in each worker from the worker's seed *and the distributed rank*
(:func:`current_rank`), and reseeds the RNG objects a dataset holds
(pytorch/pytorch#5059; protocol below).
:meth:`helpers.pipeline.loader.LoaderConfig.to_kwargs` passes it to every
loader with workers. Workers started with ``spawn`` or ``forkserver`` unpickle
it by module path, so this module imports only numpy, torch and
:mod:`helpers.errors`.

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

Per-sample seeding (:class:`SampleSeeder`)
------------------------------------------
A comparison of two configurations of a user's job (num_workers 0 against 2, a prefetcher against the
synchronous copy, the baseline against the optimized job) is only fair when the same sample gets the same
random augmentation in both. Per-worker seeding cannot give that (which worker reads a sample depends on
the configuration), so the workbook's wrapper of a user's dataset seeds, before each ``dataset[i]``,
Python's ``random``, NumPy's global generator, torch's default generator (which torchvision's transforms
draw from) and the RNG objects the dataset holds, from ``(seed, epoch, index)``; and restores every one of
them after the batch, so the rest of the process (the model's initialization, the user's own code) sees
its generators as it left them.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import numbers
import os
import random
import types
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from helpers.errors import ParameterError

logger = logging.getLogger(__name__)

__all__ = [
    "current_rank",
    "reseed_dataset_rngs",
    "WorkerSeeds",
    "seed_worker",
    "worker_init_fn",
    "SampleSeeder",
]

#: Containers with more items than this are not scanned for RNG objects
#: (walking a large list of metadata would touch every item's reference count).
MAX_SCAN_CONTAINER = 32


# --------------------------------------------------------------------------- the rank


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
    unpickle it; :meth:`helpers.pipeline.loader.LoaderConfig.to_kwargs`
    passes it bound to the rank (``functools.partial(worker_init_fn,
    rank=r)``), read in the main process where a process group may exist.

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


# --------------------------------------------------------------------------- per-sample seeding


_MASK64 = (1 << 64) - 1


def _mix64(x: int) -> int:
    """SplitMix64's finalizer (Steele, Lea and Flood, "Fast splittable pseudorandom number generators",
    OOPSLA 2014): a 64-bit integer to a well-mixed 64-bit integer, a few microseconds in Python where a
    ``numpy.random.SeedSequence`` takes a few hundred."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


class SampleSeeder:
    """Seed every generator a sample's augmentation can draw from, per ``(seed, epoch, index)``.

    Used around a batch (:meth:`batch`) and before each sample (:meth:`seed_sample`) by
    :class:`helpers.jobs.base.PerItemBatches`; see the module docstring for why. The same
    ``(seed, epoch, index)`` gives the same draws from ``random``, ``numpy.random``, torch's default
    generator and the dataset's own RNG objects (found once, as :func:`reseed_dataset_rngs` finds them),
    in the main process and in every DataLoader worker.

    Parameters
    ----------
    seed : int
        The job's seed (>= 0).
    dataset : object, optional
        The user's dataset, scanned once for RNG objects (``numpy.random.Generator``, ``RandomState``,
        ``torch.Generator``, ``random.Random``) down to ``max_depth`` attribute levels.
    max_depth : int, default 2

    Raises
    ------
    ParameterError
        If ``seed`` is not a non-negative integer.
    """

    def __init__(self, seed: int, dataset: Any = None, *, max_depth: int = 2) -> None:
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
            raise ParameterError(f"SampleSeeder: seed must be an int >= 0, got {seed!r}")
        self.seed = int(seed)
        self._dataset = dataset
        self._max_depth = max_depth
        self._targets: list[tuple[str, Any]] | None = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_targets"] = None  # a worker's copy finds the RNG objects of its own copy of the dataset
        return state

    def _objects(self) -> list[tuple[str, Any]]:
        if self._targets is None:
            targets: list[tuple[str, Any]] = []
            attrs = getattr(self._dataset, "__dict__", None)
            if isinstance(attrs, dict):
                seen = {id(self._dataset)}
                for name in sorted(attrs):
                    _scan_targets(attrs[name], f"dataset.{name}", self._max_depth - 1, seen, targets)
            self._targets = targets
        return self._targets

    @property
    def reseeded(self) -> tuple[str, ...]:
        """The dataset's RNG objects seeded per sample, by attribute path (e.g. ``("dataset.rng",)``)."""
        return tuple(path for path, _ in self._objects())

    def seed_sample(self, epoch: int, index: int) -> None:
        """Seed ``random``, NumPy's global generator, torch's and the dataset's RNG objects for one sample.

        Parameters
        ----------
        epoch : int
            The epoch the sample is read in (>= 0).
        index : int
            The sample's index in the dataset (>= 0).
        """
        key = _mix64(_mix64(_mix64(self.seed) ^ int(epoch)) ^ int(index))
        random.seed(_mix64(key + 1))
        np.random.seed(_mix64(key + 2) & 0xFFFFFFFF)
        # the CPU generator itself: torch.manual_seed also seeds every accelerator's (about 1 ms a call), and
        # augmentations (torchvision's among them) draw on the CPU in the dataset
        torch.default_generator.manual_seed(_mix64(key + 3) >> 1)
        objects = self._objects()
        if objects:
            for k, (_, rng) in enumerate(objects):
                _reseed_one(rng, np.random.SeedSequence(_mix64(key + 4 + k)))

    @contextlib.contextmanager
    def batch(self):
        """Save the state of every generator :meth:`seed_sample` touches, and restore it on exit."""
        py_state, np_state, torch_state = random.getstate(), np.random.get_state(), torch.default_generator.get_state()
        saved = [(rng, _get_state(rng)) for _, rng in self._objects()]
        try:
            yield self
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)
            torch.default_generator.set_state(torch_state)
            for rng, state in saved:
                _set_state(rng, state)


def _get_state(rng: Any) -> Any:
    if isinstance(rng, np.random.Generator):
        return rng.bit_generator.state
    if isinstance(rng, np.random.RandomState):
        return rng.get_state()
    if isinstance(rng, torch.Generator):
        return rng.get_state()
    return rng.getstate()


def _set_state(rng: Any, state: Any) -> None:
    if isinstance(rng, np.random.Generator):
        rng.bit_generator.state = state
    elif isinstance(rng, np.random.RandomState):
        rng.set_state(state)
    elif isinstance(rng, torch.Generator):
        rng.set_state(state)
    else:
        rng.setstate(state)
