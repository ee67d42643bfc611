"""Notebook 06's experiment: does autocast (bf16/fp16) speed up the job's training step here, and learn the same?

The notebook measures on fixed batches of the job
(:func:`helpers.experiments.training.fixed_batches`): fp32 and mixed-precision
steps timed interleaved (:func:`helpers.timing.compare`), and the loss curves
of both gated by :func:`helpers.experiments.training.learning_check` (the
gate notebook 10 uses too). :func:`verdict` turns those figures into the
notebook's :class:`helpers.verdict.Verdict`.
"""

from __future__ import annotations

from helpers.timing import Comparison
from helpers.verdict import Action, Verdict

__all__ = ["NOTEBOOK", "verdict"]

#: Notebook whose verdict :func:`verdict` gives.
NOTEBOOK = "06_mixed_precision"

_SHORT = {"bfloat16": "bf16", "float16": "fp16"}


def verdict(cmp: Comparison, *, dtype_name: str, loss_ok: bool, rel_diff: float, no_nan: bool, loss_rtol: float,
            device_kind: str, native_bf16: bool | None, context: str, loss_name: str = "value loss") -> Verdict:
    """Notebook 06's verdict: enable autocast only when it is measurably faster and learns like fp32.

    Parameters
    ----------
    cmp : helpers.timing.Comparison
        fp32 steps as A, mixed-precision steps as B (seconds per step).
    dtype_name : str
        ``"bfloat16"`` or ``"float16"``.
    loss_ok, no_nan : bool
        The learning gate passed; no loss was NaN or infinite.
    rel_diff : float
        Relative difference of the tail mean value loss, mixed vs fp32 (fraction).
    loss_rtol : float
        The gate's tolerance (fraction).
    device_kind : str
        "cpu", "cuda" or "npu".
    native_bf16 : bool or None
        On a CPU, whether it has native bf16 arithmetic (:func:`helpers.diagnose.environment.cpu_bf16_support`).
    context : str
        What was measured, in one sentence.
    loss_name : str, default "value loss"
        The loss the gate compared (the built-in job's value loss; a user's job's ``"loss"``).

    Returns
    -------
    helpers.verdict.Verdict
        metric ``speedup`` (x, fp32 time over mixed time) with its 95% interval; action on ``autocast_dtype``.
    """
    if not loss_ok:
        recommendation = "leave off"
        reason = (f"mixed precision did not reproduce fp32 training: {loss_name} difference {rel_diff:.1%} of its "
                  f"scale over the run (tolerance {loss_rtol:.0%}), NaN-free: {no_nan}")
    elif cmp.outcome() == "b_faster":
        recommendation = "enable"
        reason = (f"{cmp.verdict_text()}, {loss_name} within {rel_diff:.2%} of fp32 on its scale over the run "
                  f"(tolerance {loss_rtol:.0%})")
    else:
        recommendation = "leave off"
        reason = f"{cmp.verdict_text()}, so {dtype_name} autocast does not pay here"
    if device_kind == "cpu" and dtype_name == "bfloat16":
        reason += f"; CPU native bf16: {native_bf16}"
    elif device_kind == "cpu":
        reason += f"; {dtype_name} autocast on a CPU is not what CPUs accelerate (they accelerate bf16 at most)"
    action = Action("autocast_dtype", dtype_name if recommendation == "enable" else None,
                    f"{_SHORT.get(dtype_name, dtype_name)} autocast: {recommendation}", current="float32")
    return Verdict(notebook=NOTEBOOK, metric="speedup", value=cmp.ratio, unit="x", recommendation=recommendation,
                   reason=reason, context=context, action=action, repeats=min(cmp.a.repeats, cmp.b.repeats),
                   spread={"ci_low": cmp.ci_low, "ci_high": cmp.ci_high, "confidence": cmp.confidence})
