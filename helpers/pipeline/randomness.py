"""A probe that shows whether augmentation draws repeat across DataLoader workers, epochs and ranks.

Field case 1 (pytorch#5059, TorchDSP/torchsig#343): PyTorch reseeds the global
``random``, NumPy and torch generators in every DataLoader worker, but a
generator *object* made in a dataset's ``__init__`` is copied into every
worker with the same state, so every worker draws the same "random"
augmentations; and since non-persistent workers are started afresh from the
main process's copy each epoch, every epoch repeats them too. Seeding every
distributed rank with the same seed (the usual set-up) makes the ranks
repeat each other's draws, globals included.

:class:`ProbeDataset` makes exactly that mistake on purpose: it holds a
``numpy.random.Generator`` and a ``torch.Generator`` created in ``__init__``,
and each item draws one number from each of five sources (those two objects,
``random``, NumPy's global generator, torch's default generator).
:func:`run_probe` loads it through real DataLoaders, for several epochs and
several simulated ranks (each rank builds its loader exactly as a DDP job
would, with the same seed; the rank is passed to the worker init function as
:func:`helpers.pipeline.loader.LoaderConfig.to_kwargs` does, so no process
group is needed), once without and once with
:func:`helpers.pipeline.seeding.worker_init_fn`, and :func:`duplicate_summary`
counts the repeats per source.
"""

from __future__ import annotations

import logging
import os
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from helpers.errors import ParameterError
from helpers.pipeline.guarded import iterate
from helpers.pipeline.loader import LoaderConfig, close_loader, make_batch_sampler, quiet_worker_count_warning
from helpers.pipeline.sampler import batch_epoch

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

logger = logging.getLogger(__name__)

__all__ = ["SOURCES", "ProbeDataset", "ProbeResult", "run_probe", "duplicate_summary", "probe", "EPOCH_VARIANTS",
           "EpochSeededDataset", "epoch_probe"]

#: The random sources the probe draws from, in column order.
SOURCES: tuple[str, ...] = (
    "numpy Generator made in __init__",
    "torch Generator made in __init__",
    "random (global)",
    "numpy.random (global)",
    "torch (global)",
)

#: The two variants the probe compares.
VARIANTS: tuple[str, str] = ("without worker_init_fn", "with worker_init_fn")


class ProbeDataset(Dataset):
    """A batched dataset whose items are random draws, one per source, from RNGs held the common (wrong) way.

    Parameters
    ----------
    n_items : int
        Items per epoch (>= 1).
    seed : int, default 0
        Seed of the two generator objects created here, in ``__init__``
        (the mistake the probe shows).

    Notes
    -----
    ``__getitem__`` takes a list of indices (use it with
    :func:`helpers.pipeline.loader.make_batch_sampler`) and returns, per
    item, the index, the worker id (-1 in the main process), the process id
    and one draw in [0, 1) from each of :data:`SOURCES`.
    """

    def __init__(self, n_items: int, *, seed: int = 0) -> None:
        if isinstance(n_items, bool) or not isinstance(n_items, int) or n_items < 1:
            raise ParameterError(f"n_items={n_items!r}: allowed: an int >= 1")
        self.n_items = n_items
        self.rng = np.random.default_rng(seed)
        self.torch_rng = torch.Generator()
        self.torch_rng.manual_seed(seed)

    def __len__(self) -> int:
        return self.n_items

    def __getitem__(self, indices: list[int]) -> dict:
        info = torch.utils.data.get_worker_info()
        worker = -1 if info is None else int(info.id)
        rows = []
        for i in indices:
            rows.append((
                int(i), worker, os.getpid(),
                float(self.rng.random()),
                float(torch.rand((), generator=self.torch_rng)),
                random.random(),
                float(np.random.random()),
                float(torch.rand(())),
            ))
        return {"rows": rows}


@dataclass(frozen=True)
class ProbeResult:
    """Draws and their duplicate counts, before and after the fix.

    Attributes
    ----------
    draws : pandas.DataFrame
        One row per draw: ``variant``, ``rank``, ``epoch``, ``worker``,
        ``index``, ``source``, ``value`` (float in [0, 1)).
    summary : pandas.DataFrame
        :func:`duplicate_summary` of ``draws``.
    num_workers, epochs, ranks, items : int
        What was run.
    """

    draws: Any
    summary: Any
    num_workers: int
    epochs: int
    ranks: int
    items: int

    def duplicates(self, variant: str) -> int:
        """Total repeated draws (over all sources) of one variant."""
        s = self.summary
        return int(s.loc[s["variant"] == variant, "repeated_draws"].sum())


def run_probe(*, epochs: int = 2, ranks: int = 2, num_workers: int = 2, items: int = 8, seed: int = 0,
              fix: bool = True, batch_size: int = 2, timeout_s: float = 60.0,
              multiprocessing_context: str | None = None) -> "pd.DataFrame":
    """Load :class:`ProbeDataset` for ``epochs`` x ``ranks`` and return every draw.

    Each simulated rank builds its loader from the same
    :class:`~helpers.pipeline.loader.LoaderConfig` (same seed, as every rank
    of a DDP job does) with ``persistent_workers=False``, so each epoch
    starts new workers from the main process's copy of the dataset.

    Parameters
    ----------
    epochs : int
        Epochs per rank (>= 1).
    ranks : int
        Simulated ranks (>= 1).
    num_workers : int
        Worker processes (>= 1: the problem only exists with workers).
    items : int
        Items per epoch (>= num_workers x batch_size, so every worker draws).
    seed : int
        Loader seed (same on every rank) and seed of the dataset's generators.
    fix : bool
        Pass :func:`helpers.pipeline.seeding.worker_init_fn` (bound to the
        rank); False leaves torch's default seeding only.
    batch_size : int
        Items per task sent to a worker.
    timeout_s : float
        Loader timeout (a hang becomes an error).
    multiprocessing_context : str, optional
        Start method for the workers.

    Returns
    -------
    pandas.DataFrame
        Columns ``variant`` (one of :data:`VARIANTS`), ``rank``, ``epoch``,
        ``worker``, ``index``, ``source``, ``value``.

    Raises
    ------
    ParameterError
        For out-of-range counts.
    """
    import pandas as pd

    for name, value, low in (("epochs", epochs, 1), ("ranks", ranks, 1), ("num_workers", num_workers, 1),
                             ("batch_size", batch_size, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ParameterError(f"{name}={value!r}: allowed: an int >= {low}")
    if not isinstance(items, int) or items < num_workers * batch_size:
        raise ParameterError(
            f"items={items!r}: allowed: an int >= num_workers x batch_size = {num_workers * batch_size}, "
            "so that every worker draws"
        )
    variant = VARIANTS[1] if fix else VARIANTS[0]
    config = LoaderConfig(batch_size=batch_size, num_workers=num_workers, shuffle=False, seed=seed,
                          timeout_s=timeout_s, multiprocessing_context=multiprocessing_context)
    records = []
    for rank in range(ranks):
        dataset = ProbeDataset(items, seed=seed)
        sampler = make_batch_sampler(items, config)
        kwargs = config.to_kwargs(batch_sampler=sampler, rank=rank)
        if not fix:
            # What people write: no worker_init_fn (torch seeds the global generators only).
            kwargs.pop("worker_init_fn")
        with quiet_worker_count_warning():  # LoaderConfig already warned about workers > cores, once
            loader = DataLoader(dataset, **kwargs)
        for epoch in range(epochs):
            with iterate(loader, name=f"randomness probe (rank {rank}, epoch {epoch})") as it:
                for batch in it:
                    for index, worker, _pid, *values in batch["rows"]:
                        for source, value in zip(SOURCES, values):
                            records.append((variant, rank, epoch, int(worker), int(index), source, float(value)))
    return pd.DataFrame(records, columns=["variant", "rank", "epoch", "worker", "index", "source", "value"])


def _pairs_differing_in(group: "pd.DataFrame", dim: str, same: tuple[str, ...]) -> bool:
    """True if two rows of ``group`` share ``same`` columns but differ in ``dim``."""
    for _, sub in group.groupby(list(same)):
        if sub[dim].nunique() > 1:
            return True
    return False


def duplicate_summary(draws: "pd.DataFrame") -> "pd.DataFrame":
    """Count repeated draws per variant and source.

    A value drawn more than once (exactly equal floats: identical generator
    states give identical bits; unrelated 53-bit draws collide with
    negligible probability) is a *repeat*. Each repeated value is also
    classified by where its copies were drawn: in different workers of the
    same rank and epoch, in different epochs of the same rank and worker, in
    different ranks of the same epoch and worker.

    Parameters
    ----------
    draws : pandas.DataFrame
        From :func:`run_probe`.

    Returns
    -------
    pandas.DataFrame
        One row per variant and source: ``variant``, ``source``, ``draws``,
        ``distinct``, ``repeated_draws`` (= draws - distinct),
        ``repeated_share`` (0..1), and ``across_workers``, ``across_epochs``,
        ``across_ranks``: how many distinct values repeat in that way.
    """
    import pandas as pd

    rows = []
    for (variant, source), g in draws.groupby(["variant", "source"], sort=False):
        counts = g["value"].value_counts()
        repeated_values = counts[counts > 1].index
        across = {"across_workers": 0, "across_epochs": 0, "across_ranks": 0}
        dup = g[g["value"].isin(repeated_values)]
        for _, copies in dup.groupby("value"):
            if _pairs_differing_in(copies, "worker", ("rank", "epoch")):
                across["across_workers"] += 1
            if _pairs_differing_in(copies, "epoch", ("rank", "worker")):
                across["across_epochs"] += 1
            if _pairs_differing_in(copies, "rank", ("epoch", "worker")):
                across["across_ranks"] += 1
        n, distinct = len(g), int(g["value"].nunique())
        rows.append({"variant": variant, "source": source, "draws": n, "distinct": distinct,
                     "repeated_draws": n - distinct, "repeated_share": (n - distinct) / n if n else 0.0, **across})
    out = pd.DataFrame(rows)
    order = {s: i for i, s in enumerate(SOURCES)}
    vorder = {v: i for i, v in enumerate(VARIANTS)}
    out = out.sort_values(by=["variant", "source"], key=lambda c: c.map(vorder if c.name == "variant" else order))
    return out.reset_index(drop=True)


def probe(*, epochs: int = 2, ranks: int = 2, num_workers: int = 2, items: int | None = None, seed: int = 0,
          batch_size: int = 2, timeout_s: float = 60.0, multiprocessing_context: str | None = None) -> ProbeResult:
    """Run the probe without and with the fix and summarize the repeats.

    Parameters
    ----------
    epochs, ranks, num_workers, seed, batch_size, timeout_s, multiprocessing_context
        See :func:`run_probe`.
    items : int, optional
        Items per epoch; default ``2 x num_workers x batch_size`` (each
        worker handles two tasks).

    Returns
    -------
    ProbeResult
    """
    import pandas as pd

    if items is None:
        items = 2 * num_workers * batch_size
    frames = [run_probe(epochs=epochs, ranks=ranks, num_workers=num_workers, items=items, seed=seed, fix=fix,
                        batch_size=batch_size, timeout_s=timeout_s, multiprocessing_context=multiprocessing_context)
              for fix in (False, True)]
    draws = pd.concat(frames, ignore_index=True)
    return ProbeResult(draws=draws, summary=duplicate_summary(draws), num_workers=num_workers, epochs=epochs,
                       ranks=ranks, items=items)


# --------------------------------------------------------------------------- the epoch in persistent workers

#: The three ways the epoch can reach the workers that :func:`epoch_probe` compares.
EPOCH_VARIANTS: tuple[str, str, str] = (
    "set_epoch, new workers each epoch",
    "set_epoch, persistent workers",
    "epoch from the sampler, persistent workers",
)


class EpochSeededDataset(Dataset):
    """Items whose "augmentation" is drawn from ``(seed, epoch, index)``, as the workbook's datasets draw crops.

    Parameters
    ----------
    n_items : int
        Items per epoch (>= 1).
    seed : int, default 0
    use_sampler_epoch : bool, default True
        Read the epoch from the batch of indices (:class:`helpers.pipeline.sampler.EpochIndices`, tagged by
        the sampler in the main process); False reads only ``self.epoch``, which :meth:`set_epoch` changes
        in the process that calls it: the main process, not a persistent worker's copy (pytorch#97326).

    Notes
    -----
    ``__getitem__`` takes a list of indices and returns ``{"rows": [(index, epoch seen, draw), ...]}``.
    """

    def __init__(self, n_items: int, *, seed: int = 0, use_sampler_epoch: bool = True) -> None:
        if isinstance(n_items, bool) or not isinstance(n_items, int) or n_items < 1:
            raise ParameterError(f"n_items={n_items!r}: allowed: an int >= 1")
        self.n_items, self.seed, self.use_sampler_epoch, self.epoch = n_items, int(seed), bool(use_sampler_epoch), 0

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch, in this process's copy of the dataset."""
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return self.n_items

    def __getitem__(self, indices: list[int]) -> dict:
        epoch = batch_epoch(indices, self.epoch) if self.use_sampler_epoch else self.epoch
        return {"rows": [(int(i), epoch, float(np.random.default_rng([self.seed, epoch, int(i)]).random()))
                         for i in indices]}


def epoch_probe(*, epochs: int = 2, num_workers: int = 2, items: int = 8, seed: int = 0, batch_size: int = 2,
                timeout_s: float = 60.0, multiprocessing_context: str | None = None) -> "pd.DataFrame":
    """Show whether each epoch draws new augmentations, for the three ways of passing the epoch.

    Each variant loads :class:`EpochSeededDataset` for ``epochs`` epochs through a real DataLoader whose
    sampler is :func:`~helpers.pipeline.loader.make_batch_sampler`'s, calling ``dataset.set_epoch(e)`` and
    ``sampler.set_epoch(e)`` in the main process before each epoch, as a training loop does:

    - ``set_epoch, new workers each epoch``: ``persistent_workers=False`` re-creates the workers from the
      main process's copy each epoch, so they see the new epoch;
    - ``set_epoch, persistent workers``: the workers keep their copy from epoch 0 and never see it: every
      epoch repeats epoch 0's draws (the field case);
    - ``epoch from the sampler, persistent workers``: the fix: the sampler tags every batch of indices with
      its epoch, and the dataset reads it there.

    Parameters
    ----------
    epochs : int
        Epochs (>= 2: a repeat needs two).
    num_workers : int
        Worker processes (>= 1).
    items, seed, batch_size, timeout_s, multiprocessing_context
        As :func:`run_probe`.

    Returns
    -------
    pandas.DataFrame
        One row per variant (:data:`EPOCH_VARIANTS`): ``variant``, ``persistent_workers``, ``items``,
        ``later_epochs`` (epochs after the first), ``repeated_items`` (items whose draw in a later epoch equals
        their epoch-0 draw, summed over later epochs), ``epochs_seen`` (the epochs the workers saw, e.g.
        ``"0, 0"``).

    Raises
    ------
    ParameterError
        For out-of-range counts.
    """
    import pandas as pd

    for name, value, low in (("epochs", epochs, 2), ("num_workers", num_workers, 1), ("batch_size", batch_size, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ParameterError(f"{name}={value!r}: allowed: an int >= {low}")
    if not isinstance(items, int) or items < num_workers * batch_size:
        raise ParameterError(f"items={items!r}: allowed: an int >= num_workers x batch_size = "
                             f"{num_workers * batch_size}")
    rows = []
    for variant, persistent, from_sampler in zip(EPOCH_VARIANTS, (False, True, True), (False, False, True)):
        config = LoaderConfig(batch_size=batch_size, num_workers=num_workers, shuffle=True, seed=seed,
                              timeout_s=timeout_s, persistent_workers=persistent,
                              multiprocessing_context=multiprocessing_context)
        dataset = EpochSeededDataset(items, seed=seed, use_sampler_epoch=from_sampler)
        sampler = make_batch_sampler(items, config)
        with quiet_worker_count_warning():
            loader = DataLoader(dataset, **config.to_kwargs(batch_sampler=sampler))
        draws: dict[int, dict[int, float]] = {}
        seen: list[int] = []
        try:
            for epoch in range(epochs):
                dataset.set_epoch(epoch)
                sampler.set_epoch(epoch)
                got: dict[int, float] = {}
                with iterate(loader, name=f"epoch probe ({variant}, epoch {epoch})") as it:
                    for batch in it:
                        for index, epoch_seen, value in batch["rows"]:
                            got[int(index)] = float(value)
                            seen.append(int(epoch_seen))
                draws[epoch] = got
        finally:
            close_loader(loader)
        repeated = sum(1 for e in range(1, epochs) for i, v in draws[e].items() if draws[0].get(i) == v)
        per_epoch = [sorted(set(seen[k * items:(k + 1) * items])) for k in range(epochs)]
        rows.append({"variant": variant, "persistent_workers": persistent, "items": items,
                     "later_epochs": epochs - 1, "repeated_items": repeated,
                     "epochs_seen": ", ".join("/".join(map(str, s)) for s in per_epoch)})
    return pd.DataFrame(rows)
