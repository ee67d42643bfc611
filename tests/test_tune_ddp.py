"""tune's DistributedDataParallel candidates (notebook 08): ``no_sync`` over gradient accumulation,
``gradient_as_bucket_view``, ``bucket_cap_mb``, a compression hook and ``static_graph``: found by the probe, applied
at runtime, written with libcst at the captured lines."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers.tune import candidates
from helpers.tune.candidates import bucket_layout, ddp_candidates, ddp_edits, merge_apply
from helpers.tune.rewrite import Edit, apply_edits, unified_diff

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "ddp_accumulation.py"


def _ddp(**over):
    """A probe's ``ddp`` entry: a DDP model of 8 parameters on 2 ranks, 4 backward() calls per step."""
    d = {"wrapped": True, "world": 2, "backend": "gloo", "given": {}, "params": 8, "grad_bytes": 2_254_888,
         "param_bytes": [40, 20480, 2048, 1048576, 2048, 1048576, 2048, 131072], "bf16_comm_hook": False,
         "comm_hooks": 0, "backwards_per_step": [4] * 10, "script": "/p/train.py",
         "names": [{"file": "/p/train.py", "line": 20, "name": "model"}], "grad_steps": 10, "params_with_grad": 8,
         "same_params_every_step": True}
    d.update(over)
    return d


def _probe(**ddp):
    return {"ddp": _ddp(**ddp), "backward_sites": [{"file": "/p/train.py", "line": 20, "count": 40}],
            "step_sites": [{"file": "/p/train.py", "line": 22, "count": 10}],
            "forward_sites": [{"file": "/p/train.py", "line": 19, "count": 40}],
            "ddp_sites": [{"file": "/p/train.py", "line": 12, "function": "main"}]}


def test_the_ddp_candidates_follow_what_the_probe_saw():
    out, skipped = ddp_candidates(_probe())
    names = {c.name: c for c in out}
    assert names["no_sync, 4 micro-steps"].apply == {"no_sync": 4}
    assert names["gradient_as_bucket_view=True"].apply == {"ddp": {"gradient_as_bucket_view": True}}
    assert names["fp16_compress_hook"].apply == {"comm_hook": "fp16"}  # gloo: DDP refuses bf16_compress_hook
    assert {n for n in names if n.startswith("bucket_cap_mb=")} == {"bucket_cap_mb=5"}  # 100 MiB: the same as 5
    why = dict(skipped)
    assert "static_graph" not in names and "no_sync()" in why["static_graph"]  # accumulation: fails with no_sync
    assert all(candidates.NOTEBOOK[c.technique] == "08" for c in out)

    # where DDP accepts bf16 (CUDA with NCCL 2.10+), bf16; a hook of the script's own: none
    assert "bf16_compress_hook" in {c.name for c in ddp_candidates(_probe(bf16_comm_hook=True))[0]}
    assert "comm_hook" in dict(ddp_candidates(_probe(comm_hooks=1))[1])
    # one backward per step and the same parameters every step: static_graph, no no_sync
    out, skipped = ddp_candidates(_probe(backwards_per_step=[1] * 10))
    assert "static_graph=True" in {c.name for c in out} and "once per optimizer step" in dict(skipped)["no_sync"]
    out, skipped = ddp_candidates(_probe(backwards_per_step=[1] * 10, same_params_every_step=False))
    assert "changed between" in dict(skipped)["static_graph"]
    # what the call sets already is left as it is
    given = {"gradient_as_bucket_view": True, "bucket_cap_mb": 50, "static_graph": True}
    out, skipped = ddp_candidates(_probe(given=given, backwards_per_step=[1] * 10))
    assert {c.technique for c in out} == {"comm_hook"}
    assert "bucket_cap_mb=50" in dict(skipped)["bucket_cap_mb"]


@pytest.mark.parametrize("over, reason", [
    ({"wrapped": False}, "not wrapped in DistributedDataParallel"),
    ({"world": 1}, "one rank"),
    ({"backwards_per_step": [4, 4, 3, 4]}, "varying number of times per optimizer step (4, 4, 3, 4)"),
    ({"no_sync_in_use": True}, "already enters model.no_sync()"),
    ({"script": "/p/other.py"}, "backward() is called in /p/train.py, line 20, not in the script you gave"),
    ({"names": []}, "no variable where backward() is called holds the DDP model"),
])
def test_no_sync_is_refused_with_its_reason(over, reason):
    out, skipped = ddp_candidates(_probe(**over))
    assert "no_sync" not in {c.technique for c in out}
    assert reason in dict(skipped)["no_sync"], skipped


@pytest.mark.parametrize("over, reason", [
    ({"backward_sites": [{"file": "/p/train.py", "line": 20, "count": 20}, {"file": "/p/train.py", "line": 30,
                                                                            "count": 20}]},
     "backward() is called on 2 lines (20, 30)"),
    ({"other_optimizers": [{"file": "/p/train.py", "line": 9, "class": "Adam", "model_names": ["disc"]}]},
     "more than one optimizer"),
])
def test_no_sync_is_refused_where_the_backward_calls_are_not_one_loss_over_micro_steps(over, reason):
    out, skipped = ddp_candidates({**_probe(), **over})  # a GAN's two losses: two backward() calls, not micro-steps
    assert "no_sync" not in {c.technique for c in out}
    assert reason in dict(skipped)["no_sync"], skipped


def test_a_script_without_ddp_or_accumulation_hears_nothing_of_ddp():
    assert ddp_candidates({"ddp": _ddp(wrapped=False, backwards_per_step=[1] * 5)}) == ([], [])
    assert ddp_candidates({}) == ([], [])


def test_the_bucket_layouts_follow_ddps_greedy_assignment():
    mib = 2**20
    sizes = [mib // 2] * 8  # 4 MiB of gradients
    assert bucket_layout(sizes, None) == (mib, 3 * mib)  # the first bucket closes at 1 MiB, the rest at 25
    assert bucket_layout(sizes, 1) == (mib,) * 4
    assert bucket_layout(sizes, 5) == bucket_layout(sizes, 100) == (4 * mib,)
    assert bucket_layout([], 5) == ()


def test_ddp_winners_merge_into_one_call_and_are_planned_at_the_captured_lines():
    winners = [candidates.Candidate("gradient_as_bucket_view=True", "gradient_as_bucket_view",
                                    {"ddp": {"gradient_as_bucket_view": True}}),
               candidates.Candidate("bucket_cap_mb=5", "bucket_cap_mb", {"ddp": {"bucket_cap_mb": 5}}),
               candidates.Candidate("fp16_compress_hook", "comm_hook", {"comm_hook": "fp16"}),
               candidates.Candidate("no_sync, 4 micro-steps", "no_sync", {"no_sync": 4})]
    merged = merge_apply(winners)
    assert merged["ddp"] == {"gradient_as_bucket_view": True, "bucket_cap_mb": 5}
    edits = {e.kind: e for e in ddp_edits(_probe(), merged)}
    assert (edits["ddp_keywords"].line, edits["ddp_keywords"].technique) == (12, "gradient_as_bucket_view + "
                                                                                 "bucket_cap_mb")
    assert edits["comm_hook"].params == {"dtype": "fp16"}
    assert edits["no_sync"].line == 20 and edits["no_sync"].params == {"name": "model", "accum": 4, "step": 22,
                                                                        "forward": [19]}


LOOP = textwrap.dedent('''\
    """A docstring."""

    import argparse
    import os

    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP


    def main(args, loader, net, opt):
        model = DDP(net)
        for i, (x, y) in enumerate(loader):
            x = x.float()  # the batch
            loss = nn.functional.cross_entropy(model(x), y) / args.accum
            loss.backward()
            if {cond}:
                opt.step()
                opt.zero_grad()
    ''')


def _no_sync(src: str, shift: int = 0, **params) -> tuple[str, list, list]:
    """The ``no_sync`` edit of :data:`LOOP`'s lines, moved by ``shift`` lines."""
    p = {"name": "model", "accum": 4, "step": 18 + shift, "forward": [15 + shift], **params}
    return apply_edits(src, [Edit("no_sync", "t.py", 16 + shift, p, "no_sync")])


@pytest.mark.parametrize("cond, written", [
    ("(i + 1) % args.accum == 0", "(i + 1) % args.accum != 0"),
    ("i % args.accum != args.accum - 1", "i % args.accum == args.accum - 1"),
    ("not last_micro_step(i)", "last_micro_step(i)"),
    ("(i + 1) % args.accum == 0 or i + 1 == len(loader)", "not ((i + 1) % args.accum == 0 or i + 1 == len(loader))"),
])
def test_no_sync_wraps_the_micro_steps_in_the_loops_own_condition(cond, written):
    src = LOOP.replace("{cond}", cond)
    new, made, skipped = _no_sync(src)
    assert not skipped and [e.kind for e in made] == ["no_sync"]
    assert (f"    for i, (x, y) in enumerate(loader):\n"
            f"        x = x.float()  # the batch\n"
            f"        with model.no_sync() if {written} else contextlib.nullcontext():\n"
            f"            loss = nn.functional.cross_entropy(model(x), y) / args.accum\n"
            f"            loss.backward()\n"
            f"        if {cond}:\n"
            f"            opt.step()\n") in new
    # import contextlib joins the standard library's imports, in isort's order
    assert '"""A docstring."""\n\nimport argparse\nimport contextlib\nimport os\n\nimport torch\n' in new
    compile(new, "t.py", "exec")


def test_import_contextlib_goes_where_isort_puts_it():
    cond = "(i + 1) % args.accum == 0"
    src = LOOP.replace("{cond}", cond)
    alone = src.replace("import argparse\nimport os\n\n", "")  # no standard-library import: its own group
    assert '"""A docstring."""\n\nimport contextlib\n\nimport torch\n' in _no_sync(alone, -3)[0]
    first = src.replace("import argparse\nimport os\n", "import os\nimport sys\n")
    assert '"""A docstring."""\n\nimport contextlib\nimport os\nimport sys\n\nimport torch\n' in _no_sync(first)[0]
    last = src.replace("import argparse\nimport os\n", "import abc\nfrom os import path\n")  # before from-imports
    assert "import abc\nimport contextlib\nfrom os import path\n\nimport torch\n" in _no_sync(last)[0]
    there = src.replace("import os\n", "import contextlib\nimport os\n")
    new = _no_sync(there, 1)[0]
    assert new.count("import contextlib") == 1 and "contextlib.nullcontext()" in new


def test_no_sync_is_not_written_where_the_script_has_no_condition_to_use():
    src = LOOP.replace("{cond}", "(i + 1) % args.accum == 0")
    # the step is not under an if beside backward()
    plain = src.replace("        if (i + 1) % args.accum == 0:\n            opt.step()\n            opt.zero_grad()\n",
                        "        opt.step()\n")
    new, made, skipped = _no_sync(plain, step=17)
    assert not made and new == plain and "is not under an if statement" in skipped[0][1]
    # no name for the model at backward(), or the forward outside the loop body
    assert "holds the DDP model" in _no_sync(src, name=None)[2][0][1]
    assert "forward call is not in the same loop body" in _no_sync(src, forward=[12])[2][0][1]


def test_the_other_edits_follow_the_lines_no_sync_moved():
    src = LOOP.replace("{cond}", "(i + 1) % args.accum == 0")
    edits = [Edit("no_sync", "t.py", 16, {"name": "model", "accum": 4, "step": 18, "forward": [15]}, "no_sync"),
             Edit("autocast", "t.py", 15, {"device_type": "cpu", "dtype": "bfloat16"}, "autocast"),
             Edit("loader", "t.py", 13, {"num_workers": 2}, "num_workers")]  # no DataLoader there: skipped
    new, made, skipped = apply_edits(src, edits)
    assert [e.kind for e in made] == ["no_sync", "autocast"]
    assert ("        with model.no_sync() if (i + 1) % args.accum != 0 else contextlib.nullcontext():\n"
            '            with torch.autocast(device_type="cpu", dtype=torch.bfloat16):\n'
            "                loss = nn.functional.cross_entropy(model(x), y) / args.accum\n"
            "            loss.backward()\n") in new
    assert [e.kind for e, _ in skipped] == ["loader"]


def test_ddp_keywords_and_the_compression_hook_go_into_the_ddp_call_however_it_is_imported():
    src = textwrap.dedent('''\
        import torch
        import torch.nn as nn
        from torch.utils.data import DataLoader

        net = nn.Linear(2, 2)
        model = torch.nn.parallel.DistributedDataParallel(net, device_ids=None)
        other = Wrapper(net)
        spread = torch.nn.parallel.DistributedDataParallel(net, **opts)
        ''')
    edits = [Edit("ddp_keywords", "t.py", 6, {"values": {"bucket_cap_mb": 5, "static_graph": True}}, "x"),
             Edit("comm_hook", "t.py", 6, {"dtype": "bf16"}, "comm_hook")]
    new, made, skipped = apply_edits(src, edits)
    assert not skipped, skipped
    assert ("import torch.nn as nn\n"
            "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks\n"
            "from torch.utils.data import DataLoader\n") in new  # among the from-torch imports, sorted
    assert ("model = torch.nn.parallel.DistributedDataParallel(net, device_ids=None, bucket_cap_mb=5, "
            "static_graph=True)\nmodel.register_comm_hook(None, default_hooks.bf16_compress_hook)\n") in new
    # a call that is not DDP's, or that passes **kwargs, is not guessed at
    _, made, skipped = apply_edits(src, [Edit("ddp_keywords", "t.py", 7, {"values": {"static_graph": True}}, "x"),
                                         Edit("ddp_keywords", "t.py", 8, {"values": {"static_graph": True}}, "x"),
                                         Edit("comm_hook", "t.py", 7, {"dtype": "fp16"}, "comm_hook")])
    assert not made and len(skipped) == 3
    assert "**kwargs" in skipped[1][1] and "no DistributedDataParallel(...) call" in skipped[0][1]


def _expected_diff() -> str:
    text = (ROOT / "examples" / "ddp_accumulation.expected.diff").read_text()
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith("#"))


def test_the_examples_expected_diff_is_what_tune_writes_for_it():
    # the lines the probe captures (the slow test below runs the probe): found here by their text
    text = EXAMPLE.read_text()
    at = {key: next(n for n, line in enumerate(text.splitlines(), 1) if key in line)
          for key in ("loss.backward()", "optimizer.step()", "criterion(model(x), y)", "model = DDP(")}
    site = {"file": str(EXAMPLE), "count": 4}
    probe = {"ddp": _ddp(script=str(EXAMPLE), names=[{"file": str(EXAMPLE), "line": at["loss.backward()"],
                                                      "name": "model"}]),
             "backward_sites": [{**site, "line": at["loss.backward()"]}],
             "step_sites": [{**site, "line": at["optimizer.step()"]}],
             "forward_sites": [{**site, "line": at["criterion(model(x), y)"]}],
             "ddp_sites": [{"file": str(EXAMPLE), "line": at["model = DDP("]}]}
    chosen = [c for c in ddp_candidates(probe)[0] if c.technique == "no_sync"]
    new, made, skipped = apply_edits(text, ddp_edits(probe, merge_apply(chosen)))
    assert [e.kind for e in made] == ["no_sync"] and not skipped
    assert unified_diff(text, new, "ddp_accumulation.py") == _expected_diff()


@pytest.mark.slow
@pytest.mark.subprocess
def test_no_sync_is_found_applied_at_runtime_and_written_as_the_examples_expected_diff(tmp_path):
    from helpers.tune.engine import parse_command, run_once
    from helpers.tune.session import plan_edits

    before = EXAMPLE.read_bytes()
    command = parse_command(["torchrun", "--nproc-per-node", "2", str(EXAMPLE), "--out", str(tmp_path / "ck.pt")],
                            cwd=tmp_path)
    kw = dict(workdir=tmp_path / "w", warmup=2, steps=6, timeout_s=180)
    probe = run_once(command, "probe", {}, round_=-1, **kw)
    assert probe.ok, probe.error[-2000:]
    ddp = probe.result["ddp"]
    assert ddp["wrapped"] and ddp["world"] == 2 and set(ddp["backwards_per_step"]) == {4}
    assert ddp["names"] == [{"file": str(EXAMPLE), "line": 58, "name": "model"}]
    out, _ = candidates.choose(probe.result, cores=1)
    chosen = {c.technique: c for c in out}
    assert chosen["no_sync"].apply == {"no_sync": 4}

    # at runtime, with the DDP call's keywords: the same losses as the unmodified job (the synchronised sum is the
    # same sum; the buckets change where it is taken, not what)
    keywords = merge_apply([c for c in out if c.technique in ("no_sync", "gradient_as_bucket_view",
                                                              "bucket_cap_mb")])
    assert keywords["ddp"] and keywords["no_sync"] == 4
    applied = run_once(command, "no_sync", keywords, **kw)
    assert applied.ok, applied.error[-2000:]
    assert applied.losses == pytest.approx(probe.losses, rel=1e-4)
    # a job whose steps take fewer micro-steps than no_sync was applied for fails, rather than step unsynchronised
    wrong = run_once(command, "wrong", {"no_sync": 8}, **kw)
    assert not wrong.ok and "its last micro-step was not synchronised" in wrong.error

    # written at the captured lines: the example's expected diff, which runs as written
    new, made, skipped = apply_edits(EXAMPLE.read_text(), plan_edits(probe.result, [chosen["no_sync"]], EXAMPLE))
    assert [e.kind for e in made] == ["no_sync"] and not skipped
    assert unified_diff(EXAMPLE.read_text(), new, "ddp_accumulation.py") == _expected_diff()
    (tmp_path / "rewritten.py").write_text(new)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "rewritten.py", "--out", str(tmp_path / "r.pt"), "--width", "64"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "r.pt").is_file() and EXAMPLE.read_bytes() == before


ONE_RANK = textwrap.dedent('''\
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(30):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(step))
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    ''')


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_ddp_calls_changes_run_and_a_world_of_one_is_told_to_run_with_its_ranks(tmp_path):
    from helpers.tune.engine import parse_command, run_once

    (tmp_path / "train.py").write_text(ONE_RANK)
    command = parse_command(["python", "train.py"], cwd=tmp_path)
    kw = dict(workdir=tmp_path / "w", warmup=2, steps=6, timeout_s=120)
    probe = run_once(command, "probe", {}, round_=-1, **kw)
    assert probe.ok, probe.error[-2000:]
    ddp = probe.result["ddp"]
    assert ddp["world"] == 1 and ddp["same_params_every_step"] and ddp["params_with_grad"] == 4
    assert ddp["backwards_per_step"] == [1] * len(ddp["backwards_per_step"])
    out, skipped = candidates.choose(probe.result, cores=1)
    assert not {c.technique for c in out} & {"no_sync", "comm_hook", "static_graph"}
    assert "one rank" in dict(skipped)["static_graph"]
    # the changes a job of several ranks gets, applied at once: they run, and fp16 compression keeps the results
    every = {"ddp": {"gradient_as_bucket_view": True, "bucket_cap_mb": 5, "static_graph": True}, "comm_hook": "fp16"}
    run = run_once(command, "every", every, **kw)
    assert run.ok, run.error[-2000:]
    assert run.result["ddp"]["comm_hook_applied"] == "fp16_compress_hook"
    assert run.result["ddp"]["comm_hooks"] == 0 and run.result["applied"] == every  # the script registered none
    assert run.losses == pytest.approx(probe.losses, rel=1e-2)
    # a hook the script registers itself is its own: no compression hook is tried on top of it
    (tmp_path / "train.py").write_text(ONE_RANK.replace("opt = ", "model.register_comm_hook(None, default_hooks."
                                                        "allreduce_hook)\nopt = ").replace(
        "from torch import nn\n", "from torch import nn\nfrom torch.distributed.algorithms.ddp_comm_hooks import "
                                  "default_hooks\n"))
    own = run_once(command, "own", {}, **kw)
    assert own.ok and own.result["ddp"]["comm_hooks"] == 1, own.error[-2000:]


def test_find_unused_parameters_is_turned_off_only_where_every_parameter_gets_a_gradient():
    """A DDP call passing find_unused_parameters=True walks the autograd graph after every forward; where every
    parameter received a gradient in every watched step, False is tried; where one did not, DDP needs it."""
    out, _ = ddp_candidates(_probe(given={"find_unused_parameters": True}))
    c = {c.name: c for c in out}["find_unused_parameters=False"]
    assert c.apply == {"ddp": {"find_unused_parameters": False}} and "all 8 parameters" in c.why
    assert candidates.NOTEBOOK[c.technique] == "08"
    out, skipped = ddp_candidates(_probe(given={"find_unused_parameters": True}, params_with_grad=7))
    assert "find_unused_parameters" not in {c.technique for c in out}
    assert "7 of its 8 parameters received a gradient" in dict(skipped)["find_unused_parameters"]
    out, skipped = ddp_candidates(_probe(given={"find_unused_parameters": True}, same_params_every_step=False))
    assert "not the same ones each step" in dict(skipped)["find_unused_parameters"]
    # the default (False), or not passed: nothing to say
    for given in ({}, {"find_unused_parameters": False}):
        out, skipped = ddp_candidates(_probe(given=given))
        assert "find_unused_parameters" not in {c.technique for c in out} | set(dict(skipped))
    # written into the DDP call, replacing the script's True
    source = "import torch\nmodel = torch.nn.parallel.DistributedDataParallel(net, find_unused_parameters=True)\n"
    edits = candidates.ddp_edits(_probe(given={"find_unused_parameters": True}) | {
        "ddp_sites": [{"file": "/p/train.py", "line": 2, "function": "<module>"}]},
        {"ddp": {"find_unused_parameters": False}})
    new, made, skipped = apply_edits(source, edits)
    assert not skipped and "DistributedDataParallel(net, find_unused_parameters=False)" in new
