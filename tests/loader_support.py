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


def _children() -> dict[int, str]:
    """This process's live DataLoader-worker-like children: {pid: command line}.

    A worker is a fork of this process (the same command line) or a
    multiprocessing spawn/forkserver child; the resource tracker, zombies and
    any other subprocess (a kernel or a tool another test started in the
    background) are left out, so only a worker can fail the check.
    """
    me = _cmdline(psutil.Process())
    out = {}
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
        except psutil.Error:
            continue
        cmd = _cmdline(p)
        line = " ".join(cmd)
        if "resource_tracker" in line:
            continue
        if cmd == me or "multiprocessing" in line:
            out[p.pid] = line[:200]
    return out


def _cmdline(p) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


@pytest.fixture
def no_stray_workers():
    """Fail if a test leaves a worker process running."""
    before = set(_children())
    yield
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and set(_children()) - before:
        time.sleep(0.1)
    left = {pid: cmd for pid, cmd in _children().items() if pid not in before}
    assert not left, f"worker processes left behind: {left}"


class Numbers(Dataset):
    """Batched dataset: item i is the number i (module level: workers can import it)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, indices):
        idx = torch.as_tensor(indices, dtype=torch.int64)
        return {"label": idx, "image": (idx * 3).to(torch.uint8)}
