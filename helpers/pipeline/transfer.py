"""Host-to-device copies: pageable, pinned per batch, the DataLoader's pin thread, a reused pinned buffer.

A copy from ordinary (pageable) host memory cannot be handed to the device's
DMA engine directly: the driver first copies it into a page-locked (pinned)
staging buffer of its own, in pieces, and waits for each piece. From memory
that is already pinned the DMA engine reads directly and the copy can be
asynchronous (``non_blocking=True``). Pinning is not free: it allocates
page-locked memory and costs a host memcpy, and doing it on every batch can
cost more than it saves (pytorch/pytorch#124456). So this module provides
the ways to get a batch onto the device, each as a zero-argument copy
(:func:`copy_method`), and checks that each delivers the host's bytes
(:func:`check_methods`):

``pageable``
    ``host.to(device)``: the driver stages the copy itself.
``pin_per_batch``
    ``host.pin_memory().to(device, non_blocking=True)``: pin, then copy, on
    the training thread, every batch.
``loader_pin_thread``
    ``DataLoader(pin_memory=True, num_workers=1)``: a worker process makes the
    batch, the loader's pin thread (it exists only with ``num_workers > 0``,
    ``torch/utils/data/dataloader.py``) copies it into pinned memory in the
    background, and the training thread only issues the non-blocking copy.
``pinned_buffer``
    One pinned buffer allocated once (:class:`PinnedStaging`):
    ``buffer.copy_(host)`` then a non-blocking copy; before the buffer is
    overwritten, the previous copy's event is waited for, so the DMA never
    reads half-overwritten data.

Without an accelerator none of this applies: ``Tensor.pin_memory()`` raises
``RuntimeError: Cannot access accelerator device when none is available``
(pytorch/pytorch#73003; docs/ascend_api_factcheck.md, section 1).
Every function here decides from ``acc.capabilities.pinned_memory``
(:func:`pinning_applicability`): on a CPU, :func:`check_methods` returns
nothing and :func:`copy_method` / :class:`PinnedStaging` raise
:class:`helpers.errors.DeviceUnavailableError` with the reason.

Timing the methods and deciding between them is notebook 04's experiment
(:mod:`helpers.experiments.pinning`); the link's limit is a machine fact
(:mod:`helpers.diagnose.pcie`). This module imports torch and nothing
heavier (no pandas): a ``loader_pin_thread`` worker started by spawn
imports it to unpickle :class:`_CloneDataset`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader

from helpers.errors import DataError, DeviceUnavailableError, ParameterError

if TYPE_CHECKING:  # pragma: no cover - typing only
    from helpers.device import Accelerator

logger = logging.getLogger(__name__)

__all__ = [
    "METHODS",
    "Applicability",
    "pinning_applicability",
    "PinnedStaging",
    "copy_method",
    "check_methods",
    "BATCH_METHODS",
    "map_tensors",
    "batch_nbytes",
    "batch_copy_method",
]

#: The four copy methods compared, in the order they are shown.
METHODS: tuple[str, ...] = ("pageable", "pin_per_batch", "loader_pin_thread", "pinned_buffer")


# --------------------------------------------------------------------------- applicability


@dataclass(frozen=True)
class Applicability:
    """Whether pinned memory and asynchronous copies apply on this device.

    Attributes
    ----------
    applicable : bool
        True on an accelerator with pinned memory.
    reason : str
        What pinning is here, or why it does not apply.
    """

    applicable: bool
    reason: str


def pinning_applicability(acc: "Accelerator") -> Applicability:
    """Decide from the device's capabilities whether pinned host memory applies.

    Parameters
    ----------
    acc : helpers.device.Accelerator

    Returns
    -------
    Applicability
        Not applicable on a CPU (nothing is copied to a device, and
        ``Tensor.pin_memory()`` raises without an accelerator: pytorch/pytorch#73003),
        with the capability's own explanation as the reason.
    """
    cap = acc.capabilities.pinned_memory
    if not cap.available:
        return Applicability(False, f"pinned memory does not apply on {acc.kind} ({cap.detail})")
    return Applicability(True, f"pinned memory is available on {acc.kind} ({cap.detail})")


# --------------------------------------------------------------------------- the methods


def _require_applicable(acc: "Accelerator") -> None:
    app = pinning_applicability(acc)
    if not app.applicable:
        raise DeviceUnavailableError(f"{app.reason}. Check pinning_applicability(acc) first and record "
                                     "'not applicable' instead of copying")


class PinnedStaging:
    """A pinned host buffer allocated once and reused for every copy.

    Each :meth:`copy` writes the host tensor into the buffer (a host memcpy),
    issues a non-blocking copy to the device and records an event after it.
    The next :meth:`copy` first waits for that event, so the buffer is never
    overwritten while the DMA engine still reads it; without that wait an
    asynchronous copy could carry half of one batch and half of the next.

    Parameters
    ----------
    acc : helpers.device.Accelerator
        An accelerator with pinned memory.
    nbytes : int
        Capacity of the buffer in bytes (>= 1).

    Raises
    ------
    DeviceUnavailableError
        When pinned memory does not apply on ``acc`` (a CPU).
    ParameterError
        For ``nbytes`` < 1.
    """

    def __init__(self, acc: "Accelerator", nbytes: int) -> None:
        _require_applicable(acc)
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 1:
            raise ParameterError(f"nbytes must be a positive int, got {nbytes!r}")
        self.acc = acc
        self.nbytes = nbytes
        # .pin_memory() on an empty tensor, not torch.empty(pin_memory=True): one code path to pin.
        self.buffer = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
        self._done = None
        self.waits = 0

    def copy(self, host: "torch.Tensor") -> "torch.Tensor":
        """Copy ``host`` to the device through the buffer.

        Parameters
        ----------
        host : torch.Tensor
            Any shape and dtype, on the CPU, at most ``nbytes`` bytes.

        Returns
        -------
        torch.Tensor
            Same shape and dtype on ``acc.device``; the copy may still be in
            flight (use it on the current stream, or synchronize).

        Raises
        ------
        ParameterError
            If ``host`` is larger than the buffer.
        """
        n = host.numel() * host.element_size()
        if n > self.nbytes:
            raise ParameterError(f"a {n}-byte tensor does not fit the {self.nbytes}-byte pinned buffer; "
                                 "make the buffer as large as the largest batch")
        if self._done is not None:
            self._done.synchronize()  # the previous DMA has finished reading the buffer
            self.waits += 1
        flat = host.contiguous().view(-1).view(torch.uint8)
        staged = self.buffer[:n]
        staged.copy_(flat)
        out = staged.to(self.acc.device, non_blocking=True)
        if out.data_ptr() == staged.data_ptr():  # the "device" is the host itself: .to() did not copy
            out = out.clone()
        if self._done is None:
            self._done = self.acc.new_event()
        if self._done is not None:
            self._done.record()
        else:  # no events on this device: wait by synchronizing instead
            self.acc.synchronize()
        return out.view(host.dtype).view(host.shape)


def map_tensors(fn: Callable[["torch.Tensor"], Any], batch: Any, *, where: str = "batch") -> Any:
    """Apply ``fn`` to every tensor of a nested batch, keeping its structure.

    Parameters
    ----------
    fn : callable
        Tensor -> tensor (e.g. ``lambda t: t.to(device)``).
    batch : tensor, or dict, list, tuple, namedtuple or dataclass instance of them (nested)
        Plain leaves (numbers, strings, bytes, None) are kept as they are.
    where : str
        The name of ``batch`` in error messages.

    Returns
    -------
    The same structure, with ``fn``'s tensors.

    Raises
    ------
    DataError
        For a leaf that is neither a tensor nor a plain value (e.g. a PIL image left uncollated), naming its
        path in the batch.
    """
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, Mapping):
        return {k: map_tensors(fn, v, where=f"{where}[{k!r}]") for k, v in batch.items()}
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return dataclasses.replace(batch, **{f.name: map_tensors(fn, getattr(batch, f.name), where=f"{where}.{f.name}")
                                             for f in dataclasses.fields(batch) if f.init})
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(map_tensors(fn, v, where=f"{where}.{n}") for n, v in zip(batch._fields, batch)))
    if isinstance(batch, (list, tuple)):
        return type(batch)(map_tensors(fn, v, where=f"{where}[{i}]") for i, v in enumerate(batch))
    if batch is None or isinstance(batch, (bool, int, float, str, bytes)):
        return batch
    raise DataError(f"the batch holds a {type(batch).__name__} at {where}: a batch must be tensors (in dicts, lists, "
                    "tuples or dataclasses); convert it in the dataset or pass a collate function")


def batch_nbytes(batch: Any) -> int:
    """Bytes of all the tensors of a nested batch (:func:`map_tensors`'s structures)."""
    sizes: list[int] = []
    map_tensors(lambda t: sizes.append(t.numel() * t.element_size()), batch)
    return sum(sizes)


#: The copy methods that apply to any job's batch (a nested structure of tensors): a reused pinned buffer
#: needs one flat tensor of fixed size, so it is measured on the built-in job's uint8 batch only.
BATCH_METHODS: tuple[str, ...] = ("pageable", "pin_per_batch", "loader_pin_thread")


class _CloneBatch:
    """Map-style dataset returning a fresh copy of one nested batch per item (as a collate would make it).

    Module-level so that DataLoader workers can unpickle it under spawn.
    """

    def __init__(self, batch: Any, length: int) -> None:
        self.batch, self.length = batch, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i):
        return map_tensors(torch.Tensor.clone, self.batch)


@contextlib.contextmanager
def batch_copy_method(method: str, acc: "Accelerator", batch: Any, to_device: Callable[..., Any], *,
                      first_batch_timeout_s: float = 120.0) -> Iterator[Callable[[], Any]]:
    """A zero-argument function that copies a job's nested host ``batch`` to the device by ``method``.

    Parameters
    ----------
    method : str
        One of :data:`BATCH_METHODS`: ``pageable`` (``to_device(batch, non_blocking=False)``),
        ``pin_per_batch`` (every tensor ``pin_memory()``-ed on the training thread, then a non-blocking
        copy), ``loader_pin_thread`` (a DataLoader worker makes the batch and its pin thread pins it, which
        torch does for dicts, lists, tuples and namedtuples of tensors, leaving a dataclass's tensors pageable;
        the loop issues the non-blocking copy).
    acc : helpers.device.Accelerator
        An accelerator with pinned memory.
    batch : nested host batch
        As the job's dataset makes it (tensors on the CPU).
    to_device : callable
        ``to_device(batch, non_blocking=bool) -> device batch`` (the job's own copy, e.g. ``Job.to_device``).
    first_batch_timeout_s : float
        The loader's timeout for ``loader_pin_thread``.

    Yields
    ------
    callable
        ``fn() -> device batch``; the copy may still be in flight.

    Raises
    ------
    ParameterError
        For a method not in :data:`BATCH_METHODS`.
    DeviceUnavailableError
        Without pinned memory (a CPU).
    """
    if method not in BATCH_METHODS:
        raise ParameterError(f"unknown batch copy method {method!r}; choose one of {', '.join(BATCH_METHODS)}")
    _require_applicable(acc)
    if method == "pageable":
        yield lambda: to_device(batch, non_blocking=False)
    elif method == "pin_per_batch":
        yield lambda: to_device(map_tensors(torch.Tensor.pin_memory, batch), non_blocking=True)
    else:  # loader_pin_thread
        loader = DataLoader(_CloneBatch(batch, 1 << 30), batch_size=None, num_workers=1, pin_memory=True,
                            prefetch_factor=2, timeout=float(first_batch_timeout_s))
        it = iter(loader)
        try:
            yield lambda: to_device(next(it), non_blocking=True)
        finally:
            del it


class _CloneDataset:
    """Map-style dataset returning a fresh copy of one tensor per item (what a real collate returns).

    Module-level so that DataLoader workers can unpickle it under spawn (Optimization-AI/LibAUC#60).
    """

    def __init__(self, tensor, length: int) -> None:
        self.tensor = tensor
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i):
        return self.tensor.clone()


@contextlib.contextmanager
def copy_method(method: str, acc: "Accelerator", host: "torch.Tensor", *,
                first_batch_timeout_s: float = 120.0) -> Iterator[Callable[[], "torch.Tensor"]]:
    """A zero-argument function that copies ``host`` to the device by ``method``.

    Parameters
    ----------
    method : str
        One of :data:`METHODS` (see the module docstring).
    acc : helpers.device.Accelerator
        An accelerator with pinned memory.
    host : torch.Tensor
        The host data (pageable, on the CPU).
    first_batch_timeout_s : float, default 120
        ``loader_pin_thread`` only: the DataLoader's ``timeout``, so a worker
        or pin thread that hangs becomes an error instead of a silent wait
        (pytorch/pytorch#47445).

    Yields
    ------
    callable
        ``fn() -> torch.Tensor`` on ``acc.device``, equal to ``host``; the
        copy may still be in flight (synchronize before timing its end).

    Raises
    ------
    ParameterError
        For an unknown method.
    DeviceUnavailableError
        On a device without pinned memory (a CPU): check
        :func:`pinning_applicability` first.
    """
    if method not in METHODS:
        raise ParameterError(f"unknown copy method {method!r}; choose one of {', '.join(METHODS)}")
    _require_applicable(acc)
    dev = acc.device
    if method == "pageable":
        yield lambda: host.to(dev)
    elif method == "pin_per_batch":
        yield lambda: host.pin_memory().to(dev, non_blocking=True)
    elif method == "pinned_buffer":
        staging = PinnedStaging(acc, host.numel() * host.element_size())
        yield lambda: staging.copy(host)
    else:  # loader_pin_thread
        loader = DataLoader(_CloneDataset(host, 1 << 30), batch_size=None, num_workers=1, pin_memory=True,
                            prefetch_factor=2, timeout=float(first_batch_timeout_s))
        it = iter(loader)
        try:
            yield lambda: next(it).to(dev, non_blocking=True)
        finally:
            del it  # shuts the worker and the pin thread down


def check_methods(acc: "Accelerator", nbytes: int = 1 << 20, *, seed: int = 0,
                  methods: Sequence[str] = METHODS) -> dict[str, bool]:
    """Check that every method delivers exactly the host bytes to the device.

    Each method copies a random uint8 pattern (three times in a row, so that
    a reused buffer is overwritten while a copy could be in flight); each
    result is synchronized and compared bit for bit with the source.

    Parameters
    ----------
    acc : helpers.device.Accelerator
    nbytes : int, default 1 MiB
    seed : int
    methods : sequence of str

    Returns
    -------
    dict
        ``{method: True when every copy equalled its source}``; empty when
        pinning does not apply on ``acc`` (a CPU).
    """
    if not pinning_applicability(acc).applicable:
        return {}
    g = torch.Generator().manual_seed(seed)
    out: dict[str, bool] = {}
    for method in methods:
        ok = True
        for k in range(3):
            host = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g)
            with copy_method(method, acc, host) as fn:
                results = [fn() for _ in range(2)]
                acc.synchronize()
                ok &= all(torch.equal(r.cpu(), host) for r in results)
        out[method] = bool(ok)
    return out
