"""tune's runtime watch of the Performance Tuning Guide's general items in the user's process (run by
:mod:`helpers.tune.hook`): debugging APIs, forward passes whose outputs reach no ``backward()``,
``zero_grad(set_to_none=False)``, the optimizer's implementation, and what is reported only (PIL decode in
``__getitem__``, a biased conv before a batch norm)."""

from __future__ import annotations

import inspect
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

# ``rec`` below is the run's :class:`helpers.tune.hook.Recorder` (not imported: the hook imports this module).


#: The autograd debugging APIs tune switches off at runtime (PyTorch Performance Tuning Guide, "Disable debugging
#: APIs"): anomaly detection (``torch.autograd.set_detect_anomaly(True)``, ``torch.autograd.detect_anomaly()``) and
#: ``torch.autograd.gradcheck`` / ``gradgradcheck``. The profilers the Guide names there are found and reported only:
#: their results are read later in the script (``prof.key_averages()``), which a profiler switched off would break.
DEBUG_OFF = ("set_detect_anomaly", "detect_anomaly", "gradcheck", "gradgradcheck")
#: The optimizers with a fused implementation, by their torch.optim class (torch 2.13: the classes whose step calls
#: ``torch.optim.optimizer._device_dtype_check_for_fused``; AdamW is an Adam).
FUSED_OPTIMIZERS = ("Adam", "AdamW", "SGD", "Adagrad")


def _watch_general(rec: Any) -> None:
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
    - reported only: ``torch.nn.DataParallel`` built in the user's files (its file and line); a Dataset whose
      ``__getitem__`` opens an image with PIL (decoded one by one in the loader), and
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

    orig_dp_init = torch.nn.DataParallel.__init__

    def dp_init(self, *args, **kwargs):
        orig_dp_init(self, *args, **kwargs)
        at = user_site(sys._getframe(1))
        item = {"kind": "data_parallel", "file": at[0], "line": at[1]} if at else None
        if item and item not in gen["reported"]:
            gen["reported"].append(item)

    torch.nn.DataParallel.__init__ = dp_init


def _pass_keywords(rec: Any, cls: type, values: dict[str, Any]) -> None:
    """Make ``cls(...)`` pass ``values`` as keywords where the script does not give them, for the first optimizer
    the user's files build (the spec's ``optimizer_impl``)."""
    orig = cls.__init__

    def init(self, *args, **kwargs):
        if rec.optimizer is None:
            for k, v in values.items():
                kwargs.setdefault(k, v)
        return orig(self, *args, **kwargs)

    cls.__init__ = init


def _builder(start, rec: Any) -> str:
    """Who built the optimizer: "" where the first frame outside torch and tune's hooks is in the user's files, else
    that frame's module (a training framework's: ``transformers.trainer``), whose own setting then owns it."""
    import torch

    # every hook module of tune's (hook_device's, hook_compile's, ...) may wrap Optimizer.__init__ too
    skip = (os.path.dirname(torch.__file__), os.path.dirname(os.path.abspath(__file__)) + os.sep)
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


def _watch_forwards(rec: Any, gen: dict[str, Any], user_site) -> None:
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


def _conv_bias_before_norm(rec: Any, found: list[dict[str, Any]]) -> None:
    """Hooks that find, on the model's first forward, a Conv1d/2d/3d with a bias whose output is the input of a
    BatchNorm (the Guide: "Disable bias for convolutions directly followed by a batch norm"), appended to ``found``
    when that forward runs."""
    import torch

    if rec.apply.get("compile") or rec.model_info.get("compiled"):  # found by the probe; a compiled forward would
        return  # trace these hooks (a graph break at id()), and recompile once they are removed
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


def _pil_getitem(rec: Any, dataset) -> dict[str, Any] | None:
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
