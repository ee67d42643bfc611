"""The ``compile`` candidate: ``model.compile()`` (torch.compile of the model's forward), chosen from the probe,
judged with its compile time apart from its step time, and written where the model is built.

- :func:`compile_candidates` chooses it (and, on CUDA only, ``mode="reduce-overhead"``: CUDA graphs);
- :func:`compile_judgement` turns the engine's judgement of its runs into tune's verdict: a graph break rejects it,
  and a per-step gain that the compile time would not pay back within the job's steps is "no gain";
- :func:`compile_edits` is its source edit.

The compile time is the time inside torch's compiler, measured in the user's process
(:mod:`helpers.tune.hook_compile`: the compiler's start and end callbacks) and taken out of the steps it fell in,
so that the step times the engine compares are the compiled model's own. It pays after ``compile time / (the
unmodified step - the compiled step)`` optimizer steps.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any, Sequence

__all__ = ["COMPILE_TIMEOUT_S", "break_even", "cannot_pay", "compile_candidates", "compile_edits",
           "compile_judgement", "smaller_last_batch"]

#: Seconds added to each run's timeout in a session that tries ``torch.compile``: its first step holds the
#: compilation (27 s for a 3-layer MLP on this 2-core CPU under load 3.8, 2026-12-07), which the probe's timing did
#: not foresee. Tune's own choice, not a measured bound.
COMPILE_TIMEOUT_S = 300.0


def compile_candidates(probe: dict[str, Any]) -> tuple[list[tuple[str, str, dict, str]], list[tuple[str, str]]]:
    """The ``compile`` candidates of the probed script.

    ``torch.compile`` of the model (``apply={"compile": "default"}``) where the probe found the model, the script
    does not compile it already, and DistributedDataParallel does not wrap it; and on a CUDA device also
    ``mode="reduce-overhead"`` (CUDA graphs, ``apply={"compile": "reduce-overhead"}``), both of technique
    ``compile`` (the faster one is written). ``"reduce-overhead"`` is "a mode that reduces the overhead of python
    with CUDA graphs, useful for small batches" (``torch.compile``'s docstring, torch 2.13 ``torch/__init__.py``).

    A DDP model is left out: torch.compile supports the DDP-wrapped model, whose graph Dynamo's DDPOptimizer
    splits at DDP's gradient buckets so that the all-reduce still overlaps the backward (the torch.compile FAQ, "Do
    you support Distributed code?", https://pytorch.org/docs/stable/torch.compiler_faq.html; torch 2.13
    ``torch/_dynamo/backends/distributed.py``); compiling the inner module before the wrap would run its whole
    backward as one graph before any bucket is reduced. Tune does not measure either under torchrun yet.

    Parameters
    ----------
    probe : dict
        The hook's result of the unmodified script.

    Returns
    -------
    (list of (name, technique, apply, why), list of (technique, reason))
        The candidates as :class:`helpers.tune.candidates.Candidate`'s fields (that module builds them).
    """
    model = probe.get("model") or {}
    device = model.get("param_device") or "cpu"
    if not model:
        return [], [("compile", "no model was found: the optimizer was not built from a model's parameters in the "
                                "script's own files")]
    if model.get("compiled"):
        return [], [("compile", "the script compiles its model already (torch.compile or model.compile())")]
    if model.get("wrapper") == "DistributedDataParallel" or (probe.get("ddp") or {}).get("wrapped"):
        return [], [("compile", "the model is wrapped in DistributedDataParallel: compile the wrapped model "
                                "(model = torch.compile(model) after the DDP wrap, so that Dynamo's DDPOptimizer "
                                "splits the graph at the gradient buckets); tune does not measure it under torchrun "
                                "yet")]
    out = [("torch.compile", "compile", {"compile": "default"},
            f"the model's forward runs op by op in eager mode on the {device}")]
    skipped: list[tuple[str, str]] = []
    if device == "cuda":
        out.append(('torch.compile mode="reduce-overhead"', "compile", {"compile": "reduce-overhead"},
                    "CUDA graphs replay the compiled step's kernels with one launch"))
    else:
        skipped.append(("compile", f'mode="reduce-overhead" (CUDA graphs) is tried on a CUDA device only; the model '
                                   f"is on the {device}"))
    return out, skipped


def smaller_last_batch(probe: dict[str, Any]) -> str:
    """Where the probe's DataLoader ends each epoch on a smaller batch (its dataset's length is not a multiple of
    the batch size; ``drop_last`` is not seen, so it is assumed False, torch's default): ``"200 samples = 12 x 16 +
    8"``; else "". A compiled model meets a new shape there and compiles again (Dynamo's dynamic shapes)."""
    for ld in probe.get("loaders") or []:
        n, b = ld.get("dataset_len"), (ld.get("effective") or {}).get("batch_size")
        if isinstance(n, int) and isinstance(b, int) and b > 0 and n > b and n % b:
            return f"{n} samples = {n // b} x {b} + {n % b}"
    return ""


def break_even(compile_s: float, base_step_s: float, step_s: float) -> float:
    """The optimizer steps after which ``compile_s`` seconds of compilation are paid back by a step of ``step_s``
    instead of ``base_step_s`` seconds (``compile_s / (base_step_s - step_s)``, rounded up); ``inf`` where the
    compiled step is not shorter.

    Raises
    ------
    ValueError
        If ``compile_s`` is negative or a step time is not positive.
    """
    if compile_s < 0 or not (base_step_s > 0 and step_s > 0):
        raise ValueError(f"break_even: needs compile_s >= 0 and step times > 0, got {compile_s}, {base_step_s}, "
                         f"{step_s}")
    saved = base_step_s - step_s
    return math.ceil(compile_s / saved) if saved > 0 else math.inf


def cannot_pay(run: Any, base_runs: Sequence[Any], job_steps: int | None) -> str:
    """Why a ``compile`` candidate need not run again after ``run`` (for :func:`helpers.tune.engine.measure`'s
    ``decided``; "" for another candidate's run), or "": a graph break (its verdict is "rejected" whatever the
    step times), or, where the job's steps are known, a compile time longer than all of the job's steps take
    unmodified (``job_steps`` x the median step of the same round's unmodified run): it could not pay back even were
    each compiled step free. That bound holds whatever the machine's load did to the step times of one run; a
    smaller gain that would not pay back is judged over all the rounds (:func:`compile_judgement`)."""
    info = run.result.get("compile") or {}
    if not info or not (run.result.get("applied") or {}).get("compile"):  # a script that compiles on its own
        return ""
    if info.get("graph_breaks"):
        return f"torch.compile broke the model's graph {info['graph_breaks']} time(s)"
    same = [b for b in base_runs if b.round == run.round and b.step_times_s]
    if job_steps is None or not same:
        return ""
    base = statistics.median(same[0].step_times_s)
    cost = float(info.get("compile_s") or 0.0)
    if cost <= job_steps * base:
        return ""
    return (f"compiling took {cost:.0f} s, more than your job's {job_steps:,} steps take unmodified: {job_steps:,} x "
            f"{base * 1e3:.0f} ms, the median step of round {run.round + 1}'s unmodified run; it cannot pay back "
            f"even were each compiled step free")


def compile_judgement(j: Any, runs: Sequence[Any], probe: dict[str, Any], job_steps: int | None,
                      job_how: str, base: Sequence[Any] = ()) -> Any:
    """Tune's verdict on a ``compile`` candidate from the engine's judgement ``j`` of its ``runs``.

    - a graph break in any run (``torch._dynamo.utils.counters["graph_break"]``, :mod:`helpers.tune.hook_compile`):
      "rejected", with the first reason: each break runs the code between graphs eagerly, and a model that breaks
      its graph is not one tune proposes to compile;
    - a failed run keeps the engine's "rejected" (its error is the compiler's);
    - "faster": the compile time (mean over the runs; where the loader ends each epoch on a smaller batch and no run
      reached it, one more compilation as long as the first forward's is added and said to be estimated) is set
      against the time saved per step; where the job's steps are known (``job_steps``) and fewer than
      :func:`break_even`'s, the verdict becomes "no gain"; where they are not known, it stays "faster" and says so.

    Parameters
    ----------
    j : helpers.tune.engine.Judgement
    runs : sequence of helpers.tune.engine.Run
        The candidate's runs (their ``result["compile"]``).
    probe : dict
        The unmodified script's probe (its loaders, for :func:`smaller_last_batch`).
    job_steps : int or None
        The optimizer steps the user's command runs (:func:`helpers.tune.session.job_steps`), None where unknown.
    job_how : str
        How they were counted, or why they are not known.
    base : sequence of helpers.tune.engine.Run, optional
        The unmodified runs: where :func:`cannot_pay` stopped the candidate after one run, its reason is the
        verdict's ("no gain" where the engine said "faster"; a busy machine's "inconclusive" stays).

    Returns
    -------
    helpers.tune.engine.Judgement
        A copy of ``j`` with the verdict and reason above; ``j`` itself where no run recorded a compile.
    """
    info = [r.result.get("compile") for r in runs if r.result.get("compile")]
    if not info:
        return j
    breaks = [x for x in info if x.get("graph_breaks")]
    if breaks:
        x = breaks[0]
        reasons = "; ".join(x.get("break_reasons") or []) or "no reason recorded"
        return dataclasses.replace(j, verdict="rejected", reason=(
            f"torch.compile broke the model's graph {x['graph_breaks']} time{'s' if x['graph_breaks'] != 1 else ''} "
            f"({reasons}): the code between the graphs runs eagerly, so tune does not propose it; "
            f"TORCH_LOGS=graph_breaks shows where, and fullgraph=True makes a break an error"))
    if j.verdict == "rejected" or math.isnan(j.base_ms) or math.isnan(j.variant_ms):
        return j
    dropped = cannot_pay(runs[0], base, job_steps) if len(runs) == 1 and base else ""
    if dropped:
        return dataclasses.replace(j, verdict="no gain" if j.verdict == "faster" else j.verdict,
                                   reason=f"{j.reason}; not run again after its first run: {dropped}")
    compile_s = statistics.fmean(float(x.get("compile_s") or 0.0) for x in info)
    recompiles = max(int(x.get("recompiles") or 0) for x in info)
    last = smaller_last_batch(probe)
    extra, said = 0.0, []
    if recompiles:
        said.append(f"{recompiles} recompilation{'s' if recompiles != 1 else ''} included (a new shape or a changed "
                    f"guard)")
    elif last:
        firsts = [e["seconds"] for x in info for e in x.get("events") or [] if e.get("trigger") == "DYNAMO"]
        extra = firsts[0] if firsts else 0.0  # the first run's forward compilation
        said.append(f"+{extra:.1f} s estimated for the recompilation at the smaller last batch of each epoch "
                    f"({last}), which no timed run reached")
    cost = compile_s + extra
    steps = break_even(cost, j.base_ms / 1e3, j.variant_ms / 1e3)
    cost_text = (f"compiling took {compile_s:.1f} s (time inside torch's compiler, "
                 + (f"mean of {len(info)} runs" if len(info) > 1 else "its one run")
                 + (f"; {'; '.join(said)}" if said else "") + ")")
    if not math.isfinite(steps):
        return dataclasses.replace(j, reason=f"{j.reason}; {cost_text}, and the compiled step is not shorter")
    pays = (f"{cost_text}; it saves {j.base_ms - j.variant_ms:.1f} ms per step, so it pays after "
            f"{steps:,} optimizer steps")
    if j.verdict != "faster":
        return dataclasses.replace(j, reason=f"{j.reason}; {pays}")
    if job_steps is None:
        return dataclasses.replace(j, reason=f"{j.reason}; {pays}; tune does not know how many steps your job runs "
                                             f"({job_how}): compile only a job longer than that")
    if job_steps < steps:
        return dataclasses.replace(j, verdict="no gain", reason=(
            f"{j.reason}; but {pays}, and your job runs {job_steps:,} ({job_how}): it would not pay back"))
    return dataclasses.replace(j, reason=f"{j.reason}; {pays}, of the {job_steps:,} your job runs ({job_how})")


def compile_edits(probe: dict[str, Any], merged: dict[str, Any]) -> list[Any]:
    """The source edit of a ``compile`` winner in ``merged`` (:func:`helpers.tune.candidates.merge_apply`):
    ``model.compile()`` (with ``mode="reduce-overhead"`` for CUDA graphs) inserted before the statement
    that builds the optimizer, where the model is built and named, as ``channels_last`` is; [] without a winner or
    where the probe saw no optimizer's construction with the model's name.

    ``nn.Module.compile()`` (torch 2.13: ``self._compiled_call_impl = torch.compile(self._call_impl, ...)``) rather
    than ``model = torch.compile(model)``: the model stays the same object, so its ``state_dict()`` keys keep their
    names; the wrapper torch.compile returns prefixes each with ``_orig_mod.``, and a checkpoint saved from it does not
    load into an uncompiled model."""
    from helpers.tune.rewrite_common import Edit

    mode = merged.get("compile")
    opt = probe.get("optimizer") or {}
    names = opt.get("model_names") or []
    if not mode or not opt.get("file") or not names:
        return []
    name = names[0]
    call = f"{name}.compile()" if mode == "default" else f'{name}.compile(mode="{mode}")'
    return [Edit("compile", opt["file"], opt["line"], {"name": name, "code": call}, "compile")]
