"""Notebook 03's experiment: the loader sweep and its demonstration datasets (helpers.experiments.loader_sweep).

Multi-worker tests are few and small (this machine has 2 cores); each one
checks that no worker process is left behind.
"""

from __future__ import annotations

import math
import time

import pytest
import torch
from loader_support import FORK, Numbers, no_stray_workers  # noqa: F401  (no_stray_workers: a fixture)
from torch.utils.data import Dataset

from helpers.errors import DataError, ParameterError
from helpers.experiments import loader_sweep as S
from helpers.experiments.loader_sweep import (
    LoaderSetting,
    MetadataDataset,
    batches_equal,
    run_sweep,
    sweep_settings,
)
from helpers.pipeline.guarded import iterate
from helpers.pipeline.loader import (
    TORCH_DEFAULT_PREFETCH,
    LoaderConfig,
    make_batch_sampler,
    make_loader,
)


# --------------------------------------------------------------------------- demonstration datasets, same batches


@pytest.mark.skipif(not FORK, reason="needs the fork start method (Linux)")
def test_workers_give_the_same_batches_as_the_main_process(no_stray_workers):
    base = LoaderConfig(batch_size=4, seed=5)
    ds = Numbers(24)
    ref = [b for b in make_loader(ds, base, batch_sampler=make_batch_sampler(24, base))]
    cfg = base.with_(num_workers=2, prefetch_factor=2, timeout_s=30)
    got = list(iterate(make_loader(ds, cfg, batch_sampler=make_batch_sampler(24, cfg))))
    assert len(got) == len(ref) == 6
    assert all(batches_equal(x, y) for x, y in zip(ref, got))
    assert not batches_equal(ref[0], ref[1])


def test_metadata_dataset_reads_the_same_values_either_way():
    a, b = MetadataDataset(50, "arrays", seed=2), MetadataDataset(50, "objects", seed=2)
    x, y = a[[0, 7, 49]], b[[0, 7, 49]]
    assert torch.equal(x["label"], y["label"])
    assert (y["caption_chars"] > x["caption_chars"]).all()  # the object captions carry a number suffix
    with pytest.raises(ParameterError):
        MetadataDataset(5, "lists")


# --------------------------------------------------------------------------- the sweep


def test_sweep_settings_cover_the_grid_with_zero_once():
    s = sweep_settings([2, 1, 2], [4, 2])
    assert s[0] == LoaderSetting(0)
    assert len(s) == 1 + 2 * 2 * 2
    assert LoaderSetting(2, 4, True) in s and LoaderSetting(1, 2, False) in s
    assert sweep_settings([1], [2])[0].label == "workers=0"  # the reference is always there
    with pytest.raises(ParameterError):
        sweep_settings([1], [])
    with pytest.raises(ParameterError):
        sweep_settings([-1], [2])


@pytest.mark.skipif(not FORK, reason="needs the fork start method (Linux)")
def test_sweep_times_every_setting_in_rotated_order(no_stray_workers):
    settings = (LoaderSetting(0), LoaderSetting(1, 2, False), LoaderSetting(1, 2, True))
    base = LoaderConfig(batch_size=4, timeout_s=30)
    result = run_sweep(lambda s: Numbers(20), 20, settings, base=base, batches_per_trial=3, trials=3)
    t = result.trials
    assert len(t) == 9 and set(t["setting"]) == {s.label for s in settings}
    assert (t["images"] == 12).all() and (t["elapsed_s"] > 0).all() and (t["first_batch_s"] > 0).all()
    first_in_round = t[t["position"] == 0].sort_values("trial")["setting"].tolist()
    assert first_in_round == [s.label for s in settings]  # each round starts one setting later
    m = result.measurement("workers=1, prefetch=2")
    assert m.repeats == 3 and m.items_per_call == 12
    summary = result.summary()
    assert list(summary["images_per_s"]) == sorted(summary["images_per_s"], reverse=True)
    assert result.ranking()[0] == summary["setting"].iloc[0]
    c = result.compare("workers=0", result.ranking()[0])
    assert c.ci_low <= c.ratio <= c.ci_high
    with pytest.raises(ParameterError, match="no setting"):
        result.measurement("workers=9")


def test_in_flight_is_workers_times_prefetch():
    assert LoaderSetting(0).in_flight == 0
    assert LoaderSetting(3, 4, True).in_flight == 12
    assert LoaderSetting(2, None).in_flight == 2 * TORCH_DEFAULT_PREFETCH
    assert LoaderSetting(0).min_timed_batches == 1 and LoaderSetting(3, 2).min_timed_batches == 6
    short = S.SweepResult(trials=None, settings=(LoaderSetting(0), LoaderSetting(3, 2)), batch_size=2,
                          batches_per_trial=4)
    assert short.short_windows() == ["workers=3, prefetch=2"]


def test_the_window_never_counts_batches_finished_before_the_clock():
    # clock starts at 10 s; two batches were ready before it (prepared ahead), however late they are consumed
    stamps = [9.0, 10.4, 9.5, 10.2, 10.9, 10.6, 11.0]
    start, end, ahead = S.completion_window(10.0, stamps, 3)
    assert ahead == 2
    assert (start, end) == (10.2, 10.9)  # opens on the first completion after the clock, holds 3 more
    assert S.completion_window(10.0, stamps, 4)[1] == 11.0
    with pytest.raises(DataError, match="only 5 of the 7 batches finished after the clock"):
        S.completion_window(10.0, stamps, 5)
    with pytest.raises(ParameterError):
        S.completion_window(10.0, stamps, 0)


def test_a_speedup_above_the_core_count_is_flagged_as_implausible():
    note = S.speedup_plausibility(6.61, 2)
    assert note is not None and "6.61x" in note and "2 usable core(s)" in note and "not physically possible" in note
    assert "batches_per_trial" in note  # what to do
    assert S.speedup_plausibility(1.9, 2) is None and S.speedup_plausibility(2.0, 2) is None
    assert S.speedup_plausibility(float("nan"), 4) is not None
    with pytest.raises(ParameterError):
        S.speedup_plausibility(1.0, 0)
    # with its interval: only a whole interval above the core count is impossible
    assert S.speedup_plausibility(2.21, 2, ci_low=1.83) is None
    note = S.speedup_plausibility(6.61, 2, ci_low=4.9)
    assert note is not None and "6.61x speed-up (95% CI from 4.90x)" in note


class _Straggler(Dataset):
    """Batched dataset: every batch takes SLEEP_S in a worker, except worker 1's first, which takes 20x longer.

    While worker 1 is stuck on its first batch, worker 0 finishes its queue
    and the batches sent to it as the consumer moves on: those are ready
    before the sweep's clock starts.
    """

    SLEEP_S = 0.03

    def __init__(self, n):
        self.n, self.calls = n, 0

    def __len__(self):
        return self.n

    def __getitem__(self, indices):
        info = torch.utils.data.get_worker_info()
        first = self.calls == 0
        self.calls += 1
        time.sleep(self.SLEEP_S * (20 if (info is not None and info.id == 1 and first) else 1))
        idx = torch.as_tensor(indices, dtype=torch.int64)
        return {"label": idx}


@pytest.mark.skipif(not FORK, reason="needs the fork start method (Linux)")
def test_the_sweep_excludes_batches_prepared_before_the_clock(no_stray_workers):
    setting = LoaderSetting(2, 4, False)
    n = 4
    result = run_sweep(lambda s: _Straggler(8), 8, (setting,), base=LoaderConfig(batch_size=2, timeout_s=30),
                       batches_per_trial=n, trials=1)
    row = result.trials.iloc[0]
    assert row["clock"] == "completion" and row["drained"] == setting.in_flight == 8
    assert row["prepared_ahead"] >= 1  # worker 0 ran ahead while worker 1 was stuck: those were not counted
    assert row["images"] == n * 2
    # physical floor: n + 1 completions (the window's two ends included) shared by 2 workers, each at least
    # SLEEP_S apart within a worker, span at least (ceil((n + 1) / 2) - 1) x SLEEP_S
    assert row["elapsed_s"] >= (math.ceil((n + 1) / 2) - 1) * _Straggler.SLEEP_S
    assert result.summary()["prepared_ahead_max"].iloc[0] == row["prepared_ahead"]
    assert result.short_windows() == []  # 4 timed batches = 2 per worker


@pytest.mark.skipif(not FORK, reason="needs the fork start method (Linux)")
def test_a_sweep_trial_spans_epochs_of_a_one_batch_dataset(no_stray_workers):
    # 5 items, batch 4: one batch per epoch; a trial needs drain + timed + tail batches
    settings = (LoaderSetting(0), LoaderSetting(1, 2, True))
    result = run_sweep(lambda s: Numbers(5), 5, settings, base=LoaderConfig(batch_size=4, timeout_s=30),
                       batches_per_trial=3, trials=2)
    assert len(result.trials) == 4 and (result.trials["images"] == 12).all()
    assert (result.trials["elapsed_s"] > 0).all()


def test_the_first_batch_panel_labels_the_num_workers_0_line():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    from helpers.workbook.plots_loader import throughput_vs_workers

    summary = pd.DataFrame({
        "setting": ["workers=0", "workers=1, prefetch=2"], "num_workers": [0, 1], "prefetch_factor": [None, 2.0],
        "persistent_workers": [False, False], "images_per_s": [100.0, 150.0], "images_per_s_p25": [90.0, 140.0],
        "images_per_s_p75": [110.0, 160.0], "first_batch_s": [0.004, 0.08],
    })
    fig = throughput_vs_workers(summary, cores=2)
    try:
        panel = fig.axes[1]
        assert any(t.get_text().startswith("num_workers=0 (4 ms)") for t in panel.texts)
    finally:
        plt.close(fig)


# --------------------------------------------------------------------------- the notebook's result


def _sweep(times: dict, batches_per_trial: int = 4, batch_size: int = 8):
    import pandas as pd

    settings = tuple(LoaderSetting(*k) for k in times)
    rows = [{"setting": s.label, "elapsed_s": t, "first_batch_s": 0.1 * (1 + s.num_workers), "prepared_ahead": 0}
            for s, ts in zip(settings, times.values()) for t in ts]
    return S.SweepResult(trials=pd.DataFrame(rows), settings=settings, batch_size=batch_size,
                         batches_per_trial=batches_per_trial)


def _loader_result(*, workers_win: bool, builtin: bool = True):
    import pandas as pd
    from types import SimpleNamespace

    from helpers.pipeline.randomness import VARIANTS

    times = {(0, None, False): (1.0, 1.02, 0.98), (2, 2, False): ((0.4, 0.41, 0.39) if workers_win else (2.0, 2.1, 1.9))}
    sweep = _sweep(times)
    best = LoaderSetting(2, 2, False)
    confirmation = _sweep({(0, None, False): (1.0, 1.01, 0.99), (2, 2, False): (0.6, 0.61, 0.59)}) if workers_win else None
    probe = SimpleNamespace(items=8, epochs=2, ranks=2, duplicates=lambda v: 5 if v == VARIANTS[0] else 0,
                            summary=pd.DataFrame({"variant": list(VARIANTS), "repeated_draws": [5, 0], "draws": [80, 80]}))
    epoch = pd.DataFrame({"variant": ["a", "b"], "repeated_items": [0, 8], "items": [8, 8], "later_epochs": [1, 1],
                          "persistent_workers": [False, True]})
    growth = pd.DataFrame({"start": [10.0, 5.0], "end": [12.0, 5.5]},
                          index=pd.MultiIndex.from_tuples([("batched pipeline", "main"), ("batched pipeline", "worker 0")],
                                                          names=["loader", "role"])).assign(growth_mib=[2.0, 0.5])
    return S.LoaderResult(
        params={"seed": 0, "trials": 3, "batches_per_trial": 4, "batch_size": 8, "image_size": 64, "data_dir": "",
                "num_workers_list": [0, 2], "prefetch_factor_list": [2], "probe_epochs": 2, "probe_ranks": 2,
                "job": "" if builtin else "my_job.py:make_job"},
        device_kind="cpu", cores=2, method=SimpleNamespace(method="fork", source="default", explanation="a copy"),
        builtin=builtin, job_spec="" if builtin else "my_job.py:make_job",
        job_describe={"job": "built-in PPO job" if builtin else "mine", "batch_size": 8}, n_items=24, batch_size=8,
        data={"images": 24, "classes": 3, "skipped": []} if builtin else {}, agreement="identical",
        settings=sweep.settings, sweep=sweep, probe=probe, epoch_result=epoch, memory=None, growth=growth,
        confirmation=confirmation, confirm_batches=4)


def _record_keys(records):
    return [(c[1][0], c[1][1] if c[0] != "add_comparison" else None) for c in records.calls]


def test_the_loader_result_records_the_notebooks_sections_in_order():
    keys = _record_keys(_loader_result(workers_win=True).records())
    experiments = [k[0] for k in keys]
    assert experiments == ["machine", "dataset", "loader sweep", "first batch", "loader sweep", "first batch",
                           "best vs next", "best vs num_workers=0 (sweep, best chosen)", "worker randomness",
                           "worker randomness", "epoch in workers", "epoch in workers", "worker memory",
                           "best vs num_workers=0 (held-out confirmation)"]
    assert keys[1] == ("dataset", "usable images") and ("worker memory", "batched pipeline, worker 0") in keys
    user = _record_keys(_loader_result(workers_win=False, builtin=False).records())
    assert user[1] == ("dataset", "your job")
    assert not any(k[0].startswith("best vs num_workers=0") for k in user)  # num_workers=0 won: nothing to confirm


def test_the_loader_result_decides_from_the_held_out_confirmation():
    win = _loader_result(workers_win=True)
    v = win.verdict()
    assert v.notebook == "03_dataloader_tuning" and v.recommendation == "enable" and v.action.value == 2
    assert "held-out confirmation trials of workers=2, prefetch=2 against num_workers=0" in v.context
    assert "batched pipeline" in v.context and "confirmation, 3 new trials" in win.confirmation_text
    lose = _loader_result(workers_win=False, builtin=False)
    v = lose.verdict()
    assert v.recommendation == "leave off" and "samples/s" in v.reason and "your job's dataset (mine)" in v.context
    assert lose.confirmation_text == "num_workers=0 won the sweep: there is nothing to confirm"


def test_the_loader_results_panel_starts_at_the_chosen_setting():
    from helpers.live import TrySpec

    spec = _loader_result(workers_win=True).try_it(None, {"num_workers_list": [0, 2], "prefetch_factor_list": [2],
                                                          "batches_per_trial": 4, "trials": 3})
    assert isinstance(spec, TrySpec) and spec.knobs["num_workers"].value == 2
    assert spec.knobs["prefetch_factor"].value == 2 and spec.knobs["persistent_workers"] is False
    assert spec.reference.label == "workers=2, prefetch=2"
