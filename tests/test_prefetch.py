"""The side-stream prefetcher (huggingface/pytorch-image-models#2781) and the overlap metric.

Every prefetched batch is compared bit for bit with a synchronous copy: on the CPU
directly, and with a faked stream/event implementation that records every call, so
that the protocol (side waits for consumer, copy on the side stream, consumer waits
for side, record_stream, then hand out; one stream for all epochs) is checked in order.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from helpers.compute.model import PolicyConfig, build_policy
from helpers.compute.ppo import PPOConfig, PPOTrainer
from helpers.compute.train import TimedLoop, epochs
from helpers.device import Capabilities, Capability, get_accelerator
from helpers.errors import ParameterError
from helpers.experiments import overlap as ov
from helpers.pipeline import prefetch as pf

# --------------------------------------------------------------------------- stand-ins for the fast format


class BatchStandIn:
    """A batched dataset in the shared fast format: ``__getitem__(list of indices)`` -> host batch dict.

    Module-level so DataLoader workers can use it. Pixels depend only on the indices.
    """

    def __init__(self, n=64, size=8, text_len=4, delay_s=0.0):
        self.n, self.size, self.text_len, self.delay_s = n, size, text_len, delay_s

    def __len__(self):
        return self.n

    def __getitem__(self, indices):
        start = time.perf_counter()
        if self.delay_s:
            time.sleep(self.delay_s)
        idx = torch.as_tensor(list(indices), dtype=torch.int64)
        g = torch.Generator().manual_seed(int(idx.sum()) * 7919 + len(idx))
        image = torch.randint(0, 256, (len(idx), self.size, self.size, 3), dtype=torch.uint8, generator=g)
        info = torch.utils.data.get_worker_info()
        end = time.perf_counter()
        return {"image": image, "tokens": (idx[:, None] + torch.arange(self.text_len)) % 16,
                "label": idx % 3, "prep_start_s": start, "prep_end_s": end, "prep_s": end - start,
                "worker": -1 if info is None else info.id, "skipped": []}

def batches(n_batches=4, batch=4, **kw):
    ds = BatchStandIn(**kw)
    return [ds[list(range(i * batch, (i + 1) * batch))] for i in range(n_batches)]

MEAN = torch.tensor([0.485, 0.456, 0.406])
STD = torch.tensor([0.229, 0.224, 0.225])


def to_device_standin(batch, acc, *, non_blocking=False):
    """to_device_batch's contract: copy the uint8 batch, then convert and normalize on the device."""
    image = batch["image"].to(acc.device, non_blocking=non_blocking)
    x = image.permute(0, 3, 1, 2).float().div_(255)
    x = (x - MEAN.to(x.device)[:, None, None]) / STD.to(x.device)[:, None, None]
    return (x, batch["tokens"].to(acc.device, non_blocking=non_blocking),
            batch["label"].to(acc.device, non_blocking=non_blocking))

def assert_same(got, expected):
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape and torch.equal(g, e)

def test_cpu_prefetcher_is_a_synchronous_copy_with_the_same_items():
    acc = get_accelerator("cpu")
    host = batches(5)
    p = pf.DevicePrefetcher(host, acc, transfer=to_device_standin)
    assert p.stream is None and p.streams_created == 0 and not p.uses_side_stream and len(p) == 5
    for epoch in range(2):
        items = list(p)
        assert [it["index"] for it in items] == list(range(5 * epoch, 5 * epoch + 5))
        assert {it["epoch"] for it in items} == {epoch}
        for item, h in zip(items, host):  # every batch, bit for bit
            assert_same(item["device"], to_device_standin(h, acc))
            assert item["prep_s"] == h["prep_s"] and item["worker"] == -1 and item["skipped"] == []
            assert pf.prefetched(item, acc) is item["device"]
    copies = p.copy_frame()
    assert len(copies) == 10 and (copies["timed_on"] == "host").all() and (copies["duration_s"] >= 0).all()
    assert p.streams_created == 0

def test_prefetched_rejects_a_plain_batch_and_transfer_must_be_callable():
    with pytest.raises(ParameterError, match="DevicePrefetcher"):
        pf.prefetched({"image": torch.zeros(1)})
    with pytest.raises(ParameterError, match="callable"):
        pf.DevicePrefetcher([], get_accelerator("cpu"), transfer=42)

def test_empty_loader_yields_nothing():
    assert list(pf.DevicePrefetcher([], get_accelerator("cpu"), transfer=to_device_standin)) == []

class FakeStream:
    def __init__(self, log, name):
        self.log, self.name = log, name

    def __enter__(self):
        self.log.append(("enter", self.name))
        return self

    def __exit__(self, *exc):
        self.log.append(("exit", self.name))

    def wait_stream(self, other):
        self.log.append(("wait_stream", self.name, other.name))

    def synchronize(self):
        self.log.append(("stream_sync", self.name))

class FakeEvent:
    def __init__(self, log, n):
        self.log, self.n, self.stream = log, n, None

    def record(self, stream=None):
        self.stream = stream.name if stream is not None else None
        self.log.append(("record", self.n, self.stream))

    def elapsed_time(self, other):
        return 1.5 * (other.n - self.n)  # ms

@pytest.fixture
def fake_streams(monkeypatch):
    log = []
    consumer = FakeStream(log, "consumer")
    created = []
    counter = iter(range(10**6))

    def new_stream():
        s = FakeStream(log, f"side{len(created)}")
        created.append(s)
        return s

    yes = Capability(True, "faked")
    acc = SimpleNamespace(
        kind="cuda", name="fake", index=0, device=torch.device("cpu"), is_cpu=False,
        capabilities=Capabilities(pinned_memory=yes, non_blocking_copy=yes, streams=yes, events=yes,
                                  memory_stats=yes, channels_last=yes),
        new_stream=new_stream, new_event=lambda enable_timing=False: FakeEvent(log, next(counter)),
        synchronize=lambda: log.append(("device_sync",)),
    )
    monkeypatch.setattr(pf, "_current_stream", lambda a: consumer)
    monkeypatch.setattr(pf, "_record_stream", lambda t, s: log.append(("record_stream", t.data_ptr(), s.name)))
    return SimpleNamespace(acc=acc, log=log, created=created, consumer=consumer)

def logged_transfer(log):
    def transfer(batch, acc, *, non_blocking=False):
        log.append(("copy", int(batch["tokens"][0, 0]), non_blocking))
        return to_device_standin(batch, acc, non_blocking=non_blocking)
    return transfer

def test_side_stream_protocol_order_and_equality(fake_streams):
    log, acc = fake_streams.log, fake_streams.acc
    host = batches(4)
    first_labels = [int(h["tokens"][0, 0]) for h in host]  # distinct per batch
    p = pf.DevicePrefetcher(host, acc, transfer=logged_transfer(log))
    assert p.streams_created == 1 and p.uses_side_stream
    side = p.stream.name
    for epoch in range(3):
        for k, item in enumerate(p):
            log.append(("use", k))
            assert_same(item["device"], to_device_standin(host[k], acc))  # bit for bit
    assert len(fake_streams.created) == 1, "one side stream for every epoch"

    epochs = _split_epochs(log)
    assert len(epochs) == 3
    for epoch_log in epochs:
        for k, label in enumerate(first_labels):
            copy = epoch_log.index(("copy", label, True))
            use = epoch_log.index(("use", k))
            # side waits for the consumer, then the copy runs inside the side stream, with events around it
            assert epoch_log[copy - 3] == ("wait_stream", side, "consumer")
            assert epoch_log[copy - 2] == ("enter", side)
            assert epoch_log[copy - 1][0] == "record" and epoch_log[copy - 1][2] == side
            assert epoch_log[copy + 1][0] == "record" and epoch_log[copy + 1][2] == side
            assert epoch_log[copy + 2] == ("exit", side)
            # the consumer waits for the side stream after the copy and before using the batch
            waits = [i for i, e in enumerate(epoch_log) if e == ("wait_stream", "consumer", side)]
            wait = next(i for i in waits if i > copy)
            assert wait < use
            records = [i for i, e in enumerate(epoch_log) if e[0] == "record_stream"]
            mine = [i for i in records if wait < i < use]
            assert len(mine) == 3 and all(epoch_log[i][2] == "consumer" for i in mine)
            if k + 1 < len(first_labels):
                nxt = epoch_log.index(("copy", first_labels[k + 1], True))
                assert wait < nxt < use, "batch k+1 is copied after batch k's wait and before step k uses it"

def _split_epochs(log):
    """Cut the log at each epoch's first copy of batch 0 (first token 0)."""
    starts = [i for i, e in enumerate(log) if e == ("copy", 0, True)]
    return [log[max(0, s - 3):e] for s, e in zip(starts, starts[1:] + [len(log)])]

def test_event_timing_and_consumer_stream_sync(fake_streams):
    log, acc = fake_streams.log, fake_streams.acc
    p = pf.DevicePrefetcher(batches(3), acc, transfer=to_device_standin)
    items = list(p)
    assert len(items) == 3
    copies = p.copy_frame()
    assert (copies["timed_on"] == "events").all()
    assert copies["duration_s"].tolist() == pytest.approx([1.5e-3] * 3)  # events n, n+1: 1.5 ms
    assert copies["start_s"].is_monotonic_increasing
    view = pf.ConsumerStreamSync(acc)
    log.clear()
    view.synchronize()
    assert log == [("stream_sync", "consumer")], "only the consumer stream, not the whole device"
    assert view.device == acc.device and view.kind == "cuda"

def test_consumer_stream_sync_on_cpu_is_the_plain_sync():
    acc = get_accelerator("cpu")
    pf.ConsumerStreamSync(acc).synchronize()  # no-op, must not raise

TINY = PolicyConfig(image_size=8, conv_channels=(4, 8), vocab_size=16, text_len=4, d_model=8, n_heads=2,
                    n_layers=1, fusion_hidden=16, n_actions=3)


def test_train_with_workers_prefetcher_and_recording_loader():
    from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

    acc = get_accelerator("cpu")
    ds = BatchStandIn(n=32, delay_s=0.005)
    sampler = BatchSampler(SequentialSampler(range(32)), batch_size=4, drop_last=True)
    loader = DataLoader(ds, sampler=sampler, batch_size=None, num_workers=1, prefetch_factor=2, timeout=60)
    prefetcher = pf.DevicePrefetcher(loader, acc, transfer=to_device_standin)
    rec = pf.RecordingLoader(prefetcher)
    torch.manual_seed(0)
    trainer = PPOTrainer(build_policy(TINY), PPOConfig(horizon=2, ppo_epochs=1))
    loop = TimedLoop(epochs(rec), pf.prefetched, lambda b: trainer.step(*b), pf.ConsumerStreamSync(acc).synchronize)
    run = loop.run(2, measured=False).discard().run(4).result()
    frame = rec.frame()
    assert len(frame) >= 6 and (frame["worker"] == 0).all()
    # a worker's perf_counter and ours share a clock (CLOCK_MONOTONIC): preparation ends before the batch arrives
    assert (frame["prep_end_s"] <= frame["return_s"]).all() and (frame["prep_s"] >= 0.005).all()
    copies = prefetcher.copy_frame()
    work = ov.input_work_per_step(frame, skip=2, steps=4, copy_s=copies["duration_s"].tolist())
    stats = ov.overlap_stats(run.steps, work)
    assert stats.steps == 4 and 0.0 <= stats.hidden_fraction <= 1.0 and 0.0 <= stats.exposed_fraction <= 1.0
    spans = ov.timeline_frame(run.phases, frame, skip=2, copies=copies)
    assert {"worker 0 prep", "copy", "data wait", "compute"} <= set(spans["row"])

@pytest.fixture(scope="module")
def small_data(tmp_path_factory):
    from helpers.pipeline.dataset import build_embedded, load_dataset
    from helpers.pipeline.text import build_tokenizer

    index = load_dataset(build_embedded(tmp_path_factory.mktemp("emb") / "d", n_images=16, seed=5))
    return index, build_tokenizer(list(index.captions), vocab_size=128)

def test_verify_prefetcher_with_the_fast_pipeline(small_data):
    from helpers.pipeline.fast import BatchedDataset, to_device_batch
    from helpers.pipeline.sampler import batch_sampler

    index, tokenizer = small_data
    acc = get_accelerator("cpu")
    ds = BatchedDataset(index, tokenizer, image_size=16, text_len=4, seed=1, threads=1)

    def epoch0():
        ds.set_epoch(0)
        return (ds[b] for b in batch_sampler(len(index), 4, seed=1, epoch=0))

    check = pf.verify_prefetcher(epoch0, acc, transfer=to_device_batch)
    assert check == {"batches": 4, "identical": 4, "structure_equal": 4, "reproducible": True, "side_stream": False,
                     "streams_created": 0}

    # a prefetcher that hands out a different batch is caught
    def wrong(batch, acc, *, non_blocking=False):
        x, t, l = to_device_batch(batch, acc)
        return x + 1e-3, t, l

    state = {"calls": 0}

    def flaky(batch, acc, *, non_blocking=False):  # right on the synchronous pass, wrong when prefetched
        state["calls"] += 1
        return (to_device_batch if state["calls"] <= 4 else wrong)(batch, acc, non_blocking=non_blocking)

    assert pf.verify_prefetcher(epoch0, acc, transfer=flaky)["identical"] == 0
    ds.close()

def test_prefetcher_keeps_no_batch_alive_after_the_step():
    import gc
    import weakref

    acc = get_accelerator("cpu")
    p = pf.DevicePrefetcher(batches(4), acc, transfer=to_device_standin)
    refs = []
    for item in p:
        refs.append(weakref.ref(item["device"][0]))
        del item
        gc.collect()
        assert all(r() is None for r in refs[:-1]), "an earlier batch is still referenced"
    gc.collect()
    assert all(r() is None for r in refs)
    assert len(p.copy_frame()) == 4  # the copy log keeps timings, not tensors
