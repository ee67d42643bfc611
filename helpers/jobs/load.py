"""Load a user's job from ``path/to/file.py:make_job`` or ``package.module:make_job``.

The job file is the user's own code, so its failures are reported as theirs: the error names the job
spec, the part that failed (finding the file, importing it, finding the factory, calling it, what it
returned) and shows the frames of *their* files from the traceback, not the workbook's.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
import traceback
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Mapping

from helpers.errors import ParameterError
from helpers.jobs.base import Job
from helpers.jobs.supervised import JobError, SupervisedJob
from helpers.jobspec import (DEFAULT_FACTORY, FACTORY_DEFAULTS_KEY, FACTORY_PARAMS, absolute_job_spec, factory_params,
                             parse_job_spec)
from helpers.workload import DEFAULT, Workload

__all__ = ["DEFAULT_FACTORY", "FACTORY_PARAMS", "JobRequest", "load_job", "notebook_job", "parse_job_spec"]


_OURS = (str(Path(__file__).resolve().parent.parent), "<frozen importlib", "importlib/__init__.py")


def _user_frames(exc: BaseException) -> str:
    """The traceback frames of ``exc`` outside the workbook and importlib, formatted (their code, their lines)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not any(o in f.filename for o in _OURS)]
    text = "".join(traceback.format_list(frames)).rstrip()
    return f"\n{text}" if text else ""


def _import(target: str, is_file: bool, spec: str):
    if is_file:
        path = Path(target).expanduser()
        if not path.is_file():
            raise JobError(f"job file {path} does not exist (job spec {spec!r}); pass the path of your job file, "
                           "e.g. examples/image_classifier.py:make_job")
        path = path.resolve()
        folder = str(path.parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)  # its sibling modules import, and DataLoader workers (spawn) find it
        name = path.stem
        module_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module  # so that pickling its classes (spawned workers) finds them by name
        try:
            module_spec.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(name, None)
            where = (f"\n  {exc.text.rstrip()}" if isinstance(exc, SyntaxError) and exc.text else "")
            raise JobError(f"job file {path} failed to import: {type(exc).__name__}: {exc}{where}"
                           f"{_user_frames(exc)}") from exc
        return module
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as exc:
        if exc.name and target.startswith(exc.name):
            raise JobError(f"job module {target!r} is not importable (job spec {spec!r}): no module named "
                           f"{exc.name!r}; pass a file path (path/to/job.py:make_job) or install the package") \
                from exc
        raise JobError(f"job module {target!r} failed to import: {type(exc).__name__}: {exc}{_user_frames(exc)}") \
            from exc
    except Exception as exc:
        raise JobError(f"job module {target!r} failed to import: {type(exc).__name__}: {exc}{_user_frames(exc)}") \
            from exc


def load_job(spec: str, params: Mapping[str, Any] | None = None) -> Job:
    """Import a job file or module and return the :class:`~helpers.jobs.base.Job` its factory makes.

    Parameters
    ----------
    spec : str
        ``path/to/job.py:make_job`` or ``package.module:make_job`` (``:make_job`` may be left out). The
        attribute is a :class:`Job` instance, or a callable returning one.
    params : mapping, optional
        Values the factory may take by keyword (e.g. ``batch_size``, ``seed``, ``data_dir``): only those
        its signature names are passed (all of them when it takes ``**kwargs``). A positive ``max_images``
        that the factory does not take bounds a :class:`~helpers.jobs.supervised.SupervisedJob` itself
        (its ``max_items``: the first that many samples).

    Returns
    -------
    Job

    Raises
    ------
    JobError
        (a :class:`helpers.errors.ParameterError`) when the file is missing, fails to import, lacks the
        factory, the factory raises, or it returns something that is not a Job; the message names the
        spec and the failing part, with the user's own traceback frames.
    """
    try:
        target, attr, is_file = parse_job_spec(spec)
    except ParameterError as exc:
        raise JobError(str(exc)) from None
    module = _import(target, is_file, spec)
    if not hasattr(module, attr):
        names = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                       and getattr(v, "__module__", None) == module.__name__)
        raise JobError(f"job spec {spec!r}: {target} has no {attr!r}; its functions and classes: "
                       f"{', '.join(names) or 'none'}")
    factory = getattr(module, attr)
    if isinstance(factory, Job):
        return factory
    if not callable(factory):
        raise JobError(f"job spec {spec!r}: {attr} is a {type(factory).__name__}, not a Job or a function returning "
                       "one")
    kwargs = dict(params or {})
    try:
        sig = inspect.signature(factory)
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()):
            kwargs = {k: v for k, v in kwargs.items() if k in sig.parameters}
    except (TypeError, ValueError):
        kwargs = {}
    try:
        job = factory(**kwargs)
    except JobError as exc:
        raise JobError(f"job spec {spec!r}: {exc}") from exc
    except Exception as exc:
        raise JobError(f"job spec {spec!r}: {attr}({', '.join(kwargs)}) raised {type(exc).__name__}: {exc}"
                       f"{_user_frames(exc)}") from exc
    if not isinstance(job, Job):
        raise JobError(f"job spec {spec!r}: {attr}() returned a {type(job).__name__}, not a Job; return "
                       "helpers.jobs.supervised.supervised_job(...) or an instance of a helpers.jobs.base.Job "
                       "subclass")
    limit = int((params or {}).get("max_images") or 0)
    if limit and "max_images" not in kwargs and isinstance(job, SupervisedJob) and not job.max_items:
        job.max_items = limit  # the notebook's bound applies to a factory that does not take it itself
    return job


def notebook_job(params: Mapping[str, Any]) -> Job:
    """The job a notebook measures: the user's (``params["job"]``) or the built-in PPO job.

    Parameters
    ----------
    params : mapping
        The notebook's validated parameters. With a non-empty ``job``, :func:`load_job` is given the
        :data:`~helpers.jobspec.FACTORY_PARAMS` present in ``params`` (:func:`~helpers.jobspec.factory_params`)
        but the sizes listed in ``params["factory_defaults"]`` (those the user did not set: the factory keeps its
        own defaults); else :meth:`helpers.jobs.ppo.PPOJob.from_params`.

    Returns
    -------
    Job

    Raises
    ------
    JobError, helpers.errors.DataError
        As :func:`load_job` and the built-in job's data loading.
    """
    spec = str(params.get("job") or "").strip()
    if not spec:
        from helpers.jobs.ppo import PPOJob

        return PPOJob.from_params(params)
    return load_job(spec, factory_params(params))


@dataclass(frozen=True)
class JobRequest:
    """The job a child process builds (an allocator-settings child of notebook 09, a DDP rank of notebook 08): the
    user's or the built-in one, as flat JSON-able fields, resolved by :meth:`job` in the child.

    Attributes
    ----------
    spec : str
        The user's job spec, made absolute (:func:`helpers.jobspec.absolute_job_spec`: the child may run
        elsewhere); "" for the built-in PPO job.
    factory_defaults : tuple of str
        The sizes the user's factory keeps at its own defaults (:data:`helpers.jobspec.FACTORY_DEFAULTS_KEY`).
    data_dir : str
        Image folder; "" for the embedded photos.
    max_images, seed, batch_size, image_size, text_len, model_width, d_model : int
        As the notebooks' parameters of the same names (the built-in job's workload).
    any_batch_size : bool
        The built-in job's data need not hold one batch (notebook 09 draws its batches from a decoded pool, with
        repetition); False checks that it does, as every loader of the job needs.
    """

    spec: str = ""
    factory_defaults: tuple = ()
    data_dir: str = ""
    max_images: int = 0
    seed: int = 0
    batch_size: int = DEFAULT.batch_size
    image_size: int = DEFAULT.image_size
    text_len: int = DEFAULT.text_len
    model_width: int = DEFAULT.model_width
    d_model: int = DEFAULT.d_model
    any_batch_size: bool = False

    @classmethod
    def from_params(cls, params: Mapping[str, Any], *, any_batch_size: bool = False) -> "JobRequest":
        """The request of a notebook's parameters (``job``, ``factory_defaults``, ``data_dir``, ``max_images`` and
        the workload's names; missing ones default)."""
        names = {f.name for f in fields(cls)} - {"spec", "factory_defaults", "any_batch_size"}
        spec = str(params.get("job") or "").strip()
        return cls(spec=absolute_job_spec(spec) if spec else "",
                   factory_defaults=tuple(params.get(FACTORY_DEFAULTS_KEY) or ()),
                   any_batch_size=any_batch_size,
                   **{k: (str(params[k] or "") if k == "data_dir" else int(params[k] or 0))
                      for k in names if k in params})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "JobRequest":
        """The request back from :meth:`as_dict` (a child's JSON).

        Raises
        ------
        TypeError
            For a key that is not a field.
        """
        data = dict(data)
        data["factory_defaults"] = tuple(data.get("factory_defaults") or ())
        return cls(**data)

    def as_dict(self) -> dict[str, Any]:
        """The fields as a JSON-able dict."""
        out = asdict(self)
        out["factory_defaults"] = list(self.factory_defaults)
        return out

    @property
    def workload(self) -> Workload:
        """The built-in job's workload."""
        return Workload.from_params(asdict(self))

    def job(self) -> Job:
        """The job: the user's (:func:`load_job` of :attr:`spec` with the factory's parameters but those it keeps
        at its defaults) or the built-in PPO job on :attr:`data_dir`.

        Raises
        ------
        JobError, helpers.errors.DataError
            As :func:`load_job` and the built-in job's data loading.
        """
        if self.spec:
            return load_job(self.spec, factory_params({**asdict(self), FACTORY_DEFAULTS_KEY: self.factory_defaults}))
        from helpers.jobs.ppo import PPOJob

        return PPOJob.from_data(self.workload, self.data_dir, max_images=self.max_images,
                                any_batch_size=self.any_batch_size)
