"""The notebooks of a run and their parameters: discovery, profiles, ``-p`` overrides, ``--patience``.

A run's parameters come, in order, from the profile (``notebooks/profiles/<name>.yaml`` or the user's own YAML
file: its ``common`` section, then the notebook's), from ``-p NAME VALUE`` and from the runner itself (device,
results path, run folder, ``--data-dir``, ``--job``); :func:`build_parameters` validates them against the
notebook's spec (:func:`helpers.experiments.registry.spec_for`) before any notebook starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import yaml

from helpers.errors import ParameterError
from helpers.experiments import registry
from helpers.jobspec import JOB_SIZE_PARAMS
from helpers.process import cli_command
from helpers.specs import PROFILES
from helpers.workbook.rundir import RESULTS_FILE
from helpers.workbook.paths import notebooks_dir

#: Parameters the runner sets itself; profiles must not set them.
RUNNER_PARAMS = ("device", "results_path", "out_dir")

#: A profile's values that are for the built-in job only, not passed to a user's job (``--job``; ``-p`` still sets
#: them): its sizes (:data:`helpers.jobspec.JOB_SIZE_PARAMS`: the user's factory keeps its own defaults) and
#: notebook 09's demonstration memory budget (a user's batch size comes from the machine's free memory).
BUILTIN_JOB_ONLY = (*JOB_SIZE_PARAMS, "memory_budget_mib")

#: What to use instead of setting a runner-owned parameter by hand (-p or a profile).
_RUNNER_OPTIONS = {"device": "use --device", "results_path": "the run folder's results.jsonl: choose the folder "
                   "with --out", "out_dir": "the run folder: use --out", "job": "use --job, which checks the job "
                   "before any notebook starts", "data_dir": "use --data-dir, which checks the folder before any "
                   "notebook starts"}



def discover_notebooks(folder: Path | None = None) -> list[Path]:
    """Return the numbered notebooks (``NN_name.ipynb``) of ``folder``, in order."""
    folder = folder or notebooks_dir()
    return sorted(p for p in folder.glob("[0-9][0-9]_*.ipynb") if p.is_file())


def select_notebooks(notebooks: Sequence[Path], only: Sequence[str]) -> list[Path]:
    """Pick the notebooks named in ``only`` (numbers like "01" or "1", or ids).

    Raises
    ------
    ParameterError
        If a name matches no notebook (the message lists the available ones).
    """
    if not only:
        return list(notebooks)
    chosen, unknown = [], []
    for item in only:
        key = str(item).strip()
        match = [p for p in notebooks
                 if p.stem == key or (key.isdigit() and int(key) == int(p.stem[:2]))]
        if not match:
            unknown.append(key)
        for p in match:
            if p not in chosen:
                chosen.append(p)
    if unknown:
        avail = ", ".join(p.stem for p in notebooks)
        raise ParameterError(f"--only: no notebook {', '.join(map(repr, unknown))}; available: {avail}")
    return sorted(chosen)


def load_profile(name: str, folder: Path | None = None) -> dict:
    """Read a parameter profile: ``{"common": {...}, "<notebook id>": {...}}``.

    Raises
    ------
    ParameterError
        Unknown profile name (a name of :data:`helpers.specs.PROFILES` or the path of a ``.yaml`` file), a
        profile file that is not a mapping, or a section named after no notebook of the registry
        (:func:`helpers.experiments.registry.notebook_ids`).
    """
    if name in PROFILES:
        path = (folder or notebooks_dir()) / "profiles" / f"{name}.yaml"
    elif str(name).endswith((".yaml", ".yml")):  # a user's own profile file
        path = Path(name).expanduser()
        if not path.is_file():
            raise ParameterError(f"--profile: no profile file {path}; give one of {', '.join(PROFILES)} or the path "
                                 "of a YAML file with sections 'common' and/or notebook ids")
    else:
        raise ParameterError(f"--profile: {name!r} is not one of {', '.join(PROFILES)}, nor a .yaml file")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ParameterError(f"--profile: {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ParameterError(f"profile file {path.name} must hold a mapping, got {type(data).__name__}")
    unknown = [k for k in data if k != "common" and k not in registry.notebook_ids()]
    if unknown:
        raise ParameterError(f"profile file {path.name} has section(s) {', '.join(map(repr, unknown))} that name no "
                             f"notebook; known: common, {', '.join(registry.notebook_ids())}")
    common = data.get("common") or {}
    if not isinstance(common, dict):
        raise ParameterError(f"profile file {path.name}: 'common' must be a mapping of parameter names to values")
    known = {p.name for nb in registry.notebook_ids() for p in registry.spec_for(nb)}
    typos = sorted(set(common) - known)
    if typos:  # a name no notebook declares would be ignored everywhere: a typo, said before any work
        raise ParameterError(f"profile file {path.name}: 'common' sets {', '.join(map(repr, typos))}, which no "
                             "notebook declares; check the spelling against a notebook's parameters cell")
    return data


def notebook_parameter_names(path: Path) -> set[str]:
    """Names declared in the notebook's ``parameters`` cell (papermill's own parser)."""
    import papermill as pm

    return set(pm.inspect_notebook(str(path)).keys())


#: Why a notebook does not measure a user's job (yet), and where their job's figure for it is instead.
_NOT_FOR_YOUR_JOB = {
    "02": ("it measures the workbook's own batched JPEG pipeline, which your job does not use: your dataset's "
           "decode and preprocessing are notebook 01's data phase, and `diagnose`'s real vs cached runs give "
           "their whole exposed cost"),
}


def not_applicable_reason(notebook: str, job_spec: str) -> str:
    """The "not applicable" reason a notebook records for a user's job: why, and where their figure is instead."""
    why = _NOT_FOR_YOUR_JOB.get(notebook[:2], "it measures the built-in PPO job only")
    return (f"not applicable to your job yet: notebook {notebook[:2]} {why.replace('it ', 'is skipped: it ', 1)}; "
            f"your job's phase breakdown and host-bound verdict are in notebook 01, its three-run test in "
            f"`{cli_command()} diagnose --job {job_spec}`")


def job_applies(declared: set[str] | frozenset[str]) -> bool:
    """Whether a notebook with these parameters runs on a user's job: it takes ``job``, or it measures no job
    at all (no ``batch_size`` or ``data_dir``: the environment check)."""
    return "job" in declared or not ({"batch_size", "data_dir"} & set(declared))


def parse_overrides(pairs) -> dict[str, Any]:
    """``-p NAME VALUE`` pairs as ``{name: value}``, each value read as YAML (``64`` -> 64, ``[0, 2]`` -> a list).

    Raises
    ------
    ParameterError
        A name the runner sets itself (use its own option), or a value that is not valid YAML.
    """
    out: dict[str, Any] = {}
    for name, text in pairs:
        if name in RUNNER_PARAMS or name in _RUNNER_OPTIONS:
            raise ParameterError(f"-p {name}: the runner sets {name!r} ({_RUNNER_OPTIONS.get(name, '')})")
        try:
            out[name] = yaml.safe_load(str(text))
        except yaml.YAMLError as exc:
            raise ParameterError(f"-p {name} {text!r}: not a YAML value ({exc})") from None
    return out


def build_parameters(nb: Path, profile: dict, *, device: str, run_dir: Path,
                     data_dir: str | None = None, job: str | None = None,
                     overrides: dict[str, Any] | None = None) -> dict:
    """Parameters passed to one notebook: profile values, then the runner's own.

    A profile's :data:`BUILTIN_JOB_ONLY` values are for the built-in job: with ``job`` they are not passed, so
    the user's factory keeps its own sizes and notebook 09 sizes the batch from the machine's free memory;
    ``-p`` still sets them (``overrides``).

    Raises
    ------
    ParameterError
        A profile sets a name the notebook does not declare, or a value is invalid.
    """
    params = {}
    declared = notebook_parameter_names(nb)
    for source in (profile.get("common") or {}, profile.get(nb.stem) or {}):
        for key, value in source.items():
            if key in RUNNER_PARAMS:
                raise ParameterError(f"profile sets {key!r} for {nb.stem}; the runner sets it ({_RUNNER_OPTIONS[key]})")
            if key in declared:
                if not (job and key in BUILTIN_JOB_ONLY):  # the built-in job's: the user's job keeps its own
                    params[key] = value
            elif source is not profile.get("common"):
                raise ParameterError(
                    f"profile sets unknown parameter {key!r} for {nb.stem}; it declares: {', '.join(sorted(declared))}")
    params.update({k: v for k, v in (overrides or {}).items() if k in declared})
    params.update(device=device, results_path=str(run_dir / RESULTS_FILE), out_dir=str(run_dir))
    if data_dir:
        params["data_dir"] = str(data_dir)
    if job:
        params["job"] = str(job)
    params = {k: v for k, v in params.items() if k in declared}
    registry.validate_notebook_params(nb.stem, params)  # raises before any work
    return params


#: Largest ``--patience``: beyond it a notebook's run grows by hours on a small machine.
MAX_PATIENCE = 100


def apply_patience(notebook: str, params: dict, patience: int) -> dict:
    """``params`` with the notebook's interleaved repeats (:func:`helpers.experiments.registry.interleaved_repeats`)
    multiplied.

    Parameters
    ----------
    notebook : str
        Notebook id, e.g. ``"06_mixed_precision"``.
    params : dict
        Its parameters as :func:`build_parameters` made them (profile, ``-p``, runner's own).
    patience : int
        The factor, 1..:data:`MAX_PATIENCE` (1: unchanged). The value multiplied is the one in ``params``, or the
        notebook's default when the profile does not set it.

    Returns
    -------
    dict
        A new dict; notebooks without a ratio verdict get their parameters unchanged.

    Raises
    ------
    ParameterError
        A patience that is not an int in range, or a product above the parameter's maximum.
    """
    if isinstance(patience, bool) or not isinstance(patience, int) or not 1 <= patience <= MAX_PATIENCE:
        raise ParameterError(f"--patience must be an integer from 1 to {MAX_PATIENCE} (how many times as many "
                             f"interleaved repeats to measure), got {patience!r}")
    name = registry.interleaved_repeats().get(notebook)
    if patience == 1 or name is None:
        return dict(params)
    spec = {p.name: p for p in registry.spec_for(notebook)}[name]
    value = int(params.get(name, spec.default)) * patience
    if spec.maximum is not None and value > spec.maximum:
        raise ParameterError(f"--patience {patience}: {notebook}'s {name} would be {value}, above its maximum "
                             f"{spec.maximum:g}; choose a smaller --patience or a smaller {name} (-p {name} N)")
    return {**params, name: value}
