"""Issue 24: the instrument across ranks and nodes: one table, one verdict, the slow rank or node named.

Fast tests build rank payloads by hand (a synchronous DDP job: the fast ranks' compute phase holds their wait
for the slow one) and run the file rendezvous with plain processes; the slow ones launch torchrun (gloo, CPU):
one launch of 2 ranks, and two launches of 2 ranks as two nodes on this machine.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.comm import gather
from helpers.errors import ParameterError
from helpers.workbook import instrument as inst

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "tests" / "instrument_ranks_job.py"


def _state(t, busy, own):
    return {"time_s": t, "load_1min": 0.5, "cores": 2, "busy_cpu_s": busy, "steal_cpu_s": 0.0, "own_cpu_s": own}


def _payloads(slow=(), nodes=(0, 0, 1, 1), extra=0.040, n=12, seed=0, synchronous=True, counts=None):
    """A DDP job of len(nodes) ranks: every step lasts as long as the slowest rank's; the others wait in compute."""
    rng = random.Random(seed)
    world = len(nodes)
    data = {r: [0.0002 + (extra if r in slow else 0.0) + rng.uniform(0, 1e-4) for _ in range(n)] for r in range(world)}
    own = 0.010
    step = [max(data[r][i] for r in range(world)) + own + rng.uniform(0, 5e-4) for i in range(n)]
    out = {}
    for r in range(world):
        m = counts[r] if counts else n
        out[r] = {"rank": r, "node_rank": nodes[r], "host": "vm", "launch": 100 + nodes[r], "node": f"{nodes[r]} (vm)",
                  "device_kind": "cpu",
                  "steps": {"data": data[r][:m], "copy": [0.0] * m,
                            "compute": [step[i] - data[r][i] for i in range(m)], "step_s": step[:m]},
                  "n_steps": m, "copy_marked": False, "synchronous": synchronous, "ddp": None, "ddp_note": "no model",
                  # two launches on one host: each launch's own CPU is the job's; together they took the machine
                  "machine_before": _state(0.0, 100.0, 10.0), "machine_after": _state(10.0, 118.0, 19.0)}
    return out


def test_a_slow_node_makes_the_job_host_bound_though_rank_0_looks_device_bound():
    p = _payloads(slow=(2, 3))
    rep = inst.job_report(p, world_size=4, transport="process group")
    by_rank = rep.table.set_index("rank")
    assert by_rank.loc[0, "exposed_pct"] < 5 and by_rank.loc[2, "exposed_pct"] > 60  # rank 0 alone: device-bound
    assert rep.measured_recommendation == "host-bound" and rep.exposed_fraction > 0.6
    assert rep.slow.node == "1 (vm)" and rep.slow.phase == "data" and sorted(rep.slow.ranks) == [2, 3]
    assert rep.bound_by == "node 1 (vm), ranks 2 and 3"
    lines = rep.lines("my loop")
    assert lines[0].startswith("my loop: 4 of 4 ranks on 2 node(s), 12 steps measured per rank")
    assert lines[1].split() == ["rank", "node", "steps", "data", "ms", "copy", "ms", "compute", "ms", "step", "ms",
                                "exposed"]
    assert len([ln for ln in lines if ln.startswith("job: ")]) == 1  # one verdict for the job
    assert "job: host-bound because of node 1 (vm), ranks 2 and 3" in "\n".join(lines)
    assert any(ln.startswith("slow: Node 1 (vm) is slower than the others") for ln in lines)
    assert "is their wait for node 1 (vm)" in "\n".join(lines)
    # both launches on the host counted as the job's work: 18 CPU-s of the machine, 2 x 9 of them the job's
    assert rep.machine is not None and not rep.machine.busy and rep.recommendation == "host-bound"
    assert json.loads(json.dumps(rep.as_dict(), default=str))["slow"]["node"] == "1 (vm)"


def test_one_slow_rank_is_named_and_none_slow_is_device_bound():
    rep = inst.job_report(_payloads(slow=(1,)), world_size=4)
    assert rep.slow.slow_ranks == ("rank 1",) and rep.slow.node is None and rep.slow.phase == "data"
    assert rep.measured_recommendation == "host-bound" and rep.bound_by == "rank 1 on node 0 (vm)"
    quiet = inst.job_report(_payloads(slow=()), world_size=4)
    assert quiet.slow.findings == () and quiet.measured_recommendation == "device-bound"
    assert quiet.verdict_line.startswith("job: device-bound: no rank's input is exposed more than 10%")


def test_missing_ranks_and_different_step_counts_are_said():
    p = _payloads(slow=(), counts=[12, 12, 9, 12])
    del p[3]
    rep = inst.job_report(p, world_size=4, missing=(3,))
    text = "\n".join(rep.lines())
    assert rep.missing == (3,) and "3 of 4 ranks" in text.splitlines()[0]
    assert "rank(s) 3 of 4 did not report within the timeout" in text
    assert "different numbers of steps (rank 0: 12, rank 1: 12, rank 2: 9)" in text
    with pytest.raises(ParameterError, match="no rank measured 3 steps"):
        inst.job_report({0: _payloads(counts=[2, 2, 2, 2])[0]}, world_size=4)


def test_ddp_timers_split_the_compute_and_say_what_hid_behind_backward():
    p = _payloads(slow=(2, 3))
    for r, d in p.items():
        comm = 0.041 if r in (0, 1) else 0.002  # the fast ranks wait in the allreduce
        d["ddp"] = {"forward_s": 0.003, "backward_compute_s": 0.005, "backward_comm_s": comm, "overlap_s": 0.001,
                    "hidden_fraction": 0.001 / comm, "exposed_comm_s": comm - 0.001}
    rep = inst.job_report(p, world_size=4)
    assert rep.slow.node == "1 (vm)" and rep.slow.wait.phase == "comm" and "compute" not in rep.slow.phases
    assert rep.communication.startswith("allreduce hidden behind backward (DDP's own timers")
    assert "rank 0 2% of 41.0 ms (forward + backward compute 8.0 ms)" in rep.communication
    assert "rank 2 50% of 2.0 ms" in rep.communication
    assert any("DDP's own forward + backward compute per rank is on the communication line" in n for n in rep.notes)
    none = inst.ddp_timers(None)
    assert none[0] is None and "model=ddp_model" in none[1]
    assert "not a DistributedDataParallel" in inst.ddp_timers(object())[1]


def test_ranks_without_a_group_compare_compute_as_work():
    rep = inst.job_report(_payloads(slow=(), synchronous=False), world_size=4)
    assert "compute" in rep.slow.phases and rep.communication.startswith("none through torch.distributed")


@pytest.mark.parametrize("env, want", [
    ({}, (0, 1, None, "none")),
    ({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "GROUP_RANK": "1", "TORCHELASTIC_RUN_ID": "x"},
     (3, 4, 1, "torchrun")),
    ({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "2"}, (5, 8, 2, "slurm")),
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "NODE_RANK": "1"}, (1, 2, 1, "env")),
    ({"RANK": "9", "WORLD_SIZE": "16", "LOCAL_RANK": "1", "CROSS_RANK": "1", "LOCAL_SIZE": "8"},
     (9, 16, 1, "deepspeed")),
])
def test_rank_identity_from_each_launcher(env, want):
    ident = gather.RankIdentity.from_env(env)
    assert (ident.rank, ident.world_size, ident.node_rank, ident.source) == want
    if ident.node_rank is not None:
        assert ident.node == f"{ident.node_rank} ({socket.gethostname()})"


@pytest.mark.parametrize("env, match", [({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' is not an integer"),
                                        ({"RANK": "2", "WORLD_SIZE": "2"}, "rank in"),
                                        ({"RANK": "0"}, "WORLD_SIZE is not")])
def test_bad_launcher_variables_are_named(env, match):
    with pytest.raises(ParameterError, match=match):
        gather.RankIdentity.from_env(env)


def test_world_size_1_is_the_single_process_report(monkeypatch, tmp_path):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    steps = inst.instrument(range(6), device="cpu", warmup=1, gather_dir=tmp_path / "never")
    for _ in steps:
        time.sleep(0.001)
    r = steps.report(print_it=False)
    assert isinstance(r, inst.LoopReport) and len(r.steps) == 5 and not (tmp_path / "never").exists()


def test_a_rendezvous_folder_that_cannot_be_written_is_named_when_the_wrapper_is_made(monkeypatch, tmp_path):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ParameterError, match=r"rendezvous folder .*a-file/sub: cannot write there"):
        inst.instrument(range(3), device="cpu", gather_dir=blocker / "sub")


_RANK_SCRIPT = """
import os, signal, sys, time
from helpers.workbook.instrument import instrument
rank = int(os.environ["RANK"])
def loader():
    for i in range(8):
        time.sleep(0.03 if rank == 1 else 0.0)  # rank 1's reader waits
        yield i
loop = instrument(loader(), device="cpu", warmup=1, gather_dir=sys.argv[1], gather_timeout_s=float(sys.argv[2]))
for _ in loop:
    time.sleep(0.002)
if rank == int(sys.argv[3]):
    os.kill(os.getpid(), signal.SIGKILL)  # dies before report()
loop.report()
"""


def _ranks_by_hand(tmp_path, world, die, timeout_s):
    procs = []
    for r in range(world):
        env = {**os.environ, "RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r),
               "PYTHONPATH": str(ROOT)}
        procs.append(subprocess.Popen([sys.executable, "-c", _RANK_SCRIPT, str(tmp_path / "rdzv"), str(timeout_s),
                                       str(die)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return [p.communicate(timeout=120) + (p.returncode,) for p in procs]


@pytest.mark.slow  # three processes that import torch: about 15 s on 2 busy cores
@pytest.mark.busy_safe  # the slow rank's figure is a sleep
def test_file_rendezvous_before_any_process_group_gives_one_report(tmp_path):
    out = _ranks_by_hand(tmp_path, 3, die=-1, timeout_s=60)
    assert [rc for *_, rc in out] == [0, 0, 0], out[0][1][-2000:]
    assert out[1][0] == "" and out[2][0] == ""  # the other ranks print nothing
    text = out[0][0]
    assert text.startswith("your loop: 3 of 3 ranks") and f"folder {tmp_path / 'rdzv'}" in text
    assert "slow: rank 1 is the slow rank: its data phase" in text
    assert f"job: host-bound because of rank 1 on node {socket.gethostname()}: its input is exposed up to" in text
    assert list((tmp_path / "rdzv").glob("*.json")) == []  # rank 0 cleans up what it read


@pytest.mark.slow
@pytest.mark.busy_safe
def test_a_rank_killed_before_report_is_named_and_the_others_are_reported(tmp_path):
    t0 = time.monotonic()
    out = _ranks_by_hand(tmp_path, 3, die=2, timeout_s=3)
    assert out[2][2] == -9 and out[0][2] == 0, out[0][1][-2000:]
    text = out[0][0]
    assert text.startswith("your loop: 2 of 3 ranks")
    assert "rank(s) 2 of 3 did not report within the timeout" in text
    assert "slow: rank 1 is the slow rank" in text
    assert time.monotonic() - t0 < 60


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(tmp_path, *, nodes, env=(), timeout_s=150):
    """``nodes`` torchrun launches of 2 gloo ranks each on this machine (c10d rendezvous on a free port), running
    tests/instrument_ranks_job.py; returns (rank 0's report as a dict, each launch's stdout, stderr)."""
    port, out = _free_port(), tmp_path / "report.json"
    base = {**os.environ, "PYTHONPATH": str(ROOT), "OUT": str(out), "OMP_NUM_THREADS": "1", **dict(env)}
    procs = []
    for n in range(nodes):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nodes), "--node-rank", str(n),
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--nproc-per-node", "2",
               "--monitor-interval", "0.5", str(JOB)]
        procs.append(subprocess.Popen(cmd, env=base, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    try:
        res = [p.communicate(timeout=timeout_s) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs), "\n".join(e[-3000:] for _, e in res)
    return json.loads(out.read_text()), [o for o, _ in res], [e for _, e in res]


@pytest.mark.slow
@pytest.mark.busy_safe  # the slowed loader is a sleep
def test_two_ranks_under_torchrun_print_one_table_and_one_verdict(tmp_path):
    rep, outs, _ = _torchrun(tmp_path, nodes=1, env={"SLOW_RANK": "1", "WITH_MODEL": "1"})
    printed = outs[0]
    assert printed.count("your loop: ") == 1 and printed.count("\njob: ") == 1  # rank 1 printed nothing
    assert printed.startswith("your loop: 2 of 2 ranks on 1 node(s), 12 steps measured per rank (gathered through "
                              "the process group")
    assert [r["rank"] for r in rep["ranks"]] == [0, 1]
    assert rep["slow"]["slow_ranks"] == ["rank 1"] and rep["slow"]["phase"] == "data"
    assert rep["measured_recommendation"] == "host-bound" and rep["bound_by"].startswith("rank 1 on node 0 (")
    assert rep["communication"].startswith("allreduce hidden behind backward (DDP's own timers")


@pytest.mark.slow
@pytest.mark.busy_safe
@pytest.mark.parametrize("slowed", ["node", "rank", "none"])
def test_two_nodes_on_this_machine_name_the_slow_node_the_slow_rank_or_none(tmp_path, slowed):
    env = {"node": {"SLOW_NODE": "1"}, "rank": {"SLOW_RANK": "2"}, "none": {}}[slowed]
    rep, outs, _ = _torchrun(tmp_path, nodes=2, env=env)
    text = outs[0] + outs[1]
    assert text.count("your loop: ") == 1 and text.count("\njob: ") == 1
    nodes = {r["rank"]: r["node"] for r in rep["ranks"]}
    assert sorted(nodes) == [0, 1, 2, 3] and len(set(nodes.values())) == 2
    node1 = [r for r, n in nodes.items() if n.startswith("1 (")]
    slow = rep["slow"]
    if slowed == "node":
        assert slow["node"] == nodes[node1[0]] and sorted(slow["ranks"]) == sorted(node1) == [2, 3]
        assert slow["phase"] == "data" and rep["measured_recommendation"] == "host-bound"
        assert rep["verdict"].startswith("job: ") and f"host-bound because of node {slow['node']}" in rep["verdict"]
        print(outs[0])  # the note's printed report (pytest -s)
    elif slowed == "rank":
        assert slow["node"] is None and slow["ranks"] == [2] and slow["phase"] == "data"
        assert rep["measured_recommendation"] == "host-bound"
    else:
        assert slow["findings"] == [] and rep["measured_recommendation"] == "device-bound"


_SLOW_JOB = '''
import os, time
import torch
from helpers.jobs.supervised import supervised_job


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, i):
        if os.environ.get("RANK") == "1":
            time.sleep(0.01)  # rank 1's samples are slow to read
        return torch.full((16,), float(i % 7)), torch.tensor(float(i % 3))


def make_job(batch_size=4):
    torch.set_num_threads(1)
    return supervised_job(Data(), lambda: torch.nn.Linear(16, 1), lambda o, y: torch.nn.functional.mse_loss(
        o.squeeze(-1), y), lambda p: torch.optim.SGD(p, lr=0.01), batch_size=batch_size, name="slow job")
'''


@pytest.mark.slow
@pytest.mark.busy_safe  # rank 1's loader is a sleep
def test_diagnose_under_torchrun_reports_every_rank_and_the_jobs_ceiling(tmp_path):
    (tmp_path / "slowjob.py").write_text(_SLOW_JOB)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "helpers",
           "diagnose", "--job", f"{tmp_path / 'slowjob.py'}:make_job", "--device", "cpu", "--steps", "6",
           "--warmup-steps", "1", "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=200, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout)  # rank 0 alone prints: its own runs, and the job's
    job = out["job_ranks"]
    assert [r["rank"] for r in job["ranks"]] == [0, 1] and job["missing"] == []
    assert job["ranks"][0]["exposed_input_fraction"] < 0.10 < job["ranks"][1]["exposed_input_fraction"]
    assert job["measured_recommendation"] == "host-bound" and job["bound_by"].startswith("rank 1 on node 0 (")
    assert job["slow"]["slow_ranks"] == ["rank 1"] and job["slow"]["phase"] == "data"
    assert job["free_input_speedup"]["ratio"] > 1.5


def _three_run_payload(rank, exposed, real, synth, data_s):
    steps = {"data": [data_s] * 6, "h2d": [0.0] * 6, "compute": [real / 1e3 - data_s] * 6, "step_s": [real / 1e3] * 6}
    return {"rank": rank, "node": "0 (vm)", "device_kind": "cpu", "recommendation": "host-bound" if exposed > 0.1
            else "device-bound", "measured_recommendation": "", "exposed_input_fraction": exposed,
            "step_ms": {"real": real, "cached": synth + 1, "synthetic": synth},
            "free_input_speedup": {"ratio": real / synth, "ci_low": real / synth - 0.5, "ci_high": real / synth + 0.5},
            "real_steps": steps}


def test_the_jobs_free_input_ceiling_is_the_slowest_ranks():
    from helpers.workbook.job_diagnose import job_summary

    s = job_summary({0: _three_run_payload(0, 0.01, 50.0, 6.0, 0.0005),
                     1: _three_run_payload(1, 0.85, 49.0, 5.0, 0.042)}, world_size=3, missing=(2,))
    assert s["measured_recommendation"] == "host-bound" and s["bound_by"] == "rank 1 on node 0 (vm)"
    assert s["free_input_speedup"]["ratio"] == pytest.approx(50.0 / 6.0)
    assert s["free_input_speedup"]["slowest_rank"] == 0
    text = "\n".join(s["lines"])
    assert "the job's free-input ceiling: 8.33x" in text and "the slowest rank bounds a synchronous job" in text
    assert "rank(s) 2 did not report within the timeout" in text and "slow: rank 1 is the slow rank" in text


@pytest.mark.slow
def test_the_overhead_under_torchrun_with_two_ranks_is_measured_per_rank(tmp_path):
    """tests/instrument_overhead_job.py: a small DDP step (a few ms), plain and instrumented blocks interleaved, in
    both ranks. The 3% target is a speed figure, so it is `python -m helpers bench instrument`'s to report (a ratio
    measured in one run, with the machine's state); a test asserts only what holds on a busy machine too: each rank
    measured both arms, its ratio inside its interval, the instrument's own calls a share of the step (a run here
    with a load of 4 on the 2 cores gave an interval from 1.065 up, which an assertion of the target failed)."""
    out = tmp_path / "overhead.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(ROOT / "tests" / "instrument_overhead_job.py"), str(out), "30", "8", "tiny"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=200, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(out.read_text())
    assert [r["rank"] for r in res["ranks"]] == [0, 1] and res["world_size"] == 2
    for r in res["ranks"]:
        print(f"rank {r['rank']}: overhead {r['overhead']:.3f}x ({r['ci_low']:.3f}-{r['ci_high']:.3f}), "
              f"own calls {r['cost_share_of_step']:.2%} of the step")
        assert 0 < r["ci_low"] <= r["overhead"] <= r["ci_high"]
        assert 0 < r["cost_share_of_step"] < 1, r


def test_file_gather_in_one_process_keeps_to_its_own_job(tmp_path):
    r0, r1 = gather.RankIdentity(rank=0, world_size=2), gather.RankIdentity(rank=1, world_size=2)
    assert gather.gather_to_root({"x": 1}, r1, name="t-1", folder=tmp_path, started_at=1000.0) is None
    got = gather.gather_to_root({"x": 0}, r0, name="t-1", folder=tmp_path, started_at=1005.0, timeout_s=5)
    assert got.payloads == {0: {"x": 0}, 1: {"x": 1}} and got.missing == () and got.transport.startswith("folder")
    # a file left by an earlier launch with the same key (rank 1 started an hour before rank 0) is not this job's
    gather.gather_to_root({"x": "old"}, r1, name="t-2", folder=tmp_path, started_at=1000.0)
    stale = gather.gather_to_root({"x": 0}, r0, name="t-2", folder=tmp_path, started_at=4600.0, timeout_s=0.3)
    assert stale.missing == (1,) and set(stale.payloads) == {0}
    with pytest.raises(ParameterError, match="timeout_s"):
        gather.gather_to_root({}, r0, name="t", folder=tmp_path, timeout_s=0)
    with pytest.raises(ParameterError, match="name"):
        gather.gather_to_root({}, r0, name="a/b", folder=tmp_path)
    with pytest.raises(ParameterError, match="not JSON"):
        gather.gather_to_root({"x": object()}, r0, name="t", folder=tmp_path)
    with pytest.raises(ParameterError, match="no rendezvous folder"):
        gather.gather_to_root({}, r0, name="t", folder=None)


@pytest.mark.slow
def test_under_torchrun_a_killed_rank_stops_the_job_and_rank_0_reports_the_others_first(tmp_path):
    """torchrun ends the remaining ranks with SIGTERM when one dies: rank 0, waiting in report(), reports the
    ranks present, names the dead one, then ends as torchrun asked (no hang, no 60 s timeout)."""
    t0 = time.monotonic()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "--monitor-interval", "0.5", str(JOB)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=200, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "DIE_RANK": "1",
                            "GATHER_TIMEOUT": "120"})
    assert p.returncode != 0  # the job failed: torchrun says so
    assert p.stdout.startswith("your loop: 1 of 2 ranks on 1 node(s)"), p.stderr[-3000:]
    assert "rank(s) 1 of 2 did not report: the launcher stopped the job (SIGTERM: a rank failed)" in p.stdout
    assert time.monotonic() - t0 < 110  # well before rank 0's 120 s timeout


def test_the_job_machine_check_counts_every_launch_on_a_host_once():
    p = _payloads(slow=(2, 3))
    assert not inst.job_report(p, world_size=4).machine.busy  # two launches of 9 CPU-s: the machine's 18 are the job's
    for d in p.values():
        d["launch"] = 100  # as if one launch: the other 9 CPU-s are other processes', 45% of 2 cores over 10 s
    rep = inst.job_report(p, world_size=4)
    assert rep.machine.busy and rep.machine.other_cpu_share == pytest.approx(0.45)
    assert rep.recommendation == "inconclusive" and rep.measured_recommendation == "host-bound"
    assert rep.verdict_line.startswith("job: inconclusive: measured on a busy machine")
