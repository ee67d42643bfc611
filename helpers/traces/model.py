"""What a profiler trace says about one rank: its steps, split into phases, and what the trace cannot tell.

The readers (:mod:`helpers.traces.kineto` for torch.profiler's Chrome-trace JSON, :mod:`helpers.traces.ascend`
for a torch_npu profiler folder) each return one :class:`RankTrace` per rank; :mod:`helpers.traces.cluster`
finds the ranks of a folder; :mod:`helpers.traces.analysis` turns them into notebook 01's verdict. This
module holds only the shared shapes, so that the readers and the analysis agree on units and names.

All times are seconds (float). A phase the trace cannot measure is ``None``, never 0: "no device idle time
in a CPU-only trace" is not "zero idle time".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from helpers.errors import DataError

__all__ = ["TraceError", "StepPhases", "RankTrace", "HOST_PHASES", "DEVICE_PHASES", "EXPOSED_PHASES", "SYNC_TARGETS"]

#: Host-side phases of a step, in seconds of wall time on the training thread.
HOST_PHASES: tuple[str, ...] = ("data", "h2d", "optimizer")
#: Device-side phases: busy computing, communication not hidden behind compute, idle (Ascend's Free; on CUDA
#: the gaps on the compute stream, HTA's idle time).
DEVICE_PHASES: tuple[str, ...] = ("compute", "comm_exposed", "idle")
#: The phases whose sum is the exposed input of notebook 01: the step waits for the next batch and its copy.
EXPOSED_PHASES: tuple[str, ...] = ("data", "h2d")
#: What a host-side synchronize call (``cudaStreamSynchronize``, ``cudaDeviceSynchronize``, a synchronous
#: ``cudaMemcpy``, their HIP twins) can wait for: the device work that ran while the host waited, or nothing.
SYNC_TARGETS: tuple[str, ...] = ("communication", "compute", "copy", "idle")


class TraceError(DataError):
    """A trace that cannot be read: the message names the file and what is missing or wrong, and what to do."""


@dataclass(frozen=True)
class StepPhases:
    """One training step of one rank, as the trace shows it.

    Parameters
    ----------
    step : int
        The step's number: N of the ``ProfilerStep#N`` annotation, or the Ascend ``Step`` column.
    step_s : float
        The step's wall time: the host's ``ProfilerStep#N`` span, seconds (Ascend, where trace_view.json lacks
        it: ``Preparing + Stage + Bubble`` of step_trace_time.csv, see :mod:`helpers.traces.ascend`).
    data, optimizer : float or None
        Host time inside the step: waiting for the next batch (the DataLoader's ``__next__``), the optimizer's
        step; None where the trace has no such annotation.
    h2d : float or None
        The host-to-device copy the step waits for. On a trace that records a device: the device's own copy time
        (``Memcpy HtoD``) not overlapped by its computation or communication, never the host's wait for it (that
        wait is ``sync_wait``, attributed to what the device was doing). On a CPU trace: the host's copy after
        the batch. None where the trace cannot tell.
    compute, comm_exposed, idle : float or None
        Device time inside the step: busy computing, communication not overlapped with computation, idle;
        None where the trace records no device (a CPU-only trace) or the format does not say. On a CPU trace
        ``compute`` is what the training thread spends in recorded operators outside data and copy (the
        computation, measured, never derived as the rest of the step) and ``idle`` is None.
    comm : float or None
        All communication time (overlapped or not), seconds.
    other : float or None
        Step time the trace attributes to no phase: on a CPU trace, the training thread's gaps between recorded
        operators (Python, the framework) that are not communication; None where not computed.
    sync_wait : float or None
        Host time in synchronize calls inside the step (seconds); None where the trace records no such calls.
    sync_on : mapping of str to float, optional
        ``sync_wait`` split by what the device did meanwhile (keys of :data:`SYNC_TARGETS`), seconds.
    """

    step: int
    step_s: float
    data: float | None = None
    h2d: float | None = None
    optimizer: float | None = None
    compute: float | None = None
    comm_exposed: float | None = None
    idle: float | None = None
    comm: float | None = None
    other: float | None = None
    sync_wait: float | None = None
    sync_on: Any = None

    def __post_init__(self) -> None:
        for name in ("step_s", *HOST_PHASES, *DEVICE_PHASES, "comm", "other", "sync_wait"):
            v = getattr(self, name)
            if v is not None and (not math.isfinite(v) or v < 0):
                raise TraceError(f"step {self.step}: {name} = {v!r} s; a phase time must be finite and >= 0")
        for key, v in dict(self.sync_on or {}).items():
            if key not in SYNC_TARGETS or not math.isfinite(v) or v < 0:
                raise TraceError(f"step {self.step}: sync_on[{key!r}] = {v!r} s; keys are {SYNC_TARGETS}, times "
                                 "finite and >= 0")

    @property
    def exposed_s(self) -> float | None:
        """data + h2d (seconds), the time the step waits for input; None when neither was measured."""
        parts = [getattr(self, p) for p in EXPOSED_PHASES]
        if all(p is None for p in parts):
            return None
        return float(sum(p for p in parts if p is not None))

    @property
    def exposed_fraction(self) -> float | None:
        """exposed_s / step_s (0..1, clipped), as notebook 01 computes it per step; None when unmeasured."""
        e = self.exposed_s
        if e is None or self.step_s <= 0:
            return None
        return min(1.0, e / self.step_s)


@dataclass(frozen=True)
class RankTrace:
    """Everything one rank's trace says, read once and kept small (no events are held).

    Parameters
    ----------
    source : pathlib.Path
        The file (Kineto JSON, maybe gzipped) or folder (``*_ascend_pt``) read.
    format : str
        "kineto" or "ascend".
    device_kind : str
        "cpu", "cuda", "rocm", "mtia", "xpu", "npu" or "privateuse1": the device activity the trace recorded, named
        as it is ("cpu" when it recorded only the host).
    steps : tuple of StepPhases
        The annotated steps, in order.
    rank, world_size : int or None
        From the file's own metadata (Kineto's ``distributedInfo``; the Ascend folder's profiler_info / rank id);
        None for a single-process run.
    node : str or None
        The host the rank ran on, where the trace says it (Kineto worker name, Ascend's host name).
    run_id : str or None
        What identifies the run the rank belongs to (e.g. the process group's configuration and the start time's
        hour), so that ranks of different runs mixed in one folder are caught; None where nothing identifies it.
    top_ops : tuple of dict
        The operators that took the most time, each ``{"name", "calls", "self_ms", "where"}`` with
        where "host" or "device"; at most 20, largest first.
    limits : tuple of str
        What this trace cannot tell, in words (e.g. "a CPU-only trace records no device idle time").
    provenance : dict
        JSON-ready facts about the input: ``path``, ``bytes``, ``mtime`` (ISO 8601), ``reader``, the profiler's
        version where the file says it.
    collectives : tuple of (int, str, float)
        Each collective that starts inside a step, in order: (step number, name, duration in seconds): NCCL/RCCL
        kernels on a device, gloo's ``gloo:*`` spans on a CPU. A collective ends on every rank at about the
        same time, so the rank that arrives last has the shortest one: the input of
        :mod:`helpers.traces.arrival`. Empty where the trace records none.
    compute_mix : helpers.bottleneck.ComputeMix or None
        The precision of the matrix work, from the kernel names and the matrix operators' ``Input type``
        (:func:`helpers.traces.precision.compute_mix`); None where the trace names none.
    """

    source: Path
    format: str
    device_kind: str
    steps: tuple[StepPhases, ...]
    rank: int | None = None
    world_size: int | None = None
    node: str | None = None
    run_id: str | None = None
    top_ops: tuple[dict[str, Any], ...] = ()
    limits: tuple[str, ...] = ()
    provenance: dict[str, Any] = field(default_factory=dict)
    collectives: tuple[tuple[int, str, float], ...] = ()
    compute_mix: Any = None

    @property
    def label(self) -> str:
        """"rank N" (with its node when known), or the file's name for a single-process trace."""
        if self.rank is None:
            return self.source.name
        return f"rank {self.rank}" + (f" ({self.node})" if self.node else "")
