"""Which checklist techniques tune tries on a script, decided from what the unmodified script did (its probe run).

Each :class:`Candidate` is one runtime change that :mod:`helpers.tune.hook` applies (its ``apply`` dict) and one
source edit that :mod:`helpers.tune.rewrite` writes (its ``technique``). :func:`choose` reads the probe's result
(the hook's JSON: the DataLoader calls, the model, the device, autocast already in use) and returns the
candidates that apply, plus, for each technique left out, the reason.

The techniques and the notebook that measures each:

==================  ==========================================================  ========
technique           the change                                                   notebook
==================  ==========================================================  ========
``num_workers``     ``DataLoader(..., num_workers=N, persistent_workers=True)``   03
``prefetch_factor``  ``DataLoader(..., prefetch_factor=4)`` where there are workers   03
``pin_memory``      ``DataLoader(..., pin_memory=True)`` and                      04
                    ``x.to(device, non_blocking=True)``
``autocast``        ``with torch.autocast(device_type=..., dtype=torch.bfloat16)``  06
                    around the forward call; float16 with a ``GradScaler``
                    where the device has no bfloat16
``channels_last``   ``model = model.to(memory_format=torch.channels_last)``      07
``cudnn_benchmark``  ``torch.backends.cudnn.benchmark = True`` (CUDA, Conv2d)        07
``side_stream``     ``for x, y in prefetch(loader, device):`` (CUDA, NPU), with      05
                    ``pin_memory=True``; :mod:`helpers.pipeline.side_stream`
``tf32``            ``torch.set_float32_matmul_precision("high")`` before the      --
                    optimizer (CUDA: a float32 model, a GPU with TF32);
                    ``torch.npu.matmul.allow_hf32 = True`` on an NPU
                    (:mod:`helpers.tune.candidates_device`, as the next two)
``host_sync``       ``if i % 10 == 0:`` around a logging line that reads a        --
                    device value each step (CUDA, NPU: ``set_sync_debug_mode``)
``device_factory``  ``torch.zeros(..., device=device)`` for a                      --
                    ``torch.zeros(...).to(device)`` in the loop (CUDA, NPU)
``no_sync``         ``with model.no_sync() if (i + 1) % k != 0 else                08
                    contextlib.nullcontext():`` around the micro-steps of
                    gradient accumulation (:func:`ddp_candidates`)
``gradient_as_bucket_view``  ``DistributedDataParallel(..., gradient_as_bucket_view=True)``  08
``bucket_cap_mb``   ``DistributedDataParallel(..., bucket_cap_mb=N)``, N around 25  08
``comm_hook``       ``model.register_comm_hook(None, default_hooks.fp16_compress_hook)``  08
                    (``bf16_compress_hook`` where DDP accepts it)
``static_graph``    ``DistributedDataParallel(..., static_graph=True)``             08
``find_unused_parameters``  ``DistributedDataParallel(..., find_unused_parameters=False)``  08
``intra_op_threads``  ``torch.set_num_threads(N)`` after the imports, N = the usable  00, 03
                    cores less the DataLoader workers
                    (:mod:`helpers.tune.candidates_cpu`)
``allocator``       ``LD_PRELOAD=<jemalloc or tcmalloc>`` in the launch command,    --
                    not code (:mod:`helpers.tune.candidates_cpu`)
``debug_apis``      ``set_detect_anomaly(True)`` removed, ``with detect_anomaly():``  --
                    unwrapped, ``gradcheck(...)`` in the loop removed
``no_grad``         ``with torch.no_grad():`` around a loop (or statement) whose   --
                    forward calls' outputs never reach ``backward()``
``set_to_none``     ``zero_grad(set_to_none=True)``                               --
``optimizer_impl``  ``torch.optim.Adam(..., fused=True)`` (or ``foreach=True``)     --
``compile``         ``model.compile()`` before the optimizer is built;         07
                    ``mode="reduce-overhead"`` (CUDA graphs) on CUDA only; judged
                    with its compile time apart (:mod:`helpers.tune.candidates_compile`)
==================  ==========================================================  ========

``debug_apis`` to ``optimizer_impl`` are the PyTorch Performance Tuning Guide's general items
(:func:`general_candidates`); no notebook measures them. What tune finds and does not change is listed by
:func:`reported_only`.

Where the device has no bfloat16 (or it is not known to: an Ascend NPU, an older GPU), float16 autocast is tried
with a ``torch.amp.GradScaler``, as notebook 06 and the PyTorch AMP recipe write it: the loss scaled before
``backward()``, the gradients unscaled before a clip, ``scaler.step(optimizer)`` and ``scaler.update()``.

``prefetch_factor`` acts only where there are DataLoader workers. Where the script's loader has them, it is a
candidate like the others; where tune adds them, it is a follow-up (:func:`follow_up`), measured on top of the
winning number of workers and judged against it, so that its figure is its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from helpers.device import usable_cores
from helpers.tune.candidates_compile import compile_candidates

__all__ = ["Candidate", "choose", "follow_up", "framework_candidates", "general_candidates", "general_edits",
           "reported_only", "ddp_candidates", "ddp_edits", "bucket_layout", "FRAMEWORK_ARGS", "GENERAL", "NOTEBOOK",
           "PREFETCH"]

#: The notebook that explains and measures each technique.
NOTEBOOK = {"no_sync": "08", "gradient_as_bucket_view": "08", "bucket_cap_mb": "08", "comm_hook": "08",
            "static_graph": "08", "find_unused_parameters": "08",
            "num_workers": "03", "prefetch_factor": "03", "pin_memory": "04", "side_stream": "05", "autocast": "06",
            "channels_last": "07", "cudnn_benchmark": "07", "compile": "07", "intra_op_threads": "03"}
#: Where a framework sets the DataLoader or the precision, the argument to change (the frameworks' own names:
#: Lightning 2.x ``Trainer(precision=...)``; transformers ``TrainingArguments`` fields).
FRAMEWORK_ARGS = {
    "lightning": 'Trainer(precision="bf16-mixed"); num_workers= in your LightningDataModule\'s DataLoader(...)',
    "pytorch_lightning": 'Trainer(precision="bf16-mixed"); num_workers= in your LightningDataModule\'s DataLoader',
    "transformers": "TrainingArguments(bf16=True, dataloader_num_workers=N, dataloader_pin_memory=True)",
    "accelerate": 'Accelerator(mixed_precision="bf16")',
}
#: The prefetch_factor tried: twice torch's default of 2 batches in flight per worker (``torch.utils.data.DataLoader``
#: documentation: "prefetch_factor (int, optional, keyword-only arg): Number of batches loaded in advance by each
#: worker ... default value depends on the set value for num_workers. If value of num_workers=0 default is None.
#: Otherwise, if value of num_workers > 0 default is 2"). A deeper queue absorbs batches that take unevenly long
#: (random augmentation, a slow disk); it costs host memory of ``num_workers x prefetch_factor`` batches.
PREFETCH = 4


@dataclass(frozen=True)
class Candidate:
    """One technique with its settings, as tune applies it at runtime and writes it as code.

    Attributes
    ----------
    name : str
        Unique, readable: ``"num_workers=2"``, ``"autocast bfloat16"``.
    technique : str
        A key of :data:`NOTEBOOK`.
    apply : dict
        The hook spec's ``apply`` entry: ``{"loader": {...}}``, ``{"autocast": "bfloat16"}``,
        ``{"channels_last": True}``, ``{"loader": {"pin_memory": True}, "non_blocking": True}``; or, for a setting
        a framework owns, ``{"edits": [{"call", "line", "values"}]}``: keywords of a call in the script, applied by
        running an edited copy of the script (:func:`framework_candidates`); or ``{"edits": [{"kind", "line",
        "params"}]}``: a source edit of that kind, run the same way (:mod:`helpers.tune.candidates_device`).
    why : str
        Why it applies to this script (one clause, from the probe).
    against : str
        The candidate this one is judged against (a :func:`follow_up` builds on it); "" for the unmodified script.
    """

    name: str
    technique: str
    apply: dict[str, Any] = field(hash=False)
    why: str = ""
    against: str = ""


def merge_apply(candidates: list[Candidate]) -> dict[str, Any]:
    """The ``apply`` dicts of several candidates as one (DataLoader settings merged); a framework's ``edits`` are
    not runtime changes and are left out (:func:`helpers.tune.session.call_edits` writes them)."""
    out: dict[str, Any] = {}
    for c in candidates:
        for key, value in c.apply.items():
            if key in ("loader", "ddp"):  # keywords of one call
                out.setdefault(key, {}).update(value)
            elif key != "edits":
                out[key] = value
    return out


def framework_candidates(calls: list[dict[str, Any]], probe: dict[str, Any], *,
                         cores: int) -> tuple[list[Candidate], list[tuple[str, str]]]:
    """The candidates a framework owns, as keywords of its call in the script.

    Parameters
    ----------
    calls : list of dict
        :func:`helpers.tune.rewrite.framework_calls` of the script (the first call of each kind is used).
    probe : dict
        The hook's result of the unmodified script (the model's device and bfloat16 support, where found).
    cores : int
        Usable CPU cores per process.

    Returns
    -------
    (list of Candidate, list of (technique, reason))
        Lightning ``Trainer(precision="bf16-mixed")``; transformers ``TrainingArguments(dataloader_num_workers=N,
        dataloader_persistent_workers=True)`` and ``TrainingArguments(bf16=True)``; accelerate
        ``Accelerator(mixed_precision="bf16")``: each where the call does not set it already (nor passes
        ``**kwargs`` that may) and, for bfloat16, where the probe does not know the device to lack it. The names
        are the frameworks' own (Lightning 2.x ``Trainer``; transformers ``TrainingArguments`` fields;
        accelerate ``Accelerator``).
    """
    out: list[Candidate] = []
    skipped: list[tuple[str, str]] = []
    model = probe.get("model") or {}
    bf16 = model.get("bf16_supported") is not False
    seen: set[str] = set()
    for c in calls:
        if c["qualified"] in seen:
            continue
        seen.add(c["qualified"])
        kw = set(c["keywords"])
        at = {"call": c["call"], "line": c["line"]}

        def edit(values: dict[str, Any]) -> dict[str, Any]:
            return {"edits": [dict(at, values=values)]}

        lit = c.get("literals") or {}
        if c["spread"]:
            why = (f"{c['call']}(...) on line {c['line']} passes **kwargs, where its settings may be: tune leaves "
                   f"it as it is; set them where those arguments are made")
            owned = ("num_workers", "autocast") if c["framework"] == "transformers" else ("autocast",)
            skipped += [(t, why) for t in owned]
            continue
        if c["framework"] == "transformers":
            current = lit.get("dataloader_num_workers", 0 if "dataloader_num_workers" not in kw else None)
            if not isinstance(current, int) or isinstance(current, bool):
                skipped.append(("num_workers", f"{c['call']} sets dataloader_num_workers from a variable; tune "
                                               "leaves it as it is"))
            else:
                options = sorted(n for n in {2, min(max(cores, 2), 4)} if n > current)
                if not options:
                    skipped.append(("num_workers", f"{c['call']} already sets dataloader_num_workers={current}"))
                for n in options:
                    out.append(Candidate(f"dataloader_num_workers={n}", "num_workers",
                                         edit({"dataloader_num_workers": n, "dataloader_persistent_workers": True}),
                                         f"{c['call']} loads in "
                                         + ("the training process" if current == 0 else
                                            f"{current} worker{'s' if current != 1 else ''}")
                                         + f" (dataloader_num_workers={current})"))
            if lit.get("bf16") is True or lit.get("fp16") is True:
                skipped.append(("autocast", f"{c['call']} already trains in {'bf16' if lit.get('bf16') else 'fp16'}"))
            elif (kw & {"bf16", "fp16"}) - set(lit):
                skipped.append(("autocast", f"{c['call']} sets its precision from a variable; tune leaves it as "
                                            "it is"))
            elif bf16:
                out.append(Candidate("bf16=True", "autocast", edit({"bf16": True}),
                                     f"{c['call']} trains in float32"))
        elif c["framework"] in ("lightning", "pytorch_lightning"):
            if "precision" in kw:
                skipped.append(("autocast", f"{c['call']}(...) already sets precision"))
            elif bf16:
                out.append(Candidate('precision="bf16-mixed"', "autocast", edit({"precision": "bf16-mixed"}),
                                     f"the Lightning {c['call']} trains in float32"))
        elif c["framework"] == "accelerate":
            if "mixed_precision" in kw:
                skipped.append(("autocast", f"{c['call']}(...) already sets mixed_precision"))
            elif bf16:
                out.append(Candidate('mixed_precision="bf16"', "autocast", edit({"mixed_precision": "bf16"}),
                                     f"the {c['call']} trains in float32"))
    return out, skipped


def choose(probe: dict[str, Any], *, cores: int | None = None) -> tuple[list[Candidate], list[tuple[str, str]]]:
    """The candidates that apply to the probed script.

    Parameters
    ----------
    probe : dict
        The hook's result of the unmodified script (:func:`helpers.tune.hook.Recorder.result`).
    cores : int, optional
        Usable CPU cores (default: this process's affinity).

    Returns
    -------
    (list of Candidate, list of (technique, reason))
        What to measure, and what is left out and why.
    """
    if cores is None:
        cores = usable_cores()
    out: list[Candidate] = []
    skipped: list[tuple[str, str]] = []
    loaders = probe.get("loaders") or []
    model = probe.get("model") or {}
    device = model.get("param_device") or "cpu"
    on_device = device in ("cuda", "npu")
    out, skipped = general_candidates(probe)  # the Guide's general items: debugging APIs, no_grad, the optimizer
    more, why = ddp_candidates(probe)  # DistributedDataParallel and its collectives (notebook 08)
    out, skipped = out + more, skipped + why

    if not loaders:
        skipped.append(("num_workers", "the script builds no torch.utils.data.DataLoader in its own files"))
        skipped.append(("pin_memory", "the script builds no DataLoader in its own files"))
    else:
        current = max(int(ld["effective"].get("num_workers") or 0) for ld in loaders)
        options = sorted({n for n in (2, min(cores, 4), min(cores, 8)) if n > current and n >= 1})
        if not options:
            skipped.append(("num_workers", f"the DataLoader already uses num_workers={current}, "
                                           f"and this machine has {cores} cores"))
        where = "the training process" if current == 0 else f"{current} workers"
        for n in options:
            out.append(Candidate(f"num_workers={n}", "num_workers",
                                 {"loader": {"num_workers": n, "persistent_workers": True}},
                                 f"the DataLoader loads in {where}"))
        if current > 0:
            depth = min(int(ld["effective"].get("prefetch_factor") or 2) for ld in loaders
                        if ld["effective"].get("num_workers"))
            if depth >= PREFETCH:
                skipped.append(("prefetch_factor", f"the DataLoader already keeps prefetch_factor={depth} batches "
                                                   f"in flight per worker"))
            else:
                out.append(Candidate(f"prefetch_factor={PREFETCH}", "prefetch_factor",
                                     {"loader": {"prefetch_factor": PREFETCH}},
                                     f"each of the DataLoader's {current} workers keeps {depth} batches in flight"
                                     + (" (torch's default)" if depth == 2 else "")))
        if not on_device:
            skipped.append(("pin_memory", f"the model is on the {device}: there is no host-to-device copy to pin"))
        elif all(ld["effective"].get("pin_memory") for ld in loaders):
            skipped.append(("pin_memory", "the DataLoader already pins memory"))
        else:
            out.append(Candidate("pin_memory + non_blocking", "pin_memory",
                                 {"loader": {"pin_memory": True}, "non_blocking": True},
                                 f"batches are copied to the {device} from pageable memory"))
        if not on_device:
            skipped.append(("side_stream", f"the model is on the {device}: there is no host-to-device copy to "
                                           f"overlap"))
        elif not [x for x in probe.get("loop_sites") or [] if x.get("is_for", True)]:
            skipped.append(("side_stream", "the script's own files have no for loop over the DataLoader they build "
                                           "(a loop of next() calls, or a framework's loop, is not rewritten)"))
        else:
            out.append(Candidate("side-stream prefetch", "side_stream",
                                 {"loader": {"pin_memory": True}, "prefetch": True},
                                 f"each batch is copied to the {device} in the step that uses it, not beside the "
                                 f"step before"))
    more, why = compile_candidates(probe)  # torch.compile (helpers.tune.candidates_compile)
    out, skipped = out + [Candidate(*c) for c in more], skipped + why
    if not model:
        for t in ("autocast", "channels_last"):
            skipped.append((t, "no model was found: the optimizer was not built from a model's parameters in the "
                               "script's own files"))
        return out, skipped
    others = probe.get("other_optimizers") or []
    if probe.get("autocast_in_use"):
        skipped.append(("autocast", "the script already enters torch.autocast"))
    elif others:
        names = ", ".join(n for o in others for n in (o.get("model_names") or ["?"])[:1])
        skipped.append(("autocast", f"the script builds {len(others) + 1} optimizers (the other model: {names}): "
                                    f"autocast around one model's forward would hand its lower precision to the "
                                    f"other; put the whole step under torch.autocast by hand (notebook 06)"))
    elif model.get("param_dtype") not in ("float32", None):
        skipped.append(("autocast", f"the model's parameters are already {model['param_dtype']}"))
    elif model.get("bf16_supported") is True:
        out.append(Candidate("autocast bfloat16", "autocast", {"autocast": "bfloat16"},
                             f"the forward runs in float32 on the {device}"))
    elif not on_device:
        skipped.append(("autocast", f"bfloat16 is not known to be supported on this {device}, and float16 is "
                                    f"not tried there"))
    elif probe.get("step_closure"):
        skipped.append(("autocast", f"bfloat16 is not known to be supported on this {device}, and float16 needs a "
                                    f"GradScaler, whose step() does not take the closure this optimizer's step() is "
                                    f"given (LBFGS)"))
    elif not (probe.get("backward_sites") and probe.get("step_sites")):
        skipped.append(("autocast", f"bfloat16 is not known to be supported on this {device}, and float16 needs a "
                                    f"GradScaler at the loss's backward() and the optimizer's step(), which were "
                                    f"not seen in the script's own files"))
    else:
        out.append(Candidate("autocast float16 + GradScaler", "autocast", {"autocast": "float16", "grad_scaler": True},
                             f"the forward runs in float32 on the {device}, where bfloat16 is not known to be "
                             f"supported"))
    if device == "cuda" and model.get("has_conv2d"):
        if model.get("cudnn_benchmark"):
            skipped.append(("cudnn_benchmark", "the script already sets torch.backends.cudnn.benchmark"))
        else:
            out.append(Candidate("cudnn.benchmark", "cudnn_benchmark", {"cudnn_benchmark": True},
                                 "cuDNN picks its convolution algorithms by a heuristic, not by timing them"))
    if not model.get("has_conv2d"):
        skipped.append(("channels_last", "the model has no Conv2d layer"))
    elif device == "npu":
        skipped.append(("channels_last", "an Ascend NPU does not support channels_last: its Tensor.to accepts "
                                         "only contiguous_format (notebook 07)"))
    else:
        out.append(Candidate("channels_last", "channels_last", {"channels_last": True},
                             "the model has Conv2d layers in the default NCHW format"))
    return out, skipped


def follow_up(winners: list[Candidate], probe: dict[str, Any],
              calls: list[dict[str, Any]] | None = None) -> tuple[Candidate | None, str]:
    """The ``prefetch_factor`` follow-up of a winning number of workers that tune added, or why there is none.

    ``prefetch_factor`` acts only with DataLoader workers, so where the script's loaders had none it is measured
    after the first round of candidates: the winning ``num_workers`` setting with ``prefetch_factor`` =
    :data:`PREFETCH` added, judged against that setting alone (its :attr:`Candidate.against`). Where the loaders
    had workers, :func:`choose` made it a first-round candidate instead.

    Parameters
    ----------
    winners : list of Candidate
        The first round's winners (the fastest "faster" candidate of each technique).
    probe : dict
        The hook's result of the unmodified script.
    calls : list of dict, optional
        :func:`helpers.tune.rewrite.framework_calls` of the script, for a framework's winner: its call must not
        set ``dataloader_prefetch_factor`` already.

    Returns
    -------
    (Candidate or None, str)
        The follow-up, or None and the reason for the report's "Not tried" ("" where there is nothing to say:
        the first round covered it, or the script builds no DataLoader tune saw).
    """
    loaders = probe.get("loaders") or []
    if any(int(ld["effective"].get("num_workers") or 0) for ld in loaders):
        return None, ""
    base = next((c for c in winners if c.technique == "num_workers"), None)
    if base is None:
        return None, ("it acts only with DataLoader workers, and no num_workers setting was faster here"
                      if loaders or any(c["framework"] == "transformers" for c in calls or []) else "")
    why = f"on top of {base.name}: each worker keeps {PREFETCH} batches in flight, not torch's default 2"
    if "loader" in base.apply:
        return Candidate(f"{base.name} + prefetch_factor={PREFETCH}", "prefetch_factor",
                         {"loader": {**base.apply["loader"], "prefetch_factor": PREFETCH}}, why,
                         against=base.name), ""
    edits = base.apply.get("edits") or []
    for e in edits:  # a framework's call: transformers' TrainingArguments field of the same meaning
        call = next((c for c in calls or [] if c["line"] == e["line"] and c["call"] == e["call"]), None)
        if call is not None and "dataloader_prefetch_factor" in call["keywords"]:
            return None, f"{e['call']}(...) already sets dataloader_prefetch_factor"
    if not edits:
        return None, ""
    return Candidate(f"{base.name} + dataloader_prefetch_factor={PREFETCH}", "prefetch_factor",
                     {"edits": [dict(e, values={**e["values"], "dataloader_prefetch_factor": PREFETCH})
                                for e in edits]}, why, against=base.name), ""


#: The general techniques (the PyTorch Performance Tuning Guide's first section, pytorch/tutorials
#: ``recipes_source/recipes/tuning_guide.py``) and what each changes; no notebook of the workbook measures them.
GENERAL = {"debug_apis": "anomaly detection and gradcheck switched off (\"Disable debugging APIs\")",
           "no_grad": "forward passes whose outputs never reach backward() run under torch.no_grad() (\"Disable "
                      "gradient calculation for validation or inference\")",
           "set_to_none": "zero_grad(set_to_none=True) (\"Use parameter.grad = None instead of model.zero_grad() "
                          "or optimizer.zero_grad()\")",
           "optimizer_impl": "the optimizer's fused (or foreach) implementation (\"Fuse operations\"; torch.optim's "
                             "documentation of foreach and fused)"}


def _lines(sites: list[dict[str, Any]]) -> str:
    return ", ".join(f"line {s['line']}" for s in sites[:3]) + (" and more" if len(sites) > 3 else "")


def general_candidates(probe: dict[str, Any]) -> tuple[list[Candidate], list[tuple[str, str]]]:
    """The Guide's general candidates (:data:`GENERAL`), from the probe's ``general`` record
    (:func:`helpers.tune.hook_general._watch_general`); nothing where the probe has none (an older result).

    - ``debug_apis``: anomaly detection (``set_detect_anomaly(True)``, ``detect_anomaly()``) or ``gradcheck`` /
      ``gradgradcheck`` ran in the training process: all switched off at once;
    - ``no_grad``: a call site of the model's forward ran with gradients enabled and no gradient ever reached its
      output, while the script did call ``backward()`` (so it is not a script without training);
    - ``set_to_none``: ``zero_grad(set_to_none=False)`` was called;
    - ``optimizer_impl``: the optimizer sets neither ``foreach`` nor ``fused``, and torch has a fused implementation
      of its class for its device (Adam, AdamW, SGD, Adagrad; torch 2.13's fused devices include the CPU); else
      ``foreach=True`` where torch has foreach kernels for the device and does not default to them. On a CPU there
      are no foreach kernels (``torch.utils._foreach_utils._get_foreach_kernels_supported_devices``), so only fused
      is tried there.

    Returns
    -------
    (list of Candidate, list of (technique, reason))
    """
    gen = probe.get("general") or {}
    out: list[Candidate] = []
    skipped: list[tuple[str, str]] = []
    if not gen:
        return out, skipped
    debug = [s for s in gen.get("debug_sites") or [] if s["api"] in ("set_detect_anomaly", "detect_anomaly",
                                                                     "gradcheck", "gradgradcheck")]
    if debug:
        apis = sorted({s["api"] for s in debug})
        out.append(Candidate("debug APIs off", "debug_apis", {"debug_off": True},
                             f"{', '.join(apis)} ran in the training process ({_lines(debug)})"))
    forwards = gen.get("unreached_forwards") or []
    if forwards and probe.get("backward_sites"):
        calls = sum(f["calls"] for f in forwards)
        out.append(Candidate("no_grad where no gradient is used", "no_grad",
                             {"no_grad": [[f["file"], f["line"]] for f in forwards]},
                             f"{calls} forward calls ({_lines(forwards)}) built an autograd graph that no backward() "
                             f"used"))
    zero = gen.get("zero_grad_sites") or []
    if zero:
        out.append(Candidate("zero_grad(set_to_none=True)", "set_to_none", {"set_to_none": True},
                             f"zero_grad(set_to_none=False) writes zeros into every gradient ({_lines(zero)})"))
    impl = gen.get("optimizer_impl") or {}
    if impl:
        cls, dev = impl.get("class"), impl.get("device")
        if impl.get("built_by"):  # a framework's optimizer: its own setting, not a keyword in the user's files
            skipped.append(("optimizer_impl", f"{cls} is built by {impl['built_by']}, not in your files: set its "
                                              "implementation through the framework (transformers: "
                                              "TrainingArguments(optim=\"adamw_torch_fused\"))"))
        elif impl.get("foreach") is not None or impl.get("fused") is not None:
            given = "fused" if impl.get("fused") is not None else "foreach"
            skipped.append(("optimizer_impl", f"the {cls} optimizer already sets {given}={impl.get(given)!r}"))
        elif impl.get("fused_supported"):
            out.append(Candidate("fused=True", "optimizer_impl", {"optimizer_impl": {"fused": True}},
                                 f"{cls} runs its default " + ("foreach" if impl.get("foreach_default") else
                                                               "for-loop") + f" implementation on the {dev}"))
        elif impl.get("foreach_supported") and not impl.get("foreach_default"):
            out.append(Candidate("foreach=True", "optimizer_impl", {"optimizer_impl": {"foreach": True}},
                                 f"{cls} runs its for-loop implementation on the {dev}"))
        else:
            skipped.append(("optimizer_impl", f"torch has no fused {cls} for the {dev}, and its foreach is "
                                              + ("already the default there" if impl.get("foreach_default") else
                                                 "not faster there (no foreach kernels for the device)")))
    return out, skipped


#: What notebook 02 measured for the batched decode against per-image PIL (docs/teaching.md, "What a learner
#: sees": a quick-profile run on a quiet 2-core AMD EPYC, 2026-12-01; six classroom runs beside busy loops,
#: 2026-12-07).
DECODE_02 = "7.3x (95% CI 5.5-8.7) on a quiet 2-core CPU, 2.3-5.2x on a busy one"


def reported_only(probe: dict[str, Any]) -> list[str]:
    """What tune found and reports without changing it, one line each: the Guide's debugging profilers left on
    (their results are read later in the script, so tune does not switch them off), a Dataset that decodes images
    one by one with PIL (notebook 02), a convolution with a bias directly before a batch norm, and a
    ``torch.nn.DataParallel`` (notebook 08)."""
    gen = probe.get("general") or {}
    out = []
    for s in gen.get("debug_sites") or []:
        if s["api"] not in ("set_detect_anomaly", "detect_anomaly", "gradcheck", "gradgradcheck"):
            out.append(f"{s['api']} records every step ({Path(s['file']).name}, line {s['line']}, entered "
                       f"{s['count']} time{'s' if s['count'] != 1 else ''}): a debugging API; tune does not "
                       f"switch a profiler off, since the script reads its results. Profile a few steps with "
                       f"torch.profiler.schedule(wait=1, warmup=1, active=3), or remove it for training runs.")
    for r in gen.get("reported") or []:
        if r.get("kind") == "pil_decode":
            out.append(f"{r['text']}: each sample is decoded on its own in the DataLoader. Notebook 02 (batched "
                       f"decode) measures decoding a whole batch at once on a thread pool against it: {DECODE_02} "
                       f"(docs/teaching.md); run it on your machine and images.")
        elif r.get("kind") == "data_parallel" and ((probe.get("model") or {}).get("param_device") or "cpu") == "cpu":
            out.append(f"torch.nn.DataParallel wraps a model ({Path(r['file']).name}, line {r['line']}): on the CPU "
                       f"it has no GPU to spread the batch over and runs the model as it is; on GPUs it drives them "
                       f"all from one process (the Guide: \"Use DistributedDataParallel instead of DataParallel\", "
                       f"notebook 08). tune does not rewrite it.")
        elif r.get("kind") == "data_parallel":
            out.append(f"torch.nn.DataParallel wraps a model ({Path(r['file']).name}, line {r['line']}): one process "
                       f"drives every GPU from threads that share Python's GIL, and copies the model to each GPU on "
                       f"every forward (the Guide: \"Use DistributedDataParallel instead of DataParallel\"). "
                       f"Notebook 08 measures DistributedDataParallel; tune does not rewrite it, since the launch "
                       f"(torchrun), the process group and the DistributedSampler change with it.")
        elif r.get("kind") == "conv_bias_before_norm":
            out.append(f"{r['text']} (the Guide: \"Disable bias for convolutions directly followed by a batch "
                       f"norm\"; it saves an addition per output, and tune does not edit your model's layers).")
    return out


def general_edits(probe: dict[str, Any], merged: dict[str, Any]) -> list[Any]:
    """The source edits of the general winners in ``merged`` (:func:`merge_apply`), at the probe's call sites:
    ``debug_off`` at each debugging API's line, ``no_grad`` at each forward call whose output no gradient reached,
    ``call_keywords`` ``set_to_none=True`` at each ``zero_grad(...)``, and ``fused=True`` (or ``foreach=True``) in
    the optimizer's construction."""
    from helpers.tune.rewrite import Edit

    gen = probe.get("general") or {}
    edits = []
    if merged.get("debug_off"):
        edits += [Edit("debug_off", s["file"], s["line"], {"api": s["api"]}, "debug_apis")
                  for s in gen.get("debug_sites") or []
                  if s["api"] in ("set_detect_anomaly", "detect_anomaly", "gradcheck", "gradgradcheck")]
    if merged.get("no_grad"):
        edits += [Edit("no_grad", f, int(n), {}, "no_grad") for f, n in merged["no_grad"]]
    if merged.get("set_to_none"):
        edits += [Edit("call_keywords", s["file"], s["line"], {"call": "zero_grad", "values": {"set_to_none": True},
                                                                "positional": ["set_to_none"]},
                       "set_to_none") for s in gen.get("zero_grad_sites") or []]
    opt = probe.get("optimizer") or {}
    impl = gen.get("optimizer_impl") or {}
    if merged.get("optimizer_impl") and opt.get("file"):
        edits.append(Edit("call_keywords", opt["file"], opt["line"],
                          {"call": impl.get("class") or opt.get("class"), "values": dict(merged["optimizer_impl"])},
                          "optimizer_impl"))
    return edits


#: DDP's bucket cap when the call gives none, MiB, and its first bucket's, bytes (torch 2.13,
#: torch/nn/parallel/distributed.py ``_DEFAULT_BUCKET_CAP_MB = 25``; ``dist._DEFAULT_FIRST_BUCKET_BYTES`` = 1 MiB,
#: used only with the default cap).
DDP_BUCKET_MB, DDP_FIRST_BUCKET = 25, 1024 * 1024
#: The ``bucket_cap_mb`` values tried, MiB: a short sweep either side of the default 25 (notebook 08 sweeps
#: 0.25, 1 and 25). A value whose buckets would be the same as the default's, or as a value tried before it, is
#: not run.
BUCKET_CAPS_MB = (5, 100)


def bucket_layout(sizes: list[int], cap_mb: float | None) -> tuple[int, ...]:
    """The bucket sizes, bytes, that DDP's greedy assignment makes of gradients of ``sizes`` bytes (in the order DDP
    fills them: the model's parameters last first): a bucket closes once it holds ``cap_mb`` MiB or more; with the
    default (``cap_mb`` None) the first closes at 1 MiB and the others at 25 MiB (torch's
    ``_compute_bucket_assignment_by_size``, one dtype and device assumed)."""
    limits = [DDP_FIRST_BUCKET, DDP_BUCKET_MB * 2**20] if cap_mb is None else [int(cap_mb * 2**20)]
    out: list[int] = []
    current = 0
    for n in sizes:
        current += n
        if current >= limits[min(len(out), len(limits) - 1)]:
            out.append(current)
            current = 0
    return tuple(out + ([current] if current else []))


def ddp_candidates(probe: dict[str, Any]) -> tuple[list[Candidate], list[tuple[str, str]]]:
    """The DistributedDataParallel candidates of a script whose model DDP wraps, run with more than one rank
    (``tune -- torchrun --nproc-per-node N``): notebook 08's collective tuning, each found by the probe
    (:class:`helpers.tune.hook_ddp._DDPWatch`, the result's ``ddp``).

    - ``no_sync``: where ``backward()`` ran the same k > 1 times before every optimizer step (gradient
      accumulation), all in the script given, and the script does not enter ``no_sync()`` itself: the first
      k - 1 micro-steps of each step skip DDP's all-reduce, the k-th synchronises the sum;
    - ``gradient_as_bucket_view=True`` where the call does not set it: the gradients become views into DDP's
      buckets, saving a copy of each;
    - ``bucket_cap_mb=N`` for N in :data:`BUCKET_CAPS_MB` whose buckets (:func:`bucket_layout` of the parameters'
      sizes) differ from the default's, where the call does not set it;
    - ``comm_hook``: ``bf16_compress_hook`` where DDP accepts it (``bf16_comm_hook``), else ``fp16_compress_hook``,
      where the script registers no hook: half the bytes on the wire, with rounding, so only the loss check
      decides whether it keeps the results;
    - ``find_unused_parameters=False`` where the call passes True and every parameter received a gradient in every
      step the probe watched: with it, DDP traverses "the autograd graph from all tensors contained in the return
      value of the wrapped module's forward function" on every forward (torch 2.13's docstring of the argument,
      torch/nn/parallel/distributed.py), work a model that uses all its parameters does not need; a parameter
      left without a gradient keeps it, as DDP would otherwise wait for that gradient;
    - ``static_graph=True`` where the same parameters received gradients in every step the probe watched, and
      there is no gradient accumulation (torch 2.13's reducer fails an internal assert, ``expect_autograd_hooks_``,
      when a static graph's first micro-step runs under ``no_sync()``; tried here).

    Returns
    -------
    (list of Candidate, list of (technique, reason))
        Nothing at all for a script without DDP and without gradient accumulation.
    """
    ddp = probe.get("ddp") or {}
    per = [int(n) for n in ddp.get("backwards_per_step") or []]
    accum = per[0] if per and per[0] > 1 and len(set(per)) == 1 else 0
    script = ddp.get("script")
    if not ddp.get("wrapped"):
        if accum:
            return [], [("no_sync", f"backward() runs {accum} times per optimizer step (gradient accumulation), but "
                                    f"the model is not wrapped in DistributedDataParallel: there is no gradient "
                                    f"all-reduce to skip")]
        return [], []
    world = int(ddp.get("world") or 1)
    if world < 2:
        why = ("the process group has one rank: its all-reduce has no peer to wait for; run tune with the job's "
               "ranks: tune -- torchrun --nproc-per-node N train.py")
        return [], [(t, why) for t in ("no_sync", "gradient_as_bucket_view", "bucket_cap_mb", "comm_hook",
                                       "static_graph")]
    out: list[Candidate] = []
    skipped: list[tuple[str, str]] = []
    given = ddp.get("given") or {}
    elsewhere = [x for x in probe.get("backward_sites") or [] if script and x["file"] != script]
    names = [x for x in ddp.get("names") or [] if x.get("name")]
    if ddp.get("no_sync_in_use"):
        skipped.append(("no_sync", "the script already enters model.no_sync()"))
    elif not per or max(per) <= 1:
        skipped.append(("no_sync", "backward() runs once per optimizer step: there is no gradient accumulation "
                                   "whose micro-steps could skip the all-reduce"))
    elif not accum:
        shown = ", ".join(str(n) for n in per[:8]) + (", ..." if len(per) > 8 else "")
        skipped.append(("no_sync", f"backward() runs a varying number of times per optimizer step ({shown}): put "
                                   f"the micro-steps that do not step the optimizer under model.no_sync() by hand"))
    elif len(probe.get("backward_sites") or []) > 1 or probe.get("other_optimizers"):
        lines = ", ".join(str(x["line"]) for x in probe.get("backward_sites") or [])
        skipped.append(("no_sync", (f"backward() is called on {len(probe['backward_sites'])} lines ({lines})"
                                    if len(probe.get("backward_sites") or []) > 1 else "the script builds more than "
                                    "one optimizer") + ": tune applies no_sync only where one backward() repeats over "
                                   "the micro-steps of one optimizer's step"))
    elif elsewhere:
        skipped.append(("no_sync", f"backward() is called in {elsewhere[0]['file']}, line {elsewhere[0]['line']}, "
                                   f"not in the script you gave: tune edits only that script; wrap the micro-steps "
                                   f"that do not step the optimizer in model.no_sync() there"))
    elif not names:
        skipped.append(("no_sync", "no variable where backward() is called holds the DDP model, so no_sync() "
                                   "cannot be written there"))
    else:
        out.append(Candidate(f"no_sync, {accum} micro-steps", "no_sync", {"no_sync": accum},
                             f"backward() runs {accum} times per optimizer step and each all-reduces the "
                             f"gradients; only the last needs to"))
    if given.get("gradient_as_bucket_view"):
        skipped.append(("gradient_as_bucket_view", "the DDP call already sets gradient_as_bucket_view=True"))
    else:
        out.append(Candidate("gradient_as_bucket_view=True", "gradient_as_bucket_view",
                             {"ddp": {"gradient_as_bucket_view": True}},
                             "DDP copies each gradient into its bucket before the all-reduce"))
    if given.get("bucket_cap_mb") is not None:
        skipped.append(("bucket_cap_mb", f"the DDP call already sets bucket_cap_mb={given['bucket_cap_mb']}"))
    else:
        sizes = [int(n) for n in ddp.get("param_bytes") or []]
        seen = {bucket_layout(sizes, None)}
        for cap in BUCKET_CAPS_MB:
            layout = bucket_layout(sizes, cap)
            if layout in seen:
                continue
            seen.add(layout)
            out.append(Candidate(f"bucket_cap_mb={cap}", "bucket_cap_mb", {"ddp": {"bucket_cap_mb": cap}},
                                 f"the default 25 MiB makes {len(bucket_layout(sizes, None))} bucket(s) of the "
                                 f"{sum(sizes) / 2**20:.1f} MiB of gradients; {cap} MiB makes {len(layout)}"))
        if len(seen) == 1:
            skipped.append(("bucket_cap_mb", f"the {sum(sizes) / 2**20:.1f} MiB of gradients make the same buckets "
                                             f"at {', '.join(map(str, BUCKET_CAPS_MB))} MiB as at the default 25"))
    if ddp.get("comm_hooks"):
        skipped.append(("comm_hook", "the script registers a communication hook of its own"))
    else:
        dtype = "bf16" if ddp.get("bf16_comm_hook") else "fp16"
        out.append(Candidate(f"{dtype}_compress_hook", "comm_hook", {"comm_hook": dtype},
                             "DDP all-reduces the gradients in float32; compressed, half the bytes"
                             + ("" if dtype == "bf16" else " (bf16_compress_hook needs CUDA with NCCL 2.10+)")))
    if given.get("find_unused_parameters") is True:  # the default is False: only a True the script passes
        n, got = int(ddp.get("params") or 0), int(ddp.get("params_with_grad") or 0)
        if n and got == n and ddp.get("same_params_every_step"):
            out.append(Candidate("find_unused_parameters=False", "find_unused_parameters",
                                 {"ddp": {"find_unused_parameters": False}},
                                 f"the DDP call sets find_unused_parameters=True, which walks the autograd graph "
                                 f"after every forward, yet all {n} parameters received a gradient in each of the "
                                 f"{ddp.get('grad_steps')} steps the probe watched"))
        else:
            skipped.append(("find_unused_parameters",
                            f"the DDP call sets find_unused_parameters=True, and {got} of its {n} parameters received "
                            f"a gradient" + ("" if ddp.get("same_params_every_step") else ", not the same ones each "
                                             "step") + ": DDP needs it to skip the others' all-reduce"))
    if given.get("static_graph"):
        skipped.append(("static_graph", "the DDP call already sets static_graph=True"))
    elif accum:
        skipped.append(("static_graph", "the script accumulates gradients, and DDP's static_graph=True fails when "
                                        "the first micro-step runs under no_sync() (torch 2.13: an internal assert "
                                        "in its reducer, expect_autograd_hooks_)"))
    elif not ddp.get("same_params_every_step"):
        skipped.append(("static_graph", f"the parameters that receive gradients changed between the "
                                        f"{ddp.get('grad_steps', 0)} steps the probe watched"))
    else:
        out.append(Candidate("static_graph=True", "static_graph", {"ddp": {"static_graph": True}},
                             f"the same {ddp.get('params_with_grad')} parameters received gradients in each of the "
                             f"{ddp.get('grad_steps')} steps the probe watched"))
    return out, skipped


def ddp_edits(probe: dict[str, Any], merged: dict[str, Any]) -> list[Any]:
    """The source edits of the DDP winners in ``merged`` (:func:`merge_apply`), at the probe's call sites:
    ``ddp_keywords`` (``gradient_as_bucket_view``, ``bucket_cap_mb``, ``static_graph``) and ``comm_hook`` at the
    ``DistributedDataParallel(...)`` call, ``no_sync`` at the ``backward()`` called most (with the DDP model's
    name there, the line of the optimizer's step and the forward calls of that file)."""
    from helpers.tune.rewrite import Edit

    edits = []
    sites = probe.get("ddp_sites") or []
    keywords = dict(merged.get("ddp") or {})
    if keywords and sites:
        edits.append(Edit("ddp_keywords", sites[0]["file"], sites[0]["line"], {"values": keywords},
                          " + ".join(keywords)))  # each keyword is its technique's name
    if merged.get("comm_hook") and sites:
        edits.append(Edit("comm_hook", sites[0]["file"], sites[0]["line"], {"dtype": merged["comm_hook"]},
                          "comm_hook"))
    backs = probe.get("backward_sites") or []
    if merged.get("no_sync") and backs:
        b = max(backs, key=lambda x: x.get("count", 0))
        names = (probe.get("ddp") or {}).get("names") or []
        name = next((x["name"] for x in names if x["file"] == b["file"] and x["line"] == b["line"]), None)
        steps = [x for x in probe.get("step_sites") or [] if x["file"] == b["file"]]
        step = max(steps, key=lambda x: x.get("count", 0))["line"] if steps else None
        forward = sorted(x["line"] for x in probe.get("forward_sites") or [] if x["file"] == b["file"])
        edits.append(Edit("no_sync", b["file"], b["line"], {"name": name, "accum": merged["no_sync"], "step": step,
                                                            "forward": forward}, "no_sync"))
    return edits
