"""Notebook 03's demonstration datasets and its fault demonstration: what the loader's guards and worker memory
are shown on.

:class:`MetadataDataset` shows how a forked worker's memory grows when per-sample metadata is kept in Python objects
(pytorch/pytorch#13246), and :class:`FaultyDataset` fails inside workers to show the guards of
:mod:`helpers.pipeline.guarded`; :func:`fault_demo` runs it. DataLoader workers started with ``spawn`` or
``forkserver`` unpickle these datasets by module path (see "Fork and spawn" in :mod:`helpers.pipeline.loader`), so
they are module-level classes, and this module imports nothing heavier than numpy and torch at module level.
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch
from torch.utils.data import Dataset

from helpers.errors import DataError, ParameterError
from helpers.pipeline.loader import LoaderConfig, _is_int, make_loader

__all__ = ["MetadataDataset", "FaultyDataset", "fault_demo"]


class MetadataDataset(Dataset):
    """A batched dataset of per-sample metadata only, to show how worker memory grows (pytorch/pytorch#13246).

    Each item has a path, a caption and a label. ``storage="arrays"`` keeps
    them in three NumPy arrays (fixed-width unicode and int64): reading an
    item writes nothing to the shared pages. ``storage="objects"`` keeps
    them as a Python list of dicts, the way people often write it: reading
    an item writes the reference counts of the dict and its strings, so a
    forked worker copies every page it reads, and its USS grows through the
    epoch towards the size of the whole list.

    Parameters
    ----------
    n_items : int
        Items (>= 1).
    storage : {"arrays", "objects"}
    seed : int
        Seed of the generated captions and labels.

    Raises
    ------
    ParameterError
        For an invalid ``n_items`` or ``storage``.
    """

    def __init__(self, n_items: int, storage: str = "arrays", *, seed: int = 0) -> None:
        if not _is_int(n_items) or n_items < 1:
            raise ParameterError(f"n_items={n_items!r}: allowed: an int >= 1")
        if storage not in ("arrays", "objects"):
            raise ParameterError(f"storage={storage!r}: allowed: 'arrays' or 'objects'")
        self.storage = storage
        rng = np.random.default_rng(seed)
        labels = rng.integers(0, 10, size=n_items)
        words = np.array(["a cat", "a red cup", "a rocket", "grass", "a wall of bricks", "distant galaxies"])
        picks = rng.integers(0, len(words), size=n_items)
        if storage == "arrays":
            self.paths = np.array([f"images/{i:07d}.jpg" for i in range(n_items)])
            self.captions = words[picks]
            self.labels = labels.astype(np.int64)
            self.items = None
        else:
            self.items = [
                {"path": f"images/{i:07d}.jpg", "caption": f"{words[p]} number {i}", "label": int(lab)}
                for i, (p, lab) in enumerate(zip(picks.tolist(), labels.tolist()))
            ]

    def __len__(self) -> int:
        return len(self.items) if self.items is not None else int(self.labels.shape[0])

    def __getitem__(self, indices: list[int]) -> dict:
        """Read the metadata of a batch of items.

        Returns
        -------
        dict
            ``label``: int64 tensor (B,); ``caption_chars``: int64 tensor (B,),
            characters per caption (so every caption is really read).
        """
        if self.items is not None:
            rows = [self.items[i] for i in indices]
            labels = [r["label"] for r in rows]
            chars = [len(r["caption"]) + len(r["path"]) for r in rows]
        else:
            idx = np.asarray(indices, dtype=np.int64)
            labels = self.labels[idx]
            chars = np.strings.str_len(self.captions[idx]) + np.strings.str_len(self.paths[idx])
        return {"label": torch.as_tensor(np.asarray(labels, dtype=np.int64)),
                "caption_chars": torch.as_tensor(np.asarray(chars, dtype=np.int64))}


class FaultyDataset(Dataset):
    """A per-item dataset that fails inside DataLoader workers, to show and test the guards.

    In the main process (``num_workers=0``) items load normally, so the
    failure is clearly the worker's.

    Parameters
    ----------
    n_items : int
        Items (>= 1).
    fault : {"hang", "exit"}
        ``"hang"``: ``__getitem__`` sleeps forever in a worker (a read that
        never returns); ``"exit"``: the worker process ends with
        ``os._exit(exit_code)`` (as if killed).
    exit_code : int, default 1
    """

    def __init__(self, n_items: int = 16, fault: str = "hang", *, exit_code: int = 1) -> None:
        if fault not in ("hang", "exit"):
            raise ParameterError(f"fault={fault!r}: allowed: 'hang' or 'exit'")
        self.n_items, self.fault, self.exit_code = int(n_items), fault, int(exit_code)

    def __len__(self) -> int:
        return self.n_items

    def __getitem__(self, i: int) -> dict:
        if torch.utils.data.get_worker_info() is not None:
            if self.fault == "exit":
                os._exit(self.exit_code)
            while True:  # a hang: never returns
                time.sleep(3600)
        return {"label": torch.tensor(int(i), dtype=torch.int64)}


def fault_demo(first_batch_timeout_s: float) -> str:
    """A worker that exits and one that hangs, each turned into a DataError; no worker process left behind.

    Parameters
    ----------
    first_batch_timeout_s : float
        Notebook 03's timeout; the demo waits at most 1 s.

    Returns
    -------
    str
        Each fault's error message, then "no worker process left behind".

    Raises
    ------
    AssertionError
        If a broken loader did not fail, or a worker process outlived it.
    """
    import psutil

    from helpers.pipeline.guarded import run_epoch

    def live_children():
        pids = set()
        for proc in psutil.Process().children(recursive=True):
            try:
                if proc.status() != psutil.STATUS_ZOMBIE:
                    pids.add(proc.pid)
            except psutil.NoSuchProcess:
                pass
        return pids

    before, lines = live_children(), []
    timeout_s = min(1.0, first_batch_timeout_s)
    for fault in ("exit", "hang"):
        broken = make_loader(FaultyDataset(8, fault), LoaderConfig(batch_size=2, num_workers=1, timeout_s=timeout_s))
        try:
            run_epoch(broken, name=f"demo loader ({fault})")
            raise AssertionError("the broken loader should have failed")
        except DataError as exc:
            lines.append(f"{fault}: {exc}\n")
    left = live_children() - before
    assert not left, f"worker processes left behind: {sorted(left)}"
    return "\n".join(lines + ["no worker process left behind"])
