"""How a user names their job: ``path/to/job.py:make_job`` or ``package.module:make_job``.

Part of the foundation (standard library only), so the runner and the command line can read a job spec
without importing torch; :mod:`helpers.jobs.load` imports the job itself.
"""

from __future__ import annotations

import os
from pathlib import Path

from helpers.errors import ParameterError

__all__ = ["DEFAULT_FACTORY", "FACTORY_DEFAULTS_KEY", "FACTORY_PARAMS", "JOB_SIZE_PARAMS", "factory_params",
           "parse_job_spec", "absolute_job_spec"]

#: The factory name used when a spec names only a file or module.
DEFAULT_FACTORY = "make_job"

#: Notebook parameters a job factory may take by name (passed only when its signature names them).
FACTORY_PARAMS = ("data_dir", "max_images", "seed", "batch_size", "image_size")


#: The factory parameters that size a user's job. A profile's sizes are for the built-in job: for a user's job the
#: factory's own defaults stand unless the user sets them (``run -p batch_size 16``, papermill's ``-p``, or a value
#: changed in the parameters cell).
JOB_SIZE_PARAMS = ("batch_size", "image_size")

#: Key of a notebook's parameters (set by :func:`helpers.workbook.nbsetup.start` for a user's job) listing the
#: :data:`JOB_SIZE_PARAMS` the user did not set: they are not passed, so the factory keeps its own defaults.
FACTORY_DEFAULTS_KEY = "factory_defaults"


def factory_params(params) -> dict:
    """The :data:`FACTORY_PARAMS` present in ``params`` (a mapping) that a job factory is given.

    ``data_dir`` only when it is set; a name listed in ``params[FACTORY_DEFAULTS_KEY]`` (see
    :data:`FACTORY_DEFAULTS_KEY`) is left out, so that the user's factory keeps its own default for it.
    """
    keep = set(params.get(FACTORY_DEFAULTS_KEY) or ())
    return {k: params[k] for k in FACTORY_PARAMS
            if k in params and k not in keep and (k != "data_dir" or params[k])}


def parse_job_spec(spec: str) -> tuple[str, str, bool]:
    """Split ``"file.py:attr"`` / ``"pkg.mod:attr"`` into (target, attribute, is_file).

    A target ending in ``.py`` or holding a path separator is a file; ``:attr`` defaults to
    :data:`DEFAULT_FACTORY`.

    Raises
    ------
    ParameterError
        For an empty spec or an attribute that is not a Python name.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ParameterError("the job spec is empty: pass path/to/job.py:make_job or package.module:make_job")
    spec = spec.strip()
    target, sep, attr = spec.rpartition(":")
    if not sep:
        target, attr = spec, DEFAULT_FACTORY
    if not attr.isidentifier():
        raise ParameterError(f"job spec {spec!r}: {attr!r} is not a Python name; write path/to/job.py:make_job")
    is_file = target.endswith(".py") or os.sep in target or "/" in target
    return target, attr, is_file


def absolute_job_spec(spec: str) -> str:
    """``examples/job.py:make_job`` -> ``/abs/path/examples/job.py:make_job`` (a module spec is kept as it is), so
    that notebooks, which run in their own folder, find the file the user named from theirs.

    Raises
    ------
    ParameterError
        As :func:`parse_job_spec`.
    """
    target, attr, is_file = parse_job_spec(spec)
    return f"{Path(target).expanduser().resolve()}:{attr}" if is_file else f"{target}:{attr}"
