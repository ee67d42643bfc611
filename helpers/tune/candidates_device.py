"""tune's CUDA and Ascend NPU candidates, rows of the one table of :mod:`helpers.tune.candidates`, from the probe's
``device`` record (:mod:`helpers.tune.hook_device`) and its host-to-device copies (``to_sites``):

- ``tf32``: float32 matrix multiplications on TF32 tensor cores, written ``torch.set_float32_matmul_precision(
  "high")`` before the optimizer's construction, where the model is float32 on a CUDA GPU with TF32 (compute
  capability 8.0, Ampere, or later) and the script left torch's default ``"highest"``. That call, rather than
  ``torch.backends.cuda.matmul.allow_tf32 = True``: it is the public function torch's own advice names (torch
  2.13, torch/_inductor/compile_fx.py: "Consider setting `torch.set_float32_matmul_precision('high')`"), it sets
  the same cuBLAS switch (checked: afterwards ``allow_tf32`` is True and ``matmul.fp32_precision`` is "tf32"), and
  the ``allow_tf32`` flags are the older API that torch 2.9's notes say will be deprecated. Convolutions need
  nothing: ``torch.backends.cudnn.allow_tf32`` is True by default. On an Ascend NPU the same change is HF32,
  ``torch.npu.matmul.allow_hf32 = True`` (torch_npu 2.13.0, torch_npu/npu/npu_config.py ``_allowHF32Matmul``; off
  by default; its ``conv.allow_hf32`` is on by default). Numerics change: the loss check decides, as for autocast.
- ``host_sync``: a logging statement that reads a device value back on every step (``print(loss.item())``), found
  by ``set_sync_debug_mode("warn")`` in the probe, put under ``if <counter> % 10 == 0:``. A value the script keeps
  (a running total) or branches on (an early stop) is reported only, with the reason; so is a blocking
  host-to-device copy, which the mode flags too (c10's ``memcpy_and_sync``), since ``pin_memory`` is its change.
- ``device_factory``: a tensor made on the host and copied inside the loop (``torch.zeros(n).to(device)``) made on
  the device (``torch.zeros(n, device=device)``). Found by both: the probe, on the device, gives the lines that
  copied host tensors to it more than once (inside the loop, not at set-up), and libcst reads those lines for a
  torch factory chained with ``.to(...)`` / ``.cuda()`` (:func:`helpers.tune.rewrite_device.factory_moves`). The
  probe alone cannot tell a made tensor from a loaded batch; the source alone cannot tell the loop's lines, nor
  whether ``device`` is a device at all when the script runs on the CPU.
- ``checkpointing`` (reported only): peak allocated memory at or above :data:`MEMORY_NEAR` of the device's.

The CPU has none of these: its float32 matmuls are not switched by this precision (torch 2.13's
``set_float32_matmul_precision``: "This flag currently only affects one native device type: CUDA"), there is no
device for the host to wait for, and a tensor made on the host is already where the model is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from helpers.tune.candidates import Candidate

__all__ = ["DEVICE", "LOG_EVERY", "MEMORY_NEAR", "device_candidates", "device_edits", "device_reported"]

#: The device techniques and what each changes (the Guide's "GPU specific optimizations"; pytorch/tutorials
#: ``recipes_source/recipes/tuning_guide.py``).
DEVICE = {"tf32": "float32 matmuls on TF32 tensor cores (\"Enable Tensor cores\"); HF32 on an Ascend NPU",
          "host_sync": "logging that reads a device value runs every 10 steps (\"Avoid unnecessary CPU-GPU "
                       "synchronization\")",
          "device_factory": "tensors made on the device, not copied to it (\"Create tensors directly on the target "
                            "device\")"}
#: Every how many steps a logging statement that synchronises runs once tune guards it: tune's choice, a common
#: logging interval that leaves 1 synchronisation in 10 steps and still logs within a short run.
LOG_EVERY = 10
#: The share of the device's memory that the probe's peak allocation must reach for activation checkpointing to be
#: named: tune's threshold; above it a batch 1.25x larger would not fit.
MEMORY_NEAR = 0.8
#: TF32 tensor cores came with Ampere, compute capability 8.0 (NVIDIA's TF32 announcement; PyTorch's CUDA notes,
#: "TensorFloat-32 (TF32) on Ampere (and later) devices").
TF32_CAPABILITY = (8, 0)


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _sync_sites(probe: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any], str]]:
    """Each synchronising line the probe saw on every watched step: (site, its statement
    (:func:`helpers.tune.rewrite_device.sync_statement`), why it is not rewritten or "")."""
    from helpers.tune.rewrite_device import sync_statement

    dev = probe.get("device") or {}
    steps = int(dev.get("sync_steps") or 0)
    out = []
    sources: dict[str, str | None] = {}
    copies = {(c["file"], c["line"]) for c in probe.get("to_sites") or []}
    made = {(c["file"], c["line"]) for c, _, _ in _factory_sites(probe)}  # device_factory's lines: its own item
    for s in dev.get("syncs") or []:
        if not steps or s["count"] < steps or (s["file"], s["line"]) in made:  # occasional, or a factory's copy
            continue
        if s["file"] not in sources:
            sources[s["file"]] = _read(s["file"])
        st = sync_statement(sources[s["file"]] or "", s["line"])
        where = f"{Path(s['file']).name}, line {s['line']}"
        if (s["file"], s["line"]) in copies:  # torch's blocking copy waits (c10 memcpy_and_sync)
            why = ("it copies host memory to the device without non_blocking=True, which waits for the copy: "
                   "tune's pin_memory + non_blocking candidate is the change for it (notebook 04)")
        elif dev.get("script") and s["file"] != dev["script"]:
            why = f"it is in {where}, not in the script you gave: tune edits only that script"
        elif st["kind"] == "control":
            why = "the script's control flow reads it (a condition or an early stop): tune leaves it as it is"
        elif st["kind"] == "kept":
            why = ("its value is kept (a running total, a list): accumulate the tensor on the device "
                   "(total += loss.detach()) and read it every N steps, by hand")
        elif st["kind"] != "log":
            why = "it is not a logging statement of its own: tune cannot tell what reads the value"
        elif st["guarded"]:
            why = "it is already under an if that tests %, yet ran on every step"
        elif not st["index"]:
            why = ("no loop counter at the line to run it every N steps (for step, batch in enumerate(loader) "
                   "would give one)")
        else:
            why = ""
        out.append((s, st, why))
    return out


def _factory_sites(probe: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any], str]]:
    """Each host-made tensor copied to the device more than once (in the loop): (site, what
    :func:`helpers.tune.rewrite_device.factory_moves` found there, why it is not rewritten or "")."""
    from helpers.tune.rewrite_device import factory_moves

    dev = probe.get("device") or {}
    found: dict[str, dict[int, dict[str, Any]]] = {}
    out = []
    for s in probe.get("to_sites") or []:
        if s.get("count", 0) < 2:
            continue
        if s["file"] not in found:
            found[s["file"]] = factory_moves(_read(s["file"]) or "")
        f = found[s["file"]].get(s["line"])
        if not f:
            continue
        why = f.get("why", "")
        if not why and dev.get("script") and s["file"] != dev["script"]:
            why = f"it is in {Path(s['file']).name}, not in the script you gave: tune edits only that script"
        out.append((s, f, why))
    return out


def device_candidates(probe: dict[str, Any]) -> tuple[list[Candidate], list[tuple[str, str]]]:
    """The device candidates of a probed script (see the module docstring).

    Parameters
    ----------
    probe : dict
        The hook's result of the unmodified script; nothing is chosen where it has no ``device`` record (an older
        result).

    Returns
    -------
    (list of Candidate, list of (technique, reason))
        ``tf32`` (``apply["tf32"]``, a runtime change); ``host_sync`` and ``device_factory`` as source edits
        (``apply["edits"]``: ``kind``, ``line``, ``params``), run as an edited copy of the script.
    """
    dev = probe.get("device")
    if not dev:
        return [], []
    model = probe.get("model") or {}
    kind = model.get("param_device") or "cpu"
    if kind not in ("cuda", "npu"):
        why = (f"the model is on the {kind}: these act on a CUDA or NPU device (torch switches the float32 matmul "
               f"precision on CUDA only; here there is no device for the host to wait for, no copy of a host-made "
               f"tensor, and no device memory whose peak could limit the batch)")
        return [], [(t, why) for t in ("tf32", "host_sync", "device_factory", "checkpointing")]
    out: list[Candidate] = []
    skipped: list[tuple[str, str]] = []
    prec = dev.get("precision") or {}
    if model.get("param_dtype") not in ("float32", None):
        skipped.append(("tf32", f"the model's parameters are {model['param_dtype']}: TF32 acts on float32 matmuls"))
    elif probe.get("autocast_in_use"):
        skipped.append(("tf32", "the script already runs under torch.autocast: its matmuls are in a lower precision "
                                "than TF32 already"))
    elif not prec or prec.get("error"):
        skipped.append(("tf32", f"the probe could not read the matmul precision ({prec.get('error', 'no step')})"))
    elif kind == "cuda":
        cap = tuple(prec.get("capability") or (0, 0))
        if prec.get("matmul") != "highest":
            skipped.append(("tf32", f"the script already sets the float32 matmul precision to {prec.get('matmul')!r}"))
        elif cap < TF32_CAPABILITY:
            skipped.append(("tf32", f"this GPU (compute capability {cap[0]}.{cap[1]}) has no TF32 tensor cores; "
                                    f"they came with Ampere (8.0)"))
        else:
            out.append(Candidate('set_float32_matmul_precision("high")', "tf32", {"tf32": True},
                                 f"float32 matmuls run at torch's default \"highest\" precision on a GPU with TF32 "
                                 f"tensor cores (compute capability {cap[0]}.{cap[1]})"))
    elif prec.get("matmul_hf32"):
        skipped.append(("tf32", "the script already sets torch.npu.matmul.allow_hf32 = True"))
    else:
        out.append(Candidate("npu.matmul.allow_hf32", "tf32", {"tf32": True},
                             "float32 matmuls run at full precision on the NPU (torch_npu's default: HF32 off)"))
    syncs = _sync_sites(probe)
    ok = [(s, st) for s, st, why in syncs if not why]
    if ok:
        per = sum(s["count"] for s, _ in ok) / max(1, int(dev.get("sync_steps") or 1))
        out.append(Candidate(f"host syncs every {LOG_EVERY} steps", "host_sync",
                             {"edits": [{"kind": "sync_every", "line": s["line"],
                                         "params": {"index": st["index"], "every": LOG_EVERY}} for s, st in ok]},
                             f"{per:.0f} host synchronisation{'s' if per >= 1.5 else ''} per step for logging ("
                             + ", ".join(f"line {s['line']}" for s, _ in ok[:3]) + ")"))
    elif not dev.get("sync_watch"):
        skipped.append(("host_sync", "the probe did not watch the steps' synchronisations (it stopped before its "
                                     "second step)"))
    elif dev.get("sync_watch", "").startswith("set_sync_debug_mode failed"):
        skipped.append(("host_sync", f"the probe could not watch them: {dev['sync_watch']}"))
    elif not syncs:
        skipped.append(("host_sync", f"the probe saw no host synchronisation on every one of "
                                     f"{dev.get('sync_steps', 0)} steps ({dev['sync_watch']})"))
    factories = _factory_sites(probe)
    good = [s for s, f, why in factories if not why]
    if good:
        out.append(Candidate("tensors made on the device", "device_factory",
                             {"edits": [{"kind": "device_factory", "line": s["line"], "params": {}} for s in good]},
                             f"{len(good)} tensor{'s' if len(good) != 1 else ''} made on the host and copied to the "
                             f"{kind} in the loop (" + ", ".join(f"line {s['line']}" for s in good[:3]) + ")"))
    mem = dev.get("memory") or {}
    if mem.get("total_bytes") and mem["peak_bytes"] / mem["total_bytes"] < MEMORY_NEAR:
        skipped.append(("checkpointing", f"peak allocated memory {mem['peak_bytes'] / 2**30:.1f} GiB is "
                                         f"{100 * mem['peak_bytes'] / mem['total_bytes']:.0f}% of the {kind}'s "
                                         f"{mem['total_bytes'] / 2**30:.1f} GiB: memory does not limit the batch "
                                         f"(notebook 09 measures memory per step)"))
    return out, skipped


def device_edits(probe: dict[str, Any], merged: dict[str, Any]) -> list[Any]:
    """The source edit of a ``tf32`` winner: ``matmul_precision`` before the optimizer's construction.

    Parameters
    ----------
    probe : dict
        The hook's result of the unmodified script (its ``optimizer`` site and the model's device).
    merged : dict
        The winners' runtime changes (:func:`helpers.tune.candidates.merge_apply`).

    Returns
    -------
    list of helpers.tune.rewrite.Edit
        One edit (``params["device"]``: "cuda" or "npu") where ``merged`` has ``tf32`` and the optimizer's line is
        known; else none. The other device winners carry their edits in their ``apply["edits"]``.
    """
    from helpers.tune.rewrite import Edit

    opt = probe.get("optimizer") or {}
    if not merged.get("tf32") or not opt.get("file"):
        return []
    kind = (probe.get("model") or {}).get("param_device") or "cuda"
    return [Edit("matmul_precision", opt["file"], opt["line"], {"device": kind}, "tf32")]


def device_reported(probe: dict[str, Any]) -> list[str]:
    """What tune found on the device and does not change.

    Parameters
    ----------
    probe : dict
        The hook's result of the unmodified script.

    Returns
    -------
    list of str
        One line each: a synchronisation on every step that is not a logging statement of the script's own (with
        the reason), a host-made tensor it does not rewrite, and peak memory at or above :data:`MEMORY_NEAR` of the
        device's (activation checkpointing, notebook 09). Empty off a device, or for an older probe.
    """
    dev = probe.get("device") or {}
    out = []
    steps = int(dev.get("sync_steps") or 0)
    for s, st, why in _sync_sites(probe):
        if why:
            out.append(f"{Path(s['file']).name}, line {s['line']} ({st['text'] or s['text']}) makes the host wait "
                       f"for the device on each of {steps} steps: {why}.")
    for s, f, why in _factory_sites(probe):
        if why:
            out.append(f"{Path(s['file']).name}, line {s['line']} makes a tensor on the host and copies it to the "
                       f"device each step ({f['code']}): {why}.")
    mem = dev.get("memory") or {}
    if mem.get("total_bytes") and mem["peak_bytes"] / mem["total_bytes"] >= MEMORY_NEAR:
        out.append(f"peak allocated memory {mem['peak_bytes'] / 2**30:.1f} GiB is "
                   f"{100 * mem['peak_bytes'] / mem['total_bytes']:.0f}% of the device's "
                   f"{mem['total_bytes'] / 2**30:.1f} GiB: memory limits the batch. Activation checkpointing "
                   f"(torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False) around the largest blocks) "
                   f"recomputes their activations in backward() instead of keeping them; notebook 09 measures "
                   f"memory per step and finds the largest batch that fits. tune does not edit your model.")
    return out
