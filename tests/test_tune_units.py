"""tune's pieces without running a script: the source edits, the choice of candidates, the command, the judging."""

from __future__ import annotations

import math
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import machine
from helpers.errors import ParameterError
from helpers.tune import candidates, engine
from helpers.tune.engine import Run, judge, parse_command
from helpers.tune.rewrite import Edit, apply_edits, unified_diff
from helpers.tune.session import TuneOptions, plan_edits

SCRIPT = textwrap.dedent('''\
    """A user's script."""
    import argparse
    from torch import nn
    from torch.utils.data import DataLoader


    def main():
        loader = DataLoader(ds, batch_size=32,
                            shuffle=True)  # keep this comment
        model = Net()
        # build the optimizer
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            x, y = x.to(dev), y.to(dev)
            out = model(x)  # forward
            loss = crit(out, y)
    ''')


def test_edits_keep_the_users_formatting_and_comments():
    edits = [Edit("loader", "f", 8, {"num_workers": 2, "persistent_workers": True}),
             Edit("channels_last", "f", 12, {"name": "model"}),
             Edit("non_blocking", "f", 14),
             Edit("autocast", "f", 15, {"device_type": "cuda", "dtype": "bfloat16"})]
    new, made, skipped = apply_edits(SCRIPT, edits)
    assert len(made) == 4 and not skipped
    compile(new, "train.py", "exec")
    assert "shuffle=True,\n                        num_workers=2,\n                        persistent_workers=True)" \
           "  # keep this comment" in new
    assert "    # build the optimizer\n    model = model.to(memory_format=torch.channels_last)\n    opt = " in new
    assert "x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)" in new
    assert ('        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):\n'
            '            out = model(x)  # forward\n        loss = crit(out, y)') in new
    # the file imported only "from torch import ...": "import torch" is added after its imports
    assert "from torch.utils.data import DataLoader\nimport torch\n" in new
    diff = unified_diff(SCRIPT, new, "train.py")
    assert diff.startswith("--- a/train.py\n+++ b/train.py\n") and "+import torch" in diff


def test_an_existing_keyword_is_replaced_and_import_torch_is_not_doubled():
    src = "import torch\nloader = torch.utils.data.DataLoader(ds, num_workers=0, pin_memory=False,)\n"
    new, made, _ = apply_edits(src, [Edit("loader", "f", 2, {"num_workers": 4, "pin_memory": True})])
    assert new == "import torch\nloader = torch.utils.data.DataLoader(ds, num_workers=4, pin_memory=True,)\n"
    new, _, _ = apply_edits(src, [Edit("channels_last", "f", 2, {"name": "m", "assign": False})])
    assert new.count("import torch") == 1 and "m.to(memory_format=torch.channels_last)\nloader" in new


def test_an_edit_that_cannot_be_placed_is_skipped_with_its_reason_not_guessed():
    src = "for x in loader: out = model(x)\nloader2 = make(ds)\n"
    new, made, skipped = apply_edits(src, [Edit("autocast", "f", 1, {}), Edit("loader", "f", 2, {"num_workers": 2})])
    assert new == src and not made
    reasons = [r for _, r in skipped]
    assert "compound statement" in reasons[0] and "no DataLoader(...) call starts on that line (line 2)" == reasons[1]
    with pytest.raises(ParameterError, match="unknown edit kind"):
        apply_edits(src, [Edit("fuse", "f", 1)])
    with pytest.raises(ParameterError, match="does not parse"):
        apply_edits("def broken(:\n", [])


def _probe(**over):
    probe = {"loaders": [{"file": "/s/train.py", "line": 8, "effective": {"num_workers": 0, "pin_memory": False}}],
             "model": {"class": "Net", "has_conv2d": True, "param_device": "cpu", "param_dtype": "float32",
                       "bf16_supported": True},
             "optimizer": {"file": "/s/train.py", "line": 12, "model_names": ["model"]},
             "forward_sites": [{"file": "/s/train.py", "line": 15, "count": 20},
                               {"file": "/s/train.py", "line": 30, "count": 2}],
             "to_sites": [{"file": "/s/train.py", "line": 14, "count": 20}], "autocast_in_use": False}
    probe.update(over)
    return probe


def test_candidates_follow_what_the_script_does():
    chosen, skipped = candidates.choose(_probe(), cores=2)
    assert [c.name for c in chosen] == ["num_workers=2", "torch.compile", "autocast bfloat16", "channels_last"]
    assert dict(skipped)["pin_memory"].startswith("the model is on the cpu")
    assert dict(skipped)["side_stream"].startswith("the model is on the cpu")
    cuda = _probe(model={**_probe()["model"], "param_device": "cuda", "bf16_supported": False},
                  loop_sites=[{"file": "/s/train.py", "line": 12, "device_expr": "device"}])
    chosen, skipped = candidates.choose(cuda, cores=8)
    assert [c.name for c in chosen] == ["num_workers=2", "num_workers=4", "num_workers=8", "pin_memory + non_blocking",
                                        "side-stream prefetch", "torch.compile", 'torch.compile mode="reduce-overhead"',
                                        "cudnn.benchmark", "channels_last"]
    assert chosen[4].apply == {"loader": {"pin_memory": True}, "prefetch": True}
    set_already = _probe(model={**cuda["model"], "cudnn_benchmark": True})
    assert "already sets" in dict(candidates.choose(set_already, cores=2)[1])["cudnn_benchmark"]
    assert "GradScaler" in dict(skipped)["autocast"]  # no backward() or step() seen: float16 is not tried
    sites = {"backward_sites": [{"file": "/s/train.py", "line": 16, "count": 20}],
             "step_sites": [{"file": "/s/train.py", "line": 17, "count": 20}]}
    chosen, skipped = candidates.choose({**cuda, **sites}, cores=2)
    fp16 = [c for c in chosen if c.technique == "autocast"]
    assert [(c.name, c.apply) for c in fp16] == [("autocast float16 + GradScaler",
                                                  {"autocast": "float16", "grad_scaler": True})]
    edits = plan_edits({**cuda, **sites, "clip_sites": []}, fp16, Path("/s/train.py"))
    assert [(e.kind, e.line, e.params.get("dtype") or e.params.get("backward")) for e in edits] == [
        ("autocast", 15, "float16"), ("grad_scaler", 17, [16])]
    npu = _probe(model={**_probe()["model"], "param_device": "npu"}, autocast_in_use=True,
                 loaders=[{"file": "/s/train.py", "line": 8, "effective": {"num_workers": 8, "pin_memory": True}}])
    chosen, skipped = candidates.choose(npu, cores=8)
    # its 8 workers keep torch's default 2 batches each in flight: a deeper queue is the one change left
    assert [(c.name, c.apply) for c in chosen] == [("prefetch_factor=4", {"loader": {"prefetch_factor": 4}}),
                                                   ("torch.compile", {"compile": "default"})]
    assert "8 workers keeps 2 batches in flight (torch's default)" in chosen[0].why
    assert set(dict(skipped)) == {"num_workers", "pin_memory", "side_stream", "autocast", "channels_last", "compile"}
    assert "no for loop over the DataLoader" in dict(skipped)["side_stream"]
    deep = [{**npu["loaders"][0], "effective": {"num_workers": 8, "pin_memory": True, "prefetch_factor": 6}}]
    chosen, skipped = candidates.choose({**npu, "loaders": deep}, cores=8)
    assert [c.name for c in chosen] == ["torch.compile"] and "prefetch_factor=6" in dict(skipped)["prefetch_factor"]
    assert "contiguous_format" in dict(skipped)["channels_last"]
    chosen, skipped = candidates.choose(_probe(loaders=[], model={}), cores=2)
    assert chosen == [] and "no model was found" in dict(skipped)["autocast"]


def test_plan_edits_places_each_winner_at_its_captured_site(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    p = _probe()
    for site in p["loaders"] + [p["optimizer"]] + p["forward_sites"] + p["to_sites"]:
        site["file"] = str(script)
    chosen, _ = candidates.choose({**p, "model": {**p["model"], "param_device": "cuda"}}, cores=2)
    chosen = [c for c in chosen if c.technique != "compile"]  # its edit: tests/test_tune_compile.py
    edits = plan_edits({**p, "model": {**p["model"], "param_device": "cuda"}}, chosen, script)
    got = {(e.kind, e.line) for e in edits}
    assert got == {("loader", 8), ("non_blocking", 14), ("autocast", 15), ("channels_last", 12), ("cudnn_benchmark", 12)}
    new, made, skipped = apply_edits(SCRIPT, edits)
    assert not skipped
    assert ("    # build the optimizer\n    torch.backends.cudnn.benchmark = True\n"
            "    model = model.to(memory_format=torch.channels_last)\n    opt = torch.optim.SGD") in new
    loader = next(e for e in edits if e.kind == "loader")
    assert loader.params == {"num_workers": 2, "persistent_workers": True, "pin_memory": True}
    # a call site in another file keeps its file: the session writes only the script's and names the others
    p["loaders"][0]["file"] = str(tmp_path / "data.py")
    assert [e.file for e in plan_edits(p, chosen[:1], script)] == [str(tmp_path / "data.py")]


def test_prefetch_factor_follows_the_winning_workers_and_is_judged_against_them(tmp_path):
    no_workers = _probe()
    chosen, _ = candidates.choose(no_workers, cores=2)
    assert all(c.technique != "prefetch_factor" for c in chosen)  # it needs workers: a follow-up, not a candidate
    workers = next(c for c in chosen if c.name == "num_workers=2")
    extra, why = candidates.follow_up([workers], no_workers)
    assert why == "" and extra.against == "num_workers=2" and extra.technique == "prefetch_factor"
    assert extra.apply == {"loader": {"num_workers": 2, "persistent_workers": True, "prefetch_factor": 4}}
    assert candidates.follow_up([], no_workers) == (
        None, "it acts only with DataLoader workers, and no num_workers setting was faster here")
    had = _probe(loaders=[{"file": "/s/train.py", "line": 8, "effective": {"num_workers": 2, "pin_memory": False}}])
    assert candidates.follow_up([workers], had) == (None, "")  # a first-round candidate there instead
    assert candidates.follow_up([], _probe(loaders=[])) == (None, "")  # no loader: nothing to say
    # a framework's winner: the same field in its own call, unless the call sets it already
    from helpers.tune.rewrite import framework_calls

    (call,) = framework_calls('from transformers import TrainingArguments\nTrainingArguments(output_dir="o")\n')
    fw, _ = candidates.framework_candidates([call], {"model": {}}, cores=2)
    base = next(c for c in fw if c.technique == "num_workers")
    extra, _ = candidates.follow_up([base], {"loaders": []}, [call])
    assert extra.apply["edits"][0]["values"] == {"dataloader_num_workers": 2, "dataloader_persistent_workers": True,
                                                 "dataloader_prefetch_factor": 4}
    (set_,) = framework_calls('from transformers import TrainingArguments\n'
                              'TrainingArguments(output_dir="o", dataloader_prefetch_factor=8)\n')
    assert candidates.follow_up([base], {"loaders": []}, [set_]) == (
        None, "TrainingArguments(...) already sets dataloader_prefetch_factor")
    # written only into loaders that have workers: torch refuses prefetch_factor without them
    script = tmp_path / "train.py"
    script.write_text("")
    two = {"loaders": [{"file": str(script), "line": 8, "effective": {"num_workers": 2}},
                       {"file": str(script), "line": 20, "effective": {"num_workers": 0}}]}
    deeper = candidates.Candidate("prefetch_factor=4", "prefetch_factor", {"loader": {"prefetch_factor": 4}})
    assert [(e.line, e.params, e.technique) for e in plan_edits(two, [deeper], script)] == [
        (8, {"prefetch_factor": 4}, "prefetch_factor")]
    both = plan_edits(two, [extra.__class__("w", "prefetch_factor", {"loader": {
        "num_workers": 2, "persistent_workers": True, "prefetch_factor": 4}}, against="num_workers=2")], script)
    assert [e.line for e in both] == [8, 20] and both[0].technique == "num_workers + prefetch_factor"


ARGPARSE_SCRIPT = textwrap.dedent('''\
    import argparse
    from torch.utils.data import DataLoader

    p = argparse.ArgumentParser()
    p.add_argument("--workers", "-j", type=int, default=0)  # 0 = load in the main process
    p.add_argument("--pin", action="store_true")
    args = p.parse_args()
    loader = DataLoader(ds, batch_size=32, num_workers=args.workers,  # 0 = main process
                        pin_memory=args.pin)
    other = DataLoader(ds, num_workers=cfg["workers"])
    ''')


def test_a_setting_read_from_the_scripts_own_option_is_written_as_its_default():
    edits = [Edit("loader", "t.py", 8, {"num_workers": 2, "persistent_workers": True, "prefetch_factor": 4,
                                        "pin_memory": True}, "num_workers + prefetch_factor + pin_memory"),
             Edit("loader", "t.py", 10, {"num_workers": 2, "persistent_workers": True}, "num_workers")]
    new, made, skipped = apply_edits(ARGPARSE_SCRIPT, edits)
    # the option's default, not a hard-coded value that would silence --workers; what needs workers follows it
    assert '\np.add_argument("--workers", "-j", type=int, default=2)  # 0 = load in the main process\n' in new
    assert ("loader = DataLoader(ds, batch_size=32, num_workers=args.workers,  # 0 = main process\n"
            "                    pin_memory=args.pin,\n"
            "                    persistent_workers=args.workers > 0,\n"
            "                    prefetch_factor=4 if args.workers > 0 else None)\n") in new
    assert 'other = DataLoader(ds, num_workers=cfg["workers"])\n' in new  # any other expression: left alone
    assert sorted((e.kind, e.technique) for e in made) == [("argparse_default", "num_workers"),
                                                           ("loader", "num_workers + prefetch_factor")]
    why = {(e.line, next(iter(e.params))): r for e, r in skipped}
    assert why[(8, "pin_memory")].endswith("the option --pin: pass --pin when you run the script")
    assert why[(10, "num_workers")] == ('num_workers is set from cfg["workers"] on line 10: tune does not replace '
                                        'your expression; make it 2 where that value comes from')
    # the command sets the option itself: the default would not act, so the argument to pass is said instead
    new, made, skipped = apply_edits(ARGPARSE_SCRIPT, edits[:1], passed=["--workers=0"])
    assert any(r.endswith("your command passes --workers itself: run it with --workers 2") for _, r in skipped)
    assert new == ARGPARSE_SCRIPT and not made  # what was measured with 2 workers is said, not written without
    why = {next(iter(e.params)): r for e, r in skipped if e.line == 8}
    assert why["prefetch_factor"] == ("prefetch_factor goes with num_workers=2 on line 8, which is not written "
                                      "(above): add it with the workers")
    assert set(why) == {"num_workers", "persistent_workers", "prefetch_factor", "pin_memory"}
    # a loader whose workers come from an expression, given only a deeper queue: the form valid whatever they are
    new, made, _ = apply_edits(ARGPARSE_SCRIPT, [Edit("loader", "t.py", 10, {"prefetch_factor": 4})])
    assert ('other = DataLoader(\n    ds, num_workers=cfg["workers"], prefetch_factor=4 if cfg["workers"] > 0 '
            'else None\n)') in new  # past the file's 79 characters: wrapped
    assert [e.technique for e in made] == ["prefetch_factor"]


def test_a_loader_in_another_file_that_reads_the_scripts_option_is_written_as_its_default():
    from helpers.tune.rewrite import loader_elsewhere

    other = ("from torch.utils.data import DataLoader\n\n\ndef make_loader(args, ds):\n"
             "    return DataLoader(ds, batch_size=32, num_workers=args.workers)\n")
    e = Edit("loader", "/p/data_utils.py", 5, {"num_workers": 2, "persistent_workers": True}, "num_workers")
    edits, advice = loader_elsewhere(other, e, script="/p/train.py", script_source=ARGPARSE_SCRIPT)
    assert [(x.kind, x.file, x.line, x.params["value"]) for x in edits] == [("argparse_default", "/p/train.py", 5, 2)]
    assert advice == ["persistent_workers=args.workers > 0"]  # the other file's call: said, in the form that follows
    new, made, _ = apply_edits(ARGPARSE_SCRIPT, edits)
    assert 'p.add_argument("--workers", "-j", type=int, default=2)' in new and made == edits
    # the command passes the option: the argument to pass instead; no option of the script: where it comes from
    assert loader_elsewhere(other, e, script="/p/train.py", script_source=ARGPARSE_SCRIPT, passed=["-j", "0"]) == (
        [], ["num_workers comes from your option -j: run it with -j 2", "persistent_workers=args.workers > 0"])
    assert loader_elsewhere(other, e)[1][0] == ("num_workers is set from args.workers: tune does not replace your "
                                                "expression; make it 2 where that value comes from")
    assert loader_elsewhere(other.replace("args.workers", "0"), e) == ([], ["num_workers=2",
                                                                          "persistent_workers=True"])
    assert loader_elsewhere(other, Edit("loader", "d.py", 1, {"num_workers": 2})) == ([], [])


def test_channels_last_goes_into_the_module_a_ddp_wrap_takes_not_after_it(tmp_path):
    src = textwrap.dedent('''\
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP


        def main(rank):
            model = DDP(SmallCNN().to(device), device_ids=[rank])  # wrap
            other = torch.nn.parallel.DistributedDataParallel(module=net)
            third = DDP(a if b else c)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ''')
    edits = [Edit("channels_last", "t.py", n, {"wrap_arg": True}) for n in (6, 7, 8)]
    new, made, skipped = apply_edits(src, edits)
    assert not skipped and len(made) == 3
    assert ("    model = DDP(SmallCNN().to(device).to(memory_format=torch.channels_last), device_ids=[rank])  # wrap\n"
            "    other = torch.nn.parallel.DistributedDataParallel(module=net.to(memory_format=torch.channels_last))\n"
            "    third = DDP((a if b else c).to(memory_format=torch.channels_last))\n"
            "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n") in new  # nothing inserted after the wrap
    # a line whose call is not DDP's is not guessed at
    _, made, skipped = apply_edits("model = Wrapper(net)\n", [Edit("channels_last", "t.py", 1, {"wrap_arg": True})])
    assert not made and "DistributedDataParallel" in skipped[0][1]
    # the session places it there when the probe found the model wrapped
    script = tmp_path / "train.py"
    script.write_text(src)
    p = _probe(model={**_probe()["model"], "wrapper": "DistributedDataParallel"},
               optimizer={"file": str(script), "line": 9, "model_names": ["model"]},
               ddp_sites=[{"file": str(script), "line": 6, "function": "main"}])
    cl = candidates.Candidate("channels_last", "channels_last", {"channels_last": True})
    assert [(e.kind, e.line, e.params) for e in plan_edits(p, [cl], script)] == [
        ("channels_last", 6, {"wrap_arg": True})]


def test_the_command_is_read_or_refused_before_anything_runs(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    cmd = parse_command(["python", "train.py", "--epochs", "2"], cwd=tmp_path)
    assert cmd.script == script and cmd.args == ("--epochs", "2") and cmd.python == sys.executable
    assert parse_command(["/opt/py/bin/python3", str(script)]).python == "/opt/py/bin/python3"
    for words, msg in (([], "give the command"), (["bash", "run.sh"], "a Python interpreter or torchrun"),
                       (["torchrun", "--nnodes", "2", "train.py"], "on this machine only"),
                       (["torchrun", "-m", "pkg.train"], "the module 'pkg.train' is not a file under"),
                       (["torchrun", "--no-python", "train.py"], "--no-python is not supported"),
                       (["torchrun", "--nproc-per-node", "gpu", "train.py"], "give a number of processes"),
                       (["torchrun", "--no-such-flag", "train.py"], "torchrun could not read its options"),
                       (["torchrun", "--nproc-per-node", "2", "nope.py"], "does not exist"),
                       (["python"], "give the script"), (["python", "-u", "train.py"], "not supported"),
                       (["python", "nope.py"], "does not exist"),
                       (["python", "-m", "pkg.train"], "looked for pkg/train.py and pkg/train/__main__.py"),
                       (["python", "-m"], "give the module after -m"),
                       (["python", "-c", "pass"], "give python train.py ARGS"),
                       (["python", "."], "is a folder")):
        with pytest.raises(ParameterError, match=msg):
            parse_command(words, cwd=tmp_path)
    # torchrun, or python -m torch.distributed.run: read with torchrun's own parser; one node, N processes
    for words in (["torchrun", "--nproc-per-node", "2", "train.py", "--lr", "0.1"],
                  ["python", "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone", "train.py", "--lr",
                   "0.1"]):
        cmd = parse_command(words, cwd=tmp_path)
        assert (cmd.launcher, cmd.nproc, cmd.script, cmd.args) == ("torchrun", 2, script, ("--lr", "0.1"))
        assert str(cmd).startswith("torchrun --nproc-per-node 2 ") and cmd.python == sys.executable
        line = cmd.process(tmp_path / "spec.json")
        assert line[1:4] == ["-m", "torch.distributed.run", "--standalone"] and line[-3:] == [
            "-m", "helpers.tune.hook", str(tmp_path / "spec.json")]
    assert parse_command(["python", "train.py"], cwd=tmp_path).process(tmp_path / "s.json")[1:3] == [
        "-m", "helpers.tune.hook"]
    (tmp_path / "run.sh").write_text("")
    with pytest.raises(ParameterError, match="not a .py file"):
        parse_command(["python", "run.sh"], cwd=tmp_path)
    for bad in ({"steps": 2}, {"rounds": 1}, {"warmup": 0}, {"timeout_s": 0}):
        with pytest.raises(ParameterError):
            TuneOptions(**bad)
    with pytest.raises(ParameterError, match="--skip torch.compile: no such technique; the techniques are "
                                             "allocator, autocast, bucket_cap_mb, channels_last, comm_hook, compile"):
        TuneOptions(skip=("compile", "torch.compile"))
    assert TuneOptions(skip=("compile", "no_sync")).skip == ("compile", "no_sync")


QUIET = machine.BusyCheck(False, (), 0.01, 0.2, 60.0)
BUSY = machine.BusyCheck(True, ("other processes took 80% of the cores",), 0.8, 1.5, 60.0)


def _runs(name, per_round_ms, loss=1.0, status="steps", n=20):
    out = []
    for r, ms in enumerate(per_round_ms):
        times = [ms / 1e3 * (1 + 0.01 * ((i * 7) % 5)) for i in range(n)]
        out.append(Run(name, r, status, times if status == "steps" else [], [loss] * (n + 5), 5.0,
                       "" if status == "steps" else "Traceback ...\nValueError: bad", {"warmup_steps": 5}))
    return out


def test_judge_calls_a_clear_gain_faster_and_a_loss_slower():
    base = _runs("unmodified", [100, 102, 101])
    j = judge("num_workers=2", base, _runs("num_workers=2", [50, 51, 49]), QUIET)
    assert j.verdict == "faster" and 1.9 < j.speedup < 2.1 and j.ci_low > 1.0 and len(j.round_speedups) == 3
    assert judge("autocast", base, _runs("autocast", [300, 310, 305]), QUIET).verdict == "slower"
    assert judge("same", base, _runs("same", [101, 100, 102]), QUIET).verdict == "no gain"
    small = judge("small", base, _runs("small", [98, 99.5, 98.5]), QUIET)
    assert small.verdict == "no gain" and "threshold" in small.reason


def test_judge_is_inconclusive_on_a_busy_machine_or_when_rounds_disagree():
    base = _runs("unmodified", [100, 100, 100])
    busy = judge("x", base, _runs("x", [50, 50, 50]), BUSY)
    assert busy.verdict == "inconclusive" and "busy machine" in busy.reason
    # five rounds: the pooled interval clears 1, but one round says the opposite
    split = judge("x", _runs("unmodified", [100] * 5), _runs("x", [60, 60, 60, 60, 101]), QUIET)
    assert split.verdict == "inconclusive" and "rounds disagree" in split.reason


def test_judge_rejects_a_change_that_fails_hangs_diverges_or_moves_the_loss():
    base = _runs("unmodified", [100, 100, 100], loss=2.0)
    failed = judge("x", base, _runs("x", [50, 50, 50], status="error"), QUIET)
    assert failed.verdict == "rejected" and "ValueError: bad" in failed.reason and math.isnan(failed.speedup)
    hung = judge("x", base, [Run("x", 0, "timeout", [], [], 60.0, "no result after 60 s")], QUIET)
    assert hung.verdict == "rejected" and "hung" in hung.reason
    nan = _runs("x", [50, 50, 50], loss=2.0)
    nan[1].losses[7] = float("nan")
    j = judge("x", base, nan, QUIET)
    assert j.verdict == "rejected" and "became nan at step 8" in j.reason
    moved = judge("x", base, _runs("x", [50, 50, 50], loss=2.5), QUIET)
    assert moved.verdict == "rejected" and "changes the results" in moved.reason
    within = judge("x", base, _runs("x", [50, 50, 50], loss=2.1), QUIET)
    assert within.verdict == "faster"


@pytest.mark.parametrize("follow_ms, kept", [(60, True), (79, False)])
def test_a_follow_up_replaces_its_winner_only_when_faster_than_it(tmp_path, monkeypatch, follow_ms, kept):
    from helpers.tune import report, session

    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    seen = []

    def fake_measure(command, variants, **kw):  # the follow-up runs against the winner it builds on, interleaved
        seen.append([(name, apply) for name, apply, _ in variants])
        return {variants[0][0]: _runs(variants[0][0], [80, 81, 79]),
                variants[1][0]: _runs(variants[1][0], [follow_ms, follow_ms + 1, follow_ms - 1])}, QUIET

    monkeypatch.setattr(session, "measure", fake_measure)
    workers = candidates.Candidate("num_workers=2", "num_workers",
                                   {"loader": {"num_workers": 2, "persistent_workers": True}}, "loads in the process")
    res = session.TuneResult("python train.py", tmp_path / "out", _probe(), candidates=[workers])
    (tmp_path / "out").mkdir()
    winners = session._follow_up(parse_command(["python", str(script)], cwd=tmp_path), [workers], res,
                                 TuneOptions(), tmp_path / "work", 60.0, False, lambda line: None)
    assert seen == [[("num_workers=2", workers.apply), ("num_workers=2 + prefetch_factor=4", {"loader": {
        "num_workers": 2, "persistent_workers": True, "prefetch_factor": 4}})]]
    j = res.judgements[-1]
    assert j.variant == "num_workers=2 + prefetch_factor=4" and (j.verdict == "faster") is kept
    assert [c.name for c in winners] == (["num_workers=2 + prefetch_factor=4"] if kept else ["num_workers=2"])
    assert res.busy.startswith("; while the follow-up ran, the machine was quiet")
    row = next(line for line in report.markdown(res).splitlines() if line.startswith("| num_workers=2 + "))
    assert "against num_workers=2 | 03 |" in row


def test_rare_stalls_count_in_full_the_speedup_is_a_ratio_of_throughputs():
    # a loader that stalls on 1 batch in 20 (250 ms against 25 ms): most 5-step blocks hold no stall, so a median
    # would call a loader without stalls no faster; the total time says 1.45x
    def stalled(name, stall_every):
        out = []
        for r in range(3):
            times = [0.250 if stall_every and i % stall_every == 7 else 0.025 for i in range(40)]
            out.append(Run(name, r, "steps", times, [1.0] * 45, 5.0, "", {"warmup_steps": 5}))
        return out

    j = judge("prefetch_factor=4", stalled("u", 20), stalled("p", 0), QUIET)
    assert j.verdict == "faster" and j.speedup == pytest.approx(36.25 / 25.0) and j.ci_low > 1.0, j.reason
    assert "(means)" in j.reason
    with pytest.raises(ParameterError, match="statistic"):
        from helpers.timing import bootstrap_ratio_ci

        bootstrap_ratio_ci([1.0], [1.0], statistic="mode")


def test_a_loss_that_explodes_while_finite_is_the_scripts_divergence_not_a_changes():
    run = _runs("unmodified", [100])[0]
    assert engine.exploding(run) is None  # a flat loss
    run.losses = [1.6, 1.5, 1.7, 40.0, 3e3, 8e5, 2e8, 6.5e16]
    assert engine.exploding(run) == (1.5, 6.5e16, 8)
    run.losses = [1.56, 7.9e16, 7.6e5, 2e6, 9e5, 1.4e6]  # BatchNorm at lr=1e6: exploded at the second step
    assert engine.exploding(run) == (1.56, 1.4e6, 6)
    run.losses = [1.6, 1.5, 1.7, 1.2, 9e3, 1.1, 0.9, 0.8]  # one spike, then back: not divergence
    assert engine.exploding(run) is None
    run.losses = [2.3, 2.2, 2.0, 1.5, 1.0, 0.5, 0.2, 0.1]
    assert engine.exploding(run) is None


def test_the_headline_says_what_the_diff_holds_and_a_busy_machine_is_not_no_gain(tmp_path):
    from helpers.tune.session import TuneResult

    res = TuneResult("python train.py", tmp_path, _probe())
    res.judgements = [judge("num_workers=2", _runs("u", [100, 101]), _runs("n", [50, 51]), BUSY)]
    assert res.judgements[0].verdict == "inconclusive"
    assert res.headline.startswith("No change was proven faster, but 1 of 1 could not be judged (the machine was busy")
    res.judgements = [judge("num_workers=2", _runs("u", [100, 101]), _runs("n", [100, 101]), QUIET)]
    assert res.headline == "No change made this script faster here: nothing to rewrite."
    res.judgements = [judge("num_workers=2", _runs("u", [100, 101]), _runs("n", [50, 51]), QUIET)]
    res.winners, res.edits_made = ["num_workers=2"], [Edit("loader", "f", 3, {"num_workers": 2}, "num_workers")]
    res.proof = judge("rewritten", _runs("original", [100, 101]), _runs("rewritten", [50, 51], status="error"), QUIET)
    assert res.headline == ("The rewritten script was rejected when it ran as written (the script failed with this "
                            "change (round 1): ValueError: bad): no change is proposed.")


def test_proven_names_only_the_changes_the_diff_holds(tmp_path, monkeypatch):
    from helpers.tune import session

    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    probe = _probe()
    probe["loaders"][0]["file"] = str(tmp_path / "data_utils.py")  # the DataLoader is built in another module
    for site in [probe["optimizer"]] + probe["forward_sites"] + probe["to_sites"]:
        site["file"] = str(script)
    monkeypatch.setattr(session, "measure", lambda command, variants, **kw: (
        {"original": _runs("original", [100, 101]), "rewritten": _runs("rewritten", [80, 81])}, QUIET))
    chosen, _ = candidates.choose(probe, cores=2)
    winners = [c for c in chosen if c.name in ("num_workers=2", "channels_last")]
    res = session.TuneResult("python train.py", tmp_path / "out", probe, candidates=chosen)
    (tmp_path / "out").mkdir()
    (tmp_path / "work").mkdir()
    assert session._prove(parse_command(["python", str(script)], cwd=tmp_path), winners, res, TuneOptions(),
                          tmp_path / "work", 60.0, False, lambda line: None)
    assert res.proven == ["channels_last"] and "(channels_last)" in res.headline
    assert res.busy.startswith("; while the proof ran, the machine was quiet while measuring: other processes took "
                               "1% of the cores")  # the proof's own machine state, in the report
    (skipped,) = res.edits_skipped
    assert skipped[0].kind == "loader" and "data_utils.py, line 8" in skipped[1]


def test_the_fallback_proof_is_the_best_winner_that_can_be_written(tmp_path):
    from helpers.tune import session

    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    probe = _probe()
    probe["loaders"][0]["file"] = str(tmp_path / "data_utils.py")  # num_workers: a call in another file
    for site in [probe["optimizer"]] + probe["forward_sites"] + probe["to_sites"]:
        site["file"] = str(script)
    chosen = {c.name: c for c in candidates.choose(probe, cores=2)[0]}
    workers, cl, amp = chosen["num_workers=2"], chosen["channels_last"], chosen["autocast bfloat16"]
    assert session._attempts([workers, cl], probe, script) == [[workers, cl]]  # no second try of the same edit
    assert session._attempts([workers, amp, cl], probe, script) == [[workers, amp, cl], [amp]]
    assert session._attempts([], probe, script) == []


def test_blocks_average_bimodal_steps_into_throughput():
    # a worker-fed loop: every other step waits for its batch; the median step would say 10 ms, the throughput 55
    times = [0.010, 0.100] * 10
    assert engine.blocks(times, 4) == pytest.approx([0.055] * 5)
    assert engine.blocks([0.1, 0.2], 5) == pytest.approx([0.15])
    assert engine.blocks([]) == []


def test_a_change_stopped_early_as_far_slower_is_called_slower_on_that_one_run():
    base = _runs("unmodified", [100, 100, 100])
    slow = [Run("autocast", 0, "slow", [0.52, 0.55, 0.50], [1.0] * 8, 9.0, "", {"warmup_steps": 5})]
    j = judge("autocast", base, slow, QUIET)
    assert j.verdict == "slower" and "stopped after 5 steps" in j.reason and "5.1x as long" in j.reason
    assert "over steps 2-4" in j.reason and "over its timed steps" in j.reason  # the base recorded no early steps
    assert j.figure == "0.20x (one run, stopped early)" and j.base_ms == pytest.approx(102, abs=1)


def test_notebook_10s_change_is_the_loop_edited_by_tunes_own_rewriter():
    from helpers.tune.loop_diff import LOOP, change_as_code

    diff, notes = change_as_code(["batched_decode", "dataloader_workers", "pinned_memory", "mixed_precision",
                                  "channels_last"], num_workers=4, amp_dtype="float16", device_type="cuda")
    assert ("+loader = DataLoader(\n+    dataset,\n+    batch_size=batch_size,\n+    shuffle=True,\n"
            "+    num_workers=4,\n+    persistent_workers=True,\n+    pin_memory=True,\n+)") in diff
    assert "+    images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)" in diff
    assert '+    with torch.autocast(device_type="cuda", dtype=torch.float16):\n+        logits = model(images)' in diff
    assert "+model = model.to(memory_format=torch.channels_last)" in diff
    assert any("GradScaler" in n for n in notes) and any("notebook 02" in n for n in notes)
    # the same edit of a user's loop, made by tune, gives the same lines
    new, _, _ = apply_edits(LOOP, [Edit("loader", "f", 4, {"num_workers": 4, "persistent_workers": True,
                                                           "pin_memory": True})])
    assert "\n".join(f"+{ln}" for ln in new.splitlines()[3:11]) in diff
    assert change_as_code([]) == ("", [])
    diff, notes = change_as_code(["prefetcher"], device_type="cuda")
    assert "+for images, labels in prefetch(loader, device):" in diff and not notes
    from helpers.pipeline.side_stream import SOURCE

    added = "\n".join(ln[1:] for ln in diff.splitlines() if ln.startswith("+") and not ln.startswith("+++"))
    assert SOURCE.rstrip("\n") in added and "+import contextlib\n+import functools\n+\n import torch" in diff
    diff, notes = change_as_code(["prefetcher"], device_type="cpu")
    assert diff == "" and "only where the device has streams" in notes[0] and "notebook 05" in notes[0]
    _, notes = change_as_code(["pinned_memory"], device_type="cpu")
    assert "only where a device" in notes[0]


def test_the_model_is_found_by_its_name_or_as_an_attribute_of_a_trainer_object():
    import torch

    from helpers.tune.hook import _find_model

    class Trainer:
        pass

    trainer = Trainer()
    trainer.net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 2))
    head = trainer.net[1]  # a submodule holds only part of the parameters: not the model
    model, names = _find_model(sys._getframe(), list(trainer.net.parameters()))
    assert model is trainer.net and names == ["trainer.net"] and head is not model
    net = trainer.net
    model, names = _find_model(sys._getframe(), list(net.parameters()))
    assert model is net and set(names) == {"net", "model", "trainer.net"}  # every name the frame has for it


def test_a_new_argument_never_copies_a_neighbours_comment():
    src = ("loader = DataLoader(\n    ds,\n    batch_size=8,  # small batches\n"
           "    shuffle=True,  # num_workers left at default for now\n)\n"
           "l2 = DataLoader(ds,  # the data\n                batch_size=8)\n")
    new, made, _ = apply_edits(src, [Edit("loader", "f", 1, {"num_workers": 2, "persistent_workers": True}),
                                     Edit("loader", "f", 6, {"num_workers": 2})])
    assert len(made) == 2 and new.count("# num_workers left at default for now") == 1
    assert ("    shuffle=True,  # num_workers left at default for now\n    num_workers=2,\n"
            "    persistent_workers=True,\n)\n") in new
    assert "l2 = DataLoader(ds,  # the data\n                batch_size=8,\n                num_workers=2)\n" in new


def test_a_torchrun_runs_ranks_merge_into_the_slowest_rank_per_step():
    from helpers.tune.engine import _merge_ranks, rank_result

    r0 = {"status": "steps", "step_times_s": [0.1, 0.1, 0.3], "losses": [1.0, 0.9, 0.8], "loaders": ["site"]}
    r1 = {"status": "steps", "step_times_s": [0.2, 0.05], "losses": [2.0, 1.9], "loaders": []}
    m = _merge_ranks({0: r0, 1: r1})
    assert m["step_times_s"] == [0.2, 0.1] and m["losses"] == r0["losses"] and m["loaders"] == ["site"]
    assert m["status"] == "steps" and m["ranks"] == 2
    failed = _merge_ranks({0: r0, 1: dict(r1, status="error", error="Traceback ... ValueError: sample 37")})
    assert failed["status"] == "error" and failed["error"].startswith("rank 1: Traceback")
    # rank 1 fails first; rank 0 then fails on the closed connection: rank 1's is the cause
    both = _merge_ranks({0: dict(r0, status="error", error="RuntimeError: Connection closed by peer",
                                 failed_at=12.5),
                         1: dict(r1, status="error", error="ValueError: sample 37", failed_at=12.0)})
    assert both["error"] == "rank 1 (rank 0 failed after it): ValueError: sample 37"
    # torchrun stopped rank 0 before it wrote anything: rank 1's own failure is the answer
    alone = _merge_ranks({1: dict(r1, status="error", error="ValueError: sample 37", failed_at=12.0)})
    assert alone["status"] == "error" and alone["error"] == "rank 1: ValueError: sample 37"
    assert _merge_ranks({0: r0, 1: dict(r1, status="slow")})["status"] == "slow"
    assert _merge_ranks({0: r0}) is r0
    out = Path("/x/run-r0.json")
    assert rank_result(out, 0) == out and rank_result(out, 3) == Path("/x/run-r0.json.rank3")


def test_a_frameworks_own_calls_are_found_by_import_and_get_its_own_settings():
    from helpers.tune.candidates import framework_candidates
    from helpers.tune.rewrite import framework_calls

    src = textwrap.dedent('''\
        import lightning as L
        import pytorch_lightning as pl
        from transformers import TrainingArguments as TA
        from accelerate import Accelerator
        from mylib import Trainer  # not Lightning's: left alone

        args = TA(output_dir="out", fp16=True)
        trainer = L.Trainer(max_epochs=1)
        pl.Trainer(precision="16-mixed")
        Trainer(precision=32)
        acc = Accelerator(**config)
        ''')
    calls = framework_calls(src)
    assert [(c["framework"], c["call"], c["line"]) for c in calls] == [
        ("transformers", "TA", 7), ("lightning", "Trainer", 8), ("pytorch_lightning", "Trainer", 9),
        ("accelerate", "Accelerator", 11)]
    assert framework_calls("def broken(:\n") == []
    cands, skipped = framework_candidates(calls, {"model": {}}, cores=8)
    got = {c.name: c.apply["edits"][0] for c in cands}
    # transformers: workers (2 and 4 of 8 cores) in its own fields; bf16 already set there; Lightning's precision
    assert set(got) == {"dataloader_num_workers=2", "dataloader_num_workers=4", 'precision="bf16-mixed"'}
    assert got["dataloader_num_workers=4"] == {"call": "TA", "line": 7, "values": {
        "dataloader_num_workers": 4, "dataloader_persistent_workers": True}}
    assert got['precision="bf16-mixed"']["line"] == 8
    reasons = " | ".join(r for _, r in skipped)
    assert "TA already trains in fp16" in reasons and "already sets precision" in reasons
    assert ("autocast", next(r for r in reasons.split(" | ") if "passes **kwargs" in r)) in skipped
    # a value set in the call: more workers than it has are tried; a variable is left alone
    (more,) = framework_calls('from transformers import TrainingArguments\n'
                              'TrainingArguments(output_dir="o", dataloader_num_workers=1, bf16=False)\n')
    got, _ = framework_candidates([more], {"model": {}}, cores=2)
    assert [c.name for c in got] == ["dataloader_num_workers=2", "bf16=True"]
    assert "loads in 1 worker (dataloader_num_workers=1)" in got[0].why
    (var,) = framework_calls('from transformers import TrainingArguments\nTrainingArguments(output_dir="o", '
                             'dataloader_num_workers=n, bf16=use_bf16)\n')
    got, why = framework_candidates([var], {"model": {}}, cores=2)
    assert got == [] and all("from a variable" in r for _, r in why) and len(why) == 2
    # a device known to lack bfloat16 gets no bf16 candidate
    none, _ = framework_candidates(calls, {"model": {"bf16_supported": False}}, cores=8)
    assert all(c.technique != "autocast" for c in none)


def test_a_framework_edit_keeps_the_calls_layout_and_quotes():
    src = 'import lightning as L\ntrainer = L.Trainer(\n    max_epochs=1,  # short\n)\n'
    new, made, skipped = apply_edits(src, [Edit("call_keywords", "t.py", 2, {"call": "Trainer", "values": {
        "precision": "bf16-mixed"}})])
    assert new == 'import lightning as L\ntrainer = L.Trainer(\n    max_epochs=1,  # short\n    precision="bf16-mixed",\n)\n'
    # one argument on its own line, no trailing comma: the new one goes on the next line, before the ")"
    one = "loader = DataLoader(\n    data\n)\n"
    assert apply_edits(one, [Edit("loader", "t.py", 1, {"num_workers": 2})])[0] == (
        "loader = DataLoader(\n    data,\n    num_workers=2\n)\n")
    _, _, skipped = apply_edits(src, [Edit("call_keywords", "t.py", 3, {"call": "Trainer", "values": {"x": 1}})])
    assert skipped and "no Trainer(...) call starts on that line (line 3)" in skipped[0][1]


def test_a_framework_beside_the_script_is_not_the_users_code(tmp_path):
    from helpers.tune.hook import Recorder

    rec = Recorder({"warmup": 1, "steps": 5, "user_roots": [str(tmp_path)]})
    for name in ("train.py", "data/loaders.py"):
        assert rec.is_user_file(str(tmp_path / name)), name
    for name in ("transformers/trainer.py", "vendor/lightning/pytorch/trainer.py", "accelerate/__init__.py"):
        assert not rec.is_user_file(str(tmp_path / name)), name
    # a project folder that happens to carry a framework's name is still the user's (only folders below a root count)
    inner = tmp_path / "transformers"
    assert Recorder({"warmup": 1, "steps": 5, "user_roots": [str(inner)]}).is_user_file(str(inner / "train.py"))


def test_a_hung_run_says_how_far_each_rank_got(tmp_path):
    import json as _json
    import time as _time

    from helpers.tune.engine import progress_text, rank_result

    out = tmp_path / "unmodified-r0.json"
    assert progress_text(out, 1) == ""  # no heartbeat: nothing to say
    now = _time.time()
    for rank, steps, ago in ((0, 3, 20.0), (1, 2, 27.0)):
        p = rank_result(out, rank)
        p.with_name(p.name + ".progress").write_text(_json.dumps({"steps": steps, "wall": now - ago}))
    text = progress_text(out, 2)
    assert text.startswith("rank 1 made 2 optimizer steps, then nothing for 27 s; rank 0 made 3 optimizer steps")
    assert progress_text(out, 1).startswith("it made 3 optimizer steps, then nothing for 2")


def test_the_loops_device_is_named_as_the_script_names_it():
    import argparse
    import types

    import torch

    from helpers.tune.hook import _device_expr

    model = torch.nn.Linear(2, 2)
    ddp_like = types.SimpleNamespace()  # not a Module: never the model

    def expr(on="cpu", **names):  # the names in scope at the loop, the model on the device ``on``
        return _device_expr(types.SimpleNamespace(f_locals=names, f_globals={}), model, torch.device(on))

    cpu = torch.device("cpu")
    assert expr(device=cpu, dev=cpu, model=model) == "device"  # a torch.device named for what it is, first
    assert expr(dev=cpu, model=model) == "dev"
    assert expr(args=argparse.Namespace(device="cpu", lr=0.1), model=model) == "args.device"
    assert expr(self=types.SimpleNamespace(device=cpu, net=model)) == "self.device"
    assert expr(net=model, other=ddp_like) == "next(net.parameters()).device"
    assert expr(mode="cpu") is None  # a string names a device only in a variable named for one
    assert expr("cuda:0", device="cuda") == "device"  # torch.device("cuda") is the current device
    assert expr("cuda:0", device="cuda:1") is None and expr("cuda:0", device=cpu) is None


def test_edits_skipped_together_for_one_reason_are_one_line(tmp_path):
    from helpers.tune.session import TuneResult

    why = "float16 autocast and its GradScaler are written together or not at all: the step on line 9 is not a " \
          "statement of its own"
    res = TuneResult(command=None, out_dir=tmp_path, probe={})
    res.edits_skipped = [(Edit("autocast", "f", 5, {"dtype": "float16"}, "autocast"), why),
                         (Edit("grad_scaler", "f", 9, {}, "autocast"), why),
                         (Edit("loader", "f", 3, {"num_workers": 2}, "num_workers"), "elsewhere")]
    assert res.not_written() == [f"autocast: {why}", "num_workers: elsewhere"]


@pytest.mark.parametrize("binding", [
    "def train(loader, device, prefetch=False):\n",  # a parameter
    "def train(loader, device):\n    prefetch = None\n",  # a local
    "from utils import *\ndef train(loader, device):\n",  # a star import may bind any name
])
def test_a_name_the_file_uses_already_is_never_shadowed_by_the_prefetcher(binding):
    src = f"import torch\n{binding}    for x in loader:\n        print(x)\n"
    line = next(i for i, ln in enumerate(src.splitlines(), 1) if ln.lstrip().startswith("for x"))
    new, made, skipped = apply_edits(src, [Edit("prefetch", "f", line, {"device": "device"})])
    assert new == src and not made
    assert ("star import" if "*" in binding else "already uses the name prefetch") in skipped[0][1]
    # keyword arguments and attributes bind no name: the edit is made
    other = ("import torch\ndef train(loader, args):\n    f(prefetch=args.prefetch)\n    for x in loader:\n"
             "        g(x)\n")
    new, made, _ = apply_edits(other, [Edit("prefetch", "f", 4, {"device": "args.device"})])
    assert made and "    for x in prefetch(loader, args.device):\n" in new


def test_the_grad_scaler_goes_after_the_last_import_where_code_sits_between_imports():
    src = ("import os\nos.environ.setdefault(\"OMP_NUM_THREADS\", \"1\")\nimport torch\n\n\n"
           "def train(model, opt, x):\n    loss = model(x).sum()\n    loss.backward()\n    opt.step()\n")
    edits = [Edit("autocast", "f", 7, {"device_type": "cuda", "dtype": "float16"}),
             Edit("grad_scaler", "f", 9, {"device_type": "cuda", "backward": [8], "clip": []})]
    new, made, skipped = apply_edits(src, edits)
    assert len(made) == 2 and not skipped
    assert new.index("import torch\n") < new.index("grad_scaler = torch.amp.GradScaler(\"cuda\")")
    compile(new, "rewritten.py", "exec")
    taken = src.replace("def train(model, opt, x):", "def train(model, opt, x, grad_scaler=None):")
    new, made, skipped = apply_edits(taken, edits)
    assert new == taken and not made and "already uses the name grad_scaler" in skipped[0][1]


def test_progress_says_when_a_failed_change_is_not_run_again(tmp_path, monkeypatch):
    def fake_run_once(command, name, apply, **kw):
        ok = name != "bad"
        return Run(name, kw["round_"], "steps" if ok else "error", [0.01] * 5 if ok else [], [1.0] * 5, 1.0,
                   "" if ok else "ValueError: bad", {})

    monkeypatch.setattr(engine, "run_once", fake_run_once)
    lines: list[str] = []
    variants = [("unmodified", {}, None), ("bad", {"x": 1}, None), ("good", {"y": 1}, None)]
    runs, _ = engine.measure(None, variants, rounds=3, workdir=tmp_path, warmup=1, steps=5, timeout_s=10,
                             progress=lines.append)
    assert len(runs["bad"]) == 1 and len(runs["good"]) == 3
    assert lines[1] == "[2/7] round 1: bad: error (its 2 later runs skipped)"
    assert lines[-1].startswith("[7/7] ")


def test_float16_is_not_written_where_a_line_of_it_is_outside_the_script_or_the_step_takes_a_closure(tmp_path):
    from helpers.tune.session import _float16_in_one_file

    script = tmp_path / "train.py"
    script.write_text("")
    command = parse_command(["python", "train.py"], cwd=tmp_path)
    mine, other = str(script.resolve()), str(tmp_path / "engine_utils.py")
    group = [Edit("autocast", mine, 10, {"device_type": "cuda", "dtype": "float16"}, "autocast"),
             Edit("grad_scaler", mine, 14, {"backward": [], "clip": [], "elsewhere": [(other, 6)]}, "autocast")]
    loader = Edit("loader", mine, 3, {"num_workers": 2}, "num_workers")
    kept, skipped = _float16_in_one_file(group + [loader], script, command)
    assert kept == [loader] and len(skipped) == 2
    assert "engine_utils.py, line 6: tune edits only the script you gave" in skipped[0][1]
    assert _float16_in_one_file(group[:1] + [loader], script, command) == (group[:1] + [loader], [])
    # a step given a closure (LBFGS) stays as it is, and so does the float16 autocast
    src = "import torch\nloss = model(x)\nloss.backward()\nopt.step(closure)\n"
    new, made, skipped = apply_edits(src, [Edit("autocast", "f", 2, {"device_type": "cuda", "dtype": "float16"}),
                                           Edit("grad_scaler", "f", 4, {"device_type": "cuda", "backward": [3]})])
    assert new == src and not made and "takes arguments" in skipped[0][1]


def test_a_rewritten_scripts_traceback_shows_its_own_lines(tmp_path, monkeypatch):
    import traceback

    from helpers.tune.hook import _run_as_main

    monkeypatch.setattr(sys, "path", list(sys.path))  # the runner puts the script's folder first, as python does

    (tmp_path / "train.py").write_text("x = 1\ny = 2\nz = 3\n")
    (tmp_path / "rewritten.py").write_text("import sys\nx = 1\nraise ValueError('in the rewritten file')\n")
    with pytest.raises(ValueError) as info:
        _run_as_main(str(tmp_path / "train.py"), str(tmp_path / "rewritten.py"))
    text = "".join(traceback.format_exception(info.value))
    assert "raise ValueError('in the rewritten file')" in text and "y = 2" not in text


def test_a_users_file_is_kept_before_its_first_write_and_put_back_after_the_run(tmp_path):
    # the hook's audit handler, called as Python's audit events call it (a hook cannot be removed once added, so
    # the test calls it directly); each event comes before the change it announces
    import os

    from helpers.tune.engine import restore_user_files
    from helpers.tune.hook import UserFiles

    home, run = tmp_path / "home", tmp_path / "run"
    home.mkdir()
    run.mkdir()
    metrics, log, old = home / "metrics.csv", tmp_path / "elsewhere.log", home / "old.txt"
    metrics.write_text("step,loss\n0,2.3\n")
    log.write_text("yesterday\n")
    old.write_text("keep me\n")
    guard = UserFiles(str(run / "x.kept"), [str(run)])

    def event(name, *args):
        guard(name, args)

    event("open", str(metrics), "w", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    metrics.write_text("step,loss\n")  # truncated by the run
    for _ in range(3):
        event("open", str(log), "a", os.O_WRONLY | os.O_APPEND)
        with open(log, "a") as f:
            f.write("run\n")
    event("open", str(home / "new.txt"), None, os.O_CREAT | os.O_WRONLY)
    (home / "new.txt").write_text("made by the run")
    event("os.mkdir", str(home / "ckpt"), 0o777, -1)
    (home / "ckpt").mkdir()
    event("open", str(home / "ckpt" / "a.bin"), "wb", os.O_WRONLY | os.O_CREAT)
    (home / "ckpt" / "a.bin").write_bytes(b"1")
    event("os.rename", str(old), str(home / "moved.txt"), -1, -1)
    old.rename(home / "moved.txt")
    event("open", str(metrics), "r", os.O_RDONLY)  # a read: nothing kept
    event("open", str(run / "result.json"), "w", os.O_WRONLY)  # tune's own folder: not the user's
    done = restore_user_files(run / "x.kept")
    assert metrics.read_text() == "step,loss\n0,2.3\n" and log.read_text() == "yesterday\n"
    assert old.read_text() == "keep me\n" and not (home / "moved.txt").exists()
    assert not (home / "new.txt").exists() and not (home / "ckpt").exists()
    assert done == [{"path": str(metrics), "action": "restored"}, {"path": str(log), "action": "restored"},
                    {"path": str(home / "new.txt"), "action": "removed"},
                    {"path": str(home / "ckpt"), "action": "removed"},
                    {"path": str(home / "ckpt" / "a.bin"), "action": "removed"},
                    {"path": str(old), "action": "restored"}, {"path": str(home / "moved.txt"), "action": "removed"}]
    assert restore_user_files(tmp_path / "never.kept") == []


def test_the_whole_job_is_projected_from_the_loop_the_probe_saw_and_every_figure_says_what_it_covers(tmp_path):
    from helpers.tune import report
    from helpers.tune.session import TuneResult, job_effect, job_text

    def proof(name, step_ms, start_s):
        return [Run(name, r, "steps", [step_ms / 1e3] * 20, [1.0] * 26, 9.0, "",
                    {"warmup_steps": 5, "first_step_s": start_s + 0.2 * r}) for r in range(2)]

    probe = _probe(loop_sites=[{"file": "/s/train.py", "line": 20, "batches": 250,
                                "epochs": {"expr": "args.epochs", "value": 4}}], steps_seen=26, batches_drawn=104)
    res = TuneResult("python train.py", tmp_path, probe, options=TuneOptions())
    res.proof = judge("rewritten", proof("original", 100, 3.0), proof("rewritten", 50, 6.0), QUIET)
    res.proof_runs = {"original": proof("original", 100, 3.0), "rewritten": proof("rewritten", 50, 6.0)}
    job = job_effect(res)
    assert job["steps"] == 250  # 250 batches x 4 epochs / 4 batches per step (gradient accumulation)
    assert job["how"] == "250 batches per epoch x 4 epochs (args.epochs) / 4 batches per optimizer step"
    res.probe = {**probe, "batches_drawn": 26, "loop_sites": [{**probe["loop_sites"][0], "batches": 1,
                                                                "epochs": {"expr": "epochs", "value": 1}}]}
    assert job_effect(res)["how"] == "1 batch per epoch x 1 epoch (epochs)"  # one batch a step: no "/ 1 batches"
    res.probe = probe
    assert job["original"]["startup_s"] == pytest.approx(3.1) and job["rewritten"]["startup_s"] == pytest.approx(6.1)
    assert job["original"]["projected_s"] == pytest.approx(3.1 + 249 * 0.1)
    assert job["speedup"] == pytest.approx((3.1 + 24.9) / (6.1 + 12.45))  # less than the 2x per step
    res.job = job
    res.judgements = [judge("num_workers=2", proof("u", 100, 3.0), proof("n", 50, 3.0), QUIET)]
    md = report.markdown(res)
    assert "| change | why it was tried | verdict | speedup per step (95% CI) |" in md
    assert "whole processes" not in md and "the figure is per optimizer step, over steps 6-25 of each run" in md
    assert "## The whole job" in md and "| whole run | projected, not measured: start-up + 250 optimizer steps" in md
    assert "| start-up | measured: from the process's start" in md
    assert job_text(job).startswith("the whole job, projected: 250 optimizer steps")
    probe["loop_sites"][0]["epochs"] = None  # no epochs in scope: start-up measured, no projection
    job = job_effect(res)
    assert job["steps"] is None and job["speedup"] is None and "no number of epochs" in job["how"]
    assert "only per-step figures" in job_text(job)


def test_an_early_stop_is_judged_against_its_own_rounds_unmodified_run_and_never_firmly_on_a_busy_machine():
    # the probe ran at 100 ms; then the load rose: round 1's unmodified run took 400 ms, and the change, stopped
    # early at 412 ms (over 2.5x the probe's), is as fast as it; later rounds of the unmodified run were quick again
    base = _runs("unmodified", [400, 100, 100])
    stopped = [Run("autocast", 0, "slow", [0.41, 0.412, 0.415], [1.0] * 8, 9.0, "", {"warmup_steps": 5})]
    j = judge("autocast", base, stopped, QUIET)
    assert j.verdict == "inconclusive" and "the unmodified run of round 1 took" in j.reason, j.reason
    far = [Run("autocast", 0, "slow", [2.0, 2.1, 2.05], [1.0] * 8, 9.0, "", {"warmup_steps": 5})]
    assert judge("autocast", base, far, QUIET).verdict == "slower"
    busy = judge("autocast", base, far, BUSY)
    assert busy.verdict == "inconclusive" and "busy" in busy.reason


def test_an_early_stop_compares_the_same_early_steps_of_the_unmodified_run():
    """Steps 2-4 of a run are warm-up: slower than the timed steps in both variants. A change stopped there is
    compared with the unmodified run's steps 2-4, not with its warmed-up median (a fresh user's Trainer script had
    a change dropped as 0.27x on steps its code had not yet run in)."""
    early = [1.0, 0.40, 0.42, 0.41, 0.2, 0.1, 0.1]  # first step, steps 2-4, then warmed up
    base = [Run("unmodified", 0, "steps", [0.1] * 20, [1.0] * 25, 9.0, "",
                {"warmup_steps": 5, "all_step_times_s": early + [0.1] * 18})]
    assert engine.early_steps(base[0]) == [0.40, 0.42, 0.41]
    stopped = [Run("no_grad", 0, "slow", [0.41, 0.43, 0.40], [1.0] * 5, 9.0, "", {"warmup_steps": 5})]
    j = judge("no_grad", base, stopped, QUIET)
    assert j.verdict == "inconclusive" and "took 410 ms over the same steps" in j.reason, j.reason
    far = [Run("no_grad", 0, "slow", [1.5, 1.6, 1.55], [1.0] * 5, 9.0, "", {"warmup_steps": 5})]
    assert judge("no_grad", base, far, QUIET).verdict == "slower"
    busy = judge("autocast", base, far, BUSY)
    assert busy.verdict == "inconclusive" and "busy" in busy.reason


def test_the_early_stop_limit_comes_from_the_same_rounds_unmodified_run(tmp_path, monkeypatch):
    limits = {}

    def fake_run_once(command, name, apply, **kw):
        limits[(name, kw["round_"])] = kw["give_up_step_s"]
        return Run(name, kw["round_"], "steps", [0.4] * 5, [1.0] * 6, 1.0, "", {})

    monkeypatch.setattr(engine, "run_once", fake_run_once)
    engine.measure(None, [("unmodified", {}, None), ("x", {"a": 1}, None)], rounds=2, workdir=tmp_path, warmup=1,
                   steps=5, timeout_s=10, give_up_step_s=0.25)
    assert limits[("unmodified", 0)] is None and limits[("x", 0)] == pytest.approx(engine.GIVE_UP_RATIO * 0.4)
    assert limits[("x", 1)] is None

    def with_warmup(command, name, apply, **kw):  # the run records its warm-up: steps 2-4 took 0.9 s
        limits[(name, kw["round_"])] = kw["give_up_step_s"]
        return Run(name, kw["round_"], "steps", [0.4] * 5, [1.0] * 6, 1.0, "",
                   {"all_step_times_s": [2.0, 0.9, 0.9, 0.9, 0.4, 0.4, 0.4]})

    monkeypatch.setattr(engine, "run_once", with_warmup)
    engine.measure(None, [("unmodified", {}, None), ("x", {"a": 1}, None)], rounds=2, workdir=tmp_path, warmup=1,
                   steps=5, timeout_s=10, give_up_step_s=0.25)
    assert limits[("x", 0)] == pytest.approx(engine.GIVE_UP_RATIO * 0.9)  # the same steps, not the timed ones


def test_a_change_whose_loss_turns_nan_is_not_run_again(tmp_path, monkeypatch):
    def fake_run_once(command, name, apply, **kw):
        loss = [1.0, 1.0, float("nan"), float("nan")] if name == "nan" else [1.0] * 4
        return Run(name, kw["round_"], "steps", [0.01] * 3, loss, 1.0, "", {"warmup_steps": 1})

    monkeypatch.setattr(engine, "run_once", fake_run_once)
    lines: list[str] = []
    variants = [("unmodified", {}, None), ("nan", {"x": 1}, None), ("good", {"y": 1}, None)]
    runs, _ = engine.measure(None, variants, rounds=3, workdir=tmp_path, warmup=1, steps=3, timeout_s=10,
                             progress=lines.append)
    assert len(runs["nan"]) == 1 and len(runs["good"]) == 3
    assert lines[1] == "[2/7] round 1: nan: 10.0 ms/step (its loss became nan at step 3; its 2 later runs skipped)"
    j = judge("nan", runs["unmodified"], runs["nan"], QUIET)
    assert j.verdict == "rejected" and "became nan at step 3" in j.reason


def test_a_run_whose_steps_stop_advancing_is_stalled_by_its_heartbeat(tmp_path):
    import json as _json
    import time as _time

    from helpers.tune.engine import STALL_FLOOR_S, stall_limit_s, stalled

    out = tmp_path / "x-r0.json"
    beat = out.with_name(out.name + ".progress")
    now = _time.time()
    assert stalled(out, 1, 0.5, None, now - 1000) == ""  # no heartbeat, no limit before the first step
    assert "made no optimizer step in 1000 s" in stalled(out, 1, 0.5, 100.0, now - 1000)
    beat.write_text(_json.dumps({"steps": 7, "wall": now - 40, "slowest": 0.2}))
    why = stalled(out, 1, 0.5, None, now)
    assert why.startswith("it made 7 optimizer steps, then none for 40 s: stopped as stalled") and "30 s" in why
    assert "(" not in why  # the progress line puts it in parentheses: one level
    assert stalled(out, 1, 5.0, None, now) == ""  # 10x a 5 s step: 50 s
    assert stalled(out, 1, None, None, now, floor_s=120.0) == ""  # the probe's floor: an evaluation is no hang
    assert stall_limit_s(0.1) == STALL_FLOOR_S and stall_limit_s(10.0) == 100.0
    out.write_text("{}")  # the run wrote its result: it is ending, not stalled
    assert stalled(out, 1, 0.5, None, now) == ""
    hung = Run("x", 1, "stalled", [], [], 41.0, "last words", {"progress": why})
    j = judge("x", _runs("u", [100, 100]), [hung], QUIET)
    assert j.verdict == "rejected" and "hung with this change (round 2): it made 7 optimizer steps" in j.reason


def test_a_module_is_run_as_a_module_and_the_command_line_pastes(tmp_path):
    from helpers.tune.session import interpreter_text

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "train.py").write_text("from . import util\n")
    cmd = parse_command(["python", "-m", "pkg.train", "--name", "my run"], cwd=tmp_path)
    assert (cmd.module, cmd.script, cmd.args) == ("pkg.train", tmp_path / "pkg" / "train.py", ("--name", "my run"))
    assert str(cmd) == f"{sys.executable} -m pkg.train --name 'my run'"
    script = tmp_path / "train.py"
    script.write_text("")
    assert str(parse_command(["python", "train.py", "a b"], cwd=tmp_path)) == f"{sys.executable} train.py 'a b'"
    run = parse_command(["torchrun", "--nproc-per-node", "2", "-m", "pkg.train"], cwd=tmp_path)
    assert run.module == "pkg.train" and run.script == tmp_path / "pkg" / "train.py"
    said = interpreter_text(cmd, {"python": {"version": "3.11.7", "torch": "2.13.0"}})
    assert said == (f"your `python` is {sys.executable} (Python 3.11.7, torch 2.13.0): the interpreter tune runs "
                    f"under, as in an activated environment")
    assert interpreter_text(parse_command(["/opt/py/bin/python3", str(script)])) == "with /opt/py/bin/python3"


def test_a_rewritten_script_that_fails_says_so_in_the_headline_with_its_error(tmp_path):
    from helpers.tune.session import TuneResult

    res = TuneResult("python train.py", tmp_path, _probe())
    res.winners = ["num_workers=2", "channels_last"]
    fail = "the script failed with this change (round 1): RuntimeError: worker 0 died"
    res.proof_failures = [f"channels_last, num_workers: {fail}"]
    # the fallback (the best change alone) then ran, and did not hold; no edit is left made
    res.proof = judge("rewritten", _runs("original", [100, 101]), _runs("rewritten", [100, 101]), QUIET)
    assert res.headline.startswith(f"The rewritten script was rejected when it ran as written (channels_last, "
                                   f"num_workers: {fail}); the best change alone then gave 1.00x")


def test_edits_skipped_for_one_reason_are_one_line_whatever_their_techniques(tmp_path):
    from helpers.tune.session import TuneResult

    res = TuneResult(command=None, out_dir=tmp_path, probe={})
    why = "the call is in data.py, line 8: tune edits only the script you gave"
    res.edits_skipped = [(Edit("loader", "f", 8, {"num_workers": 2}, "num_workers"), why),
                         (Edit("loader", "f", 8, {"pin_memory": True}, "pin_memory"), why)]
    assert res.not_written() == [f"num_workers, pin_memory: {why}"]


def test_tunes_folder_is_not_tensorboards_runs(tmp_path, monkeypatch):
    from helpers.tune import session
    from helpers.workbook import cli

    (tmp_path / "train.py").write_text("")
    seen = []

    def fake_tune(command, out, options, **kw):
        seen.append(out)
        raise engine.ScriptError("stop here")

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("WORKBOOK_RUNS_DIR", raising=False)
    monkeypatch.setattr(session, "tune", fake_tune)
    assert cli.main(["tune", "--", "python", "train.py"]) == 1
    assert seen[0].parent == tmp_path / "tune-runs"  # TensorBoard's SummaryWriter writes to ./runs


def test_bench_tune_runs_the_rewritten_example_against_the_original_as_whole_processes(tmp_path, monkeypatch):
    """``bench tune --example``: tune's session (faked here), then the rewritten script and the original, whole
    processes, interleaved; the target compares the ratio of their medians, with its interval."""
    import statistics

    from helpers.errors import ParameterError
    from helpers.tune import session
    from helpers.workbook import bench, paths

    script = tmp_path / "slow.py"
    script.write_text("import sys, time\ntime.sleep(0.4)\nopen(sys.argv[1], 'a').write('o')\n")
    fast = "import sys, time\ntime.sleep(0.05)\nopen(sys.argv[1], 'a').write('r')\n"
    log = tmp_path / "ran.txt"
    monkeypatch.setattr(paths, "examples_dir", lambda: tmp_path)
    monkeypatch.setitem(bench.TUNE_EXAMPLES, "tiny", (["slow.py", str(log)], 1.10))
    seen = []

    def fake_tune(command, out, options, **kw):
        seen.append(command)
        return session.TuneResult(command=str(command), out_dir=out, probe={}, rewritten=fast, diff="-slow\n+fast\n")

    monkeypatch.setattr(session, "tune", fake_tune)
    got = bench.tune_bench(example="tiny", rounds=2)
    assert seen[0].script == script and seen[0].args == (str(log),)
    assert log.read_text() == "oror"  # interleaved: original, rewritten, original, rewritten
    whole = got["whole_process"]
    assert len(whole["original_s"]) == len(whole["rewritten_s"]) == 2
    ratio = statistics.median(whole["original_s"]) / statistics.median(whole["rewritten_s"])  # no timing asserted
    assert whole["speedup"] == pytest.approx(ratio, rel=0.05) and whole["ci"][0] <= whole["ci"][1]
    assert got["targets"]["whole_process_speedup"]["rule"].startswith(">= 1.1")
    with pytest.raises(ParameterError, match="no example 'nope'"):
        bench.tune_bench(example="nope")
    with pytest.raises(ParameterError, match="at least 2"):
        bench.tune_bench(example="tiny", rounds=1)


def test_ctrl_c_in_tune_is_one_line_not_a_traceback(tmp_path, monkeypatch, capsys):
    from helpers.tune import session
    from helpers.workbook import cli

    (tmp_path / "train.py").write_text("")

    def interrupted(command, out, options, **kw):
        raise KeyboardInterrupt

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(session, "tune", interrupted)
    assert cli.main(["tune", "--out", str(tmp_path / "t"), "--", "python", "train.py"]) == 130
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1].startswith("interrupted: tune wrote no change") and "Traceback" not in err


def test_techniques_not_tried_for_one_reason_are_one_line():
    from helpers.tune.report import not_tried

    one = "a world of one: run tune with the job's ranks (torchrun --nproc-per-node N)"
    lines = not_tried([("no_sync", one), ("gradient_as_bucket_view", one), ("pin_memory", "the device is a CPU"),
                       ("bucket_cap_mb", one), ("no_sync", one)])
    assert lines == [f"no_sync, gradient_as_bucket_view, bucket_cap_mb (notebook 08): {one}",
                     "pin_memory (notebook 04): the device is a CPU"]


def test_terminal_lists_the_techniques_not_tried_with_their_reasons(tmp_path, monkeypatch, capsys):
    """The terminal summary, not only the report, says what tune left out and why, one line per reason."""
    from helpers.tune import session
    from helpers.workbook import cli

    (tmp_path / "train.py").write_text("")
    skipped = [("no_sync", "the model is not wrapped in DistributedDataParallel"),
               ("bucket_cap_mb", "the model is not wrapped in DistributedDataParallel"),
               ("channels_last", "the model has no Conv2d layer")]

    def fake_tune(command, out, options, **kw):
        return session.TuneResult(command=str(command), out_dir=out, probe={}, skipped=skipped)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(session, "tune", fake_tune)
    assert cli.main(["tune", "--out", str(tmp_path / "t"), "--", "python", "train.py"]) == 0
    lines = [x.strip() for x in capsys.readouterr().out.splitlines() if "not tried:" in x]
    assert lines == ["not tried: no_sync, bucket_cap_mb (notebook 08): the model is not wrapped in "
                     "DistributedDataParallel",
                     "not tried: channels_last (notebook 07): the model has no Conv2d layer"]


def test_a_call_grown_past_the_files_line_limit_is_wrapped_as_a_person_would():
    """Keywords added to a DataLoader(...) that then runs past the file's own longest line (at least PEP 8's 79)
    are written on an indented line of their own, or one per line where that line is long too; a call that still
    fits is left on its line, and the code still parses."""
    from helpers.tune.rewrite import Edit, apply_edits

    source = ("import torch\n\n\ndef main(data):\n"
              "    train = torch.utils.data.DataLoader(data, batch_size=64, shuffle=True)  # shuffled\n"
              "    val = DataLoader(data)\n")
    new, made, _ = apply_edits(source, [Edit("loader", "f", 5, {"num_workers": 2}, "num_workers"),
                                         Edit("loader", "f", 6, {"num_workers": 2}, "num_workers")])
    assert len(made) == 2
    compile(new, "train.py", "exec")
    assert ("    train = torch.utils.data.DataLoader(\n"
            "        data, batch_size=64, shuffle=True, num_workers=2\n"
            "    )  # shuffled\n") in new
    assert "    val = DataLoader(data, num_workers=2)\n" in new  # fits: one line
    # too long for one indented line too: one argument per line, with a trailing comma
    wide = {"num_workers": 2, "persistent_workers": True, "prefetch_factor": 4}
    new, _, _ = apply_edits(source, [Edit("loader", "f", 5, wide, "num_workers")])
    compile(new, "train.py", "exec")
    assert ("    train = torch.utils.data.DataLoader(\n        data,\n        batch_size=64,\n        shuffle=True,\n"
            "        num_workers=2,\n        persistent_workers=True,\n        prefetch_factor=4,\n    )  # shuffled\n"
            ) in new
    assert max(len(ln) for ln in new.splitlines()) <= 85  # the file's longest line
    # the file's own lines are longer: its own limit, nothing wrapped
    long_file = source + "# " + "x" * 200 + "\n"
    new, _, _ = apply_edits(long_file, [Edit("loader", "f", 5, wide, "num_workers")])
    assert "DataLoader(data, batch_size=64, shuffle=True, num_workers=2, persistent_workers=True, " \
           "prefetch_factor=4)  # shuffled" in new


def test_sigterm_in_tune_stops_it_as_ctrl_c_does(tmp_path, monkeypatch, capsys):
    """``kill`` (SIGTERM) stops a session the way Ctrl-C does: the run in flight is ended by the engine's own
    clean-up (its process group killed, the user's files put back), one line, exit 130; it left a torchrun job
    orphaned, writing into the run folder."""
    import os
    import signal
    import time

    from helpers.tune import session
    from helpers.workbook import cli

    (tmp_path / "train.py").write_text("")
    cleaned = []

    def running(command, out, options, **kw):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises before this ends
        finally:
            cleaned.append(True)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(session, "tune", running)
    before = signal.getsignal(signal.SIGTERM)
    assert cli.main(["tune", "--out", str(tmp_path / "t"), "--", "python", "train.py"]) == 130
    assert cleaned == [True] and signal.getsignal(signal.SIGTERM) == before
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("interrupted: tune wrote no change")


def test_a_run_that_stops_beside_a_stopped_unmodified_run_is_not_blamed_on_its_change():
    """In a quiet tune session the proof's rewritten run and the unmodified run of the same round both stopped at
    steps 23-24 as stalled; the verdict blamed the change ("the script hung with this change")."""
    base = _runs("original", [100, 100, 100])
    base[0] = Run("original", 0, "stalled", [], [], 40.0, "no output", {})
    runs = _runs("rewritten", [90, 90, 90])
    runs[0] = Run("rewritten", 0, "stalled", [], [], 40.0, "no output", {"progress": "it made 24 optimizer steps"})
    j = judge("rewritten", base, runs, QUIET)
    assert j.verdict == "inconclusive" and "so did the unmodified run of that round (stalled)" in j.reason
    base[0] = _runs("original", [100])[0]  # the unmodified run of that round went through: the change is blamed
    assert judge("rewritten", base, runs, QUIET).verdict == "rejected"


def test_an_interval_on_one_side_of_1_is_never_written_touching_it():
    """A new user's report: "slower, 0.98x (95% CI 0.97-1.00)" read as an interval that reaches 1."""
    from helpers.tune.engine import Judgement

    assert Judgement("c", "slower", 0.98, 0.971, 0.9972).figure == "0.98x (95% CI 0.971-0.997)"
    assert Judgement("c", "faster", 1.08, 1.0031, 1.16).figure == "1.08x (95% CI 1.003-1.160)"
    assert Judgement("c", "no gain", 1.01, 0.996, 1.02).figure == "1.01x (95% CI 1.00-1.02)"  # it spans 1
    assert Judgement("c", "inconclusive", 1.02, 1.0003, 1.035).figure == "1.02x (95% CI 1.0003-1.0350)"
