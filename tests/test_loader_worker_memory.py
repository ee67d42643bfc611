"""The memory of a loader's processes: USS/PSS/RSS of the main process and each worker (helpers.pipeline.worker_memory).

The test runs two workers (this machine has 2 cores) and checks that none is left behind.
"""

from __future__ import annotations

import pytest
from loader_support import FORK, no_stray_workers  # noqa: F401  (no_stray_workers: a fixture)

from helpers.experiments.loader_sweep import MetadataDataset
from helpers.pipeline.guarded import iterate
from helpers.pipeline.loader import LoaderConfig, make_batch_sampler, make_loader
from helpers.pipeline.worker_memory import measure_epoch_memory


@pytest.mark.skipif(not FORK, reason="worker memory sharing is shown with fork")
def test_epoch_memory_reads_uss_pss_of_main_and_each_worker(no_stray_workers):
    ds = MetadataDataset(2000, "objects")
    cfg = LoaderConfig(batch_size=200, num_workers=2, timeout_s=30)
    loader = make_loader(ds, cfg, batch_sampler=make_batch_sampler(len(ds), cfg))
    with iterate(loader) as it:
        expected = {w.pid for w in it._it._workers}  # torch's own record of its workers
        assert set(it.worker_pids) == expected
    df = measure_epoch_memory(loader, label="objects")
    assert list(df["moment"].unique()) == ["start", "end"]
    assert sorted(df["role"].unique()) == ["main", "worker 0", "worker 1"]
    assert df.loc[df["moment"] == "end", "batches"].iloc[0] == len(loader) == 10
    assert (df["uss_mib"] > 0).all() and (df["pss_mib"] > 0).all() and (df["rss_mib"] >= df["uss_mib"]).all()
    workers = df[df["role"] != "main"]
    assert (workers["rss_mib"] > workers["uss_mib"]).all()  # forked workers share pages with the main process
