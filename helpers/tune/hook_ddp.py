"""tune's runtime watch of the first ``DistributedDataParallel`` a user's files build (run inside the user's process
by :mod:`helpers.tune.hook`): its micro-steps per optimizer step, its keywords, its gradients and comm hook, and
the DDP candidates applied to it (``no_sync``, bucket sizes, ``gradient_as_bucket_view``, a compression hook,
``static_graph``)."""

from __future__ import annotations

import functools
import inspect
import sys
from pathlib import Path
from typing import Any

from helpers.tune.hook_common import SITE_SAMPLES, _has_conv, _jsonable

# ``rec`` below is the run's :class:`helpers.tune.hook.Recorder` (not imported: the hook imports this module).


def _watch_ddp(rec: Any) -> None:
    """Record where the user's files wrap a model in ``DistributedDataParallel``; with ``channels_last``, convert
    the module before DDP builds its gradient buckets, whose views take the parameters' strides (converted after,
    every backward warns "Grad strides do not match bucket view strides" and copies each gradient)."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    orig_init = DistributedDataParallel.__init__
    watch = rec.ddp_watch = _DDPWatch(rec)

    # DDP's own signature kept (``__wrapped__``): before_init binds the call to it, to read and set its keywords
    @functools.wraps(orig_init)
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

    def __init__(self, rec: Any) -> None:
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
