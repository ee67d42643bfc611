"""The three-line instrument for a user's own loop: phases, verdict, next notebook, machine state."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers.errors import ParameterError
from helpers.workbook import instrument as inst

ROOT = Path(__file__).resolve().parents[1]


def _slow_loader(n, delay_s):
    for i in range(n):
        time.sleep(delay_s)  # a reader that waits (not CPU load: the figure holds on a busy machine too)
        yield i


@pytest.mark.busy_safe  # the measured label rests on sleeps, not on CPU time
def test_three_lines_give_notebook_01s_verdict_on_a_host_bound_loop(capsys):
    steps = inst.instrument(_slow_loader(12, 0.02), device="cpu", warmup=2, name="my loop")
    for _ in steps:
        time.sleep(0.002)  # the "compute"
    r = steps.report()
    out = capsys.readouterr().out
    assert len(r.steps) == 10
    # 20 ms of waiting against 2 ms of "compute": above 0.5 even where a busy machine wakes each sleep late
    assert r.measured_recommendation == "host-bound" and r.exposed_fraction > 0.5
    assert r.steps["data"].median() == pytest.approx(0.02, abs=0.015)
    assert out.startswith("my loop: 10 steps measured") and f"next: {r.next_notebook}" in out and "machine:" in out
    assert r.bottleneck.label == "host-bound" and r.bottleneck.next_notebooks[0] in ("02", "03")


@pytest.mark.busy_safe  # the measured label rests on sleeps, not on CPU time
def test_a_compute_bound_loop_is_device_bound_and_the_copy_marker_splits_the_copy():
    steps = inst.instrument(range(10), device="cpu", warmup=1)
    for _ in steps:
        time.sleep(0.001)  # the copy
        steps.copied()
        time.sleep(0.12)   # the compute: long enough that a busy machine's late wake-ups (a few ms) stay below 10%
    r = steps.result()
    assert r.measured_recommendation == "device-bound" and r.exposed_fraction < 0.10
    assert 0.0005 < r.steps["copy"].median() < 0.012
    assert r.steps["compute"].median() == pytest.approx(0.12, abs=0.03)
    assert r.steps["data"].median() < 1e-3
    assert "notebook 06" in r.next_notebook


def test_several_epochs_and_too_few_steps():
    steps = inst.instrument([1, 2], device="cpu", warmup=0)
    for _ in range(3):  # three epochs of two batches
        for _ in steps:
            time.sleep(0.001)
    assert len(steps.frame()) == 6
    few = inst.instrument([1, 2], device="cpu", warmup=1)
    for _ in few:
        pass
    r = few.result()  # too few steps: a report that says so, not a raise
    assert r.recommendation == r.measured_recommendation == "inconclusive" and r.bottleneck is None
    assert r.reason.startswith("only 1 step measured after the 1 warm-up step: too few for a verdict")
    with pytest.raises(ParameterError, match="warmup"):
        inst.instrument([], warmup=-1)


@pytest.mark.parametrize("batches, warmup, said", [
    (5, 3, "only 2 steps measured after the 3 warm-up steps: too few for a verdict;\n  - run more steps"),
    (2, 3, "only 0 steps measured after the 3 warm-up steps (the loop ran 2 in all): too few for a verdict"),
])
def test_report_with_too_few_steps_says_so_and_never_raises(capsys, batches, warmup, said):
    """A user's job that measured fewer than 3 steps: report() prints what it has and returns an inconclusive
    report (under torchrun a raise would be a traceback from every rank)."""
    steps = inst.instrument(range(batches), device="cpu", warmup=warmup, name="short loop")
    for _ in steps:
        pass
    r = steps.report()
    out = capsys.readouterr().out
    assert isinstance(r, inst.LoopReport) and r.recommendation == "inconclusive"
    assert said in out and out.startswith(f"short loop: {max(0, batches - warmup)} step")
    assert out.splitlines()[1].startswith("INCONCLUSIVE: too few steps, run at least 3 after the warm-up")
    assert "next: run more steps (at least 3 after the warm-up), then report() again" in out


@pytest.mark.busy_safe
def test_a_busy_machine_makes_the_verdict_inconclusive(monkeypatch):
    busy = SimpleNamespace(busy=True, sentence=lambda: "measured on a busy machine: other processes took 90%")
    monkeypatch.setattr(inst.machine, "check", lambda *a, **k: busy)
    steps = inst.instrument(_slow_loader(6, 0.01), device="cpu", warmup=0)
    for _ in steps:
        pass
    r = steps.result()
    assert r.recommendation == "inconclusive" and r.measured_recommendation == "host-bound"
    lines = r.lines()
    assert lines[1].startswith("INCONCLUSIVE (host-bound as measured): machine busy, rerun when it is quiet: exposed")
    assert lines[2].startswith("  - what it measured: host-bound: ")


@pytest.mark.slow
def test_bench_instrument_reports_the_overhead_ratio():
    # the fewest rounds the benchmark takes (--repeats 3): this test reads the figures' shape, not their value
    p = subprocess.run([sys.executable, "-m", "helpers", "bench", "instrument", "--device", "cpu", "--repeats", "3"],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout)
    assert out["ci_low"] <= out["overhead"] <= out["ci_high"] and out["blocks"] == 3
    assert isinstance(out["targets"]["overhead"]["met"], bool) and out["machine_note"]


@pytest.mark.parametrize("spare, first", [(0, "02"), (4, "03")])
def test_the_three_lines_say_one_verdict_and_follow_the_idle_cores(monkeypatch, spare, first):
    """Issue 21: "host-bound", "the compute side is the larger lever" and "next: notebook 03" in one message.
    The loader's wait is a sleep, so the label holds on a busy machine; the idle cores are set here."""
    monkeypatch.setattr(inst, "spare_cores", lambda kind, share=None: spare)
    steps = inst.instrument(_slow_loader(8, 0.02), device="cpu", warmup=1)
    for _ in steps:
        time.sleep(0.001)
    r = steps.result()
    lines = r.lines()
    assert lines[1].startswith(f"HOST-BOUND: speed up the input first (notebook {first}")
    verdict = "\n".join(lines[1:lines.index(next(ln for ln in lines if ln.startswith("median step")))])
    assert r.measured_recommendation == "host-bound" and "the input is the larger lever" in verdict
    assert "larger lever here" not in verdict and "compute is the larger lever" not in verdict
    nxt = next(ln for ln in lines if ln.startswith("next: "))
    assert nxt.startswith(f"next: notebook {first} (notebooks/")
    if spare == 0:
        assert "leaves none" in nxt and "reduced size" in nxt
    else:
        assert "4 idle core(s)" in nxt


# --------------------------------------------------------------------------- a loss that turns NaN (issue 36)


def test_a_nan_loss_makes_the_report_say_the_job_diverges_in_notebook_01s_words(capsys):
    import torch

    from helpers.jobs.check import loss_divergence

    losses = [1.0, 0.5, float("nan"), 0.2, float("inf"), 0.1, 0.1, 0.1]
    steps = inst.instrument(range(len(losses)), device="cpu", warmup=1, name="my loop")
    for i, _ in enumerate(steps):
        steps.loss(torch.tensor(losses[i]))  # read at the step's end, after its synchronize
    r = steps.report()
    lines = capsys.readouterr().out.splitlines()
    assert r.recommendation == "inconclusive" and r.divergence.diverged and r.bottleneck is None
    assert r.divergence.first == {"my loop": (3, "loss", pytest.approx(float("nan"), nan_ok=True))}
    assert lines[0] == "my loop: 7 steps measured"
    # the one sentence of notebooks 01, 06 and 10 and of diagnose, from the same function, under a one-line headline
    assert lines[1].startswith("INCONCLUSIVE: the loss diverged, fix the job before timing it")
    assert r.reason == loss_divergence({"my loop": losses}).sentence()
    assert lines[2].startswith("  - your job diverges: its loss is nan at step 3 in my loop;")
    body = lines[2:lines.index(next(ln for ln in lines if ln.startswith("median step")))]
    assert " ".join(ln.removeprefix("  - ") for ln in body) == r.reason
    assert not any(w in "\n".join(lines) for w in ("host-bound", "balanced", "device-bound", "next:"))


def test_a_finite_loss_or_none_leaves_the_verdict_and_an_inf_at_the_first_step_is_said():
    finite = inst.instrument(range(6), device="cpu", warmup=1)
    for _ in finite:
        finite.loss(0.5)  # a plain number works too
    assert finite.result().divergence is None and finite.result().bottleneck is not None
    first = inst.instrument(range(6), device="cpu", warmup=1)
    for _ in first:
        first.loss(float("inf"))
    r = first.result()
    assert r.reason.startswith("your job diverges: its loss is inf at step 1 in your loop; ")
    assert "finite at the first step" not in r.reason
    first.loss(float("nan"))  # between steps: a no-op, never a raise


def test_the_gathered_job_report_says_the_job_diverges_when_a_rank_does():
    ranks = {}
    for r, bad in ((0, None), (1, 4)):
        steps = inst.instrument(range(6), device="cpu", warmup=1)
        for i, _ in enumerate(steps, 1):
            steps.loss(float("nan") if i == bad else 1.0)
        ranks[r] = {**steps._payload(), "rank": r}
    rep = inst.job_report({int(r): p for r, p in json.loads(json.dumps(ranks)).items()}, world_size=2)  # as sent
    assert rep.recommendation == "inconclusive"
    assert rep.verdict_line.startswith("job: your job diverges: its loss is nan at step 4 in rank 1, finite in rank 0")
    assert rep.verdict_line in rep.lines()
