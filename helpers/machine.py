"""Was the machine quiet while it measured? Snapshots of its state, and the busy-machine check.

A verdict is only as good as the machine was quiet: other processes on the same cores slow one variant
more than another and make a confident recommendation out of noise. :func:`snapshot` records, at one
moment, the load average, the usable cores and the CPU time used so far by the whole machine, by this
process and its children, and stolen by the hypervisor; :func:`check` compares two snapshots taken
before and after a measurement and says whether other work took a share of the cores large enough to
matter.

The defaults (:data:`MAX_OTHER_CPU_SHARE`, :data:`MAX_LOAD_PER_CORE`) and where they come from are
documented beside them. Part of the foundation: imports only psutil and :mod:`helpers.errors`.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass

import psutil

from helpers.errors import ParameterError

__all__ = ["BusyCheck", "MAX_LOAD_PER_CORE", "MAX_OTHER_CPU_SHARE", "MIN_OTHER_CPU_S", "MachineState", "check",
           "snapshot"]

#: Largest share of the usable cores that other processes (and the hypervisor's steal) may take while a
#: comparison is measured, before its verdict is called inconclusive. 0.25: on the 2-core machines this
#: workbook is tested on, one other busy process takes 0.5 and visibly changes step times (issue 11's
#: notebook 01 at load 5-8: compute 780 ms instead of 30 ms); a quarter of the cores leaves a quiet desktop's
#: background (browsers, editors: a few percent) below the bar.
MAX_OTHER_CPU_SHARE = 0.25
#: Other processes' CPU seconds below which a short interval is not judged: the runner's own polling and
#: writing (papermill, nbclient: the kernel's parent, outside its process tree) take a few hundred
#: milliseconds around a notebook, a large share of a sub-second interval but no threat to a measurement.
MIN_OTHER_CPU_S = 0.5
#: Largest 1-minute load average per usable core at the start of a measurement, when the caller asks for
#: that check (``max_load_per_core``): above 1.0 more tasks are runnable than there are cores (Linux
#: ``/proc/loadavg`` counts runnable and uninterruptible tasks). Off by default: the load average also counts
#: this workbook's own processes and lags by about a minute, so after a notebook that used every core it
#: would call the next one busy; the other-process CPU share below excludes our own processes.
MAX_LOAD_PER_CORE = 1.0


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def _job_root() -> "psutil.Process":
    """The root of the measured job's process tree: this process, or, in a rank that torchrun started
    (``TORCHELASTIC_RUN_ID`` and ``LOCAL_RANK`` set), the launcher whose children are all the job's local
    ranks, so that the other ranks on this machine count as the job's own work and not as other load."""
    me = psutil.Process()
    if "TORCHELASTIC_RUN_ID" in os.environ and "LOCAL_RANK" in os.environ:
        try:
            parent = me.parent()
        except psutil.Error:
            parent = None
        if parent is not None:
            return parent
    return me


def _own_cpu_s() -> float:
    """CPU seconds of the job's process tree (:func:`_job_root`): itself, its live children (DataLoader
    workers, ranks) and the children each of them has already waited for (``children_user`` /
    ``children_system``: a finished torchrun job and its ranks)."""
    me = _job_root()
    total = sum(me.cpu_times()[:4])
    for child in me.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:4])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return float(total)


@dataclass(frozen=True)
class MachineState:
    """The machine at one moment.

    Attributes
    ----------
    time_s : float
        ``time.monotonic()``, seconds.
    load_1min : float or None
        1-minute load average (None where the OS has none).
    cores : int
        Usable CPU cores (the process's affinity).
    busy_cpu_s : float
        CPU seconds the whole machine spent not idle (user, system, nice, irq, ...) since boot, all cores.
    steal_cpu_s : float
        CPU seconds stolen by the hypervisor since boot (0 where the OS does not report it).
    own_cpu_s : float
        CPU seconds used by this process and its live children so far.
    """

    time_s: float
    load_1min: float | None
    cores: int
    busy_cpu_s: float
    steal_cpu_s: float
    own_cpu_s: float

    def as_dict(self) -> dict:
        """The fields as a plain dict (for records)."""
        return asdict(self)


def snapshot() -> MachineState:
    """Read the machine's state now (cheap: a few ``/proc`` reads)."""
    t = psutil.cpu_times()
    idle = getattr(t, "idle", 0.0) + getattr(t, "iowait", 0.0)
    steal = float(getattr(t, "steal", 0.0) or 0.0)
    busy = float(sum(t)) - idle - steal - float(getattr(t, "guest", 0.0) or 0.0) \
        - float(getattr(t, "guest_nice", 0.0) or 0.0)  # guest time is already counted in user
    try:
        load = float(os.getloadavg()[0])
    except (AttributeError, OSError):
        load = None
    return MachineState(time_s=time.monotonic(), load_1min=load, cores=_usable_cores(), busy_cpu_s=busy,
                        steal_cpu_s=steal, own_cpu_s=_own_cpu_s())


@dataclass(frozen=True)
class BusyCheck:
    """Whether the machine was busy between two snapshots, and why.

    Attributes
    ----------
    busy : bool
    reasons : tuple of str
        One sentence per exceeded threshold, with its figures.
    other_cpu_share : float
        Share of the usable cores taken by other processes and steal over the interval (0..1, may exceed 1
        when processes outside the affinity set count).
    load_per_core : float or None
        The 1-minute load average at the start, per usable core.
    seconds : float
        Length of the interval.
    threshold : float
        The ``max_other_cpu_share`` it was checked against.
    """

    busy: bool
    reasons: tuple[str, ...]
    other_cpu_share: float
    load_per_core: float | None
    seconds: float
    threshold: float = MAX_OTHER_CPU_SHARE

    def sentence(self) -> str:
        """``"measured on a busy machine: ...; rerun when it is quiet"``, ``"the machine was quiet: ..."``, or, when
        other processes took more than the threshold over too short an interval to call it busy, ``"too short to
        judge the machine's load: ..."``."""
        if self.busy:
            return f"measured on a busy machine: {'; '.join(self.reasons)}; rerun when it is quiet"
        load = f", load {self.load_per_core:.2f} per core" if self.load_per_core is not None else ""
        if self.other_cpu_share > self.threshold:  # above the threshold, but too little CPU time to call it busy
            return (f"too short to judge the machine's load: other processes took {self.other_cpu_share:.0%} of the "
                    f"cores, but over only {self.seconds:.1f} s (fewer than {MIN_OTHER_CPU_S:g} CPU-seconds of "
                    f"theirs){load}; measure longer to know whether it was quiet")
        return (f"the machine was quiet while measuring: other processes took {self.other_cpu_share:.0%} of the "
                f"cores{load}")

    def as_dict(self) -> dict:
        """The fields as a plain dict (for records)."""
        return asdict(self)


def check(before: MachineState, after: MachineState, *, max_other_cpu_share: float = MAX_OTHER_CPU_SHARE,
          max_load_per_core: float | None = None) -> BusyCheck:
    """Compare two snapshots: did other work take more than ``max_other_cpu_share`` of the usable cores?

    Other work over the interval = (machine busy CPU time + steal) - (this process tree's CPU time), over
    ``seconds x usable cores``; fewer than :data:`MIN_OTHER_CPU_S` of other CPU seconds are never called
    busy. With ``max_load_per_core`` the load average at the start is checked too (see
    :data:`MAX_LOAD_PER_CORE` for why that is off by default); it is reported either way.

    Parameters
    ----------
    before, after : MachineState
        Snapshots around the measurement (``after`` later).
    max_other_cpu_share : float
        Threshold on the other-work share, 0..1 (default :data:`MAX_OTHER_CPU_SHARE`).
    max_load_per_core : float, optional
        Threshold on the starting load average per core (e.g. :data:`MAX_LOAD_PER_CORE`); None: not checked.

    Returns
    -------
    BusyCheck

    Raises
    ------
    ParameterError
        For thresholds that are not positive numbers, or snapshots in the wrong order.
    """
    for name, v in (("max_other_cpu_share", max_other_cpu_share), ("max_load_per_core", max_load_per_core)):
        if v is None and name == "max_load_per_core":
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ParameterError(f"{name} must be a positive number, got {v!r}")
    seconds = after.time_s - before.time_s
    if seconds < 0:
        raise ParameterError("check(before, after): 'after' was taken before 'before'")
    cores = max(1, min(before.cores, after.cores))
    machine = (after.busy_cpu_s - before.busy_cpu_s) + (after.steal_cpu_s - before.steal_cpu_s)
    own = after.own_cpu_s - before.own_cpu_s
    share = max(0.0, machine - own) / (seconds * cores) if seconds > 0 else 0.0
    load = before.load_1min / cores if before.load_1min is not None else None
    reasons = []
    if share > max_other_cpu_share and max(0.0, machine - own) >= MIN_OTHER_CPU_S:
        reasons.append(f"other processes took {share:.0%} of the {cores} usable core(s) while it measured "
                       f"(threshold {max_other_cpu_share:.0%})")
    if max_load_per_core is not None and load is not None and load > max_load_per_core:
        reasons.append(f"the load average was {before.load_1min:.1f} on {cores} core(s) when it started "
                       f"({load:.2f} per core, threshold {max_load_per_core:g})")
    return BusyCheck(busy=bool(reasons), reasons=tuple(reasons), other_cpu_share=share, load_per_core=load,
                     seconds=seconds, threshold=float(max_other_cpu_share))
