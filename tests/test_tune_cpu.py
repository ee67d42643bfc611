"""tune's CPU candidates (the PyTorch Performance Tuning Guide's "Utilize OpenMP" and "Switch Memory allocator"):
the training process's intra-op threads against its DataLoader workers, and jemalloc/tcmalloc through LD_PRELOAD,
proposed as the launch command. Fakes throughout; one real run (slow) checks the hook's record and what it applies.
"""

from __future__ import annotations

import shlex
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import machine
from helpers.tune import candidates_cpu as cpu
from helpers.tune.candidates import Candidate
from helpers.tune.engine import Run, _hook_env, judge, parse_command, run_once
from helpers.tune.rewrite import Edit, apply_edits, unified_diff
from helpers.tune.session import TuneOptions, TuneResult

QUIET = machine.BusyCheck(False, (), 0.01, 0.2, 60.0)
JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
LDCONFIG = textwrap.dedent("""\
    1234 libs found in cache `/etc/ld.so.cache'
    \tlibtcmalloc_minimal.so.4 (libc6,x86-64) => /lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
    \tlibjemalloc.so.2 (libc6,x86-64) => /lib/x86_64-linux-gnu/libjemalloc.so.2
    \tlibc.so.6 (libc6,x86-64) => /lib/x86_64-linux-gnu/libc.so.6
    """)


def _probe(threads=2, workers=0, cores=2, device="cpu", **cpu_over):
    rec = {"threads": threads, "threads_at_start": threads, "set_sites": [], "env": {"OMP_NUM_THREADS": None},
           "env_set_by_script": [], "cores": cores, "ld_preload": "", "allocators": []}
    rec.update(cpu_over)
    return {"cpu": rec, "model": {"param_device": device},
            "loaders": [{"file": "/s/train.py", "line": 8, "effective": {"num_workers": workers}}]}


def _runs(name, per_round_ms, n=20):
    return [Run(name, r, "steps", [ms / 1e3 * (1 + 0.01 * ((i * 7) % 5)) for i in range(n)], [1.0] * (n + 5), 5.0,
                "", {"warmup_steps": 5, "first_step_s": 1.0}) for r, ms in enumerate(per_round_ms)]


# ---------------------------------------------------------------- the threads


def test_busy_workers_beside_a_process_on_every_core_get_the_cores_less_the_workers():
    (c,), skipped = cpu.thread_candidates(_probe(threads=2, workers=2, cores=2), cores=2)
    assert not skipped and c.technique == "intra_op_threads" and c.apply == {"threads": 1}
    assert c.name == "torch.set_num_threads(1)" and c.why == ("2 intra-op threads and 2 DataLoader workers (one thread "
                                                              "each) share 2 cores")
    more, _ = cpu.thread_candidates(_probe(threads=8, workers=4, cores=8), cores=8)
    assert [x.apply["threads"] for x in more] == [4, 6]  # the cores less the workers, and less half of them


@pytest.mark.parametrize("probe, cores, why", [
    (_probe(set_sites=[{"file": "/s/train.py", "line": 3, "count": 1, "value": 4}]), 2,
     "the script sets them itself: torch.set_num_threads(4) on line 3"),
    (_probe(env_set_by_script=["OMP_NUM_THREADS"]), 2, "the script sets OMP_NUM_THREADS itself"),
    (_probe(threads=1, cores=1), 1, "one usable core"),
    (_probe(workers=2, device="cuda"), 2, "the model runs on the cuda"),
    (_probe(threads=2, workers=0), 2, "2 intra-op threads match the 2 usable cores, and no DataLoader worker"),
    (_probe(threads=1, workers=2, cores=2), 2, "already runs 1 intra-op thread beside 2 DataLoader workers"),
    ({**_probe(threads=1, cores=1), "ranks": 2}, 1, "one usable core per rank (2 ranks share the machine's cores)"),
])
def test_the_threads_are_left_alone_with_a_reason(probe, cores, why):
    out, skipped = cpu.thread_candidates(probe, cores=cores)
    assert out == [] and len(skipped) == 1 and skipped[0][0] == "intra_op_threads"
    assert why in skipped[0][1]


def test_no_workers_and_fewer_threads_than_cores_tries_the_cores_and_names_the_environment():
    (c,), _ = cpu.thread_candidates(_probe(threads=1, cores=4, env={"OMP_NUM_THREADS": "1"}), cores=4)
    assert c.apply == {"threads": 4} and "(OMP_NUM_THREADS=1 in your environment)" in c.why
    (c,), _ = cpu.thread_candidates({**_probe(threads=1, cores=8, env={"OMP_NUM_THREADS": "1"}), "ranks": 2}, cores=8)
    assert c.why == ("the training process runs its ops on 1 thread, on 8 usable cores per rank (OMP_NUM_THREADS=1: "
                     "torchrun's default for each of 2 ranks, or your environment's)")


def test_where_tune_adds_the_workers_the_threads_wait_for_the_winner_then_follow_it():
    probe = _probe(threads=2, workers=0)
    assert cpu.thread_candidates(probe, cores=2, workers_tried=True) == ([], [])  # no line: the follow-up decides
    workers = Candidate("num_workers=2", "num_workers", {"loader": {"num_workers": 2, "persistent_workers": True}})
    extra, why = cpu.threads_follow_up([workers], probe, cores=2)
    assert why == "" and extra.against == "num_workers=2" and extra.technique == "intra_op_threads"
    assert extra.name == "num_workers=2 + torch.set_num_threads(1)"
    assert extra.apply == {"loader": {"num_workers": 2, "persistent_workers": True}, "threads": 1}
    none, why = cpu.threads_follow_up([], probe, cores=2)
    assert none is None and "no num_workers setting was faster here" in why
    # a framework's workers (transformers' TrainingArguments): its edit, and the threads at runtime beside it
    fw = Candidate("dataloader_num_workers=2", "num_workers",
                   {"edits": [{"call": "TrainingArguments", "line": 9, "values": {"dataloader_num_workers": 2}}]})
    extra, _ = cpu.threads_follow_up([fw], probe, cores=2)
    assert extra.apply["threads"] == 1 and extra.apply["edits"] == fw.apply["edits"]
    # the script had workers: the first round covered it; it sets its threads: nothing to follow
    assert cpu.threads_follow_up([workers], _probe(workers=1), cores=2) == (None, "")
    assert cpu.threads_follow_up([workers], _probe(set_sites=[{"line": 1}]), cores=2) == (None, "")


def test_one_core_per_rank_is_said_once_not_again_by_the_follow_up():
    probe = {**_probe(threads=1, cores=1), "ranks": 2}  # torchrun: 2 ranks on 2 cores, OMP_NUM_THREADS=1
    _, skipped = cpu.thread_candidates(probe, cores=1)
    assert len(skipped) == 1 and "one usable core per rank" in skipped[0][1]
    assert cpu.threads_follow_up([], probe, cores=1) == (None, "")


def test_the_follow_up_runs_the_threads_on_top_of_the_winning_workers(tmp_path, monkeypatch):
    from helpers.tune import session

    script = tmp_path / "train.py"
    script.write_text("import torch\n")
    seen = []

    def fake_measure(command, variants, **kw):
        seen.append([(name, apply) for name, apply, _ in variants])
        ms = {variants[0][0]: 80}
        return {name: _runs(name, [ms.get(name, 50)] * 3) for name, _, _ in variants}, QUIET

    monkeypatch.setattr(session, "measure", fake_measure)
    workers = Candidate("num_workers=2", "num_workers", {"loader": {"num_workers": 2, "persistent_workers": True}})
    res = TuneResult("python train.py", tmp_path / "out", _probe(), candidates=[workers], cores=2)
    (tmp_path / "out").mkdir()
    winners = session._follow_up(parse_command(["python", str(script)], cwd=tmp_path), [workers], res,
                                 TuneOptions(), tmp_path / "work", 60.0, False, lambda line: None)
    names = [n for n, _ in seen[0]]
    assert names == ["num_workers=2", "num_workers=2 + prefetch_factor=4", "num_workers=2 + torch.set_num_threads(1)"]
    # both faster than the workers alone: both take the winner's place; their DataLoader settings merge
    assert [c.name for c in winners] == names[1:]
    merged = session.cand_mod.merge_apply(winners)
    assert merged["threads"] == 1 and merged["loader"]["prefetch_factor"] == 4
    edits = session.plan_edits(res.probe, winners, script)
    assert [e.kind for e in edits if e.technique == "intra_op_threads"] == ["set_threads"]


# ---------------------------------------------------------------- the rewrite


SCRIPT = textwrap.dedent('''\
    """Train."""
    import os

    os.environ.setdefault("KMP_WARNINGS", "0")
    import torch as th
    from torch.utils.data import DataLoader


    def main():
        loader = DataLoader(range(8), num_workers=0)
    ''')


def test_the_threads_are_written_after_the_last_import_under_the_files_own_name_for_torch():
    edits = cpu.cpu_edits(_probe(), {"threads": 1, "loader": {"num_workers": 2}}, "/s/train.py")
    loader = Edit("loader", "/s/train.py", 10, {"num_workers": 2}, "num_workers")
    new, made, skipped = apply_edits(SCRIPT, [loader] + edits)
    assert not skipped and {e.kind for e in made} == {"loader", "set_threads"}
    assert new == SCRIPT.replace(
        "from torch.utils.data import DataLoader\n",
        "from torch.utils.data import DataLoader\n\nth.set_num_threads(1)  # 1 intra-op thread beside 2 DataLoader "
        "workers on 2 cores\n").replace("num_workers=0", "num_workers=2")
    compile(new, "train.py", "exec")


def test_a_file_without_a_top_level_import_torch_is_told_where_to_put_it():
    src = "def main():\n    import torch\n    torch.ones(1)\n"
    new, made, skipped = apply_edits(src, cpu.cpu_edits(_probe(), {"threads": 1}, "/s/t.py"))
    assert new == src and not made
    assert "no top-level import torch: put torch.set_num_threads(1) after its import by hand" in skipped[0][1]


def test_no_threads_winner_no_edit():
    assert cpu.cpu_edits(_probe(), {"ld_preload": JEMALLOC}, "/s/t.py") == []


# ---------------------------------------------------------------- the allocator


def test_allocators_are_found_in_ldconfig_and_the_usual_folders(tmp_path):
    assert cpu.find_allocators(LDCONFIG, dirs=[]) == {
        "jemalloc": "/lib/x86_64-linux-gnu/libjemalloc.so.2",
        "tcmalloc": "/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"}
    (tmp_path / "libtcmalloc.so.4").write_bytes(b"")
    assert cpu.find_allocators("", dirs=[str(tmp_path / "none"), str(tmp_path)]) == {
        "tcmalloc": str(tmp_path / "libtcmalloc.so.4")}
    assert cpu.find_allocators("", dirs=[]) == {}


def test_each_allocator_found_is_a_candidate_and_none_says_how_to_install_one():
    out, skipped = cpu.allocator_candidates(_probe(), {"jemalloc": JEMALLOC})
    assert not skipped and [(c.name, c.technique, c.apply) for c in out] == [
        ("jemalloc (LD_PRELOAD)", "allocator", {"ld_preload": JEMALLOC})]
    out, ((t, why),) = cpu.allocator_candidates(_probe(), {})
    assert out == [] and t == "allocator" and "no jemalloc or tcmalloc library on this system" in why
    assert "apt-get install libjemalloc2" in why and "conda-forge jemalloc" in why and "gperftools" in why
    out, ((_, why),) = cpu.allocator_candidates(_probe(allocators=[JEMALLOC]), {"jemalloc": JEMALLOC})
    assert out == [] and why == "your script already runs with libjemalloc.so.2 (LD_PRELOAD)"


def test_the_allocator_is_launched_through_the_runs_environment_torchrun_included(monkeypatch, tmp_path):
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    (tmp_path / "t.py").write_text("")
    for words in (["python", "t.py"], ["torchrun", "--nproc-per-node", "2", "t.py"]):
        command = parse_command(words, cwd=tmp_path)
        assert _hook_env(command, {"ld_preload": JEMALLOC})["LD_PRELOAD"] == JEMALLOC
        assert "LD_PRELOAD" not in _hook_env(command, {"threads": 1})
    monkeypatch.setenv("LD_PRELOAD", "/opt/libmine.so")
    assert _hook_env(command, {"ld_preload": JEMALLOC})["LD_PRELOAD"] == f"{JEMALLOC}:/opt/libmine.so"


def test_the_launch_command_is_pasteable_and_keeps_an_ld_preload_already_set(tmp_path):
    script = tmp_path / "my train.py"
    script.write_text("")
    command = parse_command(["python", str(script), "--lr", "0.1"], cwd=tmp_path)
    text = cpu.launch_text(command, {"ld_preload": JEMALLOC}, environ={})
    assert text == f"LD_PRELOAD={JEMALLOC} {command}"
    assert shlex.split(text)[1:] == shlex.split(str(command))
    assert cpu.launch_text(command, {"ld_preload": JEMALLOC}, environ={"LD_PRELOAD": "/a b.so"}).startswith(
        f"'LD_PRELOAD={JEMALLOC}:/a b.so' ".replace("'LD_PRELOAD=", "LD_PRELOAD='"))
    assert cpu.launch_text(command, {"threads": 1}) == ""


def test_an_allocator_alone_is_proven_as_the_launch_command_and_the_diff_stays_empty(tmp_path, monkeypatch):
    from helpers.tune import report, session

    script = tmp_path / "train.py"
    script.write_text("import torch\n")
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    seen = []

    def fake_measure(command, variants, **kw):
        seen.extend(variants)
        return {"original": _runs("original", [100, 101, 99]), "rewritten": _runs("rewritten", [80, 81, 79])}, QUIET

    monkeypatch.setattr(session, "measure", fake_measure)
    alloc = Candidate("jemalloc (LD_PRELOAD)", "allocator", {"ld_preload": JEMALLOC})
    res = TuneResult("python train.py", tmp_path / "out", _probe(), candidates=[alloc])
    (tmp_path / "out").mkdir()
    (tmp_path / "work").mkdir()
    command = parse_command(["python", str(script)], cwd=tmp_path)
    assert session._attempts([alloc], res.probe, script) == [[alloc]]
    assert session._prove(command, [alloc], res, TuneOptions(), tmp_path / "work", 60.0, False, lambda line: None)
    assert seen == [("original", {}, None), ("rewritten", {"ld_preload": JEMALLOC}, None)]  # the original file
    assert res.diff == "" and res.proven == ["jemalloc (LD_PRELOAD)"]
    assert res.launch == f"LD_PRELOAD={JEMALLOC} {command}"
    assert res.headline.startswith(f"Your script launched as `{res.launch}` is 1.25x")
    md = report.markdown(res)
    assert f"## The launch command\n\nRun your script with this command line" in md and f"\n{res.launch}\n" in md
    assert "## The change in your code" not in md and res.as_dict()["launch"] == res.launch


def test_a_launch_winner_that_did_not_hold_says_so_not_that_nothing_could_be_written(tmp_path):
    res = TuneResult("python train.py", tmp_path, _probe(), winners=["jemalloc (LD_PRELOAD)"])
    res.proof = judge("rewritten", _runs("original", [100, 101, 99]), _runs("rewritten", [100, 100, 101]), QUIET)
    assert res.headline.startswith("The runtime gain did not hold when the rewritten script ran as written (1.00x, ")
    assert "((" not in res.headline and "))" not in res.headline
    res.launch_tried = f"LD_PRELOAD={JEMALLOC} python train.py"  # no edit of the script: the launch alone was proved
    assert res.headline.startswith(f"The runtime gain did not hold when your script was launched as "
                                   f"`{res.launch_tried}` (1.00x, 95% CI "), res.headline


# ---------------------------------------------------------------- the hook


class _Rec:
    """The few members of :class:`helpers.tune.hook.Recorder` that the CPU watch uses."""

    def __init__(self, apply, user_file):
        self.apply, self.user_file = apply, user_file

    def user_frame(self, frame):
        while frame is not None and frame.f_code.co_filename != self.user_file:
            frame = frame.f_back
        return frame

    @staticmethod
    def key(frame):
        return frame.f_code.co_filename, frame.f_lineno

    @staticmethod
    def site(frame):
        return {"file": frame.f_code.co_filename, "line": frame.f_lineno}


def test_the_hook_sees_the_scripts_own_set_num_threads_and_the_variables_it_sets(monkeypatch):
    import torch

    from helpers.tune.hook_cpu import _cpu_result, _watch_cpu

    before = torch.get_num_threads()
    monkeypatch.setattr(torch, "set_num_threads", torch.set_num_threads)  # put back after the test
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # as the process got it; undone after the test
    rec = _Rec({}, "<user>")
    _watch_cpu(rec)
    assert rec.cpu["threads_at_start"] == before
    exec(compile("import os, torch\n\ntorch.set_num_threads(n)\nos.environ['OMP_NUM_THREADS'] = '1'\n", "<user>",
                 "exec"), {"n": before})
    torch.set_num_threads(before)  # not from the user's file: not counted
    out = _cpu_result(rec.cpu)
    assert out["set_sites"] == [{"file": "<user>", "line": 3, "count": 1, "value": before}]
    assert out["env_set_by_script"] == ["OMP_NUM_THREADS"] and out["threads"] == before
    _, ((_, why),) = cpu.thread_candidates({"cpu": out, "model": {"param_device": "cpu"}}, cores=2)
    assert why == f"the script sets them itself: torch.set_num_threads({before}) on line 3"


def test_the_allocators_mapped_in_are_read_from_the_maps_file(tmp_path):
    from helpers.tune.hook_cpu import mapped_allocators

    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r--p 00000000 08:01 12 /usr/lib/x86_64-linux-gnu/libjemalloc.so.2\n"
                    "7f01-7f02 r-xp 00001000 08:01 12 /usr/lib/x86_64-linux-gnu/libjemalloc.so.2\n"
                    "7f02-7f03 r--p 00000000 08:01 13 /usr/lib/x86_64-linux-gnu/libc.so.6\n")
    assert mapped_allocators(str(maps)) == ["/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"]
    assert mapped_allocators(str(tmp_path / "none")) == []


# ---------------------------------------------------------------- the example


EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "threads_oversubscribed.py"


def test_the_examples_expected_diff_is_what_tune_writes_for_its_threads():
    """examples/threads_oversubscribed.expected.diff is the rewriter's edit for the example's probe on 2 cores: two
    DataLoader workers (the script's own) beside torch's default of one intra-op thread per core."""
    expected = EXAMPLE.with_suffix(".expected.diff").read_text()
    probe = _probe(threads=2, workers=2, cores=2)
    (c,), _ = cpu.thread_candidates(probe, cores=2)
    source = EXAMPLE.read_text()
    new, made, skipped = apply_edits(source, cpu.cpu_edits(probe, c.apply, str(EXAMPLE)))
    assert not skipped and [e.kind for e in made] == ["set_threads"]
    assert unified_diff(source, new, EXAMPLE.name) == expected[expected.index("--- a/"):]


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_example_runs_with_the_threads_and_the_allocator_applied(tmp_path):
    """One real run of the example: the probe record holds its two workers, the threads applied before the script
    ran, and the allocator mapped into the process where the system has one (jemalloc or tcmalloc; that part is
    checked only where one is found: CI machines may have none)."""
    lib = next(iter(cpu.find_allocators().values()), "")
    command = parse_command([sys.executable, str(EXAMPLE), "--epochs", "1"], cwd=tmp_path)
    apply = {"threads": 1, **({"ld_preload": lib} if lib else {})}
    run = run_once(command, "t", apply, workdir=tmp_path / "w", warmup=2, steps=5, timeout_s=240)
    assert run.status == "steps", run.error
    rec = run.result["cpu"]
    assert rec["threads_at_start"] == 1 and rec["threads"] == 1 and rec["set_sites"] == []
    assert [ld["effective"]["num_workers"] for ld in run.result["loaders"]] == [2]
    if lib:
        assert rec["ld_preload"].startswith(lib) and any(Path(p).name == Path(lib).name for p in rec["allocators"])
