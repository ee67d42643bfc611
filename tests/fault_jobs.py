"""Jobs with the faults a user's own job can have, for tests/test_job_faults.py (loaded by path, as a user's are).

- :func:`make_nan_job`: the loss becomes NaN at the third step of every fresh model (fp32 and autocast alike);
- :func:`make_bf16_nan_job`: the same, but only when the model runs under bf16 autocast;
- :func:`make_hang_job`: ``dataset[HANG_INDEX]`` sleeps forever;
- :func:`make_raising_job`: ``dataset[RAISE_INDEX]`` raises ValueError.
"""

from __future__ import annotations

import time

import torch

from helpers.jobs.supervised import supervised_job

NAN_AT = 3
HANG_INDEX = 37
RAISE_INDEX = 37


class Squares(torch.utils.data.Dataset):
    """``(x, x0 ** 2)`` with ``x`` four copies of ``i % 5``; optionally hangs or raises on one index."""

    def __init__(self, n: int = 64, hang: int | None = None, raise_at: int | None = None) -> None:
        self.n, self.hang, self.raise_at = n, hang, raise_at

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if i == self.hang:
            while True:  # a reader stuck on one file (a network mount, a lock)
                time.sleep(0.05)
        if i == self.raise_at:
            raise ValueError(f"corrupt record {i}")
        x = torch.full((4,), float(i % 5))
        return x, torch.tensor(float(i % 5) ** 2)


class BlowUp(torch.nn.Module):
    """A linear model whose output becomes NaN from its ``at``-th forward on (only under bf16 when ``bf16_only``)."""

    def __init__(self, at: int = NAN_AT, bf16_only: bool = False) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)
        self.at, self.bf16_only, self.calls = at, bf16_only, 0

    def forward(self, x):
        self.calls += 1
        out = self.lin(x)
        if self.calls >= self.at and (not self.bf16_only or out.dtype == torch.bfloat16):
            out = out * float("nan")
        return out


def _loss(out, y):
    return torch.nn.functional.mse_loss(out.squeeze(1).float(), y)


def _sgd(params):
    return torch.optim.SGD(params, lr=1e-3)


def make_nan_job(batch_size: int = 8):
    """A job whose loss is NaN from step 3 on, in every configuration."""
    return supervised_job(Squares(), BlowUp, _loss, _sgd, batch_size=batch_size, name="nan job")


def make_bf16_nan_job(batch_size: int = 8):
    """A job whose loss is NaN from step 3 on under bf16 autocast only."""
    return supervised_job(Squares(), lambda: BlowUp(bf16_only=True), _loss, _sgd, batch_size=batch_size,
                          name="bf16 nan job")


def make_hang_job(batch_size: int = 8, hang: int = HANG_INDEX):
    """A job whose ``dataset[hang]`` (37: in the third batch of seed 0; 16: in the first) never returns."""
    return supervised_job(Squares(hang=hang), lambda: torch.nn.Linear(4, 1), _loss, _sgd,
                          batch_size=batch_size, name="hang job")


def make_raising_job(batch_size: int = 8):
    """A job whose ``dataset[37]`` raises ValueError."""
    return supervised_job(Squares(raise_at=RAISE_INDEX), lambda: torch.nn.Linear(4, 1), _loss, _sgd,
                          batch_size=batch_size, name="raising job")
