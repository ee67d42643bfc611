"""The busy-machine check: quiet when only this process works, busy under a synthetic load of other processes.

No assertion here needs a quiet machine (other users' processes may load it at any time): "quiet" is asserted on
constructed snapshots, and "busy" under a load that the test starts itself and whose CPU time it measures.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

import psutil
import pytest

from helpers import machine
from helpers.errors import ParameterError

pytestmark = pytest.mark.busy_safe


def _spin(seconds: float, *, cpu_s: float = 0.0) -> None:
    """Busy-loop for ``seconds`` of wall time, and on until this process has used ``cpu_s`` of CPU time
    (so that a test's own work is real even when other processes slow it down)."""
    t, c = time.perf_counter(), time.process_time()
    while time.perf_counter() - t < seconds or time.process_time() - c < cpu_s:
        pass


def test_own_work_is_not_other_work():
    """This process (and its children) working hard is the measurement itself, not a busy machine."""
    before = machine.snapshot()
    _spin(0.8, cpu_s=0.7)
    after = machine.snapshot()
    own = after.own_cpu_s - before.own_cpu_s
    whole = (after.busy_cpu_s - before.busy_cpu_s) + (after.steal_cpu_s - before.steal_cpu_s)
    assert own >= 0.65 and whole >= own - 0.1  # our own work is counted, and it is part of the machine's
    c = machine.check(before, after, max_other_cpu_share=0.9)
    assert c.seconds > 0.7
    assert c.other_cpu_share == pytest.approx(max(0.0, whole - own) / (c.seconds * min(before.cores, after.cores)))
    # the same interval had nothing else run (constructed: other users may load this machine now): quiet
    alone = replace(after, busy_cpu_s=before.busy_cpu_s + own, steal_cpu_s=before.steal_cpu_s)
    quiet = machine.check(before, alone)
    assert not quiet.busy and quiet.other_cpu_share == pytest.approx(0.0, abs=1e-9) and "quiet" in quiet.sentence()


def test_under_torchrun_the_other_local_ranks_are_the_jobs_own_work(monkeypatch):
    """A rank's root is torchrun's launcher, so its sibling ranks are not counted as other load."""
    import psutil

    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert machine._job_root().pid == os.getpid()
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert machine._job_root().pid == psutil.Process().ppid()


@pytest.mark.slow
def test_a_synthetic_load_of_other_processes_makes_the_machine_busy():
    """Two busy loops outside this process tree (orphaned by a shell, as another user's jobs would be)."""
    cores = machine.snapshot().cores
    n = max(2, cores)
    code = "import time\nt = time.time()\nwhile time.time() - t < 20: pass"
    out = subprocess.run(["sh", "-c", " ".join(f"{sys.executable} -c '{code}' >/dev/null 2>&1 & echo $!;"
                                           for _ in range(n))],
                         capture_output=True, text=True, timeout=30)
    pids = [int(p) for p in out.stdout.split()]
    try:
        time.sleep(0.5)  # the loops are running
        loops = [psutil.Process(pid) for pid in pids]
        loops_before = sum(sum(p.cpu_times()[:2]) for p in loops)
        before = machine.snapshot()
        _spin(1.5)  # this process measures meanwhile
        after = machine.snapshot()
        loops_cpu_s = sum(sum(p.cpu_times()[:2]) for p in loops) - loops_before
        c = machine.check(before, after)
        # whatever else runs on the machine, the loops' own CPU time is counted as other processes' work
        assert loops_cpu_s > 0
        assert c.other_cpu_share * c.seconds * min(before.cores, after.cores) >= 0.9 * loops_cpu_s - 0.1, c
        assert c.busy and c.other_cpu_share > machine.MAX_OTHER_CPU_SHARE, c
        assert c.sentence().startswith("measured on a busy machine: other processes took")
        assert c.sentence().endswith("rerun when it is quiet")
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_thresholds_and_order_are_checked():
    a = machine.snapshot()
    b = machine.snapshot()
    with pytest.raises(ParameterError, match="max_other_cpu_share"):
        machine.check(a, b, max_other_cpu_share=0)
    with pytest.raises(ParameterError, match="before"):
        machine.check(b, a)
    loaded = machine.MachineState(time_s=0.0, load_1min=8.0, cores=2, busy_cpu_s=0.0, steal_cpu_s=0.0, own_cpu_s=0.0)
    later = machine.MachineState(time_s=1.0, load_1min=8.0, cores=2, busy_cpu_s=0.1, steal_cpu_s=0.0, own_cpu_s=0.1)
    assert not machine.check(loaded, later).busy  # the load average alone is reported, not judged, by default
    judged = machine.check(loaded, later, max_load_per_core=machine.MAX_LOAD_PER_CORE)
    assert judged.busy and "load average was 8.0 on 2 core(s)" in judged.reasons[0]


def _busy_since(seconds: float, other_cpu_s_per_core: float) -> machine.MachineState:
    """A 'before' snapshot as if other processes had used other_cpu_s_per_core on every core since then."""
    now = machine.snapshot()
    return machine.MachineState(time_s=now.time_s - seconds, load_1min=now.load_1min, cores=now.cores,
                                busy_cpu_s=now.busy_cpu_s - other_cpu_s_per_core * now.cores,
                                steal_cpu_s=now.steal_cpu_s, own_cpu_s=now.own_cpu_s)


def test_a_verdict_measured_on_a_busy_machine_is_inconclusive_and_the_report_says_so(tmp_path):
    from helpers.experiments.base import VerdictResult
    from helpers.results import ResultsStore, load_results, verdicts
    from helpers.verdict import Action, Verdict
    from helpers.workbook.nbsetup import NotebookContext
    from helpers.workbook.report import collect
    from helpers.workbook.report.collect import _advice

    def ctx(nb, before):
        return NotebookContext(notebook=nb, params={"busy_cpu_share": 0.25}, acc=None, out_dir=tmp_path,
                               store=ResultsStore(tmp_path / "results.jsonl", notebook=nb), machine_before=before)

    v = Verdict(notebook="06_mixed_precision", metric="speedup", value=1.3, unit="x", recommendation="enable",
                reason="bf16 1.30x faster", action=Action("autocast_dtype", "bfloat16", "bf16 autocast: enable"))
    ctx("06_mixed_precision", _busy_since(10.0, 9.0)).record(VerdictResult(v), show=False)
    quiet = Verdict(notebook="07_channels_last", metric="speedup", value=1.2, unit="x", recommendation="enable",
                    reason="1.20x", action=Action("memory_format", "channels_last", "channels_last: enable"))
    ctx("07_channels_last", _busy_since(10.0, 0.0)).record(VerdictResult(quiet), show=False)
    rows = verdicts(load_results(tmp_path / "results.jsonl")).set_index("notebook")
    busy = rows.loc["06_mixed_precision"]
    assert busy["recommendation"] == "inconclusive" and "action" not in busy["extra"]
    assert busy["reason"].startswith("measured on a busy machine: other processes took")
    assert "What it measured: enable: bf16 1.30x faster" in busy["reason"]
    assert busy["extra"]["measured_recommendation"] == "enable" and busy["extra"]["machine"]["busy"]
    assert rows.loc["07_channels_last", "recommendation"] == "enable"
    advice = dict(_advice(collect(tmp_path)))
    assert advice["Inconclusive: the machine was busy or its speed changed while measuring (rerun when it is quiet)"] == "mixed precision"
    assert advice["Enable on this machine"] == ("channels_last: enable (notebook 07's isolated measurement only: "
                                                "notebook 10 did not run)")


def test_a_short_interval_above_the_threshold_is_not_called_quiet():
    c = machine.BusyCheck(busy=False, reasons=(), other_cpu_share=0.44, load_per_core=0.5, seconds=0.3, threshold=0.25)
    assert c.sentence().startswith("too short to judge the machine's load: other processes took 44% of the cores, "
                                   "but over only 0.3 s")
    quiet = machine.BusyCheck(busy=False, reasons=(), other_cpu_share=0.01, load_per_core=0.2, seconds=5.0)
    assert quiet.sentence().startswith("the machine was quiet while measuring")
