"""The busy-machine guard's rule (helpers.workbook.nbsetup.guard_verdict) and the runner's --patience.

Every verdict and machine state here is constructed: nothing is timed, so the rule is tested the same on a quiet
machine and beside busy loops.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from helpers import machine
from helpers.errors import ParameterError
from helpers.experiments.base import VerdictResult
from helpers.verdict import Action, Verdict
from helpers.workbook.nbsetup import NotebookContext, guard_verdict, ratio_decision

pytestmark = pytest.mark.busy_safe

BUSY = machine.BusyCheck(busy=True, other_cpu_share=0.40, load_per_core=1.4, seconds=30.0, threshold=0.25,
                         reasons=("other processes took 40% of the 2 usable core(s) while it measured "
                                  "(threshold 25%)",))
QUIET = machine.BusyCheck(busy=False, reasons=(), other_cpu_share=0.03, load_per_core=0.5, seconds=30.0)


def _ratio(rec: str, lo: float, hi: float, *, notebook: str = "06_mixed_precision", threshold: float | None = 1.05,
           confidence: float = 0.95, unit: str = "x") -> Verdict:
    extra = {} if threshold is None else {"decision_threshold": threshold}
    return Verdict(notebook=notebook, metric="speedup", value=(lo + hi) / 2, unit=unit, recommendation=rec,
                   reason="bf16 autocast measured", spread={"ci_low": lo, "ci_high": hi, "confidence": confidence},
                   action=Action("autocast_dtype", "bfloat16" if rec == "enable" else None, f"bf16 autocast: {rec}"),
                   extra=extra)


def _share(rec: str = "host-bound") -> Verdict:
    """Notebook 01's kind: a share of the step with its quartiles, no decision threshold on a ratio."""
    return Verdict(notebook="01_baseline_profiling", metric="exposed_input_fraction", value=0.4, unit="fraction",
                   recommendation=rec, reason="input exposed for 40% of each step", spread={"p25": 0.35, "p75": 0.45})


def test_a_quiet_machine_leaves_every_verdict_as_it_is():
    for v in (_ratio("enable", 0.98, 1.3), _share(), _ratio("leave off", 0.9, 1.2)):
        out = guard_verdict(v, QUIET)
        assert (out.recommendation, out.reason, out.action) == (v.recommendation, v.reason, v.action)
        assert out.extra["machine"]["busy"] is False and "verdict_stands" not in out.extra["machine"]
        assert "measured_recommendation" not in out.extra


def test_an_interval_that_clears_the_threshold_keeps_the_verdict_on_a_busy_machine_and_says_the_load():
    out = guard_verdict(_ratio("enable", 1.6, 1.9), BUSY)
    assert out.recommendation == "enable" and out.action is not None and out.action.value == "bfloat16"
    assert out.reason == ("bf16 autocast measured; measured while other processes took 40% of the cores; the 95% "
                          "interval 1.60-1.90x clears the 1.05x threshold, so the verdict stands")
    assert out.extra["machine"]["busy"] is True and out.extra["machine"]["verdict_stands"] is True
    assert out.extra["decision_threshold"] == 1.05 and "measured_recommendation" not in out.extra
    # a "leave off" whose whole interval lies below the threshold stands too (notebook 10's threshold is 1)
    off = guard_verdict(_ratio("leave off", 0.70, 0.95, notebook="10_end_to_end", threshold=1.0), BUSY)
    assert off.recommendation == "leave off" and off.extra["machine"]["verdict_stands"]
    assert off.reason.endswith("the 95% interval 0.70-0.95x lies below the 1.00x threshold, so the verdict stands")


@pytest.mark.parametrize("rec, lo, hi", [("enable", 0.98, 1.30),   # spans 1
                                         ("enable", 1.02, 1.30),   # above 1, but not above the threshold
                                         ("enable", 1.05, 1.30),   # on the threshold is not clear of it
                                         ("leave off", 0.90, 1.20),
                                         ("leave off", 1.00, 1.05)])
def test_an_interval_that_does_not_clear_the_threshold_is_inconclusive_and_says_how_to_narrow_it(rec, lo, hi):
    out = guard_verdict(_ratio(rec, lo, hi), BUSY)
    assert out.recommendation == "inconclusive" and out.action is None
    assert out.extra["measured_recommendation"] == rec and out.extra["machine"]["verdict_stands"] is False
    assert out.reason.startswith("measured on a busy machine: other processes took 40% of the 2 usable core(s)")
    assert (f"rerun when it is quiet, or measure more repeats (this notebook's 'steps' parameter, or the runner's "
            f"--patience K for every notebook): the 95% interval {lo:.2f}-{hi:.2f}x does not clear the 1.05x "
            f"threshold. What it measured: {rec}: bf16 autocast measured") in out.reason


@pytest.mark.parametrize("verdict", [
    _share("host-bound"), _share("device-bound"),
    _ratio("enable", 1.6, 1.9, threshold=None),           # no decision threshold: not known to be interleaved
    _ratio("enable", 1.6, 1.9, confidence=0.80),          # not a 95% interval
    _ratio("enable", 0.6, 0.9, unit="fraction"),          # a share, whatever its spread
], ids=["host-bound share", "device-bound share", "no threshold", "80% interval", "fraction"])
def test_shares_and_ratios_without_a_known_threshold_stay_inconclusive_under_load(verdict):
    out = guard_verdict(verdict, BUSY)
    assert out.recommendation == "inconclusive" and out.action is None
    assert out.extra["measured_recommendation"] == verdict.recommendation
    assert out.reason.startswith("measured on a busy machine") and "does not clear" not in out.reason
    assert out.reason.endswith(f"What it measured: {verdict.recommendation}: {verdict.reason}")


def test_not_applicable_is_kept_and_a_notebooks_own_inconclusive_gets_the_load_first():
    na = Verdict(notebook="04_pinned_memory", metric="speedup", value=None, unit="x",
                 recommendation="not applicable", reason="the CPU has no copy to pin")
    out = guard_verdict(na, BUSY)
    assert (out.recommendation, out.reason) == ("not applicable", na.reason) and out.extra["machine"]["busy"]
    own = Verdict(notebook="10_end_to_end", metric="speedup", value=1.4, unit="x", recommendation="inconclusive",
                  reason="a phase no optimization acts on changed", spread={"ci_low": 1.2, "ci_high": 1.6},
                  extra={"decision_threshold": 1.0, "measured_recommendation": "enable"})  # crosscheck.py's
    out = guard_verdict(own, BUSY)
    assert out.recommendation == "inconclusive" and out.reason.startswith("measured on a busy machine")
    assert out.extra["measured_recommendation"] == "enable"  # what notebook 10 measured, not "inconclusive"
    assert out.reason.endswith("What it measured: inconclusive: a phase no optimization acts on changed")
    # a reason that already says "inconclusive: " (crosscheck.py words it so) says it once
    worded = guard_verdict(replace(own, reason="inconclusive: the machine's speed changed"), BUSY)
    assert worded.reason.endswith("What it measured: inconclusive: the machine's speed changed")


def test_a_verdict_that_says_the_job_diverges_is_kept_under_load():
    """A loss that is not finite is no timing: the load cannot have caused it."""
    nan = Verdict(notebook="06_mixed_precision", metric="speedup", value=1.1, unit="x", recommendation="inconclusive",
                  reason="your job diverges: its loss is nan at step 3 in fp32 too",
                  spread={"ci_low": 0.9, "ci_high": 1.3},
                  extra={"divergence": {"baseline_diverged": True}})
    out = guard_verdict(nan, BUSY)
    assert (out.recommendation, out.reason) == ("inconclusive", nan.reason) and out.extra["machine"]["busy"]
    off = replace(nan, recommendation="leave off", reason="bf16 autocast breaks this job's training",
                  extra={"divergence": {"baseline_diverged": False}, "decision_threshold": 1.05})
    assert guard_verdict(off, BUSY).recommendation == "leave off"


def test_ratio_decision_reads_the_interval_and_threshold():
    assert ratio_decision(_ratio("enable", 1.2, 1.4)) == (1.2, 1.4, 1.05, 0.95)
    assert ratio_decision(_share()) is None
    assert ratio_decision(_ratio("enable", 1.2, 1.4, threshold=None)) is None
    assert ratio_decision(_ratio("enable", 1.2, 1.4, threshold=0.5)) is None  # a threshold below 1 is no speedup


def _ctx(tmp_path, notebook, before):
    from helpers.results import ResultsStore

    return NotebookContext(notebook=notebook, params={"busy_cpu_share": 0.25}, acc=None, out_dir=tmp_path,
                           store=ResultsStore(tmp_path / "results.jsonl", notebook=notebook), machine_before=before)


def test_record_applies_the_rule_to_the_machine_state_it_recorded(tmp_path, monkeypatch):
    """Constructed snapshots: 10 s in which other processes used 0.8 of each of 2 cores (80% > 25%)."""
    from helpers.results import load_results, verdicts

    before = machine.MachineState(time_s=100.0, load_1min=3.0, cores=2, busy_cpu_s=1000.0, steal_cpu_s=0.0,
                                  own_cpu_s=10.0)
    after = machine.MachineState(time_s=110.0, load_1min=3.0, cores=2, busy_cpu_s=1020.0, steal_cpu_s=0.0,
                                 own_cpu_s=14.0)
    monkeypatch.setattr(machine, "snapshot", lambda: after)
    for notebook, v in (("06_mixed_precision", _ratio("enable", 1.6, 1.9)),
                        ("07_channels_last", _ratio("enable", 1.01, 1.3, notebook="07_channels_last")),
                        ("01_baseline_profiling", _share())):
        _ctx(tmp_path, notebook, before).record(VerdictResult(v), show=False)
    df = load_results(tmp_path / "results.jsonl")
    rows = verdicts(df).set_index("notebook")
    assert rows.loc["06_mixed_precision", "recommendation"] == "enable"
    assert "other processes took 80% of the cores" in rows.loc["06_mixed_precision", "reason"]
    assert rows.loc["07_channels_last", "recommendation"] == "inconclusive"
    assert "'steps' parameter" in rows.loc["07_channels_last", "reason"]
    assert rows.loc["01_baseline_profiling", "recommendation"] == "inconclusive"
    state = df[df["experiment"] == "machine state"]
    assert len(state) == 3 and state["extra"].map(lambda e: e["busy"]).all()
    assert state["value"].tolist() == pytest.approx([0.8] * 3)


# ---------------------------------------------------------------- the runner's --patience


def test_patience_multiplies_the_interleaved_repeats_of_the_ratio_notebooks_only():
    from helpers.experiments.registry import interleaved_repeats
    from helpers.workbook.profiles import apply_patience

    assert apply_patience("06_mixed_precision", {"steps": 4, "seed": 0}, 3) == {"steps": 12, "seed": 0}
    assert apply_patience("03_dataloader_tuning", {}, 2) == {"trials": 4}  # the notebook's default, 2
    assert apply_patience("01_baseline_profiling", {"steps": 4}, 5) == {"steps": 4}  # a share: more steps do not help
    assert apply_patience("06_mixed_precision", {"steps": 4}, 1) == {"steps": 4}
    assert set(interleaved_repeats()) == {"02_batched_decode", "03_dataloader_tuning", "04_pinned_memory",
                                        "06_mixed_precision", "07_channels_last", "10_end_to_end"}
    for bad in (0, -1, 2.5, True, 101):
        with pytest.raises(ParameterError, match="--patience must be an integer from 1 to 100"):
            apply_patience("06_mixed_precision", {}, bad)
    with pytest.raises(ParameterError, match=r"--patience 60: 03_dataloader_tuning's trials would be 120, above its "
                                             r"maximum 100"):
        apply_patience("03_dataloader_tuning", {"trials": 2}, 60)


def test_run_patience_reaches_the_notebooks_parameters_and_is_checked_first(tmp_path):
    from helpers.workbook.cli import _parser
    from helpers.workbook.runner import RunOptions, run

    assert _parser().parse_args(["run", "--patience", "3"]).patience == 3
    assert _parser().parse_args(["run"]).patience == 1
    seen = {}
    _, state = run(RunOptions(profile="smoke", device="cpu", only=("01", "06", "10"), out=tmp_path / "run",
                              patience=3),
                   echo=lambda s: None, device_checker=lambda kind: "cpu:test",
                   executor=lambda nb, **kw: seen.setdefault(nb.id, nb.parameters))
    assert seen["06_mixed_precision"]["steps"] == 12 and seen["10_end_to_end"]["steps"] == 12  # smoke: 4 each
    assert seen["01_baseline_profiling"]["steps"] == 4
    with pytest.raises(ParameterError, match="--patience"):
        run(RunOptions(profile="smoke", device="cpu", out=tmp_path / "bad", patience=0), echo=lambda s: None,
            device_checker=lambda kind: pytest.fail("checked after the options"),
            executor=lambda nb, **kw: pytest.fail("no notebook may start"))
    with pytest.raises(ParameterError, match=r"--patience \(a resumed run keeps"):
        run(RunOptions(resume=True, out=tmp_path / "run", patience=2), echo=lambda s: None,
            device_checker=lambda kind: "cpu:test", executor=lambda nb, **kw: pytest.fail("no notebook may start"))


# ---------------------------------------------------------------- the notebooks' own verdict functions


def _cmp(a_s: float, b_s: float):
    """A tight comparison (1% spread) of A around a_s and B around b_s seconds."""
    from helpers.timing import Comparison, Measurement

    def m(name, s):
        return Measurement(name=name, times_s=tuple(s * (1 + 0.01 * ((i % 3) - 1)) for i in range(8)), warmup=0,
                           items_per_call=32)
    return Comparison.from_measurements(m("A", a_s), m("B", b_s))


def _notebook_verdicts(cmp):
    """The verdicts of notebooks 02, 03, 04, 06 and 07 from one comparison (B over A)."""
    from helpers.experiments import decode, loader_sweep, memory_format, pinning, precision
    from helpers.experiments.loader_sweep import LoaderSetting

    return [
        decode.verdict(cmp, _cmp(0.05, 0.06), pixels_ok=True, min_psnr_db=40.0, psnr_min_db=30.0, tokenize_share=0.02,
                       batch_size=32, image_size=64, images=100, repeats=8, warmup=1, threads=2, device_kind="cpu"),
        loader_sweep.verdict(LoaderSetting(2, 4, True), cmp, best_rate=900.0, zero_rate=500.0, implausible=None,
                             cores=2, trials=3, context="c"),
        pinning.verdict({"pinned_buffer": cmp}),
        precision.verdict(cmp, dtype_name="bfloat16", loss_ok=True, rel_diff=0.01, no_nan=True, loss_rtol=0.1,
                          device_kind="cuda", native_bf16=None, context="c"),
        memory_format.verdict({"fp32": cmp}, applicable=True, why_not="", fusion="f", context="c"),
    ]


def test_the_ratio_notebooks_record_their_threshold_and_a_clear_result_stands_under_load():
    for v in _notebook_verdicts(_cmp(0.2, 0.1)):  # 2x with a tight interval: enable, clear of 1.05x
        assert v.recommendation == "enable" and ratio_decision(v)[2] == 1.05, v.notebook
        out = guard_verdict(v, BUSY)
        assert out.recommendation == "enable" and out.action == v.action and out.reason.endswith(
            "clears the 1.05x threshold, so the verdict stands"), v.notebook
    for v in _notebook_verdicts(_cmp(0.1, 0.2)):  # B twice as slow: leave off, clear below 1.05x
        assert v.recommendation == "leave off", v.notebook
        assert guard_verdict(v, BUSY).recommendation == "leave off", v.notebook
    for v in _notebook_verdicts(_cmp(0.1, 0.0985)):  # 1.5% faster: leave off on a quiet machine, and under load
        assert v.recommendation == "leave off", v.notebook  # its interval ~1.0-1.03 lies below 1.05 too
        assert guard_verdict(v, BUSY).recommendation == "leave off", v.notebook
    for v in _notebook_verdicts(_cmp(0.106, 0.1)):  # 1.06x, interval across 1.05x: decided when quiet, not under load
        lo, hi, threshold, _ = ratio_decision(v)
        assert lo < threshold < hi and guard_verdict(v, BUSY).recommendation == "inconclusive", (v.notebook, lo, hi)
