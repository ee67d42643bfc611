"""Which side of a training step to fix first: host-bound, balanced or device-bound, and the notebook to open next.

One classification, computed here and read by every place that names a job's bottleneck: notebook 01's
verdict (:mod:`helpers.experiments.baseline`), ``diagnose`` (:mod:`helpers.experiments.three_run`), the
three-line instrument (:mod:`helpers.workbook.instrument`), the report, and the trace reader.

The rule compares the two levers of a serial step whose exposed input is X of the step time:

- making the input free saves X of the step;
- making the computation twice as fast saves (1 - X) / 2.

A job whose exposed input is at most the threshold (notebook 01's ``host_bound_threshold``, 0.10 by
default) is **device-bound**. Above it, the job is **host-bound** when the input is the larger lever
(X >= (1 - X) / 2, i.e. X >= 1/3), else **balanced**: the input is worth fixing, but a 2x faster
computation would save more. The notebook to open next follows the label and what the machine allows:
DataLoader workers hide input only on cores the step leaves idle (:func:`spare_cores`); with none (on a CPU
the computation itself uses the cores), the advice points at the levers that can pay there, a cheaper sample
and a cheaper computation, instead of the workers.

Part of the foundation: imports only :mod:`helpers.checklist`, :mod:`helpers.device` (no torch at import)
and :mod:`helpers.errors`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from helpers.checklist import notebook_ref
from helpers.device import usable_cores
from helpers.errors import ParameterError

__all__ = ["BALANCED", "Bottleneck", "DEVICE_BOUND", "HOST_BOUND", "LABELS", "classify", "spare_cores"]

HOST_BOUND = "host-bound"
BALANCED = "balanced"
DEVICE_BOUND = "device-bound"
#: The three labels, from the input side to the compute side.
LABELS: tuple[str, str, str] = (HOST_BOUND, BALANCED, DEVICE_BOUND)

#: The notebooks the advice names, by id (tests/test_checklist.py checks each is a notebook of the registry).
_DECODE, _WORKERS, _PINNED, _OVERLAP, _AMP, _NHWC = ("02_batched_decode", "03_dataloader_tuning", "04_pinned_memory",
                                                     "05_stream_overlap", "06_mixed_precision", "07_channels_last")
_NUMBER = {nb: nb[:2] for nb in (_DECODE, _WORKERS, _PINNED, _OVERLAP, _AMP, _NHWC)}
#: Share of the exposed input above which the copy, not the loader, is the input's cost.
COPY_MAJORITY = 0.5


def spare_cores(device_kind: str, *, cores: int | None = None, compute_threads: int | None = None,
                other_cpu_share: float | None = None) -> int:
    """Cores the training step leaves idle while it computes: where DataLoader workers could prepare input.

    On a CPU the computation runs on the same cores as the input (``compute_threads`` of them, torch's
    intra-op threads, by default all); on an accelerator the main process keeps one core busy (it launches
    the kernels, collates and copies). Other processes' share of the cores (e.g.
    :attr:`helpers.machine.BusyCheck.other_cpu_share`) is taken off too.

    Parameters
    ----------
    device_kind : str
        "cpu", "cuda" or "npu" ("" counts as an accelerator).
    cores : int, optional
        Usable cores (default: this process's CPU affinity).
    compute_threads : int, optional
        Threads the computation uses on a CPU (``torch.get_num_threads()``; default: all ``cores``).
        Ignored on an accelerator.
    other_cpu_share : float, optional
        Share of the cores other processes took while measuring, >= 0 (default 0).

    Returns
    -------
    int
        Idle cores, >= 0.

    Raises
    ------
    ParameterError
        For a core or thread count that is not a positive int, or a negative or non-finite share.
    """
    cores = usable_cores() if cores is None else cores
    for name, v in (("cores", cores), ("compute_threads", compute_threads)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ParameterError(f"spare_cores: {name} must be an int >= 1, got {v!r}")
    share = 0.0 if other_cpu_share is None else other_cpu_share
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not math.isfinite(share) or share < 0:
        raise ParameterError(f"spare_cores: other_cpu_share must be a finite number >= 0, got {other_cpu_share!r}")
    used = min(cores, compute_threads or cores) if device_kind == "cpu" else 1
    return max(0, int(cores - used - round(share * cores)))


@dataclass(frozen=True)
class Bottleneck:
    """A job's bottleneck and what to do about it (see the module notes for the rule).

    Attributes
    ----------
    label : str
        One of :data:`LABELS`.
    exposed_fraction : float
        Exposed input time / step time, 0..1.
    threshold : float
        The host-bound threshold it was classified with, 0..1.
    input_saving : float
        Share of the step that free input would save (= ``exposed_fraction``), 0..1.
    compute_saving : float
        Share of the step that a 2x faster computation would save (= (1 - exposed) / 2), 0..1.
    next_notebooks : tuple of str
        Numbers of the notebooks to open next, in order (e.g. ``("03", "02")``).
    next_reason : str
        Why those, computed from the figures and the machine.
    reason : str
        The classification in one sentence, with its figures.
    spare_cores : int or None
        Idle cores for DataLoader workers (:func:`spare_cores`); None when not known.
    """

    label: str
    exposed_fraction: float
    threshold: float
    input_saving: float
    compute_saving: float
    next_notebooks: tuple[str, ...]
    next_reason: str
    reason: str
    spare_cores: int | None = None

    @property
    def workers_can_hide_input(self) -> bool | None:
        """Whether DataLoader workers have idle cores to hide the input on (None: not known)."""
        return None if self.spare_cores is None else self.spare_cores > 0

    def next_text(self) -> str:
        """The "next" advice: ``"notebook 03 (notebooks/03_dataloader_tuning.ipynb), then notebook 02 (...): why"``."""
        names = {v: k for k, v in _NUMBER.items()}
        refs = [notebook_ref(names[n]) for n in self.next_notebooks]
        return f"{', then '.join(refs)}: {self.next_reason}"

    def as_dict(self) -> dict[str, Any]:
        """The fields as JSON types (a verdict's ``extra["bottleneck"]``, ``diagnose --json``)."""
        d = asdict(self)
        d["next_notebooks"] = list(self.next_notebooks)
        d["next"] = self.next_text()
        return d


def _check_share(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)) \
            or not 0.0 <= float(v) <= 1.0 + 1e-9:
        raise ParameterError(f"classify: {name} must be a finite share in [0, 1], got {v!r}")
    return min(1.0, float(v))


def classify(exposed_fraction: float, threshold: float = 0.10, *, device_kind: str = "",
             spare_cores: int | None = None, copy_share: float | None = None) -> Bottleneck:
    """Classify a step from its exposed input share: host-bound, balanced or device-bound, and what next.

    Parameters
    ----------
    exposed_fraction : float
        Exposed input time (waiting for data + host-to-device copy) / step time, 0..1.
    threshold : float, default 0.10
        Share at or below which the job is device-bound (notebook 01's ``host_bound_threshold``), 0..1.
    device_kind : str
        "cpu", "cuda" or "npu"; on "cpu" the sentence says that the "device" is the same processor that
        prepares the input, and the copy levers (pinned memory, a side stream) are not advised.
    spare_cores : int, optional
        Idle cores for DataLoader workers (:func:`spare_cores`); 0 makes the advice say that workers cannot
        hide the input here and point at a cheaper sample and a cheaper computation. None: not known (the
        workers are advised, as notebook 03 measures whether they pay).
    copy_share : float, optional
        Share of the exposed input that is the host-to-device copy, 0..1; above 0.5 on an accelerator the
        input advice is pinned memory and stream overlap instead of the loader.

    Returns
    -------
    Bottleneck

    Raises
    ------
    ParameterError
        For a share outside [0, 1] or not finite, or a negative ``spare_cores``.
    """
    x = _check_share("exposed_fraction", exposed_fraction)
    thr = _check_share("threshold", threshold)
    if copy_share is not None:
        copy_share = _check_share("copy_share", copy_share)
    if spare_cores is not None and (isinstance(spare_cores, bool) or not isinstance(spare_cores, int)
                                    or spare_cores < 0):
        raise ParameterError(f"classify: spare_cores must be an int >= 0 or None, got {spare_cores!r}")
    compute = 1.0 - x
    input_saving, compute_saving = x, compute / 2
    if x <= thr:
        label = DEVICE_BOUND
    elif 3 * x >= 1 - 1e-12:  # x >= (1 - x) / 2, written so that x = 1/3 lands on host-bound exactly
        label = HOST_BOUND
    else:
        label = BALANCED

    pct, thr_pct = 100 * x, 100 * thr
    cpct = 100 - pct
    busy = "the training computation, on the same CPU, runs" if device_kind == "cpu" else "the device computes"
    if label == DEVICE_BOUND:
        reason = (f"input is exposed for only {pct:.0f}% of each step (threshold {thr_pct:.0f}%) and {busy} for "
                  f"{cpct:.0f}%: device-side optimizations (mixed precision, memory format, fusion) pay off first")
    else:
        head = (f"input preparation and copy are exposed for {pct:.0f}% of each step (threshold {thr_pct:.0f}%), "
                f"{busy} for {cpct:.0f}%: removing the exposed input would save {pct:.0f}% of the step, "
                f"a 2x faster compute {cpct / 2:.0f}%")
        reason = (f"{head}; the input is the larger lever" if label == HOST_BOUND
                  else f"{head}; the compute is the larger lever, the input the next one")

    nxt, why = _next(label, device_kind=device_kind, spare=spare_cores, copy_share=copy_share,
                     input_saving=input_saving, compute_saving=compute_saving, threshold=thr)
    return Bottleneck(label=label, exposed_fraction=x, threshold=thr, input_saving=input_saving,
                      compute_saving=compute_saving, next_notebooks=nxt, next_reason=why, reason=reason,
                      spare_cores=spare_cores)


def _next(label: str, *, device_kind: str, spare: int | None, copy_share: float | None,
          input_saving: float, compute_saving: float, threshold: float) -> tuple[tuple[str, ...], str]:
    """(notebook numbers, why) for a label on this machine."""
    compute = (_NUMBER[_AMP], _NUMBER[_NHWC])
    if label == DEVICE_BOUND:
        return compute, (f"the step is the computation: a 2x faster compute would save {compute_saving:.0%} of the "
                         f"step, free input {input_saving:.0%}")
    copy_bound = copy_share is not None and copy_share > COPY_MAJORITY and device_kind != "cpu"
    if copy_bound:  # pinned memory and a side stream need no idle cores
        inputs, in_why = (_NUMBER[_PINNED], _NUMBER[_OVERLAP]), ("the copy is most of the exposed input: pinned "
                                                                 "memory and a side-stream prefetch hide it")
    elif spare == 0:
        where = ("on a CPU the computation uses the same cores" if device_kind == "cpu"
                 else "the main process and other work take them")
        inputs = (_NUMBER[_DECODE],)
        in_why = ("make each sample cheaper (batched decode, decoding at a reduced size): DataLoader workers hide "
                  f"input only on idle cores and this step leaves none ({where}; notebook 03 measures whether they "
                  "still pay, e.g. for a loader that waits on I/O)")
    else:
        idle = f" on the {spare} idle core(s)" if spare else ""
        inputs, in_why = (_NUMBER[_WORKERS], _NUMBER[_DECODE]), (f"the step waits for its loader: workers may "
                                                                 f"hide it{idle}, then make each sample cheaper")
    if label == HOST_BOUND:
        if spare == 0 and not copy_bound and compute_saving >= threshold:
            # without idle cores the computation's own share is the other lever that pays, when it is worth it
            return inputs + compute, (f"{in_why}; then make the computation cheaper (mixed precision, memory "
                                      f"format: a 2x faster compute would save {compute_saving:.0%} of the step)")
        return inputs, in_why
    # balanced: the compute is the larger lever, the input the next one
    return compute + inputs, f"a 2x faster compute saves more than free input would; then the input: {in_why}"
