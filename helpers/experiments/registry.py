"""The registry: every notebook's :class:`helpers.experiments.base.Experiment`, found in its module.

Each module of :mod:`helpers.experiments` that backs a notebook declares ``EXPERIMENT``; this module collects them
in checklist order (by the item's number). The runner, the report, notebook 10's selection of optimizations and
the tests read the checklist, the parameter specs and the optimizations from here, so a new notebook's module is
picked up without an edit anywhere else (docs/adding_a_notebook.md).
"""

from __future__ import annotations

from helpers import checklist, specs

__all__ = ["item", "items", "notebook_ids", "optimization", "optimization_names", "optimizations", "spec_for"]


def items() -> tuple[checklist.Item, ...]:
    """Every notebook's checklist item, in reading order."""
    return checklist.CHECKLIST


def notebook_ids() -> tuple[str, ...]:
    """The ids (file stems) of all notebooks, in reading order."""
    return tuple(i.id for i in items())


def item(key: str) -> checklist.Item:
    """The checklist item of a notebook, by number (``"01"``), id or file name.

    Raises
    ------
    KeyError
        If no notebook has that number or id; the message lists the known ids.
    """
    return checklist.item(key)


def optimizations() -> tuple:
    """The optimizations notebook 10 can switch on, in checklist order."""
    return checklist.OPTIMIZATIONS


def optimization_names() -> tuple[str, ...]:
    """The names of :func:`optimizations`, in checklist order."""
    return tuple(o.name for o in optimizations())


def optimization(name: str):
    """The optimization called ``name``.

    Raises
    ------
    KeyError
        If there is none; the message lists the valid names.
    """
    return checklist.optimization(name)


def spec_for(notebook: str):
    """The parameter spec (tuple of :class:`helpers.params.Param`) of a notebook, by id.

    Raises
    ------
    KeyError
        If the notebook has no spec.
    """
    return specs.spec_for(notebook)
