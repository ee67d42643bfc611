"""The Verdict type: validated fields, the action stored as fields, and the round trip through a results file."""

from __future__ import annotations

import pytest

from helpers.errors import ParameterError
from helpers.results import ResultsStore, load_results, verdicts
from helpers.verdict import Action, Verdict


def test_round_trip_through_the_results_file(tmp_path):
    path = tmp_path / "results.jsonl"
    v = Verdict(notebook="03_dataloader_tuning", metric="speedup", value=1.4, unit="x", recommendation="enable",
                reason="use workers=2: 1.40x num_workers=0", spread={"ci_low": 1.2, "ci_high": 1.6},
                repeats=3, action=Action("num_workers", 2, "DataLoader workers=2", current=0),
                context="batch 32", extra={"best_setting": "workers=2"})
    ResultsStore(path, notebook="03_dataloader_tuning").add_verdict(v)
    row = verdicts(load_results(path)).iloc[0].to_dict()
    back = Verdict.from_record(row)
    assert back.action == v.action and back.value == 1.4 and back.context == "batch 32"
    assert back.extra["best_setting"] == "workers=2" and back.repeats == 3
    assert row["extra"]["action"] == {"setting": "num_workers", "value": 2, "text": "DataLoader workers=2",
                                      "current": 0}


@pytest.mark.parametrize("kwargs, match", [
    (dict(recommendation="maybe"), "not one of"),
    (dict(reason=" "), "non-empty sentence"),
    (dict(value=float("nan")), "not a finite"),
    (dict(action="enable it"), "Action or None"),
])
def test_bad_fields_are_rejected(kwargs, match):
    base = dict(notebook="06_mixed_precision", metric="speedup", value=1.0, unit="x", recommendation="enable",
                reason="r")
    with pytest.raises(ParameterError, match=match):
        Verdict(**{**base, **kwargs})


def test_action_values_must_be_json_scalars():
    with pytest.raises(ParameterError, match="Action.value"):
        Action("batch_size", [32, 64], "batch size")
    with pytest.raises(ParameterError, match="Action.text"):
        Action("batch_size", 32, "")
    assert Action.from_dict({"setting": "x"}) is None and Action.from_dict(None) is None


def test_a_store_records_only_its_own_notebooks_verdict(tmp_path):
    store = ResultsStore(tmp_path / "r.jsonl", notebook="04_pinned_memory")
    v = Verdict(notebook="05_stream_overlap", metric="m", value=None, unit="", recommendation="not applicable",
                reason="no streams")
    with pytest.raises(ParameterError, match="05_stream_overlap"):
        store.add_verdict(v)


def test_store_verdict_rejects_an_action_of_another_type(tmp_path):
    store = ResultsStore(tmp_path / "r.jsonl", notebook="04_pinned_memory")
    with pytest.raises(ParameterError, match="helpers.verdict.Action"):
        store.verdict(metric="m", value=1.0, unit="x", recommendation="enable", reason="r",
                      action={"setting": "pin_memory"})
