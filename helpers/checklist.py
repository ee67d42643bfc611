"""The checklist's vocabulary: the step phases, the :class:`Item` type and the notebooks the foundation names.

Each notebook's :class:`Item` (its number, file stem, checklist name, title and question) is declared by its
experiment module (``EXPERIMENT.item`` in ``helpers/experiments/<name>.py``) and collected by
:mod:`helpers.experiments.registry`, which the runner, the profiles' validation, the report and notebook 10 read;
adding a notebook means no edit here (see ``docs/adding_a_notebook.md``). What stays here is what the foundation
itself needs: the phases of a timed step, and the ids of the notebooks whose advice it gives by name
(``tests/test_checklist.py`` checks that each is a notebook of the registry).

This module is part of the foundation: it imports nothing from the package.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "BASELINE",
    "COLLECTIVES",
    "END_TO_END",
    "INPUT_PHASES",
    "Item",
    "PHASES",
    "notebook_ref",
]

#: The phases of a timed training step (:class:`helpers.compute.train.TimedLoop`), in order.
PHASES: tuple[str, ...] = ("data", "h2d", "compute")
#: The phases in which the computation waits for input: their share of the step is *exposed input*.
INPUT_PHASES: tuple[str, ...] = ("data", "h2d")


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
        Names of the optimizations its verdict decides (:class:`helpers.experiments.base.Optimization`; may be empty).
    """

    number: str
    id: str
    name: str
    title: str
    question: str
    optimizations: tuple[str, ...] = ()


#: The notebook that measures the job as it is (its verdict: host-bound, balanced or device-bound).
BASELINE = "01_baseline_profiling"
#: The notebook whose verdict is the run's summary (the optimized job against the baseline).
END_TO_END = "10_end_to_end"
#: The notebook that measures collectives and DDP's communication (a trace's communication advice names it).
COLLECTIVES = "08_collectives"


def notebook_ref(notebook: str) -> str:
    """How advice names a notebook, by its id: ``"notebook 03 (notebooks/03_dataloader_tuning.ipynb)"``.

    Raises
    ------
    ValueError
        If ``notebook`` is not an id (two digits, an underscore, a name).
    """
    if len(notebook) < 4 or not notebook[:2].isdigit() or notebook[2] != "_":
        raise ValueError(f"notebook_ref: {notebook!r} is not a notebook id such as '03_dataloader_tuning'")
    return f"notebook {notebook[:2]} (notebooks/{notebook}.ipynb)"
