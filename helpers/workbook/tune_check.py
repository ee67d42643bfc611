"""The device check's tune step (:func:`helpers.workbook.device_check.device_check`): ``workbook tune`` on
``examples/device_habits.py`` on the lent device, so that tune's device-only candidates (TF32/HF32, host
synchronisations, tensors made on the device; :mod:`helpers.tune.candidates_device`) are measured somewhere. A
CPU-only machine cannot measure them: there the step says "not applicable" and why.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

__all__ = ["EXAMPLE", "TUNE_OPTIONS", "tune_example"]

#: The example script with the three device habits (its docstring names them).
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "device_habits.py"
#: The session's settings on the device: fewer steps and rounds than tune's defaults (5 warm-up, 20 timed, 3
#: rounds), to keep the step to a few minutes of a short loan; still within tune's own minimums.
TUNE_OPTIONS = {"warmup": 3, "steps": 10, "rounds": 2, "timeout_s": 300.0}
#: tune's device-only techniques, whose figures this step is for.
DEVICE_TECHNIQUES = ("tf32", "host_sync", "device_factory", "checkpointing")


def _kind(device: str) -> str:
    if device != "auto":
        return device
    from helpers.device import get_accelerator

    return get_accelerator("auto").kind


def tune_example(device: str, out: str | Path, *, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Run a tune session on :data:`EXAMPLE` on ``device``; its device candidates' figures.

    Parameters
    ----------
    device : str
        ``cuda``, ``npu``, ``cpu`` or ``auto``.
    out : path
        Folder for the session (``<out>/session``).
    echo : callable
        Progress lines.

    Returns
    -------
    dict
        ``status`` ("ok" or "not applicable"), ``reason`` where not applicable; else ``device``, ``candidates``
        (the device techniques tried: name, technique, verdict, speedup, 95% interval), ``not_tried`` (theirs, with
        the reason), ``reported``, ``winners``, ``proven``, ``diff`` (the written change's text) and ``seconds``.
    """
    kind = _kind(device)
    if kind not in ("cuda", "npu"):
        return {"status": "not applicable",
                "reason": f"the device is the {kind}: tune's device candidates (TF32/HF32, host synchronisations, "
                          f"tensors made on the device) apply only on a CUDA or NPU device"}
    from helpers.tune.candidates_device import device_reported
    from helpers.tune.engine import parse_command
    from helpers.tune.session import TuneOptions, tune

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    command = parse_command([sys.executable, str(EXAMPLE), "--device", kind], cwd=out)
    res = tune(command, out / "session", TuneOptions(**TUNE_OPTIONS), progress=lambda line: echo(f"tune: {line}"))
    mine = {c.name: c.technique for c in res.candidates if c.technique in DEVICE_TECHNIQUES}
    judged = [j.as_dict() for j in res.judgements if j.variant in mine]
    return {"status": "ok", "device": kind, "candidates": [dict(j, technique=mine[j["variant"]]) for j in judged],
            "not_tried": [{"technique": t, "reason": r} for t, r in res.skipped if t in DEVICE_TECHNIQUES],
            "reported": device_reported(res.probe), "winners": res.winners, "proven": res.proven,
            "diff": res.diff, "seconds": res.seconds}
