"""The parameters the notebooks share, and their validation.

Each notebook's parameter spec is declared by its experiment
(``EXPERIMENT.spec`` in ``helpers/experiments/<name>.py``, collected by
:mod:`helpers.experiments.registry`) from the building blocks here: the common
parameters, the data, the user's job, the batch's shape and the training run.
Their size defaults are :class:`helpers.workload.Workload`'s. The runner
validates a run's parameters against the specs before any notebook starts,
and each notebook validates its own parameters cell against the same spec in
its first code cell, so a bad value fails in the same words whichever way the
notebook was started (runner, papermill CLI, JupyterLab). A test keeps each
spec identical to the names in the notebook's ``parameters`` cell.
"""

from __future__ import annotations

import ast
from typing import Mapping

from helpers.params import Param, validate
from helpers.workload import DEFAULT

__all__ = ["COMMON", "DATA", "DEVICE_CHOICES", "JOB", "PROFILES", "batch", "injected_parameter_names", "training",
           "validate_params"]

DEVICE_CHOICES = ("auto", "cpu", "cuda", "npu")
PROFILES = ("smoke", "quick", "full", "classroom")

#: Every notebook's first parameters: the device, where results go, and the busy-machine threshold.
COMMON: tuple[Param, ...] = (
    Param("device", str, "auto", "device kind to run on", choices=DEVICE_CHOICES,
          hints={"gpu": "cuda", "ascend": "npu"}),
    Param("results_path", str, "", "JSON-lines results file; empty: runs/interactive/results.jsonl"),
    Param("out_dir", str, "", "folder for figures and traces; empty: runs/interactive"),
    Param("busy_cpu_share", float, 0.25,
          "share of the cores other processes may take while measuring before the verdict is inconclusive",
          minimum=0.01, maximum=1.0),
)

#: The images a notebook reads.
DATA: tuple[Param, ...] = (
    Param("data_dir", str, "", "folder of images (optional captions.csv); empty: the embedded photos"),
    Param("max_images", int, 0, "use at most this many images (0 for all)", minimum=0),
    Param("seed", int, DEFAULT.seed, "seed for data order, augmentation and model init", minimum=0),
)

#: The user's own job, in the notebooks that can measure one (the runner's --job passes it).
JOB: tuple[Param, ...] = (
    Param("job", str, "", "your own job, path/to/job.py:make_job or module:attr (empty: the built-in PPO job)"),
)


def batch(help_batch: str = "samples per training step") -> tuple[Param, ...]:
    """batch_size, image_size and text_len: the shape of a batch, defaults from :data:`helpers.workload.DEFAULT`."""
    return (
        Param("batch_size", int, DEFAULT.batch_size, help_batch, minimum=1, maximum=4096),
        Param("image_size", int, DEFAULT.image_size, "side of the square training crop, px", minimum=16,
              maximum=1024),
        Param("text_len", int, DEFAULT.text_len, "caption length in tokens (padded/truncated)", minimum=2,
              maximum=512),
    )


def training(steps_help: str = "measured training steps") -> tuple[Param, ...]:
    """model_width, d_model, steps and warmup_steps: the model's size (:data:`helpers.workload.DEFAULT`) and the
    length of a timed training run.

    Every notebook whose verdict notebook 10 applies takes the same model width by default (and every profile
    sets one job for them: tests/test_profiles.py), so a verdict is measured on the job it is applied to.
    """
    return (
        Param("model_width", int, DEFAULT.model_width, "channels of the first conv stage (stages use 1x, 2x, 4x)",
              minimum=4, maximum=512),
        Param("d_model", int, DEFAULT.d_model, "width of the text transformer", minimum=8, maximum=4096),
        Param("steps", int, 20, steps_help, minimum=1, maximum=100000),
        Param("warmup_steps", int, 3, "steps run before measuring (excluded)", minimum=0, maximum=1000),
    )


def validate_params(spec: tuple[Param, ...], values: Mapping[str, object], *, allow_unknown: bool = False) -> dict:
    """Validate and coerce one notebook's parameters against its spec.

    Parameters
    ----------
    spec : tuple of helpers.params.Param
        The notebook's spec (``EXPERIMENT.spec``; :func:`helpers.experiments.registry.spec_for`).
    values : mapping
        Parameter values; strings from the papermill command line are coerced
        to the declared type (``"32"`` -> 32, ``"false"`` -> False).
    allow_unknown : bool
        Ignore names that the spec does not declare (used when reading a
        notebook's globals, which hold much more than its parameters), except
        names papermill injected (:func:`injected_parameter_names`): a misspelt
        ``-p`` name is still rejected.

    Returns
    -------
    dict
        Every declared parameter, coerced, defaults filled in.

    Raises
    ------
    ParameterError
        Listing every problem at once: the name, the value seen, what is allowed.
    """
    if allow_unknown:
        names = {p.name for p in spec} | injected_parameter_names(values)
        values = {k: v for k, v in values.items() if k in names}
    return validate(values, spec)


def injected_parameter_names(namespace: Mapping[str, object]) -> set[str]:
    """Names that papermill injected into this kernel, read from its input history.

    papermill inserts a cell that starts with ``# Parameters`` and assigns
    the values it was given. A misspelt name there (``-p batchsize 8``) only
    draws a warning from papermill and would silently run with the default;
    collecting the injected names lets validation reject it.

    Parameters
    ----------
    namespace : mapping
        A notebook's ``globals()``; IPython keeps the executed cells' sources
        in ``In`` (alias ``_ih``).

    Returns
    -------
    set of str
        Empty outside papermill (JupyterLab, nbval) or when no history exists.
    """
    history = namespace.get("In") or namespace.get("_ih") or []
    names: set[str] = set()
    for source in history if isinstance(history, (list, tuple)) else []:
        if not isinstance(source, str) or not source.lstrip().startswith("# Parameters"):
            continue
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else (
                [node.target] if isinstance(node, ast.AnnAssign) else [])
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names
