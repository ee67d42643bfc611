"""tune's runtime watch of the CUDA and Ascend NPU items in the user's process (run by :mod:`helpers.tune.hook`):
the float32 matmul precision (TF32 on CUDA, HF32 on an NPU), the host synchronisations inside the step, and the
device memory's peak against its capacity (for activation checkpointing, reported only).

Nothing here acts on a CPU-only run: each watch starts only where the model's parameters are on ``cuda`` or
``npu``. This machine has neither, so these paths are tested with fakes of ``torch.cuda`` / ``torch.npu``; the
real ones run under ``make device-check`` on a lent GPU.
"""

from __future__ import annotations

import linecache
import sys
import warnings
from pathlib import Path
from typing import Any

# ``rec`` below is the run's :class:`helpers.tune.hook.Recorder` (not imported: the hook imports this module).

#: The float32 matmul precision the ``tf32`` candidate sets on CUDA. ``"high"`` lets float32 matrix
#: multiplications use TF32 tensor cores; torch 2.13's default is ``"highest"`` (torch/__init__.py,
#: ``set_float32_matmul_precision``: "equivalent to setting torch.backends.cuda.matmul.allow_tf32 = True").
#: Convolutions are left as they are: ``torch.backends.cudnn.allow_tf32`` is already True by default (torch 2.13,
#: torch/backends/cudnn/__init__.py; checked with ``python -c "import torch; print(torch.backends.cudnn.allow_tf32)"``).
MATMUL_PRECISION = "high"
#: The optimizer steps, after the first (its one-off costs), during which the probe watches host synchronisations.
SYNC_STEPS = 5
#: What torch's sync debug mode warns with: c10/cuda/CUDAFunctions.cpp ``warn_or_error_on_sync`` writes "called a
#: synchronizing CUDA operation"; torch_npu's own text is not in its Python source, so the common stem is matched.
SYNC_TEXT = "synchroniz"


def _watch_device(rec: Any) -> None:
    """Record (``rec.device``) and apply the device items:

    - ``apply["tf32"]``: where the first optimizer is built, ``torch.set_float32_matmul_precision("high")`` on
      CUDA, ``torch.npu.matmul.allow_hf32 = True`` on an Ascend NPU (torch_npu 2.13.0, torch_npu/npu/npu_config.py
      ``_allowHF32Matmul``; bound as ``torch.npu.matmul`` in torch_npu/npu/__init__.py);
    - at the first optimizer step: the precision the script left (``torch.get_float32_matmul_precision()`` and
      ``torch.backends.cudnn.allow_tf32``, the device's compute capability; on an NPU ``torch.npu.matmul.allow_hf32``
      and ``torch.npu.conv.allow_hf32``);
    - in the probe only (``spec["probe"]``): the host synchronisations of steps 2 to :data:`SYNC_STEPS` + 1, through
      ``torch.cuda.set_sync_debug_mode("warn")`` (``torch.npu.set_sync_debug_mode`` on an NPU, torch_npu/npu/
      utils.py): each warning's line in the user's files, counted, and not printed; the mode is restored after.
    """
    import torch
    from torch.optim import optimizer as optim_mod

    dev: dict[str, Any] = {"script": str(Path(rec.spec["script"]).resolve()) if rec.spec.get("script") else None,
                           "precision": None, "syncs": {}, "sync_steps": 0, "sync_watch": ""}
    rec.device = dev
    orig_opt_init = torch.optim.Optimizer.__init__

    def opt_init(self, params, *args, **kwargs):
        first = rec.optimizer is None
        orig_opt_init(self, params, *args, **kwargs)
        if first and rec.optimizer is not None and rec.apply.get("tf32"):
            _reduced_matmul(torch, rec.model_info.get("param_device"))

    torch.optim.Optimizer.__init__ = opt_init
    state = {"watching": False, "previous": 0, "filter": None}

    def mode_api():
        kind = rec.model_info.get("param_device")
        mod = getattr(torch, kind, None) if kind in ("cuda", "npu") else None
        return mod if mod is not None and hasattr(mod, "set_sync_debug_mode") else None

    def after_step(optimizer, args, kwargs):
        if id(optimizer) != rec.optimizer_id:
            return
        n = len(rec.step_t)
        kind = rec.model_info.get("param_device")
        if n == 1 and kind in ("cuda", "npu"):
            dev["precision"] = _precision(torch, kind)
        api = mode_api()
        if api is None or not rec.spec.get("probe"):
            return
        if n == 1:
            try:
                state["previous"] = api.get_sync_debug_mode()
                api.set_sync_debug_mode("warn")
            except Exception as exc:  # noqa: BLE001 - a device without it: say so, watch nothing
                dev["sync_watch"] = f"set_sync_debug_mode failed: {type(exc).__name__}: {exc}"[:200]
                return
            warnings.filterwarnings("always", message=f".*{SYNC_TEXT}")
            state["filter"] = warnings.filters[0]
            state["watching"] = True
            dev["sync_watch"] = f"torch.{kind}.set_sync_debug_mode(\"warn\")"
        elif state["watching"]:
            dev["sync_steps"] += 1
            if dev["sync_steps"] >= SYNC_STEPS:
                state["watching"] = False
                api.set_sync_debug_mode(state["previous"])
                if state["filter"] in warnings.filters:
                    warnings.filters.remove(state["filter"])
                    warnings._filters_mutated()  # the registry's cached decisions are stale now

    optim_mod.register_optimizer_step_post_hook(after_step)
    # the warnings module's one way out (CPython's C _warnings calls it too), so a showwarning the script sets
    # (logging.captureWarnings) neither sees the watched syncs nor hides them from the count
    orig_show = warnings._showwarnmsg
    helpers_dir = rec.skip[0] if rec.skip else ""

    def show(msg):
        if state["watching"] and SYNC_TEXT in str(msg.message).lower():
            _count_sync(rec, dev["syncs"], sys._getframe(1), helpers_dir)
            return None
        return orig_show(msg)

    warnings._showwarnmsg = show


def _reduced_matmul(torch: Any, kind: str | None) -> None:
    """TF32 (CUDA) or HF32 (NPU) for float32 matrix multiplications; nothing on another device."""
    if kind == "cuda":
        torch.set_float32_matmul_precision(MATMUL_PRECISION)
    elif kind == "npu" and getattr(torch, "npu", None) is not None:
        torch.npu.matmul.allow_hf32 = True


def _precision(torch: Any, kind: str) -> dict[str, Any]:
    """The float32 precision settings in force on the device kind (what the script left), with the CUDA device's
    compute capability (TF32 tensor cores came with Ampere, 8.0)."""
    try:
        if kind == "cuda":
            major, minor = torch.cuda.get_device_capability()
            return {"matmul": torch.get_float32_matmul_precision(),
                    "cudnn_tf32": bool(torch.backends.cudnn.allow_tf32), "capability": [int(major), int(minor)]}
        return {"matmul_hf32": bool(torch.npu.matmul.allow_hf32), "conv_hf32": bool(torch.npu.conv.allow_hf32)}
    except Exception as exc:  # noqa: BLE001 - unknown: the candidate is then not chosen
        return {"error": f"{type(exc).__name__}: {exc}"[:200]}


#: The synchronising calls a line is classified by (its source text), first match wins.
SYNC_KINDS = (("print", "print("), ("item", ".item()"), ("cpu", ".cpu()"), ("tolist", ".tolist()"),
              ("numpy", ".numpy()"), ("float", "float("), ("int", "int("), ("bool", "bool("))


def _count_sync(rec: Any, syncs: dict[str, dict[str, Any]], start, helpers_dir: str) -> None:
    """Count a sync warning at the user's line it comes from (the innermost frame of the user's files above the
    warnings machinery); one raised by tune's own code (``helpers/``) is not the script's."""
    f = start
    while f is not None and f.f_code.co_filename == warnings.__file__:
        f = f.f_back
    if f is None or (helpers_dir and str(Path(f.f_code.co_filename).resolve()).startswith(helpers_dir)):
        return
    frame = rec.user_frame(f)
    if frame is None:
        return
    file, line = rec.key(frame)
    text = linecache.getline(file, line).strip()
    kind = next((k for k, pat in SYNC_KINDS if pat in text.replace(" ", "")), "other")
    entry = syncs.setdefault(f"{file}:{line}", {"file": file, "line": line, "function": frame.f_code.co_name,
                                                "count": 0, "text": text[:160], "kind": kind})
    entry["count"] += 1


def _device_result(rec: Any) -> dict[str, Any]:
    """``rec.device`` as the result JSON's ``device``: ``precision`` (None off a device), ``syncs`` (a list of
    ``file``, ``line``, ``function``, ``count``, ``text``, ``kind``), ``sync_steps`` (the steps watched),
    ``sync_watch`` (how, or why not), ``script``, and ``memory``: the device's ``peak_bytes`` (allocated by tensors
    since the start, ``torch.cuda.max_memory_allocated``; ``torch.npu.max_memory_allocated``, the Ascend
    fact-check) and ``total_bytes`` (``torch.cuda.get_device_properties(i).total_memory``; on an NPU the second
    value of ``torch.npu.mem_get_info``, torch_npu/npu/__init__.py), or None off a device."""
    dev = getattr(rec, "device", None)
    if not dev:
        return {}
    out = {k: v for k, v in dev.items() if k != "syncs"}
    out["syncs"] = sorted(dev["syncs"].values(), key=lambda s: -s["count"])
    out["memory"] = _memory(rec)
    return out


def _memory(rec: Any) -> dict[str, int] | None:
    torch = sys.modules.get("torch")
    first = next(iter(rec.model.parameters()), None) if rec.model is not None else None
    if torch is None or first is None or first.device.type not in ("cuda", "npu"):
        return None
    try:
        if first.device.type == "cuda":
            return {"peak_bytes": int(torch.cuda.max_memory_allocated(first.device)),
                    "total_bytes": int(torch.cuda.get_device_properties(first.device).total_memory)}
        return {"peak_bytes": int(torch.npu.max_memory_allocated(first.device)),
                "total_bytes": int(torch.npu.mem_get_info(first.device)[1])}
    except Exception:  # noqa: BLE001 - not known: nothing is reported
        return None
