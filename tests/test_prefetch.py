"""The side-stream prefetcher (huggingface/pytorch-image-models#2781) and the overlap metric.

Every prefetched batch is compared bit for bit with a synchronous copy: on the CPU
directly, and with a faked stream/event implementation that records every call, so
that the protocol (side waits for consumer, copy on the side stream, consumer waits
for side, record_stream, then hand out; one stream for all epochs) is checked in order.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from helpers.compute.model import PolicyConfig, build_policy
from helpers.compute.ppo import PPOConfig, PPOTrainer
from helpers.compute.train import train
from helpers.device import Capabilities, Capability, get_accelerator
from helpers.errors import ParameterError
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


# --------------------------------------------------------------------------- CPU


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


# --------------------------------------------------------------------------- faked streams


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


# --------------------------------------------------------------------------- overlap metric


def phase_table(data, h2d, compute):
    df = pd.DataFrame({"step": range(len(data)), "data": data, "h2d": h2d, "compute": compute})
    df["step_s"] = df["data"] + df["h2d"] + df["compute"]
    return df


def test_overlap_stats_arithmetic():
    steps = phase_table([0.01, 0.02, 0.01, 0.0], [0.0, 0.01, 0.0, 0.0], [0.09, 0.07, 0.09, 0.1])
    work = [0.1, 0.1, 0.1, 0.1]
    s = pf.overlap_stats(steps, work)
    # per-step exposed 0.01, 0.03, 0.01, 0.0 -> median 0.01; work median 0.1; steps all 0.1
    assert s.steps == 4 and s.median_exposed_s == pytest.approx(0.01) and s.median_input_work_s == pytest.approx(0.1)
    assert s.median_step_s == pytest.approx(0.1) and s.median_compute_s == pytest.approx(0.09)
    assert s.hidden_fraction == pytest.approx(1 - 0.01 / 0.1)
    assert s.exposed_over_work == pytest.approx(0.1)
    assert s.exposed_fraction == pytest.approx(0.01 / 0.1)
    assert s.exposed_fraction_per_step == pytest.approx(0.1)  # per-step fractions 0.1, 0.3, 0.1, 0.0 -> median 0.1
    # totals are kept for reference only
    assert s.input_work_s == pytest.approx(0.4) and s.exposed_input_s == pytest.approx(0.05)
    assert s.step_s == pytest.approx(0.4) and s.compute_s == pytest.approx(0.35)
    assert set(s.as_dict()) >= {"hidden_fraction", "exposed_fraction", "exposed_fraction_per_step"}


def test_overlap_fractions_follow_from_the_medians_not_the_totals():
    """Review item 5: two runs with the same medians give the same fractions, whatever a slow step does to the mean."""
    calm = pf.overlap_stats(phase_table([0.002] * 5, [0.0] * 5, [0.03] * 5), [0.008] * 5)
    spiky = pf.overlap_stats(phase_table([0.002, 0.002, 0.002, 0.05, 0.002], [0.0] * 5,
                                         [0.03, 0.03, 0.03, 0.03, 0.2]), [0.008, 0.008, 0.008, 0.06, 0.008])
    assert spiky.exposed_input_s / spiky.input_work_s != pytest.approx(calm.exposed_input_s / calm.input_work_s)
    for s in (calm, spiky):
        # the fractions are reproduced from the medians a table shows
        assert s.hidden_fraction == pytest.approx(1 - s.median_exposed_s / s.median_input_work_s)
        assert s.exposed_fraction == pytest.approx(s.median_exposed_s / s.median_step_s)
    assert spiky.hidden_fraction == pytest.approx(calm.hidden_fraction) == pytest.approx(0.75)
    assert spiky.exposed_fraction == pytest.approx(calm.exposed_fraction)


def test_overlap_stats_serial_and_over_exposed_cases():
    serial = pf.overlap_stats(phase_table([0.05] * 3, [0.01] * 3, [0.04] * 3), [0.06] * 3)
    assert serial.hidden_fraction == pytest.approx(0.0) and serial.exposed_fraction == pytest.approx(0.6)
    worse = pf.overlap_stats(phase_table([0.08] * 2, [0.0] * 2, [0.02] * 2), [0.05] * 2)
    assert worse.hidden_fraction == 0.0 and worse.exposed_over_work == pytest.approx(1.6)


def test_overlap_stats_validates_its_inputs():
    steps = phase_table([0.1], [0.0], [0.1])
    with pytest.raises(ParameterError, match="one per measured step"):
        pf.overlap_stats(steps, [0.1, 0.2])
    with pytest.raises(ParameterError, match="lacks"):
        pf.overlap_stats(steps.drop(columns="h2d"), [0.1])
    with pytest.raises(ParameterError, match="negative"):
        pf.overlap_stats(steps, [-1.0])
    with pytest.raises(ParameterError, match="no step"):
        pf.overlap_stats(steps.iloc[:0], [])


def test_input_work_per_step_aligns_batches_and_copies():
    frame = pd.DataFrame({"prep_s": [1.0, 2.0, 3.0, 4.0, 5.0]})
    assert pf.input_work_per_step(frame, skip=2, steps=2) == [3.0, 4.0]
    assert pf.input_work_per_step(frame, skip=2, steps=2, copy_s=[0.1, 0.2]) == pytest.approx([3.1, 4.2])
    assert pf.input_work_per_step(frame, skip=1, steps=2, copy_s=[9, 0.5, 0.25, 9]) == pytest.approx([2.5, 3.25])
    with pytest.raises(ParameterError, match="fewer"):
        pf.input_work_per_step(frame, skip=4, steps=2)
    with pytest.raises(ParameterError, match="prep_s"):
        pf.input_work_per_step(pd.DataFrame({"x": [1]}), skip=0, steps=1)


def test_timeline_frame_puts_everything_on_one_clock():
    phases = pd.DataFrame({"step": [0, 0, 0, 1, 1, 1], "phase": ["data", "h2d", "compute"] * 2,
                           "start_s": [0.0, 0.1, 0.2, 1.0, 1.1, 1.2], "duration_s": [0.1, 0.1, 0.8] * 2})
    # batch 1 (first measured, skip=1) was returned at t=100.1, so the first measured step began at t=100.0
    batches_log = pd.DataFrame({"order": [0, 1, 2], "return_s": [99.0, 100.1, 101.1],
                                "prep_start_s": [98.0, 99.5, 100.3], "prep_end_s": [98.5, 100.0, 100.9],
                                "prep_s": [0.5, 0.5, 0.6], "worker": [0, 1, 0]})
    spans = pf.timeline_frame(phases, batches_log, skip=1)
    prep = spans[spans["kind"] == "prep"].set_index("batch")
    assert prep.loc[0, "start_s"] == pytest.approx(-0.5) and prep.loc[0, "row"] == "worker 1 prep"
    assert prep.loc[1, "start_s"] == pytest.approx(0.3) and prep.loc[1, "duration_s"] == pytest.approx(0.6)
    assert set(spans["row"]) == {"worker 0 prep", "worker 1 prep", "copy", "data wait", "compute"}
    copies = pd.DataFrame({"index": [1, 2], "start_s": [100.05, 100.95], "duration_s": [0.01, 0.01]})
    spans = pf.timeline_frame(phases, batches_log, skip=1, copies=copies)
    copy = spans[spans["kind"] == "copy"]
    assert copy["start_s"].tolist() == pytest.approx([0.05, 0.95]) and copy["batch"].tolist() == [0, 1]


# --------------------------------------------------------------------------- with train() and real workers


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
    run = train(rec, trainer, pf.ConsumerStreamSync(acc), steps=4, warmup_steps=2, transfer=pf.prefetched)
    frame = rec.frame()
    assert len(frame) >= 6 and (frame["worker"] == 0).all()
    # a worker's perf_counter and ours share a clock (CLOCK_MONOTONIC): preparation ends before the batch arrives
    assert (frame["prep_end_s"] <= frame["return_s"]).all() and (frame["prep_s"] >= 0.005).all()
    copies = prefetcher.copy_frame()
    work = pf.input_work_per_step(frame, skip=2, steps=4, copy_s=copies["duration_s"].tolist())
    stats = pf.overlap_stats(run.steps, work)
    assert stats.steps == 4 and 0.0 <= stats.hidden_fraction <= 1.0 and 0.0 <= stats.exposed_fraction <= 1.0
    spans = pf.timeline_frame(run.phases, frame, skip=2, copies=copies)
    assert {"worker 0 prep", "copy", "data wait", "compute"} <= set(spans["row"])


# --------------------------------------------------------------------------- the notebook's experiment, end to end


@pytest.fixture(scope="module")
def small_data(tmp_path_factory):
    from helpers.pipeline.dataset import build_embedded, load_dataset
    from helpers.pipeline.text import build_tokenizer

    index = load_dataset(build_embedded(tmp_path_factory.mktemp("emb") / "d", n_images=16, seed=5))
    return index, build_tokenizer(list(index.captions), vocab_size=128)


def test_choose_threads_gives_each_worker_a_core():
    assert pf.choose_threads(1, 2)["torch_threads"] == 1
    assert pf.choose_threads(1, 8)["torch_threads"] == 7
    over = pf.choose_threads(3, 2)
    assert over["torch_threads"] == 1 and over["decode_threads"] == 1 and "share" in over["reason"]
    none = pf.choose_threads(0, 4)
    assert none["torch_threads"] == 4 and none["decode_threads"] == 4


def test_thread_splits_and_fastest():
    splits = pf.thread_splits(1, 2)
    assert [s["label"] for s in splits] == ["1 core per worker", "all cores to torch"]
    assert [s["torch_threads"] for s in splits] == [1, 2] and all(s["decode_threads"] == 1 for s in splits)
    assert len(pf.thread_splits(1, 2, is_cpu=False)) == 1  # the step runs on the device
    assert len(pf.thread_splits(0, 2)) == 1
    assert [s["torch_threads"] for s in pf.thread_splits(2, 2)] == [1, 2]  # torch keeps at least one thread
    runs = [_fake_run([0.0] * 3, [c] * 3, f"c{c}") for c in (0.3, 0.1, 0.2)]
    assert pf.fastest(runs).label == "c0.1"
    with pytest.raises(ParameterError):
        pf.fastest([])


def test_verify_prefetcher_with_the_fast_pipeline(small_data):
    from helpers.pipeline.fast import BatchedDataset, batch_sampler, to_device_batch

    index, tokenizer = small_data
    acc = get_accelerator("cpu")
    ds = BatchedDataset(index, tokenizer, image_size=16, text_len=4, seed=1, threads=1)

    def epoch0():
        ds.set_epoch(0)
        return (ds[b] for b in batch_sampler(len(index), 4, seed=1, epoch=0))

    check = pf.verify_prefetcher(epoch0, acc, transfer=to_device_batch)
    assert check == {"batches": 4, "identical": 4, "side_stream": False, "streams_created": 0}

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


def test_run_overlap_variants_and_verdict(small_data):
    index, tokenizer = small_data
    acc = get_accelerator("cpu")
    common = dict(batch_size=4, image_size=16, text_len=4, model_width=4, d_model=8, steps=3, warmup_steps=1, seed=0)
    before = pf.run_overlap_variant(index, tokenizer, acc, label="before", num_workers=0, prefetcher=False, **common)
    after = pf.run_overlap_variant(index, tokenizer, acc, label="after", num_workers=1, prefetcher=True, **common)
    assert before.copies is None and len(after.copies) >= 4
    assert before.settings["torch_threads"] == pf.choose_threads(0)["torch_threads"]
    assert after.settings["num_workers"] == 1 and not after.settings["side_stream"]
    assert (before.batches["worker"] == -1).all() and (after.batches["worker"] == 0).all()
    assert before.stats.steps == after.stats.steps == 3
    assert after.settings["batches_per_epoch"] == 4 and after.settings["cores"] >= 1
    # synchronous: the loop waits for all of the input
    assert before.stats.hidden_fraction == 0.0
    spans = after.timeline()
    assert {"worker 0 prep", "copy", "data wait", "compute"} <= set(spans["row"])
    verdict = pf.overlap_verdict(before, after)
    assert verdict["recommendation"] in ("enable", "leave off")
    assert "->" in verdict["reason"] and verdict["exposed"].a.name == "before"
    assert verdict["dropped"] == (verdict["exposed"].ci_low > 1.0)
    # 16 images in batches of 4: the refill at each epoch start is named
    assert any("only 4 batches per epoch" in n for n in verdict["notes"])


def _fake_run(data, compute, label, work=0.05, **settings):
    steps = phase_table(data, [0.0] * len(data), compute)
    stats = pf.overlap_stats(steps, [work] * len(data))
    return pf.OverlapRun(label=label, run=SimpleNamespace(steps=steps, warmup_steps=0), batches=None, copies=None,
                         stats=stats, settings={"num_workers": 1, **settings})


def test_overlap_verdict_rules():
    before = _fake_run([0.05, 0.051, 0.049, 0.05, 0.052], [0.1] * 5, "before")
    hidden = _fake_run([0.0, 0.001, 0.0, 0.0, 0.001], [0.1, 0.101, 0.099, 0.1, 0.1], "after")
    v = pf.overlap_verdict(before, hidden)
    assert v["recommendation"] == "enable" and v["dropped"] and not v["slower"] and v["notes"] == []
    # the input is hidden but the compute got much slower (cores taken by workers): leave it off, and say why
    slow = _fake_run([0.0, 0.001, 0.0, 0.0, 0.001], [0.3, 0.31, 0.29, 0.3, 0.3], "after", cores=2, torch_threads=1)
    v = pf.overlap_verdict(before, slow)
    assert v["recommendation"] == "leave off" and v["slower"] and "slower" in v["reason"]
    assert any("cost the step CPU time" in n and "on 2 core(s)" in n for n in v["notes"])
    assert v["compute"].ci_high < 1.0


def test_no_measurable_drop_shows_its_interval():
    """Review item 6: a verdict that calls a drop not measurable shows the interval it used."""
    before = _fake_run([0.05, 0.049, 0.051, 0.05, 0.05], [0.1] * 5, "before")
    same = _fake_run([0.05, 0.049, 0.051, 0.05, 0.05], [0.1] * 5, "after")
    v = pf.overlap_verdict(before, same)
    assert v["recommendation"] == "leave off" and "no measurable drop" in v["reason"]
    c = v["exposed"]
    assert c.ci_low <= 1.0 <= c.ci_high and "the interval includes 1" in v["reason"]
    assert f"95% CI {c.ci_low:.2f}-{c.ci_high:.2f}" in v["reason"]
    assert "none of the known causes" in v["reason"]  # and says that no cause was found
    worse = _fake_run([0.07, 0.071, 0.069, 0.07, 0.072], [0.1] * 5, "after")
    assert "rose measurably" in pf.overlap_verdict(before, worse)["reason"]


def test_overlap_limits_name_each_cause():
    """Review item 6: when the overlap cannot work, the verdict says why."""
    before = _fake_run([0.05] * 4, [0.1] * 4, "before")
    one_batch = _fake_run([0.06] * 4, [0.1] * 4, "after", batches_per_epoch=1)
    notes = pf.overlap_limits(before, one_batch)
    assert len(notes) == 1 and "1 batch per epoch" in notes[0] and "nothing to prefetch" in notes[0]
    v = pf.overlap_verdict(before, one_batch)
    assert v["notes"] == notes and "why: the data gives 1 batch per epoch" in v["reason"]
    few = pf.overlap_limits(before, _fake_run([0.01] * 4, [0.1] * 4, "after", batches_per_epoch=4))
    assert len(few) == 1 and "1 step in 4" in few[0]
    assert pf.overlap_limits(before, _fake_run([0.01] * 4, [0.1] * 4, "after", batches_per_epoch=50)) == []
    # more input work than the workers can prepare during the compute
    long_input = pf.overlap_limits(before, _fake_run([0.01] * 4, [0.02] * 4, "after", work=0.05))
    assert len(long_input) == 1 and "longer than what 1 worker(s) can prepare" in long_input[0]
    assert pf.overlap_limits(before, _fake_run([0.01] * 4, [0.02] * 4, "after", work=0.05, num_workers=3)) == []
    # nothing beside the step
    alone = pf.overlap_limits(before, _fake_run([0.05] * 4, [0.1] * 4, "after", num_workers=0, side_stream=False))
    assert any("nothing runs beside the step" in n for n in alone)
    # nothing to hide in the first place
    hidden_before = _fake_run([0.0005] * 4, [0.1] * 4, "before")
    assert any("already nearly hidden" in n for n in pf.overlap_limits(hidden_before, hidden_before))


def test_overlap_bench_reports_a_note(monkeypatch):
    """overlap_bench's dict carries the verdict's interval and a note saying why the overlap could not work."""
    import helpers.pipeline.prepare as prepare

    monkeypatch.setattr(prepare, "prepare_data", lambda *a, **k: ([0] * 12, None))
    runs = {"before": _fake_run([0.04] * 5, [0.1] * 5, "before", num_workers=0, batches_per_epoch=1)}

    def fake_variant(index, tokenizer, acc, *, label, num_workers, **kw):
        return runs.get(label) or _fake_run([0.05, 0.051, 0.049, 0.05, 0.05], [0.1] * 5, label,
                                            num_workers=num_workers, batches_per_epoch=1, torch_threads=1,
                                            decode_threads=1)

    monkeypatch.setattr(pf, "run_overlap_variant", fake_variant)
    out = pf.overlap_bench(batch_size=12, num_workers=1, steps=5)
    assert out["batches_per_epoch"] == 1 and out["hidden_fraction"] == 0.0
    assert out["note"] and "1 batch per epoch" in out["note"]
    assert out["recommendation"] == "leave off"
    assert out["exposed_reduction"]["ci_high"] < 1.0  # the exposed input rose
    assert "median" in out["statistic"]


def test_compute_thread_scaling_restores_threads():
    acc = get_accelerator("cpu")
    previous = torch.get_num_threads()
    df = pf.compute_thread_scaling(acc, batch_size=4, image_size=16, text_len=4, model_width=4, d_model=8,
                                   vocab_size=16, n_actions=3, threads=[1], repeats=3, warmup=0)
    assert list(df["torch_threads"]) == [1] and (df["median_s"] > 0).all()
    assert torch.get_num_threads() == previous
    with pytest.raises(ParameterError):
        pf.compute_thread_scaling(acc, batch_size=4, image_size=16, text_len=4, model_width=4, d_model=8,
                                  vocab_size=16, n_actions=3, threads=[0])


def test_plots_draw_from_the_tables(small_data):
    import matplotlib

    matplotlib.use("Agg")
    from helpers.pipeline.transfer import host_copy_sweep
    from helpers.workbook import plots_transfer as pt

    fig = pt.bandwidth_vs_size(host_copy_sweep([4096, 8192], repeats=3, warmup=0))
    assert fig.axes
    before = _fake_run([0.05] * 3, [0.1] * 3, "before")
    fig = pt.exposed_vs_hidden([("before", before.stats)])
    assert fig.axes
    phases = pd.DataFrame({"step": [0, 0, 0], "phase": ["data", "h2d", "compute"], "start_s": [0.0, 0.1, 0.2],
                           "duration_s": [0.1, 0.1, 0.5]})
    log = pd.DataFrame({"order": [0], "return_s": [10.1], "prep_start_s": [9.9], "prep_end_s": [10.0],
                        "prep_s": [0.1], "worker": [-1]})
    fig = pt.overlap_timeline([("x", pf.timeline_frame(phases, log, skip=0))])
    assert len(fig.axes) == 1


def test_timeline_panels_share_one_axis_and_keep_short_copies_visible():
    import matplotlib

    matplotlib.use("Agg")
    from helpers.workbook import plots_transfer as pt

    def spans(step_s, n=6):
        rows = []
        for k in range(n):
            rows += [("copy", "copy", k * step_s, 0.0002, k),
                     ("compute", "compute", k * step_s + 0.001, step_s - 0.001, k)]
        return pd.DataFrame(rows, columns=["row", "kind", "start_s", "duration_s", "batch"])

    fig = pt.overlap_timeline([("slow", spans(0.2)), ("fast", spans(0.05))])
    top, bottom = fig.axes[0], fig.axes[1]
    assert top.get_xlim() == bottom.get_xlim() and top.get_xlim()[1] >= 6 * 0.2 * 1e3
    window = top.get_xlim()[1] - top.get_xlim()[0]
    for ax in (top, bottom):
        copy_lane = ax.collections[0]  # first lane drawn: copy
        widths = [path.get_extents().width for path in copy_lane.get_paths()]
        assert len(widths) == 6 and min(widths) >= pt.MIN_SPAN_FRACTION * window * 0.999


def test_exposed_vs_hidden_draws_the_medians():
    import matplotlib

    matplotlib.use("Agg")
    from helpers.workbook import plots_transfer as pt

    run = _fake_run([0.002, 0.002, 0.002, 0.05, 0.002], [0.03, 0.03, 0.03, 0.03, 0.2], "after", work=0.008)
    fig = pt.exposed_vs_hidden([("after", run.stats)])
    widths = sorted(round(r.get_width(), 6) for r in fig.axes[0].patches)
    # compute 30, exposed 2 (twice: step bar and input bar), hidden 8 - 2 = 6 ms: the medians, not the means
    assert widths == sorted([30.0, 2.0, 2.0, 6.0])
    texts = " ".join(t.get_text() for t in fig.axes[0].texts)
    assert f"{run.stats.hidden_fraction:.0%} hidden" in texts and "75% hidden" in texts


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


def test_baseline_workload_reads_notebook_01s_run_or_its_defaults(tmp_path):
    """Review item 10: notebook 05 says which model it trains against notebook 01's."""
    from helpers.results import ResultsStore

    values, source = pf.baseline_workload(None)
    assert values["model_width"] == 16 and source == "notebook 01's defaults"
    assert set(values) == set(pf.WORKLOAD_PARAMS)
    assert pf.baseline_workload(tmp_path / "missing.jsonl")[1] == "notebook 01's defaults"
    path = tmp_path / "results.jsonl"
    params = {"batch_size": 8, "image_size": 64, "text_len": 12, "model_width": 8, "d_model": 32, "steps": 4}
    ResultsStore(path, notebook="01_baseline_profiling", device="cpu", parameters=params).add(
        "x", "y", "z", 1.0, "s")
    ResultsStore(path, notebook="05_stream_overlap", device="cpu", parameters={**params, "model_width": 32}).add(
        "x", "y", "z", 1.0, "s")
    values, source = pf.baseline_workload(path)
    assert values == {k: params[k] for k in pf.WORKLOAD_PARAMS} and "this results file" in source
