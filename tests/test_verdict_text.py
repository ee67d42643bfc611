"""A printed verdict leads with one line of at most 120 characters: what to do, the number and its interval; the
reason follows, a clause per line, with nothing of it lost."""

from __future__ import annotations

import pytest

from helpers import machine
from helpers.verdict import HEADLINE_CHARS, Action, Verdict, detail_lines, reason_clauses
from helpers.workbook.nbsetup import guard_verdict

LONG = "; ".join(f"clause {i} with its figures (a, b; c) and more words to make it long" for i in range(12))


def _v(**kw) -> Verdict:
    base = dict(notebook="06_mixed_precision", metric="speedup", value=1.27, unit="x", recommendation="enable",
                reason=LONG, spread={"ci_low": 1.13, "ci_high": 1.30, "confidence": 0.95},
                action=Action("autocast_dtype", "bfloat16", "bf16 autocast: enable", current="float32"))
    base.update(kw)
    return Verdict(**base)


def test_the_headline_says_what_to_do_then_the_number_and_its_interval():
    assert _v().headline() == "ENABLE bf16 autocast: speedup 1.27x (95% CI 1.13–1.30)"
    off = _v(recommendation="leave off", value=0.16, spread={"ci_low": 0.15, "ci_high": 0.17},
             action=Action("autocast_dtype", None, "bf16 autocast: leave off", current="float32"))
    assert off.headline() == "LEAVE OFF bf16 autocast: speedup 0.16x (95% CI 0.15–0.17)"
    batch = _v(notebook="09_memory_and_batch_size", metric="max_batch_size", value=80, unit="samples", spread=None,
               action=Action("batch_size", 80, "batch size 32 → 80", current=32))
    assert batch.headline() == "ENABLE: batch size 32 → 80: max batch size 80 samples"


def test_a_label_names_the_side_to_speed_up_and_the_notebooks_next():
    v = _v(notebook="01_baseline_profiling", metric="exposed_input_fraction", value=0.62, unit="fraction",
           recommendation="host-bound", action=None, spread={"p25": 0.55, "p75": 0.70},
           extra={"bottleneck": {"next_notebooks": ["03", "02"]}})
    assert v.headline() == ("HOST-BOUND: speed up the input first (notebook 03, 02): exposed input fraction 62% "
                            "(IQR 55%–70%)")


def test_a_share_s_interval_stays_within_0_and_100_percent():
    v = _v(metric="ceiling_fraction", value=0.67, unit="fraction", spread={"ci_low": 0.42, "ci_high": 1.87})
    assert "(95% CI 42%–100%)" in v.headline() and "187" not in v.headline()


@pytest.mark.parametrize("busy", [True, False])
def test_an_inconclusive_verdict_says_why_and_what_was_measured_first(busy):
    check = machine.BusyCheck(busy=busy, other_cpu_share=0.8 if busy else 0.01, load_per_core=2.0 if busy else 0.0,
                              seconds=10.0, reasons=("other processes",) if busy else ())
    v = guard_verdict(_v(spread={"ci_low": 0.9, "ci_high": 1.6}), check)
    if busy:
        assert v.headline().startswith("INCONCLUSIVE (enable as measured): machine busy, rerun when it is quiet")
    else:
        assert v.headline().startswith("ENABLE bf16 autocast")


def test_every_headline_fits_and_the_details_keep_the_whole_reason():
    long_action = Action("x", 1, "a setting with a very long description " * 5 + ": enable")
    for v in (_v(), _v(action=long_action), _v(recommendation="not applicable", value=None, action=None),
              _v(metric="a_metric_name_that_is_rather_long_" * 3)):
        head = v.headline()
        assert len(head) <= HEADLINE_CHARS, head
        assert head.startswith(v.recommendation.upper())
        text = v.text().splitlines()
        assert text[0] == head and [ln.removeprefix("  - ") for ln in text[1:]] == reason_clauses(v.reason)
    clauses = reason_clauses(LONG)
    assert len(clauses) == 12 and " ".join(clauses) == LONG  # split outside brackets only, nothing lost
    assert detail_lines("one; two (a; b)") == ["  - one;", "  - two (a; b)"]


def test_a_verdict_that_decides_no_setting_says_what_to_do_in_its_own_words():
    from helpers.experiments.environment import verdict as env_verdict

    env = env_verdict(device_kind="cpu", device_name="x86", native_bf16=False, invalid_settings=2,
                      capabilities={"pinned_memory": "not available: no accelerator"})
    assert env.headline().startswith("CHECK: fix the 2 invalid environment setting(s) listed above: ")
    e2e = _v(notebook="10_end_to_end", action=None, extra={"optimizations": ["num_workers", "bf16"]})
    assert e2e.headline() == "ENABLE num_workers + bf16 together: speedup 1.27x (95% CI 1.13–1.30)"


def test_a_long_unit_gives_way_before_the_advice_and_a_unit_is_said_once():
    v = _v(notebook="09_memory_and_batch_size", metric="max_batch_size", value=32, spread=None, action=None,
           unit="samples or more (no limit found up to finder_max_batch)", recommendation="inconclusive",
           extra={"measured_recommendation": "leave off", "machine": {"busy": True}})
    assert v.headline() == ("INCONCLUSIVE (leave off as measured): machine busy, rerun when it is quiet: max batch "
                            "size 32 samples or more")
    env = _v(metric="invalid_env_settings", value=0, unit="invalid settings", spread=None, action=None,
             recommendation="not applicable", reason="device cpu (x86); not available here: pinned memory")
    assert env.headline() == "NOT APPLICABLE here: device cpu (x86): 0 invalid settings"
