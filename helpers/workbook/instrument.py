"""Notebook 01's verdict on your own training loop, in three added lines.

::

    from helpers.workbook.instrument import instrument     # 1: the import
    steps = instrument(loader, device="cuda")              # 2: wrap the loader you already have
    for x, y in steps:                                      #    (the loop you already have, unchanged)
        x, y = x.to("cuda", non_blocking=True), y.to("cuda", non_blocking=True)
        steps.copied()                                      #    optional: split the copy from the compute
        loss = loss_fn(model(x), y); loss.backward(); opt.step(); opt.zero_grad()
    steps.report()                                          # 3: the verdict and the phase breakdown

What is timed, per step (a step runs from one batch request to the next):

- **data**: the wait inside ``next(loader)`` (the input pipeline's exposed time);
- **copy**: from the batch's arrival to :meth:`InstrumentedLoader.copied` (0 when it is never called: the copy
  then counts as compute);
- **compute**: the rest of the step, up to the next batch request.

The device is synchronized once per step, at the step boundary (and once more at ``copied()`` when it is
called), so that a phase's time is the device's, not the time to queue its work: the least a per-phase
measurement needs. On a CPU the synchronize is a no-op. The first ``warmup`` steps are not measured. The
report gives notebook 01's verdict (:func:`helpers.bottleneck.classify`: host-bound, balanced or
device-bound) from the median per-step share of exposed input, the phase medians with their interquartile
ranges, the notebooks to open next on this machine, and the machine's state over the measurement (:mod:`helpers.machine`): a busy machine makes the
verdict "inconclusive". ``python -m helpers bench instrument`` measures the instrument's overhead.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Iterable

import pandas as pd

from helpers import bottleneck, machine
from helpers.errors import ParameterError
from helpers.experiments.baseline import spare_cores

__all__ = ["InstrumentedLoader", "LoopReport", "instrument"]


@dataclass(frozen=True)
class LoopReport:
    """What :meth:`InstrumentedLoader.report` found.

    Attributes
    ----------
    steps : pandas.DataFrame
        One row per measured step: ``data``, ``copy``, ``compute``, ``step_s`` (seconds), ``exposed_fraction``.
    exposed_fraction : float
        Median over steps of (data + copy) / step.
    recommendation : str
        One of :data:`helpers.bottleneck.LABELS`, or "inconclusive" (a busy machine; ``measured_recommendation``
        keeps the label).
    measured_recommendation, reason : str
    next_notebook : str
        The notebooks to open next, with why (:meth:`helpers.bottleneck.Bottleneck.next_text`).
    machine : helpers.machine.BusyCheck
    bottleneck : helpers.bottleneck.Bottleneck or None
        The classification (the two levers' savings, the idle cores).
    """

    steps: Any
    exposed_fraction: float
    recommendation: str
    measured_recommendation: str
    reason: str
    next_notebook: str
    machine: Any
    bottleneck: Any = None

    def lines(self, name: str = "your loop") -> list[str]:
        """The printed report."""
        df = self.steps

        def phase(col: str) -> str:
            return (f"{col} {df[col].median() * 1e3:.1f} ms (IQR {df[col].quantile(0.25) * 1e3:.1f}-"
                    f"{df[col].quantile(0.75) * 1e3:.1f})")

        head = (f"inconclusive: {self.machine.sentence()}; what it measured: " if self.recommendation == "inconclusive"
                else "")
        return [f"{name}: {len(df)} steps measured",
                f"{head}{self.measured_recommendation}: {self.reason}",
                f"median step {df['step_s'].median() * 1e3:.1f} ms: {phase('data')}, {phase('copy')}, "
                f"{phase('compute')}",
                f"next: {self.next_notebook}",
                f"machine: {self.machine.sentence()}"]


class InstrumentedLoader:
    """Your loader, with each step of the loop around it timed (see the module notes).

    Parameters
    ----------
    loader : iterable
        Your DataLoader (or any iterable of batches); iterate the wrapper where you iterated it, as many
        epochs as you like.
    device : str, torch.device, helpers.device.Accelerator or None, default "auto"
        The device whose work is synchronized at step boundaries ("auto": npu, else cuda, else cpu; None: no
        synchronize, host time only).
    warmup : int, default 3
        Steps not measured at the start (compilation, allocator warm-up, worker start).
    threshold : float, default 0.10
        Exposed-input share above which the loop is host-bound (notebook 01's default).
    busy_cpu_share : float, default :data:`helpers.machine.MAX_OTHER_CPU_SHARE`
        Share of the cores other processes may take before the verdict is inconclusive.
    name : str
        How the report names the loop.

    Raises
    ------
    ParameterError
        Bad ``warmup``, ``threshold`` or ``busy_cpu_share`` (when the wrapper is made).
    """

    def __init__(self, loader: Iterable, *, device: Any = "auto", warmup: int = 3, threshold: float = 0.10,
                 busy_cpu_share: float = machine.MAX_OTHER_CPU_SHARE, name: str = "your loop") -> None:
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ParameterError(f"warmup must be an int >= 0, got {warmup!r}")
        if not 0.0 < float(threshold) < 1.0:
            raise ParameterError(f"threshold must be in (0, 1), got {threshold!r}")
        if not 0.0 < float(busy_cpu_share) <= 1.0:
            raise ParameterError(f"busy_cpu_share must be in (0, 1], got {busy_cpu_share!r}")
        self.loader, self.warmup, self.threshold, self.name = loader, warmup, float(threshold), name
        self.busy_cpu_share = float(busy_cpu_share)
        self._sync, self.device_kind = _synchronizer(device)
        self._it = None
        self._open: list[float] | None = None  # [request start, batch arrived, copy end or nan]
        self._rows: list[tuple[float, float, float, float]] = []
        self._seen = 0
        self._before = machine.snapshot()

    def __iter__(self) -> "InstrumentedLoader":
        self.end_step()
        self._it = iter(self.loader)
        return self

    def __next__(self) -> Any:
        self.end_step()
        start = time.perf_counter()
        try:
            batch = next(self._it)
        except StopIteration:
            self._open = None
            raise
        self._open = [start, time.perf_counter(), float("nan")]
        return batch

    def copied(self) -> None:
        """Mark the end of the step's host-to-device copy (one synchronize): the copy is timed apart from compute."""
        if self._open is not None:
            self._sync()
            self._open[2] = time.perf_counter()

    def end_step(self) -> None:
        """End the step in progress now (one synchronize) instead of at the next batch request; a no-op between
        steps. The loop never needs it; a caller that times blocks of steps (``bench instrument``) does."""
        if self._open is None:
            return
        self._sync()
        end = time.perf_counter()
        start, arrived, copied = self._open
        self._open = None
        self._seen += 1
        if self._seen <= self.warmup:
            return
        copy_end = copied if copied == copied else arrived  # nan: no copy marker
        self._rows.append((arrived - start, copy_end - arrived, end - copy_end, end - start))

    def frame(self) -> pd.DataFrame:
        """The measured steps so far (closing the one in progress)."""
        self.end_step()
        df = pd.DataFrame(self._rows, columns=["data", "copy", "compute", "step_s"])
        df["exposed_fraction"] = (df["data"] + df["copy"]) / df["step_s"]
        return df

    def result(self) -> LoopReport:
        """The verdict and figures, without printing.

        Raises
        ------
        ParameterError
            If fewer than 3 steps were measured after the warm-up.
        """
        df = self.frame()
        if len(df) < 3:
            raise ParameterError(f"{self.name}: only {len(df)} step(s) measured after {self.warmup} warm-up step(s); "
                                 "run more steps (at least 3 after the warm-up) before report()")
        check = machine.check(self._before, machine.snapshot(), max_other_cpu_share=self.busy_cpu_share)
        exposed = float(df["exposed_fraction"].median())
        data, copy = float(df["data"].median()), float(df["copy"].median())
        b = bottleneck.classify(exposed, self.threshold, device_kind=self.device_kind,
                                spare_cores=spare_cores(self.device_kind, getattr(check, "other_cpu_share", None)),
                                copy_share=copy / (data + copy) if data + copy > 0 else None)
        return LoopReport(steps=df, exposed_fraction=exposed,
                          recommendation="inconclusive" if check.busy else b.label, measured_recommendation=b.label,
                          reason=b.reason, machine=check, bottleneck=b,
                          next_notebook=b.next_text() + (_DIAGNOSE if b.label != bottleneck.DEVICE_BOUND else ""))

    def report(self, *, print_it: bool = True) -> LoopReport:
        """Print (by default) and return the :class:`LoopReport`."""
        r = self.result()
        if print_it:
            print("\n".join(r.lines(self.name)))
        return r


#: Appended to the "next" advice when the input counts: the measurement the instrument cannot make in a loop.
_DIAGNOSE = "; `python -m helpers diagnose --job` measures what free input would give"


def _synchronizer(device: Any):
    """(sync function, device kind) for ``device``."""
    if device is None:
        return (lambda: None), "cpu"
    if hasattr(device, "synchronize") and hasattr(device, "kind"):  # an Accelerator
        return device.synchronize, device.kind
    from helpers.device import get_accelerator

    kind = str(device).split(":")[0]
    acc = get_accelerator(kind if kind in ("auto", "cpu", "cuda", "npu") else "auto")
    return acc.synchronize, acc.kind


def instrument(loader: Iterable, **options: Any) -> InstrumentedLoader:
    """Wrap ``loader`` so that the loop around it is timed per phase (see :class:`InstrumentedLoader`)."""
    return InstrumentedLoader(loader, **options)
