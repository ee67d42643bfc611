"""The registry: every notebook's :class:`helpers.experiments.base.Experiment`, found in its module.

Each module of :mod:`helpers.experiments` that backs a notebook declares ``EXPERIMENT``; this module imports the
package's modules once, on first use, and collects these objects in checklist order (by the item's number). The
runner, the report, notebook 10's selection of optimizations and the tests read the checklist, the parameter specs
and the optimizations from here, so a new notebook's module is picked up without an edit anywhere else
(docs/adding_a_notebook.md). The experiment modules import torch, so the first call makes that import safe
(:func:`helpers.npu_probe.prepare_torch_import`) and takes a couple of seconds.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from typing import Mapping

from helpers.checklist import Item
from helpers.errors import ParameterError
from helpers.experiments.base import Experiment, Optimization
from helpers.npu_probe import prepare_torch_import
from helpers.params import Param
from helpers.specs import validate_params

__all__ = ["acts_on", "experiment", "experiments", "interleaved_repeats", "item", "items", "notebook_ids",
           "optimization", "optimization_names", "optimizations", "spec_for", "validate_notebook_params"]


@functools.lru_cache(maxsize=1)
def experiments() -> tuple[Experiment, ...]:
    """Every module's ``EXPERIMENT``, in checklist order (by the item's two-digit number).

    Raises
    ------
    ValueError
        If two experiments have the same number or id, or two declare the same optimization.
    """
    import helpers.experiments as package

    # the experiments import torch: make that import safe first (a broken torch_npu would crash this process;
    # cached per process, and instant where torch_npu is not installed)
    prepare_torch_import(fallback_to_cpu=True)
    found: list[Experiment] = []
    for info in pkgutil.iter_modules(package.__path__):
        if info.name in ("base", "registry"):
            continue
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        declared = getattr(module, "EXPERIMENT", None)
        if isinstance(declared, Experiment):
            found.append(declared)
    found.sort(key=lambda e: e.item.number)
    for key in ("number", "id"):
        values = [getattr(e.item, key) for e in found]
        twice = sorted({v for v in values if values.count(v) > 1})
        if twice:
            raise ValueError(f"two experiments declare the same notebook {key}: {', '.join(twice)}")
    names = [o.name for e in found for o in e.optimizations]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"two experiments declare the optimization(s) {', '.join(twice)}")
    return tuple(found)


def items() -> tuple[Item, ...]:
    """Every notebook's checklist item, in reading order."""
    return tuple(e.item for e in experiments())


def notebook_ids() -> tuple[str, ...]:
    """The ids (file stems) of all notebooks, in reading order."""
    return tuple(i.id for i in items())


def experiment(key: str) -> Experiment:
    """The experiment of a notebook, by number (``"01"``), id or file name.

    Raises
    ------
    KeyError
        If no notebook has that number or id; the message lists the known ids.
    """
    key = str(key).removesuffix(".ipynb")
    for e in experiments():
        if key in (e.item.number, e.item.id):
            return e
    raise KeyError(f"no checklist item {key!r}; known: {', '.join(notebook_ids())} (each notebook's experiment "
                   "module declares EXPERIMENT: docs/adding_a_notebook.md)")


def item(key: str) -> Item:
    """The checklist item of a notebook, by number, id or file name (raises KeyError as :func:`experiment`)."""
    return experiment(key).item


def optimizations() -> tuple[Optimization, ...]:
    """The optimizations notebook 10 can switch on, in checklist order (and each notebook's declared order)."""
    return tuple(o for e in experiments() for o in e.optimizations)


def optimization_names() -> tuple[str, ...]:
    """The names of :func:`optimizations`, in checklist order."""
    return tuple(o.name for o in optimizations())


def optimization(name: str) -> Optimization:
    """The optimization called ``name``.

    Raises
    ------
    KeyError
        If there is none; the message lists the valid names.
    """
    for o in optimizations():
        if o.name == name:
            return o
    raise KeyError(f"unknown optimization {name!r}; valid: {', '.join(optimization_names())}")


def acts_on() -> dict[str, tuple[str, ...]]:
    """Optimization name -> the step phases it acts on, where its effect must show (and nowhere else)."""
    return {o.name: o.acts_on for o in optimizations()}


def interleaved_repeats() -> dict[str, str]:
    """Notebook id -> the parameter counting the interleaved repeats behind its ratio verdict (only notebooks that
    have one; :attr:`helpers.experiments.base.Experiment.interleaved_repeats`)."""
    return {e.item.id: e.interleaved_repeats for e in experiments() if e.interleaved_repeats}


def spec_for(notebook: str) -> tuple[Param, ...]:
    """The parameter spec of ``notebook`` (its file stem, e.g. ``"01_baseline_profiling"``).

    Raises
    ------
    ParameterError
        If no experiment declares that notebook.
    """
    try:
        return experiment(notebook).spec
    except KeyError:
        raise ParameterError(
            f"no parameter spec for notebook {notebook!r}; known: {', '.join(notebook_ids())}. A notebook's "
            "experiment module declares it in EXPERIMENT (docs/adding_a_notebook.md)."
        ) from None


def validate_notebook_params(notebook: str, values: Mapping[str, object], *, allow_unknown: bool = False) -> dict:
    """Validate and coerce one notebook's parameters (:func:`helpers.specs.validate_params` with its spec).

    Raises
    ------
    ParameterError
        For a notebook without a spec, or listing every bad parameter at once.
    """
    return validate_params(spec_for(notebook), values, allow_unknown=allow_unknown)
