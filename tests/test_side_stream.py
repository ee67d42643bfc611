"""Notebook 05's side-stream prefetcher in plain PyTorch (helpers/pipeline/side_stream.py): the batches it hands
over, and, with stand-in streams (this machine has none), the order of its copies, waits and yields."""

from __future__ import annotations

import collections

import torch

from helpers.pipeline import side_stream as ss


def test_on_a_cpu_it_hands_over_the_same_batches_in_order_whatever_their_structure():
    Pair = collections.namedtuple("Pair", "image label")
    batches = [(torch.full((2,), float(i)), {"y": torch.tensor(i), "ids": [i]}, Pair(torch.zeros(1), "s"), i)
               for i in range(4)]
    got = list(ss.prefetch(batches, "cpu"))
    assert len(got) == 4
    for (a, b, c, d), (x, y, z, w) in zip(batches, got):
        assert torch.equal(a, x) and torch.equal(b["y"], y["y"]) and y["ids"] == [d] and w == d
        assert isinstance(z, Pair) and z.label == "s"
    assert list(ss.prefetch([], "cpu")) == []
    assert ss.side_stream(torch.device("cpu")) is None


class _Stream:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def __enter__(self):
        self.log.append(f"enter {self.name}")
        return self

    def __exit__(self, *exc):
        self.log.append(f"exit {self.name}")

    def wait_stream(self, other):
        self.log.append(f"{self.name} waits for {other.name}")


def test_with_streams_each_step_waits_for_its_own_copy_only_and_keeps_its_memory(monkeypatch):
    log: list[str] = []
    side, step = _Stream("side", log), _Stream("step", log)
    made = []
    monkeypatch.setattr(ss, "side_stream", lambda device: made.append(device) or side)
    monkeypatch.setattr(torch.accelerator, "current_stream", lambda device=None: step)
    monkeypatch.setattr(torch.Tensor, "record_stream",
                        lambda self, stream: log.append(f"record {int(self.item())} for {stream.name}"))
    for i in ss.prefetch([torch.tensor(float(i)) for i in range(3)], "cpu"):
        log.append(f"step {int(i.item())}")
    assert log == [
        "enter side", "record 0 for step", "exit side",  # batch 0's copy, on the side stream
        "step waits for side",  # 1. before batch 0 is handed over: its copy only
        "enter side", "record 1 for step", "exit side",  # 2. batch 1's copy is queued before step 0 runs
        "step 0",
        "step waits for side", "enter side", "record 2 for step", "exit side", "step 1",
        "step waits for side", "step 2"]
    assert len(made) == 1


def test_the_side_stream_is_made_once_per_device():
    assert hasattr(ss.side_stream, "cache_info"), "side_stream must be cached: one stream per device, every epoch"
    before = ss.side_stream.cache_info().hits
    for _ in range(3):  # three epochs
        list(ss.prefetch([torch.zeros(1)], "cpu"))
    assert ss.side_stream.cache_info().hits >= before + 2
