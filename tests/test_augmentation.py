"""Random augmentations on a user's job: the same sample gets the same augmentation in every configuration.

The jobs (tests/augment_jobs.py) draw their crops and flips from Python's ``random``, NumPy's global
generator, torch's generator (torchvision-style) and an RNG object made in the dataset's ``__init__``.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers.device import get_accelerator
from helpers.errors import SampleError, user_frame
from helpers.experiments.training import same_values
from helpers.jobs.base import PerItemBatches
from helpers.pipeline.guarded import iterate
from helpers.pipeline.loader import LoaderConfig
from helpers.pipeline.sampler import EpochIndices

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import augment_jobs  # noqa: E402

SOURCES = ("random", "numpy", "torch", "object", "mixed")


@pytest.fixture(scope="module")
def cpu():
    return get_accelerator("cpu")


def _job(source, **kw):
    return getattr(augment_jobs, f"make_{'object_rng' if source == 'object' else source}_job")(
        max_images=32, batch_size=8, **kw)


def _batches(job, acc, num_workers, n=2):
    ds = job.make_dataset()
    cfg = LoaderConfig(batch_size=job.workload.batch_size, num_workers=num_workers,
                       prefetch_factor=2 if num_workers else None)
    with iterate(job.make_loader(ds, cfg, acc), name=f"num_workers={num_workers}") as it:
        return it.take(n)


@pytest.mark.parametrize("source", SOURCES)
def test_the_same_sample_gets_the_same_augmentation_in_every_configuration(source, cpu):
    job = _job(source)
    ds = job.make_dataset()
    batch = EpochIndices([3, 5, 7], epoch=0)
    first, again = ds[batch], ds[batch]
    assert same_values(first, again)  # read twice in the main process
    assert not same_values(first, ds[EpochIndices([3, 5, 7], epoch=1)])  # a new epoch draws anew
    main, workers = _batches(job, cpu, 0), _batches(job, cpu, 2)
    assert len(main) == len(workers) == 2
    assert all(same_values(a, b) for a, b in zip(main, workers))  # main process and two workers


@pytest.mark.parametrize("source", ("random", "torch", "mixed"))
def test_without_per_sample_seeds_the_comparison_would_fail(source, cpu):
    # the check above is not vacuous: the same dataset read without the workbook's seeding differs
    job = _job(source)
    raw = PerItemBatches(job.dataset, collate=torch.utils.data.default_collate)
    batch = EpochIndices([3, 5, 7], epoch=0)
    assert not same_values(raw[batch], raw[batch])


def test_the_users_generators_are_left_as_they_were(cpu):
    ds = _job("numpy").make_dataset()
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    ds[EpochIndices([0, 1], epoch=0)]
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected
    obj = _job("object").make_dataset()
    state = obj.dataset.rng.bit_generator.state
    obj[EpochIndices([0, 1], epoch=0)]
    assert obj.dataset.rng.bit_generator.state == state
    assert obj.seeder.reseeded == ("dataset.rng",)


class Raises37(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        if i == 37:
            raise ValueError(f"cannot read sample {i}")
        return torch.full((3,), float(i)), i % 2


def test_a_sample_that_raises_is_named_by_its_index_and_the_users_frame(cpu):
    ds = PerItemBatches(Raises37(), collate=torch.utils.data.default_collate, sample_seed=0)
    with pytest.raises(SampleError) as exc:
        ds[[36, 37, 38]]
    err = exc.value
    assert err.index == 37 and err.where.startswith("test_augmentation.py:") and err.where.endswith("__getitem__")
    assert str(err).startswith("dataset[37] raised ValueError: cannot read sample 37 (at test_augmentation.py:")
    assert isinstance(err.__cause__, ValueError)
    # through a DataLoader worker: torch re-raises it from a traceback text; the index and place survive
    from helpers.jobs.supervised import supervised_job

    job = supervised_job(Raises37(), lambda: torch.nn.Linear(3, 2), torch.nn.functional.cross_entropy,
                         lambda p: torch.optim.SGD(p, lr=0.1), batch_size=64, seed=0)
    cfg = LoaderConfig(batch_size=64, num_workers=1, prefetch_factor=2)
    with pytest.raises(SampleError) as exc:
        with iterate(job.make_loader(job.make_dataset(), cfg, cpu), name="one worker") as it:
            it.take(1)
    err = exc.value
    assert err.index == 37 and "__getitem__" in err.where
    assert str(err).startswith("dataset[37] raised ValueError: cannot read sample 37")
    assert "worker process 0" in str(err) and "\n" not in str(err)


def test_user_frame_prefers_the_users_code():
    try:
        Raises37()[37]
    except ValueError as exc:
        assert user_frame(exc.__traceback__).startswith("test_augmentation.py:")
    assert user_frame(None) == "" and user_frame([]) == ""


@pytest.mark.slow
@pytest.mark.notebook
def test_notebooks_03_and_05_reach_a_verdict_on_an_augmented_job(tmp_path, monkeypatch):
    """One run on the job that draws from ``random``, NumPy and torch in every sample (each source alone is
    checked above, without the runner): the notebooks that compare loaders with and without workers. Notebook 10
    compares them with the same check (helpers.experiments.training.same_values) and runs on a job file in
    test_user_job.py; here it took 14 s more."""
    from helpers.results import load_results, verdicts
    from helpers.workbook.runner import RunOptions, run

    monkeypatch.chdir(ROOT)
    source, factory = "mixed", "make_mixed_job"
    run_dir, state = run(RunOptions(profile="smoke", device="cpu", only=("03", "05"),
                                    job=f"tests/augment_jobs.py:{factory}", out=tmp_path / "run",
                                    timeout_s=600), echo=print)
    assert state.status == "ok", {n.id: n.error for n in state.notebooks if n.status != "ok"}
    table = verdicts(load_results(run_dir / "results.jsonl")).set_index("notebook")
    for nb in ("03_dataloader_tuning", "05_stream_overlap"):
        assert nb in table.index, f"{nb} recorded no verdict"
        assert f"augmented photos ({source})" in table.loc[nb, "extra"]["context"]


class Unseedable(torch.utils.data.Dataset):
    """Augmentations from a fresh OS-seeded generator per call: nobody can reproduce them."""

    def __len__(self):
        return 32

    def __getitem__(self, i):
        return torch.from_numpy(np.random.default_rng().random(4).astype(np.float32)) + i, i % 3


def test_unseedable_augmentations_are_compared_by_order_labels_shapes_and_dtypes(cpu):
    from helpers.experiments.training import batch_agreement
    from helpers.jobs.supervised import supervised_job
    from helpers.pipeline.prefetch import verify_prefetcher

    job = supervised_job(Unseedable(), lambda: torch.nn.Linear(4, 3), torch.nn.functional.cross_entropy,
                         lambda p: torch.optim.SGD(p, lr=0.1), batch_size=8, seed=0)
    main, workers = _batches(job, cpu, 0), _batches(job, cpu, 2)
    agreement = batch_agreement(main, workers, reread=lambda: _batches(job, cpu, 0, n=1)[0])
    assert not agreement.identical and not agreement.reproducible and agreement.structure_equal and agreement.ok
    assert "cannot seed" in agreement.sentence()
    # a wrong label is still caught
    bad = [(x, y + 1) for x, y in workers]
    assert not batch_agreement(main, bad, reread=lambda: _batches(job, cpu, 0, n=1)[0]).ok
    # a reproducible job whose batches differ is caught too (no excuse of unseedable randomness)
    seeded = _job("torch")
    a = _batches(seeded, cpu, 0)
    assert not batch_agreement(a, [(x + 1, y) for x, y in a], reread=lambda: _batches(seeded, cpu, 0, n=1)[0]).ok

    ds = job.make_dataset()

    def one_epoch():
        return (ds[b] for b in job.batch_sampler(len(ds)))

    check = verify_prefetcher(one_epoch, cpu, transfer=lambda b, acc, non_blocking=False: job.to_device(b, acc))
    assert check["identical"] < check["batches"] == check["structure_equal"] and not check["reproducible"]
