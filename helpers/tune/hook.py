"""Inside the user's process: run their script unmodified, count and time its optimizer steps, apply techniques.

``python -m helpers.tune.hook SPEC.json`` reads a spec written by :mod:`helpers.tune.engine`, installs the
hooks below, runs the user's script (``runpy``, as ``__main__``, with their ``sys.argv``) and writes a result
JSON when the script has made ``warmup + steps`` optimizer steps (it is then stopped), ends, or fails.

What it watches (every run, so that the baseline and the candidates carry the same overhead):

- optimizer steps: a global step post-hook (``torch.optim.optimizer.register_optimizer_step_post_hook``, torch
  >= 2.0) timestamps each step of the first optimizer built, after a device synchronize where the model lives on
  a CUDA or NPU device (so a step's time includes its queued kernels);
- the loss: the last scalar a ``Tensor.backward`` was called on before each step (kept as a tensor and read at
  the end, so no extra synchronize per step);
- the call sites, in the user's own files, of ``DataLoader(...)``, of the optimizer's construction (and the
  names that the model has in that frame), of the model's forward call, of the loss's ``backward()``, of the
  optimizer's ``step()``, of gradient clipping (``torch.nn.utils.clip_grad_norm_`` / ``clip_grad_value_``) and of
  host-to-device ``.to()`` / ``.cuda()`` copies: file and line, taken from the frames while it runs;
  :mod:`helpers.tune.rewrite` edits there;
- the loops over a DataLoader built in the user's files: the ``for`` statement's file and line, and an expression
  valid there for the model's device (a variable that holds it, else the model's own), for the ``prefetch`` edit;
- the first ``DistributedDataParallel`` the user's files build (:class:`helpers.tune.hook_ddp._DDPWatch`): the
  ``backward()`` calls per optimizer step, the model's name at ``backward()``, the parameters that receive gradients each step, the call's
  keywords and the gradients' sizes;
- ``torch.save``: redirected into the run's scratch folder, so that no checkpoint of the user's is overwritten.

What it applies (only what the spec's ``apply`` asks for): DataLoader keyword arguments, ``non_blocking=True``
on the host-to-device copies, ``torch.autocast`` around the model's forward (for float16 with a
``torch.amp.GradScaler``: the loss scaled before ``backward()``, the gradients unscaled before a clip, the step
taken and the scale updated through it), ``channels_last`` on the model,
``torch.backends.cudnn.benchmark = True`` (set where the optimizer is built), and the loops' batches handed over by
notebook 05's side-stream prefetcher (:func:`helpers.pipeline.side_stream.prefetch`, onto the model's device);
for DistributedDataParallel, keywords of its call, a compression hook and ``no_sync`` over gradient accumulation
(:class:`helpers.tune.hook_ddp._DDPWatch`).
On a CUDA or NPU device (:mod:`helpers.tune.hook_device`): TF32 (``torch.set_float32_matmul_precision("high")``;
HF32 on an NPU) where the optimizer is built; and it records the precision the script left, the lines that make the
host wait for the device in steps 2-6 of the probe (``set_sync_debug_mode("warn")``) and the peak device memory.

This module imports only the standard library, torch and :mod:`helpers.pipeline.side_stream` (torch alone): it runs
inside the user's process.
"""

from __future__ import annotations

import inspect
import json
import os
import runpy
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from helpers.tune import hook_compile
from helpers.tune.hook_common import SITE_SAMPLES, _has_conv, _jsonable, seed_all
from helpers.tune.hook_cpu import _cpu_result, _watch_cpu
from helpers.tune.hook_ddp import _DDPWatch, _watch_ddp
from helpers.tune.hook_device import _device_result, _watch_device
from helpers.tune.hook_files import UserFiles
from helpers.tune.hook_general import _general_result, _watch_general

#: Seconds the interpreter's own shutdown may take after the script was stopped before the process exits
#: anyway (a non-daemon thread of the script's would otherwise keep it alive).
EXIT_GRACE_S = 15.0
#: Steps (after the first, which carries one-off costs) after which a run whose median step is slower than the
#: spec's ``give_up_step_s`` is stopped, warm-up or not: a change that makes each step several times slower need
#: not be timed for long to be called slower.
GIVE_UP_AFTER = 3
#: Training frameworks whose own files are never the user's, wherever they are (a copy beside the script too): a
#: DataLoader or an optimizer they build is set through their arguments (helpers.tune.candidates).
FRAMEWORK_PACKAGES = frozenset({"transformers", "lightning", "pytorch_lightning", "lightning_fabric", "accelerate"})
#: DataLoader arguments tune may set (torch.utils.data.DataLoader's own keyword names).
LOADER_KEYS = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor")


class _Stop(BaseException):
    """Raised from the step hook once enough steps were timed (a BaseException: ``except Exception`` in the
    user's loop does not swallow it)."""


class Recorder:
    """What one run saw; written as the result JSON by :meth:`result`."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.apply: dict[str, Any] = dict(spec.get("apply") or {})
        self.warmup = int(spec["warmup"])
        self.steps = int(spec["steps"])
        self.t0 = time.perf_counter()
        self.step_t: list[float] = []
        self.losses: list[Any] = []
        self._loss = None
        self.optimizer_id: int | None = None
        self.optimizer: dict[str, Any] | None = None
        self.other_optimizers: list[dict[str, Any]] = []
        self.model = None
        self.model_info: dict[str, Any] = {}
        self.loaders: list[dict[str, Any]] = []
        self.ddp_sites: list[dict[str, Any]] = []
        self.forward_sites: dict[tuple[str, int], int] = {}
        self.forward_calls = 0
        self.to_sites: dict[tuple[str, int], dict[str, Any]] = {}
        self.loop_sites: dict[tuple[str, int], dict[str, Any]] = {}
        self.backward_sites: dict[tuple[str, int], dict[str, Any]] = {}
        self.step_sites: dict[tuple[str, int], dict[str, Any]] = {}
        self.clip_sites: dict[tuple[str, int], dict[str, Any]] = {}
        self.scaler = None  # the GradScaler of apply["grad_scaler"], made with the first optimizer
        self.unscaled = False  # its gradients were unscaled this step (before a clip)
        self.optimizer_obj = None  # the optimizer the scaler steps
        self._scaled = None  # (the last tensor a GradScaler scaled, the tensor before scaling)
        self.step_closure = False  # the optimizer's step() was given a closure (LBFGS)
        self.autocast_in_use = False
        self.saved: list[dict[str, str]] = []
        self.notes: list[str] = []
        self.sync = None
        self.gave_up = False
        self.ddp_watch: _DDPWatch | None = None  # DistributedDataParallel and the backward() calls per step
        self.batches = 0  # batches drawn from the user's loaders
        roots = [Path(r).resolve() for r in spec.get("user_roots") or []]
        self.roots = [str(r) + os.sep for r in roots]
        here = Path(__file__).resolve().parents[1]  # the helpers package
        self.skip = [str(here) + os.sep, str(Path(inspect.getfile(inspect)).resolve().parent) + os.sep]

    # ------------------------------------------------------------------ call sites

    def is_user_file(self, filename: str) -> bool:
        """Whether ``filename`` is one of the user's files: under a user root, not in site-packages, torch, this
        package or a folder of a training framework (:data:`FRAMEWORK_PACKAGES`) under that root."""
        if not filename or filename.startswith("<"):
            return False
        try:
            path = str(Path(filename).resolve())
        except OSError:
            return False
        if "site-packages" in path or "dist-packages" in path or any(path.startswith(s) for s in self.skip):
            return False
        for r in self.roots:
            if path.startswith(r):  # a framework vendored or installed beside the script is not the user's code
                return not any(part in FRAMEWORK_PACKAGES for part in Path(path[len(r):]).parts[:-1])
        return False

    def user_frame(self, start):
        """The innermost frame at or above ``start`` that runs one of the user's files, or None."""
        f = start
        while f is not None:
            if self.is_user_file(f.f_code.co_filename):
                return f
            f = f.f_back
        return None

    @staticmethod
    def key(frame) -> tuple[str, int]:
        """A call site's key in the ``*_sites`` dicts: (the file's resolved path, the line)."""
        return str(Path(frame.f_code.co_filename).resolve()), int(frame.f_lineno)

    @staticmethod
    def site(frame) -> dict[str, Any]:
        return {"file": str(Path(frame.f_code.co_filename).resolve()), "line": int(frame.f_lineno),
                "function": frame.f_code.co_name}

    def count_site(self, sites: dict[tuple[str, int], dict[str, Any]], start) -> None:
        """Count the user's frame at or above ``start`` in ``sites`` (only while fewer than :data:`SITE_SAMPLES`
        steps were made: a frame walk each)."""
        if len(self.step_t) >= SITE_SAMPLES:
            return
        frame = self.user_frame(start)
        if frame is not None:
            sites.setdefault(self.key(frame), {**self.site(frame), "count": 0})["count"] += 1

    # ------------------------------------------------------------------ steps

    def on_step(self, optimizer, args, kwargs) -> None:
        """The step post-hook: timestamp the first optimizer's steps; stop after warmup + steps."""
        if self.optimizer_id is None:
            self.optimizer_id = id(optimizer)
        if id(optimizer) != self.optimizer_id:
            return
        self.count_site(self.step_sites, sys._getframe(1))
        if self.ddp_watch is not None:
            self.ddp_watch.on_step()
        self.step_closure = self.step_closure or bool(args) or "closure" in (kwargs or {})
        if self.sync is None:
            self.sync = _sync_for(optimizer)
        if self.sync:
            self.sync()
        self.step_t.append(time.perf_counter())
        self.losses.append(self._loss)
        self._loss = None
        if len(self.step_t) >= self.warmup + self.steps + 1:
            raise _Stop()
        limit = self.spec.get("give_up_step_s")
        if limit and len(self.step_t) == GIVE_UP_AFTER + 2:  # steps 2 to 4: past the first step's one-off costs
            times = sorted(b - a for a, b in zip(self.step_t[1:-1], self.step_t[2:]))
            if times[len(times) // 2] > limit:
                self.gave_up = True
                raise _Stop()

    def result(self, status: str, *, exit_code: int = 0, error: str = "") -> dict[str, Any]:
        t = self.step_t
        times = hook_compile.apart(self, [b - a for a, b in zip(t[:-1], t[1:])])
        measured = times[self.warmup:] if len(times) > self.warmup else []
        if self.gave_up:  # the steps it was judged on (past the first)
            measured = times[1:]
        losses = []
        for v in self.losses:
            try:
                losses.append(float(v) if v is not None else None)
            except Exception:  # noqa: BLE001 - a loss that cannot be read (a freed device) counts as unknown
                losses.append(None)
        return {
            "status": status, "exit_code": exit_code, "error": error,
            "steps_seen": len(t), "warmup_steps": self.warmup, "step_times_s": measured, "all_step_times_s": times,
            "first_step_s": (t[0] - self.t0) if t else None, "wall_s": time.perf_counter() - self.t0,
            "losses": losses, "loaders": self.loaders, "optimizer": self.optimizer, "model": self.model_info,
            "ddp_sites": self.ddp_sites, "ddp": self.ddp_watch.result() if self.ddp_watch is not None else {},
            "other_optimizers": self.other_optimizers,
            "forward_sites": [{"file": f, "line": ln, "count": c} for (f, ln), c in self.forward_sites.items()],
            "to_sites": list(self.to_sites.values()), "loop_sites": list(self.loop_sites.values()),
            "backward_sites": list(self.backward_sites.values()), "step_sites": list(self.step_sites.values()),
            "clip_sites": list(self.clip_sites.values()), "step_closure": self.step_closure,
            "autocast_in_use": self.autocast_in_use, "saved": self.saved, "notes": self.notes,
            "frameworks": sorted(m for m in ("lightning", "pytorch_lightning", "transformers", "accelerate")
                                 if m in sys.modules),
            "batches_drawn": self.batches, "python": {"executable": sys.executable, "version": sys.version.split()[0],
                                                        "torch": _torch_version()},
            "applied": self.apply, "general": _general_result(getattr(self, "general", None)),
            "device": _device_result(self),
            "compile": hook_compile.result(self),
            "cpu": _cpu_result(getattr(self, "cpu", None)),
        }


def _torch_version() -> str | None:
    torch = sys.modules.get("torch")
    return getattr(torch, "__version__", None) if torch is not None else None


def _sync_for(optimizer):
    """The device synchronize for the optimizer's parameters' device (None on CPU)."""
    import torch

    for group in optimizer.param_groups:
        for p in group["params"]:
            kind = p.device.type
            if kind == "cuda":
                return torch.cuda.synchronize
            if kind == "npu" and hasattr(torch, "npu"):
                return torch.npu.synchronize
            return False
    return False


def _flat_params(params) -> list:
    out = []
    for item in params:
        if isinstance(item, dict):
            out.extend(item.get("params", []))
        else:
            out.append(item)
    return out


def _find_model(frame, params):
    """The nn.Module, among the frame's locals and globals, that holds most of ``params``: (module, names)."""
    import torch

    wanted = {id(p) for p in params}
    best, best_n, names = None, 0, []
    scopes = [frame.f_locals] + ([frame.f_globals] if frame.f_globals is not frame.f_locals else [])
    # one level into the frame's own objects too: a trainer class keeps its model as self.model
    owners = {k: v for k, v in frame.f_locals.items() if not isinstance(v, torch.nn.Module)
              and hasattr(v, "__dict__") and not isinstance(v, type) and type(v).__module__ != "builtins"}
    attrs = {}
    for owner, obj in owners.items():
        try:
            items = list(vars(obj).items())
        except TypeError:
            continue
        attrs.update({f"{owner}.{k}": v for k, v in items if isinstance(v, torch.nn.Module)})
    scopes.append(attrs)
    for scope in scopes:
        for name, value in list(scope.items()):
            if not isinstance(value, torch.nn.Module):
                continue
            try:
                n = sum(1 for p in value.parameters() if id(p) in wanted)
            except Exception:  # noqa: BLE001 - a module whose parameters() fails is not the model
                continue
            if n > best_n or (n == best_n and value is best):
                if value is not best:
                    names = []
                best, best_n = value, n
            if value is best and name not in names:
                names.append(name)
    return best, names


def install(rec: Recorder) -> None:
    """Install the hooks and the runtime techniques of ``rec.apply``."""
    import torch
    from torch.optim import optimizer as optim_mod
    from torch.utils.data import DataLoader

    optim_mod.register_optimizer_step_post_hook(rec.on_step)
    if rec.spec.get("out"):
        _heartbeat(rec, _rank_path(rec.spec["out"], rec.spec) + PROGRESS_SUFFIX)

    orig_backward = torch.Tensor.backward

    orig_scale = torch.amp.GradScaler.scale

    def scale(self, outputs):  # a loss the script scales itself: its step's loss is the unscaled one
        out = orig_scale(self, outputs)
        rec._scaled = (out, outputs.detach()) if isinstance(outputs, torch.Tensor) else None
        return out

    torch.amp.GradScaler.scale = scale

    def backward(self, *args, **kwargs):
        if self.numel() == 1:
            scaled, rec._scaled = rec._scaled, None
            rec._loss = scaled[1] if scaled is not None and scaled[0] is self else self.detach()
            rec.count_site(rec.backward_sites, sys._getframe(1))
            if rec.ddp_watch is not None:
                rec.ddp_watch.on_backward(sys._getframe(1))
            if rec.scaler is not None:
                return orig_backward(rec.scaler.scale(self), *args, **kwargs)
        return orig_backward(self, *args, **kwargs)

    torch.Tensor.backward = backward

    loader_sig = inspect.signature(DataLoader.__init__)
    orig_loader_init = DataLoader.__init__

    def loader_init(self, *args, **kwargs):
        frame = rec.user_frame(sys._getframe(1))
        if frame is None:
            return orig_loader_init(self, *args, **kwargs)
        bound = loader_sig.bind(self, *args, **kwargs)
        given = {k: _jsonable(v) for k, v in bound.arguments.items() if k in LOADER_KEYS + ("batch_size",)}
        changes = dict(rec.apply.get("loader") or {})
        if changes:
            for key, value in changes.items():
                bound.arguments[key] = value
            if not bound.arguments.get("num_workers"):  # these two need workers
                bound.arguments.pop("persistent_workers", None)
                bound.arguments.pop("prefetch_factor", None)
        orig_loader_init(*bound.args, **bound.kwargs)
        self._workbook_tune_user = True  # a loader of the user's files: its loops are watched (_watch_loops)
        rec.loaders.append({**rec.site(frame), "class": type(self).__name__, "given": given,
                            "effective": {"num_workers": self.num_workers, "pin_memory": bool(self.pin_memory),
                                          "persistent_workers": bool(self.persistent_workers),
                                          "prefetch_factor": self.prefetch_factor,
                                          "batch_size": self.batch_size},
                            "dataset_len": _safe_len(self.dataset)})

    DataLoader.__init__ = loader_init
    _watch_loops(rec)

    orig_opt_init = torch.optim.Optimizer.__init__

    def opt_init(self, params, *args, **kwargs):
        if isinstance(params, torch.Tensor):
            params = [params]
        params = list(params)
        orig_opt_init(self, params, *args, **kwargs)
        frame = rec.user_frame(sys._getframe(1))
        if frame is None:
            return
        if rec.optimizer is not None:  # a second optimizer (a GAN's): its model is not the one tune changes
            other, other_names = _find_model(frame, _flat_params(params))
            rec.other_optimizers.append({**rec.site(frame), "class": type(self).__name__,
                                         "model_names": other_names if other is not None else []})
            return
        model, names = _find_model(frame, _flat_params(params))
        rec.optimizer = {**rec.site(frame), "class": type(self).__name__, "model_names": names}
        if model is not None:
            _take_model(rec, model)
            if rec.apply.get("grad_scaler"):
                _scale_steps(rec, self)

    torch.optim.Optimizer.__init__ = opt_init
    _watch_ddp(rec)
    _watch_clips(rec)

    autocast_cls = torch.amp.autocast_mode.autocast
    orig_enter = autocast_cls.__enter__

    def enter(self):
        if not getattr(self, "_workbook_tune", False) and getattr(self, "_enabled", True):
            rec.autocast_in_use = True
        return orig_enter(self)

    autocast_cls.__enter__ = enter

    orig_save = torch.save

    def save(obj, f, *args, **kwargs):
        if isinstance(f, (str, os.PathLike)):
            scratch = Path(rec.spec["scratch"]) / "saved"
            scratch.mkdir(parents=True, exist_ok=True)
            target = scratch / f"{len(rec.saved)}-{Path(f).name}"
            rec.saved.append({"asked": str(f), "written": str(target)})
            f = target
        return orig_save(obj, f, *args, **kwargs)

    torch.save = save

    if rec.spec.get("watch_copies"):
        _watch_copies(rec)
    _watch_device(rec)  # TF32/HF32, host synchronisations, peak memory (CUDA, NPU); inside _watch_general's wrap
    _watch_general(rec)
    _watch_cpu(rec)
    hook_compile.watch(rec)  # from the first torch.compile on: the compile time, apart from the steps


def _scale_steps(rec: Recorder, optimizer) -> None:
    """float16's loss scaling, as notebook 06 writes it, applied to the first optimizer: a ``torch.amp.GradScaler``
    on the model's device; ``backward()`` takes the scaled loss (the ``backward`` hook), a clip is preceded by
    ``unscale_`` (:func:`_watch_clips`), and ``optimizer.step()`` becomes ``scaler.step(optimizer)`` then
    ``scaler.update()``. A step the scaler skips (inf or NaN gradients) is still timed as one of the script's."""
    import types

    import torch

    rec.scaler = torch.amp.GradScaler(rec.model_info.get("param_device") or "cpu")
    rec.optimizer_obj = optimizer
    orig_step = optimizer.step
    inside = [False]

    def step(self, *args, **kwargs):  # a method, as an LR scheduler's wrap of optimizer.step expects (__func__)
        if inside[0]:  # the scaler's own call of optimizer.step()
            return orig_step(*args, **kwargs)
        inside[0] = True
        n = len(rec.step_t)
        try:
            out = rec.scaler.step(self, *args, **kwargs)
            rec.scaler.update()
        finally:
            inside[0] = False
            rec.unscaled = False
        if len(rec.step_t) == n:  # skipped by the scaler: the post-hook did not run
            rec.on_step(self, args, kwargs)
        return out

    optimizer.step = types.MethodType(step, optimizer)


def _watch_clips(rec: Recorder) -> None:
    """Record where the user's files clip gradients (``torch.nn.utils.clip_grad_norm_`` / ``clip_grad_value_``);
    with a GradScaler, unscale the gradients first (once a step), as the PyTorch AMP recipe does."""
    import torch.nn.utils
    import torch.nn.utils.clip_grad as clip_mod

    def wrap(orig):
        def clip(*args, **kwargs):
            rec.count_site(rec.clip_sites, sys._getframe(1))
            if rec.scaler is not None and not rec.unscaled and rec.optimizer_obj is not None:
                rec.scaler.unscale_(rec.optimizer_obj)
                rec.unscaled = True
            return orig(*args, **kwargs)
        return clip

    for name in ("clip_grad_norm_", "clip_grad_value_"):
        patched = wrap(getattr(clip_mod, name))
        setattr(clip_mod, name, patched)
        setattr(torch.nn.utils, name, patched)


def _watch_loops(rec: Recorder) -> None:
    """Record where the user's files loop over a DataLoader they built, with the device's expression there; with
    ``prefetch``, hand the loop its batches through :func:`helpers.pipeline.side_stream.prefetch`, copied onto the
    model's device one step ahead (where the model is not known yet, the loop gets the loader's own batches)."""
    from torch.utils.data import DataLoader

    from helpers.pipeline.side_stream import prefetch

    orig_iter = DataLoader.__iter__

    def loader_iter(self):
        batches = orig_iter(self)
        if not getattr(self, "_workbook_tune_user", False):
            return batches
        start = sys._getframe(1)
        while start is not None and isinstance(start.f_locals.get("self"), DataLoader):
            start = start.f_back  # a DataLoader subclass's own method: the loop is its caller's
        frame = rec.user_frame(start)
        device = _model_device(rec)
        if frame is not None:
            key = rec.key(frame)
            if key not in rec.loop_sites:
                rec.loop_sites[key] = {**rec.site(frame), "is_for": _in_for_header(*key),
                                       "device_expr": _device_expr(frame, rec.model, device),
                                       "batches": _safe_len(self),
                                       "epochs": _epochs_in(frame) or _epochs_from_range(frame)}
        try:
            batches._workbook_tune_user = True  # its batches are counted (batches per optimizer step)
            # and per loop, so a validation loop's batches are not taken for gradient accumulation's
            batches._workbook_tune_loop = rec.loop_sites.get(rec.key(frame)) if frame is not None else None
        except AttributeError:
            pass
        if rec.apply.get("prefetch") and device is not None:
            return prefetch(batches, device)
        return batches

    DataLoader.__iter__ = loader_iter
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    orig_next = _BaseDataLoaderIter.__next__

    def counted_next(self):
        out = orig_next(self)
        if getattr(self, "_workbook_tune_user", False):
            rec.batches += 1
            loop = getattr(self, "_workbook_tune_loop", None)
            if loop is not None:
                loop["drawn"] = loop.get("drawn", 0) + 1
        return out

    _BaseDataLoaderIter.__next__ = counted_next


#: Names a script gives its number of epochs (argparse options, configs, Lightning's and transformers' arguments).
EPOCH_NAMES = ("epochs", "num_epochs", "n_epochs", "max_epochs", "nepochs", "epoch_count", "num_train_epochs")


def _epochs_in(frame) -> dict[str, Any] | None:
    """The number of epochs in scope at a loop over a DataLoader: ``{"expr": "args.epochs", "value": 5}`` from a
    positive int named as in :data:`EPOCH_NAMES`, in the frame or as an attribute of ``args``/``cfg``/``config``/
    ``opts``/``options``/``hparams``/``self``; None where none is seen."""
    scopes = [frame.f_locals] + ([frame.f_globals] if frame.f_globals is not frame.f_locals else [])
    for scope in scopes:
        for name in EPOCH_NAMES:
            v = scope.get(name)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return {"expr": name, "value": v}
        for owner in ("args", "cfg", "config", "opts", "options", "hparams", "self"):
            obj = scope.get(owner)
            for name in EPOCH_NAMES:
                try:
                    v = getattr(obj, name, None) if obj is not None else None
                except Exception:  # noqa: BLE001 - a property that fails is not the epochs
                    v = None
                if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                    return {"expr": f"{owner}.{name}", "value": v}
    return None


def _epochs_from_range(frame) -> dict[str, Any] | None:
    """The number of epochs from the ``for`` loop around the DataLoader's loop, in the same function, where it runs
    over ``range(stop)`` or ``range(start, stop)`` of literals, names or attributes (``for epoch in range(3):``,
    ``for epoch in range(start, cfg.epochs):``), read in ``frame``: ``{"expr": "range(3)", "value": 3}``; None
    where the loop is another kind, has a step, or its bounds are calls or unknown names (nothing is evaluated)."""
    import ast

    line, filename = frame.f_lineno, frame.f_code.co_filename
    try:
        tree = ast.parse(Path(filename).read_text(encoding="utf-8"), filename=filename)
    except (OSError, SyntaxError, ValueError):
        return None
    outer = [n for n in ast.walk(tree) if isinstance(n, ast.For) and n.lineno < line <= (n.end_lineno or n.lineno)
             and isinstance(n.iter, ast.Call) and isinstance(n.iter.func, ast.Name) and n.iter.func.id == "range"
             and 1 <= len(n.iter.args) <= 2 and not n.iter.keywords]
    if not outer:
        return None
    loop = max(outer, key=lambda n: n.lineno)  # the nearest around the DataLoader's loop
    scopes = [frame.f_locals, frame.f_globals]

    def value(node: ast.expr) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return next((sc[node.id] for sc in scopes if node.id in sc), None)
        if isinstance(node, ast.Attribute):
            base = value(node.value)
            try:
                return getattr(base, node.attr, None) if base is not None else None
            except Exception:  # noqa: BLE001 - a property that fails is not the epochs
                return None
        return None

    bounds = [value(a) for a in loop.iter.args]
    if not all(isinstance(b, int) and not isinstance(b, bool) for b in bounds):
        return None
    n = bounds[-1] - (bounds[0] if len(bounds) == 2 else 0)
    return {"expr": ast.unparse(loop.iter), "value": n} if n > 0 else None


_FOR_HEADERS: dict[str, list[tuple[int, int]]] = {}


def _in_for_header(filename: str, line: int) -> bool:
    """Whether ``line`` of ``filename`` is within the iterable of a ``for`` statement (not a comprehension, not an
    ``iter()`` call on a line of its own): the loops the ``prefetch`` edit can wrap. Each file is parsed once."""
    import ast

    if filename not in _FOR_HEADERS:
        try:
            tree = ast.parse(Path(filename).read_text(encoding="utf-8"), filename=filename)
        except (OSError, SyntaxError, ValueError):
            tree = None
        _FOR_HEADERS[filename] = [(n.iter.lineno, n.iter.end_lineno or n.iter.lineno) for n in ast.walk(tree)
                                  if isinstance(n, ast.For)] if tree is not None else []
    return any(a <= line <= b for a, b in _FOR_HEADERS[filename])


def _model_device(rec: Recorder):
    """The device of the model's first parameter (a ``torch.device``), or None before the model is known."""
    first = next(iter(rec.model.parameters()), None) if rec.model is not None else None
    return first.device if first is not None else None


def _device_expr(frame, model, device) -> str | None:
    """A Python expression, valid at ``frame``'s current line, for ``device`` (the model's): a variable holding it as
    a ``torch.device`` (first one whose name says device), or a string variable or attribute named ``*device*`` that
    names it (``args.device``, ``self.device``), else the model's own (``next(model.parameters()).device``) where the
    model is in scope; None where nothing there names it."""
    import torch

    if device is None:
        return None
    scopes = [frame.f_locals] + ([frame.f_globals] if frame.f_globals is not frame.f_locals else [])
    named: list[tuple[int, str]] = []  # (rank: lower is better, expression)

    def consider(name: str, value: Any) -> None:
        says = "device" in name.lower().rsplit(".", 1)[-1]
        if isinstance(value, torch.nn.Module):
            inner = getattr(value, "module", None)
            if value is model or inner is model or getattr(model, "module", None) is value:
                named.append((3, f"next({name}.parameters()).device"))
            return
        if not isinstance(value, (torch.device, str)) or (isinstance(value, str) and not says):
            return
        try:
            d = torch.device(value)
        except (RuntimeError, TypeError):
            return
        if d.type == device.type and (d.index is None or d.index == device.index):
            named.append(((0 if says else 1) if isinstance(value, torch.device) else 2, name))

    for scope in scopes:
        for name, value in list(scope.items()):
            if name.startswith("__"):
                continue
            consider(name, value)
            if name in ("self", "args", "cfg", "config", "opts", "options") and hasattr(value, "__dict__"):
                try:
                    attrs = list(vars(value).items())
                except TypeError:
                    continue
                for attr, v in attrs:
                    if not attr.startswith("_"):
                        consider(f"{name}.{attr}", v)
    return min(named)[1] if named else None


def _take_model(rec: Recorder, model) -> None:
    """Describe the model; apply channels_last; wrap its forward (call sites; autocast; torch.compile)."""
    import torch

    conv = _has_conv(model)
    first = next(iter(model.parameters()), None)
    rec.model = model
    rec.model_info = {"class": type(model).__name__, "has_conv2d": conv,
                      "n_params": int(sum(p.numel() for p in model.parameters())),
                      "param_device": first.device.type if first is not None else None,
                      "param_dtype": str(first.dtype).replace("torch.", "") if first is not None else None,
                      "bf16_supported": _bf16_supported(first.device.type if first is not None else "cpu")}
    rec.model_info["cudnn_benchmark"] = bool(torch.backends.cudnn.benchmark)
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        rec.model_info["wrapper"] = "DistributedDataParallel"
    rec.model_info.update(hook_compile.describe(model))
    if rec.apply.get("channels_last") and conv:
        model.to(memory_format=torch.channels_last)
    if rec.apply.get("cudnn_benchmark"):
        torch.backends.cudnn.benchmark = True
    dtype = rec.apply.get("autocast")
    device_type = rec.model_info["param_device"] or "cpu"
    orig_forward = model.forward
    if rec.apply.get("compile"):  # the forward compiled; tune's wrapper below stays outside the compiled code
        orig_forward = hook_compile.compiled(orig_forward, rec.apply["compile"])

    def forward(*args, **kwargs):
        rec.forward_calls += 1
        if rec.forward_calls <= SITE_SAMPLES:
            frame = rec.user_frame(sys._getframe(1))
            if frame is not None:
                key = rec.key(frame)
                rec.forward_sites[key] = rec.forward_sites.get(key, 0) + 1
        if dtype:
            ctx = torch.autocast(device_type=device_type, dtype=getattr(torch, dtype))
            ctx._workbook_tune = True
            with ctx:
                return orig_forward(*args, **kwargs)
        return orig_forward(*args, **kwargs)

    model.forward = forward


def _bf16_supported(kind: str) -> bool | None:
    """Whether autocast to bfloat16 is available on the device kind (None: not known here)."""
    import torch

    if kind == "cpu":
        return True
    if kind == "cuda":
        try:
            return bool(torch.cuda.is_bf16_supported())
        except Exception:  # noqa: BLE001
            return None
    return None


def _watch_copies(rec: Recorder) -> None:
    """Record host-to-device ``.to()`` / ``.cuda()`` call sites in the user's files; add non_blocking=True there
    when the spec applies it."""
    import torch

    orig_to, orig_cuda = torch.Tensor.to, torch.Tensor.cuda
    non_blocking = bool(rec.apply.get("non_blocking"))

    def target(args, kwargs):
        dev = kwargs.get("device")
        if dev is None and args:
            a = args[0]
            if isinstance(a, (str, torch.device)):
                dev = a
            elif isinstance(a, torch.Tensor):
                dev = a.device
        if dev is None:
            return None
        try:
            return torch.device(dev)
        except (TypeError, RuntimeError):
            return None

    def note(method):
        frame = rec.user_frame(sys._getframe(2))
        if frame is None:
            return False
        key = rec.key(frame)
        entry = rec.to_sites.setdefault(key, {**rec.site(frame), "method": method, "count": 0})
        entry["count"] += 1
        return True

    def to(self, *args, **kwargs):
        if self.device.type == "cpu":
            dev = target(args, kwargs)
            if dev is not None and dev.type != "cpu" and note("to") and non_blocking:
                kwargs["non_blocking"] = True
        return orig_to(self, *args, **kwargs)

    def cuda(self, *args, **kwargs):
        if self.device.type == "cpu" and note("cuda") and non_blocking:
            kwargs["non_blocking"] = True
        return orig_cuda(self, *args, **kwargs)

    torch.Tensor.to, torch.Tensor.cuda = to, cuda


def _safe_len(dataset) -> int | None:
    try:
        return len(dataset)
    except Exception:  # noqa: BLE001 - an IterableDataset has no len
        return None


#: Seconds between two writes of a run's progress (its optimizer steps so far): what a hung run is judged by.
HEARTBEAT_S = 1.0
#: The heartbeat's file is the result's path with this added.
PROGRESS_SUFFIX = ".progress"


def rank_file(out: str, rank: int) -> str:
    """Where rank ``rank`` of a run writes its result: ``out`` for rank 0 (or a single process), ``out.rankR``
    for rank R of a torchrun run. The one naming rule, read back by :mod:`helpers.tune.engine`."""
    return f"{out}.rank{rank}" if rank else out


def _rank_path(out: str, spec: dict[str, Any]) -> str:
    """This process's result file: :func:`rank_file` of its ``RANK`` under torchrun (a spec ``world`` above 1)."""
    return rank_file(out, int(os.environ.get("RANK") or 0) if int(spec.get("world") or 1) > 1 else 0)


def _heartbeat(rec: "Recorder", path: str) -> None:
    """Write ``{"steps": N, "wall": unix time of the last step or of the start, "slowest": the longest step so far,
    s}`` to ``path`` every :data:`HEARTBEAT_S` seconds from a daemon thread, so that a run stopped for hanging says
    how far it got, and a run whose steps stop is seen to stall (:func:`helpers.tune.engine.stalled`). A second in
    which torch's compiler is running (:class:`helpers.tune.hook_compile.CompileWatch`) counts as a step's: a
    compiling run is not a stalled one (only the run's timeout bounds a compilation)."""
    started = time.time()

    def beat():
        last_n, last_wall = -1, started
        while True:
            t = list(rec.step_t)
            n = len(t)
            busy = getattr(getattr(rec, "compile_watch", None), "active", False)  # compiling is progress
            if n != last_n or busy:
                last_n, last_wall = n, time.time()
                slowest = max((b - a for a, b in zip(t, t[1:])), default=0.0)
                try:
                    _write(path, {"steps": n, "wall": last_wall, "slowest": slowest})
                except OSError:
                    return
            time.sleep(HEARTBEAT_S)

    threading.Thread(target=beat, daemon=True, name="tune-heartbeat").start()


def _write(path: str, data: dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def _exit_later(code: int) -> None:
    def force():
        time.sleep(EXIT_GRACE_S)
        os._exit(code)

    threading.Thread(target=force, daemon=True).start()


def _run_as_main(script: str, source: str) -> None:
    """Execute ``source``'s text as the ``__main__`` module of the file ``script`` (as ``python script`` does):
    ``__file__``, the frames and the tracebacks name ``script``, and its folder leads ``sys.path``, so a rewritten
    copy runs exactly as the original would from the original's place."""
    import builtins
    import types

    text = Path(source).read_text(encoding="utf-8")
    code = compile(text, script, "exec")
    if source != script:  # a traceback shows the rewritten lines, not the original file's at those numbers
        import linecache

        linecache.cache[script] = (len(text), None, text.splitlines(True), script)
    module = types.ModuleType("__main__")
    module.__dict__.update(__file__=script, __builtins__=builtins, __spec__=None, __loader__=None,
                           __package__=None, __cached__=None)
    sys.path.insert(0, str(Path(script).resolve().parent))
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = module
    try:
        exec(code, module.__dict__)
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved


def _run_module_as_main(module: str, source: str | None) -> None:
    """Run ``module`` as ``python -m module`` does (``runpy.run_module``: its package imported first, so its
    relative imports work); with ``source``, that file's text in the module's place (the rewritten module), its
    ``__file__``, ``__spec__`` and frames the module's own."""
    if source is None:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return
    import builtins
    import importlib.util
    import linecache
    import types

    spec = importlib.util.find_spec(module)
    if spec is not None and spec.submodule_search_locations is not None:  # a package: its __main__, as -m runs
        spec = importlib.util.find_spec(module + ".__main__")
    if spec is None or not spec.origin:
        raise ImportError(f"No module named {module!r}")
    text = Path(source).read_text(encoding="utf-8")
    linecache.cache[spec.origin] = (len(text), None, text.splitlines(True), spec.origin)
    main_module = types.ModuleType("__main__")
    main_module.__dict__.update(__file__=spec.origin, __builtins__=builtins, __spec__=spec, __loader__=spec.loader,
                                __package__=spec.parent, __cached__=None)
    sys.argv[0] = spec.origin
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = main_module
    try:
        exec(compile(text, spec.origin, "exec"), main_module.__dict__)
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved


def main(argv: list[str] | None = None) -> int:
    """Run the spec's script under the hooks; write the result JSON; return the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0], encoding="utf-8") as f:
        spec = json.load(f)
    rec = Recorder(spec)
    cache = hook_compile.private_cache(spec["scratch"])  # each run compiles cold, in its own folder
    if spec.get("keep"):  # before anything of the user's runs: every file it changes is kept first
        sys.addaudithook(UserFiles(spec["keep"], [spec["scratch"], hook_compile.torch_cache()]))
    install(rec)
    seed_all(max(int(spec.get("round", 0)), 0))  # the same draw for a round's unmodified and changed runs
    sys.argv = list(spec["argv"])
    status, code, error = "script_end", 0, ""
    failed_at = None  # wall clock of a failure: under torchrun, the first rank to fail is the cause
    try:
        if spec.get("module"):
            _run_module_as_main(spec["module"], spec.get("source"))
        else:
            _run_as_main(spec["script"], spec.get("source") or spec["script"])
    except _Stop:
        status = "slow" if rec.gave_up else "steps"
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if code:
            status, error = "exit", f"the script exited with status {e.code!r}"
            failed_at = time.time()
    except KeyboardInterrupt:
        status, code, error = "error", 130, "interrupted"
    except BaseException as exc:  # noqa: BLE001 - the user's own failure, reported as theirs
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename in (__file__, runpy.__file__):
            tb = tb.tb_next  # the frames of this runner: the traceback starts in the user's script
        status, code, failed_at = "error", 1, time.time()
        error = "".join(traceback.format_exception(type(exc), exc, tb))
        sys.stderr.write(error)
    out = _rank_path(spec["out"], spec)  # under torchrun each rank writes its own (helpers.tune.engine.rank_result)
    result = rec.result(status, exit_code=code, error=error)
    result["failed_at"] = failed_at
    _write(out, result)
    if cache:
        import shutil

        shutil.rmtree(cache, ignore_errors=True)
    sys.stdout.flush()
    sys.stderr.flush()
    _exit_later(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
