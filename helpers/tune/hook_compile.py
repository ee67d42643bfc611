"""Inside the user's process: ``torch.compile`` of the model's forward, and what its compiler did.

:func:`describe` says whether the script compiles its model already. :func:`compiled` compiles the model's forward
for the ``compile`` candidate (``apply["compile"]``: ``"default"``, or ``"reduce-overhead"`` for CUDA graphs) and
:func:`watch` records, from the compiler's own callbacks, every compilation: when it started (the optimizer steps
made so far), how long it took, and whether it was a recompilation; and, from ``torch._dynamo.utils.counters``,
the graph breaks with their reasons. :func:`result` is the hook result's ``compile`` entry.

The compile time is the time spent inside torch's compiler: from ``torch._dynamo.callback_handler``'s start callback
to its end callback (torch 2.13, ``torch/_dynamo/callback.py``; ``torch/_dynamo/convert_frame.py`` runs them around
each frame's compilation, trigger ``DYNAMO``, and ``torch/_functorch/_aot_autograd/runtime_wrappers.py`` around the
backward graph's lazy compilation at the first ``backward()``, trigger ``LAZY_BACKWARD``). It covers Dynamo's
tracing, AOTAutograd and Inductor's code generation and C++ (or Triton) build; it does not cover the first run of
the compiled code or Dynamo's guard checks on later calls, which the timed steps carry. It is chosen over "the
compiled run's first steps minus the unmodified run's" because the two runs are separate processes: on a shared
machine their first steps differ by more than a small model's compile.

Like :mod:`helpers.tune.hook`, it imports only the standard library and torch (and torch only when called).
"""

from __future__ import annotations

import sys
import time
from typing import Any

#: The graph-break reasons kept in the result (the first ones, each at most this many characters).
MAX_REASONS, REASON_CHARS = 3, 300


def private_cache(scratch: str) -> str | None:
    """Give this run its own, empty compile cache: ``TORCHINDUCTOR_CACHE_DIR`` (which Triton's cache follows) set to
    a new folder under ``scratch`` (the run's folder), unless the user set it. Each run then compiles cold, as a
    job's first run on a machine does, and writes nothing into the shared default cache
    (``/tmp/torchinductor_<user>``: torch 2.13 ``torch/_inductor/runtime/cache_dir_utils.py``). Returns the folder,
    to be removed when the run ends, or None."""
    import os
    import tempfile

    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return None
    os.makedirs(scratch, exist_ok=True)
    folder = tempfile.mkdtemp(prefix="inductor-cache-", dir=scratch)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder
    return folder


def torch_cache() -> str:
    """Torch's shared compile cache folder: ``/tmp/torchinductor_<user>`` (``tempfile.gettempdir()``), as torch 2.13's
    ``default_cache_dir`` (``torch/_inductor/runtime/cache_dir_utils.py``) makes it, without importing torch.
    Inductor writes its precompiled headers there whatever ``TORCHINDUCTOR_CACHE_DIR`` says (``_HEADER_DIR`` in
    ``torch/_inductor/codecache.py``): torch's files, not the user's, so the run's file audit leaves them alone."""
    import getpass
    import os
    import re
    import tempfile

    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        user = f"uid_{os.getuid()}" if hasattr(os, "getuid") else "unknown_user"
    return os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


def describe(model) -> dict[str, Any]:
    """``{"compiled": True}`` where ``model`` is compiled already: the ``OptimizedModule`` that ``torch.compile``
    returns (``torch._dynamo.eval_frame.OptimizedModule``), or a module whose ``compile()`` method was called (it
    sets ``_compiled_call_impl``, torch 2.13 ``torch/nn/modules/module.py``); else ``{}``."""
    inner = getattr(model, "module", None)  # a DistributedDataParallel's module
    for m in (model, inner):
        if m is None:
            continue
        if type(m).__name__ == "OptimizedModule" or getattr(m, "_compiled_call_impl", None) is not None:
            return {"compiled": True}
    return {}


class CompileWatch:
    """The compilations of one run, from ``torch._dynamo.callback_handler``'s callbacks.

    Attributes
    ----------
    events : list of dict
        One per compilation: ``trigger`` ("DYNAMO" or "LAZY_BACKWARD"), ``id`` (Dynamo's compile id,
        ``"frame/attempt"``), ``step`` (optimizer steps made when it started), ``seconds``.
    active : bool
        Whether a compilation is running now (the heartbeat counts it as progress).
    """

    def __init__(self, steps_made) -> None:
        self.steps_made = steps_made
        self.events: list[dict[str, Any]] = []
        self.active = False
        self._t0 = 0.0

    def start(self, args) -> None:
        self.active, self._t0 = True, time.perf_counter()
        self.events.append({"trigger": getattr(args.callback_trigger, "name", str(args.callback_trigger)),
                            "id": str(args.compile_id), "step": int(self.steps_made()), "seconds": None})

    def end(self, args) -> None:
        if self.events and self.events[-1]["seconds"] is None:
            self.events[-1]["seconds"] = time.perf_counter() - self._t0
        self.active = False


def watch(rec) -> None:
    """Watch the compilations of ``rec``'s run (a :class:`helpers.tune.hook.Recorder`) from the first call of
    ``torch.compile`` on: the candidate's (:func:`compiled`), the rewritten script's, or the script's own. A
    :class:`CompileWatch` is registered with torch's compiler callbacks then, kept as ``rec.compile_watch``;
    ``torch._dynamo`` (about 2 s to import) is not imported by a run that never compiles."""
    import torch

    orig = torch.compile

    def compile_(*args, **kwargs):
        if getattr(rec, "compile_watch", None) is None:
            import torch._dynamo

            w = CompileWatch(lambda: len(rec.step_t))
            torch._dynamo.callback_handler.register_start_callback(w.start)
            torch._dynamo.callback_handler.register_end_callback(w.end)
            rec.compile_watch = w
        return orig(*args, **kwargs)

    compile_.__doc__, compile_.__wrapped__ = orig.__doc__, orig
    torch.compile = compile_


def apart(rec, times: list[float]) -> list[float]:
    """``times`` (seconds, ``times[i]`` the duration of optimizer step ``i + 1``) with the time spent in torch's
    compiler taken out of the step it fell in: a recompilation (a smaller last batch, a changed guard) is counted in
    the compile time, not as a slow step. The first step (step 0, before ``times[0]``) is not in ``times``."""
    w = getattr(rec, "compile_watch", None)
    if w is None:
        return times
    out = list(times)
    for e in w.events:
        k = e["step"] - 1  # started after e["step"] steps: inside step e["step"], whose duration is times[k]
        if e["seconds"] is not None and 0 <= k < len(out):
            out[k] = max(out[k] - e["seconds"], 0.0)
    return out


def compiled(forward, mode: str):
    """``torch.compile(forward)``, with ``mode="reduce-overhead"`` (CUDA graphs) where ``mode`` says so.

    Parameters
    ----------
    forward : callable
        The model's own bound ``forward`` (tune's call-site wrapper stays outside the compiled code).
    mode : str
        ``"default"`` or ``"reduce-overhead"`` (``torch.compile``'s own mode names).
    """
    import torch

    return torch.compile(forward) if mode == "default" else torch.compile(forward, mode=mode)


def _attempt(compile_id: str) -> int:
    """The attempt of Dynamo's compile id ``"frame/attempt"`` (0: the frame's first compilation); 0 where the id
    has another form."""
    tail = compile_id.rsplit("/", 1)[-1]
    digits = ""
    for ch in tail:
        if not ch.isdigit():
            break
        digits += ch
    return int(digits) if "/" in compile_id and digits else 0


def result(rec) -> dict[str, Any] | None:
    """The hook result's ``compile`` entry, or None where the run did not compile.

    Returns
    -------
    dict or None
        ``compile_s`` (seconds inside the compiler, all compilations), ``first_s`` (those that started before the
        first optimizer step), ``recompiles`` (compilations of a frame compiled before: a new shape or a changed
        guard), ``recompile_steps`` (the steps at which they started), ``graph_breaks`` (their count) and
        ``break_reasons`` (the first :data:`MAX_REASONS`), ``events`` (:attr:`CompileWatch.events`).
    """
    w = getattr(rec, "compile_watch", None)
    if w is None:
        return None
    done = [e for e in w.events if e["seconds"] is not None]
    again = [e for e in done if e["trigger"] == "DYNAMO" and _attempt(e["id"]) > 0]
    breaks: dict[str, int] = {}
    utils = sys.modules.get("torch._dynamo.utils")  # imported by any compilation; none, no break
    try:
        breaks = {str(k): int(v) for k, v in utils.counters["graph_break"].items()} if utils is not None else {}
    except Exception:  # noqa: BLE001 - counters of another torch version: no graph breaks known
        pass
    return {"compile_s": sum(e["seconds"] for e in done), "first_s": sum(e["seconds"] for e in done if e["step"] == 0),
            "recompiles": len(again), "recompile_steps": [e["step"] for e in again],
            "graph_breaks": sum(breaks.values()),
            "break_reasons": [k.strip().splitlines()[0][:REASON_CHARS] for k in list(breaks)[:MAX_REASONS]],
            "events": done}
