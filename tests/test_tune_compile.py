"""tune's torch.compile candidate: choosing it, its compile time apart from its steps, the break-even, the rejection
reasons and the rewrite, with fakes; and one real compile of a tiny model on the CPU (slow)."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers.tune import candidates, hook, hook_compile
from helpers.tune.candidates_compile import (break_even, compile_candidates, compile_edits, compile_judgement,
                                             smaller_last_batch)
from helpers.tune.engine import Judgement, Run, parse_command, run_once
from helpers.tune.rewrite import apply_edits
from helpers.tune.session import job_steps, plan_edits

CPU_MODEL = {"class": "Net", "has_conv2d": False, "param_device": "cpu", "param_dtype": "float32",
             "bf16_supported": True}


def _probe(**over):
    probe = {"model": dict(CPU_MODEL), "optimizer": {"file": "/s/train.py", "line": 4, "model_names": ["model"]},
             "loaders": [{"file": "/s/train.py", "line": 2, "dataset_len": 4000,
                          "effective": {"num_workers": 0, "batch_size": 64}}]}
    probe.update(over)
    return probe


def _names(probe):
    chosen, skipped = candidates.choose(probe, cores=2)
    return [c for c in chosen if c.technique == "compile"], [r for t, r in skipped if t == "compile"]


def test_compile_is_tried_on_any_model_and_cuda_graphs_only_on_cuda():
    chosen, why = _names(_probe())
    assert [(c.name, c.apply) for c in chosen] == [("torch.compile", {"compile": "default"})]
    assert candidates.NOTEBOOK["compile"] == "07"
    assert why == ['mode="reduce-overhead" (CUDA graphs) is tried on a CUDA device only; the model is on the cpu']
    chosen, why = _names(_probe(model={**CPU_MODEL, "param_device": "cuda"}))
    assert [c.apply for c in chosen] == [{"compile": "default"}, {"compile": "reduce-overhead"}] and not why
    chosen, why = _names(_probe(model={**CPU_MODEL, "param_device": "npu"}))
    assert [c.apply for c in chosen] == [{"compile": "default"}] and "the model is on the npu" in why[0]


@pytest.mark.parametrize("over, reason", [
    ({"model": {**CPU_MODEL, "compiled": True}}, "the script compiles its model already"),
    ({"model": {**CPU_MODEL, "wrapper": "DistributedDataParallel"}}, "wrapped in DistributedDataParallel"),
    ({"ddp": {"wrapped": True}}, "DDPOptimizer"),
    ({"model": {}}, "no model was found"),
])
def test_compile_is_left_out_with_its_reason(over, reason):
    chosen, why = _names(_probe(**over))
    assert chosen == [] and len(why) == 1 and reason in why[0]


def test_a_compiled_model_is_recognised_by_the_probe():
    class OptimizedModule:  # what torch.compile(model) returns, by its class's name
        pass

    class Net:
        _compiled_call_impl = None

    assert hook_compile.describe(OptimizedModule()) == {"compiled": True}
    assert hook_compile.describe(Net()) == {}
    done = Net()
    done._compiled_call_impl = object()  # model.compile() sets it
    assert hook_compile.describe(done) == {"compiled": True}
    assert hook_compile.describe(SimpleNamespace(module=done)) == {"compiled": True}  # inside a DDP wrap


def test_break_even_is_compile_time_over_the_time_saved_per_step():
    assert break_even(10.0, 0.100, 0.050) == 200
    assert break_even(10.0, 0.100, 0.099) == 10_000  # rounded up: 9,999.99...
    assert break_even(0.0, 0.1, 0.05) == 0
    assert break_even(10.0, 0.05, 0.05) == math.inf and break_even(10.0, 0.05, 0.06) == math.inf
    with pytest.raises(ValueError, match="compile_s >= 0"):
        break_even(-1.0, 0.1, 0.05)
    with pytest.raises(ValueError):
        break_even(1.0, 0.0, 0.05)


def test_the_smaller_last_batch_is_seen_from_the_loader():
    assert smaller_last_batch(_probe()) == "4000 samples = 62 x 64 + 32"
    even = _probe(loaders=[{"dataset_len": 4096, "effective": {"batch_size": 64}}])
    assert smaller_last_batch(even) == ""
    assert smaller_last_batch(_probe(loaders=[{"dataset_len": None, "effective": {"batch_size": 64}}])) == ""


def _run(compile_info, round_=0):
    return Run("torch.compile", round_, "steps", [0.05] * 10, [1.0] * 16, 30.0, "", {"compile": compile_info})


def _info(compile_s=20.0, recompiles=0, breaks=0, reasons=()):
    return {"compile_s": compile_s, "first_s": compile_s, "recompiles": recompiles, "recompile_steps": [],
            "graph_breaks": breaks, "break_reasons": list(reasons),
            "events": [{"trigger": "DYNAMO", "id": "0/0", "step": 0, "seconds": compile_s * 0.75},
                       {"trigger": "LAZY_BACKWARD", "id": "0/0", "step": 0, "seconds": compile_s * 0.25}]}


FASTER = Judgement("torch.compile", "faster", 2.0, 1.8, 2.2, [2.0, 2.0], base_ms=100.0, variant_ms=50.0,
                   reason="50.0 against 100.0 ms per step")


def test_a_graph_break_rejects_compile_with_its_reason():
    j = compile_judgement(FASTER, [_run(_info()), _run(_info(breaks=2, reasons=["call to print"]), 1)], _probe(),
                          10_000, "how")
    assert j.verdict == "rejected"
    assert "broke the model's graph 2 times (call to print)" in j.reason and "TORCH_LOGS=graph_breaks" in j.reason


def test_compile_pays_after_its_break_even_and_never_in_a_shorter_job():
    even = _probe(loaders=[])  # no smaller last batch to estimate
    j = compile_judgement(FASTER, [_run(_info(20.0)), _run(_info(30.0), 1)], even, 1000, "10 batches x 100 epochs")
    assert j.verdict == "faster"
    assert "compiling took 25.0 s (time inside torch's compiler, mean of 2 runs)" in j.reason
    assert "saves 50.0 ms per step, so it pays after 500 optimizer steps, of the 1,000 your job runs" in j.reason
    short = compile_judgement(FASTER, [_run(_info(20.0)), _run(_info(30.0), 1)], even, 499, "a short job")
    assert short.verdict == "no gain" and "your job runs 499 (a short job): it would not pay back" in short.reason
    unknown = compile_judgement(FASTER, [_run(_info(20.0))], even, None, "no epochs in scope")
    assert unknown.verdict == "faster" and "does not know how many steps your job runs (no epochs in scope)" in \
        unknown.reason
    assert FASTER.verdict == "faster"  # the engine's judgement is not changed in place


def test_a_recompilation_is_counted_or_estimated():
    j = compile_judgement(FASTER, [_run(_info(20.0, recompiles=1))], _probe(), 10_000, "how")
    assert "1 recompilation included" in j.reason and "pays after 400 " in j.reason
    # no run reached the smaller last batch: one more forward compilation (15 s here) is added, said as estimated
    j = compile_judgement(FASTER, [_run(_info(20.0))], _probe(), 10_000, "how")
    assert "+15.0 s estimated for the recompilation at the smaller last batch of each epoch (4000 samples = 62 x " \
           "64 + 32)" in j.reason and "pays after 700 " in j.reason


def test_other_verdicts_keep_theirs_and_say_the_compile_time():
    slower = Judgement("torch.compile", "slower", 0.5, 0.4, 0.6, [], base_ms=50.0, variant_ms=100.0, reason="r")
    j = compile_judgement(slower, [_run(_info())], _probe(), 10, "how")
    assert j.verdict == "slower" and "the compiled step is not shorter" in j.reason
    failed = Judgement("torch.compile", "rejected", reason="the script failed with this change (round 1): "
                                                           "BackendCompilerFailed: ...")
    assert compile_judgement(failed, [_run(_info())], _probe(), 10, "how") is failed
    no_compile = Judgement("x", "faster", 2.0, base_ms=2.0, variant_ms=1.0)
    assert compile_judgement(no_compile, [_run(None)], _probe(), 10, "how") is no_compile


def test_the_job_steps_come_from_the_loop_and_its_epochs():
    probe = {"loop_sites": [{"batches": 63, "epochs": {"expr": "args.epochs", "value": 5}}], "steps_seen": 26,
             "batches_drawn": 26}
    assert job_steps(probe) == (315, "63 batches per epoch x 5 epochs (args.epochs)")
    steps, why = job_steps({"loop_sites": [{"batches": 63}], "steps_seen": 26, "batches_drawn": 26})
    assert steps is None and "no number of epochs" in why


def test_the_compile_time_is_taken_out_of_the_step_it_fell_in():
    w = hook_compile.CompileWatch(lambda: 0)
    w.events = [{"trigger": "DYNAMO", "id": "0/0", "step": 0, "seconds": 20.0},  # inside step 0: not in the times
                {"trigger": "DYNAMO", "id": "0/1", "step": 3, "seconds": 4.0}]  # inside step 3: times[2]
    rec = SimpleNamespace(compile_watch=w)
    assert hook_compile.apart(rec, [0.1, 0.1, 4.1, 0.1]) == pytest.approx([0.1, 0.1, 0.1, 0.1])
    assert hook_compile.apart(SimpleNamespace(), [0.1, 0.2]) == [0.1, 0.2]
    assert hook_compile._attempt("0/1") == 1 and hook_compile._attempt("3/0") == 0
    assert hook_compile._attempt("!0/2/1") == 1 and hook_compile._attempt("odd") == 0


def test_each_run_compiles_in_its_own_cache_unless_the_user_chose_one(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    folder = hook_compile.private_cache(str(tmp_path / "run"))
    assert folder and Path(folder).parent == tmp_path / "run" and Path(folder).is_dir()
    import os

    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == folder
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/theirs")
    assert hook_compile.private_cache(str(tmp_path / "run")) is None
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/theirs"


def test_the_watch_records_each_compilation_and_its_step():
    steps = [0]
    w = hook_compile.CompileWatch(lambda: steps[0])
    args = SimpleNamespace(callback_trigger=SimpleNamespace(name="DYNAMO"), compile_id="0/0")
    w.start(args)
    assert w.active
    w.end(args)
    steps[0] = 12
    w.start(SimpleNamespace(callback_trigger=SimpleNamespace(name="DYNAMO"), compile_id="0/1"))
    w.end(None)
    assert not w.active and [(e["id"], e["step"]) for e in w.events] == [("0/0", 0), ("0/1", 12)]
    out = hook_compile.result(SimpleNamespace(compile_watch=w))
    assert out["recompiles"] == 1 and out["recompile_steps"] == [12] and out["compile_s"] >= 0


def test_graph_breaks_are_read_from_dynamos_counters(monkeypatch):
    from collections import Counter

    w = hook_compile.CompileWatch(lambda: 0)
    fake = SimpleNamespace(counters={"graph_break": Counter({"Unsupported: call to print\nmore": 2,
                                                             "data-dependent branching": 1})})
    monkeypatch.setitem(sys.modules, "torch._dynamo.utils", fake)
    out = hook_compile.result(SimpleNamespace(compile_watch=w))
    assert out["graph_breaks"] == 3
    assert out["break_reasons"] == ["Unsupported: call to print", "data-dependent branching"]


def test_a_compiling_run_is_not_taken_for_a_stalled_one(tmp_path, monkeypatch):
    """The heartbeat's last-progress time moves on while the compiler runs, though no step is made."""
    monkeypatch.setattr(hook, "HEARTBEAT_S", 0.02)
    rec = SimpleNamespace(step_t=[], compile_watch=SimpleNamespace(active=True))
    path = tmp_path / "beat.json"
    hook._heartbeat(rec, str(path))
    deadline = time.time() + 10
    walls = set()
    while time.time() < deadline and len(walls) < 3:
        try:
            beat = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        assert beat["steps"] == 0
        walls.add(beat["wall"])
    assert len(walls) >= 3
    rec.compile_watch.active = False  # the thread is a daemon: it ends with the test process


SCRIPT = textwrap.dedent('''\
    import torch
    model = Net()
    # build the optimizer
    optimizer = torch.optim.AdamW(model.parameters())
    for x, y in loader:
        pass
    ''')


def test_the_rewrite_compiles_the_model_where_it_is_built(tmp_path):
    probe = _probe(optimizer={"file": str(tmp_path / "t.py"), "line": 4, "model_names": ["model", "net"]})
    compiled = candidates.Candidate("torch.compile", "compile", {"compile": "default"})
    edits = compile_edits(probe, candidates.merge_apply([compiled]))
    new, made, skipped = apply_edits(SCRIPT, edits)
    assert not skipped and len(made) == 1
    assert "# build the optimizer\nmodel.compile()\noptimizer = torch.optim.AdamW(" in new
    # with channels_last, the model is converted, then compiled; both before the optimizer
    cl = candidates.Candidate("channels_last", "channels_last", {"channels_last": True})
    new, _, skipped = apply_edits(SCRIPT, plan_edits(probe, [cl, compiled], tmp_path / "t.py"))
    assert not skipped
    assert "model = model.to(memory_format=torch.channels_last)\nmodel.compile()\noptimizer" in new
    graphs = candidates.Candidate('torch.compile mode="reduce-overhead"', "compile", {"compile": "reduce-overhead"})
    new, _, _ = apply_edits(SCRIPT, compile_edits(probe, candidates.merge_apply([graphs])))
    assert 'model.compile(mode="reduce-overhead")\n' in new
    assert compile_edits({**probe, "optimizer": {}}, {"compile": "default"}) == []
    _, made, skipped = apply_edits("import torch\nif ok: opt = make(model)\n",
                                   compile_edits({**probe, "optimizer": {"file": "t", "line": 2,
                                                                         "model_names": ["model"]}},
                                                 {"compile": "default"}))
    assert not made and "not a statement of its own line" in skipped[0][1]


TINY = textwrap.dedent('''\
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    loader = DataLoader(TensorDataset(torch.randn(72, 8), torch.randint(0, 3, (72,))), batch_size=16)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    epochs = 3
    for epoch in range(epochs):
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    ''')


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_real_compile_on_the_cpu_is_timed_apart_and_its_recompilation_noticed(tmp_path):
    """A tiny MLP compiled by inductor (gcc on this machine): the compile time is the compiler's, the steps carry
    none of it, and the smaller last batch (72 = 4 x 16 + 8) is a recompilation at step 4."""
    script = tmp_path / "tiny.py"
    script.write_text(TINY)
    command = parse_command([sys.executable, str(script)], cwd=tmp_path)
    r = run_once(command, "torch.compile", {"compile": "default"}, workdir=tmp_path / "w", warmup=1, steps=8,
                 timeout_s=400, round_=0)
    assert r.status == "steps", r.error
    c = r.result["compile"]
    assert c["graph_breaks"] == 0 and c["first_s"] > 0 and c["compile_s"] >= c["first_s"]
    # the forward's compile at the first step; the backward's (lazy) one with it, where torch compiled it apart (in
    # one full make test run it did not show as its own event)
    assert "DYNAMO" in {e["trigger"] for e in c["events"] if e["step"] == 0}
    assert {e["trigger"] for e in c["events"]} <= {"DYNAMO", "LAZY_BACKWARD"}
    assert c["recompiles"] >= 1 and c["recompile_steps"][0] == 4  # the first epoch's fifth batch holds 8 samples
    longest = max(e["seconds"] for e in c["events"] if e["step"] == 4)
    assert max(r.result["all_step_times_s"]) < longest  # step 4 without its compilation
    assert script.read_text() == TINY
    # its own compile cache, under the run's folder and removed: nothing written to torch's shared one
    assert not [f for f in r.result.get("user_files") or [] if "torchinductor" in f["path"]]
    assert not list((tmp_path / "w").glob("inductor-cache-*"))


def test_a_compile_that_cannot_pay_within_the_job_is_not_run_again():
    from helpers.tune.candidates_compile import cannot_pay

    base = Run("unmodified", 0, "steps", [0.100] * 10, [1.0] * 16, 10.0, "", {})
    ran = Run("torch.compile", 0, "steps", [0.090] * 10, [1.0] * 16, 40.0, "",
              {"compile": _info(30.0), "applied": {"compile": "default"}})
    # 30 s to compile against 100 ms steps: a job of 300 steps takes as long unmodified; any shorter cannot pay
    assert cannot_pay(ran, [base], 300) == ""
    why = cannot_pay(ran, [base], 299)
    assert "compiling took 30 s, more than your job's 299 steps take unmodified: 299 x 100 ms, the median step of " \
           "round 1's unmodified run; it cannot pay back even were each compiled step free" == why
    assert "(" not in why  # the progress line puts it in parentheses: one level
    assert cannot_pay(ran, [base], None) == ""  # the job's length unknown: all rounds run
    other_round = Run("unmodified", 1, "steps", [0.001] * 10, [], 1.0, "", {})
    assert cannot_pay(ran, [other_round], 10) == ""  # judged against its own round's unmodified run only
    # the verdict says why it ran once, and a gain measured in that one run is not proposed
    j = compile_judgement(FASTER, [ran], _probe(loaders=[]), 299, "how", base=[base])
    assert j.verdict == "no gain" and "not run again after its first run: compiling took 30 s" in j.reason
    busy = compile_judgement(dataclasses.replace(FASTER, verdict="inconclusive"), [ran], _probe(), 299, "how",
                             base=[base])
    assert busy.verdict == "inconclusive" and "not run again" in busy.reason
    broken = Run("torch.compile", 0, "steps", [0.05] * 10, [], 40.0, "",
                 {"compile": _info(breaks=1), "applied": {"compile": "default"}})
    assert "broke the model's graph 1 time(s)" in cannot_pay(broken, [base], None)
    own = Run("channels_last", 0, "steps", [0.2] * 10, [], 40.0, "", {"compile": _info(), "applied": {}})
    assert cannot_pay(own, [base], 10) == ""  # a script that compiles itself: another candidate's run


def test_measure_runs_a_decided_variant_no_more(tmp_path, monkeypatch):
    from helpers.tune import engine

    calls = []

    def fake_run(command, name, apply, *, round_, **kw):
        calls.append((name, round_))
        return Run(name, round_, "steps", [0.1] * 10, [1.0] * 16, 1.0, "", {"applied": apply})

    monkeypatch.setattr(engine, "run_once", fake_run)
    lines = []
    engine.measure(None, [("unmodified", {}, None), ("torch.compile", {"compile": "default"}, None),
                          ("other", {}, None)], rounds=3, workdir=tmp_path, warmup=1, steps=5, timeout_s=10,
                   progress=lines.append,
                   decided=lambda name, run, ref: "it cannot pay" if run.result["applied"].get("compile") else "")
    assert [r for n, r in calls if n == "torch.compile"] == [0] and len([c for c in calls if c[0] == "other"]) == 3
    assert any("torch.compile" in ln and "(it cannot pay; its 2 later runs skipped)" in ln for ln in lines)


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_compile_examples_expected_diff_is_what_tune_writes_from_its_probe(tmp_path):
    """examples/compile_mlp.expected.diff is the rewriter's edit for torch.compile at the probe's call sites, and the
    example is one where compile is a candidate, its job's steps known to the probe (63 batches x 5 epochs)."""
    import re

    from helpers.tune.rewrite import unified_diff

    root = Path(__file__).resolve().parents[1]
    script = root / "examples" / "compile_mlp.py"
    expected = (root / "examples" / "compile_mlp.expected.diff").read_text()
    command = parse_command([sys.executable, str(script), "--epochs", "5"], cwd=tmp_path)
    probe = run_once(command, "probe", {}, workdir=tmp_path / "w", warmup=2, steps=8, timeout_s=180, round_=-1)
    assert probe.status == "steps", probe.error
    chosen, _ = candidates.choose(probe.result, cores=2)
    compiled = [c for c in chosen if c.technique == "compile"]
    assert [c.name for c in compiled] == ["torch.compile"]
    assert job_steps(probe.result)[0] == 315 and smaller_last_batch(probe.result) == "4000 samples = 62 x 64 + 32"
    assert re.search(r"^# written: (.+)$", expected, re.M).group(1) == "compile"
    source = script.read_text()
    new, made, skipped = apply_edits(source, plan_edits(probe.result, compiled, script))
    assert not skipped and len(made) == 1
    assert unified_diff(source, new, script.name) == expected[expected.index("--- a/"):]
