"""The checklist registry: every notebook of the workbook, in reading order, declared once.

Each :class:`Item` names one notebook (its number, file stem, checklist
name, title and question) and the optimizations its verdict decides; each
:class:`Optimization` names the step phases it acts on. The runner, the
profiles' validation, the parameter specs, the report, notebook 10's
selection of optimizations and the tests all read this module, so adding a
notebook means one entry here (see ``docs/adding_a_notebook.md``).

This module is part of the foundation: it imports nothing from the package.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "BASELINE",
    "CHECKLIST",
    "END_TO_END",
    "INPUT_PHASES",
    "Item",
    "OPTIMIZATIONS",
    "Optimization",
    "PHASES",
    "item",
    "notebook_ids",
    "optimization",
    "optimization_names",
]

#: The phases of a timed training step (:class:`helpers.compute.train.TimedLoop`), in order.
PHASES: tuple[str, ...] = ("data", "h2d", "compute")
#: The phases in which the computation waits for input: their share of the step is *exposed input*.
INPUT_PHASES: tuple[str, ...] = ("data", "h2d")


@dataclass(frozen=True)
class Optimization:
    """One optimization that notebook 10 can switch on in the optimized job.

    Attributes
    ----------
    name : str
        Identifier used by notebook 10's ``optimizations`` parameter, e.g. ``"batched_decode"``.
    notebook : str
        Id (file stem) of the notebook whose verdict decides it, e.g. ``"02_batched_decode"``.
    acts_on : tuple of str
        The step phases (from :data:`PHASES`) where its effect must show. Input side: data and h2d
        (batched decode also moves the conversion and normalization into h2d). Compute side:
        compute; channels_last also converts the images to NHWC in the h2d phase, so h2d counts too.
    decision : str
        Empty when the notebook's verdict decides this optimization. Otherwise the key of the verdict's
        ``extra`` that holds this optimization's own decision (a notebook that measures two alternatives:
        notebook 02 decides batched decode by its verdict and the decode-once cache under
        ``extra["dataset_cache"]``, a mapping with ``recommendation``, ``reason`` and ``action``).
    requires : str
        Another optimization this one only works with (empty: none); e.g. the decode-once cache feeds the
        batched pipeline, so it needs ``batched_decode``.
    """

    name: str
    notebook: str
    acts_on: tuple[str, ...]
    decision: str = ""
    requires: str = ""


@dataclass(frozen=True)
class Item:
    """One notebook of the workbook.

    Attributes
    ----------
    number : str
        Two digits, e.g. ``"01"``.
    id : str
        File stem of the notebook, e.g. ``"01_baseline_profiling"``.
    name : str
        Checklist item name, e.g. ``"baseline profiling"`` (the report's row label).
    title : str
        The notebook's first heading, e.g. ``"Find where a training step spends its time"``.
    question : str
        The question it answers, in one sentence.
    optimizations : tuple of str
        Names of the :class:`Optimization` entries its verdict decides (may be empty).
    """

    number: str
    id: str
    name: str
    title: str
    question: str
    optimizations: tuple[str, ...] = ()


CHECKLIST: tuple[Item, ...] = (
    Item("00", "00_environment_check", "environment check",
         "Check what this machine can do before you tune anything",
         "What device, versions, CPU features and settings does this machine have; is torch_npu/CANN usable?"),
    Item("01", "01_baseline_profiling", "baseline profiling",
         "Find where a training step spends its time",
         "Where does a training step's time go, and is the job host-bound?"),
    Item("02", "02_batched_decode", "batched decode",
         "Decode a whole batch at once, on every core",
         "How much faster is decoding a whole batch on a thread pool than per-image PIL, or once for all epochs?",
         ("batched_decode", "dataset_cache")),
    Item("03", "03_dataloader_tuning", "DataLoader tuning",
         "Tune the DataLoader's workers for this machine",
         "Which num_workers / prefetch_factor / persistent_workers is best here?",
         ("dataloader_workers",)),
    Item("04", "04_pinned_memory", "pinned memory",
         "Measure what pinned memory buys a host-to-device copy",
         "Pageable vs pinned vs a reused pinned buffer: host-to-device bandwidth vs size, as a share of the link",
         ("pinned_memory",)),
    Item("05", "05_stream_overlap", "stream overlap",
         "Hide the input pipeline behind compute",
         "How much input time hides behind compute with worker processes and a side-stream prefetcher?",
         ("prefetcher",)),
    Item("06", "06_mixed_precision", "mixed precision",
         "Decide whether mixed precision speeds up training here",
         "Does autocast (bf16/fp16) speed up this training step here, and does it still learn the same?",
         ("mixed_precision",)),
    Item("07", "07_channels_last", "channels_last",
         "Test channels_last and operator fusion on the training model",
         "Does channels_last (NHWC) help the conv encoder here, and what do torch.compile and SDPA give?",
         ("channels_last",)),
    Item("08", "08_collectives", "collectives",
         "Measure collectives and tune DDP's communication",
         "Allreduce bus bandwidth vs message size, DDP's buckets and gradient compression on this backend"),
    Item("09", "09_memory_and_batch_size", "memory and batch size",
         "Measure memory per step and find the largest batch that fits",
         "Allocated, reserved and peak memory per step; the largest batch that fits with a margin"),
    Item("10", "10_end_to_end", "end to end",
         "Prove the speedup end to end: the same training job before and after",
         "The baseline job vs the same job with every optimization the earlier verdicts recommend"),
)

#: The optimizations of notebook 10's optimized job, in checklist order.
OPTIMIZATIONS: tuple[Optimization, ...] = (
    Optimization("batched_decode", "02_batched_decode", ("data", "h2d")),
    Optimization("dataset_cache", "02_batched_decode", ("data", "h2d"), decision="dataset_cache",
                 requires="batched_decode"),
    Optimization("dataloader_workers", "03_dataloader_tuning", ("data", "h2d")),
    Optimization("pinned_memory", "04_pinned_memory", ("data", "h2d")),
    Optimization("prefetcher", "05_stream_overlap", ("data", "h2d")),
    Optimization("mixed_precision", "06_mixed_precision", ("compute",)),
    Optimization("channels_last", "07_channels_last", ("h2d", "compute")),
)

#: Optimization name -> the step phases it acts on, where its effect must show (and nowhere else).
ACTS_ON: dict[str, tuple[str, ...]] = {o.name: o.acts_on for o in OPTIMIZATIONS}

#: The notebook that measures the job as it is (its verdict: host-bound, balanced or device-bound).
BASELINE = "01_baseline_profiling"
#: The notebook whose verdict is the run's summary (the optimized job against the baseline).
END_TO_END = "10_end_to_end"


def notebook_ids() -> tuple[str, ...]:
    """The ids (file stems) of all notebooks, in reading order."""
    return tuple(i.id for i in CHECKLIST)


def optimization_names() -> tuple[str, ...]:
    """The names of :data:`OPTIMIZATIONS`, in checklist order."""
    return tuple(o.name for o in OPTIMIZATIONS)


def item(key: str) -> Item:
    """The checklist item of a notebook, by number (``"01"``), id or file name.

    Raises
    ------
    KeyError
        If no notebook has that number or id; the message lists the known ids.
    """
    key = str(key).removesuffix(".ipynb")
    for i in CHECKLIST:
        if key in (i.number, i.id):
            return i
    raise KeyError(f"no checklist item {key!r}; known: {', '.join(notebook_ids())} (helpers/checklist.py)")


def optimization(name: str) -> Optimization:
    """The optimization called ``name``.

    Raises
    ------
    KeyError
        If there is none; the message lists the valid names.
    """
    for o in OPTIMIZATIONS:
        if o.name == name:
            return o
    raise KeyError(f"unknown optimization {name!r}; valid: {', '.join(optimization_names())}")


def notebook_ref(name: str) -> str:
    """How advice names a notebook, by its checklist name: ``"notebook 03 (notebooks/03_dataloader_tuning.ipynb)"``.

    Raises
    ------
    KeyError
        If no checklist item has that name.
    """
    for i in CHECKLIST:
        if i.name == name:
            return f"notebook {i.number} (notebooks/{i.id}.ipynb)"
    raise KeyError(f"no checklist item named {name!r}; known: {', '.join(i.name for i in CHECKLIST)}")
