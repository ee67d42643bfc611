"""tune's general candidates (the PyTorch Performance Tuning Guide's first section): debugging APIs left on, forward
passes whose outputs never reach backward(), zero_grad(set_to_none=False), the optimizer's implementation; and what
tune reports without changing it."""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

import pytest

from helpers.tune import candidates
from helpers.tune.engine import parse_command, run_once
from helpers.tune.rewrite import Edit, apply_edits, unified_diff
from helpers.tune.session import plan_edits

ROOT = Path(__file__).resolve().parents[1]

DEBUGGED = textwrap.dedent('''\
    import torch
    from torch.autograd import gradcheck


    def main(model, loader, val_loader, opt):
        # hunting a NaN
        torch.autograd.set_detect_anomaly(True)  # remove me
        for epoch in range(3):
            for x, y in loader:
                with torch.autograd.detect_anomaly():
                    out = model(x)
                    loss = (out - y).pow(2).mean()
                assert gradcheck(torch.sin, (x.double().requires_grad_(),))
                opt.zero_grad(set_to_none=False)
                loss.backward()
                opt.step()
            total = 0.0
            for x, y in val_loader:
                total += (model(x) - y).pow(2).mean().item()
            print(epoch, total)
    ''')


def test_debugging_apis_are_removed_or_unwrapped_and_a_validation_loop_runs_under_no_grad():
    edits = [Edit("debug_off", "f", 7, {"api": "set_detect_anomaly"}, "debug_apis"),
             Edit("debug_off", "f", 10, {"api": "detect_anomaly"}, "debug_apis"),
             Edit("debug_off", "f", 13, {"api": "gradcheck"}, "debug_apis"),
             Edit("no_grad", "f", 19, {}, "no_grad"),
             Edit("call_keywords", "f", 14, {"call": "zero_grad", "values": {"set_to_none": True}}, "set_to_none")]
    new, made, skipped = apply_edits(DEBUGGED, edits)
    assert not skipped and len(made) == 5
    compile(new, "train.py", "exec")
    assert "set_detect_anomaly" not in new and "detect_anomaly" not in new and "assert gradcheck" not in new
    # the comment above the removed line stays; the one on its own line goes with it
    assert "    # hunting a NaN\n    for epoch in range(3):" in new and "remove me" not in new
    # the with is unwrapped: its body now sits in the loop
    assert "        for x, y in loader:\n            out = model(x)\n            loss = (out - y)" in new
    # the validation loop, not the epoch loop (it trains) nor the statement alone, is wrapped
    assert ("        with torch.no_grad():\n            for x, y in val_loader:\n"
            "                total += (model(x) - y).pow(2).mean().item()\n        print(epoch, total)") in new
    assert "opt.zero_grad(set_to_none=True)" in new


def test_a_debugging_api_that_cannot_be_removed_is_skipped_with_its_reason():
    src = textwrap.dedent('''\
        import torch
        torch.autograd.set_detect_anomaly(args.debug)
        ok = torch.autograd.gradcheck(f, inputs)
        for step in range(3):
            with torch.autograd.detect_anomaly() as d:
                pass
        ''')
    edits = [Edit("debug_off", "f", 2, {"api": "set_detect_anomaly"}), Edit("debug_off", "f", 3, {"api": "gradcheck"}),
             Edit("debug_off", "f", 5, {"api": "detect_anomaly"})]
    new, made, skipped = apply_edits(src, edits)
    assert new == src and not made
    why = [r for _, r in skipped]
    assert why[0].startswith("its mode is not the literal True") and why[0].endswith("(line 2)")
    assert "the result of gradcheck(...) is used" in why[1]
    assert why[2] == "the with statement binds its context manager (as ...): remove it by hand (line 5)"


def test_a_with_of_several_items_loses_only_the_anomaly_item_and_a_lone_statement_leaves_pass():
    src = textwrap.dedent('''\
        import torch
        with torch.autograd.detect_anomaly(), open("log") as f:
            f.write("x")
        if debug:
            torch.autograd.set_detect_anomaly(True)
        ''')
    new, made, _ = apply_edits(src, [Edit("debug_off", "f", 2, {"api": "detect_anomaly"}),
                                     Edit("debug_off", "f", 5, {"api": "set_detect_anomaly"})])
    assert len(made) == 2
    assert 'with open("log") as f:\n    f.write("x")' in new and "if debug:\n    pass\n" in new


def test_no_grad_wraps_the_statement_where_no_loop_is_free_of_training_and_stays_inside_its_function():
    src = textwrap.dedent('''\
        import torch
        for x, y in loader:
            def score(x):
                return model(x).sum()
            loss = model(x).sum()
            loss.backward()
            print(score(x))
            for v in val:
                if model(v).argmax():
                    pass
        ''')
    new, made, skipped = apply_edits(src, [Edit("no_grad", "f", 4), Edit("no_grad", "f", 9)])
    # inside score(): the loop around the def is not the function's own, so the return statement is wrapped
    assert "    def score(x):\n        with torch.no_grad():\n            return model(x).sum()" in new
    assert len(made) == 1 and "compound statement's header" in skipped[0][1]


def _general_probe(**over):
    gen = {"debug_sites": [{"api": "set_detect_anomaly", "file": "/s/t.py", "line": 7, "count": 1},
                           {"api": "torch.profiler.profile", "file": "/s/t.py", "line": 9, "count": 26}],
           "zero_grad_sites": [{"api": "zero_grad", "file": "/s/t.py", "line": 14, "count": 26}],
           "unreached_forwards": [{"file": "/s/t.py", "line": 19, "calls": 10}],
           "optimizer_impl": {"class": "Adam", "torch_class": "Adam", "device": "cpu", "foreach": None, "fused": None,
                              "fused_supported": True, "foreach_default": False, "foreach_supported": False},
           "reported": [{"kind": "pil_decode", "file": "/s/t.py", "line": 30, "text": "Photos.__getitem__ decodes one "
                                                                                      "image at a time with PIL"},
                        {"kind": "conv_bias_before_norm", "text": "body.0 (Conv2d, bias=True) feeds body.1"}]}
    gen.update(over)
    return {"general": gen, "backward_sites": [{"file": "/s/t.py", "line": 15, "count": 26}],
            "optimizer": {"file": "/s/t.py", "line": 5, "class": "Adam", "model_names": ["model"]},
            "model": {"param_device": "cpu", "param_dtype": "float32", "has_conv2d": False}, "loaders": []}


def test_the_general_candidates_follow_what_the_probe_saw_and_their_edits_go_to_its_sites(tmp_path):
    chosen, skipped = candidates.choose(_general_probe(), cores=2)
    general = [c for c in chosen if c.technique in candidates.GENERAL]
    assert [(c.name, c.apply) for c in general] == [
        ("debug APIs off", {"debug_off": True}),
        ("no_grad where no gradient is used", {"no_grad": [["/s/t.py", 19]]}),
        ("zero_grad(set_to_none=True)", {"set_to_none": True}),
        ("fused=True", {"optimizer_impl": {"fused": True}})]
    assert "set_detect_anomaly ran in the training process (line 7)" == general[0].why
    edits = plan_edits(_general_probe(), general, Path("/s/t.py"))
    assert [(e.kind, e.line, e.technique) for e in edits] == [
        ("debug_off", 7, "debug_apis"), ("no_grad", 19, "no_grad"), ("call_keywords", 14, "set_to_none"),
        ("call_keywords", 5, "optimizer_impl")]
    assert edits[3].params == {"call": "Adam", "values": {"fused": True}}
    # the optimizer sets its implementation already; or torch has none faster for it on the device
    set_already = _general_probe(optimizer_impl={**_general_probe()["general"]["optimizer_impl"], "foreach": False})
    assert "already sets foreach=False" in dict(candidates.choose(set_already, cores=2)[1])["optimizer_impl"]
    rms = _general_probe(optimizer_impl={"class": "RMSprop", "device": "cpu", "foreach": None, "fused": None,
                                         "fused_supported": False, "foreach_supported": False})
    assert "no foreach kernels" in dict(candidates.choose(rms, cores=2)[1])["optimizer_impl"]
    # a framework builds the optimizer (transformers' Trainer): its own setting owns it, no keyword in the script
    framework = _general_probe(optimizer_impl={**_general_probe()["general"]["optimizer_impl"],
                                               "built_by": "transformers.trainer"})
    chosen_fw, skipped_fw = candidates.choose(framework, cores=2)
    assert "optimizer_impl" not in {c.technique for c in chosen_fw}
    assert "built by transformers.trainer" in dict(skipped_fw)["optimizer_impl"]
    # a script that never calls backward() has nothing to compare an unused graph with
    no_backward = {**_general_probe(), "backward_sites": []}
    assert "no_grad" not in {c.technique for c in candidates.choose(no_backward, cores=2)[0]}
    # an older probe without the general record: nothing new
    assert candidates.general_candidates({}) == ([], [])


def test_what_tune_does_not_change_is_reported_with_its_line():
    dp = {"kind": "data_parallel", "file": "/s/t.py", "line": 12}
    on_gpu = {**_general_probe(reported=[dp]), "model": {"param_device": "cuda"}}
    more = candidates.reported_only(on_gpu)
    assert more[-1].startswith("torch.nn.DataParallel wraps a model (t.py, line 12): one process drives every GPU")
    assert "Notebook 08" in more[-1]
    on_cpu = candidates.reported_only(_general_probe(reported=[dp]))  # no GPU: it runs the model as it is
    assert "on the CPU it has no GPU to spread the batch over" in on_cpu[-1] and "notebook 08" in on_cpu[-1]
    lines = candidates.reported_only(_general_probe())
    assert len(lines) == 3
    assert lines[0].startswith("torch.profiler.profile records every step (t.py, line 9, entered 26 times)")
    assert "Notebook 02" in lines[1] and "7.3x" in lines[1] and "Photos.__getitem__" in lines[1]
    assert "body.0 (Conv2d, bias=True)" in lines[2] and "tune does not edit your model's layers" in lines[2]


PROBED = textwrap.dedent('''\
    import sys
    import torch
    from torch import nn

    torch.autograd.set_detect_anomaly(True)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    head = nn.DataParallel(nn.Linear(2, 2))
    for i in range(40):
        x = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(i))
        out = model(x)
        v = model(x)
        print("state", torch.is_anomaly_enabled(), v.requires_grad, opt.param_groups[0]["fused"], flush=True)
        opt.zero_grad(set_to_none=False)
        print("grad", opt.param_groups[0]["params"][0].grad is None, flush=True)
        out.pow(2).mean().backward()
        opt.step()
    ''')


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_probe_finds_each_general_item_and_each_is_applied_without_editing_the_file(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(PROBED)
    command = parse_command([sys.executable, str(script)], cwd=tmp_path)

    def run(name, apply):
        work = tmp_path / name
        r = run_once(command, name, apply, workdir=work, warmup=2, steps=5, timeout_s=120, round_=-1)
        assert r.status == "steps", r.error
        log = "".join(p.read_text() for p in work.rglob("*.log"))
        return r.result["general"], [ln for ln in log.splitlines() if ln.startswith(("state", "grad"))]

    gen, seen = run("probe", {})
    assert [(s["api"], s["line"]) for s in gen["debug_sites"]] == [("set_detect_anomaly", 5)]
    assert [(s["line"], s["count"] >= 7) for s in gen["zero_grad_sites"]] == [(14, True)]
    assert [f["line"] for f in gen["unreached_forwards"]] == [12]  # v = model(x); out reaches backward()
    assert gen["optimizer_impl"]["class"] == "SGD" and gen["optimizer_impl"]["fused_supported"] is True
    assert gen["optimizer_impl"]["built_by"] == ""  # the script's own line builds it
    assert [r["kind"] for r in gen["reported"]] == ["data_parallel", "conv_bias_before_norm"]
    assert gen["reported"][0]["line"] == 8 and gen["reported"][0]["file"] == str(script.resolve())
    assert "model[0] (Conv2d, bias=True) feeds model[1] (BatchNorm2d)" in gen["reported"][1]["text"]
    assert seen[:4] == ["state True True None", "grad True", "state True True None", "grad False"]
    _, seen = run("all", {"debug_off": True, "no_grad": [[str(script.resolve()), 12]], "set_to_none": True,
                          "optimizer_impl": {"fused": True}})
    assert seen[:4] == ["state False False True", "grad True", "state False False True", "grad True"]
    assert script.read_text() == PROBED


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("example", ["debug_left_on"])
def test_an_examples_expected_diff_is_what_tune_writes_from_its_probe(example, tmp_path):
    """The example's expected diff (tune's own, kept in examples/) is what the rewriter writes from the probe's call
    sites for the techniques its header names (``# written: ...``): the probe, the plan and the edit agree with it,
    and the example still holds every general item for the probe to find."""
    script = ROOT / "examples" / f"{example}.py"
    expected = (ROOT / "examples" / f"{example}.expected.diff").read_text()
    command = parse_command([sys.executable, str(script), "--epochs", "3"], cwd=tmp_path)
    probe = run_once(command, "probe", {}, workdir=tmp_path / "w", warmup=2, steps=20, timeout_s=180, round_=-1)
    assert probe.status == "steps", probe.error
    chosen, _ = candidates.choose(probe.result, cores=2)
    general = [c for c in chosen if c.technique in candidates.GENERAL]
    assert {c.technique for c in general} == set(candidates.GENERAL)
    source = script.read_text()
    written = re.search(r"^# written: (.+)$", expected, re.M).group(1).split(", ")  # the header names them
    wanted = [c for c in general if c.technique in written]
    assert len(wanted) == len(written)
    new, made, skipped = apply_edits(source, plan_edits(probe.result, wanted, script))
    assert not skipped
    diff = unified_diff(source, new, script.name)
    body = expected[expected.index("--- a/"):]
    assert diff == body


def test_the_report_and_its_summary_list_what_was_reported_only(tmp_path):
    from helpers.tune.report import markdown
    from helpers.tune.session import TuneResult

    md = markdown(TuneResult("python t.py", tmp_path, _general_probe()))
    section = md[md.index("## Reported only"):]
    assert "- torch.profiler.profile records every step" in section and "Notebook 02 (batched decode)" in section
    assert "## Reported only" not in markdown(TuneResult("python t.py", tmp_path, {"general": {}}))


def test_removing_a_debug_call_between_two_blocks_keeps_their_own_spacing():
    """A fresh user's script: imports, a blank line, set_detect_anomaly(True), two blank lines, a class. Removed, it
    leaves the two blank lines PEP 8 wants before the class, not three."""
    src = textwrap.dedent('''\
        import torch

        # chasing a NaN
        torch.autograd.set_detect_anomaly(True)


        class Net(torch.nn.Module):
            pass
        ''')
    new, made, skipped = apply_edits(src, [Edit("debug_off", "f", 4)])
    assert len(made) == 1 and not skipped
    # the removed line's own comment is kept (the user's note), above the class's two blank lines' worth of space
    assert new == "import torch\n\n\n# chasing a NaN\nclass Net(torch.nn.Module):\n    pass\n", repr(new)


@pytest.mark.parametrize("call, written", [
    ("opt.zero_grad(False)", "opt.zero_grad(set_to_none=True)"),
    ("model.zero_grad(False)  # keep zeros", "model.zero_grad(set_to_none=True)  # keep zeros"),
    ("opt.zero_grad(set_to_none=False)", "opt.zero_grad(set_to_none=True)"),
    ("opt.zero_grad()", "opt.zero_grad(set_to_none=True)"),
])
def test_set_to_none_replaces_a_positional_false_rather_than_passing_it_twice(call, written):
    """``zero_grad(False)`` passes set_to_none positionally: the edit replaces it (``zero_grad(False,
    set_to_none=True)`` would raise "got multiple values for argument 'set_to_none'" at the proof)."""
    source = f"def step(opt, model):\n    {call}\n"
    gen = {"zero_grad_sites": [{"file": "train.py", "line": 2}]}
    edits = [e for e in candidates.general_edits({"general": gen}, {"set_to_none": True})
             if e.technique == "set_to_none"]
    new, made, skipped = apply_edits(source, edits)
    assert not skipped and new == f"def step(opt, model):\n    {written}\n"


def test_an_optimizer_built_through_any_of_tunes_hooks_is_still_the_scripts_own():
    """Each hook module of tune's may wrap ``Optimizer.__init__`` (hook_device's TF32 does): its frame between the
    script's line and torch is not a framework building the optimizer (it read "built by helpers.tune.hook_device",
    and fused=True went untried)."""
    from helpers.tune import hook_general

    class Rec:
        is_user_file = staticmethod(lambda name: name == "/u/train.py")

    ns = {"sys": sys, "_builder": hook_general._builder, "rec": Rec()}
    hook_file = str(Path(hook_general.__file__).parent / "hook_device.py")
    exec(compile("def wrapped():\n    return _builder(sys._getframe(0), rec)\n", hook_file, "exec"), ns)
    exec(compile("def user():\n    return wrapped()\n", "/u/train.py", "exec"), ns)
    assert ns["user"]() == ""
    fw = {**ns, "__name__": "transformers.trainer"}  # a framework's module still owns what it builds
    exec(compile("def framework():\n    return wrapped()\n", "/site/transformers/trainer.py", "exec"), fw)
    assert fw["framework"]() == "transformers.trainer"
