"""Which side of a training step to fix first: host-bound, balanced or device-bound, and the notebook to open next.

One classification, computed here and read by every place that names a job's bottleneck: notebook 01's
verdict (:mod:`helpers.experiments.baseline`), ``diagnose`` (:mod:`helpers.experiments.three_run`), the
three-line instrument (:mod:`helpers.workbook.instrument`), the report, and the trace reader.

The step model: every caller measures, per step, the shares of the step time that go to

- ``input``: the host waiting for the next batch;
- ``copy``: the host-to-device copy the step waits for (on a device, the device's own copy time not hidden
  behind its work; never the host's wait in a synchronize call, which waits for whatever the device was doing);
- ``compute``: the computation, as measured (on a device, its computing kernels; on a CPU, the training
  thread's operators; in notebook 01's timed loop, the synchronized forward, backward and optimizer);
- ``comm_exposed``: communication not hidden behind computation;
- ``idle``: the device doing nothing (an accelerator only);

and passes them to :func:`classify`. The label and the lever come from those measured shares; none is derived
as "1 - input". Where the computation was not measured (``compute_fraction`` None), the sentences speak of "the
rest of the step", not of the device.

The rule compares the levers of a step whose exposed input (input + copy) is X of the step time:

- making the input free saves X of the step;
- making the computation twice as fast saves compute / 2 (at most (1 - X) / 2 when not measured);
- hiding the exposed communication saves comm_exposed;
- removing the host's own work (kernel launches, Python, synchronizations) saves the device idle time that the
  input wait does not explain, idle - X (an accelerator whose idle time was measured).

One rule labels the step by its largest lever. A device busy computing for :data:`DEVICE_BUSY` (90%) or more of
the step is **device-bound**, whatever else. Exposed communication above the threshold that is the largest lever
makes the step **communication-bound** (notebook 08, and in a job of many ranks: the rank the others wait for).
Otherwise the host side's lever is the larger of the input and the host's own work: at most the threshold
(notebook 01's ``host_bound_threshold``, 0.10 by default), the job is **device-bound**; at least the compute's
lever, **host-bound**, with the larger of the two as its cause (input: X >= compute / 2, with compute = 1 - X that
is X >= 1/3); else **balanced**: the host side is worth fixing, but a 2x faster computation would save more. So a
device computing 78% of the step and idle 19% of it is balanced, not host-bound: a 2x faster compute saves 39%.
A share within :data:`AT_THRESHOLD` of the 90% rule or of the threshold is said to be at it, with the label the
other side of it would give (:attr:`Bottleneck.at_threshold`). The notebook to open next follows the label and
what the machine and the trace allow: DataLoader workers hide input only on cores the step leaves idle
(:func:`spare_cores`); with none (on a CPU the computation itself uses the cores), the advice points at the levers
that can pay there, a cheaper sample and a cheaper computation, instead of the workers. Mixed precision (notebook
06) is left out where a :class:`ComputeMix` shows the matrix work already in 16-bit or lower precision (what it
could still save, the rest of the compute lever, is at most the threshold), and channels_last (notebook 07) where
it shows no convolution.

:func:`judge` applies the same rule to a :class:`StepShares` whose input was not measured (a profiler trace
without DataLoader spans): the device timeline still decides where it can (busy computing 90% or more:
device-bound; idle at most the threshold: the input, which shows as idle, cannot be a lever; communication the
largest lever: communication-bound), and otherwise it gives no label and says why.

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

__all__ = ["AT_THRESHOLD", "BALANCED", "Bottleneck", "COMM_BOUND", "ComputeMix", "DEVICE_BOUND", "DEVICE_BUSY",
           "HOST_BOUND", "LABELS", "StepShares", "classify", "judge", "spare_cores"]

HOST_BOUND = "host-bound"
BALANCED = "balanced"
DEVICE_BOUND = "device-bound"
COMM_BOUND = "communication-bound"
#: The labels, from the input side to the compute side, then communication.
LABELS: tuple[str, ...] = (HOST_BOUND, BALANCED, DEVICE_BOUND, COMM_BOUND)
#: A device busy computing for this share of the step or more is device-bound whatever the other shares: the
#: issue's rule for traces without DataLoader spans, and the point where any input or communication lever is
#: below the 10% threshold's reach.
DEVICE_BUSY = 0.90
#: A share this close to a rule's threshold (either side) is at the threshold: the trace reader's shares agree with
#: HolisticTraceAnalysis' within 5 points on real traces (tests/test_trace_public.py, POINTS), and no closer, so a
#: share within 5 points of a threshold may lie on its other side (device busy 91% here, 88% by HTA, on one trace).
AT_THRESHOLD = 0.05

#: The notebooks the advice names, by id (tests/test_checklist.py checks each is a notebook of the registry).
_DECODE, _WORKERS, _PINNED, _OVERLAP, _AMP, _NHWC = ("02_batched_decode", "03_dataloader_tuning", "04_pinned_memory",
                                                     "05_stream_overlap", "06_mixed_precision", "07_channels_last")
_COMM, _MEMORY = "08_collectives", "09_memory_and_batch_size"
_NUMBER = {nb: nb[:2] for nb in (_DECODE, _WORKERS, _PINNED, _OVERLAP, _AMP, _NHWC, _COMM, _MEMORY)}
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
    compute_fraction, comm_fraction, idle_fraction : float or None
        The measured shares of computation, exposed communication and device idle it was classified with
        (None: not measured).
    at_threshold : str
        Where a share is within :data:`AT_THRESHOLD` of a rule's threshold: which, and the label its other side
        would give (``"device busy 91% against the 90% rule; below it: balanced"``); "" otherwise.
    precision : str
        What the trace says of the computation's precision (:attr:`ComputeMix.text`), "" where nothing.
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
    compute_fraction: float | None = None
    comm_fraction: float | None = None
    idle_fraction: float | None = None
    at_threshold: str = ""
    precision: str = ""

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


@dataclass(frozen=True)
class ComputeMix:
    """What precision the computation's matrix work (GEMMs, convolutions, attention) runs in, as a trace records it.

    Attributes
    ----------
    low : float or None
        Share of the matrix kernels' device time whose kernel names say 16-bit or lower precision (fp8, bf16,
        fp16), 0..1, of the time whose precision the names say; None where no kernel name says one.
    dtype : str
        The precision with the most matrix kernel time ("fp8", "bf16", "fp16", "tf32", "fp32", "fp64"), else the
        one most matrix operators take (their ``Input type``); "" where neither says.
    conv : float or None
        Share of the matrix kernels' device time in convolutions, 0..1; None where the trace has no matrix kernel
        (a CPU trace: then 0 where no convolution operator ran, else None).
    ops_low, ops : int
        Matrix operators (``aten::mm``, ``aten::addmm``, ``aten::convolution``, ...) whose ``Input type`` is a
        16-bit or lower float, and all those with a float ``Input type`` (0: not recorded, e.g. without
        ``record_shapes=True``).
    text : str
        The evidence in words: ``"bf16 on 97% of matrix kernel time (kernel names), 1,008 of 1,008 matrix ops
        (Input type)"``.
    """

    low: float | None = None
    dtype: str = ""
    conv: float | None = None
    ops_low: int = 0
    ops: int = 0
    text: str = ""

    @property
    def low_share(self) -> float | None:
        """The share of the matrix work in 16-bit or lower precision, 0..1: the kernels' where their names say,
        else the operators' ``Input type``; None where neither says."""
        if self.low is not None:
            return self.low
        return self.ops_low / self.ops if self.ops else None


def _check_share(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)) \
            or not 0.0 <= float(v) <= 1.0 + 1e-9:
        raise ParameterError(f"classify: {name} must be a finite share in [0, 1], got {v!r}")
    return min(1.0, float(v))


def _opt_share(name: str, v: Any) -> float | None:
    return None if v is None else _check_share(name, v)


@dataclass(frozen=True)
class StepShares:
    """The step model: the measured shares of a (median) step, each 0..1 of the step time, None where unmeasured.

    Attributes
    ----------
    input : float or None
        The host waiting for the next batch.
    copy : float or None
        The host-to-device copy the step waits for (device copy time not hidden; on a CPU the host's copy).
    compute : float or None
        The computation, as measured (never derived as the rest of the step).
    comm_exposed : float or None
        Communication not hidden behind computation.
    idle : float or None
        The device doing nothing (accelerators only; None on a CPU).
    other : float or None
        Step time attributed to no phase (a CPU trace's gaps between operators).
    sync : mapping of str to float
        Host time in synchronize calls, as shares, by what the device did meanwhile ("communication", "compute",
        "copy", "idle").
    device_kind : str
        "cpu", "cuda", "rocm", "mtia", "xpu", "npu", ... ("" for an unnamed accelerator).
    comm_overlapped : float or None
        Communication that runs while the device computes (all communication less the exposed part): a faster
        compute exposes it (``_compute_saving``).
    """

    input: float | None = None
    copy: float | None = None
    compute: float | None = None
    comm_exposed: float | None = None
    idle: float | None = None
    other: float | None = None
    sync: Any = None
    device_kind: str = ""
    comm_overlapped: float | None = None

    @property
    def exposed_input(self) -> float | None:
        """input + copy (0..1), None when neither was measured."""
        if self.input is None and self.copy is None:
            return None
        return min(1.0, (self.input or 0.0) + (self.copy or 0.0))

    @property
    def copy_share(self) -> float | None:
        """The copy's part of the exposed input (0..1); None when not measured or nothing is exposed."""
        x = self.exposed_input
        if self.copy is None or not x:
            return None
        return min(1.0, self.copy / x)

    def as_dict(self) -> dict[str, Any]:
        """The shares as JSON types."""
        d = asdict(self)
        d["sync"] = dict(self.sync or {})
        d["exposed_input"] = self.exposed_input
        return d

    def text(self) -> str:
        """The measured shares in words: ``"input 31%, copy 0%, compute 52%, idle 12%"`` (unmeasured left out)."""
        parts = [f"{name} {v:.0%}" for name, v in (("input", self.input), ("copy", self.copy),
                                                   ("compute", self.compute), ("exposed communication",
                                                                               self.comm_exposed),
                                                   ("device idle", self.idle), ("unattributed", self.other))
                 if v is not None]
        return ", ".join(parts)


def classify(exposed_fraction: float, threshold: float = 0.10, *, device_kind: str = "",
             spare_cores: int | None = None, copy_share: float | None = None,
             compute_fraction: float | None = None, comm_fraction: float | None = None,
             idle_fraction: float | None = None, input_measured: bool = True,
             compute_mix: ComputeMix | None = None, comm_overlapped: float | None = None) -> Bottleneck:
    """Classify a step from its measured shares: host-bound, balanced, device-bound or communication-bound.

    Parameters
    ----------
    exposed_fraction : float
        Exposed input time (waiting for data + host-to-device copy) / step time, 0..1.
    threshold : float, default 0.10
        Share at or below which a lever is not worth a notebook (notebook 01's ``host_bound_threshold``), 0..1.
    device_kind : str
        "cpu" or an accelerator's name ("cuda", "rocm", "npu", ...; "" an unnamed one); on "cpu" the sentence says
        that the "device" is the same processor that prepares the input, and the copy levers are not advised.
    spare_cores : int, optional
        Idle cores for DataLoader workers (:func:`spare_cores`); 0 makes the advice say that workers cannot
        hide the input here and point at a cheaper sample and a cheaper computation. None: not known.
    copy_share : float, optional
        Share of the exposed input that is the host-to-device copy, 0..1; above 0.5 on an accelerator the
        input advice is pinned memory and stream overlap instead of the loader.
    compute_fraction : float, optional
        The computation's measured share of the step, 0..1. None: not measured; the compute lever is then at most
        (1 - exposed) / 2 and the sentence speaks of "the rest of the step".
    comm_fraction : float, optional
        Exposed communication / step time, 0..1 (None: not measured, no communication lever).
    idle_fraction : float, optional
        Device idle / step time, 0..1, on an accelerator (None: not measured).
    input_measured : bool, default True
        False where the input was not recorded (``exposed_fraction`` is then 0 only for the rule, and the
        sentences say "not recorded" instead of a share).
    compute_mix : ComputeMix, optional
        The precision of the matrix work, as a trace records it: mixed precision is not advised where it is already
        low, channels_last not where there is no convolution (None: not known, both advised).
    comm_overlapped : float, optional
        Communication hidden behind the computation / step time, 0..1: a 2x faster compute saves only what this
        communication does not then expose (``_compute_saving``); None: taken as 0.

    Returns
    -------
    Bottleneck

    Raises
    ------
    ParameterError
        For a share outside [0, 1] or not finite, a negative ``spare_cores``, or a ``compute_mix`` that is not a
        :class:`ComputeMix`.
    """
    x = _check_share("exposed_fraction", exposed_fraction)
    thr = _check_share("threshold", threshold)
    copy_share = _opt_share("copy_share", copy_share)
    c = _opt_share("compute_fraction", compute_fraction)
    m = _opt_share("comm_fraction", comm_fraction)
    idle = _opt_share("idle_fraction", idle_fraction)
    if spare_cores is not None and (isinstance(spare_cores, bool) or not isinstance(spare_cores, int)
                                    or spare_cores < 0):
        raise ParameterError(f"classify: spare_cores must be an int >= 0 or None, got {spare_cores!r}")
    if compute_mix is not None and not isinstance(compute_mix, ComputeMix):
        raise ParameterError(f"classify: compute_mix must be a ComputeMix or None, got {compute_mix!r}")
    accel = device_kind != "cpu"
    o = _opt_share("comm_overlapped", comm_overlapped)
    compute_saving = _compute_saving(c, x, o)
    comm_saving = m or 0.0
    input_saving = x
    # the device idle time the input wait does not explain: the host's own work keeps the device waiting
    starved = max(0.0, idle - x) if (accel and idle is not None) else 0.0
    label = _label(x, c, m, starved, thr, accel, overlapped=o)
    host_work = label in (HOST_BOUND, BALANCED) and starved > x  # the host side's lever is its own work
    at = _at_threshold(x, c, m, starved, thr, accel, label, input_measured)

    pct, thr_pct = 100 * x, 100 * thr
    in_txt = f"input exposed {pct:.0f}%" if input_measured else "input not recorded"
    if c is not None:
        busy = ("the training computation, on the same CPU, runs" if device_kind == "cpu"
                else "the device computes") + f" for {100 * c:.0f}%"
        lever = f"a 2x faster compute {round(100 * compute_saving, 9):.0f}%"  # round: 1 - 0.43 is 0.5700000000000001
        if compute_saving < c / 2 - 1e-12:
            lever += (f" (not {round(100 * c, 9) / 2:.0f}%: {100 * (o or 0):.0f}% of communication runs under the "
                      "compute and would then be exposed)")
    else:
        busy = f"the rest of the step ({100 - pct:.0f}%: computation and anything else, not split here)"
        lever = f"a 2x faster compute at most {round(100 - pct, 9) / 2:.0f}%"
    comm_txt = f", communication not hidden behind compute {100 * m:.0f}%" if m else ""
    idle_txt = f", the device is idle for {100 * idle:.0f}%" if idle is not None and accel else ""
    levers, _, prec = _compute_levers(compute_mix, compute_saving, thr)
    device_side = f"device-side optimizations ({levers}) pay off first{prec}"
    waits_for = ("the host's own work (kernel launches, Python, synchronizations)" if input_measured else
                 "the host (its input or its own work: the trace records no wait for data to tell them apart)")
    if label == DEVICE_BOUND and c is not None and c >= DEVICE_BUSY - 1e-12 and accel:
        reason = f"the device computes for {100 * c:.0f}% of each step ({in_txt}{comm_txt}): {device_side}"
    elif label == COMM_BOUND:
        reason = (f"communication not hidden behind compute takes {100 * m:.0f}% of each step, the largest lever "
                  f"({in_txt}, {lever}{idle_txt}): in a job of many ranks this is mostly time "
                  "spent waiting for the rank that arrives last at the collectives; then the collectives themselves")
    elif label == HOST_BOUND and host_work:
        reason = (f"the device is idle for {100 * idle:.0f}% of each step while the input explains only "
                  f"{pct:.0f}%: {waits_for} keeps the device waiting for {100 * starved:.0f}%, at least the "
                  f"{lever[20:]} a 2x faster compute would save; {busy}{comm_txt}")
    elif label == BALANCED and host_work:
        reason = (f"{busy} of each step{comm_txt}, so a 2x faster compute would save {lever[20:]}, more than the "
                  f"{100 * starved:.0f}% the device waits for {waits_for} (idle {100 * idle:.0f}%, {in_txt}); the "
                  f"compute is the larger lever, the host's own work the next one{prec}")
    elif label == DEVICE_BOUND and not input_measured:
        reason = (f"the device is idle for at most {100 * (idle or 0):.0f}% of each step, so the input (not recorded, "
                  f"and idle while the device waits) cannot be a lever; {busy}{comm_txt}: {device_side}")
    elif label == DEVICE_BOUND:
        reason = (f"input is exposed for only {pct:.0f}% of each step (threshold {thr_pct:.0f}%) and {busy}"
                  f"{comm_txt}{idle_txt}: {device_side}")
    else:
        head = (f"input preparation and copy are exposed for {pct:.0f}% of each step (threshold {thr_pct:.0f}%), "
                f"{busy}{comm_txt}{idle_txt}: removing the exposed input would save {pct:.0f}% of the step, "
                f"{lever}")
        reason = (f"{head}; the input is the larger lever" if label == HOST_BOUND
                  else f"{head}; the compute is the larger lever, the input the next one{prec}")
    if at:
        reason = f"at the threshold ({at}): {reason}"

    nxt, why = _next(label, device_kind=device_kind, spare=spare_cores, copy_share=copy_share,
                     input_saving=input_saving, compute_saving=compute_saving, threshold=thr,
                     launch_bound=host_work, input_measured=input_measured, compute_mix=compute_mix)
    return Bottleneck(label=label, exposed_fraction=x, threshold=thr, input_saving=input_saving,
                      compute_saving=compute_saving, next_notebooks=nxt, next_reason=why, reason=reason,
                      spare_cores=spare_cores, compute_fraction=c, comm_fraction=m, idle_fraction=idle,
                      at_threshold=at, precision=compute_mix.text if compute_mix is not None else "")


def _compute_saving(c: float | None, x: float, overlapped: float | None = None) -> float:
    """Share of the step a 2x faster computation saves: compute / 2 ((1 - x) / 2 where compute is not measured),
    less the communication hidden behind the compute that a shorter compute no longer hides: min(c / 2, c - o)."""
    c = c if c is not None else max(0.0, 1.0 - x)
    return max(0.0, min(c / 2, c - (overlapped or 0.0)))


def _label(x: float, c: float | None, m: float | None, starved: float, thr: float, accel: bool, *,
           busy_rule: bool = True, overlapped: float | None = None) -> str:
    """The one rule (see the module notes): the side of the largest lever, shares 0..1 of the step."""
    compute_saving = _compute_saving(c, x, overlapped)
    host = max(x, starved)  # the host side's lever: its input or its own work, whichever saves more
    if busy_rule and accel and c is not None and c >= DEVICE_BUSY - 1e-12:
        return DEVICE_BOUND
    if (m or 0.0) > thr and (m or 0.0) >= max(host, compute_saving):
        return COMM_BOUND
    if host <= thr:
        return DEVICE_BOUND
    if host >= compute_saving - 1e-12:  # ties go to the host side, the cheaper fix (x = 1/3 with compute 1 - x)
        return HOST_BOUND
    return BALANCED


def _at_threshold(x: float, c: float | None, m: float | None, starved: float, thr: float, accel: bool, label: str,
                  input_measured: bool) -> str:
    """Which rule's threshold a share is within :data:`AT_THRESHOLD` of, and the label on its other side; ""."""
    if accel and c is not None and abs(c - DEVICE_BUSY) <= AT_THRESHOLD + 1e-12:
        other = _label(x, c, m, starved, thr, accel, busy_rule=False) if c >= DEVICE_BUSY - 1e-12 else DEVICE_BOUND
        side = "below" if c >= DEVICE_BUSY - 1e-12 else "at or above"
        return (f"the device computes for {100 * c:.0f}% against the {100 * DEVICE_BUSY:.0f}% rule, within the "
                f"{100 * AT_THRESHOLD:.0f} points the reader and HTA may differ; {side} it: "
                + ("the same label" if other == label else other))
    if input_measured and label in (HOST_BOUND, DEVICE_BOUND, BALANCED) and abs(x - thr) <= AT_THRESHOLD + 1e-12 \
            and starved <= thr and not (c is not None and accel and c >= DEVICE_BUSY - 1e-12):
        other = _label(thr + 1e-9 if x <= thr else thr, c, m, starved, thr, accel)  # just across the threshold
        if other != label:
            return (f"input exposed {100 * x:.0f}% against the {100 * thr:.0f}% threshold, within "
                    f"{100 * AT_THRESHOLD:.0f} points; on its other side: {other}")
    return ""


def _compute_levers(mix: ComputeMix | None, compute_saving: float, thr: float) -> tuple[str, tuple[str, ...], str]:
    """(the device-side levers in words, their notebooks, a clause on the precision evidence or ""): mixed precision
    (06) unless the matrix work is already in 16-bit or lower precision (it could then save at most the rest of
    the compute lever, (1 - low) * compute / 2, and that is at most the threshold); channels_last (07) unless the
    trace shows no convolution; fusion always (no notebook: torch.compile)."""
    words, nbs = [], []
    low = mix.low_share if mix is not None else None
    amp_open = low is None or (1.0 - low) * compute_saving > thr
    if amp_open:
        words.append("mixed precision")
        nbs.append(_NUMBER[_AMP])
    conv_open = mix is None or mix.conv is None or mix.conv > 0
    if conv_open:
        words.append("memory format")
        nbs.append(_NUMBER[_NHWC])
    words.append("fusion" if nbs else "fusion, e.g. torch.compile, outside this checklist")
    note = []
    if not amp_open:
        left = (1.0 - low) * compute_saving
        note.append(f"precision is already low ({mix.text}), so mixed precision could save at most "
                    + (f"{left:.0%}" if left >= 0.005 else "under 1%") + " of the step")
    if not conv_open:
        note.append("the trace shows no convolution, so channels_last has nothing to change")
    if not nbs:  # neither is open: the checklist's compute notebooks are spent
        nbs.append(_NUMBER[_MEMORY])
    return ", ".join(words), tuple(nbs), ("; " + "; ".join(note)) if note else ""


def _left_out(mix: ComputeMix | None, compute: tuple[str, ...]) -> str:
    """``" (mixed precision left out: the matrix work is bf16 already)"``: the compute notebooks the trace's
    evidence leaves out, in a few words ("" where none is)."""
    out = []
    if mix is not None and _NUMBER[_AMP] not in compute:
        out.append(f"mixed precision left out: the matrix work is {mix.dtype or 'in low precision'} already")
    if mix is not None and _NUMBER[_NHWC] not in compute:
        out.append("channels_last left out: no convolution")
    if compute == (_NUMBER[_MEMORY],):
        out.append("a larger batch may still use the device better")
    return f" ({'; '.join(out)})" if out else ""


def judge(shares: StepShares, threshold: float = 0.10, *, spare_cores: int | None = None,
          compute_mix: ComputeMix | None = None) -> tuple[Bottleneck | None, str]:
    """The label from a :class:`StepShares`, or no label and why the evidence cannot decide.

    Where the exposed input was measured this is :func:`classify` with every measured share. Where it was not
    (a trace without DataLoader spans), the device timeline decides when it can: busy computing for
    :data:`DEVICE_BUSY` or more, device-bound; exposed communication the largest lever and above the threshold,
    communication-bound; idle at most the threshold (the input, which shows as idle, cannot be a lever),
    device-bound; idle less than a 2x faster compute would save (the compute is the largest lever, whatever the
    idle time waits for), device-bound or balanced by the one rule. Otherwise no label.

    Parameters
    ----------
    shares : StepShares
    threshold : float, default 0.10
    spare_cores : int, optional
    compute_mix : ComputeMix, optional
        As :func:`classify`.

    Returns
    -------
    (Bottleneck or None, str)
        The classification (None when the evidence cannot decide) and, when None, the reason in one sentence.

    Raises
    ------
    ParameterError
        For a share outside [0, 1], as :func:`classify`.
    """
    thr = _check_share("threshold", threshold)
    kind = shares.device_kind
    x = shares.exposed_input
    kw = dict(device_kind=kind, spare_cores=spare_cores, compute_fraction=shares.compute,
              comm_fraction=shares.comm_exposed, idle_fraction=shares.idle, compute_mix=compute_mix,
              comm_overlapped=shares.comm_overlapped)
    if x is not None and shares.input is not None:
        return classify(x, thr, copy_share=shares.copy_share, **kw), ""
    c, m, idle = shares.compute, shares.comm_exposed or 0.0, shares.idle
    accel = kind != "cpu"
    if c is not None and c >= DEVICE_BUSY - 1e-12:
        return classify(0.0, thr, input_measured=False, **kw), ""
    saving = _compute_saving(c or 0.0, 0.0, shares.comm_overlapped)
    if m > thr and m >= saving and (idle is None or m >= idle):
        return classify(0.0, thr, input_measured=False, **kw), ""
    if accel and idle is not None and c is not None and (idle <= thr or saving > idle):
        return classify(0.0, thr, input_measured=False, **kw), ""
    if accel and idle is not None:
        why = (f"the device is idle for {idle:.0%} of the step (computing {c or 0:.0%}), and the trace records "
               "no wait for data, so whether the device waits for input or for the host's own work (kernel "
               "launches, Python, synchronizations) cannot be told")
    elif accel:
        why = ("the trace records no wait for data and no device idle time, so the share of the step spent "
               "waiting for input cannot be told")
    else:
        why = ("the trace records no wait for data, and on a CPU the input and the computation share the same "
               "cores, so the share of the step spent waiting for input cannot be told")
    return None, why


def _next(label: str, *, device_kind: str, spare: int | None, copy_share: float | None,
          input_saving: float, compute_saving: float, threshold: float,
          launch_bound: bool = False, input_measured: bool = True,
          compute_mix: ComputeMix | None = None) -> tuple[tuple[str, ...], str]:
    """(notebook numbers, why) for a label on this machine and what the trace says of its precision."""
    words, compute, prec = _compute_levers(compute_mix, compute_saving, threshold)
    spent = _left_out(compute_mix, compute)
    if label == DEVICE_BOUND:
        free = f"free input {input_saving:.0%}" if input_measured else "the input is not recorded"
        return compute, (f"the step is the computation: a 2x faster compute would save {compute_saving:.0%} of the "
                         f"step, {free}{spent}")
    if label == COMM_BOUND:
        return (_NUMBER[_COMM],), ("find the rank the others wait for (the slow-rank finding names it), then "
                                   "measure the collectives and DDP's buckets")
    launch = (_NUMBER[_MEMORY],), ("the host cannot launch the device's work fast enough: a larger batch does more "
                                   "work per launch (notebook 09 finds the largest that fits); fewer, larger "
                                   "kernels (torch.compile, CUDA graphs) do the same but are outside this checklist")
    if launch_bound and not input_measured:  # balanced: the compute first; what the idle waits for is not known
        return compute, (f"a 2x faster compute would save {compute_saving:.0%} of the step, more than all the "
                         f"device's idle time{spent}; then find what the device waits for: record the DataLoader "
                         "inside the profiled steps")
    ins, in_note = (), ""
    if launch_bound and input_saving > threshold:  # the input is above the threshold too: its notebooks follow
        ins, in_why = _next(HOST_BOUND, device_kind=device_kind, spare=spare, copy_share=copy_share,
                            input_saving=input_saving, compute_saving=0.0, threshold=threshold)
        in_note = f"; then the input ({input_saving:.0%} of the step): {in_why}"
    if launch_bound and label == HOST_BOUND:
        more = tuple(n for n in compute if n != _NUMBER[_MEMORY])
        return tuple(dict.fromkeys(launch[0] + ins + more)), launch[1] + in_note
    if launch_bound:  # balanced, the host's own work the next lever
        return tuple(dict.fromkeys(compute + launch[0] + ins)), (f"a 2x faster compute ({words}) saves more than the "
                                                                 f"host's own work would{spent}; then {launch[1]}"
                                                                 f"{in_note}")
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
            return inputs + compute, (f"{in_why}; then make the computation cheaper ({words}: a 2x faster "
                                      f"compute would save {compute_saving:.0%} of the step){spent}")
        return inputs, in_why
    # balanced: the compute is the larger lever, the input the next one
    return compute + inputs, (f"a 2x faster compute saves more than free input would{spent}; then the input: "
                              f"{in_why}")
