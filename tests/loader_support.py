"""Shared by the DataLoader tests (test_loader*.py): the no-stray-workers fixture and a small batched dataset.

Import the fixture by name (``from loader_support import no_stray_workers``):
pytest finds fixtures among a test module's globals.
"""

from __future__ import annotations

import multiprocessing
import time

import psutil
import pytest
import torch
from torch.utils.data import Dataset

FORK = "fork" in multiprocessing.get_all_start_methods()


def _children() -> set[int]:
    """Live child processes of this one, less the resource tracker and zombies."""
    return {p.pid for p in psutil.Process().children(recursive=True)
            if "resource_tracker" not in " ".join(_cmdline(p)) and p.status() != psutil.STATUS_ZOMBIE}


def _cmdline(p) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


@pytest.fixture
def no_stray_workers():
    """Fail if a test leaves a worker process running."""
    before = _children()
    yield
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _children() - before:
        time.sleep(0.1)
    assert _children() - before == set(), "worker processes left behind"


class Numbers(Dataset):
    """Batched dataset: item i is the number i (module level: workers can import it)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, indices):
        idx = torch.as_tensor(indices, dtype=torch.int64)
        return {"label": idx, "image": (idx * 3).to(torch.uint8)}
