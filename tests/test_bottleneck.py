"""One verdict vocabulary (issue 21): the classification, its "next" advice, and the figures reconciled with it.

All from constructed inputs: no timing, so nothing here depends on a quiet machine.
"""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

from helpers import bottleneck
from helpers.bottleneck import BALANCED, DEVICE_BOUND, HOST_BOUND, LABELS, classify, spare_cores
from helpers.errors import ParameterError
from helpers.experiments import three_run as tr
from helpers.verdict import RECOMMENDATIONS

INPUT = {"02", "03", "04", "05"}
COMPUTE = {"06", "07"}


def test_labels_are_verdict_recommendations():
    assert set(LABELS) <= set(RECOMMENDATIONS)
    assert LABELS == ("host-bound", "balanced", "device-bound", "communication-bound")


@pytest.mark.parametrize("exposed, threshold, label", [
    (0.10, 0.10, DEVICE_BOUND),            # at the threshold: not above it
    (0.1000001, 0.10, BALANCED),           # just above: the compute is still the larger lever
    (1 / 3 - 1e-6, 0.10, BALANCED),        # free input saves a hair less than a 2x faster compute
    (1 / 3, 0.10, HOST_BOUND),             # equal savings: the input first (exposed >= (1 - exposed) / 2)
    (1 / 3 + 1e-6, 0.10, HOST_BOUND),
    (0.0, 0.10, DEVICE_BOUND), (1.0, 0.10, HOST_BOUND),
    (0.30, 0.40, DEVICE_BOUND),            # a threshold above 1/3: at or below it, device-bound
    (0.45, 0.40, HOST_BOUND),
    (0.05, 0.0, BALANCED),                 # threshold 0 (notebook 01's slider): any exposed input counts
])
def test_classification_at_its_boundaries(exposed, threshold, label):
    b = classify(exposed, threshold)
    assert b.label == label
    assert b.input_saving == pytest.approx(exposed) and b.compute_saving == pytest.approx((1 - exposed) / 2)
    assert b.exposed_fraction == pytest.approx(exposed) and b.threshold == threshold


def test_the_reason_names_the_lever_its_label_follows():
    host, bal, dev = classify(0.40, 0.1), classify(0.20, 0.1), classify(0.05, 0.1)
    assert "40%" in host.reason and "30%" in host.reason and "the input is the larger lever" in host.reason
    assert "20%" in bal.reason and "40%" in bal.reason and "the compute is the larger lever" in bal.reason
    assert "device-side optimizations" in dev.reason
    for b in (host, bal, dev):  # never a label beside the other side's advice
        assert ("compute is the larger lever" in b.reason) == (b.label == BALANCED)
        assert "fix the input first" not in b.reason


@pytest.mark.parametrize("spare", [None, 0, 3])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_next_agrees_with_the_label(spare, device):
    dev = classify(0.05, 0.1, device_kind=device, spare_cores=spare)
    assert dev.next_notebooks == ("06", "07")
    host = classify(0.60, 0.1, device_kind=device, spare_cores=spare)
    assert host.next_notebooks[0] in INPUT  # the input first
    bal = classify(0.20, 0.1, device_kind=device, spare_cores=spare)
    assert bal.next_notebooks[:2] == ("06", "07") and set(bal.next_notebooks[2:]) & INPUT  # compute, then input
    for b in (dev, host, bal):
        text = b.next_text()
        assert text.startswith(f"notebook {b.next_notebooks[0]} (notebooks/") and b.next_reason in text
        assert b.as_dict()["next"] == text and b.as_dict()["label"] == b.label


def test_with_idle_cores_the_workers_are_advised():
    b = classify(0.60, 0.1, device_kind="cuda", spare_cores=7)
    assert b.next_notebooks == ("03", "02") and "7 idle core(s)" in b.next_reason and b.workers_can_hide_input


def test_without_idle_cores_the_advice_names_the_levers_that_can_pay():
    """Issue 21: 40% exposed input on a 2-core CPU: 'next: notebook 03 (the DataLoader)' alone was wrong there."""
    b = classify(0.40, 0.1, device_kind="cpu", spare_cores=spare_cores("cpu", cores=2, compute_threads=2))
    assert b.spare_cores == 0 and b.workers_can_hide_input is False
    assert b.next_notebooks == ("02", "06", "07")  # a cheaper sample, then a cheaper computation; not 03
    assert "only on idle cores and this step leaves none" in b.next_reason
    assert "on a CPU the computation uses the same cores" in b.next_reason
    assert "reduced size" in b.next_reason and "30% of the step" in b.next_reason
    # where a 2x faster compute is worth less than the threshold, only the cheaper sample is named
    assert classify(0.96, 0.1, device_kind="cpu", spare_cores=0).next_notebooks == ("02",)
    # balanced: the compute levers first, then the cheaper sample (no workers)
    assert classify(0.20, 0.1, device_kind="cpu", spare_cores=0).next_notebooks == ("06", "07", "02")
    # an accelerator with its one core taken by the main process
    gpu = classify(0.50, 0.1, device_kind="cuda", spare_cores=spare_cores("cuda", cores=1))
    assert gpu.next_notebooks[0] == "02" and "the main process and other work take them" in gpu.next_reason


def test_a_copy_bound_input_points_at_pinned_memory_and_overlap_on_an_accelerator_only():
    assert classify(0.5, 0.1, device_kind="cuda", copy_share=0.8).next_notebooks == ("04", "05")
    assert classify(0.5, 0.1, device_kind="cuda", copy_share=0.8, spare_cores=0).next_notebooks == ("04", "05")
    assert classify(0.5, 0.1, device_kind="cuda", copy_share=0.2).next_notebooks == ("03", "02")
    assert "04" not in classify(0.5, 0.1, device_kind="cpu", copy_share=0.8).next_notebooks


def test_spare_cores():
    assert spare_cores("cpu", cores=2) == 0                       # the computation takes every core
    assert spare_cores("cpu", cores=8, compute_threads=4) == 4
    assert spare_cores("cuda", cores=2) == 1                      # the main process takes one
    assert spare_cores("cuda", cores=8, other_cpu_share=0.5) == 3
    assert spare_cores("npu", cores=1) == 0
    assert spare_cores("cuda", cores=4, other_cpu_share=3.0) == 0  # never negative
    assert spare_cores("cpu") >= 0                                # this machine's affinity


@pytest.mark.parametrize("kwargs", [dict(exposed_fraction=float("nan")), dict(exposed_fraction=1.5),
                                    dict(exposed_fraction=-0.1), dict(threshold=2.0),
                                    dict(spare_cores=-1), dict(copy_share=1.2)])
def test_bad_input_is_a_clear_error(kwargs):
    args = {"exposed_fraction": 0.5, "threshold": 0.1, **kwargs}
    with pytest.raises(ParameterError, match="classify"):
        classify(args.pop("exposed_fraction"), args.pop("threshold"), **args)


def test_bad_core_counts_are_a_clear_error():
    with pytest.raises(ParameterError, match="cores must be an int >= 1"):
        spare_cores("cpu", cores=0)
    with pytest.raises(ParameterError, match="other_cpu_share"):
        spare_cores("cpu", cores=2, other_cpu_share=float("nan"))


# --------------------------------------------------------------------------- figures reconciled


def test_a_free_input_speedup_beyond_the_exposed_share_is_said_within_noise():
    """exposed 31% allows at most 1/(1-0.31) = 1.45x; 2.00x with an interval reaching 1.45 is that, within noise."""
    s = tr.free_input_sentence(2.00, 1.30, 2.60, exposed=0.31)
    assert "about 1.45x faster" in s and "the same within noise" in s and "measured 2.00x" in s
    assert "would be 2.00x faster" not in s


def test_a_free_input_speedup_measurably_beyond_it_is_explained_not_contradicted():
    s = tr.free_input_sentence(2.00, 1.80, 2.20, exposed=0.31)
    assert "2.00x faster" in s and "more than the 1.45x its 31% exposed input alone allows" in s
    assert "slows the computation" in s


def test_free_input_within_what_the_share_allows_and_no_speedup():
    assert tr.free_input_sentence(1.30, 1.20, 1.40, exposed=0.31) == ("with free input this job would be 1.30x "
                                                                      "faster (real / synthetic, 95% CI 1.20-1.40)")
    assert "no measurable speedup" in tr.free_input_sentence(1.10, 0.95, 1.20, exposed=0.31)
    assert tr.exposed_ceiling(0.5) == pytest.approx(2.0) and tr.exposed_ceiling(1.0) == float("inf")


def test_cached_faster_than_synthetic_is_the_same_within_noise():
    """Issue 21: 'removing the loader's work gives 2.37x of the 2.00x' (cached faster than synthetic) was noise."""
    s = tr.loader_sentence((2.37, 1.90, 2.80), (2.00, 1.70, 2.30))
    assert "the same as free input, within noise" in s and "2.37x of the 2.00x" not in s
    apart = tr.loader_sentence((3.00, 2.80, 3.20), (2.00, 1.90, 2.10))
    assert "cannot be" in apart and "read the two as the same" in apart
    assert tr.loader_sentence((1.50, 1.40, 1.60), (2.00, 1.90, 2.10)) == ("with its loader's work removed but the "
                                                                          "copy kept, 1.50x (real / cached, 95% CI "
                                                                          "1.40-1.60)")


def test_copy_share_from_the_three_runs():
    assert tr.copy_share(100.0, 60.0, 50.0) == pytest.approx(0.2)
    assert tr.copy_share(100.0, 40.0, 50.0) == 0.0   # cached faster than synthetic: no measurable copy
    assert tr.copy_share(50.0, 50.0, 50.0) is None


def _frame(data_ms, h2d_ms, compute_ms, n=5):
    step = data_ms + h2d_ms + compute_ms
    return pd.DataFrame({"data": [data_ms / 1e3] * n, "h2d": [h2d_ms / 1e3] * n, "compute": [compute_ms / 1e3] * n,
                         "step_s": [step / 1e3] * n, "exposed_fraction": [(data_ms + h2d_ms) / step] * n})


def test_diagnose_lines_carry_one_vocabulary():
    cmp = lambda r, lo, hi: SimpleNamespace(ratio=r, ci_low=lo, ci_high=hi)  # noqa: E731
    b = classify(0.31, 0.1, device_kind="cpu", spare_cores=0)
    quiet = SimpleNamespace(busy=False, sentence=lambda: "the machine was quiet", as_dict=lambda: {})
    r = tr.ThreeRunResult(job="j", steps={"real": _frame(31, 0, 69), "cached": _frame(0, 0, 50),
                                          "synthetic": _frame(0, 0, 50)},
                          exposed_fraction=0.31, recommendation=b.label, reason=b.reason, ceiling=cmp(2.0, 1.3, 2.6),
                          loader=cmp(2.37, 1.9, 2.8), machine=quiet, next_notebook=b.next_text(), bottleneck=b)
    text = "\n".join(r.lines())
    assert "balanced: " in text and "host-bound" not in text
    assert "the same within noise" in text and "the same as free input, within noise" in text
    assert "2.37x of the 2.00x" not in text and "next: notebook 06" in text
    d = r.as_dict()
    assert d["measured_recommendation"] == "balanced" and d["bottleneck"]["next_notebooks"] == ["06", "07", "02"]


def test_baseline_classify_is_the_shared_rule():
    from helpers.experiments.baseline import classify as nb01_classify

    for x in (0.05, 0.2, 0.5):  # notebook 01's serial loop: its timed compute is the rest of the step
        b = classify(x, 0.1, device_kind="cpu", compute_fraction=1 - x)
        assert nb01_classify(x, 0.1, device_kind="cpu") == (b.label, b.reason)
    assert bottleneck.COPY_MAJORITY == 0.5


def test_notebook_01s_verdict_carries_the_classification_and_its_next(monkeypatch):
    """A constructed run (no timing): 31% exposed, the ceiling 2.00x (95% CI 1.30-2.60) said within noise."""
    from helpers.compute.train import TrainRun
    from helpers.experiments import baseline

    monkeypatch.setattr(baseline, "spare_cores", lambda kind, share=None: 0)
    steps = _frame(31, 0, 69)
    steps["step"] = range(len(steps))
    run = TrainRun(phases=None, steps=steps, warmup_steps=1)
    ceiling = tr.CeilingResult(job="j", steps={}, machine=None, ceiling=SimpleNamespace(
        ratio=2.0, ci_low=1.3, ci_high=2.6, inverse=lambda: (0.5, 1 / 2.6, 1 / 1.3)))
    v = baseline.verdict(run, None, threshold=0.1, device_kind="cpu", description={"job": "mine", "batch_size": 8},
                         steps=5, ceiling=ceiling)
    assert v.recommendation == "balanced" == v.extra["bottleneck"]["label"]
    assert v.extra["bottleneck"]["next_notebooks"] == ["06", "07", "02"]
    assert v.reason.endswith(v.extra["bottleneck"]["next"]) and "; next: notebook 06" in v.reason
    assert "about 1.45x faster" in v.reason and "the same within noise" in v.reason
    assert "would be 2.00x faster" not in v.reason


def test_a_job_faster_than_its_own_ceiling_is_said_within_noise():
    at = lambda r, lo, hi: tr.CeilingResult(job="j", steps={}, machine=None, ceiling=SimpleNamespace(  # noqa: E731
        ratio=r, ci_low=lo, ci_high=hi, inverse=lambda: (1 / r, 1 / hi, 1 / lo))).sentence(exposed=0.05)
    noisy = at(0.58, 0.15, 1.62)
    assert "no measurable speedup" in noisy
    assert "at its input-free ceiling, within noise (95% CI from 62% to 100%)" in noisy
    assert "it runs at 172% of" not in noisy
    assert "the machine's speed changed" in at(0.5, 0.4, 0.6)
    assert "it runs at 50% of its input-free ceiling (95% CI 40%-62%)" in at(2.0, 1.6, 2.5)
    # a share of the ceiling never reads above 100%, though the ratio's interval reaches below 1
    wide = at(1.5, 0.53, 2.4)
    assert "it runs at 67% of its input-free ceiling (95% CI 42%-100%)" in wide and "189%" not in wide
