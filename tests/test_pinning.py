"""Notebook 04's experiment: the bandwidth sweeps, the host memcpy's reference figure and the pinning verdict.

No accelerator here: on the CPU every sweep and the verdict must say "not applicable" without raising
(pytorch/pytorch#73003); the device sweeps run on a faked accelerator whose "device" is the CPU, with
``Tensor.pin_memory`` replaced by a copy (the same fakes as tests/test_transfer.py).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import pandas as pd
import pytest
import torch
from transfer_support import fake_accelerator, fake_pin  # noqa: F401  (fake_pin: a fixture)

from helpers.device import get_accelerator
from helpers.diagnose.pcie import LinkInfo
from helpers.errors import ParameterError
from helpers.experiments import pinning
from helpers.pipeline.transfer import METHODS, pinning_applicability
from helpers.results import ResultsStore
from helpers.timing import Comparison, Measurement
from helpers.verdict import Verdict

# --------------------------------------------------------------------------- fakes


# --------------------------------------------------------------------------- sizes


def test_transfer_sizes_are_powers_of_two_between_the_bounds():
    sizes = pinning.transfer_sizes(4, 1)
    assert sizes[0] == 4096 and sizes[-1] == 2**20 and len(sizes) == 9
    assert all(b == 2 * a for a, b in zip(sizes, sizes[1:]))
    assert pinning.transfer_sizes(3, 1)[0] == 4096  # rounded up to a power of two
    with pytest.raises(ParameterError, match="above"):
        pinning.transfer_sizes(4096, 1)
    with pytest.raises(ParameterError):
        pinning.transfer_sizes(0, 1)


# --------------------------------------------------------------------------- CPU: not applicable


def test_cpu_reports_not_applicable_without_raising():
    acc = get_accelerator("cpu")
    app = pinning_applicability(acc)
    sweep = pinning.bandwidth_sweep(acc, pinning.transfer_sizes(4, 1))
    assert set(sweep["method"]) == set(METHODS) | {pinning.REFERENCE_METHOD}
    assert not sweep["applicable"].any() and sweep["gbps"].isna().all()
    assert (sweep["reason"] == app.reason).all()
    assert pinning.batch_comparison(acc, (2, 8, 8, 3)) == {}
    verdict = pinning.pinning_decision({}, applicability=app)
    assert verdict["recommendation"] == "not applicable" and verdict["value"] is None
    assert verdict["reason"] == app.reason


def test_unknown_method_is_a_parameter_error():
    with pytest.raises(ParameterError, match="unknown copy method"):
        pinning.bandwidth_sweep(fake_accelerator(), [4096], methods=("telepathy",))


def test_host_copy_sweep_runs_anywhere():
    df = pinning.host_copy_sweep([4096, 65536], repeats=3, warmup=1)
    assert list(df["size_bytes"]) == [4096, 65536]
    assert (df["gbps"] > 0).all() and (df["gbps_p25"] <= df["gbps_p75"]).all()


# --------------------------------------------------------------------------- faked device


def test_sweep_and_batch_comparison_on_the_faked_device(fake_pin):
    acc = fake_accelerator()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        sweep = pinning.bandwidth_sweep(acc, [4096, 8192], methods=("pageable", "pinned_buffer"), repeats=3, warmup=1)
        comps = pinning.batch_comparison(acc, (2, 8, 8, 3), methods=("pin_per_batch", "loader_pin_thread"),
                                    repeats=3, warmup=1)
    assert len(sweep) == 2 * 3 and sweep["applicable"].all()
    ref = sweep[sweep["method"] == pinning.REFERENCE_METHOD]
    assert ref["median_s"].tolist() == pytest.approx([2e-3, 2e-3])  # fake events: 2 ms
    assert ref["gbps"].tolist() == pytest.approx([4096 / 2e-3 / 1e9, 8192 / 2e-3 / 1e9])
    assert set(comps) == {"pin_per_batch", "loader_pin_thread"}
    assert all(c.a.name == "pageable" and c.a.items_per_call == 2 * 8 * 8 * 3 for c in comps.values())


def _comparison(ratio_times, name):
    a = Measurement("pageable", tuple([1.0] * 5), warmup=0)
    b = Measurement(name, tuple(ratio_times), warmup=0)
    return Comparison.from_measurements(a, b)


def test_pinning_verdict_enables_only_a_clear_gain():
    clear = {"pin_per_batch": _comparison([0.9, 0.95, 0.92, 0.97, 0.93], "pin_per_batch"),
             "pinned_buffer": _comparison([0.5, 0.52, 0.49, 0.51, 0.5], "pinned_buffer")}
    v = pinning.pinning_decision(clear)
    assert v["recommendation"] == "enable" and v["method"] == "pinned_buffer"
    assert v["value"] == pytest.approx(2.0) and v["spread"]["ci_low"] > 1.05
    assert "reused pinned buffer" in v["reason"] and "pin_per_batch" in v["reason"]
    unclear = {"pin_per_batch": _comparison([0.97, 1.0, 0.98, 1.01, 0.99], "pin_per_batch")}
    v = pinning.pinning_decision(unclear)
    assert v["recommendation"] == "leave off" and not math.isnan(v["value"])
    assert pinning.pinning_decision({})["recommendation"] == "not applicable"


# --------------------------------------------------------------------------- what a rate is (review item 11)


def _sweep_table():
    """A host memcpy that peaks in the cache (87.5 GB/s at 8 MiB) and runs at 15.6 GB/s at 256 MiB."""
    mib = 2**20
    rows = [(4 * mib, 60.0), (8 * mib, 87.5), (64 * mib, 20.0), (256 * mib, 15.6)]
    return pd.DataFrame([{"method": "host_memcpy", "label": "host memcpy", "size_bytes": n, "gbps": g,
                          "gbps_p25": g * 0.9, "gbps_p75": g * 1.1, "repeats": 10} for n, g in rows])


def test_memcpy_records_name_the_main_memory_rate_as_the_reference():
    """The reviewer's case: the cache-sized peak was recorded as if it were the h2d bandwidth."""
    cache = 32 * 2**20
    summary = pinning.bandwidth_summary(_sweep_table(), cache_bytes=cache)
    row = summary.iloc[0]
    assert row["peak_gbps"] == 87.5 and row["peak_regime"] == "cache"
    assert row["largest_gbps"] == 15.6 and row["largest_regime"] == "memory"
    records = pinning.bandwidth_records(summary, cache_bytes=cache)
    assert [r["experiment"] for r in records] == ["host memcpy bandwidth"] * 2  # not "h2d"
    ref, peak = records
    assert ref["metric"] == "memcpy_bandwidth" and ref["value"] == 15.6 and ref["reference"]
    assert ref["variant"].startswith("main-memory rate (256 MiB copies")
    assert peak["metric"] == "memcpy_peak_bandwidth" and peak["value"] == 87.5 and not peak["reference"]
    assert peak["variant"] == "cache-sized peak (8 MiB copies)"
    assert ref["spread"] == {"p25": pytest.approx(15.6 * 0.9), "p75": pytest.approx(15.6 * 1.1)}


def test_a_largest_size_in_the_cache_is_not_called_main_memory():
    table = _sweep_table()
    small = table[table["size_bytes"] <= 8 * 2**20]
    ref = pinning.memcpy_reference(pinning.bandwidth_summary(small, cache_bytes=32 * 2**20), cache_bytes=32 * 2**20)
    assert ref["regime"] == "cache" and "not main memory" in ref["label"] and "main-memory rate" not in ref["label"]
    assert "max_size_mib to 64" in ref["advice"]
    unknown = pinning.memcpy_reference(pinning.bandwidth_summary(table), cache_bytes=None)
    assert unknown["regime"] == "unknown" and "cache size unknown" in unknown["label"]


def test_device_methods_are_recorded_as_h2d_with_the_link_fraction():
    table = _sweep_table().assign(method="pinned_buffer")
    records = pinning.bandwidth_records(pinning.bandwidth_summary(table, cache_bytes=32 * 2**20), link_gbps=31.5)
    assert {r["experiment"] for r in records} == {"h2d bandwidth"}
    assert {r["metric"]: r["value"] for r in records} == {"bandwidth_at_largest_size": 15.6, "peak_bandwidth": 87.5}
    assert records[1]["fraction_of_link"] == pytest.approx(87.5 / 31.5)


def test_cpu_verdict_is_not_applicable_and_quotes_the_reference():
    app = pinning.pinning_applicability(get_accelerator("cpu"))
    cache = 32 * 2**20
    ref = pinning.memcpy_reference(pinning.bandwidth_summary(_sweep_table(), cache_bytes=cache), cache_bytes=cache)
    v = pinning.pinning_decision({}, applicability=app, reference=ref)
    assert v["recommendation"] == "not applicable" and v["value"] is None and v["spread"] is None
    assert v["reason"].startswith(app.reason)
    assert "15.6 GB/s, main-memory rate" in v["reason"] and "cache-sized peak is 87.5 GB/s at 8 MiB" in v["reason"]


# --------------------------------------------------------------------------- the Verdict


def _recorded(record):
    """A record as the results file holds it, without the timestamp."""
    row = record.to_dict()
    row.pop("timestamp")
    return row


def _cell_record_as_before(store, v, reason, context, reference, **more):
    """What notebook 04's verdict cell recorded before it used pinning.verdict (kept here to compare with), with
    ``more`` fields added since."""
    return store.verdict(metric="speedup", value=v["value"], unit="x", recommendation=v["recommendation"], reason=reason,
                  context=context, action=v["action"], spread=v["spread"], method=v["method"],
                  reference={"metric": "memcpy_bandwidth", "value": reference["gbps"], "unit": "GB/s",
                             "what": f"host memcpy, {reference['label']}"}, **more)


def test_cpu_verdict_records_what_the_notebook_recorded(tmp_path):
    app = pinning_applicability(get_accelerator("cpu"))
    cache = 32 * 2**20
    ref = pinning.memcpy_reference(pinning.bandwidth_summary(_sweep_table(), cache_bytes=cache), cache_bytes=cache)
    link = LinkInfo(None, "unknown", "no link limit: the device is the CPU")
    v = pinning.verdict({}, applicability=app, reference=ref, link=link, batch_gbps={}, context="on cpu")
    assert isinstance(v, Verdict) and v.notebook == pinning.NOTEBOOK == "04_pinned_memory"
    assert (v.recommendation, v.value, v.action.setting, v.action.value) == ("not applicable", None, "pin_memory", False)
    old = pinning.pinning_decision({}, applicability=app, reference=ref)
    assert v.sentence() == f"{old['recommendation'].upper()}: {old['reason']}"
    new_store = ResultsStore(tmp_path / "new.jsonl", notebook="04_pinned_memory")
    new = new_store.add_verdict(v)
    old_store = ResultsStore(tmp_path / "old.jsonl", notebook="04_pinned_memory")
    before = _cell_record_as_before(old_store, old, old["reason"], "on cpu", ref)
    assert _recorded(new) == _recorded(before)


def test_enable_verdict_adds_the_link_fraction_as_the_notebook_did(tmp_path):
    comps = {"pin_per_batch": _comparison([0.9, 0.95, 0.92, 0.97, 0.93], "pin_per_batch"),
             "pinned_buffer": _comparison([0.5, 0.52, 0.49, 0.51, 0.5], "pinned_buffer")}
    ref = pinning.memcpy_reference(pinning.bandwidth_summary(_sweep_table(), cache_bytes=32 * 2**20),
                                   cache_bytes=32 * 2**20)
    link = LinkInfo(31.5, "parameter", "31.5 GB/s, given as the link_gbps parameter")
    rates = {"pageable": 6.3, "pin_per_batch": 7.0, "pinned_buffer": 12.6}
    v = pinning.verdict(comps, reference=ref, link=link, batch_gbps=rates, context="on a fake")
    assert v.recommendation == "enable" and v.action.value is True and v.extra["method"] == "pinned_buffer"
    assert v.reason.endswith("; that method reached 40% of the link (link limit (parameter): 31.5 GB/s) on one batch")
    old = pinning.pinning_decision(comps, reference=ref)
    new_store = ResultsStore(tmp_path / "new.jsonl", notebook="04_pinned_memory")
    new = new_store.add_verdict(v)
    old_store = ResultsStore(tmp_path / "old.jsonl", notebook="04_pinned_memory")
    reason = old["reason"] + (f"; that method reached {100 * rates['pinned_buffer'] / link.limit_gbps:.0f}% of the "
                              f"link ({link.label()}) on one batch")
    before = _cell_record_as_before(old_store, old, reason, "on a fake", ref,
                                    decision_threshold=1.05)  # the busy-machine guard's threshold (since issue 21)
    assert _recorded(new) == _recorded(before)
    # no link limit: no link sentence
    assert pinning.verdict(comps, reference=ref, batch_gbps=rates).reason == old["reason"]


def test_verdict_needs_the_chosen_methods_rate_when_the_link_is_known():
    comps = {"pinned_buffer": _comparison([0.5, 0.52, 0.49, 0.51, 0.5], "pinned_buffer")}
    link = LinkInfo(31.5, "parameter", "given")
    with pytest.raises(ParameterError, match="pinned_buffer"):
        pinning.verdict(comps, link=link, batch_gbps={"pageable": 6.3})
    assert pinning.verdict(comps).extra == {"method": "pinned_buffer", "reference": None, "decision_threshold": 1.05}


@dataclass
class Extra:
    """A dataclass leaf of a batch (module level: the loader's worker pickles the batches it returns)."""

    mask: torch.Tensor


def test_a_jobs_nested_batch_is_compared_through_its_own_copy(fake_pin):
    from helpers.jobs.supervised import move_to_device
    from helpers.pipeline.transfer import batch_nbytes

    batch = {"image": torch.zeros(2, 3, 8, 8), "label": torch.arange(2), "extra": [Extra(torch.ones(2, 4))]}
    acc = fake_accelerator()
    copies = []

    def to_device(b, non_blocking=False):
        copies.append(non_blocking)
        return move_to_device(b, acc.device, non_blocking=non_blocking)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        comps = pinning.job_batch_comparison(acc, batch, to_device, repeats=3, warmup=1)
    nbytes = 2 * 3 * 8 * 8 * 4 + 2 * 8 + 2 * 4 * 4
    assert batch_nbytes(batch) == nbytes
    assert set(comps) == {"pin_per_batch", "loader_pin_thread"}
    assert all(c.a.name == "pageable" and c.b.items_per_call == nbytes for c in comps.values())
    assert True in copies and False in copies  # pinned copies are non-blocking, pageable ones are not
    assert len(fake_pin) >= 3 * 4  # pin_per_batch pinned every tensor of every timed batch
    assert pinning.job_batch_comparison(get_accelerator("cpu"), batch, to_device) == {}


# --------------------------------------------------------------------------- the notebook's result


def _result(comparisons=None, *, link=None, app=None, job_name=None):
    cache = 32 * 2**20
    table = _sweep_table()
    summary = pinning.bandwidth_summary(table, cache_bytes=cache)
    return pinning.PinningResult(
        device="cpu (cpu)", applicability=app or pinning_applicability(get_accelerator("cpu")), refusal="",
        link=link or LinkInfo(None, "unknown", "no link limit: the device is the CPU"),
        sizes=(4 * 2**20, 256 * 2**20), batch_shape="image float32 (2, 3)" if job_name else (2, 8, 8, 3),
        batch_bytes=384, job_name=job_name, correct={}, table=table, cache_bytes=cache, summary=summary,
        reference=pinning.memcpy_reference(summary, cache_bytes=cache), comparisons=comparisons or {}, repeats=10,
        warmup=2)


def _written(records, tmp_path):
    store = ResultsStore(tmp_path / "r.jsonl", notebook="04_pinned_memory")
    return [(r.experiment, r.variant, r.metric, r.unit) for r in store.write(records)]


def test_result_on_a_cpu_records_the_link_and_the_memcpy_and_is_not_applicable(tmp_path):
    r = _result()
    assert _written(r.records(), tmp_path) == [
        ("link", "host-device link", "link_limit", "GB/s"),
        ("host memcpy bandwidth", "main-memory rate (256 MiB copies; last-level cache 32 MiB)", "memcpy_bandwidth", "GB/s"),
        ("host memcpy bandwidth", "cache-sized peak (8 MiB copies)", "memcpy_peak_bandwidth", "GB/s")]
    v = r.verdict()
    assert v.recommendation == "not applicable" and v.notebook == "04_pinned_memory"
    assert v.context == ("uint8 NHWC batch (2, 8, 8, 3) = 0.375 KiB, sizes 4 MiB to 256 MiB, 10 repeats after 2 "
                         "warm-up, on cpu (cpu); link: no link limit: the device is the CPU")
    assert r.correctness_text().startswith("skipped: ") and r.batch_text().startswith("skipped: ")
    assert r.sizes_text().splitlines()[:2] == ["2 transfer sizes from 4 MiB to 256 MiB",
                                               "one batch: uint8 NHWC (2, 8, 8, 3) = 0.375 KiB"]
    assert len(r.batch_rows) == 0
    spec = r.try_it(get_accelerator("cpu"), {"repeats": 20, "warmup": 5})
    assert spec.unavailable and spec.reference is None
    assert spec.knobs["method"].value == "pageable" and spec.knobs["size_mib"].value == 256
    line = r.write_table(tmp_path / "artifacts" / "04_pinned_memory")
    assert line.startswith("device copies skipped: ") and line.endswith(
        "4 rows written to artifacts/04_pinned_memory/bandwidth_sweep.csv")


def test_result_with_comparisons_records_each_batch_and_names_the_users_job(tmp_path):
    comps = {"pin_per_batch": _comparison([0.9, 0.95, 0.92, 0.97, 0.93], "pin_per_batch"),
             "pinned_buffer": _comparison([0.5, 0.52, 0.49, 0.51, 0.5], "pinned_buffer")}
    link = LinkInfo(31.5, "parameter", "31.5 GB/s, given as the link_gbps parameter")
    r = _result(comps, link=link, app=pinning.Applicability(True, "pinning applies"), job_name="mine")
    keys = _written(r.records(), tmp_path)
    batch = [k for k in keys if k[0] == "per-batch copy"]
    assert batch == [("per-batch copy", "pin_per_batch vs pageable", "speedup", "x"),
                     ("per-batch copy", "pageable", "time_per_batch", "s"), ("per-batch copy", "pageable", "bandwidth", "GB/s"),
                     ("per-batch copy", "pin_per_batch", "time_per_batch", "s"),
                     ("per-batch copy", "pin_per_batch", "bandwidth", "GB/s"),
                     ("per-batch copy", "pinned_buffer vs pageable", "speedup", "x"),
                     ("per-batch copy", "pinned_buffer", "time_per_batch", "s"),
                     ("per-batch copy", "pinned_buffer", "bandwidth", "GB/s")]
    assert list(r.batch_rows["method"]) == ["pageable", "pin_per_batch", "pinned_buffer"]
    v = r.verdict()
    assert v.recommendation == "enable" and v.extra["method"] == "pinned_buffer" and "% of the link" in v.reason
    assert v.context.startswith("your job 'mine''s batch (image float32 (2, 3)) = 0.375 KiB")
    assert r.try_it(get_accelerator("cpu"), {"repeats": 3, "warmup": 1}).knobs["method"].value == "pinned_buffer"


def test_sizes_read_in_binary_units_in_every_sentence_and_tick():
    from helpers.units import format_bytes

    assert [format_bytes(n) for n in (8, 1536, 4 * 2**20, 2**30, 2.5 * 2**30)] == [
        "8 B", "1.5 KiB", "4 MiB", "1 GiB", "2.5 GiB"]
