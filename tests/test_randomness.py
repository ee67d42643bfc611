"""The worker-randomness probe (helpers.pipeline.randomness): repeats before the fix, none after."""

from __future__ import annotations

import multiprocessing

import pandas as pd
import pytest

from helpers.errors import ParameterError
from helpers.pipeline.randomness import SOURCES, VARIANTS, ProbeDataset, duplicate_summary, probe, run_probe

pytestmark = pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(),
                                reason="the probe's multi-worker runs use fork here (Linux)")


@pytest.fixture(scope="module")
def result():
    return probe(epochs=2, ranks=2, num_workers=2, batch_size=2, seed=0)


def _row(result, variant, source):
    s = result.summary
    return s[(s["variant"] == variant) & (s["source"] == source)].iloc[0]


def test_every_draw_is_recorded(result):
    d = result.draws
    assert result.items == 8
    assert len(d) == 2 * 2 * 2 * 8 * len(SOURCES)  # variants x ranks x epochs x items x sources
    assert set(d["worker"]) == {0, 1}
    assert set(d["variant"]) == set(VARIANTS)
    assert d["value"].between(0, 1, inclusive="left").all()


@pytest.mark.parametrize("source", SOURCES[:2])
def test_rng_objects_from_init_repeat_across_workers_epochs_and_ranks(result, source):
    before = _row(result, VARIANTS[0], source)
    # 2 workers x 2 epochs x 2 ranks start from one state: only one worker's 4 draws are distinct
    assert before["distinct"] == 4 and before["repeated_draws"] == 28
    assert before["across_workers"] > 0 and before["across_epochs"] > 0 and before["across_ranks"] > 0


@pytest.mark.parametrize("source", SOURCES[2:])
def test_global_generators_repeat_across_ranks_only(result, source):
    before = _row(result, VARIANTS[0], source)
    assert before["across_workers"] == 0 and before["across_epochs"] == 0  # torch reseeds these per worker
    assert before["across_ranks"] == 16  # but every rank seeded alike gets the same seeds


def test_worker_init_fn_removes_every_repeat(result):
    after = result.summary[result.summary["variant"] == VARIANTS[1]]
    assert len(after) == len(SOURCES)
    assert (after["repeated_draws"] == 0).all() and (after["distinct"] == after["draws"]).all()
    assert result.duplicates(VARIANTS[1]) == 0 and result.duplicates(VARIANTS[0]) > 0


def test_the_probe_is_reproducible():
    a = run_probe(epochs=1, ranks=1, num_workers=2, items=4, fix=True, seed=3)
    b = run_probe(epochs=1, ranks=1, num_workers=2, items=4, fix=True, seed=3)
    pd.testing.assert_frame_equal(a, b)


def test_duplicate_summary_classifies_by_dimension():
    rows = [
        ("v", 0, 0, 0, 0, "s", 0.5), ("v", 0, 0, 1, 1, "s", 0.5),  # across workers
        ("v", 0, 0, 0, 2, "s", 0.7), ("v", 0, 1, 0, 2, "s", 0.7),  # across epochs
        ("v", 0, 0, 0, 3, "s", 0.9), ("v", 1, 0, 0, 3, "s", 0.9),  # across ranks
        ("v", 0, 0, 0, 4, "s", 0.1),
    ]
    draws = pd.DataFrame(rows, columns=["variant", "rank", "epoch", "worker", "index", "source", "value"])
    s = duplicate_summary(draws).iloc[0]
    assert (s["draws"], s["distinct"], s["repeated_draws"]) == (7, 4, 3)
    assert (s["across_workers"], s["across_epochs"], s["across_ranks"]) == (1, 1, 1)


def test_probe_arguments_are_checked():
    with pytest.raises(ParameterError, match="num_workers"):
        run_probe(num_workers=0)
    with pytest.raises(ParameterError, match="items"):
        run_probe(num_workers=2, items=3, batch_size=2)
    with pytest.raises(ParameterError):
        ProbeDataset(0)


def test_probe_dataset_in_the_main_process_draws_from_its_own_generators():
    ds = ProbeDataset(4, seed=1)
    rows = ds[[0, 1]]["rows"]
    assert [r[0] for r in rows] == [0, 1] and all(r[1] == -1 for r in rows)
    assert rows[0][3] != rows[1][3]  # the object generator advances within a process


def test_epoch_probe_shows_persistent_workers_repeat_epoch_0_until_the_sampler_carries_the_epoch():
    from helpers.pipeline.randomness import EPOCH_VARIANTS, epoch_probe

    out = epoch_probe(epochs=3, num_workers=2, items=8, seed=1).set_index("variant")
    assert out.loc[EPOCH_VARIANTS[0], "repeated_items"] == 0  # fresh workers copy the new epoch
    assert out.loc[EPOCH_VARIANTS[1], "repeated_items"] == 16  # every item, in both later epochs
    assert out.loc[EPOCH_VARIANTS[1], "epochs_seen"] == "0, 0, 0"
    assert out.loc[EPOCH_VARIANTS[2], "repeated_items"] == 0
    assert out.loc[EPOCH_VARIANTS[2], "epochs_seen"] == "0, 1, 2"
