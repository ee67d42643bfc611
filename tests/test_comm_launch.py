"""Launcher of collective jobs: errors within the timeout, no stray process, reruns work."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import psutil
import pytest

from helpers.comm import launch
from helpers.errors import DeviceUnavailableError, ParameterError


def _my_descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if p.is_running()
            and p.status() != psutil.STATUS_ZOMBIE}


def test_two_launches_back_to_back_give_correct_sums():
    before = _my_descendants()
    a = launch.run_job("selftest_ok", {}, world_size=2, backend="gloo", timeout_s=90)
    b = launch.run_job("selftest_ok", {}, world_size=2, backend="gloo", timeout_s=90)
    for r in (a, b):
        assert r.data["sum"] == [3.0] * 4  # ranks fill 1 and 2
        assert r.data["world_size"] == 2 and r.backend == "gloo"
    assert a.data["pid"] != b.data["pid"]  # fresh processes each time
    assert _my_descendants() <= before


def test_hang_becomes_timeout_and_kills_every_process(tmp_path):
    before = _my_descendants()
    t0 = time.perf_counter()
    with pytest.raises(TimeoutError, match="timeout_s"):
        launch.run_job("selftest_hang", {}, world_size=2, backend="gloo", timeout_s=6, log_dir=tmp_path)
    assert list(tmp_path.glob("comm_selftest_hang_*/torchrun.log"))
    assert time.perf_counter() - t0 < 6 + 15  # timeout plus the kill grace periods
    time.sleep(0.5)
    assert _my_descendants() <= before
    # and no worker of that job survives anywhere (they run in sessions of their own)
    stray = [p for p in psutil.process_iter(["cmdline"])
             if "selftest_hang" in " ".join(p.info["cmdline"] or [])]
    assert stray == []


def test_dead_peer_is_named_with_exit_code(tmp_path):
    before = _my_descendants()
    with pytest.raises(RuntimeError, match=r"rank 1 exited with code 3") as info:
        launch.run_job("selftest_exit", {"pg_timeout_s": 60}, world_size=2, backend="gloo", timeout_s=90,
                       log_dir=tmp_path)
    msg = str(info.value)
    # the failed rank's own stderr is quoted, and the logs survive the job's temporary folder
    assert "selftest_exit: rank 1 leaves with status 3" in msg
    assert "rerun" in msg and "--world-size" in msg
    kept = list(tmp_path.glob("comm_selftest_exit_*"))
    assert len(kept) == 1 and str(kept[0]) in msg
    assert (kept[0] / "torchrun.log").is_file()
    stderr_logs = list(kept[0].glob("ranks/*/attempt_*/1/stderr.log"))
    assert stderr_logs and "leaves with status 3" in stderr_logs[0].read_text()
    time.sleep(0.5)
    assert _my_descendants() <= before


def test_rank_log_tail_prefers_stderr_and_handles_missing(tmp_path):
    d = tmp_path / "run1" / "attempt_0" / "1"
    d.mkdir(parents=True)
    (d / "stdout.log").write_text("out line\n")
    (d / "stderr.log").write_text("".join(f"err {i}\n" for i in range(30)))
    assert launch.rank_log_tail(tmp_path, 1, lines=3) == "err 27\nerr 28\nerr 29"
    assert launch.rank_log_tail(tmp_path, 0) == ""
    (d / "stderr.log").write_text("")
    assert launch.rank_log_tail(tmp_path, 1) == "out line"


def test_port_in_use_is_refused_before_launch():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert not launch.port_is_free(port)
        with pytest.raises(ParameterError, match=f"master_port={port} is already in use"):
            launch.run_job("selftest_ok", {}, world_size=2, backend="gloo", master_port=port, timeout_s=30)


def test_world_size_beyond_the_machine_is_refused():
    n, why = launch.max_world_size("gloo")
    assert n >= 2 and "gloo limit" in why
    with pytest.raises(ParameterError, match="larger than what can run here"):
        launch.check_world_size(n + 1, "gloo")
    # memory: a rank that needs more memory than the machine has
    with pytest.raises(ParameterError, match="world_size=3"):
        launch.check_world_size(3, "gloo", bytes_per_rank=psutil.virtual_memory().total)


def test_world_size_beyond_visible_gpus_is_refused(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ParameterError, match="at most 1 .1 visible CUDA device"):
        launch.check_world_size(2, "nccl")
    launch.check_world_size(1, "nccl")


def test_unavailable_backends_raise_clear_errors(monkeypatch):
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(DeviceUnavailableError, match="nccl"):
            launch.check_backend("nccl")
        with pytest.raises(DeviceUnavailableError, match="nccl"):
            launch.run_job("selftest_ok", {}, world_size=2, backend="nccl", timeout_s=30)
    monkeypatch.setattr("helpers.device.get_accelerator",
                        lambda *a, **k: (_ for _ in ()).throw(DeviceUnavailableError("no torch_npu")))
    with pytest.raises(DeviceUnavailableError, match="hccl"):
        launch.check_backend("hccl")
    with pytest.raises(ParameterError):
        launch.resolve_backend("mpi")


def test_resolve_backend_auto():
    assert launch.resolve_backend("auto", "cpu") == "gloo"
    assert launch.resolve_backend("auto", "cuda") == "nccl"
    assert launch.resolve_backend("auto", "npu") == "hccl"
    assert launch.resolve_backend("gloo", "cuda") == "gloo"


def test_failed_rank_parser_prefers_root_cause():
    text = ("Failures:\n[1]:\n  rank      : 1 (local_rank: 1)\n  exitcode  : -15 (pid: 9)\n"
            "Root Cause (first observed failure):\n[0]:\n  rank      : 0 (local_rank: 0)\n  exitcode  : 1 (pid: 8)\n")
    assert launch.failed_rank(text) == (0, 1)
    assert launch.failed_rank("nothing here") is None


@pytest.mark.slow
def test_kill_9_of_the_launching_process_leaves_no_torchrun_or_rank(tmp_path):
    """A runner or kernel killed with SIGKILL mid-job: torchrun and every rank die with it (issue 11)."""
    import signal
    import subprocess
    import sys

    code = ("from helpers.comm import launch\n"
            f"launch.run_job('selftest_hang', {{}}, world_size=2, backend='gloo', timeout_s=120, log_dir={str(tmp_path)!r})")
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1])
    try:
        deadline = time.monotonic() + 60
        job: list = []
        def ranks(procs):
            return [p for p in procs if "helpers.comm.worker" in p[1] and "torch.distributed.run" not in p[1]]

        while time.monotonic() < deadline and len(ranks(job)) < 2:
            time.sleep(0.3)
            try:
                job = [(c.pid, " ".join(c.cmdline())) for c in psutil.Process(parent.pid).children(recursive=True)]
            except psutil.NoSuchProcess:
                break
        assert len(ranks(job)) == 2 and any("torch.distributed.run" in p[1] for p in job), job
        time.sleep(1.0)  # the ranks are in the process group, waiting forever
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=30)
        alive = job
        for _ in range(50):
            alive = [(pid, cmd) for pid, cmd in job if psutil.pid_exists(pid)
                     and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
            if not alive:
                break
            time.sleep(0.2)
        assert alive == [], alive
    finally:
        if parent.poll() is None:
            parent.kill()
