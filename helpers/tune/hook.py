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
- the first ``DistributedDataParallel`` the user's files build (:class:`_DDPWatch`): the ``backward()`` calls per
  optimizer step, the model's name at ``backward()``, the parameters that receive gradients each step, the call's
  keywords and the gradients' sizes;
- ``torch.save``: redirected into the run's scratch folder, so that no checkpoint of the user's is overwritten.

What it applies (only what the spec's ``apply`` asks for): DataLoader keyword arguments, ``non_blocking=True``
on the host-to-device copies, ``torch.autocast`` around the model's forward (for float16 with a
``torch.amp.GradScaler``: the loss scaled before ``backward()``, the gradients unscaled before a clip, the step
taken and the scale updated through it), ``channels_last`` on the model,
``torch.backends.cudnn.benchmark = True`` (set where the optimizer is built), and the loops' batches handed over by
notebook 05's side-stream prefetcher (:func:`helpers.pipeline.side_stream.prefetch`, onto the model's device);
for DistributedDataParallel, keywords of its call, a compression hook and ``no_sync`` over gradient accumulation
(:class:`_DDPWatch`).

This module imports only the standard library, torch and :mod:`helpers.pipeline.side_stream` (torch alone): it runs
inside the user's process.
"""

from __future__ import annotations

import inspect
import json
import os
import runpy
import sys
import textwrap
import threading
import time
import traceback
from pathlib import Path
from typing import Any

#: Forward calls whose call site is recorded (a frame walk each); later calls are only counted.
SITE_SAMPLES = 64
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
        times = [b - a for a, b in zip(t[:-1], t[1:])]
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
    _watch_general(rec)


def _watch_ddp(rec: Recorder) -> None:
    """Record where the user's files wrap a model in ``DistributedDataParallel``; with ``channels_last``, convert
    the module before DDP builds its gradient buckets, whose views take the parameters' strides (converted after,
    every backward warns "Grad strides do not match bucket view strides" and copies each gradient)."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    orig_init = DistributedDataParallel.__init__
    watch = rec.ddp_watch = _DDPWatch(rec)

    def ddp_init(self, module, *args, **kwargs):
        frame = rec.user_frame(sys._getframe(1))
        if frame is None:
            return orig_init(self, module, *args, **kwargs)
        rec.ddp_sites.append(rec.site(frame))
        if rec.apply.get("channels_last") and _has_conv(module):
            module.to(memory_format=torch.channels_last)
        first = len(rec.ddp_sites) == 1
        if first:
            args, kwargs = watch.before_init(self, module, args, kwargs)
        out = orig_init(self, module, *args, **kwargs)
        if first:
            watch.took(self)
        return out

    DistributedDataParallel.__init__ = ddp_init


#: DistributedDataParallel keywords tune sets (torch 2.13's own names, torch/nn/parallel/distributed.py).
DDP_KEYS = ("bucket_cap_mb", "gradient_as_bucket_view", "static_graph")
#: Parameters whose sizes the probe keeps (the bucket layouts are simulated from them).
DDP_SIZES = 10000


class _DDPWatch:
    """The first ``DistributedDataParallel`` the user's files build: what tune watches of it and applies to it.

    Watched in every run (so that each carries the same overhead): the ``backward()`` calls on a scalar between two
    optimizer steps (gradient accumulation makes several), the name the DDP model has where ``backward()`` is
    called (the ``no_sync`` edit writes it), which parameters receive a gradient in each of the first
    :data:`SITE_SAMPLES` steps (``static_graph`` needs the same ones every step), the keywords of :data:`DDP_KEYS`
    and ``find_unused_parameters`` the script passes, the parameters' sizes in bytes (last first, as DDP fills
    its buckets), the process group's backend, and whether the script enters ``no_sync()`` itself.

    Applied where the spec asks: ``apply["ddp"]``, keywords set in the DDP call; ``apply["comm_hook"]`` ("bf16"
    or "fp16"), ``register_comm_hook(None, default_hooks.<it>_compress_hook)`` once it is built;
    ``apply["no_sync"]`` = k, DDP's own ``require_backward_grad_sync`` flag (the one ``no_sync()`` clears)
    cleared for the forward passes of the first k - 1 micro-steps after each optimizer step and set for the k-th,
    as ``with model.no_sync() if (i + 1) % k != 0 else contextlib.nullcontext():`` does in the script. An
    optimizer step taken after fewer than k ``backward()`` calls would follow an unsynchronised micro-step: the
    run then fails with that reason rather than let each rank step on its own gradients.
    """

    def __init__(self, rec: Recorder) -> None:
        from torch.nn.parallel import DistributedDataParallel

        self.rec = rec
        self.ddp = None
        self.accum = int(rec.apply.get("no_sync") or 0)
        self.backwards = 0  # scalar backward() calls since the last optimizer step
        self.per_step: list[int] = []
        self.names: dict[tuple[str, int], str | None] = {}
        self.grads: set[int] = set()
        self.grad_sets: list[frozenset[int]] = []
        self.handles: list[Any] = []
        self.info: dict[str, Any] = {}
        orig_no_sync = DistributedDataParallel.no_sync

        def no_sync(ddp):
            if ddp is self.ddp:
                self.info["no_sync_in_use"] = True
            return orig_no_sync(ddp)

        DistributedDataParallel.no_sync = no_sync

    def before_init(self, ddp, module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        """The DDP call's arguments (after ``self`` and the module) with ``apply["ddp"]`` set; its keywords noted."""
        from torch.nn.parallel import DistributedDataParallel

        try:
            bound = inspect.signature(DistributedDataParallel.__init__).bind(ddp, module, *args, **kwargs)
        except TypeError:
            return args, kwargs  # DDP raises its own error
        self.info["given"] = {k: _jsonable(v) for k, v in bound.arguments.items()
                              if k in DDP_KEYS + ("find_unused_parameters",)}
        for key, value in (self.rec.apply.get("ddp") or {}).items():
            bound.arguments[key] = value
        return bound.args[2:], bound.kwargs

    def took(self, ddp) -> None:
        """Watch ``ddp`` (built); register the applied compression hook; the first micro-step's flag."""
        import torch.distributed as dist

        self.ddp = ddp
        params = [p for p in ddp.module.parameters() if p.requires_grad]
        sizes = [p.numel() * p.element_size() for p in reversed(params)]
        self.info.update(params=len(params), grad_bytes=sum(sizes), param_bytes=sizes[:DDP_SIZES],
                         bf16_comm_hook=_bf16_comm_hook())
        try:
            self.info["backend"] = str(dist.get_backend(ddp.process_group))
            self.info["world"] = int(dist.get_world_size(ddp.process_group))
        except Exception:  # noqa: BLE001 - a group torch cannot name
            self.info["backend"] = None
        hook = self.rec.apply.get("comm_hook")
        if hook:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            ddp.register_comm_hook(None, getattr(default_hooks, f"{hook}_compress_hook"))
            self.info["comm_hook_applied"] = f"{hook}_compress_hook"
        for i, p in enumerate(params):
            self.handles.append(p.register_post_accumulate_grad_hook(lambda _p, i=i: self.grads.add(i)))
        if self.accum:
            ddp.require_backward_grad_sync = self.accum <= 1

    def on_backward(self, start) -> None:
        """A scalar ``backward()`` (called from ``start``'s frame): count it; the next forward's sync flag."""
        self.backwards += 1
        if self.ddp is None:
            return
        if len(self.rec.step_t) < SITE_SAMPLES:
            frame = self.rec.user_frame(start)
            if frame is not None and self.rec.key(frame) not in self.names:
                self.names[self.rec.key(frame)] = _name_for(frame, self.ddp)
        if self.accum:
            self.ddp.require_backward_grad_sync = self.backwards >= self.accum - 1

    def on_step(self) -> None:
        """An optimizer step of the first optimizer: the micro-steps it took, the parameters that got gradients."""
        n, self.backwards = self.backwards, 0
        if len(self.per_step) < SITE_SAMPLES:
            self.per_step.append(n)
        if self.handles:
            self.grad_sets.append(frozenset(self.grads))
            self.grads = set()
            if len(self.grad_sets) >= SITE_SAMPLES:
                for h in self.handles:
                    h.remove()
                self.handles = []
        if self.accum and self.ddp is not None:
            self.ddp.require_backward_grad_sync = self.accum <= 1
            if n < self.accum:
                raise RuntimeError(f"tune's no_sync: this optimizer step followed {n} backward() calls, not "
                                   f"{self.accum} as in the probe, so its last micro-step was not synchronised; "
                                   f"the micro-steps per step vary: use the loop's own condition")

    def result(self) -> dict[str, Any]:
        sets = self.grad_sets
        script = self.rec.spec.get("script")
        out = {**self.info, "wrapped": self.ddp is not None, "backwards_per_step": self.per_step,
               "script": str(Path(script).resolve()) if script else None,
               "names": [{"file": f, "line": ln, "name": n} for (f, ln), n in self.names.items()],
               "grad_steps": len(sets), "params_with_grad": len(sets[0]) if sets else 0,
               # the script's own hooks (registered after the DDP call, so counted at the end), not tune's
               "comm_hooks": len(getattr(self.ddp, "_comm_hooks", None) or [])
               - bool(self.info.get("comm_hook_applied")),
               "same_params_every_step": bool(sets) and all(x == sets[0] for x in sets)}
        return out


def _bf16_comm_hook() -> bool:
    """Whether DDP accepts ``bf16_compress_hook`` here: torch 2.13's own check (``_check_comm_hook`` in
    torch/nn/parallel/distributed.py) asks for a CUDA (or ROCm) build with NCCL 2.10 or later, or XPU with XCCL;
    gloo on a CPU is refused ("BF16 all reduce communication hook required CUDA 11+ and NCCL 2.10+")."""
    import torch
    import torch.distributed as dist

    try:
        if (torch.version.cuda is not None or torch.version.hip is not None) and dist.is_nccl_available() \
                and torch.cuda.nccl.version() >= (2, 10):
            return True
        return bool(dist.is_xccl_available() and torch.xpu.is_available())
    except Exception:  # noqa: BLE001 - a build without these
        return False


def _name_for(frame, obj) -> str | None:
    """An expression valid at ``frame`` for ``obj``: a local or global variable holding it, else ``self.<attr>``
    (or another local object's attribute) that does; None where none does."""
    scopes = [frame.f_locals] + ([frame.f_globals] if frame.f_globals is not frame.f_locals else [])
    for scope in scopes:
        for name, value in list(scope.items()):
            if value is obj and not name.startswith("__"):
                return name
    for name, value in list(frame.f_locals.items()):
        try:
            attrs = list(vars(value).items()) if hasattr(value, "__dict__") and not isinstance(value, type) else []
        except TypeError:
            continue
        for attr, v in attrs:
            if v is obj and not attr.startswith("_"):
                return f"{name}.{attr}"
    return None


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
                                       "batches": _safe_len(self), "epochs": _epochs_in(frame)}
        try:
            batches._workbook_tune_user = True  # its batches are counted (batches per optimizer step)
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


def _has_conv(module) -> bool:
    """Whether ``module`` holds a 2-D convolution (what channels_last acts on)."""
    import torch

    return any(isinstance(m, (torch.nn.Conv2d, torch.nn.ConvTranspose2d)) for m in module.modules())


def _take_model(rec: Recorder, model) -> None:
    """Describe the model; apply channels_last; wrap its forward (call sites; autocast)."""
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
    if rec.apply.get("channels_last") and conv:
        model.to(memory_format=torch.channels_last)
    if rec.apply.get("cudnn_benchmark"):
        torch.backends.cudnn.benchmark = True
    dtype = rec.apply.get("autocast")
    device_type = rec.model_info["param_device"] or "cpu"
    orig_forward = model.forward

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


#: The autograd debugging APIs tune switches off at runtime (PyTorch Performance Tuning Guide, "Disable debugging
#: APIs"): anomaly detection (``torch.autograd.set_detect_anomaly(True)``, ``torch.autograd.detect_anomaly()``) and
#: ``torch.autograd.gradcheck`` / ``gradgradcheck``. The profilers the Guide names there are found and reported only:
#: their results are read later in the script (``prof.key_averages()``), which a profiler switched off would break.
DEBUG_OFF = ("set_detect_anomaly", "detect_anomaly", "gradcheck", "gradgradcheck")
#: The optimizers with a fused implementation, by their torch.optim class (torch 2.13: the classes whose step calls
#: ``torch.optim.optimizer._device_dtype_check_for_fused``; AdamW is an Adam).
FUSED_OPTIMIZERS = ("Adam", "AdamW", "SGD", "Adagrad")


def _watch_general(rec: Recorder) -> None:
    """The Guide's general items (tune's candidates ``debug_apis``, ``no_grad``, ``set_to_none``,
    ``optimizer_impl``, and what it reports only), recorded in ``rec.general`` and applied where the spec asks:

    - debugging APIs left on: each call site of :data:`DEBUG_OFF` and of a profiler (``torch.autograd.profiler.
      profile``, ``emit_nvtx``, ``torch.profiler.profile`` without a schedule), with its count; ``apply["debug_off"]``
      keeps anomaly detection off and makes ``gradcheck`` return True without running;
    - the model's forward calls whose output never receives a gradient (a validation loop): per call site, the calls
      made with gradients enabled and whether a gradient reached an output (a tensor hook); ``apply["no_grad"]``
      (a list of ``[file, line]``) runs the forward calls from those sites under ``torch.no_grad()``;
    - ``zero_grad(set_to_none=False)`` (the optimizer's or a module's) call sites; ``apply["set_to_none"]`` makes
      them set the gradients to None;
    - the first optimizer's implementation (``foreach``/``fused`` as given) and whether torch has a fused one for it
      on its device; ``apply["optimizer_impl"]`` (``{"fused": True}`` or ``{"foreach": True}``) passes it to the
      torch.optim class's constructor;
    - reported only: a Dataset whose ``__getitem__`` opens an image with PIL (decoded one by one in the loader), and
      a convolution with a bias whose output goes straight into a batch norm (found on the first forward).
    """
    import torch
    from torch.autograd import anomaly_mode
    from torch.utils.data import DataLoader

    gen: dict[str, Any] = {"debug_sites": {}, "forwards": {}, "zero_grad_sites": {}, "optimizer_impl": None,
                           "reported": []}
    rec.general = gen
    off = bool(rec.apply.get("debug_off"))
    known: dict[str, bool] = {}

    def user_site(start) -> tuple[str, int] | None:
        f = start
        while f is not None:
            name = f.f_code.co_filename
            if name not in known:
                known[name] = rec.is_user_file(name)
            if known[name]:
                return rec.key(f)
            f = f.f_back
        return None

    def count(table: dict, api: str, start, **extra) -> tuple[str, int] | None:
        at = user_site(start)
        if at is not None:
            entry = table.setdefault(f"{api}@{at[0]}:{at[1]}", {"api": api, "file": at[0], "line": at[1],
                                                                 "count": 0, **extra})
            entry["count"] += 1
        return at

    orig_set_init = anomaly_mode.set_detect_anomaly.__init__

    def set_init(self, mode, check_nan=True):
        if mode:
            count(gen["debug_sites"], "set_detect_anomaly", sys._getframe(1))
            mode = mode and not off
        orig_set_init(self, mode, check_nan)

    anomaly_mode.set_detect_anomaly.__init__ = set_init
    orig_detect_enter = anomaly_mode.detect_anomaly.__enter__

    def detect_enter(self):
        count(gen["debug_sites"], "detect_anomaly", sys._getframe(1))
        if not off:
            return orig_detect_enter(self)
        return None

    anomaly_mode.detect_anomaly.__enter__ = detect_enter

    def checker(name: str):
        orig = getattr(torch.autograd, name)

        def check(*args, **kwargs):
            count(gen["debug_sites"], name, sys._getframe(1))
            return True if off else orig(*args, **kwargs)
        return check

    for name in ("gradcheck", "gradgradcheck"):
        setattr(torch.autograd, name, checker(name))

    def profiler(cls, api: str, every_step=lambda self: True):
        orig_enter = cls.__enter__

        def enter(self):
            if getattr(self, "enabled", True) and every_step(self):
                count(gen["debug_sites"], api, sys._getframe(1))
            return orig_enter(self)
        cls.__enter__ = enter

    profiler(torch.autograd.profiler.profile, "torch.autograd.profiler.profile")
    profiler(torch.autograd.profiler.emit_nvtx, "torch.autograd.profiler.emit_nvtx")
    import torch.profiler
    profiler(torch.profiler.profile, "torch.profiler.profile",
             lambda self: getattr(self, "schedule", None) is torch.profiler.profiler._default_schedule_fn)

    def zero_grad_of(cls):
        orig = cls.zero_grad

        def zero_grad(self, *args, **kwargs):
            given = kwargs.get("set_to_none", args[0] if args else True)
            if not given:
                count(gen["zero_grad_sites"], "zero_grad", sys._getframe(1), positional=bool(args))
                if rec.apply.get("set_to_none"):
                    args, kwargs = (), {**kwargs, "set_to_none": True}
            return orig(self, *args, **kwargs)
        cls.zero_grad = zero_grad

    zero_grad_of(torch.optim.Optimizer)
    zero_grad_of(torch.nn.Module)

    impl = rec.apply.get("optimizer_impl") or {}
    for name in torch.optim.__all__ if impl else ():
        cls = getattr(torch.optim, name, None)
        if isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer) and cls is not torch.optim.Optimizer \
                and all(k in inspect.signature(cls.__init__).parameters for k in impl):
            _pass_keywords(rec, cls, impl)

    orig_opt_init = torch.optim.Optimizer.__init__

    def opt_init(self, params, *args, **kwargs):
        first = rec.optimizer is None
        orig_opt_init(self, params, *args, **kwargs)
        if first and rec.optimizer is not None:
            gen["optimizer_impl"] = _optimizer_impl(self)
            gen["optimizer_impl"]["built_by"] = _builder(sys._getframe(1), rec)
            if rec.model is not None:
                _watch_forwards(rec, gen, user_site)
                _conv_bias_before_norm(rec, gen["reported"])

    torch.optim.Optimizer.__init__ = opt_init

    orig_loader_init = DataLoader.__init__

    def loader_init(self, *args, **kwargs):
        orig_loader_init(self, *args, **kwargs)
        if getattr(self, "_workbook_tune_user", False):
            found = _pil_getitem(rec, self.dataset)
            if found and found not in gen["reported"]:
                gen["reported"].append(found)

    DataLoader.__init__ = loader_init


def _pass_keywords(rec: Recorder, cls: type, values: dict[str, Any]) -> None:
    """Make ``cls(...)`` pass ``values`` as keywords where the script does not give them, for the first optimizer
    the user's files build (the spec's ``optimizer_impl``)."""
    orig = cls.__init__

    def init(self, *args, **kwargs):
        if rec.optimizer is None:
            for k, v in values.items():
                kwargs.setdefault(k, v)
        return orig(self, *args, **kwargs)

    cls.__init__ = init


def _builder(start, rec: Recorder) -> str:
    """Who built the optimizer: "" where the first frame outside torch and this hook is in the user's files, else
    that frame's module (a training framework's: ``transformers.trainer``), whose own setting then owns it."""
    import torch

    skip = (os.path.dirname(torch.__file__), __file__)
    f = start
    while f is not None and f.f_code.co_filename.startswith(skip):
        f = f.f_back
    if f is None or rec.is_user_file(f.f_code.co_filename):
        return ""
    return str(f.f_globals.get("__name__") or f.f_code.co_filename)


def _optimizer_impl(optimizer) -> dict[str, Any]:
    """The optimizer's implementation as the script chose it: its torch.optim class, ``foreach`` and ``fused`` as
    given (None: torch's default), and where torch has a fused or foreach one for its parameters' device."""
    import torch
    from torch.utils import _foreach_utils

    base = next((c.__name__ for c in type(optimizer).__mro__ if c.__module__.startswith("torch.optim")
                 and c is not torch.optim.Optimizer), None)
    sig = inspect.signature(type(optimizer).__init__).parameters
    first = next((p for g in optimizer.param_groups for p in g["params"]), None)
    device = first.device.type if first is not None else "cpu"
    floating = all(torch.is_floating_point(p) for g in optimizer.param_groups for p in g["params"])
    return {"class": type(optimizer).__name__, "torch_class": base, "device": device,
            "foreach": optimizer.defaults.get("foreach"), "fused": optimizer.defaults.get("fused"),
            "has_foreach": "foreach" in sig, "has_fused": "fused" in sig,
            "fused_supported": bool(base in FUSED_OPTIMIZERS and "fused" in sig and floating
                                    and device in _foreach_utils._get_fused_kernels_supported_devices()),
            "foreach_default": device in _foreach_utils._get_foreach_kernels_supported_devices(),
            "foreach_supported": "foreach" in sig
            and device in _foreach_utils._get_foreach_kernels_supported_devices()}


def _grad_tensors(out) -> list:
    """The tensors that require grad in a forward's output (a tensor, or one level of a sequence or a dict)."""
    import torch

    items = [out] if isinstance(out, torch.Tensor) else list(out.values()) if isinstance(out, dict) else \
        list(out) if isinstance(out, (list, tuple)) else []
    return [x for x in items if isinstance(x, torch.Tensor) and x.requires_grad]


def _watch_forwards(rec: Recorder, gen: dict[str, Any], user_site) -> None:
    """Per call site of the model's forward: the calls made with gradients enabled and whether a gradient reached
    an output; with ``apply["no_grad"]``, the forwards from those sites run under ``torch.no_grad()``."""
    import torch

    wanted = {(f, int(n)) for f, n in rec.apply.get("no_grad") or []}
    forwards = gen["forwards"]
    stack: list[Any] = []

    def pre(module, args):
        at = user_site(sys._getframe(1))
        if at is not None and at in wanted:
            ctx = torch.no_grad()
            ctx.__enter__()
            stack.append(ctx)
        else:
            stack.append(None)
        if at is not None and torch.is_grad_enabled():
            stack[-1] = at

    def post(module, args, out):
        top = stack.pop() if stack else None
        if isinstance(top, tuple):  # a forward with gradients enabled: did it build a graph, does a gradient reach it
            tensors = _grad_tensors(out)
            if tensors:
                entry = forwards.setdefault(f"{top[0]}:{top[1]}", {"file": top[0], "line": top[1], "calls": 0,
                                                                   "reached": False})
                entry["calls"] += 1
                if not entry["reached"]:
                    def reached(grad, entry=entry):
                        entry["reached"] = True
                    for t in tensors:
                        t.register_hook(reached)
        elif top is not None:
            top.__exit__(None, None, None)
        return None

    rec.model.register_forward_pre_hook(pre)
    rec.model.register_forward_hook(post, always_call=True)


def _conv_bias_before_norm(rec: Recorder, found: list[dict[str, Any]]) -> None:
    """Hooks that find, on the model's first forward, a Conv1d/2d/3d with a bias whose output is the input of a
    BatchNorm (the Guide: "Disable bias for convolutions directly followed by a batch norm"), appended to ``found``
    when that forward runs."""
    import torch

    root = ((rec.optimizer or {}).get("model_names") or ["model"])[0]
    names = {id(m): root + "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in n.split(".") if p)
             for n, m in rec.model.named_modules()}
    convs = [m for m in rec.model.modules() if isinstance(m, torch.nn.modules.conv._ConvNd)
             and not isinstance(m, torch.nn.modules.conv._ConvTransposeNd) and m.bias is not None]
    norms = [m for m in rec.model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not convs or not norms:
        return
    outputs: dict[int, Any] = {}
    handles: list[Any] = []

    def conv_out(module, args, out):
        outputs[id(out)] = module

    def norm_in(module, args):
        conv = outputs.get(id(args[0])) if args else None
        if conv is not None:
            text = (f"{names.get(id(conv), '?')} ({type(conv).__name__}, bias=True) feeds "
                    f"{names.get(id(module), '?')} ({type(module).__name__}) directly: the batch norm subtracts the "
                    f"mean, so the bias has no effect; build it with bias=False")
            item = {"kind": "conv_bias_before_norm", "text": text}
            if item not in found:
                found.append(item)

    def done(module, args, out):
        for h in handles:
            h.remove()
        outputs.clear()

    handles += [c.register_forward_hook(conv_out) for c in convs]
    handles += [n.register_forward_pre_hook(norm_in) for n in norms]
    handles.append(rec.model.register_forward_hook(done))


def _general_result(gen: dict[str, Any] | None) -> dict[str, Any]:
    """``rec.general`` as the result JSON's ``general``: ``debug_sites``, ``zero_grad_sites`` (lists of call sites:
    ``api``, ``file``, ``line``, ``count``), ``unreached_forwards`` (the model's forward call sites called with
    gradients enabled whose outputs never received a gradient: ``file``, ``line``, ``calls``), ``optimizer_impl``
    and ``reported`` (findings tune reports only: ``kind``, ``text``, and ``file``/``line`` where known)."""
    if not gen:
        return {}
    return {"debug_sites": list(gen["debug_sites"].values()), "zero_grad_sites": list(gen["zero_grad_sites"].values()),
            "unreached_forwards": [{"file": f["file"], "line": f["line"], "calls": f["calls"]}
                                   for f in gen["forwards"].values() if f["calls"] and not f["reached"]],
            "optimizer_impl": gen["optimizer_impl"], "reported": list(gen["reported"])}


def _pil_getitem(rec: Recorder, dataset) -> dict[str, Any] | None:
    """Where the dataset's ``__getitem__`` (in the user's files) opens an image with PIL (``Image.open``): decoded
    one sample at a time in the loader, which notebook 02's batched decode replaces. None where it does not."""
    import ast

    getitem = getattr(type(dataset), "__getitem__", None)
    code = getattr(getitem, "__code__", None)
    if code is None or not rec.is_user_file(code.co_filename):
        return None
    try:
        lines, start = inspect.getsourcelines(getitem)
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except (OSError, TypeError, SyntaxError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "open" \
                and isinstance(node.func.value, (ast.Name, ast.Attribute)) \
                and (getattr(node.func.value, "id", None) or getattr(node.func.value, "attr", None)) == "Image":
            file = str(Path(code.co_filename).resolve())
            line = start + node.lineno - 1
            return {"kind": "pil_decode", "file": file, "line": line, "dataset": type(dataset).__name__,
                    "text": f"{type(dataset).__name__}.__getitem__ decodes one image at a time with PIL "
                            f"(Image.open, line {line} of {Path(file).name})"}
    return None


def _jsonable(v: Any) -> Any:
    return v if isinstance(v, (bool, int, float, str, type(None))) else repr(v)[:80]


def _safe_len(dataset) -> int | None:
    try:
        return len(dataset)
    except Exception:  # noqa: BLE001 - an IterableDataset has no len
        return None


#: The folder beside a run's result where its processes keep the user's files before changing them
#: (:class:`UserFiles`); :func:`helpers.tune.engine.restore_user_files` puts them back after the run.
KEEP_SUFFIX = ".kept"
#: ``os.open`` flags that make an open a write (``open()`` passes the flags its mode means to the ``open`` event).
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


class UserFiles:
    """An audit hook (PEP 578, ``sys.addaudithook``) that keeps a copy of every file outside the run folder before
    the run first changes it, so that tune's runs lose nothing of the user's (a ``metrics.csv`` truncated, a log
    appended to): the events ``open`` with a write mode or flags, ``os.rename`` (also raised by ``os.replace`` and
    ``shutil.move``: both paths), ``os.remove`` / ``os.unlink``, ``os.truncate`` and ``os.mkdir`` (a folder the run
    creates), as listed in https://docs.python.org/3/library/audit_events.html.

    Each process (a DataLoader worker too) appends one JSON line per path to ``KEEP/<pid>.jsonl`` before the change
    happens: ``{"path", "t" (unix time, s), "kept" (the copy, or None where the path did not exist), "dir"}``.
    Writes by C code that bypasses Python's ``open`` are not seen (``torch.save`` is redirected instead).
    """

    def __init__(self, keep_dir: str, own_dirs: list[str]) -> None:
        self.keep = Path(keep_dir)
        self.own = [os.path.abspath(d) + os.sep for d in own_dirs] + [os.path.abspath(keep_dir) + os.sep]
        self.seen: set[str] = set()
        self.local = threading.local()
        self.n = 0

    def __call__(self, event: str, args: tuple) -> None:
        if event == "open":
            if len(args) < 3 or not isinstance(args[2], int) or not args[2] & _WRITE_FLAGS:
                return
            paths = args[:1]
        elif event == "os.rename":
            paths = args[:2]
        elif event in ("os.remove", "os.truncate", "os.mkdir"):
            paths = args[:1]
        else:
            return
        if getattr(self.local, "inside", False):
            return
        self.local.inside = True
        try:
            for path in paths:
                self.keep_one(path, folder=event == "os.mkdir")
        except Exception:  # noqa: BLE001 - the guard must never break the user's script
            pass
        finally:
            self.local.inside = False

    def skips(self, path: str) -> bool:
        """Whether ``path`` (absolute) is not the user's to keep: the run folder, devices, bytecode caches."""
        return (path.startswith(("/dev/", "/proc/", "/sys/")) or any(path.startswith(d) for d in self.own)
                or f"{os.sep}__pycache__{os.sep}" in path)

    def keep_one(self, path: Any, *, folder: bool = False) -> None:
        """Record ``path`` and copy it where it is a file, the first time this process changes it."""
        import shutil

        if not isinstance(path, (str, bytes, os.PathLike)):
            return  # a file descriptor: opened by path already
        p = os.path.abspath(os.fsdecode(path))
        if p in self.seen or self.skips(p):
            return
        self.seen.add(p)
        if os.path.exists(p) and not os.path.isfile(p):
            return  # an existing folder: its files are kept one by one
        self.keep.mkdir(parents=True, exist_ok=True)
        pid = os.getpid()
        entry: dict[str, Any] = {"path": p, "t": time.time(), "kept": None, "dir": folder}
        if os.path.isfile(p):
            self.n += 1
            kept = self.keep / f"{pid}-{self.n}-{os.path.basename(p)}"
            shutil.copy2(p, kept)
            entry["kept"] = str(kept)
        with open(self.keep / f"{pid}.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")


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
    how far it got, and a run whose steps stop is seen to stall (:func:`helpers.tune.engine.stalled`)."""
    started = time.time()

    def beat():
        last_n, last_wall = -1, started
        while True:
            t = list(rec.step_t)
            n = len(t)
            if n != last_n:
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
    if spec.get("keep"):  # before anything of the user's runs: every file it changes is kept first
        sys.addaudithook(UserFiles(spec["keep"], [spec["scratch"]]))
    install(rec)
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
    sys.stdout.flush()
    sys.stderr.flush()
    _exit_later(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
