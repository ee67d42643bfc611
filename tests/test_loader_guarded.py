"""Guarded iteration: loader failures become DataErrors, no worker left behind, skip logs (helpers.pipeline.guarded).

Multi-worker tests are few and small (this machine has 2 cores); each one
checks that no worker process is left behind.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from loader_support import FORK, Numbers, no_stray_workers  # noqa: F401  (no_stray_workers: a fixture)
from torch.utils.data import Dataset

from helpers.errors import DataError, ParameterError
from helpers.experiments.loader_sweep import FaultyDataset
from helpers.pipeline import guarded as G
from helpers.pipeline.guarded import SkipLog, explain_loader_error, iterate, run_epoch
from helpers.pipeline.loader import LoaderConfig, make_batch_sampler, make_loader


# --------------------------------------------------------------------------- running out of batches


def test_asking_for_more_batches_than_an_epoch_makes_is_a_data_error_that_says_what_to_change():
    cfg = LoaderConfig(batch_size=8)
    loader = make_loader(Numbers(12), cfg, batch_sampler=make_batch_sampler(12, cfg))  # one batch per epoch
    with iterate(loader, name="first batches") as it:
        with pytest.raises(DataError) as exc:
            it.take(2)
    msg = str(exc.value)
    assert exc.value.__cause__ is None and exc.value.__suppress_context__  # no bare StopIteration behind it
    assert "first batches" in msg and "after 1 batch(es) but 2 were asked for" in msg
    assert "12 item(s)" in msg and "batch_size=8" in msg and "lower the batch size" in msg
    assert "num_batches=2" in msg
    # the fix it names works: the sampler iterates across epochs
    loader = make_loader(Numbers(12), cfg, batch_sampler=make_batch_sampler(12, cfg, num_batches=2))
    with iterate(loader) as it:
        got = it.take(2)
    assert len(got) == 2 and all(b["label"].shape == (8,) for b in got)
    with pytest.raises(ParameterError):
        it.take(-1)


# --------------------------------------------------------------------------- failures become DataErrors


@pytest.mark.skipif(not FORK, reason="needs the fork start method (Linux)")
def test_a_hung_worker_becomes_an_error_within_the_timeout(monkeypatch, no_stray_workers):
    terminated = []
    terminate = G.LoaderIterator._terminate_workers

    def spy(self):
        terminated.extend(self.worker_pids)
        terminate(self)

    monkeypatch.setattr(G.LoaderIterator, "_terminate_workers", spy)
    loader = make_loader(FaultyDataset(8, "hang"), LoaderConfig(batch_size=2, num_workers=1, timeout_s=1.0))
    t0 = time.perf_counter()
    with pytest.raises(DataError) as exc:
        run_epoch(loader, name="hang test")
    elapsed = time.perf_counter() - t0
    msg = str(exc.value)
    assert "hang test" in msg and "timeout=1 s" in msg and "num_workers=1" in msg and "__getitem__" in msg
    assert elapsed < 1.0 + G._TORCH_WORKER_JOIN_S + 5  # the timeout, plus stopping the stuck worker
    assert len(terminated) == 1  # stopped at once, not after torch's 5 s join (no_stray_workers: and it is gone)


def _hung_epoch(loader) -> str:
    """run_epoch's DataError on a loader whose dataset never returns from index 5 (fault_jobs.Squares)."""
    with pytest.raises(DataError) as exc:
        run_epoch(loader, name="hang test")
    return str(exc.value)


@pytest.mark.parametrize("method, timeout_s", [
    pytest.param("fork", 2.0, marks=pytest.mark.skipif(not FORK, reason="needs the fork start method (Linux)")),
    pytest.param("spawn", 15.0, marks=pytest.mark.slow),  # the tracker and its table pickled to fresh interpreters
])
def test_a_hung_worker_is_named_with_its_pid_and_the_sample_it_is_stuck_in(method, timeout_s, no_stray_workers):
    """Issue 36: the timeout named no worker and no sample. Batches of 2 in order, 2 workers taking turns: worker 0's
    second batch is [4, 5], and it never returns from index 5."""
    from fault_jobs import Squares

    loader = make_loader(Squares(16, hang=5), LoaderConfig(batch_size=2, num_workers=2, timeout_s=timeout_s,
                                                           shuffle=False, multiprocessing_context=method))
    msg = _hung_epoch(loader)
    pids = {r.worker: r.pid for r in loader.worker_init_fn.rows()}  # what the workers recorded, kept after them
    m = re.search(r"worker (\d) \(pid (\d+)\), whose batch the loop waits for, has been in __getitem__\(index 5\) "
                  r"for ([\d.]+) s", msg)
    assert m, msg
    assert int(m.group(1)) == 0 and int(m.group(2)) == pids[0] and float(m.group(3)) >= 0.5 * timeout_s


@pytest.mark.skipif(not FORK, reason="needs the fork start method (Linux)")
def test_a_loader_built_by_hand_is_tracked_by_the_guard_and_the_unknown_is_said_plainly(no_stray_workers):
    from fault_jobs import Squares
    from torch.utils.data import DataLoader

    from helpers.pipeline.worker_progress import WorkerProgress, stuck_workers_sentence

    seed = lambda worker_id: None  # noqa: E731  the user's own worker_init_fn is kept, and called first
    loader = DataLoader(Squares(16, hang=3), batch_size=2, num_workers=1, timeout=2.0, worker_init_fn=seed)
    msg = _hung_epoch(loader)
    assert isinstance(loader.worker_init_fn, WorkerProgress) and loader.worker_init_fn.inner is seed
    assert re.search(r"worker 0 \(pid \d+\), whose batch the loop waits for, has been in __getitem__\(index 3\)", msg)
    # no table to read: said in as many words
    assert stuck_workers_sentence(None).startswith("which worker is stuck and in which sample is not known: this "
                                                   "loader's workers do not record what they load")
    assert G.explain_loader_error(RuntimeError("DataLoader timed out after 2 seconds"), loader) is not None
    assert "which worker is stuck and in which sample is not known" in str(
        G.explain_loader_error(RuntimeError("DataLoader timed out after 2 seconds"), loader))


@pytest.mark.skipif(not FORK, reason="needs the fork start method (Linux)")
def test_a_worker_that_exits_becomes_a_clear_error(no_stray_workers):
    loader = make_loader(FaultyDataset(8, "exit"), LoaderConfig(batch_size=2, num_workers=2, timeout_s=30.0))
    with pytest.raises(DataError) as exc:
        run_epoch(loader, name="exit test")
    msg = str(exc.value)
    assert "worker process died" in msg and "num_workers=2" in msg and "num_workers=0" in msg
    assert isinstance(exc.value.__cause__, RuntimeError)


@pytest.mark.skipif(not FORK, reason="needs the fork start method (Linux)")
def test_a_worker_dying_while_the_epoch_starts_is_a_clear_error_too(monkeypatch, no_stray_workers):
    # a worker that exits at once makes torch's SIGCHLD handler raise while iterate() looks the workers up
    def dying(before):
        raise RuntimeError("DataLoader worker (pid 1) exited unexpectedly with exit code 1. Details are lost")

    monkeypatch.setattr(G, "_new_workers", dying)
    loader = make_loader(Numbers(8), LoaderConfig(batch_size=2, num_workers=2, timeout_s=30.0))
    with pytest.raises(DataError, match="worker process died"):
        iterate(loader, name="start test")


@pytest.mark.filterwarnings("ignore:Got pickle error:UserWarning")
def test_a_dataset_that_cannot_be_pickled_under_spawn_names_the_fix(no_stray_workers):
    class DefinedInACell(Dataset):  # a local class: spawn cannot pickle it, as with a notebook's __main__ class
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return i

    loader = make_loader(DefinedInACell(), LoaderConfig(batch_size=2, num_workers=1, multiprocessing_context="spawn"))
    with pytest.raises(DataError) as exc:
        iterate(loader, name="spawn test")
    msg = str(exc.value)
    assert "cannot be sent to the worker" in msg and "'spawn'" in msg and "module" in msg


def _fail_like_a_notebook_class():
    raise AttributeError("Can't get attribute 'MyDataset' on <module '__main__' (built-in)>")


class _UnpicklesBadly(Dataset):
    """Pickles fine here, fails to unpickle in a spawned worker (as a notebook-defined class does)."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return i

    def __reduce__(self):
        return (_fail_like_a_notebook_class, ())


@pytest.mark.slow
def test_a_worker_that_cannot_load_the_dataset_under_spawn_is_reported(no_stray_workers):
    loader = make_loader(_UnpicklesBadly(), LoaderConfig(batch_size=2, num_workers=1, timeout_s=60.0,
                                                         multiprocessing_context="spawn"))
    t0 = time.perf_counter()
    with pytest.raises(DataError) as exc:
        run_epoch(loader, name="spawn worker")
    assert "worker process died" in str(exc.value) and "Can't get attribute" in str(exc.value)
    assert time.perf_counter() - t0 < 30  # noticed when the worker dies, not at the 60 s timeout


def test_pin_thread_and_dataset_errors_are_told_apart():
    loader = make_loader(list(range(4)), LoaderConfig(batch_size=2))
    pin = explain_loader_error(RuntimeError("Pin memory thread exited unexpectedly"), loader, name="pinned")
    assert isinstance(pin, DataError) and "pin_memory=True" in str(pin) and "pin_memory=False" in str(pin)
    own = RuntimeError("Caught RuntimeError in DataLoader worker process 0.\nOriginal Traceback: timed out after x")
    assert explain_loader_error(own, loader) is None  # the dataset's own error stays as it is
    assert explain_loader_error(ValueError("bad value"), loader) is None


@pytest.mark.skipif(not FORK, reason="needs the fork start method (Linux)")
def test_the_fault_demo_of_the_notes_turns_each_fault_into_a_data_error(no_stray_workers):
    """docs/notebook_notes.md (03) runs ``fault_demo(1.0)``: a worker that exits, one that hangs, each a DataError."""
    from helpers.experiments.loader_demos import fault_demo

    notes = (Path(__file__).resolve().parents[1] / "docs" / "notebook_notes.md").read_text()
    assert "from helpers.experiments.loader_demos import fault_demo; print(fault_demo(1.0))" in notes
    t0 = time.perf_counter()
    text = fault_demo(1.0)
    assert text.startswith("exit: ") and "\nhang: " in text and text.endswith("no worker process left behind")
    assert "worker process died" in text and "timeout=1 s" in text
    assert time.perf_counter() - t0 < 30


# --------------------------------------------------------------------------- bad input mid-epoch


def _folder_with_a_truncated_jpeg(tmp_path: Path, n_good: int = 7) -> list[Path]:
    """Seven good JPEGs and one cut in half, which sorts sixth (met mid-epoch, not in the first batch)."""
    from PIL import Image

    paths = []
    for i in range(n_good):
        p = tmp_path / f"good_{i}.jpg"
        Image.new("RGB", (32, 24), (10 * i, 100, 200)).save(p, quality=90)
        paths.append(p)
    full = (tmp_path / "good_0.jpg").read_bytes()
    bad = tmp_path / "good_4_truncated.jpg"
    bad.write_bytes(full[: len(full) // 2])
    paths.insert(5, bad)
    return paths


@pytest.mark.skipif(not FORK, reason="needs the fork start method (Linux)")
def test_a_truncated_file_in_a_worker_is_reported_and_the_epoch_completes(tmp_path, no_stray_workers):
    from helpers.pipeline.dataset import load_dataset
    from helpers.pipeline.fast import BatchedDataset
    from helpers.pipeline.text import build_tokenizer

    _folder_with_a_truncated_jpeg(tmp_path)
    index = load_dataset(tmp_path, scan=False)  # not scanned up front: the bad file is met mid-epoch
    assert len(index) == 8 and "good_4_truncated.jpg" in [Path(p).name for p in index.paths]
    tokenizer = build_tokenizer(list(index.captions), vocab_size=32, text_len=4)
    dataset = BatchedDataset(index, tokenizer, image_size=16, text_len=4, threads=1)
    cfg = LoaderConfig(batch_size=2, num_workers=2, shuffle=False, timeout_s=60)
    loader = make_loader(dataset, cfg, batch_sampler=make_batch_sampler(len(index), cfg))
    workers = set()
    report = run_epoch(loader, name="bad input", on_batch=lambda i, b: workers.add(b["worker"]))
    assert report.batches == 4 and report.items == 8  # every batch full: the bad image was replaced
    assert workers == {0, 1}
    assert len(report.skipped) == 1
    name, reason, times = report.skipped[0]
    assert name == "good_4_truncated.jpg" and "truncated" in reason.lower() and times == 1


def test_skip_log_accepts_tuples_and_converted_lists():
    log = SkipLog()
    assert log.add({"skipped": [("a.jpg", "truncated JPEG")]}) == 1
    assert log.add({"skipped": [["a.jpg", "truncated JPEG"], ["b.png", "zero bytes"]]}) == 2
    assert log.add({"image": None}) == 0
    assert log.total == 3
    assert log.entries() == (("a.jpg", "truncated JPEG", 2), ("b.png", "zero bytes", 1))
    assert list(log.frame().columns) == ["file", "reason", "times"]
