"""``workbook tune`` on scripts written the way users write them: the diff, the rewritten script, the proof, and
the script that fails, hangs, never steps or diverges on its own."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import machine
from helpers.tune.engine import parse_command
from helpers.tune.session import TuneOptions, TuneResult, _write_outputs, tune

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.subprocess]

# A user's script: argparse, a Dataset that reads slowly (a network disk: 4 ms a sample, in time.sleep, so that
# its loader's cost does not depend on how busy the CPU is), a small MLP, a checkpoint every 5 steps and at the end.
REMOTE = textwrap.dedent('''\
    class Remote(Dataset):
        def __len__(self):
            return 4096

        def __getitem__(self, i):
            time.sleep(0.004)  # a read from a slow disk
            x = torch.randn(16, generator=torch.Generator().manual_seed(i))
            return x, int(x.sum() > 0)
    ''').rstrip()
USER_SCRIPT = textwrap.dedent('''\
    import argparse
    import time

    import torch
    from torch import nn
    from torch.utils.data import DataLoader, Dataset


    {remote}


    def main():
        p = argparse.ArgumentParser()
        p.add_argument("--batch-size", type=int, default=16)
        p.add_argument("--mode", default="ok")
        p.add_argument("--out", default="model.pt")
        args = p.parse_args()
        loader = DataLoader(Remote(), batch_size=args.batch_size, shuffle=True)
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        for step, (x, y) in enumerate(loader):
            if args.mode == "raise" and step == 2:
                raise ValueError("sample 37 is corrupt")
            if args.mode == "hang":
                time.sleep(3600)
            if args.mode == "nan" and step >= 3:
                x = x * float("nan")
            if args.mode == "explode":
                x = x * 10.0 ** step  # finite, but the loss grows a thousandfold and more
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            if args.mode != "nostep":
                opt.step()
            if step % 5 == 4:
                torch.save(model.state_dict(), args.out)  # a checkpoint now and then
            if step == 40:
                break
        torch.save(model.state_dict(), args.out)


    if __name__ == "__main__":
        main()
    ''').replace("{remote}", REMOTE)


@pytest.fixture
def user_dir(tmp_path):
    d = tmp_path / "project"
    d.mkdir()
    (d / "train.py").write_text(USER_SCRIPT)
    return d


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_tune_writes_a_proven_diff_that_applies_and_a_script_that_runs_as_written(user_dir, tmp_path, monkeypatch):
    # the busy-machine rule has its own tests (test_tune_units.py); here the machine is taken as quiet so that the
    # whole path to the diff runs whatever else shares the cores
    monkeypatch.setattr(machine, "check", lambda before, after, **kw: machine.BusyCheck(False, (), 0.0, 0.1, 1.0))
    script = user_dir / "train.py"
    before = _digest(script)
    lines: list[str] = []
    out = tmp_path / "tune-out"
    # the loader's path, to the diff: the techniques whose own tests run them elsewhere are left out (--skip), so
    # that the workers' follow-up is prefetch_factor's alone and no compile takes its minute
    skip = ("compile", "allocator", "intra_op_threads", "autocast", "optimizer_impl")
    res = tune(parse_command(["python", "train.py", "--batch-size", "16"], cwd=user_dir), out,
               TuneOptions(warmup=3, steps=10, rounds=2, timeout_s=120, skip=skip), progress=lines.append)
    assert {c.technique for c in res.candidates}.isdisjoint(skip)
    assert [r for t, r in res.skipped if t == "compile"] == ["left out with --skip"]
    assert _digest(script) == before, "the user's script was edited without --apply"
    assert not (user_dir / "model.pt").exists(), "the script's checkpoint was written where it asked"
    assert res.probe["saved"] and res.probe["saved"][0]["asked"] == "model.pt"
    names = {j.variant: j for j in res.judgements}
    assert names["num_workers=2"].verdict == "faster", names["num_workers=2"].reason
    assert res.proof is not None and res.proof.verdict == "faster", res.proof
    # prefetch_factor follows the winning workers, judged against them; a steady 4 ms a sample gives it little to
    # absorb, so either outcome may be measured, but the follow-up must run and the diff must match the outcome
    follow = names["num_workers=2 + prefetch_factor=4"]
    deeper = follow.verdict == "faster"
    assert "num_workers=2" + (" + prefetch_factor=4" if deeper else "") in res.proven
    diff = (out / "change.diff").read_text()
    written = ["Remote()", "batch_size=args.batch_size", "shuffle=True", "num_workers=2", "persistent_workers=True"]
    written += ["prefetch_factor=4"] if deeper else []  # past the file's 86 characters: one argument per line
    assert "+    loader = DataLoader(\n" + "".join(f"+        {a},\n" for a in written) + "+    )\n" in diff
    summary = json.loads((out / "summary.json").read_text())
    assert summary["proof"]["verdict"] == "faster" and summary["diff"] == "change.diff"
    report = (out / "report.md").read_text()
    assert "## The change in your code" in report and "The rewritten script is" in report
    assert (out / "report.html").read_text().startswith("<!doctype html>")
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert {r["variant"] for r in records} >= {"unmodified", "num_workers=2", "num_workers=2 + prefetch_factor=4",
                                               "original", "rewritten"}
    assert any(line.startswith("[1/") for line in lines)

    # the diff applies to the user's file, and the rewritten file runs as written
    copy = tmp_path / "applied"
    copy.mkdir()
    shutil.copy(script, copy / "train.py")
    subprocess.run(["git", "apply", "-p1", str(out / "change.diff")], cwd=copy, check=True)
    assert (copy / "train.py").read_text() == (out / "train.py").read_text()
    done = subprocess.run([sys.executable, "train.py", "--out", str(tmp_path / "m.pt")], cwd=copy,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "m.pt").is_file()


def test_apply_edits_the_script_in_place_and_keeps_every_earlier_backup(user_dir, tmp_path):
    # the proof has run (the test above); --apply's own part: the edit in place, and a backup never overwritten
    script = user_dir / "train.py"
    original = script.read_text()
    for k, new in enumerate(("# first\n" + original, "# second\n" + original)):
        out = tmp_path / f"out{k}"
        out.mkdir()
        res = TuneResult("python train.py", out, {}, diff="--- a/train.py\n", rewritten=new)
        _write_outputs(res, parse_command(["python", "train.py"], cwd=user_dir), apply=True)
        assert script.read_text() == new == (out / "train.py").read_text()
        assert (out / "change.diff").is_file() and not (out / "change.diff.tmp").exists()
    assert (user_dir / "train.py.orig").read_text() == original
    assert (user_dir / "train.py.orig2").read_text() == "# first\n" + original
    assert res.backup == str(user_dir / "train.py.orig2")


def _cli(user_dir: Path, out: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "helpers", "tune", "--out", str(out), "--warmup", "2", "--steps",
                           "5", "--rounds", "2", *args], cwd=user_dir, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("mode, timeout, expected", [
    ("raise", "120", "ValueError: sample 37 is corrupt"),
    ("nostep", "120", "ended without an optimizer step"),
    ("nan", "120", "your job diverges: its loss is nan at step 4"),
    ("explode", "120", "your job diverges: its loss grows from "),
    ("hang", "6", "made no result within 6 s (--timeout): it hangs"),
    ("hang", "6", "optimizer steps (it made no optimizer step in "),
])
def test_a_script_that_fails_on_its_own_gets_its_own_error_and_nothing_is_written(user_dir, tmp_path, mode, timeout,
                                                                                    expected):
    out = tmp_path / "out"
    done = _cli(user_dir, out, "--timeout", timeout, "--", "python", "train.py", "--mode", mode)
    assert done.returncode == 1, done.stderr
    assert expected in done.stderr
    if mode == "raise":
        assert "---- your script's own output" in done.stderr and 'train.py", line 30, in main' in done.stderr
        # once, and starting in the user's script: no frame of tune's own runner
        assert done.stderr.count(expected) == 1 and "helpers/tune/hook.py" not in done.stderr
    assert not out.exists(), "a folder was written for a script that cannot be tuned"
    assert not (user_dir / "model.pt").exists()


def test_bad_flags_and_commands_are_refused_before_anything_runs(user_dir, tmp_path):
    for args, msg in ((["--steps", "2", "--", "python", "train.py"], "--steps must be an integer >= 5"),
                      (["--skip", "channels_last,compil", "--", "python", "train.py"],
                       "--skip compil: no such technique; the techniques are allocator, autocast"),
                      (["--", "torchrun", "--nnodes", "2", "train.py"], "on this machine only"),
                      (["--", "python", "missing.py"], "does not exist"),
                      ([], "give the command that trains")):
        done = _cli(user_dir, tmp_path / "never", *args, timeout=60)
        assert done.returncode == 2 and msg in done.stderr, (args, done.stderr)
    assert not (tmp_path / "never").exists()


# The same user's loader in a DDP script launched with torchrun (gloo, a DistributedSampler, rank 0 saves).
DDP_SCRIPT = textwrap.dedent('''\
    import argparse
    import time

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, Dataset
    from torch.utils.data.distributed import DistributedSampler


    {remote}


    def main():
        p = argparse.ArgumentParser()
        p.add_argument("--mode", default="ok")
        args = p.parse_args()
        dist.init_process_group("gloo")
        data = Remote()
        loader = DataLoader(data, batch_size=16, sampler=DistributedSampler(data, seed=0))
        model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        for step, (x, y) in enumerate(loader):
            if args.mode == "raise" and dist.get_rank() == 1 and step == 2:
                raise ValueError("rank 1 read a corrupt sample")
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step == 60:
                break
        if dist.get_rank() == 0:
            torch.save(model.module.state_dict(), "model.pt")
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
    ''').replace("{remote}", REMOTE)


def test_a_torchrun_job_is_tuned_as_a_job_and_its_proof_runs_under_torchrun(tmp_path, monkeypatch):
    monkeypatch.setattr(machine, "check", lambda before, after, **kw: machine.BusyCheck(False, (), 0.0, 0.1, 1.0))
    # the DDP call's own candidates have their tests (test_tune_ddp.py); here, the job's mechanics on its loader
    from helpers.tune import candidates as cand_mod

    monkeypatch.setattr(cand_mod, "ddp_candidates", lambda probe: ([], []))
    d = tmp_path / "ddp"
    d.mkdir()
    (d / "train.py").write_text(DDP_SCRIPT)
    before = _digest(d / "train.py")
    out = tmp_path / "tune-out"
    lines: list[str] = []
    res = tune(parse_command(["torchrun", "--nproc-per-node", "2", "train.py"], cwd=d), out,
               # tested on their own elsewhere; so is prefetch_factor's follow-up of the winning workers (in
               # test_tune_writes_a_proven_diff_...), which took 4 more torchrun runs here, 36 s of 149 s
               TuneOptions(warmup=3, steps=10, rounds=2, timeout_s=120,
                           skip=("allocator", "autocast", "optimizer_impl", "prefetch_factor")),
               progress=lines.append)
    assert _digest(d / "train.py") == before and not (d / "model.pt").exists()
    assert res.probe["ranks"] == 2
    names = {j.variant: j for j in res.judgements}
    # 2 cores shared by 2 ranks: 1 worker each is tried, and 2
    assert set(names) >= {"num_workers=1", "num_workers=2"}
    assert names["num_workers=2"].verdict == "faster", names["num_workers=2"].reason
    assert res.proof is not None and res.proof.verdict == "faster", res.proof
    assert "num_workers=2 + prefetch_factor=4" not in names  # left out, as asked
    assert ("+        sampler=DistributedSampler(data, seed=0),\n+        num_workers=2,\n"
            "+        persistent_workers=True,\n+    )\n") in (out / "change.diff").read_text()
    report = (out / "report.md").read_text()
    assert report.startswith("# tune: `torchrun --nproc-per-node 2 ") and "a torchrun job of 2 processes" in report

    # a rank that fails on its own: that rank's traceback, once, and nothing written
    (d / "train.py").write_text(DDP_SCRIPT.replace('p.add_argument("--mode", default="ok")',
                                                   'p.add_argument("--mode", default="raise")'))
    done = subprocess.run([sys.executable, "-m", "helpers", "tune", "--out", str(tmp_path / "never"), "--warmup",
                           "2", "--steps", "5", "--rounds", "2", "--", "torchrun", "--nproc-per-node", "2",
                           "train.py"], cwd=d, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 1 and "rank 1 read a corrupt sample" in done.stderr, done.stderr[-3000:]
    assert not (tmp_path / "never").exists()


# transformers is not installed here: a stand-in package with transformers' own names (TrainingArguments fields
# dataloader_num_workers, dataloader_persistent_workers, dataloader_prefetch_factor, bf16; Trainer(model=, args=, train_dataset=).train()) that
# builds its DataLoader and optimizer inside itself, as the real Trainer does, so that neither is in the user's file.
FAKE_TRANSFORMERS = textwrap.dedent('''\
    import dataclasses

    import torch
    from torch.utils.data import DataLoader


    @dataclasses.dataclass
    class TrainingArguments:
        output_dir: str
        per_device_train_batch_size: int = 8
        dataloader_num_workers: int = 0
        dataloader_persistent_workers: bool = False
        dataloader_prefetch_factor: int = None
        bf16: bool = False
        max_steps: int = 60


    class Trainer:
        def __init__(self, model=None, args=None, train_dataset=None):
            self.model, self.args, self.train_dataset = model, args, train_dataset

        def train(self):
            a = self.args
            loader = DataLoader(self.train_dataset, batch_size=a.per_device_train_batch_size, shuffle=True,
                                num_workers=a.dataloader_num_workers,
                                prefetch_factor=a.dataloader_prefetch_factor if a.dataloader_num_workers else None,
                                persistent_workers=a.dataloader_persistent_workers and a.dataloader_num_workers > 0)
            opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
            for step, (x, y) in enumerate(loader):
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
                    loss = torch.nn.functional.cross_entropy(self.model(x).float(), y)
                loss.backward()
                opt.step()
                opt.zero_grad()
                if step + 1 >= a.max_steps:
                    break
    ''')
HF_SCRIPT = textwrap.dedent('''\
    import time

    import torch
    from torch import nn
    from torch.utils.data import Dataset
    from transformers import Trainer, TrainingArguments


    {remote}


    if __name__ == "__main__":
        args = TrainingArguments(
            output_dir="out",  # checkpoints
            per_device_train_batch_size=16,
        )
        Trainer(model=nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)), args=args,
                train_dataset=Remote()).train()
    ''').replace("{remote}", REMOTE)


def test_a_setting_a_framework_owns_is_measured_and_written_in_its_own_call(tmp_path, monkeypatch):
    monkeypatch.setattr(machine, "check", lambda before, after, **kw: machine.BusyCheck(False, (), 0.0, 0.1, 1.0))
    d = tmp_path / "hf"
    (d / "transformers").mkdir(parents=True)
    (d / "transformers" / "__init__.py").write_text(FAKE_TRANSFORMERS)
    (d / "train.py").write_text(HF_SCRIPT)
    out = tmp_path / "tune-out"
    # the launch and the compile are not the framework's; the workers' prefetch_factor follow-up, set through the
    # same field mechanism as the workers (its rewrite in test_tune_units.py), took two more runs
    res = tune(parse_command(["python", "train.py"], cwd=d), out,
               TuneOptions(warmup=3, steps=10, rounds=2, timeout_s=120,
                           skip=("allocator", "compile", "intra_op_threads", "prefetch_factor")))
    names = {j.variant: j for j in res.judgements}
    # the DataLoader and the optimizer are the framework's: only its own settings are tried, in its call
    assert set(names) == {"dataloader_num_workers=2", "bf16=True"}, names
    assert names["dataloader_num_workers=2"].verdict == "faster", names["dataloader_num_workers=2"].reason
    assert res.proof is not None and res.proof.verdict == "faster", res.proof
    diff = (out / "change.diff").read_text()
    assert "+        dataloader_num_workers=2,\n+        dataloader_persistent_workers=True,\n" in diff, diff
    assert "         per_device_train_batch_size=16,\n" in diff  # the call's own layout, one argument a line
    assert "DataLoader" not in diff


# A DDP script of one rank (gloo) with a conv model that fails if DDP warns that the gradients' strides do not match
# its buckets: channels_last applied after the wrap makes every backward warn and copy each gradient.
DDP_CONV = textwrap.dedent('''\
    import os
    import warnings

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", os.environ.get("TEST_PORT", "29541"))
    dist.init_process_group("gloo", rank=0, world_size=1)
    model = DDP(nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 3)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(40):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            loss = model(torch.randn(4, 3, 16, 16)).square().mean()
            loss.backward()
        if any("Grad strides" in str(w.message) for w in seen):
            raise RuntimeError("DDP: grad strides do not match bucket view strides")
        opt.step()
        opt.zero_grad()
    ''')


def test_channels_last_reaches_a_ddp_model_before_its_buckets_are_built(tmp_path, monkeypatch):
    from helpers.tune.engine import _free_port, run_once
    from helpers.tune.rewrite import apply_edits
    from helpers.tune.session import plan_edits

    (tmp_path / "train.py").write_text(DDP_CONV)
    monkeypatch.setenv("TEST_PORT", str(_free_port()))
    command = parse_command(["python", "train.py"], cwd=tmp_path)
    run = run_once(command, "channels_last", {"channels_last": True}, workdir=tmp_path / "w", warmup=2, steps=5,
                   timeout_s=120)
    assert run.ok, run.error[-2000:]
    assert run.result["model"]["wrapper"] == "DistributedDataParallel"
    assert [s["line"] for s in run.result["ddp_sites"]] == [12]
    from helpers.tune.candidates import Candidate

    edits = plan_edits(run.result, [Candidate("channels_last", "channels_last", {"channels_last": True})],
                       tmp_path / "train.py")
    new, made, _ = apply_edits(DDP_CONV, edits)
    assert made and "model = DDP(nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 3)).to(" \
                     "memory_format=torch.channels_last))\n" in new
    (tmp_path / "rewritten.py").write_text(new)  # the rewritten file runs as written, without the warning
    done = subprocess.run([sys.executable, "rewritten.py"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "TEST_PORT": str(_free_port())})
    assert done.returncode == 0, done.stderr[-2000:]


# Unseeded, as many scripts are: random initial weights, random batches, a shuffled loader, dropout.
UNSEEDED = textwrap.dedent('''\
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    data = TensorDataset(torch.randn(256, 8), torch.randint(0, 2, (256,)))
    model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.5), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in DataLoader(data, batch_size=16, shuffle=True):
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    ''')


def test_a_rounds_runs_start_from_one_random_state_so_the_loss_check_compares_the_change(tmp_path):
    """CI's failure at stop 47: a proof rejected for a mean loss 11% off the unmodified one, where nothing differed
    but the draw of an unseeded script. Each round's runs are seeded alike; two rounds differ."""
    from helpers.tune.engine import run_once

    (tmp_path / "train.py").write_text(UNSEEDED)
    command = parse_command(["python", "train.py"], cwd=tmp_path)
    runs = [run_once(command, name, {}, workdir=tmp_path / "w", warmup=1, steps=5, timeout_s=120, round_=1)
            for name in ("unmodified", "changed")]
    assert all(r.ok for r in runs), [r.error[-1000:] for r in runs]
    assert runs[0].losses == runs[1].losses  # the same round: the same weights, batches, order and dropout
    import torch

    from helpers.tune.hook_common import seed_all

    seed_all(0)
    first = torch.rand(4)
    seed_all(1)
    assert not torch.equal(first, torch.rand(4))  # another round, another draw: the rounds' spread is the script's


def test_a_long_start_says_it_is_still_running_with_its_steps_so_far(tmp_path, monkeypatch):
    from helpers.tune import engine

    (tmp_path / "train.py").write_text(textwrap.dedent('''\
        import time

        import torch

        time.sleep(2.5)  # indexing a dataset before the first step
        w = torch.nn.Parameter(torch.ones(2))
        opt = torch.optim.SGD([w], lr=0.1)
        for _ in range(30):
            w.square().sum().backward()
            opt.step()
            opt.zero_grad()
        '''))
    monkeypatch.setattr(engine, "STILL_EVERY_S", 1.0)
    lines: list[str] = []
    run = engine.run_once(parse_command(["python", "train.py"], cwd=tmp_path), "probe", {}, workdir=tmp_path / "w",
                          warmup=2, steps=5, timeout_s=60, still=lines.append)
    assert run.ok and lines, (run.error, lines)
    assert lines[0].startswith("still running after 1 s (no optimizer step yet; --timeout 60 s)"), lines


# A user's loop over a DataLoader of their own class, with its device from argparse and a peek at the first batch
# before the model exists: notebook 05's side-stream prefetcher applies to the loop.
PLAIN_LOOP = textwrap.dedent('''\
    import argparse

    import torch
    from torch.utils.data import DataLoader, TensorDataset


    class Loader(DataLoader):  # a DataLoader of the user's own
        def __iter__(self):
            yield from super().__iter__()


    def main():
        p = argparse.ArgumentParser()
        p.add_argument("--device", default="cpu")
        args = p.parse_args()
        torch.manual_seed(0)
        data = TensorDataset(torch.randn(256, 8), torch.randint(2, (256,)))
        loader = Loader(data, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(0))
        print("first batch", tuple(next(iter(loader))[0].shape))  # a peek, not a loop
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)).to(args.device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(3):
            for step, (x, y) in enumerate(loader):  # the training loop
                x, y = x.to(args.device), y.to(args.device)
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
        print(f"final loss {loss.item():.6f}")


    if __name__ == "__main__":
        main()
    ''')


def test_the_side_stream_prefetcher_runs_in_the_users_loop_and_is_written_there(tmp_path):
    """tune offers the prefetcher only where the model is on a device with streams; here, on a CPU, it is applied
    by hand to check the rest of its path: the same batches reach the step, the loop and the device's name are
    found, and the rewritten file holds notebook 05's functions and runs as written to the same result."""
    from helpers.pipeline.side_stream import SOURCE
    from helpers.tune.candidates import Candidate
    from helpers.tune.engine import run_once
    from helpers.tune.rewrite import apply_edits
    from helpers.tune.session import plan_edits

    script = tmp_path / "train.py"
    script.write_text(PLAIN_LOOP)
    command = parse_command(["python", "train.py"], cwd=tmp_path)
    plain = run_once(command, "unmodified", {}, workdir=tmp_path / "w0", warmup=2, steps=20, timeout_s=120)
    ahead = run_once(command, "side-stream prefetch", {"prefetch": True}, workdir=tmp_path / "w1", warmup=2,
                     steps=20, timeout_s=120)
    assert plain.ok and ahead.ok, (plain.error or ahead.error)[-2000:]
    assert ahead.result["losses"] == plain.result["losses"], "the prefetched loop saw other batches"
    # the same loops; the prefetcher draws one batch ahead of the step, so its count of batches drawn may be one more
    assert [{k: v for k, v in s.items() if k != "drawn"} for s in ahead.result["loop_sites"]] == \
        [{k: v for k, v in s.items() if k != "drawn"} for s in plain.result["loop_sites"]]
    lines = PLAIN_LOOP.splitlines()
    peek, loop = (next(i for i, ln in enumerate(lines, 1) if mark in ln) for mark in ("# a peek", "# the training"))
    # the loop, not the subclass's own __iter__; the peek is no for loop, and the model did not exist yet there
    assert [(s["line"], s["is_for"], s["device_expr"]) for s in plain.result["loop_sites"]] == [
        (peek, False, None), (loop, True, "args.device")]
    edits = plan_edits(plain.result, [Candidate("side-stream prefetch", "side_stream", {"prefetch": True})], script)
    new, made, skipped = apply_edits(PLAIN_LOOP, edits)
    assert [e.kind for e in made] == ["prefetch"] and not skipped
    assert "        for step, (x, y) in prefetch(enumerate(loader), args.device):  # the training loop\n" in new
    assert SOURCE in new and new.startswith("import argparse\nimport contextlib\nimport functools\n\nimport torch\n"
                                             "from torch.utils.data import DataLoader, TensorDataset\n\n\n"
                                             "# A side-stream")  # the standard library's imports with its own
    (tmp_path / "rewritten.py").write_text(new)
    runs = [subprocess.run([sys.executable, name], cwd=tmp_path, capture_output=True, text=True, timeout=120)
            for name in ("train.py", "rewritten.py")]
    assert all(r.returncode == 0 for r in runs), runs[1].stderr[-2000:]
    assert runs[0].stdout == runs[1].stdout and "final loss" in runs[0].stdout


# A user's loop in a function of its own, with gradient clipping; ``boost`` scales the loss up so that float16's
# gradients overflow until the GradScaler has backed its scale off.
CLIPPED_LOOP = textwrap.dedent('''\
    import sys

    import torch
    from torch.utils.data import DataLoader, TensorDataset


    def train(model, opt, loader, device, boost):
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = torch.nn.functional.cross_entropy(model(x), y) * boost
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
        return loss


    def main():
        torch.manual_seed(0)
        device = "cpu"
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)).to(device)
        loader = DataLoader(TensorDataset(torch.randn(480, 8), torch.randint(2, (480,))), batch_size=16)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        global sched
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.5)  # it wraps opt.step as a method
        boost = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
        print(f"final loss {train(model, opt, loader, device, boost).item() / boost:.2f}")


    if __name__ == "__main__":
        main()
    ''')


def test_float16_with_its_grad_scaler_runs_in_the_users_loop_and_is_written_whole(tmp_path):
    """tune offers float16 only where the device lacks bfloat16 (never this CPU); applied by hand here: the scaler
    scales the loss, unscales before the clip, steps and updates; the steps it skips on overflow are still counted;
    the rewritten file holds every one of its lines and runs as written."""
    from helpers.tune.candidates import Candidate
    from helpers.tune.engine import run_once
    from helpers.tune.rewrite import apply_edits
    from helpers.tune.session import plan_edits

    script = tmp_path / "train.py"
    script.write_text(CLIPPED_LOOP)
    fp16 = {"autocast": "float16", "grad_scaler": True}
    plain = run_once(parse_command(["python", "train.py"], cwd=tmp_path), "unmodified", {}, workdir=tmp_path / "w0",
                     warmup=2, steps=20, timeout_s=120)
    half = run_once(parse_command(["python", "train.py"], cwd=tmp_path), "fp16", fp16, workdir=tmp_path / "w1",
                    warmup=2, steps=20, timeout_s=120)
    assert plain.ok and half.ok, (plain.error or half.error)[-2000:]
    assert half.result["losses"] == pytest.approx(plain.result["losses"], rel=0.02)
    sites = {k: [s["line"] for s in plain.result[k]] for k in ("backward_sites", "step_sites", "clip_sites")}
    assert sites == {"backward_sites": [12], "step_sites": [14], "clip_sites": [13]}
    # 30 batches; a loss a million times larger overflows float16 until the scale is backed off from 65536 to about
    # 1 (some 17 skipped steps): only if those count as steps does the run reach its 2 + 20 + 1
    boosted = run_once(parse_command(["python", "train.py", "1e6"], cwd=tmp_path), "fp16", fp16,
                       workdir=tmp_path / "w2", warmup=2, steps=20, timeout_s=120)
    assert boosted.ok and boosted.result["status"] == "steps", boosted.result["status"]

    winner = Candidate("autocast float16 + GradScaler", "autocast", fp16)
    new, made, skipped = apply_edits(CLIPPED_LOOP, plan_edits(plain.result, [winner], script))
    assert sorted(e.kind for e in made) == ["autocast", "grad_scaler"] and not skipped, skipped
    for line in ('grad_scaler = torch.amp.GradScaler("cpu")', "        grad_scaler.scale(loss).backward()\n",
                 "        grad_scaler.unscale_(opt)\n        torch.nn.utils.clip_grad_norm_(",
                 "        grad_scaler.step(opt)\n        grad_scaler.update()\n",
                 '        with torch.autocast(device_type="cpu", dtype=torch.float16):\n            loss = '):
        assert line in new, line
    (tmp_path / "rewritten.py").write_text(new)
    done = subprocess.run([sys.executable, "rewritten.py"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("final loss"), done.stderr[-2000:]
    # the proof runs the rewritten file under the hook: its step's loss is the loss, not the scaled loss
    proof = run_once(parse_command(["python", "train.py"], cwd=tmp_path), "rewritten", {}, workdir=tmp_path / "w3",
                     warmup=2, steps=20, timeout_s=120, script=tmp_path / "rewritten.py")
    assert proof.ok and proof.result["losses"] == pytest.approx(plain.result["losses"], rel=0.05)
    # a step that is not a statement of its own: neither float16 nor its scaler is written
    odd = CLIPPED_LOOP.replace("        opt.step()\n", "        _ = opt.step()\n")
    assert odd != CLIPPED_LOOP
    new, made, skipped = apply_edits(odd, plan_edits(plain.result, [winner], script))
    assert new == odd and not made and len(skipped) == 2
    assert all("written together or not at all" in why for _, why in skipped)


def test_an_optimizer_stepped_with_a_closure_gets_no_float16(tmp_path):
    from helpers.tune import candidates
    from helpers.tune.engine import run_once

    (tmp_path / "train.py").write_text(textwrap.dedent('''\
        import torch

        model = torch.nn.Linear(4, 1)
        opt = torch.optim.LBFGS(model.parameters(), lr=0.1)
        x, y = torch.randn(32, 4), torch.randn(32, 1)


        def closure():
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            return loss


        for _ in range(40):
            opt.step(closure)
        '''))
    run = run_once(parse_command(["python", "train.py"], cwd=tmp_path), "unmodified", {}, workdir=tmp_path / "w",
                   warmup=2, steps=10, timeout_s=120)
    assert run.ok and run.result["step_closure"] is True
    probe = {**run.result, "model": {**run.result["model"], "param_device": "cuda", "bf16_supported": False}}
    _, skipped = candidates.choose(probe, cores=2)
    assert "does not take the closure" in dict(skipped)["autocast"]


# A user's script that writes its own files as scripts do: a metrics.csv truncated at the start, a log outside its
# folder appended to, a file replaced atomically, a new checkpoint folder; "stall" stops stepping after 3 steps.
WRITER = textwrap.dedent('''\
    import os
    import sys
    import time

    import torch

    from . import util

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with open("metrics.csv", "w") as f:
        f.write("step,loss\\\\n")
    os.makedirs("ckpt", exist_ok=True)
    with open(os.path.join("ckpt", "last.txt"), "w") as f:
        f.write(util.NAME)
    with open("state.json.tmp", "w") as f:
        f.write("{}")
    os.replace("state.json.tmp", "state.json")
    for step in range(40):
        if sys.argv[1:] == ["stall"] and step == 3:
            time.sleep(3600)
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        with open(os.path.join(os.path.dirname(__file__), "..", "..", "outside.log"), "a") as f:
            f.write(f"{step}\\\\n")
    ''')


@pytest.fixture
def writer_dir(tmp_path):
    d = tmp_path / "home" / "project"
    (d / "pkg").mkdir(parents=True)
    (d / "pkg" / "__init__.py").write_text("")
    (d / "pkg" / "util.py").write_text("NAME = 'util'\n")
    (d / "pkg" / "train.py").write_text(WRITER)
    (d / "metrics.csv").write_text("step,loss\n0,2.31\n1,2.25\n")
    (d / "state.json").write_text('{"epoch": 7}')
    (tmp_path / "home" / "outside.log").write_text("last week's run\n")
    return d


def test_a_run_loses_none_of_the_users_files_and_a_module_runs_as_a_module(writer_dir, tmp_path):
    from helpers.tune.engine import run_once

    home = writer_dir.parent
    before = {p: p.read_bytes() for p in (writer_dir / "metrics.csv", writer_dir / "state.json", home / "outside.log")}
    command = parse_command(["python", "-m", "pkg.train"], cwd=writer_dir)
    # the rewritten module runs in the module's place (its relative import works), as the proof runs it
    rewritten = tmp_path / "rewritten.py"
    rewritten.write_text(WRITER.replace("util.NAME", "util.NAME + ' rewritten'"))
    for script in (None, rewritten):
        run = run_once(command, "x", {}, workdir=tmp_path / "work", warmup=2, steps=5, timeout_s=120, script=script)
        assert run.ok, run.error
        assert {p: p.read_bytes() for p in before} == before, "a file of the user's was changed by tune's run"
        assert not (writer_dir / "ckpt").exists() and not (writer_dir / "state.json.tmp").exists()
        actions = {Path(f["path"]).name: f["action"] for f in run.result["user_files"]}
        assert actions == {"metrics.csv": "restored", "ckpt": "removed", "last.txt": "removed",
                           "state.json": "restored", "outside.log": "restored"}, actions


def test_a_run_that_stops_stepping_is_ended_at_its_stall_limit_not_its_timeout(writer_dir, tmp_path, monkeypatch):
    from helpers.tune import engine

    monkeypatch.setattr(engine, "STALL_FLOOR_S", 2.0)
    command = parse_command(["python", "-m", "pkg.train", "stall"], cwd=writer_dir)
    run = engine.run_once(command, "x", {}, workdir=tmp_path / "work", warmup=2, steps=5, timeout_s=300,
                          stall_step_s=0.05)
    assert run.status == "stalled" and run.wall_s < 60, (run.status, run.wall_s)
    assert run.result["progress"].startswith("it made 3 optimizer steps, then none for ")
    assert (writer_dir / "metrics.csv").read_text() == "step,loss\n0,2.31\n1,2.25\n"  # killed, and still put back
    # the probe has no step time yet: its own slowest step sets the limit
    run = engine.run_once(command, "probe", {}, workdir=tmp_path / "probe", warmup=2, steps=5, timeout_s=300)
    assert run.status == "stalled" and "the slowest step seen" in run.result["progress"]
