"""Shared by the pinned-memory tests (test_transfer.py, test_pinning.py): a fake accelerator and a fake pin.

Import the fixture by name (``from transfer_support import fake_pin``): pytest finds fixtures among a test
module's globals.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from helpers.device import Capabilities, Capability


class FakeEvent:
    """Records its calls in a shared log; elapsed_time returns a fixed 2 ms."""

    def __init__(self, log, name):
        self.log, self.name, self.recorded = log, name, 0

    def record(self, stream=None):
        self.recorded += 1
        self.log.append(("record", self.name))

    def synchronize(self):
        self.log.append(("synchronize", self.name))

    def elapsed_time(self, other):
        return 2.0


def fake_accelerator(log=None):
    """An accelerator that claims pinned memory, streams and events, on the CPU device."""
    log = [] if log is None else log
    yes = Capability(True, "faked for a test")
    caps = Capabilities(pinned_memory=yes, non_blocking_copy=yes, streams=yes, events=yes,
                        memory_stats=Capability(False, "fake"), channels_last=yes)
    counter = iter(range(10**6))
    return SimpleNamespace(
        kind="cuda", name="fake", count=1, index=0, device=torch.device("cpu"), capabilities=caps, is_cpu=False,
        synchronize=lambda: log.append(("device_sync",)),
        new_event=lambda enable_timing=False: FakeEvent(log, f"ev{next(counter)}"),
        new_stream=lambda: None, log=log,
    )


@pytest.fixture
def fake_pin(monkeypatch):
    """Make Tensor.pin_memory a plain copy (counted), as it cannot run without an accelerator."""
    calls = []

    def pin(self, *args, **kwargs):
        calls.append(self.numel())
        return self.clone()

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin)
    return calls
