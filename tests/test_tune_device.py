"""tune's CUDA and NPU candidates (TF32/HF32, host synchronisations, host-made tensors, activation checkpointing
reported only), with fakes: this machine has no GPU. Their choice, the hook's runtime watch and apply, and the
rewrite of realistic scripts (argparse, a Trainer class, gradient accumulation)."""

from __future__ import annotations

import types
import warnings
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from torch.optim import optimizer as optim_mod

from helpers.tune import candidates_device as dev_mod
from helpers.tune import hook_device
from helpers.tune.hook import Recorder
from helpers.tune.report import not_tried
from helpers.tune.rewrite import apply_edits
from helpers.tune.session import call_edits, plan_edits

SCRIPT = '''"""Train a small classifier."""
import argparse

import torch
from torch import nn


class Trainer:
    def __init__(self, args):
        self.device = torch.device(args.device)
        self.model = nn.Linear(16, 4).to(self.device)
        # AdamW, as in the paper
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.accum = args.accum

    def fit(self, loader, epochs):
        best = float("inf")
        for epoch in range(epochs):
            for i, (x, y) in enumerate(loader):
                x, y = x.to(self.device), y.to(self.device)
                weights = torch.tensor([1.0, 2.0, 1.0, 1.0]).to(self.device)
                noise = torch.randn(x.shape).to(self.device)
                loss = nn.functional.cross_entropy(self.model(x + noise), y, weight=weights) / self.accum
                loss.backward()
                if (i + 1) % self.accum == 0:
                    self.opt.step()
                    self.opt.zero_grad()
                print(f"epoch {epoch} step {i} loss {loss.item():.4f}")
                best = min(best, loss.item())
                if loss.item() < 1e-3:
                    return best
        return best


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--accum", type=int, default=4)
    args = parser.parse_args()
    data = [(torch.randn(8, 16), torch.randint(0, 4, (8,))) for _ in range(64)]
    Trainer(args).fit(data, 2)


if __name__ == "__main__":
    main()
'''


def _line(text: str) -> int:
    return next(n for n, ln in enumerate(SCRIPT.splitlines(), 1) if text in ln)


def _probe(script: Path, kind: str = "cuda", **device) -> dict:
    f = str(script)
    sites = [("print(f", 5), ("best = min", 5), ("if loss.item()", 5), ("x, y = x.to", 5), ("return best", 1),
             ("weights = torch.tensor", 5)]  # the factory's blocking copy syncs too: device_factory's line
    dev = {"script": f, "precision": {"matmul": "highest", "cudnn_tf32": True, "capability": [8, 0]},
           "syncs": [{"file": f, "line": _line(t), "count": c, "text": t, "kind": "item"} for t, c in sites],
           "sync_steps": 5, "sync_watch": 'torch.cuda.set_sync_debug_mode("warn")',
           "memory": {"peak_bytes": 3 * 2**30, "total_bytes": 80 * 2**30}}
    dev.update(device)
    return {"model": {"param_device": kind, "param_dtype": "float32"},
            "optimizer": {"file": f, "line": _line("self.opt = torch.optim.AdamW"), "model_names": ["self.model"]},
            "to_sites": [{"file": f, "line": _line(t), "count": 20, "method": "to"}
                         for t in ("x, y = x.to", "weights = torch.tensor", "noise = torch.randn")],
            "device": dev}


@pytest.fixture
def script(tmp_path):
    p = tmp_path / "train.py"
    p.write_text(SCRIPT, encoding="utf-8")
    return p


def test_cpu_says_once_why_none_applies(script):
    chosen, skipped = dev_mod.device_candidates({**_probe(script), "model": {"param_device": "cpu",
                                                                             "param_dtype": "float32"}})
    assert chosen == []
    assert {t for t, _ in skipped} == {"tf32", "host_sync", "device_factory", "checkpointing"}
    lines = not_tried(skipped)
    assert len(lines) == 1 and "no device for the host to wait for" in lines[0] and "notebook" not in lines[0]
    assert "no device memory whose peak could limit the batch" in lines[0]
    assert dev_mod.device_candidates({"model": {"param_device": "cuda"}}) == ([], [])  # an older probe: nothing


def test_cuda_candidates_and_their_reasons(script):
    chosen, skipped = dev_mod.device_candidates(_probe(script))
    assert [(c.technique, c.name) for c in chosen] == [
        ("tf32", 'set_float32_matmul_precision("high")'), ("host_sync", "host syncs every 10 steps"),
        ("device_factory", "tensors made on the device")]
    assert chosen[0].apply == {"tf32": True}
    assert chosen[1].apply["edits"] == [{"kind": "sync_every", "line": _line("print(f"),
                                         "params": {"index": "i", "every": 10}}]
    assert chosen[2].apply["edits"] == [{"kind": "device_factory", "line": _line("weights ="), "params": {}}]
    assert "4% of the cuda's 80.0 GiB: memory does not limit the batch" in dict(skipped)["checkpointing"]
    old = _probe(script, precision={"matmul": "highest", "capability": [7, 5]})
    assert "compute capability 7.5" in dict(dev_mod.device_candidates(old)[1])["tf32"]
    given = _probe(script, precision={"matmul": "high", "capability": [9, 0]})
    assert "already sets the float32 matmul precision to 'high'" in dict(dev_mod.device_candidates(given)[1])["tf32"]
    half = {**_probe(script), "model": {"param_device": "cuda", "param_dtype": "bfloat16"}}
    assert "bfloat16" in dict(dev_mod.device_candidates(half)[1])["tf32"]
    mixed = {**_probe(script), "autocast_in_use": True}
    assert "already runs under torch.autocast" in dict(dev_mod.device_candidates(mixed)[1])["tf32"]
    failed = _probe(script, syncs=[], sync_watch="set_sync_debug_mode failed: RuntimeError: no")
    assert "could not watch" in dict(dev_mod.device_candidates(failed)[1])["host_sync"]
    quiet = _probe(script, syncs=[])
    assert "saw no host synchronisation" in dict(dev_mod.device_candidates(quiet)[1])["host_sync"]


def test_npu_tries_hf32_only_where_it_is_off(script):
    npu = _probe(script, "npu", precision={"matmul_hf32": False, "conv_hf32": True})
    chosen, _ = dev_mod.device_candidates(npu)
    assert chosen[0].name == "npu.matmul.allow_hf32" and chosen[0].apply == {"tf32": True}
    edits = dev_mod.device_edits(npu, {"tf32": True})
    new, made, skipped = apply_edits(SCRIPT, edits)
    assert "        torch.npu.matmul.allow_hf32 = True  # HF32 for float32 matmuls\n        self.opt = " in new
    on = _probe(script, "npu", precision={"matmul_hf32": True, "conv_hf32": True})
    assert "already sets torch.npu.matmul.allow_hf32" in dict(dev_mod.device_candidates(on)[1])["tf32"]


def test_what_is_not_rewritten_is_reported_with_its_reason(script):
    lines = dev_mod.device_reported(_probe(script))
    text = "\n".join(lines)
    assert f"line {_line('best = min')}" in text and "its value is kept" in text
    assert f"line {_line('if loss.item()')}" in text and "control flow" in text
    assert f"line {_line('noise =')}" in text and "device's generator" in text
    assert f"line {_line('x, y = x.to')}" in text and "pin_memory + non_blocking" in text  # a pageable copy waits
    assert f"line {_line('return best')}" not in text  # once in 5 steps: not a per-step sync
    assert f"line {_line('weights =')}" not in text  # device_factory rewrites it
    assert "memory limits the batch" not in text
    full = _probe(script, memory={"peak_bytes": 72 * 2**30, "total_bytes": 80 * 2**30})
    note = dev_mod.device_reported(full)[-1]
    assert "90% of the device's 80.0 GiB: memory limits the batch" in note and "notebook 09" in note
    assert "torch.utils.checkpoint.checkpoint" in note


def test_the_winners_are_written_into_a_trainer_script(script):
    probe = _probe(script)
    chosen, _ = dev_mod.device_candidates(probe)
    edits = plan_edits(probe, chosen, script)
    assert sorted(e.kind for e in edits) == ["device_factory", "matmul_precision", "sync_every"]
    new, made, skipped = apply_edits(SCRIPT, edits)
    assert skipped == [] and len(made) == 3
    assert ("        # AdamW, as in the paper\n"
            '        torch.set_float32_matmul_precision("high")  # TF32 tensor cores for float32 matmuls\n'
            "        self.opt = torch.optim.AdamW") in new
    assert "weights = torch.tensor([1.0, 2.0, 1.0, 1.0], device=self.device)\n" in new
    assert "noise = torch.randn(x.shape).to(self.device)\n" in new  # a random factory is left
    assert ("                if i % 10 == 0:\n"
            '                    print(f"epoch {epoch} step {i} loss {loss.item():.4f}")\n'
            "                best = min(best, loss.item())\n") in new
    compile(new, "train.py", "exec")
    # each runs alone as an edited copy of the script (session._variant), the same edit as written
    assert [e.kind for e in call_edits(chosen[1], script)] == ["sync_every"]


def test_factory_rewrites_keep_the_users_arguments():
    from helpers.tune.rewrite_device import factory_moves

    src = ("import torch as th\nimport torch\n\ndev = 'cuda'\na = th.zeros(3, 4).to(dev, non_blocking=True)\n"
           "b = torch.arange(8).to(dev, torch.float32)\nc = torch.full((2,), 1.0).cuda()\nd = torch.zeros(2).to(x)\n"
           "e = torch.ones(2).cuda(1)\n")
    found = factory_moves(src)
    assert sorted(found) == [5, 6, 7, 8, 9]
    assert "may be a tensor" in found[8]["why"] and "device index" in found[9]["why"]
    from helpers.tune.rewrite import Edit

    new, made, skipped = apply_edits(src, [Edit("device_factory", "/x.py", n, {}, "device_factory")
                                           for n in (5, 6, 7, 8)])
    assert "a = th.zeros(3, 4, device=dev)\n" in new
    assert "b = torch.arange(8, device=dev, dtype=torch.float32)\n" in new
    assert 'c = torch.full((2,), 1.0, device="cuda")\n' in new
    assert [e.line for e, _ in skipped] == [8]


def _recorder(tmp_path, script, **spec):
    rec = Recorder({"warmup": 1, "steps": 5, "user_roots": [str(tmp_path)], "script": str(script), **spec})
    rec.model_info = {"param_device": "cuda"}
    return rec


@pytest.fixture
def isolated(monkeypatch):
    """The hook's patches undone after the test: the optimizer's constructor, torch's global step hooks, the
    warnings machinery."""
    monkeypatch.setattr(torch.optim.Optimizer, "__init__", torch.optim.Optimizer.__init__)
    monkeypatch.setattr(optim_mod, "_global_optimizer_post_hooks", OrderedDict())
    monkeypatch.setattr(warnings, "_showwarnmsg", warnings._showwarnmsg)
    with warnings.catch_warnings():
        yield monkeypatch


def _optimizer(rec, monkeypatch):
    orig = torch.optim.Optimizer.__init__

    def init(self, *args, **kwargs):  # what helpers.tune.hook's constructor hook records
        orig(self, *args, **kwargs)
        rec.optimizer = rec.optimizer or {"class": type(self).__name__}
    monkeypatch.setattr(torch.optim.Optimizer, "__init__", init)


def test_hook_applies_tf32_and_hf32_where_the_optimizer_is_built(tmp_path, script, isolated):
    calls = []
    isolated.setattr(torch, "set_float32_matmul_precision", calls.append)
    rec = _recorder(tmp_path, script, apply={"tf32": True})
    _optimizer(rec, isolated)
    hook_device._watch_device(rec)
    torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=0.1)
    assert calls == ["high"]
    npu = types.SimpleNamespace(matmul=types.SimpleNamespace(allow_hf32=False))
    isolated.setattr(torch, "npu", npu, raising=False)
    hook_device._reduced_matmul(torch, "npu")
    assert npu.matmul.allow_hf32 is True
    hook_device._reduced_matmul(torch, "cpu")  # nothing on another device
    assert calls == ["high"]


def test_probe_counts_each_steps_syncs_at_the_users_line(tmp_path, script, isolated):
    user = tmp_path / "logging_step.py"
    user.write_text("import warnings\n\n\ndef log(loss):\n"
                    "    warnings.warn('called a synchronizing CUDA operation')  # print(loss.item())\n"
                    "    warnings.warn('an unrelated warning')\n", encoding="utf-8")
    code = compile(user.read_text(), str(user), "exec")
    ns: dict = {}
    exec(code, ns)
    modes = []
    isolated.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    isolated.setattr(torch.cuda, "get_sync_debug_mode", lambda: 0)
    isolated.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    warnings.simplefilter("always")
    rec = _recorder(tmp_path, script, probe=True)
    hook_device._watch_device(rec)
    shown = []  # the script's own showwarning, set after the hook's (as logging.captureWarnings(True) does)
    warnings.showwarning = lambda message, *args, **kwargs: shown.append(str(message))
    opt = torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=0.1)
    rec.optimizer_id = id(opt)
    for step in range(8):
        rec.step_t.append(float(step))
        opt.step()  # the post-hook: step 1 starts the watch, 5 steps later it ends
        ns["log"](None)
    assert modes == ["warn", 0]
    out = hook_device._device_result(rec)
    assert out["precision"] == {"matmul": "highest", "cudnn_tf32": True, "capability": [9, 0]}
    assert out["sync_steps"] == 5 and out["memory"] is None  # the model is not known here
    [site] = out["syncs"]
    assert (site["line"], site["count"], site["kind"]) == (5, 5, "print")
    # watched, a sync is counted, not shown; other warnings, and syncs after the watch, are shown as before
    assert shown == ["an unrelated warning"] * 5 + ["called a synchronizing CUDA operation", "an unrelated warning"] * 3
    measured = _recorder(tmp_path, script)  # a measured run (not the probe) is not slowed by the watch
    isolated.setattr(optim_mod, "_global_optimizer_post_hooks", OrderedDict())
    hook_device._watch_device(measured)
    measured.optimizer_id = id(opt)
    measured.step_t.append(0.0)
    opt.step()
    assert modes == ["warn", 0] and measured.device["sync_watch"] == ""


EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "device_habits.py"


def _example_probe() -> dict:
    """What a probe of examples/device_habits.py on a TF32 GPU gives (the three habits, nothing else)."""
    src = EXAMPLE.read_text()
    f = str(EXAMPLE)

    def line(text):
        return next(n for n, ln in enumerate(src.splitlines(), 1) if text in ln)
    return {"model": {"param_device": "cuda", "param_dtype": "float32"},
            "optimizer": {"file": f, "line": line("optimizer = torch.optim.SGD"), "model_names": ["model"]},
            "to_sites": [{"file": f, "line": line("weights = torch"), "count": 25, "method": "to"},
                         # the model's copy at set-up is no factory
                         {"file": f, "line": line("nn.Linear(args.width, 10))"), "count": 6, "method": "to"}],
            "device": {"script": f, "precision": {"matmul": "highest", "cudnn_tf32": True, "capability": [9, 0]},
                       "syncs": [{"file": f, "line": line("print(f"), "count": 5, "text": "", "kind": "print"}],
                       "sync_steps": 5, "sync_watch": 'torch.cuda.set_sync_debug_mode("warn")',
                       "memory": {"peak_bytes": 2**30, "total_bytes": 80 * 2**30}}}


def test_the_device_examples_expected_diff_is_what_tune_writes():
    from helpers.tune.rewrite import unified_diff

    probe = _example_probe()
    chosen, _ = dev_mod.device_candidates(probe)
    expected = EXAMPLE.with_suffix(".expected.diff").read_text()
    written = next(ln for ln in expected.splitlines() if ln.startswith("# written: "))[len("# written: "):]
    assert [c.technique for c in chosen] == written.split(", ")
    source = EXAMPLE.read_text()
    new, made, skipped = apply_edits(source, plan_edits(probe, chosen, EXAMPLE))
    assert skipped == []
    assert unified_diff(source, new, EXAMPLE.name) == expected[expected.index("--- a/"):]


def test_device_check_says_tune_is_not_applicable_on_the_cpu(tmp_path, monkeypatch):
    from helpers.workbook import bench, device_check, runner, trace_check
    from helpers.workbook.tune_check import tune_example

    assert tune_example("cpu", tmp_path)["status"] == "not applicable"
    monkeypatch.setattr(runner, "run", lambda options, echo=print: (options.out, types.SimpleNamespace(notebooks=[])))
    monkeypatch.setattr(bench, "input_pipeline", lambda **kw: {})
    monkeypatch.setattr(trace_check, "trace_flip", lambda *a, **kw: {"ok": True, "flips": []})
    summary = device_check.device_check(device="cpu", out=tmp_path / "dc", profile="smoke", echo=lambda line: None)
    assert summary["steps"]["tune"]["status"] == "not applicable"
    assert "apply only on a CUDA or NPU device" in summary["tune"]["reason"]


def test_what_a_synchronising_statement_does_decides_its_rewrite():
    from helpers.tune.rewrite_device import sync_statement

    src = ("for step, batch in enumerate(loader):\n"
           "    bar.set_postfix(loss=loss.item())\n"
           "    history.append(loss.item())\n"
           "    if step % 50 == 0:\n"
           "        print(loss.item())\n"
           "    assert torch.isfinite(loss).item()\n"
           "while True:\n"
           "    print(loss.item())\n")
    got = [(n, sync_statement(src, n)) for n in (2, 3, 5, 6, 8)]
    assert [(n, s["kind"], s["index"], s["guarded"]) for n, s in got] == [
        (2, "log", "step", False), (3, "other", "step", False), (5, "log", "step", True), (6, "control", "step", False),
        (8, "log", None, False)]

